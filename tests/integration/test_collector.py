"""The trace collector on the embedded stack: end to end with the client library, RocketMQ's
own format, garbage, kill -9 mid-ingest, the API's errors, token and fan-out."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from aiokafka import AIOKafkaProducer
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.message_id import new_msg_id
from tracemq.naming import kafka_topic
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.waiting import WaitTimeout, eventually

from tests.support import rocketmq_format as rf
from tests.support.collector_api import TOKEN, http
from tests.support.metrics import value

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def api(proc: ManagedProcess) -> str:
    return f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"


@pytest.fixture
async def raw_producer(stack: EmbeddedStack) -> AsyncIterator[AIOKafkaProducer]:
    p = AIOKafkaProducer(bootstrap_servers=stack.trace_bootstrap, max_request_size=16 * 1024 * 1024)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def _view(base: str, msg_id: str, ready: Any) -> dict[str, Any]:
    last: list[Any] = []

    async def probe() -> dict[str, Any] | None:
        status, body = await asyncio.to_thread(http, f"{base}/api/v1/traces/{msg_id}")
        last[:] = [status, body]
        return body if status == 200 and ready(body) else None

    try:
        return await eventually(probe, timeout=20, what=f"trace view of {msg_id}")
    except AssertionError:
        raise AssertionError(f"last answer {last!r}; health {http(base + '/healthz')!r}") from None


@pytest.mark.timeout(180)
async def test_end_to_end_views_are_complete(
    stack: EmbeddedStack, collector: ManagedProcess, admin: AdminClient, unique: str
) -> None:
    topic = f"Coll_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    groups = {f"CG_ok_{unique}": set(), f"CG_retry_{unique}": set()}

    def listener_for(group: str) -> Any:
        async def listener(msgs: list[MessageExt], ctx: Any) -> Any:
            m = msgs[0]
            if "retry" in group and m.body.endswith(b"0") and m.reconsume_times == 0:
                raise RuntimeError("first attempt fails")
            groups[group].add(m.msg_id)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return listener

    consumers = []
    for g in groups:
        c = PushConsumer(
            g,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            enable_msg_trace=True,
            in_process_retry_delay_ms=100,
            **env,
        )
        c.subscribe(topic)
        c.register_message_listener(listener_for(g))
        await c.start()
        consumers.append(c)
    async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
        ids = {
            (
                await p.send(Message(topic, f"m{i}".encode(), keys=[f"key-{unique}-{i}"], tags="T"))
            ).msg_id: i
            for i in range(30)
        }
    try:
        await eventually(lambda: _done(groups, 30), timeout=60, what="consumed")
    finally:
        for c in consumers:
            await c.shutdown()
    base = api(collector)
    for msg_id, i in ids.items():
        view = await _view(
            base,
            msg_id,
            lambda v: (
                len(v["consumers"]) == 2
                and all(
                    any(a["status"] == "success" for a in c["attempts"]) for c in v["consumers"]
                )
            ),
        )
        assert view["topic"] == topic and view["producer"]["group"] == f"PG_{unique}"
        assert view["producer"]["success"] and view["producer"]["msg_type_name"] == "Normal_Msg"
        by_group = {c["group"]: c["attempts"] for c in view["consumers"]}
        assert [a["status"] for a in by_group[f"CG_ok_{unique}"]] == ["success"]
        retry = by_group[f"CG_retry_{unique}"]
        if i % 10 == 0:
            assert [(a["status"], a["retry_times"], a["context_code_name"]) for a in retry] == [
                ("failed", 0, "EXCEPTION"),
                ("success", 1, "SUCCESS"),
            ]
        else:
            assert [a["status"] for a in retry] == ["success"]
        for a in retry:
            assert a["end"] >= a["begin"] >= view["producer"]["timestamp"]
            assert a["client_host"]
        assert {e["trace_type"] for e in view["events"]} == {"Pub", "SubBefore", "SubAfter"}
    # by key and by topic
    some = next(iter(ids))
    status, found = http(f"{base}/api/v1/traces?key=key-{unique}-{ids[some]}")
    assert status == 200 and [it["msg_id"] for it in found["items"]] == [some]
    status, page1 = http(f"{base}/api/v1/messages?topic={topic}&limit=20")
    assert status == 200 and len(page1["items"]) == 20 and page1["next_cursor"]
    status, page2 = http(
        f"{base}/api/v1/messages?topic={topic}&limit=20&cursor={page1['next_cursor']}"
    )
    got = [it["msg_id"] for it in page1["items"] + page2["items"]]
    assert sorted(got) == sorted(ids) and len(set(got)) == 30


@pytest.mark.timeout(90)
async def test_collector_follows_a_new_customized_trace_topic(
    stack: EmbeddedStack, collector: ManagedProcess, admin: AdminClient, unique: str
) -> None:
    """Issue 22, point 2: a trace topic created on the trace broker while the collector runs
    (default settings) is followed; its traces are found, not a 404."""
    trace_topic = f"FeatTrace_{unique}"
    await admin.create_topic("trace-broker", trace_topic, read_queues=1, write_queues=1)
    topic = f"Feat_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    async with Producer(f"PG_{unique}", enable_msg_trace=True, trace_topic=trace_topic, **env) as p:
        msg_id = (await p.send(Message(topic, b"feat", keys=[f"k-{unique}"]))).msg_id
    base = api(collector)
    view = await _view(base, msg_id, lambda v: v.get("producer") is not None)
    assert view["producer"]["group"] == f"PG_{unique}" and view["topic"] == topic
    status, health = http(f"{base}/healthz")
    followed = {t for ts in health["trace_topics"].values() for t in ts}
    assert kafka_topic("trace-broker", trace_topic) in followed
    assert kafka_topic("trace-broker", "RMQ_SYS_TRACE_TOPIC") in followed


#: A BROADCASTING consumer with default settings in a process of its own (issue 22, point 1).
_BROADCAST_CHILD = """
import asyncio, json, os
from tracemq import ConsumeConcurrentlyStatus, ConsumeFromWhere, MessageModel, PushConsumer

