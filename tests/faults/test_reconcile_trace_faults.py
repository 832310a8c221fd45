"""Reconciliation under partial trace loss: the trace cluster hangs (SIGSTOP) while group B, whose
trace dispatcher holds only 32 contexts, consumes, fails and retries. Some of its traces are
really discarded — a SubAfter whose SubBefore was already stored, a retry's records after the
failed first attempt's — and the trace sends retried on the hung cluster write some records more
than once.

The reconciliation must still tell trace loss from message loss, message by message: nothing the
listeners consumed is FAILED, IN_FLIGHT, NOT_CONSUMED, PENDING or DUPLICATE; a message whose trace
is partly there is TRACE_INCOMPLETE with the committed-offset evidence (the retry copy's for a
retried one), one whose trace is wholly lost TRACE_LOST; group A equals what its listener did.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from aiokafka import TopicPartition
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    kafka_security,
)
from tracemq.admin import AdminClient
from tracemq.collector_lag import wait_caught_up
from tracemq.offset_reset import confirmed_log_starts
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.waiting import eventually

from tests.conftest import _SESSION_STACKS, SESSION_SECRETS, TEST_SERVICE_ENV
from tests.support.reconcile import run_reconcile

pytestmark = [pytest.mark.spark]

WARM = 20  # messages before the hang: X and Y among them
FLOOD_MAX = 1000  # at most this many messages sent while the trace cluster hangs
X = {3, 9, 15}  # group B's first attempt waits, then returns once its trace queue is full
Y = {5, 11, 17}  # group B fails the first attempt; the retry comes during the hang
QUEUE = 32
BAD_OUTCOMES = {"FAILED", "IN_FLIGHT", "NOT_CONSUMED", "PENDING", "DUPLICATE", "DEAD_LETTERED"}


@pytest.fixture
def hang_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """``fault_stack`` with the nameserver's production-like patience: a broker whose own Kafka
    cluster hangs stops heartbeating (its topic check waits on that cluster), and the test
    default of 8 s would expire the trace broker — and the trace topic's route — mid-hang."""
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("hang"),
            service_env={**TEST_SERVICE_ENV, "TRACEMQ_NAMESRV_EXPIRY_MS": "60000"},
            with_collector=True,
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


def _expected_from_lake(rows: list[dict[str, Any]]) -> str:
    """The outcome a message the listener consumed must get, given what of its consume trace
    reached the lake (records of one attempt share a request id; copies are one record)."""
    if not rows:
        return "TRACE_LOST"
    attempts = {r["request_id"] for r in rows}
    ok = {r["request_id"] for r in rows if r["trace_type"] == "SubAfter" and r["success"]}
    if not ok:
        return "TRACE_INCOMPLETE"
    assert len(ok) == 1, rows  # every listener here succeeded once
    retried = any(
        r["trace_type"] == "SubBefore" and r["request_id"] in ok and (r["retry_times"] or 0) > 0
        for r in rows
    )
    return "CONSUMED_AFTER_RETRY" if len(attempts) > 1 or retried else "CONSUMED"


