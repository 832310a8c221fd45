"""Stage "outputs" of the reconciliation job (:mod:`tracemq_spark.job`): from the classified
rows (``<staging>/_classified``) to the published datasets and run files, all staged.

:func:`publish_tables` writes ``anomalies`` (with the producer's strings the classified rows
carry, ``classify.PUB_STRINGS``, and a one-line :func:`_evidence`), ``summary`` (per window, topic, group; latency
percentiles) and with ``keep_classified`` ``classified``, each partitioned by window
(:func:`write`); :func:`summarize` writes ``summary.json`` and :func:`report` the HTML/PNG
report. Hashed columns are decoded with the pre-flight scan's dictionary (:func:`decode`).
"""

from __future__ import annotations

import importlib
import json
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tracemq_spark import cogroup, latency
from tracemq_spark.classify import PUB_STRINGS
from tracemq_spark.commit import Staging, checkpoint
from tracemq_spark.params import (
    _MSG_DELAY,
    _MSG_HALF,
    INFORMATIONAL,
    METRICS,
    OUTCOMES,
    PERCENTILES,
    SKEW_LIMIT_MS,
    _iso,
    _window_label,
)

if TYPE_CHECKING:
    from tracemq_spark.job import _Context


def decode(df: DataFrame, dict_df: DataFrame, pairs: list[tuple[str, str]]) -> DataFrame:
    """Hashed columns back to their strings (broadcast joins with the dictionary)."""
    for hcol, name in pairs:
        d = F.broadcast(dict_df.select(F.col("h").alias(f"_{hcol}"), F.col("s").alias(name)))
        df = df.join(d, F.col(hcol) == F.col(f"_{hcol}"), "left").drop(f"_{hcol}", hcol)
    return df


def final_frame(cl: DataFrame) -> DataFrame:
    """The classified rows, with per-attempt orphans of empty msgIds folded into one row
    per (window, group, client); strings still hashed."""
    col = F.col
    nul = (col("msg_id").isNull()) & (col("outcome") == "ORPHAN_CONSUME")
    folded = (
        cl.where(nul)
        .groupBy("window_start_ms", "group_h", "client_h")
        .agg(
            F.max("topic_h").alias("topic_h"),
            F.sum("attempts").alias("attempts"),
            F.sum("successes").alias("successes"),
            F.sum("failed_attempts").alias("failed_attempts"),
            F.sum("in_flight_attempts").alias("in_flight_attempts"),
            F.max("max_retry_times").alias("max_retry_times"),
            F.sum("consume_events").alias("consume_events"),
            F.min("first_consume_ts").alias("first_consume_ts"),
            F.min("success_ts").alias("success_ts"),
        )
        .withColumn("outcome", F.lit("ORPHAN_CONSUME"))
    )
    return cl.where(~nul).unionByName(folded, allowMissingColumns=True)


def with_window(df: DataFrame, window_ms: int) -> DataFrame:
    col = F.col
    w = window_ms
    return (
        df.withColumn("window_start", F.timestamp_millis(col("window_start_ms")))
        .withColumn("window_end", F.timestamp_millis(col("window_start_ms") + w))
        .withColumn("window", F.date_format(col("window_start"), "yyyyMMdd'T'HHmm'Z'"))
    )


