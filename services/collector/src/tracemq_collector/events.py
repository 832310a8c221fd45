"""Trace message → trace events: one row per decoded record, one quarantine row per bad one.

A trace message (one Kafka record of the trace topic) holds records in RocketMQ's text format
(DESIGN §3). :func:`rows_from_record` turns it into

* **event rows**: one per good record, a dict with every column of
  :data:`tracemq.lake_schema.COLUMNS` plus three keys that are not lake columns: ``date``
  (``YYYY-MM-DD``) and ``hour`` (0-23), the UTC Hive partition of the event, and ``record``, the
  record's text (without its ``\\x02``), which the trace store keeps instead of thirty columns
  and decodes again with :func:`event_from_stored`;
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

import datetime as _dt
from functools import lru_cache
from typing import Any

from tracemq import lake_schema
from tracemq.message_id import decode_offset_msg_id
from tracemq.trace import CONTENT_SPLITOR, FIELD_SPLITOR, TraceBean, TraceContext, decode_report

__all__ = [
    "EMPTY_MESSAGE",
    "MAX_FIELD_CHARS",
    "MAX_RAW_BYTES",
    "MAX_TIMESTAMP_MS",
    "EXTRA_KEYS",
    "QUARANTINE_KEYS",
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

#: Keys an event row has on top of the lake columns.
EXTRA_KEYS = ("date", "hour", "record")
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
_HOUR_MS = 3_600_000
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


@lru_cache(maxsize=4096)
def _partition_of_hour(hour_number: int) -> tuple[str, int]:
    # Events arrive clustered in a few hours, so a small cache saves a date computation per row.
    day, hour = divmod(hour_number, 24)
    return _dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat(), hour


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
        "store_addr": store_addr,
        "queue_id": queue_id,
        "queue_offset": queue_offset,
        "schema_version": lake_schema.SCHEMA_VERSION,
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


def event_from_stored(
    record: str, trace_topic: str, partition: int, offset: int, index: int, ingest_ts: int
) -> dict[str, Any]:
    """Rebuild the event row of a record that :func:`rows_from_record` accepted.

    The same code decodes it with the same inputs, so the row is the one ingest produced.

    Raises:
        ValueError: the record no longer decodes (the codec changed incompatibly).
    """
    outcome = _decode_text(record, trace_topic, partition, offset, index, ingest_ts)
    if not isinstance(outcome, dict):
        raise ValueError(
            f"stored record {trace_topic}/{partition}/{offset}/{index} no longer decodes: "
            f"{outcome or 'empty record'}"
        )
    return outcome


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
    events: list[dict[str, Any]] = []
    quarantine: list[dict[str, Any]] = []
    pieces = value.split(_RECORD_END) if value else []
    if pieces and not pieces[-1]:
        pieces.pop()  # the text after the last separator is not a record
    for index, piece in enumerate(pieces):
        try:
            _decode_piece(
                piece, trace_topic, partition, offset, index, ingest_ts, events, quarantine
            )
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
