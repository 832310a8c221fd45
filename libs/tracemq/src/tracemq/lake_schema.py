"""The trace lake's row schema — the one place it is defined. Versioned: the Spark job reads
``SCHEMA_VERSION`` from each file's metadata and refuses versions it does not know.

One row per trace event (one decoded record of one trace message), Hive-partitioned by the
event's UTC date and hour: ``<lake>/date=YYYY-MM-DD/hour=HH/part-<trace topic>-<partition>-
<first offset>-<end offset>.parquet``. ``trace_topic``/``trace_partition``/``trace_offset``/
``trace_index`` identify a record uniquely; ``queue_id``/``queue_offset``/``store_addr`` are
decoded from ``offset_msg_id`` (tracemq puts ``(queue_id << 48) | kafka_offset`` in it).

This module depends on pyarrow only (the Spark job imports it without any service code).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1
METADATA_KEY = b"tracemq.lake.schema_version"
#: Footer metadata key of a compacted file: JSON list of the file names (same directory) it
#: replaces. A reader skips every file named there (see ``tracemq_collector.lake``).
COMPACTED_FROM_KEY = b"tracemq.lake.compacted_from"

#: (column, arrow type, nullable, meaning)
COLUMNS: list[tuple[str, pa.DataType, bool, str]] = [
    ("trace_type", pa.string(), False, "Pub, SubBefore, SubAfter, EndTransaction or Recall"),
    ("timestamp", pa.int64(), False, "event time, epoch ms (Pub: before send; SubAfter: end)"),
    ("region_id", pa.string(), True, "regionId"),
    ("group_name", pa.string(), True, "producer or consumer group"),
    ("request_id", pa.string(), True, "pairs a SubBefore with its SubAfter"),
    ("cost_time", pa.int64(), False, "ms: send round trip (Pub) or listener time (SubAfter)"),
    ("success", pa.bool_(), False, "Pub: stored; SubAfter: CONSUME_SUCCESS"),
    ("context_code", pa.int32(), False, "ConsumeReturnType ordinal (SubAfter)"),
    ("topic", pa.string(), True, "business topic (absent on SubAfter)"),
    ("msg_id", pa.string(), True, "UNIQ_KEY"),
    ("offset_msg_id", pa.string(), True, "store host + queue + offset (Pub)"),
    ("tags", pa.string(), True, "message tag"),
    ("keys", pa.string(), True, "space-separated business keys"),
    ("store_host", pa.string(), True, "broker address"),
    ("client_host", pa.string(), True, "old-format client host"),
    ("store_time", pa.int64(), False, "store time from the ack, epoch ms (0 when unknown)"),
    ("retry_times", pa.int32(), False, "reconsume count (SubBefore)"),
    ("body_length", pa.int32(), False, "body bytes (Pub)"),
    ("msg_type", pa.int32(), True, "MessageType ordinal (Pub, EndTransaction)"),
    ("transaction_id", pa.string(), True, "EndTransaction"),
    ("transaction_state", pa.string(), True, "COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW"),
    ("from_transaction_check", pa.bool_(), False, "EndTransaction from a check-back"),
    ("trace_topic", pa.string(), False, "trace topic the record came from"),
    ("trace_partition", pa.int32(), False, "its Kafka partition"),
    ("trace_offset", pa.int64(), False, "its Kafka offset"),
    ("trace_index", pa.int32(), False, "index of the record within the trace message"),
    ("ingest_ts", pa.int64(), False, "when the collector read it, epoch ms"),
    ("store_addr", pa.string(), True, "ip:port decoded from offset_msg_id"),
    ("queue_id", pa.int32(), True, "queue decoded from offset_msg_id"),
    ("queue_offset", pa.int64(), True, "Kafka offset decoded from offset_msg_id"),
    ("schema_version", pa.int32(), False, "lake schema version"),
]

#: Hive partition columns (directory names, not stored in the files)
PARTITION_COLUMNS = ("date", "hour")

SCHEMA = pa.schema(
    [pa.field(name, typ, nullable=nullable) for name, typ, nullable, _ in COLUMNS],
    metadata={METADATA_KEY: str(SCHEMA_VERSION).encode()},
)
COLUMN_NAMES = [c[0] for c in COLUMNS]
