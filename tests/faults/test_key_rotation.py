"""Rotating the broker key (issue 13): while the nameserver holds the old and the new key,
records signed by either are applied; the brokers move to the new key; once the old key is
removed (a restart with the new one only), a record signed by the old key is refused as forged,
and the brokers, signing with the new key, stay registered."""

from __future__ import annotations

import secrets
import time

import pytest
from aiokafka import AIOKafkaProducer
from tracemq.protocol import control
from tracemq.protocol.signing import seal
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

from tests.support.metrics import scrape

CONTROL_TOPIC = "tracemq.namesrv"


def _register(name: str, topic: str, bootstrap: str) -> bytes:
    return control.encode(
        control.BrokerRegister(
            type="broker.register",
            ts=int(time.time() * 1000),
            broker=control.BrokerInfo(
                cluster="RotationCluster",
                broker_name=name,
                address="127.0.0.1:1",
                data_bootstrap=bootstrap,
            ),
            topics={topic: control.TopicConfig(read_queues=1, write_queues=1)},
        )
    )


def _rejected(s: EmbeddedStack) -> dict[str, float]:
    url = f"http://127.0.0.1:{s.processes['nameserver'].env['TRACEMQ_HTTP_PORT']}/metrics"
    return {
        dict(labels).get("reason", ""): v
        for (metric, labels), v in scrape(url).items()
        if metric == "tracemq_namesrv_control_rejected_total"
    }


@pytest.mark.timeout(240)
async def test_two_broker_keys_during_a_rotation_then_only_the_new_one(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    s = fault_stack
    old_kid, old_secret = s.secrets.signing["broker"]
    new_kid, new_secret = f"rotated-{unique}", secrets.token_urlsafe(24)
    boot = s.business_bootstrap
    redis = connect(s.redis_url)
    registry = RegistryReader(redis)
    producer = AIOKafkaProducer(bootstrap_servers=boot)
    await producer.start()

    def restart_nameserver(keys: str) -> None:
        s.processes["nameserver"].stop()
        s.start_nameserver("nameserver", TRACEMQ_AUTH_BROKER_KEYS=keys)

    async def send(kid: str, secret: str, name: str) -> None:
        body = _register(f"{name}-{unique}", f"T_{name}_{unique}", boot)
        await producer.send_and_wait(CONTROL_TOPIC, seal("control", kid, secret, body))

    async def routed(name: str) -> bool:
        return (await registry.topic_route(f"T_{name}_{unique}")).brokers == [f"{name}-{unique}"]

    try:
        # 1. the verifier learns the new key next to the old one: both are valid
        restart_nameserver(f"{old_kid}:{old_secret},{new_kid}:{new_secret}")
        await send(old_kid, old_secret, "old")
        await send(new_kid, new_secret, "new")
        for name in ("old", "new"):
            await eventually(lambda n=name: routed(n), timeout=20, what=f"{name}-key record")

        # 2. the brokers sign with the new key
        for b in ("broker-a", "trace-broker"):
            s.processes[b].stop()
        for b, role in (("broker-a", "business"), ("trace-broker", "trace")):
            s.start_broker(
                b, role, wait=False, TRACEMQ_ACCESS_KEY_ID=new_kid, TRACEMQ_SECRET_KEY=new_secret
            )
        for b in ("broker-a", "trace-broker"):
            s.processes[b].wait_healthy(60)

        # 3. the old key is removed
        restart_nameserver(f"{new_kid}:{new_secret}")
        retired_at = int(time.time() * 1000)
        await send(old_kid, old_secret, "old2")
        await send(new_kid, new_secret, "new2")
        await eventually(lambda: routed("new2"), timeout=20, what="a new-key record after")

        async def brokers_heartbeat_after() -> bool:
            known = await registry.brokers()
            return all(
                b in known and known[b]["last_seen"] > retired_at
                for b in ("broker-a", "trace-broker")
            )

        await eventually(brokers_heartbeat_after, timeout=20, what="new-key broker heartbeats")

        async def old_refused() -> bool:
            return _rejected(s).get("forged", 0) >= 1

        await eventually(old_refused, timeout=10, what="the old-key record counted as forged")
        assert f"old2-{unique}" not in await registry.brokers()
        assert (await registry.topic_route(f"T_old2_{unique}")).brokers == []
        assert not {r for r, n in _rejected(s).items() if n and r not in ("forged", "stale")}
    finally:
        await producer.stop()
        await redis.aclose()
