"""Consumer retries through the broker and the dead-letter queue, on a broker with short levels:
RECONSUME_LATER, exceptions, None and time-outs are sent back to %RETRY%<group> through delay
level 3 + reconsume count and come back with the same msgId under their own topic; after
max_reconsume_times the message lands in %DLQ%<group>; a failed send-back is retried locally;
broadcasting does not retry; every attempt is traced."""

from __future__ import annotations

import asyncio
import copy
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from tracemq import (
    ClientSettings,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageModel,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.consumer.push import DEAD_LETTERED, GIVEN_UP, SENT_BACK
from tracemq.message import MessageConst
from tracemq.naming import dlq_topic, kafka_topic, retry_topic
from tracemq.trace import ConsumeReturnType, TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.reading import read_topic, read_trace_topic
from tracemq_devkit.waiting import eventually

from tests.support.brokers import FAST_LEVELS_MS, fast_broker, fast_broker_name, start_fast_broker
from tests.support.collector_api import http as _http

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def broker(stack: EmbeddedStack) -> Iterator[str]:
    with fast_broker(stack, "brd") as name:
        yield name


class Attempts:
    def __init__(self) -> None:
        self.by_body: dict[bytes, list[tuple[int, MessageExt]]] = defaultdict(list)

    def add(self, m: MessageExt) -> int:
        # a copy: a local re-consume updates the same object's reconsume_times
        self.by_body[m.body].append((int(time.time() * 1000), copy.copy(m)))
        return len(self.by_body[m.body])


async def _true(v: bool) -> bool:
    return v


async def _traces(stack: EmbeddedStack, ids: set[str]) -> list[Any]:
    return [
        c
        for tm in await read_trace_topic(stack.trace_bootstrap)
        for c in tm.contexts
        if c.trace_beans[0].msg_id in ids
    ]


@pytest.mark.timeout(90)
async def test_retry_chain_up_to_the_dead_letter_queue(
    stack: EmbeddedStack,
    collector: ManagedProcess,
    admin: AdminClient,
    broker: str,
    env: dict[str, str],
    unique: str,
) -> None:
    topic, group = f"Retry_{unique}", f"CG_{unique}"
    await admin.create_topic(broker, topic, read_queues=2, write_queues=2)
    seen = Attempts()

    async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
        m = msgs[0]
        n = seen.add(m)
        if m.body == b"always":
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        if m.body == b"raise" and n == 1:
            raise RuntimeError("boom")
        if m.body == b"null" and n == 1:
            return None
        if m.body == b"slow" and n == 1:
            await asyncio.sleep(1.0)  # over the 0.3 s consume time-out
        if m.body == b"to-dlq":
            ctx.delay_level_when_next_consume = -1  # straight to the DLQ (RocketMQ's -1)
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    max_retries = 3
    consumer = PushConsumer(
        group,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_msg_trace=True,
        max_reconsume_times=max_retries,
        consume_timeout_minutes=0.3 / 60,
        **env,
    )
    consumer.subscribe(topic, "A")
    consumer.register_message_listener(listener)
    dlq_before = DEAD_LETTERED.labels(group)._value.get()
    await consumer.start()
    bodies = [b"always", b"raise", b"null", b"slow", b"ok", b"to-dlq"]
    try:
        # the retry and dead-letter topics exist and are routed as soon as the consumer runs
        listed = (await admin.list_topics(broker))["topics"]
        assert listed[retry_topic(group)]["write_queues"] == 1
        assert listed[dlq_topic(group)]["write_queues"] == 1
        async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
            ids = {
                (await p.send(Message(topic, b, tags="A", keys=[f"key-{b.decode()}"]))).msg_id: b
                for b in bodies
            }
            await p.send(Message(topic, b"filtered", tags="B"))  # not ours: tag filter
            await p.trace_dispatcher.flush(10)

        def settled() -> bool:
            return (
                len(seen.by_body[b"always"]) == max_retries + 1
                and all(len(seen.by_body[b]) == 2 for b in (b"raise", b"null", b"slow"))
                and len(seen.by_body[b"ok"]) == 1
                and len(seen.by_body[b"to-dlq"]) == 1
            )

        await eventually(lambda: _true(settled()), timeout=30, what="every retry")

        async def dead() -> list[Any]:
            recs = await read_topic(stack.business_bootstrap, kafka_topic(broker, dlq_topic(group)))
            return recs if len(recs) == 2 else []

        dlq = await eventually(dead, timeout=10, what="two messages in the DLQ")
        await asyncio.sleep(0.8)  # nothing more arrives
        assert len(seen.by_body[b"always"]) == max_retries + 1
        assert b"filtered" not in seen.by_body
        assert DEAD_LETTERED.labels(group)._value.get() == dlq_before + 2
    finally:
        await consumer.shutdown()

    by_id = {v: k for k, v in ids.items()}
    # every attempt: same msgId, its own topic, the reconsume count, the retry properties
    always = seen.by_body[b"always"]
    assert [m.reconsume_times for _, m in always] == list(range(max_retries + 1))
    for i, (t, m) in enumerate(always):
        assert m.msg_id == by_id[b"always"] and m.topic == topic and m.tags == "A"
        assert m.key_list == ["key-always"]
        if i:
            assert m.queue.topic == retry_topic(group)  # read from %RETRY%<group>
            assert m.property(MessageConst.RETRY_TOPIC) == topic
            assert m.property(MessageConst.ORIGIN_MESSAGE_ID) == m.msg_id
            assert m.property(MessageConst.RECONSUME_TIME) == str(i)
            # level 3 + reconsume count: 300 ms, 400 ms, 500 ms at least between attempts
            assert t - always[i - 1][0] >= FAST_LEVELS_MS[3 + i - 2], (i, t - always[i - 1][0])
    rec = {r.headers["UNIQ_KEY"]: r for r in dlq}
    assert set(rec) == {by_id[b"always"], by_id[b"to-dlq"]}
    a = rec[by_id[b"always"]]
    assert a.value == b"always" and a.headers["RETRY_TOPIC"] == topic
    assert a.headers["RECONSUME_TIME"] == str(max_retries + 1)
    assert a.headers["ORIGIN_MESSAGE_ID"] == by_id[b"always"] and "DELAY" not in a.headers
    assert rec[by_id[b"to-dlq"]].headers["RECONSUME_TIME"] == "1"

    traces = await _traces(stack, set(ids))
    befores: dict[str, list[Any]] = defaultdict(list)
    afters: dict[str, dict[str, Any]] = defaultdict(dict)
    dlq_pubs = []
    for c in traces:
        b = c.trace_beans[0]
        if c.trace_type == TraceType.SubBefore and c.group_name == group:
            befores[b.msg_id].append(c)
        elif c.trace_type == TraceType.SubAfter and c.group_name == group:
            afters[b.msg_id][c.request_id] = c
        elif c.trace_type == TraceType.Pub and b.topic == dlq_topic(group):
            dlq_pubs.append(c)
    expect = {
        b"always": [ConsumeReturnType.FAILED] * (max_retries + 1),
        b"raise": [ConsumeReturnType.EXCEPTION, ConsumeReturnType.SUCCESS],
        b"null": [ConsumeReturnType.RETURNNULL, ConsumeReturnType.SUCCESS],
        b"slow": [ConsumeReturnType.TIME_OUT, ConsumeReturnType.SUCCESS],
        b"ok": [ConsumeReturnType.SUCCESS],
        b"to-dlq": [ConsumeReturnType.FAILED],
    }
    for body, codes in expect.items():
        msg_id = by_id[body]
        bs = sorted(befores[msg_id], key=lambda c: c.trace_beans[0].retry_times)
        assert [c.trace_beans[0].retry_times for c in bs] == list(range(len(codes))), body
        assert [afters[msg_id][c.request_id].context_code for c in bs] == codes, body
    # the move to the DLQ is traced: a Pub of the consumer group to %DLQ%<group>
    assert sorted(c.trace_beans[0].msg_id for c in dlq_pubs) == sorted(
        [by_id[b"always"], by_id[b"to-dlq"]]
    )
    assert all(c.group_name == group and c.success for c in dlq_pubs)

    # the collector's trace view: the retries are attempts of one group, then the DLQ move
    base = f"http://127.0.0.1:{collector.env['TRACEMQ_HTTP_PORT']}"

    async def dead_lettered_view() -> dict[str, Any] | None:
        status, view = await asyncio.to_thread(_http, f"{base}/api/v1/traces/{by_id[b'always']}")
        return view if status == 200 and view["dead_letters"] else None

    view = await eventually(dead_lettered_view, timeout=20, what="the DLQ move in the trace view")
    assert view["topic"] == topic and view["producer"]["group"] == f"PG_{unique}"
    (node,) = view["consumers"]
    assert node["group"] == group and node["dead_lettered"] is True
    assert [(a["retry_times"], a["status"]) for a in node["attempts"]] == [
        (i, "failed") for i in range(max_retries + 1)
    ]
    assert [(d["group"], d["topic"]) for d in view["dead_letters"]] == [(group, dlq_topic(group))]


@pytest.mark.timeout(90)
async def test_failed_send_back_is_retried_locally(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    """A broker without a schedule service refuses every send-back: the consumer consumes the
    message again locally (reconsume count + 1) and never drops it; the DLQ still works."""
    name, topic, group = fast_broker_name("bns"), f"NoSched_{unique}", f"CG_{unique}"
    start_fast_broker(stack, name, TRACEMQ_BROKER_SCHEDULE_ENABLE="false")
    try:
        await admin.create_topic(name, topic, read_queues=1, write_queues=1)
        seen = Attempts()

        async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
            n = seen.add(msgs[0])
            if msgs[0].body == b"twice" and n < 3:
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            if msgs[0].body == b"never":
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        failed_before = SENT_BACK.labels(group, "failed")._value.get()
        consumer = PushConsumer(
            group,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            max_reconsume_times=2,
            in_process_retry_delay_ms=100,
            **env,
        )
        consumer.subscribe(topic)
        consumer.register_message_listener(listener)
        await consumer.start()
        try:
            async with Producer(f"PG_{unique}", **env) as p:
                await p.send(Message(topic, b"twice"))
                await p.send(Message(topic, b"never"))

            async def done() -> bool:
                recs = await read_topic(
                    stack.business_bootstrap, kafka_topic(name, dlq_topic(group))
                )
                return len(seen.by_body[b"twice"]) == 3 and len(recs) == 1

            await eventually(done, timeout=20, what="local retries and the DLQ")
        finally:
            await consumer.shutdown()
        assert [m.reconsume_times for _, m in seen.by_body[b"twice"]] == [0, 1, 2]
        assert [m.reconsume_times for _, m in seen.by_body[b"never"]] == [0, 1, 2]
        assert SENT_BACK.labels(group, "failed")._value.get() >= failed_before + 4
    finally:
        stack.processes[name].stop()


@pytest.mark.timeout(60)
async def test_broadcasting_does_not_retry(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic, group = f"BRetry_{unique}", f"CGb_{unique}"
    await admin.create_topic(broker, topic, read_queues=1, write_queues=1)
    seen = Attempts()

    async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
        seen.add(msgs[0])
        return ConsumeConcurrentlyStatus.RECONSUME_LATER

    given_up = GIVEN_UP.labels(group)._value.get()
    settings = ClientSettings.from_overrides(**env).model_copy(update={"instance_name": "b1"})
    consumer = PushConsumer(
        group,
        message_model=MessageModel.BROADCASTING,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        settings=settings,
    )
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    await consumer.start()
    try:
        async with Producer(f"PG_{unique}", **env) as p:
            await p.send(Message(topic, b"once"))
        await eventually(lambda: _true(b"once" in seen.by_body), timeout=20, what="delivery")
        await asyncio.sleep(1.5)  # a retry would be back by now (level 3 = 300 ms)
    finally:
        await consumer.shutdown()
    assert len(seen.by_body[b"once"]) == 1
    assert GIVEN_UP.labels(group)._value.get() == given_up + 1
    assert retry_topic(group) not in (await admin.list_topics(broker))["topics"]


@pytest.mark.timeout(60)
async def test_orderly_retries_locally_then_dead_letters(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic, group = f"ORetry_{unique}", f"CGo_{unique}"
    await admin.create_topic(broker, topic, read_queues=1, write_queues=1)
    seen = Attempts()

    async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
        seen.add(msgs[0])
        if msgs[0].body == b"stuck":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(
        group, consume_from=ConsumeFromWhere.FIRST_OFFSET, max_reconsume_times=1, **env
    )
    consumer.subscribe(topic)
    consumer.register_message_listener_orderly(listener)
    await consumer.start()
    try:
        async with Producer(f"PG_{unique}", **env) as p:
            stuck = (await p.send(Message(topic, b"stuck"))).msg_id
            await p.send(Message(topic, b"next"))

        await eventually(lambda: _true(b"next" in seen.by_body), timeout=20, what="queue moves")
    finally:
        await consumer.shutdown()
    assert [m.reconsume_times for _, m in seen.by_body[b"stuck"]] == [0, 1]
    recs = await read_topic(stack.business_bootstrap, kafka_topic(broker, dlq_topic(group)))
    assert [r.headers["UNIQ_KEY"] for r in recs] == [stuck]
