"""Trace codec: RocketMQ TraceDataEncoder byte compatibility, tolerance and robustness."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tracemq.trace import (
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    ConsumeReturnType,
    DecodeResult,
    MalformedRecord,
    MessageType,
    TraceBean,
    TraceContext,
    TraceTransferBean,
    TraceType,
    TransactionState,
    decode,
    decode_report,
    encode,
    encode_many,
)

S = CONTENT_SPLITOR
E = FIELD_SPLITOR
TS = 1_700_000_000_123
MSG_ID = "0A0000010F2C1A2B3C4D000012340001"
OFFSET_ID = "0A00000100002A9F000300000000002A"


def record(*fields: str) -> str:
    return S.join(fields) + E


# ------------------------------------------------------------------ the model itself


def test_enum_values_match_rocketmq() -> None:
    assert [t.value for t in TraceType] == [
        "Pub",
        "Recall",
        "SubBefore",
        "SubAfter",
        "EndTransaction",
    ]
    assert [(m.name, m.value) for m in MessageType] == [
        ("Normal_Msg", 0),
        ("Trans_Msg_Half", 1),
        ("Trans_msg_Commit", 2),
        ("Delay_Msg", 3),
        ("Order_Msg", 4),
    ]
    assert [(c.name, c.value) for c in ConsumeReturnType] == [
        ("SUCCESS", 0),
        ("TIME_OUT", 1),
        ("EXCEPTION", 2),
        ("RETURNNULL", 3),
        ("FAILED", 4),
    ]
    assert [s.value for s in TransactionState] == ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]
    assert TransactionState.UNKNOW == "UNKNOW"


def test_defaults() -> None:
    bean = TraceBean()
    assert (bean.store_time, bean.retry_times, bean.body_length) == (0, 0, 0)
    assert bean.msg_type is None and bean.from_transaction_check is False
    ctx = TraceContext(TraceType.Pub)
    assert (ctx.success, ctx.context_code, ctx.trace_beans) == (True, 0, [])
    assert TraceContext(TraceType.Pub).trace_beans is not ctx.trace_beans
    with pytest.raises(AttributeError):
        bean.not_a_field = 1  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- golden bytes


def pub_ctx(**bean_changes: object) -> TraceContext:
    bean = TraceBean(
        topic="T",
        msg_id=MSG_ID,
        tags=None,
        keys="order-1 user-7",
        store_host="10.0.0.1:10911",
        body_length=12,
        msg_type=MessageType.Normal_Msg,
        offset_msg_id=OFFSET_ID,
    )
    for name, value in bean_changes.items():
        setattr(bean, name, value)
    return TraceContext(
        TraceType.Pub,
        timestamp=TS,
        region_id="DefaultRegion",
        group_name="PG",
        cost_time=5,
        success=True,
        trace_beans=[bean],
    )


def test_pub_golden() -> None:
    out = encode(pub_ctx())
    assert out.data == (
        f"Pub\x01{TS}\x01DefaultRegion\x01PG\x01T\x01{MSG_ID}\x01null\x01order-1 user-7"
        f"\x0110.0.0.1:10911\x0112\x015\x010\x01{OFFSET_ID}\x01true\x02"
    )
    assert out.data.encode() == out.data.encode("utf-8")
    assert out.keys == {MSG_ID, "order-1", "user-7"}


def test_pub_golden_failed_delay_message_with_unicode() -> None:
    ctx = pub_ctx(tags="标签", keys=None, msg_type=MessageType.Delay_Msg, offset_msg_id=None)
    ctx.success = False
    ctx.region_id = None
    assert encode(ctx).data == (
        f"Pub\x01{TS}\x01null\x01PG\x01T\x01{MSG_ID}\x01标签\x01null"
        f"\x0110.0.0.1:10911\x0112\x015\x013\x01null\x01false\x02"
    )
    assert encode(ctx).data.encode("utf-8").count("标签".encode()) == 1


def test_pub_encodes_only_the_first_bean_but_indexes_all() -> None:
    ctx = pub_ctx()
    ctx.trace_beans.append(TraceBean(msg_id="SECOND", keys="k2", msg_type=MessageType.Normal_Msg))
    out = encode(ctx)
    assert out.data == encode(pub_ctx()).data
    assert out.keys == {MSG_ID, "order-1", "user-7", "SECOND", "k2"}


def test_sub_before_golden_one_record_per_bean() -> None:
    ctx = TraceContext(
        TraceType.SubBefore,
        timestamp=TS,
        region_id="DefaultRegion",
        group_name="CG",
        request_id="req-1",
        trace_beans=[
            TraceBean(msg_id="M1", retry_times=0, keys="a b"),
            TraceBean(msg_id="M2", retry_times=3, keys=None),
        ],
    )
    assert encode(ctx).data == (
        f"SubBefore\x01{TS}\x01DefaultRegion\x01CG\x01req-1\x01M1\x010\x01a b\x02"
        f"SubBefore\x01{TS}\x01DefaultRegion\x01CG\x01req-1\x01M2\x013\x01null\x02"
    )
    assert encode(ctx).keys == {"M1", "M2", "a", "b"}


def test_sub_after_golden() -> None:
    ctx = TraceContext(
        TraceType.SubAfter,
        timestamp=TS,
        group_name="CG",
        cost_time=17,
        success=False,
        request_id="req-1",
        context_code=ConsumeReturnType.EXCEPTION,
        trace_beans=[TraceBean(msg_id="M1", keys="k")],
    )
    assert encode(ctx).data == f"SubAfter\x01req-1\x01M1\x0117\x01false\x01k\x012\x01{TS}\x01CG\x02"


def test_end_transaction_golden() -> None:
    ctx = TraceContext(
        TraceType.EndTransaction,
        timestamp=TS,
        region_id="DefaultRegion",
        group_name="PG",
        trace_beans=[
            TraceBean(
                topic="T",
                msg_id=MSG_ID,
                tags="tx",
                keys="k",
                store_host="10.0.0.1:10911",
                msg_type=MessageType.Trans_msg_Commit,
                transaction_id="tx-9",
                transaction_state=TransactionState.COMMIT_MESSAGE,
                from_transaction_check=True,
            )
        ],
    )
    assert encode(ctx).data == (
        f"EndTransaction\x01{TS}\x01DefaultRegion\x01PG\x01T\x01{MSG_ID}\x01tx\x01k"
        "\x0110.0.0.1:10911\x012\x01tx-9\x01COMMIT_MESSAGE\x01true\x02"
    )
    # RocketMQ's encoder throws without a state; a written "null" would make RocketMQ's and
    # the dashboard's decoders fail on the whole trace message
    ctx.trace_beans[0].transaction_state = None
    with pytest.raises(ValueError, match="transaction_state is required"):
        encode(ctx)
    with pytest.raises(ValueError, match="transaction_state is required"):
        encode_many([ctx])


def test_recall_golden() -> None:
    ctx = TraceContext(
        TraceType.Recall,
        timestamp=TS,
        region_id="DefaultRegion",
        group_name="PG",
        success=True,
        trace_beans=[TraceBean(topic="T", msg_id=MSG_ID)],
    )
    assert encode(ctx).data == f"Recall\x01{TS}\x01DefaultRegion\x01PG\x01T\x01{MSG_ID}\x01true\x02"


def test_encode_many_concatenates_and_unions_keys() -> None:
    sub = TraceContext(TraceType.SubBefore, trace_beans=[TraceBean(msg_id="M9", keys="z")])
    out = encode_many([pub_ctx(), sub])
    assert out == TraceTransferBean(
        data=encode(pub_ctx()).data + encode(sub).data,
        keys={MSG_ID, "order-1", "user-7", "M9", "z"},
    )
    assert encode_many([]) == TraceTransferBean(data="", keys=set())
    assert encode_many(iter([sub])).data == encode(sub).data


def test_keys_skip_missing_empty_and_null() -> None:
    ctx = TraceContext(
        TraceType.SubBefore,
        trace_beans=[
            TraceBean(msg_id=None, keys="  a  b "),
            TraceBean(msg_id="", keys=""),
            TraceBean(msg_id="null", keys="null c"),
            TraceBean(msg_id="M", keys="a"),
        ],
    )
    assert encode(ctx).keys == {"a", "b", "c", "M"}


def test_sub_contexts_without_beans_encode_to_nothing() -> None:
    for kind in (TraceType.SubBefore, TraceType.SubAfter):
        assert encode(TraceContext(kind)) == TraceTransferBean(data="", keys=set())


# ------------------------------------------------------------------ encoder rejects


@pytest.mark.parametrize("separator", [S, E])
@pytest.mark.parametrize("field", ["topic", "tags", "keys", "msg_id", "offset_msg_id"])
def test_encoder_rejects_separators_in_bean_fields(separator: str, field: str) -> None:
    with pytest.raises(ValueError, match=f"'{field}' contains a record separator"):
        encode(pub_ctx(**{field: f"x{separator}y"}))


def test_encoder_rejects_separators_in_context_fields() -> None:
    ctx = TraceContext(TraceType.SubAfter, group_name="G\x02", trace_beans=[TraceBean(msg_id="M")])
    with pytest.raises(ValueError, match="'group_name' contains a record separator"):
        encode(ctx)
    ctx = TraceContext(TraceType.SubBefore, request_id="\x01", trace_beans=[TraceBean()])
    with pytest.raises(ValueError, match="'request_id'"):
        encode(ctx)
    with pytest.raises(ValueError, match="'transaction_id'"):
        encode(
            TraceContext(
                TraceType.EndTransaction,
                trace_beans=[TraceBean(msg_type=MessageType.Normal_Msg, transaction_id="a\x01")],
            )
        )


def test_encode_many_rejects_the_bad_context() -> None:
    with pytest.raises(ValueError, match="'tags'"):
        encode_many([pub_ctx(), pub_ctx(tags="\x02")])


def test_encoder_requires_msg_type_and_a_bean() -> None:
    with pytest.raises(ValueError, match="'msg_type' is required for a Pub record"):
        encode(pub_ctx(msg_type=None))
    with pytest.raises(ValueError, match="'msg_type' is required for a EndTransaction record"):
        encode(TraceContext(TraceType.EndTransaction, trace_beans=[TraceBean()]))
    for kind in (TraceType.Pub, TraceType.EndTransaction, TraceType.Recall):
        with pytest.raises(ValueError, match="needs at least one trace bean"):
            encode(TraceContext(kind))


def test_encoder_rejects_integers_java_cannot_read() -> None:
    with pytest.raises(ValueError, match="'body_length' is out of range"):
        encode(pub_ctx(body_length=2**31))
    ctx = pub_ctx()
    ctx.timestamp = 2**63
    with pytest.raises(ValueError, match="'timestamp' is out of range"):
        encode(ctx)


# ------------------------------------------------------------- decoding: old formats


def pub_fields(count: int) -> list[str]:
    full = [
        "Pub", str(TS), "DefaultRegion", "PG", "T", MSG_ID, "null", "k1 k2",
        "10.0.0.1:10911", "12", "5", "4", OFFSET_ID, "false", "10.9.9.9", "future",
    ]  # fmt: skip
    return full[:count]


def test_decode_current_pub() -> None:
    (ctx,) = decode(record(*pub_fields(14)))
    assert ctx == TraceContext(
        TraceType.Pub,
        timestamp=TS,
        region_id="DefaultRegion",
        group_name="PG",
        cost_time=5,
        success=False,
        trace_beans=[
            TraceBean(
                topic="T",
                msg_id=MSG_ID,
                tags=None,
                keys="k1 k2",
                store_host="10.0.0.1:10911",
                body_length=12,
                msg_type=MessageType.Order_Msg,
                offset_msg_id=OFFSET_ID,
            )
        ],
    )


def test_decode_pub_with_12_fields_defaults_success() -> None:
    (ctx,) = decode(record(*pub_fields(12)))
    assert ctx.success is True
    assert ctx.trace_beans[0].offset_msg_id is None
    assert ctx.trace_beans[0].msg_type is MessageType.Order_Msg


def test_decode_pub_with_13_fields_reads_success_at_12() -> None:
    fields = pub_fields(12) + ["false"]
    (ctx,) = decode(record(*fields))
    assert ctx.success is False
    assert ctx.trace_beans[0].offset_msg_id is None


@pytest.mark.parametrize("count", [15, 16])
def test_decode_pub_with_15_or_more_fields_reads_old_client_host(count: int) -> None:
    (ctx,) = decode(record(*pub_fields(count)))
    bean = ctx.trace_beans[0]
    assert (bean.offset_msg_id, ctx.success, bean.client_host) == (OFFSET_ID, False, "10.9.9.9")


def test_decode_pub_with_11_fields_is_malformed() -> None:
    text = record(*pub_fields(11))
    assert decode_report(text) == DecodeResult(
        contexts=[],
        errors=[
            MalformedRecord(0, text[:-1], "Pub record has 11 fields; at least 12 are required")
        ],
    )


def sub_after_fields(count: int) -> list[str]:
    return ["SubAfter", "req", "M1", "30", "TRUE", "k", "3", str(TS), "CG", "extra"][:count]


def test_decode_sub_after_6_fields() -> None:
    (ctx,) = decode(record(*sub_after_fields(6)))
    assert ctx == TraceContext(
        TraceType.SubAfter,
        request_id="req",
        cost_time=30,
        success=True,
        trace_beans=[TraceBean(msg_id="M1", keys="k")],
    )
    assert (ctx.context_code, ctx.timestamp, ctx.group_name) == (0, 0, None)


def test_decode_sub_after_7_fields_has_context_code() -> None:
    (ctx,) = decode(record(*sub_after_fields(7)))
    assert (ctx.context_code, ctx.timestamp, ctx.group_name) == (3, 0, None)


def test_decode_sub_after_8_fields_is_an_empty_group() -> None:
    ctx = TraceContext(
        TraceType.SubAfter, timestamp=TS, group_name="", trace_beans=[TraceBean(msg_id="M")]
    )
    data = encode(ctx).data
    assert data.endswith(f"\x01{TS}\x01\x02")
    (back,) = decode(data)
    assert (back.timestamp, back.group_name) == (TS, None)
    (ctx8,) = decode(record(*sub_after_fields(8)))
    assert (ctx8.context_code, ctx8.timestamp, ctx8.group_name) == (3, TS, None)


@pytest.mark.parametrize(
    "eighth",
    ["abc", "null", "12.5", "-", "9" * 30, "１２", "true"],
)
def test_decode_sub_after_8_fields_ignores_an_8th_that_is_no_timestamp(eighth: str) -> None:
    # RocketMQ reads timestamp and group only from 9 or more fields: an 8th field that is not
    # a Java long is ignored, never a reason to drop the record
    text = (
        "SubAfter\x01AC1100010A8B18B4AAC2000000000001\x010A00000100002A9F0000000000000001"
        f"\x0111\x01true\x01k1\x010\x01{eighth}\x02"
    )
    result = decode_report(text)
    assert result.errors == []
    (ctx,) = result.contexts
    assert (ctx.request_id, ctx.cost_time, ctx.success, ctx.context_code) == (
        "AC1100010A8B18B4AAC2000000000001",
        11,
        True,
        0,
    )
    assert (ctx.timestamp, ctx.group_name) == (0, None)
    assert ctx.trace_beans == [TraceBean(msg_id="0A00000100002A9F0000000000000001", keys="k1")]


def test_decode_sub_after_9_fields_with_a_bad_timestamp_is_malformed() -> None:
    # as RocketMQ's decoder, which fails on Long.parseLong there
    (error,) = decode_report(record(*sub_after_fields(7), "abc", "CG")).errors
    assert "timestamp" in error.reason


@pytest.mark.parametrize("count", [9, 10])
def test_decode_sub_after_9_or_more_fields(count: int) -> None:
    (ctx,) = decode(record(*sub_after_fields(count)))
    assert (ctx.context_code, ctx.timestamp, ctx.group_name) == (3, TS, "CG")


def test_decode_sub_after_5_fields_is_malformed() -> None:
    (error,) = decode_report(record(*sub_after_fields(5))).errors
    assert error.reason == "SubAfter record has 5 fields; at least 6 are required"


def test_decode_sub_before_9_fields_reads_old_client_host() -> None:
    text = record("SubBefore", str(TS), "R", "CG", "req", "M1", "2", "k", "10.9.9.9")
    (ctx,) = decode(text)
    assert ctx == TraceContext(
        TraceType.SubBefore,
        timestamp=TS,
        region_id="R",
        group_name="CG",
        request_id="req",
        trace_beans=[TraceBean(msg_id="M1", retry_times=2, keys="k", client_host="10.9.9.9")],
    )


def test_decode_sub_before_with_empty_keys_has_7_fields() -> None:
    ctx = TraceContext(TraceType.SubBefore, timestamp=TS, trace_beans=[TraceBean(keys="")])
    data = encode(ctx).data
    assert data.endswith("\x010\x01\x02")
    (back,) = decode_report(data).contexts
    assert back.trace_beans[0].keys is None
    text = record("SubBefore", str(TS), "R", "CG", "req", "M1")
    (error,) = decode_report(text).errors
    assert error.reason == "SubBefore record has 6 fields; at least 7 are required"


def test_decode_sub_records_become_one_context_each() -> None:
    ctx = TraceContext(
        TraceType.SubBefore,
        timestamp=TS,
        group_name="CG",
        trace_beans=[TraceBean(msg_id=f"M{i}") for i in range(3)],
    )
    contexts = decode(encode(ctx).data)
    assert [c.trace_beans[0].msg_id for c in contexts] == ["M0", "M1", "M2"]
    assert all(len(c.trace_beans) == 1 and c.group_name == "CG" for c in contexts)


def test_decode_end_transaction_needs_13_fields() -> None:
    fields = [
        "EndTransaction", str(TS), "R", "PG", "T", MSG_ID, "null", "null", "h:1", "1",
        "tx", "ROLLBACK_MESSAGE", "True",
    ]  # fmt: skip
    (ctx,) = decode(record(*fields))
    bean = ctx.trace_beans[0]
    assert bean.msg_type is MessageType.Trans_Msg_Half
    assert bean.transaction_state is TransactionState.ROLLBACK_MESSAGE
    assert bean.from_transaction_check is True
    assert (bean.tags, bean.keys, bean.transaction_id) == (None, None, "tx")
    (error,) = decode_report(record(*fields[:12])).errors
    assert error.reason == "EndTransaction record has 12 fields; at least 13 are required"


def test_decode_recall_needs_7_fields() -> None:
    (ctx,) = decode(record("Recall", str(TS), "R", "PG", "T", MSG_ID, "false"))
    assert ctx == TraceContext(
        TraceType.Recall,
        timestamp=TS,
        region_id="R",
        group_name="PG",
        success=False,
        trace_beans=[TraceBean(topic="T", msg_id=MSG_ID)],
    )
    (error,) = decode_report(record("Recall", str(TS), "R", "PG", "T", MSG_ID)).errors
    assert error.reason == "Recall record has 6 fields; at least 7 are required"


# ----------------------------------------------------------- decoding: bad records


def test_malformed_record_between_two_good_ones() -> None:
    good_1 = encode(pub_ctx()).data
    bad = record("SubBefore", "abc", "R", "CG", "req", "M1", "0", "k")
    good_2 = record(*sub_after_fields(9))
    result = decode_report(good_1 + bad + good_2)
    assert [c.trace_type for c in result.contexts] == [TraceType.Pub, TraceType.SubAfter]
    assert result.errors == [
        MalformedRecord(1, bad[:-1], "field 'timestamp' (index 1): 'abc' is not a valid Java long")
    ]
    assert decode(good_1 + bad + good_2) == result.contexts


@pytest.mark.parametrize(
    ("index", "value", "reason"),
    [
        (1, "abc", "field 'timestamp' (index 1): 'abc' is not a valid Java long"),
        (1, str(2**63), f"field 'timestamp' (index 1): '{2**63}' is not a valid Java long"),
        (1, " 1", "field 'timestamp' (index 1): ' 1' is not a valid Java long"),
        (1, "1_0", "field 'timestamp' (index 1): '1_0' is not a valid Java long"),
        (1, "١٢", "field 'timestamp' (index 1): '١٢' is not a valid Java long"),
        (9, "null", "field 'body_length' (index 9): 'null' is not a valid Java int"),
        (9, str(2**31), f"field 'body_length' (index 9): '{2**31}' is not a valid Java int"),
        (10, "", "field 'cost_time' (index 10): '' is not a valid Java int"),
        (11, "5", "field 'msg_type' (index 11): '5' is not a MessageType ordinal (0..4)"),
        (11, "-1", "field 'msg_type' (index 11): '-1' is not a MessageType ordinal (0..4)"),
        (11, "x", "field 'msg_type' (index 11): 'x' is not a MessageType ordinal (0..4)"),
    ],
)
def test_bad_numbers_make_a_pub_record_malformed(index: int, value: str, reason: str) -> None:
    fields = pub_fields(14)
    fields[index] = value
    text = record(*fields)
    assert decode_report(text) == DecodeResult(errors=[MalformedRecord(0, text[:-1], reason)])


def test_signed_numbers_parse_like_java() -> None:
    fields = pub_fields(14)
    fields[1], fields[9], fields[11] = "+42", "-7", "+0"
    (ctx,) = decode(record(*fields))
    assert (ctx.timestamp, ctx.trace_beans[0].body_length) == (42, -7)
    assert ctx.trace_beans[0].msg_type is MessageType.Normal_Msg


def test_unknown_transaction_state_is_malformed() -> None:
    fields = [
        "EndTransaction", str(TS), "R", "PG", "T", MSG_ID, "t", "k", "h:1", "0", "tx",
        "COMMIT", "false",
    ]  # fmt: skip
    (error,) = decode_report(record(*fields)).errors
    assert error.reason == (
        "field 'transaction_state' (index 11): 'COMMIT' is not a known transaction state"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("tRuE", True), ("false", False), ("yes", False),
     ("1", False), ("", False), ("true ", False)],
)  # fmt: skip
def test_booleans_follow_java_parse_boolean(text: str, expected: bool) -> None:
    fields = sub_after_fields(9)
    fields[4] = text
    result = decode_report(record(*fields))
    assert result.errors == []
    assert result.contexts[0].success is expected


def test_unknown_type_is_reported_and_skipped() -> None:
    good = encode(pub_ctx()).data
    result = decode_report(good + record("Bogus", "1", "2") + good)
    assert len(result.contexts) == 2
    assert result.errors == [MalformedRecord(1, "Bogus\x011\x012", "unknown trace type 'Bogus'")]
    (error,) = decode_report("pub\x011\x02").errors
    assert error.reason == "unknown trace type 'pub'"


def test_empty_records_are_skipped_silently() -> None:
    assert decode_report("") == DecodeResult()
    assert decode_report(E * 3) == DecodeResult()
    assert decode_report(S + S + E) == DecodeResult()
    good = encode(pub_ctx()).data
    # A leading empty record still counts for the index of later records.
    result = decode_report(E + good + record("X") + good)
    assert len(result.contexts) == 2
    assert [e.index for e in result.errors] == [2]


def test_missing_final_separator_still_decodes() -> None:
    assert decode(encode(pub_ctx()).data[:-1]) == [pub_ctx()]


def test_null_strings_decode_to_none() -> None:
    (ctx,) = decode(record("Recall", str(TS), "null", "null", "null", "null", "true"))
    assert (ctx.region_id, ctx.group_name) == (None, None)
    assert (ctx.trace_beans[0].topic, ctx.trace_beans[0].msg_id) == (None, None)
    (ctx,) = decode(record("Recall", str(TS), "NULL", "", "Null", "null ", "true"))
    assert (ctx.region_id, ctx.group_name) == ("NULL", "")
    assert (ctx.trace_beans[0].topic, ctx.trace_beans[0].msg_id) == ("Null", "null ")


# ------------------------------------------------------------------ round trips

# Values that survive the format: no separators, and not the text "null" (that is None).
safe_text = st.text(st.characters(blacklist_characters=[S, E], codec="utf-8")).filter(
    lambda s: s != "null"
)
opt_text = st.none() | safe_text
java_long = st.integers(-(2**63), 2**63 - 1)
java_int = st.integers(-(2**31), 2**31 - 1)
msg_types = st.sampled_from(MessageType)


def trailing(value: str | None) -> str | None:
    """An empty last field disappears from the record and decodes as None."""
    return value or None


@st.composite
def pub_contexts(draw: st.DrawFn) -> TraceContext:
    return TraceContext(
        TraceType.Pub,
        timestamp=draw(java_long),
        region_id=draw(opt_text),
        group_name=draw(opt_text),
        cost_time=draw(java_int),
        success=draw(st.booleans()),
        trace_beans=[
            TraceBean(
                topic=draw(opt_text),
                msg_id=draw(opt_text),
                tags=draw(opt_text),
                keys=draw(opt_text),
                store_host=draw(opt_text),
                body_length=draw(java_int),
                msg_type=draw(msg_types),
                offset_msg_id=draw(opt_text),
            )
        ],
    )


@st.composite
def sub_before_contexts(draw: st.DrawFn) -> TraceContext:
    beans = st.builds(TraceBean, msg_id=opt_text, retry_times=java_int, keys=opt_text)
    return TraceContext(
        TraceType.SubBefore,
        timestamp=draw(java_long),
        region_id=draw(opt_text),
        group_name=draw(opt_text),
        request_id=draw(opt_text),
        trace_beans=draw(st.lists(beans, min_size=1, max_size=4)),
    )


@st.composite
def sub_after_contexts(draw: st.DrawFn) -> TraceContext:
    beans = st.builds(TraceBean, msg_id=opt_text, keys=opt_text)
    return TraceContext(
        TraceType.SubAfter,
        timestamp=draw(java_long),
        group_name=draw(opt_text),
        cost_time=draw(java_int),
        success=draw(st.booleans()),
        request_id=draw(opt_text),
        context_code=draw(java_int),
        trace_beans=draw(st.lists(beans, min_size=1, max_size=4)),
    )


@st.composite
def end_transaction_contexts(draw: st.DrawFn) -> TraceContext:
    return TraceContext(
        TraceType.EndTransaction,
        timestamp=draw(java_long),
        region_id=draw(opt_text),
        group_name=draw(opt_text),
        trace_beans=[
            TraceBean(
                topic=draw(opt_text),
                msg_id=draw(opt_text),
                tags=draw(opt_text),
                keys=draw(opt_text),
                store_host=draw(opt_text),
                msg_type=draw(msg_types),
                transaction_id=draw(opt_text),
                transaction_state=draw(st.sampled_from(TransactionState)),  # required
                from_transaction_check=draw(st.booleans()),
            )
        ],
    )


@st.composite
def recall_contexts(draw: st.DrawFn) -> TraceContext:
    return TraceContext(
        TraceType.Recall,
        timestamp=draw(java_long),
        region_id=draw(opt_text),
        group_name=draw(opt_text),
        success=draw(st.booleans()),
        trace_beans=[TraceBean(topic=draw(opt_text), msg_id=draw(opt_text))],
    )


def expected_after_decode(ctx: TraceContext) -> list[TraceContext]:
    """What the format can carry of ``ctx``, in the shape the decoder returns."""
    if ctx.trace_type is TraceType.SubBefore:
        return [
            TraceContext(
                TraceType.SubBefore,
                timestamp=ctx.timestamp,
                region_id=ctx.region_id,
                group_name=ctx.group_name,
                request_id=ctx.request_id,
                trace_beans=[
                    TraceBean(msg_id=b.msg_id, retry_times=b.retry_times, keys=trailing(b.keys))
                ],
            )
            for b in ctx.trace_beans
        ]
    if ctx.trace_type is TraceType.SubAfter:
        return [
            TraceContext(
                TraceType.SubAfter,
                timestamp=ctx.timestamp,
                group_name=trailing(ctx.group_name),
                cost_time=ctx.cost_time,
                success=ctx.success,
                request_id=ctx.request_id,
                context_code=ctx.context_code,
                trace_beans=[TraceBean(msg_id=b.msg_id, keys=b.keys)],
            )
            for b in ctx.trace_beans
        ]
    # Pub, EndTransaction and Recall: the strategies only draw fields the format carries.
    return [ctx]


any_context = st.one_of(
    pub_contexts(),
    sub_before_contexts(),
    sub_after_contexts(),
    end_transaction_contexts(),
    recall_contexts(),
)


@pytest.mark.parametrize(
    "strategy",
    [
        pub_contexts(),
        sub_before_contexts(),
        sub_after_contexts(),
        end_transaction_contexts(),
        recall_contexts(),
    ],
    ids=["Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall"],
)
@given(data=st.data())
def test_round_trip_per_type(
    strategy: st.SearchStrategy[TraceContext], data: st.DataObject
) -> None:
    ctx = data.draw(strategy)
    result = decode_report(encode(ctx).data)
    assert result.errors == []
    assert result.contexts == expected_after_decode(ctx)


@given(st.lists(any_context, max_size=6))
def test_round_trip_of_a_batch(contexts: list[TraceContext]) -> None:
    out = encode_many(contexts)
    result = decode_report(out.data)
    assert result.errors == []
    assert result.contexts == [e for c in contexts for e in expected_after_decode(c)]
    expected_keys = {
        part
        for c in contexts
        for b in c.trace_beans
        for part in [b.msg_id or "", *(b.keys or "").split(" ")]
        if part and part != "null"
    }
    assert out.keys == expected_keys
    assert out.data.encode("utf-8").decode("utf-8") == out.data


@given(st.lists(any_context, min_size=1, max_size=4), st.integers(0, 3), st.text(max_size=30))
def test_a_corrupted_record_costs_only_itself(
    contexts: list[TraceContext], position: int, junk: str
) -> None:
    records = [encode(c).data for c in contexts]
    bad_record = "Pub" + S + "not-a-number" + S + junk.replace(E, "")
    position = min(position, len(records))
    text = "".join(records[:position]) + bad_record + E + "".join(records[position:])
    result = decode_report(text)
    assert result.contexts == [e for c in contexts for e in expected_after_decode(c)]
    (error,) = result.errors
    records_before = sum(len(decode(r)) for r in records[:position])
    assert error.index == records_before
    assert error.raw == bad_record


# ------------------------------------------------------------------ never raises

# Tokens rather than characters, so the fuzzer reaches the per-type parsers often.
separator_heavy = st.lists(
    st.sampled_from([S, E, "Pub", "SubBefore", "SubAfter", "EndTransaction", "Recall", "null",
                     "true", "0", "-1", "99999999999999999999", "x", " ", "é"]),
).map("".join)  # fmt: skip


@given(st.one_of(st.text(), separator_heavy, st.text(st.characters(codec="utf-8"))))
def test_decode_never_raises(text: str) -> None:
    result = decode_report(text)
    records = text.split(E)
    assert all(0 <= e.index < len(records) and e.raw == records[e.index] for e in result.errors)
    assert len(result.contexts) + len(result.errors) <= len(records)
    assert decode(text) == result.contexts


@pytest.mark.parametrize("digits", [4300, 4301, 10_000])
def test_integer_fields_past_pythons_digit_limit_are_malformed_not_an_error(digits: int) -> None:
    """Issue 20, finding 8: int() refuses more than 4300 digits with a ValueError."""
    huge = "7" * digits
    good = f"SubAfter{S}r1{S}{MSG_ID}{S}5{S}true{S}k{E}"
    text = f"SubAfter{S}r1{S}{MSG_ID}{S}{huge}{S}true{S}k{E}" + good
    result = decode_report(text)
    assert [e.index for e in result.errors] == [0]
    assert "cost_time" in result.errors[0].reason and len(result.errors[0].reason) < 200
    assert [c.cost_time for c in result.contexts] == [5]  # the neighbour is kept


def test_leading_zeros_do_not_count_against_the_range() -> None:
    # Java's parseInt reads "0000…05" as 5, however many zeros
    for sign, expected in (("", 5), ("+", 5), ("-", -5)):
        text = f"SubAfter{S}r1{S}{MSG_ID}{S}{sign}{'0' * 5000}5{S}true{S}k{E}"
        assert decode(text)[0].cost_time == expected


def test_decode_takes_bytes_and_never_raises_on_other_types() -> None:
    good = f"SubAfter{S}r1{S}{MSG_ID}{S}5{S}true{S}k{E}"
    assert decode(good.encode()) == decode(good)
    assert len(decode_report(b"\xff\xfe" + good.encode()).errors) == 1
    for other in (None, 42, [good]):
        result = decode_report(other)  # type: ignore[arg-type]
        assert result.contexts == [] and "not text" in result.errors[0].reason


@given(any_context, st.integers(min_value=0), st.text(max_size=5))
def test_decode_of_spliced_valid_text_never_raises(ctx: TraceContext, cut: int, junk: str) -> None:
    data = encode(ctx).data
    cut %= len(data) + 1
    decode_report(data[:cut] + junk + data[cut:])
    decode_report(data[:cut])


# ---- the fast encoders write exactly what the checked ones write, and fail the same way ----

_wild_text = st.none() | st.text(max_size=12) | separator_heavy
_wild_int = st.integers() | st.booleans() | st.none()


@st.composite
def wild_contexts(draw: st.DrawFn) -> TraceContext:
    """Any of the three hot-path types, with fields the checked path may refuse."""
    trace_type = draw(st.sampled_from([TraceType.Pub, TraceType.SubBefore, TraceType.SubAfter]))
    bean = TraceBean(
        topic=draw(_wild_text),
        msg_id=draw(_wild_text),
        tags=draw(_wild_text),
        keys=draw(_wild_text),
        store_host=draw(_wild_text),
        offset_msg_id=draw(_wild_text),
        body_length=draw(_wild_int),
        retry_times=draw(_wild_int),
        msg_type=draw(st.none() | st.integers(-1, 6) | st.sampled_from(MessageType)),
    )
    return TraceContext(
        trace_type,
        timestamp=draw(_wild_int),
        region_id=draw(_wild_text),
        group_name=draw(_wild_text),
        request_id=draw(_wild_text),
        cost_time=draw(_wild_int),
        success=draw(st.booleans()),
        context_code=draw(_wild_int | st.sampled_from(ConsumeReturnType)),
        trace_beans=draw(st.lists(st.just(bean), min_size=1, max_size=2)),
    )


def _outcome(fn: object, ctx: TraceContext) -> tuple[str, str]:
    try:
        return "ok", fn(ctx)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return type(exc).__name__, str(exc)


@given(wild_contexts())
def test_fast_encoders_equal_the_checked_ones(ctx: TraceContext) -> None:
    from tracemq.trace import _codec as c

    checked = {
        TraceType.Pub: c._encode_pub,
        TraceType.SubBefore: c._encode_sub_before,
        TraceType.SubAfter: c._encode_sub_after,
    }[ctx.trace_type]
    assert _outcome(c._ENCODERS[ctx.trace_type], ctx) == _outcome(checked, ctx)


# ---- raw records: a SubBefore+SubAfter pair writes both records, as the checked encoder ----


@given(
    _wild_text, _wild_text, _wild_text, _wild_text, _wild_int, _wild_int, _wild_int, _wild_int,
    st.booleans(), _wild_int | st.sampled_from(ConsumeReturnType),
)  # fmt: skip
def test_a_written_pair_is_its_two_records(
    region: str | None, msg_id: str | None, keys: str | None, group: str | None, ts: object,
    retry: object, end: object, cost: object, ok: bool, code: object,
) -> None:  # fmt: skip
    from tracemq.trace import _codec as c

    pair = (c.SUB_PAIR, "T", region, msg_id, keys, ts, group, "RID", retry, end, cost, ok, code)
    before, after = c.split_pair(pair)
    (written,) = c.write_records([pair])
    checked = [_outcome(encode, c.raw_context(r)) for r in (before, after)]
    # (where the fast writer steps aside, the dispatcher takes the checked way: not compared)
    if written is not None and c.separators(written) == c.RAW_SEPARATORS[c.SUB_PAIR]:
        assert checked == [("ok", encode(c.raw_context(r))) for r in (before, after)]
        assert written == "".join(encode(c.raw_context(r)).data for r in (before, after))
    if all(type(v) is int and 0 <= v < 4096 for v in (ts, retry, end, cost, code)):  # noqa: E721
        assert written is not None  # plain small integers: the fast writer takes them


def test_raw_record_helpers_refuse_what_is_not_a_raw_record() -> None:
    from tracemq.trace import _codec as c

    for bad in [(), ("Pub",), ("Nope", 1, 2), ("SubBefore", 1)]:
        with pytest.raises(ValueError, match="not a raw trace record"):
            c.raw_context(bad)
        with pytest.raises(ValueError, match="not a raw SubBefore"):
            c.split_pair(bad)
    assert c.write_records([("Nope", 1), TraceContext(TraceType.Pub), ()]) == [None, None, None]
