"""The job's per-(message, group[, client]) classification equals the generator's ground truth,
row for row: every outcome, late events inside and past the horizon, duplicates, orphans,
retries, DLQ, a group subscribing mid-window, tag filters, broadcasting, clock skew, delayed and
transactional messages, send retries, empty msgIds."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from tracemq_spark.job import INFORMATIONAL, OUTCOMES, run

from tests.spark.conftest import Lake, params

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
