"""The run-time every tracemq service shares: HTTP ``/healthz`` + ``/metrics``, signals, shutdown.

A service implements :class:`Service`; :func:`run_service` starts the HTTP endpoint first (so a
probe sees ``starting``), then the service, then waits for SIGTERM/SIGINT or a fatal error, and
stops gracefully: the service's ``stop()`` (stop intake, flush, commit) gets
``shutdown_timeout_ms``; after that its tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tracemq.log import configure_logging, get_logger
from tracemq.settings import CommonSettings


class Service(Protocol):
    """What :func:`run_service` drives."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, Any]:
        """``{"ok": bool, ...details}``; not ok → /healthz answers 503."""
        ...


RouteAdder = Callable[[web.Application], None]


class HttpEndpoint:
    """aiohttp server with /healthz and /metrics; services may add routes (the collector's API)."""

    def __init__(
        self, service: Service, host: str, port: int, add_routes: RouteAdder | None = None
    ) -> None:
        self.service = service
        self.host = host
        self.port = port
        self.state = "starting"
        self.app = web.Application()
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/metrics", self._metrics)
        if add_routes:
            add_routes(self.app)
        own_routes = getattr(service, "add_routes", None)
        if own_routes is not None:  # a service with an API of its own (the collector)
            own_routes(self.app)
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server  # aiohttp exposes no public accessor for the bound port
        if server is not None and server.sockets:  # type: ignore[attr-defined]
            self.bound_port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def _healthz(self, _req: web.Request) -> web.Response:
        if self.state != "running":
            return web.json_response({"ok": False, "state": self.state}, status=503)
        try:
            detail = self.service.health()
        except Exception as exc:  # a broken health() must not 500 the probe
            detail = {"ok": False, "error": repr(exc)}
        detail = {"state": self.state, "service": self.service.name, **detail}
        return web.json_response(detail, status=200 if detail.get("ok") else 503)

    async def _metrics(self, _req: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(
    service: Service,
    settings: CommonSettings,
    *,
    add_routes: RouteAdder | None = None,
    fatal: asyncio.Future[BaseException] | None = None,
    ready: Callable[[HttpEndpoint], Awaitable[None]] | None = None,
) -> int:
    """Run ``service`` until a signal or a fatal error; return the process exit code."""
    log = get_logger(service.name)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    fatal = fatal or loop.create_future()

    http = HttpEndpoint(service, settings.http_host, settings.http_port, add_routes)
    await http.start()
    log.info("http endpoint up", host=settings.http_host, port=http.bound_port)
    try:
        await service.start()
    except Exception as exc:
        log.error("service failed to start", error=f"{exc.__class__.__name__}: {exc}")
        http.state = "failed"
        with contextlib.suppress(Exception):
            await asyncio.wait_for(service.stop(), settings.shutdown_timeout_ms / 1000)
        await http.stop()
        return 1
    http.state = "running"
    log.info("service running")
    if ready:
        await ready(http)

    stop_wait: asyncio.Future[Any] = asyncio.create_task(stop_requested.wait())
    waiters: set[asyncio.Future[Any]] = {stop_wait, fatal}
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if fatal in done:
        err = fatal.exception() if not fatal.cancelled() else None
        log.error("fatal error; stopping", error=repr(err))
        code = 1
    stop_wait.cancel()
    http.state = "stopping"
    log.info("stopping")
    try:
        await asyncio.wait_for(service.stop(), settings.shutdown_timeout_ms / 1000)
    except TimeoutError:
        log.warning("graceful stop timed out; cancelling", timeout_ms=settings.shutdown_timeout_ms)
        code = code or 1
    except Exception as exc:
        log.error("error during stop", error=repr(exc))
        code = code or 1
    await http.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    log.info("stopped", exit_code=code)
    return code


def run_service(factory: Callable[[], tuple[Service, CommonSettings]], **kw: Any) -> int:
    """Synchronous entry point for console commands: configure logging and run :func:`serve`."""
    service, settings = factory()
    configure_logging(settings.log_level)
    return asyncio.run(serve(service, settings, **kw))
