"""TransactionProducer: transactional messages (RocketMQ's half message + local transaction).

:meth:`TransactionProducer.send_message_in_transaction`:

1. sends the *half message*: the real queue is chosen as for any send (among brokers running a
   transaction service), and the record goes to ``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0) of that
   broker with ``TRAN_MSG=true``, ``PGROUP``, ``REAL_TOPIC`` and ``REAL_QID``; consumers cannot
   see it. Pub trace msgType ``Trans_Msg_Half``. A failed half send raises :class:`SendError`
   and the local transaction does not run;
2. runs ``listener.execute_local_transaction(msg, arg)`` (async or sync; a sync one runs in a
   worker thread). An exception or ``None`` counts as ``UNKNOW``;
3. writes the end record (:class:`~tracemq.protocol.transaction.EndTransaction`) to the
   broker's ``RMQ_SYS_TRANS_OP_HALF_TOPIC``: on COMMIT_MESSAGE the broker delivers the message
   to its real queue with the same msgId, on ROLLBACK_MESSAGE it discards it, on UNKNOW it
   checks back later. A failure to write the end record is logged, not raised: the check-back
   recovers it (RocketMQ sends it one-way too);
4. calls the :class:`~tracemq.hooks.EndTransactionHook` s — with message trace, an
   EndTransaction record (msgType ``Trans_msg_Commit`` on commit, ``Trans_Msg_Half``
   otherwise, with transactionId, state and ``fromTransactionCheck``).

Check-back: the producer follows ``tracemq.txcheck`` on the control cluster (from its end, at
start) and answers every request for its group with ``listener.check_local_transaction(msg)``
— every live producer of the group sees every request, the first answer wins at the broker.
Those answers are traced with ``fromTransactionCheck=true``. At most
``check_concurrency`` checks run at once.

The transaction id is the msgId (RocketMQ uses the UNIQ_KEY too).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import Counter

from tracemq import kafka_security
from tracemq.clock import now_ms
from tracemq.hooks import EndTransactionContext, EndTransactionHook, call_hooks
from tracemq.log import get_logger
from tracemq.message import InvalidMessageError, Message, MessageConst, MessageExt, MessageQueue
from tracemq.message import SendResult as _SendResult
from tracemq.naming import OP_HALF_TOPIC, kafka_topic
from tracemq.producer.producer import Producer
from tracemq.protocol import transaction as txp
from tracemq.protocol._envelope import ProtocolError
from tracemq.protocol.forwarding import ROUTING_PROPERTIES
from tracemq.trace import TransactionState

log = get_logger("producer.transaction")

CHECK_REJECTED = Counter(
    "tracemq_producer_check_rejected_total",
    "Transaction check requests not answered: garbage, version, type, schema, apply_failed",
    ["group", "reason"],
)

#: RocketMQ's ``LocalTransactionState`` (COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW).
LocalTransactionState = TransactionState


@runtime_checkable
class TransactionListener(Protocol):
    """What a :class:`TransactionProducer` calls. Either method may be ``async``."""

    def execute_local_transaction(
        self, msg: Message, arg: Any
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...

    def check_local_transaction(
        self, msg: MessageExt
    ) -> LocalTransactionState | Awaitable[LocalTransactionState]: ...


@dataclass(frozen=True, slots=True)
class TransactionSendResult(_SendResult):
    """A :class:`~tracemq.message.SendResult` (of the half message) and the local result."""

    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW
    transaction_id: str | None = None


class TransactionProducer(Producer):
    """A producer of transactional messages; see the module docstring."""

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        *,
        check_concurrency: int = 4,
        **kwargs: Any,
    ) -> None:
        super().__init__(group, **kwargs)
        for name in ("execute_local_transaction", "check_local_transaction"):
            if not callable(getattr(listener, name, None)):
                raise TypeError(f"the transaction listener has no {name}() method")
        if check_concurrency < 1:
            raise ValueError("check_concurrency must be >= 1")
        self.listener = listener
        self._end_hooks: list[EndTransactionHook] = []
        self._check_consumer: AIOKafkaConsumer | None = None
        self._check_slots = asyncio.Semaphore(check_concurrency)

    def register_end_transaction_hook(self, hook: EndTransactionHook) -> None:
        self._end_hooks.append(hook)

    async def _start(self) -> None:
        await super()._start()
        if self._runtime.dispatcher is not None:
            from tracemq.trace._hooks import EndTransactionTraceHook

            self._end_hooks.append(
                EndTransactionTraceHook(self._runtime.dispatcher, self._runtime.trace_topic)
            )
        self._check_consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.control_bootstrap,
            **kafka_security.client_kwargs(self.settings.control_bootstrap),
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=200,
        )
        await kafka_security.start(self._check_consumer, self.settings.control_bootstrap)
        await self._follow_checks()
        self._tasks.spawn(self._check_loop(), name=f"txcheck-{self.group}")

    async def _follow_checks(self) -> bool:
        """Assign the check topic (from its end) once it exists; False while it does not."""
        assert self._check_consumer is not None
        if self._check_consumer.assignment():
            return True
        await self._check_consumer.topics()  # refreshes metadata; never auto-creates
        parts = self._check_consumer.partitions_for_topic(txp.TXCHECK_TOPIC)
        if not parts:
            return False
        tps = [TopicPartition(txp.TXCHECK_TOPIC, p) for p in sorted(parts)]
        self._check_consumer.assign(tps)
        await self._check_consumer.seek_to_end(*tps)
        for tp in tps:
            await self._check_consumer.position(tp)
        return True

    async def _close(self, trace_timeout_s: float = 5.0) -> None:
        await self._tasks.aclose()  # the check loop and the checks under way
        if self._check_consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._check_consumer.stop(), 10)
            self._check_consumer = None
        await super()._close(trace_timeout_s)

    # -- sending ---------------------------------------------------------------------------
    async def send_message_in_transaction(
        self, msg: Message, arg: Any = None, *, timeout: float | None = None
    ) -> TransactionSendResult:
        """Send ``msg`` as a half message, run the local transaction, end the transaction."""
        msg = self._check(msg)
        if msg.delay_level:
            raise InvalidMessageError("a transactional message cannot have a delay_level")
        result, q = await self._send(msg, timeout=timeout, half=True)
        try:
            state = await _call(self.listener.execute_local_transaction, msg, arg)
        except Exception as exc:
            log.warning(
                "execute_local_transaction raised; the transaction is UNKNOW",
                group=self.group,
                msg_id=result.msg_id,
                error=repr(exc),
            )
            state = LocalTransactionState.UNKNOW
        await self._end(
            half_offset=result.queue_offset,
            msg=msg,
            msg_id=result.msg_id,
            state=state,
            from_check=False,
            broker=q.broker,
            data_bootstrap=q.data_bootstrap,
            broker_address=q.address,
            region_id=q.region_id,
        )
        base = {f.name: getattr(result, f.name) for f in fields(_SendResult)}
        return TransactionSendResult(
            **base, local_transaction_state=state, transaction_id=result.msg_id
        )

    async def _end(
        self,
        *,
        half_offset: int,
        msg: Message,
        msg_id: str,
        state: LocalTransactionState,
        from_check: bool,
        broker: str,
        data_bootstrap: str,
        broker_address: str,
        region_id: str,
    ) -> None:
        record = txp.EndTransaction(
            half_offset=half_offset,
            msg_id=msg_id,
            transaction_id=msg_id,
            state=state.value,  # type: ignore[arg-type]
            from_check=from_check,
            group=self.group,
            client_id=self.client_id,
            ts=now_ms(),
        )
        try:
            producer = await self._runtime.pool.get(data_bootstrap)
            await asyncio.wait_for(
                producer.send_and_wait(
                    kafka_topic(broker, OP_HALF_TOPIC), txp.encode(record), partition=0
                ),
                self.send_msg_timeout_ms / 1000,
            )
        except Exception as exc:  # the broker's check-back will ask again
            log.warning(
                "end of transaction not sent; the broker will check back",
                group=self.group,
                msg_id=msg_id,
                state=state.value,
                error=repr(exc),
            )
        call_hooks(
            self._end_hooks,
            "end_transaction",
            EndTransactionContext(
                producer_group=self.group,
                message=msg,
                msg_id=msg_id,
                broker_address=broker_address,
                transaction_id=msg_id,
                transaction_state=state.value,
                from_transaction_check=from_check,
                region_id=region_id,
                timestamp=now_ms(),
            ),
        )

    # -- check-back ------------------------------------------------------------------------
    async def _check_loop(self) -> None:
        """Answer the check requests of this producer's group for as long as it runs.

        A request that cannot be decoded or answered is counted in
        ``tracemq_producer_check_rejected_total{group, reason}`` and logged with its
        coordinates; a failing read is logged and retried. The loop ends only by
        :meth:`shutdown` (a producer that stopped answering would see its halves rolled back
        after the broker's last check)."""
        assert self._check_consumer is not None
        while True:
            try:
                if not await self._follow_checks():
                    await asyncio.sleep(1.0)  # no broker has created the check topic yet
                    continue
                batch = await self._check_consumer.getmany(timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("reading check requests failed; retrying", error=repr(exc))
                await asyncio.sleep(1.0)
                continue
            for rec in (r for recs in batch.values() for r in recs):
                if rec.key is not None and rec.key != self.group.encode():
                    continue
                where = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}
                try:
                    req = txp.decode_check(rec.value)
                except ProtocolError as exc:
                    self._reject_check(exc.kind, str(exc), where)
                    continue
                if req.group != self.group:
                    continue
                await self._check_slots.acquire()
                task = self._tasks.spawn(self._check_back(req, where), name="txcheck-back")
                task.add_done_callback(self._check_done)

    def _reject_check(self, reason: str, error: str, where: dict[str, Any]) -> None:
        CHECK_REJECTED.labels(self.group, reason).inc()
        log.warning("check request rejected", group=self.group, reason=reason, error=error, **where)

    def _check_done(self, task: asyncio.Task[None]) -> None:
        self._check_slots.release()

    async def _check_back(self, req: txp.CheckRequest, where: dict[str, Any]) -> None:
        try:
            await self._answer_check(req)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. a request naming a topic no message can have
            self._reject_check("apply_failed", f"{exc.__class__.__name__}: {exc}", where)

    async def _answer_check(self, req: txp.CheckRequest) -> None:
        props = {k: v for k, v in req.properties.items() if k not in ROUTING_PROPERTIES}
        ext = MessageExt(
            topic=req.topic,
            body=req.body,
            msg_id=req.msg_id,
            queue=MessageQueue(req.topic, req.broker, req.queue_id),
            queue_offset=req.half_offset,
            born_timestamp=req.born_timestamp,
            store_timestamp=0,
            store_host=req.broker_address,
            born_host=props.get(MessageConst.BORN_HOST),
            properties=props,
        )
        try:
            state = await _call(self.listener.check_local_transaction, ext)
        except Exception as exc:
            log.warning(
                "check_local_transaction raised; answering UNKNOW",
                group=self.group,
                msg_id=req.msg_id,
                error=repr(exc),
            )
            state = LocalTransactionState.UNKNOW
        try:
            msg = Message(req.topic, req.body, tags=ext.tags, keys=ext.key_list)
        except (InvalidMessageError, ValueError):
            msg = Message(req.topic, req.body)
        await self._end(
            half_offset=req.half_offset,
            msg=msg,
            msg_id=req.msg_id,
            state=state,
            from_check=True,
            broker=req.broker,
            data_bootstrap=req.data_bootstrap,
            broker_address=req.broker_address,
            region_id=req.region_id,
        )


async def _call(fn: Any, *args: Any) -> LocalTransactionState:
    if inspect.iscoroutinefunction(fn):
        out = await fn(*args)
    else:
        out = await asyncio.to_thread(fn, *args)
        if inspect.isawaitable(out):
            out = await out
    if out is None:
        return LocalTransactionState.UNKNOW
    try:
        return LocalTransactionState(out)
    except ValueError:
        log.warning("the transaction listener returned an unknown state; UNKNOW", state=out)
        return LocalTransactionState.UNKNOW
