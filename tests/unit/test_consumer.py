"""The consumers' queue bookkeeping and Kafka settings. A revoked queue is handed over cleanly:
nothing new starts on it, the running listener calls finish before the commit, and what was
fetched but not started stays uncommitted (the next owner consumes it); ``fetch_max_wait_ms``
reaches the Kafka consumer. The Kafka consumer is a fake here; the real rebalance is in
tests/integration/test_client_features.py; the fleet's own contract in tests/unit/test_fleet.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from aiokafka import TopicPartition
from tracemq.consumer._process_queue import ProcessQueue
from tracemq.consumer.push import PushConsumer, _ClusterQueues
from tracemq.kafka.fleet import FleetCluster
from tracemq.offset_reset import OffsetGuard, OffsetReset, ResetReason


class _FakeKafka:
    """Commits as aiokafka does: refused once the subscription changed (the new one has no
    assignment yet), which is what lost the commit when a broker's route expired."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []
        self.subscribed: list[list[str]] = []
        self.assigned = True

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not self.assigned:
            from aiokafka.errors import IllegalStateError

            raise IllegalStateError("No partitions assigned")
        self.commits.append(dict(offsets))

    def subscribe(self, topics: list[str], listener: object = None) -> None:
        self.subscribed.append(topics)
        self.assigned = False

    async def stop(self) -> None:
        pass


def _cluster(drain_ms: int = 5_000) -> tuple[_ClusterQueues, _FakeKafka]:
    """The consumer's fleet with a fake Kafka client: the bookkeeping of one cluster."""
    parent = PushConsumer(
        "CG_revoke",
        redis_url="redis://127.0.0.1:1",
        control_bootstrap="127.0.0.1:1",
        revoke_drain_timeout_ms=drain_ms,
    )
    fake = _FakeKafka()
    parent._fleet.consumer_factory = lambda **kw: fake
    c = FleetCluster(parent._fleet, "k:1", {"t", "b.T"})
    parent._fleet.clusters["k:1"] = c
    cc: _ClusterQueues = c.state
    return cc, fake


def _assign(cc: _ClusterQueues, tp: TopicPartition) -> ProcessQueue:
    cc.cluster.assigned.add(tp)
    pq = cc.pqs[tp] = ProcessQueue()
    return pq


def test_process_queue_refuses_new_calls_once_dropped() -> None:
    pq = ProcessQueue()
    assert pq.begin() and pq.running == 1
    pq.dropped = True
    assert not pq.begin() and pq.running == 1
    pq.end()
    assert pq.running == 0


async def test_revocation_waits_for_running_calls_then_commits_past_them() -> None:
    cc, fake = _cluster()
    tp = TopicPartition("t", 0)
    pq = _assign(cc, tp)
    for off in (0, 1, 2):
        pq.add(off)
    assert pq.begin()  # offset 0's listener call is running; 1 and 2 wait in the work queue

    async def finish_later() -> None:
        await asyncio.sleep(0.05)
        pq.done(0)
        pq.end()

    finisher = asyncio.create_task(finish_later())
    await cc.parent._fleet.revoke(cc.cluster, [tp])
    await finisher
    # committed after offset 0 was done, before 1 and 2 (never started: the next owner's)
    assert fake.commits == [{tp: 1}]
    assert tp not in cc.pqs and pq.dropped
    assert not pq.begin()  # a worker picking offset 1 up now skips it


async def test_revocation_gives_up_waiting_at_the_deadline() -> None:
    from prometheus_client import REGISTRY

    def timeouts() -> float:
        v = REGISTRY.get_sample_value(
            "tracemq_consumer_revoke_drain_timeouts_total", {"group": "CG_revoke"}
        )
        return v or 0.0

    before = timeouts()
    cc, fake = _cluster(drain_ms=50)
    tp = TopicPartition("t", 1)
    pq = _assign(cc, tp)
    pq.add(7)
    assert pq.begin()  # a listener that outlives the deadline
    await asyncio.wait_for(cc.parent._fleet.revoke(cc.cluster, [tp]), 2)
    assert fake.commits == [{tp: 7}]  # the next owner starts at 7: consumed again there
    assert tp not in cc.pqs
    assert timeouts() == before + 1  # counted (and logged)


