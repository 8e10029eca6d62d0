"""A real browser for dashboard tests: the system's chromium driven by Playwright's sync API.

No browser is downloaded: Playwright drives Debian's `chromium` (or LORASERVE_CHROMIUM).
The flags keep chromium off the network beyond the page's own server: without them it
reaches out to Google's hosts for updates, sync and field trials.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip
TIMEOUT_MS = 15_000  # any one wait; a step that needs longer is a failure, not a hang
DESK, PHONE = {"width": 1280, "height": 800}, {"width": 390, "height": 844}
REPO = Path(__file__).resolve().parents[3]


def chromium_path() -> str | None:
    """The chromium to drive: $LORASERVE_CHROMIUM, else `chromium` on PATH."""
    return os.environ.get("LORASERVE_CHROMIUM") or shutil.which("chromium")


def artifacts_dir() -> Path:
    """Where screenshots go: $LORASERVE_ARTIFACTS, else <repo>/test-artifacts."""
    folder = Path(os.environ.get("LORASERVE_ARTIFACTS") or REPO / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def chromium() -> Iterator[object]:
    """A headless chromium Browser; skips the test when there is none."""
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium: apt-get install chromium, or set LORASERVE_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=path, args=ARGS, headless=True, timeout=TIMEOUT_MS
        )
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watch:
    """What a page did: console errors, uncaught exceptions and every URL it requested."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def attach(self, page) -> None:
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("request", lambda r: self.requests.append(r.url))

    def foreign(self, origin: str) -> list[str]:
        """Requested URLs not on origin (data: URLs stay in the page)."""
        return [u for u in self.requests if not u.startswith(origin + "/") and
                not u.startswith("data:")]  # fmt: skip


@contextmanager
def dashboard(browser, url: str, key: str | None, viewport=DESK) -> Iterator[tuple]:
    """(page, watch) on url's dashboard, connected with key (None: left unconnected)."""
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    watch = Watch()
    watch.attach(page)
    try:
        page.goto(f"{url}/dashboard", wait_until="load")
        if key is not None:
            page.fill("#api-key", key)
            page.click("#connect")
        yield page, watch
    finally:
        context.close()


def latest(page, chart_id: str) -> dict:
    """A chart's latest figures, as its figure's data-latest holds them."""
    return page.eval_on_selector(f"#{chart_id}", "f => JSON.parse(f.dataset.latest || '{}')")


def row_names(page) -> set[str]:
    """The adapter names in the page's adapters table."""
    return set(page.eval_on_selector_all("#adapters tr[data-adapter]",
                                         "rows => rows.map(r => r.dataset.adapter)"))  # fmt: skip
