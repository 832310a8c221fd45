"""Helpers of the collector benches (collector_ingest.py, query.py, freshness.py).

* :class:`TraceGen` makes trace messages in RocketMQ's text format the way traced clients'
  dispatchers send them: many records per message, realistic field values (msgIds of several
  producer hosts, offsetMsgIds, two random business keys per message, tags, groups, request
  ids), plus the headers a dispatcher sets (``KEYS``, ``UNIQ_KEY``, ``BORN_HOST``).
* :func:`prefill` writes them to a trace topic with raw aiokafka, fast.
* :class:`RssSampler` polls the peak RSS of a process and its children.
* :class:`StoreProbe` reads a collector's progress from its SQLite file (read-only).
* :func:`percentiles` / :func:`start_bench_collector`.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracemq import kafka_security
from tracemq.message_id import MessageIdGenerator, encode_offset_msg_id

C, F = "\x01", "\x02"
REGION = "DefaultRegion"


def percentiles(
    values: list[float], ps: tuple[float, ...] = (50, 90, 99, 99.9)
) -> dict[str, float]:
    """Nearest-rank percentiles (and max/mean) of ``values``, rounded to 3 decimals."""
    if not values:
        return {}
    s = sorted(values)
    out = {}
    for p in ps:
        k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
        out[f"p{p:g}"] = round(s[k], 3)
    out["max"] = round(s[-1], 3)
    out["mean"] = round(sum(s) / len(s), 3)
    return out


@dataclass
class TraceMessage:
    value: bytes
    headers: list[tuple[str, bytes]]
    events: int  # records in it (all of them decode to events)
    msg_ids: list[str] = field(default_factory=list)


class TraceGen:
    """Deterministic (seeded) generator of RocketMQ-format trace messages.

    Each business message gets a Pub record, then per consumer group a SubBefore and a SubAfter;
    ``retry_ratio`` of the consumes fail once first (SubBefore + failed SubAfter, then retry 1).
    ``per_message`` business messages' records are packed in one trace message, in order, so a
    trace message mixes Pub, SubBefore and SubAfter (e.g. 25 messages x 3 = 75 records).
    """

    def __init__(
        self,
        *,
        seed: int = 7,
        topics: int = 20,
        producers: int = 50,
        groups: int = 1,
        per_message: int = 25,
        retry_ratio: float = 0.02,
        start_ms: int | None = None,
        step_ms: float = 1.0,
        key_space: int = 1_000_000_000,
    ) -> None:
        self.rnd = random.Random(seed)
        self.topics = [f"BenchTopic_{i:02d}" for i in range(topics)]
        self.gens = [
            MessageIdGenerator(ip=f"10.{i // 250}.{i % 250}.{1 + (i * 7) % 250}")
            for i in range(producers)
        ]
        self.groups = [f"CG_bench_{g}" for g in range(groups)]
        self.per_message = per_message
        self.retry_ratio = retry_ratio
        self.now = float(start_ms if start_ms is not None else int(time.time() * 1000) - 3_600_000)
        self.step_ms = step_ms
        self.key_space = key_space
        self.store_hosts = ["127.0.0.1:10911", "127.0.0.1:10921"]
        self.queue_offsets = [0] * 64
        self.produced_msg_ids = 0

    def _records_of_one(self, msg_ids: list[str]) -> Iterator[str]:
        r = self.rnd
        ts = int(self.now)
        self.now += self.step_ms
        p = r.randrange(len(self.gens))
        msg_id = self.gens[p].next()
        msg_ids.append(msg_id)
        topic = self.topics[r.randrange(len(self.topics))]
        keys = f"order-{r.randrange(self.key_space)} user-{r.randrange(100_000)}"
        host = self.store_hosts[p % 2]
        qid = r.randrange(8)
        self.queue_offsets[qid] += 1
        off_id = encode_offset_msg_id(host, qid, self.queue_offsets[qid])
        cost = r.randrange(1, 20)
        yield (
            C.join(
                (
                    "Pub",
                    str(ts),
                    REGION,
                    f"PG_bench_{p % 10}",
                    topic,
                    msg_id,
                    "TagA",
                    keys,
                    host,
                    str(r.randrange(100, 2000)),
                    str(cost),
                    "0",
                    off_id,
                    "true",
                )
            )
            + F
        )
        for g in self.groups:
            attempts = [False, True] if r.random() < self.retry_ratio else [True]
            t = ts + r.randrange(1, 30)
            for retry, ok in enumerate(attempts):
                req = uuid.UUID(int=r.getrandbits(128)).hex
                c = r.randrange(1, 50)
                yield (
                    C.join(
                        (
                            "SubBefore",
                            str(t),
                            REGION,
                            g,
                            req,
                            msg_id,
                            str(retry),
                            keys,
                        )
                    )
                    + F
                )
                t += c
                yield (
                    C.join(
                        (
                            "SubAfter",
                            req,
                            msg_id,
                            str(c),
                            "true" if ok else "false",
                            keys,
                            "0" if ok else "2",
                            str(t),
                            g,
                        )
                    )
                    + F
                )
                t += 5

    def message(self) -> TraceMessage:
        msg_ids: list[str] = []
        records: list[str] = []
        for _ in range(self.per_message):
            records.extend(self._records_of_one(msg_ids))
        self.produced_msg_ids += len(msg_ids)
        body = "".join(records)
        headers = [
            ("UNIQ_KEY", self.gens[0].next().encode()),
            ("BORN_HOST", b"10.0.0.77"),
        ]
        return TraceMessage(body.encode(), headers, len(records), msg_ids)


async def prefill(
    bootstrap: str,
    ktopic: str,
    partitions: int,
    min_events: int,
    gen: TraceGen,
    *,
    chunk: int = 400,
    compression: str | None = "zstd",
) -> dict[str, Any]:
    """Send trace messages round robin over ``partitions`` until ``min_events`` events, in
    batches compressed with ``compression`` (aiokafka's ``compression_type``; zstd, as
    tracemq's clients send trace messages).

    Returns ``{"events", "messages", "bytes", "seconds", "per_partition": {p: [events at offset
    0, 1, ...]}}`` (offsets are known from the send acknowledgements).
    """
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_security.client_kwargs(bootstrap),
        max_request_size=16 * 1024 * 1024,
        max_batch_size=1024 * 1024,
        linger_ms=20,
        request_timeout_ms=60_000,
        compression_type=compression,
    )
    await producer.start()
    per_partition: dict[int, dict[int, int]] = {p: {} for p in range(partitions)}
    events = messages = nbytes = 0
    t0 = time.perf_counter()
    try:
        i = 0
        while events < min_events:
            futs = []
            for _ in range(chunk):
                if events >= min_events:
                    break
                m = gen.message()
                part = i % partitions
                i += 1
                futs.append(
                    (
                        m.events,
                        await producer.send(ktopic, m.value, partition=part, headers=m.headers),
                    )
                )
                events += m.events
                messages += 1
                nbytes += len(m.value)
            for n, fut in futs:
                md = await fut
                per_partition[md.partition][md.offset] = n
    finally:
        await producer.stop()
    seconds = time.perf_counter() - t0
    return {
        "events": events,
        "messages": messages,
        "bytes": nbytes,
        "seconds": seconds,
        "per_partition": per_partition,
    }


class RssSampler:
    """Polls ``/proc`` for the RSS of ``pid`` plus its descendants; keeps the peak.

    ``peak_kib`` is the largest sum of VmRSS seen; ``hwm_kib`` the largest sum of VmHWM (the
    kernel's own peak per process, which catches spikes between polls).
    """

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_kib = 0
        self.hwm_kib = 0
        self.anon_peak_kib = 0  # RssAnon: the process's own memory (VmRSS also counts file pages)
        self.cpu_s: dict[int, float] = {}  # last CPU seconds seen per pid of the tree
        self.peak_by_pid: dict[int, int] = {}  # peak VmRSS (KiB) per pid
        self.anon_by_pid: dict[int, int] = {}  # peak RssAnon (KiB) per pid
        self.samples = 0
        self.last_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    @staticmethod
    def _tree(pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            p = todo.pop()
            out.append(p)
            try:
                for tid in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{tid}/children") as f:
                        todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
        return out

    @staticmethod
    def _status(pid: int) -> tuple[int, int, int]:
        rss = hwm = anon = 0
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm = int(line.split()[1])
                    elif line.startswith("RssAnon:"):
                        anon = int(line.split()[1])
        except OSError:
            pass
        return rss, hwm, anon

    def sample(self) -> None:
        rss = hwm = anon = 0
        for p in self._tree(self.pid):
            r, h, a = self._status(p)
            self.peak_by_pid[p] = max(self.peak_by_pid.get(p, 0), r)
            self.anon_by_pid[p] = max(self.anon_by_pid.get(p, 0), a)
            rss += r
            hwm += h
            anon += a
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                self.cpu_s[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
        self.samples += 1
        self.last_kib = rss
        self.peak_kib = max(self.peak_kib, rss)
        self.hwm_kib = max(self.hwm_kib, hwm)
        self.anon_peak_kib = max(self.anon_peak_kib, anon)

    @property
    def tree_cpu_s(self) -> float:
        return sum(self.cpu_s.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


class StoreProbe:
    """Read-only look at a collector's ``traces.db``: progress, lake progress, counts."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None

    def _c(self) -> sqlite3.Connection | None:
        if self._conn is None:
            if not self.path.exists():
                return None
            try:
                self._conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
            except sqlite3.Error:
                return None
        return self._conn

    def offsets(self, table: str) -> dict[tuple[str, int], int]:
        c = self._c()
        if c is None:
            return {}
        try:
            return {
                (t, p): o
                for t, p, o in c.execute(
                    f"SELECT trace_topic, partition, next_offset FROM {table}"  # noqa: S608
                )
            }
        except sqlite3.Error:
            return {}

    def count(self, sql: str) -> int:
        c = self._c()
        assert c is not None
        return int(c.execute(sql).fetchone()[0])

    def first_ingest_ms(self) -> int:
        """``ingest_ts`` of the first stored event (the first block's, decoded)."""
        from tracemq_collector.store import _decode_block

        c = self._c()
        assert c is not None
        tp, data = c.execute("SELECT tp, data FROM blocks ORDER BY id LIMIT 1").fetchone()
        topic, partition = c.execute(
            "SELECT trace_topic, partition FROM partitions WHERE id = ?", (tp,)
        ).fetchone()
        return min(int(e[-3]) for e in _decode_block(data, topic, partition))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def start_bench_collector(stack: Any, name: str, data_dir: Path, **env: str) -> Any:
    """Start ``tracemq collector`` as its own process (own data dir and group)."""
    return stack.start_collector(name, TRACEMQ_COLLECTOR_DATA_DIR=str(data_dir), **env)


async def http_json(session: Any, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        body = await resp.read()
        try:
            import json

            return resp.status, json.loads(body)
        except ValueError:
            return resp.status, body


async def wait_http_ok(session: Any, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, _ = await http_json(session, url)
            if status == 200:
                return
        except Exception:  # noqa: BLE001
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ok within {timeout_s}s")
        await asyncio.sleep(0.2)


def run_stack_bench(
    name: str,
    args: Any,
    body: Any,
    *,
    config: Any = None,
) -> int:
    """``_common.run_on_stack`` for the collector benches: exit 1 if ``result["correct"]`` is
    false (loss, duplicates, wrong answers)."""
    from _common import run_on_stack

    result: dict[str, Any] = {"bench": name, "args": dict(vars(args))}
    return run_on_stack(name, args, body, result, ok_key="correct", bad_code=1, config=config)
