"""Admin requests addressed to this broker: create, update, delete and list topics; ensure a
consumer group's retry and dead-letter topics (``retry.ensure``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from tracemq.errors import NotSupportedByTransportError
from tracemq.naming import (
    DLQ_GROUP_PREFIX,
    RETRY_GROUP_PREFIX,
    dlq_topic,
    kafka_topic,
    retry_topic,
    validate_group,
    validate_queue_count,
    validate_topic,
)
from tracemq.protocol.admin import AdminRequest
from tracemq.protocol.control import PERM_RW, TopicConfig
from tracemq.transport import delete_topic, ensure_topic

from tracemq_broker.errors import AdminRejected
from tracemq_broker.topic_table import TopicTable


class TopicAdmin:
    """Executes admin operations on the topic table and the broker's Kafka cluster."""

    def __init__(
        self,
        broker_name: str,
        table: TopicTable,
        kafka: AIOKafkaAdminClient,
        on_change: Callable[[], Awaitable[None]],
    ) -> None:
        self.broker_name = broker_name
        self.table = table
        self.kafka = kafka
        self.on_change = on_change

    async def handle(self, req: AdminRequest) -> dict[str, Any]:
        if req.type == "topic.list":
            return {"topics": {t: c.model_dump() for t, c in sorted(self.table.topics.items())}}
        if req.type == "retry.ensure":
            return await self.ensure_retry(req.body.get("group"))
        topic = req.body.get("topic")
        try:
            validate_topic(topic, allow_system=False)
        except ValueError as exc:
            raise AdminRejected(str(exc)) from None
        assert isinstance(topic, str)
        if req.type == "topic.delete":
            if not await self.table.remove(topic):
                raise AdminRejected(
                    f"topic {topic!r} does not exist on broker {self.broker_name!r}"
                )
            await delete_topic(self.kafka, kafka_topic(self.broker_name, topic))
            await self.on_change()
            return {"topic": topic, "deleted": True}
        exists = topic in self.table.topics
        if req.type == "topic.update" and not exists:
            raise AdminRejected(f"topic {topic!r} does not exist on broker {self.broker_name!r}")
        cfg = self._config(req.body, self.table.topics.get(topic))
        await self.apply(topic, cfg)
        return {"topic": topic, "created": not exists, **cfg.model_dump()}

    async def apply(self, topic: str, cfg: TopicConfig) -> None:
        """Make the Kafka topic match ``cfg`` and record it (also used for system topics)."""
        try:
            await ensure_topic(
                self.kafka,
                kafka_topic(self.broker_name, topic),
                max(cfg.read_queues, cfg.write_queues),
            )
        except NotSupportedByTransportError as exc:
            raise AdminRejected(str(exc)) from None
        except ValueError as exc:
            raise AdminRejected(str(exc)) from None
        await self.table.put(topic, cfg)
        await self.on_change()

    async def ensure_retry(self, group: object) -> dict[str, Any]:
        """Create ``%RETRY%<group>`` and ``%DLQ%<group>`` (one queue each) if missing."""
        try:
            validate_group(group)
            assert isinstance(group, str)
            names = [retry_topic(group), dlq_topic(group)]
            for t in names:
                validate_topic(t)
                kafka_topic(self.broker_name, t)
        except ValueError as exc:
            raise AdminRejected(f"group {group!r} cannot have retry topics: {exc}") from None
        created = [t for t in names if await self.ensure_group_topic(t)]
        return {"group": group, "retry_topic": names[0], "dlq_topic": names[1], "created": created}

    async def ensure_group_topic(self, topic: str) -> bool:
        """Create a ``%RETRY%`` or ``%DLQ%`` topic with one queue if missing; True if created."""
        if not topic.startswith((RETRY_GROUP_PREFIX, DLQ_GROUP_PREFIX)):
            raise AdminRejected(f"{topic!r} is not a retry or dead-letter topic")
        if topic in self.table.topics:
            return False
        await self.apply(topic, TopicConfig(read_queues=1, write_queues=1, perm=PERM_RW))
        return True

    @staticmethod
    def _config(body: dict[str, Any], current: TopicConfig | None) -> TopicConfig:
        default_q = 8 if current is None else None
        read_q = body.get("read_queues", current.read_queues if current else default_q)
        write_q = body.get("write_queues", current.write_queues if current else default_q)
        perm = body.get("perm", current.perm if current else PERM_RW)
        try:
            read_q = validate_queue_count(read_q, "read_queues")
            write_q = validate_queue_count(write_q, "write_queues")
        except ValueError as exc:
            raise AdminRejected(str(exc)) from None
        if isinstance(perm, bool) or not isinstance(perm, int) or not 0 <= perm <= 7:
            raise AdminRejected(f"perm must be an integer from 0 to 7, got {perm!r}")
        return TopicConfig(read_queues=read_q, write_queues=write_q, perm=perm)
