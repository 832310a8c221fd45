"""Prometheus metrics of the broker.

Records read from a topic and not acted on are counted as ``tracemq_broker_<input>_rejected_total``
with a ``reason`` label (as ``tracemq_namesrv_control_rejected_total`` in the nameserver), and
logged with their topic, partition and offset.
"""

from prometheus_client import Counter, Gauge, Histogram

ADMIN_REQUESTS = Counter(
    "tracemq_broker_admin_requests_total", "Admin requests handled", ["op", "result"]
)
ADMIN_REJECTED = Counter(
    "tracemq_broker_admin_rejected_total",
    "Admin topic records not acted on: garbage, version, type, schema, reply_topic (a reply "
    "topic other than tracemq.admin.reply), unsigned, forged, expired, wrong_role, replayed, "
    "apply_failed",
    ["reason"],
)
ADMIN_REPLIES = Counter(
    "tracemq_broker_admin_replies_total",
    "Admin replies: sent, failed (the control cluster refused it), timeout (not acknowledged "
    "within the reply timeout), dropped (too many replies already in flight)",
    ["result"],
)
REGISTRATIONS = Counter(
    "tracemq_broker_registrations_total",
    "Registrations/heartbeats sent to the nameserver",
    ["result"],
)
TOPICS = Gauge("tracemq_broker_topics", "Topics in the broker's topic table")

SCHEDULE_DELIVERED = Counter(
    "tracemq_broker_schedule_delivered_total",
    "Delayed messages and retries forwarded to their real topic",
    ["level"],
)
SCHEDULE_REJECTED = Counter(
    "tracemq_broker_schedule_rejected_total",
    "Schedule records not delivered: garbage, or a real topic this broker does not host",
    ["reason"],
)
SCHEDULE_RECOVERED = Counter(
    "tracemq_broker_schedule_recovered_total",
    "Forwards found already delivered after a restart (not delivered again)",
)
SCHEDULE_BUFFERED = Gauge(
    "tracemq_broker_schedule_buffered",
    "Schedule records fetched and waiting for their due time",
    ["level"],
)
SCHEDULE_LATENESS = Histogram(
    "tracemq_broker_schedule_lateness_seconds",
    "How long after its due time a delayed message was acknowledged by its real queue",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
)
TX_HALVES = Gauge("tracemq_broker_transaction_pending", "Half messages without a final result")
TX_RESULTS = Counter(
    "tracemq_broker_transaction_results_total",
    "Half messages resolved: commit (delivered), rollback, check_rollback (checks exhausted)",
    ["result"],
)
TX_CHECKS = Counter(
    "tracemq_broker_transaction_checks_total", "Check-back requests sent to producers"
)
TX_REJECTED = Counter(
    "tracemq_broker_transaction_rejected_total",
    "Half or op records ignored: garbage, mismatch, duplicate, unknown_half, no_topic",
    ["reason"],
)
TX_RECOVERED = Counter(
    "tracemq_broker_transaction_recovered_total",
    "Commit forwards found already delivered after a restart (not delivered again)",
)
SCHEDULE_RECALLS = Counter(
    "tracemq_broker_schedule_recalls_total",
    "Recall requests decided: recalled (applied), already_recalled (a repeat), too_late (already "
    "delivered or being delivered), unknown (no such message at the handle's offset), invalid "
    "(a handle of another broker, topic or level, or undecodable)",
    ["result"],
)
SCHEDULE_RECALL_SKIPPED = Counter(
    "tracemq_broker_schedule_recall_skipped_total",
    "Recalled delayed messages skipped when they came due (not delivered)",
)
