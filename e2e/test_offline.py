"""A reload with no server: the service worker answers the site's own files from the copies it kept
(web/sw.js `page`, `keptFirst`, `networkFirst`, `keepLoaded`), so the playground comes back with its log from
IndexedDB. Each test
serves the built site from a server of its own, to stop it for real: a stopped server is what a phone that
lost its network, or a laptop whose `build.py serve` was closed, meets."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import Browser
from playwright.sync_api import Error as PlaywrightError

import build

ACT_MS = 60_000
BOOT_MS = 120_000
# The service worker's copies (its cache is named by the build: mp-site-<digest>)
SITE_CACHE = "caches.keys().then(names => names.find(n => n.startsWith('mp-site-')))"
KEPT = f"{SITE_CACHE}.then(n => n ? caches.open(n).then(c => c.keys()) : []).then(ks => ks.map(r => new URL(r.url).pathname))"


class OwnSite:
    """The built site on a server of its own (stopped by the test), and a browser profile opening it."""

    def __init__(self, driver) -> None:
        self.server = build.make_server(0, build.SITE)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.profile = Path(tempfile.mkdtemp(prefix="mp-e2e-offline-"))
        self.browser = Browser(driver, self.url, self.profile)
        self.running = True

    def stop_server(self) -> None:
        if self.running:
            self.server.shutdown()
            self.server.server_close()
            self.running = False

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self.stop_server()
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture
def own_site(playwright_driver, site_url):  # site_url: the site is built (and Chromium checked) first
    site = OwnSite(playwright_driver)
    yield site
    site.close()


def act(page, selector: str) -> None:
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(selector)
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def wait_kept(page, *paths: str) -> list[str]:
    """Until the service worker has kept these files (it keeps what the page loaded once it is ready; a path
    ending in * is a prefix): the paths it keeps."""
    deadline = time.monotonic() + ACT_MS / 1000
    while True:
        kept = page.evaluate(KEPT)
        if all(any(k.startswith(p[:-1]) for k in kept) if p.endswith("*") else p in kept for p in paths):
            return kept
        assert time.monotonic() < deadline, f"the service worker kept only {sorted(kept)}"
        page.wait_for_timeout(200)


def test_a_reload_with_the_server_gone_comes_back_from_the_kept_files(own_site):
    """First visit, two Story steps, the server stopped, a reload: the page starts from the service worker's
    copies and shows the same log. Positive control: with the copies deleted, the same reload fails (what
    every reload did before the worker kept them)."""
    page = own_site.browser.open("/", timeout=BOOT_MS)
    act(page, "#story-do")  # 1. the builds monitor
    act(page, "#story-next")
    act(page, "#story-do")  # 2. two builds
    rows = page.eval_on_selector_all("#log li.obs", "cards => cards.map(c => c.dataset.seq)")
    assert len(rows) >= 3, rows
    kept = wait_kept(page, "/", "/boot.js", "/styles.css", "/main.py", "/pyodide/pyodide.asm.wasm")
    assert not any(p.startswith("/mp/v0") for p in kept), kept  # the engine's answers are never kept
    # the Conformance tab loads jsonschema when it first runs, after the page was ready: kept then
    page.click("#tabbtn-conformance")
    act(page, "#conf-btn")
    assert page.get_attribute("#conf-total", "data-failed") == "0"
    wait_kept(page, "/pyodide/jsonschema-*")
    page.click("#tabbtn-story")

    assert page.inner_text("#status-chip .label") == "ready · saved in IndexedDB"  # served: no copy said
    own_site.stop_server()
    page.reload()
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert page.eval_on_selector_all("#log li.obs", "cards => cards.map(c => c.dataset.seq)") == rows
    assert page.inner_text("#story-count") == "Step 2 of 13"
    # and it says where it came from (found by a tester: the chip read as if the server had answered)
    page.wait_for_function(
        "document.querySelector('#status-chip .label').textContent.includes('offline copy')", timeout=ACT_MS
    )
    act(page, "#story-next")
    act(page, "#story-do")  # 3. the engine runs offline: a reader subscribes
    assert page.get_attribute("#story-answer", "data-status") == "201"
    page.click("#tabbtn-conformance")  # and the suite runs, from jsonschema's kept files
    act(page, "#conf-btn")
    assert page.get_attribute("#conf-total", "data-failed") == "0", page.inner_text("#conf-total")
    # The browser stops an idle worker, and what it knew of this page (served from the copies) goes with it:
    # a file the page asks for later still comes from the copies (the network first, then the copy)
    cdp = page.context.new_cdp_session(page)
    cdp.send("ServiceWorker.enable")
    cdp.send("ServiceWorker.stopAllWorkers")
    fetched = "fetch('/quickstart.json').then(r => r.status, e => 'failed: ' + e)"
    assert page.evaluate(fetched) == 200
    assert page.evaluate("fetch('/not-kept.txt').then(r => r.status, e => 'failed')") == "failed"  # control
    # A folder and its index.html are one page: the docs menu links ../index.html, and the playground was
    # opened at / (found by a tester: the browser's offline error page). Control: another name is not kept.
    logged = page.eval_on_selector_all("#log li.obs", "cards => cards.map(c => c.dataset.seq)")
    page.goto(own_site.url + "/index.html")
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert page.eval_on_selector_all("#log li.obs", "cards => cards.map(c => c.dataset.seq)") == logged
    other = page.context.new_page()
    with pytest.raises(PlaywrightError):
        other.goto(own_site.url + "/index2.html")
    other.close()
    # What could not be fetched on purpose: the worker's own update check (sw.js) at the reload, the pages
    # that came from the copies, and the control's files that were never kept
    refused = ("net::ERR_CONNECTION_REFUSED", "net::ERR_FAILED")
    own_site.browser.guard.errors = [e for e in own_site.browser.guard.errors if not e.endswith(refused)]
    own_site.browser.guard.check()

    page.evaluate(f"{SITE_CACHE}.then(n => caches.delete(n))")
    with pytest.raises(PlaywrightError):  # the control: nothing kept, nothing to start from
        page.reload(timeout=ACT_MS)
        page.wait_for_selector("body.ready", timeout=10_000)


def test_a_docs_page_and_an_embed_from_the_kept_files_say_so(own_site):
    """Found by a tester: offline, a docs page and an embed came back from the copies with chips that read
    as if the server had answered; the playground's said "offline copy". Control: served, none says it."""
    opened = {}
    for path in ("/docs/readme.html", "/embed.html?scene=lease&id=off"):
        page = own_site.browser.open(path, own_site.browser.new_page(), timeout=BOOT_MS)
        label = page.inner_text("#status-chip .label")
        assert label.startswith("ready") and "offline copy" not in label, label  # served: nothing said
        # every file of the site the page fetched (its modules load after it is ready), then kept
        loaded = page.evaluate(
            "[...new Set(performance.getEntriesByType('resource').map(e => new URL(e.name))"
            ".filter(u => u.origin === location.origin && !u.pathname.startsWith('/mp/v0')).map(u => u.pathname))]"
        )
        wait_kept(page, path.split("?")[0], *loaded)
        opened[path] = page
    own_site.stop_server()
    for page in opened.values():
        page.reload()
        page.wait_for_selector("body.ready", timeout=BOOT_MS)
        page.wait_for_function(
            "document.querySelector('#status-chip .label').textContent.startsWith('ready · offline copy')",
            timeout=ACT_MS,
        )
    refused = ("net::ERR_CONNECTION_REFUSED", "net::ERR_FAILED")
    own_site.browser.guard.errors = [e for e in own_site.browser.guard.errors if not e.endswith(refused)]
    own_site.browser.guard.check()
