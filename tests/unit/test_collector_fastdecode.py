"""The collector's compiled decode step (``tracemq_collector/_fastdecode.pyx``) against its
pure-Python reference (``events._fast_rows``), and ``decode_chunk`` with and without it."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracemq.message_id import encode_offset_msg_id
from tracemq_collector import events as ev

try:
    from tracemq_collector import _fastdecode
except ImportError:  # not built (no compiler at install): the pure-Python path is in use
    _fastdecode = None  # type: ignore[assignment]

built = pytest.mark.skipif(_fastdecode is None, reason="the compiled decode step is not built")

S = "\x01"
TOPIC = "RMQ_SYS_TRACE_TOPIC"
TS = 1_704_164_645_123  # 2024-01-02T03:04:05.123Z
INGEST = 1_704_200_000_000
MSG_ID = "0A0000010F2C1A2B3C4D000012340001"
OFFSET_ID = encode_offset_msg_id("10.0.0.9:10911", 3, 42)
OFFSET_ID_V6 = encode_offset_msg_id("[fd00::9]:10911", 5, 2**40 + 1)

_NUMBERS = st.one_of(
    st.sampled_from(
        ["0", "7", "007", "-1", "+5", " 5", "", "null", "1e3", "\u0661", "\u00b2", "x", "9" * 19]
    ),
    st.integers(min_value=0, max_value=2**64).map(str),
    st.sampled_from([str(2**31 - 1), str(2**31), str(2**63 - 1), str(2**63), "9" * 20]),
    st.sampled_from([str(ev.MAX_TIMESTAMP_MS), str(ev.MAX_TIMESTAMP_MS + 1), str(TS)]),
    st.sampled_from([str(len(ev.MessageType) - 1), str(len(ev.MessageType))]),
)
_TEXTS = st.one_of(
    st.sampled_from(
        ["null", "NULL", "nul", "nulll", "", "true", "TRUE", "tRuE", "True ", "false", "tru\u00e9"]
    ),
    st.sampled_from(["\u0130", "T\u0130", "K", "\u212a"]),  # lower() changes their length or case
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=8),
)
_OFFSET_IDS = st.one_of(
    st.sampled_from([OFFSET_ID, OFFSET_ID_V6, OFFSET_ID.lower(), OFFSET_ID[:-1], "G" * 32]),
    st.sampled_from([" " + OFFSET_ID[1:], "null", ""]),
    st.text(alphabet="0123456789ABCDEFabcdef ", min_size=32, max_size=32),
)


@st.composite
def _record(draw: st.DrawFn) -> str:
    """A record's text: mostly one of the three common shapes with any field values, some
    with another field count, a trailing empty field, another kind or any text."""
    num, txt = (lambda: draw(_NUMBERS)), (lambda: draw(_TEXTS))
    shape = draw(st.integers(min_value=0, max_value=6))
    if shape == 0:
        fields = ["Pub", num(), txt(), txt(), txt(), MSG_ID, txt(), txt(), txt(), num(), num(),
                  num(), draw(_OFFSET_IDS), txt()]  # fmt: skip
    elif shape == 1:
        fields = ["SubBefore", num(), txt(), txt(), txt(), txt(), num(), txt()]
    elif shape == 2:
        fields = ["SubAfter", txt(), txt(), num(), txt(), txt(), num(), num(), txt()]
    elif shape == 3:  # a common shape with well-formed numbers (the fast path's usual record)
        fields = ["SubAfter", "req", MSG_ID, "3", "true", "k1 k2", "0", str(TS), "cg"]
    elif shape == 4:
        fields = ["Pub", str(TS), "R", "pg", "orders", MSG_ID, "TagA", "k", "h", "512", "7",
                  "0", OFFSET_ID, "true"]  # fmt: skip
    elif shape == 5:  # another field count or kind
        kind = draw(st.sampled_from(["Pub", "SubBefore", "SubAfter", "EndTransaction", "pub"]))
        fields = [kind, *draw(st.lists(st.one_of(_NUMBERS, _TEXTS), max_size=15))]
    else:
        return draw(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x02")))
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        fields[-1] = ""  # Java's split would drop it: not the fast path's
    return S.join(fields)


def _reference(
    texts: list[str], start: int, ingest_ts: int, client_host: str | None, client_id: str | None
) -> tuple[int, list[list[object]]]:
    """What fast_into must do, by the reference: its rows from ``start`` up to the first None."""
    rows = ev._fast_rows(texts, TOPIC, 2, 7, ingest_ts, client_host, client_id)[start:]
    stop = next((start + k for k, row in enumerate(rows) if row is None), len(texts))
    columns: list[list[object]] = [[] for _ in ev.ROW_NAMES]
    for row in rows[: stop - start]:
        assert row is not None
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return stop, columns


@built
@given(
    st.lists(_record(), max_size=8),
    st.integers(min_value=0, max_value=8),
    st.sampled_from([INGEST, 0, ev.MAX_TIMESTAMP_MS + 1]),
    st.sampled_from([None, "10.0.0.77"]),
    st.sampled_from([None, "client-1"]),
)
@settings(max_examples=2000, deadline=None)
def test_fast_into_appends_what_the_reference_decodes(
    texts: list[str], start: int, ingest_ts: int, client_host: str | None, client_id: str | None
) -> None:
    start = min(start, len(texts))
    expected_stop, expected = _reference(texts, start, ingest_ts, client_host, client_id)
    columns: list[list[object]] = [["before"] for _ in ev.ROW_NAMES]  # appended to, not replaced
    stop = _fastdecode.fast_into(
        texts, start, columns, TOPIC, 2, 7, ingest_ts, client_host, client_id
    )
    assert stop == expected_stop
    assert [c[1:] for c in columns] == expected
    assert all(c[0] == "before" for c in columns)
    # the same types, not only equal values (True is not 1 in a column)
    assert [[type(v) for v in c[1:]] for c in columns] == [[type(v) for v in c] for c in expected]


@built
def test_fast_into_refuses_columns_of_another_shape_and_texts_that_are_not_str() -> None:
    with pytest.raises(TypeError, match="column lists"):
        _fastdecode.fast_into([], 0, [[]], TOPIC, 2, 7, INGEST, None, None)
    with pytest.raises(TypeError, match="must be lists"):
        _fastdecode.fast_into([], 0, [() for _ in ev.ROW_NAMES], TOPIC, 2, 7, INGEST, None, None)
    columns: list[list[object]] = [[] for _ in ev.ROW_NAMES]
    with pytest.raises(TypeError, match="must be str"):
        _fastdecode.fast_into([b"Pub"], 0, columns, TOPIC, 2, 7, INGEST, None, None)
    assert columns == [[] for _ in ev.ROW_NAMES]


@built
def test_the_decoder_uses_the_built_steps_unless_told_not_to() -> None:
    if os.environ.get("TRACEMQ_NO_EXTENSIONS", "") not in ("", "0"):
        assert ev._FAST_INTO is None
        assert ev._ADD_KEY_ROWS is ev._add_key_rows
        assert ev._ARROW_BUFFERS is None
    else:
        assert ev._FAST_INTO is _fastdecode.fast_into
        assert ev._ADD_KEY_ROWS is _fastdecode.add_key_rows
        assert ev._ARROW_BUFFERS is _fastdecode.arrow_buffers


def _many_keys(n: int, seed: int) -> str:
    """``n`` keys of 0 – 1500 drawn with ``seed``: about 230 – 270 distinct, on both sides of
    the cap of MAX_KEYS_PER_MESSAGE (256) distinct keys per message. Drawn from one seed, not
    as a list of ``n`` Hypothesis integers: those cost ~70 s of generation over the test's
    examples, and stayed under the cap (0 – 400 gave ~190 distinct)."""
    rng = random.Random(seed)
    return " ".join(str(rng.randint(0, 1500)) for _ in range(n))


_KEYS = st.one_of(
    st.none(),
    st.sampled_from(["", "null", "a", "b a a", "a  b", " a", "null null", "k null", "x y z"]),
    st.lists(st.sampled_from(["a", "b", "", "null", "K", "\u00e9"]), max_size=6).map(" ".join),
    st.builds(_many_keys, st.integers(250, 300), st.integers(0, 2**32 - 1)),
)


@built
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["Pub", "SubBefore", "SubAfter", "pub"]),
            _KEYS,
            st.sampled_from([None, "m1", "m2", "m3", ""]),
            st.sampled_from([None, "orders"]),
            st.integers(min_value=0, max_value=2**62),
        ),
        max_size=12,
    ),
    st.integers(min_value=0, max_value=2**40),
    st.sets(st.sampled_from(["m1", "m2"])),
)
@settings(max_examples=1000, deadline=None)
def test_add_key_rows_gives_what_the_reference_gives(
    events: list[tuple[object, ...]], first: int, seen: set[str]
) -> None:
    columns: list[list[object]] = [[] for _ in ev.ROW_NAMES]
    for kind, keys, msg_id, topic, stamp in events:
        for name, value in (
            ("trace_type", kind), ("keys", keys), ("msg_id", msg_id), ("topic", topic),
            ("timestamp", stamp),
        ):  # fmt: skip
            columns[ev.COL[name]].append(value)
    cols = [tuple(c) for c in columns]
    expected: tuple[set[str], list[object], list[str]] = (set(seen), [], [])
    ev._add_key_rows(cols, first, *expected)
    got: tuple[set[str], list[object], list[str]] = (set(seen), [], [])
    _fastdecode.add_key_rows(cols, first, *got)
    assert got == expected


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    records = draw(st.lists(_record(), max_size=6))
    value = "".join(r + "\x02" for r in records).encode()
    mutation = draw(st.integers(min_value=0, max_value=5))
    if mutation == 0 and value:  # invalid UTF-8 somewhere: record by record
        at = draw(st.integers(min_value=0, max_value=len(value) - 1))
        value = value[:at] + b"\xff" + value[at:]
    elif mutation == 1:
        value = value[: draw(st.integers(min_value=0, max_value=len(value)))]
    elif mutation == 2:
        value = draw(st.binary(max_size=40))
    return value


def _chunk_view(chunk: ev.DecodedChunk) -> tuple[object, ...]:
    lakes = {
        key: {hour: batch.to_pydict() for hour, batch in part.lake.items()}
        for key, part in chunk.partitions.items()
    }
    parts = {
        key: (part.first_offset, part.end_offset, part.events)
        for key, part in chunk.partitions.items()
    }
    return chunk.store, chunk.records, parts, lakes


@built
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=2), st.lists(_message(), max_size=4)),
        max_size=3,
    ),
    st.sampled_from([INGEST, 0]),
)
@settings(max_examples=400, deadline=None)
def test_decode_chunk_is_the_same_with_and_without_the_compiled_step(
    partitions: list[tuple[int, list[bytes]]], ingest_ts: int
) -> None:
    messages = [
        (TOPIC, p, [(10 + i, value, "10.9.9.9", None, "cid") for i, value in enumerate(values)])
        for p, values in partitions
    ]
    saved = ev._FAST_INTO, ev._ADD_KEY_ROWS, ev._ARROW_BUFFERS
    try:  # (each side set explicitly: TRACEMQ_NO_EXTENSIONS may have turned the module off)
        ev._FAST_INTO, ev._ADD_KEY_ROWS = _fastdecode.fast_into, _fastdecode.add_key_rows
        ev._ARROW_BUFFERS = _fastdecode.arrow_buffers
        compiled = ev.decode_chunk(messages, ingest_ts)
        ev._FAST_INTO, ev._ADD_KEY_ROWS, ev._ARROW_BUFFERS = None, ev._add_key_rows, None
        pure = ev.decode_chunk(messages, ingest_ts)
    finally:
        ev._FAST_INTO, ev._ADD_KEY_ROWS, ev._ARROW_BUFFERS = saved
    assert _chunk_view(compiled) == _chunk_view(pure)
    for key, part in compiled.partitions.items():
        for hour, batch in part.lake.items():
            assert batch.equals(pure.partitions[key].lake[hour])
            assert isinstance(batch, pa.RecordBatch)


_ARROW_TYPES = {
    _fastdecode.ARROW_STRING if _fastdecode else 0: pa.string(),
    _fastdecode.ARROW_INT64 if _fastdecode else 1: pa.int64(),
    _fastdecode.ARROW_INT32 if _fastdecode else 2: pa.int32(),
    _fastdecode.ARROW_BOOL if _fastdecode else 3: pa.bool_(),
}
# values of every kind, and the edges of each type's range; a column is mostly of one kind
_ANY_VALUE = st.one_of(
    st.none(),
    st.text(),  # lone surrogates included: pyarrow refuses them
    st.integers(),
    st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63, -(2**63)]),
    st.sampled_from([-(2**63) - 1, 0, -1]),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=4),
)
_COLUMNS = st.one_of(
    st.lists(st.one_of(st.none(), st.text()), max_size=40),
    st.lists(st.one_of(st.none(), st.integers(-(2**64), 2**64)), max_size=40),
    st.lists(st.one_of(st.none(), st.integers(-(2**32), 2**32)), max_size=40),
    st.lists(st.one_of(st.none(), st.booleans()), max_size=40),
    st.lists(_ANY_VALUE, max_size=12),
)


def _plain(v: object, kind: int) -> bool:
    """Whether ``v`` is a value of the lake's column type of ``kind`` as the decoder makes it."""
    if kind == 0:
        return type(v) is str and not any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if kind == 3:
        return type(v) is bool
    bits = 31 if kind == 2 else 63
    return type(v) is int and -(2**bits) <= v < 2**bits


