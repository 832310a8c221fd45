"""The trace store: one SQLite file (WAL) per collector, for point look-ups.

Why SQLite, why this layout, and the measurements behind both: ``services/collector/STORE.md``.

Tables
------
``meta``
    ``schema_version`` of the file and ``next_event_id`` (event ids are assigned by the batch
    rather than by SQLite, so its key rows can name their events without a read-back).
``events``
    One row per trace event: the coordinates (``trace_topic, trace_partition, trace_offset,
    trace_index``, UNIQUE: replays are ignored), the columns queries filter on (``trace_type,
    timestamp, msg_id, topic``), the two lake columns the wire format may lack and ingest may
    fill in (``client_host``, ``store_time``), ``ingest_ts``, ``record``, the record's own
    text, and ``client_id``, the writing client's id (not a lake column; schema version 4, added
    to older files on open). The other lake columns are not stored: they are decoded again from ``record`` when
    read (:func:`tracemq_collector.events.event_from_stored`, the code ingest used), and the
    stored columns override what that decode says. So a change a caller makes to a row before
    :meth:`TraceStore.write_batch` is kept for those stored columns only. (Binding thirty
    mostly-null columns per row cost more than everything else in a batch.) Indexes:
    ``msg_id``; ``timestamp`` (retention; rows arrive in about time order, so it grows at its
    end); ``(topic, timestamp)`` over Pub events only, a partial index, which is what
    "messages of a topic" reads.
``event_keys``
    The business-key index: ``key, msg_id, topic, timestamp, bucket``, one row per (key,
    message), index ``(bucket, key, timestamp)``. ``bucket`` is the event id >>
    :data:`KEY_BUCKET_BITS`: a batch's key rows all go to the newest bucket, a few hundred
    pages that stay hot, where an index led by the key would put every random key on a page
    of its own (written to the WAL at every commit, more of them the larger the file). A look-up
    seeks each bucket (one per 65,536 events, about 150 at ten million). Schema version 1
    (index ``(key, timestamp)``) is migrated on open. Keys come from a message's Pub trace, which also names its topic
    and tags; a send retried under the same msgId adds no second row (the batch checks the
    events index for an earlier Pub), so look-ups list every message once. A message whose Pub
    trace is lost is still found by msgId, not by key. The row id is ``event_id << 8 | n``
    (n < :data:`MAX_KEYS_PER_MESSAGE`): the event is found from the key row, and retention
    deletes an event's key rows by row-id range, without another index.
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
import json
import sqlite3
import struct
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tracemq import lake
from tracemq.log import get_logger
from tracemq.message_id import decode_offset_msg_id

from tracemq_collector.errors import StoreSchemaError, TraceStoreError
from tracemq_collector.events import (
    KEY_SHIFT,
    MAX_KEYS_PER_MESSAGE,
    ROW_NAMES,
    STORE_COLUMNS,
    STORE_ROW,
    StoreRows,
    event_from_stored,
    hour_partition,
    store_rows,
)

__all__ = [
    "DEDUPE_WINDOW_MESSAGES",
    "KEY_BUCKET_BITS",
    "MAX_KEYS_PER_MESSAGE",
    "STORE_ROW",
    "MAX_PAGE_SIZE",
    "SCHEMA_VERSION",
    "StoreSchemaError",
    "TraceStore",
    "TraceStoreError",
]

#: Version of this file's table layout; a file of another version is refused, not misread.
SCHEMA_VERSION = 4
#: Trace offsets per partition whose idempotency keys are kept (see ``message_keys``): about
#: 100 bytes each. A repeat arriving later than this many trace messages after the first copy
#: in its partition is stored again.
DEDUPE_WINDOW_MESSAGES = 200_000
#: Events per key-index bucket: 2**KEY_BUCKET_BITS (see the module docstring).
KEY_BUCKET_BITS = 16
#: Largest ``limit`` a paged query accepts.
MAX_PAGE_SIZE = 1000
#: Business keys indexed per message (in sorted order); more are kept in the event, unindexed.


_T = TypeVar("_T")
log = get_logger("collector.store")
_KEY_SHIFT = KEY_SHIFT
_KEY_MASK = (1 << KEY_SHIFT) - 1
_LAKE_COLUMNS = lake.COLUMN_NAMES

# The events table is created from STORE_COLUMNS, the one list of its columns.
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    {event_columns},
    UNIQUE (trace_topic, trace_partition, trace_offset, trace_index)
);
CREATE INDEX events_msg_id ON events (msg_id);
CREATE INDEX events_timestamp ON events (timestamp);
CREATE INDEX events_pub_topic ON events (topic, timestamp) WHERE trace_type = 'Pub';
CREATE TABLE event_keys (
    key TEXT NOT NULL,
    msg_id TEXT NOT NULL,
    topic TEXT,
    timestamp INTEGER NOT NULL,
    bucket INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX event_keys_bucket ON event_keys (bucket, key, timestamp);
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
""".replace("{event_columns}", ",\n    ".join(f"{name} {decl}" for name, decl in STORE_COLUMNS))
# The events table's columns in order (checked against the file when a store opens).
_EVENT_COLUMNS = ["id", *STORE_ROW]
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
_STORED = ", ".join(_STORED_COLUMNS)
_STORED_AS_E = ", ".join(f"e.{c}" for c in _STORED_COLUMNS)
_AUTHORITATIVE = _STORED_COLUMNS[6:]

