"""Share and restore in Chromium: export a monitor's log as JSON Lines (a real download), import the file into
a fresh monitor (its log matches), a malformed file listed line by line with nothing imported, a share link
recorded in one browser replayed in another into the same situation, and tampered links refused. Waits are
on the page's counters (MP.actionsDone) and the DOM, never sleeps."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import tempfile
from pathlib import Path

from conftest import Browser, axe_violations, choose_file, format_violations, horizontal_overflow
from monitor_protocol.core import schemas

BOOT_MS = 120_000
ACT_MS = 60_000
OBSERVATION = schemas.validator("observation")


def open_playground(browser, path: str = "/"):
    return browser.open(path, timeout=BOOT_MS)


def act(page, selector: str) -> None:
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(selector)
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def tab(page, name: str) -> None:
    page.click(f"#tabs button[data-tab='{name}']")
    page.wait_for_selector(f"#tab-{name}.view.active", timeout=ACT_MS)


def a_few_steps(page) -> None:
    """Create the CI monitor, publish twice (one refused), subscribe a reader, pull, crash it."""
    tab(page, "playground")
    act(page, "#btn-define-ci")
    act(page, "[data-act=preset][data-preset=probe]")
    act(page, "#btn-publish")
    act(page, "[data-act=preset][data-preset=agent-src]")
    act(page, "#btn-publish")  # refused, and the refusal is in the log
    act(page, "#btn-add-reader")
    act(page, "#readers [data-act=r-pull]")
    act(page, "#readers [data-act=r-crash]")


def download_log(page, tmp: Path) -> tuple[str, list[dict]]:
    with page.expect_download(timeout=ACT_MS) as info:
        act(page, "#btn-share-export")
    d = info.value
    path = tmp / d.suggested_filename
    d.save_as(path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return d.suggested_filename, rows


def moved(row: dict, new_id: str) -> dict:
    """The import's mapping (importing.py): only the monitor's address changes."""
    out = copy.deepcopy(row)
    out["source"] = f"monitor:{new_id}"
    if out["type"].startswith("ai.mentu.monitor.") and "contradiction" not in out["type"]:
        if "monitor" in out["data"].get("tags", {}):
            out["data"]["tags"]["monitor"] = new_id
        if out["type"] == "ai.mentu.monitor.configured":
            out["data"]["payload"]["after"]["id"] = new_id
    return out


def monitors_listed(page) -> list[str]:
    return page.eval_on_selector_all("#monitor-pick option", "os => os.map(o => o.value).filter(Boolean)")


def test_export_then_import_makes_the_same_log(browser, tmp_path):
    page = open_playground(browser)
    a_few_steps(page)
    name, rows = download_log(page, tmp_path)
    assert re.fullmatch(r"ci-\d{8}T\d{6}Z\.jsonl", name), name
    assert [int(r["id"]) for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == 4
    assert {r["type"] for r in rows} >= {"ai.mentu.monitor.configured", "ai.mentu.monitor.rejected"}
    for r in rows:
        assert OBSERVATION.is_valid(r), next(OBSERVATION.iter_errors(r)).message
    page.click("#share-import-box summary")
    choose_file(page, "#share-file", str(tmp_path / name))
    act(page, "#btn-share-import")
    answer = page.locator("#share-answer")
    assert answer.get_attribute("data-status") == "201", answer.inner_text()
    page.wait_for_function("document.querySelector('#monitor-pick').value === 'ci-import'", timeout=ACT_MS)
    token = page.locator("#token-box code.owner-token").inner_text()
    assert token.startswith("mpo") and len(token) > 30  # shown once, in the box
    assert token not in answer.inner_text()  # and never in the answer line
    # the copy's log is the original's, row for row (positive control: the mapping, not a loose match)
    name2, rows2 = download_log(page, tmp_path)
    assert name2.startswith("ci-import-")
    assert rows2 == [moved(r, "ci-import") for r in rows]
    assert page.locator("#log li.obs").count() >= len(rows)
    # the copy is a monitor of this engine like any other: the curl console's engine, the same picture
    assert set(monitors_listed(page)) == {"ci", "ci-import"}


def test_a_malformed_file_lists_its_refused_lines_and_imports_nothing(browser, tmp_path):
    page = open_playground(browser)
    a_few_steps(page)
    act(page, "[data-act=preset][data-preset=probe]")
    act(page, "#btn-publish")  # seq 5
    _, rows = download_log(page, tmp_path)
    assert len(rows) == 5
    lines = [json.dumps(r) for r in rows]
    lines[1] = "this is not JSON"
    bad = dict(rows[2])
    bad["tier"] = "certain"  # not in the closed vocabulary: the schema refuses it
    lines[2] = json.dumps(bad)
    lines[3], lines[4] = lines[4], lines[3]  # seq 5 before seq 4
    page.click("#share-import-box summary")
    page.fill("#share-paste", "\n".join(lines) + "\n")  # the phone's way in: pasted text
    act(page, "#btn-share-import")
    answer = page.locator("#share-answer")
    assert answer.get_attribute("data-code") == "INVALID"
    assert answer.get_attribute("data-refused") == "2,3,4,5", answer.inner_text()
    text = answer.inner_text()
    assert "nothing was imported" in text
    assert "line 2" in text and "Not JSON" in text
    assert "jsonschema (schemas/observation.json): tier" in text  # the page's own schema check
    assert "strictly increasing" in text and "missing" in text
    assert monitors_listed(page) == ["ci"]
    # positive control: the same file, repaired, imports
    page.fill("#share-paste", "\n".join(json.dumps(r) for r in rows) + "\n")
    act(page, "#btn-share-import")
    assert answer.get_attribute("data-status") == "201", answer.inner_text()
    assert set(monitors_listed(page)) == {"ci", "ci-import"}


def situation(page) -> dict:
    """What the link must reproduce: the reader crashed, its batch held (not acked), at its cursor."""
    page.wait_for_selector("#lanes .lane.crashed", timeout=ACT_MS)
    return {
        "monitor": page.eval_on_selector("#monitor-pick", "s => s.value"),
        "unacked": page.eval_on_selector_all("#log li.obs.unacked", "els => els.map(e => +e.dataset.seq)"),
        "cursors": page.eval_on_selector_all("#lanes .lane.crashed", "els => els.map(e => e.dataset.cursor)"),
        "types": page.eval_on_selector_all("#log li.obs", "els => els.map(e => e.dataset.type)"),
        "reader": page.locator("#readers .card.reader.crashed").count(),
    }


def test_a_share_link_replays_in_a_fresh_browser(browser, playwright_driver, site_url):
    page = open_playground(browser)
    a_few_steps(page)
    act(page, "#btn-share-link")
    link = page.input_value("#share-link-out")
    assert link.startswith(site_url + "/#scenario=")
    said = page.inner_text("#share-answer")
    assert "6 steps: create monitor ci, publish 2, subscribe reader-a, pull reader-a, crash reader-a" in said
    fragment = link.split("#scenario=", 1)[1]
    assert len(fragment) < 600, len(fragment)  # docs/playground.md: about 418 characters
    decoded = json.loads(base64.urlsafe_b64decode(fragment + "=" * (-len(fragment) % 4)))
    assert "mpo" not in json.dumps(decoded) and "token" not in json.dumps(decoded)  # steps, never tokens
    before = situation(page)
    assert before["unacked"] and before["reader"] == 1

    profile = Path(tempfile.mkdtemp(prefix="mp-e2e-share-"))
    other = Browser(playwright_driver, site_url, profile)
    try:
        fresh = other.open(link, timeout=BOOT_MS)
        fresh.wait_for_selector("#tab-playground.view.active", timeout=ACT_MS)
        assert fresh.get_attribute("#share-open", "data-state") == "ready"
        assert fresh.inner_text("#share-describe") == (
            "6 steps: create monitor ci, publish 2, subscribe reader-a, pull reader-a, crash reader-a"
        )
        assert monitors_listed(fresh) == []  # nothing runs before Replay
        act(fresh, "#btn-share-replay")
        after = situation(fresh)
        assert after == before, (after, before)
        # said in the banner itself, and the button gone (a second tap would replay a second copy)
        said = fresh.inner_text("#share-open .share-said")
        assert said.startswith("Replayed 6 step(s) into monitor ci") and "Its log is below." in said, said
        assert not fresh.is_visible("#btn-share-replay")
        # and in the same browser the replay takes a fresh id, never the original's
        page.goto(link)
        page.reload()  # the same page with a new hash: a hash change alone does not start it again
        page.wait_for_selector("body.ready", timeout=BOOT_MS)
        act(page, "#btn-share-replay")
        again = situation(page)
        assert again["monitor"] == "ci-2" and again["unacked"] == before["unacked"]
        other.guard.check()
    finally:
        other.close()
        shutil.rmtree(profile, ignore_errors=True)


def _fragment(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def test_tampered_links_are_refused_and_run_nothing(browser):
    page = open_playground(browser)
    good = _fragment({"v": 1, "steps": [["ci"], ["sub", "reader-a"]]})
    cases = {
        "!!not-base64!!": "not base64url",
        _fragment("hello")[:-1] + "%%": "not base64url",
        base64.urlsafe_b64encode(b"{not json").decode().rstrip("="): "not JSON",
        _fragment({"v": 1, "steps": [["ci"], ["format-disk", "/"]]}): "not a playground step",
        _fragment({"v": 1, "steps": [["ci"], ["pull", "../../x y"]]}): "one reader name",
        _fragment({"v": 2, "steps": [["ci"]]}): "not a playground scenario",
        _fragment({"v": 1, "steps": [["sub", "reader-a"]]}): "must begin by creating its monitor",
        # nested past Python's own parser (under the length cap): refused, and the page still starts
        base64.urlsafe_b64encode(b'{"v":1,"steps":' + b"[" * 2800).decode().rstrip("="): "not JSON",
        "A" * 5000: "at most 4096",
    }
    for fragment, why in cases.items():
        page.goto(f"{browser.site_url}/#scenario={fragment}")
        page.reload()  # a new hash alone does not reload the page
        page.wait_for_selector("body.ready", timeout=BOOT_MS)
        box = page.locator("#share-open")
        assert box.get_attribute("data-state") == "refused", fragment
        text = box.inner_text()
        assert "cannot be replayed" in text and why in text and "Nothing was run" in text, (fragment, text)
        assert page.locator("#btn-share-replay").count() == 0
        assert monitors_listed(page) == []
    # positive control: an untampered link of the same shape is offered for replay
    page.goto(f"{browser.site_url}/#scenario={good}")
    page.reload()
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert page.get_attribute("#share-open", "data-state") == "ready"
    assert page.inner_text("#share-describe") == "2 steps: create monitor ci, subscribe reader-a"


def test_the_share_panel_on_a_phone(phone_page, phone_browser):
    """At 390 px: a shared scenario, the panel with its import box open and a share link shown, no sideways
    scroll and no serious accessibility violation."""
    steps = [["ci"], ["pub", {"actor": "probe:ci"}], ["sub", "reader-a"]]
    link = _fragment({"v": 1, "steps": steps})
    phone_page = phone_browser.open(f"/#scenario={link}", phone_page, timeout=BOOT_MS)
    assert phone_page.get_attribute("#share-open", "data-state") == "ready"
    act(phone_page, "#btn-share-replay")
    # the replayed log is brought into view (it was screens below, the page left at the top)
    top = phone_page.evaluate("document.querySelector('.log-panel .log-title').getBoundingClientRect().top")
    assert -2 <= top < phone_page.viewport_size["height"] / 2, top
    act(phone_page, "#btn-share-link")
    shared = phone_page.input_value("#share-link-out").split("#scenario=", 1)[1]
    again = json.loads(base64.urlsafe_b64decode(shared + "=" * (-len(shared) % 4)))
    assert again == {"v": 1, "steps": steps}  # the replayed monitor can be shared on, the same steps
    phone_page.click("#share-import-box summary")
    info = horizontal_overflow(phone_page)
    assert not info["overflows"], info
    found = axe_violations(phone_page)
    assert found == [], format_violations(found)


def test_a_follower_that_takes_over_takes_back_its_replay_refusal(browser):
    """The banner of a follower's refused Replay sent the reader to "that tab": once that tab closes and
    this one owns the engine, the banner says Replay works here, and it does."""
    owner = open_playground(browser)
    link = f"/#scenario={_fragment({'v': 1, 'steps': [['ci'], ['sub', 'reader-a']]})}"
    second = browser.open(link, browser.new_page(), timeout=BOOT_MS)
    act(second, "#btn-share-replay")
    assert "open the link there" in second.inner_text("#share-open .share-said")
    browser.guard.expect_http_refusals = True  # a request in the handover window may get the shim's 503
    owner.close()
    second.wait_for_function("document.getElementById('other-tab').hidden", timeout=ACT_MS)
    second.wait_for_function(
        "document.querySelector('#share-open .share-said')?.textContent.includes('Replay works here')",
        timeout=ACT_MS,
    )
    assert "ok" in second.get_attribute("#share-open .share-said", "class")
    act(second, "#btn-share-replay")
    assert second.inner_text("#share-open .share-said").startswith("Replayed 2 step(s) into monitor ci")


def test_a_link_opened_in_a_second_tab_says_in_its_banner_where_to_replay(browser):
    """A share link is usually opened in a new tab, while the playground's first tab owns the engine: the
    refusal is said in the banner where Replay was pressed (on a phone the answer panel is screens below),
    and nothing runs. Control: the owner tab replays the same link."""
    owner = open_playground(browser)
    link = f"/#scenario={_fragment({'v': 1, 'steps': [['ci'], ['sub', 'reader-a']]})}"
    second = browser.open(link, browser.new_page(), timeout=BOOT_MS)
    assert second.get_attribute("#share-open", "data-state") == "ready"
    act(second, "#btn-share-replay")
    said = second.inner_text("#share-open .share-said")
    assert "from the tab that owns the engine" in said and "open the link there" in said, said
    assert monitors_listed(second) == []
    second.close()  # else the owner's reload would hand the engine to it
    owner.goto(browser.site_url + link)
    owner.reload()
    owner.wait_for_selector("body.ready", timeout=BOOT_MS)
    act(owner, "#btn-share-replay")
    assert owner.inner_text("#share-open .share-said").startswith("Replayed 2 step(s) into monitor ci")


def test_after_the_race_the_share_panel_names_the_monitor_the_log_shows(browser):
    """Found by a tester: the race moves the Log to its own monitor, and Copy share link then said only
    "Nothing recorded for this monitor", read as the steps on ci being lost. It names the monitor on
    screen and the ones that have a link (control: picked again, ci's link is made)."""
    page = open_playground(browser)
    tab(page, "playground")
    act(page, "#btn-define-ci")
    act(page, "#btn-publish")
    act(page, "#race-btn")
    page.wait_for_function(
        "+document.querySelector('#race [data-k=published]')?.textContent >= 2", timeout=ACT_MS
    )
    act(page, "#race-btn")  # stop
    # Stop returns at once; the cursor reader then catches up (the button is disabled until it has): a pick
    # of ci made meanwhile could meet the race's last refresh (a CI flake on 2026-12-07)
    page.wait_for_function("!document.querySelector('#race-btn').disabled", timeout=ACT_MS)
    act(page, "#btn-share-link")
    said = page.inner_text("#share-answer")
    assert "(race, the monitor the Log shows)" in said and "Recorded: ci" in said, said
    page.select_option("#monitor-pick", "ci")
    page.wait_for_function("document.querySelector('#log-head').textContent.startsWith('ci')", timeout=ACT_MS)
    act(page, "#btn-share-link")
    assert "#scenario=" in page.input_value("#share-link-out")