async def _diagnose_lost_pubs(
    s: EmbeddedStack, sent: dict[str, str], pubs: set[str], producer_stats: dict[str, float]
) -> str:
    """Where the missing Pubs were lost: the producer's counters, the collector's health, and
    whether their msgIds are in the trace cluster's log at all (a plain read of every trace
    partition, no group)."""
    from aiokafka import AIOKafkaConsumer

    missing = sorted((b for b, m in sent.items() if m not in pubs), key=lambda b: int(b[1:]))
    lines = [
        f"missing {len(missing)} of {len(sent)}: {missing}",
        f"producer trace stats: {producer_stats}",
    ]
    health = s.processes["collector"].health_url
    try:
        with urllib.request.urlopen(health, timeout=5) as resp:  # noqa: S310 (local)
            lines.append(f"collector health: {resp.read().decode()[:2000]}")
    except OSError as exc:
        lines.append(f"collector health unavailable: {exc!r}")
    api = health.removesuffix("/healthz")
    for body in missing[:3]:
        req = urllib.request.Request(
            f"{api}/api/v1/traces/{sent[body]}",
            headers={"Authorization": f"Bearer {s.secrets.collector_api_token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 (local)
                lines.append(f"store has {body}: {resp.read().decode()[:600]}")
        except OSError as exc:
            lines.append(f"store look-up of {body}: {exc!r}")
    wanted = {m.encode(): b for b, m in sent.items()}  # all: the read itself is checked
    found: dict[str, list[str]] = defaultdict(list)
    c = AIOKafkaConsumer(
        bootstrap_servers=s.trace_bootstrap,
        enable_auto_commit=False,
        **kafka_security.client_kwargs(s.trace_bootstrap),
    )
    await kafka_security.start(c, s.trace_bootstrap)
    try:
        tps = [
            TopicPartition(t, p)
            for t in await c.topics()
            if t.endswith(".RMQ_SYS_TRACE_TOPIC")
            for p in c.partitions_for_topic(t) or ()
        ]
        c.assign(tps)
        # the confirmed start: Tansu may overstate it (tracemq.offset_reset)
        for tp, start in (await confirmed_log_starts(c, tps, s.trace_bootstrap)).items():
            c.seek(tp, start)
        ends = await c.end_offsets(tps)
        deadline = time.monotonic() + 30

        async def behind() -> bool:
            return any([await c.position(tp) < ends[tp] for tp in tps])

        while time.monotonic() < deadline and await behind():
            for tp, records in (await c.getmany(timeout_ms=500)).items():
                for r in records:
                    for key, body in wanted.items():
                        if r.value and key in r.value:
                            found[body].append(f"{tp.topic}/{tp.partition}@{r.offset}")
        lines.append(f"trace partitions (end offsets): { {str(k): v for k, v in ends.items()} }")
    finally:
        await c.stop()
    lines.append(f"Pubs found in the trace topic: {len(found)} of {len(sent)}")
    lake = Path(s.workdir) / "data" / "collector" / "lake"
    late: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(late) < len(missing):
        ids = set(
            ds.dataset(lake, format="parquet", partitioning="hive")
            .to_table(columns=["msg_id"])
            .column("msg_id")
            .to_pylist()
        )
        late = {b for b in missing if sent[b] in ids}
        await asyncio.sleep(1)
    lines.append(f"missing Pubs in the lake within 30 s more: {len(late)} of {len(missing)}")
    lines.append(f"missing Pubs found there: { {b: found[b] for b in missing if b in found} }")
    return "\n".join(lines)


@pytest.mark.timeout(300)
async def test_partial_trace_loss_never_reads_as_failed_or_in_flight(
    hang_stack: EmbeddedStack, unique: str, tmp_path: Path
) -> None:
    s = hang_stack
    topic = f"TraceFaults_{unique}"
    env = {"redis_url": s.redis_url, "control_bootstrap": s.business_bootstrap}
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    group_a, group_b = f"CG_A_{unique}", f"CG_B_{unique}"

    done: dict[str, set[str]] = {group_a: set(), group_b: set()}  # bodies consumed successfully
    entered_x: set[str] = set()
    retried: set[str] = set()  # bodies group B failed once
    release = asyncio.Event()  # group B's trace queue is full: the gated listeners may return
    consumers: dict[str, PushConsumer] = {}

    async def on_a(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        done[group_a].add(msgs[0].body.decode())
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async def on_b(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        m = msgs[0]
        body = m.body.decode()
        i = int(body[1:])
        if m.reconsume_times == 0 and (i in Y or (i >= WARM and i % 20 == 7)):
            retried.add(body)  # Y, and about 5 % of the flood, fail their first attempt
            ctx.delay_level_when_next_consume = 2 if i in Y else 1  # 5 s / 1 s
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        if (i in X and m.reconsume_times == 0) or (i in Y and m.reconsume_times > 0):
            entered_x.add(body)
            await release.wait()  # the SubBefore is out (X) / appended (Y): the end is not
        done[group_b].add(body)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    for group, listener, options in (
        (group_a, on_a, None),
        (group_b, on_b, {"queue_size": QUEUE}),
    ):
        c = PushConsumer(
            group,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            enable_msg_trace=True,
            trace_options=options,
            **env,
        )
        c.subscribe(topic, "*")
        c.register_message_listener(listener)
        await c.start()
        consumers[group] = c
    # the producer's Pubs must survive the hang (one trace send may wait it out): the test is
    # about the consume side
    producer = Producer(
        f"PG_{unique}", enable_msg_trace=True, trace_options={"send_timeout_ms": 60_000}, **env
    )
    await producer.start()
    sent: dict[str, str] = {}  # body -> msgId
    t_from = time.time() - 1
    trace = s.processes["kafka-trace"]
    b_dispatcher = consumers[group_b].trace_dispatcher

    stop_sending = asyncio.Event()

    async def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            if stop_sending.is_set():
                return
            body = f"m{i}"
            sent[body] = (await producer.send(Message(topic, body.encode(), keys=body))).msg_id
            await asyncio.sleep(0.01)  # about 100 messages/s: the pace of the load

    try:
        for c in consumers.values():
            assert await c.wait_assigned(30)
        await send(0, WARM)
        x_bodies = {f"m{i}" for i in X}
        y_bodies = {f"m{i}" for i in Y}

        async def warm_state() -> bool:
            return entered_x >= x_bodies and retried >= y_bodies

        await eventually(warm_state, timeout=30, what="X waiting, Y failed once")
        # X's SubBefore and Y's failed attempt are in the trace topic before the hang
        assert await b_dispatcher.flush(10)
        trace.signal(signal.SIGSTOP)
        # the load goes on through the hang: group B's trace queue keeps refilling
        flood = asyncio.create_task(send(WARM, WARM + FLOOD_MAX))
        try:

            async def y_retries_began() -> bool:
                return entered_x >= x_bodies | y_bodies

            await eventually(y_retries_began, timeout=30, what="Y's retries under way")

            async def b_queue_full() -> bool:
                st = b_dispatcher.stats()
                return st["queue_depth"] >= QUEUE and st["discarded"] > 0

            await eventually(b_queue_full, timeout=30, interval=0.01, what="B's trace queue full")
            release.set()  # their SubAfters meet a full queue: discarded

            async def gated_returned() -> bool:
                return done[group_b] >= x_bodies | y_bodies

            await eventually(gated_returned, timeout=10, what="the gated listeners returned")
        finally:
            stop_sending.set()  # not cancelled: a send cut short would be an untraced message
            await asyncio.gather(flood, return_exceptions=True)
            trace.signal(signal.SIGCONT)
        release.set()

        async def all_done() -> bool:
            return all(done[g] >= set(sent) for g in done)

        await eventually(all_done, timeout=60, what="both groups consumed everything")
    finally:
        release.set()
        for c in consumers.values():
            await c.shutdown()  # commits the final offsets, flushes what traces it can
        await producer.shutdown()
    t_to = time.time() + 1
    assert b_dispatcher.stats()["discarded"] > 0

    await wait_caught_up(s.redis_url, timeout_s=90)
    lake = Path(s.workdir) / "data" / "collector" / "lake"
    events = [
        r
        for r in ds.dataset(lake, format="parquet", partitioning="hive")
        .to_table(
            columns=[
                "trace_type",
                "group_name",
                "topic",
                "msg_id",
                "request_id",
                "success",
                "retry_times",
            ]
        )
        .to_pylist()
        if r["msg_id"] in set(sent.values())
    ]
    pubs = {r["msg_id"] for r in events if r["trace_type"] == "Pub" and r["topic"] == topic}
    if pubs != set(sent.values()):
        report = await _diagnose_lost_pubs(s, sent, pubs, producer.trace_dispatcher.stats())
        pytest.fail(f"a Pub was lost: the scenario needs every send traced\n{report}")
    consume: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in events:
        if r["trace_type"] in ("SubBefore", "SubAfter"):
            consume[(r["msg_id"], r["group_name"])].append(r)

    out = tmp_path / "out"
    await run_reconcile(s, t_from=t_from, t_to=t_to, lake=lake, out=out, timeout_s=240)

    table = ds.dataset(out / "classified", format="parquet", partitioning="hive").to_table()
    got = {(r["msg_id"], r["group"]): r for r in table.to_pylist() if r["topic"] == topic}
    anomalies = ds.dataset(out / "anomalies", format="parquet", partitioning="hive").to_table()
    evidence = {(r["msg_id"], r["group"]): r["evidence"] for r in anomalies.to_pylist()}

    wrong = {}
    for group in (group_a, group_b):
        for body, msg_id in sent.items():
            want = _expected_from_lake(consume[(msg_id, group)])
            row = got.get((msg_id, group))
            outcome = row["outcome"] if row else None
            if outcome != want:
                wrong[(body, group[:4])] = (outcome, want, consume[(msg_id, group)])
    assert not wrong, wrong
    outcomes = {r["outcome"] for r in got.values()}
    assert not outcomes & BAD_OUTCOMES, outcomes

    incomplete = {k for k, r in got.items() if r["outcome"] == "TRACE_INCOMPLETE"}
    for k in incomplete | {k for k, r in got.items() if r["outcome"] == "TRACE_LOST"}:
        assert "committed offset" in evidence[k], evidence[k]
    b_incomplete = {m for m, g in incomplete if g == group_b}
    # the gated cases did lose part of their trace, and are told apart by their evidence
    assert b_incomplete & {sent[b] for b in x_bodies}, "no X lost only its SubAfter"
    y_incomplete = b_incomplete & {sent[b] for b in y_bodies}
    assert y_incomplete, "no Y lost its retry's trace"
    for m in y_incomplete:
        assert f"retry copy #1 in %RETRY%{group_b}" in evidence[(m, group_b)]
