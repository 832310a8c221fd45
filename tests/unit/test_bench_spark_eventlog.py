"""bench/spark_eventlog.py: per-stage task CPU summed from a Spark event log (a hand-made one)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench import spark_eventlog as sel


def _task(stage: int, cpu_ns: int, run_ms: int, written: int, read: int) -> dict[str, object]:
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage,
        "Task Metrics": {
            "Executor CPU Time": cpu_ns,
            "Executor Run Time": run_ms,
            "Shuffle Write Metrics": {"Shuffle Bytes Written": written},
            "Shuffle Read Metrics": {"Remote Bytes Read": read, "Local Bytes Read": read},
        },
    }


def _write_run(root: Path, name: str, events: list[dict[str, object]]) -> Path:
    run = root / name
    run.mkdir()
    (run / "events_1_app").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_stage_figures_sum_the_tasks_of_each_stage_and_name_their_sql(tmp_path: Path) -> None:
    old = _write_run(tmp_path, "eventlog_v2_old", [_task(0, 9_000_000_000, 1, 0, 0)])
    os.utime(old, (1, 1))  # the older run: a directory of runs reads the newest
    _write_run(
        tmp_path,
        "eventlog_v2_new",
        [
            {
                "Event": "SparkListenerJobStart",
                "Stage IDs": [3, 4],
                "Properties": {"spark.sql.execution.id": "7"},
            },
            {
                "Event": "SparkListenerStageSubmitted",
                "Stage Info": {"Stage ID": 3, "RDD Info": [{"Name": "Exchange x"}]},
            },
            _task(3, 1_500_000_000, 2_000, 1_000_000, 0),
            _task(3, 500_000_000, 1_000, 1_000_000, 0),
            _task(4, 250_000_000, 400, 0, 2_000_000),
        ],
    )
    stages = sel.stage_figures(tmp_path)
    assert stages == [
        {
            "stage": 3,
            "sql": "7",
            "tasks": 2,
            "cpu_s": 2.0,
            "run_s": 3.0,
            "shuffle_write_mb": 2.0,
            "shuffle_read_mb": 0.0,
            "rdds": "Exchange",
        },
        {
            "stage": 4,
            "sql": "7",
            "tasks": 1,
            "cpu_s": 0.25,
            "run_s": 0.4,
            "shuffle_write_mb": 0.0,
            "shuffle_read_mb": 4.0,
            "rdds": "",
        },
    ]
