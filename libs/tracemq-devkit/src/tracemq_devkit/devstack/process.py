"""Child processes of the embedded stack: spawn, health-wait, stop, kill — nothing left behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from tracemq.errors import StackError

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: own process group, SIGTERM when the launcher dies."""
    os.setsid()
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _own_group() -> None:
    os.setsid()


@dataclass
class ManagedProcess:
    """One child process with its log file and optional health URL."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_url: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self, *, tie_to_parent: bool = True) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # where this run's lines begin in a log that earlier runs of the process share
            self.extra["log_offset"] = log.tell()
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if tie_to_parent else _own_group,  # noqa: PLW1509
                close_fds=True,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def this_run_log(self) -> str:
        """What this run of the process has logged (not the runs before it in the same file)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(int(self.extra.get("log_offset", 0)))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def listens_on(self, port: int) -> bool:
        """Whether this very process (or one of its children) listens on TCP ``port`` — a
        connect, or a health check's 200, would also succeed if some *other* process held the
        port."""
        if not self.alive() or self.popen is None:
            return False
        try:
            me = psutil.Process(self.popen.pid)
            tree = [me, *me.children(recursive=True)]
        except psutil.Error:
            return False
        for p in tree:
            try:
                conns = p.net_connections("tcp")
            except psutil.Error:
                continue
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns
            ):
                return True
        return False

    def wait_listening(self, port: int, timeout_s: float) -> bool:
        """Wait until the process listens on ``port`` (True) or has exited (False)."""
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if self.listens_on(port):
                return True
            if time.monotonic() > deadline:
                raise StackError(
                    f"{self.name} did not listen on 127.0.0.1:{port} within {timeout_s}s; "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(0.01)
        return False

    def wait_healthy(self, timeout_s: float, check: Callable[[], bool] | None = None) -> None:
        """Poll ``check`` until true; fail fast if the child dies. The default check: GET
        health_url answers 200 and, for a process with a ``port`` in :attr:`extra`, it is this
        process that listens there (not another that took the port first)."""
        probe = check or self._healthy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.popen.returncode if self.popen else None
                raise StackError(
                    f"{self.name} exited with code {code} while starting; log tail:\n{self.log_tail()}"
                )
            if probe():
                return
            time.sleep(0.1)
        raise StackError(
            f"{self.name} not healthy after {timeout_s}s; log tail:\n{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        port = self.extra.get("port")
        return self._http_ok() and (port is None or self.listens_on(int(port)))

    def _http_ok(self) -> bool:
        if not self.health_url:
            return True
        try:
            with urllib.request.urlopen(self.health_url, timeout=1) as resp:  # noqa: S310
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def signal(self, sig: int) -> None:
        if self.popen and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, wait, then SIGKILL whatever is left."""
        if not self.popen:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=5)
        # the group may hold grandchildren even after the leader exited
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL (a crash, for tests)."""
        if not self.popen:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