def publish_tables(ctx: _Context) -> None:
    """The anomalies, summary (and with ``keep_classified`` classified) datasets, staged;
    the tally and grouped figures ``summarize`` reads.

    The tally, its grouping (:func:`_figures`) and the summary dataset run in a thread of their
    own beside the anomalies (:func:`_anomalies`): both read the classified rows, neither
    needs the other, and each is a chain of short jobs whose planning, commits and last tasks
    left a core idle while the other waited its turn (at 10M messages ~8 s of small jobs after
    the classification, ~6 s of it with at most one task running). The thread's jobs go to a
    scheduler pool of their own (:data:`FIGURES_POOL`): with the session's fair scheduling
    (``spark.scheduler.mode``, :func:`tracemq_spark.session.session_conf`) the two chains
    share the cores as they go, where in one FIFO queue the tally's tasks waited behind every
    task of the anomalies' write and its chain then ran alone (~7 s at 10M)."""
    final = final_frame(ctx.spark.read.parquet(ctx.stage.path("_classified")))
    sc = ctx.spark.sparkContext
    group = f"tracemq-reconcile-{ctx.run_id}-figures"

    def figures() -> None:
        # (a thread of the pool's own: its job group and scheduler pool go with it)
        sc.setJobGroup(group, "reconcile: tally and grouped figures")
        sc.setLocalProperty("spark.scheduler.pool", FIGURES_POOL)
        _figures(ctx, final)
        _summary(ctx)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconcile-figures") as pool:
        job = pool.submit(figures)
        try:
            checkpoint(ctx.p, "during_tables")
            _anomalies(ctx, final)
            if not job.done():
                # the report's matplotlib (~0.5 s of imports) while this thread would only
                # wait for the figures' last jobs, not after them
                importlib.import_module("tracemq_spark.report")
        except BaseException:
            sc.cancelJobGroup(group)  # (and wait below: nothing may write into the staging
            wait([job])  # directory once the run's cleanup starts)
            raise
        job.result()


#: the scheduler pool of the figures' thread (:func:`publish_tables`)
FIGURES_POOL = "reconcile-figures"


def _summary(ctx: _Context) -> None:
    """``summary`` (staged): the grouped figures of each window (``_grouped``'s level 0)."""
    g = ctx.spark.read.parquet(ctx.stage.path("_grouped"))
    per_window = _flatten_percentiles(
        decode(
            g.where(F.col("gid") == 0).drop("gid"),
            ctx.scan.dict_df,
            [("topic_h", "topic"), ("group_h", "group")],
        )
    )
    # (the session's setting as it is: the anomalies' write, beside, sets and restores it)
    write(ctx.fs, ctx.stage, with_window(per_window, ctx.p.window_ms), "summary", open_windows=None)


def _figures(ctx: _Context, final: DataFrame) -> None:
    """``_tally`` and ``_grouped`` (staged, unpartitioned): one tally of the classified rows
    (outcome counts, latency buckets per window, topic and group) gives the summary Parquet,
    summary.json and the report's histograms. The JVM path counted its rows as it wrote them
    but the orphans (a key can come twice: the readers sum)."""
    keys = latency.LEVELS[0][1]
    if ctx.jvm_tally is not None:
        t = latency.tally(cogroup.tally_rest(final), list(METRICS), SKEW_LIMIT_MS, keys)
        t = t.unionByName(cogroup.tally_frame(ctx.spark, ctx.jvm_tally))
    else:
        t = latency.tally(final, list(METRICS), SKEW_LIMIT_MS, keys)
    t.write.mode("overwrite").parquet(ctx.stage.path("_tally"))
    tallies = ctx.spark.read.parquet(ctx.stage.path("_tally"))
    grouped = latency.grouped(tallies, OUTCOMES + INFORMATIONAL, list(METRICS), PERCENTILES)
    grouped.write.mode("overwrite").parquet(ctx.stage.path("_grouped"))


def _anomalies(ctx: _Context, final: DataFrame) -> None:
    """``anomalies`` (and with ``keep_classified`` ``classified``), staged."""
    col = F.col
    anomaly_outcomes = [o for o in OUTCOMES if o != "CONSUMED"]
    anomalies = decode(
        final.where(col("outcome").isin(anomaly_outcomes)),
        ctx.scan.dict_df,
        [("topic_h", "topic"), ("group_h", "group"), ("client_h", "client_host")],
    ).drop("tags_h", "store_h")
    # the producer's strings came with the classified rows (the first Pub's, classify.pubs):
    # no second read of the lake's Pubs, no join (at 10M messages that read and the join's
    # shuffles cost ~20 s of task CPU); the columns in the order the join gave them
    details = list(PUB_STRINGS)
    anomalies = anomalies.select(
        "msg_id",
        *[c for c in anomalies.columns if c != "msg_id" and c not in details],
        *details,
    ).withColumn("evidence", _evidence())
    write(
        ctx.fs,
        ctx.stage,
        with_window(anomalies, ctx.p.window_ms),
        "anomalies",
        plain=PLAIN_COLUMNS,
    )
    if ctx.p.keep_classified:
        full = decode(
            final,
            ctx.scan.dict_df,
            [("topic_h", "topic"), ("group_h", "group"), ("client_h", "client_host")],
        )
        write(ctx.fs, ctx.stage, with_window(full, ctx.p.window_ms), "classified", open_windows=0)


