"""Collector ingest throughput: a pre-filled trace topic drained by one collector process.

    .venv/bin/python bench/collector_ingest.py [--events 1000000] [--partitions 4]
                                               [--per-message 25] [--env KEY=VALUE ...]
                                               [--object-store]

1. Starts its own embedded stack and creates a trace topic of ``--partitions`` queues on
   trace-broker.
2. Pre-fills it with at least ``--events`` trace events in RocketMQ's text format, the way
   traced clients' dispatchers send them: each trace message holds the records of
   ``--per-message`` business messages (a Pub, then a SubBefore and a SubAfter per consumer
   group; 2 % of consumes fail once and are retried), i.e. ~75 records per message, with
   realistic field values and two random business keys per message, and the dispatcher's
   headers. Sent with raw aiokafka in batches.
3. Only then starts ONE collector process (``tracemq collector``, its own data dir and group,
   ``TRACEMQ_COLLECTOR_TRACE_TOPICS`` = that topic, default settings unless ``--env``) and polls
   its SQLite file for the store's and the lake's progress per trace partition until both reach
   the end of the topic. Events are counted exactly from the offsets (the bench knows how many
   events each offset holds). The RSS of the collector process (and any children) is polled
   every 100 ms; VmHWM catches spikes between polls.
4. Checks that the store holds exactly the expected events (count, no quarantine) and that the
   lake holds each of them exactly once.

``--object-store``: the lake in a bucket of the stack's SeaweedFS (``StackConfig.object_store``,
what ``tracemq dev up --object-store`` runs), written through pyarrow's S3 client.

Rates: ``sustained`` counts from the first stored event to the moment store AND lake reached
the end (the lake's flush interval, 5 s by default, adds its tail); ``store_only`` stops at the
store's end; ``steady`` is the store rate between 10 % and 90 % of the events.

Prints progress, one JSON line last. Exit 0 if it ran (targets met or not), 1 if events were
lost or duplicated, 2 on a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _collector_common import (  # noqa: E402
    RssSampler,
    StoreProbe,
    TraceGen,
    prefill,
    run_stack_bench,
    start_bench_collector,
)
from _common import say, wait_trace_topic_route  # noqa: E402
from tracemq.naming import kafka_topic  # noqa: E402
from tracemq_devkit.devstack import EmbeddedStack  # noqa: E402

#: issue 19's goals (issue 12's first ones were 50 000 events/s and 512 MiB)
TARGET_EVENTS_PER_S = 100_000
TARGET_RSS_MIB = 384


class Expected:
    """Events per trace partition and offset, for exact counts from progress offsets."""

    def __init__(self, topic: str, per_partition: dict[int, dict[int, int]]) -> None:
        self.topic = topic
        self.offsets: dict[int, list[int]] = {}
        self.cum: dict[int, list[int]] = {}
        for p, by_offset in per_partition.items():
            offs = sorted(by_offset)
            self.offsets[p] = offs
            acc, cum = 0, []
            for o in offs:
                acc += by_offset[o]
                cum.append(acc)
            self.cum[p] = cum
        self.end = {p: (offs[-1] + 1 if offs else 0) for p, offs in self.offsets.items()}
        self.total = sum(c[-1] for c in self.cum.values() if c)

    def events_below(self, progress: dict[tuple[str, int], int]) -> int:
        n = 0
        for p, offs in self.offsets.items():
            nxt = progress.get((self.topic, p))
            if nxt is None or not offs:
                continue
            i = bisect.bisect_left(offs, nxt)  # offsets < nxt
            n += self.cum[p][i - 1] if i else 0
        return n

    def done(self, progress: dict[tuple[str, int], int]) -> bool:
        return all(progress.get((self.topic, p), -1) >= e for p, e in self.end.items() if e)


def _start_profilers(out_dir: str, pid: int) -> list[Any]:
    """py-spy record (flame graphs) of the collector and, a moment later, of its children."""
    import subprocess

    spy = os.environ.get("PY_SPY", "py-spy")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 30
    pids = RssSampler._tree(pid)
    while len(pids) < 3 and time.monotonic() < deadline:  # the worker starts with a fetch
        time.sleep(0.2)
        pids = RssSampler._tree(pid)
    procs = [
        subprocess.Popen(
            [spy, "record", "--pid", str(p), "--rate", "200", "--nonblocking", "--idle",
             "--format", "raw", "-o", f"{out_dir}/{p}.txt"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for p in pids
    ]  # fmt: skip
    say(f"profiling pids {pids} into {out_dir}")
    return procs


def _lake_check(lake_dir: Path, expected_total: int, s3: dict[str, str]) -> dict[str, Any]:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    from tracemq_collector.lake import lake_filesystem

    filesystem = None
    if s3:  # the stack's bucket (StackConfig.object_store)
        filesystem, root = lake_filesystem(
            s3["TRACEMQ_COLLECTOR_LAKE_URI"],
            s3_endpoint=s3["TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT"],
            s3_region=s3["TRACEMQ_COLLECTOR_LAKE_S3_REGION"],
            s3_access_key=s3["TRACEMQ_COLLECTOR_LAKE_S3_ACCESS_KEY"],
            s3_secret_key=s3["TRACEMQ_COLLECTOR_LAKE_S3_SECRET_KEY"],
        )
        assert filesystem is not None
        infos = filesystem.get_file_info(pafs.FileSelector(root.as_posix(), recursive=True))
        live = [i for i in infos if i.path.endswith(".parquet") and "/." not in i.path]
        files, nbytes = [i.path for i in live], sum(i.size or 0 for i in live)
    elif not lake_dir.exists():
        return {"rows": 0, "unique": 0, "files": 0, "bytes": 0}
    else:
        files = [str(p) for p in lake_dir.glob("date=*/hour=*/*.parquet")]
        nbytes = sum(Path(f).stat().st_size for f in files)
    t = ds.dataset(files, format="parquet", filesystem=filesystem).to_table(
        columns=["trace_partition", "trace_offset", "trace_index"]
    )
    key = pc.add(
        pc.multiply(
            pc.add(pc.multiply(t["trace_partition"].cast("int64"), 1 << 40), t["trace_offset"]),
            1 << 10,
        ),
        t["trace_index"].cast("int64"),
    )
    return {"rows": t.num_rows, "unique": len(pc.unique(key)), "files": len(files), "bytes": nbytes}


async def _collector_counts(stack: EmbeddedStack, proc: Any) -> dict[str, Any]:
    """From the collector's ``/metrics``: how often ingest waited for a lake flush (the buffer
    at its event cap) and how often a lake flush read a partition's stored range back instead
    of writing the buffer, by reason; how many lake rows the take-over backfill read (none
    expected: the lake holds nothing before the bench); None where it could not be read."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, Any] = {
        "lake_backpressure_waits": None,
        "lake_store_reads": None,
        "backfill_rows_read": None,
    }
    url = f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}/metrics"
    headers = {"Authorization": f"Bearer {stack.secrets.collector_api_token}"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.get(url, headers=headers) as resp:
                text = await resp.text()
        reads: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name == "tracemq_collector_lake_backpressure_waits_total":
                    found["lake_backpressure_waits"] = sample.value
                elif sample.name == "tracemq_collector_lake_store_reads_total":
                    reads[sample.labels["reason"]] = sample.value
                elif sample.name == "tracemq_collector_backfill_rows_read_total":
                    found["backfill_rows_read"] = sample.value
        found["lake_store_reads"] = reads
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        say(f"could not read the collector's metrics: {exc!r}")
    return found


async def bench(stack: EmbeddedStack, args: argparse.Namespace) -> dict[str, Any]:
    from tracemq.admin import AdminClient

    uid = uuid.uuid4().hex[:8]
    trace_topic = f"BenchTrace_{uid}"
    await wait_trace_topic_route(stack)  # trace-broker has registered
    async with AdminClient(stack.business_bootstrap, stack.redis_url, timeout_s=30) as admin:
        await admin.create_topic(
            "trace-broker", trace_topic, read_queues=args.partitions, write_queues=args.partitions
        )
    ktopic = kafka_topic("trace-broker", trace_topic)
    say(f"trace topic {trace_topic} ({args.partitions} queues on trace-broker) created")

    gen = TraceGen(per_message=args.per_message, groups=args.groups, seed=args.seed)
    say(
        f"pre-filling {args.events:,} events ({args.per_message} business messages per trace message)"
    )
    filled = await prefill(
        stack.trace_bootstrap,
        ktopic,
        args.partitions,
        args.events,
        gen,
        compression=None if args.compression == "none" else args.compression,
    )
    exp = Expected(ktopic, filled["per_partition"])
    assert exp.total == filled["events"]
    say(
        f"pre-filled {filled['events']:,} events in {filled['messages']:,} trace messages "
        f"({filled['bytes'] / 1e6:.0f} MB, {filled['bytes'] / filled['events']:.0f} B/event) in "
        f"{filled['seconds']:.1f}s ({filled['events'] / filled['seconds']:,.0f} events/s)"
    )

    data = stack.workdir / "data" / f"collector-ingest-{uid}"
    env = {
        "TRACEMQ_COLLECTOR_TRACE_TOPICS": trace_topic,
        "TRACEMQ_COLLECTOR_GROUP": f"bench-ingest-{uid}",
        "TRACEMQ_LOG_LEVEL": "WARNING",
        **dict(kv.split("=", 1) for kv in args.env),
    }
    probe = StoreProbe(data / "traces.db")
    t_spawn = time.perf_counter()
    proc = start_bench_collector(stack, f"collector-ingest-{uid}", data, **env)
    t_healthy = time.perf_counter()
    assert proc.pid is not None
    rss = RssSampler(proc.pid).start()
    say(f"collector pid {proc.pid} healthy after {t_healthy - t_spawn:.1f}s; draining")
    spies = _start_profilers(args.profile, proc.pid) if args.profile else []

    timeline: list[tuple[float, int, int]] = []
    t_first = t_store_done = t_lake_done = None
    last_say = time.perf_counter()
    deadline = time.perf_counter() + args.timeout
    try:
        while True:
            now = time.perf_counter()
            sp = probe.offsets("progress")
            lp = probe.offsets("lake_progress")
            se, le = exp.events_below(sp), exp.events_below(lp)
            timeline.append((now, se, le))
            if se and t_first is None:
                t_first = now
            if t_store_done is None and exp.done(sp):
                t_store_done = now
            if t_lake_done is None and exp.done(lp):
                t_lake_done = now
            if t_store_done is not None and t_lake_done is not None:
                break
            if not proc.alive():
                raise RuntimeError(f"the collector died:\n{proc.log_tail()}")
            if now > deadline:
                raise TimeoutError(
                    f"not drained within {args.timeout}s: store {se}/{exp.total}, lake {le}"
                )
            if now - last_say >= 5:
                last_say = now
                since = now - (t_first or now)
                say(
                    f"    store {se:>9,}/{exp.total:,}  lake {le:>9,}  "
                    f"({se / since if since > 0 else 0:,.0f} events/s since first)  "
                    f"RSS {rss.last_kib / 1024:.0f} MiB (peak {rss.peak_kib / 1024:.0f})"
                )
            await asyncio.sleep(0.1)
    finally:
        rss.stop()
        for spy in spies:
            spy.send_signal(__import__("signal").SIGINT)
        for spy in spies:
            spy.wait(30)
    assert t_first is not None and t_store_done is not None and t_lake_done is not None
    # The first poll that sees events comes after the first batch was committed; the batch
    # started when its ingest_ts was taken (wall clock ms), so start the clock there.
    first_ingest_ms = probe.first_ingest_ms()
    t_first = min(t_first, first_ingest_ms / 1000 + (time.perf_counter() - time.time()))
    t_done = max(t_store_done, t_lake_done)

    def t_at(frac: float) -> float:
        goal = frac * exp.total
        return next(t for t, s, _ in timeline if s >= goal)

    t10, t90 = t_at(0.1), t_at(0.9)
    rates: dict[str, int | None] = {
        "sustained": round(exp.total / (t_done - t_first)),
        "store_only": round(exp.total / (t_store_done - t_first)),
        "steady_10_90": round(0.8 * exp.total / (t90 - t10)) if t90 > t10 else None,
        "from_spawn": round(exp.total / (t_done - t_spawn)),
    }
    sustained = round(exp.total / (t_done - t_first))
    cpu_s = round(rss.tree_cpu_s, 2)  # the collector and its worker process(es)

    counts = await _collector_counts(stack, proc)
    say(
        f"ingest waited {counts['lake_backpressure_waits']} times for a lake flush (the buffer "
        f"at its event cap); lake flushes that read the store back: {counts['lake_store_reads']}; "
        f"lake rows read by the backfill: {counts['backfill_rows_read']}"
    )
    say("checking the store and the lake")
    stored = probe.count("SELECT value FROM meta WHERE key = 'event_count'")
    quarantined = probe.count("SELECT count(*) FROM quarantine")
    probe.close()
    proc.stop()
    lake = _lake_check(data / "lake", exp.total, stack.lake_env)
    db_bytes = sum(p.stat().st_size for p in data.glob("traces.db*") if p.is_file())
    # The file alone once its WAL is copied back: what the events take at rest.
    import sqlite3

    with contextlib.closing(sqlite3.connect(data / "traces.db")) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store_bytes = (data / "traces.db").stat().st_size
    lake_bytes = (
        sum(p.stat().st_size for p in (data / "lake").rglob("*.parquet"))
        if (data / "lake").exists()
        else None
    )
    correct = (
        stored == exp.total
        and quarantined == 0
        and lake["rows"] == exp.total
        and lake["unique"] == exp.total
    )
    peak_mib = round(max(rss.peak_kib, rss.hwm_kib) / 1024, 1)
    targets_met = {
        "events_per_s_ge_target": sustained >= TARGET_EVENTS_PER_S,
        "rss_lt_target": peak_mib < TARGET_RSS_MIB,
    }
    say(
        f"drained {exp.total:,} events: sustained {rates['sustained']:,} events/s "
        f"(store only {rates['store_only']:,}, steady {rates['steady_10_90']:,}, "
        f"from process spawn {rates['from_spawn']:,}); first event "
        f"{t_first - t_spawn:.1f}s after spawn, store done after {t_store_done - t_first:.1f}s, "
        f"lake after {t_lake_done - t_first:.1f}s"
    )
    say(
        f"collector CPU {cpu_s:.1f}s ({len(rss.cpu_s)} processes); peak RSS "
        f"{rss.peak_kib / 1024:.0f} MiB polled, VmHWM {rss.hwm_kib / 1024:.0f} MiB, RssAnon "
        f"{rss.anon_peak_kib / 1024:.0f} MiB; store file {db_bytes / 1e6:.0f} MB"
    )
    say(
        f"at rest: store {store_bytes / exp.total:.1f} B/event, lake "
        f"{(lake_bytes or 0) / exp.total:.1f} B/event"
    )
    say(
        f"store events {stored:,} (expected {exp.total:,}), quarantined {quarantined}; lake rows "
        f"{lake['rows']:,}, unique {lake['unique']:,} in {lake['files']} files -> "
        f"{'CORRECT' if correct else 'WRONG'}"
    )
    say(
        f"targets: >= {TARGET_EVENTS_PER_S:,} events/s "
        f"{'met' if targets_met['events_per_s_ge_target'] else 'MISSED'}; RSS < {TARGET_RSS_MIB} MiB "
        f"{'met' if targets_met['rss_lt_target'] else 'MISSED'}"
    )
    return {
        "events": exp.total,
        "trace_messages": filled["messages"],
        "partitions": args.partitions,
        "records_per_message": round(exp.total / filled["messages"], 1),
        "prefill_s": round(filled["seconds"], 1),
        "compression": args.compression,
        "events_per_s": rates,
        "first_event_after_spawn_s": round(t_first - t_spawn, 2),
        "store_done_s": round(t_store_done - t_first, 2),
        "lake_done_s": round(t_lake_done - t_first, 2),
        "collector_cpu_s": cpu_s,
        "cpu_us_per_event": round(cpu_s / exp.total * 1e6, 1) if cpu_s else None,
        "peak_rss_mib": peak_mib,
        "rss_polled_peak_mib": round(rss.peak_kib / 1024, 1),
        "rss_vmhwm_mib": round(rss.hwm_kib / 1024, 1),
        "rss_anon_peak_mib": round(rss.anon_peak_kib / 1024, 1),
        "collector_processes": len(rss.cpu_s),
        # ingest's waits for a lake flush before fetching more (the buffer at its event cap),
        # and lake flushes that read the store back instead of the buffer, by reason
        **counts,
        "per_process": {
            str(pid): {
                "cpu_s": round(rss.cpu_s.get(pid, 0.0), 2),
                "peak_rss_mib": round(rss.peak_by_pid.get(pid, 0) / 1024, 1),
                "peak_anon_mib": round(rss.anon_by_pid.get(pid, 0) / 1024, 1),
            }
            for pid in rss.cpu_s
        },
        "store_file_mb": round(db_bytes / 1e6, 1),
        # sizes per event, for docs/capacity.md (bench/capacity.py): the trace topic's bytes as
        # the dispatchers send them, the store's file(s) after a WAL checkpoint, the lake's files
        "trace_bytes_per_event": round(filled["bytes"] / exp.total, 1),
        "store_bytes_per_event": round(store_bytes / exp.total, 1),
        "lake_bytes_per_event": round(lake_bytes / exp.total, 1) if lake_bytes else None,
        "stored_events": stored,
        "quarantined": quarantined,
        "lake": lake,
        "collector_env": {k: v for k, v in env.items() if k not in ("TRACEMQ_LOG_LEVEL",)},
        "targets": {"events_per_s": TARGET_EVENTS_PER_S, "rss_mib": TARGET_RSS_MIB},
        "targets_met": targets_met,
        "correct": correct,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="at least this many events")
    p.add_argument("--partitions", type=int, default=4, help="trace topic queues (default 4)")
    p.add_argument(
        "--per-message", type=int, default=25, help="business messages per trace message (25)"
    )
    p.add_argument("--groups", type=int, default=1, help="consumer groups per message (1)")
    p.add_argument(
        "--compression",
        choices=["zstd", "lz4", "gzip", "none"],
        default="zstd",
        help="codec of the pre-filled trace batches (default zstd, as tracemq clients send)",
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=900, help="drain time limit, s")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the collector, e.g. TRACEMQ_COLLECTOR_BATCH_MAX_RECORDS=200",
    )
    p.add_argument(
        "--object-store", action="store_true", help="the lake in the stack's SeaweedFS bucket"
    )
    p.add_argument("--log-level", default="WARNING")
    p.add_argument(
        "--profile", metavar="DIR", help="py-spy record the collector (and children) into DIR"
    )
    args = p.parse_args()
    if args.events < 1 or args.partitions < 1 or args.per_message < 1:
        raise SystemExit("--events, --partitions and --per-message must be at least 1")
    if args.profile and shutil.which(os.environ.get("PY_SPY", "py-spy")) is None:
        # (checked before the stack starts: not a dev dependency, a tool of one's own)
        raise SystemExit(
            "--profile needs py-spy on PATH (`uv tool install py-spy`) or PY_SPY=<its path>"
        )
    config = None
    if args.object_store:
        from tracemq_devkit.devstack import StackConfig

        config = StackConfig(object_store=True)
    return run_stack_bench("collector_ingest", args, bench, config=config)


if __name__ == "__main__":
    sys.exit(main())
