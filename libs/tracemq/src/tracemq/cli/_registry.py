"""The registry of running stacks: every launcher (``tracemq dev up``, ``tracemq demo``)
registers its stack here while it runs, so a command in another shell finds it without being
told where its state file is. Light on purpose: every command reads it at start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def stacks_dir() -> Path:
    """``TRACEMQ_STACKS_DIR``, else ``~/.tracemq/stacks``."""
    return Path(os.environ.get("TRACEMQ_STACKS_DIR") or Path.home() / ".tracemq" / "stacks")


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def register_stack(name: str, state_file: Path, launcher_pid: int, kind: str) -> Path:
    """Announce a running stack whose launcher keeps ``state_file`` up to date."""
    d = stacks_dir()
    d.mkdir(parents=True, exist_ok=True)
    entry = d / f"{name}.json"
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps(
            {
                "name": name,
                "kind": kind,
                "state_file": str(Path(state_file).resolve()),
                "launcher_pid": launcher_pid,
            }
        )
    )
    os.replace(tmp, entry)
    return entry


def unregister_stack(name: str) -> None:
    (stacks_dir() / f"{name}.json").unlink(missing_ok=True)


def running_stacks() -> list[dict[str, Any]]:
    """The registered stacks whose launcher is alive and whose state is readable, each as its
    state plus ``stack_name``, ``kind`` and ``state_file``; entries of dead launchers go."""
    d = stacks_dir()
    found = []
    for entry in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            reg = json.loads(entry.read_text())
            pid = int(reg["launcher_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not pid_alive(pid):
            entry.unlink(missing_ok=True)
            continue
        try:
            state = json.loads(Path(reg["state_file"]).read_text())
        except (OSError, ValueError):
            continue  # still starting
        if isinstance(state, dict):
            found.append(
                {
                    **state,
                    "stack_name": reg["name"],
                    "kind": reg.get("kind"),
                    "state_file": reg["state_file"],
                }
            )
    return found
