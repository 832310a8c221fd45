"""The trace store: one SQLite file (WAL) per collector, for point look-ups.

Why SQLite, why this layout, and the measurements behind both: ``services/collector/STORE.md``.

Tables (schema version 6)
-------------------------
``meta``
    ``schema_version`` of the file, ``next_block_id`` (block ids are assigned by the batch
    rather than by SQLite, so index rows can name their events without a read-back) and
    ``event_count`` (kept with every write, so counting needs no scan).
``blocks``
    The events, up to :data:`BLOCK_EVENTS` consecutive events of one trace partition per row,
    compressed together (zstd; zlib in files written before it, still read): a trace record
    repeats its message's msgId, keys, group and hosts, and neighbouring records share most of
    the rest, so a block takes about an eighth of its text. A row holds the partition (``tp``, an id in ``partitions``), the range of
    trace offsets and of timestamps of its events, their number, and ``data``. Each event in
    ``data`` keeps its position in the block (``pos``), its coordinates ``(trace_offset,
    trace_index)``, the columns queries filter on (``trace_type, timestamp, msg_id, topic``),
    the two lake columns the wire format may lack and ingest may fill in (``client_host``,
    ``store_time``), ``ingest_ts``, ``record``, the record's own text, and ``client_id``.
    The other lake columns are decoded again from ``record`` when read
    (:func:`tracemq_collector.events.event_from_stored`, the code ingest used), and the stored
    columns override what that decode says. An event is named by its **ref**, ``block id << 8 |
    pos``. Indexes: ``(tp, last_offset, first_offset)`` (dedupe and the lake's range reads),
    ``max_ts`` (time windows) and ``min_ts`` (retention).
``msg_index``
    ``(bucket, msg_hash, block)``, one row per msgId and block that holds events of it, and
    ``pub``: whether one of them is a Pub. ``msg_hash`` is 8 bytes of BLAKE2b of the msgId text,
    so the index is small whatever the id looks like; a look-up decodes the blocks it names and
    keeps the events whose msgId is the one asked for (a hash collision costs a block read,
    never a wrong answer). ``bucket`` is the block's ref >> :data:`BUCKET_BITS` (512 blocks,
    65 536 events at most), as in every index keyed by a hash or a key: a batch inserts into
    the newest bucket only, a subtree of a few hundred pages that stays in the cache, where an
    index led by the hash would put every new row on a random page of the whole index and
    each transaction would write most of it to the WAL again (the cost per event grew with the
    store: docs/performance.md, "Collector ingest, eleventh pass"). A look-up seeks each
    bucket (about 150 at ten million events).
``pub_index``
    ``(topic id, timestamp, ref)`` of every Pub event with a topic: "messages of a topic".
``key_index``
    The business-key index: ``(bucket, key, timestamp, ref)`` and the topic id, one row per
    (key, message), bucketed like ``msg_index``. Keys come from a message's Pub trace, which
    also names its topic and tags; a send retried under the same msgId adds no second row: the
    batch checks ``msg_index`` for an earlier Pub in the newest :data:`RETRY_BUCKETS` buckets
    (the last 65 536 – 131 072 events stored; a retry's Pub traces are written within the
    send's time-out of each other and stored next to each other). A retry whose first Pub is
    stored further back (trace partitions read far apart, after a long stop) is listed twice
    by key, once per Pub. A message whose Pub trace is lost is still found by msgId, not by
    key.
``place_index``
    ``(bucket, place hash, ref)`` of every Pub with an offsetMsgId, bucketed like
    ``msg_index``: the hash of the store host, queue
    and Kafka offset it names (:func:`tracemq_collector.events._offset_coords`, the decode
    ingest uses), for :meth:`TraceStore.msg_id_by_offset_msg_id`.
``names`` / ``partitions``
    Topics (``names``) and ``(trace_topic, partition)`` pairs as small integer ids, for the
    indexes above.
``quarantine``
    Records that could not become events, deduped by their coordinates.
``message_keys``
    ``key → (trace_topic, partition, offset)`` of the trace messages that carried an
    idempotency key (header ``IDEMPOTENCY_KEY``, set by tracemq's trace dispatcher, the same on
    every attempt of one trace message). A message whose key is already here at *other*
    coordinates is a repeat (a timed-out send that was delivered after all, plus its retries):
    its events and quarantine rows are dropped, counted, logged. Written in the batch's
    transaction, so the decisions survive a restart and a replay makes the same ones. Bounded:
    per partition, only the keys of the last :data:`DEDUPE_WINDOW_MESSAGES` offsets are kept
    (the dispatcher sends every copy to the same queue within its delivery timeout, so copies
    are close in one partition). Keys are looked up across partitions too, which catches a copy
    that moved to another queue of the same collector. Messages without the header (RocketMQ
    clients) are never deduplicated.
``progress`` / ``lake_progress``
    ``(trace_topic, partition) → next_offset`` of the store and of the Parquet lake.
``lake_pending``
    Lake segments begun but not finished (see :mod:`tracemq_collector.lake`).

Exactly once
------------
Events are deduped by their coordinates ``(trace_topic, partition, offset, index)``: before it
writes, a batch reads the coordinates of the blocks of its partitions that overlap its offset
range (for a fresh batch, none) and drops what is already stored, so a replay stores and indexes
nothing twice and the call returns the exact number of new events.

Older files
-----------
A file of schema version 1 to 4 (one row per event, about 490 bytes per event) is refused with
:class:`StoreSchemaError` naming the file and what to do (:data:`OLD_LAYOUT_HELP`), and is left
untouched: converting gigabytes on open would hold the collector's start for minutes, and its
events are in the lake as well. A file of schema version 5 (the same blocks; the hashed indexes
without their bucket) is upgraded on open, in one transaction: the two indexes are rebuilt in
key order (10.5 s for ten million events).

Durability
----------
``journal_mode=WAL`` and ``synchronous=NORMAL``: a committed batch survives the process being
killed (``kill -9``) because it is in the WAL file; an OS crash or power loss may lose the last
transactions (it never corrupts the file). That loses no trace either, provided ingest resumes
from :meth:`TraceStore.progress` and not from the Kafka committed offsets: the progress is
written in the same transaction as the events, so a lost transaction takes its progress with it
and its records are read again. Lake bookkeeping (:meth:`TraceStore.begin_lake_segment`,
:meth:`TraceStore.finish_lake_segment`) commits with ``synchronous=FULL``; the WAL is one
sequential file, so that fsync makes every earlier batch durable too, and the lake can never be
ahead of the store after a power loss.

Threads
-------
One writer connection, serialised by a lock, so ingest, lake bookkeeping and retention may call
from different threads; each write holds the lock for one transaction. Reads use one connection
per thread (``threading.local``); WAL lets them run while the writer writes. Every call is
synchronous; the asyncio collector runs them in threads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import sqlite3
import struct
import sys
import threading
import time
import warnings
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import eq as _eq
from operator import itemgetter
from operator import rshift as _rshift
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import zstandard
from tracemq import lake
from tracemq.log import get_logger
from tracemq.message_id import decode_offset_msg_id

from tracemq_collector.errors import StoreSchemaError, TraceStoreError
from tracemq_collector.events import (
    KEY_SHIFT,
    MAX_KEYS_PER_MESSAGE,
    ROW_NAMES,
    STORE_ROW,
    StoreRows,
    event_from_stored,
    hour_partition,
    split_keys,
    store_rows,
)
from tracemq_collector.events import _offset_coords as _offset_coords  # the ingest's decode

__all__ = [
    "BLOCK_EVENTS",
    "DEDUPE_WINDOW_MESSAGES",
    "BUCKET_BITS",
    "MAX_KEYS_PER_MESSAGE",
    "STORE_ROW",
    "MAX_PAGE_SIZE",
    "RETRY_BUCKETS",
    "OLD_LAYOUT_HELP",
    "SCHEMA_VERSION",
    "StoreSchemaError",
    "TraceStore",
    "TraceStoreError",
    "stored_events",
]

#: Version of this file's table layout; a file of another version is refused, not misread.
SCHEMA_VERSION = 6
#: Trace offsets per partition whose idempotency keys are kept (see ``message_keys``): about
#: 100 bytes each. A repeat arriving later than this many trace messages after the first copy
#: in its partition is stored again.
DEDUPE_WINDOW_MESSAGES = 200_000
#: Events per block at most (a ref keeps 8 bits for the position). Larger blocks compress a
#: little better, but a look-up decompresses a whole block per event it returns.
BLOCK_EVENTS = 128
#: A bucket of the hashed and keyed indexes (``msg_index``, ``place_index``, ``key_index``)
#: covers the refs with the same ``ref >> BUCKET_BITS`` (512 blocks).
BUCKET_BITS = 17
#: The retried-send check of keyed Pubs looks for an earlier Pub in this many newest buckets.
RETRY_BUCKETS = 2
#: Largest ``limit`` a paged query accepts.
MAX_PAGE_SIZE = 1000
#: What to do with a file of an older layout (the error message says it).
OLD_LAYOUT_HELP = (
    "this collector keeps schema version 6 (events in compressed blocks, a fifth of the size; "
    "it upgrades files of version 5) and does not convert older ones: stop the collector, move this file and its -wal/-shm "
    "away and start it again (a new store resumes each trace partition at the collector "
    "group's committed offset, which never passes what the old store and the lake held, so "
    "nothing is lost; the lake may get a second copy of the events read after the last commit; "
    "the events stored before are in the lake and the moved file), or keep running the "
    "previous collector version on it"
)

_T = TypeVar("_T")
log = get_logger("collector.store")
_KEY_SHIFT = KEY_SHIFT
_KEY_MASK = (1 << KEY_SHIFT) - 1
_POS_BITS = 8
_POS_MASK = (1 << _POS_BITS) - 1
_LAKE_COLUMNS = lake.COLUMN_NAMES
#: zstd level 1: on bench data 0.38 µs and 33 bytes per event, where zlib level 1 (the blocks
#: of earlier versions, still read) took 1.07 µs and 45 bytes; level 3 buys nothing more.
_ZSTD_LEVEL = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: zstd contexts are not for concurrent use: one per thread (writer, readers, worker).
_zstd = threading.local()


def _compress(data: bytes) -> bytes:
    c = getattr(_zstd, "c", None)
    if c is None:
        c = _zstd.c = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
    return c.compress(data)  # type: ignore[no-any-return]


def _decompress(data: bytes) -> bytes:
    """A block's bytes: zstd, or zlib (blocks written before zstd: no schema change, both read)."""
    if data[:4] != _ZSTD_MAGIC:
        return zlib.decompress(data)
    d = getattr(_zstd, "d", None)
    if d is None:
        d = _zstd.d = zstandard.ZstdDecompressor()
    return d.decompress(data)  # type: ignore[no-any-return]


