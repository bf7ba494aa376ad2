"""The Playground as a console for a real `mp serve` (web/remote.py): a real server subprocess, data made by
monitor_protocol.client from the test, the page connected to it in Chromium. The page shows the server's
monitors, log, readers (lag), lease and state; follows it live (long poll); acts on it (publish); says
exactly what to do when CORS refuses it or nothing answers; keeps tokens out of IndexedDB and localStorage
unless "remember" is ticked; and gives the page's own engine back untouched on Disconnect. Waits are on the
page's counters and DOM, never sleeps."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest
from conftest import ROOT, axe_violations, format_violations, horizontal_overflow, screenshot

sys.path.insert(0, str(ROOT / "tests"))
from monitor_protocol.client import Client  # noqa: E402
from serverutil import server_log, start_server, stop_server  # noqa: E402

BOOT_MS = 120_000
ACT_MS = 60_000
CI = "com.example.ci.run"
TOKEN_FILE = re.compile(r"token minted for this run and written to (\S+) \(")


# ---------------------------------------------------------------------------------------- the server
class Server:
    def __init__(self, tmp_path: Path, *args: str, port: int = 0) -> None:
        self.tmp_path, self.args = tmp_path, args
        self.base, self.proc = start_server(tmp_path, "--db", ":memory:", *args, port=port)
        self.port = int(self.base.rsplit(":", 1)[1])
        found = TOKEN_FILE.search(server_log(self.proc))
        self.admin = Path(found.group(1)).read_text().strip() if found else None
        self.client = Client(self.base)

    def restart(self) -> None:
        """The same server again on the same port (in memory: a fresh, empty engine)."""
        stop_server(self.proc)
        self.base, self.proc = start_server(self.tmp_path, "--db", ":memory:", *self.args, port=self.port)

    def stop(self) -> None:
        stop_server(self.proc)


@pytest.fixture
def console(browser, tmp_path):
    """The browser, a helper that starts `mp serve` subprocesses for it (stopped at the end), and a list a
    test extends with the console errors (and other URLs, "http://...") it causes on purpose. Requests to
    those servers are the point of these tests, so the guard lets them through, and only them."""
    servers: list[Server] = []
    allowed: list[str] = []

    def serve(*args: str, allow_origin: bool = True) -> Server:
        extra = ["--allow-admin", *args] + (["--allow-origin", browser.site_url] if allow_origin else [])
        srv = Server(tmp_path, *extra)
        servers.append(srv)
        return srv

    yield browser, serve, allowed
    for page in browser.context.pages:  # no request after the guard was told which ones are expected
        page.close()
    for srv in servers:
        srv.stop()
    hosts = [f"http://127.0.0.1:{s.port}/" for s in servers] + [a for a in allowed if a.startswith("http://")]
    browser.guard.foreign = [u for u in browser.guard.foreign if not any(u.startswith(h) for h in hosts)]
    browser.guard.errors = [e for e in browser.guard.errors if not any(a in e for a in allowed)]


def seed(srv: Server) -> dict:
    """On the server, from the test: a monitor, two builds, a reader that pulled without acking, and a
    worker holding a lease."""
    c = srv.client
    made = c.create_monitor(
        "deploys", name="Deploys", types=[CI], capabilities=["observe", "react", "act"], owner="human:ops"
    )
    owner = made.owner_token
    for n in (1, 2):
        c.publish(
            "deploys", CI, subject=f"deploy-{n}", data={"status": "passed"}, token=owner, actor="probe:ci"
        )
    reader = c.subscribe("deploys", "agent:auditor", from_="earliest", token=owner)
    c.pull(reader.subscription.id, token=reader.token)  # delivered, not acknowledged: the cursor stays
    last_pull = c.get_subscription(reader.subscription.id, token=reader.token).raw["last_pull"]
    worker = c.subscribe("deploys", "agent:fixer", capabilities=["observe", "act"], from_="head", token=owner)
    c.claim(worker.subscription.id, "deploy-2", lease_duration_seconds=300, token=worker.token)
    return {"owner": owner, "reader": reader, "worker": worker, "reader_last_pull": last_pull}


# ---------------------------------------------------------------------------------------- the page
def open_playground(browser, page=None):
    return browser.open("/", page, timeout=BOOT_MS)


def wait_actions(page, before: int) -> None:
    page.wait_for_function(f"MP.actionsDone + MP.actionsFailed > {before}", timeout=ACT_MS)
    assert page.evaluate("MP.actionsFailed") == 0, page.inner_text("#page-error")


def act(page, selector: str) -> None:
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.click(selector)
    wait_actions(page, before)


def chip(page) -> str:
    return page.inner_text("#status-chip .label")


def wait_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s) || {}).textContent?.includes(t)",
        arg=[selector, text],
        timeout=ACT_MS,
    )


def open_server_panel(page) -> None:
    page.click("#tabs button[data-tab='playground']")
    page.wait_for_selector("#tab-playground.view.active", timeout=ACT_MS)
    if not page.evaluate("document.getElementById('panel-server').open"):
        page.click("#panel-server > summary")


def add_key(page, kind: str, ident: str, token: str) -> None:
    page.select_option("#key-kind", kind)
    page.fill("#key-id", ident)
    page.fill("#key-token", token)
    act(page, "button[data-act='server-key-add']")


def connect(page, base: str, admin: str | None) -> None:
    page.fill("#server-base", base)
    page.fill("#server-admin", admin or "")
    act(page, "#btn-server-connect")


def log_cards(page) -> list[dict]:
    return page.eval_on_selector_all(
        "#log li.obs", "els => els.map(e => ({seq: +e.dataset.seq, type: e.dataset.type, text: e.innerText}))"
    )


def picker(page) -> list[str]:
    return page.eval_on_selector_all("#monitor-pick option", "os => os.map(o => o.value).filter(Boolean)")


def stored_everywhere(page) -> str:
    """Everything this origin keeps: every IndexedDB database's every store, localStorage, sessionStorage."""
    return page.evaluate(
        """async () => {
            const out = {local: {...localStorage}, session: {...sessionStorage}, idb: {}};
            for (const info of await indexedDB.databases()) {
                const db = await new Promise((ok, ko) => {
                    const r = indexedDB.open(info.name); r.onsuccess = () => ok(r.result); r.onerror = ko;
                });
                for (const name of db.objectStoreNames) {
                    const rows = await new Promise((ok, ko) => {
                        const r = db.transaction(name).objectStore(name).getAll();
                        r.onsuccess = () => ok(r.result); r.onerror = ko;
                    });
                    out.idb[info.name + "/" + name] = rows;
                }
                db.close();
            }
            return JSON.stringify(out);
        }"""
    )


