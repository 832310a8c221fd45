"""The trace lake's contract (:mod:`tracemq.lake`) is the one the collector and the Spark job use.

The collector (``tracemq_collector.lake``) writes and reads its lake, the job
(``tracemq_spark.lake_scan``) discovers the files of a read range; both take the columns, the
``date=/hour=`` layout, the file names and the compaction rule from the contract, so they pick
the same live files for any set of files (checked here property-wise, with the job's real
discovery on a local file system and no JVM). Real Parquet files in temporary directories.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracemq import lake
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType, encode_many
from tracemq_collector import events as ev
from tracemq_collector.events import rows_from_record
from tracemq_collector.lake import TraceLake
from tracemq_collector.store import TraceStore
from tracemq_spark import params
from tracemq_spark.fs import Footer, HadoopFS
from tracemq_spark.lake_scan import LakeScan
from tracemq_spark.params import ReconcileError
from tracemq_spark.session import spark_schema

TOPIC = "RMQ_SYS_TRACE_TOPIC"
T0 = 1_714_546_800_000  # 2024-05-01T07:00:00Z
HOURS = ("date=2024-05-01/hour=07", "date=2024-05-01/hour=08")


class LocalFS(HadoopFS):
    """The job's file-system wrapper on the local disk without a JVM: listing and footer reads
    replaced, the job's own rules (``join``, ``data_files``) kept."""

    def __init__(self) -> None:  # no Spark session
        pass

    def list(self, uri: str) -> list[tuple[str, bool, int]]:
        path = Path(uri)
        if not path.is_dir():
            return []
        return [(p.name, p.is_dir(), 0 if p.is_dir() else p.stat().st_size) for p in path.iterdir()]

    def parquet_footers(
        self,
        files: list[str],
        keys: tuple[str, ...],
        ranged: tuple[str, ...] = (),
        threads: int = 8,
    ) -> dict[str, Footer]:
        out: dict[str, Footer] = {}
        for uri in files:
            md = pq.read_metadata(uri)
            meta = md.metadata or {}
            values = {k: meta.get(k.encode()) for k in keys}
            ranges: dict[str, tuple[int, int] | None] = {}
            names = md.schema.names
            for c in ranged:
                spans = [
                    md.row_group(g).column(names.index(c)).statistics
                    for g in range(md.num_row_groups)
                    if c in names and md.row_group(g).num_rows
                ]
                ok = spans and all(st is not None and st.has_min_max for st in spans)
                ranges[c] = (
                    (min(st.min for st in spans), max(st.max for st in spans)) if ok else None
                )
            kv = {k: None if v is None else v.decode() for k, v in values.items()}
            out[uri] = Footer(kv, md.num_rows, ranges)
        return out


def job_files(root: Path, lo: int, hi: int) -> list[str]:
    """The files the job reads for ``[lo, hi)``, relative to the lake root."""
    scan = LakeScan(None, LocalFS(), str(root), "test lake", lo, hi, lo, hi, lambda _: None)  # type: ignore[arg-type]
    try:
        scan.discover()
    except ReconcileError as exc:
        assert "empty window" in str(exc)
        return []
    return sorted(f[len(str(root)) + 1 :] for f in scan.files)


def collector_files(trace_lake: TraceLake) -> list[str]:
    return sorted(p.relative_to(trace_lake.root).as_posix() for p in trace_lake.files())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    with TraceStore(tmp_path / "traces.db") as s:
        yield s


# ------------------------------------------------------------------------------ columns


def test_one_column_list_gives_the_arrow_schema_the_spark_schema_and_the_rows() -> None:
    arrow = lake.arrow_schema()
    assert [(f.name, str(f.type), f.nullable) for f in arrow] == [c[:3] for c in lake.COLUMNS]
    assert arrow.metadata == {lake.METADATA_KEY: str(lake.SCHEMA_VERSION).encode()}
    spark_types = {"string": "string", "int64": "bigint", "int32": "int", "bool": "boolean"}
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in spark_schema().fields] == [
        (name, spark_types[typ], nullable) for name, typ, nullable, _ in lake.COLUMNS
    ]
    # The collector's event tuples carry every lake column; the job reads the contract's version.
    assert set(lake.COLUMN_NAMES) <= set(ev.ROW_NAMES)
    assert params.KNOWN_SCHEMA_VERSIONS == {lake.SCHEMA_VERSION}


