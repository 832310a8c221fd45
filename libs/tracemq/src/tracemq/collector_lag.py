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


async def collector_lag(
    redis_url: str,
    *,
    group: str = DEFAULT_GROUP,
    trace_topics: tuple[str, ...] = (TRACE_TOPIC,),
    redis_prefix: str = "tmq:",
    timeout_s: float = 10.0,
) -> list[PartitionLag]:
    """Per trace partition: its end offset and the collectors' committed offset (0 if none)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    redis = connect(redis_url)
    try:
        reader = RegistryReader(redis, redis_prefix)
        routes = [await reader.topic_route(t) for t in trace_topics]
    finally:
        await redis.aclose()
    by_cluster: dict[str, list[tuple[str, str, TopicPartition]]] = {}
    for route in routes:
        for q in route.queues:
            for qid in range(max(q.read_queues, q.write_queues)):
                tp = TopicPartition(kafka_topic(q.broker, route.topic), qid)
                by_cluster.setdefault(q.data_bootstrap, []).append((route.topic, q.broker, tp))
    out: list[PartitionLag] = []
    for bootstrap, items in sorted(by_cluster.items()):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )
        await asyncio.wait_for(consumer.start(), timeout_s)
        try:
            ends = await asyncio.wait_for(consumer.end_offsets([tp for *_, tp in items]), timeout_s)
            for topic, broker, tp in items:
                committed = await asyncio.wait_for(consumer.committed(tp), timeout_s)
                out.append(PartitionLag(topic, broker, tp.partition, ends[tp], committed or 0))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout_s)
    return out


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
    first = await collector_lag(
        redis_url, group=group, trace_topics=trace_topics, redis_prefix=redis_prefix
    )
    targets = {(p.trace_topic, p.broker, p.queue_id): p.end for p in first}
    lags = first
    while True:
        behind = [
            p for p in lags if p.committed < targets.get((p.trace_topic, p.broker, p.queue_id), 0)
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
        lags = await collector_lag(
            redis_url, group=group, trace_topics=trace_topics, redis_prefix=redis_prefix
        )