def _converted(column: tuple[object, ...], type_: pa.DataType) -> object:
    try:
        return pa.array(column, type=type_)
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        return type(exc)


@built
@given(_COLUMNS, st.sampled_from(sorted(_ARROW_TYPES)))
@settings(max_examples=3000, deadline=None)
def test_arrow_buffers_build_what_pyarrow_converts_or_leave_it_to_pyarrow(
    values: list[object], kind: int
) -> None:
    column, type_ = tuple(values), _ARROW_TYPES[kind]
    built_ = _fastdecode.arrow_buffers(column, kind, pa.allocate_buffer)
    expected = _converted(column, type_)
    # the lake's column types as the collector decodes them: always built here
    plain = all(v is None or _plain(v, kind) for v in column)
    assert (built_ is not None) == plain
    if built_ is None:
        return  # _lake_array converts with pyarrow.array: whatever it gives or raises
    nulls, validity, offsets, data = built_
    buffers = [validity, data] if offsets is None else [validity, offsets, data]
    array = pa.Array.from_buffers(type_, len(column), buffers, nulls)
    array.validate(full=True)
    assert isinstance(expected, pa.Array)
    assert array.equals(expected)
    assert array.null_count == expected.null_count == sum(v is None for v in column)
    assert array.to_pylist() == list(column)
    # and through the decoder's own helper
    assert ev._lake_array(column, type_).equals(expected)


