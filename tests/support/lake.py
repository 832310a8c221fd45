"""Read a collector's trace lake the way the Spark job does
(``tracemq_spark.lake_scan.LakeScan.discover``): every data file of every ``date=/hour=``
directory (names starting with ``.`` or ``_`` and ``.crc`` files skipped), minus the files a
compacted file in the same directory names in its ``compacted_from`` footer metadata. No other
deduplication: a row written twice shows twice."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tracemq import lake_schema


def lake_files_as_spark_reads(root: Path) -> list[Path]:
    files: list[Path] = []
    for day in sorted(root.glob("date=*")):
        for hour in sorted(day.glob("hour=*")):
            here = [
                f
                for f in hour.iterdir()
                if f.is_file() and not f.name.startswith(("_", ".")) and not f.name.endswith(".crc")
            ]
            superseded: set[str] = set()
            for f in here:
                meta = pq.read_metadata(f).metadata or {}
                raw = meta.get(lake_schema.COMPACTED_FROM_KEY)
                if raw is not None:
                    superseded.update(n for n in json.loads(raw) if n != f.name)
            files += [f for f in here if f.name not in superseded]
    return files


def read_lake_as_spark(root: Path, columns: list[str]) -> pa.Table:
    """``columns`` of every row the Spark job would read from the lake at ``root``."""
    files = lake_files_as_spark_reads(root) if root.exists() else []
    if not files:
        return pa.table({c: pa.array([], lake_schema.SCHEMA.field(c).type) for c in columns})
    return pa.concat_tables(pq.read_table(f, columns=columns) for f in files)
