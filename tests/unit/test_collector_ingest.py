"""Collector ingest helpers: fetches cut into chunks, buffered chunks cut into lake segments."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from tracemq_collector.events import decode_chunk
from tracemq_collector.ingest import CHUNK_BYTES, Ingestor, _at_end, _chunks, _segments
from tracemq_collector.lake import TraceLake
from tracemq_collector.store import TraceStore


@dataclass
class Rec:
    offset: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = (("BORN_HOST", b"10.0.0.7"),)


def test_a_fetch_is_cut_into_chunks_in_order_with_born_hosts() -> None:
    big = b"x" * (CHUNK_BYTES // 2)
    data = {
        TopicPartition("t", 0): [Rec(o, big) for o in range(5)],
        TopicPartition("t", 1): [Rec(7, None, ()), Rec(8, b"y")],
    }
    chunks = _chunks(data)  # type: ignore[arg-type]
    flat = [(t, p, o) for chunk in chunks for t, p, recs in chunk for o, *_ in recs]
    assert flat == [("t", 0, o) for o in range(5)] + [("t", 1, 7), ("t", 1, 8)]
    assert len(chunks) == 3
    assert all(sum(len(v or b"") for _, _, rs in c for _, v, *_ in rs) <= CHUNK_BYTES + len(big)
               for c in chunks)  # fmt: skip
    assert chunks[0][0][2][0] == (0, big, "10.0.0.7", None, None)
    assert chunks[-1][-1][2] == [(7, None, None, None, None), (8, b"y", "10.0.0.7", None, None)]
    assert _chunks({}) == []


def test_the_idempotency_key_is_taken_from_the_headers_and_bounded() -> None:
    recs = [
        Rec(0, b"a", (("IDEMPOTENCY_KEY", b"K1"), ("BORN_HOST", b"10.0.0.7"))),
        Rec(1, b"b", (("IDEMPOTENCY_KEY", b"\xff\xfe"),)),  # not UTF-8: no key, kept
        Rec(2, b"c", (("IDEMPOTENCY_KEY", b"x" * 129),)),  # too long: no key
        Rec(3, b"d", (("IDEMPOTENCY_KEY", b""),)),
    ]
    (chunk,) = _chunks({TopicPartition("t", 0): recs})  # type: ignore[dict-item]
    assert [r[2:4] for r in chunk[0][2]] == [
        ("10.0.0.7", "K1"),
        (None, None),
        (None, None),
        (None, None),
    ]


def test_the_client_id_is_taken_from_the_headers_and_bounded() -> None:
    recs = [
        Rec(0, b"a", (("CLIENT_ID", b"10.0.0.7@4242#2"), ("BORN_HOST", b"10.0.0.7"))),
        Rec(1, b"b", (("CLIENT_ID", b"\xff\xfe"),)),  # not UTF-8: no client id, kept
        Rec(2, b"c", (("CLIENT_ID", b"x" * 257),)),  # too long
        Rec(3, b"d", (("CLIENT_ID", b""),)),
    ]
    (chunk,) = _chunks({TopicPartition("t", 0): recs})  # type: ignore[dict-item]
    assert [r[4] for r in chunk[0][2]] == ["10.0.0.7@4242#2", None, None, None]


def test_buffered_chunks_become_segments_of_bounded_size() -> None:
    entries = [(0, 10, 40, {("d", 0): ["a"]}), (10, 12, 40, {("d", 1): ["b"]}),
               (12, 20, 40, {("d", 0): ["c"]}), (20, 21, 500, {("d", 0): ["e"]})]  # fmt: skip
    assert _segments(entries, 100) == [
        (0, 12, {("d", 0): ["a"], ("d", 1): ["b"]}),
        (12, 20, {("d", 0): ["c"]}),
        (20, 21, {("d", 0): ["e"]}),  # one chunk larger than the limit still goes whole
    ]
    assert _segments(entries, 10_000) == [(0, 21, {("d", 0): ["a", "c", "e"], ("d", 1): ["b"]})]


async def test_a_reset_log_continues_the_store_offsets_instead_of_reusing_them() -> None:
    """The restarted (in-memory) trace cluster begins again at 0; the store dedupes by offset,
    so Kafka offsets of the new log map above everything stored: base = old position - 0."""
    from tracemq.offset_reset import OffsetReset, ResetReason
    from tracemq_collector.ingest import _ClusterIngest

    calls: list[Any] = []

    class Store:
        def set_offset_base(self, topic: str, partition: int, base: int) -> None:
            calls.append(("base", topic, partition, base))

    class Ing:
        store = Store()

        async def drain(self) -> None:
            calls.append("drain")

        async def run(self, fn: Any, *args: Any) -> Any:
            return fn(*args)

        async def record_reset(self, reset: OffsetReset) -> None:
            calls.append(("recorded", reset.position))

    c = _ClusterIngest.__new__(_ClusterIngest)
    c.ingestor, c.bases = Ing(), {("t", 1): 100}  # type: ignore[assignment]
    tp = TopicPartition("t", 1)
    await c._on_reset(tp, OffsetReset("t", 1, 578, 0, 0, 532, ResetReason.PAST_END, 0))
    assert calls == ["drain", ("base", "t", 1, 678), ("recorded", 578)]
    out = c._store_offsets(
        {tp: [Rec(0, b"a"), Rec(5, b"b")], TopicPartition("t", 0): [Rec(3, b"c")]}
    )  # type: ignore[dict-item]
    assert [r.offset for r in out[tp]] == [678, 683]
    assert [r.offset for r in out[TopicPartition("t", 0)]] == [3]
    # a reset forward (retention) leaves the base: store offsets jump, never go back
    await c._on_reset(tp, OffsetReset("t", 1, 5, 40, 40, 90, ResetReason.BEFORE_START, 0))
    assert c.bases[("t", 1)] == 678


async def test_lake_buffers_written_after_a_backfill_flush_are_not_read_back_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill flushes the lake from the store when it takes a partition over, while ingest
    keeps buffering: the buffer's chunks past the lake's progress are still written from the
    buffer (not read back from the store), and every event is in the lake exactly once."""
    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {}
    ing.settings = SimpleNamespace(collector_lake_segment_rows=200_000)
    ing.events_stored = 0
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    try:
        offset, total = 0, 0
        for n in range(4):  # four stored chunks of three trace messages, buffered for the lake
            recs = []
            for _ in range(3):
                # two messages of five traces each, across an hour boundary
                ts = 1_700_002_799_990 + offset * 3
                value = "".join(
                    f"SubAfter\x01req{offset}-{i}\x01MSG{offset}\x0112\x01true\x01k\x010"
                    f"\x01{ts + i}\x01CG\x02"
                    for i in range(5)
                )
                recs.append((offset, value.encode(), "10.0.0.7"))
                offset += 1
                total += 5
            decoded = decode_chunk([(topic, 0, recs)], 1_700_000_000_000)
            new, before, _ = store.write_rows(decoded.store)
            ing._stored(decoded, new, before)
            if n == 1:
                assert lake.flush(topic, 0)  # the backfill's flush: the first two chunks

        def no_store_reads(*args: object) -> None:
            raise AssertionError("the buffered chunks were read back from the store")

        monkeypatch.setattr(store, "events_in_range", no_store_reads)
        files = await ing._flush_one(TopicPartition(topic, 0))
        assert files
        assert store.lake_progress() == {(topic, 0): offset}
        table = lake.read_all()
        offsets, indexes = table["trace_offset"].to_pylist(), table["trace_index"].to_pylist()
        coords = set(zip(offsets, indexes, strict=True))
        assert table.num_rows == len(coords) == total
    finally:
        ing._lake_thread.shutdown(wait=True)
        store.close()


