"""Wait on conditions with deadlines — never a fixed sleep as synchronisation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float = 20.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Await ``probe()`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
            if last:
                return last
        except Exception as exc:  # keep polling; report the last error on time-out
            last_exc = exc
        await asyncio.sleep(interval)
    raise AssertionError(
        f"{what} not reached within {timeout}s (last={last!r}, error={last_exc!r})"
    )


def eventually_sync(
    probe: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"
) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout}s (last={last!r})")
