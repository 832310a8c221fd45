"""Pure logic of the schedule and transaction services: delay-level parsing, settings, journals,
the transaction protocol, and the transaction service's bookkeeping of half and end records
(duplicates, garbage, end records before their half, checkpoint round trip)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiokafka.structs import ConsumerRecord
from tracemq.errors import ConfigError
from tracemq.message import MessageExt, MessageQueue
from tracemq.protocol import transaction as txp
from tracemq.protocol._envelope import ProtocolError
from tracemq.settings import load_settings
from tracemq_broker.delay_levels import DEFAULT_DELAY_LEVELS, parse_delay_levels
from tracemq_broker.forward import parse_target
from tracemq_broker.journal import from_ranges, read_json, to_ranges, write_json
from tracemq_broker.settings import BrokerSettings
from tracemq_broker.transaction import TransactionService


def test_default_delay_levels_are_rocketmqs() -> None:
    ms = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert len(ms) == 18
    assert ms[:5] == [1000, 5000, 10_000, 30_000, 60_000] and ms[-1] == 7_200_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100ms 1s 2m 1h 1d", [100, 1000, 120_000, 3_600_000, 86_400_000]),
        ("  1s,2s ,3s ", [1000, 2000, 3000]),
        ("5S", [5000]),
    ],
)
def test_delay_levels_parse(text: str, expected: list[int]) -> None:
    assert parse_delay_levels(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no delay level"),
        ("1s 5x", "delay level 2 is '5x'"),
        ("0s", "delay level 1 is '0s'"),
        ("1.5s", "delay level 1"),
        ("-1s", "delay level 1"),
    ],
)
def test_bad_delay_levels_name_the_level(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_delay_levels(text)


def test_broker_settings_for_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(BrokerSettings)
    assert s.runs_schedule and s.runs_transactions and len(s.delay_levels_ms) == 18
    assert s.broker_transaction_timeout_ms == 6000 and s.broker_transaction_check_max == 15
    monkeypatch.setenv("TRACEMQ_BROKER_ROLE", "trace")
    s = load_settings(BrokerSettings)
    assert not s.runs_schedule and not s.runs_transactions
    monkeypatch.setenv("TRACEMQ_BROKER_SCHEDULE_ENABLE", "true")
    monkeypatch.setenv("TRACEMQ_BROKER_DELAY_LEVELS", "100ms 200ms")
    s = load_settings(BrokerSettings)
    assert s.runs_schedule and s.delay_levels_ms == [100, 200]


@pytest.mark.parametrize(
    ("var", "val"),
    [
        ("TRACEMQ_BROKER_DELAY_LEVELS", "1s soon"),
        ("TRACEMQ_BROKER_TRANSACTION_TIMEOUT_MS", "0"),
        ("TRACEMQ_BROKER_TRANSACTION_CHECK_MAX", "-1"),
        ("TRACEMQ_BROKER_SCHEDULE_ENABLE", "perhaps"),
    ],
)
def test_bad_service_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, val: str
) -> None:
    monkeypatch.setenv(var, val)
    with pytest.raises(ConfigError) as info:
        load_settings(BrokerSettings)
    assert var in str(info.value) and repr(val) in str(info.value)


def test_offset_ranges_round_trip() -> None:
    offsets = {1, 2, 3, 7, 9, 10}
    assert to_ranges(offsets) == [[1, 3], [7, 7], [9, 10]]
    assert from_ranges(to_ranges(offsets)) == offsets
    assert to_ranges(set()) == []


async def test_journal_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    assert read_json(path) is None
    await write_json(path, {"next": 3})
    assert read_json(path) == {"version": 1, "next": 3}
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_json(path)
    path.write_text('{"version": 9}')
    with pytest.raises(ValueError, match="unknown state format 9"):
        read_json(path)


def test_parse_target() -> None:
    assert parse_target({"REAL_TOPIC": "%RETRY%g", "REAL_QID": "0"}) == ("%RETRY%g", 0)
    for headers, message in [
        ({}, "no REAL_TOPIC"),
        ({"REAL_TOPIC": "a b", "REAL_QID": "0"}, "illegal characters"),
        ({"REAL_TOPIC": "T", "REAL_QID": "x"}, "not an integer"),
        ({"REAL_TOPIC": "T", "REAL_QID": "-1"}, "negative"),
        ({"REAL_TOPIC": "T"}, "not an integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_target(headers)


def test_transaction_protocol_round_trip_and_errors() -> None:
    end = txp.EndTransaction(half_offset=4, msg_id="A" * 32, state="COMMIT_MESSAGE", group="g")
    assert txp.decode_end(txp.encode(end)) == end
    check = txp.CheckRequest(
        broker="b",
        group="g",
        half_offset=4,
        msg_id="A" * 32,
        data_bootstrap="k:9",
        topic="T",
        body=b"\xff\x00 binary",
        properties={"TAGS": "x"},
    )
    assert txp.decode_check(txp.encode(check)) == check
    cases = [
        (b"", "garbage"),
        (b"\xc1", "garbage"),
        (msgpack.packb({"v": 2, "type": "tx.end"}), "version"),
        (msgpack.packb({"v": 1, "type": "tx.check"}), "type"),
        (msgpack.packb({"v": 1, "type": "tx.end", "half_offset": -1}), "schema"),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "type": "tx.end",
                    "half_offset": 1,
                    "msg_id": "m",
                    "state": "MAYBE",
                    "group": "g",
                }
            ),
            "schema",
        ),
    ]
    for data, kind in cases:
        with pytest.raises(ProtocolError) as info:
            txp.decode_end(data)
        assert info.value.kind == kind


# -- the transaction service's bookkeeping, without Kafka --------------------------------------


def _service(tmp_path: Path) -> TransactionService:
    async def resolve(topic: str, qid: int) -> tuple[str, int] | None:
        return (f"b.{topic}", qid)

    async def send_check(key: bytes, value: bytes) -> None:
        return None

    return TransactionService(
        broker_name="b",
        bootstrap="k:9",
        state_path=tmp_path / "state.json",
        resolve=resolve,
        send_check=send_check,
        timeout_ms=6000,
        check_interval_ms=30_000,
        check_max=15,
        broker_address="h:1",
        region_id="R",
    )


def _rec(
    offset: int, value: bytes | None, headers: dict[str, str] | None = None, timestamp: int = 1
) -> Any:
    return ConsumerRecord(
        topic="t",
        partition=0,
        offset=offset,
        timestamp=timestamp,
        timestamp_type=0,
        key=None,
        value=value,
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=0,
        headers=[(k, v.encode()) for k, v in (headers or {}).items()],
    )


def _half(offset: int, msg_id: str) -> Any:
    return _rec(
        offset,
        b"body",
        {"UNIQ_KEY": msg_id, "PGROUP": "g", "TRAN_MSG": "true", "REAL_TOPIC": "T", "REAL_QID": "1"},
    )


def _end(offset: int, half: int, msg_id: str, state: str) -> Any:
    rec = txp.EndTransaction(half_offset=half, msg_id=msg_id, state=state, group="g")  # type: ignore[arg-type]
    return _rec(offset, txp.encode(rec))


async def test_transaction_bookkeeping(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    svc._on_half(_half(0, "M0"))
    svc._on_half(_half(1, "M1"))
    svc._on_half(_rec(2, b"x"))  # garbage half: resolved at once, never pending
    svc._on_half(_half(3, "M3"))
    assert list(svc.pending) == [0, 1, 3] and 2 in svc.resolved
    svc._on_op(_rec(0, b"garbage"))
    svc._on_op(_end(1, 0, "WRONG", "COMMIT_MESSAGE"))  # msgId mismatch: ignored
    svc._on_op(_end(2, 0, "M0", "COMMIT_MESSAGE"))
    svc._on_op(_end(3, 0, "M0", "ROLLBACK_MESSAGE"))  # too late: first decision wins
    svc._on_op(_end(4, 1, "M1", "UNKNOW"))  # changes nothing
    svc._on_op(_end(5, 1, "M1", "ROLLBACK_MESSAGE"))
    svc._on_op(_end(6, 1, "M1", "COMMIT_MESSAGE"))  # duplicate after rollback
    svc._on_op(_end(7, 5, "M5", "COMMIT_MESSAGE"))  # before its half
    svc._on_op(_end(8, 2, "M2", "COMMIT_MESSAGE"))  # the garbage half: nothing to commit
    assert [h.offset for h in svc._to_commit] == [0]
    assert 1 in svc.resolved and 1 not in svc.pending
    assert svc.early == {5: {"state": "COMMIT_MESSAGE", "msg_id": "M5"}}
    assert svc.op_next == 9 and svc.half_low == 0
    # a checkpoint now: the undelivered commit of M0 is saved like an early end record
    await svc._save()
    state = read_json(tmp_path / "state.json")
    assert state is not None
    assert state["half_low"] == 0 and state["op_next"] == 9 and state["intent"] is None
    assert state["early"]["0"] == {"state": "COMMIT_MESSAGE", "msg_id": "M0"}
    assert state["early"]["5"]["msg_id"] == "M5"
    assert from_ranges(state["resolved"]) == {1, 2}

    # a restarted service re-reads from half_low and applies what the checkpoint remembers
    svc2 = _service(tmp_path)
    await svc2._load({svc2.half_tp: 0, svc2.op_tp: 0}, {svc2.half_tp: 6, svc2.op_tp: 9})
    assert svc2.half_next == 0 and svc2.op_next == 9
    for off, mid in ((0, "M0"), (1, "M1"), (2, None), (3, "M3"), (4, "M4"), (5, "M5")):
        svc2._on_half(_half(off, mid) if mid else _rec(off, b"x"))
    assert sorted(h.offset for h in svc2._to_commit) == [0, 5]
    assert sorted(svc2.pending) == [0, 3, 4, 5]  # 1 rolled back, 2 garbage
    # the end records replayed from op_next would be duplicates: skipped
    svc2._on_op(_end(9, 1, "M1", "COMMIT_MESSAGE"))
    assert 1 not in svc2.pending


def test_a_recreated_half_topic_resets_the_state(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    for off in range(3):
        svc._on_half(_half(off, f"M{off}"))
    svc._on_op(_end(0, 1, "M1", "ROLLBACK_MESSAGE"))
    svc._on_half(_half(0, "N0"))  # offsets went back: the transport lost the topic
    assert list(svc.pending) == [0] and svc.pending[0].msg_id == "N0"
    assert svc.resolved == set()


async def test_checkpoint_of_a_lost_topic_starts_over(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    await write_json(
        tmp_path / "state.json",
        {
            "half_low": 50,
            "op_next": 70,
            "resolved": [[50, 51]],
            "checks": {},
            "early": {},
            "intent": None,
        },
    )
    await svc._load({svc.half_tp: 0, svc.op_tp: 0}, {svc.half_tp: 3, svc.op_tp: 2})
    assert svc.half_next == 0 and svc.op_next == 0 and svc.resolved == set()


def test_send_back_headers() -> None:
    from tracemq import PushConsumer

    c = PushConsumer("G", max_reconsume_times=5)
    m = MessageExt(
        topic="T",
        body=b"x",
        msg_id="M" * 32,
        queue=MessageQueue("%RETRY%G", "b", 0),
        queue_offset=3,
        born_timestamp=1,
        store_timestamp=2,
        store_host="h:1",
        reconsume_times=2,
        properties={
            "UNIQ_KEY": "M" * 32,
            "TAGS": "A",
            "DELAY": "3",
            "REAL_TOPIC": "%RETRY%G",
            "REAL_QID": "0",
            "SCHEDULE_OFFSET": "3:9",
            "ORIGIN_MESSAGE_ID": "O" * 32,
            "RECONSUME_TIME": "2",
            "user": "kept",
        },
    )
    h = {k: v.decode() for k, v in c._sendback.back_headers(m)}
    assert h == {
        "UNIQ_KEY": "M" * 32,
        "TAGS": "A",
        "ORIGIN_MESSAGE_ID": "O" * 32,
        "RECONSUME_TIME": "3",
        "RETRY_TOPIC": "T",
        "MAX_RECONSUME_TIMES": "5",
        "user": "kept",
    }


def test_merge_intents() -> None:
    from tracemq_broker.forward import merge_intents

    a = {"ts": 5, "coords": ["1:0", "1:1"], "starts": [["t", 0, 10], ["t", 1, 3]]}
    b = {"ts": 7, "coords": ["1:2"], "starts": [["t", 0, 12], ["u", 0, 0]]}
    assert merge_intents([a, b]) == {
        "ts": 5,
        "coords": ["1:0", "1:1", "1:2"],
        "starts": [["t", 0, 10], ["t", 1, 3], ["u", 0, 0]],
    }


class _FakeForwarder:
    """Records when each item would have been written; honours ``not_before_ms``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float, int]] = []
        self.intents: list[dict[str, Any]] = []

    async def prepare(self, items: list[Any]) -> dict[str, Any]:
        intent = {"ts": 0, "coords": [i.coord for i in items], "starts": []}
        self.intents.append(intent)
        return intent

    async def send(self, items: list[Any], intent: dict[str, Any]) -> None:
        import asyncio
        import time

        for it in items:
            wait = it.not_before_ms - time.time() * 1000
            if wait > 0:
                await asyncio.sleep(wait / 1000)
            self.sent.append((it.coord, time.time() * 1000, it.not_before_ms))
        await asyncio.sleep(0.01)  # the acknowledgement


