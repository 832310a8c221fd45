"""OpenAPI 3.1 description of the collector API (served at /api/v1/openapi.json)."""

from __future__ import annotations

from typing import Any

from tracemq_collector.events import MAX_TIMESTAMP_MS
from tracemq_collector.store import MAX_PAGE_SIZE

#: What a trace look-up takes: a msgId or an offsetMsgId, 32 hex characters or 56 with an IPv6
#: address (DESIGN §2), in either case.
LOOKUP_ID_PATTERN = r"^(?:[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56})$"

_PEERS_FAILED = {
    "type": "array",
    "description": "peers skipped or failed: their part is missing from this answer"
    " (always empty with local=1). reason: unsigned, bad_signature, stale (registration"
    " not proven with the shared token), bad_url,"
    " unregistered, too_many_peers (the peer was not asked), timeout, unreachable,"
    " status, too_large, malformed (its answer was dropped), invalid_items (some of its items"
    " were dropped)",
    "items": {
        "type": "object",
        "required": ["peer", "reason", "error"],
        "properties": {
            "peer": {"type": "string"},
            "reason": {"type": "string"},
            "error": {"type": "string"},
        },
    },
}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {"type": "string"},
        "parameter": {"type": "string", "description": "the parameter at fault (400)"},
        "peers_failed": _PEERS_FAILED,
    },
}
_ATTEMPT = {
    "type": "object",
    "properties": {
        "request_id": {"type": ["string", "null"]},
        "retry_times": {"type": ["integer", "null"]},
        "begin": {"type": ["integer", "null"], "description": "epoch ms (SubBefore)"},
        "end": {"type": ["integer", "null"], "description": "epoch ms (SubAfter)"},
        "cost_time": {"type": ["integer", "null"]},
        "status": {"enum": ["success", "failed", "unknown"]},
        "context_code": {"type": ["integer", "null"]},
        "context_code_name": {"type": ["string", "null"]},
        "client_host": {"type": ["string", "null"]},
        "client_id": {
            "type": ["string", "null"],
            "description": "<host>@<instance name> of the consumer client that made the attempt",
        },
    },
}
_VIEW = {
    "type": "object",
    "required": [
        "msg_id",
        "topic",
        "producer",
        "transactions",
        "consumers",
        "dead_letters",
        "events",
        "peers_failed",
    ],
    "properties": {
        "msg_id": {"type": "string"},
        "found_by": {
            "enum": ["msg_id", "offset_msg_id"],
            "description": "what the id asked for was: the msgId, or an offsetMsgId",
        },
        "source": {
            "enum": ["store", "lake"],
            "description": "where the events came from: a live collector's store, or (none had "
            "them) the trace lake",
        },
        "offset_msg_id_query": {
            "type": "object",
            "description": "with found_by=offset_msg_id: the place the offsetMsgId decodes to",
            "properties": {
                "offset_msg_id": {"type": "string"},
                "store_host": {"type": "string"},
                "queue_id": {"type": "integer"},
                "kafka_offset": {"type": "integer"},
            },
        },
        "topic": {"type": ["string", "null"]},
        "delivery": {
            "type": "object",
            "description": (
                "where the message is expected: recalled (a successful Recall: nowhere), "
                "rolled_back (nowhere), committed, half (an "
                "unresolved transaction, held back), delayed (held until due_time, computed "
                "with the default delay levels), normal, unknown (no send trace)"
            ),
            "required": ["state", "expect_consumers"],
            "properties": {
                "state": {
                    "enum": [
                        "recalled",
                        "rolled_back",
                        "committed",
                        "half",
                        "delayed",
                        "normal",
                        "unknown",
                    ]
                },
                "recalled_at": {"type": ["integer", "null"], "description": "epoch ms"},
                "recalled_by": {"type": ["string", "null"], "description": "producer group"},
                "expect_consumers": {"type": ["boolean", "null"]},
                "decided_at": {"type": ["integer", "null"]},
                "from_transaction_check": {"type": ["boolean", "null"]},
                "delay_level": {"type": ["integer", "null"]},
                "due_time": {"type": ["integer", "null"], "description": "epoch ms"},
                "due_time_basis": {"type": ["string", "null"]},
            },
        },
        "producer": {
            "type": ["object", "null"],
            "properties": {
                "group": {"type": ["string", "null"]},
                "timestamp": {"type": "integer"},
                "cost_time": {"type": "integer"},
                "success": {"type": "boolean"},
                "store_host": {"type": ["string", "null"]},
                "msg_type": {"type": ["integer", "null"]},
                "msg_type_name": {"type": ["string", "null"]},
                "offset_msg_id": {"type": ["string", "null"]},
                "region_id": {"type": ["string", "null"]},
            },
        },
        "transactions": {"type": "array", "items": {"type": "object"}},
        "recalls": {
            "type": "array",
            "description": "Recall records: a producer's recall of a delayed message",
            "items": {
                "type": "object",
                "properties": {
                    "timestamp": {"type": "integer"},
                    "group": {"type": ["string", "null"]},
                    "success": {"type": "boolean"},
                    "result": {"enum": ["recalled", "not recalled"]},
                    "region_id": {"type": ["string", "null"]},
                },
            },
        },
        "consumers": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "group": {"type": ["string", "null"]},
                    "attempts": {"type": "array", "items": _ATTEMPT},
                    "dead_lettered": {
                        "type": "boolean",
                        "description": "the group moved the message to its %DLQ% topic",
                    },
                },
            },
        },
        "dead_letters": {
            "type": "array",
            "description": "moves to %DLQ%<group> (traced as a Pub of the consumer group)",
            "items": {
                "type": "object",
                "properties": {
                    "timestamp": {"type": "integer"},
                    "group": {"type": ["string", "null"]},
                    "topic": {"type": "string"},
                    "success": {"type": "boolean"},
                    "client_host": {"type": ["string", "null"]},
                    "client_id": {"type": ["string", "null"]},
                },
            },
        },
        "events": {"type": "array", "items": {"type": "object", "description": "a trace lake row"}},
        "peers_failed": _PEERS_FAILED,
    },
}
_LIST = {
    "type": "object",
    "required": ["items", "next_cursor", "peers_failed"],
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "msg_id": {"type": "string"},
                    "topic": {"type": ["string", "null"]},
                    "timestamp": {"type": "integer"},
                    "keys": {"type": ["string", "null"]},
                    "tags": {"type": ["string", "null"]},
                    "source": {
                        "const": "lake",
                        "description": "present on an item the live stores lacked, read from "
                        "the trace lake to complete a first page",
                    },
                    "outcomes": {
                        "type": "array",
                        "description": "with outcomes=1: per consumer group, what happened to "
                        "the message so far (an expected group without an attempt is pending)",
                        "items": {
                            "type": "object",
                            "required": ["group", "outcome", "attempts"],
                            "properties": {
                                "group": {"type": "string"},
                                "outcome": {
                                    "enum": ["consumed", "retried", "dead_lettered", "pending"]
                                },
                                "attempts": {"type": "integer", "minimum": 0},
                            },
                        },
                    },
                },
            },
        },
        "next_cursor": {"type": ["string", "null"]},
        "peers_failed": _PEERS_FAILED,
    },
}


