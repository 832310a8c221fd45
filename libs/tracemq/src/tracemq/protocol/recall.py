"""Recalling a delayed message before it is due (RocketMQ 5.3's recall): the handle and the
request record.

**The handle.** A delayed send's :class:`~tracemq.SendResult` carries ``recall_handle``: as in
RocketMQ (``RecallMessageHandle.HandleV1``), URL-safe base64 of the space-separated text
``v1 <topic> <broker> <timestamp> <msgId>``, followed by two tracemq fields, the delay level and
the offset of the message in partition ``level - 1`` of ``<broker>.SCHEDULE_TOPIC_XXXX``.
RocketMQ's decoder reads the first five fields and ignores the rest, so a tracemq handle is also
a valid RocketMQ one. ``timestamp`` is the store time of the schedule record in epoch ms
(RocketMQ puts the deliver time there; a tracemq producer does not know the broker's level
delays, the broker decides). :func:`decode_handle` raises only :class:`RecallHandleError`,
naming what is wrong, whatever it is given (fuzz-tested).

**The request** (data path, like RocketMQ's delete marker on its timer topic): a
:class:`RecallRequest` record (msgpack, ``type="schedule.recall"``, header
:data:`RECALL_HEADER`) written to the *same* partition of the broker's ``SCHEDULE_TOPIC_XXXX``
as the message it recalls. It is therefore stored on the broker's own data cluster (durable,
read after a restart like any schedule record) and always at a higher offset than its target:
when the schedule service reads it, it has read the target too. The service answers with an
:class:`~tracemq.protocol.admin.AdminReply` (``request_id`` of the request) on
``tracemq.admin.reply``, its body a :data:`RecallResultName` (``result``) with ``msg_id``,
``detail`` and the broker's ``region_id``.

Results: ``RECALLED`` (applied now: it will not be delivered), ``ALREADY_RECALLED`` (an earlier
request recalled it: a repeated recall is one recall), ``TOO_LATE`` (the service had already
delivered it or started its forward), ``UNKNOWN`` (no message with that msgId at that level and
offset), ``INVALID`` (the handle names another broker or topic, or cannot be decoded).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tracemq.errors import RecallHandleError
from tracemq.naming import validate_broker_name, validate_topic
from tracemq.protocol._envelope import (
    SCHEMA_VERSION,
    ProtocolError,
    record_type,
    show,
    unpack_dict,
    validate,
)

#: Header marking a record of ``SCHEDULE_TOPIC_XXXX`` as a recall request (its value: ``1``).
RECALL_HEADER = "TRACEMQ_RECALL"
HANDLE_VERSION = "v1"
#: A handle is a few hundred characters; anything much longer is not one.
HANDLE_MAX_LENGTH = 1024
MSG_ID_MAX_LENGTH = 128

RecallResultName = Literal["RECALLED", "ALREADY_RECALLED", "TOO_LATE", "UNKNOWN", "INVALID"]
#: Results that mean "it will not be delivered".
RECALLED_RESULTS = frozenset({"RECALLED", "ALREADY_RECALLED"})

_DIGITS = re.compile(r"^[0-9]{1,19}$")
_MSG_ID = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space (the field separator)


@dataclass(frozen=True, slots=True)
class RecallHandle:
    """A decoded recall handle (see the module docstring)."""

    topic: str
    broker: str
    timestamp_ms: int
    msg_id: str
    level: int
    offset: int

    def encode(self) -> str:
        text = " ".join(
            [
                HANDLE_VERSION,
                self.topic,
                self.broker,
                str(self.timestamp_ms),
                self.msg_id,
                str(self.level),
                str(self.offset),
            ]
        )
        return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def _int(field: str, text: str, low: int) -> int:
    if not _DIGITS.match(text):
        raise RecallHandleError(f"{field} must be decimal digits, got {show(text)}")
    value = int(text)
    if value < low or value > 2**63 - 1:
        raise RecallHandleError(f"{field} {value} is out of range")
    return value


def decode_handle(handle: object) -> RecallHandle:
    """Decode a recall handle; raise only :class:`RecallHandleError`, naming the problem."""
    if not isinstance(handle, str):
        raise RecallHandleError(f"expected a str, got {type(handle).__name__}")
    if not handle:
        raise RecallHandleError("it is empty")
    if len(handle) > HANDLE_MAX_LENGTH:
        raise RecallHandleError(f"{len(handle)} characters, more than {HANDLE_MAX_LENGTH}")
    try:
        raw = base64.b64decode(
            handle.encode("ascii") + b"=" * (-len(handle) % 4), altchars=b"-_", validate=True
        )
        text = raw.decode("utf-8")
    except (UnicodeError, binascii.Error, ValueError):
        raise RecallHandleError(f"not URL-safe base64 of UTF-8 text: {show(handle)}") from None
    items = text.split(" ")
    if items[0] != HANDLE_VERSION:
        raise RecallHandleError(f"version {show(items[0])}, expected {HANDLE_VERSION!r}")
    if len(items) == 5:
        raise RecallHandleError(
            "it has no schedule coordinates (level, offset): not made by a tracemq broker"
        )
    if len(items) != 7:
        raise RecallHandleError(f"{len(items)} fields, expected 7")
    _, topic, broker, ts, msg_id, level, offset = items
    try:
        validate_topic(topic)
        validate_broker_name(broker)
    except ValueError as exc:
        raise RecallHandleError(str(exc)) from None
    if not _MSG_ID.match(msg_id) or len(msg_id) > MSG_ID_MAX_LENGTH:
        raise RecallHandleError(f"msgId {show(msg_id)} is not a message id")
    return RecallHandle(
        topic=topic,
        broker=broker,
        timestamp_ms=_int("timestamp", ts, 0),
        msg_id=msg_id,
        level=_int("level", level, 1),
        offset=_int("offset", offset, 0),
    )


class RecallRequest(BaseModel):
    """A producer's recall, written to the schedule queue of the recalled message."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    type: Literal["schedule.recall"] = "schedule.recall"
    #: the reply's ``request_id`` (and Kafka key)
    request_id: str = Field(min_length=1, max_length=128)
    handle: str = Field(min_length=1, max_length=HANDLE_MAX_LENGTH)
    #: the topic the caller names; must be the handle's (RocketMQ: "topic not match")
    topic: str = Field(min_length=1, max_length=255)
    group: str = Field(min_length=1, max_length=255)
    client_id: str | None = Field(None, max_length=255)
    ts: int = Field(0, ge=0)


_REQ = TypeAdapter(RecallRequest)


def encode_request(req: RecallRequest) -> bytes:
    return msgpack.packb(req.model_dump(mode="json"), use_bin_type=True)  # type: ignore[no-any-return]


def decode_request(data: bytes | None) -> RecallRequest:
    """Decode a recall record; raise only :class:`ProtocolError` (with ``kind``)."""
    obj = unpack_dict(data)
    if record_type(obj) != "schedule.recall":
        raise ProtocolError(f"not a recall request: type {show(obj.get('type'))}", "type")
    return validate(_REQ, obj)  # type: ignore[no-any-return]
