"""Stage "session" of the reconciliation job (:mod:`tracemq_spark.job`): the SparkSession it
runs on (:func:`build_session`, with the JVM flags it relies on), the runtime settings it sets
on any session it is given (``RUNTIME_CONF``), the S3A settings of a lake in an object store
(:class:`S3AOptions`) and the lake schema as a Spark schema.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pyspark.sql import SparkSession
from pyspark.sql import types as T
from tracemq import lake

from tracemq_spark import class_archive

#: S3A's credentials provider for a fixed access key and secret key
_SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
_S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_ENV = "TRACEMQ_SPARK_S3A_"


@dataclass(frozen=True)
class S3AOptions:
    """How the job reaches a lake in an S3-compatible object store through Hadoop's S3A
    connector (a cluster needs ``hadoop-aws`` of its Hadoop version and the AWS SDK bundle on
    its class path: see the README). :meth:`conf` maps ``s3://`` to S3A as well, so the job reads
    the collector's own lake URI (``s3://bucket/prefix``) unchanged.

    Attributes:
        endpoint: ``http(s)://host:port`` of an S3-compatible server (None: AWS).
        path_style: path-style requests (``host/bucket/key``), which most S3-compatible
            servers (SeaweedFS, MinIO) need.
        credentials_provider: S3A credentials provider class(es), comma-separated; default: the
            simple key pair when keys are given, else S3A's own chain (environment, instance
            role, …).
        packages: Maven coordinates for ``spark.jars.packages`` (e.g.
            ``org.apache.hadoop:hadoop-aws:3.4.1``, which brings the AWS SDK bundle), for a
            Spark without the connector on its class path; fetched when the session starts.
    """

    endpoint: str | None = None
    path_style: bool = True
    credentials_provider: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    packages: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3AOptions | None:
        """From ``TRACEMQ_SPARK_S3A_{ENDPOINT,PATH_STYLE,CREDENTIALS_PROVIDER,REGION,ACCESS_KEY,
        SECRET_KEY,PACKAGES}`` (None when none is set). Raises ValueError naming a bad variable."""
        env = os.environ if env is None else env
        values = {k[len(_ENV) :].lower(): v for k, v in env.items() if k.startswith(_ENV) and v}
        if not values:
            return None
        known = {"endpoint", "path_style", "credentials_provider", "region", "access_key",
                 "secret_key", "packages"}  # fmt: skip
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{_ENV}{unknown[0].upper()}: unknown setting")
        path_style = values.pop("path_style", "true").strip().lower()
        if path_style not in ("true", "false"):
            raise ValueError(f"{_ENV}PATH_STYLE={path_style!r}: expected true or false")
        opts = cls(path_style=path_style == "true", **values)
        opts.check()
        return opts

    def check(self) -> None:
        """Raise ValueError naming what is wrong."""
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{_ENV}ENDPOINT={self.endpoint!r}: expected http(s)://host:port")
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError(f"{_ENV}ACCESS_KEY and {_ENV}SECRET_KEY go together")

    def conf(self) -> dict[str, str]:
        """The ``spark.hadoop.fs.s3a.*`` settings (and ``fs.s3.impl``, ``spark.jars.packages``)
        of a SparkConf."""
        p = "spark.hadoop.fs.s3a."
        out = {
            "spark.hadoop.fs.s3.impl": _S3A,
            "spark.hadoop.fs.s3a.impl": _S3A,
            f"{p}path.style.access": "true" if self.path_style else "false",
        }
        if self.endpoint is not None:
            out[f"{p}endpoint"] = self.endpoint
            out[f"{p}connection.ssl.enabled"] = (
                "true" if urlsplit(self.endpoint).scheme == "https" else "false"
            )
        if self.region is not None:
            out[f"{p}endpoint.region"] = self.region
        provider = self.credentials_provider
        if provider is None and self.access_key is not None:
            provider = _SIMPLE_CREDENTIALS
        if provider is not None:
            out[f"{p}aws.credentials.provider"] = provider
        if self.access_key is not None and self.secret_key is not None:
            out[f"{p}access.key"] = self.access_key
            out[f"{p}secret.key"] = self.secret_key
        if self.packages is not None:
            out["spark.jars.packages"] = self.packages
        return out


def build_session(
    master: str | None = "local[*]",
    *,
    app_name: str = "tracemq-reconcile",
    driver_memory: str | None = None,
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
    s3a: S3AOptions | None = None,
) -> SparkSession:
    """A SparkSession for the job. ``master=None`` leaves it to spark-submit. ``s3a``: the
    object store's settings (default: :meth:`S3AOptions.from_env`)."""
    from pyspark import SparkContext

    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    conf = session_conf(
        shuffle_partitions=shuffle_partitions, extra=extra, s3a=s3a, heap=driver_memory
    )
    archive: class_archive.Plan | None = None
    if master and SparkContext._gateway is None:  # type: ignore[attr-defined]
        # this call starts the driver's JVM: it maps (or writes) the class-data archive
        opts = conf.get("spark.driver.extraJavaOptions", "")
        extra_cp = [p for p in conf.get("spark.driver.extraClassPath", "").split(os.pathsep) if p]
        archive = class_archive.plan(opts, extra_cp)
        if archive is not None:
            conf["spark.driver.extraJavaOptions"] = f"{opts} {archive.java_option()}".strip()
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if archive is not None:
        class_archive.attach(archive, spark)
        _ARCHIVES[id(spark.sparkContext)] = archive
    return spark


