"""Group health's pure parts (issue 15, points 13 and 14): what the trace events count as,
how collectors' parts add up, and a message's outcome per group."""

from __future__ import annotations

from typing import Any

from tracemq.cli.group import age
from tracemq_collector.groups import (
    UNKNOWN_TOPIC,
    Activity,
    group_outcomes,
    summarize_activity,
)

M = 1_700_000_040_000  # a minute boundary


def ev(kind: str, t: int, **kw: Any) -> dict[str, Any]:
    return {"trace_type": kind, "timestamp": t, "msg_topic": "T", **kw}


def test_what_each_consume_event_counts_as() -> None:
    part = summarize_activity(
        [
            ev("SubBefore", M + 1, group_name="g", retry_times=0),  # first delivery: no count
            ev("SubAfter", M + 2, group_name="g", success=False),
            ev("SubBefore", M + 3, group_name="g", retry_times=1),  # a retry delivery
            ev("SubAfter", M + 4, group_name="g", success=True),
            ev("Pub", M + 5, topic="%DLQ%g", success=True),
            ev("Pub", M + 6, topic="%DLQ%g", success=False),  # the move failed: not dead
            ev("Pub", M + 7, topic="T", success=True),  # a producer's send: not ours
            ev("SubAfter", M + 8, group_name=None, success=True),  # old record: no group
            ev("SubAfter", M + 60_001, group_name="g", success=True, msg_topic=None),
        ]
    )
    assert part["buckets"] == [
        {"group": "g", "topic": "?", "minute": M + 60_000, "consumed": 1, "failed": 0,
         "retried": 0, "dead_lettered": 0},
        {"group": "g", "topic": "T", "minute": M, "consumed": 1, "failed": 1, "retried": 1,
         "dead_lettered": 1},
    ]  # fmt: skip
    assert {(r["topic"], r["timestamp"]) for r in part["last_consume"]} == {
        ("T", M + 4),
        ("?", M + 60_001),
    }


def test_collectors_parts_add_up_and_unknown_topics_go_to_the_only_subscription() -> None:
    a = summarize_activity([ev("SubAfter", M + 1, group_name="g", success=True)])
    b = summarize_activity(
        [
            ev("SubAfter", M + 2, group_name="g", success=True),
            ev("SubAfter", M + 9, group_name="g", success=False, msg_topic=None),
        ]
    )
    act = Activity()
    act.add(a)
    act.add({**b, "truncated": True})
    assert act.buckets[("g", "T", M)]["consumed"] == 2 and act.truncated
    act.reassign_unknown("g", "T")
    assert act.buckets[("g", "T", M)] == {
        "consumed": 2, "failed": 1, "retried": 0, "dead_lettered": 0,
    }  # fmt: skip
    assert ("g", UNKNOWN_TOPIC, M) not in act.buckets
    assert act.last[("g", "T")] == M + 9


def test_outcome_per_group() -> None:
    view = {
        "consumers": [
            {"group": "ok", "attempts": [{"status": "failed"}, {"status": "success"}]},
            {"group": "retrying", "attempts": [{"status": "failed"}]},
            {"group": "dead", "attempts": [{"status": "failed"}, {"status": "failed"}]},
            {"group": "running", "attempts": [{"status": "unknown"}]},
        ],
        "dead_letters": [{"group": "dead", "success": True}],
    }
    got = {o["group"]: (o["outcome"], o["attempts"]) for o in group_outcomes(view, ["ok", "idle"])}
    assert got == {
        "ok": ("consumed", 2),
        "retrying": ("retried", 1),
        "dead": ("dead_lettered", 2),
        "running": ("pending", 1),
        "idle": ("pending", 0),
    }
    # no trace at all yet: every expected group is pending
    assert group_outcomes({}, ["a"]) == [{"group": "a", "outcome": "pending", "attempts": 0}]


def test_age_cells() -> None:
    assert [age(None), age(850), age(42_000), age(425_000), age(11_520_000)] == [
        "-", "850ms", "42s", "7m05s", "3h12m",
    ]  # fmt: skip


def test_lag_samples_keep_one_hour_and_the_last_of_each_minute() -> None:
    from tracemq_collector.groups import GroupHealth, TopicOffsets

    # every 20 minutes: an hour is 3 samples (+1 so that the hour's first minute has one)
    health = GroupHealth(None, None, "tmq:", sample_interval_s=1200, max_events=10)  # type: ignore[arg-type]
    for i, lag in enumerate([5, 6, 7, 8, 9]):
        offs = [TopicOffsets("T", [], lag, {"timestamp": M - 1000} if lag else None)]
        health._record("g", M + i * 20_000, offs)  # three samples in minute M, two in M+1
    assert len(health.samples["g"]) == 4
    assert health._minute_samples("g", "T") == {
        M: (7, 2 * 20_000 + 1000),
        M + 60_000: (9, 4 * 20_000 + 1000),
    }
    assert health._minute_samples("g", "other") == {}


async def test_activity_adds_peers_parts_and_names_a_bad_peer() -> None:
    from tracemq_collector.groups import GroupHealth
    from tracemq_collector.queries import PeerFailure

    mine = summarize_activity([ev("SubAfter", M + 1, group_name="g", success=True)])
    answers: dict[str, Any] = {
        "http://good": summarize_activity([ev("SubAfter", M + 2, group_name="g", success=False)]),
        "http://bad": {"buckets": [{"group": "g", "topic": "T", "minute": "soon"}]},
        "http://down": PeerFailure("timeout", "no answer"),
    }

    class FakeQueries:  # the fan-out's two calls; this collector's own part is set below
        async def peers(self) -> tuple[list[str], list[dict[str, str]]]:
            return list(answers), []

        async def _peer_get(self, url: str, path: str, params: dict[str, str]) -> Any:
            assert path == "/api/v1/groups-activity" and params["group"] == "g"
            if isinstance(answers[url], Exception):
                raise answers[url]
            return answers[url]

    health = GroupHealth(FakeQueries(), None, "tmq:", sample_interval_s=60, max_events=10)  # type: ignore[arg-type]

    async def local(*_: Any) -> Any:
        return {**mine, "truncated": False}

    health.local_activity = local  # type: ignore[method-assign]
    act, failed = await health.activity(M, M + 60_000, "g")
    assert act.buckets[("g", "T", M)] == {
        "consumed": 1, "failed": 1, "retried": 0, "dead_lettered": 0,
    }  # fmt: skip
    assert sorted((f["peer"], f["reason"]) for f in failed) == [
        ("http://bad", "malformed"),
        ("http://down", "timeout"),
    ]


def test_a_topic_without_route_has_an_unknown_lag_not_zero() -> None:
    from tracemq_collector.groups import GroupHealth, TopicOffsets

    health = GroupHealth(None, None, "tmq:", sample_interval_s=60, max_events=10)  # type: ignore[arg-type]
    sub = {"topics": {"T": "*"}, "message_model": "CLUSTERING", "last_seen": M}
    view = health._group_view(
        "g", sub, ([TopicOffsets("T", [], None, None)], None, 0), Activity(), M + 1
    )
    assert view["state"] == "unknown" and view["topics"][0]["lag"] is None
    assert "no route for T" in view["offsets_note"]
    routed = health._group_view(
        "g", sub, ([TopicOffsets("T", [], 4, None)], None, 0), Activity(), M + 1
    )
    assert (routed["state"], routed["lag"], routed["offsets_note"]) == ("stopped", 4, None)
