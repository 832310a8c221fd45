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

It also holds, under ``"minutes"`` (optional: a reader of version 1 without it ignores it),
each group's count per UTC minute of the file's span — so a file across an edge of the read
range or the window (a run's edges are whole minutes: the window grid, a horizon of whole
minutes) is answered too (:meth:`FileSummary.counts_in`) instead of scanned. A file of an hour
partition spans at most 60 minutes; the counts are left out when they would exceed
:data:`MAX_MINUTE_CELLS` (the footer stays small), and such a file is scanned across an edge,
as before.
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

#: A minute's milliseconds: the unit of a summary's per-minute counts.
MINUTE_MS = 60_000
#: More (group, minute) counts than this and a summary holds no per-minute counts (~6 bytes
#: each in the footer; an hour partition's file of 270 groups fits).
MAX_MINUTE_CELLS = 16_384

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
    #: per group (in :attr:`groups`' order), its rows per UTC minute from ``min_ts``'s to
    #: ``max_ts``'s; None when the summary has none
    minutes: tuple[tuple[int, ...], ...] | None = None

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

    def counts_in(self, lo: int, hi: int) -> list[int] | None:
        """Each group's rows (in :attr:`groups`' order) whose timestamp is in ``[lo, hi)``;
        None when the summary cannot tell: an edge strictly inside the rows' span that is not
        a whole UTC minute, or no per-minute counts."""
        if self.inside(lo, hi):
            return [g[5] for g in self.groups]
        if self.outside(lo, hi):
            return [0] * len(self.groups)
        if self.minutes is None:
            return None
        a, b = self._minute_index(lo), self._minute_index(hi)
        if a is None or b is None:
            return None
        return [sum(counts[a:b]) for counts in self.minutes]

    def _minute_index(self, edge: int) -> int | None:
        """The first of :attr:`minutes`' columns whose rows are all at or after ``edge``."""
        assert self.min_ts is not None and self.max_ts is not None  # (a file with rows)
        if edge <= self.min_ts:
            return 0
        first = self.min_ts // MINUTE_MS
        if edge > self.max_ts:
            return self.max_ts // MINUTE_MS - first + 1
        if edge % MINUTE_MS:
            return None
        return edge // MINUTE_MS - first


def summarize(table: pyarrow.Table) -> bytes | None:
    """The :data:`SUMMARY_KEY` value of a file holding ``table``'s rows (a lake table: it has
    the lake's columns); None when they have more than :data:`MAX_GROUPS` groups."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table.num_rows
    span = pc.min_max(table.column("timestamp")).as_py() if rows else {"min": None, "max": None}
    min_ts, max_ts = span["min"], span["max"]
    keys = list(GROUP_COLUMNS)
    with_minutes = False
    counted = None
    stamps = table.column("timestamp")
    if (
        min_ts is not None
        and max_ts is not None
        and max_ts // MINUTE_MS - min_ts // MINUTE_MS < MAX_MINUTE_CELLS
        and not stamps.null_count  # (the lake's timestamp is not nullable)
    ):
        width = max_ts // MINUTE_MS - min_ts // MINUTE_MS + 1
        # each row's minute as its offset from the first one, all of it small and
        # non-negative (the time itself may be any int64): (timestamp - min_ts + min_ts's ms
        # into its minute) // MINUTE_MS
        since = pc.subtract(stamps, pa.scalar(min_ts, pa.int64()))
        offset = pc.add(since, pa.scalar(min_ts % MINUTE_MS, pa.int64()))
        minute = pc.divide(offset, pa.scalar(MINUTE_MS, pa.int64()))
        by_minute = (
            table.select(keys)
            .append_column("minute", minute)
            .group_by([*keys, "minute"], use_threads=False)
            .aggregate([([], "count_all")])
        )
        if by_minute.num_rows <= MAX_MINUTE_CELLS:
            cells = zip(
                *(by_minute.column(name).to_pylist() for name in (*keys, "minute", "count_all")),
                strict=True,
            )
            per_group: dict[tuple[Any, ...], list[int]] = {}
            for *key, m, n in cells:
                row = per_group.get(tuple(key))
                if row is None:
                    row = per_group[tuple(key)] = [0] * width
                row[m] = n
            if len(per_group) > MAX_GROUPS:
                return None
            with_minutes = len(per_group) * width <= MAX_MINUTE_CELLS
            counted = [(*key, sum(row), row) for key, row in per_group.items()]
    if counted is None:
        grouped = table.select(keys).group_by(keys, use_threads=False)
        agg = grouped.aggregate([([], "count_all")])
        if agg.num_rows > MAX_GROUPS:
            return None
        columns = [agg.column(name).to_pylist() for name in (*keys, "count_all")]
        counted = [(*g, None) for g in zip(*columns, strict=True)]
    # (sorted, nulls first: the same rows give the same bytes)
    ordered = sorted(
        counted, key=lambda g: [(v is not None, v if v is not None else 0) for v in g[:-1]]
    )
    doc: dict[str, Any] = {"v": SUMMARY_VERSION, "rows": rows, "min_ts": min_ts, "max_ts": max_ts}
    doc["groups"] = [list(g[:-1]) for g in ordered]
    if with_minutes:
        doc["minutes"] = [g[-1] for g in ordered]
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
    minutes = _minutes(doc.get("minutes"), groups, min_ts, max_ts)
    return FileSummary(rows, min_ts, max_ts, tuple(groups), minutes)


def _minutes(
    raw: Any, groups: list[Group], min_ts: int | None, max_ts: int | None
) -> tuple[tuple[int, ...], ...] | None:
    """The per-minute counts of a summary's ``"minutes"`` (None when absent): one list per
    group, a count per minute of the time span, adding up to the group's rows, the first and
    the last minute not empty."""
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != len(groups):
        raise ValueError(f"summary minutes are not {len(groups)} lists, one per group")
    if min_ts is None or max_ts is None:
        return ()  # (no rows: no groups, checked above)
    width = max_ts // MINUTE_MS - min_ts // MINUTE_MS + 1
    out: list[tuple[int, ...]] = []
    first = last = 0
    for g, counts in zip(groups, raw, strict=True):
        if not isinstance(counts, list) or len(counts) != width:
            raise ValueError(f"summary minutes of group {_cut(g[:5])} are not {width} counts")
        if any(type(c) is not int or c < 0 for c in counts):
            raise ValueError(f"summary minutes of group {_cut(g[:5])}: not all counts")
        if sum(counts) != g[5]:
            raise ValueError(f"summary minutes of group {_cut(g[:5])} do not add up to its rows")
        first += counts[0]
        last += counts[-1]
        out.append(tuple(counts))
    if not first or not last:
        raise ValueError("summary minutes: the first or last minute of its span is empty")
    return tuple(out)


def _count(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"summary {what} {_cut(v)} is not a count")
    return v


def _cut(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
