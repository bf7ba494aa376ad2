"""The embeddable scenes (embed.html?scene=<name>) in Chromium: two embeds in one host page at once, each
in its own engine namespace (its own IndexedDB database, never the playground's), restored after a reload;
every scene (redelivery, race with a seed, lease, refused src), the list for an unknown scene, 320 px wide
without sideways scrolling, keyboard use and axe. Waits on the frames' own counters (MP.actionsDone), never
on sleeps."""

from __future__ import annotations

import http.server
import json
import re
import threading

from conftest import axe_violations, format_violations, heading_order, horizontal_overflow, screenshot

BOOT_MS = 120_000  # two Pyodide starts at once on two shared cores
ACT_MS = 60_000
DB = "monitor-protocol-playground"
BUILD = "com.example.ci.run"
NARROW = {"width": 320, "height": 640}

# The monitor ids an engine's IndexedDB database holds (None when there is no such database): read from the
# records store, keyed by JSON [table, key]. Never opens a database that does not exist (that would make an
# empty one, without its stores).
MONITORS_IN = """async name => {
    const names = (await indexedDB.databases()).map(d => d.name);
    if (!names.includes(name)) return null;
    const db = await new Promise((ok, no) => { const r = indexedDB.open(name); r.onsuccess = () => ok(r.result);
                                                r.onerror = () => no(r.error); });
    const keys = await new Promise(ok => { const r = db.transaction('records').objectStore('records').getAllKeys();
                                           r.onsuccess = () => ok(r.result); });
    db.close();
    return keys.map(k => JSON.parse(k)).filter(k => k[0] === 'monitors').map(k => k[1]).sort();
}"""


# ---------------------------------------------------------------------------------------- helpers
def ready(frame) -> None:
    frame.wait_for_selector("body.ready", timeout=BOOT_MS)
    assert frame.evaluate("MP.errors.length") == 0, frame.evaluate("MP.errors")


def done_count(frame) -> int:
    return frame.evaluate("MP.actionsDone + MP.actionsFailed")


def click(frame, selector: str) -> int:
    """Click without waiting; returns the count to wait past (so two frames can act at once)."""
    before = done_count(frame)
    frame.click(selector)
    return before


def settled(frame, before: int) -> None:
    frame.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    assert frame.evaluate("MP.actionsFailed") == 0, frame.inner_text("#page-error")


def act(frame, selector: str) -> None:
    settled(frame, click(frame, selector))


def move(key: str) -> str:
    return f"#scene-moves button[data-act='scene-move'][data-move='{key}']"


def worker(name: str, act_name: str | None = None) -> str:
    card = f"#workers .card.worker[data-worker='{name}']"
    return f"{card} button[data-act='w-{act_name}']" if act_name else card


def cards(frame, kind: str | None = BUILD) -> list[dict]:
    found = frame.eval_on_selector_all(
        "#log li.obs",
        "els => els.map(e => ({seq: +e.dataset.seq, type: e.dataset.type, cls: e.className, text: e.innerText}))",
    )
    return [c for c in found if kind is None or c["type"] == kind]


def lane(frame, reader: str) -> dict:
    return frame.eval_on_selector(
        f"#lanes li.lane[data-reader='{reader}']",
        "e => ({cursor: +e.dataset.cursor, cls: e.className, label: e.querySelector('.label').textContent})",
    )


def answer(frame, box: str) -> dict:
    return {
        "status": frame.get_attribute(f"#{box}", "data-status"),
        "code": frame.get_attribute(f"#{box}", "data-code"),
        "json": json.loads(frame.text_content(f"#{box} pre.json") or "null"),
        "text": frame.inner_text(f"#{box}"),
    }


def primary(frame) -> str:
    """The move the scene suggests next (its primary button)."""
    return frame.get_attribute("#scene-moves button.primary", "data-move")


def frame_of(page, scene: str):
    """The frame of the host page's iframe for that scene (data-scene, as embedding.html marks them)."""
    return page.wait_for_selector(f"iframe[data-scene='{scene}']", timeout=ACT_MS).content_frame()


def no_axe(frame_or_page, where: str) -> None:
    found = axe_violations(frame_or_page)
    assert found == [], f"{where}:\n{format_violations(found)}"


