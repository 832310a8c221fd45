"""Stage 1 of the reconciliation job (:mod:`tracemq_spark.job`): its parameters.

:class:`Params` (everything one run needs, validated before anything is read), the job's
constants (outcome names, latency metrics, limits), :class:`RunResult` and the job's one error,
:class:`ReconcileError`. Nothing here touches Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tracemq import lake
from tracemq.errors import TracemqError

HOUR_MS = 3_600_000
DAY_MS = 86_400_000
MINUTE_MS = 60_000

OUTCOMES = [
    "CONSUMED",
    "CONSUMED_AFTER_RETRY",
    "FAILED",
    "DEAD_LETTERED",
    "IN_FLIGHT",
    "PENDING",
    "NOT_CONSUMED",
    "TRACE_LOST",
    "TRACE_INCOMPLETE",
    "DUPLICATE",
    "ORPHAN_CONSUME",
    "UNEXPECTED_GROUP",
    "PUB_FAILED",
]
#: message-level facts that are not outcomes (no group expected them)
INFORMATIONAL = ["ROLLED_BACK", "TX_UNRESOLVED", "RECALLED", "NO_EXPECTED_GROUP"]
#: latency figures: column name, meaning
METRICS = {
    "send_cost_ms": "send cost (Pub cost_time)",
    "store_to_consume_ms": "store to first consume start (first SubBefore - store time)",
    "consume_cost_ms": "consume cost (successful SubAfter cost_time)",
    "end_to_end_ms": "end to end (successful SubAfter - Pub timestamp)",
}
#: a latency outside [0, SKEW_LIMIT_MS] is a clock-skew suspect: flagged, not in percentiles
SKEW_LIMIT_MS = DAY_MS
#: lake schema versions this job reads: the one its Spark schema is built from (tracemq.lake)
KNOWN_SCHEMA_VERSIONS = frozenset({lake.SCHEMA_VERSION})
PERCENTILES = (0.5, 0.9, 0.99)

_TX_COMMIT = "COMMIT_MESSAGE"
_DLQ_PREFIX = "%DLQ%"
_RETRY_PREFIX = "%RETRY%"
_TX_ROLLBACK = "ROLLBACK_MESSAGE"
_MSG_HALF = 1
_MSG_DELAY = 3


class ReconcileError(TracemqError):
    """Root of the reconciliation job's exceptions (see :mod:`tracemq.errors`): bad input or a
    run that cannot proceed; one clear message, the output left untouched."""


# ----------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Params:
    """Everything one run needs. Times are epoch milliseconds (UTC)."""

    lake: str
    out: str
    from_ms: int
    to_ms: int
    subscriptions: str  # URI of the subscription-history JSON
    offsets: str  # URI of the committed-offsets JSON
    horizon_ms: int = 30 * MINUTE_MS
    window_ms: int = 10 * MINUTE_MS
    max_reconsume_times: int = 16
    max_delay_ms: int = 2 * HOUR_MS
    subscription_grace_ms: int = 2 * MINUTE_MS
    #: "now" for PENDING (cutoff = min(to + horizon, now)); None: the time the run starts
    now_ms: int | None = None
    #: also publish ``classified/``: one row per (message, group[, client]) incl. CONSUMED
    keep_classified: bool = False
    run_id: str | None = None
    #: for tests: raise at this checkpoint (see ``commit.checkpoint``)
    fail_at: str | None = None
    #: the producers' zone (IANA name): msgIds count from a month start in it. The lake has no
    #: zone per message, so all are read in this one. UTC by default so that a run's result
    #: does not depend on the host it runs on (Spark hosts are usually UTC; producers default
    #: to their host's zone, as RocketMQ's do, or to TRACEMQ_MSGID_TIMEZONE)
    msgid_timezone: str = "UTC"

    def validate(self) -> None:
        if self.to_ms <= self.from_ms:
            raise ReconcileError(
                f"--to ({_iso(self.to_ms)}) must be after --from ({_iso(self.from_ms)})"
            )
        if self.window_ms < MINUTE_MS or self.window_ms % MINUTE_MS:
            raise ReconcileError(
                f"--window must be a whole number of minutes (at least 1m), got {self.window_ms} ms"
            )
        if self.horizon_ms < 0:
            raise ReconcileError("--horizon must not be negative")
        if self.max_delay_ms < 0:
            raise ReconcileError("--max-delay must not be negative")
        if self.max_reconsume_times < 1:
            raise ReconcileError("--max-reconsume-times must be at least 1")
        if self.from_ms < 0:
            raise ReconcileError("--from is before 1970")
        try:
            ZoneInfo(self.msgid_timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ReconcileError(
                f"--msgid-timezone: unknown time zone {self.msgid_timezone!r} "
                "(an IANA name such as 'Asia/Shanghai' or 'UTC')"
            ) from None


@dataclass
class RunResult:
    run_id: str
    out: str
    from_ms: int
    to_ms: int
    summary: dict[str, Any]
    elapsed_s: float
    stages: dict[str, float] = field(default_factory=dict)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def _window_label(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y%m%dT%H%MZ")
