"""tracemq._client.ClientBase: the start / shutdown / ``async with`` every client shares
(Producer, TransactionProducer, PushConsumer, LitePullConsumer).

Start once; shutdown idempotent (also before a start); shutdown cancels and awaits the tasks
the client owns; a failed start releases what it started and raises its own error; ``async
with`` lets the block's exception through; using a client that is not running says why."""

from __future__ import annotations

import asyncio

import pytest
from tracemq._client import ClientBase
from tracemq.consumer import LitePullConsumer, PushConsumer
from tracemq.errors import ClientStateError, InvalidNameError
from tracemq.producer import Producer, TransactionProducer

pytestmark = pytest.mark.timeout(10)


class _Client(ClientBase):
    kind = "fake"

    def __init__(self, fail_start: BaseException | None = None) -> None:
        super().__init__("G_fake")
        self.fail_start = fail_start
        self.calls: list[str] = []
        self.cleaned: list[str] = []

    async def _loop(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            self.cleaned.append("loop")

    async def _start(self) -> None:
        self.calls.append("start")
        self._tasks.spawn(self._loop(), name="loop")
        await asyncio.sleep(0)
        if self.fail_start is not None:
            raise self.fail_start

    async def _stop(self) -> None:
        self.calls.append("stop")
        await super()._stop()

    async def _close(self) -> None:
        self.calls.append("close")
        await super()._close()


async def test_start_once_and_shutdown_idempotent_cancelling_owned_tasks() -> None:
    c = _Client()
    with pytest.raises(ClientStateError, match="not started; call start"):
        c._check_running()
    await c.start()
    c._check_running()
    assert len(c._tasks) == 1
    with pytest.raises(ClientStateError, match="'G_fake' is running; create a new one"):
        await c.start()
    await c.shutdown()
    assert c.cleaned == ["loop"] and len(c._tasks) == 0  # cancelled and awaited
    await c.shutdown()  # idempotent: nothing runs twice
    assert c.calls == ["start", "stop", "close"]
    with pytest.raises(ClientStateError, match="shut down"):
        c._check_running()
    with pytest.raises(ClientStateError, match="is shutdown; create a new one"):
        await c.start()


async def test_shutdown_before_start_closes_nothing_and_forbids_a_start() -> None:
    c = _Client()
    await c.shutdown()
    assert c.calls == []
    with pytest.raises(ClientStateError):
        await c.start()


async def test_a_failed_start_releases_what_it_started_and_raises_its_error() -> None:
    c = _Client(fail_start=ConnectionRefusedError("no broker"))
    with pytest.raises(ConnectionRefusedError, match="no broker"):
        await c.start()
    assert c.calls == ["start", "close"] and c.cleaned == ["loop"]
    assert c._state == "shutdown"
    await c.shutdown()  # already closed: nothing again
    assert c.calls == ["start", "close"]


async def test_a_start_refused_by_its_preconditions_leaves_the_client_startable() -> None:
    class Picky(_Client):
        ready = False

        def _check_startable(self) -> None:
            if not self.ready:
                raise ClientStateError("subscribe first")

    c = Picky()
    with pytest.raises(ClientStateError, match="subscribe first"):
        await c.start()
    assert c.calls == []
    c.ready = True
    await c.start()
    await c.shutdown()
    assert c.calls == ["start", "stop", "close"]


async def test_async_with_starts_stops_and_lets_the_blocks_exception_through() -> None:
    c = _Client()
    async with c as entered:
        assert entered is c and c._state == "running"
    assert c.calls == ["start", "stop", "close"] and c.cleaned == ["loop"]

    c = _Client()
    with pytest.raises(KeyError, match="inside"):
        async with c:
            raise KeyError("inside")
    assert c.calls == ["start", "stop", "close"]


async def test_the_four_clients_share_the_base() -> None:
    for cls in (Producer, TransactionProducer, PushConsumer, LitePullConsumer):
        assert issubclass(cls, ClientBase)
        assert "__aenter__" not in vars(cls) and "start" not in vars(cls), cls
    p = Producer("G_never_started", redis_url="redis://127.0.0.1:1/0")
    await p.shutdown()  # never started: nothing to connect to, nothing raised
    with pytest.raises(ClientStateError, match="producer 'G_never_started' is shutdown"):
        await p.start()
    with pytest.raises(InvalidNameError):
        Producer("bad group name!")
