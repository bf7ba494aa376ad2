"""The Playground as a console for a real `mp serve`: a remote door with door.Engine's interface (`call`,
`overview`, the same Reply and the same overview shape), built from the server's own routes, a live loop
that wakes the redraw when the remote log grows, and the "Server" panel that connects and disconnects.

What the door can see depends on the tokens it is given (the REST binding has no route listing a
monitor's readers or leases for anyone but the operator):
- the admin token (`mp serve --allow-admin`): GET /admin/snapshot (every monitor, its state, every
  subscription with its lag, every lease) and GET /admin/log (the whole log): the whole picture;
- owner and reader tokens: the monitors they may see, a monitor's state, each held reader's subscription,
  and the log as a held reader sees it (read-only replay, `pull?cursor=`); no leases, no other readers.
The picture says what it could not see, and which token would show it (`remote.blind`).

While connected, the page's own engine keeps running underneath (its sweep, the service worker, other
tabs); the page's session is set aside and given back on Disconnect, and nothing of the server is written
into the page's IndexedDB. Tokens live in this module's memory, and in localStorage only when the person
ticks "remember" (the panel says so)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import compare
import js
import model as m
import ui
from door import ENGINE
from monitor_protocol.doors.browser import Reply
from pyodide.ffi import to_js
from ui import action, el, esc, note, show_one

DEFAULT_BASE = "http://127.0.0.1:8130"
LONG_POLL_S = 25  # below mp serve's 50 s cap, and short enough that a stale poll is never long
BACKOFF_S = (1, 2, 4, 8, 15, 30)  # the wait before each retry while the server is away
LOG_PAGE = 200
REMEMBER_KEY = "monitor-protocol-remote" + (f"--{js.MP.ns}" if str(js.MP.ns or "") else "")


def origin() -> str:
    return str(js.location.origin)


def start_line() -> str:
    return f"mp serve --allow-origin {origin()}"


class Unreachable(Exception):
    """The request never got an HTTP answer: the server is away, or the browser refused it (CORS)."""


@dataclass
class Keyring:
    """The tokens the console was given for ONE server (`base`, bound at its first Connect): owner tokens
    by monitor, reader tokens by subscription, and the admin token. A token is only ever sent to the
    server it was given for; another server gets a keyring of its own."""

    owners: dict[str, str] = field(default_factory=dict)
    readers: dict[str, str] = field(default_factory=dict)
    base: str | None = None
    admin: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"admin": self.admin, "owners": self.owners, "readers": self.readers}

    @classmethod
    def of(cls, base: str, raw: dict[str, Any]) -> Keyring:
        return cls({str(k): str(v) for k, v in raw.get("owners", {}).items()},
                   {str(k): str(v) for k, v in raw.get("readers", {}).items()},
                   base, str(raw["admin"]) if raw.get("admin") else None)  # fmt: skip


class RemoteDoor:
    """door.Engine's `call` and `overview`, answered by a running `mp serve` over fetch (CORS)."""

    def __init__(self, base: str, admin: str | None) -> None:
        self.base = base
        self.api = base + "/mp/v0"
        self.host = urlsplit(base).netloc
        self.admin = admin or None
        self.away_since: float | None = None  # time.time() when the server stopped answering
        self.back_at: float | None = None
        self.why_away = ""
        self.live = ""  # how the page follows the server, in a sentence
        self.blind: list[str] = []  # what the last picture could not see, and which token would show it
        self.stopped = False
        self.poke = asyncio.Event()  # wakes the live loop: the server went away, the monitor changed
        self.polling: tuple[str, str] | None = None  # (monitor, subscription) of the long poll in flight
        self.abort = None  # its AbortController
        self.shown: str | None = None  # the monitor on screen at the last overview
        self.wakes = 0  # long polls that came back with new rows (tests read it as MP.remoteWakes)

    # ---------------------------------------------------------------------------------- requests
    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        query: dict | None = None,
        signal: Any = None,
    ) -> Reply:
        """One HTTP request to the server; Unreachable when no HTTP answer came back."""
        url = self.api + path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        opts: dict[str, Any] = {"method": method, "headers": headers, "cache": "no-store", "mode": "cors"}
        if body is not None:
            headers["Content-Type"] = "application/json"
            opts["body"] = json.dumps(body)
        if signal is not None:
            opts["signal"] = signal
        try:
            resp = await js.fetch(url, to_js(opts, dict_converter=js.Object.fromEntries))
            text = str(await resp.text())
        except Exception as exc:  # a TypeError from fetch: no answer, or one the browser would not show
            if signal is not None and signal.aborted:
                raise asyncio.CancelledError from exc
            raise Unreachable(str(exc)) from exc
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = {
                "code": "UNAVAILABLE",
                "error": f"the server answered {resp.status} with no JSON: {text[:200]}",
            }
        self.came_back()
        return Reply(int(resp.status), data)

    async def diagnose(self) -> str:
        """Why no answer came: a `no-cors` request reaches a running server even when CORS hides its
        answers, so a server that answers it is up and refusing this page's origin."""
        try:
            await js.fetch(self.api + "/discover", to_js({"mode": "no-cors", "cache": "no-store"},
                                                          dict_converter=js.Object.fromEntries))  # fmt: skip
        except Exception:
            return (f"Nothing answers at {self.base}. Start the server with `{start_line()}` "
                    "(and check the address and port).")  # fmt: skip
        return (f"The server at {self.base} answered, but refuses this page's origin ({origin()}): restart it "
                f"with `{start_line()}`.")  # fmt: skip

    async def went_away(self) -> None:
        self.why_away = await self.diagnose()
        if self.away_since is None:
            self.away_since = time.time()
            self.back_at = None
            self.poke.set()
            ui.refresh_soon()

    def came_back(self) -> None:
        if self.away_since is not None:
            self.away_since = None
            self.back_at = time.time()
            self.poke.set()
            ui.refresh_soon()

    def unavailable(self) -> Reply:
        return Reply(503, {"code": "UNAVAILABLE", "error": self.why_away or f"{self.base} does not answer."})

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, query: dict | None = None
    ) -> Reply:
        try:
            return await self.request(method, path, body, token, query)
        except Unreachable:
            await self.went_away()
            return self.unavailable()

    # ---------------------------------------------------------------------------------- the picture
    async def overview(self, monitor: str | None, from_seq: int) -> Reply:
        """upkeep.overview's shape from the server's routes, plus `remote` (what it could not see)."""
        if self.away_since is not None:  # the live loop probes, with backoff, and redraws once it is back
            return self.unavailable()
        if self.polling is not None and self.polling[0] != monitor and self.abort is not None:
            self.abort.abort()  # the long poll watches the monitor that was on screen
        if monitor != self.shown:
            self.shown = monitor
            self.poke.set()
        try:
            if self.admin:
                reply = await self._overview_admin(monitor, from_seq)
            else:
                reply = await self._overview_tokens(monitor, from_seq)
        except Unreachable:
            await self.went_away()
            return self.unavailable()
        remember_if_ticked()
        return reply

    async def _overview_admin(self, monitor: str | None, from_seq: int) -> Reply:
        snap = await self.request("GET", "/admin/snapshot", token=self.admin)
        if not snap.ok:
            return admin_refused(snap)
        taken = parse_time(snap.body.get("taken_at")) or time.time()
        entries = snap.body["monitors"]
        self.blind = [
            "Unacknowledged batches: the server lists no delivered-but-unacked seqs; a reader's lag and cursor "
            "are shown, its held batch only for readers this page pulled itself."
        ]
        out: dict[str, Any] = {
            "taken_at": snap.body.get("taken_at"),
            "monitors": [summary(e["monitor"]) for e in entries],
            "monitor": None,
        }
        if monitor is None:
            return Reply(200, out)
        entry = next((e for e in entries if e["monitor"]["id"] == monitor), None)
        if entry is None:
            return Reply(404, {"code": "NOT_FOUND", "error": f"No monitor {monitor!r} on {self.base}."})
        log = await self.request(
            "GET",
            "/admin/log",
            token=self.admin,
            query={"monitor": monitor, "from": from_seq, "limit": LOG_PAGE},
        )
        if not log.ok:
            return log
        out["monitor"] = {
            "monitor": entry["monitor"],
            "state": entry.get("state"),
            "subscriptions": [sub_view(s) for s in entry.get("subscriptions") or []],
            "leases": [lease_view(x, taken) for x in entry.get("leases") or []],
            "log": log.body,
        }
        return Reply(200, out)

    async def _overview_tokens(self, monitor: str | None, from_seq: int) -> Reply:
        """Without the admin token: what the owner and reader tokens (and no token: public monitors) may
        see, gathered route by route."""
        seen: dict[str, dict[str, Any]] = {}
        tokens = [None, *m.S.owners.values(), *(r.token for r in m.S.readers.values())]
        for tok in dict.fromkeys(tokens):
            r = await self.request("GET", "/monitors", token=tok)
            if r.ok:
                for mon in r.body.get("monitors") or []:
                    seen.setdefault(mon["id"], mon)
        blind = [
            "Leases: only the admin token shows them (GET /admin/snapshot). Connect with the admin token of "
            "`mp serve --allow-admin` to see who holds what.",
            "Other readers: a reader token shows its own subscription only; the admin token lists every one.",
        ]
        missing = [mid for mid in m.S.owners if mid not in seen]
        if missing:
            blind.append(f"Owner token(s) of {', '.join(missing)}: the server shows no such monitor for it.")
        out: dict[str, Any] = {"monitors": [summary(x) for x in seen.values()], "monitor": None}
        if monitor is None:
            self.blind = blind
            return Reply(200, out)
        if monitor not in seen:
            self.blind = blind
            return Reply(
                404, {"code": "NOT_FOUND", "error": f"No monitor {monitor!r} visible with these tokens."}
            )
        readers = [r for r in m.S.readers.values() if r.monitor == monitor]
        tok = m.S.owners.get(monitor) or (readers[0].token if readers else None)
        state = await self.request("GET", f"/monitors/{quote(monitor, safe='')}/state", token=tok)
        views = []
        for rd in readers:
            s = await self.request("GET", f"/subscriptions/{quote(rd.sub_id, safe='')}", token=rd.token)
            if s.ok:
                views.append(sub_view(s.body))
            else:
                blind.append(f"Reader {rd.name} ({rd.sub_id}): its token was refused ({s.status}).")
        log = await self._replay_log(monitor, from_seq, readers, seen[monitor])
        if log is None:
            blind.append(
                f"The log of {monitor}: needs the admin token, or a reader token of one of its subscriptions "
                "(the console reads it as a read-only replay, which moves no cursor)."
            )
            log = {
                "monitor": monitor,
                "head": seen[monitor].get("head", 0),
                "next": from_seq,
                "observations": [],
            }
        elif readers and getattr(readers[0], "filter_note", ""):
            blind.append(readers[0].filter_note)
        self.blind = blind
        out["monitor"] = {
            "monitor": seen[monitor],
            "state": state.body if state.ok else None,
            "subscriptions": views,
            "leases": [],
            "log": log,
        }
        return Reply(200, out)

    async def _replay_log(
        self, monitor: str, from_seq: int, readers: list, mon: dict[str, Any]
    ) -> dict[str, Any] | None:
        for rd in readers:
            query = {"cursor": max(from_seq, 1), "limit": LOG_PAGE}
            path = f"/subscriptions/{quote(rd.sub_id, safe='')}/pull"
            r = await self.request("GET", path, token=rd.token, query=query)
            if not r.ok and (r.body or {}).get("code") == "CURSOR_EXPIRED":
                query["cursor"] = int(r.body.get("retention_floor") or 1)
                r = await self.request("GET", path, token=rd.token, query=query)
            if not r.ok:
                continue
            rows = [{k: v for k, v in o.items() if k != "redelivered"} for o in r.body["observations"]]
            return {
                "monitor": monitor,
                "head": r.body["head"],
                "retention_floor": r.body.get("retention_floor"),
                "next": r.body["next"],
                "observations": rows,
            }
        return None

    # ---------------------------------------------------------------------------------- live
    async def follow(self) -> None:
        """Wake the redraw when the remote log grows: a long poll (read-only replay past the head) with a
        reader token of the monitor on screen; otherwise the page's own 5 s re-read. While the server is
        away: retry with backoff, and say so."""
        misses = [0]
        cursor: dict[str, int] = {}
        while not self.stopped:
            try:
                await self._follow_once(misses, cursor)
            except Exception as exc:  # said in the panel, and tried again: the picture still re-reads itself
                self.live = f"the live loop failed ({exc!r}); trying again in 5 s"
                js.console.warn(f"remote live loop: {exc!r}")
                render_status()
                await self.nap(5)

    async def _follow_once(self, misses: list[int], cursor: dict[str, int]) -> None:
        if self.away_since is not None:
            wait = BACKOFF_S[min(misses[0], len(BACKOFF_S) - 1)]
            misses[0] += 1
            self.live = f"retrying in {wait} s"
            render_status()
            await self.nap(wait)
            try:
                await self.request("GET", "/discover")
                cursor.clear()  # a server started again may hold another log: learn its head afresh
            except Unreachable:
                await self.went_away()
            return
        misses[0] = 0
        mon = m.S.monitor
        rd = next(
            (r for r in m.S.readers.values() if r.monitor == mon and not getattr(r, "refused", False)),
            None,
        )
        if mon is None or rd is None:
            self.live = (
                "re-read every 5 s (the page's timer). A reader token of this monitor makes it instant "
                "(a long poll)."
                if mon
                else "pick a monitor"
            )
            render_status()
            await self.nap(30)
            return
        head = int(((m.PIC.monitor or {}).get("monitor") or {}).get("head") or 0)
        start = max(cursor.get(rd.sub_id, 0), head + 1)
        self.live = f"live: long poll through reader {rd.name} ({rd.sub_id})"
        render_status()
        await self._long_poll(mon, rd, start, cursor)

    async def _long_poll(self, mon: str, rd, start: int, cursor: dict[str, int]) -> None:
        self.abort = js.AbortController.new()
        self.polling = (mon, rd.sub_id)
        first = rd.sub_id not in cursor  # the first read only learns the head: what it finds is no wake
        query = {"cursor": start, "wait": 0 if first else LONG_POLL_S, "limit": 1}
        try:
            r = await self.request(
                "GET", f"/subscriptions/{quote(rd.sub_id, safe='')}/pull", token=rd.token, query=query,
                signal=self.abort.signal,
            )  # fmt: skip
        except asyncio.CancelledError:
            return  # the monitor on screen changed, or Disconnect
        except Unreachable:
            await self.went_away()
            return
        finally:
            self.polling = None
        if r.ok:
            cursor[rd.sub_id] = int(r.body["head"]) + 1
            if r.body["observations"] and first:
                ui.refresh_soon()
            elif r.body["observations"]:
                self.wakes += 1
                js.MP.remoteWakes = self.wakes
                ui.refresh_soon()
        else:
            rd.refused = True  # revoked or retired: the 5 s re-read takes over, and the panel says why
            self.live = f"the reader token of {rd.sub_id} was refused ({r.status})"
            await self.nap(5)

    async def nap(self, seconds: float) -> None:
        """Sleep until `seconds` pass or something pokes the loop (never a busy wait)."""
        self.poke.clear()
        try:
            await asyncio.wait_for(self.poke.wait(), seconds)
        except TimeoutError:
            pass

    def stop(self) -> None:
        self.stopped = True
        if self.abort is not None:
            self.abort.abort()
        self.poke.set()


