"""AsyncTraceDispatcher with a fake route cache and a fake sender (no Kafka, no Redis)."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from tracemq._kafka import MAX_MESSAGE_SIZE
from tracemq.errors import TracemqError
from tracemq.message_id import new_msg_id
from tracemq.naming import TRACE_TOPIC
from tracemq.protocol.control import PERM_READ, PERM_RW
from tracemq.routing.model import QueueRoute, TopicRoute
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType, decode, encode
from tracemq.trace._codec import (
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    PUB,
    SUB_AFTER,
    SUB_BEFORE,
    SUB_PAIR,
    RawRecord,
    raw_context,
    split_pair,
    write_records,
)
from tracemq.trace._dispatcher import (
    AsyncTraceDispatcher,
    KafkaTraceSender,
    TraceTopicError,
)

TS = 1_700_000_000_000


# ------------------------------------------------------------------------------ fakes


def queue_route(broker: str, write_queues: int = 4, perm: int = PERM_RW) -> QueueRoute:
    return QueueRoute(
        broker=broker,
        cluster="trace-cluster",
        read_queues=write_queues,
        write_queues=write_queues,
        perm=perm,
        data_bootstrap=f"{broker}:9092",
        address=f"{broker}:10911",
    )


class FakeRoutes:
    """Anything with ``async get(topic, refresh=False) -> TopicRoute``."""

    def __init__(self, *queues: QueueRoute) -> None:
        self.queues = tuple(queues)
        self.calls = 0

    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        self.calls += 1
        return TopicRoute(topic=topic, queues=self.queues)


@dataclass
class Call:
    broker: str
    queue_id: int
    trace_topic: str
    value: bytes
    headers: list[tuple[str, bytes]]
    ok: bool = False

    @property
    def header(self) -> dict[str, bytes]:
        return dict(self.headers)


@dataclass
class FakeSender:
    """Records sends; fails the next ``failures`` of them; waits on ``gate`` when set."""

    failures: int = 0
    gate: asyncio.Event | None = None
    calls: list[Call] = field(default_factory=list)
    closed: int = 0

    async def send(
        self,
        route: QueueRoute,
        queue_id: int,
        trace_topic: str,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        call = Call(route.broker, queue_id, trace_topic, value, headers)
        self.calls.append(call)
        if self.gate is not None:
            await self.gate.wait()
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("broker unreachable")
        call.ok = True

    async def close(self) -> None:
        self.closed += 1

    @property
    def delivered(self) -> list[Call]:
        return [c for c in self.calls if c.ok]

    def contexts(self) -> list[TraceContext]:
        return [ctx for c in self.delivered for ctx in decode(c.value.decode())]


def pub(
    topic: str = "T", keys: str | None = "k1 k2", region: str = "DefaultRegion", **kw: object
) -> TraceContext:
    bean = TraceBean(
        topic=topic,
        msg_id=new_msg_id(),
        tags="A",
        keys=keys,
        store_host="127.0.0.1:10911",
        body_length=10,
        msg_type=MessageType.Normal_Msg,
        offset_msg_id="0A00000100002A9F000300000000002A",
    )
    for name, value in kw.items():
        setattr(bean, name, value)
    return TraceContext(
        trace_type=TraceType.Pub,
        timestamp=TS,
        region_id=region,
        group_name="PG",
        cost_time=3,
        success=True,
        trace_beans=[bean],
    )


def msg_id(ctx: TraceContext) -> str:
    value = ctx.trace_beans[0].msg_id
    assert value is not None
    return value


async def until(probe: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Poll a condition with a deadline (never a fixed sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.005)


Factory = Callable[..., AsyncTraceDispatcher]


@pytest.fixture
async def make() -> AsyncIterator[Factory]:
    """Build dispatchers with fast timings; every one is shut down after the test."""
    made: list[AsyncTraceDispatcher] = []

    def factory(**kw: object) -> AsyncTraceDispatcher:
        kw.setdefault("group", "PG")
        kw.setdefault("route_cache", FakeRoutes(queue_route("trace-a"), queue_route("trace-b")))
        kw.setdefault("sender", FakeSender())
        kw.setdefault("flush_interval_ms", 20)
        d = AsyncTraceDispatcher(**kw)  # type: ignore[arg-type]
        d.retry_backoff_s = 0.01
        d.retry_backoff_max_s = 0.04
        made.append(d)
        return d

    yield factory
    for d in made:
        await d.shutdown(1.0)
    leftover = [t for t in asyncio.all_tasks() if t.get_name().startswith("tracemq-trace")]
    assert not leftover, leftover


def sender_of(d: AsyncTraceDispatcher) -> FakeSender:
    sender = d._sender
    assert isinstance(sender, FakeSender)
    return sender


# ------------------------------------------------------------------------------ batching


async def test_batches_many_contexts_into_few_messages_each_context_once(make: Factory) -> None:
    d = make(batch_size=100)
    await d.start()
    contexts = [pub(topic="T") for _ in range(250)]
    assert all(d.append(c) for c in contexts)

    assert await d.flush(5.0)

    sender = sender_of(d)
    # Appended before the worker ran: batches of 100, 100 and 50, one group each.
    assert len(sender.delivered) == 3
    got = Counter(msg_id(c) for c in sender.contexts())
    assert got == Counter(msg_id(c) for c in contexts)
    assert all(c.trace_topic == TRACE_TOPIC for c in sender.calls)
    s = d.stats()
    assert s["appended"] == 250
    assert s["sent"] == 250
    assert s["sent_messages"] == 3
    assert s["failed"] == s["discarded"] == s["queue_depth"] == s["in_flight"] == 0
    assert s["send_latency_ms_mean"] >= 0


async def test_groups_by_topic_and_region(make: Factory) -> None:
    d = make()
    await d.start()
    contexts = [
        pub(topic=t, region=r) for t in ("T1", "T2") for r in ("R1", "R2") for _ in range(3)
    ]
    for c in contexts:
        d.append(c)
    assert await d.flush()

    sender = sender_of(d)
    assert len(sender.delivered) == 4
    for call in sender.delivered:
        decoded = decode(call.value.decode())
        assert len(decoded) == 3
        assert len({(c.trace_beans[0].topic, c.region_id) for c in decoded}) == 1
    assert Counter(msg_id(c) for c in sender.contexts()) == Counter(msg_id(c) for c in contexts)


async def test_headers_keys_are_msg_ids_and_business_keys(make: Factory) -> None:
    d = make()
    await d.start()
    a = pub(keys="k1 k2")
    b = pub(keys="k2 k3")
    d.append(a)
    d.append(b)
    assert await d.flush()

    (call,) = sender_of(d).delivered
    expected = {msg_id(a), msg_id(b), "k1", "k2", "k3"}
    # (each key once, in no particular order: RocketMQ joins a HashSet)
    assert sorted(call.header["KEYS"].decode().split(" ")) == sorted(expected)
    assert re.fullmatch(rb"[0-9A-F]{32}", call.header["UNIQ_KEY"])
    assert [name for name, _ in call.headers] == [
        "KEYS",
        "UNIQ_KEY",
        "IDEMPOTENCY_KEY",
        "BORN_HOST",
    ]
    assert call.header["IDEMPOTENCY_KEY"] == call.header["UNIQ_KEY"]


async def test_no_keys_header_when_there_are_no_keys(make: Factory) -> None:
    d = make()
    await d.start()
    d.append(pub(keys=None, msg_id=None))
    assert await d.flush()

    (call,) = sender_of(d).delivered
    assert [name for name, _ in call.headers] == ["UNIQ_KEY", "IDEMPOTENCY_KEY", "BORN_HOST"]


async def test_every_message_is_at_most_max_message_size(make: Factory) -> None:
    limit = 1000
    d = make(max_message_size=limit, batch_size=500)
    await d.start()
    # Non-ASCII so characters and bytes differ: the limit is in UTF-8 bytes.
    contexts = [pub(tags="é" * 50 + str(i)) for i in range(60)]
    for c in contexts:
        d.append(c)
    assert await d.flush()

    sender = sender_of(d)
    assert len(sender.delivered) > 1
    assert all(len(c.value) <= limit for c in sender.delivered)
    assert Counter(msg_id(c) for c in sender.contexts()) == Counter(msg_id(c) for c in contexts)
    assert d.stats()["oversize"] == 0


async def test_a_context_bigger_than_the_limit_goes_alone(make: Factory) -> None:
    limit = 1000
    d = make(max_message_size=limit)
    await d.start()
    small_before, big, small_after = pub(), pub(keys="x" * 2000), pub()
    for c in (small_before, big, small_after):
        d.append(c)
    assert await d.flush()

    sender = sender_of(d)
    bodies = [decode(c.value.decode()) for c in sender.delivered]
    assert [len(b) for b in bodies] == [1, 1, 1]
    assert [msg_id(b[0]) for b in bodies] == [
        msg_id(small_before),
        msg_id(big),
        msg_id(small_after),
    ]
    assert len(sender.delivered[1].value) > limit
    assert d.stats()["oversize"] == 1
    assert d.stats()["sent"] == 3


async def test_unencodable_context_is_counted_failed_and_the_rest_is_sent(make: Factory) -> None:
    d = make()
    await d.start()
    good = pub()
    bad = pub(msg_type=None)  # a Pub record needs msg_type
    d.append(good)
    d.append(bad)
    assert await d.flush()

    assert [msg_id(c) for c in sender_of(d).contexts()] == [msg_id(good)]
    assert d.stats()["failed"] == 1
    assert d.stats()["sent"] == 1


# ------------------------------------------------------------------------------ queue limits


async def test_append_discards_when_the_queue_is_full(make: Factory) -> None:
    d = make(queue_size=5)
    # Not started yet: nothing drains the queue.
    results = [d.append(pub()) for _ in range(8)]
    assert results == [True] * 5 + [False] * 3
    s = d.stats()
    assert s["discarded"] == 3
    assert s["appended"] == 5
    assert s["queue_depth"] == 5

    await d.start()
    assert await d.flush()
    assert d.stats()["sent"] == 5
    assert d.stats()["queue_depth"] == 0


async def test_append_records_enqueues_a_batch_at_once_and_counts_what_does_not_fit(
    make: Factory,
) -> None:
    d = make(queue_size=5)
    records = [sub_before(f"M{i}") for i in range(4)]
    assert d.append_records(records[:3]) == 3
    assert d.append_records(records) == 2  # room for two more: the other two are discarded
    s = d.stats()
    assert (s["appended"], s["discarded"], s["queue_depth"]) == (5, 2, 5)

    await d.start()
    assert await d.flush()
    assert d.stats()["sent"] == 5
    body = b"".join(c.value for c in sender_of(d).calls).decode()
    assert body.count("SubBefore") == 5
    await d.shutdown(1.0)
    assert d.append_records(records) == 0  # after shutdown: every one counted as discarded
    assert d.stats()["discarded"] == 6


async def test_append_never_raises_even_for_garbage(make: Factory) -> None:
    d = make(queue_size=1)
    await d.start()
    assert d.append(None) is True  # type: ignore[arg-type]
    assert await d.flush()
    assert d.stats()["failed"] == 1


# ------------------------------------------------------------------------------ retries


async def test_a_retry_goes_to_the_same_queue_with_the_same_idempotency_key(make: Factory) -> None:
    sender = FakeSender(failures=2)
    d = make(sender=sender, max_send_attempts=3)
    await d.start()
    ctx = pub()
    d.append(ctx)
    assert await d.flush()

    assert [c.ok for c in sender.calls] == [False, False, True]
    # Every copy reaches the one collector that owns the queue, which drops the repeats.
    assert len({(c.broker, c.queue_id) for c in sender.calls}) == 1
    assert len({c.header["IDEMPOTENCY_KEY"] for c in sender.calls}) == 1
    assert len({c.header["UNIQ_KEY"] for c in sender.calls}) == 1
    assert [msg_id(c) for c in sender.contexts()] == [msg_id(ctx)]
    s = d.stats()
    assert (s["sent"], s["sent_messages"], s["failed"]) == (1, 1, 0)
    assert (s["retries"], s["sent_after_retry"]) == (2, 1)


async def test_a_retry_whose_queue_left_the_route_goes_to_another() -> None:
    gate = asyncio.Event()
    routes = FakeRoutes(queue_route("a", write_queues=1), queue_route("b", write_queues=1))
    sender = FakeSender(failures=1, gate=gate)
    d = AsyncTraceDispatcher(group="PG", route_cache=routes, sender=sender, flush_interval_ms=10)
    d.retry_backoff_s = 0.01
    await d.start()
    d.append(pub())
    await until(lambda: len(sender.calls) == 1, "first attempt started")
    first = sender.calls[0].broker
    routes.queues = tuple(q for q in routes.queues if q.broker != first)
    sender.gate = None
    gate.set()
    assert await d.flush()
    await d.shutdown()
    assert [c.broker for c in sender.calls][1] != first
    assert d.stats()["sent"] == 1


async def test_retry_exhaustion_counts_every_context_as_failed(make: Factory) -> None:
    sender = FakeSender(failures=10**6)
    d = make(sender=sender, max_send_attempts=3)
    await d.start()
    for _ in range(4):
        d.append(pub())
    assert await d.flush()

    assert len(sender.calls) == 3
    s = d.stats()
    assert s["failed"] == 4
    assert s["sent"] == 0
    assert s["sent_messages"] == 0
    assert s["retries"] == 2


@dataclass
class SlowSender(FakeSender):
    """A hung cluster: every attempt is answered only once ``gate`` opens (then all are)."""

    async def send(
        self,
        route: QueueRoute,
        queue_id: int,
        trace_topic: str,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        call = Call(route.broker, queue_id, trace_topic, value, headers)
        self.calls.append(call)
        assert self.gate is not None
        await self.gate.wait()
        call.ok = True


async def test_a_timed_out_send_answered_later_counts_as_sent_after_retry(make: Factory) -> None:
    # The finding: timed-out attempts were counted as failed although the cluster, once it
    # resumed, stored every one of them.
    gate = asyncio.Event()
    sender = SlowSender(gate=gate)
    d = make(sender=sender, send_timeout_ms=20, max_send_attempts=3, delivery_timeout_ms=30_000)
    await d.start()
    d.append(pub())
    await until(lambda: len(sender.calls) == 3, "three attempts started")
    assert d.stats()["failed"] == 0  # timed out is not failed
    gate.set()
    assert await d.flush()
    s = d.stats()
    assert (s["sent"], s["failed"], s["retries"], s["sent_after_retry"]) == (1, 0, 2, 1)
    assert s["appended"] == s["sent"] + s["failed"] + s["discarded"]
    assert len({c.header["IDEMPOTENCY_KEY"] for c in sender.calls}) == 1


async def test_no_acknowledgement_within_the_delivery_timeout_is_failed(make: Factory) -> None:
    sender = FakeSender(gate=asyncio.Event())  # never opened: every send hangs
    d = make(sender=sender, send_timeout_ms=30, max_send_attempts=2, delivery_timeout_ms=200)
    await d.start()
    d.append(pub())
    assert await d.flush(5.0)
    assert len(sender.calls) == 2
    s = d.stats()
    assert (s["failed"], s["sent"], s["retries"]) == (1, 0, 1)


async def test_retry_and_sent_after_retry_metrics(make: Factory) -> None:
    group = f"PG-retry-{time.monotonic_ns()}"
    d = make(group=group, sender=FakeSender(failures=1), max_send_attempts=3)
    await d.start()
    d.append(pub())
    d.append(pub())
    assert await d.flush()
    retries = REGISTRY.get_sample_value(
        "tracemq_trace_send_retries_total", {"group": group, "reason": "error"}
    )
    after = REGISTRY.get_sample_value("tracemq_trace_sent_after_retry_total", {"group": group})
    failed = REGISTRY.get_sample_value("tracemq_trace_failed_total", {"group": group})
    assert (retries, after, failed) == (1.0, 2.0, 0.0)


async def test_no_retry_when_the_queue_is_nearly_full(make: Factory) -> None:
    gate = asyncio.Event()
    sender = FakeSender(failures=1, gate=gate)
    d = make(sender=sender, queue_size=4, batch_size=1, max_in_flight=1, max_send_attempts=5)
    await d.start()
    first = pub()
    d.append(first)
    await until(lambda: len(sender.calls) == 1, "first send started")
    # The worker takes one more context and waits for a send slot; fill the queue behind it.
    d.append(pub())
    await until(lambda: d.stats()["queue_depth"] == 0, "worker holds the second context")
    while d.append(pub()):
        pass
    assert d.stats()["queue_depth"] == 4
    gate.set()
    assert await d.flush()

    s = d.stats()
    assert s["failed"] == 1  # the first message was dropped without a retry
    assert msg_id(first) not in {msg_id(c) for c in sender.contexts()}
    assert len(sender.calls) == s["sent_messages"] + 1
    assert s["appended"] == s["sent"] + s["failed"]


async def test_max_in_flight_bounds_concurrent_sends(make: Factory) -> None:
    gate = asyncio.Event()
    sender = FakeSender(gate=gate)
    d = make(sender=sender, batch_size=1, max_in_flight=3)
    await d.start()
    for _ in range(10):
        d.append(pub())
    await until(lambda: len(sender.calls) == 3, "three sends in flight")
    # Not a synchronisation: give the worker a chance to (wrongly) start a fourth send.
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(sender.calls) == 3
    assert d.stats()["in_flight"] == 3
    gate.set()
    assert await d.flush()
    assert d.stats()["sent"] == 10


# ------------------------------------------------------------------------------ routing


async def test_round_robin_over_writable_queues_of_all_brokers(make: Factory) -> None:
    routes = FakeRoutes(
        queue_route("trace-a", write_queues=2),
        queue_route("trace-b", write_queues=3),
        queue_route("trace-ro", write_queues=4, perm=PERM_READ),
    )
    d = make(route_cache=routes, batch_size=1)
    await d.start()
    for _ in range(10):
        d.append(pub())
    assert await d.flush()

    sender = sender_of(d)
    used = Counter((c.broker, c.queue_id) for c in sender.calls)
    assert used == {(b, q): 2 for b, n in (("trace-a", 2), ("trace-b", 3)) for q in range(n)}
    # Consecutive messages alternate brokers while both have queues left.
    assert sender.calls[0].broker != sender.calls[1].broker


async def test_customized_trace_topic_without_route_fails_start(make: Factory) -> None:
    d = make(route_cache=FakeRoutes(), trace_topic="MY_TRACE", customized=True)
    with pytest.raises(TraceTopicError, match="trace topic 'MY_TRACE' has no route") as info:
        await d.start()
    assert isinstance(info.value, TracemqError)
    assert "create it on a trace broker before starting the client" in str(info.value)


async def test_default_trace_topic_without_route_counts_failed(make: Factory) -> None:
    sender = FakeSender()
    d = make(route_cache=FakeRoutes(), sender=sender)
    await d.start()  # only a warning
    for _ in range(3):
        assert d.append(pub())
    assert await d.flush()

    assert sender.calls == []
    s = d.stats()
    assert (s["failed"], s["sent"]) == (3, 0)


async def test_route_appearing_later_is_used(make: Factory) -> None:
    routes = FakeRoutes()
    d = make(route_cache=routes)
    await d.start()
    d.append(pub())
    assert await d.flush()
    routes.queues = (queue_route("trace-a"),)
    d.append(pub())
    assert await d.flush()
    s = d.stats()
    assert (s["failed"], s["sent"]) == (1, 1)


# ------------------------------------------------------------------------------ shutdown


async def test_shutdown_flushes_everything_appended_before_it(make: Factory) -> None:
    # A long flush interval and a big batch: only shutdown's flush gets these out in time.
    d = make(flush_interval_ms=60_000, batch_size=1000)
    await d.start()
    contexts = [pub() for _ in range(50)]
    for c in contexts:
        d.append(c)

    started = time.monotonic()
    await d.shutdown(5.0)
    assert time.monotonic() - started < 5.0

    sender = sender_of(d)
    assert Counter(msg_id(c) for c in sender.contexts()) == Counter(msg_id(c) for c in contexts)
    assert d.stats()["sent"] == 50
    assert sender.closed == 1


async def test_append_after_shutdown_is_discarded_and_shutdown_is_idempotent(make: Factory) -> None:
    d = make()
    await d.start()
    await d.shutdown()
    await d.shutdown()
    assert d.append(pub()) is False
    assert d.append(pub()) is False
    s = d.stats()
    assert s["discarded"] == 2
    assert s["appended"] == 0
    assert sender_of(d).closed == 1


async def test_shutdown_deadline_counts_unsent_contexts_as_failed(make: Factory) -> None:
    gate = asyncio.Event()  # never opened: the broker hangs
    sender = FakeSender(gate=gate)
    d = make(sender=sender, batch_size=1, max_in_flight=2, send_timeout_ms=60_000)
    await d.start()
    for _ in range(10):
        d.append(pub())
    await until(lambda: len(sender.calls) == 2, "two sends in flight")

    started = time.monotonic()
    await d.shutdown(0.2)
    assert time.monotonic() - started < 2.0

    s = d.stats()
    assert s["sent"] == 0
    assert s["failed"] == 10
    assert s["queue_depth"] == 0
    assert s["in_flight"] == 0


async def test_flush_times_out_while_the_broker_hangs(make: Factory) -> None:
    gate = asyncio.Event()
    d = make(sender=FakeSender(gate=gate), send_timeout_ms=60_000)
    await d.start()
    d.append(pub())
    assert await d.flush(0.05) is False
    gate.set()
    assert await d.flush(5.0) is True
    assert d.stats()["sent"] == 1


async def test_shutdown_without_start_counts_queued_as_failed(make: Factory) -> None:
    d = make()
    d.append(pub())
    await d.shutdown()
    assert d.stats()["failed"] == 1


# ------------------------------------------------------------------------------ counters


def sample(name: str, group: str) -> float:
    return REGISTRY.get_sample_value(name, {"group": group}) or 0.0


async def test_two_dispatchers_count_independently(make: Factory) -> None:
    g1, g2 = f"G1-{new_msg_id()}", f"G2-{new_msg_id()}"
    d1 = make(group=g1, sender=FakeSender(failures=10**6), max_send_attempts=1)
    d2 = make(group=g2)
    await d1.start()
    await d2.start()
    for _ in range(3):
        d1.append(pub())
    for _ in range(5):
        d2.append(pub())
    assert await d1.flush()
    assert await d2.flush()

    s1, s2 = d1.stats(), d2.stats()
    assert (s1["appended"], s1["sent"], s1["failed"]) == (3, 0, 3)
    assert (s2["appended"], s2["sent"], s2["failed"]) == (5, 5, 0)
    assert sample("tracemq_trace_appended_total", g1) == 3
    assert sample("tracemq_trace_appended_total", g2) == 5
    assert sample("tracemq_trace_failed_total", g1) == 3
    assert sample("tracemq_trace_sent_total", g2) == 5
    assert sample("tracemq_trace_queue_depth", g1) == 0


async def test_prometheus_discards_and_send_latency(make: Factory) -> None:
    group = f"G-{new_msg_id()}"
    before = REGISTRY.get_sample_value("tracemq_trace_send_seconds_count") or 0.0
    d = make(group=group, queue_size=2)
    for _ in range(3):
        d.append(pub())
    assert sample("tracemq_trace_discarded_total", group) == 1
    assert sample("tracemq_trace_queue_depth", group) == 2
    await d.start()
    assert await d.flush()
    after = REGISTRY.get_sample_value("tracemq_trace_send_seconds_count") or 0.0
    assert after - before == 1
    assert sample("tracemq_trace_queue_depth", group) == 0
    assert d.stats()["send_latency_ms_last"] >= 0


# ------------------------------------------------------------------------------ Kafka sender


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, object]]] = []

    async def send_and_wait(self, topic: str, value: bytes, **kw: object) -> None:
        self.sent.append((topic, value, kw))


class FakePool:
    def __init__(self) -> None:
        self.producer = FakeProducer()
        self.asked: list[str] = []
        self.enqueued: list[tuple[str, str, int, bytes, list[tuple[str, bytes]]]] = []
        self.closed = False

    async def get(self, bootstrap: str) -> FakeProducer:
        self.asked.append(bootstrap)
        return self.producer

    async def send_alone(
        self,
        bootstrap: str,
        tp: Any,
        value: bytes,
        headers: list[tuple[str, bytes]],
        *,
        compression: Any,
    ) -> None:
        self.enqueued.append((bootstrap, tp.topic, tp.partition, value, headers))
        self.compression = compression

    async def close(self) -> None:
        self.closed = True


async def test_kafka_sender_writes_the_partition_of_the_broker_topic() -> None:
    """A trace message goes to its queue's partition of the broker's Kafka topic, through the
    pool's send_alone (a produce request of its own); one larger than any tracemq record
    through send_and_wait (which refuses it with aiokafka's own error)."""
    pool = FakePool()
    sender = KafkaTraceSender(pool)  # type: ignore[arg-type]
    headers = [("UNIQ_KEY", b"X")]
    await sender.send(queue_route("trace-a"), 2, TRACE_TOPIC, b"data", headers)
    assert pool.enqueued == [("trace-a:9092", "trace-a.RMQ_SYS_TRACE_TOPIC", 2, b"data", headers)]
    assert pool.producer.sent == []
    huge = b"x" * (MAX_MESSAGE_SIZE + 1)
    await sender.send(queue_route("trace-a"), 1, TRACE_TOPIC, huge, headers)
    assert pool.asked == ["trace-a:9092"]
    assert pool.producer.sent == [
        ("trace-a.RMQ_SYS_TRACE_TOPIC", huge, {"partition": 1, "headers": headers})
    ]
    assert len(pool.enqueued) == 1
    await sender.close()
    assert pool.closed is False  # not its pool


async def test_kafka_sender_closes_its_own_pool() -> None:
    sender = KafkaTraceSender()
    await sender.close()


@pytest.mark.parametrize("name", ["zstd", "lz4", "gzip", "none"])
async def test_kafka_sender_compresses_as_asked(name: str) -> None:
    """Trace messages go zstd-compressed unless another codec (or none) is asked for; the
    dispatcher hands its ``compression`` to its default sender."""
    from tracemq._record_batch import codec

    pool = FakePool()
    sender = KafkaTraceSender(pool, compression=name)  # type: ignore[arg-type]
    await sender.send(queue_route("trace-a"), 0, TRACE_TOPIC, b"data", [])
    assert pool.compression == codec(name)
    default = KafkaTraceSender(pool)  # type: ignore[arg-type]
    await default.send(queue_route("trace-a"), 0, TRACE_TOPIC, b"data", [])
    assert pool.compression == codec("zstd")
    d = AsyncTraceDispatcher(group="G", route_cache=None, compression=name)  # type: ignore[arg-type]
    assert d._sender._compression == codec(name)  # type: ignore[attr-defined]
    await d._sender.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("sender", [None, "own"])
def test_an_unknown_compression_is_refused(sender: str | None) -> None:
    own = KafkaTraceSender(FakePool()) if sender else None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown compression 'brotli'"):
        AsyncTraceDispatcher(group="G", route_cache=None, sender=own, compression="brotli")  # type: ignore[arg-type]


async def test_hook_records_and_contexts_share_a_message_and_its_keys(make: Factory) -> None:
    """append_record (the raw records of the trace hooks) and append (contexts) in one batch:
    one trace message per topic, records in order, KEYS = msgIds + business keys without
    null/empty."""
    d = make(queue_size=3)
    a = pub(topic="T", keys="k1")
    d.append(a)
    b = sub_before("MSGB", keys="k2 null  k3")
    c = sub_after("MSGB", keys=None)
    assert d.append_record(b)
    assert d.append_record(c)
    assert not d.append_record(sub_before("MSGC"))  # full: discarded
    await d.start()
    assert await d.flush()
    (call,) = sender_of(d).delivered
    expected = encode(a).data + encode(raw_context(b)).data + encode(raw_context(c)).data
    assert call.value == expected.encode()
    assert sorted(call.header["KEYS"].split(b" ")) == sorted(
        k.encode() for k in {msg_id(a), "k1", "MSGB", "k2", "k3"}
    )
    s = d.stats()
    assert (s["appended"], s["sent"], s["discarded"]) == (3, 3, 1)


# ------------------------------------------------------------------------------ raw records


def sub_before(mid: str, keys: str | None = None, topic: str = "T", **kw: object) -> RawRecord:
    f = {"ts": TS, "group": "CG", "rid": f"R-{mid}", "retry": 0, "region": "DefaultRegion"}
    f.update(kw)
    return (SUB_BEFORE, topic, f["region"], mid, keys, f["ts"], f["group"], f["rid"], f["retry"])


def sub_after(mid: str, keys: str | None = None, topic: str = "T", **kw: object) -> RawRecord:
    f = {"ts": TS + 5, "group": "CG", "rid": f"R-{mid}", "cost": 5, "ok": True, "code": 0}
    f.update(kw)
    return (SUB_AFTER, topic, "DefaultRegion", mid, keys, f["ts"], f["group"], f["rid"],
            f["cost"], f["ok"], f["code"])  # fmt: skip


async def test_a_sub_after_joins_its_waiting_sub_before_into_one_item(make: Factory) -> None:
    """join_sub_after: while its SubBefore waits (queue or gathering batch) the SubAfter rides
    in the same item; both records are sent, counted as two; too late, for another message or
    after shutdown began it refuses (the hook then appends the SubAfter alone)."""
    d = make(flush_interval_ms=60_000, batch_size=10)
    seq = d.append_sub_before(sub_before("M1", keys="k1"))
    assert seq == 0
    assert not d.join_sub_after(seq, "OTHER", TS + 5, 5, True, 0)  # not its SubBefore
    assert d.join_sub_after(seq, "M1", TS + 5, 5, True, 0)
    assert not d.join_sub_after(seq, "M1", TS + 5, 5, True, 0)  # joined already
    assert len(d._queue) == 1 and d.stats()["appended"] == 2
    await d.start()
    # the worker takes it into its batch and waits for more: still joinable there
    seq2 = d.append_sub_before(sub_before("M2"))
    await until(lambda: not d._queue, "the worker gathering both")
    assert d.join_sub_after(seq2, "M2", TS + 7, 7, False, 4)
    assert await d.flush()
    (call,) = sender_of(d).delivered
    want = [
        raw_context(sub_before("M1", keys="k1")),
        raw_context(sub_after("M1", keys="k1")),
        raw_context(sub_before("M2")),
        raw_context(sub_after("M2", ts=TS + 7, cost=7, ok=False, code=4)),
    ]
    assert call.value == "".join(encode(c).data for c in want).encode()
    assert sorted(call.header["KEYS"].split(b" ")) == [b"M1", b"M2", b"k1"]
    assert not d.join_sub_after(seq2, "M2", TS + 9, 9, True, 0)  # written and sent
    s = d.stats()
    assert (s["appended"], s["sent"], s["failed"], s["discarded"]) == (4, 4, 0, 0)
    seq3 = d.append_sub_before(sub_before("M3"))
    await d.shutdown(1.0)
    assert not d.join_sub_after(seq3, "M3", TS + 5, 5, True, 0)
    assert d.append_sub_before(sub_before("M4")) == -1  # after shutdown: discarded
    s = d.stats()
    assert (s["appended"], s["sent"], s["discarded"]) == (5, 5, 1)


async def test_a_pair_left_in_the_queue_at_shutdown_counts_two_failed(make: Factory) -> None:
    d = make()  # never started: nothing is sent
    seq = d.append_sub_before(sub_before("M1"))
    assert d.join_sub_after(seq, "M1", TS + 5, 5, True, 0)
    assert d.append_record(sub_before("M2"))
    await d.shutdown(0.1)
    s = d.stats()
    assert (s["appended"], s["sent"], s["failed"]) == (3, 0, 3)


async def test_a_raw_record_with_a_separator_is_counted_failed_and_costs_only_itself(
    make: Factory,
) -> None:
    """A text field holding U+0001 or U+0002 is caught once per message body (its separator
    count); the batch is then written the careful way: that record is counted as failed, the
    others of the batch are sent as usual."""
    d = make()
    good = [sub_before(f"M{i}") for i in range(3)]
    bad_pair = d.append_sub_before(sub_before("BAD", keys="a\x01b"))
    assert d.join_sub_after(bad_pair, "BAD", TS + 5, 5, True, 0)
    bad_int = sub_before("BIG", retry=2**31)  # outside Java's int: refused by the fast writer
    for r in (*good, bad_int):
        assert d.append_record(r)
    await d.start()
    assert await d.flush()
    assert [msg_id(c) for c in sender_of(d).contexts()] == ["M0", "M1", "M2"]
    s = d.stats()
    assert (s["appended"], s["sent"], s["failed"]) == (6, 3, 3)


async def test_non_ascii_text_is_measured_in_bytes(make: Factory) -> None:
    """Message size counts UTF-8 bytes: records whose characters fit but whose bytes do not
    go into more messages, each within the limit."""
    d = make(max_message_size=400)
    # 93 characters, 133 bytes each: 4 fit a message by characters, 3 by bytes
    records = [sub_before(f"M{i}", keys="ключ" * 10) for i in range(6)]
    for r in records:
        assert d.append_record(r)
    await d.start()
    assert await d.flush()
    calls = sender_of(d).delivered
    assert all(len(c.value) <= 400 for c in calls)
    assert [msg_id(c) for c in sender_of(d).contexts()] == [f"M{i}" for i in range(6)]
    assert [len(decode(c.value)) for c in calls] == [3, 3]


_text = st.none() | st.text(max_size=6) | st.sampled_from(["a\x01b", "\x02", "ü", "null", ""])
_int = st.integers(-(2**64), 2**64) | st.sampled_from([0, 1, 5, 4095, 4096, 2**31, -1])


@st.composite
def raw_batches(draw: st.DrawFn) -> list[object]:
    """Raw records of every kind (pairs too) and contexts, with fields the format may refuse."""
    out: list[object] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from([SUB_BEFORE, SUB_AFTER, SUB_PAIR, PUB, "ctx"]))
        topic = draw(st.sampled_from(["T", "U"]))
        region = draw(st.sampled_from(["DefaultRegion", "R2"]))
        head = (topic, region, draw(_text), draw(_text), draw(_int), draw(_text), draw(_text))
        if kind == SUB_BEFORE:
            out.append((SUB_BEFORE, *head, draw(_int)))
        elif kind == SUB_AFTER:
            out.append((SUB_AFTER, *head, draw(_int), draw(st.booleans()), draw(_int)))
        elif kind == SUB_PAIR:
            out.append(
                (SUB_PAIR, *head, draw(_int), draw(_int), draw(_int), draw(st.booleans()),
                 draw(_int))
            )  # fmt: skip
        elif kind == PUB:
            out.append(
                (PUB, *head[:5], draw(_text), draw(_text), draw(_text), draw(_int), draw(_int),
                 draw(st.sampled_from([0, 1, 4, 5, None, MessageType.Delay_Msg])), draw(_text),
                 draw(st.booleans()))
            )  # fmt: skip
        else:
            out.append(pub(topic=topic, region=region, keys=draw(_text)))
    return out


