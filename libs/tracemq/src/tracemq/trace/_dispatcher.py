"""Asynchronous trace dispatcher: batches trace contexts and writes them to the trace topic.

One :class:`AsyncTraceDispatcher` runs per traced client (DESIGN §4). The business path only
calls :meth:`AsyncTraceDispatcher.append` (a context) or :meth:`~AsyncTraceDispatcher.append_record`
(a *raw record*: the record's fields in a tuple, what the trace hooks queue, see
``tracemq.trace._codec``), which offer it to a bounded queue and return at once; they never
block and never raise. A worker task drains the queue in batches (``batch_size`` items or
``flush_interval_ms`` after the first one), writes them with the RocketMQ trace codec (the raw
records of a batch at once), groups them by (topic, region), cuts the text into trace messages
of at most ``max_message_size`` bytes and hands each message to a :class:`TraceSender`, at most
``max_in_flight`` at a time, round robin over the writable queues of the trace topic.

Pairs. The SubAfter of a one-message consume joins its SubBefore while that still waits in the
queue or in the batch being gathered (:meth:`~AsyncTraceDispatcher.join_sub_after`): one item
then holds both records (a consumed message costs one queue item and one write instead of two),
and is counted as two contexts everywhere. A SubBefore already written is not held back: the
SubAfter then goes as an item of its own, so a SubBefore is sent as early as before. With the
compiled trace steps the consumer's item is a ``_speedups.ConsumeRecord`` instead of a tuple:
one object per consumed message, its SubBefore, joined in place by the SubAfter until the worker
seals it (taken for good: written or failed); ``write_plan`` writes it, and every other step
sees its raw record (``materialize``), so the trace messages are the same.

Retries and duplicates. A send that times out may still be delivered (a hung trace cluster
answers once it resumes), so a timed-out attempt is not abandoned: it keeps running while the
next attempt starts, and the trace message counts as ``sent`` as soon as *any* of its attempts
is acknowledged, within ``delivery_timeout_ms`` of its first one. Every attempt carries the same
``IDEMPOTENCY_KEY`` header and goes to the same queue (another one only when that queue left the
route), so the collector that owns that queue drops the extra copies (DESIGN §7).

Nothing is lost silently. Every context accepted by ``append`` ends up in exactly one of:

* ``sent``: delivered to the trace topic (``sent_after_retry`` counts the part of them whose
  message needed more than one attempt);
* ``failed``: given up for good: every attempt failed, or none was acknowledged within
  ``delivery_timeout_ms``, or the trace topic had no route, or it could not be encoded, or
  shutdown's deadline passed first.

``retries`` counts attempts started after a failed or timed-out one; a retry is not a failure.

Contexts refused by ``append`` (queue full, or offered after shutdown began) are counted as
``discarded``. Drops are logged as warnings with the count since the previous warning, at
most once per ``warn_interval_s`` seconds per kind (discarded, failed).

Ordering of work is tracked with sequence numbers: the n-th accepted queue item has number n,
and since the queue is FIFO, "everything before n is settled" can be answered from the oldest
unsettled number, which is what :meth:`AsyncTraceDispatcher.flush` waits on (a SubAfter joined
to an older item is settled with it, so a flush waits for it too).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import inspect
import itertools
import operator
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter, Gauge, Histogram

from tracemq.errors import ClientStateError, TraceTopicError
from tracemq.log import get_logger
from tracemq.message import MessageConst
from tracemq.message_id import local_ipv4, new_msg_id
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.trace._codec import (
    COMPILED,
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    KEY_SEPARATOR,
    RAW_SEPARATORS,
    SUB_AFTER,
    SUB_BEFORE,
    SUB_PAIR,
    RawRecord,
    encode,
    raw_context,
    separators,
    split_pair,
    write_records,
)
from tracemq.trace._model import TraceContext

_BORN_HOST = local_ipv4().encode()
#: entries that never go into a KEYS header (as tracemq.trace.encode leaves them out)
_NOT_KEYS = frozenset({None, "", "null"})
#: what the queue holds: a context, or a raw record of a trace hook (tracemq.trace._codec)
_Item = TraceContext | RawRecord
#: U+0001 and U+0002 in UTF-8: a message body's separators, counted once per body
_SEPARATOR_BYTES = b"\x01\x02"
_UNSET = object()
_NEVER = sys.maxsize


def _contexts_of(item: _Item) -> list[TraceContext]:
    """The contexts a queue item stands for (raises ValueError for a malformed raw record)."""
    if type(item) is not tuple:
        assert isinstance(item, TraceContext)
        return [item]
    if item and item[0] is SUB_PAIR:
        return [raw_context(r) for r in split_pair(item)]
    return [raw_context(item)]


def _group_of(item: _Item) -> tuple[Any, Any]:
    """(topic, region) of a queue item: trace messages hold the records of one of them."""
    if type(item) is tuple:
        return (item[1], item[2]) if len(item) > 2 else (None, None)
    assert isinstance(item, TraceContext)
    return (item.trace_beans[0].topic if item.trace_beans else None), item.region_id


def _records_in(items: Iterable[_Item]) -> int:
    """Contexts in these queue items (a pair holds two, as a joined ConsumeRecord does)."""
    count = 0
    for i in items:
        if type(i) is tuple:
            count += 2 if i[0] is SUB_PAIR else 1
        else:
            count += 2 if type(i) is _CONSUME_RECORD and getattr(i, "joined", False) else 1
    return count


_KIND, _TOPIC, _REGION, _MSG_ID, _KEYS = (operator.itemgetter(i) for i in range(5))


#: the text fields of each kind of raw record (tracemq.trace._codec): written as they are.
#: Pubs are not here: their eight text fields in ~136 bytes of text make the column check
#: (116 us per 512 Pubs) dearer than counting the separators of their ~70 KB body (46 us);
#: a consumed message's pair, five fields in ~208 bytes, is the other way round (47 vs 69 us).
_TEXT_FIELDS = {
    SUB_BEFORE: [operator.itemgetter(i) for i in (2, 3, 4, 6, 7)],
    SUB_AFTER: [operator.itemgetter(i) for i in (3, 4, 6, 7)],
    SUB_PAIR: [operator.itemgetter(i) for i in (2, 3, 4, 6, 7)],
}


def _texts_clean(batch: Sequence[RawRecord], fields: list[Any]) -> bool:
    """No text field of these raw records (written, of one kind) holds U+0001 or U+0002:
    a C-level join and search per field instead of a count of every body's separators."""
    try:
        for field_of in fields:
            text = "".join(filter(None, map(field_of, batch)))
            if CONTENT_SPLITOR in text or FIELD_SPLITOR in text:
                return False
    except TypeError:  # a field that is no text (write_records wrote it with str())
        return False
    return True


