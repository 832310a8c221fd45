"""Trace store: a real SQLite file in tmp_path; dedupe, progress, look-ups, paging, retention."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tracemq import lake
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType, encode_many
from tracemq_collector.events import rows_from_record
from tracemq_collector.store import StoreSchemaError, TraceStore, TraceStoreError

TOPIC = "RMQ_SYS_TRACE_TOPIC"
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
INGEST = T0 + 10 * 86_400_000


def msg_id(n: int) -> str:
    return f"0A00000100640000000A{n:012X}"


def pub_ctx(n: int, ts: int, *, topic: str = "orders", keys: str | None = None) -> TraceContext:
    bean = TraceBean(
        topic=topic,
        msg_id=msg_id(n),
        tags=f"tag{n % 3}",
        keys=f"order-{n} shared" if keys is None else keys,
        store_host="10.0.0.9:10911",
        msg_type=MessageType.Normal_Msg,
        body_length=n,
    )
    return TraceContext(
        TraceType.Pub, timestamp=ts, group_name="pg", cost_time=3, trace_beans=[bean]
    )


def consume_ctxs(n: int, ts: int) -> list[TraceContext]:
    bean = TraceBean(topic="orders", msg_id=msg_id(n), keys=f"order-{n} shared")
    return [
        TraceContext(TraceType.SubBefore, timestamp=ts, request_id=f"r{n}", trace_beans=[bean]),
        TraceContext(
            TraceType.SubAfter,
            timestamp=ts + 4,
            request_id=f"r{n}",
            cost_time=4,
            trace_beans=[bean],
        ),
    ]


class Feed:
    """Turns trace contexts into trace messages at increasing offsets, as ingest would."""

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.offset = 0

    def batch(
        self, *messages: list[TraceContext]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[tuple[str, int], int]]:
        rows: list[dict[str, Any]] = []
        quarantine: list[dict[str, Any]] = []
        for contexts in messages:
            value = encode_many(contexts).data.encode()
            r, q = rows_from_record(TOPIC, self.partition, self.offset, value, INGEST)
            rows += r
            quarantine += q
            self.offset += 1
        return rows, quarantine, {(TOPIC, self.partition): self.offset}

    def raw(
        self, value: bytes | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[tuple[str, int], int]]:
        rows, quarantine = rows_from_record(TOPIC, self.partition, self.offset, value, INGEST)
        self.offset += 1
        return rows, quarantine, {(TOPIC, self.partition): self.offset}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    with TraceStore(tmp_path / "store" / "traces.db") as s:
        yield s


def key_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM key_index").fetchone()[0])


def lake_only(row: dict[str, Any]) -> dict[str, Any]:
    """What a look-up returns of an event: the lake columns and the client id."""
    return {**{k: row[k] for k in lake.COLUMN_NAMES}, "client_id": row.get("client_id")}


# ---------------------------------------------------------------------------- writing


def test_by_msg_id_returns_every_event_with_all_lake_columns_in_time_order(
    store: TraceStore,
) -> None:
    feed = Feed()
    rows, quarantine, progress = feed.batch(
        consume_ctxs(1, T0 + 50), [pub_ctx(1, T0)], [pub_ctx(2, T0 + 1)]
    )
    assert store.write_batch(rows, quarantine, progress) == 4
    events = store.by_msg_id(msg_id(1))
    assert [e["trace_type"] for e in events] == ["Pub", "SubBefore", "SubAfter"]
    expected = sorted(
        (lake_only(r) for r in rows if r["msg_id"] == msg_id(1)), key=lambda r: r["timestamp"]
    )
    assert events == expected
    assert store.by_msg_id("F" * 32) == []
    assert store.event_count() == 4


def test_replaying_a_batch_stores_and_indexes_nothing_new(store: TraceStore) -> None:
    feed = Feed()
    batch = feed.batch([pub_ctx(1, T0), *consume_ctxs(1, T0 + 5)], [pub_ctx(2, T0 + 1)])
    assert store.write_batch(*batch) == 4
    keys_before = key_rows(store.path)
    assert keys_before == 4  # order-1, order-2, shared twice

    assert store.write_batch(*batch) == 0
    assert store.event_count() == 4
    assert key_rows(store.path) == keys_before
    assert store.progress() == {(TOPIC, 0): 2}
    items, _ = store.by_key("shared")
    assert sorted(i["msg_id"] for i in items) == [msg_id(1), msg_id(2)]


def test_a_batch_that_repeats_a_row_inside_itself_stores_it_once(store: TraceStore) -> None:
    rows, quarantine, progress = Feed().batch([pub_ctx(1, T0)])
    assert store.write_batch(rows + rows, quarantine, progress) == 1
    assert key_rows(store.path) == 2


def test_a_partly_replayed_batch_stores_only_the_new_rows(store: TraceStore) -> None:
    feed = Feed()
    first = feed.batch([pub_ctx(1, T0)], [pub_ctx(2, T0)])
    second = feed.batch([pub_ctx(3, T0)])
    store.write_batch(*first)
    rows = first[0] + second[0]
    assert store.write_batch(rows, [], second[2]) == 1
    assert store.event_count() == 3
    assert [i["msg_id"] for i in store.by_key("order-3")[0]] == [msg_id(3)]


def test_a_retried_send_is_one_message_for_key_lookups(store: TraceStore) -> None:
    feed = Feed()
    store.write_batch(*feed.batch([pub_ctx(1, T0)]))
    store.write_batch(*feed.batch([pub_ctx(1, T0 + 700)]))
    assert len(store.by_msg_id(msg_id(1))) == 2
    items, cursor = store.by_key("order-1")
    assert [(i["msg_id"], i["timestamp"]) for i in items] == [(msg_id(1), T0)]
    assert cursor is None


def test_progress_never_moves_backwards(store: TraceStore) -> None:
    store.write_batch([], [], {(TOPIC, 0): 10, (TOPIC, 1): 3})
    store.write_batch([], [], {(TOPIC, 0): 5})
    assert store.progress() == {(TOPIC, 0): 10, (TOPIC, 1): 3}
    store.write_batch([], [], {(TOPIC, 0): 12})
    assert store.progress() == {(TOPIC, 0): 12, (TOPIC, 1): 3}


def test_quarantine_is_stored_once_with_reason_and_raw_bytes(store: TraceStore) -> None:
    feed = Feed()
    batch = feed.raw(b"Pub\x01broken\x02Teleport\x01x\x02")
    assert store.write_batch(*batch) == 0
    store.write_batch(*batch)
    assert store.quarantine_count() == 2
    newest, oldest = store.quarantine_rows()
    assert (oldest["trace_index"], oldest["raw"]) == (0, b"Pub\x01broken")
    assert oldest["reason"].startswith("malformed record")
    assert (newest["trace_index"], newest["reason"]) == (1, "unknown trace type 'Teleport'")
    assert (newest["trace_topic"], newest["trace_partition"], newest["trace_offset"]) == (
        TOPIC,
        0,
        0,
    )
    assert store.quarantine_rows(limit=1) == [newest]


def test_client_host_and_store_time_filled_in_by_ingest_are_kept(store: TraceStore) -> None:
    rows, quarantine, progress = Feed().batch([pub_ctx(1, T0), *consume_ctxs(1, T0 + 5)])
    for row in rows:
        row["client_host"] = "10.9.9.9"  # e.g. from the trace message's BORN_HOST header
    rows[0]["store_time"] = T0 + 2
    store.write_batch(rows, quarantine, progress)
    events = store.by_msg_id(msg_id(1))
    assert [(e["client_host"], e["store_time"]) for e in events] == [
        ("10.9.9.9", T0 + 2),
        ("10.9.9.9", 0),
        ("10.9.9.9", 0),
    ]
    assert events == [lake_only(r) for r in rows]
    assert [e["client_host"] for e in store.events_in_range(TOPIC, 0, 0, 1)] == ["10.9.9.9"] * 3


def test_a_row_without_its_record_text_fails_the_whole_batch(store: TraceStore) -> None:
    rows, quarantine, progress = Feed().batch([pub_ctx(1, T0)], [pub_ctx(2, T0)])
    del rows[1]["record"]
    with pytest.raises(ValueError, match="rows_from_record"):
        store.write_batch(rows, quarantine, progress)
    assert (store.event_count(), store.progress()) == (0, {})


# ---------------------------------------------------------------------------- look-ups


def test_by_key_filters_by_topic_and_time(store: TraceStore) -> None:
    feed = Feed()
    store.write_batch(
        *feed.batch(
            [pub_ctx(1, T0 + 100, keys="k1 common")],
            [pub_ctx(2, T0 + 200, keys="common", topic="payments")],
            [pub_ctx(3, T0 + 300, keys="common")],
            [pub_ctx(4, T0 + 400, keys="other")],
        )
    )

    def ids(**kwargs: Any) -> list[str]:
        items, _ = store.by_key("common", **kwargs)
        return [i["msg_id"] for i in items]

    assert ids() == [msg_id(3), msg_id(2), msg_id(1)]
    assert ids(topic="orders") == [msg_id(3), msg_id(1)]
    assert ids(topic="payments") == [msg_id(2)]
    assert ids(begin=T0 + 200) == [msg_id(3), msg_id(2)]
    assert ids(end=T0 + 300) == [msg_id(2), msg_id(1)]
    assert ids(topic="orders", begin=T0 + 101, end=T0 + 400) == [msg_id(3)]
    [item], _ = store.by_key("k1")
    assert item == {
        "msg_id": msg_id(1),
        "topic": "orders",
        "timestamp": T0 + 100,
        "keys": "k1 common",
        "tags": "tag1",
    }
    assert store.by_key("missing") == ([], None)


def test_by_key_pages_through_120_messages_without_gaps_or_duplicates(store: TraceStore) -> None:
    feed = Feed()
    # Pairs share a timestamp, so the cursor's tie-breaker is exercised too.
    store.write_batch(*feed.batch(*([pub_ctx(n, T0 + n // 2)] for n in range(120))))
    store.write_batch(*feed.batch([pub_ctx(500, T0, keys="unrelated")]))
    seen: list[dict[str, Any]] = []
    pages = []
    cursor: str | None = None
    while True:
        items, cursor = store.by_key("shared", limit=50, cursor=cursor)
        pages.append(len(items))
        seen += items
        if cursor is None:
            break
    assert pages == [50, 50, 20]
    assert len({i["msg_id"] for i in seen}) == 120
    assert {i["msg_id"] for i in seen} == {msg_id(n) for n in range(120)}
    timestamps = [i["timestamp"] for i in seen]
    assert timestamps == sorted(timestamps, reverse=True)


def test_an_exactly_full_last_page_has_no_cursor(store: TraceStore) -> None:
    store.write_batch(*Feed().batch(*([pub_ctx(n, T0 + n)] for n in range(4))))
    items, cursor = store.by_key("shared", limit=2)
    items2, cursor2 = store.by_key("shared", limit=2, cursor=cursor)
    assert (len(items), len(items2), cursor2) == (2, 2, None)
    assert cursor is not None


def test_bad_cursors_and_limits_are_refused(store: TraceStore) -> None:
    store.write_batch(*Feed().batch(*([pub_ctx(n, T0 + n)] for n in range(3))))
    _, message_cursor = store.messages("orders", begin=None, end=None, limit=1)
    _, key_cursor = store.by_key("shared", limit=1)
    assert message_cursor is not None and key_cursor is not None
    for bad in ("not base64!", "", "AAAA", key_cursor + "AAAA", message_cursor):
        with pytest.raises(ValueError, match="^invalid cursor$"):
            store.by_key("shared", cursor=bad)
    with pytest.raises(ValueError, match="^invalid cursor$"):
        store.messages("orders", begin=None, end=None, cursor=key_cursor)
    for limit in (0, 100_000):
        with pytest.raises(ValueError, match="limit"):
            store.by_key("shared", limit=limit)


def test_messages_pages_the_pub_traces_of_a_topic_in_a_time_range(store: TraceStore) -> None:
    feed = Feed()
    store.write_batch(
        *feed.batch(
            *([pub_ctx(n, T0 + n * 10), *consume_ctxs(n, T0 + n * 10 + 1)] for n in range(130))
        )
    )
    store.write_batch(*feed.batch([pub_ctx(900, T0 + 500, topic="payments")]))
    begin, end = T0 + 50, T0 + 1250  # messages 5..124: 120 of them
    seen: list[dict[str, Any]] = []
    pages = []
    cursor: str | None = None
    while True:
        items, cursor = store.messages("orders", begin=begin, end=end, limit=50, cursor=cursor)
        pages.append(len(items))
        seen += items
        if cursor is None:
            break
    assert pages == [50, 50, 20]
    assert [i["msg_id"] for i in seen] == [msg_id(n) for n in range(124, 4, -1)]
    first = seen[0]
    assert first == {
        "msg_id": msg_id(124),
        "topic": "orders",
        "timestamp": T0 + 1240,
        "tags": "tag1",
        "keys": "order-124 shared",
        "group_name": "pg",
        "success": True,
        "store_host": "10.0.0.9:10911",
        "offset_msg_id": None,
        "cost_time": 3,
        "msg_type": 0,
        "region_id": None,
    }
    items, _ = store.messages("payments", begin=None, end=None)
    assert [i["msg_id"] for i in items] == [msg_id(900)]


# --------------------------------------------------------------------------- retention


def test_retention_deletes_old_events_and_their_keys_in_batches(store: TraceStore) -> None:
    feed = Feed()
    old = [[pub_ctx(n, T0 + n), *consume_ctxs(n, T0 + n + 1)] for n in range(30)]
    young = [
        [pub_ctx(n, T0 + 10_000 + n), *consume_ctxs(n, T0 + 10_000 + n + 1)] for n in range(30, 40)
    ]
    store.write_batch(*feed.batch(*old, *young))
    store.write_batch(*feed.raw(b"Junk\x02"))
    assert store.event_count() == 120

    deleted = []
    while n := store.delete_older_than(T0 + 5_000, batch=25):
        deleted.append(n)
    assert deleted == [25, 25, 25, 15]
    assert store.event_count() == 30
    assert store.by_msg_id(msg_id(3)) == []
    assert store.by_key("order-3") == ([], None)
    assert [e["trace_type"] for e in store.by_msg_id(msg_id(35))] == [
        "Pub",
        "SubBefore",
        "SubAfter",
    ]
    items, _ = store.by_key("shared")
    assert {i["msg_id"] for i in items} == {msg_id(n) for n in range(30, 40)}
    assert key_rows(store.path) == 20
    # The quarantined record was read at INGEST, after this cutoff: kept.
    assert store.quarantine_count() == 1
    assert store.delete_older_than(INGEST + 1) == 30  # the quarantined record went with them
    assert (store.event_count(), store.quarantine_count(), key_rows(store.path)) == (0, 0, 0)
    # With no old event left, the call reports the quarantine rows it deleted, so a loop
    # "until 0" empties the quarantine too.
    store.write_batch(*feed.raw(b"Junk\x02"))
    assert store.delete_older_than(INGEST + 1) == 1
    assert store.delete_older_than(INGEST + 1) == 0
    assert store.quarantine_count() == 0


# ------------------------------------------------------------------- file and lifecycle


def test_reopening_the_file_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    feed = Feed()
    with TraceStore(path) as store:
        store.write_batch(*feed.batch([pub_ctx(1, T0)], [pub_ctx(2, T0 + 1)]))
        store.write_batch(*feed.raw(None))
        store.set_lake_progress(TOPIC, 0, 1)
        store.begin_lake_segment(TOPIC, 0, 1, 2)
        before = store.by_msg_id(msg_id(1))
    assert not store.is_open
    with TraceStore(path) as store:
        assert store.by_msg_id(msg_id(1)) == before
        assert store.progress() == {(TOPIC, 0): 3}
        assert store.lake_progress() == {(TOPIC, 0): 1}
        assert store.pending_lake_segments() == [(TOPIC, 0, 1, 2)]
        assert store.quarantine_count() == 1
        # Ids continue after the reopen: new key rows point at the new events.
        store.write_batch(*feed.batch([pub_ctx(3, T0 + 2)]))
        items, _ = store.by_key("shared")
        assert [(i["msg_id"], i["keys"]) for i in items] == [
            (msg_id(3), "order-3 shared"),
            (msg_id(2), "order-2 shared"),
            (msg_id(1), "order-1 shared"),
        ]


def test_blocks_of_earlier_versions_zlib_are_still_read(tmp_path: Path) -> None:
    import zlib

    import zstandard

    path = tmp_path / "traces.db"
    feed = Feed()
    with TraceStore(path) as store:
        store.write_batch(*feed.batch([pub_ctx(1, T0), *consume_ctxs(1, T0 + 5)]))
        store.write_batch(*feed.batch([pub_ctx(2, T0 + 1)]))
        before = [store.by_msg_id(msg_id(1)), store.by_msg_id(msg_id(2)), store.by_key("shared")]
    with sqlite3.connect(path) as conn:  # what an earlier version wrote: zlib blocks
        blocks = conn.execute("SELECT id, data FROM blocks").fetchall()
        assert blocks and all(data[:4] == b"\x28\xb5\x2f\xfd" for _, data in blocks)  # zstd
        unzstd = zstandard.ZstdDecompressor()
        conn.executemany(
            "UPDATE blocks SET data = ? WHERE id = ?",
            [(zlib.compress(unzstd.decompress(data), 1), block) for block, data in blocks],
        )
    with TraceStore(path) as store:
        after = [store.by_msg_id(msg_id(1)), store.by_msg_id(msg_id(2)), store.by_key("shared")]
        assert after == before
        store.write_batch(*feed.batch([pub_ctx(3, T0 + 2)]))  # new blocks beside old ones
        assert [e["msg_id"] for e in store.by_msg_id(msg_id(3))] == [msg_id(3)]


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    with TraceStore(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema_version'")
    store = TraceStore(path)
    with pytest.raises(StoreSchemaError, match="version 99.*upgrade the collector"):
        store.open()
    assert not store.is_open


def test_an_sqlite_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE something (x)")
    with pytest.raises(TraceStoreError, match="not a trace store"):
        TraceStore(path).open()


def test_the_file_is_in_wal_mode(store: TraceStore) -> None:
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_new_file_has_large_pages_and_an_older_file_keeps_its_own(tmp_path: Path) -> None:
    """New stores get 16 KiB pages (cheaper inserts into the hashed indexes); a file made with
    other pages (SQLite's default 4 KiB: every store before) keeps them, and the WAL is
    checkpointed after the same bytes either way."""
    from tracemq_collector import store as store_module

    def pragmas(s: TraceStore) -> tuple[int, int]:
        conn = s._writer  # noqa: SLF001 - the checkpoint threshold is the writer's setting
        assert conn is not None
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        return page, int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    wal_bytes = store_module._WAL_AUTOCHECKPOINT_BYTES  # noqa: SLF001
    feed = Feed()
    with TraceStore(tmp_path / "new.db") as new:
        assert pragmas(new) == (16_384, wal_bytes // 16_384)
        new.write_batch(*feed.batch([pub_ctx(1, T0)]))
    old_path = tmp_path / "old.db"
    with sqlite3.connect(old_path) as conn:
        conn.execute("PRAGMA page_size=4096")
        conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    with TraceStore(old_path) as old:
        assert pragmas(old) == (4096, wal_bytes // 4096)
        old.write_batch(*feed.batch([pub_ctx(2, T0 + 1)]))
    for path, n in ((tmp_path / "new.db", 1), (old_path, 2)):
        with TraceStore(path) as reopened:
            assert reopened.by_msg_id(msg_id(n)), path


def test_the_page_size_of_a_new_file_is_the_collector_s_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracemq.errors import ConfigError
    from tracemq.settings import load_settings
    from tracemq_collector.settings import CollectorSettings

    monkeypatch.setenv("TRACEMQ_COLLECTOR_STORE_PAGE_SIZE", "4096")
    page_size = load_settings(CollectorSettings).collector_store_page_size
    with TraceStore(tmp_path / "traces.db", page_size=page_size) as s:
        assert s._writer is not None  # noqa: SLF001
        assert s._writer.execute("PRAGMA page_size").fetchone()[0] == 4096  # noqa: SLF001
    monkeypatch.setenv("TRACEMQ_COLLECTOR_STORE_PAGE_SIZE", "5000")
    with pytest.raises(ConfigError, match="TRACEMQ_COLLECTOR_STORE_PAGE_SIZE"):
        load_settings(CollectorSettings)


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces.db")
    with pytest.raises(TraceStoreError, match="not open"):
        store.progress()
    store.open()
    store.close()
    with pytest.raises(TraceStoreError, match="not open"):
        store.write_batch([], [], {})
    with pytest.raises(TraceStoreError, match="not open"):
        store.by_msg_id(msg_id(1))


def test_other_threads_read_while_the_writer_writes(store: TraceStore) -> None:
    feed = Feed()
    store.write_batch(*feed.batch([pub_ctx(0, T0)]))
    stop = threading.Event()

    def reader() -> int:
        reads = 0
        while not stop.is_set() or reads == 0:
            assert store.by_msg_id(msg_id(0))[0]["trace_type"] == "Pub"
            reads += 1
        return reads

    with ThreadPoolExecutor(max_workers=2) as pool:
        readers = [pool.submit(reader) for _ in range(2)]
        for n in range(1, 40):
            store.write_batch(*feed.batch([pub_ctx(n, T0 + n)]))
        stop.set()
        assert all(r.result(timeout=30) > 0 for r in readers)
    assert store.event_count() == 40


# ---------------------------------------------------------------------- lake bookkeeping


def test_lake_segment_bookkeeping(store: TraceStore) -> None:
    assert store.lake_progress() == {}
    store.begin_lake_segment(TOPIC, 0, 0, 10)
    assert store.pending_lake_segments() == [(TOPIC, 0, 0, 10)]
    store.finish_lake_segment(TOPIC, 0, 10)
    assert store.pending_lake_segments() == []
    assert store.lake_progress() == {(TOPIC, 0): 10}
    store.set_lake_progress(TOPIC, 0, 4)  # never backwards
    assert store.lake_progress() == {(TOPIC, 0): 10}
    with pytest.raises(ValueError):
        store.begin_lake_segment(TOPIC, 0, 9, 3)


def test_events_in_range_are_in_offset_order_with_their_partition(store: TraceStore) -> None:
    feed = Feed()
    store.write_batch(
        *feed.batch(
            [pub_ctx(1, T0 + 3_600_000), *consume_ctxs(1, T0 + 3_600_001)],
            [pub_ctx(2, T0)],
            [pub_ctx(3, T0 + 5)],
        )
    )
    rows = store.events_in_range(TOPIC, 0, 0, 2)
    assert [(r["trace_offset"], r["trace_index"]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert set(rows[0]) == {*lake.COLUMN_NAMES, "date", "hour"}
    assert [(r["date"], r["hour"]) for r in rows] == [("2024-01-01", 1)] * 3 + [("2024-01-01", 0)]
    assert store.first_event_offset(TOPIC, 0) == 0
    assert store.first_event_offset(TOPIC, 9) is None
    assert store.nth_event_offset(TOPIC, 0, 0, 3) == 1
    assert store.nth_event_offset(TOPIC, 0, 0, 5) is None


# ------------------------------------------------- ingest's path, key buckets, migration

from tracemq_collector import store as store_module  # noqa: E402
from tracemq_collector.events import decode_chunk  # noqa: E402
from tracemq_collector.store import BUCKET_BITS  # noqa: E402


def table(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return [tuple(r) for r in conn.execute(sql)]


def test_ingest_rows_store_exactly_what_write_batch_stores(tmp_path: Path) -> None:
    messages = [
        [pub_ctx(1, T0), *consume_ctxs(1, T0 + 5)],
        [pub_ctx(2, T0 + 1, keys="b a null a"), pub_ctx(2, T0 + 2)],  # a retried send
        [pub_ctx(3, T0 + 3, keys="")],
    ]
    values = [encode_many(m).data.encode() for m in messages] + [b"\xff\x02"]
    with TraceStore(tmp_path / "a.db") as a, TraceStore(tmp_path / "b.db") as b:
        feed = Feed()
        rows: list[dict[str, Any]] = []
        quarantine: list[dict[str, Any]] = []
        for value in values:
            r, q, progress = feed.raw(value)
            rows += r
            quarantine += q
        assert a.write_batch(rows, quarantine, progress) == 6
        chunk = decode_chunk([(TOPIC, 0, [(i, v, None) for i, v in enumerate(values)])], INGEST)
        assert b.write_rows(chunk.store) == (6, {(TOPIC, 0): None}, 0)
        assert b.write_rows(chunk.store) == (0, {(TOPIC, 0): 4}, 0)  # a replay adds nothing
        for sql in (
            "SELECT * FROM blocks ORDER BY id",
            "SELECT * FROM msg_index ORDER BY block, msg_hash",
            "SELECT * FROM pub_index ORDER BY ref",
            "SELECT * FROM key_index ORDER BY ref, key",
            "SELECT trace_offset, trace_index, reason FROM quarantine",
            "SELECT * FROM progress",
        ):
            assert table(a.path, sql) == table(b.path, sql), sql
        assert b.by_key("a")[0][0]["msg_id"] == msg_id(2)


def test_a_partly_stored_chunk_stores_the_rest_with_its_keys(store: TraceStore) -> None:
    values = [encode_many([pub_ctx(n, T0 + n)]).data.encode() for n in range(4)]
    first = decode_chunk([(TOPIC, 0, [(i, v, None) for i, v in enumerate(values[:2])])], INGEST)
    whole = decode_chunk([(TOPIC, 0, [(i, v, None) for i, v in enumerate(values)])], INGEST)
    assert store.write_rows(first.store)[0] == 2
    assert store.write_rows(whole.store)[0] == 2
    assert [i["msg_id"] for i in store.by_key("shared", limit=10)[0]] == [
        msg_id(n) for n in (3, 2, 1, 0)
    ]
    # Two blocks of two events; a ref is block << 8 | position.
    assert table(store.path, "SELECT id, n FROM blocks ORDER BY id") == [(1, 2), (2, 2)]
    keys = table(store.path, "SELECT ref, key FROM key_index WHERE key != 'shared'")
    assert sorted(keys) == [(256, "order-0"), (257, "order-1"), (512, "order-2"), (513, "order-3")]


def test_key_look_ups_span_every_bucket_in_time_order(store: TraceStore) -> None:
    feed = Feed()
    for n in range(6):
        store.write_batch(*feed.batch([pub_ctx(n, T0 + (n * 7) % 6)]))
        # The next message lands in the next bucket of the key index.
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "UPDATE meta SET value = value + ? WHERE key = 'next_block_id'",
                (1 << (BUCKET_BITS - 8),),
            )
    buckets = table(store.path, "SELECT DISTINCT bucket FROM key_index ORDER BY bucket")
    assert len(buckets) == 6
    seen: list[str] = []
    items, cursor = store.by_key("shared", limit=4)
    seen += [i["msg_id"] for i in items]
    items, cursor = store.by_key("shared", limit=4, cursor=cursor)
    seen += [i["msg_id"] for i in items]
    assert cursor is None
    by_time = sorted(range(6), key=lambda n: ((n * 7) % 6, n), reverse=True)
    assert seen == [msg_id(n) for n in by_time]
    assert [i["msg_id"] for i in store.by_key("order-4")[0]] == [msg_id(4)]
    # Retention empties the first buckets; look-ups still find the rest.
    assert store.delete_older_than(T0 + 2) == 2
    assert sorted(i["msg_id"] for i in store.by_key("shared")[0]) == sorted(
        msg_id(n) for n in range(6) if (n * 7) % 6 >= 2
    )


def jump_buckets(path: Path, buckets: int = 1) -> None:
    """The next block of ``path``'s store lands ``buckets`` buckets further on."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE meta SET value = value + ? WHERE key = 'next_block_id'",
            (buckets << (BUCKET_BITS - 8),),
        )


