"""How long a ``tracemq`` command takes to start: wall time of the real console script, median
and worst of N runs, for commands that must not import the client, Redis, aiokafka or Spark.

    .venv/bin/python bench/cli_startup.py [--runs 10]

``trace show`` runs against a closed port, so the figure is start-up plus one refused connect.
Target: ≤ 0.5 s each (issue 15). Prints a table, then one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import time

from tracemq_devkit.devstack.stack import tracemq_command


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    runs = ap.parse_args().runs
    url = f"http://127.0.0.1:{_closed_port()}"
    cases = {
        "tracemq --help": ["--help"],
        "tracemq trace show --help": ["trace", "show", "--help"],
        "tracemq trace show X (no collector)": ["trace", "show", "X", "--url", url],
        "tracemq route show --help": ["route", "show", "--help"],
    }
    print(f"{'command':<40} {'median s':>9} {'max s':>7}  ({runs} runs)")
    medians: dict[str, dict[str, float]] = {}
    for name, args in cases.items():
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run([*tracemq_command(), *args], capture_output=True, check=False)
            times.append(time.perf_counter() - t0)
        print(f"{name:<40} {statistics.median(times):9.3f} {max(times):7.3f}")
        medians[name] = {
            "median_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3),
        }
    worst = max(m["median_s"] for m in medians.values())
    print(
        json.dumps(
            {
                "bench": "cli_startup",
                "runs": runs,
                "commands": medians,
                "worst_median_s": worst,
                "target_s": 0.5,
                "targets_met": {"median_le_0.5s": worst <= 0.5},
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
