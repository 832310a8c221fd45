"""RocketMQ message identities: the client-side ``msgId`` and the broker-side ``offsetMsgId``.

msgId (RocketMQ's ``UNIQ_KEY`` property) is 16 bytes written as 32 upper-case hex digits::

    client IPv4 (4) | pid & 0xFFFF (2) | salt (4) | ms since month start (4) | counter (2)

or, when the client's address is IPv6, 28 bytes (56 hex digits) with the 16-byte address first.
The fixed prefix (address, pid, salt) is rendered to hex once per generator. The time field only
holds the offset from the start of the current month (a month of milliseconds fits in 32 bits),
so decoding needs a reference time to know which month is meant.

**Time zone.** As RocketMQ's MessageClientIDSetter does, the month starts at local midnight of the
1st *in the producer's time zone* (default: this host's zone, as the JVM's default; the setting
``TRACEMQ_MSGID_TIMEZONE`` names another, e.g. ``Asia/Shanghai``). Decoding needs the producer's
zone: the offset is elapsed milliseconds since that zone's month start, so DST changes inside
the month do not matter, and month boundaries are exact.

**Ids ahead of the reader's clock.** RocketMQ reads an id whose time is at or after "now" as last
month's. tracemq allows a day of forward skew (the producer's clock may be ahead of the reader's)
and only reads an id more than a day ahead as last month's: a skewed clock no longer moves a
fresh message a month back, at the price that an id 27+ days old read on the 1st of the month
after a 28-day month comes out a day ahead (see the tests at that edge).

offsetMsgId is 16 bytes written as 32 upper-case hex digits::

    store host IPv4 (4) | store port (4, big-endian) | physical offset (8, big-endian)

or 28 bytes (56 hex digits) with a 16-byte IPv6 store host, as RocketMQ's MessageDecoder writes.

RocketMQ puts a commit-log offset in the last 8 bytes. tracemq has no commit log; it
stores ``(queue_id << 48) | kafka_offset``, which names the Kafka record the message
became and keeps the id the same shape RocketMQ tools expect.
"""

from __future__ import annotations

import calendar
import contextlib
import functools
import ipaddress
import itertools
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tracemq.clock import now_ms as _now_ms

__all__ = [
    "MAX_KAFKA_OFFSET",
    "MAX_QUEUE_ID",
    "MessageIdGenerator",
    "MSGID_TIMEZONE_ENV",
    "MsgIdInfo",
    "OffsetMsgIdInfo",
    "decode_msg_id",
    "decode_offset_msg_id",
    "encode_offset_msg_id",
    "local_ipv4",
    "msg_id_created_ms",
    "msg_id_source",
    "msgid_zone",
    "new_msg_id",
    "zone_named",
]

_HEX_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")
_PORT = re.compile(r"[0-9]{1,5}")
_DAY_MS = 86_400_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LOOPBACK = "127.0.0.1"
# TEST-NET-1 (RFC 5737): never routed on the internet, so nothing real is ever addressed.
_PROBE_ADDRESS = ("192.0.2.1", 9)

MAX_QUEUE_ID = 0xFFFF
MAX_KAFKA_OFFSET = 2**48 - 1


MSGID_TIMEZONE_ENV = "TRACEMQ_MSGID_TIMEZONE"


@functools.lru_cache(maxsize=64)
def zone_named(name: str | None) -> tzinfo:
    """The zone called ``name`` (IANA, e.g. ``Europe/Berlin``); ``None`` or ``""``: this host's.

    Raises:
        ValueError: no such zone; the message names it.
    """
    if name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {name!r} (an IANA name such as 'Asia/Shanghai' or 'UTC')"
            ) from None
    return _host_zone()


def _host_zone() -> tzinfo:
    """This host's zone with its DST rules (as the JVM's default zone), not a fixed offset."""
    tz = os.environ.get("TZ", "").lstrip(":")
    if tz:
        with contextlib.suppress(ZoneInfoNotFoundError, ValueError, OSError):
            return ZoneInfo(tz)
    with contextlib.suppress(OSError, ValueError), open("/etc/localtime", "rb") as f:
        return ZoneInfo.from_file(f, key="localtime")
    return UTC


def msgid_zone() -> tzinfo:
    """The zone msgIds are written and read in: ``TRACEMQ_MSGID_TIMEZONE``, else the host's."""
    try:
        return zone_named(os.environ.get(MSGID_TIMEZONE_ENV) or None)
    except ValueError as exc:
        raise ValueError(f"{MSGID_TIMEZONE_ENV}: {exc}") from None


