"""Thin helpers over aiokafka for what tracemq asks of the Kafka-compatible transport.

Known transport limits (see DESIGN §1): Tansu has no idempotent producer and no
CreatePartitions; growing a topic's queue count there raises
:class:`~tracemq.errors.NotSupportedByTransportError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from tracemq import kafka_security
from tracemq._kafka import MAX_MESSAGE_SIZE as MAX_MESSAGE_SIZE  # a message body's limit
from tracemq._kafka import PRODUCER_DEFAULTS as PRODUCER_DEFAULTS  # every producer's settings
from tracemq._kafka import TRANSPORT_MAX_BYTES as TRANSPORT_MAX_BYTES  # the records' limit
from tracemq.errors import NotSupportedByTransportError, TracemqError

ADMIN_TIMEOUT_MS = 10_000
#: Topic configuration tracemq creates every Kafka topic with. ``max.message.bytes`` matches the
#: producers' limit (TRANSPORT_MAX_BYTES) so that a Kafka broker, whose default is 1 MiB, takes
#: what the producer accepted; Tansu (0.6) records it (DescribeConfigs shows it) but enforces no
#: record size limit of its own. Topics created before this setting keep their own value.
TOPIC_CONFIGS = {"max.message.bytes": str(TRANSPORT_MAX_BYTES)}


@contextlib.asynccontextmanager
async def admin_client(
    bootstrap: str, client_id: str = "tracemq-admin"
) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        **kafka_security.client_kwargs(bootstrap),
        client_id=client_id,
        request_timeout_ms=ADMIN_TIMEOUT_MS,
    )
    await kafka_security.start(admin, bootstrap)
    try:
        yield admin
    finally:
        await admin.close()


async def partition_count(admin: AIOKafkaAdminClient, topic: str) -> int | None:
    """Number of partitions of ``topic``, or None when it does not exist.

    Existence is checked with an all-topics metadata request first: a metadata request naming a
    missing topic makes Tansu (like Kafka with auto.create.topics.enable) create it with its
    default partition count.
    """
    if topic not in await admin.list_topics():
        return None
    desc = await admin.describe_topics([topic])
    for t in desc:
        if t.get("topic") == topic and t.get("error_code", 0) == 0:
            return len(t.get("partitions") or []) or None
    return None


async def ensure_topic(admin: AIOKafkaAdminClient, topic: str, partitions: int) -> int:
    """Create ``topic`` with ``partitions`` if missing; grow it if smaller. Returns the count.

    A topic that already has more partitions is left alone: Kafka cannot shrink, and RocketMQ's
    shrinking of write queues only stops writes to the upper queues (the perm/write count in
    the route does that for us).
    """
    current = await partition_count(admin, topic)
    if current is None:
        try:
            resp = await admin.create_topics(
                [NewTopic(topic, partitions, 1, topic_configs=TOPIC_CONFIGS)]
            )
            for _name, code, *rest in getattr(resp, "topic_errors", []):
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise TracemqError(
                        f"creating Kafka topic {topic!r} failed: error {code} {rest}"
                    )
        except TopicAlreadyExistsError:
            pass
        return partitions
    if current < partitions:
        try:
            await admin.create_partitions({topic: NewPartitions(partitions)})
        except (KafkaError, AssertionError, AttributeError, NotImplementedError) as exc:
            raise NotSupportedByTransportError(
                f"growing {topic!r} from {current} to {partitions} partitions is not supported "
                f"by this transport ({exc.__class__.__name__})"
            ) from None
        got = await partition_count(admin, topic)
        if got is None or got < partitions:
            raise NotSupportedByTransportError(
                f"growing {topic!r} from {current} to {partitions} partitions is not supported "
                "by this transport (CreatePartitions had no effect)"
            )
        return got
    return current


async def delete_topic(admin: AIOKafkaAdminClient, topic: str) -> None:
    with contextlib.suppress(UnknownTopicOrPartitionError):
        await admin.delete_topics([topic])


async def wait_until_ready(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Return once the cluster answers a metadata request; raise TimeoutError after the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: BaseException | None = None
    while loop.time() < deadline:
        try:
            async with admin_client(bootstrap, "tracemq-probe") as admin:
                await admin.list_topics()
                return
        except Exception as exc:  # any failure means "not yet"
            last = exc
            await asyncio.sleep(0.2)
    raise TimeoutError(f"Kafka at {bootstrap} did not answer within {timeout_s}s: {last!r}")