#: Spark's setting: how many files a write task keeps open at once before it sorts the rest
_CONCURRENT_WRITERS = "spark.sql.maxConcurrentOutputFileWriters"


#: the anomalies' columns of (nearly) distinct values: written without Parquet's dictionary
#: encoding, which tried each of them first (a hash look-up per value) and, past its 1 MB
#: dictionary page, fell back and re-encoded them plain — a third of the anomalies write's
#: CPU at 1M messages (JFR). The rows are the same; the files' other columns keep it.
PLAIN_COLUMNS = (
    "msg_id",
    "keys",
    "evidence",
    "pub_ts",
    "due_ts",
    "first_consume_ts",
    "success_ts",
    "queue_offset",
    "retry_queue_offset",
    "store_to_consume_ms",
    "end_to_end_ms",
)


def write(
    fs: Any,
    stage: Staging,
    df: DataFrame,
    name: str,
    *,
    open_windows: int | None = 64,
    plain: tuple[str, ...] = (),
) -> None:
    """Write a dataset partitioned by window into the staging directory, then mark it
    complete (dynamic partition overwrite writes no _SUCCESS of its own).

    ``open_windows``: a write task keeps up to that many windows' files open at once (past
    it, Spark sorts the rest by window itself) instead of sorting its rows by window first.
    The sort cost its time, and its generated ``sort_addToSorter``, fused with the
    anomalies' decode and evidence projection, was the largest method C2 compiled in the
    whole job (334 kB, 5.8 s of compiler CPU at 1M messages, JFR). Each open file buffers a
    Parquet row group: 0 (sort, one file at a time) for a dataset of every classified row;
    None leaves the session's setting as it is (a small dataset written beside another write).
    ``plain``: columns written without dictionary encoding (:data:`PLAIN_COLUMNS`)."""
    target = stage.path(name)
    w = df.write.mode("overwrite").partitionBy("window")
    for c in plain:
        w = w.option(f"parquet.enable.dictionary#{c}", "false")
    if open_windows is None:
        w.parquet(target)
    else:
        conf = df.sparkSession.conf
        old = conf.get(_CONCURRENT_WRITERS, None)
        conf.set(_CONCURRENT_WRITERS, str(open_windows))
        try:
            w.parquet(target)
        finally:
            if old is None:
                conf.unset(_CONCURRENT_WRITERS)
            else:
                conf.set(_CONCURRENT_WRITERS, old)
    fs.mkdirs(target)
    fs.write_text(stage.path(name, "_SUCCESS"), "")


