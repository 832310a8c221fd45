"""Transactional messages on a broker with short check timings (first check 1.5 s after the half,
then every 0.7 s, 4 checks at most): commit, rollback, unknown resolved by check-back, check-back
after the producer process dies, rollback after the last check, garbage and duplicate end records,
and broker restarts with a pending transaction — each with its traces."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiokafka import AIOKafkaProducer
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    PushConsumer,
    TransactionProducer,
)
from tracemq.admin import AdminClient
from tracemq.message import MessageConst
from tracemq.naming import HALF_TOPIC, OP_HALF_TOPIC, kafka_topic
from tracemq.protocol import transaction as txp
from tracemq.trace import MessageType, TraceType, TransactionState
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_topic, read_trace_topic
from tracemq_devkit.waiting import eventually

from tests.support.brokers import fast_broker, fast_broker_name, start_fast_broker, wait_routed_sync
from tests.support.metrics import value

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

TX_ENV = {"TRACEMQ_BROKER_TRANSACTION_CHECK_MAX": "4"}
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture(scope="module")
def broker(stack: EmbeddedStack) -> Iterator[str]:
    with fast_broker(stack, "btx", **TX_ENV) as name:
        yield name


class Listener:
    """execute: by body (commit / rollback / unknown / raise); check: ``answers`` by body."""

    def __init__(self, answers: dict[bytes, LocalTransactionState] | None = None) -> None:
        self.answers = answers or {}
        self.checks: Counter[bytes] = Counter()
        self.executed: list[tuple[Message, Any]] = []

    async def execute_local_transaction(self, msg: Message, arg: Any) -> Any:
        self.executed.append((msg, arg))
        kind = msg.body.split(b"-")[0]
        if kind == b"raise":
            raise RuntimeError("local transaction failed")
        return {b"commit": COMMIT, b"rollback": ROLLBACK}.get(kind, UNKNOW)

    def check_local_transaction(self, msg: MessageExt) -> Any:  # sync: runs in a thread
        self.checks[msg.body] += 1
        return self.answers.get(msg.body, UNKNOW)


class Collect:
    def __init__(self) -> None:
        self.got: dict[bytes, list[MessageExt]] = defaultdict(list)

    async def __call__(self, msgs: list[MessageExt], ctx: Any) -> Any:
        for m in msgs:
            self.got[m.body].append(m)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


async def _consumer(topic: str, group: str, sink: Collect, env: dict[str, str]) -> PushConsumer:
    c = PushConsumer(group, consume_from=ConsumeFromWhere.FIRST_OFFSET, **env)
    c.subscribe(topic)
    c.register_message_listener(sink)
    await c.start()
    return c


async def _true(v: bool) -> bool:
    return v


def _metrics(stack: EmbeddedStack, broker: str) -> str:
    return stack.processes[broker].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]


async def _delivered(stack: EmbeddedStack, broker: str, topic: str) -> Counter[bytes]:
    return Counter(
        r.value for r in await read_topic(stack.business_bootstrap, kafka_topic(broker, topic))
    )


@pytest.mark.timeout(60)
async def test_commit_rollback_and_check_back_with_traces(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic, pgroup = f"Tx_{unique}", f"PGtx_{unique}"
    await admin.create_topic(broker, topic, read_queues=2, write_queues=2)
    sink = Collect()
    consumer = await _consumer(topic, f"CG_{unique}", sink, env)
    listener = Listener({b"unknown-1": COMMIT, b"raise-1": ROLLBACK})
    results = {}
    try:
        async with TransactionProducer(pgroup, listener, enable_msg_trace=True, **env) as p:
            for body in (b"commit-1", b"rollback-1", b"unknown-1", b"raise-1"):
                r = await p.send_message_in_transaction(
                    Message(topic, body, tags="T", keys=[f"k-{body.decode()}"]), arg=body
                )
                results[body] = r
            assert [a for _, a in listener.executed] == list(results)
            assert results[b"commit-1"].local_transaction_state == COMMIT
            assert results[b"rollback-1"].local_transaction_state == ROLLBACK
            assert results[b"unknown-1"].local_transaction_state == UNKNOW
            assert results[b"raise-1"].local_transaction_state == UNKNOW
            for r in results.values():
                assert r.transaction_id == r.msg_id
                assert r.queue.topic == HALF_TOPIC and r.queue.broker == broker

            async def committed() -> Counter[bytes]:
                got = await _delivered(stack, broker, topic)
                return got if b"commit-1" in got else Counter()

            # the commit is there at once; the unknown one is held until a check-back decides
            assert b"unknown-1" not in await eventually(committed, timeout=1.2, what="commit")
            await eventually(
                lambda: _true(b"unknown-1" in sink.got), timeout=15, what="commit by check-back"
            )
            await eventually(
                lambda: _true(listener.checks[b"raise-1"] >= 1), timeout=10, what="check of raise"
            )
            await asyncio.sleep(1.0)
            await p.trace_dispatcher.flush(10)
    finally:
        await consumer.shutdown()
    assert set(sink.got) == {b"commit-1", b"unknown-1"}
    assert all(len(v) == 1 for v in sink.got.values())
    assert listener.checks[b"commit-1"] == listener.checks[b"rollback-1"] == 0
    assert listener.checks[b"unknown-1"] == 1 and listener.checks[b"raise-1"] == 1
    for body in (b"commit-1", b"unknown-1"):
        m = sink.got[body][0]
        assert m.msg_id == results[body].msg_id and m.topic == topic and m.tags == "T"
        assert m.property(MessageConst.TRAN_MSG) is None  # no longer a half message
        assert m.property(MessageConst.PRODUCER_GROUP) == pgroup
        assert m.queue.queue_id == int(m.property(MessageConst.REAL_QID) or -1)

    ids = {r.msg_id: body for body, r in results.items()}
    traces = [
        c
        for tm in await read_trace_topic(stack.trace_bootstrap)
        for c in tm.contexts
        if c.trace_beans[0].msg_id in ids
    ]
    pubs = [c for c in traces if c.trace_type == TraceType.Pub]
    assert sorted(ids[c.trace_beans[0].msg_id] for c in pubs) == sorted(results)
    assert all(c.trace_beans[0].msg_type == MessageType.Trans_Msg_Half for c in pubs)
    assert all(c.trace_beans[0].topic == topic and c.group_name == pgroup for c in pubs)
    ends: dict[bytes, list[tuple[Any, ...]]] = defaultdict(list)
    for c in traces:
        if c.trace_type == TraceType.EndTransaction:
            b = c.trace_beans[0]
            assert b.transaction_id == b.msg_id and b.topic == topic
            ends[ids[b.msg_id]].append((b.transaction_state, b.from_transaction_check, b.msg_type))
    assert ends[b"commit-1"] == [
        (TransactionState.COMMIT_MESSAGE, False, MessageType.Trans_msg_Commit)
    ]
    assert ends[b"rollback-1"] == [
        (TransactionState.ROLLBACK_MESSAGE, False, MessageType.Trans_Msg_Half)
    ]
    assert ends[b"unknown-1"] == [
        (TransactionState.UNKNOW, False, MessageType.Trans_Msg_Half),
        (TransactionState.COMMIT_MESSAGE, True, MessageType.Trans_msg_Commit),
    ]
    assert ends[b"raise-1"] == [
        (TransactionState.UNKNOW, False, MessageType.Trans_Msg_Half),
        (TransactionState.ROLLBACK_MESSAGE, True, MessageType.Trans_Msg_Half),
    ]


@pytest.mark.timeout(60)
async def test_rollback_after_the_last_check(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic = f"TxMax_{unique}"
    await admin.create_topic(broker, topic, read_queues=1, write_queues=1)
    listener = Listener()  # always UNKNOW
    before = value(
        _metrics(stack, broker), "tracemq_broker_transaction_results_total", result="check_rollback"
    )
    async with TransactionProducer(f"PG_{unique}", listener, **env) as p:
        await p.send_message_in_transaction(Message(topic, b"forever"))

        async def rolled_back() -> bool:
            return (
                value(
                    _metrics(stack, broker),
                    "tracemq_broker_transaction_results_total",
                    result="check_rollback",
                )
                >= before + 1
            )

        await eventually(rolled_back, timeout=20, what="rollback after the checks")
        await asyncio.sleep(1.0)  # no check after the rollback
    assert listener.checks[b"forever"] == 4
    assert await _delivered(stack, broker, topic) == Counter()


@pytest.mark.timeout(60)
async def test_check_back_after_the_producer_process_dies(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    """The producer dies inside its local transaction: no end record. Another producer of the
    group answers the check-back."""
    topic, pgroup = f"TxCrash_{unique}", f"PGc_{unique}"
    await admin.create_topic(broker, topic, read_queues=1, write_queues=1)
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from tracemq import Message, TransactionProducer

        class Hang:
            async def execute_local_transaction(self, msg, arg):
                print("IN-TRANSACTION", flush=True)
                await asyncio.sleep(3600)
            def check_local_transaction(self, msg):
                return "UNKNOW"

        async def main():
            p = TransactionProducer({pgroup!r}, Hang(), enable_msg_trace=True,
                                    redis_url={stack.redis_url!r},
                                    control_bootstrap={stack.business_bootstrap!r})
            await p.start()
            await p.send_message_in_transaction(Message({topic!r}, b"crash", keys=["crash-k"]))

        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"IN-TRANSACTION"
    finally:
        proc.kill()
        await proc.wait()
    sink = Collect()
    consumer = await _consumer(topic, f"CG_{unique}", sink, env)
    listener = Listener({b"crash": COMMIT})
    raw = AIOKafkaProducer(bootstrap_servers=stack.business_bootstrap)
    await raw.start()
    try:
        async with TransactionProducer(pgroup, listener, enable_msg_trace=True, **env) as p:
            # garbage on the check topic, addressed to this group, must not stop the producer
            for junk in (os.urandom(30), msgpack.packb({"v": 1, "type": "tx.check"})):
                await raw.send_and_wait(txp.TXCHECK_TOPIC, junk, key=pgroup.encode())
            await eventually(lambda: _true(b"crash" in sink.got), timeout=20, what="check-back")
            await p.trace_dispatcher.flush(10)
    finally:
        await raw.stop()
        await consumer.shutdown()
    assert listener.checks[b"crash"] == 1 and len(sink.got[b"crash"]) == 1
    msg_id = sink.got[b"crash"][0].msg_id
    ends = [
        c
        for tm in await read_trace_topic(stack.trace_bootstrap)
        for c in tm.contexts
        if c.trace_type == TraceType.EndTransaction and c.trace_beans[0].msg_id == msg_id
    ]
    assert [
        (c.trace_beans[0].transaction_state, c.trace_beans[0].from_transaction_check) for c in ends
    ] == [(TransactionState.COMMIT_MESSAGE, True)]
    assert ends[0].trace_beans[0].keys == "crash-k"


@pytest.mark.timeout(60)
async def test_garbage_and_duplicate_end_records(
    stack: EmbeddedStack, admin: AdminClient, broker: str, env: dict[str, str], unique: str
) -> None:
    topic, pgroup = f"TxGarbage_{unique}", f"PGg_{unique}"
    await admin.create_topic(broker, topic, read_queues=1, write_queues=1)
    url = _metrics(stack, broker)

    def skipped(reason: str) -> float:
        return value(url, "tracemq_broker_transaction_rejected_total", reason=reason)

    before = {r: skipped(r) for r in ("garbage", "type", "schema", "mismatch", "duplicate")}
    op = kafka_topic(broker, OP_HALF_TOPIC)
    half = kafka_topic(broker, HALF_TOPIC)
    listener = Listener()
    raw = AIOKafkaProducer(bootstrap_servers=stack.business_bootstrap)
    await raw.start()
    try:
        async with TransactionProducer(pgroup, listener, **env) as p:
            committed = await p.send_message_in_transaction(Message(topic, b"commit-a"))
            pending = await p.send_message_in_transaction(Message(topic, b"unknown-b"))

            async def end(offset: int, msg_id: str, state: str) -> None:
                rec = txp.EndTransaction(
                    half_offset=offset,
                    msg_id=msg_id,
                    state=state,
                    group=pgroup,  # type: ignore[arg-type]
                )
                await raw.send_and_wait(op, txp.encode(rec), partition=0)

            # garbage and wrong records first: none may decide anything
            await raw.send_and_wait(op, os.urandom(40), partition=0)
            await raw.send_and_wait(op, msgpack.packb({"v": 1, "type": "tx.explode"}), partition=0)
            await raw.send_and_wait(
                op, msgpack.packb({"v": 1, "type": "tx.end", "half_offset": "x"}), partition=0
            )
            await end(pending.queue_offset, "F" * 32, "ROLLBACK_MESSAGE")  # wrong msgId
            await end(committed.queue_offset, committed.msg_id, "ROLLBACK_MESSAGE")  # too late
            await end(committed.queue_offset, committed.msg_id, "COMMIT_MESSAGE")  # duplicate
            # an end record read before its half (the next half offset), then that half
            ends = await raw.send_and_wait(half, b"", partition=0)  # garbage half (no headers)
            next_half = ends.offset + 1
            await end(next_half, "D" * 32, "COMMIT_MESSAGE")
            await raw.send_and_wait(
                half,
                b"early-c",
                partition=0,
                headers=[
                    ("UNIQ_KEY", b"D" * 32),
                    ("PGROUP", pgroup.encode()),
                    ("TRAN_MSG", b"true"),
                    ("REAL_TOPIC", topic.encode()),
                    ("REAL_QID", b"0"),
                ],
            )
            # the valid end of the pending one
            await end(pending.queue_offset, pending.msg_id, "COMMIT_MESSAGE")

            async def both() -> Counter[bytes]:
                got = await _delivered(stack, broker, topic)
                return got if len(got) == 3 else Counter()

            await eventually(both, timeout=15, what="three commits")
            await asyncio.sleep(0.5)
            got = await _delivered(stack, broker, topic)
            assert got == Counter({b"commit-a": 1, b"unknown-b": 1, b"early-c": 1})
    finally:
        await raw.stop()
    assert skipped("garbage") >= before["garbage"] + 2  # random bytes + the headerless half
    assert skipped("type") >= before["type"] + 1
    assert skipped("schema") >= before["schema"] + 1
    assert skipped("mismatch") >= before["mismatch"] + 1
    assert skipped("duplicate") >= before["duplicate"] + 2
    assert stack.processes[broker]._http_ok()


@pytest.mark.timeout(90)
async def test_broker_restart_with_pending_transactions(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    """SIGKILL with transactions pending, end records written while the broker is down, a check
    that must come from the restarted broker; then a crash in the commit forward replayed from a
    crafted checkpoint. Every committed message is delivered once; rolled back ones never."""
    name, topic, pgroup = fast_broker_name("btr"), f"TxRestart_{unique}", f"PGr_{unique}"
    start_fast_broker(stack, name, TRACEMQ_BROKER_TRANSACTION_CHECK_MAX="20")
    try:
        await admin.create_topic(name, topic, read_queues=2, write_queues=2)
        gate = asyncio.Event()

        class Gated(Listener):
            waiting = 0

            async def execute_local_transaction(self, msg: Message, arg: Any) -> Any:
                if msg.body.startswith(b"gated"):
                    self.waiting += 1
                    await gate.wait()
                return await super().execute_local_transaction(msg, arg)

        listener = Gated({b"unknown-1": COMMIT, b"unknown-2": ROLLBACK})
        async with TransactionProducer(pgroup, listener, **env) as p:
            for body in (b"commit-0", b"unknown-1", b"unknown-2"):
                await p.send_message_in_transaction(Message(topic, body))
            gated = [
                asyncio.create_task(
                    p.send_message_in_transaction(Message(topic, f"gated-{i}".encode()))
                )
                for i in range(4)
            ]
            await eventually(lambda: _true(listener.waiting == 4), what="halves sent")
            stack.processes[name].kill()
            gate.set()  # local transactions end while the broker is down: end records wait
            results = await asyncio.gather(*gated)
            assert {r.local_transaction_state for r in results} == {UNKNOW}
            # gated-N is UNKNOW (kind "gated"): let the restarted broker's checks commit them
            listener.answers.update({f"gated-{i}".encode(): COMMIT for i in range(4)})
            await asyncio.sleep(0.5)
            stack.restart(name)
            wait_routed_sync(stack, name)
            expected = {b"commit-0", b"unknown-1", *(f"gated-{i}".encode() for i in range(4))}

            async def all_there() -> bool:
                return set(await _delivered(stack, name, topic)) == expected

            await eventually(all_there, timeout=30, what="every commit after the restart")
            await asyncio.sleep(1.5)  # let any late check or duplicate show
        got = await _delivered(stack, name, topic)
        assert set(got) == expected and set(got.values()) == {1}, got

        # -- the crash between the commit forward and the checkpoint, replayed ----------------
        assert stack.processes[name].stop() == 0
        state_path = Path(stack.workdir) / "data" / name / "transaction" / "state.json"
        state = json.loads(state_path.read_text())
        assert state["intent"] is None
        ktopic = kafka_topic(name, topic)
        halves = await read_topic(stack.business_bootstrap, kafka_topic(name, HALF_TOPIC))
        committed = [r.offset for r in halves if r.value in expected]
        state_path.write_text(
            json.dumps(
                {
                    "version": 1,
                    "half_low": 0,
                    "op_next": 0,
                    "resolved": [],
                    "checks": {},
                    "early": {},
                    "intent": {
                        "ts": int(time.time() * 1000),
                        "coords": [str(o) for o in committed],
                        "starts": [[ktopic, 0, 0], [ktopic, 1, 0]],
                    },
                }
            )
        )
        stack.restart(name)
        wait_routed_sync(stack, name)
        await asyncio.sleep(3.0)  # replay of every end record and any check-back
        got = await _delivered(stack, name, topic)
        assert set(got) == expected and set(got.values()) == {1}, got
        url = _metrics(stack, name)
        assert value(url, "tracemq_broker_transaction_recovered_total") == len(expected)
        assert value(url, "tracemq_broker_transaction_rejected_total", reason="duplicate") >= 6
        assert stack.processes[name]._http_ok()
    finally:
        stack.processes[name].stop()
