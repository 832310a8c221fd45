"""The world :mod:`tracemq_devkit.generator` simulates: time units, brokers, topics and tags,
producers, the per-delivery behaviours and their odds, and the consumer groups with their
subscription history (:func:`topology`, :func:`subscription_rows`). Plain data, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
TRACE_PARTITIONS = 4
REGION = "DefaultRegion"

#: RocketMQ's 18 delay levels
DELAY_LEVELS_MS = (
    np.array(
        [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200],
        dtype=np.int64,
    )
    * SEC
)

# ----------------------------------------------------------------------------- topology

BROKERS = [("broker-a", "10.0.0.1:10911"), ("broker-b", "10.0.0.2:10911")]
QUEUES = 4
TOPICS = ["TopicA", "TopicB", "TopicC"]
TOPIC_P = np.array([0.55, 0.12, 0.33])
#: tags per topic (None = no tag) and their probabilities
TAGS: list[list[str | None]] = [["TagA", "TagB", "TagC"], [None, "x"], ["TagX", "TagY", "TagZ"]]
TAG_P = [np.array([0.4, 0.4, 0.2]), np.array([0.5, 0.5]), np.array([0.48, 0.48, 0.04])]
#: (group, host, clock skew ms, msgId time zone, msgId address): the producers write their
#: msgIds in different zones (RocketMQ's month start is the producer's local one), and one
#: has an IPv6 address (56-hex msgIds)
PRODUCERS = [
    ("PG_orders", "10.0.3.1", 0, "Asia/Shanghai", "10.0.3.1"),
    ("PG_billing", "10.0.3.2", 400, "Europe/Berlin", "fd00::3:2"),
]

# behaviours of an expected (message, group[, client]) pair
OK, RETRY_OK, FAILED, DLQ, IN_FLIGHT, DUPLICATE, DUP_TRACE, OLDFMT = range(8)
TRACE_LOST, NOT_CONSUMED, LATE_IN, LATE_PAST = range(8, 12)
AFTER_LOST, RETRY_LOST = range(12, 14)
BEHAVIOURS = [
    "ok",
    "retry_ok",
    "failed",
    "dlq",
    "in_flight",
    "duplicate",
    "dup_trace",
    "oldfmt",
    "trace_lost",
    "not_consumed",
    "late_in_horizon",
    "late_past_horizon",
    "after_lost",
    "retry_trace_lost",
]
NO_TRACE = (TRACE_LOST, NOT_CONSUMED, LATE_PAST)
#: (probability for clustering groups, for broadcasting clients)
_BEHAVIOUR_P = np.array(
    [
        [0.80, 0.90],  # ok
        [0.04, 0.0],  # retry_ok
        [0.02, 0.02],  # failed
        [0.01, 0.0],  # dlq
        [0.015, 0.01],  # in_flight (only late in the window)
        [0.015, 0.03],  # duplicate
        [0.02, 0.0],  # dup_trace
        [0.02, 0.0],  # oldfmt
        [0.025, 0.02],  # trace_lost
        [0.015, 0.02],  # not_consumed (only late in the window)
        [0.01, 0.0],  # late_in_horizon
        [0.01, 0.0],  # late_past_horizon
        [0.015, 0.0],  # after_lost: SubAfter lost, committed offset passed
        [0.015, 0.0],  # retry_trace_lost: the successful retry's records lost
    ]
)
#: behaviours whose later attempts are retries (copies in %RETRY%<group>)
_RETRYING = (RETRY_OK, FAILED, DLQ, IN_FLIGHT, RETRY_LOST)
#: behaviours that keep a group's committed offset from passing the message
_BLOCKERS = (IN_FLIGHT, NOT_CONSUMED)


@dataclass(frozen=True)
class Group:
    name: str
    topic: int  # index into TOPICS, -1 for none
    #: subscription rows: (expression, first_seen, last_seen)
    rows: tuple[tuple[str, int, int], ...]
    broadcasting: bool
    #: consuming hosts: (client_host, clock skew ms)
    clients: tuple[tuple[str, int], ...]
    consumes: bool = True


def topology(start_ms: int, end_ms: int, now_ms: int) -> list[Group]:
    """The consumer groups of the simulated world (see the module docstring)."""
    long_ago = start_ms - DAY
    mid = start_ms + (end_ms - start_ms) // 2
    return [
        Group(
            "G_all_A",
            0,
            (("*", long_ago, now_ms),),
            False,
            (("10.0.2.1", 0), ("10.0.2.2", 0), ("10.0.2.9", -8 * SEC)),
        ),
        Group(
            "G_tag_A",
            0,
            (("TagA || TagB", long_ago, now_ms),),
            False,
            (("10.0.2.3", 0), ("10.0.2.4", 0)),
        ),
        Group("G_late_A", 0, (("*", mid, now_ms),), False, (("10.0.2.5", 0),)),
        Group("G_all_B", 1, (("*", long_ago, now_ms),), False, (("10.0.2.6", 0),)),
        Group(
            "G_bcast_B",
            1,
            (("*", long_ago, now_ms),),
            True,
            (("10.0.1.1", 0), ("10.0.1.2", 0), ("10.0.1.3", 3 * SEC)),
        ),
        Group(
            "G_chg_C",
            2,
            (("TagX", long_ago, mid), ("TagY", mid, now_ms)),
            False,
            (("10.0.2.7", 0), ("10.0.2.8", 0)),
        ),
        Group("G_silent_C", 2, (("TagZ", long_ago, now_ms),), True, (), consumes=False),
        Group("G_rogue", -1, (), False, (("10.0.9.9", 0),)),
    ]


def subscription_rows(groups: Sequence[Group]) -> list[dict[str, Any]]:
    """The subscription history as ``RegistryReader.subscription_history()`` returns it."""
    rows: list[dict[str, Any]] = []
    for g in groups:
        for expression, first, last in g.rows:
            rows.append(
                {
                    "group": g.name,
                    "topic": TOPICS[g.topic],
                    "expression": expression,
                    "message_model": "BROADCASTING" if g.broadcasting else "CLUSTERING",
                    "first_seen": int(first),
                    "last_seen": int(last),
                }
            )
        if g.rows and not g.broadcasting:  # clustering consumers also subscribe their retry topic
            rows.append(
                {
                    "group": g.name,
                    "topic": f"%RETRY%{g.name}",
                    "expression": "*",
                    "message_model": "CLUSTERING",
                    "first_seen": int(g.rows[0][1]),
                    "last_seen": int(g.rows[-1][2]),
                }
            )
    return sorted(rows, key=lambda r: (r["group"], r["topic"], r["first_seen"]))


def _tag_matches(expression: str, tags: np.ndarray, topic: int) -> np.ndarray:
    """Per message tag code (within ``topic``): does ``expression`` accept it?"""
    expr = expression.strip()
    if expr in ("", "*"):
        return np.ones(len(tags), dtype=bool)
    wanted = {t.strip() for t in expr.split("||")}
    ok_codes = [i for i, t in enumerate(TAGS[topic]) if t is not None and t in wanted]
    return np.isin(tags, ok_codes)
