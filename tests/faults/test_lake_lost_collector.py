"""Fault trial: three real collectors share one trace lake in the stack's SeaweedFS bucket; one
is killed for good (SIGKILL) and its data directory deleted. Every message it had ingested is
still found through any survivor's API — by msgId, by key, by topic and time — from the lake
(the live stores miss them); and a collector that then takes over trace partitions backfills
its store for them from the lake (visible in ``/healthz`` and in its store)."""

from __future__ import annotations

import asyncio
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from tracemq import Message, Producer
from tracemq.admin import AdminClient
from tracemq_collector.lake import TraceLake, lake_filesystem
from tracemq_collector.store import TraceStore, stored_events
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.waiting import eventually

from tests.conftest import _SESSION_STACKS, SESSION_SECRETS, TEST_SERVICE_ENV
from tests.support.collector_api import ahttp, get_json
from tests.support.metrics import value

MESSAGES = 160
# Fast lake writes; the two survivors do not backfill, so their answers for the lost
# collector's messages can only come from the lake.
FAST_LAKE = {"TRACEMQ_COLLECTOR_LAKE_FLUSH_INTERVAL_MS": "200"}
NO_BACKFILL = {**FAST_LAKE, "TRACEMQ_COLLECTOR_BACKFILL": "false"}


@pytest.fixture
def lake_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("lake-lost"),
            service_env=dict(TEST_SERVICE_ENV),
            process_env={
                "trace-broker": {"TRACEMQ_BROKER_TRACE_TOPIC_QUEUES": "4"},
                "collector": NO_BACKFILL,
            },
            with_collector=True,
            object_store=True,
            secrets=SESSION_SECRETS,
        )
    )
    _SESSION_STACKS.append(s)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


def _api(proc: ManagedProcess) -> str:
    return f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"


def _health(proc: ManagedProcess) -> dict[str, Any]:
    return dict(get_json(_api(proc) + "/healthz", timeout=3))


def _assigned(proc: ManagedProcess) -> set[str]:
    return set(_health(proc)["assigned"])


def _pubs(db: Path, topic: str) -> set[str]:
    """msgIds of the Pub events of ``topic`` a store holds (read-only: the file may be live)."""
    return {
        e["msg_id"]
        for e in stored_events(db)
        if e["trace_type"] == "Pub" and e["topic"] == topic and e["msg_id"]
    }


def _events_of(db: Path, partitions: set[tuple[str, int]]) -> set[tuple[str, int, int, int]]:
    return {
        (e["trace_topic"], e["trace_partition"], e["trace_offset"], e["trace_index"])
        for e in stored_events(db)
        if (e["trace_topic"], e["trace_partition"]) in partitions
    }


