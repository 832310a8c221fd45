"""Spark test fixtures: one local[2] SparkSession for the whole session, a small synthetic lake
with its ground truth, and helpers to fingerprint an output directory."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SESSION_PIDS

START = int(dt.datetime(2024, 3, 10, 10, tzinfo=dt.UTC).timestamp() * 1000)
END = START + 3_600_000
MIN = 60_000
#: the exactness run's "now": 15 minutes before to + horizon, so PENDING happens too
NOW = END + 15 * MIN
#: the zone the job reads msgIds in (and orphans' producers write them in): the window starts
#: at Los Angeles' DST change (2024-03-10 02:00 PST = 10:00 UTC); the Pub'd messages' producers
#: write theirs in Asia/Shanghai and Europe/Berlin (one over IPv6)
MSGID_ZONE = "America/Los_Angeles"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.spark)
            # a Spark job on 2 shared cores: far longer than the suite's default 120 s budget
            item.add_marker(pytest.mark.timeout(900))
            # pyspark's own deprecation noise must not fail the suite (filterwarnings=error)
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:pyspark.*"))
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning:py4j.*"))
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tracemq_spark.job import build_session

    base = tmp_path_factory.mktemp("spark")
    session = build_session(
        "local[2]",
        app_name="tracemq-reconcile-tests",
        driver_memory="2g",
        shuffle_partitions=4,
        extra={
            "spark.ui.enabled": "false",
            "spark.sql.warehouse.dir": str(base / "warehouse"),
            "spark.local.dir": str(base / "local"),
            "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={base}",
        },
    )
    proc = getattr(session.sparkContext._gateway, "proc", None)  # type: ignore[attr-defined]
    if proc is not None:
        SESSION_PIDS.add(proc.pid)
    try:
        yield session
    finally:
        from pyspark import SparkContext

        session.stop()
        gateway = SparkContext._gateway  # type: ignore[attr-defined]
        if gateway is not None:
            gateway.shutdown()
            SparkContext._gateway = None  # type: ignore[attr-defined]
            SparkContext._jvm = None  # type: ignore[attr-defined]
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()  # the gateway JVM exits at EOF on its stdin
                proc.wait(timeout=60)
            finally:
                SESSION_PIDS.discard(proc.pid)


@dataclass
class Lake:
    gen: Any  # GeneratedLake
    path: Path
    subscriptions: Path
    offsets: Path


@pytest.fixture(scope="session")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    from tracemq_devkit.generator import Scenario, generate

    root = tmp_path_factory.mktemp("lake")
    gen = generate(
        root / "lake",
        Scenario(
            start_ms=START, end_ms=END, messages=2500, now_ms=NOW, seed=11, msgid_zone=MSGID_ZONE
        ),
        # (as many row groups per file as the collector's files at scale: the job splits it by
        # msgId range as it would them)
        rows_per_group=128,
    )
    subs, offs = gen.write_inputs(root / "inputs")
    return Lake(gen, root / "lake", subs, offs)


def fingerprint(directory: Path) -> dict[str, str]:
    """relative path → sha256 of every file under ``directory`` (empty if it is missing)."""
    out: dict[str, str] = {}
    if not directory.exists():
        return out
    for dirpath, _, files in os.walk(directory):
        for name in files:
            p = Path(dirpath) / name
            out[str(p.relative_to(directory))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def params(lake: Lake, out: Path, **kw: Any) -> Any:
    from tracemq_spark.job import Params

    base: dict[str, Any] = dict(
        lake=str(lake.path),
        out=str(out),
        from_ms=START,
        to_ms=END,
        subscriptions=str(lake.subscriptions),
        offsets=str(lake.offsets),
        now_ms=NOW,
        msgid_timezone=MSGID_ZONE,
    )
    base.update(kw)
    return Params(**base)
