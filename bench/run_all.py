"""Every benchmark in ``bench/`` in one run, each figure next to its goal: ``make bench``.

    .venv/bin/python bench/run_all.py [--profile quick|full] [--only NAME ...] [--skip NAME ...]
                                      [--out-dir bench/results] [--quiet]

Each bench runs as its own subprocess (its own embedded stack), one after the other, at the
sizes of the profile: ``quick`` (the default, what ``make bench`` runs) finishes in about ten
minutes on a 2-core machine; ``full`` runs the sizes the goals are stated at (10 M events in the
store, 10 M messages reconciled, ...) and takes much longer. A bench's LAST stdout line is its
JSON result; its output goes to ``<out-dir>/<stamp>/<name>.out`` / ``.err`` and, unless
``--quiet``, to the console.

Guarantees:

* a bench that exits non-zero, prints no JSON last line, or runs past its time limit (then it
  gets SIGINT, which stops its stack, and SIGKILL 30 s later) is recorded as ``failed`` with the
  tail of its stderr; the others still run;
* a bench whose script does not exist yet (``lake_lookup.py`` until it lands) is ``skipped``
  with a note, not failed; options a new script does not accept are dropped and noted;
* ONE summary file, ``<out-dir>/summary-<UTC stamp>.json``: every bench's status and full JSON,
  and every figure of :data:`FIGURES` with its value, where it comes from, its goal and
  ``met`` / ``not met`` / ``no figure`` / ``bench failed`` (or ``info`` when it has no goal);
* the exit code is 1 if any bench failed (a goal not met is not a failure: it is a figure).

The goals live in one typed table, :data:`FIGURES` (issue 19's goals, issue 17's lake look-up,
and the targets the scripts carried before); ``bench/capacity.py`` reads the same summary.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

try:  # imported as bench.run_all (the tests), or run as bench/run_all.py (bench/ on the path)
    from bench import host_speed
except ImportError:  # pragma: no cover - the script's own way
    import host_speed  # type: ignore[no-redef]

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_OUT = BENCH_DIR / "results"
CACHE = REPO_ROOT / ".tracemq" / "bench-cache"  # built query stores (make clean removes it)

Results = Mapping[str, Mapping[str, Any]]  # bench name -> its JSON result


# ----------------------------------------------------------------------------- the benches


@dataclass(frozen=True)
class BenchSpec:
    """One script of ``bench/`` and its arguments per profile."""

    name: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    timeout_s: float  # quick profile; full gets 4 x
    note: str = ""
    #: a script another branch adds: skipped (not failed) while absent; options its ``--help``
    #: does not list are dropped (its interface is not settled yet)
    optional: bool = False

    @property
    def script(self) -> Path:
        return BENCH_DIR / f"{self.name}.py"

    def args(self, profile: str) -> list[str]:
        return list(self.full if profile == "full" else self.quick)

    def timeout(self, profile: str) -> float:
        return self.timeout_s * (4 if profile == "full" else 1)


#: In running order. Quick sizes are chosen so the whole run takes about ten minutes on the
#: 2-core development machine (each bench also starts its own stack: 10-25 s).
BENCHES: tuple[BenchSpec, ...] = (
    # first: how fast the host is this hour (the other figures moved by a third between hours)
    BenchSpec(
        "host_speed",
        ("--reps", "15"),
        ("--reps", "25"),
        60,
        note="fixed workloads: read the other figures against these",
    ),
    BenchSpec("cli_startup", ("--runs", "3"), ("--runs", "10"), 120),
    BenchSpec(
        "producer",
        # the goal's own size (issue 19 goal 1): at 30 000 the latency-bound phase's rounds
        # were ~1 s each and "trace on adds" swung by several µs between runs
        ("--messages", "60000", "--rounds", "3"),
        ("--messages", "60000", "--rounds", "3"),
        300,
    ),
    BenchSpec(
        "consumer",
        # four rounds: a host's stall lands in one round's pair (per_round shows it)
        ("--messages", "30000", "--rounds", "4"),
        ("--messages", "100000", "--rounds", "4"),
        300,
    ),
    BenchSpec("collector_ingest", ("--events", "1000000"), ("--events", "1000000"), 400),
    BenchSpec("otlp_ingest", ("--spans", "100000"), ("--spans", "200000"), 300),
    BenchSpec(
        "query",
        ("--events", "1000000", "--lookups", "200", "--store", str(CACHE / "store-1m")),
        ("--events", "10000000", "--lookups", "5000", "--store", str(CACHE / "store-10m")),
        600,
        # building the store is most of the run: few look-ups per kind keep the quick run
        # short (a missing msgId, also tried as an offsetMsgId, is one place-index probe)
        note="quick: a 1 M-event store, 200 look-ups per kind (the goal is stated at 10 M)",
    ),
    BenchSpec(
        "lake_lookup",
        ("--events", "1000000"),
        ("--events", "10000000"),
        400,
        note="look-ups through the lake fallback (issue 17)",
    ),
    BenchSpec(
        "reconcile",
        ("--sizes", "1000000"),
        ("--sizes", "1000000,10000000"),
        400,
        note="quick: 1 M messages (the goal is stated at 10 M: --profile full)",
    ),
    BenchSpec("latency", ("--duration", "10"), ("--duration", "15"), 180),
    BenchSpec("freshness", ("--duration", "20"), ("--duration", "60"), 240),
    BenchSpec("delay", ("--messages", "5000"), ("--messages", "10000"), 240),
)
BENCH_NAMES = tuple(b.name for b in BENCHES)


# ----------------------------------------------------------------------------- figures, goals


class Direction(StrEnum):
    """How a figure must compare with its goal's target."""

    LE = "≤"
    GE = "≥"
    LT = "<"

    def holds(self, value: float, target: float) -> bool:
        if self is Direction.LE:
            return value <= target
        if self is Direction.GE:
            return value >= target
        return value < target


