"""Stage "classification", the JVM path (issue 19 goal 4): the classification's reduce side as
one pass per msgId in JVM code of the project's own (``spark/jvm``, class
``io.tracemq.spark.Cogroup``), called through py4j.

The DataFrame steps of :mod:`tracemq_spark.classify` (``pubs``, ``expected_deliveries``,
``attempts``, ``consumed``, ``meet``) are the reference: eight hash aggregations, two
shuffled hash joins and the full outer join, each a pass over the rows. Here one lake scan
feeds one shuffle (:func:`~tracemq_spark.classify.cogroup_input`: both sides and the last
deliveries, partitioned by a key of the msgId, sorted by it in the JVM code), and each
msgId's rows — its Pubs, its consume events, its last deliveries — are classified together,
in one task, in one pass,
giving the same rows as ``meet``. One term is left to Spark: whether an orphan's msgId was
created inside the read range (the same expression as the DataFrame path's, on the few rows
the JVM code marks ``_orphan_check``).

The jar is built by ``make setup`` (``spark/jvm/build.sh``: javac and jar against the pyspark
wheel's Spark jars) into this package (``jvm/tracemq-spark-jvm.jar``); :func:`jar_path` finds
it and :func:`tracemq_spark.session.session_conf` puts it on the session's class path. Without
it (no ``javac`` at setup, another Spark, a session built elsewhere), or with
``TRACEMQ_RECONCILE_JVM=0``, the job runs the DataFrame path: same outputs, slower.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tracemq_spark import classify
from tracemq_spark.params import METRICS, SKEW_LIMIT_MS, Params

#: where ``make setup`` puts the jar
JAR = Path(__file__).with_name("jvm") / "tracemq-spark-jvm.jar"
_CLASS = "io.tracemq.spark.Cogroup"
#: set to 0 to run the DataFrame path even when the jar is there
ENV_SWITCH = "TRACEMQ_RECONCILE_JVM"
#: the JVM code's extra column: the row is an orphan if its msgId was created in the read range
ORPHAN_CHECK = "_orphan_check"
#: set to 0 to co-group by the msgId's hash (a shuffle) even when the lake's files are sorted
#: by msgId (:func:`plan_ranges`)
RANGES_SWITCH = "TRACEMQ_RECONCILE_RANGES"


def jar_path() -> Path | None:
    """The jar, if built."""
    return JAR if JAR.is_file() else None


def built_for() -> str | None:
    """The Spark version the jar was compiled against (``build.sh`` writes it beside)."""
    try:
        return JAR.with_suffix(".spark-version").read_text().strip()
    except OSError:
        return None


def available(spark: SparkSession) -> bool:
    """Whether this session can run the JVM path: the jar on its class path, compiled against
    this Spark (it uses Spark's internal classes), not switched off by
    ``TRACEMQ_RECONCILE_JVM=0``."""
    if os.environ.get(ENV_SWITCH, "1").strip() in ("0", "false", "no", "off"):
        return False
    if built_for() != spark.version:
        return False
    from py4j.java_gateway import JavaClass

    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    try:
        cls = jvm
        for part in _CLASS.split("."):
            cls = getattr(cls, part)
    except Exception:  # noqa: BLE001 - py4j raises assorted errors for a missing class
        return False
    return isinstance(cls, JavaClass)


#: the co-group's sort key as a Java UDF of the jar (``io.tracemq.spark.MsgIdKey``)
SORT_KEY_UDF = "tracemq_msgid_key"


def plan_ranges(spark: SparkSession, files: list[str], n: int) -> list[str] | None:
    """Boundaries of at most ``n`` msgId ranges of about equal rows over the lake ``files``
    (``io.tracemq.spark.Ranges``: from their footers' row-group statistics), or None — a file
    not sorted by msgId (the collector writes them sorted), ``n`` below 2, or
    ``TRACEMQ_RECONCILE_RANGES=0`` — when the co-group should shuffle by hash instead."""
    if os.environ.get(RANGES_SWITCH, "1").strip() in ("0", "false", "no", "off") or n < 2:
        return None
    sc = spark.sparkContext
    gw = sc._gateway  # type: ignore[attr-defined]
    jvm = sc._jvm  # type: ignore[attr-defined]
    arr = gw.new_array(jvm.String, len(files))
    for i, f in enumerate(files):
        arr[i] = f
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    got = jvm.io.tracemq.spark.Ranges.plan(arr, conf, n)
    return None if got is None else [str(b) for b in got]


def sort_key(spark: SparkSession) -> Callable[[Column, Column], Column]:
    """A msgId's embedded creation time (ms in its month) above 24 bits of its hash, as a
    column: the key :func:`classified` sorts by with ``by_creation`` (the job computes it
    there, in the co-group's tasks; as this UDF on the map side it cost a String and two
    boxed longs a row). Also a ``sort_key`` for
    :func:`~tracemq_spark.classify.cogroup_input`."""
    spark.udf.registerJavaFunction(SORT_KEY_UDF, "io.tracemq.spark.MsgIdKey", T.LongType())
    return lambda pkey, h: F.call_udf(SORT_KEY_UDF, pkey, h)


def split(spark: SparkSession, rows: DataFrame, bounds: list[str]) -> object:
    """One side of :func:`~tracemq_spark.classify.cogroup_sides` split by the msgId ranges
    ``bounds`` (ascending; :func:`plan_ranges`) in the JVM (``Cogroup.byRange``): one RDD per
    range, the first also holding the rows without a msgId, every row in exactly one; each a
    scan with its range's condition, which Parquet's row-group statistics answer for files
    sorted by msgId (the collector's). Planned on two JVM threads: ~2.4 s of the driver at
    10M messages one after the other."""
    cls = spark.sparkContext._jvm.io.tracemq.spark.Cogroup  # type: ignore[attr-defined]
    return cls.byRange(
        rows._jdf,
        classify.RANGE_KEY,
        strings(spark, bounds),
        strings(spark, list(classify.COGROUP_COLS)),
    )


def ranges(spark: SparkSession, rdds: object) -> object:
    """:func:`split`'s RDDs as one RDD whose partition i holds range i's rows
    (``Cogroup.ranges``): a :class:`RangeSplit`'s deliveries."""
    return spark.sparkContext._jvm.io.tracemq.spark.Cogroup.ranges(rdds)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RangeSplit:
    """The co-group's input split by msgId range: the lake's events, the JVM's array of one
    RDD per range (:func:`split`), and the last deliveries, one RDD whose partition i holds
    range i's (:func:`ranges`, or the snapshot's: ``snapshot.JvmSnapshot.ranges``) or None.
    :func:`classified` reads each range in one task, its parts one after the other — no
    exchange."""

    events: object
    deliveries: object | None
    n: int

    @classmethod
    def of(cls, spark: SparkSession, sides: list[DataFrame], bounds: list[str]) -> RangeSplit:
        """Both sides of :func:`~tracemq_spark.classify.cogroup_sides` split, one after the
        other (the job splits the lake's side ahead: :mod:`tracemq_spark.job`)."""
        d = ranges(spark, split(spark, sides[1], bounds)) if len(sides) > 1 else None
        return cls(split(spark, sides[0], bounds), d, len(bounds) + 1)

    def frame(self, spark: SparkSession, i: int) -> DataFrame:
        """Range ``i``'s rows as a frame of :data:`~tracemq_spark.classify.COGROUP_COLS`."""
        jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        return DataFrame(
            jvm.io.tracemq.spark.Cogroup.rangeFrame(
                self.events, self.deliveries, i, classify.cogroup_schema().json()
            ),
            spark,
        )


def lookups(spark: SparkSession, subs: DataFrame, clients: DataFrame, offsets: DataFrame) -> object:
    """The JVM code's look-ups (``Cogroup.Lookups``): ``subs``, ``clients`` and ``offsets``
    (:func:`~tracemq_spark.classify.subs_frame`, ``clients_frame``, ``offsets_frame``)
    collected to the driver — three small jobs, run by the job while the lake's side of the
    ranges is planned."""
    cls = spark.sparkContext._jvm.io.tracemq.spark.Cogroup  # type: ignore[attr-defined]
    return cls.lookups(subs._jdf, clients._jdf, offsets._jdf)


def strings(spark: SparkSession, values: list[str]) -> object:
    """``values`` as a Java String[] (py4j)."""
    gw = spark.sparkContext._gateway  # type: ignore[attr-defined]
    arr = gw.new_array(spark.sparkContext._jvm.String, len(values))  # type: ignore[attr-defined]
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def classified(
    spark: SparkSession,
    inp: DataFrame | RangeSplit,
    subs: DataFrame | None,
    clients: DataFrame | None,
    offsets: DataFrame | None,
    bh: list[int],
    p: Params,
    schema: T.StructType,
    *,
    f_ms: int,
    t_ms: int,
    read_lo: int,
    cutoff: int,
    tally: object | None = None,
    by_creation: bool = False,
    looked_up: object | None = None,
) -> DataFrame:
    """The classified rows (``schema``: :func:`~tracemq_spark.classify.meet`'s) of ``inp``
    (:func:`~tracemq_spark.classify.cogroup_input`; or split by msgId range, a
    :class:`RangeSplit`, each range read in one task), with ``subs``, ``clients`` and
    ``offsets`` (:func:`~tracemq_spark.classify.subs_frame`, ``clients_frame``,
    ``offsets_frame``; or ``looked_up``, their :func:`lookups` already collected) and the
    broadcasting groups' hashes ``bh``. ``tally``
    (:func:`new_tally`): counts the rows but the orphans as the frame is computed — compute
    it once; without ``keep_classified`` the CONSUMED rows and those of the informational
    outcomes (``params.INFORMATIONAL``) are then only counted, not emitted (the tally is all
    that reads them). ``by_creation``: each task sorts its rows by the key :func:`sort_key`
    gives (the msgId's creation time above 24 bits of ``k``, its hash), computed from the
    rows, so that it classifies — and writes — its msgIds roughly in time order (the lake's
    hours, and each producer's msgIds within a file), not in hash order (the tally and the anomalies read those rows back);
    otherwise by ``k``."""
    sc = spark.sparkContext
    gw = sc._gateway  # type: ignore[attr-defined]
    jvm = sc._jvm  # type: ignore[attr-defined]

    def longs(values: list[int]) -> object:
        arr = gw.new_array(jvm.long, len(values))
        for i, v in enumerate(values):
            arr[i] = v
        return arr

    params = [f_ms, t_ms, p.window_ms, p.horizon_ms, p.max_delay_ms, p.max_reconsume_times, cutoff]
    out_schema = T.StructType([*schema.fields, T.StructField(ORPHAN_CHECK, T.BooleanType())])
    cls = jvm.io.tracemq.spark.Cogroup
    if looked_up is None:
        if subs is None or clients is None or offsets is None:
            raise ValueError("classified: subs, clients and offsets, or looked_up")
        looked_up = lookups(spark, subs, clients, offsets)
    rest = (
        looked_up,
        longs(bh),
        longs(params),
        p.keep_classified,
        by_creation,
        strings(spark, [*classify.TALLIED_COLS, ORPHAN_CHECK]),
        out_schema.json(),
        tally,
    )
    if isinstance(inp, RangeSplit):
        jdf = cls.classifyRanges(
            inp.events, inp.deliveries, classify.cogroup_schema().json(), *rest
        )
    else:
        jdf = cls.classify(inp._jdf, *rest)
    df = DataFrame(jdf, spark)
    col = F.col
    created: Column = classify._msg_id_created(
        col("msg_id"), col("first_consume_ts"), p.msgid_timezone
    )
    return df.where(~col(ORPHAN_CHECK) | created.isNull() | (created >= read_lo)).drop(ORPHAN_CHECK)


def new_tally(spark: SparkSession) -> object:
    """A JVM accumulator (``io.tracemq.spark.Tally``) for :func:`classified`: it counts the
    classified rows as the co-group's tasks emit them — the :func:`tracemq_spark.latency.tally`
    of every row whose outcome is neither null nor ``ORPHAN_CONSUME`` (orphans are filtered
    and folded after the co-group: :func:`tally_rest` tallies them). The tally's own pass over
    the classified rows cost ~20 s of task CPU at 10M messages (16M rows exploded into ~80M
    items of a hash aggregation keyed by strings); counting in the tasks, by outcome code
    into arrays of buckets, costs a few."""
    sc = spark.sparkContext
    gw = sc._gateway  # type: ignore[attr-defined]
    jvm = sc._jvm  # type: ignore[attr-defined]
    names = gw.new_array(jvm.String, len(METRICS))
    for i, m in enumerate(METRICS):
        names[i] = m
    acc = jvm.io.tracemq.spark.Tally(names, SKEW_LIMIT_MS)
    # unnamed: Spark reports only named accumulators to its listeners, which would render
    # the whole map as a string on every task's end (and did so while it was being merged)
    sc._jsc.sc().register(acc)  # type: ignore[attr-defined]
    return acc


def tally_frame(spark: SparkSession, acc: object) -> DataFrame:
    """The counts of ``acc`` once its frame was computed: (window_start_ms, topic_h, group_h,
    kind, b, n, vmax, w), as :func:`tracemq_spark.latency.tally` gives them."""
    return DataFrame(acc.frame(spark._jsparkSession), spark)  # type: ignore[attr-defined]


def tally_rest(final: DataFrame) -> DataFrame:
    """The rows of ``final`` (``tracemq_spark.outputs.final_frame``) a :func:`new_tally` does
    not count: outcome null or ``ORPHAN_CONSUME``."""
    o = F.col("outcome")
    return final.where(o.isNull() | (o == "ORPHAN_CONSUME"))
