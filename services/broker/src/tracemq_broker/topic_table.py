"""The broker's topic table, persisted as JSON so that a restarted broker keeps its topics."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from tracemq.protocol.control import TopicConfig

FORMAT_VERSION = 1


class TopicTable:
    """Topic name → :class:`TopicConfig`; every change is written to disk before it is announced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.topics: dict[str, TopicConfig] = {}
        self._lock = asyncio.Lock()

    def load(self) -> None:
        if not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"{self.path}: unknown topic table version {data.get('version')!r}")
        self.topics = {t: TopicConfig(**cfg) for t, cfg in data["topics"].items()}

    async def put(self, topic: str, cfg: TopicConfig) -> None:
        async with self._lock:
            self.topics[topic] = cfg
            await asyncio.to_thread(self._write)

    async def remove(self, topic: str) -> bool:
        async with self._lock:
            existed = self.topics.pop(topic, None) is not None
            if existed:
                await asyncio.to_thread(self._write)
            return existed

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        payload = {
            "version": FORMAT_VERSION,
            "topics": {t: c.model_dump() for t, c in sorted(self.topics.items())},
        }
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
