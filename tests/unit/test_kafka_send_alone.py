"""tracemq._kafka: ProducerPool.send_alone writes one record in a produce request of its own,
straight to the partition's leader, and raises the partition's error; anything it cannot do
that way (no plain started producer, an unknown or leaderless partition) takes send()."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.protocol.produce import ProduceRequest_v3
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.structs import TopicPartition
from tracemq import _kafka
from tracemq._kafka import ProducerPool, _alone_of

TP = TopicPartition("t", 1)
HEADERS = [("KEYS", b"a b"), ("UNIQ_KEY", b"X" * 32)]


class _Client:
    """What send_alone uses of aiokafka's client; ``script``: per request, the topics of its
    answer or an exception to raise (the last one repeats)."""

    def __init__(self, leader: int | None, script: list[Any] | None = None) -> None:
        self.leader = leader
        self.script = script if script is not None else [[("t", [(1, 0, 7, -1, -1)])]]
        self.requests: list[tuple[int, Any]] = []
        self.metadata_updates = 0
        self.cluster = SimpleNamespace(leader_for_partition=self._leader)

    def _leader(self, tp: TopicPartition) -> int | None:
        return self.leader if tp == TP else None

    async def send(self, node: int, request: Any) -> Any:
        self.requests.append((node, request))
        step = self.script[min(len(self.requests), len(self.script)) - 1]
        if isinstance(step, Exception):
            raise step
        return SimpleNamespace(topics=step)

    def force_metadata_update(self) -> None:
        self.metadata_updates += 1


def _pool(client: _Client, acks: int = 1) -> tuple[ProducerPool, list[Any]]:
    pool = ProducerPool()
    pool._alone["b:1"] = (client, acks, 10_000)
    fallback: list[Any] = []

    async def send(bootstrap: str, tp: Any, value: bytes, headers: Any) -> Any:
        fallback.append((bootstrap, tp, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result("acked")
        return fut

    pool.send = send  # type: ignore[method-assign]
    return pool, fallback


@pytest.mark.parametrize("hardware_crc", [True, False], ids=["own-batch", "aiokafka-builder"])
async def test_the_request_holds_the_record_alone_for_the_leader(
    hardware_crc: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (without a hardware CRC-32C the batch is aiokafka's builder's; the same bytes either way)
    monkeypatch.setattr(_kafka, "HARDWARE_CRC", hardware_crc)
    client = _Client(leader=3)
    pool, fallback = _pool(client, acks=-1)
    value = b"SubBefore\x01" * 5000
    await pool.send_alone("b:1", TP, value, HEADERS)
    assert fallback == []
    [(node, request)] = client.requests
    assert node == 3
    assert request.required_acks == -1
    struct = request.build(ProduceRequest_v3)
    assert (struct.transactional_id, struct.required_acks, struct.timeout) == (None, -1, 10_000)
    [(topic, [(partition, data)])] = struct.topics
    assert (topic, partition) == ("t", 1)
    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc()
    assert batch.compression_type == 0 and batch.producer_id == -1
    [record] = list(batch)
    assert record.value == value and record.key is None
    assert list(record.headers) == HEADERS
    assert record.timestamp > 1_700_000_000_000  # now, as aiokafka stamps it


def _answers(*codes: int) -> list[list[tuple[Any, ...]]]:
    """One produce answer per request: tp's error code each, beside another topic and partition."""
    return [[("other", [(1, 0, 0)]), ("t", [(0, 0, 1), (1, code, -1)])] for code in codes]


async def test_a_refused_record_is_raised_at_once() -> None:
    client = _Client(leader=0, script=_answers(10))  # MESSAGE_TOO_LARGE: not retriable
    pool, _ = _pool(client)
    with pytest.raises(kafka_errors.MessageSizeTooLargeError):
        await pool.send_alone("b:1", TP, b"v", [])
    assert len(client.requests) == 1 and client.metadata_updates == 0


async def test_retriable_errors_are_retried_until_acknowledged() -> None:
    # a leader moved (metadata asked for), a request timed out (a hung broker), a connection
    # closed under the request, then the acknowledgement
    script: list[Any] = [*_answers(6, 7), kafka_errors.KafkaConnectionError("closed"), *_answers(0)]
    client = _Client(leader=0, script=script)
    pool, fallback = _pool(client)
    await pool.send_alone("b:1", TP, b"v", [])
    assert len(client.requests) == 4 and fallback == []
    assert client.metadata_updates == 2  # NOT_LEADER and the closed connection
    assert len({id(r) for _, r in client.requests}) == 1  # the same batch each time


