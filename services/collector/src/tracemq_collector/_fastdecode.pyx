# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled twin of the decoder's common-record loop (``events._fast_rows``), writing each
event straight into the partition's columns instead of a tuple per event that is transposed
later.

``events._fast_rows`` is the reference: for every text, :func:`fast_into` appends to the
columns exactly the values of the tuple the reference returns for it, or stops where the
reference returns None (tests/unit/test_collector_fastdecode.py holds them equal with
hypothesis). The decoder uses the pure-Python path when this module is missing or
``TRACEMQ_NO_EXTENSIONS`` is set. The differences are only how: a number field is checked and
read as a C ``unsigned long long`` in one pass over its ASCII bytes (``len <= 19``,
``isdigit()`` and ``isascii()``, then ``int()``), ``"null"`` and Java's ``"true"`` are compared
in C, the last hour's ``(date, hour)`` partition is kept, and an offsetMsgId's place is read
from its hex digits in C once the reference has named its store host.

:func:`arrow_buffers` builds the lake's Arrow columns from the decoded columns
(``events._lake_array``; ``pyarrow.array`` is the reference, and takes every column the
compiled step leaves to it).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from libc.string cimport memcmp

from tracemq_collector import events as _events


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


cdef object _SEP = _events._C
cdef Py_ssize_t _MAX_FIELD_CHARS = _events.MAX_FIELD_CHARS
cdef unsigned long long _INT_MAX = _events._INT_MAX
cdef unsigned long long _LONG_MAX = _events._LONG_MAX
cdef unsigned long long _MSG_TYPE_MAX = _events._MSG_TYPE_MAX
cdef unsigned long long _MAX_TS = _events.MAX_TIMESTAMP_MS
cdef object _MAX_TS_O = _events.MAX_TIMESTAMP_MS
cdef unsigned long long _HOUR_MS = _events._HOUR_MS
cdef object _HOUR_MS_O = _events._HOUR_MS
cdef object _VERSION = _events._SCHEMA_VERSION
cdef object _partition_of_hour = _events._partition_of_hour
cdef object _offset_coords = _events._offset_coords
cdef dict _store_addrs = _events._store_addrs
cdef unsigned long long _KAFKA_OFFSET_MASK = _events._KAFKA_OFFSET_MASK
cdef Py_ssize_t _WIDTH = len(_events.ROW_NAMES)
cdef Py_ssize_t _I_TYPE = _events._I_TYPE, _I_KEYS = _events._I_KEYS
cdef Py_ssize_t _I_MSG_ID = _events._I_MSG_ID, _I_TOPIC = _events._I_TOPIC
cdef Py_ssize_t _I_TIMESTAMP = _events._I_TIMESTAMP
cdef int _KEY_SHIFT = _events.KEY_SHIFT
cdef Py_ssize_t _MAX_KEYS = _events.MAX_KEYS_PER_MESSAGE

cdef object _PUB = "Pub"
cdef object _SUB_BEFORE = "SubBefore"
cdef object _SUB_AFTER = "SubAfter"

# the (date, hour) of the last hour number seen (events come clustered in a few hours)
cdef unsigned long long _last_hour = <unsigned long long>-1
cdef object _last_partition = None


cdef inline bint _number(object v, unsigned long long* out):
    """``len(v) <= 19 and v.isdigit() and v.isascii()``, and then ``int(v)`` in ``out``."""
    if not PyUnicode_IS_ASCII(v):
        return False
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(v), i
    if n == 0 or n > 19:
        return False
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_DATA(v)
    cdef unsigned long long x = 0
    cdef unsigned char c
    for i in range(n):
        c = p[i]
        if c < 48 or c > 57:
            return False
        x = x * 10 + (c - 48)
    out[0] = x
    return True


cdef inline object _text(object v):
    """``None if v == "null" else v``."""
    if (
        PyUnicode_IS_ASCII(v) and PyUnicode_GET_LENGTH(v) == 4
        and memcmp(PyUnicode_DATA(v), b"null", 4) == 0
    ):
        return None
    return v


cdef inline bint _true(object v):
    """``v.lower() == "true"`` (Java's ``Boolean.parseBoolean``)."""
    cdef const unsigned char* p
    if PyUnicode_IS_ASCII(v):
        if PyUnicode_GET_LENGTH(v) != 4:
            return False
        p = <const unsigned char*>PyUnicode_DATA(v)
        return (
            (p[0] | 0x20) == 116 and (p[1] | 0x20) == 114
            and (p[2] | 0x20) == 117 and (p[3] | 0x20) == 101
        )
    return v.lower() == "true"


