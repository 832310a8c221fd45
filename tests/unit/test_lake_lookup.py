"""Lake look-ups (the fallback when the live stores miss): the window a msgId's creation time
gives, row-group pruning by msgId statistics, and answers equal to the store's; backfill of a
taken-over partition; on real Parquet files written by the collector's lake writer."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tracemq import lake as lake_contract
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType, encode_many
from tracemq_collector.backfill import Backfill, record_of
from tracemq_collector.events import rows_from_record
from tracemq_collector.lake import ROW_GROUP_ROWS, TraceLake
from tracemq_collector.lake_lookup import (
    SKEW_MS,
    LakeLookup,
    msg_id_hours,
    row_groups_for,
    search_hours,
)
from tracemq_collector.store import TraceStore

TOPIC = "RMQ_SYS_TRACE_TOPIC"
HOUR = 3_600_000
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z, a month start
NOW = T0 + 5 * 86_400_000


def msg_id(created_ms: int, n: int) -> str:
    """A msgId (IPv4 form) created at ``created_ms`` (UTC month offset), counter ``n``."""
    return f"0A000001006400{n >> 16:06X}{created_ms - T0:08X}{n & 0xFFFF:04X}"


def test_msg_id_hours_span_the_window_after_creation_and_stop_at_now() -> None:
    created = T0 + 10 * HOUR + 30 * 60_000  # 10:30
    assert msg_id_hours(created, NOW, 3) == [("2024-01-01", h) for h in (10, 11, 12, 13)]
    # five minutes of skew before creation reach back into the previous hour
    early = T0 + 10 * HOUR + 60_000
    assert msg_id_hours(early, NOW, 1)[0] == ("2024-01-01", 9)
    assert SKEW_MS == 300_000
    # across midnight, oldest first
    late = T0 + 23 * HOUR + 30 * 60_000
    assert msg_id_hours(late, NOW, 2) == [
        ("2024-01-01", 23),
        ("2024-01-02", 0),
        ("2024-01-02", 1),
    ]
    # never hours that have not begun yet (now + skew)
    assert msg_id_hours(created, created + 10 * 60_000, 48) == [("2024-01-01", 10)]


def test_search_hours_are_newest_first_and_capped() -> None:
    begin, end = T0 + HOUR, T0 + 4 * HOUR
    assert search_hours(begin, end, NOW, 24) == [("2024-01-01", h) for h in (3, 2, 1)]
    assert search_hours(begin, end, NOW, 2) == [("2024-01-01", h) for h in (3, 2)]
    assert search_hours(None, T0 + 2 * HOUR, NOW, 2) == [("2024-01-01", h) for h in (1, 0)]
    assert search_hours(end, begin, NOW, 24) == []


def test_row_groups_for_uses_min_max_and_keeps_groups_without_statistics() -> None:
    stats: list[tuple[str | None, str | None]] = [("A", "C"), ("D", "F"), (None, None)]
    assert row_groups_for(stats, "B") == [0, 2]
    assert row_groups_for(stats, "D") == [1, 2]
    assert row_groups_for(stats, "Z") == [2]
    assert row_groups_for(stats[:2], "CZ") == []


def contexts(mid: str, ts: int, n: int) -> list[TraceContext]:
    bean = TraceBean(
        topic="orders" if n % 2 else "payments",
        msg_id=mid,
        tags="t",
        keys=f"order-{n} shared",
        store_host="10.0.0.9:10911",
        msg_type=MessageType.Normal_Msg,
    )
    return [
        TraceContext(TraceType.Pub, timestamp=ts, trace_beans=[bean], group_name="pg"),
        TraceContext(
            TraceType.SubBefore, timestamp=ts + 2 * HOUR, request_id=f"r{n}", trace_beans=[bean]
        ),
    ]


class Lake:
    """A store and the collector's lake writer; messages written as ingest writes them."""

    def __init__(self, tmp: Path) -> None:
        self.store = TraceStore(tmp / "traces.db")
        self.store.open()
        self.lake = TraceLake(tmp / "lake", self.store, segment_max_rows=24_000)
        self.offset = 0
        self.ids: list[str] = []

    def write(self, count: int, start_ms: int, step_ms: int) -> None:
        rows: list[dict[str, Any]] = []
        for i in range(count):
            n = self.offset
            ts = start_ms + i * step_ms
            mid = msg_id(ts, n)
            self.ids.append(mid)
            value = encode_many(contexts(mid, ts, n)).data.encode()
            r, _ = rows_from_record(TOPIC, 0, self.offset, value, NOW)
            rows += r
            self.offset += 1
        self.store.write_batch(rows, [], {(TOPIC, 0): self.offset})
        self.lake.flush(TOPIC, 0)


