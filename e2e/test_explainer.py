"""The playground as an explainer (issue 12), item by item, against the real page in Chromium.

Every test has a positive control: an assertion that fails if the feature it checks were absent. Results
are awaited on the page's action counters (MP.actionsDone / MP.actionsFailed) or on DOM conditions, never
on a sleep; the only fixed wait is the race's running time."""

from __future__ import annotations

import json
import re

from conftest import (
    axe_violations,
    format_violations,
    horizontal_overflow,
    pick_monitor,
    screenshot,
    wait_picked,
)

CI_TYPE = "com.example.ci.run"
TABS = ("story", "playground", "curl", "conformance")
LANE_A = "#lanes li.lane[data-reader='reader-a']"
CARD_A = "#readers .card.reader[data-reader='reader-a']"
BUILDS = f"#log li.obs[data-type='{CI_TYPE}']"
RACE_SEED = 32  # with this seed the notification reader is down at tick 1 and the cursor reader crashes
# between its processing and its ack at tick 2, so the race's claims hold from its first second on


# ---------------------------------------------------------------------------------------- helpers
def open_page(browser, query: str = "", page=None):
    """A new page of `browser` (a conftest Browser), or `page`, on the playground, once it is ready."""
    return browser.open("/" + query, page, timeout=60_000)


def counter(page) -> int:
    return page.evaluate("MP.actionsDone + MP.actionsFailed")


def wait_actions(page, before: int, n: int = 1) -> None:
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed >= {before + n}", timeout=60_000)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def act(page, selector: str, tap: bool = False) -> None:
    """Click (or tap) a control and wait until the page reports the action finished."""
    before = counter(page)
    if tap:
        page.tap(selector)
    else:
        page.click(selector)
    wait_actions(page, before)


def press(page, key: str) -> None:
    """Press a key on the focused control and wait until its action finished."""
    before = counter(page)
    page.keyboard.press(key)
    wait_actions(page, before)


def tab(page, name: str, tap: bool = False) -> None:
    (page.tap if tap else page.click)(f"#tabbtn-{name}")
    assert "active" in page.get_attribute(f"#tab-{name}", "class")
    assert page.get_attribute(f"#tabbtn-{name}", "aria-selected") == "true"


def step_no(page) -> int:
    return int(re.match(r"Step (\d+) of 13", page.inner_text("#story-count")).group(1))


def do_step(page, tap: bool = False) -> None:
    if page.is_visible("#story-do"):
        act(page, "#story-do", tap)


def next_step(page, tap: bool = False) -> None:
    act(page, "#story-next", tap)


def run_story(page, until: int = 13, tap: bool = False) -> None:
    """Do steps 1..until (each: Do it, then Next unless it is the last one done)."""
    while True:
        n = step_no(page)
        do_step(page, tap)
        if n >= until:
            return
        next_step(page, tap)


def answer_json(page, selector: str) -> dict:
    return json.loads(page.inner_text(f"{selector} pre.json"))


def head(page) -> int:
    return int(re.search(r"head (\d+)", page.inner_text("#log-head")).group(1))


def cards(page, selector: str = "#log li.obs") -> list[dict]:
    return page.eval_on_selector_all(
        selector,
        """els => els.map(e => ({seq: +e.dataset.seq, type: e.dataset.type, cls: [...e.classList],
                                 redelivered: !!e.querySelector('.tag.redelivered'), text: e.innerText}))""",
    )


def lane(page) -> dict:
    return page.eval_on_selector(
        LANE_A,
        """e => ({cls: [...e.classList], cursor: +e.dataset.cursor, text: e.innerText,
                  left: parseFloat(e.querySelector('.mark').style.left)})""",
    )


def panel_shown(page, name: str) -> bool:
    return page.is_visible(f"#panel-{name}")


def watch_flashes(page) -> None:
    """Record every log card that is drawn with the `flash` class (seq, when)."""
    page.evaluate(
        """() => {
            window.__flashed = [];
            new MutationObserver(ms => { for (const m of ms) for (const n of m.addedNodes)
                if (n.classList && n.classList.contains('flash')) window.__flashed.push(+n.dataset.seq); })
              .observe(document.getElementById('log'), {childList: true});
        }"""
    )


