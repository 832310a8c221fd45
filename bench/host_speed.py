"""How fast this host is right now, on three fixed workloads, so that figures of runs made in
different hours (or on different machines) can be read side by side: the same code's
benchmarks moved by a third between hours on the 2-core development machine.

    .venv/bin/python bench/host_speed.py [--reps 15]

* ``python_ns``: one iteration of a fixed pure-Python loop shaped like a client's per-message
  work (a slotted object built, a dict look-up, an f-string, a list append, a call), in ns;
* ``zstd_mb_s``: zstd level 1 (cramjam, as the trace messages are compressed) over a fixed,
  seeded 512 000 bytes of trace text, in MB/s;
* ``copy_gb_s``: copying 64 MiB into newly allocated memory (its page faults included: what a
  virtual machine's host makes dear), in GB/s.

Each is the median of ``--reps`` repetitions' CPU time (the spread is printed beside it). The
host's speed swings within minutes (508 - 985 ns for ``python_ns`` in one quarter of an hour on
2026-11-30), so ``bench/run_all.py`` also samples ``python_ns`` every 10 s while the other
benchmarks run and gives each one the median of its samples (``host_python_ns``). No goal:
``make bench`` records them beside the goals (``host_speed.*`` rows). Prints a table, then one
JSON line last.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import cramjam

_LOOP = 100_000
_COPY = 64 * 1024 * 1024


@dataclass(slots=True)
class _Msg:
    topic: str
    msg_id: str
    queue_id: int
    properties: dict[str, str]


def _route(msg: _Msg, table: dict[str, int]) -> int:
    return table.get(msg.topic, 0) + msg.queue_id


def _python_loop(iterations: int = _LOOP) -> None:
    table = {f"topic-{i}": i for i in range(64)}
    out: list[str] = []
    props = {"KEYS": "order-1", "TAGS": "paid"}
    for i in range(iterations):
        m = _Msg(f"topic-{i & 63}", "7F00000100002A9F0000000000000001", i & 7, props)
        q = _route(m, table)
        out.append(f"{m.topic}\x01{m.msg_id}\x01{q}\x01{m.properties.get('KEYS')}")
        if len(out) >= 512:
            out.clear()


def _trace_text() -> bytes:
    rnd = random.Random(42)
    parts: list[str] = []
    ts = 1_732_950_000_000
    head = "7F0000010A8C18B4AAC2"
    i = 0
    while sum(map(len, parts)) < 512_000:
        mid = f"{head}{rnd.getrandbits(40):010X}{i:06X}"
        rid = f"{head}{i >> 8 | 1 << 39:010X}{i & 255:02X}"
        ts += rnd.randint(0, 2)
        parts.append(
            f"SubBefore\x01{ts}\x01DefaultRegion\x01CG_orders\x01{rid}\x01{mid}\x010\x01"
            f"k{rnd.getrandbits(32)}\x01\x02SubAfter\x01{rid}\x01{mid}\x01{rnd.randint(0, 3)}"
            f"\x01true\x01k{rnd.getrandbits(32)}\x010\x01{ts + 1}\x01CG_orders\x01\x02"
        )
        i += 1
    return "".join(parts).encode()[:512_000]


def _timed(fn: Callable[[], object], reps: int) -> list[float]:
    """``fn``'s CPU time (this thread's: a busy machine's wait for a core is not counted, a
    slower core is) in each of ``reps`` calls after a first one."""
    fn()  # warm
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return times


def python_ns(iterations: int = 20_000) -> float:
    """One short sample of ``python_ns`` (~10 ms): what ``bench/run_all.py`` samples every few
    seconds while the benchmarks run, to give each one the host's speed during it."""
    t0 = time.thread_time()
    _python_loop(iterations)
    return (time.thread_time() - t0) / iterations * 1e9


def measure(reps: int) -> dict[str, dict[str, float]]:
    """Each workload's median figure and its range over ``reps`` repetitions."""
    text = _trace_text()
    src = bytearray(_COPY)
    figures = {
        "python_ns": (_timed(_python_loop, reps), lambda s: s / _LOOP * 1e9),
        "zstd_mb_s": (
            _timed(lambda: cramjam.zstd.compress(text, level=1), reps),
            lambda s: len(text) / s / 1e6,
        ),
        "copy_gb_s": (_timed(lambda: bytes(src), reps), lambda s: _COPY / s / 1e9),
    }
    out = {}
    for name, (times, to_figure) in figures.items():
        values = sorted(to_figure(t) for t in times)
        out[name] = {
            "median": round(statistics.median(values), 2),
            "min": round(values[0], 2),
            "max": round(values[-1], 2),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions of each (default 15)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    started = time.time()
    figures = measure(args.reps)
    print(f"{'workload':<12} {'median':>10} {'min':>10} {'max':>10}  ({args.reps} reps)")
    for name, f in figures.items():
        print(f"{name:<12} {f['median']:>10} {f['min']:>10} {f['max']:>10}")
    print(
        json.dumps(
            {
                "bench": "host_speed",
                "reps": args.reps,
                "started": round(started, 1),
                "seconds": round(time.time() - started, 2),
                **{name: f["median"] for name, f in figures.items()},
                "spread": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
