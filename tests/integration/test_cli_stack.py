"""The launcher's commands as a script uses them: `tracemq dev up --detach / status --json /
down`, `tracemq demo`, and services refusing a bad setting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually_sync

from tests.support.collector_api import http

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


SESSION_SIGNING = (
    "TRACEMQ_ACCESS_KEY_ID",
    "TRACEMQ_SECRET_KEY",
    "TRACEMQ_ADMIN_ACCESS_KEY_ID",
    "TRACEMQ_ADMIN_SECRET_KEY",
)


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tracemq_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        # the shell's signing keys are the test session's: a `dev up` stack has its own, which
        # the CLI finds in the stack's state file when the environment names none
        env={**{k: v for k, v in os.environ.items() if k not in SESSION_SIGNING}, **(env or {})},
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
    # Service settings pass through (issue 22, point 2): --env wins over the env file.
    settings = tmp_path / "stack.env"
    settings.write_text(
        "# the collector follows only some trace topics\n"
        "collector:TRACEMQ_COLLECTOR_TRACE_TOPICS=Other*\n"
    )
    for bad, why in (
        (["--env", "nosuch:TRACEMQ_X=1"], "unknown service 'nosuch'"),
        (["--env", "collector:TRACEMQ_X"], "is not [SERVICE:]NAME=VALUE"),
        (["--env-file", str(tmp_path / "missing.env")], "cannot read it"),
    ):
        refused = run("dev", "up", "--detach", *bad, env=env, timeout=30)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr
    up = run(
        "dev",
        "up",
        "--detach",
        "--env-file",
        str(settings),
        "--env",
        "collector:TRACEMQ_COLLECTOR_TRACE_TOPICS=RMQ_SYS_TRACE_TOPIC,Narrow*",
        env=env,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        status = run("dev", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["running"] and info["healthy"]
        assert info["business_bootstrap"] != info["trace_bootstrap"]
        # generated credentials: Redis's password in its URL, the collector's token, both in
        # a state file only its owner reads
        assert re.fullmatch(r"redis://:[\w-]{20,}@127\.0\.0\.1:\d+/0", info["redis_url"])
        token = info["collector_api_token"]
        assert len(token) >= 20
        assert (tmp_path / "dev" / "state.json").stat().st_mode & 0o777 == 0o600
        assert set(info["services"]) == {"nameserver", "broker-a", "trace-broker", "collector"}
        assert info["collector_api"].startswith("http://127.0.0.1:")
        assert all(s["healthy"] for s in info["services"].values())
        # supervised: every process reported with its restarts and state
        assert set(info["infra"]) == {"kafka-business", "kafka-trace", "redis"}
        for p in [*info["services"].values(), *info["infra"].values()]:
            assert p["alive"] and p["restarts"] == 0 and p["state"] == "running", p
        assert info["durable"] is False
        state = json.loads((tmp_path / "dev" / "state.json").read_text())
        pids = [int(p) for p in state["processes"].values()] + [int(state["launcher_pid"])]
        assert len(_pids_alive(pids)) == len(pids) == 8
        # A second `up` refuses instead of starting a clashing stack.
        again = run("dev", "up", "--detach", env=env)
        assert again.returncode == 2 and "already running" in again.stderr
        # Commands find the running stack through its state file, credentials included.
        route = run("route", "show", "RMQ_SYS_TRACE_TOPIC", "--json", env=env)
        assert json.loads(route.stdout)["brokers"][0]["broker"] == "trace-broker"
        # The collector follows trace topics created on the trace broker while it runs, as
        # far as its settings let it: NarrowTrace1 (created last) yes, OtherTrace1 no.
        for topic in ("OtherTrace1", "NarrowTrace1"):
            made = run("topic", "create", topic, "--broker", "trace-broker", "-r", "1", "-w", "1",
                       env=env)  # fmt: skip
            assert made.returncode == 0, made.stderr
        health_url = info["services"]["collector"]["health_url"]

        def followed() -> set[str]:
            with urllib.request.urlopen(health_url, timeout=10) as resp:
                return {t for ts in json.loads(resp.read())["trace_topics"].values() for t in ts}

        eventually_sync(
            lambda: "trace-broker.NarrowTrace1" in followed(), timeout=30, what="NarrowTrace1"
        )
        assert followed() == {"trace-broker.RMQ_SYS_TRACE_TOPIC", "trace-broker.NarrowTrace1"}
        found = run("trace", "find", "--key", "nothing-here", "--json", env=env)
        assert found.returncode == 0 and json.loads(found.stdout)["items"] == [], found.stderr
        api = info["collector_api"]
        assert http(f"{api}/api/v1/quarantine", token=None)[0] == 401
        assert http(f"{api}/api/v1/quarantine", token=token)[0] == 200
        shown = run("dev", "status", env={**env, "COLUMNS": "300"})
        assert token in shown.stdout and f"TRACEMQ_COLLECTOR_API_TOKEN={token}" in shown.stdout
        # the export line is all a client in another shell needs: its heartbeats are signed
        ckid, csecret = state["signing"]["client"]
        assert f"TRACEMQ_ACCESS_KEY_ID={ckid} TRACEMQ_SECRET_KEY={csecret}" in shown.stdout
    finally:
        down = run("dev", "down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert _pids_alive(pids) == []
    after = run("dev", "status", "--json", env=env)
    assert after.returncode == 1 and json.loads(after.stdout)["running"] is False


@pytest.mark.timeout(400)
@pytest.mark.spark
def test_demo_end_to_end(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    res = run("demo", "--messages", "200", "--out", str(out_dir), cwd=tmp_path, timeout=380)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert "route of TopicTest" in out and "broker-a" in out and "4/4" in out
    assert "route of RMQ_SYS_TRACE_TOPIC" in out and "trace-broker" in out and "1/1" in out
    # 200 messages: 10 transactional (2 rolled back), 9 delayed; 198 deliverable
    m = re.search(
        r"sent 200 \(delayed (\d+), transactional 10: committed 8, rolled back 2\); consumed: "
        r"demo_healthy (\d+), demo_flaky (\d+), demo_stopped (\d+); "
        r"first attempts failed in demo_flaky: (\d+)",
        out,
    )
    assert m, out[-3000:]
    delayed, healthy, flaky, stopped, failed_first = map(int, m.groups())
    # the stopped group stops during the first half (95 plain + 5 transactional messages, one
    # rolled back): the second half's 99 deliverable messages are never consumed by it
    assert delayed == 9 and healthy == flaky == 198 and 47 <= stopped <= 99, out[-6000:]
    # the trace table of a sample message: its Pub row and the consumer groups' rows
    assert "trace of " in out and "│ Pub" in out and "demo_healthy" in out
    assert "trace viewer: http://127.0.0.1:" in out
    # the reconciliation's summary, printed and written
    assert "outcomes per topic and group" in out and "latency (ms)" in out
    assert f"report: {out_dir}/report.html" in out
    # every trace context reached the trace topic (none discarded or failed)
    t = re.search(
        r"trace contexts: (\d+) sent by (\d+) clients, (\d+) discarded, (\d+) failed", out
    )
    assert t and int(t[1]) > 0 and int(t[2]) == 6 and t[3] == t[4] == "0", out[-3000:]
    summary = json.loads((out_dir / "summary.json").read_text())
    groups = {r["group"]: r["outcomes"] for r in summary["by_topic_group"] if r["group"]}
    # the reconciliation finds, message by message, what the listeners saw (the demo prints
    # the comparison and the first messages that differ)
    saw = json.loads((out_dir / "listeners.json").read_text())["outcomes"]
    detail = f"listeners {json.dumps(saw)}; reconciliation {json.dumps(groups)}"
    for group in ("demo_healthy", "demo_flaky", "demo_stopped"):
        for outcome, n in saw[group].items():
            assert groups[group][outcome] == n, f"{group} {outcome}: {detail}"
    assert "agree" in out and "differs from what the listeners saw" not in out, out[-3000:]
    for group in ("demo_healthy", "demo_flaky"):  # every message once, nothing else
        assert sum(saw[group].values()) == 198, detail
        assert sum(groups[group].values()) == 198, detail
    assert saw["demo_flaky"]["CONSUMED_AFTER_RETRY"] + saw["demo_flaky"]["DUPLICATE"] >= 1, detail
    assert saw["demo_flaky"]["CONSUMED_AFTER_RETRY"] <= failed_first, detail
    stopped_seen = groups["demo_stopped"]["CONSUMED"] + groups["demo_stopped"]["DUPLICATE"]
    backlog = groups["demo_stopped"]["NOT_CONSUMED"] + groups["demo_stopped"]["PENDING"]
    assert backlog >= 99 and stopped_seen == stopped, detail
    assert backlog + stopped + groups["demo_stopped"]["IN_FLIGHT"] == 198, detail
    assert summary["informational"]["ROLLED_BACK"] == 2
    assert (out_dir / "report.png").stat().st_size > 0
    assert "no process left behind" in out
    # issue 15, point 11: no library or JVM chatter, each path once
    both = out + res.stderr
    assert "Unable connect" not in both and "Using incubator modules" not in both, both[-3000:]
    assert "setLogLevel" not in both, both[-3000:]
    assert out.count(f"{out_dir}/report.html") == 1, out[-3000:]
    assert out.count("trace lake: ") == 1 and "(deleted at exit" in out


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
