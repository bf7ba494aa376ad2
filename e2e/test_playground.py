"""The playground in Chromium: the whole story, refusals, leases, persistence, the curl console, the service
worker for a second tab, one writer across tabs, and the conformance suite, all in the page's engine."""

from __future__ import annotations

import json
import re
import sys

from conftest import ROOT, screenshot


def open_playground(browser, page=None):
    page = page or browser.new_page()
    page.goto(browser.site_url + "/")
    page.wait_for_selector("body.ready", timeout=60_000)
    return page


def act(page, selector: str) -> None:
    """Click a control and wait until the page reports the action finished (no sleeping)."""
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(selector)
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=30_000)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#story-answer")


def story_step(page, expect_step: int) -> str:
    assert page.inner_text("#story-count") == f"Step {expect_step} of 11"
    principle = page.inner_text("#story-principle")  # every step names its principle in plain words
    assert principle.startswith("The principle: ") and len(principle) > 60
    act(page, "#story-do")
    return page.inner_text("#story-answer")


def next_step(page) -> None:
    act(page, "#story-next")


def log_cards(page) -> list[dict]:
    return page.eval_on_selector_all(
        "#log li.obs",
        """els => els.map(e => ({seq: +e.dataset.seq, type: e.dataset.type, cls: e.className,
                                 text: e.innerText}))""",
    )


def state_counter(page, name: str) -> str:
    return page.evaluate(
        """name => [...document.querySelectorAll('#state dt')].find(e => e.textContent === name)
                     .nextElementSibling.textContent""",
        name,
    )


def answer_json(page, selector: str) -> dict:
    text = page.inner_text(selector)
    return json.loads(text[text.index("{") :])


def test_the_whole_story(browser):
    page = open_playground(browser)
    assert page.inner_text("#status-chip") == "ready · storage: IndexedDB"

    # 1. define the CI monitor: the owner token is shown once
    out = story_step(page, 1)
    assert "201 OK" in out
    assert len(page.inner_text("#owner-token")) >= 24
    # The timeline reads through the page's admin door: no subscription of its own pollutes the log,
    # the counters or the gaps.
    assert [c["type"] for c in log_cards(page)] == ["ai.mentu.monitor.configured"]
    next_step(page)

    # 2. a probe reports a failed build: measured, origin probe
    out = story_step(page, 2)
    obs = answer_json(page, "#story-answer")["observation"]
    assert (obs["tier"], obs["origin"], obs["actor"]) == ("measured", "probe", "probe:ci")
    probe_seq = int(obs["id"])
    card = next(c for c in log_cards(page) if c["seq"] == probe_seq)
    assert "measured" in card["text"] and "probe:ci" in card["text"]
    assert probe_seq == 2
    assert "no_subscribers" in page.inner_text("#gaps")  # nobody reads yet, and the state says so
    assert state_counter(page, "subscriptions_active") == "0"
    next_step(page)

    # 3. subscribe a reader: its own cursor at the start
    story_step(page, 3)
    assert page.inner_text("#readers .reader[data-reader='reader-a'] .cursor") == "0"
    assert "no_subscribers" not in page.inner_text("#gaps")
    assert state_counter(page, "subscriptions_active") == "1"
    next_step(page)

    # 4. pull: the reader holds a batch, the cursor has not moved
    story_step(page, 4)
    pulled = answer_json(page, "#story-answer")
    assert pulled["cursor"] == 0 and pulled["redelivered"] == 0 and pulled["observations"]
    assert page.inner_text("#readers .reader[data-reader='reader-a'] .cursor") == "0"
    assert page.locator("#log li.obs.held").count() == len(pulled["observations"])
    next_step(page)

    # 5. crash before ack, restart, pull again: the same observations, marked redelivered
    story_step(page, 5)
    again = answer_json(page, "#story-answer")
    assert [o["id"] for o in again["observations"]] == [o["id"] for o in pulled["observations"]]
    assert again["redelivered"] == len(again["observations"])
    assert all(o.get("redelivered") is True for o in again["observations"])
    assert page.locator("#log .tag.redelivered").count() == len(again["observations"])
    screenshot(page, "story-05-redelivered")
    next_step(page)

    # 6. process and ack: the cursor moves, the next pull is empty, lag 0
    story_step(page, 6)
    empty = answer_json(page, "#story-answer")
    assert empty["observations"] == [] and empty["lag"] == 0
    assert page.inner_text("#readers .reader[data-reader='reader-a'] .lag") == "0"
    next_step(page)

    # 7. an agent asserts src: refused, and the refusal is in the log
    story_step(page, 7)
    assert page.get_attribute("#story-answer", "data-code") == "TIER_NOT_ASSERTABLE"
    refused = answer_json(page, "#story-answer")
    rejected = [c for c in log_cards(page) if "rejected" in c["cls"]]
    assert [c["seq"] for c in rejected] == [refused["rejected_seq"]]
    assert "TIER_NOT_ASSERTABLE" in rejected[0]["text"]
    next_step(page)

    # 8. on behalf of the owner: accepted, both names kept
    story_step(page, 8)
    prov = answer_json(page, "#story-answer")["observation"]["data"]["provenance"]
    assert (prov["actor"], prov["on_behalf_of"]) == ("agent:claude", "human:you")
    next_step(page)

    # 9. two workers, one job: LEASE_HELD names the holder
    story_step(page, 9)
    assert page.get_attribute("#story-answer", "data-code") == "LEASE_HELD"
    held = answer_json(page, "#story-answer")
    assert held["holder"].startswith("sub:sub-")
    assert page.locator("#workers .worker.holder[data-worker='worker-a'] .countdown").count() == 1
    screenshot(page, "story-09-lease")
    next_step(page)

    # 10. the state says what it does not know
    story_step(page, 10)
    state = answer_json(page, "#story-answer")
    assert state["confidence"]["value"] is None
    assert "independence" in state["confidence"]["inputs"]["missing"]
    assert "independence_unknown" in page.inner_text("#gaps")
    next_step(page)

    # 11. pause: a write is refused with UNAVAILABLE, and both are in the log
    story_step(page, 11)
    assert page.get_attribute("#story-answer", "data-code") == "UNAVAILABLE"
    cards = log_cards(page)
    assert any(c["type"] == "ai.mentu.monitor.configured" and "pause" in c["text"] for c in cards)
    assert "UNAVAILABLE" in [c for c in cards if "rejected" in c["cls"]][-1]["text"]
    assert "not live (paused)" in page.inner_text("#state")
    screenshot(page, "story-11-paused")


