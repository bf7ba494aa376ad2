"""The Playground's Server panel: point the page at a running `mp serve` and the Log, Readers, Leases and
State panels (and their buttons) become a console for it. This module draws the panel and holds its
actions; the door to the server is web/remote_door.py, the tokens web/server_keys.py.

While connected, the page's own engine keeps running underneath (its sweep, the service worker, other
tabs); the page's session is set aside and given back on Disconnect, and nothing of the server is written
into the page's IndexedDB. The Story and the race are page-engine-only actions (`local_only`): the page
refuses them, with the reason, while connected."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import actions
import compare
import js
import model as m
import replies
import server_keys
import ui
from door import ENGINE
from remote_door import RemoteDoor, Unreachable, admin_refused, remote_reader, start_line
from replies import BadReply
from server_keys import KEYS, REMEMBER_KEY, Keyring
from ui import action, el, esc, note, show_one

DEFAULT_BASE = "http://127.0.0.1:8130"


@dataclass
class Connection:
    door: RemoteDoor
    page_session: dict[str, Any]  # the page's own session, set aside while connected
    task: Any = None  # the live loop (held here: a task nobody references may be collected)
    ui_idb: bool = False


CONN: dict[str, Connection | None] = {"now": None}


def connected() -> RemoteDoor | None:
    conn = CONN["now"]
    return conn.door if conn is not None else None


def normalise_base(raw: str) -> str | None:
    base = raw.strip().rstrip("/")
    if base.endswith("/mp/v0"):
        base = base[: -len("/mp/v0")]
    try:
        parts = urlsplit(base)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        return None
    return f"{parts.scheme}://{parts.netloc}"


def status_changed() -> None:
    """The door's status moved (away, back, a refused reply, a wake): redraw the panel and the page."""
    render_status()
    ui.refresh_soon()


async def connect(base: str, admin: str | None, keys: Keyring) -> tuple[bool, str, Any]:
    """Check the server and the tokens, then put the page on it. Returns (ok, what it means, reply)."""
    cannot = await replies.ready()
    if cannot:
        return False, cannot, None
    door = RemoteDoor(base, admin, status_changed)
    readers: dict[str, m.Reader] = {}
    try:
        disc = await door.request("GET", "/discover")
        if not disc.ok:
            return (
                False,
                f"{base}/mp/v0/discover did not answer as a Monitor Protocol server ({disc.status}).",
                disc,
            )
        if admin:
            snap = await door.request("GET", "/admin/snapshot", token=admin)
            if not snap.ok:
                refused = admin_refused(snap)
                return False, refused.body["error"], refused
        for sid, tok in keys.readers.items():
            r = await door.request("GET", f"/subscriptions/{quote(sid, safe='')}", token=tok)
            if not r.ok:
                return False, (f"The reader token for {sid} was refused ({r.status}): copy the subscription id "
                               "and the token its subscribe reply gave."), r  # fmt: skip
            readers[sid], door.filter_notes[sid] = remote_reader(r.body, tok)
    except Unreachable:
        return False, await door.diagnose(), None
    except BadReply as why:
        return False, f"Not connected: the server's reply is not what the protocol serves ({why}).", None
    conn = Connection(door, dict(m.S.__dict__), ui_idb=ENGINE.ui_idb)
    fresh = m.Session(owners=dict(keys.owners), readers=readers)
    m.S.__dict__.update(fresh.__dict__)
    m.PIC.__dict__.update(m.Picture().__dict__)
    ENGINE.ui_idb = False  # actions.save() writes nothing of the server into the page's IndexedDB
    ENGINE.remote = door
    compare.RACE.on = False
    CONN["now"] = conn
    conn.task = asyncio.ensure_future(door.follow())
    seen = "the whole picture (admin token)" if admin else "what the owner and reader tokens allow"
    return True, f"Connected to {base}: this console shows {seen}.", disc


def disconnect() -> None:
    conn = CONN["now"]
    if conn is None:
        return
    conn.door.stop()
    keep_keys()
    ENGINE.remote = None
    ENGINE.ui_idb = conn.ui_idb
    m.S.__dict__.update(conn.page_session)
    m.PIC.__dict__.update(m.Picture().__dict__)
    CONN["now"] = None


def keep_keys() -> None:
    """The tokens of the remote session (minted there too) stay in the keyring for the next Connect."""
    keys = KEYS.current
    keys.owners.update(m.S.owners)
    for rd in m.S.readers.values():
        keys.readers[rd.sub_id] = rd.token


