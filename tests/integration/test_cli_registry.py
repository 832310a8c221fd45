"""One registry of running stacks (issue 15, points 2 and 3): a command run from any directory
finds the stack `tracemq dev up` started elsewhere — its Redis, its collector, its lake — and
asks which to use when several run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tracemq_devkit.devstack.stack import tracemq_command

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def run(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tracemq_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


@pytest.mark.timeout(300)
def test_commands_find_the_running_stack_from_anywhere(tmp_path: Path) -> None:
    launch_dir, other_dir = tmp_path / "launch", tmp_path / "elsewhere"
    launch_dir.mkdir()
    other_dir.mkdir()
    # no TRACEMQ_DEV_HOME, no TRACEMQ_* endpoints: only the registry can tell where it is
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")}
    env["TRACEMQ_STACKS_DIR"] = str(tmp_path / "stacks")
    up = run("dev", "up", "--detach", env=env, cwd=launch_dir)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        status = run("dev", "status", "--json", env=env, cwd=other_dir)
        info = json.loads(status.stdout)
        assert info["running"] is True, status.stdout + status.stderr
        assert info["kind"] == "dev" and info["stack_name"].startswith("dev-")
        lake = info["lake"]
        assert lake and Path(lake).is_relative_to(launch_dir), lake

        route = run("route", "show", "RMQ_SYS_TRACE_TOPIC", "--json", env=env, cwd=other_dir)
        assert route.returncode == 0, route.stderr
        assert json.loads(route.stdout)["brokers"][0]["broker"] == "trace-broker"

        # the admin key the stack generated is in its state file, readable by its owner only:
        # a topic command from anywhere signs with it (no key in the environment)
        state_file = launch_dir / ".tracemq" / "dev" / "state.json"
        assert state_file.stat().st_mode & 0o777 == 0o600
        created = run(
            "topic", "create", "FromElsewhere", "--broker", "broker-a", "--json",
            env=env, cwd=other_dir,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        assert json.loads(created.stdout)["created"] is True

        # reconcile's default lake is the stack's, not ./data/collector/lake of this directory
        # (the collector writes its lake with the first trace: none was sent, so it is missing)
        rec = run("reconcile", "--from", "-1h", "--to", "now", env=env, cwd=other_dir)
        if not Path(lake).is_dir():
            assert rec.returncode == 2 and f"trace lake not found: {lake}" in rec.stderr, rec.stderr
        else:
            assert rec.returncode == 0, rec.stderr

        # a second running stack: the commands ask which one instead of guessing
        fake_state = tmp_path / "other-state.json"
        fake_state.write_text(json.dumps({**info, "redis_url": "redis://127.0.0.1:1/0"}))
        (tmp_path / "stacks" / "demo-x.json").write_text(
            json.dumps(
                {
                    "name": "demo-x",
                    "kind": "demo",
                    "state_file": str(fake_state),
                    "launcher_pid": os.getpid(),
                }
            )
        )
        both = run("route", "show", "RMQ_SYS_TRACE_TOPIC", env=env, cwd=other_dir)
        assert both.returncode == 2, both.stdout + both.stderr
        assert "2 stacks are running" in both.stderr and "TRACEMQ_STACK" in both.stderr
        assert info["stack_name"] in both.stderr and "demo-x" in both.stderr
        picked = run(
            "route", "show", "RMQ_SYS_TRACE_TOPIC", "--json",
            env={**env, "TRACEMQ_STACK": info["stack_name"]}, cwd=other_dir,
        )  # fmt: skip
        assert picked.returncode == 0, picked.stderr
        (tmp_path / "stacks" / "demo-x.json").unlink()
    finally:
        down = run("dev", "down", env=env, cwd=other_dir)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    assert list((tmp_path / "stacks").glob("*.json")) == []
    after = run("dev", "status", "--json", env=env, cwd=other_dir)
    assert after.returncode == 1 and json.loads(after.stdout)["running"] is False