async def test_a_partition_start_settled_during_the_first_flush_does_not_read_the_store_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take-over's start_partition (the backfill's thread) sets the lake's progress of a new
    partition between ingest's read of it and its write: the buffer is written anyway, from
    memory, not read back from the store."""
    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {}
    ing.settings = SimpleNamespace(collector_lake_segment_rows=200_000)
    ing.events_stored = 0
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    try:
        for n in range(2):
            value = "".join(
                f"SubAfter\x01req{n}-{i}\x01MSG{n}\x0112\x01true\x01k\x010"
                f"\x01{1_700_002_000_000 + i}\x01CG\x02"
                for i in range(5)
            )
            decoded = decode_chunk([(topic, 0, [(n, value.encode(), "10.0.0.7")])], 1)
            new, before, _ = store.write_rows(decoded.store)
            ing._stored(decoded, new, before)
        assert store.lake_progress() == {}
        write_decoded = lake.write_decoded
        settled: list[int | None] = []

        def racing_write(*args: Any) -> Any:
            if not settled:  # the backfill thread gets there first, once
                settled.append(lake.start_partition(topic, 0))
            return write_decoded(*args)

        def no_store_reads(*args: object) -> None:
            raise AssertionError("the buffered chunks were read back from the store")

        monkeypatch.setattr(lake, "write_decoded", racing_write)
        monkeypatch.setattr(store, "events_in_range", no_store_reads)
        files = await ing._flush_one(TopicPartition(topic, 0))
        assert settled == [0] and files
        assert store.lake_progress() == {(topic, 0): 2}
        assert lake.read_all().num_rows == 10
    finally:
        ing._lake_thread.shutdown(wait=True)
        store.close()


async def test_a_flush_that_reads_the_store_back_is_counted_with_its_reason(
    tmp_path: Path,
) -> None:
    """The lake's progress inside a buffered chunk (not on a boundary): the flush reads the
    partition's stored range back, and tracemq_collector_lake_store_reads_total counts it as
    not_aligned; a flush with nothing buffered counts as unbuffered."""
    from prometheus_client import REGISTRY

    def reads(reason: str) -> float:
        value = REGISTRY.get_sample_value(
            "tracemq_collector_lake_store_reads_total", {"reason": reason}
        )
        return value or 0.0

    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {}
    ing.settings = SimpleNamespace(collector_lake_segment_rows=200_000)
    ing.events_stored = 0
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    before = {r: reads(r) for r in ("not_aligned", "unbuffered", "refused", "moving")}
    try:
        recs = [
            (
                n,
                f"SubAfter\x01r{n}\x01MSG{n}\x0112\x01true\x01k\x010\x01{1_700_002_000_000 + n}\x01CG\x02".encode(),
                "h",
            )
            for n in range(3)
        ]
        decoded = decode_chunk([(topic, 0, recs)], 1)  # one chunk: offsets 0..2
        new, prior, _ = store.write_rows(decoded.store)
        ing._stored(decoded, new, prior)
        store.set_lake_progress(topic, 0, 1)  # inside the chunk
        files = await ing._flush_one(TopicPartition(topic, 0))
        assert files and store.lake_progress() == {(topic, 0): 3}
        assert lake.read_all().num_rows == 2  # offsets 1 and 2, read back from the store
        assert reads("not_aligned") == before["not_aligned"] + 1
        ing._unbuffered[(topic, 0)] = 0.0
        await ing._flush_one(TopicPartition(topic, 0))  # nothing buffered: a restart's flush
        assert reads("unbuffered") == before["unbuffered"] + 1
        assert reads("refused") == before["refused"] and reads("moving") == before["moving"]
    finally:
        ing._lake_thread.shutdown(wait=True)
        store.close()


async def test_each_partition_s_lake_buffer_is_freed_and_trimmed_as_soon_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush writes the partitions one by one; each one's Arrow batches are dropped and the
    heap handed back to the OS right after its files are written, not at the end of the whole
    flush (which held every flushed buffer while ingest refilled the next ones)."""
    import pyarrow as pa
    from tracemq_collector import ingest as ingest_module

    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {}
    ing.settings = SimpleNamespace(collector_lake_segment_rows=200_000)
    ing.events_stored = 0
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    trims: list[int] = []
    monkeypatch.setattr(
        ingest_module, "release_free_memory", lambda: trims.append(pa.total_allocated_bytes())
    )
    try:
        for partition in (0, 1):
            recs = []
            for offset in range(20):
                value = "".join(
                    f"SubAfter\x01req{partition}-{offset}-{i}\x01MSG{partition}x{offset}x{i}"
                    f"\x0112\x01true\x01k\x010\x01{1_700_000_000_000 + offset}\x01CG\x02"
                    for i in range(50)
                )
                recs.append((offset, value.encode(), "10.0.0.7"))
            decoded = decode_chunk([(topic, partition, recs)], 1_700_000_000_000)
            new, before, _ = store.write_rows(decoded.store)
            ing._stored(decoded, new, before)
            del decoded
        held = [
            sum(
                b.nbytes
                for e in ing._buffers[(topic, p)].entries
                for bs in e[3].values()
                for b in bs
            )
            for p in (0, 1)
        ]
        assert all(held)
        start = pa.total_allocated_bytes()
        assert await ing._flush_one(TopicPartition(topic, 0))
        assert len(trims) == 1
        # partition 0's batches were gone at its trim (its Arrow bytes, up to padding)
        assert trims[0] < start - 0.9 * held[0]
        assert await ing._flush_one(TopicPartition(topic, 1))
        assert len(trims) == 2
        assert trims[1] < start - 0.9 * (held[0] + held[1])
        assert store.lake_progress() == {(topic, 0): 20, (topic, 1): 20}
        assert lake.read_all().num_rows == 2 * 20 * 50
    finally:
        ing._lake_thread.shutdown(wait=True)
        store.close()