def _month_bounds(now_ms: int, zone: tzinfo = UTC) -> tuple[int, int]:
    """Start of the month (in ``zone``) containing ``now_ms`` and start of the next, epoch ms."""
    # Timedelta arithmetic rather than fromtimestamp(): it is exact and handles any sign.
    if zone is UTC:
        moment = _EPOCH + timedelta(milliseconds=now_ms)
        year, month = moment.year, moment.month
        start = calendar.timegm((year, month, 1, 0, 0, 0)) * 1000
        next_year, next_month = (year + 1, 1) if month == 12 else (year, month + 1)
        end = calendar.timegm((next_year, next_month, 1, 0, 0, 0)) * 1000
        return start, end
    local = (_EPOCH + timedelta(milliseconds=now_ms)).astimezone(zone)
    year, month = local.year, local.month
    next_year, next_month = (year + 1, 1) if month == 12 else (year, month + 1)
    return _local_midnight_ms(year, month, zone), _local_midnight_ms(next_year, next_month, zone)


def _local_midnight_ms(year: int, month: int, zone: tzinfo) -> int:
    # fold=0: a midnight skipped by a DST gap takes the offset before the change, and a
    # repeated one its first occurrence — the instants Java's lenient Calendar gives.
    start = datetime(year, month, 1, tzinfo=zone) - _EPOCH
    return (start.days * 86_400 + start.seconds) * 1000 + start.microseconds // 1000


def _ip_bytes(value: str, what: str) -> bytes:
    try:
        return ipaddress.ip_address(value).packed
    except ValueError:
        raise ValueError(
            f"{what} must be an IPv4 (dotted) or IPv6 address, got {value!r}"
        ) from None


def _hex_id(value: str, what: str) -> bytes:
    if not isinstance(value, str) or _HEX_ID.fullmatch(value) is None:
        raise ValueError(
            f"{what} must be 32 hexadecimal characters (56 with an IPv6 address), got {value!r}"
        )
    return bytes.fromhex(value)


def _address(raw: bytes) -> str:
    return str(ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw))


@functools.cache
def local_ipv4() -> str:
    """This host's first non-loopback IPv4 address, or ``127.0.0.1`` if none is found.

    Connecting a UDP socket only asks the kernel for a route, so no packet leaves the host
    and no name lookup is made. Computed once per process.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_PROBE_ADDRESS)
            address = ipaddress.IPv4Address(probe.getsockname()[0])
    except (OSError, ValueError):
        return _LOOPBACK
    if address.is_loopback or address.is_unspecified:
        return _LOOPBACK
    return str(address)


# Generators whose identity must be renewed in a forked child; weak so they can still die.
_GENERATORS: weakref.WeakSet[MessageIdGenerator] = weakref.WeakSet()


class MessageIdGenerator:
    """Thread-safe generator of RocketMQ msgIds (``UNIQ_KEY``).

    Each generator draws its own random salt, so two generators in one process do not
    collide. In a forked child every generator takes the child's pid and a fresh salt,
    since otherwise parent and child would issue the same ids.

    Args:
        ip: address to embed, IPv4 (32-character ids) or IPv6 (56); defaults to
            :func:`local_ipv4`.
        clock: returns the current epoch time in milliseconds; for tests.
        tz: the zone whose month the ids count from (a zone name or tzinfo); defaults to
            :func:`msgid_zone` (``TRACEMQ_MSGID_TIMEZONE``, else the host's zone).

    Raises:
        ValueError: ``ip`` is not an IP address, or ``tz`` names no zone.
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_counter",
        "_head",
        "_ip_bytes",
        "_last_ms",
        "_lock",
        "_month_start",
        "_next_month_start",
        "_pid",
        "_prefix",
        "_salt",
        "_zone",
    )

    def __init__(
        self,
        ip: str | None = None,
        *,
        clock: Callable[[], int] | None = None,
        tz: str | tzinfo | None = None,
    ) -> None:
        self._ip_bytes = _ip_bytes(local_ipv4() if ip is None else ip, "ip")
        self._zone = msgid_zone() if tz is None else zone_named(tz) if isinstance(tz, str) else tz
        self._clock = clock  # None: the system clock (tracemq.clock.now_ms), read inline
        # An empty window forces the month to be computed on the first call.
        self._month_start = 0
        self._next_month_start = 0
        self._last_ms = 0
        self._renew_identity()
        _GENERATORS.add(self)

    def _renew_identity(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid() & 0xFFFF
        self._salt = secrets.randbits(32)
        prefix = self._ip_bytes + self._pid.to_bytes(2, "big") + self._salt.to_bytes(4, "big")
        self._prefix = prefix.hex().upper()
        self._head = ""  # prefix and time field of _last_ms, rendered
        self._last_ms = -1  # the head must be re-rendered with the new prefix
        self._counter = 0

    @property
    def ip(self) -> str:
        """The address embedded in every id."""
        return _address(self._ip_bytes)

    @property
    def zone(self) -> tzinfo:
        """The zone whose months the ids count from."""
        return self._zone

    @property
    def pid(self) -> int:
        """The process id (low 16 bits) embedded in every id."""
        return self._pid

    @property
    def salt(self) -> int:
        """This generator's random salt."""
        return self._salt

    def next(self) -> str:
        """Return a new msgId: 32 upper-case hex characters (56 with an IPv6 address)."""
        with self._lock:
            now = time.time_ns() // 1_000_000 if self._clock is None else self._clock()
            counter = self._counter
            self._counter = (counter + 1) & 0xFFFF
            if now == self._last_ms:  # the usual case under load: the head is rendered already
                return f"{self._head}{counter:04X}"
            if not self._month_start <= now < self._next_month_start:
                self._month_start, self._next_month_start = _month_bounds(now, self._zone)
            elif now < self._last_ms:
                # The wall clock stepped back; reusing earlier stamps could repeat ids.
                now = self._last_ms
            self._last_ms = now
            self._head = f"{self._prefix}{now - self._month_start:08X}"
            return f"{self._head}{counter:04X}"


def _renew_after_fork() -> None:
    for generator in list(_GENERATORS):
        generator._renew_identity()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_after_fork)


