"""Backfill: a collector that takes over trace partitions fills its store from the lake.

A collector's store holds what it ingested. When a partition moves to it (another collector
stopped, was killed, lost its disk) or it starts on an empty disk, ingest resumes at the
group's committed offset, and the partition's earlier events are only in the lake (every
collector writes one shared lake; an owner writes its files before its Kafka commit). This
module copies them into the store, so the store answers for the partition's whole retention
again (the lake fallback, :mod:`tracemq_collector.lake_lookup`, answers in the meantime).

Guarantees:

* **Bounded by retention**: only events with ``timestamp`` newer than the store's retention
  cutoff, from the hour directories that can hold them, and only the files named for the
  partition (a file's name states its trace partition and offset range).
* **Idempotent with ingest**: events are written through :meth:`TraceStore.write_batch` with
  no progress, so the store's ``UNIQUE (trace_topic, trace_partition, trace_offset,
  trace_index)`` and its pre-check skip every event already stored (by ingest, or by an
  earlier backfill), and nothing moves the partition's ingest progress. Nor is anything
  ingest stored since the partition's assignment copied (``ingested_from``): the lake files
  ingest wrote meanwhile are not read back.
* **Never rewritten to the lake**: a partition is backfilled only once its lake progress is
  set (:meth:`TraceLake.start_partition` settles it where the partition's stored events start
  unless it is set already, without reading them back; or the backfill starts its lake: see
  below), and only events *below* that progress are copied; the lake writer only writes
  ranges from there on.
* **Exact**: the store keeps a record's text, so each lake row is encoded back to its trace
  record (:func:`record_of`) and kept only if that record decodes to exactly the row's
  columns; a row that does not is skipped, counted (``not_reencodable``) and logged.
* **Never blocking ingest**: one partition at a time in a thread of its own, in write
  transactions of :data:`BATCH_EVENTS` events (ingest waits for one at most).

A partition is backfilled at each take-over (also after a restart: already stored events are
skipped, at the cost of reading the partition's files again). A partition taken over before
its ingest stored anything (idle, or ingest still starting) gets its lake progress set to the
end of the earlier owners' files first (:meth:`TraceStore.start_lake_at`, atomic against
ingest's first batch), so it is backfilled at once and those offsets are not written twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from tracemq import lake
from tracemq.log import get_logger
from tracemq.trace import (
    FIELD_SPLITOR,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    TransactionState,
    encode,
)

from tracemq_collector import metrics
from tracemq_collector.events import ROW_NAMES, event_from_stored, hour_partition, store_rows
from tracemq_collector.lake import TraceLake
from tracemq_collector.store import TraceStore

__all__ = ["BATCH_EVENTS", "Backfill", "record_of"]

log = get_logger("collector.backfill")

#: Events per store transaction of a backfill.
BATCH_EVENTS = 5000
# The store keeps these two columns itself (they override what the record decodes to).
_STORED_OVER_RECORD = ("client_host", "store_time")
_COMPARED = tuple(c for c in lake.COLUMN_NAMES if c not in _STORED_OVER_RECORD)


def record_of(row: dict[str, Any]) -> str | None:
    """The trace record text the store keeps for the lake row ``row``: one that decodes
    (:func:`tracemq_collector.events.event_from_stored`) to exactly the row's columns; None
    when no record does (then the row cannot be stored faithfully)."""
    try:
        state = row["transaction_state"]
        bean = TraceBean(
            topic=row["topic"],
            msg_id=row["msg_id"],
            offset_msg_id=row["offset_msg_id"],
            tags=row["tags"],
            keys=row["keys"],
            store_host=row["store_host"],
            client_host=row["client_host"],
            store_time=row["store_time"],
            retry_times=row["retry_times"],
            body_length=row["body_length"],
            msg_type=None if row["msg_type"] is None else MessageType(row["msg_type"]),
            transaction_id=row["transaction_id"],
            transaction_state=None if state is None else TransactionState(state),
            from_transaction_check=row["from_transaction_check"],
        )
        ctx = TraceContext(
            TraceType(row["trace_type"]),
            timestamp=row["timestamp"],
            region_id=row["region_id"],
            group_name=row["group_name"],
            cost_time=row["cost_time"],
            success=row["success"],
            request_id=row["request_id"],
            context_code=row["context_code"],
            trace_beans=[bean],
        )
        text = encode(ctx).data.removesuffix(FIELD_SPLITOR)
        rebuilt = event_from_stored(
            text,
            row["trace_topic"],
            row["trace_partition"],
            row["trace_offset"],
            row["trace_index"],
            row["ingest_ts"],
        )
    except (ValueError, KeyError, TypeError):
        return None
    if any(rebuilt[c] != row[c] for c in _COMPARED):
        return None
    return text


@dataclass
class BackfillState:
    """Progress, as ``/healthz`` shows it."""

    pending: set[tuple[str, int]] = field(default_factory=set)
    done: set[tuple[str, int]] = field(default_factory=set)
    running: tuple[str, int] | None = None
    events: int = 0
    skipped: int = 0
    failures: int = 0


class Backfill:
    """Backfills the store's partitions from the lake (see the module docstring).

    Args:
        store: the open trace store.
        writer: the collector's lake writer (its file system and root are read; its
            :meth:`TraceLake.start_partition` settles a partition's lake progress).
        retention_ms: the store's retention: older events are not copied.
        ingested_from: the first trace offset of a partition that ingest stored since it was
            assigned to this collector (None: nothing yet; the collector passes
            :meth:`Ingestor.ingested_from`). Ingest stores every event from there on itself,
            so the copy stops there even when the lake's progress is further on: a backfill
            that runs after ingest's first lake flush of the partition (it waits for the
            partitions before it, and for its one-second round) would otherwise read ingest's
            own new files back and offer every event of them to the store again, ~20 µs and
            a few kB of heap per event (docs/performance.md, thirteenth pass).

    :meth:`assign` and :meth:`snapshot` may be called from any thread; :meth:`run_next` runs
    one partition's backfill synchronously (the collector calls it in a thread of its own).
    """

    def __init__(
        self,
        store: TraceStore,
        writer: TraceLake,
        retention_ms: int,
        ingested_from: Callable[[tuple[str, int]], int | None] | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.fs: pafs.FileSystem = writer.fs
        self.root = writer.root.as_posix()
        self.retention_ms = retention_ms
        self._ingested_from = ingested_from
        self.state = BackfillState()
        self._owned: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        # pending partitions that could not run this round (tried again next round)
        self._waiting: set[tuple[str, int]] = set()

    def stop(self) -> None:
        """Make a running backfill return after its current batch (it stays pending)."""
        self._stopping.set()

    def assign(self, owned: set[tuple[str, int]]) -> None:
        """The partitions owned now: each newly owned one becomes pending; one no longer
        owned is dropped from pending (its new owner backfills it)."""
        with self._lock:
            for key in owned - self._owned:
                self.state.pending.add(key)
                self.state.done.discard(key)
            self.state.pending &= owned
            self._owned = set(owned)
        self._publish()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            s = self.state
            return {
                "pending": sorted(f"{t}/{p}" for t, p in s.pending),
                "done": sorted(f"{t}/{p}" for t, p in s.done),
                "running": None if s.running is None else f"{s.running[0]}/{s.running[1]}",
                "events_backfilled": s.events,
                "events_skipped": s.skipped,
                "failures": s.failures,
            }

    def _publish(self) -> None:
        with self._lock:
            metrics.BACKFILL_PARTITIONS.labels(state="pending").set(len(self.state.pending))
            metrics.BACKFILL_PARTITIONS.labels(state="done").set(len(self.state.done))

    def run_next(self, now_ms: int | None = None) -> bool:
        """Backfill one pending partition; False when none could be (nothing pending, or the
        partition's lake progress is not settled yet). An I/O error leaves the partition
        pending (logged, counted)."""
        with self._lock:
            ready = sorted(self.state.pending - self._waiting)
            if not ready:
                self._waiting.clear()  # each waiting partition is tried again next round
                return False
            key = ready[0]
            self.state.running = key
        try:
            copied = self._partition(key, int(time.time() * 1000) if now_ms is None else now_ms)
        except _Stopped:
            with self._lock:
                self.state.running = None
            return False
        except (OSError, ValueError) as exc:
            metrics.BACKFILL_FAILURES.inc()
            log.warning(
                "backfill failed; retried later",
                trace_topic=key[0],
                partition=key[1],
                error=repr(exc)[:300],
            )
            with self._lock:
                self.state.failures += 1
                self.state.running = None
                self._waiting.add(key)
            return False
        with self._lock:
            self.state.running = None
            if copied is None:
                self._waiting.add(key)
                return False
            if key in self.state.pending:
                self.state.pending.discard(key)
                self.state.done.add(key)
        self._publish()
        log.info("partition backfilled", trace_topic=key[0], partition=key[1], events=copied)
        return True

    def _partition(self, key: tuple[str, int], now_ms: int) -> int | None:
        """Events copied; None when the partition must wait (its lake progress unsettled)."""
        topic, partition = key
        cutoff = now_ms - self.retention_ms
        dirs = {d: self._files(d, key) for d in self._hour_dirs(cutoff, now_ms)}
        if key in self.store.progress():
            # the lake progress bounds the copy: settled, not written (ingest writes the lake)
            self.writer.start_partition(topic, partition)
        else:
            # Taken over, nothing ingested yet (an idle partition, or ingest still starting):
            # the lake holds the earlier owners' events up to the end of their files; the
            # lake continues from there (unless ingest's first batch got in first).
            ends = [lake.parse_file_name(PurePosixPath(p).name) for f in dirs.values() for p in f]
            if not any(ends):
                return 0  # the lake holds nothing of it within retention
            end = max(n.end for n in ends if n is not None)
            self.store.start_lake_at(topic, partition, end)
        below = self.store.lake_progress().get(key)
        if below is None:
            return None
        ingested = None if self._ingested_from is None else self._ingested_from(key)
        if ingested is not None:
            below = min(below, ingested)
        where = (
            (pc.field("trace_offset") < below)
            & (pc.field("timestamp") >= cutoff)
            & (pc.field("trace_partition") == partition)
            & (pc.field("trace_topic") == topic)
        )
        copied = 0
        for directory, listed in sorted(dirs.items()):
            files = [p for p in listed if _start(p) < below]
            if not files:
                continue
            try:
                table = ds.dataset(files, format="parquet", filesystem=self.fs).to_table(
                    columns=list(lake.COLUMN_NAMES), filter=where
                )
            except FileNotFoundError:
                # compacted since the listing: list again once
                files = [p for p in self._files(directory, key) if _start(p) < below]
                table = ds.dataset(files, format="parquet", filesystem=self.fs).to_table(
                    columns=list(lake.COLUMN_NAMES), filter=where
                )
            metrics.BACKFILL_ROWS_READ.inc(table.num_rows)
            for start in range(0, table.num_rows, BATCH_EVENTS):
                if self._stopping.is_set():
                    raise _Stopped
                copied += self._write(table.slice(start, BATCH_EVENTS).to_pylist())
        return copied

    def _write(self, rows: list[dict[str, Any]]) -> int:
        tuples = []
        for row in rows:
            record = record_of(row)
            if record is None:
                with self._lock:
                    self.state.skipped += 1
                metrics.BACKFILL_SKIPPED.labels(reason="not_reencodable").inc()
                log.warning(
                    "lake event not backfilled: no record decodes to it",
                    trace_topic=row["trace_topic"],
                    partition=row["trace_partition"],
                    offset=row["trace_offset"],
                    index=row["trace_index"],
                )
                continue
            date, hour = hour_partition(row["timestamp"])
            full = {**row, "record": record, "client_id": None, "date": date, "hour": hour}
            tuples.append(tuple(full[name] for name in ROW_NAMES))
        if not tuples:
            return 0
        new = self.store.write_rows(store_rows(tuples, [], {}, ordered=False))[0]
        metrics.BACKFILL_EVENTS.inc(new)
        with self._lock:
            self.state.events += new
        return new

    def _hour_dirs(self, cutoff_ms: int, now_ms: int) -> list[str]:
        """Hour directories that can hold events newer than ``cutoff_ms``."""
        out = []
        root = pafs.FileSelector(self.root, allow_not_found=True)
        for info in self.fs.get_file_info(root):
            if info.type != pafs.FileType.Directory or lake.parse_date_dir(info.base_name) is None:
                continue
            for hour in self.fs.get_file_info(pafs.FileSelector(info.path, allow_not_found=True)):
                start = lake.hour_start_ms(info.base_name, hour.base_name)
                if (
                    hour.type == pafs.FileType.Directory
                    and start is not None
                    and start + lake.HOUR_MS > cutoff_ms
                    and start <= now_ms + lake.HOUR_MS
                ):
                    out.append(f"{self.root}/{info.base_name}/{hour.base_name}")
        return sorted(out)

    def _files(self, directory: str, key: tuple[str, int]) -> list[str]:
        """The live files of ``directory`` named for partition ``key`` (the compaction rule
        applied; a compacted file's footer lists its sources)."""
        names: dict[str, list[str]] = {}
        for info in self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
            parsed = lake.parse_file_name(info.base_name)
            if (
                info.type != pafs.FileType.File
                or parsed is None
                or (parsed.topic, parsed.partition) != key
            ):
                continue
            try:
                names[info.path] = (
                    self.writer._compacted_from(_path(self.writer, info.path))
                    if parsed.compacted
                    else []
                )
            except FileNotFoundError:
                continue  # compacted away since the listing; its successor is listed
        return lake.live_files(names)[0]


def _start(path: str) -> int:
    parsed = lake.parse_file_name(PurePosixPath(path).name)
    return -1 if parsed is None else parsed.start


class _Stopped(Exception):
    pass


def _path(writer: TraceLake, path: str) -> Any:
    return type(writer.root)(path)
