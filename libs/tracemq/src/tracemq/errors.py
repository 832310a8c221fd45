"""Exceptions raised by the tracemq library, and how the other packages' trees hang off it.

One root, :class:`TracemqError`; behaviour lives on class attributes (``retriable``: the same
call may succeed later). Every exception tracemq raises on purpose is defined here, so
``except TracemqError`` catches all of them. A class that used to be a builtin error keeps that
base too (``ProtocolError`` is also a ``ValueError``), so an ``except ValueError`` written
before still catches it; the old import paths (``tracemq.producer.SendError``,
``tracemq.trace.DecodeError``, ``tracemq.protocol.ProtocolError``, …) name the same classes.

Tree::

    TracemqError
    ├── ConfigError              a setting has a bad value (names the variable)
    ├── InvalidNameError         a topic, group or broker name breaks the naming rules (also ValueError)
    ├── InvalidMessageError      a message field has a wrong type or value (also ValueError)
    ├── ClientStateError         a client used before start() or after shutdown()
    ├── NoRouteError             a topic has no route in the routing database (retriable)
    │   └── RoutingUnavailableError  ... because the routing database (Redis) did not answer
    ├── RedisUnavailableError    the routing database refused the login or did not answer at start
    ├── KafkaConnectError        a Kafka client could not connect at start (retriable)
    ├── SendError                every attempt of a send failed (retriable)
    │   └── BatchSendError       some members of a batch failed; the others are stored
    ├── RecallError              the broker did not recall a delayed message
    │   └── RecallTimeoutError   ... no answer in time (retriable)
    ├── TraceTopicError          a customized trace topic has no broker
    ├── DecodeError              a trace record is malformed (also ValueError)
    ├── ProtocolError            a record of a tracemq topic is not understood (also ValueError)
    │   ├── SignatureError       ... it lacks a valid signature
    │   └── RecallHandleError    ... a recall handle that cannot be decoded
    ├── UnknownBrokerError       an admin request names a broker that is not registered
    ├── AdminError               a broker refused or failed an admin request
    │   └── AdminTimeoutError    no reply to an admin request in time (retriable)
    ├── NotSupportedByTransportError
    │                            the Kafka-compatible transport lacks a feature (e.g. CreatePartitions)
    ├── CollectorError           the collector API answered with an error (tracemq.collector_client)
    │   └── CollectorUnreachableError  ... or did not answer (retriable)
    ├── StackError               the embedded stack could not start or stop cleanly
    ├── ServiceTaskEnded         a service's long-running task returned (also RuntimeError)
    └── CliError                 a command cannot do what was asked (tracemq.cli._errors: its
                                 ``exit_code``; UsageError, Unreachable)

The other packages each have one root of their own, a subclass of :class:`TracemqError`, so
``except TracemqError`` also catches theirs and ``except <their root>`` only theirs:

- ``tracemq_broker.errors.BrokerError`` (``AdminRejected``, …),
- ``tracemq_collector.errors.CollectorError`` (``TraceStoreError``, ``BadCursor``, …),
- ``tracemq_nameserver.errors.NameserverError``,
- ``tracemq_spark.params.ReconcileError`` (the reconciliation job: bad input, a run that cannot
  proceed).

``tests/unit/test_error_tree.py`` walks every module of these packages and checks that each
public exception derives from its package's root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracemq.message import SendResult


class TracemqError(Exception):
    """Root of every exception this package raises on purpose."""

    retriable: bool = False


# -- configuration and input ---------------------------------------------------------------
class ConfigError(TracemqError):
    """A setting read from the environment is missing or invalid."""


class InvalidNameError(TracemqError, ValueError):
    """A RocketMQ-style name (topic, group, broker) is not valid."""


class InvalidMessageError(TracemqError, ValueError):
    """A message field has a wrong type or value (the message names the field)."""


class ClientStateError(TracemqError):
    """A client was used before ``start()`` or after ``shutdown()``."""


# -- routing and connections ----------------------------------------------------------------
class NoRouteError(TracemqError):
    """The topic has no route: no live broker hosts it."""

    retriable = True


class RoutingUnavailableError(NoRouteError):
    """No route is known for the topic because the routing database (Redis) did not answer."""


class RedisUnavailableError(TracemqError):
    """Redis refused the login (wrong password or ACL user) or did not answer at start; the
    message names the Redis with its password hidden."""


class KafkaConnectError(TracemqError):
    """A Kafka client could not connect to its cluster at start (refused, TLS or SASL failed)."""

    retriable = True


# -- sending and recalling ------------------------------------------------------------------
class SendError(TracemqError):
    """Every attempt of a send failed; ``__cause__`` is the last failure."""

    retriable = True


class BatchSendError(SendError):
    """Some members of a :meth:`Producer.send_batch` failed every attempt; the others are stored.

    ``results[i]`` is the :class:`SendResult` of member ``i`` (stored and traced) or None, and
    ``errors[i]`` the last failure of a member that was not stored (else None), in the order of
    the batch. A caller that resends only the failed members duplicates nothing.
    """

    def __init__(
        self,
        message: str,
        results: list[SendResult | None],
        errors: list[BaseException | None],
    ) -> None:
        super().__init__(message)
        self.results = results
        self.errors = errors

    @property
    def failed(self) -> list[int]:
        """Indices of the members that were not stored."""
        return [i for i, r in enumerate(self.results) if r is None]


class RecallError(TracemqError):
    """The broker did not recall the message and says why (``str(exc)``): no such delayed
    message at the handle's coordinates, or a handle of another broker, topic or level."""


