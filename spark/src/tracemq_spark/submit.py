"""spark-submit entry of the reconciliation job (the session comes from spark-submit):

    spark-submit [--master yarn ...] spark/src/tracemq_spark/submit.py \\
        --lake hdfs:///tracemq/lake --out hdfs:///tracemq/reconcile \\
        --subscriptions hdfs:///tracemq/inputs/subscriptions.json \\
        --offsets hdfs:///tracemq/inputs/offsets.json --from 2024-05-14T08:00Z --to 2024-05-14T10:00Z

The inputs are files here (export them with ``tracemq reconcile`` or ``tracemq_spark.inputs``);
run in client deploy mode from an environment where ``tracemq-spark`` (with pyarrow and
matplotlib) is installed, or ship the package with ``--py-files``. The executors run JVM code
only (no Python UDFs). Exit codes as for ``tracemq reconcile``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
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