_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE names (id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE);
CREATE TABLE partitions (
    id INTEGER PRIMARY KEY,
    trace_topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    UNIQUE (trace_topic, partition)
);
CREATE TABLE blocks (
    id INTEGER PRIMARY KEY,
    tp INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    min_ts INTEGER NOT NULL,
    max_ts INTEGER NOT NULL,
    n INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX blocks_offsets ON blocks (tp, last_offset, first_offset);
CREATE INDEX blocks_max_ts ON blocks (max_ts);
CREATE INDEX blocks_min_ts ON blocks (min_ts);
CREATE TABLE msg_index (
    bucket INTEGER NOT NULL,
    msg_hash INTEGER NOT NULL,
    block INTEGER NOT NULL,
    pub INTEGER NOT NULL,
    PRIMARY KEY (bucket, msg_hash, block)
) WITHOUT ROWID;
CREATE TABLE pub_index (
    topic INTEGER NOT NULL,
    timestamp INTEGER NOT NULL,
    ref INTEGER NOT NULL,
    PRIMARY KEY (topic, timestamp, ref)
) WITHOUT ROWID;
CREATE TABLE place_index (
    bucket INTEGER NOT NULL,
    place_hash INTEGER NOT NULL,
    ref INTEGER NOT NULL,
    PRIMARY KEY (bucket, place_hash, ref)
) WITHOUT ROWID;
CREATE TABLE key_index (
    bucket INTEGER NOT NULL,
    key TEXT NOT NULL,
    timestamp INTEGER NOT NULL,
    ref INTEGER NOT NULL,
    topic INTEGER,
    PRIMARY KEY (bucket, key, timestamp, ref)
) WITHOUT ROWID;
CREATE TABLE quarantine (
    id INTEGER PRIMARY KEY,
    trace_topic TEXT NOT NULL,
    trace_partition INTEGER NOT NULL,
    trace_offset INTEGER NOT NULL,
    trace_index INTEGER NOT NULL,
    reason TEXT NOT NULL,
    raw BLOB NOT NULL,
    ingest_ts INTEGER NOT NULL,
    UNIQUE (trace_topic, trace_partition, trace_offset, trace_index)
);
CREATE INDEX quarantine_ingest ON quarantine (ingest_ts);
CREATE TABLE progress (
    trace_topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (trace_topic, partition)
) WITHOUT ROWID;
CREATE TABLE lake_progress (
    trace_topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (trace_topic, partition)
) WITHOUT ROWID;
CREATE TABLE message_keys (
    key TEXT PRIMARY KEY,
    trace_topic TEXT NOT NULL,
    trace_partition INTEGER NOT NULL,
    trace_offset INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX message_keys_offset ON message_keys (trace_topic, trace_partition, trace_offset);
CREATE TABLE lake_pending (
    trace_topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    PRIMARY KEY (trace_topic, partition, start_offset, end_offset)
) WITHOUT ROWID;
"""
# What a stored event is rebuilt from: event_from_stored's arguments, then the stored columns
# that win over what the record decodes to (all the others, in table order).
_REBUILT_FROM = (
    "record",
    "trace_topic",
    "trace_partition",
    "trace_offset",
    "trace_index",
    "ingest_ts",
)
_STORED_COLUMNS = (*_REBUILT_FROM, *(c for c in STORE_ROW if c not in _REBUILT_FROM))
_AUTHORITATIVE = _STORED_COLUMNS[6:]
# An event as a block decodes it: (pos, *STORE_ROW), the shape of StoreRows.events.
_EV = {name: i + 1 for i, name in enumerate(STORE_ROW)}
_E_TOPIC, _E_PART, _E_OFF, _E_IDX = (
    _EV["trace_topic"], _EV["trace_partition"], _EV["trace_offset"], _EV["trace_index"]
)  # fmt: skip
_E_TYPE, _E_TS, _E_MSG, _E_MTOPIC = _EV["trace_type"], _EV["timestamp"], _EV["msg_id"], _EV["topic"]
_E_RECORD = _EV["record"]
_stored_of = itemgetter(*(_EV[c] for c in _STORED_COLUMNS))
# The fields of an event in a block, after pos; trace_topic and partition are the block's.
_BLOCK_FIELDS = tuple(c for c in STORE_ROW if c not in ("trace_topic", "trace_partition"))
_INT_FIELDS = frozenset(("trace_offset", "trace_index", "timestamp", "store_time", "ingest_ts"))
_FIELD_SEP, _EVENT_SEP, _NONE, _JSON = "\x02", "\x03", "\x00", "\x04"
_CONTENT = "\x01"  # the trace format's field separator inside a record
_N_FIELDS = 1 + len(_BLOCK_FIELDS)
_BLOCK_GETTER = itemgetter(0, *(_EV[c] for c in _BLOCK_FIELDS))
# pos, then the integer fields
_INT_POSITIONS = (0, *sorted(1 + _BLOCK_FIELDS.index(c) for c in _INT_FIELDS))
_MSG_COLUMN = 1 + _BLOCK_FIELDS.index("msg_id")
_OFF_COLUMN = 1 + _BLOCK_FIELDS.index("trace_offset")
_TS_COLUMN = 1 + _BLOCK_FIELDS.index("timestamp")

# Schema 5 → 6: the hashed indexes get their bucket (rebuilt in order, in the open's
# transaction: ~1 s per million events; a schema-5 file from before the place index has none).
_UPGRADE_5 = (
    "CREATE TABLE msg_index_6 (bucket INTEGER NOT NULL, msg_hash INTEGER NOT NULL, "
    "block INTEGER NOT NULL, pub INTEGER NOT NULL, PRIMARY KEY (bucket, msg_hash, block)) "
    "WITHOUT ROWID",
    f"INSERT INTO msg_index_6 SELECT block >> {BUCKET_BITS - _POS_BITS}, msg_hash, block, pub "  # noqa: S608
    "FROM msg_index ORDER BY 1, 2, 3",
    "DROP TABLE msg_index",
    "ALTER TABLE msg_index_6 RENAME TO msg_index",
    "CREATE TABLE place_index_6 (bucket INTEGER NOT NULL, place_hash INTEGER NOT NULL, "
    "ref INTEGER NOT NULL, PRIMARY KEY (bucket, place_hash, ref)) WITHOUT ROWID",
)
_UPGRADE_5_PLACES = (
    f"INSERT INTO place_index_6 SELECT ref >> {BUCKET_BITS}, place_hash, ref FROM place_index "  # noqa: S608
    "ORDER BY 1, 2, 3",
    "DROP TABLE place_index",
)
_KNOWN_KEYS = """
SELECT key, trace_topic, trace_partition, trace_offset FROM message_keys
WHERE key IN (SELECT value FROM json_each(?))
"""
# Every bucket that may hold key rows: those of the blocks still stored.
_BLOCK_BUCKET_SHIFT = BUCKET_BITS - _POS_BITS  # a block's bucket: block >> this
_BUCKETS = (  # built from constants only
    "WITH RECURSIVE buckets(b) AS ("  # noqa: S608
    f"SELECT (SELECT min(id) FROM blocks) >> {_BLOCK_BUCKET_SHIFT} UNION ALL "
    f"SELECT b + 1 FROM buckets WHERE b < (SELECT max(id) FROM blocks) >> "
    f"{_BLOCK_BUCKET_SHIFT}) "
)
# Look-ups in the hashed indexes: every bucket that may hold rows (constants only).
_MSG_BLOCKS = f"{_BUCKETS}SELECT block FROM msg_index WHERE bucket IN buckets AND msg_hash = ?"  # noqa: S608
_PUB_BLOCKS = f"{_MSG_BLOCKS} AND pub = 1"
_PLACE_REFS = f"{_BUCKETS}SELECT ref FROM place_index WHERE bucket IN buckets AND place_hash = ?"  # noqa: S608
# Blocks of the newest buckets with a Pub of one of the msgIds (seeks, not a range scan).
_RETRIED = (
    "SELECT DISTINCT block FROM msg_index "  # noqa: S608 - constants only
    f"WHERE bucket IN ({', '.join('?' * RETRY_BUCKETS)}) "
    "AND msg_hash IN (SELECT value FROM json_each(?)) AND pub = 1"
)
_INSERT_QUARANTINE = """
INSERT OR IGNORE INTO quarantine
    (trace_topic, trace_partition, trace_offset, trace_index, reason, raw, ingest_ts)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""
_UPSERT_OFFSET = """
INSERT INTO {table} (trace_topic, partition, next_offset) VALUES (?, ?, ?)
ON CONFLICT (trace_topic, partition) DO UPDATE
SET next_offset = max(next_offset, excluded.next_offset)
"""
_OVERLAPPING = """
SELECT id, data FROM blocks WHERE tp = ? AND last_offset >= ? AND first_offset <= ?
"""
_SUMMARY_COLUMNS = (
    "msg_id",
    "topic",
    "timestamp",
    "tags",
    "keys",
    "group_name",
    "success",
    "store_host",
    "offset_msg_id",
    "cost_time",
    "msg_type",
    "region_id",
)

_CURSOR = struct.Struct(">cqq")
_KEY_CURSOR = b"k"
_MESSAGE_CURSOR = b"m"

# Sizes for one collector's file (about 100 bytes per event): the writer's cache holds the hot
# index pages, readers mostly hit the mmap.
_WRITER_CACHE_KIB = 131_072
_WORKER_CACHE_KIB = 32_768
_READER_CACHE_KIB = 16_384
_MMAP_BYTES = 1 << 30
# Page size of a new file (an existing file keeps its own; the collector's
# collector_store_page_size). Ingest's cost is the indexes keyed by a random hash (msg_index,
# place_index): every batch inserts all over them. With 16 KiB pages those trees have a
# quarter of the pages and a level less: the worker stores ~8 – 13 % cheaper per event at 1 M
# events than with SQLite's default 4 KiB, for ~25 % more bytes written to the disk (whole
# pages in the WAL and the checkpoints; docs/performance.md, tenth pass).
_PAGE_SIZE = 16_384
# A larger WAL between checkpoints lets a page dirtied by many batches be copied back once
# (in bytes: the checkpoint threshold in pages is this over the file's page size).
_WAL_AUTOCHECKPOINT_BYTES = 32 << 20
_WAL_LIMIT_BYTES = 64 << 20
_BUSY_TIMEOUT_S = 10.0


_blake2b = hashlib.blake2b
_LITTLE_ENDIAN = sys.byteorder == "little"


def _msg_hash(msg_id: str) -> int:
    """8 bytes of BLAKE2b of a msgId, as a signed 64-bit integer (SQLite's INTEGER)."""
    return int.from_bytes(
        hashlib.blake2b(msg_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
        "big",
        signed=True,
    )


#: The texts of small non-negative integers (block positions, record indexes in a trace
#: message): looked up rather than formatted one by one.
_SMALL = 1024
_SMALL_INTS = tuple(map(str, range(_SMALL)))
_small_int_text = _SMALL_INTS.__getitem__


_INT_FORMAT = "%d" + _FIELD_SEP


def _int_column_text(column: Sequence[Any]) -> str:
    """An integer column's text: ``"\x02".join(str(int(v)) for v in column)``, with less work
    for a column of one value (store_time, ingest_ts) and one of small numbers."""
    n = len(column)
    if not n:
        return ""
    first, last = column[0], column[-1]
    try:
        if first == last and column.count(first) == n:
            return _FIELD_SEP.join([str(int(first))] * n)
        # the ends tell a column of large numbers (timestamps, offsets) at once
        if 0 <= first < _SMALL and 0 <= last < _SMALL and min(column) >= 0 and max(column) < _SMALL:
            return _FIELD_SEP.join(map(_small_int_text, column))
        # One printf-style format over the whole column, each value formatted in C: ~3 times
        # faster than str() per value, and the same text as str(int(v)) for whatever "%d"
        # accepts (ints, bools, floats); a text value raises TypeError and goes the long way.
        return (_INT_FORMAT * n)[:-1] % tuple(column)
    except TypeError:  # not all integers: int() says what they are
        pass
    return _FIELD_SEP.join(map(str, map(int, column)))


def _encode_column(i: int, column: Sequence[Any]) -> str | None:
    """A block's column as text (values joined by \x02, None as \x00), or None when a value
    holds a separator (records never do: they were split on \x02)."""
    if i in _INT_POSITIONS:
        return _int_column_text(column)
    nones = column.count(None)
    try:
        text = _FIELD_SEP.join([_NONE if v is None else v for v in column] if nones else column)
    except TypeError:
        raise ValueError(f"event field of an unexpected type in {column!r}") from None
    if (
        text.count(_FIELD_SEP) == len(column) - 1
        and _EVENT_SEP not in text
        and text.count(_NONE) == nones
    ):
        return text
    return None


def _block_columns(events: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
    """The columns of a block of events (``(pos, *STORE_ROW)``, one partition)."""
    try:
        return list(zip(*map(_BLOCK_GETTER, events), strict=True))
    except (IndexError, TypeError) as exc:
        raise ValueError(f"an event of the wrong shape: {exc}") from None


def _encode_block(events: Sequence[Sequence[Any]]) -> bytes:
    """Events (``(pos, *STORE_ROW)``, one partition) → a block."""
    return _encode_columns(_block_columns(events))


def _encode_columns(columns: list[Sequence[Any]]) -> bytes:
    """A block's columns (:func:`_block_columns`) → the block: column by column, since like
    values side by side compress best; as JSON when a value holds a separator."""
    texts = [_encode_column(i, column) for i, column in enumerate(columns)]
    if None in texts:
        text = _JSON + json.dumps(
            [[int(v) for v in c] if i in _INT_POSITIONS else list(c) for i, c in enumerate(columns)]
        )
    else:
        text = _EVENT_SEP.join(texts)  # type: ignore[arg-type]
    return _compress(text.encode("utf-8", "surrogatepass"))


def _block_text(data: bytes) -> str:
    return _decompress(data).decode("utf-8", "surrogatepass")


def _decode_block(data: bytes, trace_topic: str, partition: int) -> list[tuple[Any, ...]]:
    """The events of a block, each as ``(pos, *STORE_ROW)``."""
    try:
        text = _block_text(data)
        if text.startswith(_JSON):
            columns: list[Any] = json.loads(text[1:])
        else:
            columns = [
                list(map(int, c.split(_FIELD_SEP)))
                if i in _INT_POSITIONS
                else [None if v == _NONE else v for v in c.split(_FIELD_SEP)]
                for i, c in enumerate(text.split(_EVENT_SEP))
            ]
        if len(columns) != _N_FIELDS or any(len(c) != len(columns[0]) for c in columns):
            raise ValueError("columns of different lengths")
        # (pos, *STORE_ROW): the block's trace topic and partition go back in their places.
        return list(zip(columns[0], repeat(trace_topic), repeat(partition), *columns[1:]))
    except (zlib.error, zstandard.ZstdError, ValueError, TypeError, RecursionError) as exc:
        raise TraceStoreError(f"a stored block cannot be read: {exc!r}") from exc


def _pick(
    data: bytes,
    trace_topic: str,
    partition: int,
    *,
    pos: int | None = None,
    msg_id: str | None = None,
) -> list[tuple[Any, ...]]:
    """Only the block's events at position ``pos`` or of ``msg_id``: a look-up needs one or a
    few events of a block, and splitting its columns costs less than building every event."""
    try:
        text = _block_text(data)
        if text.startswith(_JSON):
            events = _decode_block(data, trace_topic, partition)
            return [e for e in events if (e[0] == pos if msg_id is None else e[_E_MSG] == msg_id)]
        columns = text.split(_EVENT_SEP)
        if len(columns) != _N_FIELDS:
            raise ValueError("a block of the wrong shape")
        if msg_id is None:
            wanted = [i for i, p in enumerate(columns[0].split(_FIELD_SEP)) if int(p) == pos]
        else:
            ids = columns[_MSG_COLUMN].split(_FIELD_SEP)
            wanted = [i for i, m in enumerate(ids) if m == msg_id]
        if not wanted:
            return []
        # each column split only as far as the last wanted event (on average half of it)
        last = wanted[-1] + 1
        split = [c.split(_FIELD_SEP, last) for c in columns]
        out: list[tuple[Any, ...]] = []
        for i in wanted:
            fields: list[Any] = [
                int(c[i]) if k in _INT_POSITIONS else (None if c[i] == _NONE else c[i])
                for k, c in enumerate(split)
            ]
            out.append((fields[0], trace_topic, partition, *fields[1:]))
        return out
    except (zlib.error, zstandard.ZstdError, ValueError, TypeError, IndexError) as exc:
        raise TraceStoreError(f"a stored block cannot be read: {exc!r}") from exc


def _place_hash(offset_msg_id: str | None) -> int | None:
    """The place an offsetMsgId names (store host, queue, Kafka offset) as a 64-bit hash, the
    key of ``place_index``; None if it names none."""
    addr, queue_id, offset = _offset_coords(offset_msg_id)
    return None if addr is None else _msg_hash(f"{addr}/{queue_id}/{offset}")


def _place_hashes(
    types: Sequence[Any],
    addrs: Sequence[str | None],
    queue_ids: Sequence[int | None],
    offsets: Sequence[int | None],
) -> dict[int, int]:
    """Position → place hash of each Pub whose place is known, from the place columns ingest
    decoded (``StoreRows.places``): :func:`_place_hash` of its offsetMsgId without parsing
    the record or the id again."""
    pubs = [
        i
        for i in compress(range(len(types)), map(_eq, types, repeat("Pub")))
        if addrs[i] is not None
    ]
    if not pubs:
        return {}
    hashes = _hashes_of([f"{addrs[i]}/{queue_ids[i]}/{offsets[i]}" for i in pubs])
    return dict(zip(pubs, hashes, strict=True))


def _hashes_of(texts: Iterable[str]) -> array[int]:
    """:func:`_msg_hash` of each text: the digests joined, then read as big-endian signed
    64-bit integers in C."""
    digests = b"".join(
        [_blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8).digest() for t in texts]
    )
    hashes = array("q", digests)
    if _LITTLE_ENDIAN:
        hashes.byteswap()
    return hashes


def _msg_hashes(msg_ids: dict[str, Any]) -> dict[str, int]:
    """msgId → :func:`_msg_hash`, for the keys of ``msg_ids``."""
    return dict(zip(msg_ids, _hashes_of(msg_ids), strict=True))


def _one_partition(trace_topics: Sequence[str], partitions: Sequence[int]) -> bool:
    n = len(trace_topics)
    return trace_topics.count(trace_topics[0]) == n and partitions.count(partitions[0]) == n


def _partition_groups(
    trace_topics: Sequence[str], partitions: Sequence[int]
) -> list[tuple[tuple[str, int], Sequence[int]]]:
    """Positions of a batch's events by ``(trace topic, partition)``, in order of first
    appearance; a run of consecutive positions as a range (ingest's batches are one run per
    partition)."""
    if _one_partition(trace_topics, partitions):
        return [((trace_topics[0], partitions[0]), range(len(trace_topics)))]
    groups: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(zip(trace_topics, partitions, strict=True)):
        group = groups.get(key)
        if group is None:
            groups[key] = [i]
        else:
            group.append(i)
    return [
        (key, range(g[0], g[-1] + 1) if g[-1] - g[0] + 1 == len(g) else g)
        for key, g in groups.items()
    ]


def _pub_offset_msg_id(e: Sequence[Any]) -> str | None:
    """The offsetMsgId of a stored Pub event (field 12 of the common 14-field record)."""
    record = e[_E_RECORD]
    if record.startswith("Pub\x01") and record.count(_CONTENT) == 13:
        field = record.rsplit(_CONTENT, 2)[1]  # field 12 of 14, without splitting them all
        return None if field == "null" else field
    try:
        return _event_row(e).get("offset_msg_id")
    except TraceStoreError:
        return None


def _is_dlq(topic: str | None) -> bool:
    # SQLite's LIKE '\%DLQ\%%' of the earlier layouts: the prefix %DLQ%, ASCII case-insensitive.
    return topic is not None and topic[:5].upper() == "%DLQ%"


def _encode_cursor(kind: bytes, timestamp: int, rowid: int) -> str:
    return base64.urlsafe_b64encode(_CURSOR.pack(kind, timestamp, rowid)).decode("ascii")


def _decode_cursor(kind: bytes, cursor: str) -> tuple[int, int]:
    try:
        raw = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True)
        tag, timestamp, rowid = _CURSOR.unpack(raw)
    except (AttributeError, ValueError, binascii.Error, struct.error):
        raise ValueError("invalid cursor") from None
    if tag != kind:
        # A cursor of the other query would page through a different ordering.
        raise ValueError("invalid cursor")
    return int(timestamp), int(rowid)


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be in 1..{MAX_PAGE_SIZE}, got {limit}")


def _decoded(values: Sequence[Any]) -> dict[str, Any]:
    record, trace_topic, partition, offset, index, ingest_ts = values[:6]
    try:
        row = event_from_stored(record, trace_topic, partition, offset, index, ingest_ts)
        # The stored columns are what the writer handed in (ingest may fill client_host or
        # store_time from Kafka headers), so they win over what the record decodes to.
        row.update(zip(_AUTHORITATIVE, values[6:], strict=True))
        row["date"], row["hour"] = hour_partition(row["timestamp"])
    except ValueError as exc:
        # Only a codec change (or a timestamp no partition can hold) gets here; serving a
        # guess would hide it.
        raise TraceStoreError(f"stored event cannot be rebuilt: {exc}") from exc
    return row


def _event_row(event: Sequence[Any]) -> dict[str, Any]:
    """A block's event (``(pos, *STORE_ROW)``) decoded: every lake column and the extras."""
    return _decoded(_stored_of(event))


def _lake_row(event: Sequence[Any]) -> dict[str, Any]:
    """A stored event as look-ups return it: the lake columns, and the client id (which the
    lake does not keep)."""
    row = _event_row(event)
    out = {name: row[name] for name in _LAKE_COLUMNS}
    out["client_id"] = row["client_id"]
    return out


class _Blocks:
    """Blocks read by one query, decoded once each."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.cache: dict[int, dict[int, tuple[Any, ...]]] = {}
        self.partitions: dict[int, tuple[str, int]] = {}

    def partition(self, tp: int) -> tuple[str, int]:
        found = self.partitions.get(tp)
        if found is None:
            row = self.conn.execute(
                "SELECT trace_topic, partition FROM partitions WHERE id = ?", (tp,)
            ).fetchone()
            if row is None:
                raise TraceStoreError(f"a block names partition id {tp}, which is not stored")
            found = self.partitions[tp] = (str(row[0]), int(row[1]))
        return found

    def add(self, block: int, tp: int, data: bytes) -> dict[int, tuple[Any, ...]]:
        events = {e[0]: e for e in _decode_block(data, *self.partition(tp))}
        self.cache[block] = events
        return events

    def get(self, block: int) -> dict[int, tuple[Any, ...]]:
        events = self.cache.get(block)
        if events is None:
            row = self.conn.execute("SELECT tp, data FROM blocks WHERE id = ?", (block,)).fetchone()
            events = {} if row is None else self.add(block, row[0], row[1])
            self.cache[block] = events
        return events

    def _raw(self, block: int) -> tuple[int, bytes] | None:
        row = self.conn.execute("SELECT tp, data FROM blocks WHERE id = ?", (block,)).fetchone()
        return None if row is None else (int(row[0]), row[1])

    def event(self, ref: int) -> tuple[Any, ...] | None:
        """One event by its ref (None if it is gone), without decoding its whole block."""
        block, pos = ref >> _POS_BITS, ref & _POS_MASK
        events = self.cache.get(block)
        if events is not None:
            return events.get(pos)
        raw = self._raw(block)
        if raw is None:
            return None
        found = _pick(raw[1], *self.partition(raw[0]), pos=pos)
        return found[0] if found else None

    def of_message(self, block: int, msg_id: str) -> list[tuple[Any, ...]]:
        """The events of a message in a block."""
        events = self.cache.get(block)
        if events is not None:
            return [e for e in events.values() if e[_E_MSG] == msg_id]
        raw = self._raw(block)
        return [] if raw is None else _pick(raw[1], *self.partition(raw[0]), msg_id=msg_id)


class TraceStore:
    """The collector's trace store: events, indexes, quarantine and progress in one file.

    Args:
        path: the SQLite file; its directory is created on :meth:`open`.

    Use as ``with TraceStore(path) as store: ...`` or call :meth:`open` and :meth:`close`.
    Tables, durability and threads: see the module docstring.
    """

    def __init__(self, path: Path, *, page_size: int = _PAGE_SIZE) -> None:
        self.path = Path(path)
        #: SQLite page size of a file this store creates (an existing file keeps its own)
        self.page_size = page_size
        self._writer: sqlite3.Connection | None = None
        self._write_lock = threading.Lock()
        self._local = threading.local()
        # Bumped on open and close, so a thread's reader from an earlier open is not reused.
        self._generation = 0

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open the file (creating it if needed) and check its schema version.

        Raises:
            StoreSchemaError: the file has another schema version (a newer one: upgrade; an
                older one: see :data:`OLD_LAYOUT_HELP`).
            TraceStoreError: the file is an SQLite database but not a trace store.
        """
        with self._write_lock:
            if self._writer is not None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Opened here, used by the writer thread: the write lock, not SQLite's same-thread
            # check, keeps it to one user at a time.
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
            )
            try:
                # Only a new, empty file takes it (before WAL mode writes the first page).
                conn.execute(f"PRAGMA page_size={int(self.page_size)}")
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise TraceStoreError(f"{self.path}: cannot use WAL mode (got {mode!r})")
                page_size = conn.execute("PRAGMA page_size").fetchone()[0]
                for pragma in (
                    "synchronous=NORMAL",
                    f"cache_size=-{_WRITER_CACHE_KIB}",
                    f"mmap_size={_MMAP_BYTES}",
                    "temp_store=MEMORY",
                    f"wal_autocheckpoint={max(1, _WAL_AUTOCHECKPOINT_BYTES // page_size)}",
                    f"journal_size_limit={_WAL_LIMIT_BYTES}",
                    # This SQLite build zeroes deleted content by default; retention need not.
                    "secure_delete=OFF",
                ):
                    conn.execute(f"PRAGMA {pragma}")
                self._init_schema(conn)
            except BaseException:
                conn.close()
                raise
            self._writer = conn
            self._generation += 1

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        def body(c: sqlite3.Connection) -> None:
            tables = {
                r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if not tables:
                # One by one: executescript() would COMMIT the transaction we are in.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        c.execute(statement)
                c.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("schema_version", SCHEMA_VERSION), ("next_block_id", 1), ("event_count", 0)],
                )
            elif "meta" not in tables:
                raise TraceStoreError(f"{self.path} is an SQLite file but not a trace store")
            version = self._meta(c, "schema_version")
            if version == 5 and "blocks" in tables:
                self._upgrade_5(c, "place_index" in tables)
                version = self._meta(c, "schema_version")
            if version != SCHEMA_VERSION:
                older = isinstance(version, int) and 1 <= version < SCHEMA_VERSION
                newer = isinstance(version, int) and version > SCHEMA_VERSION
                raise StoreSchemaError(
                    f"trace store {self.path} has schema version {version!r}, this collector "
                    f"knows version {SCHEMA_VERSION}"
                    + ("; the file is newer: upgrade the collector" if newer else "")
                    + (f"; {OLD_LAYOUT_HELP}" if older else "")
                )
            if tables and "blocks" not in tables:
                raise StoreSchemaError(f"trace store {self.path} has no blocks table")

        self._transaction(conn, body)

    def _upgrade_5(self, c: sqlite3.Connection, has_places: bool) -> None:
        """Schema 5 → 6 in the open's transaction: the hashed indexes get their bucket."""
        started = time.monotonic()
        for statement in _UPGRADE_5:
            c.execute(statement)
        if has_places:
            for statement in _UPGRADE_5_PLACES:
                c.execute(statement)
        c.execute("ALTER TABLE place_index_6 RENAME TO place_index")
        c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
        log.info(
            "store_upgraded",
            path=str(self.path),
            from_version=5,
            to_version=SCHEMA_VERSION,
            seconds=round(time.monotonic() - started, 3),
        )

    @staticmethod
    def _meta(conn: sqlite3.Connection, key: str) -> Any:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def close(self) -> None:
        """Close the writer and this thread's reader; other threads' readers close on next use."""
        with self._write_lock:
            writer, self._writer = self._writer, None
            self._generation += 1
            if writer is not None:
                writer.close()
        self._drop_reader()

    def __enter__(self) -> TraceStore:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            warnings.warn(f"unclosed TraceStore {self.path}", ResourceWarning, stacklevel=1)
            writer.close()

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` was called and :meth:`close` not since."""
        return self._writer is not None

    # ------------------------------------------------------------------ connections

    def _drop_reader(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()

    def _reader(self) -> sqlite3.Connection:
        if getattr(self._local, "generation", None) != self._generation:
            self._drop_reader()
        if self._writer is None:
            raise TraceStoreError(f"trace store {self.path} is not open")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S)
            for pragma in (
                "query_only=ON",
                f"cache_size=-{_READER_CACHE_KIB}",
                f"mmap_size={_MMAP_BYTES}",
                "temp_store=MEMORY",
            ):
                conn.execute(f"PRAGMA {pragma}")
            self._local.conn = conn
            self._local.generation = self._generation
        return conn

    def _write(self, body: Callable[[sqlite3.Connection], _T], *, full_sync: bool = False) -> _T:
        with self._write_lock:
            if self._writer is None:
                raise TraceStoreError(f"trace store {self.path} is not open")
            return self._transaction(self._writer, body, full_sync=full_sync)

    @staticmethod
    def _transaction(
        conn: sqlite3.Connection,
        body: Callable[[sqlite3.Connection], _T],
        *,
        full_sync: bool = False,
    ) -> _T:
        if full_sync:
            conn.execute("PRAGMA synchronous=FULL")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            if full_sync:
                conn.execute("PRAGMA synchronous=NORMAL")
        return result

    # ------------------------------------------------------------------ ingest

    # ------------------------------------------------------------------ ingest

    def write_batch(
        self,
        rows: list[dict[str, Any]],
        quarantine: list[dict[str, Any]],
        progress: dict[tuple[str, int], int],
    ) -> int:
        """Store a batch in one transaction; return how many of its events were new.

        Args:
            rows: event rows from :func:`tracemq_collector.events.rows_from_record` (they
                carry the ``record`` text the store keeps). Of the lake columns, only
                ``trace_type, timestamp, msg_id, topic, client_host, store_time, ingest_ts``
                and the coordinates are taken from the row; the others are decoded from
                ``record`` whenever the event is read. Rows already stored (same trace
                topic, partition, offset and index) are skipped and index nothing.
            quarantine: quarantine rows; ones already stored are skipped.
            progress: ``(trace_topic, partition) → next offset``; an offset below the stored
                one is ignored, so progress never moves backwards.

        Raises:
            ValueError: a row lacks the ``record`` text; nothing of the batch is stored.
        """
        try:
            # client_id is optional: rows built by hand may have none
            tuples = [
                tuple([row[name] if name != "client_id" else row.get(name) for name in ROW_NAMES])
                for row in rows
            ]
        except KeyError as exc:
            raise ValueError(
                f"event row without {exc.args[0]!r}: rows must come from rows_from_record"
            ) from None
        return self.write_rows(store_rows(tuples, quarantine, progress, ordered=False))[0]

    def write_rows(self, batch: StoreRows) -> tuple[int, dict[tuple[str, int], int | None], int]:
        """:meth:`write_batch` for a batch already in the table's shape (ingest's path).

        Returns:
            ``(new events, the progress of each partition of the batch's progress before
            it, trace messages dropped as repeats)``; None: nothing stored yet for that
            partition. A repeat is a message whose idempotency key the store already holds
            at other coordinates (see ``message_keys`` in the module docstring).
        """
        return self._write(lambda c: self._write_rows(c, batch))

    @staticmethod
    def _tp_id(
        conn: sqlite3.Connection, trace_topic: str, partition: int, create: bool
    ) -> int | None:
        row = conn.execute(
            "SELECT id FROM partitions WHERE trace_topic = ? AND partition = ?",
            (trace_topic, partition),
        ).fetchone()
        if row is not None:
            return int(row[0])
        if not create:
            return None
        cur = conn.execute(
            "INSERT INTO partitions (trace_topic, partition) VALUES (?, ?)",
            (trace_topic, partition),
        )
        return int(cur.lastrowid or 0)

    @staticmethod
    def _name_ids(conn: sqlite3.Connection, names: Iterable[str]) -> dict[str, int]:
        """Ids of names (topics), adding the new ones."""
        out: dict[str, int] = {}
        for name in names:
            row = conn.execute("SELECT id FROM names WHERE value = ?", (name,)).fetchone()
            if row is None:
                cur = conn.execute("INSERT INTO names (value) VALUES (?)", (name,))
                out[name] = int(cur.lastrowid or 0)
            else:
                out[name] = int(row[0])
        return out

    @staticmethod
    def _fresh(
        conn: sqlite3.Connection, columns: list[tuple[Any, ...]], ordered: bool
    ) -> list[int] | None:
        """Positions of the events (``StoreRows.columns``) not stored yet, or None when all of
        them are new."""
        trace_topics, parts, offsets, indexes = columns[0], columns[1], columns[2], columns[3]
        # One range read per partition finds the blocks that may hold some of them, so a
        # replay indexes no key twice; for a fresh batch it finds none.
        bounds: dict[tuple[str, int], list[int]] = {}
        if _one_partition(trace_topics, parts):
            bounds[(trace_topics[0], parts[0])] = [min(offsets), max(offsets)]
        else:
            for key, offset in zip(zip(trace_topics, parts, strict=True), offsets, strict=True):
                b = bounds.get(key)
                if b is None:
                    bounds[key] = [offset, offset]
                elif offset < b[0]:
                    b[0] = offset
                elif offset > b[1]:
                    b[1] = offset
        seen: set[tuple[str, int, int, int]] = set()
        for (topic, partition), (low, high) in bounds.items():
            tp = TraceStore._tp_id(conn, topic, partition, create=False)
            if tp is None:
                continue
            for _, data in conn.execute(_OVERLAPPING, (tp, low, high)):
                seen.update(
                    (topic, partition, e[_E_OFF], e[_E_IDX])
                    for e in _decode_block(data, topic, partition)
                )
        if not seen and ordered:
            return None
        fresh = []
        for i, coords in enumerate(zip(trace_topics, parts, offsets, indexes, strict=True)):
            if coords not in seen:
                seen.add(coords)  # also drops a duplicate inside the batch itself
                fresh.append(i)
        return None if len(fresh) == len(offsets) else fresh

    @staticmethod
    def _renumber(batch: StoreRows, fresh: list[int]) -> StoreRows:
        """The batch without the events already stored (and without their key rows)."""
        where = {old: new for new, old in enumerate(fresh)}
        events = [(where[row[0]], *row[1:]) for row in batch.events if row[0] in where]
        key_rows = [
            ((where[row[0] >> _KEY_SHIFT] << _KEY_SHIFT) | (row[0] & _KEY_MASK), *row[1:])
            for row in batch.key_rows
            if row[0] >> _KEY_SHIFT in where
        ]
        ids = {row[2] for row in key_rows}
        kept = StoreRows(
            events,
            key_rows,
            [m for m in batch.key_msg_ids if m in ids],
            batch.quarantine,
            batch.progress,
            True,
        )
        if batch.places is not None:
            kept.places = [tuple([c[old] for old in fresh]) for c in batch.places]
        return kept

    @staticmethod
    def _repeats(
        conn: sqlite3.Connection, message_keys: list[tuple[str, int, int, str]]
    ) -> set[tuple[str, int, int]]:
        """Coordinates of the batch's repeated trace messages; records the new keys."""
        known: dict[str, tuple[str, int, int]] = {
            key: (topic, partition, offset)
            for key, topic, partition, offset in conn.execute(
                _KNOWN_KEYS, (json.dumps([k[3] for k in message_keys]),)
            )
        }
        repeats: set[tuple[str, int, int]] = set()
        fresh: list[tuple[str, str, int, int]] = []
        for topic, partition, offset, key in message_keys:
            first = known.get(key)
            if first is None:
                known[key] = (topic, partition, offset)
                fresh.append((key, topic, partition, offset))
            elif first != (topic, partition, offset):  # the same coordinates: a replay
                repeats.add((topic, partition, offset))
                log.info(
                    "repeated trace message dropped",
                    trace_topic=topic,
                    partition=partition,
                    offset=offset,
                    first_offset=first[2],
                    first_partition=first[1],
                    idempotency_key=key,
                )
        if fresh:
            conn.executemany(
                "INSERT OR IGNORE INTO message_keys (key, trace_topic, trace_partition, "
                "trace_offset) VALUES (?, ?, ?, ?)",
                fresh,
            )
        return repeats

    @staticmethod
    def _without(batch: StoreRows, repeats: set[tuple[str, int, int]]) -> StoreRows:
        """The batch without the events and quarantine rows of repeated trace messages."""
        keep = [row[0] for row in batch.events if (row[1], row[2], row[3]) not in repeats]
        kept = TraceStore._renumber(batch, keep)
        kept.ordered = batch.ordered
        kept.quarantine = [
            q
            for q in batch.quarantine
            if (q["trace_topic"], q["trace_partition"], q["trace_offset"]) not in repeats
        ]
        return kept

    @staticmethod
    def _published(
        conn: sqlite3.Connection,
        msg_ids: list[str],
        next_block: int,
        hashes: dict[str, int] | None = None,
    ) -> set[str]:
        """The msgIds of ``msg_ids`` with a Pub already stored (a retried send) in the newest
        :data:`RETRY_BUCKETS` buckets before ``next_block``, the batch's first block.

        ``hashes``: msgId → :func:`_msg_hash`, those the caller has already computed."""
        if not msg_ids:
            return set()
        newest = next_block >> _BLOCK_BUCKET_SHIFT
        wanted = set(msg_ids)
        blocks = _Blocks(conn)
        found: set[str] = set()
        if hashes is None:
            hashes = {}
        hits = conn.execute(
            _RETRIED,
            (
                *range(newest - RETRY_BUCKETS + 1, newest + 1),
                json.dumps([hashes[m] if m in hashes else _msg_hash(m) for m in msg_ids]),
            ),
        ).fetchall()
        for (block,) in hits:
            for e in blocks.get(block).values():
                if e[_E_TYPE] == "Pub" and e[_E_MSG] in wanted:
                    found.add(e[_E_MSG])
        return found

    def _insert_events(self, conn: sqlite3.Connection, batch: StoreRows) -> None:
        # Column by column (the worker receives the batch as columns): Python looks at each
        # Pub and each block, and at each event only where C cannot (grouping partitions
        # that are not one run each).
        columns = batch.columns
        n = len(batch)
        types, msg_ids = columns[_E_TYPE - 1], columns[_E_MSG - 1]
        ids = dict.fromkeys(msg_ids)
        ids.pop(None, None)
        hashes = _msg_hashes(ids)  # a message's events mostly share a block, not always
        # Read inside the transaction: correct even if another process wrote this file.
        next_block = int(self._meta(conn, "next_block_id"))
        key_rows = batch.key_rows
        if key_rows:
            # Messages whose keys an earlier Pub (a retried send) already indexed.
            indexed = self._published(conn, batch.key_msg_ids, next_block, hashes)
            if indexed:
                key_rows = [row for row in key_rows if row[2] not in indexed]
        msg_topics, stamps = columns[_E_MTOPIC - 1], columns[_E_TS - 1]
        is_pub = list(map(_eq, types, repeat("Pub")))
        topics = {t for t in compress(msg_topics, is_pub) if t is not None}
        topics.update(row[3] for row in key_rows if row[3] is not None)
        topic_ids = self._name_ids(conn, sorted(topics))
        if batch.places is not None:
            # the places ingest decoded (same hashes as from the records: tests/unit compare)
            place_of = _place_hashes(types, *batch.places)
        else:
            events = batch.events
            place_of = {}
            for i in compress(range(n), is_pub):
                place = _place_hash(_pub_offset_msg_id(events[i]))
                if place is not None:
                    place_of[i] = place
        ref_of = [0] * n
        block_rows: list[tuple[Any, ...]] = []
        msg_rows: list[tuple[int, int, int, int]] = []
        pub_rows: list[tuple[int, int, int]] = []
        place_rows: list[tuple[int, int, int]] = []
        block_fields = columns[2:]  # a block's columns after pos: all but topic and partition
        for (trace_topic, partition), group in _partition_groups(columns[0], columns[1]):
            tp = self._tp_id(conn, trace_topic, partition, create=True)
            for start in range(0, len(group), BLOCK_EVENTS):
                block = next_block
                next_block += 1
                base = block << _POS_BITS
                chunk = group[start : start + BLOCK_EVENTS]
                size = len(chunk)
                if isinstance(chunk, range):
                    lo, hi = chunk.start, chunk.stop
                    ref_of[lo:hi] = range(base, base + size)
                    block_columns: list[Sequence[Any]] = [range(size)]
                    block_columns.extend([c[lo:hi] for c in block_fields])
                    pubs: Sequence[bool] = is_pub[lo:hi]
                else:
                    for pos, i in enumerate(chunk):
                        ref_of[i] = base | pos
                    take = itemgetter(*chunk) if size > 1 else lambda c, i=chunk[0]: (c[i],)
                    block_columns = [range(size)]
                    block_columns.extend([take(c) for c in block_fields])
                    pubs = take(is_pub)
                block_msg_ids = block_columns[_MSG_COLUMN]
                # msgIds in order of first appearance, 1 for those with a Pub in the block
                msgs = dict.fromkeys(block_msg_ids, 0)
                msgs.update(dict.fromkeys(compress(block_msg_ids, pubs), 1))
                msgs.pop(None, None)
                for pos in compress(range(size), pubs):
                    i = chunk[pos]
                    topic = msg_topics[i]
                    if topic is not None:
                        pub_rows.append((topic_ids[topic], stamps[i], base | pos))
                    place = place_of.get(i)
                    if place is not None:
                        ref = base | pos
                        place_rows.append((ref >> BUCKET_BITS, place, ref))
                offsets, times = block_columns[_OFF_COLUMN], block_columns[_TS_COLUMN]
                block_rows.append(
                    (
                        block,
                        tp,
                        min(offsets),
                        max(offsets),
                        min(times),
                        max(times),
                        size,
                        _encode_columns(block_columns),
                    )
                )
                block_hashes = list(map(hashes.__getitem__, msgs))
                bucket = block >> _BLOCK_BUCKET_SHIFT
                if len(set(block_hashes)) == len(block_hashes):
                    msg_rows.extend(zip(repeat(bucket), block_hashes, repeat(block), msgs.values()))
                else:  # two ids of one hash: one row, with a Pub if either has one
                    hashed: dict[int, int] = {}
                    for h, pub in zip(block_hashes, msgs.values(), strict=True):
                        hashed[h] = max(pub, hashed.get(h, 0))
                    msg_rows.extend((bucket, h, block, pub) for h, pub in hashed.items())
        conn.executemany("INSERT INTO blocks VALUES (?, ?, ?, ?, ?, ?, ?, ?)", block_rows)
        conn.executemany("INSERT OR IGNORE INTO msg_index VALUES (?, ?, ?, ?)", msg_rows)
        if pub_rows:
            conn.executemany("INSERT OR IGNORE INTO pub_index VALUES (?, ?, ?)", pub_rows)
        if place_rows:
            conn.executemany("INSERT OR IGNORE INTO place_index VALUES (?, ?, ?)", place_rows)
        if key_rows:
            # (bucket, key, timestamp, ref, topic id) of each key row, built in C
            key_ids, keys, _, key_topics, key_stamps = zip(*key_rows, strict=True)
            refs = list(map(ref_of.__getitem__, map(_rshift, key_ids, repeat(_KEY_SHIFT))))
            conn.executemany(
                "INSERT OR IGNORE INTO key_index VALUES (?, ?, ?, ?, ?)",
                zip(
                    map(_rshift, refs, repeat(BUCKET_BITS)),
                    keys,
                    key_stamps,
                    refs,
                    map(topic_ids.get, key_topics),  # None for no topic
                    strict=True,
                ),
            )
        conn.execute("UPDATE meta SET value = ? WHERE key = 'next_block_id'", (next_block,))
        conn.execute("UPDATE meta SET value = value + ? WHERE key = 'event_count'", (n,))

    def _write_rows(
        self, conn: sqlite3.Connection, batch: StoreRows
    ) -> tuple[int, dict[tuple[str, int], int | None], int]:
        before: dict[tuple[str, int], int | None] = {}
        for topic, partition in batch.progress:
            row = conn.execute(
                "SELECT next_offset FROM progress WHERE trace_topic = ? AND partition = ?",
                (topic, partition),
            ).fetchone()
            before[(topic, partition)] = None if row is None else int(row[0])
        repeats: set[tuple[str, int, int]] = set()
        if batch.message_keys:
            repeats = self._repeats(conn, batch.message_keys)
            if repeats:
                batch = self._without(batch, repeats)
        new = 0
        if len(batch):
            fresh = self._fresh(conn, batch.columns, batch.ordered)
            if fresh is not None:
                batch = self._renumber(batch, fresh)
            new = len(batch)
        if new:
            self._insert_events(conn, batch)
        if batch.quarantine:
            conn.executemany(
                _INSERT_QUARANTINE,
                [
                    (
                        q["trace_topic"],
                        q["trace_partition"],
                        q["trace_offset"],
                        q["trace_index"],
                        q["reason"],
                        q["raw"],
                        q["ingest_ts"],
                    )
                    for q in batch.quarantine
                ],
            )
        if batch.progress:
            conn.executemany(
                _UPSERT_OFFSET.format(table="progress"),
                [
                    (topic, partition, offset)
                    for (topic, partition), offset in batch.progress.items()
                ],
            )
            if batch.message_keys:
                # The window slides with the partition: older keys can no longer match a copy.
                conn.executemany(
                    "DELETE FROM message_keys WHERE trace_topic = ? AND trace_partition = ? "
                    "AND trace_offset < ?",
                    [
                        (topic, partition, offset - DEDUPE_WINDOW_MESSAGES)
                        for (topic, partition), offset in batch.progress.items()
                        if offset > DEDUPE_WINDOW_MESSAGES
                    ],
                )
        return new, before, len(repeats)

    def progress(self) -> dict[tuple[str, int], int]:
        """``(trace_topic, partition) → next offset`` to read; resume ingest from here."""
        return self._offsets("progress")

    def _offsets(self, table: str) -> dict[tuple[str, int], int]:
        return {
            (topic, partition): offset
            for topic, partition, offset in self._reader().execute(
                f"SELECT trace_topic, partition, next_offset FROM {table}"  # noqa: S608
            )
        }

    # ------------------------------------------------------------------ queries

    def by_msg_id(self, msg_id: str) -> list[dict[str, Any]]:
        """Every event of a message (all lake columns and ``client_id``), by timestamp, trace
        offset and index."""
        conn = self._reader()
        blocks = _Blocks(conn)
        found: list[tuple[Any, ...]] = []
        hits = conn.execute(_MSG_BLOCKS, (_msg_hash(msg_id),)).fetchall()
        for (block,) in hits:
            found.extend(blocks.of_message(block, msg_id))
        found.sort(key=lambda e: (e[_E_TS], e[_E_OFF], e[_E_IDX]))
        return [_lake_row(e) for e in found]

    def msg_id_by_offset_msg_id(self, offset_msg_id: str) -> str | None:
        """The msgId of the message stored where ``offset_msg_id`` points (its store host,
        queue and Kafka offset, as :func:`tracemq.message_id.decode_offset_msg_id` reads
        them), from the Pub traces here; None if no Pub names that place, or if the id's port
        field is over 16 bits (no broker's place: a msgId, whose producer's PID is there, is
        answered without reading the place index).

        Raises:
            ValueError: ``offset_msg_id`` is not 32 or 56 hex characters.
        """
        wanted = decode_offset_msg_id(offset_msg_id)
        if int(wanted.store_host.rpartition(":")[2]) > 65535:
            # No broker's place: a port is 16 bits. A msgId pasted here (a missing one, the
            # common case) has its producer's PID there, so it costs no index sweep.
            return None
        place = _place_hash(offset_msg_id)
        if place is None:
            return None
        # The place index names every Pub whose offsetMsgId decodes to this place (matching
        # the place, not the text, finds a Pub that wrote the id in lower case); each is
        # checked, so a hash collision costs a read, never a wrong answer.
        conn = self._reader()
        blocks = _Blocks(conn)
        best: tuple[int, str] | None = None
        refs = conn.execute(_PLACE_REFS, (place,))
        for (ref,) in refs.fetchall():
            e = blocks.event(ref)
            if e is None or e[_E_TYPE] != "Pub":
                continue
            event = _event_row(e)
            try:
                found = decode_offset_msg_id(event.get("offset_msg_id") or "")
            except ValueError:
                continue
            if found == wanted and event.get("msg_id"):
                if best is None or event["timestamp"] > best[0]:
                    best = (int(event["timestamp"]), str(event["msg_id"]))
        return None if best is None else best[1]

    def _name_id(self, conn: sqlite3.Connection, name: str) -> int | None:
        row = conn.execute("SELECT id FROM names WHERE value = ?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def by_key(
        self,
        key: str,
        *,
        topic: str | None = None,
        begin: int | None = None,
        end: int | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Messages with a business key, newest first, a page at a time.

        Args:
            key: one business key (a message's keys are indexed one by one, split on spaces).
            topic: only messages of this topic.
            begin: only messages with Pub ``timestamp >= begin`` (epoch ms).
            end: only messages with Pub ``timestamp < end``.
            limit: page size, 1..:data:`MAX_PAGE_SIZE`.
            cursor: the cursor the previous page returned.

        Returns:
            ``(items, next_cursor)``; each item is ``{msg_id, topic, timestamp, keys, tags}``
            of the message's (first) Pub trace; ``next_cursor`` is None on the last page.

        Raises:
            ValueError: ``"invalid cursor"``, or a ``limit`` out of range.
        """
        _check_limit(limit)
        where = ["bucket IN buckets", "key = ?"]
        params: list[Any] = [key]
        conn = self._reader()
        if cursor is not None:
            where.append("(timestamp, ref) < (?, ?)")
            params.extend(_decode_cursor(_KEY_CURSOR, cursor))
        if topic is not None:
            topic_id = self._name_id(conn, topic)
            if topic_id is None:
                return [], None
            where.append("topic = ?")
            params.append(topic_id)
        _time_filter(where, params, "timestamp", begin, end)
        params.append(limit + 1)
        rows = conn.execute(
            f"{_BUCKETS}SELECT timestamp, ref FROM key_index "  # noqa: S608
            f"WHERE {' AND '.join(where)} ORDER BY timestamp DESC, ref DESC LIMIT ?",
            params,
        ).fetchall()
        blocks = _Blocks(conn)
        items = []
        for timestamp, ref in rows[:limit]:
            e = blocks.event(ref)
            if e is None:  # deleted between the two reads
                continue
            event = _event_row(e)
            items.append(
                {
                    "msg_id": e[_E_MSG],
                    "topic": e[_E_MTOPIC],
                    "timestamp": timestamp,
                    "keys": event["keys"],
                    "tags": event["tags"],
                }
            )
        return items, _next_cursor(_KEY_CURSOR, rows, limit)

    def messages(
        self,
        topic: str,
        *,
        begin: int | None,
        end: int | None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Pub traces of a topic with ``begin <= timestamp < end`` (None: open), newest first.

        Each item: ``msg_id, topic, timestamp, tags, keys, group_name, success, store_host,
        offset_msg_id, cost_time, msg_type, region_id``. A send retried under the same msgId
        is listed once per Pub trace. Paging and errors as in :meth:`by_key`.
        """
        _check_limit(limit)
        if cursor is not None:
            after = _decode_cursor(_MESSAGE_CURSOR, cursor)
        conn = self._reader()
        topic_id = self._name_id(conn, topic)
        if topic_id is None:
            return [], None
        where = ["topic = ?"]
        params: list[Any] = [topic_id]
        _time_filter(where, params, "timestamp", begin, end)
        if cursor is not None:
            where.append("(timestamp, ref) < (?, ?)")
            params.extend(after)
        params.append(limit + 1)
        rows = conn.execute(
            f"SELECT timestamp, ref FROM pub_index WHERE {' AND '.join(where)} "  # noqa: S608
            "ORDER BY timestamp DESC, ref DESC LIMIT ?",
            params,
        ).fetchall()
        blocks = _Blocks(conn)
        items = []
        for _, ref in rows[:limit]:
            e = blocks.event(ref)
            if e is None:  # deleted between the two reads
                continue
            event = _event_row(e)
            items.append({name: event[name] for name in _SUMMARY_COLUMNS})
        return items, _next_cursor(_MESSAGE_CURSOR, rows, limit)

    def _window(
        self, conn: sqlite3.Connection, since_ms: int, until_ms: int
    ) -> Iterator[tuple[int, int, bytes]]:
        """``(block, tp, data)`` of every block that may hold events in the window."""
        yield from conn.execute(
            "SELECT id, tp, data FROM blocks WHERE max_ts >= ? AND min_ts < ?",
            (since_ms, until_ms),
        )

    def consume_activity(
        self, since_ms: int, until_ms: int, *, group: str | None = None, limit: int = 200_000
    ) -> tuple[list[dict[str, Any]], bool]:
        """Consume-side events with ``since_ms <= timestamp < until_ms``, newest first: every
        SubBefore and SubAfter, and the Pubs to a ``%DLQ%`` topic (a consumer's move of a
        message to its dead-letter queue). Each row is the decoded event plus ``msg_topic``,
        the topic of the message's own Pub trace *in this store* (None when that Pub is not
        here: lost, or stored by another collector). With ``group``, only that group's events
        (a prefilter on the record text, then an exact check). At most ``limit`` events are
        read; the second value says whether that cut the window (the oldest part is missing).

        Reads the blocks that overlap the window (the ``max_ts`` index); the message topic comes
        from the Pubs in those blocks, else from one look-up by msgId per message."""
        conn = self._reader()
        blocks = _Blocks(conn)
        picked: list[tuple[int, int, tuple[Any, ...]]] = []
        pub_topic: dict[str, str] = {}
        for block, tp, data in self._window(conn, since_ms, until_ms):
            base = block << _POS_BITS
            for e in _decode_block(data, *blocks.partition(tp)):
                kind, ts = e[_E_TYPE], e[_E_TS]
                if kind == "Pub" and e[_E_MSG] is not None and not _is_dlq(e[_E_MTOPIC]):
                    pub_topic.setdefault(e[_E_MSG], e[_E_MTOPIC])
                if not since_ms <= ts < until_ms:
                    continue
                if kind in ("SubBefore", "SubAfter") or (kind == "Pub" and _is_dlq(e[_E_MTOPIC])):
                    if group is not None and group not in e[_E_RECORD]:
                        continue
                    picked.append((ts, base | e[0], e))
        picked.sort(key=itemgetter(0, 1), reverse=True)
        cut = len(picked) > limit
        out: list[dict[str, Any]] = []
        for _, _, e in picked[:limit]:
            event = _event_row(e)
            if group is not None and event.get("group_name") != group:
                continue
            del event["record"]
            msg_id = e[_E_MSG]
            if msg_id is not None and msg_id not in pub_topic:
                pub_topic[msg_id] = self._pub_topic(conn, blocks, msg_id)  # type: ignore[assignment]
            event["msg_topic"] = None if msg_id is None else pub_topic[msg_id]
            out.append(event)
        return out, cut

    @staticmethod
    def _pub_topic(conn: sqlite3.Connection, blocks: _Blocks, msg_id: str) -> str | None:
        """The topic of a message's (non-DLQ) Pub in this store, or None."""
        for (block,) in conn.execute(_PUB_BLOCKS, (_msg_hash(msg_id),)).fetchall():
            events = blocks.get(block)
            for e in events.values():
                if e[_E_MSG] == msg_id and e[_E_TYPE] == "Pub" and not _is_dlq(e[_E_MTOPIC]):
                    return str(e[_E_MTOPIC]) if e[_E_MTOPIC] is not None else None
            blocks.cache.pop(block, None)  # bounded: keep only what the picked events need
        return None

    def event_count(self) -> int:
        """Number of stored events."""
        return int(self._meta(self._reader(), "event_count") or 0)

    def quarantine_count(self) -> int:
        """Number of quarantined records."""
        return int(self._reader().execute("SELECT count(*) FROM quarantine").fetchone()[0])

    def quarantine_rows(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last quarantined records, newest first, with their reason and raw bytes."""
        cursor = self._reader().execute(
            "SELECT trace_topic, trace_partition, trace_offset, trace_index, reason, raw, "
            "ingest_ts FROM quarantine ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, r, strict=True)) for r in cursor]

    def events(self) -> Iterator[dict[str, Any]]:
        """Every stored event, as :meth:`events_in_range` gives them, partition by partition in
        offset order (for checks and tools: it reads the whole file)."""
        conn = self._reader()
        parts = conn.execute("SELECT trace_topic, partition FROM partitions ORDER BY id").fetchall()
        for trace_topic, partition in parts:
            yield from self.events_in_range(trace_topic, partition, 0, 1 << 62)

    # ------------------------------------------------------------------ retention

    def delete_older_than(self, cutoff_ms: int, batch: int = 5000) -> int:
        """Delete one batch of events with ``timestamp < cutoff_ms``; return how many.

        Their index rows go with them (a block keeps its younger events). The same call also
        deletes up to ``batch`` quarantined records read before the cutoff; once no old event
        is left it returns how many of those it deleted instead, so "call until it returns 0"
        empties both. Each call is one short transaction, so ingest waits for one batch at most.
        """

        def body(c: sqlite3.Connection) -> int:
            deleted = 0
            candidates = c.execute(
                "SELECT id FROM blocks WHERE min_ts < ? ORDER BY min_ts, id LIMIT ?",
                (cutoff_ms, batch),
            ).fetchall()
            blocks = _Blocks(c)
            names: dict[str, int | None] = {}
            for (block,) in candidates:
                if deleted >= batch:
                    break
                deleted += self._delete_from_block(
                    c, blocks, names, block, cutoff_ms, batch - deleted
                )
            if deleted:
                c.execute("UPDATE meta SET value = value - ? WHERE key = 'event_count'", (deleted,))
            quarantined = c.execute(
                "DELETE FROM quarantine WHERE id IN (SELECT id FROM quarantine "
                "WHERE ingest_ts < ? ORDER BY ingest_ts LIMIT ?)",
                (cutoff_ms, batch),
            ).rowcount
            return deleted if deleted else int(quarantined)

        return self._write(body)

    def _delete_from_block(
        self,
        c: sqlite3.Connection,
        blocks: _Blocks,
        names: dict[str, int | None],
        block: int,
        cutoff_ms: int,
        quota: int,
    ) -> int:
        """Delete up to ``quota`` of a block's events older than the cutoff, oldest first."""
        events = blocks.get(block)
        old = sorted(
            (e for e in events.values() if e[_E_TS] < cutoff_ms), key=itemgetter(_E_TS, 0)
        )[:quota]
        if not old:
            return 0
        base = block << _POS_BITS
        gone = {e[0] for e in old}
        kept = [e for p, e in sorted(events.items()) if p not in gone]
        pub_rows: list[tuple[Any, ...]] = []
        key_rows: list[tuple[Any, ...]] = []
        place_rows: list[tuple[int, int, int]] = []
        for e in old:
            if e[_E_TYPE] != "Pub":
                continue
            ref = base | e[0]
            topic = e[_E_MTOPIC]
            if topic is not None:
                if topic not in names:
                    names[topic] = self._name_id(c, topic)
                if names[topic] is not None:
                    pub_rows.append((names[topic], e[_E_TS], ref))
            row = _event_row(e)
            place = _place_hash(row.get("offset_msg_id"))
            if place is not None:
                place_rows.append((ref >> BUCKET_BITS, place, ref))
            keys = row["keys"]
            if keys:
                key_rows.extend(
                    (ref >> BUCKET_BITS, k, e[_E_TS], ref)
                    for k in split_keys(keys)[:MAX_KEYS_PER_MESSAGE]
                )
        c.executemany(
            "DELETE FROM pub_index WHERE topic = ? AND timestamp = ? AND ref = ?", pub_rows
        )
        c.executemany(
            "DELETE FROM key_index WHERE bucket = ? AND key = ? AND timestamp = ? AND ref = ?",
            key_rows,
        )
        c.executemany(
            "DELETE FROM place_index WHERE bucket = ? AND place_hash = ? AND ref = ?", place_rows
        )
        left: dict[int, int] = {}
        for e in kept:
            if e[_E_MSG] is not None:
                h = _msg_hash(e[_E_MSG])
                left[h] = max(left.get(h, 0), 1 if e[_E_TYPE] == "Pub" else 0)
        hashes = {_msg_hash(e[_E_MSG]) for e in old if e[_E_MSG] is not None}
        bucket = block >> _BLOCK_BUCKET_SHIFT
        c.executemany(
            "DELETE FROM msg_index WHERE bucket = ? AND msg_hash = ? AND block = ?",
            [(bucket, h, block) for h in hashes if h not in left],
        )
        c.executemany(
            "UPDATE msg_index SET pub = ? WHERE bucket = ? AND msg_hash = ? AND block = ?",
            [(left[h], bucket, h, block) for h in hashes if h in left],
        )
        if kept:
            offsets = [e[_E_OFF] for e in kept]
            stamps = [e[_E_TS] for e in kept]
            c.execute(
                "UPDATE blocks SET first_offset = ?, last_offset = ?, min_ts = ?, max_ts = ?, "
                "n = ?, data = ? WHERE id = ?",
                (
                    min(offsets),
                    max(offsets),
                    min(stamps),
                    max(stamps),
                    len(kept),
                    _encode_block(kept),
                    block,
                ),
            )
        else:
            c.execute("DELETE FROM blocks WHERE id = ?", (block,))
        blocks.cache.pop(block, None)
        return len(old)

    # ------------------------------------------------------------------ lake bookkeeping

    def lake_progress(self) -> dict[tuple[str, int], int]:
        """``(trace_topic, partition) → next offset`` the Parquet lake has still to write."""
        return self._offsets("lake_progress")

    def offset_bases(self) -> dict[tuple[str, int], int]:
        """``(trace_topic, partition) → base`` added to Kafka offsets to get the store's
        offsets (0 unless the partition's log was reset: see ``ingest``)."""
        rows = (
            self._reader()
            .execute("SELECT key, value FROM meta WHERE key LIKE 'offset_base:%'")
            .fetchall()
        )
        out = {}
        for key, value in rows:
            _, partition, topic = str(key).split(":", 2)
            out[(topic, int(partition))] = int(value)
        return out

    def set_offset_base(self, trace_topic: str, partition: int, base: int) -> None:
        """Durably (with everything stored before it) record a partition's offset base."""
        self._write(
            lambda c: c.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (f"offset_base:{partition}:{trace_topic}", int(base)),
            ),
            full_sync=True,
        )

    def set_lake_progress(self, trace_topic: str, partition: int, next_offset: int) -> None:
        """Move the lake progress of a partition forward (never backwards)."""
        self._write(
            lambda c: c.execute(
                _UPSERT_OFFSET.format(table="lake_progress"), (trace_topic, partition, next_offset)
            ),
            full_sync=True,
        )

    def start_lake_at(self, trace_topic: str, partition: int, next_offset: int) -> bool:
        """Set a partition's lake progress to ``next_offset`` unless the store or the lake
        already has progress for it; return whether it did. For a partition taken over before
        its ingest stored anything, whose events below ``next_offset`` an earlier owner wrote
        to the lake: one transaction, so ingest's first batch either came first (nothing is
        set) or finds the lake starting there (and does not write those offsets again)."""

        def body(c: sqlite3.Connection) -> bool:
            for table in ("progress", "lake_progress"):
                if c.execute(
                    f"SELECT 1 FROM {table} WHERE trace_topic = ? AND partition = ?",  # noqa: S608
                    (trace_topic, partition),
                ).fetchone():
                    return False
            c.execute(
                _UPSERT_OFFSET.format(table="lake_progress"), (trace_topic, partition, next_offset)
            )
            return True

        return self._write(body, full_sync=True)

    def begin_lake_segment(self, trace_topic: str, partition: int, start: int, end: int) -> None:
        """Record durably that lake files for offsets ``[start, end)`` are about to be written."""
        if start > end:
            raise ValueError(f"lake segment start {start} is after its end {end}")
        # FULL: once files exist the record of them must survive a power loss, and so must
        # every batch before it (the fsync of the WAL covers them).
        self._write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO lake_pending "
                "(trace_topic, partition, start_offset, end_offset) VALUES (?, ?, ?, ?)",
                (trace_topic, partition, start, end),
            ),
            full_sync=True,
        )

    def finish_lake_segment(self, trace_topic: str, partition: int, end: int) -> None:
        """Set the lake progress to ``end`` and clear its pending segment, in one transaction."""

        def body(c: sqlite3.Connection) -> None:
            c.execute(
                "DELETE FROM lake_pending "
                "WHERE trace_topic = ? AND partition = ? AND end_offset = ?",
                (trace_topic, partition, end),
            )
            c.execute(_UPSERT_OFFSET.format(table="lake_progress"), (trace_topic, partition, end))

        self._write(body, full_sync=True)

    def pending_lake_segments(self) -> list[tuple[str, int, int, int]]:
        """Begun but unfinished lake segments: ``(trace_topic, partition, start, end)``."""
        return [
            (topic, partition, start, end)
            for topic, partition, start, end in self._reader().execute(
                "SELECT trace_topic, partition, start_offset, end_offset FROM lake_pending "
                "ORDER BY trace_topic, partition, start_offset"
            )
        ]

    def first_event_offset(self, trace_topic: str, partition: int) -> int | None:
        """Lowest trace offset with a stored event in that partition, or None."""
        conn = self._reader()
        tp = self._tp_id(conn, trace_topic, partition, create=False)
        if tp is None:
            return None
        row = conn.execute("SELECT min(first_offset) FROM blocks WHERE tp = ?", (tp,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def nth_event_offset(self, trace_topic: str, partition: int, start: int, n: int) -> int | None:
        """Trace offset of the ``n``-th (from 0) stored event at or after ``start``, or None.

        Lets the lake cut a long range into segments of at most ``n`` events.
        """
        conn = self._reader()
        tp = self._tp_id(conn, trace_topic, partition, create=False)
        if tp is None:
            return None
        coords: list[tuple[int, int]] = []
        for first, data in conn.execute(
            "SELECT first_offset, data FROM blocks WHERE tp = ? AND last_offset >= ? "
            "ORDER BY first_offset",
            (tp, start),
        ):
            if len(coords) > n:
                coords.sort()
                if first > coords[n][0]:
                    break  # no later block holds an event before the n-th
            coords.extend(
                (e[_E_OFF], e[_E_IDX])
                for e in _decode_block(data, trace_topic, partition)
                if e[_E_OFF] >= start
            )
        coords.sort()
        return coords[n][0] if len(coords) > n else None

    def events_in_range(
        self, trace_topic: str, partition: int, start: int, end: int
    ) -> list[dict[str, Any]]:
        """Events with ``start <= trace_offset < end``, by offset and index.

        Each row has every lake column plus ``date`` and ``hour``, computed from its timestamp.
        """
        conn = self._reader()
        tp = self._tp_id(conn, trace_topic, partition, create=False)
        if tp is None:
            return []
        found: list[tuple[Any, ...]] = []
        for (data,) in conn.execute(
            "SELECT data FROM blocks WHERE tp = ? AND last_offset >= ? AND first_offset < ?",
            (tp, start, end),
        ):
            found.extend(
                e for e in _decode_block(data, trace_topic, partition) if start <= e[_E_OFF] < end
            )
        found.sort(key=itemgetter(_E_OFF, _E_IDX))
        rows = []
        for e in found:
            row = _event_row(e)
            del row["record"], row["client_id"]  # not lake columns
            rows.append(row)
        return rows


def _time_filter(
    where: list[str], params: list[Any], column: str, begin: int | None, end: int | None
) -> None:
    if begin is not None:
        where.append(f"{column} >= ?")
        params.append(begin)
    if end is not None:
        where.append(f"{column} < ?")
        params.append(end)


def _next_cursor(kind: bytes, rows: list[Any], limit: int) -> str | None:
    # One row more than the page was fetched: its presence, not a full page, says that there
    # is a next page, so the last page is never followed by an empty one.
    if len(rows) <= limit:
        return None
    timestamp, rowid = rows[limit - 1][0], rows[limit - 1][1]
    return _encode_cursor(kind, timestamp, rowid)


def stored_events(path: Path) -> list[dict[str, Any]]:
    """The events of a trace store file as their stored columns (:data:`STORE_ROW`), read-only.

    For checks and tools that must not open the file as a writer (a collector may be writing
    it): one read transaction, no decode of the records. ``[]`` while the file or its tables
    do not exist yet.
    """
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_S)
    try:
        conn.execute("BEGIN")
        parts = {
            tp: (topic, partition)
            for tp, topic, partition in conn.execute(
                "SELECT id, trace_topic, partition FROM partitions"
            )
        }
        out: list[dict[str, Any]] = []
        for tp, data in conn.execute("SELECT tp, data FROM blocks ORDER BY id"):
            out.extend(
                dict(zip(STORE_ROW, e[1:], strict=True)) for e in _decode_block(data, *parts[tp])
            )
        return out
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []  # the collector has not created its tables yet
        raise
    finally:
        conn.close()


# ---------------------------------------------------------------------- ingest's worker side


#: Net new container objects between two young-generation collections (CPython's default
#: is 700). Ingest allocates tuples by the million, none in a reference cycle, and holds a
#: chunk's worth of them for a while: at 700 the collector traverses each of them several
#: times before it is freed, 15-20 % of the decode's CPU (measured on bench data).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Garbage collection for a process that ingests (the collector and its worker): what
    exists now (modules, settings: never garbage) moves out of the collector's sight, and the
    young generation is collected every :data:`GC_YOUNG_THRESHOLD` allocations. Cycles are
    still collected, later."""
    import gc

    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def init_worker() -> None:  # pragma: no cover - runs in the ingest worker process
    """Initializer of the ingest worker process (defined here, not in ``ingest``, so that the
    worker imports only the store: no pyarrow, no Kafka client)."""
    import os
    import signal

    # The collector's process group gets SIGTERM/SIGINT on shutdown; the collector stops this
    # worker itself, after its last batch. If the collector dies, so does the worker.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the collector died before the line above
        os._exit(1)
    tune_gc()


_worker_stores: dict[str, TraceStore] = {}
_worker_failed: list[BaseException] = []


def write_rows_in_worker(
    path: str, batch: StoreRows
) -> tuple[int, dict[tuple[str, int], int | None], int]:
    """:meth:`TraceStore.write_rows` in an ingest worker process, on its own writer of ``path``.

    Batches must be stored in order: after one fails, the worker refuses every later one
    (the caller starts a new worker and hands the failed batch again; storing a batch twice is
    harmless, the store dedupes it).
    """
    if _worker_failed:
        raise TraceStoreError(f"an earlier batch failed in this worker: {_worker_failed[0]!r}")
    try:
        store = _worker_stores.get(path)
        if store is None:
            import multiprocessing.util

            store = TraceStore(Path(path))
            store.open()
            writer = store._writer  # noqa: SLF001
            assert writer is not None
            # A smaller cache than the default writer's, and no memory map (it would map every
            # page the writer touches, in time the whole file, into this process): the worker
            # stays small, for about 5 % more CPU per event (measured at 1 M events).
            writer.execute(f"PRAGMA cache_size=-{_WORKER_CACHE_KIB}")
            writer.execute("PRAGMA mmap_size=0")
            _worker_stores[path] = store
            multiprocessing.util.Finalize(None, store.close, exitpriority=10)
        return store.write_rows(batch)
    except BaseException as exc:
        _worker_failed.append(exc)
        raise
