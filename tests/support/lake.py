"""Read a collector's trace lake the way the Spark job does
(``tracemq_spark.lake_scan.LakeScan.discover``): every file of every ``date=/hour=`` directory
that is not hidden, minus the files a compacted file names (both rules from :mod:`tracemq.lake`).
No other deduplication: a row written twice shows twice."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracemq import lake


def lake_files_as_spark_reads(root: Path) -> list[Path]:
    footers: dict[str, list[str]] = {}
    for day in sorted(root.glob("date=*")):
        for hour in sorted(day.glob("hour=*")):
            for f in hour.iterdir():
                if f.is_file() and not lake.is_hidden(f.name):
                    meta = pq.read_metadata(f).metadata or {}
                    footers[f.as_posix()] = lake.compacted_from(meta.get(lake.COMPACTED_FROM_KEY))
    return [Path(f) for f in lake.live_files(footers)[0]]


def read_lake_as_spark(root: Path, columns: list[str]) -> pa.Table:
    """``columns`` of every row the Spark job would read from the lake at ``root``."""
    files = lake_files_as_spark_reads(root) if root.exists() else []
    if not files:
        return pa.table({c: pa.array([], lake.arrow_schema().field(c).type) for c in columns})
    return pa.concat_tables(pq.read_table(f, columns=columns) for f in files)