_NULLABLE_INT = {"type": ["integer", "null"]}
_COUNTS = {
    "type": "object",
    "properties": {
        k: {"type": "integer", "minimum": 0}
        for k in ("consumed", "failed", "retried", "dead_lettered")
    },
}
_GROUP_TOPIC = {
    "type": "object",
    "required": ["topic", "lag", "lag_age_ms", "rates_per_min", "last_consume", "trend"],
    "properties": {
        "topic": {"type": "string", "description": "'?': the message's Pub trace is not stored"},
        "retry_topic": {"type": "boolean", "description": "the group's %RETRY% topic"},
        "expression": {"type": ["string", "null"], "description": "tag expression"},
        "lag": {**_NULLABLE_INT, "description": "messages after the committed offsets"},
        "lag_age_ms": {
            **_NULLABLE_INT,
            "description": "age of the oldest unconsumed message (null: no lag)",
        },
        "oldest_unconsumed": {
            "type": ["object", "null"],
            "description": "timestamp, msg_id, broker, queue_id, age_ms of that message",
        },
        "queues": {
            "type": ["array", "null"],
            "description": "per queue: broker, queue_id, end, committed, lag, oldest_timestamp,"
            " oldest_msg_id (null: offsets unavailable or broadcasting)",
            "items": {"type": "object"},
        },
        "rates_per_min": {
            "type": "object",
            "description": "over the last rate_window_ms, from the trace data",
            "properties": {
                k: {"type": "number"} for k in ("consume", "failure", "retry", "dead_letter")
            },
        },
        "last_hour": _COUNTS,
        "last_consume": {**_NULLABLE_INT, "description": "last SubAfter in the hour, epoch ms"},
        "trend": {
            "type": "array",
            "description": "one entry per minute of the last hour: counts from the trace data,"
            " lag and lag_age_ms from the collector's samples (null: no sample that minute)",
            "items": {"type": "object"},
        },
    },
}
_GROUPS = {
    "type": "object",
    "required": ["generated_at", "groups", "activity_truncated", "peers_failed"],
    "properties": {
        "generated_at": {"type": "integer"},
        "window_ms": {"type": "integer"},
        "rate_window_ms": {"type": "integer"},
        "sample_interval_s": {"type": "number"},
        "activity_truncated": {
            "type": "boolean",
            "description": "a collector held more consume events in the hour than it reads",
        },
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["group", "state", "clients", "lag", "topics"],
                "properties": {
                    "group": {"type": "string"},
                    "message_model": {"type": ["string", "null"]},
                    "clients": {"type": "integer", "description": "live clients"},
                    "state": {"enum": ["ok", "lagging", "failing", "stopped", "unknown"]},
                    "offsets_note": {"type": ["string", "null"]},
                    "lag": _NULLABLE_INT,
                    "lag_age_ms": _NULLABLE_INT,
                    "last_consume": _NULLABLE_INT,
                    "topics": {"type": "array", "items": _GROUP_TOPIC},
                },
            },
        },
        "peers_failed": _PEERS_FAILED,
    },
}
_UNAVAILABLE = {
    "description": "the routing database did not answer",
    "content": {"application/json": {"schema": _ERROR}},
}


