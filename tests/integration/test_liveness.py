"""Brokers and nameservers coming and going: expiry after SIGKILL, graceful unregister, restart
with the persisted topic table, and two nameservers with one killed."""

from __future__ import annotations

import time

import pytest
from tracemq.admin import AdminClient
from tracemq.routing import RegistryReader
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

from tests.support.metrics import value

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

EXPIRY_S = 8.0  # TRACEMQ_NAMESRV_EXPIRY_MS of the test stack


async def _routed(registry: RegistryReader, topic: str, broker: str) -> bool:
    return broker in (await registry.topic_route(topic)).brokers


async def test_killed_broker_expires_and_comes_back_with_its_topics(
    stack: EmbeddedStack, admin: AdminClient, registry: RegistryReader, unique: str
) -> None:
    name, topic = f"bk-{unique}", f"Kill_{unique}"
    stack.start_broker(name)
    try:
        await eventually(lambda: _has_broker(registry, name), what="broker registered")
        await admin.create_topic(name, topic, read_queues=3, write_queues=3)
        await eventually(lambda: _routed(registry, topic, name), what="route")

        killed_at = time.monotonic()
        stack.processes[name].kill()
        # Still routed right after the crash: nothing told the nameserver.
        assert await _routed(registry, topic, name)

        async def expired() -> bool:
            return not await _routed(registry, topic, name)

        await eventually(expired, timeout=EXPIRY_S + 10, what="expiry of the killed broker")
        assert time.monotonic() - killed_at >= EXPIRY_S - 2.5  # removed by expiry, not earlier
        assert name not in await registry.brokers()

        stack.restart(name)
        await eventually(
            lambda: _routed(registry, topic, name),
            timeout=15,
            what="restarted broker routes its persisted topic",
        )
        q = (await registry.topic_route(topic)).queues[0]
        assert (q.read_queues, q.write_queues) == (3, 3)
    finally:
        stack.processes[name].stop()


async def test_graceful_stop_unregisters_at_once(
    stack: EmbeddedStack, admin: AdminClient, registry: RegistryReader, unique: str
) -> None:
    name, topic = f"bg-{unique}", f"Grace_{unique}"
    stack.start_broker(name)
    try:
        await eventually(lambda: _has_broker(registry, name), what="broker registered")
        await admin.create_topic(name, topic, read_queues=2, write_queues=2)
        await eventually(lambda: _routed(registry, topic, name), what="route")
    finally:
        code = stack.processes[name].stop()
    assert code == 0

    async def gone() -> bool:
        return not (await registry.topic_route(topic)).queues

    # The last heartbeat was at most 1 s before the stop, so expiry could not act for another
    # 7 s: removal within 3 s can only come from the unregister record.
    await eventually(gone, timeout=3, interval=0.05, what="route removed by unregister")
    assert name not in await registry.brokers()


async def test_two_nameservers_one_killed(
    stack: EmbeddedStack, admin: AdminClient, registry: RegistryReader, unique: str
) -> None:
    second = f"nameserver-{unique}"
    stack.start_nameserver(second)
    try:
        stack.processes["nameserver"].kill()
        name, topic = f"bn-{unique}", f"Failover_{unique}"
        stack.start_broker(name)
        try:
            # The survivor takes over the dead peer's partitions after the session timeout.
            await eventually(
                lambda: _has_broker(registry, name),
                timeout=40,
                what="registration handled by the surviving nameserver",
            )
            await admin.create_topic(name, topic, read_queues=2, write_queues=2)
            await eventually(
                lambda: _routed(registry, topic, name),
                timeout=20,
                what="route written by the surviving nameserver",
            )
            # Expiry still runs: broker-a keeps heartbeating and stays registered.
            assert "broker-a" in await registry.brokers()
            # what the dead peer read and did not commit, the survivor read again at the same
            # coordinates: a re-read, applied, not refused as a replay (signatures are shared
            # in Redis with where they were first read)
            survivor = stack.processes[second].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]
            assert value(survivor, "tracemq_namesrv_control_rejected_total", reason="replayed") == 0
        finally:
            stack.processes[name].stop()
    finally:
        stack.restart("nameserver")
        stack.processes[second].stop()
    assert "broker-a" in await registry.brokers()


async def _has_broker(registry: RegistryReader, name: str) -> bool:
    return name in await registry.brokers()
