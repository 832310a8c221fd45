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
