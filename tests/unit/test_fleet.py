"""The fleet's callback contract (tracemq.kafka.fleet), with a fake Kafka consumer: one consumer
per data cluster of the plan; an assignment positioned through the offset guard (the owner's
starts, the group's commit, else on_fresh); every fetch handed to on_batch; a revocation
finished by the owner and committed by the fleet while the group accepts it, once; a
subscription change handed over first (or not, for the collector); the final commit at stop.
The real consumers over the real stack: tests/integration/test_client_features.py (PushConsumer
rebalance), tests/integration/test_collector.py and tests/faults (the collector)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError
from tracemq.errors import NoRouteError
from tracemq.kafka.fleet import Fleet, FleetCluster, Placement, place
from tracemq.routing.model import QueueRoute, TopicRoute


class FakeKafka:
    """What the fleet and its guard use of AIOKafkaConsumer. Like aiokafka, a commit is
    refused from the moment the subscription changes until the group assigns again."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.bootstrap = kwargs["bootstrap_servers"]
        self.commits: list[dict[TopicPartition, int]] = []
        self.subscribed: list[list[str]] = []
        self.listener: Any = None
        self.accepts = False
        self.group_offsets: dict[TopicPartition, int] = {}
        self.sought: dict[TopicPartition, int] = {}
        self.fetches: asyncio.Queue[dict[TopicPartition, list[Any]]] = asyncio.Queue()
        self.fetch_args: list[dict[str, Any]] = []
        self.stopped = False

    async def start(self) -> None:
        pass

    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        self.subscribed.append(list(topics))
        self.listener = listener
        self.accepts = False

    async def assign(self, tps: list[TopicPartition]) -> None:
        """The group's rebalance gives this member ``tps``."""
        self.accepts = True
        await self.listener.on_partitions_assigned(set(tps))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not self.accepts:
            raise IllegalStateError("No partitions assigned")
        self.commits.append(dict(offsets))

    async def getmany(self, *tps: TopicPartition, **kw: Any) -> dict[TopicPartition, list[Any]]:
        self.fetch_args.append(kw)
        try:
            return await asyncio.wait_for(self.fetches.get(), kw["timeout_ms"] / 1000)
        except TimeoutError:
            return {}

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.group_offsets.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 100)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought[tp] = offset

    def assignment(self) -> set[TopicPartition]:
        return set()

    def paused(self) -> set[TopicPartition]:
        return set()

    async def stop(self) -> None:
        self.stopped = True


