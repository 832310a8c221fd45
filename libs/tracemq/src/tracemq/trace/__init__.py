"""RocketMQ message trace: the data model and the wire codec.

The codec reads and writes the text format of RocketMQ's ``TraceDataEncoder`` byte for
byte, so traces written here show up in RocketMQ tooling and RocketMQ clients' traces
decode here.
"""

from __future__ import annotations

from tracemq.trace._codec import (
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    KEY_SEPARATOR,
    decode,
    decode_report,
    encode,
    encode_many,
)
from tracemq.trace._dispatcher import (
    AsyncTraceDispatcher,
    KafkaTraceSender,
    TraceRouteSource,
    TraceSender,
    TraceTopicError,
)
from tracemq.trace._model import (
    ConsumeReturnType,
    DecodeError,
    DecodeResult,
    MalformedRecord,
    MessageType,
    TraceBean,
    TraceContext,
    TraceTransferBean,
    TraceType,
    TransactionState,
)

__all__ = [
    "AsyncTraceDispatcher",
    "KafkaTraceSender",
    "TraceRouteSource",
    "TraceSender",
    "TraceTopicError",
    "CONTENT_SPLITOR",
    "FIELD_SPLITOR",
    "KEY_SEPARATOR",
    "ConsumeReturnType",
    "DecodeError",
    "DecodeResult",
    "MalformedRecord",
    "MessageType",
    "TraceBean",
    "TraceContext",
    "TraceTransferBean",
    "TraceType",
    "TransactionState",
    "decode",
    "decode_report",
    "encode",
    "encode_many",
]
