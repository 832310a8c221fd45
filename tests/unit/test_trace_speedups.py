"""The compiled trace worker steps (``tracemq/trace/_speedups.pyx``) against their pure-Python
references, and the fallback to those when the compiled module is absent or turned off.

The references are ``_codec.write_records_py`` and ``_dispatcher.plan_slices_py``: the compiled
twins must return the same for any input the worker can give them (same texts, same message
bodies byte for byte, same key sets in the same order, same counts).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracemq.trace import _codec as c
from tracemq.trace import _dispatcher as dm
from tracemq.trace._model import ConsumeReturnType, MessageType, TraceContext, TraceType

S, E = c.CONTENT_SPLITOR, c.FIELD_SPLITOR


class _Str(str):
    """A str subclass: written as its text, but not a plain str to the compiled checks."""


# ---- what a raw record's fields can hold: what the hooks give, and what a caller might ----

# shared values (the writer caches the text of repeated region/group/topic objects by identity)
_POOL = ["Orders", "CG", "DefaultRegion", "k1 k2", "k1  k2 ", " ", "", "null", "T%RETRY%CG"]
_text = st.one_of(
    st.sampled_from(_POOL),
    st.none(),
    st.text(max_size=10),  # any character: non-ASCII, U+0001, U+0002 included
    st.lists(st.sampled_from([S, E, " ", "a", "é", "中", "😀", "null"]), max_size=6).map("".join),
    st.builds(_Str, st.text(max_size=4)),
    st.integers(-5, 5),
    st.floats(allow_nan=False),
    st.booleans(),
)
_int = st.one_of(
    st.integers(0, 4095),  # the table's integers
    st.integers(-(2**31) - 2, 2**31 + 1),
    st.integers(-(2**63) - 2, 2**63 + 1),
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.sampled_from(ConsumeReturnType),
    st.sampled_from(MessageType),
    st.builds(str, st.integers(0, 9)),
)
_timestamp = st.one_of(st.sampled_from([1_764_300_000_000, 1_764_300_000_001]), _int)
_ok = st.one_of(st.booleans(), st.none(), st.integers(0, 2), st.text(max_size=1))
_msg_type = st.one_of(st.integers(-1, 6), st.sampled_from(MessageType), _int)
_code = st.one_of(st.sampled_from(ConsumeReturnType), _int)
_WILD = {
    "text": _text, "int": _int, "timestamp": _timestamp, "ok": _ok, "msg_type": _msg_type,
    "code": _code,
}  # fmt: skip

# what the hooks give: text or None (ASCII mostly, a separator or non-ASCII now and then) and
# integers the writer takes
_tame_text = st.one_of(
    st.sampled_from(_POOL),
    st.none(),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    st.lists(st.sampled_from([S, E, " ", "a", "k", "é"]), max_size=4).map("".join),
)
_tame_int = st.one_of(st.integers(0, 4095), st.integers(-(2**31), 2**31 - 1))
_tame_timestamp = st.one_of(
    st.sampled_from([1_764_300_000_000, 1_764_300_000_001]), st.integers(-(2**63), 2**63 - 1)
)
_TAME = {
    "text": _tame_text, "int": _tame_int, "timestamp": _tame_timestamp,
    "ok": st.booleans(), "msg_type": st.sampled_from(MessageType), "code": _tame_int,
}  # fmt: skip


@st.composite
def _raw(draw: st.DrawFn, kind: str | None = None, tame: bool = False) -> tuple[Any, ...]:
    if tame:
        _text, _int, _timestamp, _ok, _msg_type, _code = _TAME.values()
    else:
        _text, _int, _timestamp, _ok, _msg_type, _code = _WILD.values()
    kind = kind or draw(st.sampled_from([c.SUB_PAIR, c.PUB, c.SUB_AFTER, c.SUB_BEFORE]))
    head = (kind, draw(_text), draw(_text), draw(_text), draw(_text), draw(_timestamp),
            draw(_text))  # fmt: skip
    if kind is c.SUB_PAIR:
        tail: tuple[Any, ...] = (draw(_text), draw(_int), draw(_timestamp), draw(_int),
                                 draw(_ok), draw(_code))  # fmt: skip
    elif kind is c.SUB_BEFORE:
        tail = (draw(_text), draw(_int))
    elif kind is c.SUB_AFTER:
        tail = (draw(_text), draw(_int), draw(_ok), draw(_code))
    else:
        tail = (draw(_text), draw(_text), draw(_int), draw(_int), draw(_msg_type), draw(_text),
                draw(_ok))  # fmt: skip
    return head + tail


@st.composite
def _odd_item(draw: st.DrawFn) -> object:
    """Queue items the writer refuses: contexts, malformed tuples, other objects."""
    good = draw(_raw())
    return draw(
        st.sampled_from(
            [
                TraceContext(TraceType.Pub),
                None,
                (),
                ("Nope", 1, 2),
                list(good),
                good[:-1],
                (*good, 1),
                ("SubBefore+SubAfter", *good[1:]),  # an equal kind, not the constant
            ]
        )
    )


_items = st.lists(st.one_of(_raw(), _raw(tame=True), _raw(tame=True), _odd_item()), max_size=12)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return type(exc).__name__, str(exc)


try:
    from tracemq.trace import _speedups as speedups
except ImportError:  # not built (no compiler at install): the fallback tests still run
    speedups = None

built = pytest.mark.skipif(speedups is None, reason="the compiled trace steps are not built")
# (the tests of the compiled steps: skipped too when they are turned off)
compiled = pytest.mark.skipif(
    speedups is None or not c.COMPILED,
    reason="the compiled trace steps are not built, or turned off (TRACEMQ_NO_EXTENSIONS)",
)


@built
def test_the_built_module_is_the_one_in_use() -> None:
    assert speedups is not None
    assert speedups.__file__.endswith((".so", ".pyd"))
    if os.environ.get("TRACEMQ_NO_EXTENSIONS", "") in ("", "0"):
        assert c.COMPILED
        assert c.write_records is speedups.write_records
        assert dm._plan_one_group is not dm.plan_slices_py
        assert dm._write_plan is speedups.write_plan


@compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_items)
def test_compiled_write_records_equals_the_reference(items: list[object]) -> None:
    assert _outcome(speedups.write_records, items) == _outcome(c.write_records_py, items)


@compiled
@settings(max_examples=200)
@given(st.lists(_text, min_size=1, max_size=3), _raw(c.SUB_PAIR), _raw(c.PUB))
def test_shared_fields_are_written_per_record(pool: list[Any], pair: Any, pub: Any) -> None:
    # the same region/group/topic objects over several records, changing in between: the
    # writers' per-change caches must write each record as if alone
    items = []
    for i in range(6):
        v = pool[i % len(pool)]
        items.append((*pair[:2], v, *pair[3:6], v, *pair[7:]))
        items.append((pub[0], v, v, *pub[3:6], v, *pub[7:]))
    expected = [c.write_records_py([item])[0] for item in items]
    assert speedups.write_records(items) == c.write_records_py(items) == expected


def _plan(fn: Any, batch: list[Any], texts: list[Any], first_seq: int, limit: int) -> Any:
    kind, result = _outcome(fn, batch, texts, first_seq, limit)
    if kind == "ok" and result is not None:
        plans, bad, oversize = result
        # (a key set's order is the KEYS header's order: compared too)
        return kind, [(*p, list(p[3])) for p in plans], bad, oversize
    return kind, result


_compiled_plan = dm._compiled_plan_slices()


@compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(_raw(c.SUB_PAIR, tame=True), _raw(tame=True), _raw(c.SUB_PAIR), _raw()),
        min_size=1,
        max_size=14,
    ),  # fmt: skip
    st.integers(0, 2**40),
    st.one_of(st.integers(1, 400), st.integers(1, 200_000)),
)
def test_compiled_plan_slices_equals_the_reference(
    batch: list[Any], first_seq: int, limit: int
) -> None:
    texts = c.write_records_py(batch)
    if None in texts:  # (the worker plans those the careful way: not this step's input)
        batch = [r for r, t in zip(batch, texts, strict=True) if t is not None]
        texts = [t for t in texts if t is not None]
        if not batch:
            return
    assert _compiled_plan is not None
    assert _plan(_compiled_plan, batch, texts, first_seq, limit) == _plan(
        dm.plan_slices_py, batch, texts, first_seq, limit
    )


@compiled
@settings(max_examples=100)
@given(st.integers(1, 3000), st.booleans())
def test_compiled_plan_slices_on_a_clean_stream(limit: int, with_pubs: bool) -> None:
    # the worker's usual batch: ASCII, every record clean; cut into several messages
    batch: list[Any] = []
    for i in range(300):
        keys = None if i % 7 == 0 else ("" if i % 11 == 0 else f"k{i} k{i % 5}")
        if with_pubs and i % 3 == 0:
            batch.append((c.PUB, "Orders", "DefaultRegion", f"MSG{i:08X}", keys, 1_764_300_000_000,
                          "PG", "t", "a:10911", 200, 1, 0, f"OFF{i:08X}", True))  # fmt: skip
        else:
            batch.append((c.SUB_PAIR, "Orders", "DefaultRegion", f"MSG{i:08X}", keys,
                           1_764_300_000_000 + i // 9, "CG", f"RID{i:08X}", 0,
                           1_764_300_000_001 + i // 9, 1, True, 0))  # fmt: skip
    texts = speedups.write_records(batch)
    assert texts == c.write_records_py(batch)
    got = _plan(_compiled_plan, batch, texts, 10, limit)
    assert got == _plan(dm.plan_slices_py, batch, texts, 10, limit)
    assert got[0] == "ok" and got[1]


@compiled
def test_compiled_plan_slices_hands_odd_input_to_the_reference() -> None:
    calls = []

    def reference(*args: Any) -> str:
        calls.append(args)
        return "reference"

    pair = (c.SUB_PAIR, "T", "R", "M", "K", 1, "G", "RID", 0, 2, 1, True, 0)
    (text,) = c.write_records_py([pair])
    plan = speedups.plan_slices
    assert plan([pair], [text], 0, 100, fallback=reference) != "reference"
    for args in [
        ([pair], [text + "é"], 0, 100),  # non-ASCII text
        ([(*pair[:3], 5, *pair[4:])], [text], 0, 100),  # a text field that is no str
        ([pair], [text, text], 0, 100),  # lengths differ
        ([pair], [text], 0, 2**70),  # a limit past C's
        ((pair,), [text], 0, 100),  # not lists
        ([pair[:-1]], [text], 0, 100),  # a malformed record
    ]:
        calls.clear()
        assert plan(*args, fallback=reference) == "reference"
        assert calls == [args]


@st.composite
def _one_group(draw: st.DrawFn) -> list[Any]:
    """A batch whose records share their topic and region (the worker's usual batch), most of
    them tame, some not."""
    topic, region = draw(_tame_text), draw(_tame_text)
    records = draw(
        st.lists(
            st.one_of(_raw(c.SUB_PAIR, tame=True), _raw(tame=True), _raw(tame=True), _raw()),
            min_size=1,
            max_size=14,
        )
    )
    return [(r[0], topic, region, *r[3:]) for r in records]


def _reference_plan(batch: list[Any], first_seq: int, limit: int) -> Any:
    """What the worker does without write_plan for a batch write_plan takes: write_records,
    then the one-group planner (the reference of both)."""
    texts = c.write_records_py(batch)
    assert None not in texts
    assert len(set(map(dm._TOPIC, batch))) == 1 and len(set(map(dm._REGION, batch))) == 1
    return _plan(dm.plan_slices_py, batch, texts, first_seq, limit)


@compiled
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(_one_group(), _items),
    st.integers(0, 2**40),
    st.one_of(st.integers(1, 400), st.integers(1, 200_000), st.integers(2**62, 2**63)),
)
def test_compiled_write_plan_is_write_records_then_the_planner(
    batch: list[Any], first_seq: int, limit: int
) -> None:
    got = speedups.write_plan(batch, first_seq, limit)
    if got is None:  # not its batch: the worker takes the two steps (checked above)
        return
    assert _plan(lambda *a: got, batch, [], first_seq, limit) == _reference_plan(
        batch, first_seq, limit
    )


@compiled
@settings(max_examples=100)
@given(st.integers(1, 3000), st.booleans(), st.integers(0, 3))
def test_compiled_write_plan_takes_a_clean_stream(limit: int, with_pubs: bool, kinds: int) -> None:
    # the worker's usual batches: ASCII, every record clean, of one topic and region; pairs,
    # or SubBefore and SubAfter apart (a slow listener), with publishes now and then
    batch: list[Any] = []
    for i in range(300):
        keys = None if i % 7 == 0 else ("" if i % 11 == 0 else f"k{i} k{i % 5}")
        ts = 1_764_300_000_000 + i // 9 - (i % 13 == 0) * 2**62
        if with_pubs and i % 3 == 0:
            batch.append((c.PUB, "Orders", "DefaultRegion", f"MSG{i:08X}", keys, ts, "PG", "t",
                          "a:10911", 200, 1, MessageType(i % 5), f"OFF{i:08X}", i % 2 == 0))  # fmt: skip
        elif kinds and i % 4 == kinds:
            batch.append((c.SUB_BEFORE, "Orders", "DefaultRegion", f"MSG{i:08X}", keys, ts, "CG",
                          f"RID{i:08X}", i % 17))  # fmt: skip
            batch.append((c.SUB_AFTER, "Orders", "DefaultRegion", f"MSG{i:08X}", keys, ts + 3,
                          "CG", f"RID{i:08X}", -i, i % 2 == 0, ConsumeReturnType(i % 5)))  # fmt: skip
        else:
            batch.append((c.SUB_PAIR, "Orders", "DefaultRegion", f"MSG{i:08X}", keys, ts, "CG",
                          f"RID{i:08X}", 0, ts + i % 3, -(2**31) + i, i % 4 != 0, i % 6))  # fmt: skip
    got = speedups.write_plan(batch, 10, limit)
    assert got is not None
    assert _plan(lambda *a: got, batch, [], 10, limit) == _reference_plan(batch, 10, limit)


@compiled
def test_compiled_write_plan_writes_large_batches() -> None:
    # batches that grow its text buffer (from 64 KiB, doubled) several times, one that gives
    # up half-way (a separator found late), and short ones between them: each written as
    # the reference writes it
    def batch(n: int, key_len: int, tag: str) -> list[Any]:
        return [
            (c.SUB_PAIR, "Orders", "DefaultRegion", f"{tag}{i:08X}", f"k{i}" + "x" * key_len,
             1_764_300_000_000 + i, "CG", f"RID{i:08X}", 0, 1_764_300_000_005 + i, 5, True, 0)
            for i in range(n)
        ]  # fmt: skip

    limit = 512_000
    for records in (
        batch(3000, 200, "A"),  # ~1.5 MB of text: grown
        batch(50, 3, "B"),  # short: the start of a longer text left behind in the buffer
        batch(2500, 150, "C"),
        batch(12_000, 300, "D"),  # ~9 MB
        batch(10, 0, "E"),
    ):
        got = speedups.write_plan(records, 7, limit)
        assert got is not None
        assert _plan(lambda *a, got=got: got, records, [], 7, limit) == _reference_plan(
            records, 7, limit
        )
    late = batch(3000, 200, "F")
    late[-1] = (*late[-1][:4], "k\x01", *late[-1][5:])  # a separator in the last record's keys
    assert speedups.write_plan(late, 0, limit) is None
    again = batch(2000, 100, "G")
    got = speedups.write_plan(again, 0, limit)
    assert _plan(lambda *a: got, again, [], 0, limit) == _reference_plan(again, 0, limit)


@compiled
def test_compiled_write_plan_leaves_other_batches() -> None:
    pair = (c.SUB_PAIR, "T", "R", "M", "K", 1, "G", "RID", 0, 2, 1, True, 0)
    assert speedups.write_plan([pair], 0, 100) is not None
    for args in [
        ([pair, (pair[0], "T2", *pair[2:])], 0, 100),  # two topics
        ([pair, (*pair[:2], "R2", *pair[3:])], 0, 100),  # two regions
        ([(*pair[:3], "M\x01", *pair[4:])], 0, 100),  # a separator in a text field
        ([(*pair[:4], "é", *pair[5:])], 0, 100),  # non-ASCII text
        ([(*pair[:3], 5, *pair[4:])], 0, 100),  # a text field that is no str
        ([(*pair[:3], _Str("M"), *pair[4:])], 0, 100),  # nor a str subclass
        ([(*pair[:11], 1, pair[12])], 0, 100),  # "ok" not a bool
        ([(*pair[:5], True, *pair[6:])], 0, 100),  # a timestamp not an int
        ([(*pair[:5], 2**63, *pair[6:])], 0, 100),  # past a Java long
        ([(*pair[:8], 2**31, *pair[9:])], 0, 100),  # past a Java int
        ([pair[:-1]], 0, 100),  # a malformed record
        ([TraceContext(TraceType.Pub)], 0, 100),  # a context
        ([], 0, 100),
        ([pair], 0, 0),  # a limit below 1
        ([pair], 0, 2**70),  # a limit past C's
        ((pair,), 0, 100),  # not a list
    ]:
        assert speedups.write_plan(*args) is None, args


# ---- the fallback: no compiled module, or turned off, and the pure-Python steps are used ----


def test_no_compiled_writer_when_the_module_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACEMQ_NO_EXTENSIONS", raising=False)
    monkeypatch.setitem(sys.modules, "tracemq.trace._speedups", None)  # import fails
    assert c._compiled_writer() is None


def test_no_compiled_writer_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEMQ_NO_EXTENSIONS", "1")
    assert c._compiled_writer() is None
    monkeypatch.setenv("TRACEMQ_NO_EXTENSIONS", "0")
    assert c._compiled_writer() is (speedups and speedups.write_records)


_FALLBACK_CHECK = textwrap.dedent(
    """
    import asyncio, sys
    if sys.argv[1] == "absent":
        sys.modules["tracemq.trace._speedups"] = None  # as if it was never built
    from tracemq.trace import _codec as c, _dispatcher as dm
    assert not c.COMPILED
    assert c.write_records is c.write_records_py
    assert dm._plan_one_group is dm.plan_slices_py
    assert dm._write_plan is None

    class Routes:
        async def get(self, topic, refresh=False):
            raise AssertionError("not reached")

    async def main():
        d = dm.AsyncTraceDispatcher(group="G", route_cache=Routes(), sender=object())
        pair = (c.SUB_PAIR, "T", "R", "M1", "K1 K2", 5, "G", "RID", 0, 6, 1, True, 0)
        (job,) = d._build_jobs([pair], 0)
        assert job.value == c.write_records_py([pair])[0].encode()
        assert job.contexts == 2
        from tracemq.trace._hooks import ConsumeMessageTraceHook
        hook = ConsumeMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC")
        assert hook.before.__self__ is hook and hook.after.__self__ is hook  # not compiled
        print("pure", len(job.value))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["absent", "env"])
