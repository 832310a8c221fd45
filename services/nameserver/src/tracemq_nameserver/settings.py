"""Nameserver settings (environment variables ``TRACEMQ_*``)."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator
from tracemq.auth import VerifierSettings
from tracemq.settings import CommonSettings


class NamesrvSettings(CommonSettings, VerifierSettings):
    namesrv_group: str = Field(
        "tracemq-namesrv", description="Consumer group shared by nameservers."
    )
    namesrv_expiry_ms: int = Field(
        120_000, ge=1000, description="A broker or client silent this long is removed."
    )
    namesrv_scan_interval_ms: int = Field(
        5_000, ge=100, description="How often expired brokers and clients are looked for."
    )
    namesrv_control_partitions: int = Field(
        4, ge=1, le=256, description="Partitions of the control topic when a nameserver creates it."
    )
    namesrv_session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="Kafka group session timeout: how fast a dead peer's "
        "partitions move to a live nameserver.",
    )

    @field_validator("namesrv_session_timeout_ms")
    @classmethod
    def _failover_before_expiry(cls, v: int, info: ValidationInfo) -> int:
        # A dead nameserver's control partitions stay unread until the group evicts it (the
        # session timeout) and rebalances; the heartbeats waiting there must not look silent
        # to the survivor's expiry meanwhile.
        expiry = info.data.get("namesrv_expiry_ms")
        if expiry is not None and 2 * v > expiry:
            raise ValueError(
                f"must be at most half of TRACEMQ_NAMESRV_EXPIRY_MS ({expiry}): during a "
                "nameserver failover the survivor would expire live brokers"
            )
        return v

    namesrv_max_clock_skew_ms: int = Field(
        300_000,
        ge=1000,
        description="A control record stamped further ahead of this nameserver's clock is "
        "rejected (reason future): applied, it would shadow its sender's real heartbeats.",
    )
    namesrv_tombstone_ttl_s: int = Field(
        3600, ge=60, description="How long a graceful unregister shadows older heartbeats."
    )
