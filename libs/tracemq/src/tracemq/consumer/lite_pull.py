"""LitePullConsumer: the application polls; tracemq traces what it polled.

Three ways to trace, by what a consume attempt's cost measures:

* default: SubBefore + SubAfter at poll time, cost 0 — as RocketMQ does (it writes SubAfter
  before the application has processed anything; RocketMQ #4606);
* ``ack_mode=True``: SubBefore at poll, SubAfter when the application calls :meth:`ack` or
  :meth:`nack`, with the real result; the cost runs from poll to ack, so it includes the time a
  message waited behind the rest of its batch;
* ``ack_mode=True, per_message_cost=True``: nothing at poll; SubBefore when the application
  calls :meth:`begin` on a message, SubAfter at its ack/nack: the cost is that message's own
  processing time (:meth:`processing` wraps the three calls around a block).

In ack mode only acknowledged offsets are committed (the lowest unacknowledged offset of a queue
bounds its commit), and a nacked message is returned again by a later poll with its reconsume
count increased.

Offsets outside a queue's log are reset to ``offset_reset`` and counted, as in
:class:`~tracemq.consumer.PushConsumer` (:mod:`tracemq.offset_reset`), and a queue taken away by
a rebalance is committed before it goes, while the commit is still accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from tracemq import kafka_security
from tracemq._client import ClientBase, ClientRuntime, ClientSettings
from tracemq.clock import now_ms
from tracemq.consumer import tags as _tags
from tracemq.consumer._fetch import FETCH_MAX_WAIT_MS
from tracemq.consumer._process_queue import ProcessQueue
from tracemq.consumer._records import to_message_ext
from tracemq.consumer.listener import ConsumeFromWhere
from tracemq.consumer.push import OFFSET_RESETS
from tracemq.errors import ClientStateError, NoRouteError
from tracemq.hooks import ConsumeMessageContext, ConsumeMessageHook, call_hooks
from tracemq.log import get_logger
from tracemq.message import MessageExt, MessageQueue
from tracemq.message_id import new_request_id
from tracemq.naming import kafka_topic, validate_topic
from tracemq.offset_reset import (
    IDLE_CHECK_S,
    KAFKA_AUTO_OFFSET_RESET,
    OffsetGuard,
    OffsetReset,
    OffsetResetPolicy,
)
from tracemq.protocol.control import Subscription
from tracemq.routing import QueueRoute
from tracemq.trace import ConsumeReturnType

log = get_logger("consumer")


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: LitePullConsumer, bootstrap: str) -> None:
        self.owner, self.bootstrap = owner, bootstrap

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.owner._on_revoked(self.bootstrap, revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.owner._guards[self.bootstrap].assigned(assigned)


class LitePullConsumer(ClientBase):
    """``subscribe`` (group-managed queues) or ``assign`` (explicit queues), then ``poll``."""

    kind = "consumer"

    def __init__(
        self,
        group: str,
        *,
        consume_from: ConsumeFromWhere | str = ConsumeFromWhere.LAST_OFFSET,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        pull_batch_size: int = 32,
        ack_mode: bool = False,
        per_message_cost: bool = False,
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
        offset_reset: OffsetResetPolicy | str = OffsetResetPolicy.EARLIEST,
        offset_check_interval_ms: int = int(IDLE_CHECK_S * 1000),
        session_timeout_ms: int | None = None,
        settings: ClientSettings | None = None,
        redis_url: str | None = None,
        control_bootstrap: str | None = None,
        trace_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(group)
        self.consume_from = ConsumeFromWhere(consume_from)
        self.auto_commit = auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.pull_batch_size = pull_batch_size
        self.ack_mode = ack_mode
        if per_message_cost and not ack_mode:
            raise ValueError("per_message_cost=True needs ack_mode=True (its end mark is ack/nack)")
        #: SubBefore at begin(msg), not at poll: the cost is the message's own processing time
        self.per_message_cost = per_message_cost
        if fetch_max_wait_ms < 0:
            raise ValueError(f"fetch_max_wait_ms must be >= 0, got {fetch_max_wait_ms}")
        self.fetch_max_wait_ms = fetch_max_wait_ms
        #: where a queue whose offset is outside its log resumes (tracemq.offset_reset)
        self.offset_reset = OffsetResetPolicy(offset_reset)
        if offset_check_interval_ms < 1:
            raise ValueError(
                f"offset_check_interval_ms must be >= 1, got {offset_check_interval_ms}"
            )
        self.offset_check_interval_s = offset_check_interval_ms / 1000
        self.settings = settings or ClientSettings.from_overrides(redis_url, control_bootstrap)
        #: the group session timeout of subscribe() (``ClientSettings.consumer_session_timeout_ms``
        #: by default)
        self.session_timeout_ms = session_timeout_ms or self.settings.consumer_session_timeout_ms
        self._subs: dict[str, frozenset[str] | None] = {}
        self._expressions: dict[str, str] = {}
        self._assigned: list[MessageQueue] | None = None
        self._runtime = ClientRuntime(
            self.group,
            "consumer",
            self.settings,
            enable_msg_trace=enable_msg_trace,
            trace_topic=trace_topic,
            subscriptions=lambda: [
                Subscription(topic=t, expression=e) for t, e in self._expressions.items()
            ],
            trace_options=trace_options,
        )
        self._hooks: list[ConsumeMessageHook] = []
        self._consumers: dict[str, AIOKafkaConsumer] = {}
        self._guards: dict[str, OffsetGuard] = {}
        self._routes: dict[str, QueueRoute] = {}
        self._positions: dict[tuple[str, TopicPartition], int] = {}
        self._pqs: dict[tuple[str, TopicPartition], ProcessQueue] = defaultdict(ProcessQueue)
        self._pending: dict[str, tuple[ConsumeMessageContext | None, str, TopicPartition]] = {}
        self._redeliver: list[MessageExt] = []
        #: msgIds polled and not yet begun (per_message_cost)
        self._unbegun: set[str] = set()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        validate_topic(topic)
        if self._assigned is not None:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        self._subs[topic] = _tags.parse(expression)
        self._expressions[topic] = expression or "*"

    def register_consume_hook(self, hook: ConsumeMessageHook) -> None:
        self._hooks.append(hook)

    @property
    def trace_dispatcher(self) -> Any:
        return self._runtime.dispatcher

    async def _start(self) -> None:
        await self._runtime.start()
        if self._runtime.dispatcher is not None:
            from tracemq.trace._hooks import ConsumeMessageTraceHook

            self._hooks.append(
                ConsumeMessageTraceHook(self._runtime.dispatcher, self._runtime.trace_topic)
            )
        if self._subs:
            await self._subscribe_all()
        if self.auto_commit:
            self._tasks.spawn(self._auto_commit(), name=f"autocommit-{self.group}")

    async def _stop(self) -> None:
        await self._tasks.aclose()  # no auto-commit racing the last commit
        with contextlib.suppress(Exception):
            await self.commit()
        await self._close()

    async def _close(self) -> None:
        await super()._close()
        for c in self._consumers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), 10)
        for g in self._guards.values():
            await g.close()
        self._consumers.clear()
        await self._runtime.stop()

    def _consumer(self, bootstrap: str) -> AIOKafkaConsumer:
        c = self._consumers.get(bootstrap)
        if c is None:
            c = AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                **kafka_security.client_kwargs(bootstrap),
                group_id=self.group,
                enable_auto_commit=False,
                # the guard positions fresh queues (consume_from) and resets, counted
                auto_offset_reset=KAFKA_AUTO_OFFSET_RESET,
                max_poll_records=self.pull_batch_size,
                fetch_max_wait_ms=self.fetch_max_wait_ms,
                session_timeout_ms=self.session_timeout_ms,
                heartbeat_interval_ms=max(300, self.session_timeout_ms // 5),
            )
            self._consumers[bootstrap] = c
            self._guards[bootstrap] = OffsetGuard(
                c,
                policy=self.offset_reset,
                counter=OFFSET_RESETS,
                labels=(self.group,),
                on_reset=functools.partial(self._on_reset, bootstrap),
                on_fresh=functools.partial(self._position_fresh, bootstrap),
                idle_check_s=self.offset_check_interval_s,
                context={"group": self.group, "bootstrap": bootstrap},
                bootstrap=bootstrap,
            )
        return c

    async def _position_fresh(self, bootstrap: str, tps: list[TopicPartition]) -> None:
        c = self._consumers[bootstrap]
        if self.consume_from == ConsumeFromWhere.FIRST_OFFSET:
            await self._guards[bootstrap].seek_to_start(*tps)
        else:
            await c.seek_to_end(*tps)

    def _on_reset(self, bootstrap: str, tp: TopicPartition, reset: OffsetReset) -> None:
        # the old bookkeeping's commit marks are past the new log: start it again
        self._pqs[(bootstrap, tp)] = ProcessQueue()
        self._positions[(bootstrap, tp)] = reset.target

    async def _on_revoked(self, bootstrap: str, revoked: list[TopicPartition]) -> None:
        """Commit the revoked queues while this member still holds them (after the
        rebalance the commit is refused and their next owner would read them again)."""
        offsets = {}
        for tp in revoked:
            pq = self._pqs.get((bootstrap, tp))
            if pq is not None and (off := pq.commit_offset()) is not None:
                offsets[tp] = off
        if offsets:
            try:
                await self._consumers[bootstrap].commit(offsets)
                self._guards[bootstrap].remember(offsets)
            except Exception as exc:  # noqa: BLE001 - fenced: the next owner reads them again
                log.warning("commit at revocation failed", group=self.group, error=repr(exc))
        for tp in revoked:
            self._pqs.pop((bootstrap, tp), None)

    def offset_resets(self) -> dict[str, Any]:
        """The queue offsets reset since start (found outside their log), per queue."""
        guards = list(self._guards.values())
        return {
            "total": sum(g.total for g in guards),
            "partitions": [r for g in guards for r in g.stats()["partitions"]],
        }

    async def _subscribe_all(self) -> None:
        wanted: dict[str, list[str]] = defaultdict(list)
        for topic in self._subs:
            route = await self._runtime.routes.get(topic)
            if not route.queues:
                raise self._runtime.routes.missing(topic)
            for q in route.queues:
                kt = kafka_topic(q.broker, topic)
                self._routes[kt] = q
                wanted[q.data_bootstrap].append(kt)
        for bootstrap, topics in wanted.items():
            c = self._consumer(bootstrap)
            await kafka_security.start(c, bootstrap)
            c.subscribe(sorted(topics), listener=_Rebalance(self, bootstrap))

    async def assign(self, queues: list[MessageQueue]) -> None:
        """Consume exactly these queues (no group rebalancing)."""
        if self._subs:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        self._check_running()
        self._assigned = list(queues)
        by_cluster: dict[str, list[TopicPartition]] = defaultdict(list)
        for mq in queues:
            route = await self._runtime.routes.require(mq.topic)
            q = next((r for r in route.queues if r.broker == mq.broker), None)
            if q is None:
                raise NoRouteError(f"broker {mq.broker!r} does not host {mq.topic!r}")
            kt = kafka_topic(mq.broker, mq.topic)
            self._routes[kt] = q
            self._subs.setdefault(mq.topic, None)
            by_cluster[q.data_bootstrap].append(TopicPartition(kt, mq.queue_id))
        for bootstrap, tps in by_cluster.items():
            fresh = bootstrap not in self._consumers
            c = self._consumer(bootstrap)
            if fresh:
                await kafka_security.start(c, bootstrap)
            c.assign(tps)
            await self._guards[bootstrap].assigned(tps)

    async def seek(self, queue: MessageQueue, offset: int) -> None:
        kt = kafka_topic(queue.broker, queue.topic)
        route = self._routes.get(kt)
        if route is None:
            raise ClientStateError(f"{queue} is not assigned to this consumer")
        self._consumers[route.data_bootstrap].seek(TopicPartition(kt, queue.queue_id), offset)

    async def poll(self, timeout: float = 5.0) -> list[MessageExt]:
        """Messages that arrived within ``timeout`` seconds (possibly none)."""
        self._check_running()
        out: list[MessageExt] = []
        if self._redeliver:
            out, self._redeliver = (
                self._redeliver[: self.pull_batch_size],
                self._redeliver[self.pull_batch_size :],
            )
        else:
            results = await asyncio.gather(
                *[self._fetch(b, int(timeout * 1000)) for b in self._consumers]
            )
            for (bootstrap, _c), fetched in zip(self._consumers.items(), results, strict=True):
                for tp, records, pq in fetched:
                    route = self._routes.get(tp.topic)
                    store_host = (
                        await self._runtime.store_host(route.address) if route else "0.0.0.0:0"
                    )
                    if self._pqs.get((bootstrap, tp)) is not pq:
                        continue  # revoked (or reset) since the fetch: the new position's
                    for rec in records:
                        self._positions[(bootstrap, tp)] = rec.offset + 1
                        msg = to_message_ext(rec, store_host)
                        if not _tags.matches(self._subs.get(msg.topic), msg.tags):
                            pq.skip(rec.offset)
                            continue
                        if self.ack_mode:
                            pq.add(rec.offset)
                        else:
                            pq.skip(rec.offset)
                        out.append(msg)
                        self._pending[msg.msg_id] = (None, bootstrap, tp)
        for msg in out:
            self._trace_polled(msg)
        return out

    async def _fetch(
        self, bootstrap: str, timeout_ms: int
    ) -> list[tuple[TopicPartition, list[Any], ProcessQueue]]:
        """One cluster's fetch, each queue's records bound to its ProcessQueue the moment they
        arrive (no await in between): a rebalance or reset while the other clusters' fetches
        or the store-host look-ups run replaces the queue, and the records are then left to
        the queue's new position instead of being delivered twice."""
        data = await self._guards[bootstrap].getmany(
            timeout_ms=timeout_ms, max_records=self.pull_batch_size
        )
        return [(tp, records, self._pqs[(bootstrap, tp)]) for tp, records in data.items()]

    def _hook_ctx(self, msg: MessageExt) -> ConsumeMessageContext:
        route = self._routes.get(kafka_topic(msg.queue.broker, msg.queue.topic))
        return ConsumeMessageContext(
            consumer_group=self.group,
            messages=[msg],
            queue=msg.queue,
            client_host=self._runtime.client_host,
            region_id=route.region_id if route else "DefaultRegion",
            trace_on=route.trace_on if route else True,
            request_ids={msg.msg_id: new_request_id()},
            begin_timestamp=now_ms(),
        )

    def _trace_polled(self, msg: MessageExt) -> None:
        if self.per_message_cost:
            self._unbegun.add(msg.msg_id)  # SubBefore waits for begin(msg)
            return
        ctx = self._hook_ctx(msg)
        call_hooks(self._hooks, "consume_message_before", ctx)
        _, bootstrap, tp = self._pending[msg.msg_id]
        if self.ack_mode:
            self._pending[msg.msg_id] = (ctx, bootstrap, tp)
            return
        del self._pending[msg.msg_id]
        ctx.end_timestamp, ctx.success, ctx.context_code = ctx.begin_timestamp, True, 0
        call_hooks(self._hooks, "consume_message_after", ctx)

    def begin(self, msg: MessageExt) -> None:
        """The application starts processing ``msg`` (``per_message_cost=True``): its SubBefore
        is written now, and its ack/nack's SubAfter measures from here."""
        if not self.per_message_cost:
            raise ClientStateError("begin() needs per_message_cost=True")
        if msg.msg_id not in self._unbegun:
            raise ClientStateError(f"message {msg.msg_id} is not waiting to begin (begun twice?)")
        self._unbegun.discard(msg.msg_id)
        _, bootstrap, tp = self._pending[msg.msg_id]
        ctx = self._hook_ctx(msg)
        call_hooks(self._hooks, "consume_message_before", ctx)
        self._pending[msg.msg_id] = (ctx, bootstrap, tp)

    @contextlib.contextmanager
    def processing(self, msg: MessageExt) -> Iterator[MessageExt]:
        """``begin(msg)``, then ``ack(msg)`` when the block ends, ``nack(msg)`` if it raises
        (the exception goes on). Works in ``async`` code too: the marks are plain calls."""
        self.begin(msg)
        try:
            yield msg
        except BaseException:
            self.nack(msg)
            raise
        self.ack(msg)

    def ack(self, msg: MessageExt) -> None:
        """The application processed ``msg`` successfully (ack mode)."""
        self._finish(msg, ConsumeReturnType.SUCCESS)

    def nack(self, msg: MessageExt) -> None:
        """The application failed ``msg``: traced as FAILED, returned again by a later poll."""
        self._finish(msg, ConsumeReturnType.FAILED)

    def _finish(self, msg: MessageExt, code: ConsumeReturnType) -> None:
        if not self.ack_mode:
            raise ClientStateError("ack()/nack() need ack_mode=True")
        entry = self._pending.pop(msg.msg_id, None)
        if entry is None:
            raise ClientStateError(f"message {msg.msg_id} is not pending (already acked?)")
        ctx, bootstrap, tp = entry
        if msg.msg_id in self._unbegun:
            self._pending[msg.msg_id] = entry
            raise ClientStateError(
                f"message {msg.msg_id}: call begin(msg) before ack/nack (per_message_cost=True)"
            )
        if ctx is None:
            raise ClientStateError(f"message {msg.msg_id} is waiting for redelivery, not pending")
        ctx.end_timestamp = now_ms()
        ctx.success = code == ConsumeReturnType.SUCCESS
        ctx.context_code = int(code)
        call_hooks(self._hooks, "consume_message_after", ctx)
        if ctx.success:
            self._pqs[(bootstrap, tp)].done(msg.queue_offset)
        else:
            msg.reconsume_times += 1
            self._pending[msg.msg_id] = (None, bootstrap, tp)
            self._redeliver.append(msg)

    async def commit(self) -> None:
        """Commit what was polled (or, in ack mode, what was acknowledged)."""
        per: dict[str, dict[TopicPartition, int]] = defaultdict(dict)
        for (bootstrap, tp), pq in self._pqs.items():
            off = pq.commit_offset()
            if off is not None:
                per[bootstrap][tp] = off
        for bootstrap, offsets in per.items():
            await self._consumers[bootstrap].commit(offsets)
            for tp, off in offsets.items():
                self._pqs[(bootstrap, tp)].committed(off)
            self._guards[bootstrap].remember(offsets)

    async def committed(self, queue: MessageQueue) -> int | None:
        kt = kafka_topic(queue.broker, queue.topic)
        route = self._routes[kt]
        return await self._consumers[route.data_bootstrap].committed(
            TopicPartition(kt, queue.queue_id)
        )

    async def _auto_commit(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_ms / 1000)
            with contextlib.suppress(Exception):
                await self.commit()
