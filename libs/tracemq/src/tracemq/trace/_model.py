"""Data model of RocketMQ message trace, with RocketMQ's names in snake_case.

The enums keep RocketMQ's member names verbatim (``Trans_msg_Commit``, ``UNKNOW``) because
those names, or their ordinals, are what travels on the wire and what the RocketMQ dashboard
and other RocketMQ tooling expect to read back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tracemq.errors import DecodeError

__all__ = [
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
]


class TraceType(enum.Enum):
    """Kind of trace record; the value is the name written as the first field of a record."""

    Pub = "Pub"
    Recall = "Recall"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MessageType(enum.IntEnum):
    """RocketMQ ``MessageType``; the trace format carries the ordinal."""

    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3
    Order_Msg = 4


class ConsumeReturnType(enum.IntEnum):
    """How a consume call ended; the ordinal is the ``context_code`` of a SubAfter record."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


class TransactionState(enum.StrEnum):
    """RocketMQ ``LocalTransactionState``; the trace format carries the name."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    # RocketMQ's own spelling; it is on the wire, so it cannot be corrected here.
    UNKNOW = "UNKNOW"


@dataclass(slots=True)
class TraceBean:
    """What a trace record says about one message.

    Attributes:
        topic: topic the message was sent to.
        msg_id: client-side unique id (RocketMQ ``UNIQ_KEY``).
        offset_msg_id: broker-side id (store host + physical offset).
        tags: message tag.
        keys: business keys, space separated as in RocketMQ.
        store_host: ``ip:port`` of the broker that stored the message.
        client_host: host of the client; only old-format records carry it.
        store_time: broker store timestamp in epoch milliseconds.
        retry_times: delivery attempt count, for consume traces.
        body_length: body size in bytes.
        msg_type: kind of message; required by Pub and EndTransaction records.
        transaction_id: id of the transaction, for EndTransaction records.
        transaction_state: outcome of the transaction, for EndTransaction records.
        from_transaction_check: whether the state came from a broker check-back.
    """

    topic: str | None = None
    msg_id: str | None = None
    offset_msg_id: str | None = None
    tags: str | None = None
    keys: str | None = None
    store_host: str | None = None
    client_host: str | None = None
    store_time: int = 0
    retry_times: int = 0
    body_length: int = 0
    msg_type: MessageType | None = None
    transaction_id: str | None = None
    transaction_state: TransactionState | None = None
    from_transaction_check: bool = False


@dataclass(slots=True)
class TraceContext:
    """One traced event (a send, a consume start/end, a transaction end or a recall).

    Attributes:
        trace_type: kind of event.
        timestamp: when it happened, epoch milliseconds.
        region_id: RocketMQ region id (``DefaultRegion`` unless configured).
        region_name: region display name; not carried by the wire format.
        group_name: producer or consumer group.
        cost_time: duration of the operation in milliseconds.
        success: whether the operation succeeded.
        request_id: ties a SubBefore to its SubAfter.
        context_code: :class:`ConsumeReturnType` ordinal, for SubAfter.
        trace_beans: the messages concerned; consume events may cover a batch.
    """

    trace_type: TraceType
    timestamp: int = 0
    region_id: str | None = None
    region_name: str | None = None
    group_name: str | None = None
    cost_time: int = 0
    success: bool = True
    request_id: str | None = None
    context_code: int = 0
    trace_beans: list[TraceBean] = field(default_factory=list)


@dataclass(slots=True)
class TraceTransferBean:
    """Encoded trace text plus the keys to index the trace message under.

    Attributes:
        data: records as UTF-8 text, ready to be the body of a trace message.
        keys: message ids and business keys of every traced message, so a trace can be
            looked up by either.
    """

    data: str
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class MalformedRecord:
    """A record of a trace message that could not be decoded.

    Attributes:
        index: position of the record within the message (0 for the first record).
        raw: the record text, without its trailing record separator.
        reason: why it was rejected, naming the offending field and value.
    """

    index: int
    raw: str
    reason: str


@dataclass(slots=True)
class DecodeResult:
    """Everything decoded from one trace message, good and bad.

    Attributes:
        contexts: decoded contexts, in record order.
        errors: records that were skipped, in record order.
    """

    contexts: list[TraceContext] = field(default_factory=list)
    errors: list[MalformedRecord] = field(default_factory=list)