@built
@pytest.mark.parametrize(
    ("column", "kind", "built_here"),
    [
        ((2**31 - 1, -(2**31), None), 2, True),
        ((2**31,), 2, False),
        ((-(2**31) - 1,), 2, False),
        ((2**63 - 1, -(2**63), None), 1, True),
        ((2**63,), 1, False),
        ((-(2**63) - 1,), 1, False),
        ((True,), 1, False),  # a bool is not taken as a number here
        ((1,), 3, False),
        (("a", "\udc80"), 0, False),  # a lone surrogate
        (("a", b"b"), 0, False),
        ((), 0, True),
        ((None, None), 0, True),
        (("é", "", None, "x" * 1000), 0, True),
    ],
)
def test_arrow_buffers_edges(column: tuple[object, ...], kind: int, built_here: bool) -> None:
    assert (_fastdecode.arrow_buffers(column, kind, pa.allocate_buffer) is not None) == built_here
    expected = _converted(column, _ARROW_TYPES[kind])
    got = (
        ev._lake_array(column, _ARROW_TYPES[kind])
        if isinstance(expected, pa.Array)
        else pytest.raises(expected, ev._lake_array, column, _ARROW_TYPES[kind]).type
    )
    if isinstance(expected, pa.Array):
        assert got.equals(expected)