@pytest.mark.timeout(240)
async def test_a_lost_collectors_messages_are_found_from_the_lake_and_backfilled(
    lake_stack: EmbeddedStack, tmp_path: Path, unique: str
) -> None:
    s = lake_stack
    first = s.processes["collector"]
    second = s.start_collector("collector-2", **NO_BACKFILL)
    victim = s.start_collector("collector-3", **FAST_LAKE)
    trio = (first, second, victim)

    def split() -> bool:
        owned = [_assigned(c) for c in trio]
        return all(owned) and len(set().union(*owned)) == 4 and sum(map(len, owned)) == 4

    await eventually(split, timeout=60, interval=0.5, what="the trace partitions split in three")

    topic = f"Lost_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    begin = int(time.time() * 1000) - 1000
    keys: dict[str, str] = {}
    async with Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        redis_url=s.redis_url,
        control_bootstrap=s.business_bootstrap,
        trace_options={"batch_size": 1, "queue_size": MESSAGES},
    ) as p:
        for start in range(0, MESSAGES, 8):
            batch = [Message(topic, b"x", keys=f"k{unique}-{i}") for i in range(start, start + 8)]
            for msg, result in zip(batch, await p.send_batch(batch), strict=True):
                keys[result.msg_id] = str(msg.keys[0])
        assert await p.trace_dispatcher.flush(30)
    end = int(time.time() * 1000) + 1000

    # The victim's share: every Pub it stored, and all of them written to the bucket.
    victim_db = Path(victim.env["TRACEMQ_COLLECTOR_DATA_DIR"]) / "traces.db"
    stores = [Path(c.env["TRACEMQ_COLLECTOR_DATA_DIR"]) / "traces.db" for c in trio]

    def all_stored() -> bool:
        return set().union(*(_pubs(db, topic) for db in stores)) == set(keys)

    await eventually(all_stored, timeout=60, interval=0.5, what="every Pub in some store")
    env = s.lake_env
    filesystem, root = lake_filesystem(
        env["TRACEMQ_COLLECTOR_LAKE_URI"],
        s3_endpoint=env["TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT"],
        s3_region=env["TRACEMQ_COLLECTOR_LAKE_S3_REGION"],
        s3_access_key=env["TRACEMQ_COLLECTOR_LAKE_S3_ACCESS_KEY"],
        s3_secret_key=env["TRACEMQ_COLLECTOR_LAKE_S3_SECRET_KEY"],
    )
    with TraceStore(tmp_path / "reader.db") as unused:
        bucket = TraceLake(root, unused, filesystem=filesystem)

        def in_bucket() -> bool:
            table = bucket.read_all()
            pubs = table.filter(
                pc.and_(pc.equal(table["trace_type"], "Pub"), pc.equal(table["topic"], topic))
            )
            return set(pubs["msg_id"].to_pylist()) == set(keys)

        await eventually(in_bucket, timeout=60, interval=0.5, what="every Pub in the bucket")

    lost = _pubs(victim_db, topic)
    assert lost, "the victim ingested none of the messages: nothing to lose"
    victim.kill()
    shutil.rmtree(victim.env["TRACEMQ_COLLECTOR_DATA_DIR"])

    # Through either survivor: by msgId, key, topic and time, every lost message.
    survivors_have = _pubs(stores[0], topic) | _pubs(stores[1], topic)
    sources: dict[str, str] = {}
    slots = asyncio.Semaphore(8)  # a few look-ups at once: a client's concurrency, bounded

    async def look_up(i: int, msg_id: str) -> None:
        base = _api(trio[i % 2])
        async with slots:
            status, body = await ahttp(f"{base}/api/v1/traces/{msg_id}")
            assert status == 200, (msg_id, status, body)
            sources[msg_id] = body["source"]
            assert body["topic"] == topic and "Pub" in {e["trace_type"] for e in body["events"]}
            status, found = await ahttp(
                f"{base}/api/v1/traces?key={urllib.parse.quote(keys[msg_id])}"
            )
            assert status == 200 and [item["msg_id"] for item in found["items"]] == [msg_id]

    await asyncio.gather(*(look_up(i, m) for i, m in enumerate(sorted(lost))))
    # answers from the lake, unless a survivor re-ingested the message after the take-over
    assert {m for m, src in sources.items() if src == "store"} <= survivors_have
    from_lake = {m for m, src in sources.items() if src == "lake"}
    assert from_lake, sources
    for proc in (first, second):
        listing = get_json(
            f"{_api(proc)}/api/v1/messages?topic={topic}&begin={begin}&end={end}&limit=1000"
        )
        assert {item["msg_id"] for item in listing["items"]} == set(keys)
        assert {i["msg_id"] for i in listing["items"] if i.get("source") == "lake"} >= (
            lost - survivors_have
        )
    metrics = f"{_api(first)}/metrics"
    assert value(metrics, "tracemq_collector_lookups_total", kind="msg_id", source="lake") >= 1

    # A new collector takes partitions over: it backfills them from the lake into its store.
    fourth = s.start_collector("collector-4", **FAST_LAKE)

    def backfilled() -> dict[str, Any] | None:
        health = _health(fourth)
        fill = health["backfill"]
        owned = set(health["assigned"])
        if owned and set(fill["done"]) >= owned and not fill["pending"]:
            return health
        return None

    health = await eventually(backfilled, timeout=90, interval=0.5, what="collector-4 backfilled")
    assert health["backfill"]["events_backfilled"] > 0, health
    owned = {(t, int(p)) for t, _, p in (a.rpartition("/") for a in health["assigned"])}
    with TraceStore(tmp_path / "reader2.db") as unused:
        bucket = TraceLake(root, unused, filesystem=filesystem)
        table = bucket.read_all()
    in_lake = {
        (r["trace_topic"], r["trace_partition"], r["trace_offset"], r["trace_index"])
        for r in table.select(
            ["trace_topic", "trace_partition", "trace_offset", "trace_index"]
        ).to_pylist()
        if (r["trace_topic"], r["trace_partition"]) in owned
    }
    fourth_db = Path(fourth.env["TRACEMQ_COLLECTOR_DATA_DIR"]) / "traces.db"
    # its store holds every event of its partitions the lake holds (all within retention)
    assert _events_of(fourth_db, owned) >= in_lake
    assert value(f"{_api(fourth)}/metrics", "tracemq_collector_backfill_events_total") > 0
