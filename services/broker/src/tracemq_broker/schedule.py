"""The schedule service: delivers delayed messages (and consumer retries) when they are due.

Layout (RocketMQ's ``ScheduleMessageService``): the broker owns ``SCHEDULE_TOPIC_XXXX`` with one
queue per delay level (partition ``level - 1``), so each queue holds messages of one delay and
is ordered by due time. A producer writes a message with ``delay_level = n`` there with the
properties ``DELAY=n``, ``REAL_TOPIC`` and ``REAL_QID`` (the queue it chose as usual); a
consumer sends a failed message back there with ``REAL_TOPIC=%RETRY%<group>``.

Delivery: one reader fetches every level partition into a bounded buffer per level (a level
whose buffer is full is paused); one task per level waits until its head record is due —
*record timestamp + the level's delay* (the record timestamp is the send time: Tansu keeps the
producer's CreateTime) — then forwards every due record at the head, in offset order, to
``<broker>.<REAL_TOPIC>`` partition ``REAL_QID``: same body, same properties (so the same
msgId), minus ``DELAY``, plus ``SCHEDULE_OFFSET=<level>:<offset>``. ``REAL_TOPIC`` and
``REAL_QID`` stay, as in RocketMQ.

Progress and guarantees: per level, ``schedule/level-<n>.json`` holds the next offset to
deliver, the offsets at or past it already delivered, and the intent of the forward in progress
(see :mod:`tracemq_broker.forward`). The intent of a batch is written (fsync) up to
``LEAD_MS`` before its first record is due, each record is then written to its real queue no
earlier than its own due time, and the next batch is prepared while one is still being sent
(``MAX_FLIGHTS``, their intents merged in the journal); the progress after a batch is written
when the level is idle or with the next intent, keeping the journal off the delivery path. A
restart resumes at the saved offset, first checking the targets for the forward under way, so
a message is delivered once: nothing lost, nothing twice (the one residual case is documented
in :mod:`tracemq_broker.forward`). A message already due when the broker comes back is
delivered at once.

Undeliverable records are counted (``tracemq_broker_schedule_rejected_total``) and logged, never
retried forever: garbage (no or bad ``REAL_TOPIC`` / ``REAL_QID``) and messages whose real topic
no longer exists on this broker. A missing ``%RETRY%`` or ``%DLQ%`` topic is created instead.

Recall (RocketMQ 5.3's recall of a delayed message, :mod:`tracemq.protocol.recall`): a
producer writes a recall request to the same level partition as the message, so the reader
always meets it after its target. The reader hands it to the level's task, which decides
between two batches, never during one: ``RECALLED`` if the target is still waiting in the
buffer (the offset is recorded in the level's journal, fsynced, before the answer goes out;
the record is then skipped when it comes due, also after a restart), ``ALREADY_RECALLED`` for
a repeat, ``TOO_LATE`` if its forward has started or finished (a batch starts up to
``LEAD_MS`` before its due time), ``UNKNOWN`` if no message with that msgId sits at that
offset, ``INVALID`` for a handle of another broker, topic or level. The answer goes back on
the admin reply topic (``answer``); counted in ``tracemq_broker_schedule_recalls_total{result}``.
A recall stored while the broker was down is applied at the restart before anything overdue
is delivered: each level delivers only once the reader has read what its partition held at
start (bounded by ``CATCH_UP_S``, and skipped when the level's buffer is full). While a
level's buffer is full (``BUFFER_HIGH`` records waiting) its partition is not read, so a recall
behind them is read only as they drain and may be answered ``TOO_LATE``. A recall record still
ahead of the saved progress is read again after a restart and answered again (the same result,
applied once). ``TOO_LATE`` also answers the recall of a record dropped as undeliverable.

Accuracy: a message is forwarded within a few milliseconds of its due time at moderate load
(``bench/delay.py`` measures it). Records of one level are delivered in offset order, so a
record stamped later than the one after it (two producers with skewed clocks) holds that one
back by the skew.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from tracemq import kafka_security
from tracemq.clock import now_ms
from tracemq.log import get_logger
from tracemq.message import MessageConst
from tracemq.naming import SCHEDULE_TOPIC, kafka_topic
from tracemq.offset_reset import confirmed_log_bounds
from tracemq.protocol import ProtocolError
from tracemq.protocol.forwarding import SCHEDULE_OFFSET
from tracemq.protocol.recall import (
    RECALL_HEADER,
    RecallHandleError,
    RecallRequest,
    decode_handle,
    decode_request,
)
from tracemq.service import spawn
from tracemq.tasks import TaskGroup, cancel_and_wait

from tracemq_broker import metrics
from tracemq_broker.forward import (
    Forwarder,
    Outgoing,
    headers_dict,
    merge_intents,
    parse_target,
)
from tracemq_broker.journal import read_json, write_json

log = get_logger("broker.schedule")

#: Sends a recall's answer: ``(request_id, body)``; must not block (the broker spawns the send).
RecallAnswer = Callable[[str, dict[str, Any]], None]
#: Resolves ``(REAL_TOPIC, REAL_QID)`` to a Kafka topic and partition, or None if undeliverable.
TargetResolver = Callable[[str, int], Awaitable[tuple[str, int] | None]]

BATCH_MAX = 500
BUFFER_HIGH = 5000
BUFFER_LOW = 2500
#: A batch is formed (and its intent written) this long before its first record is due, so the
#: journal write and the offset look-up are not on the delivery path; each record is still
#: written no earlier than its own due time.
LEAD_MS = 50
#: Batches of one level being forwarded at once (their intents are merged in the journal).
MAX_FLIGHTS = 2
#: At start, how long a level waits for the reader to read what its partition held (so that a
#: recall stored while the broker was down is applied before an overdue message is delivered).
CATCH_UP_S = 10.0
#: Recalled offsets remembered below the progress, for the answer to a repeated recall.
RECALL_MEMORY = 10_000


def _done() -> asyncio.Future[None]:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


@dataclass
class _Flight:
    """One batch being forwarded; ``next`` is the level's progress once it has landed."""

    next: int
    items: list[Outgoing]
    intent: dict[str, Any] | None
    task: asyncio.Future[None] = field(default_factory=_done)


