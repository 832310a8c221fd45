"""The suite's clean-up of clients a test left running (tests/support/clients.py): a failed
test's clients are shut down in its own event loop, not garbage-collected during the next."""

from __future__ import annotations

import pytest
from tracemq import (
    ConsumeConcurrentlyStatus,
    Message,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.errors import ClientStateError
from tracemq_devkit.devstack import EmbeddedStack

from tests.support.clients import closing_left_clients, describe_consumers


async def test_clients_left_running_are_shut_down(
    stack: EmbeddedStack, admin: AdminClient, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"Cleanup_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    closed = Producer(f"PG_closed_{unique}", **env)
    async with closing_left_clients(monkeypatch) as started:
        left = Producer(f"PG_left_{unique}", enable_msg_trace=True, **env)
        await left.start()
        await closed.start()
        await closed.shutdown()
        consumer = PushConsumer(f"CG_left_{unique}", **env)
        consumer.subscribe(topic, "*")

        async def listener(msgs: object, ctx: object) -> ConsumeConcurrentlyStatus:
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer.register_message_listener(listener)
        await consumer.start()
        await left.send(Message(topic, b"x"))
        assert await consumer.wait_assigned(30)
        described = await describe_consumers([consumer])
        assert started == [left, closed, consumer]
    # the block shut the two left running down, and left the closed one alone
    with pytest.raises(ClientStateError, match="has been shut down"):
        await left.send(Message(topic, b"y"))
    with pytest.raises(ClientStateError, match="is shutdown"):
        await consumer.start()
    assert left.trace_dispatcher.stats()["discarded"] == 0
    # the diagnostic names the group, its cluster and each queue's position and log end
    assert f"consumer CG_left_{unique}" in described
    assert "position=" in described and "end=" in described and "joined=True" in described
