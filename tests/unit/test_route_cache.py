"""RouteCache's errors: which cause it names when a topic has no route (Redis faked as down)."""

from __future__ import annotations

import pytest
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from tracemq.errors import NoRouteError, RoutingUnavailableError
from tracemq.redis_url import redact as _redacted
from tracemq.routing import RouteCache
from tracemq.routing.model import QueueRoute, TopicRoute


class _Reader:
    def __init__(self) -> None:
        self.route: TopicRoute | None = None
        self.error: Exception = RedisConnectionError("Connection refused")

    async def topic_route(self, topic: str) -> TopicRoute:
        if self.route is None:
            raise self.error
        return self.route


def _cache(url: str = "redis://:s3cret@10.1.2.3:6380/0") -> tuple[RouteCache, _Reader]:
    cache = RouteCache(url)
    reader = _Reader()
    cache._reader = reader  # type: ignore[assignment]
    return cache, reader


async def test_no_cached_route_and_redis_down_names_redis_without_the_password() -> None:
    cache, _ = _cache()
    with pytest.raises(RoutingUnavailableError) as err:
        await cache.require("T")
    text = str(err.value)
    assert "Redis at redis://:***@10.1.2.3:6380/0" in text and "Connection refused" in text
    assert "s3cret" not in text
    assert isinstance(err.value, NoRouteError) and err.value.retriable
    await cache.stop()


async def test_a_refused_login_says_so() -> None:
    cache, reader = _cache()
    reader.error = AuthenticationError("invalid username-password pair or user is disabled.")
    with pytest.raises(RoutingUnavailableError) as err:
        await cache.require("T")
    text = str(err.value)
    assert "Redis at redis://:***@10.1.2.3:6380/0 refused the login" in text
    assert "TRACEMQ_REDIS_URL" in text and "s3cret" not in text
    await cache.stop()


async def test_redis_answering_with_no_queues_blames_the_brokers() -> None:
    cache, reader = _cache()
    reader.route = TopicRoute(topic="T")
    with pytest.raises(NoRouteError) as err:
        await cache.require("T")
    assert type(err.value) is NoRouteError and "no live broker hosts it" in str(err.value)
    await cache.stop()


async def test_redis_back_clears_the_cause() -> None:
    cache, reader = _cache()
    assert not (await cache.get("T")).queues
    assert isinstance(cache.missing("T"), RoutingUnavailableError)
    reader.route = TopicRoute(topic="T")
    await cache.get("T", refresh=True)
    assert type(cache.missing("T")) is NoRouteError
    await cache.stop()


async def test_cached_route_is_served_while_redis_is_down() -> None:
    cache, reader = _cache()
    q = QueueRoute(
        broker="b",
        cluster="c",
        read_queues=1,
        write_queues=1,
        perm=6,
        data_bootstrap="k:9",
        address="h:1",
    )
    reader.route = TopicRoute(topic="T", queues=[q])
    assert (await cache.require("T")).queues == [q]
    reader.route = None
    assert (await cache.require("T", refresh=True)).queues == [q]
    await cache.stop()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://user:pw@h:1/2", "rediss://user:***@h:1/2"),
        ("redis://:pw@h/0", "redis://:***@h/0"),
    ],
)
def test_redacted(url: str, shown: str) -> None:
    assert _redacted(url) == shown