@dataclass
class _Level:
    level: int  # 1-based
    delay_ms: int
    path: Path
    next: int = 0
    delivered: set[int] = field(default_factory=set)
    buf: collections.deque[ConsumerRecord[bytes, bytes]] = field(default_factory=collections.deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: a recall arrived or the catch-up ended: wakes the level even while it waits for a due time
    poke: asyncio.Event = field(default_factory=asyncio.Event)
    #: progress not yet written (it is written when idle, or with the next intent)
    dirty: bool = False
    #: a forward is under way: its intent on disk must not be overwritten by a stop()
    forwarding: bool = False
    flights: collections.deque[_Flight] = field(default_factory=collections.deque)
    #: recalled offsets -> (msgId, request id of the recall that applied it)
    recalled: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: recall request records read and not yet decided
    inbox: collections.deque[ConsumerRecord[bytes, bytes]] = field(
        default_factory=collections.deque
    )
    #: delivery waits until the reader has read up to here (the partition's end at start)
    catch_up: int = 0
    caught_up: bool = True

    def state(self, intent: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "level": self.level,
            "next": self.next,
            "delivered": sorted(o for o in self.delivered if o >= self.next),
            "recalled": [[o, m, r] for o, (m, r) in sorted(self.recalled.items())],
            "intent": intent,
        }

    def journal_intent(self) -> dict[str, Any] | None:
        """The intent the journal must hold now: that of every batch still in flight."""
        intents = [f.intent for f in self.flights if f.intent]
        return merge_intents(intents) if intents else None


class ScheduleService:
    """Reads ``<broker>.SCHEDULE_TOPIC_XXXX`` and forwards each message when it is due."""

    def __init__(
        self,
        *,
        broker_name: str,
        bootstrap: str,
        delays_ms: list[int],
        state_dir: Path,
        resolve: TargetResolver,
        answer: RecallAnswer | None = None,
    ) -> None:
        self.broker_name = broker_name
        self.bootstrap = bootstrap
        self.ktopic = kafka_topic(broker_name, SCHEDULE_TOPIC)
        self.resolve = resolve
        self.answer = answer
        self.levels = [
            _Level(i + 1, d, state_dir / f"level-{i + 1}.json") for i, d in enumerate(delays_ms)
        ]
        self.forwarder = Forwarder(bootstrap, SCHEDULE_OFFSET, name="schedule")
        self.consumer: AIOKafkaConsumer | None = None
        self.tasks = TaskGroup("schedule", spawner=spawn)
        self._paused: set[TopicPartition] = set()
        self._catch_up_deadline = 0.0
        self._gauges = [metrics.SCHEDULE_BUFFERED.labels(str(lv.level)) for lv in self.levels]
        self._delivered = [metrics.SCHEDULE_DELIVERED.labels(str(lv.level)) for lv in self.levels]

    def tp(self, lv: _Level) -> TopicPartition:
        return TopicPartition(self.ktopic, lv.level - 1)

    async def start(self) -> None:
        await self.forwarder.start()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **kafka_security.client_kwargs(self.bootstrap),
            group_id=None,
            enable_auto_commit=False,
            # a schedule topic recreated under us (memory-only transport restarted): from the top
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=1024 * 1024,
        )
        await kafka_security.start(self.consumer, self.bootstrap)
        tps = [self.tp(lv) for lv in self.levels]
        self.consumer.assign(tps)
        begin, end = await confirmed_log_bounds(self.consumer, tps, self.bootstrap)
        for lv in self.levels:
            await self._recover(lv, begin[self.tp(lv)], end[self.tp(lv)])
            self.consumer.seek(self.tp(lv), lv.next)
            lv.catch_up = end[self.tp(lv)]
            lv.caught_up = lv.next >= lv.catch_up
        self._catch_up_deadline = asyncio.get_running_loop().time() + CATCH_UP_S
        self.tasks.spawn(self._read(), name="schedule-reader")
        for lv in self.levels:
            self.tasks.spawn(self._run(lv), name=f"schedule-level-{lv.level}")
        log.info(
            "schedule service started",
            levels=len(self.levels),
            resume={lv.level: lv.next for lv in self.levels if lv.next},
        )

    async def _recover(self, lv: _Level, begin: int, end: int) -> None:
        state = read_json(lv.path) or {}
        lv.next = int(state.get("next", 0))
        lv.delivered = {int(o) for o in state.get("delivered", [])}
        lv.recalled = {int(o): (str(m), str(r)) for o, m, r in state.get("recalled", [])}
        intent = state.get("intent")
        if lv.next > end:
            log.warning(
                "schedule queue is shorter than the saved progress (the transport lost it); "
                "starting from its beginning",
                level=lv.level,
                saved=lv.next,
                end=end,
            )
            lv.next, lv.delivered, intent = begin, set(), None
            lv.recalled = {}
        elif lv.next < begin:
            log.warning("schedule progress is behind the retained data", level=lv.level)
            lv.next = begin
        if intent:
            found = await self.forwarder.find(intent)
            offsets = {int(c.split(":")[1]) for c in found}
            lv.delivered |= offsets
            metrics.SCHEDULE_RECOVERED.inc(len(offsets))
            log.info(
                "checked the forward under way at the last stop",
                level=lv.level,
                intended=len(intent.get("coords", [])),
                already_delivered=len(offsets),
            )
            await write_json(lv.path, lv.state())

    async def stop(self) -> None:
        await self.tasks.aclose()
        await cancel_and_wait(f.task for lv in self.levels for f in lv.flights)
        for lv in self.levels:
            if lv.dirty and not lv.forwarding:
                with contextlib.suppress(Exception):
                    await write_json(lv.path, lv.state())
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.consumer.stop(), 10)
        await self.forwarder.stop()

    def healthy(self) -> bool:
        return self.tasks.alive()

    def lag(self) -> dict[int, int]:
        """Buffered (fetched, not yet delivered) records per level."""
        return {lv.level: len(lv.buf) for lv in self.levels if lv.buf}

    # -- reading ---------------------------------------------------------------------------
    async def _read(self) -> None:
        assert self.consumer is not None
        while True:
            data = await self.consumer.getmany(timeout_ms=200, max_records=2000)
            for tp, recs in data.items():
                lv = self.levels[tp.partition]
                for rec in recs:
                    if rec.headers and any(k == RECALL_HEADER for k, _ in rec.headers):
                        lv.inbox.append(rec)
                        lv.poke.set()
                    else:
                        lv.buf.append(rec)
                lv.ready.set()
                if len(lv.buf) >= BUFFER_HIGH and tp not in self._paused:
                    self.consumer.pause(tp)
                    self._paused.add(tp)
            for tp in list(self._paused):
                if len(self.levels[tp.partition].buf) < BUFFER_LOW:
                    self.consumer.resume(tp)
                    self._paused.discard(tp)
            for lv, g in zip(self.levels, self._gauges, strict=True):
                g.set(len(lv.buf))
            for lv in self.levels:
                if not lv.caught_up:
                    tp = self.tp(lv)
                    late = asyncio.get_running_loop().time() > self._catch_up_deadline
                    if (
                        late
                        or tp in self._paused
                        or await self.consumer.position(tp) >= lv.catch_up
                    ):
                        if late:
                            log.warning(
                                "schedule level not read to its end in time", level=lv.level
                            )
                        lv.caught_up = True
                        lv.poke.set()

    # -- delivering ------------------------------------------------------------------------
    async def _save_idle(self, lv: _Level) -> None:
        try:
            await write_json(lv.path, lv.state())
            lv.dirty = False
        except Exception as exc:  # the next intent write carries the progress anyway
            log.warning("schedule progress not written", level=lv.level, error=repr(exc))
            await asyncio.sleep(1.0)

    async def _recalls(self, lv: _Level) -> None:
        """Decide the recalls read on this level, make the applied ones durable, then answer.

        Runs in the level's task between two batches, so a record is either still in the
        buffer (and a recall wins) or its forward has started (too late): never both."""
        answers: list[tuple[str, dict[str, Any]]] = []
        changed = False
        last = -1
        while lv.inbox:
            rec = lv.inbox.popleft()
            last = max(last, rec.offset)
            where = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}
            try:
                req = decode_request(rec.value)
            except ProtocolError as exc:
                metrics.SCHEDULE_REJECTED.labels(f"recall_{exc.kind}").inc()
                log.warning("recall record rejected", reason=exc.kind, error=str(exc), **where)
                continue
            result, detail, msg_id, applied = self._decide(lv, req, rec.offset)
            changed |= applied
            metrics.SCHEDULE_RECALLS.labels(result.lower()).inc()
            log.info(
                "recall",
                result=result,
                detail=detail,
                msg_id=msg_id,
                group=req.group,
                request_id=req.request_id,
                level=lv.level,
                **where,
            )
            answers.append((req.request_id, {"result": result, "detail": detail, "msg_id": msg_id}))
        if not lv.buf and not lv.flights and last >= lv.next:
            # nothing waits before the recall records: progress may pass them (a restart
            # then does not read them again)
            lv.next = last + 1
            lv.dirty = True
        if changed:
            try:
                # durable before anyone is told: the skip must survive a crash
                await write_json(lv.path, lv.state(lv.journal_intent()))
                if not lv.flights:
                    lv.dirty = False
            except Exception as exc:  # applied in memory; an unanswered caller asks again
                log.error("recall not written to the journal", level=lv.level, error=repr(exc))
                await asyncio.sleep(1.0)
                return
        if self.answer is not None:
            for request_id, body in answers:
                self.answer(request_id, body)

    def _decide(self, lv: _Level, req: RecallRequest, at: int) -> tuple[str, str, str | None, bool]:
        """``(result, detail, msgId, applied now)`` of one recall request read at offset ``at``."""
        try:
            h = decode_handle(req.handle)
        except RecallHandleError as exc:
            return "INVALID", str(exc), None, False
        where = f"level {h.level} offset {h.offset}"
        if h.broker != self.broker_name:
            return (
                "INVALID",
                f"the handle is for broker {h.broker!r}, not {self.broker_name!r}",
                h.msg_id,
                False,
            )
        if h.topic != req.topic:
            return (
                "INVALID",
                f"the handle is for topic {h.topic!r}, not {req.topic!r}",
                h.msg_id,
                False,
            )
        if h.level != lv.level:
            return (
                "INVALID",
                f"the handle names level {h.level}, the request came on level {lv.level}'s queue",
                h.msg_id,
                False,
            )
        prev = lv.recalled.get(h.offset)
        if prev is not None:
            if prev[0] != h.msg_id:
                return "UNKNOWN", f"{where} holds another message ({prev[0]})", h.msg_id, False
            if prev[1] == req.request_id:  # the same request read again after a restart
                return "RECALLED", f"{where} recalled", h.msg_id, False
            return "ALREADY_RECALLED", f"{where} was recalled before", h.msg_id, False
        if h.offset >= at:
            return "UNKNOWN", f"no message at {where} before the recall", h.msg_id, False
        launched = lv.flights[-1].next if lv.flights else lv.next
        if h.offset < launched or h.offset in lv.delivered:
            return (
                "TOO_LATE",
                f"{where} was already delivered (or its delivery had started)",
                h.msg_id,
                False,
            )
        for rec in lv.buf:
            if rec.offset == h.offset:
                held = headers_dict(rec).get(MessageConst.UNIQ_KEY)
                if held != h.msg_id:
                    return (
                        "UNKNOWN",
                        f"{where} holds message {held}, not {h.msg_id}",
                        h.msg_id,
                        False,
                    )
                lv.recalled[h.offset] = (h.msg_id, req.request_id)
                return "RECALLED", f"{where} recalled", h.msg_id, True
            if rec.offset > h.offset:
                break
        return "UNKNOWN", f"no delayed message at {where}", h.msg_id, False

    async def _run(self, lv: _Level) -> None:
        """Form batches of due records, at most ``MAX_FLIGHTS`` forwarding at once: the next
        batch's intent is written while the previous one is still being sent, so a batch
        boundary costs no journal write on the delivery path. Progress moves in offset order."""
        while True:
            self._land(lv)
            if lv.inbox:
                await self._recalls(lv)
                continue
            now = now_ms()
            head_due = lv.buf[0].timestamp + lv.delay_ms if lv.buf and lv.caught_up else None
            if head_due is not None and head_due - LEAD_MS <= now and len(lv.flights) < MAX_FLIGHTS:
                horizon = now + LEAD_MS
                batch: list[ConsumerRecord[bytes, bytes]] = []
                while (
                    lv.buf
                    and len(batch) < BATCH_MAX
                    and lv.buf[0].timestamp + lv.delay_ms <= horizon
                ):
                    batch.append(lv.buf.popleft())
                try:
                    await self._launch(lv, batch)
                except Exception as exc:  # disk or cluster trouble: nothing is dropped
                    log.error("schedule delivery failed; retrying", level=lv.level, error=repr(exc))
                    lv.buf.extendleft(reversed(batch))
                    await asyncio.sleep(1.0)
                continue
            if not lv.flights and lv.dirty:
                await self._save_idle(lv)
                continue
            # wait for the oldest flight to land, the head to come due, or new records
            waits: list[asyncio.Future[Any]] = [lv.flights[0].task] if lv.flights else []
            timeout = None
            if head_due is not None and len(lv.flights) < MAX_FLIGHTS:
                timeout = max(0.0, (head_due - LEAD_MS - now) / 1000)
            ready: asyncio.Future[Any] | None = None
            if not lv.buf:
                lv.ready.clear()
                ready = asyncio.ensure_future(lv.ready.wait())
                waits.append(ready)
            lv.poke.clear()
            poke = asyncio.ensure_future(lv.poke.wait())
            waits.append(poke)
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                poke.cancel()
                if ready is not None:
                    ready.cancel()

    def _land(self, lv: _Level) -> None:
        """Account for the batches whose forward finished, in offset order."""
        while lv.flights and lv.flights[0].task.done():
            f = lv.flights.popleft()
            f.task.result()  # only a cancellation can end it otherwise, which propagates
            lv.next = f.next
            lv.delivered = {o for o in lv.delivered if o >= lv.next}
            if len(lv.recalled) > RECALL_MEMORY:
                old = sorted(o for o in lv.recalled if o < lv.next)
                for o in old[: len(lv.recalled) - RECALL_MEMORY]:
                    del lv.recalled[o]
            lv.dirty = True  # written when the level is idle, or with the next intent
            if f.items:
                self._delivered[lv.level - 1].inc(len(f.items))
                now = now_ms()
                for it in f.items:
                    metrics.SCHEDULE_LATENESS.observe(max(0, now - it.not_before_ms) / 1000)
        if not lv.flights:
            lv.forwarding = False

    async def _launch(self, lv: _Level, batch: list[ConsumerRecord[bytes, bytes]]) -> None:
        if batch[0].offset < lv.next and not lv.flights:
            # offsets went back: the schedule topic was recreated, old bookkeeping is void
            log.warning("schedule queue restarted from a lower offset", level=lv.level)
            lv.delivered = set()
            lv.recalled = {}
            lv.next = batch[0].offset
        items: list[Outgoing] = []
        for rec in batch:
            if rec.offset in lv.delivered:
                continue
            if rec.offset in lv.recalled:
                metrics.SCHEDULE_RECALL_SKIPPED.inc()
                log.info(
                    "recalled message not delivered",
                    level=lv.level,
                    offset=rec.offset,
                    msg_id=lv.recalled[rec.offset][0],
                )
                continue
            headers = headers_dict(rec)
            try:
                topic, qid = parse_target(headers)
            except ValueError as exc:
                metrics.SCHEDULE_REJECTED.labels("garbage").inc()
                log.warning(
                    "skipped a schedule record",
                    level=lv.level,
                    topic=rec.topic,
                    partition=rec.partition,
                    offset=rec.offset,
                    reason=str(exc),
                )
                continue
            target = await self.resolve(topic, qid)
            if target is None:
                metrics.SCHEDULE_REJECTED.labels("no_topic").inc()
                log.error(
                    "delayed message for a topic this broker does not host; dropped",
                    level=lv.level,
                    offset=rec.offset,
                    topic=topic,
                    msg_id=headers.get(MessageConst.UNIQ_KEY),
                )
                continue
            coord = f"{lv.level}:{rec.offset}"
            out_headers = [
                (k, v)
                for k, v in rec.headers or ()
                if k not in (MessageConst.DELAY, SCHEDULE_OFFSET)
            ]
            out_headers.append((SCHEDULE_OFFSET, coord.encode()))
            items.append(
                Outgoing(
                    coord,
                    target[0],
                    target[1],
                    rec.value,
                    out_headers,
                    not_before_ms=rec.timestamp + lv.delay_ms,
                )
            )
        flight = _Flight(next=batch[-1].offset + 1, items=items, intent=None)
        if items:
            intent = await self.forwarder.prepare(items)
            # the journal's intent covers every batch still in flight
            flight.intent = intent
            merged = merge_intents([f.intent for f in lv.flights if f.intent] + [intent])
            lv.forwarding = True
            await write_json(lv.path, lv.state(merged))
            flight.task = asyncio.create_task(self.forwarder.send(items, intent))
        lv.flights.append(flight)
