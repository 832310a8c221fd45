"""Consumer throughput: tracemq PushConsumer with trace off vs trace on.

    .venv/bin/python bench/consumer.py [--messages 100000] [--concurrency 20] [--rounds 2]
                                       [--size 200] [--pull-batch-size 500]

A fresh topic of 8 queues on broker-a is pre-filled with ``--messages`` messages of ``--size``
bytes (tracemq Producer, trace off). Then, per round, two new consumer groups — one with trace
off, one with trace on, the order alternating every round — consume the whole topic one after
the other: PushConsumer, CONSUME_FROM_FIRST_OFFSET, an async listener returning
CONSUME_SUCCESS, the same ``consume_concurrency`` and ``pull_batch_size`` for both. The headline is the
steady state: the rate from the first message delivered to the last (N x rounds over the sum of
those spans), the on/off ratio of those rates (target >= 0.85) and the bench CPU per message
that tracing adds (on minus off, target <= 3 us). The wait for the first assignment (``start()``
to the first message: the group join, which Tansu holds for half the group session timeout) is
reported separately, as is the whole-run rate from ``start()``. ``--session-timeout-ms`` (default
6000, so a ~3 s join; the library default is 10 000) is passed to every PushConsumer.

After each run the consumer is shut down (which flushes its trace dispatcher). At the end the
trace topic is read back: every msgId consumed by a trace-on group must have a SubBefore and a
SubAfter of that group.

Each round's pair is also reported on its own (``per_round``: tracing and on/off of that
round's two variants, and their median): a stall of the host lands in one variant of one
round, and with ``--rounds`` 3 or more the median leaves it out.

``--aa`` runs an A/A control (both variants with trace off): what the bench measures as tracing
when there is none — its noise and any order effect (2026-11-29: −0.5 – 0.4 µs/msg, median 0.1,
over six runs).

``--perf`` samples the bench's process with Linux perf (``bench/_perf.py``) and splits its CPU
between the variants' steady windows by shared object and symbol: what only the trace-on
windows ran (the compiled trace steps, the trace message's compressor) is tracing's own code,
a figure the host's swings between rounds do not move (2026-11-30: ~0.6 µs/msg of it, of a
whole-process on − off of ~1 µs in runs where the host held still).

Before each variant a full garbage collection (outside its measurement) starts it from a
collected heap; ``--keep-heap`` leaves it out, as runs before 2026-11-29's thirteenth pass did
(then the full collection the pre-fill made due, ~50 ms here, fell into round 1's second
variant — "on" — in every run: ~0.25 µs/msg of "tracing" that was the bench's).

Prints progress, then one JSON line last. Exit code 0 even when the target is missed; 1 when the
traces are incomplete; 2 on a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GcTimer,
    TaskCpu,
    Ticker,
    add_cpu,
    base_parser,
    body_of,
    bounded,
    check_args,
    client_env,
    cpu_delta,
    cpu_snapshot,
    crashed_tasks,
    create_topic,
    rate,
    ratio,
    read_trace_index,
    run_bench,
    say,
    split,
    wait_progress,
    wait_trace_topic_route,
)
from _perf import PerfRecorder, describe, split_windows  # noqa: E402
from tracemq import (  # noqa: E402
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq_devkit.devstack import EmbeddedStack  # noqa: E402

TARGET_ON_VS_OFF = 0.85
TARGET_TRACE_US = 3.0
BROKER = "broker-a"
FILL_CONCURRENCY = 64


async def prefill(stack: EmbeddedStack, topic: str, n: int, body: bytes, uid: str) -> set[str]:
    """Send ``n`` messages with trace off; return their msgIds."""
    producer = Producer(f"PG_bench_fill_{uid}", **client_env(stack))
    await bounded(producer.start(), 60, "starting the pre-fill producer")
    ids: list[str] = []

    async def worker(k: int) -> None:
        for _ in range(k):
            ids.append((await producer.send(Message(topic, body))).msg_id)  # noqa: PERF401

    t0 = time.perf_counter()
    try:
        async with Ticker("pre-fill", lambda: len(ids), n):
            await bounded(
                asyncio.gather(*(worker(k) for k in split(n, FILL_CONCURRENCY) if k)),
                max(180.0, n / 200),
                f"pre-filling {n} messages",
            )
    finally:
        await bounded(producer.shutdown(), 60, "shutting the pre-fill producer down")
    dt = time.perf_counter() - t0
    say(
        f"pre-filled {topic} with {len(ids)} messages of {len(body)} bytes in {dt:.1f}s "
        f"({rate(len(ids), dt):,.0f} msg/s, trace off)"
    )
    return set(ids)


async def consume_all(
    stack: EmbeddedStack, args: Any, topic: str, variant: str, group: str, expected: set[str]
) -> dict[str, Any]:
    """One consumer group reads the whole topic; its timings, CPU, msgIds and trace stats."""
    n = len(expected)
    seen: set[str] = set()
    delivered = [0]
    first: list[float] = []
    window: list[float] = []
    done = asyncio.Event()

    async def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
        if not first:
            first.append(time.perf_counter())
            window.append(time.monotonic())  # (--perf: the steady window on perf's clock)
            at_first()
        delivered[0] += len(msgs)
        for m in msgs:
            seen.add(m.msg_id)
        if len(seen) >= n:
            done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        group,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_msg_trace=(variant == "on" and not args.aa),
        consume_concurrency=args.concurrency,
        pull_batch_size=args.pull_batch_size,
        consume_message_batch_max_size=args.consume_batch,
        trace_options=args.trace_options if variant == "on" and not args.aa else None,
        session_timeout_ms=args.session_timeout_ms,
        **client_env(stack),
    )
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(listener)
    gc_timer = GcTimer()
    gc_before = gc_timer.snapshot()
    task_cpu = TaskCpu() if args.task_cpu else None
    tasks_before: dict[str, float] = {}
    before = cpu_snapshot(stack)
    t0 = time.perf_counter()
    started_s = 0.0
    steady_before: dict[str, float] = {}

    def at_first() -> None:  # CPU from the first delivery on: the steady state's
        nonlocal gc_before
        if first and not steady_before:
            steady_before.update(cpu_snapshot(stack))
            gc_before = gc_timer.snapshot()
            if task_cpu is not None:
                tasks_before.update(task_cpu.snapshot())

    try:
        gc_timer.__enter__()
        if task_cpu is not None:
            task_cpu.__enter__()
        await bounded(consumer.start(), 60, f"starting consumer {group}")
        started_s = time.perf_counter() - t0
        async with Ticker(f"{variant} {group}", lambda: len(seen), n):
            # a floor of 200 msg/s overall, and progress at least every --stall-timeout s
            await wait_progress(
                done,
                lambda: len(seen),
                timeout_s=max(180.0, n / 200),
                stall_s=args.stall_timeout,
                what=f"{group} consuming {n} messages",
                check=lambda: crashed_tasks(
                    getattr(consumer, "_workers", ()), f"PushConsumer {group}"
                ),
            )
        t1 = time.perf_counter()
        window.append(time.monotonic())
        steady_gc = GcTimer.delta(gc_before, gc_timer.snapshot())
        steady_tasks = (
            TaskCpu.us_per(tasks_before, task_cpu.snapshot(), n) if task_cpu is not None else None
        )
        end = cpu_snapshot(stack)
        cpu = cpu_delta(before, end)
        steady_cpu = cpu_delta(steady_before or before, end)
    finally:
        gc_timer.__exit__()
        if task_cpu is not None:
            task_cpu.__exit__()
        s0 = time.perf_counter()
        await bounded(consumer.shutdown(), 120, f"shutting consumer {group} down")
        shutdown_s = time.perf_counter() - s0
    stats = consumer.trace_dispatcher.stats() if consumer.trace_dispatcher is not None else {}
    total_s = t1 - t0
    steady_s = t1 - first[0] if first else 0.0
    return {
        "variant": variant,
        "group": group,
        "messages": n,
        "seen": len(seen),
        "delivered": delivered[0],
        "all_expected": seen == expected,
        "seconds": round(total_s, 3),
        "start_s": round(started_s, 3),
        "first_msg_s": round(first[0] - t0, 3) if first else None,
        "steady_s": round(steady_s, 3),
        "msgs_per_s": round(rate(n, total_s), 1),
        "steady_msgs_per_s": round(rate(n, steady_s), 1),
        "shutdown_s": round(shutdown_s, 3),
        "cpu_s": cpu,
        "steady_cpu_s": steady_cpu,
        "steady_gc": steady_gc,
        "steady_task_cpu_us_per_msg": steady_tasks,
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
        }
        if stats
        else None,
        "_seen": seen,
        "_window": tuple(window) if len(window) == 2 else None,
    }


def _tracing_by_task(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Steady CPU us/msg by event-loop callback, trace on minus off (means over the rounds),
    largest difference first."""
    mean: dict[str, dict[str, float]] = {}
    for variant in ("off", "on"):
        vr = [x["steady_task_cpu_us_per_msg"] or {} for x in runs if x["variant"] == variant]
        names = {k for x in vr for k in x}
        mean[variant] = {k: sum(x.get(k, 0.0) for x in vr) / len(vr) for k in names}
    names = set(mean["off"]) | set(mean["on"])
    diff = {k: round(mean["on"].get(k, 0.0) - mean["off"].get(k, 0.0), 3) for k in names}
    return dict(sorted(diff.items(), key=lambda kv: -abs(kv[1])))