def test_refusals_are_kept_in_the_log(browser):
    page = open_playground(browser)
    page.click("button[data-tab='playground']")
    act(page, "#btn-define-ci")
    act(page, "button[data-preset='agent-stranger']")
    assert page.get_attribute("#publish-answer", "data-code") == "PROVENANCE_CEILING"
    act(page, "button[data-preset='agent-src']")
    assert page.get_attribute("#publish-answer", "data-code") == "TIER_NOT_ASSERTABLE"
    act(page, "button[data-preset='probe']")  # positive control
    assert page.get_attribute("#publish-answer", "data-status") == "201"
    rejected = [c["text"] for c in log_cards(page) if "rejected" in c["cls"]]
    assert len(rejected) == 2
    assert "PROVENANCE_CEILING" in rejected[0] and "TIER_NOT_ASSERTABLE" in rejected[1]
    # the summary names only what the refused request carried: no "tier None" for a tier never sent
    assert "None" not in rejected[0] and "tier" not in rejected[0].split("(sent:")[1]
    assert "on_behalf_of human:mallory" in rejected[0] and "tier src" in rejected[1]
    assert page.locator("#log li.obs.rejected").first.evaluate(
        "e => getComputedStyle(e).backgroundColor"
    ) != (
        page.locator("#log li.obs:not(.rejected):not(.protocol)").first.evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
    )
    screenshot(page, "playground-refusals")


def test_lease_expiry_hands_over_and_dead_letter(browser):
    page = open_playground(browser)
    page.click("button[data-tab='playground']")
    act(page, "#btn-define-ci")
    act(page, "button[data-preset='probe']")
    page.fill("#lease-seconds", "2")
    act(page, "#workers [data-act='w-claim'][data-worker='worker-a']")
    assert page.get_attribute("#lease-answer", "data-status") == "201"
    act(page, "#workers [data-act='w-claim'][data-worker='worker-b']")
    assert page.get_attribute("#lease-answer", "data-code") == "LEASE_HELD"
    assert answer_json(page, "#lease-answer")["holder"].startswith("sub:sub-")
    # The page's 1 s sweep expires the lease; the expiry is an observation in the log.
    page.wait_for_function(
        """[...document.querySelectorAll('#log li.obs')].some(e => e.dataset.type === 'ai.mentu.monitor.lease'
              && e.innerText.includes('expired'))""",
        timeout=30_000,
    )
    act(page, "#workers [data-act='w-claim'][data-worker='worker-b']")
    assert page.get_attribute("#lease-answer", "data-status") == "201"
    assert page.locator("#workers .worker.holder[data-worker='worker-b']").count() == 1

    page.fill("#lease-subject", "build-777")
    act(page, "[data-act='lease-deadletter']")
    assert page.get_attribute("#lease-answer", "data-code") == "DEAD_LETTERED"
    assert "DEAD LETTER" in page.inner_text("#log")


