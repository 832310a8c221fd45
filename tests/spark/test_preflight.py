"""The pre-flight from the files' footer summaries (tracemq.lake.summary) says what the scan of
every row says: counts, the hashed strings' dictionary, the broadcasting clients — and a file
the summaries cannot answer for (a window edge inside it, no summary, a summary its footer
contradicts) is scanned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tracemq import lake as lake_contract
from tracemq_spark.fs import HadoopFS
from tracemq_spark.lake_scan import LakeScan
from tracemq_spark.params import ReconcileError

from tests.spark.conftest import END, MIN, MSGID_ZONE, NOW, START, Lake

HORIZON = 30 * MIN  # the job's default look-around (Params.horizon)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session lake's scenario written without summaries, as collectors did before them."""
    from tracemq_devkit.generator import Scenario, generate

    root = tmp_path_factory.mktemp("bare") / "lake"
    generate(
        root,
        Scenario(
            start_ms=START, end_ms=END, messages=2500, now_ms=NOW, seed=11, msgid_zone=MSGID_ZONE
        ),
        with_truth=False,
        summaries=False,
    )
    return root


def preflight(spark: Any, root: Path, f_ms: int = START, t_ms: int = END) -> LakeScan:
    scan = LakeScan(
        spark,
        HadoopFS(spark),
        f"file://{root}",
        str(root),
        f_ms,
        t_ms,
        f_ms - HORIZON,
        t_ms + HORIZON,
        lambda _: None,
    )
    scan.discover()
    scan.preflight([], list, ["G_bcast_B", "G_silent_C"])
    return scan


def answer(scan: LakeScan) -> tuple[Any, ...]:
    return scan.stats, scan.dictionary, scan.broadcast_clients


def test_bare_lake_has_no_summaries(bare: Path, lake: Lake) -> None:
    files = sorted(bare.rglob("*.parquet"))
    assert files and len(files) == len(list(lake.path.rglob("*.parquet")))
    for f in files:
        assert lake_contract.SUMMARY_KEY not in (pq.read_metadata(f).metadata or {})


@pytest.mark.parametrize(
    ("f_ms", "t_ms"),
    [
        (START, END),
        (START + 20 * MIN, END - 7 * MIN),
        (START - 50 * MIN, START + 3 * MIN),
        (START + 20 * MIN + 1500, END - 7 * MIN - 250),
    ],
    ids=["hour", "inside-hours", "across-hours", "off-minute"],
)
def test_summaries_answer_as_the_scan(
    spark: Any, lake: Lake, bare: Path, f_ms: int, t_ms: int
) -> None:
    with_summaries = preflight(spark, lake.path, f_ms, t_ms)
    scanned = preflight(spark, bare, f_ms, t_ms)
    assert answer(with_summaries) == answer(scanned)
    assert scanned.scanned == scanned.files  # no summary: every file read
    assert with_summaries.stats["events_in_window"] > 0
    assert set(with_summaries.summaries) == set(with_summaries.files)
    summaries = with_summaries.summaries
    lo, hi = f_ms - HORIZON, t_ms + HORIZON
    across = [  # the files an edge of the read range or the window cuts
        f for f in with_summaries.files if not with_summaries._answers(summaries[f])
    ]
    assert across, "no file across an edge: the test proves little"
    if f_ms % MIN == 0 and t_ms % MIN == 0:
        # whole minutes (as every run's edges): each file answered by its summary, those
        # across an edge by their per-minute counts
        assert with_summaries.scanned == []
        assert with_summaries.by_minute == len(across)
    else:  # an edge inside a minute: the files it cuts are read, and only those
        cut = [
            f
            for f in across
            if any(
                summaries[f].min_ts < e <= summaries[f].max_ts  # type: ignore[operator]
                for e in (lo, f_ms, t_ms, hi)
            )
        ]
        assert cut and with_summaries.scanned == [
            f for f in with_summaries.files if with_summaries._counts(summaries[f]) is None
        ]
        assert with_summaries.scanned == cut
    if (f_ms, t_ms) == (START, END):
        assert with_summaries.broadcast_clients, "no broadcasting client: the test proves little"


def test_summaries_without_minutes_answer_from_outside_the_edges(
    spark: Any, lake: Lake, tmp_path: Path
) -> None:
    """A lake written before the per-minute counts: its files across an edge are scanned."""
    import json
    import shutil

    copy = tmp_path / "lake"
    shutil.copytree(lake.path, copy)
    for victim in copy.rglob("*.parquet"):
        table = pq.read_table(victim, partitioning=None)
        doc = json.loads(pq.read_metadata(victim).metadata[lake_contract.SUMMARY_KEY])
        del doc["minutes"]
        meta = {**(table.schema.metadata or {}), lake_contract.SUMMARY_KEY: json.dumps(doc)}
        pq.write_table(table.replace_schema_metadata(meta), victim)
    f_ms, t_ms = START + 20 * MIN, END - 7 * MIN
    old = preflight(spark, copy, f_ms, t_ms)
    new = preflight(spark, lake.path, f_ms, t_ms)
    assert answer(old) == answer(new)
    assert old.by_minute == 0 and new.scanned == []
    assert old.scanned == [f for f in old.files if not old._answers(old.summaries[f])]
    assert len(old.scanned) == new.by_minute > 0


