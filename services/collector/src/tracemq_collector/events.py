"""Trace message → trace events: one row per decoded record, one quarantine row per bad one.

A trace message (one Kafka record of the trace topic) holds records in RocketMQ's text format
(DESIGN §3). :func:`rows_from_record` turns it into

* **event rows**: one per good record, a dict with every column of the lake
  (:data:`tracemq.lake.COLUMNS`) plus four keys that are not lake columns: ``date``
  (``YYYY-MM-DD``) and ``hour`` (0-23), the UTC Hive partition of the event, ``record``, the
  record's text (without its ``\\x02``), which the trace store keeps instead of thirty columns
  and decodes again with :func:`event_from_stored`, and ``client_id``, the writing client's id
  (the trace message's ``CLIENT_ID`` header; the store keeps it, the lake does not);
* **quarantine rows**: one per record that cannot become an event, with its coordinates, the
  reason and its raw bytes, so nothing is dropped silently.

The raw bytes are split on ``\\x02`` *before* UTF-8 decoding, so a record with invalid UTF-8 is
quarantined alone and its neighbours are kept. ``trace_index`` is the position of a record in
that split, counted the same way for good and bad records; only the empty piece after the last
separator is not a record. An empty piece in the middle holds no data and is skipped (like
:func:`tracemq.trace.decode_report` does) but still takes its index, so indexes never shift.

The function never raises, whatever the bytes: the ingest loop must not stop on bad input.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import eq as _eq
from typing import Any

from tracemq import lake
from tracemq.message_id import decode_offset_msg_id
from tracemq.trace import (
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    MessageType,
    TraceBean,
    TraceContext,
    decode_report,
)

__all__ = [
    "EMPTY_MESSAGE",
    "MAX_FIELD_CHARS",
    "MAX_KEYS_PER_MESSAGE",
    "MAX_RAW_BYTES",
    "MAX_TIMESTAMP_MS",
    "EXTRA_KEYS",
    "PLACE_COLUMNS",
    "QUARANTINE_KEYS",
    "ROW_NAMES",
    "STORE_COLUMNS",
    "STORE_ROW",
    "DecodedChunk",
    "KEY_SHIFT",
    "PartitionChunk",
    "StoreRows",
    "decode_chunk",
    "key_rows_of",
    "lake_batch",
    "store_rows",
    "split_keys",
    "decode_message",
    "event_from_stored",
    "hour_partition",
    "rows_from_record",
]

#: A field longer than this (in characters) quarantines its record: one 10 MB tag must not
#: bloat the store's pages and indexes or the lake's row groups.
MAX_FIELD_CHARS = 65_536
#: Quarantine keeps at most this many bytes of a record; the reason says when it was cut.
MAX_RAW_BYTES = 65_536
#: 9999-12-31T23:59:59.999Z: the last instant a ``YYYY-MM-DD`` partition can name.
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: Reason of the single quarantine row of a message that holds no record at all.
EMPTY_MESSAGE = "empty trace message"

#: Business keys indexed per message (in sorted order); more are kept in the event, unindexed.
MAX_KEYS_PER_MESSAGE = 256

#: Keys an event row has on top of the lake columns.
EXTRA_KEYS = ("date", "hour", "record", "client_id")
#: Keys of a quarantine row.
QUARANTINE_KEYS = (
    "trace_topic",
    "trace_partition",
    "trace_offset",
    "trace_index",
    "reason",
    "raw",
    "ingest_ts",
)

_RECORD_END = FIELD_SPLITOR.encode()
_HOUR_MS = lake.HOUR_MS
# Bound here: the decoders call it once per event.
_partition_of_hour = lake.partition_of_hour


def hour_partition(timestamp_ms: int) -> tuple[str, int]:
    """The UTC ``(date, hour)`` Hive partition of an epoch-millisecond timestamp.

    Raises:
        ValueError: the timestamp is before 1970 or after year 9999.
    """
    if not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
        raise ValueError(f"timestamp {timestamp_ms} is outside 1970..9999")
    return _partition_of_hour(timestamp_ms // _HOUR_MS)


def _quarantine(
    trace_topic: str,
    partition: int,
    offset: int,
    index: int,
    reason: str,
    raw: bytes,
    ingest_ts: int,
) -> dict[str, Any]:
    if len(raw) > MAX_RAW_BYTES:
        reason = f"{reason}; raw cut to {MAX_RAW_BYTES} of {len(raw)} bytes"
        raw = raw[:MAX_RAW_BYTES]
    return {
        "trace_topic": trace_topic,
        "trace_partition": partition,
        "trace_offset": offset,
        "trace_index": index,
        "reason": reason,
        "raw": raw,
        "ingest_ts": ingest_ts,
    }


def _oversized_field(text: str) -> str | None:
    if len(text) <= MAX_FIELD_CHARS:
        return None
    for position, field in enumerate(text.split(CONTENT_SPLITOR)):
        if len(field) > MAX_FIELD_CHARS:
            return f"field {position} is {len(field)} characters long (limit {MAX_FIELD_CHARS})"
    return None


def _event_row(
    ctx: TraceContext,
    bean: TraceBean,
    timestamp: int,
    partition_of_event: tuple[str, int],
    trace_topic: str,
    partition: int,
    offset: int,
    index: int,
    ingest_ts: int,
    record: str,
) -> dict[str, Any]:
    store_addr: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    if bean.offset_msg_id is not None:
        try:
            decoded = decode_offset_msg_id(bean.offset_msg_id)
        except ValueError:
            # RocketMQ's own offsetMsgIds and garbage both end up here: keep the text, no coords.
            pass
        else:
            store_addr = decoded.store_host
            queue_id = decoded.queue_id
            queue_offset = decoded.kafka_offset
    date, hour = partition_of_event
    return {
        "trace_type": ctx.trace_type.value,
        "timestamp": timestamp,
        "region_id": ctx.region_id,
        "group_name": ctx.group_name,
        "request_id": ctx.request_id,
        "cost_time": ctx.cost_time,
        "success": ctx.success,
        "context_code": ctx.context_code,
        "topic": bean.topic,
        "msg_id": bean.msg_id,
        "offset_msg_id": bean.offset_msg_id,
        "tags": bean.tags,
        "keys": bean.keys,
        "store_host": bean.store_host,
        "client_host": bean.client_host,
        "store_time": bean.store_time,
        "retry_times": bean.retry_times,
        "body_length": bean.body_length,
        "msg_type": None if bean.msg_type is None else int(bean.msg_type),
        "transaction_id": bean.transaction_id,
        "transaction_state": (
            None if bean.transaction_state is None else str(bean.transaction_state.value)
        ),
        "from_transaction_check": bean.from_transaction_check,
        "trace_topic": trace_topic,
        "trace_partition": partition,
        "trace_offset": offset,
        "trace_index": index,
        "ingest_ts": ingest_ts,
        # the writing client's id: a header of the trace message, not in the record (ingest
        # fills it; the store keeps it)
        "client_id": None,
        "store_addr": store_addr,
        "queue_id": queue_id,
        "queue_offset": queue_offset,
        "schema_version": lake.SCHEMA_VERSION,
        "date": date,
        "hour": hour,
        "record": record,
    }


def _decode_text(
    text: str, trace_topic: str, partition: int, offset: int, index: int, ingest_ts: int
) -> dict[str, Any] | str | None:
    """One record's text → its event row, or the reason to quarantine it, or None if empty."""
    too_long = _oversized_field(text)
    if too_long is not None:
        return too_long
    # The separator goes back on so decode_report sees exactly one complete record.
    result = decode_report(text + FIELD_SPLITOR)
    if result.errors:
        reason = result.errors[0].reason
        # decode_report names unknown types itself; everything else is a broken record.
        return reason if reason.startswith("unknown trace type") else f"malformed record: {reason}"
    if not result.contexts:
        return None  # an empty piece: no data, nothing to keep or to report
    ctx = result.contexts[0]
    if not ctx.trace_beans:
        return "malformed record: no trace bean decoded"
    # Old SubAfter records carry no timestamp; the time the collector read it is the best bound.
    timestamp = ctx.timestamp if ctx.timestamp != 0 else ingest_ts
    try:
        partition_of_event = hour_partition(timestamp)
    except ValueError:
        return f"malformed record: timestamp {timestamp} is outside 1970..9999"
    # One record decodes to one context with one bean (SubBefore/SubAfter: one record per bean).
    return _event_row(
        ctx,
        ctx.trace_beans[0],
        timestamp,
        partition_of_event,
        trace_topic,
        partition,
        offset,
        index,
        ingest_ts,
        text,
    )


