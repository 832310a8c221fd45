"""The Producer: sends messages to the queues of a topic's brokers, with message trace.

A send picks a writable queue round robin (skipping brokers that just failed), writes one Kafka
record to partition ``queue_id`` of ``<broker>.<topic>`` on that broker's cluster, and retries
on another queue — preferably another broker — with the same msgId (``retry_times_when_send_failed``,
2 by default). The send hooks run once per attempt, as in RocketMQ: a send that took three
attempts leaves three Pub traces with one msgId, the failed ones with ``success=false`` and no
storeHost (nothing was stored). Every message of :meth:`Producer.send_batch` keeps its own msgId
and its own Pub trace (RocketMQ cannot trace batch members).

Message size: one limit, ``max_message_size`` (at most and by default
:data:`~tracemq._kafka.MAX_MESSAGE_SIZE`, 4 MiB, RocketMQ's default), checked once before
anything is sent against the size of the Kafka record as the transport counts it — body,
properties, keys, tags and the headers tracemq adds. A message over it is refused with
:class:`~tracemq.message.InvalidMessageError` naming the size and the limit, and is not traced.
Every Kafka producer of tracemq and every topic it creates accept that limit plus room for the
headers of later re-writes (retry, dead letter, scheduled delivery), so a message that passes the
check is never refused by the transport for its size.

Delayed messages (``Message.delay_level = n > 0``): the real queue is chosen as usual among the
brokers that run a schedule service with at least ``n`` levels (the route of
``SCHEDULE_TOPIC_XXXX`` tells which, and how many levels each has); the record goes to partition
``n - 1`` of that *same* broker's ``SCHEDULE_TOPIC_XXXX`` with the properties ``DELAY``,
``REAL_TOPIC`` and ``REAL_QID``, and the broker delivers it to the real queue when due, with the
same msgId. A level beyond every candidate broker's levels is refused with
:class:`~tracemq.message.InvalidMessageError`. The Pub trace has msgType ``Delay_Msg``. The
:class:`SendResult` describes the record where it is stored until due, like RocketMQ's (whose
queueId is ``level - 1``): ``queue`` is ``SCHEDULE_TOPIC_XXXX@<broker>#<level-1>``, and
``queue_offset`` / ``offset_msg_id`` are that record's; where it will be delivered is
``(msg.topic, queue.broker, REAL_QID)``. Batches cannot be delayed (as in RocketMQ).

Recall (RocketMQ 5.3): a delayed send's result carries ``recall_handle``;
``await producer.recall(topic, handle)`` asks the broker not to deliver the message. The
request is a record on the message's own schedule queue (so it is durable on the broker's data
cluster and always read after its target); the broker answers on ``tracemq.admin.reply``. It
returns a :class:`~tracemq.producer.recall.RecallResult`: ``RECALLED``, ``ALREADY_RECALLED``
(a repeat is one recall) or ``TOO_LATE`` (delivered, or its delivery started); it raises
:class:`~tracemq.protocol.recall.RecallHandleError` for a handle it cannot decode or of another
topic, :class:`~tracemq.producer.recall.RecallError` when the broker knows no such message, and
:class:`~tracemq.producer.recall.RecallTimeoutError` without an answer. With message trace, each
answer is traced as a Recall record (``success`` = the message is recalled), as RocketMQ's
recall trace hook does.

Half messages of :class:`~tracemq.producer.transaction.TransactionProducer` take the same path
to ``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0) with ``TRAN_MSG=true``; see that module.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aiokafka.structs import RecordMetadata, TopicPartition

from tracemq._client import ClientBase, ClientRuntime, ClientSettings
from tracemq._deadlines import Deadlines
from tracemq._kafka import MAX_MESSAGE_SIZE, record_size
from tracemq.clock import now_ms
from tracemq.errors import BatchSendError, SendError
from tracemq.hooks import SendMessageContext, SendMessageHook, call_hooks
from tracemq.log import get_logger
from tracemq.message import (
    InvalidMessageError,
    Message,
    MessageConst,
    MessageQueue,
    SendResult,
    SendStatus,
)
from tracemq.message_id import encode_offset_msg_id, msg_id_source, new_msg_id
from tracemq.naming import HALF_TOPIC, SCHEDULE_TOPIC, kafka_topic
from tracemq.producer._fault import FaultTolerance
from tracemq.producer.recall import (
    RecallError,
    RecallResult,
    RecallStatus,
    RecallTimeoutError,
    ReplyListener,
)
from tracemq.protocol import recall as recall_proto
from tracemq.routing import QueueRoute, TopicRoute
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType

if TYPE_CHECKING:
    from tracemq.trace._hooks import SendMessageTraceHook

log = get_logger("producer")

MessageQueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]
# (enum members read once: a class attribute look-up on an Enum is slow, and these are per send)
_NORMAL_MSG, _ORDER_MSG = MessageType.Normal_Msg, MessageType.Order_Msg
_SEND_OK = SendStatus.SEND_OK
DEFAULT_MAX_MESSAGE_SIZE = MAX_MESSAGE_SIZE


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where a message is physically written, and the queue its SendResult reports."""

    ktopic: str
    partition: int
    queue: MessageQueue
    headers: tuple[tuple[str, bytes], ...] = ()
    tp: TopicPartition = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp", TopicPartition(self.ktopic, self.partition))