def test_reload_and_browser_restart_keep_everything(browser):
    page = open_playground(browser)
    for step in (1, 2, 3):
        story_step(page, step)
        next_step(page)
    act(page, "#story-do")  # step 4: pull (held, not acked)
    before = [c["seq"] for c in log_cards(page)]
    head = page.inner_text("#log-head")
    page.reload()
    page.wait_for_selector("body.ready", timeout=60_000)
    assert [c["seq"] for c in log_cards(page)] == before
    assert page.inner_text("#log-head") == head
    assert page.inner_text("#story-count") == "Step 4 of 11"
    assert page.locator("#readers .reader[data-reader='reader-a']").count() == 1

    browser.restart()
    page = open_playground(browser)
    assert [c["seq"] for c in log_cards(page)] == before
    # the reader's cursor survived too: pulling again redelivers what it held before the restart
    act(page, "#readers [data-act='r-pull'][data-reader='reader-a']")
    assert page.locator("#log .tag.redelivered").count() == len(before)


def quickstart_blocks() -> list[str]:
    """The README's quickstart blocks, found where build.py finds them for the curl tab."""
    sys.path.insert(0, str(ROOT))
    import build

    return [b["code"] for b in build.quickstart_blocks()]


def run_in_console(page, text: str) -> dict:
    """Paste a script into the curl prompt, press Enter, wait until it has run; what it printed."""
    n = page.evaluate("document.getElementById('term-out').children.length")
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.fill("#curl-input", text)
    page.press("#curl-input", "Enter")
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=30_000)
    return page.evaluate(
        """n => { const new_ = [...document.getElementById('term-out').children].slice(n);
                  return {statuses: new_.filter(e => e.dataset.status).map(e => +e.dataset.status),
                          errors: new_.filter(e => e.dataset.error).map(e => e.innerText),
                          out: new_.filter(e => e.className === 'out').map(e => e.innerText),
                          json: new_.filter(e => e.classList.contains('json')).map(e => e.innerText),
                          notes: new_.filter(e => e.className === 'note').map(e => e.innerText)}; }""",
        n,
    )


def test_curl_console_runs_the_readme_quickstart_verbatim(browser):
    browser.guard.expect_http_refusals = True  # the 401 at the end is on purpose
    page = open_playground(browser)
    page.click("button[data-tab='curl']")
    blocks = quickstart_blocks()
    assert len(blocks) == 7
    # the clickable examples are exactly the README's blocks
    shown = page.eval_on_selector_all(
        "#curl-examples li[data-group='quickstart'] button", "els => els.map(e => e.textContent)"
    )
    assert shown == blocks

    # 1. MP, the field() definition (built in), discover
    r = run_in_console(page, blocks[0])
    assert r["statuses"] == [200] and r["errors"] == [] and "# field: built in" in r["notes"]
    # 2. define the monitor: the owner token flows through $(...) | field into $OWNER
    r = run_in_console(page, blocks[1])
    assert r["statuses"] == [201] and r["errors"] == []
    owner = r["out"][0].removeprefix("owner token: ").strip()
    assert len(owner) >= 24
    # 3. publish as the producer
    r = run_in_console(page, blocks[2])
    assert r["statuses"] == [201] and r["errors"] == []
    # 4. subscribe: "$SUB" | field '["subscription"]["id"]'
    r = run_in_console(page, blocks[3])
    assert r["statuses"] == [201] and r["errors"] == []
    sub_id = r["out"][0].removeprefix("subscription ").strip()
    assert re.fullmatch(r"sub-[0-9a-f]{16}", sub_id)
    # 5. pull: the observation comes back, printed as python3 -c "print(...)" would
    r = run_in_console(page, blocks[4])
    assert r["statuses"] == [200] and r["errors"] == []
    assert "'status': 'failed'" in r["out"][0] and "'actor': 'probe:ci'" in r["out"][0]
    # 6. ack moves the cursor to $NEXT; the next pull is empty
    r = run_in_console(page, blocks[5])
    assert r["statuses"] == [200, 200] and r["errors"] == []
    acked = json.loads(r["json"][0])
    assert acked["cursor"] == 3 and acked["lag"] == 0  # $NEXT: past the creation (1) and the publish (2)
    assert r["out"][-1].strip() == "[]"
    # 7. publish again, long poll returns it at once, the state's confidence
    r = run_in_console(page, blocks[6])
    assert r["statuses"] == [201, 200, 200] and r["errors"] == []
    assert r["out"][0].strip() == "build-413" and "'value': None" in r["out"][1]
    # the reader's cursor really moved (read through the page's own Playground view of the engine)
    state = page.evaluate(
        """async ([sub, owner]) => (await (await fetch('/mp/v0/monitors/ci/state',
                 {headers: {Authorization: 'Bearer ' + owner}})).json())""",
        [sub_id, owner],
    )
    assert state["counters"]["subscriptions_active"] == 1

    # outside the subset: said plainly, nothing sent
    r = run_in_console(page, 'curl -sS "$MP/discover" | jq .')
    assert r["statuses"] == [] and r["errors"][0].startswith("✗ not supported in this console: jq")
    # a wrong token is refused by the engine, and the console shows the status
    r = run_in_console(page, 'curl -sS "$MP/subscriptions/$SUB_ID/pull" -H "Authorization: Bearer wrong"')
    assert r["statuses"] == [401]
    # history: up recalls the last command
    page.focus("#curl-input")
    page.press("#curl-input", "ArrowUp")
    assert "Bearer wrong" in page.input_value("#curl-input")
    screenshot(page, "curl-console")


