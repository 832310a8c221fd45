"""A producer whose only send hook is message trace's traces through the hook's context-free
``one_pub`` (no SendMessageContext per attempt): one Pub per attempt of ``send`` and per member
of ``send_batch``, the same records the hook methods write when another hook is registered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tracemq.producer.producer as producer_module
from tracemq import Message, Producer
from tracemq.hooks import SendMessageContext
from tracemq.message import SendResult, SendStatus
from tracemq.routing.model import QueueRoute
from tracemq.trace import TraceType, decode
from tracemq.trace._codec import write_records
from tracemq.trace._hooks import SendMessageTraceHook

ROUTE = QueueRoute(
    "broker-a", "c", 2, 2, 6, "127.0.0.1:1", "10.0.0.1:10911", region_id="Region-A"
)  # fmt: skip


class Appender:
    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def append_record(self, record: tuple[Any, ...]) -> bool:
        self.records.append(record)
        return True


class Seen:
    """Another send hook: the producer then builds contexts for every hook."""

    def __init__(self) -> None:
        self.contexts: list[SendMessageContext] = []

    def send_message_before(self, ctx: SendMessageContext) -> None:
        pass

    def send_message_after(self, ctx: SendMessageContext) -> None:
        self.contexts.append(ctx)


def _producer(appender: Appender, extra: Seen | None, fail_first: bool) -> Producer:
    p = Producer(
        "PG", redis_url="redis://127.0.0.1:1/0", control_bootstrap="127.0.0.1:1",
        retry_times_when_send_failed=1,
    )  # fmt: skip
    p._state = "running"
    failed: list[bool] = []

    async def queues(topic: str, **_: Any) -> Any:
        return None, [(ROUTE, 0), (ROUTE, 1)]

    async def produce(*_: Any) -> asyncio.Future[Any]:
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if fail_first and not failed:
            failed.append(True)
            ack.set_exception(OSError("broker gone"))
        else:
            ack.set_result(16)
        return ack

    async def result(q: Any, place: Any, msg_id: str, md: Any) -> SendResult:
        return SendResult(SendStatus.SEND_OK, msg_id, "OFFSET-ID", place.queue, md, "R", True)

    p._queues, p._produce, p._result = queues, produce, result  # type: ignore[method-assign]
    hook = SendMessageTraceHook(appender, "RMQ_SYS_TRACE_TOPIC")  # type: ignore[arg-type]
    p._trace_hook = hook
    p.register_send_hook(hook)
    if extra is not None:
        p.register_send_hook(extra)
    return p


async def _traced(extra: Seen | None) -> list[Any]:
    appender = Appender()
    p = _producer(appender, extra, fail_first=True)
    await p.send(Message("Orders", b"x" * 42, tags="Paid", keys=["k1", "k2"]))
    await p.send_batch([Message("Orders", b"a"), Message("Orders", b"bb")])
    texts = write_records(appender.records)
    assert None not in texts
    return [decode(t)[0] for t in texts if t is not None]


@pytest.mark.timeout(10)
async def test_message_trace_alone_writes_the_pubs_of_the_hook_methods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_context(*_: Any, **__: Any) -> None:
        raise AssertionError("a send context was built for message trace alone")

    with monkeypatch.context() as patched:
        patched.setattr(producer_module, "SendMessageContext", no_context)
        alone = await _traced(None)
    seen = Seen()
    with_other = await _traced(seen)
    assert len(seen.contexts) == 4  # the failed attempt, its retry, two batch members
    assert [c.trace_type for c in alone] == [TraceType.Pub] * 4
    assert [c.success for c in alone] == [False, True, True, True]
    for a, b in zip(alone, with_other, strict=True):
        assert (a.region_id, a.group_name, a.success) == (b.region_id, b.group_name, b.success)
        ab, bb = a.trace_beans[0], b.trace_beans[0]
        assert (ab.topic, ab.tags, ab.keys, ab.store_host, ab.body_length, ab.msg_type) == (
            bb.topic, bb.tags, bb.keys, bb.store_host, bb.body_length, bb.msg_type,
        )  # fmt: skip
        assert (ab.offset_msg_id is None) == (bb.offset_msg_id is None)
    first = alone[0].trace_beans[0]
    assert (first.keys, first.store_host, first.offset_msg_id) == ("k1 k2", None, None)
    stored = alone[1].trace_beans[0]
    assert (stored.store_host, stored.offset_msg_id) == ("10.0.0.1:10911", "OFFSET-ID")
    assert alone[0].region_id == "Region-A" and alone[0].group_name == "PG"