@built
def test_arrow_buffers_refuse_an_unknown_kind_and_a_short_buffer() -> None:
    with pytest.raises(ValueError, match="unknown kind 7"):
        _fastdecode.arrow_buffers((1, 2), 7, pa.allocate_buffer)
    with pytest.raises(TypeError):
        _fastdecode.arrow_buffers([1, 2], 1, pa.allocate_buffer)  # a tuple, as the decoder's
    with pytest.raises(ValueError, match=r"allocate\(16\) gave 8 bytes"):
        _fastdecode.arrow_buffers((1, 2), 1, lambda size: bytearray(size // 2))
    with pytest.raises(BufferError):  # not writable
        _fastdecode.arrow_buffers((1, 2), 1, lambda size: bytes(size))


@built
def test_the_lake_columns_live_in_arrow_s_memory_pool() -> None:
    """Like pyarrow.array's, the built columns are allocated from Arrow's default pool (the
    collector's collector_arrow_memory_pool) and handed back to it when dropped."""
    column = tuple(f"msg-{i}" for i in range(10_000))
    before = pa.total_allocated_bytes()
    array = ev._lake_array(column, pa.string())
    assert pa.total_allocated_bytes() - before >= array.nbytes > 10_000 * 5
    del array
    assert pa.total_allocated_bytes() == before
