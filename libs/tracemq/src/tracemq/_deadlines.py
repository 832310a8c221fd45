"""Time-outs on one timer per client instead of one asyncio timer per operation: a producer's
sends, a push consumer's listener calls (a listener call is watched like a send's hand-over:
its task is cancelled at the deadline and the cancellation becomes :class:`TimeoutError`).

``asyncio.timeout_at`` arms a TimerHandle per send; the loop keeps every one in a heap ordered by
a Python ``__lt__`` until it expires or a purge (a cancelled timer stays there): at thousands of
sends per second that heap costs more CPU than the rest of the send. Here a send registers a
small entry in one heap (compared in C), and one timer, armed for the earliest deadline (no more
often than every :data:`RESOLUTION_S`), ends what is overdue:

* while the send is handing its record to the transport (``enqueue``: aiokafka may wait for room
  or for metadata), its task is cancelled and :meth:`Deadlines.expired` turns that
  cancellation into :class:`TimeoutError`, the same contract as ``asyncio.timeout_at``;
* while it waits for the acknowledgement, the acknowledgement future gets a
  :class:`TimeoutError` (aiokafka skips a future already done: the record may still be stored,
  as with any time-out, which stops the wait, not the record).

A deadline fires at most :data:`RESOLUTION_S` late. Entries of finished sends are dropped lazily;
the entries are compacted when finished ones are most of them, so they stay within a small
multiple of the sends in progress.

Entries live in a FIFO while their deadlines come in order (one client's operations mostly share
one time-out, so a later one ends later): an append and a pop from its front, instead of a
heap's sift on both ends (~0.4 us per operation). Only a deadline earlier than the FIFO's last
(a shorter time-out) goes to the heap; the timer serves the earlier of the two fronts.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
from typing import Any

#: How late a deadline may fire: timers are armed no more often than this (seconds).
RESOLUTION_S = 0.005

# entry: [deadline, seq, task (while enqueuing) or None, ack future or None, state,
#         the task's cancelling() count when watched]
_DEADLINE, _SEQ, _TASK, _FUT, _STATE, _CANCELLING = range(6)
_LIVE, _DONE, _EXPIRED, _CANCELLED = 0, 1, 2, 3


class Deadlines:
    """The deadlines of one client's operations in progress (one event loop)."""

    __slots__ = ("_fifo", "_heap", "_seq", "_timer", "_timer_at", "_compact_at")

    def __init__(self) -> None:
        self._fifo: collections.deque[list[Any]] = collections.deque()  # deadlines in order
        self._heap: list[list[Any]] = []  # the others
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._compact_at = 1024  # heap length that triggers dropping finished entries

    def enqueue(
        self,
        loop: asyncio.AbstractEventLoop,
        deadline: float,
        ack: asyncio.Future[Any] | None = None,
    ) -> list[Any]:
        """Watch the current task until :meth:`wait_ack` or :meth:`done`: it is cancelled at
        ``deadline`` (see :meth:`expired`). Returns the entry the other calls take. With
        ``ack`` (a record handed over without an await: no task to watch), the entry starts
        where :meth:`wait_ack` would put it: the deadline fails ``ack``."""
        entry: list[Any]
        if ack is None:
            task = asyncio.current_task(loop)
            entry = [deadline, 0, task, None, _LIVE, task.cancelling() if task else 0]
        else:
            entry = [deadline, 0, None, ack, _LIVE, 0]
        # Finished entries at the front go now: deadlines mostly grow with time (one time-out
        # per producer or consumer), so the front is the oldest entry and usually done. Left
        # for the compaction, every entry would outlive young-generation collections (a
        # consumer ran ten times as many as with asyncio.timeout).
        fifo = self._fifo
        while fifo and fifo[0][_STATE] != _LIVE:
            fifo.popleft()
        if not fifo or fifo[-1][_DEADLINE] <= deadline:
            fifo.append(entry)
        else:
            heap = self._heap
            while heap and heap[0][_STATE] != _LIVE:
                heapq.heappop(heap)
            entry[_SEQ] = next(self._seq)  # (equal deadlines never compare their tasks)
            heapq.heappush(heap, entry)
        if len(fifo) + len(self._heap) > self._compact_at:
            self._compact()
        if self._timer is None or deadline + RESOLUTION_S < self._timer_at:
            self._arm(loop, deadline)
        return entry

    @staticmethod
    def wait_ack(entry: list[Any], fut: asyncio.Future[Any]) -> None:
        """The record is handed over: from now on the deadline fails ``fut``, not the task."""
        entry[_TASK] = None
        entry[_FUT] = fut

    @staticmethod
    def done(entry: list[Any]) -> None:
        """The send attempt ended (any way): forget its deadline."""
        if entry[_STATE] == _LIVE:
            entry[_STATE] = _DONE
        entry[_TASK] = entry[_FUT] = None

    @staticmethod
    def expired(entry: list[Any]) -> bool:
        """Call on CancelledError, from the task that registered ``entry``: True when the
        cancellation was the deadline's alone (it is then withdrawn from the task, and the caller
        raises TimeoutError instead), False when it must propagate (the task was cancelled from
        outside too). The same contract as ``asyncio.timeout_at``."""
        if entry[_STATE] != _CANCELLED:
            return False
        task = asyncio.current_task()
        if task is None:
            return False
        return bool(task.uncancel() <= entry[_CANCELLING])

    def _compact(self) -> None:
        """Drop every finished entry (a live one at a front keeps those behind it)."""
        self._fifo = collections.deque(e for e in self._fifo if e[_STATE] == _LIVE)
        heap = self._heap
        heap[:] = [e for e in heap if e[_STATE] == _LIVE]
        heapq.heapify(heap)
        self._compact_at = max(1024, 4 * (len(self._fifo) + len(heap)))

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        at = max(at, loop.time() + RESOLUTION_S)
        self._timer_at = at
        self._timer = loop.call_at(at, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0][_DEADLINE] <= now:
            self._expire(fifo.popleft())
        while heap and heap[0][_DEADLINE] <= now:
            self._expire(heapq.heappop(heap))
        if fifo or heap:
            if not heap:
                self._arm(loop, fifo[0][_DEADLINE])
            elif not fifo:
                self._arm(loop, heap[0][_DEADLINE])
            else:
                self._arm(loop, min(fifo[0][_DEADLINE], heap[0][_DEADLINE]))

    @staticmethod
    def _expire(entry: list[Any]) -> None:
        if entry[_STATE] != _LIVE:
            return
        entry[_STATE] = _EXPIRED
        fut, task = entry[_FUT], entry[_TASK]
        if fut is not None:
            entry[_FUT] = None
            if not fut.done():
                fut.set_exception(TimeoutError("no acknowledgement before the send deadline"))
        elif task is not None and not task.done():
            entry[_STATE] = _CANCELLED
            task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
