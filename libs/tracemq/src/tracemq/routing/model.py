"""Route data as clients see it: which brokers host a topic, with how many queues, where."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from tracemq.protocol.control import PERM_READ, PERM_WRITE, BrokerInfo, TopicConfig


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One broker's share of a topic (RocketMQ's QueueData + BrokerData in one)."""

    broker: str
    cluster: str
    read_queues: int
    write_queues: int
    perm: int
    data_bootstrap: str
    address: str
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    trace_topic_enable: bool = False

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> QueueRoute:
        data = json.loads(raw)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def build(cls, broker: BrokerInfo, cfg: TopicConfig) -> QueueRoute:
        return cls(
            broker=broker.broker_name,
            cluster=broker.cluster,
            read_queues=cfg.read_queues,
            write_queues=cfg.write_queues,
            perm=cfg.perm,
            data_bootstrap=broker.data_bootstrap,
            address=broker.address,
            region_id=broker.region_id,
            trace_on=broker.trace_on,
            trace_topic_enable=broker.trace_topic_enable,
        )


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Every broker hosting ``topic`` (sorted by broker name), as last read from Redis."""

    topic: str
    queues: tuple[QueueRoute, ...] = field(default_factory=tuple)
    fetched_at_ms: int = 0

    @property
    def brokers(self) -> list[str]:
        return [q.broker for q in self.queues]

    def to_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "fetched_at_ms": self.fetched_at_ms,
            "brokers": [asdict(q) for q in self.queues],
        }
