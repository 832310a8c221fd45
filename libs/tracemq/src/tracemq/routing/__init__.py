"""Routing: the Redis key schema, route model, read-only registry views and the client cache."""

from tracemq.routing.cache import RouteCache
from tracemq.routing.keys import RedisKeys
from tracemq.routing.model import QueueRoute, TopicRoute
from tracemq.routing.registry import RegistryReader, connect, now_ms

__all__ = [
    "QueueRoute",
    "RedisKeys",
    "RegistryReader",
    "RouteCache",
    "TopicRoute",
    "connect",
    "now_ms",
]
