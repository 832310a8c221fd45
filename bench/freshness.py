"""Trace freshness: from the consumer's listener returning (SubAfter) to the message's complete
trace (Pub + SubBefore + SubAfter of the group) being answered by the collector's API.

    .venv/bin/python bench/freshness.py [--rate 300] [--duration 60] [--sample-every 10]
                                        [--poll-ms 50] [--queues 4]

The embedded stack with a collector (default settings, the default trace topic), a topic of
``--queues`` queues on broker-a, a tracemq Producer with trace on sending ``--rate`` messages/s
for ``--duration`` s, and a traced PushConsumer group (default trace options) consuming them.
For every ``--sample-every``-th message the listener notes the wall-clock time just before it
returns; a poller then asks ``GET /api/v1/traces/{msgId}`` every ``--poll-ms`` ms until the view
has the producer node and a successful attempt of the group (SubBefore paired with SubAfter).
Freshness = the time of the first complete answer - the listener's return; its resolution is
the poll interval. p50/p90/p99/max are reported.

Prints progress, one JSON line last. Exit 0 if it ran (target met or not), 1 if a sampled trace
never became complete (within 30 s), 2 on a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _collector_common import RssSampler, percentiles, run_stack_bench  # noqa: E402
from _common import (  # noqa: E402
    body_of,
    client_env,
    create_topic,
    dispatcher_stats,
    say,
    wait_trace_topic_route,
)
from tracemq import (  # noqa: E402
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq_devkit.devstack import EmbeddedStack, StackConfig  # noqa: E402

TARGET_P99_S = 2.0
GIVE_UP_S = 30.0


def _complete(view: dict[str, Any], group: str) -> bool:
    if not view.get("producer"):
        return False
    for c in view.get("consumers") or []:
        if c.get("group") == group and any(
            a.get("status") == "success" for a in c.get("attempts") or []
        ):
            return True
    return False


async def bench(stack: EmbeddedStack, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    uid = uuid.uuid4().hex[:8]
    topic = f"BenchFresh_{uid}"
    group = f"CG_fresh_{uid}"
    await create_topic(stack, topic, args.queues)
    await wait_trace_topic_route(stack)
    proc = stack.processes["collector"]
    base = f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"
    assert proc.pid is not None
    rss = RssSampler(proc.pid).start()
    env = client_env(stack)

    samples: dict[str, float] = {}
    fresh_ms: list[float] = []
    polls = 0
    incomplete: list[str] = []
    consumed = 0
    tasks: set[asyncio.Task[None]] = set()
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10),
        headers={"Authorization": f"Bearer {stack.secrets.collector_api_token}"},
    )
    poll_slots = asyncio.Semaphore(args.max_pollers)

    async def poll(msg_id: str, returned_at: float) -> None:
        nonlocal polls
        async with poll_slots:
            while True:
                polls += 1
                try:
                    async with session.get(f"{base}/api/v1/traces/{msg_id}") as resp:
                        view = await resp.json(content_type=None) if resp.status == 200 else {}
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    view = {}
                now = time.time()
                if view and _complete(view, group):
                    fresh_ms.append((now - returned_at) * 1000)
                    return
                if now - returned_at > GIVE_UP_S:
                    incomplete.append(msg_id)
                    return
                await asyncio.sleep(args.poll_ms / 1000)

    async def listener(msgs: list[MessageExt], _ctx: Any) -> ConsumeConcurrentlyStatus:
        nonlocal consumed
        for m in msgs:
            consumed += 1
            if consumed % args.sample_every == 0:
                samples[m.msg_id] = 0.0
        returned_at = time.time()
        for m in msgs:
            if m.msg_id in samples and samples[m.msg_id] == 0.0:
                samples[m.msg_id] = returned_at
                # the poll starts once this listener has returned (SubAfter is appended then)
                asyncio.get_running_loop().call_soon(_start_poll, m.msg_id, returned_at)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def _start_poll(msg_id: str, returned_at: float) -> None:
        task = asyncio.create_task(poll(msg_id, returned_at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    consumer = PushConsumer(
        group, consume_from=ConsumeFromWhere.FIRST_OFFSET, enable_msg_trace=True, **env
    )
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    producer = Producer(f"PG_fresh_{uid}", enable_msg_trace=True, **env)
    body = body_of(args.size)
    sent = 0
    try:
        await consumer.start()
        await producer.start()
        await asyncio.sleep(3)  # the consumer's group join (it reads the new topic from its start)
        say(
            f"sending {args.rate} msg/s for {args.duration}s to {topic}; polling every "
            f"{args.sample_every}th message's trace every {args.poll_ms} ms"
        )
        t0 = time.perf_counter()
        tick = 0.02
        per_tick = args.rate * tick
        due = 0.0
        last_say = t0
        while time.perf_counter() - t0 < args.duration:
            due += per_tick
            n = int(due)
            due -= n
            if n:
                await asyncio.gather(
                    *(producer.send(Message(topic, body, keys=[f"fresh-{uid}-{sent + i}"]))
                      for i in range(n))
                )  # fmt: skip
                sent += n
            now = time.perf_counter()
            if now - last_say >= 10:
                last_say = now
                done = sorted(fresh_ms)
                p99 = done[int(len(done) * 0.99)] if done else 0
                say(
                    f"    sent {sent}, consumed {consumed}, traces complete {len(fresh_ms)}"
                    f" (p99 so far {p99:.0f} ms), collector RSS {rss.last_kib / 1024:.0f} MiB"
                )
            next_at = t0 + (now - t0) // tick * tick + tick
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        send_s = time.perf_counter() - t0
        deadline = time.monotonic() + 60
        while consumed < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        while tasks and time.monotonic() < deadline + GIVE_UP_S:
            await asyncio.sleep(0.1)
    finally:
        rss.stop()
        for t in list(tasks):
            t.cancel()
        await session.close()
        await consumer.shutdown()
        await producer.shutdown()
    stats = dispatcher_stats([producer, consumer])
    f = percentiles(fresh_ms)
    met = bool(f) and f["p99"] <= TARGET_P99_S * 1000 and not incomplete
    say(
        f"sent {sent} in {send_s:.1f}s ({sent / send_s:.0f} msg/s), consumed {consumed}; "
        f"sampled {len(samples)}, complete {len(fresh_ms)}, never complete {len(incomplete)}"
    )
    if f:
        say(
            f"freshness (listener return -> complete trace via API): p50 {f['p50']:.0f} ms, "
            f"p90 {f['p90']:.0f} ms, p99 {f['p99']:.0f} ms, max {f['max']:.0f} ms "
            f"({polls} polls); target p99 <= {TARGET_P99_S:.0f} s: {'met' if met else 'MISSED'}"
        )
    return {
        "rate_msgs_per_s": args.rate,
        "achieved_msgs_per_s": round(sent / send_s, 1),
        "sent": sent,
        "consumed": consumed,
        "sampled": len(samples),
        "complete": len(fresh_ms),
        "never_complete": len(incomplete),
        "freshness_ms": f,
        "poll_ms": args.poll_ms,
        "polls": polls,
        "dispatchers": stats,
        "collector_peak_rss_mib": round(max(rss.peak_kib, rss.hwm_kib) / 1024, 1),
        "collector_cpu_s": round(rss.tree_cpu_s, 1),
        "target_p99_s": TARGET_P99_S,
        "targets_met": {"p99_le_2s": met},
        "correct": not incomplete and len(fresh_ms) == len(samples) and consumed >= sent,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=300, help="messages/s sent (300)")
    p.add_argument("--duration", type=float, default=60, help="seconds of sending (60)")
    p.add_argument("--sample-every", type=int, default=10, help="trace every n-th message (10)")
    p.add_argument("--poll-ms", type=int, default=50, help="API poll interval (50 ms)")
    p.add_argument("--max-pollers", type=int, default=200, help="polls in flight at most")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args()
    return run_stack_bench("freshness", args, bench, config=StackConfig(with_collector=True))


if __name__ == "__main__":
    sys.exit(main())
