"""The reconcile command's time and duration parsing (absolute, epoch ms, relative to now)."""

from __future__ import annotations

import pytest
from tracemq_spark.cli import parse_duration, parse_time
from tracemq_spark.job import ReconcileError

NOW = 1_715_673_600_000  # 2024-05-14T08:00:00Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-14T08:00:00Z", NOW),
        ("2024-05-14T10:00+02:00", NOW),
        ("2024-05-14T08:00", NOW),
        (str(NOW), NOW),
        ("now", NOW),
        ("-1h", NOW - 3_600_000),
        ("now-90m", NOW - 5_400_000),
        ("now - 1h30m", NOW - 5_400_000),
    ],
)
def test_times(text: str, expected: int) -> None:
    assert parse_time(text, "--from", NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "-1y", "now+1h", "", "2024-13-01"])
def test_bad_times_name_the_option(text: str) -> None:
    with pytest.raises(ReconcileError, match="--from"):
        parse_time(text, "--from", NOW)


def test_durations() -> None:
    assert parse_duration("1h30m", "--horizon") == 5_400_000
    assert parse_duration("500ms", "--horizon") == 500
    with pytest.raises(ReconcileError, match="--horizon: 'soon'"):
        parse_duration("soon", "--horizon")


def test_broadcast_offsets_are_one_row_per_client_host() -> None:
    """Several broadcasting instances on one host (issue 22, point 1: pid-named instances)
    give the reconciliation one offset per host: the furthest."""
    from tracemq_spark.inputs import per_client_host

    def row(host: str, committed: int | None, queue: int = 0) -> dict:
        return {"group": "G", "topic": "T", "broker": "b", "store_addr": "1.2.3.4:1",
                "queue_id": queue, "committed": committed, "client_host": host}  # fmt: skip

    rows = [row("10.0.0.1", 5), row("10.0.0.1", None), row("10.0.0.1", 9), row("10.0.0.2", 1),
            row("10.0.0.1", 2, queue=1), {**row("", 7), "client_host": None}]  # fmt: skip
    assert sorted((r["client_host"], r["queue_id"], r["committed"]) for r in per_client_host(rows)
                  if r["client_host"]) == [("10.0.0.1", 0, 9), ("10.0.0.1", 1, 2),
                                           ("10.0.0.2", 0, 1)]  # fmt: skip
    assert sum(1 for r in per_client_host(rows) if not r["client_host"]) == 1
