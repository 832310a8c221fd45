"""The trace view built from raw events: producer, broker retries as attempts of one group,
the move to the dead-letter queue, transactions, old SubAfters without a group."""

from __future__ import annotations

from itertools import count
from typing import Any

from tracemq.message_id import encode_offset_msg_id
from tracemq_collector.view import build_view

MSG = "C0A8000100002A9F0000000000000001"
_offsets = count()


def ev(trace_type: str, ts: int, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "trace_type": trace_type,
        "timestamp": ts,
        "trace_topic": "RMQ_SYS_TRACE_TOPIC",
        "trace_partition": 0,
        "trace_offset": next(_offsets),
        "trace_index": 0,
        "msg_id": MSG,
        "group_name": None,
        "topic": None,
        "success": True,
        "request_id": None,
        "retry_times": None,
        "cost_time": 0,
        "context_code": None,
        "client_host": "10.0.0.2",
        "store_host": None,
        "msg_type": None,
        "offset_msg_id": None,
        "region_id": "DefaultRegion",
        "transaction_id": None,
        "transaction_state": None,
        "from_transaction_check": None,
    }
    base.update(kw)
    return base


def attempt(group: str, req: str, begin: int, retry: int, ok: bool, code: int) -> list[dict]:
    return [
        ev("SubBefore", begin, group_name=group, request_id=req, retry_times=retry),
        ev("SubAfter", begin + 3, group_name=group, request_id=req, success=ok,
           cost_time=3, context_code=code),
    ]  # fmt: skip


def test_retries_are_attempts_of_one_group_and_the_dlq_move_is_not_the_producer() -> None:
    events = [
        ev("Pub", 1000, group_name="PG", topic="Orders", cost_time=2, msg_type=0,
           store_host="10.0.0.1:9876"),
        *attempt("CG", "r0", 1010, 0, False, 4),
        *attempt("CG", "r1", 11010, 1, False, 2),
        *attempt("CG", "r2", 41010, 2, False, 4),
        ev("Pub", 41020, group_name="CG", topic="%DLQ%CG", cost_time=1, msg_type=0),
        *attempt("Other", "o0", 1020, 0, True, 0),
    ]  # fmt: skip
    view = build_view(MSG, list(reversed(events)))  # the order they come in does not matter
    assert view["topic"] == "Orders"
    assert view["producer"]["group"] == "PG" and view["producer"]["send_attempts"] == 1
    assert view["dead_letters"] == [
        {"timestamp": 41020, "group": "CG", "topic": "%DLQ%CG", "success": True,
         "client_host": "10.0.0.2", "client_id": None}
    ]  # fmt: skip
    cg, other = view["consumers"]
    assert (cg["group"], cg["dead_lettered"]) == ("CG", True)
    assert [(a["retry_times"], a["status"], a["context_code_name"]) for a in cg["attempts"]] == [
        (0, "failed", "FAILED"),
        (1, "failed", "EXCEPTION"),
        (2, "failed", "FAILED"),
    ]
    assert (other["group"], other["dead_lettered"]) == ("Other", False)
    assert [a["status"] for a in other["attempts"]] == ["success"]
    assert len(view["events"]) == len(events)


def test_delayed_and_transactional_messages() -> None:
    events = [
        ev("Pub", 1000, group_name="PGtx", topic="Pay", msg_type=1),
        ev("EndTransaction", 1005, group_name="PGtx", topic="Pay", msg_type=2,
           transaction_id=MSG, transaction_state="COMMIT_MESSAGE", from_transaction_check=False),
        *attempt("CG", "r0", 1100, 0, True, 0),
    ]  # fmt: skip
    view = build_view(MSG, events)
    assert view["producer"]["msg_type_name"] == "Trans_Msg_Half"
    assert [(t["transaction_state"], t["msg_type_name"]) for t in view["transactions"]] == [
        ("COMMIT_MESSAGE", "Trans_msg_Commit")
    ]
    assert view["dead_letters"] == []
    delayed = build_view(MSG, [ev("Pub", 5, group_name="PG", topic="T", msg_type=3)])
    assert delayed["producer"]["msg_type_name"] == "Delay_Msg" and delayed["consumers"] == []