def fits(page, where: str) -> None:
    info = horizontal_overflow(page)
    assert not info["overflows"], f"{where} scrolls sideways: {info}"


# ---------------------------------------------------------------------------------------- two embeds at once
def test_two_embeds_in_one_page_never_mix_and_survive_a_reload(browser):
    page = browser.new_page()
    page.goto(browser.site_url + "/embedding.html?scenes=redelivery,lease")
    assert page.locator("iframe").count() == 2  # ?scenes= kept only those two
    red, lease = frame_of(page, "redelivery"), frame_of(page, "lease")
    ready(red)
    ready(lease)
    assert red.evaluate("MP.ns") == "embed-redelivery-redelivery"
    assert lease.evaluate("MP.ns") == "embed-lease-lease"
    assert red.inner_text("#scene-title") == "Redelivery after a crash"
    assert lane(red, "reader-a")["cursor"] == 0 and primary(red) == "publish"
    assert red.is_disabled(move("pull"))  # nothing to pull yet, and it says so
    assert "nothing to pull: publish first" in red.inner_text("#scene-moves")
    lease.fill("#lease-seconds", "30")

    # interleaved: each frame's action starts before the other's has finished
    r, w = click(red, move("publish")), click(lease, worker("worker-a", "claim"))
    settled(red, r)
    settled(lease, w)
    builds = cards(red)
    assert [c["text"].split("\n")[0] for c in builds] == ["#3", "#4", "#5"]
    assert lease.is_visible(worker("worker-a") + ".holder")
    assert re.fullmatch(r"\d+s", lease.inner_text(worker("worker-a") + " .countdown"))
    assert primary(red) == "pull"

    r, w = click(red, move("pull")), click(lease, worker("worker-b", "claim"))
    settled(red, r)
    settled(lease, w)
    assert all("held" in c["cls"] for c in cards(red))
    assert lane(red, "reader-a")["cursor"] == 0  # reading is not consuming
    assert answer(lease, "lease-answer")["code"] == "LEASE_HELD"  # the loser is told who holds it
    assert "held by" in answer(lease, "lease-answer")["text"]
    assert primary(red) == "crash"

    act(red, move("crash"))
    assert "crashed" in lane(red, "reader-a")["cls"]
    assert all("unacked" in c["cls"] for c in cards(red))
    assert primary(red) == "restart-pull"

    # each database holds its own monitor only, and the playground's database does not exist yet
    assert page.evaluate(MONITORS_IN, f"{DB}--embed-redelivery-redelivery") == ["redelivery"]
    assert page.evaluate(MONITORS_IN, f"{DB}--embed-lease-lease") == ["lease"]
    assert page.evaluate(MONITORS_IN, DB) is None
    assert red.inner_text("#log-head").startswith("redelivery ·")
    assert lease.inner_text("#log-head").startswith("lease ·")
    assert not [c for c in cards(lease, None) if "build-50" in c["text"]]  # no redelivery card in lease

    # reload the host: both frames come back as they were, from their own storage
    page.reload()
    red, lease = frame_of(page, "redelivery"), frame_of(page, "lease")
    ready(red)
    ready(lease)
    assert [c["seq"] for c in cards(red)] == [3, 4, 5]
    assert "crashed" in lane(red, "reader-a")["cls"] and primary(red) == "restart-pull"
    assert lease.is_visible(worker("worker-a") + ".holder")  # the 30 s lease is still worker-a's

    # release hands it over; then a short lease expires by itself
    r, w = click(red, move("restart-pull")), click(lease, worker("worker-a", "release"))
    settled(red, r)
    settled(lease, w)
    got = answer(red, "scene-answer")
    assert [int(o["id"]) for o in got["json"]["observations"]] == [3, 4, 5]
    assert all(o["redelivered"] for o in got["json"]["observations"])  # the same builds, marked so
    assert all("redelivered" in c["text"] for c in cards(red))
    assert lease.locator("#workers .card.worker.holder").count() == 0
    lease.fill("#lease-seconds", "2")
    act(lease, worker("worker-b", "claim"))
    assert lease.is_visible(worker("worker-b") + ".holder")
    lease.wait_for_selector("#workers .card.worker.holder", state="detached", timeout=ACT_MS)  # expired

    act(red, move("ack"))
    after = lane(red, "reader-a")["cursor"]
    assert after == answer(red, "scene-answer")["json"]["cursor"] and after > 5  # past the builds
    assert not any("held" in c["cls"] or "unacked" in c["cls"] for c in cards(red))
    assert red.is_disabled(move("pull")) and primary(red) == "publish"
    kinds = [c["text"] for c in cards(lease, "ai.mentu.monitor.lease")]
    assert any("expire" in k for k in kinds) and any("release" in k for k in kinds), kinds
    no_axe(red, "the redelivery embed")
    no_axe(lease, "the lease embed")
    screenshot(page, "embeds-two")

    # the playground opened afterwards sees neither monitor (and the embeds' databases are unchanged)
    play = browser.open("/", timeout=BOOT_MS)
    assert play.evaluate("MP.ns") == ""
    assert play.inner_text("#monitor-pick") == "no monitor yet"
    assert play.evaluate(MONITORS_IN, DB) == []
    assert play.evaluate(MONITORS_IN, f"{DB}--embed-redelivery-redelivery") == ["redelivery"]


