"""Prometheus metrics of the broker."""

from prometheus_client import Counter, Gauge

ADMIN_REQUESTS = Counter(
    "tracemq_broker_admin_requests_total", "Admin requests handled", ["op", "result"]
)
ADMIN_SKIPPED = Counter(
    "tracemq_broker_admin_skipped_total",
    "Admin topic records that could not be decoded",
    ["reason"],
)
REGISTRATIONS = Counter(
    "tracemq_broker_registrations_total",
    "Registrations/heartbeats sent to the nameserver",
    ["result"],
)
TOPICS = Gauge("tracemq_broker_topics", "Topics in the broker's topic table")
