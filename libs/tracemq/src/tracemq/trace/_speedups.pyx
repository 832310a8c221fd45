# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled twins of the trace worker's per-record steps: ``write_records``
(``tracemq.trace._codec``) and ``plan_slices`` (``tracemq.trace._dispatcher``).

The pure-Python functions are the reference: these must return the same for every input the
worker can give them (tests/unit/test_trace_speedups.py holds them equal with hypothesis), and
the worker uses the Python ones when this module is missing or ``TRACEMQ_NO_EXTENSIONS`` is set.
Each branch mirrors one of the reference's; the differences are only how: integers checked and
compared as C ``long long`` (a Java long is exactly that), tuples read without unpacking, a
message body copied from the records' ASCII text without a join and an encode.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.set cimport PySet_Add
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.string cimport memcpy


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    ctypedef struct PyObject
    ctypedef struct PyMemberDef
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    # a slot's value (AttributeError when it is empty), as its member descriptor reads it
    object PyMember_GetOne(const char* obj_addr, PyMemberDef* m)

# (imported from the codec at the end of its own import: the kinds are compared by identity)
from tracemq.trace._codec import PUB, SUB_AFTER, SUB_BEFORE, SUB_PAIR, _DECIMALS
from tracemq.trace._model import ConsumeReturnType, MessageType

cdef object _PUB = PUB
cdef object _SUB_AFTER = SUB_AFTER
cdef object _SUB_BEFORE = SUB_BEFORE
cdef object _SUB_PAIR = SUB_PAIR
cdef tuple _DEC = _DECIMALS
cdef long long _N_DEC = len(_DECIMALS)
cdef object _NULL = "null"
cdef object _CODE_ENUM = ConsumeReturnType
cdef object _MSG_TYPE_ENUM = MessageType

cdef tuple _HEX2 = tuple(f"{i:02X}" for i in range(256))
cdef const char* _HEX_DIGITS = b"0123456789ABCDEF"

cdef long long _INT_MIN = -2147483648
cdef long long _INT_MAX = 2147483647


cdef inline bint _exact_int(object x):
    return type(x) is int


cdef inline bint _as_long(object x, long long* out):
    """x (an exact int) as a C long long; False when it does not fit (outside a Java long)."""
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(x, &overflow)
    if overflow:
        return False
    out[0] = v
    return True


cdef inline bint _as_int32(object x, long long* out):
    """x as a Java int: an exact int in range; False otherwise."""
    if type(x) is not int:
        return False
    if not _as_long(x, out):
        return False
    return _INT_MIN <= out[0] <= _INT_MAX


cdef inline object _dec(object x, long long v):
    """Decimal text of the exact int x (= v)."""
    if 0 <= v < _N_DEC:
        return <object>PyTuple_GET_ITEM(_DEC, <Py_ssize_t>v)
    return str(x)


cdef inline object _t(object x):
    return _NULL if x is None else x


