"""The docs pages in Chromium (docs/*.html, built by tools/mdpages.py): on every page, every runnable block is
clicked in order and gives what the block itself says (a `--fail-with-body` block only 2xx, the statuses of
an `<!-- expect: -->` note, the text of a `<!-- shows: -->` note), every block that cannot run shows its
reason and no Run button, the Python block runs with the real client in Pyodide, the runs really changed the
page's own engine (its IndexedDB), and none of it reached the playground's engine. Also: the page's shell
variables survive a reload, Reset empties the page's engine, a second tab of a page runs blocks on the
first tab's engine, the keyboard reaches Run, and a phone-width page does not scroll sideways. The protocol
page (docs/protocol.md, nothing to run) loads as plain HTML without an engine, and the README's links into
it land on the heading they name.
Results are waited for on the page's own counter (MP.actionsDone), never by sleeping."""

from __future__ import annotations

import html
import json
import re

import pytest
from conftest import ROOT, axe_violations, format_violations, horizontal_overflow, screenshot

from tools import mdpages

BOOT_MS = 120_000  # two cores shared with other e2e runs: a cold Pyodide start can take a while
RUN_MS = 300_000  # the first Python or mp block starts the worker: Pyodide, micropip, the wheel
PAGES = [(n, s) for n, s, optional in mdpages.PAGES if not optional or (ROOT / s).is_file()]


def blocks_of(source: str) -> list[mdpages.Block]:
    """The page's blocks as the build sees them, from the Markdown itself."""
    r = mdpages.Renderer(source, {s: f"{n}.html" for n, s in PAGES})
    r.render((ROOT / source).read_text())
    return r.blocks


# The pages with an engine of their own: those with something to run (the others are plain HTML).
LIVE = [(n, s) for n, s in PAGES if any(b.kind != "show" for b in blocks_of(s))]


def open_doc(browser, name: str, page=None):
    page = browser.open(f"/docs/{name}.html", page, timeout=BOOT_MS)
    assert page.evaluate("MP.errors") == []
    return page


def run_block(page, n: int, how: str = "click") -> dict:
    """Run block n and wait until the page says it finished; its verdict, statuses and output."""
    before = page.evaluate("MP.actionsDone")
    button = page.locator(f"#block-{n} button.run")
    if how == "keyboard":
        button.focus()
        page.keyboard.press("Enter")
    else:
        button.click()
    page.wait_for_function(f"MP.actionsDone > {before}", timeout=RUN_MS)
    fig = page.locator(f"#block-{n}")
    return {
        "state": fig.get_attribute("data-state"),
        "statuses": [int(s) for s in (fig.get_attribute("data-statuses") or "").split()],
        "verdict": fig.locator(".block-state").inner_text(),
        "out": fig.locator(".block-out").inner_text(),
        "errors": fig.locator(".block-out [data-error]").count(),
        "codes": fig.locator(".block-out [data-status]").evaluate_all(
            "els => els.map(e => e.textContent.match(/HTTP \\d+ ?([A-Z_]*)/)[1] || null)"
        ),
    }


def idb_keys(page) -> list[list[str]]:
    """Every record key of the page's own engine database ([table, key] pairs)."""
    return [json.loads(k) for k, _ in json.loads(page.evaluate("MP.idb.loadAll()"))]


def fetch_status(page, path: str) -> int:
    return page.evaluate("async p => (await fetch(p)).status", path)


