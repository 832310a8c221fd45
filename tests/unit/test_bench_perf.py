"""bench/_perf.py: perf script's lines parsed, samples split between two variants' windows by
shared object and symbol, and (where perf is installed) a real recording of this process."""

from __future__ import annotations

import shutil
import time

import pytest

from bench._perf import PerfRecorder, Sample, describe, parse_script, split_windows

pytestmark = pytest.mark.timeout(120)

SCRIPT = """\
   31604.366038:    2004008  ffffffff8134bbd8 flush_tlb_mm_range ([kernel.kallsyms])
   31604.368063:    2004008      7f885ffa0144 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)
   31604.370043:    1000000      7fe9069da5f2 [unknown] (/root/.venv/cramjam.cpython-311-x86_64-linux-gnu.so)
Warning: some samples were lost
   31604.372043:    2004008      7fe9069da5f2  (/tmp/x.so)
"""


def test_script_lines_become_samples_and_other_lines_are_skipped() -> None:
    samples = parse_script(SCRIPT.splitlines())
    assert [s.dso for s in samples] == [
        "[kernel.kallsyms]",
        "libpython3.11.so.1.0",
        "cramjam.cpython-311-x86_64-linux-gnu.so",
        "x.so",
    ]
    assert samples[0] == Sample(31604.366038, 2004008, "[kernel.kallsyms]", "flush_tlb_mm_range")
    assert samples[2].symbol == "[unknown]" and samples[2].period_ns == 1_000_000
    assert samples[3].symbol == "[unknown]"  # (no symbol resolved: still CPU, still counted)


def _s(t: float, dso: str, sym: str, ns: int = 1_000_000) -> Sample:
    return Sample(t, ns, dso, sym)


def test_split_gives_each_variant_its_windows_cpu_per_message() -> None:
    samples = [
        # off: windows (0, 1) and (4, 5), 1 000 messages: 3 ms of libpython
        _s(0.5, "libpython", "eval"),
        _s(4.2, "libpython", "eval"),
        _s(4.9, "libpython", "malloc"),
        # on: window (2, 3), 500 messages: 2 ms libpython, 1 ms _speedups, 0.5 ms cramjam
        _s(2.1, "libpython", "eval"),
        _s(2.2, "libpython", "malloc"),
        _s(2.5, "_speedups.so", "before"),
        _s(2.6, "cramjam.so", "[unknown]", 500_000),
        # outside every window: not counted
        _s(3.5, "libpython", "eval"),
        _s(9.0, "_speedups.so", "before"),
    ]
    out = split_windows(
        samples,
        {"on": [(2.0, 3.0)], "off": [(4.0, 5.0), (0.0, 1.0)]},
        {"off": 1000, "on": 500},
    )
    assert out["variants"] == ["off", "on"]
    assert out["samples"] == {"off": 3, "on": 4}
    assert out["us_per_msg"] == {"off": 3.0, "on": 7.0}  # 3 ms / 1000, 3.5 ms / 500
    assert out["delta_us_per_msg"] == 4.0
    assert out["only_second"] == ["_speedups.so", "cramjam.so"]
    assert out["only_second_us_per_msg"] == 3.0  # (1 + 0.5 ms) / 500
    dsos = {r["dso"]: r for r in out["by_dso"]}
    assert dsos["libpython"] == {"dso": "libpython", "off": 3.0, "on": 4.0, "delta": 1.0}
    # (largest delta first; equal deltas by name)
    assert [r["dso"] for r in out["by_dso"]] == ["_speedups.so", "cramjam.so", "libpython"]
    top = out["top_symbols"][0]
    assert (top["symbol"], top["dso"], top["delta"]) == ("before", "_speedups.so", 2.0)
    evals = next(r for r in out["top_symbols"] if r["symbol"] == "eval")
    assert (evals["off"], evals["on"]) == (2.0, 2.0)


def test_split_refuses_what_it_cannot_divide() -> None:
    with pytest.raises(ValueError, match="two variants"):
        split_windows([], {"off": [(0, 1)]}, {"off": 1})
    with pytest.raises(ValueError, match="'on' needs a positive message count"):
        split_windows([], {"off": [(0, 1)], "on": []}, {"off": 1, "on": 0})


@pytest.mark.skipif(shutil.which("perf") is None, reason="Linux perf is not installed")
def test_a_real_recording_of_this_process_falls_in_its_window() -> None:
    recorder = PerfRecorder(frequency=999)
    try:
        recorder.start()
        time.sleep(0.5)  # (perf attaching: samples before it are not the point here)
        a = time.monotonic()
        end = time.thread_time() + 0.4
        while time.thread_time() < end:  # CPU in this thread, inside the window
            pass
        b = time.monotonic()
        recorder.stop()
        samples = recorder.samples()
    finally:
        recorder.close()
    out = split_windows(samples, {"off": [(0.0, 1.0)], "on": [(a, b)]}, {"off": 1, "on": 1})
    # ~0.4 s of CPU in the window (in µs per its one "message"); the clock is time.monotonic's
    assert 200_000 < out["us_per_msg"]["on"] < 600_000, out["us_per_msg"]
    assert any(r["dso"].startswith("libpython") or "python" in r["dso"] for r in out["by_dso"])


def test_describe_names_both_variants_and_the_largest_differences() -> None:
    samples = [_s(0.5, "libpython", "eval"), _s(2.5, "libpython", "eval"), _s(2.6, "z.so", "f")]
    out = split_windows(samples, {"raw": [(0.0, 1.0)], "off": [(2.0, 3.0)]}, {"raw": 10, "off": 10})
    lines = describe(out, dsos=1, symbols=1)
    assert lines[0].startswith("perf (this process, the variants' windows; 1 / 2 samples): raw")
    assert (
        "off - raw +100.00" in lines[0] and "run only in off's windows: z.so = 100.00" in lines[0]
    )
    assert lines[1] == "  +100.000  z.so (0.000 -> 100.000)"
    assert lines[2] == "largest symbols by off - raw (us/msg):"
    assert lines[3] == "  +100.000  f [z.so]" and len(lines) == 4