# ---------------------------------------------------------------------------------------- remember
def remember_ticked() -> bool:
    box = el("server-remember")
    return bool(box and box.checked)


async def remember() -> None:
    """Ticked: the URL and every token (those minted while connected too), sealed, in localStorage;
    unticked: nothing there."""
    if CONN["now"] is not None:
        keep_keys()
    KEYS.base_field = str(el("server-base").value)
    await server_keys.remember(remember_ticked())


async def restore() -> None:
    if not await server_keys.restore(normalise_base):
        return
    el("server-base").value = KEYS.base_field or DEFAULT_BASE
    el("server-admin").value = KEYS.current.admin or ""
    el("server-remember").checked = True
    el(
        "server-remembered"
    ).textContent = f"Restored from this browser (localStorage key {REMEMBER_KEY}, sealed): press Connect."


# ---------------------------------------------------------------------------------------- the panel
def masked(token: str) -> str:
    return "••••" + token[-4:] if len(token) > 8 else "••••"


def render_keys() -> None:
    if CONN["now"] is not None:
        keep_keys()
    keys = KEYS.current
    rows = [("owner", mid, tok) for mid, tok in keys.owners.items()]
    rows += [("reader", sid, tok) for sid, tok in keys.readers.items()]
    if not rows:
        ui.put(el("server-keys"), "<li class='muted small'>No owner or reader token yet.</li>")
        return
    ui.put(
        el("server-keys"),
        "".join(
            f"<li class='small'><b>{kind}</b> {esc(ident)} <code>{esc(masked(tok))}</code> "
            f"{ui.button('server-key-drop', 'remove', '', cls='small-btn', kind=kind, ident=ident)}</li>"
            for kind, ident, tok in rows
        ),
    )


def render_status() -> None:
    door = connected()
    box = el("server-status")
    if box is None:
        return
    el("btn-server-connect").disabled = door is not None
    el("btn-server-disconnect").disabled = door is None
    if door is None:
        ui.put(box, "<p class='small muted'>Not connected: every panel shows this page's own engine.</p>")
        ui.put(el("server-view"), "")
        return
    stamp = lambda t: time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
    if door.away_since is not None:
        line = (f"<p class='remote-away'><b>Server unreachable</b> since {stamp(door.away_since)}: "
                f"{esc(door.why_away)} {esc(door.live)}.</p>")  # fmt: skip
    else:
        back = f" <b>Back</b> at {stamp(door.back_at)}." if door.back_at else ""
        line = f"<p class='remote-ok'>Connected to <code>{esc(door.base)}</code>.{back} {esc(door.live)}</p>"
    if door.refused:
        line += (
            f"<p class='remote-refused warn-word' id='server-refused'><b>⚠ A reply was refused</b> at "
            f"{esc(door.refused)}. The page did not use it and goes on; the server does not answer as the "
            "protocol says (its replies are checked against the project's schemas).</p>"
        )
    ui.put(box, line)
    blind = "".join(f"<li>{esc(b)}</li>" for b in door.blind)
    leases = "".join(
        f"<li><code>{esc(x['lease']['subject'])}</code> {esc(x['state'])}"
        + (f" by {esc(actions.holder_name(x['lease']['holder']))}" if x["lease"].get("holder") else "")
        + (
            f", {max(0, int(x['expires_in_s']))} s left when read"
            if x.get("expires_in_s") is not None
            else ""
        )
        + "</li>"
        for x in m.PIC.leases()
    )
    ui.put(
        el("server-view"),
        (f"<h3>Leases on the server</h3><ul class='small' id='server-leases'>{leases}</ul>" if leases else "")
        + (
            f"<h3>What this console cannot see</h3><ul class='small' id='server-blind'>{blind}</ul>"
            if blind
            else ""
        ),
    )


def chip(chip_el, label) -> bool:
    """The status chip while connected (app.set_chip asks first); False when not connected."""
    door = connected()
    if door is None:
        return False
    if door.away_since is not None:
        chip_el.className = "chip warn"
        label.textContent = f"remote: {door.host} · unreachable"
        chip_el.title = door.why_away
    else:
        chip_el.className = "chip ok remote"
        label.textContent = f"remote: {door.host}"
        chip_el.title = (
            f"This page shows and acts on {door.base}; Disconnect in the Playground's Server panel."
        )
    render_status()
    return True


