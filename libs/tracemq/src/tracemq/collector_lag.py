"""How far the trace collectors are behind the trace topics: the ground truth for "is every
trace written so far in the trace store *and* the trace lake?".

A collector commits a trace partition's Kafka offset only once the events before it are durable
in both its store and its lake (``tracemq_collector.ingest``), so the collectors' consumer
group's committed offsets against the partitions' end offsets say exactly what is still to be
written. Scripts wait on it before reading the lake (``tracemq trace lag --wait``, the demo, the
end-to-end reconciliation tests) instead of sleeping.

The partitions come from the routes in Redis (every broker hosting a trace topic, on its own
data cluster); offsets are read with a plain Kafka consumer that never joins the group.

A committed offset outside the partition's log (past its end: the trace cluster lost its data,
as the in-memory embedded one does on a restart; before its start: retention) is not "lag 0":
the partition's ``state`` says so and its lag counts the whole log, until the collector has
reset it (:mod:`tracemq.offset_reset`). The resets the collectors made are recorded in Redis
(:func:`record_reset`, key ``offset-resets:<group>``) and shown per partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from tracemq import kafka_security
from tracemq.log import get_logger
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.offset_reset import LogProbe, OffsetReset, classify
from tracemq.routing import RegistryReader, connect
from tracemq.routing.keys import DEFAULT_PREFIX, RedisKeys

log = get_logger("collector_lag")

#: the collectors' Kafka consumer group (``TRACEMQ_COLLECTOR_GROUP``'s default)
DEFAULT_GROUP = "tracemq-collector"


@dataclass(frozen=True, slots=True)
class PartitionLag:
    trace_topic: str
    broker: str
    queue_id: int
    end: int
    committed: int
    log_start: int = 0
    #: resets of this partition's offset the collectors made (recorded in Redis)
    resets: int = 0
    last_reset: dict[str, Any] | None = None
    #: False: the probe of the last batch failed (Tansu's reported end is its base + 1), so
    #: ``end`` is only a lower bound and the partition is not known to be caught up
    end_confirmed: bool = True

    @property
    def state(self) -> str:
        """``ok``; ``past_end`` / ``before_start``: the committed offset is outside the log
        (a reset is due: the collector has skipped nothing yet only if it resets);
        ``end_unconfirmed``: the end could not be read (``end`` is a lower bound)."""
        if not self.end_confirmed:
            return "end_unconfirmed"
        if self.committed == 0:
            return "ok"  # nothing committed: the collector starts at the log's beginning
        reason = classify(self.committed, self.log_start, self.end)
        return "ok" if reason is None else reason.value

    @property
    def lag(self) -> int:
        if self.state in ("past_end", "before_start"):  # all of the log is still to be read
            return max(0, self.end - self.log_start)
        return max(0, self.end - max(self.committed, self.log_start))

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_topic": self.trace_topic,
            "broker": self.broker,
            "queue_id": self.queue_id,
            "log_start": self.log_start,
            "end": self.end,
            "committed": self.committed,
            "lag": self.lag,
            "state": self.state,
            "end_confirmed": self.end_confirmed,
            "resets": self.resets,
            "last_reset": self.last_reset,
        }


async def record_reset(redis: Any, prefix: str, group: str, reset: OffsetReset) -> None:
    """Count ``reset`` for ``group`` in Redis, where :func:`collector_lag` reads it."""
    key = RedisKeys(prefix).offset_resets(group)
    field = f"{reset.topic}:{reset.partition}"
    raw = await redis.hget(key, field)
    count = 0
    if raw:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            count = int(json.loads(raw).get("count", 0))
    await redis.hset(key, field, json.dumps({"count": count + 1, "last": reset.to_dict()}))


async def _recorded_resets(redis: Any, prefix: str, group: str) -> dict[str, dict[str, Any]]:
    out = {}
    for field, raw in (await redis.hgetall(RedisKeys(prefix).offset_resets(group))).items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        try:
            value = json.loads(raw)
        except ValueError:
            continue  # not ours: ignored rather than failing the whole report
        if isinstance(value, dict):
            out[name] = value
    return out


class _Offsets:
    """The trace partitions (resolved once from the routes) and one Kafka consumer per data
    cluster, kept open so that polling does not reconnect every time."""

    def __init__(self, group: str, timeout_s: float) -> None:
        self.group, self.timeout_s = group, timeout_s
        self.by_cluster: dict[str, tuple[Any, list[tuple[str, str, Any]]]] = {}
        self.probes: dict[str, LogProbe] = {}
        self.redis: Any = None
        self.prefix = DEFAULT_PREFIX

    async def open(self, redis_url: str, trace_topics: tuple[str, ...], prefix: str) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        self.redis, self.prefix = connect(redis_url), prefix
        reader = RegistryReader(self.redis, prefix)
        routes = [await reader.topic_route(t) for t in trace_topics]
        items: dict[str, list[tuple[str, str, Any]]] = {}
        for route in routes:
            for q in route.queues:
                for qid in range(max(q.read_queues, q.write_queues)):
                    tp = TopicPartition(kafka_topic(q.broker, route.topic), qid)
                    items.setdefault(q.data_bootstrap, []).append((route.topic, q.broker, tp))
        for bootstrap, parts in sorted(items.items()):
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                **kafka_security.client_kwargs(bootstrap),
                group_id=self.group,
                enable_auto_commit=False,
            )
            self.by_cluster[bootstrap] = (consumer, parts)
            await asyncio.wait_for(kafka_security.start(consumer, bootstrap), self.timeout_s)

    async def read(self) -> list[PartitionLag]:
        """End and committed offset of every partition, now (``committed()`` asks Kafka)."""
        out: list[PartitionLag] = []
        recorded = await _recorded_resets(self.redis, self.prefix, self.group)
        for bootstrap, (consumer, parts) in self.by_cluster.items():
            tps = [tp for *_, tp in parts]
            ends = await asyncio.wait_for(consumer.end_offsets(tps), self.timeout_s)
            starts = await asyncio.wait_for(consumer.beginning_offsets(tps), self.timeout_s)
            for topic, broker, tp in parts:
                if starts[tp] > 0:  # Tansu may understate it too (tracemq.offset_reset)
                    probe = self.probes.setdefault(bootstrap, LogProbe(bootstrap))
                    starts[tp] = await probe.exact_start(tp, starts[tp])
                committed = await asyncio.wait_for(consumer.committed(tp), self.timeout_s)
                # Tansu reports its last batch's base offset + 1 as the end: read the batch
                # (twice at most: a probe that failed starts a new consumer)
                probe = self.probes.setdefault(bootstrap, LogProbe(bootstrap))
                end = await probe.exact_end(tp, ends[tp])
                if end is None:
                    end = await probe.exact_end(tp, ends[tp])
                if end is None:
                    log.info("trace partition end unconfirmed", tp=str(tp), reported=ends[tp])
                rec = recorded.get(f"{tp.topic}:{tp.partition}", {})
                out.append(
                    PartitionLag(
                        topic,
                        broker,
                        tp.partition,
                        ends[tp] if end is None else end,
                        committed or 0,
                        log_start=starts[tp],
                        resets=int(rec.get("count", 0) or 0),
                        last_reset=rec.get("last"),
                        end_confirmed=end is not None,
                    )
                )
        return out

    async def close(self) -> None:
        for probe in self.probes.values():
            await probe.close()
        for consumer, _ in self.by_cluster.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), self.timeout_s)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()


async def collector_lag(
    redis_url: str,
    *,
    group: str = DEFAULT_GROUP,
    trace_topics: tuple[str, ...] = (TRACE_TOPIC,),
    redis_prefix: str = DEFAULT_PREFIX,
    timeout_s: float = 10.0,
) -> list[PartitionLag]:
    """Per trace partition: its end offset and the collectors' committed offset (0 if none)."""
    offsets = _Offsets(group, timeout_s)
    try:
        await offsets.open(redis_url, trace_topics, redis_prefix)
        return await offsets.read()
    finally:
        await offsets.close()