def test_the_same_scene_twice_needs_an_id(browser):
    """Another id is another engine; without an id the second frame follows the first one's engine."""
    page = browser.new_page()
    page.goto(browser.site_url + "/embedding.html?scenes=none")  # the host page, no frame of its own
    page.evaluate(
        """url => { for (const [key, q] of [['left', '&id=left'], ['one', ''], ['two', '']]) {
                      const f = document.createElement('iframe');
                      f.src = `${url}/embed.html?scene=redelivery${q}`; f.title = key; f.dataset.scene = key;
                      f.width = 420; f.height = 420; document.body.append(f); } }""",
        browser.site_url,
    )
    left, one, two = frame_of(page, "left"), frame_of(page, "one"), frame_of(page, "two")
    for f in (left, one, two):
        ready(f)
    assert left.evaluate("MP.ns") == "embed-redelivery-left"
    assert one.evaluate("MP.ns") == two.evaluate("MP.ns") == "embed-redelivery-redelivery"
    chips = {k: f.inner_text("#status-chip .label") for k, f in (("one", one), ("two", two))}
    followers = [k for k, c in chips.items() if c == "ready · shared with another frame"]
    assert len(followers) == 1, chips  # one engine per namespace: the other frame follows it
    owner, follower = (one, two) if followers == ["two"] else (two, one)
    assert owner.inner_text("#status-chip .label") == "ready · saved in this browser"
    assert left.inner_text("#status-chip .label") == "ready · saved in this browser"  # its own engine
    follower.wait_for_selector(move("publish") + ".primary", timeout=ACT_MS)
    act(follower, move("publish"))  # through the service worker, to the owner frame's engine
    assert [c["seq"] for c in cards(follower)] == [3, 4, 5]
    owner.wait_for_function(
        f"document.querySelectorAll('#log li.obs[data-type=\"{BUILD}\"]').length === 3", timeout=ACT_MS
    )
    left.wait_for_function(
        "document.querySelector('#log-head').textContent.includes('head 2')", timeout=ACT_MS
    )
    assert cards(left) == []  # another id: it never saw the builds
    assert page.evaluate(MONITORS_IN, f"{DB}--embed-redelivery-left") == ["redelivery"]


# ---------------------------------------------------------------------------------------- each scene
def test_redelivery_at_320px_wide(browser):
    page = browser.new_page(viewport=NARROW)
    page.goto(browser.site_url + "/embed.html?scene=redelivery")
    ready(page)
    fits(page, "the redelivery embed at 320 px")
    act(page, move("publish"))
    act(page, move("pull"))
    act(page, move("crash"))
    act(page, move("restart-pull"))
    fits(page, "the redelivery embed with cards at 320 px")
    no_axe(page, "the redelivery embed at 320 px")
    screenshot(page, "embed-redelivery-320")


