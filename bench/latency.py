"""Delivery latency of a PushConsumer: from the producer's send to the listener, at a steady
low rate, for two fetch wait settings side by side.

    .venv/bin/python bench/latency.py [--rate 20] [--duration 15] [--queues 4]
                                      [--waits 500,100]

The embedded stack, one topic of ``--queues`` queues, one PushConsumer group per
``fetch_max_wait_ms`` value in ``--waits``, all subscribed to the same topic and all assigned
their queues before the first send (a new group's first assignment takes seconds on Tansu: not
what this measures). A Producer then sends ``--rate`` messages/s for ``--duration`` s, each
carrying its send time; every group's listener records now - send time. The groups see the
same messages at the same time, so their figures compare side by side. Target: p99 below
100 ms with the default (``tracemq.consumer._fetch.FETCH_MAX_WAIT_MS``).

Prints progress, one JSON line last. Exit 0 if it ran, 1 if a group missed messages, 2 on a
crash.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _collector_common import percentiles  # noqa: E402
from _common import (  # noqa: E402
    EXIT_TRACE_INCOMPLETE,
    client_env,
    create_topic,
    run_on_stack,
    say,
)
from tracemq_devkit.waiting import eventually  # noqa: E402


async def body(stack: Any, args: argparse.Namespace) -> dict[str, Any]:
    from tracemq import ConsumeConcurrentlyStatus, ConsumeFromWhere, Message, Producer, PushConsumer
    from tracemq.consumer import FETCH_MAX_WAIT_MS

    env = client_env(stack)
    run = uuid.uuid4().hex[:8]
    topic = f"BenchLatency_{run}"
    await create_topic(stack, topic, args.queues)
    waits = [int(w) for w in args.waits.split(",")]
    seen: dict[int, list[float]] = {w: [] for w in waits}
    consumers = []
    for w in waits:

        async def listener(msgs: list[Any], ctx: Any, w: int = w) -> Any:
            now = time.time()
            for m in msgs:
                (sent,) = struct.unpack(">d", m.body)
                seen[w].append((now - sent) * 1000)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        c = PushConsumer(
            f"BenchLatency_{run}_{w}",
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            fetch_max_wait_ms=w,
            **env,
        )
        c.subscribe(topic)
        c.register_message_listener(listener)
        await c.start()
        consumers.append(c)
    total = int(args.rate * args.duration)
    try:
        t0 = time.monotonic()
        for c in consumers:
            if not await c.wait_assigned(60):
                raise RuntimeError(f"{c.group} was not assigned its queues within 60 s")
        say(f"{len(consumers)} groups assigned in {time.monotonic() - t0:.1f}s; sending {total}")
        async with Producer(f"BenchLatencyP_{run}", **env) as p:
            start = time.monotonic()
            for i in range(total):
                # paced by the clock, not by sleeps adding up
                delay = start + i / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await p.send(Message(topic, struct.pack(">d", time.time())))
        await eventually(
            lambda: all(len(v) >= total for v in seen.values()),
            timeout=40,
            interval=0.05,
            what="every group receiving every message",
        )
    finally:
        for c in consumers:
            await c.shutdown()
    figures = {str(w): percentiles(v, (50, 90, 99)) for w, v in seen.items()}
    for w in waits:
        f = figures[str(w)]
        say(
            f"fetch_max_wait_ms={w}: p50 {f['p50']:.1f} ms, p90 {f['p90']:.1f} ms, "
            f"p99 {f['p99']:.1f} ms, max {f['max']:.1f} ms ({len(seen[w])} messages)"
        )
    default = figures.get(str(FETCH_MAX_WAIT_MS))
    return {
        "messages": total,
        "latency_ms_by_fetch_max_wait_ms": figures,
        "default_fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "target_default_p99_lt_100ms": default is not None and default["p99"] < 100,
        "complete": all(len(v) == total for v in seen.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0, help="messages per second")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of sending")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--waits", default="500,100", help="fetch_max_wait_ms values, comma-separated")
    args = ap.parse_args()
    if args.rate <= 0 or args.duration <= 0 or args.queues < 1:
        ap.error("--rate and --duration must be > 0, --queues >= 1")
    return run_on_stack(
        "latency",
        args,
        body,
        {"bench": "latency", "rate": args.rate, "duration_s": args.duration},
        ok_key="complete",
        bad_code=EXIT_TRACE_INCOMPLETE,
    )


if __name__ == "__main__":
    raise SystemExit(main())