def test_the_worker_falls_back_to_pure_python(how: str) -> None:
    env = {**os.environ, "TRACEMQ_NO_EXTENSIONS": "1" if how == "env" else ""}
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK_CHECK, how],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pure")


# ---- the consumer's per-message trace path: ConsumeTracer against the hook's before/after ----


class _Routes:
    async def get(self, topic: str, *, refresh: bool = False) -> Any:
        raise AssertionError("not started")


def _consume_side() -> tuple[Any, Any]:
    """A dispatcher (small queue: refusals happen) and its consume hook's pure before/after."""
    from tracemq.trace._hooks import ConsumeMessageTraceHook

    d = dm.AsyncTraceDispatcher(group="CG", route_cache=_Routes(), sender=object(), queue_size=4)
    return d, ConsumeMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC")


def _messages() -> list[Any]:
    from tracemq.message import MessageExt, MessageQueue

    q = MessageQueue("Orders", "broker-a", 1)
    trace_q = MessageQueue("RMQ_SYS_TRACE_TOPIC", "trace-a", 0)
    return [
        MessageExt(
            "Orders",
            b"x",
            f"MSG{i}",
            q,
            i,
            1,
            2,
            "h",
            reconsume_times=i % 3,
            properties={"KEYS": f"k{i} j{i}"} if i % 2 else {},
        )  # fmt: skip
        for i in range(5)
    ] + [MessageExt("RMQ_SYS_TRACE_TOPIC", b"x", "MSGT", trace_q, 9, 1, 2, "h")]


