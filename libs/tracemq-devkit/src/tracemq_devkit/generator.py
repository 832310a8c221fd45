"""A synthetic trace lake with known ground truth, for the exactness tests and the benchmark.

Vectorized with numpy and pyarrow: 10 million messages (about 45 million trace events) are
generated in chunks of ``chunk_messages`` messages, each written as its own Parquet files into
the lake's ``date=YYYY-MM-DD/hour=HH`` directories, in the lake schema of
:mod:`tracemq.lake`.

The world it simulates (see :func:`topology`):

* topics ``TopicA`` (tags TagA/TagB/TagC), ``TopicB`` (no tag or ``x``), ``TopicC`` (TagX/TagY/
  TagZ) on two brokers with four queues each; two producers, one with a clock 0.4 s ahead;
* consumer groups: ``G_all_A`` (``*``), ``G_tag_A`` (``TagA || TagB``: tag filter),
  ``G_late_A`` (subscribes in the middle of the window), ``G_all_B``, ``G_bcast_B``
  (broadcasting, three clients, one 3 s ahead), ``G_chg_C`` (changes its expression from TagX to
  TagY in the middle of the window), ``G_silent_C`` (broadcasting, ``TagZ``, never consumes) and
  ``G_rogue`` (no subscription at all, consumes now and then: UNEXPECTED_GROUP); one consumer
  host of ``G_all_A`` runs 8 s behind (clock skew);
* messages: normal, ordered, delayed (RocketMQ's delay levels up to ``max_delay``; some
  recalled, some with a recall refused as too late: classified as if never recalled), transactional (committed, rolled back, unresolved), failed sends, send retries;
* per (message, expected group[, broadcasting client]) a behaviour: consumed, consumed after
  retries, failed, dead-lettered (17 failed attempts), in flight, consumed twice, consumed with
  its trace records written two or three times (a trace send retried), consumed with an
  old-format SubAfter (no group), no trace but committed offset passed, not consumed, consumed
  late inside / past the horizon; and partial trace loss: consumed but the SubAfter lost (the
  committed offset passed), consumed after retries but the successful retry's records lost in
  whole or in part (its retry copy's committed offset passed);
* each retry of a clustering group is a copy in ``%RETRY%<group>`` (queue 0 of the message's
  broker) and each dead letter one in ``%DLQ%<group>``: the snapshot's ``copies``, with the
  retry queues' committed offsets (held back by a retry in flight);
* some Pubs written two or three times (a trace send retried);
* orphan consumes (msgIds without Pub, also empty and null msgIds), consumes of messages
  published before the window (in the look-back, and long before), messages published after
  the window.

Where things live: the simulated world's constants, behaviours and groups in
:mod:`~tracemq_devkit.gen_world`; the columnar id/string/table builders in
:mod:`~tracemq_devkit.gen_columns`; the consume-side records (attempts, orphans) in
:mod:`~tracemq_devkit.gen_consume`; the ground truth per chunk in
:mod:`~tracemq_devkit.gen_truth`; here the scenario and the chunked generation (``_Gen``: Pubs,
expected pairs, retry copies, committed offsets).

The ground truth (:attr:`GeneratedLake.truth`) is the outcome the reconciliation must find for
each (window, msgId, group, client) — what each behaviour means, given which events fall inside
the job's read range ``[from - horizon, to + horizon)``, the committed offsets and the cutoff.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tracemq import lake as tlake

from tracemq_devkit.gen_columns import (
    _COLS,
    _frame,
    _keys,
    _offset_msg_ids,
    _take,
    msg_ids,
)
from tracemq_devkit.gen_consume import attempt_events, orphans
from tracemq_devkit.gen_truth import record_truth
from tracemq_devkit.gen_world import (
    _BEHAVIOUR_P,
    _BLOCKERS,
    _RETRYING,
    BROKERS,
    DAY,
    DELAY_LEVELS_MS,
    DLQ,
    DUPLICATE,
    FAILED,
    HOUR,
    IN_FLIGHT,
    LATE_IN,
    LATE_PAST,
    MIN,
    NOT_CONSUMED,
    OK,
    PRODUCERS,
    QUEUES,
    REGION,
    RETRY_LOST,
    RETRY_OK,
    SEC,
    TAG_P,
    TAGS,
    TOPICS,
    TRACE_LOST,
    TRACE_PARTITIONS,
    TRACE_TOPIC,
    Group,
    _tag_matches,
    subscription_rows,
    topology,
)

# ----------------------------------------------------------------------------- generation


@dataclass
class GeneratedLake:
    """What :func:`generate` wrote and what the reconciliation must find."""

    lake: Path
    subscriptions: list[dict[str, Any]]
    offsets: list[dict[str, Any]]
    #: the retry / dead-letter copies of the offsets snapshot (``copies``)
    copies: list[dict[str, Any]]
    #: window_start, msg_id, group, client_host, outcome, skew_suspect (None without truth)
    truth: pa.Table | None
    #: ROLLED_BACK, TX_UNRESOLVED, RECALLED, NO_EXPECTED_GROUP counts of window messages
    informational: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    events: int = 0
    files: int = 0

    def write_inputs(self, directory: Path) -> tuple[Path, Path]:
        """Write ``subscriptions.json`` and ``offsets.json`` for the job into ``directory``."""
        import json

        directory.mkdir(parents=True, exist_ok=True)
        subs = directory / "subscriptions.json"
        offs = directory / "offsets.json"
        subs.write_text(json.dumps({"subscriptions": self.subscriptions}, indent=1))
        offs.write_text(json.dumps({"offsets": self.offsets, "copies": self.copies}, indent=1))
        return subs, offs


@dataclass(frozen=True)
class Scenario:
    start_ms: int
    end_ms: int
    messages: int
    horizon_ms: int = 30 * MIN
    window_ms: int = 10 * MIN
    max_delay_ms: int = 2 * HOUR
    max_reconsume_times: int = 16
    subscription_grace_ms: int = 2 * MIN
    #: the job's "now"; the cutoff is min(end + horizon, now). None: long after the window.
    now_ms: int | None = None
    seed: int = 7
    #: density of messages published in the look-back and after the window, relative to the
    #: window's (they produce events in the read range but are not classified)
    surrounding_density: float = 0.25
    #: fraction of window messages with extra orphan / ancient / null-id consumes
    orphan_rate: float = 0.005
    #: share of messages per topic (TopicA, TopicB, TopicC); TopicA has 2-3 consuming groups,
    #: TopicB four consumers, TopicC about one
    topic_weights: tuple[float, float, float] = (0.55, 0.12, 0.33)
    #: the zone of the msgIds of consumes without a Pub (orphans, ancient messages): the job
    #: reads those in one zone, its ``msgid_timezone``, which must be this one
    msgid_zone: str = "UTC"

    @property
    def cutoff_ms(self) -> int:
        end = self.end_ms + self.horizon_ms
        return end if self.now_ms is None else min(end, self.now_ms)

    @property
    def read_lo(self) -> int:
        return self.start_ms - self.horizon_ms

    @property
    def read_hi(self) -> int:
        return self.end_ms + self.horizon_ms


class _Writer:
    """Writes event tables into the lake's hour directories, one file per chunk and hour, as
    the collector writes its files: rows sorted by :data:`tracemq.lake.FILE_SORT_KEYS` (the
    msgId first) in row groups of :data:`tracemq.lake.ROW_GROUP_ROWS`."""

    def __init__(
        self, lake: Path, rows_per_group: int = tlake.ROW_GROUP_ROWS, *, summaries: bool = True
    ) -> None:
        self.lake = lake
        self.rows_per_group = rows_per_group
        self.summaries = summaries
        self.files = 0
        self.events = 0
        self.trace_offset = np.zeros(TRACE_PARTITIONS, dtype=np.int64)

    def write(self, table: pa.Table, chunk: int, rng: np.random.Generator) -> None:
        n = table.num_rows
        if n == 0:
            return
        ts = table.column("timestamp").to_numpy()
        order = np.argsort(ts, kind="stable")
        table = table.take(pa.array(order))
        ts = ts[order]
        part = rng.integers(0, TRACE_PARTITIONS, n).astype(np.int32)
        offsets = np.empty(n, dtype=np.int64)
        for p in range(TRACE_PARTITIONS):
            sel = part == p
            k = int(sel.sum())
            offsets[sel] = self.trace_offset[p] + np.arange(k)
            self.trace_offset[p] += k
        table = table.set_column(
            _COLS.index("trace_partition"), "trace_partition", pa.array(part, type=pa.int32())
        )
        table = table.set_column(_COLS.index("trace_offset"), "trace_offset", pa.array(offsets))
        table = table.set_column(
            _COLS.index("ingest_ts"), "ingest_ts", pa.array(ts + rng.integers(5, 900, n))
        )
        hours = ts // HOUR
        bounds = np.flatnonzero(np.diff(hours)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [n]])
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            hour = int(hours[s])
            day = _dt.date(1970, 1, 1) + _dt.timedelta(days=hour // 24)
            d = self.lake / f"date={day.isoformat()}" / f"hour={hour % 24:02d}"
            d.mkdir(parents=True, exist_ok=True)
            piece = table.slice(s, e - s)
            piece = piece.take(
                pc.sort_indices(piece, sort_keys=[(k, "ascending") for k in tlake.FILE_SORT_KEYS])
            )
            name = f"part-{TRACE_TOPIC}-c{chunk:04d}-{int(offsets[s]):012d}-{e - s}.parquet"
            # (the footer's summary as the collector writes it: tracemq.lake.summarize)
            summary = tlake.summarize(piece) if self.summaries else None
            with pq.ParquetWriter(d / name, piece.schema, compression="snappy") as writer:
                writer.write_table(piece, row_group_size=self.rows_per_group)
                if summary is not None:
                    writer.add_key_value_metadata({tlake.SUMMARY_KEY: summary})
            self.files += 1
        self.events += n


def generate(
    lake: str | os.PathLike[str],
    scenario: Scenario,
    *,
    chunk_messages: int = 1_000_000,
    with_truth: bool = True,
    summaries: bool = True,
    rows_per_group: int = tlake.ROW_GROUP_ROWS,
) -> GeneratedLake:
    """Generate the lake of ``scenario`` into ``lake`` (created; must not hold other data).
    ``summaries=False`` writes files without their footer summary, as collectors did before
    it (``tracemq.lake.summary``). ``rows_per_group``: the files' row groups (the collector's
    by default; a small lake in smaller groups has as many per file as a large one)."""
    lake = Path(lake)
    lake.mkdir(parents=True, exist_ok=True)
    sc = scenario
    now = sc.now_ms if sc.now_ms is not None else sc.end_ms + sc.horizon_ms + DAY
    groups = topology(sc.start_ms, sc.end_ms, now)
    gen = _Gen(sc, groups, lake, with_truth, summaries, rows_per_group)
    # Message time line: [read_lo, start) look-back, [start, end) window, [end, read_hi) after.
    span = sc.end_ms - sc.start_ms
    n_before = int(sc.messages * sc.surrounding_density * sc.horizon_ms / span)
    n_after = int(sc.messages * sc.surrounding_density * sc.horizon_ms / span)
    segments = [
        (sc.read_lo, sc.start_ms, n_before, 1),
        (sc.start_ms, sc.end_ms, sc.messages, 0),
        (sc.end_ms, sc.read_hi, n_after, 2),
    ]
    chunk = 0
    for lo, hi, n, kind in segments:
        if n <= 0:
            continue
        pieces = max(1, -(-n // chunk_messages))
        for i in range(pieces):
            c_lo = lo + (hi - lo) * i // pieces
            c_hi = lo + (hi - lo) * (i + 1) // pieces
            c_n = n * (i + 1) // pieces - n * i // pieces
            gen.chunk(chunk, c_lo, c_hi, c_n, kind)
            chunk += 1
    return gen.finish()


class _Gen:
    def __init__(
        self,
        sc: Scenario,
        groups: list[Group],
        lake: Path,
        with_truth: bool,
        summaries: bool,
        rows_per_group: int = tlake.ROW_GROUP_ROWS,
    ) -> None:
        self.sc = sc
        self.groups = groups
        self.gidx = {g.name: i for i, g in enumerate(groups)}
        self.with_truth = with_truth
        self.rng = np.random.default_rng(sc.seed)
        self.writer = _Writer(lake, rows_per_group, summaries=summaries)
        self.lake = lake
        self.next_index = 0
        self.next_attempt = 0
        n_clients = max(len(g.clients) for g in groups) + 1
        shape = (len(groups), len(TOPICS), len(BROKERS), QUEUES, n_clients)
        big = np.iinfo(np.int64).max
        self.blocker = np.full(shape, big, dtype=np.int64)
        self.queue_next = np.zeros((len(TOPICS), len(BROKERS), QUEUES), dtype=np.int64)
        # %RETRY%<group> / %DLQ%<group>: queue 0 on each broker
        self.retry_next = np.zeros((len(groups), len(BROKERS)), dtype=np.int64)
        self.retry_blocker = np.full((len(groups), len(BROKERS)), big, dtype=np.int64)
        self.dlq_next = np.zeros((len(groups), len(BROKERS)), dtype=np.int64)
        self.copies: list[dict[str, Any]] = []
        #: seen pairs without a successful attempt: resolved against the offsets at the end
        self.unfinished: list[dict[str, Any]] = []
        self.truth: list[pa.Table] = []
        #: pending no-trace truth rows: resolved against the committed offsets at the end
        self.no_trace: list[dict[str, np.ndarray | pa.Array]] = []
        self.info = {"ROLLED_BACK": 0, "TX_UNRESOLVED": 0, "RECALLED": 0, "NO_EXPECTED_GROUP": 0}
        self.messages = 0
        self.orphan_batches: list[tuple[pa.Array, np.ndarray, np.ndarray]] = []
        self.null_batches: list[tuple[np.ndarray, np.ndarray]] = []

    # -- one chunk of messages published in [lo, hi) ----------------------------------
    def chunk(self, chunk: int, lo: int, hi: int, n: int, kind: int) -> None:
        sc, rng = self.sc, self.rng
        w = sc.window_ms
        idx = self.next_index + np.arange(n, dtype=np.int64)
        self.next_index += n
        if kind == 0:
            self.messages += n
        pub_ts = np.sort(rng.integers(lo, hi, n))  # recorded by the producer's clock
        producer = rng.integers(0, len(PRODUCERS), n)
        skew = np.array([p[2] for p in PRODUCERS])[producer]
        true_ts = pub_ts - skew
        tw = np.asarray(sc.topic_weights, dtype=float)
        topic = rng.choice(len(TOPICS), n, p=tw / tw.sum())
        tag = np.zeros(n, dtype=np.int64)
        for t in range(len(TOPICS)):
            sel = topic == t
            tag[sel] = rng.choice(len(TAGS[t]), int(sel.sum()), p=TAG_P[t])
        # message types; surrounding messages are plain
        r = rng.random(n)
        mtype = np.zeros(n, dtype=np.int32)
        if kind == 0:
            mtype[r < 0.05] = 1  # transactional half
            mtype[(r >= 0.05) & (r < 0.08)] = 3  # delayed
            mtype[(r >= 0.08) & (r < 0.10)] = 4  # ordered
        half = mtype == 1
        r2 = rng.random(n)
        commit = half & (r2 < 0.6)
        rollback = half & (r2 >= 0.6) & (r2 < 0.9)
        unresolved = half & (r2 >= 0.9)
        delayed = mtype == 3
        levels = DELAY_LEVELS_MS[DELAY_LEVELS_MS <= sc.max_delay_ms]
        delay = np.where(delayed, rng.choice(levels, n), 0)
        recalled = delayed & (rng.random(n) < 0.1)
        # recalls the broker refused (too late: already delivered): traced with success=false,
        # they change nothing (r2 only decides half messages, so no new draw shifts the stream)
        refused = delayed & ~recalled & (r2 < 0.1)
        # send outcome: 0 ok, 1 failed then ok (send retry), 2 failed only (PUB_FAILED)
        r3 = rng.random(n)
        send = np.zeros(n, dtype=np.int8)
        if kind == 0:
            send[r3 < 0.015] = 1
            send[(r3 >= 0.015) & (r3 < 0.025)] = 2
            send[(send == 2) & half] = 0
        ok = send != 2
        cost = rng.integers(1, 40, n)
        store_true = true_ts + cost // 2
        store_time = np.where(rng.random(n) < 0.2, 0, store_true)  # 0: transport gave none
        broker = rng.integers(0, len(BROKERS), n)
        queue = rng.integers(0, QUEUES, n)
        qoff = np.full(n, -1, dtype=np.int64)
        okpos = np.flatnonzero(ok)
        flat = (topic * len(BROKERS) + broker) * QUEUES + queue
        qn = self.queue_next.reshape(-1)
        order = okpos[np.argsort(flat[okpos], kind="stable")]
        keys_sorted = flat[order]
        if len(order):
            first = np.r_[0, np.flatnonzero(np.diff(keys_sorted)) + 1]
            run = np.arange(len(order)) - np.repeat(first, np.diff(np.r_[first, len(order)]))
            qoff[order] = qn[keys_sorted] + run
            np.add.at(qn, keys_sorted, 1)
        ids = msg_ids(idx, pub_ts, producer)
        in_window = kind == 0
        events: list[pa.Table] = []

        # Pub events: a failed attempt before a retry, failed attempts only, or one success
        tags_arr = np.full(n, -1)
        tag_strings: list[str | None] = []
        for t in range(len(TOPICS)):
            first_tag = len(tag_strings)
            tag_strings.extend(TAGS[t])
            sel = topic == t
            tag_vals = np.array(
                [first_tag + i if TAGS[t][i] is not None else -1 for i in range(len(TAGS[t]))]
            )
            tags_arr[sel] = tag_vals[tag[sel]]
        tag_col = _take(tag_strings, tags_arr)
        topic_col = _take(TOPICS, topic)
        keys_col = _keys(idx)
        pgroup = _take([p[0] for p in PRODUCERS], producer)
        phost = _take([p[1] for p in PRODUCERS], producer)
        baddr = _take([b[1] for b in BROKERS], broker)

        def sent(s: pa.Array, *, full: bool = True) -> dict[str, Any]:
            """The producer's columns of the selected messages' records (a Recall's: only
            group, topic and msgId)."""
            cols = dict(
                region_id=REGION,
                group_name=pgroup.filter(s),
                topic=topic_col.filter(s),
                msg_id=ids.filter(s),
            )
            if full:
                cols.update(
                    tags=tag_col.filter(s), keys=keys_col.filter(s), store_host=baddr.filter(s)
                )
            return cols

        def pubs(sel: np.ndarray, ts: np.ndarray, success: bool) -> None:
            s = pa.array(sel)
            k = int(sel.sum())
            if k == 0:
                return
            cols: dict[str, Any] = dict(
                trace_type="Pub",
                timestamp=ts[sel],
                **sent(s),
                cost_time=cost[sel],
                success=success,
                client_host=phost.filter(s),
                body_length=rng.integers(64, 2048, k),
                msg_type=mtype[sel],
            )
            if success:
                cols.update(
                    offset_msg_id=_offset_msg_ids(broker[sel], queue[sel], qoff[sel]),
                    store_time=store_time[sel],
                    store_addr=baddr.filter(s),
                    queue_id=queue[sel].astype(np.int32),
                    queue_offset=qoff[sel],
                )
            else:
                cols.update(store_time=0, cost_time=rng.integers(3000, 3100, k))
            events.append(_frame(k, **cols))

        pubs(send == 1, pub_ts - 3200, False)  # a failed attempt 3.2 s before the retry
        pubs(send == 2, pub_ts, False)  # failed sends: the attempt and its retry
        pubs(send == 2, pub_ts + 3200, False)
        pubs(ok, pub_ts, True)
        # a trace send retried on a hung trace cluster: the same Pub records once or twice more
        if in_window:
            dup_pub = ok & (rng.random(n) < 0.03)
            pubs(dup_pub, pub_ts, True)
            pubs(dup_pub & (rng.random(n) < 0.5), pub_ts, True)

        # transactions: EndTransaction COMMIT / ROLLBACK / UNKNOW (half of the unresolved)
        end_tx = commit | rollback | (unresolved & (r2 >= 0.95))
        if end_tx.any():
            s = pa.array(end_tx)
            state = np.where(commit, 0, np.where(rollback, 1, 2))[end_tx]
            check = rng.random(int(end_tx.sum())) < 0.2
            ts_tx = pub_ts[end_tx] + np.where(
                check, 60 * SEC, rng.integers(5, 2000, int(end_tx.sum()))
            )
            events.append(
                _frame(
                    int(end_tx.sum()),
                    trace_type="EndTransaction",
                    timestamp=ts_tx,
                    **sent(s),
                    msg_type=np.where(state == 0, 2, 1).astype(np.int32),
                    transaction_id=keys_col.filter(s),
                    transaction_state=_take(
                        ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"], state
                    ),
                    from_transaction_check=check,
                )
            )
        commit_ts = np.where(commit, pub_ts + 2100 + 60 * SEC, 0) - skew
        if recalled.any():
            s = pa.array(recalled)
            events.append(
                _frame(
                    int(recalled.sum()),
                    trace_type="Recall",
                    timestamp=pub_ts[recalled] + 500,
                    **sent(s, full=False),
                    success=True,
                )
            )

        refused &= ok  # a send that failed was never delivered, nor recalled
        if refused.any():
            s = pa.array(refused)
            events.append(
                _frame(
                    int(refused.sum()),
                    trace_type="Recall",
                    timestamp=pub_ts[refused] + delay[refused] + 2000,
                    **sent(s, full=False),
                    success=False,
                )
            )

        expected_anywhere = ok & ~recalled & (~half | commit)
        if in_window:
            self.info["ROLLED_BACK"] += int((ok & rollback).sum())
            self.info["TX_UNRESOLVED"] += int((ok & unresolved).sum())
            self.info["RECALLED"] += int((ok & recalled).sum())

        # --- expected pairs ------------------------------------------------------------
        g_cols: list[np.ndarray] = []  # per group: expected mask
        any_expected = np.zeros(n, dtype=bool)
        pair_msg, pair_group, pair_client = [], [], []
        for gi, g in enumerate(self.groups):
            exp = np.zeros(n, dtype=bool)
            if g.topic >= 0:
                for expression, first, last in g.rows:
                    exp |= (
                        (topic == g.topic)
                        & _tag_matches(expression, tag, g.topic)
                        & (pub_ts >= first)
                        & (pub_ts <= last + self.sc.subscription_grace_ms)
                    )
            exp &= expected_anywhere
            g_cols.append(exp)
            any_expected |= exp
            m = np.flatnonzero(exp)
            if g.broadcasting:
                clients = range(len(g.clients)) if g.clients else [-1]
                for c in clients:
                    pair_msg.append(m)
                    pair_group.append(np.full(len(m), gi))
                    pair_client.append(np.full(len(m), c))
            else:
                pair_msg.append(m)
                pair_group.append(np.full(len(m), gi))
                pair_client.append(np.full(len(m), -1))
        if in_window:
            self.info["NO_EXPECTED_GROUP"] += int((expected_anywhere & ~any_expected).sum())
        p_msg = np.concatenate(pair_msg) if pair_msg else np.zeros(0, np.int64)
        p_group = np.concatenate(pair_group) if pair_group else np.zeros(0, np.int64)
        p_client = np.concatenate(pair_client) if pair_client else np.zeros(0, np.int64)
        P = len(p_msg)
        is_b = np.array([g.broadcasting for g in self.groups])[p_group]
        consumes = np.array([g.consumes for g in self.groups])[p_group]
        beh = np.full(P, OK, dtype=np.int64)
        if in_window and P:
            u = rng.random(P)
            late = pub_ts[p_msg] >= sc.start_ms + (sc.end_ms - sc.start_ms) * 3 // 4
            for which, col in ((~is_b, 0), (is_b, 1)):
                p = _BEHAVIOUR_P[:, col] / _BEHAVIOUR_P[:, col].sum()
                cuts = np.cumsum(p)
                b = np.searchsorted(cuts, u, side="right").clip(0, len(p) - 1)
                beh[which] = b[which]
            # blockers only late in the window, so that TRACE_LOST stays common
            blk = np.isin(beh, _BLOCKERS) & ~late
            beh[blk] = OK
            # delayed messages: consumed at their due time, or lost
            dl = delayed[p_msg]
            beh[dl & ~np.isin(beh, (OK, TRACE_LOST, NOT_CONSUMED))] = OK
        beh[~consumes] = NOT_CONSUMED  # G_silent_C: never consumes

        # consume start (true time)
        base = np.maximum(
            true_ts[p_msg]
            + rng.integers(2, 3 * SEC, P)
            + (rng.random(P) < 0.05) * rng.integers(0, 4 * MIN, P),
            store_true[p_msg] + 1,
        )
        base = np.where(
            delayed[p_msg], true_ts[p_msg] + delay[p_msg] + rng.integers(1, 500, P), base
        )
        base = np.where(commit[p_msg], np.maximum(base, commit_ts[p_msg] + 5), base)
        base = np.where(
            beh == LATE_IN,
            sc.end_ms + 10 * SEC + rng.integers(0, int(sc.horizon_ms * 0.7), P),
            base,
        )
        base = np.where(
            beh == LATE_PAST,
            sc.end_ms + sc.horizon_ms + 10 * SEC + rng.integers(0, 20 * MIN, P),
            base,
        )

        # --- unexpected consumption (window messages, successful Pub) -------------------
        u_msg: list[np.ndarray] = []
        u_group: list[np.ndarray] = []
        if in_window:
            plain = ok & ~delayed
            rogue = np.flatnonzero(plain & (topic == 0) & (rng.random(n) < 0.02))
            u_msg.append(rogue)
            u_group.append(np.full(len(rogue), self.gidx["G_rogue"]))
            tag_c = np.flatnonzero(plain & (topic == 0) & (tag == 2) & (rng.random(n) < 0.05))
            u_msg.append(tag_c)
            u_group.append(np.full(len(tag_c), self.gidx["G_tag_A"]))
            early = np.flatnonzero(
                plain & (topic == 0) & ~g_cols[self.gidx["G_late_A"]] & (rng.random(n) < 0.05)
            )
            u_msg.append(early)
            u_group.append(np.full(len(early), self.gidx["G_late_A"]))
            rb = np.flatnonzero(ok & rollback & (topic == 0) & (rng.random(n) < 0.3))
            u_msg.append(rb)
            u_group.append(np.full(len(rb), self.gidx["G_all_A"]))
        um = np.concatenate(u_msg) if u_msg else np.zeros(0, np.int64)
        ug = np.concatenate(u_group) if u_group else np.zeros(0, np.int64)
        U = len(um)
        ubase = np.maximum(true_ts[um] + rng.integers(2, 3 * SEC, U), store_true[um] + 1)

        # --- attempts of all pairs (expected + unexpected) -------------------------------
        all_msg = np.concatenate([p_msg, um])
        all_group = np.concatenate([p_group, ug])
        all_client = np.concatenate([p_client, np.full(U, -1)])
        all_beh = np.concatenate([beh, np.full(U, OK)])
        all_base = np.concatenate([base, ubase])
        n_pairs = len(all_msg)
        k_fail = rng.integers(1, 4, n_pairs)
        k_fail5 = rng.integers(1, 6, n_pairs)
        k_if = rng.integers(0, 2, n_pairs)
        # dead letters: half after max_reconsume_times retries, half sooner (a consumer with a
        # lower limit, or delay_level_when_next_consume = -1); tracemq consumers trace the move
        # to %DLQ%<group> as a Pub of the group — the early ones always, the others half the
        # time (RocketMQ's clients do not trace it: the retry count has to tell)
        is_dlq = all_beh == DLQ
        dlq_short = is_dlq & (rng.random(n_pairs) < 0.5)
        dlq_pub = is_dlq & (dlq_short | (rng.random(n_pairs) < 0.5))
        count = np.select(
            [
                np.isin(all_beh, (RETRY_OK, RETRY_LOST)),
                all_beh == FAILED,
                is_dlq,
                all_beh == IN_FLIGHT,
                all_beh == DUPLICATE,
                np.isin(all_beh, (TRACE_LOST, NOT_CONSUMED)),
            ],
            [
                k_fail + 1,
                k_fail5,
                np.where(dlq_short, k_fail5, sc.max_reconsume_times + 1),
                k_if + 1,
                2,
                0,
            ],
            1,
        )
        att = attempt_events(
            self,
            all_msg,
            all_group,
            all_client,
            all_beh,
            all_base,
            count,
            dlq_pub=dlq_pub,
            pub_ids=ids,
            msg_topic=topic,
            tag_col=tag_col,
            keys_col=keys_col,
            baddr=baddr,
            store_true=store_true,
        )
        events.extend(att["events"])
        copy = self._copies(P, p_msg, p_group, is_b, beh, count, broker, ids)

        # --- committed-offset blockers ---------------------------------------------------
        gi_arr = all_group[:P]
        for blocking in _BLOCKERS:
            sel = np.flatnonzero((all_beh[:P] == blocking) & ok[p_msg])
            if len(sel):
                m = p_msg[sel]
                np.minimum.at(
                    self.blocker,
                    (gi_arr[sel], topic[m], broker[m], queue[m], all_client[sel] + 1),
                    qoff[m],
                )

        # --- orphans, ancient and null-id consumes (window chunks only) -----------------
        if in_window:
            events.extend(orphans(self, lo, hi, n))

        # --- truth -----------------------------------------------------------------------
        if self.with_truth and in_window:
            record_truth(
                self,
                n=n,
                ids=ids,
                pub_ts=pub_ts,
                send=send,
                ok=ok,
                mtype=mtype,
                delayed=delayed,
                topic=topic,
                broker=broker,
                queue=queue,
                qoff=qoff,
                store_time=store_time,
                cost=cost,
                P=P,
                p_msg=p_msg,
                p_group=p_group,
                p_client=p_client,
                beh=beh,
                um=um,
                ug=ug,
                att=att,
                w=w,
                copy=copy,
                msg_type=mtype,
            )
        table = pa.concat_tables(events)
        self.writer.write(table, chunk, rng)

    # -- retries and dead letters: copies in %RETRY%<group> / %DLQ%<group> ------------------
    def _copies(self, P, p_msg, p_group, is_b, beh, count, broker, ids) -> dict[str, Any]:
        """The copies of the expected clustering pairs: attempt ``j >= 1`` of a retrying chain
        read copy ``j`` from queue 0 of ``%RETRY%<group>`` on the message's broker; a dead
        letter is one copy in ``%DLQ%<group>``. Returns per pair the last retry copy (reconsume
        count, offset; -1 without) and whether a dead-letter copy exists."""
        b = beh[:P]
        cnt = count[:P]
        k_last = np.where(~is_b & np.isin(b, _RETRYING) & (cnt > 1), cnt - 1, 0)
        last_off = np.full(P, -1, dtype=np.int64)
        bro = broker[p_msg]
        gnames = [g.name for g in self.groups]

        def copy(queue: str, g: int, br: int, off: int, mid: str, k: int) -> dict[str, Any]:
            """A copy of message ``mid`` in ``<queue><group>`` (queue 0 of broker ``br``)."""
            return {
                "group": gnames[g],
                "topic": f"{queue}{gnames[g]}",
                "broker": BROKERS[br][0],
                "store_addr": BROKERS[br][1],
                "queue_id": 0,
                "queue_offset": off,
                "msg_id": mid,
                "reconsume_times": k,
            }

        has = np.flatnonzero(k_last > 0)
        for i in has.tolist():  # retried pairs are a few percent: a plain loop
            g, br = int(p_group[i]), int(bro[i])
            mid = ids[int(p_msg[i])].as_py()
            for k in range(1, int(k_last[i]) + 1):
                off = int(self.retry_next[g, br])
                self.retry_next[g, br] += 1
                self.copies.append(copy("%RETRY%", g, br, off, mid, k))
            last_off[i] = off
            if b[i] == IN_FLIGHT:  # the retry being consumed holds its queue's offset back
                self.retry_blocker[g, br] = min(self.retry_blocker[g, br], off)
        dead = ~is_b & (b == DLQ)
        for i in np.flatnonzero(dead).tolist():
            g, br = int(p_group[i]), int(bro[i])
            self.copies.append(
                copy(
                    "%DLQ%",
                    g,
                    br,
                    int(self.dlq_next[g, br]),
                    ids[int(p_msg[i])].as_py(),
                    int(cnt[i]),
                )
            )
            self.dlq_next[g, br] += 1
        return {"k_last": k_last, "last_off": last_off, "broker": bro, "dlq": dead}

    def _orphan_host(self, grp: np.ndarray) -> pa.Array:
        """The consuming host of orphan consumes: a group's first client (10.0.1.2 for
        G_bcast_B)."""
        hosts = [gr.clients[0][0] if gr.clients else None for gr in self.groups]
        bc = self.gidx["G_bcast_B"]
        hosts[bc] = self.groups[bc].clients[1][0]
        return _take(hosts, grp)

    # -- the ground truth is gen_truth.record_truth; it names clients with this ----------
    def _client_col(self, group: np.ndarray, client: np.ndarray) -> pa.Array:
        hosts: list[str | None] = []
        codes = np.full(len(group), -1)
        for gi, g in enumerate(self.groups):
            for ci, (h, _) in enumerate(g.clients):
                sel = (group == gi) & (client == ci) & g.broadcasting
                codes[sel] = len(hosts)
                hosts.append(h)
        return _take(hosts, codes)

    # -- the end: committed offsets, resolved truth ---------------------------------------
    def finish(self) -> GeneratedLake:
        sc = self.sc
        w = sc.window_ms
        big = np.iinfo(np.int64).max
        qn = self.queue_next
        offsets: list[dict[str, Any]] = []
        committed = np.zeros_like(self.blocker)
        for gi, g in enumerate(self.groups):
            if not g.consumes or g.topic < 0:
                continue
            clients = (
                [(ci, h) for ci, (h, _) in enumerate(g.clients)] if g.broadcasting else [(-1, None)]
            )
            t = g.topic
            for bi, (bname, addr) in enumerate(BROKERS):
                for q in range(QUEUES):
                    for ci, host in clients:
                        blk = self.blocker[gi, t, bi, q, ci + 1]
                        c = int(blk) if blk != big else int(qn[t, bi, q])
                        committed[gi, t, bi, q, ci + 1] = c
                        offsets.append(
                            {
                                "group": g.name,
                                "topic": TOPICS[t],
                                "broker": bname,
                                "store_addr": addr,
                                "queue_id": q,
                                "committed": c,
                                "client_host": host,
                            }
                        )
        retry_committed = np.where(self.retry_blocker != big, self.retry_blocker, self.retry_next)
        for gi, g in enumerate(self.groups):
            if g.broadcasting or not g.rows:
                continue
            for bi, (bname, addr) in enumerate(BROKERS):
                copy_committed: tuple[tuple[str, int | None], ...] = (
                    (f"%RETRY%{g.name}", int(retry_committed[gi, bi])),
                    (f"%DLQ%{g.name}", None),  # nobody consumes a dead-letter queue
                )
                for topic, committed_at in copy_committed:
                    offsets.append(
                        {
                            "group": g.name,
                            "topic": topic,
                            "broker": bname,
                            "store_addr": addr,
                            "queue_id": 0,
                            "committed": committed_at,
                            "client_host": None,
                        }
                    )
        truth = None
        if self.with_truth:
            gnames = [g.name for g in self.groups]
            consumes_g = np.array([g.consumes for g in self.groups])
            for u in self.unfinished:
                grp, cl = u["group"], u["client"]
                c = committed[grp, u["topic"], u["broker"], u["queue"], cl + 1]
                orig_passed = u["offset_applicable"] & consumes_g[grp] & (c > u["offset"])
                br = u["broker"]
                copy_passed = retry_committed[grp, br] > u["last_off"]
                last_passed = np.where(u["k_last"] > 0, copy_passed, orig_passed)
                failed_last = u["max_failed"] >= u["k_last"]
                consumed = last_passed & ~u["dlq"] & ~u["dead_traced"] & ~failed_last
                outcome = np.where(
                    u["dlq"],
                    "DEAD_LETTERED",
                    np.where(consumed, "TRACE_INCOMPLETE", u["trace_outcome"]),
                )
                self.truth.append(
                    pa.table(
                        {
                            "window_start": u["window_start"],
                            "msg_id": u["msg_id"],
                            "group": _take(gnames, grp),
                            "client_host": self._client_col(grp, cl),
                            "outcome": pa.array(outcome.tolist(), type=pa.string()),
                            "skew_suspect": u["skew_suspect"],
                        }
                    )
                )
            for nt in self.no_trace:
                grp, cl = nt["group"], nt["client"]
                consumes = np.array([g.consumes for g in self.groups])[grp]
                c = committed[grp, nt["topic"], nt["broker"], nt["queue"], cl + 1]
                passed = consumes & (c > nt["offset"])
                # consumed by the offsets: TRACE_LOST, even while still inside the horizon
                outcome = np.where(
                    nt["offset_applicable"] & passed,
                    "TRACE_LOST",
                    np.where(nt["pending"], "PENDING", "NOT_CONSUMED"),
                )
                self.truth.append(
                    pa.table(
                        {
                            "window_start": nt["window_start"],
                            "msg_id": nt["msg_id"],
                            "group": _take(gnames, grp),
                            "client_host": self._client_col(grp, cl),
                            "outcome": pa.array(outcome.tolist(), type=pa.string()),
                            "skew_suspect": np.zeros(len(grp), dtype=bool),
                        }
                    )
                )
            # orphans: first consume in the window (all were created inside the read range)
            bc = self.gidx["G_bcast_B"]
            for ids, grp, first in self.orphan_batches:
                inw = (first >= sc.start_ms) & (first < sc.end_ms)
                sel = pa.array(inw)
                gsel = grp[inw]
                self.truth.append(
                    pa.table(
                        {
                            "window_start": (first[inw] // w) * w,
                            "msg_id": ids.filter(sel),
                            "group": _take(gnames, gsel),
                            "client_host": pc.if_else(
                                pa.array(gsel == bc),
                                self._orphan_host(gsel),
                                pa.nulls(len(gsel), pa.string()),
                            ),
                            "outcome": pa.array(["ORPHAN_CONSUME"] * len(gsel), type=pa.string()),
                            "skew_suspect": np.zeros(len(gsel), dtype=np.bool_),
                        }
                    )
                )
            for grp, ts in self.null_batches:
                win = (ts // w) * w
                inw = (ts >= sc.start_ms) & (ts < sc.end_ms)
                keys = sorted(set(zip(win[inw].tolist(), grp[inw].tolist(), strict=True)))
                self.truth.append(
                    pa.table(
                        {
                            "window_start": pa.array([k[0] for k in keys], type=pa.int64()),
                            "msg_id": pa.nulls(len(keys), pa.string()),
                            "group": pa.array([gnames[k[1]] for k in keys], type=pa.string()),
                            "client_host": pa.nulls(len(keys), pa.string()),
                            "outcome": pa.array(["ORPHAN_CONSUME"] * len(keys), type=pa.string()),
                            "skew_suspect": np.zeros(len(keys), dtype=bool),
                        }
                    )
                )
            truth = pa.concat_tables(self.truth)
        return GeneratedLake(
            lake=self.lake,
            subscriptions=subscription_rows(self.groups),
            offsets=offsets,
            copies=self.copies,
            truth=truth,
            informational=dict(self.info),
            messages=self.messages,
            events=self.writer.events,
            files=self.writer.files,
        )
