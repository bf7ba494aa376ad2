"""EngineHost: MonitorService + RestRouter over a MemoryStore, with a durability hook awaited after every
call (the IndexedDB store in the browser). Every caller, the page's UI and the service-worker shim alike,
goes through `call()`, so what a person sees is the real protocol answer (status + JSON).

The page itself also holds an admin door (`read_log`): a second router over the same service with an admin
token minted per page load. The token never leaves this object, and the shim's requests are answered by
the public router, which has no admin routes at all: a request through the service worker never gains
rights it did not send."""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.api.messages import Request, Response
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules import importing
from monitor_protocol.core.service import Feeds, MonitorService
from monitor_protocol.doors import parking
from monitor_protocol.doors.http.targets import decoded_path
from monitor_protocol.doors.parking import Waiters
from monitor_protocol.store.memory import MemoryStore

API_PREFIX = "/mp/v0"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def to_shim_json(self) -> str:
        """The service worker's reply message: `{status, headers, json: <the body, or null>}`, encoded once
        with the C encoder (boot.js pretty-prints it for the fetch() caller; `indent=` would take Python's
        slow pure-Python encoder, and a body nested as a string would be escaped twice)."""
        body = json.dumps(self.body, separators=(",", ":"))
        headers = json.dumps(self.headers, separators=(",", ":"))
        return f'{{"status":{int(self.status)},"headers":{headers},"json":{body}}}'


def parse_shim_request(text: str) -> tuple[str, str, list[tuple[str, str]], dict[str, str], bytes]:
    """The shim's `{method, path, query: [[k, v]...], headers: {..}, body: text}` as call() arguments.
    The Origin header is dropped: the shim is same-origin (docs/protocol.md section 10)."""
    msg = json.loads(text)
    headers = {
        str(k).lower(): str(v) for k, v in (msg.get("headers") or {}).items() if str(k).lower() != "origin"
    }
    query = [(str(k), str(v)) for k, v in (msg.get("query") or [])]
    body = (msg.get("body") or "").encode()
    # the URL's path as the browser gives it, percent-encoded: read as mp serve reads a request's target
    path = decoded_path(str(msg.get("path") or "/"))
    return str(msg.get("method") or "GET").upper(), path, query, headers, body


