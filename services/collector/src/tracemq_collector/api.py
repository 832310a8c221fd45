"""The collector's HTTP API (``/api/v1``), the trace viewer page and the bearer-token guard.

Bad parameters answer 400 with ``{"error": ..., "parameter": ...}``; an unknown message 404.
Every query parameter goes through one parser (below): numbers are ASCII decimal integers in
range, text has no control characters or invalid UTF-8, so no input reaches SQLite or int()
in a shape that raises. Fan-out answers carry ``peers_failed`` (see :mod:`queries`).
With ``TRACEMQ_COLLECTOR_API_TOKEN`` set (the dev stack and compose always set one), every data
endpoint and /metrics need ``Authorization: Bearer <token>`` (the scheme in any case), else 401
with ``WWW-Authenticate: Bearer``; /healthz and the page's static shell stay open (they hold no
trace data; the page asks for the token when the API answers 401). Without a token the API is
open and the collector warns at start.
"""

from __future__ import annotations

import hmac
import re
import unicodedata
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError
from tracemq.message_id import decode_offset_msg_id

from tracemq_collector import metrics
from tracemq_collector.errors import BadParameter
from tracemq_collector.events import MAX_TIMESTAMP_MS
from tracemq_collector.groups import GroupHealth, UnknownGroup, add_outcomes
from tracemq_collector.openapi import LOOKUP_ID_PATTERN, OPENAPI
from tracemq_collector.queries import BadCursor, Queries
from tracemq_collector.store import MAX_PAGE_SIZE
from tracemq_collector.view import build_view

STATIC = Path(__file__).parent / "static"
_LOOKUP_ID = re.compile(LOOKUP_ID_PATTERN)
QUERIES_KEY: web.AppKey[Queries] = web.AppKey("queries", Queries)
GROUPS_KEY: web.AppKey[GroupHealth | None] = web.AppKey("groups")
OTLP_KEY: web.AppKey[Any] = web.AppKey("otlp")
OPEN_PATHS = ("/healthz",)
#: Digits of the largest number any parameter takes: int() never sees a 5 000-digit string.
_INTEGER = re.compile(r"-?[0-9]{1,20}")
_CURSOR = re.compile(r"[0-9A-Za-z_=-]+")
_MAX_CURSOR_CHARS = 6000
#: Widest window a peer's activity is asked for (a group status asks for the last hour).
MAX_ACTIVITY_WINDOW_MS = 2 * 3_600_000


def _error(status: int, message: str, parameter: str | None = None, **extra: Any) -> web.Response:
    body: dict[str, Any] = {"error": message, **extra}
    if parameter:
        body["parameter"] = parameter
    return web.json_response(body, status=status)


def _shown(raw: str) -> str:
    return repr(raw) if len(raw) <= 40 else f"{raw[:40]!r}... ({len(raw)} characters)"


# -- the one parameter parser: every route reads its query through these ---------------------
def _raw(req: web.Request, name: str) -> str | None:
    raw = req.query.get(name)
    return None if raw is None or raw == "" else raw


def _integer(name: str, raw: str, lo: int, hi: int) -> int:
    """``raw`` as an ASCII decimal integer in ``lo..hi`` (int() alone takes other scripts'
    digits, spaces and underscores, and any length)."""
    if not _INTEGER.fullmatch(raw) or not lo <= (value := int(raw)) <= hi:
        raise BadParameter(name, f"{name} must be an integer from {lo} to {hi}, got {_shown(raw)}")
    return value