async def test_a_lake_gap_left_by_a_kill_is_flushed_after_a_restart_with_nothing_to_fetch(
    tmp_path: Path,
) -> None:
    """Killed after storing a partition's last trace message but before its lake flush: after
    the restart ingest resumes at the store's progress and fetches nothing more of it, so no
    chunk ever puts it in a lake buffer. The take-over backfill only settles where its lake
    starts. The gap between the lake and the store must still be scheduled for a flush at the
    assignment (it was left silently, and the Kafka commit stuck at the lake's progress)."""
    from tracemq_collector.backfill import Backfill
    from tracemq_collector.ingest import _ClusterIngest

    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    # before the kill: partition 0 stored and in the lake up to 2, stored up to 6; partition 1
    # stored and never flushed; partition 2 stored and flushed
    for partition, flushed_to in ((0, 2), (1, None), (2, 6)):
        for start in range(0, 6, 2):
            recs = [
                (o, f"SubAfter\x01r{o}\x01MSG{o}\x0112\x01true\x01k\x010\x01{1_700_000_000_000 + o}"
                 f"\x01CG\x02".encode(), "10.0.0.7")
                for o in range(start, start + 2)
            ]  # fmt: skip
            store.write_rows(decode_chunk([(topic, partition, recs)], 1_700_000_000_000).store)
            if flushed_to is not None and start + 2 <= flushed_to:
                lake.flush(topic, partition)
        if flushed_to == 6:
            lake.flush(topic, partition)
    assert store.lake_progress() == {(topic, 0): 2, (topic, 2): 6}
    # the restart: the backfill settles the lake's start of each partition, ingest is assigned
    backfill = Backfill(store, lake, retention_ms=10**13)
    backfill.assign({(topic, p) for p in range(3)})
    while backfill.run_next(now_ms=1_700_000_000_000):
        pass
    assert store.lake_progress() == {(topic, 0): 2, (topic, 1): 0, (topic, 2): 6}

    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {}
    ing.settings = SimpleNamespace(
        collector_lake_segment_rows=200_000, collector_lake_flush_interval_ms=0
    )
    ing.events_stored = 0
    ing._inflight = 0
    ing._flushing = None
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    ing.writer = ThreadPoolExecutor(max_workers=1)
    tps = [TopicPartition(topic, p) for p in range(3)]
    committed: dict[TopicPartition, int] = {}

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        committed.update(offsets)

    cluster: Any = SimpleNamespace(assigned=set(tps), commit=commit, bootstrap="b")
    state = _ClusterIngest.__new__(_ClusterIngest)
    state.ingestor, state.cluster, state.bases = ing, cluster, {}
    cluster.state = state
    try:
        starts = await state.on_assigned(tps)
        assert starts == {tp: 6 for tp in tps}
        # caught up: every fetch after the restart is empty
        await ing.maybe_flush(cluster, idle=True)
        assert ing._flushing is not None, "a lake gap after the restart is scheduled for nothing"
        await ing._flushing
        assert store.lake_progress() == {(topic, p): 6 for p in range(3)}
        # both durable: Kafka moves on — partition 2 too, already whole in store and lake
        # (its commit may have lagged at the kill: else it stays behind until new data comes)
        assert committed == {tp: 6 for tp in tps}
        table = lake.read_all()
        coords = list(
            zip(
                table["trace_partition"].to_pylist(),
                table["trace_offset"].to_pylist(),
                strict=True,
            )
        )
        assert sorted(coords) == [(p, o) for p in range(3) for o in range(6)]
    finally:
        ing._lake_thread.shutdown(wait=True)
        ing.writer.shutdown(wait=True)
        store.close()