def _decode_piece(
    piece: bytes,
    trace_topic: str,
    partition: int,
    offset: int,
    index: int,
    ingest_ts: int,
    events: list[dict[str, Any]],
    quarantine: list[dict[str, Any]],
) -> None:
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError as exc:
        outcome: dict[str, Any] | str | None = f"invalid UTF-8 at byte {exc.start}: {exc.reason}"
    else:
        outcome = _decode_text(text, trace_topic, partition, offset, index, ingest_ts)
    if isinstance(outcome, dict):
        events.append(outcome)
    elif outcome is not None:
        quarantine.append(
            _quarantine(trace_topic, partition, offset, index, outcome, piece, ingest_ts)
        )


# ------------------------------------------------------------------------- the fast path
#
# Nearly every record on the wire is a Pub of 14 fields, a SubBefore of 8 or a SubAfter of 9,
# with plain decimal numbers. _fast_row decodes exactly those shapes straight into a tuple
# (no TraceContext, no dict) and gives up (None) on anything else — another field count, a
# sign, a number out of range, a trailing empty field, an oversized record, a timestamp no
# partition can hold — which then takes the general path above. Whenever it answers, its row
# is the one the general path builds (tests/unit/test_collector_events.py compares the two).
# Ingest runs its compiled twin (_fastdecode.fast_into, through decode_message_into), which
# appends those rows' values straight to the partition's columns: no tuple per event and no
# transposition afterwards (tests/unit/test_collector_fastdecode.py holds it to _fast_rows).

#: The columns of an event the trace store keeps (in its blocks: ``tracemq_collector.store``),
#: with their types as SQL declarations: the one list of them.
STORE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("trace_topic", "TEXT NOT NULL"),
    ("trace_partition", "INTEGER NOT NULL"),
    ("trace_offset", "INTEGER NOT NULL"),
    ("trace_index", "INTEGER NOT NULL"),
    ("trace_type", "TEXT NOT NULL"),
    ("timestamp", "INTEGER NOT NULL"),
    ("msg_id", "TEXT"),
    ("topic", "TEXT"),
    ("client_host", "TEXT"),
    ("store_time", "INTEGER NOT NULL"),
    ("ingest_ts", "INTEGER NOT NULL"),
    ("record", "TEXT NOT NULL"),
    ("client_id", "TEXT"),
)
#: The names of :data:`STORE_COLUMNS`.
STORE_ROW = tuple(name for name, _ in STORE_COLUMNS)
#: Keys of an event row, in the order of the tuples :func:`decode_message` produces: the
#: store's columns (:data:`STORE_ROW`, so that a slice is the store's row), then the other
#: lake columns, then ``date`` and ``hour``.
ROW_NAMES: tuple[str, ...] = (
    *STORE_ROW,
    *(c for c in lake.COLUMN_NAMES if c not in STORE_ROW),
    "date",
    "hour",
)
#: Positions of a few columns in an event tuple.
COL = {name: i for i, name in enumerate(ROW_NAMES)}

