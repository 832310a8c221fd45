"""A business broker is SIGKILLed for longer than the nameserver's expiry: its routes expire,
the consumers' subscriptions change twice (without its topics, then with them again), and the
restarted broker restores its topics. Nothing is delivered twice — the queues are committed
while their assignment is still held — and the delayed and transactional messages that were in
flight on the dead broker are delivered exactly once after it is back."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from tracemq.admin import AdminClient
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

from tests.support.brokers import fast_broker_name, start_fast_broker, wait_routed_sync


class _Deliveries:
    def __init__(self) -> None:
        self.by_queue_offset: Counter[tuple[str, str, int, int]] = Counter()
        self.by_msg_id: Counter[str] = Counter()
        self.bodies: Counter[bytes] = Counter()

    async def __call__(self, msgs: list[MessageExt], _ctx: Any) -> ConsumeConcurrentlyStatus:
        for m in msgs:
            q = m.queue
            self.by_queue_offset[(q.broker, q.topic, q.queue_id, m.queue_offset)] += 1
            self.by_msg_id[m.msg_id] += 1
            self.bodies[m.body] += 1
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def has(self, bodies: set[bytes]) -> bool:
        return bodies <= set(self.bodies)


class _CommitOnCheck:
    """The local transaction's outcome is unknown when the half is sent; a check-back commits."""

    def __init__(self) -> None:
        self.checks = 0

    async def execute_local_transaction(self, msg: Message, arg: Any) -> Any:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: MessageExt) -> Any:
        self.checks += 1
        return LocalTransactionState.COMMIT_MESSAGE


async def _true(v: bool) -> bool:
    return v


@pytest.mark.timeout(150)
async def test_broker_expiry_delivers_nothing_twice(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    s = fault_stack
    env = {"redis_url": s.redis_url, "control_bootstrap": s.business_bootstrap}
    x = fast_broker_name("bex")
    start_fast_broker(s, x)
    both, only_x = f"Both_{unique}", f"OnX_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        for b in ("broker-a", x):
            await admin.create_topic(b, both, read_queues=1, write_queues=1)
        await admin.create_topic(x, only_x, read_queues=1, write_queues=1)

    sink = _Deliveries()
    # No periodic commit during the test, and a new group reads from the start: whatever is
    # not committed when a queue changes hands is delivered again — a duplicate.
    c = PushConsumer(
        f"CG_{unique}", consume_from=ConsumeFromWhere.FIRST_OFFSET, commit_interval_ms=600_000,
        **env,
    )  # fmt: skip
    c.subscribe(both)
    c.subscribe(only_x)
    c.register_message_listener(sink)
    tx_listener = _CommitOnCheck()
    p = Producer(f"PG_{unique}", **env)
    tp = TransactionProducer(f"PGtx_{unique}", tx_listener, **env)
    redis = connect(s.redis_url)
    registry = RegistryReader(redis)
    await p.start()
    await tp.start()
    await c.start()
    try:
        assert await c.wait_assigned(30)
        normal = {f"n{i}".encode() for i in range(20)}
        for body in sorted(normal):
            await p.send(Message(both, body))
        await eventually(lambda: _true(sink.has(normal)), timeout=20, what="normal messages")

        # in flight on x when it dies: delayed (2 s, due while it is down) and a half message
        delayed = {f"d{i}".encode() for i in range(3)}
        for body in sorted(delayed):
            r = await p.send(Message(only_x, body, delay_level=10))
            assert r.queue.broker == x
        half = await tp.send_message_in_transaction(Message(only_x, b"tx"), arg=None)
        assert half.local_transaction_state == LocalTransactionState.UNKNOW
        s.processes[x].kill()

        async def expired() -> bool:
            return x not in (await registry.topic_route(both)).brokers

        await eventually(expired, timeout=30, interval=0.25, what=f"{x}'s routes expired")
        s.restart(x)
        await asyncio.to_thread(wait_routed_sync, s, x)

        async def restored() -> bool:
            return x in (await registry.topic_route(only_x)).brokers

        await eventually(restored, timeout=20, what=f"{x} restored its topics")
        in_flight = delayed | {b"tx"}
        await eventually(
            lambda: _true(sink.has(in_flight)), timeout=40, what="delayed and transactional"
        )
        # A duplicate of an earlier offset comes before a later message of the same queue:
        # wait for a last message on every queue, then count.
        last = {f"z{i}".encode() for i in range(4)}
        for body in sorted(last):
            await p.send(Message(both, body))
        await p.send(Message(only_x, b"z-x"))
        last.add(b"z-x")
        await eventually(lambda: _true(sink.has(last)), timeout=30, what="the last messages")
    finally:
        await c.shutdown()
        await tp.shutdown()
        await p.shutdown()
        await redis.aclose()

    twice = {k: n for k, n in sink.by_queue_offset.items() if n > 1}
    assert twice == {}, f"delivered twice at the same queue and offset: {twice}"
    assert {k: n for k, n in sink.by_msg_id.items() if n > 1} == {}
    assert {b: n for b, n in sink.bodies.items() if b in in_flight} == dict.fromkeys(in_flight, 1)
    assert tx_listener.checks >= 1
