"""Producer throughput: raw aiokafka vs tracemq Producer (trace off) vs Producer (trace on).

    .venv/bin/python bench/producer.py [--messages 100000] [--concurrency 64] [--rounds 3]
                                       [--size 200] [--batch 64] [--batch-concurrency 16]

Every variant sends ``--messages`` messages of ``--size`` bytes with ``--concurrency`` sender
coroutines, each awaiting its send (``send_and_wait`` for raw aiokafka, ``Producer.send`` for
tracemq), to its own fresh topic of 8 queues on broker-a. Raw aiokafka writes the same Kafka
topic layout tracemq uses (``kafka_topic("broker-a", topic)``, partitions 0..n-1 round robin)
with the same AIOKafkaProducer settings as tracemq's ProducerPool.

Then the CPU-bound phase (``--batch`` > 0): the same three producers, each with
``--batch-concurrency`` coroutines that each send ``--batch`` messages at a time and await them
all — ``Producer.send_batch`` for tracemq, ``send`` of every member to one partition then the
acknowledgements for raw aiokafka — so that enough is in flight for the client's CPU, not the
round trip, to decide the rate. Its target is tracemq (trace off) >= 0.7 x raw aiokafka.

The variants are interleaved to share the machine's noise: ``--rounds`` rounds, each sending
messages/rounds per variant, the order rotated every round; a variant's rate is its messages
over the sum of its round times. After each trace-on round the dispatcher is flushed outside
the timed section, so its backlog does not steal CPU from the next variant.

Before each timed section a full garbage collection (outside it) starts it from a collected
heap, as ``bench/consumer.py`` does; ``--keep-heap`` leaves it out, as runs before 2026-11-30's
eighteenth client pass did (then this process's full collection, ~45 ms here, fell into
whichever variant's window came when it was due: +2 µs per message to a CPU-bound round's
0.25 s, off and on alike). The CPU-bound phase reports its collections too.

``--perf`` samples the bench's process with Linux perf (``bench/_perf.py``) and splits its CPU
between the variants' timed sections by shared object and symbol (trace off against raw
aiokafka, trace on against trace off), as ``bench/consumer.py --perf`` does.

Then the clients are shut down (which flushes the dispatcher), the trace topic is read back and
every msgId sent by the trace-on variant must have exactly one successful Pub trace.

Prints progress, then one JSON line last. Exit code 0 even when a target is missed; 1 when the
traces are incomplete; 2 on a crash.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GcTimer,
    Ticker,
    add_cpu,
    base_parser,
    body_of,
    bounded,
    check_args,
    client_env,
    cpu_delta,
    cpu_snapshot,
    create_topic,
    producer_pool_kwargs,
    rate,
    ratio,
    read_trace_index,
    run_bench,
    say,
    split,
    wait_trace_topic_route,
)
from _perf import PerfRecorder, describe, split_windows  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from tracemq import Message, Producer, kafka_security  # noqa: E402
from tracemq.naming import kafka_topic  # noqa: E402
from tracemq_devkit.devstack import EmbeddedStack  # noqa: E402

VARIANTS = ("raw", "off", "on")
TARGET_ON_VS_OFF = 0.90
TARGET_OFF_VS_RAW = 0.70
TARGET_OFF_US = 20.0  # bench CPU per message, trace off, latency-bound phase
TARGET_TRACE_US = 3.0  # what trace on adds to it
TARGET_BATCH_OFF_VS_RAW = 0.70
BROKER = "broker-a"


class Variant:
    """One way of sending: ``send_one()`` sends one message and waits for its ack."""

    def __init__(self, name: str, topic: str) -> None:
        self.name = name
        self.topic = topic
        self.seconds = 0.0
        self.sent = 0
        self.rounds: list[dict[str, Any]] = []
        self.cpu: dict[str, float] = {}
        self.msg_ids: list[str] = []
        self.flush_s = 0.0
        #: GC during the timed latency-bound sends: collections per generation, milliseconds
        self.gc: dict[str, list[Any]] = {"collections": [0, 0, 0], "ms": [0.0, 0.0, 0.0]}

    async def start(self) -> None: ...

    async def send_one(self) -> None: ...

    async def send_batch(self, k: int) -> None: ...

    async def stop(self) -> None: ...


class RawVariant(Variant):
    def __init__(self, topic: str, bootstrap: str, queues: int, body: bytes) -> None:
        super().__init__("raw", topic)
        self.ktopic = kafka_topic(BROKER, topic)
        self.kwargs = producer_pool_kwargs()
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, **kafka_security.client_kwargs(bootstrap), **self.kwargs
        )
        self.partitions = itertools.cycle(range(queues))
        self.body = body

    async def start(self) -> None:
        await bounded(self.producer.start(), 60, "starting the raw AIOKafkaProducer")

    async def send_one(self) -> None:
        await self.producer.send_and_wait(self.ktopic, self.body, partition=next(self.partitions))

    async def send_batch(self, k: int) -> None:
        part = next(self.partitions)
        futs = [await self.producer.send(self.ktopic, self.body, partition=part) for _ in range(k)]
        await asyncio.gather(*futs)

    async def stop(self) -> None:
        await bounded(self.producer.stop(), 30, "stopping the raw AIOKafkaProducer")


class TracemqVariant(Variant):
    def __init__(
        self,
        name: str,
        topic: str,
        stack: EmbeddedStack,
        body: bytes,
        group: str,
        trace_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name, topic)
        self.producer = Producer(
            group,
            enable_msg_trace=(name == "on"),
            trace_options=trace_options if name == "on" else None,
            **client_env(stack),
        )
        self.body = body
        self.stats: dict[str, Any] = {}

    async def start(self) -> None:
        await bounded(self.producer.start(), 60, f"starting the tracemq Producer ({self.name})")

    async def send_one(self) -> None:
        result = await self.producer.send(Message(self.topic, self.body))
        self.msg_ids.append(result.msg_id)

    async def send_batch(self, k: int) -> None:
        results = await self.producer.send_batch([Message(self.topic, self.body) for _ in range(k)])
        self.msg_ids.extend(r.msg_id for r in results)

    async def flush_traces(self) -> None:
        d = self.producer.trace_dispatcher
        if d is not None:
            t0 = time.perf_counter()
            ok = await d.flush(60)
            self.flush_s += time.perf_counter() - t0
            if not ok:
                say("    warning: the trace dispatcher did not flush within 60s")

    async def stop(self) -> None:
        await bounded(
            self.producer.shutdown(trace_timeout_s=60),
            120,
            f"shutting the tracemq Producer ({self.name}) down",
        )
        d = self.producer.trace_dispatcher
        if d is not None:
            self.stats = d.stats()


def _sent_of(v: Variant) -> Callable[[], int]:
    return lambda: v.sent


async def send_many(
    v: Variant, count: int, concurrency: int, timeout_s: float, batch: int = 0
) -> float:
    """``count`` sends spread over ``concurrency`` coroutines (``batch`` > 0: ``batch`` messages
    at a time, ``count`` rounded down to whole batches); the elapsed seconds."""
    if batch:
        shares = [s for s in split(count // batch, concurrency) if s]
    else:
        shares = [s for s in split(count, concurrency) if s]

    async def worker(k: int) -> None:
        for _ in range(k):
            if batch:
                await v.send_batch(batch)
                v.sent += batch
            else:
                await v.send_one()
                v.sent += 1

    t0 = time.perf_counter()
    await bounded(
        asyncio.gather(*(worker(k) for k in shares)),
        timeout_s,
        f"{v.name}: sending {count} messages",
    )
    return time.perf_counter() - t0


def _perf_split(
    recorder: PerfRecorder, windows: dict[str, dict[str, list[tuple[float, float]]]], args: Any
) -> dict[str, Any]:
    """--perf: this process's CPU in each variant's timed sections, by shared object and
    symbol (bench/_perf.py): trace off against raw aiokafka, trace on against trace off."""
    try:
        samples = recorder.samples()
    finally:
        recorder.close()
    out: dict[str, Any] = {}
    for phase, per in windows.items():
        if not per["raw"]:
            continue
        # messages per variant: all of them in the latency-bound sections; the CPU-bound
        # phase sends a whole number of batches per round
        each = (
            args.messages
            if phase == "latency_bound"
            else len(per["raw"]) * (args.messages // args.rounds // args.batch) * args.batch
        )
        out[phase] = {
            "off_vs_raw": split_windows(
                samples, {"raw": per["raw"], "off": per["off"]}, {"raw": each, "off": each}
            ),
            "on_vs_off": split_windows(
                samples, {"off": per["off"], "on": per["on"]}, {"off": each, "on": each}
            ),
        }
        say(f"perf, {phase.replace('_', '-')} phase:")
        for line in describe(out[phase]["off_vs_raw"], dsos=4, symbols=5):
            say("  " + line)
        for line in describe(out[phase]["on_vs_off"], dsos=4, symbols=8):
            say("  " + line)
    return out


async def bench(stack: EmbeddedStack, args: Any) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:8]
    body = body_of(args.size)
    topics = {v: f"BenchProd_{v}_{uid}" for v in VARIANTS}
    for t in topics.values():
        await create_topic(stack, t, args.queues)
    await wait_trace_topic_route(stack)
    say(f"topics created on {BROKER} ({args.queues} queues each): {', '.join(topics.values())}")

    variants: dict[str, Variant] = {
        "raw": RawVariant(topics["raw"], stack.business_bootstrap, args.queues, body),
        "off": TracemqVariant("off", topics["off"], stack, body, f"PG_bench_off_{uid}"),
        "on": TracemqVariant(
            "on", topics["on"], stack, body, f"PG_bench_on_{uid}", args.trace_options
        ),
    }
    say(
        f"AIOKafkaProducer settings (tracemq ProducerPool's, used by raw too): "
        f"{producer_pool_kwargs()}"
    )
    batch_stats: dict[str, dict[str, Any]] = {
        n: {
            "seconds": 0.0,
            "messages": 0,
            "bench_cpu_s": 0.0,
            "gc_collections": [0, 0, 0],
            "gc_s": 0.0,
        }
        for n in VARIANTS
    }
    # --perf: each timed section's (start, end) on time.monotonic, perf's clock
    windows: dict[str, dict[str, list[tuple[float, float]]]] = {
        "latency_bound": {n: [] for n in VARIANTS},
        "cpu_bound": {n: [] for n in VARIANTS},
    }
    recorder = PerfRecorder() if args.perf else None
    try:
        for v in variants.values():
            await v.start()

        # Warm-up: connections, metadata, routes, code paths. Not timed; traced msgIds count.
        warm = min(2000, max(args.concurrency, args.messages // 50))
        for v in variants.values():
            await send_many(v, warm, args.concurrency, 120)
            if isinstance(v, TracemqVariant):
                await v.flush_traces()
        for v in variants.values():
            v.sent, v.flush_s = 0, 0.0
        say(f"warm-up done ({warm} messages per variant)")
        if recorder is not None:
            recorder.start()

        shares = split(args.messages, args.rounds)
        order = list(VARIANTS)
        for r, share in enumerate(shares):
            say(f"round {r + 1}/{args.rounds}: {share} messages per variant, order {order}")
            for name in order:
                v = variants[name]
                # a floor of 200 msg/s: anything slower is broken, not slow
                timeout = max(120.0, share / 200)
                if not args.keep_heap:
                    gc.collect()  # (outside the timed section: see the module's docstring)
                before = cpu_snapshot(stack)
                with GcTimer() as gc_timer:
                    async with Ticker(f"{name} r{r + 1}", _sent_of(v), v.sent + share):
                        began = time.monotonic()
                        dt = await send_many(v, share, args.concurrency, timeout)
                        windows["latency_bound"][name].append((began, time.monotonic()))
                delta = cpu_delta(before, cpu_snapshot(stack))
                gc_delta = GcTimer.delta(([0, 0, 0], [0.0, 0.0, 0.0]), gc_timer.snapshot())
                for g in range(3):
                    v.gc["collections"][g] += gc_delta["collections"][g]
                    v.gc["ms"][g] += gc_delta["ms"][g]
                add_cpu(v.cpu, delta)
                v.seconds += dt
                v.rounds.append(
                    {
                        "round": r + 1,
                        "messages": share,
                        "seconds": round(dt, 3),
                        "msgs_per_s": round(rate(share, dt), 1),
                        "bench_cpu_s": delta.get("bench", 0.0),
                    }
                )
                say(
                    f"  {name:>3}: {share} msgs in {dt:6.2f}s = {rate(share, dt):9,.0f} msg/s"
                    f"  (bench CPU {delta.get('bench', 0):.2f}s, business Kafka CPU "
                    f"{delta.get('kafka-business', 0):.2f}s, trace Kafka CPU "
                    f"{delta.get('kafka-trace', 0):.2f}s)"
                )
                if isinstance(v, TracemqVariant):
                    await v.flush_traces()  # untimed: keep its backlog out of the next variant
            order = order[1:] + order[:1]

        # -- the CPU-bound phase: batches, many in flight ----------------------------------
        if args.batch:
            per_round = (args.messages // args.rounds // args.batch) * args.batch
            for r in range(args.rounds):
                say(
                    f"CPU-bound round {r + 1}/{args.rounds}: {per_round} messages per variant in "
                    f"batches of {args.batch}, {args.batch_concurrency} in flight, order {order}"
                )
                for name in order:
                    v = variants[name]
                    if not args.keep_heap:
                        gc.collect()
                    before = cpu_snapshot(stack)
                    with GcTimer() as gc_timer:
                        began = time.monotonic()
                        dt = await send_many(
                            v, per_round, args.batch_concurrency, max(120.0, per_round / 200),
                            args.batch,
                        )  # fmt: skip
                        windows["cpu_bound"][name].append((began, time.monotonic()))
                    delta = cpu_delta(before, cpu_snapshot(stack))
                    for g in range(3):
                        batch_stats[name]["gc_collections"][g] += gc_timer.collections[g]
                        batch_stats[name]["gc_s"] += gc_timer.seconds[g]
                    batch_stats[name]["seconds"] += dt
                    batch_stats[name]["messages"] += per_round
                    batch_stats[name]["bench_cpu_s"] += delta.get("bench", 0.0)
                    say(
                        f"  {name:>3}: {per_round} msgs in {dt:6.2f}s = "
                        f"{rate(per_round, dt):9,.0f} msg/s (bench CPU {delta.get('bench', 0):.2f}s)"
                    )
                    if isinstance(v, TracemqVariant):
                        await v.flush_traces()
                order = order[1:] + order[:1]
    finally:
        if recorder is not None:
            recorder.stop()
        for v in variants.values():
            try:
                await v.stop()
            except Exception as exc:  # keep stopping the others
                say(f"  stopping {v.name} failed: {exc!r}")
    perf = _perf_split(recorder, windows, args) if recorder is not None else None

    mps = {n: round(rate(args.messages, v.seconds), 1) for n, v in variants.items()}
    ratios = {
        "off_vs_raw": ratio(mps["off"], mps["raw"]),
        "on_vs_off": ratio(mps["on"], mps["off"]),
        "on_vs_raw": ratio(mps["on"], mps["raw"]),
    }
    cpu_us = {
        n: round(v.cpu.get("bench", 0.0) / args.messages * 1e6, 1) for n, v in variants.items()
    }
    trace_us = round(cpu_us["on"] - cpu_us["off"], 1)
    gc_us = {n: round(sum(v.gc["ms"]) * 1000 / args.messages, 2) for n, v in variants.items()}
    batch_mps = {
        n: round(rate(int(b["messages"]), b["seconds"]), 1) for n, b in batch_stats.items()
    }
    batch_cpu_us = {
        n: round(b["bench_cpu_s"] / b["messages"] * 1e6, 1) if b["messages"] else 0.0
        for n, b in batch_stats.items()
    }
    batch_gc_us = {
        n: round(b["gc_s"] / b["messages"] * 1e6, 2) if b["messages"] else 0.0
        for n, b in batch_stats.items()
    }
    batch_ratios = {
        "off_vs_raw": ratio(batch_mps["off"], batch_mps["raw"]),
        "on_vs_raw": ratio(batch_mps["on"], batch_mps["raw"]),
        "on_vs_off": ratio(batch_mps["on"], batch_mps["off"]),
    }
    targets = {
        "on_vs_off_ge_0.90": ratios["on_vs_off"] >= TARGET_ON_VS_OFF,
        "off_vs_raw_ge_0.70": ratios["off_vs_raw"] >= TARGET_OFF_VS_RAW,
        "off_cpu_us_le_20": cpu_us["off"] <= TARGET_OFF_US,
        "off_cpu_le_1.5x_raw": cpu_us["off"] <= 1.5 * cpu_us["raw"],
        "trace_cpu_us_le_3": trace_us <= TARGET_TRACE_US,
    }
    if args.batch:
        targets["batch_off_vs_raw_ge_0.70"] = batch_ratios["off_vs_raw"] >= TARGET_BATCH_OFF_VS_RAW
    say("results:")
    for n, v in variants.items():
        cpu_per_msg = v.cpu.get("bench", 0.0) / args.messages * 1e6
        say(
            f"  {n:>3}: {mps[n]:9,.0f} msg/s  ({v.seconds:.2f}s for {args.messages}, "
            f"bench CPU {cpu_per_msg:.1f} us/msg, of which GC {gc_us[n]:.2f} us/msg, "
            f"collections per generation {v.gc['collections']})"
        )
    say(
        f"  trace-off / raw = {ratios['off_vs_raw']:.3f} (target >= {TARGET_OFF_VS_RAW}: "
        f"{'met' if targets['off_vs_raw_ge_0.70'] else 'MISSED'})"
    )
    say(
        f"  trace-on / trace-off = {ratios['on_vs_off']:.3f} (target >= {TARGET_ON_VS_OFF}: "
        f"{'met' if targets['on_vs_off_ge_0.90'] else 'MISSED'})"
    )
    say(
        f"  bench CPU per message: raw {cpu_us['raw']} us, trace off {cpu_us['off']} us (target "
        f"<= {TARGET_OFF_US} and <= 1.5 x raw: "
        f"{'met' if targets['off_cpu_us_le_20'] and targets['off_cpu_le_1.5x_raw'] else 'MISSED'}"
        f"), trace on adds {trace_us} us (target <= {TARGET_TRACE_US}: "
        f"{'met' if targets['trace_cpu_us_le_3'] else 'MISSED'})"
    )
    if args.batch:
        for n in VARIANTS:
            say(
                f"  CPU-bound {n:>3}: {batch_mps[n]:9,.0f} msg/s, bench CPU {batch_cpu_us[n]} us/msg"
                f" (of which GC {batch_gc_us[n]:.2f}, collections per generation "
                f"{batch_stats[n]['gc_collections']})"
            )
        say(
            f"  CPU-bound trace-off / raw = {batch_ratios['off_vs_raw']:.3f} (target >= "
            f"{TARGET_BATCH_OFF_VS_RAW}: "
            f"{'met' if targets['batch_off_vs_raw_ge_0.70'] else 'MISSED'}), trace-on / raw = "
            f"{batch_ratios['on_vs_raw']:.3f}"
        )

    # -- trace completeness ----------------------------------------------------------------
    on = variants["on"]
    assert isinstance(on, TracemqVariant)
    group = on.producer.group
    say(f"reading the trace topic back to check {len(on.msg_ids)} msgIds of the trace-on variant")
    t0 = time.perf_counter()
    idx = await read_trace_index(stack)
    read_s = time.perf_counter() - t0
    sent_ids = set(on.msg_ids)
    missing = duplicated = failed_pub = 0
    for mid in sent_ids:
        pubs = idx.count("Pub", group, mid)
        if not pubs:
            missing += 1
        elif len(pubs) > 1:
            duplicated += 1
        elif not pubs[0]:
            failed_pub += 1
    stats = on.stats
    complete = (
        missing == 0
        and duplicated == 0
        and failed_pub == 0
        and len(sent_ids) == len(on.msg_ids)
        and idx.decode_errors == 0
        and stats.get("discarded", 0) == 0
        and stats.get("failed", 0) == 0
    )
    trace = {
        "trace_complete": complete,
        "sent_msg_ids": len(on.msg_ids),
        "unique_msg_ids": len(sent_ids),
        "with_one_pub": len(sent_ids) - missing - duplicated - failed_pub,
        "missing_pub": missing,
        "duplicate_pub": duplicated,
        "failed_pub": failed_pub,
        "trace_messages": idx.messages,
        "trace_contexts": idx.contexts,
        "decode_errors": idx.decode_errors,
        "discarded": int(stats.get("discarded", -1)),
        "failed": int(stats.get("failed", -1)),
        "dispatcher": {
            k: stats.get(k)
            for k in (
                "appended",
                "sent",
                "sent_messages",
                "discarded",
                "failed",
                "oversize",
                "send_latency_ms_mean",
            )
        },
        "untimed_flush_s": round(on.flush_s, 3),
        "read_s": round(read_s, 1),
    }
    say(
        f"trace: complete={complete} msgIds={len(on.msg_ids)} with exactly one successful Pub="
        f"{trace['with_one_pub']} missing={missing} duplicated={duplicated} failed={failed_pub}; "
        f"dispatcher discarded={trace['discarded']} failed={trace['failed']} "
        f"(trace messages {idx.messages}, read in {read_s:.1f}s)"
    )

    return {
        "msgs_per_s": mps,
        "seconds": {n: round(v.seconds, 3) for n, v in variants.items()},
        "ratios": ratios,
        "targets": {
            "on_vs_off": TARGET_ON_VS_OFF,
            "off_vs_raw": TARGET_OFF_VS_RAW,
            "off_cpu_us_per_msg": TARGET_OFF_US,
            "trace_cpu_us_per_msg": TARGET_TRACE_US,
            "cpu_bound_off_vs_raw": TARGET_BATCH_OFF_VS_RAW,
        },
        "targets_met": targets,
        "per_round": {n: v.rounds for n, v in variants.items()},
        "cpu_s": {n: v.cpu for n, v in variants.items()},
        "bench_cpu_us_per_msg": cpu_us,
        "gc_us_per_msg": gc_us,
        "gc_collections": {n: v.gc["collections"] for n, v in variants.items()},
        "trace_cpu_us_per_msg": trace_us,
        "cpu_bound": {
            "batch": args.batch,
            "in_flight_batches": args.batch_concurrency,
            "msgs_per_s": batch_mps,
            "bench_cpu_us_per_msg": batch_cpu_us,
            "gc_us_per_msg": batch_gc_us,
            "gc_collections": {n: b["gc_collections"] for n, b in batch_stats.items()},
            "ratios": batch_ratios,
            "seconds": {n: round(b["seconds"], 3) for n, b in batch_stats.items()},
        },
        "collected_before_each_variant": not args.keep_heap,
        "warmup_messages": warm,
        "queues": args.queues,
        "producer_settings": {k: v for k, v in producer_pool_kwargs().items()},
        "trace_complete": complete,
        "trace": trace,
        "perf": perf,
    }


def main() -> int:
    parser = base_parser(
        "Producer throughput: raw aiokafka vs tracemq trace off vs trace on",
        concurrency=64,
        rounds=3,
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=64,
        help="CPU-bound phase: messages per send_batch (default 64; 0 skips the phase)",
    )
    parser.add_argument(
        "--batch-concurrency",
        type=int,
        default=16,
        help="CPU-bound phase: batches in flight per variant (default 16)",
    )
    parser.add_argument(
        "--keep-heap",
        action="store_true",
        help="no full garbage collection before each timed section (how runs before "
        "2026-11-30's eighteenth client pass were made)",
    )
    parser.add_argument(
        "--perf",
        action="store_true",
        help="also sample this process with Linux perf (cpu-clock, 499 Hz) and split its CPU "
        "between the variants' timed sections by shared object and symbol (trace off against "
        "raw, trace on against off); needs perf (Debian: linux-perf)",
    )
    args = parser.parse_args()
    check_args(args)
    if args.perf and shutil.which("perf") is None:
        raise SystemExit("--perf needs Linux perf on PATH (Debian: apt-get install linux-perf)")
    if args.batch < 0 or args.batch_concurrency < 1:
        raise SystemExit("--batch must be >= 0 and --batch-concurrency >= 1")
    return run_bench("producer", args, bench)


if __name__ == "__main__":
    sys.exit(main())