def per_round(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each round's pair on its own: tracing's steady bench CPU (on minus off, us/msg) and the
    steady on/off rate ratio of that round's two variants. The headline pools the rounds; a
    stall of the host lands in one variant of one round, which these show (and which their
    median, with --rounds 3 or more, leaves out)."""
    out: list[dict[str, Any]] = []
    for r in sorted({x["round"] for x in runs}):
        pair = {x["variant"]: x for x in runs if x["round"] == r}
        if set(pair) != {"off", "on"}:
            continue
        us = {
            v: pair[v]["steady_cpu_s"].get("bench", 0.0) / pair[v]["messages"] * 1e6 for v in pair
        }
        out.append(
            {
                "round": r,
                "tracing_us": round(us["on"] - us["off"], 2),
                "on_vs_off": ratio(
                    pair["on"]["steady_msgs_per_s"], pair["off"]["steady_msgs_per_s"]
                ),
            }
        )
    return out


async def _rounds(
    stack: EmbeddedStack,
    args: Any,
    topic: str,
    expected: set[str],
    uid: str,
    runs: list[dict[str, Any]],
    order: list[str],
) -> None:
    """The rounds: each variant's group consumes the whole topic, the order alternating."""
    for r in range(args.rounds):
        say(f"round {r + 1}/{args.rounds}: order {order}")
        for variant in order:
            group = f"CG_bench_{variant}_r{r + 1}_{uid}"
            if not args.keep_heap:
                # Each variant starts from a collected heap (outside its measurement): a full
                # collection the pre-fill and the earlier variants made due otherwise lands in
                # whichever variant comes next (~50 ms, 0.5 us/msg; it fell in round 1's "on"
                # in every run of 2026-11-29's pass, A/A runs too), not where its cause is.
                gc.collect()
            run = await consume_all(stack, args, topic, variant, group, expected)
            run["round"] = r + 1
            runs.append(run)
            d = run["dispatcher"] or {}
            say(
                f"  {variant:>3}: {run['messages']} msgs in {run['seconds']:6.2f}s = "
                f"{run['msgs_per_s']:9,.0f} msg/s from start() (start {run['start_s']:.2f}s, "
                f"first msg at {run['first_msg_s']}s, {run['steady_msgs_per_s']:,.0f} msg/s "
                f"first->last; bench CPU {run['cpu_s'].get('bench', 0):.2f}s, trace Kafka CPU "
                f"{run['cpu_s'].get('kafka-trace', 0):.2f}s; shutdown {run['shutdown_s']:.2f}s"
                + (
                    f"; traces sent={d.get('sent')} discarded={d.get('discarded')} "
                    f"failed={d.get('failed')}"
                    if d
                    else ""
                )
                + ")"
            )
        order.reverse()


async def interleaved(
    stack: EmbeddedStack, args: Any, topic: str, expected: set[str], uid: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """--slice-s: both variants at once, alternating by the slice. Two more groups, one
    trace off and one trace on, are started together and both read the whole topic; their
    listeners wait at a gate of their variant's, so that only one variant consumes at any
    time: its gate is opened for ``--slice-s`` seconds, then closed, the calls already past it
    finish, the trace-on consumer's dispatcher is flushed (the trace messages of its slice
    sent inside it), and the other variant's gate opens. A paused variant's queues fill to
    ``pull_threshold_per_queue`` and its fetches stop, so each slice starts in the steady
    state. Host swings of a few seconds — the noise of the rounds, whose variants run
    seconds apart — fall on both variants alike. Per slice: the messages that passed the
    gate, the wall time and this process's CPU; a variant's last slice, cut short by the end
    of the topic, is left out. The figures and the two runs (for the trace check)."""
    n = len(expected)
    variants = ("off", "on")
    gates = {v: asyncio.Event() for v in variants}
    seen: dict[str, set[str]] = {v: set() for v in variants}
    passed = dict.fromkeys(variants, 0)
    arrived = {v: asyncio.Event() for v in variants}
    finished = {v: asyncio.Event() for v in variants}

    def listener_of(v: str) -> Any:
        gate, ids = gates[v], seen[v]

        async def listener(msgs: list[MessageExt], ctx: object) -> ConsumeConcurrentlyStatus:
            arrived[v].set()
            while not gate.is_set():  # (woken after it closed again: wait for the next slice)
                await gate.wait()
            passed[v] += len(msgs)
            for m in msgs:
                ids.add(m.msg_id)
            if len(ids) >= n:
                finished[v].set()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return listener

    consumers: dict[str, PushConsumer] = {}
    groups = {v: f"CG_bench_{v}_il_{uid}" for v in variants}
    for v in variants:
        c = PushConsumer(
            groups[v],
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            enable_msg_trace=(v == "on" and not args.aa),
            consume_concurrency=args.concurrency,
            pull_batch_size=args.pull_batch_size,
            consume_message_batch_max_size=args.consume_batch,
            trace_options=args.trace_options if v == "on" and not args.aa else None,
            session_timeout_ms=args.session_timeout_ms,
            **client_env(stack),
        )
        c.subscribe(topic, "*")
        c.register_message_listener(listener_of(v))
        consumers[v] = c
    slices: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for v in variants:
            await bounded(consumers[v].start(), 60, f"starting consumer {groups[v]}")
        for v in variants:
            await bounded(arrived[v].wait(), 60, f"{groups[v]}'s first message")
        if not args.keep_heap:
            gc.collect()
        say(f"interleaved: {groups['off']} and {groups['on']}, slices of {args.slice_s} s")
        order = list(variants)
        deadline = time.monotonic() + max(180.0, 2 * n / 200)
        while not all(finished[v].is_set() for v in variants):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"interleaved: not done in time ({ {v: len(seen[v]) for v in variants} } "
                    f"of {n} msgIds)"
                )
            for v in order:
                if finished[v].is_set():
                    continue
                d0, c0, t0 = passed[v], time.process_time(), time.perf_counter()
                gates[v].set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished[v].wait(), args.slice_s)
                gates[v].clear()
                await asyncio.sleep(0)  # (the calls let through just before it closed)
                dispatcher = consumers[v].trace_dispatcher
                if dispatcher is not None and not await dispatcher.flush(30):
                    raise RuntimeError(f"interleaved: {groups[v]}'s traces not sent in 30 s")
                slices[v].append(
                    {
                        "messages": passed[v] - d0,
                        "s": time.perf_counter() - t0,
                        "cpu_s": time.process_time() - c0,
                        "whole": not finished[v].is_set(),
                    }
                )
                crashed_tasks(getattr(consumers[v], "_workers", ()), f"PushConsumer {groups[v]}")
            order.reverse()
    finally:
        for v in variants:
            gates[v].set()  # (nobody left waiting at a gate while shutting down)
            await bounded(consumers[v].shutdown(), 120, f"shutting consumer {groups[v]} down")
    runs = []
    for v in variants:
        stats = consumers[v].trace_dispatcher.stats() if consumers[v].trace_dispatcher else {}
        runs.append(
            {
                "variant": v,
                "group": groups[v],
                "all_expected": seen[v] == expected,
                "dispatcher": {k: stats.get(k) for k in ("discarded", "failed")} if stats else None,
                "_seen": seen[v],
            }
        )
    whole = {v: [x for x in slices[v] if x["whole"] and x["messages"]] for v in variants}
    per: dict[str, dict[str, float]] = {}
    for v in variants:
        msgs = sum(x["messages"] for x in whole[v])
        per[v] = {
            "slices": len(whole[v]),
            "messages": msgs,
            "msgs_per_s": round(rate(msgs, sum(x["s"] for x in whole[v])), 1),
            "cpu_us_per_msg": round(sum(x["cpu_s"] for x in whole[v]) / max(msgs, 1) * 1e6, 2),
        }
    # each trace-on slice against the trace-off slice just before it (the order alternates,
    # so either neighbour; pairs k of both lists ran side by side)
    pairs = [
        ratio(rate(a["messages"], a["s"]), rate(b["messages"], b["s"]))
        for a, b in zip(whole["on"], whole["off"], strict=False)
    ]
    out = {
        "slice_s": args.slice_s,
        "per_variant": per,
        "on_vs_off": ratio(per["on"]["msgs_per_s"], per["off"]["msgs_per_s"]),
        "tracing_us": round(per["on"]["cpu_us_per_msg"] - per["off"]["cpu_us_per_msg"], 2),
        "pair_ratios": pairs,
        "pair_ratio_median": round(statistics.median(pairs), 4) if pairs else None,
        "slices": {
            v: [[x["messages"], round(x["s"], 4), round(x["cpu_s"], 4)] for x in slices[v]]
            for v in variants
        },
        "all_consumed": all(r["all_expected"] for r in runs),
    }
    say(
        f"  interleaved ({per['off']['slices']} + {per['on']['slices']} whole slices of "
        f"{args.slice_s} s): off {per['off']['msgs_per_s']:,.0f} msg/s, "
        f"{per['off']['cpu_us_per_msg']:.1f} us/msg; on {per['on']['msgs_per_s']:,.0f} msg/s, "
        f"{per['on']['cpu_us_per_msg']:.1f} us/msg; on / off {out['on_vs_off']:.3f} (slice "
        f"pairs' median {out['pair_ratio_median']}), tracing {out['tracing_us']:.2f} us/msg"
    )
    return out, runs


