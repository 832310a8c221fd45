"""Fault avoidance: a broker that just failed a send is skipped for a while (RocketMQ's
latency fault tolerance, simplified to failures)."""

from __future__ import annotations

import time


class FaultTolerance:
    def __init__(self, isolation_ms: int = 30_000) -> None:
        self.isolation_ms = isolation_ms
        self._until: dict[str, float] = {}

    def failed(self, broker: str) -> None:
        self._until[broker] = time.monotonic() + self.isolation_ms / 1000

    def succeeded(self, broker: str) -> None:
        self._until.pop(broker, None)

    def none_failed(self) -> bool:
        """No broker is being avoided (a failure not yet expired or cleared)."""
        return not self._until

    def available(self, broker: str) -> bool:
        until = self._until.get(broker)
        if until is None:
            return True
        if until <= time.monotonic():
            del self._until[broker]
            return True
        return False
