"""Playwright fixtures: the built site served from dist/site on a free port, Debian's Chromium with a fresh
profile per test, and guards that fail a test on any request to another host or any console error."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import build  # noqa: E402

os.environ.setdefault("MP_SERVE_QUIET", "1")
CHROMIUM = build.CHROMIUM
ARGS = build.CHROMIUM_ARGS
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def site_url():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `python build.py test` (it installs Debian's chromium)")
    build.build()
    server = build.make_server(0, build.SITE)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def playwright_driver():
    with sync_playwright() as p:
        yield p


class Guard:
    """Collects what must never happen: requests to another host, console errors, page errors."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.foreign: list[str] = []
        self.errors: list[str] = []
        # Chromium logs every 4xx/5xx answer to fetch() as a console error; a test that sends refused
        # requests on purpose (the curl console, the shim without an engine) sets this, and only those
        # lines are let through.
        self.expect_http_refusals = False

    def attach(self, page) -> None:
        page.on("request", self._on_request)
        page.on(
            "console",
            lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None,
        )
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def _on_request(self, request) -> None:
        url = request.url
        if not (url.startswith(self.origin + "/") or url.startswith("data:") or url.startswith("blob:")):
            self.foreign.append(url)

    def check(self) -> None:
        assert self.foreign == [], f"requests to another host: {self.foreign}"
        errors = self.errors
        if self.expect_http_refusals:
            refusal = "console.error: Failed to load resource: the server responded with a status of "
            errors = [e for e in errors if not (e.startswith(refusal) and e[len(refusal)] in "45")]
        assert errors == [], f"console errors: {errors}"


class Browser:
    """One Chromium profile (persistent context); `restart()` closes and reopens it on the same profile."""

    def __init__(self, driver, site_url: str, profile: Path) -> None:
        self.driver = driver
        self.site_url = site_url
        self.profile = profile
        self.guard = Guard(site_url)
        self.context = None
        self.start()

    def start(self) -> None:
        last: Exception | None = None
        for _ in range(2):  # BROWSER.md: a rare "Target crashed" at launch; retry the launch once
            try:
                self.context = self.driver.chromium.launch_persistent_context(
                    str(self.profile),
                    executable_path=CHROMIUM,
                    args=ARGS,
                    headless=True,
                    viewport={"width": 1280, "height": 800},
                )
                self.context.on("page", self.guard.attach)
                return
            except PlaywrightError as exc:
                last = exc
        raise last  # type: ignore[misc]

    def restart(self) -> None:
        self.context.close()
        self.start()

    def new_page(self):
        return self.context.new_page()

    def close(self) -> None:
        if self.context is not None:
            self.context.close()


@pytest.fixture
def browser(playwright_driver, site_url, request):
    profile = Path(tempfile.mkdtemp(prefix="mp-e2e-"))
    b = Browser(playwright_driver, site_url, profile)
    yield b
    try:
        b.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if request.node.rep_call.passed if hasattr(request.node, "rep_call") else False:
        b.guard.check()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
