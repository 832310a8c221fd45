"""The transaction service: holds half messages until commit or rollback, checks back.

Layout (RocketMQ's ``TransactionalMessageService``): each business broker owns
``RMQ_SYS_TRANS_HALF_TOPIC`` and ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (one queue each) on its data
cluster. A :class:`~tracemq.TransactionProducer` writes the half message (``TRAN_MSG=true``,
``PGROUP``, ``REAL_TOPIC``, ``REAL_QID``) to the half topic, runs its local transaction, and writes
an end record (:class:`~tracemq.protocol.transaction.EndTransaction`) naming the half's offset and
msgId to the op topic.

- **COMMIT_MESSAGE**: the half is forwarded to ``<broker>.<REAL_TOPIC>`` partition ``REAL_QID``,
  same body and properties (same msgId), minus ``TRAN_MSG``, plus ``TRAN_HALF_OFFSET``.
- **ROLLBACK_MESSAGE**: the half is discarded, never delivered.
- **UNKNOW**, or no end record: once the half is ``transaction_timeout_ms`` old, the broker sends a
  :class:`~tracemq.protocol.transaction.CheckRequest` to ``tracemq.txcheck`` (control cluster,
  keyed by producer group); live producers of the group run ``check_local_transaction`` and
  answer with an end record (``from_check=True``). Checks repeat every
  ``transaction_check_interval_ms``; after ``transaction_check_max`` checks the broker rolls
  the half back (counted as ``check_rollback``; no trace record exists for that decision).

The first COMMIT or ROLLBACK of a half wins. Duplicate end records, end records whose msgId
does not match the half, end records for unknown halves, and undecodable records on either
topic are counted (``tracemq_broker_transaction_rejected_total{reason}``), logged with their
topic, partition and offset, and skipped; none stops the service or loses a valid record. An end record read before its half (two topics, no order
between them) is kept until the half arrives.

State and restarts: ``transaction/state.json`` is a checkpoint — the lowest unresolved half
offset, the op offset to replay from, the resolved halves above it (as ranges), check counts,
end records waiting for their half, and the intent of a commit forward in progress (see
:mod:`tracemq_broker.forward`). It is written before and after every commit forward and at
most a second after any other change. A restarted service re-reads the half topic from the
lowest unresolved offset and replays end records from the saved op offset (replaying a
rollback or a check result is harmless); a commit that was being forwarded is looked up in
its target, so it is delivered exactly once. Check counts may lag by the last second, which
can cost one extra check-back, never a lost or duplicated message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from tracemq import kafka_security
from tracemq.clock import now_ms
from tracemq.log import get_logger
from tracemq.message import MessageConst
from tracemq.naming import HALF_TOPIC, OP_HALF_TOPIC, kafka_topic
from tracemq.offset_reset import confirmed_log_bounds
from tracemq.protocol import ProtocolError
from tracemq.protocol import transaction as txp
from tracemq.protocol.forwarding import TRAN_HALF_OFFSET
from tracemq.service import spawn

from tracemq_broker import metrics
from tracemq_broker.forward import Forwarder, Outgoing, headers_dict, parse_target
from tracemq_broker.journal import from_ranges, read_json, to_ranges, write_json
from tracemq_broker.schedule import TargetResolver

log = get_logger("broker.transaction")

#: Sends one check request: ``(key, value)`` to the check topic on the control cluster.
CheckSender = Callable[[bytes, bytes], Awaitable[None]]

EARLY_MAX = 100_000
SAVE_INTERVAL_S = 1.0


@dataclass(slots=True)
class _Half:
    offset: int
    record: ConsumerRecord[bytes, bytes]
    headers: dict[str, str]
    msg_id: str
    group: str
    topic: str
    qid: int
    checks: int = 0
    commit: bool = False


class TransactionService:
    """Reads the half and op topics of one broker and resolves every half message."""

    def __init__(
        self,
        *,
        broker_name: str,
        bootstrap: str,
        state_path: Path,
        resolve: TargetResolver,
        send_check: CheckSender,
        timeout_ms: int,
        check_interval_ms: int,
        check_max: int,
        broker_address: str,
        region_id: str,
    ) -> None:
        self.broker_name = broker_name
        self.bootstrap = bootstrap
        self.path = state_path
        self.resolve = resolve
        self.send_check = send_check
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.check_max = check_max
        self.broker_address = broker_address
        self.region_id = region_id
        self.half_tp = TopicPartition(kafka_topic(broker_name, HALF_TOPIC), 0)
        self.op_tp = TopicPartition(kafka_topic(broker_name, OP_HALF_TOPIC), 0)
        self.forwarder = Forwarder(bootstrap, TRAN_HALF_OFFSET, name="transaction")
        self.consumer: AIOKafkaConsumer | None = None
        self.task: asyncio.Task[None] | None = None
        self.tick_s = max(0.05, min(1.0, timeout_ms / 4000, check_interval_ms / 4000))
        # state
        self.pending: dict[int, _Half] = {}  # by half offset, in offset order
        self.resolved: set[int] = set()
        self.saved_checks: dict[int, int] = {}  # check counts of halves not re-read yet
        self.early: dict[int, dict[str, Any]] = {}  # end records read before their half
        self.half_next = 0
        self.op_next = 0
        self._to_commit: list[_Half] = []
        self._forwarding = False
        self._dirty = False
        self._saved_at = 0.0
        self._next_scan = 0

    @property
    def half_low(self) -> int:
        """Every half below this offset is resolved."""
        return next(iter(self.pending), self.half_next)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.forwarder.start()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **kafka_security.client_kwargs(self.bootstrap),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await kafka_security.start(self.consumer, self.bootstrap)
        tps = [self.half_tp, self.op_tp]
        self.consumer.assign(tps)
        begin, end = await confirmed_log_bounds(self.consumer, tps, self.bootstrap)
        await self._load(begin, end)
        self.consumer.seek(self.half_tp, self.half_next)
        self.consumer.seek(self.op_tp, self.op_next)
        self.task = spawn(self._run(), name="transaction-service")
        log.info(
            "transaction service started",
            half_from=self.half_next,
            op_from=self.op_next,
            half_end=end[self.half_tp],
        )

    async def _load(self, begin: dict[TopicPartition, int], end: dict[TopicPartition, int]) -> None:
        state = read_json(self.path) or {}
        half_low = int(state.get("half_low", 0))
        op_next = int(state.get("op_next", 0))
        intent = state.get("intent")
        if half_low > end[self.half_tp]:
            log.warning(
                "half topic is shorter than the saved state (the transport lost it); starting over",
                saved=half_low,
                end=end[self.half_tp],
            )
            state, half_low, intent = {}, begin[self.half_tp], None
        if op_next > end[self.op_tp]:
            log.warning("op topic is shorter than the saved state; replaying it all")
            op_next = begin[self.op_tp]
        self.half_next = max(half_low, begin[self.half_tp])
        self.op_next = max(op_next, begin[self.op_tp])
        self.resolved = from_ranges(state.get("resolved", []))
        self.saved_checks = {int(k): int(v) for k, v in state.get("checks", {}).items()}
        self.early = {int(k): v for k, v in state.get("early", {}).items()}
        if intent:
            found = {int(c) for c in await self.forwarder.find(intent)}
            self.resolved |= found
            for c in intent.get("coords", []):
                if int(c) not in found:  # decided COMMIT, not delivered yet: deliver on re-read
                    self.early[int(c)] = {"state": "COMMIT_MESSAGE", "msg_id": None}
            metrics.TX_RECOVERED.inc(len(found))
            log.info(
                "checked the commit forward under way at the last stop",
                intended=len(intent.get("coords", [])),
                already_delivered=len(found),
            )
            await self._save()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
            self.task = None
            if not self._forwarding:  # a forward cut short keeps its intent in the last save
                with contextlib.suppress(Exception):
                    await self._save()
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.consumer.stop(), 10)
        await self.forwarder.stop()

    def healthy(self) -> bool:
        return self.task is not None and not self.task.done()

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self.consumer is not None
        while True:
            data = await self.consumer.getmany(timeout_ms=int(self.tick_s * 1000), max_records=1000)
            op_floor = self.op_next
            for rec in data.get(self.half_tp, []):
                self._guarded(self._on_half, rec)
            for rec in data.get(self.op_tp, []):
                self._guarded(self._on_op, rec)
            try:
                if self._to_commit:
                    await self._commit(op_floor)
                await self._checks()
                if self._dirty and time.monotonic() - self._saved_at >= SAVE_INTERVAL_S:
                    await self._save()
            except Exception as exc:  # disk or cluster trouble: keep every decision, try again
                log.error("transaction service step failed; retrying", error=repr(exc))
                self._to_commit = [h for h in self.pending.values() if h.commit]
                await asyncio.sleep(1.0)
            metrics.TX_HALVES.set(len(self.pending))

    def _skip(self, reason: str, **kw: Any) -> None:
        metrics.TX_REJECTED.labels(reason).inc()
        log.warning("skipped a transaction record", reason=reason, **kw)

    def _guarded(
        self,
        handle: Callable[[ConsumerRecord[bytes, bytes]], None],
        rec: ConsumerRecord[bytes, bytes],
    ) -> None:
        """One record that breaks its handler in a way no check foresaw is counted and
        skipped: the loop must go on to the records behind it (a restart would meet it again)."""
        try:
            handle(rec)
        except Exception as exc:
            self._skip(
                "apply_failed",
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                error=f"{exc.__class__.__name__}: {exc}",
                exc_info=exc,
            )

    def _on_half(self, rec: ConsumerRecord[bytes, bytes]) -> None:
        if rec.offset < self.half_next:  # the half topic was recreated under us
            log.warning(
                "half topic restarted from a lower offset (the transport lost it); "
                "forgetting the old halves",
                offset=rec.offset,
                expected=self.half_next,
            )
            self.pending.clear()
            self.resolved.clear()
            self.early.clear()
            self.saved_checks.clear()
            self._to_commit = []
        self.half_next = rec.offset + 1
        if rec.offset in self.resolved:
            self.early.pop(rec.offset, None)
            return
        headers = headers_dict(rec)
        try:
            msg_id = headers.get(MessageConst.UNIQ_KEY) or ""
            group = headers.get(MessageConst.PRODUCER_GROUP) or ""
            if not msg_id or not group:
                raise ValueError("no UNIQ_KEY or PGROUP property")
            topic, qid = parse_target(headers)
        except ValueError as exc:
            self._skip(
                "garbage",
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                error=str(exc),
            )
            self.resolved.add(rec.offset)
            self._dirty = True
            return
        half = _Half(rec.offset, rec, headers, msg_id, group, topic, qid)
        half.checks = self.saved_checks.pop(rec.offset, 0)
        self.pending[rec.offset] = half
        early = self.early.pop(rec.offset, None)
        if early is not None:
            self._apply(half, early.get("state"), early.get("msg_id"))

    def _on_op(self, rec: ConsumerRecord[bytes, bytes]) -> None:
        if rec.offset < self.op_next:
            log.warning("op topic restarted from a lower offset (the transport lost it)")
        self.op_next = rec.offset + 1
        try:
            op = txp.decode_end(rec.value)
        except ProtocolError as exc:
            self._skip(
                exc.kind,
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                error=str(exc),
            )
            return
        half = self.pending.get(op.half_offset)
        if half is not None:
            self._apply(half, op.state, op.msg_id)
        elif op.half_offset in self.resolved or op.half_offset < self.half_low:
            self._skip("duplicate", half_offset=op.half_offset, msg_id=op.msg_id, state=op.state)
        elif op.half_offset >= self.half_next:
            if op.state != "UNKNOW" and op.half_offset not in self.early:
                if len(self.early) >= EARLY_MAX:
                    dropped = min(self.early)
                    del self.early[dropped]
                    self._skip("unknown_half", half_offset=dropped)
                self.early[op.half_offset] = {"state": op.state, "msg_id": op.msg_id}
                self._dirty = True
        else:
            self._skip("unknown_half", half_offset=op.half_offset, msg_id=op.msg_id)

    def _apply(self, half: _Half, state: object, msg_id: str | None) -> None:
        if msg_id is not None and msg_id != half.msg_id:
            self._skip("mismatch", half_offset=half.offset, msg_id=msg_id, expected=half.msg_id)
            return
        if half.commit:
            self._skip("duplicate", half_offset=half.offset, msg_id=half.msg_id, state=state)
        elif state == "COMMIT_MESSAGE":
            half.commit = True
            self._to_commit.append(half)
            self._dirty = True
        elif state == "ROLLBACK_MESSAGE":
            self._resolve(half, "rollback")
            log.info("half message rolled back", msg_id=half.msg_id, topic=half.topic)

    def _resolve(self, half: _Half, result: str) -> None:
        self.pending.pop(half.offset, None)
        self.resolved.add(half.offset)
        metrics.TX_RESULTS.labels(result).inc()
        self._dirty = True

    async def _commit(self, op_floor: int) -> None:
        halves, self._to_commit = self._to_commit, []
        items: list[Outgoing] = []
        for h in halves:
            target = await self.resolve(h.topic, h.qid)
            if target is None:
                self._skip("no_topic", msg_id=h.msg_id, topic=h.topic)
                self._resolve(h, "no_topic")
                continue
            headers = [
                (k, v)
                for k, v in h.record.headers or ()
                if k not in (MessageConst.TRAN_MSG, TRAN_HALF_OFFSET)
            ]
            headers.append((TRAN_HALF_OFFSET, str(h.offset).encode()))
            items.append(Outgoing(str(h.offset), target[0], target[1], h.record.value, headers))
        if items:
            intent = await self.forwarder.prepare(items)
            # Until the next save the intent on disk is the truth (stop() must not overwrite
            # it). op_floor: a crash replays this round's end records, which is harmless.
            await self._save(intent=intent, op_next=op_floor)
            await self.forwarder.send(items, intent)
            for it in items:
                done = self.pending.get(int(it.coord))
                if done is not None:
                    self._resolve(done, "commit")
                    log.info("half message committed", msg_id=done.msg_id, topic=done.topic)
        await self._save()

    async def _checks(self) -> None:
        now = now_ms()
        if now < self._next_scan:
            return
        self._next_scan = now + int(self.tick_s * 1000)
        due: list[_Half] = []
        for h in list(self.pending.values()):
            if h.commit:
                continue
            if now < h.record.timestamp + self.timeout_ms + h.checks * self.check_interval_ms:
                continue
            if h.checks >= self.check_max:
                log.warning(
                    "no result after the maximum number of check-backs; rolling back",
                    msg_id=h.msg_id,
                    group=h.group,
                    checks=h.checks,
                )
                self._resolve(h, "check_rollback")
                continue
            due.append(h)
        if not due:
            return
        results = await asyncio.gather(*(self._send_check(h) for h in due), return_exceptions=True)
        for h, res in zip(due, results, strict=True):
            if isinstance(res, BaseException):
                log.warning("check-back request not sent", msg_id=h.msg_id, error=repr(res))
                continue
            h.checks += 1
            self._dirty = True
            metrics.TX_CHECKS.inc()

    async def _send_check(self, h: _Half) -> None:
        try:
            born = int(h.headers.get(MessageConst.BORN_TIMESTAMP, "0"))
        except ValueError:
            born = 0
        if not 0 <= born < 2**63:  # a producer's header: msgpack cannot even carry some ints
            born = 0
        req = txp.CheckRequest(
            broker=self.broker_name,
            group=h.group,
            half_offset=h.offset,
            msg_id=h.msg_id,
            transaction_id=h.msg_id,
            data_bootstrap=self.bootstrap,
            broker_address=self.broker_address,
            region_id=self.region_id,
            topic=h.topic,
            queue_id=h.qid,
            body=h.record.value or b"",
            properties={k: v for k, v in h.headers.items() if k != TRAN_HALF_OFFSET},
            born_timestamp=born,
            check_times=h.checks + 1,
            ts=now_ms(),
        )
        await self.send_check(h.group.encode(), txp.encode(req))

    async def _save(
        self, *, intent: dict[str, Any] | None = None, op_next: int | None = None
    ) -> None:
        low = self.half_low
        self.resolved = {o for o in self.resolved if o >= low}
        checks = {str(o): n for o, n in self.saved_checks.items()}
        checks.update({str(o): h.checks for o, h in self.pending.items() if h.checks})
        self.early = {o: e for o, e in self.early.items() if o >= self.half_next}
        early = {str(o): e for o, e in self.early.items()}
        # a commit decided but not forwarded yet must survive even if its end record is not
        # replayed: it is saved like an end record waiting for its half
        early.update(
            {
                str(o): {"state": "COMMIT_MESSAGE", "msg_id": h.msg_id}
                for o, h in self.pending.items()
                if h.commit
            }
        )
        await write_json(
            self.path,
            {
                "half_low": low,
                "op_next": self.op_next if op_next is None else op_next,
                "resolved": to_ranges(self.resolved),
                "checks": checks,
                "early": early,
                "intent": intent,
            },
        )
        self._forwarding = intent is not None
        self._dirty = False
        self._saved_at = time.monotonic()
