"""The broker admin protocol (topic ``tracemq.admin`` on the control cluster, msgpack, v1).

A requester (the CLI) sends an :class:`AdminRequest`, sealed with its key
(:mod:`tracemq.protocol.signing`, purpose ``admin``; see :data:`SIGNER_ROLES`), keyed by the target broker and waits for an
:class:`AdminReply` with the same ``request_id`` on ``reply_topic``. Every broker reads every
request and acts only on those addressed to it.

``reply_topic`` is a field for compatibility, but its only valid value is
:data:`ADMIN_REPLY_TOPIC` (every requester reads that topic and picks its ``request_id``): a
broker writes replies nowhere else, so a request can neither make it write into a business queue
nor stall it on a topic name the transport refuses. Anything else is refused at decode
(``kind="reply_topic"``).

Operations:

- ``topic.create`` / ``topic.update``: body ``topic``, ``read_queues``, ``write_queues``, ``perm``
- ``topic.delete``: body ``topic``
- ``topic.list``: no body
- ``retry.ensure``: body ``group``; the broker creates ``%RETRY%<group>`` and ``%DLQ%<group>``
  (one queue each, on its own cluster) if missing and registers them. A clustering consumer
  sends it at start to every broker hosting its topics, as RocketMQ creates them on a
  consumer's heartbeat (the schedule service also creates a missing one on first use).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tracemq.protocol._envelope import (
    SCHEMA_VERSION,
    ProtocolError,
    pack,
    record_type,
    show,
    unpack_dict,
    validate,
)

ADMIN_TOPIC = "tracemq.admin"
ADMIN_REPLY_TOPIC: Literal["tracemq.admin.reply"] = "tracemq.admin.reply"

REQUEST_ID_MAX_LENGTH = 128

AdminOp = Literal["topic.create", "topic.update", "topic.delete", "topic.list", "retry.ensure"]


class AdminRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    type: AdminOp
    #: also the Kafka key of the reply
    request_id: str = Field(min_length=1, max_length=REQUEST_ID_MAX_LENGTH)
    broker: str = Field(min_length=1)
    reply_topic: Literal["tracemq.admin.reply"] = ADMIN_REPLY_TOPIC
    ts: int = 0
    #: topic.create/update: topic, read_queues, write_queues, perm; topic.delete: topic;
    #: retry.ensure: group
    body: dict[str, Any] = Field(default_factory=dict)


class AdminReply(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    type: Literal["admin.reply"] = "admin.reply"
    request_id: str
    broker: str
    ok: bool
    error: str | None = None
    body: dict[str, Any] = Field(default_factory=dict)


_OPS = frozenset(get_args(AdminOp))

#: The roles whose keys may sign each operation (:mod:`tracemq.protocol.signing`): topics are
#: the admin's; a consumer (a client) asks for its own group's retry topics.
SIGNER_ROLES: dict[str, frozenset[str]] = {
    op: frozenset({"admin", "client"}) if op == "retry.ensure" else frozenset({"admin"})
    for op in _OPS
}


def signer_roles(req: AdminRequest) -> frozenset[str]:
    """Roles whose keys may sign ``req``."""
    return SIGNER_ROLES[req.type]


_REQ = TypeAdapter(AdminRequest)
_REP = TypeAdapter(AdminReply)


def encode(msg: AdminRequest | AdminReply) -> bytes:
    return pack(msg)


def decode_request(data: bytes | None) -> AdminRequest:
    obj = unpack_dict(data)
    op = record_type(obj)
    if op == "admin.reply":
        raise ProtocolError("a reply on the request topic", "type")
    if op not in _OPS:
        raise ProtocolError(f"unknown admin operation {show(obj.get('type'))}", "type")
    reply_topic = obj.get("reply_topic", ADMIN_REPLY_TOPIC)
    if reply_topic != ADMIN_REPLY_TOPIC:
        raise ProtocolError(
            f"reply_topic must be {ADMIN_REPLY_TOPIC!r}, got {show(reply_topic)}", "reply_topic"
        )
    return validate(_REQ, obj)  # type: ignore[no-any-return]


def decode_reply(data: bytes | None) -> AdminReply:
    return validate(_REP, unpack_dict(data))  # type: ignore[no-any-return]
