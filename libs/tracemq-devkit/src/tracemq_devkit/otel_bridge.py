"""The OpenTelemetry bridge of the demo: a plain aiokafka producer and consumer (no tracemq),
instrumented with ``opentelemetry-instrumentation-aiokafka`` and exporting OTLP/HTTP
(``opentelemetry-exporter-otlp-proto-http``) to a collector, which turns their spans into trace
events (``tracemq_collector.otlp``).

Run it as its own process (``python -m tracemq_devkit.otel_bridge``): the instrumentation
patches aiokafka for the whole process, tracemq's own clients included. Settings from the
environment: ``BRIDGE_BOOTSTRAP``, ``BRIDGE_TOPIC``, ``BRIDGE_GROUP``, ``BRIDGE_SERVICE``
(the resource's ``service.name``, the producer group of the Pubs), ``BRIDGE_MESSAGES``,
``BRIDGE_OTLP`` (the collector's base URL) and ``TRACEMQ_COLLECTOR_API_TOKEN``. It creates the
topic (one partition), sends the messages with keys ``<topic>-<n>``, consumes them in the group,
commits, exports every span and prints one JSON line: ``[[partition, offset, key], ...]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys


async def run(
    bootstrap: str, topic: str, group: str, service: str, messages: int, otlp: str, token: str
) -> list[list[object]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.aiokafka import AIOKafkaInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(
        endpoint=f"{otlp}/v1/traces", headers={"Authorization": f"Bearer {token}"}
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    AIOKafkaInstrumentor().instrument(tracer_provider=provider)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for n in range(messages):
            await producer.send_and_wait(topic, b"bridge %d" % n, key=f"{topic}-{n}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[list[object]] = []
    try:
        for _ in range(messages):
            r = await asyncio.wait_for(consumer.getone(), 60)
            got.append([r.partition, r.offset, (r.key or b"").decode()])
        await consumer.commit()
    finally:
        await consumer.stop()
    provider.shutdown()  # exports what is left
    return got


def main() -> int:
    e = os.environ
    try:
        args = (
            e["BRIDGE_BOOTSTRAP"], e["BRIDGE_TOPIC"], e["BRIDGE_GROUP"], e["BRIDGE_SERVICE"],
            int(e.get("BRIDGE_MESSAGES", "20")), e["BRIDGE_OTLP"],
            e.get("TRACEMQ_COLLECTOR_API_TOKEN", ""),
        )  # fmt: skip
    except (KeyError, ValueError) as exc:
        print(f"otel_bridge: missing or bad setting {exc}", file=sys.stderr)
        return 2
    print(json.dumps(asyncio.run(run(*args))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
