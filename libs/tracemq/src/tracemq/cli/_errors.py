"""How a CLI command fails: one line on stderr naming what to check, never a traceback
(``--debug`` or ``TRACEMQ_DEBUG=1`` shows it).

Exit codes: 2 bad usage (a bad option, name or URL: the user fixes the command line), 1 a
dependency that did not answer or refused (Redis, Kafka, the collector, Spark: the user checks
the stack). Commands wrap each dependency call in :func:`reaching`, which turns the transport's
own exceptions (redis, aiokafka, urllib, OS) into :class:`Unreachable` naming what and where.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tracemq.errors import TracemqError


class CliError(TracemqError):
    """A command cannot do what was asked; ``exit_code`` says whose fault."""

    exit_code = 1


class UsageError(CliError):
    """The command line is wrong: a bad option value, name or URL."""

    exit_code = 2


class Unreachable(CliError):
    """A dependency (Redis, Kafka, the collector) did not answer."""

    exit_code = 1


#: top-level modules whose exceptions mean the peer is down, refused or timed out
_TRANSPORT_MODULES = frozenset({"redis", "aiokafka", "kafka", "urllib", "http", "socket", "ssl"})


def is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, TracemqError):
        return False
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    return any(c.__module__.split(".")[0] in _TRANSPORT_MODULES for c in type(exc).__mro__)


def short(exc: BaseException) -> str:
    """The exception's first line, without the library's class path."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    text = text.removeprefix(f"{name}: ")
    return f"{name}: {text}" if text else name


@contextmanager
def reaching(what: str, where: str, hint: str) -> Iterator[None]:
    """Turn a transport failure while talking to ``what`` at ``where`` into one line; a URL's
    password never shows, and a refused login (Redis's wrong password or ACL user) says so."""
    from tracemq.kafka_security import KafkaConnectError

    try:
        yield
    except KafkaConnectError as exc:  # already names the cluster and the cause; add the hint
        raise Unreachable(f"{exc}; {hint}") from exc
    except TracemqError:
        raise
    except Exception as exc:
        if not is_transport_error(exc):
            raise
        from tracemq.redis_url import redact
        from tracemq.routing.registry import is_auth_failure

        shown = redact(where)
        if is_auth_failure(exc):
            raise Unreachable(
                f"{what} at {shown} refused the login ({short(exc)}); check the user and "
                f"password in the URL; {hint}"
            ) from exc
        raise Unreachable(f"{what} at {shown} did not answer ({short(exc)}); {hint}") from exc
