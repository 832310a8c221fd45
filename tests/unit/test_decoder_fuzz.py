"""Every decoder of network input raises only its documented error, whatever it is fed.

Property tests (hypothesis) over arbitrary msgpack values, over near-valid records (a valid
``v``/``type`` with any other field replaced by anything, so validation runs deep), over raw
bytes and over text built from the trace format's pieces (separators, keywords, digit runs far
past Python's 4300-digit conversion limit). Finding 1 of issue 20 was ``{"v": 1, "type": [1]}``
on the control topic (``TypeError: unhashable type: 'list'``); finding 8 a ``ValueError`` from
``tracemq.trace.decode`` on a 4301-digit integer field.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tracemq.protocol import admin, control, signing
from tracemq.protocol import recall as rcp
from tracemq.protocol import transaction as txp
from tracemq.protocol._envelope import ProtocolError
from tracemq.trace import CONTENT_SPLITOR, FIELD_SPLITOR, decode, decode_report
from tracemq_broker.forward import headers_dict, parse_target
from tracemq_collector.events import decode_chunk, decode_message

FUZZ = settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- arbitrary msgpack values --------------------------------------------------------------
scalars = st.one_of(
    st.none(),
    st.booleans(),
    # msgpack carries at most 64-bit integers; both ends of that range are the interesting ones
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=30),
    st.builds(msgpack.ExtType, st.integers(min_value=0, max_value=127), st.binary(max_size=8)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=12), inner, max_size=4),
    ),
    max_leaves=8,
)


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


_DELETE = object()


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field path of a valid record, at any depth (list items by index)."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _apply(obj: Any, path: tuple[Any, ...], new: Any) -> Any:
    """``obj`` with the field at ``path`` set to ``new`` (or removed: ``_DELETE``); a path that
    an earlier change made meaningless leaves ``obj`` as it is."""
    head, rest = path[0], path[1:]
    if isinstance(obj, dict) and isinstance(head, str):
        copy = dict(obj)
        if rest:
            if head in obj:
                copy[head] = _apply(obj[head], rest, new)
        elif new is _DELETE:
            copy.pop(head, None)
        else:
            copy[head] = new
        return copy
    if isinstance(obj, list) and isinstance(head, int) and head < len(obj):
        copy = list(obj)
        if rest:
            copy[head] = _apply(obj[head], rest, new)
        elif new is _DELETE:
            del copy[head]
        else:
            copy[head] = new
        return copy
    return obj


def near_valid(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """A valid record with one to three fields (at any depth, ``v`` and ``type`` included, but
    mostly others) replaced by an arbitrary value or left out, or an arbitrary field added:
    such records reach field validation and what comes after it."""
    paths = [p for p in _paths(valid) if p[0] not in ("v", "type")]
    paths += [("v",), ("type",), ("extra",)]
    change = st.tuples(st.sampled_from(paths), st.one_of(values, st.just(_DELETE)))

    def build(changes: list[tuple[tuple[Any, ...], Any]]) -> bytes:
        obj: Any = valid
        for path, new in changes:
            obj = _apply(obj, path, new)
        return _pack(obj)

    return st.lists(change, min_size=1, max_size=3).map(build)


def hostile_bytes(valid: bytes) -> st.SearchStrategy[bytes]:
    """Raw bytes: random, truncated valid records, valid records with bytes changed."""
    cut = st.integers(min_value=0, max_value=len(valid)).map(lambda n: valid[:n])
    flipped = st.tuples(
        st.integers(min_value=0, max_value=len(valid) - 1), st.integers(0, 255)
    ).map(lambda p: valid[: p[0]] + bytes([p[1]]) + valid[p[0] + 1 :])
    return st.one_of(st.binary(max_size=200), cut, flipped)


_AUTH_KINDS = {"unsigned", "forged", "expired", "wrong_role"}


def _only_protocol_errors(fn: Callable[[bytes], object], data: bytes) -> None:
    try:
        rec = fn(data)
    except ProtocolError as exc:
        assert exc.kind in {"garbage", "version", "type", "schema", "reply_topic", *_AUTH_KINDS}
        assert len(str(exc)) < 1000  # quoted values are cut: a hostile record can be 1 MB
        return
    assert isinstance(rec, BaseModel)
    if isinstance(rec, control.BrokerRegister | control.ClientHeartbeat):
        # what the nameserver does next with an accepted record (JSON into Redis) must work
        rec.model_dump_json()
        assert 0 <= rec.ts <= control.TS_MAX


# -- valid records of each protocol (the seeds of near_valid) --------------------------------
_REGISTER = control.BrokerRegister(
    type="broker.register",
    ts=1,
    broker=control.BrokerInfo(cluster="c", broker_name="b", address="h:1", data_bootstrap="k:9"),
    topics={"T": control.TopicConfig(read_queues=4, write_queues=4)},
).model_dump(mode="json")
_HEARTBEAT = control.ClientHeartbeat(
    ts=5,
    client_id="c1",
    group="g",
    role="consumer",
    subscriptions=[control.Subscription(topic="T", expression="A || B")],
).model_dump(mode="json")
_UNREGISTER = control.BrokerUnregister(ts=1, cluster="c", broker_name="b").model_dump(mode="json")
_CLIENT_UNREG = control.ClientUnregister(ts=1, client_id="c", group="g").model_dump(mode="json")
_REQUEST = admin.AdminRequest(
    type="topic.create", request_id="r", broker="b", body={"topic": "T", "read_queues": 2}
).model_dump(mode="json")
_REPLY = admin.AdminReply(request_id="r", broker="b", ok=True, body={"x": 1}).model_dump(
    mode="json"
)
_END = txp.EndTransaction(half_offset=3, msg_id="M", state="COMMIT_MESSAGE", group="g").model_dump()
_CHECK = txp.CheckRequest(
    broker="b", group="g", half_offset=3, msg_id="M", data_bootstrap="k:9", topic="T",
    body=b"x", properties={"KEYS": "k"},
).model_dump()  # fmt: skip

_HANDLE = rcp.RecallHandle("T", "b", 1, "C0A8000100002A9F0000000000000001", 2, 7).encode()
_RECALL = rcp.RecallRequest(request_id="r", handle=_HANDLE, topic="T", group="g").model_dump(
    mode="json"
)

PROTOCOLS: list[tuple[str, Callable[[bytes], object], list[dict[str, Any]]]] = [
    ("control", control.decode, [_REGISTER, _HEARTBEAT, _UNREGISTER, _CLIENT_UNREG]),
    ("admin request", admin.decode_request, [_REQUEST]),
    ("admin reply", admin.decode_reply, [_REPLY]),
    ("tx end", txp.decode_end, [_END]),
    ("tx check", txp.decode_check, [_CHECK]),
    ("schedule recall", rcp.decode_request, [_RECALL]),
]


def test_the_finding_1_record_is_a_protocol_error_for_every_decoder() -> None:
    for _, fn, _ in PROTOCOLS:
        for obj in ({"v": 1, "type": [1]}, {"v": 1, "type": {"a": 1}}, {"v": [1], "type": []}):
            with pytest.raises(ProtocolError):
                fn(_pack(obj))


def test_version_must_be_the_integer_1() -> None:
    for v in (True, 1.0, "1"):
        with pytest.raises(ProtocolError) as info:
            control.decode(_pack({**_REGISTER, "v": v}))
        assert info.value.kind == "version"


@pytest.mark.parametrize(("name", "fn", "seeds"), PROTOCOLS, ids=[p[0] for p in PROTOCOLS])
def test_protocol_decoder_raises_only_protocol_error(
    name: str, fn: Callable[[bytes], object], seeds: list[dict[str, Any]]
) -> None:
    """Any msgpack value, near-valid records of the protocol, raw and damaged bytes."""
    inputs = st.one_of(
        values.map(_pack),
        *(near_valid(s) for s in seeds),
        *(hostile_bytes(_pack(s)) for s in seeds),
    )

    @FUZZ
    @given(inputs)
    def check(data: bytes) -> None:
        _only_protocol_errors(fn, data)

    check()


# -- signed envelopes (tracemq.protocol.signing) -----------------------------------------------
_NOW = 1_700_000_000_000
_KEYS = {"broker": {"kb": "b" * 20}, "client": {"kc": "c" * 20}, "admin": {"ka": "a" * 20}}
_VERIFIER = signing.Verifier(_KEYS, max_age_ms=300_000)


def _sealed(body: bytes, kid: str = "kb", purpose: signing.Purpose = "control") -> bytes:
    role = next(r for r, ring in _KEYS.items() if kid in ring)
    return signing.seal(purpose, kid, _KEYS[role][kid], body, ts=_NOW, nonce="0" * 32)


SIGNED = [
    (
        "signed control",
        lambda d: _VERIFIER.open(d, "control", control.decode, control.signer_roles, _NOW)[0],
        [_REGISTER, _HEARTBEAT],
        "kb",
        "control",
    ),
    (
        "signed admin",
        lambda d: _VERIFIER.open(d, "admin", admin.decode_request, admin.signer_roles, _NOW)[0],
        [_REQUEST],
        "ka",
        "admin",
    ),
]


@pytest.mark.parametrize(
    ("name", "fn", "seeds", "kid", "purpose"), SIGNED, ids=[p[0] for p in SIGNED]
)
def test_signed_envelope_raises_only_protocol_error(
    name: str,
    fn: Callable[[bytes], object],
    seeds: list[dict[str, Any]],
    kid: str,
    purpose: signing.Purpose,
) -> None:
    """Verifying and decoding a sealed record: any msgpack, near-valid envelopes (any field of
    the envelope replaced), validly signed near-valid bodies (so the body's validation runs
    deep behind a good signature), and damaged bytes of sealed records."""
    envelopes = [msgpack.unpackb(_sealed(_pack(s), kid, purpose)) for s in seeds]
    inputs = st.one_of(
        values.map(_pack),
        *(near_valid(e) for e in envelopes),
        *(near_valid(s).map(lambda b: _sealed(b, kid, purpose)) for s in seeds),
        *(hostile_bytes(_sealed(_pack(s), kid, purpose)) for s in seeds),
    )

    @FUZZ
    @given(inputs)
    def check(data: bytes) -> None:
        _only_protocol_errors(fn, data)

    check()


# -- recall handles (tracemq.protocol.recall) -------------------------------------------------
_HANDLE_TEXT = base64.urlsafe_b64decode(_HANDLE).decode()
handle_pieces = st.sampled_from(
    ["v1", "v2", " ", "T", "b", "-1", "0", "1" * 25, "9" * 4400, "\x00", "é", "%RETRY%g"]
)
handle_texts = st.one_of(
    st.text(max_size=60),
    st.lists(handle_pieces, max_size=10).map("".join),
    st.lists(st.one_of(handle_pieces, st.text(max_size=6)), min_size=1, max_size=8).map(" ".join),
    st.integers(0, len(_HANDLE_TEXT)).map(lambda n: _HANDLE_TEXT[:n]),
)
handles = st.one_of(
    st.text(max_size=80),
    handle_texts.map(lambda t: base64.urlsafe_b64encode(t.encode()).decode()),
    handle_texts.map(lambda t: base64.urlsafe_b64encode(t.encode()).decode().rstrip("=")),
    st.integers(0, len(_HANDLE)).map(lambda n: _HANDLE[:n]),
    st.builds(lambda n: "A" * n, st.integers(0, 3000)),
    st.one_of(st.none(), st.integers(), st.binary(max_size=10)),
)


@settings(FUZZ, max_examples=1000)
@given(handles)
@example(base64.urlsafe_b64encode(b"v1 T b 1 M").decode())  # RocketMQ's five fields
@example(base64.urlsafe_b64encode(f"v1 T b 1 M 1 {'9' * 4400}".encode()).decode())
def test_recall_handle_decoder_raises_only_its_error(handle: object) -> None:
    try:
        h = rcp.decode_handle(handle)
    except rcp.RecallHandleError as exc:
        assert exc.kind == "handle"
        assert str(exc).startswith("invalid recall handle: ") and len(str(exc)) < 1000
    else:
        assert h.level >= 1 and h.offset >= 0 and h.msg_id and " " not in h.msg_id
        assert rcp.decode_handle(h.encode()) == h


def test_recall_handle_round_trip_and_rocketmq_layout() -> None:
    h = rcp.decode_handle(_HANDLE)
    assert h == rcp.RecallHandle("T", "b", 1, "C0A8000100002A9F0000000000000001", 2, 7)
    # RocketMQ's HandleV1 reads the first five space-separated fields of the same text
    assert _HANDLE_TEXT.split(" ")[:5] == ["v1", "T", "b", "1", h.msg_id]
    assert rcp.decode_handle(_HANDLE.rstrip("=")) == h  # padding optional, as in Java
    rocketmq = base64.urlsafe_b64encode(b"v1 T b 1700000000000 M").decode()
    with pytest.raises(rcp.RecallHandleError, match="no schedule coordinates"):
        rcp.decode_handle(rocketmq)
    with pytest.raises(rcp.RecallHandleError, match="it is empty"):
        rcp.decode_handle("")
    bad_level = base64.urlsafe_b64encode(b"v1 T b 1 M 0 3").decode()
    with pytest.raises(rcp.RecallHandleError, match="level 0 is out of range"):
        rcp.decode_handle(bad_level)


# -- forwarding headers (the schedule and transaction services) ------------------------------
header_values = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.text(max_size=20).map(str.encode),
    st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: str(n).encode()),
    st.integers(min_value=4290, max_value=4400).map(lambda n: b"9" * n),
    st.sampled_from([b"0", b"1023", b"1024", b"-1", b" 1", b"1_0", "\u0663".encode(), b"0" * 5000]),
)
header_names = st.one_of(
    st.sampled_from(["REAL_TOPIC", "REAL_QID", "DELAY", "UNIQ_KEY", "PGROUP"]), st.text(max_size=8)
)


def _record(headers: list[tuple[str, bytes | None]]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="b.SCHEDULE_TOPIC_XXXX", partition=0, offset=0, timestamp=0, timestamp_type=0,
        key=None, value=b"", checksum=None, serialized_key_size=0, serialized_value_size=0,
        headers=tuple(headers),
    )  # fmt: skip


@settings(FUZZ, max_examples=1000)
@given(st.lists(st.tuples(header_names, header_values), max_size=6))
@example([("REAL_TOPIC", b"T"), ("REAL_QID", b"9" * 4400)])
@example([("REAL_TOPIC", b"T"), ("REAL_QID", "\u0663".encode())])
def test_forwarding_headers_raise_only_value_error(
    headers: list[tuple[str, bytes | None]],
) -> None:
    try:
        topic, qid = parse_target(headers_dict(_record(headers)))
    except ValueError as exc:
        assert len(str(exc)) < 1000
    else:
        assert 0 <= qid < 1024 and topic


# -- trace records (finding 8) and the collector's decode --------------------------------------
_KEYWORDS = ["Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall", "null", "true", "FALSE"]
_trace_field = st.one_of(
    st.text(max_size=12),
    st.sampled_from([*_KEYWORDS, "COMMIT_MESSAGE", "UNKNOW", "0", "4", "-1", "+7", "2147483648"]),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.integers(min_value=0, max_value=10**20).map(lambda n: f"+000{n}"),
    st.integers(min_value=4290, max_value=4400).map(lambda n: "9" * n),
    st.integers(min_value=4290, max_value=4400).map(lambda n: "-" + "0" * n + "1"),
)
_trace_record = st.tuples(
    st.sampled_from(_KEYWORDS[:5]), st.lists(_trace_field, min_size=4, max_size=16)
).map(lambda t: CONTENT_SPLITOR.join([t[0], *t[1]]))
trace_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(_trace_record, st.text(max_size=20)), max_size=4).map(FIELD_SPLITOR.join),
)


@FUZZ
@given(st.one_of(trace_text, trace_text.map(str.encode), st.binary(max_size=200)))
@example("SubAfter\x01r\x01m\x01" + "1" * 4301 + "\x01true\x01k\x02")
@example("Pub\x01" + "0" * 5000 + "1\x01r\x01g\x01T\x01M\x01t\x01k\x01h\x011\x012\x010\x02")
def test_trace_decode_never_raises(text: str | bytes) -> None:
    result = decode_report(text)
    assert decode(text) == result.contexts
    for ctx in result.contexts:
        assert -(2**63) <= ctx.timestamp < 2**63
        assert -(2**31) <= ctx.cost_time < 2**31


def test_trace_decode_of_something_else_is_one_malformed_record() -> None:
    for bad in (None, 5, ["Pub"]):
        result = decode_report(bad)  # type: ignore[arg-type]
        assert not result.contexts and len(result.errors) == 1


@settings(FUZZ, max_examples=1000)
@given(st.one_of(st.none(), st.binary(max_size=400), trace_text.map(str.encode)))
@example(b"SubAfter\x01r\x01m\x01" + b"1" * 4301 + b"\x01true\x01k\x02")
def test_collector_decode_of_a_trace_message_never_raises(value: bytes | None) -> None:
    events, quarantine = decode_message("RMQ_SYS_TRACE_TOPIC", 0, 7, value, 1_700_000_000_000)
    assert events or quarantine
    chunk = decode_chunk([("RMQ_SYS_TRACE_TOPIC", 0, [(7, value, "10.0.0.1")])], 1_700_000_000_000)
    assert chunk.events == len(events)


# -- a peer collector's group activity (issue 15, point 13) ----------------------------------
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
_BUCKET = {
    "group": "g", "topic": "T", "minute": 60_000, "consumed": 1, "failed": 0, "retried": 0,
    "dead_lettered": 0,
}  # fmt: skip


@settings(FUZZ, max_examples=200)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {
                "buckets": st.lists(
                    st.one_of(
                        json_values,
                        st.fixed_dictionaries({k: json_values for k in _BUCKET}),
                        st.just(_BUCKET),
                    ),
                    max_size=3,
                ),
                "last_consume": st.lists(json_values, max_size=3),
            },
            optional={"truncated": json_values},
        ),
    )
)
@example({"buckets": [_BUCKET], "last_consume": [{"group": "g", "topic": "T", "timestamp": 5}]})
@example({"buckets": [{**_BUCKET, "consumed": -1}], "last_consume": []})
@example({"buckets": [{**_BUCKET, "consumed": True}], "last_consume": []})
def test_peer_group_activity_raises_only_validation_error(answer: Any) -> None:
    from pydantic import ValidationError
    from tracemq_collector.groups import Activity, PeerActivity

    try:
        part = PeerActivity.model_validate(answer).model_dump()
    except ValidationError:
        return
    act = Activity()
    act.add(part)  # what validates sums without raising, counts stay non-negative
    assert all(v >= 0 for c in act.buckets.values() for v in c.values())


@settings(FUZZ, max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["BORN_HOST", "IDEMPOTENCY_KEY", "CLIENT_ID", "X"]),
            st.one_of(st.binary(max_size=300), st.none()),
        ),
        max_size=6,
    )
)
def test_trace_message_headers_never_raise(headers: list[tuple[str, bytes | None]]) -> None:
    from tracemq_collector.ingest import MAX_CLIENT_ID_CHARS, _trace_headers

    born, key, client_id = _trace_headers(headers)
    assert client_id is None or 0 < len(client_id) <= MAX_CLIENT_ID_CHARS
    decode_chunk([("T", 0, [(7, b"x", born, key, client_id)])], 1_700_000_000_000)


# -- OTLP/HTTP trace export bodies (tracemq_collector.otlp) --------------------------------
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
_OTLP_KEYS = st.sampled_from([
    "resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "parentSpanId", "kind",
    "startTimeUnixNano", "endTimeUnixNano", "attributes", "key", "value", "stringValue",
    "intValue", "arrayValue", "values", "links", "events", "status", "code", "scope", "name",
])  # fmt: skip
otlp_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=34), st.just("9" * 4400)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_OTLP_KEYS, inner, max_size=5)
    ),
    max_leaves=30,
)


def _otlp_seed() -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.kind = b"\x01" * 16, b"\x02" * 8, 5
    for k, v in (("messaging.system", "kafka"), ("messaging.destination.name", "T")):
        kv = span.attributes.add()
        kv.key, kv.value.string_value = k, v
    return bytes(req.SerializeToString())


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=300).map(lambda b: (b, "application/x-protobuf")),
        hostile_bytes(_otlp_seed()).map(lambda b: (b, "application/x-protobuf")),
        st.binary(max_size=200).map(lambda b: (b, "application/json")),
        otlp_json.map(lambda d: (__import__("json").dumps(d).encode(), "application/json")),
        json_values.map(lambda d: (__import__("json").dumps(d).encode(), "application/json")),
    )
)
@example(
    (
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": "' + b"9" * 4400 + b'"}]}]}]}',
        "application/json",
    )
)
@example((b"[" * 100_000, "application/json"))
def test_otlp_decoder_raises_only_otlp_error(case: tuple[bytes, str]) -> None:
    from tracemq_collector.errors import OtlpError
    from tracemq_collector.otlp import OtlpJoin, contexts_of, decode_request

    body, ctype = case
    try:
        spans = decode_request(body, ctype)
    except OtlpError:
        return
    contexts_of(spans, OtlpJoin())  # whatever decoded maps without raising


# -- the trace store's blocks ----------------------------------------------------------------
_separators = st.text(alphabet=st.sampled_from(["\x00", "\x01", "\x02", "\x03", "\x04", "a", "é"]))
_texts = st.one_of(st.none(), st.text(), _separators)
_ints = st.integers(0, 2**63 - 1)
_store_events = st.lists(
    st.tuples(
        _ints, _ints, st.sampled_from(["Pub", "SubBefore", "SubAfter"]), _ints,  # off, index, ts
        _texts, _texts, _texts, _ints, _ints,  # msg_id, topic, client_host, store_time, ingest
        st.one_of(st.text(min_size=1), _separators.filter(bool)), _texts,  # record, client_id
    ),
    min_size=1,
    max_size=20,
)  # fmt: skip


@settings(FUZZ, max_examples=300)
@given(events=_store_events, trace_topic=st.text(), partition=st.integers(0, 2**31 - 1))
def test_a_store_block_gives_back_exactly_the_events_it_was_made_of(
    events: list[tuple[Any, ...]], trace_topic: str, partition: int
) -> None:
    """Whatever the fields hold (the block's own separators, NUL, surrogates-free text, the
    largest integers), a block decodes to the events it was encoded from."""
    from tracemq_collector.store import _decode_block, _encode_block

    rows = [
        (pos, trace_topic, partition, *e[:2], e[2], e[3], *e[4:7], e[7], e[8], e[9], e[10])
        for pos, e in enumerate(events)
    ]
    assert _decode_block(_encode_block(rows), trace_topic, partition) == rows


@settings(FUZZ, max_examples=300)
@given(data=st.binary(max_size=300))
def test_a_damaged_store_block_raises_only_the_store_error(data: bytes) -> None:
    import zlib

    import zstandard
    from tracemq_collector.errors import TraceStoreError
    from tracemq_collector.store import _decode_block

    # raw bytes, a zlib block (files of earlier versions), a zstd block, a cut zstd frame
    zstd = zstandard.ZstdCompressor(level=1).compress(data)
    for blob in (data, zlib.compress(data), zstd, zstd[: len(zstd) // 2]):
        try:
            _decode_block(blob, "t", 0)
        except TraceStoreError:
            pass
