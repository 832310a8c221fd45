"""tracemq._record_batch: the one-record batch send_alone writes is, byte for byte, the one
aiokafka's DefaultRecordBatchBuilder writes for the same record, and aiokafka reads it back with
a valid CRC; the produce request body around it is aiokafka's encoding of that request, for
every version aiokafka speaks; Kafka's zig-zag varints at their edges."""

from __future__ import annotations

import time

import pytest
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import encode_varint
from hypothesis import given, settings
from hypothesis import strategies as st
from tracemq import _record_batch
from tracemq._record_batch import one_record_batch, produce_request_body

_HEADERS = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=300))), max_size=6
)
_VALUES = st.one_of(st.none(), st.binary(max_size=3000))
_TIMESTAMPS = st.integers(min_value=0, max_value=2**63 - 1)


def _aiokafka(value: bytes | None, headers: list[tuple[str, bytes | None]], ts: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    assert builder.append(0, timestamp=ts, key=None, value=value, headers=headers) is not None
    return bytes(builder.build())


@settings(max_examples=300, deadline=None)
@given(_VALUES, _HEADERS, _TIMESTAMPS)
def test_the_batch_is_aiokafkas(
    value: bytes | None, headers: list[tuple[str, bytes | None]], ts: int
) -> None:
    assert one_record_batch(value, headers, ts) == _aiokafka(value, headers, ts)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 127, 128, 8191, 8192, 136_000, 1 << 21])
def test_large_values_and_length_edges(size: int) -> None:
    value = bytes(range(256)) * (size // 256) + bytes(size % 256)
    headers: list[tuple[str, bytes | None]] = [("KEYS", b"k" * size), ("UNIQ_KEY", b"U" * 32)]
    ours = one_record_batch(value, headers, 1_764_390_000_123)
    assert ours == _aiokafka(value, headers, 1_764_390_000_123)
    batch = DefaultRecordBatch(ours)
    assert batch.validate_crc()
    [record] = list(batch)
    assert record.value == value and record.key is None
    assert list(record.headers) == headers
    assert record.timestamp == 1_764_390_000_123


def test_stamped_now_by_default() -> None:
    before = time.time_ns() // 1_000_000
    [record] = list(DefaultRecordBatch(one_record_batch(b"v", [])))
    assert before <= record.timestamp <= time.time_ns() // 1_000_000


@pytest.mark.parametrize(
    "n", [0, 1, -1, 63, -64, 64, -65, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]
)
def test_varints_are_kafkas(n: int) -> None:
    expected = bytearray()
    encode_varint(n, expected.append)
    assert _record_batch._varint(n) == bytes(expected)


def test_the_crc_is_the_cpus_here() -> None:
    # (google-crc32c's C extension ships in its wheels for x86-64 and arm64; its pure-Python
    # fallback would make send_alone slower than aiokafka's builder, so it keeps that instead)
    import platform

    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        pytest.skip("google-crc32c has no compiled wheel for this machine")
    assert _record_batch.HARDWARE_CRC


def _aiokafka_request(version: int, acks: int, timeout: int, topic: str, partition: int,
                      batch: bytes) -> bytes:  # fmt: skip
    [cls] = [k for k in ProduceRequest._CLASSES if k.API_VERSION == version]
    request = ProduceRequest(None, acks, timeout, [(topic, [(partition, batch)])])
    return bytes(request.build(cls).encode())


_VERSIONS = sorted(k.API_VERSION for k in ProduceRequest._CLASSES)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(_VERSIONS),
    st.sampled_from([-1, 0, 1]),
    st.integers(0, 2**31 - 1),
    st.text(min_size=1, max_size=40),
    st.integers(0, 2**31 - 1),
    _VALUES,
    _HEADERS,
    _TIMESTAMPS,
)
def test_the_produce_request_body_is_aiokafkas(
    version: int, acks: int, timeout: int, topic: str, partition: int,
    value: bytes | None, headers: list[tuple[str, bytes | None]], ts: int,
) -> None:  # fmt: skip
    body, batch_at = produce_request_body(version, acks, timeout, topic, partition, value,
                                          headers, ts)  # fmt: skip
    batch = one_record_batch(value, headers, ts)
    assert body[batch_at:] == batch
    assert body == _aiokafka_request(version, acks, timeout, topic, partition, batch)


@pytest.mark.parametrize("version", [-1, 9, 13])
def test_a_produce_request_version_it_does_not_write_is_refused(version: int) -> None:
    with pytest.raises(ValueError, match=f"version {version}"):
        produce_request_body(version, 1, 1000, "t", 0, b"v", [])


# ----------------------------------------------------------------------------- compression

_CODECS = ["gzip", "lz4", "zstd"]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(_CODECS), _VALUES, _HEADERS, _TIMESTAMPS)
def test_a_compressed_batch_reads_back_as_sent(
    name: str, value: bytes | None, headers: list[tuple[str, bytes | None]], ts: int
) -> None:
    raw = one_record_batch(value, headers, ts, _record_batch.codec(name))
    batch = DefaultRecordBatch(raw)
    assert batch.compression_type == _record_batch.CODEC_IDS[name]
    assert batch.validate_crc()
    [record] = list(batch)
    assert record.value == value and record.key is None
    assert list(record.headers) == headers
    assert record.timestamp == ts


@pytest.mark.parametrize("name", _CODECS)
def test_trace_text_shrinks(name: str) -> None:
    text = b"".join(
        b"SubAfter\x01%d\x01DefaultRegion\x01CG_%d\x01%032X\x0112\x01true\x01key%d\x01\x02"
        % (1_764_390_000_000 + i, i % 3, i * 7919, i)
        for i in range(1000)
    )
    plain = one_record_batch(text, [("KEYS", b"K" * 18_000)], 1)
    packed = one_record_batch(text, [("KEYS", b"K" * 18_000)], 1, _record_batch.codec(name))
    assert len(packed) * 2 < len(plain)
    [record] = list(DefaultRecordBatch(packed))
    assert record.value == text


def test_no_compression_is_the_plain_batch() -> None:
    assert _record_batch.codec("none") is None
    assert one_record_batch(b"v", [], 5, _record_batch.codec("none")) == _aiokafka(b"v", [], 5)


@pytest.mark.parametrize("name", ["", "ZSTD", "snappy", "brotli"])
def test_an_unknown_codec_is_named(name: str) -> None:
    with pytest.raises(ValueError, match=f"unknown compression {name!r}: one of gzip, lz4"):
        _record_batch.codec(name)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_VERSIONS), st.sampled_from(_CODECS), _VALUES, _HEADERS, _TIMESTAMPS)
def test_a_compressed_produce_request_is_aiokafkas_around_the_batch(
    version: int, name: str, value: bytes | None, headers: list[tuple[str, bytes | None]],
    ts: int,
) -> None:  # fmt: skip
    codec = _record_batch.codec(name)
    body, batch_at = produce_request_body(version, -1, 3000, "t", 3, value, headers, ts, codec)
    batch = one_record_batch(value, headers, ts, codec)
    assert body[batch_at:] == batch
    assert body == _aiokafka_request(version, -1, 3000, "t", 3, batch)
