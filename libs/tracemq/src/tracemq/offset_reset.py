"""Positions outside a partition's log: detected, reset to a policy, counted — never silent.

A consumer's offset can point past the end of its partition's log (the Kafka cluster lost its
data, as the in-memory embedded Tansu does on a restart, or a topic was deleted and created
again) or before its start (retention deleted what a stopped consumer had not read). Kafka then
answers a fetch with ``OFFSET_OUT_OF_RANGE`` and aiokafka resets the position by its
``auto_offset_reset`` without telling anyone; Tansu answers a fetch past the log end with no
data and no error at all, so the consumer waits there until new records pass the old offset,
skipping every one before. Both lose messages silently.

:class:`OffsetGuard` is the one mechanism every tracemq Kafka consumer of records that matter
uses (the collector's trace ingest and :class:`~tracemq.consumer.PushConsumer`, both wired
through :mod:`tracemq.kafka.fleet`, and :class:`~tracemq.consumer.LitePullConsumer`). Its
consumer runs with ``auto_offset_reset="none"`` (:data:`KAFKA_AUTO_OFFSET_RESET`) so that
nothing moves a position behind its back, and it checks positions against the log's start and
end offsets:

* on assignment (:meth:`OffsetGuard.assigned`): a partition starts at the position its owner
  knows (the collector's store), else at the group's committed offset, else at the offset this
  process last committed (the group's offsets are lost with the data on a restarted in-memory
  cluster), else it is *fresh* and the owner positions it (consume-from-where) — once: aiokafka's
  fetcher, finding no commit either, may raise ``NoOffsetForPartitionError`` from a fetch while
  the rebalance callback is still reading the commit, and a partition positioned (or being
  positioned) by one path is left alone by the other (sought twice, aiokafka delivered the
  head of the partition twice: duplicates on a rebalance);
* when a partition stayed idle for ``idle_check_s`` (:meth:`OffsetGuard.getmany`): an idle
  partition is where a position past the end hides;
* on ``OffsetOutOfRangeError`` from a fetch (real Kafka).

A broker's end offset is not always the truth: Tansu reports the base offset of the partition's
last record batch + 1 (measured: 30 records at offsets 20-49 in one batch, end offset 21). So a
position past the reported end is confirmed by a probe — a fetch of the record before it with a
consumer of its own (``bootstrap``) — before it counts as past the end; an unsure probe resets
nothing (the next check looks again).

Its start offset is not always the truth either: when the first record batches of a new
partition are written concurrently (two producers), Tansu may report the second batch's base
offset as the log start for good, with the first batch still in the log and fetchable
(measured: start 1 or 13 with records at 0). Every tracemq consumer that meant "from the start"
asked aiokafka's ``seek_to_beginning`` and so skipped that first batch — a PushConsumer with
FIRST_OFFSET in every group alike, the collector a trace partition's first traces. A reported
start above 0 is therefore confirmed by a fetch from offset 0 with the probe's consumer
(:func:`log_starts`, :meth:`OffsetGuard.seek_to_start`): Kafka answers OFFSET_OUT_OF_RANGE
below a real log start (retention), Tansu returns the records it still holds.

A position outside ``[log start, log end]`` is reset to the policy's end of the log
(:class:`OffsetResetPolicy`, ``earliest`` by default: nothing that is still in the log is
skipped), and the reset is counted in the owner's Prometheus counter (labels ``topic``,
``partition``), logged with its coordinates, kept in :attr:`OffsetGuard.resets`, handed to the
owner's ``on_reset`` callback (which clears its own per-partition state first) and *committed*:
the group's committed offset is moved back to the new position at once, so that a rebalance
or a restart does not resume from the stale offset and skip the log again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, NoOffsetForPartitionError, OffsetOutOfRangeError

from tracemq import kafka_security
from tracemq.log import get_logger

log = get_logger("offset_reset")

#: what a guarded consumer passes to aiokafka: aiokafka must never reset a position itself
KAFKA_AUTO_OFFSET_RESET = "none"
#: how long a partition may return nothing before its position is checked against its log
IDLE_CHECK_S = 5.0
#: bound on one offsets request, so that a check never holds the fetch loop for long
CHECK_TIMEOUT_S = 5.0
#: how long a probe fetch waits for the record before a suspect position
PROBE_WAIT_MS = 1000


class OffsetResetPolicy(StrEnum):
    """Where a position outside the log resumes."""

    EARLIEST = "earliest"  # the log's first offset: what is still there is not skipped
    LATEST = "latest"  # the log's end: only records written from now on


class ResetReason(StrEnum):
    PAST_END = "past_end"  # beyond the log end: the cluster lost data or the topic is new
    BEFORE_START = "before_start"  # before the log start: retention deleted unread records
    OUT_OF_RANGE = "out_of_range"  # the broker said so (OFFSET_OUT_OF_RANGE on a fetch)


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """One reset: ``position`` was outside ``[log_start, log_end]``; consumption resumed at
    ``target``."""

    topic: str
    partition: int
    position: int
    target: int
    log_start: int
    log_end: int
    reason: ResetReason
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "from": self.position,
            "to": self.target,
            "log_start": self.log_start,
            "log_end": self.log_end,
            "reason": self.reason.value,
            "at_ms": self.at_ms,
        }


def classify(position: int, log_start: int, log_end: int) -> ResetReason | None:
    """Why ``position`` needs a reset, or None when it is inside the log (the end included)."""
    if position > log_end:
        return ResetReason.PAST_END
    if position < log_start:
        return ResetReason.BEFORE_START
    return None


#: what a probe's fetch returns on Kafka's OFFSET_OUT_OF_RANGE (by identity: proof of absence)
_OUT_OF_RANGE: list[Any] = []


class LogProbe:
    """Learns whether a partition's log holds an offset by fetching it, with a consumer of its
    own (no group): the truth where a broker's reported end offset is not (Tansu)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._consumer: Any = None
        # One probe at a time: its consumer is positioned by seek, and a check from the
        # rebalance callback ran beside the fetch loop's idle check — each read the record the
        # other had sought (a position past the end taken for inside the log, for good).
        self._lock = asyncio.Lock()
        #: the log start confirmed per partition: (the start the broker reported, the real one)
        self._starts: dict[TopicPartition, tuple[int, int]] = {}

    async def reaches(
        self, tp: TopicPartition, offset: int, control: int | None = None
    ) -> bool | None:
        """See :meth:`_reaches` (one probe at a time)."""
        async with self._lock:
            return await self._reaches(tp, offset, control)

    async def _reaches(self, tp: TopicPartition, offset: int, control: int | None) -> bool | None:
        """True: the log holds ``offset`` or a later record; False: it ends before; None:
        unsure (the cluster did not answer).

        A fetch that brings nothing is no proof on its own: a slow broker or a connection
        still being made returns nothing within the wait too (under load the probe then reset
        positions that were inside the log — a collector re-read its partition under a new
        base). With ``control`` (an offset the log is known to hold) nothing counts as False
        only if the same probe then does fetch the control record; else the answer is None.
        Kafka's OFFSET_OUT_OF_RANGE is proof on its own."""
        records = await self._fetch(tp, offset, 1)
        if records is None:
            return None
        if records:
            return True
        if records is _OUT_OF_RANGE or control is None:
            return False
        seen = await self._fetch(tp, control, 1)
        if not seen or seen is _OUT_OF_RANGE:
            log.warning(
                "a position past the reported log end is unconfirmed (the probe did not fetch "
                "the record the log holds at its end either); kept, checked again later",
                tp=str(tp), offset=offset, control=control,
                control_answer="error" if seen is None else "nothing",
            )  # fmt: skip
            # its consumer may be what is broken (e.g. metadata from before a cluster
            # restart): the next probe starts a new one
            await self.close()
            return None
        return False

    async def end(self, tp: TopicPartition, reported: int) -> int:
        """The partition's real end offset: a fetch from the last record the broker counts
        returns its whole batch (``reported`` where the fetch fails: a lower bound)."""
        exact = await self.exact_end(tp, reported)
        return reported if exact is None else exact

    async def exact_end(self, tp: TopicPartition, reported: int) -> int | None:
        """:meth:`end`, or None when the probe could not read the last batch (an error, or
        nothing within its wait: a slow broker, a connection still being made). ``reported``
        is then only a lower bound: the batch's records after its first are not counted, and
        a reader waiting for "everything written so far" must not take it for the end."""
        if reported <= 0:
            return reported
        async with self._lock:
            records = await self._fetch(tp, reported - 1, 1_000_000)
            if records is None:
                return None
            if records is _OUT_OF_RANGE:
                return reported  # the log no longer holds that record: nothing past it either
            if not records:
                await self.close()  # the next probe starts a consumer of its own
                return None
        return max([reported, *(r.offset + 1 for r in records)])

    async def exact_start(self, tp: TopicPartition, reported: int) -> int:
        """The partition's real log start: ``reported`` unless a fetch from offset 0 returns
        records before it (Tansu; module docstring). ``reported`` when the fetch is out of
        range (Kafka: retention passed), brings nothing, or fails."""
        if reported <= 0:
            return reported
        known = self._starts.get(tp)
        if known is not None:  # (the idle check asks every few seconds: one fetch is enough)
            was, start = known
            if was == reported:
                return start
            if start == was and reported > was:  # it stood before: a log start only moves on
                self._starts[tp] = (reported, reported)
                return reported
        async with self._lock:
            records = await self._fetch(tp, 0, 1)
        if records is None:  # failed: the broker's word, not remembered (ask again next time)
            return reported
        # out of range (Kafka) or nothing: the broker's word stands; else the records' start
        start = min([reported, *(int(r.offset) for r in records)])
        self._starts[tp] = (reported, start)
        return start

    async def _fetch(self, tp: TopicPartition, offset: int, n: int) -> list[Any] | None:
        try:
            if self._consumer is None:
                from aiokafka import AIOKafkaConsumer

                c = AIOKafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    **kafka_security.client_kwargs(self.bootstrap),
                    enable_auto_commit=False,
                    auto_offset_reset=KAFKA_AUTO_OFFSET_RESET,
                    fetch_max_wait_ms=100,
                    request_timeout_ms=int(CHECK_TIMEOUT_S * 1000),
                )
                self._consumer = c
                await asyncio.wait_for(kafka_security.start(c, self.bootstrap), CHECK_TIMEOUT_S)
            self._consumer.assign([tp])
            self._consumer.seek(tp, offset)
            data = await asyncio.wait_for(
                self._consumer.getmany(tp, timeout_ms=PROBE_WAIT_MS, max_records=n),
                CHECK_TIMEOUT_S,
            )
        except OffsetOutOfRangeError:
            return _OUT_OF_RANGE
        except Exception as exc:  # noqa: BLE001 - unsure: the caller decides
            log.debug("offset probe failed", tp=str(tp), error=repr(exc))
            await self.close()
            return None
        return list(data.get(tp, ()))

    async def close(self) -> None:
        c, self._consumer = self._consumer, None
        if c is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.stop(), CHECK_TIMEOUT_S)


