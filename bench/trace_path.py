"""The trace path alone: the client's trace calls and the dispatcher's worker, without Kafka.

    .venv/bin/python bench/trace_path.py [--kind sub|pub|both] [--mode on|off|both]
                                         [--messages 100000] [--repeats 3]

``sub``: per consumed message what ``PushConsumer`` does with trace on (a request id, two clock
reads, ``ConsumeMessageTraceHook.one_before`` / ``one_after``); ``pub``: per send what
``Producer`` does (two clock reads, ``SendMessageTraceHook.one_pub``). Both into a real
``AsyncTraceDispatcher`` whose sender discards the trace messages, 100 messages per event-loop
turn, then a flush. ``off`` runs the same loop without the trace calls. Figures: process CPU
(``time.process_time``) per message over the whole run, flush included, each repeat in a
fresh event loop and dispatcher; every record must come out (``sent`` = records).

``TRACEMQ_NO_EXTENSIONS=1`` runs the worker's pure-Python steps instead of the compiled ones
(``compiled`` in the output says which ran). No stack, no Kafka: a few seconds per repeat.
Prints one JSON line; exit code 1 when a record did not come out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from tracemq._client import now_ms
from tracemq.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from tracemq.message_id import new_request_id
from tracemq.protocol.control import PERM_RW
from tracemq.routing.model import QueueRoute, TopicRoute
from tracemq.trace import _codec
from tracemq.trace._dispatcher import AsyncTraceDispatcher
from tracemq.trace._hooks import ConsumeMessageTraceHook, SendMessageTraceHook

_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
_QUEUE = QueueRoute(broker="broker-a", cluster="c", read_queues=8, write_queues=8, perm=PERM_RW,
                    data_bootstrap="a:9092", address="a:10911")  # fmt: skip


class _Routes:
    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        return TopicRoute(topic=topic, queues=(_QUEUE,))


class _Discard:
    messages = 0

    async def send(self, route: Any, queue_id: int, topic: str, value: bytes, headers: Any) -> None:
        _Discard.messages += 1

    async def close(self) -> None:
        return None


async def _run(kind: str, on: bool, n: int) -> tuple[float, dict[str, float]]:
    d = AsyncTraceDispatcher(group="G", route_cache=_Routes(), sender=_Discard())
    await d.start()
    mq = MessageQueue("Orders", "broker-a", 3)
    if kind == "sub":
        consume = ConsumeMessageTraceHook(d, _TRACE_TOPIC)
        received = [
            MessageExt("Orders", b"x" * 200, f"7F0000010001{i:020X}", mq, i, 1, 2,
                       "127.0.0.1:10911", properties={"KEYS": f"k{i}", "TAGS": "t"})
            for i in range(n)
        ]  # fmt: skip
    else:
        send = SendMessageTraceHook(d, _TRACE_TOPIC)
        sent = [Message("Orders", b"x" * 200, tags="t", keys=f"k{i}") for i in range(n)]
        results = [
            SendResult(SendStatus.SEND_OK, f"7F0000010001{i:020X}", f"0A00000100002A9F{i:016X}",
                       mq, i, "DefaultRegion", True)
            for i in range(n)
        ]  # fmt: skip
    await asyncio.sleep(0)
    t0 = time.process_time()
    for i in range(0, n, 100):
        if on and kind == "sub":
            for m in received[i : i + 100]:
                request_id = new_request_id()
                begin = now_ms()
                seq = consume.one_before(m, "G", "DefaultRegion", request_id, begin)
                end = now_ms()
                consume.one_after(seq, m, "G", "DefaultRegion", request_id, begin, end, True, 0)
        elif on:
            for j in range(i, min(i + 100, n)):
                begin = now_ms()
                r = results[j]
                send.one_pub(sent[j], r.msg_id, "G", _QUEUE, begin, now_ms(), 0, r)
        await asyncio.sleep(0)
    await d.flush(60)
    cpu = time.process_time() - t0
    stats = d.stats()
    await d.shutdown()
    return cpu / n * 1e6, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["sub", "pub", "both"], default="both")
    parser.add_argument("--mode", choices=["on", "off", "both"], default="both")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    kinds = ["sub", "pub"] if args.kind == "both" else [args.kind]
    modes = ["off", "on"] if args.mode == "both" else [args.mode]
    figures: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in kinds}
    complete = True
    for _ in range(args.repeats):  # (kinds and modes alternated, each run in a fresh loop)
        for kind in kinds:
            for mode in modes:
                us, stats = asyncio.run(_run(kind, mode == "on", args.messages))
                figures[kind][mode].append(round(us, 3))
                records = args.messages * (2 if kind == "sub" else 1) if mode == "on" else 0
                complete = complete and stats.get("sent") == records
                complete = complete and not stats.get("failed") and not stats.get("discarded")
    medians = {
        k: {m: statistics.median(v) for m, v in by_mode.items()} for k, by_mode in figures.items()
    }
    result: dict[str, Any] = {
        "bench": "trace_path", "messages": args.messages, "repeats": args.repeats,
        "compiled": bool(getattr(_codec, "COMPILED", False)),
        "cpu_us_per_msg": figures, "median_cpu_us_per_msg": medians, "complete": complete,
    }  # fmt: skip
    if "on" in modes and "off" in modes:
        result["trace_us_per_msg"] = {k: round(m["on"] - m["off"], 3) for k, m in medians.items()}
    print(json.dumps(result))
    if not complete:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
