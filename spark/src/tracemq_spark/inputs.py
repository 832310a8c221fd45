"""The job's two small inputs, exported from the running system when a run starts:

* the subscription history, from Redis (``RegistryReader.subscription_history()``);
* a snapshot of each consumer group's committed offset per queue, from Kafka: for every
  (group, topic) of the history (retry and dead-letter topics left out) and every queue of the
  topic's route, ``AIOKafkaConsumer(group_id=group).committed(tp)`` on the queue's cluster,
  where the Kafka topic is ``kafka_topic(broker, topic)`` and the partition the queue id.
  ``store_addr`` is the route's broker address resolved to IPv4 ``ip:port``, as in offsetMsgId.
  Broadcasting consumers commit under ``<group>.broadcast.<client host>.<instance>``; those
  groups are found by listing the cluster's groups, and their offsets carry the client host.

Both are written as JSON (``{"subscriptions": [...]}``, ``{"offsets": [...]}``), the format
:func:`tracemq_spark.job.parse_subscriptions` / ``parse_offsets`` read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any


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


async def export_subscriptions(redis_url: str, prefix: str = "tmq:") -> list[dict[str, Any]]:
    from tracemq.routing.registry import RegistryReader, connect

    redis = connect(redis_url)
    try:
        return await RegistryReader(redis, prefix).subscription_history()
    finally:
        await redis.aclose()


async def export_offsets(
    redis_url: str, history: list[dict[str, Any]], prefix: str = "tmq:", timeout_s: float = 20.0
) -> list[dict[str, Any]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from tracemq.naming import kafka_topic
    from tracemq.routing.registry import RegistryReader, connect

    pairs = sorted(
        {
            (r["group"], r["topic"], str(r.get("message_model", "")).upper())
            for r in history
            if not str(r["topic"]).startswith(("%RETRY%", "%DLQ%"))
        }
    )
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
            bootstrap_servers=bootstrap, group_id=kafka_group, enable_auto_commit=False
        )
        await asyncio.wait_for(consumer.start(), timeout_s)
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
    return rows


async def _broadcast_group_ids(
    bootstrap: str, groups: set[str]
) -> list[tuple[tuple[str, str], str]]:
    """Kafka groups of broadcasting consumers: ``((group, kafka group id), client host)``."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
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


def export(redis_url: str, directory: Path, prefix: str = "tmq:") -> tuple[Path, Path]:
    """Export both inputs into ``directory`` (created); returns their paths."""

    async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        history = await export_subscriptions(redis_url, prefix)
        return history, await export_offsets(redis_url, history, prefix)

    taken = int(time.time() * 1000)
    history, offsets = asyncio.run(both())
    directory.mkdir(parents=True, exist_ok=True)
    subs = directory / "subscriptions.json"
    offs = directory / "offsets.json"
    subs.write_text(
        json.dumps({"exported_at": taken, "source": redis_url, "subscriptions": history}, indent=1)
    )
    offs.write_text(json.dumps({"taken_at": taken, "offsets": offsets}, indent=1))
    return subs, offs


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1))