class Routes:
    def __init__(self, routes: dict[str, TopicRoute] | None = None) -> None:
        self.routes = routes or {}

    def subscribe_changes(self) -> asyncio.Queue[str]:
        return asyncio.Queue()

    async def get(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        return self.routes.get(topic, TopicRoute(topic))

    def missing(self, topic: str) -> NoRouteError:
        return NoRouteError(f"no route for {topic!r}")


def _q(broker: str, bootstrap: str, perm: int = 6) -> QueueRoute:
    return QueueRoute(broker, "c", 4, 4, perm, bootstrap, f"{broker}:10911")


class Owner:
    """Records every callback; its answers are set by the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.starts: dict[TopicPartition, int] = {}
        self.done: dict[TopicPartition, int] = {}  # what on_revoked / on_close say is safe
        self.batches: asyncio.Queue[dict[TopicPartition, list[Any]]] = asyncio.Queue()
        self.placement = Placement()

    async def plan(self, initial: bool) -> Placement:
        self.calls.append(("plan", initial))
        return self.placement

    async def on_assigned(self, c: FleetCluster, tps: list[TopicPartition]) -> Any:
        self.calls.append(("assigned", c.bootstrap, tps))
        return self.starts

    async def on_revoked(self, c: FleetCluster, tps: list[TopicPartition]) -> Any:
        # the fleet forgets the partitions only after the owner finished them
        self.calls.append(("revoked", c.bootstrap, tps, set(c.assigned) >= set(tps)))
        return {tp: self.done[tp] for tp in tps if tp in self.done}

    async def on_close(self, c: FleetCluster) -> Any:
        self.calls.append(("close", c.bootstrap))
        return dict(self.done)

    async def on_batch(self, c: FleetCluster, data: dict[TopicPartition, list[Any]]) -> None:
        await self.batches.put(data)

    async def on_fresh(self, c: FleetCluster, tps: list[TopicPartition]) -> None:
        self.calls.append(("fresh", c.bootstrap, tps))

    def fleet(self, **kw: Any) -> Fleet:
        args: dict[str, Any] = {
            "name": "t",
            "group_id": "G",
            "routes": Routes(),
            "plan": self.plan,
            "on_batch": self.on_batch,
            "on_assigned": self.on_assigned,
            "on_revoked": self.on_revoked,
            "on_fresh": self.on_fresh,
            "max_records": 7,
            "session_timeout_ms": 6000,
            "fetch_max_wait_ms": 50,
            "consumer_kwargs": {"max_poll_records": 9},
            "fetch_timeout_ms": 20,
            "idle_check_s": 3600,
            "consumer_factory": FakeKafka,
            **kw,
        }
        return Fleet(**args)


def _kafka(f: Fleet, bootstrap: str) -> FakeKafka:
    kafka: FakeKafka = f.clusters[bootstrap].consumer
    return kafka


@pytest.mark.timeout(10)
async def test_the_callback_contract_from_start_to_stop() -> None:
    owner = Owner()
    owner.placement.add("T", _q("b1", "k1:9092"))
    owner.placement.add("T", _q("b2", "k2:9092"))
    owner.placement.add("U", _q("b1", "k1:9092"))
    f = owner.fleet(on_close=owner.on_close)
    await f.start()
    try:
        # one consumer per data cluster, in the group, with the owner's settings
        assert sorted(f.clusters) == ["k1:9092", "k2:9092"]
        k1 = _kafka(f, "k1:9092")
        assert k1.subscribed == [["b1.T", "b1.U"]] and _kafka(f, "k2:9092").subscribed == [["b2.T"]]
        assert k1.kwargs["group_id"] == "G" and k1.kwargs["enable_auto_commit"] is False
        assert k1.kwargs["auto_offset_reset"] == "none"  # the guard resets, counted
        assert k1.kwargs["max_poll_records"] == 9 and k1.kwargs["fetch_max_wait_ms"] == 50
        assert k1.kwargs["heartbeat_interval_ms"] == 1200
        assert owner.calls[0] == ("plan", True)

        # assignment: the owner's start, else the group's commit (left where it is), else fresh
        a, b, c = (TopicPartition("b1.T", i) for i in range(3))
        owner.starts = {a: 5}
        k1.group_offsets = {b: 8}
        c1 = f.clusters["k1:9092"]
        assert not c1.joined.is_set()
        await k1.assign([a, b, c])
        assert ("assigned", "k1:9092", [a, b, c]) in owner.calls
        assert k1.sought == {a: 5}
        assert ("fresh", "k1:9092", [c]) in owner.calls
        assert c1.joined.is_set() and c1.assigned == {a, b, c}

        # every fetch reaches on_batch, the empty ones too, bounded by max_records
        await k1.fetches.put({a: ["r5", "r6"]})
        seen = [await asyncio.wait_for(owner.batches.get(), 2) for _ in range(2)]
        assert {a: ["r5", "r6"]} in seen
        assert {} in seen or await asyncio.wait_for(owner.batches.get(), 2) == {}
        assert k1.fetch_args[0]["max_records"] == 7

        # revocation: the owner finishes, the fleet commits while the group accepts, once
        owner.done = {a: 7, b: 8}
        await k1.listener.on_partitions_revoked({a, b})
        assert ("revoked", "k1:9092", [a, b], True) in owner.calls
        assert k1.commits == [{a: 7, b: 8}] and c1.assigned == {c}
        await k1.listener.on_partitions_revoked({a, b, c})  # a and b were handed over already
        assert [x for x in owner.calls if x[0] == "revoked"][-1] == (
            "revoked",
            "k1:9092",
            [c],
            True,
        )
    finally:
        await f.stop()
    # stop: the final commit is on_close's, then the consumers close
    assert ("close", "k1:9092") in owner.calls and ("close", "k2:9092") in owner.calls
    assert k1.commits[-1] == {a: 7, b: 8} and k1.stopped and not f.clusters
    assert len(f.guards) == 2  # kept: their reset records stay readable


@pytest.mark.timeout(10)
@pytest.mark.parametrize("handover", [True, False])
async def test_a_subscription_change_hands_the_partitions_over_first(handover: bool) -> None:
    """aiokafka refuses commits from the moment the subscription changes: with the handover the
    owner's offsets are committed before it; without (the collector), the later revocation's
    commit fails, logged, and the partitions are forgotten all the same."""
    owner = Owner()
    owner.placement.add("T", _q("b1", "k1:9092"))
    f = owner.fleet(handover_on_resubscribe=handover)
    await f.start()
    try:
        k1 = _kafka(f, "k1:9092")
        tp = TopicPartition("b1.T", 0)
        await k1.assign([tp])
        owner.done = {tp: 11}
        owner.placement.add("T", _q("b2", "k1:9092"))  # a second broker on the same cluster
        await f.sync()
        assert k1.subscribed == [["b1.T"], ["b1.T", "b2.T"]]
        revoked = [x for x in owner.calls if x[0] == "revoked"]
        if handover:
            assert revoked == [("revoked", "k1:9092", [tp], True)]
            assert k1.commits == [{tp: 11}]
        else:
            assert revoked == [] and k1.commits == []
        await k1.listener.on_partitions_revoked({tp})  # aiokafka's own revocation, later
        assert len([x for x in owner.calls if x[0] == "revoked"]) == 1
        assert not f.clusters["k1:9092"].assigned
        assert k1.commits == ([{tp: 11}] if handover else [])
    finally:
        await f.stop()


@pytest.mark.timeout(10)
async def test_stop_without_on_close_revokes_what_is_assigned() -> None:
    owner = Owner()
    owner.placement.add("T", _q("b1", "k1:9092"))
    f = owner.fleet()
    await f.start()
    k1 = _kafka(f, "k1:9092")
    tp = TopicPartition("b1.T", 2)
    await k1.assign([tp])
    owner.done = {tp: 3}
    await f.stop()
    assert ("revoked", "k1:9092", [tp], True) in owner.calls and k1.commits == [{tp: 3}]


async def test_place_follows_readable_queues_and_can_require_a_route() -> None:
    routes = Routes(
        {
            "T": TopicRoute("T", (_q("b1", "k1:9092"), _q("b2", "k2:9092", perm=2))),
            "V": TopicRoute("V", (_q("b2", "k2:9092", perm=2),)),
        }
    )
    p = await place(routes, ["T", "V", "none"])  # type: ignore[arg-type]
    assert dict(p.topics) == {"k1:9092": {"b1.T"}}
    assert p.brokers == {"b1", "b2"} and set(p.routes) == {"b1.T"}
    every = await place(routes, ["T", "V"], readable_only=False)  # type: ignore[arg-type]
    assert dict(every.topics) == {"k1:9092": {"b1.T"}, "k2:9092": {"b2.T", "b2.V"}}
    with pytest.raises(NoRouteError, match="none"):
        await place(routes, ["T", "none"], required=True)  # type: ignore[arg-type]


@pytest.mark.timeout(10)
async def test_a_refused_commit_is_remembered_for_a_group_that_lost_its_offsets() -> None:
    """A restarted in-memory cluster forgets the group: the commit at revocation is refused and
    the group has no offset when the partition comes back. The offsets this process finished
    are where it resumes (checked against the log by the guard), not a fresh partition."""
    owner = Owner()
    owner.placement.add("T", _q("b1", "k1:9092"))
    f = owner.fleet()
    await f.start()
    try:
        k1 = _kafka(f, "k1:9092")
        tp = TopicPartition("b1.T", 0)
        await k1.assign([tp])
        owner.done = {tp: 30}
        k1.accepts = False  # the member is unknown to the restarted group
        await k1.listener.on_partitions_revoked({tp})
        assert k1.commits == []
        owner.calls.clear()
        await k1.assign([tp])  # no group offset: the remembered one, not on_fresh
        assert k1.sought == {tp: 30}
        assert not [x for x in owner.calls if x[0] == "fresh"]
    finally:
        await f.stop()