OnReset = Callable[[TopicPartition, OffsetReset], Awaitable[None] | None]
OnFresh = Callable[[list[TopicPartition]], Awaitable[None]]


class OffsetGuard:
    """Keeps one aiokafka consumer's positions inside its partitions' logs (module docstring).

    ``counter``: a Prometheus counter labelled ``(*labels, topic, partition)``; ``on_reset``:
    called (awaited if async) before the consumer moves, so the owner can drop state that
    belongs to the old position; ``on_fresh``: positions partitions with no known start
    (default: the policy's end of the log); ``commit``: move the group's committed offset to
    the reset position (off for a consumer without a group).
    """

    def __init__(
        self,
        consumer: Any,
        *,
        policy: OffsetResetPolicy | str = OffsetResetPolicy.EARLIEST,
        counter: Any = None,
        labels: tuple[str, ...] = (),
        on_reset: OnReset | None = None,
        on_fresh: OnFresh | None = None,
        commit: bool = True,
        idle_check_s: float = IDLE_CHECK_S,
        context: dict[str, Any] | None = None,
        bootstrap: str | None = None,
    ) -> None:
        self.consumer = consumer
        self.policy = OffsetResetPolicy(policy)
        self.counter = counter
        self.labels = labels
        self.on_reset = on_reset
        self.on_fresh = on_fresh
        self.commit = commit
        self.idle_check_s = idle_check_s
        self.context = context or {}
        #: the latest reset of each partition
        self.resets: dict[tuple[str, int], OffsetReset] = {}
        self.total = 0
        self._remembered: dict[TopicPartition, int] = {}
        self._active: set[TopicPartition] = set()
        self._last_check = time.monotonic()
        self._probe = LogProbe(bootstrap) if bootstrap else None
        #: fresh partitions being positioned (by the assignment or the fetch loop), each with
        #: the event set when that is done
        self._positioning: dict[TopicPartition, asyncio.Event] = {}
        # (position, reported end) a probe found inside the log: not probed again
        self._inside: dict[TopicPartition, tuple[int, int]] = {}

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.close()

    # -- what the owner tells the guard ----------------------------------------------------
    def remember(self, offsets: dict[TopicPartition, int]) -> None:
        """Offsets the owner committed: where to resume if the group's offsets are lost."""
        self._remembered.update(offsets)

    def stats(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "partitions": [r.to_dict() for _, r in sorted(self.resets.items())],
        }

    # -- the checks ------------------------------------------------------------------------
    async def assigned(
        self, tps: Iterable[TopicPartition], starts: dict[TopicPartition, int] | None = None
    ) -> list[OffsetReset]:
        """Position newly assigned partitions (see the module docstring); returns the resets."""
        tps = list(tps)
        if not tps:
            return []
        starts = dict(starts or {})
        fresh: list[TopicPartition] = []
        # A group commit inside the log is where aiokafka starts the partition anyway: it is
        # only checked, not sought. Seeking it from the rebalance callback too made a queue
        # start before its previous owner's final commit on Tansu (duplicates on every
        # rebalance of a PushConsumer).
        group: dict[TopicPartition, int] = {}
        for tp in tps:
            if tp in starts:
                continue
            committed = await self._committed(tp)
            if committed is not None:
                group[tp] = committed
            elif (remembered := self._remembered.get(tp)) is not None:
                starts[tp] = remembered
            else:
                fresh.append(tp)
        resets: list[OffsetReset] = []
        if starts:
            resets = await self._check(starts, seek_inside=True)
        if group:
            resets += await self._check(group, seek_inside=False)
        if fresh:
            await self._position_fresh(fresh)
        return resets

    async def check(self, tps: Iterable[TopicPartition] | None = None) -> list[OffsetReset]:
        """Compare the current positions of ``tps`` (default: all assigned) with their logs."""
        tps = list(self.consumer.assignment() if tps is None else tps)
        positions: dict[TopicPartition, int] = {}
        # one deadline for all: a position not known yet (the cluster is down) waits
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        for tp in tps:
            try:
                left = max(0.0, deadline - time.monotonic())
                positions[tp] = await asyncio.wait_for(self.consumer.position(tp), left)
            except (KafkaError, TimeoutError, AssertionError) as exc:
                # not assigned any more, or no position yet: nothing to check now
                log.debug("no position to check", tp=str(tp), error=repr(exc), **self.context)
        return await self._check(positions, seek_inside=False) if positions else []

    async def getmany(self, *partitions: TopicPartition, **kw: Any) -> dict[Any, Any]:
        """``consumer.getmany`` that turns out-of-range errors into counted resets and checks
        idle partitions every ``idle_check_s``; never raises either error.

        The idle check runs *before* the fetch: the records are returned the moment aiokafka
        hands them over, with no suspension in between, so an owner that binds them to its
        per-partition state before its own first ``await`` binds them to the assignment they
        were fetched under (a rebalance runs in aiokafka's coordinator task, concurrently)."""
        if time.monotonic() - self._last_check >= self.idle_check_s:
            await self.check_idle()
        try:
            data: dict[Any, Any] = await self.consumer.getmany(*partitions, **kw)
        except OffsetOutOfRangeError as exc:
            await self._out_of_range(exc)
            data = {}
        except NoOffsetForPartitionError as exc:
            tps = [tp for tp in exc.args if isinstance(tp, TopicPartition)]
            if tps:
                await self._position_fresh(tps)
            data = {}
        self._active.update(tp for tp, records in data.items() if records)
        return data

    async def check_idle(self) -> list[OffsetReset]:
        """Check the assigned, unpaused partitions that returned nothing since the last call."""
        self._last_check = time.monotonic()
        try:
            idle = set(self.consumer.assignment()) - self._active - set(self.consumer.paused())
        except Exception:  # noqa: BLE001 - not subscribed (yet): nothing to check
            idle = set()
        self._active.clear()
        if not idle:
            return []
        try:
            return await self.check(sorted(idle))
        except (KafkaError, OSError, TimeoutError) as exc:  # the cluster is down: next time
            log.debug("idle offset check failed", error=repr(exc), **self.context)
            return []

    # -- internals -------------------------------------------------------------------------
    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp``; None when there is none or it is unreadable."""
        return await self._committed(tp)

    async def _committed(self, tp: TopicPartition) -> int | None:
        try:
            committed = await asyncio.wait_for(self.consumer.committed(tp), CHECK_TIMEOUT_S)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("committed offset unreadable", tp=str(tp), error=repr(exc), **self.context)
            return None
        return None if committed is None or committed < 0 else int(committed)

    async def _bounds(
        self, tps: list[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        start = await log_starts(self.consumer, tps, self._probe)
        end = await asyncio.wait_for(self.consumer.end_offsets(tps), CHECK_TIMEOUT_S)
        return start, end

    async def seek_to_start(self, *tps: TopicPartition) -> None:
        """``seek_to_beginning`` at the confirmed log start (:func:`log_starts`): what "from
        the first offset" means for every guarded consumer."""
        if not tps:
            return
        starts = await log_starts(self.consumer, list(tps), self._probe)
        for tp in tps:
            self.consumer.seek(tp, starts[tp])

    async def _out_of_range(self, exc: OffsetOutOfRangeError) -> None:
        offsets = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        tps = [tp for tp in offsets if isinstance(tp, TopicPartition)]
        if not tps:  # nothing to act on: check everything assigned
            await self.check()
            return
        try:
            start, end = await self._bounds(tps)
        except (KafkaError, OSError, TimeoutError) as err:
            log.warning("offsets unreadable after out-of-range", error=repr(err), **self.context)
            return
        for tp in tps:
            pos = int(offsets[tp])
            reason = classify(pos, start[tp], end[tp]) or ResetReason.OUT_OF_RANGE
            await self._reset(tp, pos, start[tp], end[tp], reason)

    async def _check(
        self, positions: dict[TopicPartition, int], *, seek_inside: bool
    ) -> list[OffsetReset]:
        tps = list(positions)
        try:
            start, end = await self._bounds(tps)
        except (KafkaError, OSError, TimeoutError) as exc:
            if seek_inside:  # at assignment: start where known; the idle check follows up
                for tp, pos in positions.items():
                    self._seek(tp, pos)
            log.warning("log offsets unreadable", error=repr(exc), **self.context)
            return []
        resets = []
        for tp, pos in positions.items():
            if tp not in start or tp not in end:
                continue
            reason = classify(pos, start[tp], end[tp])
            if reason == ResetReason.PAST_END and await self._log_reaches(
                tp, pos, end[tp], start[tp]
            ):
                reason = None  # the broker understated its end offset
            if reason is None:
                if seek_inside:
                    self._seek(tp, pos)
                continue
            r = await self._reset(tp, pos, start[tp], end[tp], reason)
            if r is not None:
                resets.append(r)
        return resets

    async def _reset(
        self, tp: TopicPartition, pos: int, log_start: int, log_end: int, reason: ResetReason
    ) -> OffsetReset | None:
        target = log_start if self.policy == OffsetResetPolicy.EARLIEST else log_end
        r = OffsetReset(
            tp.topic, tp.partition, pos, target, log_start, log_end, reason, int(time.time() * 1000)
        )
        if self.on_reset is not None:
            try:
                res = self.on_reset(tp, r)
                if inspect.isawaitable(res):
                    await res
            except Exception as exc:  # the position stays; the next check tries again
                log.error(
                    "offset reset not applied", topic=tp.topic, partition=tp.partition,
                    error=repr(exc), **self.context,
                )  # fmt: skip
                return None
        if not self._seek(tp, target):
            return None
        self.total += 1
        self.resets[(tp.topic, tp.partition)] = r
        self._remembered[tp] = target
        if self.counter is not None:
            self.counter.labels(*self.labels, tp.topic, str(tp.partition)).inc()
        log.warning(
            "offset outside the partition's log; consumption reset",
            topic=tp.topic,
            partition=tp.partition,
            offset=pos,
            reset_to=target,
            log_start=log_start,
            log_end=log_end,
            reason=reason.value,
            policy=self.policy.value,
            **self.context,
        )
        if self.commit:
            # The group's offset moves back too: a rebalance or restart must not resume
            # from the stale offset and skip the log again.
            try:
                await self.consumer.commit({tp: target})
            except Exception as exc:  # noqa: BLE001 - the owner's next commit covers it
                log.warning(
                    "commit of the reset offset failed", topic=tp.topic,
                    partition=tp.partition, error=repr(exc), **self.context,
                )  # fmt: skip
        return r

    async def _log_reaches(self, tp: TopicPartition, pos: int, end: int, start: int = 0) -> bool:
        """Does the log hold offset ``pos - 1`` (or later)? Without ``bootstrap`` the reported
        end is trusted, and so is an empty log (``end <= start``: no batch at all, nothing to
        understate); an unsure probe (an error, or a fetch that did not bring even the record
        at ``end - 1``, which the log holds) says True: nothing is reset on a guess."""
        if self._probe is None or pos <= 0 or end <= start:
            return False
        if self._inside.get(tp) == (pos, end):
            return True
        found = await self._probe.reaches(tp, pos - 1, control=end - 1)
        if found is None:
            log.debug("offset probe unsure", tp=str(tp), **self.context)
            return True
        if found:
            self._inside[tp] = (pos, end)
        return found

    def _seek(self, tp: TopicPartition, offset: int) -> bool:
        try:
            self.consumer.seek(tp, offset)
        except Exception as exc:  # noqa: BLE001 - revoked meanwhile: its next owner checks it
            log.debug("seek skipped", tp=str(tp), error=repr(exc), **self.context)
            return False
        return True

    def _has_position(self, tp: TopicPartition) -> bool:
        """aiokafka holds a fetch position for ``tp`` in the current assignment, or a seek to
        one of its ends is under way (aiokafka's state: False when unreadable)."""
        try:
            state = self.consumer._subscription.subscription.assignment.state_value(tp)
        except Exception:  # noqa: BLE001 - not subscribed, not assigned, or another client
            return False
        return state is not None and bool(state.has_valid_position or state.awaiting_reset)

    async def _position_fresh(self, tps: list[TopicPartition]) -> None:
        """Position fresh partitions where the owner says — each once per assignment (see the
        module docstring): a partition positioned meanwhile by the other path is skipped.

        A partition whose positioning is under way counts as positioned: the confirmed start
        (:meth:`seek_to_start`) is known only after a round trip, and a second path seeking
        it again after the first path's fetch had begun delivered the head twice."""
        busy = [self._positioning[tp] for tp in tps if tp in self._positioning]
        tps = [tp for tp in tps if tp not in self._positioning and not self._has_position(tp)]
        if not tps:
            if busy:  # the other path positions them: wait for it (a fetch loop must not spin)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(busy[0].wait(), CHECK_TIMEOUT_S)
            return
        done = asyncio.Event()
        for tp in tps:
            self._positioning[tp] = done
        try:
            if self.on_fresh is not None:
                await self.on_fresh(tps)
                return
            with contextlib.suppress(Exception):
                if self.policy == OffsetResetPolicy.EARLIEST:
                    await self.seek_to_start(*tps)
                else:
                    await self.consumer.seek_to_end(*tps)
        finally:
            for tp in tps:
                if self._positioning.get(tp) is done:
                    del self._positioning[tp]
            done.set()


