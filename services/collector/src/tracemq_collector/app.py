"""The trace collector service: ingest (see :mod:`ingest`), the trace store and lake, the query
API and viewer page, retention and compaction in the background, and its registration in Redis
so that any collector can answer for all (fan-out)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError
from tracemq.log import get_logger
from tracemq.naming import TRACE_TOPIC
from tracemq.routing import RouteCache, connect
from tracemq.routing.keys import RedisKeys
from tracemq.routing.registry import check_reachable
from tracemq.service import spawn
from tracemq.tasks import TaskGroup
from tracemq.trace import AsyncTraceDispatcher

from tracemq_collector import metrics
from tracemq_collector.api import add_routes
from tracemq_collector.backfill import Backfill
from tracemq_collector.groups import GroupHealth
from tracemq_collector.ingest import Ingestor
from tracemq_collector.lake import TraceLake, lake_filesystem
from tracemq_collector.lake_lookup import LakeLookup
from tracemq_collector.otlp import OtlpReceiver
from tracemq_collector.queries import Queries, sign_registration
from tracemq_collector.settings import CollectorSettings
from tracemq_collector.store import TraceStore

log = get_logger("collector")

REGISTER_INTERVAL_S = 10.0
RETENTION_INTERVAL_S = 60.0
COMPACT_INTERVAL_S = 600.0
#: How often the backfill looks for newly owned partitions when it has nothing to do.
BACKFILL_INTERVAL_S = 1.0
#: The producer group of the trace records made from OTLP spans
OTLP_GROUP = "tracemq-collector-otlp"
#: Trace contexts waiting for the trace topic (an OTLP batch of 512 consume spans makes 1024)
OTLP_QUEUE = 65_536


class Collector:
    name = "collector"

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        data = settings.collector_data_dir
        self.store = TraceStore(data / "traces.db", page_size=settings.collector_store_page_size)
        filesystem, root = lake_filesystem(
            settings.lake_uri(),
            s3_endpoint=settings.collector_lake_s3_endpoint,
            s3_region=settings.collector_lake_s3_region,
            s3_access_key=settings.collector_lake_s3_access_key,
            s3_secret_key=settings.collector_lake_s3_secret_key,
            s3_virtual_addressing=settings.collector_lake_s3_virtual_addressing,
        )
        self.lake = TraceLake(
            root,
            self.store,
            segment_max_rows=settings.collector_lake_segment_rows,
            filesystem=filesystem,
        )
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")
        self.redis = connect(settings.redis_url)
        self.keys = RedisKeys(settings.redis_prefix)
        self.routes = RouteCache(settings.redis_url, prefix=settings.redis_prefix)
        self.ingestor = Ingestor(settings, self.store, self.lake, self.routes, self.writer)
        self.backfill = Backfill(
            self.store,
            self.lake,
            int(settings.collector_retention_days * 86_400_000),
            ingested_from=self.ingestor.ingested_from,
        )
        self._backfill_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backfill")
        self.queries = Queries(
            self.store,
            redis=self.redis,
            prefix=settings.redis_prefix,
            self_url=settings.api_url,
            token=settings.collector_api_token,
            fanout_timeout_s=settings.collector_fanout_timeout_ms / 1000,
            lake=(
                LakeLookup(
                    self.lake.fs,
                    self.lake.root.as_posix(),
                    window_hours=settings.collector_lake_lookup_hours,
                    max_search_hours=settings.collector_lake_search_hours,
                )
                if settings.collector_lake_lookup
                else None
            ),
            lake_readers=settings.collector_lake_readers,
        )
        self.groups = GroupHealth(
            self.queries,
            self.redis,
            settings.redis_prefix,
            sample_interval_s=settings.collector_group_sample_interval_s,
            max_events=settings.collector_group_max_events,
        )
        self._tasks = TaskGroup("collector", spawner=spawn)
        self._opened = False
        # OTLP spans become trace records on the trace topic, through a dispatcher of its own:
        # from there they are ingested, deduplicated, stored and lake-written like any others.
        self.otlp_dispatcher = AsyncTraceDispatcher(
            group=OTLP_GROUP,
            route_cache=self.routes,
            trace_topic=(settings.topic_names() or [TRACE_TOPIC])[0],
            client_id=f"{OTLP_GROUP}@{settings.api_url}",
            queue_size=OTLP_QUEUE,
        )
        self.otlp = OtlpReceiver(
            self.otlp_dispatcher, redis=self.redis, subhistory_key=self.keys.subhistory
        )

    def add_routes(self, app: web.Application) -> None:
        add_routes(app, self.queries, self.settings.collector_api_token, self.groups, self.otlp)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    async def start(self) -> None:
        self.settings.collector_data_dir.mkdir(parents=True, exist_ok=True)
        await self._run(self.store.open)
        self._opened = True
        recovered = await self._run(self.lake.recover)
        if recovered:
            log.warning("rewrote lake segments interrupted by a crash", files=len(recovered))
        down = await check_reachable(self.redis, self.settings.redis_url, tolerate_down=True)
        if down:
            log.warning("routing database down at start; retrying in the background", error=down)
        if self.settings.collector_api_token is None:
            log.warning(
                "no TRACEMQ_COLLECTOR_API_TOKEN: the API and /metrics answer anyone who can reach "
                "them (every trace, the quarantined raw records)",
                api=self.settings.api_url,
            )
        await self.routes.start()
        await self.ingestor.start()
        await self.otlp_dispatcher.start()
        await self._register()
        self._tasks.spawn(self._registration_loop(), name="collector-register")
        self._tasks.spawn(self._retention_loop(), name="collector-retention")
        self._tasks.spawn(self._compaction_loop(), name="collector-compaction")
        self._tasks.spawn(self.groups.run_sampler(), name="collector-group-sampler")
        if self.settings.collector_backfill:
            self._tasks.spawn(self._backfill_loop(), name="collector-backfill")
        log.info(
            "collector started",
            api=self.settings.api_url,
            trace_topics=self.settings.collector_trace_topics,
        )

    async def stop(self) -> None:
        self.backfill.stop()
        await self._tasks.aclose()
        self._backfill_pool.shutdown(wait=True)  # a running backfill returns after its batch
        await self._unregister()
        await self.otlp_dispatcher.shutdown()
        await self.ingestor.stop()  # flushes the lake and commits
        await self.routes.stop()
        await self.groups.close()
        await self.queries.close()
        if self._opened:
            await self._run(self.store.close)
        self.writer.shutdown(wait=True)
        await self.redis.aclose()

    def health(self) -> dict[str, Any]:
        ok = self.ingestor.healthy() and self._tasks.alive()
        return {
            "ok": ok,
            "events_stored": self.ingestor.events_stored,
            "last_batch_ms": self.ingestor.last_batch_ms,
            "clusters": sorted(self.ingestor.clusters),
            # the Kafka topics (<broker>.<trace topic>) being followed, per trace cluster
            "trace_topics": {b: sorted(c.topics) for b, c in self.ingestor.clusters.items()},
            # the trace partitions this member of the collector group owns now
            "assigned": sorted(
                f"{tp.topic}/{tp.partition}"
                for c in self.ingestor.clusters.values()
                for tp in c.assigned
            ),
            "api": self.settings.api_url,
            "lake": self.settings.lake_uri(),
            # a reset recovered from a lost log (ok stays true), but the operator must see it
            "offset_resets": self.ingestor.offset_resets(),
            # partitions taken over: copying their earlier events from the lake into the store
            "backfill": self.backfill.snapshot(),
        }

    async def _register(self) -> None:
        """Heartbeat in ``P collectors``, with the proof peers check before they trust this
        URL with the token (see :mod:`tracemq_collector.queries`)."""
        url, now = self.settings.api_url, int(time.time() * 1000)
        token = self.settings.collector_api_token
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.zadd(self.keys.collectors, {url: now})
                if token:
                    pipe.hset(
                        self.keys.collector_signatures, url, sign_registration(token, url, now)
                    )
                else:
                    pipe.hdel(self.keys.collector_signatures, url)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("collector registration failed", error=repr(exc))

    async def _unregister(self) -> None:
        with contextlib.suppress(Exception):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.zrem(self.keys.collectors, self.settings.api_url)
                pipe.hdel(self.keys.collector_signatures, self.settings.api_url)
                await pipe.execute()

    async def _registration_loop(self) -> None:
        while True:
            await asyncio.sleep(REGISTER_INTERVAL_S)
            await self._register()

    async def _retention_loop(self) -> None:
        """Delete expired events in small batches, yielding to ingest between batches."""
        while True:
            await asyncio.sleep(RETENTION_INTERVAL_S)
            cutoff = int((time.time() - self.settings.collector_retention_days * 86400) * 1000)
            while True:
                deleted = await self._run(self.store.delete_older_than, cutoff)
                metrics.RETENTION_DELETED.inc(deleted)
                if not deleted:
                    break
                await asyncio.sleep(0)

    def _owned(self) -> set[tuple[str, int]]:
        return {
            (tp.topic, tp.partition) for c in self.ingestor.clusters.values() for tp in c.assigned
        }

    async def _backfill_loop(self) -> None:
        """Backfill newly owned partitions one at a time, in a thread of their own."""
        loop = asyncio.get_running_loop()
        while True:
            self.backfill.assign(self._owned())
            try:
                worked = await loop.run_in_executor(self._backfill_pool, self.backfill.run_next)
            except Exception as exc:  # the loop must outlive any one partition's failure
                log.warning("backfill round failed", error=repr(exc)[:300])
                worked = False
            if not worked:
                await asyncio.sleep(BACKFILL_INTERVAL_S)

    async def _compaction_loop(self) -> None:
        while True:
            await asyncio.sleep(COMPACT_INTERVAL_S)
            cutoff = int(time.time() * 1000) - self.settings.collector_compact_after_ms
            try:
                # only the partitions this collector owns now: a shared lake's other
                # partitions are their owners' to compact
                owned = {
                    (tp.topic, tp.partition)
                    for c in self.ingestor.clusters.values()
                    for tp in c.assigned
                }
                since = cutoff - self.settings.collector_compact_lookback_ms
                merged = await self._run(
                    functools.partial(self.lake.compact, cutoff, owned, since_ms=since)
                )
                if merged:
                    log.info("lake compacted", hours=merged)
            except Exception as exc:
                log.warning("lake compaction failed", error=repr(exc))