class RecallTimeoutError(RecallError):
    """No answer from the broker in time. The recall request is stored on the broker's schedule
    queue and is applied if the broker reads it before the message is due: recall again with the
    same handle to learn the outcome (a repeated recall is one recall)."""

    retriable = True


# -- message trace --------------------------------------------------------------------------
class TraceTopicError(TracemqError):
    """A customized trace topic cannot be written: no broker hosts it."""


class DecodeError(TracemqError, ValueError):
    """A trace record is malformed.

    The per-record parsers raise it; :func:`tracemq.trace.decode_report` turns it into a
    :class:`MalformedRecord`, so decoding a whole message never raises.
    """


# -- wire protocols (tracemq.protocol) ------------------------------------------------------
class ProtocolError(TracemqError, ValueError):
    """A record on a tracemq topic could not be understood (garbage, wrong schema, bad field).

    Every ``decode*`` of :mod:`tracemq.protocol` raises only this (or a subclass) for any
    input; ``kind`` is the ``reason`` label of the consuming service's ``..._rejected_total``."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        #: short label for metrics: ``garbage``, ``version``, ``type``, ``schema``
        self.kind = kind


class SignatureError(ProtocolError):
    """A record is refused for want of a valid signature: ``kind`` is ``unsigned``, ``forged``,
    ``expired``, ``wrong_role`` or ``replayed``; ``key_id`` is the access key id it claimed."""

    def __init__(self, reason: str, kind: str, key_id: str | None = None) -> None:
        super().__init__(reason, kind)
        self.key_id = key_id


class RecallHandleError(ProtocolError):
    """A recall handle cannot be decoded, or is not a tracemq delayed message's handle; the
    message names the problem."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid recall handle: {reason}", "handle")


# -- administration -------------------------------------------------------------------------
class UnknownBrokerError(TracemqError):
    """An admin request names a broker the nameserver does not know."""


class AdminError(TracemqError):
    """A broker answered an admin request with an error."""


class AdminTimeoutError(AdminError):
    """No reply to an admin request before the deadline."""

    retriable = True


class NotSupportedByTransportError(TracemqError):
    """The Kafka-compatible transport does not support what was asked."""


# -- the collector API (tracemq.collector_client) -------------------------------------------
class CollectorError(TracemqError):
    """The collector API answered with an error (a missing trace, a refused token or query), or
    not with JSON; the message names the collector and what it answered, ``status`` the HTTP
    status (None when there was none)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CollectorUnreachableError(CollectorError):
    """The collector API did not answer (refused, timed out), or no collector is known."""

    retriable = True


# -- processes ------------------------------------------------------------------------------
class StackError(TracemqError):
    """The embedded stack failed to start, answer or stop."""


class ServiceTaskEnded(TracemqError, RuntimeError):
    """A task handed to :func:`tracemq.service.spawn` returned, though it should run until
    cancelled."""
