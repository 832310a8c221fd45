"""Recalling a delayed message (:meth:`tracemq.Producer.recall`): the result, the errors, and
the reader of the broker's answer.

The request travels on the data path (:mod:`tracemq.protocol.recall`); the schedule service's
answer comes back on ``tracemq.admin.reply`` on the control cluster, where a producer reads
only the records written after it started listening and picks its own by ``request_id``.

Errors::

    TracemqError
    └── RecallError              the broker refused the recall (unknown message, bad handle)
        └── RecallTimeoutError   no answer in time (retriable: the request is stored and
                                 applies if the broker reads it before the message is due;
                                 recall again with the same handle to learn the outcome)

A handle that cannot be decoded raises :class:`~tracemq.protocol.recall.RecallHandleError`
(also a ``ValueError``) before anything is sent.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from tracemq.admin import REPLIES_REJECTED
from tracemq.errors import RecallError
from tracemq.errors import RecallTimeoutError as RecallTimeoutError  # its old home
from tracemq.log import get_logger
from tracemq.protocol import admin as admin_proto
from tracemq.protocol._envelope import ProtocolError

log = get_logger("producer.recall")


class RecallStatus(enum.StrEnum):
    #: applied now: the message will not be delivered
    RECALLED = "RECALLED"
    #: an earlier recall applied it: the message will not be delivered
    ALREADY_RECALLED = "ALREADY_RECALLED"
    #: the broker had delivered it, or started to: consumers get it
    TOO_LATE = "TOO_LATE"


@dataclass(frozen=True, slots=True)
class RecallResult:
    """What :meth:`~tracemq.Producer.recall` returns; ``recalled`` says whether the message is
    kept from consumers."""

    status: RecallStatus
    msg_id: str
    broker: str
    detail: str = ""

    @property
    def recalled(self) -> bool:
        return self.status in (RecallStatus.RECALLED, RecallStatus.ALREADY_RECALLED)


class ReplyListener:
    """Reads ``tracemq.admin.reply`` from its end at :meth:`start`; :meth:`wait` returns the
    body of the reply to one request. One wait at a time (the caller serialises)."""

    def __init__(self, control_bootstrap: str) -> None:
        self.control_bootstrap = control_bootstrap
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.control_bootstrap, group_id=None, enable_auto_commit=False
        )
        await consumer.start()
        try:
            await consumer.topics()
            parts = consumer.partitions_for_topic(admin_proto.ADMIN_REPLY_TOPIC)
            if not parts:
                raise RecallError(
                    f"no broker has started on {self.control_bootstrap}: "
                    f"{admin_proto.ADMIN_REPLY_TOPIC!r} does not exist"
                )
            tps = [TopicPartition(admin_proto.ADMIN_REPLY_TOPIC, p) for p in sorted(parts)]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the position now: replies written later are all seen
                await consumer.position(tp)
        except BaseException:
            await asyncio.wait_for(consumer.stop(), 10)
            raise
        self._consumer = consumer

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await asyncio.wait_for(consumer.stop(), 10)

    async def wait(self, broker: str, request_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The reply body of ``request_id`` from ``broker``, or None after ``timeout_s``."""
        assert self._consumer is not None, "call start() first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            batch = await self._consumer.getmany(timeout_ms=max(1, int(min(left, 0.5) * 1000)))
            for rec in (r for recs in batch.values() for r in recs):
                try:
                    reply = admin_proto.decode_reply(rec.value)
                except ProtocolError as exc:
                    REPLIES_REJECTED.labels(exc.kind).inc()
                    log.warning(
                        "reply record skipped",
                        reason=exc.kind,
                        topic=rec.topic,
                        partition=rec.partition,
                        offset=rec.offset,
                    )
                    continue
                if reply.request_id == request_id and reply.broker == broker:
                    return reply.body
        return None
