"""The door to a running `mp serve`: door.Engine's interface (`call`, `overview`, the same Reply and the same
overview shape), built from the server's own routes, and a live loop that wakes the redraw when the remote
log grows. The Server panel (web/remote.py) connects it; its tokens come from web/server_keys.py.

Requests go out through the client's browser transport (`monitor_protocol.client.webhttp.AsyncClient`: fetch
with a timeout, aborted when the caller gives up), the same layer `AsyncClient` uses in Pyodide. The page
does not call `AsyncClient`'s methods themselves: `AsyncClient.request` answers a success with its JSON
only, and the page shows (and branches on) the status a server gave, 201 or 200.

Every reply is checked before it is used (web/replies.py: the strict JSON parser, the project's schemas,
the envelopes): one that is not what the protocol serves is refused whole and said in the Server panel
(`refused`), and the page goes on.

What the door can see depends on the tokens it is given (the REST binding has no route listing a
monitor's readers or leases for anyone but the operator):
- the admin token (`mp serve --allow-admin`): GET /admin/snapshot (every monitor, its state, every
  subscription with its lag, every lease) and GET /admin/log (the whole log): the whole picture;
- owner and reader tokens: the monitors they may see, a monitor's state, each held reader's subscription,
  and the log as a held reader sees it (read-only replay, `pull?cursor=`); no leases, no other readers.
The picture says what it could not see, and which token would show it (`blind`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import js
import model as m
import replies
from monitor_protocol.client import webhttp
from monitor_protocol.doors.browser import Reply
from pyodide.ffi import to_js
from replies import BadReply

LONG_POLL_S = 25  # below mp serve's 50 s cap, and short enough that a stale poll is never long
BACKOFF_S = (1, 2, 4, 8, 15, 30)  # the wait before each retry while the server is away
LOG_PAGE = 200
TIMEOUT_S = 10.0  # one request, a long poll's wait on top


def origin() -> str:
    return str(js.location.origin)


def start_line() -> str:
    return f"mp serve --allow-origin {origin()}"


class Unreachable(Exception):
    """The request never got an HTTP answer: the server is away, or the browser refused it (CORS)."""


class RemoteDoor:
    """door.Engine's `call` and `overview`, answered by a running `mp serve` over fetch (CORS)."""

    def __init__(self, base: str, admin: str | None, on_status: Callable[[], None]) -> None:
        self.base = base
        self.api = base + "/mp/v0"
        self.host = urlsplit(base).netloc
        self.admin = admin or None
        self.on_status = on_status  # the Server panel redraws its status line (and the page soon after)
        self.http = webhttp.AsyncClient()
        self.away_since: float | None = None  # time.time() when the server stopped answering
        self.back_at: float | None = None
        self.why_away = ""
        self.refused = ""  # the last reply the page refused (not what the protocol serves), in a sentence
        self.live = ""  # how the page follows the server, in a sentence
        self.blind: list[str] = []  # what the last picture could not see, and which token would show it
        self.filter_notes: dict[str, str] = {}  # subscription id -> why its replay hides rows
        self.refused_readers: set[str] = set()  # reader tokens the server refused: not used to follow
        self.stopped = False
        self.poke = asyncio.Event()  # wakes the live loop: the server went away, the monitor changed
        self.poll: tuple[str, asyncio.Future] | None = None  # (monitor, request) of the long poll in flight
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
        wait: int = 0,
    ) -> Reply:
        """One HTTP request to the server, its answer checked (replies.answer); Unreachable when no HTTP
        answer came back, BadReply when the answer is not what the protocol serves."""
        url = self.api + path + ("?" + urlencode(query) if query else "")
        headers = {"accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["content-type"] = "application/json"
            data = json.dumps(body).encode()
        try:
            got = await self.http.request(method, url, data, headers, TIMEOUT_S + wait)
        except webhttp.SendFailed as exc:  # no answer, or one the browser would not show (CORS)
            raise Unreachable(exc.reason) from exc
        self.came_back()
        parsed = replies.answer(
            method, path, got.status_code, replies.decode(got.content, f"{method} {path}")
        )
        return Reply(got.status_code, parsed)

    async def diagnose(self) -> str:
        """Why no answer came. Not a protocol request, so not through the client: a `no-cors` probe
        reaches a running server even when CORS hides its answers, so a server that answers it is up and
        refusing this page's origin."""
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
            self.on_status()

    def came_back(self) -> None:
        if self.away_since is not None:
            self.away_since = None
            self.back_at = time.time()
            self.poke.set()
            self.on_status()

    def unavailable(self) -> Reply:
        return Reply(503, {"code": "UNAVAILABLE", "error": self.why_away or f"{self.base} does not answer."})

    def refuse(self, why: BadReply) -> Reply:
        """A reply the page will not use: said in the Server panel, and answered as the page's own 502."""
        self.refused = f"{time.strftime('%H:%M:%S')}: {why}"
        self.on_status()
        return Reply(
            502, {"code": "UNAVAILABLE", "error": f"The server's reply was refused by this page: {why}"}
        )

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, query: dict | None = None
    ) -> Reply:
        try:
            return await self.request(method, path, body, token, query)
        except Unreachable:
            await self.went_away()
            return self.unavailable()
        except BadReply as why:
            return self.refuse(why)

    # ---------------------------------------------------------------------------------- the picture
    async def overview(self, monitor: str | None, from_seq: int) -> Reply:
        """upkeep.overview's shape from the server's routes (`blind` says what it could not see)."""
        if self.away_since is not None:  # the live loop probes, with backoff, and redraws once it is back
            return self.unavailable()
        if self.poll is not None and self.poll[0] != monitor:
            self.poll[1].cancel()  # the long poll watches the monitor that was on screen
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
        except BadReply as why:
            return self.refuse(why)
        if reply.ok and self.refused:
            self.refused = ""  # the server answers as it should again
            self.on_status()
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
                for mon in r.body["monitors"]:
                    seen.setdefault(mon["id"], mon)
        blind = [
            "Leases: only the admin token shows them (GET /admin/snapshot). Connect with the admin token of "
            "`mp serve --allow-admin` to see who holds what.",
            "Other readers: a reader token shows its own subscription only; the admin token lists every one.",
        ]
        # Past a server's first page of monitors: the monitors these tokens hold, asked one by one.
        held = [*m.S.owners.items(), *((r.monitor, r.token) for r in m.S.readers.values())]
        for mid, tok in held:
            if mid not in seen:
                r = await self.request("GET", f"/monitors/{quote(mid, safe='')}", token=tok)
                if r.ok:
                    seen[mid] = r.body
        missing = [mid for mid in m.S.owners if mid not in seen]
        if missing:
            blind.append(f"Owner token(s) of {', '.join(missing)}: the server shows no such monitor for it.")
        out: dict[str, Any] = {"monitors": [summary(x) for x in seen.values()], "monitor": None}
        if monitor is None or monitor not in seen:
            self.blind = blind
            if monitor is None:
                return Reply(200, out)
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
        log = await self._replay_log(monitor, from_seq, readers)
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
        elif readers and self.filter_notes.get(readers[0].sub_id):
            blind.append(self.filter_notes[readers[0].sub_id])
        self.blind = blind
        out["monitor"] = {
            "monitor": seen[monitor],
            "state": state.body if state.ok else None,
            "subscriptions": views,
            "leases": [],
            "log": log,
        }
        return Reply(200, out)

    async def _replay_log(self, monitor: str, from_seq: int, readers: list) -> dict[str, Any] | None:
        for rd in readers:
            query = {"cursor": max(from_seq, 1), "limit": LOG_PAGE}
            path = f"/subscriptions/{quote(rd.sub_id, safe='')}/pull"
            r = await self.request("GET", path, token=rd.token, query=query)
            if not r.ok and r.body.get("code") == "CURSOR_EXPIRED" and r.body.get("retention_floor"):
                query["cursor"] = r.body["retention_floor"]
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
                self.on_status()
                await self.nap(5)

    async def _follow_once(self, misses: list[int], cursor: dict[str, int]) -> None:
        if self.away_since is not None:
            wait = BACKOFF_S[min(misses[0], len(BACKOFF_S) - 1)]
            misses[0] += 1
            self.live = f"retrying in {wait} s"
            self.on_status()
            await self.nap(wait)
            try:
                await self.request("GET", "/discover")
                cursor.clear()  # a server started again may hold another log: learn its head afresh
            except Unreachable:
                await self.went_away()
            except BadReply as why:
                self.refuse(why)
            return
        misses[0] = 0
        mon = m.S.monitor
        rd = next(
            (r for r in m.S.readers.values() if r.monitor == mon and r.sub_id not in self.refused_readers),
            None,
        )
        if mon is None or rd is None:
            self.live = (
                "re-read every 5 s (the page's timer). A reader token of this monitor makes it instant "
                "(a long poll)."
                if mon
                else "pick a monitor"
            )
            self.on_status()
            await self.nap(30)
            return
        head = int(((m.PIC.monitor or {}).get("monitor") or {}).get("head") or 0)
        start = max(cursor.get(rd.sub_id, 0), head + 1)
        self.live = f"live: long poll through reader {rd.name} ({rd.sub_id})"
        self.on_status()
        await self._long_poll(mon, rd, start, cursor)

    async def _long_poll(self, mon: str, rd, start: int, cursor: dict[str, int]) -> None:
        first = rd.sub_id not in cursor  # the first read only learns the head: what it finds is no wake
        wait = 0 if first else LONG_POLL_S
        query = {"cursor": start, "wait": wait, "limit": 1}
        path = f"/subscriptions/{quote(rd.sub_id, safe='')}/pull"
        task = asyncio.ensure_future(self.request("GET", path, token=rd.token, query=query, wait=wait))
        self.poll = (mon, task)
        try:
            r = await task
        except asyncio.CancelledError:
            return  # the monitor on screen changed, or Disconnect
        except Unreachable:
            await self.went_away()
            return
        except BadReply as why:
            self.refuse(why)
            await self.nap(5)
            return
        finally:
            self.poll = None
        if r.ok:
            cursor[rd.sub_id] = r.body["head"] + 1
            if r.body["observations"] and not first:
                self.wakes += 1
                js.MP.remoteWakes = self.wakes
            if r.body["observations"]:
                self.on_status()
        else:
            self.refused_readers.add(
                rd.sub_id
            )  # revoked or retired: the 5 s re-read takes over, and says why
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
        if self.poll is not None:
            self.poll[1].cancel()
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
    code = r.body.get("code") if isinstance(r.body, dict) else None
    if r.status == 404:
        say = ("This server was started without --allow-admin, so /admin/snapshot does not exist. Restart it "
               f"with `{start_line()} --allow-admin`, or connect with owner and reader tokens only.")  # fmt: skip
    elif r.status == 401:
        say = ("The admin token was refused. Use the one `mp serve --allow-admin` wrote to the file its "
               "start-up lines name (<db>.admin-token).")  # fmt: skip
    else:
        say = f"GET /admin/snapshot answered {r.status} {code}."
    return Reply(r.status, {"code": code or "UNAVAILABLE", "error": say})


def remote_reader(sub: dict[str, Any], token: str) -> tuple[m.Reader, str]:
    """A reader the console holds a token for (a checked subscription), and why its replay hides rows."""
    rd = m.Reader(sub["id"], sub["subscriber"], token, sub["monitor"], made_by="remote")
    flt = sub.get("filter")
    note = (
        f"The log is read through reader {sub['subscriber']}, whose filter {json.dumps(flt)} hides the other "
        "rows; the admin token shows them all."
        if flt
        else ""
    )
    return rd, note
