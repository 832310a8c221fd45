"""Admin client: topic create / update / delete / list on a broker, and a consumer group's retry
and dead-letter topics (``retry.ensure``), over the admin topic.

Requests are sealed (:mod:`tracemq.protocol.signing`) with ``signer``, by default the admin key
of the environment (``TRACEMQ_ADMIN_ACCESS_KEY_ID`` / ``TRACEMQ_ADMIN_SECRET_KEY``, else
``TRACEMQ_ACCESS_KEY_ID`` / ``TRACEMQ_SECRET_KEY``); a broker acts only on a request signed by a
key of the admin role (``retry.ensure``: admin or client).

The target broker must be registered (checked in the routing database first, so a typo gives
:class:`~tracemq.errors.UnknownBrokerError` at once instead of a time-out).

Replies come back on the one shared topic ``tracemq.admin.reply`` (brokers write replies
nowhere else); a client picks its own by ``request_id`` and broker, and skips records it
cannot decode (counted in ``tracemq_admin_replies_rejected_total{reason}``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import Counter

from tracemq import kafka_security
from tracemq.auth import SignerSettings
from tracemq.errors import AdminError, AdminTimeoutError, UnknownBrokerError
from tracemq.log import get_logger
from tracemq.naming import (
    dlq_topic,
    retry_topic,
    validate_group,
    validate_queue_count,
    validate_topic,
)
from tracemq.protocol import admin as proto
from tracemq.protocol._envelope import ProtocolError
from tracemq.protocol.signing import Signer, maybe_seal
from tracemq.routing.keys import DEFAULT_PREFIX
from tracemq.routing.registry import RegistryReader, connect
from tracemq.settings import load_settings

log = get_logger("admin")

REPLIES_REJECTED = Counter(
    "tracemq_admin_replies_rejected_total",
    "Records on the admin reply topic an AdminClient could not decode (skipped)",
    ["reason"],
)


class AdminClient:
    """Sends admin requests to brokers and waits for their replies."""

    def __init__(
        self,
        control_bootstrap: str,
        redis_url: str,
        *,
        redis_prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 15.0,
        signer: Signer | None = None,
    ) -> None:
        self.signer = signer if signer is not None else load_settings(SignerSettings).admin_signer()
        self.control_bootstrap = control_bootstrap
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix
        self.timeout_s = timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._redis = connect(redis_url)
        self._reader = RegistryReader(self._redis, redis_prefix)
        self._tps: list[TopicPartition] = []

    async def __aenter__(self) -> AdminClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.control_bootstrap,
            **kafka_security.client_kwargs(self.control_bootstrap),
        )
        await kafka_security.start(self._producer, self.control_bootstrap)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.control_bootstrap,
            **kafka_security.client_kwargs(self.control_bootstrap),
            group_id=None,
            enable_auto_commit=False,
        )
        await kafka_security.start(self._consumer, self.control_bootstrap)
        # Brokers create the reply topic with one partition; read every partition it may have.
        await self._consumer.topics()  # refreshes metadata without auto-creating anything
        parts = self._consumer.partitions_for_topic(proto.ADMIN_REPLY_TOPIC)
        if not parts:
            raise UnknownBrokerError(
                f"no broker has started on {self.control_bootstrap}: "
                f"{proto.ADMIN_REPLY_TOPIC!r} does not exist"
            )
        self._tps = [TopicPartition(proto.ADMIN_REPLY_TOPIC, p) for p in sorted(parts)]
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_end(*self._tps)
        for tp in self._tps:
            await self._consumer.position(tp)

    async def close(self) -> None:
        if self._producer:
            await self._producer.stop()
        if self._consumer:
            await asyncio.wait_for(self._consumer.stop(), 10)
        await self._redis.aclose()

    async def brokers(self) -> dict[str, dict[str, Any]]:
        return await self._reader.brokers()

    async def _target(self, broker: str) -> None:
        known = await self._reader.brokers()
        if broker not in known:
            names = ", ".join(sorted(known)) or "none"
            raise UnknownBrokerError(f"unknown broker {broker!r}; registered brokers: {names}")

    async def request(self, broker: str, op: proto.AdminOp, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request to ``broker`` and return the reply body; raise on error or time-out."""
        assert self._producer is not None and self._consumer is not None, "call start() first"
        await self._target(broker)
        req = proto.AdminRequest(
            type=op,
            request_id=uuid.uuid4().hex,
            broker=broker,
            ts=int(time.time() * 1000),
            body=body,
        )
        await self._producer.send_and_wait(
            proto.ADMIN_TOPIC,
            maybe_seal(self.signer, "admin", proto.encode(req)),
            key=broker.encode(),
        )
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            batch = await self._consumer.getmany(timeout_ms=int(min(left, 1.0) * 1000))
            for rec in (r for recs in batch.values() for r in recs):
                try:
                    reply = proto.decode_reply(rec.value)
                except ProtocolError as exc:
                    REPLIES_REJECTED.labels(exc.kind).inc()
                    log.warning(
                        "admin reply rejected",
                        reason=exc.kind,
                        error=str(exc),
                        topic=rec.topic,
                        partition=rec.partition,
                        offset=rec.offset,
                    )
                    continue
                if reply.request_id != req.request_id or reply.broker != broker:
                    continue  # another requester's reply (the reply topic is shared)
                if not reply.ok:
                    raise AdminError(f"broker {broker!r} refused {op}: {reply.error}")
                return reply.body
        unsigned = (
            "" if self.signer else " (this request was unsigned: set TRACEMQ_ADMIN_ACCESS_KEY_ID)"
        )
        raise AdminTimeoutError(
            f"no reply from broker {broker!r} to {op} within {self.timeout_s}s{unsigned}; a "
            "broker ignores unsigned, forged or expired requests (counted in "
            "tracemq_broker_admin_rejected_total)"
        )

    async def create_topic(
        self,
        broker: str,
        topic: str,
        *,
        read_queues: int = 8,
        write_queues: int = 8,
        perm: int = 6,
        wait_route: bool = True,
    ) -> dict[str, Any]:
        """Create ``topic`` on ``broker``; by default return once clients can see its route."""
        validate_topic(topic, allow_system=False)
        validate_queue_count(read_queues, "read_queues")
        validate_queue_count(write_queues, "write_queues")
        body = await self.request(
            broker,
            "topic.create",
            {
                "topic": topic,
                "read_queues": read_queues,
                "write_queues": write_queues,
                "perm": perm,
            },
        )
        if wait_route:
            await self._await_route(broker, topic, write_queues)
        return body

    async def _await_route(self, broker: str, topic: str, write_queues: int | None) -> None:
        """Wait until the nameserver has published the broker's new route (bounded)."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while asyncio.get_running_loop().time() < deadline:
            route = await self._reader.topic_route(topic)
            if any(
                q.broker == broker and write_queues in (None, q.write_queues) for q in route.queues
            ):
                return
            await asyncio.sleep(0.05)
        raise AdminTimeoutError(
            f"broker {broker!r} created {topic!r} but its route did not "
            f"appear within {self.timeout_s}s (is a nameserver running?)"
        )

    async def update_topic(
        self,
        broker: str,
        topic: str,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: int | None = None,
    ) -> dict[str, Any]:
        validate_topic(topic, allow_system=False)
        body: dict[str, Any] = {"topic": topic}
        if read_queues is not None:
            body["read_queues"] = validate_queue_count(read_queues, "read_queues")
        if write_queues is not None:
            body["write_queues"] = validate_queue_count(write_queues, "write_queues")
        if perm is not None:
            body["perm"] = perm
        reply = await self.request(broker, "topic.update", body)
        await self._await_route(broker, topic, write_queues)
        return reply

    async def delete_topic(self, broker: str, topic: str) -> dict[str, Any]:
        validate_topic(topic, allow_system=False)
        return await self.request(broker, "topic.delete", {"topic": topic})

    async def list_topics(self, broker: str) -> dict[str, Any]:
        return await self.request(broker, "topic.list", {})

    async def ensure_retry_topics(
        self, broker: str, group: str, *, wait_route: bool = True
    ) -> dict[str, Any]:
        """Have ``broker`` create ``%RETRY%<group>`` and ``%DLQ%<group>`` (one queue each) if
        missing; by default return once both are routed."""
        validate_group(group)
        validate_topic(retry_topic(group))
        validate_topic(dlq_topic(group))
        body = await self.request(broker, "retry.ensure", {"group": group})
        if wait_route:
            await self._await_route(broker, retry_topic(group), None)
            await self._await_route(broker, dlq_topic(group), None)
        return body
