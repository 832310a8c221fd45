"""The route-following group consumer: one Kafka consumer per data cluster hosting some topics.

A tracemq topic lives on brokers, each broker on some Kafka cluster (``<broker>.<topic>``,
:func:`tracemq.naming.kafka_topic`), and brokers come and go. :class:`Fleet` follows that: from
the owner's :class:`Placement` (``plan``: the routes of its topics, looked up with
:func:`place`) it keeps one :class:`AIOKafkaConsumer` per data cluster (bootstrap) in one Kafka
group, subscribed to that cluster's Kafka topics, and on every route change (and at least every
``refresh_s``) it plans again: a new cluster gets its consumer, a changed topic set a new
subscription. Used by :class:`~tracemq.consumer.PushConsumer` (``tracemq.consumer.push``) and the
collector's trace ingest (``tracemq_collector.ingest``); each keeps its own processing and talks
with the fleet through callbacks, all awaited, each given the :class:`FleetCluster`:

* ``on_assigned(cluster, tps)``: the group gave ``tps`` to this member; returns the start
  offsets the owner knows (or None). The fleet then positions the partitions through the
  cluster's :class:`~tracemq.offset_reset.OffsetGuard` (the owner's start, else the group's
  commit, else ``on_fresh``) and sets ``cluster.joined``.
* ``on_batch(cluster, data)``: after every bounded fetch (``max_records`` records, at most
  ``fetch_timeout_ms`` of waiting), ``data`` possibly empty, so the owner can do periodic work.
  Offsets are the owner's to commit (``cluster.commit``) once it has processed the records:
  nothing is committed on its behalf, so consumption is at least once.
* ``on_revoked(cluster, tps)``: ``tps`` are taken away (a rebalance, or the fleet hands them over
  before a subscription change); the owner finishes its work on them and returns the offsets
  that are safe to commit. The fleet commits them *while the group still accepts the commit*
  (a failure — the member was fenced — is logged) and forgets the partitions; aiokafka's own
  later revocation of partitions already handed over is ignored (each is revoked once).
* ``on_close(cluster)``: at :meth:`Fleet.stop`, after the fetch loop stopped: the final offsets
  to commit (default: ``on_revoked`` of everything assigned).
* ``on_reset(cluster, tp, reset)`` / ``on_fresh(cluster, tps)``: the guard's callbacks
  (:mod:`tracemq.offset_reset`): a position outside the log is reset to ``offset_reset``,
  counted in ``offset_counter``; a partition the group never committed is positioned by
  ``on_fresh`` (default: the ``offset_reset`` end).

``handover_on_resubscribe``: aiokafka forgets the assignment the moment the subscription changes
(a commit then fails: "No partitions assigned") and only later calls the revocation; with this
set, a subscription change first revokes (finishes, commits) every assigned partition, so the
next owner does not consume the finished messages again. The collector leaves it off: its
store, not the Kafka commit, says where a partition resumes. ``announce``: the info line
logged when a cluster's topic set changes (a service's); without it nothing is logged (a
client library does not write into its user's output).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from tracemq import kafka_security
from tracemq.log import get_logger
from tracemq.naming import kafka_topic
from tracemq.offset_reset import (
    IDLE_CHECK_S,
    KAFKA_AUTO_OFFSET_RESET,
    OffsetGuard,
    OffsetReset,
    OffsetResetPolicy,
)
from tracemq.routing import QueueRoute, RouteCache

log = get_logger("kafka.fleet")

Offsets = Mapping[TopicPartition, int]
Records = dict[TopicPartition, list[Any]]
OnAssigned = Callable[["FleetCluster", list[TopicPartition]], Awaitable[Offsets | None]]
OnRevoked = Callable[["FleetCluster", list[TopicPartition]], Awaitable[Offsets | None]]
OnBatch = Callable[["FleetCluster", Records], Awaitable[None]]
OnClose = Callable[["FleetCluster"], Awaitable[Offsets | None]]
OnReset = Callable[["FleetCluster", TopicPartition, OffsetReset], Awaitable[None] | None]
OnFresh = Callable[["FleetCluster", list[TopicPartition]], Awaitable[None]]
Spawn = Callable[..., "asyncio.Task[None]"]


@dataclass
class Placement:
    """Where topics live: the Kafka topics per data cluster, the queue route of each Kafka
    topic, and every broker hosting one (readable or not)."""

    topics: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    routes: dict[str, QueueRoute] = field(default_factory=dict)
    brokers: set[str] = field(default_factory=set)

    def add(self, topic: str, q: QueueRoute) -> str:
        """Follow ``topic``'s queue ``q``; returns its Kafka topic."""
        kt = kafka_topic(q.broker, topic)
        self.topics[q.data_bootstrap].add(kt)
        self.routes[kt] = q
        return kt


