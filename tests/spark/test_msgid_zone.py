"""The job's msgId creation rule (Spark columns) is the library's ``msg_id_created_ms``: one
definition, checked on ids made in four zones at and around each zone's local month starts
(DST changes included), IPv4 and IPv6, read at many reference times."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from tracemq.message_id import MessageIdGenerator, msg_id_created_ms
from tracemq_spark.classify import _msg_id_created
from tracemq_spark.job import Params, ReconcileError

ZONES = ("UTC", "Asia/Shanghai", "America/Los_Angeles", "Europe/Berlin")
DAY = 86_400_000
#: months whose starts (and the DST changes near them) are probed: LA's 1 November 2026 is a
#: DST change day; March/October hold the European and American changes
MONTHS = ((2024, 1), (2024, 3), (2024, 4), (2024, 11), (2026, 10), (2026, 11), (2026, 12))
AROUND = (-DAY, -3_600_000, -1000, -1, 0, 1, 1000, 3_600_000, 5 * DAY)
#: reader's clock relative to the creation: the id ahead of the reader by up to a day (and
#: past it), just made, and read weeks later
READ_AT = (-DAY - 1, -DAY, -1, 0, 1, 3_600_000, DAY, 20 * DAY, 27 * DAY)


def _cases(zone: str) -> list[tuple[str, int, int, int]]:
    """(msg_id, ref_ts, expected created, offset) for ids made in ``zone``."""
    z = ZoneInfo(zone)
    rows = []
    for i, (year, month) in enumerate(MONTHS):
        start = int(datetime(year, month, 1, tzinfo=z).timestamp() * 1000)
        for d in AROUND:
            made = start + d
            ip = "fd00::3:2" if (i + d) % 2 else "10.0.3.1"
            msg_id = MessageIdGenerator(ip, clock=lambda m=made: m, tz=z).next()
            offset = int(msg_id[-12:-4], 16)
            for r in READ_AT:
                ref = made + r
                rows.append((msg_id, ref, msg_id_created_ms(offset, ref, z), made))
    return rows


@pytest.mark.parametrize("zone", ZONES)
def test_spark_rule_is_the_library_rule(spark: Any, zone: str) -> None:
    from pyspark.sql import functions as F

    cases = _cases(zone)
    assert any(len(c[0]) == 56 for c in cases) and any(len(c[0]) == 32 for c in cases)
    df = spark.createDataFrame(
        [(i, c[0], c[1]) for i, c in enumerate(cases)], "i long, msg_id string, ref long"
    )
    got = {
        r.i: r.created
        for r in df.select(
            "i", _msg_id_created(F.col("msg_id"), F.col("ref"), zone).alias("created")
        ).collect()
    }
    wrong = [(c, got[i]) for i, c in enumerate(cases) if got[i] != c[2]]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, e.g. {wrong[:5]}"
    # and exact: read from when it was made to 20 days later, an id decodes to that instant
    exact = [(c, got[i]) for i, c in enumerate(cases) if 0 <= c[1] - c[3] <= 20 * DAY]
    assert len(exact) > len(cases) // 2
    assert all(g == c[3] for c, g in exact), [x for x in exact if x[1] != x[0][3]][:5]


def test_non_ids_have_no_creation_time(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [("",), ("XYZ",), ("0" * 31,), ("0" * 40,), ("0" * 57,), (None,)], "msg_id string"
    )
    rows = df.select(_msg_id_created(F.col("msg_id"), F.lit(0), "Asia/Shanghai").alias("c"))
    assert [r.c for r in rows.collect()] == [None] * 6


def test_unknown_zone_is_refused() -> None:
    p = Params(
        lake="l",
        out="o",
        from_ms=0,
        to_ms=1,
        subscriptions="",
        offsets="",
        msgid_timezone="Mars/Olympus",
    )
    with pytest.raises(ReconcileError, match="--msgid-timezone.*Mars/Olympus"):
        p.validate()