def _min_seq(job: Sequence[Any]) -> int:
    return int(job[3])


def plan_slices_py(
    batch: list[RawRecord], texts: list[str], first_seq: int, limit: int
) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None:
    """:meth:`AsyncTraceDispatcher._plan` for written raw records of one topic and region,
    cut into messages of at most ``limit`` bytes (the reference: a compiled twin, when built,
    returns the same, see ``_speedups.pyx``)."""
    kinds = list(map(_KIND, batch))
    # records of one kind (the usual batch) have their text fields checked for separators
    # column by column, not the separators of every body counted
    kind_set = set(kinds)
    fields = _TEXT_FIELDS.get(kind_set.pop()) if len(kind_set) == 1 else None
    checked = fields is not None and _texts_clean(batch, fields)
    ends = list(itertools.accumulate(map(len, texts)))  # characters up to each item
    # separators up to each item (only counted when the columns were not checked)
    seps = ends if checked else list(itertools.accumulate(map(RAW_SEPARATORS.__getitem__, kinds)))
    plans: list[tuple[int, int, bytes, set[Any]]] = []
    oversize = 0
    start, n, before, seps_before = 0, len(texts), 0, 0
    while start < n:
        stop = bisect.bisect_right(ends, before + limit, start)
        counted = stop == start
        if counted:  # one item longer than a message: sent alone
            oversize += 1
            stop = start + 1
        value = "".join(texts[start:stop]).encode()
        expected = seps[stop - 1] - seps_before
        if not checked and (len(value) - len(value.translate(None, _SEPARATOR_BYTES)) != expected):
            return None  # a text field holds a separator: find which, the careful way
        if len(value) > ends[stop - 1] - before:  # non-ASCII text
            if stop - start > 1 or len(value) <= limit:
                return None  # measure each record in bytes, the careful way
            if not counted:
                oversize += 1  # (one item, longer in bytes than in characters)
        chunk = batch[start:stop]
        keys = set(map(_MSG_ID, chunk))
        # (the business keys joined and split once: the split of a join on the separator
        # is the splits of its parts, one after the other)
        keys.update(KEY_SEPARATOR.join(filter(None, map(_KEYS, chunk))).split(KEY_SEPARATOR))
        records = stop - start + kinds[start:stop].count(SUB_PAIR)
        plans.append((first_seq + start, records, value, keys))
        before, seps_before, start = ends[stop - 1], seps[stop - 1], stop
    return plans, 0, oversize


def _compiled_plan_slices() -> Any:
    """The compiled :func:`plan_slices_py` (``_speedups.pyx``; it hands what it does not cover
    to the reference), or None when the compiled writer is not in use either."""
    if not COMPILED:
        return None
    from tracemq.trace._speedups import plan_slices

    return functools.partial(plan_slices, fallback=plan_slices_py)


#: the one-group planner in use (compiled when ``tracemq.trace._codec.COMPILED``)
_plan_one_group = _compiled_plan_slices() or plan_slices_py


def _compiled_write_plan() -> Any:
    """``_speedups.write_plan``: ``write_records`` and the one-group planner in one pass for
    the usual batch (None for any other: then those two steps), or None when the compiled
    steps are not in use."""
    if not COMPILED:
        return None
    from tracemq.trace._speedups import write_plan

    return write_plan


#: the one-pass writer and planner of the usual batch, when compiled
_write_plan = _compiled_write_plan()


def _compiled_consume_records() -> tuple[Any, Any, Any]:
    """The compiled consume path's queue item (``_speedups.ConsumeRecord``, queued by
    ``ConsumeTracer``) and its ``seal`` and ``materialize``; Nones when not compiled."""
    if not COMPILED:
        return None, None, None
    try:
        from tracemq.trace._speedups import ConsumeRecord, materialize, seal
    except ImportError:  # pragma: no cover - an extension built before these
        return None, None, None
    return ConsumeRecord, seal, materialize


#: ConsumeRecord is a queue item besides contexts and raw records: the worker seals the ones
#: it takes for good (a SubAfter then goes alone) and hands its raw records (``as_tuple``) to
#: every step but ``write_plan``
_CONSUME_RECORD, _seal, _materialize = _compiled_consume_records()


if TYPE_CHECKING:
    from tracemq._kafka import ProducerPool
    from tracemq.routing.model import QueueRoute, TopicRoute

__all__ = [
    "AsyncTraceDispatcher",
    "KafkaTraceSender",
    "TraceRouteSource",
    "TraceSender",
    "TraceTopicError",
]

log = get_logger("trace")

# ----------------------------------------------------------------------------- metrics

TRACE_APPENDED = Counter(
    "tracemq_trace_appended_total", "Trace contexts accepted by a trace dispatcher", ["group"]
)
TRACE_SENT = Counter(
    "tracemq_trace_sent_total", "Trace contexts delivered to the trace topic", ["group"]
)
TRACE_DISCARDED = Counter(
    "tracemq_trace_discarded_total",
    "Trace contexts refused because the dispatcher queue was full or shutting down",
    ["group"],
)
TRACE_FAILED = Counter(
    "tracemq_trace_failed_total",
    "Trace contexts given up for good: no attempt acknowledged, no route, or unencodable",
    ["group"],
)
TRACE_RETRIES = Counter(
    "tracemq_trace_send_retries_total",
    "Trace message send attempts started after a failed or timed-out one (not failures)",
    ["group", "reason"],
)
TRACE_SENT_AFTER_RETRY = Counter(
    "tracemq_trace_sent_after_retry_total",
    "Trace contexts delivered whose trace message needed more than one attempt",
    ["group"],
)
TRACE_QUEUE_DEPTH = Gauge(
    "tracemq_trace_queue_depth", "Trace contexts waiting in dispatcher queues", ["group"]
)
# The business path must stay cheap: append() touches no metric. The queue depth is read at
# scrape time from the live dispatchers of each group; "appended" is added to its counter by
# the worker, a batch at a time (and at shutdown).
_LIVE: dict[str, weakref.WeakSet[AsyncTraceDispatcher]] = {}


def _depth_of(group: str) -> float:
    return float(sum(len(d._queue) for d in list(_LIVE.get(group, ()))))


