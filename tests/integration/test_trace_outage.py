"""The trace cluster goes down: business sends keep their latency, trace drops are counted,
nothing raises into user code; the trace cluster comes back: new traces flow again.

Runs on its own small stack, because it kills the trace Kafka cluster."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest
from tracemq import Message, Producer
from tracemq.admin import AdminClient
from tracemq.trace import TraceType
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.reading import read_trace_topic
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def outage_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    from tests.conftest import _SESSION_STACKS, SESSION_SECRETS, TEST_SERVICE_ENV

    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("outage"),
            service_env=dict(TEST_SERVICE_ENV),
            secrets=SESSION_SECRETS,
        )
    )
    _SESSION_STACKS.append(s)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


async def _latencies(p: Producer, topic: str, n: int, tag: str) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await p.send(Message(topic, f"{tag}-{i}".encode(), keys=[f"{tag}-{i}"]))
        out.append(time.perf_counter() - t0)
    return out


@pytest.mark.timeout(180)
async def test_trace_cluster_outage(outage_stack: EmbeddedStack, unique: str) -> None:
    s = outage_stack
    topic = f"Outage_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    p = Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        redis_url=s.redis_url,
        control_bootstrap=s.business_bootstrap,
        trace_options={"send_timeout_ms": 500, "queue_size": 256},
    )
    await p.start()
    try:
        healthy = await _latencies(p, topic, 100, "up")
        assert await p.trace_dispatcher.flush(10)
        before = p.trace_dispatcher.stats()
        assert before["sent"] >= 100 and before["failed"] == 0

        s.kill_infra("kafka-trace")
        try:
            down = await _latencies(p, topic, 300, "down")  # nothing raises
            # The business path does not wait for the trace path.
            assert statistics.median(down) <= 2 * statistics.median(healthy) + 0.005, (
                statistics.median(healthy),
                statistics.median(down),
            )

            async def drops_counted() -> bool:
                st = p.trace_dispatcher.stats()
                return st["failed"] + st["discarded"] > 0

            await eventually(drops_counted, timeout=30, what="trace drops counted")
        finally:
            s.restart_infra("kafka-trace")

        # The trace broker recreates its topic on its next heartbeat; then traces flow again.
        await _latencies(p, topic, 20, "back")

        async def back_in_topic() -> bool:
            await _latencies(p, topic, 1, f"probe{time.monotonic_ns()}")
            await p.trace_dispatcher.flush(5)
            msgs = await read_trace_topic(s.trace_bootstrap)
            keys = {
                k
                for m in msgs
                for c in m.contexts
                if c.trace_type == TraceType.Pub
                for k in (c.trace_beans[0].keys or "").split()
            }
            return any(k.startswith("back-") for k in keys) or any(
                k.startswith("probe") for k in keys
            )

        await eventually(back_in_topic, timeout=60, interval=1.0, what="traces flow again")
    finally:
        await p.shutdown()
    st = p.trace_dispatcher.stats()
    assert st["appended"] == st["sent"] + st["failed"] + st["discarded"], st
