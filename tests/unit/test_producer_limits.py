"""Producer rules that the stack cannot provoke on demand: a batch whose members the transport
refuses in part (BatchSendError carries every member's result), the size check counting
headers, the Pub of a failed attempt naming no store host, and the view of several attempts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tracemq import BatchSendError, Message, Producer
from tracemq._kafka import MAX_MESSAGE_SIZE, TRANSPORT_MAX_BYTES, ProducerPool, record_size
from tracemq.hooks import SendMessageContext
from tracemq.message import InvalidMessageError, SendResult, SendStatus
from tracemq.routing.model import QueueRoute
from tracemq.trace import MessageType
from tracemq.trace._hooks import SendMessageTraceHook
from tracemq.transport import TOPIC_CONFIGS
from tracemq_collector.view import build_view

ROUTE = QueueRoute("broker-a", "c", 2, 2, 6, "127.0.0.1:1", "10.0.0.1:10911")


class _Sends:
    def __init__(self) -> None:
        self.after: list[SendMessageContext] = []

    def send_message_before(self, context: SendMessageContext) -> None:
        pass

    def send_message_after(self, context: SendMessageContext) -> None:
        self.after.append(context)


def _producer(refuse: set[bytes], **kw: Any) -> tuple[Producer, _Sends, list[bytes]]:
    """A running producer whose transport refuses the bodies in ``refuse`` on every attempt."""
    p = Producer("PG", redis_url="redis://127.0.0.1:1/0", control_bootstrap="127.0.0.1:1", **kw)
    p._state = "running"
    hook = _Sends()
    p.register_send_hook(hook)
    sent: list[bytes] = []

    async def queues(topic: str, **_: Any) -> Any:
        return None, [(ROUTE, 0), (ROUTE, 1)]

    async def produce(q: Any, place: Any, msg: Message, headers: Any) -> asyncio.Future[Any]:
        sent.append(msg.body)
        fut = asyncio.get_running_loop().create_future()
        if msg.body in refuse:
            fut.set_exception(RuntimeError(f"refused {msg.body!r}"))
        else:
            fut.set_result(len(sent))
        return fut

    async def result(q: Any, place: Any, msg_id: str, md: Any) -> SendResult:
        return SendResult(SendStatus.SEND_OK, msg_id, f"off{md}", place.queue, md, "R", True)

    p._queues, p._produce, p._result = queues, produce, result  # type: ignore[method-assign]
    return p, hook, sent


async def test_a_partly_failed_batch_returns_what_was_stored() -> None:
    p, hook, sent = _producer({b"m3"})
    batch = [Message("T", f"m{i}".encode()) for i in range(5)]
    with pytest.raises(BatchSendError, match="1 of 5 batch messages failed") as info:
        await p.send_batch(batch)
    err = info.value
    assert err.failed == [3]
    assert [r is not None for r in err.results] == [True, True, True, False, True]
    assert isinstance(err.errors[3], RuntimeError) and err.errors[:3] == [None] * 3
    assert sent.count(b"m3") == 3  # retried, the others sent once
    # one context per member and attempt; the failed member's attempts are numbered
    m3 = [c for c in hook.after if c.message.body == b"m3"]
    assert [c.attempt for c in m3] == [1, 2, 3] and all(c.send_result is None for c in m3)
    assert len({c.msg_id for c in m3}) == 1


async def test_the_size_check_counts_headers_and_refuses_the_whole_batch() -> None:
    p, _, sent = _producer(set(), max_message_size=4096)
    body = b"x" * 3500  # the body fits, the record with this property does not
    with pytest.raises(InvalidMessageError, match="exceeds max_message_size 4096"):
        await p.send(Message("T", body, properties={"pad": "p" * 1000}))
    with pytest.raises(InvalidMessageError, match="batch member 1: .*nothing was sent"):
        await p.send_batch([Message("T", b"a"), Message("T", body, properties={"p": "p" * 1000})])
    with pytest.raises(InvalidMessageError, match="as one message"):
        await p.send_batch([Message("T", b"a" * 2500), Message("T", b"b" * 2500)])
    assert sent == []
    await p.send(Message("T", body))  # within the limit with its headers
    assert sent == [body]


def test_the_transport_takes_what_the_limit_admits() -> None:
    assert ProducerPool()._kwargs["max_request_size"] == TRANSPORT_MAX_BYTES
    assert TOPIC_CONFIGS["max.message.bytes"] == str(TRANSPORT_MAX_BYTES)
    assert record_size(b"x" * MAX_MESSAGE_SIZE, []) > MAX_MESSAGE_SIZE
    for bad in (0, MAX_MESSAGE_SIZE + 1, 1.5):
        with pytest.raises(ValueError, match="max_message_size"):
            Producer("PG", max_message_size=bad)  # type: ignore[arg-type]


class _Records:
    def __init__(self) -> None:
        self.records: list[str] = []

    def append(self, ctx: Any) -> bool:
        raise AssertionError("the record path is expected")

    def append_record(self, record: tuple[Any, ...]) -> bool:
        from tracemq.trace._codec import write_records

        (text,) = write_records([record])  # the raw record as the dispatcher writes it
        assert text is not None
        self.records.append(text)
        return True


def test_a_failed_attempt_pub_names_no_store_host() -> None:
    ctx = SendMessageContext("PG", Message("T", b"x"), "C0A8", MessageType.Normal_Msg, "10.0.0.9")
    ctx.broker_address, ctx.exception = "10.0.0.1:10911", RuntimeError("refused")
    rec = _Records()
    SendMessageTraceHook(rec, "RMQ_SYS_TRACE_TOPIC").send_message_after(ctx)
    fields = rec.records[0].rstrip("\x02").split("\x01")
    assert fields[0] == "Pub" and fields[8] == "null" and fields[13] == "false"


def _pub(ts: int, ok: bool, store_host: str | None) -> dict[str, Any]:
    return {
        "trace_type": "Pub", "timestamp": ts, "trace_topic": "t", "trace_partition": 0,
        "trace_offset": ts, "trace_index": 0, "msg_id": "M", "group_name": "PG",
        "topic": "T", "success": ok, "cost_time": 1, "store_host": store_host,
        "msg_type": 0, "offset_msg_id": "O" if ok else None, "region_id": "R",
    }  # fmt: skip


def test_the_view_counts_attempts_and_a_failed_send_has_no_store_host() -> None:
    view = build_view("M", [_pub(1, False, None), _pub(2, False, None), _pub(3, True, "b:1")])
    assert view["producer"]["send_attempts"] == 3
    assert (view["producer"]["success"], view["producer"]["store_host"]) == (True, "b:1")
    # an older client's failed Pub named the broker it tried: nothing was stored there
    view = build_view("M", [_pub(1, False, "b:1")])
    assert (view["producer"]["success"], view["producer"]["store_host"]) == (False, None)
