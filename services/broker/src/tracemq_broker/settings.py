"""Broker settings (environment variables ``TRACEMQ_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from tracemq.naming import TRACE_TOPIC, validate_broker_name
from tracemq.settings import CommonSettings


class BrokerSettings(CommonSettings):
    broker_name: str = Field("broker-a", description="Unique broker name ([a-zA-Z0-9_-], no dots).")
    broker_role: Literal["business", "trace"] = Field(
        "business", description="business: owns business topics; trace: owns the trace topic."
    )
    broker_cluster: str = Field("DefaultCluster", description="Cluster name the broker joins.")
    broker_data_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap of the cluster holding this broker's data."
    )
    broker_address: str | None = Field(
        None, description="host:port advertised to clients (default: http host and port)."
    )
    broker_region_id: str = Field("DefaultRegion", description="regionId copied into SendResult.")
    broker_trace_on: bool = Field(True, description="traceOn copied into SendResult.")
    broker_trace_topic_enable: bool | None = Field(
        None, description="Host the trace topic (default: true for role=trace, else false)."
    )
    broker_trace_topic: str = Field(TRACE_TOPIC, description="Name of the trace topic it hosts.")
    broker_trace_topic_queues: int = Field(
        1, ge=1, le=1024, description="Queues of the trace topic."
    )
    broker_heartbeat_interval_ms: int = Field(
        30_000, ge=100, description="How often the broker re-registers with the nameserver."
    )
    broker_data_dir: Path = Field(
        Path("./data/broker"), description="Where the topic table is persisted."
    )

    @field_validator("broker_name")
    @classmethod
    def _name(cls, v: str) -> str:
        validate_broker_name(v)
        return v

    @property
    def hosts_trace_topic(self) -> bool:
        if self.broker_trace_topic_enable is None:
            return self.broker_role == "trace"
        return self.broker_trace_topic_enable

    @property
    def advertised_address(self) -> str:
        return self.broker_address or f"{self.http_host}:{self.http_port}"
