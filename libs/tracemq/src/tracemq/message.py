"""Messages as RocketMQ users know them, carried as Kafka records.

Properties travel as record headers (``UNIQ_KEY``, ``TAGS``, ``KEYS``, ``DELAY``, ``TRAN_MSG``,
``RETRY_TOPIC``, ``RECONSUME_TIME``, ``ORIGIN_MESSAGE_ID``, ``REAL_TOPIC``, ``REAL_QID``, …).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracemq.errors import InvalidMessageError
from tracemq.naming import validate_topic


class MessageConst:
    """Property names (RocketMQ's ``MessageConst``)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_KEY"
    DELAY = "DELAY"
    TRAN_MSG = "TRAN_MSG"
    RETRY_TOPIC = "RETRY_TOPIC"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    PRODUCER_GROUP = "PGROUP"
    BORN_TIMESTAMP = "BORN_TIMESTAMP"
    BORN_HOST = "BORN_HOST"
    #: On trace messages: the same value on every send attempt of one trace message, so the
    #: collector can drop the copies a retried (e.g. timed-out but delivered) send leaves.
    #: RocketMQ clients do not set it; their trace messages are never deduplicated.
    IDEMPOTENCY_KEY = "IDEMPOTENCY_KEY"
    TRACEPARENT = "traceparent"
    KEY_SEPARATOR = " "


#: Properties tracemq sets itself; a user may not set them through ``properties``.
SYSTEM_PROPERTIES = frozenset(
    {
        MessageConst.UNIQ_KEY,
        MessageConst.TAGS,
        MessageConst.KEYS,
        MessageConst.DELAY,
        MessageConst.BORN_TIMESTAMP,
        MessageConst.BORN_HOST,
        MessageConst.PRODUCER_GROUP,
        MessageConst.RECONSUME_TIME,
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QID,
    }
)


def _keys(keys: str | Iterable[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        items = keys.split(MessageConst.KEY_SEPARATOR)
    elif isinstance(keys, bytes | bytearray) or not isinstance(keys, Iterable):
        raise InvalidMessageError(f"keys must be a str or a list of str, got {type(keys).__name__}")
    else:
        items = list(keys)
        for k in items:
            if not isinstance(k, str):
                raise InvalidMessageError(f"keys must be str, got {type(k).__name__}: {k!r}")
            if MessageConst.KEY_SEPARATOR in k:
                raise InvalidMessageError(f"a key may not contain a space: {k!r}")
    return [k for k in items if k]


@dataclass(slots=True)
class Message:
    """A message to send. ``keys`` may be a space-separated string or a list of strings."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    properties: dict[str, str] | None = None
    delay_level: int = 0

    def __post_init__(self) -> None:
        # (type() checks first: a Message is built per send; the general checks follow)
        validate_topic(self.topic)
        if type(self.body) is not bytes:
            if isinstance(self.body, bytearray | memoryview):
                self.body = bytes(self.body)
            if not isinstance(self.body, bytes):
                raise InvalidMessageError(
                    f"body must be bytes, got {type(self.body).__name__} (encode text first)"
                )
        if self.tags is not None and (not isinstance(self.tags, str) or "||" in self.tags):
            raise InvalidMessageError(f"tags must be a str without '||', got {self.tags!r}")
        self.keys = [] if self.keys is None else _keys(self.keys)
        if self.properties is not None:
            if not isinstance(self.properties, Mapping):
                raise InvalidMessageError(
                    f"properties must be a dict of str, got {type(self.properties).__name__}"
                )
            for k, v in self.properties.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise InvalidMessageError(f"property {k!r}={v!r}: names and values must be str")
                if k in SYSTEM_PROPERTIES:
                    raise InvalidMessageError(f"property {k!r} is set by tracemq, not by users")
        if type(self.delay_level) is not int and (
            isinstance(self.delay_level, bool) or not isinstance(self.delay_level, int)
        ):
            raise InvalidMessageError(f"delay_level must be an int >= 0, got {self.delay_level!r}")
        if self.delay_level < 0:
            raise InvalidMessageError(f"delay_level must be an int >= 0, got {self.delay_level!r}")

    @property
    def key_list(self) -> list[str]:
        return list(self.keys or [])

    @property
    def keys_str(self) -> str | None:
        return MessageConst.KEY_SEPARATOR.join(self.keys) if self.keys else None


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """A RocketMQ queue: partition ``queue_id`` of Kafka topic ``<broker>.<topic>``."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker}#{self.queue_id}"


class SendStatus(enum.StrEnum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a successful send returns (RocketMQ's SendResult)."""

    send_status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    region_id: str
    trace_on: bool
    store_timestamp: int = 0
    #: a delayed message's handle for :meth:`tracemq.Producer.recall` (None otherwise)
    recall_handle: str | None = None

    @classmethod
    def _of(
        cls,
        send_status: SendStatus,
        msg_id: str,
        offset_msg_id: str,
        queue: MessageQueue,
        queue_offset: int,
        region_id: str,
        trace_on: bool,
        store_timestamp: int,
        recall_handle: str | None,
    ) -> SendResult:
        """The producer's constructor, one per sent message: the same object as ``__init__``
        makes, without a frozen dataclass's ``object.__setattr__`` per field. The fields are
        stored into a :class:`_SendResultSlots` (the same slots, plain attribute stores),
        which then becomes a SendResult: CPython lets an object change between two classes
        of the same layout (same base, same ``__slots__``). ~0.17 us against ~0.6 us for
        nine slot descriptors' ``__set__`` calls and ~0.7 us for ``__init__``."""
        if cls is not SendResult:  # (a subclass may add slots: its own __init__)
            return cls(send_status, msg_id, offset_msg_id, queue, queue_offset, region_id,
                       trace_on, store_timestamp, recall_handle)  # fmt: skip
        r: Any = _SendResultSlots()
        r.send_status = send_status
        r.msg_id = msg_id
        r.offset_msg_id = offset_msg_id
        r.queue = queue
        r.queue_offset = queue_offset
        r.region_id = region_id
        r.trace_on = trace_on
        r.store_timestamp = store_timestamp
        r.recall_handle = recall_handle
        r.__class__ = SendResult
        return r  # type: ignore[no-any-return]


class _SendResultSlots:
    """:class:`SendResult`'s layout without its frozen ``__setattr__`` (see ``_of``)."""

    __slots__ = SendResult.__slots__


assert [f for f in SendResult.__dataclass_fields__] == [  # _of() sets every field
    "send_status", "msg_id", "offset_msg_id", "queue", "queue_offset", "region_id", "trace_on",
    "store_timestamp", "recall_handle",
]  # fmt: skip


@dataclass(slots=True)
class MessageExt:
    """A consumed message with its queue coordinates and broker-side facts."""

    topic: str
    body: bytes
    msg_id: str
    queue: MessageQueue
    queue_offset: int
    born_timestamp: int
    store_timestamp: int
    store_host: str
    born_host: str | None = None
    reconsume_times: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    offset_msg_id: str | None = None

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(MessageConst.KEYS)

    @property
    def key_list(self) -> list[str]:
        return [k for k in (self.keys or "").split(MessageConst.KEY_SEPARATOR) if k]

    @property
    def queue_id(self) -> int:
        return self.queue.queue_id

    @property
    def delay_level(self) -> int:
        return int(self.properties.get(MessageConst.DELAY, "0") or 0)

    def property(self, name: str) -> str | None:
        return self.properties.get(name)
