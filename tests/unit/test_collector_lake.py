"""Trace lake: real Parquet files in tmp_path; exactly once across crashes, layout, compaction."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tracemq import lake as lake_contract
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType, encode_many
from tracemq_collector.errors import CollectorError
from tracemq_collector.events import rows_from_record
from tracemq_collector.lake import (
    COMPACTED_FROM_KEY,
    FILE_SORT_KEYS,
    SORT_KEYS,
    TMP_MAX_AGE_S,
    TraceLake,
    use_memory_pool,
)
from tracemq_collector.store import TraceStore

TOPIC = "RMQ_SYS_TRACE_TOPIC"
HOUR = 3_600_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
INGEST = T0 + 30 * 86_400_000
LATER = T0 + 100 * HOUR  # every test hour has ended by then


def contexts(n: int, ts: int) -> list[TraceContext]:
    bean = TraceBean(
        topic="orders",
        msg_id=f"0A00000100640000000A{n:012X}",
        tags="t",
        keys=f"order-{n}",
        store_host="10.0.0.9:10911",
        msg_type=MessageType.Normal_Msg,
    )
    return [
        TraceContext(TraceType.Pub, timestamp=ts, trace_beans=[bean]),
        TraceContext(TraceType.SubBefore, timestamp=ts + 1, request_id=f"r{n}", trace_beans=[bean]),
    ]


class Ingest:
    """Writes trace messages to the store the way the collector's ingest loop does."""

    def __init__(self, store: TraceStore, partition: int = 0) -> None:
        self.store = store
        self.partition = partition
        self.offset = 0
        self.batches: list[tuple[list[dict[str, Any]], list[dict[str, Any]], dict[Any, int]]] = []

    def messages(self, *timestamps: int) -> None:
        """One trace message (two events) per timestamp, written as one batch."""
        rows: list[dict[str, Any]] = []
        quarantine: list[dict[str, Any]] = []
        for ts in timestamps:
            value = encode_many(contexts(self.offset, ts)).data.encode()
            r, q = rows_from_record(TOPIC, self.partition, self.offset, value, INGEST)
            rows += r
            quarantine += q
            self.offset += 1
        self.write(rows, quarantine)

    def garbage(self, count: int) -> None:
        quarantine: list[dict[str, Any]] = []
        for _ in range(count):
            quarantine += rows_from_record(TOPIC, self.partition, self.offset, b"\xff\x02", INGEST)[
                1
            ]
            self.offset += 1
        self.write([], quarantine)

    def write(self, rows: list[dict[str, Any]], quarantine: list[dict[str, Any]]) -> None:
        batch = (rows, quarantine, {(TOPIC, self.partition): self.offset})
        self.batches.append(batch)
        self.store.write_batch(*batch)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    with TraceStore(tmp_path / "traces.db") as s:
        yield s


@pytest.fixture
def lake(tmp_path: Path, store: TraceStore) -> TraceLake:
    return TraceLake(tmp_path / "lake", store)


def coordinates(lake: TraceLake) -> Counter[tuple[str, int, int, int]]:
    table = lake.read_all()
    return Counter(
        zip(
            table["trace_topic"].to_pylist(),
            table["trace_partition"].to_pylist(),
            table["trace_offset"].to_pylist(),
            table["trace_index"].to_pylist(),
            strict=True,
        )
    )


def stored_rows(store: TraceStore) -> list[dict[str, Any]]:
    return store.events_in_range(TOPIC, 0, 0, 1 << 40)


def lake_rows(lake: TraceLake) -> list[dict[str, Any]]:
    rows = lake.read_all().to_pylist()
    return sorted(rows, key=lambda r: tuple(r[k] for k in SORT_KEYS))


# ------------------------------------------------------------------------------ flushing


def test_flush_writes_every_event_once_into_its_date_and_hour(
    store: TraceStore, lake: TraceLake
) -> None:
    ingest = Ingest(store)
    ingest.messages(T0 + 5, T0 + HOUR + 5, T0 + 25 * HOUR + 5)
    files = lake.flush(TOPIC, 0)
    relative = sorted(str(p.relative_to(lake.root)) for p in files)
    name = f"part-{TOPIC}-00000-{0:020d}-{3:020d}.parquet"
    assert relative == [
        f"date=2024-01-01/hour=00/{name}",
        f"date=2024-01-01/hour=01/{name}",
        f"date=2024-01-02/hour=01/{name}",
    ]
    assert lake_rows(lake) == stored_rows(store)
    assert store.lake_progress() == {(TOPIC, 0): 3}
    assert store.pending_lake_segments() == []
    assert lake.flush(TOPIC, 0) == []  # nothing new


