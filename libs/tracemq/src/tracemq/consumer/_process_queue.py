"""Per-queue bookkeeping of in-flight messages: the offset that is safe to commit is the lowest
offset still being processed (RocketMQ's ProcessQueue), so a crash never skips a message."""

from __future__ import annotations

import heapq


class ProcessQueue:
    def __init__(self) -> None:
        self._in_flight: set[int] = set()
        self._heap: list[int] = []
        self._next = -1  # one past the highest offset seen
        self.dropped = False
        self._committed = -1

    def __len__(self) -> int:
        return len(self._in_flight)

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
