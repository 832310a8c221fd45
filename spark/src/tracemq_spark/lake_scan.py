"""Stage "lake scan" of the reconciliation job (:mod:`tracemq_spark.job`): which Parquet files
of the trace lake a run reads, and one pre-flight scan of them.

The lake's layout, file rules and schema are :mod:`tracemq.lake`, shared with the collector
that writes it. :meth:`LakeScan.discover` lists the hour partitions overlapping the read range,
drops files a compaction superseded (:func:`tracemq.lake.live_files`) and checks every file's schema version (footer
metadata); :meth:`LakeScan.preflight` reads a few columns once: every row's schema version, the
row counts (an empty window is an error), the strings of the hashed columns (the xxhash64
dictionary the outputs decode with) and the consuming clients of broadcasting groups.
:meth:`LakeScan.events` is the read of the lake every later stage starts from. A damaged file
becomes a :class:`~tracemq_spark.params.ReconcileError` naming it (:func:`_corrupt_message`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from tracemq import lake

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
        try:
            meta = fs.parquet_metadata(files, (version_key, compacted_key))
        except Exception as exc:
            raise ReconcileError(_corrupt_message(exc, files)) from None
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
        self.say(f"{len(files)} lake files in [{_iso(self.read_lo)}, {_iso(self.read_hi)})")

    def events(self, *columns: str) -> DataFrame:
        # The time filter's dictionary row-group check expands every row group's timestamp
        # dictionary and never drops one here (the files of the read range are chosen by
        # hour): ~2 % of the reads' CPU. Statistics still prune.
        df = (
            self.spark.read.schema(spark_schema())
            .option("parquet.filter.dictionary.enabled", "false")
            .parquet(*self.files)
        )
        ts = F.col("timestamp")
        return df.where((ts >= self.read_lo) & (ts < self.read_hi)).select(*columns)

    def preflight(
        self,
        subs: list[SubRow],
        offsets: Callable[[], list[OffsetRow]],
        bgroups: list[str],
    ) -> None:
        """One scan of a few columns: every row's schema version, the row counts (an empty
        window is an error), the strings of the hashed columns (group, topic, client host)
        and the consuming clients of broadcasting groups. ``offsets`` is called once the
        scan is done (the job parses the snapshot meanwhile); its strings join the
        dictionary."""
        col = F.col
        ts = col("timestamp")
        in_window = ((ts >= self.f_ms) & (ts < self.t_ms)).cast("long")
        try:
            rows = (
                self.events(
                    "timestamp",
                    "schema_version",
                    "trace_type",
                    "group_name",
                    "topic",
                    "client_host",
                )
                .groupBy("trace_type", "schema_version", "group_name", "topic", "client_host")
                .agg(F.count(F.lit(1)).alias("n"), F.sum(in_window).alias("in_window"))
                .collect()
            )
        except Exception as exc:
            raise ReconcileError(_corrupt_message(exc, self.files)) from None
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
            f"{total:,} events in the read range, {in_window_n:,} in the window; "
            f"{len(self.broadcast_clients)} broadcasting client(s)"
        )

    def _build_dictionary(self, strings: list[str]) -> None:
        """xxhash64 → string for every string the hot path hashes (computed by Spark, so it
        is the same hash); a collision (never seen in practice) stops the run."""
        schema = T.StructType([T.StructField("s", T.StringType(), False)])
        d = self.spark.createDataFrame([(x,) for x in strings], schema).select(
            F.xxhash64("s").alias("h"), "s"
        )
        pairs = [(r["h"], r["s"]) for r in d.collect()]
        table: dict[int, str] = {}
        for h, v in pairs:
            if h in table and table[h] != v:
                raise RuntimeError(f"xxhash64 collision between {table[h]!r} and {v!r}")
            table[h] = v
        self.dictionary = table
        self.hash_of = {v: h for h, v in pairs}
        self.dict_df = self.spark.createDataFrame(
            sorted(table.items()),
            T.StructType(
                [T.StructField("h", T.LongType(), False), T.StructField("s", T.StringType(), False)]
            ),
        )


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
