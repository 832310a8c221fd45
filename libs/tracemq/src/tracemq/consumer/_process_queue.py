"""Per-queue bookkeeping of in-flight messages: the offset that is safe to commit is the lowest
offset still being processed (RocketMQ's ProcessQueue), so a crash never skips a message.

A queue is *dropped* when its partition is revoked (a rebalance): no listener call starts on its
messages any more (they go to the partition's next owner unconsumed here, as RocketMQ's
``ConsumeRequest`` does with a dropped ``ProcessQueue``), and the revocation waits for the calls
already running (:meth:`drained`) before it commits, so the next owner does not consume them
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq


class ProcessQueue:
    def __init__(self) -> None:
        self._in_flight: set[int] = set()
        self._heap: list[int] = []
        self._next = -1  # one past the highest offset seen
        self.dropped = False
        self._committed = -1
        self._running = 0  # listener calls (and their send-backs) running on this queue
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._in_flight)

    def seen(self, offset: int) -> bool:
        """``offset`` was already handed to this queue (added or skipped): a record fetched
        again must not be consumed again."""
        return offset < self._next

    def add(self, offset: int) -> None:
        self._in_flight.add(offset)
        heapq.heappush(self._heap, offset)
        self._next = max(self._next, offset + 1)

    def skip(self, offset: int) -> None:
        """An offset that needs no processing (filtered out by tag)."""
        self._next = max(self._next, offset + 1)

    def done(self, offset: int) -> None:
        self._in_flight.discard(offset)
        while self._heap and self._heap[0] not in self._in_flight:
            heapq.heappop(self._heap)

    def commit_offset(self) -> int | None:
        """The offset to commit (next to read), or None when nothing new is safe to commit."""
        if self._next < 0:
            return None
        safe = self._heap[0] if self._heap else self._next
        if safe <= self._committed:
            return None
        return safe

    def committed(self, offset: int) -> None:
        self._committed = max(self._committed, offset)

    # -- listener calls --------------------------------------------------------------------
    def begin(self) -> bool:
        """A listener call is about to start on messages of this queue: False (and nothing
        starts) when the queue was dropped; else call :meth:`end` when it is over."""
        if self.dropped:
            return False
        self._running += 1
        self._idle.clear()
        return True

    def end(self) -> None:
        self._running -= 1
        if self._running <= 0:
            self._running = 0
            self._idle.set()

    @property
    def running(self) -> int:
        return self._running

    async def drained(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until no listener call runs on this queue."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self._running == 0
