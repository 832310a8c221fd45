"""Hostile HTTP input to the collector API (finding 7 of issue 20), and schemathesis against the
collector's own OpenAPI document.

Every route answers bad input with a 4xx — a 400 naming the parameter where one is at fault —
and never a 5xx: numbers too large for SQLite or for int() (over 4 300 digits), digits of other
scripts, control characters, NUL bytes, invalid UTF-8 percent-escapes, over-long strings and
cursors the API never handed out.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import aiohttp
import pytest
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from yarl import URL

from tests.support.collector_api import headers

MSG_ID = "7F0000010000000000000000000000AA"
HUGE = "9" * 5000


def api(proc: ManagedProcess) -> str:
    return f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"


def _multi(cursors: Any) -> str:
    return "m" + base64.urlsafe_b64encode(json.dumps(cursors).encode()).decode()


# (path and query as sent, the parameter the 400 must name)
PARAMETER_ABUSE: list[tuple[str, str]] = [
    ("/api/v1/messages?topic=T&begin=9223372036854775808", "begin"),
    ("/api/v1/messages?topic=T&begin=99999999999999999999", "begin"),
    (f"/api/v1/messages?topic=T&end={HUGE}", "end"),
    ("/api/v1/messages?topic=T&end=-9223372036854775809", "end"),
    ("/api/v1/messages?topic=T&begin=-1", "begin"),
    ("/api/v1/messages?topic=T&begin=%D9%A1%D9%A2%D9%A3", "begin"),  # Arabic-Indic 123
    ("/api/v1/messages?topic=T&begin=%EF%BC%91", "begin"),  # fullwidth 1
    ("/api/v1/messages?topic=T&begin=1e3", "begin"),
    ("/api/v1/messages?topic=T&begin=0x10", "begin"),
    ("/api/v1/messages?topic=T&begin=%00", "begin"),
    ("/api/v1/messages?topic=T&begin=0001-01-01T00:00:00%2B14:00", "begin"),
    ("/api/v1/messages?topic=T&begin=9999-12-31T23:59:59-14:00", "begin"),
    ("/api/v1/messages?topic=T&begin=" + "2026-01-01T00:00:00Z" * 50, "begin"),
    ("/api/v1/messages?topic=T&begin=2000&end=1000", "end"),
    ("/api/v1/messages?topic=T&limit=0", "limit"),
    ("/api/v1/messages?topic=T&limit=1001", "limit"),
    ("/api/v1/messages?topic=T&limit=-1", "limit"),
    ("/api/v1/messages?topic=T&limit=9223372036854775808", "limit"),
    (f"/api/v1/messages?topic=T&limit={HUGE}", "limit"),
    ("/api/v1/messages?topic=T&limit=%D9%A5", "limit"),  # Arabic-Indic 5
    ("/api/v1/messages?topic=T&limit=1_0", "limit"),
    ("/api/v1/messages?topic=T&limit=+10", "limit"),
    ("/api/v1/messages?topic=T&limit=10%0A", "limit"),
    ("/api/v1/messages?topic=T&local=true", "local"),
    ("/api/v1/messages", "topic"),
    ("/api/v1/messages?topic=" + "T" * 128, "topic"),
    ("/api/v1/messages?topic=T%00", "topic"),
    ("/api/v1/messages?topic=%FF%FE", "topic"),
    ("/api/v1/messages?topic=%ED%A0%80", "topic"),  # an encoded UTF-16 surrogate
    ("/api/v1/messages?topic=T%1B%5B31m", "topic"),
    ("/api/v1/messages?topic=T&cursor=garbage!", "cursor"),
    ("/api/v1/messages?topic=T&cursor=%00", "cursor"),
    ("/api/v1/messages?topic=T&cursor=mZm9v", "cursor"),
    ("/api/v1/messages?topic=T&cursor=m%FF", "cursor"),
    ("/api/v1/messages?topic=T&cursor=" + _multi([1, 2]), "cursor"),
    ("/api/v1/messages?topic=T&cursor=" + _multi({"x": 1}), "cursor"),
    ("/api/v1/messages?topic=T&cursor=" + "A" * 7000, "cursor"),
    ("/api/v1/messages?topic=T&local=1&cursor=AAAAAAAAAAAAAAAAAAAAAAAA", "cursor"),
    ("/api/v1/messages?topic=T&local=1&cursor=" + "A" * 4000, "cursor"),
    ("/api/v1/traces", "key"),
    ("/api/v1/traces?key=", "key"),
    ("/api/v1/traces?key=" + "k" * 257, "key"),
    ("/api/v1/traces?key=a%00b", "key"),
    ("/api/v1/traces?key=%C3%28", "key"),  # invalid UTF-8
    ("/api/v1/traces?key=k&topic=%7F", "topic"),
    ("/api/v1/traces?key=k&begin=99999999999999999999", "begin"),
    (f"/api/v1/traces?key=k&end={HUGE}", "end"),
    ("/api/v1/traces?key=k&limit=%EF%BC%95", "limit"),
    ("/api/v1/traces?key=k&cursor=" + _multi({"http://127.0.0.1:1": "AAAA"}) + "!", "cursor"),
    ("/api/v1/traces/ABC%0A", "msg_id"),
    ("/api/v1/traces/ABC%00", "msg_id"),
    ("/api/v1/traces/%FF%FE", "msg_id"),
    ("/api/v1/traces/%D9%A1%D9%A2", "msg_id"),
    ("/api/v1/traces/" + "A" * 129, "msg_id"),
    (f"/api/v1/traces/{MSG_ID}?local=2", "local"),
    ("/api/v1/quarantine?limit=0", "limit"),
    ("/api/v1/quarantine?limit=99999999999999999999", "limit"),
    (f"/api/v1/quarantine?limit={HUGE}", "limit"),
    ("/api/v1/quarantine?limit=%EF%BC%95", "limit"),
]
# Abuse that is not one parameter's fault: any 4xx will do, never a 5xx.
OTHER_ABUSE = [
    "/api/v1/traces/",
    "/api/v1/traces/a/b",
    "/api/v1/traces/%2F%2E%2E",
    "/api/v1/nothing",
    "/api/v1/traces/" + "A" * 7000,
    "/static/%00",
    "/static/../../etc/passwd",
]


async def _status(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(URL(url, encoded=True)) as resp:
        text = await resp.text(errors="replace")
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def test_abuse_on_every_route_is_a_400_naming_the_parameter_never_a_5xx(
    collector: ManagedProcess,
) -> None:
    base = api(collector)
    wrong: list[tuple[str, Any, Any]] = []
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=15), headers=headers()
    ) as session:
        for path, parameter in PARAMETER_ABUSE:
            status, body = await _status(session, base + path)
            named = body.get("parameter") if isinstance(body, dict) else None
            if (status, named) != (400, parameter):
                wrong.append((path[:80], status, str(body)[:200]))
            elif len(body["error"]) > 300:
                wrong.append((path[:80], "echoes the whole value", len(body["error"])))
        for path in OTHER_ABUSE:
            status, body = await _status(session, base + path)
            if not 400 <= status < 500:
                wrong.append((path[:80], status, str(body)[:200]))
        # unknown parameters are ignored; still serving after all of that (a topic no other
        # test sends to: the collector is the session's, and other tests' traces are in it)
        nowhere = f"AbuseNowhere{uuid.uuid4().hex[:12]}"
        status, body = await _status(
            session, f"{base}/api/v1/messages?topic={nowhere}&{'x=1&' * 500}"
        )
        assert status == 200 and body["items"] == []
    assert wrong == []


@pytest.mark.timeout(180)
def test_schemathesis_finds_no_5xx_and_no_answer_contradicting_the_document(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.result import Ok
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    token = f"tok-{unique}"
    # A second collector with a token of its own: the stack's collector (another token, so an
    # unproven registration) shows up in its answers' peers_failed, which the document must
    # describe too.
    proc = fault_stack.start_collector("collector-2", TRACEMQ_COLLECTOR_API_TOKEN=token)
    base = api(proc)
    auth = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_url(f"{base}/api/v1/openapi.json", headers=auth)
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    ran = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the document itself is valid
        operation = result.ok()
        modes = [GenerationMode.POSITIVE]
        if operation.query or operation.path_parameters:
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:

            @settings(
                max_examples=25,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case: Any) -> None:
                case.call_and_validate(base_url=base, headers=auth, checks=checks, timeout=10)

            call()
            ran += 1
    assert ran >= 8  # every documented operation, and the negative cases of the parameterised