@dataclass(frozen=True, slots=True, eq=False)
class _TopicPlan:
    """What every plain send to one topic needs, worked out once per route: the writable queues
    and their placements. A route change brings a new TopicRoute object from the route cache,
    and so a new plan (``route is not cached``); the send path itself reads no route."""

    route: TopicRoute | None
    queues: list[tuple[QueueRoute, int]]
    places: list[_Placement]


class Producer(ClientBase):
    """Sends messages; ``enable_msg_trace=True`` records a Pub trace for every message.

    Connection settings come from ``TRACEMQ_REDIS_URL`` / ``TRACEMQ_CONTROL_BOOTSTRAP`` (or pass
    ``redis_url`` / ``control_bootstrap``, or a whole :class:`ClientSettings`).
    """

    kind = "producer"

    def __init__(
        self,
        group: str,
        *,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        settings: ClientSettings | None = None,
        redis_url: str | None = None,
        control_bootstrap: str | None = None,
        send_msg_timeout_ms: int = 3000,
        retry_times_when_send_failed: int = 2,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        fault_isolation_ms: int = 30_000,
        trace_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(group)
        self.settings = settings or ClientSettings.from_overrides(redis_url, control_bootstrap)
        self.send_msg_timeout_ms = send_msg_timeout_ms
        self.retry_times_when_send_failed = retry_times_when_send_failed
        if type(max_message_size) is not int or not 0 < max_message_size <= MAX_MESSAGE_SIZE:
            raise ValueError(
                f"max_message_size must be an int in 1..{MAX_MESSAGE_SIZE} (the largest record "
                f"tracemq's Kafka producers and topics accept), got {max_message_size!r}"
            )
        self.max_message_size = max_message_size
        self._runtime = ClientRuntime(
            self.group,
            "producer",
            self.settings,
            enable_msg_trace=enable_msg_trace,
            trace_topic=trace_topic,
            trace_options=trace_options,
        )
        self._faults = FaultTolerance(fault_isolation_ms)
        self._hooks: list[SendMessageHook] = []
        #: message trace's hook (also in _hooks) while it runs: with no other send hook, a send
        #: calls its SendMessageTraceHook.one_pub directly (no SendMessageContext per attempt)
        self._trace_hook: SendMessageTraceHook | None = None
        # the hooks whose send_message_before does something (a hook says it does not with
        # ``observes_send_before = False``: the trace hook, whose Pub is written after the send)
        self._before_hooks: list[SendMessageHook] = []
        self._rr = 0
        self._plans: dict[str, _TopicPlan] = {}
        self._deadlines = Deadlines()
        # the headers every record of this producer carries after UNIQ_KEY and BORN_TIMESTAMP
        self._born_headers = (
            (MessageConst.BORN_HOST, self._runtime.client_host.encode()),
            (MessageConst.PRODUCER_GROUP, self.group.encode()),
        )
        # The record size of a plain message (no tags, keys or properties) with an empty body,
        # at the largest its headers and length fields get: one with a body within the limit
        # less this needs no exact size estimate.
        self._plain_room = (
            self.max_message_size
            - 16
            - record_size(
                b"",
                [
                    (MessageConst.UNIQ_KEY, b"0" * 56),
                    (MessageConst.BORN_TIMESTAMP, b"9" * 20),
                    *self._born_headers,
                ],
            )
        )
        self._next_msg_id = msg_id_source()
        self._born_ms, self._born_text = -1, b""  # BORN_TIMESTAMP of the last send, rendered
        # The loop it was started in, where its Kafka producers live (aiokafka's are bound to
        # theirs): a send reads it here, as CPython's running-loop look-up makes a getpid()
        # system call each time. None before start: the running loop then.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replies: ReplyListener | None = None
        self._recall_lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._runtime.start()
        if self._runtime.dispatcher is not None:
            from tracemq.trace._hooks import SendMessageTraceHook

            self._trace_hook = SendMessageTraceHook(
                self._runtime.dispatcher, self._runtime.trace_topic
            )
            self.register_send_hook(self._trace_hook)

    async def shutdown(self, trace_timeout_s: float = 5.0) -> None:
        """Stop sending; flush what is buffered and the trace dispatcher (bounded), then close."""
        if self._begin_shutdown():
            await self._stop(trace_timeout_s)

    async def _stop(self, trace_timeout_s: float = 5.0) -> None:
        await self._tasks.aclose()
        if self._replies is not None:
            await self._replies.stop()
        for p in list(self._runtime.pool._producers.values()):
            await p.flush()
        await self._close(trace_timeout_s)

    async def _close(self, trace_timeout_s: float = 5.0) -> None:
        self._deadlines.close()
        await super()._close()
        await self._runtime.stop(trace_timeout_s)

    def _only_trace_hook(self) -> SendMessageTraceHook | None:
        """Message trace's hook when it is the only send hook, else None."""
        hooks = self._hooks
        if len(hooks) == 1 and hooks[0] is self._trace_hook:
            return self._trace_hook
        return None

    def register_send_hook(self, hook: SendMessageHook) -> None:
        self._hooks.append(hook)
        if getattr(hook, "observes_send_before", True):
            self._before_hooks.append(hook)

    @property
    def client_id(self) -> str:
        return self._runtime.client_id

    @property
    def trace_dispatcher(self) -> Any:
        return self._runtime.dispatcher

    # -- sending ---------------------------------------------------------------------------
    def _check(self, msg: object) -> Message:
        self._check_running()
        if not isinstance(msg, Message):
            raise InvalidMessageError(f"expected a tracemq.Message, got {type(msg).__name__}")
        if len(msg.body) > self.max_message_size:  # early and cheap: the record is larger still
            raise InvalidMessageError(
                f"body of {len(msg.body)} bytes exceeds max_message_size {self.max_message_size}"
            )
        if not msg.body:
            raise InvalidMessageError("body is empty")
        return msg

    def _check_size(self, msg: Message, headers: Sequence[tuple[str, bytes]]) -> int:
        """Refuse a record the limit does not admit; ``headers`` are all the record will carry."""
        size = record_size(msg.body, headers)
        if size > self.max_message_size:
            raise InvalidMessageError(
                f"message to {msg.topic!r} is {size} bytes as a Kafka record (body "
                f"{len(msg.body)}, properties and headers {size - len(msg.body)}), which exceeds "
                f"max_message_size {self.max_message_size}"
            )
        return size

    def _check_placed_size(
        self,
        msg: Message,
        headers: list[tuple[str, bytes]],
        queues: list[tuple[QueueRoute, int]],
        half: bool = False,
    ) -> None:
        """Check with the largest placement headers any candidate queue would add (a retry may
        land on another queue), so that the check holds for every attempt. A plain message's
        placement adds none; a delayed or half message's differ only in REAL_QID, longest for
        the highest queue id."""
        if not half and not msg.delay_level:
            if len(msg.body) <= self._plain_room and not (msg.tags or msg.keys or msg.properties):
                return  # well within the limit whatever the headers' exact sizes
            self._check_size(msg, headers)
            return
        q, i = max(queues, key=lambda qi: qi[1])
        self._check_size(msg, [*headers, *self._place(q, i, msg, half=half).headers])

    async def _queues(
        self, topic: str, *, delay_level: int = 0, half: bool = False
    ) -> tuple[TopicRoute, list[tuple[QueueRoute, int]]]:
        route = await self._runtime.routes.require(topic)
        queues = [(q, i) for q in route.queues if q.writable for i in range(q.write_queues)]
        if not queues:
            route = await self._runtime.routes.require(topic, refresh=True)
            queues = [(q, i) for q in route.queues if q.writable for i in range(q.write_queues)]
        if not queues:
            raise SendError(f"topic {topic!r} has no writable queue")
        if delay_level:
            levels = await self._service_brokers(SCHEDULE_TOPIC, {q.broker for q, _ in queues})
            if not levels:
                raise SendError(
                    f"no broker hosting {topic!r} runs a schedule service; "
                    "a delayed message needs one"
                )
            if delay_level > max(levels.values()):
                raise InvalidMessageError(
                    f"delay_level {delay_level} is out of range: the brokers hosting {topic!r} "
                    f"have {max(levels.values())} delay levels"
                )
            queues = [(q, i) for q, i in queues if levels.get(q.broker, 0) >= delay_level]
        if half:
            hosts = await self._service_brokers(HALF_TOPIC, {q.broker for q, _ in queues})
            queues = [(q, i) for q, i in queues if q.broker in hosts]
            if not queues:
                raise SendError(
                    f"no broker hosting {topic!r} runs a transaction service; "
                    "a transactional message needs one"
                )
        return route, queues

    async def _service_brokers(self, system_topic: str, brokers: set[str]) -> dict[str, int]:
        """Brokers among ``brokers`` hosting ``system_topic`` (a broker service), with their
        writable queue count (for the schedule topic: the number of delay levels)."""

        def hosts(route: TopicRoute) -> dict[str, int]:
            return {
                q.broker: q.write_queues for q in route.queues if q.writable and q.broker in brokers
            }

        found = hosts(await self._runtime.routes.get(system_topic))
        if not found:  # route changes refresh the cache; only an empty answer is re-read
            found = hosts(await self._runtime.routes.get(system_topic, refresh=True))
        return found

    def _place(self, q: QueueRoute, qid: int, msg: Message, *, half: bool = False) -> _Placement:
        if half:
            return _Placement(
                kafka_topic(q.broker, HALF_TOPIC),
                0,
                MessageQueue(HALF_TOPIC, q.broker, 0),
                (
                    (MessageConst.TRAN_MSG, b"true"),
                    (MessageConst.REAL_TOPIC, msg.topic.encode()),
                    (MessageConst.REAL_QID, str(qid).encode()),
                ),
            )
        if msg.delay_level:
            level = msg.delay_level
            return _Placement(
                kafka_topic(q.broker, SCHEDULE_TOPIC),
                level - 1,
                MessageQueue(SCHEDULE_TOPIC, q.broker, level - 1),
                (
                    (MessageConst.DELAY, str(level).encode()),
                    (MessageConst.REAL_TOPIC, msg.topic.encode()),
                    (MessageConst.REAL_QID, str(qid).encode()),
                ),
            )
        return _Placement(
            kafka_topic(q.broker, msg.topic), qid, MessageQueue(msg.topic, q.broker, qid)
        )

    def _pick(self, queues: list[tuple[QueueRoute, int]], avoid: str | None) -> int:
        """The index in ``queues`` of the next queue, round robin, skipping ``avoid`` and
        brokers that just failed."""
        n = len(queues)
        rr = self._rr
        faults = self._faults
        if avoid is None and faults.none_failed():  # the usual case: plain round robin
            self._rr = rr = rr + 1 if rr + 1 < n else 0
            return rr
        for _ in range(n):
            rr = rr + 1 if rr + 1 < n else 0
            broker = queues[rr][0].broker
            if broker != avoid and faults.available(broker):
                self._rr = rr
                return rr
        for _ in range(n):  # every broker is suspect: take any other broker, then anything
            rr = rr + 1 if rr + 1 < n else 0
            if queues[rr][0].broker != avoid:
                break
        self._rr = rr
        return rr

    async def _plan(self, topic: str) -> _TopicPlan:
        """The plan of plain sends to ``topic`` (see :class:`_TopicPlan`)."""
        plan = self._plans.get(topic)
        if plan is not None and plan.route is self._runtime.routes.cached(topic):
            return plan
        route, queues = await self._queues(topic)
        places = [
            _Placement(kafka_topic(q.broker, topic), i, MessageQueue(topic, q.broker, i))
            for q, i in queues
        ]
        plan = _TopicPlan(route, queues, places)
        if len(self._plans) >= 4096:  # bounded: a producer of many topics re-plans the rest
            self._plans.clear()
        self._plans[topic] = plan
        return plan

    def _headers(self, msg: Message, msg_id: str, born_ms: int) -> list[tuple[str, bytes]]:
        if born_ms != self._born_ms:  # (rendered once per millisecond: sends share it)
            self._born_ms, self._born_text = born_ms, str(born_ms).encode()
        h = [
            (MessageConst.UNIQ_KEY, msg_id.encode()),
            (MessageConst.BORN_TIMESTAMP, self._born_text),
            *self._born_headers,
        ]
        if msg.tags:
            h.append((MessageConst.TAGS, msg.tags.encode()))
        if msg.keys:
            h.append((MessageConst.KEYS, (msg.keys_str or "").encode()))
        if msg.properties:
            h.extend((k, v.encode()) for k, v in msg.properties.items())
        return h

    async def _produce(
        self, q: QueueRoute, place: _Placement, msg: Message, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[RecordMetadata]:
        # the record was checked against max_message_size: the pool skips aiokafka's re-checks
        return await self._runtime.pool.send(
            q.data_bootstrap,
            place.tp,
            msg.body,
            [*headers, *place.headers] if place.headers else headers,
        )

    async def _result(
        self, q: QueueRoute, place: _Placement, msg_id: str, md: RecordMetadata
    ) -> SendResult:
        runtime = self._runtime
        store_host = runtime.cached_store_host(q.address) or await runtime.store_host(q.address)
        return self._result_at(store_host, q, place, msg_id, md)

    def _result_at(
        self, store_host: str, q: QueueRoute, place: _Placement, msg_id: str, md: RecordMetadata
    ) -> SendResult:
        """:meth:`_result` once the store host is known (the usual case: no coroutine)."""
        # Kafka LogAppendTime (type 1) is the broker's store time; otherwise the ack time.
        store_ts = md.timestamp if md.timestamp_type == 1 else time.time_ns() // 1_000_000
        handle = None
        if place.queue.topic == SCHEDULE_TOPIC:
            real = dict(place.headers)[MessageConst.REAL_TOPIC].decode()
            handle = recall_proto.RecallHandle(
                topic=real,
                broker=q.broker,
                timestamp_ms=md.timestamp if md.timestamp > 0 else store_ts,
                msg_id=msg_id,
                level=place.partition + 1,
                offset=md.offset,
            ).encode()
        return SendResult._of(
            _SEND_OK,
            msg_id,
            encode_offset_msg_id(store_host, place.partition, md.offset),
            place.queue,
            md.offset,
            q.region_id,
            q.trace_on,
            store_ts,
            handle,
        )

    async def send(
        self,
        msg: Message,
        *,
        timeout: float | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send and wait for the broker's acknowledgement. ``timeout`` (s) covers all retries.

        With ``selector`` (ordered messages) the selected queue is used and not changed on retry.
        A message with ``delay_level`` is delivered when due (see the module docstring).
        """
        msg = self._check(msg)
        result, _ = await self._send(msg, timeout=timeout, selector=selector, arg=arg)
        return result

    async def _send(
        self,
        msg: Message,
        *,
        timeout: float | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        half: bool = False,
    ) -> tuple[SendResult, QueueRoute]:
        msg_id = self._next_msg_id()
        places: list[_Placement] | None = None
        if half or msg.delay_level:
            _, queues = await self._queues(msg.topic, delay_level=msg.delay_level, half=half)
        else:  # a plain message: the topic's plan, worked out once per route
            plan = self._plans.get(msg.topic)
            if plan is None or plan.route is not self._runtime.routes.cached(msg.topic):
                plan = await self._plan(msg.topic)
            queues, places = plan.queues, plan.places
        if half:
            msg_type = MessageType.Trans_Msg_Half
        elif msg.delay_level:
            msg_type = MessageType.Delay_Msg
        else:
            msg_type = _ORDER_MSG if selector else _NORMAL_MSG
        born = time.time_ns() // 1_000_000  # (now_ms() inline: once per send)
        headers = self._headers(msg, msg_id, born)
        self._check_placed_size(msg, headers, queues, half)
        hooks = self._hooks
        # Without hooks (no trace, no OpenTelemetry) no context is built at all, nor with
        # message trace's hook alone (its one_pub takes the facts).
        trace = self._only_trace_hook()
        ctx = (
            SendMessageContext(
                producer_group=self.group, message=msg, msg_id=msg_id, msg_type=msg_type,
                born_host=self._runtime.client_host, headers=headers,
            )
            if hooks and trace is None
            else None
        )  # fmt: skip
        begin = 0
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self.send_msg_timeout_ms / 1000)
        deadlines = self._deadlines
        runtime = self._runtime
        send_now = runtime.pool.send_now
        attempts = 1 + (0 if selector else self.retry_times_when_send_failed)
        avoid: str | None = None
        fixed = queues.index(self._select(queues, msg, selector, arg)) if selector else None
        last: BaseException | None = None
        made = 0
        for attempt in range(attempts):
            made += 1
            n = fixed if fixed is not None else self._pick(queues, avoid)
            q, qid = queues[n]
            place = places[n] if places is not None else self._place(q, qid, msg, half=half)
            if ctx is not None:
                # One context, and so one Pub, per attempt (RocketMQ calls its hooks per attempt).
                if attempt:
                    ctx = replace(
                        ctx, exception=None, send_result=None, end_timestamp=0, last_attempt=True
                    )
                ctx.attempt, ctx.queue, ctx.begin_timestamp = attempt + 1, place.queue, now_ms()
                ctx.broker_address, ctx.region_id, ctx.trace_on = q.address, q.region_id, q.trace_on
                if self._before_hooks:
                    call_hooks(self._before_hooks, "send_message_before", ctx)
            elif trace is not None:
                # (the first attempt begins as the message is born: one clock read less)
                begin = now_ms() if attempt else born
            entry = None
            try:
                if deadline <= loop.time():
                    raise TimeoutError(f"send timed out after {attempt} attempt(s)")
                # One deadline for enqueue + ack, on the producer's shared timer. The usual
                # record is in its batch without an await (the record was checked against
                # max_message_size: the pool skips aiokafka's re-checks).
                ack = send_now(
                    q.data_bootstrap,
                    place.tp,
                    msg.body,
                    [*headers, *place.headers] if place.headers else headers,
                )
                if ack is not None:
                    entry = deadlines.enqueue(loop, deadline, ack)
                else:
                    entry = deadlines.enqueue(loop, deadline)
                    ack = await self._produce(q, place, msg, headers)
                    deadlines.wait_ack(entry, ack)
                md = await ack
            except asyncio.CancelledError:
                if entry is None or not deadlines.expired(entry):
                    raise
                exc: Exception = TimeoutError("send timed out waiting for the acknowledgement")
                failed = True
            except Exception as e:
                exc, failed = e, True
            else:
                failed = False
            finally:
                if entry is not None:
                    deadlines.done(entry)
            if failed:
                self._faults.failed(q.broker)
                last = exc
                # Out of time: no attempt (and no Pub) that never reaches the transport. Decided
                # before the hooks so they know whether this failure is the send's last.
                last_attempt = attempt + 1 >= attempts or deadline <= loop.time()
                avoid = q.broker
                log.warning(
                    "send attempt failed",
                    topic=msg.topic,
                    broker=q.broker,
                    queue=qid,
                    attempt=attempt + 1,
                    msg_id=msg_id,
                    error=repr(exc),
                )
                if ctx is not None:
                    ctx.exception, ctx.end_timestamp = exc, now_ms()
                    ctx.last_attempt = last_attempt
                    call_hooks(hooks, "send_message_after", ctx)
                elif trace is not None:
                    trace.one_pub(msg, msg_id, self.group, q, begin, now_ms(), msg_type, None)
                if last_attempt:
                    break
                continue
            self._faults.succeeded(q.broker)
            store_host = runtime.cached_store_host(q.address)
            result = (
                self._result_at(store_host, q, place, msg_id, md)
                if store_host
                else await self._result(q, place, msg_id, md)
            )
            if ctx is not None:
                ctx.end_timestamp, ctx.send_result, ctx.exception = now_ms(), result, None
                call_hooks(hooks, "send_message_after", ctx)
            elif trace is not None:
                trace.one_pub(msg, msg_id, self.group, q, begin, now_ms(), msg_type, result)
            return result, q
        raise SendError(
            f"sending {msg_id} to {msg.topic!r} failed after {made} attempt(s): {last!r}"
        ) from last

    async def recall(self, topic: str, handle: str, *, timeout: float = 10.0) -> RecallResult:
        """Ask the broker not to deliver a delayed message (RocketMQ 5.3's ``recallMessage``);
        ``handle`` is the ``recall_handle`` of its :class:`SendResult`. See the module
        docstring for the results and errors; ``timeout`` (s) bounds the wait for the answer."""
        self._check_running()
        h = recall_proto.decode_handle(handle)
        if h.topic != topic:
            raise recall_proto.RecallHandleError(f"it is for topic {h.topic!r}, not {topic!r}")
        route = await self._runtime.routes.get(SCHEDULE_TOPIC)
        q = next((q for q in route.queues if q.broker == h.broker), None)
        if q is None:  # route changes refresh the cache; only a miss is re-read
            route = await self._runtime.routes.get(SCHEDULE_TOPIC, refresh=True)
            q = next((q for q in route.queues if q.broker == h.broker), None)
        if q is None:
            raise RecallError(
                f"broker {h.broker!r} (named by the handle) has no routed schedule service"
            )
        req = recall_proto.RecallRequest(
            request_id=uuid.uuid4().hex,
            handle=handle,
            topic=topic,
            group=self.group,
            client_id=self.client_id,
            ts=now_ms(),
        )
        async with self._recall_lock:  # one reply reader, one wait at a time
            if self._replies is None:
                replies = ReplyListener(self.settings.control_bootstrap)
                await replies.start()
                self._replies = replies
            try:
                producer = await self._runtime.pool.get(q.data_bootstrap)
                fut = await producer.send(
                    kafka_topic(h.broker, SCHEDULE_TOPIC),
                    recall_proto.encode_request(req),
                    partition=h.level - 1,
                    headers=[(recall_proto.RECALL_HEADER, b"1")],
                )
                await asyncio.wait_for(fut, timeout)
            except Exception as exc:  # not stored: nothing was recalled
                raise RecallError(
                    f"the recall of {h.msg_id} could not be written to broker {h.broker!r}'s "
                    f"schedule queue (nothing was recalled): {exc!r}"
                ) from exc
            body = await self._replies.wait(h.broker, req.request_id, timeout)
        if body is None:
            raise RecallTimeoutError(
                f"no answer from broker {h.broker!r} to the recall of {h.msg_id} within "
                f"{timeout}s; the request is stored and applies if the broker reads it before "
                "the message is due: recall again with the same handle to learn the outcome"
            )
        result = str(body.get("result"))
        detail = str(body.get("detail") or "")
        self._trace_recall(topic, h.msg_id, body.get("region_id"), result)
        log.info("recall", topic=topic, msg_id=h.msg_id, broker=h.broker, result=result)
        if result not in RecallStatus.__members__:
            raise RecallError(f"broker {h.broker!r} did not recall {h.msg_id}: {result}: {detail}")
        return RecallResult(RecallStatus(result), h.msg_id, h.broker, detail)

    def _trace_recall(self, topic: str, msg_id: str, region_id: object, result: str) -> None:
        dispatcher = self._runtime.dispatcher
        if dispatcher is None:
            return
        dispatcher.append(
            TraceContext(
                trace_type=TraceType.Recall,
                timestamp=now_ms(),
                region_id=region_id if isinstance(region_id, str) else None,
                group_name=self.group,
                success=result in recall_proto.RECALLED_RESULTS,
                trace_beans=[TraceBean(topic=topic, msg_id=msg_id)],
            )
        )

    def _select(
        self,
        queues: list[tuple[QueueRoute, int]],
        msg: Message,
        selector: MessageQueueSelector,
        arg: Any,
    ) -> tuple[QueueRoute, int]:
        mqs = [MessageQueue(msg.topic, q.broker, i) for q, i in queues]
        chosen = selector(mqs, msg, arg)
        for (q, i), mq in zip(queues, mqs, strict=True):
            if mq == chosen:
                return q, i
        raise InvalidMessageError(f"selector returned {chosen!r}, not one of the topic's queues")

    async def send_oneway(self, msg: Message) -> None:
        """Hand the message to the transport without waiting for the ack. The Pub trace is still
        recorded when the ack (or failure) arrives."""
        msg = self._check(msg)
        msg_id = new_msg_id()
        _, queues = await self._queues(msg.topic, delay_level=msg.delay_level)
        headers = self._headers(msg, msg_id, now_ms())
        self._check_placed_size(msg, headers, queues)
        q, qid = queues[self._pick(queues, None)]
        place = self._place(q, qid, msg)
        ctx = SendMessageContext(
            producer_group=self.group,
            message=msg,
            msg_id=msg_id,
            msg_type=MessageType.Delay_Msg if msg.delay_level else MessageType.Normal_Msg,
            born_host=self._runtime.client_host,
            queue=place.queue,
            broker_address=q.address,
            region_id=q.region_id,
            trace_on=q.trace_on,
            begin_timestamp=now_ms(),
            headers=headers,
        )
        call_hooks(self._before_hooks, "send_message_before", ctx)
        fut = await self._produce(q, place, msg, headers)
        fut.add_done_callback(lambda f: asyncio.ensure_future(self._oneway_done(f, ctx, q, place)))

    async def _oneway_done(
        self,
        fut: asyncio.Future[RecordMetadata],
        ctx: SendMessageContext,
        q: QueueRoute,
        place: _Placement,
    ) -> None:
        ctx.end_timestamp = now_ms()
        if fut.cancelled() or fut.exception() is not None:
            ctx.exception = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            self._faults.failed(q.broker)
        else:
            ctx.send_result = await self._result(q, place, ctx.msg_id, fut.result())
        call_hooks(self._hooks, "send_message_after", ctx)

    async def send_batch(
        self, msgs: Sequence[Message], *, timeout: float | None = None
    ) -> list[SendResult]:
        """Send several messages of one topic to one queue; each keeps its own msgId and Pub
        trace. Returns one result per message, in order.

        The whole batch is validated before anything is sent (as RocketMQ validates a batch):
        any invalid member — too large as a record (see ``max_message_size``), empty, delayed,
        another topic — or members together over ``max_message_size`` raise
        :class:`~tracemq.message.InvalidMessageError` and nothing is sent or traced. Members the
        transport refuses are retried on another queue; members that fail every attempt raise
        :class:`BatchSendError`, which carries every member's result (the stored members' are
        there, stored and traced) and the failed members' errors.
        """
        if not msgs:
            raise InvalidMessageError("send_batch needs at least one message")
        checked = [self._check(m) for m in msgs]
        if any(m.delay_level for m in checked):
            raise InvalidMessageError("delay_level is not supported in a batch (as in RocketMQ)")
        topic = checked[0].topic
        if any(m.topic != topic for m in checked):
            topics = sorted({m.topic for m in checked})
            raise InvalidMessageError(f"a batch must have one topic, got {topics}")
        plan = self._plans.get(topic)
        if plan is None or plan.route is not self._runtime.routes.cached(topic):
            plan = await self._plan(topic)
        queues, places = plan.queues, plan.places
        next_id = self._next_msg_id
        msg_ids = [next_id() for _ in checked]
        born = now_ms()
        headers = [self._headers(m, i, born) for m, i in zip(checked, msg_ids, strict=True)]
        total = 0
        for n, (m, h) in enumerate(zip(checked, headers, strict=True)):
            try:
                total += self._check_size(m, h)
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"batch member {n}: {exc}; nothing was sent") from None
        if total > self.max_message_size:
            raise InvalidMessageError(
                f"batch of {len(checked)} messages is {total} bytes as Kafka records, which "
                f"exceeds max_message_size {self.max_message_size} (as in RocketMQ, a batch "
                "counts as one message); nothing was sent"
            )
        hooks = self._hooks
        host = self._runtime.client_host
        # Without hooks (no trace, no OpenTelemetry) no context is built at all, nor with
        # message trace's hook alone (its one_pub takes the facts).
        trace = self._only_trace_hook()
        ctxs: list[SendMessageContext] | None = (
            [
                SendMessageContext(
                    producer_group=self.group, message=m, msg_id=i,
                    msg_type=MessageType.Normal_Msg, born_host=host, headers=h,
                )
                for m, i, h in zip(checked, msg_ids, headers, strict=True)
            ]
            if hooks and trace is None
            else None
        )  # fmt: skip
        begin = 0
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self.send_msg_timeout_ms / 1000)
        deadlines = self._deadlines
        runtime = self._runtime
        send_now = runtime.pool.send_now
        results: list[SendResult | None] = [None] * len(checked)
        errors: list[BaseException | None] = [None] * len(checked)
        pending = list(range(len(checked)))
        avoid: str | None = None
        attempts = 1 + self.retry_times_when_send_failed
        for attempt in range(attempts):
            if not pending:
                break
            k = self._pick(queues, avoid)
            q, place = queues[k][0], places[k]
            if ctxs is not None:
                begin = now_ms()
                for i in pending:
                    # One context, and so one Pub, per member and attempt.
                    c = ctxs[i]
                    if attempt:
                        c = ctxs[i] = replace(
                            c, exception=None, send_result=None, end_timestamp=0,
                            last_attempt=True,
                        )  # fmt: skip
                    c.attempt, c.queue, c.begin_timestamp = attempt + 1, place.queue, begin
                    c.broker_address, c.region_id, c.trace_on = q.address, q.region_id, q.trace_on
                    if self._before_hooks:
                        call_hooks(self._before_hooks, "send_message_before", c)
            elif trace is not None:
                begin = now_ms()
            futs: list[asyncio.Future[RecordMetadata] | BaseException] = []
            bootstrap, tp = q.data_bootstrap, place.tp  # (a batch's placement adds no headers)
            for i in pending:
                try:
                    ack = send_now(bootstrap, tp, checked[i].body, headers[i])
                    futs.append(
                        ack
                        if ack is not None
                        else await self._produce(q, place, checked[i], headers[i])
                    )
                except Exception as exc:
                    futs.append(exc)
            # One deadline for the acknowledgements of all members (members of one request are
            # acknowledged together: usually one wait).
            outcomes: list[RecordMetadata | BaseException] = []
            entry = deadlines.enqueue(loop, deadline)
            try:
                for f in futs:
                    if isinstance(f, BaseException):
                        outcomes.append(f)
                        continue
                    try:
                        outcomes.append(await f)
                    except Exception as exc:
                        outcomes.append(exc)
            except asyncio.CancelledError:
                if not deadlines.expired(entry):
                    for f in futs[len(outcomes) :]:
                        if not isinstance(f, BaseException):
                            f.cancel()
                    raise
                timed_out = TimeoutError("send timed out waiting for the acknowledgement")
                for f in futs[len(outcomes) :]:
                    if not isinstance(f, BaseException):
                        f.cancel()
                outcomes.extend([timed_out] * (len(futs) - len(outcomes)))
            finally:
                deadlines.done(entry)
            end = now_ms()
            still = []
            # decided before the hooks, so they know whether a failure is the member's last
            last = attempt + 1 >= attempts or loop.time() >= deadline
            for i, md in zip(pending, outcomes, strict=True):
                if isinstance(md, BaseException):
                    errors[i] = md
                    still.append(i)
                    result = None
                else:
                    store_host = runtime.cached_store_host(q.address)
                    result = results[i] = (
                        self._result_at(store_host, q, place, msg_ids[i], md)
                        if store_host
                        else await self._result(q, place, msg_ids[i], md)
                    )
                    errors[i] = None
                if ctxs is not None:
                    c = ctxs[i]
                    c.end_timestamp, c.last_attempt = end, last
                    c.exception, c.send_result = errors[i], result
                    call_hooks(hooks, "send_message_after", c)
                elif trace is not None:
                    trace.one_pub(
                        checked[i], msg_ids[i], self.group, q, begin, end, _NORMAL_MSG, result
                    )
            if still:
                self._faults.failed(q.broker)
                avoid = q.broker
            else:
                self._faults.succeeded(q.broker)
            pending = still
            if last:
                break
        if pending:
            first = errors[pending[0]]
            raise BatchSendError(
                f"{len(pending)} of {len(checked)} batch messages failed every attempt (members "
                f"{pending[:10]}{' …' if len(pending) > 10 else ''}); the other "
                f"{len(checked) - len(pending)} are stored (see .results): {first!r}",
                results,
                errors,
            ) from first
        return [r for r in results if r is not None]
