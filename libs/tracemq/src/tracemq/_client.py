"""What every client (producer or consumer) owns: routes, Kafka producers, heartbeats to the
nameserver, and — when message trace is on — its own trace dispatcher (:class:`ClientRuntime`);
and the lifecycle every client shares (:class:`ClientBase`).

Lifecycle (``Producer``, ``TransactionProducer``, ``PushConsumer``, ``LitePullConsumer``):
``start()`` once — a second start, or a start after ``shutdown()``, raises
:class:`~tracemq.errors.ClientStateError` (create a new client); a start that fails releases what
it had started and raises its error. ``shutdown()`` is idempotent (a client never started just
becomes shut down) and cancels and awaits every task the client owns. ``async with client:``
starts it and shuts it down on the way out, letting the block's exception through.

Each client owns its own runtime (no process-wide singleton), so several producers and consumers
in one process are all traced independently (a RocketMQ bug once traced only one of them).

Identity (RocketMQ's ``instanceName`` and ``clientId``): a client's *instance name* is
``ClientSettings.instance_name`` (``TRACEMQ_INSTANCE_NAME``) when set; its default, ``DEFAULT``,
stands for the process id — as RocketMQ — plus ``#2``, ``#3``, … for the second, third client
alive in the same process, so two clients of one process are never one identity. The *client
id* is ``<client host>@<instance name>`` (an explicit name also gets ``@<pid>``, and ``#n`` when
the process already runs a client of that id): unique on its host, registered with the
nameserver, and carried by every trace message the client sends (header ``CLIENT_ID``) so the
trace view names the client of each attempt. A BROADCASTING consumer's identity is its instance
name (see :mod:`tracemq.consumer.push`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Self

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tracemq._kafka import ProducerPool
from tracemq.auth import SignerSettings
from tracemq.clock import now_ms
from tracemq.errors import ClientStateError, ConfigError
from tracemq.log import get_logger
from tracemq.message_id import local_ipv4, msgid_zone
from tracemq.naming import TRACE_TOPIC, validate_group, validate_topic
from tracemq.protocol import control
from tracemq.protocol.signing import maybe_seal
from tracemq.routing import RouteCache
from tracemq.settings import ENV_PREFIX, ConnectionSettings, load_settings
from tracemq.tasks import TaskGroup

log = get_logger("client")


class ClientSettings(SignerSettings, ConnectionSettings):
    """Where a client finds the stack (:class:`~tracemq.settings.ConnectionSettings`:
    ``TRACEMQ_*`` variables, or keyword arguments), and the client key its heartbeats are signed
    with (``TRACEMQ_ACCESS_KEY_ID`` / ``TRACEMQ_SECRET_KEY``; without one the nameserver refuses
    them, counted as ``unsigned``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    client_heartbeat_interval_ms: int = Field(default=30_000, ge=100)
    route_refresh_interval_ms: int = Field(default=30_000, ge=100)
    #: RocketMQ's instanceName: ``DEFAULT`` means the process id (+ ``#n``), see the module
    #: docstring; a stable name lets a BROADCASTING consumer resume after a restart
    instance_name: str = Field(default="DEFAULT", min_length=1, max_length=128)
    #: a consumer's Kafka group session timeout (``TRACEMQ_CONSUMER_SESSION_TIMEOUT_MS``; the
    #: ``session_timeout_ms`` argument wins): how long a silent member keeps its queues before
    #: they move to the others. Tansu also holds a new member's first join for half of it, so a
    #: shorter one starts a consumer faster and a longer one rides out longer stalls.
    consumer_session_timeout_ms: int = Field(default=10_000, ge=1000, le=300_000)

    @classmethod
    def from_overrides(
        cls, redis_url: str | None = None, control_bootstrap: str | None = None
    ) -> ClientSettings:
        """The environment's settings with the given connection values on top; a bad variable
        raises :class:`ConfigError` naming it."""
        base = load_settings(cls)
        update = {
            k: v
            for k, v in (("redis_url", redis_url), ("control_bootstrap", control_bootstrap))
            if v
        }
        return base.model_copy(update=update) if update else base


#: ``ClientSettings.instance_name`` that asks for the process-derived default (RocketMQ's value)
DEFAULT_INSTANCE_NAME = "DEFAULT"
# Instance names and client ids held by the live clients of this process (released at stop,
# or when a client that never stopped is collected).
_LIVE_INSTANCES: set[str] = set()
_LIVE_CLIENT_IDS: set[str] = set()


def _first_free(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    n = 2
    while f"{base}#{n}" in taken:
        n += 1
    return f"{base}#{n}"


def _release(instance: str | None, client_id: str) -> None:
    if instance is not None:
        _LIVE_INSTANCES.discard(instance)
    _LIVE_CLIENT_IDS.discard(client_id)


class ClientRuntime:
    """Shared machinery of one client."""

    def __init__(
        self,
        group: str,
        role: Literal["producer", "consumer"],
        settings: ClientSettings,
        *,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        message_model: str = "CLUSTERING",
        subscriptions: Callable[[], list[control.Subscription]] | None = None,
        trace_options: dict[str, Any] | None = None,
    ) -> None:
        self.group = group
        self.role = role
        self.settings = settings
        try:  # fail at construction, not at the first send, on a bad TRACEMQ_MSGID_TIMEZONE
            msgid_zone()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.client_host = local_ipv4()
        pid = str(os.getpid())
        #: the instance name was derived from the process (not set): see the module docstring
        self.default_identity = settings.instance_name == DEFAULT_INSTANCE_NAME
        if self.default_identity:
            self.instance_name = _first_free(pid, _LIVE_INSTANCES)
            _LIVE_INSTANCES.add(self.instance_name)
            base_id = f"{self.client_host}@{self.instance_name}"
        else:
            self.instance_name = settings.instance_name
            base_id = f"{self.client_host}@{self.instance_name}@{pid}"
        self.client_id = _first_free(base_id, _LIVE_CLIENT_IDS)
        _LIVE_CLIENT_IDS.add(self.client_id)
        self._release = weakref.finalize(
            self, _release, self.instance_name if self.default_identity else None, self.client_id
        )
        self.message_model = message_model
        self.routes = RouteCache(
            settings.redis_url,
            prefix=settings.redis_prefix,
            refresh_interval_s=settings.route_refresh_interval_ms / 1000,
        )
        self.pool = ProducerPool()
        self.signer = settings.signer()
        if self.signer is None:
            log.warning(
                "no TRACEMQ_ACCESS_KEY_ID: this client's heartbeats are unsigned and a "
                "nameserver that verifies signatures refuses them",
                group=group,
            )
        self._subscriptions = subscriptions or list
        self._tasks = TaskGroup(f"client {group}")
        self.enable_msg_trace = enable_msg_trace
        self.trace_topic = validate_topic(trace_topic) if trace_topic else TRACE_TOPIC
        self._trace_customized = trace_topic is not None and trace_topic != TRACE_TOPIC
        self._trace_options = trace_options or {}
        self.dispatcher: Any = None
        self._store_hosts: dict[str, str] = {}

    async def start(self) -> None:
        await self.routes.start()
        if self.enable_msg_trace:
            from tracemq.trace._dispatcher import AsyncTraceDispatcher

            self.dispatcher = AsyncTraceDispatcher(
                group=self.group,
                route_cache=self.routes,
                trace_topic=self.trace_topic,
                customized=self._trace_customized,
                client_id=self.client_id,
                **self._trace_options,
            )
            await self.dispatcher.start()
        await self.heartbeat()
        self._tasks.spawn(self._heartbeat_loop(), name=f"heartbeat-{self.group}")

    async def stop(self, trace_timeout_s: float = 5.0) -> None:
        await self._tasks.aclose()
        if self.dispatcher is not None:
            await self.dispatcher.shutdown(trace_timeout_s)
        with contextlib.suppress(Exception):
            await self._send_control(
                control.ClientUnregister(ts=now_ms(), client_id=self.client_id, group=self.group)
            )
        await self.pool.close()
        await self.routes.stop()
        self._release()  # the identity is free for a new client of this process

    def cached_store_host(self, address: str) -> str | None:
        """:meth:`store_host` if it was resolved already (no await on the send path)."""
        return self._store_hosts.get(address)

    async def store_host(self, address: str) -> str:
        """A broker address as IPv4:port (offsetMsgId needs an IPv4), resolved once."""
        cached = self._store_hosts.get(address)
        if cached:
            return cached
        host, _, port = address.rpartition(":")
        try:
            socket.inet_aton(host)
            ip = host
        except OSError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, None, family=socket.AF_INET
                )
                ip = str(infos[0][4][0]) if infos else "127.0.0.1"
            except OSError:
                ip = "127.0.0.1"
        self._store_hosts[address] = f"{ip}:{port or 0}"
        return self._store_hosts[address]

    async def heartbeat(self) -> None:
        await self._send_control(
            control.ClientHeartbeat(
                ts=now_ms(),
                client_id=self.client_id,
                group=self.group,
                role=self.role,
                message_model=self.message_model,  # type: ignore[arg-type]
                client_host=self.client_host,
                subscriptions=self._subscriptions(),
            )
        )

    async def _send_control(self, record: Any) -> None:
        producer = await self.pool.get(self.settings.control_bootstrap)
        await producer.send_and_wait(
            self.settings.control_topic,
            maybe_seal(self.signer, "control", control.encode(record)),
            key=self.client_id.encode(),
        )

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.client_heartbeat_interval_ms / 1000)
            try:
                await self.heartbeat()
            except Exception as exc:  # keep trying; the nameserver expires us if this persists
                log.warning("client heartbeat failed", group=self.group, error=repr(exc))


