"""The one way tests talk to a collector's HTTP API and /metrics: with the session's token.

Every stack of the test session shares :data:`tests.conftest.SESSION_SECRETS`, so every collector it
starts wants ``Authorization: Bearer <SESSION_SECRETS.collector_api_token>``; a test of the guard
itself passes ``token=None`` (no header) or another token.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from tests.conftest import SESSION_SECRETS

#: the token every collector of the test session requires
TOKEN = SESSION_SECRETS.collector_api_token

_DEFAULT: Any = object()


def headers(token: str | None = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def http(url: str, token: str | None = _DEFAULT, *, timeout: float = 10) -> tuple[int, Any]:
    """GET ``url``: ``(status, body)``, the body as JSON when it is JSON, else bytes; an HTTP
    error is returned as its status, never raised."""
    req = urllib.request.Request(url, headers=headers(TOKEN if token is _DEFAULT else token))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
            return resp.status, _decode(body)
    except urllib.error.HTTPError as exc:
        return exc.code, _decode(exc.read())


def get_json(url: str, token: str | None = _DEFAULT, *, timeout: float = 10) -> Any:
    """GET ``url`` and return its JSON body; AssertionError on any status but 200."""
    status, body = http(url, token, timeout=timeout)
    assert status == 200, f"GET {url} answered {status}: {body!r}"
    return body


def get_text(url: str, token: str | None = _DEFAULT, *, timeout: float = 10) -> str:
    """GET ``url`` (e.g. ``/metrics``) as text; raises ``urllib.error.HTTPError`` on an error."""
    req = urllib.request.Request(url, headers=headers(TOKEN if token is _DEFAULT else token))
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(resp.read().decode())


async def ahttp(url: str, token: str | None = _DEFAULT, *, timeout: float = 10) -> tuple[int, Any]:
    """:func:`http` off the event loop."""
    return await asyncio.to_thread(http, url, token, timeout=timeout)


def _decode(body: bytes) -> Any:
    if body[:1] in (b"{", b"["):
        try:
            return json.loads(body)
        except ValueError:
            return body
    return body
