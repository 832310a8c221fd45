"""Ingest: trace topics → decode → trace store → trace lake → Kafka commit.

Exactly once in effect: the store keeps, in the same SQLite transaction as the events, the next
offset of every trace partition, and dedupes by (trace topic, partition, offset, index); after a
restart consumption resumes at the store's progress. The lake is written in segments with a
recorded, replayable offset range. Kafka offsets are committed only up to what both the store
and the lake hold, so a partition that moves to another collector resumes at a point where
nothing can be lost.

The Kafka side — following the trace topics' routes with one consumer per trace cluster in the
collector group, the rebalance, the offset guard — is :mod:`tracemq.kafka.fleet`'s (shared with
PushConsumer); this module takes its fetches (``on_batch``), says where an assigned partition
starts (the store) and what a revoked one may commit (``flush``).

The write path is a pipeline over two cores:

* fetches are cut into chunks of about :data:`CHUNK_BYTES`; a decode thread turns a chunk into
  the store's rows and the lake's Arrow batches in one pass (:func:`events.decode_chunk`);
* an ingest worker *process* writes the chunks to the store, strictly in order, one transaction
  each (:func:`store.write_rows_in_worker`): SQLite's inserts bind each row with the GIL held,
  and in this process they would wait behind the decode thread at every row;
* the Arrow batches of stored chunks wait here for the lake (:class:`_LakeBuffer`); a lake
  thread writes them as segments (:meth:`TraceLake.write_decoded`) without reading the store
  again. A segment is recorded before its files are written, as always, so a crash rewrites
  exactly the same files from the store (:meth:`TraceLake.recover`). When the lake already
  holds a prefix of a buffer (a flush from the store got there first), the chunks past the
  lake's progress are still written from the buffer, if it falls between two chunks. When the
  buffered events are not exactly the store's events of a range (a replay, a restart, a failed
  flush), the lake reads the store instead (:meth:`TraceLake.flush`): about 15 µs and, while
  a segment is read, 2 kB per event, so the take-over backfill only settles where the lake
  starts (:meth:`TraceLake.start_partition`) and leaves the writing to ingest.

Where the time goes (``bench/collector_ingest.py``, 1 M events, py-spy and perf:
docs/performance.md, "seventh", "fourteenth" and "fifteenth pass"), about 7 µs per event in
this process and 6 in the worker, which is what ingest waits on in steady state: this one
decodes (~3 µs of the decode thread: the common records' values appended straight to each
partition's columns by the compiled step, ``events.decode_message_into``, the lake's Arrow
arrays built from those columns by another, ``_fastdecode.arrow_buffers``, and the store's key
rows), pickles
each chunk's store columns for the worker (~0.8 µs of the feeder thread with the pipe), writes
the lake (~1.2 µs: sort and Parquet, mostly without the GIL) and fetches; the worker unpickles
the columns and builds its event tuples (~0.3 µs) and stores (SQLite's index inserts and
commits, the blocks' column texts and zstd, the msgId and place hashes). Both processes
collect garbage rarely (:func:`store.tune_gc`). Memory held here: the lake buffers (~280
bytes per event as Arrow, at most about two buffers' worth), one fetch (up to
:data:`FETCH_MAX_BYTES`) and three chunks in flight (~560 bytes per event each as Python
objects, ~290 more in Arrow for the lake; 1.3 kB per event while a chunk is decoded). In RSS
a buffered event costs ~700 bytes (the heap around the Arrow buffers), so each partition's
freed heap is handed back to the OS as soon as its buffer is written (:meth:`_flush_one`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import multiprocessing
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from redis.exceptions import RedisError
from tracemq.clock import now_ms as _now_ms
from tracemq.collector_lag import record_reset
from tracemq.kafka.fleet import Fleet, FleetCluster, Placement, place
from tracemq.log import get_logger
from tracemq.offset_reset import OffsetReset
from tracemq.routing import RouteCache, connect
from tracemq.service import spawn

from tracemq_collector import metrics
from tracemq_collector.events import DecodedChunk, decode_chunk
from tracemq_collector.lake import TraceLake
from tracemq_collector.settings import CollectorSettings
from tracemq_collector.store import TraceStore, init_worker, write_rows_in_worker

log = get_logger("collector.ingest")

#: Trace message bytes per pipeline chunk (about 5,000 events of RocketMQ's text format).
CHUNK_BYTES = 768_000
#: Chunks handed to the worker ahead of the one being stored; bounds a large fetch's memory.
PIPELINE_DEPTH = 1
#: Events kept for the lake (about 300 bytes each as Arrow) beyond which all partitions are
#: flushed at once, whatever the interval: bounds the memory they take.
LAKE_BUFFER_EVENTS = 100_000
#: Events held for the lake — buffered, or taken by the running flush and not written yet — at
#: which ingest stops fetching until the flush has written one more partition: when the lake is
#: slower than the store (sorted files, object storage) the buffer would otherwise grow with
#: the backlog (1 M events behind: over 1 GiB; bench/collector_ingest.py, 1 M events: peak RSS
#: 1 117 MiB without the wait, 381 – 408 MiB at twice this mark). Ingest goes on as soon as
#: the flush's first partition is written, while it writes the others: waiting for the whole
#: flush instead stalled both processes for the flush's length (~8 % of the rate).
LAKE_BUFFER_HARD_EVENTS = LAKE_BUFFER_EVENTS
#: Trace messages taken from the consumer at once (at most collector_batch_max_records).
MAX_FETCH_RECORDS = 500
#: Bytes one fetch brings at most (a larger single trace message still comes whole, as
#: max_partition_fetch_bytes allows): bounds what waits in memory before it is decoded.
FETCH_MAX_BYTES = 16 * 1024 * 1024
#: Longest wait of an empty fetch: trace freshness vs idle fetch requests (10/s per broker).
FETCH_MAX_WAIT_MS = 100
#: Attempts at a chunk after its first failure (each on a new worker) before ingest stops.
WORKER_RETRIES = 2


class _ClusterIngest:
    """The ingest's bookkeeping of one trace cluster (``FleetCluster.state``; the Kafka
    consumer, the group and the offset guard are :mod:`tracemq.kafka.fleet`'s): the offset
    bases of the partitions whose log was reset."""

    def __init__(self, ingestor: Ingestor, cluster: FleetCluster) -> None:
        self.ingestor = ingestor
        self.cluster = cluster
        #: (trace topic, partition) → base: store offset = Kafka offset + base (see _on_reset)
        self.bases: dict[tuple[str, int], int] = {}

    async def on_assigned(self, assigned: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Where the partitions start: the store is the truth of what we hold."""
        ing = self.ingestor
        store = ing.store
        progress = await ing.run(store.progress)
        self.bases.update(await ing.run(store.offset_bases))
        starts = {}
        now = time.monotonic()
        for tp in assigned:
            key = (tp.topic, tp.partition)
            ing._first_stored.pop(key, None)  # a new ownership: what it stores is its own
            nxt = progress.get(key)
            if nxt is not None:
                starts[tp] = nxt - self.bases.get(key, 0)
                if key not in ing._buffers:
                    # The next flush writes what is stored and not in the lake (killed before
                    # its flush: no chunk of it may come again when caught up), then commits
                    # Kafka up to what both hold: a commit that lagged at a kill -9 would
                    # otherwise stay behind (lag > 0 for good) until new data comes.
                    ing._unbuffered.setdefault(key, now)
        log.info(
            "trace partitions assigned",
            bootstrap=self.cluster.bootstrap,
            partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned),
        )
        return starts

    async def _on_reset(self, tp: TopicPartition, reset: OffsetReset) -> None:
        """The partition's log no longer holds our position (a restarted in-memory cluster
        begins again at 0, a recreated topic, retention). The store dedupes and orders by
        offset, so a log that starts again must not reuse offsets it already holds: the
        partition's *base* grows so that store offsets continue where they were (Kafka
        offset + base), recorded durably before anything of the new log is read."""
        ing = self.ingestor
        await ing.drain()  # what was read before the reset is stored under the old base
        key = (tp.topic, tp.partition)
        base = self.bases.get(key, 0)
        new_base = base + max(0, reset.position - reset.target)
        if new_base != base:
            await ing.run(ing.store.set_offset_base, tp.topic, tp.partition, new_base)
            self.bases[key] = new_base
        await ing.record_reset(reset)

    def _store_offsets(
        self, data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """Kafka offsets → the store's (only partitions whose log was reset have a base)."""
        if not any(self.bases.values()):
            return data
        out = {}
        for tp, records in data.items():
            base = self.bases.get((tp.topic, tp.partition), 0)
            out[tp] = [replace(r, offset=r.offset + base) for r in records] if base else records
        return out


@dataclass
class _LakeBuffer:
    """Events of one trace partition stored but not yet in the lake, kept for the lake.

    ``after`` is the store's progress before the first of them was stored (None: none was);
    ``end`` the progress after the last. Each entry is one stored chunk: ``(start, end,
    events, {(date, hour): [record batch]})`` with consecutive ranges.
    """

    after: int | None
    end: int
    entries: list[tuple[int, int, int, dict[tuple[str, int], list[Any]]]] = field(
        default_factory=list
    )
    events: int = 0
    since: float = field(default_factory=time.monotonic)


class Ingestor:
    """Follows every broker hosting the configured trace topics and ingests them.

    Which topics: ``collector_trace_topics`` names, plus the topics of trace-enabled brokers
    that match its patterns (by default every one), checked on every route change and at least
    every 5 s: a trace topic created while the collector runs is read from its beginning.

    The write path is a pipeline (see the module docstring): trace messages are cut into
    chunks of about :data:`CHUNK_BYTES`; a decode thread turns each chunk into the store's
    rows and the lake's Arrow batches; an ingest worker process stores the chunks, in order,
    one transaction each, on its own writer connection (SQLite there runs without competing
    for this process's GIL); the Arrow batches wait here until a lake thread writes them,
    every ``collector_lake_flush_interval_ms`` (or sooner when ``collector_lake_segment_rows``
    events wait), while the next chunks are decoded and stored.
    """

    #: Events of the buffers the running lake flush took and has not written yet, and what
    #: the lake backpressure waits on for its next partition written (made there).
    _writing = 0
    _written: asyncio.Event | None = None

    def __init__(
        self,
        settings: CollectorSettings,
        store: TraceStore,
        lake: TraceLake,
        routes: RouteCache,
        writer: ThreadPoolExecutor,
    ) -> None:
        limit_malloc_arenas()
        self.settings = settings
        self.store = store
        self.lake = lake
        self.routes = routes
        self.writer = writer
        self._discovered: set[str] = set()  # trace topics last found on trace brokers
        self._fleet = self._new_fleet()
        self.events_stored = 0
        self.last_batch_ms = 0
        self._worker: ProcessPoolExecutor | None = None
        self._lake_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lake-writer")
        self._decode_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._queue: asyncio.Queue[tuple[asyncio.Future[Any], DecodedChunk, float]] | None
        self._queue = None
        self._stage: asyncio.Task[None] | None = None
        self._buffers: dict[tuple[str, int], _LakeBuffer] = {}
        # Partitions stored but not in the lake and not buffered (the lake reads the store).
        self._unbuffered: dict[tuple[str, int], float] = {}
        # The first trace offset stored of each partition since its assignment: ingest stores
        # every event from there on, so a take-over's backfill stops there (ingested_from).
        self._first_stored: dict[tuple[str, int], int] = {}
        self._flushing: asyncio.Task[None] | None = None
        self._inflight = 0  # chunks handed to the pipeline and not stored yet
        # Clusters whose last fetch reached every fetched partition's end: the lake flush that
        # an empty fetch would start starts as soon as their last chunk is stored instead.
        self._caught_up: dict[str, FleetCluster] = {}
        self._redis: Any = None  # opened on the first offset reset (recorded for `trace lag`)

    def ingested_from(self, key: tuple[str, int]) -> int | None:
        """The first trace offset of partition ``key`` stored since it was assigned here, or
        None (nothing yet). Safe from any thread (the backfill's)."""
        return self._first_stored.get(key)

    @property
    def clusters(self) -> dict[str, FleetCluster]:
        """The followed trace clusters by bootstrap (``topics``, ``assigned``, ``task``)."""
        return self._fleet.clusters

    def _new_fleet(self) -> Fleet:
        """The route-following Kafka consumers of the trace topics (:mod:`tracemq.kafka.fleet`),
        one per trace cluster in the collector group; ingest keeps the processing."""
        s = self.settings

        async def on_assigned(c: FleetCluster, tps: list[TopicPartition]) -> Any:
            return await c.state.on_assigned(tps)

        async def on_revoked(c: FleetCluster, tps: list[TopicPartition]) -> Any:
            return await self.flush(c, tps)

        async def on_fresh(c: FleetCluster, tps: list[TopicPartition]) -> None:
            await c.guard.seek_to_start(*tps)

        return Fleet(
            name="ingest",
            group_id=s.collector_group,
            routes=self.routes,
            plan=self._plan,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            on_batch=self._on_batch,
            on_reset=lambda c, tp, r: c.state._on_reset(tp, r),
            on_fresh=on_fresh,
            make_state=lambda c: _ClusterIngest(self, c),
            max_records=min(s.collector_batch_max_records, MAX_FETCH_RECORDS),
            session_timeout_ms=s.collector_session_timeout_ms,
            # How long the broker may hold a fetch while it has nothing new: the bound on how
            # late a trace message is seen once written (aiokafka's default is 500 ms).
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            consumer_kwargs={
                "max_poll_records": s.collector_batch_max_records,
                "fetch_max_bytes": FETCH_MAX_BYTES,
                "max_partition_fetch_bytes": 16 * 1024 * 1024,
            },
            offset_reset=s.collector_offset_reset,
            offset_counter=metrics.OFFSET_RESETS,
            idle_check_s=s.collector_offset_check_interval_ms / 1000,
            context={"group": s.collector_group},
            # the store says where a partition resumes, not the Kafka commit
            handover_on_resubscribe=False,
            announce="following trace topics",
            spawn=spawn,  # a dead fetch loop or route watch stops the service
        )

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run store work on the single writer thread (never on the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    async def _in_lake_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._lake_thread, fn, *args)

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=PIPELINE_DEPTH)
        self._stage = spawn(self._store_stage(), name="ingest-store")
        self._start_worker()
        await self._fleet.start()

    def _start_worker(self) -> None:
        try:
            self._worker = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker,
            )
        except Exception as exc:  # noqa: BLE001 - ingest on the writer thread instead
            log.warning("ingest worker unavailable; storing in-process", error=repr(exc))
            self._worker = None

    def _stop_worker(self, *, wait: bool) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=wait)

    async def stop(self) -> None:
        await self._fleet.stop()  # the last flush and commit need the store stage
        if self._stage:
            self._stage.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._stage
        self._stop_worker(wait=True)
        self._decode_thread.shutdown(wait=True)
        self._lake_thread.shutdown(wait=True)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None

    async def record_reset(self, reset: OffsetReset) -> None:
        """Leave the reset where ``tracemq trace lag`` reads it (Redis), best effort: the
        metric, the log and /healthz have it anyway."""
        s = self.settings
        try:
            if self._redis is None:
                self._redis = connect(s.redis_url)
            await asyncio.wait_for(
                record_reset(self._redis, s.redis_prefix, s.collector_group, reset), 5.0
            )
        except Exception as exc:  # noqa: BLE001 - Redis down: counted and logged elsewhere
            log.warning("offset reset not recorded in Redis", error=repr(exc))

    def offset_resets(self) -> dict[str, Any]:
        """Every reset of the trace partitions' offsets since start (for /healthz)."""
        parts = [p for c in self.clusters.values() for p in c.guard.stats()["partitions"]]
        return {
            "total": sum(c.guard.total for c in self.clusters.values()),
            "partitions": parts,
        }

    def healthy(self) -> bool:
        stage_ok = self._stage is None or not self._stage.done()
        return stage_ok and all(
            c.task is not None and not c.task.done() for c in self.clusters.values()
        )

    async def trace_topics(self) -> list[str]:
        """The trace topics to follow now: the configured names, and the topics of every
        trace-enabled broker that match a configured pattern (so a customized trace topic
        created on a trace broker is followed from its first route, without a restart)."""
        s = self.settings
        topics = set(s.topic_names())
        patterns = s.topic_patterns()
        if patterns:
            try:
                brokers = await self.routes.reader.brokers()
            except (RedisError, OSError) as exc:
                # Redis is away: keep following what was found (the route cache does the same)
                log.warning("trace brokers unreadable; keeping the known topics", error=repr(exc))
                return sorted(topics | self._discovered)
            found = {
                t
                for info in brokers.values()
                if info.get("trace_topic_enable") or info.get("role") == "trace"
                for t in info.get("topics", ())
                if any(fnmatch.fnmatchcase(t, pat) for pat in patterns)
            }
            self._discovered = found
            topics |= found
        return sorted(topics)

    async def _plan(self, initial: bool) -> Placement:
        """Every queue of the trace topics (readable or not: trace messages are read as long
        as they are there); a trace topic without a route yet is followed once it has one."""
        return await place(self.routes, await self.trace_topics(), readable_only=False)

    async def _on_batch(
        self, cluster: FleetCluster, data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
    ) -> None:
        if data and _at_end(cluster.consumer, data):
            self._caught_up[cluster.bootstrap] = cluster
        else:
            self._caught_up.pop(cluster.bootstrap, None)
        if data:
            await self.ingest(cluster.state._store_offsets(data))
        # Caught up (nothing fetched): the lake gets what is waiting without delay.
        await self.maybe_flush(cluster, idle=not data)
        await self._lake_backpressure(cluster)

    def _lake_pending(self) -> int:
        """Events buffered for the lake (not taken by a flush yet)."""
        return sum(b.events for b in self._buffers.values())

    def _lake_held(self) -> int:
        """Events held in memory for the lake: buffered, or being written by the flush."""
        return self._lake_pending() + self._writing

    async def _lake_backpressure(self, cluster: FleetCluster) -> None:
        """Wait while :data:`LAKE_BUFFER_HARD_EVENTS` events are held for the lake: the next
        fetch is taken once the running flush has written enough of them (a partition at a
        time) to bring the count below the mark, or no flush can take it down."""
        while self._lake_held() >= LAKE_BUFFER_HARD_EVENTS:
            flushing = self._flushing
            if flushing is None or flushing.done():
                await self.maybe_flush(cluster)
                flushing = self._flushing
                if flushing is None or flushing.done():
                    return  # nothing due here (e.g. partitions no longer assigned)
            metrics.LAKE_BACKPRESSURE.inc()
            if self._written is None:
                self._written = asyncio.Event()
            self._written.clear()
            written = asyncio.ensure_future(self._written.wait())
            try:
                # asyncio.wait: our cancellation (a stop) does not cancel the flush
                await asyncio.wait({flushing, written}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                written.cancel()

    # -- the write path --------------------------------------------------------------------
    async def ingest(self, data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        """Hand a fetch to the pipeline; returns once its last chunk is queued for the store."""
        assert self._queue is not None, "start() first"
        ingest_ts = _now_ms()
        for chunk in _chunks(data):
            if self._stage is None or self._stage.done():
                raise RuntimeError("the store stage of the ingest pipeline stopped")
            self._inflight += 1
            try:
                t0 = time.perf_counter()
                decoded = await asyncio.get_running_loop().run_in_executor(
                    self._decode_thread, decode_chunk, chunk, ingest_ts
                )
                await self._queue.put((self._submit(decoded), decoded, t0))
            except BaseException:
                self._inflight -= 1
                raise

    def _submit(self, decoded: DecodedChunk) -> asyncio.Future[Any]:
        if self._worker is not None:
            try:
                return asyncio.wrap_future(
                    self._worker.submit(write_rows_in_worker, str(self.store.path), decoded.store)
                )
            except Exception as exc:  # noqa: BLE001 - a broken pool: the stage restarts it
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                fut.set_exception(exc)
                return fut
        return asyncio.ensure_future(self.run(self.store.write_rows, decoded.store))

    async def _store_stage(self) -> None:
        """Take the chunks' results strictly in order; retry a failed chunk on a new worker."""
        assert self._queue is not None
        while True:
            fut, decoded, t0 = await self._queue.get()
            try:
                attempt = 0
                while True:
                    try:
                        new, before, repeats = await fut
                        break
                    except Exception as exc:
                        attempt += 1
                        if attempt > WORKER_RETRIES:
                            raise
                        # The worker refuses every batch after a failed one, so nothing later
                        # is stored before this chunk is; storing it again is harmless.
                        log.warning("ingest worker failed; retrying the chunk", error=repr(exc))
                        if self._worker is not None:
                            self._stop_worker(wait=False)
                            self._start_worker()
                        fut = self._submit(decoded)
                self._stored(decoded, new, before)
                metrics.REPEATED_MESSAGES.labels("idempotency_key").inc(repeats)
                metrics.BATCH_SECONDS.observe(time.perf_counter() - t0)
            finally:
                self._inflight -= 1
            if not self._inflight and self._caught_up:
                # The last chunk of a burst is stored: flush now, not after the empty fetch
                # that would tell (up to FETCH_MAX_WAIT_MS later).
                for cluster in list(self._caught_up.values()):
                    await self.maybe_flush(cluster, idle=True)

    def _stored(
        self, decoded: DecodedChunk, new: int, before: dict[tuple[str, int], int | None]
    ) -> None:
        total = decoded.events
        metrics.RECORDS.inc(decoded.records)
        metrics.EVENTS.inc(new)
        metrics.DUPLICATES.inc(total - new)
        reasons: dict[str, int] = defaultdict(int)
        for q in decoded.store.quarantine:
            reasons[_reason_label(q.get("reason", ""))] += 1
        for reason, n in reasons.items():
            metrics.QUARANTINED.labels(reason).inc(n)
        self.events_stored += new
        self.last_batch_ms = _now_ms()
        metrics.LAST_INGEST.set(time.time())
        now = time.monotonic()
        all_new = new == total and decoded.store.ordered
        for key, part in decoded.partitions.items():
            self._first_stored.setdefault(key, part.first_offset)
            prev = before.get(key)
            buf = self._buffers.get(key)
            fits = (
                all_new
                and key not in self._unbuffered
                and (prev is None or part.first_offset >= prev)
                and (buf is None or buf.end == prev)
            )
            if not fits:
                # The lake of this partition will read the store (a replay, or a gap).
                self._buffers.pop(key, None)
                self._unbuffered.setdefault(key, now)
                continue
            if buf is None:
                buf = self._buffers[key] = _LakeBuffer(after=prev, end=part.first_offset)
            groups = {k: [v] for k, v in part.lake.items()}
            start = buf.end if buf.entries else (part.first_offset if prev is None else prev)
            buf.entries.append((start, part.end_offset, part.events, groups))
            buf.end = part.end_offset
            buf.events += part.events
        metrics.LAKE_ROWS_PENDING.set(sum(b.events for b in self._buffers.values()))

    async def drain(self) -> None:
        """Wait until every chunk handed to the pipeline is stored (or the stage failed)."""
        if self._queue is None:
            return
        while self._inflight:
            if self._stage is None or self._stage.done():
                return  # join() would wait forever on a dead stage
            await asyncio.sleep(0.005)

    async def maybe_flush(self, cluster: FleetCluster, *, idle: bool = False) -> None:
        """Start a lake flush of the partitions that are due, in the background.

        Due: ``collector_lake_segment_rows`` events wait (in one partition or in all), or the
        oldest waited ``collector_lake_flush_interval_ms``, or a burst is over: ingest is
        ``idle`` (caught up, every chunk stored) with a tenth of that many events waiting.
        A trickle still waits for the interval, so files do not get smaller.
        """
        if self._flushing is not None and not self._flushing.done():
            return
        if self._flushing is not None and not self._flushing.cancelled():
            exc = self._flushing.exception()
            if exc is not None:
                # The lake progress did not move: the next flush writes the range again.
                log.warning("lake flush failed; retrying", error=repr(exc))
            self._flushing = None
        now = time.monotonic()
        interval = self.settings.collector_lake_flush_interval_ms / 1000
        rows = self.settings.collector_lake_segment_rows
        pending = self._lake_pending()
        full = pending >= min(rows, LAKE_BUFFER_EVENTS)
        idle = idle and not self._inflight
        due = [
            TopicPartition(t, p)
            for (t, p), b in self._buffers.items()
            if b.entries
            and (
                b.events >= rows
                or full
                or now - b.since >= interval
                or (idle and pending >= rows // 10)
            )
        ]
        due += [
            TopicPartition(t, p)
            for (t, p), since in self._unbuffered.items()
            if now - since >= interval
        ]
        due = [tp for tp in due if tp in cluster.assigned]
        if due:
            self._flushing = asyncio.create_task(
                self.flush_and_commit(cluster, due), name="lake-flush"
            )

    async def _flush_one(self, tp: TopicPartition) -> list[Path]:
        """Write one partition's buffer (or, failing that, its stored range) to the lake, then
        hand the freed heap back to the OS: one partition at a time, so a flush of several
        partitions does not hold all their buffers' memory until its end while ingest refills
        the next buffers (the collector's peak RSS)."""
        key = (tp.topic, tp.partition)
        buf = self._buffers.pop(key, None)
        self._unbuffered.pop(key, None)
        taken = buf.events if buf is not None else 0
        self._writing += taken
        try:
            files, why = None, "unbuffered"  # (a restart, a failed flush: nothing buffered)
            if buf is not None and buf.entries:
                files, why = await self._in_lake_thread(
                    self._write_buffer, tp.topic, tp.partition, buf
                )
                # The lake is not where the buffer starts (a failed flush, a restart) when
                # files is None: the lake reads the store instead, which covers the buffered
                # events too.
            buf = None  # its Arrow batches are freed here, before the trim
            if files is None:
                # ~15 µs and 2 kB of heap per event read back: counted, and logged but for
                # the expected case (nothing buffered)
                metrics.LAKE_STORE_READS.labels(reason=why).inc()
                (log.info if why == "unbuffered" else log.warning)(
                    "lake flush reads the stored range back",
                    trace_topic=tp.topic,
                    partition=tp.partition,
                    reason=why,
                )
                files = await self._in_lake_thread(self.lake.flush, tp.topic, tp.partition)
            await self._in_lake_thread(release_free_memory)
            return list(files)
        except BaseException:
            # The lake progress did not move and the buffer is gone: the next flush reads the
            # store, even if nothing more of the partition is ever fetched.
            self._unbuffered.setdefault(key, time.monotonic())
            raise
        finally:
            self._writing -= taken
            if self._written is not None:
                self._written.set()  # ingest may fetch again (_lake_backpressure)

    def _write_buffer(
        self, trace_topic: str, partition: int, buf: _LakeBuffer
    ) -> tuple[list[PurePath] | None, str]:
        """Write a buffer to the lake (in the lake thread): the files, or None and why the lake
        must read the store instead (``not_aligned``: the lake's progress is not on a chunk
        boundary of the buffer, or behind it; ``refused``: a pending segment of the partition,
        which the store's read rewrites; ``moving``: the progress kept moving).

        The lake may already hold a prefix of the buffered range: a backfill flushes the lake
        from the store when it takes a partition over, while ingest keeps buffering. When the
        lake's progress falls on a boundary of the buffered chunks, only the chunks after it
        are written (they hold exactly the store's events of their ranges), instead of
        reading the whole range back from the store (about 15 µs and 2 kB per event).
        :meth:`TraceLake.write_decoded` checks the progress again under the lake's lock; when
        it moved in between (a take-over's :meth:`TraceLake.start_partition` settling a new
        partition's start, in the backfill's thread, as ingest's first flush of it begins),
        the buffer is lined up with the new progress once more. Reading the store back there
        cost the bench's first flush of a partition ~1 s with the GIL and ~190 MiB of RSS
        (docs/performance.md, eleventh pass).
        """
        key = (trace_topic, partition)
        for _ in range(3):
            done = self.store.lake_progress().get(key)
            entries, after = buf.entries, buf.after
            if done is not None and done != after:
                if done == buf.end:
                    return [], ""  # the lake holds all of it
                skip = next((i for i, e in enumerate(entries) if e[0] == done), None)
                if skip is None:
                    return None, "not_aligned"  # not on a chunk boundary (or behind the buffer)
                entries, after = entries[skip:], done
            files = self.lake.write_decoded(
                trace_topic, partition, after,
                _segments(entries, self.settings.collector_lake_segment_rows),
            )  # fmt: skip
            if files is not None:
                return files, ""
            if self.store.lake_progress().get(key) == done:
                return None, "refused"  # for another reason: a pending segment
        return None, "moving"

    async def flush_and_commit(
        self, cluster: FleetCluster, tps: list[TopicPartition], *, drain: bool = False
    ) -> None:
        """Write the lake up to the store, then commit Kafka up to what both hold (the
        periodic flush; the fleet commits what :meth:`flush` returns at a revocation)."""
        offsets = await self.flush(cluster, tps, drain=drain)
        if offsets:
            try:
                await cluster.commit(offsets)
            except Exception as exc:  # rebalancing: the next owner resumes from the commit
                log.warning("trace offset commit failed", error=repr(exc))

    async def flush(
        self, cluster: FleetCluster, tps: list[TopicPartition], *, drain: bool = True
    ) -> dict[TopicPartition, int]:
        """Write the lake up to the store; returns the Kafka offsets both hold.

        ``drain``: first wait for the chunks in the pipeline (partitions changing owner,
        shutdown); a periodic flush writes what is stored so far and lets ingest go on.
        """
        if not tps:
            return {}
        if drain:
            await self.drain()
            if self._flushing is not None and self._flushing is not asyncio.current_task():
                with contextlib.suppress(Exception):
                    await self._flushing
        for tp in tps:
            files = await self._flush_one(tp)
            metrics.LAKE_FILES.inc(len(files))
        metrics.LAKE_ROWS_PENDING.set(sum(b.events for b in self._buffers.values()))
        lake = await self.run(self.store.lake_progress)
        store = await self.run(self.store.progress)
        bases = cluster.state.bases
        offsets = {}
        for tp in tps:
            key = (tp.topic, tp.partition)
            # back to Kafka's offsets; below the base: nothing of the current log is done yet
            both = min(store.get(key, 0), lake.get(key, 0)) - bases.get(key, 0)
            if both > 0:
                offsets[tp] = both
        return offsets


def _at_end(consumer: Any, data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> bool:
    """Whether a fetch reached the end of every partition it holds (their high watermarks as
    that fetch's responses gave them)."""
    for tp, records in data.items():
        high = consumer.highwater(tp)
        if high is None or not records or records[-1].offset + 1 < high:
            return False
    return True


def _segments(
    entries: list[tuple[int, int, int, dict[tuple[str, int], list[Any]]]], max_rows: int
) -> list[tuple[int, int, dict[tuple[str, int], list[Any]]]]:
    """Consecutive chunks → lake segments of at most ``max_rows`` events (at least one chunk)."""
    out: list[tuple[int, int, dict[tuple[str, int], list[Any]]]] = []
    start = end = 0
    rows = 0
    groups: dict[tuple[str, int], list[Any]] = {}
    for s, e, n, g in entries:
        if groups and rows + n > max_rows:
            out.append((start, end, groups))
            groups, rows = {}, 0
        if not groups:
            start = s
        end = e
        rows += n
        for hour_key, batches in g.items():
            groups.setdefault(hour_key, []).extend(batches)
    if groups or not out:
        out.append((start, end, groups))
    return out


def _chunks(
    data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
) -> list[
    list[tuple[str, int, list[tuple[int, bytes | None, str | None, str | None, str | None]]]]
]:
    """A fetch → chunks of about CHUNK_BYTES of trace messages (a partition's in order)."""
    chunks: list[
        list[tuple[str, int, list[tuple[int, bytes | None, str | None, str | None, str | None]]]]
    ] = []
    current: list[
        tuple[str, int, list[tuple[int, bytes | None, str | None, str | None, str | None]]]
    ] = []
    size = 0
    for tp, records in data.items():
        recs: list[tuple[int, bytes | None, str | None, str | None, str | None]] = []
        current.append((tp.topic, tp.partition, recs))
        for rec in records:
            if size >= CHUNK_BYTES and recs:
                recs = []
                chunks.append(current)
                current = [(tp.topic, tp.partition, recs)]
                size = 0
            value = rec.value
            recs.append((rec.offset, value, *_trace_headers(rec.headers)))
            size += len(value) if value else 0
    current = [c for c in current if c[2]]
    if current:
        chunks.append(current)
    return chunks


def _libc() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return None


_LIBC = _libc()
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own malloc arena (up to 8 per core), and
    each keeps what it freed; ingest's threads allocate a lot, so few arenas keep RSS low."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_ARENA_MAX, arenas)


def release_free_memory() -> None:
    """Hand the heap's free pages back to the OS (a flushed lake buffer leaves many)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


#: Longest idempotency key taken from a trace message (tracemq's are 32 characters).
MAX_IDEMPOTENCY_KEY_CHARS = 128
#: Longest client id taken from a trace message (``<host>@<instance name>[@pid][#n]``).
MAX_CLIENT_ID_CHARS = 256


def _header_text(value: Any) -> str | None:
    try:
        return bytes(value).decode()
    except (UnicodeDecodeError, TypeError, ValueError):
        return None


def _trace_headers(headers: Any) -> tuple[str | None, str | None, str | None]:
    """``(born host, idempotency key, client id)`` of a trace message; None for a missing or
    unusable one (an unusable key only means the message is not deduplicated, an unusable
    client id that the view names no client)."""
    born: str | None = None
    key: str | None = None
    client_id: str | None = None
    for k, v in headers or ():
        if k == "BORN_HOST":
            born = _header_text(v)
        elif k == "IDEMPOTENCY_KEY":
            key = _header_text(v)
            if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS:
                key = None
        elif k == "CLIENT_ID":
            client_id = _header_text(v)
            if client_id is not None and not 0 < len(client_id) <= MAX_CLIENT_ID_CHARS:
                client_id = None
    return born, key, client_id


def _reason_label(reason: str) -> str:
    """A small, fixed set of metric labels for the free-text quarantine reasons."""
    r = reason.lower()
    for needle, label in (
        ("utf-8", "utf8"),
        ("unknown trace type", "unknown_type"),
        ("characters long", "oversized_field"),
        ("empty", "empty"),
        ("malformed", "malformed"),
    ):
        if needle in r:
            return label
    return "other"