def write_records(items):
    """See ``tracemq.trace._codec.write_records``: the same result for every input."""
    cdef list out = []
    cdef object r, kind, ts_s = "", unset = object()
    cdef Py_ssize_t size
    cdef long long ts_v = 0, last_ts = 0, end_v = 0, a = 0, b = 0, c = 0
    cdef bint have_ts = False
    cdef object region, msg_id, keys, ts, group, rid, retry, end, cost, ok, code
    cdef object topic, tags, store_host, body_length, msg_type, offset_msg_id
    cdef object msg_type_s, end_s, retry_s, cost_s, code_s, group_s, rid_s, msg_id_s, keys_s, ok_s
    cdef object pair_region = unset, pair_group = unset, pair_head = "", pair_tail = ""
    cdef object pub_region = unset, pub_group = unset, pub_topic = unset, pub_head = ""
    for r in items:
        try:
            if type(r) is not tuple:
                out.append(None)
                continue
            size = PyTuple_GET_SIZE(r)
            if size == 0:
                out.append(None)
                continue
            kind = <object>PyTuple_GET_ITEM(r, 0)
            if kind is _SUB_PAIR:
                if size != 13:
                    out.append(None)
                    continue
                region = <object>PyTuple_GET_ITEM(r, 2)
                msg_id = <object>PyTuple_GET_ITEM(r, 3)
                keys = <object>PyTuple_GET_ITEM(r, 4)
                ts = <object>PyTuple_GET_ITEM(r, 5)
                group = <object>PyTuple_GET_ITEM(r, 6)
                rid = <object>PyTuple_GET_ITEM(r, 7)
                retry = <object>PyTuple_GET_ITEM(r, 8)
                end = <object>PyTuple_GET_ITEM(r, 9)
                cost = <object>PyTuple_GET_ITEM(r, 10)
                ok = <object>PyTuple_GET_ITEM(r, 11)
                code = <object>PyTuple_GET_ITEM(r, 12)
                if type(ts) is not int or not _as_long(ts, &ts_v):
                    out.append(None)
                    continue
                if not have_ts or ts_v != last_ts:
                    have_ts, last_ts, ts_s = True, ts_v, str(ts)
                if type(end) is not int or not _as_long(end, &end_v):
                    out.append(None)
                    continue
                end_s = ts_s if end_v == ts_v else str(end)
                if not _as_int32(retry, &a) or not _as_int32(cost, &b):
                    out.append(None)
                    continue
                if type(code) is int:
                    if not _as_int32(code, &c):
                        out.append(None)
                        continue
                    code_s = _dec(code, c)
                elif type(code) is _CODE_ENUM and _INT_MIN <= code <= _INT_MAX:
                    code_s = f"{code:d}"
                else:
                    out.append(None)
                    continue
                retry_s = _dec(retry, a)
                cost_s = _dec(cost, b)
                if region is not pair_region or group is not pair_group:
                    pair_region, pair_group = region, group
                    group_s = _t(group)
                    pair_head = f"\x01{_t(region)}\x01{group_s}\x01"
                    pair_tail = f"\x01{group_s}\x02"
                rid_s = _t(rid)
                msg_id_s = _t(msg_id)
                keys_s = _t(keys)
                ok_s = "true" if ok else "false"
                out.append(
                    f"SubBefore\x01{ts_s}{pair_head}{rid_s}\x01{msg_id_s}\x01{retry_s}\x01{keys_s}"
                    f"\x02SubAfter\x01{rid_s}\x01{msg_id_s}\x01{cost_s}\x01"
                    f"{ok_s}\x01{keys_s}\x01{code_s}\x01{end_s}{pair_tail}"
                )
            elif kind is _SUB_AFTER:
                if size != 11:
                    out.append(None)
                    continue
                msg_id = <object>PyTuple_GET_ITEM(r, 3)
                keys = <object>PyTuple_GET_ITEM(r, 4)
                ts = <object>PyTuple_GET_ITEM(r, 5)
                group = <object>PyTuple_GET_ITEM(r, 6)
                rid = <object>PyTuple_GET_ITEM(r, 7)
                cost = <object>PyTuple_GET_ITEM(r, 8)
                ok = <object>PyTuple_GET_ITEM(r, 9)
                code = <object>PyTuple_GET_ITEM(r, 10)
                if type(ts) is not int or not _as_long(ts, &ts_v):
                    out.append(None)
                    continue
                if not have_ts or ts_v != last_ts:
                    have_ts, last_ts, ts_s = True, ts_v, str(ts)
                if not _as_int32(cost, &b):
                    out.append(None)
                    continue
                cost_s = _dec(cost, b)
                if type(code) is int:
                    if not _as_int32(code, &c):
                        out.append(None)
                        continue
                    code_s = _dec(code, c)
                elif type(code) is _CODE_ENUM and _INT_MIN <= code <= _INT_MAX:
                    code_s = f"{code:d}"
                else:
                    out.append(None)
                    continue
                ok_s = "true" if ok else "false"
                out.append(
                    f"SubAfter\x01{_t(rid)}\x01{_t(msg_id)}\x01{cost_s}\x01{ok_s}\x01{_t(keys)}"
                    f"\x01{code_s}\x01{ts_s}\x01{_t(group)}\x02"
                )
            elif kind is _SUB_BEFORE:
                if size != 9:
                    out.append(None)
                    continue
                region = <object>PyTuple_GET_ITEM(r, 2)
                msg_id = <object>PyTuple_GET_ITEM(r, 3)
                keys = <object>PyTuple_GET_ITEM(r, 4)
                ts = <object>PyTuple_GET_ITEM(r, 5)
                group = <object>PyTuple_GET_ITEM(r, 6)
                rid = <object>PyTuple_GET_ITEM(r, 7)
                retry = <object>PyTuple_GET_ITEM(r, 8)
                if type(ts) is not int or not _as_long(ts, &ts_v):
                    out.append(None)
                    continue
                if not have_ts or ts_v != last_ts:
                    have_ts, last_ts, ts_s = True, ts_v, str(ts)
                if not _as_int32(retry, &a):
                    out.append(None)
                    continue
                out.append(
                    f"SubBefore\x01{ts_s}\x01{_t(region)}\x01{_t(group)}\x01{_t(rid)}\x01"
                    f"{_t(msg_id)}\x01{_dec(retry, a)}\x01{_t(keys)}\x02"
                )
            elif kind is _PUB:
                if size != 14:
                    out.append(None)
                    continue
                topic = <object>PyTuple_GET_ITEM(r, 1)
                region = <object>PyTuple_GET_ITEM(r, 2)
                msg_id = <object>PyTuple_GET_ITEM(r, 3)
                keys = <object>PyTuple_GET_ITEM(r, 4)
                ts = <object>PyTuple_GET_ITEM(r, 5)
                group = <object>PyTuple_GET_ITEM(r, 6)
                tags = <object>PyTuple_GET_ITEM(r, 7)
                store_host = <object>PyTuple_GET_ITEM(r, 8)
                body_length = <object>PyTuple_GET_ITEM(r, 9)
                cost = <object>PyTuple_GET_ITEM(r, 10)
                msg_type = <object>PyTuple_GET_ITEM(r, 11)
                offset_msg_id = <object>PyTuple_GET_ITEM(r, 12)
                ok = <object>PyTuple_GET_ITEM(r, 13)
                if type(ts) is not int or not _as_long(ts, &ts_v):
                    out.append(None)
                    continue
                if not have_ts or ts_v != last_ts:
                    have_ts, last_ts, ts_s = True, ts_v, str(ts)
                if not _as_int32(body_length, &a) or not _as_int32(cost, &b):
                    out.append(None)
                    continue
                if type(msg_type) is int:
                    if not _as_long(msg_type, &c) or not 0 <= c <= 4:
                        out.append(None)
                        continue
                elif type(msg_type) is _MSG_TYPE_ENUM and 0 <= msg_type <= 4:
                    c = msg_type
                else:
                    out.append(None)
                    continue
                msg_type_s = <object>PyTuple_GET_ITEM(_DEC, <Py_ssize_t>c)
                if region is not pub_region or group is not pub_group or topic is not pub_topic:
                    pub_region, pub_group, pub_topic = region, group, topic
                    pub_head = f"\x01{_t(region)}\x01{_t(group)}\x01{_t(topic)}"
                ok_s = "true" if ok else "false"
                out.append(
                    f"Pub\x01{ts_s}{pub_head}\x01{_t(msg_id)}\x01{_t(tags)}\x01{_t(keys)}\x01"
                    f"{_t(store_host)}\x01{_dec(body_length, a)}\x01{_dec(cost, b)}\x01"
                    f"{msg_type_s}\x01{_t(offset_msg_id)}\x01"
                    f"{ok_s}\x02"
                )
            else:
                out.append(None)
        except Exception:  # as the reference: this record goes the checked way
            out.append(None)
    return out


# ---------------------------------------------------------------------------- plan_slices