async def wait_caught_up(
    redis_url: str,
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.25,
    group: str = DEFAULT_GROUP,
    trace_topics: tuple[str, ...] = (TRACE_TOPIC,),
    redis_prefix: str = DEFAULT_PREFIX,
) -> list[PartitionLag]:
    """Wait until the collectors have stored and written to the lake everything that is in the
    trace topics *now* (the end offsets read at the call); raise ``TimeoutError`` naming what
    is still behind when ``timeout_s`` passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    offsets = _Offsets(group, 10.0)
    try:
        await offsets.open(redis_url, trace_topics, redis_prefix)
        lags = await offsets.read()
        targets = {(p.trace_topic, p.broker, p.queue_id): p.end for p in lags}
        # targets that are only lower bounds (the last batch could not be read): the first
        # end read for sure replaces them, which may count records written since the call
        unsure = {(p.trace_topic, p.broker, p.queue_id) for p in lags if not p.end_confirmed}
        while True:
            for p in lags:
                key = (p.trace_topic, p.broker, p.queue_id)
                if key in unsure and p.end_confirmed:
                    targets[key] = max(targets[key], p.end)
                    unsure.discard(key)
            behind = [
                p
                for p in lags
                if (key := (p.trace_topic, p.broker, p.queue_id)) in unsure
                or p.state in ("past_end", "before_start")
                or p.committed < targets[key]
            ]
            if not behind:
                return lags
            if loop.time() >= deadline:
                detail = ", ".join(
                    f"{p.trace_topic}@{p.broker}[{p.queue_id}] committed {p.committed} "
                    + (
                        f"outside the log [{p.log_start}, {p.end}] ({p.state})"
                        if p.state in ("past_end", "before_start")
                        else f"< {targets[(p.trace_topic, p.broker, p.queue_id)]}"
                        + (
                            " (the log's end could not be read: at least that)"
                            if (p.trace_topic, p.broker, p.queue_id) in unsure
                            else ""
                        )
                    )
                    for p in behind
                )
                raise TimeoutError(f"trace collectors still behind after {timeout_s:g}s: {detail}")
            await asyncio.sleep(poll_s)
            lags = await offsets.read()
    finally:
        await offsets.close()
