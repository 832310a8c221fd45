"""The classification's JVM path (:mod:`tracemq_spark.cogroup`: one pass per msgId over its
Pub, consume and last-delivery rows, co-grouped) against the DataFrame steps of
:mod:`tracemq_spark.classify`, the reference: the same classified rows, as a multiset, on
hand-made cases — every outcome, retries, dead-letter copies and moves, transactions, orphans
inside and outside the read range, lost traces, broadcasting clients, duplicated records."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Column, DataFrame
from tracemq_spark import classify, cogroup
from tracemq_spark.fs import HadoopFS
from tracemq_spark.input_files import DeliveryRow, OffsetRow, SubRow
from tracemq_spark.job import Params

from tests.spark.test_stages import (
    BROKER,
    F0,
    HORIZON,
    MIN,
    READ_LO,
    T0,
    TOPIC,
    _events,
    _hash,
    consume,
    pub,
)

G, H, BC = "g", "h", "bc"
_MONTH = int(dt.datetime(2024, 3, 1, tzinfo=dt.UTC).timestamp() * 1000)


def _msg_id(created_ms: int, n: int) -> str:
    """A RocketMQ-style msgId (32 hex digits) created at ``created_ms`` (read in UTC)."""
    return f"0A00000100{n:010X}{created_ms - _MONTH:08X}0001"


@pytest.fixture(scope="module")
def jvm(spark: Any) -> None:
    if not cogroup.available(spark):
        if shutil.which("javac") is None:
            pytest.skip("no javac: the JVM path is not built (make setup)")
        pytest.fail(f"the JVM path is not on the session: {cogroup.JAR} (make setup)")


def _cases() -> list[dict[str, Any]]:
    orphan_in = _msg_id(F0 - 10 * MIN, 1)  # created inside the read range: an orphan
    orphan_old = _msg_id(F0 - 120 * MIN, 2)  # created before it: left alone
    up = "0A0000011F9018B4AAC2650B5A630000"
    rows: list[dict[str, Any]] = [
        pub("NOT_CONSUMED", F0 + MIN, queue_offset=1),
        pub("PENDING", T0 - 10 * MIN, queue_offset=2),
        pub("CONSUMED", F0 + MIN, queue_offset=3),
        *consume("CONSUMED", G, "c1", F0 + 2 * MIN, ok=True),
        pub("DUPLICATE", F0 + MIN, queue_offset=4),
        *consume("DUPLICATE", G, "d1", F0 + 2 * MIN, ok=True),
        *consume("DUPLICATE", G, "d2", F0 + 3 * MIN, ok=True),
        pub("AFTER_RETRY", F0 + MIN, queue_offset=5),
        *consume("AFTER_RETRY", G, "a1", F0 + 2 * MIN, ok=False),
        *consume("AFTER_RETRY", G, "a2", F0 + 3 * MIN, ok=True, retry=1),
        pub("FAILED", F0 + MIN, queue_offset=6),
        *consume("FAILED", G, "f1", F0 + 2 * MIN, ok=False),
        pub("IN_FLIGHT", F0 + MIN, queue_offset=7),
        *consume("IN_FLIGHT", G, "i1", F0 + 2 * MIN, ok=None),
        pub("RECALLED", F0 + MIN, queue_offset=8),
        {"trace_type": "Recall", "timestamp": F0 + 2 * MIN, "msg_id": "RECALLED"},
        pub("PUB_FAILED", F0 + MIN, success=False, queue_offset=9),
        # send retries: failed, then stored twice; the first success wins
        pub("SEND_RETRY", F0 + MIN, success=False, queue_offset=40),
        pub("SEND_RETRY", F0 + 2 * MIN, queue_offset=41),
        pub("SEND_RETRY", F0 + 3 * MIN, queue_offset=42),
        *consume("SEND_RETRY", G, "sr1", F0 + 4 * MIN, ok=True),
        pub("TRACE_LOST", F0 + MIN, queue_id=1, queue_offset=10),
        pub("TRACE_INCOMPLETE", F0 + MIN, queue_id=1, queue_offset=11),
        *consume("TRACE_INCOMPLETE", G, "t1", F0 + 2 * MIN, ok=None),
        # a failure of the last delivery keeps it FAILED though the offset is past it
        pub("FAILED_LAST", F0 + MIN, queue_id=1, queue_offset=12),
        *consume("FAILED_LAST", G, "fl1", F0 + 2 * MIN, ok=False),
        pub("DEAD_LETTERED", F0 + MIN, queue_offset=12),
        *consume("DEAD_LETTERED", G, "x1", F0 + 2 * MIN, ok=False),
        # dead-lettered by the traced move, and by the retry count (RocketMQ's clients)
        pub("MOVED", F0 + MIN, queue_offset=20),
        *consume("MOVED", G, "m1", F0 + 2 * MIN, ok=False),
        pub("MOVED", F0 + 3 * MIN, topic="%DLQ%g", group_name=G),
        pub("RETRIED_OUT", F0 + MIN, queue_offset=21),
        *consume("RETRIED_OUT", G, "r16", F0 + 2 * MIN, ok=False, retry=16),
        # retried through %RETRY%g (copies): the last one's queue is past it
        pub("RETRY_COPY", F0 + MIN, queue_offset=22),
        *consume("RETRY_COPY", G, "rc1", F0 + 2 * MIN, ok=False),
        *consume("RETRY_COPY", G, "rc2", F0 + 3 * MIN, ok=None, retry=1),
        pub("RETRY_COPY_LOST", F0 + MIN, queue_offset=23),
        pub("UNEXPECTED", F0 + MIN, topic="other", queue_offset=13),
        *consume("UNEXPECTED", G, "u1", F0 + 2 * MIN, ok=True, topic="other"),
        # tag not accepted by h's subscription: NO_EXPECTED_GROUP and h's consume unexpected
        pub("TAG_B", F0 + MIN, tags="b", queue_offset=24),
        *consume("TAG_B", H, "tb1", F0 + 2 * MIN, ok=True),
        *consume("", G, "o1", F0 + 2 * MIN, ok=True),
        *consume(orphan_in, G, "o2", F0 + 2 * MIN, ok=True),
        *consume(orphan_old, G, "o3", F0 + 2 * MIN, ok=True),
        # an orphan first consumed after the window: the next run's
        *consume(_msg_id(F0 + 50 * MIN, 3), G, "o4", T0 + MIN, ok=True),
        pub("ROLLED_BACK", F0 + MIN, msg_type=1, queue_offset=14),
        {
            "trace_type": "EndTransaction",
            "timestamp": F0 + 2 * MIN,
            "msg_id": "ROLLED_BACK",
            "transaction_state": "ROLLBACK_MESSAGE",
        },
        pub("TX_UNRESOLVED", F0 + MIN, msg_type=1, queue_offset=15),
        pub("TX_COMMIT", F0 + MIN, msg_type=1, queue_offset=25),
        {
            "trace_type": "EndTransaction",
            "timestamp": F0 + 2 * MIN,
            "msg_id": "TX_COMMIT",
            "transaction_state": "COMMIT_MESSAGE",
        },
        *consume("TX_COMMIT", G, "tx1", F0 + 3 * MIN, ok=True),
        # delayed: stored in the schedule queue (its offset says nothing), pending longer
        pub("DELAYED", T0 - 20 * MIN, msg_type=3, queue_id=1, queue_offset=2),
        pub("FAILED_ELSEWHERE", F0 + MIN, topic="other", success=False, queue_offset=16),
        *consume("FAILED_ELSEWHERE", G, "fe1", F0 + 2 * MIN, ok=True, topic="other"),
        pub("LATE_ELSEWHERE", T0 + MIN, topic="other", queue_offset=17),
        *consume("LATE_ELSEWHERE", G, "le1", T0 + 2 * MIN, ok=True, topic="other"),
        # published before the window (looked back), consumed in it: not this run's message
        pub("EARLY", F0 - 5 * MIN, queue_offset=26),
        *consume("EARLY", G, "e1", F0 + MIN, ok=True),
        # a trace record written twice (a trace send retried): one attempt
        *consume("CONSUMED", G, "c1", F0 + 2 * MIN, ok=True),
        pub("CONSUMED", F0 + MIN, queue_offset=3),
        # a SubAfter whose SubBefore was lost; an old-format SubAfter without group
        pub("HALF_PAIRS", F0 + MIN, queue_offset=27),
        {
            "trace_type": "SubAfter",
            "timestamp": F0 + 2 * MIN,
            "group_name": G,
            "msg_id": "HALF_PAIRS",
            "request_id": "hp1",
            "success": False,
        },
        {
            "trace_type": "SubBefore",
            "timestamp": F0 + 3 * MIN,
            "group_name": G,
            "topic": TOPIC,
            "msg_id": "HALF_PAIRS",
            "request_id": "hp2",
            "retry_times": 1,
        },
        {
            "trace_type": "SubAfter",
            "timestamp": F0 + 4 * MIN,
            "msg_id": "HALF_PAIRS",
            "request_id": "hp2",
            "success": True,
        },
        # consume events without a requestId or a group
        pub("NO_RID", F0 + MIN, queue_offset=28),
        {
            "trace_type": "SubBefore",
            "timestamp": F0 + 2 * MIN,
            "group_name": G,
            "topic": TOPIC,
            "msg_id": "NO_RID",
        },
        {
            "trace_type": "SubBefore",
            "timestamp": F0 + 2 * MIN,
            "topic": TOPIC,
            "msg_id": "NO_RID",
            "request_id": "nr2",
        },
        # a broadcasting group: one outcome per consuming client
        pub("BCAST", F0 + MIN, queue_offset=30),
        *consume("BCAST", BC, "b1", F0 + 2 * MIN, ok=True, client_host="10.1.0.1"),
        *consume("BCAST", BC, "b2", F0 + 2 * MIN, ok=False, client_host="10.1.0.2"),
        # a client the pre-flight scan never saw
        *consume("BCAST", BC, "b3", F0 + 2 * MIN, ok=True, client_host="10.1.0.9"),
        pub("BCAST_NONE", F0 + MIN, queue_offset=31),
        # two ids in two cases: two messages
        pub(up, F0 + MIN),
        pub(up.lower(), F0 + 2 * MIN),
        *consume(up, G, "up1", F0 + 3 * MIN, ok=True),
        # a consume with an empty msgId and no request id
        {"trace_type": "SubBefore", "timestamp": F0 + 5 * MIN, "group_name": H, "msg_id": ""},
    ]
    return rows


def _params(**kw: Any) -> Params:
    """The job's parameters over the cases' range (msgIds read in UTC)."""
    return Params(
        lake="lake",
        out="out",
        from_ms=F0,
        to_ms=T0,
        subscriptions="s",
        offsets="o",
        horizon_ms=HORIZON,
        msgid_timezone="UTC",
        **kw,
    )


def _inputs(spark: Any, tmp_path: Path) -> dict[str, Any]:
    subs = [
        SubRow(G, TOPIC, None, F0 - 60 * MIN, T0, False),
        SubRow(H, TOPIC, "a", F0 - 60 * MIN, F0 + 30 * MIN, False),
        SubRow(H, TOPIC, "c", F0 + 20 * MIN, T0, False),
        SubRow(BC, TOPIC, None, F0 - 60 * MIN, T0, True),
    ]
    clients = [
        (BC, TOPIC, "10.1.0.1"),
        (BC, TOPIC, "10.1.0.2"),
        (BC, TOPIC, "10.1.0.3"),
        # a clustering group's client: it must not multiply g's rows
        (G, "other", "10.2.0.1"),
    ]
    offsets = [
        OffsetRow(G, TOPIC, BROKER, 0, "", 0),
        OffsetRow(G, TOPIC, BROKER, 1, "", 50),
        OffsetRow(H, TOPIC, BROKER, 0, "", 25),
        OffsetRow(BC, TOPIC, BROKER, 0, "10.1.0.1", 100),
        OffsetRow(BC, TOPIC, BROKER, 0, "10.1.0.3", 100),
    ]
    deliveries = [
        DeliveryRow("DEAD_LETTERED", G, None, None, None, 7),
        DeliveryRow("RETRY_COPY", G, 1, 60, 61, None),
        DeliveryRow("RETRY_COPY_LOST", G, 2, 70, 71, None),
        DeliveryRow("TAG_B", H, 1, 80, 81, None),
        DeliveryRow("NOBODY", G, 1, 1, 2, None),
    ]
    return {
        "subs": classify.subs_frame(spark, subs, 2 * MIN),
        "clients": classify.clients_frame(spark, clients),
        "offsets": classify.offsets_frame(spark, offsets),
        "deliveries": classify.deliveries_frame(
            spark, HadoopFS(spark), str(tmp_path / "_deliveries"), deliveries
        ),
        "bh": [_hash(spark, BC)],
    }


def _both(
    spark: Any,
    ev: DataFrame,
    inp: dict[str, Any],
    p: Params,
    cutoff: int,
    sort_key: Callable[[Column, Column], Column] | None = None,
    by_creation: bool = False,
) -> tuple[DataFrame, DataFrame]:
    """The classified rows by the DataFrame steps (as ``job._Context.classified_frame``
    composes them) and by the JVM path (its input keyed by ``sort_key``, default the
    msgId's hash; sorted by that key or, ``by_creation``, by the task's own key)."""
    kw = {"f_ms": F0, "t_ms": T0, "read_lo": READ_LO, "cutoff": cutoff}
    pubs = classify.pubs(ev, f_ms=F0, t_ms=T0, base=READ_LO, n_parts=3)
    exp = classify.expected_deliveries(pubs, inp["subs"], inp["clients"])
    att = classify.attempts(ev, bh=inp["bh"], n_parts=3)
    agg = classify.consumed(att, pubs, inp["deliveries"])
    ref = classify.meet(exp, agg, inp["offsets"], inp["deliveries"], p, **kw)
    got = cogroup.classified(
        spark,
        classify.cogroup_input(ev, inp["deliveries"], base=READ_LO, n_parts=3, sort_key=sort_key),
        inp["subs"],
        inp["clients"],
        inp["offsets"],
        inp["bh"],
        p,
        classify.classified_schema(p.keep_classified),
        by_creation=by_creation,
        **kw,
    )
    return ref, got


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.mark.parametrize("keyed", ["hash", "created", "by_creation"])
@pytest.mark.parametrize("keep_classified", [True, False])
def test_jvm_path_gives_the_dataframe_paths_rows(
    spark: Any, tmp_path: Path, jvm: None, keep_classified: bool, keyed: str
) -> None:
    """Keyed by the msgId's hash, by the sort key's UDF on the map side, or by the hash and
    sorted by the task's own key (the job's way)."""
    ev = _events(spark, _cases())
    p = _params(keep_classified=keep_classified)
    key = cogroup.sort_key(spark) if keyed == "created" else None
    ref, got = _both(
        spark,
        ev,
        _inputs(spark, tmp_path),
        p,
        cutoff=T0 + 15 * MIN,
        sort_key=key,
        by_creation=keyed == "by_creation",
    )
    assert got.schema == ref.schema
    want = _rows(ref)
    assert _rows(got) == want
    outcomes = {r[0] for r in want}
    # the cases reach every outcome the rules have
    assert outcomes >= {
        "NOT_CONSUMED", "PENDING", "CONSUMED", "DUPLICATE", "CONSUMED_AFTER_RETRY", "FAILED",
        "IN_FLIGHT", "RECALLED", "PUB_FAILED", "TRACE_LOST", "TRACE_INCOMPLETE",
        "DEAD_LETTERED", "NO_EXPECTED_GROUP", "UNEXPECTED_GROUP", "ORPHAN_CONSUME",
        "ROLLED_BACK", "TX_UNRESOLVED",
    }  # fmt: skip
    # one orphan of the two with an id inside the window is created in the read range
    orphans = [r for r in ref.collect() if r["outcome"] == "ORPHAN_CONSUME"]
    assert len([r for r in orphans if r["msg_id"]]) == 1


def test_jvm_path_without_deliveries_and_without_broadcasting(
    spark: Any, tmp_path: Path, jvm: None
) -> None:
    ev = _events(spark, _cases())
    inp = _inputs(spark, tmp_path)
    inp["deliveries"] = None
    inp["bh"] = []
    inp["clients"] = classify.clients_frame(spark, [])
    p = _params()
    ref, got = _both(spark, ev, inp, p, cutoff=T0 + HORIZON)
    assert _rows(got) == _rows(ref)
    # split by msgId range, no deliveries' side: the same rows
    split = cogroup.RangeSplit.of(
        spark, classify.cogroup_sides(ev, None, base=READ_LO), _ranges_of(ev, "some")
    )
    assert split.deliveries is None
    by_range = cogroup.classified(
        spark,
        split,
        None,
        None,
        None,
        inp["bh"],
        p,
        classify.classified_schema(p.keep_classified),
        looked_up=cogroup.lookups(spark, inp["subs"], inp["clients"], inp["offsets"]),
        f_ms=F0,
        t_ms=T0,
        read_lo=READ_LO,
        cutoff=T0 + HORIZON,
    )
    assert _rows(by_range) == _rows(ref)


@pytest.mark.parametrize("keep_classified", [True, False])
def test_the_job_runs_the_jvm_path_when_built_and_the_dataframe_path_when_switched_off(
    spark: Any,
    lake: Any,
    tmp_path: Path,
    jvm: None,
    monkeypatch: pytest.MonkeyPatch,
    keep_classified: bool,
) -> None:
    """The whole job on the generated lake: the same outputs either way (the JVM path counts
    the tally as it classifies and, without ``--keep-classified``, keeps no CONSUMED row)."""
    from tracemq_spark.job import run

    from tests.spark.conftest import params

    outs = {}
    ways = [("jvm", "1", "1"), ("hashed", "1", "0"), ("dataframe", "0", "1")]
    if not keep_classified:
        # the hash-partitioned co-group once (with its classified rows): it differs from the
        # ranges' only in how rows reach a task, which --keep-classified does not touch
        del ways[1]
    for name, switch, ranges in ways:
        monkeypatch.setenv(cogroup.ENV_SWITCH, switch)
        monkeypatch.setenv(cogroup.RANGES_SWITCH, ranges)
        said: list[str] = []
        run(spark, params(lake, tmp_path / name, keep_classified=keep_classified), said.append)
        (path,) = [s for s in said if s.startswith("classification:")]
        assert ("co-group by msgId" in path) == (name != "dataframe"), path
        # the generator writes its files sorted by msgId, as the collector does
        assert ("msgId ranges of the sorted files" in path) == (name == "jvm"), path
        if keep_classified:
            outs[name] = spark.read.parquet(str(tmp_path / name / "classified"))
    names = [name for name, _, _ in ways]
    if keep_classified:
        assert outs["jvm"].count() > 1000
        assert _rows(outs["jvm"]) == _rows(outs["dataframe"])
        assert _rows(outs["hashed"]) == _rows(outs["dataframe"])
    # the tally (counted by the co-group's tasks on the JVM path): the same summaries
    for dataset in ("summary", "anomalies"):
        frames = [spark.read.parquet(str(tmp_path / n / dataset)) for n in names]
        ref = frames[-1]  # the DataFrame path's
        assert ref.count() > 0
        want = _rows(ref.select(*sorted(ref.columns)))
        for name, df in zip(names[:-1], frames[:-1], strict=True):
            assert _rows(df.select(*sorted(df.columns))) == want, (name, dataset)
    docs = [json.loads((tmp_path / n / "summary.json").read_text()) for n in names]
    for doc in docs:
        del doc["run"]
    assert all(doc == docs[-1] for doc in docs), names


def test_the_jvm_path_only_for_the_spark_it_was_built_for(
    spark: Any, jvm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jar uses Spark's internal classes: another Spark version (or none recorded, or the
    switch off) means the DataFrame path."""
    assert cogroup.built_for() == spark.version
    monkeypatch.setattr(cogroup, "built_for", lambda: "3.5.0")
    assert not cogroup.available(spark)
    monkeypatch.setattr(cogroup, "built_for", lambda: None)
    assert not cogroup.available(spark)
    monkeypatch.undo()
    monkeypatch.setenv(cogroup.ENV_SWITCH, "0")
    assert not cogroup.available(spark)


