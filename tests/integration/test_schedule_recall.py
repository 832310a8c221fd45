"""Recall of delayed messages (RocketMQ 5.3) on the real stack: a recalled message is never
delivered, a repeat is one recall, a recall after delivery says TOO_LATE, bad handles are clear
errors, the Recall trace reaches the collector's view — and across a broker kill the recall
holds, even one stored while the broker was down."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from tracemq import (
    Message,
    Producer,
    RecallError,
    RecallHandleError,
    RecallStatus,
    RecallTimeoutError,
)
from tracemq.admin import AdminClient
from tracemq.naming import kafka_topic
from tracemq.protocol.recall import RecallHandle, decode_handle
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.reading import read_topic
from tracemq_devkit.waiting import eventually

from tests.integration.test_collector import _view, api
from tests.support.brokers import fast_broker_name, start_fast_broker, wait_routed_sync
from tests.support.metrics import value

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

#: level 1 = 300 ms (delivered at once), level 2 = 6 s (recallable), level 3 = 60 s
LEVELS = {"TRACEMQ_BROKER_DELAY_LEVELS": "300ms 6s 60s"}


async def _delivered(stack: EmbeddedStack, broker: str, topic: str) -> Counter[str]:
    recs = await read_topic(stack.business_bootstrap, kafka_topic(broker, topic))
    return Counter(r.headers.get("UNIQ_KEY", "?") for r in recs)


def _metrics(stack: EmbeddedStack, broker: str) -> str:
    return stack.processes[broker].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]


@pytest.mark.timeout(120)
async def test_recall_before_due_is_never_delivered_and_traced(
    stack: EmbeddedStack,
    collector: ManagedProcess,
    admin: AdminClient,
    env: dict[str, str],
    unique: str,
) -> None:
    broker, topic = fast_broker_name("brc"), f"Recall_{unique}"
    start_fast_broker(stack, broker, **LEVELS)
    try:
        await admin.create_topic(broker, topic, read_queues=2, write_queues=2)
        url = _metrics(stack, broker)
        async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
            recalled = await p.send(Message(topic, b"recall me", delay_level=2))
            kept = await p.send(Message(topic, b"keep me", delay_level=2))
            early = await p.send(Message(topic, b"due at once", delay_level=1))
            plain = await p.send(Message(topic, b"not delayed"))
            assert plain.recall_handle is None
            assert recalled.recall_handle is not None
            h = decode_handle(recalled.recall_handle)
            assert (h.topic, h.broker, h.msg_id, h.level, h.offset) == (
                topic, broker, recalled.msg_id, 2, recalled.queue_offset,
            )  # fmt: skip

            r1 = await p.recall(topic, recalled.recall_handle)
            assert (r1.status, r1.recalled, r1.msg_id) == (
                RecallStatus.RECALLED, True, recalled.msg_id,
            )  # fmt: skip
            r2 = await p.recall(topic, recalled.recall_handle)  # a repeat is one recall
            assert (r2.status, r2.recalled) == (RecallStatus.ALREADY_RECALLED, True)

            # after delivery: "too late", not a lie
            await eventually(
                lambda: _has(stack, broker, topic, early.msg_id), timeout=10, what="early"
            )
            late = await p.recall(topic, early.recall_handle or "")
            assert (late.status, late.recalled) == (RecallStatus.TOO_LATE, False)
            assert "already delivered" in late.detail

            # bad handles: clear errors, nothing recalled
            with pytest.raises(RecallHandleError, match="not URL-safe base64"):
                await p.recall(topic, "not a handle!")
            with pytest.raises(RecallHandleError, match=f"not 'Other_{unique}'"):
                await p.recall(f"Other_{unique}", kept.recall_handle or "")
            forged = RecallHandle(topic, broker, h.timestamp_ms, recalled.msg_id, 2, h.offset + 1)
            with pytest.raises(RecallError, match="holds message"):
                await p.recall(topic, forged.encode())  # kept's offset, recalled's msgId
            beyond = RecallHandle(topic, broker, h.timestamp_ms, kept.msg_id, 2, 10_000)
            with pytest.raises(RecallError, match="no message at level 2 offset 10000"):
                await p.recall(topic, beyond.encode())

        # kept arrives at its due time; recalled never does (same level, before it in order)
        got = await eventually(
            lambda: _has(stack, broker, topic, kept.msg_id), timeout=20, what="kept delivered"
        )
        assert recalled.msg_id not in got, got
        assert got[kept.msg_id] == 1 and got[early.msg_id] == 1
        assert value(url, "tracemq_broker_schedule_recalls_total", result="recalled") == 1
        assert value(url, "tracemq_broker_schedule_recalls_total", result="already_recalled") == 1
        assert value(url, "tracemq_broker_schedule_recalls_total", result="too_late") == 1
        assert value(url, "tracemq_broker_schedule_recalls_total", result="unknown") == 2
        assert value(url, "tracemq_broker_schedule_recall_skipped_total") == 1

        # the Recall trace: the view's recall section and its delivery state
        base = api(collector)
        view = await _view(base, recalled.msg_id, lambda v: len(v.get("recalls", [])) == 3)
        # RECALLED, ALREADY_RECALLED, then the forged handle's refusal (traced as RocketMQ
        # traces every answer), which does not undo the recall
        assert [(r["group"], r["success"]) for r in view["recalls"]] == [
            (f"PG_{unique}", True),
            (f"PG_{unique}", True),
            (f"PG_{unique}", False),
        ]
        assert view["delivery"]["state"] == "recalled"
        assert view["delivery"]["expect_consumers"] is False
        assert view["delivery"]["recalled_by"] == f"PG_{unique}"
        too_late = await _view(base, early.msg_id, lambda v: bool(v.get("recalls")))
        assert [r["success"] for r in too_late["recalls"]] == [False]
        assert too_late["delivery"]["state"] == "delayed"
    finally:
        stack.processes[broker].stop()


async def _has(stack: EmbeddedStack, broker: str, topic: str, msg_id: str) -> Counter[str]:
    got = await _delivered(stack, broker, topic)
    return got if msg_id in got else Counter()


@pytest.mark.timeout(150)
async def test_recall_holds_across_a_broker_kill(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    """Recalled, then the broker is killed: not delivered after the restart. Recalled while the
    broker is down (the request is stored, no answer): applied at the restart, before the
    overdue message could be delivered."""
    broker, topic = fast_broker_name("brk"), f"RecallKill_{unique}"
    start_fast_broker(stack, broker, **LEVELS)
    try:
        await admin.create_topic(broker, topic, read_queues=2, write_queues=2)
        async with Producer(f"PG_{unique}", **env) as p:
            before = await p.send(Message(topic, b"recalled before the kill", delay_level=2))
            during = await p.send(Message(topic, b"recalled while down", delay_level=2))
            kept = await p.send(Message(topic, b"kept", delay_level=2))
            sent_at = time.monotonic()
            r = await p.recall(topic, before.recall_handle or "")
            assert r.status == RecallStatus.RECALLED

            stack.processes[broker].kill()
            with pytest.raises(RecallTimeoutError, match="recall again"):
                await p.recall(topic, during.recall_handle or "", timeout=1.5)
            # the broker comes back after the messages are due: the stored recall still wins
            await asyncio.sleep(max(0.0, 6.5 - (time.monotonic() - sent_at)))
            stack.restart(broker)
            wait_routed_sync(stack, broker)

            again = await p.recall(topic, during.recall_handle or "")
            assert again.status == RecallStatus.ALREADY_RECALLED, again
            first = await p.recall(topic, before.recall_handle or "")
            assert first.status == RecallStatus.ALREADY_RECALLED, first  # the journal kept it

        got = await eventually(
            lambda: _has(stack, broker, topic, kept.msg_id), timeout=20, what="kept delivered"
        )
        assert got == Counter({kept.msg_id: 1}), got
    finally:
        stack.processes[broker].stop()
