"""tracemq._kafka.enqueue: the shortcut past aiokafka's per-record re-checks is taken only when
every internal it relies on is there and the record's partition is known; anything else
(another aiokafka, unknown metadata, a transactional producer) takes ``send`` itself."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import TopicPartition
from tracemq._kafka import ProducerPool, enqueue

TP = TopicPartition("t", 1)


class _Acc:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def add_message(self, tp: Any, key: Any, value: Any, timeout: float, **kw: Any) -> str:
        self.calls.append((tp, key, value, timeout, kw))
        return "accumulated"


class _Producer:
    def __init__(self, **internals: Any) -> None:
        self.sent: list[tuple[Any, ...]] = []
        for k, v in internals.items():
            setattr(self, k, v)

    async def send(self, topic: str, value: bytes, *, partition: int, headers: Any) -> str:
        self.sent.append((topic, value, partition, headers))
        return "sent"


def _internals(partitions: Any, txn: Any = None) -> dict[str, Any]:
    return {
        "_message_accumulator": _Acc(),
        "client": SimpleNamespace(cluster=SimpleNamespace(_partitions=partitions)),
        "_txn_manager": txn,
        "_request_timeout_ms": 30_000,
    }


async def test_the_shortcut_when_the_partition_is_known() -> None:
    p = _Producer(**_internals({"t": {0, 1}}))
    assert await enqueue(p, TP, b"v", [("h", b"1")]) == "accumulated"  # type: ignore[arg-type]
    assert p.sent == []
    [(tp, key, value, timeout, kw)] = p._message_accumulator.calls
    assert (tp, key, value, timeout, kw["headers"]) == (TP, None, b"v", 30.0, [("h", b"1")])


@pytest.mark.parametrize(
    "internals",
    [
        {},  # an aiokafka without these internals
        _internals({"other": {1}}),  # the topic's metadata not known yet
        _internals({"t": {0}}),  # the partition not known
        _internals({"t": {0, 1}}, txn=object()),  # a transactional producer
        _internals(None),  # metadata of another shape
    ],
    ids=["no-internals", "unknown-topic", "unknown-partition", "transactional", "other-shape"],
)
async def test_everything_else_takes_send(internals: dict[str, Any]) -> None:
    p = _Producer(**internals)
    assert await enqueue(p, TP, b"v", []) == "sent"  # type: ignore[arg-type]
    assert p.sent == [("t", b"v", 1, [])]


# -- ProducerPool.send_now: the usual record appended without a coroutine --------------------


class _Batch:
    def __init__(self, room: int) -> None:
        self.room = room
        self.appended: list[tuple[Any, ...]] = []

    def append(
        self, key: Any, value: Any, timestamp_ms: Any, _create_future: Any, headers: Any = ()
    ) -> Any:
        if len(self.appended) >= self.room:
            return None  # full (aiokafka closes the batch)
        self.appended.append((key, value, timestamp_ms, headers))
        return _create_future()


class _Accumulator:
    def __init__(self, room: int = 10) -> None:
        self._batches: dict[Any, Any] = {}
        self._closed = False
        self._exception: BaseException | None = None
        self.room = room

    def create_builder(self) -> str:
        return "builder"

    def _append_batch(self, builder: Any, tp: Any) -> _Batch:
        assert builder == "builder"
        batch = _Batch(self.room)
        self._batches.setdefault(tp, deque()).append(batch)
        return batch


def _pool(acc: _Accumulator, partitions: Any) -> ProducerPool:
    pool = ProducerPool()
    futures = iter(range(1, 100))
    # (the producer loop's create_future: aiokafka's own would look the running loop up)
    pool._fast["b:9092"] = (
        acc,
        SimpleNamespace(_partitions=partitions),
        10.0,
        lambda: f"future {next(futures)}",
    )
    return pool


def test_send_now_appends_to_the_open_batch_or_opens_one() -> None:
    acc = _Accumulator()
    pool = _pool(acc, {"t": {0, 1}})
    assert pool.send_now("b:9092", TP, b"v1", [("h", b"1")]) == "future 1"  # opened one
    assert pool.send_now("b:9092", TP, b"v2", []) == "future 2"  # the same batch
    [batch] = acc._batches[TP]
    assert batch.appended == [(None, b"v1", None, [("h", b"1")]), (None, b"v2", None, [])]


@pytest.mark.parametrize(
    "case", ["no-producer", "unknown-topic", "unknown-partition", "closed", "failed", "full"]
)
def test_send_now_does_nothing_where_send_would_wait_or_decide(case: str) -> None:
    acc = _Accumulator(room=0 if case == "full" else 10)
    partitions = {"unknown-topic": {"other": {1}}, "unknown-partition": {"t": {0}}}
    pool = _pool(acc, partitions.get(case, {"t": {1}}))
    acc._closed = case == "closed"
    acc._exception = RuntimeError("broken") if case == "failed" else None
    bootstrap = "elsewhere:9092" if case == "no-producer" else "b:9092"
    assert pool.send_now(bootstrap, TP, b"v", []) is None
    # nothing appended (a full batch refused the record: aiokafka's add_message waits for it)
    assert all(not b.appended for q in acc._batches.values() for b in q)


def test_the_installed_aiokafka_takes_the_future_factory_send_now_passes() -> None:
    # (without it ProducerPool never takes its fast paths: every record would go through send)
    from tracemq import _kafka

    assert _kafka._APPEND_TAKES_FACTORY