cdef inline Py_ssize_t _separators(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """U+0001 and U+0002 in n bytes of ASCII text (a loop the C compiler vectorises)."""
    cdef Py_ssize_t i, count = 0
    for i in range(n):
        count += <unsigned char>(p[i] - 1) < 2
    return count


cdef inline bint _text_or_none(object r, tuple at):
    """Every field of raw record r at these indices is None or a str (exactly)."""
    cdef object i, v
    for i in at:
        v = <object>PyTuple_GET_ITEM(r, <Py_ssize_t>i)
        if v is not None and type(v) is not str:
            return False
    return True


# the text fields each kind writes (as tracemq.trace._codec.write_records writes them)
cdef tuple _PUB_TEXT = (1, 2, 3, 4, 6, 7, 8, 12)
cdef tuple _BEFORE_TEXT = (2, 3, 4, 6, 7)
cdef tuple _AFTER_TEXT = (3, 4, 6, 7)
cdef tuple _PAIR_TEXT = (2, 3, 4, 6, 7)


def plan_slices(batch, texts, first_seq, limit, fallback):
    """See ``tracemq.trace._dispatcher._plan_slices``: the same result for the batches the
    worker gives it (raw records, every one written: ``texts`` is ``write_records(batch)``
    without a None). Anything else — non-ASCII text, a text field that is not a str, a malformed
    record, a limit out of C's range — is handed to ``fallback`` (that reference) whole."""
    cdef Py_ssize_t n, i, start, stop, size, length, pairs
    cdef long long lim, before, total
    cdef long long* ends = NULL
    cdef Py_ssize_t expected
    cdef bint clean = True, any_key
    cdef object r, t, kind, k, value, keys
    cdef tuple text_at
    cdef char* dst
    cdef list plans
    cdef Py_ssize_t oversize = 0
    if (
        type(batch) is not list or type(texts) is not list or type(limit) is not int
        or not 1 <= limit <= 2**62 or len(batch) != len(texts)
    ):
        return fallback(batch, texts, first_seq, limit)
    n = len(texts)
    lim = limit
    ends = <long long*>PyMem_Malloc((n + 1) * sizeof(long long))
    if ends == NULL:
        raise MemoryError()
    try:
        # one pass checks that every record is one this path covers and counts its separators
        total = 0
        for i in range(n):
            t = texts[i]
            r = batch[i]
            if type(t) is not str or not PyUnicode_IS_ASCII(t) or type(r) is not tuple:
                return fallback(batch, texts, first_seq, limit)
            size = PyTuple_GET_SIZE(r)
            if size == 0:
                return fallback(batch, texts, first_seq, limit)
            kind = <object>PyTuple_GET_ITEM(r, 0)
            if kind is _SUB_PAIR and size == 13:
                expected, text_at = 17, _PAIR_TEXT
            elif kind is _PUB and size == 14:
                expected, text_at = 14, _PUB_TEXT
            elif kind is _SUB_AFTER and size == 11:
                expected, text_at = 9, _AFTER_TEXT
            elif kind is _SUB_BEFORE and size == 9:
                expected, text_at = 8, _BEFORE_TEXT
            else:
                return fallback(batch, texts, first_seq, limit)
            if not _text_or_none(r, text_at):
                return fallback(batch, texts, first_seq, limit)
            length = PyUnicode_GET_LENGTH(t)
            # (a text field holding a separator adds to the record's own: the reference then
            # finds a body whose count is off, and returns None)
            if _separators(<const unsigned char*>PyUnicode_DATA(t), length) != expected:
                clean = False
            total += length
            ends[i] = total
        if not clean:
            return None  # a text field holds a separator: find which, the careful way
        plans = []
        start, before = 0, 0
        while start < n:
            stop = start
            while stop < n and ends[stop] <= before + lim:
                stop += 1
            if stop == start:  # one item longer than a message: sent alone
                oversize += 1
                stop = start + 1
            value = PyBytes_FromStringAndSize(NULL, ends[stop - 1] - before)
            dst = PyBytes_AS_STRING(value)
            keys = set()
            pairs = 0
            for i in range(start, stop):
                t = texts[i]
                length = PyUnicode_GET_LENGTH(t)
                memcpy(dst, PyUnicode_DATA(t), length)
                dst += length
                r = batch[i]
                PySet_Add(keys, <object>PyTuple_GET_ITEM(r, 3))
                if <object>PyTuple_GET_ITEM(r, 0) is _SUB_PAIR:
                    pairs += 1
            # the business keys after the msgIds, in the reference's order: its join of the
            # chunk's keys and split on the separator is each one's split in turn
            any_key = False
            for i in range(start, stop):
                k = <object>PyTuple_GET_ITEM(batch[i], 4)
                if k is None or PyUnicode_GET_LENGTH(k) == 0:
                    continue
                any_key = True
                if " " in k:
                    for piece in k.split(" "):
                        PySet_Add(keys, piece)
                else:
                    PySet_Add(keys, k)
            if not any_key:
                PySet_Add(keys, "")  # ("".split(" ") is [""])
            plans.append((first_seq + start, stop - start + pairs, value, keys))
            before = ends[stop - 1]
            start = stop
        return plans, 0, oversize
    finally:
        PyMem_Free(ends)


# -------------------------------------------------------------------------- ConsumeRecord

@cython.no_gc  # (its fields are texts and numbers: no cycle through it, so not tracked)
cdef class ConsumeRecord:
    """A consumed message's trace while the worker has not written it: the queue item (and the
    token) of ``ConsumeTracer.before``, its SubBefore; ``ConsumeTracer.after`` joins the
    SubAfter to it in place while it is not sealed. The worker seals the items it takes for
    good (written, or failed); a SubAfter then goes alone, as the reference does once its
    SubBefore was written. :meth:`as_tuple` is the raw record the reference queues for the
    same calls (``SUB_BEFORE``, or ``SUB_PAIR`` once joined): what every step but
    ``write_plan`` works on. One object per consumed message, set field by field: no tuple
    built for the SubBefore, none for the pair, none for the token."""

    cdef readonly object topic, region, msg_id, keys, group, reconsume_times
    cdef readonly object success, code
    cdef object _rid_head  # the request id: this head (30 characters) and 2 hex digits
    cdef int _rid_low
    cdef object _end_o, _cost_o  # (an end beyond a Java long: kept as the reference keeps it)
    cdef readonly long long seq, begin
    cdef long long _end, _cost
    cdef readonly bint joined, sealed

    def as_tuple(self):
        """The raw record of the reference (``tracemq.trace._codec``)."""
        if not self.joined:
            return (_SUB_BEFORE, self.topic, self.region, self.msg_id, self.keys, self.begin,
                    self.group, self.request_id, self.reconsume_times)
        return (_SUB_PAIR, self.topic, self.region, self.msg_id, self.keys, self.begin,
                self.group, self.request_id, self.reconsume_times, self.end, self.cost,
                self.success, self.code)

    @property
    def request_id(self):
        return self._rid_head + <object>PyTuple_GET_ITEM(_HEX2, self._rid_low)

    @property
    def token(self):
        """What the reference's ``before`` returns: (its number or -1, request id, begin)."""
        return (self.seq, self.request_id, self.begin)

    @property
    def end(self):
        return self._end_o if self._end_o is not None else self._end

    @property
    def cost(self):
        return self._cost_o if self._cost_o is not None else self._cost


def seal(items):
    """Mark the ConsumeRecords among ``items`` taken for good (written or failed): a SubAfter
    no longer joins them."""
    cdef object item
    for item in items:
        if type(item) is ConsumeRecord:
            (<ConsumeRecord>item).sealed = True


def materialize(items):
    """``items`` with every ConsumeRecord as its raw record (a new list)."""
    return [(<ConsumeRecord>i).as_tuple() if type(i) is ConsumeRecord else i for i in items]


# ------------------------------------------------------------------------------- write_plan

cdef inline Py_ssize_t _tlen(object x) noexcept:
    """Length of text field x as write_records writes it ("null" for None) when it is an
    ASCII str; -1 when it is not (the record is not write_plan's)."""
    if x is None:
        return 4
    if type(x) is not str or not PyUnicode_IS_ASCII(x):
        return -1
    return PyUnicode_GET_LENGTH(x)


cdef inline char* _tput(char* p, object x) noexcept:
    """Text field x (checked by _tlen) at p; the end."""
    cdef Py_ssize_t n
    if x is None:
        memcpy(p, b"null", 4)
        return p + 4
    n = PyUnicode_GET_LENGTH(x)
    memcpy(p, PyUnicode_DATA(x), n)
    return p + n


cdef inline char* _rput(char* p, object x, int low) noexcept:
    """A request id at p: text field x, then (low >= 0: a ConsumeRecord's) 2 hex digits."""
    p = _tput(p, x)
    if low >= 0:
        p[0] = _HEX_DIGITS[low >> 4]
        p[1] = _HEX_DIGITS[low & 15]
        p += 2
    return p


cdef inline char* _dput(char* p, long long v) noexcept:
    """The decimal text of v at p (at most 20 characters); the end."""
    cdef char digits[20]
    cdef int i = 20
    cdef unsigned long long u = <unsigned long long>v if v >= 0 else -<unsigned long long>v
    while True:
        i -= 1
        digits[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if v < 0:
        i -= 1
        digits[i] = 45  # "-"
    memcpy(p, digits + i, 20 - i)
    return p + 20 - i


cdef inline char* _lput(char* p, const char* text, Py_ssize_t n) noexcept:
    memcpy(p, text, n)
    return p + n


cdef inline bint _code_of(object code, long long* out) noexcept:
    """The consume code as write_records takes it: an int, or a ConsumeReturnType, in a Java
    int's range (its value in out)."""
    if type(code) is int:
        return _as_int32(code, out)
    if type(code) is _CODE_ENUM:
        return _as_long(code, out) and _INT_MIN <= out[0] <= _INT_MAX
    return False


cdef inline bint _same(object a, object b) noexcept:
    return a is b or (type(a) is str and type(b) is str and a == b)


cdef inline bint _is(object r, Py_ssize_t i, object t) noexcept:
    return type(<object>PyTuple_GET_ITEM(r, i)) is t


def write_plan(batch, first_seq, limit):
    """``plan_slices_py(batch, write_records(batch), first_seq, limit)`` in one pass, for the
    worker's usual batch: a list of raw records and ConsumeRecords (as their ``as_tuple()``)
    of one topic and region, each one ``write_records`` writes, with text fields that are
    ASCII ``str`` (or None) holding no separator. Each record's text is written straight into
    one buffer — no str per record, no second copy of it — and the messages are cut from it as
    ``plan_slices`` cuts them. None for any other batch: then the worker takes those steps
    (the result is theirs: tests/unit/test_trace_speedups.py holds them equal)."""
    cdef char* data = NULL
    cdef char* grown
    cdef char* p
    cdef Py_ssize_t used = 0, capacity = 0, need, t, expected
    cdef long long* ends = NULL
    cdef Py_ssize_t n, i, start, stop, size, pairs
    cdef long long lim, before, ts_v = 0, end_v = 0, a = 0, b = 0, c = 0
    cdef object r, kind, topic = None, region = None, k, value, keys
    cdef object f1, f2, f3, f4, f6, f7, f8 = None, f12 = None
    cdef int rid_low = -1  # a ConsumeRecord's request id: f7 its head, then these 2 hex digits
    cdef ConsumeRecord cr
    cdef bint any_key, okv = False
    cdef list plans
    cdef Py_ssize_t oversize = 0
    if type(batch) is not list or type(limit) is not int or not 1 <= limit <= 2**62:
        return None
    n = len(batch)
    if n == 0:
        return None
    lim = limit
    ends = <long long*>PyMem_Malloc(n * sizeof(long long))
    if ends == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            r = batch[i]
            # -- the record's fields, checked as write_records checks them
            if type(r) is ConsumeRecord:  # the compiled consume path's item
                cr = <ConsumeRecord>r
                f1, f2, f3, f4 = cr.topic, cr.region, cr.msg_id, cr.keys
                f6, f7, rid_low = cr.group, cr._rid_head, cr._rid_low
                ts_v = cr.begin
                if not _as_int32(cr.reconsume_times, &a):
                    return None
                if cr.joined:
                    if cr._end_o is not None or type(cr.success) is not bool:
                        return None
                    end_v, b = cr._end, cr._cost
                    if not _INT_MIN <= b <= _INT_MAX or not _code_of(cr.code, &c):
                        return None
                    kind, okv = _SUB_PAIR, cr.success is True
                else:
                    kind = _SUB_BEFORE
            elif type(r) is tuple:
                size = PyTuple_GET_SIZE(r)
                if size < 9:
                    return None
                kind = <object>PyTuple_GET_ITEM(r, 0)
                f1 = <object>PyTuple_GET_ITEM(r, 1)
                f2 = <object>PyTuple_GET_ITEM(r, 2)
                f3 = <object>PyTuple_GET_ITEM(r, 3)  # msgId
                f4 = <object>PyTuple_GET_ITEM(r, 4)  # keys
                f6 = <object>PyTuple_GET_ITEM(r, 6)  # group
                f7 = <object>PyTuple_GET_ITEM(r, 7)  # request id (tags for Pub)
                rid_low = -1
                if not _is(r, 5, int) or not _as_long(<object>PyTuple_GET_ITEM(r, 5), &ts_v):
                    return None
                if kind is _SUB_PAIR:
                    if (
                        size != 13 or not _is(r, 11, bool) or not _is(r, 9, int)
                        or not _as_long(<object>PyTuple_GET_ITEM(r, 9), &end_v)
                        or not _as_int32(<object>PyTuple_GET_ITEM(r, 8), &a)
                        or not _as_int32(<object>PyTuple_GET_ITEM(r, 10), &b)
                        or not _code_of(<object>PyTuple_GET_ITEM(r, 12), &c)
                    ):
                        return None
                    okv = <object>PyTuple_GET_ITEM(r, 11) is True
                elif kind is _SUB_AFTER:
                    if (
                        size != 11 or not _is(r, 9, bool)
                        or not _as_int32(<object>PyTuple_GET_ITEM(r, 8), &b)
                        or not _code_of(<object>PyTuple_GET_ITEM(r, 10), &c)
                    ):
                        return None
                    okv = <object>PyTuple_GET_ITEM(r, 9) is True
                elif kind is _SUB_BEFORE:
                    if size != 9 or not _as_int32(<object>PyTuple_GET_ITEM(r, 8), &a):
                        return None
                elif kind is _PUB:
                    if size != 14 or not _is(r, 13, bool):
                        return None
                    k = <object>PyTuple_GET_ITEM(r, 11)  # the message type: 0 - 4
                    if type(k) is not int and type(k) is not _MSG_TYPE_ENUM:
                        return None
                    if (
                        not _as_long(k, &c) or not 0 <= c <= 4
                        or not _as_int32(<object>PyTuple_GET_ITEM(r, 9), &a)
                        or not _as_int32(<object>PyTuple_GET_ITEM(r, 10), &b)
                    ):
                        return None
                    okv = <object>PyTuple_GET_ITEM(r, 13) is True
                    f8 = <object>PyTuple_GET_ITEM(r, 8)  # store host
                    f12 = <object>PyTuple_GET_ITEM(r, 12)  # offsetMsgId
                else:
                    return None
            else:
                return None
            # -- one topic and region (as the worker's check: equal)
            if i == 0:
                topic, region = f1, f2
                if (topic is not None and type(topic) is not str) or (
                    region is not None and type(region) is not str
                ):
                    return None
            elif not _same(f1, topic) or not _same(f2, region):
                return None
            # -- the room the record needs: its text fields, 5 numbers of up to 20
            # characters, the kind names and separators (< 60)
            t = _tlen(f3)
            if t < 0:
                return None
            need = t + 160
            t = _tlen(f4)
            if t < 0:
                return None
            need += t
            t = _tlen(f6)
            if t < 0:
                return None
            need += t
            t = _tlen(f7)
            if t < 0:
                return None
            need += t + 2
            if kind is _SUB_PAIR:
                t = _tlen(f2)
                if t < 0:
                    return None
                need += need + t  # (msgId, keys, group and request id twice)
                expected = 17
            elif kind is _SUB_AFTER:
                expected = 9
            elif kind is _SUB_BEFORE:
                t = _tlen(f2)
                if t < 0:
                    return None
                need += t
                expected = 8
            else:  # Pub
                t = _tlen(f1)
                if t < 0:
                    return None
                need += t
                t = _tlen(f2)
                if t < 0:
                    return None
                need += t
                t = _tlen(f8)
                if t < 0:
                    return None
                need += t
                t = _tlen(f12)
                if t < 0:
                    return None
                need += t
                expected = 14
            if used + need > capacity:
                while used + need > capacity:
                    capacity = capacity * 2 if capacity else 65536
                grown = <char*>PyMem_Realloc(data, capacity)
                if grown == NULL:
                    raise MemoryError()
                data = grown
            # -- the text, as write_records writes it
            p = data + used
            if kind is _SUB_PAIR:
                # SubBefore ts region group rid msgId retry keys,
                # SubAfter rid msgId cost ok keys code end group
                p = _lput(p, b"SubBefore\x01", 10)
                p = _dput(p, ts_v)
                p[0] = 1
                p = _tput(p + 1, f2)
                p[0] = 1
                p = _tput(p + 1, f6)
                p[0] = 1
                p = _rput(p + 1, f7, rid_low)
                p[0] = 1
                p = _tput(p + 1, f3)
                p[0] = 1
                p = _dput(p + 1, a)
                p[0] = 1
                p = _tput(p + 1, f4)
                p = _lput(p, b"\x02SubAfter\x01", 10)
                p = _rput(p, f7, rid_low)
                p[0] = 1
                p = _tput(p + 1, f3)
                p[0] = 1
                p = _dput(p + 1, b)
                if okv:
                    p = _lput(p, b"\x01true\x01", 6)
                else:
                    p = _lput(p, b"\x01false\x01", 7)
                p = _tput(p, f4)
                p[0] = 1
                p = _dput(p + 1, c)
                p[0] = 1
                p = _dput(p + 1, end_v)
                p[0] = 1
                p = _tput(p + 1, f6)
                p[0] = 2
                p += 1
            elif kind is _SUB_AFTER:
                # SubAfter rid msgId cost ok keys code ts group
                p = _lput(p, b"SubAfter\x01", 9)
                p = _rput(p, f7, rid_low)
                p[0] = 1
                p = _tput(p + 1, f3)
                p[0] = 1
                p = _dput(p + 1, b)
                if okv:
                    p = _lput(p, b"\x01true\x01", 6)
                else:
                    p = _lput(p, b"\x01false\x01", 7)
                p = _tput(p, f4)
                p[0] = 1
                p = _dput(p + 1, c)
                p[0] = 1
                p = _dput(p + 1, ts_v)
                p[0] = 1
                p = _tput(p + 1, f6)
                p[0] = 2
                p += 1
            elif kind is _SUB_BEFORE:
                # SubBefore ts region group rid msgId retry keys
                p = _lput(p, b"SubBefore\x01", 10)
                p = _dput(p, ts_v)
                p[0] = 1
                p = _tput(p + 1, f2)
                p[0] = 1
                p = _tput(p + 1, f6)
                p[0] = 1
                p = _rput(p + 1, f7, rid_low)
                p[0] = 1
                p = _tput(p + 1, f3)
                p[0] = 1
                p = _dput(p + 1, a)
                p[0] = 1
                p = _tput(p + 1, f4)
                p[0] = 2
                p += 1
            else:
                # Pub ts region group topic msgId tags keys storeHost bodyLength cost msgType
                # offsetMsgId ok
                p = _lput(p, b"Pub\x01", 4)
                p = _dput(p, ts_v)
                p[0] = 1
                p = _tput(p + 1, f2)
                p[0] = 1
                p = _tput(p + 1, f6)
                p[0] = 1
                p = _tput(p + 1, f1)
                p[0] = 1
                p = _tput(p + 1, f3)
                p[0] = 1
                p = _tput(p + 1, f7)
                p[0] = 1
                p = _tput(p + 1, f4)
                p[0] = 1
                p = _tput(p + 1, f8)
                p[0] = 1
                p = _dput(p + 1, a)
                p[0] = 1
                p = _dput(p + 1, b)
                p[0] = 1
                p = _dput(p + 1, c)
                p[0] = 1
                p = _tput(p + 1, f12)
                if okv:
                    p = _lput(p, b"\x01true\x02", 6)
                else:
                    p = _lput(p, b"\x01false\x02", 7)
            # a text field holding a separator: not this path's (the careful way finds which)
            if _separators(<const unsigned char*>(data + used), p - (data + used)) != expected:
                return None
            used = p - data
            ends[i] = used
        # -- the messages: as plan_slices cuts them
        plans = []
        start, before = 0, 0
        while start < n:
            stop = start
            while stop < n and ends[stop] <= before + lim:
                stop += 1
            if stop == start:  # one item longer than a message: sent alone
                oversize += 1
                stop = start + 1
            value = PyBytes_FromStringAndSize(data + before, ends[stop - 1] - before)
            keys = set()
            pairs = 0
            for i in range(start, stop):
                r = batch[i]
                if type(r) is ConsumeRecord:
                    PySet_Add(keys, (<ConsumeRecord>r).msg_id)
                    pairs += (<ConsumeRecord>r).joined
                else:
                    PySet_Add(keys, <object>PyTuple_GET_ITEM(r, 3))
                    if <object>PyTuple_GET_ITEM(r, 0) is _SUB_PAIR:
                        pairs += 1
            any_key = False
            for i in range(start, stop):
                r = batch[i]
                if type(r) is ConsumeRecord:
                    k = (<ConsumeRecord>r).keys
                else:
                    k = <object>PyTuple_GET_ITEM(r, 4)
                if k is None or PyUnicode_GET_LENGTH(k) == 0:
                    continue
                any_key = True
                if " " in k:
                    for piece in k.split(" "):
                        PySet_Add(keys, piece)
                else:
                    PySet_Add(keys, k)
            if not any_key:
                PySet_Add(keys, "")  # ("".split(" ") is [""])
            plans.append((first_seq + start, stop - start + pairs, value, keys))
            before = ends[stop - 1]
            start = stop
        return plans, 0, oversize
    finally:
        PyMem_Free(ends)
        PyMem_Free(data)


# ----------------------------------------------------------------------------- consume tracer

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec* tp)
    int CLOCK_REALTIME


cdef inline long long _now_ms() noexcept:
    # tracemq.clock.now_ms: time.time_ns() // 1_000_000, which reads this clock
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <long long>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef object _KEYS = "KEYS"  # MessageConst.KEYS
# the request ids of ConsumeTracer: one counter for the process, its blocks' top bit set
cdef long long _rid_next = 0
cdef long long _RID_BLOCK_BIT = 1LL << 39
# bumped in a forked child: the tracers then format their request ids' head again
cdef unsigned long _fork_epoch = 0


def _after_fork_in_child():
    global _fork_epoch
    _fork_epoch += 1


import os as _os
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)
import sys as _sys
cdef long long _NEVER_C = _sys.maxsize  # the dispatcher's _NEVER


