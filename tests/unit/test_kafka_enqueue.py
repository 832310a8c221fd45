"""tracemq._kafka.enqueue: the shortcut past aiokafka's per-record re-checks is taken only when
every internal it relies on is there and the record's partition is known; anything else
(another aiokafka, unknown metadata, a transactional producer) takes ``send`` itself."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import TopicPartition
from tracemq._kafka import enqueue

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
