"""Forwarding stored records to their real topic and queue, exactly once across broker crashes.

The schedule service (a due delayed message or retry) and the transaction service (a
committed half message) both copy a record from a system topic to ``<broker>.<REAL_TOPIC>``
partition ``REAL_QID``. The transport has no idempotent producer and no transactions (Tansu),
so a crash between the target's acknowledgement and the service's progress write would
deliver the message again after the restart. The protocol that prevents it:

1. :meth:`Forwarder.prepare` records an *intent*: the source coordinates about to be forwarded
   (``coords``), and for every target partition its end offset *before* the forward.
2. The service persists the intent (its journal) and only then produces. Every forwarded copy
   carries its source coordinates in a header (``SCHEDULE_OFFSET`` / ``TRAN_HALF_OFFSET``).
3. Once every target has acknowledged, the service records its progress (at once, or together
   with its next intent) and the intent is dropped.
4. A restarted service that finds an intent calls :meth:`Forwarder.find`, which reads each
   target partition from the recorded end offset to its current end and returns the
   coordinates already there; only the others are forwarded again.

The same check runs before re-sending after an ambiguous failure (a time-out may hide a
successful write), so the service's own retries never duplicate either. What remains is the
Kafka client's internal retry of a batch whose acknowledgement was lost, which only an
idempotent producer (not available on Tansu) removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord, RecordMetadata
from tracemq import kafka_security
from tracemq.log import get_logger
from tracemq.message import MessageConst
from tracemq.naming import MAX_QUEUES, validate_topic
from tracemq.protocol import show
from tracemq.transport import TRANSPORT_MAX_BYTES

log = get_logger("broker.forward")

_QID_DIGITS = len(str(MAX_QUEUES))

#: Backoff between attempts when the data cluster refuses a forward (never given up).
RETRY_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)


@dataclass(slots=True)
class Outgoing:
    """One record to forward; ``coord`` is its source coordinate (the header value)."""

    coord: str
    ktopic: str
    partition: int
    value: bytes | None
    headers: list[tuple[str, bytes]]
    #: epoch ms before which the record must not be written (a delayed message's due time)
    not_before_ms: int = 0
    metadata: RecordMetadata | None = field(default=None)


def headers_dict(rec: ConsumerRecord[bytes, bytes]) -> dict[str, str]:
    out = {}
    for k, v in rec.headers or ():
        out[k] = v.decode(errors="replace") if isinstance(v, bytes | bytearray) else str(v)
    return out


def parse_target(headers: dict[str, str]) -> tuple[str, int]:
    """``(REAL_TOPIC, REAL_QID)`` of a record to forward; ValueError naming what is wrong.

    Anyone who can write the system topic controls these headers, so nothing but
    :class:`ValueError` leaves here whatever they hold (property-tested)."""
    topic = headers.get(MessageConst.REAL_TOPIC)
    if not topic:
        raise ValueError("no REAL_TOPIC property")
    validate_topic(topic)
    raw = headers.get(MessageConst.REAL_QID, "")
    # plain ASCII digits only: int() would also take spaces, "_" and other scripts' digits,
    # and refuses (with its own message) strings of more than 4300 digits
    negative = raw.startswith("-")
    digits = raw[1:] if negative else raw
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"REAL_QID {show(raw)} is not an integer")
    if negative:
        raise ValueError(f"REAL_QID {show(raw)} is negative")
    qid = int(raw) if len(raw) <= _QID_DIGITS else MAX_QUEUES
    if qid >= MAX_QUEUES:
        raise ValueError(f"REAL_QID {show(raw)} is not a queue id (0..{MAX_QUEUES - 1})")
    return topic, qid


def merge_intents(intents: list[dict[str, Any]]) -> dict[str, Any]:
    """One intent covering several: every coordinate, each target from its lowest start."""
    starts: dict[tuple[str, int], int] = {}
    for it in intents:
        for t, p, o in it.get("starts", []):
            key = (t, int(p))
            starts[key] = min(int(o), starts.get(key, int(o)))
    return {
        "ts": min((it.get("ts", 0) for it in intents), default=0),
        "coords": [c for it in intents for c in it.get("coords", [])],
        "starts": [[t, p, o] for (t, p), o in sorted(starts.items())],
    }


def intent_targets(intent: dict[str, Any]) -> dict[TopicPartition, int]:
    return {TopicPartition(t, int(p)): int(o) for t, p, o in intent.get("starts", [])}


class Forwarder:
    """Produces forwarded copies on a broker's data cluster and checks what already arrived."""

    def __init__(self, bootstrap: str, header: str, *, name: str) -> None:
        self.bootstrap = bootstrap
        self.header = header
        self.name = name
        self.producer: AIOKafkaProducer | None = None
        self._probe: AIOKafkaConsumer | None = None
        self._probe_lock = asyncio.Lock()

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            **kafka_security.client_kwargs(self.bootstrap),
            linger_ms=0,
            acks="all",
            request_timeout_ms=10_000,
            max_request_size=TRANSPORT_MAX_BYTES,  # what the client producers accepted
        )
        await kafka_security.start(self.producer, self.bootstrap)
        self._probe = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            **kafka_security.client_kwargs(self.bootstrap),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await kafka_security.start(self._probe, self.bootstrap)

    async def stop(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self.producer.stop()
        if self._probe is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._probe.stop(), 10)

    async def prepare(self, items: list[Outgoing]) -> dict[str, Any]:
        """The intent of forwarding ``items`` (JSON-ready): coordinates and target end offsets."""
        assert self._probe is not None
        tps = sorted({TopicPartition(i.ktopic, i.partition) for i in items})
        async with self._probe_lock:
            ends = await self._probe.end_offsets(tps) if tps else {}
        return {
            "ts": int(time.time() * 1000),
            "coords": [i.coord for i in items],
            "starts": [[tp.topic, tp.partition, int(ends[tp])] for tp in tps],
        }

    async def send(self, items: list[Outgoing], intent: dict[str, Any]) -> None:
        """Forward every item; retry with backoff until all are acknowledged (never drops).

        Before a retry, items that in fact arrived (a time-out hides a success) are found in
        their target and not sent again. An item is not written before its ``not_before_ms``:
        the intent can be recorded ahead of the due time, off the critical path.
        """
        assert self.producer is not None
        todo = list(items)
        attempt = 0
        while todo:
            futs = []
            for it in todo:
                wait_ms = it.not_before_ms - time.time() * 1000
                if wait_ms > 0:
                    await asyncio.sleep(wait_ms / 1000)
                try:
                    futs.append(
                        await self.producer.send(
                            it.ktopic, it.value, partition=it.partition, headers=it.headers
                        )
                    )
                except Exception as exc:  # e.g. the metadata of the target is not there yet
                    futs.append(_failed(exc))
            results = await asyncio.gather(*futs, return_exceptions=True)
            failed = []
            for it, res in zip(todo, results, strict=True):
                if isinstance(res, BaseException):
                    if isinstance(res, asyncio.CancelledError):
                        raise res
                    failed.append((it, res))
                else:
                    it.metadata = res
            if not failed:
                return
            delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
            attempt += 1
            log.warning(
                "forward failed; retrying",
                service=self.name,
                failed=len(failed),
                attempt=attempt,
                error=repr(failed[0][1]),
            )
            await asyncio.sleep(delay)
            wanted = {it.coord for it, _ in failed}
            while True:  # re-sending blind could duplicate: first learn what arrived
                try:
                    arrived = await self.find(intent, wanted)
                    break
                except Exception as exc:
                    log.warning("could not read the targets back; retrying", error=repr(exc))
                    await asyncio.sleep(delay)
            todo = [it for it, _ in failed if it.coord not in arrived]

    async def find(self, intent: dict[str, Any], coords: set[str] | None = None) -> set[str]:
        """Coordinates of ``intent`` (or only ``coords``) already present in their targets."""
        assert self._probe is not None
        wanted = set(intent.get("coords", [])) if coords is None else set(coords)
        starts = intent_targets(intent)
        if not wanted or not starts:
            return set()
        found: set[str] = set()
        header = self.header
        async with self._probe_lock:
            probe = self._probe
            existing = set(await probe.topics())
            tps = [tp for tp in starts if tp.topic in existing]
            if not tps:
                return set()
            ends = await probe.end_offsets(tps)
            tps = [tp for tp in tps if ends[tp] > starts[tp]]
            if not tps:
                return set()
            probe.assign(tps)
            for tp in tps:
                probe.seek(tp, starts[tp])
            deadline = asyncio.get_running_loop().time() + 60
            try:
                while tps and not wanted <= found:
                    if asyncio.get_running_loop().time() > deadline:
                        raise TimeoutError(f"reading {tps} back did not finish in 60 s")
                    batch = await probe.getmany(*tps, timeout_ms=500)
                    for recs in batch.values():
                        for r in recs:
                            for k, v in r.headers or ():
                                if k == header:
                                    value = v.decode(errors="replace")
                                    if value in wanted:
                                        found.add(value)
                    tps = [tp for tp in tps if await probe.position(tp) < ends[tp]]
            finally:
                probe.assign([])
        return found


def _failed(exc: BaseException) -> asyncio.Future[RecordMetadata]:
    fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
    fut.set_exception(exc)
    return fut
