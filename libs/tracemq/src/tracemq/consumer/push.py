"""PushConsumer: consumes every broker hosting the subscribed topics and calls a listener.

One Kafka consumer per data cluster (group id = the consumer group in CLUSTERING mode; a
per-instance group in BROADCASTING mode, so every instance gets every message and keeps its own
offsets). Offsets are committed only after the listener's result: the committed offset of a
queue is the lowest offset still in flight. A failed message (RECONSUME_LATER, an exception, a
None result or a time-out) is redelivered in-process until the broker's retry service exists;
every attempt is traced with its retry count.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import uuid
from collections import defaultdict
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from prometheus_client import Counter

from tracemq._client import ClientRuntime, ClientSettings, now_ms
from tracemq.consumer import _tags
from tracemq.consumer._process_queue import ProcessQueue
from tracemq.consumer._records import to_message_ext
from tracemq.consumer.listener import (
    ConcurrentlyListener,
    ConsumeConcurrentlyStatus,
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageModel,
    OrderlyListener,
)
from tracemq.errors import ClientStateError, NoRouteError
from tracemq.hooks import ConsumeMessageContext, ConsumeMessageHook, call_hooks
from tracemq.log import get_logger
from tracemq.message import MessageExt
from tracemq.naming import kafka_topic, validate_group, validate_topic
from tracemq.protocol.control import Subscription
from tracemq.routing import QueueRoute
from tracemq.trace import ConsumeReturnType

log = get_logger("consumer")

CONSUMED = Counter("tracemq_consumer_messages_total", "Listener outcomes", ["group", "result"])
GIVEN_UP = Counter(
    "tracemq_consumer_given_up_total",
    "Messages that failed max_reconsume_times+1 times (no DLQ yet)",
    ["group"],
)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: _ClusterConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.owner.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.owner.on_assigned(assigned)


class _ClusterConsumer:
    """The Kafka consumer of one data cluster and its fetch loop."""

    def __init__(self, parent: PushConsumer, bootstrap: str, topics: set[str]) -> None:
        self.parent = parent
        self.bootstrap = bootstrap
        self.topics = topics
        self.pqs: dict[TopicPartition, ProcessQueue] = {}
        self.paused: set[TopicPartition] = set()
        p = parent
        group_id = (
            p.group
            if p.message_model == MessageModel.CLUSTERING
            else f"{p.group}.broadcast.{p._runtime.client_host}.{p.settings.instance_name}"
        )
        reset = "earliest" if p.consume_from == ConsumeFromWhere.FIRST_OFFSET else "latest"
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset=reset,
            max_poll_records=p.pull_batch_size,
            session_timeout_ms=p.session_timeout_ms,
            heartbeat_interval_ms=max(300, p.session_timeout_ms // 5),
            metadata_max_age_ms=30_000,
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(sorted(self.topics), listener=_Rebalance(self))
        self.task = asyncio.create_task(self._loop(), name=f"consume-{self.parent.group}")

    def resubscribe(self, topics: set[str]) -> None:
        if topics != self.topics:
            self.topics = topics
            self.consumer.subscribe(sorted(topics), listener=_Rebalance(self))

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        with contextlib.suppress(Exception):
            await self.commit()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.consumer.stop(), 10)

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            self.pqs[tp] = ProcessQueue()
        if self.parent.consume_from != ConsumeFromWhere.TIMESTAMP:
            return
        fresh = [tp for tp in assigned if await self.consumer.committed(tp) is None]
        if fresh:
            ts = self.parent.consume_timestamp_ms or now_ms() - 30 * 60 * 1000
            found = await self.consumer.offsets_for_times({tp: ts for tp in fresh})
            for tp in fresh:
                hit = found.get(tp)
                if hit is not None:
                    self.consumer.seek(tp, hit.offset)
                else:
                    await self.consumer.seek_to_end(tp)

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        with contextlib.suppress(Exception):
            await self.commit()
        for tp in revoked:
            pq = self.pqs.pop(tp, None)
            if pq is not None:
                pq.dropped = True
            self.paused.discard(tp)

    async def commit(self) -> None:
        offsets = {}
        for tp, pq in self.pqs.items():
            off = pq.commit_offset()
            if off is not None:
                offsets[tp] = off
        if offsets:
            await self.consumer.commit(offsets)
            for tp, off in offsets.items():
                self.pqs[tp].committed(off)

    async def _loop(self) -> None:
        p = self.parent
        loop = asyncio.get_running_loop()
        last_commit = loop.time()
        while True:
            data = await self.consumer.getmany(timeout_ms=200, max_records=p.pull_batch_size)
            for tp, records in data.items():
                pq = self.pqs.get(tp)
                if pq is None:
                    continue
                route = p._route_for(tp.topic)
                store_host = await p._runtime.store_host(route.address) if route else "0.0.0.0:0"
                batch: list[MessageExt] = []
                for rec in records:
                    msg = to_message_ext(rec, store_host)
                    tags = p._subscriptions.get(msg.topic)
                    if msg.topic not in p._subscriptions or not _tags.matches(tags, msg.tags):
                        pq.skip(rec.offset)
                        continue
                    pq.add(rec.offset)
                    batch.append(msg)
                    if len(batch) >= p.consume_message_batch_max_size:
                        await p._dispatch(self, tp, pq, batch, route)
                        batch = []
                if batch:
                    await p._dispatch(self, tp, pq, batch, route)
                if len(pq) >= p.pull_threshold_per_queue and tp not in self.paused:
                    self.consumer.pause(tp)
                    self.paused.add(tp)
            for tp in list(self.paused):
                pq = self.pqs.get(tp)
                if pq is None or len(pq) < p.pull_threshold_per_queue // 2:
                    with contextlib.suppress(Exception):
                        self.consumer.resume(tp)
                    self.paused.discard(tp)
            if loop.time() - last_commit >= p.commit_interval_ms / 1000:
                try:
                    await self.commit()
                except Exception as exc:  # a rebalance in progress; the next commit catches up
                    log.debug("commit failed", error=repr(exc))
                last_commit = loop.time()


class PushConsumer:
    """Subscribe, register a listener, start. See the module docstring for the guarantees."""

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
        session_timeout_ms: int = 10_000,
        settings: ClientSettings | None = None,
        redis_url: str | None = None,
        control_bootstrap: str | None = None,
        trace_options: dict[str, Any] | None = None,
    ) -> None:
        self.group = validate_group(group)
        self.message_model = MessageModel(message_model)
        self.consume_from = ConsumeFromWhere(consume_from)
        self.consume_timestamp_ms = consume_timestamp_ms
        if consume_concurrency < 1 or consume_message_batch_max_size < 1:
            raise ValueError("consume_concurrency and consume_message_batch_max_size must be >= 1")
        self.consume_concurrency = consume_concurrency
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.max_reconsume_times = max_reconsume_times
        self.consume_timeout_s = consume_timeout_minutes * 60
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_per_queue = pull_threshold_per_queue
        self.in_process_retry_delay_ms = in_process_retry_delay_ms
        self.commit_interval_ms = commit_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.settings = settings or ClientSettings.from_overrides(redis_url, control_bootstrap)
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
        self._clusters: dict[str, _ClusterConsumer] = {}
        self._routes: dict[str, QueueRoute] = {}  # kafka topic -> broker route
        self._work: asyncio.Queue[tuple[Any, ...]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._orderly_queues: dict[TopicPartition, asyncio.Queue[tuple[Any, ...]]] = {}
        self._orderly_tasks: dict[TopicPartition, asyncio.Task[None]] = {}
        self._retry_tasks: set[asyncio.Task[None]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._state = "created"
        self._in_flight = 0
        self._listener_is_async = False
        self._outcome_counters: dict[ConsumeReturnType, Any] = {}
        self._idle = asyncio.Event()

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

    @property
    def client_id(self) -> str:
        return self._runtime.client_id

    @property
    def trace_dispatcher(self) -> Any:
        return self._runtime.dispatcher

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._state != "created":
            raise ClientStateError(f"consumer {self.group!r} is {self._state}; create a new one")
        if not self._subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        self._state = "starting"
        try:
            await self._runtime.start()
            if self._runtime.dispatcher is not None:
                from tracemq.trace._hooks import ConsumeMessageTraceHook

                self._hooks.append(
                    ConsumeMessageTraceHook(self._runtime.dispatcher, self._runtime.trace_topic)
                )
            self._work = asyncio.Queue(maxsize=self.consume_concurrency * 2)
            if not self._orderly:
                self._workers = [self._spawn_worker(i) for i in range(self.consume_concurrency)]
            await self._sync_clusters(initial=True)
            self._watch_task = asyncio.create_task(self._watch_routes(), name="route-watch")
        except BaseException:
            self._state = "shutdown"
            await self._close()
            raise
        self._state = "running"

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop fetching, let running listeners finish (bounded), commit, flush traces, close."""
        if self._state in ("created", "shutdown"):
            self._state = "shutdown"
            return
        self._state = "shutdown"
        if self._watch_task:
            self._watch_task.cancel()
        for cc in self._clusters.values():
            if cc.task:
                cc.task.cancel()
        if self._in_flight:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout_s)
        await self._close()

    async def _close(self) -> None:
        for t in [*self._workers, *self._orderly_tasks.values(), *self._retry_tasks]:
            t.cancel()
        for t in [*self._workers, *self._orderly_tasks.values(), *self._retry_tasks]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._watch_task:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
        for cc in self._clusters.values():
            await cc.stop()
        self._clusters.clear()
        await self._runtime.stop()

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- routes ----------------------------------------------------------------------------
    def _route_for(self, ktopic: str) -> QueueRoute | None:
        return self._routes.get(ktopic)

    async def _sync_clusters(self, *, initial: bool = False) -> None:
        wanted: dict[str, set[str]] = defaultdict(set)
        routes: dict[str, QueueRoute] = {}
        for topic in self._subscriptions:
            route = await self._runtime.routes.get(topic)
            if not route.queues and initial:
                raise NoRouteError(f"no route for topic {topic!r}: no live broker hosts it")
            for q in route.queues:
                if not q.readable:
                    continue
                kt = kafka_topic(q.broker, topic)
                wanted[q.data_bootstrap].add(kt)
                routes[kt] = q
        self._routes.update(routes)
        for bootstrap, topics in wanted.items():
            cc = self._clusters.get(bootstrap)
            if cc is None:
                cc = _ClusterConsumer(self, bootstrap, topics)
                self._clusters[bootstrap] = cc
                await cc.start()
            else:
                cc.resubscribe(topics)

    async def _watch_routes(self) -> None:
        changes = self._runtime.routes.subscribe_changes()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changes.get(), 5.0)
            try:
                await self._sync_clusters()
            except Exception as exc:
                log.warning("subscription refresh failed", group=self.group, error=repr(exc))

    # -- dispatch --------------------------------------------------------------------------
    async def _dispatch(
        self,
        cc: _ClusterConsumer,
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
        log.error("listener worker died; restarting it", group=self.group,
                  error=repr(task.exception()))
        if i < len(self._workers):
            self._workers[i] = self._spawn_worker(i)

    async def _worker(self) -> None:
        assert self._work is not None
        while True:
            cc, tp, pq, msgs, route = await self._work.get()
            self._in_flight += 1
            try:
                ok = await self._consume(msgs, route)
                if ok:
                    for m in msgs:
                        pq.done(m.queue_offset)
                else:
                    self._retry_later(pq, msgs, route)
            finally:
                self._leave()

    async def _orderly_worker(self, q: asyncio.Queue[tuple[Any, ...]]) -> None:
        while True:
            cc, tp, pq, msgs, route = await q.get()
            self._in_flight += 1
            try:
                while True:
                    if pq.dropped:
                        break
                    ok = await self._consume(msgs, route)
                    if ok:
                        for m in msgs:
                            pq.done(m.queue_offset)
                        break
                    if msgs[0].reconsume_times >= self.max_reconsume_times:
                        self._give_up(pq, msgs)
                        break
                    for m in msgs:
                        m.reconsume_times += 1
                    await asyncio.sleep(1.0)  # SUSPEND_CURRENT_QUEUE_A_MOMENT
            finally:
                self._leave()

    def _leave(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    def _retry_later(
        self, pq: ProcessQueue, msgs: list[MessageExt], route: QueueRoute | None
    ) -> None:
        if msgs[0].reconsume_times >= self.max_reconsume_times:
            self._give_up(pq, msgs)
            return

        async def again() -> None:
            await asyncio.sleep(self.in_process_retry_delay_ms / 1000)
            for m in msgs:
                m.reconsume_times += 1
            self._in_flight += 1
            try:
                if pq.dropped:
                    return
                if await self._consume(msgs, route):
                    for m in msgs:
                        pq.done(m.queue_offset)
                else:
                    self._retry_later(pq, msgs, route)
            finally:
                self._leave()

        task = asyncio.create_task(again())
        self._retry_tasks.add(task)
        task.add_done_callback(self._retry_tasks.discard)

    def _give_up(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        GIVEN_UP.labels(self.group).inc(len(msgs))
        log.error(
            "message failed max_reconsume_times; giving up (no DLQ yet)",
            group=self.group,
            msg_ids=[m.msg_id for m in msgs],
        )
        for m in msgs:
            pq.done(m.queue_offset)

    async def _consume(self, msgs: list[MessageExt], route: QueueRoute | None) -> bool:
        """Run the listener once over ``msgs`` with hooks; True when consumed successfully."""
        assert self._listener is not None
        queue = msgs[0].queue
        cctx = ConsumeContext(queue=queue)
        hctx = ConsumeMessageContext(
            consumer_group=self.group,
            messages=msgs,
            queue=queue,
            client_host=self._runtime.client_host,
            region_id=route.region_id if route else "DefaultRegion",
            trace_on=route.trace_on if route else True,
            # request ids pair SubBefore with SubAfter; only hooks need them
            request_ids={m.msg_id: uuid.uuid4().hex for m in msgs} if self._hooks else {},
        )
        hctx.begin_timestamp = now_ms()
        call_hooks(self._hooks, "consume_message_before", hctx)
        code = ConsumeReturnType.SUCCESS
        try:
            async with asyncio.timeout(self.consume_timeout_s):  # no extra task per call
                if self._listener_is_async:
                    status = await self._listener(msgs, cctx)
                else:
                    status = await asyncio.to_thread(self._listener, msgs, cctx)
                    if inspect.isawaitable(status):
                        status = await status
            if status is None:
                code = ConsumeReturnType.RETURNNULL
            elif status in (
                ConsumeConcurrentlyStatus.CONSUME_SUCCESS,
                ConsumeOrderlyStatus.SUCCESS,
            ):
                code = ConsumeReturnType.SUCCESS
            else:
                code = ConsumeReturnType.FAILED
        except TimeoutError:
            code = ConsumeReturnType.TIME_OUT
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code = ConsumeReturnType.EXCEPTION
            log.warning(
                "listener raised",
                group=self.group,
                error=repr(exc),
                msg_ids=[m.msg_id for m in msgs],
            )
        hctx.end_timestamp = now_ms()
        hctx.end_timestamps = cctx.end_times
        hctx.success = code == ConsumeReturnType.SUCCESS
        hctx.context_code = int(code)
        hctx.status = code.name
        call_hooks(self._hooks, "consume_message_after", hctx)
        counter = self._outcome_counters.get(code)
        if counter is None:
            counter = self._outcome_counters[code] = CONSUMED.labels(self.group, code.name)
        counter.inc(len(msgs))
        return hctx.success
