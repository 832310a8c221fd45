"""A Kafka cluster loses its data (the embedded, in-memory Tansu restarted): offsets begin again
at 0 while the consumers' positions and committed offsets are far past that. Nothing sent after
the restart may be skipped: the position is found outside the log, reset to its beginning,
counted (metric), and shown (``tracemq trace lag``, the collector's /healthz)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.parse
from typing import Any

import pytest
from tracemq import ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer
from tracemq.admin import AdminClient
from tracemq.collector_lag import collector_lag
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import WaitTimeout, eventually

from tests.integration.test_collector import api, http
from tests.support.metrics import value

TRACE_KTOPIC = kafka_topic("trace-broker", TRACE_TOPIC)


async def _stored(base: str, key: str) -> set[str]:
    q = urllib.parse.urlencode({"key": key, "limit": 1000})
    status, body = await asyncio.to_thread(http, f"{base}/api/v1/traces?{q}")
    assert status == 200, body
    return {it["msg_id"] for it in body["items"]}


async def _topic_ready(bootstrap: str, topic: str) -> bool:
    """The restarted cluster has the topic again (its broker recreates it on a heartbeat)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    await admin.start()
    try:
        return topic in await admin.list_topics()
    finally:
        await admin.close()


async def _send(p: Producer, topic: str, key: str, n: int) -> set[str]:
    ids = set()
    for i in range(n):
        r = await p.send(Message(topic, f"{key}-{i}".encode(), keys=[key, f"{key}-{i}"]))
        ids.add(r.msg_id)
    return ids


def _lag_json(s: EmbeddedStack) -> dict[str, Any]:
    env = {**os.environ, **s.client_env()}
    out = subprocess.run(  # noqa: S603 - our own CLI
        [*tracemq_command(), "trace", "lag", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(out.stdout))


@pytest.mark.timeout(150)
async def test_collector_reads_every_trace_after_the_trace_cluster_restarts(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    s = fault_stack
    base = api(s.processes["collector"])
    topic = f"TraceRestart_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    # One trace message per send: the collector's position before the restart (60) is past
    # everything written after it (40), so nothing after the restart is read without a reset.
    p = Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        redis_url=s.redis_url,
        control_bootstrap=s.business_bootstrap,
        trace_options={"batch_size": 1, "flush_interval_ms": 0},
    )
    await p.start()
    try:
        before = await _send(p, topic, f"before-{unique}", 60)

        async def all_before() -> bool:
            return await _stored(base, f"before-{unique}") >= before

        await eventually(all_before, timeout=30, interval=0.5, what="traces before the restart")

        async def committed() -> bool:  # after the lake flush: the restart loses none of it
            (part,) = await collector_lag(s.redis_url)
            return part.committed >= 60

        await eventually(committed, timeout=30, interval=0.5, what="trace offsets committed")

        s.kill_infra("kafka-trace")
        s.restart_infra("kafka-trace")
        await eventually(
            lambda: _topic_ready(s.trace_bootstrap, TRACE_KTOPIC),
            timeout=30,
            interval=0.5,
            what="trace topic recreated",
        )
        st0 = p.trace_dispatcher.stats()
        after = await _send(p, topic, f"after-{unique}", 40)
        assert await p.trace_dispatcher.flush(20)
        st1 = p.trace_dispatcher.stats()
        # every trace of the sends after the restart reached the trace topic
        assert st1["failed"] == st0["failed"] and st1["discarded"] == st0["discarded"], st1

        async def all_after() -> set[str] | None:
            got = await _stored(base, f"after-{unique}")
            return got if got >= after else None

        try:
            await eventually(all_after, timeout=40, interval=0.5, what="traces after the restart")
        except WaitTimeout:
            stored = await _stored(base, f"after-{unique}")
            pytest.fail(
                f"{len(after - stored)} of {len(after)} traces after the restart not stored; "
                f"the collector's log:\n{s.processes['collector'].log_tail(60)}"
            )
    finally:
        await p.shutdown()

    resets = value(
        f"{base}/metrics", "tracemq_collector_offset_resets_total", topic=TRACE_KTOPIC,
        partition="0",
    )  # fmt: skip
    assert resets >= 1

    status, health = await asyncio.to_thread(http, f"{base}/healthz")
    assert status == 200, health
    info = health.get("offset_resets") or health.get("details", {}).get("offset_resets")
    assert info["total"] >= 1, health
    last = next(r for r in info["partitions"] if r["topic"] == TRACE_KTOPIC)
    assert last["from"] >= 60 and last["to"] == 0 and last["reason"] == "past_end", last

    lag = await asyncio.to_thread(_lag_json, s)
    (part,) = lag["partitions"]
    assert part["resets"] >= 1 and part["last_reset"]["from"] >= 60, lag
    assert part["state"] == "ok" and part["committed"] <= part["end"], lag


@pytest.mark.timeout(150)
async def test_push_consumer_reads_every_message_after_the_business_cluster_restarts(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    s = fault_stack
    topic = f"BizRestart_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    got: list[str] = []

    async def listener(msgs: list[MessageExt], _ctx: Any) -> ConsumeConcurrentlyStatus:
        got.extend(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    kw = {"redis_url": s.redis_url, "control_bootstrap": s.business_bootstrap}
    # No periodic commit before the kill: the only commit is the one at revocation, which the
    # restarted cluster refuses (the member is unknown to it). The consumer must still know
    # its position was past the new log's end (CI of stop 14 hit this path by timing).
    c = PushConsumer(f"CG_{unique}", commit_interval_ms=600_000, **kw)  # type: ignore[arg-type]
    c.subscribe(topic)
    c.register_message_listener(listener)
    p = Producer(f"PG_{unique}", **kw)  # type: ignore[arg-type]
    await p.start()
    await c.start()
    try:
        assert await c.wait_assigned(30)
        before = await _send(p, topic, f"b-{unique}", 30)
        await eventually(
            lambda: asyncio.sleep(0, set(got) >= before), timeout=20, what="messages before"
        )
        s.kill_infra("kafka-business")
        s.restart_infra("kafka-business")
        ktopic = kafka_topic("broker-a", topic)
        await eventually(
            lambda: _topic_ready(s.business_bootstrap, ktopic),
            timeout=40,
            interval=0.5,
            what="business topic recreated",
        )

        async def send_ok() -> set[str] | None:
            try:
                return await _send(p, topic, f"a-{unique}", 10)
            except Exception:  # noqa: BLE001 - the producer reconnects
                return None

        after = await eventually(send_ok, timeout=30, interval=0.5, what="sends work again")
        await eventually(
            lambda: asyncio.sleep(0, set(got) >= after), timeout=40, what="messages after"
        )
    finally:
        await c.shutdown()
        await p.shutdown()
    assert c.offset_resets()["total"] >= 1
