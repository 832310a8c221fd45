"""Message trace as hooks: Pub from the send hook, SubBefore/SubAfter from the consume hook,
EndTransaction from the end-transaction hook. They build :class:`TraceContext` objects and hand
them to an asynchronous dispatcher; they never block and never raise into the business path.

Differences from RocketMQ (improvements, DESIGN §3): a failed send is traced with
``success=false`` and storeHost ``null``, one Pub per attempt; SubAfter's cost is per message (a listener may mark each message done), not
the batch average; the store time comes from the transport's acknowledgement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tracemq.trace._codec import pub_record, sub_after_record, sub_before_record
from tracemq.trace._model import MessageType, TraceBean, TraceContext, TraceType, TransactionState

if TYPE_CHECKING:
    from tracemq.hooks import ConsumeMessageContext, EndTransactionContext, SendMessageContext


#: an encoded record as the dispatcher queues it: (topic, region, text, msgId, keys)
_Record = tuple[str | None, str | None, str, str | None, str | None]


class _Appender(Protocol):
    def append(self, ctx: TraceContext) -> bool: ...

    def append_record(
        self, topic: str | None, region_id: str | None, record: str, msg_id: str | None,
        keys: str | None,
    ) -> bool: ...  # fmt: skip

    def append_records(self, items: list[_Record]) -> int: ...


class SendMessageTraceHook:
    """Turns every send into one Pub trace context."""

    #: the producer need not call send_message_before: it does nothing (one call less per send)
    observes_send_before = False

    def __init__(self, dispatcher: _Appender, trace_topic: str) -> None:
        self.dispatcher = dispatcher
        self.trace_topic = trace_topic

    def send_message_before(self, context: SendMessageContext) -> None:
        return None  # everything the Pub needs is known after the send

    def send_message_after(self, context: SendMessageContext) -> None:
        msg = context.message
        if msg.topic == self.trace_topic or not context.trace_on:
            return
        result = context.send_result
        cost = max(0, context.end_timestamp - context.begin_timestamp)
        keys = msg.keys_str
        # One Pub per attempt; a failed one names no store host: nothing was stored there.
        store_host = context.broker_address if result is not None else None
        record = pub_record(
            context.begin_timestamp, context.region_id, context.producer_group, msg.topic,
            context.msg_id, msg.tags, keys, store_host, len(msg.body), cost,
            context.msg_type, result.offset_msg_id if result else None, result is not None,
        )  # fmt: skip
        if record is not None:  # the usual case: no TraceContext built
            self.dispatcher.append_record(
                msg.topic, context.region_id, record, context.msg_id, keys
            )
            return
        bean = TraceBean(
            topic=msg.topic,
            msg_id=context.msg_id,
            offset_msg_id=result.offset_msg_id if result else None,
            tags=msg.tags,
            keys=msg.keys_str,
            store_host=store_host,
            client_host=context.born_host,
            store_time=result.store_timestamp if result else 0,
            body_length=len(msg.body),
            msg_type=context.msg_type,
        )
        self.dispatcher.append(
            TraceContext(
                trace_type=TraceType.Pub,
                timestamp=context.begin_timestamp,
                region_id=context.region_id,
                group_name=context.producer_group,
                cost_time=cost,
                success=result is not None,
                trace_beans=[bean],
            )
        )


class ConsumeMessageTraceHook:
    """SubBefore for every message before the listener runs, SubAfter after it returns."""

    def __init__(self, dispatcher: _Appender, trace_topic: str) -> None:
        self.dispatcher = dispatcher
        self.trace_topic = trace_topic

    def consume_message_before(self, context: ConsumeMessageContext) -> None:
        # (this and consume_message_after run once per listener call: for the default
        # one-message calls, once per consumed message; hence the local names and one enqueue
        # per call, not per message)
        if not context.trace_on or context.queue.topic == self.trace_topic:
            return
        ts, region, group = context.begin_timestamp, context.region_id, context.consumer_group
        request_ids = context.request_ids
        items: list[_Record] = []
        for msg in context.messages:
            msg_id, keys = msg.msg_id, msg.keys
            record = sub_before_record(
                ts, region, group, request_ids.get(msg_id), msg_id, msg.reconsume_times, keys
            )
            if record is not None:
                items.append((msg.topic, region, record, msg_id, keys))
                continue
            self.dispatcher.append(
                TraceContext(
                    trace_type=TraceType.SubBefore,
                    timestamp=context.begin_timestamp,
                    region_id=context.region_id,
                    group_name=context.consumer_group,
                    request_id=context.request_ids.get(msg.msg_id),
                    trace_beans=[
                        TraceBean(
                            topic=msg.topic,
                            msg_id=msg.msg_id,
                            tags=msg.tags,
                            keys=msg.keys,
                            store_host=msg.store_host,
                            client_host=context.client_host,
                            store_time=msg.store_timestamp,
                            retry_times=msg.reconsume_times,
                            body_length=len(msg.body),
                        )
                    ],
                )
            )
        self._append(items)

    def _append(self, items: list[_Record]) -> None:
        if items:
            self.dispatcher.append_records(items)

    def consume_message_after(self, context: ConsumeMessageContext) -> None:
        if not context.trace_on or context.queue.topic == self.trace_topic:
            return
        region, group, success = context.region_id, context.consumer_group, context.success
        code, request_ids, ends = context.context_code, context.request_ids, context.end_timestamps
        begin, end_all = context.begin_timestamp, context.end_timestamp
        items: list[_Record] = []
        for msg in context.messages:
            msg_id, keys = msg.msg_id, msg.keys
            end = ends.get(msg_id, end_all) if ends else end_all
            record = sub_after_record(
                request_ids.get(msg_id), msg_id, end - begin if end > begin else 0, success, keys,
                code, end, group,
            )  # fmt: skip
            if record is not None:
                items.append((msg.topic, region, record, msg_id, keys))
                continue
            self.dispatcher.append(
                TraceContext(
                    trace_type=TraceType.SubAfter,
                    timestamp=end,
                    region_id=context.region_id,
                    group_name=context.consumer_group,
                    request_id=context.request_ids.get(msg.msg_id),
                    cost_time=max(0, end - context.begin_timestamp),
                    success=context.success,
                    context_code=context.context_code,
                    trace_beans=[
                        TraceBean(
                            topic=msg.topic,
                            msg_id=msg.msg_id,
                            keys=msg.keys,
                            tags=msg.tags,
                            client_host=context.client_host,
                            retry_times=msg.reconsume_times,
                        )
                    ],
                )
            )
        self._append(items)


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
