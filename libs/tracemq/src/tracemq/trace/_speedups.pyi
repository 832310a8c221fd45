from collections.abc import Callable, Sequence
from typing import Any

def write_records(items: Sequence[object]) -> list[str | None]: ...
def plan_slices(
    batch: list[Any], texts: list[str], first_seq: int, limit: int, fallback: Callable[..., Any]
) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None: ...
def write_plan(
    batch: list[Any], first_seq: int, limit: int
) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None: ...

class ConsumeTracer:
    def __init__(
        self, dispatcher: Any, trace_topic: str, fallback_after: Callable[..., None]
    ) -> None: ...
    def before(self, msg: Any, group: str, region: str) -> tuple[int, str, int] | None: ...
    def after(
        self,
        token: tuple[int, str, int] | None,
        msg: Any,
        group: str,
        region: str,
        end_at: object,
        success: bool,
        code: int,
    ) -> None: ...