def test_files_carry_the_lake_schema_and_its_version_but_no_partition_columns(
    store: TraceStore, lake: TraceLake
) -> None:
    Ingest(store).messages(T0)
    [path] = lake.flush(TOPIC, 0)
    schema = pq.read_schema(path)
    assert schema.names == list(lake_contract.COLUMN_NAMES)
    assert schema.equals(lake_contract.arrow_schema())
    assert schema.metadata[lake_contract.METADATA_KEY] == str(lake_contract.SCHEMA_VERSION).encode()
    assert not any(p.name.startswith(".") for p in path.parent.iterdir())


def recount(path: Path) -> lake_contract.FileSummary:
    """A lake file's rows counted here, as its footer summary should say them."""
    table = pq.read_table(path, partitioning=None)
    columns = lake_contract.summary.GROUP_COLUMNS
    counts = Counter(zip(*(table[c].to_pylist() for c in columns), strict=True))
    ts = table["timestamp"].to_pylist()
    groups = tuple(sorted(((*k, n) for k, n in counts.items()), key=repr))
    return lake_contract.FileSummary(len(ts), min(ts, default=None), max(ts, default=None), groups)


def footer_summary(path: Path) -> lake_contract.FileSummary:
    value = pq.read_metadata(path).metadata[lake_contract.SUMMARY_KEY]
    s = lake_contract.parse_summary(value)
    return lake_contract.FileSummary(s.rows, s.min_ts, s.max_ts, tuple(sorted(s.groups, key=repr)))


def test_every_file_carries_the_summary_of_its_rows(store: TraceStore, lake: TraceLake) -> None:
    """The footer summary the Spark job's pre-flight reads instead of the rows
    (tracemq.lake.summary): for parts and for a compacted file, whose sources' summaries
    are not its own."""
    ingest = Ingest(store)
    part_rows: Counter[str] = Counter()
    for i in range(3):
        ingest.messages(T0 + i, T0 + 7 + i, T0 + HOUR + i)
        for path in lake.flush(TOPIC, 0):
            assert footer_summary(path) == recount(path)
            part_rows[path.parent.name] += footer_summary(path).rows
    assert part_rows["hour=00"] > part_rows["hour=01"] > 0
    assert lake.compact(LATER) == 2
    for path in lake.files():
        assert path.name.startswith("compacted-")
        assert footer_summary(path) == recount(path)
        assert footer_summary(path).rows == part_rows[path.parent.name]


def test_flush_continues_where_it_stopped(store: TraceStore, lake: TraceLake) -> None:
    ingest = Ingest(store)
    ingest.messages(T0, T0 + 1)
    lake.flush(TOPIC, 0)
    ingest.messages(T0 + 2)
    [path] = lake.flush(TOPIC, 0)
    assert path.name == f"part-{TOPIC}-00000-{2:020d}-{3:020d}.parquet"
    assert sum(coordinates(lake).values()) == 6
    assert set(coordinates(lake).values()) == {1}


def test_long_ranges_are_cut_into_segments_between_messages(
    store: TraceStore, tmp_path: Path
) -> None:
    lake = TraceLake(tmp_path / "lake", store, segment_max_rows=5)
    Ingest(store).messages(*(T0 + i for i in range(6)))  # 12 events, 2 per message
    files = lake.flush(TOPIC, 0)
    ranges = [tuple(int(x) for x in p.stem.split("-")[-2:]) for p in files]
    assert ranges == [(0, 2), (2, 4), (4, 6)]
    assert all(pq.read_metadata(p).num_rows <= 5 for p in files)
    assert lake_rows(lake) == stored_rows(store)


def test_a_range_with_only_quarantined_records_still_moves_the_lake(
    store: TraceStore, lake: TraceLake
) -> None:
    ingest = Ingest(store)
    ingest.messages(T0)
    lake.flush(TOPIC, 0)
    ingest.garbage(3)
    assert lake.flush(TOPIC, 0) == []
    assert store.lake_progress() == {(TOPIC, 0): 4}


