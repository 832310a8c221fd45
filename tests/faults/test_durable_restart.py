"""The durable embedded stack: a Kafka cluster (Tansu on its S3 store) that is SIGKILLed and
started again keeps its topics, records and committed offsets, so the collector and consumers
go on where they were: every trace stored exactly once, no redelivery, nothing lost."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.naming import kafka_topic
from tracemq_collector.store import stored_events
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.waiting import eventually

from tests.conftest import _SESSION_STACKS, SESSION_SECRETS, TEST_SERVICE_ENV

TRACE_KTOPIC = kafka_topic("trace-broker", "RMQ_SYS_TRACE_TOPIC")
COLLECTOR_GROUP = "tracemq-collector"


@pytest.fixture(scope="module")
def durable_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """One durable stack for the module: its S3 store starts in about a second, the services
    are what take time; each test kills a different cluster."""
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("durable"),
            service_env=dict(TEST_SERVICE_ENV),
            with_collector=True,
            durable=True,
            secrets=SESSION_SECRETS,
        )
    )
    _SESSION_STACKS.append(s)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


def _env(s: EmbeddedStack) -> dict[str, str]:
    return {"redis_url": s.redis_url, "control_bootstrap": s.business_bootstrap}


async def _committed(bootstrap: str, group: str, tps: list[TopicPartition]) -> dict[Any, Any]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        return {tp: await c.committed(tp) for tp in tps}
    finally:
        await asyncio.wait_for(c.stop(), 10)


async def _records(bootstrap: str, tp: TopicPartition, upto: int) -> list[int]:
    """Offsets readable in ``tp`` from 0 up to ``upto`` (exclusive)."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        c.assign([tp])
        c.seek(tp, 0)
        got: list[int] = []
        deadline = asyncio.get_running_loop().time() + 20
        while len(got) < upto and asyncio.get_running_loop().time() < deadline:
            batch = await c.getmany(tp, timeout_ms=500)
            got += [m.offset for m in batch.get(tp, []) if m.offset < upto]
        return got
    finally:
        await asyncio.wait_for(c.stop(), 10)


def _pubs(s: EmbeddedStack) -> dict[str, list[int]]:
    """msgId -> trace offsets of its stored Pub events, from the collector's store."""
    out: dict[str, list[int]] = {}
    for e in stored_events(s.workdir / "data" / "collector" / "traces.db"):
        if e["trace_type"] == "Pub":
            out.setdefault(e["msg_id"], []).append(e["trace_offset"])
    return out


@pytest.mark.timeout(240)
async def test_trace_cluster_restart_keeps_traces_and_collector_offsets(
    durable_stack: EmbeddedStack, unique: str
) -> None:
    s = durable_stack
    topic = f"TopicDurableT_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    producer = Producer(f"PG_durable_{unique}", enable_msg_trace=True, **_env(s))
    await producer.start()
    try:
        before = [(await producer.send(Message(topic, b"a"))).msg_id for _ in range(15)]

        async def stored(ids: list[str]) -> bool:
            pubs = await asyncio.to_thread(_pubs, s)
            return all(m in pubs for m in ids)

        await eventually(lambda: stored(before), timeout=60, what="traces before the restart")
        tp = TopicPartition(TRACE_KTOPIC, 0)

        # the collector commits after its store and lake are durable: wait for that commit
        async def committed_all() -> int | None:
            c = (await _committed(s.trace_bootstrap, COLLECTOR_GROUP, [tp]))[tp]
            offs = await asyncio.to_thread(_pubs, s)
            top = max(o for m in before for o in offs[m])
            return c if c is not None and c > top else None

        committed = await eventually(committed_all, timeout=60, what="collector commit")

        s.kill_infra("kafka-trace")
        s.restart_infra("kafka-trace")

        # the committed offset and the records below it are still there
        assert (await _committed(s.trace_bootstrap, COLLECTOR_GROUP, [tp]))[tp] == committed
        assert await _records(s.trace_bootstrap, tp, committed) == list(range(committed))

        after = [(await producer.send(Message(topic, b"b"))).msg_id for _ in range(15)]
        await eventually(lambda: stored(after), timeout=90, what="traces after the restart")
    finally:
        await producer.shutdown()
    pubs = await asyncio.to_thread(_pubs, s)
    assert {m: len(pubs[m]) for m in before + after} == {m: 1 for m in before + after}
    # new trace messages continued the log instead of reusing offsets the store already holds
    assert min(pubs[m][0] for m in after) >= committed
    assert s.processes["collector"].alive()


@pytest.mark.timeout(240)
async def test_business_cluster_restart_keeps_a_consumers_committed_offset(
    durable_stack: EmbeddedStack, unique: str
) -> None:
    s = durable_stack
    topic, group = f"TopicDurableB_{unique}", f"CG_durable_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    consumed: list[str] = []

    async def on(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        consumed.extend(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def consumer() -> PushConsumer:
        c = PushConsumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET, **_env(s))
        c.subscribe(topic, "*")
        c.register_message_listener(on)
        return c

    producer = Producer(f"PG_durableB_{unique}", **_env(s))
    await producer.start()
    try:
        first = {(await producer.send(Message(topic, b"1"))).msg_id for _ in range(12)}
        c1 = consumer()
        await c1.start()
        try:
            await eventually(
                lambda: _async(set(consumed) >= first), timeout=60, what="first half consumed"
            )
        finally:
            await c1.shutdown()  # commits what was consumed
        tps = [TopicPartition(kafka_topic("broker-a", topic), q) for q in range(2)]
        committed = await _committed(s.business_bootstrap, group, tps)
        assert sum(committed.values()) == len(first), committed

        s.kill_infra("kafka-business")
        s.restart_infra("kafka-business")

        assert await _committed(s.business_bootstrap, group, tps) == committed

        second: list[str] = []

        async def send_second() -> bool:
            # only acknowledged sends are recorded; the connection to the restarted cluster may
            # need a retry
            while len(second) < 12:
                second.append((await producer.send(Message(topic, b"2"))).msg_id)
            return True

        await eventually(send_second, timeout=60, what="sends after the restart")
        consumed.clear()
        c2 = consumer()
        await c2.start()
        try:
            await eventually(
                lambda: _async(set(consumed) >= set(second)),
                timeout=90,
                what="second half consumed",
            )
        finally:
            await c2.shutdown()
    finally:
        await producer.shutdown()
    # resumed at the committed offset: nothing of the first half again, nothing lost
    assert sorted(consumed) == sorted(second)


async def _async(v: bool) -> bool:
    return v
