"""The transaction protocol (msgpack, schema v1): end-transaction records and check-backs.

- :class:`EndTransaction` (``tx.end``): written by a :class:`~tracemq.TransactionProducer` to
  partition 0 of ``<broker>.RMQ_SYS_TRANS_OP_HALF_TOPIC`` on the data cluster of the broker that
  holds the half message, once the local transaction has a result (or a check-back asked for
  it). ``half_offset`` + ``msg_id`` name the half message; the first COMMIT or ROLLBACK wins,
  UNKNOW changes nothing, and duplicates or garbage are counted and skipped by the broker.
- :class:`CheckRequest` (``tx.check``): written by a broker to :data:`TXCHECK_TOPIC` on the
  control cluster, keyed by producer group, for a half message left without a result after the
  transaction time-out. Every live producer of the group reads it, runs
  ``check_local_transaction`` and answers with an :class:`EndTransaction` (``from_check=True``).

The check request carries the half message (body and properties), as RocketMQ's
CHECK_TRANSACTION_STATE request does, so the producer can check without reading the broker.
"""

from __future__ import annotations

from typing import Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tracemq.protocol._envelope import (
    SCHEMA_VERSION,
    ProtocolError,
    record_type,
    show,
    unpack_dict,
    validate,
)

TXCHECK_TOPIC = "tracemq.txcheck"

TransactionStateName = Literal["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]


class EndTransaction(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    type: Literal["tx.end"] = "tx.end"
    half_offset: int = Field(ge=0)
    msg_id: str = Field(min_length=1)
    transaction_id: str | None = None
    state: TransactionStateName
    from_check: bool = False
    group: str = Field(min_length=1)
    client_id: str | None = None
    ts: int = Field(0, ge=0)


class CheckRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    type: Literal["tx.check"] = "tx.check"
    broker: str = Field(min_length=1)
    group: str = Field(min_length=1)
    half_offset: int = Field(ge=0)
    msg_id: str = Field(min_length=1)
    transaction_id: str | None = None
    #: where the answer goes: the data cluster of ``broker``
    data_bootstrap: str = Field(min_length=1)
    broker_address: str = ""
    region_id: str = "DefaultRegion"
    #: the real topic and queue of the half message
    topic: str = Field(min_length=1)
    queue_id: int = Field(0, ge=0)
    body: bytes = b""
    properties: dict[str, str] = Field(default_factory=dict)
    born_timestamp: int = 0
    check_times: int = Field(0, ge=0)
    ts: int = Field(0, ge=0)


_END = TypeAdapter(EndTransaction)
_CHECK = TypeAdapter(CheckRequest)


def encode(record: EndTransaction | CheckRequest) -> bytes:
    # python-mode dump keeps ``body`` as bytes (msgpack bin), JSON mode would not
    return msgpack.packb(record.model_dump(), use_bin_type=True)  # type: ignore[no-any-return]


def decode_end(data: bytes | None) -> EndTransaction:
    """Decode an op-topic record; raise :class:`ProtocolError` (with ``kind``) on anything bad."""
    obj = unpack_dict(data)
    if record_type(obj) != "tx.end":
        raise ProtocolError(f"not an end-transaction record: type {show(obj.get('type'))}", "type")
    return validate(_END, obj)  # type: ignore[no-any-return]


def decode_check(data: bytes | None) -> CheckRequest:
    obj = unpack_dict(data)
    if record_type(obj) != "tx.check":
        raise ProtocolError(f"not a check request: type {show(obj.get('type'))}", "type")
    return validate(_CHECK, obj)  # type: ignore[no-any-return]