def _p(
    name: str, desc: str, *, required: bool = False, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": desc,
        "schema": schema or {"type": "string"},
    }


# No control characters, and no U+FFFD (what invalid UTF-8 percent-escapes decode to).
_TEXT_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f\\ufffd]*$"
_TIME = {
    "oneOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_TIMESTAMP_MS},
        {"type": "string", "format": "date-time", "description": "1970 to 9999, with a zone"},
    ]
}
_LIMIT = _p(
    "limit",
    f"1..{MAX_PAGE_SIZE} (default 50) per collector",
    schema={"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
)
_LOCAL = _p(
    "local", "1: this collector only (no fan-out)", schema={"type": "string", "enum": ["0", "1"]}
)
_OUTCOMES = _p(
    "outcomes",
    "1: give every item its outcome per consumer group (a look-up per message)",
    schema={"type": "string", "enum": ["0", "1"]},
)
_PAGING = [
    _p("begin", "from (epoch ms or ISO 8601)", schema=_TIME),
    _p("end", "to (epoch ms or ISO 8601), not before begin", schema=_TIME),
    _LIMIT,
    _p(
        "cursor",
        "next_cursor of the previous page",
        schema={"type": "string", "pattern": "^[0-9A-Za-z_=-]{1,6000}$"},
    ),
    _LOCAL,
]


def _text(name: str, desc: str, max_len: int, *, required: bool = False) -> dict[str, Any]:
    schema = {"type": "string", "minLength": 1, "maxLength": max_len, "pattern": _TEXT_PATTERN}
    return _p(name, desc, required=required, schema=schema)


def _responses(ok: dict[str, Any]) -> dict[str, Any]:
    return {
        "200": {"description": "OK", "content": {"application/json": {"schema": ok}}},
        "400": {
            "description": "bad parameter",
            "content": {"application/json": {"schema": _ERROR}},
        },
        "401": {"description": "bearer token missing or wrong"},
    }


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "tracemq collector API",
        "version": "1.0.0",
        "description": "Message track trace look-ups (RocketMQ trace format).",
    },
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "security": [{"bearer": []}, {}],
    "paths": {
        "/api/v1/traces/{msg_id}": {
            "get": {
                "summary": "The trace view of one message",
                "parameters": [
                    {
                        "name": "msg_id",
                        "in": "path",
                        "required": True,
                        "description": (
                            "a msgId, or else an offsetMsgId (decoded to store host, queue "
                            "and Kafka offset and matched against the Pub traces; not with "
                            "local=1); either case"
                        ),
                        "schema": {"type": "string", "pattern": LOOKUP_ID_PATTERN},
                    },
                    _LOCAL,
                ],
                "responses": {
                    **_responses(_VIEW),
                    "404": {
                        "description": "nothing known about this message",
                        "content": {"application/json": {"schema": _ERROR}},
                    },
                },
            }
        },
        "/api/v1/traces": {
            "get": {
                "summary": "Messages carrying a business key (newest first)",
                "parameters": [
                    _text("key", "business key", 256, required=True),
                    _text("topic", "only this topic", 127),
                    *_PAGING,
                    _OUTCOMES,
                ],
                "responses": _responses(_LIST),
            }
        },
        "/api/v1/messages": {
            "get": {
                "summary": "Messages sent to a topic in a time range (newest first)",
                "parameters": [
                    _text("topic", "topic", 127, required=True),
                    *_PAGING,
                    _OUTCOMES,
                ],
                "responses": _responses(_LIST),
            }
        },
        "/api/v1/quarantine": {
            "get": {
                "summary": "Trace records that could not be decoded",
                "parameters": [_LIMIT],
                "responses": _responses({"type": "object"}),
            }
        },
        "/api/v1/groups": {
            "get": {
                "summary": "Health of every consumer group: lag in messages and in time, rates,"
                " last consume, the last hour per minute",
                "responses": {**_responses(_GROUPS), "503": _UNAVAILABLE},
            }
        },
        "/api/v1/groups/{group}": {
            "get": {
                "summary": "Health of one consumer group, with its queues",
                "parameters": [
                    {
                        "name": "group",
                        "in": "path",
                        "required": True,
                        "description": "consumer group name",
                        "schema": {"type": "string", "pattern": "^[%|a-zA-Z0-9_-]{1,255}$"},
                    }
                ],
                "responses": {
                    **_responses(_GROUPS),
                    "404": {
                        "description": "no subscription of this group was ever seen",
                        "content": {"application/json": {"schema": _ERROR}},
                    },
                    "503": _UNAVAILABLE,
                },
            }
        },
        "/api/v1/groups-activity": {
            "get": {
                "summary": "This collector's consume activity (the part a peer adds to a group"
                " status; never fanned out)",
                "parameters": [
                    _p("since", "from (epoch ms or ISO 8601)", required=True, schema=_TIME),
                    _p(
                        "until",
                        "to (epoch ms or ISO 8601), at most two hours after since",
                        required=True,
                        schema=_TIME,
                    ),
                    _text("group", "only this group", 255),
                    _LOCAL,
                ],
                "responses": _responses(
                    {
                        "type": "object",
                        "required": ["buckets", "last_consume", "truncated"],
                        "properties": {
                            "buckets": {"type": "array", "items": {"type": "object"}},
                            "last_consume": {"type": "array", "items": {"type": "object"}},
                            "truncated": {"type": "boolean"},
                        },
                    }
                ),
            }
        },
        "/v1/traces": {
            "post": {
                "summary": "OTLP/HTTP trace export: messaging spans become trace events (Pub,"
                " SubBefore/SubAfter); what a span cannot say (no msgId, no group) is counted in"
                " partialSuccess.rejectedSpans",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/x-protobuf": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "description": "OTLP/JSON ExportTraceServiceRequest",
                                "properties": {
                                    "resourceSpans": {"type": "array", "items": {"type": "object"}}
                                },
                            }
                        },
                    },
                },
                "responses": {
                    "200": {
                        "description": "accepted: on the trace topic (ExportTraceServiceResponse)",
                        "content": {
                            "application/json": {"schema": {"type": "object"}},
                            "application/x-protobuf": {
                                "schema": {"type": "string", "format": "binary"}
                            },
                        },
                    },
                    "400": {
                        "description": "not an OTLP trace export request",
                        "content": {"application/json": {"schema": _ERROR}},
                    },
                    "401": {"description": "bearer token missing or wrong"},
                    "415": {
                        "description": "neither application/x-protobuf nor application/json",
                        "content": {"application/json": {"schema": _ERROR}},
                    },
                    "503": {
                        "description": "the trace topic did not take the spans in time; retry",
                        "content": {"application/json": {"schema": _ERROR}},
                    },
                },
            }
        },
        "/healthz": {
            "get": {
                "summary": "health (no token needed)",
                "security": [],
                "responses": {
                    "200": {"description": "healthy"},
                    "503": {"description": "unhealthy"},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text exposition"}},
            }
        },
    },
}
