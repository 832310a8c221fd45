"""tracemq.otel's send span over retries, which the stack cannot provoke on demand: one span per
send across its attempts, each failed attempt an ``exception`` event, the span ended once — OK
with the acknowledgement, ERROR after the last attempt — and the same W3C traceparent (the
span's own) in the headers of every attempt; a batch member's span is its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from tracemq import BatchSendError, Message, Producer, SendError
from tracemq.message import SendResult, SendStatus
from tracemq.otel import instrument
from tracemq.routing.model import QueueRoute

ROUTE = QueueRoute("broker-a", "c", 2, 2, 6, "127.0.0.1:1", "10.0.0.1:10911")


def _producer(fail: dict[bytes, int]) -> tuple[Producer, InMemorySpanExporter, list[Any]]:
    """A running producer whose transport refuses a body's first ``fail[body]`` attempts."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    p = Producer("PG", redis_url="redis://127.0.0.1:1/0", control_bootstrap="127.0.0.1:1")
    p._state = "running"
    instrument(p, provider)
    records: list[tuple[bytes, dict[str, bytes]]] = []

    async def queues(topic: str, **_: Any) -> Any:
        return None, [(ROUTE, 0), (ROUTE, 1)]

    async def produce(q: Any, place: Any, msg: Message, headers: Any) -> asyncio.Future[Any]:
        records.append((msg.body, dict(headers)))
        fut = asyncio.get_running_loop().create_future()
        if fail.get(msg.body, 0) > 0:
            fail[msg.body] -= 1
            fut.set_exception(RuntimeError(f"refused {msg.body!r}"))
        else:
            fut.set_result(len(records))
        return fut

    async def result(q: Any, place: Any, msg_id: str, md: Any) -> SendResult:
        return SendResult(SendStatus.SEND_OK, msg_id, f"off{md}", place.queue, md, "R", True)

    p._queues, p._produce, p._result = queues, produce, result  # type: ignore[method-assign]
    return p, exporter, records


def _traceparent(span: ReadableSpan) -> bytes:
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}".encode()


def _by_body(exporter: InMemorySpanExporter, records: list[Any]) -> dict[bytes, ReadableSpan]:
    spans = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}
    return {body: spans[h["UNIQ_KEY"].decode()] for body, h in records}


async def test_a_retried_send_is_one_span_with_the_failed_attempt_as_an_event() -> None:
    p, exporter, records = _producer({b"a": 1})
    await p.send(Message("T", b"a", tags="t", keys=["k"]))
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.OK
    assert span.attributes["tracemq.send.attempts"] == 2
    [event] = span.events
    assert event.name == "exception" and event.attributes["tracemq.send.retried"] is True
    assert [h["traceparent"] for _, h in records] == [_traceparent(span)] * 2


async def test_a_send_that_fails_every_attempt_ends_its_span_once_with_error() -> None:
    p, exporter, records = _producer({b"a": 99})
    with pytest.raises(SendError):
        await p.send(Message("T", b"a"))
    [span] = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "RuntimeError"
    assert [e.attributes["tracemq.send.retried"] for e in span.events] == [True, True, False]
    assert len(records) == 3 and {h["traceparent"] for _, h in records} == {_traceparent(span)}


async def test_each_batch_member_has_its_own_span() -> None:
    p, exporter, records = _producer({b"m1": 99})
    with pytest.raises(BatchSendError):
        await p.send_batch([Message("T", f"m{i}".encode()) for i in range(3)])
    spans = _by_body(exporter, records)
    assert len(exporter.get_finished_spans()) == 3  # each ended once
    assert spans[b"m1"].status.status_code == StatusCode.ERROR
    assert spans[b"m0"].status.status_code == spans[b"m2"].status.status_code == StatusCode.OK
    assert len(spans[b"m1"].events) == 3
    for body, headers in records:
        assert headers["traceparent"] == _traceparent(spans[body])