async def test_schedule_level_delivers_in_order_never_early(tmp_path: Path) -> None:
    import asyncio
    import time

    from tracemq_broker.schedule import ScheduleService

    async def resolve(topic: str, qid: int) -> tuple[str, int] | None:
        return None if topic == "Gone" else (f"b.{topic}", qid)

    svc = ScheduleService(
        broker_name="b", bootstrap="k:9", delays_ms=[100], state_dir=tmp_path, resolve=resolve
    )
    fake = _FakeForwarder()
    svc.forwarder = fake  # type: ignore[assignment]
    lv = svc.levels[0]
    t0 = int(time.time() * 1000)
    recs = []
    for i in range(40):
        headers = {"REAL_TOPIC": "Gone" if i == 5 else "T", "REAL_QID": "0", "DELAY": "1"}
        if i == 7:
            headers = {}  # garbage
        # due over two seconds: even a loop stalled for a second on a loaded machine sees
        # them come due in several batches
        recs.append(_rec(i, f"m{i}".encode(), headers, timestamp=t0 + i * 50))
    lv.buf.extend(recs)
    task = asyncio.create_task(svc._run(lv))
    try:
        deadline = time.monotonic() + 20
        while (lv.next < 40 or lv.dirty) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    assert [c for c, _, _ in fake.sent] == [f"1:{i}" for i in range(40) if i not in (5, 7)]
    assert all(at >= due for _, at, due in fake.sent)  # never before due
    assert len(fake.intents) >= 2  # several batches
    state = read_json(tmp_path / "level-1.json")
    assert state is not None and state["next"] == 40 and state["intent"] is None


