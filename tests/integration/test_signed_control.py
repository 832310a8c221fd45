"""Signed control and admin records on the real stack (issue 13): unsigned, forged, expired,
replayed and wrong-role records on the control and admin topics are refused and counted, the
valid records around them applied; a forged registration pointing a topic at another bootstrap
changes no route; a verifier without keys does not start.

(Key rotation, which restarts the verifiers: tests/faults/test_key_rotation.py.)"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from tracemq.admin import AdminClient
from tracemq.errors import AdminError
from tracemq.protocol import admin as admin_proto
from tracemq.protocol import control
from tracemq.protocol.admin import ADMIN_TOPIC
from tracemq.protocol.signing import Signer, seal
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually
from tracemq_nameserver.registry import RegistryWriter

from tests.support.metrics import scrape
from tests.support.signing import sealed

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

CONTROL_TOPIC = "tracemq.namesrv"
REASONS = ("unsigned", "forged", "expired", "replayed", "wrong_role")
#: the verifiers' default TRACEMQ_AUTH_MAX_AGE_MS
MAX_AGE_MS = 300_000


def _metrics(stack: EmbeddedStack, name: str) -> str:
    return f"http://127.0.0.1:{stack.processes[name].env['TRACEMQ_HTTP_PORT']}/metrics"


def _rejected(url: str, counter: str) -> dict[str, float]:
    return {
        dict(labels).get("reason", ""): v
        for (metric, labels), v in scrape(url).items()
        if metric == counter
    }


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {r: after.get(r, 0) - before.get(r, 0) for r in REASONS}


def _now() -> int:
    return int(time.time() * 1000)


def _register(name: str, topic: str, bootstrap: str, cluster: str = "SignedCluster") -> bytes:
    return control.encode(
        control.BrokerRegister(
            type="broker.register",
            ts=_now(),
            broker=control.BrokerInfo(
                cluster=cluster, broker_name=name, address="127.0.0.1:1", data_bootstrap=bootstrap
            ),
            topics={topic: control.TopicConfig(read_queues=1, write_queues=1)},
        )
    )


def _forged(body: bytes, kid: str, purpose: str = "control") -> bytes:
    """Signed with the right key id and a guessed secret."""
    return seal(purpose, kid, "guessed-secret-0123456789", body)  # type: ignore[arg-type]


@pytest.fixture
async def producer(stack: EmbeddedStack) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(bootstrap_servers=stack.business_bootstrap)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def _a_recent_heartbeat(bootstrap: str, broker: str) -> bytes:
    """The bytes of one of ``broker``'s real, signed heartbeats, read off the control topic."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(CONTROL_TOPIC) or set()
        tps = [TopicPartition(CONTROL_TOPIC, p) for p in parts]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(0, ends[tp] - 20))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for rec in (r for recs in batch.values() for r in recs):
                if rec.key == broker.encode() and rec.value:
                    return rec.value
        raise AssertionError(f"no heartbeat of {broker} on {CONTROL_TOPIC}")
    finally:
        await consumer.stop()


@pytest.mark.timeout(120)
async def test_bad_control_records_are_refused_and_counted_around_valid_ones(
    stack: EmbeddedStack, producer: AIOKafkaProducer, registry: RegistryReader, unique: str
) -> None:
    url = _metrics(stack, "nameserver")
    counter = "tracemq_namesrv_control_rejected_total"
    broker_kid = stack.secrets.signing["broker"][0]
    boot = stack.business_bootstrap
    async with AdminClient(boot, stack.redis_url) as admin:
        target = f"Target_{unique}"
        await admin.create_topic("broker-a", target, read_queues=2, write_queues=2)
    before = _rejected(url, counter)
    valid_a = sealed(_register(f"sig-a-{unique}", f"SA_{unique}", boot))
    captured = await _a_recent_heartbeat(boot, "broker-a")
    refused = {
        "unsigned": _register(f"sig-u-{unique}", f"SU_{unique}", boot),
        "forged": _forged(_register(f"sig-f-{unique}", f"SF_{unique}", boot), broker_kid),
        "unknown_kid": seal(
            "control", f"nobody-{unique}", "x" * 24, _register(f"sig-n-{unique}", "SN", boot)
        ),
        "expired": sealed(
            _register(f"sig-e-{unique}", f"SE_{unique}", boot), ts=_now() - MAX_AGE_MS - 60_000
        ),
        "replayed": valid_a,  # the same bytes again, at another offset
        "wrong_role": sealed(_register(f"sig-w-{unique}", f"SW_{unique}", boot), role="client"),
        # the attack of the issue: broker-a's topic pointed at another Kafka, without its key
        "forged_route": _forged(
            _register("broker-a", target, "evil.example:9092", cluster="DefaultCluster"),
            broker_kid,
        ),
    }
    valid_b = sealed(_register(f"sig-b-{unique}", f"SB_{unique}", boot))
    key = f"sig-{unique}".encode()  # one key: one partition, so the order below is kept
    await producer.send_and_wait(CONTROL_TOPIC, valid_a, key=key)
    for value in refused.values():
        await producer.send_and_wait(CONTROL_TOPIC, value, key=key)
    # a captured real heartbeat of broker-a, replayed (on broker-a's own partition)
    await producer.send_and_wait(CONTROL_TOPIC, captured, key=b"broker-a")
    await producer.send_and_wait(CONTROL_TOPIC, valid_b, key=key)

    async def both_routed() -> bool:
        a = await registry.topic_route(f"SA_{unique}")
        b = await registry.topic_route(f"SB_{unique}")
        return a.brokers == [f"sig-a-{unique}"] and b.brokers == [f"sig-b-{unique}"]

    await eventually(both_routed, timeout=20, what="the valid registrations around the bad ones")

    async def all_counted() -> bool:
        return _delta(before, _rejected(url, counter)) == {
            "unsigned": 1,
            "forged": 3,  # wrong secret, unknown key id, the forged route
            "expired": 1,
            "replayed": 2,  # the copy of valid_a, broker-a's captured heartbeat
            "wrong_role": 1,
        }

    await eventually(all_counted, timeout=10, what=f"rejections counted {before}")
    brokers = await registry.brokers()
    for c in "unfew":
        assert f"sig-{c}-{unique}" not in brokers
    route = await registry.topic_route(target)
    assert route.brokers == ["broker-a"]
    assert {q.data_bootstrap for q in route.queues} == {boot}, "a forged record moved a route"
    assert brokers["broker-a"]["cluster"] == "DefaultCluster"


