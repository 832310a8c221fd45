"""Which job failures are reported as a corrupt lake file: a read that names a lake file or a
sign of damage; not any error whose text says "parquet" (a failed write of the job's own
outputs, ``DataFrameWriter.parquet``, does)."""

from __future__ import annotations

import pytest
from tracemq_spark.lake_scan import _maybe_corrupt
from tracemq_spark.params import ReconcileError

FILES = [
    "/lake/trace/dt=2026-11-28/hour=10/part-t-0-00000000000000000000-00000000000000001000.parquet",
    "/lake/trace/dt=2026-11-28/hour=11/part-t-0-00000000000000001000-00000000000000002000.parquet",
]


@pytest.mark.parametrize(
    "text",
    [
        "An error occurred while calling o812.parquet.\n: java.lang.IllegalStateException: "
        "a row of the wrong width",
        "An error occurred while calling o90.parquet. Job aborted: Task failed while writing "
        "rows to file:/tmp/stage/_classified",
        "Py4JJavaError: java.lang.NullPointerException at io.tracemq.spark.Task.run",
    ],
)
def test_a_failure_that_names_no_lake_file_and_no_damage_is_kept(text: str) -> None:
    exc = RuntimeError(text)
    assert _maybe_corrupt(exc, FILES) is exc


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (f"file:{FILES[1]} is not a Parquet file. Expected magic number at tail", FILES[1]),
        (f"[FAILED_READ_FILE.NO_HINT] Encountered error while reading file {FILES[0]}", FILES[0]),
        (f"Can not read value at 0 in block -1 in file {FILES[0]}", FILES[0]),
        ("java.io.IOException: could not read footer for file", None),
    ],
)
def test_a_read_that_names_a_lake_file_or_damage_is_a_corrupt_lake_file(
    text: str, named: str | None
) -> None:
    out = _maybe_corrupt(RuntimeError(text), FILES)
    assert isinstance(out, ReconcileError)
    assert str(out).startswith("corrupt Parquet file in the lake: ")
    assert (named or "one of the lake files") in str(out)
