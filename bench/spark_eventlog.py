"""Per-stage task CPU of a Spark run, from its event log.

    .venv/bin/python bench/spark_eventlog.py EVENT_LOG [--min-cpu 0.3]

``EVENT_LOG`` is an event-log directory (``eventlog_v2_<app id>/``, Spark 4's default layout),
one of its ``events_*`` files, or a directory of such directories (then the newest run). Files
compressed with zstd (Spark's default codec) need the ``zstandard`` package. One line per stage:
its SQL execution, task count, task CPU and run time summed over the tasks, shuffle written
and read; the total task CPU last.

Task CPU (``Executor CPU Time``) is the figure to compare between runs on a shared machine: run
time counts the time a task waited for a core, task CPU does not (it still moves by a few
percent between two runs of the same code). ``bench/reconcile.py --event-log DIR`` writes one
log per run.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    runs = sorted(
        (p for p in path.iterdir() if p.is_dir() and p.name.startswith("eventlog_v2_")),
        key=lambda p: p.stat().st_mtime,
    )
    if runs:  # a directory of runs: the newest one
        path = runs[-1]
    return sorted(p for p in path.iterdir() if p.name.startswith("events_"))


def _lines(f: Path) -> Iterator[str]:
    if f.suffix == ".zstd":
        import zstandard

        with f.open("rb") as fh:
            yield from io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), "utf-8")
    else:
        with f.open(encoding="utf-8") as fh:
            yield from fh


def stage_figures(path: Path) -> list[dict[str, Any]]:
    """One dict per stage (in stage order): ``stage``, ``sql`` (execution id), ``tasks``,
    ``cpu_s``, ``run_s``, ``shuffle_write_mb``, ``shuffle_read_mb``, ``rdds``."""
    cpu: Counter[int] = Counter()
    run: Counter[int] = Counter()
    tasks: Counter[int] = Counter()
    written: Counter[int] = Counter()
    read: Counter[int] = Counter()
    sql: dict[int, str | None] = {}
    rdds: dict[int, str] = {}
    for f in _files(path):
        for line in _lines(f):
            e = json.loads(line)
            kind = e["Event"]
            if kind == "SparkListenerJobStart":
                x = (e.get("Properties") or {}).get("spark.sql.execution.id")
                for s in e["Stage IDs"]:
                    sql.setdefault(s, x)
            elif kind == "SparkListenerStageSubmitted":
                info = e["Stage Info"]
                names = {r["Name"].split(" ")[0] for r in info["RDD Info"]}
                rdds[info["Stage ID"]] = ",".join(sorted(names))
            elif kind == "SparkListenerTaskEnd":
                s = e["Stage ID"]
                m = e.get("Task Metrics") or {}
                cpu[s] += m.get("Executor CPU Time", 0) / 1e9
                run[s] += m.get("Executor Run Time", 0) / 1e3
                tasks[s] += 1
                written[s] += (m.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)
                r = m.get("Shuffle Read Metrics") or {}
                read[s] += r.get("Remote Bytes Read", 0) + r.get("Local Bytes Read", 0)
    return [
        {
            "stage": s,
            "sql": sql.get(s),
            "tasks": tasks[s],
            "cpu_s": round(cpu[s], 2),
            "run_s": round(run[s], 2),
            "shuffle_write_mb": round(written[s] / 1e6, 1),
            "shuffle_read_mb": round(read[s] / 1e6, 1),
            "rdds": rdds.get(s, ""),
        }
        for s in sorted(tasks)
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("event_log", type=Path)
    ap.add_argument("--min-cpu", type=float, default=0.3, help="leave out smaller stages (s)")
    args = ap.parse_args()
    stages = stage_figures(args.event_log)
    for s in stages:
        if s["cpu_s"] >= args.min_cpu:
            print(
                f"stage {s['stage']:4d}  sql {s['sql']!s:>3}  tasks {s['tasks']:4d}  "
                f"cpu {s['cpu_s']:7.1f}s  run {s['run_s']:7.1f}s  "
                f"shuffle write {s['shuffle_write_mb']:8.1f} MB  read {s['shuffle_read_mb']:8.1f} MB"
                f"  {s['rdds'][:60]}"
            )
    print(f"total task CPU {sum(s['cpu_s'] for s in stages):.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