def test_second_tab_fetches_through_the_service_worker(browser):
    browser.guard.expect_http_refusals = True  # the admin 404s below are on purpose
    owner = open_playground(browser)
    act(owner, "#story-do")
    token = owner.inner_text("#owner-token")
    second = open_playground(browser)
    assert "open in another tab" in second.inner_text("#other-tab")
    reply = second.evaluate(
        """async (token) => {
             const r = await fetch('/mp/v0/monitors/ci/state', {headers: {Authorization: 'Bearer ' + token}});
             return {status: r.status, body: await r.json()};
           }""",
        token,
    )
    assert reply["status"] == 200 and reply["body"]["monitor"] == "ci"
    assert reply["body"]["head"] == int(owner.inner_text("#log-head").split("head ")[1])
    # the shim does not carry the page's Origin into the router: a cross-origin-looking POST still works
    posted = second.evaluate(
        """async (token) => {
             const r = await fetch('/mp/v0/monitors/ci/observations', {method: 'POST',
               headers: {Authorization: 'Bearer ' + token, 'Content-Type': 'application/json'},
               body: JSON.stringify({type: 'com.example.ci.run', subject: 'build-9', actor: 'probe:ci'})});
             return {status: r.status, body: await r.json()};
           }""",
        token,
    )
    assert posted["status"] == 201
    # the page's admin door is not reachable through the shim: no admin routes there, token or not
    for auth in ("", "Bearer " + token):
        admin = second.evaluate(
            """async (auth) => (await fetch('/mp/v0/admin/log?monitor=ci',
                                           {headers: auth ? {Authorization: auth} : {}})).status""",
            auth,
        )
        assert admin == 404
    # positive control: the owner's timeline (admin door) and the follower's (IndexedDB) both show the post
    seq = posted["body"]["seq"]
    for page in (owner, second):
        page.wait_for_function(f"document.querySelector('#log li.obs[data-seq=\"{seq}\"]') !== null")


def test_two_tabs_never_fork_the_log(browser):
    first = open_playground(browser)
    act(first, "#story-do")
    second = open_playground(browser)
    assert "another tab owns the engine" in second.inner_text("#status-chip")
    second.click("button[data-tab='playground']")
    act(second, "button[data-preset='probe']")  # forwarded to the owner tab through the service worker
    seq = int(answer_json(second, "#publish-answer")["seq"])
    first.wait_for_function(f"document.querySelector('#log li.obs[data-seq=\"{seq}\"]') !== null")
    screenshot(second, "two-tabs-follower")

    # Between the owner going and the other tab taking over, the shim answers a request sent in that
    # window 503 "no engine tab yet", by design (BROWSER.md): an expected refusal, not an error.
    browser.guard.expect_http_refusals = True
    first.close()  # the owner goes away: the other tab takes the lock and the log from IndexedDB
    second.wait_for_function("document.getElementById('other-tab').hidden", timeout=30_000)
    assert second.inner_text("#status-chip") == "ready · storage: IndexedDB"
    act(second, "button[data-preset='probe']")
    assert int(answer_json(second, "#publish-answer")["seq"]) == seq + 1


