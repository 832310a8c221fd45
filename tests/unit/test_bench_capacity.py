"""bench/capacity.py's arithmetic, on round numbers worked out by hand, and the reading of its
inputs from a make bench summary (no bench runs here)."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from bench import capacity as cap
from bench import run_all as ra

pytestmark = pytest.mark.timeout(30)

RATES = cap.Rates(
    producer_trace_us=4.0,
    consumer_trace_us=2.0,
    collector_events_per_s=100_000.0,
    collector_cpu_us_per_event=20.0,
    trace_bytes_per_event=250.0,
    store_bytes_per_event=500.0,
    lake_bytes_per_event=50.0,
    reconcile_events_per_core_s=100_000.0,
    store_events_measured=10_000_000.0,
    lookup_p99_ms=6.0,
    producer_msgs_per_s=10_000.0,
    consumer_msgs_per_s=40_000.0,
)
LIMITS = cap.CodeLimits(
    max_peers=32, lake_flush_s=5.0, lake_segment_rows=200_000, retention_days=3.0,
    route_refresh_s=30.0,
)  # fmt: skip
# 864 G messages a day = 10 M msg/s on average: round figures
LOAD = cap.Load(messages_per_day=864e9, groups=3, peak_factor=3.0)


def test_trace_events_per_message() -> None:
    assert cap.events_per_message(3) == 7  # Pub + 3 x (SubBefore + SubAfter)
    assert cap.events_per_message(0) == 1
    assert cap.events_per_message(1, retry_ratio=0.5) == 4  # half the consumes tried twice


def test_the_model_by_hand() -> None:
    p = cap.plan(LOAD, RATES, cap.Assumptions(), LIMITS)
    f = p.figures
    assert f["messages_per_s_avg"] == pytest.approx(10e6)
    assert f["trace_events_per_s_avg"] == pytest.approx(70e6)
    assert f["trace_events_per_s_peak"] == pytest.approx(210e6)
    assert f["trace_events_per_day"] == pytest.approx(864e9 * 7)
    # 4 us per send + 3 groups x 2 us per consume = 10 us per message; 10 M msg/s -> 100 cores
    assert f["client_trace_us_per_message"] == pytest.approx(10.0)
    assert f["client_trace_cores_avg"] == pytest.approx(100.0)
    assert f["client_trace_cores_peak"] == pytest.approx(300.0)
    # 210 M events/s / 100 k per collector; 210 M x 20 us = 4 200 cores
    assert f["collectors"] == 2100
    assert f["collector_cores_peak"] == pytest.approx(4200.0)
    # 210 M x 250 B = 52.5 GB/s / 10 MB/s = 5 250 partitions (more than the 2 100 collectors);
    # a peak hour's lake bytes (210 M x 3600 x 50 B) in 384 MiB shares needs more still
    assert f["trace_bytes_per_s_peak"] == pytest.approx(52.5e9)
    assert f["trace_partitions_by_bytes"] == 5250
    by_compaction = math.ceil(210e6 * 3600 * 50 / (384 * 1024 * 1024))
    assert f["trace_partitions_by_compaction"] == by_compaction == 93_878
    assert f["trace_partitions"] == by_compaction and p.partitions_driver == "compaction memory"
    assert f["compaction_bytes_per_partition_hour"] <= 384 * 1024 * 1024
    # 6.048 T events a day x 500 B, x 3 days of retention; lake at 50 B
    assert f["store_bytes_per_retention_day"] == pytest.approx(864e9 * 7 * 500)
    assert f["store_bytes_total"] == pytest.approx(864e9 * 7 * 500 * 3)
    assert f["store_events_per_collector"] == pytest.approx(864e9 * 7 * 3 / 2100)
    assert f["lake_bytes_per_day"] == pytest.approx(864e9 * 7 * 50)
    # a peak hour: 210 M x 3600 events in 900 s at 100 k per core-second = 8 400 cores
    assert f["spark_cores_peak_hour"] == 8400
    assert f["spark_cores_avg_hour"] == 2800
    # clients: 30 M msg/s / 10 k = 3 000 producers; 3 x 30 M / 40 k = 2 250 consumers
    assert f["producers_traced"] == 3000 and f["consumers_traced"] == 2250
    assert f["redis_route_reads_per_s"] == pytest.approx(5250 / 30)
    # 2 237 events/s per partition: the 5 s flush closes a file before 200 000 rows do
    assert f["lake_files_per_hour"] == pytest.approx(93_878 * 720)
    assert f["lake_puts_per_s"] == pytest.approx(93_878 * 720 / 3600)


def test_partitions_follow_collectors_when_bytes_need_fewer() -> None:
    small = cap.Rates(
        **{**_fields(RATES), "trace_bytes_per_event": 1.0, "lake_bytes_per_event": 0.01}
    )
    p = cap.plan(LOAD, small, cap.Assumptions(), LIMITS)
    assert p.figures["trace_partitions_by_bytes"] == 21  # 210 MB/s / 10 MB/s
    assert p.figures["trace_partitions"] == p.figures["collectors"] == 2100
    assert p.partitions_driver == "collectors"
    # 100 k events/s per partition: 200 000 rows close a file every 2 s, before the 5 s flush
    assert p.figures["lake_files_per_hour"] == pytest.approx(2100 * 1800)


def test_break_points_and_the_first_one() -> None:
    p = cap.plan(LOAD, RATES, cap.Assumptions(), LIMITS)
    by = {b.name: b for b in p.breaks}
    fan = by["query fan-out width"]
    assert fan.ratio == pytest.approx(2100 / 33)
    # load-proportional: reaches 33 collectors at 864 G x 33 / 2100 messages a day
    assert cap._breaks_at(fan, LOAD) == round(864e9 * 33 / 2100)
    store = by["store per collector vs the size look-ups were measured at"]
    assert store.ratio == pytest.approx(864e9 * 7 * 3 / 2100 / 10e6)
    assert not store.scales and store.kind == "unmeasured" and cap._breaks_at(store, LOAD) is None
    puts = by["lake PUTs per second into one date=/hour= prefix"]
    assert puts.ratio == pytest.approx(93_878 * 720 / 3600 / 3500)
    # the first: the load-proportional limit reached at the fewest messages a day (an
    # unmeasured store size is a risk, never "first", however large its ratio)
    first = p.first_break()
    assert first is fan and fan.ratio > puts.ratio > 1
    assert store.ratio > fan.ratio
    # a tiny load passes no load-proportional limit
    tiny = cap.plan(cap.Load(messages_per_day=1e6, groups=1), RATES, cap.Assumptions(), LIMITS)
    assert all(b.ratio < 1 for b in tiny.breaks if b.scales)


def _fields(r: cap.Rates) -> dict:
    return {k: getattr(r, k) for k in cap.Rates.FROM_FIGURES}


def _summary(results: dict) -> dict:
    runs = {n: ra.BenchRun(n, "ok", result=res) for n, res in results.items()}
    return ra.summarize(runs, profile="quick", started=dt.datetime.now(dt.UTC), wall_s=1.0)


BENCH_RESULTS = {
    "producer": {
        "bench_cpu_us_per_msg": {"raw": 13.0, "off": 41.0, "on": 46.5},
        "msgs_per_s": {"on": 12_000},
    },
    "consumer": {
        "per_variant": {
            "off": {"bench_cpu_us_per_msg": 26.0},  # on < off: noise
            "on": {"bench_cpu_us_per_msg": 25.0},
        },
        "steady_msgs_per_s": {"on": 38_000},
    },
    "collector_ingest": {
        "events_per_s": {"sustained": 75_000},
        "cpu_us_per_event": 20.5,
        "trace_bytes_per_event": 240.0,
        "store_bytes_per_event": 490.0,
        "lake_bytes_per_event": 60.0,
    },
    "query": {
        "store": {"events": 1_000_000, "file_bytes": 490_000_000},
        "latency_ms": {"api": {"msg_id_existing": {"p99": 6.0}, "msg_id_missing": {"p99": 2.0}}},
    },
    "reconcile": {"master": "local[2]", "results": [{"messages": 1, "events_per_s": 276_000}]},
}


def test_rates_come_from_the_summary_figures() -> None:
    r = cap.Rates.from_summary(_summary(BENCH_RESULTS))
    assert r.producer_trace_us == pytest.approx(5.5)
    assert r.consumer_trace_us == 0.0  # below zero is noise
    assert "noise" in r.sources["consumer_trace_us"]
    assert r.reconcile_events_per_core_s == pytest.approx(138_000)  # local[2]: per core
    assert r.lookup_p99_ms == 6.0 and r.store_events_measured == 1e6
    assert "collector_ingest: lake_bytes_per_event" in r.sources["lake_bytes_per_event"]
    no_reconcile = {k: v for k, v in BENCH_RESULTS.items() if k != "reconcile"}
    with pytest.raises(cap.ModelError, match=r"reconcile\.events_per_s"):
        cap.Rates.from_summary(_summary(no_reconcile))
    # without the query bench the model runs, minus the store-size break point (said so)
    no_query = cap.Rates.from_summary(
        _summary({k: v for k, v in BENCH_RESULTS.items() if k != "query"})
    )
    assert no_query.store_events_measured is None and no_query.lookup_p99_ms is None
    p = cap.plan(cap.Load(), no_query)
    assert not any(b.name.startswith("store per collector") for b in p.breaks)
    assert any("bench/query.py" in n for n in p.notes)


def test_cli_reads_a_summary_and_prints_json_last(tmp_path, capsys) -> None:
    import json

    path = tmp_path / "summary.json"
    path.write_text(json.dumps(_summary(BENCH_RESULTS)))
    assert cap.main(["--summary", str(path), "--groups", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    assert out["figures"]["trace_events_per_message"] == 5
    assert out["load"]["groups"] == 2
    assert out["first_break"] in {b["name"] for b in out["break_points"]}
    assert math.isclose(out["rates"]["producer_trace_us"], 5.5)


def test_later_summaries_replace_benches_that_ran_ok() -> None:
    first = _summary(BENCH_RESULTS)
    rerun = _summary({"query": {"store": {"events": 2_000_000, "file_bytes": 1}}})
    failed = _summary({"producer": {}})
    failed["benches"]["producer"]["status"] = "failed"
    merged = cap.merge_summaries([first, rerun, failed])
    assert merged["benches"]["query"]["result"]["store"]["events"] == 2_000_000
    assert merged["benches"]["producer"] == first["benches"]["producer"]  # not hidden
    assert cap.Rates.from_summary(merged).store_events_measured == 2_000_000
