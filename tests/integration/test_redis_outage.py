"""Redis down: a client with cached routes keeps resolving them; Redis back: changes flow again."""

from __future__ import annotations

import pytest
from tracemq.admin import AdminClient
from tracemq.routing import RegistryReader, RouteCache
from tracemq.routing.cache import ROUTE_REFRESH_ERRORS
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


async def test_cached_routes_survive_a_redis_outage(
    stack: EmbeddedStack, admin: AdminClient, registry: RegistryReader, unique: str
) -> None:
    topic = f"Outage_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)

    async def routed() -> bool:
        return bool((await registry.topic_route(topic)).queues)

    await eventually(routed, what="route")
    cache = RouteCache(stack.redis_url, refresh_interval_s=0.5)
    await cache.start()
    try:
        before = (await cache.require(topic)).queues
        assert [q.broker for q in before] == ["broker-a"]
        errors_before = ROUTE_REFRESH_ERRORS._value.get()

        stack.stop_redis()
        try:
            # Forced refreshes fail, yet the last good route is served and the failures counted.
            for _ in range(3):
                assert (await cache.get(topic, refresh=True)).queues == before
            assert (await cache.require(topic)).queues == before
            assert ROUTE_REFRESH_ERRORS._value.get() >= errors_before + 3
            assert cache.last_error is not None
        finally:
            stack.restart_redis()

        # Redis is back: an update made now reaches the cache through the change channel
        # (or the periodic refresh) without the client asking.
        await admin.update_topic("broker-a", topic, write_queues=2)

        async def updated() -> bool:
            cached = cache.cached(topic)
            return cached is not None and cached.queues[0].write_queues == 2

        await eventually(updated, timeout=15, what="cache sees the update after Redis is back")
        assert cache.last_error is None
    finally:
        await cache.stop()