def test_the_contract_imports_without_pyarrow() -> None:
    # A client-only install has no pyarrow: None in sys.modules makes any import of it fail.
    code = "import sys; sys.modules['pyarrow'] = None; import tracemq.lake; print(tracemq.lake.COLUMN_NAMES[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "trace_type"


def test_event_tuples_begin_with_the_columns_the_store_keeps() -> None:
    assert ev.ROW_NAMES[: len(ev.STORE_ROW)] == ev.STORE_ROW
    assert ev.STORE_ROW == tuple(name for name, _ in ev.STORE_COLUMNS)


# ------------------------------------------------------------------------------ layout


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(min_size=1),
    partition=st.integers(0, 99_999),
    start=st.integers(0, 10**19),
    length=st.integers(1, 10**6),
    parts=st.integers(1, 10**6),
    hour_number=st.integers(-24 * 365, 24 * 365 * 8000),
)
def test_names_and_directories_read_back_as_written(
    topic: str, partition: int, start: int, length: int, parts: int, hour_number: int
) -> None:
    end = start + length
    try:
        lake.check_trace_topic(topic)
    except ValueError:
        assert "/" in topic or "\x00" in topic or topic[0] == "."
        return
    part = lake.parse_file_name(lake.part_name(topic, partition, start, end))
    assert part == lake.LakeFileName(False, topic, partition, start, end, 1)
    compacted = lake.parse_file_name(lake.compacted_name(topic, partition, start, end, parts))
    assert compacted == lake.LakeFileName(True, topic, partition, start, end, parts)
    legacy = lake.parse_file_name(_legacy_compacted(start, end, parts))
    assert legacy == lake.LakeFileName(True, None, None, start, end, parts)
    date, hour = lake.partition_of_hour(hour_number)
    date_name, hour_name = lake.hour_dir(date, hour).split("/")
    assert date_name == lake.date_dir(date)
    assert lake.hour_start_ms(date_name, hour_name) == hour_number * lake.HOUR_MS
    assert lake.hours_overlapping(hour_number * lake.HOUR_MS, (hour_number + 1) * lake.HOUR_MS) == {
        date: {hour}
    }


def test_the_job_reads_exactly_the_files_the_collector_wrote_and_compacted(
    tmp_path: Path, store: TraceStore
) -> None:
    trace_lake = TraceLake(tmp_path / "lake", store)
    offset = 0
    for ts in (T0 + 5, T0 + 6, T0 + lake.HOUR_MS + 5, T0 + 2 * lake.HOUR_MS + 5):
        bean = TraceBean(
            topic="orders",
            msg_id=f"0A00000100640000000A{offset:012X}",
            msg_type=MessageType.Normal_Msg,
        )
        pub = TraceContext(TraceType.Pub, timestamp=ts, trace_beans=[bean])
        value = encode_many([pub]).data.encode()
        rows, quarantine = rows_from_record(TOPIC, 0, offset, value, T0)
        offset += 1
        store.write_batch(rows, quarantine, {(TOPIC, 0): offset})
        trace_lake.flush(TOPIC, 0)
    assert trace_lake.compact(T0 + 3 * lake.HOUR_MS) == 1  # hour 07 held two part files
    written = collector_files(trace_lake)
    assert [p.rsplit("/", 1)[0] for p in written] == [*HOURS, "date=2024-05-01/hour=09"]
    assert all(lake.parse_file_name(p.rsplit("/", 1)[1]) is not None for p in written)
    assert job_files(trace_lake.root, T0, T0 + 3 * lake.HOUR_MS) == written
    # The job reads only the hours of its range.
    assert job_files(trace_lake.root, T0 + lake.HOUR_MS, T0 + lake.HOUR_MS + 1) == written[1:2]


# ------------------------------------------------------------------------------ live files

_PART = st.builds(
    lambda p, s, n: lake.part_name(TOPIC, p, s, s + n),
    st.integers(0, 2),
    st.integers(0, 4),
    st.integers(1, 2),
)
_COMPACTED = st.builds(
    lambda p, s, n, k: lake.compacted_name(TOPIC, p, s, s + n, k),
    st.integers(0, 2),
    st.integers(0, 4),
    st.integers(1, 4),
    st.integers(2, 3),
)


def _legacy_compacted(start: int, end: int, parts: int) -> str:
    # the name compaction gave before it was per trace partition: still read
    return f"compacted-{start:020d}-{end:020d}-{parts:05d}.parquet"


_LEGACY = st.builds(
    lambda s, n, k: _legacy_compacted(s, s + n, k),
    st.integers(0, 4),
    st.integers(1, 2),
    st.integers(2, 3),
)
_GONE = lake.part_name(TOPIC, 9, 0, 1)  # named by a compacted file, already deleted


