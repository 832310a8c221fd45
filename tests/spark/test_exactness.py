"""The job's per-(message, group[, client]) classification equals the generator's ground truth,
row for row: every outcome, late events inside and past the horizon, duplicates, orphans,
retries, DLQ, a group subscribing mid-window, tag filters, broadcasting, clock skew, delayed and
transactional messages, send retries, empty msgIds."""

from __future__ import annotations

import collections
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tracemq_collector.store import TraceStore
from tracemq_spark.job import INFORMATIONAL, OUTCOMES, run

from tests.spark.conftest import Lake, params
from tests.support.seaweed import download, s3_lake, seaweedfs, write_two_owners

DAY = 86_400_000


@pytest.fixture(scope="module")
def result(spark: Any, lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("exact") / "out"
    res = run(spark, params(lake, out, keep_classified=True))
    return res, out


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["window_start"], r["msg_id"], r["group"], r["client_host"], r["outcome"])


def _diff(expected: collections.Counter, got: collections.Counter) -> str:
    missing = expected - got
    extra = got - expected
    lines = [f"{len(missing)} expected row(s) missing, {len(extra)} unexpected row(s):"]
    lines += [f"  - {k}" for k in sorted(missing, key=str)[:40]]
    lines += [f"  + {k}" for k in sorted(extra, key=str)[:40]]
    return "\n".join(lines)


def test_ground_truth_covers_every_outcome(lake: Lake) -> None:
    outcomes = collections.Counter(lake.gen.truth.column("outcome").to_pylist())
    assert set(OUTCOMES) <= set(outcomes), f"generator lacks {set(OUTCOMES) - set(outcomes)}"
    assert all(lake.gen.informational[k] > 0 for k in INFORMATIONAL)
    assert any(lake.gen.truth.column("skew_suspect").to_pylist())


def test_classification_equals_ground_truth(spark: Any, lake: Lake, result: Any) -> None:
    _, out = result
    from pyspark.sql import functions as F

    rows = (
        spark.read.parquet(str(Path(out) / "classified"))
        .where(~F.col("outcome").isin(INFORMATIONAL))
        .selectExpr(
            "window_start_ms AS window_start",
            "msg_id",
            "`group`",
            "client_host",
            "outcome",
            "store_to_consume_ms",
            "end_to_end_ms",
            "send_cost_ms",
            "consume_cost_ms",
        )
        .collect()
    )
    got = collections.Counter(_key(r.asDict()) for r in rows)
    expected = collections.Counter(_key(r) for r in lake.gen.truth.to_pylist())
    assert got == expected, _diff(expected, got)

    def skewed(r: Any) -> bool:
        vals = [
            r["store_to_consume_ms"],
            r["end_to_end_ms"],
            r["send_cost_ms"],
            r["consume_cost_ms"],
        ]
        return any(v is not None and (v < 0 or v > DAY) for v in vals)

    got_skew = {_key(r.asDict()) for r in rows if skewed(r)}
    expected_skew = {_key(r) for r in lake.gen.truth.to_pylist() if r["skew_suspect"]}
    assert got_skew == expected_skew, _diff(
        collections.Counter(expected_skew), collections.Counter(got_skew)
    )


def test_only_a_successful_recall_makes_a_message_recalled(
    spark: Any, lake: Lake, result: Any
) -> None:
    """A Recall with success=true (the broker recalled it) makes the message RECALLED, expected
    nowhere; one with success=false (too late: it was delivered) changes nothing."""
    _, out = result
    from pyspark.sql import functions as F

    recalls = (
        spark.read.parquet(str(lake.path))
        .where(F.col("trace_type") == "Recall")
        .select("msg_id", "success")
        .collect()
    )
    ok = {r["msg_id"] for r in recalls if r["success"]}
    refused = {r["msg_id"] for r in recalls if not r["success"]}
    assert ok and refused and not ok & refused
    rows = (
        spark.read.parquet(str(Path(out) / "classified"))
        .where(F.col("msg_id").isin(sorted(ok | refused)))
        .select("msg_id", "`group`", "outcome")
        .collect()
    )
    by_msg: dict[str, set[str]] = collections.defaultdict(set)
    for r in rows:
        by_msg[r["msg_id"]].add(r["outcome"])
    # every recalled message of the window is RECALLED and nothing else (no NOT_CONSUMED)
    assert {m: o for m, o in by_msg.items() if m in ok} == {
        m: {"RECALLED"} for m in ok if m in by_msg
    }
    assert sum(1 for m in ok if m in by_msg) == lake.gen.informational["RECALLED"]
    refused_outcomes = set().union(*(o for m, o in by_msg.items() if m in refused))
    assert "RECALLED" not in refused_outcomes and "CONSUMED" in refused_outcomes


