"""What a lake file's footer says of its rows (:data:`SUMMARY_KEY`): the answer of the Spark
job's pre-flight scan for that file, so a run reads footers instead of every row of six
columns (``tracemq_spark.lake_scan``; issue 19 goal 4: ~5 s of a 10M run on two cores).

The writers (the collector's lake, the devkit's generator) put :func:`summarize` of the rows
they write in the footer; the job takes :func:`parse_summary` of it for a file whose rows all
lie on one side of each edge of its read range and window (:meth:`FileSummary.inside`,
:meth:`FileSummary.outside`), and scans the others — and any file without one (a lake written
before summaries, or a file whose rows have more than :data:`MAX_GROUPS` groups) — as before.

A summary is the rows' count and time span, and their count per
(:data:`GROUP_COLUMNS`) value: JSON, ASCII, versioned (``"v"``). Pure Python apart from
:func:`summarize`, which imports pyarrow on use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow

#: Footer metadata key of a lake file's summary (absent: the reader scans the file).
SUMMARY_KEY = b"tracemq.lake.summary"
SUMMARY_VERSION = 1
#: The columns a summary counts the rows by (what the pre-flight scan groups by).
GROUP_COLUMNS = ("trace_type", "schema_version", "group_name", "topic", "client_host")
#: More groups than this and a file gets no summary (its footer would grow with its clients).
MAX_GROUPS = 4096

#: One group of a summary: (trace_type, schema_version, group_name, topic, client_host, rows)
Group = tuple[str, int, "str | None", "str | None", "str | None", int]


@dataclass(frozen=True)
class FileSummary:
    """A file's rows: how many, their ``timestamp`` span (None when there are none) and their
    count per :data:`GROUP_COLUMNS` value."""

    rows: int
    min_ts: int | None
    max_ts: int | None
    groups: tuple[Group, ...]

    def inside(self, lo: int, hi: int) -> bool:
        """Every row's timestamp is in ``[lo, hi)`` (True for a file of no rows)."""
        if self.min_ts is None or self.max_ts is None:
            return True
        return lo <= self.min_ts and self.max_ts < hi

    def outside(self, lo: int, hi: int) -> bool:
        """No row's timestamp is in ``[lo, hi)`` (True for a file of no rows)."""
        if self.min_ts is None or self.max_ts is None:
            return True
        return self.max_ts < lo or self.min_ts >= hi


def summarize(table: pyarrow.Table) -> bytes | None:
    """The :data:`SUMMARY_KEY` value of a file holding ``table``'s rows (a lake table: it has
    the lake's columns); None when they have more than :data:`MAX_GROUPS` groups."""
    import pyarrow.compute as pc

    rows = table.num_rows
    span = pc.min_max(table.column("timestamp")).as_py() if rows else {"min": None, "max": None}
    grouped = table.select(list(GROUP_COLUMNS)).group_by(list(GROUP_COLUMNS), use_threads=False)
    counted = grouped.aggregate([([], "count_all")])
    if counted.num_rows > MAX_GROUPS:
        return None
    columns = [counted.column(name).to_pylist() for name in GROUP_COLUMNS]
    counts = counted.column("count_all").to_pylist()
    # (sorted, nulls first: the same rows give the same bytes)
    groups = sorted(
        ([*key, n] for *key, n in zip(*columns, counts, strict=True)),
        key=lambda g: [(v is not None, v if v is not None else 0) for v in g],
    )
    doc = {"v": SUMMARY_VERSION, "rows": rows, "min_ts": span["min"], "max_ts": span["max"]}
    doc["groups"] = groups
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def parse_summary(value: bytes | str) -> FileSummary:
    """The summary a :data:`SUMMARY_KEY` value describes.

    Raises:
        ValueError: anything but a summary of version :data:`SUMMARY_VERSION` whose groups'
            counts add up to its rows (the message says what is wrong).
    """
    try:
        doc = json.loads(value)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"summary is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"summary is not a JSON object: {_cut(doc)}")
    if doc.get("v") != SUMMARY_VERSION or type(doc.get("v")) is not int:
        raise ValueError(f"summary version {_cut(doc.get('v'))} is not {SUMMARY_VERSION}")
    rows = _count(doc.get("rows"), "rows")
    min_ts, max_ts = doc.get("min_ts"), doc.get("max_ts")
    if rows == 0:
        if min_ts is not None or max_ts is not None:
            raise ValueError("summary of no rows has a time span")
    elif type(min_ts) is not int or type(max_ts) is not int or min_ts > max_ts:
        raise ValueError(f"summary time span {_cut(min_ts)}..{_cut(max_ts)} is not one")
    raw = doc.get("groups")
    if not isinstance(raw, list):
        raise ValueError("summary groups are not a list")
    groups: list[Group] = []
    total = 0
    for g in raw:
        if not isinstance(g, list) or len(g) != len(GROUP_COLUMNS) + 1:
            raise ValueError(f"summary group {_cut(g)} is not {len(GROUP_COLUMNS) + 1} values")
        trace_type, version, group, topic, client, n = g
        if type(trace_type) is not str or type(version) is not int:
            raise ValueError(f"summary group {_cut(g)}: trace type or schema version")
        if any(v is not None and type(v) is not str for v in (group, topic, client)):
            raise ValueError(f"summary group {_cut(g)}: group, topic and client are texts")
        n = _count(n, "group rows")
        if n == 0:
            raise ValueError(f"summary group {_cut(g)} has no rows")
        total += n
        groups.append((trace_type, version, group, topic, client, n))
    if total != rows:
        raise ValueError(f"summary groups hold {total} rows, not its {rows}")
    return FileSummary(rows, min_ts, max_ts, tuple(groups))


def _count(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"summary {what} {_cut(v)} is not a count")
    return v


def _cut(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
