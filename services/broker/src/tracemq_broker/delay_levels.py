"""Delay levels: RocketMQ's ``messageDelayLevel`` (``1s 5s 10s 30s 1m ... 2h``), configurable.

Level ``n`` (1-based) delays a message by the ``n``-th duration. Each level is one queue
(partition ``n - 1``) of the broker's ``SCHEDULE_TOPIC_XXXX``, so every queue holds messages of
one delay and is ordered by due time.
"""

from __future__ import annotations

import re

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_LEVELS = 1024

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TOKEN = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 100ms"`` → ``[1000, 5000, 100]``; raise ValueError naming the bad token.

    Tokens are separated by spaces or commas; each is a positive integer and a unit
    (``ms``, ``s``, ``m``, ``h``, ``d``). Levels need not increase (RocketMQ's do).
    """
    tokens = [t for t in re.split(r"[\s,]+", text.strip()) if t]
    if not tokens:
        raise ValueError("no delay level given")
    if len(tokens) > MAX_LEVELS:
        raise ValueError(f"{len(tokens)} delay levels; at most {MAX_LEVELS}")
    out = []
    for i, tok in enumerate(tokens, 1):
        m = _TOKEN.match(tok.lower())
        if not m or int(m.group(1)) <= 0:
            raise ValueError(
                f"delay level {i} is {tok!r}: expected a positive integer and a unit "
                "(ms, s, m, h, d), e.g. '500ms' or '1m'"
            )
        out.append(int(m.group(1)) * _UNITS_MS[m.group(2)])
    return out
