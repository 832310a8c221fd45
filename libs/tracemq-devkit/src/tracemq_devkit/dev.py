"""``tracemq dev up|down|status|kill|restart``: the embedded stack for development, demos and
scripts. ``up`` supervises: a process that dies is started again with backoff."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from tracemq.cli.plugin import (
    UsageError,
    console,
    dev_home,
    dev_state,
    fit,
    home_state,
    pid_alive,
    register_stack,
    unregister_stack,
)
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
    table.add_row(
        "Kafka storage",
        "durable (S3 store in the stack's workdir)" if ep.get("durable") else "in memory",
    )
    ks = ep.get("kafka_security") or {}
    if ep.get("secure"):
        table.add_row(
            "Kafka security",
            f"{ks.get('security_protocol')} {ks.get('sasl_mechanism')}, CA {ks.get('ca_file')}",
        )
    table.add_row("Redis", ep["redis_url"])
    for name, svc in ep["services"].items():
        table.add_row(name, svc["health_url"])
    if ep.get("collector_api"):
        table.add_row("collector API / viewer", ep["collector_api"])
    if ep.get("collector_api_token"):
        table.add_row("collector API token (Bearer)", ep["collector_api_token"])
    if ep.get("lake"):
        table.add_row("trace lake", str(ep["lake"]))
    table.add_row("logs", str(Path(ep["workdir"]) / "logs"))
    console().print(fit(table))
    token = ep.get("collector_api_token")
    # the client key: without it the nameserver refuses a client's heartbeats (its
    # subscriptions go unrecorded), so a client started from this line must carry it
    client_key = (ep.get("signing") or {}).get("client")
    typer.echo(
        f"export TRACEMQ_REDIS_URL={ep['redis_url']} "
        f"TRACEMQ_CONTROL_BOOTSTRAP={ep['business_bootstrap']}"
        + (f" TRACEMQ_COLLECTOR_API_TOKEN={token}" if token else "")
        + (
            f" TRACEMQ_ACCESS_KEY_ID={client_key[0]} TRACEMQ_SECRET_KEY={client_key[1]}"
            if client_key
            else ""
        )
    )
    if ep.get("secure"):
        # the passwords are not printed: tracemq commands read them from the state file
        typer.echo(
            "Kafka is SASL_SSL: tracemq commands find its settings; other clients need the "
            "TRACEMQ_KAFKA_* under kafka_client_env in the stack's state file"
        )


_alive = pid_alive

#: the processes `dev up` starts that take settings (`--env SERVICE:NAME=VALUE`)
DEV_SERVICES = ("nameserver", "broker-a", "trace-broker", "collector")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_service_env(
    entries: list[str], files: list[Path]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """``[SERVICE:]NAME=VALUE`` settings (from ``--env-file`` lines, then ``--env``, later
    ones winning) → (variables for every service, variables per service).

    Raises:
        UsageError: a malformed entry, an unknown service, an unreadable file — named.
    """
    every: dict[str, str] = {}
    per: dict[str, dict[str, str]] = {}

    def add(entry: str, where: str) -> None:
        target, eq, value = entry.partition("=")
        if not eq:
            raise UsageError(f"{where}: {entry!r} is not [SERVICE:]NAME=VALUE")
        service, colon, name = target.strip().rpartition(":")
        if colon and service not in DEV_SERVICES:
            raise UsageError(
                f"{where}: unknown service {service!r}; one of {', '.join(DEV_SERVICES)}"
            )
        if not _ENV_NAME.match(name):
            raise UsageError(f"{where}: {name!r} is not an environment variable name")
        (per.setdefault(service, {}) if colon else every)[name] = value

    for path in files:
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--env-file {path}: cannot read it ({exc})") from None
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if text and not text.startswith("#"):
                add(text.removeprefix("export "), f"{path}:{number}")
    for entry in entries:
        add(entry, "--env")
    return every, per


@app.command("up")
def up(
    detach: bool = typer.Option(False, "--detach", "-d", help="Run in the background."),
    collector: bool = typer.Option(
        True, "--collector/--no-collector", help="Also start the trace collector."
    ),
    durable: bool = typer.Option(
        False,
        "--durable",
        help="Keep Kafka data on disk (Tansu on a private S3 store), so a restarted Kafka keeps "
        "topics, records and committed offsets. Default: in memory.",
    ),
    object_store: bool = typer.Option(
        False,
        "--object-store",
        help="The collector writes its trace lake to a bucket of a SeaweedFS S3 store in the "
        "stack's workdir (s3://tracemq-lake/lake) instead of its data dir.",
    ),
    secure: bool = typer.Option(
        False,
        "--secure",
        help="Both Kafka clusters behind TLS (a throw-away CA) and SASL/SCRAM (generated users); "
        "every service and the CLI connect that way.",
    ),
    env: list[str] = typer.Option(  # noqa: B008 - typer's way
        [],
        "--env",
        "-e",
        help="A setting for the services: SERVICE:NAME=VALUE for one of nameserver, broker-a, "
        "trace-broker, collector; NAME=VALUE for all (repeatable; the shell's TRACEMQ_* "
        "variables are not passed on).",
    ),
    env_file: list[Path] = typer.Option(  # noqa: B008 - typer's way
        [],
        "--env-file",
        help="A file of [SERVICE:]NAME=VALUE lines (# comments); --env wins over it.",
    ),
) -> None:
    """Start the stack; in the foreground it runs until Ctrl-C or SIGTERM.

    A process that dies is started again with backoff (see `tracemq dev status`)."""
    home = dev_home().resolve()  # the state's paths must hold from any directory
    state = home_state()
    if state and _alive(int(state.get("launcher_pid") or 0)):
        raise StackError(
            f"a stack is already running (pid {state['launcher_pid']}); `tracemq dev down` first"
        )
    every, per = parse_service_env(env, env_file)
    home.mkdir(parents=True, exist_ok=True)
    if detach:
        _up_detached(home, collector, durable, secure, every, per, object_store=object_store)
        return
    (home / "state.json").unlink(missing_ok=True)
    shutil.rmtree(home / "stack", ignore_errors=True)
    from tracemq_devkit.devstack import EmbeddedStack, StackConfig

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stack = EmbeddedStack(
        StackConfig(
            workdir=home / "stack",
            with_collector=collector,
            supervise=True,
            control_dir=home / "control",
            durable=durable,
            object_store=object_store,
            secure=secure,
            service_env=every,
            process_env=per,
        )
    )
    state_path = home / "state.json"
    name = f"dev-{os.getpid()}"
    ready = False

    def publish() -> None:
        if ready:
            stack.write_state(
                state_path,
                launcher_pid=os.getpid(),
                status="running",
                kind="dev",
                control_dir=str((home / "control").resolve()),
            )

    stack.on_change = publish
    try:
        stack.start()
        ready = True
        publish()
        register_stack(name, state_path, os.getpid(), kind="dev")
        _print_endpoints(
            {**stack.endpoints(), "signing": {"client": stack.secrets.signing["client"]}}
        )
        typer.echo("stack is up; Ctrl-C stops it")
        while True:
            # the supervisor thread restarts what dies; this thread only waits for a signal
            time.sleep(1)
    except KeyboardInterrupt:
        typer.echo("stopping…")
    finally:
        ready = False
        unregister_stack(name)
        stack.stop()
        state_path.unlink(missing_ok=True)


def _up_detached(
    home: Path,
    collector: bool,
    durable: bool,
    secure: bool,
    every: dict[str, str],
    per: dict[str, dict[str, str]],
    *,
    object_store: bool = False,
) -> None:
    from tracemq_devkit.devstack.stack import tracemq_command

    log = open(home / "launcher.log", "wb")  # noqa: SIM115 - handed to the child
    argv = [*tracemq_command(), "dev", "up", "--collector" if collector else "--no-collector"]
    if durable:
        argv.append("--durable")
    if object_store:
        argv.append("--object-store")
    if secure:
        argv.append("--secure")
    for name, value in every.items():
        argv += ["--env", f"{name}={value}"]
    for service, variables in per.items():
        argv += [
            x for name, value in variables.items() for x in ("--env", f"{service}:{name}={value}")
        ]
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
        st = home_state()
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
    Path(state.get("state_file") or dev_home() / "state.json").unlink(missing_ok=True)
    if state.get("stack_name"):
        unregister_stack(str(state["stack_name"]))
    typer.echo("stack stopped")


@app.command("status")
def status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Endpoints, health and restarts of the running stack (exit 1 when none runs or a
    process is down)."""
    state = dev_state() or {}
    running = bool(state) and _alive(int(state.get("launcher_pid") or 0))
    out: dict[str, Any] = {"running": running}
    healthy = running
    if running:
        out.update(
            {
                k: state.get(k)
                for k in (
                    "business_bootstrap",
                    "trace_bootstrap",
                    "redis_url",
                    "collector_api",
                    "collector_api_token",
                    "workdir",
                    "durable",
                    "object_store",
                    "secure",
                    "kafka_security",
                    "lake",
                    "stack_name",
                    "kind",
                )
            }
        )
        for group in ("services", "infra"):
            procs = {}
            for name, info in (state.get(group) or {}).items():
                alive = _alive(info.get("pid"))
                if group == "services":
                    ok = alive and _healthy(info["health_url"])
                else:
                    ok = alive and _tcp_open(info.get("address"))
                healthy = healthy and ok
                procs[name] = {
                    **{k: info.get(k) for k in _PROCESS_FIELDS if k in info},
                    "pid": info.get("pid"),
                    "alive": alive,
                    "healthy": ok,
                }
            out[group] = procs
    out["healthy"] = healthy
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    elif running:
        _print_endpoints(state)
        _print_processes(out)
    else:
        typer.echo("no stack is running")
    raise typer.Exit(0 if healthy else 1)


