"""Bad input to the client library gets clear errors; shutdown flushes every trace."""

from __future__ import annotations

import pytest
from tracemq import Message, Producer, PushConsumer
from tracemq.admin import AdminClient
from tracemq.errors import ClientStateError, InvalidNameError, NoRouteError, TraceTopicError
from tracemq.message import InvalidMessageError
from tracemq.trace import TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_trace_topic

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def test_message_validation() -> None:
    with pytest.raises(InvalidNameError, match="topic is empty"):
        Message("", b"x")
    with pytest.raises(InvalidNameError, match="illegal characters"):
        Message("bad topic", b"x")
    with pytest.raises(InvalidMessageError, match="body must be bytes"):
        Message("T", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="keys must be a str or a list of str"):
        Message("T", b"x", keys=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="keys must be str"):
        Message("T", b"x", keys=["ok", 7])  # type: ignore[list-item]
    with pytest.raises(InvalidMessageError, match="tags must be a str"):
        Message("T", b"x", tags=["A"])  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="set by tracemq"):
        Message("T", b"x", properties={"UNIQ_KEY": "x"})
    assert Message("T", b"x", keys="a b").keys == ["a", "b"]


async def test_producer_errors(stack: EmbeddedStack, admin: AdminClient, unique: str) -> None:
    topic = f"Err_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    p = Producer(
        f"PG_{unique}",
        redis_url=stack.redis_url,
        control_bootstrap=stack.business_bootstrap,
        max_message_size=1024,
    )
    with pytest.raises(ClientStateError, match="not started"):
        await p.send(Message(topic, b"x"))
    await p.start()
    with pytest.raises(InvalidMessageError, match="exceeds max_message_size 1024"):
        await p.send(Message(topic, b"x" * 1025))
    with pytest.raises(InvalidMessageError, match="body is empty"):
        await p.send(Message(topic, b""))
    with pytest.raises(NoRouteError, match=f"Missing_{unique}"):
        await p.send(Message(f"Missing_{unique}", b"x"))
    with pytest.raises(InvalidMessageError, match="expected a tracemq.Message"):
        await p.send("not a message")  # type: ignore[arg-type]
    ok = await p.send(Message(topic, b"fine"))
    assert ok.queue.topic == topic and ok.queue.broker == "broker-a"
    await p.shutdown()
    with pytest.raises(ClientStateError, match="shut down"):
        await p.send(Message(topic, b"x"))


async def test_custom_trace_topic_without_route_fails_at_start(
    stack: EmbeddedStack, unique: str
) -> None:
    p = Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        trace_topic=f"MyTrace_{unique}",
        redis_url=stack.redis_url,
        control_bootstrap=stack.business_bootstrap,
    )
    with pytest.raises(TraceTopicError, match=f"MyTrace_{unique}"):
        await p.start()
    c = PushConsumer(
        f"CG_{unique}", redis_url=stack.redis_url, control_bootstrap=stack.business_bootstrap
    )
    with pytest.raises(ClientStateError, match="subscribe"):
        await c.start()


async def test_shutdown_flushes_every_trace(
    stack: EmbeddedStack, admin: AdminClient, unique: str
) -> None:
    topic = f"Flush_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    p = Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        redis_url=stack.redis_url,
        control_bootstrap=stack.business_bootstrap,
        trace_options={"flush_interval_ms": 1000, "batch_size": 1000},
    )
    await p.start()
    ids = set()
    for i in range(300):
        ids.add((await p.send(Message(topic, f"m{i}".encode()))).msg_id)
    await p.shutdown()  # returns only when every Pub is in the trace topic (or counted)
    st = p.trace_dispatcher.stats()
    assert st["failed"] == 0 and st["discarded"] == 0
    msgs = await read_trace_topic(stack.trace_bootstrap)
    found = {
        c.trace_beans[0].msg_id for m in msgs for c in m.contexts if c.trace_type == TraceType.Pub
    }
    assert ids <= found
