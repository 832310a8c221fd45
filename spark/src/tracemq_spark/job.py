"""The reconciliation job: send traces against consume traces over the Parquet trace lake.

Pure PySpark (DataFrame API, no Python UDFs); it imports nothing of tracemq but the lake schema.
:func:`run` is the whole job; the CLI (``tracemq reconcile``) and ``submit.py`` (spark-submit)
only parse arguments, build the session and call it.

Where things live — :func:`run` orchestrates the stages, one module each (this module keeps
the run's state, ``_Context``, and re-exports the public names callers import from it):

* :mod:`~tracemq_spark.params` — :class:`Params`, the constants, :class:`ReconcileError`;
* :mod:`~tracemq_spark.session` — :func:`build_session` (and :func:`stop_session`), the runtime
  settings, the lake schema;
* :mod:`~tracemq_spark.class_archive` — the driver JVM's class-data archive (its start);
* :mod:`~tracemq_spark.input_files` — the subscription and offsets files, parsed
  (:mod:`~tracemq_spark.snapshot`: the offsets file read by the JVM, when it can);
* :mod:`~tracemq_spark.lake_scan` — the lake files of the read range, the pre-flight scan;
* :mod:`~tracemq_spark.classify` — the classification, one pure ``DataFrame -> DataFrame``
  function per step (pubs, expected deliveries, attempts, consumed, meet);
* :mod:`~tracemq_spark.outputs` — anomalies, summary (and classified) datasets, summary.json,
  the report;
* :mod:`~tracemq_spark.commit` — staging and the atomic per-window commit.

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

import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from tracemq_spark import classify, cogroup, outputs, snapshot
from tracemq_spark.commit import Staging, checkpoint, cleanup, commit, validate_staging
from tracemq_spark.input_files import (
    DeliveryRow,
    OffsetRow,
    gc_paused,
    last_deliveries,
    load_json,
    parse_copies,
    parse_offsets,
    parse_subscriptions,
)
from tracemq_spark.lake_scan import LakeScan, _maybe_corrupt
from tracemq_spark.params import (
    INFORMATIONAL,
    KNOWN_SCHEMA_VERSIONS,
    METRICS,
    MINUTE_MS,
    OUTCOMES,
    SKEW_LIMIT_MS,
    Params,
    ReconcileError,
    RunResult,
    _iso,
)
from tracemq_spark.session import _RUNTIME_CONF, CLASSIFY_CONF, build_session, stop_session

__all__ = [
    "INFORMATIONAL",
    "KNOWN_SCHEMA_VERSIONS",
    "METRICS",
    "OUTCOMES",
    "Params",
    "ReconcileError",
    "RunResult",
    "SKEW_LIMIT_MS",
    "build_session",
    "last_deliveries",
    "parse_copies",
    "parse_offsets",
    "parse_subscriptions",
    "run",
    "stop_session",
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

    ctx: _Context | None = None
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
    finally:
        if ctx is not None:
            ctx.close()
    cleanup(fs, stage, out, True)
    elapsed = time.monotonic() - t_start
    summary["run"]["elapsed_s"] = round(elapsed, 3)
    summary["run"]["stages_s"] = stages
    return RunResult(run_id, out, f_ms, t_ms, summary, elapsed, stages)


class _Context:
    """One run's state: its range, inputs and lake scan, handed from stage to stage."""

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
        #: the co-group's count of the classified rows (:func:`cogroup.new_tally`), once
        #: :meth:`classify` wrote them through the JVM path; None: the tally reads them back
        self.jvm_tally: object | None = None
        # (two: the snapshot's parse, and the msgId ranges' plan beside it — ranges_planned)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reconcile-inputs")
        #: (shuffle partitions, the plan of :func:`cogroup.plan_ranges`), begun at discovery
        self._ranges: tuple[int, Future[list[str] | None]] | None = None
        #: the JVM snapshot's last deliveries, staged in the inputs' pool (None: not needed)
        self._deliveries_staged: Future[None] | None = None

    # -- inputs -----------------------------------------------------------------------
    def load_inputs(self) -> None:
        """Read the subscriptions; start parsing the offsets snapshot in a thread of its own
        (pure Python, 650 MB at 10M messages: it overlaps the JVM's lake listing and
        pre-flight scan, which need only its committed offsets, at the end — see
        :meth:`offsets_parsed`); stage copies of both files."""
        fs, st = self.fs, self.stage
        for name, uri in (("subscriptions", self.p.subscriptions), ("offsets", self.p.offsets)):
            if not fs.exists(uri):
                raise ReconcileError(f"{name} file not found: {uri}")
        self.subs = parse_subscriptions(fs.read_text(self.p.subscriptions), self.p.subscriptions)
        self._jvm_snapshot = cogroup.available(self.spark)
        self._offsets_job = self._pool.submit(self._parse_offsets_file)
        for name in ("subscriptions", "offsets"):
            target = st.path("inputs", f"{name}.json")
            if fs.qualify(target) != fs.qualify(getattr(self.p, name)):
                fs.copy(getattr(self.p, name), target)
        self.bgroups = sorted({s.group for s in self.subs if s.broadcasting})
        self.say(f"{len(self.subs)} subscription rows ({len(self.bgroups)} broadcasting groups)")

    def _parse_offsets_file(
        self,
    ) -> tuple[list[OffsetRow], list[DeliveryRow] | snapshot.JvmSnapshot, int]:
        """(committed offsets, last deliveries, retry/dead-letter copies) of the snapshot:
        read by the JVM (:mod:`tracemq_spark.snapshot`) when the session has the job's jar
        and the file is of the exporter's shape, else parsed here."""
        if self._jvm_snapshot:
            snap, why = snapshot.read(self.spark, self.p.offsets)
            if snap is not None:
                # (the last deliveries are staged once discovery planned the ranges:
                # _stage_deliveries)
                return snap.offsets, snap, snap.n_copies
            self.say(f"offsets snapshot: parsed in Python ({why})")
        text = self.fs.read_text(self.p.offsets)
        with gc_paused():  # (parsed once: 650 MB at 10M messages, see gc_paused)
            doc = load_json(text, self.p.offsets)
            del text
            offsets = parse_offsets(doc, self.p.offsets)
            copies = parse_copies(doc, self.p.offsets)
            del doc
            return offsets, last_deliveries(copies, offsets), len(copies)

    def offsets_parsed(self) -> list[OffsetRow]:
        """The committed offsets, once the snapshot's thread is done (its ReconcileError, if
        any, raised here); sets ``offsets`` and ``deliveries``."""
        if not hasattr(self, "offsets"):
            self.offsets, self.deliveries, n_copies = self._offsets_job.result()
            self.say(f"{len(self.offsets)} committed offsets, {n_copies} retry/dead-letter copies")
        return self.offsets

    def close(self) -> None:
        """Let go of the inputs thread (a failed run does not wait for its parse)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the lake ---------------------------------------------------------------------
    def discover(self) -> None:
        self.scan.discover()
        if cogroup.available(self.spark):
            # the co-group's msgId ranges, from the files' footers, planned beside the
            # pre-flight: planned when the classification asked, they held it up ~0.8 s at
            # 10M messages (31 footers read again), with no task running
            n = self._n_parts()
            self._ranges = (
                n,
                self._pool.submit(cogroup.plan_ranges, self.spark, self.scan.files, n),
            )
            self._deliveries_staged = self._pool.submit(self._stage_deliveries)

    def _stage_deliveries(self) -> None:
        """The JVM snapshot's last deliveries staged as the classification will read them,
        in the inputs' pool while the pre-flight runs: split by the planned msgId ranges
        (``JvmSnapshot.split``), or else written as a Parquet file (``JvmSnapshot.write``).
        Done when the classification asked, it held up the driver between the scan and the
        classification (~1.5 – 2 s at 10M messages, one core idle); done before the offsets
        were handed over, it held up the pre-flight (~3 – 5 s)."""
        _, deliveries, _ = self._offsets_job.result()
        if not isinstance(deliveries, snapshot.JvmSnapshot):
            return
        bounds = self._ranges[1].result() if self._ranges is not None else None
        if bounds:
            deliveries.split(bounds)
        else:
            deliveries.write(self.stage.path("_deliveries"))

    def _n_parts(self) -> int:
        return int(self.spark.conf.get("spark.sql.shuffle.partitions") or 16)

    def ranges_planned(self, n_parts: int) -> list[str] | None:
        """:func:`cogroup.plan_ranges` of the run's files, as planned at discovery."""
        if self._ranges is not None and self._ranges[0] == n_parts:
            return self._ranges[1].result()
        return cogroup.plan_ranges(self.spark, self.scan.files, n_parts)

    def preflight(self) -> None:
        self.scan.preflight(self.subs, self.offsets_parsed, self.bgroups)

    # -- classification ---------------------------------------------------------------
    def classify(self) -> None:
        """One row per (message, group[, client]) with its outcome and evidence, written to
        ``<staging>/_classified`` (strings still hashed; CONSUMED rows and the informational
        outcomes' included but on the JVM path without ``--keep-classified``, which only
        counts them: :attr:`jvm_tally`)."""
        conf = self.spark.conf
        saved = {k: conf.get(k, None) for k in CLASSIFY_CONF}
        try:
            for k, v in CLASSIFY_CONF.items():
                conf.set(k, v)
            # (the JVM path runs its shuffle's map side here already)
            df = self.classified_frame(tally=True)
            # an intermediate read twice from local disk and deleted at the end: written fast
            # (no compression, no dictionary pages) rather than small
            df.write.mode("overwrite").option("compression", "none").option(
                "parquet.enable.dictionary", "false"
            ).parquet(self.stage.path("_classified"))
        except Exception as exc:
            raise _maybe_corrupt(exc, self.scan.files) from None
        finally:
            for k, old in saved.items():
                if old is None:
                    conf.unset(k)
                else:
                    conf.set(k, old)

    def classified_frame(self, jvm: bool | None = None, *, tally: bool = False) -> DataFrame:
        """The classification's steps (:mod:`tracemq_spark.classify`) over this run's lake
        read and inputs: through the JVM code's co-group by msgId
        (:mod:`tracemq_spark.cogroup`) when the session has it (``jvm``: None), else the
        DataFrame steps — the same rows. ``tally``: the JVM path also counts the rows it
        emits into :attr:`jvm_tally` (the frame must then be computed once)."""
        spark, p = self.spark, self.p
        n_parts = self._n_parts()
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
            "keys",
            "client_host",
            "store_time",
            "retry_times",
            "msg_type",
            "transaction_state",
            "store_addr",
            "queue_id",
            "queue_offset",
        )
        if jvm is None:
            jvm = cogroup.available(spark)
        bounds = self.ranges_planned(n_parts) if jvm else None
        # the lake's side split by msgId range in the inputs' pool (16 plans, ~3.7 s of the
        # driver's CPU at 10M messages), while this thread makes the small frames, takes the
        # staged deliveries and collects the look-ups (three small jobs)
        events_split = (
            self._pool.submit(
                lambda: cogroup.split(spark, classify.event_side(ev, base=self.read_lo), bounds)
            )
            if bounds
            else None
        )
        subs = classify.subs_frame(spark, self.subs, p.subscription_grace_ms)
        clients = classify.clients_frame(spark, self.scan.broadcast_clients)
        offsets = classify.offsets_frame(spark, self.offsets)
        bh = [self.scan.hash_of[g] for g in self.bgroups if g in self.scan.hash_of]
        if self._deliveries_staged is not None:
            self._deliveries_staged.result()
        # the snapshot's deliveries split by range already (_stage_deliveries), or a frame
        d_ranges = (
            self.deliveries.ranges(bounds)
            if bounds and isinstance(self.deliveries, snapshot.JvmSnapshot)
            else None
        )
        d_path = self.stage.path("_deliveries")
        deliveries = (
            None
            if d_ranges is not None
            else self.deliveries.frame(d_path)
            if isinstance(self.deliveries, snapshot.JvmSnapshot)
            else classify.deliveries_frame(spark, self.fs, d_path, self.deliveries)
        )
        kw = {"f_ms": self.f_ms, "t_ms": self.t_ms, "read_lo": self.read_lo, "cutoff": self.cutoff}
        self.say(
            "classification: DataFrame steps"
            if not jvm
            else "classification: co-group by msgId (JVM code), "
            + (
                f"{len(bounds) + 1} msgId ranges of the sorted files, no shuffle"
                if bounds
                else "shuffled by the msgId's hash"
            )
        )
        # every timestamp read is >= read_lo: (ts - base) fits 62 bits
        if jvm:
            inp: DataFrame | cogroup.RangeSplit
            if events_split is not None and bounds:
                if deliveries is not None:
                    d_ranges = cogroup.ranges(
                        spark, cogroup.split(spark, classify.delivery_side(deliveries), bounds)
                    )
                looked_up = cogroup.lookups(spark, subs, clients, offsets)
                inp = cogroup.RangeSplit(events_split.result(), d_ranges, len(bounds) + 1)
            else:
                looked_up = None
                inp = classify.cogroup_input(ev, deliveries, base=self.read_lo, n_parts=n_parts)
            self.jvm_tally = cogroup.new_tally(spark) if tally else None
            return cogroup.classified(
                spark,
                inp,
                subs,
                clients,
                offsets,
                bh,
                p,
                classify.classified_schema(p.keep_classified),
                tally=self.jvm_tally,
                by_creation=True,
                looked_up=looked_up,
                **kw,
            )
        pubs = classify.pubs(ev, f_ms=self.f_ms, t_ms=self.t_ms, base=self.read_lo, n_parts=n_parts)
        exp = classify.expected_deliveries(pubs, subs, clients)
        att = classify.attempts(ev, bh=bh, n_parts=n_parts)
        agg = classify.consumed(att, pubs, deliveries)
        return classify.meet(exp, agg, offsets, deliveries, p, **kw)

    # -- outputs (tracemq_spark.outputs) ----------------------------------------------
    def publish_tables(self) -> None:
        outputs.publish_tables(self)

    def summarize(self, stages: dict[str, float]) -> dict[str, Any]:
        return outputs.summarize(self, stages)

    def report(self, summary: dict[str, Any]) -> None:
        outputs.report(self.fs, self.stage, summary)
