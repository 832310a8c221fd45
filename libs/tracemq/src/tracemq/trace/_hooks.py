"""Message trace as hooks: Pub from the send hook, SubBefore/SubAfter from the consume hook,
EndTransaction from the end-transaction hook. They hand their records to an asynchronous
dispatcher (Pub, SubBefore and SubAfter as raw records, the fields in a tuple that its worker
writes; EndTransaction as a :class:`TraceContext`); they never block and never raise into the
business path.

Differences from RocketMQ (improvements, DESIGN §3): a failed send is traced with
``success=false`` and storeHost ``null``, one Pub per attempt; SubAfter's cost is per message (a listener may mark each message done), not
the batch average; the store time comes from the transport's acknowledgement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tracemq.clock import now_ms
from tracemq.message import MessageConst
from tracemq.message_id import new_request_id
from tracemq.trace._codec import COMPILED, PUB, SUB_AFTER, SUB_BEFORE, RawRecord
from tracemq.trace._model import MessageType, TraceBean, TraceContext, TraceType, TransactionState

if TYPE_CHECKING:
    from tracemq.hooks import ConsumeMessageContext, EndTransactionContext, SendMessageContext
    from tracemq.message import Message, MessageExt, SendResult
    from tracemq.routing import QueueRoute


class _Appender(Protocol):
    def append(self, ctx: TraceContext) -> bool: ...

    def append_record(self, record: RawRecord) -> bool: ...

    def append_records(self, records: list[RawRecord]) -> int: ...

    def append_sub_before(self, record: RawRecord) -> int: ...

    def join_sub_after(self, seq: int, msg_id: str | None, timestamp: int, cost_time: int,
                       success: bool, context_code: int) -> bool: ...  # fmt: skip


#: what ConsumeMessageTraceHook.before hands to .after: (SubBefore's dispatcher number or -1,
#: request id, begin time)
_Token = tuple[int, str, int]


def _compiled_tracer(hook: ConsumeMessageTraceHook | SendMessageTraceHook, name: str) -> Any:
    """The compiled tracer ``name`` (``ConsumeTracer``, ``PubTracer``) over ``hook``'s
    dispatcher (an :class:`AsyncTraceDispatcher`: it works on its queue state), or None:
    another dispatcher, the extension not built or turned off (``TRACEMQ_NO_EXTENSIONS``, as
    for the trace worker's steps)."""
    from tracemq.trace._dispatcher import AsyncTraceDispatcher

    if not COMPILED or type(hook.dispatcher) is not AsyncTraceDispatcher:
        return None
    from tracemq.trace import _speedups

    tracer = getattr(_speedups, name, None)  # (None: an extension built before it was added)
    return None if tracer is None else tracer(hook.dispatcher, hook.trace_topic)


#: where the consume hook keeps its SubBefore's dispatcher number, in ConsumeMessageContext.props
_SEQ = "tracemq.trace.sub_before_seq"
_KEYS = MessageConst.KEYS


# The Pub, SubBefore and SubAfter hooks queue raw records (tracemq.trace._codec: the fields in a
# tuple) and the dispatcher's worker writes them a batch at a time: no TraceContext and no text
# on the business path. A value the record cannot hold (a separator in a text field, an integer
# outside Java's range) is found there and counted as failed, as an unencodable context is.


class SendMessageTraceHook:
    """Turns every send into one Pub trace record."""

    #: the producer need not call send_message_before: it does nothing (one call less per send)
    observes_send_before = False

    def __init__(self, dispatcher: _Appender, trace_topic: str) -> None:
        self.dispatcher = dispatcher
        self.trace_topic = trace_topic
        tracer = _compiled_tracer(self, "PubTracer")
        if tracer is not None:  # the same step as one_pub() below, compiled
            self.one_pub = tracer.one_pub  # type: ignore[method-assign]

    def one_pub(self, msg: Message, msg_id: str, group: str, queue: QueueRoute, begin: int,
                end: int, msg_type: int, result: SendResult | None) -> None:  # fmt: skip
        """The Pub of one send attempt of ``msg`` to a queue of ``queue`` (``result`` None: it
        failed): what :meth:`send_message_after` queues, without a
        :class:`SendMessageContext`, for a producer whose only send hook this is. Never
        raises.

        With the compiled trace steps an instance calls their ``PubTracer.one_pub`` instead:
        this method is its reference."""
        try:
            if not queue.trace_on or msg.topic == self.trace_topic:
                return
            store_host: str | None = None
            offset_msg_id: str | None = None
            if result is not None:
                store_host, offset_msg_id = queue.address, result.offset_msg_id
            self.dispatcher.append_record(
                (PUB, msg.topic, queue.region_id, msg_id, msg.keys_str, begin, group, msg.tags,
                 store_host, len(msg.body), end - begin if end > begin else 0, msg_type,
                 offset_msg_id, result is not None)
            )  # fmt: skip
        except Exception:  # pragma: no cover - defensive: tracing must not break the producer
            return

    def send_message_before(self, context: SendMessageContext) -> None:
        return None  # everything the Pub needs is known after the send

    def send_message_after(self, context: SendMessageContext) -> None:
        msg = context.message
        if msg.topic == self.trace_topic or not context.trace_on:
            return
        result = context.send_result
        begin = context.begin_timestamp
        end = context.end_timestamp
        # One Pub per attempt; a failed one names no store host: nothing was stored there.
        if result is not None:
            store_host, offset_msg_id = context.broker_address, result.offset_msg_id
        else:
            store_host = offset_msg_id = None
        self.dispatcher.append_record(
            (PUB, msg.topic, context.region_id, context.msg_id, msg.keys_str, begin,
             context.producer_group, msg.tags, store_host, len(msg.body),
             end - begin if end > begin else 0, context.msg_type, offset_msg_id,
             result is not None)
        )  # fmt: skip


class ConsumeMessageTraceHook:
    """SubBefore for every message before the listener runs, SubAfter after it returns.

    Besides the hook methods, a consumer whose only consume hook this is may call
    :meth:`one_before` and :meth:`one_after` around a one-message listener call (the default):
    the same records, without a :class:`ConsumeMessageContext` per call. They never raise.
    """

    def __init__(self, dispatcher: _Appender, trace_topic: str) -> None:
        self.dispatcher = dispatcher
        self.trace_topic = trace_topic
        # (bound once: the context-free calls below run once per consumed message)
        self._append_sub_before = dispatcher.append_sub_before
        self._join_sub_after = dispatcher.join_sub_after
        tracer = _compiled_tracer(self, "ConsumeTracer")
        if tracer is not None:  # the same steps as before() and after() below, compiled
            self.before = tracer.before  # type: ignore[method-assign]
            self.after = tracer.after  # type: ignore[method-assign]

    # ---- one message, the whole per-message trace path: what PushConsumer calls

    def before(self, msg: MessageExt, group: str, region: str) -> _Token | None:
        """Everything the consumer does for tracing before its listener runs over ``msg``
        alone: a request id, the begin time, :meth:`one_before`. The token :meth:`after`
        needs (the SubBefore's dispatcher number or -1, the request id, the begin time), or
        None when ``msg`` is not traced (from a queue of the trace topic). Never raises.

        With the compiled trace steps (``tracemq/trace/_speedups.pyx``) an instance calls
        their ``ConsumeTracer`` instead: this method and :meth:`after` are its reference."""
        if msg.queue.topic == self.trace_topic:
            return None
        request_id = new_request_id()
        begin = now_ms()
        return (self.one_before(msg, group, region, request_id, begin), request_id, begin)

    def after(self, token: _Token | None, msg: MessageExt, group: str, region: str,
              end: object, success: bool, context_code: int) -> None:  # fmt: skip
        """Everything after the listener: :meth:`one_after` for the call :meth:`before`
        returned ``token`` for, ending at ``end`` — anything but a non-negative ``int``
        (a listener's own end time may be anything: ``ConsumeContext.end_times`` is a plain
        dict) means now. Never raises."""
        if token is None:
            return
        try:
            seq, request_id, begin = token
        except Exception:  # pragma: no cover - defensive: a token not of before()
            return
        at = end if type(end) is int and end >= 0 else now_ms()
        self.one_after(seq, msg, group, region, request_id, begin, at, success, context_code)

    # ---- one message, no context: the consumer's usual call, once per consumed message

    def one_before(self, msg: MessageExt, group: str, region: str, request_id: str,
                   timestamp: int) -> int:  # fmt: skip
        """The SubBefore of ``msg`` (what :meth:`consume_message_before` queues for a call
        over it alone): the dispatcher number :meth:`one_after` needs, -1 when it was refused
        (counted as discarded) and -2 when ``msg`` is not traced (from a queue of the trace
        topic). Never raises."""
        try:
            if msg.queue.topic == self.trace_topic:  # (as the hook methods: the queue's)
                return -2
            return self._append_sub_before(
                (SUB_BEFORE, msg.topic, region, msg.msg_id, msg.properties.get(_KEYS), timestamp,
                 group, request_id, msg.reconsume_times)
            )  # fmt: skip
        except Exception:  # pragma: no cover - defensive: tracing must not break the consumer
            return -1

    def one_after(self, seq: int, msg: MessageExt, group: str, region: str, request_id: str,
                  begin: int, end: int, success: bool, context_code: int) -> None:  # fmt: skip
        """The SubAfter of ``msg`` (:meth:`consume_message_after` for a call over it alone);
        ``seq`` is what :meth:`one_before` returned. Never raises."""
        try:
            if seq == -2:
                return
            cost = end - begin if end > begin else 0
            msg_id = msg.msg_id
            if seq >= 0 and self._join_sub_after(seq, msg_id, end, cost, success, context_code):
                return
            self.dispatcher.append_record(
                (SUB_AFTER, msg.topic, region, msg_id, msg.properties.get(_KEYS), end, group,
                 request_id, cost, success, context_code)
            )  # fmt: skip
        except Exception:  # pragma: no cover - defensive: tracing must not break the consumer
            return

    # ---- the hook methods

    def consume_message_before(self, context: ConsumeMessageContext) -> None:
        # (this and consume_message_after run once per listener call: for the default
        # one-message calls, once per consumed message: one record, one enqueue)
        if not context.trace_on or context.queue.topic == self.trace_topic:
            return
        ts, region, group = context.begin_timestamp, context.region_id, context.consumer_group
        msgs = context.messages
        if len(msgs) == 1:
            m = msgs[0]
            msg_id = m.msg_id
            # its number: the SubAfter joins it while it waits (one item for both)
            context.props[_SEQ] = self.dispatcher.append_sub_before(
                (SUB_BEFORE, m.topic, region, msg_id, m.properties.get(_KEYS), ts, group,
                 context.request_ids.get(msg_id), m.reconsume_times)
            )  # fmt: skip
            return
        rids = context.request_ids
        self.dispatcher.append_records(
            [
                (SUB_BEFORE, m.topic, region, m.msg_id, m.keys, ts, group, rids.get(m.msg_id),
                 m.reconsume_times)
                for m in msgs
            ]
        )  # fmt: skip

    def consume_message_after(self, context: ConsumeMessageContext) -> None:
        if not context.trace_on or context.queue.topic == self.trace_topic:
            return
        ok, code, ends = context.success, context.context_code, context.end_timestamps
        begin, end_all = context.begin_timestamp, context.end_timestamp
        msgs = context.messages
        if len(msgs) == 1 and not ends:
            cost = end_all - begin if end_all > begin else 0
            m = msgs[0]
            msg_id = m.msg_id
            seq = context.props.get(_SEQ, -1)
            if seq >= 0 and self.dispatcher.join_sub_after(seq, msg_id, end_all, cost, ok, code):
                return
            self.dispatcher.append_record(
                (SUB_AFTER, m.topic, context.region_id, msg_id, m.properties.get(_KEYS),
                 end_all, context.consumer_group, context.request_ids.get(msg_id), cost, ok,
                 code)
            )  # fmt: skip
            return
        region, group, rids = context.region_id, context.consumer_group, context.request_ids
        records: list[RawRecord] = []
        for m in msgs:
            msg_id = m.msg_id
            # a listener may mark a message done before the call ends (ConsumeContext)
            end = ends.get(msg_id, end_all) if ends else end_all
            records.append(
                (SUB_AFTER, m.topic, region, msg_id, m.keys, end, group, rids.get(msg_id),
                 end - begin if end > begin else 0, ok, code)
            )  # fmt: skip
        self.dispatcher.append_records(records)


class EndTransactionTraceHook:
    """One EndTransaction trace context per commit / rollback / unknown."""

    def __init__(self, dispatcher: _Appender, trace_topic: str) -> None:
        self.dispatcher = dispatcher
        self.trace_topic = trace_topic

    def end_transaction(self, context: EndTransactionContext) -> None:
        msg = context.message
        state = TransactionState(context.transaction_state)
        self.dispatcher.append(
            TraceContext(
                trace_type=TraceType.EndTransaction,
                timestamp=context.timestamp,
                region_id=context.region_id,
                group_name=context.producer_group,
                success=True,
                trace_beans=[
                    TraceBean(
                        topic=msg.topic,
                        msg_id=context.msg_id,
                        tags=msg.tags,
                        keys=msg.keys_str,
                        store_host=context.broker_address,
                        msg_type=MessageType.Trans_msg_Commit
                        if state == TransactionState.COMMIT_MESSAGE
                        else MessageType.Trans_Msg_Half,
                        transaction_id=context.transaction_id,
                        transaction_state=state,
                        from_transaction_check=context.from_transaction_check,
                    )
                ],
            )
        )