async def log_starts(
    consumer: Any, tps: list[TopicPartition], probe: LogProbe | None
) -> dict[TopicPartition, int]:
    """Each partition's log start: the broker's (``beginning_offsets``), a start above 0
    confirmed by ``probe`` (:meth:`LogProbe.exact_start`; none: the broker's word)."""
    starts = dict(await asyncio.wait_for(consumer.beginning_offsets(tps), CHECK_TIMEOUT_S))
    if probe is not None:
        for tp in tps:
            if starts.get(tp, 0) > 0:
                starts[tp] = await probe.exact_start(tp, starts[tp])
    return starts


async def confirmed_log_starts(
    consumer: Any, tps: list[TopicPartition], bootstrap: str
) -> dict[TopicPartition, int]:
    """:func:`log_starts` for a consumer without a guard: a probe of its own, closed after."""
    return (await confirmed_log_bounds(consumer, tps, bootstrap))[0]


async def confirmed_log_bounds(
    consumer: Any, tps: list[TopicPartition], bootstrap: str
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Each partition's log start (:func:`log_starts`) and end, both confirmed by a probe of
    its own, closed after: the end a broker reports may be its last batch's base + 1 (Tansu),
    and a saved position past that reported end is not past the log."""
    probe = LogProbe(bootstrap)
    try:
        starts = await log_starts(consumer, tps, probe)
        reported = await asyncio.wait_for(consumer.end_offsets(tps), CHECK_TIMEOUT_S)
        ends = {tp: await probe.end(tp, int(reported[tp])) for tp in tps}
        return starts, ends
    finally:
        await probe.close()


class GuardedRebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """For a consumer with no per-partition state of its own: newly assigned partitions are
    positioned by the guard (subscribe with ``listener=GuardedRebalance(guard)``)."""

    def __init__(self, guard: OffsetGuard) -> None:
        self.guard = guard

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pass

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.guard.assigned(assigned)
