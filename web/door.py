"""The page's way into the engine. The tab that holds the Web Lock owns the engine (EngineHost over the
IndexedDB-backed store) and answers the service worker; any other tab is a follower: its calls go through
the service worker to the owner, and its picture is asked of the owner over a BroadcastChannel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import js
from monitor_protocol.client import webhttp
from monitor_protocol.doors.browser import EngineHost, Reply
from monitor_protocol.store.indexeddb import IndexedDBStore
from monitor_protocol.store.memory import MemoryStore
from pyodide.ffi import create_proxy

MP = js.MP
OFFLINE_TITLE = (
    "The server did not answer: this page came from the copies the service worker kept. The engine and "
    "your log work as before; reload once the server is back."
)


def said_offline(chip: Any, label: Any) -> None:
    """Every page's status chip (the playground, a docs page, an embed) says when the page itself came from
    the service worker's copies (boot.js sets MP.fromCopies and fires mp:from-copies when the worker says)."""
    if getattr(MP, "fromCopies", False) and str(label.textContent).startswith("ready · "):
        label.textContent = "ready · offline copy · " + str(label.textContent)[len("ready · ") :]
        title = str(chip.title or "")
        chip.title = title + ("\n" if title else "") + OFFLINE_TITLE if OFFLINE_TITLE not in title else title


def when_offline(redraw: Callable[[], None]) -> None:
    """Draw the chip again when the worker says, after start, that the page came from its copies."""
    js.document.addEventListener("mp:from-copies", create_proxy(lambda _e: redraw()))


FOLLOWER_TIMEOUT_S = 60.0  # the service worker gives the owner tab 5 s (plus a long poll's wait) to answer


class Engine:
    def __init__(self) -> None:
        self.mode: str | None = None  # "owner" | "follower"
        self.host: EngineHost | None = None
        self.storage = "memory"
        self.storage_reason: str | None = None
        self.ui_idb = False
        self.on_change: Callable[[], None] = lambda: None  # the page redraws; set by app.main
        # A running `mp serve` the page is a console for (web/remote.py): while set, `call` and `overview`
        # go to it; the page's own engine keeps running underneath (service worker, other tabs, sweep).
        self.remote: Any = None
        self.http = webhttp.AsyncClient()  # a follower's requests, through the service worker

    async def open_ui_storage(self) -> None:
        try:
            await MP.idb.open()
            self.ui_idb = True
        except Exception as exc:  # IndexedDB refused: memory only, said plainly in the status chip
            self.ui_idb = False
            self.storage_reason = str(exc)

    async def open(self, follower: Callable[[], None], took_over: Callable[[], Awaitable[None]]) -> None:
        """This namespace's engine, as every page opens it: the storage, then the owner when the Web Lock is
        free, else a follower (`follower()` says so on the page) that becomes the owner as soon as the owner
        tab or frame goes (then `took_over()` lets the page catch up)."""
        await self.open_ui_storage()
        if await MP.acquireLock(False):
            await self.start_owner()
            return
        self.mode = "follower"
        follower()

        async def own_when_free() -> None:
            await MP.acquireLock(True)
            await self.start_owner()
            await took_over()

        asyncio.ensure_future(own_when_free())

    async def start_owner(self) -> int:
        memory = MemoryStore()
        idb = IndexedDBStore(memory, MP.idb)
        restored = 0
        if self.ui_idb:
            idb.durable = True
            restored = await idb.restore()
        self.storage = "indexeddb" if idb.durable else "memory"
        self.host = EngineHost(memory, persist=idb.flush, start_persist=idb.start_flush)
        self.mode = "owner"

        async def shim(text: str) -> str:
            reply = await self.host.handle_shim(text)
            self.changed()  # a curl in this tab, a fetch from another tab: the picture follows
            return reply

        MP.handler = create_proxy(lambda text: asyncio.ensure_future(shim(str(text))))
        MP.viewProvider = create_proxy(lambda text: asyncio.ensure_future(self._answer_view(str(text))))
        MP.announceOwner()
        return restored

    def changed(self) -> None:
        """The engine changed: redraw this tab, and tell the other tabs to redraw theirs."""
        self.on_change()
        if self.mode == "owner":
            MP.broadcastChanged()

    async def _answer_view(self, text: str) -> str:
        req = json.loads(text)
        reply = await self.host.overview(req.get("monitor"), int(req.get("from") or 1))
        return json.dumps({"status": reply.status, "body": reply.body})

    async def overview(self, monitor: str | None, from_seq: int) -> Reply:
        """Every monitor, and one monitor's state, subscriptions, leases and log from `from_seq`."""
        if self.remote is not None:
            return await self.remote.overview(monitor, from_seq)
        if self.mode == "owner":
            return await self.host.overview(monitor, from_seq)
        text = await MP.askView(json.dumps({"monitor": monitor, "from": from_seq}))
        if not text:  # no owner answered: JS null arrives as a falsy JsNull, not None
            return Reply(503, {"code": "UNAVAILABLE", "error": "the tab that owns the engine did not answer"})
        msg = json.loads(str(text))
        return Reply(int(msg["status"]), msg["body"])

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, query: dict | None = None
    ) -> Reply:
        if self.remote is not None:  # the server's change: this tab redraws; other tabs show their engine
            reply = await self.remote.call(method, path, body, token, query)
            self.on_change()
            return reply
        if self.mode == "owner":
            reply = await self.host.call(method, path, body=body, token=token, query=query)
        else:
            reply = await self._fetch(method, path, body, token, query)
        self.changed()  # even a pull changes the picture: what the reader was given, its last pull
        return reply

    async def _fetch(self, method: str, path: str, body: Any, token: str | None, query: dict | None) -> Reply:
        """A follower's call: through the service worker to the owner tab, sent by the client's browser
        transport (webhttp, as AsyncClient sends in Pyodide), with a long poll's wait on top of the timeout."""
        url = "./mp/v0" + path + ("?" + urlencode(query) if query else "")
        headers = {"accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["content-type"] = "application/json"
            data = json.dumps(body).encode()
        wait = str((query or {}).get("wait", ""))
        try:
            got = await self.http.request(
                method,
                url,
                data,
                headers,
                FOLLOWER_TIMEOUT_S + int(wait) if wait.isdigit() else FOLLOWER_TIMEOUT_S,
            )
        except webhttp.SendFailed as exc:
            return Reply(
                503, {"code": "UNAVAILABLE", "error": f"The engine's tab did not answer: {exc.reason}"}
            )
        try:
            parsed = json.loads(got.content) if got.content else None
        except ValueError:
            parsed = {"code": "UNAVAILABLE", "error": got.content.decode("utf-8", "replace")[:400]}
        return Reply(got.status_code, parsed)


ENGINE = Engine()
