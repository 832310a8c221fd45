"""The broker service: topic table, admin requests, registration with the nameserver.

``role=business`` owns business topics; ``role=trace`` additionally creates and hosts the trace
topic (``RMQ_SYS_TRACE_TOPIC``, one queue by default) on its own Kafka cluster, isolating trace
I/O from business I/O.

A business broker also runs the schedule service (:mod:`tracemq_broker.schedule`: delay levels
and consumer retries, on ``SCHEDULE_TOPIC_XXXX`` with one queue per level) and the transaction
service (:mod:`tracemq_broker.transaction`: half messages, commit / rollback, check-back, on
``RMQ_SYS_TRANS_HALF_TOPIC`` and ``RMQ_SYS_TRANS_OP_HALF_TOPIC``). Those system topics are
created at start, kept in the topic table and registered like any topic, so a producer learns
from the route which brokers run the services and how many delay levels each has. Retry and
dead-letter topics (``%RETRY%<group>``, ``%DLQ%<group>``, one queue each) are created on a
consumer's ``retry.ensure`` request or when the schedule service first forwards to them.

Registrations, heartbeats and unregistrations are sealed with the broker's key
(:mod:`tracemq.protocol.signing`); admin requests are acted on only when signed by an admin key
(``retry.ensure`` also by a client key), fresh and not seen before — anything else is counted in
``tracemq_broker_admin_rejected_total{reason}`` and never applied.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from tracemq import kafka_security
from tracemq.clock import now_ms
from tracemq.errors import ConfigError
from tracemq.log import get_logger
from tracemq.naming import (
    DLQ_GROUP_PREFIX,
    HALF_TOPIC,
    OP_HALF_TOPIC,
    RETRY_GROUP_PREFIX,
    SCHEDULE_TOPIC,
    kafka_topic,
)
from tracemq.protocol import ProtocolError, control, show
from tracemq.protocol import admin as admin_proto
from tracemq.protocol.control import PERM_RW, BrokerInfo, TopicConfig
from tracemq.protocol.signing import (
    ReplayGuard,
    SignatureError,
    coordinates,
    maybe_seal,
    unseal,
)
from tracemq.protocol.transaction import TXCHECK_TOPIC
from tracemq.service import spawn
from tracemq.tasks import TaskGroup, cancel_and_wait
from tracemq.transport import ADMIN_TIMEOUT_MS, ensure_topic

from tracemq_broker import metrics
from tracemq_broker.admin import AdminRejected, TopicAdmin
from tracemq_broker.schedule import ScheduleService
from tracemq_broker.settings import BrokerSettings
from tracemq_broker.topic_table import TopicTable
from tracemq_broker.transaction import TransactionService

log = get_logger("broker")

#: Admin replies being sent at once; past this a reply is dropped (counted), not waited for.
ADMIN_REPLIES_MAX = 64
#: How long one admin reply may take to be acknowledged by the control cluster.
ADMIN_REPLY_TIMEOUT_S = 10.0


class Broker:
    """One broker process (business or trace role)."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.name = f"broker:{settings.broker_name}"
        self.table = TopicTable(settings.broker_data_dir / "topics.json")
        self.verifier = settings.verifier(f"broker {settings.broker_name}", ("admin",))
        self.replays = ReplayGuard(self.verifier.max_age_ms)
        self.signer = settings.signer()
        if self.signer is None and not settings.auth_disabled:
            raise ConfigError(
                "a broker signs its registrations: set TRACEMQ_ACCESS_KEY_ID and "
                "TRACEMQ_SECRET_KEY to a key of the nameserver's TRACEMQ_AUTH_BROKER_KEYS"
            )
        self.kafka_admin: AIOKafkaAdminClient | None = None
        self.control_admin: AIOKafkaAdminClient | None = None
        self.producer: AIOKafkaProducer | None = None
        self.admin_consumer: AIOKafkaConsumer | None = None
        self.topic_admin: TopicAdmin | None = None
        self.schedule: ScheduleService | None = None
        self.transactions: TransactionService | None = None
        self._tasks = TaskGroup("broker", spawner=spawn)
        self._replies: set[asyncio.Task[None]] = set()
        self._register_now = asyncio.Event()
        self.last_registered_ms = 0
        self.last_error: str | None = None

    @property
    def info(self) -> BrokerInfo:
        s = self.settings
        return BrokerInfo(
            cluster=s.broker_cluster,
            broker_name=s.broker_name,
            address=s.advertised_address,
            data_bootstrap=s.broker_data_bootstrap,
            role=s.broker_role,
            region_id=s.broker_region_id,
            trace_on=s.broker_trace_on,
            trace_topic_enable=s.hosts_trace_topic,
            http_url=f"http://{s.advertised_address}",
        )

    async def start(self) -> None:
        s = self.settings
        self.table.load()
        self.kafka_admin = AIOKafkaAdminClient(
            bootstrap_servers=s.broker_data_bootstrap,
            **kafka_security.client_kwargs(s.broker_data_bootstrap),
            request_timeout_ms=ADMIN_TIMEOUT_MS,
        )
        await kafka_security.start(self.kafka_admin, s.broker_data_bootstrap)
        self.control_admin = AIOKafkaAdminClient(
            bootstrap_servers=s.control_bootstrap,
            **kafka_security.client_kwargs(s.control_bootstrap),
            request_timeout_ms=ADMIN_TIMEOUT_MS,
        )
        await kafka_security.start(self.control_admin, s.control_bootstrap)
        control_topics = [admin_proto.ADMIN_TOPIC, admin_proto.ADMIN_REPLY_TOPIC]
        if s.runs_transactions:
            control_topics.append(TXCHECK_TOPIC)
        for t in control_topics:
            await ensure_topic(self.control_admin, t, 1)
        self.topic_admin = TopicAdmin(
            s.broker_name, self.table, self.kafka_admin, self._request_registration
        )
        # The embedded transport keeps data in memory: recreate what the table says exists.
        for topic, cfg in list(self.table.topics.items()):
            await self.topic_admin.apply(topic, cfg)
        if s.hosts_trace_topic and s.broker_trace_topic not in self.table.topics:
            q = s.broker_trace_topic_queues
            await self.topic_admin.apply(
                s.broker_trace_topic, TopicConfig(read_queues=q, write_queues=q, perm=PERM_RW)
            )
        levels = s.delay_levels_ms
        if s.runs_schedule:
            n = len(levels)
            await self.topic_admin.apply(
                SCHEDULE_TOPIC, TopicConfig(read_queues=n, write_queues=n, perm=PERM_RW)
            )
        if s.runs_transactions:
            for t in (HALF_TOPIC, OP_HALF_TOPIC):
                await self.topic_admin.apply(
                    t, TopicConfig(read_queues=1, write_queues=1, perm=PERM_RW)
                )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=s.control_bootstrap,
            **kafka_security.client_kwargs(s.control_bootstrap),
            linger_ms=0,
        )
        await kafka_security.start(self.producer, s.control_bootstrap)
        if s.runs_schedule:
            self.schedule = ScheduleService(
                broker_name=s.broker_name,
                bootstrap=s.broker_data_bootstrap,
                delays_ms=levels,
                state_dir=s.broker_data_dir / "schedule",
                resolve=self.resolve_target,
                answer=self._answer_recall,
            )
            await self.schedule.start()
        if s.runs_transactions:
            self.transactions = TransactionService(
                broker_name=s.broker_name,
                bootstrap=s.broker_data_bootstrap,
                state_path=s.broker_data_dir / "transaction" / "state.json",
                resolve=self.resolve_target,
                send_check=self._send_check,
                timeout_ms=s.broker_transaction_timeout_ms,
                check_interval_ms=s.broker_transaction_check_interval_ms,
                check_max=s.broker_transaction_check_max,
                broker_address=s.advertised_address,
                region_id=s.broker_region_id,
            )
            await self.transactions.start()
        # Position the admin consumer before registering, so no request to us can be missed.
        self.admin_consumer = AIOKafkaConsumer(
            admin_proto.ADMIN_TOPIC,
            bootstrap_servers=s.control_bootstrap,
            **kafka_security.client_kwargs(s.control_bootstrap),
            group_id=None,
            auto_offset_reset="latest",
            enable_auto_commit=False,
        )
        await kafka_security.start(self.admin_consumer, s.control_bootstrap)
        await self._position_admin_consumer()
        await self.register()
        self._tasks.spawn(self._heartbeat_loop(), name="broker-heartbeat")
        self._tasks.spawn(self._heal_loop(), name="broker-heal-topics")
        self._tasks.spawn(self._admin_loop(), name="broker-admin")
        metrics.TOPICS.set(len(self.table.topics))
        log.info(
            "broker started",
            broker=s.broker_name,
            role=s.broker_role,
            topics=sorted(self.table.topics),
        )

    async def _position_admin_consumer(self) -> None:
        assert self.admin_consumer is not None
        deadline = asyncio.get_running_loop().time() + 15
        while not self.admin_consumer.assignment():
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("admin topic partitions were never assigned")
            await asyncio.sleep(0.05)
        for tp in self.admin_consumer.assignment():
            await self.admin_consumer.position(tp)

    async def stop(self) -> None:
        await self._tasks.aclose()
        if self._replies:  # let the last replies out (each is bounded), then go on
            await asyncio.wait(set(self._replies), timeout=ADMIN_REPLY_TIMEOUT_S)
            await cancel_and_wait(self._replies)
        for svc in (self.schedule, self.transactions):
            if svc is not None:
                with contextlib.suppress(Exception):
                    await svc.stop()
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self._send_control(
                    control.BrokerUnregister(
                        ts=now_ms(),
                        cluster=self.settings.broker_cluster,
                        broker_name=self.settings.broker_name,
                    )
                )
                log.info("unregistered", broker=self.settings.broker_name)
            await self.producer.stop()
        if self.admin_consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.admin_consumer.stop(), 10)
        for a in (self.kafka_admin, self.control_admin):
            if a is not None:
                with contextlib.suppress(Exception):
                    await a.close()

    def health(self) -> dict[str, Any]:
        ok = self._tasks.alive()
        out: dict[str, Any] = {
            "broker": self.settings.broker_name,
            "role": self.settings.broker_role,
            "topics": len(self.table.topics),
            "last_registered_ms": self.last_registered_ms,
            "last_error": self.last_error,
        }
        if self.schedule is not None:
            out["schedule"] = {"ok": self.schedule.healthy(), "buffered": self.schedule.lag()}
            ok = ok and self.schedule.healthy()
        if self.transactions is not None:
            out["transactions"] = {
                "ok": self.transactions.healthy(),
                "pending": len(self.transactions.pending),
            }
            ok = ok and self.transactions.healthy()
        return {"ok": ok, **out}

    # -- forwarding targets of the schedule and transaction services -----------------------
    async def resolve_target(self, topic: str, queue_id: int) -> tuple[str, int] | None:
        """Kafka topic and partition of queue ``queue_id`` of ``topic`` on this broker, or None
        when this broker does not host ``topic``. A missing ``%RETRY%`` / ``%DLQ%`` topic is
        created (the schedule service delivers retries to it); one whose name this broker
        refuses is None too. Raises only when the data cluster fails (the caller retries)."""
        assert self.topic_admin is not None
        cfg = self.table.topics.get(topic)
        if cfg is None and topic.startswith((RETRY_GROUP_PREFIX, DLQ_GROUP_PREFIX)):
            try:
                await self.topic_admin.ensure_group_topic(topic)
            except AdminRejected as exc:
                # the name can never be a topic here (e.g. its Kafka name would be too long):
                # undeliverable, not a reason to retry the record (and all behind it) forever
                log.error("retry topic refused", topic=show(topic), error=str(exc))
                return None
            except Exception as exc:
                log.error("could not create a retry topic", topic=topic, error=repr(exc))
                raise
            cfg = self.table.topics.get(topic)
        if cfg is None:
            return None
        queues = max(cfg.read_queues, cfg.write_queues)
        return kafka_topic(self.settings.broker_name, topic), queue_id % queues

    async def _send_check(self, key: bytes, value: bytes) -> None:
        assert self.producer is not None
        await self.producer.send_and_wait(TXCHECK_TOPIC, value, key=key)

    # -- registration ----------------------------------------------------------------------
    async def _request_registration(self) -> None:
        metrics.TOPICS.set(len(self.table.topics))
        self._register_now.set()

    async def register(self) -> None:
        rec = control.BrokerRegister(
            type="broker.heartbeat" if self.last_registered_ms else "broker.register",
            ts=now_ms(),
            broker=self.info,
            topics=dict(self.table.topics),
        )
        await self._send_control(rec)
        self.last_registered_ms = rec.ts

    async def _heal_topics(self) -> None:
        """Recreate Kafka topics the data cluster lost (a memory-only transport restarted)."""
        assert self.kafka_admin is not None and self.topic_admin is not None
        existing = set(await self.kafka_admin.list_topics())
        for topic, cfg in list(self.table.topics.items()):
            if kafka_topic(self.settings.broker_name, topic) not in existing:
                log.warning("Kafka topic missing on the data cluster; recreating", topic=topic)
                await self.topic_admin.apply(topic, cfg)

    async def _send_control(self, rec: Any) -> None:
        assert self.producer is not None
        await self.producer.send_and_wait(
            self.settings.control_topic,
            maybe_seal(self.signer, "control", control.encode(rec)),
            key=self.settings.broker_name.encode(),
        )

    async def _heal_loop(self) -> None:
        """Heal the data cluster's topics on the heartbeat's rhythm, but apart from it: a hung
        data cluster stalls this loop only. The heartbeat goes to the control cluster and must
        keep the broker's routes alive meanwhile (a trace broker that expired during a 20 s
        hang of its cluster made every client drop traces for want of a route)."""
        interval = self.settings.broker_heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self._heal_topics()
            except Exception as exc:  # the data cluster is down or hung: try again next time
                self.last_error = f"heal topics: {exc!r}"
                log.warning("topic healing failed", error=repr(exc))

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.broker_heartbeat_interval_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._register_now.wait(), interval)
            self._register_now.clear()
            try:
                await self.register()
                metrics.REGISTRATIONS.labels("ok").inc()
                self.last_error = None
            except Exception as exc:  # keep heartbeating through transient Kafka errors
                metrics.REGISTRATIONS.labels("error").inc()
                self.last_error = f"register: {exc!r}"
                log.warning("registration failed", error=repr(exc))

    # -- admin -----------------------------------------------------------------------------
    async def _admin_loop(self) -> None:
        """Act on the admin requests addressed to this broker, one at a time, in order.

        The loop never waits for a reply to be acknowledged (replies go out from at most
        :data:`ADMIN_REPLIES_MAX` tasks, each bounded by :data:`ADMIN_REPLY_TIMEOUT_S`), and a
        record it cannot act on is counted in ``tracemq_broker_admin_rejected_total{reason}``,
        logged with its coordinates and skipped. Every broker verifies every request it reads
        (as it decodes every one), so each counts the refused records it saw; only a request
        that is authentic, fresh, first seen and addressed to this broker is acted on."""
        assert self.admin_consumer is not None
        async for msg in self.admin_consumer:
            where = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
            try:
                req, seal = self.verifier.open(
                    msg.value, "admin", admin_proto.decode_request, admin_proto.signer_roles
                )
                if seal is not None:
                    self.replays.check(seal, coordinates(where))
            except SignatureError as exc:
                self._reject_admin(exc.kind, str(exc), where, key_id=exc.key_id)
                if exc.kind == "wrong_role":
                    # a genuine requester holding the wrong kind of key: tell it why (the
                    # signature checked out, so the request is its own); others get no reply
                    self._refuse_admin(msg.value, str(exc))
                continue
            except ProtocolError as exc:
                self._reject_admin(exc.kind, str(exc), where)
                continue
            if req.broker != self.settings.broker_name:
                continue
            try:
                reply = await self._handle_admin(req)
            except Exception as exc:  # a bug must not end admin for everyone behind this one
                self._reject_admin(
                    "apply_failed", f"{exc.__class__.__name__}: {exc}", where, exc_info=exc
                )
                continue
            self._send_reply(req, reply)

    def _refuse_admin(self, data: bytes | None, error: str) -> None:
        try:
            req = admin_proto.decode_request(unseal(data)[1])
        except ProtocolError:
            return
        if req.broker == self.settings.broker_name:
            reply = admin_proto.AdminReply(
                request_id=req.request_id,
                broker=self.settings.broker_name,
                ok=False,
                error=f"not authorized: {error}",
            )
            self._send_reply(req, reply)

    def _reject_admin(self, reason: str, error: str, where: dict[str, Any], **kw: Any) -> None:
        metrics.ADMIN_REJECTED.labels(reason).inc()
        log.warning("admin record rejected", reason=reason, error=error, **where, **kw)

    async def _handle_admin(self, req: admin_proto.AdminRequest) -> admin_proto.AdminReply:
        assert self.topic_admin is not None
        try:
            body = await self.topic_admin.handle(req)
            reply = admin_proto.AdminReply(
                request_id=req.request_id, broker=self.settings.broker_name, ok=True, body=body
            )
            metrics.ADMIN_REQUESTS.labels(req.type, "ok").inc()
            log.info(
                "admin request done",
                op=req.type,
                **{k: v for k, v in req.body.items() if k == "topic"},
            )
        except AdminRejected as exc:
            reply = admin_proto.AdminReply(
                request_id=req.request_id,
                broker=self.settings.broker_name,
                ok=False,
                error=str(exc),
            )
            metrics.ADMIN_REQUESTS.labels(req.type, "rejected").inc()
        except Exception as exc:
            reply = admin_proto.AdminReply(
                request_id=req.request_id,
                broker=self.settings.broker_name,
                ok=False,
                error=f"internal error: {exc!r}",
            )
            metrics.ADMIN_REQUESTS.labels(req.type, "error").inc()
            log.error("admin request failed", op=req.type, error=repr(exc))
        return reply

    def _answer_recall(self, request_id: str, body: dict[str, Any]) -> None:
        """The schedule service's answer to a recall (``tracemq.protocol.recall``): an admin
        reply, so it goes where a requester already listens, by the same bounded path."""
        reply = admin_proto.AdminReply(
            request_id=request_id,
            broker=self.settings.broker_name,
            ok=True,
            body={**body, "region_id": self.settings.broker_region_id},
        )
        self._send_reply_to(admin_proto.ADMIN_REPLY_TOPIC, request_id, reply)

    def _send_reply(self, req: admin_proto.AdminRequest, reply: admin_proto.AdminReply) -> None:
        self._send_reply_to(req.reply_topic, req.request_id, reply)

    def _send_reply_to(self, topic: str, request_id: str, reply: admin_proto.AdminReply) -> None:
        """Send ``reply`` from a task of its own; with too many in flight (the control cluster
        is not answering) it is dropped and counted: the requester times out and may retry."""
        if len(self._replies) >= ADMIN_REPLIES_MAX:
            metrics.ADMIN_REPLIES.labels("dropped").inc()
            log.warning(
                "admin reply dropped: too many in flight",
                request_id=request_id,
                in_flight=len(self._replies),
            )
            return
        task = asyncio.create_task(
            self._reply(topic, request_id, admin_proto.encode(reply)),
            name=f"admin-reply-{request_id[:16]}",
        )
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _reply(self, topic: str, request_id: str, value: bytes) -> None:
        assert self.producer is not None
        try:
            await asyncio.wait_for(
                self.producer.send_and_wait(topic, value, key=request_id.encode()),
                ADMIN_REPLY_TIMEOUT_S,
            )
        except TimeoutError:
            metrics.ADMIN_REPLIES.labels("timeout").inc()
            log.warning("admin reply not acknowledged in time", request_id=request_id)
        except Exception as exc:
            metrics.ADMIN_REPLIES.labels("failed").inc()
            log.warning("admin reply not sent", request_id=request_id, error=repr(exc))
        else:
            metrics.ADMIN_REPLIES.labels("sent").inc()