# ---------------------------------------------------------------------------------------- the tests
def test_console_shows_follows_and_acts_on_a_real_server(console):
    browser, serve, _allowed = console
    srv = serve()
    made = seed(srv)
    reader, worker = made["reader"], made["worker"]
    page = open_playground(browser)

    # The page's own engine first: a monitor of its own, to find unchanged after Disconnect.
    page.click("#tabs button[data-tab='playground']")
    act(page, "#btn-define-ci")
    local_monitors = picker(page)
    local_head = page.inner_text("#log-head")
    assert local_monitors == ["ci"]

    open_server_panel(page)
    assert page.inner_text("#server-origin") == f"mp serve --allow-origin {browser.site_url}"
    add_key(page, "owner", "deploys", made["owner"])
    add_key(page, "reader", reader.subscription.id, reader.token)
    keys = page.inner_text("#server-keys")
    assert "deploys" in keys and reader.subscription.id in keys
    assert made["owner"] not in keys and reader.token not in keys  # masked: only the last 4 characters
    connect(page, srv.base, srv.admin)
    assert chip(page) == f"remote: 127.0.0.1:{srv.port}"
    assert page.get_attribute("#server-answer", "data-status") == "200"

    # Monitors, log, readers with their lag, the lease, the state: the server's.
    assert picker(page) == ["deploys"]
    page.wait_for_function("document.querySelectorAll('#log li.obs').length >= 6", timeout=ACT_MS)
    server_log_rows = srv.client.admin_log("deploys", token=srv.admin)["observations"]
    cards = log_cards(page)
    assert [(c["seq"], c["type"]) for c in cards] == [(int(o["id"]), o["type"]) for o in server_log_rows]
    assert any("deploy-1" in c["text"] for c in cards) and any("deploy-2" in c["text"] for c in cards)
    auditor = f".card.reader[data-sub='{reader.subscription.id}']"
    lag = srv.client.get_subscription(reader.subscription.id, token=reader.token).lag
    assert lag >= 2  # the two builds at least: the reader acknowledged nothing
    assert page.inner_text(f"{auditor} b.lag") == str(lag)
    assert page.inner_text(f"{auditor} b.cursor") == "0"
    assert page.locator(f".card.reader[data-sub='{worker.subscription.id}']").count() == 1
    leases = page.inner_text("#server-leases")
    assert "deploy-2" in leases and f"held by agent:fixer (sub:{worker.subscription.id})" in leases
    left = int(re.search(r"(\d+) s left", leases).group(1))
    assert 120 < left <= 300, leases  # 300 s from the claim, counted by the server's clock
    head = srv.client.state("deploys", token=made["owner"]).head
    assert f"head {head}" in page.inner_text("#state")
    assert "Story is paused" in page.inner_text("#server-local-note")
    assert page.is_disabled("#tabbtn-story")
    screenshot(page, "remote-console")

    # Live: published from the test, shown without a reload, woken by the long poll.
    wakes = page.evaluate("MP.remoteWakes")
    assert "long poll through reader agent:auditor" in page.inner_text("#server-status")
    p = srv.client.publish("deploys", CI, subject="deploy-3", data={"status": "failed"}, token=made["owner"])
    page.wait_for_selector(f"#log li.obs[data-seq='{p.seq}']", timeout=ACT_MS)
    assert page.evaluate("MP.remoteWakes") > wakes
    assert "deploy-3" in page.inner_text(f"#log li.obs[data-seq='{p.seq}']")

    # Acting from the page: a publish lands on the server.
    page.fill("#publish-form input[name=subject]", "from-the-page")
    act(page, "#btn-publish")
    assert page.get_attribute("#publish-answer", "data-status") == "201"
    rows = srv.client.admin_log("deploys", token=srv.admin)["observations"]
    assert any(o.get("subject") == "from-the-page" for o in rows)

    # Nothing of the server in this browser's storage: remember is unticked.
    kept = stored_everywhere(page)
    for secret in (srv.admin, made["owner"], reader.token):
        assert secret not in kept

    # Disconnect: the page's own engine, as it was.
    act(page, "#btn-server-disconnect")
    assert chip(page) == "ready · saved in IndexedDB"
    assert picker(page) == local_monitors
    wait_text(page, "#log-head", local_head)
    assert not page.is_disabled("#tabbtn-story")

    # Reload: no token anywhere (the form is empty too).
    page.reload()
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    kept = stored_everywhere(page)
    for secret in (srv.admin, made["owner"], reader.token):
        assert secret not in kept
    assert page.input_value("#server-admin") == ""
    assert "No owner or reader token yet" in page.inner_text("#server-keys")
    assert picker(page) == local_monitors


