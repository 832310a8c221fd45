"""Wait on conditions with deadlines — never a fixed sleep as synchronisation. The one copy the
tests (``tests/``) and the benchmarks (``bench/``) share.

Every wait ends: with the probe's first truthy value, or with :class:`WaitTimeout` naming what
was awaited, the last value and the last error once ``timeout`` seconds have passed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition was not reached within its deadline (an :class:`AssertionError`, so a test
    that waits in vain fails rather than errors)."""


@overload
async def eventually(  # type: ignore[overload-overlap]  # an awaitable result is awaited
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    *,
    timeout: float = 20.0,
    interval: float = 0.1,
    what: str = "condition",
) -> Any:
    """Call ``probe()`` (awaiting it if it returns an awaitable) until it gives a truthy value
    and return that; an exception of the probe counts as "not yet". :class:`WaitTimeout` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            last = value
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on time-out
            last_exc = exc
        await asyncio.sleep(interval)
    raise WaitTimeout(f"{what} not reached within {timeout}s (last={last!r}, error={last_exc!r})")


def eventually_sync(
    probe: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"
) -> T:
    """:func:`eventually` for a synchronous probe outside an event loop (its exceptions are
    not swallowed)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise WaitTimeout(f"{what} not reached within {timeout}s (last={last!r})")
