from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tracemq.protocol import admin, control
from tracemq.protocol._envelope import ProtocolError


def _reg() -> control.BrokerRegister:
    return control.BrokerRegister(
        type="broker.register",
        ts=1,
        broker=control.BrokerInfo(
            cluster="c", broker_name="b", address="h:1", data_bootstrap="k:9"
        ),
        topics={"T": control.TopicConfig(read_queues=4, write_queues=4)},
    )


def test_control_round_trip() -> None:
    rec = _reg()
    assert control.decode(control.encode(rec)) == rec
    hb = control.ClientHeartbeat(
        ts=5,
        client_id="c1",
        group="g",
        role="consumer",
        subscriptions=[control.Subscription(topic="T", expression="A || B")],
    )
    assert control.decode(control.encode(hb)) == hb


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", "garbage"),
        (None, "garbage"),
        (b"\xc1", "garbage"),
        (msgpack.packb("text"), "schema"),
        (msgpack.packb({"type": "broker.register"}), "version"),
        (msgpack.packb({"v": 2, "type": "broker.register"}), "version"),
        (msgpack.packb({"v": 1, "type": "nope"}), "type"),
        (msgpack.packb({"v": 1, "type": "broker.register", "ts": 1}), "schema"),
        (msgpack.packb({"v": 1, "type": "broker.register", "ts": -1, "broker": {}}), "schema"),
    ],
)
def test_control_decode_errors(data: bytes | None, kind: str) -> None:
    with pytest.raises(ProtocolError) as info:
        control.decode(data)
    assert info.value.kind == kind


def test_queue_counts_are_bounded_in_the_schema() -> None:
    obj = msgpack.unpackb(control.encode(_reg()))
    obj["topics"]["T"]["write_queues"] = 0
    with pytest.raises(ProtocolError, match="write_queues"):
        control.decode(msgpack.packb(obj))


@given(st.binary(max_size=300))
def test_decode_never_raises_anything_but_protocol_error(data: bytes) -> None:
    for fn in (control.decode, admin.decode_request, admin.decode_reply):
        try:
            fn(data)
        except ProtocolError:
            pass


def test_admin_round_trip() -> None:
    req = admin.AdminRequest(type="topic.create", request_id="r", broker="b", body={"topic": "T"})
    assert admin.decode_request(admin.encode(req)) == req
    rep = admin.AdminReply(request_id="r", broker="b", ok=False, error="no")
    assert admin.decode_reply(admin.encode(rep)) == rep
    with pytest.raises(ProtocolError):
        admin.decode_request(admin.encode(rep))


@pytest.mark.parametrize(
    "reply_topic", ["bad name/..", "broker-a.TopicTest", "tracemq.admin.reply.x", "", 7, None]
)
def test_admin_replies_only_go_to_the_reply_topic(reply_topic: object) -> None:
    """Issue 20, finding 2: a request chose where the broker wrote its reply."""
    req = {"v": 1, "type": "topic.list", "request_id": "r", "broker": "b"}
    assert admin.decode_request(msgpack.packb(req)).reply_topic == admin.ADMIN_REPLY_TOPIC
    with pytest.raises(ProtocolError, match="reply_topic must be") as info:
        admin.decode_request(msgpack.packb({**req, "reply_topic": reply_topic}))
    assert info.value.kind == "reply_topic"


@pytest.mark.parametrize("bad_type", [[1], {"a": 1}, 7, None, b"topic.list"])
def test_a_type_that_is_not_a_known_string_is_kind_type(bad_type: object) -> None:
    """Issue 20, finding 1: ``{"v": 1, "type": [1]}`` raised TypeError (unhashable)."""
    data = msgpack.packb({"v": 1, "type": bad_type})
    for fn in (control.decode, admin.decode_request):
        with pytest.raises(ProtocolError) as info:
            fn(data)
        assert info.value.kind == "type"


def test_error_messages_quote_a_bounded_part_of_the_value() -> None:
    data = msgpack.packb({"v": 1, "type": "x" * 100_000})
    with pytest.raises(ProtocolError) as info:
        control.decode(data)
    assert len(str(info.value)) < 200
