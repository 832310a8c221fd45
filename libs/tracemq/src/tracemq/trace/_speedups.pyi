from collections.abc import Callable, Iterable, Sequence
from typing import Any

def write_records(items: Sequence[object]) -> list[str | None]: ...
def plan_slices(
    batch: list[Any], texts: list[str], first_seq: int, limit: int, fallback: Callable[..., Any]
) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None: ...
def write_plan(
    batch: list[Any], first_seq: int, limit: int
) -> tuple[list[tuple[int, int, bytes, set[Any]]], int, int] | None: ...

class ConsumeRecord:
    topic: Any
    region: Any
    msg_id: Any
    keys: Any
    group: Any
    request_id: str
    reconsume_times: Any
    success: Any
    code: Any
    seq: int
    begin: int
    joined: bool
    sealed: bool
    @property
    def end(self) -> int: ...
    @property
    def cost(self) -> int: ...
    @property
    def token(self) -> tuple[int, str, int]: ...
    def as_tuple(self) -> tuple[Any, ...]: ...

def seal(items: Iterable[object]) -> None: ...
def materialize(items: Iterable[object]) -> list[Any]: ...

class DispatcherCore:
    _queue: Any
    _queue_size: int
    _accepted_seq: int
    _records: int
    _want: int
    _closing: bool

class ConsumeTracer:
    def __init__(self, dispatcher: Any, trace_topic: str) -> None: ...
    def before(self, msg: Any, group: str, region: str) -> ConsumeRecord | None: ...
    def after(
        self,
        token: ConsumeRecord | None,
        msg: Any,
        group: str,
        region: str,
        end_at: object,
        success: bool,
        code: int,
    ) -> None: ...

class PubTracer:
    def __init__(self, dispatcher: Any, trace_topic: str) -> None: ...
    def one_pub(
        self,
        msg: Any,
        msg_id: str,
        group: str,
        queue: Any,
        begin: int,
        end: int,
        msg_type: int,
        result: Any,
    ) -> None: ...