def test_race_with_a_seed(browser):
    page = browser.new_page(viewport=NARROW)
    page.goto(browser.site_url + "/embed.html?scene=race&seed=3")
    ready(page)
    assert page.evaluate("MP.ns") == "embed-race-race"
    assert page.inner_text("#race-btn") == "Start the race"
    act(page, "#race-btn")
    page.wait_for_function(
        """(() => { const v = (s, k) => +document.querySelector(`#race-${s} [data-k="${k}"] b`).textContent;
                   return +document.querySelector('#race [data-k=published]').textContent >= 12
                          && v('notify', 'lost') >= 1; })()""",
        timeout=ACT_MS * 2,
    )
    act(page, "#race-btn")  # Stop: then the cursor reader catches up
    page.wait_for_function(
        "document.querySelector('#race-btn').textContent === 'Start again' && !document.querySelector('#race-btn').disabled",
        timeout=ACT_MS,
    )
    value = lambda side, k: int(page.text_content(f'#race-{side} [data-k="{k}"] b'))  # noqa: E731
    published = int(page.text_content("#race [data-k=published]"))
    assert value("cursor", "lost") == 0 and value("cursor", "processed") == published
    assert value("notify", "lost") > 0  # seed 3: down for some notifications in the first dozen
    page.wait_for_function(
        f"document.querySelectorAll('#log li.obs[data-type=\"{BUILD}\"]').length === {published}",
        timeout=ACT_MS,
    )
    assert page.inner_text("#log-head").startswith("race ·")
    fits(page, "the race embed at 320 px")
    no_axe(page, "the race embed")
    assert heading_order(page) == [], format_violations(heading_order(page))


def test_refused_src_by_keyboard(browser):
    page = browser.new_page(viewport=NARROW)
    page.goto(browser.site_url + "/embed.html?scene=refused-src")
    ready(page)
    assert primary(page) == "agent-src"
    for _ in range(12):  # Tab from the top reaches the scene's first move
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.dataset.move") == "agent-src":
            break
    assert page.evaluate("document.activeElement.dataset.move") == "agent-src"
    before = done_count(page)
    page.keyboard.press("Enter")
    settled(page, before)
    got = answer(page, "scene-answer")
    assert got["status"] == "400" and got["code"] == "TIER_NOT_ASSERTABLE"
    refused = cards(page, "ai.mentu.monitor.rejected")
    assert len(refused) == 1 and "TIER_NOT_ASSERTABLE" in refused[0]["text"]
    assert f"seq {refused[0]['seq']}" in got["text"]  # the answer points at the kept refusal
    assert cards(page) == []  # nothing was accepted
    assert primary(page) == "agent-owner"
    act(page, move("agent-owner"))
    got = answer(page, "scene-answer")
    assert got["status"] == "201"
    accepted = cards(page)
    assert len(accepted) == 1 and "for human:you" in accepted[0]["text"] and "src" in accepted[0]["text"]
    fits(page, "the refused-src embed at 320 px")
    no_axe(page, "the refused-src embed")
    screenshot(page, "embed-refused-src-320")
    # Reset: this scene's database is emptied and the frame starts over with a fresh monitor
    page.once("dialog", lambda d: d.accept())
    with page.expect_navigation(timeout=ACT_MS):
        page.click("#reset-btn")
    ready(page)
    assert cards(page) == [] and cards(page, "ai.mentu.monitor.rejected") == []
    assert primary(page) == "agent-src"
    assert page.inner_text("#log-head") == "refused-src · head 1"


def test_lease_at_320px_wide(browser):
    page = browser.new_page(viewport=NARROW)
    page.goto(browser.site_url + "/embed.html?scene=lease")
    ready(page)
    act(page, worker("worker-a", "claim"))
    act(page, worker("worker-b", "claim"))
    assert answer(page, "lease-answer")["code"] == "LEASE_HELD"
    fits(page, "the lease embed at 320 px")
    no_axe(page, "the lease embed at 320 px")