def test_a_summary_its_footer_contradicts_is_not_trusted(
    spark: Any, lake: Lake, tmp_path: Path
) -> None:
    """A file rewritten by a tool that keeps the footer's metadata (rows taken out here) keeps
    a summary that is no longer its own: the row count and the time range the footer's
    statistics give disagree with it, so the file is scanned."""
    import shutil

    copy = tmp_path / "lake"
    shutil.copytree(lake.path, copy)
    whole = preflight(spark, copy)
    victim = max(copy.rglob("*.parquet"), key=lambda p: pq.read_metadata(p).num_rows)
    table = pq.read_table(victim, partitioning=None)
    footer = pq.read_metadata(victim).metadata
    # (pyarrow's own round trip drops a footer key its schema does not hold; a tool keeping
    # every footer key is what this stands for)
    meta = {**table.schema.metadata, lake_contract.SUMMARY_KEY: footer[lake_contract.SUMMARY_KEY]}
    kept = table.slice(0, table.num_rows - 40).replace_schema_metadata(meta)
    pq.write_table(kept, victim)
    assert (
        pq.read_metadata(victim).metadata[lake_contract.SUMMARY_KEY]
        == meta[lake_contract.SUMMARY_KEY]
    )
    cut = preflight(spark, copy)
    assert any(f.endswith(victim.name) for f in cut.scanned)
    assert cut.stats["events_read"] == whole.stats["events_read"] - 40


def test_an_unreadable_summary_names_its_file(spark: Any, lake: Lake, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "lake"
    shutil.copytree(lake.path, copy)
    victim = sorted(copy.rglob("*.parquet"))[0]
    table = pq.read_table(victim, partitioning=None)
    meta = {**(table.schema.metadata or {}), lake_contract.SUMMARY_KEY: b'{"v": 1, "rows": '}
    pq.write_table(table.replace_schema_metadata(meta), victim)
    with pytest.raises(ReconcileError, match=f"tracemq.lake.summary.*{victim.name}.*not JSON"):
        preflight(spark, copy)


def test_the_compiled_footer_reader_says_what_the_py4j_walk_says(
    spark: Any, lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``io.tracemq.spark.Footers`` (one py4j call per file) against the row-group walk
    through py4j it replaces when the jar is there: the same key-value metadata, row counts
    and integer ranges — for the lake's files, a file without statistics, one without the
    ranged column, one whose last row group holds only nulls of it, and an empty one."""
    import pyarrow as pa

    fs = HadoopFS(spark)
    if fs._footers_class() is None:
        pytest.skip("no jar: the job reads footers through py4j only (make setup)")
    odd = {
        "nostats.parquet": (pa.table({"timestamp": [3, 1, 2]}), {"write_statistics": False}),
        "other.parquet": (pa.table({"x": [1, 2]}), {}),
        "nulls.parquet": (pa.table({"timestamp": pa.array([5, 9, None, None], pa.int64())}), {}),
        "empty.parquet": (pa.table({"timestamp": pa.array([], pa.int64())}), {}),
    }
    for name, (table, kw) in odd.items():
        pq.write_table(
            table.replace_schema_metadata({"k": "v"}), tmp_path / name, row_group_size=2, **kw
        )
    files = [*sorted(str(f) for f in lake.path.rglob("*.parquet"))[:4]]
    files += [str(tmp_path / n) for n in odd]
    keys = (lake_contract.SUMMARY_KEY.decode(), "k", "absent")
    ranged = ("timestamp", "schema_version")
    compiled = fs.parquet_footers(files, keys, ranged)
    monkeypatch.setattr(HadoopFS, "_footers_class", lambda self: None)
    walked = fs.parquet_footers(files, keys, ranged)
    assert compiled == walked
    assert compiled[str(tmp_path / "nulls.parquet")].ranges["timestamp"] is None
    assert compiled[str(tmp_path / "other.parquet")].kv["k"] == "v"
    assert compiled[files[0]].ranges["timestamp"] is not None and compiled[files[0]].rows > 0


def test_the_dictionarys_hash_is_sparks_xxhash64(spark: Any) -> None:
    """The pre-flight hashes its strings in Python (no Spark job): the values must be the ones
    Spark's ``xxhash64`` gives the same strings in the lake's rows, or nothing decodes."""
    import random

    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from tracemq_spark.lake_scan import spark_xxhash64

    rnd = random.Random(7)
    alphabet = "aZ09_-%@.| \x00\x7f\u00e9\u0800\u2028\uffff\U0001f600\U0010ffff"
    strings = ["", "G1", "RMQ_SYS_TRACE_TOPIC", "%DLQ%G1", "10.0.0.1@4711"] + [
        "".join(rnd.choice(alphabet) for _ in range(n)) for n in range(100) for _ in range(3)
    ]  # (every length up to 100: XXH64's 32-byte stripes, its 8-, 4- and 1-byte tails)
    schema = T.StructType([T.StructField("s", T.StringType(), False)])
    df = spark.createDataFrame([(s,) for s in strings], schema)
    got = {r["s"]: r["h"] for r in df.select(F.xxhash64("s").alias("h"), "s").collect()}
    assert len(got) == len(set(strings))
    assert {s: spark_xxhash64(s) for s in strings} == got