def tab_to(page, selector: str, key: str = "Tab", limit: int = 60) -> int:
    """Press Tab (or Shift+Tab) until the focused element matches `selector`; how many presses it took."""
    for n in range(1, limit + 1):
        page.keyboard.press(key)
        if page.evaluate("s => !!document.activeElement && document.activeElement.matches(s)", selector):
            return n
    raise AssertionError(f"{selector} not reached with {limit} presses of {key}")


# -------------------------------------------------------------------------------- the curl console
def examples(page) -> int:
    return page.locator("#curl-examples li[data-group='quickstart'] button").count()


def run_block(page, i: int) -> dict:
    """Put quickstart block i into the prompt (its example button), run it; its HTTP lines and offers."""
    seen = page.locator("#term-out [data-status]").count()
    offers = page.locator("#term-out .offer button").count()
    act(page, f"[data-act='curl-example'][data-i='{i}']")
    act(page, "[data-act='curl-run']")
    statuses = page.eval_on_selector_all("#term-out [data-status]", "els => els.map(e => +e.dataset.status)")
    lines = page.eval_on_selector_all("#term-out [data-status]", "els => els.map(e => e.innerText)")
    return {"statuses": statuses[seen:], "lines": lines[seen:], "offers": offers, "block": i}


def new_offer(page, r: dict):
    found = page.locator("#term-out .offer button")
    assert found.count() == r["offers"] + 1, f"no way on offered after block {r['block']}: {r['lines']}"
    return found.nth(r["offers"])


def ok(r: dict) -> bool:
    return bool(r["statuses"]) and all(200 <= s < 300 for s in r["statuses"])


# ==================================================================================== 1. show, not tell
def test_1_story_shows_not_tells(browser):
    page = open_page(browser)
    held: list[int] = []
    for n in range(1, 14):
        assert step_no(page) == n
        # Progressive disclosure: each panel appears when the story reaches it, not before.
        assert panel_shown(page, "readers") == (n >= 3), f"readers panel at step {n}"
        assert panel_shown(page, "leases") == (n >= 10), f"leases panel at step {n}"
        assert panel_shown(page, "state") == (n >= 11), f"state panel at step {n}"
        title = page.inner_text("#story-title")
        if n == 4:  # Pull: the builds are held, the cursor has not moved
            assert title == "Pull"
            before = lane(page)
            do_step(page)
            builds = cards(page, BUILDS)
            assert len(builds) == 2 and all("held" in c["cls"] for c in builds), builds
            held = [c["seq"] for c in builds]
            after = lane(page)
            assert after["cursor"] == before["cursor"] and after["left"] == before["left"]
            assert "crashed" not in after["cls"]
            assert page.locator(f"{CARD_A} .chips .chip-s").count() == 2
        elif n == 5:  # Crash, a step of its own: greyed, the batch outlined dashed (delivered, not acked)
            assert title == "Crash"
            do_step(page)
            assert "crashed" in lane(page)["cls"]
            builds = cards(page, BUILDS)
            assert [c["seq"] for c in builds if "unacked" in c["cls"] and "held" not in c["cls"]] == held
            card_cls = page.get_attribute(CARD_A, "class")
            assert "crashed" in card_cls and "crashed" in page.inner_text(CARD_A)
            style = page.eval_on_selector(f"{BUILDS}.unacked", "e => getComputedStyle(e).outlineStyle")
            assert style == "dashed"
        elif n == 6:  # Restart and pull again: the same seqs, tagged redelivered, flashing
            assert title == "Restart and pull again"
            watch_flashes(page)
            do_step(page)
            assert "crashed" not in lane(page)["cls"]
            builds = cards(page, BUILDS)
            again = [c["seq"] for c in builds if "held" in c["cls"]]
            assert again == held and all(c["redelivered"] for c in builds if c["seq"] in held), builds
            # Only builds came back: the Story's reader is filtered to CI runs, no protocol rows.
            assert page.locator("#log li.obs.held").count() == len(held)
            pulled = answer_json(page, "#story-answer")
            assert [int(o["id"]) for o in pulled["observations"]] == held
            assert {o["type"] for o in pulled["observations"]} == {CI_TYPE}
            assert all(o.get("redelivered") is True for o in pulled["observations"])
            assert sorted(set(page.evaluate("window.__flashed"))) == held  # the cards were drawn flashing
            screenshot(page, "story-desktop")
        elif n == 7:  # Process and acknowledge: the marker moves, lag 0
            before = lane(page)
            do_step(page)
            after = lane(page)
            assert after["cursor"] > before["cursor"] and after["left"] > before["left"], (before, after)
            assert page.inner_text(f"{CARD_A} .lag") == "0" and "lag 0" in after["text"]
            assert page.locator("#log li.obs.held, #log li.obs.unacked").count() == 0
        else:
            do_step(page)
        if n == 1:
            assert page.inner_text("#log-head").startswith("builds ·")  # the Story's own monitor
        if n < 13:
            next_step(page)

    # Motion only where it explains, and none when the person asked for less.
    duration = "e => getComputedStyle(e).transitionDuration"
    assert float(page.eval_on_selector(f"{LANE_A} .mark", duration).rstrip("s")) > 0
    page.emulate_media(reduced_motion="reduce")
    assert page.eval_on_selector(f"{LANE_A} .mark", duration) == "0s"
    page.emulate_media(reduced_motion="no-preference")
    assert float(page.eval_on_selector(f"{LANE_A} .mark", duration).rstrip("s")) > 0


