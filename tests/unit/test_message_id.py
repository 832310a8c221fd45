"""msgId and offsetMsgId: layout, round trips, uniqueness and month arithmetic."""

from __future__ import annotations

import calendar
import ipaddress
import os
import re
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tracemq.message_id import (
    MAX_KAFKA_OFFSET,
    MSGID_TIMEZONE_ENV,
    MessageIdGenerator,
    MsgIdInfo,
    OffsetMsgIdInfo,
    decode_msg_id,
    decode_offset_msg_id,
    encode_offset_msg_id,
    local_ipv4,
    msgid_zone,
    new_msg_id,
)

DAY_MS = 86_400_000
ID_RE = re.compile(r"[0-9A-F]{32}")


@pytest.fixture(autouse=True)
def _ids_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests below without a zone of their own assume UTC months, whatever the host's zone."""
    monkeypatch.setenv(MSGID_TIMEZONE_ENV, "UTC")


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, ms: int = 0) -> int:
    return calendar.timegm((year, month, day, hour, minute, 0)) * 1000 + ms


def stepping_clock(*values: int) -> Iterator[int]:
    yield from values


def clock_of(*values: int) -> MessageIdGenerator:
    ticks = stepping_clock(*values)
    return MessageIdGenerator("10.1.2.3", clock=lambda: next(ticks))


# ------------------------------------------------------------------------------- msgId


def test_layout_of_a_generated_id() -> None:
    t = utc_ms(2024, 3, 5, 6, 7, 891)
    gen = MessageIdGenerator("10.1.2.3", clock=lambda: t)
    first, second = gen.next(), gen.next()
    assert ID_RE.fullmatch(first) and ID_RE.fullmatch(second)
    pid = os.getpid() & 0xFFFF
    prefix = f"0A010203{pid:04X}{gen.salt:08X}"
    offset = t - utc_ms(2024, 3, 1)
    assert first == f"{prefix}{offset:08X}0000"
    assert second == f"{prefix}{offset:08X}0001"
    assert (gen.ip, gen.pid) == ("10.1.2.3", pid)


def test_decode_recovers_every_part() -> None:
    t = utc_ms(2024, 3, 5, 6, 7, 891)
    gen = MessageIdGenerator("192.168.7.9", clock=lambda: t)
    gen.next()
    info = decode_msg_id(gen.next(), now_ms=t + 5)
    assert info == MsgIdInfo(
        ip="192.168.7.9",
        pid=os.getpid() & 0xFFFF,
        salt=gen.salt,
        timestamp_ms=t,
        counter=1,
    )


def test_decode_accepts_lower_case() -> None:
    msg_id = MessageIdGenerator("1.2.3.4").next()
    assert decode_msg_id(msg_id.lower()) == decode_msg_id(msg_id)


def test_time_embedded_is_now() -> None:
    gen = MessageIdGenerator("1.2.3.4")
    before = time.time_ns() // 1_000_000
    msg_id = gen.next()
    after = time.time_ns() // 1_000_000
    assert before <= decode_msg_id(msg_id, now_ms=after).timestamp_ms <= after
    # Also with the default reference time.
    assert before <= decode_msg_id(msg_id).timestamp_ms <= after