# ---------------------------------------------------------------------------------------- shapes
def summary(mon: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "name", "head", "active", "visibility", "owner")
    return {k: mon.get(k) for k in keys}


def sub_view(sub: dict[str, Any]) -> dict[str, Any]:
    """A subscription as upkeep's overview shows it; the server does not list unacknowledged seqs."""
    return {"subscription": sub, "delivered_upto": None, "unacked": [], "unacked_more": False}


def parse_time(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return None


def lease_view(lease: dict[str, Any], taken: float) -> dict[str, Any]:
    """A lease as upkeep's overview shows it; the time left is counted from the snapshot's own clock, so
    the page's clock and the server's never need to agree."""
    if lease.get("dead_letter"):
        state = "dead_lettered"
    elif lease.get("holder"):
        state = "held"
    else:
        state = "free"
    left = None
    renewed = parse_time(lease.get("renew_time"))
    if state == "held" and renewed is not None:
        left = round(renewed + float(lease.get("lease_duration_seconds") or 0) - taken, 3)
    return {"lease": lease, "state": state, "expires_in_s": left, "expired": left is not None and left < 0}


def admin_refused(r: Reply) -> Reply:
    code = (r.body or {}).get("code") if isinstance(r.body, dict) else None
    if r.status == 404:
        say = ("This server was started without --allow-admin, so /admin/snapshot does not exist. Restart it "
               f"with `{start_line()} --allow-admin`, or connect with owner and reader tokens only.")  # fmt: skip
    elif r.status == 401:
        say = ("The admin token was refused. Use the one `mp serve --allow-admin` wrote to the file its "
               "start-up lines name (<db>.admin-token).")  # fmt: skip
    else:
        say = f"GET /admin/snapshot answered {r.status} {code}."
    return Reply(r.status, {"code": code or "UNAVAILABLE", "error": say})


# ---------------------------------------------------------------------------------------- the connection
@dataclass
class Connection:
    door: RemoteDoor
    page_session: dict[str, Any]  # the page's own session, set aside while connected
    task: Any = None  # the live loop (held here: a task nobody references may be collected)
    ui_idb: bool = False


# "keys": the keyring in use (the connected server's, or the one being filled before a first Connect);
# "rings": every server's keyring by base, so switching servers never hands one server another's tokens.
STATE: dict[str, Any] = {"conn": None, "keys": Keyring(), "rings": {}}


def keyring_for(base: str, admin: str | None) -> tuple[Keyring, str | None]:
    """The keyring to connect to `base` with (bound to it now if it was never bound), and a sentence when a
    token in the form was kept back because it was given for another server."""
    current: Keyring = STATE["keys"]
    rings: dict[str, Keyring] = STATE["rings"]
    if current.base in (None, base):
        current.base = base
        ring = current
    else:
        rings[current.base] = current
        ring = rings.get(base) or Keyring(base=base)
    said = None
    others = [b for b, r in rings.items() if b != base and admin and r.admin == admin]
    if others:
        admin, said = None, (f"The admin token in the form was given for {others[0]}: it is not sent to {base}. "
                             "Type this server's own admin token to use one.")  # fmt: skip
    ring.admin = admin
    rings[base] = ring
    STATE["keys"] = ring
    return ring, said


def connected() -> RemoteDoor | None:
    conn = STATE["conn"]
    return conn.door if conn is not None else None


def normalise_base(raw: str) -> str | None:
    base = raw.strip().rstrip("/")
    if base.endswith("/mp/v0"):
        base = base[: -len("/mp/v0")]
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        return None
    return f"{parts.scheme}://{parts.netloc}"


async def connect(base: str, admin: str | None, keys: Keyring) -> tuple[bool, str, Reply | None]:
    """Check the server and the tokens, then put the page on it. Returns (ok, what it means, reply)."""
    door = RemoteDoor(base, admin)
    try:
        disc = await door.request("GET", "/discover")
    except Unreachable:
        return False, await door.diagnose(), None
    if not disc.ok or not isinstance(disc.body, dict) or "supportedVersions" not in disc.body:
        return (
            False,
            f"{base}/mp/v0/discover did not answer as a Monitor Protocol server ({disc.status}).",
            disc,
        )
    readers: dict[str, m.Reader] = {}
    try:
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
            readers[sid] = remote_reader(r.body, tok)
    except Unreachable:
        return False, await door.diagnose(), None
    conn = Connection(door, dict(m.S.__dict__), ui_idb=ENGINE.ui_idb)
    fresh = m.Session(owners=dict(keys.owners), readers=readers)
    m.S.__dict__.update(fresh.__dict__)
    m.PIC.__dict__.update(m.Picture().__dict__)
    ENGINE.ui_idb = False  # actions.save() writes nothing of the server into the page's IndexedDB
    ENGINE.remote = door
    compare.RACE.on = False
    STATE["conn"] = conn
    conn.task = asyncio.ensure_future(door.follow())
    seen = "the whole picture (admin token)" if admin else "what the owner and reader tokens allow"
    return True, f"Connected to {base}: this console shows {seen}.", disc


def remote_reader(sub: dict[str, Any], token: str) -> m.Reader:
    rd = m.Reader(sub["id"], sub["subscriber"], token, sub["monitor"], made_by="remote")
    flt = sub.get("filter")
    rd.refused = False  # type: ignore[attr-defined]
    rd.filter_note = (  # type: ignore[attr-defined]
        f"The log is read through reader {sub['subscriber']}, whose filter {json.dumps(flt)} hides the other "
        "rows; the admin token shows them all."
        if flt
        else ""
    )
    return rd


def disconnect() -> None:
    conn = STATE["conn"]
    if conn is None:
        return
    conn.door.stop()
    keep_keys()
    ENGINE.remote = None
    ENGINE.ui_idb = conn.ui_idb
    m.S.__dict__.update(conn.page_session)
    m.PIC.__dict__.update(m.Picture().__dict__)
    STATE["conn"] = None


def keep_keys() -> None:
    """The tokens of the remote session (minted there too) stay in the form for the next Connect."""
    keys: Keyring = STATE["keys"]
    keys.owners.update(m.S.owners)
    for rd in m.S.readers.values():
        keys.readers[rd.sub_id] = rd.token


# ---------------------------------------------------------------------------------------- remember
def remember_ticked() -> bool:
    box = el("server-remember")
    return bool(box and box.checked)


def remember_if_ticked() -> None:
    """Ticked: the URL and every token (those minted while connected too) in localStorage; unticked:
    nothing there."""
    if not remember_ticked():
        js.localStorage.removeItem(REMEMBER_KEY)
        return
    if STATE["conn"] is not None:
        keep_keys()
    keys: Keyring = STATE["keys"]
    rings = dict(STATE["rings"])
    if keys.base is not None:
        rings[keys.base] = keys
    data = {"base": el("server-base").value, "rings": {b: r.to_json() for b, r in rings.items()},
            "unbound": None if keys.base is not None else keys.to_json()}  # fmt: skip
    text = json.dumps(data)
    if str(js.localStorage.getItem(REMEMBER_KEY) or "") != text:
        js.localStorage.setItem(REMEMBER_KEY, text)


def restore() -> None:
    raw = js.localStorage.getItem(REMEMBER_KEY)
    if not raw:
        return
    try:
        data = json.loads(str(raw))
        rings = {str(b): Keyring.of(str(b), r) for b, r in (data.get("rings") or {}).items()}
        unbound = Keyring.of("", data["unbound"]) if data.get("unbound") else None
    except (ValueError, AttributeError, TypeError, KeyError):
        js.localStorage.removeItem(REMEMBER_KEY)
        return
    base = str(data.get("base") or DEFAULT_BASE)
    STATE["rings"] = rings
    if unbound is not None:
        unbound.base = None
    STATE["keys"] = rings.get(normalise_base(base) or "") or unbound or Keyring()
    el("server-base").value = base
    el("server-admin").value = STATE["keys"].admin or ""
    el("server-remember").checked = True
    said = el("server-remembered")
    said.textContent = f"Restored from this browser's localStorage (key {REMEMBER_KEY}): press Connect."


# ---------------------------------------------------------------------------------------- the panel
def masked(token: str) -> str:
    return "••••" + token[-4:] if len(token) > 8 else "••••"


def render_keys() -> None:
    keys: Keyring = STATE["keys"]
    if STATE["conn"] is not None:
        keep_keys()
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
    ui.put(box, line)
    blind = "".join(f"<li>{esc(b)}</li>" for b in door.blind)
    leases = "".join(
        f"<li><code>{esc(x['lease']['subject'])}</code> {esc(x['state'])}"
        + (f" by <code>{esc(x['lease']['holder'])}</code>" if x["lease"].get("holder") else "")
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


LOCAL_ONLY = "While the page is a console for a server, the Story is paused: it teaches on this page's own engine. Disconnect to go on."  # fmt: skip


def set_local_controls(remote: bool) -> None:
    """Story and the race would write their teaching monitors into the server: off while connected (the
    curl tab and Conformance keep running on this page's own engine)."""
    story = el("tabbtn-story")
    story.disabled = remote
    if remote:
        story.title = LOCAL_ONLY
        if story.classList.contains("active"):
            el("tabbtn-playground").click()
    else:
        story.removeAttribute("title")
    el("reset-btn").disabled = remote or ENGINE.mode != "owner"
    el("server-local-note").hidden = not remote


def guard_local(name: str, answer: str) -> None:
    """Refuse a page-engine-only action while connected (the race, a Story step), with the reason."""
    original = ui.ACTIONS[name]

    async def run(target) -> Any:
        if connected() is not None:
            note(answer, "Not while connected to a server: " + LOCAL_ONLY.split(": ", 1)[1], ok=False)
            return None
        return await original.run(target)

    ui.ACTIONS[name] = ui.Action(run, original.answer, original.exclusive)


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
    unbound = STATE["keys"].base is None
    keys, kept_back = keyring_for(base, admin)
    if kept_back:
        el("server-admin").value = ""
    ok, say, reply = await connect(base, keys.admin, keys)
    say = f"{say} {kept_back}" if kept_back else say
    if not ok and unbound:  # tokens typed for a first Connect that failed: not bound to a mistyped address
        keys.base = None
        STATE["rings"].pop(base, None)
    if reply is not None:
        show_one("server-answer", f"connect {base}", reply, say)
    else:
        note("server-answer", say, ok=ok)
    if ok:
        set_local_controls(True)
        remember_if_ticked()
    render_keys()
    render_status()
    await ui.refresh()


@action("server-disconnect", answer="server-answer")
async def disconnect_btn(_el) -> None:
    door = connected()
    remember_if_ticked()
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
    door = connected()
    if kind == "owner":
        STATE["keys"].owners[ident] = token
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
            m.S.readers[ident] = remote_reader(r.body, token)
            door.poke.set()
        STATE["keys"].readers[ident] = token
    el("key-id").value = ""
    el("key-token").value = ""
    remember_if_ticked()
    render_keys()
    where = "localStorage (remember is ticked)" if remember_ticked() else "this tab's memory only"
    note("server-answer", f"{kind} token for {ident} kept in {where}.")
    await ui.refresh()


@action("server-key-drop", answer="server-answer")
async def key_drop(target) -> None:
    kind, ident = target.getAttribute("data-kind"), target.getAttribute("data-ident")
    keys: Keyring = STATE["keys"]
    (keys.owners if kind == "owner" else keys.readers).pop(ident, None)
    if connected() is not None:
        if kind == "owner":
            m.S.owners.pop(ident, None)
        else:
            m.S.readers.pop(ident, None)
    remember_if_ticked()
    render_keys()
    note("server-answer", f"The {kind} token for {ident} is forgotten by this page.")
    await ui.refresh()


def on_remember(_evt) -> None:
    remember_if_ticked()
    el("server-remembered").textContent = (
        f"Kept in this browser's localStorage (key {REMEMBER_KEY}) until you untick this."
        if remember_ticked()
        else "Tokens stay in this tab's memory only: a reload forgets them."
    )


def setup() -> None:
    """Wire the Server panel (app.main calls it once the page is up)."""
    from pyodide.ffi import create_proxy

    el("server-origin").textContent = start_line()
    el("server-base").value = el("server-base").value or DEFAULT_BASE
    restore()
    el("server-remember").addEventListener("change", create_proxy(on_remember))
    guard_local("race-toggle", "race-answer")
    guard_local("story-do", "story-answer")
    js.MP.remoteWakes = 0
    render_keys()
    render_status()