def test_an_unknown_scene_lists_the_scenes(browser):
    page = browser.new_page(viewport=NARROW)
    for query, said in (
        ("?scene=nope", "There is no scene “nope”."),
        ("", "No scene was named"),
        ("?scene=lease&id=Bad_Id", "The id “Bad_Id” is not usable"),
        ("?scene=lease&id=a%0A", "is not usable: send 1 to 40"),  # a trailing newline: the id's sentence
    ):
        page.goto(browser.site_url + "/embed.html" + query)
        ready(page)
        assert said in page.inner_text("#scene-text")
        links = page.eval_on_selector_all("#scene-list a", "els => els.map(e => e.getAttribute('href'))")
        assert links == [
            "?scene=redelivery",
            "?scene=race",
            "?scene=lease",
            "?scene=stale-source",
            "?scene=refused-src",
        ]
        assert page.is_hidden("#log-panel")
        # no engine was started: no database of any namespace
        assert not [n for n in page.evaluate("async () => (await indexedDB.databases()).map(d => d.name)")
                    if n.startswith(DB)]  # fmt: skip
    fits(page, "the scene list at 320 px")
    no_axe(page, "the scene list")
    page.click("#scene-list a[href='?scene=refused-src']")  # a link opens its scene
    ready(page)
    assert page.inner_text("#scene-title") == "A refused claim of certainty"


def test_an_embed_that_cannot_start_says_why_and_what_to_do(browser):
    """A start never spins forever. A frame on another site than its page (this Chromium gives such a frame
    no storage at all) says so and links the scene in a tab of its own; a runtime that cannot be fetched
    (offline, blocked) says that it failed and to reload."""
    frame_src = browser.site_url + "/embed.html?scene=redelivery"
    pages = {
        "/tutorial.html": f'<!doctype html><title>tutorial</title><iframe src="{frame_src}" width="640" height="480">'
        "</iframe>",
        # the playground itself (not a scene) framed by a page of the same site: it refuses to start
        "/framed.html": f'<!doctype html><title>framed</title><iframe src="{browser.site_url}/" width="900" '
        'height="600"></iframe>',
    }

    class Tutorial(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if self.path not in pages:
                self.send_error(404)
                return
            body = pages[self.path].encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tutorial)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page = browser.new_page()
    try:  # "localhost" is another site than the playground's 127.0.0.1
        page.goto(f"http://localhost:{server.server_address[1]}/tutorial.html")
        frame = page.frame_locator("iframe")
        frame.locator("#boot.failed").wait_for(timeout=BOOT_MS)
        said = frame.locator("#boot .detail").inner_text()
        assert "no storage" in said and "same site" in said, said
        assert frame.locator("#boot .detail a").get_attribute("href") == frame_src
        assert frame.locator("#boot").get_attribute("role") == "alert"
        framed = browser.new_page()
        framed.goto(f"http://127.0.0.1:{server.server_address[1]}/framed.html")
        inner = framed.frame_locator("iframe")
        inner.locator("#boot.failed").wait_for(timeout=BOOT_MS)
        said = inner.locator("#boot .detail").inner_text()
        assert "a tab of its own" in said and "embed.html" in said, said
        assert inner.locator("#app[inert]").count() == 1  # nothing started, nothing to click
    finally:
        server.shutdown()
        server.server_close()
    # the runtime cannot be fetched: the same page on its own site, with Pyodide's wasm blocked
    own = browser.new_page()
    # Nothing kept from the frames above (the service worker would start the runtime from its copy), and the
    # route on the context, not the page: the service worker fetches the site's files, and a page's routes
    # do not see a worker's requests
    own.goto(browser.site_url + "/openapi.json")
    own.evaluate("caches.keys().then(ns => Promise.all(ns.map(n => caches.delete(n))))")
    browser.context.route("**/pyodide.asm.wasm", lambda route: route.abort())
    own.goto(frame_src)
    own.wait_for_selector("#boot.failed", timeout=BOOT_MS)
    said = own.inner_text("#boot .detail")
    assert said.startswith("Failed: ") and "Reload" in said, said
    # positive control: unblocked, the same scene starts, even after the watchdog guessed it had failed (an
    # error, then no stage for a while, on a slow first visit): a later stage takes the guess back
    browser.context.unroute("**/pyodide.asm.wasm")
    own.goto(frame_src)
    if own.evaluate("document.body.classList.contains('booting')"):
        own.evaluate("MP.fatal('a guess of the watchdog', false, true)")
        assert own.locator("#boot.failed").count() == 1
    ready(own)  # ready, and MP.errors is empty again
    assert own.locator("#boot.failed").count() == 0
    # what this test provoked on purpose is not what the guard looks for
    browser.guard.foreign.clear()
    browser.guard.errors.clear()
