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
