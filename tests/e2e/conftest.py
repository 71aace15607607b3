"""Browser fixtures: Debian's chromium driven by PyPI playwright, headless, one per module.

``make services`` installs the Debian package ``chromium``; ``playwright install`` is never run
(it downloads a browser, and nothing can be downloaded here): Playwright launches
``/usr/bin/chromium`` through ``executable_path``. Without the browser the browser tests skip,
except under CI (env ``CI`` set), where they fail.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

# tests/integration/http_helpers.py serves the app with a real uvicorn; it is on sys.path only
# when pytest collects tests/integration, so put it there for a run of tests/e2e alone too.
INTEGRATION = str(Path(__file__).resolve().parent.parent / "integration")
if INTEGRATION not in sys.path:
    sys.path.append(INTEGRATION)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _unavailable(message: str) -> NoReturn:
    """Skip, or fail under CI (env ``CI`` set), when the browser cannot start."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{message}; CI must run the browser tests")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Launch headless chromium for the module; close it after."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install -e '.[dev]'")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} missing: make services installs the Debian package chromium")
    with sync_playwright() as pw:
        found = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield found
        finally:
            found.close()


class Tab:
    """A page in a fresh browser context that records its requests and dialogs."""

    def __init__(self, browser: Any, **context: Any) -> None:
        self.context = browser.new_context(**context)
        self.context.set_default_timeout(10_000)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", self._dialog)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    """Open a page in a new browser context (no cookies from another test); close it after."""
    opened = Tab(browser, viewport={"width": 1280, "height": 900})
    try:
        yield opened
    finally:
        opened.close()