def test_remember_keeps_tokens_sealed_in_local_storage(console):
    """Remembered tokens survive a reload, yet no storage of the origin holds one in clear: localStorage
    keeps them sealed (AES-GCM under a key the browser will not export, in the vault's own database)."""
    browser, serve, _allowed = console
    srv = serve()
    made = seed(srv)
    page = open_playground(browser)
    open_server_panel(page)
    add_key(page, "owner", "deploys", made["owner"])
    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.check("#server-remember")
    wait_actions(page, before)
    assert "localStorage" in page.inner_text("#server-remembered")
    connect(page, srv.base, srv.admin)
    assert chip(page) == f"remote: 127.0.0.1:{srv.port}"
    kept = stored_everywhere(page)
    local = json.loads(kept)["local"]
    sealed = local["monitor-protocol-remote"]
    assert sealed.startswith("v1:")  # positive control: something was remembered
    for secret in (srv.admin, made["owner"]):
        assert secret not in kept  # not in clear anywhere: localStorage, sessionStorage, every IndexedDB

    page.reload()
    page.wait_for_selector("body.ready", timeout=BOOT_MS)
    open_server_panel(page)
    assert page.is_checked("#server-remember")
    assert page.input_value("#server-base") == srv.base
    assert page.input_value("#server-admin") == srv.admin
    assert "deploys" in page.inner_text("#server-keys")
    assert "Restored from this browser" in page.inner_text("#server-remembered")
    connect(page, srv.base, page.input_value("#server-admin"))
    assert picker(page) == ["deploys"]

    before = page.evaluate("MP.actionsDone + MP.actionsFailed")
    page.uncheck("#server-remember")  # unticked: gone from localStorage at once
    wait_actions(page, before)
    assert "monitor-protocol-remote" not in json.loads(stored_everywhere(page))["local"]