# a listener's own end time (ConsumeContext.end_times is a plain dict): anything at all
_end_at = st.one_of(
    st.just(-1),
    st.integers(0, 2_000_000_000_000),
    st.integers(2**63 - 2, 2**64),  # beyond a Java long
    st.integers(-(2**64), -(2**63) + 1),
    st.floats(allow_nan=False),
    st.none(),
    st.booleans(),
    st.text(max_size=2),
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("before"), st.integers(0, 5)),
        st.tuples(
            st.just("after"),
            st.integers(0, 5),
            st.booleans(),
            st.integers(0, 5),
            _end_at,
        ),  # fmt: skip
        st.tuples(st.just("take"), st.integers(0, 4)),  # the worker gathers up to n items
        st.tuples(st.just("write")),  # the worker has written its batch
        st.tuples(st.just("close")),
    ),
    max_size=40,
)


def _run_consume_ops(
    d: Any, before: Any, after: Any, ops: list[Any], msgs: list[Any] | None = None
) -> list[Any]:
    """Apply ``ops`` (to ``_messages()`` unless given); the dispatcher's queue state after
    each, with each request id replaced by its order of appearance and each clock-read time by
    a mark (checked, then hidden)."""
    import time

    msgs = _messages() if msgs is None else msgs
    tokens: dict[int, Any] = {}
    reads: list[tuple[int, int]] = []  # clock-read windows of the calls
    states = []
    for op in ops:
        if op[0] == "before" and op[1] not in tokens:
            low = time.time_ns() // 1_000_000
            tokens[op[1]] = before(msgs[op[1]], "CG", "Region-A")
            reads.append((low, time.time_ns() // 1_000_000))
        elif op[0] == "after" and op[1] in tokens:
            _, i, ok, code, end = op
            low = time.time_ns() // 1_000_000
            after(tokens.pop(i), msgs[i], "CG", "Region-A", end, ok, code)
            reads.append((low, time.time_ns() // 1_000_000))
        elif op[0] == "take":
            if d._gathering_seq is None:
                d._gathering_seq = d._taken_seq
            taken = min(op[1], len(d._queue))
            for _ in range(taken):
                d._batch.append(d._queue.popleft())
            d._taken_seq += taken
        elif op[0] == "write":
            if dm._seal is not None:  # (as the worker: taken for good)
                dm._seal(d._batch)
            d._batch = []
            d._gathering_seq = None
        elif op[0] == "close":
            d._closing = True
        states.append(
            (
                [_hide(_as_raw(r), reads) for r in d._queue],
                [_hide(_as_raw(r), reads) for r in d._batch],
                d._accepted_seq,
                d._taken_seq,
                d._gathering_seq,
                d._want,
                {k: v for k, v in d.stats().items() if "latency" not in k},
                sorted((i, _hide_token(t, reads)) for i, t in tokens.items()),
            )  # fmt: skip
        )
    return states


def _in_a_read(ts: int, reads: list[tuple[int, int]]) -> bool:
    return any(low <= ts <= high for low, high in reads)


def _as_raw(item: Any) -> Any:
    """A queue item as the reference queues it (a ConsumeRecord as its raw record)."""
    return item.as_tuple() if type(item) is dm._CONSUME_RECORD else item


def _hide_token(token: Any, reads: list[tuple[int, int]]) -> Any:
    if token is None:
        return None
    seq, rid, begin = token.token if type(token) is dm._CONSUME_RECORD else token
    assert _in_a_read(begin, reads)
    return (seq, len(rid), "B")


def _hide(r: Any, reads: list[tuple[int, int]]) -> Any:
    r = list(r)
    kind = r[0]
    assert kind in (c.SUB_BEFORE, c.SUB_AFTER, c.SUB_PAIR)
    # request id: 32 upper-case hex characters (new_request_id's form)
    assert isinstance(r[7], str) and len(r[7]) == 32 and r[7] == r[7].upper()
    r[7] = "RID"
    if kind == c.SUB_AFTER:  # end at 5, cost at 8
        assert r[8] >= 0
        r[8] = "C"
        if _in_a_read(r[5], reads):
            r[5] = "NOW"
    else:
        assert _in_a_read(r[5], reads)  # begin
        r[5] = "B"
        if kind == c.SUB_PAIR:  # end at 9, cost at 10
            assert r[10] >= 0
            r[10] = "C"
            if _in_a_read(r[9], reads):
                r[9] = "NOW"
    return tuple(r)


@compiled
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_compiled_consume_tracer_equals_the_reference(ops: list[Any]) -> None:
    from tracemq.trace._hooks import ConsumeMessageTraceHook

    d_ref, hook = _consume_side()
    pure = (
        ConsumeMessageTraceHook.before.__get__(hook),
        ConsumeMessageTraceHook.after.__get__(hook),
    )
    d_c, _ = _consume_side()
    tracer = speedups.ConsumeTracer(d_c, "RMQ_SYS_TRACE_TOPIC")
    assert _run_consume_ops(d_c, tracer.before, tracer.after, ops) == _run_consume_ops(
        d_ref, *pure, ops
    )


def _other_messages(kind: str) -> list[Any]:
    """``_messages()`` as another type: the tracer reads a MessageExt's slots itself, and
    anything else the usual way."""
    from dataclasses import dataclass

    from tracemq.message import MessageExt

    @dataclass(slots=True)
    class Sub(MessageExt):  # a subclass (slots of its own): read by attribute
        note: str = ""

    class Duck:  # not a MessageExt at all
        def __init__(self, m: Any) -> None:
            self.__dict__.update({f: getattr(m, f) for f in MessageExt.__dataclass_fields__})

    msgs = _messages()
    if kind == "subclass":
        return [Sub(**{f: getattr(m, f) for f in MessageExt.__dataclass_fields__}) for m in msgs]
    return [Duck(m) for m in msgs]


@compiled
@pytest.mark.parametrize("kind", ["subclass", "duck"])
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_the_compiled_tracer_reads_other_messages_as_the_reference(
    kind: str, ops: list[Any]
) -> None:
    from tracemq.trace._hooks import ConsumeMessageTraceHook

    d_ref, hook = _consume_side()
    pure = (
        ConsumeMessageTraceHook.before.__get__(hook),
        ConsumeMessageTraceHook.after.__get__(hook),
    )
    d_c, _ = _consume_side()
    tracer = speedups.ConsumeTracer(d_c, "RMQ_SYS_TRACE_TOPIC")
    ours = _run_consume_ops(d_c, tracer.before, tracer.after, ops, _other_messages(kind))
    assert ours == _run_consume_ops(d_ref, *pure, ops, _other_messages(kind))


@compiled
def test_the_compiled_tracer_reads_empty_slots_as_the_attribute_look_up() -> None:
    """A half-built MessageExt (a slot left empty): what reading the attribute raises, reading
    the slot raises too — its queue: the error (as the reference's ``msg.queue``); any other
    field: the token of a refused SubBefore, nothing queued (its SubAfter then goes alone, if
    it can be written: never an error)."""
    d, _ = _consume_side()
    tracer = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")
    for field_name in ("msg_id", "properties", "reconsume_times", "topic"):
        m = _messages()[0]
        delattr(m, field_name)
        token = tracer.before(m, "CG", "R")
        assert token.seq == -1 and not d._queue
        tracer.after(token, m, "CG", "R", 5, True, 0)
        assert all(r[0] == c.SUB_AFTER for r in d._queue)
        d._queue.clear()
    m = _messages()[0]
    del m.queue
    accepted = d._accepted_seq
    with pytest.raises(AttributeError, match="'MessageExt' object has no attribute 'queue'"):
        tracer.before(m, "CG", "R")
    assert not d._queue and d._accepted_seq == accepted


@compiled
def test_the_compiled_tracer_reads_by_attribute_when_the_message_has_no_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (a MessageExt some day without __slots__: the tracer still works, reading attributes)
    import tracemq.message

    class Plain:
        topic = msg_id = queue = properties = reconsume_times = None

    monkeypatch.setattr(tracemq.message, "MessageExt", Plain)
    d, _ = _consume_side()
    tracer = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")
    monkeypatch.undo()
    m = _messages()[1]
    token = tracer.before(m, "CG", "R")
    tracer.after(token, m, "CG", "R", 5, True, 0)
    [record] = d._queue
    assert record.joined and record.as_tuple()[3:5] == ("MSG1", "k1 j1")


@st.composite
def _consume_records(draw: st.DrawFn) -> list[Any]:
    """Queue items of the compiled consume path — ConsumeRecords, joined or not, of messages
    with any fields — among raw records; half the batches tame (what consumers give: one
    topic and region, ASCII text mostly, ints in range)."""
    from tracemq.message import MessageExt, MessageQueue

    d = dm.AsyncTraceDispatcher(group="CG", route_cache=_Routes(), sender=object())
    tracer = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")
    tame = draw(st.booleans())
    if tame:
        clean = st.one_of(
            st.sampled_from(_POOL),
            st.none(),
            st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
        )
        text, number, ok = st.one_of(clean, clean, clean, _tame_text), _tame_int, st.booleans()
        code = st.one_of(_tame_int, st.sampled_from(ConsumeReturnType))
        # (now, or a listener's own end time: within a Java int's milliseconds mostly)
        end_at: Any = st.one_of(st.just(-1), st.integers(1_764_000_000_000, 1_767_000_000_000))
    else:
        text, number, ok, code, end_at = _text, _int, _ok, _code, _end_at
    shared = tame or draw(st.booleans())
    topic, region = draw(_tame_text), draw(_tame_text)
    items: list[Any] = []
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.integers(0, 4)) == 0:
            raw = draw(_raw(tame=tame))
            items.append((raw[0], topic, region, *raw[3:]) if shared else raw)
            continue
        keys = draw(text)
        msg = MessageExt(
            topic if shared else draw(text), b"", draw(text),
            MessageQueue("Orders", "broker-a", 0), 0, 0, 0, "h",
            reconsume_times=draw(number),
            properties={} if keys is None else {"KEYS": keys},
        )  # fmt: skip
        token = tracer.before(msg, draw(text), region if shared else draw(text))
        assert token is not None and token.seq >= 0
        if draw(st.booleans()):
            tracer.after(token, msg, "CG", region, draw(end_at), draw(ok), draw(code))
            assert token.joined
        items.append(token)
    return items


@compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    _consume_records(),
    st.integers(0, 2**40),
    st.one_of(st.integers(1, 400), st.integers(1, 200_000)),
)
def test_compiled_write_plan_writes_consume_records_as_their_raw_records(
    batch: list[Any], first_seq: int, limit: int
) -> None:
    got = speedups.write_plan(batch, first_seq, limit)
    raws = speedups.materialize(batch)
    assert [type(r) for r in raws] == [tuple] * len(batch)
    assert dm._records_in(batch) == dm._records_in(raws)
    if got is None:
        return
    assert _plan(lambda *a: got, batch, [], first_seq, limit) == _reference_plan(
        raws, first_seq, limit
    )


@compiled
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(_consume_records())
def test_the_worker_writes_consume_records_as_their_raw_records(batch: list[Any]) -> None:
    # the same trace messages (bodies, keys, record counts) and failures from a batch and from
    # its raw records, whichever way the worker writes them
    def jobs(items: list[Any]) -> Any:
        d = dm.AsyncTraceDispatcher(group="CG", route_cache=_Routes(), sender=object())
        made = d._build_jobs(list(items), 7)
        return [(j.min_seq, j.contexts, j.value, sorted(map(str, j.headers[0][1].split()))
                 if j.headers[0][0] == "KEYS" else None) for j in made], d._failed  # fmt: skip

    # (a wild field can make a step raise: the worker then fails the batch; the same way here)
    assert _outcome(jobs, batch) == _outcome(jobs, speedups.materialize(batch))


@compiled
async def test_a_sub_after_goes_alone_once_the_worker_took_its_sub_before() -> None:
    from tracemq.message import MessageExt, MessageQueue

    sent: list[bytes] = []

    class Sender:
        async def send(self, route: Any, queue_id: int, topic: str, value: bytes,
                       headers: Any) -> None:  # fmt: skip
            sent.append(value)

    class Routes:
        async def get(self, topic: str, *, refresh: bool = False) -> Any:
            from tracemq.routing.model import QueueRoute, TopicRoute

            return TopicRoute(topic, (QueueRoute("trace-a", "c", 1, 1, 6, "k:1", "h:1"),))

    d = dm.AsyncTraceDispatcher(group="CG", route_cache=Routes(), sender=Sender(),
                                flush_interval_ms=0)  # fmt: skip
    await d.start()
    tracer = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")
    q = MessageQueue("Orders", "broker-a", 0)
    msgs = [MessageExt("Orders", b"", f"M{i}", q, i, 0, 0, "h") for i in range(3)]
    early = tracer.before(msgs[0], "CG", "R")
    tracer.after(early, msgs[0], "CG", "R", 5, True, 0)  # joined while queued
    late = tracer.before(msgs[1], "CG", "R")
    assert await d.flush(5.0)
    assert late.sealed and early.sealed and early.joined and not late.joined
    tracer.after(late, msgs[1], "CG", "R", 6, True, 0)  # too late to join: alone
    assert not late.joined
    assert await d.flush(5.0)
    await d.shutdown()
    body = b"".join(sent).decode()
    assert body.count("SubBefore") == 2 and body.count("SubAfter") == 2
    assert d.stats()["sent"] == 4 and d.stats()["failed"] == 0


@compiled
def test_the_consume_hook_uses_the_compiled_tracer() -> None:
    d, hook = _consume_side()
    if c.COMPILED:
        assert isinstance(hook.before.__self__, speedups.ConsumeTracer)
        assert isinstance(hook.after.__self__, speedups.ConsumeTracer)
    # another dispatcher than the one whose state it knows: the pure-Python steps
    from tracemq.trace._hooks import ConsumeMessageTraceHook

    class Other(dm.AsyncTraceDispatcher):
        pass

    other = ConsumeMessageTraceHook(Other(group="CG", route_cache=_Routes()), "T")
    assert other.before.__self__ is other


@compiled
def test_compiled_request_ids_are_unique_beside_new_request_ids() -> None:
    """The tracer's request ids: new_request_id's form and prefix (the process's msgId prefix,
    then a counter in hex), from a counter of the module's own whose blocks have their top
    bit set, so unique among both; consecutive within a tracer, across its cached heads."""
    from tracemq.message_id import new_request_id

    d, _ = _consume_side()
    tracer = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")
    other = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")  # (the same counter)
    msgs = _messages()
    ours, theirs = [], []
    for i in range(600):  # across several of the cached 256-id heads
        if i % 3 == 0:
            theirs.append(new_request_id())
        else:
            token = (tracer if i % 3 == 1 else other).before(msgs[0], "CG", "R")
            ours.append(token.request_id)
            tracer.after(token, msgs[0], "CG", "R", 5, True, 0)
            d._queue.clear()
    ids = ours + theirs
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and i == i.upper() and int(i, 16) >= 0 for i in ids)
    assert {i[:20] for i in ids} == {new_request_id()[:20]}
    numbers = [int(i[20:], 16) for i in ours]
    assert numbers == sorted(numbers) and numbers[-1] - numbers[0] == len(ours) - 1
    assert all(n >> 47 == 1 for n in numbers)  # (the top bit of the 40-bit block)
    assert all(int(i[20:], 16) >> 47 == 0 for i in theirs)


_FORK_CHECK = textwrap.dedent(
    """
    import os
    from tracemq.message import MessageExt, MessageQueue
    from tracemq.trace import _dispatcher as dm, _speedups as S

    class Routes:
        async def get(self, topic, refresh=False):
            raise AssertionError

    d = dm.AsyncTraceDispatcher(group="CG", route_cache=Routes(), sender=object())
    tracer = S.ConsumeTracer(d, "T")
    m = MessageExt("Orders", b"", "M", MessageQueue("Orders", "b", 0), 0, 0, 0, "h")
    parent = tracer.before(m, "CG", "R").request_id
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, tracer.before(m, "CG", "R").request_id.encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 64).decode()
    after = tracer.before(m, "CG", "R").request_id
    print(parent, child, after)
    """
)


@compiled
def test_a_forked_child_renews_the_request_ids_prefix() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FORK_CHECK], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    parent, child, after = done.stdout.split()
    # the child's id carries its own pid in the prefix (its counter went on from the parent's)
    assert child[:20] != parent[:20] and after[:20] == parent[:20]
    assert len({parent, child, after}) == 3


