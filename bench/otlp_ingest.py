"""OTLP ingest: spans/s from ``POST /v1/traces`` into one collector's store.

A fresh embedded stack and one collector; ``--spans`` messaging spans (half RocketMQ-semconv
``send`` spans, half ``process`` spans of one consumer group, one message each, 512 per request,
as the OTel SDK's batch processor sends them) are encoded as OTLP protobuf before the clock
starts, then posted by ``--concurrency`` senders. Measured: from the first request to the moment
every trace event (one Pub per send span, SubBefore + SubAfter per process span) is in the
store, and the request latency. Correct when the store holds exactly the expected events.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _collector_common import StoreProbe, percentiles, run_stack_bench  # noqa: E402
from _common import say  # noqa: E402
from tracemq_collector.store import stored_events  # noqa: E402
from tracemq_devkit.devstack import EmbeddedStack  # noqa: E402

BATCH = 512


def _requests(total: int, uid: str) -> list[bytes]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    def attr(span: Any, key: str, value: str) -> None:
        kv = span.attributes.add()
        kv.key, kv.value.string_value = key, value

    out = []
    now = time.time_ns()
    for first in range(0, total, BATCH):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", f"bench-{uid}"
        ss = rs.scope_spans.add()
        ss.scope.name = "bench"
        for n in range(first, min(total, first + BATCH)):
            msg = n // 2
            s = ss.spans.add()
            s.trace_id = msg.to_bytes(16, "big")
            s.span_id = (n + 1).to_bytes(8, "big")
            s.start_time_unix_nano, s.end_time_unix_nano = now, now + 2_000_000
            send = n % 2 == 0
            s.kind = 4 if send else 5
            s.name = "send BenchOtlp" if send else "process BenchOtlp"
            attr(s, "messaging.system", "rocketmq")
            attr(s, "messaging.operation.type", "send" if send else "process")
            attr(s, "messaging.destination.name", f"BenchOtlp_{uid}")
            attr(s, "messaging.message.id", f"{uid}{msg:024X}")
            attr(s, "messaging.rocketmq.client_group", "PG_bench" if send else "CG_bench")
            attr(s, "messaging.rocketmq.message.keys", f"order-{msg}")
        out.append(bytes(req.SerializeToString()))
    return out


async def bench(stack: EmbeddedStack, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    uid = uuid.uuid4().hex[:8].upper()
    proc = stack.processes.get("collector") or stack.start_collector("collector")
    base = f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"
    token = stack.secrets.collector_api_token
    probe = StoreProbe(Path(proc.env["TRACEMQ_COLLECTOR_DATA_DIR"]) / "traces.db")
    bodies = _requests(args.spans, uid)
    sends = (args.spans + 1) // 2
    expected = sends + 2 * (args.spans - sends)
    say(f"{args.spans:,} spans in {len(bodies)} requests encoded; posting")
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:

        async def sender() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                t = time.perf_counter()
                async with session.post(f"{base}/v1/traces", data=body, headers=headers) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                latencies.append((time.perf_counter() - t) * 1000)

        t0 = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(args.concurrency)))
        posted = time.perf_counter() - t0
        stored = 0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            # a read-only look (it decodes the file's blocks: the bench's store is small)
            stored = sum(
                1 for e in stored_events(probe.path) if (e["msg_id"] or "").startswith(uid)
            )
            if stored >= expected:
                break
            await asyncio.sleep(0.2)
        total = time.perf_counter() - t0
    probe.close()
    say(f"{stored:,}/{expected:,} events stored in {total:.1f}s (posted in {posted:.1f}s)")
    return {
        "spans": args.spans,
        "requests": len(bodies),
        "statuses": statuses,
        "events_expected": expected,
        "events_stored": stored,
        "post_seconds": round(posted, 2),
        "seconds": round(total, 2),
        "spans_per_s_accepted": round(args.spans / posted),
        "spans_per_s_stored": round(args.spans / total),
        "events_per_s_stored": round(stored / total),
        "request_ms": percentiles(latencies),
        "correct": stored == expected and statuses == {200: len(bodies)},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spans", type=int, default=200_000)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    p.add_argument("--timeout", type=float, default=600, help="drain time limit, s")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args()
    if args.spans < 1 or args.concurrency < 1:
        raise SystemExit("--spans and --concurrency must be at least 1")
    return run_stack_bench("otlp_ingest", args, bench)


if __name__ == "__main__":
    raise SystemExit(main())
