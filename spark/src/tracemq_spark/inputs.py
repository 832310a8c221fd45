"""The job's two small inputs, exported from the running system when a run starts:

* the subscription history, from Redis (``RegistryReader.subscription_history()``);
* a snapshot of each consumer group's committed offset per queue, from Kafka: for every
  (group, topic) of the history and every queue of the topic's route,
  ``AIOKafkaConsumer(group_id=group).committed(tp)`` on the queue's cluster, where the Kafka
  topic is ``kafka_topic(broker, topic)`` and the partition the queue id. ``store_addr`` is the
  route's broker address resolved to IPv4 ``ip:port``, as in offsetMsgId. Broadcasting
  consumers commit under ``<group>.broadcast.<client host>.<instance>``; those groups are found
  by listing the cluster's groups, and their offsets carry the client host. Every clustering
  group's ``%RETRY%<group>`` and ``%DLQ%<group>`` queues are in it too;
* with it, the **copies**: every record of those retry and dead-letter queues (from ``since_ms``
  on), as msgId, reconsume count and queue coordinates. A consumer's retry of a message is a
  new copy in ``%RETRY%<group>`` (forwarded by the broker's schedule service, msgId kept), so
  these rows place each delivery of a retried message in its queue, the way the Pub's
  offsetMsgId places the first one. They come from the queues themselves, not from traces: a
  lost trace cannot hide a retry or a dead letter.

Both are written as JSON (``{"subscriptions": [...]}``, ``{"offsets": [...], "copies":
[...]}``), the format :func:`tracemq_spark.job.parse_subscriptions` / ``parse_offsets`` /
``parse_copies`` read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from tracemq.redis_url import redact
from tracemq.routing.keys import DEFAULT_PREFIX


def _store_addr(address: str) -> str:
    host, _, port = address.rpartition(":")
    try:
        socket.inet_aton(host)
        ip = host
    except OSError:
        try:
            ip = socket.getaddrinfo(host, None, family=socket.AF_INET)[0][4][0]
        except (OSError, IndexError):
            ip = "127.0.0.1"
    return f"{ip}:{port or 0}"


async def export_subscriptions(
    redis_url: str, prefix: str = DEFAULT_PREFIX
) -> list[dict[str, Any]]:
    from tracemq.routing.registry import RegistryReader, connect

    redis = connect(redis_url)
    try:
        return await RegistryReader(redis, prefix).subscription_history()
    finally:
        await redis.aclose()


def _pairs(history: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(group, topic, message model) of the snapshot: the history's business topics, and the
    retry and dead-letter topic of every clustering group (broadcasting consumers do not
    retry)."""
    from tracemq.naming import dlq_topic, retry_topic

    out: set[tuple[str, str, str]] = set()
    for r in history:
        group, topic = str(r["group"]), str(r["topic"])
        model = str(r.get("message_model", "")).upper()
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        out.add((group, topic, model))
        if model != "BROADCASTING":
            out.add((group, retry_topic(group), "CLUSTERING"))
            out.add((group, dlq_topic(group), "CLUSTERING"))
    return sorted(out)


