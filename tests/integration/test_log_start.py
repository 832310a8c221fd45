"""The log start a consumer "from the first offset" is put at, on the real Tansu.

Tansu, when a new partition's first record batches are written concurrently, may report the
second batch's base offset as the log start for good while the first batch is still in the log
(found by this suite: a PushConsumer with FIRST_OFFSET skipped a queue's first 13 messages in
both of its groups). The guard confirms a reported start above 0 with a fetch from offset 0
(``tracemq.offset_reset``); these tests drive that fetch against the real broker."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from tracemq.offset_reset import (
    KAFKA_AUTO_OFFSET_RESET,
    LogProbe,
    OffsetGuard,
    log_starts,
)
from tracemq_devkit.devstack import EmbeddedStack


async def _topic_with_records(bootstrap: str, topic: str, n: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, f"r{i}".encode(), partition=0)
    finally:
        await producer.stop()


async def test_a_start_the_broker_overstates_is_found_by_the_probe(
    stack: EmbeddedStack, unique: str
) -> None:
    topic = f"logstart_{unique}"
    bootstrap = stack.business_bootstrap
    await _topic_with_records(bootstrap, topic, 5)
    tp = TopicPartition(topic, 0)
    probe = LogProbe(bootstrap)
    try:
        # the broker said 3 (as Tansu does after concurrent first batches): records from 0
        assert await probe.exact_start(tp, 3) == 0
        assert await probe.exact_start(tp, 0) == 0  # nothing to confirm
    finally:
        await probe.close()

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset=KAFKA_AUTO_OFFSET_RESET
    )
    await consumer.start()
    guard = OffsetGuard(consumer, bootstrap=bootstrap, commit=False)
    try:
        consumer.assign([tp])
        # as Tansu answers after concurrent first batches: the reported start is 3
        real = consumer.beginning_offsets

        async def overstated(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            return {t: 3 for t in await real(tps)}

        consumer.beginning_offsets = overstated  # type: ignore[method-assign]
        assert await log_starts(consumer, [tp], guard._probe) == {tp: 0}
        await guard.seek_to_start(tp)
        assert await consumer.position(tp) == 0
        records = (await consumer.getmany(tp, timeout_ms=5000)).get(tp, [])
        assert [r.value for r in records][:1] == [b"r0"]
        # and a position at the real start is inside the log: the check resets nothing
        consumer.seek(tp, 0)
        assert await guard.check([tp]) == [] and guard.total == 0
    finally:
        await guard.close()
        await consumer.stop()
