"""The README's configuration reference lists every setting of every service."""

from __future__ import annotations

from pathlib import Path

from tracemq.kafka_security import KafkaSecuritySettings
from tracemq_broker.settings import BrokerSettings
from tracemq_collector.settings import CollectorSettings
from tracemq_nameserver.settings import NamesrvSettings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [
        f"{prefix}{name.upper()}"
        for cls in (NamesrvSettings, BrokerSettings, CollectorSettings, KafkaSecuritySettings)
        for prefix in [str(cls.model_config.get("env_prefix") or "TRACEMQ_").upper()]
        for name in cls.model_fields
        if f"`{prefix}{name.upper()}`" not in README
    ]
    assert not missing, f"README lacks: {missing}"


def test_readme_shows_the_two_commands() -> None:
    assert "make demo" in README and "make test" in README