def test_subafter_without_group_pairs_by_request_id_and_lone_before_is_unknown() -> None:
    events = [
        ev("SubBefore", 10, group_name="CG", request_id="a", retry_times=0),
        ev("SubAfter", 20, group_name=None, request_id="a", cost_time=10, context_code=None),
        ev("SubBefore", 30, group_name="CG", request_id="b", retry_times=1),
    ]
    view = build_view(MSG, events)
    assert view["producer"] is None
    (cg,) = view["consumers"]
    assert [(a["begin"], a["end"], a["status"]) for a in cg["attempts"]] == [
        (10, 20, "success"),
        (30, None, "unknown"),
    ]


def test_repeated_consume_and_pub_events_are_not_extra_attempts() -> None:
    # The same events carried by two trace messages (a trace send repeated without an
    # idempotency key, e.g. by a RocketMQ client), so at other trace offsets.
    pub = dict(group_name="PG", topic="Orders", cost_time=2, msg_type=0, store_host="h:1")
    once = [ev("Pub", 1000, **pub), *attempt("CG", "r0", 1010, 0, False, 4),
            *attempt("CG", "r1", 11010, 1, True, 0)]  # fmt: skip
    again = [ev("Pub", 1000, **pub), *attempt("CG", "r0", 1010, 0, False, 4),
             *attempt("CG", "r1", 11010, 1, True, 0), *attempt("CG", "r1", 11010, 1, True, 0)]  # fmt: skip
    view = build_view(MSG, once + again)
    (group,) = view["consumers"]
    assert [(a["request_id"], a["status"]) for a in group["attempts"]] == [
        ("r0", "failed"),
        ("r1", "success"),
    ]
    assert view["producer"]["send_attempts"] == 1
    # A real second send of the msgId (its own timestamp) is still a second attempt.
    resend = build_view(MSG, [*once, ev("Pub", 1500, **pub)])
    assert resend["producer"]["send_attempts"] == 2


def _end_tx(ts: int, state: str, *, check: bool = False) -> dict[str, Any]:
    return ev("EndTransaction", ts, group_name="PG", topic="Orders", msg_type=1,
              transaction_id="tx1", transaction_state=state, from_transaction_check=check)  # fmt: skip


def test_the_view_says_where_a_transactional_or_delayed_message_is_expected() -> None:
    half = ev("Pub", 1000, group_name="PG", topic="Orders", msg_type=1)
    rolled = build_view(MSG, [half, _end_tx(1005, "ROLLBACK_MESSAGE")])["delivery"]
    assert rolled["state"] == "rolled_back" and rolled["expect_consumers"] is False
    # A check-back's decision after an UNKNOW decides; the last decision wins.
    committed = build_view(
        MSG, [half, _end_tx(1005, "UNKNOW"), _end_tx(9000, "COMMIT_MESSAGE", check=True)]
    )["delivery"]
    assert committed == {
        "state": "committed", "expect_consumers": True, "decided_at": 9000,
        "from_transaction_check": True,
    }  # fmt: skip
    for unresolved in ([half], [half, _end_tx(1005, "UNKNOW")]):
        assert build_view(MSG, unresolved)["delivery"] == {
            "state": "half",
            "expect_consumers": False,
        }
    # Delay level 3 (10 s): the record waits in queue 2 of the schedule topic.
    where = encode_offset_msg_id("10.0.0.1:10911", 2, 77)
    delayed = build_view(
        MSG, [ev("Pub", 1000, group_name="PG", topic="Orders", msg_type=3, offset_msg_id=where)]
    )["delivery"]
    assert delayed["state"] == "delayed" and delayed["delay_level"] == 3
    assert delayed["due_time"] == 11_000
    normal = build_view(MSG, [ev("Pub", 1000, group_name="PG", topic="Orders", msg_type=0)])
    assert normal["delivery"] == {"state": "normal", "expect_consumers": True}
    assert (
        build_view(MSG, [ev("SubBefore", 5, group_name="CG", request_id="r")])["delivery"]["state"]
        == "unknown"
    )


