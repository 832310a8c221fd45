"""OffsetGuard: positions outside a partition's log are reset, counted, committed back; positions
inside it are left alone. The Kafka consumer is a fake that behaves as measured on Tansu (a
fetch past the log end returns nothing and no error) or as Kafka (OffsetOutOfRangeError)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from prometheus_client import CollectorRegistry, Counter
from tracemq.collector_lag import PartitionLag
from tracemq.offset_reset import OffsetGuard, ResetReason, classify

TP = TopicPartition("b.T", 0)
TP1 = TopicPartition("b.T", 1)


class FakeKafka:
    def __init__(self, start: int = 0, end: int = 10) -> None:
        self.start = {TP: start, TP1: start}
        self.end = {TP: end, TP1: end}
        self.group: dict[TopicPartition, int] = {}
        self.positions: dict[TopicPartition, int] = {}
        self.paused_tps: set[TopicPartition] = set()
        self.calls: list[tuple[Any, ...]] = []
        self.fetch: Any = {}

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.group.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.start[tp] for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end[tp] for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", tp, offset))
        self.positions[tp] = offset

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.calls.append(("beginning", *tps))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.calls.append(("commit", dict(offsets)))
        self.group.update(offsets)

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def paused(self) -> set[TopicPartition]:
        return self.paused_tps

    async def getmany(self, *tps: TopicPartition, **kw: Any) -> Any:
        if isinstance(self.fetch, BaseException):
            exc, self.fetch = self.fetch, {}
            raise exc
        return self.fetch


def _guard(fake: FakeKafka, **kw: Any) -> tuple[OffsetGuard, Counter, list[Any]]:
    counter = Counter("resets", "r", ["group", "topic", "partition"], registry=CollectorRegistry())
    seen: list[Any] = []

    def on_reset(tp: TopicPartition, r: Any) -> None:
        seen.append((tp, r, dict(fake.positions)))

    g = OffsetGuard(fake, counter=counter, labels=("G",), on_reset=on_reset, **kw)
    return g, counter, seen


def _count(counter: Counter, tp: TopicPartition = TP) -> float:
    return counter.labels("G", tp.topic, str(tp.partition))._value.get()


def test_classify() -> None:
    assert classify(5, 0, 10) is None and classify(10, 0, 10) is None and classify(0, 0, 0) is None
    assert classify(11, 0, 10) == ResetReason.PAST_END
    assert classify(3, 4, 10) == ResetReason.BEFORE_START


async def test_committed_past_the_log_end_is_reset_to_the_beginning_counted_and_committed() -> None:
    fake = FakeKafka(start=0, end=532)
    fake.group[TP] = 578  # the restarted cluster lost the log, the commit came back
    g, counter, seen = _guard(fake)
    resets = await g.assigned([TP])
    assert [(r.position, r.target, r.reason) for r in resets] == [(578, 0, ResetReason.PAST_END)]
    assert fake.positions[TP] == 0 and fake.group[TP] == 0  # the group's offset moved back
    assert seen and seen[0][2] == {}  # the owner heard of it before the consumer moved
    assert _count(counter) == 1 and g.total == 1
    assert g.stats()["partitions"][0]["from"] == 578


async def test_positions_inside_the_log_are_kept_and_fresh_ones_go_to_the_owner() -> None:
    fake = FakeKafka(start=2, end=10)
    fake.group[TP] = 10  # at the end: caught up, fine
    fresh: list[Any] = []

    async def on_fresh(tps: list[TopicPartition]) -> None:
        fresh.extend(tps)

    g, counter, _ = _guard(fake, on_fresh=on_fresh)
    assert await g.assigned([TP, TP1]) == []
    # a group commit inside the log is left to aiokafka (no seek from the rebalance callback)
    assert fake.calls == [] and fresh == [TP1]
    assert _count(counter) == 0


async def test_a_known_start_wins_and_a_remembered_offset_replaces_a_lost_commit() -> None:
    fake = FakeKafka(start=0, end=3)
    g, _, _ = _guard(fake)
    g.remember({TP1: 30})  # this process committed 30; the cluster lost the group's offsets
    await g.assigned([TP, TP1], starts={TP: 2})
    assert fake.positions == {TP: 2, TP1: 0}
    assert [r.partition for r in g.resets.values()] == [1]


async def test_latest_policy_and_before_start() -> None:
    fake = FakeKafka(start=100, end=150)
    fake.group[TP] = 40  # retention passed a stopped consumer
    g, _, _ = _guard(fake, policy="latest")
    (r,) = await g.assigned([TP])
    assert (r.reason, r.target) == (ResetReason.BEFORE_START, 150)


async def test_an_idle_partition_past_the_log_end_is_found_by_the_interval_check() -> None:
    """Tansu answers a fetch past the log end with nothing and no error."""
    fake = FakeKafka(start=0, end=5)
    fake.positions = {TP: 60, TP1: 70}
    fake.paused_tps = {TP1}  # paused: not idle, not checked
    g, counter, _ = _guard(fake, idle_check_s=0.0)
    assert await g.getmany(timeout_ms=0) == {}
    assert fake.positions == {TP: 0, TP1: 70}
    assert _count(counter) == 1 and _count(counter, TP1) == 0
    # a partition that returned records is not idle: not checked
    fake.positions[TP] = 60
    fake.fetch = {TP: [object()]}
    g.idle_check_s = 3600
    await g.getmany(timeout_ms=0)
    assert (await g.check_idle()) == [] and fake.positions[TP] == 60


async def test_out_of_range_and_no_offset_errors_never_escape_getmany() -> None:
    fake = FakeKafka(start=0, end=5)
    fake.positions = {TP: 9}
    fresh: list[Any] = []

    async def on_fresh(tps: list[TopicPartition]) -> None:
        fresh.extend(tps)

    g, counter, _ = _guard(fake, on_fresh=on_fresh, idle_check_s=3600)
    fake.fetch = OffsetOutOfRangeError({TP: 9})
    assert await g.getmany(timeout_ms=0) == {}
    assert fake.positions[TP] == 0 and _count(counter) == 1
    fake.fetch = NoOffsetForPartitionError(TP1)
    assert await g.getmany(timeout_ms=0) == {}
    assert fresh == [TP1] and _count(counter) == 1  # a fresh queue is positioned, not counted


async def test_a_failing_owner_callback_leaves_the_position_for_the_next_check() -> None:
    fake = FakeKafka(start=0, end=5)
    fake.group[TP] = 9

    def boom(tp: TopicPartition, r: Any) -> None:
        raise RuntimeError("store unavailable")

    g = OffsetGuard(fake, on_reset=boom)
    assert await g.assigned([TP]) == []
    assert TP not in fake.positions and g.total == 0


@pytest.mark.parametrize(
    ("committed", "start", "end", "state", "lag"),
    [
        (578, 0, 532, "past_end", 532),
        (0, 0, 7, "ok", 7),
        (5, 0, 7, "ok", 2),
        (3, 4, 9, "before_start", 5),
    ],
)
def test_trace_lag_shows_an_offset_outside_the_log_not_zero(
    committed: int, start: int, end: int, state: str, lag: int
) -> None:
    p = PartitionLag("T", "b", 0, end, committed, log_start=start)
    assert (p.state, p.lag) == (state, lag)
    assert p.to_dict()["state"] == state


async def test_an_understated_end_offset_is_confirmed_by_a_probe_before_any_reset() -> None:
    """Tansu reports its last batch's base offset + 1 as the end: a position past that end is
    probed (a fetch of the record before it) and kept when the record is there."""
    fake = FakeKafka(start=0, end=21)  # 30 records at 20..49 in one batch
    fake.positions = {TP: 50, TP1: 50}
    g, counter, _ = _guard(fake, idle_check_s=0.0, bootstrap="127.0.0.1:1")
    probed: list[tuple[TopicPartition, int]] = []

    async def probe(tp: TopicPartition, pos: int, end: int, start: int = 0) -> bool:
        probed.append((tp, pos))
        return tp == TP  # TP's log reaches 49; TP1's really ends before 50

    g._log_reaches = probe  # type: ignore[method-assign]
    await g.getmany(timeout_ms=0)
    assert sorted(probed) == [(TP, 50), (TP1, 50)]
    assert fake.positions == {TP: 50, TP1: 0}
    assert _count(counter) == 0 and _count(counter, TP1) == 1


async def test_a_probe_that_brings_nothing_resets_nothing_unless_its_control_record_comes() -> None:
    """A probe fetch that brings nothing within its wait is no proof that the log ends: under
    load (a slow broker, a connection still being made) it reset positions inside the log. It
    counts only when the same probe then fetches the record at the reported end - 1."""
    from tracemq.offset_reset import _OUT_OF_RANGE

    fake = FakeKafka(start=0, end=21)  # Tansu: 30 records at 20..49 in one batch
    fake.positions = {TP: 50}
    g, counter, _ = _guard(fake, idle_check_s=0.0, bootstrap="127.0.0.1:1")
    assert g._probe is not None
    answers: dict[int, Any] = {}
    fetched: list[int] = []

    async def fetch(tp: TopicPartition, offset: int, n: int) -> Any:
        fetched.append(offset)
        return answers.get(offset, [])

    g._probe._fetch = fetch  # type: ignore[method-assign]
    await g.check([TP])  # nothing at all comes back: unsure, position kept
    assert fetched == [49, 20] and fake.positions == {TP: 50} and _count(counter) == 0
    answers[20] = ["record 20"]  # the control record comes, 49 does not: the log ends before
    fetched.clear()
    await g.check([TP])
    assert fetched == [49, 20] and fake.positions == {TP: 0} and _count(counter) == 1
    # Kafka's OFFSET_OUT_OF_RANGE is proof on its own; a record found needs no control
    assert await g._probe.reaches(TP, 49, control=20) is False
    answers[49] = _OUT_OF_RANGE
    fetched.clear()
    assert await g._probe.reaches(TP, 49, control=20) is False and fetched == [49]
    answers[49] = ["record 49"]
    assert await g._probe.reaches(TP, 49, control=20) is True


async def test_concurrent_probes_do_not_read_each_others_records() -> None:
    """The rebalance callback's check and the fetch loop's idle check probed at once through
    one consumer: each fetched at the offset the other had sought, and a position past the
    end (60; the log holds 0..39) passed for inside the log. One probe at a time now."""
    from tracemq.offset_reset import LogProbe

    class SharedConsumer:  # one position, read when the fetch completes (as aiokafka's)
        def __init__(self) -> None:
            self.pos = 0

        def assign(self, tps: list[TopicPartition]) -> None:
            pass

        def seek(self, tp: TopicPartition, offset: int) -> None:
            self.pos = offset

        async def getmany(self, tp: TopicPartition, **kw: Any) -> Any:
            for _ in range(3):  # the fetch's round trip: the other coroutine runs
                await asyncio.sleep(0)
            return {tp: [f"record {self.pos}"]} if self.pos < 40 else {}

    probe = LogProbe("127.0.0.1:1")
    probe._consumer = SharedConsumer()

    async def later() -> bool | None:  # starts while the first probe's fetch is under way
        for _ in range(2):
            await asyncio.sleep(0)
        return await probe.reaches(TP, 59, control=39)

    a, b = await asyncio.gather(probe.reaches(TP, 59, control=39), later())
    assert (a, b) == (False, False)


async def test_an_empty_log_needs_no_probe() -> None:
    """No batch at all (end <= start): nothing for the broker to understate."""
    fake = FakeKafka(start=0, end=0)  # a restarted in-memory cluster, topic created again
    fake.positions = {TP: 30}
    g, counter, _ = _guard(fake, idle_check_s=0.0, bootstrap="127.0.0.1:1")
    assert g._probe is not None

    async def fetch(tp: TopicPartition, offset: int, n: int) -> Any:
        raise AssertionError("probed an empty log")

    g._probe._fetch = fetch  # type: ignore[method-assign]
    await g.check([TP])
    assert fake.positions == {TP: 0} and _count(counter) == 1


def test_trace_lag_table_names_the_state_and_the_resets() -> None:
    from tracemq.cli.trace import _offset_state

    p = PartitionLag("T", "b", 0, 532, 578)
    assert "past_end" in _offset_state(p) and "reset due" in _offset_state(p)
    last = {"from": 578, "to": 0, "reason": "past_end", "at_ms": 0}
    done = PartitionLag("T", "b", 0, 532, 40, resets=1, last_reset=last)
    assert _offset_state(done).startswith("ok") and "reset 1x" in _offset_state(done)
    assert "578 → 0" in _offset_state(done)


async def test_a_fresh_partition_is_positioned_once_whichever_path_comes_first() -> None:
    """aiokafka's fetcher, finding no commit, raises NoOffsetForPartitionError from a fetch
    while the rebalance callback is still reading the commit: both paths want to position the
    fresh partition. Sought twice, aiokafka delivered its head twice (a whole queue consumed
    twice on a rebalance, under load). The second path leaves it alone."""
    from types import SimpleNamespace

    class _State:
        def __init__(self) -> None:
            self.has_valid_position = False
            self.awaiting_reset = False

    states = {TP: _State(), TP1: _State()}
    fake = FakeKafka(start=0, end=10)
    fake._subscription = SimpleNamespace(  # type: ignore[attr-defined]
        subscription=SimpleNamespace(assignment=SimpleNamespace(state_value=states.get))
    )
    fresh: list[Any] = []

    async def on_fresh(tps: list[TopicPartition]) -> None:
        fresh.extend(tps)
        for tp in tps:  # as seek_to_beginning does: a reset under way, then a position
            states[tp].awaiting_reset = True

    g, _, _ = _guard(fake, on_fresh=on_fresh, idle_check_s=3600)
    fake.fetch = NoOffsetForPartitionError(TP)  # the fetch loop's path first
    assert await g.getmany(timeout_ms=0) == {}
    assert fresh == [TP]
    assert await g.assigned([TP, TP1]) == []  # then the rebalance callback's
    assert fresh == [TP, TP1]  # TP not again; TP1 (not positioned by anyone) yes
    states[TP1].awaiting_reset, states[TP1].has_valid_position = False, True
    fake.fetch = NoOffsetForPartitionError(TP1)  # a stale error after the callback's seek
    assert await g.getmany(timeout_ms=0) == {}
    assert fresh == [TP, TP1]


class _Rec:
    def __init__(self, offset: int) -> None:
        self.offset = offset


async def test_a_reported_log_start_above_zero_is_confirmed_by_a_fetch_from_zero() -> None:
    """Tansu, its first batches written concurrently, reports the second batch's base as the
    log start for good (measured: 1 and 13, the first batch still fetchable at 0): a fresh
    partition sought to that start skipped the first batch in every group. A start above 0 is
    confirmed by a fetch from 0; Kafka's OFFSET_OUT_OF_RANGE there (retention) or a failed
    fetch leaves the broker's word."""
    from tracemq.offset_reset import _OUT_OF_RANGE

    fake = FakeKafka(start=13, end=238)
    g, counter, _ = _guard(fake, bootstrap="127.0.0.1:1")
    assert g._probe is not None
    answers: dict[int, Any] = {0: [_Rec(0)]}
    fetched: list[int] = []

    async def fetch(tp: TopicPartition, offset: int, n: int) -> Any:
        fetched.append(offset)
        return answers.get(offset)

    g._probe._fetch = fetch  # type: ignore[method-assign]
    # fresh partitions "from the first offset": the confirmed start, not the reported one
    await g.seek_to_start(TP, TP1)
    assert fake.positions == {TP: 0, TP1: 0} and fetched == [0, 0]
    # a position at the real start is inside the log: no reset to the reported start; and
    # the idle check, asking again for the same reported start, needs no second fetch
    await g.check([TP])
    assert fake.positions[TP] == 0 and _count(counter) == 0 and fetched == [0, 0]
    # Kafka: below the log start is out of range; the reported start stands
    answers[0] = _OUT_OF_RANGE
    fake.start[TP] = 20
    await g.seek_to_start(TP)
    assert fake.positions[TP] == 20 and fetched == [0, 0, 0]
    fake.start[TP] = 25  # it stood: a later start is the broker's word without a fetch
    await g.seek_to_start(TP)
    assert fake.positions[TP] == 25 and fetched == [0, 0, 0]
    answers[0] = None  # the probe failed: the broker's word too, and asked again next time
    fake.start[TP1] = 30
    await g.seek_to_start(TP1)
    await g.seek_to_start(TP1)
    assert fake.positions[TP1] == 30 and fetched == [0, 0, 0, 0, 0]
    # the default fresh positioning (no on_fresh) uses the confirmed start as well
    answers[0] = [_Rec(0), _Rec(1)]
    fake.positions.clear()
    await g._position_fresh([TP1])
    assert fake.positions == {TP1: 0}
    fetched.clear()
    # a reported start of 0 is never probed
    fetched.clear()
    fake.start[TP] = 0
    await g.seek_to_start(TP)
    assert fetched == [] and fake.positions[TP] == 0


