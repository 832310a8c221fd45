"""The store's place index from the places ingest decoded (``StoreRows.places``) is the one it
builds from the records: same hashes, same rows, same bytes, for any offsetMsgId."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracemq.message_id import encode_offset_msg_id
from tracemq_collector import store as store_module
from tracemq_collector.events import PLACE_COLUMNS, StoreRows, decode_chunk
from tracemq_collector.store import TraceStore

S = "\x01"
E = "\x02"
TOPIC = "RMQ_SYS_TRACE_TOPIC"
TS = 1_704_164_645_123
INGEST = 1_704_200_000_000
_HEX = "0123456789abcdefABCDEF"

_hosts = st.one_of(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 65535)).map(
        lambda t: f"10.{t[0]}.{t[1]}.9:{t[2]}"
    ),
    st.integers(0, 2**16 - 1).map(lambda n: f"[fd00::{n:x}]:10911"),
)
#: Well-formed ids (upper case as RocketMQ writes them, or lower), and every way one can be
#: odd: wrong length, spaces (bytes.fromhex skips them), non-ASCII digits, garbage, empty.
_offset_msg_ids = st.one_of(
    st.builds(encode_offset_msg_id, _hosts, st.integers(0, 2**15 - 1), st.integers(0, 2**48 - 1)),
    st.builds(
        lambda host, q, o: encode_offset_msg_id(host, q, o).lower(),
        _hosts,
        st.integers(0, 2**15 - 1),
        st.integers(0, 2**48 - 1),
    ),
    st.text(_HEX, min_size=32, max_size=32),
    st.text(_HEX, min_size=56, max_size=56),
    st.text(_HEX, min_size=0, max_size=60),
    st.text(_HEX + " \t\u0663\uff10xyz-", min_size=32, max_size=32),
    st.text(_HEX + " \t\u0663\uff10", min_size=56, max_size=56),
    st.text(st.characters(codec="utf-8", exclude_characters=S + E), max_size=60),
    st.sampled_from(["null", "NULL", "", " " * 32, "0" * 32, "F" * 56]),
)


@st.composite
def _records(draw: st.DrawFn) -> str:
    """A record: a Pub of one of several shapes (the fast path's 14 fields and others the
    general decoder reads), or a consume record."""
    oid = draw(_offset_msg_ids)
    n = draw(st.integers(0, 10**6))
    fields = [
        "Pub",
        str(draw(st.sampled_from([TS, TS + n, 0]))),
        "DefaultRegion",
        "pg",
        draw(st.sampled_from(["orders", "null", "%DLQ%cg"])),
        f"0A0000010F2C1A2B3C4D0000{n:08X}",
        "TagA",
        draw(st.sampled_from(["k1 k2", "null", ""])),
        "10.0.0.9:10911",
        draw(st.sampled_from(["512", "+512", "x"])),
        "7",
        draw(st.sampled_from(["0", "1", "9"])),
        oid,
        draw(st.sampled_from(["true", "false", "TRUE"])),
    ]
    shape = draw(st.sampled_from(["pub", "pub", "pub", "pub15", "pub13", "before", "after"]))
    if shape == "pub15":
        fields.append(draw(st.sampled_from(["1", "x", "null"])))
    elif shape == "pub13":
        fields.pop(12)
    elif shape == "before":
        fields = ["SubBefore", str(TS), "DefaultRegion", "cg", "req", fields[5], "0", "k1"]
    elif shape == "after":
        fields = ["SubAfter", "req", fields[5], "9", "true", "k1", "0", str(TS), "cg"]
    return S.join(fields) + E


_messages = st.lists(
    st.lists(_records(), min_size=1, max_size=6).map(lambda rs: "".join(rs).encode()),
    min_size=1,
    max_size=12,
)


def _chunks(values: list[bytes], partitions: int) -> Any:
    by_partition: dict[int, list[tuple[int, bytes, str]]] = {}
    for offset, value in enumerate(values):
        by_partition.setdefault(offset % partitions, []).append((offset, value, "10.1.1.1"))
    return decode_chunk([(TOPIC, p, recs) for p, recs in by_partition.items()], INGEST).store


def _without_places(batch: StoreRows) -> StoreRows:
    old = StoreRows.from_columns(
        batch.columns,
        batch.key_rows,
        batch.key_msg_ids,
        batch.quarantine,
        batch.progress,
        batch.ordered,
        batch.message_keys,
    )
    assert old.places is None
    return old


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as conn:
        return {
            t: sorted(conn.execute(f"SELECT * FROM {t}"))  # noqa: S608
            for t in ("blocks", "msg_index", "pub_index", "place_index", "key_index", "meta")
        }


@given(_messages, st.integers(1, 3), st.integers(0, 12))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_store_writes_the_same_bytes_from_the_places_as_from_the_records(
    values: list[bytes], partitions: int, replayed: int
) -> None:
    first = _chunks(values, partitions)
    assert first.places is not None and len(first.places) == len(PLACE_COLUMNS)
    # a second batch that replays part of the first (the store drops what it holds, and
    # renumbers the rest with their places)
    second = _chunks(values[len(values) - replayed :] + values, partitions)
    with tempfile.TemporaryDirectory() as tmp:
        new, old = Path(tmp) / "new.db", Path(tmp) / "old.db"
        with TraceStore(new) as s:
            s.write_rows(first)
            s.write_rows(second)
        with TraceStore(old) as s:
            s.write_rows(_without_places(first))
            s.write_rows(_without_places(second))
        assert _dump(new) == _dump(old)


@given(_messages, st.integers(1, 3))
@settings(max_examples=300, deadline=None)
def test_each_pubs_place_hash_from_its_places_is_the_one_from_its_record(
    values: list[bytes], partitions: int
) -> None:
    batch = _chunks(values, partitions)
    assert batch.places is not None
    types = batch.columns[store_module._E_TYPE - 1]
    got = store_module._place_hashes(types, *batch.places)
    want = {}
    for e in batch.events:
        if e[store_module._E_TYPE] == "Pub":
            place = store_module._place_hash(store_module._pub_offset_msg_id(e))
            if place is not None:
                want[e[0]] = place
    assert got == want
    assert all(type(h) is int for h in got.values())


def test_places_travel_to_the_worker_and_back() -> None:
    import pickle

    value = (
        S.join(
            [
                "Pub",
                str(TS),
                "r",
                "pg",
                "orders",
                "0A0000010F2C1A2B3C4D000012340001",
                "t",
                "k",
                "h",
                "1",
                "1",
                "0",
                encode_offset_msg_id("10.0.0.9:10911", 3, 42),
                "true",
            ]
        )
        + E
    ).encode()
    batch = _chunks([value, value * 3], 1)
    back = pickle.loads(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == batch and back.places == batch.places
    assert batch.places == [("10.0.0.9:10911",) * 4, (3,) * 4, (42,) * 4]
    # without places the batch pickles as before, and comes back without them
    old = _without_places(batch)
    assert pickle.loads(pickle.dumps(old)).places is None