def test_one_record_longer_in_bytes_than_the_limit_counts_as_oversize_both_ways() -> None:
    """A record of fewer characters than the limit but more UTF-8 bytes is sent alone and
    counted as oversize by the fast way too (it was not; found by the property test below)."""
    text = "é" * 26  # in both records of the pair: 118 characters, 170 bytes
    pair = (SUB_PAIR, "T", "DefaultRegion", "g", "r1", 0, "m1", text, 1, 2, 3, True, 0)
    d = AsyncTraceDispatcher(
        group="PG", route_cache=FakeRoutes(), sender=FakeSender(), max_message_size=120
    )
    texts = write_records([pair])
    assert texts[0] is not None and len(texts[0]) <= 120 < len(texts[0].encode())
    careful = d._plan_checked([pair], texts, 0)  # type: ignore[arg-type]
    fast = d._plan([pair], texts, 0)  # type: ignore[arg-type]
    assert careful[2] == 1
    assert fast is not None and _keyed(fast) == _keyed(careful)


@settings(max_examples=300, deadline=None)
@given(raw_batches(), st.sampled_from([120, 300, 128_000]))
def test_the_fast_batch_writer_equals_the_careful_one(batch: list[object], limit: int) -> None:
    """Whatever the batch, the fast way (one C-level pass per message, separators counted per
    body) either steps aside or writes exactly the messages of the careful way (each record
    through the checked encoder); and the careful way sends every record the checked encoder
    takes, each in one message, in order within its (topic, region)."""
    d = AsyncTraceDispatcher(
        group="PG", route_cache=FakeRoutes(), sender=FakeSender(), max_message_size=limit
    )
    texts = write_records(batch)
    careful = d._plan_checked(batch, texts, 0)  # type: ignore[arg-type]
    fast = d._plan(batch, texts, 0)  # type: ignore[arg-type]
    if fast is not None:  # (the KEYS header leaves None, "" and "null" out: _job drops them)
        assert _keyed(fast) == _keyed(careful)
    plans, bad, _ = careful
    expected: list[str] = []
    failed = 0
    for item in batch:
        for ctx in _contexts(item):
            try:
                expected.append(encode(ctx).data)
            except Exception:
                failed += 1
    assert bad == failed
    assert sum(records for _, records, _, _ in plans) == len(expected)
    sent = sorted(text for _, _, value, _ in plans for text in _records(value.decode()))
    assert sent == sorted(expected)


