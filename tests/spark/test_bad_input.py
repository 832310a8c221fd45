"""Bad input through the command (in-process CliRunner on the typer app, plugged in as the
``tracemq`` CLI plugs it, and as a subprocess): a clear one-line error, exit code 2, and the
previous output left untouched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from tracemq import lake as lake_contract
from tracemq_spark import cli
from tracemq_spark.job import run
from typer.testing import CliRunner

from tests.spark.conftest import END, NOW, START, Lake, fingerprint, params


@pytest.fixture(scope="module")
def good_out(spark: Any, lake: Lake, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bad") / "out"
    run(spark, params(lake, out, from_ms=START, to_ms=START + 600_000))
    return out


def _tracemq_like_app() -> typer.Typer:
    """A parent app that plugs the command in the way ``tracemq.cli`` does."""
    parent = typer.Typer(no_args_is_help=True, add_completion=False)

    @parent.command("version")
    def _version() -> None:  # a second command, so "reconcile" stays a sub-command
        pass

    parent.command("reconcile")(cli.reconcile)  # a single command, as tracemq.cli plugs it in
    return parent


def _invoke(
    lake: Lake, out: Path, *args: str, lake_path: Path | None = None, offsets: Path | None = None
) -> Any:
    argv = [
        "reconcile",
        "--from",
        str(START),
        "--to",
        str(END),
        "--lake",
        str(lake_path or lake.path),
        "--out",
        str(out),
        "--subscriptions",
        str(lake.subscriptions),
        "--offsets",
        str(offsets or lake.offsets),
        "--now",
        str(NOW),
        *args,
    ]
    return CliRunner().invoke(_tracemq_like_app(), argv)


def _check(result: Any, out: Path, before: dict[str, str], needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and needle in result.output, result.output
    assert "Traceback" not in result.output
    assert fingerprint(out) == before


def test_to_before_from(lake: Lake, good_out: Path) -> None:
    before = fingerprint(good_out)
    r = CliRunner().invoke(
        _tracemq_like_app(),
        [
            "reconcile",
            "--from",
            "2024-03-10T11:00:00Z",
            "--to",
            "2024-03-10T10:00:00Z",
            "--lake",
            str(lake.path),
            "--out",
            str(good_out),
            "--subscriptions",
            str(lake.subscriptions),
            "--offsets",
            str(lake.offsets),
        ],
    )
    _check(r, good_out, before, "must be after --from")


def test_missing_lake(lake: Lake, good_out: Path, tmp_path: Path) -> None:
    before = fingerprint(good_out)
    _check(
        _invoke(lake, good_out, lake_path=tmp_path / "no-such-lake"),
        good_out,
        before,
        "trace lake not found",
    )


def test_empty_window(spark: Any, lake: Lake, good_out: Path) -> None:
    before = fingerprint(good_out)
    r = CliRunner().invoke(
        _tracemq_like_app(),
        [
            "reconcile",
            "--from",
            "2023-01-01T00:00:00Z",
            "--to",
            "2023-01-01T01:00:00Z",
            "--lake",
            str(lake.path),
            "--out",
            str(good_out),
            "--subscriptions",
            str(lake.subscriptions),
            "--offsets",
            str(lake.offsets),
        ],
    )
    _check(r, good_out, before, "empty window")


def test_corrupt_parquet_file(spark: Any, lake: Lake, good_out: Path, tmp_path: Path) -> None:
    bad = tmp_path / "lake"
    shutil.copytree(lake.path, bad)
    victim = sorted(bad.rglob("*.parquet"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # cut in half: footer gone
    before = fingerprint(good_out)
    _check(_invoke(lake, good_out, lake_path=bad), good_out, before, "corrupt Parquet file")
    assert victim.name in _invoke(lake, good_out, lake_path=bad).output


def test_unknown_schema_version(spark: Any, lake: Lake, good_out: Path, tmp_path: Path) -> None:
    bad = tmp_path / "lake"
    shutil.copytree(lake.path, bad)
    victim = sorted(bad.rglob("*.parquet"))[1]
    table = pq.read_table(victim)
    table = table.set_column(
        table.schema.get_field_index("schema_version"),
        "schema_version",
        pa.array([99] * table.num_rows, type=pa.int32()),
    )
    table = table.replace_schema_metadata({lake_contract.METADATA_KEY: b"99"})
    pq.write_table(table, victim)
    before = fingerprint(good_out)
    _check(_invoke(lake, good_out, lake_path=bad), good_out, before, "unknown lake schema version")


def test_malformed_offsets_snapshot(lake: Lake, good_out: Path, tmp_path: Path) -> None:
    """The snapshot is parsed in a thread beside the lake listing and pre-flight scan: its
    error still ends the run with exit 2 and one line naming the row, output untouched."""
    doc = json.loads(lake.offsets.read_text())
    copy = {"group": "G", "topic": "TopicA", "store_addr": "10.0.0.1:10911", "queue_id": 0,
            "queue_offset": 1, "msg_id": "M", "reconsume_times": 1}  # fmt: skip
    doc["copies"] = [*doc.get("copies", []), copy]  # not a %RETRY% or %DLQ% topic
    bad = tmp_path / "offsets.json"
    bad.write_text(json.dumps(doc))
    before = fingerprint(good_out)
    result = _invoke(lake, good_out, offsets=bad)
    _check(result, good_out, before, "is not a %RETRY% or %DLQ% topic")
    assert "copies row" in result.output


def test_bad_duration_and_time(lake: Lake, good_out: Path) -> None:
    before = fingerprint(good_out)
    _check(_invoke(lake, good_out, "--horizon", "soon"), good_out, before, "not a duration")
    _check(
        _invoke(lake, good_out, "--msgid-timezone", "Mars/Olympus"),
        good_out,
        before,
        "--msgid-timezone: unknown time zone 'Mars/Olympus'",
    )
    r = CliRunner().invoke(
        _tracemq_like_app(),
        [
            "reconcile",
            "--from",
            "yesterday",
            "--to",
            "2024-03-10T10:00:00Z",
            "--lake",
            str(lake.path),
            "--out",
            str(good_out),
        ],
    )
    _check(r, good_out, before, "neither ISO 8601")


def test_subprocess_exit_code(lake: Lake, tmp_path: Path) -> None:
    """``python -m tracemq_spark`` (the same command as ``tracemq reconcile``)."""
    out = tmp_path / "out"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracemq_spark",
            "--from",
            "2024-03-10T11:00Z",
            "--to",
            "2024-03-10T10:00Z",
            "--lake",
            str(lake.path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2 and "must be after --from" in p.stderr, p.stderr
    assert not out.exists()


def test_registered_in_tracemq_cli() -> None:
    eps = {ep.name: ep for ep in entry_points(group="tracemq.commands")}
    assert "reconcile" in eps, "tracemq-spark's entry point is not installed"
    assert eps["reconcile"].load() is cli.app
    p = subprocess.run(
        [sys.executable, "-m", "tracemq", "reconcile", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0 and "--horizon" in p.stdout, p.stdout + p.stderr