cdef object _partition(unsigned long long ts, object ingest_ts, bint from_text):
    """``_partition_of_hour(timestamp // HOUR_MS)``, timestamp being ts (from_text) or
    ingest_ts."""
    global _last_hour, _last_partition
    cdef unsigned long long h
    if not from_text:
        return _partition_of_hour(ingest_ts // _HOUR_MS_O)
    h = ts // _HOUR_MS
    if h != _last_hour or _last_partition is None:
        _last_partition = _partition_of_hour(h)
        _last_hour = h
    return _last_partition


cdef inline int _hex(unsigned char c):
    if 48 <= c <= 57:
        return c - 48
    c |= 0x20
    if 97 <= c <= 102:
        return c - 87
    return -1


cdef object _coords(object v):
    """``_offset_coords(v)``: an IPv4 offsetMsgId (32 hex digits) whose store host the
    reference has already named read here; anything else (None, IPv6, not hex, a host not
    seen yet) by the reference itself."""
    if v is None or not PyUnicode_IS_ASCII(v) or PyUnicode_GET_LENGTH(v) != 32:
        return _offset_coords(v)
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_DATA(v)
    cdef unsigned char raw[16]
    cdef int i, hi, lo
    for i in range(16):
        hi = _hex(p[2 * i])
        lo = _hex(p[2 * i + 1])
        if hi < 0 or lo < 0:
            return _offset_coords(v)
        raw[i] = <unsigned char>((hi << 4) | lo)
    addr = _store_addrs.get(PyBytes_FromStringAndSize(<char*>raw, 8))
    if addr is None:
        return _offset_coords(v)
    cdef unsigned long long physical = 0
    for i in range(8, 16):
        physical = (physical << 8) | raw[i]
    return (
        addr,
        PyLong_FromUnsignedLongLong(physical >> 48),
        PyLong_FromUnsignedLongLong(physical & _KAFKA_OFFSET_MASK),
    )


cdef inline void _put(list columns, tuple row) except *:
    cdef Py_ssize_t k
    for k in range(_WIDTH):
        PyList_Append(<list>columns[k], row[k])


def fast_into(
    list texts,
    Py_ssize_t start,
    list columns,
    trace_topic,
    partition,
    offset,
    ingest_ts,
    client_host,
    client_id,
):
    """Append the events of ``texts[start:]`` to ``columns`` (one list per ``ROW_NAMES``
    column) as ``events._fast_rows(texts, ..., first_index=0)`` gives them, text ``i`` with
    trace index ``i``, up to the first text that reference returns None for; its position is
    returned (``len(texts)`` when there is none). Raises TypeError when ``columns`` does not
    hold that many lists or a text is not a ``str``."""
    if len(columns) != _WIDTH:
        raise TypeError(f"fast_into needs {_WIDTH} column lists, got {len(columns)}")
    for k in range(_WIDTH):
        if type(columns[k]) is not list:
            raise TypeError("fast_into's columns must be lists")
    cdef Py_ssize_t i, n_texts = len(texts), n
    cdef list f
    cdef object text, kind, timestamp, date_hour, v
    cdef unsigned long long ts, a, b, c
    cdef bint from_text
    for i in range(start, n_texts):
        text = texts[i]
        if type(text) is not str:
            raise TypeError(f"fast_into's texts must be str, not {type(text).__name__}")
        f = text.split(_SEP)
        n = len(f)
        if PyUnicode_GET_LENGTH(text) > _MAX_FIELD_CHARS or PyUnicode_GET_LENGTH(f[n - 1]) == 0:
            return i
        kind = f[0]
        if n == 9 and kind == _SUB_AFTER:
            # cost (a), context code (b), timestamp (ts)
            if not (_number(f[3], &a) and _number(f[6], &b) and _number(f[7], &ts)):
                return i
            if a > _INT_MAX or b > _INT_MAX or ts > _LONG_MAX:
                return i
            from_text = ts != 0
            if from_text:
                if ts > _MAX_TS:
                    return i
                timestamp = PyLong_FromUnsignedLongLong(ts)
            else:
                timestamp = ingest_ts
                if timestamp > _MAX_TS_O:
                    return i
            date_hour = _partition(ts, ingest_ts, from_text)
            _put(columns, (
                trace_topic, partition, offset, i, _SUB_AFTER, timestamp,
                _text(f[2]), None, client_host, 0, ingest_ts, text,
                client_id,
                None, _text(f[8]), _text(f[1]), PyLong_FromUnsignedLongLong(a),
                _true(f[4]), PyLong_FromUnsignedLongLong(b), None, None, _text(f[5]), None,
                0, 0, None, None, None, False, None, None, None, _VERSION,
                date_hour[0], date_hour[1],
            ))
        elif n == 8 and kind == _SUB_BEFORE:
            # timestamp (ts), retry times (a)
            if not (_number(f[1], &ts) and _number(f[6], &a)):
                return i
            if ts > _LONG_MAX or a > _INT_MAX:
                return i
            from_text = ts != 0
            if from_text:
                if ts > _MAX_TS:
                    return i
                timestamp = PyLong_FromUnsignedLongLong(ts)
            else:
                timestamp = ingest_ts
                if timestamp > _MAX_TS_O:
                    return i
            date_hour = _partition(ts, ingest_ts, from_text)
            _put(columns, (
                trace_topic, partition, offset, i, _SUB_BEFORE, timestamp,
                _text(f[5]), None, client_host, 0, ingest_ts, text,
                client_id,
                _text(f[2]), _text(f[3]), _text(f[4]), 0, True, 0, None, None,
                _text(f[7]), None,
                PyLong_FromUnsignedLongLong(a), 0, None, None, None, False, None, None, None,
                _VERSION, date_hour[0], date_hour[1],
            ))
        elif n == 14 and kind == _PUB:
            # timestamp (ts), body length (a), cost (b), message type (c)
            if not (
                _number(f[1], &ts) and _number(f[9], &a) and _number(f[10], &b)
                and _number(f[11], &c)
            ):
                return i
            if ts > _LONG_MAX or a > _INT_MAX or b > _INT_MAX or c > _MSG_TYPE_MAX:
                return i
            from_text = ts != 0
            if from_text:
                if ts > _MAX_TS:
                    return i
                timestamp = PyLong_FromUnsignedLongLong(ts)
            else:
                timestamp = ingest_ts
                if timestamp > _MAX_TS_O:
                    return i
            date_hour = _partition(ts, ingest_ts, from_text)
            v = _text(f[12])
            store_addr, queue_id, queue_offset = _coords(v)
            _put(columns, (
                trace_topic, partition, offset, i, _PUB, timestamp,
                _text(f[5]), _text(f[4]), client_host, 0,
                ingest_ts, text,
                client_id,
                _text(f[2]), _text(f[3]), None, PyLong_FromUnsignedLongLong(b),
                _true(f[13]), 0, v,
                _text(f[6]), _text(f[7]), _text(f[8]),
                0, PyLong_FromUnsignedLongLong(a), PyLong_FromUnsignedLongLong(c), None, None,
                False, store_addr, queue_id, queue_offset,
                _VERSION, date_hour[0], date_hour[1],
            ))
        else:
            return i
    return n_texts


def add_key_rows(columns, long long first, set seen, list key_rows, list key_msg_ids):
    """``events._add_key_rows`` (the reference): the key rows of the Pubs among events in
    ``ROW_NAMES`` columns, at positions from ``first``, each msgId once (``seen``); the per-Pub
    work (``key_rows_of``, ``split_keys``) in one loop here."""
    types, keys, msg_ids = columns[_I_TYPE], columns[_I_KEYS], columns[_I_MSG_ID]
    topics, stamps = columns[_I_TOPIC], columns[_I_TIMESTAMP]
    cdef Py_ssize_t i, n = len(types), k
    cdef long long base
    cdef list found, parts
    for i in range(n):
        if not (types[i] == _PUB):
            continue
        key_text = keys[i]
        if not key_text:
            continue
        msg_id = msg_ids[i]
        if msg_id is None or msg_id in seen:
            continue
        # a send retried under the same msgId is one message for key look-ups
        seen.add(msg_id)
        parts = key_text.split(" ")
        if "" in parts or "null" in parts:
            found = sorted({x for x in parts if x and x != "null"})
        else:
            found = sorted(set(parts))
        if len(found) > _MAX_KEYS:
            del found[_MAX_KEYS:]
        if not found:
            continue
        base = (first + i) << _KEY_SHIFT
        topic, stamp = topics[i], stamps[i]
        for k in range(len(found)):
            key_rows.append((base + k, found[k], msg_id, topic, stamp))
        key_msg_ids.append(msg_id)


# ------------------------------------------------------------------ the lake's Arrow columns

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.string cimport memcpy, memset

#: The kinds of :func:`arrow_buffers` (the lake schema's Arrow types).
ARROW_STRING, ARROW_INT64, ARROW_INT32, ARROW_BOOL = 0, 1, 2, 3


cdef object _new_buffer(object allocate, Py_ssize_t size, char** out):
    """``allocate(size)``: a writable buffer, its memory in ``out`` (it does not move)."""
    cdef Py_buffer view
    buf = allocate(size)
    PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    try:
        if view.len < size:
            raise ValueError(f"arrow_buffers: allocate({size}) gave {view.len} bytes")
        out[0] = <char*>view.buf
    finally:
        PyBuffer_Release(&view)
    return buf


def arrow_buffers(tuple column, int kind, allocate):
    """The Arrow buffers of ``pyarrow.array(column, type)`` for the lake's column types
    (``kind``: :data:`ARROW_STRING`, ``ARROW_INT64``, ``ARROW_INT32``, ``ARROW_BOOL``), built
    here in one pass over the values into buffers of ``allocate(size)`` (``pyarrow.allocate_buffer``:
    Arrow's memory pool, as ``pyarrow.array``'s): ``(null count, validity bitmap or None,
    offsets or None, data)`` for ``pyarrow.Array.from_buffers``. None when a value is not
    exactly what this path takes — a ``str`` (string), an ``int`` in the type's range
    (integers), a ``bool`` (bool) or None — or the strings pass 2 GiB: the caller then converts
    with ``pyarrow.array``, which converts or refuses such values as it always did.
    (pyarrow's own conversion checks every value for a pyarrow scalar first, ~20 – 40 ns a value
    in all; the collector converts ~25 columns per event.)"""
    cdef Py_ssize_t n = len(column), i, size, total = 0, nulls = 0
    cdef object v, validity = None, offsets = None, data
    cdef const char* s
    cdef long long x
    cdef int overflow = 0
    cdef unsigned char* bits = NULL
    cdef char* mem
    cdef int* offs
    cdef long long* i64
    cdef int* i32
    cdef unsigned char* flags
    if kind < 0 or kind > 3:
        raise ValueError(f"arrow_buffers: unknown kind {kind}")
    # pass 1: every value's type and range, the nulls, the strings' bytes
    for i in range(n):
        v = <object>PyTuple_GET_ITEM(column, i)
        if v is None:
            nulls += 1
        elif kind == 0:
            if type(v) is not str:
                return None
            try:
                s = PyUnicode_AsUTF8AndSize(v, &size)
            except UnicodeEncodeError:  # a lone surrogate: pyarrow's to refuse
                return None
            total += size
            if total > 0x7FFFFFFF:
                return None
        elif kind == 3:
            if type(v) is not bool:
                return None
        else:
            if type(v) is not int:
                return None
            x = PyLong_AsLongLongAndOverflow(v, &overflow)
            if overflow or (kind == 2 and (x < -0x80000000 or x > 0x7FFFFFFF)):
                return None
    if nulls:
        validity = _new_buffer(allocate, (n + 7) // 8, &mem)
        bits = <unsigned char*>mem
        memset(bits, 0xFF, n // 8)
        if n & 7:
            bits[n >> 3] = (1 << (n & 7)) - 1  # the bits past the end: 0
    # pass 2: the buffers
    if kind == 0:
        offsets = _new_buffer(allocate, (n + 1) * 4, &mem)
        offs = <int*>mem
        data = _new_buffer(allocate, total, &mem)
        total = 0
        offs[0] = 0
        for i in range(n):
            v = <object>PyTuple_GET_ITEM(column, i)
            if v is None:
                bits[i >> 3] &= ~(1 << (i & 7))
            else:
                s = PyUnicode_AsUTF8AndSize(v, &size)  # cached by pass 1 unless ASCII
                memcpy(mem + total, s, size)
                total += size
            offs[i + 1] = <int>total
    elif kind == 1:
        data = _new_buffer(allocate, n * 8, &mem)
        i64 = <long long*>mem
        for i in range(n):
            v = <object>PyTuple_GET_ITEM(column, i)
            if v is None:
                bits[i >> 3] &= ~(1 << (i & 7))
                i64[i] = 0
            else:
                i64[i] = PyLong_AsLongLongAndOverflow(v, &overflow)
    elif kind == 2:
        data = _new_buffer(allocate, n * 4, &mem)
        i32 = <int*>mem
        for i in range(n):
            v = <object>PyTuple_GET_ITEM(column, i)
            if v is None:
                bits[i >> 3] &= ~(1 << (i & 7))
                i32[i] = 0
            else:
                i32[i] = <int>PyLong_AsLongLongAndOverflow(v, &overflow)
    else:
        data = _new_buffer(allocate, (n + 7) // 8, &mem)
        flags = <unsigned char*>mem
        memset(flags, 0, (n + 7) // 8)
        for i in range(n):
            v = <object>PyTuple_GET_ITEM(column, i)
            if v is None:
                bits[i >> 3] &= ~(1 << (i & 7))
            elif v is True:
                flags[i >> 3] |= 1 << (i & 7)
    return nulls, validity, offsets, data