_PROCESS_FIELDS = (
    "health_url",
    "address",
    "state",
    "restarts",
    "consecutive_crashes",
    "crash_looping",
    "last_exit_code",
    "restart_in_s",
    "log",
)


def _print_processes(out: dict[str, Any]) -> None:
    table = Table(title="processes", show_header=True)
    for col in ("process", "pid", "state", "healthy", "restarts", "last exit"):
        table.add_column(col)
    for group in ("infra", "services"):
        for name, p in out.get(group, {}).items():
            st = str(p.get("state", "?"))
            if p.get("crash_looping"):
                st += ", crash-looping"
            if p.get("restart_in_s") is not None:
                st += f" (restart in {p['restart_in_s']} s)"
            table.add_row(
                name,
                str(p.get("pid")),
                st,
                "yes" if p.get("healthy") else "NO",
                str(p.get("restarts", 0)),
                "" if p.get("last_exit_code") is None else str(p["last_exit_code"]),
            )
    console().print(fit(table))


def _control(op: str, process: str, timeout: float) -> dict[str, Any]:
    from tracemq_devkit.devstack.supervisor import ControlChannel

    state = dev_state() or {}
    pid = int(state.get("launcher_pid") or 0)
    if not _alive(pid):
        raise StackError("no stack is running (`tracemq dev up --detach` starts one)")
    if not state.get("control_dir"):
        raise StackError(
            f"the running stack ({state.get('kind') or 'unknown'}, pid {pid}) is not supervised: "
            "only `tracemq dev up` takes kill and restart"
        )
    return ControlChannel.request(
        Path(state["control_dir"]), op, process, launcher_pid=pid, timeout_s=timeout
    )