@compiled
def test_the_dispatchers_queue_state_is_the_core_the_tracer_reads() -> None:
    # AsyncTraceDispatcher's queue state lives in DispatcherCore's C fields when the steps are
    # built: what Python writes the tracer sees, and what the tracer counts Python reads.
    from tracemq.message import MessageExt, MessageQueue

    d = dm.AsyncTraceDispatcher(group="CG", route_cache=_Routes(), sender=object(), queue_size=3)
    assert isinstance(d, speedups.DispatcherCore)
    tracer = speedups.ConsumeTracer(d, "RMQ_SYS_TRACE_TOPIC")
    q = MessageQueue("Orders", "broker-a", 0)
    msgs = [MessageExt("Orders", b"", f"M{i}", q, i, 0, 0, "h") for i in range(5)]
    d._accepted_seq = 40  # (a Python write: the next item's number)
    first = tracer.before(msgs[0], "CG", "R")
    assert first.seq == 40 and (d._accepted_seq, d._records) == (41, 1)
    tracer.after(first, msgs[0], "CG", "R", -1, True, 0)
    assert first.joined and d._records == 2
    assert d._wakeup.is_set() and d._want == sys.maxsize  # (an idle worker wants one item)
    d._wakeup.clear()
    d._want = 2  # the worker waits for two items: the second wakes it, once
    tracer.before(msgs[1], "CG", "R")
    assert d._wakeup.is_set() and d._want == sys.maxsize
    tracer.before(msgs[2], "CG", "R")
    assert tracer.before(msgs[3], "CG", "R").seq == -1  # the queue (3) is full: discarded
    d._closing = True
    assert tracer.before(msgs[4], "CG", "R").seq == -1  # shut down: discarded
    assert d.stats()["discarded"] == 2 and len(d._queue) == 3