def summarize(ctx: _Context, stages: dict[str, float]) -> dict[str, Any]:
    """summary.json: counts per outcome (overall, per topic, per group, per topic and group,
    per window) and the latency figures; also the data of the report's charts."""
    col = F.col
    names = OUTCOMES + INFORMATIONAL
    g = ctx.spark.read.parquet(ctx.stage.path("_grouped")).collect()
    dec = ctx.scan.dictionary

    def name_of(h: int | None) -> str | None:
        return None if h is None else dec.get(h, f"#{h}")

    by_window: dict[int, dict[str, Any]] = {}
    tg: list[dict[str, Any]] = []
    overall: dict[str, int] = dict.fromkeys(names, 0)
    overall_latency: dict[str, Any] = {}
    by_topic: dict[str, dict[str, int]] = {}
    by_group: dict[str, dict[str, int]] = {}
    for r in g:
        counts = {o: int(r[o.lower()] or 0) for o in names}
        if r["gid"] == 0:
            win = by_window.setdefault(
                r["window_start_ms"],
                {
                    "window": _window_label(r["window_start_ms"]),
                    "window_start": _iso(r["window_start_ms"]),
                    **dict.fromkeys(names, 0),
                },
            )
            for o in names:
                win[o] += counts[o]
        elif r["gid"] == 4:  # grouping set (topic, group): window not grouped
            topic, group = name_of(r["topic_h"]), name_of(r["group_h"])
            tg.append({"topic": topic, "group": group, "outcomes": counts, "latency": _latency(r)})
            t = by_topic.setdefault(topic or "(none)", dict.fromkeys(names, 0))
            for o in names:
                t[o] += counts[o]
            if group is not None:
                gr = by_group.setdefault(group, dict.fromkeys(names, 0))
                for o in names:
                    gr[o] += counts[o]
        elif r["gid"] == 7:  # grouping set (): everything
            overall = counts
            overall_latency = _latency(r)
    tg.sort(key=lambda x: (x["topic"] or "", x["group"] or ""))
    hist = (
        ctx.spark.read.parquet(ctx.stage.path("_tally"))
        .where(col("kind").isin(list(METRICS)))
        .groupBy("kind", "b")
        .agg(F.sum("n").alias("n"))
        .collect()
    )
    histograms = latency.log2_histograms(hist, list(METRICS))
    skew = {m: overall_latency.get(m, {}).get("skew_suspect", 0) for m in METRICS}
    anomalies = sum(v for k, v in overall.items() if k != "CONSUMED" and k in OUTCOMES)
    p = ctx.p
    summary = {
        "run": {
            "run_id": ctx.run_id,
            "lake": ctx.lake,
            "out": ctx.stage.out,
            "from": _iso(ctx.f_ms),
            "to": _iso(ctx.t_ms),
            "from_ms": ctx.f_ms,
            "to_ms": ctx.t_ms,
            "requested_from_ms": p.from_ms,
            "requested_to_ms": p.to_ms,
            "horizon_ms": p.horizon_ms,
            "window_ms": p.window_ms,
            "max_reconsume_times": p.max_reconsume_times,
            "max_delay_ms": p.max_delay_ms,
            "subscription_grace_ms": p.subscription_grace_ms,
            "now_ms": ctx.now_ms,
            "cutoff_ms": ctx.cutoff,
            "cutoff": _iso(ctx.cutoff),
            "read_from_ms": ctx.read_lo,
            "read_to_ms": ctx.read_hi,
            "started_at": ctx.started.isoformat().replace("+00:00", "Z"),
            "windows": [_window_label(x) for x in ctx.windows],
        },
        "input": {
            **ctx.scan.stats,
            "subscription_rows": len(ctx.subs),
            "offset_rows": len(ctx.offsets),
            "broadcasting_clients": [list(c) for c in ctx.scan.broadcast_clients],
        },
        "outcomes": {o: overall.get(o, 0) for o in OUTCOMES},
        "informational": {o: overall.get(o, 0) for o in INFORMATIONAL},
        "anomalies": anomalies,
        "by_topic": {t: {o: v[o] for o in OUTCOMES} for t, v in sorted(by_topic.items())},
        "by_group": {g: {o: v[o] for o in OUTCOMES} for g, v in sorted(by_group.items())},
        "by_topic_group": tg,
        "by_window": [by_window[k] for k in sorted(by_window)],
        "latency": overall_latency,
        "latency_histograms_log2_ms": histograms,
        "clock_skew": {
            "suspect_rows_by_metric": skew,
            "flagged": any(skew.values()),
            "rule": f"a latency < 0 or > {SKEW_LIMIT_MS} ms is a clock-skew suspect: counted "
            "here and in the *_skew_suspect columns, left out of the percentiles",
            "by_topic_group": [
                {
                    "topic": x["topic"],
                    "group": x["group"],
                    **{m: x["latency"][m]["skew_suspect"] for m in METRICS},
                }
                for x in tg
                if any(x["latency"][m]["skew_suspect"] for m in METRICS)
            ],
        },
    }
    ctx.fs.write_text(ctx.stage.path("summary.json"), json.dumps(summary, indent=2, default=str))
    return summary


def report(fs: Any, stage: Staging, summary: dict[str, Any]) -> None:
    from tracemq_spark import report

    html, png = report.render(summary)
    fs.write_text(stage.path("report.html"), html)
    fs.write_bytes(stage.path("report.png"), png)