def test_1_redelivered_cards_are_still_flashing_when_the_step_is_done(browser):
    page = open_page(browser)
    run_story(page, until=5)
    next_step(page)
    assert page.inner_text("#story-title") == "Restart and pull again"
    do_step(page)
    flashing = [c["seq"] for c in cards(page, BUILDS) if "flash" in c["cls"]]
    assert flashing == [c["seq"] for c in cards(page, BUILDS) if c["redelivered"]] and flashing


# ==================================================================================== 2. the race
def test_2_race_notifications_lose_a_cursor_does_not(browser):
    page = open_page(browser, f"?seed={RACE_SEED}")
    tab(page, "playground")
    act(page, "#race-btn")
    page.wait_for_function("document.getElementById('race-btn').textContent === 'Stop'")
    page.wait_for_timeout(8_000)  # the race's running time (the only fixed wait)
    page.evaluate(
        """() => { window.__drained = false; const b = document.getElementById('race-btn');
                   new MutationObserver(() => { if (b.disabled) window.__drained = true; })
                     .observe(b, {attributes: true, attributeFilter: ['disabled']}); }"""
    )
    page.click("#race-btn")
    page.wait_for_function(
        """() => { const b = document.getElementById('race-btn');
                   return window.__drained && !b.disabled && b.textContent === 'Start again'; }""",
        timeout=60_000,
    )

    def k(side: str, key: str) -> int:
        return int(page.inner_text(f"#race-{side} [data-k='{key}'] b"))

    published = int(page.inner_text("#race [data-k='published']"))
    assert published >= 5, published
    assert k("notify", "lost") > 0
    assert k("cursor", "lost") == 0
    assert k("cursor", "processed") == published
    assert k("cursor", "still owed") == 0
    assert k("cursor", "processed twice") >= 1
    assert k("notify", "processed") == published - k("notify", "lost")


def test_2_stop_offers_start_again_only_once_the_race_is_drained(browser):
    page = open_page(browser, f"?seed={RACE_SEED}")
    tab(page, "playground")
    act(page, "#race-btn")
    page.wait_for_function("+document.querySelector(\"#race [data-k='published']\").textContent >= 3")
    page.evaluate(
        """() => { const b = document.getElementById('race-btn'); window.__afterStop = null;
                   new MutationObserver(() => { if (!window.__afterStop && b.textContent !== 'Stop')
                       window.__afterStop = {text: b.textContent, disabled: b.disabled}; })
                     .observe(b, {childList: true, characterData: true, subtree: true}); }"""
    )
    page.click("#race-btn")
    page.wait_for_function("window.__afterStop !== null", timeout=30_000)
    first = page.evaluate("window.__afterStop")  # the button as it is drawn right after Stop
    assert first["disabled"] or first["text"] != "Start again", first


