"""Supervision of the embedded stack: a crashed process is started again, with backoff.

One thread per supervised :class:`~tracemq_devkit.devstack.stack.EmbeddedStack`. Every
``tick_s`` it looks at each process: one that exited without being asked to is a crash; it is
started again (same command, environment, port and data directory) after
``min(initial_backoff_s * 2**(failures-1), max_backoff_s)``, where ``failures`` counts the
crashes since the process last ran ``stable_after_s`` without one. So a process that keeps
crashing is retried ever more slowly (never in a hot loop) and is reported as crash-looping; one
that crashed once after a long run is back within ``initial_backoff_s``.

Infrastructure (Tansu, Redis, SeaweedFS) is supervised the same way. An in-memory Tansu comes
back *empty* (its topics, records and committed offsets are gone; the services recreate what
they own, consumers see a visible offset reset); a durable one (``StackConfig(durable=True)``)
comes back with everything; Redis comes back from its append-only file (at most ~1 s lost).

Commands from another process (``tracemq dev kill|restart``) arrive through
:class:`ControlChannel`: request files in a directory that this thread polls, each answered by a
reply file. No socket to secure, nothing to clean up beyond the directory, and the process that
owns the children is the only one that signals or restarts them (no stale-pid races).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracemq.cli.plugin import pid_alive
from tracemq.errors import StackError
from tracemq.log import get_logger

if TYPE_CHECKING:
    from tracemq_devkit.devstack.stack import EmbeddedStack

log = get_logger("supervisor")

#: consecutive crashes from which a process is reported as crash-looping
CRASH_LOOP_AFTER = 3


@dataclass(frozen=True)
class RestartPolicy:
    """Backoff between restarts of a crashed process."""

    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    #: a run this long without a crash forgets earlier crashes (backoff starts over)
    stable_after_s: float = 10.0

    def delay(self, failures: int) -> float:
        return float(min(self.initial_backoff_s * 2 ** max(failures - 1, 0), self.max_backoff_s))


@dataclass
class Supervised:
    """What the supervisor knows of one named process across its incarnations."""

    restarts: int = 0
    failures: int = 0
    last_exit_code: int | None = None
    state: str = "running"  # running | backoff | stopped
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None
    #: the last crashes: (monotonic time seen, backoff chosen, monotonic time restarted or None)
    crashes: list[tuple[float, float, float | None]] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "state": self.state,
            "restarts": self.restarts,
            "consecutive_crashes": self.failures,
            "crash_looping": self.failures >= CRASH_LOOP_AFTER,
            "last_exit_code": self.last_exit_code,
            "restart_in_s": (
                round(max(self.restart_at - now, 0.0), 1) if self.restart_at is not None else None
            ),
            "uptime_s": round(now - self.started_at, 1) if self.state == "running" else None,
        }


class Supervisor:
    """Restarts crashed processes of ``stack``; serves :class:`ControlChannel` requests."""

    def __init__(
        self,
        stack: EmbeddedStack,
        policy: RestartPolicy,
        *,
        control_dir: Path | None = None,
        on_change: Callable[[], None] | None = None,
        tick_s: float = 0.2,
    ) -> None:
        self.stack = stack
        self.policy = policy
        self.control = ControlChannel(control_dir) if control_dir is not None else None
        self.on_change = on_change
        self.tick_s = tick_s
        self.records: dict[str, Supervised] = {}
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._halted = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        with self.lock:
            for name in self.stack.processes:
                self.records.setdefault(name, Supervised())
        if self.control is not None:
            self.control.reset()
        self._thread = threading.Thread(target=self._run, name="stack-supervisor", daemon=True)
        self._thread.start()

    def halt(self) -> None:
        """Restart nothing more (the stack is being stopped); the thread stays until stop().

        The thread must outlive the children it started: PR_SET_PDEATHSIG fires when the
        *thread* that forked a child exits, which would SIGTERM them out of the stop order."""
        with self.lock:  # waits for a tick or command in progress
            self._halted = True

    def stop(self) -> None:
        self.halt()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                changed = self.tick()
                if self.control is not None and not self._halted:
                    changed |= self.control.serve(self)
                if changed and self.on_change is not None:
                    self.on_change()
            except Exception as exc:  # the supervisor must outlive any one bad restart
                log.error("supervisor tick failed", error=repr(exc))
            self._stop.wait(self.tick_s)

    # -- the policy --------------------------------------------------------------------------
    def tick(self) -> bool:
        """One look at every process; returns whether anything changed."""
        changed = False
        now = time.monotonic()
        with self.lock:
            if self._halted:
                return False
            for name, proc in list(self.stack.processes.items()):
                rec = self.records.setdefault(name, Supervised())
                if rec.state == "running" and not proc.alive():
                    code = proc.popen.returncode if proc.popen else None
                    uptime = now - rec.started_at
                    rec.failures = 1 if uptime >= self.policy.stable_after_s else rec.failures + 1
                    rec.last_exit_code = code
                    rec.state = "backoff"
                    delay = self.policy.delay(rec.failures)
                    rec.restart_at = now + delay
                    rec.crashes = [*rec.crashes[-19:], (now, delay, None)]
                    log.warning(
                        "process exited; restarting after backoff",
                        process=name,
                        exit_code=code,
                        uptime_s=round(uptime, 1),
                        consecutive_crashes=rec.failures,
                        backoff_s=delay,
                    )
                    changed = True
                elif (
                    rec.state == "backoff" and rec.restart_at is not None and now >= rec.restart_at
                ):
                    self._respawn(name, rec)
                    if rec.state == "running" and rec.crashes:
                        seen, delay, _ = rec.crashes[-1]
                        rec.crashes[-1] = (seen, delay, rec.started_at)
                    changed = True
        return changed

    def _respawn(self, name: str, rec: Supervised) -> None:
        try:
            self.stack.respawn(name)
        except Exception as exc:  # e.g. the port is taken: try again later, slower
            rec.state = "backoff"
            rec.failures += 1
            rec.restart_at = time.monotonic() + self.policy.delay(rec.failures)
            log.error("restart failed", process=name, error=repr(exc))
            return
        rec.restarts += 1
        rec.state = "running"
        rec.restart_at = None
        rec.started_at = time.monotonic()
        log.info("process restarted", process=name, pid=self.stack.processes[name].pid)

    # -- commands ----------------------------------------------------------------------------
    def _known(self, name: str) -> None:
        if self._halted:
            raise StackError("the stack is stopping")
        if name not in self.stack.processes:
            known = ", ".join(sorted(self.stack.processes))
            raise StackError(f"no process named {name!r} in this stack (known: {known})")

    def kill(self, name: str) -> int | None:
        """SIGKILL the process group of ``name`` (a crash: the policy brings it back)."""
        with self.lock:
            self._known(name)
            proc = self.stack.processes[name]
            pid = proc.pid
            proc.kill()
            return pid

    def restart(self, name: str) -> int | None:
        """Graceful stop (SIGTERM, then SIGKILL after the stop timeout) and start now.

        Not a crash: the backoff is not consulted and the crash count is cleared."""
        with self.lock:
            self._known(name)
            rec = self.records.setdefault(name, Supervised())
            proc = self.stack.processes[name]
            rec.state = "stopped"  # the tick must not take this exit for a crash
            rec.last_exit_code = proc.stop(timeout_s=15)
            rec.failures = 0
            self._respawn(name, rec)
            if rec.state != "running":
                raise StackError(f"{name} could not be started again; see its log")
            return self.stack.processes[name].pid

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {n: r.view() for n, r in self.records.items() if n in self.stack.processes}


class ControlChannel:
    """Requests to a running launcher as files: ``<id>.req.json`` in, ``<id>.rep.json`` out."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def reset(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob("*.json"):
            stale.unlink(missing_ok=True)

    def serve(self, supervisor: Supervisor) -> bool:
        served = False
        for req_path in sorted(self.dir.glob("*.req.json")):
            reply: dict[str, Any]
            try:
                req = json.loads(req_path.read_text())
                op, name = str(req["op"]), str(req["process"])
                if op == "kill":
                    reply = {"ok": True, "pid": supervisor.kill(name)}
                elif op == "restart":
                    reply = {"ok": True, "pid": supervisor.restart(name)}
                else:
                    reply = {"ok": False, "error": f"unknown operation {op!r}"}
            except StackError as exc:
                reply = {"ok": False, "error": str(exc)}
            except (OSError, ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": f"bad request {req_path.name}: {exc!r}"}
            _write_atomic(req_path.with_name(req_path.name.replace(".req.", ".rep.")), reply)
            req_path.unlink(missing_ok=True)
            served = True
        return served

    @staticmethod
    def request(
        directory: Path,
        op: str,
        process: str,
        *,
        launcher_pid: int,
        timeout_s: float = 60.0,
    ) -> dict[str, Any]:
        """Send one request to the launcher with ``launcher_pid`` and wait for its reply."""
        rid = uuid.uuid4().hex
        req = directory / f"{rid}.req.json"
        rep = directory / f"{rid}.rep.json"
        _write_atomic(req, {"op": op, "process": process})
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if rep.exists():
                    answer: dict[str, Any] = json.loads(rep.read_text())
                    rep.unlink(missing_ok=True)
                    if not answer.get("ok"):
                        raise StackError(str(answer.get("error")))
                    return answer
                if not pid_alive(launcher_pid):
                    raise StackError("the launcher exited before answering; is the stack running?")
                time.sleep(0.05)
        finally:
            req.unlink(missing_ok=True)
        raise StackError(f"the launcher did not answer {op} {process} within {timeout_s}s")


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