@pytest.mark.parametrize(("name", "source"), LIVE, ids=[n for n, _ in LIVE])
def test_every_block_of_the_page_runs_as_it_says(browser, name, source):
    browser.guard.expect_http_refusals = True  # the tour shows refusals on purpose (each one expected)
    expected = blocks_of(source)
    page = open_doc(browser, name)
    assert page.evaluate("MP.ns") == f"docs-{name}"
    figures = page.locator("figure.block")
    assert figures.count() == len(expected)
    assert idb_keys(page) == []  # a fresh engine: nothing yet
    for b in expected:
        fig = page.locator(f"#block-{b.n}")
        assert fig.get_attribute("data-kind") == b.kind
        assert html.unescape(fig.locator("pre code").inner_text()).rstrip("\n") == b.code.rstrip("\n")
        if b.kind == "show":  # never a Run button; an sh/python block that cannot run says why
            assert fig.locator("button").count() == 0
            if b.lang in mdpages.SH_LANGS | mdpages.PY_LANGS:
                assert b.reason and b.reason in fig.locator(".norun").inner_text()
            continue
        got = run_block(page, b.n)
        where = f"{source}:{b.line}"
        assert got["errors"] == 0 and got["state"] == "ok", f"{where}: {got['verdict']}\n{got['out']}"
        assert got["verdict"].startswith("✓ ran as the docs say"), where
        if b.expect:  # the statuses (and codes) the docs announce, one per request, in order
            assert got["statuses"] == [s for s, _ in b.expect], where
            assert all(c is None or c == g for (_, c), g in zip(b.expect, got["codes"], strict=True)), where
        if b.kind == "sh" and re.search(r"--fail-with-body", b.code):
            assert got["statuses"] and all(200 <= s < 300 for s in got["statuses"]), where
        if b.kind == "sh" and "curl" in b.code:
            assert got["statuses"], f"{where}: a curl block sent no request"
        for text in b.shows:
            assert text in got["out"], f"{where}: {text!r} not in\n{got['out']}"
        if b.kind == "python":
            lines = got["out"].splitlines()
            assert "handling build-412 failed" in lines and "CURSOR_BACKWARDS 409" in lines, got["out"]
            assert (
                "Installing monitor_protocol with micropip from " + browser.site_url + "/pyodide/"
                in got["out"]
            )
            # Run again, its monitor exists: the failure says why and how to start over (a tester saw only
            # a traceback ending in Duplicate)
            again = run_block(page, b.n)
            assert again["state"] == "failed" and "Duplicate" in again["out"], again["out"]
            assert "already holds it, from an earlier run of this block" in again["out"], again["out"]
    # Positive control: the runs changed this page's own engine, in its own IndexedDB database.
    keys = idb_keys(page)
    assert keys, "the blocks ran, yet this page's engine holds nothing"
    dbs = page.evaluate("async () => (await indexedDB.databases()).map(d => d.name)")
    assert f"monitor-protocol-playground--docs-{name}" in dbs
    made = sorted({k for t, k in keys if t == "monitors"})
    assert made, keys[:5]
    if name == "readme":
        assert {"ci", "ci-py"} <= set(made)
        assert fetch_status(page, "../mp/v0/monitors/ci") == 200  # public: anyone on this page's engine
    screenshot(page, f"docs-{name}")
    # The playground's own engine never saw any of it.
    play = browser.open("/", timeout=BOOT_MS)
    assert play.evaluate("MP.ns") == ""
    assert not {k for t, k in idb_keys(play) if t == "monitors"} & set(made)
    assert fetch_status(play, "./mp/v0/monitors/ci") == 404
    listed = play.evaluate("async () => (await (await fetch('./mp/v0/monitors')).json())")
    assert "ci" not in json.dumps(listed)


def test_shell_variables_survive_a_reload_and_reset_empties_the_page(browser):
    blocks = [b for b in blocks_of("README.md") if b.kind == "sh"]
    page = open_doc(browser, "readme")
    for b in blocks[:2]:  # discover, then the monitor (OWNER=...)
        assert run_block(page, b.n)["state"] == "ok"
    page.reload()
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    got = run_block(page, blocks[2].n)  # publish with $OWNER, set by a block before the reload
    assert got["state"] == "ok" and got["statuses"] == [201], got["out"]
    got = run_block(page, blocks[1].n)  # the same monitor again: 409, and the way out is said
    assert got["state"] == "failed" and got["statuses"] == [409], got["verdict"]
    assert "HTTP 409 DUPLICATE" in got["out"] and "Reset this page's engine" in got["out"]
    browser.guard.expect_http_refusals = True
    page.once("dialog", lambda d: d.accept())
    with page.expect_navigation(timeout=BOOT_MS):
        page.click("#reset-btn")
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert idb_keys(page) == [] and fetch_status(page, "../mp/v0/monitors/ci") == 404
    got = run_block(page, blocks[1].n)  # a fresh engine: the monitor can be made again
    assert got["state"] == "ok" and got["statuses"] == [201]