def test_session_conf_puts_the_jar_on_the_class_path_when_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracemq_spark.session import session_conf

    jar = tmp_path / "tracemq-spark-jvm.jar"
    monkeypatch.setattr(cogroup, "jar_path", lambda: jar)
    conf = session_conf(extra={"spark.jars": "/opt/other.jar"})
    assert conf["spark.jars"] == f"/opt/other.jar,{jar}"
    assert conf["spark.driver.extraClassPath"] == str(jar)
    monkeypatch.setattr(cogroup, "jar_path", lambda: None)
    conf = session_conf()
    assert "spark.jars" not in conf
    assert "spark.driver.extraClassPath" not in conf


def test_a_run_of_one_hash_holding_several_msgids_is_split_by_msgid(
    spark: Any, tmp_path: Path, jvm: None
) -> None:
    """Two msgIds with one xxhash64 are one run of the sorted input, their rows interleaved:
    here every row of a partition gets the same hash, in a random order."""
    from pyspark.sql import functions as F

    ev = _events(spark, _cases())
    inp = _inputs(spark, tmp_path)
    p = _params(keep_classified=True)
    kw = {"f_ms": F0, "t_ms": T0, "read_lo": READ_LO, "cutoff": T0 + HORIZON}
    ref, _ = _both(spark, ev, inp, p, cutoff=kw["cutoff"])
    cols = list(classify.COGROUP_COLS)
    collided = (
        classify.cogroup_input(ev, inp["deliveries"], base=READ_LO, n_parts=2)
        .withColumn("k", F.lit(7).cast("bigint"))
        .sortWithinPartitions(F.rand(3))
        .select(*cols)
    )
    got = cogroup.classified(
        spark,
        collided,
        inp["subs"],
        inp["clients"],
        inp["offsets"],
        inp["bh"],
        p,
        ref.schema,
        **kw,
    )
    assert _rows(got) == _rows(ref)


