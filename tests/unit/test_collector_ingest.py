"""Collector ingest helpers: fetches cut into chunks, buffered chunks cut into lake segments."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import TopicPartition
from tracemq_collector.ingest import CHUNK_BYTES, _chunks, _segments


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
    from typing import Any

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
