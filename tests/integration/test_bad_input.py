"""Bad input to admin requests and garbage on the control and admin topics: clear errors or
counted rejections; the nameserver and brokers keep running and lose no valid record.
(Poison that must not even need a restart, on every topic at once: tests/faults/test_poison.py.)"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator

import msgpack
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from tracemq.admin import AdminClient
from tracemq.errors import AdminError, InvalidNameError, UnknownBrokerError
from tracemq.naming import kafka_topic
from tracemq.protocol import control
from tracemq.protocol.admin import ADMIN_TOPIC
from tracemq.routing import RegistryReader
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

from tests.support.metrics import value
from tests.support.signing import sealed

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture
async def producer(stack: EmbeddedStack) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(bootstrap_servers=stack.business_bootstrap)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"topic": "has space", "read_queues": 4, "write_queues": 4}, "illegal characters"),
        ({"topic": "x" * 128, "read_queues": 4, "write_queues": 4}, "limit is 127"),
        ({"topic": "", "read_queues": 4, "write_queues": 4}, "topic is empty"),
        ({"topic": "RMQ_SYS_TRACE_TOPIC", "read_queues": 1, "write_queues": 1}, "reserved"),
        ({"topic": "Ok", "read_queues": 0, "write_queues": 4}, "read_queues must be between 1"),
        ({"topic": "Ok", "read_queues": 4, "write_queues": 1025}, "write_queues must be between"),
        ({"topic": "Ok", "read_queues": "4", "write_queues": 4}, "must be an integer"),
        ({"topic": "Ok", "read_queues": 4, "write_queues": 4, "perm": 9}, "perm must be"),
    ],
)
async def test_broker_rejects_bad_admin_requests(
    admin: AdminClient, body: dict[str, object], message: str
) -> None:
    # Straight to the broker, past the client-side checks: the broker validates too.
    with pytest.raises(AdminError, match=message):
        await admin.request("broker-a", "topic.create", body)


async def test_client_side_checks_and_unknown_targets(admin: AdminClient, unique: str) -> None:
    with pytest.raises(InvalidNameError, match="illegal characters"):
        await admin.create_topic("broker-a", "a/b")
    with pytest.raises(InvalidNameError, match="between 1 and 1024"):
        await admin.create_topic("broker-a", f"T{unique}", read_queues=0)
    with pytest.raises(InvalidNameError, match="between 1 and 1024"):
        await admin.create_topic("broker-a", f"T{unique}", write_queues=2000)
    with pytest.raises(UnknownBrokerError, match="unknown broker 'ghost'"):
        await admin.create_topic("ghost", f"T{unique}")
    with pytest.raises(AdminError, match="does not exist"):
        await admin.update_topic("broker-a", f"Never_{unique}", write_queues=2)
    with pytest.raises(AdminError, match="does not exist"):
        await admin.delete_topic("broker-a", f"Never_{unique}")


async def test_admin_topic_garbage_is_skipped(
    stack: EmbeddedStack, admin: AdminClient, producer: AIOKafkaProducer, unique: str
) -> None:
    metrics_url = stack.processes["broker-a"].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]
    before = value(metrics_url, "tracemq_broker_admin_rejected_total", reason="garbage")
    await producer.send_and_wait(ADMIN_TOPIC, os.urandom(64), key=b"broker-a")
    await producer.send_and_wait(ADMIN_TOPIC, b"", key=b"broker-a")
    reply = await admin.create_topic(
        "broker-a", f"AfterGarbage_{unique}", read_queues=1, write_queues=1
    )
    assert reply["created"] is True
    assert value(metrics_url, "tracemq_broker_admin_rejected_total", reason="garbage") >= before + 2


def _register(name: str, topic: str, bootstrap: str) -> control.BrokerRegister:
    return control.BrokerRegister(
        type="broker.register",
        ts=int(time.time() * 1000),
        broker=control.BrokerInfo(
            cluster="GarbageCluster",
            broker_name=name,
            address="127.0.0.1:1",
            data_bootstrap=bootstrap,
        ),
        topics={topic: control.TopicConfig(read_queues=2, write_queues=2)},
    )


async def test_control_topic_garbage_is_counted_and_valid_records_survive(
    stack: EmbeddedStack, producer: AIOKafkaProducer, registry: RegistryReader, unique: str
) -> None:
    ns_metrics = stack.processes["nameserver"].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]

    def skipped(reason: str) -> float:
        return value(ns_metrics, "tracemq_namesrv_control_rejected_total", reason=reason)

    before = {r: skipped(r) for r in ("garbage", "version", "type", "schema")}
    key = f"fake-{unique}".encode()  # one key: one partition, so the order below is kept
    valid_a = _register(f"fake-a-{unique}", f"GA_{unique}", stack.business_bootstrap)
    valid_b = _register(f"fake-b-{unique}", f"GB_{unique}", stack.business_bootstrap)
    now = int(time.time() * 1000)
    garbage = [
        os.urandom(200),
        b"\xc1\xc1\xc1",  # never-used msgpack byte
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"v": 99, "type": "broker.register", "ts": now}),
        msgpack.packb({"v": 1, "type": "broker.explode", "ts": now}),
        msgpack.packb({"v": 1, "type": "broker.register", "ts": now, "broker": {"cluster": "c"}}),
        msgpack.packb(
            {
                "v": 1,
                "type": "client.heartbeat",
                "ts": "yesterday",
                "client_id": "c",
                "group": "g",
                "role": "consumer",
            }
        ),
        sealed(control.encode(_register(f"fake-bad-{unique}", "bad topic name", "x:1"))),
        # finding 1 of issue 20: an unhashable type stopped the nameserver for good
        msgpack.packb({"v": 1, "type": [1]}),
        msgpack.packb({"v": 1, "type": {"broker.register": 1}, "ts": now}),
    ]
    await producer.send_and_wait(stack_control_topic(), sealed(control.encode(valid_a)), key=key)
    for g in garbage:
        await producer.send_and_wait(stack_control_topic(), g, key=key)
    await producer.send_and_wait(stack_control_topic(), sealed(control.encode(valid_b)), key=key)

    async def both_routed() -> bool:
        a = await registry.topic_route(f"GA_{unique}")
        b = await registry.topic_route(f"GB_{unique}")
        return a.brokers == [f"fake-a-{unique}"] and b.brokers == [f"fake-b-{unique}"]

    await eventually(both_routed, timeout=15, what="valid registrations around the garbage")
    assert f"fake-bad-{unique}" not in await registry.brokers()
    assert skipped("garbage") >= before["garbage"] + 2
    assert skipped("version") >= before["version"] + 1
    assert skipped("type") >= before["type"] + 3
    assert skipped("schema") >= before["schema"] + 4
    assert stack.processes["nameserver"].alive()
    assert stack.processes["nameserver"]._http_ok()


def stack_control_topic() -> str:
    return "tracemq.namesrv"


async def test_admin_reply_topic_outside_the_reply_namespace_is_rejected(
    stack: EmbeddedStack, admin: AdminClient, producer: AIOKafkaProducer, unique: str
) -> None:
    """Finding 2 of issue 20: ``reply_topic: "bad name/.."`` stalled the admin loop for 40 s
    (the broker waited for metadata of a topic that cannot exist) and ``broker-a.<business
    topic>`` made the broker write its reply into that business queue."""
    metrics_url = stack.processes["broker-a"].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]
    topic = f"Victim_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    victim = kafka_topic("broker-a", topic)
    before = value(metrics_url, "tracemq_broker_admin_rejected_total", reason="reply_topic")
    for reply_topic in ("bad name/..", victim, f"tracemq.admin.reply.{unique}"):
        request = {
            "v": 1,
            "type": "topic.list",
            "request_id": uuid.uuid4().hex,
            "broker": "broker-a",
            "reply_topic": reply_topic,
        }
        await producer.send_and_wait(ADMIN_TOPIC, msgpack.packb(request), key=b"broker-a")
    # A valid request behind them is answered at once (the old broker was stuck 40 s here).
    listed = await asyncio.wait_for(admin.list_topics("broker-a"), 10)
    assert topic in listed["topics"]
    assert (
        value(metrics_url, "tracemq_broker_admin_rejected_total", reason="reply_topic")
        == before + 3
    )
    # Requests are handled in order, so anything the hostile ones wrote is there by now.
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.business_bootstrap, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(victim, 0)
        assert (await consumer.end_offsets([tp]))[tp] == 0, "a reply landed in a business queue"
    finally:
        await asyncio.wait_for(consumer.stop(), 10)
