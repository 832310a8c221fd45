"""The client library end to end on the embedded stack, checked against the raw trace topic:
two traced producers, two traced consumer groups (one returning RECONSUME_LATER, one raising),
every trace record decodes and matches what happened."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

import pytest
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
)
from tracemq.admin import AdminClient
from tracemq.message_id import decode_msg_id, decode_offset_msg_id
from tracemq.trace import ConsumeReturnType, MessageType, TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_topic, read_trace_topic
from tracemq_devkit.waiting import WaitTimeout, eventually

from tests.support.clients import describe_consumers

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

N_PER_PRODUCER = 500


def _index(msg: MessageExt) -> int:
    return int(msg.body.split(b"-")[1])


@pytest.mark.timeout(240)
async def test_traces_match_what_happened(
    stack: EmbeddedStack, admin: AdminClient, unique: str
) -> None:
    topic = f"Trace_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    g_later, g_raise = f"CG_later_{unique}", f"CG_raise_{unique}"
    done: dict[str, set[int]] = {g_later: set(), g_raise: set()}

    async def later(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        i = _index(msgs[0])
        if i % 10 == 0 and msgs[0].reconsume_times == 0:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        done[g_later].add(i)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    async def raising(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        i = _index(msgs[0])
        if i % 15 == 0 and msgs[0].reconsume_times == 0:
            raise RuntimeError(f"boom {i}")
        done[g_raise].add(i)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumers = []
    for group, listener in ((g_later, later), (g_raise, raising)):
        c = PushConsumer(
            group,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            enable_msg_trace=True,
            in_process_retry_delay_ms=100,
            **env,
        )
        c.subscribe(topic, "*")
        c.register_message_listener(listener)
        consumers.append(c)
    producers = [Producer(f"PG_{n}_{unique}", enable_msg_trace=True, **env) for n in ("a", "b")]
    for p in producers:
        await p.start()
    for c in consumers:
        await c.start()

    sent: dict[str, tuple[int, str, SendResult]] = {}

    async def produce(p: Producer, base: int) -> None:
        for chunk in range(0, N_PER_PRODUCER, 50):
            msgs = [
                Message(
                    topic,
                    f"body-{base + i}".encode(),
                    tags="TagA" if i % 2 else "TagB",
                    keys=[f"order-{base + i}", f"user-{(base + i) % 7}"],
                )
                for i in range(chunk, chunk + 50)
            ]
            results = await asyncio.gather(*(p.send(m) for m in msgs))
            for m, r in zip(msgs, results, strict=True):
                sent[r.msg_id] = (int(m.body.split(b"-")[1]), p.group, r)

    await asyncio.gather(produce(producers[0], 0), produce(producers[1], N_PER_PRODUCER))
    total = 2 * N_PER_PRODUCER
    assert len(sent) == total
    places = Counter((r.queue.queue_id, r.queue_offset) for _, _, r in sent.values())
    assert max(places.values()) == 1, (
        "two sends were acknowledged at the same queue offset: "
        + str(sorted(k for k, n in places.items() if n > 1)[:20])
    )

    async def all_consumed() -> bool:
        return all(len(s) == total for s in done.values())

    try:
        await eventually(all_consumed, timeout=90, what="both groups consumed everything")
    except WaitTimeout:
        missing = {g: sorted(set(range(total)) - s) for g, s in done.items()}
        missing_any = {i for m in missing.values() for i in m}
        pytest.fail(
            "not every message consumed within 90 s; missing per group: "
            + ", ".join(f"{g}: {len(m)} {m[:20]}" for g, m in missing.items())
            + "; their queues: "
            + str(sorted({r.queue.queue_id for i, _, r in sent.values() if i in missing_any}))
            + "\n"
            + await describe_consumers(consumers)
            + "\n"
            + await _where_missing_went(stack, topic, sent, missing_any)
        )
    for c in consumers:
        await c.shutdown()
    for p in producers:
        await p.shutdown()
    for client in (*producers, *consumers):
        stats = client.trace_dispatcher.stats()
        assert stats["discarded"] == 0 and stats["failed"] == 0, stats

    # -- read the trace topic back and check every record ---------------------------------
    messages = await read_trace_topic(stack.trace_bootstrap)
    ours = [m for m in messages if any(b.msg_id in sent for c in m.contexts for b in c.trace_beans)]
    assert ours, "no trace message for our msgIds"
    for m in ours:
        assert not m.errors, m.errors
        expected_keys = {
            k
            for c in m.contexts
            for b in c.trace_beans
            for k in [b.msg_id, *(b.keys or "").split()]
            if k and k != "null"
        }
        assert expected_keys <= m.keys, "KEYS header lacks msgIds or business keys"

    pubs = defaultdict(list)
    befores = defaultdict(list)  # (group, msg_id) -> contexts
    afters = defaultdict(list)
    for m in ours:
        for c in m.contexts:
            b = c.trace_beans[0]
            if c.trace_type == TraceType.Pub:
                pubs[b.msg_id].append(c)
            elif c.trace_type == TraceType.SubBefore:
                befores[(c.group_name, b.msg_id)].append(c)
            elif c.trace_type == TraceType.SubAfter:
                afters[(c.group_name, b.msg_id)].append(c)

    if set(pubs) != set(sent):
        no_pub = set(sent) - set(pubs)
        again = await read_trace_topic(stack.trace_bootstrap)
        found_later = {b.msg_id for m in again for c in m.contexts for b in c.trace_beans} & no_pub
        pytest.fail(
            f"{len(no_pub)} msgIds without their Pub trace (of {len(sent)}; "
            f"{len(set(pubs) - set(sent))} extra), by producer "
            f"{sorted(Counter(sent[i][1] for i in no_pub).items())}; "
            f"{len(found_later)} of them found by a second read of the trace topic; "
            f"trace messages read: {len(messages)} (ours {len(ours)}), second read {len(again)}; "
            "per partition: "
            + str(sorted(Counter(m.partition for m in messages).items()))
            + " → "
            + str(sorted(Counter(m.partition for m in again).items()))
            + "; producers' dispatchers: "
            + str([p.trace_dispatcher.stats() for p in producers])
        )
    broker_addr = stack.processes["broker-a"].env["TRACEMQ_BROKER_ADDRESS"]
    for msg_id, (i, group, result) in sent.items():
        (pub,) = pubs[msg_id]
        b = pub.trace_beans[0]
        assert pub.group_name == group and pub.success and pub.cost_time >= 0
        assert b.topic == topic and b.tags == ("TagA" if i % N_PER_PRODUCER % 2 else "TagB")
        assert b.keys == f"order-{i} user-{i % 7}"
        assert b.msg_type == MessageType.Normal_Msg and b.body_length == len(f"body-{i}")
        assert b.offset_msg_id == result.offset_msg_id and b.store_host == broker_addr
        info = decode_offset_msg_id(b.offset_msg_id)
        assert (info.queue_id, info.kafka_offset) == (result.queue.queue_id, result.queue_offset)
        assert abs(decode_msg_id(msg_id).timestamp_ms - pub.timestamp) < 60_000
        assert pub.region_id == "DefaultRegion"

        for cg, fails_first, code in (
            (g_later, i % 10 == 0, ConsumeReturnType.FAILED),
            (g_raise, i % 15 == 0, ConsumeReturnType.EXCEPTION),
        ):
            bs = sorted(befores[(cg, msg_id)], key=lambda c: c.trace_beans[0].retry_times)
            as_ = {c.request_id: c for c in afters[(cg, msg_id)]}
            assert len(bs) == len(as_) == (2 if fails_first else 1), (cg, i)
            assert [c.trace_beans[0].retry_times for c in bs] == list(range(len(bs)))
            for attempt, before in enumerate(bs):
                after = as_[before.request_id]  # paired by requestId
                assert after.timestamp >= before.timestamp >= pub.timestamp
                assert after.cost_time == after.timestamp - before.timestamp >= 0
                assert before.trace_beans[0].keys == f"order-{i} user-{i % 7}"
                last = attempt == len(bs) - 1
                assert after.success is last
                assert after.context_code == (ConsumeReturnType.SUCCESS if last else code)


async def _where_missing_went(
    stack: EmbeddedStack,
    topic: str,
    sent: dict[str, tuple[int, str, SendResult]],
    missing: set[int],
) -> str:
    """What the business cluster holds at the offsets the missing messages were acknowledged at
    (a diagnostic of a consume time-out)."""
    try:
        records = await read_topic(stack.business_bootstrap, f"broker-a.{topic}", timeout_s=10)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say what failed
        return f"the topic could not be read back: {exc!r}"
    at = {(r.partition, r.offset): r.value for r in records}
    per_queue = Counter(r.partition for r in records)
    lines = [f"read back: {sorted(per_queue.items())} records per queue"]
    for i, _, r in sorted(sent.values(), key=lambda v: v[0]):
        if i in missing:
            found = at.get((r.queue.queue_id, r.queue_offset))
            lines.append(
                f"  message {i}: acknowledged at queue {r.queue.queue_id} offset "
                f"{r.queue_offset}; there now: {found!r}"
            )
    return "\n".join(lines[:40])
