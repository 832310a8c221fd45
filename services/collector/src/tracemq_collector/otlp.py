"""OTLP/HTTP trace ingest: messaging spans → RocketMQ trace records on the trace topic.

``POST /v1/traces`` takes an ``ExportTraceServiceRequest`` as protobuf
(``application/x-protobuf``) or as OTLP/JSON (``application/json``: hex ids, integer enums).
:func:`decode_request` turns any body into :class:`Span` values or raises
:class:`~tracemq_collector.errors.OtlpError` — never anything else, whatever the bytes.

:func:`contexts_of` maps *messaging* spans (``messaging.system`` set) to trace contexts:

* a ``send`` / ``publish`` / ``create`` span (or kind PRODUCER) → one **Pub** (its start, its
  duration as the cost, success unless its status is ERROR);
* a ``process`` / ``receive`` / ``deliver`` span (or kind CONSUMER) → **SubBefore** at its start
  and **SubAfter** at its end per message (success unless ERROR, the duration as the cost,
  the retry count from ``tracemq.reconsume_times``); over a batch, per linked message.

The msgId is ``messaging.message.id``; a Kafka message without one (a plain Kafka client's
span) is ``<topic>.<partition>.<offset>`` — the identity the OTel Kafka instrumentations
publish themselves (``opentelemetry-instrumentation-aiokafka`` sets exactly that id on a
receive span), unique within one Kafka cluster. A Kafka *send* span knows no offset: its msgId
is learnt from a receive span that is its child (the W3C ``traceparent`` in the record
headers makes it one), whichever arrives first; a send waits for that at most
``join_ttl_s`` (bounded by ``join_max``) and is then counted as ``no_msg_id``. The group of a
Pub is ``messaging.rocketmq.client_group``, else the resource's ``service.name``; a consume span
without a group (``messaging.consumer.group.name``, ``messaging.rocketmq.client_group``,
``messaging.kafka.consumer.group``) is counted as ``no_group``, not guessed. Spans of tracemq's
own clients (scope ``tracemq``) are counted as ``native`` and skipped: those clients write
their trace records themselves.

The contexts go through the collector's own trace dispatcher to the trace topic, so they are
stored, deduplicated, written to the lake and reconciled exactly as client-written records.
An exporter resends a request it got no 2xx for (a timeout, a 503): :class:`SeenSpans`
remembers the (trace id, span id) of every span handed to the dispatcher (bounded in count and
time), and a span seen again is counted ``duplicate`` and skipped, so a retry never doubles a
Pub or a consume. A retry that reaches *another* collector is not caught.
The consumer groups the spans name are merged into the subscription history (``P subhistory``,
expression ``*``, CLUSTERING; first/last seen = the Pub time of the messages they consumed where
the collector knows it, else the consume's start), as the nameserver does for heartbeating
clients, so the reconciliation expects them. A plain Kafka topic has no tracemq route, so the
reconciliation has no committed offsets for it: a message without a consume trace is
NOT_CONSUMED there, never TRACE_LOST.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tracemq.log import get_logger
from tracemq.trace import (
    ConsumeReturnType,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    encode,
)

from tracemq_collector import metrics
from tracemq_collector.errors import OtlpError
from tracemq_collector.openapi import LOOKUP_ID_PATTERN

__all__ = [
    "JSON",
    "PROTOBUF",
    "OtlpJoin",
    "OtlpReceiver",
    "Span",
    "contexts_of",
    "decode_request",
    "msg_id_for",
]

log = get_logger("collector.otlp")
_LOOKUP_ID = re.compile(LOOKUP_ID_PATTERN)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
REGION = "DefaultRegion"
_NATIVE_SCOPE = "tracemq"
#: A piece of a request no sane exporter sends; bounds the work one request can cause.
MAX_SPANS_PER_REQUEST = 100_000
_MAX_ATTR_CHARS = 65_536

SPAN_KIND_PRODUCER, SPAN_KIND_CONSUMER = 4, 5
STATUS_ERROR = 2
_SEND_OPS = {"send", "publish", "create"}
_CONSUME_OPS = {"process", "receive", "deliver", "settle"}


@dataclass(slots=True)
class Span:
    """The parts of an OTLP span the mapping reads (ids as lowercase hex)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int = 0
    scope: str = ""
    resource: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


