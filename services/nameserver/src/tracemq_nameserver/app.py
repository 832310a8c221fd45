"""The nameserver service: applies the control topic to Redis and expires silent peers.

Several nameservers share one Kafka consumer group, so each applies a share of the control
topic's partitions; records are keyed by sender, so one sender's records stay in order. Offsets
are committed only after a batch is applied to Redis: a crash re-applies, and every write is
idempotent (stale records — older than what Redis holds — are ignored by the scripts).

Every record must be signed (:mod:`tracemq.protocol.signing`): broker records with a key of
``TRACEMQ_AUTH_BROKER_KEYS``, client records with one of ``TRACEMQ_AUTH_CLIENT_KEYS``. Unsigned,
forged, expired, wrong-role and replayed records are refused (reasons ``unsigned``, ``forged``,
``expired``, ``wrong_role``, ``replayed``) and never reach Redis. Replays are checked against
signatures remembered in Redis for ``TRACEMQ_AUTH_MAX_AGE_MS``, with the coordinates where each
was first read: every nameserver of an HA group shares them, and the same record read again at
the same coordinates (a re-delivery after a crash or a rebalance) is applied again, not refused.

A record that cannot be applied — not msgpack, unknown version or type, a bad field, a
timestamp older than the expiry or further ahead than the allowed clock skew, data Redis
refuses — is rejected: counted in ``tracemq_namesrv_control_rejected_total{reason}``, logged
with its topic, partition and offset, and committed past with its batch. Only a Redis outage
holds the loop (the record is retried until Redis is back); a loop that dies anyway ends the
process with exit code 1 (:func:`tracemq.service.spawn`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord
from redis.exceptions import RedisError, ResponseError
from tracemq import kafka_security
from tracemq.clock import now_ms
from tracemq.log import get_logger
from tracemq.offset_reset import KAFKA_AUTO_OFFSET_RESET, OffsetGuard
from tracemq.protocol import ProtocolError, control
from tracemq.protocol.signing import SignatureError, coordinates
from tracemq.routing.registry import check_reachable, connect
from tracemq.service import spawn
from tracemq.tasks import TaskGroup
from tracemq.transport import admin_client, ensure_topic

from tracemq_nameserver import metrics
from tracemq_nameserver.registry import RegistryWriter
from tracemq_nameserver.settings import NamesrvSettings

log = get_logger("nameserver")

#: Times Redis may refuse (answer with an error to) one record's write before it is rejected.
REDIS_REFUSALS_MAX = 5


class NameServer:
    """Consumes the control topic, writes routes, expires silent brokers and clients."""

    name = "nameserver"

    def __init__(self, settings: NamesrvSettings) -> None:
        self.settings = settings
        self.redis = connect(settings.redis_url)
        self.writer = RegistryWriter(
            self.redis, settings.redis_prefix, settings.namesrv_tombstone_ttl_s
        )
        self.verifier = settings.verifier("nameserver", ("broker", "client"))
        self.consumer: AIOKafkaConsumer | None = None
        self._tasks = TaskGroup("nameserver", spawner=spawn)
        self._stopping = asyncio.Event()
        self.applied = 0
        self.last_error: str | None = None

    async def start(self) -> None:
        async with admin_client(self.settings.control_bootstrap) as admin:
            await ensure_topic(
                admin, self.settings.control_topic, self.settings.namesrv_control_partitions
            )
        await check_reachable(self.redis, self.settings.redis_url)
        self.consumer = AIOKafkaConsumer(
            self.settings.control_topic,
            bootstrap_servers=self.settings.control_bootstrap,
            **kafka_security.client_kwargs(self.settings.control_bootstrap),
            group_id=self.settings.namesrv_group,
            enable_auto_commit=False,
            # a control topic that lost its log (a restarted in-memory cluster) is read again
            # from its beginning, counted, instead of waiting past its end (tracemq.offset_reset)
            auto_offset_reset=KAFKA_AUTO_OFFSET_RESET,
            session_timeout_ms=self.settings.namesrv_session_timeout_ms,
            heartbeat_interval_ms=max(300, self.settings.namesrv_session_timeout_ms // 5),
            max_poll_records=500,
        )
        self.guard = OffsetGuard(
            self.consumer,
            counter=metrics.OFFSET_RESETS,
            bootstrap=self.settings.control_bootstrap,
            context={"group": self.settings.namesrv_group},
        )
        # No rebalance listener doing I/O here: positions come from the group's commits, a
        # partition without one from the guard (NoOffsetForPartition in getmany), and the guard's
        # idle check catches a position past a lost log. (A listener that read offsets and
        # probed the log held up a rebalance on Tansu long enough that a restarted nameserver
        # never got its partitions after a failover.)
        await kafka_security.start(self.consumer, self.settings.control_bootstrap)
        self._tasks.spawn(self._consume(), name="namesrv-consume")
        self._tasks.spawn(self._expire_loop(), name="namesrv-expire")

    async def stop(self) -> None:
        self._stopping.set()
        await self._tasks.aclose()
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.consumer.stop(), 10)
            await self.guard.close()
        await self.redis.aclose()

    def health(self) -> dict[str, Any]:
        ok = self._tasks.alive()
        return {"ok": ok, "applied": self.applied, "last_error": self.last_error}

    # -- control topic ---------------------------------------------------------------------
    async def _consume(self) -> None:
        assert self.consumer is not None
        while True:
            batches = await self.guard.getmany(timeout_ms=1000, max_records=500)
            if not batches:
                continue
            for records in batches.values():
                for rec in records:
                    await self._apply_with_retry(rec)
            await self._commit()

    async def _commit(self) -> None:
        assert self.consumer is not None
        try:
            await self.consumer.commit()
        except Exception as exc:  # a rebalance mid-commit: the next owner re-applies, harmless
            log.warning("control offset commit failed", error=repr(exc))

    async def _apply_with_retry(self, rec: ConsumerRecord[bytes, bytes]) -> None:
        """Apply one record. A Redis outage is retried until Redis is back (no valid record is
        lost); anything else that stops this record from being applied rejects it (counted,
        logged with its coordinates, committed past with the batch): one record must never
        stop or stall the loop for the records behind it."""
        where = {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}
        backoff = 0.1
        refusals = 0
        while True:
            try:
                await self.apply(rec.value, where=where)
                self.last_error = None
                return
            except ResponseError as exc:
                # Redis is up but refuses (a script failing on this record's data, OOM, a
                # read-only replica): retried a few times, then this record is given up
                refusals += 1
                if refusals >= REDIS_REFUSALS_MAX:
                    self._reject("redis_refused", f"{exc!r}", where)
                    return
                metrics.REDIS_ERRORS.inc()
                self.last_error = f"redis: {exc!r}"
                log.warning("redis refused a write; retrying", error=repr(exc), **where)
            except (RedisError, OSError) as exc:
                metrics.REDIS_ERRORS.inc()
                self.last_error = f"redis: {exc!r}"
                log.warning("redis write failed; retrying", error=repr(exc), **where)
            except Exception as exc:  # a bug or a record no check foresaw: skip it, go on
                self._reject("apply_failed", f"{exc.__class__.__name__}: {exc}", where, exc=exc)
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _reject(
        self,
        reason: str,
        error: str,
        where: dict[str, Any] | None,
        *,
        exc: BaseException | None = None,
        key_id: str | None = None,
    ) -> str:
        metrics.CONTROL_REJECTED.labels(reason).inc()
        kw = {"reason": reason, "error": error, **(where or {})}
        if key_id is not None:
            kw["key_id"] = key_id
        if exc is not None:
            log.error("control record rejected", exc_info=exc, **kw)
        elif reason == "expired":
            # also what a nameserver re-reading an old stretch of the topic meets
            log.info("control record rejected", **kw)
        elif reason == "stale":
            # normal when a nameserver replays the topic after a restart: counted, not noise
            log.debug("control record rejected", **kw)
        else:
            log.warning("control record rejected", **kw)
        return f"skipped:{reason}"

    async def apply(self, data: bytes | None, *, where: dict[str, Any] | None = None) -> str:
        """Decode and apply one control record. Returns what happened (for tests and logs).

        ``where`` (topic, partition, offset) goes into the log line of a rejected record."""
        now = now_ms()
        try:
            record, seal = self.verifier.open(
                data, "control", control.decode, control.signer_roles, now
            )
        except SignatureError as exc:
            return self._reject(exc.kind, str(exc), where, key_id=exc.key_id)
        except ProtocolError as exc:
            return self._reject(exc.kind, str(exc), where)
        if seal is not None:
            first = await self.writer.mark_seen(
                seal.replay_key,
                coordinates(where),
                seal.ts + self.verifier.max_age_ms + 1 - now,
            )
            if not first:
                return self._reject(
                    "replayed", "signature already seen elsewhere", where, key_id=seal.kid
                )
        if record.ts < now - self.settings.namesrv_expiry_ms:
            return self._reject("stale", f"ts {record.ts} is older than the expiry", where)
        if record.ts > now + self.settings.namesrv_max_clock_skew_ms:
            # applied, it would shadow the sender's real heartbeats (older) until that time
            return self._reject("future", f"ts {record.ts} is {record.ts - now} ms ahead", where)
        try:
            outcome = await self._apply_record(record)
        except ValueError as exc:  # e.g. an invalid topic name inside a valid envelope
            return self._reject("schema", str(exc), where)
        if outcome == "stale":
            metrics.CONTROL_REJECTED.labels("stale").inc()
            return "skipped:stale"
        metrics.CONTROL_RECORDS.labels(record.type).inc()
        self.applied += 1
        return outcome

    async def _apply_record(self, record: Any) -> str:
        if isinstance(record, control.BrokerRegister):
            status, changed = await self.writer.register_broker(record)
            if status == "new":
                log.info(
                    "broker registered",
                    broker=record.broker.broker_name,
                    cluster=record.broker.cluster,
                    topics=len(record.topics),
                )
            if changed:
                metrics.ROUTE_CHANGES.inc()
            return status
        if isinstance(record, control.BrokerUnregister):
            status, _ = await self.writer.unregister_broker(record)
            if status != "stale":
                log.info("broker unregistered", broker=record.broker_name)
                metrics.ROUTE_CHANGES.inc()
            return status
        if isinstance(record, control.ClientHeartbeat):
            return "ok" if await self.writer.client_heartbeat(record) else "stale"
        if isinstance(record, control.ClientUnregister):
            return "ok" if await self.writer.client_unregister(record) else "stale"
        raise ValueError(f"unhandled record {record!r}")

    # -- expiry ----------------------------------------------------------------------------
    async def _expire_loop(self) -> None:
        interval = self.settings.namesrv_scan_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            cutoff = now_ms() - self.settings.namesrv_expiry_ms
            try:
                brokers = await self.writer.expire_brokers(cutoff)
                clients = await self.writer.expire_clients(cutoff)
                metrics.LIVE_BROKERS.set(await self.writer.live_broker_count())
            except (RedisError, OSError) as exc:
                metrics.REDIS_ERRORS.inc()
                self.last_error = f"redis: {exc!r}"
                continue
            if brokers:
                metrics.EXPIRED.labels("broker").inc(len(brokers))
                metrics.ROUTE_CHANGES.inc()
                log.warning("brokers expired", brokers=brokers)
            if clients:
                metrics.EXPIRED.labels("client").inc(len(clients))
                log.info("clients expired", clients=clients)
