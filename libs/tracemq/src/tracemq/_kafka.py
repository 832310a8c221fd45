"""Kafka producers shared by one client, one per data cluster (brokers on one cluster share it),
and the one message size limit every part of tracemq agrees on."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import RecordMetadata, TopicPartition

from tracemq import kafka_security
from tracemq._record_batch import (
    CODEC_IDS,
    HARDWARE_CRC,
    ZSTD_MIN_PRODUCE_VERSION,
    Codec,
    produce_request_body,
)

try:  # send_alone() writes its produce request itself
    from aiokafka.protocol.produce import ProduceRequest
except ImportError:  # another aiokafka: send_alone() takes send()
    ProduceRequest = None

try:  # send_now() hands aiokafka the future factory of the producer's loop (see there)
    from aiokafka.producer.message_accumulator import MessageBatch

    _APPEND_TAKES_FACTORY = "_create_future" in inspect.signature(MessageBatch.append).parameters
except (ImportError, AttributeError, TypeError, ValueError):  # another aiokafka
    _APPEND_TAKES_FACTORY = False

#: The largest message a producer sends (RocketMQ's default maxMessageSize, 4 MiB), counted as
#: the transport counts it: the serialized Kafka record with its body, its properties and the
#: headers tracemq adds (msgId, born time, placement headers of delayed and half messages).
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: Room above MAX_MESSAGE_SIZE for the headers tracemq adds when it re-writes a message it has
#: accepted (send-back to %RETRY%, move to %DLQ%, scheduled and transactional delivery): a
#: message the producer let through must never be refused on its way later.
REWRITE_HEADROOM = 64 * 1024
#: What every tracemq Kafka producer (``max_request_size``) and every topic tracemq creates
#: (``max.message.bytes``) accept: aiokafka's own default is 1 MiB, below MAX_MESSAGE_SIZE.
TRANSPORT_MAX_BYTES = MAX_MESSAGE_SIZE + REWRITE_HEADROOM


def record_size(value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> int:
    """Upper bound of the record's size as a one-record batch: the figure aiokafka compares
    with ``max_request_size``, so a record within TRANSPORT_MAX_BYTES is never refused by it."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(None, value, list(headers)))


async def enqueue(
    producer: AIOKafkaProducer,
    tp: TopicPartition,
    value: bytes,
    headers: list[tuple[str, bytes]],
) -> asyncio.Future[RecordMetadata]:
    """``producer.send(tp.topic, value, partition=tp.partition, headers=headers)`` for a record
    tracemq has already checked: what ``send`` redoes for every record (a metadata look-up
    building two sets of partitions, serializers, a size estimate) is skipped once the topic's
    partition is known. Anything else — unknown metadata, a transactional producer, an aiokafka
    without these internals — takes ``send`` itself, so behaviour never depends on the shortcut.

    The caller guarantees the record is within ``max_request_size`` (tracemq's
    ``max_message_size`` check, see :func:`record_size`) and has no key.
    """
    acc = getattr(producer, "_message_accumulator", None)
    client = getattr(producer, "client", None)
    partitions = getattr(getattr(client, "cluster", None), "_partitions", None)
    known = partitions.get(tp.topic) if type(partitions) is dict else None
    if (
        acc is None
        or known is None
        or tp.partition not in known
        or getattr(producer, "_txn_manager", True) is not None
    ):
        return await producer.send(tp.topic, value, partition=tp.partition, headers=headers)
    return await acc.add_message(
        tp, None, value, producer._request_timeout_ms / 1000, timestamp_ms=None, headers=headers
    )


#: The AIOKafkaProducer settings of every tracemq producer (the benches give raw aiokafka the
#: same ones, to compare like with like).
PRODUCER_DEFAULTS: dict[str, Any] = {
    "linger_ms": 5,
    "request_timeout_ms": 10_000,
    "max_batch_size": 256 * 1024,
    "max_request_size": TRANSPORT_MAX_BYTES,
}


class _Written:
    """The struct of a produce request whose body is written already (``_body``): what
    aiokafka's connection asks of a request struct — its header, its bytes, its response's
    parser — with the fields of the struct class it was made for (the batch a view into the
    body), and ``encode()`` the body as it is."""

    _body: bytes

    def encode(self) -> bytes:
        return self._body

    def __repr__(self) -> str:
        return f"{type(self).__name__}(written, {len(self._body)} bytes)"


