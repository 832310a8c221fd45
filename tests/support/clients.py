"""The tests' clients: shut down whatever a test started and left running, and describe a
push consumer's Kafka state when a test waited for it in vain."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
from tracemq._client import ClientBase
from tracemq.consumer.push import PushConsumer

#: how long the clean-up waits for one left-over client's shutdown
SHUTDOWN_TIMEOUT_S = 15.0


@contextlib.asynccontextmanager
async def closing_left_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[list[ClientBase]]:
    """Every client started in this event loop inside the block is shut down at its end when
    it is still running; yields the clients started, in order."""
    started: list[tuple[ClientBase, asyncio.AbstractEventLoop]] = []
    seen: list[ClientBase] = []
    original = ClientBase.start

    async def start(self: ClientBase) -> None:
        started.append((self, asyncio.get_running_loop()))
        seen.append(self)
        await original(self)

    monkeypatch.setattr(ClientBase, "start", start)
    try:
        yield seen
    finally:
        monkeypatch.setattr(ClientBase, "start", original)
        loop = asyncio.get_running_loop()
        for client, its_loop in reversed(started):
            # (a client of another loop, e.g. a thread's asyncio.run, is that code's to close)
            if its_loop is not loop or client._state not in ("starting", "running"):
                continue
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.shutdown(), SHUTDOWN_TIMEOUT_S)


@pytest.fixture
async def close_left_clients(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """Every client a test starts in its event loop is shut down after it, when the test did not.

    A test that fails between its clients' start and their shutdown otherwise leaves their
    Kafka clients open: garbage-collected later, during another test on the same xdist worker,
    their ``ResourceWarning``s fail that test too (pytest's unraisable-exception check)."""
    async with closing_left_clients(monkeypatch):
        yield


async def describe_consumers(consumers: Iterable[PushConsumer]) -> str:
    """Each consumer's assignment per data cluster: position, committed offset and log end of
    every queue it owns — what a test prints when a queue was not consumed in time."""
    lines: list[str] = []
    for c in consumers:
        lines.append(f"consumer {c.group} ({c.client_id}):")
        for bootstrap, cluster in c._fleet.clusters.items():
            kc: Any = cluster.consumer
            try:
                assigned = sorted(kc.assignment())
            except Exception as exc:  # noqa: BLE001 - a diagnostic: say what failed
                lines.append(f"  {bootstrap}: no assignment ({exc!r})")
                continue
            lines.append(
                f"  {bootstrap}: joined={cluster.joined.is_set()} subscribed="
                f"{sorted(cluster.topics)} assigned={[(tp.topic, tp.partition) for tp in assigned]}"
            )
            ends: dict[Any, int] = {}
            with contextlib.suppress(Exception):
                ends = await asyncio.wait_for(kc.end_offsets(assigned), 5)
            for tp in assigned:
                position: Any = None
                committed: Any = None
                with contextlib.suppress(Exception):
                    position = await asyncio.wait_for(kc.position(tp), 2)
                with contextlib.suppress(Exception):
                    committed = await asyncio.wait_for(kc.committed(tp), 2)
                pq = cluster.state.pqs.get(tp) if cluster.state is not None else None
                lines.append(
                    f"    {tp.topic}[{tp.partition}]: position={position} committed={committed}"
                    f" end={ends.get(tp)} paused={tp in cluster.state.paused}"
                    f" process_queue={'none' if pq is None else 'yes'}"
                )
            with contextlib.suppress(Exception):
                lines.append(f"    guard: {cluster.guard.stats()}")
    return "\n".join(lines)
