"""The launcher's commands as a script uses them: `tracemq dev up --detach / status --json /
down`, `tracemq demo`, and services refusing a bad setting."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tracemq.devstack.stack import tracemq_command

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tracemq_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def test_dev_up_detach_status_down(tmp_path: Path) -> None:
    env = {"TRACEMQ_DEV_HOME": str(tmp_path / "dev")}
    up = run("dev", "up", "--detach", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        status = run("dev", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["running"] and info["healthy"]
        assert info["business_bootstrap"] != info["trace_bootstrap"]
        assert info["redis_url"].startswith("redis://127.0.0.1:")
        assert set(info["services"]) == {"nameserver", "broker-a", "trace-broker", "collector"}
        assert info["collector_api"].startswith("http://127.0.0.1:")
        assert all(s["healthy"] for s in info["services"].values())
        state = json.loads((tmp_path / "dev" / "state.json").read_text())
        pids = [int(p) for p in state["processes"].values()] + [int(state["launcher_pid"])]
        assert len(_pids_alive(pids)) == len(pids) == 8
        # A second `up` refuses instead of starting a clashing stack.
        again = run("dev", "up", "--detach", env=env)
        assert again.returncode == 2 and "already running" in again.stderr
        # Commands find the running stack through its state file.
        route = run("route", "show", "RMQ_SYS_TRACE_TOPIC", "--json", env=env)
        assert json.loads(route.stdout)["brokers"][0]["broker"] == "trace-broker"
    finally:
        down = run("dev", "down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert _pids_alive(pids) == []
    after = run("dev", "status", "--json", env=env)
    assert after.returncode == 1 and json.loads(after.stdout)["running"] is False


@pytest.mark.timeout(400)
def test_demo_end_to_end(tmp_path: Path) -> None:
    res = run("demo", "--messages", "200", "--out", str(tmp_path / "out"), cwd=tmp_path,
              timeout=380)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "route of TopicTest" in out and "broker-a" in out and "4/4" in out
    assert "route of RMQ_SYS_TRACE_TOPIC" in out and "trace-broker" in out and "1/1" in out
    assert "sent 200;" in out and "demo_healthy 200" in out and "demo_flaky 200" in out
    # the trace table of a sample message: its Pub row and the consumer groups' rows
    assert "trace of " in out and "│ Pub" in out and "demo_healthy" in out
    assert "trace viewer: http://127.0.0.1:" in out
    assert "no process left behind" in out


@pytest.mark.parametrize(
    ("service", "var", "val"),
    [
        ("broker", "TRACEMQ_BROKER_ROLE", "queen"),
        ("nameserver", "TRACEMQ_HTTP_PORT", "http"),
        ("collector", "TRACEMQ_SHUTDOWN_TIMEOUT_MS", "-5"),
    ],
)
def test_service_refuses_a_bad_setting(service: str, var: str, val: str) -> None:
    res = run(service, env={var: val}, timeout=30)
    assert res.returncode == 2
    assert var in res.stderr and repr(val) in res.stderr


def test_health_command_exit_codes() -> None:
    bad = run("health", "http://127.0.0.1:9/healthz", "--timeout", "1", timeout=30)
    assert bad.returncode == 1 and "unhealthy" in bad.stderr
