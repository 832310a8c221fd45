"""The committed-offsets snapshot read in the driver's JVM (stage "inputs" of
:mod:`tracemq_spark.job`; issue 19 goal 4): ``io.tracemq.spark.Snapshot`` (``spark/jvm``)
streams the file with Jackson and computes what :mod:`tracemq_spark.input_files` computes —
the committed offsets, the copies' count, the last deliveries (kept in the JVM until the
classification asks for their file). At 10M messages the snapshot is 650 MB and CPython's
parse was ~20 s of the driver's CPU beside the pre-flight scan on two cores.

Only a document of the exporter's exact shape is read so; anything else — malformed, or
unusual input Python's ``str()``/``int()`` would still take — and a session without the JVM
code (:func:`tracemq_spark.cogroup.available`) leave it to the Python parser, which is the
reference (``tests/spark/test_snapshot.py`` holds the two to each other) and whose errors name
the file and the row.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from tracemq_spark import classify
from tracemq_spark.input_files import OffsetRow, best_offsets

_CLASS = "io.tracemq.spark.Snapshot"


class JvmSnapshot:
    """A snapshot read by the JVM: its committed offsets, its copies' count and its last
    deliveries (:meth:`frame`)."""

    def __init__(self, spark: SparkSession, jsnap: Any) -> None:
        self._spark = spark
        self._j = jsnap
        self.n_copies = int(jsnap.copies())
        self.n_deliveries = int(jsnap.deliveries())
        self._written: set[str] = set()
        #: (bounds, the JVM's rows per range) once :meth:`split`
        self._split: tuple[list[str], Any] | None = None
        self.offsets: list[OffsetRow] = best_offsets(
            (g, t, s, int(q), c, int(o)) for g, t, s, q, c, o in json.loads(jsnap.offsetsJson())
        )

    def __len__(self) -> int:
        return self.n_deliveries

    def write(self, path: str) -> None:
        """Stage the last deliveries as a Parquet file under ``path`` (the JVM writes it; once:
        it lets go of them then). Nothing when there are none."""
        if not self.n_deliveries or path in self._written:
            return
        if self._written or self._split is not None:
            raise RuntimeError("the last deliveries were staged already")
        conf = self._spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        self._j.writeDeliveries(f"{path.rstrip('/')}/{classify.DELIVERIES_FILE}", conf)
        self._written.add(path)

    def split(self, bounds: list[str]) -> None:
        """Stage the last deliveries as the co-group's rows split by the msgId ranges
        ``bounds`` (the JVM's ``Snapshot.rangeRows``), for :meth:`ranges`: what the
        classification by range reads instead of :meth:`write`'s file (no sort, no Parquet
        write and read, no plans per range). Once, instead of :meth:`write`: the JVM lets go
        of them then."""
        if not self.n_deliveries:
            return
        if self._written or self._split is not None:
            raise RuntimeError("the last deliveries were staged already")
        from tracemq_spark import cogroup

        rows = self._j.rangeRows(
            cogroup.strings(self._spark, bounds), classify.cogroup_schema().json()
        )
        self._split = (list(bounds), rows)

    def ranges(self, bounds: list[str]) -> object | None:
        """The rows :meth:`split` staged for ``bounds`` as one RDD whose partition i holds
        range i's (``Cogroup.deliveryRanges``); None when none were staged for them."""
        if self._split is None or self._split[0] != list(bounds):
            return None
        jvm: Any = self._spark.sparkContext._jvm  # type: ignore[attr-defined]
        return jvm.io.tracemq.spark.Cogroup.deliveryRanges(
            self._split[1], len(classify.COGROUP_COLS)
        )

    def frame(self, path: str) -> DataFrame | None:
        """As :func:`~tracemq_spark.classify.deliveries_frame`: the last deliveries staged as
        a Parquet file under ``path`` (:meth:`write`), None when there are none."""
        if not self.n_deliveries:
            return None
        self.write(path)
        return classify.deliveries_read(self._spark, path)


def read(spark: SparkSession, uri: str) -> tuple[JvmSnapshot | None, str]:
    """The snapshot at ``uri`` read by the JVM, or (None, why not): the Python parser's turn."""
    from py4j.protocol import Py4JError

    jvm: Any = spark.sparkContext._jvm  # type: ignore[attr-defined]
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    try:
        cls = jvm.io.tracemq.spark.Snapshot
        return JvmSnapshot(spark, cls.read(uri, conf)), ""
    except Py4JError as exc:
        # (the Java exception's first line: Unsupported's reason, or an I/O error)
        text = str(getattr(exc, "java_exception", exc)).splitlines()
        return None, text[0] if text else type(exc).__name__