# ==================================================================================== 3. one engine, one view
def test_3a_quickstart_after_the_story_then_the_playground_shows_ci(browser):
    page = open_page(browser)
    run_story(page)
    tab(page, "curl")
    n = examples(page)
    assert n == 7
    for i in range(n):
        r = run_block(page, i)
        assert ok(r), r
    every = page.eval_on_selector_all("#term-out [data-status]", "els => els.map(e => +e.dataset.status)")
    assert len(every) >= 10 and 409 not in every, every
    assert "HTTP 409" not in page.inner_text("#term-out") and page.locator("#term-out .offer").count() == 0

    tab(page, "playground")
    options = page.eval_on_selector_all("#monitor-pick option", "els => els.map(e => e.value)")
    assert {"builds", "ci"} <= set(options), options
    # A redraw may put the old choice back into the picker before the pick runs (the timer redraws every
    # second): the pick goes by the choice the change event carried, so "ci" is shown.
    assert not page.inner_text("#log-head").startswith("ci ·"), "control: the story left builds on screen"
    page.eval_on_selector(
        "#monitor-pick",
        "s => { MP.picked = null; s.value = 'ci'; s.dispatchEvent(new Event('change')); s.value = 'builds'; }",
    )
    wait_picked(page, "ci")
    assert page.inner_text("#log-head").startswith("ci ·")
    subjects = page.eval_on_selector_all(BUILDS + " .subject", "els => els.map(e => e.textContent)")
    assert "build-412" in subjects and "build-413" in subjects
    triage = "#readers .card.reader[data-reader='agent:triage']"
    assert "foreign" not in page.get_attribute(triage, "class")
    assert page.is_enabled(f"{triage} button[data-act='r-pull']")
    assert page.is_enabled(f"{triage} button[data-act='r-crash']")
    assert page.is_enabled("#btn-publish")  # the owner token came from the curl answer


def test_3b_quickstart_twice_offers_the_way_on(browser):
    browser.guard.expect_http_refusals = True  # the second run's DUPLICATE and 401 are on purpose
    page = open_page(browser)
    tab(page, "curl")
    for i in range(examples(page)):
        r = run_block(page, i)
        assert ok(r), r
    assert page.locator("#term-out .offer").count() == 0  # no collision, no offer

    page.reload()  # a new console (its variables are gone); the page's keyring is kept
    page.wait_for_selector("body.ready", timeout=60_000)
    tab(page, "curl")
    assert ok(run_block(page, 0))
    r = run_block(page, 1)
    assert r["statuses"] == [409] and "DUPLICATE" in r["lines"][0]
    offer = new_offer(page, r)
    assert offer.get_attribute("data-act") == "curl-adopt-owner"
    act_on(page, offer)
    assert run_block(page, 2)["statuses"] == [201]
    r = run_block(page, 3)
    assert r["statuses"] == [401]
    offer = new_offer(page, r)
    assert offer.get_attribute("data-act") == "curl-adopt-reader"
    act_on(page, offer)
    for i in range(4, 7):
        r = run_block(page, i)
        assert ok(r), r


def act_on(page, locator) -> None:
    before = counter(page)
    locator.click()
    wait_actions(page, before)


def test_3c_a_second_tab_follows_the_first(browser):
    page = open_page(browser)
    other = open_page(browser)
    assert other.is_visible("#other-tab")  # the second tab is a follower
    assert "another tab" in other.inner_text("#status-chip")
    assert other.eval_on_selector_all("#monitor-pick option[value='ci']", "els => els.length") == 0

    tab(page, "playground")
    act(page, "#btn-define-ci")
    other.wait_for_function(
        "() => !!document.querySelector(\"#monitor-pick option[value='ci']\") && "
        "document.getElementById('log-head').textContent.startsWith('ci')",
        timeout=30_000,
    )
    start = head(other)
    act(page, "#btn-publish")
    other.wait_for_function(
        f"() => /head {start + 1}$/.test(document.getElementById('log-head').textContent)", timeout=30_000
    )
    assert other.locator(BUILDS).count() == 1


def test_3d_a_curl_ack_moves_the_cursor_in_the_playground(browser):
    page = open_page(browser)
    tab(page, "curl")
    for i in range(5):  # discover, define ci, publish, subscribe agent:triage, pull
        r = run_block(page, i)
        assert ok(r), r
    tab(page, "playground")
    pick_monitor(page, "ci")
    cursor = "#readers .card.reader[data-reader='agent:triage'] b.cursor"
    start = int(page.inner_text(cursor))

    tab(page, "curl")
    r = run_block(page, 5)  # ack $NEXT, then pull again
    assert ok(r), r
    tab(page, "playground")
    page.wait_for_function(
        f'() => {{ const c = document.querySelector("{cursor}"); return c && +c.textContent > {start}; }}',
        timeout=30_000,
    )
    assert int(page.inner_text(cursor)) > start