def _ranges_of(ev: DataFrame, how: str) -> list[str]:
    """Boundaries over the cases' msgIds: none, one per distinct msgId (every msgId a range
    of its own), or a few between them."""
    ids = sorted({r[0] for r in ev.select("msg_id").collect() if r[0]})
    if how == "none":
        return []
    if how == "each":
        return [i for i in ids if i > "\u0001"]
    return ["0A", "D", "P", "TX", "\u00ff"]


@pytest.mark.parametrize(
    ("keep_classified", "how"),
    # a range per msgId ("each": a Spark job per range) once: what --keep-classified changes is
    # the classification, which "none" and "some" check both ways
    [(True, "none"), (True, "each"), (True, "some"), (False, "none"), (False, "some")],
)
def test_the_ranges_path_gives_the_dataframe_paths_rows(
    spark: Any, tmp_path: Path, jvm: None, keep_classified: bool, how: str
) -> None:
    """The rows split by msgId range (each range one task, no exchange), the job's way
    (sorted by the task's key): the same rows as the DataFrame path, whichever boundaries —
    every row in exactly one range, the rows without a msgId in the first."""
    ev = _events(spark, _cases())
    inp = _inputs(spark, tmp_path)
    p = _params(keep_classified=keep_classified)
    cutoff = T0 + 15 * MIN
    ref, _ = _both(spark, ev, inp, p, cutoff=cutoff)
    bounds = _ranges_of(ev, how)
    split = cogroup.RangeSplit.of(
        spark, classify.cogroup_sides(ev, inp["deliveries"], base=READ_LO), bounds
    )
    assert split.n == len(bounds) + 1 and split.deliveries is not None
    frames = [split.frame(spark, i) for i in range(split.n)]
    whole = classify.cogroup_input(ev, inp["deliveries"], base=READ_LO, n_parts=3)
    in_ranges = [_rows(f) for f in frames]  # one job per range
    per_range = [len(rows) for rows in in_ranges]
    assert _rows(whole) == sorted((r for rows in in_ranges for r in rows), key=repr)
    if how == "each":
        # every msgId's rows in one range: more than a handful of non-empty ranges
        assert sum(1 for n in per_range if n) > 10
    got = cogroup.classified(
        spark,
        split,
        inp["subs"],
        inp["clients"],
        inp["offsets"],
        inp["bh"],
        p,
        classify.classified_schema(p.keep_classified),
        by_creation=True,
        f_ms=F0,
        t_ms=T0,
        read_lo=READ_LO,
        cutoff=cutoff,
    )
    assert got.rdd.getNumPartitions() == len(frames)
    assert _rows(got) == _rows(ref)


