"""Client-side route cache: Redis-backed, refreshed on change notifications and every 30 s.

While Redis is unreachable the cache keeps serving the last good routes (each failure is logged
and counted in ``tracemq_route_refresh_errors_total``); once Redis answers again, changes flow.
A topic with no cached route while Redis is down is a :class:`RoutingUnavailableError` that
names Redis, not a plain "no live broker hosts it", which would send the operator to the brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError

from tracemq.errors import NoRouteError, RoutingUnavailableError
from tracemq.log import get_logger
from tracemq.routing.keys import DEFAULT_PREFIX, RedisKeys
from tracemq.routing.model import TopicRoute
from tracemq.routing.registry import RegistryReader, connect, describe_failure
from tracemq.tasks import TaskGroup

ROUTE_REFRESH_ERRORS = Counter(
    "tracemq_route_refresh_errors_total",
    "Route look-ups or refreshes that failed because the routing database did not answer",
)
ROUTE_REFRESHES = Counter("tracemq_route_refreshes_total", "Route refreshes from the routing DB")

log = get_logger("routing")


class RouteCache:
    """Caches :class:`TopicRoute` per topic for one client process.

    ``get(topic)`` answers from the cache when it can and reads Redis on a miss.
    ``start()`` launches the change listener and the periodic refresh; ``stop()`` ends them.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        refresh_interval_s: float = 30.0,
        redis: aioredis.Redis | None = None,
    ) -> None:
        self._redis = redis or connect(redis_url)
        self._own_redis = redis is None
        self._reader = RegistryReader(self._redis, prefix)
        self._keys = RedisKeys(prefix)
        self._refresh_interval_s = refresh_interval_s
        self._routes: dict[str, TopicRoute] = {}
        self._tasks = TaskGroup("route cache")
        self._inflight: dict[str, asyncio.Future[TopicRoute]] = {}
        self._listeners: list[asyncio.Queue[str]] = []
        self._redis_url = redis_url
        #: topics whose last look-up failed on Redis with no cached route to fall back on
        self._unreachable: dict[str, str] = {}
        self.last_error: str | None = None

    @property
    def reader(self) -> RegistryReader:
        return self._reader

    async def start(self) -> None:
        if len(self._tasks):
            return
        self._tasks.spawn(self._listen(), name="route-change-listener")
        self._tasks.spawn(self._periodic(), name="route-periodic-refresh")

    async def stop(self) -> None:
        await self._tasks.aclose()
        if self._own_redis:
            await self._redis.aclose()

    async def __aenter__(self) -> RouteCache:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def cached(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    async def get(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The route of ``topic``; the last good one when Redis is down. Empty if unknown."""
        if not refresh and topic in self._routes:
            return self._routes[topic]
        return await self._refresh(topic)

    async def require(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """Like :meth:`get`, but raise :class:`NoRouteError` when no broker hosts ``topic``."""
        route = await self.get(topic, refresh=refresh)
        if not route.queues and not refresh:
            route = await self.get(topic, refresh=True)
        if not route.queues:
            raise self.missing(topic)
        return route

    def missing(self, topic: str) -> NoRouteError:
        """The error for a topic without queues: names Redis when Redis is why nothing is known."""
        cause = self._unreachable.get(topic)
        if cause is not None:
            return RoutingUnavailableError(
                f"no route for topic {topic!r} (the routing database; none cached): {cause}"
            )
        return NoRouteError(f"no route for topic {topic!r}: no live broker hosts it")

    def subscribe_changes(self, maxsize: int = 256) -> asyncio.Queue[str]:
        """A queue that receives the name of every topic whose route changed."""
        q: asyncio.Queue[str] = asyncio.Queue(maxsize=maxsize)
        self._listeners.append(q)
        return q

    async def _refresh(self, topic: str) -> TopicRoute:
        """One Redis read per topic at a time: concurrent callers share the in-flight one."""
        task = self._inflight.get(topic)
        if task is None:
            task = asyncio.ensure_future(self._fetch(topic))
            self._inflight[topic] = task
            task.add_done_callback(lambda _t: self._inflight.pop(topic, None))
        return await asyncio.shield(task)

    async def _fetch(self, topic: str) -> TopicRoute:
        try:
            route = await self._reader.topic_route(topic)
        except (RedisError, OSError) as exc:
            ROUTE_REFRESH_ERRORS.inc()
            self.last_error = f"{exc.__class__.__name__}: {exc}"
            log.warning(
                "route refresh failed; serving the last good route",
                topic=topic,
                error=self.last_error,
            )
            if topic in self._routes:
                return self._routes[topic]
            self._unreachable[topic] = describe_failure(exc, self._redis_url)
            return TopicRoute(topic=topic)
        ROUTE_REFRESHES.inc()
        self.last_error = None
        self._unreachable.pop(topic, None)
        old = self._routes.get(topic)
        self._routes[topic] = route
        if old is not None and old.queues != route.queues:
            self._notify(topic)
        return route

    def _notify(self, topic: str) -> None:
        for q in self._listeners:
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(topic)

    async def refresh_all(self) -> None:
        for topic in list(self._routes):
            await self._refresh(topic)

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            await self.refresh_all()

    async def _listen(self) -> None:
        """Follow the change channel; reconnect with backoff; resync everything after a gap."""
        backoff = 0.2
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._keys.route_changes)
                backoff = 0.2
                # Anything may have changed while we were not listening.
                await self.refresh_all()
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    await self._on_change(msg.get("data"))
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                raise
            except (RedisError, OSError) as exc:
                ROUTE_REFRESH_ERRORS.inc()
                self.last_error = f"{exc.__class__.__name__}: {exc}"
                log.warning("route change listener lost Redis; retrying", error=self.last_error)
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _on_change(self, data: object) -> None:
        try:
            change = json.loads(data) if isinstance(data, str | bytes) else {}
            topics = change.get("topics") or []
        except (ValueError, AttributeError):
            topics = []
        targets = [t for t in topics if t in self._routes] if topics else list(self._routes)
        for topic in targets:
            await self._refresh(topic)
