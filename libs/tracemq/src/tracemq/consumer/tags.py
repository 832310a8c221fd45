"""RocketMQ tag expressions: ``*`` (everything) or ``TagA || TagB`` — how a consumer filters
by tag, and how the collector tells which groups a message was meant for."""

from __future__ import annotations

from tracemq.message import InvalidMessageError


def parse(expression: object) -> frozenset[str] | None:
    """``None`` means "every tag"; otherwise the set of accepted tags."""
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise InvalidMessageError(f"a subscription expression must be a str, got {expression!r}")
    expr = expression.strip()
    if expr in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expr.split("||"))
    if "" in tags:
        raise InvalidMessageError(f"empty tag in subscription expression {expression!r}")
    return tags


def matches(tags: frozenset[str] | None, tag: str | None) -> bool:
    return tags is None or (tag is not None and tag in tags)
