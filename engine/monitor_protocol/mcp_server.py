"""The MCP door (PROTOCOL.md section 9, extension `ai.mentu/monitors`), on the official MCP Python SDK.

Two backends behind the same tools and resources:

* embedded (`EmbeddedBackend`): a `MonitorService` on a SQLite file, entered by one engine thread (the store
  is opened on it). The mute sweep and lease expiry run on a one-second timer; appends wake resource
  subscribers through `service.add_listener`, and a pull asked to `wait` is held until an append.
* remote (`RemoteBackend`): an `mp serve` reached through `monitor_protocol.client.AsyncClient`. A subscribed
  resource is followed by a watch subscription of this process (`mcp:resources-<hex>`, observe only, from the
  head) held in a long poll against the server; it is retired when nobody listens any more.

Tools take their token as the `token` argument; when absent, the environment supplies it by role, as for the
CLI: owner tools (publish, configure, subscribe) MP_OWNER_TOKEN then MP_TOKEN, reader tools (pull, ack, seek,
renew, retire_subscription, lease_*) MP_READER_TOKEN then MP_TOKEN, the rest (discover, list, get, state,
create, and resources) MP_TOKEN then MP_OWNER_TOKEN. Every tool declares an output schema and its
annotations; arguments are checked against the input schema (bounds included) before anything runs. A
protocol refusal comes back as a tool error (`isError: true`) whose text starts with the code and whose
structured content is the REST error body.

Resource updates reach both MCP eras: `resources/subscribe` (handshake era) gets
`notifications/resources/updated` on its session, and `subscriptions/listen` (2026-07-28) streams get the same
notification through the SDK's subscription bus; at most one per resource per 250 ms, the last change always
notified. A subscription the environment's token cannot serve (no such monitor, an invisible one) is refused.
Notifications are wake-ups only; delivery is pull + ack.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import sqlite3
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated

from . import __version__
from .errors import ProtocolError
from .validation import as_int
from .vocab import (
    CAPABILITIES,
    EXTENSION_ID,
    HORIZONS,
    IDEMPOTENCY_KEY_MAX_CHARS,
    JSONRPC_CODE,
    MAX_INTEGER,
    MAX_LEASE_SECONDS,
    MAX_LIMIT,
    ORIGINS,
    PROTOCOL_VERSION,
    PROTOCOLS,
    RESET_POLICIES,
    TIERS,
    VERIFICATIONS,
    VISIBILITIES,
)
from .vocab import MAX_WAIT_SECONDS as _MAX_WAIT

log = logging.getLogger("monitor_protocol.mcp")

SERVER_NAME = "monitor-protocol"
SWEEP_INTERVAL_SECONDS = 1.0
MAX_WAIT_SECONDS = float(_MAX_WAIT)
NOTIFY_INTERVAL_SECONDS = 0.25  # at most one resources/updated per resource in this window
WATCH_WAIT_SECONDS = 30  # --base: the long poll a watch subscription holds against the server
WATCH_MUTE_SECONDS = 3600  # a watch left behind by a killed process is retired by the server's sweep
WATCH_BACKOFF_MAX_SECONDS = 10.0
RESOURCE_URI = re.compile(r"^monitor://([^/]+)/(definition|state)$")

OWNER_ENV = ("MP_OWNER_TOKEN", "MP_TOKEN")
READER_ENV = ("MP_READER_TOKEN", "MP_TOKEN")
VIEWER_ENV = ("MP_TOKEN", "MP_OWNER_TOKEN")


def instructions(where: str) -> str:
    """What the agent is told at initialize: the protocol, the cycle, and where the monitors are kept."""
    return (
        f"Monitor Protocol v{PROTOCOL_VERSION} (MCP extension {EXTENSION_ID}; server {SERVER_NAME} "
        f"{__version__}). {where} A monitor is an append-only log of observations with a computed state. "
        "To follow one: monitor_subscribe (keep the reader token it returns), then repeat monitor_pull and, "
        "once you have handled the batch, monitor_ack with the pull's `next`. Pull never commits; only ack "
        "does. Give monitor_publish an idempotency_key so a retry cannot append twice. Work items are claimed "
        "with lease_claim and finished with lease_complete. Resources monitor://{id}/definition and "
        "monitor://{id}/state can be subscribed to for wake-ups."
    )


INSTRUCTIONS = instructions("")


class ToolFailure(Exception):
    """A refusal or a transport failure, carried as the REST error body `{code, error, done, ...}`."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('code')}: {body.get('error')}")
        self.body = body


class DatabaseUnavailable(RuntimeError):
    """The embedded database could not be opened (the message names the file and the reason)."""


def env_token(roles: tuple[str, ...]) -> str | None:
    for name in roles:
        value = os.environ.get(name)
        if value:
            return value
    return None


