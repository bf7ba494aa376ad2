"""The e2e harness's own promise (conftest.Browser.open): a renderer that crashes while a page loads costs one
more load in a new page, never the test (BROWSER.md); a page that never gets ready fails at once, not loaded
again."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

CRASH = "chrome://crash"  # Chromium's own page that kills the renderer showing it


def crash(browser, page) -> None:
    """Kill `page`'s renderer, and wait until Playwright has heard it (its next load then says "Page
    crashed", as the rare crash of a Pyodide start does)."""
    heard: list[bool] = []
    page.on("crash", lambda _page: heard.append(True))
    try:
        page.goto(CRASH, timeout=10_000)
    except PlaywrightError:
        pass  # the navigation is aborted as the renderer dies
    deadline = time.monotonic() + 10
    while not heard and time.monotonic() < deadline:
        browser.context.cookies()  # a round trip to the browser: its events are dispatched meanwhile
    assert heard, "the renderer did not crash"
    # Chromium's crash page is the test's own request, not the site's: not a foreign request of the site.
    browser.guard.foreign = [u for u in browser.guard.foreign if not u.startswith(CRASH)]


def test_a_renderer_that_crashes_while_the_page_loads_costs_one_more_load(browser) -> None:
    """...in a new page of the caller's page's size, and says so (a warning in pytest's summary)."""
    small = {"width": 640, "height": 480}
    page = browser.new_page(viewport=small)
    page.goto(browser.site_url + "/docs/")
    crash(browser, page)
    with pytest.warns(UserWarning, match="renderer crashed"):
        ready = browser.open("/", page)
    assert browser.crashed_loads == 1
    assert ready is not page and ready.viewport_size == small
    assert ready.evaluate("document.body.classList.contains('ready')")


def test_without_the_retry_a_crashed_renderer_fails_the_load(browser) -> None:
    """The control: the same crash, loaded without Browser.open's retry, fails."""
    page = browser.new_page()
    page.goto(browser.site_url + "/docs/")
    crash(browser, page)
    with pytest.raises(PlaywrightError, match="crashed"):
        page.goto(browser.site_url + "/")
        page.wait_for_selector("body.ready", timeout=30_000)


def test_a_page_that_never_gets_ready_is_not_loaded_again(browser) -> None:
    opened = []
    browser.context.on("page", lambda page: opened.append(page))
    with pytest.raises(PlaywrightTimeoutError):
        browser.open("/docs/", ready="body.never-ready-here", timeout=3000)
    assert len(opened) == 1 and browser.crashed_loads == 0