def _contexts(item: object) -> list[TraceContext]:
    if isinstance(item, TraceContext):
        return [item]
    assert isinstance(item, tuple)
    try:
        return [raw_context(r) for r in (split_pair(item) if item[0] == SUB_PAIR else [item])]
    except ValueError:  # pragma: no cover - the strategy builds well-formed tuples
        return []


def _keyed(planned: tuple[list[tuple[int, int, bytes, set[object]]], int, int]) -> object:
    plans, bad, oversize = planned
    return [(a, b, c, keys - {None, "", "null"}) for a, b, c, keys in plans], bad, oversize


def _records(body: str) -> list[str]:
    return [r + "\x02" for r in body.split("\x02")[:-1]]


class FlakyRoutes(FakeRoutes):
    """A route cache whose next ``failures`` reads raise (Redis away for a moment)."""

    def __init__(self, *queues: QueueRoute, failures: int = 0) -> None:
        super().__init__(*queues)
        self.failures = failures
        self.started = False

    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        if self.started and self.failures > 0:
            self.failures -= 1
            raise ConnectionError("redis unreachable")
        return await super().get(topic, refresh)


async def test_a_route_read_failure_is_a_retried_attempt(make: Factory) -> None:
    routes = FlakyRoutes(queue_route("trace-a"), failures=1)
    d = make(route_cache=routes, max_send_attempts=3)
    await d.start()
    routes.started = True
    d.append(pub())
    assert await d.flush()
    s = d.stats()
    assert (s["sent"], s["failed"], s["retries"]) == (1, 0, 1)


