"""Kafka records to :class:`MessageExt`.

This runs once per consumed record, before any listener, traced or not: what a record's
topic and queue say is worked out once per Kafka topic and partition, and headers that are
all UTF-8 bytes (every tracemq producer writes them so) are decoded in one comprehension.
"""

from __future__ import annotations

import functools

from aiokafka.structs import ConsumerRecord

from tracemq.message import MessageConst, MessageExt, MessageQueue
from tracemq.message_id import encode_offset_msg_id
from tracemq.naming import split_kafka_topic

_decode = bytes.decode


def _headers_dict_careful(headers: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers or ():  # type: ignore[attr-defined]
        try:
            out[k] = v.decode() if isinstance(v, bytes | bytearray) else str(v)
        except UnicodeDecodeError:
            out[k] = v.decode(errors="replace")
    return out


def headers_dict(headers: object) -> dict[str, str]:
    """Record headers as text: UTF-8 values decoded, invalid bytes replaced, other values
    (``None``, a ``bytearray``) through ``str()`` or decoded as bytes."""
    try:
        # (the usual record: every value is bytes of valid UTF-8; any other value makes
        # ``bytes.decode`` raise, and the careful loop below then decides for each one)
        return {k: _decode(v) for k, v in headers or ()}  # type: ignore[attr-defined]
    except (TypeError, UnicodeDecodeError):
        return _headers_dict_careful(headers)


@functools.lru_cache(maxsize=4096)
def _queue_of(kafka_topic: str, partition: int) -> MessageQueue:
    """The RocketMQ queue of a Kafka topic's partition, one (immutable) object per queue."""
    broker, topic = split_kafka_topic(kafka_topic)
    return MessageQueue(topic, broker, partition)


def to_message_ext(rec: ConsumerRecord[bytes, bytes], store_host: str) -> MessageExt:
    queue = _queue_of(rec.topic, rec.partition)
    props = headers_dict(rec.headers)
    try:
        offset_msg_id = encode_offset_msg_id(store_host, rec.partition, rec.offset)
    except ValueError:
        offset_msg_id = None
    msg_id = (
        props.get(MessageConst.UNIQ_KEY)
        or offset_msg_id
        or f"{rec.topic}:{rec.partition}:{rec.offset}"
    )
    try:
        born = int(props.get(MessageConst.BORN_TIMESTAMP, "0"))
    except ValueError:
        born = 0
    try:
        reconsume = int(props.get(MessageConst.RECONSUME_TIME, "0"))
    except ValueError:
        reconsume = 0
    # (positionally, in MessageExt's field order: twelve keywords cost three times as much)
    return MessageExt(
        queue.topic,  # topic
        rec.value or b"",  # body
        msg_id,
        queue,
        rec.offset,  # queue_offset
        born,  # born_timestamp
        rec.timestamp,  # store_timestamp
        store_host,
        props.get(MessageConst.BORN_HOST),  # born_host
        reconsume,  # reconsume_times
        props,  # properties
        offset_msg_id,
    )