_default_generator: MessageIdGenerator | None = None
_default_lock = threading.Lock()


def _default() -> MessageIdGenerator:
    global _default_generator
    generator = _default_generator
    if generator is None:
        # Created lazily so importing this module never touches the network stack.
        with _default_lock:
            if _default_generator is None:
                _default_generator = MessageIdGenerator()
            generator = _default_generator
    return generator


def new_msg_id() -> str:
    """Return a new msgId from the process-wide default generator."""
    return _default().next()


def msg_id_source() -> Callable[[], str]:
    """:func:`new_msg_id` without its look-up of the default generator, for a caller that makes
    one per message (the generator renews its identity in a forked child, so it stays valid)."""
    return _default().next


_request_counter = itertools.count()
#: the last 2 hex digits of a request id; the 10 before them change every 256 ids
_HEX2 = tuple(f"{i:02X}" for i in range(256))
#: (msgId prefix, counter // 256, the id's first 30 characters for them)
_request_head: tuple[str, int, str] = ("", -1, "")


def new_request_id() -> str:
    """A process-unique id pairing a SubBefore with its SubAfter (RocketMQ's requestId): 32
    upper-case hex characters, this process's msgId prefix (IPv4, pid, salt) and a counter.
    Cheaper than :func:`new_msg_id` (no clock, no lock): one is made per consumed message, so
    the head is formatted once per 256 ids. Thread-safe: the counter is, and the head is a
    function of the prefix and the counter."""
    global _request_head
    prefix = (_default_generator or _default())._prefix  # renewed after a fork, as msgIds
    n = next(_request_counter) & 0xFFFFFFFFFFFF
    known_prefix, block, head = _request_head
    if block != n >> 8 or known_prefix is not prefix:
        head = f"{prefix}{n >> 8:010X}"
        _request_head = (prefix, n >> 8, head)
    return head + _HEX2[n & 0xFF]


@dataclass(frozen=True, slots=True)
class MsgIdInfo:
    """The parts of a decoded msgId.

    Attributes:
        ip: client address (IPv4, or IPv6 for a 56-character id).
        pid: low 16 bits of the client's process id.
        salt: the generator's random salt.
        timestamp_ms: creation time in epoch milliseconds, reconstructed from the
            month-relative offset the id holds.
        counter: per-generator sequence number (wraps at 65536).
    """

    ip: str
    pid: int
    salt: int
    timestamp_ms: int
    counter: int


def msg_id_created_ms(offset_ms: int, now_ms: int, zone: tzinfo = UTC) -> int:
    """The creation instant of an id holding ``offset_ms`` since a month start in ``zone``,
    read at ``now_ms``: the month containing ``now_ms``, unless that puts the creation more
    than a day after ``now_ms`` (clock skew allowed), in which case the previous month.

    This is the one definition of the rule; the Spark job applies the same arithmetic."""
    month_start, _ = _month_bounds(now_ms, zone)
    timestamp = month_start + offset_ms
    if timestamp > now_ms + _DAY_MS:
        previous_month_start, _ = _month_bounds(month_start - 1, zone)
        timestamp = previous_month_start + offset_ms
    return timestamp


