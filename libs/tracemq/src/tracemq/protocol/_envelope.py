"""msgpack envelope shared by the control and admin protocols: ``{"v": 1, "type": ..., ...}``."""

from __future__ import annotations

from typing import Any, Literal

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError

SCHEMA_VERSION: Literal[1] = 1


class ProtocolError(ValueError):
    """A record on a tracemq topic could not be understood (garbage, wrong schema, bad field)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        #: short label for metrics: ``garbage``, ``version``, ``type``, ``schema``
        self.kind = kind


def pack(model: BaseModel) -> bytes:
    """msgpack-encode a model (with its ``v`` and ``type`` fields)."""
    return msgpack.packb(model.model_dump(mode="json"), use_bin_type=True)


def unpack_dict(data: bytes | None) -> dict[str, Any]:
    """Decode msgpack bytes into a dict carrying a supported schema version."""
    if not data:
        raise ProtocolError("empty record", "garbage")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"not msgpack: {exc.__class__.__name__}: {exc}", "garbage") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"expected a map, got {type(obj).__name__}", "schema")
    version = obj.get("v")
    if version != SCHEMA_VERSION:
        raise ProtocolError(f"unsupported schema version {version!r}", "version")
    return obj


def validate(adapter: TypeAdapter[Any], obj: dict[str, Any]) -> Any:
    """Validate ``obj`` with ``adapter``, turning pydantic's error into a ProtocolError."""
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(
            f"invalid {obj.get('type')!r} record: {loc}: {first['msg']} (got {first.get('input')!r})",
            "schema",
        ) from None
