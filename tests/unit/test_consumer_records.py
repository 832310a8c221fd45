"""Kafka records to MessageExt (tracemq.consumer._records): the per-queue and per-header
shortcuts give what the record says, whatever the headers hold."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st
from tracemq.consumer._records import _headers_dict_careful, headers_dict, to_message_ext
from tracemq.message import MessageExt, MessageQueue
from tracemq.message_id import (
    MAX_KAFKA_OFFSET,
    MAX_QUEUE_ID,
    _store_host_head,
    encode_offset_msg_id,
)
from tracemq.naming import kafka_topic, split_kafka_topic

_VALUES = st.one_of(
    st.binary(max_size=12),
    st.text(max_size=6).map(str.encode),
    st.builds(bytearray, st.binary(max_size=6)),
    st.none(),
    st.text(max_size=6),
)


@given(st.lists(st.tuples(st.text(max_size=4), _VALUES), max_size=6))
def test_headers_dict_is_the_careful_decoding(headers: list[tuple[str, object]]) -> None:
    assert headers_dict(headers) == _headers_dict_careful(headers)
    assert headers_dict(None) == {}


@given(
    st.sampled_from(["127.0.0.1:9092", "10.1.2.3:1", "[::1]:9092"]),
    st.integers(0, MAX_QUEUE_ID),
    st.integers(0, MAX_KAFKA_OFFSET),
)
def test_offset_msg_id_is_queue_and_offset_in_one_field(host: str, queue: int, off: int) -> None:
    assert encode_offset_msg_id(host, queue, off) == (
        f"{_store_host_head(host)}{(queue << 48) | off:016X}"
    )


def test_offset_msg_id_still_rejects_bad_parts() -> None:
    for args in (("127.0.0.1:9092", MAX_QUEUE_ID + 1, 0), ("127.0.0.1:9092", 0, -1),
                 ("127.0.0.1:9092", -1, 0), ("nohost", 0, 0)):  # fmt: skip
        try:
            encode_offset_msg_id(*args)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"accepted {args}")


def test_split_kafka_topic_inverts_kafka_topic_for_escaped_names() -> None:
    for topic in ("%RETRY%g", "%DLQ%g|x", "plain_T-1"):
        assert split_kafka_topic(kafka_topic("broker-a", topic)) == ("broker-a", topic)


def test_to_message_ext_fields() -> None:
    headers = [
        ("UNIQ_KEY", b"7F0000010001AAAA0000000000000001"),
        ("BORN_TIMESTAMP", b"1700000000000"),
        ("BORN_HOST", b"127.0.0.1"),
        ("RECONSUME_TIME", b"3"),
        ("KEYS", b"k1 k2"),
    ]
    ktopic = kafka_topic("broker-a", "%RETRY%g")
    rec = ConsumerRecord(ktopic, 2, 77, 1700000000123, 0, None, b"body", None, 4, 4, headers)
    msg = to_message_ext(rec, "127.0.0.1:9092")
    assert msg == MessageExt(
        topic="%RETRY%g",
        body=b"body",
        msg_id="7F0000010001AAAA0000000000000001",
        queue=MessageQueue("%RETRY%g", "broker-a", 2),
        queue_offset=77,
        born_timestamp=1700000000000,
        store_timestamp=1700000000123,
        store_host="127.0.0.1:9092",
        born_host="127.0.0.1",
        reconsume_times=3,
        properties={k: v.decode() for k, v in headers},
        offset_msg_id=encode_offset_msg_id("127.0.0.1:9092", 2, 77),
    )
    # no UNIQ_KEY: the offsetMsgId; bad numbers: 0
    bare = ConsumerRecord(ktopic, 1, 5, 9, 0, None, None, None, 0, 0,
                          [("BORN_TIMESTAMP", b"x"), ("RECONSUME_TIME", b"")])  # fmt: skip
    msg = to_message_ext(bare, "127.0.0.1:9092")
    assert (msg.msg_id, msg.body, msg.born_timestamp, msg.reconsume_times) == (
        encode_offset_msg_id("127.0.0.1:9092", 1, 5), b"", 0, 0)  # fmt: skip