def decode_msg_id(
    msg_id: str, now_ms: int | None = None, *, tz: str | tzinfo | None = None
) -> MsgIdInfo:
    """Split a msgId into its parts.

    The id holds milliseconds since the start of a month in the producer's zone but not
    which month: see :func:`msg_id_created_ms`.

    Args:
        msg_id: 32 hex characters (56 with an IPv6 address), either case.
        now_ms: reference time in epoch milliseconds; defaults to now.
        tz: the producer's zone (name or tzinfo); defaults to :func:`msgid_zone`.

    Raises:
        ValueError: ``msg_id`` is not 32 or 56 hex characters, or ``tz`` names no zone.
    """
    raw = _hex_id(msg_id, "msgId")
    zone = msgid_zone() if tz is None else zone_named(tz) if isinstance(tz, str) else tz
    now = _now_ms() if now_ms is None else now_ms
    a = len(raw) - 12  # address length: 4 or 16
    return MsgIdInfo(
        ip=_address(raw[0:a]),
        pid=int.from_bytes(raw[a : a + 2], "big"),
        salt=int.from_bytes(raw[a + 2 : a + 6], "big"),
        timestamp_ms=msg_id_created_ms(int.from_bytes(raw[a + 6 : a + 10], "big"), now, zone),
        counter=int.from_bytes(raw[a + 10 : a + 12], "big"),
    )


@dataclass(frozen=True, slots=True)
class OffsetMsgIdInfo:
    """The parts of a decoded offsetMsgId.

    Attributes:
        store_host: ``ip:port`` of the broker that stored the message.
        queue_id: queue (Kafka partition) the message is in.
        kafka_offset: offset of the message's Kafka record in that partition.
    """

    store_host: str
    queue_id: int
    kafka_offset: int


@functools.lru_cache(maxsize=1024)
def _parse_store_host(store_host: str) -> tuple[bytes, int]:
    host, colon, port = store_host.rpartition(":")
    if not colon or _PORT.fullmatch(port) is None or int(port) > 0xFFFF:
        raise ValueError(
            f"store host must be 'a.b.c.d:port' or '[v6]:port' with a port in 0..65535, "
            f"got {store_host!r}"
        )
    try:
        if host.startswith("[") and host.endswith("]"):
            ip = ipaddress.IPv6Address(host[1:-1]).packed
        else:
            ip = ipaddress.IPv4Address(host).packed
    except ValueError:
        raise ValueError(
            f"store host must be a dotted IPv4 address or a bracketed IPv6 address and a "
            f"port, got {store_host!r}"
        ) from None
    return ip, int(port)


def encode_offset_msg_id(store_host: str, queue_id: int, kafka_offset: int) -> str:
    """Build the offsetMsgId of a stored message.

    Args:
        store_host: ``a.b.c.d:port`` or ``[v6]:port`` of the broker; host names are not
            resolved.
        queue_id: queue id, 0..65535.
        kafka_offset: Kafka record offset, 0..2**48-1.

    Returns:
        32 upper-case hex characters (56 for an IPv6 store host).

    Raises:
        ValueError: an argument is malformed or out of range; the message names it.
    """
    # (once per sent and per consumed message: the host and queue part, 20 of the 32
    # characters, is rendered once per queue; the offset's 12 digits are all that is left)
    head = _queue_head(store_host, queue_id)
    if not 0 <= kafka_offset <= MAX_KAFKA_OFFSET:
        raise ValueError(f"kafka_offset must be in 0..2**48-1, got {kafka_offset}")
    return f"{head}{kafka_offset:012X}"


@functools.lru_cache(maxsize=4096)
def _queue_head(store_host: str, queue_id: int) -> str:
    """The store host's and queue's part of an offsetMsgId: the offset field is
    ``(queue_id << 48) | kafka_offset``, so its first 4 hex digits are the queue's."""
    head = _store_host_head(store_host)
    if not 0 <= queue_id <= MAX_QUEUE_ID:
        raise ValueError(f"queue_id must be in 0..{MAX_QUEUE_ID}, got {queue_id}")
    return f"{head}{queue_id:04X}"


@functools.lru_cache(maxsize=1024)
def _store_host_head(store_host: str) -> str:
    """The store host's part of an offsetMsgId (address and port), rendered once per host."""
    ip, port = _parse_store_host(store_host)
    return (ip + port.to_bytes(4, "big")).hex().upper()


def decode_offset_msg_id(offset_msg_id: str) -> OffsetMsgIdInfo:
    """Split an offsetMsgId into store host, queue id and Kafka offset.

    Raises:
        ValueError: ``offset_msg_id`` is not 32 or 56 hex characters.
    """
    raw = _hex_id(offset_msg_id, "offsetMsgId")
    a = len(raw) - 12  # address length: 4 or 16
    ip = _address(raw[0:a])
    port = int.from_bytes(raw[a : a + 4], "big")
    physical = int.from_bytes(raw[a + 4 : a + 12], "big")
    return OffsetMsgIdInfo(
        store_host=f"[{ip}]:{port}" if a == 16 else f"{ip}:{port}",
        queue_id=physical >> 48,
        kafka_offset=physical & MAX_KAFKA_OFFSET,
    )
