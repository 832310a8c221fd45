"""collector_lag: "caught up" is never read off an end offset that is only a lower bound.

Tansu reports a partition's end as its last batch's base offset + 1; the real end comes from a
probe that reads that batch. Under load the probe can bring nothing within its wait: the
reported end is then a lower bound, and a collector that had committed part of the last batch
(a periodic flush commits what is stored so far) read as caught up — a reader of the lake
missed the rest of the batch."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import TopicPartition
from tracemq import collector_lag
from tracemq.cli.trace import _offset_state
from tracemq.collector_lag import PartitionLag, wait_caught_up
from tracemq.offset_reset import _OUT_OF_RANGE, LogProbe

TP = TopicPartition("trace-broker.RMQ_SYS_TRACE_TOPIC", 0)


class _Rec:
    def __init__(self, offset: int) -> None:
        self.offset = offset


async def test_the_exact_end_is_none_when_the_probe_reads_nothing() -> None:
    probe = LogProbe("127.0.0.1:1")
    answers: dict[int, Any] = {}
    closed: list[bool] = []

    async def fetch(tp: TopicPartition, offset: int, n: int) -> Any:
        return answers.get(offset, [])

    async def close() -> None:
        closed.append(True)

    probe._fetch = fetch  # type: ignore[method-assign]
    probe.close = close  # type: ignore[method-assign]
    # 30 records at 20..49 in one batch: Tansu says 21
    assert await probe.exact_end(TP, 21) is None, "nothing read: the end is not known"
    assert closed, "a probe that read nothing starts a new consumer next time"
    assert await probe.end(TP, 21) == 21  # end() keeps the lower bound
    answers[20] = None  # the fetch failed
    assert await probe.exact_end(TP, 21) is None
    answers[20] = [_Rec(o) for o in range(20, 50)]
    assert await probe.exact_end(TP, 21) == 50
    answers[20] = _OUT_OF_RANGE  # the log no longer holds it: nothing after it either
    assert await probe.exact_end(TP, 21) == 21
    assert await probe.exact_end(TP, 0) == 0  # an empty log needs no probe


def test_an_unconfirmed_end_is_its_own_state_with_a_lower_bound_lag() -> None:
    p = PartitionLag("T", "b", 0, 21, 21, end_confirmed=False)
    assert p.state == "end_unconfirmed" and p.lag == 0
    assert p.to_dict()["end_confirmed"] is False
    assert "unconfirmed" in _offset_state(p) and "reset due" not in _offset_state(p)
    # committed past the reported end of an unread batch: not taken for a reset due
    assert PartitionLag("T", "b", 0, 21, 40, end_confirmed=False).state == "end_unconfirmed"
    assert PartitionLag("T", "b", 0, 50, 21).state == "ok"


class _FakeOffsets:
    """_Offsets whose reads are scripted: (reported end, confirmed?, committed) per read."""

    reads: list[tuple[int, bool, int]] = []
    done: list[int] = []

    def __init__(self, group: str, timeout_s: float) -> None:
        pass

    async def open(self, *args: Any) -> None:
        pass

    async def read(self) -> list[PartitionLag]:
        end, confirmed, committed = self.reads[min(len(self.done), len(self.reads) - 1)]
        self.done.append(committed)
        return [PartitionLag("T", "b", 0, end, committed, end_confirmed=confirmed)]

    async def close(self) -> None:
        pass


async def test_wait_caught_up_does_not_stop_at_an_unconfirmed_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(collector_lag, "_Offsets", _FakeOffsets)
    _FakeOffsets.done = []
    _FakeOffsets.reads = [
        (21, False, 0),  # at the call: the last batch (20..49) could not be read
        (21, False, 21),  # the collector committed the batch's first record: not caught up
        (50, True, 21),  # the batch is read now: the target becomes 50
        (50, True, 35),
        (50, True, 50),
    ]
    lags = await wait_caught_up("redis://unused", timeout_s=10, poll_s=0)
    assert lags[0].committed == 50 and _FakeOffsets.done == [0, 21, 21, 35, 50]


async def test_wait_caught_up_names_an_end_it_never_could_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(collector_lag, "_Offsets", _FakeOffsets)
    _FakeOffsets.done = []
    _FakeOffsets.reads = [(21, False, 21)]
    with pytest.raises(TimeoutError, match="could not be read"):
        await wait_caught_up("redis://unused", timeout_s=0.2, poll_s=0.01)
