from collections.abc import Callable, Sequence
from typing import Any

def write_records(items: Sequence[object]) -> list[str | None]: ...
def plan_slices(
    batch: list[Any], texts: list[str], first_seq: int, limit: int, fallback: Callable[..., Any]
) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None: ...