_WRITTEN: dict[Any, Any] = {}


def _written_struct(struct_class: Any, body: bytes, batch_at: int, *fields: Any) -> Any:
    """An instance of ``struct_class`` (a ProduceRequest_vN) whose ``encode()`` is ``body``."""
    cls = _WRITTEN.get(struct_class)
    if cls is None:
        cls = _WRITTEN[struct_class] = type(struct_class.__name__, (_Written, struct_class), {})
    topic, partition = fields[-2:]
    topics = [(topic, [(partition, memoryview(body)[batch_at:])])]
    args = (*fields[:-2], topics)
    struct = cls(*args) if struct_class.API_VERSION < 3 else cls(None, *args)
    struct._body = body
    return struct


#: send_alone()'s produce request class (None with an aiokafka without ProduceRequest)
OneRecordProduce: Any = None

if ProduceRequest is not None:

    class _OneRecordProduce(ProduceRequest):  # type: ignore[misc,valid-type]
        """send_alone()'s produce request: one record with no key in a batch of its own, for
        one partition, without a transactional id. aiokafka's connection picks the version
        both sides speak and asks :meth:`build` for it; the body is then written in one
        buffer (:func:`tracemq._record_batch.produce_request_body`: aiokafka's encoder
        writes the same bytes, copying the batch once per level of nesting). The timestamp
        is taken here, once: a retried request carries the same record, and the body written
        for a version is kept for the retries.

        ``compression`` (:func:`tracemq._record_batch.codec`) compresses the batch; zstd only
        in a request of version 7 or later (KIP-110: older brokers refuse it), the batch goes
        uncompressed in an older one."""

        def __init__(
            self,
            required_acks: int,
            timeout_ms: int,
            tp: TopicPartition,
            value: bytes,
            headers: Sequence[tuple[str, bytes | None]],
            compression: Codec | None = None,
        ) -> None:
            super().__init__(None, required_acks, timeout_ms, [])
            self._tp = tp
            self._value = value
            self._headers = headers
            self._compression = compression
            self._timestamp_ms = time.time_ns() // 1_000_000
            self._written: tuple[int, bytes, int] | None = None  # version, body, batch_at

        def build(self, request_struct_class: Any) -> Any:
            version = request_struct_class.API_VERSION
            written = self._written
            if written is None or written[0] != version:
                compression = self._compression
                if (
                    compression is not None
                    and compression[0] == CODEC_IDS["zstd"]
                    and version < ZSTD_MIN_PRODUCE_VERSION
                ):
                    compression = None
                body, batch_at = produce_request_body(
                    version, self._required_acks, self._timeout, self._tp.topic,
                    self._tp.partition, self._value, self._headers, self._timestamp_ms,
                    compression,
                )  # fmt: skip
                written = self._written = (version, body, batch_at)
            _, body, batch_at = written
            return _written_struct(
                request_struct_class, body, batch_at, self._required_acks, self._timeout,
                self._tp.topic, self._tp.partition,
            )  # fmt: skip

    OneRecordProduce = _OneRecordProduce


def _alone_of(producer: Any) -> tuple[Any, int, int] | None:
    """(client, acks, request timeout ms) of a producer whose records
    :meth:`ProducerPool.send_alone` may write itself: no compression, no idempotence or
    transactions, the aiokafka internals it uses present; else None."""
    acks = getattr(getattr(producer, "_sender", None), "_acks", None)
    client = getattr(producer, "client", None)
    timeout_ms = getattr(producer, "_request_timeout_ms", None)
    if (
        ProduceRequest is None
        or getattr(producer, "_compression_type", "unknown") is not None
        or getattr(producer, "_txn_manager", True) is not None
        or type(acks) is not int
        or type(timeout_ms) is not int
        or not callable(getattr(client, "send", None))
        or not callable(getattr(getattr(client, "cluster", None), "leader_for_partition", None))
    ):
        return None
    return client, acks, timeout_ms


def _check_produced(response: Any, tp: TopicPartition) -> None:
    """Raise the error of ``tp``'s answer in a produce response, if any; an answer without
    ``tp`` is an error too."""
    for topic, partitions in response.topics:
        if topic != tp.topic:
            continue
        for answer in partitions:
            if answer[0] != tp.partition:
                continue
            code = answer[1]
            if code == 0:
                return
            raise kafka_errors.for_code(code)(f"produce to {tp.topic}[{tp.partition}] refused")
    raise kafka_errors.KafkaError(f"produce response without {tp.topic}[{tp.partition}]")