async def place(
    routes: RouteCache,
    topics: Iterable[str],
    *,
    readable_only: bool = True,
    required: bool = False,
    into: Placement | None = None,
) -> Placement:
    """Look the routes of ``topics`` up. ``readable_only``: skip queues without read
    permission; ``required``: a topic without queues raises the route cache's NoRouteError."""
    p = into if into is not None else Placement()
    for topic in topics:
        route = await routes.get(topic)
        if not route.queues and required:
            raise routes.missing(topic)
        for q in route.queues:
            p.brokers.add(q.broker)
            if readable_only and not q.readable:
                continue
            p.add(topic, q)
    return p


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, cluster: FleetCluster) -> None:
        self.cluster = cluster

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.cluster.fleet.revoke(self.cluster, sorted(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self.cluster.fleet._assigned(self.cluster, sorted(assigned))


class FleetCluster:
    """One data cluster's Kafka consumer, its offset guard, and what the group gave it.

    ``state`` is the owner's own per-cluster bookkeeping (``make_state``)."""

    def __init__(self, fleet: Fleet, bootstrap: str, topics: set[str]) -> None:
        self.fleet = fleet
        self.bootstrap = bootstrap
        self.topics = set(topics)
        self.consumer: Any = fleet.consumer_factory(
            bootstrap_servers=bootstrap,
            **kafka_security.client_kwargs(bootstrap),
            group_id=fleet.group_id,
            enable_auto_commit=False,  # the owner commits what it processed
            # the guard positions fresh partitions (on_fresh) and resets, counted
            auto_offset_reset=KAFKA_AUTO_OFFSET_RESET,
            session_timeout_ms=fleet.session_timeout_ms,
            heartbeat_interval_ms=max(300, fleet.session_timeout_ms // 5),
            fetch_max_wait_ms=fleet.fetch_max_wait_ms,
            **fleet.consumer_kwargs,
        )
        #: the partitions this member owns now
        self.assigned: set[TopicPartition] = set()
        #: set once the group gave this member its partitions (the first rebalance is over)
        self.joined = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        on_reset, on_fresh = fleet.on_reset, fleet.on_fresh
        self.guard = OffsetGuard(
            self.consumer,
            policy=fleet.offset_reset,
            counter=fleet.offset_counter,
            labels=fleet.offset_labels,
            on_reset=(lambda tp, r: on_reset(self, tp, r)) if on_reset else None,
            on_fresh=(lambda tps: on_fresh(self, tps)) if on_fresh else None,
            idle_check_s=fleet.idle_check_s,
            context={**fleet.context, "bootstrap": bootstrap},
            bootstrap=bootstrap,
        )
        self.state: Any = fleet.make_state(self) if fleet.make_state else None

    async def start(self) -> None:
        await kafka_security.start(self.consumer, self.bootstrap)
        self.consumer.subscribe(sorted(self.topics), listener=_Rebalance(self))
        self.task = self.fleet.spawn(
            self.fleet._loop(self), name=f"{self.fleet.name}-{self.bootstrap}"
        )

    async def commit(self, offsets: Offsets) -> None:
        """Commit ``offsets`` (raises as aiokafka does, e.g. during a rebalance); the guard
        remembers them, to resume there should the group's offsets be lost — also when the
        commit fails: they are what this process finished, and a cluster that lost its data
        refuses exactly that commit (the member is unknown to the restarted group), so without
        them the position past the new log's end would pass for a fresh partition, unseen."""
        offsets = dict(offsets)
        self.guard.remember(offsets)
        await self.consumer.commit(offsets)


class Fleet:
    """Follows the routes of the owner's topics with one Kafka consumer per data cluster (see
    the module docstring for the callbacks and the guarantees)."""

    def __init__(
        self,
        *,
        name: str,
        group_id: str,
        routes: RouteCache,
        plan: Callable[[bool], Awaitable[Placement]],
        on_batch: OnBatch,
        on_assigned: OnAssigned | None = None,
        on_revoked: OnRevoked | None = None,
        on_close: OnClose | None = None,
        on_reset: OnReset | None = None,
        on_fresh: OnFresh | None = None,
        make_state: Callable[[FleetCluster], Any] | None = None,
        max_records: int,
        session_timeout_ms: int,
        fetch_max_wait_ms: int,
        consumer_kwargs: Mapping[str, Any] | None = None,
        offset_reset: OffsetResetPolicy | str = OffsetResetPolicy.EARLIEST,
        offset_counter: Any = None,
        offset_labels: tuple[str, ...] = (),
        idle_check_s: float = IDLE_CHECK_S,
        context: Mapping[str, Any] | None = None,
        handover_on_resubscribe: bool = True,
        announce: str | None = None,
        fetch_timeout_ms: int = 200,
        refresh_s: float = 5.0,
        spawn: Spawn = asyncio.create_task,
        consumer_factory: Callable[..., Any] = AIOKafkaConsumer,
    ) -> None:
        self.name = name
        self.group_id = group_id
        self.routes = routes
        self.plan = plan
        self.on_batch = on_batch
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_close = on_close
        self.on_reset = on_reset
        self.on_fresh = on_fresh
        self.make_state = make_state
        self.max_records = max_records
        self.session_timeout_ms = session_timeout_ms
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.consumer_kwargs = dict(consumer_kwargs or {})
        self.offset_reset = OffsetResetPolicy(offset_reset)
        self.offset_counter = offset_counter
        self.offset_labels = offset_labels
        self.idle_check_s = idle_check_s
        self.context = dict(context or {})
        self.handover_on_resubscribe = handover_on_resubscribe
        #: the info log line of a cluster's new topic set (a service's); None: no line (a
        #: client library does not write into its user's output)
        self.announce = announce
        self.fetch_timeout_ms = fetch_timeout_ms
        self.refresh_s = refresh_s
        self.spawn = spawn
        self.consumer_factory = consumer_factory
        #: bootstrap → the cluster's consumer (emptied by stop)
        self.clusters: dict[str, FleetCluster] = {}
        #: every guard created, kept after stop (their reset records stay readable)
        self.guards: list[OffsetGuard] = []
        self._watch: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Plan (``plan(True)``: the owner may refuse a topic without route), start a consumer
        per cluster, then watch the routes."""
        await self.sync(initial=True)
        self._watch = self.spawn(self._watch_routes(), name=f"{self.name}-routes")

    def halt(self) -> None:
        """Stop fetching and watching now (no waiting): :meth:`stop` finishes the job."""
        if self._watch:
            self._watch.cancel()
        for c in self.clusters.values():
            if c.task:
                c.task.cancel()

    async def stop(self) -> None:
        """Stop the fetch loops and the watch, commit each cluster's final offsets
        (``on_close``), close the consumers."""
        self.halt()
        if self._watch:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        for c in list(self.clusters.values()):
            if c.task:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await c.task
            with contextlib.suppress(Exception):
                if self.on_close is not None:
                    offsets = await self.on_close(c)
                    if offsets:
                        await c.commit(offsets)
                else:
                    await self.revoke(c, sorted(c.assigned))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.consumer.stop(), 10)
            await c.guard.close()
        self.clusters.clear()

    # -- routes ----------------------------------------------------------------------------
    async def sync(self, *, initial: bool = False) -> None:
        """Plan again: a consumer for every new cluster, a new subscription where the topics
        of one changed."""
        placement = await self.plan(initial)
        for bootstrap, topics in placement.topics.items():
            c = self.clusters.get(bootstrap)
            if c is None:
                c = FleetCluster(self, bootstrap, topics)
                self.clusters[bootstrap] = c
                self.guards.append(c.guard)
                await c.start()
                self._following(bootstrap, topics)
            elif topics != c.topics:
                self._following(bootstrap, topics)
                await self._resubscribe(c, set(topics))

    def _following(self, bootstrap: str, topics: set[str]) -> None:
        if self.announce is not None:
            log.info(self.announce, bootstrap=bootstrap, topics=sorted(topics), **self.context)

    async def _resubscribe(self, c: FleetCluster, topics: set[str]) -> None:
        c.topics = topics
        if self.handover_on_resubscribe and c.assigned:
            # aiokafka drops the assignment with the old subscription (a commit then fails)
            # and only later calls the revocation: hand every partition over now.
            await self.revoke(c, sorted(c.assigned))
        c.consumer.subscribe(sorted(topics), listener=_Rebalance(c))

    async def _watch_routes(self) -> None:
        changes = self.routes.subscribe_changes()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changes.get(), self.refresh_s)
            try:
                await self.sync()
            except Exception as exc:
                log.warning("route refresh failed", error=repr(exc), **self.context)

    # -- the group -------------------------------------------------------------------------
    async def _assigned(self, c: FleetCluster, tps: list[TopicPartition]) -> None:
        c.assigned.update(tps)
        try:
            starts = await self.on_assigned(c, tps) if self.on_assigned else None
            await c.guard.assigned(tps, dict(starts) if starts else None)
        finally:
            c.joined.set()

    async def revoke(self, c: FleetCluster, tps: Iterable[TopicPartition]) -> None:
        """Hand ``tps`` over: the owner finishes them (``on_revoked``), their offsets are
        committed, they are forgotten. Partitions not assigned (any more) are skipped."""
        mine = [tp for tp in tps if tp in c.assigned]
        if not mine:
            return
        try:
            offsets = await self.on_revoked(c, mine) if self.on_revoked else None
            if offsets:
                try:
                    await c.commit(offsets)
                except Exception as exc:  # the group moved on (e.g. this member was fenced)
                    log.warning(
                        "commit at revocation failed",
                        bootstrap=c.bootstrap,
                        error=repr(exc),
                        **self.context,
                    )
        finally:
            c.assigned.difference_update(mine)

    async def _loop(self, c: FleetCluster) -> None:
        while True:
            data = await c.guard.getmany(
                timeout_ms=self.fetch_timeout_ms, max_records=self.max_records
            )
            await self.on_batch(c, data)
