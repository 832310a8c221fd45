"""Outputs: the report files, a rerun replacing exactly its windows, and failures (injected at
every stage, including half-way through the commit) leaving the previous output untouched."""

from __future__ import annotations

import json
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from tracemq_spark.job import METRICS, OUTCOMES, run

from tests.spark.conftest import START, Lake, fingerprint, params

MIN = 60_000


@pytest.fixture(scope="module")
def first_run(spark: Any, lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("outputs") / "out"
    res = run(spark, params(lake, out))
    return res, out


def test_summary_json_and_report(first_run: Any) -> None:
    res, out = first_run
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {
        "run",
        "input",
        "outcomes",
        "informational",
        "by_topic",
        "by_group",
        "by_topic_group",
        "by_window",
        "latency",
        "clock_skew",
    }
    assert list(summary["outcomes"]) == OUTCOMES
    assert summary["outcomes"] == res.summary["outcomes"]
    assert len(summary["by_window"]) == 6 and len(summary["run"]["windows"]) == 6
    for m in METRICS:
        fig = summary["latency"][m]
        assert fig["count"] > 0 and 0 <= fig["p50"] <= fig["p90"] <= fig["p99"] <= fig["max"]
    assert summary["clock_skew"]["flagged"] is True
    assert summary["by_group"]["G_all_A"]["CONSUMED"] > 0
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert 'id="chart-outcomes"' in html and 'id="chart-latency"' in html
    assert 'id="skew-warning"' in html
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 600 and height > 300


def test_summary_parquet_per_window(spark: Any, first_run: Any) -> None:
    res, out = first_run
    rows = spark.read.parquet(str(out / "summary")).collect()
    assert {r["window"] for r in rows} == set(res.summary["run"]["windows"])
    assert sum(r["consumed"] for r in rows) == res.summary["outcomes"]["CONSUMED"]
    r = next(r for r in rows if r["group"] == "G_all_A")
    assert r["end_to_end_ms_p50"] <= r["end_to_end_ms_p99"]
    assert r["end_to_end_ms_count"] > 0


def test_rerun_replaces_exactly_its_window(
    spark: Any, lake: Lake, first_run: Any, tmp_path: Path
) -> None:
    _, out = first_run
    before = fingerprint(out)
    # the rerun sees no committed offsets: TRACE_LOST of its window becomes NOT_CONSUMED
    offsets = tmp_path / "no-offsets.json"
    offsets.write_text(json.dumps({"offsets": []}))
    window = "20240310T1020Z"
    run(
        spark,
        params(lake, out, from_ms=START + 20 * MIN, to_ms=START + 30 * MIN, offsets=str(offsets)),
    )
    after = fingerprint(out)
    for ds in ("anomalies", "summary"):
        part = f"{ds}/window={window}/"
        old = {k: v for k, v in before.items() if k.startswith(part)}
        new = {k: v for k, v in after.items() if k.startswith(part)}
        assert old and new and old != new, f"{part} was not replaced"
    untouched = {k: v for k, v in before.items() if "/window=" in k and f"window={window}" not in k}
    assert untouched and all(after.get(k) == v for k, v in untouched.items())
    assert {k for k in after if "/window=" in k and f"window={window}" not in k} == set(untouched)
    assert not (out / "_staging").exists()
    rows = spark.read.parquet(str(out / "anomalies")).where(f"window = '{window}'").collect()
    assert not [r for r in rows if r["outcome"] == "TRACE_LOST"]
    assert [r for r in rows if r["outcome"] == "NOT_CONSUMED"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["windows"] == [window]


@pytest.mark.parametrize(
    "stage", ["after_classified", "during_tables", "after_tables", "after_report", "during_commit"]
)
def test_failure_leaves_previous_output_untouched(
    spark: Any, lake: Lake, first_run: Any, stage: str
) -> None:
    _, out = first_run
    before = fingerprint(out)
    with pytest.raises(RuntimeError, match="injected failure"):
        run(spark, params(lake, out, fail_at=stage))
    assert fingerprint(out) == before
    assert not (out / "_staging").exists()
    # nothing of the run left running (during_tables: the tally's thread, its jobs cancelled
    # or finished before the cleanup)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("reconcile-figures")]


def test_a_latency_of_minus_one_ms_is_timestamp_granularity_not_clock_skew(spark: Any) -> None:
    """One host, two millisecond clocks (store time, SubBefore): -1 ms is not skew; -2 ms is."""
    from pyspark.sql import functions as F
    from tracemq_spark import latency
    from tracemq_spark.job import SKEW_LIMIT_MS

    rows = spark.createDataFrame(
        [("CONSUMED", v) for v in (-1, -1, 0, 3, -2)], "outcome string, store_to_consume_ms long"
    )
    t = latency.tally(rows, ["store_to_consume_ms"], SKEW_LIMIT_MS, [])
    got = {
        r["b"]: (r["n"], r["vmax"])
        for r in t.where(F.col("kind") == "store_to_consume_ms").collect()
    }
    assert got == {0: (3, 0), 3: (1, 3), latency.SKEW_NEGATIVE: (1, -2)}


def _summary_one_busy_window_of_six() -> dict[str, Any]:
    from tracemq_spark.job import INFORMATIONAL

    windows = [f"20261122T08{m:02d}Z" for m in range(0, 60, 10)]
    busy = {o: 0 for o in OUTCOMES}
    busy.update(CONSUMED=950, FAILED=12, NOT_CONSUMED=30, TRACE_LOST=4, PUB_FAILED=3)
    latency = {
        m: {"p50": 3, "p90": 9, "p99": 40, "max": 77, "count": 950, "skew_suspect": 0}
        for m in METRICS
    }
    groups = [
        ("orders-eu-west-1.payments", None, {"PUB_FAILED": 3}),
        ("orders-eu-west-1.payments", "billing-service-consumers-eu-west", {"CONSUMED": 950}),
        ("orders-eu-west-1.payments", "fraud-screening-consumers-eu-west", {"FAILED": 12}),
    ]
    return {
        "run": {
            "run_id": "r1", "from": "2026-11-22T08:00:00Z", "to": "2026-11-22T09:00:00Z",
            "window_ms": 10 * MIN, "horizon_ms": 30 * MIN, "cutoff": "2026-11-22T09:30:00Z",
            "windows": windows,
        },
        "input": {"events_read": 4000},
        "outcomes": busy,
        "informational": {o: 0 for o in INFORMATIONAL},
        "by_window": [
            {"window": windows[2], "window_start": "2026-11-22T08:20:00Z", **busy}
        ],
        "by_topic_group": [
            {"topic": t, "group": g, "outcomes": {o: c.get(o, 0) for o in OUTCOMES},
             "latency": latency}
            for t, g, c in groups
        ],
        "latency": latency,
        "latency_histograms_log2_ms": {m: [[1, 500], [3, 450]] for m in METRICS},
        "clock_skew": {"flagged": False, "suspect_rows_by_metric": dict.fromkeys(METRICS, 0)},
    }  # fmt: skip


def test_the_outcome_chart_gives_every_window_its_slot_and_keeps_the_legend_off_the_plot() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from tracemq_spark.report import outcome_figure

    fig = outcome_figure(_summary_one_busy_window_of_six())
    FigureCanvasAgg(fig).draw()
    ax, ax2 = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "08:00", "08:10", "08:20", "08:30", "08:40", "08:50",
    ]  # fmt: skip
    plot = ax.get_window_extent()
    bars = [p.get_window_extent() for p in ax.patches if p.get_height() > 0]
    assert bars and all(b.width < plot.width / 5 for b in bars), (plot.width, bars)
    assert all(abs(b.x0 + b.width / 2 - ax.transData.transform((2, 0))[0]) < 1 for b in bars)
    (legend,) = fig.legends
    box = legend.get_window_extent()
    (line,) = ax2.get_lines()
    markers = ax2.transData.transform(line.get_xydata())
    assert not any(box.contains(x, y) for x, y in markers)
    assert box.y1 <= plot.y0  # under the plot, not on it


def test_the_report_names_the_rows_without_a_group() -> None:
    from tracemq_spark.report import render

    page, _ = render(_summary_one_busy_window_of_six())
    assert ">None<" not in page
    # One row per table (counts, latency figures) for the send's own outcomes.
    assert page.count("(no consumer group)") == 1 + len(METRICS)


def test_write_by_window_gives_the_same_rows_with_open_files_or_sorted(
    spark: Any, tmp_path: Path
) -> None:
    """``outputs.write`` with one open file per window (no sort) and sorted (one file at a
    time) writes the same partitions and rows, and leaves the session's setting as it was."""
    from pyspark.sql import functions as F
    from tracemq_spark.commit import Staging
    from tracemq_spark.fs import HadoopFS
    from tracemq_spark.outputs import write

    key = "spark.sql.maxConcurrentOutputFileWriters"
    before = spark.conf.get(key, None)
    # rows of 5 windows spread over every partition: each write task meets every window
    df = spark.range(0, 1000, 1, 4).select(
        F.format_string("w%d", F.col("id") % 5).alias("window"), F.col("id")
    )
    fs = HadoopFS(spark)
    rows = {}
    for n in (64, 0):
        stage = Staging(str(tmp_path / f"out{n}"), "r")
        write(fs, stage, df, "ds", open_windows=n)
        got = spark.read.parquet(stage.path("ds"))
        rows[n] = sorted((r["window"], r["id"]) for r in got.collect())
        assert (Path(stage.path("ds")) / "_SUCCESS").exists()
        assert spark.conf.get(key, None) == before
    assert rows[64] == rows[0] == sorted((f"w{i % 5}", i) for i in range(1000))
