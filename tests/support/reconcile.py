"""Run the real `tracemq reconcile` command over a stack's lake, as an operator would."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import tracemq_command


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


async def run_reconcile(
    stack: EmbeddedStack,
    *,
    t_from: float,
    t_to: float,
    lake: Path,
    out: Path,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`tracemq reconcile` for [t_from, t_to) with a 2 s horizon and the classified rows kept;
    waits until the horizon is over (PENDING otherwise) and asserts exit 0."""
    while time.time() < t_to + 2:  # the wall clock is the job's input, not a sync point
        await asyncio.sleep(0.2)
    res = await asyncio.to_thread(
        subprocess.run,
        [
            *tracemq_command(),
            "reconcile",
            "--from", iso(t_from),
            "--to", iso(t_to),
            "--horizon", "2s",
            "--window", "1m",
            "--lake", str(lake),
            "--out", str(out),
            "--master", "local[2]",
            "--driver-memory", "1g",
            "--shuffle-partitions", "4",
            "--keep-classified",
        ],
        env={**os.environ, **stack.client_env()},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res
