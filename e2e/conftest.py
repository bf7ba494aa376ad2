"""Playwright fixtures: the built site served from dist/site on a free port, Debian's Chromium with a fresh
profile per test (desktop size, or phone size with `phone_browser`/`phone_page`), and guards that fail a test
on any request to another host or any console error. Helpers for accessibility (`axe_violations`, with the
pinned axe-core injected from .cache/, never fetched by the page) and layout (`horizontal_overflow`)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import sys
import tempfile
import threading
import warnings
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
# How long a page may take to become ready: two cores shared with other e2e runs, a cold Pyodide start.
BOOT_MS = 120_000
# What Playwright says when the page's renderer died (the `crash` event is not always heard first).
CRASH_SIGNS = ("Page crashed", "Target crashed")
# Context options of a Browser: the default desktop window, and a phone (about an iPhone 12-15's CSS size).
DESKTOP = {"viewport": {"width": 1280, "height": 800}}
PHONE = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}


@pytest.fixture(scope="session")
def site_url():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `python build.py test` (it installs Debian's chromium)")
    # One worker at a time (pytest-xdist runs this fixture in each): the first builds the site and fetches
    # axe-core, the next finds both done (two npm fetches into one cache folder broke each other).
    build.CACHE.mkdir(exist_ok=True)
    with open(build.CACHE / "e2e-setup.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build.build()
        _axe_source()  # fetched (npm, pinned) before any test runs, not in the middle of one
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
        # A test that takes the browser offline on purpose sets this: Chromium logs each refused download.
        self.expect_offline = False

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
        if self.expect_offline:  # a download the service worker could not make is ERR_FAILED to the page
            offline = ("net::ERR_INTERNET_DISCONNECTED", "net::ERR_FAILED")
            errors = [
                e
                for e in errors
                if e not in {f"console.error: Failed to load resource: {o}" for o in offline}
            ]
        assert errors == [], f"console errors: {errors}"


class Browser:
    """One Chromium profile (persistent context); `restart()` closes and reopens it on the same profile.
    `device` holds the context options (DESKTOP by default, or PHONE: size, scale, mobile, touch); a page of
    another size on the same context comes from `new_page(viewport={"width": ..., "height": ...})`."""

    def __init__(self, driver, site_url: str, profile: Path, device: dict | None = None) -> None:
        self.driver = driver
        self.site_url = site_url
        self.profile = profile
        self.device = dict(device or DESKTOP)
        self.guard = Guard(site_url)
        self.context = None
        self.crashed_loads = 0  # loads retried after the renderer crashed (Browser.open)
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
                    **self.device,
                )
                self.context.on("page", self.guard.attach)
                return
            except PlaywrightError as exc:
                last = exc
        raise last  # type: ignore[misc]

    def restart(self) -> None:
        self.context.close()
        self.start()

    def new_page(self, viewport: dict | None = None):
        page = self.context.new_page()
        if viewport is not None:
            page.set_viewport_size(viewport)
        return page

    def open(self, path: str = "/", page=None, *, timeout: float = BOOT_MS, ready: str = "body.ready"):
        """`path` of the site (or a whole URL) in `page` (or a new page), once `ready` matches; returns the
        page to use. A renderer that crashes while the page loads (BROWSER.md: Chromium's rare "Target
        crashed", also seen as "Page crashed" during a Pyodide start on two shared cores) costs one more load
        in a new page of the same size, never the test, and says so (a warning in pytest's summary); anything
        else (a timeout, a page that never gets ready) fails at once."""
        url = path if "://" in path else self.site_url + path
        for attempt in range(2):
            page = page if page is not None else self.new_page()
            crashed: list[bool] = []
            page.on("crash", lambda _page, crashed=crashed: crashed.append(True))
            try:
                page.goto(url)
                page.wait_for_selector(ready, timeout=timeout)
                return page
            except PlaywrightError as exc:
                if attempt or not (crashed or any(sign in str(exc) for sign in CRASH_SIGNS)):
                    raise
                self.crashed_loads += 1
                warnings.warn(
                    f"Chromium's renderer crashed loading {url}; loading it again ({exc})", stacklevel=2
                )
                size = page.viewport_size
                with contextlib.suppress(PlaywrightError):
                    page.close()
                page = self.new_page(
                    viewport=size
                )  # the crashed renderer's page is dead: a new one, same size
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.context is not None:
            self.context.close()


def _browser(driver, site_url: str, request, device: dict | None = None):
    profile = Path(tempfile.mkdtemp(prefix="mp-e2e-"))
    b = Browser(driver, site_url, profile, device)
    yield b
    try:
        b.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if request.node.rep_call.passed if hasattr(request.node, "rep_call") else False:
        b.guard.check()


@pytest.fixture
def browser(playwright_driver, site_url, request):
    yield from _browser(playwright_driver, site_url, request)


@pytest.fixture
def phone_browser(playwright_driver, site_url, request):
    """A Browser emulating a phone (PHONE: 390x844 CSS pixels, scale 2, mobile viewport, touch)."""
    yield from _browser(playwright_driver, site_url, request, PHONE)


@pytest.fixture(params=["desktop", "phone"])
def any_browser(playwright_driver, site_url, request):
    """A Browser at the desktop size (1280x800), and in a second run of the test at the phone size (PHONE,
    390x844): a test that must hold at both sizes takes this one."""
    yield from _browser(
        playwright_driver, site_url, request, DESKTOP if request.param == "desktop" else PHONE
    )


@pytest.fixture
def phone_page(phone_browser):
    """A blank page of `phone_browser` (its `site_url` is `phone_browser.site_url`)."""
    return phone_browser.new_page()


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


def pick_monitor(page, monitor: str, timeout: int = 60_000) -> None:
    """Choose a monitor in the Playground's picker and wait until the pick is done and the log shows it.
    Not on the action counter: another action (a redraw's, a curl run's) may finish in between."""
    page.evaluate("MP.picked = null")
    page.select_option("#monitor-pick", monitor)
    wait_picked(page, monitor, timeout)


def choose_file(page, selector: str, path: str, timeout: int = 60_000) -> None:
    """Set a file input and wait for the page's change handler, an action the counter counts, to finish: an
    action started next then waits on the counter for itself, not for this one. The input is emptied first
    (no event): the same file chosen again would fire no change."""
    page.eval_on_selector(selector, "e => { e.value = '' }")
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.set_input_files(selector, path)
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=timeout)


def wait_picked(page, monitor: str, timeout: int = 60_000) -> None:
    page.wait_for_function(
        "m => MP.picked === m && (document.querySelector('#log-head')?.textContent || '').startsWith(m + ' ·')",
        arg=monitor,
        timeout=timeout,
    )
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


# ------------------------------------------------------------------------------------- accessibility, layout


@functools.cache
def _axe_source() -> str:
    return build.axe_script().read_text(encoding="utf-8")


def axe_violations(
    page, impacts: tuple[str, ...] = ("serious", "critical"), max_nodes: int = 5
) -> list[dict]:
    """Run the pinned axe-core on the page as it is now and return its violations of those impacts, each as
    {id, impact, help, helpUrl, count, nodes: [{target, html, why}]} with the first `max_nodes` elements (`why`:
    axe's first failure message, e.g. the contrast ratio and colours). axe is injected from the local file
    (no request), once per document."""
    if not page.evaluate("typeof window.axe === 'object' && typeof window.axe.run === 'function'"):
        # Not a script tag: the pages' Content-Security-Policy runs no inline script (it allows eval, for Pyodide).
        page.evaluate("src => { (0, eval)(src); }", _axe_source())
    found = page.evaluate(
        """async max => {
            const r = await axe.run(document, {resultTypes: ["violations"]});
            const why = n => ([...n.any, ...n.all, ...n.none].find(c => c.message) || {message: ""}).message;
            return r.violations.map(v => ({
                id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl, count: v.nodes.length,
                nodes: v.nodes.slice(0, max).map(n => ({
                    target: n.target.join(" "), html: n.html.slice(0, 200), why: why(n).slice(0, 240),
                })),
            }));
        }""",
        max_nodes,
    )
    return [v for v in found if v["impact"] in impacts]


def heading_order(page) -> list[dict]:
    """axe-core's heading-order findings: a heading more than one level below the heading before it (an h4
    right after an h2), which a screen reader's outline shows as a missing level. axe rates it moderate, so
    axe_violations' default impacts leave it out."""
    every = ("minor", "moderate", "serious", "critical")
    return [v for v in axe_violations(page, impacts=every) if v["id"] == "heading-order"]


def format_violations(violations: list[dict]) -> str:
    """axe violations as readable lines for an assertion message."""
    if not violations:
        return "no axe violations"
    lines = []
    for v in violations:
        lines.append(f"[{v['impact']}] {v['id']}: {v['help']} ({v['count']} element(s); {v['helpUrl']})")
        for n in v["nodes"]:
            lines.append(f"    {n['target']}  {n['html']}")
            if n["why"]:
                lines.append(f"        {n['why']}")
        if v["count"] > len(v["nodes"]):
            lines.append(f"    ... and {v['count'] - len(v['nodes'])} more")
    return "\n".join(lines)


def horizontal_overflow(page) -> dict:
    """Whether the page scrolls sideways at its viewport's width: {viewport, inner_width, client_width,
    scroll_width, overflows, wide, wide_count}. `wide` lists up to 25 of the `wide_count` visible elements whose
    box reaches past the viewport's right edge and that no scrolling or clipping ancestor contains, as {el:
    "tag#id.class", left, right, width, outer}; `outer` ones (whose parent still fits: where the overflow
    starts) come first, each group in document order. The reference is the viewport size the page was given:
    a mobile context zooms a too-wide page out, so there inner_width grows with the page."""
    width = page.viewport_size["width"]
    info = page.evaluate(
        """width => {
            const root = [document.body, document.documentElement];
            const clips = el => {
                for (let a = el.parentElement; a && !root.includes(a); a = a.parentElement) {
                    if (getComputedStyle(a).overflowX !== "visible") return true;
                }
                return false;
            };
            const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
                [...el.classList].map(c => "." + c).join("");
            const right = el => el.getBoundingClientRect().right + window.scrollX;
            const wide = [];
            for (const el of document.body.querySelectorAll("*")) {
                const r = el.getBoundingClientRect();
                if (r.width === 0 || r.height === 0 || r.right + window.scrollX <= width + 0.5) continue;
                if (getComputedStyle(el).visibility === "hidden" || clips(el)) continue;
                const p = el.parentElement;
                wide.push({el: name(el), left: Math.round(r.left + window.scrollX),
                           right: Math.round(r.right + window.scrollX), width: Math.round(r.width),
                           outer: root.includes(p) || right(p) <= width + 0.5});
            }
            const se = document.scrollingElement;
            return {inner_width: window.innerWidth, client_width: se.clientWidth, scroll_width: se.scrollWidth,
                    wide: [...wide.filter(w => w.outer), ...wide.filter(w => !w.outer)].slice(0, 25),
                    wide_count: wide.length};
        }""",
        width,
    )
    info["viewport"] = width
    info["overflows"] = info["scroll_width"] > width
    return info
