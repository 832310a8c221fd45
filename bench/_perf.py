"""Linux ``perf`` sampling of the bench's own process, split by time window: where each
variant's CPU went, by shared object and by symbol (the consumer bench's ``--perf``).

Why: on this machine the host's speed swings within seconds, so a variant's CPU per message
moves by several microseconds between rounds of the same code, and tracing's cost (on minus
off) with it. What tracing alone runs — the compiled trace steps (``_speedups``), the trace
message's compressor (``cramjam``) — has no samples in the trace-off windows at all, so its
figure is tracing's own code, whatever the rest of the process did meanwhile; the other
objects' deltas show what moved with it (the interpreter, the allocator, libc's copies).

``perf record -k CLOCK_MONOTONIC`` stamps samples with the clock of ``time.monotonic()``, so
the windows are the bench's own ``time.monotonic()`` readings. ``cpu-clock`` is a software
event: it works in VMs without hardware counters. Needs ``perf`` on PATH (Debian:
``linux-perf``) and a ``kernel.perf_event_paranoid`` that lets this user profile its own
process (≤ 2, the default).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PerfError(Exception):
    """perf is missing or did not record."""


@dataclass(frozen=True, slots=True)
class Sample:
    time: float  # CLOCK_MONOTONIC seconds
    period_ns: int  # the CPU time this sample stands for
    dso: str  # the shared object's file name ("[kernel.kallsyms]", "libpython3.11.so.1.0")
    symbol: str


# `perf script -F time,period,ip,sym,dso` lines: "  30348.039207:   2004008  7f88... sym (dso)"
_LINE = re.compile(r"^\s*(\d+\.\d+):\s+(\d+)\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def parse_script(lines: Iterable[str]) -> list[Sample]:
    """The samples of ``perf script -F time,period,ip,sym,dso`` output; lines of another
    shape are skipped (perf prints warnings among them)."""
    out = []
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        out.append(
            Sample(
                time=float(m[1]),
                period_ns=int(m[2]),
                symbol=m[3] or "[unknown]",
                dso=os.path.basename(m[4]) or m[4],
            )
        )
    return out


def split_windows(
    samples: Sequence[Sample],
    windows: Mapping[str, Sequence[tuple[float, float]]],
    messages: Mapping[str, int],
    *,
    top: int = 25,
) -> dict[str, Any]:
    """CPU µs per message in each variant's windows (``windows[v]``: (start, end) monotonic
    seconds holding ``messages[v]`` messages), by shared object and by symbol, with the
    difference of the second variant from the first (``on`` minus ``off``, for two variants
    named so; otherwise in the mapping's order). ``only_second_us_per_msg``: the objects with
    no sample at all in the first variant's windows — for the consumer bench, tracing's own
    code."""
    names = list(windows)
    if len(names) != 2:
        raise ValueError(f"split needs two variants, got {names}")
    if "off" in names and "on" in names:
        names = ["off", "on"]
    base, other = names
    for v in names:
        if messages.get(v, 0) <= 0:
            raise ValueError(f"variant {v!r} needs a positive message count")
    by_dso: dict[str, collections.Counter[str]] = {v: collections.Counter() for v in names}
    by_sym: dict[str, collections.Counter[tuple[str, str]]] = {
        v: collections.Counter() for v in names
    }
    total = dict.fromkeys(names, 0)
    count = dict.fromkeys(names, 0)
    ordered = {v: sorted(windows[v]) for v in names}
    for s in samples:
        for v in names:
            if any(a <= s.time <= b for a, b in ordered[v]):
                by_dso[v][s.dso] += s.period_ns
                by_sym[v][(s.dso, s.symbol)] += s.period_ns
                total[v] += s.period_ns
                count[v] += 1
                break

    def us(v: str, ns: int) -> float:
        return ns / 1000 / messages[v]

    dsos = set(by_dso[base]) | set(by_dso[other])
    dso_rows: list[dict[str, Any]] = sorted(
        (
            {
                "dso": d,
                base: round(us(base, by_dso[base][d]), 3),
                other: round(us(other, by_dso[other][d]), 3),
                "delta": round(us(other, by_dso[other][d]) - us(base, by_dso[base][d]), 3),
            }
            for d in dsos
        ),
        key=lambda r: (-float(r["delta"]), r["dso"]),
    )
    syms = set(by_sym[base]) | set(by_sym[other])
    sym_rows: list[dict[str, Any]] = sorted(
        (
            {
                "symbol": s,
                "dso": d,
                base: round(us(base, by_sym[base][(d, s)]), 3),
                other: round(us(other, by_sym[other][(d, s)]), 3),
                "delta": round(
                    us(other, by_sym[other][(d, s)]) - us(base, by_sym[base][(d, s)]), 3
                ),
            }
            for d, s in syms
        ),
        key=lambda r: (-float(r["delta"]), r["dso"], r["symbol"]),
    )
    only = sorted(d for d in by_dso[other] if by_dso[base][d] == 0)
    return {
        "variants": [base, other],
        "messages": {v: messages[v] for v in names},
        "samples": count,
        "us_per_msg": {v: round(us(v, total[v]), 3) for v in names},
        "delta_us_per_msg": round(us(other, total[other]) - us(base, total[base]), 3),
        "only_second": only,
        "only_second_us_per_msg": round(sum(us(other, by_dso[other][d]) for d in only), 3),
        "by_dso": dso_rows,
        "top_symbols": sym_rows[:top],
    }


def describe(out: Mapping[str, Any], *, dsos: int = 6, symbols: int = 10) -> list[str]:
    """The lines a bench prints for one :func:`split_windows` result."""
    base, other = out["variants"]
    lines = [
        f"perf (this process, the variants' windows; {out['samples'][base]} / "
        f"{out['samples'][other]} samples): {base} {out['us_per_msg'][base]:.2f}, {other} "
        f"{out['us_per_msg'][other]:.2f} us/msg, {other} - {base} "
        f"{out['delta_us_per_msg']:+.2f}; run only in {other}'s windows: "
        f"{', '.join(out['only_second']) or 'nothing'} = {out['only_second_us_per_msg']:.2f} us/msg"
    ]
    lines.extend(
        f"  {r['delta']:+7.3f}  {r['dso']} ({r[base]:.3f} -> {r[other]:.3f})"
        for r in out["by_dso"][:dsos]
    )
    lines.append(f"largest symbols by {other} - {base} (us/msg):")
    lines.extend(
        f"  {r['delta']:+7.3f}  {r['symbol']} [{r['dso']}]" for r in out["top_symbols"][:symbols]
    )
    return lines


class PerfRecorder:
    """``perf record`` of one process (by default this one) until :meth:`stop`; then
    :meth:`samples`. Raises :class:`PerfError` when perf is missing or refuses."""

    def __init__(self, pid: int | None = None, frequency: int = 499) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.frequency = frequency
        self._dir = tempfile.TemporaryDirectory(prefix="tracemq-bench-perf-")
        self.path = Path(self._dir.name) / "perf.data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._exe = shutil.which("perf")

    def start(self) -> None:
        if self._exe is None:
            raise PerfError("perf is not on PATH (Debian: apt-get install linux-perf)")
        self._proc = subprocess.Popen(
            [
                self._exe, "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "cpu-clock",
                "-F", str(self.frequency), "-p", str(self.pid), "-o", str(self.path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip

    def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not self.path.exists() or self.path.stat().st_size == 0:
            raise PerfError(f"perf record wrote nothing: {err.decode(errors='replace')[-400:]}")

    def samples(self) -> list[Sample]:
        if self._exe is None:
            raise PerfError("perf is not on PATH")
        out = subprocess.run(
            [self._exe, "script", "-i", str(self.path), "-F", "time,period,ip,sym,dso"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            raise PerfError(f"perf script failed: {out.stderr[-400:]}")
        return parse_script(out.stdout.splitlines())

    def close(self) -> None:
        try:
            self.stop()
        except PerfError:
            pass
        self._dir.cleanup()