def placed_pub(n: int, ts: int, *, keys: str | None = None) -> TraceContext:
    from tracemq.message_id import encode_offset_msg_id

    ctx = pub_ctx(n, ts, keys=keys)
    ctx.trace_beans[0].offset_msg_id = encode_offset_msg_id("10.0.0.9:10911", 1, 1000 + n)
    return ctx


def test_msg_id_and_place_look_ups_span_every_bucket(store: TraceStore) -> None:
    from tracemq.message_id import encode_offset_msg_id

    feed = Feed()
    for n in range(4):  # each message's Pub in one bucket, its consume records in the next
        store.write_batch(*feed.batch([placed_pub(n, T0 + n)]))
        jump_buckets(store.path)
        store.write_batch(*feed.batch(consume_ctxs(n, T0 + 10 + n)))
    buckets = table(store.path, "SELECT DISTINCT bucket FROM msg_index ORDER BY bucket")
    assert len(buckets) == 5
    assert len(table(store.path, "SELECT DISTINCT bucket FROM place_index")) == 4
    for n in range(4):
        found = store.by_msg_id(msg_id(n))
        assert [e["trace_type"] for e in found] == ["Pub", "SubBefore", "SubAfter"], n
        place = encode_offset_msg_id("10.0.0.9:10911", 1, 1000 + n)
        assert store.msg_id_by_offset_msg_id(place) == msg_id(n)
    activity, _ = store.consume_activity(T0, T0 + 100)
    assert {e["msg_topic"] for e in activity} == {"orders"}  # each Pub found across buckets
    # Retention takes the first message's Pub (and with it the oldest bucket's rows).
    assert store.delete_older_than(T0 + 1) == 1
    assert [e["trace_type"] for e in store.by_msg_id(msg_id(0))] == ["SubBefore", "SubAfter"]
    assert store.msg_id_by_offset_msg_id(encode_offset_msg_id("10.0.0.9:10911", 1, 1000)) is None
    assert table(store.path, "SELECT count(*) FROM place_index") == [(3,)]
    assert table(store.path, "SELECT min(bucket) FROM msg_index") == [(buckets[1][0],)]


