"""The trace viewer page in a real headless Chromium, against a fake collector API.

The fake API serves canned JSON in the shape of the collector's contract
(``GET /api/v1/traces/{msg_id}`` and ``GET /api/v1/traces?key=…``); the page's own static files
are served from the collector package, at the paths the collector serves them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import tracemq_collector
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Page, Route

from tests.support.browser import (
    BrowserSession,
    ChromiumNotFound,
    chromium,
    find_chromium,
    save_doc_screenshot,
    save_screenshot,
)

pytestmark = pytest.mark.browser

STATIC_DIR = Path(tracemq_collector.__file__).resolve().parent / "static"

T0 = 1_717_171_717_000  # 2024-05-31T16:08:37.000Z
MAIN_ID = "7F0000010A1B2C3D4E5F0123456789AB"
TX_ID = "7F0000010A1B2C3D4E5F012345678A01"
NOPUB_ID = "7F0000010A1B2C3D4E5F012345678B02"
DLQ_ID = "7F0000010A1B2C3D4E5F012345678C03"
MISSING_ID = "0A0000020000000000000000DEADBEEF"
TOPIC = "orders"
TOKEN = "s3cret"


# ---- canned API data ---------------------------------------------------------------------------


def _event(trace_type: str, offset: int, **fields: Any) -> dict[str, Any]:
    base = {
        "trace_type": trace_type,
        "timestamp": None,
        "group_name": None,
        "request_id": None,
        "cost_time": None,
        "success": None,
        "context_code": None,
        "topic": TOPIC,
        "msg_id": MAIN_ID,
        "tags": "created",
        "keys": "order-42",
        "store_host": None,
        "client_host": None,
        "retry_times": None,
        "trace_topic": "RMQ_SYS_TRACE_TOPIC",
        "trace_partition": 3,
        "trace_offset": 1000 + offset,
    }
    base.update(fields)
    return base


def _attempt(
    request_id: str,
    retry: int,
    begin: int | None,
    end: int | None,
    status: str,
    code: int | None,
    client: str,
) -> dict[str, Any]:
    names = {0: "SUCCESS", 1: "TIME_OUT", 2: "EXCEPTION", 3: "RETURNNULL", 4: "FAILED"}
    return {
        "request_id": request_id,
        "retry_times": retry,
        "begin": None if begin is None else T0 + begin,
        "end": None if end is None else T0 + end,
        "cost_time": None if begin is None or end is None else end - begin,
        "status": status,
        "context_code": code,
        "context_code_name": None if code is None else names[code],
        "client_host": client,
        "client_id": f"{client}@{4000 + retry}",
    }


MAIN_TRACE: dict[str, Any] = {
    "msg_id": MAIN_ID,
    "topic": TOPIC,
    "producer": {
        "group": "order-producer",
        "timestamp": T0,
        "cost_time": 12,
        "success": True,
        "store_host": "10.0.0.5:10911",
        "msg_type": 0,
        "msg_type_name": "Normal_Msg",
        "offset_msg_id": "0A00000500002A9F0001000000000457",
        "region_id": "DefaultRegion",
        "client_host": "10.0.0.9",
    },
    "transactions": [],
    "consumers": [
        {
            "group": "billing-service",
            "attempts": [
                _attempt("req-bill-1", 0, 41, 96, "failed", 4, "10.0.0.21"),
                _attempt("req-bill-2", 1, 1058, 1089, "success", 0, "10.0.0.22"),
            ],
        },
        {
            "group": "audit-log",
            "attempts": [_attempt("req-audit-1", 0, 35, 35, "success", 0, "10.0.0.31")],
        },
        {
            "group": "search-indexer",
            "attempts": [_attempt("req-search-1", 0, 62, None, "unknown", None, "10.0.0.41")],
        },
    ],
    "events": [
        _event(
            "Pub",
            0,
            timestamp=T0,
            group_name="order-producer",
            cost_time=12,
            success=True,
            store_host="10.0.0.5:10911",
            client_host="10.0.0.9",
        ),
        _event(
            "SubBefore",
            1,
            timestamp=T0 + 35,
            group_name="audit-log",
            request_id="req-audit-1",
            retry_times=0,
            client_host="10.0.0.31",
        ),
        _event(
            "SubAfter",
            2,
            timestamp=T0 + 35,
            group_name="audit-log",
            request_id="req-audit-1",
            cost_time=0,
            success=True,
            context_code=0,
        ),
        _event(
            "SubBefore",
            3,
            timestamp=T0 + 41,
            group_name="billing-service",
            request_id="req-bill-1",
            retry_times=0,
            client_host="10.0.0.21",
        ),
        _event(
            "SubBefore",
            4,
            timestamp=T0 + 62,
            group_name="search-indexer",
            request_id="req-search-1",
            retry_times=0,
            client_host="10.0.0.41",
        ),
        _event(
            "SubAfter",
            5,
            timestamp=T0 + 96,
            group_name="billing-service",
            request_id="req-bill-1",
            cost_time=55,
            success=False,
            context_code=4,
        ),
        _event(
            "SubBefore",
            6,
            timestamp=T0 + 1058,
            group_name="billing-service",
            request_id="req-bill-2",
            retry_times=1,
            client_host="10.0.0.22",
        ),
        _event(
            "SubAfter",
            7,
            timestamp=T0 + 1089,
            group_name="billing-service",
            request_id="req-bill-2",
            cost_time=31,
            success=True,
            context_code=0,
        ),
    ],
}

TX_TRACE: dict[str, Any] = {
    "msg_id": TX_ID,
    "topic": TOPIC,
    "producer": {
        "group": "order-producer",
        "timestamp": T0 + 5000,
        "cost_time": 9,
        "success": True,
        "store_host": "10.0.0.5:10911",
        "msg_type": 1,
        "msg_type_name": "Trans_Msg_Half",
        "offset_msg_id": "0A00000500002A9F0001000000000999",
        "region_id": "DefaultRegion",
        "client_host": "10.0.0.9",
    },
    "transactions": [
        {
            "timestamp": T0 + 5030,
            "group": "order-producer",
            "transaction_id": "TX-0001",
            "transaction_state": "COMMIT_MESSAGE",
            "from_transaction_check": False,
            "msg_type": 2,
        }
    ],
    "consumers": [
        {
            "group": "billing-service",
            "attempts": [_attempt("req-tx-1", 0, 5060, 5075, "success", 0, "10.0.0.21")],
        }
    ],
    "events": [
        _event(
            "Pub",
            0,
            msg_id=TX_ID,
            timestamp=T0 + 5000,
            group_name="order-producer",
            cost_time=9,
            success=True,
        ),
        _event(
            "EndTransaction",
            1,
            msg_id=TX_ID,
            timestamp=T0 + 5030,
            group_name="order-producer",
            transaction_id="TX-0001",
            transaction_state="COMMIT_MESSAGE",
        ),
        _event(
            "SubBefore",
            2,
            msg_id=TX_ID,
            timestamp=T0 + 5060,
            group_name="billing-service",
            request_id="req-tx-1",
            retry_times=0,
        ),
        _event(
            "SubAfter",
            3,
            msg_id=TX_ID,
            timestamp=T0 + 5075,
            group_name="billing-service",
            request_id="req-tx-1",
            cost_time=15,
            success=True,
            context_code=0,
        ),
    ],
}

NOPUB_TRACE: dict[str, Any] = {
    "msg_id": NOPUB_ID,
    "topic": TOPIC,
    "producer": None,
    "transactions": [],
    "consumers": [
        {
            "group": "late-consumer",
            "attempts": [_attempt("req-late-1", 2, 800, 840, "success", 0, "10.0.0.51")],
        }
    ],
    "events": [
        _event(
            "SubBefore",
            0,
            msg_id=NOPUB_ID,
            timestamp=T0 + 800,
            group_name="late-consumer",
            request_id="req-late-1",
            retry_times=2,
        ),
        _event(
            "SubAfter",
            1,
            msg_id=NOPUB_ID,
            timestamp=T0 + 840,
            group_name="late-consumer",
            request_id="req-late-1",
            cost_time=40,
            success=True,
            context_code=0,
        ),
    ],
}

DLQ_TRACE: dict[str, Any] = {
    "msg_id": DLQ_ID,
    "topic": TOPIC,
    "producer": {**MAIN_TRACE["producer"], "timestamp": T0},
    "transactions": [],
    "consumers": [
        {
            "group": "billing-service",
            "dead_lettered": True,
            "attempts": [
                _attempt("req-d-0", 0, 40, 50, "failed", 4, "10.0.0.21"),
                _attempt("req-d-1", 1, 10050, 10060, "failed", 2, "10.0.0.21"),
            ],
        }
    ],
    "dead_letters": [
        {
            "timestamp": T0 + 10070,
            "group": "billing-service",
            "topic": "%DLQ%billing-service",
            "success": True,
            "client_host": "10.0.0.21",
        }
    ],
    "events": [
        _event("Pub", 0, msg_id=DLQ_ID, timestamp=T0, group_name="order-producer", cost_time=12),
        _event(
            "Pub",
            1,
            msg_id=DLQ_ID,
            timestamp=T0 + 10070,
            group_name="billing-service",
            topic="%DLQ%billing-service",
            cost_time=2,
        ),
    ],
}

FAILED_ID = "7F0000010A1B2C3D4E5F012345678D04"
# A send that failed all three attempts: one Pub per attempt, none naming a store host.
FAILED_TRACE: dict[str, Any] = {
    "msg_id": FAILED_ID,
    "topic": TOPIC,
    "producer": {
        "group": "order-producer",
        "timestamp": T0,
        "cost_time": 3,
        "success": False,
        "store_host": None,
        "msg_type": 0,
        "msg_type_name": "Normal_Msg",
        "offset_msg_id": None,
        "region_id": "DefaultRegion",
        "client_host": "10.0.0.9",
        "send_attempts": 3,
    },
    "transactions": [],
    "consumers": [],
    "dead_letters": [],
    "events": [
        _event(
            "Pub",
            i,
            msg_id=FAILED_ID,
            timestamp=T0 + 5 * i,
            group_name="order-producer",
            cost_time=3,
            success=False,
            store_host="null" if i else None,
        )
        for i in range(3)
    ],  # fmt: skip
}

TRACES = {
    MAIN_ID: MAIN_TRACE,
    TX_ID: TX_TRACE,
    NOPUB_ID: NOPUB_TRACE,
    DLQ_ID: DLQ_TRACE,
    FAILED_ID: FAILED_TRACE,
}

KEY_ITEMS = [
    {"msg_id": MAIN_ID, "topic": TOPIC, "timestamp": T0, "keys": "order-42", "tags": "created"},
    {
        "msg_id": TX_ID,
        "topic": TOPIC,
        "timestamp": T0 + 5000,
        "keys": "order-42 tx",
        "tags": "paid",
    },
]


# ---- the fake collector ------------------------------------------------------------------------


class FakeCollector:
    """The page's static files at the collector's paths, plus canned API answers."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.authorizations: list[str | None] = []
        self.requests: list[str] = []

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/", self._page)
        app.router.add_get("/viewer", self._page)
        app.router.add_static("/static/", STATIC_DIR)
        app.router.add_get("/api/v1/traces", self._search)
        app.router.add_get("/api/v1/traces/{msg_id}", self._trace)
        return app

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/api/"):
            self.requests.append(request.path_qs)
            auth = request.headers.get("Authorization")
            self.authorizations.append(auth)
            if self.token is not None and auth != f"Bearer {self.token}":
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        return await handler(request)

    async def _page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC_DIR / "viewer.html")

    async def _trace(self, request: web.Request) -> web.Response:
        msg_id = request.match_info["msg_id"].upper()  # as the collector: either case
        trace = TRACES.get(msg_id)
        if trace is None:
            return web.json_response({"error": f"no trace for msgId {msg_id}"}, status=404)
        return web.json_response(trace)

    async def _search(self, request: web.Request) -> web.Response:
        key = request.query.get("key", "")
        cursor = request.query.get("cursor")
        if key == "*":
            return web.json_response(
                {"error": "wildcards are not supported; give an exact key", "parameter": "key"},
                status=400,
            )
        if key == "order-42":
            return web.json_response({"items": KEY_ITEMS, "next_cursor": None})
        if key == "many":  # two pages of one item each
            if cursor is None:
                return web.json_response({"items": KEY_ITEMS[:1], "next_cursor": "page-2"})
            return web.json_response({"items": KEY_ITEMS[1:], "next_cursor": None})
        return web.json_response({"items": [], "next_cursor": None})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[tuple[str, FakeCollector]]]]:
    """Start a fake collector (optionally requiring a bearer token); returns (base URL, fake)."""
    servers: list[TestServer] = []

    async def start(token: str | None = None) -> tuple[str, FakeCollector]:
        fake = FakeCollector(token)
        server = TestServer(fake.app())
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/"), fake

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def site(serve: Callable[..., Awaitable[tuple[str, FakeCollector]]]) -> str:
    base, _ = await serve()
    return base