def test_hundred_thousand_ids_are_unique() -> None:
    gen = MessageIdGenerator()
    ids = [gen.next() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert all(ID_RE.fullmatch(i) for i in ids[:1000])


def test_generators_in_one_process_do_not_collide() -> None:
    t = utc_ms(2024, 1, 1)
    a = MessageIdGenerator("1.2.3.4", clock=lambda: t)
    b = MessageIdGenerator("1.2.3.4", clock=lambda: t)
    assert {a.next() for _ in range(100)}.isdisjoint({b.next() for _ in range(100)})


def test_counter_wraps_at_16_bits() -> None:
    t = utc_ms(2024, 1, 1)
    gen = MessageIdGenerator("1.2.3.4", clock=lambda: t)
    ids = [gen.next() for _ in range(65_537)]
    assert decode_msg_id(ids[65_535], now_ms=t).counter == 0xFFFF
    assert decode_msg_id(ids[65_536], now_ms=t).counter == 0


def test_month_change_resets_the_offset() -> None:
    last_ms_of_january = utc_ms(2024, 2, 1) - 1
    february = utc_ms(2024, 2, 1)
    gen = clock_of(last_ms_of_january, february, february + 1234)
    january_id, february_id, later_id = gen.next(), gen.next(), gen.next()
    assert january_id[20:28] == f"{31 * DAY_MS - 1:08X}"
    assert february_id[20:28] == "00000000"
    assert later_id[20:28] == f"{1234:08X}"
    now = february + 5000
    assert decode_msg_id(january_id, now_ms=now).timestamp_ms == last_ms_of_january
    assert decode_msg_id(february_id, now_ms=now).timestamp_ms == february
    assert decode_msg_id(later_id, now_ms=now).timestamp_ms == february + 1234


def test_clock_stepping_back_does_not_go_back_in_ids() -> None:
    t = utc_ms(2024, 5, 10, 12)
    gen = clock_of(t, t - 500, t + 1)
    stamps = [decode_msg_id(gen.next(), now_ms=t + 10).timestamp_ms for _ in range(3)]
    assert stamps == [t, t, t + 1]


def raw_id(offset_ms: int) -> str:
    return f"0102030400070000000A{offset_ms:08X}0000"


def test_decode_uses_the_month_of_now() -> None:
    now = utc_ms(2024, 2, 20, 10)
    assert decode_msg_id(raw_id(0), now_ms=now).timestamp_ms == utc_ms(2024, 2, 1)
    offset = 19 * DAY_MS + 10 * 3_600_000
    assert decode_msg_id(raw_id(offset), now_ms=now).timestamp_ms == now


def test_decode_allows_one_day_of_skew_into_the_future() -> None:
    now = utc_ms(2024, 2, 20, 10)
    in_a_day = now + DAY_MS - utc_ms(2024, 2, 1)
    assert decode_msg_id(raw_id(in_a_day), now_ms=now).timestamp_ms == now + DAY_MS
    # One ms further is too far ahead: it must be from January.
    info = decode_msg_id(raw_id(in_a_day + 1), now_ms=now)
    assert info.timestamp_ms == utc_ms(2024, 1, 1) + in_a_day + 1


def test_decode_early_in_a_month_reads_late_offsets_as_last_month() -> None:
    now = utc_ms(2024, 3, 1, 0, 0, 10)  # 2024 is a leap year: February has 29 days
    offset = 29 * DAY_MS - 5
    assert decode_msg_id(raw_id(offset), now_ms=now).timestamp_ms == utc_ms(2024, 3, 1) - 5


def test_decode_in_january_goes_back_to_december_of_last_year() -> None:
    now = utc_ms(2025, 1, 1, 0, 0, 10)
    offset = 31 * DAY_MS - 3
    assert decode_msg_id(raw_id(offset), now_ms=now).timestamp_ms == utc_ms(2025, 1, 1) - 3


# Creation instants from 2001 to 2099, and a decoder clock less than 27 days later: the
# decoder takes an id up to a day in its future (clock skew) as this month's, so a creation
# time 27 days back in a 28-day month is read as the next month's (hypothesis found
# 2073-02-02 decoded on 2073-03-01).
instants = st.integers(min_value=utc_ms(2001, 1, 1), max_value=utc_ms(2099, 1, 1))


@given(t=instants, delay=st.integers(min_value=0, max_value=27 * DAY_MS - 1))
def test_round_trip_of_creation_time(t: int, delay: int) -> None:
    gen = MessageIdGenerator("8.8.4.4", clock=lambda: t)
    assert decode_msg_id(gen.next(), now_ms=t + delay).timestamp_ms == t


@given(ip=st.ip_addresses(v=4), t=instants)
def test_round_trip_of_ip(ip: ipaddress.IPv4Address, t: int) -> None:
    gen = MessageIdGenerator(str(ip), clock=lambda: t)
    info = decode_msg_id(gen.next(), now_ms=t)
    assert (info.ip, info.salt, info.counter) == (str(ip), gen.salt, 0)


@pytest.mark.parametrize(
    "bad",
    ["", "ABC", "0" * 31, "0" * 33, "G" * 32, " " + "0" * 31, "0" * 30 + "\n0", "０" * 32],
)
def test_decode_msg_id_rejects_bad_text(bad: str) -> None:
    with pytest.raises(ValueError, match="msgId must be 32 hexadecimal") as caught:
        decode_msg_id(bad)
    assert repr(bad) in str(caught.value)


@pytest.mark.parametrize("bad", ["localhost", "::g", "1.2.3", "1.2.3.256", "01.2.3.4", ""])
def test_generator_rejects_a_bad_ip(bad: str) -> None:
    with pytest.raises(ValueError, match="IPv4 .dotted. or IPv6") as caught:
        MessageIdGenerator(bad)
    assert repr(bad) in str(caught.value)


def test_new_msg_id_uses_the_local_ip() -> None:
    first, second = new_msg_id(), new_msg_id()
    assert first != second
    assert ID_RE.fullmatch(first)
    info = decode_msg_id(second)
    assert info.ip == local_ipv4()
    assert info.pid == os.getpid() & 0xFFFF
    assert decode_msg_id(first).salt == info.salt


def test_local_ipv4_is_a_usable_ipv4() -> None:
    address = ipaddress.IPv4Address(local_ipv4())
    assert not address.is_unspecified
    assert local_ipv4() == str(address)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_gets_its_own_identity() -> None:
    gen = MessageIdGenerator("1.2.3.4")
    parent_id = gen.next()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report one id and leave without running pytest's teardown
        try:
            os.write(write_end, gen.next().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        child_id = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    parent, child = decode_msg_id(parent_id), decode_msg_id(child_id)
    assert child.pid == pid & 0xFFFF
    assert child.salt != parent.salt
    assert child_id[:20] != parent_id[:20]
    assert gen.next()[:20] == parent_id[:20]


# ------------------------------------------------------------------------ offsetMsgId


def test_offset_msg_id_golden() -> None:
    encoded = encode_offset_msg_id("10.0.0.1:10911", 3, 42)
    assert encoded == "0A00000100002A9F000300000000002A"
    assert decode_offset_msg_id(encoded) == OffsetMsgIdInfo("10.0.0.1:10911", 3, 42)
    assert decode_offset_msg_id(encoded.lower()) == OffsetMsgIdInfo("10.0.0.1:10911", 3, 42)


def test_offset_msg_id_extremes() -> None:
    encoded = encode_offset_msg_id("255.255.255.255:65535", 0xFFFF, MAX_KAFKA_OFFSET)
    assert encoded == "FFFFFFFF0000FFFF" + "F" * 16
    assert decode_offset_msg_id(encoded) == OffsetMsgIdInfo(
        "255.255.255.255:65535", 0xFFFF, 2**48 - 1
    )
    assert encode_offset_msg_id("0.0.0.0:0", 0, 0) == "0" * 32


@given(
    ip=st.ip_addresses(v=4),
    port=st.integers(0, 65535),
    queue_id=st.integers(0, 65535),
    offset=st.integers(0, 2**48 - 1),
)
def test_offset_msg_id_round_trip(
    ip: ipaddress.IPv4Address, port: int, queue_id: int, offset: int
) -> None:
    encoded = encode_offset_msg_id(f"{ip}:{port}", queue_id, offset)
    assert ID_RE.fullmatch(encoded)
    assert decode_offset_msg_id(encoded) == OffsetMsgIdInfo(f"{ip}:{port}", queue_id, offset)


@pytest.mark.parametrize(
    ("queue_id", "offset", "message"),
    [
        (-1, 0, "queue_id must be in 0..65535, got -1"),
        (65536, 0, "queue_id must be in 0..65535, got 65536"),
        (0, -1, r"kafka_offset must be in 0..2\*\*48-1, got -1"),
        (0, 2**48, rf"kafka_offset must be in 0..2\*\*48-1, got {2**48}"),
    ],
)
def test_offset_msg_id_rejects_out_of_range(queue_id: int, offset: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_offset_msg_id("1.2.3.4:10911", queue_id, offset)


@pytest.mark.parametrize(
    "store_host",
    [
        "broker-a:10911",
        "[::g]:10911",
        "::1:10911",
        "[1.2.3.4]:10911",
        "1.2.3.4",
        "1.2.3.4:",
        "1.2.3.4:65536",
        "1.2.3.4:port",
        "1.2.3.4:-1",
        "1.2.3:10911",
        ":10911",
    ],
)
def test_offset_msg_id_rejects_a_bad_store_host(store_host: str) -> None:
    with pytest.raises(ValueError, match="store host") as caught:
        encode_offset_msg_id(store_host, 0, 0)
    assert repr(store_host) in str(caught.value)


@pytest.mark.parametrize("bad", ["", "0" * 31, "0" * 55, "Z" * 32, "0" * 16 + " " * 16])
def test_decode_offset_msg_id_rejects_bad_text(bad: str) -> None:
    with pytest.raises(ValueError, match="offsetMsgId must be 32 hexadecimal"):
        decode_offset_msg_id(bad)


def test_request_ids_are_unique_and_shaped_like_msg_ids() -> None:
    from tracemq.message_id import new_msg_id, new_request_id

    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert ids[0][:20] == new_msg_id()[:20]  # this process's identity: IPv4, pid, salt


def test_a_day_of_skew_wins_over_27_days_back_in_a_28_day_month() -> None:
    """The documented rule at its edge: an offset a day into the month, decoded exactly 27
    days later at the start of March, is tomorrow (skew), not February."""
    now = utc_ms(2073, 3, 1)
    assert decode_msg_id(raw_id(DAY_MS), now_ms=now).timestamp_ms == utc_ms(2073, 3, 2)
    assert decode_msg_id(raw_id(DAY_MS), now_ms=now - 1).timestamp_ms == utc_ms(2073, 2, 2)


# ------------------------------------------------------------------ time zones, IPv6


def iso_ms(text: str) -> int:
    """Epoch ms of an ISO-8601 instant with an explicit offset (no zone rules involved)."""
    from datetime import datetime

    return round(datetime.fromisoformat(text).timestamp() * 1000)


@pytest.mark.parametrize(
    ("zone", "instant", "offset_ms"),
    [
        # Shanghai (UTC+8): 07:59:59 local on 1 November is 23:59:59 UTC on 31 October.
        ("Asia/Shanghai", "2026-10-31T23:59:59+00:00", 7 * 3_600_000 + 59 * 60_000 + 59_000),
        # Los Angeles: November starts at 00:00 PDT (UTC-7); DST ends at 02:00 PDT, so
        # 02:00 PST is three hours of elapsed time after the local month start.
        ("America/Los_Angeles", "2026-11-01T02:00:00-08:00", 3 * 3_600_000),
        # Berlin: October starts at 00:00 CEST (UTC+2); its last ms is in CET (UTC+1):
        # 31 days and an hour, less 1 ms.
        ("Europe/Berlin", "2026-10-31T23:59:59.999+01:00", 31 * DAY_MS + 3_600_000 - 1),
        ("UTC", "2026-11-01T00:00:00+00:00", 0),
    ],
)
def test_the_time_field_counts_from_the_producers_local_month_start(
    zone: str, instant: str, offset_ms: int
) -> None:
    t = iso_ms(instant)
    msg_id = MessageIdGenerator("10.1.2.3", clock=lambda: t, tz=zone).next()
    assert int(msg_id[20:28], 16) == offset_ms
    assert decode_msg_id(msg_id, now_ms=t + 1000, tz=zone).timestamp_ms == t


def _instants_around_month_edges(zone: str) -> list[int]:
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone)
    out = []
    for year, month in [(2026, 1), (2026, 3), (2026, 4), (2026, 10), (2026, 11), (2026, 12)]:
        start = datetime(year, month, 1, tzinfo=tz)
        base = round(start.timestamp() * 1000)
        out += [base + d for d in (-DAY_MS, -1000, -1, 0, 1, 1000, 12 * 3_600_000, 15 * DAY_MS)]
    # the days of the DST changes (2026): US 8 March / 1 November, EU 29 March / 25 October
    for day in ["2026-03-08", "2026-11-01", "2026-03-29", "2026-10-25"]:
        midnight = datetime.fromisoformat(day).replace(tzinfo=tz)
        for hours in (0, 1, 1.5, 2, 2.5, 3, 4):
            out.append(round((midnight + timedelta(hours=hours)).timestamp() * 1000))
    return out


ZONES = ["UTC", "Asia/Shanghai", "America/Los_Angeles", "Europe/Berlin"]


@pytest.mark.parametrize("ip", ["10.1.2.3", "2001:db8::17"])
@pytest.mark.parametrize("zone", ZONES)
def test_ids_decode_to_the_exact_ms_in_the_producers_zone(zone: str, ip: str) -> None:
    for t in _instants_around_month_edges(zone):
        gen = MessageIdGenerator(ip, clock=lambda t=t: t, tz=zone)
        msg_id = gen.next()
        assert len(msg_id) == (32 if "." in ip else 56)
        for later in (0, 1, 1000, 3_600_000, 20 * DAY_MS):
            info = decode_msg_id(msg_id, now_ms=t + later, tz=zone)
            assert info.timestamp_ms == t, (zone, ip, t, later)
            assert (info.ip, info.salt, info.counter) == (ip, gen.salt, 0)


def test_an_id_made_1_s_before_a_local_month_start_decodes_to_that_instant() -> None:
    made = iso_ms("2026-11-30T23:59:59+08:00")  # Shanghai, the last second of November
    msg_id = MessageIdGenerator("10.1.2.3", clock=lambda: made, tz="Asia/Shanghai").next()
    read_at = iso_ms("2026-12-01T00:00:05+08:00")
    assert decode_msg_id(msg_id, now_ms=read_at, tz="Asia/Shanghai").timestamp_ms == made
    # Read as if it were a UTC month's offset, the same id is eight hours off: the zone matters.
    assert decode_msg_id(msg_id, now_ms=read_at, tz="UTC").timestamp_ms != made


def test_the_default_zone_is_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    t = iso_ms("2026-11-01T02:00:00-08:00")
    monkeypatch.setenv(MSGID_TIMEZONE_ENV, "America/Los_Angeles")
    msg_id = MessageIdGenerator("10.1.2.3", clock=lambda: t).next()
    assert int(msg_id[20:28], 16) == 3 * 3_600_000
    assert decode_msg_id(msg_id, now_ms=t).timestamp_ms == t
    monkeypatch.setenv(MSGID_TIMEZONE_ENV, "Mars/Olympus")
    with pytest.raises(ValueError, match=f"{MSGID_TIMEZONE_ENV}: unknown time zone 'Mars/Olympus'"):
        msgid_zone()


def test_without_the_setting_ids_follow_the_hosts_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MSGID_TIMEZONE_ENV)
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    from tracemq.message_id import zone_named

    zone_named.cache_clear()
    try:
        t = iso_ms("2026-10-31T23:59:59+00:00")
        msg_id = MessageIdGenerator("10.1.2.3", clock=lambda: t).next()
        assert int(msg_id[20:28], 16) == 7 * 3_600_000 + 59 * 60_000 + 59_000
    finally:
        zone_named.cache_clear()


@given(ip=st.ip_addresses(v=6), t=instants, delay=st.integers(0, 27 * DAY_MS - 1))
def test_round_trip_of_ipv6_ids(ip: ipaddress.IPv6Address, t: int, delay: int) -> None:
    gen = MessageIdGenerator(str(ip), clock=lambda: t, tz="Europe/Berlin")
    msg_id = gen.next()
    assert re.fullmatch(r"[0-9A-F]{56}", msg_id)
    assert msg_id.startswith(ip.packed.hex().upper())
    info = decode_msg_id(msg_id, now_ms=t + delay, tz="Europe/Berlin")
    assert (info.ip, info.timestamp_ms, info.salt) == (str(ip), t, gen.salt)


def test_offset_msg_id_with_an_ipv6_store_host() -> None:
    encoded = encode_offset_msg_id("[2001:db8::5]:10911", 3, 42)
    assert encoded == "20010DB8000000000000000000000005" + "00002A9F" + "000300000000002A"
    assert decode_offset_msg_id(encoded) == OffsetMsgIdInfo("[2001:db8::5]:10911", 3, 42)


def test_a_client_with_a_bad_zone_setting_fails_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tracemq import Producer
    from tracemq.errors import ConfigError

    monkeypatch.setenv(MSGID_TIMEZONE_ENV, "Nowhere/Land")
    with pytest.raises(ConfigError, match="TRACEMQ_MSGID_TIMEZONE: unknown time zone"):
        Producer("PG_zone")
