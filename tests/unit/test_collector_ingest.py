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
from tracemq_collector.ingest import CHUNK_BYTES, Ingestor, _chunks, _segments
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
        assert committed == {tp: 6 for tp in tps[:2]}  # both durable: Kafka moves on
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


class _Pipeline:
    """An Ingestor's write path with a thread as its ingest worker (the worker functions and
    the store are the real ones; only the process is not). ``commits`` records the
    ``commit`` flag of every chunk handed to the worker."""

    TOPIC = "tmq.trace-broker.RMQ_SYS_TRACE_TOPIC"

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        import asyncio

        from tracemq_collector import ingest as ingest_module
        from tracemq_collector import store as store_module

        self.store_module = store_module
        monkeypatch.setattr(store_module, "_worker_stores", {})
        monkeypatch.setattr(store_module, "_worker_failed", [])
        monkeypatch.setattr(ingest_module, "CHUNK_BYTES", 1)  # one trace message a chunk
        self.commits: list[bool] = []
        real = store_module.write_rows_in_worker

        def recording(path: str, batch: Any, *, commit: bool = True) -> Any:
            self.commits.append(commit)
            return real(path, batch, commit=commit)

        monkeypatch.setattr(ingest_module, "write_rows_in_worker", recording)
        self.store = TraceStore(tmp_path / "traces.db")
        self.store.open()
        ing: Any = object.__new__(Ingestor)
        ing.store, ing._buffers, ing._unbuffered = self.store, {}, {}
        ing.events_stored, ing.last_batch_ms, ing._inflight = 0, 0, 0
        ing._handing = set()
        ing._decode_thread = ThreadPoolExecutor(max_workers=1)
        ing.writer = ThreadPoolExecutor(max_workers=1)
        ing._worker = ThreadPoolExecutor(max_workers=1)
        ing._queue = asyncio.Queue(maxsize=1)
        ing._stage = asyncio.create_task(ing._store_stage())
        self.restarts = 0

        def stop_worker(*, wait: bool) -> None:
            # As a worker process does, the old one refuses what was already handed to it
            # (its globals say a batch failed) before the new one starts with fresh globals.
            old, ing._worker = ing._worker, None
            old.shutdown(wait=True)

        def new_worker() -> ThreadPoolExecutor:  # a new "process": no failure, no connection
            self.restarts += 1
            self._close_worker_stores()
            store_module._worker_failed.clear()
            return ThreadPoolExecutor(max_workers=1)

        ing._stop_worker = stop_worker
        ing._new_worker = new_worker
        ing._generation = 1
        self.ing = ing

    def _close_worker_stores(self) -> None:
        for s in self.store_module._worker_stores.values():
            s.close()  # an open transaction rolls back, as when a worker process dies
        self.store_module._worker_stores.clear()

    def fetch(self, offsets: range, partition: int = 0) -> dict[TopicPartition, list[Rec]]:
        return {
            TopicPartition(self.TOPIC, partition): [
                Rec(o, f"SubAfter\x01r{o}\x01MSG{o}\x0112\x01true\x01k\x010"
                       f"\x01{1_700_000_000_000 + o}\x01CG\x02".encode())
                for o in offsets
            ]
        }  # fmt: skip

    def buffered(self) -> list[tuple[int, int]]:
        return [(s, e) for b in self.ing._buffers.values() for s, e, *_ in b.entries]

    async def close(self) -> None:
        import asyncio
        import contextlib

        self.ing._stage.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.ing._stage
        for ex in (self.ing._worker, self.ing._decode_thread, self.ing.writer):
            ex.shutdown(wait=True)
        self._close_worker_stores()
        self.store.close()


async def test_the_worker_stores_two_chunks_per_transaction_and_a_fetch_ends_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks go to the worker two to a transaction, and a fetch's last chunk always commits
    (nothing left open between fetches). A chunk counts as stored, and reaches the lake
    buffer, only once its transaction is committed."""
    p = _Pipeline(tmp_path, monkeypatch)
    try:
        await p.ing.ingest(p.fetch(range(5)))
        await p.ing.drain()
        assert p.commits == [False, True, False, True, True]
        assert p.store.progress() == {(p.TOPIC, 0): 5}
        assert p.ing.events_stored == 5 and p.ing._inflight == 0
        assert p.buffered() == [(o, o + 1) for o in range(5)]
        await p.ing.ingest(p.fetch(range(5, 7)))
        await p.ing.drain()
        assert p.commits[5:] == [False, True]
        assert p.store.progress() == {(p.TOPIC, 0): 7}
    finally:
        await p.close()


async def test_a_failed_chunk_is_stored_again_with_the_chunks_its_transaction_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker fails on the chunk that was to commit the transaction: the chunk before it,
    stored in the same transaction, was rolled back too, and both are stored again on a new
    worker; each event once, the lake buffer in order."""
    p = _Pipeline(tmp_path, monkeypatch)
    real = TraceStore._write_rows
    calls = 0

    def second_fails(self: TraceStore, conn: Any, batch: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("disk I/O error")
        return real(self, conn, batch)

    monkeypatch.setattr(TraceStore, "_write_rows", second_fails)
    try:
        await p.ing.ingest(p.fetch(range(4)))
        await p.ing.drain()
        assert p.restarts >= 1
        assert p.store.progress() == {(p.TOPIC, 0): 4}
        stored = [e["trace_offset"] for e in p.store.events_in_range(p.TOPIC, 0, 0, 9)]
        assert stored == [0, 1, 2, 3]
        assert p.store.event_count() == 4
        assert p.ing.events_stored == 4 and p.ing._inflight == 0
        # A chunk handed to the new worker before the retry of an earlier one is stored
        # first: then the lake reads the partition from the store instead of its buffer.
        key = (p.TOPIC, 0)
        assert key in p.ing._unbuffered or p.buffered() == [(o, o + 1) for o in range(4)]
    finally:
        await p.close()


async def test_ingest_stopped_inside_a_transaction_stores_what_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingest fails after decoding the first chunk of a transaction and before the chunk
    that was to commit it: the decoded chunk is stored, committed on its own, it counts as
    stored, and a drain does not wait for a chunk that never comes."""
    from tracemq_collector import ingest as ingest_module

    p = _Pipeline(tmp_path, monkeypatch)
    decodes = 0

    def decode_then_fail(*args: Any) -> Any:
        nonlocal decodes
        decodes += 1
        if decodes == 2:
            raise ValueError("decode failed")
        return decode_chunk(*args)

    monkeypatch.setattr(ingest_module, "decode_chunk", decode_then_fail)
    try:
        with pytest.raises(ValueError, match="decode failed"):
            await p.ing.ingest(p.fetch(range(3)))
        await p.ing.drain()
        assert p.commits == [True]
        assert p.store.progress() == {(p.TOPIC, 0): 1}
        assert p.ing.events_stored == 1 and p.ing._inflight == 0
        assert p.buffered() == [(0, 1)]
    finally:
        await p.close()
