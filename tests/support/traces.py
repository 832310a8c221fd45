"""Read back the trace topic from the trace cluster and decode it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.trace import TraceContext, decode_report


@dataclass
class TraceMessage:
    partition: int
    offset: int
    keys: set[str]
    contexts: list[TraceContext]
    errors: list[object] = field(default_factory=list)


async def read_trace_topic(
    bootstrap: str,
    *,
    broker: str = "trace-broker",
    topic: str = TRACE_TOPIC,
    timeout_s: float = 5.0,
) -> list[TraceMessage]:
    """Every trace message currently in the trace topic (all partitions, from the beginning)."""
    ktopic = kafka_topic(broker, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        await consumer.topics()
        parts = consumer.partitions_for_topic(ktopic) or set()
        tps = [TopicPartition(ktopic, p) for p in sorted(parts)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[TraceMessage] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        async def behind() -> bool:
            return any([await consumer.position(tp) < end[tp] for tp in tps])

        while await behind():
            if loop.time() > deadline:
                raise AssertionError("could not read the trace topic to its end in time")
            batch = await consumer.getmany(timeout_ms=500)
            for tp, recs in batch.items():
                for r in recs:
                    keys = set()
                    for k, v in r.headers or ():
                        if k == "KEYS":
                            keys = set(v.decode().split())
                    # the trace topic is shared by the session: other tests put garbage in it
                    try:
                        text = (r.value or b"").decode()
                    except UnicodeDecodeError as exc:
                        out.append(TraceMessage(tp.partition, r.offset, keys, [], [exc]))
                        continue
                    res = decode_report(text)
                    out.append(TraceMessage(tp.partition, r.offset, keys, res.contexts, res.errors))
        return out
    finally:
        await asyncio.wait_for(consumer.stop(), 10)