async def test_a_subscription_change_commits_before_the_assignment_is_dropped() -> None:
    """A broker's route expired (or came back): the subscription changes. aiokafka drops the
    assignment at once, so the queues are handed over (drained, committed) before that; the
    rebalance's own revocation later finds nothing left (the queue is counted revoked once)."""
    from prometheus_client import REGISTRY

    def revoked() -> float:
        v = REGISTRY.get_sample_value(
            "tracemq_consumer_revoked_queues_total", {"group": "CG_revoke"}
        )
        return v or 0.0

    before = revoked()
    cc, fake = _cluster()
    cc.cluster.topics = {"a.T", "b.T"}
    tp = TopicPartition("b.T", 0)
    pq = _assign(cc, tp)
    for off in (4, 5, 6):
        pq.add(off)
    pq.done(4)
    pq.done(5)
    await cc.parent._fleet._resubscribe(cc.cluster, {"b.T"})
    assert fake.commits == [{tp: 6}] and fake.subscribed == [["b.T"]]
    assert pq.dropped and tp not in cc.pqs  # offset 6: its next owner's, not run here again
    # the rebalance's own call later: nothing left to commit
    await cc.parent._fleet.revoke(cc.cluster, [tp])
    assert fake.commits == [{tp: 6}]
    assert revoked() == before + 1


async def test_a_reset_queue_commits_in_its_new_log() -> None:
    cc, fake = _cluster()
    tp = TopicPartition("b.T", 0)
    old = _assign(cc, tp)
    old.add(577)
    old.done(577)
    await cc.commit()
    assert fake.commits == [{tp: 578}]
    cc.reset(tp, OffsetReset("b.T", 0, 578, 0, 0, 20, ResetReason.PAST_END, 0))
    new = cc.pqs[tp]
    assert new is not old and not old.dropped  # old-log calls still finish on the old queue
    new.add(0)
    new.done(0)
    await cc.commit()
    assert fake.commits[-1] == {tp: 1}  # not held back by the old log's 578


async def test_a_fetch_dispatched_across_a_rebalance_leaves_the_rest_to_the_next_owner() -> None:
    """A fetch of two queues; the work queue is full, so dispatching the first waits. The group
    rebalances meanwhile and gives both queues back to this member (new ProcessQueues,
    positioned at the revocation's commit): the rest of the old fetch must not run on the new
    queues — the new position reads those messages again (the duplicates CI once caught)."""
    from aiokafka.structs import ConsumerRecord
    from prometheus_client import REGISTRY

    def handed_over() -> float:
        v = REGISTRY.get_sample_value("tracemq_consumer_handed_over_total", {"group": "CG_revoke"})
        return v or 0.0

    cc, fake = _cluster()
    parent = cc.parent
    parent.subscribe("T")
    parent._work = asyncio.Queue(maxsize=2)
    for _ in range(2):
        parent._work.put_nowait(("busy",))  # every listener slot taken
    tp0, tp1 = TopicPartition("b.T", 0), TopicPartition("b.T", 1)
    old0, old1 = _assign(cc, tp0), _assign(cc, tp1)

    def rec(tp: TopicPartition, off: int) -> ConsumerRecord[bytes, bytes]:
        return ConsumerRecord(
            tp.topic, tp.partition, off, 0, 0, None, b"x", None, 1, 0, [("UNIQ_KEY", b"m%d" % off)]
        )

    before = handed_over()
    fetch = asyncio.create_task(cc.batch({tp0: [rec(tp0, 10)], tp1: [rec(tp1, 20)]}))
    for _ in range(50):  # the fetch waits in the work queue with its first queue
        await asyncio.sleep(0)
    assert not fetch.done() and len(old0) == 1 and len(old1) == 0
    await parent._fleet.revoke(cc.cluster, [tp0, tp1])  # nothing ran: nothing committed
    new0, new1 = _assign(cc, tp0), _assign(cc, tp1)  # given back to this member
    assert [parent._work.get_nowait() for _ in range(2)] == [("busy",)] * 2
    await asyncio.wait_for(fetch, 2)
    queued = []
    while not parent._work.empty():
        queued.append(parent._work.get_nowait())
    # only the first queue's message reached the work queue, on its *dropped* queue (a worker
    # skips it); the second queue's never did: nothing is bound to the new queues
    assert [(item[1], item[2]) for item in queued] == [(tp0, old0)] and old0.dropped
    assert len(new0) == 0 and len(new1) == 0 and len(old1) == 0
    assert handed_over() == before + 1
    assert not parent._begin(old0, queued[0][3]) and handed_over() == before + 2


