"""What a PushConsumer does with a message its listener failed (RocketMQ's ``sendMessageBack``).

CLUSTERING: the message is sent back to the broker that stored it — to its
``SCHEDULE_TOPIC_XXXX`` at level ``3 + reconsume_times`` (capped at the broker's last level;
``ConsumeContext.delay_level_when_next_consume`` > 0 overrides it, < 0 sends the message to the
dead-letter queue at once) with ``REAL_TOPIC=%RETRY%<group>``, ``REAL_QID=0``,
``RECONSUME_TIME`` + 1, ``RETRY_TOPIC`` = its topic, ``ORIGIN_MESSAGE_ID`` and the same msgId —
and its offset counts as consumed only once the broker has acknowledged the send-back. After
``max_reconsume_times`` retries a failure sends it to ``%DLQ%<group>`` (queue 0 of the same
broker) instead, traced as a Pub of the consumer group to that topic. If a send-back (or the
dead-letter write) fails, the message is consumed again locally after
``in_process_retry_delay_ms`` with its reconsume count + 1 (as RocketMQ), and a new failure tries
the broker again: a message is never dropped. The retry and dead-letter topics are asked of
every broker hosting the group's topics (``retry.ensure``), again after
:data:`RETRY_ENSURE_BACKOFF_S` where a broker did not answer.

Orderly listeners (the queue stays suspended) dead-letter with :meth:`SendBack.dead_letter_until_done`.
BROADCASTING mode does not retry (as RocketMQ): a failed message is logged, counted in
``tracemq_consumer_given_up_total`` and dropped (:meth:`SendBack.give_up`).

:mod:`tracemq.consumer.push` (the facade) owns the listener calls; this module only the way back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from tracemq._client import ClientRuntime, ClientSettings, now_ms
from tracemq.consumer._process_queue import ProcessQueue
from tracemq.consumer.listener import MessageModel
from tracemq.errors import NoRouteError
from tracemq.hooks import SendMessageContext, call_hooks
from tracemq.log import get_logger
from tracemq.message import Message, MessageConst, MessageExt, MessageQueue, SendResult, SendStatus
from tracemq.message_id import encode_offset_msg_id
from tracemq.naming import SCHEDULE_TOPIC, dlq_topic, kafka_topic, retry_topic
from tracemq.protocol.forwarding import ROUTING_PROPERTIES
from tracemq.routing import QueueRoute
from tracemq.trace import MessageType

log = get_logger("consumer")

GIVEN_UP = Counter(
    "tracemq_consumer_given_up_total",
    "Failed messages dropped: BROADCASTING mode does not retry (as RocketMQ)",
    ["group"],
)
SENT_BACK = Counter(
    "tracemq_consumer_sent_back_total",
    "Failed messages sent back to the broker for a retry (result: ok, failed)",
    ["group", "result"],
)
DEAD_LETTERED = Counter(
    "tracemq_consumer_dead_lettered_total",
    "Messages moved to %DLQ%<group> after max_reconsume_times retries",
    ["group"],
)

#: RocketMQ: a retry waits ``3 + reconsume_times`` levels (10 s, 30 s, 1 m, ... by default).
RETRY_BASE_LEVEL = 3
SEND_BACK_TIMEOUT_S = 5.0
#: a broker that did not answer ``retry.ensure`` is asked again after this long
RETRY_ENSURE_BACKOFF_S = 60.0

#: runs the listener again on messages whose send-back failed (PushConsumer's one listener call)
ConsumeAgain = Callable[[ProcessQueue, list[MessageExt], QueueRoute | None], Awaitable[None]]


class SendBack:
    """The way back to the broker of one PushConsumer's failed messages (module docstring)."""

    def __init__(
        self,
        group: str,
        *,
        message_model: MessageModel,
        max_reconsume_times: int,
        in_process_retry_delay_ms: int,
        settings: ClientSettings,
        runtime: ClientRuntime,
        consume_again: ConsumeAgain,
    ) -> None:
        self.group = group
        self.message_model = message_model
        self.max_reconsume_times = max_reconsume_times
        self.in_process_retry_delay_ms = in_process_retry_delay_ms
        self.settings = settings
        self.runtime = runtime
        self.consume_again = consume_again
        #: %RETRY%<group>: CLUSTERING only (a BROADCASTING consumer does not retry)
        self.retry_topic: str | None = (
            retry_topic(group) if message_model == MessageModel.CLUSTERING else None
        )
        #: the local re-consumes waiting or running (cancelled at shutdown)
        self.tasks: set[asyncio.Task[None]] = set()
        #: traces the move to the DLQ as a Pub (set when tracing is on)
        self.dlq_trace: Any = None
        self._ready: set[str] = set()  # brokers that created the retry topics
        self._asked: dict[str, float] = {}  # broker -> loop time of the last request

    # -- the retry topics --------------------------------------------------------------------
    async def ensure_retry_topics(self, brokers: set[str]) -> None:
        """Ask the ``brokers`` not asked yet (or not for :data:`RETRY_ENSURE_BACKOFF_S`) to
        create this group's retry and dead-letter topics."""
        now = asyncio.get_running_loop().time()
        ask = {
            b
            for b in brokers - self._ready
            if b not in self._asked or now >= self._asked[b] + RETRY_ENSURE_BACKOFF_S
        }
        if ask:
            self._asked.update(dict.fromkeys(ask, now))
            await self._ensure(ask)

    async def _ensure(self, brokers: set[str]) -> None:
        """Ask ``brokers`` to create this group's retry and dead-letter topics (``retry.ensure``).
        A failure is logged, not raised: the next route sync asks again, and the broker also
        creates a missing retry topic when it first forwards a retry to it."""
        from tracemq.admin import AdminClient

        s = self.settings
        try:
            async with AdminClient(
                s.control_bootstrap,
                s.redis_url,
                redis_prefix=s.redis_prefix,
                timeout_s=10,
                signer=self.runtime.signer,  # a client key may ask for its retry topics
            ) as admin:
                for broker in sorted(brokers):
                    try:
                        await admin.ensure_retry_topics(broker, self.group)
                        self._ready.add(broker)
                    except Exception as exc:
                        log.warning(
                            "retry topics not ensured",
                            group=self.group,
                            broker=broker,
                            error=repr(exc),
                        )
        except Exception as exc:
            log.warning("retry topics not ensured", group=self.group, error=repr(exc))

    # -- failures: send back, dead-letter, local re-consume -------------------------------
    async def failed(
        self, pq: ProcessQueue, msgs: list[MessageExt], route: QueueRoute | None, level: int
    ) -> None:
        """A concurrent listener failed ``msgs``: send each back (or to the DLQ); the offset of
        each is done once the broker has it; the others are consumed again locally."""
        if self.message_model == MessageModel.BROADCASTING:
            self.give_up(pq, msgs)
            return
        again = []
        for m in msgs:
            if pq.dropped:
                return  # the queue moved to another consumer, which will deliver it again
            try:
                await self.send_back(m, route, level)
            except Exception as exc:
                SENT_BACK.labels(self.group, "failed").inc()
                log.warning(
                    "send-back failed; consuming again locally",
                    group=self.group,
                    msg_id=m.msg_id,
                    error=repr(exc),
                )
                again.append(m)
            else:
                pq.done(m.queue_offset)
        if again:
            self._reconsume_later(pq, again, route)

    def _reconsume_later(
        self, pq: ProcessQueue, msgs: list[MessageExt], route: QueueRoute | None
    ) -> None:
        async def again() -> None:
            await asyncio.sleep(self.in_process_retry_delay_ms / 1000)
            for m in msgs:
                m.reconsume_times += 1
            await self.consume_again(pq, msgs, route)

        task = asyncio.create_task(again())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def dead_letter_until_done(
        self, pq: ProcessQueue, msgs: list[MessageExt], route: QueueRoute | None
    ) -> None:
        """Orderly: the queue stays suspended until every message is in the DLQ (or the queue
        is revoked: the next owner then has the messages not written yet)."""
        for m in msgs:
            while True:
                try:
                    await self.send_back(m, route, -1)
                    break
                except Exception as exc:
                    log.warning(
                        "dead-letter write failed; retrying",
                        group=self.group,
                        msg_id=m.msg_id,
                        error=repr(exc),
                    )
                    if pq.dropped:
                        return
                    await asyncio.sleep(self.in_process_retry_delay_ms / 1000)
            pq.done(m.queue_offset)

    def give_up(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        GIVEN_UP.labels(self.group).inc(len(msgs))
        log.error(
            "message failed in BROADCASTING mode; not retried (as RocketMQ)",
            group=self.group,
            msg_ids=[m.msg_id for m in msgs],
        )
        for m in msgs:
            pq.done(m.queue_offset)

    # -- the send-back itself --------------------------------------------------------------
    def back_headers(self, m: MessageExt) -> list[tuple[str, bytes]]:
        props = {k: v for k, v in m.properties.items() if k not in ROUTING_PROPERTIES}
        props[MessageConst.UNIQ_KEY] = m.msg_id
        props[MessageConst.RETRY_TOPIC] = m.topic
        props[MessageConst.ORIGIN_MESSAGE_ID] = (
            props.get(MessageConst.ORIGIN_MESSAGE_ID) or m.msg_id
        )
        props[MessageConst.RECONSUME_TIME] = str(m.reconsume_times + 1)
        props[MessageConst.MAX_RECONSUME_TIMES] = str(self.max_reconsume_times)
        return [(k, v.encode()) for k, v in props.items()]

    async def _delay_levels(self, broker: str) -> int:
        """How many delay levels ``broker``'s schedule service has (0: it has none)."""
        for refresh in (False, True):
            route = await self.runtime.routes.get(SCHEDULE_TOPIC, refresh=refresh)
            for q in route.queues:
                if q.broker == broker and q.writable:
                    return q.write_queues
        return 0

    async def send_back(self, m: MessageExt, route: QueueRoute | None, level: int) -> None:
        """Send ``m`` back to the broker that stored it: to the schedule topic for a retry, or to
        the dead-letter topic (``level < 0`` or retries exhausted). Raises if not acknowledged."""
        if route is None:
            raise NoRouteError(f"no route to the broker of {m.queue}")
        if level < 0 or m.reconsume_times >= self.max_reconsume_times:
            await self._dead_letter(m, route)
            return
        assert self.retry_topic is not None
        levels = await self._delay_levels(route.broker)
        if not levels:
            raise NoRouteError(f"broker {route.broker!r} runs no schedule service")
        level = min(level or RETRY_BASE_LEVEL + m.reconsume_times, levels)
        headers = self.back_headers(m)
        headers += [
            (MessageConst.DELAY, str(level).encode()),
            (MessageConst.REAL_TOPIC, self.retry_topic.encode()),
            (MessageConst.REAL_QID, b"0"),
        ]
        producer = await self.runtime.pool.get(route.data_bootstrap)
        await asyncio.wait_for(
            producer.send_and_wait(
                kafka_topic(route.broker, SCHEDULE_TOPIC),
                m.body,
                partition=level - 1,
                headers=headers,
            ),
            SEND_BACK_TIMEOUT_S,
        )
        SENT_BACK.labels(self.group, "ok").inc()

    async def _dead_letter(self, m: MessageExt, route: QueueRoute) -> None:
        dlq = dlq_topic(self.group)
        routes = self.runtime.routes
        hosted = {q.broker for q in (await routes.get(dlq)).queues}
        if route.broker not in hosted:
            await self._ensure({route.broker})
            hosted = {q.broker for q in (await routes.get(dlq, refresh=True)).queues}
            if route.broker not in hosted:
                raise NoRouteError(f"broker {route.broker!r} has no {dlq!r}")
        ctx = SendMessageContext(
            producer_group=self.group,
            message=Message(dlq, m.body, tags=m.tags, keys=m.key_list),
            msg_id=m.msg_id,
            msg_type=MessageType.Normal_Msg,
            born_host=self.runtime.client_host,
            queue=MessageQueue(dlq, route.broker, 0),
            broker_address=route.address,
            region_id=route.region_id,
            trace_on=route.trace_on,
            begin_timestamp=now_ms(),
        )
        producer = await self.runtime.pool.get(route.data_bootstrap)
        md = await asyncio.wait_for(
            producer.send_and_wait(
                kafka_topic(route.broker, dlq), m.body, partition=0, headers=self.back_headers(m)
            ),
            SEND_BACK_TIMEOUT_S,
        )
        DEAD_LETTERED.labels(self.group).inc()
        log.warning(
            "message moved to the dead-letter queue",
            group=self.group,
            msg_id=m.msg_id,
            topic=m.topic,
            reconsume_times=m.reconsume_times,
        )
        if self.dlq_trace is not None:  # a Pub to %DLQ%<group> tells the trace it ended there
            store_host = await self.runtime.store_host(route.address)
            ctx.end_timestamp = now_ms()
            ctx.send_result = SendResult(
                send_status=SendStatus.SEND_OK,
                msg_id=m.msg_id,
                offset_msg_id=encode_offset_msg_id(store_host, 0, md.offset),
                queue=ctx.queue,  # type: ignore[arg-type]
                queue_offset=md.offset,
                region_id=route.region_id,
                trace_on=route.trace_on,
                store_timestamp=ctx.end_timestamp,
            )
            call_hooks([self.dlq_trace], "send_message_after", ctx)
