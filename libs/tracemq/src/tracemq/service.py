"""The run-time every tracemq service shares: HTTP ``/healthz`` + ``/metrics``, signals, shutdown.

A service implements :class:`Service`; :func:`run_service` starts the HTTP endpoint first (so a
probe sees ``starting``), then the service, then waits for SIGTERM/SIGINT or a fatal error, and
stops gracefully: the service's ``stop()`` (stop intake, flush, commit) gets
``shutdown_timeout_ms``; after that its tasks are cancelled.

A service starts its long-running loops with :func:`spawn` instead of ``asyncio.create_task``.
Such a task is the service's life: if it ends other than by being cancelled (it raised, or it
returned), the error is logged with its traceback and :func:`serve` stops the service and
returns 1, so the process exits non-zero and its supervisor (the dev launcher, compose
``restart:``) starts a fresh one, instead of the process staying up with a dead loop and a 503
``/healthz``. Cancelling is how a service stops its own tasks, so it is never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tracemq.errors import ServiceTaskEnded
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

T = TypeVar("T")


@dataclass
class _Runtime:
    """What :func:`serve` lends the tasks of the service it runs."""

    name: str
    fatal: asyncio.Future[BaseException]
    stopping: bool = False


_RUNTIME: contextvars.ContextVar[_Runtime | None] = contextvars.ContextVar(
    "tracemq_service_runtime", default=None
)


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start one of a service's long-running tasks (a consume loop, a heartbeat, an expiry).

    Called from ``start()`` under :func:`serve`, a task that raises or returns stops the
    service with exit code 1 (see the module docstring). Outside :func:`serve` (a test that
    drives a service directly) the death is still logged."""
    task = asyncio.create_task(coro, name=name)
    runtime = _RUNTIME.get()
    task.add_done_callback(lambda t: _task_done(t, runtime))
    return task


def _task_done(task: asyncio.Task[Any], runtime: _Runtime | None) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if runtime is not None and runtime.stopping:
        return  # serve is stopping the service anyway
    log = get_logger(runtime.name if runtime else "service")
    if exc is None:
        exc = ServiceTaskEnded(f"task {task.get_name()!r} returned; it should never end")
        log.error("service task ended", task=task.get_name())
    else:
        log.error(
            "service task died",
            task=task.get_name(),
            error=f"{exc.__class__.__name__}: {exc}",
            exc_info=exc,
        )
    if runtime is not None and not runtime.fatal.done():
        runtime.fatal.set_result(exc)


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
    runtime = _Runtime(service.name, fatal)
    runtime_token = _RUNTIME.set(runtime)  # what spawn() inside service.start() finds

    http = HttpEndpoint(service, settings.http_host, settings.http_port, add_routes)
    await http.start()
    log.info("http endpoint up", host=settings.http_host, port=http.bound_port)
    try:
        await service.start()
    except Exception as exc:
        log.error("service failed to start", error=f"{exc.__class__.__name__}: {exc}")
        runtime.stopping = True
        _RUNTIME.reset(runtime_token)
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
    runtime.stopping = True
    _RUNTIME.reset(runtime_token)
    code = 0
    if fatal in done:
        err = None
        if not fatal.cancelled():
            err = fatal.exception() or fatal.result()
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
