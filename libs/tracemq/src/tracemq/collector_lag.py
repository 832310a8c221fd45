"""How far the trace collectors are behind the trace topics: the ground truth for "is every
trace written so far in the trace store *and* the trace lake?".

A collector commits a trace partition's Kafka offset only once the events before it are durable
in both its store and its lake (``tracemq_collector.ingest``), so the collectors' consumer
group's committed offsets against the partitions' end offsets say exactly what is still to be
written. Scripts wait on it before reading the lake (``tracemq trace lag --wait``, the demo, the
end-to-end reconciliation tests) instead of sleeping.

The partitions come from the routes in Redis (every broker hosting a trace topic, on its own
data cluster); offsets are read with a plain Kafka consumer that never joins the group.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.routing import RegistryReader, connect

#: the collectors' Kafka consumer group (``TRACEMQ_COLLECTOR_GROUP``'s default)
DEFAULT_GROUP = "tracemq-collector"


@dataclass(frozen=True, slots=True)
class PartitionLag:
    trace_topic: str
    broker: str
    queue_id: int
    end: int
    committed: int

    @property
    def lag(self) -> int:
        return max(0, self.end - self.committed)


class _Offsets:
    """The trace partitions (resolved once from the routes) and one Kafka consumer per data
    cluster, kept open so that polling does not reconnect every time."""

    def __init__(self, group: str, timeout_s: float) -> None:
        self.group, self.timeout_s = group, timeout_s
        self.by_cluster: dict[str, tuple[Any, list[tuple[str, str, Any]]]] = {}

    async def open(self, redis_url: str, trace_topics: tuple[str, ...], prefix: str) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        redis = connect(redis_url)
        try:
            reader = RegistryReader(redis, prefix)
            routes = [await reader.topic_route(t) for t in trace_topics]
        finally:
            await redis.aclose()
        items: dict[str, list[tuple[str, str, Any]]] = {}
        for route in routes:
            for q in route.queues:
                for qid in range(max(q.read_queues, q.write_queues)):
                    tp = TopicPartition(kafka_topic(q.broker, route.topic), qid)
                    items.setdefault(q.data_bootstrap, []).append((route.topic, q.broker, tp))
        for bootstrap, parts in sorted(items.items()):
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, group_id=self.group, enable_auto_commit=False
            )
            self.by_cluster[bootstrap] = (consumer, parts)
            await asyncio.wait_for(consumer.start(), self.timeout_s)

    async def read(self) -> list[PartitionLag]:
        """End and committed offset of every partition, now (``committed()`` asks Kafka)."""
        out: list[PartitionLag] = []
        for consumer, parts in self.by_cluster.values():
            ends = await asyncio.wait_for(
                consumer.end_offsets([tp for *_, tp in parts]), self.timeout_s
            )
            for topic, broker, tp in parts:
                committed = await asyncio.wait_for(consumer.committed(tp), self.timeout_s)
                out.append(PartitionLag(topic, broker, tp.partition, ends[tp], committed or 0))
        return out

    async def close(self) -> None:
        for consumer, _ in self.by_cluster.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), self.timeout_s)


async def collector_lag(
    redis_url: str,
    *,
    group: str = DEFAULT_GROUP,
    trace_topics: tuple[str, ...] = (TRACE_TOPIC,),
    redis_prefix: str = "tmq:",
    timeout_s: float = 10.0,
) -> list[PartitionLag]:
    """Per trace partition: its end offset and the collectors' committed offset (0 if none)."""
    offsets = _Offsets(group, timeout_s)
    try:
        await offsets.open(redis_url, trace_topics, redis_prefix)
        return await offsets.read()
    finally:
        await offsets.close()


async def wait_caught_up(
    redis_url: str,
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.25,
    group: str = DEFAULT_GROUP,
    trace_topics: tuple[str, ...] = (TRACE_TOPIC,),
    redis_prefix: str = "tmq:",
) -> list[PartitionLag]:
    """Wait until the collectors have stored and written to the lake everything that is in the
    trace topics *now* (the end offsets read at the call); raise ``TimeoutError`` naming what
    is still behind when ``timeout_s`` passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    offsets = _Offsets(group, 10.0)
    try:
        await offsets.open(redis_url, trace_topics, redis_prefix)
        lags = await offsets.read()
        targets = {(p.trace_topic, p.broker, p.queue_id): p.end for p in lags}
        while True:
            behind = [
                p for p in lags if p.committed < targets[(p.trace_topic, p.broker, p.queue_id)]
            ]
            if not behind:
                return lags
            if loop.time() >= deadline:
                detail = ", ".join(
                    f"{p.trace_topic}@{p.broker}[{p.queue_id}] committed {p.committed} "
                    f"< {targets[(p.trace_topic, p.broker, p.queue_id)]}"
                    for p in behind
                )
                raise TimeoutError(f"trace collectors still behind after {timeout_s:g}s: {detail}")
            await asyncio.sleep(poll_s)
            lags = await offsets.read()
    finally:
        await offsets.close()
