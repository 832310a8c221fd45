"""Small JSON state files written atomically (temp file, fsync, rename), read back at start.

The schedule service keeps one per delay level, the transaction service one checkpoint. A
write is durable once :func:`write_json` returns, so progress recorded there survives a crash
of the process and of the host.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1


def read_json(path: Path) -> dict[str, Any] | None:
    """The state in ``path``, or None when there is none; raise ValueError when unreadable."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: unknown state format {data.get('version')!r}")  # type: ignore[union-attr]
    return data


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"version": FORMAT_VERSION, **payload}, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


async def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Replace ``path`` with ``payload`` (plus the format version), durably, off the loop."""
    await asyncio.to_thread(_write, path, payload)


def to_ranges(offsets: set[int]) -> list[list[int]]:
    """``{1, 2, 3, 7}`` → ``[[1, 3], [7, 7]]``: offset sets are mostly runs, so this stays small."""
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and o == out[-1][1] + 1:
            out[-1][1] = o
        else:
            out.append([o, o])
    return out


def from_ranges(ranges: list[list[int]]) -> set[int]:
    out: set[int] = set()
    for lo, hi in ranges:
        out.update(range(int(lo), int(hi) + 1))
    return out