def _lake_file(path: Path, ids: list[str | None], rows_per_group: int, **kw: Any) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"msg_id": pa.array(ids, pa.string()), "n": list(range(len(ids)))}),
        path,
        row_group_size=rows_per_group,
        **kw,
    )
    return str(path)


def test_plan_ranges_splits_sorted_files_into_ranges_of_about_equal_rows(
    spark: Any, tmp_path: Path, jvm: None
) -> None:
    """Files sorted by msgId (nulls last, as pyarrow sorts): boundaries ascending, distinct,
    above U+0001, each a row group's least msgId, the ranges' rows near a fifth each."""
    import random

    rnd = random.Random(5)
    files, every = [], []
    for f in range(4):
        ids: list[str | None] = sorted(f"{rnd.getrandbits(64):016X}" for _ in range(3000))
        ids = ["", "\u0000x", *ids, None, None]  # (the empty id and a U+0000 key sort first)
        every += [i for i in ids if i]
        files.append(_lake_file(tmp_path / f"f{f}.parquet", ids, 64))
    bounds = cogroup.plan_ranges(spark, files, 5)
    assert bounds is not None and len(bounds) == 4
    assert bounds == sorted(set(bounds)) and all(b > "\u0001" for b in bounds)
    edges = [None, *bounds, None]
    sizes = [
        sum(1 for i in every if (lo is None or i >= lo) and (hi is None or i < hi))
        for lo, hi in zip(edges, edges[1:], strict=False)
    ]
    assert all(abs(n - len(every) / 5) < 0.15 * len(every) for n in sizes), sizes
    # fewer ranges than asked when there are fewer row groups to split at
    one = [_lake_file(tmp_path / "one.parquet", sorted(every[:100]), 50)]
    assert cogroup.plan_ranges(spark, one, 8) == [sorted(every[:100])[50]]


