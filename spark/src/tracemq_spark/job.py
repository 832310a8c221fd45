"""The reconciliation job: send traces against consume traces over the Parquet trace lake.

Pure PySpark (DataFrame API, no Python UDFs); it imports nothing of tracemq but the lake schema.
:func:`run` is the whole job; the CLI (``tracemq reconcile``) and ``submit.py`` (spark-submit)
only parse arguments, build the session and call it.

Semantics (DESIGN §6; the documented choices are in the package README and in ``--help``):

* Read range: lake events with ``from - horizon <= timestamp < to + horizon`` (hour partitions
  pruned by directory). ``from``/``to`` are first aligned to the window grid.
* A message is a msgId with a Pub in ``[from, to)``; its Pubs are deduplicated (send retries),
  the first successful one wins; only failed Pubs: ``PUB_FAILED``.
* Expected groups: subscription rows of the message's topic whose ``first_seen <= pub <=
  last_seen + grace`` and whose tag expression accepts the message's tag. Not expected anywhere:
  a half message without EndTransaction COMMIT_MESSAGE, a recalled message.
* Broadcasting groups: one outcome per consuming client (client hosts seen in SubBefore rows of
  the group and topic in the read range; none seen: one outcome with no client).
* Consume events are paired by requestId into attempts, then aggregated per (msgId, group[,
  client]) before meeting the Pubs (one shuffle each side, co-partitioned by msgId).
* The offsets overrule a partial trace: the message's last delivery (its last copy in
  ``%RETRY%<group>``, from the snapshot's ``copies``, else the original queue) behind the group's
  committed offset, no ``%DLQ%<group>`` copy, no traced failure of that delivery: consumed.
  Attempts without success then give TRACE_INCOMPLETE, not FAILED or IN_FLIGHT; no consume
  event at all gives TRACE_LOST (even inside the horizon). A dead-letter copy: DEAD_LETTERED.
* Otherwise, without consume events: PENDING while ``pub + horizon`` (delayed messages:
  ``pub + max(max_delay, horizon)``) is after the cutoff ``min(to + horizon, now)``, else
  NOT_CONSUMED. Delayed and transactional messages store their Pub in the schedule/half queue,
  whose offset says nothing about the real queue.
* ORPHAN_CONSUME: consumes of a msgId with no Pub in the read range, first consumed in
  ``[from, to)``, whose msgId was created (the time it embeds) inside the read range, or whose
  msgId is empty; consumes of messages created before the read range are left alone.
* A msgId's creation time is milliseconds since a month start in the *producer's* time zone
  (RocketMQ's rule); the lake has no producer zone per message, so the job reads every msgId in
  one zone, ``--msgid-timezone`` (default UTC). A wrong zone moves a creation time by the zones'
  difference, which matters only for whether a consume without a Pub is an orphan.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tracemq_spark import classify, latency
from tracemq_spark.commit import Staging, checkpoint, cleanup, commit, validate_staging
from tracemq_spark.input_files import (
    last_deliveries,
    parse_copies,
    parse_offsets,
    parse_subscriptions,
)
from tracemq_spark.lake_scan import LakeScan, _maybe_corrupt
from tracemq_spark.params import (
    _MSG_DELAY,
    _MSG_HALF,
    BROADCAST_IDS_MAX,
    INFORMATIONAL,
    KNOWN_SCHEMA_VERSIONS,
    METRICS,
    MINUTE_MS,
    OUTCOMES,
    PERCENTILES,
    SKEW_LIMIT_MS,
    Params,
    ReconcileError,
    RunResult,
    _iso,
    _window_label,
)
from tracemq_spark.session import _RUNTIME_CONF, build_session

__all__ = [
    "INFORMATIONAL",
    "KNOWN_SCHEMA_VERSIONS",
    "METRICS",
    "OUTCOMES",
    "Params",
    "ReconcileError",
    "RunResult",
    "build_session",
    "last_deliveries",
    "parse_copies",
    "parse_offsets",
    "parse_subscriptions",
    "run",
]


# ----------------------------------------------------------------------------- the run

Progress = Callable[[str], None]


def run(spark: SparkSession, params: Params, progress: Progress | None = None) -> RunResult:
    """Run the reconciliation; on any failure the previous output is left as it was."""
    from tracemq_spark.fs import HadoopFS

    t_start = time.monotonic()
    say = progress or (lambda _msg: None)
    params.validate()
    w = params.window_ms
    f_ms = params.from_ms // w * w
    t_ms = -(-params.to_ms // w) * w
    if (f_ms, t_ms) != (params.from_ms, params.to_ms):
        say(f"window grid of {w // MINUTE_MS} min: reconciling [{_iso(f_ms)}, {_iso(t_ms)})")
    now_ms = params.now_ms if params.now_ms is not None else int(time.time() * 1000)
    run_id = params.run_id or (
        datetime.now(tz=UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    )
    for k, v in _RUNTIME_CONF.items():
        spark.conf.set(k, v)
    fs = HadoopFS(spark)
    lake = fs.qualify(params.lake)
    out = fs.qualify(params.out)
    if not fs.is_dir(lake):
        raise ReconcileError(f"trace lake not found: {params.lake} ({lake} is not a directory)")
    out_existed = fs.exists(out)
    stage = Staging(out, run_id)
    stages: dict[str, float] = {}
    last = [time.monotonic()]

    def done(name: str) -> None:
        now = time.monotonic()
        stages[name] = round(now - last[0], 3)
        last[0] = now
        say(f"{name} done in {stages[name]:.1f}s")

    try:
        ctx = _Context(spark, fs, params, lake, stage, f_ms, t_ms, now_ms, run_id, say)
        ctx.load_inputs()
        done("inputs")
        ctx.discover()
        done("lake files checked")
        ctx.preflight()
        done("pre-flight scan")
        ctx.classify()
        done("classification")
        checkpoint(params, "after_classified")
        ctx.publish_tables()
        done("anomalies and summary")
        checkpoint(params, "after_tables")
        summary = ctx.summarize(stages)
        done("summary.json")
        ctx.report(summary)
        done("report")
        checkpoint(params, "after_report")
        validate_staging(fs, stage, params.keep_classified, summary)
        commit(fs, stage, params, ctx.windows, say)
        done("commit")
    except BaseException:
        cleanup(fs, stage, out, out_existed)
        raise
    cleanup(fs, stage, out, True)
    elapsed = time.monotonic() - t_start
    summary["run"]["elapsed_s"] = round(elapsed, 3)
    summary["run"]["stages_s"] = stages
    return RunResult(run_id, out, f_ms, t_ms, summary, elapsed, stages)


class _Context:
    def __init__(
        self,
        spark: SparkSession,
        fs: Any,
        params: Params,
        lake: str,
        stage: Staging,
        f_ms: int,
        t_ms: int,
        now_ms: int,
        run_id: str,
        say: Progress,
    ) -> None:
        self.spark = spark
        self.fs = fs
        self.p = params
        self.lake = lake
        self.stage = stage
        self.f_ms = f_ms
        self.t_ms = t_ms
        self.now_ms = now_ms
        self.run_id = run_id
        self.say = say
        h = params.horizon_ms
        self.read_lo = f_ms - h
        self.read_hi = t_ms + h
        self.cutoff = min(t_ms + h, now_ms)
        self.windows = list(range(f_ms, t_ms, params.window_ms))
        self.scan = LakeScan(
            spark, fs, lake, params.lake, f_ms, t_ms, self.read_lo, self.read_hi, say
        )
        self.started = datetime.now(tz=UTC)

    # -- inputs -----------------------------------------------------------------------
    def load_inputs(self) -> None:
        fs, st = self.fs, self.stage
        texts = {}
        for name, uri in (("subscriptions", self.p.subscriptions), ("offsets", self.p.offsets)):
            if not fs.exists(uri):
                raise ReconcileError(f"{name} file not found: {uri}")
            texts[name] = fs.read_text(uri)
        self.subs = parse_subscriptions(texts["subscriptions"], self.p.subscriptions)
        self.offsets = parse_offsets(texts["offsets"], self.p.offsets)
        self.copies = parse_copies(texts["offsets"], self.p.offsets)
        self.deliveries = last_deliveries(self.copies, self.offsets)
        for name, text in texts.items():
            target = st.path("inputs", f"{name}.json")
            if fs.qualify(target) != fs.qualify(getattr(self.p, name)):
                fs.write_text(target, text)
        self.bgroups = sorted({s.group for s in self.subs if s.broadcasting})
        self.say(
            f"{len(self.subs)} subscription rows ({len(self.bgroups)} broadcasting groups), "
            f"{len(self.offsets)} committed offsets, {len(self.copies)} retry/dead-letter copies"
        )

    # -- the lake ---------------------------------------------------------------------
    def discover(self) -> None:
        self.scan.discover()

    def preflight(self) -> None:
        self.scan.preflight(self.subs, self.offsets, self.bgroups)

    # -- classification ---------------------------------------------------------------
    def classify(self) -> None:
        """One row per (message, group[, client]) with its outcome and evidence, written to
        ``<staging>/_classified`` (CONSUMED rows included, strings still hashed)."""
        df = self.classified_frame()
        try:
            # an intermediate read twice from local disk and deleted at the end: written fast
            # (no compression, no dictionary pages) rather than small
            df.write.mode("overwrite").option("compression", "none").option(
                "parquet.enable.dictionary", "false"
            ).parquet(self.stage.path("_classified"))
        except Exception as exc:
            raise _maybe_corrupt(exc, self.scan.files) from None

    def classified_frame(self) -> DataFrame:
        """The classification's steps (:mod:`tracemq_spark.classify`) over this run's lake
        read and inputs."""
        spark, p = self.spark, self.p
        n_parts = int(spark.conf.get("spark.sql.shuffle.partitions") or 16)
        ev = self.scan.events(
            "trace_type",
            "timestamp",
            "group_name",
            "request_id",
            "cost_time",
            "success",
            "topic",
            "msg_id",
            "tags",
            "client_host",
            "store_time",
            "retry_times",
            "msg_type",
            "transaction_state",
            "store_addr",
            "queue_id",
            "queue_offset",
        )
        # every timestamp read is >= read_lo: (ts - base) fits 62 bits
        pubs = classify.pubs(ev, f_ms=self.f_ms, t_ms=self.t_ms, base=self.read_lo, n_parts=n_parts)
        exp = classify.expected_deliveries(
            pubs,
            classify.subs_frame(spark, self.subs, p.subscription_grace_ms),
            classify.clients_frame(spark, self.scan.broadcast_clients),
        )
        bh = [self.scan.hash_of[g] for g in self.bgroups if g in self.scan.hash_of]
        att = classify.attempts(ev, bh=bh, n_parts=n_parts)
        agg = classify.consumed(att, pubs)
        deliveries = classify.deliveries_frame(
            spark, self.fs, self.stage.path("_deliveries"), self.deliveries
        )
        return classify.meet(
            exp,
            agg,
            classify.offsets_frame(spark, self.offsets),
            deliveries,
            p,
            f_ms=self.f_ms,
            t_ms=self.t_ms,
            read_lo=self.read_lo,
            cutoff=self.cutoff,
        )

    # -- outputs ----------------------------------------------------------------------
    def _decode(self, df: DataFrame, pairs: list[tuple[str, str]]) -> DataFrame:
        """Hashed columns back to their strings (broadcast joins with the dictionary)."""
        for hcol, name in pairs:
            d = F.broadcast(
                self.scan.dict_df.select(F.col("h").alias(f"_{hcol}"), F.col("s").alias(name))
            )
            df = df.join(d, F.col(hcol) == F.col(f"_{hcol}"), "left").drop(f"_{hcol}", hcol)
        return df

    def final_frame(self) -> DataFrame:
        """The classified rows, with per-attempt orphans of empty msgIds folded into one row
        per (window, group, client); strings still hashed."""
        col = F.col
        cl = self.spark.read.parquet(self.stage.path("_classified"))
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

    def _with_window(self, df: DataFrame) -> DataFrame:
        col = F.col
        w = self.p.window_ms
        return (
            df.withColumn("window_start", F.timestamp_millis(col("window_start_ms")))
            .withColumn("window_end", F.timestamp_millis(col("window_start_ms") + w))
            .withColumn("window", F.date_format(col("window_start"), "yyyyMMdd'T'HHmm'Z'"))
        )

    def _pub_details(self, ids: DataFrame, *, broadcast: bool) -> DataFrame:
        """Producer-side strings of the given msgIds (the first successful Pub's): tags,
        keys, store address, producer group.

        ``broadcast``: the msgIds' 64-bit hashes are broadcast and the lake's Pub rows filtered
        against them before any shuffle (a hash collision only lets an extra row through: the
        join on the msgId itself decides); otherwise both sides are shuffled."""
        col = F.col
        ev = self.scan.events(
            "trace_type",
            "msg_id",
            "timestamp",
            "success",
            "tags",
            "keys",
            "store_addr",
            "group_name",
        )
        pub_rows = ev.where(col("trace_type") == "Pub")
        if broadcast:
            hashes = F.broadcast(ids.select(F.xxhash64("msg_id").alias("_id_h")))
            pub_rows = pub_rows.join(hashes, F.xxhash64("msg_id") == col("_id_h"), "left_semi")
        else:
            pub_rows = pub_rows.join(ids, "msg_id", "left_semi")
        pubs = (
            pub_rows.select(
                "msg_id",
                F.struct(
                    (~col("success")).alias("failed"),
                    col("timestamp").alias("ts"),
                    "tags",
                    "keys",
                    "store_addr",
                    col("group_name").alias("producer_group"),
                ).alias("p"),
            )
            .groupBy("msg_id")
            .agg(F.min("p").alias("p"))
        )
        return pubs.select("msg_id", "p.tags", "p.keys", "p.store_addr", "p.producer_group")

    def publish_tables(self) -> None:
        col = F.col
        final = self.final_frame()
        # one tally of the classified rows (outcome counts, latency buckets per window, topic
        # and group) gives the summary Parquet, summary.json and the report's histograms
        latency.tally(final, list(METRICS), SKEW_LIMIT_MS, latency.LEVELS[0][1]).write.mode(
            "overwrite"
        ).parquet(self.stage.path("_tally"))
        tallies = self.spark.read.parquet(self.stage.path("_tally"))
        anomaly_outcomes = [o for o in OUTCOMES if o != "CONSUMED"]
        n_anomalies = (
            tallies.where(col("kind").isin(anomaly_outcomes)).agg(F.sum("n")).first()[0] or 0
        )
        anomalies = final.where(col("outcome").isin(anomaly_outcomes))
        anomalies = self._decode(
            anomalies, [("topic_h", "topic"), ("group_h", "group"), ("client_h", "client_host")]
        )
        details = self._pub_details(
            anomalies.where(col("msg_id").isNotNull()).select("msg_id"),
            broadcast=n_anomalies <= BROADCAST_IDS_MAX,
        )
        anomalies = (
            anomalies.join(details, "msg_id", "left")
            .withColumn("evidence", _evidence())
            .drop("tags_h", "store_h")
        )
        self._write(self._with_window(anomalies), "anomalies")
        if self.p.keep_classified:
            full = self._decode(
                final, [("topic_h", "topic"), ("group_h", "group"), ("client_h", "client_host")]
            )
            self._write(self._with_window(full), "classified")
        grouped = latency.grouped(tallies, OUTCOMES + INFORMATIONAL, list(METRICS), PERCENTILES)
        grouped.write.mode("overwrite").parquet(self.stage.path("_grouped"))
        g = self.spark.read.parquet(self.stage.path("_grouped"))
        per_window = _flatten_percentiles(
            self._decode(
                g.where(col("gid") == 0).drop("gid"), [("topic_h", "topic"), ("group_h", "group")]
            )
        )
        self._write(self._with_window(per_window), "summary")

    def _write(self, df: DataFrame, name: str) -> None:
        """Write a dataset partitioned by window into the staging directory, then mark it
        complete (dynamic partition overwrite writes no _SUCCESS of its own)."""
        target = self.stage.path(name)
        df.write.mode("overwrite").partitionBy("window").parquet(target)
        self.fs.mkdirs(target)
        self.fs.write_text(self.stage.path(name, "_SUCCESS"), "")

    def summarize(self, stages: dict[str, float]) -> dict[str, Any]:
        """summary.json: counts per outcome (overall, per topic, per group, per topic and group,
        per window) and the latency figures; also the data of the report's charts."""
        col = F.col
        names = OUTCOMES + INFORMATIONAL
        g = self.spark.read.parquet(self.stage.path("_grouped")).collect()
        dec = self.scan.dictionary

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
                tg.append(
                    {"topic": topic, "group": group, "outcomes": counts, "latency": _latency(r)}
                )
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
            self.spark.read.parquet(self.stage.path("_tally"))
            .where(col("kind").isin(list(METRICS)))
            .groupBy("kind", "b")
            .agg(F.sum("n").alias("n"))
            .collect()
        )
        histograms = latency.log2_histograms(hist, list(METRICS))
        skew = {m: overall_latency.get(m, {}).get("skew_suspect", 0) for m in METRICS}
        anomalies = sum(v for k, v in overall.items() if k != "CONSUMED" and k in OUTCOMES)
        p = self.p
        summary = {
            "run": {
                "run_id": self.run_id,
                "lake": self.lake,
                "out": self.stage.out,
                "from": _iso(self.f_ms),
                "to": _iso(self.t_ms),
                "from_ms": self.f_ms,
                "to_ms": self.t_ms,
                "requested_from_ms": p.from_ms,
                "requested_to_ms": p.to_ms,
                "horizon_ms": p.horizon_ms,
                "window_ms": p.window_ms,
                "max_reconsume_times": p.max_reconsume_times,
                "max_delay_ms": p.max_delay_ms,
                "subscription_grace_ms": p.subscription_grace_ms,
                "now_ms": self.now_ms,
                "cutoff_ms": self.cutoff,
                "cutoff": _iso(self.cutoff),
                "read_from_ms": self.read_lo,
                "read_to_ms": self.read_hi,
                "started_at": self.started.isoformat().replace("+00:00", "Z"),
                "windows": [_window_label(x) for x in self.windows],
            },
            "input": {
                **self.scan.stats,
                "subscription_rows": len(self.subs),
                "offset_rows": len(self.offsets),
                "broadcasting_clients": [list(c) for c in self.scan.broadcast_clients],
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
        self.fs.write_text(
            self.stage.path("summary.json"), json.dumps(summary, indent=2, default=str)
        )
        return summary

    def report(self, summary: dict[str, Any]) -> None:
        from tracemq_spark import report

        html, png = report.render(summary)
        self.fs.write_text(self.stage.path("report.html"), html)
        self.fs.write_bytes(self.stage.path("report.png"), png)


# ----------------------------------------------------------------------------- helpers


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

    def s(x: Column) -> Column:
        return F.coalesce(x.cast("string"), F.lit("?"))

    # where the offsets say the group is done with the message: its last retry copy, or the
    # original queue
    done_at = F.when(
        c("retry_reconsume").isNotNull(),
        F.concat(
            F.lit("retry copy #"),
            s(c("retry_reconsume")),
            F.lit(" in %RETRY%"),
            s(c("group")),
            F.lit(" at offset "),
            s(c("retry_queue_offset")),
            F.lit(" is behind the committed offset "),
            s(c("retry_committed")),
        ),
    ).otherwise(
        F.concat(
            F.lit("the committed offset "),
            s(c("committed_offset")),
            F.lit(" is past queue offset "),
            s(c("queue_offset")),
        )
    )
    return (
        F.when(
            o == "TRACE_LOST",
            F.concat(F.lit("no consume trace, but "), done_at),
        )
        .when(
            o == "TRACE_INCOMPLETE",
            F.concat(
                F.lit("consumed by the offsets, trace incomplete: "),
                done_at,
                F.lit("; traced "),
                s(c("attempts")),
                F.lit(" attempt(s), "),
                s(c("failed_attempts")),
                F.lit(" failed, "),
                s(c("in_flight_attempts")),
                F.lit(" without end, none successful"),
            ),
        )
        .when(
            (o == "DEAD_LETTERED") & c("dlq_queue_offset").isNotNull(),
            F.concat(
                F.lit("copy in %DLQ%"),
                s(c("group")),
                F.lit(" at offset "),
                s(c("dlq_queue_offset")),
                F.lit("; "),
                s(c("failed_attempts")),
                F.lit(" failed attempt(s) traced"),
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
                F.concat(
                    F.lit("no consume trace past the horizon; committed offset "),
                    s(c("committed_offset")),
                    F.lit(" <= queue offset "),
                    s(c("queue_offset")),
                )
            ),
        )
        .when(
            o == "PENDING",
            F.concat(F.lit("no consume trace yet; due until "), s(F.timestamp_millis(c("due_ts")))),
        )
        .when(
            o == "IN_FLIGHT",
            F.concat(s(c("in_flight_attempts")), F.lit(" attempt(s) began without ending")),
        )
        .when(
            o.isin("FAILED", "DEAD_LETTERED"),
            F.concat(
                s(c("failed_attempts")),
                F.lit(" failed attempt(s), highest retry "),
                s(c("max_retry_times")),
            ),
        )
        .when(
            o == "CONSUMED_AFTER_RETRY",
            F.concat(F.lit("consumed after "), s(c("attempts") - 1), F.lit(" earlier attempt(s)")),
        )
        .when(o == "DUPLICATE", F.concat(s(c("successes")), F.lit(" successful consumptions")))
        .when(
            o == "UNEXPECTED_GROUP",
            F.concat(
                F.lit("group has no matching subscription at "),
                s(F.timestamp_millis(c("pub_ts"))),
                F.lit(" for tag "),
                s(c("tags")),
            ),
        )
        .when(
            o == "ORPHAN_CONSUME",
            F.concat(s(c("consume_events")), F.lit(" consume event(s), no Pub found")),
        )
        .when(o == "PUB_FAILED", F.lit("every send attempt failed"))
    )
