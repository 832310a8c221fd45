"""The trace hooks encode Pub / SubBefore / SubAfter straight into records (no TraceContext on
the business path): the records are exactly what ``tracemq.trace.encode`` writes for the
equivalent contexts, the KEYS header is the same, and a value the fast path cannot take goes
the context way (where encoding fails, counted, instead of corrupting a record)."""

from __future__ import annotations

from typing import Any

from tracemq.hooks import ConsumeMessageContext, SendMessageContext
from tracemq.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from tracemq.trace import (
    ConsumeReturnType,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    decode,
    encode,
)
from tracemq.trace._hooks import ConsumeMessageTraceHook, SendMessageTraceHook

MSG_ID = "C0A8000100002A9F0000000000000001"
Q = MessageQueue("Orders", "broker-a", 3)


class Recorder:
    """Both appender methods, recording what they were given."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.contexts: list[TraceContext] = []
        self.batches: list[int] = []

    def append(self, ctx: TraceContext) -> bool:
        self.contexts.append(ctx)
        return True

    def append_record(self, *item: Any) -> bool:
        self.records.append(item)
        return True

    def append_records(self, items: list[Any]) -> int:
        self.batches.append(len(items))
        self.records.extend(items)
        return len(items)


def _send_context(keys: list[str] | None = None) -> SendMessageContext:
    msg = Message("Orders", b"x" * 42, tags="Paid", keys=keys or ["order-1", "user-9"])
    ctx = SendMessageContext("PG", msg, MSG_ID, MessageType.Normal_Msg, "10.0.0.9")
    ctx.broker_address, ctx.region_id = "10.0.0.1:10911", "Region-A"
    ctx.begin_timestamp, ctx.end_timestamp = 1_700_000_000_000, 1_700_000_000_007
    ctx.send_result = SendResult(
        send_status=SendStatus.SEND_OK,
        msg_id=MSG_ID,
        offset_msg_id="0A00000100002A9F0003000000000010",
        queue=Q,
        queue_offset=16,
        region_id="Region-A",
        trace_on=True,
        store_timestamp=1_700_000_000_006,
    )
    return ctx


def test_pub_record_equals_the_encoded_context() -> None:
    rec = Recorder()
    SendMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC").send_message_after(_send_context())
    assert rec.contexts == []
    ((topic, region, record, msg_id, keys),) = rec.records
    expected = encode(
        TraceContext(
            TraceType.Pub,
            timestamp=1_700_000_000_000,
            region_id="Region-A",
            group_name="PG",
            cost_time=7,
            success=True,
            trace_beans=[
                TraceBean(
                    topic="Orders",
                    msg_id=MSG_ID,
                    offset_msg_id="0A00000100002A9F0003000000000010",
                    tags="Paid",
                    keys="order-1 user-9",
                    store_host="10.0.0.1:10911",
                    body_length=42,
                    msg_type=MessageType.Normal_Msg,
                )
            ],
        )
    )
    assert (topic, region, record) == ("Orders", "Region-A", expected.data)
    assert {msg_id, *keys.split()} == expected.keys


def test_sub_records_equal_the_encoded_contexts() -> None:
    rec = Recorder()
    hook = ConsumeMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC")
    m = MessageExt(
        "Orders", b"x", MSG_ID, Q, 16, 1, 2, "10.0.0.1:10911", reconsume_times=2,
        properties={"TAGS": "Paid", "KEYS": "order-1 null"},
    )  # fmt: skip
    ctx = ConsumeMessageContext("CG", [m], Q, "10.0.0.7", region_id="Region-A")
    ctx.request_ids = {MSG_ID: "REQ-1"}
    ctx.begin_timestamp = 1_700_000_000_100
    hook.consume_message_before(ctx)
    ctx.end_timestamp, ctx.success = 1_700_000_000_130, False
    ctx.context_code = int(ConsumeReturnType.EXCEPTION)
    hook.consume_message_after(ctx)
    assert rec.contexts == []
    before, after = rec.records
    assert (
        before[2]
        == encode(
            TraceContext(
                TraceType.SubBefore,
                timestamp=1_700_000_000_100,
                region_id="Region-A",
                group_name="CG",
                request_id="REQ-1",
                trace_beans=[TraceBean(msg_id=MSG_ID, retry_times=2, keys="order-1 null")],
            )
        ).data
    )
    assert (
        after[2]
        == encode(
            TraceContext(
                TraceType.SubAfter,
                timestamp=1_700_000_000_130,
                group_name="CG",
                request_id="REQ-1",
                cost_time=30,
                success=False,
                context_code=int(ConsumeReturnType.EXCEPTION),
                trace_beans=[TraceBean(msg_id=MSG_ID, keys="order-1 null")],
            )
        ).data
    )
    assert before[:2] == after[:2] == ("Orders", "Region-A")


def test_a_batch_call_gives_every_message_its_sub_before_and_sub_after_in_one_enqueue() -> None:
    rec = Recorder()
    hook = ConsumeMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC")
    ids = [f"{MSG_ID[:-1]}{i}" for i in range(3)]
    msgs = [MessageExt("Orders", b"x", i, Q, n, 1, 2, "10.0.0.1:10911") for n, i in enumerate(ids)]
    bad = MessageExt(
        "Orders", b"x", "BAD", Q, 9, 1, 2, "h:1", properties={"KEYS": "a\x01b"}
    )  # a key the record cannot hold: that message alone takes the context way
    ctx = ConsumeMessageContext("CG", [*msgs, bad], Q, "10.0.0.7")
    ctx.request_ids = {i: f"REQ-{i}" for i in [*ids, "BAD"]}
    ctx.begin_timestamp, ctx.end_timestamp = 1_700_000_000_100, 1_700_000_000_130
    ctx.end_timestamps = {ids[1]: 1_700_000_000_110}
    hook.consume_message_before(ctx)
    ctx.success = True
    hook.consume_message_after(ctx)
    assert rec.batches == [3, 3]
    assert [c.trace_type for c in rec.contexts] == [TraceType.SubBefore, TraceType.SubAfter]
    befores = [decode(r[2])[0] for r in rec.records[:3]]
    afters = [decode(r[2])[0] for r in rec.records[3:]]
    assert [c.trace_beans[0].msg_id for c in befores + afters] == ids + ids
    assert [c.request_id for c in afters] == [f"REQ-{i}" for i in ids]
    assert [c.cost_time for c in afters] == [30, 10, 30]  # a message may end before the call


def test_a_value_the_record_cannot_hold_takes_the_context_way() -> None:
    rec = Recorder()
    SendMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC").send_message_after(
        _send_context(keys=["bad\x01key"])
    )
    assert rec.records == []
    (ctx,) = rec.contexts
    assert ctx.trace_beans[0].keys == "bad\x01key"  # encode() refuses it, naming the field


def test_the_trace_topic_itself_is_not_traced() -> None:
    rec = Recorder()
    ctx = _send_context()
    ctx.message.topic = "RMQ_SYS_TRACE_TOPIC"
    SendMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC").send_message_after(ctx)
    assert rec.records == rec.contexts == []