@pytest.fixture(autouse=True)
def _utc_msg_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEMQ_MSGID_TIMEZONE", "UTC")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    """Shared by the read-only tests (writing it takes seconds)."""
    lk = Lake(tmp_path_factory.mktemp("lake"))
    # 24 000 messages over about three hours (48 000 events: consume events 2 h later), in
    # files of up to two row groups
    lk.write(12_000, T0 + HOUR, 450)
    lk.write(12_000, T0 + HOUR + 12_000 * 450, 450)
    yield lk
    lk.store.close()


def lookup(lk: Lake, window_hours: int = 24) -> LakeLookup:
    return LakeLookup(None, lk.lake.root, window_hours=window_hours, max_search_hours=24)


def test_msg_id_look_up_equals_the_store_and_reads_few_row_groups(written: Lake) -> None:
    reader = lookup(written)
    for mid in (written.ids[0], written.ids[12_345], written.ids[-1]):
        events, stats = reader.by_msg_id(mid, now_ms=NOW)
        expected = written.store.by_msg_id(mid)
        assert events == expected
        assert [e["trace_type"] for e in events] == ["Pub", "SubBefore"]
        # every file of the window is listed, but only the row groups whose msgId range holds
        # the id are read: far fewer than all of them
        all_groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in written.lake.files())
        assert stats.files_listed >= 2
        assert stats.row_groups <= 4 < all_groups
    # files are written sorted by msgId in row groups of ROW_GROUP_ROWS
    path = written.lake.files()[0]
    ids = pq.read_table(path, columns=["msg_id"])["msg_id"].to_pylist()
    assert ids == sorted(ids)
    assert pq.ParquetFile(path).metadata.row_group(0).num_rows <= ROW_GROUP_ROWS


def test_a_miss_reads_no_row_group_and_the_window_bounds_the_consume_events(
    written: Lake,
) -> None:
    reader = lookup(written)
    absent = msg_id(T0 + HOUR + 5, 0xFFFFFF)  # inside the window, inside no file's range
    events, stats = reader.by_msg_id(absent, now_ms=NOW)
    assert events == []
    assert stats.row_groups <= 2
    # a window of one hour does not reach the consume events written two hours later
    short = lookup(written, window_hours=1)
    events, _ = short.by_msg_id(written.ids[0], now_ms=NOW)
    assert [e["trace_type"] for e in events] == ["Pub"]
    # not a msgId (no creation time): nothing, no error
    assert reader.by_msg_id("not-an-id", now_ms=NOW)[0] == []


def test_compacted_and_overlapping_files_give_each_event_once(tmp_path: Path) -> None:
    written = Lake(tmp_path)
    written.write(300, T0 + HOUR, 1000)
    written.write(300, T0 + HOUR + 300_000, 1000)
    mid = written.ids[7]
    expected = written.store.by_msg_id(mid)
    assert written.lake.compact(NOW) >= 1
    reader = lookup(written)
    assert reader.by_msg_id(mid, now_ms=NOW)[0] == expected
    # an old owner's late copy of a part file overlapping the compacted one: read once
    [compacted] = [p for p in written.lake.files() if p.name.startswith("compacted-")][:1]
    copy = compacted.parent / lake_contract.part_name(TOPIC, 0, 0, 1)
    copy.write_bytes(compacted.read_bytes())
    assert reader.by_msg_id(mid, now_ms=NOW)[0] == expected
    written.store.close()


def test_key_and_topic_searches_list_like_the_store(written: Lake) -> None:
    reader = lookup(written)
    n = 20_001 % 24_000
    key = f"order-{n}"
    items, _ = reader.by_key(key, now_ms=NOW, begin=T0, end=T0 + 10 * HOUR)
    expected, _ = written.store.by_key(key, begin=T0, end=T0 + 10 * HOUR)
    assert items == expected and len(items) == 1
    assert reader.by_key("rder-20001", begin=T0, end=T0 + 10 * HOUR, now_ms=NOW)[0] == []
    begin, end = T0 + HOUR, T0 + 3 * HOUR
    items, stats = reader.messages("orders", begin=begin, end=end, limit=100, now_ms=NOW)
    expected, _ = written.store.messages("orders", begin=begin, end=end, limit=100)
    assert items == expected
    # the newest hour filled the page: older hours were not read
    assert stats.hours == 1
    # the shared key: newest first, limit honoured
    items, _ = reader.by_key("shared", topic="payments", begin=T0, end=end, limit=5, now_ms=NOW)
    assert [i["msg_id"] for i in items] == [
        i["msg_id"] for i in written.store.by_key("shared", topic="payments", end=end, limit=5)[0]
    ]


# ---------------------------------------------------------------------------- backfill


def test_every_lake_row_encodes_back_to_a_record_that_decodes_to_it(written: Lake) -> None:
    table = pq.read_table(written.lake.files()[0])
    rows = table.slice(0, 2000).to_pylist()
    assert rows and all(record_of(row) is not None for row in rows)
    # a row no record can carry (a field with the record separator) is refused, not mangled
    bad = {**rows[0], "tags": "a\x02b"}
    assert record_of(bad) is None


def test_backfill_after_a_take_over_is_bounded_idempotent_and_never_rewrites_the_lake(
    tmp_path: Path,
) -> None:
    old = Lake(tmp_path / "old")
    old.write(400, T0 + HOUR, 1000)  # offsets 0..399, Pubs from 01:00, consumes from 03:00
    old.write(400, T0 + 4 * HOUR, 1000)  # offsets 400..799
    taken = Lake(tmp_path / "new")
    taken.lake = TraceLake(old.lake.root, taken.store, segment_max_rows=24_000)
    taken.offset = 800  # the new owner resumes at the committed offset
    taken.write(10, T0 + 6 * HOUR, 1000)
    # retention of the store: 2 h before NOW' = T0 + 6 h, so only events from 04:00 on
    now = T0 + 6 * HOUR
    backfill = Backfill(taken.store, taken.lake, retention_ms=2 * HOUR)
    backfill.assign({(TOPIC, 0)})
    assert backfill.snapshot()["pending"] == [f"{TOPIC}/0"]
    assert backfill.run_next(now_ms=now)
    snap = backfill.snapshot()
    assert snap["done"] == [f"{TOPIC}/0"] and snap["pending"] == []
    recent = old.ids[500]  # Pub at ~04:01: within retention
    assert taken.store.by_msg_id(recent) == old.store.by_msg_id(recent)
    assert taken.store.by_msg_id(old.ids[10]) == []  # older than retention: not copied
    copied = snap["events_backfilled"]
    assert copied == sum(
        1 for e in old.store.events_in_range(TOPIC, 0, 0, 800) if e["timestamp"] >= now - 2 * HOUR
    )
    # a second take-over copies nothing again (the store's dedupe)
    backfill.assign(set())
    backfill.assign({(TOPIC, 0)})
    assert backfill.run_next(now_ms=now)
    assert backfill.snapshot()["events_backfilled"] == copied
    # the new owner's lake writes start at its own progress: no event is in the lake twice
    taken.write(5, T0 + 6 * HOUR + 20_000, 1000)
    coords = Counter(
        zip(
            *(written_rows := taken.lake.read_all())
            .select(["trace_offset", "trace_index"])
            .to_pydict()
            .values(),
            strict=True,
        )
    )
    assert written_rows.num_rows == 2 * 815 and max(coords.values()) == 1
    old.store.close()
    taken.store.close()


def test_an_idle_partition_taken_over_starts_its_lake_where_the_old_owner_stopped(
    tmp_path: Path,
) -> None:
    old = Lake(tmp_path / "old")
    old.write(300, T0 + HOUR, 1000)  # offsets 0..299
    taken = Lake(tmp_path / "new")
    taken.lake = TraceLake(old.lake.root, taken.store, segment_max_rows=24_000)
    now = T0 + 6 * HOUR
    backfill = Backfill(taken.store, taken.lake, retention_ms=24 * HOUR)
    backfill.assign({(TOPIC, 0), (TOPIC, 1)})  # partition 1: nothing in the lake
    assert backfill.run_next(now_ms=now) and backfill.run_next(now_ms=now)
    snap = backfill.snapshot()
    assert snap["done"] == [f"{TOPIC}/0", f"{TOPIC}/1"]
    assert snap["events_backfilled"] == 600
    assert taken.store.lake_progress() == {(TOPIC, 0): 300}
    assert taken.store.by_msg_id(old.ids[0]) == old.store.by_msg_id(old.ids[0])
    # ingest then resumes below the old owner's end (its commit lagged): nothing twice in the
    # lake, and the events past the old owner's end are written
    taken.offset = 290
    taken.write(20, T0 + 5 * HOUR, 1000)
    table = taken.lake.read_all()
    offsets = Counter(
        zip(table["trace_offset"].to_pylist(), table["trace_index"].to_pylist(), strict=True)
    )
    assert max(offsets.values()) == 1 and len(offsets) == 2 * 310
    old.store.close()
    taken.store.close()


# ---------------------------------------------------------------------------- the API


def recent_id(created_ms: int, n: int) -> str:
    month = datetime.fromtimestamp(created_ms / 1000, UTC).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0
    )
    offset = created_ms - int(month.timestamp() * 1000)
    return f"0A000001006400{n >> 16:06X}{offset:08X}{n & 0xFFFF:04X}"


async def test_the_api_answers_from_the_lake_what_the_store_lacks(tmp_path: Path) -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client import REGISTRY
    from tracemq_collector.api import add_routes
    from tracemq_collector.queries import Queries

    now = int(time.time() * 1000)
    lk = Lake(tmp_path / "lake-writer")
    rows: list[dict[str, Any]] = []
    for n in range(3):  # three messages a minute apart, ten minutes ago
        ts = now - 600_000 + n * 60_000
        mid = recent_id(ts, n)
        lk.ids.append(mid)
        value = encode_many(contexts(mid, ts, n)[:1]).data.encode()
        rows += rows_from_record(TOPIC, 0, n, value, now)[0]
    lk.store.write_batch(rows, [], {(TOPIC, 0): 3})
    lk.lake.flush(TOPIC, 0)
    # this collector's own store holds only the last message (its disk had the rest)
    with TraceStore(tmp_path / "own.db") as own:
        own.write_batch(rows[2:], [], {(TOPIC, 0): 3})

        def lookups(source: str) -> float:
            value = REGISTRY.get_sample_value(
                "tracemq_collector_lookups_total", {"kind": "msg_id", "source": source}
            )
            return value or 0.0

        for with_lake in (False, True):
            reader = LakeLookup(None, lk.lake.root, window_hours=24, max_search_hours=24)
            q = Queries(
                own,
                redis=None,
                prefix="t:",
                self_url="http://self:1",
                token=None,
                fanout_timeout_s=0.5,
                lake=reader if with_lake else None,
            )
            app = web.Application()
            add_routes(app, q, None)
            client = TestClient(TestServer(app))
            await client.start_server()
            try:
                before = lookups("lake")
                resp = await client.get(f"/api/v1/traces/{lk.ids[0]}")
                if not with_lake:
                    assert resp.status == 404  # the old answer: gone with the disk
                    continue
                view = await resp.json()
                assert (resp.status, view["source"]) == (200, "lake"), view
                assert [e["msg_id"] for e in view["events"]] == [lk.ids[0]]
                assert lookups("lake") == before + 1
                resp = await client.get(f"/api/v1/traces/{lk.ids[2]}")
                assert (await resp.json())["source"] == "store"
                listing = await (await client.get("/api/v1/messages?topic=payments")).json()
                found = {i["msg_id"]: i.get("source") for i in listing["items"]}
                # the store's message as it was, the others completed from the lake
                assert found == {lk.ids[0]: "lake", lk.ids[2]: None}
                by_key = await (await client.get("/api/v1/traces?key=order-1")).json()
                assert [(i["msg_id"], i["source"]) for i in by_key["items"]] == [
                    (lk.ids[1], "lake")
                ]
            finally:
                await client.close()
                await q.close()
    lk.store.close()