async def export_offsets(
    redis_url: str,
    history: list[dict[str, Any]],
    prefix: str = DEFAULT_PREFIX,
    timeout_s: float = 20.0,
) -> list[dict[str, Any]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from tracemq import kafka_security
    from tracemq.naming import kafka_topic
    from tracemq.routing.registry import RegistryReader, connect

    pairs = _pairs(history)
    redis = connect(redis_url)
    try:
        reader = RegistryReader(redis, prefix)
        routes = {t: await reader.topic_route(t) for t in sorted({t for _, t, _ in pairs})}
    finally:
        await redis.aclose()
    # (bootstrap, kafka group id, client host) → [(group, topic, broker, store_addr, tp)]
    plan: dict[tuple[str, str, str | None], list[tuple[str, str, str, str, Any]]] = {}
    broadcasting: dict[str, list[tuple[str, str, str, str, Any]]] = {}
    for group, topic, model in pairs:
        for q in routes[topic].queues:
            addr = _store_addr(q.address)
            for qid in range(q.read_queues):
                item = (
                    group,
                    topic,
                    q.broker,
                    addr,
                    TopicPartition(kafka_topic(q.broker, topic), qid),
                )
                if model == "BROADCASTING":
                    broadcasting.setdefault(q.data_bootstrap, []).append(item)
                else:
                    plan.setdefault((q.data_bootstrap, group, None), []).append(item)
    for bootstrap, items in broadcasting.items():
        for gid in await _broadcast_group_ids(bootstrap, {g for g, *_ in items}):
            base, host = gid
            plan.setdefault((bootstrap, base[1], host), []).extend(
                i for i in items if i[0] == base[0]
            )
    rows: list[dict[str, Any]] = []
    for (bootstrap, kafka_group, host), items in sorted(plan.items(), key=lambda kv: str(kv[0])):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            **kafka_security.client_kwargs(bootstrap),
            group_id=kafka_group,
            enable_auto_commit=False,
        )
        await asyncio.wait_for(kafka_security.start(consumer, bootstrap), timeout_s)
        try:
            for group, topic, broker, addr, tp in items:
                committed = await asyncio.wait_for(consumer.committed(tp), timeout_s)
                rows.append(
                    {
                        "group": group,
                        "topic": topic,
                        "broker": broker,
                        "store_addr": addr,
                        "queue_id": tp.partition,
                        "committed": committed,
                        "client_host": host,
                    }
                )
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout_s)
    return per_client_host(rows)


def _offset(committed: int | None) -> int:
    return -1 if committed is None else committed


def per_client_host(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One offset row per (group, queue, client host): a host may hold several broadcasting
    instances of a group (two in one process, or the pid-named instance of each restart, each
    its own Kafka group), and the reconciliation knows broadcasting clients by host only — the
    furthest offset of that host's instances stands for it."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        if not row.get("client_host"):
            out[(id(row),)] = row
            continue
        key = tuple(row[k] for k in ("group", "topic", "broker", "queue_id", "client_host"))
        have = out.get(key)
        if have is None or _offset(row["committed"]) > _offset(have["committed"]):
            out[key] = row
    return list(out.values())


async def _broadcast_group_ids(
    bootstrap: str, groups: set[str]
) -> list[tuple[tuple[str, str], str]]:
    """Kafka groups of broadcasting consumers: ``((group, kafka group id), client host)``."""
    from aiokafka.admin import AIOKafkaAdminClient
    from tracemq import kafka_security

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, **kafka_security.client_kwargs(bootstrap)
    )
    await kafka_security.start(admin, bootstrap)
    try:
        listed = await admin.list_consumer_groups()
    except Exception:  # listing is best effort: without it, no per-client offsets
        return []
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    out = []
    for entry in listed:
        gid = entry[0] if isinstance(entry, tuple) else str(entry)
        for g in groups:
            prefix = f"{g}.broadcast."
            if gid.startswith(prefix):
                host = gid[len(prefix) :].split(".", 4)
                out.append(((g, gid), ".".join(host[:4])))
    return out


