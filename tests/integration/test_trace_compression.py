"""Trace messages go zstd-compressed by default (Kafka's batch compression): on a real Tansu
the trace topic's batch holding a traced send is a zstd batch, and the collector's reader
(aiokafka) gets the trace text back; a client asked for no compression writes a plain batch."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords
from tracemq import Message, Producer
from tracemq._record_batch import CODEC_IDS
from tracemq.admin import AdminClient
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.trace import TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import TraceMessage, read_trace_topic
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


async def _codec_of(bootstrap: str, partition: int, offset: int) -> int:
    """The compression codec of the stored batch holding ``offset`` (a raw fetch)."""
    from tracemq import kafka_security

    topic = kafka_topic("trace-broker", TRACE_TOPIC)
    client = AIOKafkaClient(bootstrap_servers=bootstrap, **kafka_security.client_kwargs(bootstrap))
    await client.bootstrap()
    try:
        await client.force_metadata_update()
        from aiokafka.structs import TopicPartition

        node = client.cluster.leader_for_partition(TopicPartition(topic, partition))
        assert node is not None and node >= 0
        req = FetchRequest(100, 1, 8 << 20, 0, [(topic, [(partition, offset, 8 << 20)])])
        resp = await client.send(node, req)
        [(_, [answer])] = resp.topics
        assert answer[0] == partition and answer[1] == 0, answer[:2]
        records = MemoryRecords(bytes(answer[-1]))
        while (batch := records.next_batch()) is not None:
            if batch.base_offset <= offset <= batch.base_offset + batch.last_offset_delta:
                return int(batch.compression_type)
        raise AssertionError(f"no batch holds offset {offset} of partition {partition}")
    finally:
        await client.close()


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_trace_messages_are_compressed_as_asked(
    stack: EmbeddedStack, admin: AdminClient, unique: str, compression: str
) -> None:
    topic = f"Zstd_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    options = {} if compression == "zstd" else {"compression": compression}
    async with Producer(
        f"PG_{unique}", enable_msg_trace=True, trace_options=options, **env
    ) as producer:
        sent = [
            await producer.send(Message(topic, b"body-%d" % i, keys=[f"k{i}-{unique}"]))
            for i in range(50)
        ]
        assert await producer.trace_dispatcher.flush(10)
    ids = {r.msg_id for r in sent}

    holding: list[TraceMessage] = []

    async def traced() -> bool:
        holding[:] = [
            m
            for m in await read_trace_topic(stack.trace_bootstrap)
            if any(c.trace_type == TraceType.Pub and c.trace_beans[0].msg_id in ids
                   for c in m.contexts)
        ]  # fmt: skip
        found = {c.trace_beans[0].msg_id for m in holding for c in m.contexts if not m.errors}
        return ids <= found

    await eventually(traced, timeout=20, what="every Pub trace read back from the trace topic")
    for m in holding:
        assert m.errors == []
        assert ids & m.keys  # the KEYS header came back too
        codec = await _codec_of(stack.trace_bootstrap, m.partition, m.offset)
        assert codec == CODEC_IDS[compression], (m.partition, m.offset)