def test_replaying_a_store_batch_puts_no_duplicate_in_the_lake(
    store: TraceStore, lake: TraceLake
) -> None:
    ingest = Ingest(store)
    ingest.messages(T0, T0 + HOUR)
    lake.flush(TOPIC, 0)
    ingest.messages(T0 + 2)
    for batch in ingest.batches:  # the ingest loop restarted from an older offset
        store.write_batch(*batch)
    lake.flush(TOPIC, 0)
    counts = coordinates(lake)
    assert sum(counts.values()) == 6 and set(counts.values()) == {1}


def test_starting_a_partition_settles_its_lake_progress_without_writing(
    store: TraceStore, lake: TraceLake
) -> None:
    """What a take-over backfill needs: the lake's start, not a read-back of the store."""
    assert lake.start_partition(TOPIC, 0) is None  # nothing stored: nothing to settle
    ingest = Ingest(store)
    ingest.garbage(2)  # offsets 0-1 hold no event
    ingest.messages(T0, T0 + 1)  # offsets 2-3
    assert lake.start_partition(TOPIC, 0) == 2  # where flush would start: the first event
    assert store.lake_progress() == {(TOPIC, 0): 2}
    assert lake.files() == []
    ingest.messages(T0 + 2)
    assert lake.start_partition(TOPIC, 0) == 2  # set: kept, the rest is ingest's to write
    lake.flush(TOPIC, 0)
    assert lake_rows(lake) == stored_rows(store)
    assert store.lake_progress() == {(TOPIC, 0): 5}

    only_garbage = Ingest(store, partition=1)
    only_garbage.garbage(3)
    assert lake.start_partition(TOPIC, 1) == 3  # no event: the store's progress


def test_flush_all_covers_every_partition(store: TraceStore, lake: TraceLake) -> None:
    Ingest(store, partition=0).messages(T0)
    Ingest(store, partition=3).messages(T0 + 1)
    files = lake.flush_all()
    assert sorted(p.name.split("-")[-3] for p in files) == ["00000", "00003"]
    assert store.lake_progress() == {(TOPIC, 0): 1, (TOPIC, 3): 1}


def test_a_trace_topic_that_cannot_name_a_file_is_refused(lake: TraceLake) -> None:
    for bad in ("", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="cannot name a lake file"):
            lake.flush(bad, 0)


# ---------------------------------------------------------------------- crash recovery


class Crash(Exception):
    pass


def crash_before_finish(monkeypatch: pytest.MonkeyPatch, store: TraceStore) -> None:
    def finish(*args: object) -> None:
        raise Crash

    monkeypatch.setattr(store, "finish_lake_segment", finish)