async def main():
    got, done = set(), asyncio.Event()

    async def listener(msgs, ctx):
        got.update(m.msg_id for m in msgs)
        if len(got) >= int(os.environ["N"]):
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = PushConsumer(os.environ["GROUP"], message_model=MessageModel.BROADCASTING,
                     consume_from=ConsumeFromWhere.FIRST_OFFSET, enable_msg_trace=True)
    c.subscribe(os.environ["TOPIC"])
    c.register_message_listener(listener)
    await c.start()
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        await c.shutdown()
    print(json.dumps({"client_id": c.client_id, "got": sorted(got)}))

asyncio.run(main())
"""


@pytest.mark.timeout(150)
async def test_broadcasting_instances_with_default_settings_are_distinct_clients(
    stack: EmbeddedStack, collector: ManagedProcess, admin: AdminClient, unique: str
) -> None:
    """Issue 22, point 1: two BROADCASTING consumers of one group in this process and one in
    another process, all with default settings, each consume every message, and the trace view
    shows one attempt per client, each named by its client id."""
    import re
    import sys

    topic = f"Bcast_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    group = f"CGbc_{unique}"
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
        ids = [(await p.send(Message(topic, f"m{i}".encode()))).msg_id for i in range(10)]
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _BROADCAST_CHILD,
        env={
            **os.environ,
            "TRACEMQ_REDIS_URL": stack.redis_url,
            "TRACEMQ_CONTROL_BOOTSTRAP": stack.business_bootstrap,
            "GROUP": group,
            "TOPIC": topic,
            "N": "10",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    got: dict[int, set[str]] = {0: set(), 1: set()}
    consumers = []
    try:
        for n in (0, 1):

            async def listener(msgs: list[MessageExt], ctx: Any, n: int = n) -> Any:
                got[n].update(m.msg_id for m in msgs)
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            c = PushConsumer(
                group,
                message_model="BROADCASTING",
                consume_from=ConsumeFromWhere.FIRST_OFFSET,
                enable_msg_trace=True,
                **env,
            )
            c.subscribe(topic)
            c.register_message_listener(listener)
            await c.start()
            consumers.append(c)
        await eventually(
            lambda: _async(all(len(s) == 10 for s in got.values())),
            timeout=60,
            what="both in-process instances got every message",
        )
        out, _ = await asyncio.wait_for(child.communicate(), 90)
    finally:
        for c in consumers:
            await c.shutdown()
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0
    other = json.loads(out.decode().strip().splitlines()[-1])
    assert sorted(other["got"]) == sorted(ids), "the other process missed messages"
    pid = os.getpid()
    mine = [c.client_id for c in consumers]
    assert all(re.fullmatch(rf"[0-9.]+@{pid}(#\d+)?", cid) for cid in mine), mine
    assert len({*mine, other["client_id"]}) == 3 and f"@{pid}" not in other["client_id"]
    base = api(collector)
    for msg_id in ids:
        view = await _view(
            base,
            msg_id,
            lambda v: sum(len(c["attempts"]) for c in v["consumers"] if c["group"] == group) == 3,
        )
        [node] = [c for c in view["consumers"] if c["group"] == group]
        assert sorted(a["client_id"] for a in node["attempts"]) == sorted(
            [*mine, other["client_id"]]
        )
        assert all(a["status"] == "success" for a in node["attempts"])


async def _done(groups: dict[str, set[str]], n: int) -> bool:
    return all(len(s) == n for s in groups.values())


@pytest.mark.timeout(120)
async def test_rocketmq_format_and_garbage(
    stack: EmbeddedStack, collector: ManagedProcess, raw_producer: AIOKafkaProducer, unique: str
) -> None:
    """Records as RocketMQ clients write them (every type and historical field count, nulls),
    with garbage around them: the garbage is quarantined, the good records kept."""
    ktopic = kafka_topic("trace-broker", "RMQ_SYS_TRACE_TOPIC")
    now = int(time.time() * 1000)
    ids = {n: new_msg_id() for n in ("p12", "p13", "p14", "p15", "tx", "recall", "mixed")}
    t = f"RmqTopic_{unique}"
    good_messages = [
        rf.pub(now, "PG", t, ids["p12"], fields=12),
        rf.pub(now, "PG", t, ids["p13"], fields=13, success=False),
        rf.pub(now, "PG", t, ids["p14"], fields=14, keys=None, tags=None)
        + rf.sub_before(now + 1, "CG", "r1", ids["p14"], keys=None)
        + rf.sub_after("r1", ids["p14"], 3, True, keys=None, fields=6),
        rf.pub(now, "PG", t, ids["p15"], fields=15)
        + rf.sub_before(now + 2, "CG", "r2", ids["p15"], old_client_host="10.1.1.1")
        + rf.sub_after("r2", ids["p15"], 4, False, code=4, fields=7)
        + rf.sub_before(now + 9, "CG", "r3", ids["p15"], retry=1)
        + rf.sub_after("r3", ids["p15"], 2, True, ts=now + 11, group="CG", fields=9),
        rf.end_transaction(now, "TPG", t, ids["tx"], "ROLLBACK_MESSAGE", True),
        rf.recall(now, "PG", t, ids["recall"]),
    ]
    quarantine_before = http(f"{api(collector)}/api/v1/quarantine?limit=1")[1]["count"]
    mixed = (
        rf.pub(now, "PG", t, ids["mixed"]).encode()
        + b"\xff\xfe broken utf8 \x02"
        + b"Nope\x011\x01x\x02"
        + b"Pub\x01notanumber\x01R\x01G\x01T\x01id\x02"
        + rf.sub_before(now + 5, "CG", "r9", ids["mixed"]).encode()
    )
    huge = rf.pub(now, "PG", t, new_msg_id(), keys="x" * (10 * 1024 * 1024)).encode()
    for raw in [
        *(m.encode() for m in good_messages),
        os.urandom(300),
        b"",
        mixed,
        rf.pub(now, "PG", t, ids["p12"])[:25].encode(),
        huge,
    ]:
        await raw_producer.send_and_wait(ktopic, raw, partition=0)
    base = api(collector)
    p12 = await _view(base, ids["p12"], lambda v: v["producer"] is not None)
    assert p12["producer"]["success"] is True and p12["producer"]["offset_msg_id"] is None
    p13 = await _view(base, ids["p13"], lambda v: True)
    assert p13["producer"]["success"] is False
    p14 = await _view(base, ids["p14"], lambda v: v["consumers"])
    assert p14["producer"]["offset_msg_id"] == "7F00000100002A9F0000000000000001"
    ev = {e["trace_type"]: e for e in p14["events"]}
    assert ev["Pub"]["keys"] is None and ev["Pub"]["tags"] is None
    assert p14["consumers"][0]["attempts"][0]["status"] == "success"
    assert ev["SubAfter"]["context_code"] == 0  # 6-field SubAfter: no contextCode
    p15 = await _view(base, ids["p15"], lambda v: len(v["consumers"][0]["attempts"]) == 2)
    a1, a2 = p15["consumers"][0]["attempts"]
    assert (a1["status"], a1["context_code_name"], a1["client_host"]) == (
        "failed",
        "FAILED",
        "10.1.1.1",
    )
    assert (a2["status"], a2["retry_times"], a2["end"]) == ("success", 1, now + 11)
    tx = await _view(base, ids["tx"], lambda v: v["transactions"])
    assert tx["transactions"][0]["transaction_state"] == "ROLLBACK_MESSAGE"
    assert tx["transactions"][0]["from_transaction_check"] is True
    rc = await _view(base, ids["recall"], lambda v: True)
    assert [e["trace_type"] for e in rc["events"]] == ["Recall"]
    # The mixed message: its two good records kept, its three bad ones quarantined.
    mx = await _view(base, ids["mixed"], lambda v: v["consumers"])
    assert sorted(e["trace_type"] for e in mx["events"]) == ["Pub", "SubBefore"]

    async def quarantined() -> bool:
        return http(f"{base}/api/v1/quarantine?limit=1")[1]["count"] >= quarantine_before + 7

    await eventually(quarantined, timeout=20, what="garbage quarantined")
    metrics = f"{base}/metrics"
    assert value(metrics, "tracemq_collector_quarantined_total", reason="utf8") >= 1
    assert collector.alive()


@pytest.mark.timeout(300)
async def test_kill_9_mid_ingest_loses_and_duplicates_nothing(
    stack: EmbeddedStack,
    admin: AdminClient,
    raw_producer: AIOKafkaProducer,
    tmp_path: Path,
    unique: str,
) -> None:
    trace_topic = f"KillTrace_{unique}"
    await admin.create_topic("trace-broker", trace_topic, read_queues=2, write_queues=2)
    ktopic = kafka_topic("trace-broker", trace_topic)
    now = int(time.time() * 1000)
    expected: set[tuple[int, int, int]] = set()
    batch = []
    for i in range(6000):
        mid = new_msg_id()
        text = (
            rf.pub(now + i, "PG", "T", mid)
            + rf.sub_before(now + i + 1, "CG", f"r{i}", mid)
            + rf.sub_after(f"r{i}", mid, 1, True, ts=now + i + 2, group="CG")
        )
        batch.append(raw_producer.send(ktopic, text.encode(), partition=i % 2))
    for fut in await asyncio.gather(*batch):
        md = await fut
        for idx in range(3):
            expected.add((md.partition, md.offset, idx))
    name = f"collector-k9-{unique}"
    data = tmp_path / "collector"
    env = {
        "TRACEMQ_COLLECTOR_TRACE_TOPICS": trace_topic,
        "TRACEMQ_COLLECTOR_GROUP": f"k9-{unique}",
        "TRACEMQ_COLLECTOR_DATA_DIR": str(data),
        "TRACEMQ_COLLECTOR_BATCH_MAX_RECORDS": "200",
        "TRACEMQ_COLLECTOR_LAKE_FLUSH_INTERVAL_MS": "300",
    }
    proc = stack.start_collector(name, **env)
    try:
        metrics = f"{api(proc)}/metrics"
        await eventually(
            lambda: _async(value(metrics, "tracemq_collector_events_total") >= 3000),
            timeout=60,
            interval=0.02,
            what="ingest under way",
        )
        proc.kill()
        proc = stack.restart(name)
        await eventually(
            lambda: _async(http(f"{api(proc)}/healthz")[1].get("events_stored", -1) >= 0),
            timeout=30,
            what="restarted",
        )

        async def all_in() -> bool:
            return _store_rows(data) >= len(expected) and _lake_rows(data) >= len(expected)

        try:
            await eventually(all_in, timeout=90, interval=0.5, what="ingested after restart")
        except WaitTimeout:
            pytest.fail(
                f"after the restart {_store_rows(data)} store rows and {_lake_rows(data)} lake "
                f"rows of {len(expected)} within 90 s; collector log tail:\n"
                + stack.processes[name].log_tail(60)
            )
    finally:
        stack.processes[name].stop()
    store = _store_keys(data)
    lake = _lake_keys(data)
    assert len(store) == len(set(store)) == len(expected), "duplicates or losses in the store"
    assert set(store) == expected
    assert len(lake) == len(set(lake)) == len(expected), "duplicates or losses in the lake"
    assert set(lake) == expected


async def _async(v: bool) -> bool:
    return v


def _store_keys(data: Path) -> list[tuple[int, int, int]]:
    from tracemq_collector.store import stored_events

    return [
        (e["trace_partition"], e["trace_offset"], e["trace_index"])
        for e in stored_events(data / "traces.db")
    ]


def _store_rows(data: Path) -> int:
    return len(_store_keys(data))


def _lake_keys(data: Path) -> list[tuple[int, int, int]]:
    if not (data / "lake").exists():
        return []
    t = ds.dataset(data / "lake", format="parquet", partitioning="hive").to_table(
        columns=["trace_partition", "trace_offset", "trace_index"]
    )
    return list(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))


def _lake_rows(data: Path) -> int:
    return len(_lake_keys(data))


async def test_api_errors_and_token(collector: ManagedProcess) -> None:
    base = api(collector)
    assert http(f"{base}/api/v1/traces/{new_msg_id()}")[0] == 404
    for url, param in [
        (f"{base}/api/v1/traces/bad%20id!", "msg_id"),
        (f"{base}/api/v1/traces", "key"),
        (f"{base}/api/v1/traces?key=k&limit=0", "limit"),
        (f"{base}/api/v1/traces?key=k&limit=abc", "limit"),
        (f"{base}/api/v1/traces?key=k&begin=yesterday", "begin"),
        (f"{base}/api/v1/traces?key=k&begin=2000&end=1000", "end"),
        (f"{base}/api/v1/traces?key=k&cursor=garbage", "cursor"),
        (f"{base}/api/v1/messages", "topic"),
        (f"{base}/api/v1/messages?topic=T&end=2026-01-01T00:00:00", "end"),
    ]:
        status, body = http(url)
        assert (status, body.get("parameter")) == (400, param), (url, status, body)
    status, spec = http(f"{base}/api/v1/openapi.json")
    assert status == 200 and "/api/v1/traces/{msg_id}" in spec["paths"]
    # The stack's collector wants the stack's token (by default, nobody set it): everything
    # but /healthz and the page shell answers 401 without it or with another one.
    assert http(f"{base}/healthz", token=None)[0] == 200
    assert http(f"{base}/", token=None)[0] == 200
    for path in ("/api/v1/traces?key=k", "/api/v1/quarantine", "/metrics"):
        assert http(base + path, token=None)[0] == 401, path
        assert http(base + path, token=TOKEN + "x")[0] == 401, path
        assert http(base + path)[0] == 200, path
    # the scheme in any case (RFC 6750)
    for scheme in ("bearer", "BEARER", "BeArEr"):
        req = urllib.request.Request(
            f"{base}/api/v1/traces?key=k", headers={"Authorization": f"{scheme} {TOKEN}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/api/v1/traces?key=k", timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"] == "Bearer"
    refused.value.close()


@pytest.mark.timeout(180)
async def test_fan_out_with_two_collectors(
    stack: EmbeddedStack,
    admin: AdminClient,
    raw_producer: AIOKafkaProducer,
    tmp_path: Path,
    unique: str,
) -> None:
    trace_topic = f"FanTrace_{unique}"
    await admin.create_topic("trace-broker", trace_topic, read_queues=2, write_queues=2)
    env = {
        "TRACEMQ_COLLECTOR_TRACE_TOPICS": trace_topic,
        "TRACEMQ_COLLECTOR_GROUP": f"fan-{unique}",
        "TRACEMQ_COLLECTOR_SESSION_TIMEOUT_MS": "6000",
    }
    a = stack.start_collector(
        f"collector-a-{unique}", TRACEMQ_COLLECTOR_DATA_DIR=str(tmp_path / "a"), **env
    )
    b = stack.start_collector(
        f"collector-b-{unique}", TRACEMQ_COLLECTOR_DATA_DIR=str(tmp_path / "b"), **env
    )
    try:
        fan = kafka_topic("trace-broker", trace_topic)

        async def one_partition_each() -> bool:
            owned = [
                [p for p in http(f"{api(c)}/healthz")[1].get("assigned", []) if p.startswith(fan)]
                for c in (a, b)
            ]
            return all(len(o) == 1 for o in owned)

        # healthy is not assigned: a message sent before the group settles may land on the
        # member that held both partitions a moment before
        await eventually(one_partition_each, timeout=60, what="the two collectors split the topic")
        now = int(time.time() * 1000)
        ids = [new_msg_id() for _ in range(2)]
        for part, mid in enumerate(ids):
            await raw_producer.send_and_wait(
                kafka_topic("trace-broker", trace_topic),
                rf.pub(now, "PG", "T", mid).encode(),
                partition=part,
            )

        async def split_and_stored() -> bool:
            ha, hb = http(f"{api(a)}/healthz")[1], http(f"{api(b)}/healthz")[1]
            return ha.get("events_stored", 0) >= 1 and hb.get("events_stored", 0) >= 1

        await eventually(split_and_stored, timeout=60, what="each collector stored one partition")
        for coll in (a, b):
            for mid in ids:
                status, view = http(f"{api(coll)}/api/v1/traces/{mid}")
                assert status == 200 and view["producer"]["group"] == "PG"
            local = [http(f"{api(coll)}/api/v1/traces/{mid}?local=1")[0] for mid in ids]
            assert sorted(local) == [200, 404]  # each holds one; fan-out answers for both
    finally:
        a.stop()
        b.stop()


async def test_cli_trace_show_and_find(
    stack: EmbeddedStack, collector: ManagedProcess, admin: AdminClient, unique: str
) -> None:
    import subprocess

    from tracemq_devkit.devstack.stack import tracemq_command

    topic = f"Cli_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
        msg_id = (await p.send(Message(topic, b"x", keys=[f"cli-{unique}"]))).msg_id
    base = api(collector)
    await _view(base, msg_id, lambda v: v["producer"] is not None)
    cli_env = {
        **os.environ,
        "TRACEMQ_COLLECTOR_URL": base,
        "TRACEMQ_DEV_HOME": "/nonexistent",
        "TRACEMQ_COLLECTOR_API_TOKEN": TOKEN,
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*tracemq_command(), *args], capture_output=True, text=True, env=cli_env, timeout=60
        )

    shown = cli("trace", "show", msg_id)
    assert shown.returncode == 0 and "Pub" in shown.stdout and f"PG_{unique}" in shown.stdout
    as_json = json.loads(cli("trace", "show", msg_id, "--json").stdout)
    assert as_json["producer"]["group"] == f"PG_{unique}"
    found = cli("trace", "find", "--key", f"cli-{unique}", "--json")
    assert [i["msg_id"] for i in json.loads(found.stdout)["items"]] == [msg_id]
    missing = cli("trace", "show", new_msg_id())
    assert missing.returncode == 1 and "404" in missing.stderr
    cli_env["TRACEMQ_COLLECTOR_API_TOKEN"] = "wrong"
    refused = cli("trace", "show", msg_id)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "refused the token" in refused.stderr and "TRACEMQ_COLLECTOR_API_TOKEN" in refused.stderr