_C = CONTENT_SPLITOR
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1
_MSG_TYPE_MAX = len(MessageType) - 1
_SCHEMA_VERSION = lake.SCHEMA_VERSION
_KAFKA_OFFSET_MASK = 2**48 - 1
_store_addrs: dict[bytes, str] = {}


def _offset_coords(offset_msg_id: str | None) -> tuple[str | None, int | None, int | None]:
    """``decode_offset_msg_id`` as ``_event_row`` uses it: (store_addr, queue_id, offset).

    32 hex digits (IPv4 store host) or 56 (IPv6, ``[v6]:port``), as RocketMQ writes them."""
    if offset_msg_id is None or len(offset_msg_id) not in (32, 56):
        return None, None, None
    try:
        raw = bytes.fromhex(offset_msg_id)
    except ValueError:
        return None, None, None
    if len(raw) * 2 != len(offset_msg_id):  # fromhex skips spaces: not all hex digits
        return None, None, None
    a = len(raw) - 12  # address length: 4 or 16
    host = raw[: a + 4]
    addr = _store_addrs.get(host)
    if addr is None:
        if len(_store_addrs) > 4096:
            _store_addrs.clear()
        port = int.from_bytes(host[a:], "big")
        if a == 4:
            addr = f"{'.'.join(str(b) for b in host[:4])}:{port}"
        else:
            addr = f"[{ipaddress.IPv6Address(host[:16])}]:{port}"
        _store_addrs[host] = addr
    physical = int.from_bytes(raw[a + 4 :], "big")
    return addr, physical >> 48, physical & _KAFKA_OFFSET_MASK


def _fast_row(
    text: str,
    trace_topic: str,
    partition: int,
    offset: int,
    index: int,
    ingest_ts: int,
    client_host: str | None,
    client_id: str | None = None,
) -> tuple[Any, ...] | None:
    """The event tuple of a common record, or None to let the general path decide.

    ``client_host`` fills the column (the three shapes decoded here never carry one), and
    ``client_id`` its own.
    """
    if FIELD_SPLITOR in text:
        return None
    return _fast_rows(
        (text,), trace_topic, partition, offset, ingest_ts, client_host, client_id, index
    )[0]


