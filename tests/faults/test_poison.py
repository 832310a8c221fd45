"""Poison records on the control, admin, schedule and trace topics at once (issue 20, findings 1 and 2):
every service stays up and healthy — same process, no restart needed — counts the poison in
/metrics, and applies the valid records sent after it.

On the old code the first record, ``{"v": 1, "type": [1]}`` on the control topic, killed the
nameserver's consume loop (TypeError), so routes stopped changing and every broker expired.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgpack
import pytest
from aiokafka import AIOKafkaProducer
from tracemq.admin import AdminClient
from tracemq.message_id import new_msg_id
from tracemq.naming import SCHEDULE_TOPIC, TRACE_TOPIC, kafka_topic
from tracemq.protocol import control
from tracemq.protocol.admin import ADMIN_TOPIC
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.reading import read_topic
from tracemq_devkit.waiting import eventually

from tests.support import rocketmq_format as rf
from tests.support.collector_api import http as _get
from tests.support.metrics import scrape, value
from tests.support.signing import sealed

CONTROL_TOPIC = "tracemq.namesrv"
SERVICES = ("nameserver", "broker-a", "trace-broker", "collector")


def _metrics_url(proc: ManagedProcess) -> str:
    return f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}/metrics"


def _counts(url: str, name: str) -> dict[str, float]:
    """Every ``reason`` of counter ``name`` at ``url``."""
    return {
        dict(labels).get("reason", ""): v
        for (metric, labels), v in scrape(url).items()
        if metric == name
    }


def _broker_info(name: str, bootstrap: str) -> dict[str, Any]:
    return control.BrokerInfo(
        cluster="DefaultCluster", broker_name=name, address="127.0.0.1:1", data_bootstrap=bootstrap
    ).model_dump(mode="json")


@pytest.mark.timeout(300)
async def test_poison_on_every_topic_is_counted_and_nothing_stops(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    s = fault_stack
    procs = {n: s.processes[n] for n in SERVICES}
    pids = {n: p.pid for n, p in procs.items()}
    ns_metrics = _metrics_url(procs["nameserver"])
    broker_metrics = _metrics_url(procs["broker-a"])
    collector_api = f"http://127.0.0.1:{procs['collector'].env['TRACEMQ_HTTP_PORT']}"
    redis = connect(s.redis_url)
    registry = RegistryReader(redis)
    control_producer = AIOKafkaProducer(bootstrap_servers=s.business_bootstrap)
    trace_producer = AIOKafkaProducer(bootstrap_servers=s.trace_bootstrap)
    await control_producer.start()
    await trace_producer.start()
    try:
        async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
            kept = f"Kept_{unique}"
            await admin.create_topic("broker-a", kept, read_queues=2, write_queues=2)
            ns_before = _counts(ns_metrics, "tracemq_namesrv_control_rejected_total")
            sched_before = _counts(broker_metrics, "tracemq_broker_schedule_rejected_total")
            admin_before = _counts(broker_metrics, "tracemq_broker_admin_rejected_total")
            quarantined_before = sum(
                _counts(f"{collector_api}/metrics", "tracemq_collector_quarantined_total").values()
            )

            # -- the poison ---------------------------------------------------------------------
            now = int(time.time() * 1000)
            a_info = _broker_info("broker-a", s.business_bootstrap)
            control_poison = [
                msgpack.packb({"v": 1, "type": [1]}),  # finding 1
                os.urandom(120),
                msgpack.packb({"v": 2**64 - 1, "type": "broker.heartbeat"}),
                # huge int: past the int64 the registry's scripts can hold
                msgpack.packb({"v": 1, "type": "broker.heartbeat", "ts": 2**64 - 1,
                               "broker": a_info, "topics": {}}),
                # a day ahead, no topics, signed by a broker key (a sender with a bad clock):
                # applied, it would wipe broker-a's routes and shadow its real heartbeats for a day
                sealed(msgpack.packb({"v": 1, "type": "broker.heartbeat", "ts": now + 86_400_000,
                                      "broker": a_info, "topics": {}})),
                msgpack.packb({"v": 1, "type": "client.heartbeat", "ts": "now", "client_id": 7,
                               "group": ["g"], "role": "consumer"}),
            ]  # fmt: skip
            for p in control_poison:  # broker-a's key: the partition its heartbeats go to
                await control_producer.send_and_wait(CONTROL_TOPIC, p, key=b"broker-a")
            admin_poison = [
                msgpack.packb({"v": 1, "type": [1]}),
                os.urandom(120),
                msgpack.packb({"v": 1, "type": "topic.create", "request_id": [1],
                               "broker": "broker-a", "body": {"topic": 2**64 - 1}}),
                msgpack.packb({"v": 1, "type": "topic.list", "request_id": "r",
                               "broker": "broker-a", "reply_topic": "bad name/.."}),
            ]  # fmt: skip
            for p in admin_poison:
                await control_producer.send_and_wait(ADMIN_TOPIC, p, key=b"broker-a")
            trace_topic = kafka_topic("trace-broker", TRACE_TOPIC)
            trace_poison = [
                os.urandom(200),
                msgpack.packb({"v": 1, "type": [1]}),
                # finding 8: an integer field of 4301+ digits
                ("Pub\x01" + "9" * 4400 + "\x01R\x01G\x01T\x01" + new_msg_id() + "\x02").encode(),
                rf.pub(now, "PG", "T", new_msg_id()).replace(str(now), "yesterday").encode(),
                b"",
            ]
            for p in trace_poison:
                await trace_producer.send_and_wait(trace_topic, p, partition=0)
            # the schedule topic's headers: a retry topic whose Kafka name is too long stuck its
            # delay level for good (retried every second); a 5000-digit queue id
            sched = kafka_topic("broker-a", SCHEDULE_TOPIC)
            for value_, headers in [
                (b"overlong", {"REAL_TOPIC": "%RETRY%" + "%" * 120, "REAL_QID": "0"}),
                (b"huge-qid", {"REAL_TOPIC": kept, "REAL_QID": "9" * 5000}),
                (b"delayed", {"REAL_TOPIC": kept, "REAL_QID": "1", "UNIQ_KEY": "D" * 32}),
            ]:
                await control_producer.send_and_wait(
                    sched,
                    value_,
                    partition=0,
                    headers=[(k, v.encode()) for k, v in headers.items()],
                )
            poisoned_at = int(time.time() * 1000)

            # -- valid neighbours, sent after the poison ------------------------------------------
            fake = f"fake-{unique}"
            fake_topic = f"AfterPoison_{unique}"
            register = control.BrokerRegister(
                type="broker.register",
                ts=int(time.time() * 1000),
                broker=control.BrokerInfo.model_validate(
                    {**_broker_info(fake, s.business_bootstrap), "cluster": "PoisonCluster"}
                ),
                topics={fake_topic: control.TopicConfig(read_queues=1, write_queues=1)},
            )
            await control_producer.send_and_wait(
                CONTROL_TOPIC, sealed(control.encode(register)), key=b"broker-a"
            )
            created = await asyncio.wait_for(
                admin.create_topic("broker-a", f"Created_{unique}", read_queues=1, write_queues=1),
                30,
            )
            assert created["created"] is True
            listed = await asyncio.wait_for(admin.list_topics("broker-a"), 10)
            assert kept in listed["topics"] and f"Created_{unique}" in listed["topics"]
            msg_id = new_msg_id()
            await trace_producer.send_and_wait(
                trace_topic, rf.pub(now, "PG", f"T_{unique}", msg_id).encode(), partition=0
            )

            async def fake_routed() -> bool:
                return (await registry.topic_route(fake_topic)).brokers == [fake]

            await eventually(fake_routed, timeout=20, what="the registration after the poison")

            async def real_heartbeat_after_poison() -> bool:
                a = (await registry.brokers()).get("broker-a")
                return a is not None and poisoned_at < a["last_seen"] < int(time.time() * 1000) + 1

            await eventually(real_heartbeat_after_poison, timeout=20, what="broker-a heartbeat")
            assert (await registry.topic_route(kept)).brokers == ["broker-a"]

            async def trace_stored() -> bool:
                status, view = await asyncio.to_thread(
                    _get, f"{collector_api}/api/v1/traces/{msg_id}"
                )
                return status == 200 and view["producer"] is not None

            await eventually(trace_stored, timeout=30, what="the trace after the poison stored")

            async def delayed_delivered() -> bool:
                recs = await read_topic(s.business_bootstrap, kafka_topic("broker-a", kept))
                return [(r.value, r.partition) for r in recs] == [(b"delayed", 1)]

            await eventually(delayed_delivered, timeout=30, what="the delayed message after poison")

            # -- counted ------------------------------------------------------------------------
            ns_after = _counts(ns_metrics, "tracemq_namesrv_control_rejected_total")
            for reason, n in {
                "type": 1,
                "garbage": 1,
                "version": 1,
                "schema": 2,
                "future": 1,
            }.items():
                assert ns_after.get(reason, 0) >= ns_before.get(reason, 0) + n, (reason, ns_after)
            admin_after = _counts(broker_metrics, "tracemq_broker_admin_rejected_total")
            for reason, n in {"type": 1, "garbage": 1, "schema": 1, "reply_topic": 1}.items():
                assert admin_after.get(reason, 0) >= admin_before.get(reason, 0) + n, (
                    reason,
                    admin_after,
                )

            sched_after = _counts(broker_metrics, "tracemq_broker_schedule_rejected_total")
            for reason in ("no_topic", "garbage"):
                assert sched_after.get(reason, 0) >= sched_before.get(reason, 0) + 1, sched_after

            async def all_quarantined() -> bool:
                counts = _counts(f"{collector_api}/metrics", "tracemq_collector_quarantined_total")
                return sum(counts.values()) >= quarantined_before + len(trace_poison)

            await eventually(all_quarantined, timeout=20, what="trace poison quarantined")
    finally:
        await control_producer.stop()
        await trace_producer.stop()
        await redis.aclose()

    # -- nobody died, nobody was restarted --------------------------------------------------
    for name, proc in procs.items():
        assert proc.alive(), f"{name} died:\n{proc.log_tail()}"
        assert proc.pid == pids[name]
        assert proc._http_ok(), f"{name} is unhealthy:\n{proc.log_tail()}"
    assert value(ns_metrics, "tracemq_namesrv_control_rejected_total", reason="apply_failed") == 0
