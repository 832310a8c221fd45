"""spark-submit entry of the reconciliation job (the session comes from spark-submit):

    spark-submit [--master yarn ...] spark/src/tracemq_spark/submit.py \\
        --lake hdfs:///tracemq/lake --out hdfs:///tracemq/reconcile \\
        --subscriptions hdfs:///tracemq/inputs/subscriptions.json \\
        --offsets hdfs:///tracemq/inputs/offsets.json --from 2024-05-14T08:00Z --to 2024-05-14T10:00Z

The inputs are files here (export them with ``tracemq reconcile`` or ``tracemq_spark.inputs``);
run in client deploy mode from an environment where ``tracemq-spark`` (with pyarrow and
matplotlib) is installed, or ship the package with ``--py-files``. The executors run JVM code
only (no Python UDFs). Exit codes as for ``tracemq reconcile``.

What the job's own sessions get before their JVM starts — its jar (the classification's JVM
path), its JVM flags, the driver's heap at full size — spark-submit must be given itself::

    mapfile -t SUBMIT < <(python spark/src/tracemq_spark/submit.py --spark-submit-args \
                          [--driver-memory 10g])
    spark-submit "${SUBMIT[@]}" [--master ...] spark/src/tracemq_spark/submit.py --lake ...

(one argument per line). Without them the job runs its DataFrame path: the same outputs,
slower; it says so on stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def spark_submit_args(argv: list[str]) -> int:
    """``--spark-submit-args [--driver-memory SIZE]``: print the arguments, one per line."""
    from tracemq_spark.session import submit_args

    ap = argparse.ArgumentParser(
        prog="submit.py --spark-submit-args",
        description="print the spark-submit arguments the job needs, one per line",
    )
    ap.add_argument("--driver-memory", default=None, help="the driver's heap, e.g. 10g")
    a = ap.parse_args(argv)
    if a.driver_memory is not None and not re.fullmatch(r"[1-9][0-9]*[kKmMgGtT]?", a.driver_memory):
        print(
            f"error: --driver-memory {a.driver_memory!r}: expected a size like 10g", file=sys.stderr
        )
        return 2
    try:
        args = submit_args(a.driver_memory)
    except ValueError as exc:  # a bad TRACEMQ_SPARK_S3A_* variable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(args))
    return 0


def _launch_note(spark: object) -> str | None:
    """What this session lacks of :func:`spark_submit_args`' settings, as a one-line note for
    stderr; None when it has them all."""
    from tracemq_spark import cogroup
    from tracemq_spark.session import JIT_HUGE

    missing = []
    if cogroup.jar_path() is not None and not cogroup.available(spark):  # type: ignore[arg-type]
        missing.append(
            "the job's jar (the classification runs its DataFrame path: same outputs, slower)"
        )
    # (the JVM's own arguments: the session's conf names the flags whether or not they were
    # there when the JVM started)
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    started_with = list(
        jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    if JIT_HUGE not in started_with:
        missing.append("its JVM flags")
    if not missing:
        return None
    return (
        f"note: this spark-submit run lacks {' and '.join(missing)}; pass spark-submit the "
        "arguments `submit.py --spark-submit-args` prints"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--spark-submit-args"]:
        return spark_submit_args(argv[1:])
    from tracemq_spark.cli import parse_duration, parse_time
    from tracemq_spark.job import Params, ReconcileError, build_session, run

    ap = argparse.ArgumentParser(prog="submit.py", description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="from_", required=True)
    ap.add_argument("--to", required=True)
    ap.add_argument("--lake", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--subscriptions", required=True)
    ap.add_argument("--offsets", required=True)
    ap.add_argument("--horizon", default="30m")
    ap.add_argument("--window", default="10m")
    ap.add_argument("--max-reconsume-times", type=int, default=16)
    ap.add_argument("--max-delay", default="2h")
    ap.add_argument("--subscription-grace", default="2m")
    ap.add_argument("--now", default=None)
    ap.add_argument("--keep-classified", action="store_true")
    ap.add_argument("--msgid-timezone", default=os.environ.get("TRACEMQ_MSGID_TIMEZONE") or "UTC")
    ap.add_argument("--master", default=None, help="only when not given to spark-submit")
    a = ap.parse_args(argv)
    try:
        params = Params(
            lake=a.lake,
            out=a.out,
            from_ms=parse_time(a.from_, "--from"),
            to_ms=parse_time(a.to, "--to"),
            subscriptions=a.subscriptions,
            offsets=a.offsets,
            horizon_ms=parse_duration(a.horizon, "--horizon"),
            window_ms=parse_duration(a.window, "--window"),
            max_reconsume_times=a.max_reconsume_times,
            max_delay_ms=parse_duration(a.max_delay, "--max-delay"),
            subscription_grace_ms=parse_duration(a.subscription_grace, "--subscription-grace"),
            now_ms=parse_time(a.now, "--now") if a.now else None,
            keep_classified=a.keep_classified,
            msgid_timezone=a.msgid_timezone,
        )
        params.validate()
        spark = build_session(a.master)
        try:
            note = _launch_note(spark)
            if note:
                print(note, file=sys.stderr, flush=True)
            result = run(spark, params, progress=lambda m: print(m, flush=True))
        finally:
            spark.stop()
    except ReconcileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"done: {result.summary['outcomes']} -> {result.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
