"""The Parquet trace lake: the store's events, Hive-partitioned by event date and hour.

The lake's contract — columns, version, the ``date=/hour=`` layout, the ``part-`` and
``compacted-`` file names and which files are live — is :mod:`tracemq.lake`, shared with the
Spark job; this module writes, compacts and reads a lake by it.

Exactly once, by file names
---------------------------
A *segment* is a range ``[start, end)`` of trace offsets of one trace partition. Writing one:

1. :meth:`TraceStore.begin_lake_segment` records the exact range, durably;
2. the range's events are read from the store, grouped by (date, hour), and each group is
   written to its ``part-`` file: a temporary file in the same directory, fsync, rename;
3. :meth:`TraceStore.finish_lake_segment` moves the lake progress to ``end`` and clears the
   record, in one transaction.

A crash anywhere leaves either nothing to do or a recorded segment, which :meth:`TraceLake.recover`
(and :meth:`TraceLake.flush`, for its partition) writes again with exactly the recorded range:
the same rows give the same file names, which are overwritten, never duplicated. Temporary
files start with ``.``, which Parquet readers (pyarrow, Spark) skip.

Compaction
----------
:meth:`TraceLake.compact` merges the files of a closed hour into one ``compacted-`` file whose
footer metadata (key ``tracemq.lake.compacted_from``) lists the files it replaces. The
compacted file is written completely (temporary name, fsync, rename) *before* any source is
deleted. The rule, for readers and for reruns (:func:`tracemq.lake.live_files`): **a file
named in the ``compacted_from`` list of another file in the same directory is superseded; skip
it.** A crash between the rename and the deletes thus never doubles a row for a reader that
applies the rule (:meth:`TraceLake.files`, :meth:`TraceLake.read_all`); the next :meth:`TraceLake.compact` or :meth:`TraceLake.recover`
deletes the leftovers. A reader that lists files itself may also drop duplicates by
``(trace_topic, trace_partition, trace_offset, trace_index)``, which is unique per event.
Files of a segment still being written (recorded as pending) are never compacted, so a redo
cannot bring back rows a compacted file already holds. Compaction holds one hour of rows in
memory.

One lake root belongs to one store: compaction consults that store's pending segments, and
two compactions of the same hour would each write a compacted file naming only its own
sources. Collectors that share storage should each write their own root (for example one
directory per collector), which Spark can read together.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from tracemq import lake

from tracemq_collector.store import TraceStore

__all__ = ["COMPACTED_FROM_KEY", "SORT_KEYS", "TraceLake"]

#: Footer metadata key of a compacted file (:data:`tracemq.lake.COMPACTED_FROM_KEY`).
COMPACTED_FROM_KEY = lake.COMPACTED_FROM_KEY
#: Row order of a compacted file.
SORT_KEYS = ("trace_topic", "trace_partition", "trace_offset", "trace_index")

_PARTITIONING = ds.partitioning(
    pa.schema([("date", pa.string()), ("hour", pa.int32())]), flavor="hive"
)


def _fsync_dir(path: Path) -> None:
    # A rename or unlink is durable only once the directory itself is synced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _compacted_from(path: Path) -> list[str]:
    return lake.compacted_from((pq.read_schema(path).metadata or {}).get(COMPACTED_FROM_KEY))


def _live_files(hour_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(live, superseded)`` collector files of one hour directory, by the compaction rule
    (:func:`tracemq.lake.live_files`). Only a ``compacted-`` file's footer is read: no other
    file of ours names any."""
    names = {}
    for path in sorted(hour_dir.iterdir()):
        parsed = lake.parse_file_name(path.name)
        if parsed is not None:
            names[path.as_posix()] = _compacted_from(path) if parsed.compacted else []
    live, superseded = lake.live_files(names)
    return [Path(p) for p in live], [Path(p) for p in superseded]