def set_local_controls(remote: bool) -> None:
    """Story and the race would write their teaching monitors into the server: off while connected (the
    curl tab and Conformance keep running on this page's own engine)."""
    story = el("tabbtn-story")
    story.disabled = remote
    if remote:
        story.title = ui.LOCAL_ONLY
        if story.classList.contains("active"):
            el("tabbtn-playground").click()
    else:
        story.removeAttribute("title")
    ui.set_reset(
        "Connected to a server: Reset clears this page's own log; disconnect first"
        if remote
        else ("" if ENGINE.mode == "owner" else ui.FOLLOWER_NO_RESET)
    )
    el("server-local-note").hidden = not remote


def read_form() -> tuple[str | None, str | None]:
    return normalise_base(el("server-base").value), (el("server-admin").value.strip() or None)


@action("server-connect", answer="server-answer")
async def connect_btn(_el) -> None:
    base, admin = read_form()
    if base is None:
        note(
            "server-answer",
            "The base URL must look like http://127.0.0.1:8130 (scheme, host, port).",
            ok=False,
        )
        return
    unbound = KEYS.current.base is None
    keys, kept_back = KEYS.ring_for(base, admin)
    if kept_back:
        el("server-admin").value = ""
    ok, say, reply = await connect(base, keys.admin, keys)
    say = f"{say} {kept_back}" if kept_back else say
    if not ok and unbound:
        KEYS.unbind(base)
    if reply is not None:
        show_one("server-answer", f"connect {base}", reply, say)
    else:
        note("server-answer", say, ok=ok)
    if ok:
        set_local_controls(True)
        await remember()
    render_keys()
    render_status()
    await ui.refresh()


@action("server-disconnect", answer="server-answer")
async def disconnect_btn(_el) -> None:
    door = connected()
    await remember()
    disconnect()
    set_local_controls(False)
    render_keys()
    render_status()
    note(
        "server-answer",
        f"Disconnected from {door.base if door else 'the server'}: back on this page's own engine.",
    )
    await ui.refresh()


@action("server-key-add", answer="server-answer")
async def key_add(_el) -> None:
    kind = el("key-kind").value
    ident, token = el("key-id").value.strip(), el("key-token").value.strip()
    if not ident or not token:
        note("server-answer", "Give the id (a monitor id for an owner token, a subscription id for a reader "
             "token) and the token.", ok=False)  # fmt: skip
        return
    if not replies.TOKEN.match(token):
        note("server-answer", "A token is printable ASCII without spaces: copy it again from the reply that "
             "gave it.", ok=False)  # fmt: skip
        return
    door = connected()
    if kind == "owner":
        KEYS.current.owners[ident] = token
        if door is not None:
            m.S.owners[ident] = token
    else:
        if door is not None:
            r = await door.call("GET", f"/subscriptions/{quote(ident, safe='')}", token=token)
            if not r.ok:
                show_one(
                    "server-answer", f"reader {ident}", r, "That reader token was refused: nothing kept."
                )
                return
            m.S.readers[ident], door.filter_notes[ident] = remote_reader(r.body, token)
            door.poke.set()
        KEYS.current.readers[ident] = token
    el("key-id").value = ""
    el("key-token").value = ""
    await remember()
    render_keys()
    where = "this browser, sealed (remember is ticked)" if remember_ticked() else "this tab's memory only"
    note("server-answer", f"{kind} token for {ident} kept in {where}.")
    await ui.refresh()


@action("server-key-drop", answer="server-answer")
async def key_drop(target) -> None:
    kind, ident = str(target.getAttribute("data-kind")), str(target.getAttribute("data-ident"))
    keys = KEYS.current
    (keys.owners if kind == "owner" else keys.readers).pop(ident, None)
    if connected() is not None:
        if kind == "owner":
            m.S.owners.pop(ident, None)
        else:
            m.S.readers.pop(ident, None)
    await remember()
    render_keys()
    note("server-answer", f"The {kind} token for {ident} is forgotten by this page.")
    await ui.refresh()


async def remember_box() -> None:
    """The "remember" box changed (a change listener: a checkbox is no button)."""
    await remember()
    el("server-remembered").textContent = (
        f"Kept in this browser (localStorage key {REMEMBER_KEY}, sealed with a key this browser will not "
        "export) until you untick this."
        if remember_ticked()
        else "Tokens stay in this tab's memory only: a reload forgets them."
    )


async def setup() -> None:
    """Wire the Server panel (app.main calls it once the page is up)."""
    el("server-origin").textContent = start_line()
    el("server-base").value = el("server-base").value or DEFAULT_BASE
    await restore()
    from pyodide.ffi import create_proxy

    el("server-remember").addEventListener("change", create_proxy(lambda _e: ui.run_task(remember_box())))
    js.MP.remoteWakes = 0
    render_keys()
    render_status()
