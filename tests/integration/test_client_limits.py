"""Message size limit, batch validation and the trace of a failed send, on the embedded stack
(issue 22 items 3-5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from tracemq import Message, Producer, SendError
from tracemq.admin import AdminClient
from tracemq.message import InvalidMessageError
from tracemq.naming import kafka_topic
from tracemq.transport import (
    MAX_MESSAGE_SIZE,
    TRANSPORT_MAX_BYTES,
    admin_client,
    delete_topic,
    partition_count,
)
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.reading import read_topic
from tracemq_devkit.waiting import eventually

from tests.integration.test_collector import api, http

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

MiB = 1024 * 1024


async def _topic_config(bootstrap: str, ktopic: str) -> dict[str, str]:
    async with admin_client(bootstrap) as admin:
        resp = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, ktopic)])
    return {e[0]: e[1] for r in resp for res in r.resources for e in res[4]}


@pytest.mark.timeout(90)
async def test_one_size_limit_that_the_transport_honours(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = f"Big_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    ktopic = kafka_topic("broker-a", topic)
    async with Producer(f"PG_{unique}", **env) as p:
        assert p.max_message_size == MAX_MESSAGE_SIZE
        # between aiokafka's default 1 MiB and the 4 MiB limit: stored, also when delayed
        # (the broker's schedule service re-writes it to the real queue)
        big = await p.send(Message(topic, b"b" * (3 * MiB), keys=["big"]))
        late = await p.send(Message(topic, b"d" * (3 * MiB), delay_level=1))
        assert big.queue.topic == topic and late.msg_id != big.msg_id
        # just under the limit with its headers: the check and the transport agree
        near = await p.send(Message(topic, b"n" * (MAX_MESSAGE_SIZE - 2048)))
        # the body alone fits, the properties make the record too large: refused up front
        with pytest.raises(InvalidMessageError) as info:
            await p.send(Message(topic, b"x" * (MAX_MESSAGE_SIZE - 1024), properties={"pad": "p" * 4096}))  # fmt: skip
        text = str(info.value)
        assert "exceeds max_message_size 4194304" in text and "properties and headers" in text

    async def stored() -> list[Any] | None:
        recs = await read_topic(stack.business_bootstrap, ktopic, timeout_s=20)
        return recs if len(recs) == 3 else None

    recs = await eventually(stored, timeout=30, what="both 3 MiB and the 4 MiB message stored")
    by_id = {r.headers.get("UNIQ_KEY"): r for r in recs}
    assert len(by_id[big.msg_id].value) == 3 * MiB
    assert len(by_id[late.msg_id].value) == 3 * MiB  # delivered when due
    assert len(by_id[near.msg_id].value) == MAX_MESSAGE_SIZE - 2048
    # the topic says what it takes (a Kafka broker enforces it; Tansu records it)
    cfg = await _topic_config(stack.business_bootstrap, ktopic)
    assert cfg.get("max.message.bytes") == str(TRANSPORT_MAX_BYTES), cfg
    # a producer cannot be configured above what the transport takes
    with pytest.raises(ValueError, match="max_message_size must be an int in 1..4194304"):
        Producer(f"PG_{unique}", max_message_size=MAX_MESSAGE_SIZE + 1, **env)


@pytest.mark.timeout(60)
async def test_a_batch_is_validated_whole_before_anything_is_sent(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = f"BigBatch_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    ktopic = kafka_topic("broker-a", topic)
    async with Producer(f"PG_{unique}", **env) as p:
        batch = [Message(topic, f"m{i}".encode()) for i in range(10)]
        # member 3's body is within the limit, its record (properties) is not
        batch[3] = Message(topic, b"x" * (MAX_MESSAGE_SIZE - 4096), properties={"pad": "p" * 8192})
        with pytest.raises(InvalidMessageError, match="batch member 3: .*nothing was sent"):
            await p.send_batch(batch)
        assert await read_topic(stack.business_bootstrap, ktopic) == []
        # a member between 1 MiB and 4 MiB is one the transport takes: the whole batch is stored
        batch[3] = Message(topic, b"y" * (3 * MiB))
        results = await p.send_batch(batch)
    assert len(results) == 10 and len({r.msg_id for r in results}) == 10
    recs = await read_topic(stack.business_bootstrap, ktopic, timeout_s=20)
    assert sorted(r.headers["UNIQ_KEY"] for r in recs) == sorted(r.msg_id for r in results)


class _Attempts:
    def __init__(self) -> None:
        self.after: list[Any] = []

    def send_message_before(self, context: Any) -> None:
        pass

    def send_message_after(self, context: Any) -> None:
        self.after.append(context)


@pytest.mark.timeout(90)
async def test_failed_send_traces_every_attempt_and_no_store_host(
    stack: EmbeddedStack,
    admin: AdminClient,
    env: dict[str, str],
    collector: ManagedProcess,
    unique: str,
) -> None:
    topic = f"Lost_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    ktopic = kafka_topic("broker-a", topic)
    # The route keeps 4 queues while the Kafka topic underneath loses partitions 1-3: a send
    # to any of them fails in the transport, as a real send to a lost partition does.
    async with admin_client(stack.business_bootstrap) as kadmin:
        await delete_topic(kadmin, ktopic)

        async def recreated() -> bool:
            if await partition_count(kadmin, ktopic) is None:
                await kadmin.create_topics([NewTopic(ktopic, 1, 1)])
            return await partition_count(kadmin, ktopic) == 1

        await eventually(recreated, timeout=20, what=f"{ktopic} re-created with one partition")
    hook = _Attempts()
    async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
        p.register_send_hook(hook)
        # a new producer's round robin starts at queue 1 and, the broker failing, never
        # reaches queue 0: every attempt goes to a lost partition
        with pytest.raises(SendError, match="after 3 attempt"):
            await p.send(Message(topic, b"never stored", keys=[f"lost-{unique}"]))
    msg_id = hook.after[0].msg_id
    base = api(collector)
    last: list[Any] = []

    async def view() -> dict[str, Any] | None:
        status, body = await asyncio.to_thread(http, f"{base}/api/v1/traces/{msg_id}")
        last[:] = [status, body]
        prod = body.get("producer") if status == 200 else None
        return body if prod and prod["send_attempts"] == 3 else None

    try:
        body = await eventually(view, timeout=20, what="a view with three send attempts")
    except AssertionError:
        raise AssertionError(f"last answer {last!r}") from None
    prod = body["producer"]
    assert prod["success"] is False and prod["store_host"] is None and not prod["offset_msg_id"]
    pubs = [e for e in body["events"] if e["trace_type"] == "Pub"]
    assert len(pubs) == 3
    assert all(e["success"] is False and e["store_host"] is None for e in pubs)
    # the hooks ran once per attempt, as RocketMQ's do
    assert [c.attempt for c in hook.after] == [1, 2, 3]
    assert all(c.exception is not None and c.send_result is None for c in hook.after)