@compiled
def test_the_tracer_needs_a_dispatcher_core() -> None:
    with pytest.raises(TypeError, match="DispatcherCore"):
        speedups.ConsumeTracer(object(), "RMQ_SYS_TRACE_TOPIC")


# ---- the producer's per-send trace path: PubTracer against the send hook's one_pub ----


def _pub_side() -> tuple[Any, Any]:
    """A dispatcher (small queue: refusals happen) and its send hook's pure one_pub."""
    from tracemq.trace._hooks import SendMessageTraceHook

    d = dm.AsyncTraceDispatcher(group="PG", route_cache=_Routes(), sender=object(), queue_size=4)
    hook = SendMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC")
    return d, SendMessageTraceHook.one_pub.__get__(hook)


class _Raises:
    """An attribute whose read raises: one_pub must swallow it, compiled or not."""

    def __get__(self, obj: object, owner: object) -> Any:
        raise RuntimeError("broken attribute")


class _BadMsg:
    topic = "Orders"
    keys_str = _Raises()
    tags = None
    body = b"x"


# anything the producer could hand over, and some things it never would
_any_value = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3))


def _real_message(topic: str, keys: Any, tags: str | None, body: Any, set_keys: bool) -> Any:
    """A Message (read from its slots by the compiled tracer), its keys set afterwards to
    anything at all when ``set_keys`` (keys_str is a property the tracer computes itself)."""
    from tracemq.message import Message

    m = Message(topic, b"body", tags=tags)
    m.body = body
    m.keys = keys if set_keys else ([] if keys is None else [k for k in str(keys).split() if k])
    return m