# -- decoding ------------------------------------------------------------------------------
def decode_request(body: bytes, content_type: str) -> list[Span]:
    """The spans of an OTLP trace export request; :class:`OtlpError` for anything else."""
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype == PROTOBUF:
        return _from_protobuf(body)
    if ctype == JSON:
        return _from_json(body)
    raise OtlpError("unsupported_media_type", f"content type must be {PROTOBUF} or {JSON}")


def _from_protobuf(body: bytes) -> list[Span]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        req = ExportTraceServiceRequest.FromString(body)
        return list(_limit(_proto_spans(req)))
    except OtlpError:
        raise
    except Exception as exc:  # DecodeError, RecursionError, bad UTF-8: all "not OTLP"
        raise OtlpError(
            "malformed_protobuf", f"not an OTLP ExportTraceServiceRequest: {exc}"
        ) from None


def _proto_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_proto_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _proto_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def _proto_attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _proto_value(kv.value) for kv in kvs}


def _proto_spans(req: Any) -> Iterator[Span]:
    for rs in req.resource_spans:
        resource = _proto_attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope = ss.scope.name
            for s in ss.spans:
                yield Span(
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(),
                    name=s.name,
                    kind=int(s.kind),
                    start_ns=int(s.start_time_unix_nano),
                    end_ns=int(s.end_time_unix_nano),
                    attributes=_proto_attrs(s.attributes),
                    status_code=int(s.status.code),
                    scope=scope,
                    resource=resource,
                    events=[e.name for e in s.events],
                    links=[
                        (lk.trace_id.hex(), lk.span_id.hex(), _proto_attrs(lk.attributes))
                        for lk in s.links
                    ],
                )


def _limit(spans: Iterator[Span]) -> Iterator[Span]:
    for n, s in enumerate(spans):
        if n >= MAX_SPANS_PER_REQUEST:
            raise OtlpError("too_many_spans", f"more than {MAX_SPANS_PER_REQUEST} spans")
        yield s


def _from_json(body: bytes) -> list[Span]:
    try:
        doc = json.loads(body)
        return list(_limit(_json_spans(doc)))
    except OtlpError:
        raise
    except Exception as exc:  # bad UTF-8 or JSON, a field of the wrong type, deep nesting
        raise OtlpError(
            "malformed_json", f"not an OTLP/JSON ExportTraceServiceRequest: {exc}"
        ) from None


