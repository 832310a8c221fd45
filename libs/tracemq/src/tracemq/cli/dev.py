"""``tracemq dev up|down|status``: the embedded stack for development, demos and scripts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from tracemq.cli._connection import dev_home, dev_state
from tracemq.cli._console import console
from tracemq.devstack import EmbeddedStack, StackConfig
from tracemq.devstack.stack import tracemq_command
from tracemq.errors import StackError

app = typer.Typer(
    help="Run the embedded stack (Tansu ×2, Redis, nameserver, brokers).", no_args_is_help=True
)


def _print_endpoints(ep: dict[str, Any]) -> None:
    table = Table(title="tracemq embedded stack", show_header=True)
    table.add_column("what")
    table.add_column("where")
    table.add_row("business Kafka (+ control topic)", ep["business_bootstrap"])
    table.add_row("trace Kafka", ep["trace_bootstrap"])
    table.add_row("Redis", ep["redis_url"])
    for name, svc in ep["services"].items():
        table.add_row(name, svc["health_url"])
    if ep.get("collector_api"):
        table.add_row("collector API / viewer", ep["collector_api"])
    table.add_row("logs", str(Path(ep["workdir"]) / "logs"))
    console().print(table)
    typer.echo(
        f"export TRACEMQ_REDIS_URL={ep['redis_url']} "
        f"TRACEMQ_CONTROL_BOOTSTRAP={ep['business_bootstrap']}"
    )


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


@app.command("up")
def up(
    detach: bool = typer.Option(False, "--detach", "-d", help="Run in the background."),
    collector: bool = typer.Option(
        True, "--collector/--no-collector", help="Also start the trace collector."
    ),
) -> None:
    """Start the stack; in the foreground it runs until Ctrl-C or SIGTERM."""
    home = dev_home()
    state = dev_state()
    if state and _alive(int(state.get("launcher_pid") or 0)):
        raise StackError(
            f"a stack is already running (pid {state['launcher_pid']}); `tracemq dev down` first"
        )
    home.mkdir(parents=True, exist_ok=True)
    if detach:
        _up_detached(home, collector)
        return
    (home / "state.json").unlink(missing_ok=True)
    shutil.rmtree(home / "stack", ignore_errors=True)

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stack = EmbeddedStack(StackConfig(workdir=home / "stack", with_collector=collector))
    try:
        stack.start()
        stack.write_state(
            home / "state.json",
            launcher_pid=os.getpid(),
            status="running",
            processes={n: p.pid for n, p in stack.processes.items()},
        )
        _print_endpoints(stack.endpoints())
        typer.echo("stack is up; Ctrl-C stops it")
        while True:
            time.sleep(1)
            dead = [n for n, p in stack.processes.items() if not p.alive()]
            if dead:
                typer.echo(f"process(es) died: {', '.join(dead)}; stopping", err=True)
                raise typer.Exit(1)
    except KeyboardInterrupt:
        typer.echo("stopping…")
    finally:
        stack.stop()
        (home / "state.json").unlink(missing_ok=True)


def _up_detached(home: Path, collector: bool) -> None:
    log = open(home / "launcher.log", "wb")  # noqa: SIM115 - handed to the child
    argv = [*tracemq_command(), "dev", "up", "--collector" if collector else "--no-collector"]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "TRACEMQ_DEV_HOME": str(home)},
    )
    log.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (home / "launcher.log").read_text(errors="replace")[-3000:]
            raise StackError(f"the stack failed to start (exit {proc.returncode}):\n{tail}")
        st = dev_state()
        if st and st.get("status") == "running" and st.get("launcher_pid") == proc.pid:
            _print_endpoints(st)
            typer.echo(f"running in the background (pid {proc.pid}); `tracemq dev down` stops it")
            return
        time.sleep(0.2)
    proc.terminate()
    raise StackError("the stack did not come up within 120 s")


@app.command("down")
def down(timeout: float = typer.Option(60.0, help="Seconds to wait for a clean stop.")) -> None:
    """Stop a stack started with `tracemq dev up --detach`."""
    state = dev_state()
    if not state:
        typer.echo("no stack is running")
        return
    pid = int(state.get("launcher_pid") or 0)
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    leftovers = [int(p) for p in (state.get("processes") or {}).values() if p and _alive(int(p))]
    for p in [pid, *leftovers]:
        if _alive(p):
            try:
                os.killpg(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
    (dev_home() / "state.json").unlink(missing_ok=True)
    typer.echo("stack stopped")


@app.command("status")
def status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Endpoints and health of the running stack (exit 1 when none runs or a service is down)."""
    state = dev_state() or {}
    running = bool(state) and _alive(int(state.get("launcher_pid") or 0))
    out: dict[str, Any] = {"running": running}
    healthy = running
    if running:
        out.update(
            {
                k: state[k]
                for k in (
                    "business_bootstrap",
                    "trace_bootstrap",
                    "redis_url",
                    "collector_api",
                    "workdir",
                )
            }
        )
        services = {}
        for name, svc in state["services"].items():
            ok = _healthy(svc["health_url"])
            healthy = healthy and ok
            services[name] = {"health_url": svc["health_url"], "healthy": ok}
        out["services"] = services
    out["healthy"] = healthy
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    elif running:
        _print_endpoints({**state, "services": state["services"]})
    else:
        typer.echo("no stack is running")
    raise typer.Exit(0 if healthy else 1)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