async def test_a_fetch_of_a_queue_revoked_before_it_was_handed_over_is_counted() -> None:
    """Records of a queue this member no longer holds (the fleet revoked it itself for a new
    subscription, aiokafka had fetched it already) go to its next owner: not consumed here,
    and counted as handed over rather than dropped silently."""
    from aiokafka.structs import ConsumerRecord
    from prometheus_client import REGISTRY

    def handed_over() -> float:
        v = REGISTRY.get_sample_value("tracemq_consumer_handed_over_total", {"group": "CG_revoke"})
        return v or 0.0

    cc, _ = _cluster()
    cc.parent.subscribe("T")
    tp = TopicPartition("b.T", 3)
    records = [
        ConsumerRecord(tp.topic, 3, off, 0, 0, None, b"x", None, 1, 0, [("UNIQ_KEY", b"m")])
        for off in (5, 6)
    ]
    before = handed_over()
    await cc.batch({tp: records})
    assert handed_over() == before + 2  # and nothing dispatched: no work queue was needed


async def test_records_fetched_again_in_one_assignment_are_not_consumed_again() -> None:
    """aiokafka can hand a queue's head over twice (sought twice): within one assignment of a
    queue an offset goes to the listeners once; the repeat is counted."""
    from aiokafka.structs import ConsumerRecord
    from prometheus_client import REGISTRY

    def refetched() -> float:
        v = REGISTRY.get_sample_value("tracemq_consumer_refetched_total", {"group": "CG_revoke"})
        return v or 0.0

    cc, _ = _cluster()
    parent = cc.parent
    parent.subscribe("T")
    parent._work = asyncio.Queue(maxsize=100)
    tp = TopicPartition("b.T", 0)
    pq = _assign(cc, tp)

    def recs(*offs: int) -> list[ConsumerRecord[bytes, bytes]]:
        return [ConsumerRecord("b.T", 0, o, 0, 0, None, b"x", None, 1, 0, []) for o in offs]

    before = refetched()
    await cc.batch({tp: recs(0, 1, 2)})
    await cc.batch({tp: recs(0, 1, 2, 3)})  # the head again, then one new record
    offsets = []
    while not parent._work.empty():
        offsets += [m.queue_offset for m in parent._work.get_nowait()[3]]
    assert offsets == [0, 1, 2, 3] and len(pq) == 4
    assert refetched() == before + 3


def test_revoke_drain_timeout_is_validated() -> None:
    with pytest.raises(ValueError, match="revoke_drain_timeout_ms"):
        PushConsumer(
            "CG_x",
            redis_url="redis://127.0.0.1:1",
            control_bootstrap="127.0.0.1:1",
            revoke_drain_timeout_ms=-1,
        )


async def test_fetch_max_wait_reaches_the_kafka_consumer_and_is_validated() -> None:
    from tracemq import LitePullConsumer
    from tracemq.consumer._fetch import FETCH_MAX_WAIT_MS

    env = {"redis_url": "redis://127.0.0.1:1", "control_bootstrap": "127.0.0.1:1"}
    assert PushConsumer("CG_f", **env).fetch_max_wait_ms == FETCH_MAX_WAIT_MS == 100
    c = PushConsumer("CG_f", fetch_max_wait_ms=250, **env)
    cc = FleetCluster(c._fleet, "127.0.0.1:1", {"t"})  # no connection before start()
    assert cc.consumer._fetch_max_wait_ms == 250
    await cc.consumer.stop()
    lite = LitePullConsumer("CG_f", fetch_max_wait_ms=30, **env)
    kc = lite._consumer("127.0.0.1:1")
    assert kc._fetch_max_wait_ms == 30
    await kc.stop()
    for cls in (PushConsumer, LitePullConsumer):
        with pytest.raises(ValueError, match="fetch_max_wait_ms"):
            cls("CG_f", fetch_max_wait_ms=-1, **env)