# ==================================================================================== 4. feedback in place
def test_4_feedback_where_the_action_is(browser):
    page = open_page(browser)
    tab(page, "playground")
    assert not page.is_enabled("#btn-add-reader")
    assert page.is_visible("#btn-add-reader-why") and "monitor" in page.inner_text("#btn-add-reader-why")
    act(page, "#btn-define-ci")
    assert page.is_enabled("#btn-add-reader") and not page.is_visible("#btn-add-reader-why")

    act(page, "#btn-add-reader")
    assert "reader-a subscribed" in page.inner_text("#readers-answer")
    ack = f"{CARD_A} button[data-act='r-ack']"
    assert not page.is_enabled(ack)
    assert "nothing held" in page.inner_text(f"{CARD_A} .why-not")
    assert page.is_visible(f"{CARD_A} .why-not")

    # A double click publishes once.
    start, before = head(page), counter(page)
    page.dblclick("#btn-publish")
    wait_actions(page, before)
    assert head(page) == start + 1 and counter(page) == before + 1
    assert "POST observations → 201" in page.inner_text("#publish-answer")

    # A preset fills the form and says so, without publishing; Publish then sends it.
    before = counter(page)
    page.click("button[data-preset='agent-owner']")
    wait_actions(page, before)
    assert "Preset filled in" in page.inner_text("#publish-answer")
    assert page.input_value("#publish-form input[name='actor']") == "agent:claude"
    assert page.input_value("#publish-form input[name='on_behalf_of']") == "human:you"
    assert head(page) == start + 1
    act(page, "#btn-publish")
    assert head(page) == start + 2  # also: the double click did not publish late
    assert "POST observations → 201" in page.inner_text("#publish-answer")
    last = cards(page)[-1]
    assert "agent:claude" in last["text"] and "human:you" in last["text"]
    published = page.inner_text("#publish-answer")

    # Each panel answers in its own line.
    act(page, f"{CARD_A} button[data-act='r-pull']")
    assert page.is_enabled(ack)  # holding something now
    assert "reader-a pulls → 200" in page.inner_text("#readers-answer")
    assert page.inner_text("#publish-answer") == published
    act(page, "[data-act='w-claim'][data-worker='worker-a']")
    lease = page.inner_text("#lease-answer")
    assert "worker-a claim build-412 → 201" in lease, lease
    assert page.inner_text("#publish-answer") == published
    assert "reader-a pulls" in page.inner_text("#readers-answer")
    act(page, ack)
    assert "reader-a acks → 200" in page.inner_text("#readers-answer")
    assert page.inner_text("#lease-answer") == lease
    assert page.inner_text("#publish-answer") == published


# ==================================================================================== 5. words for newcomers
def tooltip_of(page, gloss):
    return gloss.locator("xpath=following-sibling::*[contains(@class,'tip-text')]")


def check_hover(page, gloss) -> str:
    tip = tooltip_of(page, gloss)
    page.mouse.move(0, 0)
    assert not tip.is_visible()
    gloss.hover()
    tip.wait_for(state="visible", timeout=5_000)
    text = tip.inner_text().strip()
    assert text, "empty tooltip"
    page.mouse.move(0, 0)
    return text


def test_5_words_for_newcomers(browser):
    page = open_page(browser)
    intro = page.locator("#story-intro")
    assert intro.is_visible()
    words = intro.inner_text().lower()
    assert all(w in words for w in ("monitor", "observation", "cursor")), words

    # Every tier badge of the legend explains itself on hover.
    tips = {}
    for tier in ("src", "measured", "derived", "unverified", "falsified"):
        gloss = page.locator(f"#legend-terms .gloss.badge.t-{tier}")
        assert gloss.count() == 1, tier
        tips[tier] = check_hover(page, gloss)
    assert len(set(tips.values())) == 5, tips
    # ... and on keyboard focus.
    tab_to(page, "#legend-terms .gloss")
    focused = page.locator("#legend-terms .gloss:focus")
    assert tooltip_of(page, focused).is_visible() and tooltip_of(page, focused).inner_text().strip()

    # The state panel's terms too (the Playground shows it with a monitor).
    tab(page, "playground")
    act(page, "#btn-define-ci")
    check_hover(page, page.locator("#state .gloss").first)
    page.focus("#lease-seconds")  # the last field before the state panel; from there, the keyboard
    tab_to(page, "#state .gloss", limit=10)
    focused = page.locator("#state .gloss:focus")
    assert tooltip_of(page, focused).is_visible() and tooltip_of(page, focused).inner_text().strip()

    # The last step: the way on, with buttons that switch tabs.
    tab(page, "story")
    while step_no(page) < 12:
        next_step(page)
    assert not page.is_visible("#story-links")
    next_step(page)
    assert page.inner_text("#story-title") == "What next" and page.is_visible("#story-links")
    page.click("#story-links button[data-tab='playground']")
    assert "active" in page.get_attribute("#tab-playground", "class")
    assert page.get_attribute("#tabbtn-playground", "aria-selected") == "true"
    tab(page, "story")
    page.click("#story-links button[data-tab='curl']")
    assert "active" in page.get_attribute("#tab-curl", "class")
    assert page.get_attribute("#tabbtn-curl", "aria-selected") == "true"


