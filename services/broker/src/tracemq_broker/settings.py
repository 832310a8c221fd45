"""Broker settings (environment variables ``TRACEMQ_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from tracemq.auth import SignerSettings, VerifierSettings
from tracemq.naming import TRACE_TOPIC, validate_broker_name
from tracemq.settings import CommonSettings

from tracemq_broker.delay_levels import DEFAULT_DELAY_LEVELS, parse_delay_levels


class BrokerSettings(CommonSettings, VerifierSettings, SignerSettings):
    """A broker verifies admin requests (``TRACEMQ_AUTH_ADMIN_KEYS``; ``retry.ensure`` also
    with ``TRACEMQ_AUTH_CLIENT_KEYS``) and signs its registrations with its own broker key
    (``TRACEMQ_ACCESS_KEY_ID`` / ``TRACEMQ_SECRET_KEY``)."""

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
        Path("./data/broker"),
        description="Where the topic table, schedule progress and transaction state are persisted.",
    )
    broker_schedule_enable: bool | None = Field(
        None,
        description="Run the schedule service (delay levels, consumer retries); "
        "default: true for role=business, else false.",
    )
    broker_delay_levels: str = Field(
        DEFAULT_DELAY_LEVELS,
        description="Delay of each level, space-separated, level 1 first (units ms, s, m, h, d); "
        "one queue of SCHEDULE_TOPIC_XXXX per level.",
    )
    broker_transaction_enable: bool | None = Field(
        None,
        description="Run the transaction service (half messages, commit/rollback, check-back); "
        "default: true for role=business, else false.",
    )
    broker_transaction_timeout_ms: int = Field(
        6_000,
        ge=1,
        description="A half message without a commit or rollback this long after it was sent "
        "gets its first check-back.",
    )
    broker_transaction_check_interval_ms: int = Field(
        30_000, ge=1, description="Time between two check-backs of the same half message."
    )
    broker_transaction_check_max: int = Field(
        15,
        ge=0,
        description="Check-backs of one half message before the broker rolls it back.",
    )

    @field_validator("broker_name")
    @classmethod
    def _name(cls, v: str) -> str:
        validate_broker_name(v)
        return v

    @field_validator("broker_delay_levels")
    @classmethod
    def _levels(cls, v: str) -> str:
        parse_delay_levels(v)
        return v

    @property
    def delay_levels_ms(self) -> list[int]:
        """Delay of level ``n`` at index ``n - 1``, in milliseconds."""
        return parse_delay_levels(self.broker_delay_levels)

    @property
    def runs_schedule(self) -> bool:
        if self.broker_schedule_enable is None:
            return self.broker_role == "business"
        return self.broker_schedule_enable

    @property
    def runs_transactions(self) -> bool:
        if self.broker_transaction_enable is None:
            return self.broker_role == "business"
        return self.broker_transaction_enable

    @property
    def hosts_trace_topic(self) -> bool:
        if self.broker_trace_topic_enable is None:
            return self.broker_role == "trace"
        return self.broker_trace_topic_enable

    @property
    def advertised_address(self) -> str:
        return self.broker_address or f"{self.http_host}:{self.http_port}"