def test_a_crash_after_writing_files_is_recovered_exactly_once(
    store: TraceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest = Ingest(store)
    ingest.messages(T0, T0 + HOUR, T0 + 2 * HOUR)
    lake = TraceLake(tmp_path / "lake", store)
    with monkeypatch.context() as patch:
        crash_before_finish(patch, store)
        with pytest.raises(Crash):
            lake.flush(TOPIC, 0)
    written = sorted(lake.files())
    assert len(written) == 3  # the files exist, the lake progress does not say so
    assert store.lake_progress() == {}
    assert store.pending_lake_segments() == [(TOPIC, 0, 0, 3)]

    ingest.messages(T0 + 10)  # the store moved on while the collector was down
    restarted = TraceLake(tmp_path / "lake", store)
    redone = restarted.recover()
    assert sorted(redone) == written  # the same names: overwritten, not added
    assert store.pending_lake_segments() == []
    assert store.lake_progress() == {(TOPIC, 0): 3}
    restarted.flush(TOPIC, 0)
    counts = coordinates(restarted)
    assert sum(counts.values()) == 8 and set(counts.values()) == {1}
    assert lake_rows(restarted) == stored_rows(store)


def test_flush_redoes_its_partitions_pending_segment_first(
    store: TraceStore, lake: TraceLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest = Ingest(store)
    ingest.messages(T0, T0 + 1)
    with monkeypatch.context() as patch:
        crash_before_finish(patch, store)
        with pytest.raises(Crash):
            lake.flush(TOPIC, 0)
    ingest.messages(T0 + 2)
    files = lake.flush(TOPIC, 0)  # no recover() call
    assert [p.name for p in files] == [
        f"part-{TOPIC}-00000-{0:020d}-{2:020d}.parquet",
        f"part-{TOPIC}-00000-{2:020d}-{3:020d}.parquet",
    ]
    counts = coordinates(lake)
    assert sum(counts.values()) == 6 and set(counts.values()) == {1}


def test_a_crash_while_writing_a_file_leaves_only_a_hidden_temporary(
    store: TraceStore, lake: TraceLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    Ingest(store).messages(T0)

    def torn_write(self: TraceLake, table: object, where: Any) -> None:
        where.write(b"PAR1 torn")
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(TraceLake, "_write_sorted", torn_write)
        with pytest.raises(Crash):
            lake.flush(TOPIC, 0)
    hour_dir = lake.root / "date=2024-01-01" / "hour=00"
    assert list(hour_dir.iterdir()) == []  # the temporary was removed on the way out
    (hour_dir / ".tmp-left-by-a-kill-9.parquet").write_bytes(b"PAR1 torn")
    old = time.time() - TMP_MAX_AGE_S - 1
    os.utime(hour_dir / ".tmp-left-by-a-kill-9.parquet", (old, old))
    # a young temporary may be another collector's write in progress: kept
    (hour_dir / ".tmp-in-progress.parquet").write_bytes(b"PAR1")
    assert lake.files() == []
    lake.recover()
    (hour_dir / ".tmp-in-progress.parquet").unlink()
    assert [p.name for p in hour_dir.iterdir()] == [f"part-{TOPIC}-00000-{0:020d}-{1:020d}.parquet"]
    assert len(lake.read_all()) == 2


# -------------------------------------------------------------------------- compaction


def test_compaction_leaves_one_file_per_closed_hour_with_the_same_rows(
    store: TraceStore, lake: TraceLake
) -> None:
    ingest = Ingest(store)
    for i in range(3):  # three flushes: three part files in hours 0 and 1
        ingest.messages(T0 + i, T0 + HOUR + i)
        lake.flush(TOPIC, 0)
    ingest.messages(T0 + 2 * HOUR, T0 + 2 * HOUR + 1)  # hour 2, still open at the cutoff
    lake.flush(TOPIC, 0)
    ingest.messages(T0 + 2 * HOUR + 2)
    lake.flush(TOPIC, 0)
    before = lake_rows(lake)

    assert lake.compact(T0 + 2 * HOUR + 10) == 2
    assert lake_rows(lake) == before
    by_hour = Counter(p.parent.name for p in lake.files())
    assert by_hour == {"hour=00": 1, "hour=01": 1, "hour=02": 2}
    compacted = lake.root / "date=2024-01-01" / "hour=00"
    [path] = list(compacted.iterdir())
    assert path.name == f"compacted-{TOPIC}-00000-{0:020d}-{6:020d}-00003.parquet"
    table = pq.read_table(path)
    # sorted by msgId (what look-ups prune row groups by), each event once
    keys = list(zip(*(table[k].to_pylist() for k in FILE_SORT_KEYS), strict=True))
    assert keys == sorted(keys)
    coords = list(zip(*(table[k].to_pylist() for k in SORT_KEYS), strict=True))
    assert len(set(coords)) == len(coords)
    metadata = pq.read_schema(path).metadata
    assert metadata[lake_contract.METADATA_KEY] == str(lake_contract.SCHEMA_VERSION).encode()
    assert len(json.loads(metadata[COMPACTED_FROM_KEY])) == 3
    assert lake.compact(T0 + 2 * HOUR + 10) == 0  # nothing left to merge


def test_a_late_event_is_merged_into_the_compacted_hour(store: TraceStore, lake: TraceLake) -> None:
    ingest = Ingest(store)
    ingest.messages(T0)
    lake.flush(TOPIC, 0)
    ingest.messages(T0 + 1)
    lake.flush(TOPIC, 0)
    lake.compact(LATER)
    ingest.messages(T0 + 2)  # arrives after the hour was compacted
    lake.flush(TOPIC, 0)
    assert lake.compact(LATER) == 1
    [path] = lake.files()
    assert path.name == f"compacted-{TOPIC}-00000-{0:020d}-{3:020d}-00003.parquet"
    assert lake_rows(lake) == stored_rows(store)


def test_a_crash_between_compacted_write_and_deletes_never_doubles_rows(
    store: TraceStore, lake: TraceLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest = Ingest(store)
    for i in range(3):
        ingest.messages(T0 + i)
        lake.flush(TOPIC, 0)
    before = lake_rows(lake)
    parts = sorted(lake.files())

    def crash(self: Path, missing_ok: bool = False) -> None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", crash)
        with pytest.raises(Crash):
            lake.compact(LATER)
    hour_dir = parts[0].parent
    on_disk = sorted(p.name for p in hour_dir.iterdir())
    assert len(on_disk) == 4  # the three parts and the compacted file
    # A reader applying the rule sees every row once.
    assert [p.name for p in lake.files()] == [
        f"compacted-{TOPIC}-00000-{0:020d}-{3:020d}-00003.parquet"
    ]
    assert lake_rows(lake) == before

    assert lake.compact(LATER) == 0  # the rerun only finishes the deletes
    assert [p.name for p in hour_dir.iterdir()] == [
        f"compacted-{TOPIC}-00000-{0:020d}-{3:020d}-00003.parquet"
    ]
    assert lake_rows(lake) == before


def test_the_next_compaction_finishes_an_interrupted_one(
    store: TraceStore, lake: TraceLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest = Ingest(store)
    for i in range(2):
        ingest.messages(T0 + i)
        lake.flush(TOPIC, 0)

    def crash(self: Path, missing_ok: bool = False) -> None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", crash)
        with pytest.raises(Crash):
            lake.compact(LATER)
    compacted = f"compacted-{TOPIC}-00000-{0:020d}-{2:020d}-00002.parquet"
    assert [p.name for p in lake.files()] == [compacted]  # readers skip the leftovers
    lake.recover()
    assert lake.compact(LATER) == 0  # nothing left to merge; the leftovers deleted
    hour_dir = lake.root / "date=2024-01-01" / "hour=00"
    assert [p.name for p in hour_dir.iterdir()] == [compacted]


def test_compaction_leaves_the_files_of_a_pending_segment_alone(
    store: TraceStore, lake: TraceLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest = Ingest(store)
    ingest.messages(T0)
    lake.flush(TOPIC, 0)
    ingest.messages(T0 + 1)
    lake.flush(TOPIC, 0)
    ingest.messages(T0 + 2)
    with monkeypatch.context() as patch:
        crash_before_finish(patch, store)
        with pytest.raises(Crash):
            lake.flush(TOPIC, 0)
    pending_name = f"part-{TOPIC}-00000-{2:020d}-{3:020d}.parquet"

    assert lake.compact(LATER) == 1
    names = sorted(p.name for p in lake.files())
    assert names == [f"compacted-{TOPIC}-00000-{0:020d}-{2:020d}-00002.parquet", pending_name]
    lake.recover()  # rewrites the pending part; the compacted file never had its rows
    counts = coordinates(lake)
    assert sum(counts.values()) == 6 and set(counts.values()) == {1}
    assert lake.compact(LATER) == 1
    assert len(lake.files()) == 1
    assert lake_rows(lake) == stored_rows(store)


def test_an_empty_lake_reads_as_an_empty_table(lake: TraceLake) -> None:
    table = lake.read_all()
    assert table.num_rows == 0
    assert table.schema.names == [*lake_contract.COLUMN_NAMES, "date", "hour"]
    assert lake.files() == [] and lake.recover() == [] and lake.compact(LATER) == 0


# ------------------------------------------------------ lake files from ingest's batches

from tracemq_collector.events import decode_chunk  # noqa: E402


def decoded_segments(values: list[bytes], first: int = 0) -> Any:
    chunk = decode_chunk([(TOPIC, 0, [(first + i, v, None) for i, v in enumerate(values)])], INGEST)
    part = chunk.partitions[(TOPIC, 0)]
    return chunk, (part.first_offset, part.end_offset, {k: [v] for k, v in part.lake.items()})


def test_files_written_from_ingest_batches_equal_the_files_read_from_the_store(
    tmp_path: Path,
) -> None:
    values = [encode_many(contexts(n, T0 + (n % 3) * HOUR)).data.encode() for n in range(9)]
    with TraceStore(tmp_path / "a.db") as a, TraceStore(tmp_path / "b.db") as b:
        chunk, segment = decoded_segments(values)
        for s in (a, b):
            assert s.write_rows(chunk.store)[0] == 18
        from_batches = TraceLake(tmp_path / "lake-a", a)
        from_store = TraceLake(tmp_path / "lake-b", b)
        files = from_batches.write_decoded(TOPIC, 0, None, [segment])
        assert files is not None and len(files) == 3
        assert sorted(p.name for p in files) == sorted(p.name for p in from_store.flush(TOPIC, 0))
        assert lake_rows(from_batches) == lake_rows(from_store) == stored_rows(a)
        assert a.lake_progress() == b.lake_progress() == {(TOPIC, 0): 9}
        assert a.pending_lake_segments() == []
        # Recovery of that segment rewrites the very same files from the store.
        a.begin_lake_segment(TOPIC, 0, 0, 9)
        assert sorted(from_batches.recover()) == sorted(files)
        assert lake_rows(from_batches) == stored_rows(a)


def test_ingest_batches_are_refused_when_the_lake_is_elsewhere(store: TraceStore) -> None:
    ingest = Ingest(store)
    ingest.messages(T0, T0 + 1)  # offsets 0, 1 stored, not in the lake
    values = [encode_many(contexts(n, T0)).data.encode() for n in (2, 3)]
    chunk, segment = decoded_segments(values, first=2)
    store.write_rows(chunk.store)
    lake = TraceLake(store.path.parent / "lake", store)
    # The batches start after offset 2, the lake at nothing: it must read the store.
    assert lake.write_decoded(TOPIC, 0, 2, [segment]) is None
    assert lake.files() == []
    lake.flush(TOPIC, 0)
    counts = coordinates(lake)
    assert sum(counts.values()) == 8 and set(counts.values()) == {1}


def test_compaction_merges_only_the_partitions_it_is_given(
    store: TraceStore, lake: TraceLake
) -> None:
    """A collector sharing a lake compacts only the trace partitions it owns, one compacted
    file per partition and hour, named by the partition and its range."""
    ingests = [Ingest(store, partition=p) for p in (0, 1)]
    for _ in range(2):
        for ingest in ingests:
            ingest.messages(T0)
        lake.flush_all()
    before = lake_rows(lake)
    assert lake.compact(LATER, {(TOPIC, 0)}) == 1
    names = sorted(p.name for p in lake.files())
    assert names == [
        f"compacted-{TOPIC}-00000-{0:020d}-{2:020d}-00002.parquet",
        f"part-{TOPIC}-00001-{0:020d}-{1:020d}.parquet",
        f"part-{TOPIC}-00001-{1:020d}-{2:020d}.parquet",
    ]
    assert lake.compact(LATER, set()) == 0  # owning nothing: touches nothing
    assert lake.compact(LATER, {(TOPIC, 1)}, since_ms=T0 + HOUR) == 0  # hour 00 is too old
    assert lake.compact(LATER, {(TOPIC, 1)}) == 1
    assert lake_rows(lake) == before


def test_a_source_deleted_by_another_owner_mid_compaction_is_left_to_the_next_round(
    store: TraceStore, lake: TraceLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On S3 a GET of an object deleted between the listing and the read is a plain OSError
    (``RESOURCE_NOT_FOUND``), not FileNotFoundError: the compaction thread must not die on it."""
    import tracemq_collector.lake as lake_module

    ingest = Ingest(store)
    for i in range(2):
        ingest.messages(T0 + i)
        lake.flush(TOPIC, 0)
    real_read = lake_module.pq.read_table
    calls = 0

    def read_after_another_owner_deleted(path: str, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            os.unlink(path)
            raise OSError("AWS Error RESOURCE_NOT_FOUND during GetObject operation")
        return real_read(path, **kw)

    monkeypatch.setattr(lake_module.pq, "read_table", read_after_another_owner_deleted)
    assert lake.compact(T0 + 2 * HOUR) == 0  # nothing merged, nothing raised
    monkeypatch.setattr(lake_module.pq, "read_table", real_read)

    def read_failing(path: str, **kw: Any) -> Any:
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation")

    ingest.messages(T0 + 3)
    lake.flush(TOPIC, 0)
    monkeypatch.setattr(lake_module.pq, "read_table", read_failing)
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):  # an object still there: raised
        lake.compact(T0 + 2 * HOUR)


@pytest.mark.parametrize("name", ["system", "mimalloc", "jemalloc"])
def test_the_collector_picks_arrows_allocator(name: str) -> None:
    import pyarrow as pa

    before = pa.default_memory_pool()
    try:
        try:
            use_memory_pool(name)
        except CollectorError as exc:  # a pyarrow build without it: the error names the setting
            assert "TRACEMQ_COLLECTOR_ARROW_MEMORY_POOL" in str(exc) and name in str(exc)
            return
        assert pa.default_memory_pool().backend_name == name
        assert pa.array([1, 2, 3]).sum().as_py() == 6  # the pool allocates
    finally:
        pa.set_memory_pool(before)


def test_an_unknown_allocator_is_named() -> None:
    with pytest.raises(CollectorError, match="TRACEMQ_COLLECTOR_ARROW_MEMORY_POOL.*'tcmalloc'"):
        use_memory_pool("tcmalloc")
