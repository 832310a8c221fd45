"""The CLI's failures without a stack: the real ``tracemq`` command against closed ports and
bad input. Every failure is one line on stderr naming what to check; exit 2 for bad usage, 1
for a dependency that did not answer; ``--debug`` shows the traceback (issue 15, points 1, 4
and 5)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracemq_devkit.devstack.stack import tracemq_command

from tests.support.http_stub import QuietHandler, serving


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No stack to find: an empty dev home and registry, no TRACEMQ_* settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")}
    return {
        **base,
        "TRACEMQ_DEV_HOME": str(tmp_path / "dev"),
        "TRACEMQ_STACKS_DIR": str(tmp_path / "stacks"),
    }


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tracemq_command(), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and "Unclosed" not in res.stderr, res.stderr
    return lines[0]


def test_topic_list_without_kafka_is_one_line_exit_1(env: dict[str, str]) -> None:
    port = _closed_port()
    res = run(
        env,
        "topic", "list", "-b", "broker-a",
        "--bootstrap", f"127.0.0.1:{port}", "--redis-url", f"redis://127.0.0.1:{port}/0",
    )  # fmt: skip
    assert res.returncode == 1
    line = one_line(res)
    assert f"127.0.0.1:{port}" in line and "did not answer" in line and "--bootstrap" in line


@pytest.mark.parametrize("args", [["route", "show", "TopicTest"], ["trace", "lag"]])
def test_redis_down_is_one_line_exit_1(env: dict[str, str], args: list[str]) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    res = run(env, *args, "--redis-url", url)
    assert res.returncode == 1
    line = one_line(res)
    assert f"Redis at {url} did not answer" in line and "--redis-url" in line


def test_debug_shows_the_traceback(env: dict[str, str]) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    res = run(env, "route", "show", "TopicTest", "--redis-url", url, "--debug")
    assert res.returncode == 1
    assert "Traceback" in res.stderr and "ConnectionError" in res.stderr


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["trace", "show", "X", "--url", "not-a-url"], "--url"),
        (["trace", "find", "-k", "a", "--topic", "bad topic", "--url", "http://x"], "--topic"),
        (["trace", "find", "-k", "a", "--begin", "yesterday", "--url", "http://x"], "--begin"),
        (["trace", "lag", "--wait", "-5"], "--wait"),
        (["route", "show", "bad topic"], "bad topic"),
        (["topic", "create", "T", "-b", "broker-a", "--read-queues", "0"], "--read-queues"),
        (["health", "not-a-url"], "not-a-url"),
    ],
)
def test_bad_usage_is_exit_2_naming_the_input(
    env: dict[str, str], args: list[str], names: str
) -> None:
    res = run(env, *args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert names in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_trace_find_takes_relative_times(env: dict[str, str]) -> None:
    """``-1h`` is a time for every command; here it passes parsing and reaches the collector."""
    url = f"http://127.0.0.1:{_closed_port()}"
    res = run(env, "trace", "find", "-k", "a", "--begin", "-1h", "--end", "now", "--url", url)
    assert res.returncode == 1
    assert f"the collector at {url} did not answer" in one_line(res)


@pytest.mark.spark
def test_reconcile_bad_master_is_one_line_exit_2(env: dict[str, str], tmp_path: Path) -> None:
    args = ["reconcile", "--from", "-1h", "--to", "now", "--lake", str(tmp_path)]
    res = run(env, *args, "--master", "nonsense")
    assert res.returncode == 2
    line = one_line(res)
    assert "--master" in line and "'nonsense'" in line and "local[*]" in line


@pytest.mark.spark
def test_reconcile_help_is_a_command_not_a_group(env: dict[str, str]) -> None:
    res = run(env, "reconcile", "--help")
    assert res.returncode == 0 and "--from" in res.stdout
    assert "COMMAND" not in res.stdout and "<bool>" not in res.stdout


def test_help_shows_no_type_placeholders_for_flags(env: dict[str, str]) -> None:
    res = run(env, "trace", "show", "--help")
    assert res.returncode == 0 and "--json" in res.stdout and "<bool>" not in res.stdout
    topic = run(env, "topic", "list", "--help")
    assert "--redis-url" in topic.stdout and "--json" in topic.stdout


class _Page(QuietHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.reply(200, b"<html>the trace viewer</html>", "text/html")


@pytest.fixture
def html_page() -> Iterator[str]:
    with serving(_Page) as url:
        yield f"{url}/"


def test_health_of_a_page_that_is_not_healthz_is_unhealthy(
    env: dict[str, str], html_page: str
) -> None:
    res = run(env, "health", html_page, "--timeout", "5")
    assert res.returncode == 1 and "healthy" not in res.stdout
    assert "not a tracemq /healthz" in res.stderr


def test_help_imports_no_client_transport_or_spark(env: dict[str, str]) -> None:
    """Start-up (point 5): ``--help`` must not import what takes seconds (bench/cli_startup.py
    measures the time itself)."""
    probe = (
        "import sys\n"
        "from tracemq.cli import main\n"
        "for argv in (['--help'], ['trace', 'show', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('aiokafka', 'redis', 'pyspark', 'tracemq._client', 'tracemq_devkit.devstack', 'rich')\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in heavy\n"
        "    or m in heavy))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    loaded = res.stdout.rsplit("LOADED", 1)[1].strip()
    assert loaded == "[]", loaded
