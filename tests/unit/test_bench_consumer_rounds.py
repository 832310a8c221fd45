"""bench/consumer.per_round: each round's on/off pair on its own (tracing's CPU and the rate
ratio of that round), so one stalled variant shows, and a median over rounds leaves it out."""

from __future__ import annotations

from typing import Any

import pytest

from bench.consumer import per_round


def _run(round_: int, variant: str, bench_cpu_s: float, rate: float) -> dict[str, Any]:
    return {
        "round": round_,
        "variant": variant,
        "messages": 100_000,
        "steady_cpu_s": {"bench": bench_cpu_s, "kafka-trace": 0.2},
        "steady_msgs_per_s": rate,
    }


def test_each_round_pairs_its_own_variants() -> None:
    runs = [
        _run(1, "off", 1.30, 60_000.0),
        _run(1, "on", 1.60, 50_000.0),
        _run(2, "on", 2.10, 40_000.0),  # a stalled variant: its round alone shows it
        _run(2, "off", 1.20, 62_000.0),
        _run(3, "off", 1.25, 61_000.0),
        _run(3, "on", 1.50, 52_000.0),
    ]
    rounds = per_round(runs)
    assert [x["round"] for x in rounds] == [1, 2, 3]
    assert [x["tracing_us"] for x in rounds] == pytest.approx([3.0, 9.0, 2.5])
    assert [x["on_vs_off"] for x in rounds] == pytest.approx([50 / 60, 40 / 62, 52 / 61], abs=1e-4)


def test_a_round_without_both_variants_is_left_out() -> None:
    assert per_round([_run(1, "off", 1.0, 1.0)]) == []
