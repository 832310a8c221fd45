"""The trace lake's row schema: columns, version, footer metadata. Pure Python.

One row per trace event (one decoded record of one trace message). ``trace_topic``/
``trace_partition``/``trace_offset``/``trace_index`` identify a record uniquely;
``queue_id``/``queue_offset``/``store_addr`` are decoded from ``offset_msg_id`` (tracemq puts
``(queue_id << 48) | kafka_offset`` in it).

Versioned: every file carries :data:`SCHEMA_VERSION` in its footer metadata
(:data:`METADATA_KEY`) and every row in its ``schema_version`` column; the Spark job refuses
versions it does not know. Column types are Arrow type names (what ``str()`` of the Arrow type
prints); :func:`arrow_schema` builds the pyarrow schema on first use, so importing this module
(a client-only install has no pyarrow) never imports pyarrow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow

SCHEMA_VERSION = 1
#: Footer metadata key of every lake file: its schema version, as decimal text.
METADATA_KEY = b"tracemq.lake.schema_version"
#: Footer metadata key of a compacted file: JSON list of the file names (same directory) it
#: replaces. A reader skips every file named there (:func:`tracemq.lake.live_files`).
COMPACTED_FROM_KEY = b"tracemq.lake.compacted_from"

#: (column, Arrow type name, nullable, meaning), in file order
COLUMNS: tuple[tuple[str, str, bool, str], ...] = (
    ("trace_type", "string", False, "Pub, SubBefore, SubAfter, EndTransaction or Recall"),
    ("timestamp", "int64", False, "event time, epoch ms (Pub: before send; SubAfter: end)"),
    ("region_id", "string", True, "regionId"),
    ("group_name", "string", True, "producer or consumer group"),
    ("request_id", "string", True, "pairs a SubBefore with its SubAfter"),
    ("cost_time", "int64", False, "ms: send round trip (Pub) or listener time (SubAfter)"),
    ("success", "bool", False, "Pub: stored; SubAfter: CONSUME_SUCCESS"),
    ("context_code", "int32", False, "ConsumeReturnType ordinal (SubAfter)"),
    ("topic", "string", True, "business topic (absent on SubAfter)"),
    ("msg_id", "string", True, "UNIQ_KEY"),
    ("offset_msg_id", "string", True, "store host + queue + offset (Pub)"),
    ("tags", "string", True, "message tag"),
    ("keys", "string", True, "space-separated business keys"),
    ("store_host", "string", True, "broker address"),
    ("client_host", "string", True, "old-format client host"),
    ("store_time", "int64", False, "store time from the ack, epoch ms (0 when unknown)"),
    ("retry_times", "int32", False, "reconsume count (SubBefore)"),
    ("body_length", "int32", False, "body bytes (Pub)"),
    ("msg_type", "int32", True, "MessageType ordinal (Pub, EndTransaction)"),
    ("transaction_id", "string", True, "EndTransaction"),
    ("transaction_state", "string", True, "COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW"),
    ("from_transaction_check", "bool", False, "EndTransaction from a check-back"),
    ("trace_topic", "string", False, "trace topic the record came from"),
    ("trace_partition", "int32", False, "its Kafka partition"),
    ("trace_offset", "int64", False, "its Kafka offset"),
    ("trace_index", "int32", False, "index of the record within the trace message"),
    ("ingest_ts", "int64", False, "when the collector read it, epoch ms"),
    ("store_addr", "string", True, "ip:port decoded from offset_msg_id"),
    ("queue_id", "int32", True, "queue decoded from offset_msg_id"),
    ("queue_offset", "int64", True, "Kafka offset decoded from offset_msg_id"),
    ("schema_version", "int32", False, "lake schema version"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c[0] for c in COLUMNS)

#: Hive partition columns (directory names, not stored in the files): see
#: :mod:`tracemq.lake.layout`.
PARTITION_COLUMNS = ("date", "hour")

_VERSION_VALUE = str(SCHEMA_VERSION).encode()


def file_metadata(compacted_from: Iterable[str] | None = None) -> dict[bytes, bytes]:
    """The footer metadata of a lake file; a compacted file also names the files it replaces."""
    metadata = {METADATA_KEY: _VERSION_VALUE}
    if compacted_from is not None:
        metadata[COMPACTED_FROM_KEY] = compacted_from_value(compacted_from)
    return metadata


def is_current_version(value: bytes | str | None) -> bool:
    """Whether a file's footer version value (:data:`METADATA_KEY`) is :data:`SCHEMA_VERSION`."""
    if isinstance(value, str):
        value = value.encode()
    return value == _VERSION_VALUE


def compacted_from_value(names: Iterable[str]) -> bytes:
    """The :data:`COMPACTED_FROM_KEY` footer value naming ``names`` (sorted, so it is stable)."""
    return json.dumps(sorted(names)).encode()


def compacted_from(value: bytes | str | None) -> list[str]:
    """The file names a :data:`COMPACTED_FROM_KEY` footer value lists ([] for None).

    Raises:
        ValueError: the value is not a JSON list.
    """
    if value is None:
        return []
    names = json.loads(value)
    if not isinstance(names, list):
        raise ValueError(f"{COMPACTED_FROM_KEY.decode()} is not a JSON list: {value!r}")
    return [str(name) for name in names]


@cache
def arrow_schema() -> pyarrow.Schema:
    """:data:`COLUMNS` as a pyarrow schema, with the version in its metadata (imports pyarrow)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(name, pa.type_for_alias(typ), nullable=nullable)
            for name, typ, nullable, _ in COLUMNS
        ],
        metadata=file_metadata(),
    )