def _time(req: web.Request, name: str) -> int | None:
    raw = _raw(req, name)
    if raw is None:
        return None
    expected = f"{name} must be epoch milliseconds (0 to {MAX_TIMESTAMP_MS}) or ISO 8601"
    if _INTEGER.fullmatch(raw) or raw.lstrip("-").isdigit():
        try:
            return _integer(name, raw, 0, MAX_TIMESTAMP_MS)
        except BadParameter:
            raise BadParameter(name, f"{expected}, got {_shown(raw)}") from None
    if len(raw) > 64 or not raw.isascii():
        raise BadParameter(name, f"{expected}, got {_shown(raw)}")
    try:
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadParameter(name, f"{expected}, got {_shown(raw)}") from None
    if dt.tzinfo is None:
        raise BadParameter(name, f"{name} needs a time zone (e.g. 'Z'), got {_shown(raw)}")
    try:
        value = int(dt.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        value = -1
    if not 0 <= value <= MAX_TIMESTAMP_MS:
        raise BadParameter(name, f"{expected}, got {_shown(raw)}")
    return value


def _limit(req: web.Request) -> int:
    raw = _raw(req, "limit")
    return 50 if raw is None else _integer("limit", raw, 1, MAX_PAGE_SIZE)


def _text(req: web.Request, name: str, *, required: bool, max_len: int = 256) -> str | None:
    raw = _raw(req, name)
    if raw is None:
        if required:
            raise BadParameter(name, f"{name} is required")
        return None
    if len(raw) > max_len:
        raise BadParameter(name, f"{name} is longer than {max_len} characters")
    # U+FFFD is what an invalid UTF-8 percent-escape decodes to; surrogates cannot be stored.
    if any(unicodedata.category(c) in ("Cc", "Cs") or c == "\ufffd" for c in raw):
        raise BadParameter(name, f"{name} holds control characters or invalid UTF-8")
    return raw


def _flag(req: web.Request, name: str) -> bool:
    raw = _raw(req, name)
    if raw not in (None, "0", "1"):
        raise BadParameter(name, f"{name} must be 0 or 1, got {_shown(raw)}")
    return raw == "1"


def _cursor(req: web.Request) -> str | None:
    raw = _raw(req, "cursor")
    if raw is not None and (len(raw) > _MAX_CURSOR_CHARS or not _CURSOR.fullmatch(raw)):
        raise BadParameter("cursor", "cursor is invalid (not a next_cursor of this API)")
    return raw


def _range(req: web.Request) -> tuple[int | None, int | None]:
    begin, end = _time(req, "begin"), _time(req, "end")
    if begin is not None and end is not None and end < begin:
        raise BadParameter("end", "end is before begin")
    return begin, end


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadParameter as exc:
        return _error(400, str(exc), exc.parameter)


def bearer_matches(header: str, token: str) -> bool:
    """``Authorization: Bearer <token>``: the scheme in any case (RFC 6750 via RFC 7235), the
    token compared in constant time."""
    scheme, _, given = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def auth_middleware(token: str | None) -> Any:
    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        if (
            token is None
            or path in OPEN_PATHS
            or path in ("/", "/viewer")
            or path.startswith("/static/")
        ):
            return await handler(request)
        if not bearer_matches(request.headers.get("Authorization", ""), token):
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return guard


async def get_trace(req: web.Request) -> web.Response:
    raw = req.match_info["msg_id"]
    if not _LOOKUP_ID.fullmatch(raw):
        raise BadParameter(
            "msg_id",
            "msg_id must be a msgId or an offsetMsgId: 32 hexadecimal characters (56 with an "
            f"IPv6 address), got {_shown(raw)}",
        )
    # Both ids are written in upper case; a pasted lower-case copy names the same message.
    msg_id = raw.upper()
    local = _flag(req, "local")
    q = req.app[QUERIES_KEY]
    events, failed = await q.trace_events(msg_id, local=local)
    found_by = "msg_id"
    # Not a msgId we know: it may be an offsetMsgId (store host + queue + Kafka offset), which
    # the message's Pub trace recorded. Peers are asked with local=1 and never resolve one, so
    # their answers stay about the id they were asked for.
    if not events and not local:
        real = await q._local(q.store.msg_id_by_offset_msg_id, msg_id)
        if real is not None:
            events, failed = await q.trace_events(real, local=local)
            msg_id, found_by = real, "offset_msg_id"
    source = "store"
    if events:
        if not local:
            metrics.LOOKUPS.labels(kind="msg_id", source="store").inc()
    elif not local:
        # No live store knows it (its collector lost its disk, or retention passed): the lake.
        events = await q.lake_trace(msg_id)
        source = "lake"
    if not events:
        return _error(404, f"no trace for msgId {msg_id}", peers_failed=failed)
    body = build_view(msg_id, events)
    if found_by == "offset_msg_id":
        body["offset_msg_id_query"] = _offset_place(raw.upper())
    return web.json_response(
        {**body, "found_by": found_by, "source": source, "peers_failed": failed}
    )


def _offset_place(offset_msg_id: str) -> dict[str, Any]:
    info = decode_offset_msg_id(offset_msg_id)
    return {
        "offset_msg_id": offset_msg_id,
        "store_host": info.store_host,
        "queue_id": info.queue_id,
        "kafka_offset": info.kafka_offset,
    }


async def find_traces(req: web.Request) -> web.Response:
    key = _text(req, "key", required=True)
    topic = _text(req, "topic", required=False, max_len=127)
    begin, end = _range(req)
    return await _listing(req, "key", {"first": key, "topic": topic, "begin": begin, "end": end})


async def list_messages(req: web.Request) -> web.Response:
    topic = _text(req, "topic", required=True, max_len=127)
    begin, end = _range(req)
    return await _listing(req, "messages", {"first": topic, "begin": begin, "end": end})


async def _listing(req: web.Request, kind: str, params: dict[str, Any]) -> web.Response:
    limit = _limit(req)
    cursor = _cursor(req)
    local = _flag(req, "local")
    outcomes = _flag(req, "outcomes")
    try:
        items, nxt, failed = await req.app[QUERIES_KEY].listing(
            kind, params, limit=limit, cursor=cursor, local=local
        )
    except BadCursor:
        raise BadParameter("cursor", "cursor is invalid (not a next_cursor of this API)") from None
    if outcomes and not local:
        failed += await add_outcomes(req.app.get(GROUPS_KEY), req.app[QUERIES_KEY], items)
    return web.json_response({"items": items, "next_cursor": nxt, "peers_failed": failed})


def _health(req: web.Request) -> GroupHealth:
    health = req.app.get(GROUPS_KEY)
    if health is None:
        raise web.HTTPServiceUnavailable(
            text='{"error": "group health needs the routing database"}',
            content_type="application/json",
        )
    return health


async def groups_status(req: web.Request) -> web.Response:
    try:
        return web.json_response(await _health(req).status(None))
    except (RedisError, OSError) as exc:
        return _error(503, f"the routing database did not answer: {exc!r}"[:300])


async def group_status(req: web.Request) -> web.Response:
    raw = req.match_info["group"]
    if len(raw) > 255 or not re.fullmatch(r"[%|a-zA-Z0-9_-]+", raw):
        raise BadParameter("group", f"group must be a consumer group name, got {_shown(raw)}")
    try:
        return web.json_response(await _health(req).status(raw))
    except UnknownGroup:
        return _error(404, f"no consumer group {raw!r}: no subscription of it was ever seen")
    except (RedisError, OSError) as exc:
        return _error(503, f"the routing database did not answer: {exc!r}"[:300])


async def groups_activity(req: web.Request) -> web.Response:
    """This collector's consume activity (a peer's part of a group status; always local)."""
    since = _time(req, "since")
    until = _time(req, "until")
    if since is None or until is None:
        raise BadParameter("since" if since is None else "until", "since and until are required")
    if until < since:
        raise BadParameter("until", "until is before since")
    if until - since > MAX_ACTIVITY_WINDOW_MS:
        raise BadParameter("until", "since to until spans more than two hours")
    group = _text(req, "group", required=False, max_len=255)
    return web.json_response(await _health(req).local_activity(since, until, group))


async def list_quarantine(req: web.Request) -> web.Response:
    limit = _limit(req)
    q = req.app[QUERIES_KEY]
    rows = await q._local(q.store.quarantine_rows, limit)
    count = await q._local(q.store.quarantine_count)
    out = [
        {k: (v.hex() if isinstance(v, bytes | bytearray) else v) for k, v in r.items()}
        for r in rows
    ]
    return web.json_response({"count": count, "items": out})


async def otlp_traces(req: web.Request) -> web.Response:
    """OTLP/HTTP trace export (see :mod:`tracemq_collector.otlp`)."""
    receiver = req.app.get(OTLP_KEY)
    if receiver is None:
        return _error(503, "this collector does not take OTLP")
    status, body, ctype = await receiver.export(await req.read(), req.content_type)
    return web.Response(status=status, body=body, content_type=ctype)


async def openapi(_req: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


async def page(_req: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "viewer.html")


def add_routes(
    app: web.Application,
    queries: Queries,
    token: str | None,
    groups: GroupHealth | None = None,
    otlp: Any = None,
) -> None:
    app[QUERIES_KEY] = queries
    app[GROUPS_KEY] = groups
    app[OTLP_KEY] = otlp
    app.middlewares.append(auth_middleware(token))
    app.middlewares.append(errors_middleware)
    app.router.add_get("/api/v1/traces/{msg_id}", get_trace)
    app.router.add_get("/api/v1/traces", find_traces)
    app.router.add_get("/api/v1/messages", list_messages)
    app.router.add_get("/api/v1/quarantine", list_quarantine)
    app.router.add_get("/api/v1/groups", groups_status)
    app.router.add_get("/api/v1/groups/{group}", group_status)
    app.router.add_get("/api/v1/groups-activity", groups_activity)
    app.router.add_get("/api/v1/openapi.json", openapi)
    app.router.add_post("/v1/traces", otlp_traces)
    app.router.add_get("/", page)
    app.router.add_get("/viewer", page)
    if STATIC.is_dir():
        app.router.add_static("/static/", STATIC)
