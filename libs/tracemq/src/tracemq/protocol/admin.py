"""The broker admin protocol (topic ``tracemq.admin`` on the control cluster, msgpack, v1).

A requester (the CLI) sends an :class:`AdminRequest` keyed by the target broker and waits for an
:class:`AdminReply` with the same ``request_id`` on ``reply_topic``. Every broker reads every
request and acts only on those addressed to it.

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

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tracemq.protocol._envelope import SCHEMA_VERSION, ProtocolError, pack, unpack_dict, validate

ADMIN_TOPIC = "tracemq.admin"
ADMIN_REPLY_TOPIC = "tracemq.admin.reply"

AdminOp = Literal["topic.create", "topic.update", "topic.delete", "topic.list", "retry.ensure"]


class AdminRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    type: AdminOp
    request_id: str = Field(min_length=1)
    broker: str = Field(min_length=1)
    reply_topic: str = ADMIN_REPLY_TOPIC
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


_REQ = TypeAdapter(AdminRequest)
_REP = TypeAdapter(AdminReply)


def encode(msg: AdminRequest | AdminReply) -> bytes:
    return pack(msg)


def decode_request(data: bytes | None) -> AdminRequest:
    obj = unpack_dict(data)
    if obj.get("type") == "admin.reply":
        raise ProtocolError("a reply on the request topic", "type")
    return validate(_REQ, obj)  # type: ignore[no-any-return]


def decode_reply(data: bytes | None) -> AdminReply:
    return validate(_REP, unpack_dict(data))  # type: ignore[no-any-return]