class TraceLake:
    """Writes the trace store's events to Parquet, exactly once per event; compacts closed hours.

    Args:
        root: the lake directory (created if missing).
        store: the open trace store the events and the lake bookkeeping live in.
        segment_max_rows: most events per segment; a longer range is cut into several.
        compression: Parquet codec of the files written.

    Methods are synchronous and serialised by a lock (they may be called from any thread).
    The protocol and the compaction rule: see the module docstring.
    """

    def __init__(
        self,
        root: Path,
        store: TraceStore,
        *,
        segment_max_rows: int = 200_000,
        compression: str = "zstd",
    ) -> None:
        if segment_max_rows < 1:
            raise ValueError(f"segment_max_rows must be at least 1, got {segment_max_rows}")
        self.root = Path(root)
        self.store = store
        self.segment_max_rows = segment_max_rows
        self.compression = compression
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writing

    def flush(self, trace_topic: str, partition: int) -> list[Path]:
        """Write the partition's events the store holds and the lake does not; return the files.

        First rewrites any segment of this partition left pending by a crash. A range with no
        event (all quarantined) still moves the lake progress.
        """
        lake.check_trace_topic(trace_topic)
        with self._lock:
            written = self._redo_pending(
                s for s in self.store.pending_lake_segments() if s[:2] == (trace_topic, partition)
            )
            store_next = self.store.progress().get((trace_topic, partition))
            if store_next is None:
                return written
            lake_next = self.store.lake_progress().get((trace_topic, partition))
            if lake_next is None:
                # A new lake starts where the store's events of the partition start.
                first = self.store.first_event_offset(trace_topic, partition)
                lake_next = store_next if first is None else min(first, store_next)
            while lake_next < store_next:
                end = store_next
                cut = self.store.nth_event_offset(
                    trace_topic, partition, lake_next, self.segment_max_rows
                )
                if cut is not None and cut < end:
                    # Cut between trace messages; one message with more events than the limit
                    # still goes whole.
                    end = max(cut, lake_next + 1)
                written += self._segment(trace_topic, partition, lake_next, end)
                lake_next = end
            return written

    def write_decoded(
        self,
        trace_topic: str,
        partition: int,
        after: int | None,
        segments: list[tuple[int, int, dict[tuple[str, int], list[pa.RecordBatch]]]],
    ) -> list[Path] | None:
        """Write segments from events decoded by ingest, without reading the store again.

        Args:
            after: the store's progress of the partition before the first segment's events
                were stored (None: the partition had none); it must be the lake's progress,
                so that the segments hold exactly the events the store holds in their ranges.
            segments: ``(start, end, {(date, hour): record batches})``, consecutive, each
                batch of :func:`tracemq.lake.arrow_schema` in offset and index order.

        Returns:
            The files written, or None when the lake is not where ``after`` says, or a
            segment of the partition is pending (then nothing was written: :meth:`flush`
            instead, which reads the store).

        The segment protocol is :meth:`flush`'s: each range is recorded before its files are
        written, so a crash rewrites exactly the same files from the store (:meth:`recover`).
        """
        lake.check_trace_topic(trace_topic)
        key = (trace_topic, partition)
        with self._lock:
            if self.store.lake_progress().get(key) != after or any(
                s[:2] == key for s in self.store.pending_lake_segments()
            ):
                return None
            written: list[Path] = []
            for start, end, groups in segments:
                self.store.begin_lake_segment(trace_topic, partition, start, end)
                name = lake.part_name(trace_topic, partition, start, end)
                for (date, hour), batches in sorted(groups.items()):
                    table = pa.Table.from_batches(batches, schema=lake.arrow_schema())
                    path = self.root / lake.hour_dir(date, hour) / name
                    self._write_atomic(table, path)
                    written.append(path)
                self.store.finish_lake_segment(trace_topic, partition, end)
            return written

    def flush_all(self) -> list[Path]:
        """:meth:`flush` every partition the store has progress for."""
        written: list[Path] = []
        for trace_topic, partition in sorted(self.store.progress()):
            written += self.flush(trace_topic, partition)
        return written

    def recover(self) -> list[Path]:
        """Repair the lake after a crash; call at start, before anything else writes to it.

        Deletes temporary files, finishes interrupted compactions (deletes superseded files),
        and rewrites every pending segment with exactly its recorded range.
        """
        with self._lock:
            if self.root.is_dir():
                for tmp in self.root.glob(f"date=*/hour=*/{lake.TMP_PREFIX}*"):
                    tmp.unlink(missing_ok=True)
                for hour_dir in self._hour_dirs():
                    self._delete_superseded(hour_dir)
            return self._redo_pending(self.store.pending_lake_segments())

    def _redo_pending(self, segments: Iterable[tuple[str, int, int, int]]) -> list[Path]:
        written: list[Path] = []
        for trace_topic, partition, start, end in list(segments):
            written += self._segment(trace_topic, partition, start, end)
        return written

    def _segment(self, trace_topic: str, partition: int, start: int, end: int) -> list[Path]:
        self.store.begin_lake_segment(trace_topic, partition, start, end)
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in self.store.events_in_range(trace_topic, partition, start, end):
            groups.setdefault((row["date"], row["hour"]), []).append(row)
        written = []
        name = lake.part_name(trace_topic, partition, start, end)
        for (date, hour), rows in sorted(groups.items()):
            table = pa.Table.from_pydict(
                {column: [row[column] for row in rows] for column in lake.COLUMN_NAMES},
                schema=lake.arrow_schema(),
            )
            path = self.root / lake.hour_dir(date, hour) / name
            self._write_atomic(table, path)
            written.append(path)
        self.store.finish_lake_segment(trace_topic, partition, end)
        return written

    def _write_atomic(self, table: pa.Table, path: Path) -> None:
        directory = path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            # New directory entries must be durable before the file they lead to matters.
            _fsync_dir(directory.parent)
            _fsync_dir(directory.parent.parent)
        tmp = directory / f"{lake.TMP_PREFIX}{uuid.uuid4().hex}-{path.name}"
        try:
            with open(tmp, "wb") as fh:
                pq.write_table(table, fh, compression=self.compression)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(directory)

    # ------------------------------------------------------------------ compaction

    def compact(self, closed_before_ms: int) -> int:
        """Merge the files of every hour that ended at or before ``closed_before_ms``.

        An hour with two or more live files (``part-`` or ``compacted-``) becomes one
        ``compacted-`` file, rows sorted by :data:`SORT_KEYS`; the sources are deleted after
        it is durable. Files of pending segments are left alone. Returns how many hours were
        compacted.
        """
        with self._lock:
            compacted = 0
            for hour_dir in self._hour_dirs():
                hour_start = lake.hour_start_ms(hour_dir.parent.name, hour_dir.name)
                if hour_start is None or hour_start + lake.HOUR_MS > closed_before_ms:
                    continue
                self._delete_superseded(hour_dir)
                live, _ = _live_files(hour_dir)
                # Pending segments are read after listing: a file listed was written after its
                # segment was recorded, so a segment still pending is sure to be seen here.
                pending = {(t, p, s, e) for t, p, s, e in self.store.pending_lake_segments()}
                sources = [p for p in live if _part_segment(p) not in pending]
                if len(sources) >= 2 and self._merge(hour_dir, sources):
                    compacted += 1
            return compacted

    def _merge(self, hour_dir: Path, sources: list[Path]) -> bool:
        tables = []
        for path in sources:
            table = pq.ParquetFile(path).read()
            if not lake.is_current_version((table.schema.metadata or {}).get(lake.METADATA_KEY)):
                return False  # another schema version: not ours to rewrite
            tables.append(table.replace_schema_metadata(None))
        merged = pa.concat_tables(tables).sort_by([(key, "ascending") for key in SORT_KEYS])
        starts, ends, parts = [], [], 0
        for path in sources:
            start, end, count = _name_range(path)
            starts.append(start)
            ends.append(end)
            parts += count
        # Counting the original parts makes the name grow with every merge, so the new name
        # can never be one of its sources (which would be deleted after the rename).
        name = lake.compacted_name(min(starts), max(ends), parts)
        if name in {p.name for p in sources}:
            raise RuntimeError(f"compaction of {hour_dir} would overwrite its source {name}")
        metadata = lake.file_metadata(compacted_from=[p.name for p in sources])
        self._write_atomic(
            merged.cast(lake.arrow_schema().with_metadata(metadata)), hour_dir / name
        )
        for path in sources:
            path.unlink()
        _fsync_dir(hour_dir)
        return True

    def _delete_superseded(self, hour_dir: Path) -> None:
        _, superseded = _live_files(hour_dir)
        for path in superseded:
            path.unlink(missing_ok=True)
        if superseded:
            _fsync_dir(hour_dir)

    def _hour_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(
            hour_dir
            for date_dir in self.root.iterdir()
            if date_dir.is_dir() and lake.parse_date_dir(date_dir.name) is not None
            for hour_dir in date_dir.iterdir()
            if hour_dir.is_dir() and lake.parse_hour_dir(hour_dir.name) is not None
        )

    # ------------------------------------------------------------------ reading

    def files(self) -> list[Path]:
        """The live data files of the lake (superseded and temporary files left out)."""
        return [path for hour_dir in self._hour_dirs() for path in _live_files(hour_dir)[0]]

    def read_all(self) -> pa.Table:
        """The whole lake as one table: the lake columns plus ``date`` and ``hour``."""
        files = self.files()
        schema = lake.arrow_schema().append(pa.field("date", pa.string()))
        schema = schema.append(pa.field("hour", pa.int32()))
        if not files:
            return pa.Table.from_pylist([], schema=schema)
        dataset = ds.dataset(
            [str(p) for p in files],
            schema=schema,
            format="parquet",
            partitioning=_PARTITIONING,
            partition_base_dir=str(self.root),
        )
        return dataset.to_table()


def _part_segment(path: Path) -> tuple[str, int, int, int] | None:
    name = lake.parse_file_name(path.name)
    if name is None or name.topic is None or name.partition is None:
        return None  # not a part- file
    return (name.topic, name.partition, name.start, name.end)


def _name_range(path: Path) -> tuple[int, int, int]:
    """``(start, end, original part count)`` a data file's name states."""
    name = lake.parse_file_name(path.name)
    if name is None:  # _live_files let only collector names through
        raise ValueError(f"not a lake data file: {path}")
    return name.start, name.end, name.parts
