"""The trace view of one message, built from its raw events (DESIGN §5): the producer node,
transaction nodes, recalls (a producer's recall of a delayed message), per consumer group
every attempt (SubBefore paired with SubAfter by requestId) with its status ``success`` /
``failed`` / ``unknown`` — broker retries are just more attempts of the group, with their
retry count — and the moves to a dead-letter queue."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tracemq.message_id import decode_offset_msg_id
from tracemq.trace import FIELD_SPLITOR, ConsumeReturnType, MessageType, decode_report

#: The brokers' default ``messageDelayLevel`` (``tracemq_broker.delay_levels``) in seconds: a
#: delayed message's due time is only known from the trace through its level, and a service
#: does not import another service. A broker configured with other levels makes this a guess,
#: which the view says (``due_time_basis``).
DEFAULT_DELAY_LEVELS_S = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip
EVENT_IDENTITY = ("trace_topic", "trace_partition", "trace_offset", "trace_index")
DLQ_PREFIX = "%DLQ%"


def _name(enum: Any, value: int | None) -> str | None:
    if value is None:
        return None
    try:
        return str(enum(value).name)
    except ValueError:
        return str(value)


def dedupe(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events from several collectors, each once, in time order."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in events:
        seen.setdefault(tuple(e.get(k) for k in EVENT_IDENTITY), e)
    return sorted(
        seen.values(), key=lambda e: (e["timestamp"], e["trace_offset"], e["trace_index"])
    )


#: What makes two events the same happening, whatever trace message carried them: a consume
#: event is one per (kind, group, requestId) — a requestId names one delivery attempt — and a
#: Pub repeated field for field is one send (a second send of the msgId has its own timestamp
#: and cost). Repeats come from trace messages written twice without an idempotency key (a
#: RocketMQ client's retried trace send) or stored by two collectors.
_CONSUME_IDENTITY = ("trace_type", "group_name", "request_id", "msg_id")
_PUB_IDENTITY = (
    "trace_type", "timestamp", "group_name", "topic", "msg_id", "cost_time", "success",
    "offset_msg_id", "store_host",
)  # fmt: skip


def collapse_repeats(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` without repeats of one happening (see above); the first of each is kept."""
    # identity -> the trace message (topic, partition, offset) it was first seen in
    seen: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    out = []
    for e in events:
        kind = e.get("trace_type")
        if kind in ("SubBefore", "SubAfter") and e.get("request_id"):
            identity = tuple(e.get(k) for k in _CONSUME_IDENTITY)
        elif kind == "Pub":
            identity = tuple(e.get(k) for k in _PUB_IDENTITY)
        else:
            out.append(e)
            continue
        where = (e.get("trace_topic"), e.get("trace_partition"), e.get("trace_offset"))
        first = seen.get(identity)
        if first is None:
            seen[identity] = where
            out.append(e)
        elif kind == "Pub" and first == where:
            # identical Pubs inside one trace message are separate send attempts made within
            # one millisecond; a repeat is a copy in *another* trace message (a retried send)
            out.append(e)
    return out


