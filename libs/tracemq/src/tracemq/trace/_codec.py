"""Text codec for trace records, byte-compatible with RocketMQ's ``TraceDataEncoder``.

Format
------
A trace message body is UTF-8 text made of records. Inside a record every field is followed
by :data:`CONTENT_SPLITOR` (``U+0001``) except the last one, and every record ends with
:data:`FIELD_SPLITOR` (``U+0002``). Values are written the way Java string concatenation
writes them: ``null`` for a missing string, ``true``/``false`` for booleans, decimal for
integers, the ordinal for a :class:`MessageType` and the name for a
:class:`TransactionState`.

Field order per record type::

    Pub             Pub timestamp region_id group_name topic msg_id tags keys store_host
                    body_length cost_time msg_type offset_msg_id success          (14)
    SubBefore       SubBefore timestamp region_id group_name request_id msg_id
                    retry_times keys                                               (8)
    SubAfter        SubAfter request_id msg_id cost_time success keys context_code
                    timestamp group_name                                           (9)
    EndTransaction  EndTransaction timestamp region_id group_name topic msg_id tags keys
                    store_host msg_type transaction_id transaction_state
                    from_transaction_check                                         (13)
    Recall          Recall timestamp region_id group_name topic msg_id success     (7)

Pub, EndTransaction and Recall encode only the first bean of a context; SubBefore and
SubAfter encode one record per bean.

Decoding
--------
Decoding follows Java's ``String.split``, which drops trailing empty strings; that is what
RocketMQ's own decoder and the dashboard see, so the tolerance rules are stated in field
counts after that removal:

* Pub: 12 fields (oldest clients; ``success`` defaults to true), 13 (``success`` at index
  12), 14 (``offset_msg_id`` then ``success``), 15 or more (as 14, plus the old
  ``client_host`` at index 14). Fewer than 12 is malformed.
* SubBefore: 8 fields; a 9th is the old ``client_host``. Exactly 7 fields is what an
  encoded record with an empty ``keys`` turns into (the empty last field vanishes), so it
  decodes with ``keys=None``; fewer than 7 is malformed.
* SubAfter: 6 fields (no ``context_code``, ``timestamp`` or group); 7 adds
  ``context_code``; 9 or more adds ``timestamp`` and ``group_name``. RocketMQ reads those
  two only from 9 or more fields and ignores an 8th; exactly 8 is also what an encoded
  record with an empty ``group_name`` turns into. So with 8 fields index 7 is the
  ``timestamp`` if it is a valid Java long and is otherwise ignored (``timestamp`` None),
  ``group_name`` is None, and the record is never dropped for it. Fewer than 6 is
  malformed.
* EndTransaction needs 13 fields and Recall 7; fewer is malformed.
* Fields beyond those listed are ignored, so a newer writer's additions do not break us.

In short, an empty string in the last field of a record does not survive the format and
decodes as None. The literal text ``null`` decodes as None for every string field.

Booleans follow Java's ``Boolean.parseBoolean``: ``true`` in any case is true and anything
else is false, never an error. Integers must be plain ASCII decimal (an optional sign, then
digits) and fit Java's ``int`` or ``long`` as RocketMQ declares the field; anything else,
an out-of-range ``msg_type`` ordinal or an unknown transaction state makes the record
malformed. A malformed record, or one whose type is unknown, is reported and skipped; the
other records of the message still decode, and decoding never raises, whatever the input
(property-tested with arbitrary text, bytes and digit runs far past Python's 4300-digit
integer-conversion limit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tracemq.trace._model import (
    ConsumeReturnType,
    DecodeError,
    DecodeResult,
    MalformedRecord,
    MessageType,
    TraceBean,
    TraceContext,
    TraceTransferBean,
    TraceType,
    TransactionState,
)

__all__ = [
    "CONTENT_SPLITOR",
    "PUB",
    "RAW_SEPARATORS",
    "SUB_AFTER",
    "SUB_BEFORE",
    "SUB_PAIR",
    "FIELD_SPLITOR",
    "KEY_SEPARATOR",
    "decode",
    "decode_report",
    "encode",
    "encode_many",
    "raw_context",
    "separators",
    "split_pair",
    "write_records",
]

#: Ends every field of a record but the last.
CONTENT_SPLITOR = "\u0001"
#: Ends every record.
FIELD_SPLITOR = "\u0002"
#: Separates business keys inside ``TraceBean.keys`` (RocketMQ ``MessageConst.KEY_SEPARATOR``).
KEY_SEPARATOR = " "

_NULL = "null"

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

# Java's parseInt/parseLong accept only a sign and digits; Python's int() would also take
# spaces, underscores and non-ASCII digits, which a Java reader would reject.
_DECIMAL = re.compile(r"[+-]?[0-9]+")
#: Digits of the largest Java long (9223372036854775807)
_LONG_DIGITS = 19

# Long enough to recognise a value in an error message, short enough not to flood a log.
_MAX_SHOWN = 64


# --------------------------------------------------------------------------- encoding


def _text(name: str, value: str | None) -> str:
    if value is None:
        return _NULL
    if CONTENT_SPLITOR in value or FIELD_SPLITOR in value:
        # Writing it would shift every later field or split the record in two.
        raise ValueError(
            f"trace field {name!r} contains a record separator (U+0001 or U+0002): {value!r}"
        )
    return value


def _integer(name: str, value: int, low: int, high: int) -> str:
    if not low <= value <= high:
        # A Java reader could not parse it back.
        raise ValueError(f"trace field {name!r} is out of range [{low}, {high}]: {value}")
    return f"{value:d}"


def _java_int(name: str, value: int) -> str:
    return _integer(name, value, _INT_MIN, _INT_MAX)


def _java_long(name: str, value: int) -> str:
    return _integer(name, value, _LONG_MIN, _LONG_MAX)


def _boolean(value: bool) -> str:
    return "true" if value else "false"


def _msg_type(trace_type: TraceType, bean: TraceBean) -> str:
    if bean.msg_type is None:
        # RocketMQ would throw here too; writing "null" would make the record unreadable.
        raise ValueError(f"trace field 'msg_type' is required for a {trace_type.value} record")
    return f"{MessageType(bean.msg_type).value:d}"


def _first_bean(ctx: TraceContext) -> TraceBean:
    if not ctx.trace_beans:
        raise ValueError(f"a {ctx.trace_type.value} trace context needs at least one trace bean")
    return ctx.trace_beans[0]


def _record(fields: list[str]) -> str:
    return CONTENT_SPLITOR.join(fields) + FIELD_SPLITOR


def _encode_pub(ctx: TraceContext) -> str:
    bean = _first_bean(ctx)
    return _record(
        [
            TraceType.Pub.value,
            _java_long("timestamp", ctx.timestamp),
            _text("region_id", ctx.region_id),
            _text("group_name", ctx.group_name),
            _text("topic", bean.topic),
            _text("msg_id", bean.msg_id),
            _text("tags", bean.tags),
            _text("keys", bean.keys),
            _text("store_host", bean.store_host),
            _java_int("body_length", bean.body_length),
            _java_int("cost_time", ctx.cost_time),
            _msg_type(ctx.trace_type, bean),
            _text("offset_msg_id", bean.offset_msg_id),
            _boolean(ctx.success),
        ]
    )


def _encode_sub_before(ctx: TraceContext) -> str:
    head = [
        TraceType.SubBefore.value,
        _java_long("timestamp", ctx.timestamp),
        _text("region_id", ctx.region_id),
        _text("group_name", ctx.group_name),
        _text("request_id", ctx.request_id),
    ]
    return "".join(
        _record(
            [
                *head,
                _text("msg_id", bean.msg_id),
                _java_int("retry_times", bean.retry_times),
                _text("keys", bean.keys),
            ]
        )
        for bean in ctx.trace_beans
    )


def _encode_sub_after(ctx: TraceContext) -> str:
    request_id = _text("request_id", ctx.request_id)
    cost_time = _java_int("cost_time", ctx.cost_time)
    success = _boolean(ctx.success)
    context_code = _java_int("context_code", ctx.context_code)
    timestamp = _java_long("timestamp", ctx.timestamp)
    group_name = _text("group_name", ctx.group_name)
    return "".join(
        _record(
            [
                TraceType.SubAfter.value,
                request_id,
                _text("msg_id", bean.msg_id),
                cost_time,
                success,
                _text("keys", bean.keys),
                context_code,
                timestamp,
                group_name,
            ]
        )
        for bean in ctx.trace_beans
    )


def _transaction_state(state: TransactionState | None) -> str:
    if state is None:
        # RocketMQ's encoder throws here too: a written "null" fails RocketMQ's and the
        # dashboard's decoders, which then lose every record of the trace message.
        raise ValueError("transaction_state is required on an EndTransaction context")
    return TransactionState(state).value


def _encode_end_transaction(ctx: TraceContext) -> str:
    bean = _first_bean(ctx)
    state = bean.transaction_state
    return _record(
        [
            TraceType.EndTransaction.value,
            _java_long("timestamp", ctx.timestamp),
            _text("region_id", ctx.region_id),
            _text("group_name", ctx.group_name),
            _text("topic", bean.topic),
            _text("msg_id", bean.msg_id),
            _text("tags", bean.tags),
            _text("keys", bean.keys),
            _text("store_host", bean.store_host),
            _msg_type(ctx.trace_type, bean),
            _text("transaction_id", bean.transaction_id),
            _transaction_state(state),
            _boolean(bean.from_transaction_check),
        ]
    )


def _encode_recall(ctx: TraceContext) -> str:
    bean = _first_bean(ctx)
    return _record(
        [
            TraceType.Recall.value,
            _java_long("timestamp", ctx.timestamp),
            _text("region_id", ctx.region_id),
            _text("group_name", ctx.group_name),
            _text("topic", bean.topic),
            _text("msg_id", bean.msg_id),
            _boolean(ctx.success),
        ]
    )


# ---- raw records: the fast path of the three records a traced client writes per message -------
#
# The trace hooks do not format anything on the business path: they queue a *raw record*, a
# tuple of the record's fields, and the dispatcher's worker writes a whole batch of them at once
# with :func:`write_records` (one f-string per record, no call per record). A raw record is
#
#     (kind, topic, region_id, msg_id, keys, *fields)
#
# where ``kind`` is one of :data:`PUB`, :data:`SUB_BEFORE`, :data:`SUB_AFTER` (the trace type's
# name; compared by identity, so use these constants), the next four are common to every kind
# (topic and region group records into trace messages; msgId and keys go into the trace
# message's KEYS header) and ``fields`` are, in this order:
#
#     PUB         timestamp group_name tags store_host body_length cost_time msg_type
#                 offset_msg_id success
#     SUB_BEFORE  timestamp group_name request_id retry_times
#     SUB_AFTER   timestamp group_name request_id cost_time success context_code
#     SUB_PAIR    timestamp group_name request_id retry_times after_timestamp cost_time
#                 success context_code
#
# A SUB_PAIR is a SubBefore and the SubAfter of the same message in one tuple (the dispatcher
# joins them when the SubAfter comes while its SubBefore still waits): both records, one after
# the other, the SubAfter's timestamp being ``after_timestamp`` (:func:`split_pair`).
#
# The fast writer checks every integer's type and Java range but not the text fields: a text
# field holding U+0001 or U+0002 shows as a wrong separator count, which the caller checks once
# per trace message body (each record has :data:`RAW_SEPARATORS` of them). A raw record the fast
# writer refuses, or whose body count is wrong, goes through :func:`raw_context` and
# :func:`encode`, which raise naming the field. Both paths write the same bytes
# (tests/unit/test_trace_codec.py compares them).

#: kinds of raw record
PUB: str = TraceType.Pub.value
SUB_BEFORE: str = TraceType.SubBefore.value
SUB_AFTER: str = TraceType.SubAfter.value
SUB_PAIR: str = "SubBefore+SubAfter"

#: separators (U+0001 and U+0002 together) in the text of each kind: its field count
RAW_SEPARATORS: dict[str, int] = {PUB: 14, SUB_BEFORE: 8, SUB_AFTER: 9, SUB_PAIR: 17}

#: a raw record, as the trace hooks queue it (see above)
RawRecord = tuple[Any, ...]


def write_records(items: Sequence[object]) -> list[str | None]:
    """The record text of every raw record of ``items``, None for anything else (a
    :class:`TraceContext`) and for a raw record with an integer the fast path does not take
    (wrong type, outside the Java range): those go the checked way (:func:`raw_context`).

    The text fields are not checked here (see above): count the separators of the result.
    """
    out: list[str | None] = []
    put = out.append
    # (one loop with every record's f-string inline: this runs twice per consumed message.
    # Integers are most of a record's cost: small ones come from a table, and the timestamp
    # is rendered once per millisecond, as records of one batch mostly share it)
    null, dec, n_dec = _NULL, _DECIMALS, len(_DECIMALS)
    sub_pair, sub_after, sub_before, pub, tuple_ = SUB_PAIR, SUB_AFTER, SUB_BEFORE, PUB, tuple
    long_min, long_max = _LONG_MIN, _LONG_MAX
    last_ts: object = None
    ts_s = ""
    # The fields a client's records share (region, group, topic) are written once per change,
    # into the text around them: a pair's head and tail, a Pub's head (keyed by identity).
    unset = object()
    pair_region: object = unset
    pair_group: object = unset
    pair_head = pair_tail = ""
    pub_region: object = unset
    pub_group: object = unset
    pub_topic: object = unset
    pub_head = ""
    for r in items:
        try:
            if type(r) is not tuple_:
                put(None)
                continue
            kind = r[0]
            if kind is sub_pair:
                _, _, region, msg_id, keys, ts, group, rid, retry, end, cost, ok, code = r
                if ts != last_ts or type(ts) is not int:
                    if type(ts) is not int or not long_min <= ts <= long_max:
                        put(None)
                        continue
                    last_ts, ts_s = ts, str(ts)
                if end == ts and type(end) is int:
                    end_s = ts_s
                elif type(end) is int and long_min <= end <= long_max:
                    end_s = str(end)
                else:
                    put(None)
                    continue
                if (
                    type(retry) is int and 0 <= retry < n_dec
                    and type(cost) is int and 0 <= cost < n_dec
                    and type(code) is int and 0 <= code < n_dec
                ):  # fmt: skip
                    retry_s, cost_s, code_s = dec[retry], dec[cost], dec[code]
                elif (
                    type(retry) is int and _INT_MIN <= retry <= _INT_MAX
                    and type(cost) is int and _INT_MIN <= cost <= _INT_MAX
                    and type(code) in _CODE_TYPES and _INT_MIN <= code <= _INT_MAX
                ):  # fmt: skip
                    retry_s, cost_s, code_s = str(retry), str(cost), f"{code:d}"
                else:
                    put(None)
                    continue
                if region is not pair_region or group is not pair_group:
                    pair_region, pair_group = region, group
                    group_s = null if group is None else group
                    pair_head = f"\x01{null if region is None else region}\x01{group_s}\x01"
                    pair_tail = f"\x01{group_s}\x02"
                rid_s = null if rid is None else rid
                msg_id_s = null if msg_id is None else msg_id
                keys_s = null if keys is None else keys
                put(
                    f"SubBefore\x01{ts_s}{pair_head}{rid_s}\x01{msg_id_s}\x01{retry_s}\x01{keys_s}"
                    f"\x02SubAfter\x01{rid_s}\x01{msg_id_s}\x01{cost_s}\x01"
                    f"{'true' if ok else 'false'}\x01{keys_s}\x01{code_s}\x01{end_s}{pair_tail}"
                )
            elif kind is sub_after:
                _, _, _, msg_id, keys, ts, group, rid, cost, ok, code = r
                if ts != last_ts or type(ts) is not int:
                    if type(ts) is not int or not long_min <= ts <= long_max:
                        put(None)
                        continue
                    last_ts, ts_s = ts, str(ts)
                if type(cost) is int and 0 <= cost < n_dec:
                    cost_s = dec[cost]
                elif type(cost) is int and _INT_MIN <= cost <= _INT_MAX:
                    cost_s = str(cost)
                else:
                    put(None)
                    continue
                if type(code) is int and 0 <= code < n_dec:
                    code_s = dec[code]
                elif type(code) in _CODE_TYPES and _INT_MIN <= code <= _INT_MAX:
                    code_s = f"{code:d}"
                else:
                    put(None)
                    continue
                put(
                    f"SubAfter\x01{null if rid is None else rid}\x01"
                    f"{null if msg_id is None else msg_id}\x01{cost_s}\x01"
                    f"{'true' if ok else 'false'}\x01{null if keys is None else keys}\x01"
                    f"{code_s}\x01{ts_s}\x01{null if group is None else group}\x02"
                )
            elif kind is sub_before:
                _, _, region, msg_id, keys, ts, group, rid, retry = r
                if ts != last_ts or type(ts) is not int:
                    if type(ts) is not int or not long_min <= ts <= long_max:
                        put(None)
                        continue
                    last_ts, ts_s = ts, str(ts)
                if type(retry) is int and 0 <= retry < n_dec:
                    retry_s = dec[retry]
                elif type(retry) is int and _INT_MIN <= retry <= _INT_MAX:
                    retry_s = str(retry)
                else:
                    put(None)
                    continue
                put(
                    f"SubBefore\x01{ts_s}\x01{null if region is None else region}\x01"
                    f"{null if group is None else group}\x01{null if rid is None else rid}\x01"
                    f"{null if msg_id is None else msg_id}\x01{retry_s}\x01"
                    f"{null if keys is None else keys}\x02"
                )
            elif kind is pub:
                (_, topic, region, msg_id, keys, ts, group, tags, store_host, body_length, cost,
                 msg_type, offset_msg_id, ok) = r  # fmt: skip
                if ts != last_ts or type(ts) is not int:
                    if type(ts) is not int or not long_min <= ts <= long_max:
                        put(None)
                        continue
                    last_ts, ts_s = ts, str(ts)
                if not (
                    type(body_length) is int and _INT_MIN <= body_length <= _INT_MAX
                    and type(cost) is int and _INT_MIN <= cost <= _INT_MAX
                    and type(msg_type) in _MSG_TYPE_TYPES and 0 <= msg_type <= 4
                ):  # fmt: skip
                    put(None)
                    continue
                if region is not pub_region or group is not pub_group or topic is not pub_topic:
                    pub_region, pub_group, pub_topic = region, group, topic
                    pub_head = (
                        f"\x01{null if region is None else region}\x01"
                        f"{null if group is None else group}\x01{null if topic is None else topic}"
                    )
                put(
                    f"Pub\x01{ts_s}{pub_head}"
                    f"\x01{null if msg_id is None else msg_id}\x01{null if tags is None else tags}"
                    f"\x01{null if keys is None else keys}\x01"
                    f"{null if store_host is None else store_host}\x01"
                    f"{dec[body_length] if 0 <= body_length < n_dec else body_length}\x01"
                    f"{dec[cost] if 0 <= cost < n_dec else cost}\x01{dec[msg_type]}\x01"
                    f"{null if offset_msg_id is None else offset_msg_id}\x01"
                    f"{'true' if ok else 'false'}\x02"
                )
            else:
                put(None)
        except Exception:  # a malformed tuple (wrong length, ...): the checked way
            put(None)
    return out


#: decimal text of the small non-negative integers (costs, retry counts, codes, body sizes)
_DECIMALS = tuple(str(i) for i in range(4096))
_CODE_TYPES = (int, ConsumeReturnType)
_MSG_TYPE_TYPES = (int, MessageType)

#: the pure-Python writer: the reference the compiled one is tested against, and the fallback
write_records_py = write_records


def _compiled_writer() -> Callable[[Sequence[object]], list[str | None]] | None:
    """The compiled ``write_records`` (``tracemq/trace/_speedups.pyx``, built at install when a
    C compiler is there), or None: not built, not loadable, or ``TRACEMQ_NO_EXTENSIONS`` set
    (to anything but 0), as ``AIOKAFKA_NO_EXTENSIONS`` turns off aiokafka's."""
    if os.environ.get("TRACEMQ_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        from tracemq.trace._speedups import write_records as compiled
    except ImportError:
        return None
    return compiled  # type: ignore[no-any-return]


#: the writer in use: the compiled one when it loads, else the pure-Python one (same output)
write_records = _compiled_writer() or write_records_py  # type: ignore[assignment]
#: whether ``write_records`` is the compiled one (benches report it)
COMPILED = write_records is not write_records_py


def split_pair(raw: RawRecord) -> tuple[RawRecord, RawRecord]:
    """The SubBefore and SubAfter raw records a SUB_PAIR stands for.

    Raises:
        ValueError: ``raw`` is not a SUB_PAIR.
    """
    if type(raw) is not tuple or len(raw) != 13 or raw[0] != SUB_PAIR:
        raise ValueError(f"not a raw SubBefore+SubAfter pair: {_shown(repr(raw))}")
    _, topic, region, msg_id, keys, ts, group, rid, retry, end, cost, ok, code = raw
    return (
        (SUB_BEFORE, topic, region, msg_id, keys, ts, group, rid, retry),
        (SUB_AFTER, topic, region, msg_id, keys, end, group, rid, cost, ok, code),
    )


def raw_context(raw: RawRecord) -> TraceContext:
    """The :class:`TraceContext` a raw record stands for (its checked encoding is the same text;
    a SUB_PAIR stands for two: :func:`split_pair` it first).

    Raises:
        ValueError: ``raw`` is not a raw record of a known kind and length.
    """
    kind = raw[0] if type(raw) is tuple and raw else None
    if kind == SUB_BEFORE and len(raw) == 9:
        _, topic, region, msg_id, keys, ts, group, rid, retry = raw
        return TraceContext(
            TraceType.SubBefore, timestamp=ts, region_id=region, group_name=group,
            request_id=rid,
            trace_beans=[TraceBean(topic=topic, msg_id=msg_id, keys=keys, retry_times=retry)],
        )  # fmt: skip
    if kind == SUB_AFTER and len(raw) == 11:
        _, topic, region, msg_id, keys, ts, group, rid, cost, ok, code = raw
        return TraceContext(
            TraceType.SubAfter, timestamp=ts, region_id=region, group_name=group,
            request_id=rid, cost_time=cost, success=ok, context_code=code,
            trace_beans=[TraceBean(topic=topic, msg_id=msg_id, keys=keys)],
        )  # fmt: skip
    if kind == PUB and len(raw) == 14:
        (_, topic, region, msg_id, keys, ts, group, tags, store_host, body_length, cost,
         msg_type, offset_msg_id, ok) = raw  # fmt: skip
        bean = TraceBean(
            topic=topic, msg_id=msg_id, offset_msg_id=offset_msg_id, tags=tags, keys=keys,
            store_host=store_host, body_length=body_length, msg_type=msg_type,
        )  # fmt: skip
        return TraceContext(
            TraceType.Pub, timestamp=ts, region_id=region, group_name=group, cost_time=cost,
            success=ok, trace_beans=[bean],
        )  # fmt: skip
    raise ValueError(f"not a raw trace record: {_shown(repr(raw))}")


def _raw_of(ctx: TraceContext) -> RawRecord | None:
    """The raw record of a one-bean Pub, SubBefore or SubAfter context (else None)."""
    if len(ctx.trace_beans) != 1:
        return None
    b = ctx.trace_beans[0]
    t = ctx.trace_type
    if t is TraceType.SubBefore:
        return (SUB_BEFORE, b.topic, ctx.region_id, b.msg_id, b.keys, ctx.timestamp,
                ctx.group_name, ctx.request_id, b.retry_times)  # fmt: skip
    if t is TraceType.SubAfter:
        return (SUB_AFTER, b.topic, ctx.region_id, b.msg_id, b.keys, ctx.timestamp,
                ctx.group_name, ctx.request_id, ctx.cost_time, ctx.success,
                ctx.context_code)  # fmt: skip
    if t is TraceType.Pub:
        return (PUB, b.topic, ctx.region_id, b.msg_id, b.keys, ctx.timestamp, ctx.group_name,
                b.tags, b.store_host, b.body_length, ctx.cost_time, b.msg_type,
                b.offset_msg_id, ctx.success)  # fmt: skip
    return None


def separators(text: str) -> int:
    """How many U+0001 and U+0002 ``text`` holds (a record of kind k: RAW_SEPARATORS[k])."""
    return text.count(CONTENT_SPLITOR) + text.count(FIELD_SPLITOR)


def _fast(checked: Callable[[TraceContext], str]) -> Callable[[TraceContext], str]:
    def encoder(ctx: TraceContext) -> str:
        raw = _raw_of(ctx)
        if raw is not None:
            (text,) = write_records([raw])
            if text is not None and separators(text) == RAW_SEPARATORS[raw[0]]:
                return text
        return checked(ctx)  # raises, naming the field

    return encoder


_fast_pub = _fast(_encode_pub)
_fast_sub_before = _fast(_encode_sub_before)
_fast_sub_after = _fast(_encode_sub_after)


_ENCODERS: dict[TraceType, Callable[[TraceContext], str]] = {
    TraceType.Pub: _fast_pub,
    TraceType.SubBefore: _fast_sub_before,
    TraceType.SubAfter: _fast_sub_after,
    TraceType.EndTransaction: _encode_end_transaction,
    TraceType.Recall: _encode_recall,
}


def _add_keys(keys: set[str], ctx: TraceContext) -> None:
    for bean in ctx.trace_beans:
        if bean.msg_id and bean.msg_id != _NULL:
            keys.add(bean.msg_id)
        if bean.keys:
            keys.update(k for k in bean.keys.split(KEY_SEPARATOR) if k and k != _NULL)


def _encode_into(ctx: TraceContext, keys: set[str]) -> str:
    encoder = _ENCODERS.get(ctx.trace_type)  # type: ignore[call-overload]
    data = (encoder or _ENCODERS[TraceType(ctx.trace_type)])(ctx)
    # Keys only after a successful encode, so a rejected context leaves no trace behind.
    _add_keys(keys, ctx)
    return data


def encode(ctx: TraceContext) -> TraceTransferBean:
    """Encode one trace context into RocketMQ trace text and its lookup keys.

    Args:
        ctx: the context to encode.

    Returns:
        ``data`` holds the records; ``keys`` holds every bean's ``msg_id`` and each of its
        space-separated business keys (empty and ``null`` entries left out).

    Raises:
        ValueError: a string field contains U+0001 or U+0002 (it would corrupt the record),
            an integer does not fit the Java type RocketMQ uses, ``msg_type`` is missing
            on a Pub or EndTransaction context, ``transaction_state`` is missing on an
            EndTransaction context, or a Pub, EndTransaction or Recall context has no trace
            bean. The message names the field.
    """
    keys: set[str] = set()
    data = _encode_into(ctx, keys)
    return TraceTransferBean(data=data, keys=keys)


def encode_many(contexts: Iterable[TraceContext]) -> TraceTransferBean:
    """Encode several contexts into one trace message body.

    The records are concatenated in order and the keys unioned, which is how a trace
    dispatcher batches contexts into a single trace message.

    Raises:
        ValueError: as :func:`encode`, for the first context that cannot be encoded.
    """
    keys: set[str] = set()
    data = "".join([_encode_into(ctx, keys) for ctx in contexts])
    return TraceTransferBean(data=data, keys=keys)


# --------------------------------------------------------------------------- decoding


def _java_split(text: str, separator: str) -> list[str]:
    parts = text.split(separator)
    while parts and not parts[-1]:
        parts.pop()
    return parts


def _shown(value: str) -> str:
    if len(value) > _MAX_SHOWN:
        value = value[:_MAX_SHOWN] + "..."
    return repr(value)


def _bad_field(name: str, index: int, value: str, problem: str) -> DecodeError:
    return DecodeError(f"field {name!r} (index {index}): {_shown(value)} {problem}")


def _str_at(fields: list[str], index: int) -> str | None:
    value = fields[index]
    return None if value == _NULL else value


def _optional_str_at(fields: list[str], index: int) -> str | None:
    return _str_at(fields, index) if index < len(fields) else None


def _decimal(value: str) -> int | None:
    """The Java-parseable integer ``value`` holds, or None.

    Python refuses to convert a string of more than 4300 digits (``ValueError``, a guard
    against quadratic-time conversion); no Java long has more than 19, so longer digit runs
    (leading zeros aside, which Java accepts) are out of range before conversion is tried."""
    if _DECIMAL.fullmatch(value) is None:
        return None
    digits = value.lstrip("+-").lstrip("0")
    if len(digits) > _LONG_DIGITS:
        return None
    number = int(digits) if digits else 0
    return -number if value.startswith("-") else number


def _integer_at(fields: list[str], index: int, name: str, low: int, high: int) -> int:
    value = fields[index]
    number = _decimal(value)
    if number is not None and low <= number <= high:
        return number
    kind = "int" if high == _INT_MAX else "long"
    raise _bad_field(name, index, value, f"is not a valid Java {kind}")


def _int_at(fields: list[str], index: int, name: str) -> int:
    return _integer_at(fields, index, name, _INT_MIN, _INT_MAX)


def _long_at(fields: list[str], index: int, name: str) -> int:
    return _integer_at(fields, index, name, _LONG_MIN, _LONG_MAX)


def _bool_at(fields: list[str], index: int) -> bool:
    # Boolean.parseBoolean: only "true", ignoring case, is true; nothing is an error.
    return fields[index].lower() == "true"


def _msg_type_at(fields: list[str], index: int) -> MessageType:
    value = fields[index]
    ordinal = _decimal(value)
    if ordinal is not None and 0 <= ordinal < len(MessageType):
        return MessageType(ordinal)
    raise _bad_field(
        "msg_type", index, value, f"is not a MessageType ordinal (0..{len(MessageType) - 1})"
    )


def _transaction_state_at(fields: list[str], index: int) -> TransactionState | None:
    value = fields[index]
    if value == _NULL:
        return None
    try:
        return TransactionState(value)
    except ValueError:
        raise _bad_field(
            "transaction_state", index, value, "is not a known transaction state"
        ) from None


def _need(fields: list[str], minimum: int) -> None:
    if len(fields) < minimum:
        raise DecodeError(
            f"{fields[0]} record has {len(fields)} fields; at least {minimum} are required"
        )


def _decode_pub(f: list[str]) -> TraceContext:
    _need(f, 12)
    bean = TraceBean(
        topic=_str_at(f, 4),
        msg_id=_str_at(f, 5),
        tags=_str_at(f, 6),
        keys=_str_at(f, 7),
        store_host=_str_at(f, 8),
        body_length=_int_at(f, 9, "body_length"),
        msg_type=_msg_type_at(f, 11),
    )
    ctx = TraceContext(
        trace_type=TraceType.Pub,
        timestamp=_long_at(f, 1, "timestamp"),
        region_id=_str_at(f, 2),
        group_name=_str_at(f, 3),
        cost_time=_int_at(f, 10, "cost_time"),
        trace_beans=[bean],
    )
    if len(f) == 13:
        ctx.success = _bool_at(f, 12)
    elif len(f) >= 14:
        bean.offset_msg_id = _str_at(f, 12)
        ctx.success = _bool_at(f, 13)
        bean.client_host = _optional_str_at(f, 14)
    return ctx


def _decode_sub_before(f: list[str]) -> TraceContext:
    # 7 fields: the encoder wrote an empty keys, which Java's split then dropped.
    _need(f, 7)
    bean = TraceBean(
        msg_id=_str_at(f, 5),
        retry_times=_int_at(f, 6, "retry_times"),
        keys=_optional_str_at(f, 7),
        client_host=_optional_str_at(f, 8),
    )
    return TraceContext(
        trace_type=TraceType.SubBefore,
        timestamp=_long_at(f, 1, "timestamp"),
        region_id=_str_at(f, 2),
        group_name=_str_at(f, 3),
        request_id=_str_at(f, 4),
        trace_beans=[bean],
    )


def _decode_sub_after(f: list[str]) -> TraceContext:
    _need(f, 6)
    ctx = TraceContext(
        trace_type=TraceType.SubAfter,
        request_id=_str_at(f, 1),
        cost_time=_int_at(f, 3, "cost_time"),
        success=_bool_at(f, 4),
        trace_beans=[TraceBean(msg_id=_str_at(f, 2), keys=_str_at(f, 5))],
    )
    if len(f) >= 7:
        ctx.context_code = _int_at(f, 6, "context_code")
    if len(f) >= 9:
        ctx.timestamp = _long_at(f, 7, "timestamp")
        ctx.group_name = _str_at(f, 8)
    elif len(f) == 8:
        # RocketMQ ignores an 8th field; it is our timestamp when a 9-field record lost its
        # empty group_name to the split, so kept when it reads as one, never a reason to drop.
        number = _decimal(f[7])
        if number is not None and _LONG_MIN <= number <= _LONG_MAX:
            ctx.timestamp = number
    return ctx


def _decode_end_transaction(f: list[str]) -> TraceContext:
    _need(f, 13)
    bean = TraceBean(
        topic=_str_at(f, 4),
        msg_id=_str_at(f, 5),
        tags=_str_at(f, 6),
        keys=_str_at(f, 7),
        store_host=_str_at(f, 8),
        msg_type=_msg_type_at(f, 9),
        transaction_id=_str_at(f, 10),
        transaction_state=_transaction_state_at(f, 11),
        from_transaction_check=_bool_at(f, 12),
    )
    return TraceContext(
        trace_type=TraceType.EndTransaction,
        timestamp=_long_at(f, 1, "timestamp"),
        region_id=_str_at(f, 2),
        group_name=_str_at(f, 3),
        trace_beans=[bean],
    )


def _decode_recall(f: list[str]) -> TraceContext:
    _need(f, 7)
    return TraceContext(
        trace_type=TraceType.Recall,
        timestamp=_long_at(f, 1, "timestamp"),
        region_id=_str_at(f, 2),
        group_name=_str_at(f, 3),
        success=_bool_at(f, 6),
        trace_beans=[TraceBean(topic=_str_at(f, 4), msg_id=_str_at(f, 5))],
    )


_DECODERS: dict[str, Callable[[list[str]], TraceContext]] = {
    TraceType.Pub.value: _decode_pub,
    TraceType.SubBefore.value: _decode_sub_before,
    TraceType.SubAfter.value: _decode_sub_after,
    TraceType.EndTransaction.value: _decode_end_transaction,
    TraceType.Recall.value: _decode_recall,
}


def decode_report(text: str | bytes) -> DecodeResult:
    """Decode a trace message body, reporting the records that could not be decoded.

    See the module docstring for the tolerance rules. Each SubBefore and SubAfter record
    becomes its own context with one bean, as in RocketMQ's decoder. Records that are
    empty once trailing empty fields are removed (normally only the text after the last
    record separator) are skipped without a report.

    Returns:
        The decoded contexts in record order and one :class:`MalformedRecord` per
        malformed or unknown-type record; ``index`` counts records from 0 in the message.
        Never raises, for any input: bytes are read as UTF-8 (an invalid sequence becomes
        U+FFFD, so the record holding it is still seen), and anything that is neither text
        nor bytes is one malformed record.
    """
    result = DecodeResult()
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        result.errors.append(
            MalformedRecord(0, "", f"not text: a {type(text).__name__} was given to decode")
        )
        return result
    for index, raw in enumerate(_java_split(text, FIELD_SPLITOR)):
        fields = _java_split(raw, CONTENT_SPLITOR)
        if not fields:
            continue
        decoder = _DECODERS.get(fields[0])
        if decoder is None:
            kind = fields[0][:_MAX_SHOWN]
            result.errors.append(MalformedRecord(index, raw, f"unknown trace type '{kind}'"))
            continue
        try:
            result.contexts.append(decoder(fields))
        except DecodeError as exc:
            result.errors.append(MalformedRecord(index, raw, str(exc)))
    return result


def decode(text: str | bytes) -> list[TraceContext]:
    """Decode a trace message body into contexts, silently skipping malformed records.

    Use :func:`decode_report` to learn what was skipped and why. Never raises, for any input.
    """
    return decode_report(text).contexts