def test_conformance_tab_all_pass(browser):
    page = open_playground(browser)
    page.click("button[data-tab='conformance']")
    act(page, "#conf-btn")
    total = page.locator("#conf-total")
    assert total.get_attribute("data-failed") == "0", page.inner_text("#conf-table")
    assert int(total.get_attribute("data-passed")) >= 30
    assert page.locator("#conf-table td.FAIL").count() == 0
    screenshot(page, "conformance")


def test_automatic_mode_loses_nothing(browser):
    page = open_playground(browser)
    page.click("button[data-tab='playground']")
    act(page, "#btn-define-ci")
    act(page, "#auto-btn")
    page.wait_for_function(
        """(() => { const v = k => +document.querySelector(`#auto-tally [data-k='${k}'] b`).textContent;
                   return v('published') >= 12 && v('redelivered') >= 1; })()""",
        timeout=120_000,
    )
    act(page, "#auto-btn")
    tally = page.eval_on_selector_all(
        "#auto-tally [data-k]", "els => els.map(e => [e.dataset.k, +e.innerText.split('\\n')[0]])"
    )
    tally = dict(tally)
    assert tally["lost"] == 0
    assert tally["delivered"] >= tally["published"] - 5
    screenshot(page, "automatic-mode")


def test_service_worker_without_an_engine_tab_answers_503(browser):
    browser.guard.expect_http_refusals = True  # the 503 (and the JSON tab's favicon 404) are on purpose
    page = open_playground(browser)
    other = browser.new_page()
    other.goto(browser.site_url + "/build-info.json")  # in the worker's scope, but no playground in it
    page.close()
    reply = other.evaluate(
        """async () => { const r = await fetch('/mp/v0/discover');
                         return {status: r.status, body: await r.json()}; }"""
    )
    assert reply["status"] == 503
    assert reply["body"]["code"] == "UNAVAILABLE"
    assert "Open the playground" in reply["body"]["error"]
    # positive control: with a playground tab open again, the same fetch is answered by its engine
    open_playground(browser)
    again = other.evaluate("async () => (await fetch('/mp/v0/discover')).status")
    assert again == 200


def test_without_indexeddb_the_page_says_memory_and_still_works(browser):
    # Refuse the playground's database the way a browser with blocked storage does (PyScript's own cache
    # keeps working, so the page can still start).
    browser.context.add_init_script(
        """const open = indexedDB.open.bind(indexedDB);
           indexedDB.open = (name, version) => {
             if (name === 'monitor-protocol-playground')
               throw new DOMException('The user denied permission to access the database.', 'SecurityError');
             return open(name, version);
           };"""
    )
    page = open_playground(browser)
    assert page.inner_text("#status-chip") == "ready · storage: memory — not saved"
    story_step(page, 1)
    assert page.locator("#log li.obs").count() >= 1


def test_reset_clears_the_saved_log_after_confirming(browser):
    page = open_playground(browser)
    story_step(page, 1)
    assert page.locator("#log li.obs").count() >= 1
    page.once("dialog", lambda d: d.dismiss())  # cancelled: nothing is lost
    act(page, "#reset-btn")
    assert page.locator("#log li.obs").count() >= 1
    page.once("dialog", lambda d: d.accept())
    with page.expect_navigation():
        page.click("#reset-btn")
    page.wait_for_selector("body.ready", timeout=60_000)
    assert page.locator("#log li.obs").count() == 0
    assert page.inner_text("#story-count") == "Step 1 of 11"


def test_keyboard_reaches_every_control_with_a_visible_focus(browser):
    page = open_playground(browser)
    # every control is a real button (Tab reaches it, Enter and Space press it)
    tags = page.eval_on_selector_all("[data-act],[data-tab]", "els => [...new Set(els.map(e => e.tagName))]")
    assert tags == ["BUTTON"]
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "story-do":
            break
    assert page.evaluate("document.activeElement.id") == "story-do"
    focus = page.evaluate(
        "(() => { const s = getComputedStyle(document.activeElement); return [s.outlineStyle, s.outlineWidth]; })()"
    )
    assert focus[0] != "none" and focus[1] != "0px"
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.keyboard.press("Enter")
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=30_000)
    assert "201 OK" in page.inner_text("#story-answer")
    # colour is never the only signal: words or icons beside it
    assert page.inner_text("#story-lesson").startswith("✓ Done.")
    assert "⚙ configured" in log_cards(page)[0]["text"]
    assert page.inner_text("#status-chip") == "ready · storage: IndexedDB"
