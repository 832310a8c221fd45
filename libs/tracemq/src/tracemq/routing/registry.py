"""Read-only views of the routing database (see :mod:`tracemq.routing.keys`)."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tracemq.clock import now_ms as now_ms  # re-exported by tracemq.routing
from tracemq.errors import ConfigError, RedisUnavailableError
from tracemq.redis_url import redact, split
from tracemq.routing.keys import DEFAULT_PREFIX, RedisKeys
from tracemq.routing.model import QueueRoute, TopicRoute


def connect(url: str) -> aioredis.Redis:
    """A Redis client for the routing database (strings in, strings out).

    ``url`` carries the password or ACL user and, with ``rediss://``, the TLS options (see
    :mod:`tracemq.redis_url`); a malformed URL raises :class:`ConfigError` here, not later."""
    try:
        base, tls = split(url)
    except ValueError as exc:
        raise ConfigError(f"Redis URL {redact(url)}: {exc}") from None
    # A pooled connection dies with a Redis restart; retry once or twice on a fresh one.
    return aioredis.Redis.from_url(
        base,
        decode_responses=True,
        socket_connect_timeout=2,
        socket_timeout=5,
        health_check_interval=15,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        **tls,
    )


def describe_failure(exc: BaseException, url: str) -> str:
    """One line for a failed Redis call: which Redis (password hidden) and what went wrong;
    a refused login says so, since retrying will not fix it."""
    where = redact(url)
    detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    if is_auth_failure(exc):
        return (
            f"Redis at {where} refused the login ({detail}); check the user and password in "
            "TRACEMQ_REDIS_URL"
        )
    low = detail.lower()
    if "certificate" in low or "ssl" in low or "tls" in low:
        return (
            f"Redis at {where}: the TLS handshake failed ({detail}); check rediss:// and "
            "ssl_ca_certs (the CA that signed the server's certificate) in TRACEMQ_REDIS_URL"
        )
    return f"Redis at {where} did not answer ({detail})"


def is_auth_failure(exc: BaseException) -> bool:
    """A wrong or missing password or ACL user (``NOAUTH``, ``WRONGPASS``, ``NOPERM``)."""
    if isinstance(exc, (AuthenticationError, AuthorizationError)):
        return True
    text = str(exc)
    return isinstance(exc, ResponseError) and text.startswith(("NOAUTH", "WRONGPASS", "NOPERM"))


async def check_reachable(
    redis: aioredis.Redis, url: str, *, tolerate_down: bool = False
) -> str | None:
    """PING at service start; raise :class:`RedisUnavailableError` with :func:`describe_failure`'s
    line, so a wrong password stops the service with a message that names the Redis.

    With ``tolerate_down`` a Redis that does not answer is returned as that line (the service
    rides the outage out), but a refused login still raises: retrying cannot fix it."""
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        line = describe_failure(exc, url)
        if tolerate_down and not is_auth_failure(exc):
            return line
        raise RedisUnavailableError(line) from exc
    return None


class RegistryReader:
    """Reads brokers, routes and subscriptions; used by clients, the CLI and the collector."""

    def __init__(self, redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.redis = redis
        self.keys = RedisKeys(prefix)

    async def topic_route(self, topic: str) -> TopicRoute:
        raw = await self.redis.hgetall(self.keys.route(topic))
        queues = sorted((QueueRoute.from_json(v) for v in raw.values()), key=lambda q: q.broker)
        return TopicRoute(topic=topic, queues=tuple(queues), fetched_at_ms=now_ms())

    async def topics(self) -> list[str]:
        return sorted(_s(t) for t in await self.redis.smembers(self.keys.topics))

    async def brokers(self) -> dict[str, dict[str, Any]]:
        """Live brokers: name → info dict plus ``last_seen`` and ``topics``."""
        raw_names: list[str] = await self.redis.zrange(self.keys.brokers, 0, -1)  # type: ignore[assignment]
        names = [_s(n) for n in raw_names]
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            h = await self.redis.hgetall(self.keys.broker(name))
            if not h:
                continue
            info = json.loads(h.get("info", "{}"))
            info["last_seen"] = int(h.get("last_seen", 0))
            info["topics"] = sorted(
                _s(t) for t in await self.redis.smembers(self.keys.broker_topics(name))
            )
            out[name] = info
        return out

    async def broker(self, name: str) -> dict[str, Any] | None:
        return (await self.brokers()).get(name)

    async def subscriptions(self, group: str) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self.keys.subs(group))
        return {_s(k): json.loads(v) for k, v in raw.items()}

    async def group_clients(self, group: str) -> list[str]:
        return sorted(_s(c) for c in await self.redis.smembers(self.keys.group_clients(group)))

    async def subscription_history(self) -> list[dict[str, Any]]:
        """Every (group, topic, expression, model) ever seen, with first and last sighting."""
        raw = await self.redis.hgetall(self.keys.subhistory)
        rows = []
        for k, v in raw.items():
            group, topic, expression, model = json.loads(k)
            seen = json.loads(v)
            rows.append(
                {
                    "group": group,
                    "topic": topic,
                    "expression": expression,
                    "message_model": model,
                    "first_seen": seen["first_seen"],
                    "last_seen": seen["last_seen"],
                }
            )
        return sorted(rows, key=lambda r: (r["group"], r["topic"], r["first_seen"]))


def _s(v: bytes | str) -> str:
    # The routing client decodes responses; accept bytes too for callers with their own client.
    return v.decode() if isinstance(v, bytes) else v
