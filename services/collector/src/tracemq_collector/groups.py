"""Consumer-group health (issue 15, point 13): per consumer group and topic, the lag in
messages and in time, the consume, failure, retry and dead-letter rates, the last consume, and
a trend over the last hour.

Where each figure comes from
----------------------------
* **Groups and their topics**: the subscription history in Redis (``P subhistory``), so a
  group whose consumers all stopped is still listed (its lag is what matters then), plus the
  group's retry topic ``%RETRY%<group>`` when it has a route (messages waiting to be retried
  are the group's backlog too). Live clients: ``P group:<group>:clients``.
* **Lag in messages**: per queue, the queue's end offset against the group's committed offset
  (the group's Kafka group id is its name; a broadcasting group commits per client, so it has
  no group lag and says so). Read with a Kafka consumer that never joins the group, the way
  ``tracemq trace lag`` reads the collectors' own offsets.
* **Lag in time**: the age of the oldest unconsumed message = now minus the timestamp of the
  record at the committed offset of each lagging queue (the oldest of them). It is read from
  the queue itself, one record per lagging queue, not looked up in the trace store: the store
  has no index by queue offset (the offsetMsgId is inside the record text), so finding that
  message there is a scan of the topic's Pubs as long as the lag, and a message whose Pub trace
  was lost (or whose producer does not trace) would have no age at all. Its msgId (header
  ``UNIQ_KEY``) is given so the page can link to its trace.
* **Rates, last consume, per-minute trend**: derived from the trace store's event times (all
  live collectors, fan-out): SubAfter success = consumed, SubAfter failure = failed, SubBefore
  with a reconsume count = a retry delivery, a Pub to ``%DLQ%<group>`` = dead-lettered. Rates
  are per minute over the last :data:`RATE_WINDOW_MS`; the trend has one bucket per minute of
  the last hour. A consume event's topic is the one its message's Pub trace names; when that
  Pub is stored by no collector asked, a group subscribed to one topic gets it, otherwise it is
  counted under the topic ``?``. Reading is capped (``TRACEMQ_COLLECTOR_GROUP_MAX_EVENTS``
  events per collector); the answer says when the cap cut the hour (``activity_truncated``).
* **Lag trend**: lag cannot be derived from events (the offsets of an hour ago are gone), so
  the collector *samples* it: every ``TRACEMQ_COLLECTOR_GROUP_SAMPLE_INTERVAL_S`` seconds for
  every known group (at most :data:`MAX_GROUPS`), and every time a status is computed on
  request. Samples live in a bounded ring per group (one hour of them, in memory: a restarted
  collector starts a new trend) and go into the trend's minute buckets (the last sample of the
  minute).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError
from tracemq.consumer.tags import matches, parse
from tracemq.log import get_logger
from tracemq.message import InvalidMessageError
from tracemq.naming import DLQ_GROUP_PREFIX, RETRY_GROUP_PREFIX, kafka_topic
from tracemq.offset_reset import LogProbe
from tracemq.routing import RegistryReader

from tracemq_collector import metrics
from tracemq_collector.errors import UnknownGroup
from tracemq_collector.queries import PeerFailure, Queries, _failed, _first_error

log = get_logger("collector.groups")

HOUR_MS = 3_600_000
MINUTE_MS = 60_000
#: Rates are per minute over this window (shorter than the hour: a rate says "now").
RATE_WINDOW_MS = 5 * MINUTE_MS
#: Groups a status of "all groups" (and the sampler) covers, newest subscriptions first.
MAX_GROUPS = 200
#: Groups whose offsets are read at once (each read opens Kafka consumers).
OFFSET_CONCURRENCY = 4
KAFKA_TIMEOUT_S = 10.0
UNKNOWN_TOPIC = "?"
_COUNTS = ("consumed", "failed", "retried", "dead_lettered")


# -- the activity each collector reports (local part of the fan-out) -------------------------
def summarize_activity(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per (group, topic, minute) counts and per (group, topic) the last consume, from the
    rows :meth:`TraceStore.consume_activity` gives. JSON-able; summed across collectors by
    :func:`merge_activity`."""
    buckets: dict[tuple[str, str, int], dict[str, int]] = {}
    last: dict[tuple[str, str], int] = {}
    for e in events:
        kind, topic = e["trace_type"], e.get("topic") or ""
        if kind == "Pub":
            if not topic.startswith(DLQ_GROUP_PREFIX) or not e.get("success"):
                continue
            group, what = topic[len(DLQ_GROUP_PREFIX) :], "dead_lettered"
        else:
            group = e.get("group_name") or ""
            if kind == "SubAfter":
                what = "consumed" if e.get("success") else "failed"
            elif (e.get("retry_times") or 0) > 0:
                what = "retried"
            else:
                continue
        if not group:
            continue
        msg_topic = e.get("msg_topic") or UNKNOWN_TOPIC
        minute = e["timestamp"] // MINUTE_MS * MINUTE_MS
        counts = buckets.setdefault((group, msg_topic, minute), dict.fromkeys(_COUNTS, 0))
        counts[what] += 1
        if kind == "SubAfter":
            key = (group, msg_topic)
            last[key] = max(last.get(key, 0), e["timestamp"])
    return {
        "buckets": [
            {"group": g, "topic": t, "minute": m, **c} for (g, t, m), c in sorted(buckets.items())
        ],
        "last_consume": [
            {"group": g, "topic": t, "timestamp": ts} for (g, t), ts in sorted(last.items())
        ],
    }


