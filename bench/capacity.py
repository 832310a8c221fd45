"""Capacity model: what N messages a day with G consumer groups need, from MEASURED rates.

    .venv/bin/python bench/capacity.py [--summary bench/results/summary-<stamp>.json]
                                       [--messages-per-day 1e12] [--groups 3] [--peak-factor 3]
                                       [--retention-days 3] [--partition-mb-s 10] ...

Inputs are the figures of a ``make bench`` summary (``bench/run_all.py``): the per-message CPU
tracing adds in the producer and the consumer, one collector's sustained ingest rate and CPU per
event, trace / store / lake bytes per event, the reconcile job's events per core-second, the
store size the look-up latency was measured at. Without ``--summary`` it runs the benches it
needs first (producer, consumer, collector_ingest, query, reconcile; ~5 minutes). Assumptions
that no bench here can measure (a Kafka partition's throughput, S3's request rate per prefix,
one Redis's operations per second) are parameters, printed as such; the collector's own limits
(peers per fan-out, lake flush interval, segment size, retention, route refresh) are read from
the code. Prints the model as a table, then one JSON line last. docs/capacity.md explains it.

Model (all linear; peak = average x peak factor):

* trace events per message = 1 Pub + per group (SubBefore + SubAfter) x (1 + retry ratio);
* client CPU on tracing = messages/s x (producer's on-off CPU + groups x consumer's on-off CPU);
* collectors = peak events/s / one collector's sustained rate; collector cores from CPU/event;
* trace partitions = the most of: peak trace bytes/s / a partition's throughput; collectors (a
  partition is read by one collector at a time); a peak hour's lake bytes / the collector's
  memory goal (compaction holds one partition's closed hour in memory);
* store disk = events/day x store bytes/event per day of retention; lake = the same with lake
  bytes/event; Spark cores = one peak hour's events / (events per core-second x 15 min).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__:  # imported as bench.capacity (the unit tests): no sys.path change
    from bench import run_all as ra
else:  # run as a script: bench/ is sys.path[0]
    import run_all as ra  # type: ignore[no-redef]

DAY_S = 86_400.0
HOUR_S = 3_600.0
MIB = 1024 * 1024

#: the benches whose figures the model needs
NEEDED = ("producer", "consumer", "collector_ingest", "query", "reconcile")


class ModelError(Exception):
    """The summary lacks a figure the model needs (names it)."""


@dataclass(frozen=True)
class Load:
    """What is planned for (parameters)."""

    messages_per_day: float = 1e12
    groups: int = 3
    peak_factor: float = 3.0
    #: share of consumes that fail once and are retried (each retry adds SubBefore + SubAfter)
    retry_ratio: float = 0.0
    retention_days: float | None = None  # None: the collector's default retention
    reconcile_window_s: float = HOUR_S
    reconcile_budget_s: float = 900.0


@dataclass(frozen=True)
class Assumptions:
    """Figures no bench on this machine measures: cited, not measured."""

    #: write throughput of one Kafka partition (a planning figure often cited for Kafka: ~10 MB/s
    #: per partition; the embedded Tansu here says nothing about a production cluster)
    partition_mb_s: float = 10.0
    #: S3 request rate per prefix (AWS documents 3 500 PUT/COPY/POST/DELETE per second per prefix)
    s3_puts_per_prefix_s: float = 3_500.0
    #: operations per second one Redis serves comfortably (single-threaded; a planning figure)
    redis_ops_s: float = 100_000.0
    #: the collector's memory goal (issue 19: peak RSS < 384 MiB)
    collector_memory_bytes: float = 384 * MIB


@dataclass(frozen=True)
class CodeLimits:
    """Limits read from the code (defaults of today's settings and constants)."""

    max_peers: int = 32  # tracemq_collector.queries.MAX_PEERS
    lake_flush_s: float = 5.0  # collector_lake_flush_interval_ms
    lake_segment_rows: int = 200_000  # collector_lake_segment_rows
    retention_days: float = 3.0  # collector_retention_days
    route_refresh_s: float = 30.0  # tracemq.routing.cache.RouteCache refresh_interval_s

    @classmethod
    def from_code(cls) -> CodeLimits:
        """Today's values; the defaults above when a package cannot be imported."""
        kw: dict[str, Any] = {}
        try:
            from tracemq_collector.queries import MAX_PEERS
            from tracemq_collector.settings import CollectorSettings

            f = CollectorSettings.model_fields
            kw["max_peers"] = MAX_PEERS
            kw["lake_flush_s"] = f["collector_lake_flush_interval_ms"].default / 1000
            kw["lake_segment_rows"] = f["collector_lake_segment_rows"].default
            kw["retention_days"] = f["collector_retention_days"].default
        except ImportError:
            pass
        try:
            from tracemq.routing.cache import RouteCache

            p = inspect.signature(RouteCache.__init__).parameters.get("refresh_interval_s")
            if p is not None and isinstance(p.default, int | float):
                kw["route_refresh_s"] = float(p.default)
        except ImportError:
            pass
        return cls(**kw)


@dataclass(frozen=True)
class Rates:
    """Measured per-unit rates; ``sources`` says which bench and field each came from."""

    producer_trace_us: float  # CPU tracing adds per message sent
    consumer_trace_us: float  # CPU tracing adds per message consumed, per group
    collector_events_per_s: float  # one collector, sustained into store and lake
    collector_cpu_us_per_event: float
    trace_bytes_per_event: float  # on the trace topic
    store_bytes_per_event: float
    lake_bytes_per_event: float
    reconcile_events_per_core_s: float
    store_events_measured: float | None  # the store size look-ups were measured at
    lookup_p99_ms: float | None
    producer_msgs_per_s: float  # one traced producer (64 in flight)
    consumer_msgs_per_s: float  # one traced consumer, steady state
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    #: inputs of a break point only: the model still runs without them (said so)
    OPTIONAL = frozenset({"store_events_measured", "lookup_p99_ms"})
    #: field -> the run_all figure it is read from
    FROM_FIGURES = {
        "producer_trace_us": "producer.trace_cpu_us",
        "consumer_trace_us": "consumer.trace_cpu_us",
        "collector_events_per_s": "collector_ingest.events_per_s",
        "collector_cpu_us_per_event": "collector_ingest.cpu_us_per_event",
        "trace_bytes_per_event": "collector_ingest.trace_bytes_per_event",
        "store_bytes_per_event": "collector_ingest.store_bytes_per_event",
        "lake_bytes_per_event": "collector_ingest.lake_bytes_per_event",
        "reconcile_events_per_core_s": "reconcile.events_per_s",
        "store_events_measured": "query.store_events",
        "lookup_p99_ms": "query.p99_ms_msg_id",
        "producer_msgs_per_s": "producer.msgs_per_s_on",
        "consumer_msgs_per_s": "consumer.steady_msgs_per_s_on",
    }

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> Rates:
        """The rates of a ``make bench`` summary, its figures judged by today's table.

        Raises :class:`ModelError` naming every missing figure. A tracing cost measured below
        zero (noise: on and off within the machine's jitter) counts as zero, noted."""
        rows = {r["key"]: r for r in ra.resummarize(summary)["figures"]}
        values: dict[str, float] = {}  # None for a missing optional input
        sources: dict[str, str] = {}
        missing = []
        for name, key in cls.FROM_FIGURES.items():
            row = rows.get(key)
            if row is None or row["value"] is None:
                if name in cls.OPTIONAL:
                    values[name] = None  # type: ignore[assignment]
                    sources[name] = f"{key}: no figure in the summary"
                else:
                    missing.append(f"{key} ({name})")
                continue
            values[name] = float(row["value"])
            sources[name] = f"{key} = {row['from']}"
        if missing:
            raise ModelError("the summary lacks: " + ", ".join(missing))
        cores = _spark_cores(summary)
        values["reconcile_events_per_core_s"] /= cores
        sources["reconcile_events_per_core_s"] += f" / {cores} cores (local[{cores}])"
        for name in ("producer_trace_us", "consumer_trace_us"):
            if values[name] < 0:
                sources[name] += f" (measured {values[name]:.2f}: below zero is noise, taken as 0)"
                values[name] = 0.0
        return cls(**values, sources=sources)


def merge_summaries(summaries: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One summary of several: a later one's benches replace an earlier one's (only benches
    that ran ok replace: a failed rerun does not hide an earlier figure)."""
    out = dict(summaries[0])
    benches = dict(out["benches"])
    for s in summaries[1:]:
        for name, run in s["benches"].items():
            if run["status"] == "ok" or name not in benches:
                benches[name] = run
    out["benches"] = benches
    out["merged_from"] = [s.get("started") for s in summaries]
    return out


def _spark_cores(summary: Mapping[str, Any]) -> int:
    master = str(ra.dig(summary, "benches.reconcile.result.master") or "local[2]")
    inner = master.partition("[")[2].rstrip("]")
    return int(inner) if inner.isdigit() else 2


@dataclass(frozen=True)
class BreakPoint:
    """A limit the design meets as load grows: ``value`` against ``limit``."""

    name: str
    value: float
    limit: float
    unit: str
    #: True: value grows with the load (breaks at breaks_at_messages_per_day); False: a
    #: per-unit figure (per collector / partition) that is the same at any load once units run
    #: at their measured capacity
    scales: bool
    why: str
    #: "limit": a limit of the code or of a service (it breaks); "unmeasured": past the largest
    #: size a bench measured (nothing is known there: a risk, not a break)
    kind: str = "limit"

    @property
    def ratio(self) -> float:
        return self.value / self.limit if self.limit else math.inf


@dataclass(frozen=True)
class Plan:
    load: Load
    rates: Rates
    assumptions: Assumptions
    limits: CodeLimits
    figures: dict[str, float]
    units: dict[str, str]
    breaks: list[BreakPoint]
    notes: list[str] = field(default_factory=list)
    partitions_driver: str = ""

    def first_break(self) -> BreakPoint | None:
        """The limit the design reaches first as the load grows: a per-unit limit already
        passed (it holds at any load), else the load-proportional one that breaks at the
        fewest messages a day. "unmeasured" points are risks, not limits: never first."""
        limits = [b for b in self.breaks if b.kind == "limit"]
        per_unit = [b for b in limits if not b.scales and b.ratio >= 1]
        if per_unit:
            return max(per_unit, key=lambda b: b.ratio)
        scaling = [b for b in limits if b.scales and b.value > 0]
        return min(scaling, key=lambda b: 1 / b.ratio) if scaling else None

    def to_json(self) -> dict[str, Any]:
        fb = self.first_break()
        return {
            "load": asdict(self.load),
            "assumptions": asdict(self.assumptions),
            "code_limits": asdict(self.limits),
            "rates": {k: v for k, v in asdict(self.rates).items() if k != "sources"},
            "sources": self.rates.sources,
            "figures": {k: round(v, 3) for k, v in self.figures.items()},
            "units": self.units,
            "break_points": [
                asdict(b)
                | {
                    "ratio": round(b.ratio, 3),
                    "breaks_at_messages_per_day": _breaks_at(b, self.load),
                }
                for b in self.breaks
            ],  # fmt: skip
            "first_break": fb.name if fb else None,
            "notes": self.notes,
            "partitions_driver": self.partitions_driver,
        }


def _breaks_at(b: BreakPoint, load: Load) -> float | None:
    """The messages/day at which a load-proportional figure reaches its limit."""
    if not b.scales or b.value <= 0:
        return None
    return round(load.messages_per_day / b.ratio)


def events_per_message(groups: int, retry_ratio: float = 0.0) -> float:
    """Trace records per business message: a Pub, and per consumer group a SubBefore and a
    SubAfter per attempt (a retried consume adds one more pair)."""
    return 1 + groups * 2 * (1 + retry_ratio)


def plan(
    load: Load,
    rates: Rates,
    assumptions: Assumptions | None = None,
    limits: CodeLimits | None = None,
) -> Plan:
    """The model: pure arithmetic on ``load`` and ``rates``."""
    a = assumptions or Assumptions()
    lim = limits or CodeLimits()
    retention = load.retention_days if load.retention_days is not None else lim.retention_days
    msgs_s = load.messages_per_day / DAY_S
    msgs_peak = msgs_s * load.peak_factor
    epm = events_per_message(load.groups, load.retry_ratio)
    ev_s = msgs_s * epm
    ev_peak = ev_s * load.peak_factor
    ev_day = load.messages_per_day * epm

    trace_us_per_msg = rates.producer_trace_us + load.groups * rates.consumer_trace_us
    client_cores = msgs_s * trace_us_per_msg / 1e6
    collectors = math.ceil(ev_peak / rates.collector_events_per_s)
    collector_cores = ev_peak * rates.collector_cpu_us_per_event / 1e6
    trace_bytes_peak = ev_peak * rates.trace_bytes_per_event
    partitions_by_bytes = math.ceil(trace_bytes_peak / (a.partition_mb_s * 1e6))
    partitions_by_compaction = math.ceil(
        ev_peak * HOUR_S * rates.lake_bytes_per_event / a.collector_memory_bytes
    )
    drivers = {
        "trace bytes": partitions_by_bytes,
        "collectors": collectors,
        "compaction memory": partitions_by_compaction,
    }
    driver = max(drivers, key=lambda k: drivers[k])
    partitions = drivers[driver]
    store_day = ev_day * rates.store_bytes_per_event
    lake_day = ev_day * rates.lake_bytes_per_event
    hour_events_peak = ev_peak * load.reconcile_window_s
    spark_cores = math.ceil(
        hour_events_peak / (rates.reconcile_events_per_core_s * load.reconcile_budget_s)
    )
    spark_cores_avg = math.ceil(
        ev_s
        * load.reconcile_window_s
        / (rates.reconcile_events_per_core_s * load.reconcile_budget_s)
    )
    producers = math.ceil(msgs_peak / rates.producer_msgs_per_s)
    consumers = math.ceil(load.groups * msgs_peak / rates.consumer_msgs_per_s)

    # per collector and per partition (at peak, evenly spread)
    store_events_per_collector = ev_day * retention / collectors
    ev_per_partition_s = ev_peak / partitions
    # a partition's lake segment closes at the flush interval or at segment_rows events;
    # it is one file per date/hour it spans (about one)
    files_per_partition_hour = HOUR_S / min(
        lim.lake_flush_s, lim.lake_segment_rows / ev_per_partition_s
    )
    lake_files_hour = partitions * files_per_partition_hour
    compaction_bytes = ev_per_partition_s * HOUR_S * rates.lake_bytes_per_event
    redis_ops = (producers + consumers) / lim.route_refresh_s

    figures = {
        "messages_per_s_avg": msgs_s,
        "messages_per_s_peak": msgs_peak,
        "trace_events_per_message": epm,
        "trace_events_per_day": ev_day,
        "trace_events_per_s_avg": ev_s,
        "trace_events_per_s_peak": ev_peak,
        "client_trace_us_per_message": trace_us_per_msg,
        "client_trace_cores_avg": client_cores,
        "client_trace_cores_peak": client_cores * load.peak_factor,
        "trace_bytes_per_s_peak": trace_bytes_peak,
        "trace_partitions_by_bytes": partitions_by_bytes,
        "trace_partitions_by_compaction": partitions_by_compaction,
        "trace_partitions": partitions,
        "collectors": collectors,
        "collector_cores_peak": collector_cores,
        "store_bytes_per_retention_day": store_day,
        "store_bytes_total": store_day * retention,
        "store_bytes_per_collector": store_day * retention / collectors,
        "store_events_per_collector": store_events_per_collector,
        "lake_bytes_per_day": lake_day,
        "spark_cores_peak_hour": spark_cores,
        "spark_cores_avg_hour": spark_cores_avg,
        "producers_traced": producers,
        "consumers_traced": consumers,
        "lake_files_per_hour": lake_files_hour,
        "lake_puts_per_s": lake_files_hour / HOUR_S,
        "compaction_bytes_per_partition_hour": compaction_bytes,
        "redis_route_reads_per_s": redis_ops,
    }
    units = {
        "messages_per_s_avg": "msg/s",
        "messages_per_s_peak": "msg/s",
        "trace_events_per_message": "events",
        "trace_events_per_day": "events",
        "trace_events_per_s_avg": "events/s",
        "trace_events_per_s_peak": "events/s",
        "client_trace_us_per_message": "us",
        "client_trace_cores_avg": "cores",
        "client_trace_cores_peak": "cores",
        "trace_bytes_per_s_peak": "B/s",
        "trace_partitions_by_bytes": "partitions",
        "trace_partitions_by_compaction": "partitions",
        "trace_partitions": "partitions",
        "collectors": "collectors",
        "collector_cores_peak": "cores",
        "store_bytes_per_retention_day": "B",
        "store_bytes_total": "B",
        "store_bytes_per_collector": "B",
        "store_events_per_collector": "events",
        "lake_bytes_per_day": "B",
        "spark_cores_peak_hour": "cores",
        "spark_cores_avg_hour": "cores",
        "producers_traced": "clients",
        "consumers_traced": "clients",
        "lake_files_per_hour": "files",
        "lake_puts_per_s": "PUT/s",
        "compaction_bytes_per_partition_hour": "B",
        "redis_route_reads_per_s": "ops/s",
    }
    breaks = [
        BreakPoint(
            "query fan-out width",
            collectors,
            lim.max_peers + 1,
            "collectors",
            True,
            f"a look-up asks this collector and at most {lim.max_peers} peers "
            "(tracemq_collector.queries.MAX_PEERS); past that, stores are not asked (the lake "
            "fallback must answer) and every look-up costs one request per collector",
        ),
        BreakPoint(
            "lake PUTs per second into one date=/hour= prefix",
            lake_files_hour / HOUR_S,
            a.s3_puts_per_prefix_s,
            "PUT/s",
            True,
            f"each partition writes a file every {lim.lake_flush_s:g} s (or "
            f"{lim.lake_segment_rows:,} events), all under the current hour's prefix; S3 "
            "throttles a prefix past its request rate (assumption)",
        ),
        BreakPoint(
            "Redis route reads",
            redis_ops,
            a.redis_ops_s,
            "ops/s",
            True,
            f"each traced client refreshes its routes every {lim.route_refresh_s:g} s; clients "
            "counted at the measured per-client rates (assumption: one Redis's ops/s)",
        ),
    ]
    notes = [f"trace partitions are set by {driver} ({partitions:,})"]
    if rates.store_events_measured:
        p99 = "?" if rates.lookup_p99_ms is None else f"{rates.lookup_p99_ms:g}"
        breaks.insert(
            1,
            BreakPoint(
                "store per collector vs the size look-ups were measured at",
                store_events_per_collector,
                rates.store_events_measured,
                "events",
                False,
                "a collector's SQLite store holds its partitions' events for the retention; "
                f"look-up latency (p99 {p99} ms) is measured only up to "
                f"{rates.store_events_measured:,.0f} events",
                kind="unmeasured",
            ),
        )
    else:
        notes.append(
            "no store size from bench/query.py: the store-per-collector break point is missing"
        )
    return Plan(load, rates, a, lim, figures, units, breaks, notes, partitions_driver=driver)


# ----------------------------------------------------------------------------- output


def human(v: float, unit: str = "") -> str:
    """``1.2 T``-style numbers; bytes in decimal units (kB, MB, GB, TB, PB)."""
    if unit == "B" or unit == "B/s":
        for div, name in ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(v) >= div:
                return f"{v / div:,.3g} {name}" + ("/s" if unit == "B/s" else "")
        return f"{v:,.0f} {unit}"
    for div, name in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:,.3g} {name} {unit}".rstrip()
    if v == int(v):
        return f"{v:,.0f} {unit}".rstrip()
    return f"{v:,.3g} {unit}".rstrip()


def print_plan(p: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    inputs = Table(title="measured inputs")
    for col in ("rate", "value", "from (bench: field)"):
        inputs.add_column(col, overflow="fold")
    for k, v in asdict(p.rates).items():
        if k != "sources":
            shown = "-" if v is None else f"{v:,.4g}"
            inputs.add_row(k, shown, p.rates.sources.get(k, "(given)"))
    console.print(inputs)
    t = Table(
        title=f"{p.load.messages_per_day:,.3g} messages/day, {p.load.groups} groups, peak "
        f"{p.load.peak_factor:g}x average"
    )
    for col in ("figure", "value"):
        t.add_column(col)
    for k, v in p.figures.items():
        t.add_row(k, human(v, p.units[k]))
    console.print(t)
    b = Table(title="break points (value / limit; >= 1: past it)")
    for col in ("break point", "kind", "value", "limit", "ratio", "breaks at msg/day", "why"):
        b.add_column(col, overflow="fold")
    for bp in sorted(p.breaks, key=lambda x: -x.ratio):
        at = _breaks_at(bp, p.load)
        b.add_row(
            bp.name,
            bp.kind,
            human(bp.value, bp.unit),
            human(bp.limit, bp.unit),
            f"{bp.ratio:,.3g}",
            human(at) if at else "per collector: any load",
            bp.why,
        )
    console.print(b)
    fb = p.first_break()
    console.print(f"breaks first: {fb.name if fb else 'nothing at this load'}")
    for note in p.notes:
        console.print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--summary",
        type=Path,
        action="append",
        help="a make bench summary (default: run the benches); repeated, a later file's "
        "benches replace an earlier one's (e.g. one bench rerun on its own)",
    )
    ap.add_argument("--messages-per-day", type=float, default=Load.messages_per_day)
    ap.add_argument("--groups", type=int, default=Load.groups)
    ap.add_argument("--peak-factor", type=float, default=Load.peak_factor)
    ap.add_argument("--retry-ratio", type=float, default=Load.retry_ratio)
    ap.add_argument("--retention-days", type=float, default=None, help="default: the collector's")
    ap.add_argument("--reconcile-budget-s", type=float, default=Load.reconcile_budget_s)
    ap.add_argument("--partition-mb-s", type=float, default=Assumptions.partition_mb_s)
    ap.add_argument("--s3-puts-per-prefix-s", type=float, default=Assumptions.s3_puts_per_prefix_s)
    ap.add_argument("--redis-ops-s", type=float, default=Assumptions.redis_ops_s)
    ap.add_argument("--profile", default="quick", help="when running the benches: quick or full")
    args = ap.parse_args(argv)
    if args.messages_per_day <= 0 or args.groups < 0 or args.peak_factor < 1:
        ap.error("--messages-per-day must be > 0, --groups >= 0, --peak-factor >= 1")
    if args.summary is None:
        print(f"no --summary: running {', '.join(NEEDED)} (bench/run_all.py)", flush=True)
        summary, path = ra.run_all(ra.select(NEEDED, []), profile=args.profile, quiet=True)
        print(f"summary: {path}", flush=True)
    else:
        loaded = []
        for path in args.summary:
            try:
                loaded.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                ap.error(f"--summary {path}: {exc}")
        summary = merge_summaries(loaded)
    try:
        rates = Rates.from_summary(summary)
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    load = Load(
        messages_per_day=args.messages_per_day,
        groups=args.groups,
        peak_factor=args.peak_factor,
        retry_ratio=args.retry_ratio,
        retention_days=args.retention_days,
        reconcile_budget_s=args.reconcile_budget_s,
    )
    assumptions = Assumptions(
        partition_mb_s=args.partition_mb_s,
        s3_puts_per_prefix_s=args.s3_puts_per_prefix_s,
        redis_ops_s=args.redis_ops_s,
    )
    p = plan(load, rates, assumptions, CodeLimits.from_code())
    print_plan(p)
    out = p.to_json() | {"summary_started": summary.get("started"), "git": summary.get("git")}
    print(json.dumps(out, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
