"""Columnar building blocks of :mod:`tracemq_devkit.generator`: msgIds, requestIds and
offsetMsgIds as vectorized numpy/arrow arrays (:func:`msg_ids`), strings by code, and
:func:`_frame`, a lake-schema table from given columns and the lake's defaults.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from collections.abc import Sequence
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tracemq import lake

from tracemq_devkit.gen_world import BROKERS, PRODUCERS, TRACE_TOPIC

# ----------------------------------------------------------------------------- helpers

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _strings_fixed(raw: np.ndarray) -> pa.Array:
    """(n, k) uint8 → an arrow string array of n strings of k bytes."""
    n, k = raw.shape
    offsets = np.arange(0, (n + 1) * k, k, dtype=np.int32 if n * k < 2**31 else np.int64)
    data = np.ascontiguousarray(raw).tobytes()
    if offsets.dtype == np.int64:
        return pa.LargeStringArray.from_buffers(
            n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)
        ).cast(pa.string())
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def _hex(raw: np.ndarray) -> np.ndarray:
    """(n, k) uint8 → (n, 2k) uint8 of upper-case hex digits."""
    out = np.empty((raw.shape[0], raw.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 15]
    return out


def _be(values: np.ndarray, nbytes: int) -> np.ndarray:
    """Big-endian bytes of unsigned integers: (n,) → (n, nbytes) uint8."""
    v = values.astype(np.uint64)
    shifts = np.arange(nbytes - 1, -1, -1, dtype=np.uint64) * np.uint64(8)
    return ((v[:, None] >> shifts[None, :]) & np.uint64(0xFF)).astype(np.uint8)


def _month_start(ms: np.ndarray, zone: str) -> np.ndarray:
    """Epoch ms of local midnight on the 1st of the month (in ``zone``) containing each ``ms``."""
    z = ZoneInfo(zone)
    first = _dt.datetime.fromtimestamp(int(ms.min()) // 1000, tz=z)
    last = _dt.datetime.fromtimestamp(int(ms.max()) // 1000, tz=z)
    starts = []
    y, m = first.year, first.month
    while (y, m) <= (last.year, last.month):
        starts.append(int(_dt.datetime(y, m, 1, tzinfo=z).timestamp()) * 1000)
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    bounds = np.array(starts, dtype=np.int64)
    return bounds[np.searchsorted(bounds, ms, side="right") - 1]


def _address(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def msg_ids(
    index: np.ndarray, created_ms: np.ndarray, producer: np.ndarray, zone: str | None = None
) -> pa.Array:
    """RocketMQ msgIds: client address, pid, salt, ms since the month start in the producer's
    zone (``zone``: this one for all), counter; 56 hex digits for an IPv6 address.

    Unique per ``index``: the salt holds ``index >> 16`` and the counter ``index & 0xFFFF``.
    """
    n = len(index)
    created_ms = np.asarray(created_ms, dtype=np.int64)
    raw = np.zeros((n, 28), dtype=np.uint8)
    width = np.empty(n, dtype=np.int64)
    for p, (_, _, _, p_zone, ip) in enumerate(PRODUCERS):
        sel = np.flatnonzero(producer == p)
        if not len(sel):
            continue
        addr = _address(ip)
        a = len(addr)
        width[sel] = (a + 12) * 2
        raw[sel, 0:a] = np.frombuffer(addr, dtype=np.uint8)
        raw[sel, a : a + 2] = _be(1000 + producer[sel], 2)
        raw[sel, a + 2 : a + 6] = _be(index[sel] >> 16, 4)
        made = created_ms[sel]
        raw[sel, a + 6 : a + 10] = _be(made - _month_start(made, zone or p_zone), 4)
        raw[sel, a + 10 : a + 12] = _be(index[sel] & 0xFFFF, 2)
    digits = _hex(raw)
    keep = np.arange(56)[None, :] < width[:, None]
    offsets = np.concatenate([[0], np.cumsum(width)])
    if offsets[-1] >= 2**31:
        raise ValueError("too many msgIds for one string array")
    return pa.StringArray.from_buffers(
        n,
        pa.py_buffer(offsets.astype(np.int32).tobytes()),
        pa.py_buffer(np.ascontiguousarray(digits[keep]).tobytes()),
    )


def _request_ids(index: np.ndarray, salt: int) -> pa.Array:
    n = len(index)
    raw = np.empty((n, 16), dtype=np.uint8)
    raw[:, 0:8] = _be(index, 8)
    raw[:, 8:16] = _be(np.full(n, salt, dtype=np.uint64), 8)
    return _strings_fixed(_hex(raw)[:, ::-1].copy())  # reversed: not sorted like the msgIds


def _offset_msg_ids(broker: np.ndarray, queue: np.ndarray, offset: np.ndarray) -> pa.Array:
    n = len(broker)
    raw = np.empty((n, 16), dtype=np.uint8)
    addr = np.array(
        [[int(x) for x in b[1].split(":")[0].split(".")] for b in BROKERS], dtype=np.uint8
    )
    port = np.array([int(b[1].split(":")[1]) for b in BROKERS], dtype=np.int64)
    raw[:, 0:4] = addr[broker]
    raw[:, 4:8] = _be(port[broker], 4)
    raw[:, 8:16] = _be((queue.astype(np.uint64) << np.uint64(48)) | offset.astype(np.uint64), 8)
    return _strings_fixed(_hex(raw))


def _take(values: Sequence[str | None], codes: np.ndarray) -> pa.Array:
    """Strings from a small dictionary by code (a negative code or a None entry is null)."""
    dictionary = pa.array(list(values) + [None], type=pa.string())
    idx = np.where(codes < 0, len(values), codes).astype(np.int32)
    return dictionary.take(pa.array(idx))


def _keys(index: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("order-", pc.cast(pa.array(index), pa.string()), "")


# ----------------------------------------------------------------------------- events

_COLS = lake.COLUMN_NAMES
_TYPES = {field.name: field.type for field in lake.arrow_schema()}
_DEFAULTS: dict[str, Any] = {
    "cost_time": 0,
    "success": True,
    "context_code": 0,
    "store_time": 0,
    "retry_times": 0,
    "body_length": 0,
    "from_transaction_check": False,
    "trace_partition": 0,
    "trace_offset": 0,
    "trace_index": 0,
    "ingest_ts": 0,
    "schema_version": lake.SCHEMA_VERSION,
    "trace_topic": TRACE_TOPIC,
}


def _frame(n: int, **cols: Any) -> pa.Table:
    """A lake table of ``n`` rows: given columns, defaults, nulls for the rest."""
    arrays = []
    for name in _COLS:
        typ = _TYPES[name]
        if name in cols:
            v = cols[name]
            if isinstance(v, pa.Array | pa.ChunkedArray):
                arr = v if v.type == typ else pc.cast(v, typ)
            elif isinstance(v, np.ndarray):
                arr = pa.array(v, type=typ)
            else:
                arr = pa.array(np.full(n, v), type=typ) if v is not None else pa.nulls(n, typ)
        elif name in _DEFAULTS:
            d = _DEFAULTS[name]
            arr = (
                pa.array(np.full(n, d), type=typ)
                if not isinstance(d, str)
                else pa.array([d], type=typ).take(pa.array(np.zeros(n, dtype=np.int32)))
            )
        else:
            arr = pa.nulls(n, typ)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=lake.arrow_schema())