def build_view(msg_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    events = collapse_repeats(dedupe(events))
    # A consumer that gives up on a message after max_reconsume_times traces its move to
    # %DLQ%<group> as a Pub of the consumer group: that is not the producer's send.
    all_pubs = [e for e in events if e["trace_type"] == "Pub"]
    pubs = [e for e in all_pubs if not (e.get("topic") or "").startswith(DLQ_PREFIX)]
    dead_letters = [
        {
            "timestamp": e["timestamp"],
            "group": e["group_name"],
            "topic": e["topic"],
            "success": e["success"],
            "client_host": e.get("client_host"),
            "client_id": e.get("client_id"),
        }
        for e in all_pubs
        if (e.get("topic") or "").startswith(DLQ_PREFIX)
    ]
    pub = next((e for e in pubs if e["success"]), pubs[0] if pubs else None)
    topic = next((e["topic"] for e in pubs if e.get("topic")), None) or next(
        (e["topic"] for e in events if e.get("topic")), None
    )
    producer = None
    if pub is not None:
        producer = {
            "group": pub["group_name"],
            "timestamp": pub["timestamp"],
            "cost_time": pub["cost_time"],
            "success": pub["success"],
            # a failed send stored nothing (older tracemq clients named the broker tried)
            "store_host": pub["store_host"] if pub["success"] else None,
            "msg_type": pub["msg_type"],
            "msg_type_name": _name(MessageType, pub["msg_type"]),
            "offset_msg_id": pub["offset_msg_id"],
            "region_id": pub["region_id"],
            "client_host": pub.get("client_host"),
            "client_id": pub.get("client_id"),
            "send_attempts": len(pubs),  # the producer writes one Pub per attempt
        }
    transactions = [
        {
            "timestamp": e["timestamp"],
            "group": e["group_name"],
            "transaction_id": e["transaction_id"],
            "transaction_state": e["transaction_state"],
            "from_transaction_check": e["from_transaction_check"],
            "msg_type": e["msg_type"],
            "msg_type_name": _name(MessageType, e["msg_type"]),
        }
        for e in events
        if e["trace_type"] == "EndTransaction"
    ]
    # RocketMQ's Recall record: success=true means the broker recalled it (it is not delivered)
    recalls = [
        {
            "timestamp": e["timestamp"],
            "group": e["group_name"],
            "success": e["success"],
            "result": "recalled" if e["success"] else "not recalled",
            "region_id": e.get("region_id"),
        }
        for e in events
        if e["trace_type"] == "Recall"
    ]
    groups: dict[str, dict[str, Any]] = {}
    # Old SubAfter records (6-8 fields) carry no group: pair them by requestId alone.
    afters: dict[str | None, list[dict[str, Any]]] = {}
    for e in events:
        if e["trace_type"] == "SubAfter" and e["request_id"]:
            afters.setdefault(e["request_id"], []).append(e)
    used: set[int] = set()
    for e in events:
        if e["trace_type"] != "SubBefore":
            continue
        after = next(
            (
                a
                for a in afters.get(e["request_id"], [])
                if id(a) not in used and a["group_name"] in (None, e["group_name"])
            ),
            None,
        )
        if after is not None:
            used.add(id(after))
        g = groups.setdefault(e["group_name"] or "", {"group": e["group_name"], "attempts": []})
        g["attempts"].append(_attempt(e, after))
    for e in events:
        if e["trace_type"] == "SubAfter" and id(e) not in used:
            g = groups.setdefault(e["group_name"] or "", {"group": e["group_name"], "attempts": []})
            g["attempts"].append(_attempt(None, e))
    dead_groups = {d["group"] for d in dead_letters if d["success"]}
    consumers = []
    for g in sorted(groups.values(), key=lambda g: g["group"] or ""):
        g["dead_lettered"] = g["group"] in dead_groups
        g["attempts"].sort(
            key=lambda a: (a["begin"] if a["begin"] is not None else 0, a["retry_times"] or 0)
        )
        consumers.append(g)
    return {
        "msg_id": msg_id,
        "topic": topic,
        "delivery": delivery(producer, transactions, recalls),
        "producer": producer,
        "transactions": transactions,
        "recalls": recalls,
        "consumers": consumers,
        "dead_letters": dead_letters,
        "events": events,
    }


def _own_time(after: dict[str, Any]) -> bool:
    """Whether a SubAfter event's timestamp is its record's own, not the collector's ingest
    time (the record has none: 6-8 fields, or 0)."""
    record = after.get("record")
    if isinstance(record, str):
        contexts = decode_report(record + FIELD_SPLITOR).contexts
        return bool(contexts) and contexts[0].timestamp != 0
    return after.get("ingest_ts") is None or after["timestamp"] != after["ingest_ts"]


def _attempt(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if after is None:
        status = "unknown"
    else:
        status = "success" if after["success"] else "failed"
    end = after["timestamp"] if after is not None else None
    cost = after["cost_time"] if after is not None else None
    if before is not None and after is not None and cost is not None and not _own_time(after):
        # An old SubAfter has no timestamp; its event time is when the collector read it,
        # seconds after the consume. Its cost is exact: the attempt ends at begin + cost.
        end = before["timestamp"] + cost
    begin = (
        before["timestamp"]
        if before is not None
        else (end - cost if end is not None and cost is not None else None)
    )
    src = before or after or {}
    code = after["context_code"] if after is not None else None
    return {
        "request_id": src.get("request_id"),
        "retry_times": before["retry_times"] if before is not None else None,
        "begin": begin,
        "end": end,
        "cost_time": cost,
        "status": status,
        "context_code": code,
        "context_code_name": _name(ConsumeReturnType, code),
        "client_host": src.get("client_host"),
        # which client made the attempt: two clients of one host differ here only
        "client_id": (before or {}).get("client_id") or (after or {}).get("client_id"),
    }


def delivery(
    producer: dict[str, Any] | None,
    transactions: list[dict[str, Any]],
    recalls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Where the message is expected, so that no consumer trace reads right or wrong.

    ``state`` is ``recalled`` (a successful Recall: expected nowhere, ``recalled_at`` /
    ``recalled_by``), ``rolled_back`` (expected nowhere), ``committed``, ``half`` (a transaction not
    yet resolved: held back from consumers), ``delayed`` (held until ``due_time``), ``normal``
    or ``unknown`` (no send trace); ``expect_consumers`` says whether consumers should see it.
    """
    # The last decision wins (a check-back may follow an UNKNOW); UNKNOW alone decides nothing.
    decided = [
        t for t in transactions
        if t.get("transaction_state") in ("COMMIT_MESSAGE", "ROLLBACK_MESSAGE")
    ]  # fmt: skip
    last = max(decided, key=lambda t: t["timestamp"] or 0) if decided else None
    msg_type = producer.get("msg_type") if producer else None
    out: dict[str, Any] = {"state": "normal", "expect_consumers": True}
    recalled = [r for r in recalls or () if r.get("success")]
    if recalled:
        first = min(recalled, key=lambda r: r["timestamp"] or 0)
        out = {
            "state": "recalled",
            "expect_consumers": False,
            "recalled_at": first["timestamp"],
            "recalled_by": first["group"],
        }
        if producer is not None and msg_type == MessageType.Delay_Msg:
            out.update(_due(producer))
    elif last is not None:
        rolled_back = last["transaction_state"] == "ROLLBACK_MESSAGE"
        out = {
            "state": "rolled_back" if rolled_back else "committed",
            "expect_consumers": not rolled_back,
            "decided_at": last["timestamp"],
            "from_transaction_check": last["from_transaction_check"],
        }
    elif msg_type == MessageType.Trans_Msg_Half or transactions:
        out = {"state": "half", "expect_consumers": False}
    elif producer is None:
        out = {"state": "unknown", "expect_consumers": None}
    elif msg_type == MessageType.Delay_Msg:
        out = {"state": "delayed", "expect_consumers": True, **_due(producer)}
    return out


def _due(producer: dict[str, Any]) -> dict[str, Any]:
    """A delayed message waits in queue ``level - 1`` of the schedule topic, which its
    offsetMsgId names (DESIGN §2): the level, hence the due time under the default levels."""
    try:
        queue_id = decode_offset_msg_id(producer.get("offset_msg_id") or "").queue_id
    except ValueError:
        return {"delay_level": None, "due_time": None, "due_time_basis": None}
    level = queue_id + 1
    if level > len(DEFAULT_DELAY_LEVELS_S) or producer.get("timestamp") is None:
        return {"delay_level": level, "due_time": None, "due_time_basis": None}
    return {
        "delay_level": level,
        "due_time": producer["timestamp"] + DEFAULT_DELAY_LEVELS_S[level - 1] * 1000,
        "due_time_basis": "default delay levels",
    }
