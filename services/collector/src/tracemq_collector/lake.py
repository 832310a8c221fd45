"""The Parquet trace lake: the store's events, Hive-partitioned by event date and hour.

The lake's contract — columns, version, the ``date=/hour=`` layout, the ``part-`` and
``compacted-`` file names and which files are live — is :mod:`tracemq.lake`, shared with the
Spark job; this module writes, compacts and reads a lake by it.

Exactly once, by file names
---------------------------
A *segment* is a range ``[start, end)`` of trace offsets of one trace partition. Writing one:

1. :meth:`TraceStore.begin_lake_segment` records the exact range, durably;
2. the range's events are read from the store, grouped by (date, hour), and each group is
   written to its ``part-`` file whole or not at all: on a local disk a temporary file in the
   same directory, fsync, rename; in an object store (S3) one PUT, which is atomic;
3. :meth:`TraceStore.finish_lake_segment` moves the lake progress to ``end`` and clears the
   record, in one transaction.

A crash anywhere leaves either nothing to do or a recorded segment, which :meth:`TraceLake.recover`
(and :meth:`TraceLake.flush`, for its partition) writes again with exactly the recorded range:
the same rows give the same file names, which are overwritten, never duplicated. Temporary
files start with ``.``, which Parquet readers (pyarrow, Spark) skip.

Where: a local directory or any ``s3://bucket/prefix`` (:func:`lake_filesystem`, pyarrow's
file-system layer). File names are a function of the trace partition and the offset range, so
any number of collectors write one lake without a clash.

Compaction
----------
:meth:`TraceLake.compact` merges, per trace partition, the files of a closed hour into one
``compacted-`` file whose footer metadata (key ``tracemq.lake.compacted_from``) lists the files
it replaces; only the partition's current owner does (the collector passes the partitions it
is assigned). The compacted file is written completely *before* any source is deleted. The
rule, for readers and for reruns (:func:`tracemq.lake.live_files`): **a file named in the
``compacted_from`` list of another file in the same directory is superseded, and so is a file
of a partition whose offset range lies inside another compacted file's of the same partition**
(ties broken by rank). A crash between the write and the deletes thus never doubles a row for
a reader that applies the rule (:meth:`TraceLake.files`, :meth:`TraceLake.read_all`); the
next :meth:`TraceLake.compact` deletes the leftovers. An old and a new owner compacting one
hour at once are safe: same sources give the same name and rows, different sources a smaller
range the larger one supersedes (why a compacted file holds every event of its range: see
:meth:`TraceLake.compact`). A reader that lists files itself may also drop duplicates by
``(trace_topic, trace_partition, trace_offset, trace_index)``, which is unique per event (an
old owner's late write can overlap the new owner's files until they are compacted).
Compaction holds one partition's hour of rows in memory.
"""

from __future__ import annotations

import io
import os
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path, PurePath, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tracemq import lake
from tracemq.log import get_logger

from tracemq_collector.errors import CollectorError
from tracemq_collector.store import TraceStore

__all__ = [
    "COMPACTED_FROM_KEY",
    "FILE_SORT_KEYS",
    "ROW_GROUP_ROWS",
    "SORT_KEYS",
    "TraceLake",
    "lake_filesystem",
]

log = get_logger("collector.lake")

#: Footer metadata key of a compacted file (:data:`tracemq.lake.COMPACTED_FROM_KEY`).
COMPACTED_FROM_KEY = lake.COMPACTED_FROM_KEY
#: An event's coordinates (unique per event): the order compaction dedupes in.
SORT_KEYS = ("trace_topic", "trace_partition", "trace_offset", "trace_index")
#: Row order of every file written, and rows per row group (:mod:`tracemq.lake.layout`).
FILE_SORT_KEYS = lake.FILE_SORT_KEYS
ROW_GROUP_ROWS = lake.ROW_GROUP_ROWS
#: A temporary file this much older than now is a crashed writer's (any collector's) leftover.
TMP_MAX_AGE_S = 600.0

_PARTITIONING = ds.partitioning(
    pa.schema([("date", pa.string()), ("hour", pa.int32())]), flavor="hive"
)


def use_memory_pool(name: str) -> None:
    """Make ``name`` (``system``, ``jemalloc`` or ``mimalloc``) pyarrow's default allocator
    in this process (the collector's ``collector_arrow_memory_pool``).

    Raises:
        CollectorError: this pyarrow build has no such allocator.
    """
    factories = {
        "system": pa.system_memory_pool,
        "jemalloc": pa.jemalloc_memory_pool,
        "mimalloc": pa.mimalloc_memory_pool,
    }
    if name not in factories:
        raise CollectorError(f"TRACEMQ_COLLECTOR_ARROW_MEMORY_POOL: unknown allocator {name!r}")
    try:
        pool = factories[name]()
    except NotImplementedError as exc:
        raise CollectorError(
            f"TRACEMQ_COLLECTOR_ARROW_MEMORY_POOL={name}: this pyarrow build has no {name} "
            f"allocator ({exc}); use system"
        ) from exc
    pa.set_memory_pool(pool)


