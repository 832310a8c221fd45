"""Where a CLI command finds the stack: options, then ``TRACEMQ_*`` variables, then the state
file of a running ``tracemq dev up`` (so commands just work next to the embedded stack)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def dev_home() -> Path:
    return Path(os.environ.get("TRACEMQ_DEV_HOME", ".tracemq/dev"))


def dev_state() -> dict[str, Any] | None:
    path = dev_home() / "state.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Connection:
    redis_url: str
    control_bootstrap: str
    redis_prefix: str


def resolve(redis_url: str | None = None, control_bootstrap: str | None = None) -> Connection:
    state = dev_state() or {}
    return Connection(
        redis_url=redis_url
        or os.environ.get("TRACEMQ_REDIS_URL")
        or str(state.get("redis_url") or "redis://127.0.0.1:6379/0"),
        control_bootstrap=control_bootstrap
        or os.environ.get("TRACEMQ_CONTROL_BOOTSTRAP")
        or str(state.get("business_bootstrap") or "127.0.0.1:9092"),
        redis_prefix=os.environ.get("TRACEMQ_REDIS_PREFIX", "tmq:"),
    )