class _Bucket(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    group: str = Field(max_length=512)
    topic: str = Field(max_length=512)
    minute: int = Field(ge=0, le=2**53)
    consumed: int = Field(ge=0, le=2**53)
    failed: int = Field(ge=0, le=2**53)
    retried: int = Field(ge=0, le=2**53)
    dead_lettered: int = Field(ge=0, le=2**53)


class _Last(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    group: str = Field(max_length=512)
    topic: str = Field(max_length=512)
    timestamp: int = Field(ge=0, le=2**53)


class PeerActivity(BaseModel):
    """A peer's ``/api/v1/groups-activity`` answer, checked before it is summed."""

    model_config = ConfigDict(strict=True, extra="ignore")
    buckets: list[_Bucket] = Field(max_length=1_000_000)
    last_consume: list[_Last] = Field(max_length=1_000_000)
    truncated: bool = False


@dataclass
class Activity:
    """Activity summed over the collectors that answered."""

    buckets: dict[tuple[str, str, int], dict[str, int]] = field(default_factory=dict)
    last: dict[tuple[str, str], int] = field(default_factory=dict)
    truncated: bool = False

    def add(self, part: dict[str, Any]) -> None:
        for b in part["buckets"]:
            counts = self.buckets.setdefault(
                (b["group"], b["topic"], b["minute"]), dict.fromkeys(_COUNTS, 0)
            )
            for k in _COUNTS:
                counts[k] += b[k]
        for row in part["last_consume"]:
            key = (row["group"], row["topic"])
            self.last[key] = max(self.last.get(key, 0), row["timestamp"])
        self.truncated = self.truncated or bool(part.get("truncated"))

    def reassign_unknown(self, group: str, topic: str) -> None:
        """Count ``group``'s events of unknown topic under ``topic`` (its only subscription)."""
        for g, t, m in [k for k in self.buckets if k[0] == group and k[1] == UNKNOWN_TOPIC]:
            moved = self.buckets.pop((g, t, m))
            counts = self.buckets.setdefault((g, topic, m), dict.fromkeys(_COUNTS, 0))
            for k in _COUNTS:
                counts[k] += moved[k]
        ts = self.last.pop((group, UNKNOWN_TOPIC), None)
        if ts is not None:
            self.last[(group, topic)] = max(self.last.get((group, topic), 0), ts)


# -- offsets ---------------------------------------------------------------------------------
@dataclass
class TopicOffsets:
    topic: str
    queues: list[dict[str, Any]]
    #: None: the topic has no route
    lag: int | None
    oldest: dict[str, Any] | None


class _Cluster:
    """The Kafka clients that read one data cluster's offsets, kept between reads: an admin
    client for any group's committed offsets (OffsetFetch naming the partitions, which Tansu
    answers; asking for "all of the group's" it does not), a consumer outside any group for the
    log ends, and a :class:`LogProbe` for Tansu's understated ends and the record at a committed
    offset (one fetch at a time: it reassigns its consumer)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin: Any = None
        self.consumer: Any = None
        self.probe = LogProbe(bootstrap)
        self.probe_lock = asyncio.Lock()

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self.admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=int(KAFKA_TIMEOUT_S * 1000)
        )
        await asyncio.wait_for(self.admin.start(), KAFKA_TIMEOUT_S)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            request_timeout_ms=int(KAFKA_TIMEOUT_S * 1000),
        )
        await asyncio.wait_for(self.consumer.start(), KAFKA_TIMEOUT_S)

    async def read(self, group: str, tps: list[Any]) -> list[dict[str, Any]]:
        """Per partition: end, committed (None: nothing committed), lag, and the timestamp and
        msgId of the oldest unconsumed record (None without lag)."""
        committed = await asyncio.wait_for(
            self.admin.list_consumer_group_offsets(group, partitions=tps), KAFKA_TIMEOUT_S
        )
        ends = await asyncio.wait_for(self.consumer.end_offsets(tps), KAFKA_TIMEOUT_S)
        starts = await asyncio.wait_for(self.consumer.beginning_offsets(tps), KAFKA_TIMEOUT_S)
        for tp in tps:
            if starts[tp] > 0:  # Tansu may report the second batch's base (tracemq.offset_reset)
                async with self.probe_lock:
                    starts[tp] = await self.probe.exact_start(tp, starts[tp])
        rows = []
        for tp in tps:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            async with self.probe_lock:
                end = await self.probe.end(tp, ends[tp])
            # Nothing committed: the group has consumed nothing of this queue yet.
            position = max(offset or 0, starts[tp])
            row: dict[str, Any] = {
                "queue_id": tp.partition,
                "end": end,
                "committed": offset,
                "lag": max(0, end - position),
                "oldest_timestamp": None,
                "oldest_msg_id": None,
            }
            if row["lag"]:
                async with self.probe_lock:
                    first = await self.probe._fetch(tp, position, 1)  # noqa: SLF001
                if first:
                    row["oldest_timestamp"] = first[0].timestamp
                    row["oldest_msg_id"] = _uniq_key(first[0].headers)
            rows.append(row)
        return rows

    async def close(self) -> None:
        await self.probe.close()
        for client, stop in ((self.consumer, "stop"), (self.admin, "close")):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(getattr(client, stop)(), KAFKA_TIMEOUT_S)
        self.consumer = self.admin = None


class GroupHealth:
    """Computes group status (see the module docstring) and keeps the lag samples."""

    def __init__(
        self,
        queries: Queries,
        redis: aioredis.Redis,
        prefix: str,
        *,
        sample_interval_s: float,
        max_events: int,
    ) -> None:
        self.queries = queries
        self.registry = RegistryReader(redis, prefix)
        self.sample_interval_s = sample_interval_s
        self.max_events = max_events
        ring = max(2, int(HOUR_MS / 1000 / sample_interval_s) + 1) if sample_interval_s else 120
        #: group → samples ``(at_ms, {topic: (lag, age_ms)})``, one hour of them at most
        self.samples: dict[str, deque[tuple[int, dict[str, tuple[int, int | None]]]]] = {}
        self._ring = ring
        self._limit = asyncio.Semaphore(OFFSET_CONCURRENCY)
        self._clusters: dict[str, _Cluster] = {}
        self._clusters_lock = asyncio.Lock()

    # ---- groups and subscriptions
    async def subscriptions(self) -> dict[str, dict[str, Any]]:
        """group → {"topics": {topic: expression}, "message_model", "last_seen"}."""
        out: dict[str, dict[str, Any]] = {}
        for row in await self.registry.subscription_history():
            g = out.setdefault(row["group"], {"topics": {}, "message_model": None, "last_seen": 0})
            prev = g["topics"].get(row["topic"])
            if prev is None or prev[1] <= row["last_seen"]:
                g["topics"][row["topic"]] = (row["expression"], row["last_seen"])
            if row["last_seen"] >= g["last_seen"]:
                g["last_seen"], g["message_model"] = row["last_seen"], row["message_model"]
        for g in out.values():
            g["topics"] = {t: e for t, (e, _) in g["topics"].items()}
        return out

    # ---- offsets
    async def _cluster(self, bootstrap: str) -> _Cluster:
        async with self._clusters_lock:  # one set of clients per cluster, however many ask
            return await self._open_cluster(bootstrap)

    async def _open_cluster(self, bootstrap: str) -> _Cluster:
        cluster = self._clusters.get(bootstrap)
        if cluster is None:
            cluster = _Cluster(bootstrap)
            try:
                await cluster.start()
            except BaseException:
                await cluster.close()
                raise
            self._clusters[bootstrap] = cluster
        return cluster

    async def close(self) -> None:
        """Close the Kafka clients kept for offset reads."""
        clusters, self._clusters = self._clusters, {}
        for cluster in clusters.values():
            await cluster.close()

    async def _offsets(self, group: str, topics: list[str]) -> list[TopicOffsets]:
        from aiokafka import TopicPartition

        by_cluster: dict[str, list[tuple[str, str, Any]]] = {}
        for topic in topics:
            route = await self.registry.topic_route(topic)
            for q in route.queues:
                for qid in range(max(q.read_queues, q.write_queues)):
                    tp = TopicPartition(kafka_topic(q.broker, topic), qid)
                    by_cluster.setdefault(q.data_bootstrap, []).append((topic, q.broker, tp))
        queues: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
        for bootstrap, parts in sorted(by_cluster.items()):
            cluster = await self._cluster(bootstrap)
            try:
                rows = await cluster.read(group, [tp for *_, tp in parts])
            except BaseException:
                # a client in a bad state is not reused: the next read reconnects
                self._clusters.pop(bootstrap, None)
                await cluster.close()
                raise
            for (topic, broker, _), row in zip(parts, rows, strict=True):
                queues[topic].append({"broker": broker, **row})
        out = []
        for topic in topics:
            rows = queues[topic]
            if not rows:  # no route (deleted, or its brokers are gone): no lag to tell
                out.append(TopicOffsets(topic, [], None, None))
                continue
            dated = [r for r in rows if r["oldest_timestamp"] is not None]
            oldest = min(dated, key=lambda r: r["oldest_timestamp"]) if dated else None
            out.append(
                TopicOffsets(
                    topic,
                    rows,
                    sum(r["lag"] for r in rows),
                    None
                    if oldest is None
                    else {
                        "timestamp": oldest["oldest_timestamp"],
                        "msg_id": oldest["oldest_msg_id"],
                        "broker": oldest["broker"],
                        "queue_id": oldest["queue_id"],
                    },
                )
            )
        return out

    # ---- activity (fan-out)
    async def local_activity(self, since_ms: int, until_ms: int, group: str | None) -> Any:
        events, truncated = await self.queries._local(  # noqa: SLF001
            self.queries.store.consume_activity,
            since_ms,
            until_ms,
            group=group,
            limit=self.max_events,
        )
        return {**summarize_activity(events), "truncated": truncated}

    async def activity(
        self, since_ms: int, until_ms: int, group: str | None
    ) -> tuple[Activity, list[dict[str, str]]]:
        act = Activity()
        act.add(await self.local_activity(since_ms, until_ms, group))
        peers, failed = await self.queries.peers()
        params = {"since": str(since_ms), "until": str(until_ms)}
        if group is not None:
            params["group"] = group

        async def one(peer: str) -> None:
            try:
                raw = await self.queries._peer_get(peer, "/api/v1/groups-activity", params)  # noqa: SLF001
                act.add(PeerActivity.model_validate(raw or {}).model_dump())
            except PeerFailure as exc:
                failed.append(_failed(peer, exc.reason, exc.error))
            except ValidationError as exc:
                failed.append(_failed(peer, "malformed", _first_error(exc)))

        await asyncio.gather(*(one(p) for p in peers))  # peers() caps them at MAX_PEERS
        return act, failed

    # ---- status
    async def status(self, group: str | None = None) -> dict[str, Any]:
        """The status of ``group`` (or of every known group, up to :data:`MAX_GROUPS`).

        Raises :class:`UnknownGroup` for a group with no subscription ever seen."""
        subs = await self.subscriptions()
        if group is not None:
            if group not in subs:
                raise UnknownGroup(group)
            names = [group]
        else:
            names = sorted(
                (g for g in subs if not g.startswith((RETRY_GROUP_PREFIX, DLQ_GROUP_PREFIX))),
                key=lambda g: -subs[g]["last_seen"],
            )[:MAX_GROUPS]
            names.sort()
        now = int(time.time() * 1000)
        since = (now - HOUR_MS) // MINUTE_MS * MINUTE_MS
        act_task = asyncio.ensure_future(self.activity(since, now + 1, group))
        try:
            offsets = await asyncio.gather(*(self._group_offsets(g, subs[g], now) for g in names))
        finally:
            act, failed = await act_task
        return {
            "generated_at": now,
            "window_ms": HOUR_MS,
            "rate_window_ms": RATE_WINDOW_MS,
            "sample_interval_s": self.sample_interval_s,
            "groups": [
                self._group_view(g, subs[g], offs, act, now)
                for g, offs in zip(names, offsets, strict=True)
            ],
            "activity_truncated": act.truncated,
            "peers_failed": failed,
        }

    async def _group_offsets(
        self, group: str, sub: dict[str, Any], now: int
    ) -> tuple[list[TopicOffsets] | None, str | None, int]:
        """(offsets per topic or None, why not, live clients)."""
        clients = 0
        try:
            clients = len(await self.registry.group_clients(group))
            if sub["message_model"] == "BROADCASTING":
                return None, "broadcasting: every client keeps its own offsets", clients
            topics = sorted(sub["topics"])
            retry = RETRY_GROUP_PREFIX + group
            if retry not in sub["topics"] and (await self.registry.topic_route(retry)).queues:
                topics.append(retry)
            async with self._limit:
                offs = await self._offsets(group, topics)
        except Exception as exc:  # noqa: BLE001 - Kafka/Redis errors: this group's, not all
            reason = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            metrics.GROUP_OFFSET_FAILURES.labels(reason=reason).inc()
            log.warning("group offsets unavailable", group=group, error=repr(exc))
            return None, f"offsets unavailable: {exc!r}"[:200], clients
        self._record(group, now, offs)
        return offs, None, clients

    def _record(self, group: str, now: int, offs: list[TopicOffsets]) -> None:
        ring = self.samples.get(group)
        if ring is None:
            if len(self.samples) >= MAX_GROUPS * 2:  # forget the longest-unsampled group
                stale = min(self.samples, key=lambda g: self.samples[g][-1][0])
                del self.samples[stale]
            ring = self.samples[group] = deque(maxlen=self._ring)
        ring.append(
            (
                now,
                {
                    o.topic: (o.lag, None if o.oldest is None else now - o.oldest["timestamp"])
                    for o in offs
                    if o.lag is not None
                },
            )
        )

    def _group_view(
        self,
        group: str,
        sub: dict[str, Any],
        offsets: tuple[list[TopicOffsets] | None, str | None, int],
        act: Activity,
        now: int,
    ) -> dict[str, Any]:
        offs, why, clients = offsets
        plain = [t for t in sub["topics"] if not t.startswith(RETRY_GROUP_PREFIX)]
        if len(plain) == 1:
            act.reassign_unknown(group, plain[0])
        by_topic = {o.topic: o for o in offs or []}
        topics = sorted(
            {*sub["topics"], *by_topic, *(t for (g, t, _) in act.buckets if g == group)},
            key=lambda t: (t.startswith(RETRY_GROUP_PREFIX), t),  # its retry topic last
        )
        first_minute = (now - HOUR_MS) // MINUTE_MS * MINUTE_MS + MINUTE_MS
        rate_since = now - RATE_WINDOW_MS
        rows = []
        for topic in topics:
            o = by_topic.get(topic)
            mine = {m: c for (g, t, m), c in act.buckets.items() if g == group and t == topic}
            rate = {
                k: round(
                    sum(c[k] for m, c in mine.items() if m + MINUTE_MS > rate_since)
                    / (RATE_WINDOW_MS / MINUTE_MS),
                    2,
                )
                for k in _COUNTS
            }
            hour = {k: sum(c[k] for c in mine.values()) for k in _COUNTS}
            samples = self._minute_samples(group, topic)
            trend = []
            for m in range(first_minute - MINUTE_MS, now + 1, MINUTE_MS):
                c = mine.get(m, dict.fromkeys(_COUNTS, 0))
                lag, age = samples.get(m, (None, None))
                trend.append({"minute": m, **c, "lag": lag, "lag_age_ms": age})
            oldest = None
            if o is not None and o.oldest is not None:
                oldest = {**o.oldest, "age_ms": max(0, now - o.oldest["timestamp"])}
            rows.append(
                {
                    "topic": topic,
                    "retry_topic": topic.startswith(RETRY_GROUP_PREFIX),
                    "expression": sub["topics"].get(topic),
                    "lag": None if o is None else o.lag,
                    "lag_age_ms": None if oldest is None else oldest["age_ms"],
                    "oldest_unconsumed": oldest,
                    "queues": None if o is None else o.queues,
                    "rates_per_min": {
                        "consume": rate["consumed"],
                        "failure": rate["failed"],
                        "retry": rate["retried"],
                        "dead_letter": rate["dead_lettered"],
                    },
                    "last_hour": hour,
                    "last_consume": act.last.get((group, topic)),
                    "trend": trend,
                }
            )
        lag = sum(r["lag"] or 0 for r in rows)
        unrouted = [r["topic"] for r in rows if r["topic"] in sub["topics"] and r["lag"] is None]
        if offs is not None and unrouted:
            why = f"no route for {', '.join(unrouted)}: lag unknown"
        failing = any(
            r["rates_per_min"]["failure"] or r["rates_per_min"]["dead_letter"] for r in rows
        )
        if offs is None or (unrouted and len(unrouted) == len(plain)):
            state = "unknown"
        elif lag and not clients:
            state = "stopped"
        elif failing:
            state = "failing"
        elif lag:
            state = "lagging"
        else:
            state = "ok"
        ages = [r["lag_age_ms"] for r in rows if r["lag_age_ms"] is not None]
        lasts = [r["last_consume"] for r in rows if r["last_consume"]]
        return {
            "group": group,
            "message_model": sub["message_model"],
            "clients": clients,
            "state": state,
            "offsets_note": why,
            "lag": None if offs is None else lag,
            "lag_age_ms": max(ages) if ages else None,
            "last_consume": max(lasts) if lasts else None,
            "topics": rows,
        }

    def _minute_samples(self, group: str, topic: str) -> dict[int, tuple[int, int | None]]:
        out: dict[int, tuple[int, int | None]] = {}
        for at, by_topic in self.samples.get(group, ()):
            if topic in by_topic:
                out[at // MINUTE_MS * MINUTE_MS] = by_topic[topic]  # the minute's last sample
        return out

    # ---- the sampler
    async def run_sampler(self) -> None:
        """Sample every known group's lag every ``sample_interval_s`` (0: never)."""
        if not self.sample_interval_s:
            await asyncio.Event().wait()  # a service task that returns stops the service
        while True:
            await asyncio.sleep(self.sample_interval_s)
            try:
                subs = await self.subscriptions()
                now = int(time.time() * 1000)
                names = [
                    g for g in subs if not g.startswith((RETRY_GROUP_PREFIX, DLQ_GROUP_PREFIX))
                ]
                names = sorted(names, key=lambda g: -subs[g]["last_seen"])[:MAX_GROUPS]
                await asyncio.gather(*(self._group_offsets(g, subs[g], now) for g in names))
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                metrics.GROUP_OFFSET_FAILURES.labels(reason="sampler").inc()
                log.warning("group sampling failed", error=repr(exc))


def _uniq_key(headers: Any) -> str | None:
    for k, v in headers or ():
        if k == "UNIQ_KEY" and isinstance(v, bytes | bytearray):
            with contextlib.suppress(UnicodeDecodeError):
                return bytes(v).decode("ascii")
    return None


# -- per-message outcome per group (the search page, issue 15 point 14) ----------------------
#: Messages whose outcomes are looked up at once (each one a fan-out look-up by msgId).
OUTCOME_CONCURRENCY = 8


def group_outcomes(view: dict[str, Any], expected: list[str]) -> list[dict[str, Any]]:
    """Per consumer group, what happened to the message so far, from its trace view:
    ``dead_lettered`` (moved to the group's %DLQ%), ``consumed`` (an attempt succeeded; with
    how many attempts), ``retried`` (attempts failed, the broker will deliver it again),
    ``pending`` (an attempt without a result yet, or an expected group with no attempt: one
    whose subscription to the topic, and tag expression, the routing database saw at or before
    the send; a group that has since unsubscribed for good stays ``pending``)."""
    dead = {d["group"] for d in view.get("dead_letters", []) if d.get("success")}
    out: dict[str, dict[str, Any]] = {}
    for c in view.get("consumers", []):
        group = c.get("group") or ""
        attempts = c.get("attempts", [])
        statuses = [a.get("status") for a in attempts]
        if group in dead:
            outcome = "dead_lettered"
        elif "success" in statuses:
            outcome = "consumed"
        elif "failed" in statuses:
            outcome = "retried"
        else:
            outcome = "pending"
        out[group] = {"group": group, "outcome": outcome, "attempts": len(attempts)}
    for group in dead - set(out):
        out[group] = {"group": group, "outcome": "dead_lettered", "attempts": 0}
    for group in expected:
        out.setdefault(group, {"group": group, "outcome": "pending", "attempts": 0})
    return [out[g] for g in sorted(out)]


async def add_outcomes(
    health: GroupHealth | None, queries: Queries, items: list[dict[str, Any]]
) -> list[dict[str, str]]:
    """Give every listed message its ``outcomes`` (see :func:`group_outcomes`); return the
    peers that failed while its events were gathered."""
    from tracemq_collector.view import build_view

    limit = asyncio.Semaphore(OUTCOME_CONCURRENCY)
    failed: list[dict[str, str]] = []
    history: list[dict[str, Any]] = []
    if health is not None:
        with contextlib.suppress(RedisError, OSError):
            history = await health.registry.subscription_history()

    def expected(topic: str | None, tags: str | None, at: int) -> list[str]:
        out = set()
        for row in history:
            # Subscribed when the message was sent (a group stopped since still owes it: its
            # committed offset waits before the message); one subscribed only later may start
            # after it, so it is not expected (its attempts still show if it consumes it).
            if row["topic"] != topic or row["first_seen"] > at:
                continue
            if row["group"].startswith((RETRY_GROUP_PREFIX, DLQ_GROUP_PREFIX)):
                continue
            try:
                if matches(parse(row["expression"]), tags):
                    out.add(row["group"])
            except InvalidMessageError:
                out.add(row["group"])  # cannot tell: shown rather than hidden
        return sorted(out)

    async def one(item: dict[str, Any]) -> None:
        async with limit:
            events, bad = await queries.trace_events(item["msg_id"], local=False)
        failed.extend(bad)
        view = build_view(item["msg_id"], events) if events else {}
        item["outcomes"] = group_outcomes(
            view, expected(item.get("topic"), item.get("tags"), int(item.get("timestamp") or 0))
        )

    await asyncio.gather(*(one(i) for i in items))  # a page: at most MAX_PAGE_SIZE, bounded above
    return failed