@pytest.fixture
async def browser() -> AsyncIterator[BrowserSession]:
    try:
        find_chromium()
    except ChromiumNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
    async with chromium() as session:
        yield session
        session.assert_no_page_errors()
        assert not session.script_console_errors(), session.script_console_errors()


# ---- helpers -----------------------------------------------------------------------------------


async def open_trace(page: Page, base: str, msg_id: str) -> None:
    await page.goto(f"{base}/?msgId={msg_id}")
    await page.wait_for_selector('body[data-state="trace"]')


def bar(row: str, status: str | None = None, retry: int | None = None) -> str:
    sel = f'[data-testid="bar"][data-row="{row}"]'
    if status is not None:
        sel += f'[data-status="{status}"]'
    if retry is not None:
        sel += f'[data-retry="{retry}"]'
    return sel


async def computed(page: Page, selector: str, prop: str) -> str:
    return await page.locator(selector).evaluate("(el, prop) => getComputedStyle(el)[prop]", prop)


def rgb(value: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"rgba?\((\d+),\s*(\d+),\s*(\d+)(?:,\s*[\d.]+)?\)", value.strip())
    assert m, f"not an rgb() colour: {value!r}"
    r, g, b = (int(x) for x in m.groups())
    return r, g, b


def is_red(c: tuple[int, int, int]) -> bool:
    r, g, b = c
    return r >= 170 and g <= 100 and b <= 100