def test_a_second_tab_of_a_page_runs_on_the_first_tabs_engine(browser):
    sh = [b for b in blocks_of("README.md") if b.kind == "sh"]
    first = open_doc(browser, "readme")
    second = open_doc(browser, "readme", browser.new_page())
    assert "another tab owns" in second.inner_text("#status-chip")
    assert second.locator("#reset-btn").is_disabled()
    got = run_block(second, sh[1].n, how="keyboard")  # Enter on the focused Run button
    assert got["state"] == "ok" and got["statuses"] == [201]
    assert any(k == ["monitors", "ci"] for k in idb_keys(first))  # written by the owner tab


def test_index_links_and_the_playground_link_to_the_docs(browser):
    page = browser.open("/", timeout=BOOT_MS)
    page.click("#docs-link")
    page.wait_for_url("**/docs/index.html")
    for name, source in PAGES:
        assert page.locator(f"a[href='./{name}.html']").first.is_visible(), source
    assert page.evaluate("typeof window.MP") == "undefined"  # the index starts no engine
    page.click("main a[href='./readme.html']")
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    wheel = page.locator(".micropip [data-wheel]").inner_text()
    info = page.evaluate("async () => (await fetch('../build-info.json')).json()")
    assert wheel == f"{browser.site_url}/pyodide/{info['engine_wheel']}"
    assert fetch_status(page, wheel) == 200
    page.click("a[href='serve.html#fewer-round-trips-ack-and-pull-and-batch-publish']")
    page.wait_for_url("**/docs/serve.html#fewer-round-trips-ack-and-pull-and-batch-publish")
    assert page.locator("#fewer-round-trips-ack-and-pull-and-batch-publish").is_visible()
    page.click(".docnav a[href='../index.html']")
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert page.evaluate("MP.ns") == ""


def test_readable_on_a_phone_and_accessible(phone_browser):
    for name in ("readme", "doors"):
        page = phone_browser.new_page(viewport={"width": 360, "height": 780})
        page = phone_browser.open(f"/docs/{name}.html", page, timeout=BOOT_MS)
        info = horizontal_overflow(page)
        assert not info["overflows"], info
        code = page.locator("pre.code").first
        assert code.evaluate("e => getComputedStyle(e).overflowX") == "auto"  # code scrolls in its box
        violations = axe_violations(page)
        assert violations == [], format_violations(violations)
        screenshot(page, f"docs-{name}-phone")


def test_the_protocol_page_loads_without_an_engine_and_links_land_on_their_headings(browser, phone_browser):
    assert ("protocol", "docs/protocol.md") in PAGES and ("protocol", "docs/protocol.md") not in LIVE
    page = open_doc(browser, "readme")
    page.click("main a[href='protocol.html#11-conformance']")
    page.wait_for_url("**/docs/protocol.html#11-conformance")
    heading = page.locator("h2[id='11-conformance']")
    assert heading.is_visible() and heading.inner_text().startswith("11. Conformance")
    top = heading.evaluate("e => e.getBoundingClientRect().top")
    assert 0 <= top < 200, top  # scrolled to the heading (below the sticky bar), not left at the top
    assert page.evaluate("typeof window.MP") == "undefined"  # a reference page boots nothing
    assert page.locator("main figure.block button").count() == 0
    toc = page.locator(".toc a").all_inner_texts()
    assert [t.split(".")[0] for t in toc] == [str(n) for n in range(1, 13)], toc
    # Its links to the other pages' sections are there (tests/test_protocol_doc.py follows every one).
    assert (
        page.locator("main a[href='serve.html#fewer-round-trips-ack-and-pull-and-batch-publish']").count()
        == 1
    )
    # Readable on a phone: no sideways scroll, tables scroll in their own box, no accessibility violation.
    phone = phone_browser.new_page(viewport={"width": 360, "height": 780})
    phone.goto(f"{phone_browser.site_url}/docs/protocol.html")
    phone.wait_for_selector("h2[id='12-sources-that-watch-extension']", state="attached")
    info = horizontal_overflow(phone)
    assert not info["overflows"], info
    violations = axe_violations(phone)
    assert violations == [], format_violations(violations)
    screenshot(phone, "docs-protocol-phone")