def _sched_record(offset: int, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
    return ConsumerRecord(
        topic="b.SCHEDULE_TOPIC_XXXX", partition=1, offset=offset, timestamp=1000,
        timestamp_type=0, key=None, value=value, checksum=None, serialized_key_size=0,
        serialized_value_size=len(value), headers=tuple(headers),
    )  # fmt: skip


async def test_recall_decisions_and_journal(tmp_path: Path) -> None:
    """The schedule service's recall bookkeeping on one level (no Kafka): every result, the
    journal written before the answers, a replayed request answered the same."""
    from tracemq.protocol import recall as rcp
    from tracemq_broker.schedule import ScheduleService, _Flight

    async def resolve(topic: str, qid: int) -> tuple[str, int] | None:
        return None

    answers: list[tuple[str, dict[str, Any]]] = []
    svc = ScheduleService(
        broker_name="b", bootstrap="unused:9", delays_ms=[100, 5000], state_dir=tmp_path,
        resolve=resolve, answer=lambda rid, body: answers.append((rid, body)),
    )  # fmt: skip
    lv = svc.levels[1]
    msg = [("UNIQ_KEY", b"M10"), ("REAL_TOPIC", b"T"), ("REAL_QID", b"0"), ("DELAY", b"2")]
    lv.next = 5
    lv.buf.extend([_sched_record(10, b"x", msg), _sched_record(11, b"y", [("UNIQ_KEY", b"M11")])])
    lv.flights.append(_Flight(next=8, items=[], intent=None))  # offsets 5..7 are being sent

    def recall(offset: int, at: int, rid: str, **kw: Any) -> None:
        h = rcp.RecallHandle(kw.pop("topic", "T"), kw.pop("broker", "b"), 1, kw.pop("msg", "M10"),
                             kw.pop("level", 2), offset)  # fmt: skip
        req = rcp.RecallRequest(request_id=rid, handle=h.encode(), topic="T", group="g")
        lv.inbox.append(_sched_record(at, rcp.encode_request(req), [(rcp.RECALL_HEADER, b"1")]))

    recall(10, 20, "r1")
    recall(10, 21, "r2")  # a repeat
    recall(6, 22, "r3", msg="M6")  # in flight
    recall(3, 23, "r4", msg="M3")  # delivered
    recall(11, 24, "r5")  # another message there
    recall(30, 25, "r6")  # after the recall itself
    recall(10, 26, "r7", broker="other")
    recall(10, 27, "r8", level=1)
    lv.inbox.append(_sched_record(28, b"garbage", [(rcp.RECALL_HEADER, b"1")]))
    await svc._recalls(lv)
    got = {rid: body["result"] for rid, body in answers}
    assert got == {
        "r1": "RECALLED", "r2": "ALREADY_RECALLED", "r3": "TOO_LATE", "r4": "TOO_LATE",
        "r5": "UNKNOWN", "r6": "UNKNOWN", "r7": "INVALID", "r8": "INVALID",
    }  # fmt: skip
    assert "holds message M11" in dict(answers)["r5"]["detail"]
    assert "broker 'other'" in dict(answers)["r7"]["detail"]
    state = await asyncio.to_thread(read_json, lv.path)
    assert state is not None and state["recalled"] == [[10, "M10", "r1"]]

    # after a restart the same request is read again: the same answer, nothing applied twice
    answers.clear()
    recall(10, 20, "r1")
    await svc._recalls(lv)
    assert answers[0][1]["result"] == "RECALLED" and lv.recalled == {10: ("M10", "r1")}