def test_summary_counts_match_truth(lake: Lake, result: Any) -> None:
    res, _ = result
    expected = collections.Counter(lake.gen.truth.column("outcome").to_pylist())
    assert res.summary["outcomes"] == {o: expected.get(o, 0) for o in OUTCOMES}
    assert res.summary["informational"] == lake.gen.informational
    assert res.summary["anomalies"] == sum(n for o, n in expected.items() if o != "CONSUMED")


def test_anomalies_are_the_non_consumed_rows(spark: Any, lake: Lake, result: Any) -> None:
    _, out = result
    df = spark.read.parquet(str(Path(out) / "anomalies"))
    got = collections.Counter(r["outcome"] for r in df.select("outcome").collect())
    expected = collections.Counter(
        o for o in lake.gen.truth.column("outcome").to_pylist() if o != "CONSUMED"
    )
    assert got == expected
    ev = {r["outcome"]: r["evidence"] for r in df.select("outcome", "evidence").collect()}
    assert "committed offset" in ev["TRACE_LOST"]
    assert all(ev[o] for o in expected), ev


def test_dead_letters_told_by_the_traced_move_and_by_the_retry_count(
    spark: Any, lake: Lake, result: Any
) -> None:
    """Both ways of knowing are exercised: chains shorter than max_reconsume_times that end in
    a traced move to %DLQ%<group>, and full chains without it (RocketMQ's clients)."""
    _, out = result
    from pyspark.sql import functions as F

    dead = (
        spark.read.parquet(str(Path(out) / "classified"))
        .where(F.col("outcome") == "DEAD_LETTERED")
        .select("max_retry_times")
        .collect()
    )
    retries = [r["max_retry_times"] for r in dead]
    assert any(r < 16 for r in retries) and any(r >= 16 for r in retries), retries
    moves = (
        spark.read.parquet(str(lake.path))
        .where((F.col("trace_type") == "Pub") & F.col("topic").startswith("%DLQ%"))
        .count()
    )
    assert moves > 0


def test_duplicated_records_are_never_extra_attempts(spark: Any, lake: Lake, result: Any) -> None:
    """A trace send retried on a hung trace cluster writes its records two or three times: the
    copies share a requestId (consume) or a msgId (Pub) and are one attempt, one send."""
    _, out = result
    from pyspark.sql import functions as F

    consumed = (
        spark.read.parquet(str(Path(out) / "classified"))
        .where(F.col("outcome") == "CONSUMED")
        .select("attempts", "successes", "consume_events")
        .collect()
    )
    assert all(r["attempts"] == 1 and r["successes"] == 1 for r in consumed)
    # one attempt is a SubBefore and a SubAfter: more events than that are copies
    copied = [r["consume_events"] for r in consumed if r["consume_events"] > 2]
    assert copied and max(copied) >= 6, "the generator wrote no triple copies"
    pubs = (
        spark.read.parquet(str(lake.path))
        .where((F.col("trace_type") == "Pub") & F.col("success") & ~F.col("topic").startswith("%"))
        .groupBy("msg_id")
        .count()
        .where(F.col("count") > 1)
        .count()
    )
    assert pubs > 0, "the generator wrote no Pub copies"


def test_partial_trace_loss_is_trace_incomplete_with_its_evidence(spark: Any, result: Any) -> None:
    """A lost SubAfter (original queue's offset passed) and a lost retry (its retry copy's
    queue's offset passed) are both there, told apart by their evidence."""
    _, out = result
    from pyspark.sql import functions as F

    ev = [
        r["evidence"]
        for r in spark.read.parquet(str(Path(out) / "anomalies"))
        .where(F.col("outcome") == "TRACE_INCOMPLETE")
        .select("evidence")
        .collect()
    ]
    assert all(e.startswith("consumed by the offsets, trace incomplete: ") for e in ev), ev
    assert any("retry copy #" in e and "%RETRY%" in e for e in ev), ev
    assert any("the committed offset" in e and "queue offset" in e for e in ev), ev


