"""The viewer page served by the real collector, showing a message traced end to end by the
client library on the embedded stack (a failing first attempt, then a retry)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tracemq import ConsumeConcurrentlyStatus, ConsumeFromWhere, Message, Producer, PushConsumer
from tracemq.admin import AdminClient
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.waiting import eventually

from tests.support.browser import BrowserSession, chromium, save_screenshot
from tests.support.collector_api import TOKEN
from tests.support.collector_api import http as _get

pytestmark = [pytest.mark.browser, pytest.mark.stack]


@pytest.fixture
async def browser() -> AsyncIterator[BrowserSession]:
    async with chromium() as session:
        yield session


@pytest.mark.timeout(180)
async def test_real_trace_in_the_browser(
    stack: EmbeddedStack, collector: ManagedProcess, browser: BrowserSession, unique: str
) -> None:
    topic = f"Live_{unique}"
    async with AdminClient(stack.business_bootstrap, stack.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    attempts: list[int] = []

    async def listener(msgs: Any, ctx: Any) -> ConsumeConcurrentlyStatus:
        attempts.append(msgs[0].reconsume_times)
        if msgs[0].reconsume_times == 0:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    group = f"billing_{unique}"
    consumer = PushConsumer(
        group,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_msg_trace=True,
        in_process_retry_delay_ms=200,
        **env,
    )
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    await consumer.start()
    try:
        async with Producer(f"orders_{unique}", enable_msg_trace=True, **env) as producer:
            sent = await producer.send(
                Message(topic, b"order paid", tags="Paid", keys=[f"order-{unique}"])
            )
            msg_id = sent.msg_id
        await eventually(lambda: _true(attempts == [0, 1]), timeout=30, what="retry done")
    finally:
        await consumer.shutdown()
    base = f"http://127.0.0.1:{collector.env['TRACEMQ_HTTP_PORT']}"

    async def complete() -> bool:
        status, view = await asyncio.to_thread(_get, f"{base}/api/v1/traces/{msg_id}")
        return (
            status == 200
            and len(view["consumers"]) == 1
            and len(view["consumers"][0]["attempts"]) == 2
            and all(a["status"] != "unknown" for a in view["consumers"][0]["attempts"])
        )

    await eventually(complete, timeout=20, what="complete trace in the collector")
    page = browser.page
    await page.goto(f"{base}/?msgId={msg_id}")
    # the stack's collector wants its token: the page asks for it, a wrong one is refused
    await page.wait_for_selector("body[data-state='auth']", timeout=15_000)
    await page.locator("[data-testid='token-input']").fill(TOKEN + "x")
    await page.locator("[data-testid='token-input']").press("Enter")
    await page.wait_for_selector("[data-testid='token-error']", timeout=15_000)
    await page.locator("[data-testid='token-input']").fill(TOKEN)
    await page.locator("[data-testid='token-submit']").click()
    await page.wait_for_selector("body[data-state='trace']", timeout=15_000)
    # kept for the tab's session: a reload goes straight to the trace
    await page.reload()
    await page.wait_for_selector("body[data-state='trace']", timeout=15_000)
    bars = page.locator("[data-testid='bar'][data-kind='attempt']")
    assert await bars.count() == 2
    statuses = [await bars.nth(i).get_attribute("data-status") for i in range(2)]
    retries = [await bars.nth(i).get_attribute("data-retry") for i in range(2)]
    assert sorted(zip(retries, statuses, strict=True)) == [("0", "failed"), ("1", "success")]
    assert await page.locator(f"[data-row='consumer:{group}']").count() >= 1
    producer_bar = page.locator("[data-testid='bar'][data-row='producer']")
    assert await producer_bar.get_attribute("data-status") == "success"
    rows = page.locator("[data-testid='event-row']")
    assert await rows.count() == 5  # Pub + 2 × (SubBefore, SubAfter)
    await save_screenshot(page, "viewer-live")

    # The same message by its msgId in lower case and by its offsetMsgId (issue 15, point 7).
    status, view = await asyncio.to_thread(_get, f"{base}/api/v1/traces/{msg_id.lower()}")
    assert (status, view["msg_id"]) == (200, msg_id)
    status, view = await asyncio.to_thread(_get, f"{base}/api/v1/traces/{sent.offset_msg_id}")
    assert (status, view["msg_id"], view["found_by"]) == (200, msg_id, "offset_msg_id")
    assert status == 200 and view["offset_msg_id_query"]["kafka_offset"] == sent.queue_offset
    await page.locator("[data-testid='search-input']").fill(sent.offset_msg_id.lower())
    await page.locator("[data-testid='search-input']").press("Enter")
    await page.wait_for_selector("[data-testid='found-by']")
    assert await page.locator("[data-field='msgId']").inner_text() == msg_id
    browser.assert_no_page_errors()


async def _true(v: bool) -> bool:
    return v
