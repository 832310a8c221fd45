"""The launcher supervises: a crashed process comes back (with backoff when it keeps crashing),
`tracemq dev kill|restart` act on one process, and `dev down` leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tracemq.errors import StackError
from tracemq.transport import wait_until_ready
from tracemq_devkit.devstack import EmbeddedStack, StackConfig, run_coro, stack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.devstack.supervisor import ControlChannel, RestartPolicy
from tracemq_devkit.waiting import eventually_sync

from tests.conftest import _SESSION_STACKS, SESSION_SECRETS


def run(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tracemq_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def status(env: dict[str, str]) -> dict[str, Any]:
    res = run("dev", "status", "--json", env=env, timeout=60)
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if st != "Z":
            out.add(pid)
    return out


@pytest.mark.timeout(300)
def test_dev_kill_and_restart_one_service_then_down(tmp_path: Path) -> None:
    env = {"TRACEMQ_DEV_HOME": str(tmp_path / "dev")}
    up = run("dev", "up", "--detach", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    seen: set[int] = set()
    try:
        before = status(env)
        assert before["healthy"], before
        seen |= {p["pid"] for g in ("services", "infra") for p in before[g].values()}
        assert all(p["restarts"] == 0 for p in before["services"].values())
        old = before["services"]["collector"]["pid"]

        # kill = SIGKILL of the collector's process group: a crash the launcher repairs
        killed = run("dev", "kill", "collector", env=env, timeout=60)
        assert killed.returncode == 0, killed.stderr
        assert f"pid {old}" in killed.stdout

        state_file = tmp_path / "dev" / "state.json"

        def collector_back() -> bool:
            # the launcher's state file, not `dev status` in a loop (each CLI start costs seconds)
            c = json.loads(state_file.read_text())["services"]["collector"]
            return bool(c["pid"] != old and c["restarts"] == 1 and _healthy(c["health_url"]))

        eventually_sync(collector_back, timeout=60, interval=0.3, what="collector back")

        # restart = graceful stop (exit 0) and start at once
        broker = before["services"]["broker-a"]["pid"]
        restarted = run("dev", "restart", "broker-a", env=env, timeout=120)
        assert restarted.returncode == 0, restarted.stderr
        after = status(env)
        assert after["healthy"], after
        seen |= {p["pid"] for g in ("services", "infra") for p in after[g].values()}
        c = after["services"]["collector"]
        assert c["pid"] != old and c["restarts"] == 1 and c["healthy"], c
        assert c["last_exit_code"] == -9 and c["state"] == "running", c
        b = after["services"]["broker-a"]
        assert b["pid"] != broker and b["healthy"] and b["restarts"] == 1, b
        assert b["last_exit_code"] == 0, b
        # only those two were touched
        assert {n for n, p in after["services"].items() if p["restarts"]} == {
            "collector",
            "broker-a",
        }
        assert {n: p["pid"] for n, p in after["infra"].items()} == {
            n: p["pid"] for n, p in before["infra"].items()
        }

        bad = run("dev", "kill", "nosuch", env=env, timeout=60)
        assert bad.returncode == 2 and "no process named 'nosuch'" in bad.stderr, bad.stderr
        launcher = int(json.loads((tmp_path / "dev" / "state.json").read_text())["launcher_pid"])
        seen.add(launcher)
    finally:
        down = run("dev", "down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert _alive(seen) == set()
    assert run("dev", "status", "--json", env=env).returncode == 1


@pytest.mark.timeout(120)
def test_a_process_that_keeps_crashing_is_restarted_with_growing_capped_backoff(
    tmp_path: Path,
) -> None:
    policy = RestartPolicy(initial_backoff_s=0.3, max_backoff_s=1.2, stable_after_s=60)
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path / "stack",
            start_services=False,
            supervise=True,
            restart_policy=policy,
            control_dir=tmp_path / "control",
            secrets=SESSION_SECRETS,
        )
    )
    _SESSION_STACKS.append(s)
    s.start()
    try:
        # a process that exits 3 at once, every time (a broker with a bad setting does the same
        # but takes seconds of interpreter start per round)
        bad = ManagedProcess(
            name="bad",
            argv=["/bin/sh", "-c", "exit 3"],
            env=dict(os.environ),
            log_path=tmp_path / "bad.log",
        )
        bad.extra["kind"] = "infra"
        bad.start()
        s.processes["bad"] = bad
        sup = s.supervisor
        assert sup is not None

        def restarted_four_times() -> bool:
            with sup.lock:
                rec = sup.records.get("bad")
                return rec is not None and rec.restarts >= 4

        eventually_sync(restarted_four_times, timeout=90, interval=0.2, what="4 restarts")
        with sup.lock:
            rec = sup.records["bad"]
            crashes = list(rec.crashes)
            view = rec.view()
        assert view["last_exit_code"] == 3 and view["crash_looping"], view
        # exponential, capped: 0.3, 0.6, 1.2, 1.2 …
        assert [d for _, d, _ in crashes[:4]] == [0.3, 0.6, 1.2, 1.2], crashes
        for seen, delay, restarted in crashes[:4]:
            assert restarted is not None and restarted - seen >= delay, crashes
        # the infrastructure was left alone
        assert all(sup.records[n].restarts == 0 for n in ("kafka-business", "kafka-trace", "redis"))

        # the control channel answers bad requests with an error and keeps serving
        control = tmp_path / "control"
        (control / "junk.req.json").write_bytes(b"\xff{not json")
        eventually_sync(
            lambda: (control / "junk.rep.json").exists(), timeout=10, what="reply to junk"
        )
        assert "bad request" in json.loads((control / "junk.rep.json").read_text())["error"]
        me = os.getpid()
        with pytest.raises(StackError, match="unknown operation 'explode'"):
            ControlChannel.request(control, "explode", "redis", launcher_pid=me, timeout_s=10)
        with pytest.raises(StackError, match="no process named 'nosuch'"):
            ControlChannel.request(control, "kill", "nosuch", launcher_pid=me, timeout_s=10)

        # infrastructure is supervised too: a killed Tansu is back on its port
        old = ControlChannel.request(control, "kill", "kafka-trace", launcher_pid=me)["pid"]
        assert old is not None

        def tansu_back() -> bool:
            p = s.processes["kafka-trace"]
            return p.pid != old and p.alive() and sup.records["kafka-trace"].restarts == 1

        eventually_sync(tansu_back, timeout=30, what="kafka-trace restarted")
        run_coro(wait_until_ready(s.trace_bootstrap, 30))
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


@pytest.mark.timeout(120)
def test_infrastructure_whose_port_is_taken_before_it_binds_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port is free when the launcher chooses it, not always when Tansu or Redis binds it
    (another stack starting beside this one, an outgoing connection's ephemeral port): the child
    exits with "address in use" and is started again on another port, not waited on for a
    minute; a service likewise, and a service is healthy only when it is the one listening on
    its port (another process's /healthz there would answer 200 too). Here the collision is
    made certain: the first port offered to the business Tansu, to Redis and to the nameserver
    is held by a listener of this test."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    real = stack.free_port
    calls: list[int] = []

    def offered() -> int:
        # the order of a stack's start: business Tansu (1st try: taken; 2nd), trace Tansu,
        # Redis (1st try: taken; 2nd); then the nameserver (1st try: taken; 2nd)
        calls.append(0)
        return taken if len(calls) in (1, 4, 6) else real()

    monkeypatch.setattr(stack, "free_port", offered)
    s = EmbeddedStack(
        StackConfig(workdir=tmp_path / "stack", start_services=False, secrets=SESSION_SECRETS)
    )
    _SESSION_STACKS.append(s)
    try:
        s.start()  # waits for both clusters and Redis's PING
        ports = {
            n: s.processes[n].extra["port"] for n in ("kafka-business", "kafka-trace", "redis")
        }
        assert taken not in ports.values() and len(calls) == 5, (ports, taken, calls)
        assert s.business_bootstrap == f"127.0.0.1:{ports['kafka-business']}"
        assert f"127.0.0.1:{ports['redis']}/" in s.redis_url
        for name in ("kafka-business", "redis"):
            log = s.processes[name].log_path.read_text(errors="replace")
            assert stack._PORT_TAKEN.search(log), (name, log[-2000:])
            assert s.processes[name].listens_on(ports[name])
        ns = s.start_nameserver()
        port = int(ns.env["TRACEMQ_HTTP_PORT"])
        assert port != taken and len(calls) == 7 and ns.listens_on(port), (port, calls)
        assert stack._PORT_TAKEN.search(ns.log_path.read_text(errors="replace"))
    finally:
        held.close()
        s.stop()
        _SESSION_STACKS.remove(s)


@pytest.mark.timeout(60)
def test_infrastructure_that_exits_at_start_fails_the_start_at_once_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any other early exit is not retried: the start fails at once, naming the process and
    quoting its log (before, a dead Redis was pinged for the whole startup timeout)."""
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR: no such directive' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRACEMQ_DEV_REDIS_BIN", str(fake))
    s = EmbeddedStack(
        StackConfig(workdir=tmp_path / "stack", start_services=False, secrets=SESSION_SECRETS)
    )
    _SESSION_STACKS.append(s)
    t0 = time.monotonic()
    try:
        with pytest.raises(StackError, match=r"redis exited with code 1 .*try 1 of 5") as err:
            s.start()
        assert "FATAL CONFIG FILE ERROR" in str(err.value)
        assert time.monotonic() - t0 < s.config.startup_timeout_s / 2
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


@pytest.mark.timeout(180)
def test_the_object_store_whose_port_is_taken_before_it_binds_starts_on_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SeaweedFS (the durable stack's object store) takes eleven ports at once: when one of
    them is taken, it exits at once ("Port allocation failed") and gets eleven others."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    real = stack.free_ports
    offered: list[list[int]] = []

    def ports(n: int) -> list[int]:
        chosen = real(n)
        if not offered:
            chosen[1] = taken  # the volume server's port, on the first try
        offered.append(chosen)
        return chosen

    monkeypatch.setattr(stack, "free_ports", ports)
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path / "stack", start_services=False, durable=True, secrets=SESSION_SECRETS
        )
    )
    _SESSION_STACKS.append(s)
    try:
        s.start()  # both clusters keep their logs in its buckets: they answer once it does
        assert len(offered) == 2 and taken not in offered[1], offered
        s3 = s.processes["s3"]
        assert s3.extra["address"] == f"127.0.0.1:{offered[1][3]}"
        assert s3.listens_on(offered[1][3])
        log = s3.log_path.read_text(errors="replace")
        assert stack._PORT_TAKEN.search(log) and str(taken) in log, log[-2000:]
    finally:
        held.close()
        s.stop()
        _SESSION_STACKS.remove(s)