@st.composite
def lake_files(draw: Any) -> dict[str, list[str] | None]:
    """path below the root → the names its ``compacted_from`` footer lists (None: no such
    footer), over two hour directories: part and compacted files, a compaction's temporary
    file and a ``_SUCCESS`` marker."""
    names = {
        d: draw(st.lists(st.one_of(_PART, _COMPACTED, _LEGACY), max_size=7, unique=True))
        for d in HOURS
    }
    pool = sorted({_GONE, *(n for listed in names.values() for n in listed)})
    files: dict[str, list[str] | None] = {}
    for d, listed in names.items():
        for name in listed:
            if name.startswith("compacted-"):
                files[f"{d}/{name}"] = draw(st.lists(st.sampled_from([*pool, name]), max_size=4))
            else:
                files[f"{d}/{name}"] = None
        if listed and draw(st.booleans()):  # a compaction being written names every file
            files[f"{d}/{lake.TMP_PREFIX}0-{lake.compacted_name(TOPIC, 0, 0, 9, 9)}"] = listed
        if draw(st.booleans()):
            files[f"{d}/_SUCCESS"] = None
    return files


def _write(root: Path, files: dict[str, list[str] | None]) -> None:
    schema = lake.arrow_schema()
    for rel, listed in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "_SUCCESS":
            path.write_bytes(b"")
            continue
        empty = pa.Table.from_pylist([], schema=schema)
        pq.write_table(empty.replace_schema_metadata(lake.file_metadata(listed)), path)


def _expected_live(files: dict[str, list[str] | None]) -> list[str]:
    # The rule in plain words: of the data files (not hidden), those that no other data file
    # of their directory names, and whose rows no other compacted file of their partition and
    # directory holds: one with a wider range around theirs, or the same range and a higher
    # rank (compacted over part, then more parts, then the larger name).
    data = {p: n or [] for p, n in files.items() if not p.rsplit("/", 1)[1].startswith((".", "_"))}
    named = {
        (p.rsplit("/", 1)[0], n) for p, listed in data.items() for n in listed
        if n != p.rsplit("/", 1)[1]
    }  # fmt: skip

    def covered(path: str) -> bool:
        d, name = path.rsplit("/", 1)
        y = lake.parse_file_name(name)
        if y is None or y.topic is None:
            return False
        for other in data:
            od, oname = other.rsplit("/", 1)
            x = lake.parse_file_name(oname)
            if other == path or od != d or x is None or not x.compacted or x.topic is None:
                continue
            if (x.topic, x.partition) != (y.topic, y.partition):
                continue
            if not (x.start <= y.start and y.end <= x.end):
                continue
            wider = x.end - x.start > y.end - y.start
            if (
                wider
                or (not y.compacted)
                or x.parts > y.parts
                or (x.parts == y.parts and other > path)
            ):
                return True
        return False

    return sorted(p for p in data if tuple(p.rsplit("/", 1)) not in named and not covered(p))


def test_the_collector_and_the_job_pick_the_same_live_files_for_any_files(
    store: TraceStore,
) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(files=lake_files())
    def check(files: dict[str, list[str] | None]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "lake"
            _write(root, files)
            collector = collector_files(TraceLake(root, store))
            job = job_files(root, T0, T0 + 2 * lake.HOUR_MS)
        assert collector == job == _expected_live(files)

    check()


def test_the_collector_and_the_job_apply_one_live_file_function(
    tmp_path: Path, store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {
        f"{HOURS[0]}/{lake.part_name(TOPIC, 0, 0, 1)}": None,
        f"{HOURS[0]}/{lake.compacted_name(TOPIC, 0, 0, 1, 2)}": [lake.part_name(TOPIC, 0, 0, 1)],
    }
    _write(tmp_path / "lake", files)
    calls: list[list[str]] = []
    real = lake.live_files

    def spy(named: Any) -> tuple[list[str], list[str]]:
        calls.append([p.rsplit("/", 1)[1] for p in named])
        return real(named)

    monkeypatch.setattr(lake, "live_files", spy)
    collector = collector_files(TraceLake(tmp_path / "lake", store))
    job = job_files(tmp_path / "lake", T0, T0 + lake.HOUR_MS)
    assert collector == job == [f"{HOURS[0]}/{lake.compacted_name(TOPIC, 0, 0, 1, 2)}"]
    assert len(calls) == 2  # once by the collector, once by the job
