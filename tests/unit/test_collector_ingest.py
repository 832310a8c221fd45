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
    assert chunks[0][0][2][0] == (0, big, "10.0.0.7", None)
    assert chunks[-1][-1][2] == [(7, None, None, None), (8, b"y", "10.0.0.7", None)]
    assert _chunks({}) == []


def test_the_idempotency_key_is_taken_from_the_headers_and_bounded() -> None:
    recs = [
        Rec(0, b"a", (("IDEMPOTENCY_KEY", b"K1"), ("BORN_HOST", b"10.0.0.7"))),
        Rec(1, b"b", (("IDEMPOTENCY_KEY", b"\xff\xfe"),)),  # not UTF-8: no key, kept
        Rec(2, b"c", (("IDEMPOTENCY_KEY", b"x" * 129),)),  # too long: no key
        Rec(3, b"d", (("IDEMPOTENCY_KEY", b""),)),
    ]
    (chunk,) = _chunks({TopicPartition("t", 0): recs})  # type: ignore[dict-item]
    assert [r[2:] for r in chunk[0][2]] == [
        ("10.0.0.7", "K1"),
        (None, None),
        (None, None),
        (None, None),
    ]


def test_buffered_chunks_become_segments_of_bounded_size() -> None:
    entries = [(0, 10, 40, {("d", 0): ["a"]}), (10, 12, 40, {("d", 1): ["b"]}),
               (12, 20, 40, {("d", 0): ["c"]}), (20, 21, 500, {("d", 0): ["e"]})]  # fmt: skip
    assert _segments(entries, 100) == [
        (0, 12, {("d", 0): ["a"], ("d", 1): ["b"]}),
        (12, 20, {("d", 0): ["c"]}),
        (20, 21, {("d", 0): ["e"]}),  # one chunk larger than the limit still goes whole
    ]
    assert _segments(entries, 10_000) == [(0, 21, {("d", 0): ["a", "c", "e"], ("d", 1): ["b"]})]
