"""The schedule service across broker restarts: nothing lost, nothing delivered twice — killed
while messages wait, killed in the middle of a delivery stream, and a crash between the
targets' acknowledgement and the progress write (replayed from a crafted journal)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from tracemq import Message, Producer
from tracemq.admin import AdminClient
from tracemq.naming import SCHEDULE_TOPIC, kafka_topic
from tracemq.protocol.forwarding import SCHEDULE_OFFSET
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_topic
from tracemq_devkit.waiting import eventually

from tests.support.brokers import (
    FAST_LEVELS_MS,
    fast_broker_name,
    start_fast_broker,
    wait_routed_sync,
)
from tests.support.metrics import value

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def _restart(stack: EmbeddedStack, name: str) -> None:
    stack.restart(name)
    wait_routed_sync(stack, name)


async def _delivered(stack: EmbeddedStack, broker: str, topic: str) -> Counter[str]:
    recs = await read_topic(stack.business_bootstrap, kafka_topic(broker, topic))
    return Counter(r.headers.get("UNIQ_KEY", "?") for r in recs)


@pytest.mark.timeout(90)
async def test_killed_while_messages_wait(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    name, topic = fast_broker_name("bsk"), f"Wait_{unique}"
    start_fast_broker(stack, name)
    try:
        await admin.create_topic(name, topic, read_queues=2, write_queues=2)
        sent: dict[str, tuple[int, int]] = {}
        async with Producer(f"PG_{unique}", **env) as p:
            for i in range(40):
                level = 9 + i % 2  # 1 s and 2 s
                t = int(time.time() * 1000)
                r = await p.send(Message(topic, f"m{i}".encode(), delay_level=level))
                sent[r.msg_id] = (level, t)
        stack.processes[name].kill()
        await asyncio.sleep(0.5)
        _restart(stack, name)

        async def all_there() -> Counter[str]:
            got = await _delivered(stack, name, topic)
            return got if len(got) == len(sent) else Counter()

        got = await eventually(all_there, timeout=30, what="every waiting message delivered")
        await asyncio.sleep(1.0)  # room for a duplicate to show up
        got = await _delivered(stack, name, topic)
        assert set(got) == set(sent) and set(got.values()) == {1}, got
        recs = await read_topic(stack.business_bootstrap, kafka_topic(name, topic))
        for r in recs:
            level, t = sent[r.headers["UNIQ_KEY"]]
            assert r.timestamp >= t + FAST_LEVELS_MS[level - 1]  # not before due, even so
    finally:
        stack.processes[name].stop()


@pytest.mark.timeout(90)
async def test_killed_in_the_middle_of_deliveries(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    name, topic = fast_broker_name("bsm"), f"Stream_{unique}"
    start_fast_broker(stack, name)
    try:
        await admin.create_topic(name, topic, read_queues=4, write_queues=4)
        sent: set[str] = set()
        async with Producer(f"PG_{unique}", **env) as p:

            async def produce() -> None:
                for i in range(60):
                    rs = await asyncio.gather(
                        *(
                            p.send(Message(topic, f"m{i}-{j}".encode(), delay_level=1 + j % 3))
                            for j in range(10)
                        )
                    )
                    sent.update(r.msg_id for r in rs)
                    await asyncio.sleep(0.03)

            task = asyncio.create_task(produce())
            await asyncio.sleep(1.0)  # deliveries are flowing now
            stack.processes[name].kill()
            await task  # the records are already in the schedule topic: the data cluster is up
        assert len(sent) == 600
        _restart(stack, name)

        async def all_there() -> Counter[str]:
            got = await _delivered(stack, name, topic)
            return got if len(got) == len(sent) else Counter()

        await eventually(all_there, timeout=30, what="every message delivered")
        await asyncio.sleep(1.0)
        got = await _delivered(stack, name, topic)
        assert set(got) == sent
        assert [k for k, n in got.items() if n > 1] == []
    finally:
        stack.processes[name].stop()


@pytest.mark.timeout(90)
async def test_crash_after_the_ack_before_the_progress_write(
    stack: EmbeddedStack, admin: AdminClient, env: dict[str, str], unique: str
) -> None:
    """Replay the worst moment: targets acknowledged, progress not written. The restarted
    broker reads the intent, finds the records in their targets and does not deliver them again;
    a record of the intent that never arrived is delivered once."""
    name, topic = fast_broker_name("bsi"), f"Intent_{unique}"
    start_fast_broker(stack, name)
    try:
        await admin.create_topic(name, topic, read_queues=2, write_queues=2)
        async with Producer(f"PG_{unique}", **env) as p:
            ids = [
                (await p.send(Message(topic, f"m{i}".encode(), delay_level=1))).msg_id
                for i in range(20)
            ]

        async def all_there() -> bool:
            return len(await _delivered(stack, name, topic)) == 20

        await eventually(all_there, timeout=15, what="first delivery")
        assert stack.processes[name].stop() == 0

        # one more schedule record that was "about to be forwarded" when the broker died
        raw = AIOKafkaProducer(bootstrap_servers=stack.business_bootstrap)
        await raw.start()
        try:
            md = await raw.send_and_wait(
                kafka_topic(name, SCHEDULE_TOPIC),
                b"late",
                partition=0,
                headers=[
                    ("UNIQ_KEY", b"C" * 32),
                    ("DELAY", b"1"),
                    ("REAL_TOPIC", topic.encode()),
                    ("REAL_QID", b"0"),
                ],
            )
        finally:
            await raw.stop()
        assert md.offset == 20
        journal = Path(stack.workdir) / "data" / name / "schedule" / "level-1.json"
        state = json.loads(journal.read_text())
        assert state["next"] == 20 and state["intent"] is None
        ktopic = kafka_topic(name, topic)
        journal.write_text(
            json.dumps(
                {
                    "version": 1,
                    "level": 1,
                    "next": 0,
                    "delivered": [],
                    "intent": {
                        "ts": int(time.time() * 1000),
                        "coords": [f"1:{o}" for o in range(21)],
                        "starts": [[ktopic, 0, 0], [ktopic, 1, 0]],
                    },
                }
            )
        )
        _restart(stack, name)
        metrics_url = stack.processes[name].health_url.replace("/healthz", "/metrics")  # type: ignore[union-attr]

        async def late_there() -> Counter[str]:
            got = await _delivered(stack, name, topic)
            return got if "C" * 32 in got else Counter()

        await eventually(late_there, timeout=15, what="the record that never arrived")
        await asyncio.sleep(0.5)
        got = await _delivered(stack, name, topic)
        assert set(got) == {*ids, "C" * 32} and set(got.values()) == {1}, got
        assert value(metrics_url, "tracemq_broker_schedule_recovered_total") == 20
        recs = await read_topic(stack.business_bootstrap, ktopic)
        assert sorted(int(r.headers[SCHEDULE_OFFSET].split(":")[1]) for r in recs) == list(
            range(21)
        )
    finally:
        stack.processes[name].stop()
