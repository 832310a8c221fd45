"""The nameserver control protocol (topic ``tracemq.namesrv``, msgpack, schema version 1).

Brokers send ``broker.register`` at start, ``broker.heartbeat`` every 30 s and
``broker.unregister`` on a graceful stop; clients send ``client.heartbeat`` and
``client.unregister``. Each is sent sealed (:mod:`tracemq.protocol.signing`, purpose
``control``): broker records with a ``broker`` key, client records with a ``client`` key. Records are keyed by broker name or client id so that one sender's
records stay in order on one partition. ``ts`` is the sender's clock (epoch ms).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tracemq.naming import MAX_QUEUES
from tracemq.protocol._envelope import (
    SCHEMA_VERSION,
    ProtocolError,
    pack,
    record_type,
    show,
    unpack_dict,
    validate,
)

#: Largest ``ts`` accepted: a signed 64-bit millisecond count, what Redis scores and the
#: registry scripts handle exactly. (How far into the future a ``ts`` may be is the
#: nameserver's rule: ``TRACEMQ_NAMESRV_MAX_CLOCK_SKEW_MS``.)
TS_MAX = 2**63 - 1

PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_RW = PERM_READ | PERM_WRITE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TopicConfig(_Strict):
    """One topic of a broker's topic table."""

    read_queues: int = Field(ge=1, le=MAX_QUEUES)
    write_queues: int = Field(ge=1, le=MAX_QUEUES)
    perm: int = Field(PERM_RW, ge=0, le=7)


class BrokerInfo(_Strict):
    """What a broker tells the nameserver about itself."""

    cluster: str = Field(min_length=1)
    broker_name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    address: str = Field(min_length=1, description="host:port of the broker service")
    data_bootstrap: str = Field(min_length=1, description="Kafka bootstrap of its data cluster")
    role: Literal["business", "trace"] = "business"
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    trace_topic_enable: bool = False
    http_url: str | None = None


class BrokerRegister(_Strict):
    v: Literal[1] = SCHEMA_VERSION
    type: Literal["broker.register", "broker.heartbeat"]
    ts: int = Field(ge=0, le=TS_MAX)
    broker: BrokerInfo
    topics: dict[str, TopicConfig] = Field(default_factory=dict)


class BrokerUnregister(_Strict):
    v: Literal[1] = SCHEMA_VERSION
    type: Literal["broker.unregister"] = "broker.unregister"
    ts: int = Field(ge=0, le=TS_MAX)
    cluster: str
    broker_name: str = Field(min_length=1)


class Subscription(_Strict):
    topic: str = Field(min_length=1)
    expression: str = "*"


class ClientHeartbeat(_Strict):
    v: Literal[1] = SCHEMA_VERSION
    type: Literal["client.heartbeat"] = "client.heartbeat"
    ts: int = Field(ge=0, le=TS_MAX)
    client_id: str = Field(min_length=1)
    group: str = Field(min_length=1)
    role: Literal["producer", "consumer"]
    message_model: Literal["CLUSTERING", "BROADCASTING"] = "CLUSTERING"
    client_host: str | None = None
    subscriptions: list[Subscription] = Field(default_factory=list)


class ClientUnregister(_Strict):
    v: Literal[1] = SCHEMA_VERSION
    type: Literal["client.unregister"] = "client.unregister"
    ts: int = Field(ge=0, le=TS_MAX)
    client_id: str = Field(min_length=1)
    group: str = Field(min_length=1)


ControlRecord = Annotated[
    BrokerRegister | BrokerUnregister | ClientHeartbeat | ClientUnregister,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[ControlRecord] = TypeAdapter(ControlRecord)
_TYPES = {
    "broker.register",
    "broker.heartbeat",
    "broker.unregister",
    "client.heartbeat",
    "client.unregister",
}


#: The roles whose keys may sign each record type (:mod:`tracemq.protocol.signing`).
SIGNER_ROLES: dict[str, frozenset[str]] = {
    "broker.register": frozenset({"broker"}),
    "broker.heartbeat": frozenset({"broker"}),
    "broker.unregister": frozenset({"broker"}),
    "client.heartbeat": frozenset({"client"}),
    "client.unregister": frozenset({"client"}),
}


def signer_roles(
    record: BrokerRegister | BrokerUnregister | ClientHeartbeat | ClientUnregister,
) -> frozenset[str]:
    """Roles whose keys may sign ``record``."""
    return SIGNER_ROLES[record.type]


def encode(record: BrokerRegister | BrokerUnregister | ClientHeartbeat | ClientUnregister) -> bytes:
    """msgpack bytes of a control record."""
    return pack(record)


def decode(
    data: bytes | None,
) -> BrokerRegister | BrokerUnregister | ClientHeartbeat | ClientUnregister:
    """Decode one control record; raise :class:`ProtocolError` (with ``kind``) on anything bad."""
    obj = unpack_dict(data)
    if record_type(obj) not in _TYPES:
        raise ProtocolError(f"unknown control record type {show(obj.get('type'))}", "type")
    return validate(_ADAPTER, obj)  # type: ignore[no-any-return]


__all__ = [
    "PERM_INHERIT",
    "PERM_READ",
    "PERM_RW",
    "PERM_WRITE",
    "BrokerInfo",
    "BrokerRegister",
    "BrokerUnregister",
    "ClientHeartbeat",
    "ClientUnregister",
    "ProtocolError",
    "Subscription",
    "TopicConfig",
    "decode",
    "encode",
    "signer_roles",
]