def test_plan_ranges_refuses_files_not_sorted_by_msgid(
    spark: Any, tmp_path: Path, jvm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any file whose row groups are out of msgId order, without msgId statistics or without
    the column, a null-only group before others, ranges that would read the rows more than 1.5
    times, one range, or the switch: no ranges (the job shuffles by hash)."""
    ids = [f"{i:08X}" for i in range(2000)]
    good = _lake_file(tmp_path / "good.parquet", ids, 100)
    assert cogroup.plan_ranges(spark, [good], 4)
    bad = {
        "unsorted": _lake_file(tmp_path / "u.parquet", ids[1000:] + ids[:1000], 100),
        "no_stats": _lake_file(tmp_path / "s.parquet", ids, 100, write_statistics=False),
        "nulls_first": _lake_file(tmp_path / "n.parquet", [None] * 100 + ids, 100),
    }
    # a file in one row group passes the order check, unsorted or not: its range spans every
    # boundary, so each range would read it whole — refused when that reads past 1.5 times
    # the rows, kept when it is small
    shuffled = ids[1::2] + ids[::2]
    bad["one_group"] = _lake_file(tmp_path / "g.parquet", shuffled, 10_000)
    for name, f in bad.items():
        assert cogroup.plan_ranges(spark, [good, f], 4) is None, name
    small = _lake_file(tmp_path / "small.parquet", shuffled[:100], 10_000)
    assert cogroup.plan_ranges(spark, [good, small], 4)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"other": ids}), tmp_path / "c.parquet", row_group_size=100)
    assert cogroup.plan_ranges(spark, [good, str(tmp_path / "c.parquet")], 4) is None
    assert cogroup.plan_ranges(spark, [good], 1) is None
    monkeypatch.setenv(cogroup.RANGES_SWITCH, "0")
    assert cogroup.plan_ranges(spark, [good], 4) is None


def test_the_generated_lake_is_written_as_the_collector_writes_it(
    spark: Any, lake: Any, jvm: None
) -> None:
    """Every file's rows in ``FILE_SORT_KEYS`` order in small row groups (``ROW_GROUP_ROWS`` by
    default), so the job splits the generated lake (the benchmarks' too) by msgId range as it
    would the collector's."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from tracemq import lake as tlake

    files = sorted(str(f) for f in lake.path.rglob("*.parquet"))
    assert len(files) > 1
    for f in files:
        pf = pq.ParquetFile(f)
        groups = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
        assert max(groups) <= 128 and sum(groups) > 0, f  # (the fixture's row groups)
        t = pf.read(columns=list(tlake.FILE_SORT_KEYS))
        order = pc.sort_indices(t, sort_keys=[(k, "ascending") for k in tlake.FILE_SORT_KEYS])
        assert np.array_equal(order.to_numpy(), np.arange(t.num_rows)), f
    bounds = cogroup.plan_ranges(spark, files, 4)
    assert bounds is not None and len(bounds) == 3


def test_the_sort_key_is_the_msgids_creation_time_above_24_bits_of_its_hash(
    spark: Any, jvm: None
) -> None:
    from pyspark.sql import functions as F

    key = cogroup.sort_key(spark)
    ipv6 = "FD00000000000000000000000003000203E90000009A4585D9287D98"
    ids = [_msg_id(_MONTH + 3_600_000, 1), _msg_id(_MONTH + 3_600_001, 1), ipv6, "M1", None]
    df = spark.createDataFrame([(i,) for i in ids], "pkey string").select(
        "pkey", F.xxhash64("pkey").alias("h")
    )
    got = {
        r["pkey"]: (r["k"], r["h"])
        for r in df.select("pkey", "h", key(F.col("pkey"), F.col("h")).alias("k")).collect()
    }
    for i, created in ((ids[0], 3_600_000), (ids[1], 3_600_001), (ipv6, 0x4585D928)):
        k, h = got[i]
        assert (k >> 24, k & 0xFFFFFF) == (created, h & 0xFFFFFF)
    # not a RocketMQ msgId (or none): its hash
    assert got["M1"][0] == got["M1"][1]
    assert got[None][0] == got[None][1]


@pytest.mark.parametrize("by_creation", [False, True])
def test_by_creation_a_task_classifies_its_msgids_in_the_order_they_were_created(
    spark: Any, tmp_path: Path, jvm: None, by_creation: bool
) -> None:
    """With ``by_creation`` each task sorts its rows by the msgId's creation time (above 24
    bits of its hash): one task's rows come out in that order; by the hash alone, not."""
    from pyspark.sql import functions as F

    created = [F0 + i * MIN for i in range(12)]
    ids = [_msg_id(c, 100 + i) for i, c in enumerate(created)]
    ev = _events(
        spark,
        [pub(i, c, queue_offset=n) for n, (i, c) in enumerate(zip(ids, created, strict=True))],
    )
    inp = _inputs(spark, tmp_path)
    p = _params(keep_classified=True)
    got = cogroup.classified(
        spark,
        classify.cogroup_input(ev, inp["deliveries"], base=READ_LO, n_parts=1),
        inp["subs"],
        inp["clients"],
        inp["offsets"],
        inp["bh"],
        p,
        classify.classified_schema(p.keep_classified),
        by_creation=by_creation,
        f_ms=F0,
        t_ms=T0,
        read_lo=READ_LO,
        cutoff=T0 + HORIZON,
    )
    # one row per message (no expected group: the subscriptions are of other topics or not)
    order = [r["msg_id"] for r in got.select("msg_id").where(F.col("msg_id").isin(ids)).collect()]
    firsts = list(dict.fromkeys(order))
    assert sorted(firsts) == sorted(ids)
    assert (firsts == ids) is by_creation


@pytest.mark.parametrize("keep_classified", [True, False])
def test_the_jvm_tally_counts_what_the_tally_of_the_classified_rows_counts(
    spark: Any, tmp_path: Path, jvm: None, keep_classified: bool
) -> None:
    """The co-group's count of its rows (:func:`cogroup.new_tally`) plus Spark's tally of the
    orphans (:func:`cogroup.tally_rest`) against :func:`latency.tally` of the DataFrame
    path's final rows, summed per key — with latencies in every kind of bucket: exact, wide,
    -1 ms, negative, over the skew limit. With a tally and without ``keep_classified`` the
    JVM path emits every row but the CONSUMED ones and the informational outcomes', which
    it only counts."""
    from pyspark.sql import functions as F
    from tracemq_spark import latency, outputs
    from tracemq_spark.params import INFORMATIONAL, METRICS, SKEW_LIMIT_MS

    cases = _cases() + [
        pub("COSTLY", F0 + MIN, queue_offset=90, cost_time=SKEW_LIMIT_MS + 5),
        *consume("COSTLY", G, "x1", F0 + 2 * MIN, ok=True, cost_time=123_456),
        pub("NEGATIVE", F0 + MIN, queue_offset=91, cost_time=-7),
        *consume("NEGATIVE", G, "x2", F0 + MIN - 1, ok=True, cost_time=-1),
        pub("EXACT", F0 + MIN, queue_offset=92, cost_time=255),
        *consume("EXACT", G, "x3", F0 + MIN + 256, ok=True, cost_time=257),
    ]
    ev = _events(spark, cases)
    inp = _inputs(spark, tmp_path)
    p = _params(keep_classified=keep_classified)
    kw = {"f_ms": F0, "t_ms": T0, "read_lo": READ_LO, "cutoff": T0 + 15 * MIN}
    ref, _ = _both(spark, ev, inp, p, cutoff=kw["cutoff"])
    acc = cogroup.new_tally(spark)
    got = cogroup.classified(
        spark,
        classify.cogroup_input(ev, inp["deliveries"], base=READ_LO, n_parts=3),
        inp["subs"],
        inp["clients"],
        inp["offsets"],
        inp["bh"],
        p,
        classify.classified_schema(p.keep_classified),
        tally=acc,
        **kw,
    )
    path = str(tmp_path / "_classified")
    got.write.parquet(path)
    got = spark.read.parquet(path)
    emitted = (
        ref if keep_classified else ref.where(~F.col("outcome").isin("CONSUMED", *INFORMATIONAL))
    )
    assert _rows(got) == _rows(emitted)
    keys = latency.LEVELS[0][1]
    metrics = list(METRICS)
    want_tally = latency.tally(outputs.final_frame(ref), metrics, SKEW_LIMIT_MS, keys)
    rest = cogroup.tally_rest(outputs.final_frame(got))
    mine = latency.tally(rest, metrics, SKEW_LIMIT_MS, keys).unionByName(
        cogroup.tally_frame(spark, acc)
    )

    def summed(t: DataFrame) -> list[tuple[Any, ...]]:
        return _rows(
            t.groupBy(*keys, "kind", "b").agg(
                F.sum("n").alias("n"), F.max("vmax").alias("vmax"), F.max("w").alias("w")
            )
        )

    want = summed(want_tally)
    assert summed(mine) == want
    kinds = {r[3] for r in want}
    assert {"CONSUMED", "ORPHAN_CONSUME", *metrics} <= kinds
    buckets = {r[4] for r in want}
    assert {-1, -2, 0, 255} <= buckets and any(b > 256 for b in buckets)
