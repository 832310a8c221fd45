"""bench/_common.TaskCpu: CPU per event-loop callback, by task coroutine (the consumer bench's
--task-cpu diagnostic)."""

from __future__ import annotations

import asyncio
import time

from bench._common import TaskCpu


async def _burner(seconds: float) -> None:
    await asyncio.sleep(0)
    end = time.thread_time() + seconds
    while time.thread_time() < end:  # CPU, not a sleep: what the accountant measures
        pass


async def _sleeper() -> None:
    await asyncio.sleep(0.05)


def test_task_cpu_charges_each_task_its_own_cpu() -> None:
    original = asyncio.events.Handle._run

    async def main(acct: TaskCpu) -> tuple[dict[str, float], dict[str, float]]:
        before = acct.snapshot()
        await asyncio.gather(_burner(0.05), _sleeper())
        return before, acct.snapshot()

    with TaskCpu() as acct:
        assert asyncio.events.Handle._run is not original
        before, after = asyncio.run(main(acct))
    assert asyncio.events.Handle._run is original  # put back on exit

    per = TaskCpu.us_per(before, after, 1)
    assert per["_burner"] >= 40_000  # its 50 ms of CPU, in us per (one) message
    assert per.get("_sleeper", 0.0) < 5_000
    assert list(per)[0] == "_burner"  # largest first
