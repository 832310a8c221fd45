"""Client features on the embedded stack: batch, oneway, ordered send + orderly listener,
broadcasting, hooks that raise, listener outcomes (RETURNNULL, TIME_OUT), LitePullConsumer."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.errors import ClientStateError
from tracemq.hooks import HOOK_ERRORS
from tracemq.trace import ConsumeReturnType, MessageType, TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_trace_topic
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture
def env(stack: EmbeddedStack) -> dict[str, str]:
    return {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}


async def _topic(admin: AdminClient, name: str, queues: int = 4) -> str:
    await admin.create_topic("broker-a", name, read_queues=queues, write_queues=queues)
    return name


async def _traces(stack: EmbeddedStack, ids: set[str]) -> list[Any]:
    msgs = await read_trace_topic(stack.trace_bootstrap)
    return [c for m in msgs for c in m.contexts if c.trace_beans[0].msg_id in ids]


async def test_batch_and_oneway_are_traced_per_message(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = await _topic(admin, f"Batch_{unique}")
    async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
        results = await p.send_batch(
            [Message(topic, f"b{i}".encode(), keys=[f"bk{i}"]) for i in range(20)]
        )
        assert len({r.msg_id for r in results}) == 20
        assert len({r.queue for r in results}) == 1  # one batch, one queue
        offsets = [r.queue_offset for r in results]
        assert offsets == sorted(offsets) and len(set(offsets)) == 20
        await p.send_oneway(Message(topic, b"oneway", keys=[f"ow-{unique}"]))
        await p.trace_dispatcher.flush(10)

        async def oneway_traced() -> bool:
            msgs = await read_trace_topic(stack.trace_bootstrap)
            return any(
                c.trace_beans[0].keys == f"ow-{unique}" and c.success
                for m in msgs
                for c in m.contexts
                if c.trace_type == TraceType.Pub
            )

        await eventually(oneway_traced, timeout=15, what="oneway Pub trace")
    pubs = [
        c
        for c in await _traces(stack, {r.msg_id for r in results})
        if c.trace_type == TraceType.Pub
    ]
    assert sorted(c.trace_beans[0].keys for c in pubs) == sorted(f"bk{i}" for i in range(20))


async def test_ordered_send_and_orderly_listener(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = await _topic(admin, f"Order_{unique}")
    seen: dict[str, list[int]] = defaultdict(list)
    failed_once: set[int] = set()

    async def orderly(msgs: list[MessageExt], ctx: Any) -> ConsumeOrderlyStatus:
        order, seq = msgs[0].keys.split("-")  # type: ignore[union-attr]
        n = int(seq)
        if n == 3 and n not in failed_once:  # suspend once: the queue must not move on
            failed_once.add(n)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        seen[order].append(n)
        return ConsumeOrderlyStatus.SUCCESS

    c = PushConsumer(f"CG_{unique}", consume_from=ConsumeFromWhere.FIRST_OFFSET, **env)
    c.subscribe(topic)
    c.register_message_listener_orderly(orderly)

    def by_order(mqs: list[MessageQueue], msg: Message, order_id: int) -> MessageQueue:
        return mqs[order_id % len(mqs)]

    async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
        queues = defaultdict(set)
        ids = set()
        for seq in range(8):
            for order in range(5):
                r = await p.send(
                    Message(topic, b"x", keys=f"o{order}-{seq}"), selector=by_order, arg=order
                )
                queues[order].add(r.queue)
                ids.add(r.msg_id)
        assert all(len(q) == 1 for q in queues.values())
        await c.start()
        try:
            await eventually(
                lambda: _async(sum(len(v) for v in seen.values()) == 40),
                timeout=30,
                what="all ordered messages",
            )
        finally:
            await c.shutdown()
        await p.trace_dispatcher.flush(10)
    assert all(v == list(range(8)) for v in seen.values()), dict(seen)
    pubs = [x for x in await _traces(stack, ids) if x.trace_type == TraceType.Pub]
    assert pubs and all(x.trace_beans[0].msg_type == MessageType.Order_Msg for x in pubs)


async def _async(value: bool) -> bool:
    return value


async def test_broadcasting_delivers_to_every_instance(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = await _topic(admin, f"Bcast_{unique}", queues=2)
    got: dict[int, set[bytes]] = {0: set(), 1: set()}
    consumers = []
    for n in (0, 1):

        async def listener(msgs: list[MessageExt], ctx: Any, n: int = n) -> Any:
            got[n].update(m.body for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        from tracemq import ClientSettings

        settings = ClientSettings.from_overrides(**env).model_copy(
            update={"instance_name": f"inst{n}"}
        )
        c = PushConsumer(
            f"CG_{unique}",
            message_model=MessageModel.BROADCASTING,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            settings=settings,
        )
        c.subscribe(topic)
        c.register_message_listener(listener)
        consumers.append(c)
    async with Producer(f"PG_{unique}", **env) as p:
        for i in range(30):
            await p.send(Message(topic, f"m{i}".encode()))
    for c in consumers:
        await c.start()
    try:
        await eventually(
            lambda: _async(all(len(s) == 30 for s in got.values())),
            timeout=30,
            what="every instance got every message",
        )
        # A second running instance named inst0 in this process would split inst0's messages:
        # refused (issue 22, point 1).
        twin = PushConsumer(
            f"CG_{unique}",
            message_model=MessageModel.BROADCASTING,
            settings=ClientSettings.from_overrides(**env).model_copy(
                update={"instance_name": "inst0"}
            ),
        )
        twin.subscribe(topic)
        twin.register_message_listener(listener)
        with pytest.raises(ClientStateError, match="instance name 'inst0' is already used"):
            await twin.start()
        # In another process on this host the same name is the same Kafka group: each instance
        # gets part of the queues, which is reported.
        await _shared_identity_is_reported(stack, consumers[1], topic)
    finally:
        for c in consumers:
            await c.shutdown()


async def _shared_identity_is_reported(
    stack: EmbeddedStack, consumer: PushConsumer, topic: str
) -> None:
    import os
    import sys

    from prometheus_client import REGISTRY

    def shared() -> float:
        return (
            REGISTRY.get_sample_value(
                "tracemq_consumer_broadcast_identity_shared_total", {"group": consumer.group}
            )
            or 0.0
        )

    before = shared()
    script = (
        "import asyncio, os\n"
        "from tracemq import ConsumeConcurrentlyStatus, MessageModel, PushConsumer\n"
        "async def main():\n"
        "    c = PushConsumer(os.environ['GROUP'], message_model=MessageModel.BROADCASTING)\n"
        "    c.subscribe(os.environ['TOPIC'])\n"
        "    c.register_message_listener(lambda m, x: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)\n"
        "    await c.start()\n"
        "    await c.wait_assigned()\n"
        "    print('assigned', flush=True)\n"
        "    await asyncio.sleep(120)\n"  # held until the test kills it
        "asyncio.run(main())\n"
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env={
            **os.environ,
            "TRACEMQ_REDIS_URL": stack.redis_url,
            "TRACEMQ_CONTROL_BOOTSTRAP": stack.business_bootstrap,
            "TRACEMQ_INSTANCE_NAME": consumer.instance_name,
            "GROUP": consumer.group,
            "TOPIC": topic,
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await eventually(
            lambda: _async(shared() > before), timeout=40, what="shared identity reported"
        )
    finally:
        child.kill()
        await child.wait()


async def test_rebalance_hands_queues_over_without_duplicates(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    """A second member joins while the first is busy: the first finishes what it started on the
    revoked queues, commits, and starts nothing more there; nothing is consumed twice."""
    from prometheus_client import REGISTRY

    topic = await _topic(admin, f"Rebal_{unique}", queues=4)
    group = f"CG_{unique}"
    successes: dict[str, int] = defaultdict(int)
    by_member: dict[int, int] = defaultdict(int)
    where: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # (member, queue, offset)
    total = 400

    def make(n: int) -> PushConsumer:
        async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
            await asyncio.sleep(0.02)  # slow enough that work is queued at the rebalance
            for m in msgs:
                successes[m.msg_id] += 1
                where[m.msg_id].append((n, m.queue.queue_id, m.queue_offset))
            by_member[n] += 1
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        c = PushConsumer(
            group,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            consume_concurrency=2,
            commit_interval_ms=200,
            **env,
        )
        c.subscribe(topic)
        c.register_message_listener(listener)
        return c

    def revoked() -> float:
        v = REGISTRY.get_sample_value("tracemq_consumer_revoked_queues_total", {"group": group})
        return v or 0.0

    async with Producer(f"PG_{unique}", **env) as p:
        for i in range(total):
            await p.send(Message(topic, f"r{i}".encode()))
    first, second = make(0), make(1)
    with pytest.raises(ClientStateError, match="not running"):
        await first.wait_assigned(1)
    await first.start()
    try:
        assert await first.wait_assigned(30)  # the group's first rebalance is over
        (cluster,) = first._fleet.clusters.values()
        assert {tp.partition for tp in cluster.consumer.assignment() if "Rebal_" in tp.topic} == {
            0,
            1,
            2,
            3,
        }
        await eventually(
            lambda: _async(len(successes) >= 40), timeout=30, what="the first member consuming"
        )
        await second.start()  # the group rebalances: the first member gives queues up
        await eventually(
            lambda: _async(len(successes) == total), timeout=60, what="every message consumed"
        )
        rebalanced = revoked()  # (read before the shutdowns, which revoke too)
    finally:
        await second.shutdown()
        await first.shutdown()
    assert rebalanced > 0, f"no rebalance happened: the test proves nothing ({dict(by_member)})"
    assert by_member[1] > 0, dict(by_member)
    twice = {k: where[k] for k, v in successes.items() if v > 1}
    assert not twice, (
        f"{len(twice)} message(s) consumed more than once (member, queue, offset): {twice}"
    )


class _Boom:
    def send_message_before(self, context: Any) -> None:
        raise RuntimeError("hook failure")

    def send_message_after(self, context: Any) -> None:
        raise RuntimeError("hook failure")

    def consume_message_before(self, context: Any) -> None:
        raise RuntimeError("hook failure")

    def consume_message_after(self, context: Any) -> None:
        raise RuntimeError("hook failure")


class _Recorder:
    def __init__(self) -> None:
        self.sends: list[Any] = []
        self.consumes: list[Any] = []

    def send_message_before(self, context: Any) -> None:
        pass

    def send_message_after(self, context: Any) -> None:
        self.sends.append(context)

    def consume_message_before(self, context: Any) -> None:
        pass

    def consume_message_after(self, context: Any) -> None:
        self.consumes.append((context.context_code, [m.body for m in context.messages]))


async def test_hooks_and_listener_outcomes(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = await _topic(admin, f"Hooks_{unique}", queues=1)
    boom, rec = _Boom(), _Recorder()
    errors_before = HOOK_ERRORS.labels("_Boom", "send_message_after")._value.get()
    attempts: dict[bytes, int] = defaultdict(int)

    async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
        body = msgs[0].body
        attempts[body] += 1
        if body == b"null" and attempts[body] == 1:
            return None  # RETURNNULL
        if body == b"slow" and attempts[body] == 1:
            await asyncio.sleep(2)  # over the 0.5 s consume timeout: TIME_OUT
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = PushConsumer(
        f"CG_{unique}",
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        consume_timeout_minutes=0.5 / 60,
        in_process_retry_delay_ms=50,
        **env,
    )
    c.subscribe(topic)
    c.register_message_listener(listener)
    c.register_consume_hook(boom)
    c.register_consume_hook(rec)
    async with Producer(f"PG_{unique}", **env) as p:
        p.register_send_hook(boom)
        p.register_send_hook(rec)
        for body in (b"ok", b"null", b"slow"):
            assert (await p.send(Message(topic, body))).msg_id  # the raising hook broke nothing
    assert len(rec.sends) == 3 and all(s.send_result is not None for s in rec.sends)
    assert HOOK_ERRORS.labels("_Boom", "send_message_after")._value.get() == errors_before + 3
    await c.start()
    try:
        await eventually(
            lambda: _async(len([x for x in rec.consumes if x[0] == 0]) == 3),
            timeout=30,
            what="every message finally consumed",
        )
    finally:
        await c.shutdown()
    codes = defaultdict(list)
    for code, bodies in rec.consumes:
        codes[bodies[0]].append(code)
    assert codes[b"ok"] == [ConsumeReturnType.SUCCESS]
    assert codes[b"null"] == [ConsumeReturnType.RETURNNULL, ConsumeReturnType.SUCCESS]
    assert codes[b"slow"] == [ConsumeReturnType.TIME_OUT, ConsumeReturnType.SUCCESS]


async def test_lite_pull_consumer_traces_and_acks(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    topic = await _topic(admin, f"Pull_{unique}", queues=1)
    async with Producer(f"PG_{unique}", **env) as p:
        ids = [
            (await p.send(Message(topic, f"m{i}".encode(), keys=[f"k{i}"]))).msg_id
            for i in range(10)
        ]
    # Plain mode: traced at poll, like RocketMQ.
    plain = LitePullConsumer(
        f"CGp_{unique}",
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_msg_trace=True,
        auto_commit=False,
        **env,
    )
    plain.subscribe(topic)
    await plain.start()
    got: list[MessageExt] = []
    try:

        async def polled() -> bool:
            got.extend(await plain.poll(1.0))
            return len(got) >= 10

        await eventually(polled, timeout=30, what="plain poll")
        await plain.commit()
        assert await plain.committed(got[0].queue) == 10
    finally:
        await plain.shutdown()
    # Ack mode: SubAfter at ack/nack with the real result; nacked messages come back.
    acker = LitePullConsumer(
        f"CGa_{unique}",
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_msg_trace=True,
        auto_commit=False,
        ack_mode=True,
        **env,
    )
    acker.subscribe(topic)
    await acker.start()
    acked: set[str] = set()
    try:

        async def drained() -> bool:
            for m in await acker.poll(1.0):
                if m.body == b"m3" and m.reconsume_times == 0:
                    acker.nack(m)
                elif m.body == b"m5" and m.reconsume_times == 0:
                    continue  # left unacknowledged for now
                else:
                    acker.ack(m)
                    acked.add(m.msg_id)
            return len(acked) == 9

        await eventually(drained, timeout=30, what="ack mode drained")
        await acker.commit()
        assert await acker.committed(got[0].queue) == 5  # m5 is still pending
    finally:
        await acker.shutdown()
    ctxs = await _traces(stack, set(ids))
    plain_after = [
        c for c in ctxs if c.group_name == f"CGp_{unique}" and c.trace_type == TraceType.SubAfter
    ]
    assert len(plain_after) == 10 and all(c.success for c in plain_after)
    ack_after = [
        c for c in ctxs if c.group_name == f"CGa_{unique}" and c.trace_type == TraceType.SubAfter
    ]
    m3 = ids[3]
    m3_codes = sorted(c.context_code for c in ack_after if c.trace_beans[0].msg_id == m3)
    assert m3_codes == [ConsumeReturnType.SUCCESS, ConsumeReturnType.FAILED]
    retries = sorted(
        c.trace_beans[0].retry_times
        for c in ctxs
        if c.group_name == f"CGa_{unique}"
        and c.trace_type == TraceType.SubBefore
        and c.trace_beans[0].msg_id == m3
    )
    assert retries == [0, 1]


@pytest.mark.timeout(90)
async def test_lite_pull_cost_modes(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    """What a LitePullConsumer's SubAfter cost measures in each mode (README: LitePullConsumer):
    0 by default (traced at poll, as RocketMQ); poll → ack with ack_mode, so a message waits
    behind the rest of its batch; begin → ack with per_message_cost, its own processing only."""
    topic = await _topic(admin, f"Cost_{unique}", queues=1)
    async with Producer(f"PG_{unique}", **env) as p:
        ids = {(await p.send(Message(topic, f"c{i}".encode()))).msg_id for i in range(3)}
    work_s = 0.3  # the application's processing of one message (not a synchronisation)
    batches: dict[str, list[list[str]]] = {}
    for mode in ("poll", "ack", "own"):
        group = f"CG{mode}_{unique}"
        c = LitePullConsumer(
            group,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            enable_msg_trace=True,
            auto_commit=False,
            ack_mode=mode != "poll",
            per_message_cost=mode == "own",
            **env,
        )
        c.subscribe(topic)
        await c.start()
        batches[group] = []
        last: list[MessageExt] = []
        try:

            async def consumed(
                c: LitePullConsumer = c,
                group: str = group,
                mode: str = mode,
                last: list[MessageExt] = last,
            ) -> bool:
                polled = await c.poll(1.0)
                if polled:
                    batches[group].append([m.msg_id for m in polled])
                last[:] = polled[-1:] or last
                for m in polled:
                    if mode == "own":
                        with c.processing(m):
                            await asyncio.sleep(work_s)
                    else:
                        await asyncio.sleep(work_s)
                        if mode == "ack":
                            c.ack(m)
                return sum(map(len, batches[group])) >= 3

            await eventually(consumed, timeout=30, what=f"{mode} mode consumed")
            if mode == "own":
                with pytest.raises(ClientStateError, match="not waiting to begin"):
                    c.begin(last[0])  # acknowledged already
        finally:
            await c.shutdown()  # flushes its traces

    def attempts(group: str) -> dict[str, tuple[int, int, int]]:
        """msgId → (SubBefore timestamp, SubAfter timestamp, SubAfter cost)."""
        before = {
            x.trace_beans[0].msg_id: x.timestamp
            for x in ctxs
            if x.group_name == group and x.trace_type == TraceType.SubBefore
        }
        return {
            x.trace_beans[0].msg_id: (before[x.trace_beans[0].msg_id], x.timestamp, x.cost_time)
            for x in ctxs
            if x.group_name == group and x.trace_type == TraceType.SubAfter
        }

    ctxs: list[Any] = []

    async def traced() -> bool:
        ctxs[:] = await _traces(stack, ids)
        return all(len(attempts(g)) == 3 for g in batches)

    await eventually(traced, timeout=30, what="every mode's traces")
    work_ms = int(work_s * 1000)
    poll_mode = attempts(f"CGpoll_{unique}")
    assert {cost for _, _, cost in poll_mode.values()} == {0}
    ack_mode = attempts(f"CGack_{unique}")
    for batch in batches[f"CGack_{unique}"]:
        for k, msg_id in enumerate(batch):  # the k-th waited behind k others: (k + 1) × work
            assert ack_mode[msg_id][2] >= (k + 1) * work_ms - 5, (k, ack_mode[msg_id])
    own = attempts(f"CGown_{unique}")
    for batch in batches[f"CGown_{unique}"]:
        for k, msg_id in enumerate(batch):
            begin, end, cost = own[msg_id]
            assert cost == end - begin and cost >= work_ms - 5, own[msg_id]
            if k:  # begun only once the previous one was acknowledged: no waiting counted
                assert begin >= own[batch[k - 1]][1], (k, own)