def lake_filesystem(
    uri: str | Path,
    *,
    s3_endpoint: str | None = None,
    s3_region: str | None = None,
    s3_access_key: str | None = None,
    s3_secret_key: str | None = None,
    s3_session_token: str | None = None,
    s3_virtual_addressing: bool = False,
) -> tuple[pafs.FileSystem | None, PurePath]:
    """Where a lake URI points: ``(file system, root)``; the file system is None for a local
    lake (a bare path or ``file://``), whose root is then a :class:`~pathlib.Path`.

    ``s3://bucket/prefix`` opens pyarrow's S3 client: ``s3_endpoint`` (``http://host:port``
    for an S3-compatible server; the scheme picks TLS) and ``s3_region``; keys not given are
    found the AWS SDK's usual way (environment, profile, instance role). Path-style requests
    unless ``s3_virtual_addressing``. Raises ValueError naming what is wrong.
    """
    text = str(uri)
    parts = urlsplit(text)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme == "file" else text
        if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ValueError(f"lake URI {text!r}: a file URI names no host (file:///path)")
        if not path:
            raise ValueError(f"lake URI {text!r} names no directory")
        return None, Path(path)
    if parts.scheme not in ("s3", "s3a"):
        raise ValueError(f"lake URI {text!r}: the scheme must be file:// or s3://")
    if not parts.netloc:
        raise ValueError(f"lake URI {text!r} names no bucket (s3://bucket/prefix)")
    options: dict[str, Any] = {
        "region": s3_region,
        "access_key": s3_access_key,
        "secret_key": s3_secret_key,
        "session_token": s3_session_token,
        "force_virtual_addressing": s3_virtual_addressing,
    }
    if (s3_access_key is None) != (s3_secret_key is None):
        raise ValueError(
            "TRACEMQ_COLLECTOR_LAKE_S3_ACCESS_KEY and TRACEMQ_COLLECTOR_LAKE_S3_SECRET_KEY go "
            "together: set both or neither"
        )
    if s3_endpoint:
        endpoint = urlsplit(s3_endpoint)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise ValueError(f"S3 endpoint {s3_endpoint!r}: expected http(s)://host[:port]")
        options["scheme"] = endpoint.scheme
        options["endpoint_override"] = endpoint.netloc
    filesystem = pafs.S3FileSystem(**{k: v for k, v in options.items() if v is not None})
    root = PurePosixPath(parts.netloc, *[p for p in parts.path.split("/") if p])
    return filesystem, root


