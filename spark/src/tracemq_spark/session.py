"""Stage "session" of the reconciliation job (:mod:`tracemq_spark.job`): the SparkSession it
runs on (:func:`build_session`, with the JVM flags it relies on), the runtime settings it sets
on any session it is given (``RUNTIME_CONF``) and the lake schema as a Spark schema.
"""

from __future__ import annotations

import re
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import types as T
from tracemq import lake


def build_session(
    master: str | None = "local[*]",
    *,
    app_name: str = "tracemq-reconcile",
    driver_memory: str | None = None,
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the job. ``master=None`` leaves it to spark-submit."""
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    conf = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or 16),
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
    }
    conf.update(extra or {})
    # Spark's startup warnings (hostname, native Hadoop, default log4j profile) are noise on
    # the console of a one-shot job: a quiet log4j2 configuration unless one is given
    quiet = f"-Dlog4j2.configurationFile={Path(__file__).with_name('log4j2.properties').as_uri()}"
    java_opts = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in java_opts:
        java_opts = f"{java_opts} {quiet}"
    # whole-stage code generation makes methods far over HotSpot's 8 000-byte JIT limit for
    # the classification's wide CASE and aggregates: left interpreted, they made its reduce
    # side about 1.6 times slower (2M messages, warm: 25-28 s without, 15-16 s with)
    conf["spark.driver.extraJavaOptions"] = _with_jvm_flags(java_opts)
    conf["spark.executor.extraJavaOptions"] = _with_jvm_flags(
        conf.get("spark.executor.extraJavaOptions", "")
    )
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: HotSpot flag: JIT-compile methods over 8 000 bytes of bytecode (Spark's generated code)
_JIT_HUGE = "-XX:-DontCompileHugeMethods"
#: the throughput collector for a batch job (Java 17's default is G1): the whole job at 10M
#: messages on local[2], same lake, back to back: 156.4 s with G1, 147.5 s with it (and
#: 175.8 / 160.1 s in a noisier pair). Left out when the options already choose a collector.
_PARALLEL_GC = "-XX:+UseParallelGC"


def _with_jvm_flags(opts: str) -> str:
    """``opts`` plus the job's JVM flags (each unless already decided there)."""
    out = opts
    if _JIT_HUGE not in out:
        out = f"{out} {_JIT_HUGE}"
    if not re.search(r"-XX:[+]Use\w*GC\b", out):
        out = f"{out} {_PARALLEL_GC}"
    return out.strip()


#: runtime SQL settings the job relies on (set on whatever session it is given)
_RUNTIME_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.requireAllClusterKeysForCoPartition": "false",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


def spark_schema() -> T.StructType:
    """The lake schema (:data:`tracemq.lake.COLUMNS`) as a Spark schema."""
    mapping = {
        "string": T.StringType(),
        "int64": T.LongType(),
        "int32": T.IntegerType(),
        "bool": T.BooleanType(),
    }
    return T.StructType(
        [T.StructField(name, mapping[typ], nullable) for name, typ, nullable, _ in lake.COLUMNS]
    )
