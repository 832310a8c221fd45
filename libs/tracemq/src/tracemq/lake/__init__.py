"""The trace lake's contract, in one place: what the collector writes and the Spark job reads.

* :mod:`tracemq.lake.schema`: the columns (:data:`COLUMNS`, Arrow type names), the schema
  version and the footer metadata (version, ``compacted_from``); :func:`arrow_schema` builds
  the pyarrow schema on demand, and the Spark job builds its own from the same columns
  (``tracemq_spark.session.spark_schema``);
* :mod:`tracemq.lake.layout`: the ``date=YYYY-MM-DD/hour=HH`` directories, the ``part-`` and
  ``compacted-`` file names, the hidden files readers skip and the compaction rule
  (:func:`live_files`: which files are live);
* :mod:`tracemq.lake.summary`: a file's footer summary of its rows (:data:`SUMMARY_KEY`), the
  Spark job's pre-flight answer for that file without reading it.

Pure Python: importing it never imports pyarrow (a client-only install has none). The
collector (``tracemq_collector.events``, ``.lake``, ``.store``) and the job
(``tracemq_spark.lake_scan``, ``.session``, ``.params``) take all of it from here, so they
cannot drift apart; ``tests/unit/test_lake_contract.py`` checks that they do.
"""

from tracemq.lake.layout import (
    FILE_SORT_KEYS,
    HOUR_MS,
    ROW_GROUP_ROWS,
    TMP_PREFIX,
    LakeFileName,
    check_trace_topic,
    compacted_name,
    date_dir,
    hour_dir,
    hour_start_ms,
    hours_overlapping,
    is_hidden,
    live_files,
    parse_date_dir,
    parse_file_name,
    parse_hour_dir,
    part_name,
    partition_of_hour,
)
from tracemq.lake.schema import (
    COLUMN_NAMES,
    COLUMNS,
    COMPACTED_FROM_KEY,
    METADATA_KEY,
    PARTITION_COLUMNS,
    SCHEMA_VERSION,
    arrow_schema,
    compacted_from,
    compacted_from_value,
    file_metadata,
    is_current_version,
)
from tracemq.lake.summary import (
    SUMMARY_KEY,
    FileSummary,
    parse_summary,
    summarize,
)

__all__ = [
    "COLUMNS",
    "COLUMN_NAMES",
    "COMPACTED_FROM_KEY",
    "FILE_SORT_KEYS",
    "HOUR_MS",
    "METADATA_KEY",
    "PARTITION_COLUMNS",
    "ROW_GROUP_ROWS",
    "SCHEMA_VERSION",
    "SUMMARY_KEY",
    "TMP_PREFIX",
    "FileSummary",
    "LakeFileName",
    "arrow_schema",
    "check_trace_topic",
    "compacted_from",
    "compacted_from_value",
    "compacted_name",
    "date_dir",
    "file_metadata",
    "hour_dir",
    "hour_start_ms",
    "hours_overlapping",
    "is_current_version",
    "is_hidden",
    "live_files",
    "parse_date_dir",
    "parse_file_name",
    "parse_hour_dir",
    "parse_summary",
    "part_name",
    "partition_of_hour",
    "summarize",
]