cdef class DispatcherCore:
    """The queue state of ``AsyncTraceDispatcher`` (its base class when this module is
    built) in C fields: the queue and its bound, the item and record counters, the wake-up
    threshold and the closing flag. Python reads and writes them as attributes, as before;
    ``ConsumeTracer`` reaches them without an attribute look-up (~40 ns each, nine per
    consumed message)."""

    cdef public object _queue
    cdef public Py_ssize_t _queue_size
    cdef public long long _accepted_seq, _records, _want
    cdef public bint _closing


cdef PyMemberDef* _slot(cls, name) except NULL:
    """The member of slot ``name`` of the slotted class ``cls`` (TypeError when it is not a
    slot of cls's own)."""
    import types

    descr = cls.__dict__.get(name)
    if type(descr) is not types.MemberDescriptorType:
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    return (<PyMemberDescrObject*><PyObject*>descr).d_member


cdef inline object _get(object obj, PyMemberDef* m):
    """Slot m of obj, whose type is exactly the slot's class."""
    return PyMember_GetOne(<const char*><PyObject*>obj, m)


cdef class ConsumeTracer:
    """The consumer's per-message trace calls in one compiled step each: the compiled twin of
    ``ConsumeMessageTraceHook.before`` / ``after`` (``tracemq.trace._hooks``, the reference),
    which are the request id, the clock reads, ``one_before`` / ``one_after`` and the
    dispatcher's ``append_sub_before`` / ``join_sub_after`` that they call. It reads and writes
    the dispatcher's queue state as those methods do (the same attributes, reached as
    :class:`DispatcherCore`'s C fields; the queue object
    itself is kept, it is never replaced), but its queue item and token is one
    :class:`ConsumeRecord`, joined in place: the queue, as ``ConsumeRecord.as_tuple`` reads
    it, is the reference's. The request ids have ``tracemq.message_id.new_request_id``'s form
    and prefix, from a counter of their own (see ``_request_id``)."""

    cdef DispatcherCore _d
    cdef object _queue, _trace_topic, _ids
    cdef Py_ssize_t _queue_size
    cdef object _rid_head
    cdef long long _rid_block
    cdef unsigned long _rid_epoch
    # a MessageExt's fields read from its slots, without the attribute look-up (~25 ns
    # each: the type's dictionaries, then the descriptor); any other type the usual way
    cdef object _ext, _mq
    cdef PyMemberDef* _m_queue
    cdef PyMemberDef* _m_topic
    cdef PyMemberDef* _m_msg_id
    cdef PyMemberDef* _m_props
    cdef PyMemberDef* _m_retry
    cdef PyMemberDef* _mq_topic

    def __init__(self, dispatcher, trace_topic):
        from tracemq import message_id
        from tracemq.message import MessageExt, MessageQueue

        if not isinstance(dispatcher, DispatcherCore):
            raise TypeError(
                f"ConsumeTracer needs an AsyncTraceDispatcher built on DispatcherCore, "
                f"not {type(dispatcher).__name__}"
            )
        self._d = <DispatcherCore>dispatcher
        self._queue = dispatcher._queue
        self._queue_size = dispatcher._queue_size
        self._trace_topic = trace_topic
        self._ids = message_id
        self._rid_head = ""
        self._rid_block = -1
        self._rid_epoch = 0
        self._ext = self._mq = None  # (None: no type is: every field read by attribute)
        try:
            self._m_queue = _slot(MessageExt, "queue")
            self._m_topic = _slot(MessageExt, "topic")
            self._m_msg_id = _slot(MessageExt, "msg_id")
            self._m_props = _slot(MessageExt, "properties")
            self._m_retry = _slot(MessageExt, "reconsume_times")
            self._ext = MessageExt
            self._mq_topic = _slot(MessageQueue, "topic")
            self._mq = MessageQueue
        except TypeError:  # (a message class without those slots: by attribute)
            pass

    cdef inline void _request_id(self, ConsumeRecord r):
        """r's request id: new_request_id's form (the msgId prefix, a block of 256 in 10 hex
        digits, 2 more), from this module's counter, whose blocks have the top bit set:
        new_request_id's stay below it (its counter would need 2**47 ids to reach it). The
        head is formatted once per 256 ids and after a fork (the prefix is renewed then)."""
        global _rid_next
        cdef long long n = _rid_next & 0x7FFFFFFFFFFF
        _rid_next += 1
        if self._rid_block != (n >> 8) or self._rid_epoch != _fork_epoch:
            generator = self._ids._default_generator
            if generator is None:
                generator = self._ids._default()
            self._rid_head = f"{generator._prefix}{(n >> 8) | _RID_BLOCK_BIT:010X}"
            self._rid_block = n >> 8
            self._rid_epoch = _fork_epoch
        r._rid_head = self._rid_head
        r._rid_low = n & 0xFF

    def before(self, msg, group, region):
        """``ConsumeMessageTraceHook.before``: the SubBefore of ``msg`` queued; the token for
        :meth:`after` (its ConsumeRecord: number -1 when refused), None when ``msg`` is not
        traced."""
        cdef bint ext = type(msg) is self._ext
        cdef object mq = _get(msg, self._m_queue) if ext else msg.queue
        if (_get(mq, self._mq_topic) if type(mq) is self._mq else mq.topic) == self._trace_topic:
            return None
        cdef ConsumeRecord r = ConsumeRecord.__new__(ConsumeRecord)
        self._request_id(r)
        r.begin = _now_ms()
        r.seq = -1
        cdef DispatcherCore d = self._d
        cdef object queue = self._queue, props
        cdef long long seq
        try:
            if d._closing:
                d._discard("dispatcher shut down")
                return r
            if len(queue) >= self._queue_size:
                d._discard("queue full")
                return r
            if ext:
                props = _get(msg, self._m_props)
                r.topic = _get(msg, self._m_topic)
                r.msg_id = _get(msg, self._m_msg_id)
                r.reconsume_times = _get(msg, self._m_retry)
            else:
                props = msg.properties
                r.topic = msg.topic
                r.msg_id = msg.msg_id
                r.reconsume_times = msg.reconsume_times
            r.region = region
            r.keys = (<dict>props).get(_KEYS) if type(props) is dict else props.get(_KEYS)
            r.group = group
            queue.append(r)
            seq = d._accepted_seq
            d._accepted_seq = seq + 1
            d._records += 1
            r.seq = seq
            if len(queue) >= d._want:
                d._want = _NEVER_C
                d._wakeup.set()
            return r
        except Exception:  # tracing must not break the consumer (as one_before: -1)
            return r

    def after(self, token, msg, group, region, end_at, success, code):
        """``ConsumeMessageTraceHook.after``: the SubAfter of ``msg`` ending at ``end_at``
        (anything but a non-negative ``int``: now), joined to its SubBefore while the worker
        has not sealed that, else queued on its own. Never raises."""
        if type(token) is not ConsumeRecord:  # None: not traced (or not a token of before())
            return
        cdef ConsumeRecord r = <ConsumeRecord>token
        cdef long long end = 0, cost
        cdef int overflow = 0
        cdef object end_o = None, cost_o = None, msg_id
        cdef DispatcherCore d = self._d
        if type(end_at) is int:
            end = PyLong_AsLongLongAndOverflow(end_at, &overflow)
            if overflow > 0:  # beyond a Java long: kept as given (the writer counts it failed)
                end_o = end_at
                cost_o = end_at - r.begin
            elif overflow or end < 0:
                end = _now_ms()
        else:
            end = _now_ms()
        cost = end - r.begin if end > r.begin else 0
        try:
            msg_id = _get(msg, self._m_msg_id) if type(msg) is self._ext else msg.msg_id
            if (
                r.seq >= 0 and not r.sealed and not r.joined and r.msg_id is msg_id
                and not d._closing
            ):
                r._end, r._cost, r._end_o, r._cost_o = end, cost, end_o, cost_o
                r.success = success
                r.code = code
                r.joined = True
                d._records += 1
                return
        except Exception:  # as join_sub_after: too late to join, the SubAfter goes alone
            pass
        try:
            d.append_record(
                (_SUB_AFTER, msg.topic, region, msg.msg_id, msg.properties.get(_KEYS),
                 end if end_o is None else end_o, group, r.request_id,
                 cost if cost_o is None else cost_o, success, code)
            )
        except Exception:  # tracing must not break the consumer (as one_after)
            return


