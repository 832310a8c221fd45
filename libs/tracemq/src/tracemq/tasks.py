"""The background tasks one owner (a client, a service, a route cache) starts and must end.

:class:`TaskGroup` (and :func:`cancel_and_wait` for a collection an owner keeps itself) is the
one place the "start loops, and at stop cancel them all and wait"
pattern lives. Its guarantees:

- :meth:`TaskGroup.aclose` cancels every task still running and awaits each one, so no task
  outlives its owner's stop (no "Task was destroyed but it is pending"); it is idempotent, and
  a group closed refuses new tasks (:class:`~tracemq.errors.ClientStateError`) instead of
  leaking them. A task may close its own group: it is cancelled last, never awaited by itself.
- A task's failure is never lost: when a task raises (other than by being cancelled) it is
  logged at once with its traceback, and :meth:`aclose` returns the exceptions of the tasks that
  failed (the last :data:`KEPT_ERRORS` of them), for an owner that wants to re-raise or report.
- The caller's own cancellation propagates out of :meth:`aclose` (the tasks are cancelled
  still); the cancelled tasks' ``CancelledError`` does not.
- Finished tasks leave the group at once, so a group of many short tasks (one per request)
  stays as small as what runs.

A service hands ``spawner=tracemq.service.spawn`` so that its loops are its life (a loop that
dies stops the service, see :mod:`tracemq.service`); the spawner then does the logging.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from tracemq.errors import ClientStateError
from tracemq.log import get_logger

T = TypeVar("T")
Spawner = Callable[..., "asyncio.Task[Any]"]

#: failures a group keeps for :meth:`TaskGroup.aclose` (a group of short tasks could fail often)
KEPT_ERRORS = 64

log = get_logger("tasks")


class TaskGroup:
    """Tasks owned by ``owner`` (a name for the logs); see the module docstring."""

    def __init__(self, owner: str, *, spawner: Spawner | None = None) -> None:
        self.owner = owner
        self._spawner = spawner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._errors: collections.deque[BaseException] = collections.deque(maxlen=KEPT_ERRORS)
        self._spawned = 0
        self._ended = 0
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start ``coro`` as a task of this group."""
        if self._closed:
            coro.close()  # never awaited: say nothing about it
            raise ClientStateError(f"{self.owner}: its tasks are stopped; cannot start {name!r}")
        if self._spawner is not None:
            task: asyncio.Task[T] = self._spawner(coro, name=name)
        else:
            task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        self._spawned += 1
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        self._ended += 1
        exc = task.exception()
        if exc is None:
            return
        self._errors.append(exc)
        if self._spawner is None:  # a spawner (tracemq.service.spawn) reports deaths itself
            log.error(
                "task failed",
                owner=self.owner,
                task=task.get_name(),
                error=f"{exc.__class__.__name__}: {exc}",
                exc_info=exc,
            )

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> bool:
        """True while tasks were started, none has ended by itself, and the group is open: the
        health of an owner whose tasks are loops that run until cancelled."""
        return not self._closed and self._spawned > 0 and self._ended == 0

    async def aclose(self) -> list[BaseException]:
        """Cancel every task and wait for them all; the exceptions of those that failed."""
        self._closed = True
        me = asyncio.current_task()
        await cancel_and_wait(self._tasks)
        errors = list(self._errors)
        self._errors.clear()
        if me is not None and me in self._tasks:
            me.cancel()  # a task that closed its own group ends at its next await
        return errors


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` (a collection an owner keeps for its own reasons: in-flight forwards,
    pending replies) and wait for each to end. Their exceptions are awaited, not raised: an owner
    that needs them reads them where it keeps the tasks; the caller's own cancellation
    propagates."""
    pending = [t for t in tasks if t is not asyncio.current_task()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