def test_an_id_whose_port_field_is_over_16_bits_names_no_place(
    store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A msgId (its producer's PID where an offsetMsgId has the port) is answered None without
    sweeping the place index; a real place is still found."""
    from tracemq.message_id import MessageIdGenerator, decode_offset_msg_id, encode_offset_msg_id

    real = encode_offset_msg_id("10.0.0.9:65535", 1, 1000)  # the highest port
    pub = placed_pub(0, T0)
    pub.trace_beans[0].offset_msg_id = real
    store.write_batch(*Feed().batch([pub]))
    assert store.msg_id_by_offset_msg_id(real) == msg_id(0)
    # the place index is not even read for a msgId, nor for a port of 65536
    swept: list[str] = []
    conn = store._reader()
    conn.set_trace_callback(swept.append)
    try:
        for odd in (
            MessageIdGenerator(ip="10.1.2.3").next(),
            real[:8] + "00010000" + real[16:],  # port 65536, the rest a real place's
        ):
            assert decode_offset_msg_id(odd)  # decodable: only its port rules it out
            assert store.msg_id_by_offset_msg_id(odd) is None
        assert not [q for q in swept if "place_index" in q]
        assert store.msg_id_by_offset_msg_id(real) == msg_id(0)
        assert [q for q in swept if "place_index" in q]  # (the trace callback works)
    finally:
        conn.set_trace_callback(None)


def test_picking_a_blocks_events_is_filtering_the_decoded_block(store: TraceStore) -> None:
    """``_pick`` splits each column only as far as the last wanted event: the events it gives
    are the decoded block's, for every msgId and every position of every block."""
    feed = Feed()
    for n in range(0, 60, 6):  # messages interleaved in the blocks, some with several events
        ctxs = [pub_ctx(k, T0 + k) for k in range(n, n + 6)]
        store.write_batch(*feed.batch([*ctxs, *consume_ctxs(n, T0 + 50), *consume_ctxs(n + 5, T0)]))
    blocks = table(store.path, "SELECT tp, data FROM blocks")
    assert len(blocks) >= 10
    for tp, data in blocks:
        events = store_module._decode_block(data, "t", tp)
        assert len(events) >= 2
        for e in events:
            wanted = [x for x in events if x[store_module._E_MSG] == e[store_module._E_MSG]]
            assert store_module._pick(data, "t", tp, msg_id=e[store_module._E_MSG]) == wanted
            assert store_module._pick(data, "t", tp, pos=e[0]) == [e]
        assert store_module._pick(data, "t", tp, msg_id="absent") == []


def test_a_retried_send_is_checked_in_the_newest_buckets_only(store: TraceStore) -> None:
    """The retried-send check looks RETRY_BUCKETS buckets back (documented): a retry's Pub
    stored further from its first is listed again by key."""
    feed = Feed()
    store.write_batch(*feed.batch([pub_ctx(1, T0)]))
    jump_buckets(store.path, store_module.RETRY_BUCKETS - 1)
    store.write_batch(*feed.batch([pub_ctx(1, T0 + 700)]))  # still in the window: one row
    assert [i["timestamp"] for i in store.by_key("order-1")[0]] == [T0]
    store.write_batch(*feed.batch([pub_ctx(2, T0)]))
    jump_buckets(store.path, store_module.RETRY_BUCKETS)
    store.write_batch(*feed.batch([pub_ctx(2, T0 + 700)]))  # past it
    assert [i["timestamp"] for i in store.by_key("order-2")[0]] == [T0 + 700, T0]
    assert len(store.by_msg_id(msg_id(2))) == 2


def _as_schema_5(path: Path, *, places: bool = True) -> None:
    """Turn a store file into what schema 5 wrote: the hashed indexes without buckets."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE m5 (msg_hash INTEGER NOT NULL, block INTEGER NOT NULL, "
            "pub INTEGER NOT NULL, PRIMARY KEY (msg_hash, block)) WITHOUT ROWID"
        )
        conn.execute("INSERT INTO m5 SELECT msg_hash, block, pub FROM msg_index")
        conn.execute("DROP TABLE msg_index")
        conn.execute("ALTER TABLE m5 RENAME TO msg_index")
        conn.execute(
            "CREATE TABLE p5 (place_hash INTEGER NOT NULL, ref INTEGER NOT NULL, "
            "PRIMARY KEY (place_hash, ref)) WITHOUT ROWID"
        )
        conn.execute("INSERT INTO p5 SELECT place_hash, ref FROM place_index")
        conn.execute("DROP TABLE place_index")
        if places:
            conn.execute("ALTER TABLE p5 RENAME TO place_index")
        else:
            conn.execute("DROP TABLE p5")
        conn.execute("UPDATE meta SET value = 5 WHERE key = 'schema_version'")


@pytest.mark.parametrize("places", [True, False])
def test_a_schema_5_file_is_upgraded_on_open(tmp_path: Path, places: bool) -> None:
    from tracemq.message_id import encode_offset_msg_id

    path = tmp_path / "five.db"
    feed = Feed()
    with TraceStore(path) as s:
        for n in range(3):
            s.write_batch(*feed.batch([placed_pub(n, T0 + n), *consume_ctxs(n, T0 + 5)]))
            jump_buckets(path)
        indexes = [
            table(path, f"SELECT * FROM {t} ORDER BY 1, 2, 3") for t in ("msg_index", "place_index")
        ]
    _as_schema_5(path, places=places)
    assert table(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [(5,)]
    with TraceStore(path) as s:
        assert table(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [(6,)]
        assert table(path, "SELECT * FROM msg_index ORDER BY 1, 2, 3") == indexes[0]
        assert table(path, "SELECT * FROM place_index ORDER BY 1, 2, 3") == (
            indexes[1] if places else []
        )
        for n in range(3):
            assert len(s.by_msg_id(msg_id(n))) == 3
            place = encode_offset_msg_id("10.0.0.9:10911", 1, 1000 + n)
            assert s.msg_id_by_offset_msg_id(place) == (msg_id(n) if places else None)
        s.write_batch(*feed.batch([placed_pub(9, T0 + 9)]))  # and it takes new events
        assert len(s.by_msg_id(msg_id(9))) == 1
    with TraceStore(path) as s:  # opened again: nothing left to upgrade
        assert s.event_count() == 3 * 3 + 1


@pytest.mark.parametrize("version", [1, 4])
def test_a_file_of_the_per_event_layout_is_refused_with_what_to_do(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # what versions 1-4 created first
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID")
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, record TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (version,))
    store = TraceStore(path)
    with pytest.raises(StoreSchemaError) as err:
        store.open()
    assert not store.is_open
    message = str(err.value)
    assert str(path) in message and f"version {version}" in message
    assert "move this file" in message and "previous collector version" in message
    # Nothing of the file was changed.
    assert table(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name") == [
        ("events",),
        ("meta",),
    ]


def test_the_ingest_worker_refuses_every_batch_after_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "w.db")
    monkeypatch.setattr(store_module, "_worker_stores", {})
    monkeypatch.setattr(store_module, "_worker_failed", [])
    value = encode_many([pub_ctx(1, T0)]).data.encode()
    good = decode_chunk([(TOPIC, 0, [(0, value, None)])], INGEST).store
    assert store_module.write_rows_in_worker(path, good)[0] == 1
    with pytest.raises(AttributeError):
        store_module.write_rows_in_worker(path, None)  # type: ignore[arg-type]
    with pytest.raises(TraceStoreError, match="an earlier batch failed"):
        store_module.write_rows_in_worker(path, good)
    for s in store_module._worker_stores.values():
        s.close()


# ------------------------------------------------- repeated trace messages (idempotency key)


def _keyed(
    messages: list[tuple[int, int, bytes, str | None]],
) -> Any:
    """``[(partition, offset, value, key)]`` → the StoreRows ingest would hand the store."""
    by_partition: dict[int, list[tuple[int, bytes | None, str | None, str | None]]] = {}
    for partition, offset, value, key in messages:
        by_partition.setdefault(partition, []).append((offset, value, None, key))
    return decode_chunk([(TOPIC, p, recs) for p, recs in by_partition.items()], INGEST).store


def test_a_repeated_trace_message_is_dropped_and_counted(tmp_path: Path) -> None:
    first = encode_many([pub_ctx(1, T0), *consume_ctxs(1, T0 + 5)]).data.encode()
    other = encode_many([pub_ctx(2, T0 + 1)]).data.encode()
    path = tmp_path / "r.db"
    with TraceStore(path) as s:
        # The copies of a timed-out but delivered send, and its retry, in one batch and the next.
        assert s.write_rows(_keyed([(0, 0, first, "K1"), (0, 1, first, "K1")]))[::2] == (3, 1)
        assert s.write_rows(_keyed([(0, 2, other, "K2"), (0, 3, first, "K1")]))[::2] == (1, 1)
        # A replay of the first copy (same coordinates) is not a repeat: it adds nothing.
        assert s.write_rows(_keyed([(0, 0, first, "K1")]))[::2] == (0, 0)
        assert [e["trace_offset"] for e in s.by_msg_id(msg_id(1))] == [0, 0, 0]
        assert [i["msg_id"] for i in s.by_key("shared")[0]] == [msg_id(2), msg_id(1)]
        assert s.progress() == {(TOPIC, 0): 4}
    # Across a restart (the keys are in the file) and from another partition.
    with TraceStore(path) as s:
        assert s.write_rows(_keyed([(0, 4, first, "K1"), (1, 0, first, "K1")]))[::2] == (0, 2)
        assert s.event_count() == 4
        assert s.progress() == {(TOPIC, 0): 5, (TOPIC, 1): 1}


def test_trace_messages_without_a_key_are_never_deduplicated(store: TraceStore) -> None:
    # RocketMQ clients set no IDEMPOTENCY_KEY: their repeats are kept, as before.
    value = encode_many([pub_ctx(1, T0)]).data.encode()
    assert store.write_rows(_keyed([(0, 0, value, None), (0, 1, value, None)]))[::2] == (2, 0)
    assert len(store.by_msg_id(msg_id(1))) == 2


def test_a_repeat_drops_its_quarantined_records_too(store: TraceStore) -> None:
    value = encode_many([pub_ctx(1, T0)]).data.encode() + b"\xff\x02"
    assert store.write_rows(_keyed([(0, 0, value, "K"), (0, 1, value, "K")]))[::2] == (1, 1)
    assert store.quarantine_count() == 1


def test_the_dedupe_window_is_bounded_per_partition(
    store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "DEDUPE_WINDOW_MESSAGES", 10)
    value = encode_many([pub_ctx(1, T0)]).data.encode()
    store.write_rows(_keyed([(0, n, value, f"K{n}") for n in range(30)]))
    kept = table(store.path, "SELECT trace_offset FROM message_keys ORDER BY trace_offset")
    assert kept == [(n,) for n in range(20, 30)]
    # Older than the window: stored again (the documented bound).
    assert store.write_rows(_keyed([(0, 30, value, "K0"), (0, 31, value, "K29")]))[::2] == (1, 1)


def test_client_ids_are_kept_per_event(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    value = encode_many([pub_ctx(1, T0)]).data.encode()
    with TraceStore(path) as s:
        s.write_rows(decode_chunk([(TOPIC, 0, [(0, value, None)])], INGEST).store)
        chunk = decode_chunk([(TOPIC, 0, [(1, value, None, "K", "10.0.0.1@42#2")])], INGEST)
        s.write_rows(chunk.store)
        events = s.by_msg_id(msg_id(1))
        assert sorted(str(e["client_id"]) for e in events) == ["10.0.0.1@42#2", "None"]


# ---------------------------------------------------------------------------- group activity


def test_consume_activity_reads_a_window_with_each_message_topic(store: TraceStore) -> None:
    feed = Feed()

    def sub(n: int, ts: int, group: str, *, ok: bool, retry: int = 0) -> list[TraceContext]:
        bean = TraceBean(topic="orders", msg_id=msg_id(n), retry_times=retry)
        return [
            TraceContext(
                TraceType.SubBefore, timestamp=ts, group_name=group, request_id=f"r{n}{ts}",
                trace_beans=[bean],
            ),
            TraceContext(
                TraceType.SubAfter, timestamp=ts + 1, group_name=group, request_id=f"r{n}{ts}",
                success=ok, cost_time=1, trace_beans=[bean],
            ),
        ]  # fmt: skip

    dlq = TraceContext(
        TraceType.Pub,
        timestamp=T0 + 30,
        group_name="billing",
        trace_beans=[
            TraceBean(topic="%DLQ%billing", msg_id=msg_id(2), msg_type=MessageType.Normal_Msg)
        ],
    )
    rows, quarantine, progress = feed.batch(
        [pub_ctx(1, T0)],
        [pub_ctx(2, T0 + 1, topic="payments")],
        sub(1, T0 + 10, "billing", ok=True),
        sub(2, T0 + 20, "billing", ok=False, retry=1),
        sub(2, T0 + 21, "audit_billing", ok=True),  # its record names "billing" too
        [dlq],
        sub(9, T0 + 40, "billing", ok=True),  # its Pub is not in this store
        sub(1, T0 + 5_000, "billing", ok=True),  # outside the window
    )
    store.write_batch(rows, quarantine, progress)
    events, cut = store.consume_activity(T0, T0 + 1000, group="billing")
    assert not cut
    got = [(e["trace_type"], e["msg_id"], e["msg_topic"], e["group_name"]) for e in events]
    assert got == [
        ("SubAfter", msg_id(9), None, "billing"),
        ("SubBefore", msg_id(9), None, "billing"),
        ("Pub", msg_id(2), "payments", "billing"),  # the DLQ move; topic of the message's Pub
        ("SubAfter", msg_id(2), "payments", "billing"),
        ("SubBefore", msg_id(2), "payments", "billing"),
        ("SubAfter", msg_id(1), "orders", "billing"),
        ("SubBefore", msg_id(1), "orders", "billing"),
    ]
    everyone, _ = store.consume_activity(T0, T0 + 1000)
    assert len(everyone) == len(events) + 2  # audit_billing's two events
    newest, cut = store.consume_activity(T0, T0 + 1000, limit=3)
    assert cut and [e["timestamp"] for e in newest] == [T0 + 41, T0 + 40, T0 + 30]


def test_an_offset_msg_id_is_found_through_its_place_and_retention_drops_the_place(
    store: TraceStore,
) -> None:
    from tracemq.message_id import encode_offset_msg_id

    def pub(n: int, ts: int, place: str) -> TraceContext:
        ctx = pub_ctx(n, ts)
        ctx.trace_beans[0].offset_msg_id = place
        return ctx

    here = encode_offset_msg_id("10.0.0.9:10911", 2, 77)
    elsewhere = encode_offset_msg_id("10.0.0.9:10911", 2, 78)
    store.write_batch(*Feed().batch([pub(1, T0, here.lower())], [pub(2, T0 + 9_000, elsewhere)]))
    assert table(store.path, "SELECT count(*) FROM place_index") == [(2,)]
    assert store.msg_id_by_offset_msg_id(here) == msg_id(1)
    assert store.msg_id_by_offset_msg_id(encode_offset_msg_id("10.0.0.9:10911", 2, 79)) is None
    assert store.delete_older_than(T0 + 1) == 1
    assert store.msg_id_by_offset_msg_id(here) is None
    assert table(store.path, "SELECT count(*) FROM place_index") == [(1,)]


def test_an_ingesting_process_collects_garbage_rarely() -> None:
    """tune_gc (the collector and its ingest worker call it at start): startup objects are out
    of the collector's sight and the young generation is collected far less often."""
    import subprocess
    import sys

    code = (
        "import gc; from tracemq_collector.store import tune_gc, GC_YOUNG_THRESHOLD as T; "
        "tune_gc(); print(gc.get_threshold()[0] == T, gc.get_freeze_count() > 1000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_INTS = st.one_of(
    st.integers(-5, 1100), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.sampled_from([0, 1])
)


@given(
    st.one_of(
        st.lists(_INTS, max_size=140),
        st.builds(lambda v, n: [v] * n, _INTS, st.integers(0, 140)),
        st.lists(st.integers(0, 1023), max_size=140),
    )
)
@settings(max_examples=400, deadline=None)
def test_an_integer_column_of_a_block_is_the_text_of_each_value(values: list[Any]) -> None:
    for column in (values, tuple(values)):
        expected = "\x02".join(str(int(v)) for v in column)
        assert store_module._int_column_text(column) == expected


@pytest.mark.parametrize(
    "values",
    [
        ["7", "x"],
        [None, 1],
        [1.5, 2],
        ["12", "12"],
        [5000, "12", 7000],  # large numbers (the printf path) with a text among them
        [5000.7, 2e20, True, -3.9],
        [5000, float("nan")],
        [5000, float("inf")],
        [5000, None, 7000],
    ],
)
def test_an_integer_column_of_other_values_is_what_int_makes_of_them(values: list[Any]) -> None:
    try:
        expected: Any = "\x02".join(str(int(v)) for v in values)
    except (TypeError, ValueError, OverflowError) as exc:
        expected = type(exc)
    try:
        got: Any = store_module._int_column_text(values)
    except (TypeError, ValueError, OverflowError) as exc:
        got = type(exc)
    assert got == expected


def test_two_msg_ids_of_one_hash_in_a_block_are_one_index_row_with_the_pub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 64-bit hash collision (forced here): one msg_index row per (hash, block), marked as
    holding a Pub when either message has one, and each look-up still finds only its own."""
    from array import array

    monkeypatch.setattr(store_module, "_msg_hash", lambda m: 42)
    monkeypatch.setattr(store_module, "_hashes_of", lambda texts: array("q", [42] * len(texts)))
    path = tmp_path / "traces.db"
    feed = Feed()
    with TraceStore(path) as s:
        s.write_batch(*feed.batch([*consume_ctxs(2, T0), pub_ctx(1, T0 + 1)]))
        assert [e["trace_type"] for e in s.by_msg_id(msg_id(1))] == ["Pub"]
        assert [e["trace_type"] for e in s.by_msg_id(msg_id(2))] == ["SubBefore", "SubAfter"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT msg_hash, pub FROM msg_index").fetchall() == [(42, 1)]
