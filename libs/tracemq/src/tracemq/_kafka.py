"""Kafka producers shared by one client, one per data cluster (brokers on one cluster share it)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer


class ProducerPool:
    """Lazily started :class:`AIOKafkaProducer` per bootstrap address."""

    def __init__(self, **producer_kwargs: Any) -> None:
        self._kwargs = {
            "linger_ms": 5,
            "request_timeout_ms": 10_000,
            "max_batch_size": 256 * 1024,
            **producer_kwargs,
        }
        self._producers: dict[str, AIOKafkaProducer] = {}
        self._starting: dict[str, asyncio.Task[AIOKafkaProducer]] = {}

    async def get(self, bootstrap: str) -> AIOKafkaProducer:
        p = self._producers.get(bootstrap)
        if p is not None:
            return p
        task = self._starting.get(bootstrap)
        if task is None:
            task = asyncio.ensure_future(self._start(bootstrap))
            self._starting[bootstrap] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._starting.pop(bootstrap, None)

    async def _start(self, bootstrap: str) -> AIOKafkaProducer:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, **self._kwargs)
        try:
            await p.start()
        except BaseException:
            await p.stop()
            raise
        self._producers[bootstrap] = p
        return p

    async def close(self) -> None:
        for t in self._starting.values():
            t.cancel()
        producers, self._producers = list(self._producers.values()), {}
        for p in producers:
            await p.stop()