def test_5_a_focused_state_term_keeps_its_tooltip_across_redraws(browser):
    page = open_page(browser)
    tab(page, "playground")
    act(page, "#btn-define-ci")
    token = page.inner_text("#token-box code.owner-token")
    page.focus("#lease-seconds")
    tab_to(page, "#state .gloss", limit=10)
    label = page.evaluate("document.activeElement.getAttribute('aria-describedby')")
    assert tooltip_of(page, page.locator("#state .gloss:focus")).is_visible()
    page.evaluate(
        """() => { window.__redrawn = 0; new MutationObserver(() => window.__redrawn++)
                     .observe(document.getElementById('state'), {childList: true}); }"""
    )
    status = page.evaluate(  # another door (a script, the curl tab) changes the engine; focus stays put
        """async token => (await fetch('./mp/v0/monitors/ci/observations', {method: 'POST',
              headers: {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'},
              body: JSON.stringify({type: 'com.example.ci.run', subject: 'build-500', actor: 'probe:ci',
                                    data: {status: 'passed'}})})).status""",
        token,
    )
    assert status == 201
    page.wait_for_function("window.__redrawn > 0", timeout=20_000)  # the state panel was redrawn
    assert page.evaluate("!!document.activeElement && document.activeElement.matches('#state .gloss')")
    assert page.evaluate("document.activeElement.getAttribute('aria-describedby')") == label
    assert tooltip_of(page, page.locator("#state .gloss:focus")).is_visible()


# ==================================================================================== 6. phone
def test_6_phone_story_by_taps_and_no_sideways_scroll(phone_browser):
    page = open_page(phone_browser)
    while True:
        n = step_no(page)
        do_step(page, tap=True)
        if n == 6:
            assert page.locator("#log .tag.redelivered").count() == 2
            screenshot(page, "story-phone")
        if n == 13:
            break
        next_step(page, tap=True)
    assert page.is_visible("#story-links")

    for size in ({"width": 390, "height": 844}, {"width": 360, "height": 740}):
        page.set_viewport_size(size)
        for name in TABS:
            tab(page, name, tap=True)
            info = horizontal_overflow(page)
            assert not info["overflows"], f"{name} tab at {size}: {info}"


# ==================================================================================== 7. accessibility
def test_7_axe_on_every_tab_at_desktop_and_phone(browser, phone_browser):
    other: list[str] = []
    for page, where in ((open_page(browser), "desktop"), (open_page(phone_browser), "phone")):
        run_story(page, until=6)  # cards, a reader with a redelivered batch, answers on screen
        tab(page, "conformance")
        act(page, "#conf-btn")
        assert page.locator("#conf-table tbody tr").count() > 0
        assert page.locator("#log li.obs").count() > 0 and page.locator("#readers .card").count() > 0
        for name in TABS:
            tab(page, name)
            found = axe_violations(page)
            assert page.evaluate("typeof axe.run") == "function"  # axe did run on this page
            if found:
                other.append(f"--- {where}, {name} tab:\n{format_violations(found)}")
        page.close()
    assert other == [], "\n".join(other)


def test_7_the_whole_story_by_keyboard_only(browser):
    page = open_page(browser)
    presses = []
    for n in range(1, 14):
        assert step_no(page) == n
        if n < 13:
            presses.append(tab_to(page, "#story-do", "Shift+Tab" if n > 1 else "Tab"))
            press(page, "Enter")
            assert "✓ Done." in page.inner_text("#story-lesson"), n
            presses.append(tab_to(page, "#story-next"))
            press(page, "Enter")
    assert page.inner_text("#story-title") == "What next" and page.is_visible("#story-links")
    assert page.evaluate("MP.actionsFailed") == 0
    assert max(presses) <= 10, presses
