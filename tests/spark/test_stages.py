"""The classification's steps (:mod:`tracemq_spark.classify`) one by one, on small hand-made
frames: what each pure ``DataFrame -> DataFrame`` step makes of a few trace events, and the
outcome the last step (``meet``) gives each case. The whole-run exactness tests
(``test_exactness.py``) check the same rules on a generated lake; these name the rule that
breaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from tracemq_spark import classify
from tracemq_spark.fs import HadoopFS
from tracemq_spark.input_files import DeliveryRow, OffsetRow, SubRow
from tracemq_spark.job import Params
from tracemq_spark.session import spark_schema

MIN = 60_000
F0 = 1_710_064_800_000  # 2024-03-10T10:00Z
T0 = F0 + 60 * MIN
HORIZON = 30 * MIN
READ_LO = F0 - HORIZON
TOPIC = "orders"
BROKER = "10.0.0.1:10911"
#: defaults of the lake's non-null columns
_DEFAULTS: dict[str, Any] = {
    "cost_time": 1,
    "success": True,
    "context_code": 0,
    "store_time": 0,
    "retry_times": 0,
    "body_length": 10,
    "from_transaction_check": False,
    "trace_topic": "RMQ_SYS_TRACE_TOPIC",
    "trace_partition": 0,
    "trace_offset": 0,
    "trace_index": 0,
    "ingest_ts": 0,
    "schema_version": 1,
}


def _events(spark: Any, rows: list[dict[str, Any]]) -> DataFrame:
    schema = spark_schema()
    full = [{**_DEFAULTS, "ingest_ts": r["timestamp"], **r} for r in rows]
    return spark.createDataFrame([tuple(r.get(f.name) for f in schema) for r in full], schema)


def pub(msg_id: str, ts: int, **kw: Any) -> dict[str, Any]:
    row = {
        "trace_type": "Pub",
        "timestamp": ts,
        "group_name": "producers",
        "topic": TOPIC,
        "msg_id": msg_id,
        "tags": "a",
        "store_addr": BROKER,
        "queue_id": 0,
        "queue_offset": 100,
        "msg_type": 0,
    }
    return {**row, **kw}


def consume(
    msg_id: str, group: str, rid: str, ts: int, *, ok: bool | None, retry: int = 0, **kw: Any
) -> list[dict[str, Any]]:
    """A SubBefore, and unless ``ok`` is None (still in flight) its SubAfter."""
    base = {"group_name": group, "topic": TOPIC, "msg_id": msg_id, "request_id": rid}
    rows = [{**base, "trace_type": "SubBefore", "timestamp": ts, "retry_times": retry, **kw}]
    if ok is not None:
        rows.append({**base, "trace_type": "SubAfter", "timestamp": ts + 5, "success": ok, **kw})
    return rows


def _hash(spark: Any, s: str) -> int:
    return int(spark.range(1).select(F.xxhash64(F.lit(s))).first()[0])


def _by_pkey(df: DataFrame, *cols: str) -> dict[str, tuple[Any, ...]]:
    return {r["pkey"]: tuple(r[c] for c in cols) for r in df.collect()}


def test_pubs_first_successful_pub_wins_and_what_is_expected_anywhere(spark: Any) -> None:
    ev = _events(
        spark,
        [
            pub("RETRIED", F0 + 1000, success=False),
            pub("RETRIED", F0 + 2000),
            pub("RETRIED", F0 + 3000),  # a send retry after the success: not the first
            pub("FAILED", F0 + 1000, success=False),
            pub("RECALLED", F0 + 1000),
            {"trace_type": "Recall", "timestamp": F0 + 9000, "msg_id": "RECALLED"},
            pub("HALF_COMMIT", F0 + 1000, msg_type=1),
            {
                "trace_type": "EndTransaction",
                "timestamp": F0 + 2000,
                "msg_id": "HALF_COMMIT",
                "transaction_state": "COMMIT_MESSAGE",
            },
            pub("HALF_OPEN", F0 + 1000, msg_type=1),
            pub("LATE", T0 + 1000),  # after the window: read, not in it
            # a consumer's move to the dead-letter queue is consume-side, never a Pub
            pub("MOVED", F0 + 1000, topic="%DLQ%g1", group_name="g1"),
        ],
    )
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    got = _by_pkey(p, "pub_ts", "pub_ok", "in_window", "expected_anywhere", "recalled", "tx_commit")
    assert got == {
        "RETRIED": (F0 + 2000, True, True, True, 0, 0),
        "FAILED": (F0 + 1000, False, True, False, 0, 0),
        "RECALLED": (F0 + 1000, True, True, False, 1, 0),
        "HALF_COMMIT": (F0 + 1000, True, True, True, 0, 1),
        "HALF_OPEN": (F0 + 1000, True, True, False, 0, 0),
        "LATE": (T0 + 1000, True, False, True, 0, 0),
    }


def test_expected_deliveries_by_topic_tag_time_and_broadcast_client(spark: Any) -> None:
    subs = [
        SubRow("all", TOPIC, None, F0 - 60 * MIN, T0, False),
        SubRow("only-b", TOPIC, "b", F0 - 60 * MIN, T0, False),
        SubRow("late-joiner", TOPIC, None, F0 + 30 * MIN, T0, False),
        SubRow("bc", TOPIC, None, F0 - 60 * MIN, T0, True),
    ]
    ev = _events(
        spark,
        [
            pub("TAG_A", F0 + MIN, tags="a"),
            pub("TAG_B", F0 + 40 * MIN, tags="b"),
            pub("ELSEWHERE", F0 + MIN, topic="nobody-reads"),
            pub("LATE", T0 + MIN),
        ],
    )
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    clients = [("bc", TOPIC, "10.1.0.1"), ("bc", TOPIC, "10.1.0.2")]
    exp = classify.expected_deliveries(
        p,
        classify.subs_frame(spark, subs, 2 * MIN),
        classify.clients_frame(spark, clients),
    )
    names = {_hash(spark, g): g for g in ("all", "only-b", "late-joiner", "bc")}
    cks = {_hash(spark, c): c for _, _, c in clients} | {0: None}
    got = sorted((r["pkey"], names.get(r["group_h"]), cks[r["ck"]]) for r in exp.collect())
    assert got == [
        ("ELSEWHERE", None, None),  # no group expects it: one message-level row
        ("TAG_A", "all", None),
        ("TAG_A", "bc", "10.1.0.1"),
        ("TAG_A", "bc", "10.1.0.2"),
        ("TAG_B", "all", None),
        ("TAG_B", "bc", "10.1.0.1"),
        ("TAG_B", "bc", "10.1.0.2"),
        ("TAG_B", "late-joiner", None),
        ("TAG_B", "only-b", None),
    ]


def test_attempts_pair_by_request_id_and_consumed_counts_them(spark: Any) -> None:
    ev = _events(
        spark,
        [
            pub("M", F0 + MIN),
            # a failed delivery, its retry succeeded
            *consume("M", "g", "r1", F0 + 2 * MIN, ok=False),
            *consume("M", "g", "r2", F0 + 3 * MIN, ok=True, retry=1),
            # another group: two successes (a duplicate) and one still in flight
            *consume("M", "h", "r3", F0 + 2 * MIN, ok=True),
            *consume("M", "h", "r4", F0 + 4 * MIN, ok=True),
            *consume("M", "h", "r5", F0 + 5 * MIN, ok=None),
        ],
    )
    att = classify.attempts(ev, bh=[], n_parts=2)
    assert att.count() == 5  # one row per requestId
    assert {r["ck"] for r in att.collect()} == {0}
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    agg = classify.consumed(att, p)
    cols = (
        "attempts",
        "successes",
        "failed_attempts",
        "in_flight_attempts",
        "max_failed_retry",
        "success_retry",
        "first_consume_ts",
        "consume_events",
        "a_pub_ts",
    )
    got = {r["group_h"]: tuple(r[c] for c in cols) for r in agg.collect()}
    assert got == {
        _hash(spark, "g"): (2, 1, 1, 0, 0, 1, F0 + 2 * MIN, 4, F0 + MIN),
        _hash(spark, "h"): (3, 2, 0, 1, None, 0, F0 + 2 * MIN, 5, F0 + MIN),
    }


def test_meet_gives_each_case_its_outcome(spark: Any, tmp_path: Path) -> None:
    """Every path of the outcome rules on one message (or consume) each."""
    g = "g"
    subs = [SubRow(g, TOPIC, None, F0 - 60 * MIN, T0, False)]
    t_pending = T0 - 10 * MIN  # pub + horizon is after the cutoff
    ev = _events(
        spark,
        [
            pub("NOT_CONSUMED", F0 + MIN, queue_offset=1),
            pub("PENDING", t_pending, queue_offset=2),
            pub("CONSUMED", F0 + MIN, queue_offset=3),
            *consume("CONSUMED", g, "c1", F0 + 2 * MIN, ok=True),
            pub("DUPLICATE", F0 + MIN, queue_offset=4),
            *consume("DUPLICATE", g, "d1", F0 + 2 * MIN, ok=True),
            *consume("DUPLICATE", g, "d2", F0 + 3 * MIN, ok=True),
            pub("AFTER_RETRY", F0 + MIN, queue_offset=5),
            *consume("AFTER_RETRY", g, "a1", F0 + 2 * MIN, ok=False),
            *consume("AFTER_RETRY", g, "a2", F0 + 3 * MIN, ok=True, retry=1),
            pub("FAILED", F0 + MIN, queue_offset=6),
            *consume("FAILED", g, "f1", F0 + 2 * MIN, ok=False),
            pub("IN_FLIGHT", F0 + MIN, queue_offset=7),
            *consume("IN_FLIGHT", g, "i1", F0 + 2 * MIN, ok=None),
            pub("RECALLED", F0 + MIN, queue_offset=8),
            {"trace_type": "Recall", "timestamp": F0 + 2 * MIN, "msg_id": "RECALLED"},
            pub("PUB_FAILED", F0 + MIN, success=False, queue_offset=9),
            # the committed offset (50) is past these two: consumed, the trace is what is lost
            pub("TRACE_LOST", F0 + MIN, queue_id=1, queue_offset=10),
            pub("TRACE_INCOMPLETE", F0 + MIN, queue_id=1, queue_offset=11),
            *consume("TRACE_INCOMPLETE", g, "t1", F0 + 2 * MIN, ok=None),
            # a retry copy sits in %DLQ%g: dead-lettered whatever the traces say
            pub("DEAD_LETTERED", F0 + MIN, queue_offset=12),
            *consume("DEAD_LETTERED", g, "x1", F0 + 2 * MIN, ok=False),
            # consumed by a group nobody subscribed
            pub("UNEXPECTED", F0 + MIN, topic="other", queue_offset=13),
            *consume("UNEXPECTED", g, "u1", F0 + 2 * MIN, ok=True, topic="other"),
            # a consume without a msgId (and without a Pub): an orphan
            *consume("", g, "o1", F0 + 2 * MIN, ok=True),
            # half messages: rolled back, never resolved (the Pub's packed flags)
            pub("ROLLED_BACK", F0 + MIN, msg_type=1, queue_offset=14),
            {
                "trace_type": "EndTransaction",
                "timestamp": F0 + 2 * MIN,
                "msg_id": "ROLLED_BACK",
                "transaction_state": "ROLLBACK_MESSAGE",
            },
            pub("TX_UNRESOLVED", F0 + MIN, msg_type=1, queue_offset=15),
            # consumes nobody expected of a failed Pub, and of a Pub after the window: no
            # UNEXPECTED_GROUP row (the first is PUB_FAILED, the second not this run's message)
            pub("FAILED_ELSEWHERE", F0 + MIN, topic="other", success=False, queue_offset=16),
            *consume("FAILED_ELSEWHERE", g, "fe1", F0 + 2 * MIN, ok=True, topic="other"),
            pub("LATE_ELSEWHERE", T0 + MIN, topic="other", queue_offset=17),
            *consume("LATE_ELSEWHERE", g, "le1", T0 + 2 * MIN, ok=True, topic="other"),
        ],
    )
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    exp = classify.expected_deliveries(
        p, classify.subs_frame(spark, subs, 2 * MIN), classify.clients_frame(spark, [])
    )
    agg = classify.consumed(classify.attempts(ev, bh=[], n_parts=2), p)
    offsets = [
        OffsetRow(g, TOPIC, BROKER, 0, "", 0),  # queue 0: nothing committed past its messages
        OffsetRow(g, TOPIC, BROKER, 1, "", 50),
    ]
    fs = HadoopFS(spark)
    deliveries = classify.deliveries_frame(
        spark,
        fs,
        str(tmp_path / "_deliveries"),
        [DeliveryRow("DEAD_LETTERED", g, None, None, None, 7)],
    )
    params = Params(
        lake="lake",
        out="out",
        from_ms=F0,
        to_ms=T0,
        subscriptions="s",
        offsets="o",
        horizon_ms=HORIZON,
        keep_classified=True,
    )
    now = T0 + 15 * MIN
    df = classify.meet(
        exp,
        agg,
        classify.offsets_frame(spark, offsets),
        deliveries,
        params,
        f_ms=F0,
        t_ms=T0,
        read_lo=READ_LO,
        cutoff=min(T0 + HORIZON, now),
    )
    got = sorted(((r["msg_id"] or ""), r["outcome"]) for r in df.collect())
    assert got == sorted(
        [
            ("NOT_CONSUMED", "NOT_CONSUMED"),
            ("PENDING", "PENDING"),
            ("CONSUMED", "CONSUMED"),
            ("DUPLICATE", "DUPLICATE"),
            ("AFTER_RETRY", "CONSUMED_AFTER_RETRY"),
            ("FAILED", "FAILED"),
            ("IN_FLIGHT", "IN_FLIGHT"),
            ("RECALLED", "RECALLED"),
            ("PUB_FAILED", "PUB_FAILED"),
            ("TRACE_LOST", "TRACE_LOST"),
            ("TRACE_INCOMPLETE", "TRACE_INCOMPLETE"),
            ("DEAD_LETTERED", "DEAD_LETTERED"),
            # its topic has no subscriber (the message) and a group consumed it anyway
            ("UNEXPECTED", "NO_EXPECTED_GROUP"),
            ("UNEXPECTED", "UNEXPECTED_GROUP"),
            ("", "ORPHAN_CONSUME"),
            ("ROLLED_BACK", "ROLLED_BACK"),
            ("TX_UNRESOLVED", "TX_UNRESOLVED"),
            ("FAILED_ELSEWHERE", "PUB_FAILED"),
        ]
    )


def test_attempts_of_broadcasting_groups_are_per_client_and_dlq_moves_apart(spark: Any) -> None:
    ev = _events(
        spark,
        [
            pub("M", F0 + MIN),
            *consume("M", "bc", "b1", F0 + 2 * MIN, ok=True, client_host="10.1.0.1"),
            *consume("M", "bc", "b2", F0 + 2 * MIN, ok=False, client_host="10.1.0.2"),
            *consume("M", "g", "g1", F0 + 2 * MIN, ok=False, client_host="10.1.0.3"),
            # the consumer gave up and moved it to %DLQ%g: a Pub of the group, consume-side
            pub("M", F0 + 3 * MIN, topic="%DLQ%g", group_name="g", client_host="10.1.0.3"),
        ],
    )
    att = classify.attempts(ev, bh=[_hash(spark, "bc")], n_parts=2)
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    agg = classify.consumed(att, p)
    cols = ("attempts", "successes", "failed_attempts", "dead_lettered")
    got = {(r["group_h"], r["ck"]): tuple(r[c] for c in cols) for r in agg.collect()}
    assert got == {
        (_hash(spark, "bc"), _hash(spark, "10.1.0.1")): (1, 1, 0, 0),
        (_hash(spark, "bc"), _hash(spark, "10.1.0.2")): (1, 0, 1, 0),
        # clustering: one row whatever the client; the move is no attempt of its own
        (_hash(spark, "g"), 0): (1, 0, 1, 1),
    }
    # the move is not the message's send: the Pub facts are the original's
    assert _by_pkey(p, "pub_ts", "topic_h") == {"M": (F0 + MIN, _hash(spark, TOPIC))}


@pytest.mark.parametrize("has_deliveries", [False, True])
def test_with_deliveries_adds_the_same_columns_either_way(
    spark: Any, tmp_path: Path, has_deliveries: bool
) -> None:
    j = spark.createDataFrame([("M", _hash(spark, "g"))], "pkey string, group_h long")
    d = classify.deliveries_frame(
        spark,
        HadoopFS(spark),
        str(tmp_path / "_deliveries"),
        [DeliveryRow("M", "g", 2, 40, 41, None)] if has_deliveries else [],
    )
    assert (d is None) is not has_deliveries
    out = classify.with_deliveries(j, d)
    row = out.first()
    assert out.columns == [
        "pkey",
        "group_h",
        "retry_reconsume",
        "retry_queue_offset",
        "retry_committed",
        "dlq_queue_offset",
    ]
    want = (2, 40, 41, None) if has_deliveries else (None, None, None, None)
    assert tuple(row)[2:] == want


def test_stages_keep_a_lowercase_and_an_uppercase_id_apart(spark: Any) -> None:
    """The same hex digits in two cases are two msgIds (the lake compares strings): a key
    encoding of the msgId (e.g. its 128 bits as two longs) must not merge them, and each Pub
    must meet its own consume."""
    up = "0A0000011F9018B4AAC2650B5A630000"
    low = up.lower()
    ev = _events(
        spark,
        [
            pub(up, F0 + MIN),
            pub(low, F0 + 2 * MIN),
            *consume(up, "g", "r1", F0 + 3 * MIN, ok=True),
        ],
    )
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    assert _by_pkey(p, "pub_ts") == {up: (F0 + MIN,), low: (F0 + 2 * MIN,)}
    att = classify.attempts(ev, bh=[], n_parts=2)
    agg = classify.consumed(att, p)
    assert _by_pkey(agg, "attempts", "a_pub_ts") == {up: (1, F0 + MIN)}


def test_meet_takes_the_last_deliveries_from_either_side(spark: Any, tmp_path: Path) -> None:
    """The last deliveries reach an expected row through the expected side and a consume
    nobody expected through the consumed side (joined in ``consumed`` as the job does, or in
    ``meet`` when ``consumed`` had none): the same rows either way."""
    g, other = "g", "h"
    subs = [SubRow(g, TOPIC, None, F0 - 60 * MIN, T0, False)]
    ev = _events(
        spark,
        [
            # expected by g, failed; its copy went to %DLQ%g
            pub("DLQ", F0 + MIN, queue_offset=1),
            *consume("DLQ", g, "d1", F0 + 2 * MIN, ok=False),
            # expected by g, consumed by h (not subscribed) after a retry through %RETRY%h
            pub("ELSEWHERE", F0 + MIN, queue_offset=2),
            *consume("ELSEWHERE", g, "e1", F0 + 2 * MIN, ok=True),
            *consume("ELSEWHERE", other, "e2", F0 + 2 * MIN, ok=False),
            *consume("ELSEWHERE", other, "e3", F0 + 3 * MIN, ok=True, retry=1),
            # expected by g, never consumed, sent back once by g's consumer (trace lost)
            pub("LOST", F0 + MIN, queue_offset=3),
        ],
    )
    p = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=2)
    exp = classify.expected_deliveries(
        p, classify.subs_frame(spark, subs, 2 * MIN), classify.clients_frame(spark, [])
    )
    att = classify.attempts(ev, bh=[], n_parts=2)
    deliveries = classify.deliveries_frame(
        spark,
        HadoopFS(spark),
        str(tmp_path / "_deliveries"),
        [
            DeliveryRow("DLQ", g, None, None, None, 7),
            DeliveryRow("ELSEWHERE", other, 1, 20, 21, None),
            DeliveryRow("LOST", g, 1, 30, 31, None),
        ],
    )
    params = Params(
        lake="lake",
        out="out",
        from_ms=F0,
        to_ms=T0,
        subscriptions="s",
        offsets="o",
        horizon_ms=HORIZON,
        keep_classified=True,
    )
    offsets = classify.offsets_frame(spark, [OffsetRow(g, TOPIC, BROKER, 0, "", 0)])
    cols = (
        "msg_id",
        "outcome",
        "retry_reconsume",
        "retry_queue_offset",
        "retry_committed",
        "dlq_queue_offset",
        "committed_offset",
    )
    got = []
    for agg in (classify.consumed(att, p, deliveries), classify.consumed(att, p)):
        df = classify.meet(
            exp,
            agg,
            offsets,
            deliveries,
            params,
            f_ms=F0,
            t_ms=T0,
            read_lo=READ_LO,
            cutoff=T0 + HORIZON,
        )
        got.append(sorted(tuple(r[c] for c in cols) for r in df.collect()))
    assert got[0] == got[1]
    assert got[0] == [
        ("DLQ", "DEAD_LETTERED", None, None, None, 7, 0),
        ("ELSEWHERE", "CONSUMED", None, None, None, None, 0),
        # a consume nobody expected: its own retry copy, no committed offset (none applies)
        ("ELSEWHERE", "UNEXPECTED_GROUP", 1, 20, 21, None, None),
        # no trace, but the retry copy's queue is past it
        ("LOST", "TRACE_LOST", 1, 30, 31, None, 0),
    ]