class Status(StrEnum):
    MET = "met"
    NOT_MET = "not met"
    NO_FIGURE = "no figure"  # the bench did not run, or its JSON lacks the field
    BENCH_FAILED = "bench failed"  # a figure from a failed run judges nothing
    INFO = "info"  # a figure without a goal


def dig(obj: Any, path: str) -> Any:
    """``obj["a"]["b"]...`` for ``path`` "a.b..."; None where a step is missing."""
    for part in path.split("."):
        if not isinstance(obj, Mapping) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


@dataclass(frozen=True)
class Field:
    """A number in one bench's JSON: the first of ``paths`` that is present."""

    bench: str
    paths: tuple[str, ...]

    def __call__(self, results: Results) -> float | None:
        res = results.get(self.bench)
        if res is None:
            return None
        for p in self.paths:
            v = _num(dig(res, p))
            if v is not None:
                return v
        return None

    def describe(self) -> str:
        return f"{self.bench}: " + " | ".join(self.paths)


def at(bench: str, *paths: str) -> Field:
    return Field(bench, paths)


@dataclass(frozen=True)
class Derived:
    """A figure computed from others: ``op`` over their values (None if any is missing)."""

    op: str  # "-", "/", "*", "max"
    parts: tuple[Extractor, ...]
    scale: float = 1.0

    def __call__(self, results: Results) -> float | None:
        vals = [p(results) for p in self.parts]
        if any(v is None for v in vals):
            return None
        xs = [v for v in vals if v is not None]
        if self.op == "-":
            out = xs[0] - sum(xs[1:])
        elif self.op == "/":
            if xs[1] == 0:
                return None
            out = xs[0] / xs[1]
        elif self.op == "*":
            out = xs[0]
            for x in xs[1:]:
                out *= x
        elif self.op == "max":
            out = max(xs)
        else:  # pragma: no cover - the table is static
            raise ValueError(f"unknown op {self.op!r}")
        return out * self.scale

    def describe(self) -> str:
        inner = f" {self.op} ".join(f"({p.describe()})" for p in self.parts)
        if self.op == "max":
            inner = "max(" + ", ".join(p.describe() for p in self.parts) + ")"
        return inner + (f" x {self.scale:g}" if self.scale != 1 else "")


@dataclass(frozen=True)
class Pick:
    """A field of the item of a list whose ``key`` equals ``value`` (or, with ``value`` None,
    the item with the largest ``key``): e.g. reconcile's result for 10 M messages."""

    bench: str
    items: str
    key: str
    field: str
    value: float | None = None

    def __call__(self, results: Results) -> float | None:
        items = dig(results.get(self.bench) or {}, self.items)
        if not isinstance(items, list):
            return None
        rows = [r for r in items if isinstance(r, Mapping) and _num(r.get(self.key)) is not None]
        if self.value is not None:
            rows = [r for r in rows if _num(r.get(self.key)) == self.value]
        if not rows:
            return None
        row = max(rows, key=lambda r: float(r[self.key]))
        return _num(dig(row, self.field))

    def describe(self) -> str:
        which = "largest" if self.value is None else f"{self.value:g}"
        return f"{self.bench}: {self.items}[{self.key}={which}].{self.field}"


@dataclass(frozen=True)
class Mean:
    """The mean of one field over the items of a list (e.g. consumer runs' first-message wait)."""

    bench: str
    items: str
    field: str

    def __call__(self, results: Results) -> float | None:
        items = dig(results.get(self.bench) or {}, self.items)
        if not isinstance(items, list):
            return None
        vals = [v for r in items if (v := _num(dig(r, self.field))) is not None]
        return sum(vals) / len(vals) if vals else None

    def describe(self) -> str:
        return f"{self.bench}: mean of {self.items}[].{self.field}"