class EngineHost:
    def __init__(
        self,
        store: MemoryStore | None = None,
        persist: Callable[[], Awaitable[Any]] | None = None,
        clock: Callable[[], float] = time.time,
        start_persist: Callable[[], Any] | None = None,
    ) -> None:
        self.store = store if store is not None else MemoryStore()
        # The page only answers pulls: it holds no SSE stream, runs no push delivery and no MCP server. Every
        # pull's time is written (not held in memory for a while, as a server does): a reload restarts the
        # engine, and the page shows a reader's last pull as it was.
        self.service = MonitorService(self.store, clock=clock, feeds=Feeds(pull=True), lazy_life=False)
        self.router = RestRouter(self.service)  # what the shim (and any fetch) reaches: no admin routes
        self._admin_token = secrets.token_urlsafe(32)  # minted per page load, never shown or forwarded
        self._admin_router = RestRouter(self.service, admin_token=self._admin_token)
        self.persist = persist
        # Starts the same write without waiting for it (IndexedDBStore.start_flush): for the shim, whose
        # JavaScript caller waits for the commit itself before it replies (one crossing fewer per call).
        self.start_persist = start_persist
        self.calls = 0
        # Long polls park in the same registry as every other door's; here the engine calls its listener
        # on the loop itself, so a wake-up needs no hop.
        self.waiters = Waiters()
        self.waiters.attach(self.service)

    async def _durable(self, caller_waits: bool = False) -> None:
        if caller_waits and self.start_persist is not None:
            self.start_persist()
        elif self.persist is not None:
            await self.persist()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        query: list[tuple[str, str]] | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
        admin: bool = False,
        caller_waits_for_commit: bool = False,
    ) -> Reply:
        """One REST call through the router; the changes it made are durable before this returns.
        `admin=True` (the page's own reads only) goes through the admin router with the page's token.
        `caller_waits_for_commit=True` starts the write and returns at once: only for a caller that
        awaits the commit itself before anyone sees the reply (boot.js `MP.serve`)."""
        if not path.startswith(API_PREFIX):
            path = API_PREFIX + path
        pairs = list(query.items()) if isinstance(query, dict) else list(query or [])
        pairs = [(str(k), str(v)) for k, v in pairs if v is not None]
        hdrs = {k.lower(): v for k, v in (headers or {}).items() if k.lower() != "origin"}
        if token:
            hdrs["authorization"] = f"Bearer {token}"
        if admin:
            hdrs["authorization"] = f"Bearer {self._admin_token}"
        router = self._admin_router if admin else self.router
        if raw_body is None:
            raw_body = b"" if body is None else json.dumps(body).encode()
        if raw_body:
            hdrs.setdefault("content-type", "application/json")
        request = Request(method.upper(), path, query=pairs, headers=hdrs, body=raw_body)
        self.calls += 1
        response, mark = self._handle_marked(router, request)
        await self._durable(caller_waits_for_commit)
        if response.long_poll is not None:
            response = await self._long_poll(router, request, response, mark, caller_waits_for_commit)
        return Reply(response.status, response.body, dict(response.headers))

    def _handle_marked(self, router: RestRouter, request: Request) -> tuple[Response, int]:
        """The router's answer, and the registry's mark for its monitor, read right after the pull ran (an
        append while the write is awaited then wakes the poll at once instead of being missed)."""
        response = router.handle(request)
        monitor = response.long_poll.monitor if response.long_poll is not None else ""
        return response, self.waiters.mark(monitor)

    async def _long_poll(
        self, router: RestRouter, request: Request, response: Response, mark: int, caller_waits: bool
    ) -> Response:
        """Hold an empty pull (parking.hold) until its monitor gets an append (then ask again) or its wait
        runs out; here the engine runs on the loop itself, so a re-check is the router's answer at once."""
        assert response.long_poll is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, response.long_poll.wait_seconds)
        again = response.long_poll.again or request  # an ack-and-pull re-checks as a plain pull

        async def recheck(remaining: float) -> parking.Outcome:
            # wait is a whole number of seconds on the wire: ask again with what is left, rounded up.
            again.query = [(k, v) for k, v in again.query if k != "wait"] + [
                ("wait", str(math.ceil(max(0.0, remaining))))
            ]
            answer, mark = self._handle_marked(router, again)
            await self._durable(caller_waits)
            waiting = answer.long_poll.monitor if answer.long_poll is not None else None
            return answer, waiting, mark

        held: Response = await parking.hold(self.waiters, response.long_poll.monitor, mark, deadline, recheck)
        held.long_poll = None
        return held

    async def read_log(self, monitor_id: str, from_seq: int = 1, limit: int = 200) -> Reply:
        """The monitor's log without a subscription (GET /mp/v0/admin/log): no cursor, no commit, nothing
        appended, so the timeline never shows up in the state's counters or gaps."""
        query = {"monitor": monitor_id, "from": from_seq, "limit": limit}
        return await self.call("GET", "/admin/log", query=query, admin=True)

    async def overview(self, monitor_id: str | None, from_seq: int = 1, limit: int = 200) -> Reply:
        """The page's whole picture in one read (MonitorService.overview): every monitor, and one monitor's
        state, subscriptions, leases and a page of its log. The page's own door, like read_log: no router,
        no token, nothing a forwarded request can reach."""
        try:
            body = self.service.overview(monitor_id, from_seq, limit)
        except ProtocolError as exc:
            await self._durable()
            return Reply(exc.status, exc.body())
        await self._durable()  # a read may run the lazy sweep, whose changes are kept like any other
        return Reply(200, body)

    # ---------------------------------------------------------------------------- share and restore
    async def export_log(self, monitor_id: str) -> Reply:
        """The page's download (importing.py): `{name, text, lines}`, the JSON Lines file of every retained
        row of the monitor and its file name `<monitor>-<UTC time>.jsonl`. The page's own door, like read_log."""
        try:
            rows = self.service.export_log(monitor_id)
        except ProtocolError as exc:
            await self._durable()
            return Reply(exc.status, exc.body())
        await self._durable()
        name = importing.export_name(monitor_id, self.service.clock())
        return Reply(200, {"name": name, "text": importing.to_jsonl(rows), "lines": len(rows)})

    def check_log(self, text: str) -> Reply:
        """The import's rules applied without writing anything (the page's preview): 200 with the summary,
        or the whole-file refusal (TOO_LARGE, not UTF-8)."""
        try:
            checked = importing.check_log(text)
        except ProtocolError as exc:
            return Reply(exc.status, exc.body())
        return Reply(200, {"ok": checked.ok, **checked.summary()})

    async def import_log(self, monitor_id: str, text: str) -> Reply:
        """Import a JSON Lines log as a NEW monitor (MonitorService.import_log): 201 with the new owner token
        shown once, or the refusal (INVALID with every refused line, DUPLICATE, TOO_LARGE), nothing written."""
        try:
            body = self.service.import_log(monitor_id, text)
        except ProtocolError as exc:
            await self._durable()
            return Reply(exc.status, exc.body())
        await self._durable()
        return Reply(201, body)

    async def handle_shim(self, text: str) -> str:
        """Answer one forwarded request from the service worker (JSON in, JSON out). The write is started
        here and awaited by the JavaScript caller (boot.js `MP.serve`) before the reply leaves."""
        try:
            method, path, query, headers, body = parse_shim_request(text)
        except (ValueError, TypeError, AttributeError) as exc:
            return Reply(
                400, {"code": "INVALID", "error": f"malformed shim request: {exc}", "done": []}
            ).to_shim_json()
        reply = await self.call(
            method, path, query=query, headers=headers, raw_body=body, caller_waits_for_commit=True
        )
        return reply.to_shim_json()

    async def sweep(self) -> int:
        """Lease expiry and the mute sweep (docs/protocol.md P6); durable like any other call."""
        n = self.service.sweep()
        await self._durable()
        return n