@app.command("kill")
def kill(
    process: str = typer.Argument(..., help="A service (collector, broker-a, …) or kafka-trace, …"),
) -> None:
    """SIGKILL one process of the running stack (a crash); the launcher starts it again."""
    answer = _control("kill", process, timeout=30)
    typer.echo(f"killed {process} (pid {answer.get('pid')}); the launcher restarts it")


@app.command("restart")
def restart(
    process: str = typer.Argument(..., help="A service (collector, broker-a, …) or kafka-trace, …"),
    timeout: float = typer.Option(60.0, help="Seconds to wait for it to be healthy again."),
) -> None:
    """Stop one process of the running stack gracefully and start it again."""
    answer = _control("restart", process, timeout=timeout)
    info = {**(dev_state() or {}).get("services", {}), **(dev_state() or {}).get("infra", {})}
    url = (info.get(process) or {}).get("health_url")
    addr = (info.get(process) or {}).get("address")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (url and _healthy(url)) or (not url and _tcp_open(addr)):
            typer.echo(f"restarted {process} (pid {answer.get('pid')})")
            return
        time.sleep(0.2)
    raise StackError(f"{process} restarted (pid {answer.get('pid')}) but not healthy in {timeout}s")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tcp_open(address: str | None) -> bool:
    if not address:
        return False
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False
