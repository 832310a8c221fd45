"""OpenTelemetry export (``tracemq.otel``) on the embedded stack, across two processes, with the
SDK's in-memory exporter: a producer in a child process sends under the user's own span; the
consumers here see its W3C ``traceparent`` in the headers, so a one-message ``process`` span is a
child of the send span (same trace), a batch ``process`` span links to the send spans, and
retries / the dead-letter move are events on the consume spans."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageExt,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.otel import instrument
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

PRODUCER = """
import asyncio, json, os
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracemq import Message, Producer
from tracemq.otel import instrument

async def main():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    p = instrument(Producer(os.environ["GROUP"]), provider)
    await p.start()
    topic = os.environ["TOPIC"]
    ids = []
    with provider.get_tracer("app").start_as_current_span("checkout"):
        for m in (
            Message(topic, b"one", tags="TagA", keys=["k1", "k2"]),
            Message(topic, b"two", tags="TagB", delay_level=1),
            Message(topic, b"bad", tags="Bad"),
        ):
            ids.append((await p.send(m)).msg_id)
    await p.shutdown()
    spans = [
        {"name": s.name, "trace": s.context.trace_id, "span": s.context.span_id,
         "parent": s.parent.span_id if s.parent else None, "kind": s.kind.name,
         "attrs": dict(s.attributes), "status": s.status.status_code.name}
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps({"ids": ids, "spans": spans}), flush=True)

asyncio.run(main())
"""


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _processed(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]


@pytest.mark.timeout(150)
async def test_send_and_consume_spans_across_processes(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = f"Otel_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER,
        env={
            **os.environ, "TRACEMQ_REDIS_URL": stack.redis_url,
            "TRACEMQ_CONTROL_BOOTSTRAP": stack.business_bootstrap,
            "GROUP": f"PG_{unique}", "TOPIC": topic,
        },
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0
    sent = json.loads(out.decode().strip().splitlines()[-1])
    ids: list[str] = sent["ids"]
    spans: list[dict[str, Any]] = sent["spans"]
    user = next(s for s in spans if s["name"] == "checkout")
    sends = {s["attrs"]["messaging.message.id"]: s for s in spans if s["kind"] == "PRODUCER"}
    assert set(sends) == set(ids)
    for s in sends.values():  # the user's span around send() is the parent
        assert (s["trace"], s["parent"]) == (user["trace"], user["span"])
        assert s["name"] == f"send {topic}" and s["status"] == "OK"
        a = s["attrs"]
        assert a["messaging.system"] == "rocketmq"
        assert a["messaging.operation.type"] == "send"
        assert a["messaging.destination.name"] == topic
        assert a["messaging.rocketmq.client_group"] == f"PG_{unique}"
    one, two, bad = (sends[i]["attrs"] for i in ids)
    assert one["messaging.rocketmq.message.tag"] == "TagA"
    assert one["messaging.rocketmq.message.keys"] == ["k1", "k2"]
    assert two["messaging.rocketmq.message.delay_time_level"] == 1
    assert "messaging.rocketmq.message.delay_time_level" not in one

    # group A: orderly, one message per call, "bad" fails until it is dead-lettered
    prov_a, exp_a = _provider()
    prov_b, exp_b = _provider()
    g_a, g_b = f"CG_a_{unique}", f"CG_b_{unique}"

    async def orderly(msgs: list[MessageExt], ctx: object) -> ConsumeOrderlyStatus:
        if msgs[0].tags == "Bad":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    a = PushConsumer(
        g_a, consume_from=ConsumeFromWhere.FIRST_OFFSET, max_reconsume_times=1,
        in_process_retry_delay_ms=100, **env,
    )  # fmt: skip
    a.subscribe(topic, "*")
    a.register_message_listener_orderly(orderly)
    b = PushConsumer(
        g_b, consume_from=ConsumeFromWhere.FIRST_OFFSET, consume_message_batch_max_size=8, **env
    )
    b.subscribe(topic, "*")
    b.register_message_listener(lambda m, c: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    instrument(a, prov_a)
    instrument(b, prov_b)
    try:
        await asyncio.gather(a.start(), b.start())

        def a_done() -> bool:
            events = {e.name for s in _processed(exp_a) for e in s.events}
            ok = {s.attributes.get("messaging.message.id") for s in _processed(exp_a)
                  if s.status.status_code == StatusCode.OK}  # fmt: skip
            return "dead_letter" in events and {ids[0], ids[1]} <= ok

        def b_done() -> bool:
            linked = {lk.attributes["messaging.message.id"] for s in _processed(exp_b)
                      for lk in s.links}  # fmt: skip
            single = {s.attributes.get("messaging.message.id") for s in _processed(exp_b)}
            return set(ids) <= linked | single

        await eventually(a_done, timeout=60, what="group A processed all")
        await eventually(b_done, timeout=60, what="group B processed all")
    finally:
        await asyncio.gather(a.shutdown(), b.shutdown())

    # one message per call: a child of its send span, across the processes
    for s in _processed(exp_a):
        mid = s.attributes["messaging.message.id"]
        assert s.kind == SpanKind.CONSUMER
        assert s.parent is not None and s.parent.is_remote
        assert (s.context.trace_id, s.parent.span_id) == (sends[mid]["trace"], sends[mid]["span"])
        assert s.attributes["messaging.system"] == "rocketmq"
        assert s.attributes["messaging.operation.type"] == "process"
        assert s.attributes["messaging.consumer.group.name"] == g_a
        assert s.attributes["messaging.rocketmq.client_group"] == g_a
        assert s.attributes["messaging.destination.name"] == topic
    bad_spans = [s for s in _processed(exp_a) if s.attributes["messaging.message.id"] == ids[2]]
    assert all(s.status.status_code == StatusCode.ERROR for s in bad_spans)
    # the redelivery says it is one, and its failure moves the message to the dead-letter queue
    retried = [s for s in bad_spans if s.attributes.get("tracemq.reconsume_times")]
    assert retried and any(e.name == "retry" for s in retried for e in s.events)
    assert [e.name for s in bad_spans for e in s.events if e.name != "retry"][-1] == "dead_letter"
    assert bad["messaging.rocketmq.message.tag"] == "Bad"

    # group B: a batch span links to each message's send span, in the send's trace
    batches = [s for s in _processed(exp_b) if s.attributes.get("messaging.batch.message_count")]
    assert batches, "the consumer never formed a batch"
    for s in batches:
        assert s.parent is None
        assert len(s.links) == s.attributes["messaging.batch.message_count"]
        for lk in s.links:
            mid = lk.attributes["messaging.message.id"]
            assert (lk.context.trace_id, lk.context.span_id) == (
                sends[mid]["trace"], sends[mid]["span"],
            )  # fmt: skip
