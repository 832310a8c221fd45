"""The one time and duration parser of every command (``trace find --begin``, ``reconcile
--from``): ISO 8601 (no zone: UTC), epoch milliseconds, ``now``, or relative to now (``-1h``,
``now-90m``). Durations: ``500ms``, ``45s``, ``10m``, ``2h``, ``1d``, combined (``1h30m``)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from tracemq.cli._errors import UsageError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
TIME_HELP = "ISO 8601 (no zone: UTC), epoch ms, now, -1h, now-90m"


def parse_duration(text: str, what: str) -> int:
    """``30m`` → 1800000 (ms)."""
    s = text.strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UsageError(f"{what}: {text!r} is not a duration (like 500ms, 45s, 10m, 2h, 1d)")
    return int(total)


def parse_time(text: str, what: str, now_ms: int | None = None) -> int:
    """A time as this module's docstring says → epoch ms."""
    s = text.strip()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    rel = re.fullmatch(r"(?:now)?\s*(?:-\s*(.+))?", s.lower())
    if s and rel is not None:
        base = now_ms if now_ms is not None else int(time.time() * 1000)
        try:
            return base - (parse_duration(rel.group(1), what) if rel.group(1) else 0)
        except UsageError:
            raise UsageError(f"{what}: {text!r} is not a time ({TIME_HELP})") from None
    try:
        dt = datetime.fromisoformat(s.replace("z", "Z"))
    except ValueError:
        raise UsageError(
            f"{what}: {text!r} is neither ISO 8601 (2024-05-14T08:00:00Z) nor epoch ms, now, "
            "-1h or now-90m"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)
