"""Fault trial: the collector is killed (SIGKILL) three times while it works through a backlog
of trace messages, and restarted each time. Afterwards every trace event of the trace topic is
in the store exactly once and in the lake (as the Spark job reads it) exactly once: 0 lost,
0 duplicated, checked event by event against what the trace topic holds."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest
from tracemq import Message, Producer
from tracemq.admin import AdminClient
from tracemq_collector.store import stored_events
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_trace_topic
from tracemq_devkit.waiting import eventually, eventually_sync

from tests.support.lake import read_lake_as_spark

MESSAGES = 3000
KILLS = 3

Coords = tuple[int, int, int]  # trace partition, offset, index


def _store_events(db: Path) -> list[tuple[Coords, str, str]]:
    return [
        ((e["trace_partition"], e["trace_offset"], e["trace_index"]), e["trace_type"], e["msg_id"])
        for e in stored_events(db)
    ]


def _store_count(db: Path) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'event_count'").fetchone()
        return 0 if row is None else int(row[0])
    except sqlite3.OperationalError:  # the collector has not created its tables yet
        return 0
    finally:
        con.close()


def _lake_events(root: Path) -> list[tuple[Coords, str, str]]:
    cols = ["trace_partition", "trace_offset", "trace_index", "trace_type", "msg_id"]
    rows = read_lake_as_spark(root, cols).to_pylist()
    return [
        ((r["trace_partition"], r["trace_offset"], r["trace_index"]), r["trace_type"], r["msg_id"])
        for r in rows
    ]


@pytest.mark.timeout(150)
async def test_kill_9_three_times_mid_backlog_loses_and_duplicates_nothing(
    fault_stack: EmbeddedStack, tmp_path: Path, unique: str
) -> None:
    s = fault_stack
    s.processes["collector"].stop()  # the backlog builds up while no collector reads
    topic = f"Crash_{unique}"
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    # Small trace messages (5 contexts each): many records for ingest to be killed in.
    async with Producer(
        f"PG_{unique}",
        enable_msg_trace=True,
        redis_url=s.redis_url,
        control_bootstrap=s.business_bootstrap,
        trace_options={"batch_size": 5, "queue_size": MESSAGES},
    ) as p:
        sent: list[str] = []
        for start in range(0, MESSAGES, 100):
            batch = [Message(topic, b"x", keys=[f"k{n}"]) for n in range(start, start + 100)]
            sent += [r.msg_id for r in await p.send_batch(batch)]
        assert await p.trace_dispatcher.flush(30)
        assert p.trace_dispatcher.stats()["sent"] == MESSAGES

    # The ground truth: every record of every trace message in the trace topic.
    expected: dict[Coords, tuple[str, str]] = {}
    for m in await read_trace_topic(s.trace_bootstrap, timeout_s=10):
        assert not m.errors
        for index, ctx in enumerate(m.contexts):
            msg_id = ctx.trace_beans[0].msg_id
            assert msg_id is not None
            expected[(m.partition, m.offset, index)] = (ctx.trace_type.value, msg_id)
    assert sorted(m for t, m in expected.values() if t == "Pub") == sorted(sent)

    data = tmp_path / "collector"
    db = data / "traces.db"
    s.start_collector(
        "collector",
        TRACEMQ_COLLECTOR_GROUP=f"crash-{unique}",
        TRACEMQ_COLLECTOR_DATA_DIR=str(data),
        # Small fetches and frequent lake writes: kills land between store and lake writes.
        TRACEMQ_COLLECTOR_BATCH_MAX_RECORDS="20",
        TRACEMQ_COLLECTOR_LAKE_FLUSH_INTERVAL_MS="200",
        TRACEMQ_COLLECTOR_SESSION_TIMEOUT_MS="3000",
    )
    at_kill = [0]
    t0 = time.monotonic()
    for k in range(1, KILLS + 1):
        # A tenth of the backlog more than at the previous kill: mid-backlog, every time.
        target = at_kill[-1] + len(expected) // 10
        eventually_sync(
            lambda t=target: _store_count(db) >= t,  # type: ignore[misc]
            timeout=40,
            interval=0.005,
            what=f"ingest past {target} events before kill {k}",
        )
        s.processes["collector"].kill()
        at_kill.append(_store_count(db))
        s.restart("collector")
    at_kill = at_kill[1:]
    print(f"\nevents stored at each kill: {at_kill} of {len(expected)}")
    print(f"three kills done in {time.monotonic() - t0:.1f} s")
    # Each kill was mid-backlog, not after it.
    assert at_kill[-1] < len(expected), at_kill

    async def everything_in() -> bool:
        return _store_count(db) >= len(expected) and len(_lake_events(data / "lake")) >= len(
            expected
        )

    await eventually(everything_in, timeout=60, interval=0.5, what="the backlog ingested")
    print(f"backlog ingested {time.monotonic() - t0:.1f} s after the first start")
    s.processes["collector"].stop()

    for name, events in (("store", _store_events(db)), ("lake", _lake_events(data / "lake"))):
        counts = Counter(coords for coords, _, _ in events)
        duplicated = {c: n for c, n in counts.items() if n > 1}
        lost = set(expected) - set(counts)
        extra = set(counts) - set(expected)
        assert (len(lost), len(duplicated), len(extra)) == (0, 0, 0), (
            name,
            sorted(lost)[:5],
            sorted(duplicated.items())[:5],
            sorted(extra)[:5],
        )
        assert {c: (t, m) for c, t, m in events} == expected, name
