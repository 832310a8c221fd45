"""Headless Chromium for browser tests: Playwright driving Debian's ``chromium`` package.

Playwright is only the driver here; it never downloads a browser. ``make test`` installs Debian's
chromium (see the Makefile's ``test-deps``), and every launch gets a fresh, throw-away profile.

    async with chromium() as browser:
        await browser.page.goto(url)
        ...
        await save_screenshot(browser.page, "viewer")   # -> artifacts/screenshots/viewer.png
        browser.assert_no_page_errors()
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.async_api import BrowserContext, ConsoleMessage, Error, Page, async_playwright

__all__ = [
    "ARTIFACTS_DIR",
    "CHROMIUM_ARGS",
    "SCREENSHOTS_DIR",
    "BrowserSession",
    "ChromiumNotFound",
    "chromium",
    "find_chromium",
    "save_screenshot",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "artifacts"  # git-ignored
SCREENSHOTS_DIR = ARTIFACTS_DIR / "screenshots"

#: Flags for a quiet, self-contained headless browser: no GPU, no sandbox (tests run as root in a
#: container), and no background traffic (update checks, sync, QUIC) on machines without internet.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

_FALLBACK_PATHS = ("/usr/bin/chromium", "/usr/lib/chromium/chromium")

#: Default time Playwright waits for a selector or an action, in ms. Short enough that a broken
#: page fails with Playwright's own message well before pytest's timeout.
DEFAULT_TIMEOUT_MS = 10_000


class ChromiumNotFound(RuntimeError):
    """Debian's chromium is not installed."""


def find_chromium() -> str:
    """The Chromium executable: ``chromium`` on PATH, else Debian's install location."""
    found = shutil.which("chromium")
    if found:
        return found
    for candidate in _FALLBACK_PATHS:
        if os.access(candidate, os.X_OK):
            return candidate
    raise ChromiumNotFound(
        "Chromium is not installed (no `chromium` on PATH, no /usr/bin/chromium). The browser "
        "tests drive Debian's chromium and never download one: run `make test`, which installs "
        "Debian's chromium, or `apt-get install -y chromium`."
    )


@dataclass
class BrowserSession:
    """A running headless Chromium with one page, and what that page reported."""

    context: BrowserContext
    page: Page
    #: Uncaught exceptions thrown by the page's scripts.
    page_errors: list[str] = field(default_factory=list)
    #: ``console.error`` messages (including the browser's "Failed to load resource" lines for
    #: HTTP errors, which a page that handles 404s legitimately produces).
    console_errors: list[str] = field(default_factory=list)

    def assert_no_page_errors(self) -> None:
        """Fail if a script on the page threw an uncaught exception."""
        assert not self.page_errors, f"uncaught errors in the page: {self.page_errors}"

    def script_console_errors(self) -> list[str]:
        """Console errors other than the browser's own reports of failed HTTP requests."""
        return [m for m in self.console_errors if "Failed to load resource" not in m]


@asynccontextmanager
async def chromium(
    *,
    viewport: tuple[int, int] = (1280, 900),
    timezone_id: str = "UTC",
    locale: str = "en-US",
    device_scale_factor: float = 1,
    default_timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> AsyncIterator[BrowserSession]:
    """Launch Debian's Chromium headless with a fresh temporary profile; close it all on exit.

    The time zone and locale are fixed (UTC, en-US by default) so that pages render the same on
    every machine.
    """
    executable = find_chromium()
    with tempfile.TemporaryDirectory(
        prefix="tracemq-chromium-", ignore_cleanup_errors=True
    ) as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=executable,
                headless=True,
                args=list(CHROMIUM_ARGS),
                viewport={"width": viewport[0], "height": viewport[1]},
                device_scale_factor=device_scale_factor,
                timezone_id=timezone_id,
                locale=locale,
                service_workers="block",
            )
            try:
                context.set_default_timeout(default_timeout_ms)
                page = context.pages[0] if context.pages else await context.new_page()
                session = BrowserSession(context=context, page=page)

                def on_page_error(exc: Error) -> None:
                    session.page_errors.append(f"{exc.name}: {exc.message}")

                def on_console(msg: ConsoleMessage) -> None:
                    if msg.type == "error":
                        session.console_errors.append(msg.text)

                page.on("pageerror", on_page_error)
                page.on("console", on_console)
                yield session
            finally:
                await context.close()


#: the README's screenshots; rewritten only when TRACEMQ_UPDATE_DOCS_IMG=1 (``make screenshots``)
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


async def save_doc_screenshot(page: Page, name: str) -> Path:
    """The README's screenshot ``docs/img/<name>.png``, taken by the test that checks the page
    it shows: always kept under artifacts/, copied into docs/img only with
    ``TRACEMQ_UPDATE_DOCS_IMG=1`` — a test run leaves the work tree as it found it."""
    path = await save_screenshot(page, name)
    if os.environ.get("TRACEMQ_UPDATE_DOCS_IMG") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / f"{name}.png").write_bytes(path.read_bytes())
    return path


async def save_screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """Save a PNG of the page to ``<repo>/artifacts/screenshots/<name>.png``; return its path."""
    SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
    filename = name if name.endswith(".png") else f"{name}.png"
    path = SCREENSHOTS_DIR / filename
    await page.screenshot(path=str(path), full_page=full_page, animations="disabled")
    return path
