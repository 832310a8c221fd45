"""tracemq.tasks.TaskGroup: the one "start loops, at stop cancel them all and wait" helper.

Its stop cancels and awaits every task it owns, is idempotent, lets the caller's own
cancellation through, never awaits the task that calls it; a task's failure is logged when it
happens and handed back by the stop; finished tasks leave the group."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
from tracemq.errors import ClientStateError
from tracemq.tasks import TaskGroup, cancel_and_wait

pytestmark = pytest.mark.timeout(10)


async def _forever(cleaned: list[str], name: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.sleep(0)  # a clean-up that itself awaits still runs to its end
        cleaned.append(name)


async def test_aclose_cancels_and_awaits_every_task_once_and_for_all() -> None:
    group = TaskGroup("owner")
    cleaned: list[str] = []
    tasks = [group.spawn(_forever(cleaned, f"t{i}"), name=f"t{i}") for i in range(3)]
    await asyncio.sleep(0)
    assert len(group) == 3 and group.alive()

    assert await group.aclose() == []
    assert all(t.cancelled() for t in tasks)
    assert sorted(cleaned) == ["t0", "t1", "t2"]  # each one's finally ran before aclose returned
    assert len(group) == 0 and group.closed and not group.alive()

    assert await group.aclose() == []  # idempotent
    with pytest.raises(ClientStateError, match="owner"):
        group.spawn(_forever(cleaned, "late"), name="late")  # refused, not leaked
    assert len(group) == 0


async def test_a_failing_task_is_logged_at_once_and_returned_by_aclose() -> None:
    group = TaskGroup("owner")
    died = asyncio.Event()

    async def fails() -> None:
        try:
            raise ValueError("boom")
        finally:
            died.set()

    cleaned: list[str] = []
    with structlog.testing.capture_logs() as logs:
        group.spawn(fails(), name="failing")
        group.spawn(_forever(cleaned, "loop"), name="loop")
        await died.wait()
        await asyncio.sleep(0)  # its done-callback runs
        failed = [e for e in logs if e["event"] == "task failed"]
        assert failed and failed[0]["task"] == "failing" and failed[0]["owner"] == "owner"
        assert "ValueError: boom" in failed[0]["error"]
    assert len(group) == 1  # the failed task left the group; the loop runs on
    assert not group.alive()  # a loop that ended by itself is what a health check reports

    errors = await group.aclose()
    assert [type(e) for e in errors] == [ValueError] and str(errors[0]) == "boom"
    assert cleaned == ["loop"]


async def test_a_task_that_raises_while_cancelled_is_still_awaited_and_reported() -> None:
    group = TaskGroup("owner")
    started = asyncio.Event()

    async def bad_cleanup() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    task = group.spawn(bad_cleanup(), name="bad")
    await started.wait()
    with structlog.testing.capture_logs():
        errors = await group.aclose()
    assert task.done() and [str(e) for e in errors] == ["cleanup failed"]


async def test_the_callers_cancellation_propagates_and_the_tasks_still_end() -> None:
    group = TaskGroup("owner")
    release = asyncio.Event()
    in_cleanup = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            in_cleanup.set()
            await release.wait()

    task = group.spawn(slow_cleanup(), name="slow")
    await asyncio.sleep(0)
    stopper = asyncio.create_task(group.aclose())
    await in_cleanup.wait()
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    release.set()
    await asyncio.gather(task, return_exceptions=True)
    assert task.done()


async def test_a_task_may_close_its_own_group() -> None:
    group = TaskGroup("owner")
    cleaned: list[str] = []
    other = group.spawn(_forever(cleaned, "other"), name="other")

    async def closes_its_group() -> None:
        await group.aclose()  # must not wait for itself
        await asyncio.sleep(0)  # ... and ends at its next await
        raise AssertionError("not reached")

    me = group.spawn(closes_its_group(), name="closer")
    await asyncio.wait_for(asyncio.gather(me, return_exceptions=True), 5)
    assert me.cancelled() and other.cancelled() and cleaned == ["other"]


async def test_finished_tasks_leave_the_group_and_a_spawner_reports_deaths() -> None:
    spawned: list[str] = []

    def spawner(coro: Any, *, name: str) -> asyncio.Task[Any]:
        spawned.append(name)
        return asyncio.create_task(coro, name=name)

    group = TaskGroup("svc", spawner=spawner)

    async def short() -> None:
        await asyncio.sleep(0)

    async def fails() -> None:
        raise KeyError("k")

    with structlog.testing.capture_logs() as logs:
        tasks = [group.spawn(short(), name=f"s{i}") for i in range(50)]
        tasks.append(group.spawn(fails(), name="f"))
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)
    assert len(group) == 0 and len(spawned) == 51
    assert not [e for e in logs if e["event"] == "task failed"]  # the spawner's job
    assert [type(e) for e in await group.aclose()] == [KeyError]


async def test_cancel_and_wait_ends_a_collection_the_owner_keeps() -> None:
    cleaned: list[str] = []
    tasks = {asyncio.create_task(_forever(cleaned, f"x{i}")) for i in range(3)}
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)
    assert all(t.cancelled() for t in tasks) and len(cleaned) == 3
    await cancel_and_wait([])  # nothing to do