def _flatten_percentiles(df: DataFrame) -> DataFrame:
    for m in METRICS:
        df = df.select(
            "*",
            *[
                F.col(f"{m}_pct")[i].alias(f"{m}_p{int(q * 100)}")
                for i, q in enumerate(PERCENTILES)
            ],
        ).drop(f"{m}_pct")
    return df


def _latency(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in METRICS:
        pct = r[f"{m}_pct"] or [None] * len(PERCENTILES)
        out[m] = {
            "p50": pct[0],
            "p90": pct[1],
            "p99": pct[2],
            "max": r[f"{m}_max"],
            "count": int(r[f"{m}_count"] or 0),
            "skew_suspect": int(r[f"{m}_skew_suspect"] or 0),
        }
    return out


def _evidence() -> Column:
    """A one-line human explanation of an anomaly row (from its evidence columns)."""
    c = F.col
    o = c("outcome")

    def text(*parts: str | Column) -> Column:
        """The parts joined: strings as they are, columns as strings ("?" when null)."""
        return F.concat(
            *[
                F.lit(x) if isinstance(x, str) else F.coalesce(x.cast("string"), F.lit("?"))
                for x in parts
            ]
        )

    # where the offsets say the group is done with the message: its last retry copy, or the
    # original queue
    done_at = F.when(
        c("retry_reconsume").isNotNull(),
        text(
            "retry copy #",
            c("retry_reconsume"),
            " in %RETRY%",
            c("group"),
            " at offset ",
            c("retry_queue_offset"),
            " is behind the committed offset ",
            c("retry_committed"),
        ),
    ).otherwise(
        text(
            "the committed offset ",
            c("committed_offset"),
            " is past queue offset ",
            c("queue_offset"),
        )
    )
    return (
        F.when(o == "TRACE_LOST", text("no consume trace, but ", done_at))
        .when(
            o == "TRACE_INCOMPLETE",
            text(
                "consumed by the offsets, trace incomplete: ",
                done_at,
                "; traced ",
                c("attempts"),
                " attempt(s), ",
                c("failed_attempts"),
                " failed, ",
                c("in_flight_attempts"),
                " without end, none successful",
            ),
        )
        .when(
            (o == "DEAD_LETTERED") & c("dlq_queue_offset").isNotNull(),
            text(
                "copy in %DLQ%",
                c("group"),
                " at offset ",
                c("dlq_queue_offset"),
                "; ",
                c("failed_attempts"),
                " failed attempt(s) traced",
            ),
        )
        .when(
            o == "NOT_CONSUMED",
            F.when(
                c("msg_type").isin(_MSG_HALF, _MSG_DELAY),
                F.lit(
                    "no consume trace past the horizon (delayed/transactional: queue offset not "
                    "comparable)"
                ),
            ).otherwise(
                text(
                    "no consume trace past the horizon; committed offset ",
                    c("committed_offset"),
                    " <= queue offset ",
                    c("queue_offset"),
                )
            ),
        )
        .when(
            o == "PENDING",
            text("no consume trace yet; due until ", F.timestamp_millis(c("due_ts"))),
        )
        .when(o == "IN_FLIGHT", text(c("in_flight_attempts"), " attempt(s) began without ending"))
        .when(
            o.isin("FAILED", "DEAD_LETTERED"),
            text(c("failed_attempts"), " failed attempt(s), highest retry ", c("max_retry_times")),
        )
        .when(
            o == "CONSUMED_AFTER_RETRY",
            text("consumed after ", c("attempts") - 1, " earlier attempt(s)"),
        )
        .when(o == "DUPLICATE", text(c("successes"), " successful consumptions"))
        .when(
            o == "UNEXPECTED_GROUP",
            text(
                "group has no matching subscription at ",
                F.timestamp_millis(c("pub_ts")),
                " for tag ",
                c("tags"),
            ),
        )
        .when(
            o == "ORPHAN_CONSUME",
            text(c("consume_events"), " consume event(s), no Pub found"),
        )
        .when(o == "PUB_FAILED", F.lit("every send attempt failed"))
    )
