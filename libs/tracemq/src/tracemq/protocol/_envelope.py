"""msgpack envelope shared by the control, admin and transaction protocols:
``{"v": 1, "type": ..., ...}``.

Every ``decode*`` function of :mod:`tracemq.protocol` is fed bytes that anyone with access to
the topic can write, so each raises only :class:`ProtocolError` whatever the input (property
tested in ``tests/unit/test_decoder_fuzz.py``). Its ``kind`` is the ``reason`` label of the
consuming service's ``..._rejected_total`` counter.
"""

from __future__ import annotations

from typing import Any, Literal

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError

from tracemq.errors import ProtocolError

SCHEMA_VERSION: Literal[1] = 1

#: How much of an offending value an error message quotes: a hostile record can be a megabyte.
SHOW_MAX = 80


def show(value: object, limit: int = SHOW_MAX) -> str:
    """A short, always-computable ``repr`` of ``value`` for an error message.

    ``repr`` itself can raise (an int of more than 4300 digits) or be huge, so neither reaches
    a log line unbounded."""
    try:
        text = repr(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def pack(model: BaseModel) -> bytes:
    """msgpack-encode a model (with its ``v`` and ``type`` fields)."""
    return msgpack.packb(model.model_dump(mode="json"), use_bin_type=True)  # type: ignore[no-any-return]


def unpack_dict(data: bytes | None) -> dict[str, Any]:
    """Decode msgpack bytes into a dict carrying a supported schema version."""
    if not data:
        raise ProtocolError("empty record", "garbage")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"expected bytes, got {type(data).__name__}", "garbage")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(
            f"not msgpack: {exc.__class__.__name__}: {show(str(exc))}", "garbage"
        ) from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"expected a map, got {type(obj).__name__}", "schema")
    version = obj.get("v")
    # ``True == 1`` and ``1.0 == 1`` in Python: only the integer 1 is version 1
    if type(version) is not int or version != SCHEMA_VERSION:
        raise ProtocolError(f"unsupported schema version {show(version)}", "version")
    return obj


def record_type(obj: dict[str, Any]) -> str | None:
    """The ``type`` field if it is a string, else None (it may be any msgpack value, even an
    unhashable list or map, so it must not meet a set or dict look-up before this check)."""
    t = obj.get("type")
    return t if isinstance(t, str) else None


def validate(adapter: TypeAdapter[Any], obj: dict[str, Any]) -> Any:
    """Validate ``obj`` with ``adapter``, turning pydantic's error into a ProtocolError."""
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(
            f"invalid {show(obj.get('type'))} record: {loc[:SHOW_MAX]}: {first['msg']} "
            f"(got {show(first.get('input'))})",
            "schema",
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:  # belt and braces: never escape
        raise ProtocolError(
            f"invalid {show(obj.get('type'))} record: {exc.__class__.__name__}: {show(str(exc))}",
            "schema",
        ) from None