#: the class-data archive plan of each SparkContext build_session started (by id)
_ARCHIVES: dict[int, class_archive.Plan] = {}


def archive_state(spark: SparkSession) -> str | None:
    """What the session's JVM does with the class-data archive: ``"used"`` (mapped it),
    ``"dumped"`` (writes it at exit), None (neither)."""
    p = _ARCHIVES.get(id(spark.sparkContext))
    return p.state if p is not None else None


def stop_session(spark: SparkSession) -> None:
    """Stop a session :func:`build_session` started; when its JVM writes the class-data
    archive, let the JVM go, wait for the archive and keep it (:func:`class_archive.finish`)."""
    p = _ARCHIVES.pop(id(spark.sparkContext), None)
    spark.stop()
    if p is not None and p.part is not None:
        class_archive.finish(p)


def session_conf(
    *,
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
    s3a: S3AOptions | None = None,
    heap: str | None = None,
) -> dict[str, str]:
    """The SparkConf settings :func:`build_session` gives a new session (``extra`` last).
    ``heap``: the driver's memory (``spark.driver.memory``), its heap's initial size too."""
    s3a = s3a if s3a is not None else S3AOptions.from_env()
    conf = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or 16),
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
        # jobs of threads that name a scheduler pool share the cores with the others
        # (outputs.publish_tables: the figures beside the anomalies' write); those that name
        # none are in the default pool, first in first out as before. Read when the context
        # starts: a session the job is given keeps its own mode (then one queue, slower)
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(Path(__file__).with_name("fairscheduler.xml")),
    }
    if s3a is not None:
        conf.update(s3a.conf())
    conf.update(extra or {})
    _with_jvm_jar(conf)
    # Spark's startup warnings (hostname, native Hadoop, default log4j profile) are noise on
    # the console of a one-shot job: a quiet log4j2 configuration unless one is given
    quiet = f"-Dlog4j2.configurationFile={Path(__file__).with_name('log4j2.properties').as_uri()}"
    java_opts = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in java_opts:
        java_opts = f"{java_opts} {quiet}"
    # whole-stage code generation makes methods far over HotSpot's 8 000-byte JIT limit for
    # the classification's wide CASE and aggregates: left interpreted, they made its reduce
    # side about 1.6 times slower (2M messages, warm: 25-28 s without, 15-16 s with)
    # the driver's heap at its full size from the start (``-Xms``): grown from 1/64 of the
    # host's memory, the young generation started small and the throughput collector ran
    # many more collections while the offsets snapshot and the first stages filled it
    if heap and "-Xms" not in java_opts:
        java_opts = f"{java_opts} -Xms{heap}"
    conf["spark.driver.extraJavaOptions"] = _with_jvm_flags(java_opts)
    conf["spark.executor.extraJavaOptions"] = _with_jvm_flags(
        conf.get("spark.executor.extraJavaOptions", "")
    )
    return conf


#: the settings spark-submit must be given itself: read when it starts the driver's JVM (client
#: mode), too late once the job's code runs
LAUNCH_KEYS = (
    "spark.driver.memory",
    "spark.driver.extraJavaOptions",
    "spark.driver.extraClassPath",
    "spark.executor.extraJavaOptions",
    "spark.jars",
    "spark.jars.packages",
)