class Coalescer:
    """At most one `send(key)` per key per `interval` seconds. The first change of a quiet key is sent at
    once; changes inside the window are folded into one send when the window closes, so the last change is
    always followed by a send."""

    def __init__(
        self, send: Callable[[str], Awaitable[None]], interval: float = NOTIFY_INTERVAL_SECONDS
    ) -> None:
        self.send = send
        self.interval = interval
        self._last: dict[str, float] = {}
        self._pending: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def changed(self, key: str) -> None:
        """Called on the loop for every change of `key`."""
        if key in self._pending:
            return  # a send is already due at the end of this window; it will carry this change too
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._last.get(key, float("-inf")) + self.interval
        if now >= due:
            self._fire(key)
        else:
            self._pending[key] = loop.call_later(due - now, self._fire, key)

    def _fire(self, key: str) -> None:
        self._pending.pop(key, None)
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._last[key] = now
        if len(self._last) > 1024:  # forget keys whose window is long closed
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval}
        task = loop.create_task(self.send(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for handle in self._pending.values():
            handle.cancel()
        self._pending.clear()


# ---------------------------------------------------------------------------------------------- backends


class EmbeddedBackend:
    """`MonitorService` on SQLite, entered only from one engine thread."""

    def __init__(self, db_path: str, *, sweep_interval: float = SWEEP_INTERVAL_SECONDS) -> None:
        self.db_path = db_path
        self.sweep_interval = sweep_interval
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mp-mcp-engine")
        self.service: Any = None
        self.store: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._append_waiters: dict[str, set[asyncio.Event]] = {}
        self._on_change: Callable[[str], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def where(self) -> str:
        return (
            f"Monitors are kept in the SQLite database {self.db_path} (embedded); tell the user this path "
            "when they ask where their monitors live."
        )

    async def start(self, on_change: Callable[[str], None]) -> None:
        import time

        from .service import MonitorService
        from .store.sqlite import SQLiteStore, StoreCorrupt, StoreLocked

        self.loop = asyncio.get_running_loop()
        self._on_change = on_change

        def build() -> None:
            try:
                self.store = SQLiteStore(self.db_path)
            except (StoreLocked, StoreCorrupt):
                raise
            except (sqlite3.Error, OSError) as exc:
                raise DatabaseUnavailable(f"cannot open the database {self.db_path}: {exc}") from exc
            self.service = MonitorService(self.store, clock=time.time)
            self.service.add_listener(self._appended)

        await self._engine(build)
        if self.sweep_interval:
            self._tasks.append(asyncio.create_task(self._sweeper(), name="mp-mcp-sweep"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks.clear()
        close = getattr(self.store, "close", None)
        if close is not None:
            await self._engine(close)
        self.executor.shutdown(wait=True)

    async def watch(self, monitor_id: str) -> None:
        """Appends reach `on_change` through the service's listener: nothing to set up."""

    async def unwatch(self, monitor_id: str) -> None:
        pass

    async def _engine(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, fn, *args)

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                await self._engine(self.service.sweep)
            except Exception:
                log.exception("sweep failed")

    def _appended(self, monitor_id: str, head: int) -> None:
        # On the engine thread after a committed append: hop to the loop, never block here.
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._wake, monitor_id)
        except RuntimeError:
            pass

    def _wake(self, monitor_id: str) -> None:
        for event in self._append_waiters.get(monitor_id, ()):
            event.set()
        if self._on_change is not None:
            self._on_change(monitor_id)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.service, method)
        try:
            return await self._engine(lambda: fn(*args, **kwargs))
        except ProtocolError as err:
            raise ToolFailure(err.body()) from err

    # The service's own signatures (docs/ENGINE_API.md).
    async def discover(self) -> Any:
        return await self.call("discover")

    async def list_monitors(self, token: str | None) -> Any:
        return await self.call("list_monitors", token)

    async def get_monitor(self, monitor_id: str, token: str | None) -> Any:
        return await self.call("get_monitor", monitor_id, token)

    async def create_monitor(self, body: dict[str, Any], token: str | None) -> Any:
        return await self.call("create_monitor", body, token)

    async def configure(self, monitor_id: str, action: str, body: dict[str, Any], token: str | None) -> Any:
        return await self.call("configure", monitor_id, action, body, token)

    async def publish(self, monitor_id: str, body: dict[str, Any], token: str | None) -> Any:
        return await self.call("publish", monitor_id, body, token)

    async def state(self, monitor_id: str, token: str | None) -> Any:
        return await self.call("state", monitor_id, token)

    async def subscribe(self, body: dict[str, Any], token: str | None) -> Any:
        return await self.call("subscribe", body, token)

    async def pull(
        self,
        sub_id: str,
        token: str | None,
        *,
        cursor: Any = None,
        limit: Any = None,
        wait: float = 0.0,
        filter: dict[str, Any] | None = None,
    ) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(float(wait or 0), MAX_WAIT_SECONDS))
        while True:
            reply = await self.call("pull", sub_id, token, cursor=cursor, limit=limit, filter=filter)
            remaining = deadline - loop.time()
            if reply.get("observations") or reply.get("scan_capped") or remaining <= 0:
                return reply
            event = asyncio.Event()
            monitor_id = reply.get("monitor", "")
            self._append_waiters.setdefault(monitor_id, set()).add(event)
            try:
                # An append may have landed between the pull and the registration: look once more first.
                reply = await self.call("pull", sub_id, token, cursor=cursor, limit=limit, filter=filter)
                if reply.get("observations") or reply.get("scan_capped"):
                    return reply
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    pass
            finally:
                waiters = self._append_waiters.get(monitor_id)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._append_waiters[monitor_id]

    async def ack(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self.call("ack", sub_id, token, body)

    async def seek(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self.call("seek", sub_id, token, body)

    async def renew(self, sub_id: str, token: str | None) -> Any:
        return await self.call("renew", sub_id, token)

    async def retire_subscription(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self.call("retire_subscription", sub_id, token, body)

    async def lease(self, sub_id: str, token: str | None, action: str, body: dict[str, Any]) -> Any:
        return await self.call("lease", sub_id, token, action, body)


class RemoteBackend:
    """An `mp serve` over HTTP, through the async client. A watched monitor is followed by a watch
    subscription of this process held in a long poll (`wait`), so a change wakes it as soon as it lands."""

    def __init__(self, base: str, *, watch_wait: int = WATCH_WAIT_SECONDS) -> None:
        from .client import AsyncClient

        self.base = base
        self.client = AsyncClient(base)
        self.watch_wait = watch_wait
        # One subscriber name per process: its watch subscriptions are told apart from everyone else's.
        self.subscriber = f"mcp:resources-{secrets.token_hex(4)}"
        self._on_change: Callable[[str], None] | None = None
        self._watches: dict[str, dict[str, Any]] = {}  # monitor -> {id, token, task}
        self._lock = asyncio.Lock()

    def where(self) -> str:
        return f"Monitors are kept by the Monitor Protocol server at {self.base} (this MCP server is its client)."

    async def start(self, on_change: Callable[[str], None]) -> None:
        self._on_change = on_change

    async def close(self) -> None:
        async with self._lock:
            watched = list(self._watches)
        if watched:
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(self.unwatch(m) for m in watched), return_exceptions=True), 2.0
                )
            except TimeoutError:
                pass
        await self.client.aclose()

    def watched(self) -> set[str]:
        return set(self._watches)

    async def watch(self, monitor_id: str) -> None:
        """Open (once per monitor) the watch subscription and its long-poll task; a refusal (no such
        monitor, an invisible one, no observe grant) or an unreachable server raises ToolFailure."""
        async with self._lock:
            if monitor_id in self._watches:
                return
            reply = await self._subscribe_watch(monitor_id, env_token(VIEWER_ENV))
            watch = {"id": reply["subscription"]["id"], "token": reply["token"]}
            self._watches[monitor_id] = watch
            watch["task"] = asyncio.create_task(
                self._follow(monitor_id, watch), name=f"mp-mcp-watch-{monitor_id}"
            )

    async def unwatch(self, monitor_id: str) -> None:
        async with self._lock:
            watch = self._watches.pop(monitor_id, None)
        if watch is None:
            return
        task = watch.get("task")
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        try:
            await self._req(
                "POST",
                f"/subscriptions/{_seg(watch['id'])}/retire",
                watch["token"],
                {"reason": "no MCP client listens any more"},
            )
        except ToolFailure as failure:
            log.info("watch of %s not retired: %s", monitor_id, failure)

    async def _subscribe_watch(self, monitor_id: str, token: str | None) -> Any:
        body = {
            "monitor": monitor_id,
            "subscriber": self.subscriber,
            "capabilities": ["observe"],
            "from": "head",
            "retire_after_mute_seconds": WATCH_MUTE_SECONDS,
        }
        return await self._req("POST", "/subscriptions", token, body)

    def _own(self, observation: Any) -> bool:
        """This process's own subscribe/retire rows: not a change anybody needs to hear about."""
        return isinstance(observation, dict) and observation.get("actor") == self.subscriber

    def _changed(self, monitor_id: str) -> None:
        if self._on_change is not None:
            self._on_change(monitor_id)

    async def _follow(self, monitor_id: str, watch: dict[str, Any]) -> None:
        """Long-poll the watch subscription; every batch is acked and, unless it is only this process's own
        rows, reported as a change. After a failure the watch retries with backoff and reports one change
        when it works again (something may have happened meanwhile)."""
        loop = asyncio.get_running_loop()
        backoff = 0.5
        failed = False
        while True:
            started = loop.time()
            try:
                reply = await self.pull(watch["id"], watch["token"], limit=MAX_LIMIT, wait=self.watch_wait)
            except ToolFailure as failure:
                if not failed:
                    log.warning("watch of %s failed: %s", monitor_id, failure)
                    self._changed(monitor_id)  # the resource may now read differently (or not at all)
                failed = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_MAX_SECONDS)
                if failure.body.get("code") != "CONNECTION_FAILED":
                    # Retired (mute, revoked) or re-keyed elsewhere: re-subscribe with the watch's own token.
                    try:
                        again = await self._subscribe_watch(monitor_id, watch["token"])
                        watch["id"], watch["token"] = again["subscription"]["id"], again["token"]
                    except ToolFailure:
                        pass
                continue
            if failed:
                failed, backoff = False, 0.5
                self._changed(monitor_id)
            observations = reply.get("observations") or []
            if observations:
                try:
                    await self.ack(watch["id"], watch["token"], {"cursor": reply["next"]})
                except ToolFailure as failure:
                    log.info("watch of %s: ack failed: %s", monitor_id, failure)
                if not all(self._own(o) for o in observations):
                    self._changed(monitor_id)
            elif loop.time() - started < 0.05:
                await asyncio.sleep(0.5)  # a server that does not hold long polls is not spun on

    async def _req(
        self,
        method: str,
        path: str,
        token: str | None,
        body: Any = None,
        params: list[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Any:
        from .client import ConnectionFailed, MonitorProtocolError

        try:
            return await self.client.request(
                method, path, body=body, params=params, token=token or "", timeout=timeout
            )
        except MonitorProtocolError as err:
            raise ToolFailure(err.body) from err
        except ConnectionFailed as err:
            raise ToolFailure(
                {"code": "CONNECTION_FAILED", "error": f"the server did not answer: {err.reason}", "done": []}
            ) from err

    async def discover(self) -> Any:
        return await self._req("GET", "/discover", None)

    async def list_monitors(self, token: str | None) -> Any:
        return await self._req("GET", "/monitors", token)

    async def get_monitor(self, monitor_id: str, token: str | None) -> Any:
        return await self._req("GET", f"/monitors/{_seg(monitor_id)}", token)

    async def create_monitor(self, body: dict[str, Any], token: str | None) -> Any:
        return await self._req("POST", "/monitors", token, body)

    async def configure(self, monitor_id: str, action: str, body: dict[str, Any], token: str | None) -> Any:
        return await self._req("POST", f"/monitors/{_seg(monitor_id)}/{_seg(action)}", token, body)

    async def publish(self, monitor_id: str, body: dict[str, Any], token: str | None) -> Any:
        return await self._req("POST", f"/monitors/{_seg(monitor_id)}/observations", token, body)

    async def state(self, monitor_id: str, token: str | None) -> Any:
        return await self._req("GET", f"/monitors/{_seg(monitor_id)}/state", token)

    async def subscribe(self, body: dict[str, Any], token: str | None) -> Any:
        return await self._req("POST", "/subscriptions", token, body)

    async def pull(
        self,
        sub_id: str,
        token: str | None,
        *,
        cursor: Any = None,
        limit: Any = None,
        wait: float = 0.0,
        filter: dict[str, Any] | None = None,
    ) -> Any:
        from .client import LONG_POLL_MARGIN, filter_params

        params: list[tuple[str, str]] = []
        if cursor is not None:
            params.append(("cursor", str(cursor)))
        if limit is not None:
            params.append(("limit", str(limit)))
        if wait:
            params.append(("wait", str(int(wait))))  # whole seconds on the wire
        params.extend(filter_params(filter))
        timeout = self.client.timeout + (float(wait) + LONG_POLL_MARGIN if wait else 0.0)
        return await self._req("GET", f"/subscriptions/{_seg(sub_id)}/pull", token, None, params, timeout)

    async def ack(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self._req("POST", f"/subscriptions/{_seg(sub_id)}/ack", token, body)

    async def seek(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self._req("POST", f"/subscriptions/{_seg(sub_id)}/seek", token, body)

    async def renew(self, sub_id: str, token: str | None) -> Any:
        return await self._req("POST", f"/subscriptions/{_seg(sub_id)}/renew", token, {})

    async def retire_subscription(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self._req("POST", f"/subscriptions/{_seg(sub_id)}/retire", token, body)

    async def lease(self, sub_id: str, token: str | None, action: str, body: dict[str, Any]) -> Any:
        return await self._req("POST", f"/subscriptions/{_seg(sub_id)}/leases/{_seg(action)}", token, body)


def _seg(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


# ---------------------------------------------------------------------------------------------- tools


def _s(kind: str | list[str], text: str, **more: Any) -> dict[str, Any]:
    return {"type": kind, "description": text, **more}


def _enum(values: tuple[str, ...], text: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values), "description": text}


def _int(text: str, minimum: int = 0, maximum: int = MAX_INTEGER) -> dict[str, Any]:
    """Every integer a tool takes is bounded in its schema (and refused outside, before anything runs)."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": text}


SEQ = _int("a seq (0..2^53)")
TOKEN = _s("string", "bearer token for this call (else taken from the MCP server's environment)")
MONITOR_ID = _s("string", "monitor id")
SUB_ID = _s("string", "subscription id (sub-...)")
SUBJECT = _s("string", "the work item the lease is about")
FILTER = _s(
    "object",
    "filter: types, sources, subjects, actors, tiers, origins, horizons, since, until, limit, text, #tags",
    additionalProperties=True,
)
CAP_LIST = {"type": "array", "items": {"type": "string", "enum": list(CAPABILITIES)}}
SEQ_OR_ID = {
    "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": MAX_INTEGER}],
    "description": "a seq (0..2^53) or an observation id",
}

PUBLISH_FIELDS: dict[str, Any] = {
    "type": _s("string", "observation type, reverse-DNS, declared in the monitor's types"),
    "subject": _s("string", "what it is about (a work item)"),
    "data": _s("object", "the observation's own fields", additionalProperties=True),
    "tags": _s("object", "tags (addressing, P12)", additionalProperties=True),
    "actor": _s("string", "who caused it, e.g. agent:claude (default: the owner)"),
    "origin": _enum(ORIGINS, "declared origin (default: inferred from the actor)"),
    "tier": _enum(TIERS, "how much it is worth believing (defaults never reach the top)"),
    "verification": _enum(VERIFICATIONS, "verification level"),
    "on_behalf_of": _s(
        "string",
        "delegation: the monitor owner this actor acts for, e.g. human:you; "
        "lets an agent record a person's origin/tier on their behalf (P1)",
    ),
    "time": _s("string", "RFC 3339 time of the observation"),
    "source_ref": _s("string", "reference in the source"),
    "rule": _s("string", "the rule that produced it"),
    "wasDerivedFrom": {
        "type": "array",
        "items": SEQ_OR_ID,
        "description": "seqs or ids this was derived from",
    },
    "supersedes": {**SEQ_OR_ID, "description": "the seq this observation corrects (P13)"},
    "idempotency_key": _s(
        "string",
        "makes a retry safe: a repeat with the same key within 24 h returns the first reply (same seq, "
        "idempotent: true) and appends nothing. 1-128 printable ASCII characters",
        minLength=1,
        maxLength=IDEMPOTENCY_KEY_MAX_CHARS,
    ),
}

MONITOR_FIELDS: dict[str, Any] = {
    "id": _s("string", "monitor id, ^[\\w.-]{2,64}$"),
    "name": _s("string", "display name (default: the id)"),
    "description": _s("string", "what is watched"),
    "owner": _s("string", "owner actor, e.g. human:you"),
    "types": {"type": "array", "items": {"type": "string"}, "description": "declared observation types"},
    "capabilities": {**CAP_LIST, "description": "what readers may be granted"},
    "default_grant": {**CAP_LIST, "description": "granted to strangers (subset of capabilities)"},
    "visibility": _enum(VISIBILITIES, "who can read it"),
    "horizon": _enum(HORIZONS, "how often it is expected to change"),
    "source": _s("object", "{kind, ref, settings}", additionalProperties=True),
    "filter": FILTER,
    "rules": _s("array", "mechanical rules"),
    "ttl_seconds": _int("stale after this many seconds without an observation", 1),
    "retire_after_mute_seconds": _int("retire subscriptions that do not pull for this long", 1),
    "subscribe_token": _s("boolean", "mint a subscribe token"),
    "token": _s("string", "the server's registration token, when it requires one"),
}

# ---- output schemas: the top level of each reply, nested objects named after the published schemas.


def _obj(text: str, required: tuple[str, ...] = (), **props: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "description": text,
        "properties": props,
        "required": list(required),
        "additionalProperties": True,
    }


def _out(required: tuple[str, ...], **props: Any) -> dict[str, Any]:
    schema = _obj("", required, **props)
    del schema["description"]
    return schema


INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
MONITOR_OUT = _obj(
    "a Monitor (schemas/monitor.json)",
    ("id", "version", "owner", "visibility"),
    id=STR,
    version=INT,
    owner=STR,
    visibility=STR,
    active=BOOL,
    head=INT,
)
OBSERVATION_OUT = _obj(
    "an observation, a CloudEvent (schemas/observation.json)", ("id", "type"), id=STR, type=STR
)
SUBSCRIPTION_OUT = _obj(
    "a Subscription (schemas/subscription.json)",
    ("id", "monitor", "subscriber", "cursor"),
    id=STR,
    monitor=STR,
    subscriber=STR,
    cursor=INT,
    capabilities={"type": "array", "items": STR},
)
LEASE_OUT = _obj("a Lease (schemas/lease.json)", ("subject",), subject=STR)
STATE_OUT = _out(
    ("monitor", "head", "live"),
    monitor=STR,
    head=INT,
    live=_obj("whether the monitor is live, and why not", ("value",), value=BOOL),
)
LEASE_DONE_OUT = _out(("ok", "seq"), ok=BOOL, seq=INT, dead_letter=BOOL, lease=LEASE_OUT)

# ---- annotations: (readOnly, destructive, idempotent, openWorld), as each tool truly is.
READ = (True, False, True, False)


class ToolSpec:
    def __init__(
        self,
        name: str,
        description: str,
        properties: dict[str, Any],
        required: list[str],
        run: Callable[[Any, dict[str, Any]], Awaitable[Any]],
        *,
        output: dict[str, Any],
        hints: tuple[bool, bool, bool, bool],
        title: str | None = None,
    ) -> None:
        from jsonschema import Draft202012Validator

        self.name = name
        self.title = title or name.replace("_", " ")
        self.description = description
        self.schema = {"type": "object", "properties": properties, "required": required}
        self.output = output
        self.run = run
        self.read_only, self.destructive, self.idempotent, self.open_world = hints
        Draft202012Validator.check_schema(self.schema)
        Draft202012Validator.check_schema(self.output)
        self.validator = Draft202012Validator(self.schema)

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=self.schema,
            output_schema=self.output,
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=self.open_world,
            ),
        )

    def check(self, args: dict[str, Any]) -> None:
        """Refuse arguments outside the input schema (a type, a bound, a missing one) as 400 INVALID."""
        from jsonschema.exceptions import best_match

        error = best_match(self.validator.iter_errors(args))
        if error is None:
            return
        field = ".".join(str(p) for p in error.absolute_path) or None
        if error.validator == "required":
            field = next((n for n in self.schema["required"] if n not in args), field)
        where = f"argument {field}" if field else "arguments"
        extras: dict[str, Any] = {"field": field} if field else {}
        bound = error.schema.get(error.validator) if isinstance(error.schema, dict) else None
        if error.validator in ("minimum", "maximum") and isinstance(bound, int):
            extras[error.validator] = bound
        raise ProtocolError(
            "INVALID", f"{self.name}: {where}: {error.message}; see the tool's input schema.", **extras
        )


def _tok(args: dict[str, Any], roles: tuple[str, ...]) -> str | None:
    return args.get("token") or env_token(roles)


def _body(args: dict[str, Any], *drop: str) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k not in ("token", *drop) and v is not None}


def _need(args: dict[str, Any], *names: str) -> None:
    missing = [n for n in names if args.get(n) in (None, "")]
    if missing:
        raise ToolFailure(
            ProtocolError(
                "INVALID", f"missing argument(s): {', '.join(missing)}; see the tool's input schema"
            ).body()
        )


async def _configure(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "id", "action")
    if a["action"] not in ("update", "pause", "resume", "retire"):
        raise ToolFailure(
            ProtocolError(
                "INVALID", "action is one of update, pause, resume, retire", invalid=a["action"]
            ).body()
        )
    return await b.configure(a["id"], a["action"], _body(a, "id", "action"), _tok(a, OWNER_ENV))


async def _publish(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "id", "type")
    return await b.publish(a["id"], _body(a, "id"), _tok(a, OWNER_ENV))


async def _pull(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "subscription")
    return await b.pull(
        a["subscription"],
        _tok(a, READER_ENV),
        cursor=a.get("cursor"),
        limit=a.get("limit"),
        wait=as_int(a.get("wait") or 0, "wait", minimum=0, maximum=int(MAX_WAIT_SECONDS)),
        filter=a.get("filter"),
    )


def _lease(action: str) -> Callable[[Any, dict[str, Any]], Awaitable[Any]]:
    async def run(b: Any, a: dict[str, Any]) -> Any:
        _need(a, "subscription", "subject")
        return await b.lease(a["subscription"], _tok(a, READER_ENV), action, _body(a, "subscription"))

    return run


def _reader(method: str, *required: str) -> Callable[[Any, dict[str, Any]], Awaitable[Any]]:
    async def run(b: Any, a: dict[str, Any]) -> Any:
        _need(a, "subscription", *required)
        fn = getattr(b, method)
        if method == "renew":
            return await fn(a["subscription"], _tok(a, READER_ENV))
        return await fn(a["subscription"], _tok(a, READER_ENV), _body(a, "subscription"))

    return run


async def _get(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "id")
    return await b.get_monitor(a["id"], _tok(a, VIEWER_ENV))


async def _state(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "id")
    return await b.state(a["id"], _tok(a, VIEWER_ENV))


async def _create(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "id")
    return await b.create_monitor(_body(a), _tok(a, VIEWER_ENV))


async def _subscribe(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "monitor", "subscriber")
    return await b.subscribe(_body(a), _tok(a, OWNER_ENV))


async def _discover(b: Any, a: dict[str, Any]) -> Any:
    return await b.discover()


async def _list(b: Any, a: dict[str, Any]) -> Any:
    return await b.list_monitors(_tok(a, VIEWER_ENV))


def tool_specs() -> list[ToolSpec]:
    sub = {"subscription": SUB_ID, "token": TOKEN}
    lease_duration = _int("lease length in seconds (default 60)", 1, MAX_LEASE_SECONDS)
    return [
        ToolSpec(
            "monitor_discover",
            "What this server supports: versions, feeds, limits, extensions.",
            {},
            [],
            _discover,
            output=_out(
                ("supportedVersions", "capabilities", "limits"),
                supportedVersions={"type": "array", "items": STR},
                protocol=STR,
                capabilities=_obj("monitors, feeds, leases, extensions"),
                limits=_obj("max_limit, default_limit, max_wait_seconds, ..."),
                serverInfo=_obj("name, version, implementation"),
            ),
            hints=READ,
        ),
        ToolSpec(
            "monitor_list",
            "Monitors this token may see (public ones without a token).",
            {"token": TOKEN},
            [],
            _list,
            output=_out(("monitors",), monitors={"type": "array", "items": MONITOR_OUT}),
            hints=READ,
        ),
        ToolSpec(
            "monitor_get",
            "One monitor's definition.",
            {"id": MONITOR_ID, "token": TOKEN},
            ["id"],
            _get,
            output={k: v for k, v in MONITOR_OUT.items() if k != "description"},
            hints=READ,
        ),
        ToolSpec(
            "monitor_create",
            "Create a monitor. The reply carries its owner token, shown once: keep it. An existing id is "
            "refused (DUPLICATE).",
            MONITOR_FIELDS,
            ["id"],
            _create,
            output=_out(
                ("monitor", "owner_token"),
                monitor=MONITOR_OUT,
                owner_token=STR,
                subscribe_token={"type": ["string", "null"]},
                notice=STR,
            ),
            hints=(False, False, False, False),
        ),
        ToolSpec(
            "monitor_configure",
            "Change a monitor (owner): update (with a patch), pause, resume or "
            "retire (final: retiring releases every lease). Every change is itself an observation.",
            {
                "id": MONITOR_ID,
                "action": _enum(("update", "pause", "resume", "retire"), "what to do"),
                "patch": _s("object", "fields to change (update)", additionalProperties=True),
                "reason": _s("string", "why (logged)"),
                "rule": _s("string", "rule behind the change"),
                "token": TOKEN,
            },
            ["id", "action"],
            _configure,
            output=_out(("monitor", "seq"), monitor=MONITOR_OUT, seq=INT),
            hints=(False, True, False, False),
        ),
        ToolSpec(
            "monitor_publish",
            "Append an observation (owner token). An agent acting for the owner sets "
            "actor to itself and on_behalf_of to the owner. Not idempotent unless you give an "
            "idempotency_key: then a retry returns the first reply and appends nothing.",
            {"id": MONITOR_ID, **PUBLISH_FIELDS, "token": TOKEN},
            ["id", "type"],
            _publish,
            output=_out(("observation", "seq"), observation=OBSERVATION_OUT, seq=INT, idempotent=BOOL),
            hints=(False, False, False, False),
        ),
        ToolSpec(
            "monitor_state",
            "A monitor's computed state: head, live, counters, ages, confidence (with "
            "what it does not know).",
            {"id": MONITOR_ID, "token": TOKEN},
            ["id"],
            _state,
            output=STATE_OUT,
            hints=READ,
        ),
        ToolSpec(
            "monitor_subscribe",
            "Subscribe to a monitor. The reply carries the reader token, shown once. Re-subscribing the "
            "same subscriber renews its token and keeps its cursor. protocol http makes the server push "
            "to the sink URL.",
            {
                "monitor": MONITOR_ID,
                "subscriber": _s("string", "your name, e.g. agent:triage"),
                "capabilities": {**CAP_LIST, "description": "asked capabilities (granted, not requested)"},
                "filter": FILTER,
                "from": {
                    "anyOf": [
                        {"type": "string", "enum": ["head", "earliest"]},
                        {"type": "integer", "minimum": 0, "maximum": MAX_INTEGER},
                    ],
                    "description": "head, earliest or a seq (default: the beginning)",
                },
                "protocol": _enum(PROTOCOLS, "delivery protocol"),
                "reset_policy": _enum(RESET_POLICIES, "what happens when the cursor expires"),
                "sink": _s("string", "push URL for protocol http"),
                "retire_after_mute_seconds": _int("retire when not pulled for this long", 1),
                "token": _s("string", "owner or subscribe token, or this subscription's token to re-key"),
            },
            ["monitor", "subscriber"],
            _subscribe,
            output=_out(("subscription", "token"), subscription=SUBSCRIPTION_OUT, token=STR, notice=STR),
            # a push subscription reaches out to any URL it is given
            hints=(False, False, False, True),
        ),
        ToolSpec(
            "monitor_pull",
            "Read observations at the cursor. Read-only: it never commits, so call monitor_ack with "
            "`next` after handling them. `wait` long-polls up to 50 s.",
            {
                **sub,
                "cursor": _int("read-only replay from this seq (0..2^53)"),
                "limit": _int(f"1..{MAX_LIMIT} (default 50)", 1, MAX_LIMIT),
                "wait": _int(
                    f"long poll, whole seconds (0..{int(MAX_WAIT_SECONDS)})", 0, int(MAX_WAIT_SECONDS)
                ),
                "filter": FILTER,
            },
            ["subscription"],
            _pull,
            output=_out(
                ("subscription", "monitor", "cursor", "head", "next", "observations"),
                subscription=STR,
                monitor=STR,
                cursor=INT,
                head=INT,
                lag=INT,
                retention_floor=INT,
                next=INT,
                redelivered=INT,
                observations={"type": "array", "items": OBSERVATION_OUT},
            ),
            hints=READ,
        ),
        ToolSpec(
            "monitor_ack",
            "Commit the cursor (the pull's `next`): cumulative, never backwards; the same ack again is "
            "idempotent.",
            {**sub, "cursor": {**SEQ, "description": "the next seq to deliver (0..2^53)"}},
            ["subscription", "cursor"],
            _reader("ack", "cursor"),
            output=_out(("subscription", "cursor"), subscription=STR, cursor=INT, head=INT, lag=INT),
            hints=(False, False, True, False),
        ),
        ToolSpec(
            "monitor_seek",
            "Move the cursor explicitly (the only way backwards), with a reason.",
            {
                **sub,
                "cursor": {**SEQ, "description": "the new cursor (0..2^53)"},
                "reason": _s("string", "why (logged)"),
            },
            ["subscription", "cursor", "reason"],
            _reader("seek", "cursor", "reason"),
            output=_out(("subscription", "cursor"), subscription=STR, cursor=INT),
            hints=(False, False, True, False),
        ),
        ToolSpec(
            "monitor_renew",
            "Rotate the subscription's token (same cursor); the old one dies at once.",
            sub,
            ["subscription"],
            _reader("renew"),
            output=_out(("subscription", "token"), subscription=STR, token=STR, cursor=INT),
            hints=(False, True, False, False),
        ),
        ToolSpec(
            "monitor_retire_subscription",
            "Retire the subscription (its leases are released; subscribing again reactivates it).",
            {**sub, "reason": _s("string", "why")},
            ["subscription"],
            _reader("retire_subscription"),
            output=_out(
                ("ok", "subscription", "cursor_kept"), ok=BOOL, subscription=STR, seq=INT, cursor_kept=INT
            ),
            hints=(False, True, True, False),
        ),
        ToolSpec(
            "lease_claim",
            "Claim exclusive, expiring ownership of a subject (needs act). The holder claiming again gets "
            "the same lease (idempotent: true).",
            {
                **sub,
                "subject": SUBJECT,
                "lease_duration_seconds": lease_duration,
                "note": _s("string", "note"),
            },
            ["subscription", "subject"],
            _lease("claim"),
            output=_out(("lease", "expires"), lease=LEASE_OUT, expires=STR, idempotent=BOOL),
            hints=(False, False, True, False),
        ),
        ToolSpec(
            "lease_renew",
            "Extend a lease you hold.",
            {**sub, "subject": SUBJECT, "lease_duration_seconds": lease_duration},
            ["subscription", "subject"],
            _lease("renew"),
            output=_out(("lease", "expires"), lease=LEASE_OUT, expires=STR),
            hints=(False, False, False, False),
        ),
        ToolSpec(
            "lease_complete",
            "Finish a lease you hold with an outcome (the same complete again returns the first reply).",
            {
                **sub,
                "subject": SUBJECT,
                "outcome": _s("string", "e.g. fixed, done"),
                "evidence": _s(["object", "array", "string"], "evidence"),
                "note": _s("string", "note"),
            },
            ["subscription", "subject", "outcome"],
            _lease("complete"),
            output=LEASE_DONE_OUT,
            hints=(False, False, True, False),
        ),
        ToolSpec(
            "lease_release",
            "Give a held lease back (no attempt counted).",
            {**sub, "subject": SUBJECT, "reason": _s("string", "why")},
            ["subscription", "subject"],
            _lease("release"),
            output=LEASE_DONE_OUT,
            hints=(False, False, True, False),
        ),
        ToolSpec(
            "lease_reject",
            "Give a subject back as failed; it dead-letters at the delivery count limit.",
            {**sub, "subject": SUBJECT, "reason": _s("string", "why")},
            ["subscription", "subject"],
            _lease("reject"),
            output=LEASE_DONE_OUT,
            hints=(False, False, True, False),
        ),
    ]


# ---------------------------------------------------------------------------------------------- server


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def _mcp_error(failure: ToolFailure) -> Exception:
    from mcp.shared.exceptions import MCPError

    code = JSONRPC_CODE.get(str(failure.body.get("code")), types.INVALID_PARAMS)
    return MCPError(code, f"{failure.body.get('code')}: {failure.body.get('error')}", failure.body)


def _connection_of(session: Any) -> Any:
    # The SDK hands each request its own ServerSession over the one connection: a subscription belongs to
    # the connection, so an unsubscribe (another request) finds it.
    return getattr(session, "_connection", None) or session


class MonitorMCP:
    """Tools, resources and resource-update notifications over one backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.specs = {spec.name: spec for spec in tool_specs()}
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        self.coalescer = Coalescer(self._notify)
        # handshake era: uri -> {connection: its session}; 2026-07-28 era: uri -> open listen streams
        self.legacy_subs: dict[str, dict[Any, Any]] = {}
        self.listen_subs: dict[str, int] = {}
        where = getattr(backend, "where", lambda: "")()
        self.instructions = instructions(where)
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=__version__,
            title="Monitor Protocol",
            instructions=self.instructions,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )
        self.server.extensions = {EXTENSION_ID: {"version": PROTOCOL_VERSION}}

    # -- lifecycle ---------------------------------------------------------------------------------

    def watched_monitors(self) -> set[str]:
        uris = {u for u, s in self.legacy_subs.items() if s} | {
            u for u, n in self.listen_subs.items() if n > 0
        }
        return {m.group(1) for m in map(RESOURCE_URI.match, uris) if m}

    def monitor_changed(self, monitor_id: str) -> None:
        """Called on the loop when a monitor's log moved: wake every subscriber of its resources, at most
        once per resource per NOTIFY_INTERVAL_SECONDS (the last change is always notified)."""
        for kind in ("definition", "state"):
            uri = f"monitor://{monitor_id}/{kind}"
            if self.legacy_subs.get(uri) or self.listen_subs.get(uri):
                self.coalescer.changed(uri)

    async def _notify(self, uri: str) -> None:
        await self.bus.publish(ResourceUpdated(uri=uri))
        for key, session in list(self.legacy_subs.get(uri, {}).items()):
            try:
                await session.send_resource_updated(uri)
            except Exception:
                self.legacy_subs.get(uri, {}).pop(key, None)  # that client is gone

    async def run_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        await self.backend.start(self.monitor_changed)
        try:
            async with stdio_server() as (read_stream, write_stream):
                options = self.server.create_initialization_options(
                    experimental_capabilities={EXTENSION_ID: {"version": PROTOCOL_VERSION}}
                )
                await self.server.run(read_stream, write_stream, options)
        finally:
            self.coalescer.close()
            self.listen.close()
            await self.backend.close()

    # -- tools -------------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[spec.tool() for spec in self.specs.values()])

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        spec = self.specs.get(params.name)
        if spec is None:
            body = ProtocolError(
                "NOT_FOUND", f"no tool {params.name!r}; tools: {', '.join(self.specs)}"
            ).body()
            return self._failure(body)
        # A null argument is an absent one (some clients send every optional parameter).
        args = {k: v for k, v in dict(params.arguments or {}).items() if v is not None}
        try:
            spec.check(args)
            result = await spec.run(self.backend, args)
        except ToolFailure as failure:
            return self._failure(failure.body)
        except ProtocolError as err:  # an argument refused before it reached the engine or the server
            return self._failure(err.body())
        except Exception as exc:  # never a crash: the agent gets a tool error it can report
            log.exception("tool %s failed", params.name)
            return self._failure(
                {
                    "code": "INTERNAL",
                    "error": f"{params.name} failed: {type(exc).__name__}: {exc}",
                    "done": [],
                }
            )
        structured = result if isinstance(result, dict) else {"result": result}
        return types.CallToolResult(
            content=[types.TextContent(text=_text(result))], structured_content=structured
        )

    @staticmethod
    def _failure(body: dict[str, Any]) -> types.CallToolResult:
        text = f"{body.get('code')}: {body.get('error')}\n{_text(body)}"
        return types.CallToolResult(
            content=[types.TextContent(text=text)], structured_content=body, is_error=True
        )

    # -- resources ---------------------------------------------------------------------------------

    async def _list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        try:
            listed = await self.backend.list_monitors(env_token(VIEWER_ENV))
        except ToolFailure:
            listed = {"monitors": []}
        resources: list[types.Resource] = []
        for monitor in listed.get("monitors", []):
            mid = monitor.get("id")
            resources.append(
                types.Resource(
                    uri=f"monitor://{mid}/definition", name=f"{mid} definition", mime_type="application/json"
                )
            )
            resources.append(
                types.Resource(
                    uri=f"monitor://{mid}/state", name=f"{mid} state", mime_type="application/json"
                )
            )
        return types.ListResourcesResult(resources=resources)

    async def _list_templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template="monitor://{id}/definition",
                    name="monitor definition",
                    description="a monitor's definition (Monitor object)",
                    mime_type="application/json",
                ),
                types.ResourceTemplate(
                    uri_template="monitor://{id}/state",
                    name="monitor state",
                    description="a monitor's computed state; subscribe for wake-ups",
                    mime_type="application/json",
                ),
            ]
        )

    @staticmethod
    def _parse_uri(uri: str) -> tuple[str, str]:
        from mcp.shared.exceptions import MCPError

        match = RESOURCE_URI.match(uri)
        if not match:
            raise MCPError(
                types.INVALID_PARAMS,
                f"unknown resource {uri}; use monitor://{{id}}/definition or monitor://{{id}}/state",
            )
        return match.group(1), match.group(2)

    async def _read_resource(
        self, ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        monitor_id, kind = self._parse_uri(uri)
        token = env_token(VIEWER_ENV)
        try:
            if kind == "definition":
                value = await self.backend.get_monitor(monitor_id, token)
            else:
                value = await self.backend.state(monitor_id, token)
        except ToolFailure as failure:
            raise _mcp_error(failure) from failure
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=_text(value))]
        )

    async def _servable(self, uris: list[str]) -> None:
        """A subscription is only accepted when it can be served: the monitor exists, the environment's
        token sees it, and (--base) the server accepted the watch that wakes it. Else the request fails."""
        for uri in uris:
            monitor_id, _kind = self._parse_uri(uri)
            try:
                await self.backend.state(monitor_id, env_token(VIEWER_ENV))
                await self.backend.watch(monitor_id)
            except ToolFailure as failure:
                await self._unwatch_idle()
                raise _mcp_error(failure) from failure

    async def _unwatch_idle(self) -> None:
        watched = getattr(self.backend, "watched", None)
        if watched is None:
            return
        for monitor_id in watched() - self.watched_monitors():
            await self.backend.unwatch(monitor_id)

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        await self._servable([str(params.uri)])
        self.legacy_subs.setdefault(str(params.uri), {})[_connection_of(ctx.session)] = ctx.session
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        self.legacy_subs.get(str(params.uri), {}).pop(_connection_of(ctx.session), None)
        await self._unwatch_idle()
        return types.EmptyResult()

    async def _listen(self, ctx: Any, params: types.SubscriptionsListenRequestParams) -> Any:
        uris = list(params.notifications.resource_subscriptions or [])
        await self._servable(uris)
        for uri in uris:
            self.listen_subs[uri] = self.listen_subs.get(uri, 0) + 1
        try:
            return await self.listen(ctx, params)
        finally:
            for uri in uris:
                self.listen_subs[uri] -= 1
                if self.listen_subs[uri] <= 0:
                    del self.listen_subs[uri]
            # A stream ends by cancellation when its client goes: retire the idle watches regardless.
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                try:
                    await self._unwatch_idle()
                except Exception:
                    log.debug("unwatch after listen failed", exc_info=True)


def build(db: str | None = None, base: str | None = None) -> MonitorMCP:
    """The MCP server on an embedded database (`db`, default: the user's data directory) or against an
    `mp serve` (`base`)."""
    if base:
        return MonitorMCP(RemoteBackend(base))
    if db is None:
        from .commands.mcp_cmd import default_db_path

        db = str(default_db_path(create=True))
    return MonitorMCP(EmbeddedBackend(db))
