"""A lake file's footer summary (tracemq.lake.summary): what the Spark job's pre-flight takes
instead of scanning the file, so it must say exactly what a scan would count."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracemq import lake
from tracemq.lake import summary as summary_mod

TYPES = ("Pub", "SubBefore", "SubAfter", "EndTransaction")
maybe_text = st.none() | st.sampled_from(["", "G1", "G2", "TopicA", "10.0.0.1@1", "é\u2028x"])
row = st.tuples(
    st.sampled_from(TYPES),
    st.integers(1, 3),
    maybe_text,
    maybe_text,
    maybe_text,
    st.integers(-(2**62), 2**62),
)


def table_of(rows: list[tuple[Any, ...]]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(6)]
    names = ("trace_type", "schema_version", "group_name", "topic", "client_host", "timestamp")
    types = (pa.string(), pa.int32(), pa.string(), pa.string(), pa.string(), pa.int64())
    return pa.table(
        {n: pa.array(list(c), type=t) for n, c, t in zip(names, cols, types, strict=True)}
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(row, max_size=60))
def test_a_summary_counts_the_rows_as_a_scan_would(rows: list[tuple[Any, ...]]) -> None:
    value = lake.summarize(table_of(rows))
    assert value is not None
    s = lake.parse_summary(value)
    assert s.rows == len(rows)
    counted = Counter(r[:5] for r in rows)
    assert {g[:5]: g[5] for g in s.groups} == counted
    assert len(s.groups) == len(counted)
    stamps = [r[5] for r in rows]
    assert (s.min_ts, s.max_ts) == (min(stamps, default=None), max(stamps, default=None))
    assert lake.summarize(table_of(list(reversed(rows)))) == value  # one text per rows


def test_too_many_groups_get_no_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [("Pub", 1, f"G{i}", "T", None, i) for i in range(5)]
    monkeypatch.setattr(summary_mod, "MAX_GROUPS", 5)
    assert lake.summarize(table_of(rows)) is not None
    monkeypatch.setattr(summary_mod, "MAX_GROUPS", 4)
    assert lake.summarize(table_of(rows)) is None


def test_inside_and_outside_a_range() -> None:
    s = lake.parse_summary(
        lake.summarize(table_of([("Pub", 1, "G", "T", None, t) for t in (10, 19)]))
    )
    assert s.inside(10, 20) and not s.inside(11, 20) and not s.inside(10, 19)
    assert s.outside(20, 30) and s.outside(0, 10) and not s.outside(19, 30) and not s.outside(0, 11)
    empty = lake.parse_summary(lake.summarize(table_of([])))
    assert empty.rows == 0 and empty.inside(5, 6) and empty.outside(5, 6)


GOOD = {"v": 1, "rows": 3, "min_ts": 5, "max_ts": 9, "groups": [["Pub", 1, "G", None, None, 3]]}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"v": 2}, "version"),
        ({"v": True}, "version"),
        ({"rows": -1}, "rows"),
        ({"rows": 4}, "hold 3 rows, not its 4"),
        ({"min_ts": 10}, "time span"),
        ({"max_ts": None}, "time span"),
        ({"groups": {}}, "not a list"),
        ({"groups": [["Pub", 1, "G", None, 3]]}, "is not 6 values"),
        ({"groups": [["Pub", "1", "G", None, None, 3]]}, "schema version"),
        ({"groups": [["Pub", 1, 7, None, None, 3]]}, "texts"),
        ({"groups": [["Pub", 1, "G", None, None, 0], ["Pub", 1, "H", None, None, 3]]}, "no rows"),
        ({"groups": [["Pub", 1, "G", None, None, 3.0]]}, "not a count"),
        ({"rows": 0, "groups": []}, "no rows has a time span"),
    ],
)
def test_a_wrong_summary_is_refused_saying_what_is_wrong(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        lake.parse_summary(json.dumps({**GOOD, **change}))


json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | json_value.map(lambda v: json.dumps(v).encode()))
def test_any_footer_value_is_a_summary_or_a_value_error(value: bytes) -> None:
    try:
        s = lake.parse_summary(value)
    except ValueError:
        return
    assert s.rows == sum(g[5] for g in s.groups)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "v": st.just(1) | st.integers(0, 2),
            "rows": st.integers(-1, 4),
            "min_ts": st.none() | st.integers(0, 9),
            "max_ts": st.none() | st.integers(0, 9),
            "groups": st.lists(
                st.lists(st.none() | st.integers(0, 3) | st.sampled_from(["Pub", "G"]), max_size=7),
                max_size=3,
            ),
        }
    )
)
def test_summary_shaped_values_too(doc: dict[str, Any]) -> None:
    try:
        s = lake.parse_summary(json.dumps(doc))
    except ValueError:
        return
    assert s.rows == sum(g[5] for g in s.groups) and all(g[5] > 0 for g in s.groups)


# ---- the per-minute counts: a file across a run's edge answered without a scan

MIN = lake.summary.MINUTE_MS
# times within a few minutes (either side of 0: the minutes are floored, as UTC minutes are)
near_row = st.tuples(
    st.sampled_from(TYPES),
    st.integers(1, 3),
    maybe_text,
    maybe_text,
    maybe_text,
    st.integers(-3 * MIN, 4 * MIN),
)
# an edge: a whole minute, or any time (counted only when it is outside the rows' span)
edge = st.integers(-5, 6).map(lambda m: m * MIN) | st.integers(-5 * MIN, 6 * MIN)


@settings(max_examples=300, deadline=None)
@given(st.lists(near_row, min_size=1, max_size=60), edge, edge)
def test_counts_in_a_range_are_a_count_of_the_rows(
    rows: list[tuple[Any, ...]], lo: int, hi: int
) -> None:
    s = lake.parse_summary(lake.summarize(table_of(rows)) or b"")
    assert s.minutes is not None and len(s.minutes) == len(s.groups)
    got = s.counts_in(lo, hi)
    stamps = [r[5] for r in rows]
    whole = s.inside(lo, hi) or s.outside(lo, hi)  # (answered from the span alone)
    on_edge = (lo <= min(stamps) or lo > max(stamps) or lo % MIN == 0) and (
        hi <= min(stamps) or hi > max(stamps) or hi % MIN == 0
    )
    if not (whole or on_edge):
        assert got is None
        return
    assert got is not None
    want = Counter(r[:5] for r in rows if lo <= r[5] < hi)
    assert {g[:5]: n for g, n in zip(s.groups, got, strict=True) if n} == want


def test_a_file_with_no_minutes_answers_only_from_outside_its_span() -> None:
    rows = [("Pub", 1, "G", "T", None, t) for t in (10 * MIN + 5, 12 * MIN + 7)]
    doc = json.loads(lake.summarize(table_of(rows)) or b"")
    assert doc["minutes"] == [[1, 0, 1]]
    del doc["minutes"]  # (a summary written before the per-minute counts)
    s = lake.parse_summary(json.dumps(doc))
    assert s.minutes is None
    assert s.counts_in(0, 11 * MIN) is None and s.counts_in(0, 10 * MIN) == [0]
    assert s.counts_in(10 * MIN, 13 * MIN) == [2] and s.counts_in(13 * MIN, 20 * MIN) == [0]


def test_too_many_minute_counts_leave_them_out(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [("Pub", 1, f"G{i % 2}", "T", None, i * MIN) for i in range(6)]  # 2 groups x 6 min
    monkeypatch.setattr(summary_mod, "MAX_MINUTE_CELLS", 12)
    assert "minutes" in json.loads(lake.summarize(table_of(rows)) or b"")
    monkeypatch.setattr(summary_mod, "MAX_MINUTE_CELLS", 11)
    doc = json.loads(lake.summarize(table_of(rows)) or b"")
    assert "minutes" not in doc and doc["groups"] == [
        ["Pub", 1, "G0", "T", None, 3],
        ["Pub", 1, "G1", "T", None, 3],
    ]
    monkeypatch.setattr(summary_mod, "MAX_MINUTE_CELLS", 5)  # (fewer than the minutes)
    assert json.loads(lake.summarize(table_of(rows)) or b"")["rows"] == 6
    monkeypatch.setattr(summary_mod, "MAX_GROUPS", 1)
    assert lake.summarize(table_of(rows)) is None


def test_times_at_the_ends_of_int64_get_their_minutes() -> None:
    for t0 in (-(2**63), 2**63 - 1 - 3 * MIN):
        rows = [("Pub", 1, "G", "T", None, t0 + d) for d in (0, 1, 3 * MIN)]
        s = lake.parse_summary(lake.summarize(table_of(rows)) or b"")
        assert s.minutes is not None and sum(s.minutes[0]) == 3
        assert s.minutes[0][0] == (1 if t0 % MIN == MIN - 1 else 2)  # t0, t0 + 1 ms


MINUTES = {**GOOD, "min_ts": 5, "max_ts": MIN + 9, "minutes": [[2, 1]]}


@pytest.mark.parametrize(
    ("minutes", "says"),
    [
        ({}, "not 1 lists"),
        ([[2, 1], [0, 0]], "not 1 lists"),
        ([[3]], "not 2 counts"),
        ([[2, 1, 0]], "not 2 counts"),
        ([[2, "1"]], "not all counts"),
        ([[4, -1]], "not all counts"),
        ([[2, True]], "not all counts"),
        ([[1, 1]], "do not add up"),
        ([[3, 0]], "last minute"),
    ],
)
def test_wrong_minutes_are_refused_saying_what_is_wrong(minutes: Any, says: str) -> None:
    assert lake.parse_summary(json.dumps(MINUTES)).minutes == ((2, 1),)
    with pytest.raises(ValueError, match=says):
        lake.parse_summary(json.dumps({**MINUTES, "minutes": minutes}))


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "v": st.just(1),
            "rows": st.integers(0, 4),
            "min_ts": st.none() | st.integers(-MIN, MIN),
            "max_ts": st.none() | st.integers(-MIN, 2 * MIN),
            "groups": st.lists(
                st.tuples(st.just("Pub"), st.just(1), st.none(), st.none(), st.none())
                .map(list)
                .flatmap(lambda g: st.integers(0, 4).map(lambda n: [*g, n])),
                max_size=2,
            ),
            "minutes": st.none()
            | st.lists(st.lists(st.integers(-1, 4) | st.booleans(), max_size=4), max_size=3),
        }
    )
)
def test_minutes_shaped_values_too(doc: dict[str, Any]) -> None:
    try:
        s = lake.parse_summary(json.dumps(doc))
    except ValueError:
        return
    if s.minutes:
        assert [sum(m) for m in s.minutes] == [g[5] for g in s.groups]
        assert s.min_ts is not None and s.max_ts is not None
        for lo in range(-2 * MIN, 4 * MIN, MIN):
            got = s.counts_in(lo, lo + MIN)
            assert got is not None and all(n >= 0 for n in got)