def _obj(v: Any, what: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise OtlpError("malformed_json", f"{what} must be an object")
    return v


def _arr(v: Any, what: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise OtlpError("malformed_json", f"{what} must be an array")
    return v


def _str(v: Any, what: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise OtlpError("malformed_json", f"{what} must be a string")
    return v


def _int(v: Any, what: str) -> int:
    """OTLP/JSON writes 64-bit integers as decimal strings (numbers are accepted too)."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise OtlpError("malformed_json", f"{what} must be an integer")
    if isinstance(v, str):
        if not v.lstrip("-").isascii() or not v.lstrip("-").isdigit() or len(v) > 20:
            raise OtlpError("malformed_json", f"{what} must be an integer")
        v = int(v)
    if not -(2**63) <= v < 2**64:
        raise OtlpError("malformed_json", f"{what} is out of range")
    return v


def _hex_id(v: Any, size: int, what: str) -> str:
    text = _str(v, what).lower()
    if text and (len(text) != size * 2 or any(c not in "0123456789abcdef" for c in text)):
        raise OtlpError("malformed_json", f"{what} must be {size * 2} hex digits")
    return text


def _json_value(v: Any) -> Any:
    v = _obj(v, "attribute value")
    if "stringValue" in v:
        return _str(v["stringValue"], "stringValue")
    if "boolValue" in v:
        if not isinstance(v["boolValue"], bool):
            raise OtlpError("malformed_json", "boolValue must be a boolean")
        return v["boolValue"]
    if "intValue" in v:
        return _int(v["intValue"], "intValue")
    if "doubleValue" in v:
        d = v["doubleValue"]
        if isinstance(d, bool) or not isinstance(d, int | float):
            raise OtlpError("malformed_json", "doubleValue must be a number")
        return float(d)
    if "arrayValue" in v:
        arr = _obj(v["arrayValue"], "arrayValue")
        return [_json_value(x) for x in _arr(arr.get("values"), "arrayValue.values")]
    if "kvlistValue" in v:
        return _json_attrs(_obj(v["kvlistValue"], "kvlistValue").get("values"))
    if "bytesValue" in v:
        return _str(v["bytesValue"], "bytesValue")
    return None


def _json_attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _arr(kvs, "attributes"):
        kv = _obj(kv, "attribute")
        out[_str(kv.get("key"), "attribute key")] = _json_value(kv.get("value"))
    return out


def _json_spans(doc: Any) -> Iterator[Span]:
    for rs in _arr(_obj(doc, "request").get("resourceSpans"), "resourceSpans"):
        rs = _obj(rs, "resourceSpans[]")
        resource = _json_attrs(_obj(rs.get("resource"), "resource").get("attributes"))
        for ss in _arr(rs.get("scopeSpans"), "scopeSpans"):
            ss = _obj(ss, "scopeSpans[]")
            scope = _str(_obj(ss.get("scope"), "scope").get("name"), "scope.name")
            for s in _arr(ss.get("spans"), "spans"):
                s = _obj(s, "span")
                yield Span(
                    trace_id=_hex_id(s.get("traceId"), 16, "traceId"),
                    span_id=_hex_id(s.get("spanId"), 8, "spanId"),
                    parent_span_id=_hex_id(s.get("parentSpanId"), 8, "parentSpanId"),
                    name=_str(s.get("name"), "name"),
                    kind=_int(s.get("kind"), "kind"),
                    start_ns=_int(s.get("startTimeUnixNano"), "startTimeUnixNano"),
                    end_ns=_int(s.get("endTimeUnixNano"), "endTimeUnixNano"),
                    attributes=_json_attrs(s.get("attributes")),
                    status_code=_int(_obj(s.get("status"), "status").get("code"), "status.code"),
                    scope=scope,
                    resource=resource,
                    events=[
                        _str(_obj(e, "event").get("name"), "event.name")
                        for e in _arr(s.get("events"), "events")
                    ],
                    links=[
                        (
                            _hex_id(_obj(lk, "link").get("traceId"), 16, "link.traceId"),
                            _hex_id(lk.get("spanId"), 8, "link.spanId"),
                            _json_attrs(lk.get("attributes")),
                        )
                        for lk in _arr(s.get("links"), "links")
                    ],
                )


# -- mapping -------------------------------------------------------------------------------
def _text_attr(attrs: dict[str, Any], *names: str) -> str | None:
    for n in names:
        v = attrs.get(n)
        if isinstance(v, str) and v:
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
    return None


def _keys(attrs: dict[str, Any]) -> str | None:
    v = attrs.get("messaging.rocketmq.message.keys")
    if isinstance(v, list):
        keys = [k for k in v if isinstance(k, str) and k]
        return " ".join(keys) or None
    return _text_attr(attrs, "messaging.rocketmq.message.keys", "messaging.kafka.message.key")


def _kafka_id(attrs: dict[str, Any]) -> str | None:
    topic = _text_attr(attrs, "messaging.destination.name")
    part = _text_attr(
        attrs, "messaging.destination.partition.id", "messaging.kafka.destination.partition"
    )
    offset = _text_attr(attrs, "messaging.kafka.message.offset", "messaging.kafka.offset")
    if topic and part and offset:
        return f"{topic}.{part}.{offset}"
    return None


def msg_id_for(system: str, raw_id: str) -> str:
    """The tracemq msgId of a message whose own id is ``raw_id``: the id itself when it is one
    tracemq can look up (32 or 56 hex digits, as RocketMQ's), else 32 uppercase hex digits
    derived from ``<system>:<raw_id>`` (for Kafka ``raw_id`` is ``<topic>.<partition>.<offset>``),
    so every span of the message, whoever wrote it, names the same msgId."""
    if _LOOKUP_ID.fullmatch(raw_id):
        return raw_id.upper()
    return hashlib.sha256(f"{system}:{raw_id}".encode()).hexdigest()[:32].upper()


def _msg_id(attrs: dict[str, Any]) -> str | None:
    system = _text_attr(attrs, "messaging.system") or ""
    mid = _kafka_id(attrs) if system == "kafka" else None
    mid = mid or _text_attr(attrs, "messaging.message.id")
    return None if mid is None else msg_id_for(system, mid)


def _operation(span: Span) -> str | None:
    op = _text_attr(span.attributes, "messaging.operation.type", "messaging.operation")
    if op in _SEND_OPS or (op is None and span.kind == SPAN_KIND_PRODUCER):
        return "send"
    if op in _CONSUME_OPS or (op is None and span.kind == SPAN_KIND_CONSUMER):
        return "consume"
    return None


def _ms(ns: int) -> int:
    return max(0, ns // 1_000_000)


def _cost(span: Span) -> int:
    return min(2**31 - 1, max(0, _ms(span.end_ns) - _ms(span.start_ns)))


def _pub(span: Span, msg_id: str) -> TraceContext:
    a = span.attributes
    delay = a.get("messaging.rocketmq.message.delay_time_level")
    size = a.get("messaging.message.body.size")
    group = _text_attr(a, "messaging.rocketmq.client_group") or _text_attr(
        span.resource, "service.name"
    )
    return TraceContext(
        trace_type=TraceType.Pub,
        timestamp=_ms(span.start_ns),
        region_id=REGION,
        group_name=group or "",
        cost_time=_cost(span),
        success=span.status_code != STATUS_ERROR,
        trace_beans=[
            TraceBean(
                topic=_text_attr(a, "messaging.destination.name") or "",
                msg_id=msg_id,
                tags=_text_attr(a, "messaging.rocketmq.message.tag"),
                keys=_keys(a),
                body_length=size if isinstance(size, int) and 0 <= size < 2**31 else 0,
                msg_type=MessageType.Delay_Msg
                if isinstance(delay, int) and delay > 0
                else MessageType.Normal_Msg,
            )
        ],
    )


def _subs(span: Span, group: str, msgs: list[tuple[str, dict[str, Any]]]) -> list[TraceContext]:
    a = span.attributes
    success = span.status_code != STATUS_ERROR
    code = ConsumeReturnType.SUCCESS
    if not success:
        code = (
            ConsumeReturnType.EXCEPTION if "exception" in span.events else ConsumeReturnType.FAILED
        )
    retry = a.get("tracemq.reconsume_times")
    retries = retry if isinstance(retry, int) and 0 <= retry < 2**31 else 0
    topic = _text_attr(a, "messaging.destination.name") or ""
    out = []
    for n, (msg_id, attrs) in enumerate(msgs):
        # pairs SubBefore with SubAfter: unique per span and message
        request_id = f"{span.span_id}{n:04x}" if len(msgs) > 1 else span.span_id
        keys, tags = _keys(attrs), _text_attr(attrs, "messaging.rocketmq.message.tag")
        out.append(
            TraceContext(
                trace_type=TraceType.SubBefore,
                timestamp=_ms(span.start_ns),
                region_id=REGION,
                group_name=group,
                request_id=request_id,
                trace_beans=[
                    TraceBean(topic=topic, msg_id=msg_id, tags=tags, keys=keys, retry_times=retries)
                ],
            )
        )
        out.append(
            TraceContext(
                trace_type=TraceType.SubAfter,
                timestamp=_ms(span.end_ns),
                region_id=REGION,
                group_name=group,
                request_id=request_id,
                cost_time=_cost(span),
                success=success,
                context_code=int(code),
                trace_beans=[
                    TraceBean(topic=topic, msg_id=msg_id, tags=tags, keys=keys, retry_times=retries)
                ],
            )
        )
    return out


class OtlpJoin:
    """What spans of one message tell each other across requests, bounded in size and time:
    Kafka send spans waiting for their msgId from a child receive span, receive spans' msgIds
    (and groups) waiting for their send span, and the Pub time of resolved sends.

    ``sightings`` collects, per (consumer group, topic), the earliest and latest Pub time of a
    message the group was seen consuming (the consume's own start where the Pub is not known
    here): the subscription history the reconciliation expects groups from."""

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 100_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._sends: OrderedDict[tuple[str, str], tuple[float, Span]] = OrderedDict()
        self._ids: OrderedDict[tuple[str, str], tuple[float, str, list[tuple[str, str]]]] = (
            OrderedDict()
        )
        self._pub_ms: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()
        self.sightings: dict[tuple[str, str], tuple[int, int]] = {}

    def sighted(self, group: str, topic: str, ts: int) -> None:
        first, last = self.sightings.get((group, topic), (ts, ts))
        self.sightings[(group, topic)] = (min(first, ts), max(last, ts))

    def take_sightings(self) -> dict[tuple[str, str], tuple[int, int]]:
        out, self.sightings = self.sightings, {}
        return out

    def send_waits(self, span: Span) -> str | None:
        """The msgId a child already told for ``span``, else None (``span`` now waits)."""
        key = (span.trace_id, span.span_id)
        hit = self._ids.get(key)
        if hit is not None:
            self.resolved(span)
            for group, topic in hit[2]:
                self.sighted(group, topic, _ms(span.start_ns))
            return hit[1]
        self._sends[key] = (time.monotonic(), span)
        return None

    def resolved(self, send: Span) -> None:
        self._pub_ms[(send.trace_id, send.span_id)] = (time.monotonic(), _ms(send.start_ns))

    def child_seen(self, span: Span, msg_id: str, group: str | None, topic: str) -> Span | None:
        """Record that ``span``'s parent sent ``msg_id``; the waiting send span, if any."""
        if not span.parent_span_id:
            return None
        key = (span.trace_id, span.parent_span_id)
        known = self._ids.get(key)
        groups = known[2] if known is not None else []
        pub = self._pub_ms.get(key)
        hit = self._sends.pop(key, None)
        if hit is not None:
            self.resolved(hit[1])
            pub = (0.0, _ms(hit[1].start_ns))
        if group is not None:
            if pub is not None:
                self.sighted(group, topic, pub[1])
            elif (group, topic) not in groups:
                groups.append((group, topic))  # told when the send span arrives
        self._ids[key] = (time.monotonic(), msg_id, groups)
        self._ids.move_to_end(key)
        return hit[1] if hit is not None else None

    def expire(self) -> int:
        """Forget what is too old or too much; the number of send spans given up."""
        cutoff = time.monotonic() - self.ttl_s
        lost = 0
        tables: list[OrderedDict[Any, Any]] = [self._sends, self._ids, self._pub_ms]
        for table in tables:
            while table and (
                len(table) > self.max_entries or next(iter(table.values()))[0] < cutoff
            ):
                table.popitem(last=False)
                lost += table is self._sends
        return lost

    @property
    def waiting(self) -> int:
        return len(self._sends)


def contexts_of(spans: list[Span], join: OtlpJoin) -> tuple[list[TraceContext], dict[str, int]]:
    """Trace contexts of ``spans`` and a count of every span per result (``stored``,
    ``pending``, ``not_messaging``, ``native``, ``no_msg_id``, ``no_group``, ``invalid``)."""
    out: list[TraceContext] = []
    counts: dict[str, int] = {}

    def count(result: str, n: int = 1) -> None:
        counts[result] = counts.get(result, 0) + n

    def add(ctxs: list[TraceContext]) -> bool:
        try:
            for c in ctxs:  # a field the text format cannot carry refuses the whole span
                encode(c)
        except Exception:  # noqa: BLE001 - any field the codec refuses
            count("invalid")
            return False
        out.extend(ctxs)
        count("stored")
        return True

    for span in spans:
        a = span.attributes
        if "messaging.system" not in a:
            count("not_messaging")
            continue
        if span.scope == _NATIVE_SCOPE:
            count("native")
            continue
        if any(isinstance(v, str) and len(v) > _MAX_ATTR_CHARS for v in a.values()):
            count("invalid")
            continue
        op = _operation(span)
        if op == "send":
            mid = _msg_id(a)
            if mid is None:
                if a.get("messaging.system") != "kafka":
                    count("no_msg_id")
                    continue
                mid = join.send_waits(span)
                if mid is None:
                    count("pending")
                    continue
            add([_pub(span, mid)])
        elif op == "consume":
            group = _text_attr(
                a, "messaging.consumer.group.name", "messaging.rocketmq.client_group",
                "messaging.kafka.consumer.group",
            )  # fmt: skip
            msgs: list[tuple[str, dict[str, Any]]] = []
            mid = _msg_id(a)
            topic = _text_attr(a, "messaging.destination.name") or ""
            if mid is not None:
                msgs.append((mid, a))
                waiting = join.child_seen(span, mid, group, topic)
                if waiting is not None:  # counted "pending" before; now "stored" (or not)
                    add([_pub(waiting, mid)])
            else:
                for _, _, la in span.links:
                    lid = _msg_id({**a, **la})
                    if lid is not None:
                        msgs.append((lid, {**a, **la}))
            if not msgs:
                count("no_msg_id")
                continue
            if group is None:
                count("no_group")
                continue
            if add(_subs(span, group, msgs)) and (
                a.get("messaging.system") != "kafka" or not span.parent_span_id
            ):
                # no Pub time here (a Kafka child's sighting is its send's Pub time, above)
                join.sighted(group, topic, _ms(span.start_ns))
        else:
            count("not_messaging")
    lost = join.expire()
    if lost:
        count("no_msg_id", lost)
    return out, counts


class SeenSpans:
    """The (trace id, span id) of the spans handed to the dispatcher in the last ``ttl_s``
    seconds, at most ``max_entries`` (the oldest forgotten first)."""

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 200_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._seen and (
            len(self._seen) > self.max_entries or next(iter(self._seen.values())) < now - self.ttl_s
        ):
            self._seen.popitem(last=False)

    def fresh(self, spans: list[Span]) -> tuple[list[Span], int]:
        """``spans`` without those seen before (and without repeats within the request), and
        how many were left out."""
        self._expire(time.monotonic())
        out: list[Span] = []
        ids: set[tuple[str, str]] = set()
        for span in spans:
            sid = (span.trace_id, span.span_id)
            if sid in self._seen or sid in ids:
                continue
            ids.add(sid)
            out.append(span)
        return out, len(spans) - len(out)

    def remember(self, spans: list[Span]) -> None:
        now = time.monotonic()
        for span in spans:
            self._seen[(span.trace_id, span.span_id)] = now
            self._seen.move_to_end((span.trace_id, span.span_id))
        self._expire(now)

    def __len__(self) -> int:
        return len(self._seen)


class OtlpReceiver:
    """``POST /v1/traces``: decode, map, hand the contexts to the trace dispatcher and wait
    until they are on the trace topic. Answers (status, body, content type): 200 with an
    ``ExportTraceServiceResponse`` (``partial_success.rejected_spans`` counts the messaging
    spans that could not become trace records, and says why), 400 for a body that is not a
    trace export request, 415 for another content type, 503 when the trace topic did not take
    the records in time (the exporter retries)."""

    def __init__(
        self,
        dispatcher: Any,
        *,
        flush_timeout_s: float = 10.0,
        join: OtlpJoin | None = None,
        redis: Any = None,
        subhistory_key: str | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.flush_timeout_s = flush_timeout_s
        self.join = join or OtlpJoin()
        self.seen = SeenSpans()
        self.redis, self.subhistory_key = redis, subhistory_key

    async def record_subscriptions(self) -> None:
        """Merge the groups seen consuming into the subscription history (``P subhistory``,
        expression ``*``, CLUSTERING), as the nameserver does for heartbeating clients, so the
        reconciliation expects them; a failed write is counted and retried next time."""
        if self.redis is None or self.subhistory_key is None:
            return
        seen = self.join.take_sightings()
        for n, ((group, topic), (first, last)) in enumerate(list(seen.items())):
            field = json.dumps([group, topic, "*", "CLUSTERING"], separators=(",", ":"))
            try:
                await self.redis.eval(_SUBHISTORY, 1, self.subhistory_key, field, first, last)
            except Exception as exc:  # noqa: BLE001 - Redis down: keep them for the next request
                metrics.OTLP_SUBSCRIPTION_FAILURES.inc()
                log.warning("recording OTLP consumer groups failed", error=repr(exc))
                for (g, t), (f, la) in list(seen.items())[n:]:
                    self.join.sighted(g, t, f)
                    self.join.sighted(g, t, la)
                return

    async def export(self, body: bytes, content_type: str) -> tuple[int, bytes, str]:
        ctype = content_type.split(";", 1)[0].strip().lower()
        as_json = ctype == JSON
        try:
            spans = decode_request(body, ctype)
        except OtlpError as exc:
            metrics.OTLP_REJECTED.labels(exc.reason).inc()
            log.warning("OTLP request refused", reason=exc.reason, error=str(exc)[:200])
            status = 415 if exc.reason == "unsupported_media_type" else 400
            return status, json.dumps({"error": str(exc)[:300]}).encode(), JSON
        spans, repeated = self.seen.fresh(spans)
        if repeated:
            metrics.OTLP_SPANS.labels("duplicate").inc(repeated)
            log.info("OTLP spans already received skipped", spans=repeated)
        ctxs, counts = contexts_of(spans, self.join)
        for result, n in counts.items():
            metrics.OTLP_SPANS.labels(result).inc(n)
        appended = all(self.dispatcher.append(c) for c in ctxs)
        if appended:
            # handed over: the dispatcher delivers them or counts them failed; a resend of this
            # request (after a 503 below, or a lost answer) must not add them twice
            self.seen.remember(spans)
        if not appended or not await self.dispatcher.flush(self.flush_timeout_s):
            metrics.OTLP_REJECTED.labels("unavailable").inc()
            return (
                503,
                json.dumps({"error": "the trace topic did not take the spans in time"}).encode(),
                JSON,
            )
        await self.record_subscriptions()
        rejected = sum(counts.get(k, 0) for k in ("no_msg_id", "no_group", "invalid"))
        message = ", ".join(
            f"{counts[k]} {k}" for k in ("no_msg_id", "no_group", "invalid") if counts.get(k)
        )
        if rejected:
            log.info(
                "OTLP spans without what a trace needs",
                **{k: counts.get(k, 0) for k in ("no_msg_id", "no_group", "invalid")},
            )
        return 200, _response(as_json, rejected, message), JSON if as_json else PROTOBUF


# the nameserver's merge of a sighting (first_seen = min, last_seen = max), one key, atomic
_SUBHISTORY = """
local first, last = tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HGET', KEYS[1], ARGV[1])
if h then
  local d = cjson.decode(h)
  if d.first_seen < first then first = d.first_seen end
  if d.last_seen > last then last = d.last_seen end
end
redis.call('HSET', KEYS[1], ARGV[1],
  '{"first_seen":' .. string.format('%d', first) .. ',"last_seen":' .. string.format('%d', last) .. '}')
return 1
"""


def _response(as_json: bool, rejected: int, message: str) -> bytes:
    if as_json:
        doc: dict[str, Any] = {}
        if rejected:
            doc["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
        return json.dumps(doc).encode()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return bytes(resp.SerializeToString())