async def test_lite_pull_commits_a_revoked_queue_before_it_goes() -> None:
    from tracemq import LitePullConsumer

    lite = LitePullConsumer(
        "CG_lite", ack_mode=True, redis_url="redis://127.0.0.1:1", control_bootstrap="127.0.0.1:1"
    )
    fake = _FakeKafka()
    lite._consumers["k"] = fake  # type: ignore[assignment]
    lite._guards["k"] = OffsetGuard(fake)
    tp = TopicPartition("b.T", 3)
    pq = lite._pqs[("k", tp)]
    for off in (10, 11, 12):
        pq.add(off)
    pq.done(10)  # 11 and 12 polled, not acknowledged yet
    await lite._on_revoked("k", [tp])
    assert fake.commits == [{tp: 11}]
    assert ("k", tp) not in lite._pqs


async def test_lite_pull_leaves_a_fetch_revoked_meanwhile_to_the_new_position() -> None:
    """Two clusters polled at once: one's fetch is back, the other's still waits; a rebalance
    on the first meanwhile gives its queue back (positioned at the revocation's commit). The
    fetched records are not delivered: the new position reads them again."""
    from aiokafka.structs import ConsumerRecord
    from tracemq import LitePullConsumer

    lite = LitePullConsumer(
        "CG_lite2", redis_url="redis://127.0.0.1:1", control_bootstrap="127.0.0.1:1"
    )
    lite._state = "running"
    lite.subscribe("T")
    tp = TopicPartition("b.T", 0)
    slow_go = asyncio.Event()

    class _Guard:
        def __init__(self, data: dict[TopicPartition, list[object]], slow: bool) -> None:
            self.data, self.slow = data, slow

        async def getmany(self, **kw: object) -> dict[TopicPartition, list[object]]:
            if self.slow:
                await slow_go.wait()
            return self.data

    rec = ConsumerRecord("b.T", 0, 5, 0, 0, None, b"x", None, 1, 0, [])
    for name, guard in (("k1", _Guard({tp: [rec]}, False)), ("k2", _Guard({}, True))):
        lite._consumers[name] = _FakeKafka()  # type: ignore[assignment]
        lite._guards[name] = guard  # type: ignore[assignment]
    polling = asyncio.create_task(lite.poll(1.0))
    for _ in range(50):  # k1's records are back; k2's fetch still waits
        await asyncio.sleep(0)
    old = lite._pqs[("k1", tp)]
    await lite._on_revoked("k1", [tp])  # nothing polled yet: nothing to commit
    slow_go.set()
    assert await asyncio.wait_for(polling, 2) == []
    assert len(lite._pqs[("k1", tp)]) == 0 and len(old) == 0