async def export_copies(
    redis_url: str,
    history: list[dict[str, Any]],
    prefix: str = DEFAULT_PREFIX,
    since_ms: int | None = None,
    timeout_s: float = 60.0,
) -> list[dict[str, Any]]:
    """Every record of the clustering groups' ``%RETRY%`` and ``%DLQ%`` queues written at or
    after ``since_ms`` (all of them without it), up to the end offsets read at the start:
    ``{group, topic, broker, store_addr, queue_id, queue_offset, msg_id, reconsume_times,
    timestamp}``. Only the record headers are kept."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from tracemq import kafka_security
    from tracemq.message import MessageConst
    from tracemq.naming import kafka_topic
    from tracemq.routing.registry import RegistryReader, connect

    wanted = [(g, t) for g, t, _ in _pairs(history) if t.startswith(("%RETRY%", "%DLQ%"))]
    redis = connect(redis_url)
    try:
        reader = RegistryReader(redis, prefix)
        routes = {t: await reader.topic_route(t) for _, t in wanted}
    finally:
        await redis.aclose()
    by_cluster: dict[str, dict[TopicPartition, tuple[str, str, str, str]]] = {}
    for group, topic in wanted:
        for q in routes[topic].queues:
            addr = _store_addr(q.address)
            for qid in range(max(q.read_queues, q.write_queues)):
                tp = TopicPartition(kafka_topic(q.broker, topic), qid)
                by_cluster.setdefault(q.data_bootstrap, {})[tp] = (group, topic, q.broker, addr)
    rows: list[dict[str, Any]] = []
    for bootstrap, where in sorted(by_cluster.items()):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            **kafka_security.client_kwargs(bootstrap),
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        await asyncio.wait_for(kafka_security.start(consumer, bootstrap), timeout_s)
        try:
            present = await asyncio.wait_for(consumer.topics(), timeout_s)
            tps = [tp for tp in where if tp.topic in present]
            if not tps:
                continue
            consumer.assign(tps)
            ends = await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)
            starts = await asyncio.wait_for(consumer.beginning_offsets(tps), timeout_s)
            if since_ms is not None:
                found = await asyncio.wait_for(
                    consumer.offsets_for_times(dict.fromkeys(tps, since_ms)), timeout_s
                )
                # nothing written since: None from Kafka, offset 0 with timestamp -1 from Tansu
                starts = {
                    tp: ends[tp] if ot is None or ot.timestamp < 0 else ot.offset
                    for tp, ot in found.items()
                }
            todo = [tp for tp in tps if starts[tp] < ends[tp]]
            for tp in todo:
                consumer.seek(tp, starts[tp])
            deadline = asyncio.get_running_loop().time() + timeout_s
            while todo:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"reading the retry/dead-letter queues {todo} timed out")
                batch = await consumer.getmany(*todo, timeout_ms=500)
                for tp, recs in batch.items():
                    group, topic, broker, addr = where[tp]
                    for rec in recs:
                        if rec.offset >= ends[tp]:
                            continue
                        h = {k: v.decode(errors="replace") for k, v in rec.headers or () if v}
                        try:
                            reconsume = int(h.get(MessageConst.RECONSUME_TIME, "0"))
                        except ValueError:
                            reconsume = 0
                        rows.append(
                            {
                                "group": group,
                                "topic": topic,
                                "broker": broker,
                                "store_addr": addr,
                                "queue_id": tp.partition,
                                "queue_offset": rec.offset,
                                "msg_id": h.get(MessageConst.UNIQ_KEY),
                                "reconsume_times": reconsume,
                                "timestamp": rec.timestamp,
                            }
                        )
                todo = [tp for tp in todo if await consumer.position(tp) < ends[tp]]
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout_s)
    return rows


def export(
    redis_url: str, directory: Path, prefix: str = DEFAULT_PREFIX, since_ms: int | None = None
) -> tuple[Path, Path]:
    """Export both inputs into ``directory`` (created); returns their paths. ``since_ms``: the
    retry and dead-letter copies written before it are not needed (the start of the read
    range)."""

    async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        history = await export_subscriptions(redis_url, prefix)
        # the two reads are not atomic; a retry forwarded between them is either a copy
        # without its commit or a commit without its copy: both leave the message unconsumed
        # in the job's eyes (the trace outcome stands), never falsely consumed
        copies = await export_copies(redis_url, history, prefix, since_ms)
        return history, await export_offsets(redis_url, history, prefix), copies

    taken = int(time.time() * 1000)
    history, offsets, copies = asyncio.run(both())
    directory.mkdir(parents=True, exist_ok=True)
    subs = directory / "subscriptions.json"
    offs = directory / "offsets.json"
    subs.write_text(
        json.dumps(
            {"exported_at": taken, "source": redact(redis_url), "subscriptions": history}, indent=1
        )
    )
    offs.write_text(json.dumps({"taken_at": taken, "offsets": offsets, "copies": copies}, indent=1))
    return subs, offs


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1))
