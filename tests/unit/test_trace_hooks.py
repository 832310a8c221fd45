"""The trace hooks queue Pub / SubBefore / SubAfter as raw records (no TraceContext and no text on
the business path): written, they are exactly what ``tracemq.trace.encode`` writes for the
equivalent contexts; a SubAfter joins its waiting SubBefore; and a value the record cannot hold
is counted as failed by the dispatcher instead of corrupting a record."""

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
from tracemq.trace._codec import SUB_PAIR, write_records
from tracemq.trace._dispatcher import AsyncTraceDispatcher
from tracemq.trace._hooks import ConsumeMessageTraceHook, SendMessageTraceHook

MSG_ID = "C0A8000100002A9F0000000000000001"
Q = MessageQueue("Orders", "broker-a", 3)


class Recorder:
    """The appender methods, recording what they were given (no joining: every SubAfter is
    appended on its own)."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.contexts: list[TraceContext] = []
        self.batches: list[int] = []

    def append(self, ctx: TraceContext) -> bool:
        self.contexts.append(ctx)
        return True

    def append_record(self, record: tuple[Any, ...]) -> bool:
        self.records.append(record)
        return True

    def append_records(self, records: list[Any]) -> int:
        self.batches.append(len(records))
        self.records.extend(records)
        return len(records)

    def append_sub_before(self, record: tuple[Any, ...]) -> int:
        self.records.append(record)
        return -1  # as if refused: no join

    def join_sub_after(self, *_: Any) -> bool:
        raise AssertionError("not called when the SubBefore was refused")


def text(record: tuple[Any, ...]) -> str:
    (written,) = write_records([record])
    assert written is not None
    return written


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
    (record,) = rec.records
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
    assert text(record) == expected.data
    assert record[1:3] == ("Orders", "Region-A")
    assert {record[3], *record[4].split()} == expected.keys


def _consume_context(m: MessageExt) -> ConsumeMessageContext:
    ctx = ConsumeMessageContext("CG", [m], Q, "10.0.0.7", region_id="Region-A")
    ctx.request_ids = {MSG_ID: "REQ-1"}
    ctx.begin_timestamp = 1_700_000_000_100
    return ctx


def _expected_sub(keys: str | None) -> tuple[str, str]:
    before = encode(
        TraceContext(
            TraceType.SubBefore,
            timestamp=1_700_000_000_100,
            region_id="Region-A",
            group_name="CG",
            request_id="REQ-1",
            trace_beans=[TraceBean(msg_id=MSG_ID, retry_times=2, keys=keys)],
        )
    ).data
    after = encode(
        TraceContext(
            TraceType.SubAfter,
            timestamp=1_700_000_000_130,
            group_name="CG",
            request_id="REQ-1",
            cost_time=30,
            success=False,
            context_code=int(ConsumeReturnType.EXCEPTION),
            trace_beans=[TraceBean(msg_id=MSG_ID, keys=keys)],
        )
    ).data
    return before, after


def _consume(hook: ConsumeMessageTraceHook, ctx: ConsumeMessageContext) -> None:
    hook.consume_message_before(ctx)
    ctx.end_timestamp, ctx.success = 1_700_000_000_130, False
    ctx.context_code = int(ConsumeReturnType.EXCEPTION)
    hook.consume_message_after(ctx)


def test_sub_records_equal_the_encoded_contexts() -> None:
    rec = Recorder()
    m = MessageExt(
        "Orders", b"x", MSG_ID, Q, 16, 1, 2, "10.0.0.1:10911", reconsume_times=2,
        properties={"TAGS": "Paid", "KEYS": "order-1 null"},
    )  # fmt: skip
    _consume(ConsumeMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC"), _consume_context(m))
    assert rec.contexts == []
    before, after = rec.records
    assert (text(before), text(after)) == _expected_sub("order-1 null")
    assert before[1:3] == after[1:3] == ("Orders", "Region-A")


async def test_a_sub_after_rides_with_its_sub_before_and_writes_the_same_records() -> None:
    """With a dispatcher, the SubAfter of a one-message call joins its SubBefore while it waits:
    one queue item, the same two records as separately."""
    d = AsyncTraceDispatcher(group="CG", route_cache=_NoRoutes(), sender=_NoSender())
    m = MessageExt(
        "Orders", b"x", MSG_ID, Q, 16, 1, 2, "10.0.0.1:10911", reconsume_times=2,
        properties={"KEYS": "order-1"},
    )  # fmt: skip
    _consume(ConsumeMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC"), _consume_context(m))
    (item,) = d._queue
    assert item[0] == SUB_PAIR and d.stats()["appended"] == 2
    assert text(item) == "".join(_expected_sub("order-1"))
    await d.shutdown(0.1)


class _NoRoutes:
    async def get(self, topic: str, *, refresh: bool = False) -> Any:
        raise AssertionError("not started")


class _NoSender:
    async def send(self, *_: Any) -> None:
        raise AssertionError("not started")


def test_a_batch_call_gives_every_message_its_sub_before_and_sub_after_in_one_enqueue() -> None:
    rec = Recorder()
    hook = ConsumeMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC")
    ids = [f"{MSG_ID[:-1]}{i}" for i in range(3)]
    msgs = [MessageExt("Orders", b"x", i, Q, n, 1, 2, "10.0.0.1:10911") for n, i in enumerate(ids)]
    ctx = ConsumeMessageContext("CG", msgs, Q, "10.0.0.7")
    ctx.request_ids = {i: f"REQ-{i}" for i in ids}
    ctx.begin_timestamp, ctx.end_timestamp = 1_700_000_000_100, 1_700_000_000_130
    ctx.end_timestamps = {ids[1]: 1_700_000_000_110}
    hook.consume_message_before(ctx)
    ctx.success = True
    hook.consume_message_after(ctx)
    assert rec.batches == [3, 3]
    befores = [decode(text(r))[0] for r in rec.records[:3]]
    afters = [decode(text(r))[0] for r in rec.records[3:]]
    assert [c.trace_type for c in befores + afters] == [TraceType.SubBefore] * 3 + [
        TraceType.SubAfter
    ] * 3
    assert [c.trace_beans[0].msg_id for c in befores + afters] == ids + ids
    assert [c.request_id for c in afters] == [f"REQ-{i}" for i in ids]
    assert [c.cost_time for c in afters] == [30, 10, 30]  # a message may end before the call


async def test_a_value_the_record_cannot_hold_is_counted_failed_not_written() -> None:
    """A key with a record separator: the dispatcher's worker finds it (separator count) and
    counts that record as failed; the other records of its batch are sent."""
    from tracemq.trace._dispatcher import AsyncTraceDispatcher as D

    sent: list[bytes] = []

    class Sender:
        async def send(self, route: Any, queue_id: int, topic: str, value: bytes, h: Any) -> None:
            sent.append(value)

    class Routes:
        async def get(self, topic: str, *, refresh: bool = False) -> Any:
            from tracemq.routing.model import QueueRoute, TopicRoute

            q = QueueRoute("trace-a", "c", 1, 1, 6, "trace-a:9092", "trace-a:10911")
            return TopicRoute(topic=topic, queues=(q,))

    d = D(group="PG", route_cache=Routes(), sender=Sender(), flush_interval_ms=10)
    await d.start()
    hook = SendMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC")
    hook.send_message_after(_send_context(keys=["bad\x01key"]))
    hook.send_message_after(_send_context(keys=["good"]))
    assert await d.flush()
    (body,) = sent
    (ctx,) = decode(body)
    assert ctx.trace_beans[0].keys == "good"
    s = d.stats()
    assert (s["appended"], s["sent"], s["failed"]) == (2, 1, 1)
    await d.shutdown(1.0)


def test_the_trace_topic_itself_is_not_traced() -> None:
    rec = Recorder()
    ctx = _send_context()
    ctx.message.topic = "RMQ_SYS_TRACE_TOPIC"
    SendMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC").send_message_after(ctx)
    assert rec.records == rec.contexts == []


def test_an_end_transaction_is_one_context() -> None:
    from tracemq.hooks import EndTransactionContext
    from tracemq.trace import TransactionState
    from tracemq.trace._hooks import EndTransactionTraceHook

    rec = Recorder()
    msg = Message("Orders", b"x", tags="Paid", keys=["order-1"])
    ctx = EndTransactionContext(
        "PG", msg, MSG_ID, "10.0.0.1:10911", "TX-1", "COMMIT_MESSAGE", False, timestamp=7
    )
    EndTransactionTraceHook(rec, "RMQ_SYS_TRACE_TOPIC").end_transaction(ctx)
    (got,) = rec.contexts
    assert (got.trace_type, got.timestamp, got.trace_beans[0].transaction_id) == (
        TraceType.EndTransaction, 7, "TX-1",
    )  # fmt: skip
    assert got.trace_beans[0].transaction_state == TransactionState.COMMIT_MESSAGE
    assert got.trace_beans[0].msg_type == MessageType.Trans_msg_Commit
    assert decode(encode(got).data)[0].trace_beans[0].keys == "order-1"


# ---- the context-free calls a client makes when message trace's hook is its only hook


def _route(*, trace_on: bool = True) -> Any:
    from tracemq.routing.model import QueueRoute

    return QueueRoute(
        "broker-a", "c", 8, 8, 6, "127.0.0.1:9092", "10.0.0.1:10911", region_id="Region-A",
        trace_on=trace_on,
    )  # fmt: skip


def test_one_pub_queues_what_send_message_after_queues() -> None:
    """SendMessageTraceHook.one_pub (a producer whose only send hook is message trace's) queues
    the same Pub record as send_message_after with a context, for a stored and a failed
    attempt; nothing for a route with trace off or a message to the trace topic."""
    ctx = _send_context()
    by_hook, direct = Recorder(), Recorder()
    SendMessageTraceHook(by_hook, "RMQ_SYS_TRACE_TOPIC").send_message_after(ctx)
    hook = SendMessageTraceHook(direct, "RMQ_SYS_TRACE_TOPIC")
    hook.one_pub(ctx.message, MSG_ID, "PG", _route(), ctx.begin_timestamp, ctx.end_timestamp,
                 MessageType.Normal_Msg, ctx.send_result)  # fmt: skip
    assert direct.records == by_hook.records
    ctx.send_result = None
    SendMessageTraceHook(by_hook, "RMQ_SYS_TRACE_TOPIC").send_message_after(ctx)
    hook.one_pub(ctx.message, MSG_ID, "PG", _route(), ctx.begin_timestamp, ctx.end_timestamp,
                 MessageType.Normal_Msg, None)  # fmt: skip
    assert direct.records == by_hook.records and len(direct.records) == 2
    assert decode(text(direct.records[1]))[0].success is False
    hook.one_pub(ctx.message, MSG_ID, "PG", _route(trace_on=False), 1, 2, 0, None)
    to_trace = Message("RMQ_SYS_TRACE_TOPIC", b"x")
    hook.one_pub(to_trace, MSG_ID, "PG", _route(), 1, 2, 0, None)
    assert len(direct.records) == 2


async def test_one_before_and_after_write_what_the_hook_methods_write() -> None:
    """ConsumeMessageTraceHook.one_before/one_after (a consumer whose only consume hook is
    message trace's, one message per call): joined in the dispatcher, or appended on their
    own when the SubBefore is gone (Recorder), the same records as the hook methods."""
    m = MessageExt(
        "Orders", b"x", MSG_ID, Q, 16, 1, 2, "10.0.0.1:10911", reconsume_times=2,
        properties={"KEYS": "order-1"},
    )  # fmt: skip
    d = AsyncTraceDispatcher(group="CG", route_cache=_NoRoutes(), sender=_NoSender())
    hook = ConsumeMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC")
    seq = hook.one_before(m, "CG", "Region-A", "REQ-1", 1_700_000_000_100)
    assert seq == 0
    hook.one_after(seq, m, "CG", "Region-A", "REQ-1", 1_700_000_000_100, 1_700_000_000_130,
                   False, int(ConsumeReturnType.EXCEPTION))  # fmt: skip
    (item,) = d._queue
    assert item[0] == SUB_PAIR and d.stats()["appended"] == 2
    assert text(item) == "".join(_expected_sub("order-1"))
    await d.shutdown(0.1)

    rec = Recorder()  # refuses the join: the SubAfter goes on its own
    hook = ConsumeMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC")
    seq = hook.one_before(m, "CG", "Region-A", "REQ-1", 1_700_000_000_100)
    hook.one_after(seq, m, "CG", "Region-A", "REQ-1", 1_700_000_000_100, 1_700_000_000_130,
                   False, int(ConsumeReturnType.EXCEPTION))  # fmt: skip
    by_hook = Recorder()
    _consume(ConsumeMessageTraceHook(by_hook, "RMQ_SYS_TRACE_TOPIC"), _consume_context(m))
    assert rec.records == by_hook.records
    assert tuple(map(text, rec.records)) == _expected_sub("order-1")

    trace_q = MessageQueue("RMQ_SYS_TRACE_TOPIC", "trace-a", 0)  # (the queue decides)
    on_trace_topic = MessageExt("RMQ_SYS_TRACE_TOPIC", b"x", MSG_ID, trace_q, 1, 1, 2, "h")
    assert hook.one_before(on_trace_topic, "CG", "Region-A", "REQ-2", 1) == -2
    hook.one_after(-2, on_trace_topic, "CG", "Region-A", "REQ-2", 1, 2, True, 0)
    assert len(rec.records) == 2