def _fsync_dir(path: Path) -> None:
    # A rename or unlink is durable only once the directory itself is synced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TraceLake:
    """Writes the trace store's events to Parquet, exactly once per event; compacts closed hours.

    Args:
        root: the lake directory (created if missing), or with ``filesystem`` the lake's root
            in it (``bucket/prefix`` for S3: see :func:`lake_filesystem`).
        store: the open trace store the events and the lake bookkeeping live in.
        segment_max_rows: most events per segment; a longer range is cut into several.
        compression: Parquet codec of the files written.
        filesystem: a pyarrow file system other than the local disk (S3).

    Methods are synchronous and serialised by a lock (they may be called from any thread).
    The protocol and the compaction rule: see the module docstring.
    """

    def __init__(
        self,
        root: PurePath | str,
        store: TraceStore,
        *,
        segment_max_rows: int = 200_000,
        compression: str = "zstd",
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        if segment_max_rows < 1:
            raise ValueError(f"segment_max_rows must be at least 1, got {segment_max_rows}")
        self.local = filesystem is None or isinstance(filesystem, pafs.LocalFileSystem)
        #: the lake's files are Paths on the local disk, PurePosixPaths in an object store
        self.root: PurePath = Path(root).absolute() if self.local else PurePosixPath(root)
        self.fs: pafs.FileSystem = pafs.LocalFileSystem() if self.local else filesystem
        self.store = store
        self.segment_max_rows = segment_max_rows
        self.compression = compression
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writing

    def flush(self, trace_topic: str, partition: int) -> list[PurePath]:
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

    def start_partition(self, trace_topic: str, partition: int) -> int | None:
        """Settle where the partition's lake continues, without writing it; return that
        offset (None: the store holds nothing of the partition).

        A partition with no lake progress gets the one :meth:`flush` would start from (the
        first stored event's offset, or the store's progress if it holds no event); an
        existing one is kept, and so are the events between it and the store's progress,
        for ingest to write from its buffers. A take-over backfill needs only this bound:
        :meth:`flush` would read every stored event of the partition back from the store.
        Pending segments of the partition are written again first, as :meth:`flush` does.
        """
        lake.check_trace_topic(trace_topic)
        key = (trace_topic, partition)
        with self._lock:
            self._redo_pending(s for s in self.store.pending_lake_segments() if s[:2] == key)
            done = self.store.lake_progress().get(key)
            if done is not None:
                return done
            store_next = self.store.progress().get(key)
            if store_next is None:
                return None
            first = self.store.first_event_offset(trace_topic, partition)
            start = store_next if first is None else min(first, store_next)
            self.store.set_lake_progress(trace_topic, partition, start)
            return start

    def write_decoded(
        self,
        trace_topic: str,
        partition: int,
        after: int | None,
        segments: list[tuple[int, int, dict[tuple[str, int], list[pa.RecordBatch]]]],
    ) -> list[PurePath] | None:
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
            written: list[PurePath] = []
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

    def flush_all(self) -> list[PurePath]:
        """:meth:`flush` every partition the store has progress for."""
        written: list[PurePath] = []
        for trace_topic, partition in sorted(self.store.progress()):
            written += self.flush(trace_topic, partition)
        return written

    def recover(self) -> list[PurePath]:
        """Repair the lake after a crash; call at start, before anything else writes to it.

        On a local lake, deletes temporary files older than :data:`TMP_MAX_AGE_S` (younger ones
        may be another collector's writes in progress). Rewrites every pending segment with
        exactly its recorded range. Superseded files are deleted by :meth:`compact`, per
        partition, by the partition's owner.
        """
        with self._lock:
            if self.local and Path(self.root).is_dir():
                old = time.time() - TMP_MAX_AGE_S
                for tmp in Path(self.root).glob(f"date=*/hour=*/{lake.TMP_PREFIX}*"):
                    try:
                        if tmp.stat().st_mtime < old:
                            tmp.unlink(missing_ok=True)
                    except FileNotFoundError:
                        pass
            return self._redo_pending(self.store.pending_lake_segments())

    def _redo_pending(self, segments: Iterable[tuple[str, int, int, int]]) -> list[PurePath]:
        written: list[PurePath] = []
        for trace_topic, partition, start, end in list(segments):
            written += self._segment(trace_topic, partition, start, end)
        return written

    def _segment(self, trace_topic: str, partition: int, start: int, end: int) -> list[PurePath]:
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

    def _write_atomic(self, table: pa.Table, path: PurePath) -> None:
        """Write ``path`` whole or not at all: an object store's PUT is atomic (the Parquet
        bytes are built in memory first, so a failed upload leaves no object); on a local disk,
        a temporary file, fsync, rename. Rows are written in :data:`FILE_SORT_KEYS` order, in
        row groups of :data:`ROW_GROUP_ROWS`."""
        if not self.local:
            buf = io.BytesIO()
            self._write_sorted(table, buf)
            with self.fs.open_output_stream(path.as_posix()) as out:
                out.write(buf.getbuffer())
            return
        path = Path(path)
        directory = path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            # New directory entries must be durable before the file they lead to matters.
            _fsync_dir(directory.parent)
            _fsync_dir(directory.parent.parent)
        tmp = directory / f"{lake.TMP_PREFIX}{uuid.uuid4().hex}-{path.name}"
        try:
            with open(tmp, "wb") as fh:
                self._write_sorted(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(directory)

    def _write_sorted(self, table: pa.Table, sink: Any) -> None:
        """``table`` as Parquet in :data:`FILE_SORT_KEYS` order, sorted one row group at a
        time: a sorted copy of the whole table (30 MB per 100 000 events) would sit beside
        the buffer being filled while ingest waits for this flush, at its peak of memory.
        The footer gets the rows' summary (:func:`tracemq.lake.summarize`; ~0.05 µs per row),
        which the Spark job's pre-flight reads instead of the rows."""
        order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in FILE_SORT_KEYS])
        summary = lake.summarize(table)
        meta = table.schema.metadata
        if meta and lake.SUMMARY_KEY in meta:  # (read from a file: not these rows' summary)
            table = table.replace_schema_metadata(
                {k: v for k, v in meta.items() if k != lake.SUMMARY_KEY}
            )
        with pq.ParquetWriter(sink, table.schema, compression=self.compression) as writer:
            if not len(order):
                writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            for start in range(0, len(order), ROW_GROUP_ROWS):
                group = table.take(order[start : start + ROW_GROUP_ROWS])
                writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
            if summary is not None:
                writer.add_key_value_metadata({lake.SUMMARY_KEY: summary})

    def _delete(self, paths: list[PurePath]) -> None:
        if not paths:
            return
        for path in paths:
            if self.local:
                Path(path).unlink(missing_ok=True)
            else:
                try:
                    self.fs.delete_file(path.as_posix())
                except FileNotFoundError:
                    pass  # another owner deleted it first
        if self.local:
            _fsync_dir(Path(paths[0]).parent)

    # ------------------------------------------------------------------ compaction

    def compact(
        self,
        closed_before_ms: int,
        owned: set[tuple[str, int]] | None = None,
        *,
        since_ms: int | None = None,
    ) -> int:
        """Merge, per trace partition, the files of every hour that ended at or before
        ``closed_before_ms``; only the partitions in ``owned`` (None: all, for a lake this
        store alone writes); with ``since_ms``, only hours that ended after it (in an object
        store every hour looked at costs requests, every round). Returns how many (hour,
        partition) merges were done.

        A partition's files of an hour (``part-`` or ``compacted-``, any collector's) become one
        ``compacted-`` file, each event once (rows in :data:`FILE_SORT_KEYS` order); the sources
        are deleted after it is durable, and so are files of the partition the rule says are
        superseded. Taken as sources: the live files ending at or before this store's lake
        progress of the partition (read before listing; so never a pending segment's). So the sources
        cover their whole offset range (below where this collector started, the previous
        owners' files were written before their Kafka commit; above, this collector's segments
        are contiguous), and a compacted file holds every event of its range and hour: the
        second rule of :func:`tracemq.lake.live_files` relies on it, which makes an old and a
        new owner compacting the same hour at once harmless (same sources: the same name and
        rows; different sources: the smaller range is superseded).
        """
        with self._lock:
            compacted = 0
            progress = self.store.lake_progress()
            for hour_dir in self._hour_dirs():
                hour_start = lake.hour_start_ms(hour_dir.parent.name, hour_dir.name)
                if hour_start is None or hour_start + lake.HOUR_MS > closed_before_ms:
                    continue
                if since_ms is not None and hour_start + lake.HOUR_MS <= since_ms:
                    continue
                live, superseded = self._live_files(hour_dir)
                by_partition: dict[tuple[str, int], list[PurePath]] = {}
                for path in live:
                    name = lake.parse_file_name(path.name)
                    if name is not None and name.topic is not None and name.partition is not None:
                        key = (name.topic, name.partition)
                        # A pending segment starts at the lake progress: its files are past it.
                        if name.end <= progress.get(key, -1):
                            by_partition.setdefault(key, []).append(path)
                mine = [p for p in superseded if owned is None or _partition(p) in owned]
                self._delete(mine)
                for key, sources in sorted(by_partition.items()):
                    if owned is not None and key not in owned:
                        continue
                    if len(sources) >= 2 and self._merge(hour_dir, key, sources):
                        compacted += 1
            return compacted

    def _merge(self, hour_dir: PurePath, key: tuple[str, int], sources: list[PurePath]) -> bool:
        tables = []
        for path in sources:
            try:
                table = pq.read_table(path.as_posix(), filesystem=self.fs)
            except OSError as exc:
                if not self._vanished(path, exc):
                    raise
                # another owner of the partition compacted it meanwhile: its compacted file
                # holds these rows; the next round merges what is left
                return False
            if not lake.is_current_version((table.schema.metadata or {}).get(lake.METADATA_KEY)):
                return False  # another schema version: not ours to rewrite
            tables.append(table.replace_schema_metadata(None))
        merged = pa.concat_tables(tables).sort_by([(k, "ascending") for k in SORT_KEYS])
        # Files of two owners of the partition may overlap (a late write of the old owner):
        # each event once, by its key (one partition here: offset and index decide).
        offsets = merged.column("trace_offset").to_numpy()
        indexes = merged.column("trace_index").to_numpy()
        keep = np.ones(len(offsets), dtype=np.bool_)
        keep[1:] = (offsets[1:] != offsets[:-1]) | (indexes[1:] != indexes[:-1])
        if not keep.all():
            merged = merged.filter(pa.array(keep))
            log.info(
                "compaction merged overlapping files of two owners",
                trace_topic=key[0],
                partition=key[1],
                hour_dir=hour_dir.as_posix(),
                duplicates=int(len(keep) - keep.sum()),
            )
        starts, ends, parts = [], [], 0
        for path in sources:
            start, end, count = _name_range(path)
            starts.append(start)
            ends.append(end)
            parts += count
        # Counting the original parts makes the name grow with every merge, so the new name
        # can never be one of its sources (which are deleted after it is written).
        name = lake.compacted_name(key[0], key[1], min(starts), max(ends), parts)
        if name in {p.name for p in sources}:
            raise RuntimeError(f"compaction of {hour_dir} would overwrite its source {name}")
        metadata = lake.file_metadata(compacted_from=[p.name for p in sources])
        self._write_atomic(
            merged.cast(lake.arrow_schema().with_metadata(metadata)), hour_dir / name
        )
        self._delete(sources)
        return True

    def _list(self, directory: PurePath) -> list[tuple[str, bool]]:
        """``(name, is directory)`` of the entries of ``directory`` ([] if it is missing)."""
        selector = pafs.FileSelector(directory.as_posix(), allow_not_found=True)
        return [
            (info.base_name, info.type == pafs.FileType.Directory)
            for info in self.fs.get_file_info(selector)
        ]

    def _live_files(self, hour_dir: PurePath) -> tuple[list[PurePath], list[PurePath]]:
        """``(live, superseded)`` collector files of one hour directory, by the compaction rule
        (:func:`tracemq.lake.live_files`). Only a ``compacted-`` file's footer is read: no other
        file of ours names any."""
        names = {}
        for name, is_dir in sorted(self._list(hour_dir)):
            parsed = lake.parse_file_name(name)
            if parsed is not None and not is_dir:
                path = hour_dir / name
                try:
                    names[path.as_posix()] = self._compacted_from(path) if parsed.compacted else []
                except OSError as exc:
                    if not self._vanished(path, exc):
                        raise
                    continue  # deleted since the listing: superseded by another's compaction
        live, superseded = lake.live_files(names)
        kind = Path if self.local else PurePosixPath
        return [kind(p) for p in live], [kind(p) for p in superseded]

    def _vanished(self, path: PurePath, exc: OSError) -> bool:
        """Whether a read of ``path`` failed because the file is gone. A local file system says
        FileNotFoundError; S3 says so for a HEAD but a GET of an object deleted between the
        listing and the read (a concurrent compaction) is a plain OSError
        (``RESOURCE_NOT_FOUND``), so the object is looked up again."""
        if isinstance(exc, FileNotFoundError):
            return True
        try:
            return self.fs.get_file_info(path.as_posix()).type == pafs.FileType.NotFound
        except OSError:
            return False

    def _compacted_from(self, path: PurePath) -> list[str]:
        schema = pq.read_schema(path.as_posix(), filesystem=self.fs)
        return lake.compacted_from((schema.metadata or {}).get(COMPACTED_FROM_KEY))

    def _hour_dirs(self) -> list[PurePath]:
        return sorted(
            self.root / date / hour
            for date, date_is_dir in self._list(self.root)
            if date_is_dir and lake.parse_date_dir(date) is not None
            for hour, hour_is_dir in self._list(self.root / date)
            if hour_is_dir and lake.parse_hour_dir(hour) is not None
        )

    # ------------------------------------------------------------------ reading

    def files(self) -> list[PurePath]:
        """The live data files of the lake (superseded and temporary files left out)."""
        return [path for hour_dir in self._hour_dirs() for path in self._live_files(hour_dir)[0]]

    def read_all(self) -> pa.Table:
        """The whole lake as one table: the lake columns plus ``date`` and ``hour``."""
        files = self.files()
        schema = lake.arrow_schema().append(pa.field("date", pa.string()))
        schema = schema.append(pa.field("hour", pa.int32()))
        if not files:
            return pa.Table.from_pylist([], schema=schema)
        dataset = ds.dataset(
            [p.as_posix() for p in files],
            schema=schema,
            format="parquet",
            partitioning=_PARTITIONING,
            partition_base_dir=self.root.as_posix(),
            filesystem=self.fs,
        )
        return dataset.to_table()


def _partition(path: PurePath) -> tuple[str, int] | None:
    name = lake.parse_file_name(path.name)
    if name is None or name.topic is None or name.partition is None:
        return None  # a legacy compacted file: no partition
    return (name.topic, name.partition)


def _name_range(path: PurePath) -> tuple[int, int, int]:
    """``(start, end, original part count)`` a data file's name states."""
    name = lake.parse_file_name(path.name)
    if name is None:  # _live_files let only collector names through
        raise ValueError(f"not a lake data file: {path}")
    return name.start, name.end, name.parts
