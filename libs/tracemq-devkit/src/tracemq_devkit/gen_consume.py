"""The consume side of :mod:`tracemq_devkit.generator`: each (message, group[, client]) pair's
attempts as SubBefore/SubAfter records (:func:`attempt_events`, with its behaviour's retries,
lost records and dead-letter moves), and the consumes of messages without a Pub in the window
(:func:`orphans`, :func:`raw_consumes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracemq_devkit.gen_columns import (
    _frame,
    _request_ids,
    _take,
    msg_ids,
)
from tracemq_devkit.gen_world import (
    _RETRYING,
    AFTER_LOST,
    DLQ,
    DUP_TRACE,
    DUPLICATE,
    FAILED,
    HOUR,
    IN_FLIGHT,
    OLDFMT,
    REGION,
    RETRY_LOST,
    SEC,
    TOPICS,
)

if TYPE_CHECKING:
    from tracemq_devkit.generator import _Gen


def attempt_events(
    gen: _Gen,
    msg,
    group,
    client,
    beh,
    base,
    count,
    *,
    dlq_pub,
    pub_ids,
    msg_topic,
    tag_col,
    keys_col,
    baddr,
    store_true,
) -> dict[str, Any]:
    rng = gen.rng
    sc = gen.sc
    n_att = int(count.sum())
    pair = np.repeat(np.arange(len(msg)), count)
    first = np.r_[0, np.cumsum(count)[:-1]]
    j = np.arange(n_att) - np.repeat(first, count)
    k = count[pair]
    b = beh[pair]
    last = j == k - 1
    success = np.select(
        [np.isin(b, (FAILED, DLQ)), b == IN_FLIGHT, b == DUPLICATE], [False, False, True], last
    )
    # partial trace loss: the last (successful) attempt's SubAfter is lost, and for half of
    # the lost retries its SubBefore too
    lost_after = last & np.isin(b, (AFTER_LOST, RETRY_LOST))
    lost_before = last & (b == RETRY_LOST) & (rng.random(n_att) < 0.5)
    has_after = ~((b == IN_FLIGHT) & last) & ~lost_after
    has_before = ~lost_before
    retry = np.where(np.isin(b, _RETRYING), j, 0)
    spacing = np.where(b == DLQ, 2 * SEC, np.where(b == DUPLICATE, 10 * SEC, 5 * SEC))
    before_true = base[pair] + j * spacing
    acost = rng.integers(1, 60, n_att)
    after_true = before_true + acost
    # the consuming client: broadcasting pairs name theirs; clustering picks one per pair
    g = group[pair]
    c = client[pair].copy()
    # clustering: one client per pair; a skewed host takes a small share of the work
    pick_p = rng.random(len(msg))
    pick = np.zeros(len(msg), dtype=np.int64)
    for gi, gr in enumerate(gen.groups):
        if not gr.clients:
            continue
        wts = np.array([0.1 if s else 1.0 for _, s in gr.clients])
        sel = group == gi
        pick[sel] = np.searchsorted(np.cumsum(wts / wts.sum()), pick_p[sel], side="right")
    pick = pick.clip(0, None)[pair]
    c = np.where(c < 0, pick, c)
    host_tab: list[list[str | None]] = [[h for h, _ in gr.clients] or [None] for gr in gen.groups]
    skew_tab = [[s for _, s in gr.clients] or [0] for gr in gen.groups]
    width = max(len(h) for h in host_tab)
    hosts_flat = [h for hs in host_tab for h in (hs + [None] * (width - len(hs)))]
    skews = np.array([s for ss in skew_tab for s in (ss + [0] * (width - len(ss)))])
    hcode = g * width + c
    skew = skews[hcode]
    before_ts = before_true + skew
    after_ts = after_true + skew
    host = _take(hosts_flat, hcode)
    att_id = gen.next_attempt + np.arange(n_att)
    gen.next_attempt += n_att
    rid = _request_ids(att_id, 0x5EED)
    gname = _take([gr.name for gr in gen.groups], g)
    mi = pa.array(msg[pair])
    mid = pub_ids.take(mi)
    topic_real = _take(TOPICS, msg_topic[msg[pair]])
    retry_topic = _take([f"%RETRY%{gr.name}" for gr in gen.groups], g)
    sb_topic = pc.if_else(pa.array(retry > 0), retry_topic, topic_real)
    events = []
    events.append(
        _frame(
            n_att,
            trace_type="SubBefore",
            timestamp=before_ts,
            region_id=REGION,
            group_name=gname,
            request_id=rid,
            topic=sb_topic,
            msg_id=mid,
            tags=tag_col.take(mi),
            keys=keys_col.take(mi),
            store_host=baddr.take(mi),
            client_host=host,
            store_time=store_true[msg[pair]],
            retry_times=retry.astype(np.int32),
            body_length=rng.integers(64, 2048, n_att),
        ).filter(pa.array(has_before))
    )
    a = pa.array(has_after)
    oldfmt = (b == OLDFMT)[has_after]
    code = np.where(success, 0, rng.choice([1, 2, 4], n_att))[has_after]
    events.append(
        _frame(
            int(has_after.sum()),
            trace_type="SubAfter",
            timestamp=after_ts[has_after],
            region_id=REGION,
            group_name=pc.if_else(
                pa.array(oldfmt), pa.nulls(len(oldfmt), pa.string()), gname.filter(a)
            ),
            request_id=rid.filter(a),
            cost_time=acost[has_after],
            success=success[has_after],
            context_code=code.astype(np.int32),
            msg_id=mid.filter(a),
            keys=keys_col.take(mi).filter(a),
            client_host=host.filter(a),
        )
    )
    dup = b == DUP_TRACE
    if dup.any():  # the same records again, once or twice (a trace send retried)
        twice = (rng.random(len(msg)) < 0.5)[pair]
        for extra in (dup, dup & twice):
            events.append(events[0].filter(pa.array(extra[has_before])))
            events.append(events[1].filter(pa.array(extra[has_after])))
    # the move to %DLQ%<group> after the last failed attempt: a Pub of the consumer group
    moved = np.flatnonzero(dlq_pub & (count > 0))
    dlq_ts = np.full(len(msg), -1, dtype=np.int64)
    if len(moved):
        li = pa.array(first[moved] + count[moved] - 1)
        dlq_ts[moved] = after_ts[li.to_numpy()] + rng.integers(1, 50, len(moved))
        events.append(
            _frame(
                len(moved),
                trace_type="Pub",
                timestamp=dlq_ts[moved],
                region_id=REGION,
                group_name=gname.take(li),
                cost_time=rng.integers(1, 10, len(moved)),
                success=True,
                topic=_take([f"%DLQ%{gr.name}" for gr in gen.groups], group[moved]),
                msg_id=mid.take(li),
                tags=tag_col.take(pa.array(msg[moved])),
                keys=keys_col.take(pa.array(msg[moved])),
                client_host=host.take(li),
                body_length=rng.integers(64, 2048, len(moved)),
                msg_type=0,
            )
        )
    return {
        "events": events,
        "pair": pair,
        "before_ts": before_ts,
        "after_ts": after_ts,
        "success": success,
        "has_after": has_after,
        "n": n_att,
        "read": has_before & (before_ts >= sc.read_lo) & (before_ts < sc.read_hi),
        "read_after": has_after & (after_ts >= sc.read_lo) & (after_ts < sc.read_hi),
        "dlq_read": (dlq_ts >= sc.read_lo) & (dlq_ts < sc.read_hi),
        "retry": retry,
    }


def orphans(gen: _Gen, lo: int, hi: int, n: int) -> list[pa.Table]:
    """Consumes without a Pub: orphans (first consumed in the window, or after it),
    consumes of ancient messages, and consumes with null / empty msgIds."""
    sc, rng = gen.sc, gen.rng
    k = max(3, int(n * sc.orphan_rate))
    events = []
    # orphans of G_all_A (clustering) and G_bcast_B (broadcasting); 15% are first consumed
    # after the window (the next run reports those)
    idx = (1 << 40) + gen.next_index * 4 + np.arange(k)
    created = rng.integers(lo, hi, k)
    ts = created + rng.integers(6 * SEC, 8 * SEC, k)
    after_window = rng.random(k) < 0.15
    ts = np.where(after_window, sc.end_ms + rng.integers(10 * SEC, sc.horizon_ms // 2, k), ts)
    grp = np.where(rng.random(k) < 0.7, gen.gidx["G_all_A"], gen.gidx["G_bcast_B"])
    failed_first = rng.random(k) < 0.2
    # consumes without a Pub are read in the job's one zone: their producer writes in it
    ids = msg_ids(idx, created, np.zeros(k, dtype=np.int64), sc.msgid_zone)
    events += raw_consumes(gen, ids, grp, ts, failed_first)
    first = np.where(failed_first, ts - 5 * SEC, ts)
    gen.orphan_batches.append((ids, grp, first))
    # ancient: created 3 h before the window, no Pub in range: not an orphan of this run
    a = max(2, k // 3)
    aidx = (1 << 41) + gen.next_index * 4 + np.arange(a)
    acreated = np.full(a, sc.start_ms - 3 * HOUR) + np.arange(a)
    ats = rng.integers(lo, hi, a)
    events += raw_consumes(
        gen,
        msg_ids(aidx, acreated, np.zeros(a, dtype=np.int64), sc.msgid_zone),
        np.full(a, gen.gidx["G_all_A"]),
        ats,
        np.zeros(a, bool),
    )
    # null / empty msgIds, by G_all_B
    z = max(2, k // 3)
    zts = rng.integers(lo, hi, z)
    zid = pa.array([None if i % 2 else "" for i in range(z)], type=pa.string())
    events += raw_consumes(gen, zid, np.full(z, gen.gidx["G_all_B"]), zts, np.zeros(z, bool))
    gen.null_batches.append((np.full(z, gen.gidx["G_all_B"]), zts))
    return events


def raw_consumes(
    gen: _Gen, ids: pa.Array, grp: np.ndarray, ts: np.ndarray, failed_first: np.ndarray
) -> list[pa.Table]:
    """One successful attempt at ``ts`` per id, after a failed one 5 s earlier where
    ``failed_first``."""
    k = len(grp)
    out = []
    for final, sel in ((False, failed_first), (True, np.ones(k, bool))):
        m = int(sel.sum())
        if m == 0:
            continue
        s = pa.array(sel)
        rts = ts[sel] - (0 if final else 5 * SEC)
        att = gen.next_attempt + np.arange(m)
        gen.next_attempt += m
        rid = _request_ids(att, 0x0FA7)
        gname = _take([gr.name for gr in gen.groups], grp[sel])
        host = gen._orphan_host(grp[sel])
        retry = (failed_first[sel] & final).astype(np.int32)
        out.append(
            _frame(
                m,
                trace_type="SubBefore",
                timestamp=rts,
                region_id=REGION,
                group_name=gname,
                request_id=rid,
                topic="TopicA",
                msg_id=ids.filter(s),
                client_host=host,
                retry_times=retry,
            )
        )
        out.append(
            _frame(
                m,
                trace_type="SubAfter",
                timestamp=rts + 7,
                region_id=REGION,
                group_name=gname,
                request_id=rid,
                cost_time=7,
                success=final,
                context_code=0 if final else 4,
                msg_id=ids.filter(s),
                client_host=host,
            )
        )
    return out
