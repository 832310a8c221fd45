"""The offsets snapshot's retry / dead-letter copies: parsed strictly, reduced per (message,
group) to the last delivery — the copy with the highest reconsume count — and its queue's
committed offset."""

from __future__ import annotations

import json

import pytest
from tracemq_spark.job import ReconcileError, last_deliveries, parse_copies, parse_offsets

A = "10.0.0.1:10911"


def _copy(topic: str, offset: int, reconsume: int, msg_id: str = "M1") -> dict[str, object]:
    return {
        "group": "G",
        "topic": topic,
        "store_addr": A,
        "queue_id": 0,
        "queue_offset": offset,
        "msg_id": msg_id,
        "reconsume_times": reconsume,
    }


def _snapshot(copies: list[dict[str, object]], committed: int | None) -> str:
    offsets = [
        {"group": "G", "topic": "%RETRY%G", "store_addr": A, "queue_id": 0, "committed": committed}
    ]
    return json.dumps({"offsets": offsets, "copies": copies})


def test_the_last_retry_copy_decides_with_its_queue_committed_offset() -> None:
    text = _snapshot(
        [
            _copy("%RETRY%G", 7, 1),
            _copy("%RETRY%G", 19, 3),
            _copy("%RETRY%G", 19, 3),  # read twice: one copy
            _copy("%RETRY%G", 12, 2),
            _copy("%RETRY%G", 4, 1, msg_id="M2"),
            _copy("%DLQ%G", 0, 4, msg_id="M3"),
        ],
        committed=15,
    )
    copies = parse_copies(text)
    assert len(copies) == 5
    d = {x.msg_id: x for x in last_deliveries(copies, parse_offsets(text))}
    assert (d["M1"].retry_reconsume, d["M1"].retry_queue_offset) == (3, 19)
    assert d["M1"].retry_committed == 15  # not past offset 19: the last retry is not done
    assert (d["M2"].retry_queue_offset, d["M2"].retry_committed) == (4, 15)
    assert d["M3"].retry_reconsume is None and d["M3"].dlq_queue_offset == 0


def test_a_snapshot_without_copies_knows_none() -> None:
    assert parse_copies(json.dumps({"offsets": []})) == []
    assert parse_copies(json.dumps([])) == []


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({**_copy("TopicA", 1, 1)}, "not a %RETRY% or %DLQ% topic"),
        ({**_copy("%RETRY%G", 1, 1), "queue_offset": "x"}, "copies row 0 is malformed"),
        ({k: v for k, v in _copy("%RETRY%G", 1, 1).items() if k != "store_addr"}, "store_addr"),
    ],
)
def test_malformed_copies_are_named(row: dict[str, object], needle: str) -> None:
    with pytest.raises(ReconcileError, match="copies row 0") as err:
        parse_copies(json.dumps({"offsets": [], "copies": [row]}), "offsets.json")
    assert needle in str(err.value) and "offsets.json" in str(err.value)
