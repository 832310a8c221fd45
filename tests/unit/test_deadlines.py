"""The send time-out on the producer's shared timer (tracemq._deadlines): an ack that
never comes and an enqueue that never returns both end as TimeoutError within the send timeout,
the task is not left cancelled, an outside cancellation still propagates, and a batch times out
as a whole."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from tracemq import BatchSendError, Message, Producer, SendError
from tracemq._deadlines import RESOLUTION_S, Deadlines
from tracemq.message import SendResult, SendStatus
from tracemq.routing.model import QueueRoute

ROUTE = QueueRoute("broker-a", "c", 2, 2, 6, "127.0.0.1:1", "10.0.0.1:10911")


def _entries(d: Deadlines) -> list[Any]:
    return [*d._fifo, *d._heap]


def _producer(produce: Any) -> Producer:
    p = Producer("PG", redis_url="redis://127.0.0.1:1/0", control_bootstrap="127.0.0.1:1")
    p._state = "running"

    async def queues(topic: str, **_: Any) -> Any:
        return None, [(ROUTE, 0), (ROUTE, 1)]

    async def result(q: Any, place: Any, msg_id: str, md: Any) -> SendResult:
        return SendResult(SendStatus.SEND_OK, msg_id, "off", place.queue, md, "R", True)

    p._queues, p._produce, p._result = queues, produce, result  # type: ignore[method-assign]
    return p


@pytest.mark.timeout(10)
async def test_an_ack_that_never_comes_times_out_within_the_send_timeout() -> None:
    pending: list[asyncio.Future[Any]] = []

    async def produce(*_: Any) -> asyncio.Future[Any]:
        pending.append(asyncio.get_running_loop().create_future())
        return pending[-1]

    p = _producer(produce)
    t0 = time.monotonic()
    with pytest.raises(SendError, match="1 attempt") as info:
        await p.send(Message("T", b"x"), timeout=0.2)
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 0.2 + 0.5
    assert isinstance(info.value.__cause__, TimeoutError)
    # the ack future itself carries the time-out (aiokafka skips a future already done)
    assert len(pending) == 1 and isinstance(pending[0].exception(), TimeoutError)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


@pytest.mark.timeout(10)
async def test_an_enqueue_that_never_returns_times_out_and_leaves_the_task_uncancelled() -> None:
    async def produce(*_: Any) -> asyncio.Future[Any]:
        await asyncio.Event().wait()  # e.g. aiokafka waiting for room in a full batch
        raise AssertionError("unreachable")

    p = _producer(produce)
    t0 = time.monotonic()
    with pytest.raises(SendError) as info:
        await p.send(Message("T", b"x"), timeout=0.2)
    assert time.monotonic() - t0 < 0.2 + 0.5
    assert isinstance(info.value.__cause__, TimeoutError)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # a cancellation left pending would be raised here


@pytest.mark.timeout(10)
async def test_an_outside_cancellation_is_not_turned_into_a_timeout() -> None:
    entered = asyncio.Event()

    async def produce(*_: Any) -> asyncio.Future[Any]:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    p = _producer(produce)
    send = asyncio.create_task(p.send(Message("T", b"x"), timeout=5))
    await entered.wait()
    send.cancel()
    with pytest.raises(asyncio.CancelledError):
        await send
    assert all(e[4] != 0 for e in _entries(p._deadlines))  # no deadline left watching


@pytest.mark.timeout(10)
async def test_a_batch_whose_acks_never_come_fails_as_a_whole_with_timeouts() -> None:
    pending: list[asyncio.Future[Any]] = []

    async def produce(*_: Any) -> asyncio.Future[Any]:
        pending.append(asyncio.get_running_loop().create_future())
        return pending[-1]

    p = _producer(produce)
    with pytest.raises(BatchSendError) as info:
        await p.send_batch([Message("T", b"a"), Message("T", b"b")], timeout=0.2)
    assert info.value.failed == [0, 1]
    assert all(isinstance(e, TimeoutError) for e in info.value.errors)
    assert all(f.done() for f in pending)  # nothing left waiting on the transport


async def test_the_entries_of_finished_sends_stay_few() -> None:
    d = Deadlines()
    loop = asyncio.get_running_loop()
    for _ in range(20_000):
        d.done(d.enqueue(loop, loop.time() + 60))
    assert len(_entries(d)) <= 1025 + 1  # compacted once finished entries are most of it
    d.close()
    assert RESOLUTION_S <= 0.01


async def test_finished_entries_leave_at_the_next_enqueue() -> None:
    # (left for the compaction at 1 024 entries, each finished entry outlived young-generation
    # collections: a consumer with one deadline per listener call ran ten times as many)
    import gc

    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    gc.collect()
    young = gc.get_stats()[0]["collections"]
    for _ in range(5000):
        Deadlines.done(deadlines.enqueue(loop, loop.time() + 60))
    assert len(_entries(deadlines)) <= 1
    assert gc.get_stats()[0]["collections"] - young <= 2
    live = deadlines.enqueue(loop, loop.time() + 60)
    later = deadlines.enqueue(loop, loop.time() + 61)
    Deadlines.done(later)  # (not at the top: stays until the live one is done)
    assert live in _entries(deadlines)
    deadlines.close()


@pytest.mark.timeout(10)
async def test_an_ack_handed_over_without_an_await_is_failed_at_the_deadline() -> None:
    # (Deadlines.enqueue with the ack: the producer's send_now path, no task watched)
    d = Deadlines()
    loop = asyncio.get_running_loop()
    ack: asyncio.Future[Any] = loop.create_future()
    entry = d.enqueue(loop, loop.time() + 0.05, ack)
    with pytest.raises(TimeoutError):
        await ack
    assert not d.expired(entry)  # the task was never cancelled: nothing to withdraw
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    d.done(entry)
    acked: asyncio.Future[Any] = loop.create_future()
    d.done(d.enqueue(loop, loop.time() + 0.01, acked))
    await asyncio.sleep(0.05)
    assert not acked.done()  # a finished entry fails nothing
    d.close()


@pytest.mark.timeout(10)
async def test_deadlines_out_of_order_each_fire_in_time() -> None:
    # (in order they queue in a FIFO; an earlier one than the last goes to the heap: the timer
    # serves whichever front is due first)
    d = Deadlines()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    acks = {delay: loop.create_future() for delay in (0.3, 0.1, 0.2, 0.05, 0.4)}
    entries = {delay: d.enqueue(loop, t0 + delay, ack) for delay, ack in acks.items()}
    assert d._heap  # (0.1, 0.2 and 0.05 came after a later one)
    d.done(entries[0.2])  # finished: never fails its ack
    failed_at: dict[float, float] = {}
    for delay, ack in acks.items():
        ack.add_done_callback(lambda _, delay=delay: failed_at.setdefault(delay, loop.time() - t0))
    await asyncio.sleep(0.6)
    assert sorted(failed_at) == [0.05, 0.1, 0.3, 0.4]
    for delay, at in failed_at.items():
        assert delay <= at < delay + 0.1
        assert isinstance(acks[delay].exception(), TimeoutError)
    assert not acks[0.2].done()
    assert not _entries(d) or all(e[4] != 0 for e in _entries(d))
    d.close()
