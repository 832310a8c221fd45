"""bench/host_speed.py: its three fixed workloads give positive figures, each a median inside
its repetitions' range, and run_all reads them into the summary's first rows."""

from __future__ import annotations

import pytest

from bench import host_speed
from bench import run_all as ra

pytestmark = pytest.mark.timeout(60)


def test_each_workload_gives_a_median_inside_its_range() -> None:
    figures = host_speed.measure(3)
    assert set(figures) == {"python_ns", "zstd_mb_s", "copy_gb_s"}
    for name, f in figures.items():
        assert 0 < f["min"] <= f["median"] <= f["max"], name
    # (what each stands for: a loop iteration is far above a ns, a copy far below a TB/s)
    assert figures["python_ns"]["median"] > 10
    assert figures["copy_gb_s"]["median"] < 1000


def test_the_trace_text_is_fixed_and_of_a_trace_messages_size() -> None:
    text = host_speed._trace_text()
    assert len(text) == 512_000 and text == host_speed._trace_text()
    assert text.startswith(b"SubBefore\x01")


def test_run_all_runs_it_first_and_reports_its_figures() -> None:
    assert ra.BENCHES[0].name == "host_speed"
    rows = {
        r["key"]: r
        for r in ra.evaluate(
            {
                "host_speed": ra.BenchRun(
                    name="host_speed",
                    status="ok",
                    args=[],
                    wall_s=2.0,
                    exit_code=0,
                    result={"python_ns": 500.0, "zstd_mb_s": 700.0, "copy_gb_s": 1.5},
                )
            }
        )
    }
    assert rows["host_speed.python_ns"]["value"] == 500.0
    assert rows["host_speed.zstd_mb_s"]["value"] == 700.0
    assert rows["host_speed.copy_gb_s"]["value"] == 1.5
    assert {r["status"] for r in rows.values()} == {"info"}