# Formatted with integers only: the first event id of the batch, and that id << _KEY_SHIFT.
_INSERT_EVENT = (  # built from constants only
    f"INSERT OR IGNORE INTO events ({', '.join(_EVENT_COLUMNS)}) "  # noqa: S608
    f"VALUES ({{first_id}} + ?, {', '.join('?' for _ in _EVENT_COLUMNS[1:])})"
)
_INSERT_KEY = (
    "INSERT INTO event_keys (rowid, key, msg_id, topic, timestamp, bucket) "
    "VALUES ({base} + ?1, ?2, ?3, ?4, ?5, ({base} + ?1) >> {bucket_shift})"
)
# Version 1 → 2: the key index gets its buckets (see the module docstring).
_MIGRATE_1_TO_2 = (
    "ALTER TABLE event_keys ADD COLUMN bucket INTEGER NOT NULL DEFAULT 0",
    f"UPDATE event_keys SET bucket = rowid >> {KEY_SHIFT + KEY_BUCKET_BITS}",  # noqa: S608
    "DROP INDEX IF EXISTS event_keys_key_time",
    "CREATE INDEX event_keys_bucket ON event_keys (bucket, key, timestamp)",
    "UPDATE meta SET value = 2 WHERE key = 'schema_version'",
)
# Version 2 → 3: the idempotency keys of trace messages (see the module docstring).
_MIGRATE_2_TO_3 = (
    "CREATE TABLE IF NOT EXISTS message_keys (key TEXT PRIMARY KEY, trace_topic TEXT NOT NULL, "
    "trace_partition INTEGER NOT NULL, trace_offset INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS message_keys_offset "
    "ON message_keys (trace_topic, trace_partition, trace_offset)",
    "UPDATE meta SET value = 3 WHERE key = 'schema_version'",
)
# Version 3 → 4: the writing client's id per event (trace message header CLIENT_ID).
_MIGRATE_3_TO_4 = (
    "ALTER TABLE events ADD COLUMN client_id TEXT",
    "UPDATE meta SET value = 4 WHERE key = 'schema_version'",
)
_KNOWN_KEYS = """
SELECT key, trace_topic, trace_partition, trace_offset FROM message_keys
WHERE key IN (SELECT value FROM json_each(?))
"""
# Every bucket that may hold key rows: those of the events still stored.
_BUCKETS = (  # built from constants only
    "WITH RECURSIVE buckets(b) AS ("  # noqa: S608
    f"SELECT (SELECT min(id) FROM events) >> {KEY_BUCKET_BITS} UNION ALL "
    f"SELECT b + 1 FROM buckets WHERE b < (SELECT max(id) FROM events) >> {KEY_BUCKET_BITS}) "
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
_EXISTING = """
SELECT trace_offset, trace_index FROM events
WHERE trace_topic = ? AND trace_partition = ? AND trace_offset BETWEEN ? AND ?
"""
_PUBLISHED = """
SELECT DISTINCT msg_id FROM events
WHERE msg_id IN (SELECT value FROM json_each(?)) AND trace_type = 'Pub'
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

# Sizes for one collector's file (about 400 bytes per event: tens of millions of events are
# several GB): the writer's cache holds the hot index pages, readers mostly hit the mmap.
_WRITER_CACHE_KIB = 131_072
_WORKER_CACHE_KIB = 32_768
_READER_CACHE_KIB = 16_384
_MMAP_BYTES = 1 << 30
# A larger WAL between checkpoints lets a page dirtied by many batches be copied back once.
_WAL_AUTOCHECKPOINT_PAGES = 8192
_WAL_LIMIT_BYTES = 64 << 20
_BUSY_TIMEOUT_S = 10.0


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


def _lake_row(values: Sequence[Any]) -> dict[str, Any]:
    """A stored event as look-ups return it: the lake columns, and the client id (which the
    lake does not keep)."""
    row = _decoded(values)
    out = {name: row[name] for name in _LAKE_COLUMNS}
    out["client_id"] = row["client_id"]
    return out


class TraceStore:
    """The collector's trace store: events, key index, quarantine and progress in one file.

    Args:
        path: the SQLite file; its directory is created on :meth:`open`.

    Use as ``with TraceStore(path) as store: ...`` or call :meth:`open` and :meth:`close`.
    Tables, durability and threads: see the module docstring.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._writer: sqlite3.Connection | None = None
        self._write_lock = threading.Lock()
        self._local = threading.local()
        # Bumped on open and close, so a thread's reader from an earlier open is not reused.
        self._generation = 0

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open the file (creating it if needed) and check its schema version.

        Raises:
            StoreSchemaError: the file has another schema version (a newer one: upgrade).
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
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise TraceStoreError(f"{self.path}: cannot use WAL mode (got {mode!r})")
                for pragma in (
                    "synchronous=NORMAL",
                    f"cache_size=-{_WRITER_CACHE_KIB}",
                    f"mmap_size={_MMAP_BYTES}",
                    "temp_store=MEMORY",
                    f"wal_autocheckpoint={_WAL_AUTOCHECKPOINT_PAGES}",
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
                    [("schema_version", SCHEMA_VERSION), ("next_event_id", 1)],
                )
            elif "meta" not in tables:
                raise TraceStoreError(f"{self.path} is an SQLite file but not a trace store")
            version = self._meta(c, "schema_version")
            if version == 1:
                log.warning("migrating the trace store to schema version 2", path=str(self.path))
                for statement in _MIGRATE_1_TO_2:
                    c.execute(statement)
                version = self._meta(c, "schema_version")
            if version == 2:
                log.warning("migrating the trace store to schema version 3", path=str(self.path))
                for statement in _MIGRATE_2_TO_3:
                    c.execute(statement)
                version = self._meta(c, "schema_version")
            if version == 3:
                log.warning("migrating the trace store to schema version 4", path=str(self.path))
                have = {r[1] for r in c.execute("PRAGMA table_info(events)")}
                for statement in _MIGRATE_3_TO_4:
                    if "ADD COLUMN client_id" in statement and "client_id" in have:
                        continue
                    c.execute(statement)
                version = self._meta(c, "schema_version")
            if version != SCHEMA_VERSION:
                newer = isinstance(version, int) and version > SCHEMA_VERSION
                raise StoreSchemaError(
                    f"trace store {self.path} has schema version {version!r}, this collector "
                    f"knows version {SCHEMA_VERSION}"
                    + ("; the file is newer: upgrade the collector" if newer else "")
                )
            columns = [r[1] for r in c.execute("PRAGMA table_info(events)")]
            if columns != _EVENT_COLUMNS:
                raise StoreSchemaError(
                    f"trace store {self.path}: events has columns {columns}, "
                    f"expected {_EVENT_COLUMNS}"
                )

        self._transaction(conn, body)

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
    def _fresh(
        conn: sqlite3.Connection, events: list[tuple[Any, ...]], ordered: bool
    ) -> list[int] | None:
        """Positions of the events not stored yet, or None when all of them are new."""
        # One index range scan per partition finds what is already stored, so a replay indexes
        # no key twice; for a fresh batch (the usual case) the scan finds nothing and is cheap.
        bounds: dict[tuple[str, int], list[int]] = {}
        for row in events:
            offset = row[3]
            b = bounds.get((row[1], row[2]))
            if b is None:
                bounds[(row[1], row[2])] = [offset, offset]
            elif offset < b[0]:
                b[0] = offset
            elif offset > b[1]:
                b[1] = offset
        seen: set[tuple[str, int, int, int]] = set()
        for (topic, partition), (low, high) in bounds.items():
            seen.update(
                (topic, partition, offset, index)
                for offset, index in conn.execute(_EXISTING, (topic, partition, low, high))
            )
        if not seen and ordered:
            return None
        fresh = []
        for i, row in enumerate(events):
            coords = row[1:5]
            if coords not in seen:
                seen.add(coords)  # also drops a duplicate inside the batch itself
                fresh.append(i)
        return None if len(fresh) == len(events) else fresh

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
        return StoreRows(
            events,
            key_rows,
            [m for m in batch.key_msg_ids if m in ids],
            batch.quarantine,
            batch.progress,
            True,
        )

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
        if batch.events:
            fresh = self._fresh(conn, batch.events, batch.ordered)
            if fresh is not None:
                batch = self._renumber(batch, fresh)
            new = len(batch.events)
        if new:
            # Read inside the transaction: correct even if another process wrote this file.
            first_id = int(self._meta(conn, "next_event_id"))
            key_rows = batch.key_rows
            if key_rows:
                # Messages whose keys an earlier Pub (a retried send) already indexed.
                indexed = {r[0] for r in conn.execute(_PUBLISHED, (json.dumps(batch.key_msg_ids),))}
                if indexed:
                    key_rows = [row for row in key_rows if row[2] not in indexed]
            # The ids are literals (integers), so the rows are bound as the batch made them.
            conn.executemany(_INSERT_EVENT.format(first_id=int(first_id)), batch.events)
            if key_rows:
                conn.executemany(
                    _INSERT_KEY.format(
                        base=int(first_id) << _KEY_SHIFT, bucket_shift=_KEY_SHIFT + KEY_BUCKET_BITS
                    ),
                    key_rows,
                )
            conn.execute("UPDATE meta SET value = ? WHERE key = 'next_event_id'", (first_id + new,))
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
        cursor = self._reader().execute(
            f"SELECT {_STORED} FROM events WHERE msg_id = ? "  # noqa: S608
            "ORDER BY timestamp, trace_offset, trace_index",
            (msg_id,),
        )
        return [_lake_row(r) for r in cursor]

    def msg_id_by_offset_msg_id(self, offset_msg_id: str) -> str | None:
        """The msgId of the message stored where ``offset_msg_id`` points (its store host,
        queue and Kafka offset, as :func:`tracemq.message_id.decode_offset_msg_id` reads
        them), from the Pub traces here; None if no Pub names that place.

        Raises:
            ValueError: ``offset_msg_id`` is not 32 or 56 hex characters.
        """
        wanted = decode_offset_msg_id(offset_msg_id)
        # No index holds offsetMsgIds (the store keeps the record text, not the column): this
        # scans the Pub rows, which a look-up by an id the user pasted can afford. Matching on
        # the decoded place, not the text, finds a Pub that wrote the id in lower case.
        rows = self._reader().execute(
            f"SELECT {_STORED} FROM events WHERE trace_type = 'Pub' "  # noqa: S608
            "AND instr(upper(record), ?) > 0 ORDER BY timestamp DESC",
            (offset_msg_id.upper(),),
        )
        for values in rows:
            event = _decoded(values)
            try:
                found = decode_offset_msg_id(event.get("offset_msg_id") or "")
            except ValueError:
                continue
            if found == wanted and event.get("msg_id"):
                return str(event["msg_id"])
        return None

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
        where = ["k.bucket IN buckets", "k.key = ?"]
        params: list[Any] = [key]
        if topic is not None:
            where.append("k.topic = ?")
            params.append(topic)
        _time_filter(where, params, "k.timestamp", begin, end)
        if cursor is not None:
            where.append("(k.timestamp, k.rowid) < (?, ?)")
            params.extend(_decode_cursor(_KEY_CURSOR, cursor))
        params.append(limit + 1)
        rows = (
            self._reader()
            .execute(
                f"{_BUCKETS}SELECT k.timestamp, k.rowid, k.msg_id, k.topic, "  # noqa: S608
                f"{_STORED_AS_E} "
                f"FROM event_keys AS k JOIN events AS e ON e.id = (k.rowid >> {_KEY_SHIFT}) "
                f"WHERE {' AND '.join(where)} "
                "ORDER BY k.timestamp DESC, k.rowid DESC LIMIT ?",
                params,
            )
            .fetchall()
        )
        items = []
        for timestamp, _, msg_id, msg_topic, *stored in rows[:limit]:
            event = _decoded(stored)
            items.append(
                {
                    "msg_id": msg_id,
                    "topic": msg_topic,
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
        # trace_type = 'Pub' must be literal SQL, or SQLite cannot use the partial index.
        where = ["trace_type = 'Pub'", "topic = ?"]
        params: list[Any] = [topic]
        _time_filter(where, params, "timestamp", begin, end)
        if cursor is not None:
            where.append("(timestamp, id) < (?, ?)")
            params.extend(_decode_cursor(_MESSAGE_CURSOR, cursor))
        params.append(limit + 1)
        rows = (
            self._reader()
            .execute(
                f"SELECT timestamp, id, {_STORED} FROM events "  # noqa: S608
                f"WHERE {' AND '.join(where)} ORDER BY timestamp DESC, id DESC LIMIT ?",
                params,
            )
            .fetchall()
        )
        items = []
        for row in rows[:limit]:
            event = _decoded(row[2:])
            items.append({name: event[name] for name in _SUMMARY_COLUMNS})
        return items, _next_cursor(_MESSAGE_CURSOR, rows, limit)

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

        Reads the ``timestamp`` index over the window; the message topic is one look-up by
        msgId per event (the ``msg_id`` index)."""
        where = [
            "timestamp >= ?",
            "timestamp < ?",
            "(trace_type IN ('SubBefore', 'SubAfter') "
            "OR (trace_type = 'Pub' AND topic LIKE '\\%DLQ\\%%' ESCAPE '\\'))",
        ]
        params: list[Any] = [since_ms, until_ms]
        if group is not None:
            where.append("instr(record, ?) > 0")
            params.append(group)
        params.append(limit + 1)
        rows = (
            self._reader()
            .execute(
                f"SELECT {_STORED}, (SELECT p.topic FROM events AS p "  # noqa: S608
                "WHERE p.msg_id = events.msg_id AND p.trace_type = 'Pub' "
                "AND p.topic NOT LIKE '\\%DLQ\\%%' ESCAPE '\\' LIMIT 1) "
                f"FROM events WHERE {' AND '.join(where)} ORDER BY timestamp DESC LIMIT ?",
                params,
            )
            .fetchall()
        )
        out = []
        for values in rows[:limit]:
            event = _decoded(values[:-1])
            if group is not None and event.get("group_name") != group:
                continue
            del event["record"]
            event["msg_topic"] = values[-1]
            out.append(event)
        return out, len(rows) > limit

    def event_count(self) -> int:
        """Number of stored events."""
        return int(self._reader().execute("SELECT count(*) FROM events").fetchone()[0])

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

    # ------------------------------------------------------------------ retention

    def delete_older_than(self, cutoff_ms: int, batch: int = 5000) -> int:
        """Delete one batch of events with ``timestamp < cutoff_ms``; return how many.

        Their key rows go with them. The same call also deletes up to ``batch`` quarantined
        records read before the cutoff; once no old event is left it returns how many of those
        it deleted instead, so "call until it returns 0" empties both. Each call is one short
        transaction, so ingest waits for one batch at most.
        """

        def body(c: sqlite3.Connection) -> int:
            old = c.execute(
                "SELECT id, trace_type FROM events WHERE timestamp < ? ORDER BY timestamp LIMIT ?",
                (cutoff_ms, batch),
            ).fetchall()
            c.executemany(
                "DELETE FROM event_keys WHERE rowid BETWEEN ? AND ?",
                [
                    (event_id << _KEY_SHIFT, ((event_id + 1) << _KEY_SHIFT) - 1)
                    for event_id, trace_type in old
                    if trace_type == "Pub"
                ],
            )
            c.executemany("DELETE FROM events WHERE id = ?", [(event_id,) for event_id, _ in old])
            quarantined = c.execute(
                "DELETE FROM quarantine WHERE id IN (SELECT id FROM quarantine "
                "WHERE ingest_ts < ? ORDER BY ingest_ts LIMIT ?)",
                (cutoff_ms, batch),
            ).rowcount
            return len(old) if old else int(quarantined)

        return self._write(body)

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
        row = (
            self._reader()
            .execute(
                "SELECT min(trace_offset) FROM events WHERE trace_topic = ? AND trace_partition = ?",
                (trace_topic, partition),
            )
            .fetchone()
        )
        return None if row is None or row[0] is None else int(row[0])

    def nth_event_offset(self, trace_topic: str, partition: int, start: int, n: int) -> int | None:
        """Trace offset of the ``n``-th (from 0) stored event at or after ``start``, or None.

        Lets the lake cut a long range into segments of at most ``n`` events.
        """
        row = (
            self._reader()
            .execute(
                "SELECT trace_offset FROM events WHERE trace_topic = ? AND trace_partition = ? "
                "AND trace_offset >= ? ORDER BY trace_offset, trace_index LIMIT 1 OFFSET ?",
                (trace_topic, partition, start, n),
            )
            .fetchone()
        )
        return None if row is None else int(row[0])

    def events_in_range(
        self, trace_topic: str, partition: int, start: int, end: int
    ) -> list[dict[str, Any]]:
        """Events with ``start <= trace_offset < end``, by offset and index.

        Each row has every lake column plus ``date`` and ``hour``, computed from its timestamp.
        """
        cursor = self._reader().execute(
            f"SELECT {_STORED} FROM events WHERE trace_topic = ? "  # noqa: S608
            "AND trace_partition = ? AND trace_offset >= ? AND trace_offset < ? "
            "ORDER BY trace_offset, trace_index",
            (trace_topic, partition, start, end),
        )
        rows = []
        for values in cursor:
            row = _decoded(values)
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


# ---------------------------------------------------------------------- ingest's worker side


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
