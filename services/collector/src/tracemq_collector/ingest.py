"""Ingest: trace topics → decode → trace store → trace lake → Kafka commit.

Exactly once in effect: the store keeps, in the same SQLite transaction as the events, the next
offset of every trace partition, and dedupes by (trace topic, partition, offset, index); after a
restart consumption resumes at the store's progress. The lake is written from the store in
segments with a recorded, replayable offset range. Kafka offsets are committed only up to what
both the store and the lake hold, so a partition that moves to another collector resumes at a
point where nothing can be lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord
from tracemq.log import get_logger
from tracemq.naming import kafka_topic
from tracemq.routing import RouteCache

from tracemq_collector import metrics
from tracemq_collector.events import rows_from_record
from tracemq_collector.lake import TraceLake
from tracemq_collector.settings import CollectorSettings
from tracemq_collector.store import TraceStore

log = get_logger("collector.ingest")


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: _ClusterIngest) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.owner.ingestor.flush_and_commit(self.owner, revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.owner.on_assigned(assigned)


class _ClusterIngest:
    def __init__(self, ingestor: Ingestor, bootstrap: str, topics: set[str]) -> None:
        self.ingestor = ingestor
        self.bootstrap = bootstrap
        self.topics = topics
        s = ingestor.settings
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=s.collector_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.collector_batch_max_records,
            session_timeout_ms=s.collector_session_timeout_ms,
            heartbeat_interval_ms=max(300, s.collector_session_timeout_ms // 5),
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        self.task: asyncio.Task[None] | None = None
        self.assigned: set[TopicPartition] = set()

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(sorted(self.topics), listener=_Rebalance(self))
        self.task = asyncio.create_task(self._loop(), name=f"ingest-{self.bootstrap}")

    def resubscribe(self, topics: set[str]) -> None:
        if topics != self.topics:
            self.topics = topics
            self.consumer.subscribe(sorted(topics), listener=_Rebalance(self))

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        progress = await self.ingestor.run(self.ingestor.store.progress)
        for tp in assigned:
            nxt = progress.get((tp.topic, tp.partition))
            if nxt is not None:
                self.consumer.seek(tp, nxt)  # the store is the truth of what we hold
        self.assigned.update(assigned)

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        with contextlib.suppress(Exception):
            await self.ingestor.flush_and_commit(self, list(self.assigned))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.consumer.stop(), 10)

    async def _loop(self) -> None:
        ing = self.ingestor
        while True:
            data = await self.consumer.getmany(
                timeout_ms=200, max_records=ing.settings.collector_batch_max_records
            )
            if data:
                await ing.ingest(data)
            await ing.maybe_flush(self)


class Ingestor:
    """Follows every broker hosting the configured trace topics and ingests them."""

    def __init__(
        self,
        settings: CollectorSettings,
        store: TraceStore,
        lake: TraceLake,
        routes: RouteCache,
        writer: ThreadPoolExecutor,
    ) -> None:
        self.settings = settings
        self.store = store
        self.lake = lake
        self.routes = routes
        self.writer = writer
        self.clusters: dict[str, _ClusterIngest] = {}
        self._unflushed: dict[tuple[str, int], tuple[float, int]] = {}
        self._watch: asyncio.Task[None] | None = None
        self.events_stored = 0
        self.last_batch_ms = 0

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run store/lake work on the single writer thread (never on the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    async def start(self) -> None:
        await self.sync_clusters()
        self._watch = asyncio.create_task(self._watch_routes(), name="ingest-routes")

    async def stop(self) -> None:
        if self._watch:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        for c in list(self.clusters.values()):
            await c.stop()
        self.clusters.clear()

    def healthy(self) -> bool:
        return all(c.task is not None and not c.task.done() for c in self.clusters.values())

    async def sync_clusters(self) -> None:
        wanted: dict[str, set[str]] = defaultdict(set)
        for topic in self.settings.collector_trace_topics:
            route = await self.routes.get(topic)
            for q in route.queues:
                wanted[q.data_bootstrap].add(kafka_topic(q.broker, topic))
        for bootstrap, topics in wanted.items():
            c = self.clusters.get(bootstrap)
            if c is None:
                c = _ClusterIngest(self, bootstrap, topics)
                self.clusters[bootstrap] = c
                await c.start()
                log.info("following trace topics", bootstrap=bootstrap, topics=sorted(topics))
            else:
                c.resubscribe(topics)

    async def _watch_routes(self) -> None:
        changes = self.routes.subscribe_changes()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changes.get(), 5.0)
            try:
                await self.sync_clusters()
            except Exception as exc:
                log.warning("trace route refresh failed", error=repr(exc))

    # -- the write path --------------------------------------------------------------------
    async def ingest(self, data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        t0 = time.perf_counter()
        new, total, reasons = await self.run(self._ingest_sync, data)
        metrics.BATCH_SECONDS.observe(time.perf_counter() - t0)
        metrics.RECORDS.inc(sum(len(v) for v in data.values()))
        metrics.EVENTS.inc(new)
        metrics.DUPLICATES.inc(total - new)
        for reason, n in reasons.items():
            metrics.QUARANTINED.labels(reason).inc(n)
        self.events_stored += new
        self.last_batch_ms = _now_ms()
        metrics.LAST_INGEST.set(time.time())
        now = time.monotonic()
        for tp, recs in data.items():
            key = (tp.topic, tp.partition)
            since, n = self._unflushed.get(key, (now, 0))
            self._unflushed[key] = (since, n + len(recs))

    def _ingest_sync(
        self, data: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
    ) -> tuple[int, int, dict[str, int]]:
        ingest_ts = _now_ms()
        rows: list[dict[str, Any]] = []
        bad: list[dict[str, Any]] = []
        progress: dict[tuple[str, int], int] = {}
        for tp, records in data.items():
            for rec in records:
                r, q = rows_from_record(tp.topic, tp.partition, rec.offset, rec.value, ingest_ts)
                if r:
                    born = _born_host(rec.headers)
                    if born:
                        for row in r:
                            if not row.get("client_host"):
                                row["client_host"] = born
                    rows.extend(r)
                bad.extend(q)
            if records:
                progress[(tp.topic, tp.partition)] = records[-1].offset + 1
        new = self.store.write_batch(rows, bad, progress)
        reasons: dict[str, int] = defaultdict(int)
        for q in bad:
            reasons[_reason_label(q.get("reason", ""))] += 1
        return new, len(rows), reasons

    async def maybe_flush(self, cluster: _ClusterIngest) -> None:
        now = time.monotonic()
        due = [
            TopicPartition(t, p)
            for (t, p), (since, n) in self._unflushed.items()
            if n >= self.settings.collector_lake_segment_rows
            or now - since >= self.settings.collector_lake_flush_interval_ms / 1000
        ]
        due = [tp for tp in due if tp in cluster.assigned]
        if due:
            await self.flush_and_commit(cluster, due)

    async def flush_and_commit(self, cluster: _ClusterIngest, tps: list[TopicPartition]) -> None:
        """Write the lake up to the store, then commit Kafka up to what both hold."""
        if not tps:
            return
        for tp in tps:
            files = await self.run(self.lake.flush, tp.topic, tp.partition)
            metrics.LAKE_FILES.inc(len(files))
            self._unflushed.pop((tp.topic, tp.partition), None)
        lake = await self.run(self.store.lake_progress)
        store = await self.run(self.store.progress)
        offsets = {}
        for tp in tps:
            key = (tp.topic, tp.partition)
            both = min(store.get(key, 0), lake.get(key, 0))
            if both > 0:
                offsets[tp] = both
        if offsets:
            try:
                await cluster.consumer.commit(offsets)
            except Exception as exc:  # rebalancing: the next owner resumes from the commit
                log.warning("trace offset commit failed", error=repr(exc))


def _born_host(headers: Any) -> str | None:
    for k, v in headers or ():
        if k == "BORN_HOST":
            try:
                return bytes(v).decode()
            except UnicodeDecodeError:
                return None
    return None


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
