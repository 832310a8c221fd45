"""Delay-level delivery-time error: how late after its due time a delayed message arrives.

    .venv/bin/python bench/delay.py [--messages 10000] [--rate 500] [--concurrency 32]
                                    [--levels "1s 5s 10s"] [--queues 8] [--size 200]

A broker ``bench-delay`` with ``TRACEMQ_BROKER_DELAY_LEVELS=--levels`` joins the embedded stack;
a topic of ``--queues`` queues is created on it. A tracemq Producer (trace off) sends
``--messages`` messages at ``--rate`` messages per second (``--concurrency`` sends in flight at
most), cycling through every level; each body carries its level and its send time. A plain
Kafka consumer assigned to every partition of the real topic records, for each delivered
message:

- ``store_error_ms`` = the delivered record's timestamp (when the schedule service wrote it to
  the real queue) − the due time (send time + the level's delay): the schedule service's own
  error;
- ``receive_error_ms`` = when the reader got it − the due time: what a consumer sees (adds
  the fetch latency).

Prints progress, then one JSON line last with percentiles (p50, p90, p99, p99.9, max) overall
and per level, early deliveries (must be 0), lost and duplicated messages (must be 0).
Exit code 0 when every message arrived exactly once and none early; 1 otherwise; 2 on a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    bounded,
    client_env,
    create_topic,
    run_bench,
    say,
)
from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402
from tracemq import Message, Producer, kafka_security  # noqa: E402
from tracemq.naming import SCHEDULE_TOPIC, kafka_topic  # noqa: E402
from tracemq.offset_reset import confirmed_log_starts  # noqa: E402
from tracemq.routing.registry import RegistryReader, connect  # noqa: E402
from tracemq_broker.delay_levels import parse_delay_levels  # noqa: E402
from tracemq_devkit.devstack import EmbeddedStack  # noqa: E402

BROKER = "bench-delay"


def now_ms() -> int:
    return int(time.time() * 1000)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def p(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 1)

    return {
        "p50": p(0.50),
        "p90": p(0.90),
        "p99": p(0.99),
        "p99_9": p(0.999),
        "max": round(v[-1], 1),
        "mean": round(sum(v) / len(v), 1),
    }


async def wait_broker(stack: EmbeddedStack, levels: int) -> None:
    redis = connect(stack.redis_url)
    try:
        reader = RegistryReader(redis)
        deadline = time.monotonic() + 30
        while True:
            route = await reader.topic_route(SCHEDULE_TOPIC)
            if any(q.broker == BROKER and q.write_queues == levels for q in route.queues):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{BROKER} did not register its schedule topic in 30 s")
            await asyncio.sleep(0.1)
    finally:
        await redis.aclose()


async def bench(stack: EmbeddedStack, args: argparse.Namespace) -> dict[str, Any]:
    delays = parse_delay_levels(args.levels)
    say(f"starting broker {BROKER} with delay levels {args.levels!r}")
    stack.start_broker(BROKER, TRACEMQ_BROKER_DELAY_LEVELS=args.levels)
    await wait_broker(stack, len(delays))
    topic = f"BenchDelay_{uuid.uuid4().hex[:8]}"
    await create_topic(stack, topic, args.queues, broker=BROKER)
    ktopic = kafka_topic(BROKER, topic)

    reader = AIOKafkaConsumer(
        bootstrap_servers=stack.business_bootstrap,
        **kafka_security.client_kwargs(stack.business_bootstrap),
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
    )
    await reader.start()
    tps = [TopicPartition(ktopic, p) for p in range(args.queues)]
    reader.assign(tps)
    # the confirmed start: Tansu may overstate it (tracemq.offset_reset)
    for tp, start in (await confirmed_log_starts(reader, tps, stack.business_bootstrap)).items():
        reader.seek(tp, start)
    got: Counter[str] = Counter()
    store_err: dict[int, list[float]] = defaultdict(list)
    recv_err: dict[int, list[float]] = defaultdict(list)
    early = 0

    async def read() -> None:
        nonlocal early
        while True:
            batch = await reader.getmany(timeout_ms=200)
            t_recv = time.time() * 1000
            for recs in batch.values():
                for r in recs:
                    level_s, sent_s, seq = r.value.split(b":", 2)[:3]
                    level, sent = int(level_s), int(sent_s)
                    due = sent + delays[level - 1]
                    got[seq.decode()] += 1
                    store_err[level].append(r.timestamp - due)
                    recv_err[level].append(t_recv - due)
                    if r.timestamp < due:
                        early += 1

    reading = asyncio.create_task(read())
    sent = 0
    send_failed = 0
    pad = b"x" * max(0, args.size - 32)
    slots = asyncio.Semaphore(args.concurrency)
    try:
        async with Producer(f"PG_{topic}", **client_env(stack)) as producer:
            say(
                f"sending {args.messages} delayed messages at {args.rate}/s over levels "
                f"1..{len(delays)} (max delay {max(delays) / 1000:.1f}s)"
            )
            t0 = time.monotonic()

            async def one(i: int) -> None:
                nonlocal sent, send_failed
                try:
                    level = 1 + i % len(delays)
                    body = f"{level}:{now_ms()}:{i}:".encode() + pad
                    await producer.send(Message(topic, body, delay_level=level))
                    sent += 1
                except Exception:
                    send_failed += 1
                finally:
                    slots.release()

            tasks = []
            for i in range(args.messages):
                target = t0 + i / args.rate
                wait = target - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await slots.acquire()
                tasks.append(asyncio.create_task(one(i)))
                if i and i % max(1, args.messages // 5) == 0:
                    say(f"sent {i}, delivered so far {len(got)}")
            await asyncio.gather(*tasks)
            send_s = time.monotonic() - t0
            say(f"sent {sent} in {send_s:.1f}s ({sent / send_s:.0f}/s); waiting for delivery")

            async def all_delivered() -> None:
                while len(got) < sent:
                    await asyncio.sleep(0.1)

            await bounded(all_delivered(), max(delays) / 1000 + 60, "delivery of every message")
            await asyncio.sleep(1.0)  # a duplicate would show up now
    finally:
        reading.cancel()
        try:
            await reading
        except asyncio.CancelledError:
            pass
        await asyncio.wait_for(reader.stop(), 10)
        stack.processes[BROKER].stop()

    all_store = [x for v in store_err.values() for x in v]
    all_recv = [x for v in recv_err.values() for x in v]
    dup = sum(1 for n in got.values() if n > 1)
    lost = sent - len(got)
    result = {
        "levels": args.levels,
        "rate": args.rate,
        "queues": args.queues,
        "sent": sent,
        "send_failed": send_failed,
        "delivered": len(got),
        "lost": lost,
        "duplicated": dup,
        "early": early,
        "store_error_ms": percentiles(all_store),
        "receive_error_ms": percentiles(all_recv),
        "per_level": {
            str(lv): {
                "delay_ms": delays[lv - 1],
                "n": len(store_err[lv]),
                "store_error_ms": percentiles(store_err[lv]),
                "receive_error_ms": percentiles(recv_err[lv]),
            }
            for lv in sorted(store_err)
        },
        "trace_complete": lost == 0 and dup == 0 and early == 0 and send_failed == 0,
    }
    se, re_ = result["store_error_ms"], result["receive_error_ms"]
    say(
        f"delivery error (ms): store p50={se.get('p50')} p99={se.get('p99')} max={se.get('max')}"
        f"; receive p50={re_.get('p50')} p99={re_.get('p99')} max={re_.get('max')}; "
        f"lost={lost} duplicated={dup} early={early}"
    )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description="Delay-level delivery-time error percentiles")
    p.add_argument("--messages", "-n", type=int, default=10_000, help="messages (default 10000)")
    p.add_argument("--rate", type=float, default=500.0, help="messages per second (default 500)")
    p.add_argument(
        "--concurrency", "-c", type=int, default=32, help="sends in flight at most (default 32)"
    )
    p.add_argument(
        "--levels", default="1s 5s 10s", help="the broker's delay levels (default '1s 5s 10s')"
    )
    p.add_argument("--queues", type=int, default=8, help="queues of the bench topic (default 8)")
    p.add_argument("--size", type=int, default=200, help="message body size (default 200)")
    p.add_argument("--log-level", default="WARNING", help="tracemq client log level (stderr)")
    args = p.parse_args()
    for name in ("messages", "concurrency", "queues", "size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be at least 1")
    if args.rate <= 0:
        raise SystemExit("--rate must be positive")
    try:
        parse_delay_levels(args.levels)
    except ValueError as exc:
        raise SystemExit(f"--levels: {exc}") from None
    args.rounds, args.trace_options = 1, None  # run_bench reports them
    return run_bench("delay", args, bench)


if __name__ == "__main__":
    sys.exit(main())
