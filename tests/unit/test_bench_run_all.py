"""bench/run_all.py's goal table and summary logic (no bench runs here): a figure is read from
its bench's JSON (or computed from several), judged against its goal in the right direction,
and a failed bench fails the run without hiding the others' figures."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from bench import run_all as ra

pytestmark = pytest.mark.timeout(30)

OK_RESULTS: dict[str, dict[str, Any]] = {
    "producer": {
        "bench_cpu_us_per_msg": {"raw": 12.0, "off": 19.0, "on": 21.5},
        "msgs_per_s": {"raw": 10_000, "off": 11_000, "on": 10_500},
        "ratios": {"on_vs_off": 0.95, "cpu_bound_vs_raw": 0.65},
    },
    "consumer": {
        "ratios": {"on_vs_off": 0.9, "on_vs_off_steady": 0.8},
        "per_variant": {
            "off": {"bench_cpu_us_per_msg": 17.5},
            "on": {"bench_cpu_us_per_msg": 26.0},
        },
        "runs": [{"first_msg_s": 5.0}, {"first_msg_s": 6.0}, {"first_msg_s": None}],
    },
    "reconcile": {
        "results": [
            {"messages": 1_000_000, "job_s": 44.0, "events_per_s": 96_000},
            {"messages": 10_000_000, "job_s": 152.0, "events_per_s": 276_000},
        ]
    },
    "latency": {
        "default_fetch_max_wait_ms": 100,
        "latency_ms_by_fetch_max_wait_ms": {"500": {"p99": 256.0}, "100": {"p99": 58.0}},
    },
}


def _run(name: str, status: str = "ok", result: dict | None = None) -> ra.BenchRun:
    return ra.BenchRun(name, status, result=result if result is not None else OK_RESULTS[name])


def _rows(runs: dict[str, ra.BenchRun]) -> dict[str, dict]:
    return {r["key"]: r for r in ra.evaluate(runs)}


def test_directions_judge_at_the_boundary() -> None:
    assert ra.Direction.LE.holds(20, 20) and not ra.Direction.LE.holds(20.01, 20)
    assert ra.Direction.GE.holds(0.7, 0.7) and not ra.Direction.GE.holds(0.69, 0.7)
    assert not ra.Direction.LT.holds(384, 384) and ra.Direction.LT.holds(383.9, 384)


def test_figures_are_read_derived_and_judged() -> None:
    rows = _rows({n: _run(n) for n in OK_RESULTS})
    # a plain field, met (19 <= 20)
    assert rows["producer.cpu_us_off"]["value"] == 19.0
    assert rows["producer.cpu_us_off"]["status"] == "met"
    # derived: on - off = 2.5 <= 3 met; off / raw = 1.583 > 1.5 not met
    assert rows["producer.trace_cpu_us"]["value"] == pytest.approx(2.5)
    assert rows["producer.trace_cpu_us"]["status"] == "met"
    assert rows["producer.cpu_off_vs_raw"]["value"] == pytest.approx(19 / 12, abs=1e-4)
    assert rows["producer.cpu_off_vs_raw"]["status"] == "not met"
    # the second of a figure's candidate paths
    assert rows["producer.cpu_bound_vs_raw"]["value"] == 0.65
    assert rows["producer.cpu_bound_vs_raw"]["status"] == "not met"
    # >= direction: 0.8 < 0.85
    assert rows["consumer.steady_on_vs_off"]["status"] == "not met"
    assert rows["consumer.trace_cpu_us"]["value"] == pytest.approx(8.5)
    # a mean over a list, skipping missing values
    assert rows["consumer.first_message_s"]["value"] == pytest.approx(5.5)
    assert rows["consumer.first_message_s"]["status"] == "info"
    # the list item of 10 M messages, and the largest size for the rate
    assert rows["reconcile.job_s_10m"]["value"] == 152.0
    assert rows["reconcile.job_s_10m"]["status"] == "not met"
    assert rows["reconcile.events_per_s"]["value"] == 276_000
    assert rows["reconcile.events_per_s"]["goal"] == "≥ 425000 events/s"
    # keyed by another field's value: the default fetch wait's p99
    assert rows["latency.p99_ms"]["value"] == 58.0 and rows["latency.p99_ms"]["status"] == "met"
    # every row says where it comes from
    assert "bench_cpu_us_per_msg.on" in rows["producer.trace_cpu_us"]["from"]


def test_missing_fields_sizes_and_benches_give_no_figure() -> None:
    rec = {"results": [{"messages": 1_000_000, "job_s": 44.0, "events_per_s": 96_000}]}
    rows = _rows(
        {
            "reconcile": _run("reconcile", result=rec),
            "producer": _run("producer", result={"bench_cpu_us_per_msg": {"off": 19.0}}),
        }
    )
    assert rows["reconcile.job_s_10m"]["status"] == "no figure"  # 10 M not run
    assert rows["reconcile.events_per_s"]["value"] == 96_000  # the largest size run
    assert rows["producer.trace_cpu_us"]["status"] == "no figure"  # "on" missing
    assert rows["producer.cpu_us_off"]["status"] == "met"
    # benches not selected have no rows at all
    assert not any(k.startswith("consumer.") for k in rows)


def test_a_failed_bench_fails_the_run_and_judges_nothing() -> None:
    runs = {
        "producer": _run("producer", status="failed"),
        "latency": _run("latency"),
        "lake_lookup": ra.BenchRun("lake_lookup", "skipped", reason="does not exist yet"),
    }
    runs["producer"].reason = "exit code 1"
    summary = ra.summarize(runs, profile="quick", started=dt.datetime.now(dt.UTC), wall_s=1.0)
    rows = {r["key"]: r for r in summary["figures"]}
    assert rows["producer.cpu_us_off"]["status"] == "bench failed"
    assert rows["producer.cpu_us_off"]["value"] == 19.0  # still shown
    assert rows["latency.p99_ms"]["status"] == "met"  # the others still count
    assert rows["lake_lookup.p99_ms"]["status"] == "no figure"
    assert summary["failed"] == ["producer"] and summary["skipped"] == ["lake_lookup"]
    assert ra.exit_code(summary) == 1
    del runs["producer"]
    ok = ra.summarize(runs, profile="quick", started=dt.datetime.now(dt.UTC), wall_s=1.0)
    assert ra.exit_code(ok) == 0  # goals not met or skipped benches do not fail the run
    # the summary survives a round trip and is judged again the same
    again = ra.resummarize(ok)
    assert again["figures"] == ok["figures"] and again["failed"] == []


def test_last_json_line_and_failure_reasons() -> None:
    assert ra.last_json(["progress", '{"a": 1}', "", "  "]) == {"a": 1}
    assert ra.last_json(['{"a": 1}', "trailing text"]) is None
    assert ra.last_json(["[1, 2]"]) is None
    assert ra.last_json([]) is None
    assert ra.classify(0, {"x": 1}, False) == ""
    assert ra.classify(1, {"x": 1}, False) == "exit code 1"
    assert ra.classify(0, None, False).startswith("no JSON")
    assert ra.classify(0, {"error": "boom"}, False) == "error: boom"
    assert ra.classify(None, None, True) == "timed out"


def test_unaccepted_options_are_dropped_with_their_values() -> None:
    kept, dropped = ra.filter_args(
        ["--events", "10", "--flag", "--store", "x"], {"--events", "--flag"}
    )
    assert kept == ["--events", "10", "--flag"] and dropped == ["--store", "x"]


def test_selection_and_the_bench_table_match_the_scripts() -> None:
    assert [b.name for b in ra.select(["query", "producer"], [])] == ["producer", "query"]
    assert "reconcile" not in [b.name for b in ra.select([], ["reconcile"])]
    with pytest.raises(ValueError, match="unknown bench nope"):
        ra.select(["nope"], [])
    bench_dir = Path(ra.__file__).parent
    # run_all runs them; capacity and spark_eventlog read other runs' output (no figures)
    scripts = {p.stem for p in bench_dir.glob("*.py")} - {"run_all", "capacity", "spark_eventlog"}
    scripts = {s for s in scripts if not s.startswith("_")}
    assert scripts <= set(ra.BENCH_NAMES), "a bench script is missing from run_all.BENCHES"
    for f in ra.FIGURES:
        assert f.bench in ra.BENCH_NAMES, f.key
        assert (f.direction is None) == (f.target is None), f.key


def test_a_bench_that_fails_or_prints_no_json_is_recorded_failed(tmp_path: Path) -> None:
    """run_bench on throwaway scripts: the stderr tail is kept, the JSON of a good one read."""
    good = tmp_path / "good.py"
    good.write_text('print("progress")\nprint(\'{"v": 3}\')\n')
    bad = tmp_path / "bad.py"
    bad.write_text('import sys\nprint("half", flush=True)\nsys.exit("it broke: reason")\n')

    class Spec(ra.BenchSpec):
        @property
        def script(self) -> Path:
            return tmp_path / f"{self.name}.py"

    ok = ra.run_bench(Spec("good", (), (), 30), "quick", tmp_path, None)
    assert ok.status == "ok" and ok.result == {"v": 3} and ok.exit_code == 0
    failed = ra.run_bench(Spec("bad", (), (), 30), "quick", tmp_path, None)
    assert failed.status == "failed" and failed.exit_code == 1
    assert "it broke: reason" in failed.stderr_tail and failed.stdout_tail == "half"
    assert ok.stdout_tail == ""  # kept for failed runs only
    missing = ra.run_bench(Spec("absent", (), (), 30), "quick", tmp_path, None)
    assert missing.status == "skipped" and "does not exist" in missing.reason
    # past its time limit: interrupted (SIGINT, as Ctrl-C: a bench's stack stops), failed
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import threading\ntry:\n    threading.Event().wait()\nexcept KeyboardInterrupt:\n"
        '    print(\'{"error": "interrupted"}\', flush=True)\n    raise SystemExit(130)\n'
    )
    timed = ra.run_bench(Spec("hang", (), (), 1), "quick", tmp_path, None)
    assert timed.status == "failed" and timed.reason.startswith("timed out")
    assert timed.exit_code == 130 and timed.result == {"error": "interrupted"}


def test_bench_args_replace_a_profile_s_arguments() -> None:
    assert ra.parse_bench_args(["query=--events 10 --store '/a b'"]) == {
        "query": ["--events", "10", "--store", "/a b"]
    }
    for bad in ("nope=--x", "query"):
        with pytest.raises(ValueError, match="NAME=ARGS"):
            ra.parse_bench_args([bad])
