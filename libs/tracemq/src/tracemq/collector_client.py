"""A small client of the collector's query API (``/api/v1``, see ``docs/collector-api.md``):
the one place a request to a collector is built, with its bearer token. The command line
(``tracemq trace``, ``tracemq group``) and the demo use it.

- :class:`CollectorClient` ``(url, token)`` answers parsed JSON, or raises
  :class:`~tracemq.errors.CollectorError` (the collector answered an error: ``status`` is the
  HTTP status; a refused token says how to find the right one) or
  :class:`~tracemq.errors.CollectorUnreachableError` (it did not answer, or not with JSON
  from an API: retriable). The message names the collector; never the token.
- :func:`locate` finds the collector the way every command does: the ``url`` given, else
  ``TRACEMQ_COLLECTOR_URL``, else the running dev stack's (``tracemq dev up``); and its token:
  ``TRACEMQ_COLLECTOR_API_TOKEN``, else the running stack's when the URL is its collector (a
  stack's token is never sent to another URL). A URL that is not ``http(s)://host[:port]``
  raises :class:`~tracemq.errors.ConfigError` naming where it came from.

Requests are blocking (``urllib``) with a timeout: for command-line tools and scripts, not for
an event loop.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tracemq.errors import CollectorError, CollectorUnreachableError, ConfigError, TracemqError

URL_ENV = "TRACEMQ_COLLECTOR_URL"
TOKEN_ENV = "TRACEMQ_COLLECTOR_API_TOKEN"  # noqa: S105 - the variable's name, not a token


class CollectorClient:
    """GETs on one collector's API; see the module docstring."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """``GET <url><path>?<params>`` (None values left out) as parsed JSON."""
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        req = urllib.request.Request(f"{self.url}{path}" + (f"?{query}" if query else ""))  # noqa: S310
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error")
            except ValueError:
                detail = exc.reason
            if exc.code == 401:
                raise CollectorError(
                    f"the collector at {self.url} refused the token ({detail}); set "
                    f"{TOKEN_ENV} (`tracemq dev status` shows the dev stack's)",
                    exc.code,
                ) from None
            raise CollectorError(
                f"the collector at {self.url} answered {exc.code}: {detail}", exc.code
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CollectorUnreachableError(
                f"the collector at {self.url} did not answer ({reason}); check `tracemq dev "
                f"status`, --url or {URL_ENV}"
            ) from None
        except ValueError as exc:  # not JSON: something else listens there (the viewer page?)
            raise CollectorError(f"{self.url}{path} did not answer JSON: {exc}") from None

    def trace(self, msg_id: str) -> dict[str, Any]:
        """The trace view of one message (``GET /api/v1/traces/{msg_id}``)."""
        view: dict[str, Any] = self.get_json(f"/api/v1/traces/{urllib.parse.quote(msg_id)}")
        return view

    def find(
        self,
        key: str,
        *,
        topic: str | None = None,
        begin_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """Messages carrying a business key, newest first (``GET /api/v1/traces?key=``)."""
        res: dict[str, Any] = self.get_json(
            "/api/v1/traces",
            {"key": key, "topic": topic, "begin": begin_ms, "end": end_ms, "limit": limit},
        )
        return res

    def groups(self, group: str | None = None) -> dict[str, Any]:
        """Consumer-group health, of every group or one (``GET /api/v1/groups[/{group}]``)."""
        path = "/api/v1/groups" + (f"/{urllib.parse.quote(group, safe='')}" if group else "")
        res: dict[str, Any] = self.get_json(path)
        return res


def _running_stack() -> dict[str, Any]:
    try:
        from tracemq.cli._connection import dev_state
    except ImportError:  # a client-only install (no ``cli`` extra): no stack registry to read
        return {}
    return dev_state() or {}


def locate(url: str | None = None, *, timeout_s: float = 15.0) -> CollectorClient:
    """The collector the commands talk to, with its token (see the module docstring)."""
    found = url or os.environ.get(URL_ENV) or _running_stack().get("collector_api")
    if not found:
        raise CollectorUnreachableError(
            f"no collector: pass --url, set {URL_ENV}, or run `tracemq dev up --collector`"
        )
    found = str(found).rstrip("/")
    parts = urllib.parse.urlsplit(found)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        where = (
            "--url"
            if url
            else URL_ENV
            if os.environ.get(URL_ENV)
            else "the running stack's collector URL"
        )
        raise ConfigError(f"{where}: {found!r} is not a collector URL (like http://127.0.0.1:8080)")
    return CollectorClient(found, _token(found), timeout_s=timeout_s)


def _token(url: str) -> str | None:
    env = os.environ.get(TOKEN_ENV)
    if env:
        return env
    try:
        state = _running_stack()
    except TracemqError:  # several stacks and none picked: no token to guess
        return None
    if str(state.get("collector_api") or "").rstrip("/") == url:
        return str(state.get("collector_api_token") or "") or None
    return None
