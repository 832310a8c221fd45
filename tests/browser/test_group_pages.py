"""The viewer's consumer-group page and message search page (issue 15, points 13 and 14),
served by the real collector over a real stopped group and a real flaky group; their README
screenshots (docs/img/consumer-groups.png, docs/img/message-search.png, 1 400 px) are written
here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.waiting import eventually

from tests.support.brokers import fast_broker
from tests.support.browser import BrowserSession, chromium, save_doc_screenshot
from tests.support.collector_api import TOKEN
from tests.support.groups import (
    FIRST,
    collector_base,
    collector_get,
    flaky_and_stopped,
)

pytestmark = [pytest.mark.browser, pytest.mark.stack]


@pytest.fixture(scope="module")
def broker(stack: EmbeddedStack) -> Iterator[str]:
    with fast_broker(stack, "brp") as name:
        yield name


@pytest.fixture
async def wide() -> AsyncIterator[BrowserSession]:
    async with chromium(viewport=(1400, 900)) as session:
        yield session
        session.assert_no_page_errors()
        assert not session.script_console_errors(), session.script_console_errors()


@pytest.mark.timeout(240)
async def test_group_page_and_search_page(
    stack: EmbeddedStack,
    collector: ManagedProcess,
    broker: str,
    wide: BrowserSession,
    unique: str,
) -> None:
    sc = await flaky_and_stopped(stack, broker, unique)
    try:

        async def settled() -> bool:
            _, body = await asyncio.to_thread(collector_get, collector, "/api/v1/groups")
            by = {g["group"]: g for g in body["groups"]}
            if sc.stopped not in by or sc.flaky not in by:
                return False
            fl = next(t for t in by[sc.flaky]["topics"] if t["topic"] == sc.topic)
            return (
                by[sc.stopped]["state"] == "stopped"
                and by[sc.stopped]["lag"] == len(sc.late)
                and fl["last_hour"]["dead_lettered"] == 2
                and fl["last_hour"]["consumed"] == 5
            )

        await eventually(settled, timeout=60, interval=0.5, what="both groups settled")
        base = collector_base(collector)
        page = wide.page
        # the collector wants the session's token: the page finds it where it keeps an entered one
        await page.add_init_script(
            f"sessionStorage.setItem('tracemq.viewer.token', {json.dumps(TOKEN)})"
        )

        # -- point 13: every group at once; the stopped one's lag and its age, the flaky one's
        # failures and dead letters; an hour's trend per (group, topic)
        await page.goto(f"{base}/?view=groups")
        await page.wait_for_selector("body[data-state='groups']")
        stopped = page.locator(
            f"[data-testid='group-row'][data-group='{sc.stopped}'][data-topic='{sc.topic}']"
        )
        assert await stopped.get_attribute("data-state") == "stopped"
        assert await stopped.locator("[data-testid='group-state']").inner_text() == "stopped"
        assert await stopped.locator("[data-testid='lag']").inner_text() == str(len(sc.late))
        age = await stopped.locator("[data-testid='lag-age']").inner_text()
        assert age.endswith((" ms", " s")) or "m" in age, age
        flaky = page.locator(
            f"[data-testid='group-row'][data-group='{sc.flaky}'][data-topic='{sc.topic}']"
        )
        assert await flaky.get_attribute("data-state") == "failing"
        assert float(await flaky.locator("[data-testid='failure-rate']").inner_text()) > 0
        assert float(await flaky.locator("[data-testid='dlq-rate']").inner_text()) > 0
        assert await flaky.locator("[data-testid='trend'] rect.dlq").count() >= 1
        assert await flaky.locator("[data-testid='trend'] rect.bad").count() >= 1
        # the filter keeps this test's two groups (the session stack holds other tests' too)
        await page.locator("[data-testid='groups-filter']").fill(unique)
        assert await page.locator("[data-testid='groups']").get_attribute("data-shown") == "2"
        assert page.url.endswith(f"match={unique}")
        shown = page.locator("[data-testid='group-row']:visible")
        assert {await r.get_attribute("data-group") for r in await shown.all()} == {
            sc.stopped,
            sc.flaky,
        }
        await save_doc_screenshot(wide.page, "consumer-groups")

        # one group: its queues, the oldest unconsumed message linked to its trace
        await stopped.locator("[data-testid='group-link']").click()
        await page.wait_for_selector("[data-testid='queue-row']")
        assert page.url.endswith(f"?group={sc.stopped}")
        assert (
            await page.locator(f"[data-testid='queue-row'][data-topic='{sc.topic}']").count() == 2
        )
        await stopped.locator("[data-testid='lag-age'] a").click()
        await page.wait_for_selector("body[data-state='trace']")
        assert await page.locator("[data-field='msgId']").inner_text() in {
            sc.ids[b] for b in sc.late
        }

        # -- point 14: a topic's messages, each with its outcome per group so far
        await page.goto(f"{base}/")
        await page.locator("[data-testid='topic-input']").fill(sc.topic)
        await page.locator("[data-testid='search-button']").click()
        await page.wait_for_selector("body[data-state='results']")
        rows = page.locator("[data-testid='result']")
        assert await rows.count() == len(sc.ids)

        async def outcome(body: bytes, group: str) -> str | None:
            row = page.locator(f"[data-testid='result'][data-msg-id='{sc.ids[body]}']")
            pill = row.locator(f"[data-testid='outcome'][data-group='{group}']")
            return await pill.get_attribute("data-outcome")

        assert await outcome(b"bad-1", sc.flaky) == "dead_lettered"
        assert await outcome(b"bad-1", sc.stopped) == "consumed"
        assert await outcome(b"ok-1", sc.flaky) == "consumed"
        assert await outcome(b"late-1", sc.stopped) == "pending"
        assert await outcome(b"late-1", sc.flaky) == "consumed"
        await save_doc_screenshot(wide.page, "message-search")

        # a time range: only the messages sent after the stopped group stopped
        start = datetime.fromtimestamp(sc.late_from_ms / 1000, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%f"
        )[:-3]  # the page's time zone is UTC (tests/support/browser.py)
        await page.goto(f"{base}/?topic={sc.topic}&from={start}")
        await page.wait_for_selector("body[data-state='results']")
        listed = await rows.evaluate_all("rs => rs.map(r => r.dataset.msgId)")
        assert sorted(listed) == sorted(sc.ids[b] for b in sc.late)

        # the search box: a key lists the messages, an offsetMsgId opens the message
        await page.locator("[data-testid='topic-input']").fill("")
        await page.locator("[data-testid='from-input']").fill("")
        await page.locator("[data-testid='search-input']").fill(f"k-{unique}")
        await page.locator("[data-testid='search-input']").press("Enter")
        await page.wait_for_function(
            f"document.querySelectorAll(\"[data-testid='result']\").length === {len(sc.ids)}"
        )
        assert await page.locator("[data-testid='outcome']").count() == 2 * len(sc.ids)
        _, first = await asyncio.to_thread(
            collector_get, collector, f"/api/v1/traces/{sc.ids[FIRST[0]]}"
        )
        offset_id = first["producer"]["offset_msg_id"]
        await page.locator("[data-testid='search-input']").fill(offset_id)
        await page.locator("[data-testid='search-input']").press("Enter")
        await page.wait_for_selector("[data-testid='found-by']")
        assert await page.locator("[data-field='msgId']").inner_text() == sc.ids[FIRST[0]]
    finally:
        await sc.flaky_consumer.shutdown()
