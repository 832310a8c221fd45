"""Trace records in RocketMQ's own text format, written by hand (not by our encoder): every
type, every historical field count, ``null`` fields — what RocketMQ clients put on the wire."""

from __future__ import annotations

C, F = "\x01", "\x02"


def record(*fields: object) -> str:
    return (
        C.join(
            "null" if f is None else str(f).lower() if isinstance(f, bool) else str(f)
            for f in fields
        )
        + F
    )


def pub(
    ts: int,
    group: str,
    topic: str,
    msg_id: str,
    *,
    keys: str | None = "k1 k2",
    tags: str | None = "TagA",
    fields: int = 14,
    success: bool = True,
    offset_msg_id: str = "7F00000100002A9F0000000000000001",
) -> str:
    base = [
        "Pub",
        ts,
        "DefaultRegion",
        group,
        topic,
        msg_id,
        tags,
        keys,
        "127.0.0.1:10911",
        120,
        5,
        0,
    ]
    if fields == 12:
        return record(*base)
    if fields == 13:
        return record(*base, success)
    if fields == 14:
        return record(*base, offset_msg_id, success)
    return record(*base, offset_msg_id, success, "10.0.0.9")  # 15: old clientHost


def sub_before(
    ts: int,
    group: str,
    request_id: str,
    msg_id: str,
    retry: int = 0,
    keys: str | None = "k1 k2",
    old_client_host: str | None = None,
) -> str:
    f = ["SubBefore", ts, "DefaultRegion", group, request_id, msg_id, retry, keys]
    if old_client_host:
        f.append(old_client_host)
    return record(*f)


def sub_after(
    request_id: str,
    msg_id: str,
    cost: int,
    success: bool,
    *,
    keys: str | None = "k1",
    code: int = 0,
    ts: int = 0,
    group: str | None = None,
    fields: int = 9,
) -> str:
    f: list[object] = ["SubAfter", request_id, msg_id, cost, success, keys]
    if fields >= 7:
        f.append(code)
    if fields >= 9:
        f += [ts, group]
    return record(*f)


def end_transaction(
    ts: int,
    group: str,
    topic: str,
    msg_id: str,
    state: str = "COMMIT_MESSAGE",
    from_check: bool = False,
) -> str:
    return record(
        "EndTransaction",
        ts,
        "DefaultRegion",
        group,
        topic,
        msg_id,
        "TagT",
        None,
        "127.0.0.1:10911",
        2,
        "tx-" + msg_id[-6:],
        state,
        from_check,
    )


def recall(ts: int, group: str, topic: str, msg_id: str) -> str:
    return record("Recall", ts, "DefaultRegion", group, topic, msg_id, True)