#: send_alone()'s back-off between attempts after a retriable error (aiokafka's
#: retry_backoff_ms is 100 ms), doubled up to the maximum.
_RETRY_BACKOFF_S = 0.1
_RETRY_BACKOFF_MAX_S = 1.0


class ProducerPool:
    """Lazily started :class:`AIOKafkaProducer` per bootstrap address."""

    def __init__(self, **producer_kwargs: Any) -> None:
        self._kwargs = {**PRODUCER_DEFAULTS, **producer_kwargs}
        self._producers: dict[str, AIOKafkaProducer] = {}
        # bootstrap -> (accumulator, cluster metadata, enqueue timeout, the producer loop's
        # create_future): see send() and send_now()
        self._fast: dict[str, tuple[Any, Any, float, Any]] = {}
        self._starting: dict[str, asyncio.Task[AIOKafkaProducer]] = {}
        # bootstrap -> (client, acks, request timeout ms): see send_alone()
        self._alone: dict[str, tuple[Any, int, int]] = {}

    def started(self, bootstrap: str) -> AIOKafkaProducer | None:
        """The producer of ``bootstrap`` if it is started (no await on the send path)."""
        return self._producers.get(bootstrap)

    def send_now(
        self, bootstrap: str, tp: TopicPartition, value: bytes, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[RecordMetadata] | None:
        """:meth:`send` without a coroutine, for the usual record: appended to its partition's
        open batch (one is opened if there is none) by the same steps as aiokafka's
        ``add_message``, short of its wait. None, having done nothing, when anything would
        take more than that — no started producer yet, an unknown partition, a closed or
        failed accumulator, a full batch — then :meth:`send` the record, which waits as
        aiokafka does (a full batch that refused the record is closed already; ``add_message``
        finds it so and waits for it to drain). Three coroutine frames less per send: the
        producer's own, this pool's and aiokafka's. The acknowledgement's future comes from
        the producer's loop directly: aiokafka's own factory looks the running loop up per
        record, and CPython's look-up makes a ``getpid()`` system call each time."""
        fast = self._fast.get(bootstrap)
        if fast is None:
            return None
        acc = fast[0]
        known = fast[1]._partitions.get(tp.topic)  # replaced, not mutated, on updates
        if known is None or tp.partition not in known or acc._closed or acc._exception is not None:
            return None
        pending = acc._batches.get(tp)
        batch = pending[-1] if pending else acc._append_batch(acc.create_builder(), tp)
        return batch.append(None, value, None, fast[3], headers=headers)  # type: ignore[no-any-return]

    async def send(
        self, bootstrap: str, tp: TopicPartition, value: bytes, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[RecordMetadata]:
        """:func:`enqueue` a checked record on the producer of ``bootstrap`` (started on first
        use); the future of its acknowledgement. The common case is one call into aiokafka."""
        fast = self._fast.get(bootstrap)
        if fast is not None:
            acc, cluster, timeout_s, _ = fast
            known = cluster._partitions.get(tp.topic)  # replaced, not mutated, on updates
            if known is not None and tp.partition in known:
                return await acc.add_message(  # type: ignore[no-any-return]
                    tp, None, value, timeout_s, timestamp_ms=None, headers=headers
                )
        producer = self._producers.get(bootstrap) or await self.get(bootstrap)
        return await enqueue(producer, tp, value, headers)

    async def send_alone(
        self,
        bootstrap: str,
        tp: TopicPartition,
        value: bytes,
        headers: list[tuple[str, bytes]],
        *,
        retry_for_s: float | None = None,
        compression: Codec | None = None,
    ) -> None:
        """Send one checked record in a produce request of its own and wait for its
        acknowledgement: for large records sent one at a time, each awaited (trace messages).
        The request goes straight to the partition's leader on the producer's own
        (authenticated) connection, past the accumulator and the sender loop, which batch
        small records and cost ~100 us of CPU per request (a task, futures, a batch drained
        and wrapped, the response walked back to it). The batch is the one aiokafka writes
        for the record alone (magic 2, no compression, no producer id), with a hardware
        CRC-32C when the CPU has one (:mod:`tracemq._record_batch`), compressed with
        ``compression`` if given (see ``OneRecordProduce``; without the hardware CRC and on
        the other paths below the record goes uncompressed).

        As aiokafka's sender does for a batch, a retriable error (a connection closed or a
        request timed out — a hung broker —, a leader moved: metadata is asked for) is
        retried after a back-off for up to ``retry_for_s`` (by default the producer's request
        time-out, aiokafka's lifetime of a batch); then, or at once for any other error, it
        is raised. A topic the producer has no metadata of yet is asked for first. Anything
        this cannot do — no plain producer started (compression, idempotence and transactions
        take aiokafka's path), an unknown or leaderless partition — takes :meth:`send` and
        waits for its acknowledgement (uncompressed)."""
        alone = self._alone.get(bootstrap)
        if alone is None and bootstrap not in self._producers:
            # the pool's first record for this cluster: its producer started first, so that
            # the record goes the way of every later one (compressed, on its own)
            await self.get(bootstrap)
            alone = self._alone.get(bootstrap)
        if alone is None:
            ack = await self.send(bootstrap, tp, value, headers)
            await ack
            return
        client, acks, timeout_ms = alone
        request: Any
        if HARDWARE_CRC:
            request = OneRecordProduce(acks, timeout_ms, tp, value, headers, compression)
        else:
            builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, TRANSPORT_MAX_BYTES)
            builder.append(0, timestamp=None, key=None, value=value, headers=headers)
            batch = builder.build()
            request = ProduceRequest(None, acks, timeout_ms, [(tp.topic, [(tp.partition, batch)])])
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + (timeout_ms / 1000 if retry_for_s is None else retry_for_s)
        backoff = _RETRY_BACKOFF_S
        # a topic the producer has no metadata of yet (its first record: a trace topic is
        # known to the client's routes, not to a fresh producer): asked for once, as
        # aiokafka's send() does, so the first trace message goes this way too
        wait_metadata: Any = getattr(client, "_wait_on_metadata", None)
        while True:
            node = client.cluster.leader_for_partition(tp)
            if (node is None or node < 0) and wait_metadata is not None:
                ask, wait_metadata = wait_metadata, None
                with contextlib.suppress(kafka_errors.KafkaError):
                    await ask(tp.topic)
                continue
            if node is None or node < 0:
                ack = await self.send(bootstrap, tp, value, headers)
                await ack
                return
            try:
                response = await client.send(node, request)
                if acks != 0:
                    _check_produced(response, tp)
                return
            except kafka_errors.KafkaError as exc:
                if not exc.retriable or loop.time() + backoff > give_up_at:
                    raise
                if exc.invalid_metadata:
                    client.force_metadata_update()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _RETRY_BACKOFF_MAX_S)

    async def get(self, bootstrap: str) -> AIOKafkaProducer:
        p = self._producers.get(bootstrap)
        if p is not None:
            return p
        task = self._starting.get(bootstrap)
        if task is None:
            task = asyncio.ensure_future(self._start(bootstrap))
            self._starting[bootstrap] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._starting.pop(bootstrap, None)

    async def _start(self, bootstrap: str) -> AIOKafkaProducer:
        p = AIOKafkaProducer(
            bootstrap_servers=bootstrap, **kafka_security.client_kwargs(bootstrap), **self._kwargs
        )
        try:
            await kafka_security.start(p, bootstrap)
        except BaseException:
            await p.stop()
            raise
        self._producers[bootstrap] = p
        cluster = getattr(getattr(p, "client", None), "cluster", None)
        acc = getattr(p, "_message_accumulator", None)
        if (
            acc is not None
            and type(getattr(cluster, "_partitions", None)) is dict
            and getattr(p, "_txn_manager", True) is None
            and _APPEND_TAKES_FACTORY
            and isinstance(getattr(p, "_loop", None), asyncio.AbstractEventLoop)
            and all(
                hasattr(acc, name)
                for name in ("_batches", "_closed", "_exception", "_append_batch", "create_builder")
            )
        ):  # what enqueue() checks per record, checked once: see send() and send_now()
            self._fast[bootstrap] = (
                acc,
                cluster,
                p._request_timeout_ms / 1000,
                p._loop.create_future,
            )
            alone = _alone_of(p)
            if alone is not None:
                self._alone[bootstrap] = alone
        return p

    async def close(self) -> None:
        for t in self._starting.values():
            t.cancel()
        producers, self._producers = list(self._producers.values()), {}
        self._fast.clear()
        self._alone.clear()
        for p in producers:
            await p.stop()
