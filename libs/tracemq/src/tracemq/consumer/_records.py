"""Kafka records to :class:`MessageExt`."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from tracemq.message import MessageConst, MessageExt, MessageQueue
from tracemq.message_id import encode_offset_msg_id
from tracemq.naming import split_kafka_topic


def headers_dict(headers: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers or ():  # type: ignore[attr-defined]
        try:
            out[k] = v.decode() if isinstance(v, bytes | bytearray) else str(v)
        except UnicodeDecodeError:
            out[k] = v.decode(errors="replace")
    return out


def to_message_ext(rec: ConsumerRecord[bytes, bytes], store_host: str) -> MessageExt:
    broker, topic = split_kafka_topic(rec.topic)
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
    return MessageExt(
        topic=topic,
        body=rec.value or b"",
        msg_id=msg_id,
        queue=MessageQueue(topic, broker, rec.partition),
        queue_offset=rec.offset,
        born_timestamp=born,
        store_timestamp=rec.timestamp,
        store_host=store_host,
        born_host=props.get(MessageConst.BORN_HOST),
        reconsume_times=reconsume,
        properties=props,
        offset_msg_id=offset_msg_id,
    )