cdef class PubTracer:
    """The producer's per-send trace call in one compiled step: the compiled twin of
    ``SendMessageTraceHook.one_pub`` (``tracemq.trace._hooks``, the reference) and the
    dispatcher's ``append_record`` it calls. It reads and writes the dispatcher's queue state
    as :class:`ConsumeTracer` does (:class:`DispatcherCore`'s C fields; the queue object is
    kept, it is never replaced); its queue item is the reference's raw record, the same tuple.
    In the running producer the two Python calls cost ~1 µs per send (py-spy, a latency-bound
    producer: cold caches between sends), most of it the calls and attribute look-ups."""

    cdef DispatcherCore _d
    cdef object _queue, _trace_topic
    # a Message's, QueueRoute's and SendResult's fields read from their slots (as
    # ConsumeTracer's; a Message's keys_str, a property, computed here as it computes it)
    cdef object _msg, _qr, _res, _sep
    cdef PyMemberDef* _m_topic
    cdef PyMemberDef* _m_keys
    cdef PyMemberDef* _m_tags
    cdef PyMemberDef* _m_body
    cdef PyMemberDef* _q_trace_on
    cdef PyMemberDef* _q_address
    cdef PyMemberDef* _q_region
    cdef PyMemberDef* _r_offset_msg_id

    def __init__(self, dispatcher, trace_topic):
        from tracemq.message import Message, MessageConst, SendResult
        from tracemq.routing.model import QueueRoute

        if not isinstance(dispatcher, DispatcherCore):
            raise TypeError(
                f"PubTracer needs an AsyncTraceDispatcher built on DispatcherCore, "
                f"not {type(dispatcher).__name__}"
            )
        self._d = <DispatcherCore>dispatcher
        self._queue = dispatcher._queue
        self._trace_topic = trace_topic
        self._sep = MessageConst.KEY_SEPARATOR
        self._msg = self._qr = self._res = None  # (None: no type is: read by attribute)
        try:
            self._m_topic = _slot(Message, "topic")
            self._m_keys = _slot(Message, "keys")
            self._m_tags = _slot(Message, "tags")
            self._m_body = _slot(Message, "body")
            self._msg = Message
        except TypeError:
            pass
        try:
            self._q_trace_on = _slot(QueueRoute, "trace_on")
            self._q_address = _slot(QueueRoute, "address")
            self._q_region = _slot(QueueRoute, "region_id")
            self._qr = QueueRoute
        except TypeError:
            pass
        try:
            self._r_offset_msg_id = _slot(SendResult, "offset_msg_id")
            self._res = SendResult
        except TypeError:
            pass

    def one_pub(self, msg, msg_id, group, queue, begin, end, msg_type, result):
        """``SendMessageTraceHook.one_pub``: the Pub of one send attempt of ``msg`` to a
        queue of ``queue`` (``result`` None: it failed) queued. Never raises."""
        cdef DispatcherCore d = self._d
        cdef object q = self._queue, record, topic, store_host = None, offset_msg_id = None
        cdef object keys, keys_str, tags, body, region
        cdef bint qr = type(queue) is self._qr, m = type(msg) is self._msg
        try:
            if not (_get(queue, self._q_trace_on) if qr else queue.trace_on):
                return
            topic = _get(msg, self._m_topic) if m else msg.topic
            if topic == self._trace_topic:
                return
            if result is not None:
                store_host = _get(queue, self._q_address) if qr else queue.address
                offset_msg_id = (
                    _get(result, self._r_offset_msg_id) if type(result) is self._res
                    else result.offset_msg_id
                )
            region = _get(queue, self._q_region) if qr else queue.region_id
            if m:
                keys = _get(msg, self._m_keys)
                keys_str = self._sep.join(keys) if keys else None  # (Message.keys_str)
                tags = _get(msg, self._m_tags)
                body = _get(msg, self._m_body)
            else:
                keys_str, tags, body = msg.keys_str, msg.tags, msg.body
            record = (
                _PUB, topic, region, msg_id, keys_str, begin, group, tags, store_host,
                len(body), end - begin if end > begin else 0, msg_type, offset_msg_id,
                result is not None,
            )
            if d._closing:
                d._discard("dispatcher shut down")
                return
            if len(q) >= d._queue_size:
                d._discard("queue full")
                return
            q.append(record)
            d._accepted_seq += 1
            d._records += 1
            if len(q) >= d._want:
                d._want = _NEVER_C
                d._wakeup.set()
        except Exception:  # tracing must not break the producer (as one_pub)
            return
