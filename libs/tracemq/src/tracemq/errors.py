"""Exceptions raised by the tracemq library.

One root, :class:`TracemqError`; behaviour lives on class attributes (``retriable``).

Tree::

    TracemqError
    ├── ConfigError              a setting has a bad value (names the variable)
    ├── InvalidNameError         a topic, group or broker name breaks the naming rules (also ValueError)
    ├── NoRouteError             a topic has no route in the routing database
    │   └── RoutingUnavailableError  ... because the routing database (Redis) did not answer
    ├── UnknownBrokerError       an admin request names a broker that is not registered
    ├── AdminError               a broker refused or failed an admin request
    ├── AdminTimeoutError        no reply to an admin request in time (retriable)
    ├── NotSupportedByTransportError
    │                            the Kafka-compatible transport lacks a feature (e.g. CreatePartitions)
    ├── StackError               the embedded stack could not start or stop cleanly
    ├── RedisUnavailableError    the routing database refused the login or did not answer at start
    └── ClientStateError         a client used before start() or after shutdown()
"""

from __future__ import annotations


class TracemqError(Exception):
    """Root of every exception this package raises on purpose."""

    retriable: bool = False


class RedisUnavailableError(TracemqError):
    """Redis refused the login (wrong password or ACL user) or did not answer at start; the
    message names the Redis with its password hidden."""


class ConfigError(TracemqError):
    """A setting read from the environment is missing or invalid."""


class InvalidNameError(TracemqError, ValueError):
    """A RocketMQ-style name (topic, group, broker) is not valid."""


class NoRouteError(TracemqError):
    """The topic has no route: no live broker hosts it."""

    retriable = True


class RoutingUnavailableError(NoRouteError):
    """No route is known for the topic because the routing database (Redis) did not answer."""


class UnknownBrokerError(TracemqError):
    """An admin request names a broker the nameserver does not know."""


class AdminError(TracemqError):
    """A broker answered an admin request with an error."""


class AdminTimeoutError(AdminError):
    """No reply to an admin request before the deadline."""

    retriable = True


class NotSupportedByTransportError(TracemqError):
    """The Kafka-compatible transport does not support what was asked."""


class StackError(TracemqError):
    """The embedded stack failed to start, answer or stop."""


class ClientStateError(TracemqError):
    """A client was used before ``start()`` or after ``shutdown()``."""
