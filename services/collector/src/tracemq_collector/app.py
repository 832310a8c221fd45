"""The trace collector service. For now it only starts, reports health and serves metrics; the
collector issue adds ingest, the trace store, the lake and the query API."""

from __future__ import annotations

from typing import Any

from tracemq_collector.settings import CollectorSettings


class Collector:
    name = "collector"

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.started = False

    async def start(self) -> None:
        self.settings.collector_data_dir.mkdir(parents=True, exist_ok=True)
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def health(self) -> dict[str, Any]:
        return {"ok": self.started, "ingest": "not implemented yet"}
