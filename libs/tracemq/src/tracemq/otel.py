"""OpenTelemetry spans for sends and consumes, as send and consume hooks (opt-in).

``instrument(client)`` registers hooks on a :class:`~tracemq.Producer`, a
:class:`~tracemq.PushConsumer` or a :class:`~tracemq.LitePullConsumer`; nothing is emitted
otherwise. Only ``opentelemetry-api`` is needed; without an SDK configured (``pip install
tracemq[otel]`` and a ``TracerProvider``) the API's spans are no-ops.

Guarantees:

* One ``send <topic>`` span (kind PRODUCER) per ``send()`` / ``send_oneway()`` / batch member,
  covering every attempt: a failed attempt that is retried is an ``exception`` event with
  ``tracemq.send.attempt``; the span ends with the acknowledgement (status OK) or with the
  last failed attempt (status ERROR). The span is a child of the caller's current span, so a
  user's own span around ``producer.send()`` becomes its parent.
* The span's context travels with the message as W3C ``traceparent`` (and ``tracestate`` /
  ``baggage`` if any; whatever the globally configured propagator writes) in the record headers,
  so it survives retries and dead-letter moves (they copy the properties).
* One ``process <topic>`` span (kind CONSUMER) per listener call: over one message it is a
  child of the message's send span; over several (``consume_message_batch_max_size`` > 1) it
  has no remote parent and links to each message's send span, with
  ``messaging.batch.message_count``. A redelivered message has ``tracemq.reconsume_times`` and
  a ``retry`` event; a failed call has status ERROR and, for each failed message, an event
  ``retry_later`` — or ``dead_letter`` when its retries are used up (it moves to the dead-letter
  queue) — with its msgId.
* Attributes follow the messaging semantic conventions for RocketMQ (``messaging.system`` =
  ``rocketmq``, ``messaging.operation.type``, ``messaging.destination.name``,
  ``messaging.message.id``, ``messaging.consumer.group.name``,
  ``messaging.rocketmq.client_group``, ``messaging.rocketmq.message.tag`` / ``.keys`` /
  ``.delay_time_level`` / ``.type``). The hooks never raise into a send or a consume (see
  :mod:`tracemq.hooks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Setter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tracemq.message import MessageConst
from tracemq.trace._model import MessageType

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from tracemq.hooks import ConsumeMessageContext, SendMessageContext
    from tracemq.message import MessageExt

__all__ = ["OtelConsumeHook", "OtelSendHook", "instrument"]

SYSTEM = "rocketmq"
_SPAN = "tracemq.otel.span"
_SCOPE = "tracemq"

#: RocketMQ's message types as the semantic conventions name them
_TYPES = {
    MessageType.Normal_Msg: "normal",
    MessageType.Order_Msg: "fifo",
    MessageType.Delay_Msg: "delay",
    MessageType.Trans_Msg_Half: "transaction",
    MessageType.Trans_msg_Commit: "transaction",
}


class _HeaderSetter(Setter[list[tuple[str, bytes]]]):
    """Writes propagation fields into a record's header list, replacing any earlier value."""

    def set(self, carrier: list[tuple[str, bytes]], key: str, value: str) -> None:
        carrier[:] = [(k, v) for k, v in carrier if k != key]
        carrier.append((key, value.encode()))


_SETTER = _HeaderSetter()


def _tracer(provider: TracerProvider | None) -> Tracer:
    from tracemq import __version__

    return trace.get_tracer(_SCOPE, __version__, tracer_provider=provider)


def message_context(msg: MessageExt) -> Any:
    """The OTel context a consumed message carries (empty if it carries none)."""
    return propagate.extract(msg.properties)