def _real_queue(on: Any, region: str, address: str) -> Any:
    from tracemq.routing.model import QueueRoute

    return QueueRoute("broker-a", "c", 4, 4, 6, "k:1", address, region_id=region, trace_on=on)


def _real_result(offset_msg_id: Any, via_of: bool) -> Any:
    from tracemq.message import MessageQueue, SendResult, SendStatus

    args = (SendStatus.SEND_OK, "M", offset_msg_id, MessageQueue("Orders", "broker-a", 0), 5,
            "DefaultRegion", True, 0, None)  # fmt: skip
    return SendResult._of(*args) if via_of else SendResult(*args)


_pub_msg = st.one_of(
    st.builds(
        _real_message,
        st.sampled_from(["Orders", "RMQ_SYS_TRACE_TOPIC", "Pay"]),
        st.one_of(
            st.none(),
            st.text(max_size=6),
            st.lists(st.text(max_size=3), max_size=3),
            st.tuples(st.text(max_size=2)),
            st.integers(),
        ),  # fmt: skip
        st.one_of(st.none(), st.sampled_from(["TagA", ""])),
        st.one_of(st.binary(max_size=8), st.integers()),
        st.booleans(),
    ),
    st.builds(
        lambda topic, keys, tags, body: __import__("types").SimpleNamespace(
            topic=topic, keys_str=keys, tags=tags, body=body
        ),
        st.sampled_from(["Orders", "RMQ_SYS_TRACE_TOPIC", "Pay"]),
        st.one_of(st.none(), st.text(max_size=6)),
        st.one_of(st.none(), st.text(max_size=4)),
        st.one_of(st.binary(max_size=8), st.integers()),  # an int body: len() raises
    ),
    st.just(_BadMsg()),
)
_pub_queue = st.builds(
    lambda real, on, region, address: (
        _real_queue(on, region, address)
        if real
        else __import__("types").SimpleNamespace(trace_on=on, region_id=region, address=address)
    ),  # fmt: skip
    st.booleans(),
    st.one_of(st.booleans(), st.just(1), st.just("")),
    st.sampled_from(["DefaultRegion", "R2"]),
    st.sampled_from(["10.0.0.1:10911", ""]),
)
_pub_result = st.one_of(
    st.none(),
    st.builds(
        lambda o: __import__("types").SimpleNamespace(offset_msg_id=o),
        st.one_of(st.none(), st.text(max_size=4)),
    ),
    st.builds(_real_result, st.one_of(st.none(), st.text(max_size=4)), st.booleans()),
)
_pub_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("pub"),
            _pub_msg,
            st.text(max_size=4),
            _pub_queue,
            st.one_of(st.integers(-5, 5), _any_value),
            st.one_of(st.integers(-5, 5), _any_value),
            st.integers(0, 3),
            _pub_result,
        ),  # fmt: skip
        st.tuples(st.just("take"), st.integers(0, 4)),  # the worker gathers up to n items
        st.tuples(st.just("want"), st.integers(1, 3)),  # the worker waits for n items
        st.tuples(st.just("close")),
    ),
    max_size=40,
)


