"""The reconciliation job on a lake written end to end by the real services: producers and
consumers with trace on, the trace broker, the collector's lake; the subscription history
exported from Redis and the committed offsets snapshotted from Kafka by ``tracemq reconcile``
itself. Every (message, group) classification must be what the workload did."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.collector_lag import wait_caught_up
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually

from tests.support.reconcile import run_reconcile

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis, pytest.mark.spark]

N = 40  # messages; the first half is sent before the "stopped" group stops


@pytest.mark.timeout(420)
async def test_reconcile_a_lake_written_by_the_real_services(
    stack: EmbeddedStack, collector: ManagedProcess, unique: str, tmp_path: Path
) -> None:
    topic = f"TopicRecon_{unique}"
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    async with AdminClient(stack.business_bootstrap, stack.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)

    seen: dict[str, list[tuple[str, int]]] = {}  # group -> [(msg_id, reconsume_times)]
    retried: set[str] = set()
    sent: list[str] = []
    tags: dict[str, str] = {}

    def listener(group: str) -> Any:
        async def on(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
            m = msgs[0]
            seen.setdefault(group, []).append((m.msg_id, m.reconsume_times))
            # by the body, not by `sent`: the listener may run before send() has returned
            if group == "retry" and m.reconsume_times == 0 and int(m.body[1:]) % 5 == 0:
                retried.add(m.msg_id)
                ctx.delay_level_when_next_consume = 1  # 1 s, not RocketMQ's 10 s
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return on

    groups = {  # role -> (consumer group, tag expression, trace on)
        "all": (f"CG_all_{unique}", "*", True),
        "retry": (f"CG_retry_{unique}", "*", True),
        "tagA": (f"CG_tagA_{unique}", "A", True),
        "stopped": (f"CG_stopped_{unique}", "*", True),
        "untraced": (f"CG_untraced_{unique}", "*", False),
    }
    consumers: dict[str, PushConsumer] = {}
    t_from = time.time() - 1
    for role, (group, expr, traced) in groups.items():
        c = PushConsumer(
            group, consume_from=ConsumeFromWhere.FIRST_OFFSET, enable_msg_trace=traced, **env
        )
        c.subscribe(topic, expr)
        c.register_message_listener(listener(role))
        await c.start()
        consumers[role] = c
    producer = Producer(f"PG_recon_{unique}", enable_msg_trace=True, **env)
    await producer.start()

    def got(role: str, upto: int) -> bool:
        return {m for m, _ in seen.get(role, [])} >= set(sent[:upto])

    async def half_stopped() -> bool:
        return got("stopped", N // 2)

    async def all_done() -> bool:
        retried_again = {m for m, rt in seen.get("retry", []) if rt > 0}
        return all(got(r, N) for r in ("all", "retry", "untraced")) and retried_again >= retried

    async def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            tag = "A" if i % 2 == 0 else "B"
            res = await producer.send(Message(topic, f"m{i}".encode(), tags=tag, keys=f"k{i}"))
            sent.append(res.msg_id)
            tags[res.msg_id] = tag

    try:
        await send(0, N // 2)
        # a delayed message recalled before it is due (RocketMQ 5.3's recall): never delivered,
        # and the reconciliation says RECALLED (expected nowhere), not NOT_CONSUMED
        delayed = await producer.send(Message(topic, b"recalled", tags="A", delay_level=3))
        recall = await producer.recall(topic, delayed.recall_handle or "")
        assert recall.recalled, recall
        await eventually(half_stopped, timeout=30, what="the stopped group's first half")
        await consumers.pop("stopped").shutdown()
        await send(N // 2, N)
        await eventually(all_done, timeout=60, what="every group consumed all (retries too)")
    finally:
        for c in consumers.values():
            await c.shutdown()  # commits the final offsets
        await producer.shutdown()  # flushes its traces
    t_to = time.time() + 1
    assert len(retried) == len(range(0, N, 5)), retried  # every fifth message failed once

    await wait_caught_up(stack.redis_url, timeout_s=60)
    lag = await asyncio.to_thread(
        subprocess.run,
        [*tracemq_command(), "trace", "lag", "--json"],
        env={**os.environ, **stack.client_env()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lag.returncode == 0, lag.stderr
    report = json.loads(lag.stdout)
    # nothing traced since wait_caught_up returned: the collectors are at the end
    assert report["lag"] == 0 and report["partitions"], report
    assert all(p["committed"] == p["end"] >= 1 for p in report["partitions"]), report
    lake = Path(stack.workdir) / "data" / "collector" / "lake"
    out = tmp_path / "out"
    res = await run_reconcile(stack, t_from=t_from, t_to=t_to, lake=lake, out=out, timeout_s=300)
    assert "outcomes per topic and group" in res.stdout and "latency (ms)" in res.stdout

    # -- every (message, group) as the workload made it -----------------------------------------
    table = ds.dataset(out / "classified", format="parquet", partitioning="hive").to_table()
    got_rows = {
        (r["msg_id"], r["group"]): r["outcome"] for r in table.to_pylist() if r["topic"] == topic
    }
    recalled_rows = {k: v for k, v in got_rows.items() if k[0] == delayed.msg_id}
    assert list(recalled_rows.values()) == ["RECALLED"], recalled_rows
    got_rows = {k: v for k, v in got_rows.items() if k[0] != delayed.msg_id}
    expected: dict[tuple[str, str], str] = {}
    for i, m in enumerate(sent):
        expected[(m, groups["all"][0])] = "CONSUMED"
        expected[(m, groups["retry"][0])] = "CONSUMED_AFTER_RETRY" if m in retried else "CONSUMED"
        if tags[m] == "A":
            expected[(m, groups["tagA"][0])] = "CONSUMED"
        expected[(m, groups["stopped"][0])] = "CONSUMED" if i < N // 2 else "NOT_CONSUMED"
        expected[(m, groups["untraced"][0])] = "TRACE_LOST"
    assert got_rows == expected, {
        k: (got_rows.get(k), v) for k, v in expected.items() if got_rows.get(k) != v
    } or set(got_rows) - set(expected)

    # the snapshot places the retries in their queue: a copy in %RETRY%<group> per retried
    # message (unless its send-back failed and the consumer retried it in place, which a loaded
    # machine can cause), behind the group's committed offset there
    snapshot = json.loads((out / "inputs" / "offsets.json").read_text())
    retry_topic = f"%RETRY%{groups['retry'][0]}"
    copies = [c for c in snapshot["copies"] if c["topic"] == retry_topic]
    assert copies and {c["msg_id"] for c in copies} <= retried, copies
    assert all(c["reconsume_times"] == 1 for c in copies), copies
    committed = {
        (o["store_addr"], o["queue_id"]): o["committed"]
        for o in snapshot["offsets"]
        if o["topic"] == retry_topic and o["group"] == groups["retry"][0]
    }
    assert all(committed[(c["store_addr"], c["queue_id"])] > c["queue_offset"] for c in copies)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["informational"]["RECALLED"] == 1, summary["informational"]
    assert "<i>RECALLED (informational)</i></td><td>1<" in (out / "report.html").read_text()
    assert "RECALLED" in res.stdout  # the console's table of outcomes counted apart
    per_group = {r["group"]: r for r in summary["by_topic_group"] if r["topic"] == topic}
    want = Counter(v for (_, g), v in expected.items() if g == groups["retry"][0])
    assert (
        per_group[groups["retry"][0]]["outcomes"]["CONSUMED_AFTER_RETRY"]
        == want["CONSUMED_AFTER_RETRY"]
    )
    lat = per_group[groups["all"][0]]["latency"]
    assert lat["end_to_end_ms"]["count"] == N and lat["end_to_end_ms"]["p50"] >= 0
    assert lat["send_cost_ms"]["count"] == N
    assert (out / "report.html").stat().st_size > 0 and (out / "report.png").stat().st_size > 0
