"""Ingest waits for the running lake flush while too many events wait for the lake, so a lake
slower than the store (sorted files, object storage) cannot make the buffer grow with the
backlog; it never waits when no flush can take the buffer down."""

from __future__ import annotations

import asyncio
from typing import Any

from tracemq_collector import ingest
from tracemq_collector.ingest import LAKE_BUFFER_HARD_EVENTS, Ingestor, _LakeBuffer


def _ingestor(pending: int) -> Any:
    ing: Any = object.__new__(Ingestor)
    buf = _LakeBuffer(after=None, end=0)
    buf.events = pending
    ing._buffers = {("t", 0): buf}
    ing._flushing = None
    return ing


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
