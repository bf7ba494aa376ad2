"""Importing a log in Chromium at 1280x800 and 390x844 (issue 25, security items 4 and 5): an edited export
that launders claims and breaks a publish's limits is refused line by line with nothing imported (the
unedited file is the positive control); an 8 MiB file is checked in slices with a progress bar while the
page keeps taking clicks: another tab opens, Cancel stops it with nothing imported, and a second run
imports it whole. The files are made by the engine itself (tests/enginekit.py), as `mp serve` would export
them. Waits are on the DOM and the page's counters, never sleeps."""

from __future__ import annotations

import copy
import sys

from conftest import ROOT, choose_file

sys.path.insert(0, str(ROOT / "tests"))
from enginekit import Harness  # noqa: E402
from monitor_protocol.core.rules import importing  # noqa: E402
from monitor_protocol.store.memory import MemoryStore  # noqa: E402

BOOT_MS = 120_000
ACT_MS = 60_000
BIG_MS = 300_000  # the whole 8 MiB check and write, on a loaded 2-core machine


def history() -> list[dict]:
    """A small log with a refused publish, a lease claimed and completed."""
    h = Harness(MemoryStore())
    tok = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", tok, subject="build-1", actor="probe:ci", data={"status": "failed"})
    h.publish("ci", tok, subject="build-2", actor="agent:bot", tier="src")  # refused: a rejected row
    h.publish("ci", tok, subject="build-3", actor="probe:ci", data={"status": "passed"})
    sid, rt = h.subscribe("ci", tok, subscriber="agent:worker", capabilities=["observe", "act"])
    assert h.call("POST", f"/subscriptions/{sid}/leases/claim", {"subject": "build-1"}, rt).status == 201
    done = {"subject": "build-1", "outcome": "done"}
    assert h.call("POST", f"/subscriptions/{sid}/leases/complete", done, rt).status == 200
    return h.service.export_log("ci")


def open_playground(browser):
    page = browser.open("/", timeout=BOOT_MS)
    page.click("#tabs button[data-tab='playground']")
    page.wait_for_selector("#tab-playground.view.active", timeout=ACT_MS)
    page.click("#share-import-box summary")
    return page


def start(page, selector: str) -> int:
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(selector)
    return before


def finished(page, before: int, timeout: int = ACT_MS) -> None:
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=timeout)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def monitors(page) -> list[str]:
    return page.eval_on_selector_all("#monitor-pick option", "os => os.map(o => o.value).filter(Boolean)")


def test_an_edited_export_that_launders_claims_is_refused_line_by_line(any_browser, tmp_path):
    page = open_playground(any_browser)
    rows = history()
    kinds = [(r["type"], r["data"].get("payload", {}).get("action")) for r in rows]
    published = [i for i, r in enumerate(rows) if not r["type"].startswith("ai.mentu.monitor.")]
    lease_done = kinds.index(("ai.mentu.monitor.lease", "complete"))
    rejected = kinds.index(("ai.mentu.monitor.rejected", None))
    edited = copy.deepcopy(rows)
    edited[published[0]]["time"] = "9999-12-31T00:00:00.000Z"  # fresh forever
    edited[published[1]]["subject"] = "s" * 100_000
    edited[published[1]]["type"] = "com.example." + "t" * 5000
    edited[rejected]["time"] = "0001-01-01T00:00:00.000Z"  # a server's clock never read that
    row = edited[lease_done]  # the server's measurement, claiming a person acted for another
    prov = row["data"]["provenance"]
    row["actor"] = prov["actor"] = "human:bob"
    prov["on_behalf_of"] = prov["wasAttributedTo"] = "human:carol"
    big = copy.deepcopy(rows[published[0]])
    big["id"], big["sequence"] = str(len(rows) + 1), f"{len(rows) + 1:020d}"
    big["data"]["blob"] = "z" * (2 << 20)  # a 2 MiB payload, more than any publish may send
    file = tmp_path / "ci-edited.jsonl"
    deep = "[" * 100_000 + "]" * 100_000  # nested past any parser: in Pyodide it would take the page down
    file.write_text(importing.to_jsonl([*edited, big]) + deep + "\n")

    choose_file(page, "#share-file", str(file))
    finished(page, start(page, "#btn-share-import"))
    answer = page.locator("#share-answer")
    assert answer.get_attribute("data-code") == "INVALID", answer.inner_text()
    refused = {
        int(li.get_attribute("data-line")): li.inner_text() for li in answer.locator("li[data-line]").all()
    }
    expect = {
        published[0] + 1: "ahead of the server's clock",
        published[1] + 1: "at most 256",
        rejected + 1: "before 1970",
        lease_done + 1: "claims on_behalf_of",
        len(rows) + 1: "at most 1048576 bytes",
        len(rows) + 2: "nests deeper than 32 levels",
    }
    assert set(refused) == set(expect), refused
    for line, why in expect.items():
        assert why in refused[line], (line, refused[line])
    assert "nothing was imported" in answer.inner_text()
    assert monitors(page) == []

    # The positive control: the same log, unedited, imports (and the page is still whole).
    file.write_text(importing.to_jsonl(rows))
    choose_file(page, "#share-file", str(file))
    finished(page, start(page, "#btn-share-import"))
    assert answer.get_attribute("data-status") == "201", answer.inner_text()
    assert monitors(page) == ["ci-import"]


