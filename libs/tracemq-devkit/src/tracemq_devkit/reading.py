"""Read back the trace topic from the trace cluster and decode it."""

from __future__ import annotations

from dataclasses import dataclass, field

from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.trace import TraceContext, decode_report

from tests.support.brokers import read_topic


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
