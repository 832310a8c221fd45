"""The service runtime: a long-running task that dies takes the process down with exit code 1
(so a supervisor restarts it), logged with the task's name and error; a task cancelled by the
service's own stop() is not an error."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

import pytest
import structlog
from tracemq.service import HttpEndpoint, serve, spawn
from tracemq.settings import CommonSettings


class _Service:
    """A service with one loop of the test's choosing, started with spawn()."""

    name = "svc-under-test"

    def __init__(self, loop_body: Coroutine[Any, Any, None]) -> None:
        self._body = loop_body
        self.task: asyncio.Task[None] | None = None
        self.stopped = False

    async def start(self) -> None:
        self.task = spawn(self._body, name="svc-loop")

    async def stop(self) -> None:
        self.stopped = True
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    def health(self) -> dict[str, Any]:
        return {"ok": self.task is not None and not self.task.done()}


def _settings() -> CommonSettings:
    return CommonSettings(http_host="127.0.0.1", http_port=0, shutdown_timeout_ms=2000)


async def _run(service: _Service, **kw: Any) -> int:
    return await asyncio.wait_for(serve(service, _settings(), **kw), 10)


async def test_a_task_that_raises_makes_serve_return_1_and_is_logged() -> None:
    async def dies() -> None:
        await asyncio.sleep(0.01)
        raise TypeError("unhashable type: 'list'")

    service = _Service(dies())
    with structlog.testing.capture_logs() as logs:
        code = await _run(service)
    assert code == 1
    assert service.stopped  # the graceful stop still ran
    died = [e for e in logs if e["event"] == "service task died"]
    assert died and died[0]["task"] == "svc-loop"
    assert "TypeError: unhashable type: 'list'" in died[0]["error"]
    assert died[0]["log_level"] == "error"


async def test_a_task_that_returns_is_fatal_too() -> None:
    async def ends() -> None:
        await asyncio.sleep(0.01)

    service = _Service(ends())
    with structlog.testing.capture_logs() as logs:
        code = await _run(service)
    assert code == 1
    assert any(e["event"] == "service task ended" and e["task"] == "svc-loop" for e in logs)


async def test_tasks_cancelled_by_stop_are_not_an_error() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def stop_soon(_http: HttpEndpoint) -> None:
        # as a supervisor would: SIGTERM, once the service runs
        asyncio.get_running_loop().call_later(0.05, signal.raise_signal, signal.SIGTERM)

    service = _Service(forever())
    with structlog.testing.capture_logs() as logs:
        code = await _run(service, ready=stop_soon)
    assert code == 0
    assert service.task is not None and service.task.cancelled()
    assert not [e for e in logs if e["log_level"] == "error"]


async def test_spawn_outside_serve_still_logs_the_death() -> None:
    async def dies() -> None:
        raise RuntimeError("boom")

    with structlog.testing.capture_logs() as logs:
        task = spawn(dies(), name="loose")
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert any(e["event"] == "service task died" and e["task"] == "loose" for e in logs)
