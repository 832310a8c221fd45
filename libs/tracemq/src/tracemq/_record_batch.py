"""A Kafka record batch holding one record, written with a hardware CRC-32C.

:meth:`tracemq._kafka.ProducerPool.send_alone` sends each trace message (a ~128 kB body and a
~18 kB KEYS header) in a produce request of its own. The batch is what aiokafka's
``DefaultRecordBatchBuilder`` writes for the record alone (magic 2, no compression, no producer
id, no partition leader epoch), byte for byte (tests/unit/test_record_batch.py holds them
equal), but its CRC-32C comes from ``google-crc32c`` (SSE 4.2 / ARMv8 instructions: ~5 us per
136 kB against ~69 us for aiokafka's table-driven one, a quarter of the client's CPU per trace
message) and the record is copied once, into the batch, instead of into a growing buffer.
:func:`produce_request_body` writes the produce request around it in the same single buffer
(aiokafka's encoder copies the batch once per level of the request's nesting).

A trace message's batch may be compressed (:func:`codec`; zstd by default, see
:class:`tracemq.trace.AsyncTraceDispatcher`): the records' bytes replaced by their compressed
form and the codec's id in the batch's attributes, as every Kafka producer writes it; aiokafka
(and any Kafka consumer) reads it back transparently.

Kafka's format (KIP-98): a 61-byte header — base offset, length of the rest, partition leader
epoch, magic, the CRC-32C (Castagnoli) of everything after it — then the records, each a
length-prefixed run of varints (zig-zag encoded, as protobuf's sint) and bytes.
"""

from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Callable, Sequence

import cramjam

try:
    import google_crc32c

    #: True when the CRC is computed by the CPU's instructions; otherwise google-crc32c's
    #: pure-Python fallback is far slower than aiokafka's C code, and send_alone keeps that.
    HARDWARE_CRC = google_crc32c.implementation == "c"
except ImportError:  # (a dependency of tracemq; kept optional for the same reason)
    HARDWARE_CRC = False

# base offset, length after this field, partition leader epoch, magic, CRC
_HEAD = struct.Struct(">qiibI")
# attributes, last offset delta, first and max timestamps, producer id and epoch, base
# sequence, record count: the part the CRC covers starts here
_TAIL = struct.Struct(">hiqqqhii")
_NO_PARTITION_LEADER_EPOCH = -1
_MAGIC = 2
# the record's attributes (0), timestamp delta (0), offset delta (0), key length (-1: null)
_RECORD_START = b"\x00\x00\x00\x01"
# a produce request's fields around the batch (Kafka's protocol: big-endian, strings and bytes
# length-prefixed, arrays counted)
_NULL_STRING = struct.pack(">h", -1)
_ACKS_TIMEOUT = struct.Struct(">hi")
_ONE_ENTRY = struct.pack(">i", 1)
_STRING_LENGTH = struct.Struct(">h")
_PARTITION_SIZE = struct.Struct(">ii")


#: Kafka's codec ids (the low three bits of a batch's attributes) of the codecs a trace message
#: may be compressed with, by the name ``AsyncTraceDispatcher(compression=...)`` takes
CODEC_IDS = {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4}
#: the oldest produce request version a broker takes a zstd batch in (KIP-110: Kafka 2.1)
ZSTD_MIN_PRODUCE_VERSION = 7

#: A codec: its id and its compressor of the records' bytes.
Codec = tuple[int, Callable[[bytes], bytes]]


def _zstd(data: bytes) -> bytes:
    # level 1: on trace text (~100 kB) ~135 us for a fifth of the size; Kafka's default
    # level 3 takes ~200 us for no smaller a result
    return bytes(cramjam.zstd.compress(data, level=1))


def _lz4(data: bytes) -> bytes:
    # Kafka's LZ4 framing (KIP-57): independent blocks, no content checksum
    c = cramjam.lz4.Compressor(level=1, content_checksum=False, block_linked=False)
    c.compress(data)
    return bytes(c.finish())


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


_COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {"gzip": _gzip, "lz4": _lz4, "zstd": _zstd}


