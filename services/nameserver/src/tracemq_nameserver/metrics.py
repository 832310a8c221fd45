"""Prometheus metrics of the nameserver."""

from prometheus_client import Counter, Gauge

CONTROL_RECORDS = Counter(
    "tracemq_namesrv_control_records_total", "Control records applied", ["type"]
)
CONTROL_REJECTED = Counter(
    "tracemq_namesrv_control_rejected_total",
    "Control records not applied and committed past: garbage, version, type, schema, unsigned, "
    "forged, expired, wrong_role, replayed, stale, future, redis_refused, apply_failed",
    ["reason"],
)
EXPIRED = Counter("tracemq_namesrv_expired_total", "Brokers and clients expired", ["kind"])
ROUTE_CHANGES = Counter("tracemq_namesrv_route_changes_total", "Route change notifications sent")
REDIS_ERRORS = Counter("tracemq_namesrv_redis_errors_total", "Redis operations that failed")
LIVE_BROKERS = Gauge("tracemq_namesrv_live_brokers", "Brokers currently registered")
OFFSET_RESETS = Counter(
    "tracemq_namesrv_offset_resets_total",
    "Control topic offsets found outside their log and reset to its beginning",
    ["topic", "partition"],
)
