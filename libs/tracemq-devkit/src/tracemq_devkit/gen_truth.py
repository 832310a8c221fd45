"""The ground truth of :mod:`tracemq_devkit.generator`: for each chunk's window messages, the
outcome the reconciliation must find per (window, msgId, group[, client]) — what each
behaviour means given which events fall inside the job's read range, the committed offsets and
the cutoff (:func:`record_truth`, appended to the generator's ``truth`` tables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tracemq_devkit.gen_columns import (
    _take,
)
from tracemq_devkit.gen_world import (
    BEHAVIOURS,
    DAY,
    DLQ,
    DUP_TRACE,
    DUPLICATE,
    FAILED,
    IN_FLIGHT,
    LATE_IN,
    OK,
    OLDFMT,
    RETRY_OK,
)

if TYPE_CHECKING:
    from tracemq_devkit.generator import _Gen


def record_truth(
    gen: _Gen,
    *,
    n,
    ids,
    pub_ts,
    send,
    ok,
    mtype,
    delayed,
    topic,
    broker,
    queue,
    qoff,
    store_time,
    cost,
    P,
    p_msg,
    p_group,
    p_client,
    beh,
    um,
    ug,
    att,
    w,
    copy,
    msg_type,
) -> None:
    sc = gen.sc
    pair = att["pair"]
    n_pairs = P + len(um)
    all_msg = np.concatenate([p_msg, um])
    # which events of each pair the job reads
    rb = att["read"]
    ra = att["read_after"]
    succ = att["success"] & ra
    n_seen = np.bincount(pair, weights=(rb | ra), minlength=n_pairs)
    n_succ = np.bincount(pair, weights=succ, minlength=n_pairs)
    n_inflight = np.bincount(pair, weights=rb & ~ra, minlength=n_pairs)
    max_retry_seen = np.zeros(n_pairs)
    # outcome of pairs with events seen
    counts = np.bincount(pair, minlength=n_pairs)
    retry = att["retry"]  # retry_times of every attempt, as written
    np.maximum.at(max_retry_seen, pair[rb], retry[rb])
    succ_retry = np.zeros(n_pairs)
    np.maximum.at(succ_retry, pair[succ], retry[succ])
    outcome = np.full(n_pairs, "", dtype=object)
    seen = n_seen > 0
    outcome[seen & (n_succ > 1)] = "DUPLICATE"
    one = seen & (n_succ == 1)
    outcome[one & ((n_seen > 1) | (succ_retry > 0))] = "CONSUMED_AFTER_RETRY"
    outcome[one & ~((n_seen > 1) | (succ_retry > 0))] = "CONSUMED"
    none = seen & (n_succ == 0)
    outcome[none & (n_inflight > 0)] = "IN_FLIGHT"
    # dead-lettered: the traced move to the DLQ, or (without it) the retry count
    dead = att["dlq_read"] | (max_retry_seen >= sc.max_reconsume_times)
    outcome[none & (n_inflight == 0) & dead] = "DEAD_LETTERED"
    outcome[none & (n_inflight == 0) & ~dead] = "FAILED"
    # the highest retry count of a traced failure (its SubBefore lost: 0), -1 for none
    failed = ra & ~att["success"]
    max_failed = np.full(n_pairs, -1, dtype=np.int64)
    np.maximum.at(max_failed, pair[failed], np.where(rb, retry, 0)[failed])
    # behaviour-level sanity: fully seen chains give the behaviour's own outcome
    expect = {
        OK: "CONSUMED",
        RETRY_OK: "CONSUMED_AFTER_RETRY",
        FAILED: "FAILED",
        DLQ: "DEAD_LETTERED",
        IN_FLIGHT: "IN_FLIGHT",
        DUPLICATE: "DUPLICATE",
        DUP_TRACE: "CONSUMED",
        OLDFMT: "CONSUMED",
        LATE_IN: "CONSUMED",
    }
    full = n_seen == counts
    for b, name in expect.items():
        bad = full[:P] & (beh == b) & (counts[:P] > 0) & (outcome[:P] != name)
        assert not bad.any(), f"generator: behaviour {BEHAVIOURS[b]} seen as other outcome"
    # skew flags: store-to-consume start and end-to-end
    m = all_msg
    first_before = np.full(n_pairs, np.iinfo(np.int64).max)
    np.minimum.at(first_before, pair[rb], att["before_ts"][rb])
    first_succ = np.full(n_pairs, np.iinfo(np.int64).max)
    np.minimum.at(first_succ, pair[succ], att["after_ts"][succ])
    store_ref = np.where(store_time[m] > 0, store_time[m], pub_ts[m] + cost[m])
    has_b = first_before != np.iinfo(np.int64).max
    has_s = first_succ != np.iinfo(np.int64).max
    stc = first_before - store_ref
    e2e = first_succ - pub_ts[m]
    skew = (has_b & ((stc < 0) | (stc > DAY))) | (has_s & ((e2e < 0) | (e2e > DAY)))
    window = (pub_ts[m] // w) * w
    # expected pairs with no event seen: pending / offsets (resolved at the end)
    gnames = [g.name for g in gen.groups]
    # seen without success: the offsets may overrule the trace (resolved at the end)
    unfinished = seen[:P] & (n_succ[:P] == 0)
    if unfinished.any():
        u = np.flatnonzero(unfinished)
        mm = p_msg[u]
        gen.unfinished.append(
            {
                "window_start": window[:P][u],
                "msg_id": ids.take(pa.array(mm)),
                "group": p_group[u],
                "client": p_client[u],
                "trace_outcome": outcome[:P][u],
                "dead_traced": dead[:P][u],
                "max_failed": max_failed[:P][u],
                "k_last": copy["k_last"][u],
                "last_off": copy["last_off"][u],
                "dlq": copy["dlq"][u],
                "topic": topic[mm],
                "broker": broker[mm],
                "queue": queue[mm],
                "offset": qoff[mm],
                "offset_applicable": ~np.isin(msg_type[mm], (1, 3)),
                "skew_suspect": skew[:P][u],
            }
        )
    exp_seen = seen[:P] & ~unfinished
    rows = {
        "window_start": window[:P][exp_seen],
        "msg_id": ids.take(pa.array(p_msg[exp_seen])),
        "group": _take(gnames, p_group[exp_seen]),
        "client_host": gen._client_col(p_group[exp_seen], p_client[exp_seen]),
        "outcome": pa.array(outcome[:P][exp_seen].tolist(), type=pa.string()),
        "skew_suspect": skew[:P][exp_seen],
    }
    gen.truth.append(pa.table(rows))
    nt = ~seen[:P]
    mm = p_msg[nt]
    due = pub_ts[mm] + np.where(delayed[mm], max(sc.max_delay_ms, sc.horizon_ms), sc.horizon_ms)
    gen.no_trace.append(
        {
            "window_start": window[:P][nt],
            "msg_id": ids.take(pa.array(mm)),
            "group": p_group[nt],
            "client": p_client[nt],
            "topic": topic[mm],
            "broker": broker[mm],
            "queue": queue[mm],
            "offset": qoff[mm],
            "pending": due > sc.cutoff_ms,
            "offset_applicable": ~np.isin(mtype[mm], (1, 3)),
        }
    )
    # unexpected consumption: every one is seen (consumed within minutes of the Pub)
    us = seen[P:]
    assert us.all(), "generator: an unexpected consume fell outside the read range"
    gen.truth.append(
        pa.table(
            {
                "window_start": window[P:],
                "msg_id": ids.take(pa.array(um)),
                "group": _take(gnames, ug),
                "client_host": pa.nulls(len(um), pa.string()),
                "outcome": pa.array(["UNEXPECTED_GROUP"] * len(um), type=pa.string()),
                "skew_suspect": skew[P:],
            }
        )
    )
    # failed sends
    pf = np.flatnonzero(send == 2)
    gen.truth.append(
        pa.table(
            {
                "window_start": (pub_ts[pf] // w) * w,
                "msg_id": ids.take(pa.array(pf)),
                "group": pa.nulls(len(pf), pa.string()),
                "client_host": pa.nulls(len(pf), pa.string()),
                "outcome": pa.array(["PUB_FAILED"] * len(pf), type=pa.string()),
                "skew_suspect": np.zeros(len(pf), dtype=bool),
            }
        )
    )