async def test_a_backfill_after_ingests_first_lake_flush_does_not_read_its_files_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier owner wrote offsets [0, 2) of a partition to the shared lake. Taken over,
    ingest stores [2, 6) and flushes it to the lake before the backfill gets to the partition
    (it runs one partition at a time, once a second). The backfill copies [0, 2) and reads
    only that file, not ingest's new one back (in the bench, one run in ~13: the collector
    ~40 MiB and ~2 s of CPU higher from its first lake flush on)."""
    import tracemq_collector.backfill as backfill_mod
    from tracemq_collector.backfill import Backfill
    from tracemq_collector.ingest import _ClusterIngest

    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    key = (topic, 0)

    def chunk(first: int, end: int) -> Any:
        recs = [
            (o, f"SubAfter\x01r{o}\x01MSG{o}\x0112\x01true\x01k\x010\x01{1_700_000_000_000 + o}"
             f"\x01CG\x02".encode(), "10.0.0.7")
            for o in range(first, end)
        ]  # fmt: skip
        return decode_chunk([(topic, 0, recs)], 1_700_000_000_000)

    earlier = TraceStore(tmp_path / "earlier.db")
    earlier.open()
    earlier.write_rows(chunk(0, 2).store)
    assert TraceLake(tmp_path / "lake", earlier).flush(topic, 0)
    earlier.close()

    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {key: 99}  # left from an earlier ownership of the partition
    ing.settings = SimpleNamespace(collector_lake_segment_rows=200_000)
    ing.events_stored = 0
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    ing.writer = ThreadPoolExecutor(max_workers=1)
    cluster: Any = SimpleNamespace(bootstrap="b")
    state = _ClusterIngest.__new__(_ClusterIngest)
    state.ingestor, state.cluster, state.bases = ing, cluster, {}
    read: list[str] = []
    dataset = backfill_mod.ds.dataset

    def spy(files: list[str], **kwargs: Any) -> Any:
        read.extend(Path(f).name for f in files)
        return dataset(files, **kwargs)

    try:
        assert await state.on_assigned([TopicPartition(topic, 0)]) == {}
        assert ing.ingested_from(key) is None
        for first in (2, 4):  # ingest resumes at the earlier owner's commit
            decoded = chunk(first, first + 2)
            new, before, _ = store.write_rows(decoded.store)
            ing._stored(decoded, new, before)
        assert ing.ingested_from(key) == 2
        assert await ing._flush_one(TopicPartition(topic, 0))
        assert store.lake_progress() == {key: 6}

        from prometheus_client import REGISTRY

        def rows_read() -> float:
            value = REGISTRY.get_sample_value("tracemq_collector_backfill_rows_read_total")
            return value or 0.0

        before = rows_read()
        backfill = Backfill(store, lake, retention_ms=10**13, ingested_from=ing.ingested_from)
        backfill.assign({key})
        monkeypatch.setattr(backfill_mod.ds, "dataset", spy)
        assert backfill.run_next(now_ms=1_700_000_000_000)
        assert backfill.snapshot()["events_backfilled"] == 2
        assert read and all("-00000000000000000000-00000000000000000002." in f for f in read)
        assert rows_read() - before == 2  # counted: the earlier owner's two rows, no more
        monkeypatch.undo()
        table = lake.read_all()
        assert sorted(table["trace_offset"].to_pylist()) == list(range(6))
        assert store.first_event_offset(topic, 0) == 0
    finally:
        ing._lake_thread.shutdown(wait=True)
        ing.writer.shutdown(wait=True)
        store.close()


async def test_a_failed_lake_flush_is_retried_even_if_nothing_more_is_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lake flush takes the partition's buffer and fails (the lake's disk, the object store):
    the next flush must write the range again from the store, without waiting for more trace
    messages of the partition (there may be none)."""
    topic = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"
    store = TraceStore(tmp_path / "traces.db")
    store.open()
    lake = TraceLake(tmp_path / "lake", store)
    ing: Any = object.__new__(Ingestor)
    ing.store, ing.lake, ing._buffers, ing._unbuffered = store, lake, {}, {}
    ing._first_stored = {}
    ing.settings = SimpleNamespace(collector_lake_segment_rows=200_000)
    ing.events_stored = 0
    ing._lake_thread = ThreadPoolExecutor(max_workers=1)
    try:
        recs = [
            (o, f"SubAfter\x01r{o}\x01MSG{o}\x0112\x01true\x01k\x010\x01{1_700_000_000_000 + o}"
             f"\x01CG\x02".encode(), "10.0.0.7")
            for o in range(4)
        ]  # fmt: skip
        decoded = decode_chunk([(topic, 0, recs)], 1_700_000_000_000)
        new, before, _ = store.write_rows(decoded.store)
        ing._stored(decoded, new, before)
        tp = TopicPartition(topic, 0)

        def broken(*args: object) -> None:
            raise OSError("lake unwritable")

        monkeypatch.setattr(lake, "write_decoded", broken)
        with pytest.raises(OSError):
            await ing._flush_one(tp)
        assert (topic, 0) in ing._unbuffered, "the unwritten range is scheduled for nothing"
        monkeypatch.undo()
        assert await ing._flush_one(tp)
        assert store.lake_progress() == {(topic, 0): 4}
        assert lake.read_all().num_rows == 4
    finally:
        ing._lake_thread.shutdown(wait=True)
        store.close()


