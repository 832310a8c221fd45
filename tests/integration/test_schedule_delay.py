"""Delay levels end to end on a broker with short levels (100 ms ... 2 s): delivered to the real
queue when due and not before, same msgId, REAL_TOPIC / REAL_QID kept, Pub traced as Delay_Msg;
clear errors for levels out of range; garbage in the schedule topic skipped without loss."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.message import InvalidMessageError, MessageConst
from tracemq.naming import SCHEDULE_TOPIC, kafka_topic
from tracemq.protocol.forwarding import SCHEDULE_OFFSET
from tracemq.trace import MessageType, TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_topic, read_trace_topic
from tracemq_devkit.waiting import eventually

from tests.support.brokers import FAST_LEVELS_MS, fast_broker
from tests.support.metrics import value

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def broker(stack: EmbeddedStack) -> Iterator[str]:
    with fast_broker(stack, "bsd") as name:
        yield name


async def test_delayed_messages_arrive_when_due_with_their_traces(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic = f"Delay_{unique}"
    await admin.create_topic(broker, topic, read_queues=4, write_queues=4)
    received: dict[str, tuple[int, MessageExt]] = {}

    async def listener(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        for m in msgs:
            received[m.msg_id] = (int(time.time() * 1000), m)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        f"CG_{unique}", consume_from=ConsumeFromWhere.FIRST_OFFSET, enable_msg_trace=True, **env
    )
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    await consumer.start()
    sent: dict[str, tuple[int, int, Any]] = {}  # msg_id -> (level, send time, result)
    try:
        async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
            for level in (0, 1, 3, 5, 8, 10, 10):
                t = int(time.time() * 1000)
                r = await p.send(
                    Message(
                        topic, f"L{level}".encode(), tags="T", keys=[f"k{level}"], delay_level=level
                    )
                )
                sent[r.msg_id] = (level, t, r)
            # the 2 s messages are not there after one second
            await asyncio.sleep(1.0)
            not_yet = [i for i, (lv, _, _) in sent.items() if lv == 10]
            assert not any(i in received for i in not_yet)

            await eventually(
                lambda: _true(len(received) == len(sent)), timeout=20, what="every message"
            )
            await p.trace_dispatcher.flush(10)
    finally:
        await consumer.shutdown()

    for msg_id, (level, t_send, result) in sent.items():
        t_recv, m = received[msg_id]
        assert m.topic == topic and m.body == f"L{level}".encode() and m.tags == "T"
        assert m.delay_level == 0  # DELAY is gone once delivered
        if level == 0:
            assert result.queue.topic == topic
            continue
        delay = FAST_LEVELS_MS[level - 1]
        assert t_recv >= t_send + delay, (level, t_recv - t_send)  # never before it is due
        # stored in the real queue on time (the consumer's own latency is not the broker's)
        late = m.store_timestamp - (t_send + delay)
        assert 0 <= late < 1000, (level, late)
        # SendResult: where it waits (the schedule queue of the level)
        assert result.queue.topic == SCHEDULE_TOPIC and result.queue.broker == broker
        assert result.queue.queue_id == level - 1
        # delivered to the queue the producer chose, REAL_TOPIC / REAL_QID kept
        assert m.property(MessageConst.REAL_TOPIC) == topic
        assert m.queue.queue_id == int(m.property(MessageConst.REAL_QID) or -1)
        assert m.property(SCHEDULE_OFFSET) == f"{level}:{result.queue_offset}"

    traces = [
        c
        for tm in await read_trace_topic(stack.trace_bootstrap)
        for c in tm.contexts
        if c.trace_beans[0].msg_id in sent
    ]
    pubs = {c.trace_beans[0].msg_id: c for c in traces if c.trace_type == TraceType.Pub}
    assert set(pubs) == set(sent)
    for msg_id, (level, _, result) in sent.items():
        bean = pubs[msg_id].trace_beans[0]
        expected = MessageType.Delay_Msg if level else MessageType.Normal_Msg
        assert bean.msg_type == expected and bean.topic == topic
        assert bean.offset_msg_id == result.offset_msg_id
    afters = [c for c in traces if c.trace_type == TraceType.SubAfter]
    assert {c.trace_beans[0].msg_id for c in afters} == set(sent)
    assert all(c.success for c in afters)


async def test_out_of_range_levels_and_delayed_batches_are_refused(
    admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic = f"DelayBad_{unique}"
    await admin.create_topic(broker, topic, read_queues=1, write_queues=1)
    async with Producer(f"PG_{unique}", **env) as p:
        with pytest.raises(InvalidMessageError, match="delay_level 11 is out of range.*10 delay"):
            await p.send(Message(topic, b"x", delay_level=11))
        with pytest.raises(InvalidMessageError, match="not supported in a batch"):
            await p.send_batch([Message(topic, b"x", delay_level=1)])
        with pytest.raises(InvalidMessageError, match="delay_level must be an int >= 0"):
            Message(topic, b"x", delay_level=-1)
        # the oneway path takes the schedule too
        await p.send_oneway(Message(topic, b"oneway", delay_level=1))
        ktopic = kafka_topic(broker, topic)

        async def delivered() -> bool:
            return any(
                r.value == b"oneway" for r in await read_topic(admin.control_bootstrap, ktopic)
            )

        await eventually(delivered, timeout=10, what="the delayed oneway message")


async def test_garbage_in_the_schedule_topic_is_skipped_without_loss(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic = f"DelayGarbage_{unique}"
    await admin.create_topic(broker, topic, read_queues=2, write_queues=2)
    metrics_url = stack.processes[broker].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]
    before = value(metrics_url, "tracemq_broker_schedule_rejected_total", reason="garbage")
    before_gone = value(metrics_url, "tracemq_broker_schedule_rejected_total", reason="no_topic")
    sched = kafka_topic(broker, SCHEDULE_TOPIC)
    raw = AIOKafkaProducer(bootstrap_servers=stack.business_bootstrap)
    await raw.start()
    try:

        async def put(value: bytes, **headers: str) -> None:
            await raw.send_and_wait(
                sched, value, partition=0, headers=[(k, v.encode()) for k, v in headers.items()]
            )

        await put(b"good-1", UNIQ_KEY="A" * 32, REAL_TOPIC=topic, REAL_QID="1")
        await put(os.urandom(32))  # no headers at all
        await put(b"bad-qid", REAL_TOPIC=topic, REAL_QID="one")
        await put(b"bad-topic", REAL_TOPIC="no such/topic", REAL_QID="0")
        await put(b"gone", REAL_TOPIC=f"Never_{unique}", REAL_QID="0")
        await put(b"good-2", UNIQ_KEY="B" * 32, REAL_TOPIC=topic, REAL_QID="7")  # 7 % 2 queues
    finally:
        await raw.stop()
    ktopic = kafka_topic(broker, topic)

    async def both() -> list[Any]:
        recs = await read_topic(stack.business_bootstrap, ktopic)
        return recs if len(recs) >= 2 else []

    recs = await eventually(both, timeout=10, what="the two valid records")
    assert sorted((r.value, r.partition) for r in recs) == [(b"good-1", 1), (b"good-2", 1)]
    assert (
        value(metrics_url, "tracemq_broker_schedule_rejected_total", reason="garbage") >= before + 3
    )
    assert (
        value(metrics_url, "tracemq_broker_schedule_rejected_total", reason="no_topic")
        >= before_gone + 1
    )
    assert stack.processes[broker]._http_ok()


async def _true(v: bool) -> bool:
    return v