def test_an_old_sub_after_without_timestamp_ends_at_begin_plus_cost() -> None:
    # rows as the collector stores them: a 7-field SubAfter has no timestamp, so its event
    # time is the ingest time, 4.4 s after an 11 ms consume
    from tracemq_collector.events import rows_from_record

    begin = 1_704_164_645_123
    ingest = begin + 4_400
    s, e = "\x01", "\x02"
    before = s.join(["SubBefore", str(begin), "R", "CG", "req-7", MSG, "0", "k"]) + e
    old_after = s.join(["SubAfter", "req-7", MSG, "11", "true", "k", "0"]) + e
    new_after = s.join(["SubAfter", "req-9", MSG, "11", "true", "k", "0", str(begin + 20), "CG"])
    new_before = s.join(["SubBefore", str(begin + 5), "R", "CG", "req-9", MSG, "1", "k"]) + e
    value = (before + old_after + new_before + new_after + e).encode()
    rows, quarantine = rows_from_record("RMQ_SYS_TRACE_TOPIC", 0, 1, value, ingest)
    assert quarantine == [] and len(rows) == 4
    (cg,) = build_view(MSG, rows)["consumers"]
    assert [(a["request_id"], a["begin"], a["end"], a["cost_time"]) for a in cg["attempts"]] == [
        ("req-7", begin, begin + 11, 11),
        ("req-9", begin + 5, begin + 20, 11),  # a record's own timestamp is kept
    ]
    # events without their record (from an older peer): the ingest time tells the same
    for r in rows:
        del r["record"]
    (cg,) = build_view(MSG, rows)["consumers"]
    assert [a["end"] for a in cg["attempts"]] == [begin + 11, begin + 20]


def test_a_recalled_delayed_message_is_expected_nowhere() -> None:
    where = encode_offset_msg_id("10.0.0.1:10911", 2, 77)
    pub = ev("Pub", 1000, group_name="PG", topic="Orders", msg_type=3, offset_msg_id=where)
    refused = ev("Recall", 1500, group_name="PG", topic="Orders", success=False)
    # a refused recall (too late, unknown) changes nothing: still delayed, expected
    view = build_view(MSG, [pub, refused])
    assert view["delivery"]["state"] == "delayed"
    assert view["recalls"] == [
        {"timestamp": 1500, "group": "PG", "success": False, "result": "not recalled",
         "region_id": "DefaultRegion"},
    ]  # fmt: skip
    recalled = ev("Recall", 2000, group_name="PG", topic="Orders", success=True)
    repeat = ev("Recall", 2500, group_name="PG", topic="Orders", success=True)
    view = build_view(MSG, [pub, refused, recalled, repeat])
    assert view["delivery"] == {
        "state": "recalled", "expect_consumers": False, "recalled_at": 2000,
        "recalled_by": "PG", "delay_level": 3, "due_time": 11_000,
        "due_time_basis": "default delay levels",
    }  # fmt: skip
    assert [r["result"] for r in view["recalls"]] == ["not recalled", "recalled", "recalled"]
    # a Recall record alone (its Pub trace lost): still recalled, expected nowhere
    alone = build_view(MSG, [recalled])["delivery"]
    assert (alone["state"], alone["expect_consumers"]) == ("recalled", False)


def test_trace_show_lists_the_recalls() -> None:
    from rich.console import Console
    from tracemq.cli.trace import trace_table

    pub = ev("Pub", 1000, group_name="PG", topic="Orders", msg_type=3, cost_time=2)
    recall = ev("Recall", 2000, group_name="PG", topic="Orders", success=True)
    console = Console(width=160, record=True)
    console.print(trace_table(build_view(MSG, [pub, recall])))
    rows = [line for line in console.export_text().splitlines() if "Recall" in line]
    assert len(rows) == 1 and "PG" in rows[0] and "recalled" in rows[0]
