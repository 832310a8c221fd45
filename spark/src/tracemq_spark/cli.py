"""``tracemq reconcile``: reconcile send traces against consume traces over the trace lake.

Registered in the ``tracemq`` CLI through the ``tracemq.commands`` entry point as the single
command ``tracemq reconcile --from … --to …``; also runnable as ``python -m tracemq_spark``.
``--lake`` defaults to the running stack's lake (``tracemq dev up``, ``tracemq demo
--keep-running``), else ``./data/collector/lake``.

Times (``--from``, ``--to``, ``--now``): ISO 8601 (``2024-05-14T08:00:00Z``,
``2024-05-14T10:00+02:00``; without a zone: UTC), epoch milliseconds, or relative to the start
of the run: ``now``, ``-1h``, ``now-90m``. Durations: ``500ms``,
``45s``, ``10m``, ``2h``, ``1d``, or combined (``1h30m``).

Exit codes: 0 done, 2 bad input (one line on stderr; the output is left untouched), 1 any other
failure (the output is left untouched as well).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import typer

from tracemq_spark.job import OUTCOMES, ReconcileError
from tracemq_spark.session import archive_state

app = typer.Typer(
    help="Reconcile send traces against consume traces over the Parquet trace lake (Spark).",
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: what Spark accepts as a master; checked before the JVM starts, whose failure is a Java
#: stack trace on stderr
_MASTER = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn"
    r"|(spark|mesos|k8s)://\S+"
)
DEFAULT_LAKE = "./data/collector/lake"


def parse_duration(text: str, what: str) -> int:
    """``30m`` → 1800000 (ms); the parser every tracemq command shares."""
    from tracemq.cli.plugin import UsageError
    from tracemq.cli.plugin import parse_duration as parse

    try:
        return parse(text, what)
    except UsageError as exc:
        raise ReconcileError(str(exc)) from None


def parse_time(text: str, what: str, now_ms: int | None = None) -> int:
    """ISO 8601 (no zone: UTC), epoch milliseconds, ``now``, or a time relative to now
    (``-1h``, ``now-90m``) → epoch ms; the parser every tracemq command shares."""
    from tracemq.cli.plugin import UsageError
    from tracemq.cli.plugin import parse_time as parse

    try:
        return parse(text, what, now_ms)
    except UsageError as exc:
        raise ReconcileError(str(exc)) from None


def default_lake() -> str:
    """The running stack's trace lake, else the collector's default relative to here."""
    from tracemq.cli.plugin import dev_state

    return str((dev_state() or {}).get("lake") or DEFAULT_LAKE)


def _is_local(uri: str) -> bool:
    return "://" not in uri and not uri.startswith(("hdfs:", "s3a:", "s3:", "gs:", "abfs:"))


def _local_path(uri: str) -> str:
    return uri[5:] if uri.startswith("file:") else uri


@app.command("reconcile")
def reconcile(
    from_: str = typer.Option(..., "--from", help="start of the Pub time window (inclusive)"),
    to: str = typer.Option(..., "--to", help="end of the Pub time window (exclusive)"),
    horizon: str = typer.Option("30m", help="how long after --to consume events are read"),
    window: str = typer.Option("10m", help="aggregation window (whole minutes)"),
    lake: str | None = typer.Option(
        None, help=f"trace lake, any Hadoop URI (default: the running stack's, else {DEFAULT_LAKE})"
    ),
    out: str = typer.Option("./data/reconcile", help="output directory (any Hadoop URI)"),
    master: str = typer.Option("local[*]", help="Spark master"),
    subscriptions: str | None = typer.Option(
        None, help="subscription-history JSON (default: exported from Redis)"
    ),
    offsets: str | None = typer.Option(
        None, help="committed-offsets JSON (default: snapshot from Kafka)"
    ),
    redis_url: str | None = typer.Option(
        None, envvar="TRACEMQ_REDIS_URL", help="routing Redis, for the exports"
    ),
    control_bootstrap: str | None = typer.Option(
        None,
        envvar="TRACEMQ_CONTROL_BOOTSTRAP",
        help="control Kafka (the data clusters come from the routes)",
    ),
    max_reconsume_times: int = typer.Option(16, help="DEAD_LETTERED at this retry count"),
    max_delay: str = typer.Option("2h", help="longest delay of a delayed message"),
    subscription_grace: str = typer.Option(
        "2m", help="a subscription still counts this long after its last sighting"
    ),
    now: str | None = typer.Option(None, help="evaluate PENDING as of this time (default: now)"),
    keep_classified: bool = typer.Option(
        False, help="also write classified/: every (message, group[, client]) with its outcome"
    ),
    msgid_timezone: str = typer.Option(
        "UTC",
        envvar="TRACEMQ_MSGID_TIMEZONE",
        help="the producers' time zone (IANA name): msgIds count from a month start in it",
    ),
    driver_memory: str = typer.Option("4g", help="spark.driver.memory (local masters)"),
    shuffle_partitions: int = typer.Option(16, help="spark.sql.shuffle.partitions"),
) -> None:
    """Classify every (message, expected group) of the Pub time window [FROM, TO) and write
    anomalies/, summary/ (Parquet), summary.json, report.html and report.png under --out."""
    code = main_run(
        from_=from_,
        to=to,
        horizon=horizon,
        window=window,
        lake=lake or default_lake(),
        out=out,
        master=master,
        subscriptions=subscriptions,
        offsets=offsets,
        redis_url=redis_url,
        control_bootstrap=control_bootstrap,
        max_reconsume_times=max_reconsume_times,
        max_delay=max_delay,
        subscription_grace=subscription_grace,
        now=now,
        keep_classified=keep_classified,
        msgid_timezone=msgid_timezone,
        driver_memory=driver_memory,
        shuffle_partitions=shuffle_partitions,
    )
    raise typer.Exit(code)


def main_run(**kw: Any) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        return _run(console, **kw)
    except ReconcileError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for the operator, never a traceback
        err.print(
            f"[bold red]error:[/] reconciliation failed: {exc!r}"[:2000],
            highlight=False,
            soft_wrap=True,
        )
        return 1


def _run(console: Any, **kw: Any) -> int:
    from tracemq_spark import job

    t0 = time.monotonic()

    def say(msg: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:7.1f}s[/] {msg}", highlight=False)

    started_ms = int(time.time() * 1000)  # one "now" for every relative time of the run
    params = job.Params(
        lake=kw["lake"],
        out=kw["out"],
        from_ms=parse_time(kw["from_"], "--from", started_ms),
        to_ms=parse_time(kw["to"], "--to", started_ms),
        subscriptions=kw["subscriptions"] or "",
        offsets=kw["offsets"] or "",
        horizon_ms=parse_duration(kw["horizon"], "--horizon"),
        window_ms=parse_duration(kw["window"], "--window"),
        max_reconsume_times=kw["max_reconsume_times"],
        max_delay_ms=parse_duration(kw["max_delay"], "--max-delay"),
        subscription_grace_ms=parse_duration(kw["subscription_grace"], "--subscription-grace"),
        now_ms=parse_time(kw["now"], "--now", started_ms) if kw["now"] else None,
        keep_classified=kw["keep_classified"],
        msgid_timezone=kw.get("msgid_timezone") or "UTC",
    )
    params.validate()
    if not _MASTER.fullmatch(kw["master"]):
        raise ReconcileError(
            f"--master: {kw['master']!r} is not a Spark master "
            "(local[*], local[N], spark://HOST:PORT, yarn, k8s://…)"
        )
    if _is_local(params.lake) and not Path(_local_path(params.lake)).is_dir():
        raise ReconcileError(
            f"trace lake not found: {params.lake} (--lake; a collector creates it with the "
            "first trace it stores)"
        )
    for name in ("subscriptions", "offsets"):
        given = getattr(params, name)
        if given and _is_local(given) and not Path(_local_path(given)).is_file():
            raise ReconcileError(f"--{name} file not found: {given}")
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if not params.subscriptions or not params.offsets:
        from tracemq.cli.plugin import resolve
        from tracemq.redis_url import redact

        from tracemq_spark import inputs

        conn = resolve(kw["redis_url"], kw["control_bootstrap"])
        tmp = tempfile.TemporaryDirectory(prefix="tracemq-reconcile-")
        say(f"exporting the subscription history and committed offsets ({redact(conn.redis_url)})")
        try:
            subs, offs = inputs.export(
                conn.redis_url,
                Path(tmp.name),
                conn.redis_prefix,
                since_ms=params.from_ms // params.window_ms * params.window_ms - params.horizon_ms,
            )
        except Exception as exc:
            raise ReconcileError(
                f"cannot export the inputs from Redis/Kafka ({redact(conn.redis_url)}): {exc!r}; "
                "pass --subscriptions and --offsets to run without them"
            ) from None
        params = job.Params(
            **{
                **params.__dict__,
                "subscriptions": params.subscriptions or str(subs),
                "offsets": params.offsets or str(offs),
            }
        )
    try:
        spark, own = _session(kw["master"], kw["driver_memory"], kw["shuffle_partitions"], say)
        try:
            with _SparkProgress(spark, console):
                result = job.run(spark, params, progress=say)
        finally:
            if own:
                if archive_state(spark) == "dumped":
                    say("keeping the JVM's class-data archive (a machine's first run only)")
                job.stop_session(spark)
    finally:
        if tmp is not None:
            tmp.cleanup()
    _print_summary(console, result)
    return 0


def _session(master: str, driver_memory: str, partitions: int, say: Any) -> tuple[Any, bool]:
    """The active SparkSession (tests, notebooks) or a new one that this run stops."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from tracemq_spark import job

    if SparkContext._active_spark_context is not None:  # type: ignore[attr-defined]
        return SparkSession.builder.getOrCreate(), False
    from tracemq_spark.session import S3AOptions

    try:  # a lake in an object store: TRACEMQ_SPARK_S3A_* (checked before a JVM starts)
        s3a = S3AOptions.from_env()
    except ValueError as exc:
        raise ReconcileError(str(exc)) from None
    say(f"starting Spark ({master})")
    local = master.startswith("local")
    return job.build_session(
        master,
        driver_memory=driver_memory if local else None,
        shuffle_partitions=partitions,
        s3a=s3a,
    ), True


