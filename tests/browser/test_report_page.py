"""The reconciliation report (report.html) in a real headless Chromium at 1 400 px: it fits the
page, and its screenshot in the README (docs/img/reconcile-report.png) is written here."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracemq_spark.report import render

from tests.browser.test_viewer_page import WIDE
from tests.spark.test_outputs import _summary_one_busy_window_of_six
from tests.support.browser import ChromiumNotFound, chromium, find_chromium, save_doc_screenshot

pytestmark = pytest.mark.browser


async def test_the_report_fits_1400_px_and_names_rows_without_a_group(tmp_path: Path) -> None:
    try:
        find_chromium()
    except ChromiumNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
    page_html, _ = render(_summary_one_busy_window_of_six())
    report = tmp_path / "report.html"
    report.write_text(page_html, encoding="utf-8")
    async with chromium(viewport=WIDE) as browser:
        page = browser.page
        await page.goto(report.as_uri())
        await page.wait_for_selector("#chart-outcomes")
        # No table (the per-group one has a column per outcome) runs past the window's edge.
        rights = await page.locator("table").evaluate_all(
            "ts => ts.map(t => t.getBoundingClientRect().right)"
        )
        assert len(rights) == 3 and max(rights) <= WIDE[0] - 8, rights
        assert await page.evaluate("document.documentElement.scrollWidth") <= WIDE[0]
        cells = await page.locator("td").all_inner_texts()
        assert "None" not in cells
        assert cells.count("(no consumer group)") == 5
        await save_doc_screenshot(page, "reconcile-report")
        browser.assert_no_page_errors()
