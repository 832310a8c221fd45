"""The collector's HTTP API (``/api/v1``), the trace viewer page and the bearer-token guard.

Bad parameters answer 400 with ``{"error": ..., "parameter": ...}``; an unknown message 404.
With ``TRACEMQ_COLLECTOR_API_TOKEN`` set, every data endpoint and /metrics need
``Authorization: Bearer <token>``; /healthz and the page's static shell stay open (they hold no
trace data; the page asks for the token when the API answers 401).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from tracemq_collector.openapi import OPENAPI
from tracemq_collector.queries import Queries
from tracemq_collector.view import build_view

STATIC = Path(__file__).parent / "static"
_MSG_ID = re.compile(r"^[0-9A-Za-z_.:-]{1,128}$")
QUERIES_KEY: web.AppKey[Queries] = web.AppKey("queries", Queries)
OPEN_PATHS = ("/healthz",)


class BadParameter(Exception):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


def _error(status: int, message: str, parameter: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if parameter:
        body["parameter"] = parameter
    return web.json_response(body, status=status)


def _time(req: web.Request, name: str) -> int | None:
    raw = req.query.get(name)
    if raw is None or raw == "":
        return None
    if re.fullmatch(r"-?\d+", raw):
        value = int(raw)
    else:
        try:
            dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise BadParameter(
                name, f"{name} must be epoch milliseconds or ISO 8601, got {raw!r}"
            ) from None
        if dt.tzinfo is None:
            raise BadParameter(name, f"{name} needs a time zone (e.g. 'Z'), got {raw!r}")
        value = int(dt.timestamp() * 1000)
    if value < 0:
        raise BadParameter(name, f"{name} must not be negative, got {raw!r}")
    return value


def _limit(req: web.Request) -> int:
    raw = req.query.get("limit", "50")
    if not re.fullmatch(r"\d+", raw) or not 1 <= int(raw) <= 1000:
        raise BadParameter("limit", f"limit must be an integer from 1 to 1000, got {raw!r}")
    return int(raw)


def _text(req: web.Request, name: str, *, required: bool, max_len: int = 256) -> str | None:
    raw = req.query.get(name)
    if raw is None or raw == "":
        if required:
            raise BadParameter(name, f"{name} is required")
        return None
    if len(raw) > max_len or any(c in raw for c in "\x00\x01\x02"):
        raise BadParameter(name, f"{name} is invalid (too long or control characters)")
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
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer ") or not hmac.compare_digest(
            given[7:].encode(), token.encode()
        ):
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return guard


async def get_trace(req: web.Request) -> web.Response:
    msg_id = req.match_info["msg_id"]
    if not _MSG_ID.match(msg_id):
        raise BadParameter("msg_id", f"msg_id {msg_id[:40]!r} is not a message id")
    local = req.query.get("local") == "1"
    events = await req.app[QUERIES_KEY].trace_events(msg_id, local=local)
    if not events:
        return _error(404, f"no trace for msgId {msg_id}")
    return web.json_response(build_view(msg_id, events))


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
    cursor = _text(req, "cursor", required=False, max_len=4096)
    try:
        items, nxt = await req.app[QUERIES_KEY].listing(
            kind, params, limit=limit, cursor=cursor, local=req.query.get("local") == "1"
        )
    except ValueError as exc:
        if "cursor" in str(exc):
            raise BadParameter("cursor", "cursor is invalid") from None
        raise
    return web.json_response({"items": items, "next_cursor": nxt})


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


async def openapi(_req: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


async def page(_req: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "viewer.html")


def add_routes(app: web.Application, queries: Queries, token: str | None) -> None:
    app[QUERIES_KEY] = queries
    app.middlewares.append(auth_middleware(token))
    app.middlewares.append(errors_middleware)
    app.router.add_get("/api/v1/traces/{msg_id}", get_trace)
    app.router.add_get("/api/v1/traces", find_traces)
    app.router.add_get("/api/v1/messages", list_messages)
    app.router.add_get("/api/v1/quarantine", list_quarantine)
    app.router.add_get("/api/v1/openapi.json", openapi)
    app.router.add_get("/", page)
    app.router.add_get("/viewer", page)
    if STATIC.is_dir():
        app.router.add_static("/static/", STATIC)