def raw_pub(i: int) -> RawRecord:
    return (PUB, "T", "DefaultRegion", new_msg_id(), f"k{i:03d}", TS + i, "PG", "A",
            "127.0.0.1:10911", 10, 3, 0, "0A00000100002A9F000300000000002A", True)  # fmt: skip


@pytest.mark.parametrize("raw", [True, False])
async def test_a_full_batch_keeps_its_short_last_message_for_the_next_batch(
    make: Factory, raw: bool
) -> None:
    """A steady stream whose batches are a little more than one message: the short tail of
    each full batch opens the next one instead of going as a message of its own (before: a
    full and a small message per batch, 8 messages here instead of 5)."""
    items: list[Any] = [raw_pub(i) if raw else pub(keys=f"k{i:03d}") for i in range(44)]
    texts = write_records(items[:1]) if raw else [encode(items[0]).data]
    assert texts[0] is not None
    size = len(texts[0])  # (every record here has the same length)
    d = make(batch_size=11, max_message_size=10 * size + size // 2)
    for item in items:  # queued before the worker runs: batches full while it lasts
        assert d.append_record(item) if raw else d.append(item)
    await d.start()
    # (no flush: a flush sends everything at once, as shutdown does)
    await until(lambda: d.stats()["sent"] == 44, "every record sent")

    sender = sender_of(d)
    assert [len(decode(c.value.decode())) for c in sender.delivered] == [10, 10, 10, 10, 4]
    order = [msg_id(ctx) for ctx in sender.contexts()]
    assert order == [item[3] if raw else msg_id(item) for item in items]
    s = d.stats()
    assert (s["sent_messages"], s["failed"], s["discarded"], s["queue_depth"]) == (5, 0, 0, 0)


async def test_a_flush_sends_the_short_last_message_at_once(make: Factory) -> None:
    texts = write_records([raw_pub(0)])
    assert texts[0] is not None
    size = len(texts[0])
    d = make(batch_size=11, max_message_size=10 * size + size // 2)
    for i in range(11):
        d.append_record(raw_pub(i))
    await d.start()
    assert await d.flush(5.0)
    assert [len(decode(c.value.decode())) for c in sender_of(d).delivered] == [10, 1]


def test_a_held_tail_stays_joinable_and_numbered() -> None:
    """The items of a held tail go back to the front of the queue with their numbers: a
    SubAfter still joins its SubBefore there, and a flush still waits for them."""
    d = AsyncTraceDispatcher(
        group="PG", route_cache=FakeRoutes(), sender=FakeSender(), batch_size=3
    )
    size = len(encode(raw_context(sub_before("M0"))).data)
    d._max_message_size = 2 * size + size // 2  # two per message: a batch of three leaves one
    ids = [f"M{i}" for i in range(5)]  # (a join matches the SubBefore's msgId by identity)
    seqs = [d.append_sub_before(sub_before(i)) for i in ids]
    assert seqs == [0, 1, 2, 3, 4]
    # what the worker does: take a full batch, then write it
    d._gathering_seq = d._taken_seq
    d._batch = [d._queue.popleft() for _ in range(3)]
    d._taken_seq += 3
    jobs = d._build_jobs(d._batch, 0)
    assert [job.contexts for job in jobs] == [2]
    assert d._batch == [sub_before("M0"), sub_before("M1")]
    d._batch, d._gathering_seq = [], None
    assert d._taken_seq == 2 and len(d._queue) == 3
    assert d._watermark() == 0  # (the first message is not settled yet)
    assert d.join_sub_after(2, ids[2], TS + 5, 5, True, 0)
    assert d._queue[0][0] == SUB_PAIR and d._queue[0][3] == "M2"
    assert d.stats()["appended"] == 6


@pytest.mark.parametrize("field", [1, 2, 3, 4, 6, 7, 8, 12])
def test_a_separator_in_any_text_field_of_a_pub_batch_sends_the_batch_the_careful_way(
    field: int,
) -> None:
    """A batch of Pubs alone is checked by counting its body's separators (not column by
    column, as pairs are): a U+0001 or U+0002 in any of a Pub's text fields still makes the
    fast way step aside, and the careful way counts that one record as failed."""
    records = [
        (PUB, "T", "DefaultRegion", f"M{i}", f"k{i}", TS, "PG", "A", "b:10911", 10, 1, 0,
         f"O{i}", True)
        for i in range(20)
    ]  # fmt: skip
    d = AsyncTraceDispatcher(group="PG", route_cache=FakeRoutes(), sender=FakeSender())
    texts = write_records(records)
    fast = d._plan(records, texts, 0)  # type: ignore[arg-type]
    assert fast is not None and fast[1] == 0 and len(fast[0]) == 1
    bad = list(records[7])
    bad[field] = f"x{FIELD_SPLITOR if field % 2 else CONTENT_SPLITOR}y"
    records[7] = tuple(bad)
    texts = write_records(records)
    assert d._plan(records, texts, 0) is None  # type: ignore[arg-type]
    plans, failed, _ = d._plan_checked(records, texts, 0)  # type: ignore[arg-type]
    assert failed == 1 and sum(records for _, records, _, _ in plans) == 19
