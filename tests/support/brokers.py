"""Extra brokers with short delay levels and transaction timings, for the schedule, retry and
transaction tests (raw reads of their topics: :func:`tracemq_devkit.reading.read_topic`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tracemq.naming import HALF_TOPIC, SCHEDULE_TOPIC
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import run_coro
from tracemq_devkit.waiting import eventually

#: level n = n * 100 ms, except the last ones (1 s, 2 s) for "not due yet" checks
FAST_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 1s 2s"
FAST_LEVELS_MS = [100, 200, 300, 400, 500, 600, 700, 800, 1000, 2000]
FAST_BROKER_ENV = {
    "TRACEMQ_BROKER_DELAY_LEVELS": FAST_LEVELS,
    "TRACEMQ_BROKER_TRANSACTION_TIMEOUT_MS": "1500",
    "TRACEMQ_BROKER_TRANSACTION_CHECK_INTERVAL_MS": "700",
    "TRACEMQ_BROKER_TRANSACTION_CHECK_MAX": "3",
}


def fast_broker_name(prefix: str = "bf") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def start_fast_broker(stack: EmbeddedStack, name: str, **env: str) -> None:
    """Start a business broker with short levels; return once its services are routed (sync,
    so that module-scoped fixtures can use it)."""
    stack.start_broker(name, **{**FAST_BROKER_ENV, **env})
    wait_routed_sync(stack, name)


@contextmanager
def fast_broker(stack: EmbeddedStack, prefix: str, **env: str) -> Iterator[str]:
    """A fast broker for a module's tests, stopped afterwards."""
    name = fast_broker_name(prefix)
    start_fast_broker(stack, name, **env)
    try:
        yield name
    finally:
        stack.processes[name].stop()


def wait_routed_sync(stack: EmbeddedStack, name: str) -> None:
    """Wait until ``name``'s services are routed (those its environment enables)."""
    env = stack.processes[name].env
    topics = [
        t
        for t, var in (
            (SCHEDULE_TOPIC, "TRACEMQ_BROKER_SCHEDULE_ENABLE"),
            (HALF_TOPIC, "TRACEMQ_BROKER_TRANSACTION_ENABLE"),
        )
        if env.get(var, "true") != "false"
    ]

    async def wait() -> None:
        r = connect(stack.redis_url)
        try:
            await wait_services_routed(RegistryReader(r), name, topics)
        finally:
            await r.aclose()

    run_coro(wait())


async def wait_services_routed(
    registry: RegistryReader, name: str, topics: list[str] | None = None
) -> None:
    async def routed() -> bool:
        if name not in await registry.brokers():
            return False
        for t in topics if topics is not None else [SCHEDULE_TOPIC, HALF_TOPIC]:
            if name not in (await registry.topic_route(t)).brokers:
                return False
        return True

    await eventually(routed, timeout=20, what=f"{name} registered with its services")