class OtelSendHook:
    """Send hook: one PRODUCER span per send (all its attempts), its context in the headers."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer = _tracer(tracer_provider)

    def send_message_before(self, context: SendMessageContext) -> None:
        span: Span | None = context.props.get(_SPAN)
        if span is not None:  # a retry: the same span, the same traceparent
            return
        msg = context.message
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": msg.topic,
            "messaging.message.id": context.msg_id,
            "messaging.rocketmq.client_group": context.producer_group,
            "messaging.rocketmq.message.type": _TYPES.get(context.msg_type, "normal"),
            "messaging.message.body.size": len(msg.body),
        }
        if msg.tags:
            attrs["messaging.rocketmq.message.tag"] = msg.tags
        if msg.keys:
            attrs["messaging.rocketmq.message.keys"] = list(msg.keys)
        if msg.delay_level:
            attrs["messaging.rocketmq.message.delay_time_level"] = msg.delay_level
        span = self._tracer.start_span(
            f"send {msg.topic}", kind=SpanKind.PRODUCER, attributes=attrs
        )
        context.props[_SPAN] = span
        if context.headers is not None:
            propagate.inject(context.headers, trace.set_span_in_context(span), setter=_SETTER)

    def send_message_after(self, context: SendMessageContext) -> None:
        span: Span | None = context.props.get(_SPAN)
        if span is None:
            return
        if context.queue is not None:
            span.set_attribute("messaging.destination.partition.id", str(context.queue.queue_id))
        if context.broker_address:
            span.set_attribute("server.address", context.broker_address)
        span.set_attribute("tracemq.send.attempts", context.attempt)
        result = context.send_result
        if result is None:
            exc = context.exception
            span.add_event(
                "exception",
                {
                    "exception.type": type(exc).__name__ if exc else "SendError",
                    "exception.message": str(exc) if exc else "",
                    "tracemq.send.attempt": context.attempt,
                    "tracemq.send.retried": not context.last_attempt,
                },
            )
            if not context.last_attempt:
                return
            span.set_attribute("error.type", type(exc).__name__ if exc else "SendError")
            span.set_status(Status(StatusCode.ERROR, str(exc) if exc else "send failed"))
        else:
            span.set_attribute("tracemq.offset_msg_id", result.offset_msg_id)
            span.set_status(Status(StatusCode.OK))
        context.props.pop(_SPAN, None)
        span.end()


class OtelConsumeHook:
    """Consume hook: one CONSUMER ``process`` span per listener call (see the module doc)."""

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, max_reconsume_times: int = 16
    ) -> None:
        self._tracer = _tracer(tracer_provider)
        self.max_reconsume_times = max_reconsume_times

    def consume_message_before(self, context: ConsumeMessageContext) -> None:
        msgs = context.messages
        if not msgs:
            return
        topic = context.queue.topic
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(context.queue.queue_id),
            "messaging.consumer.group.name": context.consumer_group,
            "messaging.rocketmq.client_group": context.consumer_group,
        }
        parent = None
        links: list[Link] = []
        if len(msgs) == 1:
            m = msgs[0]
            attrs.update(_message_attrs(m))
            parent = message_context(m)
        else:
            attrs["messaging.batch.message_count"] = len(msgs)
            for m in msgs:
                sc = trace.get_current_span(message_context(m)).get_span_context()
                if sc.is_valid:
                    links.append(Link(sc, {"messaging.message.id": m.msg_id}))
        span = self._tracer.start_span(
            f"process {topic}", context=parent, kind=SpanKind.CONSUMER, attributes=attrs,
            links=links,
        )  # fmt: skip
        for m in msgs:
            if m.reconsume_times:
                span.add_event(
                    "retry",
                    {
                        "messaging.message.id": m.msg_id,
                        "tracemq.reconsume_times": m.reconsume_times,
                    },
                )
        context.props[_SPAN] = span

    def consume_message_after(self, context: ConsumeMessageContext) -> None:
        span: Span | None = context.props.pop(_SPAN, None)
        if span is None:
            return
        span.set_attribute("tracemq.consume.status", context.status or str(context.context_code))
        if context.success:
            span.set_status(Status(StatusCode.OK))
        else:
            span.set_attribute("error.type", context.status or "FAILED")
            span.set_status(Status(StatusCode.ERROR, context.status or "consume failed"))
            for m in context.messages:
                limit = _max_reconsume(m, self.max_reconsume_times)
                span.add_event(
                    "dead_letter" if m.reconsume_times >= limit else "retry_later",
                    {
                        "messaging.message.id": m.msg_id,
                        "tracemq.reconsume_times": m.reconsume_times,
                    },
                )
        span.end()


def _message_attrs(m: MessageExt) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "messaging.message.id": m.msg_id,
        "messaging.message.body.size": len(m.body),
    }
    if m.tags:
        attrs["messaging.rocketmq.message.tag"] = m.tags
    if m.key_list:
        attrs["messaging.rocketmq.message.keys"] = m.key_list
    if m.delay_level:
        attrs["messaging.rocketmq.message.delay_time_level"] = m.delay_level
    if m.reconsume_times:
        attrs["tracemq.reconsume_times"] = m.reconsume_times
    if m.offset_msg_id:
        attrs["tracemq.offset_msg_id"] = m.offset_msg_id
    return attrs


def _max_reconsume(m: MessageExt, default: int) -> int:
    raw = m.properties.get(MessageConst.MAX_RECONSUME_TIMES)
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def instrument(client: Any, tracer_provider: TracerProvider | None = None) -> Any:
    """Register OTel hooks on a producer (send spans; a transaction producer too) or a
    consumer (process spans). Returns the client. ``tracer_provider`` defaults to the global
    one. Call before ``start()``."""
    if hasattr(client, "register_send_hook"):
        client.register_send_hook(OtelSendHook(tracer_provider))
    elif hasattr(client, "register_consume_hook"):
        limit = getattr(client, "max_reconsume_times", 16)
        client.register_consume_hook(OtelConsumeHook(tracer_provider, max_reconsume_times=limit))
    else:
        raise TypeError(f"cannot instrument a {type(client).__name__}: not a tracemq client")
    return client
