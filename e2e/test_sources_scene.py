"""The `stale-source` scene (embed.html?scene=stale-source) in Chromium: a source that answers, then stops
answering. Its checks are simulated in the page, made by the engine's own rule book (core/sources.py, the one
`mp probe` and `mp serve --sources` use): each not-answering check is still a card in the log, yet the state's
`answering` says no and, past the monitor's ttl, the `stale_source` gap appears; one more answer and it goes.
Waits on the frame's own counters and on what the page shows, never on sleeps."""

from __future__ import annotations

import re

from conftest import axe_violations, format_violations, horizontal_overflow, screenshot

BOOT_MS = 120_000
ACT_MS = 90_000  # the silent move makes four checks, 2 s apart, on a shared machine
HEALTH = "com.example.health.check"


def ready(page) -> None:
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert page.evaluate("MP.errors.length") == 0, page.evaluate("MP.errors")


def act(page, key: str) -> None:
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(f"#scene-moves button[data-act='scene-move'][data-move='{key}']")
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def checks(page) -> list[str]:
    texts = page.eval_on_selector_all(
        "#log li.obs", "els => els.map(e => ({type: e.dataset.type, text: e.innerText}))"
    )
    return [t["text"] for t in texts if t["type"] == HEALTH]


def gaps(page) -> str:
    return page.inner_text("#gaps")


def primary(page) -> str:
    return page.get_attribute("#scene-moves button.primary", "data-move")


def test_a_source_that_stops_answering_goes_stale_while_its_rows_keep_coming(browser):
    page = browser.open("/embed.html?scene=stale-source", timeout=BOOT_MS)
    ready(page)
    assert page.inner_text("#scene-title") == "A source that stops answering"
    assert "simulated in this page" in page.inner_text("#scene-text")
    assert primary(page) == "answer"
    assert page.is_disabled("#scene-moves button[data-move='silent']")  # it has to answer once first

    act(page, "answer")
    rows = checks(page)
    assert len(rows) == 1 and re.search(r'✓ HTTP 200 · \d+ ms · "up"$', rows[0]), rows  # an answer, said so
    assert page.inner_text("#answering").startswith("✓ yes")
    assert "stale_source" not in gaps(page)  # positive control: an answering source is not stale
    assert primary(page) == "silent"

    act(page, "silent")
    rows = checks(page)
    assert len(rows) == 5 and all("not answering" in r for r in rows[1:]), rows  # still published, as such
    assert page.inner_text("#answering").startswith("✗ no")
    # rows keep arriving, yet past the ttl (5 s) since the last answer the state says the source is stale
    page.wait_for_function(
        "document.querySelector('#gaps').innerText.includes('stale_source')", timeout=ACT_MS
    )
    assert primary(page) == "back"
    info = horizontal_overflow(page)
    assert not info["overflows"], info
    found = axe_violations(page)
    assert found == [], format_violations(found)
    screenshot(page, "embed-stale-source")

    act(page, "back")
    assert page.inner_text("#answering").startswith("✓ yes")
    page.wait_for_function(
        "!document.querySelector('#gaps').innerText.includes('stale_source')", timeout=ACT_MS
    )

    # the log is kept: a reload shows the same checks and the same state
    count = len(checks(page))
    page.reload()
    ready(page)
    assert len(checks(page)) == count
    assert page.inner_text("#answering").startswith("✓ yes")
