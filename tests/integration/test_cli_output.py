"""What the CLI prints against the real stack (issue 15, points 4 and 11): tables fit the
terminal with one line per row, tables by default and ``--json`` everywhere, and an unknown
topic or trace topic is an error, not an empty table."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import tracemq_command

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def run(
    stack: EmbeddedStack, *args: str, columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")}
    env.update(stack.client_env())
    env["TRACEMQ_DEV_HOME"] = str(stack.workdir / "no-dev-home")  # only the stack given here
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [*tracemq_command(), *args], capture_output=True, text=True, timeout=60, env=env
    )


def _rows(table: str) -> list[str]:
    """The body lines of a rich table (between the header rule and the bottom rule)."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[start + 1 : end]


def test_tables_fit_a_narrow_terminal(stack: EmbeddedStack) -> None:
    res = run(stack, "route", "show", "RMQ_SYS_TRACE_TOPIC", columns=64)
    assert res.returncode == 0, res.stderr
    assert all(len(line) <= 64 for line in res.stdout.splitlines()), res.stdout
    # one trace broker: one line, not a row wrapped into several
    assert len(_rows(res.stdout)) == 1, res.stdout


def test_topic_list_is_a_table_and_json_on_request(stack: EmbeddedStack) -> None:
    table = run(stack, "topic", "list", "--broker", "trace-broker")
    assert table.returncode == 0, table.stderr
    assert "topics of trace-broker" in table.stdout and "RMQ_SYS_TRACE_TOPIC" in table.stdout
    assert not table.stdout.lstrip().startswith("{")
    as_json = run(stack, "topic", "list", "--broker", "trace-broker", "--json")
    assert "RMQ_SYS_TRACE_TOPIC" in json.loads(as_json.stdout)["topics"]


def test_unknown_topic_is_an_error_not_an_empty_table(stack: EmbeddedStack, unique: str) -> None:
    res = run(stack, "route", "show", f"NoSuchTopic_{unique}")
    assert res.returncode == 1
    assert res.stdout == "" and f"no route for topic 'NoSuchTopic_{unique}'" in res.stderr


def test_lag_of_an_unknown_trace_topic_is_an_error(stack: EmbeddedStack, unique: str) -> None:
    res = run(stack, "trace", "lag", "--trace-topic", f"NoSuchTraceTopic_{unique}")
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"NoSuchTraceTopic_{unique}" in res.stderr and "│" not in res.stdout