def test_tokens_given_for_one_server_are_never_sent_to_another(console):
    browser, serve, _allowed = console
    a, b = serve(), serve()
    made = seed(a)
    page = open_playground(browser)
    open_server_panel(page)
    add_key(page, "owner", "deploys", made["owner"])  # typed before the first Connect: A's, once connected
    connect(page, a.base, a.admin)
    assert chip(page) == f"remote: 127.0.0.1:{a.port}" and "deploys" in page.inner_text("#server-keys")
    act(page, "#btn-server-disconnect")
    seen: list[str] = []
    page.on("request", lambda r: seen.append(f"{r.url} {r.headers.get('authorization') or ''}"))
    connect(page, b.base, a.admin)  # the form still holds A's admin token
    to_b = [x for x in seen if x.startswith(b.base)]
    assert to_b, "the page talked to B"  # positive control: requests to B were seen
    assert not any(made["owner"] in x or a.admin in x for x in to_b), to_b
    assert "not sent to" in page.inner_text("#server-answer")
    assert "deploys" not in page.inner_text("#server-keys")  # B's keyring starts empty
    act(page, "#btn-server-disconnect")
    connect(page, a.base, a.admin)  # back to A: its own tokens again
    assert "deploys" in page.inner_text("#server-keys") and picker(page) == ["deploys"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_origin_and_an_absent_server_say_what_to_do(console):
    browser, serve, allowed = console
    browser.guard.expect_http_refusals = True
    allowed += ["has been blocked by CORS policy", "net::ERR_CONNECTION_REFUSED", "net::ERR_FAILED"]
    page = open_playground(browser)
    open_server_panel(page)
    start = f"mp serve --allow-origin {browser.site_url}"

    # Nothing listens on that port.
    dead = f"http://127.0.0.1:{free_port()}"
    allowed.append(dead + "/")  # the page's requests to it are the point
    connect(page, dead, None)
    said = page.inner_text("#server-answer")
    assert f"Nothing answers at {dead}" in said and start in said
    assert chip(page).startswith("ready")  # still the page's own engine

    # A server started without --allow-origin: CORS refuses the page, and the page says how to start it.
    srv = serve(allow_origin=False)
    connect(page, srv.base, srv.admin)
    said = page.inner_text("#server-answer")
    assert "refuses this page's origin" in said and start in said
    assert chip(page).startswith("ready")


def test_unreachable_then_back(console):
    browser, serve, allowed = console
    allowed += ["net::ERR_CONNECTION_REFUSED", "net::ERR_FAILED"]
    srv = serve()
    made = seed(srv)
    page = open_playground(browser)
    open_server_panel(page)
    add_key(page, "reader", made["reader"].subscription.id, made["reader"].token)
    connect(page, srv.base, srv.admin)
    assert chip(page) == f"remote: 127.0.0.1:{srv.port}"
    wait_text(page, "#server-status", "long poll")

    stop_server(srv.proc)
    page.wait_for_function(
        "document.querySelector('#status-chip .label').textContent.endsWith('unreachable')", timeout=ACT_MS
    )
    status = page.inner_text("#server-status")
    assert "Server unreachable" in status and f"mp serve --allow-origin {browser.site_url}" in status

    # The same port again: an empty in-memory server, so the reader and the monitor are gone (401, 404).
    browser.guard.expect_http_refusals = True
    srv.restart()
    page.wait_for_function(
        "t => document.querySelector('#status-chip .label').textContent === t",
        arg=f"remote: 127.0.0.1:{srv.port}",
        timeout=ACT_MS,
    )
    wait_text(page, "#server-status", "Back")


def test_without_the_admin_token_it_shows_what_the_tokens_allow_and_says_the_rest(console):
    browser, serve, allowed = console
    browser.guard.expect_http_refusals = True  # the wrong admin token's 401, on purpose
    srv = serve()
    made = seed(srv)
    reader = made["reader"]
    page = open_playground(browser)
    open_server_panel(page)

    connect(page, srv.base, "not-the-admin-token")
    assert page.get_attribute("#server-answer", "data-status") == "401"
    assert "The admin token was refused" in page.inner_text("#server-answer")
    assert chip(page).startswith("ready")  # refused: still the page's own engine

    add_key(page, "owner", "deploys", made["owner"])
    add_key(page, "reader", reader.subscription.id, reader.token)
    connect(page, srv.base, None)
    assert chip(page) == f"remote: 127.0.0.1:{srv.port}"
    assert picker(page) == ["deploys"]
    # The log as the reader sees it: a read-only replay (the server's own answer to the same replay).
    replay = srv.client.pull(reader.subscription.id, cursor=1, limit=200, token=reader.token).observations
    page.wait_for_function(
        f"document.querySelectorAll('#log li.obs').length >= {len(replay)}", timeout=ACT_MS
    )
    assert [c["seq"] for c in log_cards(page)] == [int(o["id"]) for o in replay]
    auditor = f".card.reader[data-sub='{reader.subscription.id}']"
    lag = srv.client.get_subscription(reader.subscription.id, token=reader.token).lag
    assert page.inner_text(f"{auditor} b.lag") == str(lag)
    # Only its own reader: the worker's subscription and the lease need the admin token, and it says so.
    assert page.locator(f".card.reader[data-sub='{made['worker'].subscription.id}']").count() == 0
    blind = page.inner_text("#server-blind")
    assert "Leases: only the admin token shows them" in blind and "Other readers" in blind
    assert page.locator("#server-leases").count() == 0
    head = srv.client.state("deploys", token=made["owner"]).head
    assert f"head {head}" in page.inner_text("#state")
    # The replay moved no cursor and counted as no pull.
    after = srv.client.get_subscription(reader.subscription.id, token=reader.token)
    assert after.cursor == 0 and after.raw["last_pull"] == made["reader_last_pull"]


def test_server_panel_on_a_phone_fits_and_passes_axe(console, phone_browser):
    _browser, serve, _allowed = console
    srv = serve()
    made = seed(srv)
    page = open_playground(phone_browser)
    open_server_panel(page)
    add_key(page, "reader", made["reader"].subscription.id, made["reader"].token)
    for connected in (False, True):
        if connected:
            connect(page, srv.base, srv.admin)
            assert chip(page) == f"remote: 127.0.0.1:{srv.port}"
            page.wait_for_selector("#server-leases", timeout=ACT_MS)
        wide = horizontal_overflow(page)
        assert not wide["overflows"], wide
        found = axe_violations(page)
        assert found == [], format_violations(found)
    screenshot(page, "remote-console-phone")
    for p in phone_browser.context.pages:  # its requests to the server are expected (see `console`)
        p.close()
    hosts = f"http://127.0.0.1:{srv.port}/"
    phone_browser.guard.foreign = [u for u in phone_browser.guard.foreign if not u.startswith(hosts)]