def is_green(c: tuple[int, int, int]) -> bool:
    r, g, b = c
    return g >= 110 and g >= r + 50 and g >= b + 40


async def field(page: Page, scope: str, name: str) -> str:
    """The visible text of a ``data-field`` element, whitespace collapsed."""
    text = await page.locator(f'{scope} [data-field="{name}"]').inner_text()
    return " ".join(text.split())


# ---- tests -------------------------------------------------------------------------------------


async def test_trace_view_header_rows_and_statuses(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await open_trace(page, site, MAIN_ID)

    header = '[data-testid="trace-header"]'
    assert await field(page, header, "msgId") == MAIN_ID
    assert await field(page, header, "topic") == TOPIC
    assert await field(page, header, "group") == "order-producer"
    assert await field(page, header, "sendTime") == "2024-05-31T16:08:37.000+00:00"
    assert await field(page, header, "cost") == "12 ms"
    assert await field(page, header, "storeHost") == "10.0.0.5:10911"
    assert await field(page, header, "msgType") == "Normal_Msg"
    assert await field(page, header, "offsetMsgId") == "0A00000500002A9F0001000000000457"
    assert await field(page, header, "region") == "DefaultRegion"
    assert (
        await page.locator(f'{header} [data-field="status"]').get_attribute("data-status")
        == "success"
    )
    assert await page.title() == f"tracemq · {MAIN_ID}"

    bars = await page.locator('[data-testid="bar"]').evaluate_all(
        "els => els.map(e => [e.dataset.row, e.dataset.status, e.dataset.retry ?? null])"
    )
    assert Counter(row for row, _, _ in bars) == {
        "producer": 1,
        "consumer:billing-service": 2,
        "consumer:audit-log": 1,
        "consumer:search-indexer": 1,
    }
    by_row = {row: [(s, r) for rr, s, r in bars if rr == row] for row, _, _ in bars}
    assert by_row["producer"] == [("success", None)]
    assert by_row["consumer:billing-service"] == [("failed", "0"), ("success", "1")]
    assert by_row["consumer:audit-log"] == [("success", "0")]
    assert by_row["consumer:search-indexer"] == [("unknown", "0")]
    assert await page.locator('[data-testid="transaction"], [data-row="transaction"]').count() == 0

    # Every bar carries a tooltip.
    titles = await page.locator('[data-testid="bar"] > title').all_text_contents()
    assert len(titles) == 5 and all(titles)
    assert any("billing-service · retry 0 · failed (FAILED)" in t for t in titles)

    assert await page.locator('[data-testid="legend"]').is_visible()
    note = await page.locator('[data-testid="axis-note"]').inner_text()
    assert note.startswith("Time after the send")

    # The screenshot a human looks at: the trace with the failed attempt's details open.
    await page.locator(bar("consumer:billing-service", "failed")).click()
    await page.wait_for_selector('[data-testid="details"]:not([hidden])')
    await save_screenshot(page, "viewer")


async def test_failed_is_red_success_green_unknown_distinct(
    browser: BrowserSession, site: str
) -> None:
    page = browser.page
    await open_trace(page, site, MAIN_ID)

    failed = rgb(await computed(page, bar("consumer:billing-service", "failed", 0), "fill"))
    retried = rgb(await computed(page, bar("consumer:billing-service", "success", 1), "fill"))
    producer = rgb(await computed(page, bar("producer", "success"), "fill"))
    audit = rgb(await computed(page, bar("consumer:audit-log", "success"), "fill"))
    assert is_red(failed), failed
    assert not is_green(failed), failed
    assert is_green(retried), retried
    assert is_green(producer), producer
    assert is_green(audit), audit

    # Unknown: hatched (a pattern fill, neither red nor green) with a dashed amber outline.
    unknown_sel = bar("consumer:search-indexer", "unknown")
    fill = await computed(page, unknown_sel, "fill")
    assert fill.startswith("url("), fill
    stroke = rgb(await computed(page, unknown_sel, "stroke"))
    assert not is_red(stroke) and not is_green(stroke), stroke
    r, g, b = stroke
    assert r >= 180 and 90 <= g <= 190 and b <= 80, f"unknown outline should be amber: {stroke}"
    assert await computed(page, unknown_sel, "strokeDasharray") not in ("", "none")

    # The status strings are compared exactly: upper-case variants never count as success.
    verdicts = await page.evaluate(
        "['success', 'failed', 'unknown', 'SUCCESS', 'FAILED', 'Success', '', null]"
        ".map(s => TraceViewer.normaliseStatus(s))"
    )
    assert verdicts == [
        "success",
        "failed",
        "unknown",
        "unknown",
        "unknown",
        "unknown",
        "unknown",
        "unknown",
    ]


async def test_bar_geometry(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await open_trace(page, site, MAIN_ID)

    async def box(selector: str) -> dict[str, float]:
        return await page.locator(selector).evaluate(
            "el => { const b = el.getBBox(); return {x: b.x, w: b.width}; }"
        )

    svg_width = float(
        await page.locator('[data-testid="timeline-svg"]').get_attribute("width") or 0
    )
    producer = await box(bar("producer"))
    failed = await box(bar("consumer:billing-service", "failed"))
    retried = await box(bar("consumer:billing-service", "success"))
    zero_ms = await box(bar("consumer:audit-log"))
    unknown = await box(bar("consumer:search-indexer"))

    assert producer["x"] < zero_ms["x"] < failed["x"] < unknown["x"] < retried["x"]
    assert zero_ms["w"] >= 3, "a 0 ms attempt still gets a visible bar"
    assert failed["w"] > zero_ms["w"]
    # The unknown attempt runs from its begin to the right edge of the plot.
    assert unknown["x"] + unknown["w"] >= svg_width - 20
    assert unknown["x"] + unknown["w"] <= svg_width
    assert retried["x"] + retried["w"] < unknown["x"] + unknown["w"]


async def test_clicking_a_bar_shows_its_details(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await open_trace(page, site, MAIN_ID)
    details = '[data-testid="details"]'
    assert await page.locator(details).is_hidden()

    await page.locator(bar("consumer:billing-service", "failed")).click()
    await page.wait_for_selector(f"{details}:not([hidden])")
    assert await field(page, details, "group") == "billing-service"
    assert await field(page, details, "requestId") == "req-bill-1"
    assert await field(page, details, "retry") == "0"
    assert await field(page, details, "begin") == "2024-05-31T16:08:37.041+00:00 (+41 ms)"
    assert await field(page, details, "end") == "2024-05-31T16:08:37.096+00:00 (+96 ms)"
    assert await field(page, details, "cost") == "55 ms"
    assert await field(page, details, "status") == "failed"
    assert await field(page, details, "contextCode") == "FAILED"
    assert await field(page, details, "clientHost") == "10.0.0.21"
    assert await field(page, details, "clientId") == "10.0.0.21@4000"  # which client it was
    # The attempt's two raw events are highlighted in the table.
    highlighted = page.locator('[data-testid="events-table"] tbody tr.highlight')
    assert await highlighted.evaluate_all("els => els.map(e => e.dataset.type)") == [
        "SubBefore",
        "SubAfter",
    ]

    await page.locator(bar("consumer:search-indexer", "unknown")).click()
    await page.wait_for_function(
        'document.querySelector(\'[data-testid="details"] [data-field="requestId"]\')'
        ".textContent === 'req-search-1'"
    )
    assert await field(page, details, "status") == "unknown"
    assert (await field(page, details, "end")).startswith("— no SubAfter traced")
    assert await field(page, details, "cost") == "—"
    assert await field(page, details, "contextCode") == "—"

    await page.locator(bar("producer")).click()
    await page.wait_for_function(
        "document.querySelector('[data-testid=\"details\"]').dataset.status === 'success'"
        ' && document.querySelector(\'[data-testid="details"] [data-field="storeHost"]\')'
    )
    assert await field(page, details, "group") == "order-producer"
    assert await field(page, details, "offsetMsgId") == "0A00000500002A9F0001000000000457"

    await page.locator('[data-testid="details-close"]').click()
    await page.wait_for_selector(details, state="hidden")

    # Clicking a raw event selects its attempt.
    await page.locator('[data-testid="event-row"][data-index="7"]').click()
    await page.wait_for_selector(f"{details}:not([hidden])")
    assert await field(page, details, "requestId") == "req-bill-2"
    assert await field(page, details, "retry") == "1"


async def test_dead_lettered_message_has_its_own_failed_row(
    browser: BrowserSession, site: str
) -> None:
    page = browser.page
    await open_trace(page, site, DLQ_ID)
    row = "dlq:billing-service"
    assert await page.locator(bar(row, "failed")).count() == 1
    assert await page.locator(bar("consumer:billing-service", "failed")).count() == 2
    await page.locator(bar(row)).click()
    details = '[data-testid="details"]'
    await page.wait_for_selector(f"{details}:not([hidden])")
    assert await field(page, details, "topic") == "%DLQ%billing-service"
    assert await field(page, details, "status") == "failed"
    # its raw event is the consumer group's Pub to the DLQ, not the producer's send
    highlighted = page.locator('[data-testid="events-table"] tbody tr.highlight')
    assert await highlighted.evaluate_all("els => els.map(e => e.dataset.index)") == ["1"]
    await save_screenshot(page, "viewer-dead-letter")


async def test_events_table_has_one_row_per_event(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await open_trace(page, site, MAIN_ID)
    rows = page.locator('[data-testid="events-table"] tbody tr')
    assert await rows.count() == len(MAIN_TRACE["events"])
    assert await rows.evaluate_all("els => els.map(e => e.dataset.type)") == [
        e["trace_type"] for e in MAIN_TRACE["events"]
    ]
    failed_after = rows.nth(5)
    cells = [c.strip() for c in await failed_after.locator("td").all_inner_texts()]
    assert cells[0] == "SubAfter"
    assert cells[1].startswith("2024-05-31T16:08:37.096+00:00")
    assert cells[2] == "billing-service"
    assert cells[3] == "55 ms"
    assert cells[4] == "no"
    assert cells[5] == "FAILED"
    assert cells[7] == "req-bill-1"
    assert cells[8] == "3 / 1005"
    retry_cell = (await rows.nth(6).locator("td").nth(6).inner_text()).strip()
    assert retry_cell == "1"


async def test_key_search_lists_messages_and_opens_one(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/")
    await page.wait_for_selector('[data-testid="welcome"]:not([hidden])')
    await page.locator('[data-testid="search-input"]').fill("order-42")
    await page.locator('[data-testid="search-input"]').press("Enter")
    await page.wait_for_selector('body[data-state="results"]')
    assert "key=order-42" in page.url

    results = page.locator('[data-testid="result"]')
    assert await results.count() == 2
    assert await results.evaluate_all("els => els.map(e => e.dataset.msgId)") == [MAIN_ID, TX_ID]
    title = await page.locator(".results-title").inner_text()
    assert "2 messages" in title and "order-42" in title
    await save_screenshot(page, "viewer-search")

    await page.locator(f'[data-testid="result-link"][data-msg-id="{TX_ID}"]').click()
    await page.wait_for_selector('body[data-state="trace"]')
    assert f"msgId={TX_ID}" in page.url
    assert await field(page, '[data-testid="trace-header"]', "msgId") == TX_ID
    tx_bars = page.locator(bar("transaction"))
    assert await tx_bars.count() == 1
    assert await tx_bars.get_attribute("data-status") == "success"
    assert await page.locator(bar("consumer:billing-service", "success")).count() == 1
    await tx_bars.click()
    await page.wait_for_selector('[data-testid="details"]:not([hidden])')
    details = '[data-testid="details"]'
    assert await field(page, details, "transactionId") == "TX-0001"
    assert await field(page, details, "transactionState") == "COMMIT_MESSAGE"
    await save_screenshot(page, "viewer-transaction")

    # Back goes to the list again.
    await page.go_back()
    await page.wait_for_selector('body[data-state="results"]')
    assert await page.locator('[data-testid="result"]').count() == 2


async def test_deep_links_and_msgid_search(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/?key=order-42")
    await page.wait_for_selector('body[data-state="results"]')
    assert await page.locator('[data-testid="result"]').count() == 2

    # A 32-hex input opens the trace directly; /viewer serves the same page.
    await page.goto(f"{site}/viewer")
    await page.locator('[data-testid="search-input"]').fill(MAIN_ID)
    await page.locator('[data-testid="search-button"]').click()
    await page.wait_for_selector('body[data-state="trace"]')
    assert page.url.endswith(f"/viewer?msgId={MAIN_ID}")
    assert await page.locator('[data-testid="bar"]').count() == 5


async def test_key_search_pages(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/?key=many")
    await page.wait_for_selector('body[data-state="results"]')
    assert await page.locator('[data-testid="result"]').count() == 1
    await page.locator('[data-testid="load-more"]').click()
    await page.wait_for_selector('[data-testid="result"] >> nth=1')
    assert await page.locator('[data-testid="result"]').count() == 2
    assert await page.locator('[data-testid="load-more"]').is_hidden()


async def test_key_search_without_results(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/?key=nobody-uses-this")
    await page.wait_for_selector('body[data-state="results"]')
    assert await page.locator('[data-testid="result"]').count() == 0
    empty = await page.locator('[data-testid="results-empty"]').inner_text()
    assert "No messages found with key “nobody-uses-this”" in empty


async def test_unknown_msgid_says_so(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/?msgId={MISSING_ID}")
    await page.wait_for_selector('body[data-state="error"]')
    title = await page.locator('[data-testid="error"] .notice-title').inner_text()
    assert title == f"No trace for msgId {MISSING_ID}"
    await save_screenshot(page, "viewer-404")

    # Typed into the search box: no message has that id nor that key -> the same message.
    await page.goto(f"{site}/")
    await page.locator('[data-testid="search-input"]').fill(MISSING_ID)
    await page.locator('[data-testid="search-input"]').press("Enter")
    await page.wait_for_selector('body[data-state="error"]')
    title = await page.locator('[data-testid="error"] .notice-title').inner_text()
    assert title == f"No trace for msgId {MISSING_ID}"


async def test_bad_request_is_explained(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/?key=*")
    await page.wait_for_selector('body[data-state="error"]')
    error = page.locator('[data-testid="error"]')
    assert await error.locator(".notice-title").inner_text() == "The collector rejected the request"
    detail = await error.locator(".notice-detail").inner_text()
    assert "wildcards are not supported" in detail and "“key”" in detail


async def test_network_error_is_explained(browser: BrowserSession, site: str) -> None:
    page = browser.page

    async def refuse(route: Route) -> None:
        await route.abort("connectionrefused")

    await page.route("**/api/v1/**", refuse)
    await page.goto(f"{site}/?msgId={MAIN_ID}")
    await page.wait_for_selector('body[data-state="error"]')
    error = page.locator('[data-testid="error"]')
    assert await error.locator(".notice-title").inner_text() == "Could not reach the collector API"
    assert f"/api/v1/traces/{MAIN_ID}" in await error.locator(".notice-detail").inner_text()


async def test_failed_send_shows_no_store_host_and_its_attempts(
    browser: BrowserSession, site: str
) -> None:
    page = browser.page
    await open_trace(page, site, FAILED_ID)
    header = '[data-testid="trace-header"]'
    assert (
        await page.locator(f'{header} [data-field="status"]').get_attribute("data-status")
        == "failed"
    )
    assert await field(page, header, "storeHost") == "—"
    assert await field(page, header, "sendAttempts") == "3"
    assert await field(page, header, "offsetMsgId") == "—"
    assert "null" not in await page.locator(header).inner_text()


async def test_trace_without_pub(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await open_trace(page, site, NOPUB_ID)
    assert await page.locator(bar("producer")).count() == 0
    assert await page.locator(bar("consumer:late-consumer", "success", 2)).count() == 1
    header = '[data-testid="trace-header"]'
    assert await field(page, header, "group") == "no Pub trace"
    assert (
        await page.locator(f'{header} [data-field="status"]').get_attribute("data-status")
        == "unknown"
    )
    note = await page.locator('[data-testid="axis-note"]').inner_text()
    assert "earliest event" in note
    # Relative to the earliest event, the only attempt starts at +0 ms.
    await page.locator(bar("consumer:late-consumer")).click()
    await page.wait_for_selector('[data-testid="details"]:not([hidden])')
    assert (await field(page, '[data-testid="details"]', "begin")).endswith("(+0 ms)")


async def test_token_flow(
    browser: BrowserSession, serve: Callable[..., Awaitable[tuple[str, FakeCollector]]]
) -> None:
    base, fake = await serve(token=TOKEN)
    page = browser.page
    await page.goto(f"{base}/?msgId={MAIN_ID}")
    await page.wait_for_selector('body[data-state="auth"]')
    assert await page.locator('[data-testid="token-panel"]').is_visible()
    assert fake.authorizations == [None]
    await save_screenshot(page, "viewer-token")

    # A wrong token is refused and not kept.
    await page.locator('[data-testid="token-input"]').fill("nope")
    await page.locator('[data-testid="token-input"]').press("Enter")
    await page.wait_for_selector('[data-testid="token-error"]')
    assert "not accepted" in await page.locator('[data-testid="token-error"]').inner_text()
    assert fake.authorizations[-1] == "Bearer nope"
    assert await page.evaluate("sessionStorage.length") == 0

    # The right one opens the trace and stays for the session.
    await page.locator('[data-testid="token-input"]').fill(TOKEN)
    await page.locator('[data-testid="token-submit"]').click()
    await page.wait_for_selector('body[data-state="trace"]')
    assert fake.authorizations[-1] == f"Bearer {TOKEN}"
    assert await page.locator('[data-testid="bar"]').count() == 5
    assert TOKEN in await page.evaluate("Object.values(sessionStorage)")

    await page.reload()
    await page.wait_for_selector('body[data-state="trace"]')
    assert fake.authorizations[-1] == f"Bearer {TOKEN}"

    # Key searches send it too.
    await page.locator('[data-testid="search-input"]').fill("order-42")
    await page.locator('[data-testid="search-input"]').press("Enter")
    await page.wait_for_selector('body[data-state="results"]')
    assert fake.requests[-1].startswith("/api/v1/traces?key=order-42")
    assert fake.authorizations[-1] == f"Bearer {TOKEN}"

    # Forgetting it asks again.
    await page.locator('[data-testid="forget-token"]').click()
    await page.wait_for_selector('body[data-state="auth"]')
    assert await page.evaluate("sessionStorage.length") == 0


async def test_formatting_helpers(browser: BrowserSession, site: str) -> None:
    page = browser.page
    await page.goto(f"{site}/")
    await page.wait_for_selector('body[data-state="welcome"]')
    durations = await page.evaluate(
        "[0, 7, 55, 999, 1000, 1250, 61500, 5400000, -5, null].map(TraceViewer.fmtDuration)"
    )
    assert durations == [
        "0 ms",
        "7 ms",
        "55 ms",
        "999 ms",
        "1 s",
        "1.25 s",
        "1m 1.5s",
        "1h 30m",
        "−5 ms",
        "—",
    ]
    assert await page.evaluate(f"TraceViewer.fmtIsoLocal({T0})") == "2024-05-31T16:08:37.000+00:00"
    assert await page.evaluate("[0, 4, 7, null].map(c => TraceViewer.contextCodeName(c))") == [
        "SUCCESS",
        "FAILED",
        "code 7",
        None,
    ]
    assert await page.evaluate(
        "['COMMIT_MESSAGE', 'ROLLBACK_MESSAGE', 'UNKNOW'].map(TraceViewer.statusFromTransaction)"
    ) == ["success", "failed", "unknown"]


# ---- issue 15: where a message is expected; the page at 1 400 px -------------------------------

WIDE = (1400, 900)


@pytest.fixture
async def wide_browser() -> AsyncIterator[BrowserSession]:
    try:
        find_chromium()
    except ChromiumNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
    async with chromium(viewport=WIDE) as session:
        yield session
        session.assert_no_page_errors()
        assert not session.script_console_errors(), session.script_console_errors()


def _tx_trace(msg_id: str, states: list[tuple[int, str]], delivery: dict[str, Any]) -> dict:
    producer = {**MAIN_TRACE["producer"], "msg_type": 1, "msg_type_name": "Trans_Msg_Half"}
    return {
        "msg_id": msg_id,
        "topic": TOPIC,
        "delivery": delivery,
        "producer": producer,
        "transactions": [
            {
                "timestamp": T0 + at,
                "group": "order-producer",
                "transaction_id": "TX-9",
                "transaction_state": state,
                "from_transaction_check": False,
                "msg_type": 1,
                "msg_type_name": "Trans_Msg_Half",
            }
            for at, state in states
        ],  # fmt: skip
        "consumers": [],
        "dead_letters": [],
        "events": [
            _event(
                "Pub",
                0,
                msg_id=msg_id,
                timestamp=T0,
                group_name="order-producer",
                cost_time=12,
                success=True,
                msg_type=1,
            ),
            *(
                _event(
                    "EndTransaction",
                    1 + i,
                    msg_id=msg_id,
                    timestamp=T0 + at,
                    group_name="order-producer",
                    transaction_id="TX-9",
                    transaction_state=state,
                )
                for i, (at, state) in enumerate(states)
            ),
        ],  # fmt: skip
    }


ROLLED_ID = "7F0000010A1B2C3D4E5F012345678E01"
COMMITTED_ID = "7F0000010A1B2C3D4E5F012345678E02"
HALF_ID = "7F0000010A1B2C3D4E5F012345678E03"
DELAYED_ID = "7F0000010A1B2C3D4E5F012345678E04"
TRACES[ROLLED_ID] = _tx_trace(
    ROLLED_ID,
    [(20, "ROLLBACK_MESSAGE")],
    {"state": "rolled_back", "expect_consumers": False, "decided_at": T0 + 20,
     "from_transaction_check": False},
)  # fmt: skip
TRACES[COMMITTED_ID] = _tx_trace(
    COMMITTED_ID,
    [(20, "UNKNOW"), (6020, "COMMIT_MESSAGE")],
    {"state": "committed", "expect_consumers": True, "decided_at": T0 + 6020,
     "from_transaction_check": True},
)  # fmt: skip
TRACES[HALF_ID] = _tx_trace(HALF_ID, [(20, "UNKNOW")], {"state": "half", "expect_consumers": False})
TRACES[DELAYED_ID] = {
    **FAILED_TRACE,
    "msg_id": DELAYED_ID,
    "producer": {**MAIN_TRACE["producer"], "msg_type": 3, "msg_type_name": "Delay_Msg"},
    "delivery": {"state": "delayed", "expect_consumers": True, "delay_level": 3,
                 "due_time": T0 + 10_000, "due_time_basis": "default delay levels"},
    "events": [_event("Pub", 0, msg_id=DELAYED_ID, timestamp=T0, group_name="order-producer",
                      cost_time=12, success=True, msg_type=3)],
}  # fmt: skip
RECALLED_ID = "7F0000010A1B2C3D4E5F012345678E06"
TRACES[RECALLED_ID] = {
    **TRACES[DELAYED_ID],
    "msg_id": RECALLED_ID,
    "delivery": {"state": "recalled", "expect_consumers": False, "recalled_at": T0 + 300,
                 "recalled_by": "order-producer", "delay_level": 3, "due_time": T0 + 10_000,
                 "due_time_basis": "default delay levels"},
    "recalls": [{"timestamp": T0 + 300, "group": "order-producer", "success": True,
                 "result": "recalled", "region_id": "DefaultRegion"}],
    "events": [
        _event("Pub", 0, msg_id=RECALLED_ID, timestamp=T0, group_name="order-producer",
               cost_time=12, success=True, msg_type=3),
        _event("Recall", 1, msg_id=RECALLED_ID, timestamp=T0 + 300,
               group_name="order-producer", success=True),
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("msg_id", "badge", "kind", "note", "nobody_yet"),
    [
        (ROLLED_ID, "rolled back — expected nowhere", "neutral",
         "Rolled back at 2024-05-31T16:08:37.020+00:00: no consumer group should receive it.",
         False),
        (COMMITTED_ID, "committed", "success",
         "Committed on the broker's check-back at 2024-05-31T16:08:43.020+00:00.", True),
        (HALF_ID, "half message — not committed or rolled back yet", "unknown",
         "Half message: the transaction is not committed or rolled back yet, so consumers do "
         "not see it.", False),
        (DELAYED_ID, "delayed — due 2024-05-31T16:08:47.000+00:00", "delayed",
         "Delayed (level 3): due at 2024-05-31T16:08:47.000+00:00 (with the default delay "
         "levels).", True),
        (RECALLED_ID, "recalled — expected nowhere", "neutral",
         "Recalled by order-producer at 2024-05-31T16:08:37.300+00:00, before it was due: no "
         "consumer group should receive it.", False),
    ],
    ids=["rolled-back", "committed", "half", "delayed", "recalled"],
)  # fmt: skip
async def test_the_badge_says_where_a_transactional_or_delayed_message_is_expected(
    browser: BrowserSession,
    site: str,
    msg_id: str,
    badge: str,
    kind: str,
    note: str,
    nobody_yet: bool,
) -> None:
    page = browser.page
    await open_trace(page, site, msg_id)
    pill = page.locator('[data-testid="trace-header"] [data-field="status"]')
    assert (await pill.inner_text()).strip() == badge
    assert await pill.get_attribute("class") == f"pill pill-{kind}"
    summary = await page.locator('[data-testid="summary"]').inner_text()
    assert (await page.locator('[data-testid="delivery-note"]').inner_text()) == note
    # "Not traced yet" is for a message consumers should get, not for one held back or dropped.
    assert ("No consumer group has traced this message yet." in summary) is nobody_yet
    if msg_id == ROLLED_ID:
        assert not is_green(rgb(await computed(page, '[data-field="status"]', "color")))
        await save_screenshot(page, "viewer-rolled-back")
    if msg_id == RECALLED_ID:  # the recall has its own row; its bar opens its details
        assert await page.locator(bar("recall", "success")).count() == 1
        await page.locator(bar("recall")).click()
        details = '[data-testid="details"]'
        await page.wait_for_selector(f"{details}:not([hidden])")
        assert await field(page, details, "result") == "recalled: not delivered"
        assert await field(page, details, "group") == "order-producer"
        highlighted = page.locator('[data-testid="events-table"] tbody tr.highlight')
        assert await highlighted.evaluate_all("els => els.map(e => e.dataset.index)") == ["1"]
        await save_screenshot(page, "viewer-recalled")


OFFSET_QUERY = {
    "offset_msg_id": "0A00000500002A9F0003000000000029",
    "store_host": "10.0.0.5:10911",
    "queue_id": 3,
    "kafka_offset": 41,
}


async def test_a_trace_found_by_its_offset_msg_id_says_so(
    browser: BrowserSession, serve: Callable[..., Awaitable[tuple[str, FakeCollector]]]
) -> None:
    base, _ = await serve()
    asked = OFFSET_QUERY["offset_msg_id"]
    TRACES[asked] = {**MAIN_TRACE, "found_by": "offset_msg_id", "offset_msg_id_query": OFFSET_QUERY}
    try:
        page = browser.page
        await page.goto(f"{base}/")
        await page.locator('[data-testid="search-input"]').fill(asked.lower())
        await page.locator('[data-testid="search-input"]').press("Enter")
        await page.wait_for_selector('body[data-state="trace"]')
        assert await field(page, '[data-testid="trace-header"]', "msgId") == MAIN_ID
        assert await page.locator('[data-testid="found-by"]').inner_text() == (
            f"Found by offsetMsgId {asked}: stored at 10.0.0.5:10911, queue 3, offset 41."
        )
    finally:
        del TRACES[asked]


REAL_IDS_ID = "7F0000010A1B2C3D4E5F012345678E05"
# Request ids as clients make them (32 hex characters), long group names, a real trace topic and
# offsets: the widths the events table has to hold.
TRACES[REAL_IDS_ID] = {
    **MAIN_TRACE,
    "msg_id": REAL_IDS_ID,
    "events": [
        {
            **e,
            "msg_id": REAL_IDS_ID,
            "trace_partition": 11,
            "trace_offset": 1_234_567_890 + i,
            "group_name": e["group_name"] and f"{e['group_name']}-consumers-eu-west",
            "request_id": e["request_id"] and f"0A0000150000{i:04X}{'C0FFEE' * 3}ABCD"[:32],
            "trace_topic": "RMQ_SYS_TRACE_TOPIC",
        }
        for i, e in enumerate(MAIN_TRACE["events"])
    ],  # fmt: skip
}


async def test_at_1400_px_the_events_table_fits_and_a_bar_label_selects_its_bar(
    wide_browser: BrowserSession, site: str
) -> None:
    page = wide_browser.page
    await open_trace(page, site, REAL_IDS_ID)
    table = page.locator('[data-testid="events-table"]')
    # Nothing to scroll to: the last columns (request id, trace partition / offset) are in view.
    widths = await table.evaluate(
        "t => { const s = t.parentElement; return [s.scrollWidth, s.clientWidth]; }"
    )
    assert widths[0] <= widths[1], widths
    scroll_box = await table.evaluate("t => t.parentElement.getBoundingClientRect().right")
    for cell in ("td:nth-child(8)", "td:last-child"):
        rights = await table.locator(f"tbody tr {cell}").evaluate_all(
            "els => els.map(e => e.getBoundingClientRect().right)"
        )
        assert max(rights) <= scroll_box + 0.5, (cell, rights, scroll_box)

    await open_trace(page, site, MAIN_ID)
    # The "FAILED · 55 ms" label beside a bar is part of what a click on the bar hits.
    label = page.locator(".bar-group .bar-label.failed").first
    assert await label.count() == 1
    await label.click()
    await page.wait_for_selector('[data-testid="details"]:not([hidden])')
    assert await field(page, '[data-testid="details"]', "requestId") == "req-bill-1"
    await save_doc_screenshot(page, "trace-viewer")
    await open_trace(page, site, ROLLED_ID)
    await save_doc_screenshot(page, "trace-viewer-rolled-back")