def submit_args(driver_memory: str | None = None, s3a: S3AOptions | None = None) -> list[str]:
    """The spark-submit arguments (``--conf key=value``, one list item each) that give a
    spark-submit run what :func:`build_session` gives its own JVM before it starts: the job's
    jar (the classification's JVM path), its JVM flags and, with ``driver_memory``, the
    driver's heap at that size from the start; the object store's packages when
    ``TRACEMQ_SPARK_S3A_PACKAGES`` asks for them. Without them a spark-submit run takes the
    DataFrame path (the same outputs, slower). The class-data archive is left out: it is
    written and checked by the JVMs :func:`build_session` starts."""
    conf = session_conf(s3a=s3a, heap=driver_memory)
    if driver_memory:
        conf["spark.driver.memory"] = driver_memory
    out: list[str] = []
    for key in LAUNCH_KEYS:
        value = conf.get(key)
        if value:
            out += ["--conf", f"{key}={value}"]
    return out


def _with_jvm_jar(conf: dict[str, str]) -> None:
    """The job's own JVM code (:mod:`tracemq_spark.cogroup`), when built: on the driver's
    class path (py4j finds it there; in local mode the executors are the driver) and in
    ``spark.jars`` (executors elsewhere). Without it the job runs its DataFrame path."""
    from tracemq_spark.cogroup import jar_path

    jar = jar_path()
    if jar is None:
        return
    for key, sep in (("spark.driver.extraClassPath", os.pathsep), ("spark.jars", ",")):
        old = conf.get(key, "")
        if str(jar) not in old.split(sep):
            conf[key] = f"{old}{sep}{jar}" if old else str(jar)


#: HotSpot flag: JIT-compile methods over 8 000 bytes of bytecode (Spark's generated code)
JIT_HUGE = "-XX:-DontCompileHugeMethods"
#: the throughput collector for a batch job (Java 17's default is G1): the whole job at 10M
#: messages on local[2], same lake, back to back: 156.4 s with G1, 147.5 s with it (and
#: 175.8 / 160.1 s in a noisier pair). Left out when the options already choose a collector.
_PARALLEL_GC = "-XX:+UseParallelGC"


#: HotSpot flag: compile a method after 4 times the default invocation and loop counts. Half
#: of a 1M-message run's JVM CPU is outside its tasks, most of it C2 compiling Spark's own
#: planning, serialization and Janino code, warm only for seconds; the job's hot loops reach
#: any threshold within the first batches of rows. (Figures: spark/README.md, Performance.)
_JIT_LATER = "-XX:CompileThresholdScaling=4"


#: HotSpot flag: the class-metadata size that first triggers a collection. Below it (21 MB by
#: default) every step of Spark's class loading set off a full collection of the whole heap
#: ("Metadata GC Threshold": 6 in a 1M run), each one tracing whatever the driver holds then.
_METASPACE = "-XX:MetaspaceSize=256m"


def _with_jvm_flags(opts: str) -> str:
    """``opts`` plus the job's JVM flags (each unless already decided there)."""
    out = opts
    if JIT_HUGE not in out:
        out = f"{out} {JIT_HUGE}"
    if "CompileThresholdScaling" not in out:
        out = f"{out} {_JIT_LATER}"
    if "MetaspaceSize" not in out:
        out = f"{out} {_METASPACE}"
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

#: for the classification only (``job._Context.classify``): its aggregations are keyed by msgId
#: (millions of keys), where the small first-level map of the two-level hash aggregation only
#: misses and its look-ups (a key comparison on every hash match) were a tenth of the job's CPU
#: (JFR, 1M messages); the tally's few keys, on the other hand, gain from it.
#: Whole-stage code generation stops at operators wider than 40 columns: the expected ⟗
#: consumed join (~55 columns) fused with everything above it up to the outcome was one
#: generated method that neither C1 nor C2 could compile ("out of virtual registers", "out
#: of nodes", JFR), so every classified row ran through the bytecode interpreter — 15 % of
#: the whole job's CPU at 1M messages, in that one method (64 brings it back: reduce side
#: 15.6-18.7 s against 9.3-10.0 s warm at 1M). That join runs row by row; the narrower
#: operators on either side of it keep generated code: the aggregations and each side's
#: broadcast joins (at most 35 columns) below it, the outcome and its projections (~33
#: columns) above it — with 30 those ran row by row too, each copying whole rows (1M, warm,
#: alternated: reduce side 8.8-9.4 s with 40 against 9.2-10.1 s with 30).
CLASSIFY_CONF = {
    "spark.sql.codegen.aggregate.map.twolevel.enabled": "false",
    "spark.sql.codegen.maxFields": "40",
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
