"""The wall clock as tracemq records it: epoch milliseconds, UTC.

Every timestamp tracemq writes (heartbeats, trace times, store and schedule times, Redis
``last_seen``) comes from :func:`now_ms`, so a test or a tool has one clock to reason about.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch (the system clock: it may step)."""
    return time.time_ns() // 1_000_000
