"""The MCP door (PROTOCOL.md section 9, extension `ai.mentu/monitors`), on the official MCP Python SDK.

Two backends behind the same tools and resources:

* embedded (`EmbeddedBackend`): a `MonitorService` on a SQLite file, entered by one engine thread (the store
  is opened on it). The mute sweep and lease expiry run on a one-second timer; appends reach the shared
  `Waiters` registry (doors/parking.py) through `service.add_listener`: it wakes resource subscribers, and a pull
  asked to `wait` is parked there until an append.
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

from monitor_protocol import __version__
from monitor_protocol.api import operations
from monitor_protocol.api.operations import Auth
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.validation import as_int
from monitor_protocol.core.vocab import EXTENSION_ID, JSONRPC_CODE, MAX_LIMIT, PROTOCOL_VERSION
from monitor_protocol.core.vocab import MAX_WAIT_SECONDS as _MAX_WAIT
from monitor_protocol.doors.parking import Waiters

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
        # Parked pulls and resource notifications: the registry every door shares (doors/parking.py).
        self.waiters = Waiters()
        self._tasks: list[asyncio.Task[None]] = []

    def where(self) -> str:
        return (
            f"Monitors are kept in the SQLite database {self.db_path} (embedded); tell the user this path "
            "when they ask where their monitors live."
        )

    async def start(self, on_change: Callable[[str], None]) -> None:
        import time

        from monitor_protocol.core.service import Feeds, MonitorService
        from monitor_protocol.store.sqlite import SQLiteStore, StoreCorrupt, StoreLocked

        self.loop = asyncio.get_running_loop()
        self.waiters.bind(self.loop)
        self.waiters.on_append = on_change

        def build() -> None:
            try:
                self.store = SQLiteStore(self.db_path)
            except (StoreLocked, StoreCorrupt):
                raise
            except (sqlite3.Error, OSError) as exc:
                raise DatabaseUnavailable(f"cannot open the database {self.db_path}: {exc}") from exc
            self.service = MonitorService(self.store, clock=time.time, feeds=Feeds(pull=True, mcp=True))
            self.waiters.attach(self.service)  # on the engine thread, like every other service call

        await self._engine(build)
        if self.sweep_interval:
            self._tasks.append(asyncio.create_task(self._sweeper(), name="mp-mcp-sweep"))

    async def close(self) -> None:
        self.waiters.wake_all()  # parked pulls answer now instead of holding the shutdown
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks.clear()
        if self.service is not None:
            await self._engine(self.waiters.detach)
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

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.service, method)
        try:
            return await self._engine(lambda: fn(*args, **kwargs))
        except ProtocolError as err:
            raise ToolFailure(err.body()) from err

    async def perform(
        self, op: operations.Operation, path: dict[str, Any], payload: Any, token: str | None
    ) -> Any:
        """One table operation: its service method with the arguments the table says (operations.py)."""
        args, kwargs = operations.engine_args(op, path, payload, token)
        return await self.call(op.service or "", *args, **kwargs)

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
            reply, mark = await self._pull_marked(sub_id, token, cursor, limit, filter)
            remaining = deadline - loop.time()
            if reply.get("observations") or reply.get("scan_capped") or remaining <= 0:
                return reply
            # Parked until an append after the one this pull saw (`mark`), so an append that landed
            # between the pull and the parking wakes it at once; then pull again.
            await self.waiters.wait(str(reply.get("monitor", "")), mark, remaining)
            if self.waiters.draining:
                return reply  # closing: answer with what the last pull saw, the engine is going away

    async def _pull_marked(
        self, sub_id: str, token: str | None, cursor: Any, limit: Any, filter: dict[str, Any] | None
    ) -> tuple[Any, int]:
        """The pull, and the registry's mark for its monitor read right after it, on the engine thread."""

        def job() -> tuple[Any, int]:
            reply = self.service.pull(sub_id, token, cursor=cursor, limit=limit, filter=filter)
            return reply, self.waiters.mark(str(reply.get("monitor", "")))

        try:
            return await self._engine(job)
        except ProtocolError as err:
            raise ToolFailure(err.body()) from err

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
        from monitor_protocol.client import AsyncClient

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
        from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

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

    # -- the table's routes (operations.py); pull, a long poll, is shaped by hand below

    async def perform(
        self, op: operations.Operation, path: dict[str, Any], payload: Any, token: str | None
    ) -> Any:
        """One table operation over HTTP: its method and route, the token and body only where the
        operation takes them (a POST without a body sends `{}`)."""
        body = payload if "body" in op.call else ({} if op.method == "POST" else None)
        return await self._req(op.method, _expand(op, path), token if "token" in op.call else None, body)

    async def _service(
        self, service: str, path: dict[str, Any], payload: Any, token: str | None, action: str | None = None
    ) -> Any:
        op = operations.find(service, action)
        if op is None:
            raise ToolFailure(
                ProtocolError("NOT_FOUND", f"No {service} action {action!r} in the operations table.").body()
            )
        return await self.perform(op, {**path, "action": action} if action else path, payload, token)

    async def discover(self) -> Any:
        return await self._service("discover", {}, None, None)

    async def list_monitors(self, token: str | None) -> Any:
        return await self._service("list_monitors", {}, None, token)

    async def get_monitor(self, monitor_id: str, token: str | None) -> Any:
        return await self._service("get_monitor", {"id": monitor_id}, None, token)

    async def create_monitor(self, body: dict[str, Any], token: str | None) -> Any:
        return await self._service("create_monitor", {}, body, token)

    async def configure(self, monitor_id: str, action: str, body: dict[str, Any], token: str | None) -> Any:
        return await self._service("configure", {"id": monitor_id}, body, token, action)

    async def publish(self, monitor_id: str, body: dict[str, Any], token: str | None) -> Any:
        return await self._service("publish", {"id": monitor_id}, body, token)

    async def state(self, monitor_id: str, token: str | None) -> Any:
        return await self._service("state", {"id": monitor_id}, None, token)

    async def subscribe(self, body: dict[str, Any], token: str | None) -> Any:
        return await self._service("subscribe", {}, body, token)

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
        from monitor_protocol.client import LONG_POLL_MARGIN, filter_params

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
        return await self._service("ack", {"id": sub_id}, body, token)

    async def seek(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self._service("seek", {"id": sub_id}, body, token)

    async def renew(self, sub_id: str, token: str | None) -> Any:
        return await self._service("renew", {"id": sub_id}, None, token)

    async def retire_subscription(self, sub_id: str, token: str | None, body: dict[str, Any]) -> Any:
        return await self._service("retire_subscription", {"id": sub_id}, body, token)

    async def lease(self, sub_id: str, token: str | None, action: str, body: dict[str, Any]) -> Any:
        return await self._service("lease", {"id": sub_id}, body, token, action)


def _expand(op: operations.Operation, path: dict[str, Any]) -> str:
    """The operation's route with its path parameters (and `{action}`) filled in, each one URL-quoted."""
    values = {"action": op.action, **path}
    return re.sub(r"\{(\w+)\}", lambda m: _seg(values[m.group(1)]), op.route)


def _seg(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


# ---------------------------------------------------------------------------------------------- tools
# Every tool is generated from the operations table (operations.py): name, description, annotations, input
# schema (the operation's parameters), output schema and the backend method it calls. Only monitor_pull has
# a hand-written runner (`_pull`: its `wait` is a long poll held by the backend).


def env_roles(auth: Auth) -> tuple[str, ...]:
    """Where a tool finds its token when the agent leaves `token` out, by the credential it asks for."""
    if auth.credential in ("owner_token", "subscribe_token"):
        return OWNER_ENV
    if auth.credential == "reader_token":
        return READER_ENV
    return VIEWER_ENV


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
        roles: tuple[str, ...] = VIEWER_ENV,
        credential: str = "none",
    ) -> None:
        from jsonschema import Draft202012Validator

        self.name = name
        self.title = title or name.replace("_", " ")
        self.description = description
        self.schema = {"type": "object", "properties": properties, "required": required}
        self.output = output
        self.run = run
        self.roles = roles  # the environment variables the token falls back to (for the hint, too)
        self.credential = credential
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


RUNNERS: dict[str, Callable[[Any, dict[str, Any]], Awaitable[Any]]] = {"monitor_pull": _pull}


def _choose(spec: operations.ToolDef, a: dict[str, Any]) -> operations.Operation:
    """The operation the arguments select; a selector naming none of the tool's operations is INVALID."""
    op = spec.op_for(a)
    if op is None:
        selector = spec.tool.selector or ""
        actions = ", ".join(o.action or "" for o in spec.ops)
        raise ToolFailure(
            ProtocolError("INVALID", f"{selector} is one of {actions}", invalid=a.get(selector)).body()
        )
    return op


def _runner(spec: operations.ToolDef) -> Callable[[Any, dict[str, Any]], Awaitable[Any]]:
    """Call the backend method of the chosen operation with the arguments the table says: path ids from
    their arguments, the rest as the body, the token from the argument or the environment."""
    ids = tuple(p.argument for p in spec.ops[0].path_params)
    drop = (*ids, spec.tool.selector) if spec.tool.selector else ids
    roles = env_roles(spec.ops[0].auth)

    async def run(b: Any, a: dict[str, Any]) -> Any:
        _need(a, *spec.required)
        op = _choose(spec, a)
        path = {p.name: a[p.argument] for p in op.path_params}
        return await b.perform(op, path, _body(a, *drop), _tok(a, roles))

    return run


def tool_specs() -> list[ToolSpec]:
    return [
        ToolSpec(
            spec.tool.name,
            spec.tool.description,
            spec.input_schema["properties"],
            list(spec.required),
            RUNNERS.get(spec.tool.name) or _runner(spec),
            output=spec.output_schema,
            hints=spec.tool.hints,
            roles=env_roles(spec.ops[0].auth),
            credential=spec.ops[0].auth.credential,
        )
        for spec in operations.mcp_tools()
    ]


# ---- the MCP door's hint for a missing or wrong credential

# extras["needs"] (the engine's word) -> how the sentence names it
NEEDS_LABELS = {
    "owner_token": "the owner token",
    "subscribe_token": "the owner or subscribe token",
    "reader_token": "the subscription's reader token",
    "registration_token": "the server's registration token",
    "admin_token": "the admin token",
}
# The credential a tool's operation asks for, as `needs` spells it (for sentences that do not say).
CREDENTIAL_NEEDS = {
    "owner_token": "owner_token",
    "subscribe_token": "subscribe_token",
    "reader_token": "reader_token",
    "registration": "registration_token",
    "admin": "admin_token",
}
# An HTTP door's way to send a token, in the engine's older sentences ("...: send Authorization: Bearer
# <owner_token>.") and the REST door's own hint ("... Send Authorization: Bearer <owner token>."): an MCP
# caller has no header to set, so it is taken out before the MCP hint goes in.
_HTTP_HINT_AFTER_STOP = re.compile(r"(?<=\.)\s*send authorization: bearer <[^>]*>\.?", re.IGNORECASE)
_HTTP_HINT = re.compile(r"\s*:?\s*\bsend authorization: bearer <[^>]*>\.?", re.IGNORECASE)


def without_http_hint(message: str) -> str:
    return _HTTP_HINT.sub(".", _HTTP_HINT_AFTER_STOP.sub("", message)).strip()


def tool_hint(body: dict[str, Any], spec: ToolSpec) -> dict[str, Any]:
    """The refusal body with an UNAUTHORIZED sentence telling an MCP caller how to pass the token: the
    tool's `token` argument or the MCP server's environment, never an HTTP header."""
    message = body.get("error")
    if body.get("code") != "UNAUTHORIZED" or not isinstance(message, str):
        return body
    stripped = without_http_hint(message)
    needs = body.get("needs")
    if not isinstance(needs, str) and stripped != message:
        needs = CREDENTIAL_NEEDS.get(spec.credential)  # an older sentence: the tool's own credential
    label = NEEDS_LABELS.get(needs) if isinstance(needs, str) else None
    if label is None:
        return {**body, "error": stripped}
    env = " (or ".join(spec.roles) + ")" * (len(spec.roles) - 1)
    hint = f"Pass {label} as this tool's `token` argument, or set {env} in the MCP server's environment."
    return {**body, "error": f"{stripped} {hint}"}


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
            return self._failure(tool_hint(failure.body, spec))
        except ProtocolError as err:  # an argument refused before it reached the engine or the server
            return self._failure(tool_hint(err.body(), spec))
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
        from monitor_protocol.cli.mcp import default_db_path

        db = str(default_db_path(create=True))
    return MonitorMCP(EmbeddedBackend(db))