class _SparkProgress:
    """A progress bar of the running Spark stages (status tracker), on a terminal only."""

    def __init__(self, spark: Any, console: Any) -> None:
        self.spark = spark
        self.console = console
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> _SparkProgress:
        if self.console.is_terminal and not os.environ.get("TRACEMQ_NO_PROGRESS"):
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2)

    def _loop(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        tracker = self.spark.sparkContext.statusTracker()
        with Progress(
            TextColumn("[cyan]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} tasks"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as progress:
            task = progress.add_task("spark", total=1)
            while not self.stop.wait(0.5):
                try:
                    infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                except Exception:  # noqa: BLE001 - the session may be stopping
                    break
                infos = [i for i in infos if i is not None]
                total = sum(i.numTasks for i in infos) or 1
                done = sum(i.numCompletedTasks for i in infos)
                names = ", ".join(f"stage {i.stageId}" for i in infos) or "waiting"
                progress.update(task, total=total, completed=done, description=names)


def _print_summary(console: Any, result: Any) -> None:
    """What an operator reads first: outcomes overall and per (topic, group), then latency."""
    from rich.table import Table

    from tracemq_spark.job import METRICS

    s = result.summary
    table = Table(title=f"tracemq reconcile {s['run']['from']} → {s['run']['to']}")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for o in OUTCOMES:
        table.add_row(o, f"{s['outcomes'][o]:,}")
    for o, n in s["informational"].items():
        table.add_row(f"[dim]{o}[/]", f"[dim]{n:,}[/]")
    console.print(table)

    rows = s["by_topic_group"]
    seen = [o for o in OUTCOMES if any(r["outcomes"][o] for r in rows if r["group"])]
    if seen:
        per_group = Table(title="outcomes per topic and group")
        per_group.add_column("topic")
        per_group.add_column("group")
        for o in seen:
            per_group.add_column(o, justify="right")
        for r in rows:
            if r["group"]:
                per_group.add_row(r["topic"], r["group"], *(f"{r['outcomes'][o]:,}" for o in seen))
        console.print(per_group)

    latency = Table(title="latency (ms): p50 / p90 / p99 / max (count)")
    latency.add_column("topic")
    latency.add_column("group")
    for m in METRICS:
        latency.add_column(m.removesuffix("_ms"), justify="right")

    def cell(x: dict[str, Any]) -> str:
        if not x["count"]:
            return "-"
        figs = " / ".join(
            "-" if x[k] is None else f"{x[k]:,}" for k in ("p50", "p90", "p99", "max")
        )
        skew = f" [yellow]skew {x['skew_suspect']:,}[/]" if x["skew_suspect"] else ""
        return f"{figs} ({x['count']:,}){skew}"

    for r in rows:
        if r["group"] and any(r["latency"][m]["count"] for m in METRICS):
            latency.add_row(r["topic"], r["group"], *(cell(r["latency"][m]) for m in METRICS))
    latency.add_row("[b]all[/]", "", *(cell(s["latency"][m]) for m in METRICS))
    console.print(latency)
    if s["clock_skew"]["flagged"]:
        console.print(
            "[bold yellow]clock skew suspected:[/] "
            + ", ".join(
                f"{m}: {n:,}" for m, n in s["clock_skew"]["suspect_rows_by_metric"].items() if n
            )
        )
    # a local output as a path the operator can open, not Spark's file: URI
    out = result.out.rstrip("/")
    out = _local_path(out) if _is_local(out) else out
    console.print(
        f"output: {out}/  (anomalies/, summary/, summary.json, report.png) "
        f"in {result.elapsed_s:.1f}s"
    )
    console.print(f"report: {out}/report.html")


def main() -> None:
    """``python -m tracemq_spark``: the same command outside the ``tracemq`` CLI."""
    app(prog_name="tracemq reconcile")
