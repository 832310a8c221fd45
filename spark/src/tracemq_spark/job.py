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
from pyspark.sql import types as T

from tracemq_spark import latency
from tracemq_spark.commit import Staging, checkpoint, cleanup, commit, validate_staging
from tracemq_spark.input_files import (
    SubRow,
    last_deliveries,
    parse_copies,
    parse_offsets,
    parse_subscriptions,
)
from tracemq_spark.lake_scan import LakeScan, _maybe_corrupt
from tracemq_spark.params import (
    _DLQ_PREFIX,
    _MSG_DELAY,
    _MSG_HALF,
    _TX_COMMIT,
    _TX_ROLLBACK,
    BROADCAST_IDS_MAX,
    DAY_MS,
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
        spark, p = self.spark, self.p
        n_parts = int(spark.conf.get("spark.sql.shuffle.partitions") or 16)
        col = F.col
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
        tt = col("trace_type")
        base = self.read_lo  # every timestamp read is >= base: (ts - base) fits 62 bits

        # a consumer's move of a message to %DLQ%<group> is traced as a Pub of the group: it
        # belongs to the consume side, not to the message's send
        dlq_move = (tt == "Pub") & col("topic").startswith(_DLQ_PREFIX)

        # ---- producer side: one row per msgId (the first successful Pub wins) -----------
        is_pub = tt == "Pub"
        order = F.when(
            is_pub,
            F.shiftleft(F.when(col("success"), 0).otherwise(1).cast("long"), 62)
            + (col("timestamp") - base),
        )
        prod = (
            ev.where(
                tt.isin("Pub", "EndTransaction", "Recall")
                & ~F.coalesce(dlq_move, F.lit(False))
                & col("msg_id").isNotNull()
                & (col("msg_id") != "")
            )
            .select(
                col("msg_id").alias("pkey"),
                order.alias("o"),
                "timestamp",
                "cost_time",
                "store_time",
                "msg_type",
                "queue_id",
                "queue_offset",
                _h(col("topic")).alias("topic_h"),
                _h(col("tags")).alias("tags_h"),
                _h(col("store_addr")).alias("store_h"),
                ((tt == "EndTransaction") & (col("transaction_state") == _TX_COMMIT))
                .cast("int")
                .alias("is_commit"),
                ((tt == "EndTransaction") & (col("transaction_state") == _TX_ROLLBACK))
                .cast("int")
                .alias("is_rollback"),
                ((tt == "Recall") & col("success")).cast("int").alias("is_recall"),
            )
            .repartition(n_parts, "pkey")
        )
        firsts = [
            "timestamp",
            "cost_time",
            "store_time",
            "msg_type",
            "queue_id",
            "queue_offset",
            "topic_h",
            "tags_h",
            "store_h",
        ]
        pubs = (
            prod.groupBy("pkey")
            .agg(
                F.min("o").alias("o"),
                *[F.min_by(c, "o").alias(c) for c in firsts],
                F.max("is_commit").alias("tx_commit"),
                F.max("is_rollback").alias("tx_rollback"),
                F.max("is_recall").alias("recalled"),
            )
            .where(col("o").isNotNull())
            .select(
                "pkey",
                col("timestamp").alias("pub_ts"),
                (F.shiftright(col("o"), 62) == 0).alias("pub_ok"),
                "topic_h",
                "tags_h",
                col("cost_time").alias("send_cost"),
                "store_time",
                "msg_type",
                "store_h",
                "queue_id",
                "queue_offset",
                "tx_commit",
                "tx_rollback",
                "recalled",
            )
        )
        pubs = pubs.withColumn(
            "in_window", (col("pub_ts") >= self.f_ms) & (col("pub_ts") < self.t_ms)
        ).withColumn(
            "expected_anywhere",
            col("pub_ok")
            & (col("recalled") == 0)
            & ((F.coalesce(col("msg_type"), F.lit(0)) != _MSG_HALF) | (col("tx_commit") == 1)),
        )
        pub_cols = [
            "pub_ts",
            "pub_ok",
            "topic_h",
            "tags_h",
            "send_cost",
            "store_time",
            "msg_type",
            "store_h",
            "queue_id",
            "queue_offset",
            "tx_commit",
            "tx_rollback",
            "recalled",
            "in_window",
        ]

        # ---- expected (message, group[, client]) rows ------------------------------------
        # subscription segments are disjoint per (group, topic): a message matches a group
        # through at most one row, so no deduplication is needed
        s = F.broadcast(self._subs_frame())
        cond = (
            (col("topic_h") == col("s_topic_h"))
            & (col("s_tag_h").isNull() | (col("s_tag_h") == col("tags_h")))
            & (col("s_start") <= col("pub_ts"))
            & (col("pub_ts") < col("s_end"))
            & col("expected_anywhere")
        )
        exp = (
            pubs.where(col("in_window"))
            .join(s, cond, "left")
            .join(
                F.broadcast(self._clients_frame()),
                (col("s_group_h") == col("c_group_h")) & (col("topic_h") == col("c_topic_h")),
                "left",
            )
            .select(
                "pkey",
                col("s_group_h").alias("group_h"),
                F.when(
                    F.coalesce(col("s_bcast"), F.lit(False)),
                    F.coalesce(col("c_client_h"), F.lit(0)),
                )
                .otherwise(F.lit(0))
                .cast("long")
                .alias("ck"),
                F.lit(True).alias("expected"),
                *[col(c).alias(f"e_{c}") for c in pub_cols],
            )
        )

        # ---- consume side: attempts (paired by requestId), then per (msg, group, client) --
        mid = F.when(col("msg_id") == "", F.lit(None)).otherwise(col("msg_id"))
        rid = F.coalesce(
            col("request_id"), F.concat(F.lit("\u0001"), F.coalesce(col("group_name"), F.lit("")))
        )
        before = tt == "SubBefore"
        moved = F.coalesce(dlq_move & col("success"), F.lit(False))
        cons = (
            ev.where(tt.isin("SubBefore", "SubAfter") | moved)
            .select(
                F.coalesce(mid, F.concat(F.lit("\u0000"), rid)).alias("pkey"),
                # a DLQ move is an "attempt" of its own (its rid), counted apart below
                F.xxhash64(
                    F.when(
                        moved,
                        F.concat(F.lit("\u0002dlq"), F.coalesce(col("group_name"), F.lit(""))),
                    ).otherwise(rid)
                ).alias("rid"),
                before.alias("b"),
                moved.alias("d"),
                _h(col("group_name")).alias("gh"),
                _h(F.when(col("client_host") != "", col("client_host"))).alias("ch"),
                F.when(before, _h(col("topic"))).alias("th"),
                "timestamp",
                "cost_time",
                "success",
                "retry_times",
            )
            .repartition(n_parts, "pkey")
        )
        b, a = col("b"), ~col("b") & ~col("d")
        ok_ts = F.when(a & col("success"), col("timestamp"))
        att = (
            cons.groupBy("pkey", "rid")
            .agg(
                F.max(F.when(b, col("gh"))).alias("gb"),
                F.max(F.when(~b, col("gh"))).alias("ga"),
                F.max(F.when(b, col("ch"))).alias("cb"),
                F.max(F.when(~b, col("ch"))).alias("ca"),
                F.max("th").alias("th"),
                F.max(b.cast("int")).alias("has_before"),
                F.max(a.cast("int")).alias("has_after"),
                F.min(F.when(b, col("timestamp"))).alias("before_ts"),
                F.max(F.when(b, col("retry_times"))).alias("retry"),
                F.max((a & col("success")).cast("int")).alias("ok"),
                F.max(col("d").cast("int")).alias("dlq"),
                F.min(ok_ts).alias("succ_ts"),
                F.min_by("cost_time", ok_ts).alias("succ_cost"),
                F.min(F.when(a, col("timestamp"))).alias("after_ts"),
                F.count(F.lit(1)).alias("n"),
            )
            .select(
                "*",
                F.coalesce(col("gb"), col("ga")).alias("group_h"),
                F.coalesce(col("cb"), col("ca")).alias("client_h"),
            )
        )
        bh = [self.scan.hash_of[g] for g in self.bgroups if g in self.scan.hash_of]
        is_bc = col("group_h").isin(bh) if bh else F.lit(False)
        att = att.withColumn(
            "ck",
            F.when(is_bc, F.coalesce(col("client_h"), F.lit(0))).otherwise(F.lit(0)).cast("long"),
        )
        done_ok = col("ok") == 1
        first_ok = F.when(done_ok, col("succ_ts"))
        agg = att.groupBy("pkey", "group_h", "ck").agg(
            F.sum(1 - col("dlq")).alias("attempts"),
            F.max("dlq").alias("dead_lettered"),
            F.sum("ok").alias("successes"),
            F.sum(((col("has_after") == 1) & ~done_ok).cast("int")).alias("failed_attempts"),
            F.sum(((col("has_before") == 1) & (col("has_after") == 0)).cast("int")).alias(
                "in_flight_attempts"
            ),
            F.max("retry").alias("max_retry_times"),
            # the highest delivery a traced failure belongs to (a SubAfter whose SubBefore was
            # lost: the first one)
            F.max(
                F.when((col("has_after") == 1) & ~done_ok, F.coalesce(col("retry"), F.lit(0)))
            ).alias("max_failed_retry"),
            F.min("before_ts").alias("first_before_ts"),
            F.min(F.least(col("before_ts"), col("after_ts"))).alias("first_consume_ts"),
            F.min(first_ok).alias("success_ts"),
            F.min_by("succ_cost", first_ok).alias("success_cost"),
            F.min_by(F.coalesce(col("retry"), F.lit(0)), first_ok).alias("success_retry"),
            F.max("th").alias("c_topic_h"),
            F.sum("n").alias("consume_events"),
        )
        # pub facts for consumes nobody expected (UNEXPECTED_GROUP / ORPHAN_CONSUME)
        agg = agg.join(
            pubs.select("pkey", *[col(c).alias(f"a_{c}") for c in pub_cols]).hint("shuffle_hash"),
            "pkey",
            "left",
        )

        # ---- meet: expected ⟗ consumed (co-partitioned by msgId: no shuffle) -------------
        j = exp.hint("shuffle_hash").join(agg, ["pkey", "group_h", "ck"], "full_outer")

        def pub(c: str) -> Column:
            return F.coalesce(col(f"e_{c}"), col(f"a_{c}"))

        expected = F.coalesce(col("expected"), F.lit(False)) & col("group_h").isNotNull()
        msg_level = F.coalesce(col("expected"), F.lit(False)) & col("group_h").isNull()
        has_consume = col("attempts").isNotNull()
        pub_ts = pub("pub_ts")
        msg_type = F.coalesce(pub("msg_type"), F.lit(0))
        due = pub_ts + F.when(
            msg_type == _MSG_DELAY, F.lit(max(p.max_delay_ms, p.horizon_ms))
        ).otherwise(p.horizon_ms)
        j = j.join(
            F.broadcast(self._offsets_frame()),
            (col("group_h") == col("o_group_h"))
            & (col("e_topic_h") == col("o_topic_h"))
            & (col("e_store_h") == col("o_store_h"))
            & (col("e_queue_id") == col("o_queue_id"))
            & (col("ck") == col("o_client_h")),
            "left",
        )
        j = self._with_deliveries(j)
        committed = col("o_committed")
        offset_applicable = ~msg_type.isin(_MSG_HALF, _MSG_DELAY)
        passed = offset_applicable & committed.isNotNull() & (committed > pub("queue_offset"))
        # The offsets' word on the message: its last delivery (the last retry copy, else the
        # original queue) is behind the group's committed offset — the listener returned and
        # nothing was sent back after it — and no dead-letter copy exists. Traces can be lost
        # in part (a SubAfter, a retry's records); offsets cannot, so they overrule a trace
        # that says FAILED or IN_FLIGHT. A traced failure of that last delivery (or a later
        # one) keeps the message unconsumed: it went back once more.
        has_copy = col("retry_reconsume").isNotNull()
        in_dlq = col("dlq_queue_offset").isNotNull()
        last_passed = F.when(
            has_copy, F.coalesce(col("retry_committed") > col("retry_queue_offset"), F.lit(False))
        ).otherwise(passed)
        offsets_consumed = last_passed & ~in_dlq
        failed_last = F.coalesce(
            col("max_failed_retry") >= F.coalesce(col("retry_reconsume"), F.lit(0)), F.lit(False)
        )
        dead_traced = (col("dead_lettered") == 1) | (
            col("max_retry_times") >= p.max_reconsume_times
        )
        after_retry = (col("attempts") > 1) | (col("success_retry") > 0)
        first_ts = col("first_consume_ts")
        real_id = ~col("pkey").startswith("\u0000")
        created = _msg_id_created(col("pkey"), first_ts, p.msgid_timezone)
        orphan_ok = (
            (first_ts >= self.f_ms)
            & (first_ts < self.t_ms)
            & (~real_id | created.isNull() | (created >= self.read_lo))
        )
        is_half = msg_type == _MSG_HALF
        outcome = (
            F.when(msg_level & ~pub("pub_ok"), F.lit("PUB_FAILED"))
            .when(msg_level & (pub("recalled") == 1), F.lit("RECALLED"))
            .when(
                msg_level & is_half & (pub("tx_rollback") == 1) & (pub("tx_commit") == 0),
                F.lit("ROLLED_BACK"),
            )
            .when(msg_level & is_half & (pub("tx_commit") == 0), F.lit("TX_UNRESOLVED"))
            .when(msg_level, F.lit("NO_EXPECTED_GROUP"))
            .when(expected & has_consume & (col("successes") > 1), F.lit("DUPLICATE"))
            .when(
                expected & has_consume & (col("successes") == 1) & after_retry,
                F.lit("CONSUMED_AFTER_RETRY"),
            )
            .when(expected & has_consume & (col("successes") == 1), F.lit("CONSUMED"))
            .when(expected & in_dlq, F.lit("DEAD_LETTERED"))
            .when(
                expected
                & has_consume
                & offsets_consumed
                & ~F.coalesce(dead_traced, F.lit(False))
                & ~failed_last,
                F.lit("TRACE_INCOMPLETE"),
            )
            .when(expected & has_consume & (col("in_flight_attempts") > 0), F.lit("IN_FLIGHT"))
            .when(expected & has_consume & dead_traced, F.lit("DEAD_LETTERED"))
            .when(expected & has_consume, F.lit("FAILED"))
            # consumed by the offsets, no trace (so far): even inside the horizon it is not
            # "pending" — the trace is what is missing
            .when(expected & offsets_consumed, F.lit("TRACE_LOST"))
            .when(expected & (due > self.cutoff), F.lit("PENDING"))
            .when(expected, F.lit("NOT_CONSUMED"))
            # consumes nobody expected
            .when(
                col("a_pub_ts").isNotNull(),
                F.when(col("a_pub_ok") & col("a_in_window"), F.lit("UNEXPECTED_GROUP")),
            )
            .when(orphan_ok, F.lit("ORPHAN_CONSUME"))
        )
        # the rows that get an outcome (the same as "outcome is not null", but cheap: the
        # optimizer would otherwise evaluate the whole CASE twice)
        keep = (
            F.coalesce(col("expected"), F.lit(False))
            | (col("a_pub_ts").isNotNull() & col("a_pub_ok") & col("a_in_window"))
            | (col("a_pub_ts").isNull() & orphan_ok)
        )
        store_ref = F.when(pub("store_time") > 0, pub("store_time")).otherwise(
            pub_ts + pub("send_cost")
        )
        event_ts = F.when(pub_ts.isNotNull(), pub_ts).otherwise(first_ts)
        window_start = F.floor(event_ts / p.window_ms).cast("long") * p.window_ms
        keep_id = F.lit(True) if p.keep_classified else col("outcome") != "CONSUMED"
        df = (
            j.where(keep)
            .select(
                outcome.alias("outcome"),
                "pkey",
                real_id.alias("real_id"),
                window_start.alias("window_start_ms"),
                F.coalesce(pub("topic_h"), col("c_topic_h")).alias("topic_h"),
                "group_h",
                F.when(col("ck") != 0, col("ck")).alias("client_h"),
                pub_ts.alias("pub_ts"),
                pub("msg_type").alias("msg_type"),
                # (kept so that both uses of the Pub shuffle read the same columns: reused)
                pub("tags_h").alias("tags_h"),
                pub("store_h").alias("store_h"),
                pub("queue_id").alias("queue_id"),
                pub("queue_offset").alias("queue_offset"),
                committed.alias("committed_offset"),
                "retry_reconsume",
                "retry_queue_offset",
                "retry_committed",
                "dlq_queue_offset",
                due.alias("due_ts"),
                F.coalesce(col("attempts"), F.lit(0)).alias("attempts"),
                F.coalesce(col("successes"), F.lit(0)).alias("successes"),
                F.coalesce(col("failed_attempts"), F.lit(0)).alias("failed_attempts"),
                F.coalesce(col("in_flight_attempts"), F.lit(0)).alias("in_flight_attempts"),
                "max_retry_times",
                "max_failed_retry",
                F.coalesce(col("consume_events"), F.lit(0)).alias("consume_events"),
                first_ts.alias("first_consume_ts"),
                "success_ts",
                pub("send_cost").alias("send_cost_ms"),
                (col("first_before_ts") - store_ref).alias("store_to_consume_ms"),
                col("success_cost").alias("consume_cost_ms"),
                (col("success_ts") - pub_ts).alias("end_to_end_ms"),
            )
            .withColumn("msg_id", F.when(col("real_id") & keep_id, col("pkey")))
            .drop("pkey", "real_id")
        )
        if p.keep_classified:
            return df
        # CONSUMED rows (most of them) only feed the tally: their evidence columns are left
        # null, which Parquet stores for next to nothing
        tallied = {"outcome", "window_start_ms", "topic_h", "group_h", *METRICS}
        return df.select(
            *[col(c) if c in tallied else F.when(keep_id, col(c)).alias(c) for c in df.columns]
        )

    def _with_deliveries(self, j: DataFrame) -> DataFrame:
        """``j`` with the last retry copy and dead-letter copy of each (message, group) from
        the snapshot (broadcast: retried messages are few); null columns when none is known."""
        names = ["retry_reconsume", "retry_queue_offset", "retry_committed", "dlq_queue_offset"]
        if not self.deliveries:
            return j.select(
                "*",
                F.lit(None).cast("int").alias("retry_reconsume"),
                *[F.lit(None).cast("long").alias(n) for n in names[1:]],
            )
        import pyarrow as pa
        import pyarrow.parquet as pq

        # through a Parquet file, not createDataFrame: a million rows cross py4j in a second
        # that way, instead of minutes
        cols = list(zip(*self.deliveries, strict=True))
        table = pa.table(
            {
                "d_pkey": pa.array(cols[0], pa.string()),
                "group": pa.array(cols[1], pa.string()),
                "retry_reconsume": pa.array(cols[2], pa.int32()),
                **{n: pa.array(cols[i + 3], pa.int64()) for i, n in enumerate(names[1:])},
            }
        )
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf)
        target = self.stage.path("_deliveries")  # (a file named "_…" Spark would skip)
        self.fs.write_bytes(f"{target}/deliveries.parquet", buf.getvalue().to_pybytes())
        d = self.spark.read.parquet(target).select(
            "d_pkey", _h(F.col("group")).alias("d_group_h"), *names
        )
        c = F.col
        return j.join(
            F.broadcast(d),
            (c("pkey") == c("d_pkey")) & (c("group_h") == c("d_group_h")),
            "left",
        ).drop("d_pkey", "d_group_h")

    def _subs_frame(self) -> DataFrame:
        schema = T.StructType(
            [
                T.StructField("group", T.StringType()),
                T.StructField("topic", T.StringType()),
                T.StructField("s_start", T.LongType()),
                T.StructField("s_end", T.LongType()),
                T.StructField("tag", T.StringType()),
                T.StructField("s_bcast", T.BooleanType()),
            ]
        )
        rows = subscription_segments(self.subs, self.p.subscription_grace_ms)
        return self.spark.createDataFrame(rows, schema).select(
            _h(F.col("group")).alias("s_group_h"),
            _h(F.col("topic")).alias("s_topic_h"),
            _h(F.col("tag")).alias("s_tag_h"),
            "s_start",
            "s_end",
            "s_bcast",
        )

    def _offsets_frame(self) -> DataFrame:
        schema = T.StructType(
            [
                T.StructField("group", T.StringType()),
                T.StructField("topic", T.StringType()),
                T.StructField("store_addr", T.StringType()),
                T.StructField("o_queue_id", T.IntegerType()),
                T.StructField("client", T.StringType()),
                T.StructField("o_committed", T.LongType()),
            ]
        )
        rows = [
            (o.group, o.topic, o.store_addr, o.queue_id, o.client, o.committed)
            for o in self.offsets
        ]
        c = F.col
        return self.spark.createDataFrame(rows, schema).select(
            _h(c("group")).alias("o_group_h"),
            _h(c("topic")).alias("o_topic_h"),
            _h(c("store_addr")).alias("o_store_h"),
            "o_queue_id",
            F.coalesce(_h(F.when(c("client") != "", c("client"))), F.lit(0))
            .cast("long")
            .alias("o_client_h"),
            "o_committed",
        )

    def _clients_frame(self) -> DataFrame:
        """Consuming clients of broadcasting groups: (group, topic, client host), hashed."""
        schema = T.StructType(
            [
                T.StructField("group", T.StringType()),
                T.StructField("topic", T.StringType()),
                T.StructField("client", T.StringType()),
            ]
        )
        c = F.col
        return self.spark.createDataFrame(self.scan.broadcast_clients, schema).select(
            _h(c("group")).alias("c_group_h"),
            _h(c("topic")).alias("c_topic_h"),
            F.coalesce(_h(F.when(c("client") != "", c("client"))), F.lit(0))
            .cast("long")
            .alias("c_client_h"),
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


def _zone_month_start(ts_ms: Column, zone: str) -> Column:
    """Epoch ms of local midnight on the 1st of the month (in ``zone``) containing ``ts_ms``.

    Independent of the session time zone: from_utc_timestamp gives the zone's wall clock as
    if it were UTC, the month is truncated on that, and to_utc_timestamp turns the wall clock
    back into an instant. A midnight skipped by a DST gap gets the offset before the change
    and a repeated one its first occurrence (java.time's rule), as ``zoneinfo`` with fold=0
    and Java's lenient Calendar."""
    wall = F.unix_millis(F.from_utc_timestamp(F.timestamp_millis(ts_ms), zone))
    first = F.trunc(F.date_from_unix_date(F.floor(wall / DAY_MS).cast("int")), "month")
    first_wall = F.timestamp_millis(F.unix_date(first).cast("long") * DAY_MS)
    return F.unix_millis(F.to_utc_timestamp(first_wall, zone))


def _msg_id_created(msg_id: Column, ref_ts: Column, zone: str = "UTC") -> Column:
    """Epoch ms a RocketMQ msgId was created at, read at ``ref_ts`` with the producer's
    ``zone``; null if it is not 32 or 56 hex digits (56: an IPv6 client address).

    The same rule as ``tracemq.message_id.msg_id_created_ms`` (the tests compare the two): the
    id's time field is ms since the start of a month in ``zone``; the month is the one of
    ``ref_ts``, or the one before if that would put the creation more than a day after
    ``ref_ts`` (a day of clock skew allowed)."""
    valid = msg_id.rlike("^([0-9A-Fa-f]{32}|[0-9A-Fa-f]{56})$")
    # the time field is the 8 hex digits before the 4-digit counter, whatever the address size
    offset = F.conv(F.substring(msg_id, -12, 8), 16, 10).cast("long")
    month = _zone_month_start(ref_ts, zone)
    prev = _zone_month_start(month - 1, zone)
    created = F.when(month + offset > ref_ts + DAY_MS, prev + offset).otherwise(month + offset)
    return F.when(valid, created)


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


def _h(c: Column) -> Column:
    """xxhash64 of a string column; null stays null."""
    return F.when(c.isNotNull(), F.xxhash64(c))


def subscription_segments(
    subs: list[SubRow], grace_ms: int
) -> list[tuple[str, str, int, int, str | None, bool]]:
    """Subscription rows as disjoint time segments per (group, topic):
    (group, topic, start, end, tag or None for every tag, broadcasting), end exclusive.

    A row covers ``[first_seen, last_seen + grace]``. Where rows of one (group, topic)
    overlap, the segment accepts the union of their tags (every tag if one is ``*``), so a
    message matches a group through at most one segment row.
    """
    by_key: dict[tuple[str, str], list[SubRow]] = {}
    for s in subs:
        by_key.setdefault((s.group, s.topic), []).append(s)
    out: list[tuple[str, str, int, int, str | None, bool]] = []
    for (group, topic), rows in sorted(by_key.items()):
        bcast = any(r.broadcasting for r in rows)
        spans = [(r.first_seen, r.last_seen + grace_ms + 1, r.tag) for r in rows]
        cuts = sorted({x for a, b, _ in spans for x in (a, b)})
        segments: list[tuple[int, int, frozenset[str] | None]] = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            cover = [t for a, b, t in spans if a <= lo and b >= hi]
            if not cover:
                continue
            tags = (
                None
                if any(t is None for t in cover)
                else frozenset(t for t in cover if t is not None)
            )
            if segments and segments[-1][1] == lo and segments[-1][2] == tags:
                segments[-1] = (segments[-1][0], hi, tags)
            else:
                segments.append((lo, hi, tags))
        for lo, hi, tags in segments:
            if tags is None:
                out.append((group, topic, lo, hi, None, bcast))
            else:
                out.extend((group, topic, lo, hi, t, bcast) for t in sorted(tags))
    return out


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