async def test_a_consumer_traced_by_message_trace_alone_writes_the_hook_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With message trace's hook as its only consume hook, a one-message listener call is traced
    through the hook's context-free calls (no ConsumeMessageContext); the SubBefore and SubAfter
    are the ones the hook methods write when another hook is registered too (then the generic
    path runs, and that hook sees the context); a route with trace off writes none."""
    from typing import Any

    from tracemq.consumer.listener import ConsumeConcurrentlyStatus
    from tracemq.hooks import ConsumeMessageContext
    from tracemq.message import MessageExt, MessageQueue
    from tracemq.routing.model import QueueRoute
    from tracemq.trace import TraceType, decode
    from tracemq.trace._codec import write_records
    from tracemq.trace._hooks import ConsumeMessageTraceHook

    class Appender:
        def __init__(self) -> None:
            self.records: list[tuple[Any, ...]] = []

        def append_sub_before(self, record: tuple[Any, ...]) -> int:
            self.records.append(record)
            return -1  # no join: both records as they are

        def append_record(self, record: tuple[Any, ...]) -> bool:
            self.records.append(record)
            return True

        def join_sub_after(self, *_: Any) -> bool:
            raise AssertionError("not called when the SubBefore was refused")

    class Seen:
        def __init__(self) -> None:
            self.contexts: list[ConsumeMessageContext] = []

        def consume_message_before(self, ctx: ConsumeMessageContext) -> None:
            self.contexts.append(ctx)

        def consume_message_after(self, ctx: ConsumeMessageContext) -> None:
            pass

    async def listener(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    q = MessageQueue("Orders", "broker-a", 1)
    m = MessageExt("Orders", b"x", "MSG-1", q, 7, 1, 2, "h", reconsume_times=1,
                   properties={"KEYS": "k1"})  # fmt: skip
    route = QueueRoute("broker-a", "c", 8, 8, 6, "k:1", "h:1", region_id="Region-A")

    async def traced(extra: Seen | None, route: QueueRoute) -> list[Any]:
        consumer = PushConsumer(
            "CG_fast", redis_url="redis://127.0.0.1:1", control_bootstrap="127.0.0.1:1"
        )
        consumer.register_message_listener(listener)
        appender = Appender()
        hook = ConsumeMessageTraceHook(appender, "RMQ_SYS_TRACE_TOPIC")  # type: ignore[arg-type]
        consumer._trace_hook = hook
        consumer._hooks.append(hook)
        if extra is not None:
            consumer.register_consume_hook(extra)
        assert await consumer._consume([m], route) == (True, 0)
        return [decode(t)[0] for t in write_records(appender.records) if t is not None]

    import tracemq.consumer.push as push

    def no_context(*_: Any, **__: Any) -> None:
        raise AssertionError("a hook context was built for message trace alone")

    with monkeypatch.context() as patched:
        patched.setattr(push, "ConsumeMessageContext", no_context)
        alone = await traced(None, route)
    seen = Seen()
    with_other = await traced(seen, route)
    assert len(seen.contexts) == 1
    assert [c.trace_type for c in alone] == [TraceType.SubBefore, TraceType.SubAfter]
    for a, b in zip(alone, with_other, strict=True):
        assert (a.trace_type, a.region_id, a.group_name, a.success, a.context_code) == (
            b.trace_type, b.region_id, b.group_name, b.success, b.context_code,
        )  # fmt: skip
        assert a.trace_beans == b.trace_beans
    assert alone[0].region_id == "Region-A" and alone[0].trace_beans[0].retry_times == 1
    assert alone[0].request_id == alone[1].request_id and alone[0].request_id is not None
    assert await traced(None, replace(route, trace_on=False)) == []


async def test_listener_calls_arm_no_loop_timer_each() -> None:
    from typing import Any

    from tracemq.consumer.listener import ConsumeConcurrentlyStatus
    from tracemq.message import MessageExt, MessageQueue

    # A listener call's time-out rides on the consumer's one deadline timer: an
    # asyncio.timeout per call left a (cancelled) TimerHandle in the loop's heap per consumed
    # message, ~3 us of CPU per message.
    consumer = PushConsumer(
        "CG_t", redis_url="redis://127.0.0.1:1", control_bootstrap="127.0.0.1:1"
    )

    async def listener(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer.register_message_listener(listener)
    q = MessageQueue("Orders", "broker-a", 1)
    m = MessageExt("Orders", b"x", "MSG-1", q, 7, 1, 2, "h")
    loop = asyncio.get_running_loop()
    scheduled: list[Any] = loop._scheduled  # type: ignore[attr-defined]
    before = len(scheduled)
    for _ in range(50):
        assert await consumer._consume([m], None) == (True, 0)
    assert len(scheduled) <= before + 1
    consumer._deadlines.close()


async def test_a_listener_past_the_consume_timeout_is_cancelled_as_time_out() -> None:
    from typing import Any

    from tracemq.consumer.listener import ConsumeConcurrentlyStatus
    from tracemq.hooks import ConsumeMessageContext
    from tracemq.message import MessageExt, MessageQueue

    consumer = PushConsumer(
        "CG_t", redis_url="redis://127.0.0.1:1", control_bootstrap="127.0.0.1:1"
    )
    consumer.consume_timeout_s = 0.01
    cancelled, started = asyncio.Event(), asyncio.Event()
    seen: list[Any] = []

    async def listener(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    class Seen:
        def consume_message_before(self, ctx: ConsumeMessageContext) -> None:
            pass

        def consume_message_after(self, ctx: ConsumeMessageContext) -> None:
            seen.append(ctx.status)

    consumer.register_message_listener(listener)
    consumer.register_consume_hook(Seen())
    q = MessageQueue("Orders", "broker-a", 1)
    m = MessageExt("Orders", b"x", "MSG-1", q, 7, 1, 2, "h")
    ok, _ = await consumer._consume([m], None)
    assert not ok and cancelled.is_set() and seen == ["TIME_OUT"]
    # the task is not left cancelled (it awaits on), and a cancellation from outside still
    # propagates as one
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    consumer.consume_timeout_s = 60
    cancelled.clear()
    task = asyncio.create_task(consumer._consume([m], None))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    consumer._deadlines.close()