async def test_confirmed_log_starts_closes_its_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's services without a guard (schedule, transactions) confirm the start with a
    probe of their own, closed after (no consumer left open)."""
    from tracemq import offset_reset

    fake = FakeKafka(start=5, end=40)
    closed: list[bool] = []

    class Probe(offset_reset.LogProbe):
        async def _fetch(self, tp: TopicPartition, offset: int, n: int) -> Any:
            return [_Rec(2)] if tp == TP else []

        async def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(offset_reset, "LogProbe", Probe)
    starts = await offset_reset.confirmed_log_starts(fake, [TP, TP1], "127.0.0.1:1")
    assert starts == {TP: 2, TP1: 5} and closed  # (closed after; an empty probe closes too)


async def test_confirmed_log_bounds_confirm_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's schedule and transaction services recover against the log's bounds: a
    saved position past Tansu's reported end (its last batch's base + 1) is not past the log,
    and must not restart the service from the log's start (every delayed message again)."""
    from tracemq import offset_reset

    fake = FakeKafka(start=13, end=238)  # the log holds 0..249: first and last batch hidden
    fetched: list[int] = []

    class Probe(offset_reset.LogProbe):
        async def _fetch(self, tp: TopicPartition, offset: int, n: int) -> Any:
            fetched.append(offset)
            if tp == TP1:
                return None  # the probe failed on this one: the broker's word stands
            if offset == 0:
                return [_Rec(0)]
            return [_Rec(o) for o in range(offset, 250)]

    monkeypatch.setattr(offset_reset, "LogProbe", Probe)
    starts, ends = await offset_reset.confirmed_log_bounds(fake, [TP, TP1], "127.0.0.1:1")
    assert starts == {TP: 0, TP1: 13} and ends == {TP: 250, TP1: 238}
    assert sorted(fetched) == [0, 0, 237, 237]


