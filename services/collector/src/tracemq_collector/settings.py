"""Collector settings (environment variables ``TRACEMQ_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from tracemq.settings import CommonSettings


class CollectorSettings(CommonSettings):
    collector_data_dir: Path = Field(
        Path("./data/collector"), description="Trace store and trace lake directory."
    )
