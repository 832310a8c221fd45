"""Raw reads of a stack's Kafka topics for tests and benchmarks: every record of a topic
(:func:`read_topic`), the trace topic decoded (:func:`read_trace_topic`), and waiting until a
topic is writable through its route (:func:`wait_topic_writable`).

Reads go straight to Kafka (no tracemq consumer, no group), so what they return is what the
brokers and clients wrote, and reading never moves a group's offsets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from tracemq import kafka_security
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.offset_reset import confirmed_log_starts
from tracemq.trace import TraceContext, decode_report

from tracemq_devkit.waiting import eventually


@dataclass
class RawRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    value: bytes
    headers: dict[str, str]
    raw_headers: list[tuple[str, bytes]]


async def read_topic(bootstrap: str, ktopic: str, *, timeout_s: float = 10.0) -> list[RawRecord]:
    """Every record currently in Kafka topic ``ktopic`` (all partitions, from the beginning)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_security.client_kwargs(bootstrap),
        group_id=None,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        await consumer.topics()
        parts = consumer.partitions_for_topic(ktopic) or set()
        tps = [TopicPartition(ktopic, p) for p in sorted(parts)]
        if not tps:
            return []
        consumer.assign(tps)
        # (the confirmed start: Tansu may report its second batch's base, tracemq.offset_reset)
        for tp, start in (await confirmed_log_starts(consumer, tps, bootstrap)).items():
            consumer.seek(tp, start)
        end = await consumer.end_offsets(tps)
        out: list[RawRecord] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            if loop.time() > deadline:
                raise AssertionError(f"could not read {ktopic} to its end in time")
            batch = await consumer.getmany(timeout_ms=500)
            out.extend(
                RawRecord(
                    tp.topic,
                    tp.partition,
                    r.offset,
                    r.timestamp,
                    r.value or b"",
                    {k: v.decode(errors="replace") for k, v in r.headers or ()},
                    list(r.headers or ()),
                )
                for tp, recs in batch.items()
                for r in recs
            )
        return out
    finally:
        await asyncio.wait_for(consumer.stop(), 10)


@dataclass
class TraceMessage:
    partition: int
    offset: int
    keys: set[str]
    contexts: list[TraceContext]
    errors: list[Any] = field(default_factory=list)


async def read_trace_topic(
    bootstrap: str,
    *,
    broker: str = "trace-broker",
    topic: str = TRACE_TOPIC,
    timeout_s: float = 5.0,
) -> list[TraceMessage]:
    """Every trace message currently in the trace topic (all partitions, from the beginning)."""
    out: list[TraceMessage] = []
    for r in await read_topic(bootstrap, kafka_topic(broker, topic), timeout_s=timeout_s):
        keys = set(r.headers["KEYS"].split()) if "KEYS" in r.headers else set()
        # the trace topic is shared by the session: other tests put garbage in it
        try:
            text = r.value.decode()
        except UnicodeDecodeError as exc:
            out.append(TraceMessage(r.partition, r.offset, keys, [], [exc]))
            continue
        res = decode_report(text)
        out.append(TraceMessage(r.partition, r.offset, keys, res.contexts, res.errors))
    return out


async def wait_topic_writable(
    redis_url: str, topic: str = TRACE_TOPIC, *, timeout: float = 30.0
) -> None:
    """Wait until ``topic`` has a writable queue in its route (the trace broker creates the
    trace topic at start: a dispatcher started before its route is seen only warns and then
    counts every trace as failed). :class:`~tracemq_devkit.waiting.WaitTimeout` after
    ``timeout`` seconds."""
    from tracemq.routing.registry import RegistryReader, connect

    redis = connect(redis_url)
    try:
        reader = RegistryReader(redis)

        async def writable() -> bool:
            route = await reader.topic_route(topic)
            return any(q.writable and q.write_queues > 0 for q in route.queues)

        await eventually(writable, timeout=timeout, what=f"a writable route of {topic}")
    finally:
        await redis.aclose()