def _run_pub_ops(d: Any, one_pub: Any, ops: list[Any]) -> list[Any]:
    states = []
    for op in ops:
        if op[0] == "pub":
            _, msg, msg_id, queue, begin, end, msg_type, result = op
            assert one_pub(msg, msg_id, "PG", queue, begin, end, msg_type, result) is None
        elif op[0] == "take":
            for _ in range(min(op[1], len(d._queue))):
                d._batch.append(d._queue.popleft())
                d._taken_seq += 1
        elif op[0] == "want":
            d._want = op[1]
            d._wakeup.clear()
        elif op[0] == "close":
            d._closing = True
        states.append(
            (
                list(d._queue),
                list(d._batch),
                d._accepted_seq,
                d._taken_seq,
                d._want,
                d._wakeup.is_set(),
                {k: v for k, v in d.stats().items() if "latency" not in k},
            )
        )
    return states


@compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_pub_ops)
def test_compiled_pub_tracer_equals_the_reference(ops: list[Any]) -> None:
    d_ref, pure = _pub_side()
    d_c, _ = _pub_side()
    tracer = speedups.PubTracer(d_c, "RMQ_SYS_TRACE_TOPIC")
    assert _run_pub_ops(d_c, tracer.one_pub, ops) == _run_pub_ops(d_ref, pure, ops)


