"""bench/host_speed.py: its three fixed workloads give positive figures, each a median inside
its repetitions' range, and run_all reads them into the summary's first rows."""

from __future__ import annotations

import statistics

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


def test_a_short_sample_is_a_loop_iterations_cpu_time() -> None:
    assert 10 < host_speed.python_ns(2_000) < 1_000_000


def test_the_probe_gives_each_window_the_median_of_its_samples() -> None:
    import itertools
    import threading
    import time

    values = itertools.count(100, 100)  # 100, 200, 300, ... ns
    taken = threading.Semaphore(0)

    def sample() -> float:
        taken.release()
        return float(next(values))

    with ra.HostProbe(every_s=0.001, sample=sample) as probe:
        start = time.monotonic()
        deadline = start + 10
        # (waits on the probe's recorded samples, not on time: a sample's time is read before
        # it is taken and it is recorded after, so count those recorded since the start)
        while sum(1 for t, _ in list(probe._samples) if t >= start) < 4:
            assert time.monotonic() < deadline, "the probe took no samples"
            taken.acquire(timeout=1)
        end = time.monotonic()
    inside = [ns for t, ns in probe._samples if start <= t <= end]
    assert len(inside) >= 4, "the samples taken inside the window"
    assert probe.median(start, end) == round(statistics.median(inside), 1)
    assert probe.median(0, time.monotonic() + 1) == round(
        statistics.median(ns for _, ns in probe._samples), 1
    )
    assert probe.median(end + 3600, end + 7200) is None
    # kicked: a sample at once, however long the interval (the first probe, stopped, may
    # have sampled again after the window: its permits are dropped first)
    while taken.acquire(blocking=False):
        pass
    with ra.HostProbe(every_s=3600, sample=sample) as probe:
        assert taken.acquire(timeout=10)  # the first, at the start
        probe.kick()
        assert taken.acquire(timeout=10)
    assert len(probe._samples) == 2
    # stopped: no sample is taken after the block
    count = len(probe._samples)
    assert not probe._thread.is_alive() and len(probe._samples) == count


def test_the_host_speed_of_a_run_survives_the_summary() -> None:
    run = ra.BenchRun("producer", "ok", wall_s=3.0, exit_code=0, result={}, host_python_ns=512.5)
    assert ra.BenchRun.from_json("producer", run.to_json()).host_python_ns == 512.5
    old = {k: v for k, v in run.to_json().items() if k != "host_python_ns"}
    assert ra.BenchRun.from_json("producer", old).host_python_ns is None  # an older summary