ClientState = Literal["created", "starting", "running", "shutdown"]


class ClientBase:
    """start / shutdown / ``async with`` of every client; see the module docstring.

    A client implements :meth:`_start` (what starting does), :meth:`_close` (release everything;
    also run after a start that failed: it must cope with a half start) and, when shutting down
    gracefully does more than closing (drain, flush, commit), :meth:`_stop`. Its background
    tasks go in ``self._tasks``, which :meth:`_close` cancels and awaits.
    """

    #: how errors name the client: ``producer`` or ``consumer``
    kind: ClassVar[str] = "client"

    def __init__(self, group: str) -> None:
        self.group = validate_group(group)
        self._state: ClientState = "created"
        self._tasks = TaskGroup(f"{self.kind} {self.group}")

    async def start(self) -> None:
        if self._state != "created":
            raise ClientStateError(f"{self.kind} {self.group!r} is {self._state}; create a new one")
        self._check_startable()
        self._state = "starting"
        try:
            await self._start()
        except BaseException:
            self._state = "shutdown"
            await self._close()
            raise
        self._state = "running"

    async def shutdown(self) -> None:
        """Stop gracefully and release everything; idempotent."""
        if self._begin_shutdown():
            await self._stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _begin_shutdown(self) -> bool:
        """Mark the client shut down; True when it had started (there is something to stop)."""
        started = self._state in ("starting", "running")
        self._state = "shutdown"
        return started

    def _check_running(self) -> None:
        """Raise :class:`ClientStateError` unless the client is running."""
        if self._state == "running":
            return
        why = {
            "created": "it is not started; call start() first",
            "starting": "it is still starting",
            "shutdown": "it has been shut down",
        }[self._state]
        raise ClientStateError(f"{self.kind} {self.group!r} is not running: {why}")

    def _check_startable(self) -> None:
        """What must hold before a start begins (raise ClientStateError); the client stays
        ``created`` when this raises, so it can be fixed and started."""

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        """The graceful part of a shutdown, then :meth:`_close`."""
        await self._close()

    async def _close(self) -> None:
        await self._tasks.aclose()