def _exact_figures(values: list[int]) -> dict[str, Any]:
    ok = sorted(v for v in values if 0 <= v <= DAY)
    out: dict[str, Any] = {"count": len(ok), "skew_suspect": len(values) - len(ok)}
    out["max"] = ok[-1] if ok else None
    for q in (50, 90, 99):
        out[f"p{q}"] = ok[max(1, -(-len(ok) * q // 100)) - 1] if ok else None
    return out


def _close(got: int | None, exact: int | None) -> bool:
    """Exact below 256 ms, within 1/256 of the value above (8 significant bits)."""
    if got is None or exact is None:
        return got is exact
    return got == exact if exact < 256 else abs(got - exact) <= exact / 256


def test_latency_figures_against_exact_percentiles(spark: Any, result: Any) -> None:
    """The summary's percentiles (per topic and group, and overall) against exact ranks over
    the classified rows: counts, max and skew suspects exact, percentiles exact below 256 ms
    and within 0.4 % above; the log2 histograms hold every value."""
    from tracemq_spark.job import METRICS

    res, out = result
    rows = spark.read.parquet(str(Path(out) / "classified")).collect()
    summary = res.summary
    per_tg = {(x["topic"], x["group"]): x["latency"] for x in summary["by_topic_group"]}
    checked = 0
    for m in METRICS:
        everything = [r[m] for r in rows if r[m] is not None]
        exact = _exact_figures(everything)
        got = summary["latency"][m]
        assert {k: got[k] for k in ("count", "skew_suspect", "max")} == {
            k: exact[k] for k in ("count", "skew_suspect", "max")
        }, m
        for q in ("p50", "p90", "p99"):
            assert _close(got[q], exact[q]), (m, q, got[q], exact[q])
        hist = summary["latency_histograms_log2_ms"][m]
        assert sum(n for _, n in hist) == len(everything)
        for (topic, group), lat in per_tg.items():
            vals = [
                r[m]
                for r in rows
                if r["topic"] == topic and r["group"] == group and r[m] is not None
            ]
            ex = _exact_figures(vals)
            assert lat[m]["count"] == ex["count"] and lat[m]["max"] == ex["max"], (topic, group)
            assert lat[m]["skew_suspect"] == ex["skew_suspect"], (topic, group, m)
            for q in ("p50", "p90", "p99"):
                assert _close(lat[m][q], ex[q]), (topic, group, m, q, lat[m][q], ex[q])
                checked += ex["count"] > 0
    assert checked > 20
    # the values above 256 ms are there to be approximated (the generator's latencies span them)
    assert any(summary["latency"][m]["max"] > 10_000 for m in METRICS)


def test_latency_buckets_hold_their_values(spark: Any) -> None:
    """Every value lies in [bucket start, start + width), widths are 2^(k-7) for values in
    [2^k, 2^(k+1)) — around every power of two, where a double logarithm could round wrong."""
    from pyspark.sql import functions as F
    from tracemq_spark import latency

    values = sorted(
        {0, 1, 2, 255, 256, 257, 86_400_000, 86_400_001, -5}
        | {(1 << k) + d for k in range(8, 40) for d in (-1, 0, 1)}
    )
    df = spark.createDataFrame([(v,) for v in values], "v long")
    b, w = latency.bucket(F.col("v"), DAY)
    got = {r["v"]: (r["b"], r["w"]) for r in df.select("v", b.alias("b"), w.alias("w")).collect()}
    for v in values:
        start, width = got[v]
        if v < 0:
            assert start == latency.SKEW_NEGATIVE
        elif v > DAY:
            assert start == latency.SKEW_ABSURD
        elif v < 256:
            assert (start, width) == (v, 1)
        else:
            assert width == 1 << (v.bit_length() - 8), v
            assert start <= v < start + width and start % width == 0, v


def test_anomalies_show_the_first_pubs_strings(spark: Any, lake: Lake, result: Any) -> None:
    """Each anomaly with a msgId shows the producer's strings (tags, keys, store address,
    producer group) of its first Pub in the read range — the first successful one, else the
    first failed; ties by the strings; a consumer's move to %DLQ% is no send — checked against
    the lake's own rows, read with pyarrow; an orphan (no Pub) shows none."""
    import pyarrow.dataset as ds

    res, out = result
    horizon = params(lake, out).horizon_ms
    lo, hi = res.from_ms - horizon, res.to_ms + horizon
    cols = ["trace_type", "msg_id", "timestamp", "success", "topic", "tags", "keys"]
    lake_rows = (
        ds.dataset(str(lake.path), format="parquet")
        .to_table(columns=[*cols, "store_addr", "group_name"])
        .to_pylist()
    )

    def nulls_first(v: Any) -> tuple[int, Any]:
        return (0, "") if v is None else (1, v)

    first: dict[str, tuple[Any, ...]] = {}
    for r in lake_rows:
        if (
            r["trace_type"] != "Pub"
            or not r["msg_id"]
            or (r["topic"] or "").startswith("%DLQ%")
            or not lo <= r["timestamp"] < hi
        ):
            continue
        strings = (r["tags"], r["keys"], r["store_addr"], r["group_name"])
        order = (0 if r["success"] is True else 1, r["timestamp"], *map(nulls_first, strings))
        if r["msg_id"] not in first or order < first[r["msg_id"]][0]:
            first[r["msg_id"]] = (order, strings)
    got = (
        spark.read.parquet(str(Path(out) / "anomalies"))
        .where("msg_id IS NOT NULL")
        .select("msg_id", "outcome", "tags", "keys", "store_addr", "producer_group")
        .collect()
    )
    wrong = [
        (r["msg_id"], r["outcome"], tuple(r)[2:], first.get(r["msg_id"], (None, None))[1])
        for r in got
        if tuple(r)[2:] != first.get(r["msg_id"], (None, (None,) * 4))[1]
    ]
    assert not wrong, f"{len(wrong)} of {len(got)} anomalies: {wrong[:10]}"
    with_pub = [r for r in got if r["msg_id"] in first]
    assert sum(r["keys"] is not None for r in with_pub) > 100
    assert any(r["outcome"] == "PUB_FAILED" for r in with_pub)
    assert any(r["outcome"] == "ORPHAN_CONSUME" and r["msg_id"] not in first for r in got)


def test_compaction_leftovers_are_not_read_twice(
    spark: Any, lake: Lake, result: Any, tmp_path: Path
) -> None:
    """A collector compaction renames its merged file into place before deleting the sources:
    a reader that lists the lake in between sees both. The job applies the lake's rule (a file
    named in another's ``compacted_from`` footer list is superseded) and reads every row once."""
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tracemq import lake as lake_contract

    res, out = result
    copy = tmp_path / "lake"
    shutil.copytree(lake.path, copy)
    merged = sources = 0
    for hour_dir in sorted(copy.glob("date=*/hour=*")):
        parts = sorted(hour_dir.glob("part-*.parquet"))
        if len(parts) < 2:
            continue
        table = pa.concat_tables([pq.read_table(p, partitioning=None) for p in parts])
        meta = dict(table.schema.metadata or {})
        meta[lake_contract.COMPACTED_FROM_KEY] = json.dumps([p.name for p in parts]).encode()
        name = f"compacted-{0:020d}-{len(table):020d}-{len(parts):05d}.parquet"
        pq.write_table(table.replace_schema_metadata(meta), hour_dir / name)
        # the sources stay: the crash (or the listing) came before their deletion
        merged += 1
        sources += len(parts)
    assert merged > 0, "the lake has no hour with two files: the test proves nothing"
    again = run(
        spark, params(Lake(lake.gen, copy, lake.subscriptions, lake.offsets), tmp_path / "o")
    )
    assert again.summary["outcomes"] == res.summary["outcomes"]
    assert again.summary["informational"] == res.summary["informational"]
    # (the classification would absorb most doubled rows: it deduplicates Pubs and pairs
    # consume events; the event counts show which files were read)
    for k in ("events_read", "events_in_window", "events_by_type"):
        assert again.summary["input"][k] == res.summary["input"][k], k
    assert again.summary["input"]["files"] == res.summary["input"]["files"] - sources + merged
    assert again.summary["input"]["files_superseded"] == sources


def test_the_job_over_a_shared_bucket_equals_the_job_over_the_local_lake(
    spark: Any, lake: Lake, result: Any, tmp_path: Path
) -> None:
    """The lake written by two collectors into one bucket of a real S3-compatible store
    (SeaweedFS) through an owner change and a concurrent compaction, its objects downloaded to
    a local directory: the job gives what it gives over the local lake. (Reading the bucket
    itself needs hadoop-aws, which this machine lacks; the S3A settings: tests/unit/
    test_spark_s3a.py.)"""
    with (
        seaweedfs(tmp_path / "seaweed") as endpoint,
        TraceStore(tmp_path / "a.db") as store_a,
        TraceStore(tmp_path / "b.db") as store_b,
    ):
        a, b = s3_lake(endpoint, "traces", store_a), s3_lake(endpoint, "traces", store_b)
        partitions = write_two_owners(lake.path, a, b)
        later = 10**15  # every hour of the lake has ended
        threads = [
            threading.Thread(target=a.compact, args=(later, partitions)),
            threading.Thread(target=b.compact, args=(later, partitions)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        copy = tmp_path / "copy"
        download(a.fs, a.root.as_posix(), copy)
    assert any(p.name.startswith("compacted-") for p in copy.rglob("*.parquet"))

    local, local_out = result  # the job over the local lake, with the classified rows
    bucket = run(
        spark, params(replace(lake, path=copy), tmp_path / "out-bucket", keep_classified=True)
    )
    assert bucket.summary["outcomes"] == local.summary["outcomes"]
    cols = ["window_start_ms", "msg_id", "`group`", "client_host", "outcome"]

    def classified(out: Path) -> Counter[tuple[Any, ...]]:
        return Counter(
            map(tuple, spark.read.parquet(str(out / "classified")).selectExpr(*cols).collect())
        )

    rows = classified(Path(local_out))
    assert sum(rows.values()) > 1000
    assert classified(tmp_path / "out-bucket") == rows
