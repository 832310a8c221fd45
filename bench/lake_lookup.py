"""msgId look-up through the collector's lake fallback at ten million events.

    .venv/bin/python bench/lake_lookup.py [--events 10000000] [--lake /tmp/tracemq-bench-lake-10m]
                                          [--hours 12] [--lookups 300] [--rounds 3] [--rebuild]

1. The lake: built once and cached in ``--lake`` (reused while its ``bench-meta.json`` says it
   holds at least ``--events`` events in the current file layout). Written exactly as the
   collector writes it: trace messages in RocketMQ's text format (``TraceGen``: Pub + SubBefore
   + SubAfter per message, 25 messages per trace message, ``--hours`` of event time), round
   robin over four trace partitions, decoded by ``events.decode_chunk`` (ingest's decoder) and
   written by ``TraceLake.write_decoded`` (ingest's lake path: segments of 200 000 events,
   ``date=/hour=`` directories, files sorted by msgId in row groups of 8192). msgIds carry
   their event's time (``MessageIdGenerator`` on the generator's clock, UTC). Two variants:
   ``parts`` (the ``part-`` files as ingest writes them) and ``compacted`` (a copy after
   ``TraceLake.compact``: one file per partition and hour, what closed hours become).
2. ``--rounds`` rounds; in each, for each variant in turn (interleaved), a fresh
   ``LakeLookup`` (cold footer cache: what the fallback is after a start) does ``--lookups``
   look-ups of existing msgIds (random, sampled while building) and as many misses (existing
   ids with another counter: same producer and creation time, so inside row groups' msgId
   ranges and a whole window searched), in random order, one at a time. Latency per look-up; files listed, files opened, row groups and
   compressed bytes read per look-up; the first look-up of each reader (cold) separately.

The lake is on the local disk (page-cached after the first round): the figures are the
fallback's CPU and Parquet cost, not an object store's request latency (each file opened is one
request more there; see the files-per-look-up figures). Prints progress, one JSON line last.
Exit 0 if it ran (target met or not), 1 if an answer was wrong, 2 on a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ["TRACEMQ_MSGID_TIMEZONE"] = "UTC"  # the ids and the look-ups agree on the month
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _collector_common import TraceGen, percentiles  # noqa: E402
from _common import emit_json, say  # noqa: E402
from tracemq.message_id import MessageIdGenerator  # noqa: E402

TARGET_P99_MS = 300.0
PARTITIONS = 4
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
META = "bench-meta.json"
#: bump when the collector's file layout changes (the cached lake is rebuilt)
LAYOUT = "msgid-sorted-8k-v1"
SEGMENT_ROWS = 200_000


def _meta_ok(lake_dir: Path, events: int) -> dict[str, Any] | None:
    try:
        meta = json.loads((lake_dir / META).read_text())
    except (OSError, ValueError):
        return None
    if meta.get("layout") != LAYOUT or meta.get("events", 0) < events:
        return None
    return dict(meta)


def build(lake_dir: Path, events: int, hours: float, seed: int) -> dict[str, Any]:
    from tracemq_collector.events import decode_chunk
    from tracemq_collector.lake import TraceLake
    from tracemq_collector.store import TraceStore

    shutil.rmtree(lake_dir, ignore_errors=True)
    lake_dir.mkdir(parents=True)
    started = time.monotonic()
    span_ms = hours * 3_600_000
    messages = events / 3.06  # 3 events a message, 2 % retried once
    start_ms = int(time.time() * 1000 - span_ms - 600_000)
    gen = TraceGen(seed=seed, start_ms=start_ms, step_ms=span_ms / messages)
    # msgIds created at their event's time (the generator's clock), as a producer's are
    gen.gens = [MessageIdGenerator(ip=g.ip, clock=lambda: int(gen.now), tz="UTC") for g in gen.gens]
    store = TraceStore(lake_dir / "bookkeeping.db")  # the lake's segment bookkeeping only
    store.open()
    writer = TraceLake(lake_dir / "parts", store, segment_max_rows=SEGMENT_ROWS)
    offsets = [0] * PARTITIONS
    after: list[int | None] = [None] * PARTITIONS
    written = 0
    sample: list[str] = []
    per_segment = SEGMENT_ROWS // 75  # trace messages of 75 events
    p = segments = 0
    while written < events:
        batch = [gen.message() for _ in range(per_segment)]
        sample.extend(m.msg_ids[0] for m in batch)
        received = [(offsets[p] + i, m.value, "10.0.0.77") for i, m in enumerate(batch)]
        chunk = decode_chunk([(TRACE_TOPIC, p, received)], int(gen.now), with_lake=True)
        part = chunk.partitions[(TRACE_TOPIC, p)]
        groups = {hour: [b] for hour, b in part.lake.items()}
        files = writer.write_decoded(
            TRACE_TOPIC, p, after[p], [(part.first_offset, part.end_offset, groups)]
        )
        assert files is not None, "the lake writer refused a segment"
        after[p] = part.end_offset
        offsets[p] = part.end_offset
        written += part.events
        p = (p + 1) % PARTITIONS
        segments += 1
        if segments % 10 == 0:
            say(f"  {written:,} events written")
    end_ms = int(gen.now)
    parts_s = time.monotonic() - started
    say(f"parts lake: {written:,} events in {parts_s:.0f}s; compacting a copy")
    shutil.copytree(lake_dir / "parts", lake_dir / "compacted")
    compactor = TraceLake(lake_dir / "compacted", store)
    merged = compactor.compact(end_ms + 3 * 3_600_000, None)
    store.close()
    meta = {
        "layout": LAYOUT,
        "events": written,
        "start_ms": start_ms,
        "end_ms": end_ms,
        "hours": hours,
        "build_s": round(time.monotonic() - started, 1),
        "compacted_merges": merged,
        "sample": random.Random(seed).sample(sample, min(len(sample), 20_000)),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for variant in ("parts", "compacted"):
        parquet = list((lake_dir / variant).rglob("*.parquet"))
        meta[f"{variant}_files"] = len(parquet)
        meta[f"{variant}_bytes"] = sum(f.stat().st_size for f in parquet)
    (lake_dir / META).write_text(json.dumps(meta))
    return meta


def run(args: argparse.Namespace, meta: dict[str, Any], lake_dir: Path) -> dict[str, Any]:
    from tracemq_collector.lake_lookup import LakeLookup

    rnd = random.Random(args.seed + 1)

    def miss_of(hit: str) -> str:
        # an existing id with another counter: same producer prefix and creation time, so it
        # falls inside row groups' msgId ranges (the expensive kind of miss), yet is absent
        counter = (int(hit[-4:], 16) + 0x8000) % 0x10000
        return f"{hit[:-4]}{counter:04X}"

    now_ms = int(time.time() * 1000)
    results: dict[str, dict[str, list[float]]] = {}
    wrong = 0
    for rnd_no in range(args.rounds):
        for variant in ("parts", "compacted"):
            reader = LakeLookup(None, lake_dir / variant, window_hours=24, max_search_hours=24)
            ids = [("hit", i) for i in rnd.sample(meta["sample"], args.lookups)]
            ids += [("miss", miss_of(i)) for i in rnd.sample(meta["sample"], args.lookups)]
            rnd.shuffle(ids)
            r = results.setdefault(variant, {})
            for n, (kind, msg_id) in enumerate(ids):
                t0 = time.perf_counter()
                events, stats = reader.by_msg_id(msg_id, now_ms=now_ms)
                ms = (time.perf_counter() - t0) * 1000
                if (kind == "hit") != bool(events) or (events and events[0]["trace_type"] != "Pub"):
                    wrong += 1
                r.setdefault(f"{kind}_ms", []).append(ms)
                r.setdefault("all_ms", []).append(ms)
                if n == 0:
                    r.setdefault("cold_ms", []).append(ms)
                for name in ("files_listed", "files_read", "row_groups", "bytes_read", "hours"):
                    r.setdefault(f"{kind}_{name}", []).append(getattr(stats, name))
            say(
                f"round {rnd_no + 1} {variant:9s}: p50 "
                f"{percentiles(r['all_ms'][-2 * args.lookups :])['p50']:.1f} ms, p99 "
                f"{percentiles(r['all_ms'][-2 * args.lookups :])['p99']:.1f} ms"
            )
    out: dict[str, Any] = {"wrong_answers": wrong}
    for variant, r in results.items():
        v: dict[str, Any] = {
            "all_ms": percentiles(r["all_ms"]),
            "hit_ms": percentiles(r["hit_ms"]),
            "miss_ms": percentiles(r["miss_ms"]),
            "cold_first_ms": percentiles(r["cold_ms"], (50,)),
            "files": meta[f"{variant}_files"],
            "bytes": meta[f"{variant}_bytes"],
        }
        for kind in ("hit", "miss"):
            for name in ("files_listed", "files_read", "row_groups", "bytes_read", "hours"):
                values = r[f"{kind}_{name}"]
                v[f"{kind}_{name}_mean"] = round(sum(values) / len(values), 1)
        out[variant] = v
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--lake", default="/tmp/tracemq-bench-lake-10m")
    p.add_argument("--hours", type=float, default=12.0, help="event time the lake spans (12)")
    p.add_argument("--lookups", type=int, default=300, help="hits (and misses) per round (300)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--seed", type=int, default=17)
    args = p.parse_args()
    lake_dir = Path(args.lake)
    try:
        meta = None if args.rebuild else _meta_ok(lake_dir, args.events)
        reused = meta is not None
        if meta is None:
            say(f"building a lake of {args.events:,} events in {lake_dir} (cached for next runs)")
            meta = build(lake_dir, args.events, args.hours, args.seed)
            say(f"built in {meta['build_s']:.0f}s")
        else:
            say(f"reusing the lake in {lake_dir} (built {meta['built_at']})")
        for variant in ("parts", "compacted"):
            say(
                f"{variant}: {meta[f'{variant}_files']} files, "
                f"{meta[f'{variant}_bytes'] / 1e6:.0f} MB, {meta['events']:,} events"
            )
        result = run(args, meta, lake_dir)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        return 2
    p99 = max(result[v]["all_ms"]["p99"] for v in ("parts", "compacted"))
    for v in ("parts", "compacted"):
        r = result[v]
        say(
            f"{v}: hit p50 {r['hit_ms']['p50']:.1f} / p99 {r['hit_ms']['p99']:.1f} ms, miss p50 "
            f"{r['miss_ms']['p50']:.1f} / p99 {r['miss_ms']['p99']:.1f} ms, cold first "
            f"{r['cold_first_ms']['p50']:.0f} ms; per hit: {r['hit_files_listed_mean']} files "
            f"listed, {r['hit_files_read_mean']} opened, {r['hit_row_groups_mean']} row groups, "
            f"{r['hit_bytes_read_mean'] / 1e3:.0f} kB"
        )
    say(
        f"p99 {p99:.1f} ms (target {TARGET_P99_MS:.0f} ms): {'met' if p99 <= TARGET_P99_MS else 'MISSED'}"
    )
    emit_json(
        {
            "bench": "lake_lookup",
            "events": meta["events"],
            "hours": meta["hours"],
            "reused_lake": reused,
            "build_s": meta["build_s"],
            "lookups_per_round": args.lookups,
            "rounds": args.rounds,
            "target_p99_ms": TARGET_P99_MS,
            "p99_ms": p99,
            "target_met": p99 <= TARGET_P99_MS,
            **result,
        }
    )
    return 1 if result["wrong_answers"] else 0


if __name__ == "__main__":
    sys.exit(main())