def test_a_fetch_is_at_the_end_when_it_reaches_every_high_watermark() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = SimpleNamespace(highwater={a: 10, b: 5}.get)
    recs = lambda *offsets: [Rec(o, b"") for o in offsets]  # noqa: E731
    assert _at_end(consumer, {a: recs(8, 9), b: recs(4)})
    assert not _at_end(consumer, {a: recs(7, 8), b: recs(4)})  # a has offset 9 still to come
    assert not _at_end(consumer, {a: recs(9), TopicPartition("t", 2): recs(0)})  # unknown end
    assert not _at_end(consumer, {a: []})


async def test_the_lake_flush_starts_when_the_last_chunk_of_a_caught_up_fetch_is_stored() -> None:
    import asyncio

    ing: Any = object.__new__(Ingestor)
    ing._queue = asyncio.Queue()
    ing._inflight = 2
    ing._worker = None
    ing._stored = lambda decoded, new, before: None
    flushed: list[tuple[Any, bool, int]] = []

    async def maybe_flush(cluster: Any, *, idle: bool = False) -> None:
        flushed.append((cluster, idle, ing._inflight))

    ing.maybe_flush = maybe_flush
    cluster = SimpleNamespace(bootstrap="b")
    ing._caught_up = {"b": cluster}
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(2)]
    for fut in futures:
        ing._queue.put_nowait((fut, SimpleNamespace(), 0.0))
    stage = asyncio.create_task(ing._store_stage())
    try:
        async with asyncio.timeout(5):  # each wait below yields to the stage until it is there
            futures[0].set_result((1, {}, 0))
            while ing._inflight != 1:
                await asyncio.sleep(0)
            assert flushed == []  # a chunk of the burst is still being stored
            futures[1].set_result((1, {}, 0))
            while not flushed:
                await asyncio.sleep(0)
        assert flushed == [(cluster, True, 0)]
    finally:
        stage.cancel()