async def test_retriable_errors_are_raised_after_retry_for_s() -> None:
    client = _Client(leader=0, script=_answers(*[7] * 100))
    pool, _ = _pool(client)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(kafka_errors.RequestTimedOutError):
        await pool.send_alone("b:1", TP, b"v", [], retry_for_s=0.5)
    assert 0.2 <= loop.time() - t0 <= 2.0
    assert 2 <= len(client.requests) <= 5  # backed off 0.1, 0.2, 0.4 s


async def test_retries_end_by_default_after_the_producers_request_timeout() -> None:
    client = _Client(leader=0, script=[kafka_errors.KafkaConnectionError("closed")])
    pool, _ = _pool(client)
    pool._alone["b:1"] = (client, 1, 350)  # a 350 ms request time-out
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(kafka_errors.KafkaConnectionError):
        await pool.send_alone("b:1", TP, b"v", [])
    assert 0.1 <= loop.time() - t0 <= 1.5
    assert 2 <= len(client.requests) <= 4


async def test_an_answer_without_the_partition_is_an_error() -> None:
    pool, _ = _pool(_Client(leader=0, script=[[("t", [(0, 0, 1)])]]))
    with pytest.raises(kafka_errors.KafkaError, match=r"without t\[1\]"):
        await pool.send_alone("b:1", TP, b"v", [])


async def test_no_acknowledgement_asked_none_checked() -> None:
    client = _Client(leader=0, script=[[]])
    pool, fallback = _pool(client, acks=0)
    await pool.send_alone("b:1", TP, b"v", [])
    assert len(client.requests) == 1 and fallback == []


@pytest.mark.parametrize("leader", [None, -1], ids=["unknown-partition", "no-leader"])
async def test_an_unknown_or_leaderless_partition_takes_send(leader: int | None) -> None:
    client = _Client(leader=leader)
    pool, fallback = _pool(client)
    await pool.send_alone("b:1", TP, b"v", HEADERS)
    assert client.requests == []
    assert fallback == [("b:1", TP, b"v", HEADERS)]


async def test_a_bootstrap_without_a_plain_producer_takes_send() -> None:
    pool, fallback = _pool(_Client(leader=0))
    pool._producers["other:1"] = object()  # type: ignore[assignment]  # started, not plain
    await pool.send_alone("other:1", TP, b"v", [])
    assert fallback == [("other:1", TP, b"v", [])]


async def test_the_first_record_starts_the_producer_then_goes_alone() -> None:
    # a fresh pool (a trace sender's first trace message): the producer is started before
    # the record is written, so the record goes alone (compressed) like every later one
    from tracemq._record_batch import codec

    client = _Client(leader=2)
    pool, fallback = _pool(client)
    alone = pool._alone.pop("b:1")
    started: list[str] = []

    async def get(bootstrap: str) -> Any:
        started.append(bootstrap)
        pool._producers[bootstrap] = object()  # type: ignore[assignment]
        pool._alone[bootstrap] = alone
        return pool._producers[bootstrap]

    pool.get = get  # type: ignore[method-assign]
    await pool.send_alone("b:1", TP, b"v" * 3000, [], compression=codec("zstd"))
    assert started == ["b:1"] and fallback == []
    [(node, _)] = client.requests
    assert node == 2


