"""OTLP ingest (tracemq_collector.otlp): real SDK spans encoded by the OTLP exporter's own
encoder, shaped as opentelemetry-instrumentation-aiokafka and tracemq.otel write them, become
Pub / SubBefore / SubAfter trace contexts; what a span cannot say is counted, not guessed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context
from tracemq.trace import ConsumeReturnType, TraceType
from tracemq_collector.errors import OtlpError
from tracemq_collector.otlp import (
    JSON,
    PROTOBUF,
    OtlpJoin,
    contexts_of,
    decode_request,
    msg_id_for,
)


def _spans(build: Any) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("opentelemetry.instrumentation.aiokafka"))
    return list(exporter.get_finished_spans())


def _kafka_pair(tracer: Any, *, fail: bool = False) -> None:
    """What the aiokafka instrumentation writes: a send span without an offset, a receive span
    (its child through the headers) with topic.partition.offset as the message id."""
    with tracer.start_as_current_span("orders send", kind=SpanKind.PRODUCER) as send:
        send.set_attributes({
            "messaging.system": "kafka", "messaging.destination.name": "orders",
            "messaging.operation.type": "publish", "messaging.kafka.message.key": "order-7",
        })  # fmt: skip
    with tracer.start_as_current_span(
        "orders receive", context=set_span_in_context(send), kind=SpanKind.CONSUMER
    ) as recv:
        recv.set_attributes({
            "messaging.system": "kafka", "messaging.destination.name": "orders",
            "messaging.destination.partition.id": "2", "messaging.kafka.message.offset": 41,
            "messaging.consumer.group.name": "billing", "messaging.operation.type": "receive",
            "messaging.message.id": "orders.2.41", "messaging.kafka.message.key": "order-7",
        })  # fmt: skip
        if fail:
            recv.set_status(Status(StatusCode.ERROR, "boom"))


def test_kafka_spans_join_to_one_message_in_either_order() -> None:
    spans = _spans(_kafka_pair)
    body = encode_spans(spans).SerializeToString()
    decoded = decode_request(body, PROTOBUF)
    assert len(decoded) == 2
    mid = msg_id_for("kafka", "orders.2.41")
    assert len(mid) == 32 and mid == mid.upper()
    for order in (decoded, decoded[::-1]):  # send first, or its child first
        join = OtlpJoin()
        ctxs, counts = contexts_of(list(order), join)
        by_type = {c.trace_type: c for c in ctxs}
        # the group is sighted at the Pub's time: the reconciliation expects it for this message
        pub_ms = by_type[TraceType.Pub].timestamp
        assert join.take_sightings() == {("billing", "orders"): (pub_ms, pub_ms)}
        assert set(by_type) == {TraceType.Pub, TraceType.SubBefore, TraceType.SubAfter}
        assert {c.trace_beans[0].msg_id for c in ctxs} == {mid}
        pub = by_type[TraceType.Pub]
        assert pub.group_name == "shop" and pub.success  # no producer group: service.name
        assert pub.trace_beans[0].keys == "order-7" and pub.trace_beans[0].topic == "orders"
        after = by_type[TraceType.SubAfter]
        assert after.group_name == "billing" and after.success
        assert after.request_id == by_type[TraceType.SubBefore].request_id
        assert counts["stored"] == 2


def test_a_kafka_send_nobody_received_waits_then_is_counted() -> None:
    send = [
        s
        for s in decode_request(encode_spans(_spans(_kafka_pair)).SerializeToString(), PROTOBUF)
        if s.kind == 4
    ]
    join = OtlpJoin(ttl_s=0.0)
    ctxs, counts = contexts_of(send, join)
    assert ctxs == [] and counts == {"pending": 1, "no_msg_id": 1}  # expired at once (ttl 0)
    assert join.waiting == 0


def test_failed_consume_and_what_cannot_be_known_as_json() -> None:
    spans = _spans(lambda t: _kafka_pair(t, fail=True))
    doc = json.loads(_otlp_json(spans))
    # a consume span with no group, a span of another kind, a tracemq client's own span
    extra = [
        _json_span(
            "a" * 32,
            "b" * 16,
            {
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "process",
                "messaging.message.id": "m-1",
            },
        ),
        _json_span("a" * 32, "c" * 16, {"http.method": "GET"}),
    ]
    doc["resourceSpans"][0]["scopeSpans"].append({"scope": {"name": "x"}, "spans": extra})
    doc["resourceSpans"][0]["scopeSpans"].append(
        {
            "scope": {"name": "tracemq"},
            "spans": [_json_span("a" * 32, "d" * 16, {"messaging.system": "rocketmq"})],
        }
    )
    ctxs, counts = contexts_of(decode_request(json.dumps(doc).encode(), JSON), OtlpJoin())
    after = next(c for c in ctxs if c.trace_type == TraceType.SubAfter)
    assert not after.success and after.context_code == ConsumeReturnType.FAILED
    assert counts == {"stored": 2, "pending": 1, "no_group": 1, "not_messaging": 1, "native": 1}


def test_tracemq_batch_span_gives_one_sub_pair_per_linked_message() -> None:
    ids = ["7F0000010001AB1200000000000000" + f"{n:02X}" for n in range(3)]

    def build(tracer: Any) -> None:
        links = []
        for mid in ids:
            with tracer.start_as_current_span("send T", kind=SpanKind.PRODUCER) as s:
                s.set_attributes({"messaging.system": "rocketmq", "messaging.operation.type": "send",
                                  "messaging.destination.name": "T", "messaging.message.id": mid,
                                  "messaging.rocketmq.client_group": "PG",
                                  "messaging.rocketmq.message.keys": ["a", "b"]})  # fmt: skip
            links.append(Link(s.get_span_context(), {"messaging.message.id": mid}))
        with tracer.start_as_current_span("process T", kind=SpanKind.CONSUMER, links=links) as p:
            p.set_attributes({"messaging.system": "rocketmq", "messaging.operation.type": "process",
                              "messaging.destination.name": "T", "messaging.batch.message_count": 3,
                              "messaging.rocketmq.client_group": "CG", "tracemq.reconsume_times": 2})  # fmt: skip

    ctxs, counts = contexts_of(
        decode_request(encode_spans(_spans(build)).SerializeToString(), PROTOBUF), OtlpJoin()
    )
    pubs = [c for c in ctxs if c.trace_type == TraceType.Pub]
    assert [p.trace_beans[0].msg_id for p in pubs] == ids
    assert {p.group_name for p in pubs} == {"PG"} and pubs[0].trace_beans[0].keys == "a b"
    befores = [c for c in ctxs if c.trace_type == TraceType.SubBefore]
    assert [b.trace_beans[0].msg_id for b in befores] == ids
    assert {b.trace_beans[0].retry_times for b in befores} == {2}
    assert len({b.request_id for b in befores}) == 3
    assert counts == {"stored": 4}


@pytest.mark.parametrize(
    ("body", "ctype", "reason"),
    [
        (b"\xff\xff\xff", PROTOBUF, "malformed_protobuf"),
        (b"{", JSON, "malformed_json"),
        (b'{"resourceSpans": {}}', JSON, "malformed_json"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}',
            JSON,
            "malformed_json",
        ),
        (b"{}", "text/plain", "unsupported_media_type"),
    ],
)
def test_malformed_requests_raise_otlp_error(body: bytes, ctype: str, reason: str) -> None:
    with pytest.raises(OtlpError) as info:
        decode_request(body, ctype)
    assert info.value.reason == reason


def _json_span(trace_id: str, span_id: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {
        "traceId": trace_id, "spanId": span_id, "name": "x", "kind": 5,
        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000005000000",
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
    }  # fmt: skip


def _otlp_json(spans: list[ReadableSpan]) -> str:
    """OTLP/JSON as the spec writes it (hex ids, integer enums, 64-bit integers as strings)."""
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(encode_spans(spans))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = _b64_to_hex(s[k])
                s["kind"] = {"SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}.get(s.get("kind"), 1)
                if "status" in s and "code" in s["status"]:
                    s["status"]["code"] = {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(
                        s["status"]["code"], 0
                    )
    return json.dumps(doc)


def _b64_to_hex(v: str) -> str:
    import base64

    return base64.b64decode(v).hex()


class _Dispatcher:
    """A trace dispatcher stand-in: keeps what it is given; ``settles`` decides the flush."""

    def __init__(self, settles: bool = True) -> None:
        self.contexts: list[Any] = []
        self.settles = settles

    def append(self, ctx: Any) -> bool:
        self.contexts.append(ctx)
        return True

    async def flush(self, timeout_s: float) -> bool:
        return self.settles


async def test_a_resent_request_adds_no_trace_record_twice() -> None:
    from tracemq_collector import metrics
    from tracemq_collector.otlp import OtlpReceiver

    body = encode_spans(_spans(_kafka_pair)).SerializeToString()
    dispatcher = _Dispatcher(settles=False)  # the first answer is a 503: the exporter resends
    receiver = OtlpReceiver(dispatcher)
    before = metrics.OTLP_SPANS.labels("duplicate")._value.get()

    status, _, _ = await receiver.export(body, PROTOBUF)
    assert status == 503
    first = len(dispatcher.contexts)
    assert first == 3  # the Pub, SubBefore and SubAfter of the one message

    dispatcher.settles = True
    status, _, _ = await receiver.export(body, PROTOBUF)  # the resend
    assert status == 200
    status, _, _ = await receiver.export(body, PROTOBUF)  # and a resend after a lost answer
    assert status == 200
    assert len(dispatcher.contexts) == first
    assert metrics.OTLP_SPANS.labels("duplicate")._value.get() - before == 4  # 2 spans x 2


def test_seen_spans_are_bounded_in_count_and_time() -> None:
    from tracemq_collector.otlp import SeenSpans, Span

    def span(i: int) -> Span:
        return Span(f"{i:032x}", f"{i:016x}", "", "s", 0, 0, 0, {})

    seen = SeenSpans(ttl_s=600, max_entries=3)
    seen.remember([span(i) for i in range(5)])
    assert len(seen) == 3
    fresh, repeated = seen.fresh([span(0), span(4), span(4)])
    assert [s.span_id for s in fresh] == [span(0).span_id] and repeated == 2

    aged = SeenSpans(ttl_s=0.0)
    aged.remember([span(1)])
    fresh, repeated = aged.fresh([span(1)])  # forgotten once older than the ttl
    assert len(fresh) == 1 and repeated == 0
