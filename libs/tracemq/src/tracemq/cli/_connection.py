"""Where a CLI command finds the stack: options, then ``TRACEMQ_*`` variables, then the running
stack: ``TRACEMQ_DEV_HOME``'s state file when that variable is set, else the one stack of the
registry of running stacks (``tracemq dev up`` and ``tracemq demo`` register theirs; with
several, ``TRACEMQ_STACK=NAME`` picks one), else ``.tracemq/dev``'s state file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracemq.cli._errors import UsageError
from tracemq.cli._registry import running_stacks
from tracemq.redis_url import redact
from tracemq.redis_url import split as split_redis_url


def dev_home() -> Path:
    return Path(os.environ.get("TRACEMQ_DEV_HOME", ".tracemq/dev"))


def home_state() -> dict[str, Any] | None:
    """The state file of ``tracemq dev up`` in this ``TRACEMQ_DEV_HOME``."""
    path = dev_home() / "state.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {**data, "state_file": str(path)} if isinstance(data, dict) else None


def dev_state() -> dict[str, Any] | None:
    """The state of the running stack the commands talk to (see the module docstring)."""
    if os.environ.get("TRACEMQ_DEV_HOME"):
        return home_state()
    stacks = running_stacks()
    pick = os.environ.get("TRACEMQ_STACK")
    names = ", ".join(
        f"{s['stack_name']} ({s.get('kind')}, pid {s.get('launcher_pid')})" for s in stacks
    )
    if pick:
        for s in stacks:
            if s["stack_name"] == pick:
                return s
        raise UsageError(
            f"TRACEMQ_STACK={pick!r}: no such running stack (running: {names or 'none'})"
        )
    if len(stacks) == 1:
        return stacks[0]
    if len(stacks) > 1:
        raise UsageError(
            f"{len(stacks)} stacks are running: {names}; pick one with TRACEMQ_STACK=NAME"
        )
    return home_state()


@dataclass(frozen=True)
class Connection:
    redis_url: str
    control_bootstrap: str
    redis_prefix: str


def resolve(redis_url: str | None = None, control_bootstrap: str | None = None) -> Connection:
    env_redis = os.environ.get("TRACEMQ_REDIS_URL")
    env_bootstrap = os.environ.get("TRACEMQ_CONTROL_BOOTSTRAP")
    # the stack is looked up only when needed: with several running, explicit settings win
    state: dict[str, Any] | None = (
        {} if (redis_url or env_redis) and (control_bootstrap or env_bootstrap) else None
    )
    if state is None:
        state = dev_state() or {}
    url = redis_url or env_redis or str(state.get("redis_url") or "redis://127.0.0.1:6379/0")
    try:
        split_redis_url(url)
    except ValueError as exc:
        where = "--redis-url" if redis_url else "TRACEMQ_REDIS_URL" if env_redis else "the stack's"
        raise UsageError(f"{where} {redact(url)}: {exc}") from None
    return Connection(
        redis_url=url,
        control_bootstrap=control_bootstrap
        or env_bootstrap
        or str(state.get("business_bootstrap") or "127.0.0.1:9092"),
        redis_prefix=os.environ.get("TRACEMQ_REDIS_PREFIX", "tmq:"),
    )
