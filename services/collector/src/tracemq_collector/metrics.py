"""Prometheus metrics of the collector."""

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("tracemq_collector_events_total", "Trace events stored (new, after dedupe)")
RECORDS = Counter("tracemq_collector_trace_messages_total", "Trace messages read from Kafka")
DUPLICATES = Counter(
    "tracemq_collector_duplicate_events_total", "Redelivered events skipped by the dedupe"
)
QUARANTINED = Counter(
    "tracemq_collector_quarantined_total", "Malformed trace records quarantined", ["reason"]
)
BATCH_SECONDS = Histogram("tracemq_collector_batch_seconds", "Decode + store time of a batch")
LAKE_FILES = Counter("tracemq_collector_lake_files_total", "Parquet files written")
LAKE_ROWS_PENDING = Gauge(
    "tracemq_collector_lake_pending_events", "Stored events not yet in the lake"
)
LAKE_STORE_READS = Counter(
    "tracemq_collector_lake_store_reads_total",
    "Lake flushes of a partition that read its stored range back instead of writing the "
    "buffered events, by reason: unbuffered (a restart, a failed flush), not_aligned, "
    "refused (a pending segment), moving (the lake's progress moved meanwhile)",
    ["reason"],
)
LAKE_BACKPRESSURE = Counter(
    "tracemq_collector_lake_backpressure_waits_total",
    "Times ingest waited for the lake flush to write a partition before fetching more"
    " (too many events held for the lake)",
)
RETENTION_DELETED = Counter(
    "tracemq_collector_retention_deleted_total", "Events deleted by retention"
)
LAST_INGEST = Gauge("tracemq_collector_last_ingest_timestamp_seconds", "Last batch stored")
PEER_FAILURES = Counter(
    "tracemq_collector_peer_failures_total",
    "Peers skipped (registration not proven) or whose answer failed or was partly dropped,"
    " per query",
    ["reason"],
)
REPEATED_MESSAGES = Counter(
    "tracemq_collector_repeated_trace_messages_total",
    "Trace messages dropped as repeats of one already stored (a retried trace send)",
    ["reason"],
)
OFFSET_RESETS = Counter(
    "tracemq_collector_offset_resets_total",
    "Trace partition offsets found outside their log and reset (collector_offset_reset)",
    ["topic", "partition"],
)
GROUP_OFFSET_FAILURES = Counter(
    "tracemq_collector_group_offset_failures_total",
    "Consumer-group offset reads (group status or its sampler) that failed; that group's lag"
    " is unknown in the answer or missing from the trend",
    ["reason"],
)
OTLP_SPANS = Counter(
    "tracemq_collector_otlp_spans_total",
    "OTLP spans received, by result: stored (as trace records), pending (a Kafka send waiting"
    " for its msgId; counted again when stored or given up), not_messaging, native (a tracemq"
    " client's own span), no_msg_id, no_group, invalid, duplicate (a resent span, skipped)",
    ["result"],
)
OTLP_REJECTED = Counter(
    "tracemq_collector_otlp_rejected_total",
    "OTLP export requests refused, by reason (malformed_protobuf, malformed_json,"
    " too_many_spans, unsupported_media_type, unavailable)",
    ["reason"],
)
OTLP_SUBSCRIPTION_FAILURES = Counter(
    "tracemq_collector_otlp_subscription_failures_total",
    "Writes of OTLP-seen consumer groups to the subscription history that failed (retried with"
    " the next request)",
)
LOOKUPS = Counter(
    "tracemq_collector_lookups_total",
    "Look-ups answered (kind: msg_id, key, messages) by where the answer came from: store (the"
    " live stores: this collector's and its peers'), lake (the live stores missed, the lake"
    " found it or added items), miss (neither), lake_error (the lake could not be read)",
    ["kind", "source"],
)
LAKE_LOOKUP_SECONDS = Histogram(
    "tracemq_collector_lake_lookup_seconds", "Time of a look-up in the lake", ["kind"]
)
LAKE_LOOKUP_FILES = Counter(
    "tracemq_collector_lake_lookup_files_total",
    "Lake files opened by look-ups (footers and row groups)",
)
LAKE_LOOKUP_BYTES = Counter(
    "tracemq_collector_lake_lookup_bytes_total",
    "Compressed bytes of lake footers and row groups read by look-ups",
)
BACKFILL_EVENTS = Counter(
    "tracemq_collector_backfill_events_total",
    "Events copied from the lake into the store by backfills (new ones; already stored ones"
    " are skipped by the store's dedupe)",
)
BACKFILL_ROWS_READ = Counter(
    "tracemq_collector_backfill_rows_read_total",
    "Lake rows read by backfills (each re-encoded and offered to the store: ~20 µs of CPU)",
)
BACKFILL_PARTITIONS = Gauge(
    "tracemq_collector_backfill_partitions",
    "Owned trace partitions by backfill state (pending, done)",
    ["state"],
)
BACKFILL_SKIPPED = Counter(
    "tracemq_collector_backfill_skipped_total",
    "Lake events a backfill did not store, by reason (not_reencodable: no trace record decodes"
    " to the row)",
    ["reason"],
)
BACKFILL_FAILURES = Counter(
    "tracemq_collector_backfill_failures_total",
    "Partition backfills that failed (lake unreadable); the partition stays pending",
)