def _fast_rows(
    texts: Sequence[str],
    trace_topic: str,
    partition: int,
    offset: int,
    ingest_ts: int,
    client_host: str | None,
    client_id: str | None,
    first_index: int = 0,
) -> list[tuple[Any, ...] | None]:
    """:func:`_fast_row` of each text (none holds a record separator), the n-th with trace
    index ``first_index + n``: one loop over a message's records, no call per record or number
    (a number is a plain ASCII decimal of at most 19 digits, in range; else the general path)."""
    rows: list[tuple[Any, ...] | None] = []
    append = rows.append
    sep = _C
    version = _SCHEMA_VERSION
    for index, text in enumerate(texts, first_index):
        f = text.split(sep)
        n = len(f)
        if len(text) > MAX_FIELD_CHARS or not f[-1]:
            append(None)  # Java's split drops trailing empty fields: another field count
            continue
        kind = f[0]
        if kind == "SubAfter" and n == 9:
            v3, v6, v7 = f[3], f[6], f[7]
            if not (
                len(v3) <= 19 and v3.isdigit() and v3.isascii()
                and len(v6) <= 19 and v6.isdigit() and v6.isascii()
                and len(v7) <= 19 and v7.isdigit() and v7.isascii()
            ):  # fmt: skip
                append(None)
                continue
            cost, code, ts = int(v3), int(v6), int(v7)
            if cost > _INT_MAX or code > _INT_MAX or ts > _LONG_MAX:
                append(None)
                continue
            timestamp = ts or ingest_ts
            if timestamp > MAX_TIMESTAMP_MS:
                append(None)
                continue
            date, hour = _partition_of_hour(timestamp // _HOUR_MS)
            v1, v2, v5, v8 = f[1], f[2], f[5], f[8]
            append((
                trace_topic, partition, offset, index, "SubAfter", timestamp,
                None if v2 == "null" else v2, None, client_host, 0, ingest_ts, text,
                client_id,
                None, None if v8 == "null" else v8, None if v1 == "null" else v1, cost,
                f[4].lower() == "true", code, None, None, None if v5 == "null" else v5, None,
                0, 0, None, None, None, False, None, None, None, version, date, hour,
            ))  # fmt: skip
        elif kind == "SubBefore" and n == 8:
            v1, v6 = f[1], f[6]
            if not (
                len(v1) <= 19 and v1.isdigit() and v1.isascii()
                and len(v6) <= 19 and v6.isdigit() and v6.isascii()
            ):  # fmt: skip
                append(None)
                continue
            ts, retry = int(v1), int(v6)
            if ts > _LONG_MAX or retry > _INT_MAX:
                append(None)
                continue
            timestamp = ts or ingest_ts
            if timestamp > MAX_TIMESTAMP_MS:
                append(None)
                continue
            date, hour = _partition_of_hour(timestamp // _HOUR_MS)
            v2, v3, v4, v5, v7 = f[2], f[3], f[4], f[5], f[7]
            append((
                trace_topic, partition, offset, index, "SubBefore", timestamp,
                None if v5 == "null" else v5, None, client_host, 0, ingest_ts, text,
                client_id,
                None if v2 == "null" else v2, None if v3 == "null" else v3,
                None if v4 == "null" else v4, 0, True, 0, None, None,
                None if v7 == "null" else v7, None,
                retry, 0, None, None, None, False, None, None, None, version, date, hour,
            ))  # fmt: skip
        elif kind == "Pub" and n == 14:
            v1, v9, v10, v11 = f[1], f[9], f[10], f[11]
            if not (
                len(v1) <= 19 and v1.isdigit() and v1.isascii()
                and len(v9) <= 19 and v9.isdigit() and v9.isascii()
                and len(v10) <= 19 and v10.isdigit() and v10.isascii()
                and len(v11) <= 19 and v11.isdigit() and v11.isascii()
            ):  # fmt: skip
                append(None)
                continue
            ts, body, cost, msg_type = int(v1), int(v9), int(v10), int(v11)
            if ts > _LONG_MAX or body > _INT_MAX or cost > _INT_MAX or msg_type > _MSG_TYPE_MAX:
                append(None)
                continue
            timestamp = ts or ingest_ts
            if timestamp > MAX_TIMESTAMP_MS:
                append(None)
                continue
            date, hour = _partition_of_hour(timestamp // _HOUR_MS)
            v2, v3, v4, v5, v6, v7, v8, v12 = f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[12]
            offset_msg_id = None if v12 == "null" else v12
            store_addr, queue_id, queue_offset = _offset_coords(offset_msg_id)
            append((
                trace_topic, partition, offset, index, "Pub", timestamp,
                None if v5 == "null" else v5, None if v4 == "null" else v4, client_host, 0,
                ingest_ts, text,
                client_id,
                None if v2 == "null" else v2, None if v3 == "null" else v3, None, cost,
                f[13].lower() == "true", 0, offset_msg_id,
                None if v6 == "null" else v6, None if v7 == "null" else v7,
                None if v8 == "null" else v8,
                0, body, msg_type, None, None, False, store_addr, queue_id, queue_offset,
                version, date, hour,
            ))  # fmt: skip
        else:
            append(None)
    return rows


def _as_tuple(
    row: dict[str, Any], client_host: str | None, client_id: str | None = None
) -> tuple[Any, ...]:
    if client_host and not row["client_host"]:
        row["client_host"] = client_host
    row["client_id"] = client_id
    return tuple([row[name] for name in ROW_NAMES])


def event_from_stored(
    record: str, trace_topic: str, partition: int, offset: int, index: int, ingest_ts: int
) -> dict[str, Any]:
    """Rebuild the event row of a record that :func:`rows_from_record` accepted.

    The same code decodes it with the same inputs, so the row is the one ingest produced.

    Raises:
        ValueError: the record no longer decodes (the codec changed incompatibly).
    """
    fast = _fast_row(record, trace_topic, partition, offset, index, ingest_ts, None)
    if fast is not None:
        return dict(zip(ROW_NAMES, fast, strict=True))
    outcome = _decode_text(record, trace_topic, partition, offset, index, ingest_ts)
    if not isinstance(outcome, dict):
        raise ValueError(
            f"stored record {trace_topic}/{partition}/{offset}/{index} no longer decodes: "
            f"{outcome or 'empty record'}"
        )
    return outcome


def decode_message(
    trace_topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    ingest_ts: int,
    client_host: str | None = None,
    client_id: str | None = None,
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """:func:`rows_from_record` with each event row as a tuple in :data:`ROW_NAMES` order.

    ``client_host`` (the trace message's born host) fills the column of every event whose
    record names no client host; ``client_id`` (its ``CLIENT_ID`` header: tracemq clients
    send one) fills ``client_id``. Never raises.
    """
    events: list[tuple[Any, ...]] = []
    quarantine: list[dict[str, Any]] = []
    pieces = value.split(_RECORD_END) if value else []
    if pieces and not pieces[-1]:
        pieces.pop()  # the text after the last separator is not a record
    fast: Sequence[tuple[Any, ...] | None] = ()
    if pieces:
        try:
            # Valid UTF-8 throughout (the common case): decoded once, and the common records
            # in one loop. A separator byte never occurs inside a UTF-8 sequence, so the
            # texts are the pieces decoded one by one.
            texts = value.decode("utf-8").split(FIELD_SPLITOR)  # type: ignore[union-attr]
            del texts[len(pieces) :]
            fast = _fast_rows(
                texts, trace_topic, partition, offset, ingest_ts, client_host, client_id
            )
        except Exception:  # noqa: BLE001 - invalid UTF-8 somewhere: record by record below
            fast = ()
    for index, piece in enumerate(pieces):
        try:
            if fast:
                row = fast[index]
            else:
                try:
                    text = piece.decode("utf-8")
                except UnicodeDecodeError:
                    row = None
                else:
                    row = _fast_row(
                        text, trace_topic, partition, offset, index, ingest_ts, client_host,
                        client_id,
                    )  # fmt: skip
            if row is not None:
                events.append(row)
                continue
            slow: list[dict[str, Any]] = []
            _decode_piece(piece, trace_topic, partition, offset, index, ingest_ts, slow, quarantine)
            events.extend(_as_tuple(row, client_host, client_id) for row in slow)
        except Exception as exc:  # noqa: BLE001 - one record must never stop ingest
            quarantine.append(
                _quarantine(
                    trace_topic,
                    partition,
                    offset,
                    index,
                    f"undecodable record: {type(exc).__name__}: {exc}",
                    piece,
                    ingest_ts,
                )
            )
    if not events and not quarantine:
        quarantine.append(
            _quarantine(trace_topic, partition, offset, 0, EMPTY_MESSAGE, value or b"", ingest_ts)
        )
    return events, quarantine


def decode_message_into(
    columns: list[list[Any]],
    trace_topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    ingest_ts: int,
    client_host: str | None = None,
    client_id: str | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """:func:`decode_message` with its event rows appended to ``columns`` (one list per
    :data:`ROW_NAMES` column, in that order) instead of returned as tuples: ``(events
    appended, quarantine rows)``. The columns are the same as transposing the rows
    :func:`decode_message` returns, with or without the compiled step. Never raises on bad
    input."""
    fast_into = _FAST_INTO
    pieces = value.split(_RECORD_END) if value and fast_into is not None else []
    if pieces and not pieces[-1]:
        pieces.pop()  # the text after the last separator is not a record
    texts: list[str] = []
    if pieces:
        try:
            texts = value.decode("utf-8").split(FIELD_SPLITOR)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - invalid UTF-8 somewhere: record by record
            texts = []
    if not texts:
        # no compiled step, nothing to decode, or invalid UTF-8 somewhere: decode_message's
        # rows, record by record, transposed onto the columns
        rows, quarantine = decode_message(
            trace_topic, partition, offset, value, ingest_ts, client_host, client_id
        )
        if rows:
            for column, values in zip(columns, zip(*rows, strict=True), strict=True):
                column.extend(values)
        return len(rows), quarantine
    del texts[len(pieces) :]
    assert fast_into is not None
    quarantine = []
    events = 0
    n = len(pieces)
    i = 0
    while i < n:
        # the common records straight into the columns, up to one the fast path leaves
        j = fast_into(
            texts, i, columns, trace_topic, partition, offset, ingest_ts, client_host, client_id
        )
        events += j - i
        if j >= n:
            break
        try:  # that record as decode_message takes it: the general path
            slow: list[dict[str, Any]] = []
            _decode_piece(pieces[j], trace_topic, partition, offset, j, ingest_ts, slow, quarantine)
            rows = [_as_tuple(row, client_host, client_id) for row in slow]
        except Exception as exc:  # noqa: BLE001 - one record must never stop ingest
            quarantine.append(
                _quarantine(
                    trace_topic,
                    partition,
                    offset,
                    j,
                    f"undecodable record: {type(exc).__name__}: {exc}",
                    pieces[j],
                    ingest_ts,
                )
            )
        else:
            for row in rows:
                for column, v in zip(columns, row, strict=True):
                    column.append(v)
            events += len(rows)
        i = j + 1
    if not events and not quarantine:
        quarantine.append(
            _quarantine(trace_topic, partition, offset, 0, EMPTY_MESSAGE, value or b"", ingest_ts)
        )
    return events, quarantine


def rows_from_record(
    trace_topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    ingest_ts: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Decode one trace message into event rows and quarantine rows.

    Args:
        trace_topic: the trace topic the message was read from.
        partition: its Kafka partition.
        offset: its Kafka offset.
        value: the message body; ``None`` (a tombstone) and ``b""`` are quarantined whole.
        ingest_ts: when the collector read it, epoch ms; stands in for a missing timestamp.

    Returns:
        ``(events, quarantine)``, each in record order. A message with no record at all gives
        one quarantine row with index 0 and reason :data:`EMPTY_MESSAGE`. Never raises.
    """
    events, quarantine = decode_message(trace_topic, partition, offset, value, ingest_ts)
    return [dict(zip(ROW_NAMES, row, strict=True)) for row in events], quarantine


def split_keys(keys: str) -> list[str]:
    """The business keys of a ``keys`` field, as the trace store indexes them.

    The trace codec's key rule: spaces separate, ``null`` is no key. Sorted, so that the cap of
    :data:`MAX_KEYS_PER_MESSAGE` always keeps the same keys.
    """
    parts = keys.split(" ")
    if "" in parts or "null" in parts:
        return sorted({k for k in parts if k and k != "null"})
    return sorted(set(parts))


# ----------------------------------------------------------------------- batches for ingest

_I_TYPE, _I_MSG_ID, _I_KEYS = COL["trace_type"], COL["msg_id"], COL["keys"]
_I_TOPIC, _I_TIMESTAMP = COL["topic"], COL["timestamp"]
_I_DATE, _I_HOUR = COL["date"], COL["hour"]
#: The lake columns of what a Pub's offsetMsgId names (its place: store host, queue, Kafka
#: offset), which a :class:`StoreRows` from :func:`decode_chunk` carries for the store.
PLACE_COLUMNS = ("store_addr", "queue_id", "queue_offset")
_I_PLACES = [COL[name] for name in PLACE_COLUMNS]
_LAKE_POSITIONS = [COL[name] for name in lake.COLUMN_NAMES]
#: A key row's id is ``event id << KEY_SHIFT | n`` (n < :data:`MAX_KEYS_PER_MESSAGE`).
KEY_SHIFT = 8


@dataclass
class PartitionChunk:
    """The events of one trace partition in a :class:`DecodedChunk`.

    ``lake`` holds them as Arrow record batches of :func:`tracemq.lake.arrow_schema`, one per
    UTC ``(date, hour)``, each in trace offset and index order: what the lake files of the
    offsets ``[first_offset, end_offset)`` hold.
    """

    first_offset: int
    end_offset: int
    events: int
    lake: dict[tuple[str, int], Any] = dataclasses.field(default_factory=dict)


class StoreRows:
    """A batch in the shape the trace store writes it (see ``TraceStore.write_rows``).

    * ``events``: ``(position, *STORE_ROW)``; the event gets id ``first id + position``,
      positions being ``0..len(events)-1`` in order;
    * ``columns``: the same events column by column, one tuple per :data:`STORE_ROW` column
      (no position column: it is the index);
    * ``key_rows``: ``(position << KEY_SHIFT | n, key, msg_id, topic, timestamp)`` for the n-th
      key of each Pub that indexes its keys (the first Pub of a msgId in the batch with keys);
    * ``key_msg_ids``: the msgIds of those Pubs (an earlier batch may have indexed them);
    * ``ordered``: no two events share coordinates;
    * ``message_keys``: ``(trace_topic, partition, offset, idempotency key)`` of the trace
      messages that carry one (header ``IDEMPOTENCY_KEY``): the store drops a message whose
      key it already holds at other coordinates, a repeat of a retried send;
    * ``places``: None, or the events' :data:`PLACE_COLUMNS` (``store_addr, queue_id,
      queue_offset``: what each offsetMsgId names, as the lake has them) so that the store
      hashes a Pub's place without parsing its record again. Only :func:`decode_chunk` sets
      them (it decoded the records itself); without them the store reads the records.

    Ingest builds a batch from columns (:meth:`from_columns`) and hands it to the ingest worker
    process as columns: pickling a few long tuples costs less on both sides than a tuple per
    event, and a column holding one value throughout (the trace topic, the partition, the
    ingest time, the born host) travels as that value and a count. The per-event tuples are
    built only where they are read (``events``, in the worker), in one pass in C.
    """

    __slots__ = (
        "_columns",
        "_events",
        "key_msg_ids",
        "key_rows",
        "message_keys",
        "ordered",
        "places",
        "progress",
        "quarantine",
    )

    def __init__(
        self,
        events: list[tuple[Any, ...]],
        key_rows: list[tuple[Any, ...]],
        key_msg_ids: list[str],
        quarantine: list[dict[str, Any]],
        progress: dict[tuple[str, int], int],
        ordered: bool,
        message_keys: list[tuple[str, int, int, str]] | None = None,
    ) -> None:
        self._events: list[tuple[Any, ...]] | None = events
        self._columns: list[tuple[Any, ...]] | None = None
        self.key_rows = key_rows
        self.key_msg_ids = key_msg_ids
        self.quarantine = quarantine
        self.progress = progress
        self.ordered = ordered
        self.message_keys: list[tuple[str, int, int, str]] = message_keys or []
        self.places: list[tuple[Any, ...]] | None = None

    @classmethod
    def from_columns(
        cls,
        columns: Sequence[tuple[Any, ...]],
        key_rows: list[tuple[Any, ...]],
        key_msg_ids: list[str],
        quarantine: list[dict[str, Any]],
        progress: dict[tuple[str, int], int],
        ordered: bool,
        message_keys: list[tuple[str, int, int, str]] | None = None,
        places: Sequence[tuple[Any, ...]] | None = None,
    ) -> StoreRows:
        """A batch from its :data:`STORE_ROW` columns (all of one length), and optionally its
        :data:`PLACE_COLUMNS` (see :class:`StoreRows`).

        Raises:
            ValueError: not one column per :data:`STORE_ROW` name (or :data:`PLACE_COLUMNS`
                name), or columns of different lengths.
        """
        if len(columns) != len(STORE_ROW):
            raise ValueError(f"{len(columns)} columns, not {len(STORE_ROW)}")
        if places is not None and len(places) != len(PLACE_COLUMNS):
            raise ValueError(f"{len(places)} place columns, not {len(PLACE_COLUMNS)}")
        if any(len(c) != len(columns[0]) for c in (*columns, *(places or ()))):
            raise ValueError("columns of different lengths")
        rows = cls([], key_rows, key_msg_ids, quarantine, progress, ordered, message_keys)
        rows._events = None
        rows._columns = [tuple(c) for c in columns]
        rows.places = None if places is None else [tuple(c) for c in places]
        return rows

    @property
    def events(self) -> list[tuple[Any, ...]]:
        if self._events is None:
            assert self._columns is not None
            self._events = list(zip(range(len(self._columns[0])), *self._columns, strict=True))
        return self._events

    @property
    def columns(self) -> list[tuple[Any, ...]]:
        if self._columns is None:
            assert self._events is not None
            self._columns = _transpose(self._events, len(STORE_ROW) + 1)[1:]
        return self._columns

    def __len__(self) -> int:
        """The number of events."""
        if self._columns is not None:
            return len(self._columns[0])
        assert self._events is not None
        return len(self._events)

    def __getstate__(self) -> tuple[Any, ...]:
        return (
            [_packed(c) for c in self.columns],
            self.key_rows,
            self.key_msg_ids,
            self.quarantine,
            self.progress,
            self.ordered,
            self.message_keys,
            None if self.places is None else [_packed(c) for c in self.places],
        )

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        packed, *rest, places = state
        columns = [_unpacked(c) for c in packed]
        place_columns = None if places is None else [_unpacked(c) for c in places]
        if (
            len(columns) != len(STORE_ROW)
            or (place_columns is not None and len(place_columns) != len(PLACE_COLUMNS))
            or any(len(c) != len(columns[0]) for c in (*columns, *(place_columns or ())))
        ):
            raise ValueError("a pickled StoreRows of the wrong shape")
        self._columns, self._events, self.places = columns, None, place_columns
        (
            self.key_rows,
            self.key_msg_ids,
            self.quarantine,
            self.progress,
            self.ordered,
            self.message_keys,
        ) = rest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoreRows):
            return NotImplemented
        return (
            self.columns == other.columns
            and self.key_rows == other.key_rows
            and self.key_msg_ids == other.key_msg_ids
            and self.quarantine == other.quarantine
            and self.progress == other.progress
            and self.ordered == other.ordered
            and self.message_keys == other.message_keys
            and self.places == other.places
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"StoreRows({len(self)} events, {len(self.key_rows)} key rows, "
            f"{len(self.quarantine)} quarantined, progress={self.progress!r})"
        )


class _Repeat(tuple[Any, int]):
    """A column holding one value throughout, as pickled: ``(value, length)``."""

    __slots__ = ()


def _packed(column: tuple[Any, ...]) -> tuple[Any, ...] | _Repeat:
    # count() compares by identity first: a column of one object is counted at C speed.
    if len(column) > 1 and column[0] == column[-1] and column.count(column[0]) == len(column):
        return _Repeat((column[0], len(column)))
    return column


def _unpacked(column: tuple[Any, ...] | _Repeat) -> tuple[Any, ...]:
    if isinstance(column, _Repeat):
        value, n = column
        return (value,) * n
    return tuple(column)


def _transpose(rows: Sequence[tuple[Any, ...]], width: int) -> list[tuple[Any, ...]]:
    """Rows → columns, in one pass in C (``width`` columns when there is no row)."""
    if not rows:
        return [()] * width
    return list(zip(*rows, strict=True))


@dataclass
class DecodedChunk:
    """Trace messages decoded for the store and the lake in one go (ingest's unit of work)."""

    store: StoreRows
    partitions: dict[tuple[str, int], PartitionChunk]
    records: int

    @property
    def events(self) -> int:
        return len(self.store)


def key_rows_of(
    position: int, msg_id: str, topic: str | None, timestamp: int, keys: str
) -> list[tuple[Any, ...]]:
    """The key rows of a Pub event at ``position`` of a batch (see :class:`StoreRows`)."""
    base = position << KEY_SHIFT
    found = split_keys(keys)
    if len(found) > MAX_KEYS_PER_MESSAGE:
        del found[MAX_KEYS_PER_MESSAGE:]
    return [(base + n, key, msg_id, topic, timestamp) for n, key in enumerate(found)]


def _add_key_rows(
    columns: Sequence[tuple[Any, ...]],
    first: int,
    seen: set[str],
    key_rows: list[tuple[Any, ...]],
    key_msg_ids: list[str],
) -> None:
    """The key rows of events in :data:`ROW_NAMES` columns, at positions from ``first``."""
    types, keys, msg_ids = columns[_I_TYPE], columns[_I_KEYS], columns[_I_MSG_ID]
    topics, stamps = columns[_I_TOPIC], columns[_I_TIMESTAMP]
    # Only the Pubs are looked at in Python: compress() and map() walk the column in C.
    for i in compress(range(len(types)), map(_eq, types, repeat("Pub"))):
        if not keys[i]:
            continue
        msg_id = msg_ids[i]
        if msg_id is not None and msg_id not in seen:
            # A send retried under the same msgId is one message for key look-ups.
            seen.add(msg_id)
            rows = key_rows_of(first + i, msg_id, topics[i], stamps[i], keys[i])
            if rows:
                key_msg_ids.append(msg_id)
                key_rows.extend(rows)


def store_rows(
    rows: list[tuple[Any, ...]],
    quarantine: list[dict[str, Any]],
    progress: dict[tuple[str, int], int],
    ordered: bool,
) -> StoreRows:
    """Event tuples (:data:`ROW_NAMES` order) → the :class:`StoreRows` of a batch."""
    columns = _transpose(rows, len(ROW_NAMES))
    key_rows: list[tuple[Any, ...]] = []
    key_msg_ids: list[str] = []
    _add_key_rows(columns, 0, set(), key_rows, key_msg_ids)
    return StoreRows.from_columns(
        columns[: len(STORE_ROW)], key_rows, key_msg_ids, quarantine, progress, ordered
    )


def lake_batch(rows: list[tuple[Any, ...]]) -> Any:
    """Event tuples (:data:`ROW_NAMES` order) → an Arrow record batch of the lake schema."""
    return _lake_batch_of_columns(_transpose(rows, len(ROW_NAMES)))


def _lake_array(column: tuple[Any, ...], type_: Any) -> Any:
    import pyarrow as pa

    n = len(column)
    # A column of one value (the trace topic and partition, the ingest time, a column no
    # event fills): no conversion per value.
    if n > 1 and column[0] == column[-1] and column.count(column[0]) == n:
        value = column[0]
        return pa.nulls(n, type_) if value is None else pa.repeat(pa.scalar(value, type_), n)
    kind = _ARROW_KINDS.get(str(type_))
    if kind is not None and _ARROW_BUFFERS is not None:
        built = _ARROW_BUFFERS(column, kind, pa.allocate_buffer)
        if built is not None:  # else a value the compiled step leaves to pyarrow
            nulls, validity, offsets, data = built
            buffers = [validity, data] if offsets is None else [validity, offsets, data]
            return pa.Array.from_buffers(type_, n, buffers, null_count=nulls)
    return pa.array(column, type=type_)


def _lake_batch_of_columns(columns: Sequence[tuple[Any, ...]]) -> Any:
    """Events as :data:`ROW_NAMES` columns → an Arrow record batch of the lake schema."""
    import pyarrow as pa

    schema = lake.arrow_schema()
    return pa.RecordBatch.from_arrays(
        [
            _lake_array(columns[position], schema.field(i).type)
            for i, position in enumerate(_LAKE_POSITIONS)
        ],
        schema=schema,
    )


def _lake_batches(columns: Sequence[tuple[Any, ...]]) -> dict[tuple[str, int], Any]:
    """Events of one partition as :data:`ROW_NAMES` columns → their lake record batches, one
    per UTC ``(date, hour)`` in order of first appearance, each in the events' order."""
    import pyarrow as pa

    dates, hours = columns[_I_DATE], columns[_I_HOUR]
    n = len(dates)
    batch = _lake_batch_of_columns(columns)
    if dates.count(dates[0]) == n and hours.count(hours[0]) == n:
        return {(dates[0], hours[0]): batch}  # the common case: one hour
    groups: dict[tuple[str, int], list[int]] = {}
    for i, hour_key in enumerate(zip(dates, hours, strict=True)):
        group = groups.get(hour_key)
        if group is None:
            groups[hour_key] = [i]
        else:
            group.append(i)
    return {k: batch.take(pa.array(rows, pa.int64())) for k, rows in groups.items()}


def _merged(parts: list[list[tuple[Any, ...]]], width: int) -> list[tuple[Any, ...]]:
    """The columns of several partitions' events, one after the other."""
    if len(parts) == 1:
        return parts[0]
    if parts:
        return [tuple(chain.from_iterable(c)) for c in zip(*parts, strict=True)]
    return [()] * width


#: A trace message as ingest hands it over: ``(offset, value, born_host)``, optionally followed
#: by its idempotency key and its client id.
Received = (
    tuple[int, bytes | None, str | None]
    | tuple[int, bytes | None, str | None, str | None]
    | tuple[int, bytes | None, str | None, str | None, str | None]
)


def decode_chunk(
    messages: Sequence[tuple[str, int, Sequence[Received]]],
    ingest_ts: int,
    *,
    with_lake: bool = True,
) -> DecodedChunk:
    """Decode trace messages for ``TraceStore.write_rows`` and the lake.

    Args:
        messages: ``(trace_topic, partition, [(offset, value, born_host[, key[,
            client_id]]), ...])``, offsets increasing within a partition. ``born_host`` fills
            ``client_host`` where the record has none; ``key``, the message's idempotency key,
            goes to :attr:`StoreRows.message_keys`; ``client_id`` fills ``client_id``.
        ingest_ts: when the collector read them, epoch ms.
        with_lake: also build the lake's Arrow batches (:attr:`PartitionChunk.lake`).

    Each partition's event tuples are turned into columns once; the store's batch and the
    lake's batches are both built from those columns. Pure: runs in a worker process as well
    as in the caller's. Never raises on bad input.
    """
    store_columns: list[list[tuple[Any, ...]]] = []
    place_columns: list[list[tuple[Any, ...]]] = []
    quarantine: list[dict[str, Any]] = []
    progress: dict[tuple[str, int], int] = {}
    partitions: dict[tuple[str, int], PartitionChunk] = {}
    message_keys: list[tuple[str, int, int, str]] = []
    key_rows: list[tuple[Any, ...]] = []
    key_msg_ids: list[str] = []
    seen: set[str] = set()
    ordered = True
    records = 0
    events = 0
    n_store = len(STORE_ROW)
    width = len(ROW_NAMES)
    for trace_topic, partition, recs in messages:
        if not recs:
            continue
        mine: list[list[Any]] = [[] for _ in range(width)]  # the partition's columns
        n_mine = 0
        last = -1
        for rec in recs:
            offset, value, born = rec[0], rec[1], rec[2]
            if len(rec) > 3 and rec[3]:
                message_keys.append((trace_topic, partition, offset, rec[3]))  # type: ignore[misc]
            if offset <= last:
                ordered = False
            last = offset
            client_id = rec[4] if len(rec) > 4 else None  # type: ignore[misc]
            n, q = decode_message_into(
                mine, trace_topic, partition, offset, value, ingest_ts, born, client_id
            )
            n_mine += n
            quarantine.extend(q)
        records += len(recs)
        key = (trace_topic, partition)
        if key in partitions:
            ordered = False  # the same partition twice in one chunk
        progress[key] = max(progress.get(key, 0), last + 1)
        part = PartitionChunk(recs[0][0], last + 1, n_mine)
        if n_mine:
            columns = [tuple(c) for c in mine]
            del mine  # the columns' tuples hold the values now
            _ADD_KEY_ROWS(columns, events, seen, key_rows, key_msg_ids)
            store_columns.append(columns[:n_store])
            place_columns.append([columns[i] for i in _I_PLACES])
            if with_lake:
                part.lake = _lake_batches(columns)
        events += part.events
        partitions[key] = part
    store = StoreRows.from_columns(
        _merged(store_columns, n_store),
        key_rows,
        key_msg_ids,
        quarantine,
        progress,
        ordered,
        message_keys,
        _merged(place_columns, len(PLACE_COLUMNS)),
    )
    return DecodedChunk(store, partitions, records)


def _compiled(name: str) -> Any:
    """The compiled twin ``name`` of ``_fastdecode.pyx`` (built at install when a C compiler
    is there), or None: not built, not loadable, or ``TRACEMQ_NO_EXTENSIONS`` set (to anything
    but 0), as the client library's compiled trace steps."""
    if os.environ.get("TRACEMQ_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        from tracemq_collector import _fastdecode
    except ImportError:
        return None
    return getattr(_fastdecode, name)


#: :func:`decode_message_into`'s compiled step (None: the pure-Python path).
_FAST_INTO: Any = _compiled("fast_into")
#: :func:`decode_chunk`'s key rows: the compiled twin of :func:`_add_key_rows`, or that.
_ADD_KEY_ROWS: Any = _compiled("add_key_rows") or _add_key_rows
#: :func:`_lake_array`'s compiled Arrow buffers (None: ``pyarrow.array`` for every column), and
#: the kinds it takes by Arrow type name.
_ARROW_BUFFERS: Any = _compiled("arrow_buffers")
_ARROW_KINDS = {"string": 0, "int64": 1, "int32": 2, "bool": 3}
