"""Pluggable hooks around sends, consumes and transaction ends (RocketMQ's SendMessageHook,
ConsumeMessageHook, EndTransactionHook). Message trace is one implementation; an OpenTelemetry
exporter could be another.

Any number of hooks may be registered on a client. A send hook whose ``send_message_before``
does nothing may say so with a class attribute ``observes_send_before = False``; the producer
then skips that call. A hook that raises is logged and counted in
``tracemq_hook_errors_total`` and never breaks the send or the consume it observes. Hooks run on
the event loop: they must not block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prometheus_client import Counter

from tracemq.log import get_logger

if TYPE_CHECKING:
    from tracemq.message import Message, MessageExt, MessageQueue, SendResult
    from tracemq.trace import MessageType

HOOK_ERRORS = Counter("tracemq_hook_errors_total", "Hook calls that raised", ["hook", "phase"])
log = get_logger("hooks")


@dataclass(slots=True)
class SendMessageContext:
    """One send attempt of one message. A send retried on another queue calls the hooks once
    per attempt (as RocketMQ does), each time with a new context of the same msgId."""

    producer_group: str
    message: Message
    msg_id: str
    msg_type: MessageType
    born_host: str
    queue: MessageQueue | None = None
    broker_address: str | None = None
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    begin_timestamp: int = 0  # epoch ms, just before this attempt
    end_timestamp: int = 0  # epoch ms, when its ack (or its failure) arrived
    send_result: SendResult | None = None
    exception: BaseException | None = None
    props: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1  # 1 for the first attempt of the send, 2 for its first retry, ...
    #: False while a failed attempt will be retried (set before ``send_message_after``)
    last_attempt: bool = True
    #: The record headers every attempt of the send carries; ``send_message_before`` of the
    #: first attempt may add propagation headers (W3C ``traceparent``). None where the hook
    #: observes a record already written (dead-letter moves).
    headers: list[tuple[str, bytes]] | None = None


@dataclass(slots=True)
class ConsumeMessageContext:
    """One listener call over ``messages`` (one or more messages from one queue)."""

    consumer_group: str
    messages: list[MessageExt]
    queue: MessageQueue
    client_host: str
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    #: per message: request id shared by its SubBefore and SubAfter
    request_ids: dict[str, str] = field(default_factory=dict)
    begin_timestamp: int = 0
    #: per message end time (ms); a message absent here ended with the call
    end_timestamps: dict[str, int] = field(default_factory=dict)
    end_timestamp: int = 0
    success: bool = False
    #: ConsumeReturnType ordinal (0 SUCCESS, 1 TIME_OUT, 2 EXCEPTION, 3 RETURNNULL, 4 FAILED)
    context_code: int = 0
    status: str = ""
    props: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class EndTransactionContext:
    producer_group: str
    message: Message
    msg_id: str
    broker_address: str
    transaction_id: str | None
    transaction_state: str
    from_transaction_check: bool
    region_id: str = "DefaultRegion"
    timestamp: int = 0


@runtime_checkable
class SendMessageHook(Protocol):
    def send_message_before(self, context: SendMessageContext) -> None: ...

    def send_message_after(self, context: SendMessageContext) -> None: ...


@runtime_checkable
class ConsumeMessageHook(Protocol):
    def consume_message_before(self, context: ConsumeMessageContext) -> None: ...

    def consume_message_after(self, context: ConsumeMessageContext) -> None: ...


@runtime_checkable
class EndTransactionHook(Protocol):
    def end_transaction(self, context: EndTransactionContext) -> None: ...


def call_hooks(hooks: list[Any], method: str, context: object) -> None:
    """Call ``method`` on every hook; a failure is logged and counted, never raised."""
    for hook in hooks:
        try:
            getattr(hook, method)(context)
        except Exception as exc:
            HOOK_ERRORS.labels(type(hook).__name__, method).inc()
            log.warning("hook raised", hook=type(hook).__name__, phase=method, error=repr(exc))