async def test_a_partition_being_positioned_is_not_positioned_again() -> None:
    """The confirmed start takes a round trip before the seek: the fetch loop's path, arriving
    meanwhile, must wait for it rather than seek the partition a second time (a second seek
    after the first one's fetch had begun delivered the partition's head twice: a listener saw
    a message three times in the suite)."""
    from types import SimpleNamespace

    class _State:
        has_valid_position = False
        awaiting_reset = False

    states = {TP: _State(), TP1: _State()}
    fake = FakeKafka(start=0, end=10)
    fake._subscription = SimpleNamespace(  # type: ignore[attr-defined]
        subscription=SimpleNamespace(assignment=SimpleNamespace(state_value=states.get))
    )
    gate = asyncio.Event()
    fresh: list[Any] = []

    async def on_fresh(tps: list[TopicPartition]) -> None:
        fresh.extend(tps)
        await gate.wait()  # the round trip of the start's confirmation
        for tp in tps:
            states[tp].has_valid_position = True

    g, _, _ = _guard(fake, on_fresh=on_fresh, idle_check_s=3600)
    first = asyncio.create_task(g.assigned([TP, TP1]))
    for _ in range(100):  # until the assignment's positioning is under way
        if fresh:
            break
        await asyncio.sleep(0)
    assert fresh == [TP, TP1]
    fake.fetch = NoOffsetForPartitionError(TP)
    second = asyncio.create_task(g.getmany(timeout_ms=0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not second.done()  # the fetch loop waits for the positioning, it does not spin
    gate.set()
    assert await second == {} and await first == []
    assert fresh == [TP, TP1]  # each positioned once
    assert g._positioning == {}