@dataclass(frozen=True)
class Keyed:
    """``bench.<table>.<value of bench.<key_path>>.<field>``: e.g. latency's p99 at the
    consumers' default fetch wait, whatever that default is."""

    bench: str
    table: str
    key_path: str
    field: str

    def __call__(self, results: Results) -> float | None:
        res = results.get(self.bench) or {}
        key = dig(res, self.key_path)
        if key is None:
            return None
        return _num(dig(dig(res, self.table), f"{key}.{self.field}"))

    def describe(self) -> str:
        return f"{self.bench}: {self.table}[{self.key_path}].{self.field}"


Extractor = Field | Derived | Pick | Mean | Keyed


@dataclass(frozen=True)
class Figure:
    """One reported figure; with ``direction`` and ``target`` it is a goal."""

    key: str
    what: str
    unit: str
    value: Extractor
    direction: Direction | None = None
    target: float | None = None
    source: str = ""  # where the goal comes from
    note: str = ""

    @property
    def bench(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def is_goal(self) -> bool:
        return self.direction is not None and self.target is not None

    def goal_text(self) -> str:
        if not self.is_goal:
            return ""
        assert self.target is not None
        return f"{self.direction} {self.target:g} {self.unit}".strip()

    def judge(self, value: float | None, bench_ok: bool) -> Status:
        if not self.is_goal:
            return Status.INFO
        if value is None:
            return Status.NO_FIGURE
        if not bench_ok:
            return Status.BENCH_FAILED
        assert self.direction is not None and self.target is not None
        return Status.MET if self.direction.holds(value, self.target) else Status.NOT_MET


I19 = "issue 19 goal"
# 10 M messages of bench/reconcile.py's generator are ~42.5 M events (4.25 per message)
RECONCILE_10M_EVENTS = 42_500_000
RECONCILE_GOAL_S = 100.0

#: Every figure of the summary, goals first per bench. Units: us = microseconds.
FIGURES: tuple[Figure, ...] = (
    # -- the host this hour (no goal: the other figures are read against these)
    Figure(
        "host_speed.python_ns",
        "a fixed Python loop's iteration (a client's per-message shape)",
        "ns",
        at("host_speed", "python_ns"),
    ),  # fmt: skip
    Figure(
        "host_speed.zstd_mb_s",
        "zstd level 1 over fixed trace text",
        "MB/s",
        at("host_speed", "zstd_mb_s"),
    ),  # fmt: skip
    Figure(
        "host_speed.copy_gb_s",
        "64 MiB copied into new memory (its page faults included)",
        "GB/s",
        at("host_speed", "copy_gb_s"),
    ),  # fmt: skip
    # -- producer (issue 19, goal 1)
    Figure(
        "producer.cpu_us_off",
        "CPU per message, trace off",
        "us",
        at("producer", "bench_cpu_us_per_msg.off"),
        Direction.LE,
        20,
        f"{I19} 1",
    ),
    Figure(
        "producer.cpu_off_vs_raw",
        "CPU per message, trace off / raw aiokafka (same run)",
        "x",
        Derived(
            "/",
            (
                at("producer", "bench_cpu_us_per_msg.off"),
                at("producer", "bench_cpu_us_per_msg.raw"),
            ),
        ),
        Direction.LE,
        1.5,
        f"{I19} 1",
    ),  # fmt: skip
    Figure(
        "producer.trace_cpu_us",
        "CPU tracing adds per message (on - off)",
        "us",
        Derived(
            "-",
            (at("producer", "bench_cpu_us_per_msg.on"), at("producer", "bench_cpu_us_per_msg.off")),
        ),
        Direction.LE,
        3,
        f"{I19} 1",
    ),  # fmt: skip
    Figure(
        "producer.cpu_bound_vs_raw",
        "CPU-bound variant (batches, many in flight): throughput / raw aiokafka",
        "x",
        at(
            "producer",
            "cpu_bound.ratios.off_vs_raw",
            "ratios.cpu_bound_vs_raw",
            "cpu_bound.off_vs_raw",
        ),
        Direction.GE,
        0.7,
        f"{I19} 1",
    ),  # fmt: skip
    Figure(
        "producer.cpu_us_raw",
        "CPU per message, raw aiokafka",
        "us",
        at("producer", "bench_cpu_us_per_msg.raw"),
    ),  # fmt: skip
    Figure(
        "producer.cpu_us_on",
        "CPU per message, trace on",
        "us",
        at("producer", "bench_cpu_us_per_msg.on"),
    ),  # fmt: skip
    Figure(
        "producer.msgs_per_s_raw",
        "throughput raw aiokafka (latency-bound)",
        "msg/s",
        at("producer", "msgs_per_s.raw"),
    ),  # fmt: skip
    Figure(
        "producer.msgs_per_s_off",
        "throughput trace off (latency-bound)",
        "msg/s",
        at("producer", "msgs_per_s.off"),
    ),  # fmt: skip
    Figure(
        "producer.msgs_per_s_on",
        "throughput trace on (latency-bound)",
        "msg/s",
        at("producer", "msgs_per_s.on"),
    ),  # fmt: skip
    Figure(
        "producer.on_vs_off",
        "throughput trace on / off",
        "x",
        at("producer", "ratios.on_vs_off"),
        Direction.GE,
        0.9,
        "bench/producer.py target",
    ),
    # -- consumer (issue 19, goal 2)
    Figure(
        "consumer.steady_on_vs_off",
        "steady-state throughput trace on / off",
        "x",
        at("consumer", "ratios.on_vs_off_steady", "ratios.steady_on_vs_off"),
        Direction.GE,
        0.85,
        f"{I19} 2",
    ),
    Figure(
        "consumer.trace_cpu_us",
        "CPU tracing adds per message (on - off)",
        "us",
        Derived(
            "-",
            (
                at("consumer", "per_variant.on.bench_cpu_us_per_msg"),
                at("consumer", "per_variant.off.bench_cpu_us_per_msg"),
            ),
        ),
        Direction.LE,
        3,
        f"{I19} 2",
    ),  # fmt: skip
    Figure(
        "consumer.cpu_us_off",
        "CPU per message, trace off",
        "us",
        at("consumer", "per_variant.off.bench_cpu_us_per_msg"),
    ),  # fmt: skip
    Figure(
        "consumer.cpu_us_on",
        "CPU per message, trace on",
        "us",
        at("consumer", "per_variant.on.bench_cpu_us_per_msg"),
    ),  # fmt: skip
    Figure(
        "consumer.steady_msgs_per_s_off",
        "steady-state throughput trace off",
        "msg/s",
        at("consumer", "steady_msgs_per_s.off"),
    ),  # fmt: skip
    Figure(
        "consumer.steady_msgs_per_s_on",
        "steady-state throughput trace on",
        "msg/s",
        at("consumer", "steady_msgs_per_s.on"),
    ),  # fmt: skip
    Figure(
        "consumer.first_message_s",
        "wait for the first message (group join)",
        "s",
        Mean("consumer", "runs", "first_msg_s"),
    ),  # fmt: skip
    Figure(
        "consumer.whole_run_on_vs_off",
        "whole-run throughput trace on / off",
        "x",
        at("consumer", "ratios.on_vs_off"),
    ),  # fmt: skip
    # -- collector (issue 19, goal 3)
    Figure(
        "collector_ingest.events_per_s",
        "sustained ingest into store and lake, one collector",
        "events/s",
        at("collector_ingest", "events_per_s.sustained"),
        Direction.GE,
        100_000,
        f"{I19} 3",
    ),
    Figure(
        "collector_ingest.peak_rss_mib",
        "peak RSS over the collector's processes",
        "MiB",
        at("collector_ingest", "peak_rss_mib"),
        Direction.LT,
        384,
        f"{I19} 3",
    ),
    Figure(
        "collector_ingest.store_bytes_per_event",
        "store file bytes per event (ingest)",
        "B",
        at("collector_ingest", "store_bytes_per_event"),
        Direction.LE,
        150,
        f"{I19} 3",
    ),
    Figure(
        "collector_ingest.lake_bytes_per_event",
        "lake Parquet bytes per event",
        "B",
        at("collector_ingest", "lake_bytes_per_event"),
    ),  # fmt: skip
    Figure(
        "collector_ingest.trace_bytes_per_event",
        "trace topic bytes per event (wire)",
        "B",
        at("collector_ingest", "trace_bytes_per_event"),
    ),  # fmt: skip
    Figure(
        "collector_ingest.cpu_us_per_event",
        "collector CPU per event",
        "us",
        at("collector_ingest", "cpu_us_per_event"),
    ),  # fmt: skip
    Figure(
        "collector_ingest.steady_events_per_s",
        "store rate 10 %-90 %",
        "events/s",
        at("collector_ingest", "events_per_s.steady_10_90"),
    ),  # fmt: skip
    # -- query (issue 19, goal 3)
    Figure(
        "query.p99_ms_msg_id",
        "look-up by msgId through the API, p99 (existing and missing ids)",
        "ms",
        Derived(
            "max",
            (
                at("query", "latency_ms.api.msg_id_existing.p99"),
                at("query", "latency_ms.api.msg_id_missing.p99"),
            ),
        ),
        Direction.LE,
        10,
        f"{I19} 3 (at 10 M events)",
    ),  # fmt: skip
    Figure(
        "query.store_bytes_per_event",
        "store file bytes per event (built store)",
        "B",
        Derived("/", (at("query", "store.file_bytes"), at("query", "store.events"))),
        Direction.LE,
        150,
        f"{I19} 3",
    ),
    Figure(
        "query.store_events", "events in the store looked up", "events", at("query", "store.events")
    ),  # fmt: skip
    Figure(
        "query.p50_ms_msg_id",
        "look-up by msgId through the API, p50",
        "ms",
        at("query", "latency_ms.api.msg_id_existing.p50"),
    ),  # fmt: skip
    Figure(
        "query.p99_ms_key",
        "look-up by key through the API, p99",
        "ms",
        at("query", "latency_ms.api.key_existing.p99"),
    ),  # fmt: skip
    # -- lake look-up (issue 17)
    Figure(
        "lake_lookup.p99_ms",
        "msgId look-up through the lake fallback, p99",
        "ms",
        at("lake_lookup", "p99_ms", "latency_ms.p99", "lookup_ms.p99", "latency_ms.msg_id.p99"),
        Direction.LE,
        300,
        "issue 17 (at 10 M events)",
    ),
    Figure(
        "lake_lookup.p50_ms",
        "msgId look-up through the lake fallback, p50",
        "ms",
        at("lake_lookup", "p50_ms", "latency_ms.p50", "lookup_ms.p50", "latency_ms.msg_id.p50"),
    ),  # fmt: skip
    # -- reconcile (issue 19, goal 4)
    Figure(
        "reconcile.job_s_10m",
        "10 M messages reconciled on local[2]",
        "s",
        Pick("reconcile", "results", "messages", "job_s", 10_000_000),
        Direction.LE,
        RECONCILE_GOAL_S,
        f"{I19} 4",
        note="only --profile full runs 10 M",
    ),
    Figure(
        "reconcile.events_per_s",
        "job events/s at the largest size run",
        "events/s",
        Pick("reconcile", "results", "messages", "events_per_s"),
        Direction.GE,
        RECONCILE_10M_EVENTS / RECONCILE_GOAL_S,
        f"{I19} 4, as a rate",
        note="10 M messages = 42.5 M events in 100 s; pessimistic below 10 M (fixed JVM cost)",
    ),
    Figure(
        "reconcile.job_s",
        "job wall time at the largest size run",
        "s",
        Pick("reconcile", "results", "messages", "job_s"),
    ),  # fmt: skip
    Figure(
        "reconcile.messages",
        "messages reconciled (largest size)",
        "messages",
        Pick("reconcile", "results", "messages", "messages"),
    ),  # fmt: skip
    # -- the others (their scripts' targets)
    Figure(
        "otlp_ingest.events_per_s",
        "OTLP spans into the store, as trace events",
        "events/s",
        at("otlp_ingest", "events_per_s_stored"),
    ),
    Figure(
        "otlp_ingest.request_p99_ms", "OTLP request p99", "ms", at("otlp_ingest", "request_ms.p99")
    ),  # fmt: skip
    Figure(
        "latency.p99_ms",
        "send -> listener p99 at the consumers' default fetch wait",
        "ms",
        Keyed("latency", "latency_ms_by_fetch_max_wait_ms", "default_fetch_max_wait_ms", "p99"),
        Direction.LT,
        100,
        "bench/latency.py target",
    ),
    Figure(
        "freshness.p99_ms",
        "SubAfter -> complete trace answered by the API, p99",
        "ms",
        at("freshness", "freshness_ms.p99"),
        Direction.LE,
        2000,
        "bench/freshness.py target",
    ),
    Figure(
        "delay.receive_p99_ms",
        "delayed message received after due, p99",
        "ms",
        at("delay", "receive_error_ms.p99"),
    ),  # fmt: skip
    Figure(
        "delay.early",
        "delayed messages delivered early",
        "messages",
        at("delay", "early"),
        Direction.LE,
        0,
        "bench/delay.py check",
    ),
    Figure(
        "cli_startup.worst_median_s",
        "slowest CLI command start-up (median)",
        "s",
        at("cli_startup", "worst_median_s"),
        Direction.LE,
        0.5,
        "issue 15 (bench/cli_startup.py)",
    ),
)


# ----------------------------------------------------------------------------- one bench run


@dataclass
class BenchRun:
    """What happened when one bench ran."""

    name: str
    status: str  # "ok" | "failed" | "skipped"
    args: list[str] = field(default_factory=list)
    exit_code: int | None = None
    wall_s: float = 0.0
    result: dict[str, Any] | None = None
    reason: str = ""  # why failed / skipped
    stderr_tail: str = ""
    stdout_tail: str = ""  # of a failed run: where its progress stopped
    notes: list[str] = field(default_factory=list)
    #: the host's speed while it ran: the median of HostProbe's samples (host_speed.python_ns)
    host_python_ns: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> BenchRun:
        return cls(
            name,
            d["status"],
            args=list(d.get("args") or []),
            exit_code=d.get("exit_code"),
            wall_s=float(d.get("wall_s") or 0.0),
            result=d.get("result"),
            reason=d.get("reason") or "",
            stderr_tail=d.get("stderr_tail") or "",
            stdout_tail=d.get("stdout_tail") or "",
            notes=list(d.get("notes") or []),
            host_python_ns=d.get("host_python_ns"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "args": self.args,
            "exit_code": self.exit_code,
            "wall_s": round(self.wall_s, 1),
            "reason": self.reason,
            "notes": self.notes,
            "stderr_tail": self.stderr_tail,
            "stdout_tail": self.stdout_tail,
            "host_python_ns": self.host_python_ns,
            "result": self.result,
        }


class HostProbe:
    """Samples the host's speed (:func:`host_speed.python_ns`, ~10 ms of one core's time)
    every ``every_s`` seconds in a thread while the benchmarks run: the same code's figures
    moved by a third between hours, and within minutes, on the development machine, so each
    bench is given the host's speed during it (:meth:`median`). The sample runs beside the
    bench, on the same cores and caches: compare a bench's figure with the same bench's in
    another summary, not one bench's with another's."""

    def __init__(self, every_s: float = 10.0, sample: Callable[[], float] | None = None) -> None:
        self._every_s = every_s
        self._sample = sample or host_speed.python_ns
        self._samples: list[tuple[float, float]] = []  # (monotonic time, ns)
        self._stop = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="host-probe")

    def __enter__(self) -> HostProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(5)

    def kick(self) -> None:
        """Take a sample now (a bench starts: a short one gets one too)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._samples.append((time.monotonic(), self._sample()))
            self._wake.wait(self._every_s)
            self._wake.clear()

    def median(self, start: float, end: float) -> float | None:
        """The median sample taken between the monotonic times ``start`` and ``end`` (None:
        none was)."""
        inside = sorted(ns for t, ns in list(self._samples) if start <= t <= end)
        if not inside:
            return None
        mid = len(inside) // 2
        value = inside[mid] if len(inside) % 2 else (inside[mid - 1] + inside[mid]) / 2
        return round(value, 1)


def last_json(lines: Sequence[str]) -> dict[str, Any] | None:
    """The JSON object on the last non-empty line, or None."""
    for line in reversed(lines):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
    return None


def classify(exit_code: int | None, result: dict[str, Any] | None, timed_out: bool) -> str:
    """Why a run failed, or "" if it did not."""
    if timed_out:
        return "timed out"
    if exit_code != 0:
        return f"exit code {exit_code}"
    if result is None:
        return "no JSON object on the last stdout line"
    if result.get("error"):
        return f"error: {result['error']}"
    return ""


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _accepted_options(script: Path) -> set[str] | None:
    """The ``--options`` a script's ``--help`` lists (None if --help fails)."""
    try:
        out = subprocess.run(
            [sys.executable, str(script), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return {w.strip(",[]=") for w in out.stdout.split() if w.startswith("--")}


def filter_args(args: Sequence[str], accepted: set[str]) -> tuple[list[str], list[str]]:
    """``args`` without the options (and their values) not in ``accepted``; the dropped ones."""
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        step = 2 if value is not None else 1
        if a.startswith("--") and a.split("=", 1)[0] not in accepted:
            dropped.extend(args[i : i + step])
        else:
            kept.extend(args[i : i + step])
        i += step
    return kept, dropped


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGINT to the bench's process group (its stack stops on KeyboardInterrupt), then
    SIGKILL after 30 s."""
    for sig, wait_s in ((signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_bench(
    spec: BenchSpec,
    profile: str,
    log_dir: Path,
    echo: Callable[[str], None] | None,
    args: Sequence[str] | None = None,
) -> BenchRun:
    """Run one bench as a subprocess (``args``: instead of the profile's); never raises for
    the bench's own failures."""
    if not spec.script.exists():
        where = (
            spec.script.relative_to(REPO_ROOT)
            if spec.script.is_relative_to(REPO_ROOT)
            else spec.script
        )
        return BenchRun(spec.name, "skipped", reason=f"{where} does not exist yet")
    args = list(args) if args is not None else spec.args(profile)
    notes: list[str] = []
    if spec.optional:
        accepted = _accepted_options(spec.script)
        if accepted is not None:
            args, dropped = filter_args(args, accepted)
            if dropped:
                notes.append(f"options its --help does not list, dropped: {' '.join(dropped)}")
    cmd = [sys.executable, str(spec.script), *args]
    out_path, err_path = log_dir / f"{spec.name}.out", log_dir / f"{spec.name}.err"
    lines: list[str] = []
    t0 = time.monotonic()
    timed_out = False
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with out_path.open("w") as out_f, err_path.open("w") as err_f:
        with subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err_f,
            text=True,
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,  # its own process group: a time-out stops all of it
        ) as proc:  # closes the pipe

            def pump() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    out_f.write(line)
                    out_f.flush()
                    lines.append(line.rstrip("\n"))
                    if echo is not None:
                        echo(line.rstrip("\n"))

            reader = threading.Thread(target=pump, daemon=True, name=f"bench-{spec.name}-stdout")
            reader.start()
            try:
                proc.wait(spec.timeout(profile))
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_group(proc)
            except KeyboardInterrupt:
                _stop_group(proc)
                raise
            reader.join(30)
    wall = time.monotonic() - t0
    result = last_json(lines)
    reason = classify(proc.returncode, result, timed_out)
    return BenchRun(
        spec.name,
        "failed" if reason else "ok",
        args=args,
        exit_code=proc.returncode,
        wall_s=wall,
        result=result,
        reason=reason + (f" (limit {spec.timeout(profile):.0f} s)" if timed_out else ""),
        stderr_tail=tail(err_path.read_text(errors="replace")) if reason else "",
        stdout_tail=tail("\n".join(lines), 10) if reason else "",
        notes=notes,
    )


# ----------------------------------------------------------------------------- the summary


def evaluate(runs: Mapping[str, BenchRun]) -> list[dict[str, Any]]:
    """Every figure of :data:`FIGURES`: value, goal, status, where it comes from."""
    results: dict[str, Mapping[str, Any]] = {
        n: r.result for n, r in runs.items() if r.result is not None
    }
    rows = []
    for f in FIGURES:
        if f.bench not in runs:
            continue  # not selected (--only / --skip)
        value = f.value(results)
        run = runs.get(f.bench)
        status = f.judge(value, bench_ok=run is not None and run.ok)
        rows.append(
            {
                "key": f.key,
                "bench": f.bench,
                "what": f.what,
                "value": None if value is None else round(value, 4),
                "unit": f.unit,
                "goal": f.goal_text(),
                "direction": f.direction.value if f.direction else None,
                "target": f.target,
                "source": f.source,
                "status": status.value,
                "from": f.value.describe(),
                "note": f.note,
            }
        )
    return rows


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def summarize(
    runs: Mapping[str, BenchRun], *, profile: str, started: dt.datetime, wall_s: float
) -> dict[str, Any]:
    figures = evaluate(runs)
    counts: dict[str, int] = {}
    for row in figures:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return {
        "kind": "tracemq-bench-summary",
        "version": 1,
        "started": started.isoformat(timespec="seconds"),
        "profile": profile,
        "wall_s": round(wall_s, 1),
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "git": {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))},
        "failed": [n for n, r in runs.items() if r.status == "failed"],
        "skipped": [n for n, r in runs.items() if r.status == "skipped"],
        "goal_counts": counts,
        "figures": figures,
        "benches": {n: r.to_json() for n, r in runs.items()},
    }


def resummarize(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with its figures evaluated again by today's :data:`FIGURES` (the benches'
    results are kept whole, so a changed goal table needs no rerun)."""
    runs = {n: BenchRun.from_json(n, d) for n, d in summary["benches"].items()}
    out = summarize(
        runs,
        profile=summary["profile"],
        started=dt.datetime.fromisoformat(summary["started"]),
        wall_s=summary["wall_s"],
    )
    out["host"], out["git"] = summary["host"], summary["git"]
    if "logs" in summary:
        out["logs"] = summary["logs"]
    return out


def exit_code(summary: Mapping[str, Any]) -> int:
    """1 if any bench failed; goals not met do not fail the run."""
    return 1 if summary.get("failed") else 0


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def print_summary(summary: Mapping[str, Any], path: Path | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    # a file or a pipe (make bench | tee) gets wide rows, not 80 columns of folded text
    console = Console(width=None if sys.stdout.isatty() else 150)
    runs = Table(title=f"benches ({summary['profile']} profile, {summary['wall_s']:.0f} s)")
    for col in ("bench", "status", "wall s", "host ns", "args / reason"):
        runs.add_column(col)
    style = {"ok": "green", "failed": "bold red", "skipped": "yellow"}
    for name, r in summary["benches"].items():
        detail = r["reason"] or " ".join(r["args"])
        if r["notes"]:
            detail += " (" + "; ".join(r["notes"]) + ")"
        host = r.get("host_python_ns")
        runs.add_row(
            name,
            f"[{style[r['status']]}]{r['status']}[/]",
            f"{r['wall_s']:.0f}",
            "-" if host is None else f"{host:.0f}",
            detail,
        )
    console.print(runs)
    figs = Table(title="figures and goals")
    for col in ("figure", "what", "value", "unit", "goal", "status", "source"):
        figs.add_column(col, overflow="fold")
    colour = {
        "met": "green",
        "not met": "bold red",
        "no figure": "yellow",
        "bench failed": "bold red",
        "info": "dim",
    }
    for row in summary["figures"]:
        figs.add_row(
            row["key"],
            f"[dim]{row['what']}[/]",
            _fmt(row["value"]),
            row["unit"],
            row["goal"],
            f"[{colour[row['status']]}]{row['status']}[/]",
            row["source"],
        )
    console.print(figs)
    for name, r in summary["benches"].items():
        if r["status"] == "failed":
            console.print(f"[bold red]{name} failed[/]: {r['reason']}\n{r['stderr_tail']}")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["goal_counts"].items()))
    console.print(f"goals: {counts}")
    if path is not None:
        console.print(f"summary: {path}")


def select(only: Iterable[str], skip: Iterable[str]) -> list[BenchSpec]:
    only, skip = list(only), list(skip)
    unknown = [n for n in [*only, *skip] if n not in BENCH_NAMES]
    if unknown:
        raise ValueError(f"unknown bench {', '.join(unknown)}; known: {', '.join(BENCH_NAMES)}")
    return [b for b in BENCHES if (not only or b.name in only) and b.name not in skip]


def parse_bench_args(items: Iterable[str]) -> dict[str, list[str]]:
    """``["query=--events 10 --lookups 5"]`` -> ``{"query": ["--events", "10", ...]}``."""
    import shlex

    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        if not sep or name not in BENCH_NAMES:
            raise ValueError(
                f"expected NAME=ARGS with NAME one of {', '.join(BENCH_NAMES)}: {item!r}"
            )
        out[name] = shlex.split(rest)
    return out


def run_all(
    specs: Sequence[BenchSpec],
    *,
    profile: str = "quick",
    out_dir: Path = DEFAULT_OUT,
    quiet: bool = False,
    bench_args: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, Any], Path]:
    """Run ``specs`` in order (``bench_args``: a bench's arguments instead of the profile's);
    write and return the summary and its path."""
    bench_args = bench_args or {}
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y-%m-%dT%H%M%SZ")
    log_dir = out_dir / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    runs: dict[str, BenchRun] = {}
    with HostProbe() as probe:
        for i, spec in enumerate(specs, 1):
            args = bench_args.get(spec.name)
            shown = " ".join(spec.args(profile) if args is None else args)
            print(f"=== [{i}/{len(specs)}] {spec.name} {shown}", flush=True)

            def echo(line: str, name: str = spec.name) -> None:
                print(f"  {name:>16} | {line}", flush=True)

            began = time.monotonic()
            probe.kick()
            run = run_bench(spec, profile, log_dir, None if quiet else echo, args)
            run.host_python_ns = probe.median(began, time.monotonic())
            runs[spec.name] = run
            print(
                f"=== {spec.name}: {run.status} in {run.wall_s:.0f} s"
                + (f" ({run.reason})" if run.reason else "")
                + (f", host {run.host_python_ns:.0f} ns" if run.host_python_ns else ""),
                flush=True,
            )
    summary = summarize(runs, profile=profile, started=started, wall_s=time.monotonic() - t0)
    summary["logs"] = str(log_dir)
    path = out_dir / f"summary-{stamp}.json"
    path.write_text(json.dumps(summary, indent=1, sort_keys=False, default=str) + "\n")
    return summary, path


def main() -> None:
    import typer

    app = typer.Typer(add_completion=False)

    @app.command()
    def cli(
        profile: str = typer.Option("quick", help="quick (~10 min) or full (the goals' sizes)"),
        only: list[str] = typer.Option([], help="run only this bench (repeatable)"),  # noqa: B008
        skip: list[str] = typer.Option([], help="skip this bench (repeatable)"),  # noqa: B008
        out_dir: Path = typer.Option(DEFAULT_OUT, help="where the summary and logs go"),  # noqa: B008
        quiet: bool = typer.Option(False, help="do not echo the benches' output"),
        bench_args: list[str] = typer.Option(  # noqa: B008
            [],
            "--args",
            help="NAME='ARGS': run bench NAME with ARGS instead of the profile's (repeatable), "
            "e.g. --args 'query=--events 1000000 --lookups 100'",
        ),
        show: Path | None = typer.Option(  # noqa: B008
            None, help="run nothing: print this summary again, judged by today's goal table"
        ),
    ) -> None:
        """Run every benchmark and write one JSON summary, each figure next to its goal."""
        if show is not None:
            summary = resummarize(json.loads(show.read_text()))
            print_summary(summary, show)
            raise typer.Exit(exit_code(summary))
        if profile not in ("quick", "full"):
            raise typer.BadParameter("expected quick or full", param_hint="--profile")
        try:
            specs = select(only, skip)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        try:
            overrides = parse_bench_args(bench_args)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--args") from None
        summary, path = run_all(
            specs, profile=profile, out_dir=out_dir, quiet=quiet, bench_args=overrides
        )
        print_summary(summary, path)
        print(json.dumps({k: summary[k] for k in ("wall_s", "failed", "goal_counts")}))
        raise typer.Exit(exit_code(summary))

    app()


if __name__ == "__main__":
    main()