TRACE_SEND_SECONDS = Histogram(
    "tracemq_trace_send_seconds",
    "Duration of successful trace message sends",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


# ----------------------------------------------------------------------------- interfaces


class TraceSender(Protocol):
    """Writes one trace message to one queue of the trace topic on one broker."""

    async def send(
        self,
        route: QueueRoute,
        queue_id: int,
        trace_topic: str,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        """Deliver the message; raise on failure (the dispatcher retries and counts)."""
        ...


class TraceRouteSource(Protocol):
    """What the dispatcher needs of a route cache (:class:`tracemq.routing.RouteCache`)."""

    async def get(self, topic: str, *, refresh: bool = False) -> TopicRoute: ...


class KafkaTraceSender:
    """Default :class:`TraceSender`: a Kafka producer per data cluster of the trace brokers.

    Args:
        pool: producers to use. When omitted the sender creates its own pool, dedicated to
            trace data, and closes it in :meth:`close`; a pool passed in is left open.
        compression: the codec of the trace messages' record batches: ``"zstd"`` (the
            default: trace text shrinks ~5 times, for ~1 us of CPU per kB sent, and the trace
            cluster's broker writes and stores a fifth of the bytes), ``"lz4"``, ``"gzip"``
            or ``"none"``. Every Kafka consumer reads them back as they were sent.

    Raises:
        ValueError: an unknown ``compression``.
    """

    def __init__(self, pool: ProducerPool | None = None, *, compression: str = "zstd") -> None:
        # Imported here so that using the trace codec alone does not load aiokafka.
        from aiokafka import TopicPartition

        from tracemq._kafka import MAX_MESSAGE_SIZE, ProducerPool, record_size
        from tracemq._record_batch import codec

        self._compression = codec(compression)

        if pool is None:
            pool = ProducerPool()
            self._owns_pool = True
        else:
            self._owns_pool = False
        self._pool = pool
        self._partition = TopicPartition
        self._record_size = record_size
        self._max_record = MAX_MESSAGE_SIZE

    async def send(
        self,
        route: QueueRoute,
        queue_id: int,
        trace_topic: str,
        value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:
        topic = kafka_topic(route.broker, trace_topic)
        if self._record_size(value, headers) <= self._max_record:
            # a record within what every tracemq producer accepts, in a request of its own
            # (a trace message fills a batch alone): not send_and_wait, which looks up
            # metadata and sizes the record again per call
            await self._pool.send_alone(
                route.data_bootstrap,
                self._partition(topic, queue_id),
                value,
                headers,
                compression=self._compression,
            )
            return
        producer = await self._pool.get(route.data_bootstrap)
        await producer.send_and_wait(topic, value, partition=queue_id, headers=headers)

    async def close(self) -> None:
        if self._owns_pool:
            await self._pool.close()


# ----------------------------------------------------------------------------- internals


@dataclass(eq=False, slots=True)
class _Job:
    """One trace message on its way: the contexts it carries and their lowest number."""

    min_seq: int
    contexts: int
    value: bytes
    headers: list[tuple[str, bytes]]
    settled: bool = False
    attempts: int = 0  # send attempts started


@dataclass(slots=True)
class _Target:
    route: QueueRoute
    queue_id: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.route.broker, self.queue_id)


@dataclass(slots=True)
class _DropReport:
    """Rate-limited warning about dropped contexts of one kind."""

    unreported: int = 0
    last_warned: float = field(default=-1e18)
    reasons: set[str] = field(default_factory=set)


def _targets(route: TopicRoute) -> list[_Target]:
    """Writable queues of every broker, interleaved so consecutive picks change broker."""
    per_broker = [
        [_Target(q, qid) for qid in range(q.write_queues)]
        for q in route.queues
        if q.writable and q.write_queues > 0
    ]
    return [t for column in itertools.zip_longest(*per_broker) for t in column if t is not None]


# ----------------------------------------------------------------------------- dispatcher


def _dispatcher_base() -> type:
    """``_speedups.DispatcherCore`` (the queue state in C fields, which the compiled consume
    path reads without attribute look-ups) when the trace steps are compiled; else object."""
    if not COMPILED:
        return object
    try:
        from tracemq.trace._speedups import DispatcherCore
    except ImportError:  # an extension built before the core was added
        return object
    return DispatcherCore  # type: ignore[no-any-return]


class AsyncTraceDispatcher(_dispatcher_base()):  # type: ignore[misc]
    """Batches trace contexts of one client and sends them to the trace topic.

    Args:
        group: producer or consumer group of the traced client (metrics label, logs).
        route_cache: where the trace topic's route comes from (normally the client's
            :class:`tracemq.routing.RouteCache`).
        trace_topic: topic trace messages are written to.
        customized: ``trace_topic`` was chosen by the user; then :meth:`start` fails when the
            topic has no route instead of only warning.
        queue_size: capacity of the queue between :meth:`append` and the worker, in items (a
            joined SubBefore and SubAfter are one).
        batch_size: most items taken from the queue per batch. 2 048 consumed messages
            (their SubBefore and SubAfter joined) write about one full 512 000-byte message.
            (A consumed message's item is not tracked by the garbage collector with the
            compiled trace steps, so more of them queued costs no collections: the consumer
            and producer benches count the same young collections as with 512.)
        flush_interval_ms: longest wait for a batch to fill after its first context.
        max_message_size: largest trace message body in bytes (UTF-8); a single context
            bigger than this is sent alone (and counted as ``oversize``). 512 000 by default,
            four times RocketMQ's 128 000: the trace cluster's broker pays per produce request
            as well as per byte, and a quarter of the requests cut its CPU per traced message
            2 – 3 times (docs/performance.md, sixteenth client pass); ``128_000`` gives
            RocketMQ's size.
        send_timeout_ms: how long an attempt may go unanswered before the next one starts
            (the unanswered one keeps running: it may still be acknowledged).
        max_send_attempts: attempts per trace message, the first included.
        delivery_timeout_ms: how long after its first attempt a trace message may wait for
            an acknowledgement of any attempt; then it counts as failed.
        max_in_flight: most trace messages being sent at once.
        sender: writes trace messages; a :class:`KafkaTraceSender` with its own producer
            pool by default.
        compression: the default sender's codec of trace messages (see
            :class:`KafkaTraceSender`: ``"zstd"``, ``"lz4"``, ``"gzip"`` or ``"none"``);
            a ``sender`` passed in compresses as it was made to.
    """

    #: First retry delay, doubled on each further retry up to :attr:`retry_backoff_max_s`.
    retry_backoff_s: float = 0.1
    retry_backoff_max_s: float = 2.0
    #: Shortest time between two warnings about dropped contexts (per kind).
    warn_interval_s: float = 5.0

    def __init__(
        self,
        *,
        group: str,
        route_cache: TraceRouteSource,
        trace_topic: str = TRACE_TOPIC,
        customized: bool = False,
        client_id: str | None = None,
        queue_size: int = 16384,
        batch_size: int = 2048,
        flush_interval_ms: int = 100,
        max_message_size: int = 512_000,
        send_timeout_ms: int = 3000,
        max_send_attempts: int = 3,
        max_in_flight: int = 4,
        delivery_timeout_ms: int = 60_000,
        sender: TraceSender | None = None,
        compression: str = "zstd",
    ) -> None:
        for name, value in (
            ("queue_size", queue_size),
            ("batch_size", batch_size),
            ("max_message_size", max_message_size),
            ("send_timeout_ms", send_timeout_ms),
            ("max_send_attempts", max_send_attempts),
            ("max_in_flight", max_in_flight),
            ("delivery_timeout_ms", delivery_timeout_ms),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if flush_interval_ms < 0:
            raise ValueError(f"flush_interval_ms must not be negative, got {flush_interval_ms}")
        if sender is not None:
            from tracemq._record_batch import codec

            codec(compression)  # the name checked even when a sender of its own is given
        self.group = group
        self.trace_topic = trace_topic
        self.customized = customized
        #: header CLIENT_ID of every trace message: which client wrote it (RocketMQ ignores it)
        self._client_id = client_id.encode() if client_id else None
        self._route_cache = route_cache
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_ms / 1000
        self._max_message_size = max_message_size
        self._send_timeout_s = send_timeout_ms / 1000
        self._max_send_attempts = max_send_attempts
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._sender: TraceSender = (
            sender if sender is not None else KafkaTraceSender(compression=compression)
        )

        # A deque, not an asyncio.Queue: one consumer (the worker), woken by _wakeup; the bound
        # is checked by append(). Half the cost per context on the business path.
        self._queue: collections.deque[_Item] = collections.deque()
        self._semaphore = asyncio.Semaphore(max_in_flight)
        self._wakeup = asyncio.Event()
        # Queue length at which an append wakes the worker: 1 while it idles, what its batch
        # still lacks while it gathers (so a batch filling up is not a wake-up per context),
        # "never" once it was woken (so later appends do not ask the event again).
        self._want = 1
        self._worker: asyncio.Task[None] | None = None
        self._send_tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._closed = asyncio.Event()
        self._deadline: float | None = None  # loop time when shutdown gives up

        # Sequence bookkeeping (see the module docstring): numbers count queue items; an item
        # holds one context, or two for a pair (a SubAfter joined to its queued SubBefore).
        self._accepted_seq = 0  # number of items accepted so far
        self._records = 0  # contexts accepted so far (what "appended" counts)
        self._taken_seq = 0  # number of items taken off the queue so far
        self._gathering_seq: int | None = None  # first number of the batch being built
        self._batch: list[_Item] = []  # taken off the queue, not yet in a job
        self._jobs: set[_Job] = set()  # trace messages not yet settled
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._hurry = 0  # flushes in progress: do not wait for batches to fill

        # Round robin over the trace topic's writable queues.
        self._rr = 0
        self._targets_for: tuple[QueueRoute, ...] | None = None
        self._targets: list[_Target] = []

        # Per-instance counts for stats().
        self._sent = 0
        self._sent_messages = 0
        self._discarded = 0
        self._failed = 0
        self._retries = 0
        self._sent_after_retry = 0
        self._oversize = 0
        self._in_flight = 0
        self._latency_last_ms = 0.0
        self._latency_sum_ms = 0.0
        self._latency_count = 0
        self._drop_reports = {"discarded": _DropReport(), "failed": _DropReport()}

        # part of the accepted contexts already added to the "appended" counter
        self._appended_reported = 0
        self._m_appended = TRACE_APPENDED.labels(group=group)
        self._m_sent = TRACE_SENT.labels(group=group)
        self._m_discarded = TRACE_DISCARDED.labels(group=group)
        self._m_failed = TRACE_FAILED.labels(group=group)
        self._m_sent_after_retry = TRACE_SENT_AFTER_RETRY.labels(group=group)
        if group not in _LIVE:
            _LIVE[group] = weakref.WeakSet()
            TRACE_QUEUE_DEPTH.labels(group=group).set_function(functools.partial(_depth_of, group))
        _LIVE[group].add(self)

    # ------------------------------------------------------------------ public API

    async def start(self) -> None:
        """Check the trace topic's route and start the worker.

        Raises:
            TraceTopicError: ``customized`` is set and no broker hosts the trace topic with a
                writable queue. Without ``customized`` this is only a warning, and what is
                appended meanwhile is counted as failed.
            ClientStateError: the dispatcher was already shut down.
        """
        if self._closing:
            raise ClientStateError("the trace dispatcher was shut down; it cannot be restarted")
        if self._worker is not None:
            return
        problem: str | None = None
        try:
            route = await self._route_cache.get(self.trace_topic)
        except Exception as exc:
            problem = f"its route could not be read ({exc.__class__.__name__}: {exc})"
        else:
            if not route.queues:
                problem = "has no route"
            elif not _targets(route):
                problem = "has no writable queue"
        if problem is not None:
            message = (
                f"trace topic {self.trace_topic!r} {problem}: "
                "create it on a trace broker before starting the client"
            )
            if self.customized:
                raise TraceTopicError(message)
            log.warning(
                "trace topic unavailable; traces are dropped until it has a route",
                group=self.group,
                trace_topic=self.trace_topic,
                problem=message,
            )
        self._worker = asyncio.create_task(
            self._run(), name=f"tracemq-trace-dispatcher[{self.group}]"
        )

    def append(self, ctx: TraceContext) -> bool:
        """Offer a context for sending; False (and a discard counted) when it is refused.

        Never blocks and never raises.
        """
        return self.append_record(ctx)  # type: ignore[arg-type]

    def append_record(self, record: RawRecord) -> bool:
        """:meth:`append` for a raw record (``tracemq.trace._codec``: the record's fields in a
        tuple, written by the worker a batch at a time): no TraceContext and no formatting on
        the business path. Its msgId and space-separated keys go into the trace message's KEYS
        header. Never blocks and never raises."""
        # (the business path: inline, no call below it but the append, in the usual case)
        try:
            if self._closing:
                self._discard("dispatcher shut down")
                return False
            queue = self._queue
            if len(queue) >= self._queue_size:
                self._discard("queue full")
                return False
            queue.append(record)
            self._accepted_seq += 1
            self._records += 1
            if len(queue) >= self._want:
                self._want = _NEVER
                self._wakeup.set()
            return True
        except Exception:  # pragma: no cover - defensive: tracing must not break the client
            return False

    def append_sub_before(self, record: RawRecord) -> int:
        """:meth:`append_record` for a SubBefore raw record whose SubAfter may join it
        (:meth:`join_sub_after`): its number, or -1 when it was refused (counted as
        discarded). Never blocks and never raises."""
        try:  # (append_record's body: one call less per consumed message)
            if self._closing:
                self._discard("dispatcher shut down")
                return -1
            queue = self._queue
            if len(queue) >= self._queue_size:
                self._discard("queue full")
                return -1
            queue.append(record)
            seq = self._accepted_seq
            self._accepted_seq = seq + 1
            self._records += 1
            if len(queue) >= self._want:
                self._want = _NEVER
                self._wakeup.set()
            return seq
        except Exception:  # pragma: no cover - defensive: tracing must not break the client
            return -1

    def join_sub_after(self, seq: int, msg_id: str | None, timestamp: int, cost_time: int,
                       success: bool, context_code: int) -> bool:  # fmt: skip
        """Join the SubAfter of message ``msg_id`` to its SubBefore, numbered ``seq``
        (:meth:`append_sub_before`), while the worker has not written that yet: one item
        then carries both records (a SUB_PAIR), one step less on the business path and in
        the worker. The SubAfter's other fields are its SubBefore's (topic, region, keys,
        group, request id). False when it is too late, or the dispatcher is shutting down:
        then append the SubAfter as a record of its own. Never raises."""
        try:
            if self._closing:
                return False
            index = seq - self._taken_seq
            if index >= 0:
                items: Any = self._queue
            else:
                first = self._gathering_seq
                if first is None or seq < first:
                    return False  # written already
                index = seq - first
                items = self._batch
            before = items[index]
            # (a SubBefore raw record has 9 fields: not a context, a pair or another kind)
            if type(before) is not tuple or len(before) != 9 or before[3] is not msg_id:
                return False
            _, topic, region, _, keys, ts, group, rid, retry = before  # (no slice: one tuple)
            items[index] = (SUB_PAIR, topic, region, msg_id, keys, ts, group, rid, retry,
                            timestamp, cost_time, success, context_code)  # fmt: skip
            self._records += 1
            return True
        except Exception:  # pragma: no cover - defensive: tracing must not break the client
            return False

    def append_records(self, records: list[RawRecord]) -> int:
        """:meth:`append_record` for several records at once (one listener call over a batch
        of messages): one enqueue for all of them. Those that do not fit in the queue are
        counted as discarded, as one by one. Returns how many were accepted; never raises."""
        try:
            if self._closing:
                self._discard("dispatcher shut down", len(records))
                return 0
            queue = self._queue
            room = self._queue_size - len(queue)
            taken = records if len(records) <= room else records[: max(room, 0)]
            queue.extend(taken)
            self._accepted_seq += len(taken)
            self._records += len(taken)
            if len(taken) < len(records):
                self._discard("queue full", len(records) - len(taken))
            if len(queue) >= self._want:
                self._want = _NEVER
                self._wakeup.set()
            return len(taken)
        except Exception:  # pragma: no cover - defensive: tracing must not break the client
            return 0

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every context appended before this call is sent or counted as dropped.

        Returns:
            True when that happened within ``timeout_s`` seconds.
        """
        target = self._accepted_seq
        if self._watermark() >= target:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (target, future)
        self._flush_waiters.append(waiter)
        self._hurry += 1
        self._wakeup.set()
        try:
            done, _ = await asyncio.wait({future}, timeout=max(timeout_s, 0.0))
            return bool(done)
        finally:
            self._hurry -= 1
            future.cancel()
            with contextlib.suppress(ValueError):
                self._flush_waiters.remove(waiter)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, send what is queued (within ``timeout_s``), then stop everything.

        When it returns, every context appended before the call is either in the trace topic
        or counted as failed; later appends are counted as discarded. Idempotent: a second
        call waits for the first to finish.
        """
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            loop = asyncio.get_running_loop()
            self._deadline = loop.time() + max(timeout_s, 0.0)
            if self._worker is not None:
                self._wakeup.set()
                await self.flush(timeout_s)
                self._worker.cancel()
                try:
                    await self._worker
                except asyncio.CancelledError:
                    pass
                except Exception as exc:  # pragma: no cover - the worker guards its own work
                    log.warning("trace worker had failed", group=self.group, error=repr(exc))
                tasks = list(self._send_tasks)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                # A send task cancelled before its first step never ran its clean-up.
                for job in list(self._jobs):
                    self._settle(job, ok=False, reason="not sent before shutdown")
            left = len(self._queue)
            records = _records_in(self._queue)
            self._queue.clear()
            self._report_appended()
            if left:
                self._taken_seq += left
                self._fail(records, "not sent before shutdown")
            self._check_waiters()
            for kind in self._drop_reports:
                self._warn_drops(kind, force=True)
            await self._close_sender()
        finally:
            self._closed.set()

    def stats(self) -> dict[str, float]:
        """This dispatcher's counters (contexts unless the name says otherwise)."""
        mean = self._latency_sum_ms / self._latency_count if self._latency_count else 0.0
        return {
            "appended": self._records,
            "sent": self._sent,
            "sent_messages": self._sent_messages,
            "discarded": self._discarded,
            "failed": self._failed,
            "retries": self._retries,
            "sent_after_retry": self._sent_after_retry,
            "oversize": self._oversize,
            "queue_depth": len(self._queue),
            "in_flight": self._in_flight,
            "send_latency_ms_last": self._latency_last_ms,
            "send_latency_ms_mean": mean,
        }

    # ------------------------------------------------------------------ worker

    async def _run(self) -> None:
        pending: list[_Job] = []
        try:
            while True:
                while not self._queue:
                    self._want = 1
                    self._wakeup.clear()
                    await self._wakeup.wait()
                self._gathering_seq = self._taken_seq
                await self._gather()
                try:
                    pending = self._build_jobs(self._batch, self._gathering_seq)
                except Exception as exc:  # a bug must not stop tracing for good
                    log.exception("trace batch could not be prepared", group=self.group)
                    self._fail(_records_in(self._batch), f"{exc.__class__.__name__}: {exc}")
                    pending = []
                if _seal is not None:  # (taken for good: written, or failed)
                    _seal(self._batch)
                self._batch = []
                self._gathering_seq = None
                self._check_waiters()
                while pending:
                    await self._semaphore.acquire()
                    job = pending.pop(0)
                    task = asyncio.create_task(
                        self._send(job), name=f"tracemq-trace-send[{self.group}]"
                    )
                    self._send_tasks.add(task)
                    task.add_done_callback(self._send_tasks.discard)
        finally:
            # Cancelled (shutdown): whatever this task still holds is dropped, and counted.
            if self._batch:
                self._fail(_records_in(self._batch), "not sent before shutdown")
                if _seal is not None:
                    _seal(self._batch)
                self._batch = []
            self._gathering_seq = None
            for job in pending:
                self._settle(job, ok=False, reason="not sent before shutdown")
            self._check_waiters()

    async def _gather(self) -> None:
        """Take contexts into ``self._batch`` until it is full or the flush interval passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._flush_interval_s
        batch = self._batch
        queue = self._queue
        while True:
            taken = min(len(queue), self._batch_size - len(batch))
            if taken > 0:
                # (C-level copies: all of the queue, the excess put back in front)
                size = len(batch)
                batch.extend(queue)
                queue.clear()
                if len(batch) > size + taken:
                    queue.extend(batch[size + taken :])
                    del batch[size + taken :]
                self._taken_seq += taken
                self._report_appended()
            if len(batch) >= self._batch_size or self._hurry or self._closing:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._want = self._batch_size - len(batch)
            self._wakeup.clear()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
            finally:
                self._want = 1

    def _build_jobs(self, batch: list[_Item], first_seq: int) -> list[_Job]:
        """Encode a batch into trace messages, grouped by (topic, region) and size-bounded.

        A message's body is its records concatenated and its KEYS header their msgIds and
        business keys, exactly what ``encode_many`` produces over them. The raw records of the
        trace hooks are written all at once (``write_records``) and checked once per message
        body (its separator count: a text field holding one shifts it); a body that fails
        that, or that non-ASCII text makes longer in bytes than the limit allows, sends the
        whole batch the careful way (:meth:`_build_jobs_checked`: each record checked and
        measured on its own, a bad one counted as failed), which writes the same messages
        for valid records. The usual batch — raw records of one topic and region, ASCII text
        without a separator in a field — is written and cut in one compiled pass
        (``_speedups.write_plan``), with the same result as those steps.
        """
        planned = None
        if _write_plan is not None:  # the usual batch in one pass (None: any other)
            planned = _write_plan(batch, first_seq, self._max_message_size)
        if planned is None:
            raws = batch if _materialize is None else _materialize(batch)
            texts = write_records(raws)
            planned = self._plan(raws, texts, first_seq)
            if planned is None:
                planned = self._plan_checked(raws, texts, first_seq)
        plans, bad, oversize = planned
        held = self._tail_to_hold(batch, plans, first_seq, bad)
        if held:
            # (the tail's items go back to the front of the queue, their numbers with them:
            # the queue still starts at _taken_seq, and a SubAfter can still join them)
            plans.pop()
            self._queue.extendleft(reversed(batch[-held:]))
            del batch[-held:]
            self._taken_seq -= held
        self._oversize += oversize
        jobs = [self._job(min_seq, count, value, keys) for min_seq, count, value, keys in plans]
        self._jobs.update(jobs)
        if bad:
            self._fail(bad, "trace context could not be encoded")
        return jobs

    def _tail_to_hold(
        self,
        batch: list[_Item],
        plans: list[tuple[int, int, bytes, set[Any]]],
        first_seq: int,
        bad: int,
    ) -> int:
        """How many items at the end of a full batch to put back in the queue instead of
        sending them now: those of its last trace message when that is a short tail (less than
        half of ``max_message_size``) behind a message cut at the limit. They then open the
        next batch's first message, so a steady stream of records fills its messages instead
        of sending a full one and a small one per batch: every trace message costs the client
        ~250 us of send work however short (aiokafka's request, the send task, the
        acknowledgement). Only while more records are coming (a full batch) and nobody waits
        (no flush, no shutdown), and only within the queue's bound; an item goes back at
        most once (it is at the front of the next batch, in its first message)."""
        if bad or len(plans) < 2 or self._hurry or self._closing or len(batch) < self._batch_size:
            return 0
        min_seq, records, value, _ = plans[-1]
        if len(value) * 2 >= self._max_message_size:
            return 0
        tail = batch[min_seq - first_seq :]
        # the last message holds exactly the batch's last items (not so when the batch mixes
        # topics or regions and another group's records come after its first one)
        if _records_in(tail) != records or len(self._queue) + len(tail) > self._queue_size:
            return 0
        return len(tail)

    def _plan(
        self, batch: list[_Item], texts: list[str | None], first_seq: int
    ) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None:
        """The trace messages of a batch the fast way: (min_seq, records, body, keys) each,
        the unencodable count and the oversize count; None when the careful way is needed."""
        if None not in texts:
            # The usual batch: raw records, all written. When they also share their topic and
            # region (a client's records mostly do), its messages are slices of it, cut and
            # keyed by C-level passes instead of a Python step per record.
            raws: list[Any] = batch
            if len(set(map(_TOPIC, raws))) == 1 and len(set(map(_REGION, raws))) == 1:
                return self._plan_slices(batch, texts, first_seq)  # type: ignore[arg-type]
        return self._plan_loop(batch, texts, first_seq)

    def _plan_slices(
        self, batch: list[RawRecord], texts: list[str], first_seq: int
    ) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None:
        """:meth:`_plan` for written raw records of one topic and region."""
        return _plan_one_group(batch, texts, first_seq, self._max_message_size)

    def _plan_loop(
        self, batch: list[_Item], texts: list[str | None], first_seq: int
    ) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None:
        """:meth:`_plan` for any batch, a Python step per item."""
        # (the message being filled lives in locals; the per-(topic, region) table is touched
        # only when the topic or region changes)
        open_jobs: dict[tuple[Any, Any], tuple[Any, ...]] = {}
        closed: list[tuple[Any, ...]] = []
        bad = oversize = 0
        limit = self._max_message_size
        sep = KEY_SEPARATOR
        seps_of = RAW_SEPARATORS
        pair = SUB_PAIR
        seq = first_seq - 1
        cur_topic: Any = _UNSET
        cur_region: Any = _UNSET
        parts: list[str] = []
        keys: set[Any] = set()
        size = seps = min_seq = records = 0
        for item, data in zip(batch, texts):  # noqa: B905 - one text per item
            seq += 1
            weight = 1
            if data is not None:  # a raw record, written
                kind = item[0]  # type: ignore[index]
                topic = item[1]  # type: ignore[index]
                region = item[2]  # type: ignore[index]
                item_keys: Any = None
                item_seps = seps_of[kind]
                if kind is pair:
                    weight = 2
            elif type(item) is tuple:
                return None  # a raw record the fast writer refused: the careful way names it
            else:  # a TraceContext: checked
                try:
                    texts_keys = [encode(ctx) for ctx in _contexts_of(item)]
                except Exception as exc:
                    bad += _records_in((item,))
                    log.debug(
                        "trace context could not be encoded", group=self.group, error=str(exc)
                    )
                    continue
                topic, region = _group_of(item)
                data = "".join(t.data for t in texts_keys)
                item_keys = set().union(*(t.keys for t in texts_keys))
                item_seps = separators(data)
                weight = len(texts_keys)
            if topic != cur_topic or region != cur_region:
                if cur_topic is not _UNSET:
                    open_jobs[(cur_topic, cur_region)] = (parts, keys, size, min_seq, seps, records)
                cur_topic, cur_region = topic, region
                held = open_jobs.pop((topic, region), None)
                if held is None:
                    parts, keys, size, min_seq, seps, records = [], set(), 0, seq, 0, 0
                else:
                    parts, keys, size, min_seq, seps, records = held
            length = len(data)  # characters: bytes too while the body is ASCII (checked below)
            if size + length > limit:
                if length > limit:
                    oversize += 1
                if parts:
                    closed.append((parts, keys, size, min_seq, seps, records))
                    parts, keys, size, min_seq, seps, records = [], set(), 0, seq, 0, 0
            parts.append(data)
            size += length
            seps += item_seps
            records += weight
            if item_keys is None:
                keys.add(item[3])  # type: ignore[index]
                business = item[4]  # type: ignore[index]
                if business:
                    keys.update(business.split(sep))
            else:
                keys |= item_keys
        if cur_topic is not _UNSET:
            closed.append((parts, keys, size, min_seq, seps, records))
        closed.extend(open_jobs.values())
        closed.sort(key=_min_seq)  # (in the order of their first record)
        plans: list[tuple[int, int, bytes, set[Any]]] = []
        for parts, keys, size, min_seq, seps, records in closed:
            value = "".join(parts).encode()
            if len(value) - len(value.translate(None, _SEPARATOR_BYTES)) != seps:
                return None  # a text field holds a separator: find which, the careful way
            if len(value) > limit:
                if len(parts) > 1:
                    return None  # non-ASCII text: measure each record in bytes
                if size <= limit:
                    oversize += 1  # (one item, longer in bytes than in characters)
            plans.append((min_seq, records, value, keys))
        return plans, bad, oversize

    def _plan_checked(
        self, batch: list[_Item], texts: list[str | None], first_seq: int
    ) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int]:
        """:meth:`_plan` one record at a time: each one checked by the checked encoder and
        its UTF-8 size measured; a record that cannot be encoded is counted (and logged), not
        sent. (A pair's two records are two records here.)"""
        open_jobs: dict[tuple[Any, Any], list[Any]] = {}
        closed: list[list[Any]] = []
        bad = oversize = 0
        limit = self._max_message_size
        seq = first_seq - 1
        for item in batch:
            seq += 1
            topic, region = _group_of(item)
            encoded = []
            for ctx in _contexts_of(item):
                try:
                    encoded.append(encode(ctx))
                except Exception as exc:
                    bad += 1
                    log.debug(
                        "trace context could not be encoded", group=self.group, error=str(exc)
                    )
            if not encoded:
                continue
            # (a pair's two records stay together, as the fast way keeps them)
            data = "".join(e.data for e in encoded)
            length = len(data.encode())
            if length > limit:
                oversize += 1
            job = open_jobs.get((topic, region))
            if job is None:
                job = open_jobs[(topic, region)] = [[], set(), 0, seq, 0]
            elif job[2] + length > limit:
                closed.append(job[:])
                job[0], job[1], job[2], job[3], job[4] = [], set(), 0, seq, 0
            job[0].append(data)
            job[2] += length
            job[4] += len(encoded)
            for e in encoded:
                job[1] |= e.keys
        closed.extend(open_jobs.values())
        closed.sort(key=_min_seq)
        plans = [
            (min_seq, records, "".join(parts).encode(), keys)
            for parts, keys, _size, min_seq, records in closed
        ]
        return plans, bad, oversize

    def _job(self, min_seq: int, contexts: int, value: bytes, keys: set[Any]) -> _Job:
        # The same as encode_many() over the chunk: records concatenated, keys unioned (the
        # hooks' raw keys unfiltered until here: what encode() leaves out, left out once).
        keys.difference_update(_NOT_KEYS)
        headers: list[tuple[str, bytes]] = []
        if keys:
            # (in the set's order, as RocketMQ joins its HashSet: an index of words, order
            # means nothing to it; sorting ~1 000 keys cost ~70 us per message, ~0.15 us per
            # consumed message)
            headers.append(("KEYS", " ".join(keys).encode()))
        msg_id = new_msg_id().encode()
        headers.append(("UNIQ_KEY", msg_id))
        # The job keeps these headers for every attempt: one key per trace message.
        headers.append((MessageConst.IDEMPOTENCY_KEY, msg_id))
        # The sending host: the collector shows it as the client host of records whose wire
        # format has no clientHost field (RocketMQ's dashboard uses the trace message's born host).
        headers.append(("BORN_HOST", _BORN_HOST))
        if self._client_id is not None:
            # The client of every record in it (one dispatcher per client): the trace view
            # tells apart two clients of one host, which RocketMQ's format cannot.
            headers.append(("CLIENT_ID", self._client_id))
        return _Job(min_seq=min_seq, contexts=contexts, value=value, headers=headers)

    # ------------------------------------------------------------------ sending

    async def _send(self, job: _Job) -> None:
        """Deliver one trace message: attempts to one queue until one is acknowledged.

        An attempt unanswered after ``send_timeout_ms`` is left running (the cluster may only
        be slow, and then it is delivered) while the next one starts; the first
        acknowledgement of any attempt settles the message as sent. It fails for good only
        when every attempt ended in an error, or none was acknowledged within
        ``delivery_timeout_ms`` of the first, or the trace topic has no route.
        """
        self._in_flight += 1
        loop = asyncio.get_running_loop()
        attempts: dict[asyncio.Future[None], float] = {}  # running attempt → its start
        try:
            give_up_at = loop.time() + self._delivery_timeout_s
            target: _Target | None = None
            no_route = False  # the route has no writable queue: no attempt can be made
            error = ""
            launch = True
            while True:
                if launch:
                    launch = False
                    if job.attempts:
                        self._count_retry(error)
                    try:
                        picked = await self._pick(target)
                    except Exception as exc:  # the route could not be read: a failed attempt
                        job.attempts += 1
                        error = f"trace route unavailable: {exc.__class__.__name__}: {exc}"
                    else:
                        no_route = picked is None
                        if picked is None:
                            error = f"trace topic {self.trace_topic!r} has no route"
                        else:
                            target = picked
                            job.attempts += 1
                            attempt = asyncio.ensure_future(
                                self._sender.send(
                                    target.route, target.queue_id, self.trace_topic, job.value,
                                    job.headers,
                                )
                            )  # fmt: skip
                            attempts[attempt] = time.perf_counter()
                more = not no_route and job.attempts < self._max_send_attempts
                if not attempts:  # every attempt so far failed
                    delay = self._backoff(job.attempts)
                    if not more or not self._may_retry(delay):
                        self._settle(job, ok=False, reason=error)
                        return
                    await asyncio.sleep(delay)
                    launch = True
                    continue
                remaining = give_up_at - loop.time()
                if remaining <= 0:
                    self._settle(job, ok=False, reason=f"no acknowledgement in time ({error})")
                    return
                wait_s = min(self._send_timeout_s, remaining) if more else remaining
                acked, failure = await self._first_ack(attempts, wait_s)
                if acked:
                    self._settle(job, ok=True)
                    return
                error = failure or "send timed out"
                delay = self._backoff(job.attempts)
                if more and self._may_retry(delay):
                    # Back off, still listening to the attempts that are running.
                    if attempts:
                        acked, failure = await self._first_ack(attempts, delay)
                        if acked:
                            self._settle(job, ok=True)
                            return
                        error = failure or error
                    else:
                        await asyncio.sleep(delay)
                    launch = True
        finally:
            for running in attempts:
                running.cancel()
            if attempts:
                await asyncio.gather(*attempts, return_exceptions=True)
            self._in_flight -= 1
            self._semaphore.release()
            if not job.settled:  # cancelled by shutdown
                self._settle(job, ok=False, reason="not sent before shutdown")

    async def _first_ack(
        self, attempts: dict[asyncio.Future[None], float], timeout_s: float
    ) -> tuple[bool, str | None]:
        """Wait up to ``timeout_s`` for attempts to end; drop the ended ones from ``attempts``.

        Returns (an attempt was acknowledged, the error of one that failed, or None).
        """
        done, _ = await asyncio.wait(
            attempts, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        failure: str | None = None
        acked = False
        for attempt in done:
            began = attempts.pop(attempt)
            exc = attempt.exception()
            if exc is None:
                if not acked:
                    acked = True
                    elapsed = time.perf_counter() - began
                    self._latency_last_ms = elapsed * 1000
                    self._latency_sum_ms += elapsed * 1000
                    self._latency_count += 1
                    TRACE_SEND_SECONDS.observe(elapsed)
            else:
                failure = (
                    "send timed out"
                    if isinstance(exc, TimeoutError)
                    else f"{exc.__class__.__name__}: {exc}"
                )
        return acked, failure

    def _backoff(self, attempts: int) -> float:
        return float(
            min(self.retry_backoff_s * 2 ** max(attempts - 1, 0), self.retry_backoff_max_s)
        )

    def _count_retry(self, error: str) -> None:
        reason = "timeout" if error == "send timed out" else "error"
        self._retries += 1
        TRACE_RETRIES.labels(group=self.group, reason=reason).inc()
        log.debug("trace send retried", group=self.group, reason=reason, error=error)

    async def _pick(self, previous: _Target | None) -> _Target | None:
        """The queue of the next attempt: round robin for a first attempt; a retry goes to
        the queue of the previous attempt while it is writable, so that every copy of one
        trace message reaches the collector that owns that queue (and dedupes them)."""
        route = await self._route_cache.get(self.trace_topic)
        if route.queues is not self._targets_for:
            self._targets_for = route.queues
            self._targets = _targets(route)
        targets = self._targets
        if not targets:
            return None
        if previous is not None:
            same = next((t for t in targets if t.key == previous.key), None)
            if same is not None:
                return same
        target = targets[self._rr % len(targets)]
        self._rr += 1
        return target

    def _may_retry(self, delay: float) -> bool:
        if len(self._queue) * 4 > self._queue_size * 3:
            return False  # more than 3/4 full: make room rather than insist
        if self._deadline is not None:
            return asyncio.get_running_loop().time() + delay < self._deadline
        return True

    async def _close_sender(self) -> None:
        close = getattr(self._sender, "close", None)
        if close is None:
            return
        try:
            result = close()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            log.warning("trace sender did not close cleanly", group=self.group, error=str(exc))

    # ------------------------------------------------------------------ bookkeeping

    def _settle(self, job: _Job, *, ok: bool, reason: str = "") -> None:
        if job.settled:
            return
        job.settled = True
        self._jobs.discard(job)
        if ok:
            self._sent += job.contexts
            self._sent_messages += 1
            self._m_sent.inc(job.contexts)
            if job.attempts > 1:
                self._sent_after_retry += job.contexts
                self._m_sent_after_retry.inc(job.contexts)
        else:
            self._fail(job.contexts, reason)
        self._check_waiters()

    def _report_appended(self) -> None:
        delta = self._records - self._appended_reported
        if delta:
            self._appended_reported = self._records
            self._m_appended.inc(delta)

    def _fail(self, count: int, reason: str) -> None:
        if count <= 0:
            return
        self._failed += count
        self._m_failed.inc(count)
        self._note_drop("failed", count, reason)

    def _discard(self, reason: str, count: int = 1) -> None:
        self._discarded += count
        self._m_discarded.inc(count)
        self._note_drop("discarded", count, reason)

    def _note_drop(self, kind: str, count: int, reason: str) -> None:
        report = self._drop_reports[kind]
        report.unreported += count
        if len(report.reasons) < 8:
            report.reasons.add(reason)
        self._warn_drops(kind)

    def _warn_drops(self, kind: str, *, force: bool = False) -> None:
        report = self._drop_reports[kind]
        if not report.unreported:
            return
        now = time.monotonic()
        if not force and now - report.last_warned < self.warn_interval_s:
            return
        log.warning(
            f"trace contexts {kind}",
            group=self.group,
            trace_topic=self.trace_topic,
            count=report.unreported,
            reasons=sorted(report.reasons),
        )
        report.unreported = 0
        report.reasons.clear()
        report.last_warned = now

    def _watermark(self) -> int:
        """Every context numbered below this is settled."""
        low = self._taken_seq
        if self._gathering_seq is not None:
            low = min(low, self._gathering_seq)
        for job in self._jobs:
            low = min(low, job.min_seq)
        return low

    def _check_waiters(self) -> None:
        if not self._flush_waiters:
            return
        mark = self._watermark()
        for target, future in self._flush_waiters:
            if target <= mark and not future.done():
                future.set_result(None)