def _perf_split(recorder: PerfRecorder, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """--perf: this process's CPU in the variants' steady windows, by shared object and
    symbol (bench/_perf.py); what only the trace-on windows ran is tracing's own code."""
    try:
        samples = recorder.samples()
    finally:
        recorder.close()
    windows: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    messages = {"off": 0, "on": 0}
    for run in runs:
        if run["_window"] is not None:
            windows[run["variant"]].append(run["_window"])
            messages[run["variant"]] += run["messages"]
    out = split_windows(samples, windows, messages)
    for line in describe(out):
        say("  " + line)
    return out


async def bench(stack: EmbeddedStack, args: Any) -> dict[str, Any]:
    uid = uuid.uuid4().hex[:8]
    body = body_of(args.size)
    topic = f"BenchCons_{uid}"
    await create_topic(stack, topic, args.queues)
    await wait_trace_topic_route(stack)
    say(f"topic {topic} created on {BROKER} ({args.queues} queues)")
    expected = await prefill(stack, topic, args.messages, body, uid)
    if len(expected) != args.messages:
        raise RuntimeError(
            f"pre-fill produced {len(expected)} distinct msgIds, expected {args.messages}"
        )

    runs: list[dict[str, Any]] = []
    order = ["off", "on"]
    recorder = PerfRecorder() if args.perf else None
    if recorder is not None:
        recorder.start()
    try:
        await _rounds(stack, args, topic, expected, uid, runs, order)
    finally:
        if recorder is not None:
            recorder.stop()
    perf = _perf_split(recorder, runs) if recorder is not None else None
    il, il_runs = (
        await interleaved(stack, args, topic, expected, uid) if args.slice_s else (None, [])
    )

    per: dict[str, dict[str, Any]] = {}
    for variant in ("off", "on"):
        vr = [x for x in runs if x["variant"] == variant]
        secs = sum(x["seconds"] for x in vr)
        steady = sum(x["steady_s"] for x in vr)
        msgs = sum(x["messages"] for x in vr)
        cpu: dict[str, float] = {}
        steady_cpu: dict[str, float] = {}
        for x in vr:
            add_cpu(cpu, x["cpu_s"])
            add_cpu(steady_cpu, x["steady_cpu_s"])
        waits = sorted(x["first_msg_s"] or 0.0 for x in vr)
        gc_ms = sum(sum(x["steady_gc"]["ms"]) for x in vr)
        gc_counts = [sum(x["steady_gc"]["collections"][g] for x in vr) for g in range(3)]
        per[variant] = {
            "seconds": round(secs, 3),
            "msgs_per_s": round(rate(msgs, secs), 1),
            "steady_msgs_per_s": round(rate(msgs, steady), 1),
            "cpu_s": cpu,
            "bench_cpu_us_per_msg": round(cpu.get("bench", 0.0) / msgs * 1e6, 1),
            "steady_bench_cpu_us_per_msg": round(steady_cpu.get("bench", 0.0) / msgs * 1e6, 1),
            "first_assignment_wait_s": waits,
            "steady_gc_us_per_msg": round(gc_ms * 1000 / msgs, 2),
            "steady_gc_collections": gc_counts,
        }
    mps = {v: per[v]["msgs_per_s"] for v in per}
    steady_mps = {v: per[v]["steady_msgs_per_s"] for v in per}
    ratios = {
        "on_vs_off_steady": ratio(steady_mps["on"], steady_mps["off"]),
        "on_vs_off_whole_run": ratio(mps["on"], mps["off"]),
    }
    trace_us = round(
        per["on"]["steady_bench_cpu_us_per_msg"] - per["off"]["steady_bench_cpu_us_per_msg"], 1
    )
    targets_met = {
        "on_vs_off_steady_ge_0.85": ratios["on_vs_off_steady"] >= TARGET_ON_VS_OFF,
        "trace_cpu_us_per_msg_le_3": trace_us <= TARGET_TRACE_US,
    }
    say(f"results (steady state: first message to last; group session timeout "
        f"{args.session_timeout_ms} ms):")  # fmt: skip
    for v in ("off", "on"):
        say(
            f"  {v:>3}: {steady_mps[v]:9,.0f} msg/s steady, bench CPU "
            f"{per[v]['steady_bench_cpu_us_per_msg']:.1f} us/msg steady (of which GC "
            f"{per[v]['steady_gc_us_per_msg']:.2f} us/msg, collections per generation "
            f"{per[v]['steady_gc_collections']}); first-assignment wait "
            f"{per[v]['first_assignment_wait_s']} s; {mps[v]:,.0f} msg/s from start() "
            f"({per[v]['seconds']:.2f}s total)"
        )
    tracing_by_task = _tracing_by_task(runs) if args.task_cpu else None
    if tracing_by_task:
        say("  tracing's CPU by event-loop callback (on - off, us/msg; --task-cpu adds ~1 us per")
        say("  callback to both sides: read it for where the time goes, not as the headline):")
        for name, us in list(tracing_by_task.items())[:12]:
            say(f"    {us:+7.3f}  {name}")
    rounds = per_round(runs)
    if rounds:
        say(
            "  per round (on minus off in one round): tracing "
            + ", ".join(f"{x['tracing_us']:.1f}" for x in rounds)
            + " us/msg (median "
            + f"{statistics.median(x['tracing_us'] for x in rounds):.1f}); on / off "
            + ", ".join(f"{x['on_vs_off']:.3f}" for x in rounds)
            + f" (median {statistics.median(x['on_vs_off'] for x in rounds):.3f})"
        )
    say(
        f"  steady trace-on / trace-off = {ratios['on_vs_off_steady']:.3f} (target >= "
        f"{TARGET_ON_VS_OFF}: {'met' if targets_met['on_vs_off_steady_ge_0.85'] else 'MISSED'});"
        f" tracing costs {trace_us:.1f} us/msg of bench CPU (target <= {TARGET_TRACE_US}: "
        f"{'met' if targets_met['trace_cpu_us_per_msg_le_3'] else 'MISSED'}); whole run from "
        f"start() {ratios['on_vs_off_whole_run']:.3f}"
    )

    all_consumed = all(r["all_expected"] for r in [*runs, *il_runs])
    figures = {
        "steady_msgs_per_s": steady_mps,
        "msgs_per_s": mps,
        "trace_cpu_us_per_msg": trace_us,
        "first_assignment_wait_s": {v: per[v]["first_assignment_wait_s"] for v in per},
        "session_timeout_ms": args.session_timeout_ms,
        "collected_before_each_variant": not args.keep_heap,
        "ratios": ratios,
        "per_round": rounds,
        "interleaved": il,
        "perf": perf,
        "per_round_median": {
            "tracing_us": round(statistics.median(x["tracing_us"] for x in rounds), 2),
            "on_vs_off": round(statistics.median(x["on_vs_off"] for x in rounds), 4),
        }
        if rounds
        else None,
    }
    if args.aa:
        say(
            "--aa: both variants ran with trace off, so 'tracing' above is the bench's own noise "
            "and order effect; the trace topic is not checked"
        )
        for run in runs:
            del run["_seen"], run["_window"]
        return {
            "aa_control": True,
            **figures,
            "per_variant": per,
            "runs": runs,
            "all_groups_consumed_everything": all_consumed,
            "trace_complete": all_consumed,  # (consumption only)
        }

    # -- trace completeness ----------------------------------------------------------------
    say("reading the trace topic back")
    t0 = time.perf_counter()
    idx = await read_trace_index(stack)
    read_s = time.perf_counter() - t0
    checked = missing_before = missing_after = failed_after = dup = 0
    discarded = failed = 0
    for run in [*runs, *il_runs]:
        if run["variant"] != "on":
            continue
        d = run["dispatcher"] or {}
        discarded += int(d.get("discarded") or 0)
        failed += int(d.get("failed") or 0)
        g = run["group"]
        for mid in run["_seen"]:
            checked += 1
            b = idx.count("SubBefore", g, mid)
            a = idx.count("SubAfter", g, mid)
            missing_before += not b
            missing_after += not a
            failed_after += bool(a) and not any(a)
            dup += len(b) > 1 or len(a) > 1
    complete = (
        missing_before == 0
        and missing_after == 0
        and failed_after == 0
        and idx.decode_errors == 0
        and checked > 0
    )
    trace = {
        "trace_complete": complete,
        "checked_msg_ids": checked,
        "missing_sub_before": missing_before,
        "missing_sub_after": missing_after,
        "failed_sub_after": failed_after,
        "redelivered_msg_ids": dup,
        "trace_messages": idx.messages,
        "trace_contexts": idx.contexts,
        "decode_errors": idx.decode_errors,
        "discarded": discarded,
        "failed": failed,
        "read_s": round(read_s, 1),
    }
    say(
        f"trace: complete={complete} checked {checked} (group, msgId) pairs of the trace-on "
        f"groups: missing SubBefore={missing_before} missing SubAfter={missing_after} "
        f"failed SubAfter={failed_after}; dispatcher discarded={discarded} failed={failed}; "
        f"every group consumed all pre-filled msgIds: {all_consumed}"
    )
    for run in runs:
        del run["_seen"], run["_window"]
    return {
        **figures,
        "tracing_by_task_us_per_msg": tracing_by_task,
        "targets": {"on_vs_off_steady": TARGET_ON_VS_OFF, "trace_cpu_us_per_msg": TARGET_TRACE_US},
        "targets_met": targets_met,
        "per_variant": per,
        "runs": runs,
        "queues": args.queues,
        "consume_concurrency": args.concurrency,
        "pull_batch_size": args.pull_batch_size,
        "consume_message_batch_max_size": args.consume_batch,
        "all_groups_consumed_everything": all_consumed,
        "trace_complete": complete and all_consumed and discarded == 0 and failed == 0,
        "trace": trace,
    }


def main() -> int:
    parser = base_parser(
        "Consumer throughput: tracemq PushConsumer trace off vs trace on", concurrency=20, rounds=2
    )
    parser.add_argument(
        "--pull-batch-size",
        type=int,
        default=500,
        help="PushConsumer pull_batch_size (default 500)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        help="fail when a consumer makes no progress for this long (s)",
    )
    parser.add_argument(
        "--consume-batch",
        type=int,
        default=1,
        help="PushConsumer consume_message_batch_max_size (default 1)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=6000,
        help="PushConsumer session_timeout_ms (default 6000: Tansu holds the first join for "
        "half of it)",
    )
    parser.add_argument(
        "--task-cpu",
        action="store_true",
        help="also measure the steady state's CPU per event-loop callback (task coroutine or "
        "callback name) and report tracing's cost by callback; a diagnostic: it adds ~1 us "
        "per callback to both variants",
    )
    parser.add_argument(
        "--perf",
        action="store_true",
        help="also sample this process with Linux perf (cpu-clock, 499 Hz) and split its CPU "
        "between the variants' steady windows by shared object and symbol: what only the "
        "trace-on windows ran (the compiled trace steps, the compressor) is tracing's own code, "
        "however the host's speed moved meanwhile; needs perf (Debian: linux-perf)",
    )
    parser.add_argument(
        "--slice-s",
        type=float,
        default=0.0,
        help="after the rounds, two more groups consume the topic side by side, alternating "
        "every SLICE_S seconds (only one variant runs at a time): the ratio with the host's "
        "swings falling on both variants alike (0, the default: not run). A cross-check, "
        "not the headline: it reads 0.04 - 0.11 above the same run's rounds, A/A controls "
        "level (docs/performance.md, twenty-first client pass)",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="an A/A control: the 'on' variant runs with trace off too, so its difference from "
        "'off' is the bench's noise and order effect (the trace topic is not checked)",
    )
    parser.add_argument(
        "--keep-heap",
        action="store_true",
        help="no full garbage collection before each variant (how runs before 2026-11-29's "
        "thirteenth pass were made)",
    )
    args = parser.parse_args()
    check_args(args)
    if args.session_timeout_ms < 1000:
        raise SystemExit("--session-timeout-ms must be at least 1000")
    if args.perf and shutil.which("perf") is None:
        raise SystemExit("--perf needs Linux perf on PATH (Debian: apt-get install linux-perf)")
    if args.slice_s < 0:
        raise SystemExit("--slice-s must not be negative")
    if args.pull_batch_size < 1 or args.consume_batch < 1:
        raise SystemExit("--pull-batch-size and --consume-batch must be at least 1")
    return run_bench("consumer", args, bench)


if __name__ == "__main__":
    sys.exit(main())
