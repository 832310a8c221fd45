"""Ingest waits for the running lake flush while too many events are held for the lake
(buffered, or taken by the flush and not written yet), so a lake slower than the store (sorted
files, object storage) cannot make the buffer grow with the backlog; it goes on as soon as the
flush has written enough of them, not at the flush's end, and never waits when no flush can
take the buffer down."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from tracemq_collector import ingest
from tracemq_collector.ingest import LAKE_BUFFER_HARD_EVENTS, Ingestor, _LakeBuffer


def _ingestor(*pending: int) -> Any:
    ing: Any = object.__new__(Ingestor)
    ing._buffers = {}
    for partition, events in enumerate(pending):
        buf = _LakeBuffer(after=None, end=0, entries=[(0, events, events, {})])
        buf.events = events
        ing._buffers[("t", partition)] = buf
    ing._unbuffered = {}
    ing._flushing = None
    return ing


def _lake_writes(ing: Any) -> dict[int, asyncio.Future[Any]]:
    """The ingestor's lake thread replaced: each partition's buffer is written when the test
    resolves its future (an exception: the write fails)."""
    writes: dict[int, asyncio.Future[Any]] = {}

    async def in_lake_thread(fn: Any, *args: Any) -> Any:
        if fn == ing._write_buffer:
            partition = args[1]
            writes[partition] = asyncio.get_running_loop().create_future()
            await writes[partition]
            return [f"file-{partition}"], "buffer"
        return None  # release_free_memory

    ing._in_lake_thread = in_lake_thread
    return writes


def _flush_all(ing: Any) -> Any:
    """maybe_flush: one flush of every buffered partition, one after another (as
    flush_and_commit's ``flush``)."""

    async def flush() -> None:
        for topic, partition in list(ing._buffers):
            await ing._flush_one(TopicPartition(topic, partition))

    async def maybe_flush(cluster: Any, *, idle: bool = False) -> None:
        if ing._buffers and (ing._flushing is None or ing._flushing.done()):
            ing._flushing = asyncio.create_task(flush())

    return maybe_flush


async def _until(predicate: Any) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), 5)


async def test_a_full_buffer_waits_for_the_flush_that_empties_it() -> None:
    ing = _ingestor(LAKE_BUFFER_HARD_EVENTS)
    released, started = asyncio.Event(), asyncio.Event()

    async def flush() -> None:
        started.set()
        await released.wait()
        ing._buffers.clear()

    async def maybe_flush(cluster: Any, *, idle: bool = False) -> None:
        if ing._buffers and (ing._flushing is None or ing._flushing.done()):
            ing._flushing = asyncio.create_task(flush())

    ing.maybe_flush = maybe_flush
    before = ingest.metrics.LAKE_BACKPRESSURE._value.get()
    waiting = asyncio.create_task(ing._lake_backpressure(object()))
    await asyncio.wait_for(started.wait(), 5)
    assert not waiting.done()  # no next fetch while the buffer is full
    released.set()
    await asyncio.wait_for(waiting, 5)
    assert ing._lake_pending() == 0
    assert ingest.metrics.LAKE_BACKPRESSURE._value.get() == before + 1


async def test_no_wait_below_the_cap_or_without_a_flush_to_wait_for() -> None:
    below = _ingestor(LAKE_BUFFER_HARD_EVENTS - 1)
    below.maybe_flush = None  # never called below the cap
    await asyncio.wait_for(below._lake_backpressure(object()), 1)

    stuck = _ingestor(LAKE_BUFFER_HARD_EVENTS * 2)

    async def nothing_due(cluster: Any, *, idle: bool = False) -> None:
        return None

    stuck.maybe_flush = nothing_due
    await asyncio.wait_for(stuck._lake_backpressure(object()), 1)


async def test_ingest_goes_on_once_the_flush_has_written_enough_not_at_its_end() -> None:
    half = LAKE_BUFFER_HARD_EVENTS // 2 + 1
    ing = _ingestor(half, half)
    writes = _lake_writes(ing)
    ing.maybe_flush = _flush_all(ing)
    waiting = asyncio.create_task(ing._lake_backpressure(object()))
    await _until(lambda: 0 in writes)
    # partition 0 is taken by the flush: buffered alone is below the mark, but its events are
    # still in memory until written, so ingest still waits
    assert ing._lake_pending() == half and ing._writing == half
    assert ing._lake_held() >= LAKE_BUFFER_HARD_EVENTS
    await asyncio.sleep(0.05)
    assert not waiting.done()
    writes[0].set_result(None)
    await asyncio.wait_for(waiting, 5)  # partition 0 written: room again
    assert not ing._flushing.done()  # while the flush still writes partition 1
    assert ing._lake_held() == half
    await _until(lambda: 1 in writes)
    writes[1].set_result(None)
    await asyncio.wait_for(ing._flushing, 5)
    assert ing._writing == 0 and ing._lake_held() == 0


async def test_a_failed_partition_write_gives_its_events_back_and_wakes_ingest() -> None:
    ing = _ingestor(LAKE_BUFFER_HARD_EVENTS)
    writes = _lake_writes(ing)
    ing.maybe_flush = _flush_all(ing)
    waiting = asyncio.create_task(ing._lake_backpressure(object()))
    await _until(lambda: 0 in writes)
    assert ing._writing == LAKE_BUFFER_HARD_EVENTS
    writes[0].set_exception(OSError("disk full"))
    await asyncio.wait_for(waiting, 5)
    with pytest.raises(OSError, match="disk full"):
        await ing._flushing
    # the buffer is gone (the next flush reads the store back): nothing is held any more
    assert ing._writing == 0 and ing._lake_held() == 0
    assert ("t", 0) in ing._unbuffered