@pytest.mark.parametrize(
    ("kwargs", "plain"),
    [
        ({}, True),
        ({"acks": "all"}, True),
        ({"compression_type": "gzip"}, False),
        ({"enable_idempotence": True}, False),
        ({"transactional_id": "tx"}, False),
    ],
    ids=["plain", "acks-all", "compressed", "idempotent", "transactional"],
)
async def test_which_installed_producers_are_written_to_directly(
    kwargs: dict[str, Any], plain: bool
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", request_timeout_ms=1234, **kwargs)
    try:
        alone = _alone_of(producer)
        if plain:
            assert alone is not None
            client, acks, timeout_ms = alone
            assert client is producer.client and timeout_ms == 1234
            assert acks == (-1 if kwargs.get("acks") == "all" else 1)
        else:
            assert alone is None
    finally:
        await producer.stop()


def test_the_written_request_is_aiokafkas_for_every_version() -> None:
    # send_alone's request writes its body in one buffer when the connection builds it for
    # the version both sides speak: the bytes, header and response parser aiokafka's own
    # ProduceRequest has for that version, and the same record (timestamp too) on every build
    # (a retried request is the same record)
    from aiokafka.protocol.produce import ProduceRequest
    from tracemq._record_batch import one_record_batch

    request = _kafka.OneRecordProduce(-1, 30_000, TopicPartition("tracé", 5), b"v" * 999, HEADERS)
    assert request.required_acks == -1
    batch = one_record_batch(b"v" * 999, HEADERS, request._timestamp_ms)
    for cls in ProduceRequest._CLASSES:
        ours = request.build(cls)
        theirs = ProduceRequest(None, -1, 30_000, [("tracé", [(5, batch)])]).build(cls)
        assert isinstance(ours, cls)
        assert ours.encode() == theirs.encode() == request.build(cls).encode()
        assert ours.build_request_header(7, "c").encode() == (
            theirs.build_request_header(7, "c").encode()
        )
        assert ours.RESPONSE_TYPE is theirs.RESPONSE_TYPE
        [(topic, [(partition, data)])] = ours.topics
        assert (topic, partition, bytes(data)) == ("tracé", 5, batch)
        assert "written" in repr(ours)


@pytest.mark.parametrize("name", ["gzip", "lz4", "zstd"])
async def test_a_compressed_request_carries_the_record_compressed(name: str) -> None:
    from aiokafka.protocol.produce import ProduceRequest
    from tracemq._record_batch import CODEC_IDS, codec

    client = _Client(leader=2)
    pool, fallback = _pool(client)
    value = b"SubAfter\x01DefaultRegion\x01" * 4000
    await pool.send_alone("b:1", TP, value, HEADERS, compression=codec(name))
    assert fallback == []
    [(_, request)] = client.requests
    for cls in ProduceRequest._CLASSES:
        [(_, [(_, data)])] = request.build(cls).topics
        batch = DefaultRecordBatch(bytes(data))
        assert batch.validate_crc()
        # zstd only where Kafka takes it (produce v7+, KIP-110); plain below
        expected = 0 if name == "zstd" and cls.API_VERSION < 7 else CODEC_IDS[name]
        assert batch.compression_type == expected, cls.API_VERSION
        assert len(data) < len(value) // 4 or expected == 0
        [record] = list(batch)
        assert record.value == value and list(record.headers) == HEADERS


async def test_a_retry_sends_the_body_written_once() -> None:
    # a retried request is the same record: the compressed body is not written again
    from aiokafka.protocol.produce import ProduceRequest_v7
    from tracemq._record_batch import codec

    request = _kafka.OneRecordProduce(-1, 1000, TP, b"x" * 10_000, [], codec("zstd"))
    first = request.build(ProduceRequest_v7).encode()
    assert request.build(ProduceRequest_v7).encode() is first
    assert len(first) < 1000


async def test_without_the_hardware_crc_the_record_goes_plain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tracemq._record_batch import codec

    monkeypatch.setattr(_kafka, "HARDWARE_CRC", False)
    client = _Client(leader=1)
    pool, _ = _pool(client)
    await pool.send_alone("b:1", TP, b"v" * 3000, [], compression=codec("zstd"))
    [(_, request)] = client.requests
    [(_, [(_, data)])] = request.build(ProduceRequest_v3).topics
    assert DefaultRecordBatch(bytes(data)).compression_type == 0


class _FreshClient(_Client):
    """A producer's client that has no metadata of the topic until asked (aiokafka's
    ``_wait_on_metadata``); ``found``: whether the answer has the partition's leader."""

    def __init__(self, found: bool, fails: bool = False) -> None:
        super().__init__(leader=None)
        self.asked: list[str] = []
        self.found = found
        self.fails = fails

    async def _wait_on_metadata(self, topic: str) -> set[int]:
        self.asked.append(topic)
        if self.fails:
            raise kafka_errors.UnknownTopicOrPartitionError()
        if self.found:
            self.leader = 4
        return {0, 1}


async def test_a_topic_without_metadata_is_asked_for_once_then_sent_alone() -> None:
    # a fresh trace producer's first trace message: the metadata is asked for, then the
    # request goes straight to the leader (compressed), not through send() (plain)
    from tracemq._record_batch import codec

    client = _FreshClient(found=True)
    pool, fallback = _pool(client)
    await pool.send_alone("b:1", TP, b"v" * 4000, [], compression=codec("zstd"))
    assert client.asked == ["t"] and fallback == []
    [(node, request)] = client.requests
    assert node == 4
    from aiokafka.protocol.produce import ProduceRequest_v7

    [(_, [(_, data)])] = request.build(ProduceRequest_v7).topics
    assert DefaultRecordBatch(bytes(data)).compression_type == 4


@pytest.mark.parametrize("fails", [False, True], ids=["still-no-leader", "metadata-error"])
async def test_still_no_leader_after_asking_takes_send(fails: bool) -> None:
    client = _FreshClient(found=False, fails=fails)
    pool, fallback = _pool(client)
    await pool.send_alone("b:1", TP, b"v", [])
    assert client.asked == ["t"]  # once
    assert client.requests == [] and len(fallback) == 1
