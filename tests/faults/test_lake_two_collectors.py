"""Two real collectors of one collector group write one trace lake in a bucket of the stack's
SeaweedFS S3 store (``StackConfig.object_store``, what ``tracemq dev up --object-store`` runs):
each writes the trace partitions it is assigned, and the bucket holds every trace event of the
trace topic exactly once (read by the lake's rule, as the Spark job reads it)."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracemq import Message, Producer
from tracemq.admin import AdminClient
from tracemq_collector.lake import TraceLake, lake_filesystem
from tracemq_collector.store import TraceStore
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.reading import read_trace_topic
from tracemq_devkit.waiting import eventually

from tests.conftest import _SESSION_STACKS, SESSION_SECRETS, TEST_SERVICE_ENV

MESSAGES = 400
FAST_LAKE = {"TRACEMQ_COLLECTOR_LAKE_FLUSH_INTERVAL_MS": "200"}


@pytest.fixture
def lake_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("lake-s3"),
            service_env=dict(TEST_SERVICE_ENV),
            # four trace partitions, for two collectors to share
            process_env={
                "trace-broker": {"TRACEMQ_BROKER_TRACE_TOPIC_QUEUES": "4"},
                "collector": FAST_LAKE,
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


def _health(s: EmbeddedStack, name: str) -> dict[str, Any]:
    with urllib.request.urlopen(s.processes[name].health_url, timeout=2) as r:  # noqa: S310
        return dict(json.loads(r.read()))


@pytest.mark.timeout(180)
async def test_two_collectors_write_every_event_once_into_one_bucket(
    lake_stack: EmbeddedStack, tmp_path: Path, unique: str
) -> None:
    s = lake_stack
    assert s.endpoints()["lake"] == "s3://tracemq-lake/lake"  # what `dev status` shows
    s.start_collector("collector-2", **FAST_LAKE)

    def split() -> bool:
        a, b = (set(_health(s, n)["assigned"]) for n in ("collector", "collector-2"))
        return bool(a) and bool(b) and not (a & b) and len(a | b) == 4

    await eventually(split, timeout=60, interval=0.5, what="the trace partitions split in two")

    topic = f"Lake_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    async with Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        redis_url=s.redis_url,
        control_bootstrap=s.business_bootstrap,
        trace_options={"batch_size": 5, "queue_size": MESSAGES},
    ) as p:
        for start in range(0, MESSAGES, 100):
            await p.send_batch([Message(topic, b"x") for _ in range(start, start + 100)])
        assert await p.trace_dispatcher.flush(30)
    expected = {
        (m.partition, m.offset, index)
        for m in await read_trace_topic(s.trace_bootstrap, timeout_s=10)
        for index in range(len(m.contexts))
    }
    assert {partition for partition, _, _ in expected} == {0, 1, 2, 3}

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

        def in_bucket() -> Counter[tuple[int, int, int]]:
            rows = bucket.read_all().select(["trace_partition", "trace_offset", "trace_index"])
            return Counter(map(tuple, (r.values() for r in rows.to_pylist())))  # type: ignore[arg-type]

        async def all_in() -> bool:
            return set(in_bucket()) >= expected

        await eventually(all_in, timeout=60, interval=0.5, what="every event in the bucket")
        counts = in_bucket()
        files = bucket.files()
    assert {c for c, n in counts.items() if n > 1} == set()  # once each
    assert set(counts) == expected
    # both collectors wrote: files of all four partitions, each partition's by its owner
    written = {int(f.name.split("-")[-3]) for f in files}
    assert written == {0, 1, 2, 3}
