"""The spark-submit entry (``spark/src/tracemq_spark/submit.py``) under a real ``spark-submit``:
the arguments ``--spark-submit-args`` prints give the run the job's JVM path and flags (and the
ground truth's counts), and a run without them says what it lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import tracemq_spark
from tracemq_spark import cogroup
from tracemq_spark.job import OUTCOMES
from tracemq_spark.session import JIT_HUGE

from tests.spark.conftest import END, MSGID_ZONE, NOW, START, Lake

# Spark runs only in the spark-submit subprocesses here: not tied to the worker of the shared
# in-process session (tests/conftest.py)
pytestmark = pytest.mark.spark_subprocess

SUBMIT = Path(tracemq_spark.__file__).with_name("submit.py")
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


def _iso(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _printed(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SUBMIT), "--spark-submit-args", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def _conf_of(lines: list[str]) -> dict[str, str]:
    assert lines and len(lines) % 2 == 0, lines
    assert set(lines[0::2]) == {"--conf"}, lines
    return dict(item.split("=", 1) for item in lines[1::2])


def test_spark_submit_args_are_the_launch_settings() -> None:
    env = {
        **os.environ,
        # an object store's credentials are never printed (only launch settings are)
        "TRACEMQ_SPARK_S3A_ACCESS_KEY": "AKIA-not-printed",
        "TRACEMQ_SPARK_S3A_SECRET_KEY": "secret-not-printed",
        "TRACEMQ_SPARK_S3A_PACKAGES": "org.apache.hadoop:hadoop-aws:3.4.1",
    }
    p = _printed("--driver-memory", "3g", env=env)
    assert p.returncode == 0, p.stderr
    assert "not-printed" not in p.stdout
    conf = _conf_of(p.stdout.splitlines())
    jar = cogroup.jar_path()
    assert jar is not None, "make setup builds the job's jar"
    assert conf["spark.driver.memory"] == "3g"
    assert conf["spark.driver.extraClassPath"] == str(jar)
    assert str(jar) in conf["spark.jars"].split(",")
    assert conf["spark.jars.packages"] == "org.apache.hadoop:hadoop-aws:3.4.1"
    driver = conf["spark.driver.extraJavaOptions"].split()
    executor = conf["spark.executor.extraJavaOptions"].split()
    assert "-Xms3g" in driver and "-Xms3g" not in executor
    for opts in (driver, executor):
        assert JIT_HUGE in opts and "-XX:+UseParallelGC" in opts
    # no size given: no heap setting at all
    plain = _conf_of(_printed().stdout.splitlines())
    assert "spark.driver.memory" not in plain
    assert not any(o.startswith("-Xms") for o in plain["spark.driver.extraJavaOptions"].split())


@pytest.mark.parametrize(
    ("args", "env_extra", "expected"),
    [
        (["--driver-memory", "ten"], {}, "--driver-memory 'ten': expected a size like 10g"),
        ([], {"TRACEMQ_SPARK_S3A_PATH_STYLE": "maybe"}, "TRACEMQ_SPARK_S3A_PATH_STYLE='maybe'"),
    ],
)
def test_spark_submit_args_bad_input(
    args: list[str], env_extra: dict[str, str], expected: str
) -> None:
    p = _printed(*args, env={**os.environ, **env_extra})
    assert p.returncode == 2 and expected in p.stderr, p.stderr
    assert p.stdout == ""


def _submit(
    lake: Lake, out: Path, tmp: Path, launch: list[str]
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,  # (spark-submit's default is whatever python3 is)
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_DIRS": str(tmp / "local"),
    }
    cmd = [
        str(SPARK_SUBMIT),
        *launch,
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        f"spark.sql.warehouse.dir={tmp / 'warehouse'}",
        str(SUBMIT),
        "--lake",
        str(lake.path),
        "--out",
        str(out),
        "--subscriptions",
        str(lake.subscriptions),
        "--offsets",
        str(lake.offsets),
        "--from",
        _iso(START),
        "--to",
        _iso(END),
        "--now",
        _iso(NOW),
        "--msgid-timezone",
        MSGID_ZONE,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)


def test_spark_submit_run_with_the_printed_args(lake: Lake, tmp_path: Path) -> None:
    launch = _printed("--driver-memory", "1g").stdout.splitlines()
    out = tmp_path / "out"
    p = _submit(lake, out, tmp_path, launch)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # (spark-submit runs the Python driver with its stderr merged into its stdout)
    said = p.stdout + p.stderr
    assert "classification: co-group by msgId (JVM code)" in p.stdout, p.stdout
    assert "note: this spark-submit run lacks" not in said, said
    # the counts of the lake's ground truth, as tests/spark/test_exactness.py holds the
    # in-process run's
    summary = json.loads((out / "summary.json").read_text())
    expected = Counter(lake.gen.truth.column("outcome").to_pylist())
    assert summary["outcomes"] == {o: expected.get(o, 0) for o in OUTCOMES}
    assert summary["informational"] == lake.gen.informational
    assert summary["anomalies"] == sum(n for o, n in expected.items() if o != "CONSUMED")


def test_spark_submit_run_without_them_says_what_it_lacks(lake: Lake, tmp_path: Path) -> None:
    """A bare spark-submit run notes what it lacks before the job starts. (Its offsets file is
    missing, so the job stops at its first step: the JVM's start is the whole cost here; the
    DataFrame path's outputs are held to the JVM path's by tests/spark/test_cogroup.py.)"""
    missing = Lake(lake.gen, lake.path, lake.subscriptions, tmp_path / "no-offsets.json")
    out = tmp_path / "out"
    p = _submit(missing, out, tmp_path, [])
    said = p.stdout + p.stderr
    assert p.returncode == 2, said[-3000:]
    assert f"error: offsets file not found: {missing.offsets}" in said, said[-3000:]
    note = [line for line in said.splitlines() if line.startswith("note: ")]
    assert len(note) == 1, said[-3000:]
    assert "lacks the job's jar" in note[0] and "its JVM flags" in note[0], note
    assert "submit.py --spark-submit-args" in note[0]
    assert not out.exists()