def big_file(tmp_path):
    """Just under 8 MiB of a real export: the largest file an import takes."""
    h = Harness(MemoryStore())
    tok = h.monitor("big")
    n = 0
    while True:
        for _ in range(500):
            n += 1
            h.publish("big", tok, subject=f"build-{n}", actor="probe:ci", data={"status": "failed", "n": n})
        text = importing.to_jsonl(h.service.export_log("big"))
        if len(text.encode()) > importing.MAX_IMPORT_BYTES - 400_000:
            break
    path = tmp_path / "big.jsonl"
    path.write_text(text)
    assert len(text.encode()) <= importing.MAX_IMPORT_BYTES
    return path, text.count("\n")


def test_an_8_mib_import_shows_progress_takes_clicks_and_cancels(any_browser, tmp_path):
    path, lines = big_file(tmp_path)
    page = open_playground(any_browser)
    choose_file(page, "#share-file", str(path))
    # The page's CPU slowed 4x while it checks, until Cancel is pressed: the check then outlasts the clicks
    # below on any machine (CI once saw it end first, the cancel then finding nothing to cancel).
    slow = page.context.new_cdp_session(page)
    slow.send("Emulation.setCPUThrottlingRate", {"rate": 4})
    before = start(page, "#btn-share-import")
    # A slice at a time: the progress bar moves, short of the end.
    page.wait_for_function(
        "() => { const b = document.getElementById('share-progress-bar');"
        " return !document.getElementById('share-progress').hidden && b.value > 0 && b.value < b.max; }",
        timeout=BIG_MS,
    )
    assert f"of {lines}" in page.inner_text("#share-progress-text")
    # The page takes clicks meanwhile: another tab opens, and back, while the check goes on.
    page.click("#tabs button[data-tab='curl']")
    page.wait_for_selector("#tab-curl.view.active", timeout=ACT_MS)
    page.click("#tabs button[data-tab='playground']")
    page.wait_for_selector("#tab-playground.view.active", timeout=ACT_MS)
    assert page.is_visible("#share-progress"), "the check ended before the page took the clicks"
    page.click("#btn-share-cancel")
    slow.send("Emulation.setCPUThrottlingRate", {"rate": 1})
    finished(page, before, BIG_MS)
    answer = page.locator("#share-answer")
    assert answer.get_attribute("data-cancelled") == "1", answer.inner_text()
    assert "cancelled: nothing was imported" in answer.inner_text()
    assert page.is_hidden("#share-progress")
    assert monitors(page) == []

    # Again, to the end: written whole, in one transaction.
    choose_file(page, "#share-file", str(path))
    finished(page, start(page, "#btn-share-import"), BIG_MS)
    assert answer.get_attribute("data-status") == "201", answer.inner_text()
    assert monitors(page) == ["big-import"]
    page.wait_for_function(
        "n => document.getElementById('log-head').textContent.includes('head ' + n)",
        arg=lines,
        timeout=ACT_MS,
    )