@compiled
def test_the_send_hook_uses_the_compiled_tracer() -> None:
    from tracemq.trace._hooks import SendMessageTraceHook

    d = dm.AsyncTraceDispatcher(group="PG", route_cache=_Routes(), sender=object())
    hook = SendMessageTraceHook(d, "RMQ_SYS_TRACE_TOPIC")
    assert isinstance(hook.one_pub.__self__, speedups.PubTracer)

    class Other(dm.AsyncTraceDispatcher):  # a dispatcher whose state it does not know
        pass

    other = SendMessageTraceHook(Other(group="PG", route_cache=_Routes()), "T")
    assert other.one_pub.__self__ is other


@compiled
def test_the_pub_tracer_queues_what_a_producer_sends() -> None:
    # a real message, route and result: the record the worker writes, the queue's bound, the
    # worker's wake-up, shutdown
    from tracemq.message import Message, MessageQueue, SendResult, SendStatus
    from tracemq.routing.model import QueueRoute

    d = dm.AsyncTraceDispatcher(group="PG", route_cache=_Routes(), sender=object(), queue_size=2)
    tracer = speedups.PubTracer(d, "RMQ_SYS_TRACE_TOPIC")
    route = QueueRoute("broker-a", "C", 4, 4, 6, "k:9092", "10.0.0.1:10911", "R1")
    msg = Message("Orders", b"abc", tags="TagA", keys=["k1", "k2"])
    result = SendResult(
        SendStatus.SEND_OK, "MID", "OFFID", MessageQueue("Orders", "broker-a", 1), 7, "R1", True
    )
    d._accepted_seq = 10
    tracer.one_pub(msg, "MID", "PG", route, 100, 104, 0, result)
    assert list(d._queue) == [
        (c.PUB, "Orders", "R1", "MID", "k1 k2", 100, "PG", "TagA", "10.0.0.1:10911", 3, 4, 0,
         "OFFID", True)
    ]  # fmt: skip
    assert (d._accepted_seq, d._records) == (11, 1)
    assert d._wakeup.is_set() and d._want == sys.maxsize  # (an idle worker wants one item)
    tracer.one_pub(msg, "MID2", "PG", route, 100, 90, 0, None)  # failed; clock went back
    assert d._queue[1][8] is None and d._queue[1][10] == 0 and d._queue[1][-1] is False
    tracer.one_pub(msg, "MID3", "PG", route, 100, 104, 0, result)  # the queue (2) is full
    d._closing = True
    tracer.one_pub(msg, "MID4", "PG", route, 100, 104, 0, result)  # shut down
    assert d.stats()["discarded"] == 2 and len(d._queue) == 2
    with pytest.raises(TypeError, match="DispatcherCore"):
        speedups.PubTracer(object(), "RMQ_SYS_TRACE_TOPIC")
