"""PushConsumer: consumes every broker hosting the subscribed topics and calls a listener.

One Kafka consumer per data cluster (group id = the consumer group in CLUSTERING mode; a
per-instance group in BROADCASTING mode, so every instance gets every message and keeps its own
offsets). Those consumers — following the routes, the rebalance, the offset guard, the commit
at a revocation — are :mod:`tracemq.kafka.fleet`'s (shared with the collector's trace ingest);
this module keeps the queues' bookkeeping (:class:`_ClusterQueues`) and the listener calls.

BROADCASTING identity: the Kafka group is ``<group>.broadcast.<client host>.<instance name>``
and holds the instance's committed offsets (RocketMQ keeps them in a local file per client id).
The default instance name is the process id (``#2``, ``#3``, … for further clients of the
process, :mod:`tracemq._client`), so two instances in one process or on one host are distinct
and each gets every message — and a restarted process is a new instance that starts where
``consume_from`` says (LAST_OFFSET: what was sent while it was down is not consumed), as with
RocketMQ's pid default. An instance that must resume where it stopped sets a stable
``instance_name`` (``TRACEMQ_INSTANCE_NAME``): a restart then joins the same Kafka group and
resumes at its committed offsets. Two running instances of a group with one explicit name
collide: in one process ``start()`` refuses the second (``ClientStateError``); across
processes the shared Kafka group gives each only part of the queues, which is logged as a
warning and counted in ``tracemq_consumer_broadcast_identity_shared_total``. Offsets are committed only after the listener's result: the committed offset of a
queue is the lowest offset still in flight. A rebalance hands a revoked queue over cleanly: no
listener call starts on it any more, the running ones finish (up to
``revoke_drain_timeout_ms``), their offsets are committed, and the next owner starts after
them — so a rebalance causes no duplicate consumption unless a listener outlives the deadline.
Within one assignment of a queue an offset is consumed once: a record fetched again (aiokafka
can deliver a partition's head twice when it is sought twice) is skipped, counted in
``tracemq_consumer_refetched_total``.

Retries (CLUSTERING, RocketMQ's ``sendMessageBack``; :mod:`tracemq.consumer._sendback`): a
failed message (RECONSUME_LATER, an exception, a None result or a time-out) is sent back to the
broker that stored it, to come back through ``%RETRY%<group>`` after a delay level, and its
offset counts as consumed only once the broker has acknowledged the send-back. Every consumer of
the group also consumes ``%RETRY%<group>`` (tag ``*``, from its beginning for a new group, as
RocketMQ), asking each broker hosting its topics to create it at start (``retry.ensure``); a
message read from there is presented with its original topic (``RETRY_TOPIC``) to the listener
and the trace, and SubBefore's retryTimes is its ``RECONSUME_TIME``. After
``max_reconsume_times`` retries (16) a failure sends the message to ``%DLQ%<group>`` instead. If
a send-back fails, the message is consumed again locally after ``in_process_retry_delay_ms``: a
message is never dropped.

Offsets outside a queue's log (the data cluster lost its data, the topic was recreated,
retention passed a stopped consumer) are found at assignment, on an out-of-range fetch and when a
queue stays idle, and resume at ``offset_reset`` (earliest by default), counted in
``tracemq_consumer_offset_resets_total`` (:mod:`tracemq.offset_reset`). A subscription change
(a broker's route expired or came back) hands the queues over *before* the new subscription
replaces the old one (the fleet's ``handover_on_resubscribe``): aiokafka drops the assignment
at once, and a commit after that fails, so the next owner would consume the finished messages
again.

Orderly listeners suspend the queue and retry locally, up to ``max_reconsume_times``, then
dead-letter the message. BROADCASTING mode does not retry (as RocketMQ): a failed message is
logged, counted in ``tracemq_consumer_given_up_total`` and dropped after its trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from prometheus_client import Counter

from tracemq._client import ClientBase, ClientRuntime, ClientSettings, now_ms
from tracemq._deadlines import Deadlines
from tracemq.consumer import tags as _tags
from tracemq.consumer._fetch import FETCH_MAX_WAIT_MS
from tracemq.consumer._process_queue import ProcessQueue
from tracemq.consumer._records import to_message_ext
from tracemq.consumer._sendback import DEAD_LETTERED, GIVEN_UP, SENT_BACK, SendBack
from tracemq.consumer.listener import (
    ConcurrentlyListener,
    ConsumeConcurrentlyStatus,
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageModel,
    OrderlyListener,
)
from tracemq.errors import ClientStateError
from tracemq.hooks import ConsumeMessageContext, ConsumeMessageHook, call_hooks
from tracemq.kafka.fleet import Fleet, FleetCluster, Placement, place
from tracemq.log import get_logger
from tracemq.message import MessageConst, MessageExt
from tracemq.message_id import new_request_id
from tracemq.naming import dlq_topic, validate_topic
from tracemq.offset_reset import IDLE_CHECK_S, OffsetReset, OffsetResetPolicy
from tracemq.protocol.control import Subscription
from tracemq.routing import QueueRoute
from tracemq.trace import ConsumeReturnType

if TYPE_CHECKING:
    from tracemq.trace._hooks import ConsumeMessageTraceHook

log = get_logger("consumer")

# The listener outcomes, read once per consumed message: module constants, since an enum
# member's look-up through its class costs ~70 ns on CPython 3.11 (a global ~10).
_SUCCESS = ConsumeReturnType.SUCCESS
_RETURNNULL = ConsumeReturnType.RETURNNULL
_FAILED = ConsumeReturnType.FAILED
_TIME_OUT = ConsumeReturnType.TIME_OUT
_EXCEPTION = ConsumeReturnType.EXCEPTION
_SUCCESS_STATUSES = (ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeOrderlyStatus.SUCCESS)
#: the SubAfter's contextCode of each outcome (int(code) is a call: ~60 ns)
_CODE_INT = {c: int(c) for c in ConsumeReturnType}

#: the send-back's counters stay importable from here (the facade)
__all__ = ["CONSUMED", "DEAD_LETTERED", "GIVEN_UP", "SENT_BACK", "PushConsumer"]

CONSUMED = Counter("tracemq_consumer_messages_total", "Listener outcomes", ["group", "result"])
REVOKED = Counter(
    "tracemq_consumer_revoked_queues_total",
    "Queues (partitions) taken from this consumer by a rebalance",
    ["group"],
)
DRAIN_TIMEOUTS = Counter(
    "tracemq_consumer_revoke_drain_timeouts_total",
    "Revoked queues handed over with listener calls still running (consumed again there)",
    ["group"],
)
REFETCHED = Counter(
    "tracemq_consumer_refetched_total",
    "Records fetched again at an offset their queue already had in this assignment (not "
    "consumed again)",
    ["group"],
)
HANDED_OVER = Counter(
    "tracemq_consumer_handed_over_total",
    "Fetched messages not consumed here because their queue was revoked (the next owner "
    "consumes them)",
    ["group"],
)
OFFSET_RESETS = Counter(
    "tracemq_consumer_offset_resets_total",
    "Queue offsets found outside their log and reset to the offset_reset policy",
    ["group", "topic", "partition"],
)
BROADCAST_SHARED = Counter(
    "tracemq_consumer_broadcast_identity_shared_total",
    "BROADCASTING consumers given only part of their queues: another running instance (e.g. "
    "another process on this host with the same instance_name) shares their Kafka group",
    ["group"],
)
#: Kafka group ids of the BROADCASTING consumers running in this process
_RUNNING_BROADCAST_GROUPS: set[str] = set()


class _ClusterQueues:
    """This consumer's bookkeeping of one data cluster's queues (``FleetCluster.state``; the
    Kafka consumer, the group and the offset guard are the fleet's): a ProcessQueue per
    assigned queue, and the queues paused because too much of them is in flight."""

    def __init__(self, parent: PushConsumer, cluster: FleetCluster) -> None:
        self.parent = parent
        self.cluster = cluster
        self.pqs: dict[TopicPartition, ProcessQueue] = {}
        self.paused: set[TopicPartition] = set()
        self.last_commit = time.monotonic()

    @property
    def consumer(self) -> Any:
        return self.cluster.consumer

    def assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            self.pqs[tp] = ProcessQueue()
        if self.parent.message_model == MessageModel.BROADCASTING:
            self._check_whole(assigned)

    def _check_whole(self, assigned: list[TopicPartition]) -> None:
        """A BROADCASTING instance is the only member of its Kafka group and gets every queue;
        fewer means another instance shares its identity and each sees part of the messages."""
        p = self.parent
        known = {t: self.consumer.partitions_for_topic(t) for t in self.cluster.topics}
        total = sum(len(parts) for parts in known.values() if parts)
        mine = sum(1 for tp in assigned if known.get(tp.topic))
        if mine < total:
            BROADCAST_SHARED.labels(p.group).inc()
            log.warning(
                "BROADCASTING consumer shares its identity with another running instance: each "
                "gets only part of the messages; give each instance its own instance_name",
                group=p.group,
                kafka_group=p.broadcast_group_id,
                client_id=p.client_id,
                queues_assigned=mine,
                queues_total=total,
            )

    async def position_fresh(self, tps: list[TopicPartition]) -> None:
        """Queues the group never committed: where consume_from says."""
        p = self.parent
        retry = [tp for tp in tps if tp.topic in p._retry_ktopics]
        rest = [tp for tp in tps if tp not in retry]
        guard = self.cluster.guard
        if retry:  # a new group reads its retry queues from the start (RocketMQ)
            await guard.seek_to_start(*retry)
        if not rest:
            return
        if p.consume_from == ConsumeFromWhere.FIRST_OFFSET:
            await guard.seek_to_start(*rest)
        elif p.consume_from == ConsumeFromWhere.TIMESTAMP:
            ts = p.consume_timestamp_ms or now_ms() - 30 * 60 * 1000
            found = await self.consumer.offsets_for_times(dict.fromkeys(rest, ts))
            for tp in rest:
                hit = found.get(tp)
                if hit is not None:
                    self.consumer.seek(tp, hit.offset)
                else:
                    await self.consumer.seek_to_end(tp)
        else:
            await self.consumer.seek_to_end(*rest)

    def reset(self, tp: TopicPartition, reset: OffsetReset) -> None:
        """The queue's log restarts at ``reset.target``: its bookkeeping starts again (the
        old one's commit marks are past the new log). Listener calls on messages of the old
        log finish on the old ProcessQueue; they are not handed over: nobody else has them."""
        if tp in self.pqs:
            self.pqs[tp] = ProcessQueue()
        if tp in self.paused:
            self.paused.discard(tp)
            with contextlib.suppress(Exception):
                self.consumer.resume(tp)

    async def revoked(self, revoked: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Hand the revoked queues over cleanly: start nothing more on them, let the listener
        calls already running finish (bounded by ``revoke_drain_timeout_ms``), forget them;
        the fleet then commits the offsets returned. What was fetched but not started goes to
        the next owner unconsumed; a call still running at the deadline is consumed again
        there (at least once, as RocketMQ)."""
        p = self.parent
        pqs = [pq for tp in revoked if (pq := self.pqs.get(tp)) is not None]
        for pq in pqs:
            pq.dropped = True
        if revoked:
            REVOKED.labels(p.group).inc(len(revoked))
        busy = [pq for pq in pqs if pq.running]
        if busy:
            deadline = asyncio.get_running_loop().time() + p.revoke_drain_timeout_ms / 1000
            for pq in busy:
                left = max(0.0, deadline - asyncio.get_running_loop().time())
                if not await pq.drained(left):
                    DRAIN_TIMEOUTS.labels(p.group).inc()
                    log.warning(
                        "revoked queue still consuming at the drain deadline; its next owner "
                        "may consume those messages again",
                        group=p.group,
                        running=pq.running,
                        timeout_ms=p.revoke_drain_timeout_ms,
                    )
        offsets, _ = self.offsets()
        for tp in revoked:
            self.pqs.pop(tp, None)
            self.paused.discard(tp)
        return offsets

    def offsets(self) -> tuple[dict[TopicPartition, int], list[tuple[ProcessQueue, int]]]:
        """What is safe to commit of every queue, and the queues it was read from (a reset
        may replace a queue's ProcessQueue while the commit runs)."""
        offsets = {}
        marks = []
        for tp, pq in self.pqs.items():
            off = pq.commit_offset()
            if off is not None:
                offsets[tp] = off
                marks.append((pq, off))
        return offsets, marks

    async def commit(self) -> None:
        offsets, marks = self.offsets()
        if offsets:
            await self.cluster.commit(offsets)
            for pq, off in marks:
                pq.committed(off)

    async def batch(self, data: dict[TopicPartition, list[Any]]) -> None:
        """A fetch: each queue's messages to the listeners (tag-filtered, in batches of
        ``consume_message_batch_max_size``), back-pressure, the periodic commit.

        Each queue's records are bound to its ProcessQueue *before the first await* (the fleet
        calls this the moment aiokafka hands the fetch over): a rebalance while this fetch is
        dispatched (a full work queue, a route look-up) drops those ProcessQueues, so the rest
        of the fetch is left to the queues' next owner — even when that is this member again,
        with new ProcessQueues, positioned at the commit of the revocation."""
        p = self.parent
        bound = [(tp, records, self.pqs.get(tp)) for tp, records in data.items()]
        for tp, records, pq in bound:
            # no ProcessQueue: revoked before this fetch was handed over (the fleet's own
            # hand-over on a new subscription); dropped: revoked while an earlier queue of
            # this fetch was dispatched — the next owner consumes them either way, counted
            if pq is None or pq.dropped:
                HANDED_OVER.labels(p.group).inc(len(records))
                continue
            route = p._route_for(tp.topic)
            store_host = await p._runtime.store_host(route.address) if route else "0.0.0.0:0"
            batch: list[MessageExt] = []
            from_retry = tp.topic in p._retry_ktopics
            refetched = 0
            for rec in records:
                if pq.seen(rec.offset):  # fetched again within this assignment: dispatched
                    refetched += 1
                    continue
                msg = to_message_ext(rec, store_host)
                if from_retry:  # present it as what it was: a message of its own topic
                    msg.topic = msg.properties.get(MessageConst.RETRY_TOPIC) or msg.topic
                elif msg.topic not in p._subscriptions or not _tags.matches(
                    p._subscriptions.get(msg.topic), msg.tags
                ):
                    pq.skip(rec.offset)
                    continue
                pq.add(rec.offset)
                batch.append(msg)
                if len(batch) >= p.consume_message_batch_max_size:
                    await p._dispatch(self, tp, pq, batch, route)
                    batch = []
            if refetched:
                REFETCHED.labels(p.group).inc(refetched)
            if batch:
                await p._dispatch(self, tp, pq, batch, route)
            if pq.dropped:
                continue
            if len(pq) >= p.pull_threshold_per_queue and tp not in self.paused:
                self.consumer.pause(tp)
                self.paused.add(tp)
        for tp in list(self.paused):
            pq = self.pqs.get(tp)
            if pq is None or len(pq) < p.pull_threshold_per_queue // 2:
                with contextlib.suppress(Exception):
                    self.consumer.resume(tp)
                self.paused.discard(tp)
        if time.monotonic() - self.last_commit >= p.commit_interval_ms / 1000:
            try:
                await self.commit()
            except Exception as exc:  # a rebalance in progress; the next commit catches up
                log.debug("commit failed", error=repr(exc))
            self.last_commit = time.monotonic()


class PushConsumer(ClientBase):
    """Subscribe, register a listener, start. See the module docstring for the guarantees."""

    kind = "consumer"

    def __init__(
        self,
        group: str,
        *,
        message_model: MessageModel | str = MessageModel.CLUSTERING,
        consume_from: ConsumeFromWhere | str = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        consume_concurrency: int = 20,
        consume_message_batch_max_size: int = 1,
        max_reconsume_times: int = 16,
        consume_timeout_minutes: float = 15,
        pull_batch_size: int = 500,
        pull_threshold_per_queue: int = 1000,
        in_process_retry_delay_ms: int = 1000,
        commit_interval_ms: int = 1000,
        session_timeout_ms: int | None = None,
        revoke_drain_timeout_ms: int = 10_000,
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
        offset_reset: OffsetResetPolicy | str = OffsetResetPolicy.EARLIEST,
        offset_check_interval_ms: int = int(IDLE_CHECK_S * 1000),
        settings: ClientSettings | None = None,
        redis_url: str | None = None,
        control_bootstrap: str | None = None,
        trace_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(group)
        self.message_model = MessageModel(message_model)
        self.consume_from = ConsumeFromWhere(consume_from)
        self.consume_timestamp_ms = consume_timestamp_ms
        if consume_concurrency < 1 or consume_message_batch_max_size < 1:
            raise ValueError("consume_concurrency and consume_message_batch_max_size must be >= 1")
        if revoke_drain_timeout_ms < 0:
            raise ValueError(f"revoke_drain_timeout_ms must be >= 0, got {revoke_drain_timeout_ms}")
        if fetch_max_wait_ms < 0:
            raise ValueError(f"fetch_max_wait_ms must be >= 0, got {fetch_max_wait_ms}")
        #: longest a fetch waits on an idle queue: the bound on a new message's wait before the
        #: listener sees it, where the Kafka-compatible broker does not answer a waiting fetch
        #: as soon as data arrives (Tansu does not)
        self.fetch_max_wait_ms = fetch_max_wait_ms
        #: where a queue whose offset is outside its log resumes (tracemq.offset_reset)
        self.offset_reset = OffsetResetPolicy(offset_reset)
        if offset_check_interval_ms < 1:
            raise ValueError(
                f"offset_check_interval_ms must be >= 1, got {offset_check_interval_ms}"
            )
        self.offset_check_interval_s = offset_check_interval_ms / 1000
        self.consume_concurrency = consume_concurrency
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.max_reconsume_times = max_reconsume_times
        self.consume_timeout_s = consume_timeout_minutes * 60
        #: the listener calls' time-outs on one timer (an ``asyncio.timeout`` per call armed a
        #: TimerHandle in the loop's heap per consumed message: ~3 us of the call's CPU)
        self._deadlines = Deadlines()
        #: the loop this consumer runs on, from start() (asyncio.get_running_loop() makes a
        #: getpid() system call each time: ~0.27 us per consumed message here)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_per_queue = pull_threshold_per_queue
        #: delay before consuming a message again locally when its send-back failed
        self.in_process_retry_delay_ms = in_process_retry_delay_ms
        self.commit_interval_ms = commit_interval_ms
        #: how long a rebalance waits for the listener calls running on a revoked queue
        #: (aiokafka's rebalance timeout, max_poll_interval_ms, is 5 minutes)
        self.revoke_drain_timeout_ms = revoke_drain_timeout_ms
        self.settings = settings or ClientSettings.from_overrides(redis_url, control_bootstrap)
        #: the group session timeout (``ClientSettings.consumer_session_timeout_ms`` by default)
        self.session_timeout_ms = session_timeout_ms or self.settings.consumer_session_timeout_ms
        self._subscriptions: dict[str, frozenset[str] | None] = {}
        self._expressions: dict[str, str] = {}
        self._runtime = ClientRuntime(
            self.group,
            "consumer",
            self.settings,
            enable_msg_trace=enable_msg_trace,
            trace_topic=trace_topic,
            message_model=self.message_model.value,
            subscriptions=lambda: [
                Subscription(topic=t, expression=e) for t, e in self._expressions.items()
            ],
            trace_options=trace_options,
        )
        self._listener: ConcurrentlyListener | None = None
        self._orderly = False
        self._hooks: list[ConsumeMessageHook] = []
        #: message trace's hook (also in _hooks) while it runs: _consume calls it directly
        self._trace_hook: ConsumeMessageTraceHook | None = None
        self._fleet = self._new_fleet()
        self._routes: dict[str, QueueRoute] = {}  # kafka topic -> broker route
        self._work: asyncio.Queue[tuple[Any, ...]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._orderly_queues: dict[TopicPartition, asyncio.Queue[tuple[Any, ...]]] = {}
        self._orderly_tasks: dict[TopicPartition, asyncio.Task[None]] = {}
        self._in_flight = 0
        self._listener_is_async = False
        self._outcome_counters: dict[ConsumeReturnType, Any] = {}
        self._idle = asyncio.Event()
        # retries and dead letters (tracemq.consumer._sendback); the retry topic's Kafka topics
        self._sendback = SendBack(
            self.group,
            message_model=self.message_model,
            max_reconsume_times=max_reconsume_times,
            in_process_retry_delay_ms=in_process_retry_delay_ms,
            settings=self.settings,
            runtime=self._runtime,
            consume_again=self._consume_once,
        )
        self._retry_topic = self._sendback.retry_topic
        self._retry_ktopics: set[str] = set()
        self._holds_broadcast_group = False  # its broadcast group id is in the running set

    def _new_fleet(self) -> Fleet:
        """The route-following Kafka consumers (:mod:`tracemq.kafka.fleet`); this consumer
        keeps the queues' bookkeeping (:class:`_ClusterQueues`) and the listener calls."""
        clustering = self.message_model == MessageModel.CLUSTERING

        async def on_assigned(c: FleetCluster, tps: list[TopicPartition]) -> None:
            c.state.assigned(tps)

        async def on_revoked(c: FleetCluster, tps: list[TopicPartition]) -> dict[Any, int]:
            return await c.state.revoked(tps)

        async def on_close(c: FleetCluster) -> dict[Any, int]:
            return c.state.offsets()[0]

        async def on_batch(c: FleetCluster, data: dict[TopicPartition, list[Any]]) -> None:
            await c.state.batch(data)

        async def on_fresh(c: FleetCluster, tps: list[TopicPartition]) -> None:
            await c.state.position_fresh(tps)

        return Fleet(
            name=f"consume-{self.group}",
            group_id=self.group if clustering else self.broadcast_group_id,
            routes=self._runtime.routes,
            plan=self._plan,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            on_close=on_close,
            on_batch=on_batch,
            on_reset=lambda c, tp, r: c.state.reset(tp, r),
            on_fresh=on_fresh,
            make_state=lambda c: _ClusterQueues(self, c),
            max_records=self.pull_batch_size,
            session_timeout_ms=self.session_timeout_ms,
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            consumer_kwargs={
                "max_poll_records": self.pull_batch_size,
                "metadata_max_age_ms": 30_000,
            },
            offset_reset=self.offset_reset,
            offset_counter=OFFSET_RESETS,
            offset_labels=(self.group,),
            idle_check_s=self.offset_check_interval_s,
            context={"group": self.group},
            handover_on_resubscribe=True,
        )

    # -- configuration ---------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        validate_topic(topic)
        self._subscriptions[topic] = _tags.parse(expression)
        self._expressions[topic] = expression or "*"

    def register_message_listener(self, listener: ConcurrentlyListener) -> None:
        """A concurrent listener: ``(msgs, context) -> ConsumeConcurrentlyStatus`` (async or
        sync; a sync one runs in a worker thread)."""
        self._listener, self._orderly = listener, False
        self._listener_is_async = inspect.iscoroutinefunction(listener)

    def register_message_listener_orderly(self, listener: OrderlyListener) -> None:
        """An orderly listener: one queue at a time, in order; returns ConsumeOrderlyStatus."""
        self._listener, self._orderly = listener, True
        self._listener_is_async = inspect.iscoroutinefunction(listener)

    def register_consume_hook(self, hook: ConsumeMessageHook) -> None:
        self._hooks.append(hook)

    async def wait_assigned(self, timeout_s: float = 30.0) -> bool:
        """Wait until this consumer has joined its group on every data cluster and been given
        its queues (possibly none, when the group has more members than queues). A new group's
        first assignment takes seconds (about 5 s on Tansu). A group that never committed starts
        where ``consume_from`` says *at that assignment*: with FIRST_OFFSET or TIMESTAMP what
        was sent meanwhile is delivered after it; with LAST_OFFSET (the default) it starts at
        the queue's end then, so send only after this returns. True if that happened within
        ``timeout_s``."""
        self._check_running()
        waits = [c.joined.wait() for c in self._fleet.clusters.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except TimeoutError:
            return False
        return True

    @property
    def client_id(self) -> str:
        """``<client host>@<instance name>`` (see :mod:`tracemq._client`); in the traces."""
        return self._runtime.client_id

    @property
    def instance_name(self) -> str:
        """The instance name in use: the configured one, or the process-derived default."""
        return self._runtime.instance_name

    @property
    def broadcast_group_id(self) -> str:
        """The Kafka group of this instance in BROADCASTING mode (where its offsets live)."""
        return f"{self.group}.broadcast.{self._runtime.client_host}.{self.instance_name}"

    def offset_resets(self) -> dict[str, Any]:
        """The queue offsets reset since start (found outside their log), per queue."""
        guards = self._fleet.guards  # kept after shutdown
        return {
            "total": sum(g.total for g in guards),
            "partitions": [r for g in guards for r in g.stats()["partitions"]],
        }

    @property
    def trace_dispatcher(self) -> Any:
        return self._runtime.dispatcher

    # -- lifecycle -------------------------------------------------------------------------
    def _check_startable(self) -> None:
        if not self._subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        if self._retry_topic is not None:
            validate_topic(self._retry_topic)  # a group too long for its retry topic fails here
            validate_topic(dlq_topic(self.group))
        if self.message_model == MessageModel.BROADCASTING:
            if self.broadcast_group_id in _RUNNING_BROADCAST_GROUPS:
                raise ClientStateError(
                    f"BROADCASTING consumer {self.group!r}: instance name "
                    f"{self.instance_name!r} is already used by a running consumer of this "
                    "group in this process (the two would split the messages); give each its "
                    "own instance_name (ClientSettings / TRACEMQ_INSTANCE_NAME) or leave it unset"
                )
            _RUNNING_BROADCAST_GROUPS.add(self.broadcast_group_id)
            self._holds_broadcast_group = True

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._runtime.start()
        if self._runtime.dispatcher is not None:
            from tracemq.trace._hooks import ConsumeMessageTraceHook, SendMessageTraceHook

            self._trace_hook = ConsumeMessageTraceHook(
                self._runtime.dispatcher, self._runtime.trace_topic
            )
            self._hooks.append(self._trace_hook)
            self._sendback.dlq_trace = SendMessageTraceHook(
                self._runtime.dispatcher, self._runtime.trace_topic
            )
        self._work = asyncio.Queue(maxsize=self.consume_concurrency * 2)
        if not self._orderly:
            self._workers = [self._spawn_worker(i) for i in range(self.consume_concurrency)]
        await self._fleet.start()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop fetching, let running listeners finish (bounded), commit, flush traces, close."""
        if self._begin_shutdown():
            await self._stop(timeout_s)

    async def _stop(self, timeout_s: float = 10.0) -> None:
        self._fleet.halt()
        if self._in_flight:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout_s)
        await self._close()

    async def _close(self) -> None:
        self._deadlines.close()
        await super()._close()
        for t in [*self._workers, *self._orderly_tasks.values(), *self._sendback.tasks]:
            t.cancel()
        for t in [*self._workers, *self._orderly_tasks.values(), *self._sendback.tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self._fleet.stop()
        if self._holds_broadcast_group:
            self._holds_broadcast_group = False
            _RUNNING_BROADCAST_GROUPS.discard(self.broadcast_group_id)
        await self._runtime.stop()

    # -- routes ----------------------------------------------------------------------------
    def _route_for(self, ktopic: str) -> QueueRoute | None:
        return self._routes.get(ktopic)

    async def _plan(self, initial: bool) -> Placement:
        """The Kafka topics to follow: the readable queues of the subscribed topics (each must
        have a route at start), and this group's retry topic on the brokers hosting them."""
        routes = self._runtime.routes
        placement = await place(routes, self._subscriptions, readable_only=True, required=initial)
        brokers = placement.brokers
        if self._retry_topic is not None:
            await self._sendback.ensure_retry_topics(brokers)
            route = await routes.get(self._retry_topic)
            if brokers - {q.broker for q in route.queues}:
                route = await routes.get(self._retry_topic, refresh=True)
            for q in route.queues:
                if q.readable:
                    self._retry_ktopics.add(placement.add(self._retry_topic, q))
        self._routes.update(placement.routes)
        return placement

    # -- dispatch --------------------------------------------------------------------------
    async def _dispatch(
        self,
        cc: _ClusterQueues,
        tp: TopicPartition,
        pq: ProcessQueue,
        msgs: list[MessageExt],
        route: QueueRoute | None,
    ) -> None:
        item = (cc, tp, pq, msgs, route)
        if self._orderly:
            q = self._orderly_queues.get(tp)
            if q is None:
                q = asyncio.Queue(maxsize=self.pull_threshold_per_queue)
                self._orderly_queues[tp] = q
                self._orderly_tasks[tp] = asyncio.create_task(self._orderly_worker(q))
            await q.put(item)
        else:
            assert self._work is not None
            await self._work.put(item)

    def _spawn_worker(self, i: int) -> asyncio.Task[None]:
        task = asyncio.create_task(self._worker(), name=f"listener-{i}")
        task.add_done_callback(functools.partial(self._worker_done, i=i))
        return task

    def _worker_done(self, task: asyncio.Task[None], i: int) -> None:
        """A worker must never die silently: log it and start a new one."""
        if task.cancelled() or self._state == "shutdown":
            return
        log.error(
            "listener worker died; restarting it", group=self.group, error=repr(task.exception())
        )
        if i < len(self._workers):
            self._workers[i] = self._spawn_worker(i)

    async def _worker(self) -> None:
        assert self._work is not None
        while True:
            cc, tp, pq, msgs, route = await self._work.get()
            await self._consume_once(pq, msgs, route)

    async def _consume_once(
        self, pq: ProcessQueue, msgs: list[MessageExt], route: QueueRoute | None
    ) -> None:
        """One concurrent listener call on ``msgs`` (none if their queue was revoked while they
        waited); a failure goes back to the broker (:mod:`tracemq.consumer._sendback`)."""
        if not self._begin(pq, msgs):
            return
        self._in_flight += 1
        try:
            ok, level = await self._consume(msgs, route)
            if ok:
                for m in msgs:
                    pq.done(m.queue_offset)
            else:
                await self._sendback.failed(pq, msgs, route, level)
        finally:
            pq.end()
            self._leave()

    async def _orderly_worker(self, q: asyncio.Queue[tuple[Any, ...]]) -> None:
        while True:
            cc, tp, pq, msgs, route = await q.get()
            if not self._begin(pq, msgs):  # revoked: its next owner consumes it, in order
                continue
            self._in_flight += 1
            running = True
            try:
                while True:
                    ok, _ = await self._consume(msgs, route)
                    if ok:
                        for m in msgs:
                            pq.done(m.queue_offset)
                        break
                    if msgs[0].reconsume_times >= self.max_reconsume_times:
                        if self.message_model == MessageModel.BROADCASTING:
                            self._sendback.give_up(pq, msgs)
                        else:
                            await self._sendback.dead_letter_until_done(pq, msgs, route)
                        break
                    for m in msgs:
                        m.reconsume_times += 1
                    pq.end()  # a suspended queue does not hold up its revocation
                    running = False
                    await asyncio.sleep(1.0)  # SUSPEND_CURRENT_QUEUE_A_MOMENT
                    if not self._begin(pq, msgs):
                        break
                    running = True
            finally:
                if running:
                    pq.end()
                self._leave()

    def _begin(self, pq: ProcessQueue, msgs: list[MessageExt]) -> bool:
        """Start a listener call on ``msgs`` unless their queue was revoked; then they are left
        to the queue's next owner (counted) and False is returned."""
        if pq.begin():
            return True
        HANDED_OVER.labels(self.group).inc(len(msgs))
        return False

    def _leave(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    async def _consume(self, msgs: list[MessageExt], route: QueueRoute | None) -> tuple[bool, int]:
        """Run the listener once over ``msgs`` with hooks: (consumed successfully, the
        listener's ``delay_level_when_next_consume``)."""
        assert self._listener is not None
        first = msgs[0]
        queue = first.queue
        cctx = ConsumeContext(queue=queue)
        hooks: list[Any] = self._hooks
        # This runs once per consumed message (one message per call is the default). Without
        # hooks no hook context is built; with only message trace's hook, a one-message call
        # goes to its context-free methods (the same records; ConsumeMessageTraceHook.one_*).
        hctx: ConsumeMessageContext | None = None
        trace: Any = None
        token = None  # (the fast trace path: what trace.after needs; None: not traced)
        if hooks:
            trace = self._trace_hook
            if len(msgs) == 1 and len(hooks) == 1 and trace is not None and hooks[0] is trace:
                region = route.region_id if route else "DefaultRegion"
                # a request id (pairs SubBefore with SubAfter, unique like RocketMQ's
                # createUniqID), the begin time and the SubBefore, in one call
                if route is None or route.trace_on:
                    token = trace.before(first, self.group, region)
            else:
                trace = None
                hctx = ConsumeMessageContext(
                    consumer_group=self.group,
                    messages=msgs,
                    queue=queue,
                    client_host=self._runtime.client_host,
                    region_id=route.region_id if route else "DefaultRegion",
                    trace_on=route.trace_on if route else True,
                    request_ids=(
                        {first.msg_id: new_request_id()}
                        if len(msgs) == 1
                        else {m.msg_id: new_request_id() for m in msgs}
                    ),
                )
                hctx.begin_timestamp = now_ms()
                call_hooks(hooks, "consume_message_before", hctx)
        code = _SUCCESS
        try:
            # (the time-out on the consumer's one deadline timer, not an asyncio timer per
            # call; the same contract as asyncio.timeout: cancelled, then TimeoutError)
            loop = self._loop or asyncio.get_running_loop()
            deadline = self._deadlines.enqueue(loop, loop.time() + self.consume_timeout_s)
            try:
                if self._listener_is_async:
                    status = await self._listener(msgs, cctx)
                else:
                    status = await asyncio.to_thread(self._listener, msgs, cctx)
                    if inspect.isawaitable(status):
                        status = await status
            except asyncio.CancelledError:
                if Deadlines.expired(deadline):
                    raise TimeoutError from None
                raise
            finally:
                Deadlines.done(deadline)
            if status is None:
                code = _RETURNNULL
            elif status not in _SUCCESS_STATUSES:
                code = _FAILED
        except TimeoutError:
            code = _TIME_OUT
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code = _EXCEPTION
            log.warning(
                "listener raised",
                group=self.group,
                error=repr(exc),
                msg_ids=[m.msg_id for m in msgs],
            )
        success = code is _SUCCESS
        if token is not None:
            # (-1: now; the listener may have marked the message done before it returned)
            end = cctx.end_times.get(first.msg_id, -1) if cctx.end_times else -1
            trace.after(token, first, self.group, region, end, success, _CODE_INT[code])
        elif hctx is not None:
            hctx.end_timestamp = now_ms()
            hctx.end_timestamps = cctx.end_times
            hctx.success = success
            hctx.context_code = int(code)
            hctx.status = code.name
            call_hooks(hooks, "consume_message_after", hctx)
        counter = self._outcome_counters.get(code)
        if counter is None:
            counter = self._outcome_counters[code] = CONSUMED.labels(self.group, code.name)
        counter.inc(len(msgs))
        return success, cctx.delay_level_when_next_consume