def _admin_request(op: admin_proto.AdminOp, body: dict[str, object]) -> bytes:
    return admin_proto.encode(
        admin_proto.AdminRequest(
            type=op, request_id=uuid.uuid4().hex, broker="broker-a", ts=_now(), body=body
        )
    )


@pytest.mark.timeout(120)
async def test_bad_admin_records_are_refused_and_counted_around_valid_ones(
    stack: EmbeddedStack, producer: AIOKafkaProducer, unique: str
) -> None:
    url = _metrics(stack, "broker-a")
    counter = "tracemq_broker_admin_rejected_total"
    admin_kid = stack.secrets.signing["admin"][0]

    def create(topic: str) -> bytes:
        return _admin_request("topic.create", {"topic": topic, "read_queues": 1, "write_queues": 1})

    async with AdminClient(stack.business_bootstrap, stack.redis_url) as admin:
        victim = f"Victim_{unique}"
        await admin.create_topic("broker-a", victim, read_queues=1, write_queues=1)
        before = _rejected(url, counter)
        delete = sealed(_admin_request("topic.delete", {"topic": victim}), "admin", "admin")
        refused = [
            create(f"AU_{unique}"),  # unsigned
            _forged(create(f"AF_{unique}"), admin_kid, "admin"),
            sealed(create(f"AE_{unique}"), "admin", "admin", ts=_now() - MAX_AGE_MS - 60_000),
            sealed(create(f"AW_{unique}"), "client", "admin"),  # a client key may not create
            sealed(create(f"AB_{unique}"), "broker", "admin"),
        ]
        for value in refused:
            await producer.send_and_wait(ADMIN_TOPIC, value, key=b"broker-a")
        await producer.send_and_wait(ADMIN_TOPIC, delete, key=b"broker-a")

        async def victim_deleted() -> bool:
            return victim not in (await admin.list_topics("broker-a"))["topics"]

        await eventually(victim_deleted, timeout=20, what="the valid, signed delete applied")
        await admin.create_topic("broker-a", victim, read_queues=1, write_queues=1)
        # the captured delete, replayed: the topic made again must stay
        await producer.send_and_wait(ADMIN_TOPIC, delete, key=b"broker-a")
        listed = (await admin.list_topics("broker-a"))["topics"]  # handled after the replay
        assert victim in listed
        for c in "UFEWB":
            assert f"A{c}_{unique}" not in listed
    # a real requester holding a client key is told why, not left to time out
    client_key = Signer(*stack.secrets.signing["client"])
    async with AdminClient(stack.business_bootstrap, stack.redis_url, signer=client_key) as cli:
        with pytest.raises(AdminError, match="not authorized: key .* has role 'client'"):
            await cli.create_topic("broker-a", f"AC_{unique}", wait_route=False)
    assert _delta(before, _rejected(url, counter)) == {
        "unsigned": 1,
        "forged": 1,
        "expired": 1,
        "replayed": 1,
        "wrong_role": 3,
    }


@pytest.mark.parametrize(
    ("service", "variable"),
    [("nameserver", "TRACEMQ_AUTH_BROKER_KEYS"), ("broker", "TRACEMQ_AUTH_ADMIN_KEYS")],
)
def test_a_verifier_without_keys_does_not_start(service: str, variable: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")}
    res = subprocess.run(
        [*tracemq_command(), service], capture_output=True, text=True, timeout=30, env=env
    )
    assert res.returncode == 2, res.stderr
    assert variable in res.stderr and "TRACEMQ_AUTH_DISABLED" in res.stderr


async def test_the_shared_replay_guard_tells_a_re_read_from_a_replay(
    stack: EmbeddedStack, unique: str
) -> None:
    """What lets HA nameservers share one guard: the first reader's coordinates win; the same
    coordinates again (a re-delivery after a crash or a rebalance, by any nameserver) pass, a
    copy elsewhere does not; the memory expires with the signature's age."""
    redis = connect(stack.redis_url)
    try:
        writer = RegistryWriter(redis, "tmq:")
        key = f"kb:{unique}"
        assert await writer.mark_seen(key, "tracemq.namesrv/1/10", 60_000)
        assert await writer.mark_seen(key, "tracemq.namesrv/1/10", 60_000)
        assert not await writer.mark_seen(key, "tracemq.namesrv/2/7", 60_000)
        assert 0 < await redis.pttl(f"tmq:seen:{key}") <= 60_000
    finally:
        await redis.aclose()
