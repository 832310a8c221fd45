"""Collector events: a trace message's bytes → lake rows and quarantine rows, never raising."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracemq import lake
from tracemq.message_id import encode_offset_msg_id
from tracemq.trace import (
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    TransactionState,
    encode_many,
)
from tracemq_collector.events import (
    EMPTY_MESSAGE,
    EXTRA_KEYS,
    MAX_FIELD_CHARS,
    MAX_RAW_BYTES,
    QUARANTINE_KEYS,
    event_from_stored,
    hour_partition,
    rows_from_record,
)

S = "\x01"
E = "\x02"
TOPIC = "RMQ_SYS_TRACE_TOPIC"
TS = 1_704_164_645_123  # 2024-01-02T03:04:05.123Z
INGEST = 1_704_200_000_000  # 2024-01-02T12:53:20Z
MSG_ID = "0A0000010F2C1A2B3C4D000012340001"
OFFSET_ID = encode_offset_msg_id("10.0.0.9:10911", 3, 42)
#: RocketMQ's form for an IPv6 store host: 16-byte address, 56 hex digits
OFFSET_ID_V6 = encode_offset_msg_id("[fd00::9]:10911", 5, 2**40 + 1)
ROW_KEYS = {*lake.COLUMN_NAMES, *EXTRA_KEYS}


def record(*fields: str) -> str:
    return S.join(fields) + E


def pub(
    *, ts: int = TS, msg_id: str = MSG_ID, keys: str = "order-1 user-9", success: str = "true"
) -> str:
    return record(
        "Pub",
        str(ts),
        "DefaultRegion",
        "pg",
        "orders",
        msg_id,
        "TagA",
        keys,
        "10.0.0.9:10911",
        "512",
        "7",
        "0",
        OFFSET_ID,
        success,
    )


def sub_before(*, ts: int = TS + 10) -> str:
    return record("SubBefore", str(ts), "DefaultRegion", "cg", "req-1", MSG_ID, "2", "order-1")


def sub_after(*, ts: int = TS + 20) -> str:
    return record("SubAfter", "req-1", MSG_ID, "9", "false", "order-1", "2", str(ts), "cg")


def decode(text: str | bytes, offset: int = 7) -> tuple[list[dict], list[dict]]:
    value = text.encode() if isinstance(text, str) else text
    return rows_from_record(TOPIC, 2, offset, value, INGEST)


# ------------------------------------------------------------------------ good records


def test_pub_row_has_every_lake_column_and_its_partition() -> None:
    events, quarantine = decode(pub())
    assert quarantine == []
    [row] = events
    assert set(row) == ROW_KEYS
    assert row == {
        "trace_type": "Pub",
        "timestamp": TS,
        "region_id": "DefaultRegion",
        "group_name": "pg",
        "request_id": None,
        "cost_time": 7,
        "success": True,
        "context_code": 0,
        "topic": "orders",
        "msg_id": MSG_ID,
        "offset_msg_id": OFFSET_ID,
        "tags": "TagA",
        "keys": "order-1 user-9",
        "store_host": "10.0.0.9:10911",
        "client_host": None,
        "store_time": 0,
        "retry_times": 0,
        "body_length": 512,
        "msg_type": 0,
        "transaction_id": None,
        "transaction_state": None,
        "from_transaction_check": False,
        "trace_topic": TOPIC,
        "trace_partition": 2,
        "trace_offset": 7,
        "trace_index": 0,
        "ingest_ts": INGEST,
        "store_addr": "10.0.0.9:10911",
        "queue_id": 3,
        "queue_offset": 42,
        "schema_version": lake.SCHEMA_VERSION,
        "date": "2024-01-02",
        "hour": 3,
        "record": pub()[:-1],
        "client_id": None,  # a trace message header, not in the record
    }


def test_rows_from_the_codec_keep_record_order_and_types() -> None:
    bean = TraceBean(
        topic="orders",
        msg_id=MSG_ID,
        tags="TagA",
        keys="k1",
        store_host="10.0.0.9:10911",
        msg_type=MessageType.Trans_msg_Commit,
        transaction_id="tx-1",
        transaction_state=TransactionState.ROLLBACK_MESSAGE,
        from_transaction_check=True,
    )
    body = encode_many(
        [
            TraceContext(TraceType.SubBefore, timestamp=TS, request_id="r", trace_beans=[bean]),
            TraceContext(
                TraceType.SubAfter,
                timestamp=TS + 5,
                request_id="r",
                context_code=4,
                success=False,
                trace_beans=[bean],
            ),
            TraceContext(TraceType.EndTransaction, timestamp=TS + 6, trace_beans=[bean]),
            TraceContext(TraceType.Recall, timestamp=TS + 7, success=False, trace_beans=[bean]),
        ]
    ).data
    events, quarantine = decode(body)
    assert quarantine == []
    assert [(r["trace_type"], r["trace_index"]) for r in events] == [
        ("SubBefore", 0),
        ("SubAfter", 1),
        ("EndTransaction", 2),
        ("Recall", 3),
    ]
    after, end_tx, recall = events[1], events[2], events[3]
    assert (after["context_code"], after["success"], after["timestamp"]) == (4, False, TS + 5)
    assert end_tx["msg_type"] == 2 and type(end_tx["msg_type"]) is int
    assert end_tx["transaction_state"] == "ROLLBACK_MESSAGE"
    assert type(end_tx["transaction_state"]) is str
    assert end_tx["from_transaction_check"] is True and end_tx["transaction_id"] == "tx-1"
    assert recall["success"] is False and recall["msg_type"] is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Pub, 12 fields: oldest clients, success defaults to true, no offsetMsgId.
        (
            record("Pub", str(TS), "r", "g", "t", MSG_ID, "tag", "k", "h:1", "1", "2", "3"),
            {"success": True, "offset_msg_id": None, "msg_type": 3, "store_addr": None},
        ),
        # 13: field 13 is success.
        (
            record(
                "Pub", str(TS), "r", "g", "t", MSG_ID, "tag", "k", "h:1", "1", "2", "0", "false"
            ),
            {"success": False, "offset_msg_id": None},
        ),
        # 14: offsetMsgId then success.
        (pub(), {"success": True, "offset_msg_id": OFFSET_ID, "queue_id": 3}),
        # 15+: the old clientHost.
        (
            pub()[:-1] + S + "10.1.1.1" + E,
            {"client_host": "10.1.1.1", "offset_msg_id": OFFSET_ID},
        ),
        # SubBefore, 7 fields: an empty keys vanished in the split.
        (
            record("SubBefore", str(TS), "r", "g", "req", MSG_ID, "1"),
            {"keys": None, "retry_times": 1, "request_id": "req"},
        ),
        # 8: the normal SubBefore.
        (sub_before(), {"keys": "order-1", "retry_times": 2}),
        # 9: old clientHost.
        (sub_before()[:-1] + S + "10.2.2.2" + E, {"client_host": "10.2.2.2"}),
        # SubAfter, 6 fields: no contextCode and no timestamp: the ingest time stands in.
        (
            record("SubAfter", "req", MSG_ID, "5", "true", "k"),
            {"timestamp": INGEST, "context_code": 0, "group_name": None, "hour": 12},
        ),
        # 7: contextCode, still no timestamp.
        (
            record("SubAfter", "req", MSG_ID, "5", "true", "k", "1"),
            {"timestamp": INGEST, "context_code": 1},
        ),
        # 8: a 9-field record whose empty group vanished.
        (
            record("SubAfter", "req", MSG_ID, "5", "true", "k", "0", str(TS)),
            {"timestamp": TS, "group_name": None},
        ),
        # 9: the full SubAfter.
        (sub_after(), {"timestamp": TS + 20, "group_name": "cg", "success": False}),
        (
            record(
                "EndTransaction",
                str(TS),
                "r",
                "g",
                "t",
                MSG_ID,
                "tag",
                "k",
                "h:1",
                "1",
                "tx",
                "COMMIT_MESSAGE",
                "false",
            ),
            {"transaction_state": "COMMIT_MESSAGE", "msg_type": 1},
        ),
        (record("Recall", str(TS), "r", "g", "t", MSG_ID, "true"), {"success": True}),
    ],
)
def test_every_historical_field_count_decodes(text: str, expected: dict) -> None:
    events, quarantine = decode(text)
    assert quarantine == []
    [row] = events
    assert {k: row[k] for k in expected} == expected


def test_null_fields_become_none() -> None:
    text = record(
        "Pub",
        str(TS),
        "null",
        "null",
        "null",
        "null",
        "null",
        "null",
        "null",
        "1",
        "2",
        "0",
        "null",
        "true",
    )
    [row], _ = decode(text)
    for column in ("region_id", "group_name", "topic", "msg_id", "tags", "keys", "store_host"):
        assert row[column] is None, column
    assert (row["offset_msg_id"], row["store_addr"], row["queue_id"]) == (None, None, None)


def test_an_offset_msg_id_that_does_not_decode_keeps_its_text_without_coordinates() -> None:
    text = pub().replace(OFFSET_ID, "not-an-offset-msg-id")
    [row], _ = decode(text)
    assert row["offset_msg_id"] == "not-an-offset-msg-id"
    assert (row["store_addr"], row["queue_id"], row["queue_offset"]) == (None, None, None)


def test_an_ipv6_offset_msg_id_gives_its_coordinates_on_both_paths() -> None:
    assert len(OFFSET_ID_V6) == 56
    text = pub().replace(OFFSET_ID, OFFSET_ID_V6)
    [row], quarantine = decode(text)
    assert quarantine == []
    assert row["offset_msg_id"] == OFFSET_ID_V6
    assert (row["store_addr"], row["queue_id"], row["queue_offset"]) == (
        "[fd00::9]:10911",
        5,
        2**40 + 1,
    )
    fast = ev._fast_row(text[:-1], TOPIC, 2, 7, 3, INGEST, None)
    assert fast is not None
    assert dict(zip(ev.ROW_NAMES, fast, strict=True)) == ev._decode_text(
        text[:-1], TOPIC, 2, 7, 3, INGEST
    )


def test_an_eight_field_sub_after_is_kept() -> None:
    # RocketMQ ignores an 8th SubAfter field: the record is an event, its timestamp read when
    # the 8th field is a number and the ingest time otherwise
    for eighth, ts in ((str(TS + 5), TS + 5), ("x", INGEST), ("", INGEST)):
        text = S.join(["SubAfter", "req-1", MSG_ID, "9", "true", "k", "0", eighth]) + E
        events, quarantine = decode(text)
        assert quarantine == []
        [row] = events
        assert (row["trace_type"], row["timestamp"], row["cost_time"]) == ("SubAfter", ts, 9)


def test_partition_is_the_utc_date_and_hour() -> None:
    assert hour_partition(0) == ("1970-01-01", 0)
    assert hour_partition(TS) == ("2024-01-02", 3)
    moment = datetime(2031, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    assert hour_partition(int(moment.timestamp() * 1000)) == ("2031-12-31", 23)
    with pytest.raises(ValueError):
        hour_partition(-1)


def test_a_stored_record_decodes_back_to_the_same_row() -> None:
    events, _ = decode(pub() + sub_after())
    for row in events:
        again = event_from_stored(row["record"], TOPIC, 2, 7, row["trace_index"], row["ingest_ts"])
        assert again == row
    with pytest.raises(ValueError, match="no longer decodes"):
        event_from_stored("Pub" + S + "x", TOPIC, 2, 7, 0, INGEST)


# ------------------------------------------------------------------------- bad records


def test_invalid_utf8_in_the_middle_record_quarantines_it_alone() -> None:
    middle = (
        b"SubBefore\x01" + str(TS).encode() + b"\x01r\x01g\xff\xfe\x01req\x01" + MSG_ID.encode()
    )
    value = pub().encode() + middle + b"\x02" + sub_after().encode()
    events, quarantine = decode(value)
    assert [(r["trace_type"], r["trace_index"]) for r in events] == [("Pub", 0), ("SubAfter", 2)]
    [bad] = quarantine
    assert set(bad) == set(QUARANTINE_KEYS)
    assert (bad["trace_index"], bad["raw"]) == (1, middle)
    assert bad["reason"].startswith("invalid UTF-8")
    assert (bad["trace_topic"], bad["trace_partition"], bad["trace_offset"]) == (TOPIC, 2, 7)
    assert bad["ingest_ts"] == INGEST


def test_malformed_and_truncated_records_are_quarantined_with_the_codec_reason() -> None:
    truncated = pub()[:40]  # cut inside the record, no separator after it
    value = pub() + record("Pub", str(TS), "r") + sub_before() + truncated
    events, quarantine = decode(value)
    assert [r["trace_index"] for r in events] == [0, 2]
    assert [q["trace_index"] for q in quarantine] == [1, 3]
    assert all(q["reason"].startswith("malformed record: ") for q in quarantine)
    assert "at least 12 are required" in quarantine[0]["reason"]
    assert quarantine[1]["raw"] == truncated.encode()


def test_a_bad_number_is_malformed() -> None:
    _, [bad] = decode(pub().replace(str(TS), "12x4"))
    assert bad["reason"].startswith("malformed record: field 'timestamp'")


def test_unknown_trace_type_is_quarantined() -> None:
    events, [bad] = decode(pub() + record("Teleport", "1", "2"))
    assert len(events) == 1
    assert bad["reason"] == "unknown trace type 'Teleport'"
    assert bad["trace_index"] == 1


def test_a_huge_field_is_quarantined_and_its_raw_bytes_are_cut() -> None:
    huge = "x" * (10 * 1024 * 1024)
    value = pub() + pub(keys=huge) + sub_after()
    events, [bad] = decode(value)
    assert [r["trace_index"] for r in events] == [0, 2]
    assert bad["trace_index"] == 1
    assert f"is {len(huge)} characters long (limit {MAX_FIELD_CHARS})" in bad["reason"]
    assert "raw cut to" in bad["reason"]
    assert len(bad["raw"]) == MAX_RAW_BYTES
    assert bad["raw"] == pub(keys=huge).encode()[:MAX_RAW_BYTES]


def test_a_field_at_the_limit_is_kept() -> None:
    [row], quarantine = decode(pub(keys="k" * MAX_FIELD_CHARS))
    assert quarantine == [] and len(row["keys"]) == MAX_FIELD_CHARS


@pytest.mark.parametrize("timestamp", ["-5", str(2**62)])
def test_a_timestamp_no_partition_can_hold_is_quarantined(timestamp: str) -> None:
    _, [bad] = decode(pub().replace(str(TS), timestamp))
    assert "outside 1970..9999" in bad["reason"]


@pytest.mark.parametrize("value", [None, b""])
def test_an_empty_message_is_quarantined_whole(value: bytes | None) -> None:
    events, [bad] = rows_from_record(TOPIC, 0, 5, value, INGEST)
    assert events == []
    assert (bad["trace_index"], bad["reason"], bad["raw"]) == (0, EMPTY_MESSAGE, b"")


def test_a_message_of_separators_only_is_an_empty_message() -> None:
    events, [bad] = decode(b"\x01\x02\x02")
    assert events == []
    assert (bad["reason"], bad["raw"]) == (EMPTY_MESSAGE, b"\x01\x02\x02")


def test_an_empty_record_in_the_middle_keeps_the_indexes_of_the_others() -> None:
    events, quarantine = decode(pub() + E + sub_after())
    assert quarantine == []
    assert [r["trace_index"] for r in events] == [0, 2]


# -------------------------------------------------------------------------- robustness


def _check_shape(events: list[dict], quarantine: list[dict]) -> None:
    indexes = [r["trace_index"] for r in events] + [q["trace_index"] for q in quarantine]
    assert len(indexes) == len(set(indexes)), "an index was used twice"
    assert events or quarantine, "a message must leave a trace"
    for row in events:
        assert set(row) == ROW_KEYS
        assert 0 <= row["timestamp"] and row["hour"] in range(24)
    for bad in quarantine:
        assert set(bad) == set(QUARANTINE_KEYS)
        assert isinstance(bad["raw"], bytes) and len(bad["raw"]) <= MAX_RAW_BYTES


@given(st.binary(max_size=2048))
@settings(max_examples=400, deadline=None)
def test_any_bytes_never_raise(value: bytes) -> None:
    _check_shape(*decode(value))


@given(
    st.lists(st.sampled_from([pub(), sub_before(), sub_after()]), min_size=1, max_size=6), st.data()
)
@settings(max_examples=200, deadline=None)
def test_a_message_cut_anywhere_keeps_every_whole_record_before_the_cut(
    records: list[str], data: st.DataObject
) -> None:
    value = "".join(records).encode()
    cut = data.draw(st.integers(min_value=1, max_value=len(value)))
    events, quarantine = decode(value[:cut])
    _check_shape(events, quarantine)
    whole = value[:cut].count(b"\x02")
    assert [r["trace_index"] for r in events][:whole] == list(range(whole))


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=30), max_size=16))
@settings(max_examples=300, deadline=None)
def test_any_text_fields_never_raise(fields: list[str]) -> None:
    for kind in ("Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall"):
        _check_shape(*decode(S.join([kind, *fields]).encode() + b"\x02"))


# ------------------------------------------------------------ fast path == general path

from tracemq_collector import events as ev  # noqa: E402

_NUMBERS = st.one_of(
    st.sampled_from(
        ["0", "7", "007", "-1", "+5", " 5", "5 ", "", "null", "1e3", "\u0661", "\u00b2", "x"]
    ),
    st.integers(min_value=0, max_value=2**64).map(str),
    st.sampled_from([str(2**31 - 1), str(2**31), str(2**63 - 1), str(2**63), "9" * 25]),
    st.sampled_from([str(ev.MAX_TIMESTAMP_MS), str(ev.MAX_TIMESTAMP_MS + 1), str(TS)]),
)
_TEXTS = st.one_of(
    st.sampled_from(["null", "", "NULL", "a b", "k1 null k2", "TagA", "true", "TRUE", "False"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=12),
)
_OFFSET_IDS = st.one_of(
    st.sampled_from([OFFSET_ID, OFFSET_ID_V6, OFFSET_ID_V6.lower(), OFFSET_ID_V6[:-1]]),
    st.sampled_from(["null", "", OFFSET_ID.lower(), OFFSET_ID[:-1], OFFSET_ID + "0"]),
    st.sampled_from([OFFSET_ID_V6[:20] + " " + OFFSET_ID_V6[21:], "G" * 56]),
    st.sampled_from([" " + OFFSET_ID[1:], OFFSET_ID[:10] + " " + OFFSET_ID[11:], "G" * 32]),
    st.text(alphabet="0123456789ABCDEFabcdef ", min_size=32, max_size=32),
)


def _general(text: str, ingest_ts: int = INGEST) -> dict | str | None:
    return ev._decode_text(text, TOPIC, 2, 7, 3, ingest_ts)


def _fast(text: str, ingest_ts: int = INGEST) -> dict | None:
    row = ev._fast_row(text, TOPIC, 2, 7, 3, ingest_ts, None)
    return None if row is None else dict(zip(ev.ROW_NAMES, row, strict=True))


def _assert_same(text: str, ingest_ts: int = INGEST) -> None:
    fast = _fast(text, ingest_ts)
    if fast is not None:  # when the fast path answers, it answers what the general path does
        assert fast == _general(text, ingest_ts)


@given(
    st.sampled_from(["Pub", "SubBefore", "SubAfter"]),
    st.lists(st.one_of(_NUMBERS, _TEXTS, _OFFSET_IDS), min_size=5, max_size=16),
    st.sampled_from([INGEST, 0, ev.MAX_TIMESTAMP_MS + 1]),
)
@settings(max_examples=1500, deadline=None)
def test_the_fast_path_decodes_exactly_like_the_general_path(
    kind: str, fields: list[str], ingest_ts: int
) -> None:
    _assert_same(S.join([kind, *fields]), ingest_ts)


@given(
    ts=_NUMBERS, body=_NUMBERS, cost=_NUMBERS, msg_type=_NUMBERS, success=_TEXTS,
    offset_id=_OFFSET_IDS, text=_TEXTS,
)  # fmt: skip
@settings(max_examples=800, deadline=None)
def test_the_fast_path_agrees_on_well_shaped_records(
    ts: str, body: str, cost: str, msg_type: str, success: str, offset_id: str, text: str
) -> None:
    _assert_same(
        S.join(["Pub", ts, "R", "pg", "orders", MSG_ID, text, "k1 k2", "10.0.0.9:10911", body,
                cost, msg_type, offset_id, success or "true"])
    )  # fmt: skip
    _assert_same(S.join(["SubBefore", ts, text, "cg", "req", MSG_ID, body, "k1" + text]))
    _assert_same(
        S.join(["SubAfter", "req", MSG_ID, cost, success, text, msg_type, ts, "cg" + text])
    )


def test_the_fast_path_takes_the_common_records_and_leaves_the_rest() -> None:
    for text in (pub(), sub_before(), sub_after()):
        assert _fast(text[:-1]) is not None
        assert _fast(text[:-1]) == _general(text[:-1])
    for text in (
        S.join(["Pub", str(TS), "R", "g", "t", MSG_ID, "tag", "k", "h", "1", "2", "0"]),  # 12
        S.join(["SubAfter", "req", MSG_ID, "3", "true", "k"]),  # 6 fields
        S.join(["SubBefore", "-1", "R", "g", "r", MSG_ID, "0", "k"]),  # a sign
        S.join(["SubBefore", str(TS), "R", "g", "r", MSG_ID, "0", ""]),  # trailing empty
    ):
        assert _fast(text) is None


def test_rows_are_the_same_whichever_path_decoded_them() -> None:
    # rows_from_record goes through the fast path; the general path, record by record, must
    # give the same rows.
    value = (pub() + sub_before() + sub_after() + record("Recall", str(TS), "R", "g", "t", MSG_ID,
             "true") + pub(ts=0) + sub_after(ts=0)).encode()  # fmt: skip
    events, quarantine = rows_from_record(TOPIC, 2, 7, value, INGEST)
    general: list[dict] = []
    bad: list[dict] = []
    for index, piece in enumerate(value.split(b"\x02")[:-1]):
        ev._decode_piece(piece, TOPIC, 2, 7, index, INGEST, general, bad)
    assert events == general and quarantine == bad == []


def test_decode_message_fills_the_client_host_where_the_record_has_none() -> None:
    old = record("SubBefore", str(TS), "R", "cg", "r", MSG_ID, "0", "k", "10.1.1.1")
    rows, _ = ev.decode_message(TOPIC, 0, 1, (pub() + old).encode(), INGEST, "10.9.9.9")
    hosts = [dict(zip(ev.ROW_NAMES, r, strict=True))["client_host"] for r in rows]
    assert hosts == ["10.9.9.9", "10.1.1.1"]


def test_decode_message_gives_every_event_the_client_id_of_its_message() -> None:
    # a fast-path Pub and a general-path old SubBefore (9 fields) alike
    old = record("SubBefore", str(TS), "R", "cg", "r", MSG_ID, "0", "k", "10.1.1.1")
    value = (pub() + old).encode()
    rows, _ = ev.decode_message(TOPIC, 0, 1, value, INGEST, "10.9.9.9", "10.9.9.9@77#2")
    assert [dict(zip(ev.ROW_NAMES, r, strict=True))["client_id"] for r in rows] == [
        "10.9.9.9@77#2",
        "10.9.9.9@77#2",
    ]
    rows, _ = ev.decode_message(TOPIC, 0, 1, value, INGEST, "10.9.9.9")
    assert [dict(zip(ev.ROW_NAMES, r, strict=True))["client_id"] for r in rows] == [None, None]


def test_an_event_row_has_the_lake_columns_and_the_extra_keys() -> None:
    assert set(ev.ROW_NAMES) == ROW_KEYS


def test_decode_chunk_gives_the_store_rows_keys_and_lake_batches() -> None:
    value = (pub(keys="b a a null") + sub_before() + pub(keys="c") + sub_after()).encode()
    chunk = ev.decode_chunk([(TOPIC, 2, [(7, value, "10.9.9.9"), (8, b"\xff\x02", None)])], INGEST)
    rows, _ = rows_from_record(TOPIC, 2, 7, value, INGEST)
    assert [e[1:] for e in chunk.store.events] == [
        tuple(({**r, "client_host": r["client_host"] or "10.9.9.9"})[n] for n in ev.STORE_ROW)
        for r in rows
    ]
    assert [e[0] for e in chunk.store.events] == [0, 1, 2, 3]
    # The retried Pub (same msgId) indexes nothing; keys sorted, deduped, "null" dropped.
    assert [k[:2] for k in chunk.store.key_rows] == [(0, "a"), (1, "b")]
    assert chunk.store.key_msg_ids == [MSG_ID]
    assert chunk.store.progress == {(TOPIC, 2): 9}
    assert chunk.store.ordered and chunk.records == 2
    assert [q["trace_offset"] for q in chunk.store.quarantine] == [8]
    part = chunk.partitions[(TOPIC, 2)]
    assert (part.first_offset, part.end_offset, part.events) == (7, 9, 4)
    (batch,) = part.lake.values()
    assert batch.schema == lake.arrow_schema()
    expected = [{k: {**r, "client_host": r["client_host"] or "10.9.9.9"}[k]
                 for k in lake.COLUMN_NAMES} for r in rows]  # fmt: skip
    assert batch.to_pylist() == expected


def test_decode_chunk_collects_the_idempotency_keys_of_its_trace_messages() -> None:
    value = pub().encode()
    chunk = ev.decode_chunk(
        [
            (TOPIC, 0, [(3, value, None, "K3"), (4, value, None, None), (5, value, None)]),
            (TOPIC, 1, [(9, value, "10.0.0.1", "K9")]),
        ],
        INGEST,
    )
    # Without a key (RocketMQ clients, or a 3-tuple) a message is not a dedupe candidate.
    assert chunk.store.message_keys == [(TOPIC, 0, 3, "K3"), (TOPIC, 1, 9, "K9")]
    assert chunk.events == 4


# ------------------------------------------------------------- the store's batch as columns

import pickle  # noqa: E402


def _row_by_row(messages: list[tuple[str, int, list[tuple]]]) -> tuple[ev.StoreRows, dict]:
    """What decode_chunk hands the store and the lake, built a row at a time (the reference:
    one event tuple per row, one lake batch per hour group)."""
    rows: list[tuple] = []
    lakes: dict = {}
    for topic, partition, recs in messages:
        mine = []
        for offset, value, born in recs:
            mine.extend(ev.decode_message(topic, partition, offset, value, INGEST, born)[0])
        groups: dict = {}
        for row in mine:
            groups.setdefault((row[ev.COL["date"]], row[ev.COL["hour"]]), []).append(row)
        lakes[(topic, partition)] = {k: ev.lake_batch(g) for k, g in groups.items()}
        rows.extend(mine)
    return ev.store_rows(rows, [], {}, True), lakes


def test_decode_chunk_builds_the_store_and_lake_batches_of_several_partitions_and_hours() -> None:
    hour = 3_600_000
    first = (pub(ts=TS - hour, keys="k1") + sub_before() + pub(ts=TS, msg_id="B" * 32)).encode()
    second = (sub_after(ts=TS + hour) + pub(ts=TS - hour, msg_id="C" * 32, keys="z y")).encode()
    messages = [
        (TOPIC, 0, [(5, first, "10.0.0.1"), (6, second, None)]),
        (TOPIC, 1, [(2, second, "10.0.0.2")]),
    ]
    chunk = ev.decode_chunk(messages, INGEST)
    reference, lakes = _row_by_row(messages)
    assert chunk.store.events == reference.events
    assert [e[0] for e in chunk.store.events] == list(range(7))
    assert chunk.store.key_rows == reference.key_rows
    # positions run on over the partitions; the second partition's Pub of C indexes nothing
    assert [k[0] >> ev.KEY_SHIFT for k in chunk.store.key_rows] == [0, 2, 2, 4, 4]
    assert chunk.store.key_msg_ids == reference.key_msg_ids == [MSG_ID, "B" * 32, "C" * 32]
    for key, part in chunk.partitions.items():
        # one batch per hour, in order of first appearance, each in the events' order
        assert list(part.lake) == list(lakes[key])
        for hour_key, batch in part.lake.items():
            assert batch.schema == lake.arrow_schema()
            assert batch.equals(lakes[key][hour_key])
    assert len(chunk.partitions[(TOPIC, 0)].lake) == 3


def test_store_rows_from_columns_and_from_events_are_the_same_batch() -> None:
    value = (pub() + sub_before() + sub_after()).encode()
    rows, _ = ev.decode_message(TOPIC, 3, 9, value, INGEST, "10.0.0.1")
    batch = ev.store_rows(rows, [], {(TOPIC, 3): 10}, True)
    events = [(i, *row[: len(ev.STORE_ROW)]) for i, row in enumerate(rows)]
    same = ev.StoreRows(events, batch.key_rows, batch.key_msg_ids, [], {(TOPIC, 3): 10}, True)
    assert batch.events == events and len(batch) == 3
    assert same.columns == batch.columns and same == batch
    with pytest.raises(ValueError, match="columns"):
        ev.StoreRows.from_columns(batch.columns[1:], [], [], [], {}, True)
    with pytest.raises(ValueError, match="different lengths"):
        ev.StoreRows.from_columns([*batch.columns[:-1], ()], [], [], [], {}, True)


_VALUES = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8))


@st.composite
def _column_batches(draw: st.DrawFn) -> ev.StoreRows:
    n = draw(st.integers(0, 12))
    columns = []
    for _ in ev.STORE_ROW:
        if draw(st.booleans()):
            columns.append((draw(_VALUES),) * n)  # one value throughout: travels packed
        else:
            columns.append(tuple(draw(st.lists(_VALUES, min_size=n, max_size=n))))
    return ev.StoreRows.from_columns(
        columns,
        [(0, "k", "m", None, 1)],
        ["m"],
        [{"reason": "r"}],
        {("t", 0): n},
        draw(st.booleans()),
        [("t", 0, 1, "K")],
        draw(
            st.none()
            | st.tuples(
                st.lists(
                    st.none() | st.sampled_from(["10.0.0.9:10911", "[::1]:1"]),
                    min_size=n,
                    max_size=n,
                ),
                st.lists(st.none() | st.integers(0, 2**16), min_size=n, max_size=n),
                st.lists(st.none() | st.integers(0, 2**48), min_size=n, max_size=n),
            ).map(lambda cs: [tuple(c) for c in cs])
        ),
    )


@given(_column_batches())
@settings(max_examples=200, deadline=None)
def test_a_batch_comes_back_from_the_worker_pipe_unchanged(batch: ev.StoreRows) -> None:
    back = pickle.loads(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == batch
    assert back.events == batch.events
    assert (back.key_rows, back.key_msg_ids, back.quarantine) == (
        batch.key_rows,
        batch.key_msg_ids,
        batch.quarantine,
    )
    assert (back.progress, back.ordered, back.message_keys, back.places) == (
        batch.progress,
        batch.ordered,
        batch.message_keys,
        batch.places,
    )


def test_a_column_of_one_value_is_pickled_once() -> None:
    value = (pub() + sub_before() + sub_after()).encode() * 100
    rows, _ = ev.decode_message(TOPIC * 20, 3, 9, value, INGEST, "10.0.0.1")
    batch = ev.store_rows(rows, [], {}, True)
    # the 620-character trace topic of 300 events: once, not 300 memo references
    assert len(pickle.dumps(batch)) < len(pickle.dumps(batch.events)) - 250


@pytest.mark.parametrize(
    ("values", "type_"),
    [
        (("a", "a", "a"), "string"),
        ((None, None), "string"),
        ((7, 7, 7, 7), "int32"),
        ((False, False), "bool"),
        ((1, 2, 1), "int64"),
        ((5,), "int64"),
        ((), "string"),
    ],
)
def test_a_lake_column_of_one_value_is_the_array_of_its_values(values: tuple, type_: str) -> None:
    import pyarrow as pa

    t = pa.type_for_alias(type_)
    assert ev._lake_array(values, t).equals(pa.array(values, type=t))