def codec(name: str) -> Codec | None:
    """The codec called ``name`` (a key of :data:`CODEC_IDS`); None for ``"none"``.

    Raises:
        ValueError: an unknown name (naming the ones there are)."""
    if name not in CODEC_IDS:
        known = ", ".join(sorted(CODEC_IDS))
        raise ValueError(f"unknown compression {name!r}: one of {known}")
    if name == "none":
        return None
    return CODEC_IDS[name], _COMPRESSORS[name]


def _varint(value: int) -> bytes:
    """Kafka's varint (zig-zag, then 7 bits a byte, low bits first) of a signed 64-bit int."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _batch_parts(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    timestamp_ms: int | None,
    compression: Codec | None = None,
) -> tuple[list[bytes], int]:
    """The pieces of a one-record batch, in order, and their total length; with
    ``compression`` the record (its length prefix included) compressed."""
    if timestamp_ms is None:
        timestamp_ms = time.time_ns() // 1_000_000
    parts = [_RECORD_START]
    if value is None:
        parts.append(b"\x01")  # varint(-1)
    else:
        parts.append(_varint(len(value)))
        parts.append(value)
    parts.append(_varint(len(headers)))
    for key, header_value in headers:
        name = key.encode()
        parts.append(_varint(len(name)))
        parts.append(name)
        if header_value is None:
            parts.append(b"\x01")
        else:
            parts.append(_varint(len(header_value)))
            parts.append(header_value)
    record_length = sum(map(len, parts))
    records = [_varint(record_length), *parts]
    records_length = len(records[0]) + record_length
    attributes = 0
    if compression is not None:
        attributes, compress = compression
        records = [compress(b"".join(records))]
        records_length = len(records[0])
    tail = _TAIL.pack(attributes, 0, timestamp_ms, timestamp_ms, -1, -1, -1, 1)
    crc = google_crc32c.value(tail)
    for part in records:
        crc = google_crc32c.extend(crc, part)
    after_length = _HEAD.size - 12 + len(tail) + records_length
    head = _HEAD.pack(0, after_length, _NO_PARTITION_LEADER_EPOCH, _MAGIC, crc)
    return [head, tail, *records], 12 + after_length


def one_record_batch(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    timestamp_ms: int | None = None,
    compression: Codec | None = None,
) -> bytes:
    """The record batch of one record with no key: ``value``, ``headers`` (UTF-8 keys), created
    at ``timestamp_ms`` (now by default), compressed with ``compression`` (:func:`codec`) if
    given. Needs :data:`HARDWARE_CRC` (or is slow)."""
    return b"".join(_batch_parts(value, headers, timestamp_ms, compression)[0])


def produce_request_body(
    api_version: int,
    required_acks: int,
    timeout_ms: int,
    topic: str,
    partition: int,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    timestamp_ms: int | None = None,
    compression: Codec | None = None,
) -> tuple[bytes, int]:
    """The body of a produce request (versions 0 - 8: Kafka's non-flexible ones; no
    transactional id) of :func:`one_record_batch` for ``topic``'s ``partition``, written in one
    buffer, and where the batch starts in it. aiokafka's encoder writes the same bytes
    (tests/unit/test_record_batch.py) but copies the batch once per level of the request's
    nesting: five copies of a ~150 kB trace message, each a fresh allocation that glibc's
    malloc maps and unmaps (~60 - 300 us of the client's CPU per request here, against ~10).
    ``compression``: see :func:`one_record_batch` (zstd needs version 7 or later: the caller
    checks, :data:`ZSTD_MIN_PRODUCE_VERSION`)."""
    if not 0 <= api_version <= 8:
        raise ValueError(f"produce request version {api_version} is not written here (0 - 8)")
    name = topic.encode()
    parts, batch_length = _batch_parts(value, headers, timestamp_ms, compression)
    # (transactional id: a null string) acks, timeout; one topic of one partition, its batch
    prefix = b"".join(
        (
            _NULL_STRING if api_version >= 3 else b"",
            _ACKS_TIMEOUT.pack(required_acks, timeout_ms),
            _ONE_ENTRY,
            _STRING_LENGTH.pack(len(name)),
            name,
            _ONE_ENTRY,
            _PARTITION_SIZE.pack(partition, batch_length),
        )
    )
    return b"".join((prefix, *parts)), len(prefix)
