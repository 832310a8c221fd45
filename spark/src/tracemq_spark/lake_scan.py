"""Stage "lake scan" of the reconciliation job (:mod:`tracemq_spark.job`): which Parquet files
of the trace lake a run reads, and one pre-flight scan of them.

The lake's layout, file rules and schema are :mod:`tracemq.lake`, shared with the collector
that writes it. :meth:`LakeScan.discover` lists the hour partitions overlapping the read range,
drops files a compaction superseded (:func:`tracemq.lake.live_files`) and checks every file's schema version (footer
metadata); :meth:`LakeScan.preflight` finds every row's schema version, the row counts (an empty
window is an error), the strings of the hashed columns (the xxhash64 dictionary the outputs
decode with) and the consuming clients of broadcasting groups — from the files' footer
summaries (:mod:`tracemq.lake.summary`) where they answer it, by one scan of a few columns of
the other files.
:meth:`LakeScan.events` is the read of the lake every later stage starts from. A damaged file
becomes a :class:`~tracemq_spark.params.ReconcileError` naming it (:func:`_corrupt_message`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import xxhash
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from tracemq import lake

from tracemq_spark.fs import Footer
from tracemq_spark.input_files import OffsetRow, SubRow
from tracemq_spark.params import KNOWN_SCHEMA_VERSIONS, ReconcileError, _iso
from tracemq_spark.session import spark_schema


class LakeScan:
    """The lake files of one run's read range ``[read_lo, read_hi)`` and what the pre-flight
    scan found in them (set by :meth:`discover` and :meth:`preflight`, in that order)."""

    def __init__(
        self,
        spark: SparkSession,
        fs: Any,
        lake: str,
        lake_name: str,
        f_ms: int,
        t_ms: int,
        read_lo: int,
        read_hi: int,
        say: Callable[[str], None],
    ) -> None:
        self.spark = spark
        self.fs = fs
        self.lake = lake  # qualified URI
        self.lake_name = lake_name  # as given, for messages
        self.f_ms = f_ms
        self.t_ms = t_ms
        self.read_lo = read_lo
        self.read_hi = read_hi
        self.say = say
        self.files: list[str] = []
        self.superseded = 0
        self.stats: dict[str, Any] = {}
        self.dictionary: dict[int, str] = {}
        self.hash_of: dict[str, int] = {}
        self.broadcast_clients: list[tuple[str, str, str]] = []
        #: the files' summaries that agree with their footers (set by discover)
        self.summaries: dict[str, lake.FileSummary] = {}
        #: the files the pre-flight read (the others answered by their summaries)
        self.scanned: list[str] = []
        #: of the files answered by their summaries, those across an edge of the read range
        #: or the window (answered by their per-minute counts)
        self.by_minute = 0

    def discover(self) -> None:
        """The Parquet files of the hour partitions that overlap the read range, and their
        schema version (footer metadata)."""
        fs = self.fs
        files: list[str] = []
        for day, hours in sorted(lake.hours_overlapping(self.read_lo, self.read_hi).items()):
            day_dir = fs.join(self.lake, lake.date_dir(day))
            for name, is_dir, _ in fs.list(day_dir):
                if is_dir and lake.parse_hour_dir(name) in hours:
                    files.extend(fs.data_files(fs.join(day_dir, name)))
        if not files:
            raise ReconcileError(
                f"empty window: the lake {self.lake_name} has no data files for "
                f"[{_iso(self.read_lo)}, {_iso(self.read_hi)}) (window [{_iso(self.f_ms)}, "
                f"{_iso(self.t_ms)}) plus the horizon)"
            )
        version_key = lake.METADATA_KEY.decode()
        compacted_key = lake.COMPACTED_FROM_KEY.decode()
        summary_key = lake.SUMMARY_KEY.decode()
        try:
            footers = fs.parquet_footers(files, (version_key, compacted_key, summary_key), _RANGED)
        except Exception as exc:
            raise ReconcileError(_corrupt_message(exc, files)) from None
        meta = {f: footer.kv for f, footer in footers.items()}
        files, self.superseded = _live_files(meta, compacted_key)
        if self.superseded:  # a compaction's leftovers (it deletes them after the rename)
            self.say(f"{self.superseded} file(s) superseded by compacted files: skipped")
        versions = {f: meta[f][version_key] for f in files}
        bad = {f: v for f, v in versions.items() if v is None or not _known_version(v)}
        if bad:
            f, v = sorted(bad.items())[0]
            raise ReconcileError(
                f"unknown lake schema version {v!r} in {f} ({len(bad)} file(s)); this job "
                f"reads version(s) {sorted(KNOWN_SCHEMA_VERSIONS)}"
            )
        self.files = sorted(files)
        self.summaries, distrusted = _summaries(footers, self.files, summary_key)
        self.say(
            f"{len(files)} lake files in [{_iso(self.read_lo)}, {_iso(self.read_hi)}), "
            f"{len(self.summaries)} with a summary"
            + (
                f" ({distrusted} more disagreeing with their footers: scanned)"
                if distrusted
                else ""
            )
        )

    def events(self, *columns: str) -> DataFrame:
        """``columns`` of the rows of the read range."""
        return self._read(self.files, *columns)

    def _read(self, files: list[str], *columns: str) -> DataFrame:
        # The time filter's dictionary row-group check expands every row group's timestamp
        # dictionary and never drops one here (the files of the read range are chosen by
        # hour): ~2 % of the reads' CPU. Statistics still prune.
        df = (
            self.spark.read.schema(spark_schema())
            .option("parquet.filter.dictionary.enabled", "false")
            .parquet(*files)
        )
        ts = F.col("timestamp")
        return df.where((ts >= self.read_lo) & (ts < self.read_hi)).select(*columns)

    def preflight(
        self,
        subs: list[SubRow],
        offsets: Callable[[], list[OffsetRow]],
        bgroups: list[str],
    ) -> None:
        """Every row's schema version, the row counts (an empty window is an error), the
        strings of the hashed columns (group, topic, client host) and the consuming clients of
        broadcasting groups: a file's summary answers for it when all its rows are in the read
        range and all inside the window or all outside; the other files get one scan of a few
        columns (:attr:`scanned`). ``offsets`` is called once that is done (the job
        parses the snapshot meanwhile); its strings join the dictionary."""
        col = F.col
        ts = col("timestamp")
        in_window = ((ts >= self.f_ms) & (ts < self.t_ms)).cast("long")
        rows: list[dict[str, Any]] = []
        scan: list[str] = []
        by_minute = 0
        for f in self.files:
            summary = self.summaries.get(f)
            counts = None if summary is None else self._counts(summary)
            if counts is None:
                scan.append(f)
                continue
            assert summary is not None
            by_minute += not self._answers(summary)
            for (trace_type, version, group, topic, client, _), n, n_window in zip(
                summary.groups, *counts, strict=True
            ):
                if n:  # (as the scan: a group with rows in the read range)
                    rows.append(
                        {
                            "trace_type": trace_type,
                            "schema_version": version,
                            "group_name": group,
                            "topic": topic,
                            "client_host": client,
                            "n": n,
                            "in_window": n_window,
                        }
                    )
        self.scanned = scan
        self.by_minute = by_minute
        if scan:
            try:
                rows += [
                    r.asDict()
                    for r in self._read(scan, *_PREFLIGHT_COLUMNS)
                    .groupBy(*lake.summary.GROUP_COLUMNS)
                    .agg(F.count(F.lit(1)).alias("n"), F.sum(in_window).alias("in_window"))
                    .collect()
                ]
            except Exception as exc:
                raise ReconcileError(_corrupt_message(exc, scan)) from None
        unknown = sorted({r["schema_version"] for r in rows} - KNOWN_SCHEMA_VERSIONS, key=str)
        if unknown:
            raise ReconcileError(
                f"unknown lake schema version {unknown[0]!r} in the rows of the read range; "
                f"this job reads version(s) {sorted(KNOWN_SCHEMA_VERSIONS)}"
            )
        total = sum(r["n"] for r in rows)
        in_window_n = sum(r["in_window"] or 0 for r in rows)
        by_type: dict[str, int] = {}
        for r in rows:
            by_type[r["trace_type"]] = by_type.get(r["trace_type"], 0) + r["n"]
        self.stats = {
            "events_read": total,
            "events_in_window": in_window_n,
            "events_by_type": dict(sorted(by_type.items())),
            "files": len(self.files),
            "files_superseded": self.superseded,
        }
        if in_window_n == 0:
            raise ReconcileError(
                f"empty window: no trace events in [{_iso(self.f_ms)}, {_iso(self.t_ms)}) in "
                f"the lake {self.lake_name} ({total} events in the surrounding horizon)"
            )
        strings = {s.group for s in subs} | {s.topic for s in subs}
        strings |= {s.tag for s in subs if s.tag is not None}
        offset_rows = offsets()
        strings |= {o.group for o in offset_rows} | {o.topic for o in offset_rows}
        strings |= {o.store_addr for o in offset_rows} | {o.client for o in offset_rows}
        for r in rows:
            strings |= {r["group_name"], r["topic"], r["client_host"]}
        strings.discard(None)
        strings.discard("")
        self._build_dictionary(sorted(strings))
        bset = set(bgroups)
        self.broadcast_clients = sorted(
            {
                (r["group_name"], r["topic"], r["client_host"] or "")
                for r in rows
                if r["trace_type"] == "SubBefore"
                and r["group_name"] in bset
                and r["topic"] is not None
                and not r["topic"].startswith("%")
            }
        )
        self.say(
            f"{total:,} events in the read range, {in_window_n:,} in the window "
            f"({len(self.files) - len(scan)} of {len(self.files)} files by their summaries, "
            f"{by_minute} of them by the minute, {len(scan)} scanned); "
            f"{len(self.broadcast_clients)} broadcasting client(s)"
        )

    def _counts(self, summary: lake.FileSummary) -> tuple[list[int], list[int]] | None:
        """Each of ``summary``'s groups' rows in the read range and in the window, or None
        when the summary cannot tell (:meth:`tracemq.lake.FileSummary.counts_in`: an edge
        inside the file's span and not on a whole minute, or no per-minute counts)."""
        read = summary.counts_in(self.read_lo, self.read_hi)
        window = summary.counts_in(self.f_ms, self.t_ms)
        if read is None or window is None:
            return None
        return read, window

    def _answers(self, summary: lake.FileSummary) -> bool:
        """Whether ``summary`` alone answers the pre-flight for its file: all its rows in the
        read range, and all inside the window or all outside it."""
        window = (self.f_ms, self.t_ms)
        return summary.inside(self.read_lo, self.read_hi) and (
            summary.inside(*window) or summary.outside(*window)
        )

    def _build_dictionary(self, strings: list[str]) -> None:
        """xxhash64 → string for every string the hot path hashes (Spark's ``xxhash64`` of a
        string: XXH64 of its UTF-8 bytes with seed 42, as a signed long — :func:`spark_xxhash64`,
        held to Spark's by the tests); a collision (never seen in practice) stops the run."""
        table: dict[int, str] = {}
        hash_of: dict[str, int] = {}
        for v in strings:
            h = spark_xxhash64(v)
            if h in table and table[h] != v:
                raise RuntimeError(f"xxhash64 collision between {table[h]!r} and {v!r}")
            table[h] = v
            hash_of[v] = h
        self.dictionary = table
        self.hash_of = hash_of
        self.dict_df = self.spark.createDataFrame(
            sorted(table.items()),
            T.StructType(
                [T.StructField("h", T.LongType(), False), T.StructField("s", T.StringType(), False)]
            ),
        )


def spark_xxhash64(value: str) -> int:
    """Spark SQL's ``xxhash64(value)`` of a string, computed here: a Spark job for the
    pre-flight's few hundred strings cost ~2 s (the run's first job, cold) on its critical
    path. A lone surrogate (a JSON input's ``"\\ud800"``; no lake string holds one) has no
    UTF-8: it is hashed as ``?``, as the JVM's ``String.getBytes(UTF_8)`` gives it to Spark."""
    h = xxhash.xxh64_intdigest(value.encode("utf-8", "replace"), seed=_SPARK_HASH_SEED)
    return h - (1 << 64) if h >= (1 << 63) else h


#: The seed Spark's ``xxhash64`` function hashes with.
_SPARK_HASH_SEED = 42

#: The columns the pre-flight scans a file for (its summary's columns, and the time).
_PREFLIGHT_COLUMNS = ("timestamp", *lake.summary.GROUP_COLUMNS)
#: The integer columns whose range a footer's statistics must agree with its summary's.
_RANGED = ("timestamp", "schema_version")


def _summaries(
    footers: dict[str, Footer], files: list[str], key: str
) -> tuple[dict[str, lake.FileSummary], int]:
    """The summaries of ``files`` (:mod:`tracemq.lake.summary`) that agree with their files'
    footers — the row count, and the ranges of the time and of the schema version by the row
    groups' statistics — and how many did not (a file rewritten by a tool that kept its
    footer's metadata, rows added or taken: such a file is scanned). An unreadable summary is
    a :class:`ReconcileError` naming its file."""
    out: dict[str, lake.FileSummary] = {}
    distrusted = 0
    for f in files:
        footer = footers[f]
        value = footer.kv.get(key)
        if value is None:
            continue
        try:
            summary = lake.parse_summary(value)
        except ValueError as exc:
            raise ReconcileError(f"unreadable {key} metadata in {f}: {exc}") from None
        if _agrees(summary, footer):
            out[f] = summary
        else:
            distrusted += 1
    return out, distrusted


def _agrees(summary: lake.FileSummary, footer: Footer) -> bool:
    if summary.rows != footer.rows:
        return False
    if not summary.rows:
        return True
    versions = [g[1] for g in summary.groups]
    return footer.ranges.get("timestamp") == (summary.min_ts, summary.max_ts) and footer.ranges.get(
        "schema_version"
    ) == (min(versions), max(versions))


def _known_version(v: str) -> bool:
    try:
        return int(v) in KNOWN_SCHEMA_VERSIONS
    except ValueError:
        return False


def _live_files(
    meta: dict[str, dict[str, str | None]], compacted_key: str
) -> tuple[list[str], int]:
    """The lake's compaction rule (:func:`tracemq.lake.live_files`) over the files' footers:
    read only a compacted file, not the files it replaces, or their rows would be read twice.
    Returns (live files, superseded count)."""
    names: dict[str, list[str]] = {}
    for uri, kv in meta.items():
        try:
            names[uri] = lake.compacted_from(kv.get(compacted_key))
        except ValueError:
            raise ReconcileError(f"unreadable {compacted_key} metadata in {uri}") from None
    live, superseded = lake.live_files(names)
    return live, len(superseded)


def _corrupt_message(exc: BaseException, files: list[str]) -> str:
    text = str(exc)
    path = None
    for f in files:
        name = f.rsplit("/", 1)[-1]
        if name in text:
            path = f
            break
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), repr(exc))
    reason = (
        "not a Parquet file or damaged"
        if (
            "magic" in text.lower()
            or "footer" in text.lower()
            or "corrupt" in text.lower()
            or "not a parquet" in text.lower()
        )
        else first[:300]
    )
    where = path or "one of the lake files"
    return f"corrupt Parquet file in the lake: {where}: {reason}"


#: What Spark and Parquet say of a damaged or foreign file (any case).
_CORRUPT_SIGNS = ("magic", "footer", "corrupt", "failed_read_file", "not a parquet file")


def _maybe_corrupt(exc: BaseException, files: list[str]) -> BaseException:
    """``exc`` as a :class:`ReconcileError` naming the lake file when it says a file could not
    be read (a sign of damage, or a lake file named in it); else ``exc`` unchanged. The word
    "parquet" alone is no sign: a failed *write* (``DataFrameWriter.parquet``, the job's own
    outputs) names it too."""
    text = str(exc)
    lowered = text.lower()
    if any(k in lowered for k in _CORRUPT_SIGNS) or any(
        f.rsplit("/", 1)[-1] in text for f in files
    ):
        return ReconcileError(_corrupt_message(exc, files))
    return exc
