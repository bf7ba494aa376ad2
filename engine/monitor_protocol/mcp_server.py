"""The MCP door (PROTOCOL.md section 9, extension `ai.mentu/monitors`), on the official MCP Python SDK.

Two backends behind the same tools and resources:

* embedded (`EmbeddedBackend`): a `MonitorService` on a SQLite file, entered by one engine thread (the store
  is opened on it). The mute sweep and lease expiry run on a one-second timer; appends wake resource
  subscribers through `service.add_listener`, and a pull asked to `wait` is held until an append.
* remote (`RemoteBackend`): an `mp serve` reached through `monitor_protocol.client.AsyncClient`; subscribed
  resources are watched by polling each monitor's state once a second (only while someone subscribed).

Tools take their token as the `token` argument; when absent, the environment supplies it by role, as for the
CLI: owner tools (publish, configure, subscribe) MP_OWNER_TOKEN then MP_TOKEN, reader tools (pull, ack, seek,
renew, retire_subscription, lease_*) MP_READER_TOKEN then MP_TOKEN, the rest (discover, list, get, state,
create, and resource reads) MP_TOKEN then MP_OWNER_TOKEN. A protocol refusal comes back as a tool error
(`isError: true`) whose text starts with the code and whose structured content is the REST error body.

Resource updates reach both MCP eras: `resources/subscribe` (handshake era) gets
`notifications/resources/updated` on its session, and `subscriptions/listen` (2026-07-28) streams get the same
notification through the SDK's subscription bus. Notifications are wake-ups only; delivery is pull + ack.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated

from .errors import ProtocolError
from .validation import as_int
from .vocab import (
    CAPABILITIES,
    EXTENSION_ID,
    HORIZONS,
    JSONRPC_CODE,
    ORIGINS,
    PROTOCOL_VERSION,
    PROTOCOLS,
    RESET_POLICIES,
    TIERS,
    VERIFICATIONS,
    VISIBILITIES,
)

log = logging.getLogger("monitor_protocol.mcp")

SERVER_NAME = "monitor-protocol"
SWEEP_INTERVAL_SECONDS = 1.0
POLL_INTERVAL_SECONDS = 1.0
MAX_WAIT_SECONDS = 50.0
RESOURCE_URI = re.compile(r"^monitor://([^/]+)/(definition|state)$")

OWNER_ENV = ("MP_OWNER_TOKEN", "MP_TOKEN")
READER_ENV = ("MP_READER_TOKEN", "MP_TOKEN")
VIEWER_ENV = ("MP_TOKEN", "MP_OWNER_TOKEN")

INSTRUCTIONS = (
    f"Monitor Protocol v{PROTOCOL_VERSION} (MCP extension {EXTENSION_ID}). A monitor is an append-only log of "
    "observations with a computed state. To follow one: monitor_subscribe (keep the reader token it returns), "
    "then repeat monitor_pull and, once you have handled the batch, monitor_ack with the pull's `next`. Pull "
    "never commits; only ack does. Work items are claimed with lease_claim and finished with lease_complete. "
    "Resources monitor://{id}/definition and monitor://{id}/state can be subscribed to for wake-ups."
)


class ToolFailure(Exception):
    """A refusal or a transport failure, carried as the REST error body `{code, error, done, ...}`."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('code')}: {body.get('error')}")
        self.body = body


def env_token(roles: tuple[str, ...]) -> str | None:
    for name in roles:
        value = os.environ.get(name)
        if value:
            return value
    return None


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

    async def start(self, on_change: Callable[[str], None]) -> None:
        import time

        from .service import MonitorService
        from .store.sqlite import SQLiteStore

        self.loop = asyncio.get_running_loop()
        self._on_change = on_change

        def build() -> None:
            self.store = SQLiteStore(self.db_path)
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
    """An `mp serve` over HTTP, through the async client; resource changes are found by polling state."""

    def __init__(self, base: str, *, poll_interval: float = POLL_INTERVAL_SECONDS) -> None:
        from .client import AsyncClient

        self.client = AsyncClient(base)
        self.poll_interval = poll_interval
        self.watched: Callable[[], set[str]] = set
        self._on_change: Callable[[str], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._heads: dict[str, Any] = {}

    async def start(self, on_change: Callable[[str], None], watched: Callable[[], set[str]] = set) -> None:
        self._on_change = on_change
        self.watched = watched
        self._task = asyncio.create_task(self._poller(), name="mp-mcp-poll")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self.client.aclose()

    async def _mark(self, monitor_id: str) -> Any:
        from .client import ConnectionFailed, MonitorProtocolError

        try:
            state = await self.client.request(
                "GET", f"/monitors/{_seg(monitor_id)}/state", token=env_token(VIEWER_ENV)
            )
            return (state.get("head"), json.dumps(state.get("live"), sort_keys=True))
        except (ConnectionFailed, MonitorProtocolError) as exc:
            return ("error", getattr(exc, "code", "DOWN"))

    async def prime(self, monitor_id: str) -> None:
        """Record where a newly watched monitor stands, so the first change after a subscribe is seen."""
        if monitor_id not in self._heads:
            self._heads[monitor_id] = await self._mark(monitor_id)

    async def _poller(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            watched = self.watched()
            for monitor_id in sorted(watched):
                mark = await self._mark(monitor_id)
                before = self._heads.get(monitor_id)
                self._heads[monitor_id] = mark
                if before is not None and before != mark and self._on_change is not None:
                    self._on_change(monitor_id)
            for gone in set(self._heads) - watched:
                del self._heads[gone]

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
        "items": {"type": ["string", "integer"]},
        "description": "seqs or ids this was derived from",
    },
    "supersedes": _s(["string", "integer"], "the seq this observation corrects (P13)"),
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
    "ttl_seconds": _s("integer", "stale after this many seconds without an observation"),
    "retire_after_mute_seconds": _s("integer", "retire subscriptions that do not pull for this long"),
    "subscribe_token": _s("boolean", "mint a subscribe token"),
    "token": _s("string", "the server's registration token, when it requires one"),
}


class ToolSpec:
    def __init__(
        self,
        name: str,
        description: str,
        properties: dict[str, Any],
        required: list[str],
        run: Callable[[Any, dict[str, Any]], Awaitable[Any]],
        *,
        read_only: bool = False,
    ) -> None:
        self.name = name
        self.description = description
        self.schema = {"type": "object", "properties": properties, "required": required}
        self.run = run
        self.read_only = read_only

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.schema,
            annotations=types.ToolAnnotations(read_only_hint=self.read_only),
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
    return [
        ToolSpec(
            "monitor_discover",
            "What this server supports: versions, feeds, limits, extensions.",
            {},
            [],
            _discover,
            read_only=True,
        ),
        ToolSpec(
            "monitor_list",
            "Monitors this token may see (public ones without a token).",
            {"token": TOKEN},
            [],
            _list,
            read_only=True,
        ),
        ToolSpec(
            "monitor_get",
            "One monitor's definition.",
            {"id": MONITOR_ID, "token": TOKEN},
            ["id"],
            _get,
            read_only=True,
        ),
        ToolSpec(
            "monitor_create",
            "Create a monitor. The reply carries its owner token, shown once: keep it.",
            MONITOR_FIELDS,
            ["id"],
            _create,
        ),
        ToolSpec(
            "monitor_configure",
            "Change a monitor (owner): update (with a patch), pause, resume or "
            "retire. Every change is itself an observation.",
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
        ),
        ToolSpec(
            "monitor_publish",
            "Append an observation (owner token). An agent acting for the owner sets "
            "actor to itself and on_behalf_of to the owner.",
            {"id": MONITOR_ID, **PUBLISH_FIELDS, "token": TOKEN},
            ["id", "type"],
            _publish,
        ),
        ToolSpec(
            "monitor_state",
            "A monitor's computed state: head, live, counters, ages, confidence (with "
            "what it does not know).",
            {"id": MONITOR_ID, "token": TOKEN},
            ["id"],
            _state,
            read_only=True,
        ),
        ToolSpec(
            "monitor_subscribe",
            "Subscribe to a monitor. The reply carries the reader token, shown once.",
            {
                "monitor": MONITOR_ID,
                "subscriber": _s("string", "your name, e.g. agent:triage"),
                "capabilities": {**CAP_LIST, "description": "asked capabilities (granted, not requested)"},
                "filter": FILTER,
                "from": _s(["string", "integer"], "head, earliest or a seq (default: the beginning)"),
                "protocol": _enum(PROTOCOLS, "delivery protocol"),
                "reset_policy": _enum(RESET_POLICIES, "what happens when the cursor expires"),
                "sink": _s("string", "push URL for protocol http"),
                "retire_after_mute_seconds": _s("integer", "retire when not pulled for this long"),
                "token": _s("string", "owner or subscribe token, or this subscription's token to re-key"),
            },
            ["monitor", "subscriber"],
            _subscribe,
        ),
        ToolSpec(
            "monitor_pull",
            "Read observations at the cursor. Never commits: call monitor_ack with `next` "
            "after handling them. `wait` long-polls up to 50 s.",
            {
                **sub,
                "cursor": _s("integer", "read-only replay from this seq"),
                "limit": _s("integer", "1..200 (default 50)"),
                "wait": _s("integer", "long poll whole seconds (0..50)"),
                "filter": FILTER,
            },
            ["subscription"],
            _pull,
            read_only=True,
        ),
        ToolSpec(
            "monitor_ack",
            "Commit the cursor (the pull's `next`): cumulative, never backwards.",
            {**sub, "cursor": _s("integer", "the next seq to deliver")},
            ["subscription", "cursor"],
            _reader("ack", "cursor"),
        ),
        ToolSpec(
            "monitor_seek",
            "Move the cursor explicitly (the only way backwards), with a reason.",
            {**sub, "cursor": _s("integer", "the new cursor"), "reason": _s("string", "why (logged)")},
            ["subscription", "cursor", "reason"],
            _reader("seek", "cursor", "reason"),
        ),
        ToolSpec(
            "monitor_renew",
            "Rotate the subscription's token (same cursor); the old one dies at once.",
            sub,
            ["subscription"],
            _reader("renew"),
        ),
        ToolSpec(
            "monitor_retire_subscription",
            "Retire the subscription (its leases are released).",
            {**sub, "reason": _s("string", "why")},
            ["subscription"],
            _reader("retire_subscription"),
        ),
        ToolSpec(
            "lease_claim",
            "Claim exclusive, expiring ownership of a subject (needs act).",
            {
                **sub,
                "subject": SUBJECT,
                "lease_duration_seconds": _s("integer", "lease length"),
                "note": _s("string", "note"),
            },
            ["subscription", "subject"],
            _lease("claim"),
        ),
        ToolSpec(
            "lease_renew",
            "Extend a lease you hold.",
            {**sub, "subject": SUBJECT, "lease_duration_seconds": _s("integer", "lease length")},
            ["subscription", "subject"],
            _lease("renew"),
        ),
        ToolSpec(
            "lease_complete",
            "Finish a lease you hold with an outcome.",
            {
                **sub,
                "subject": SUBJECT,
                "outcome": _s("string", "e.g. fixed, done"),
                "evidence": _s(["object", "array", "string"], "evidence"),
                "note": _s("string", "note"),
            },
            ["subscription", "subject", "outcome"],
            _lease("complete"),
        ),
        ToolSpec(
            "lease_release",
            "Give a held lease back.",
            {**sub, "subject": SUBJECT, "reason": _s("string", "why")},
            ["subscription", "subject"],
            _lease("release"),
        ),
        ToolSpec(
            "lease_reject",
            "Give a subject back as failed; it dead-letters at the delivery count limit.",
            {**sub, "subject": SUBJECT, "reason": _s("string", "why")},
            ["subscription", "subject"],
            _lease("reject"),
        ),
    ]


# ---------------------------------------------------------------------------------------------- server


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


class MonitorMCP:
    """Tools, resources and resource-update notifications over one backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.specs = {spec.name: spec for spec in tool_specs()}
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        # handshake era: uri -> sessions subscribed to it; 2026-07-28 era: uri -> open listen streams
        self.legacy_subs: dict[str, set[Any]] = {}
        self.listen_subs: dict[str, int] = {}
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=PROTOCOL_VERSION,
            title="Monitor Protocol",
            instructions=INSTRUCTIONS,
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
        """Called on the loop when a monitor's log moved: wake every subscriber of its resources."""
        for kind in ("definition", "state"):
            uri = f"monitor://{monitor_id}/{kind}"
            if self.legacy_subs.get(uri) or self.listen_subs.get(uri):
                asyncio.get_running_loop().create_task(self._notify(uri))

    async def _notify(self, uri: str) -> None:
        await self.bus.publish(ResourceUpdated(uri=uri))
        for session in list(self.legacy_subs.get(uri, ())):
            try:
                await session.send_resource_updated(uri)
            except Exception:
                self.legacy_subs.get(uri, set()).discard(session)  # that client is gone

    async def run_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        if isinstance(self.backend, RemoteBackend):
            await self.backend.start(self.monitor_changed, self.watched_monitors)
        else:
            await self.backend.start(self.monitor_changed)
        try:
            async with stdio_server() as (read_stream, write_stream):
                options = self.server.create_initialization_options(
                    experimental_capabilities={EXTENSION_ID: {"version": PROTOCOL_VERSION}}
                )
                await self.server.run(read_stream, write_stream, options)
        finally:
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
        try:
            result = await spec.run(self.backend, dict(params.arguments or {}))
        except ToolFailure as failure:
            return self._failure(failure.body)
        except ProtocolError as err:  # an argument refused before it reached the engine or the server
            return self._failure(err.body())
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

    async def _read_resource(
        self, ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        from mcp.shared.exceptions import MCPError

        uri = str(params.uri)
        match = RESOURCE_URI.match(uri)
        if not match:
            raise MCPError(
                types.INVALID_PARAMS,
                f"unknown resource {uri}; use monitor://{{id}}/definition or monitor://{{id}}/state",
            )
        monitor_id, kind = match.groups()
        token = env_token(VIEWER_ENV)
        try:
            if kind == "definition":
                value = await self.backend.get_monitor(monitor_id, token)
            else:
                value = await self.backend.state(monitor_id, token)
        except ToolFailure as failure:
            code = JSONRPC_CODE.get(str(failure.body.get("code")), types.INVALID_PARAMS)
            raise MCPError(
                code, f"{failure.body.get('code')}: {failure.body.get('error')}", failure.body
            ) from failure
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=_text(value))]
        )

    async def _prime(self, uris: list[str]) -> None:
        prime = getattr(self.backend, "prime", None)
        if prime is None:
            return
        for uri in uris:
            match = RESOURCE_URI.match(uri)
            if match:
                await prime(match.group(1))

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        await self._prime([str(params.uri)])
        self.legacy_subs.setdefault(str(params.uri), set()).add(ctx.session)
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        self.legacy_subs.get(str(params.uri), set()).discard(ctx.session)
        return types.EmptyResult()

    async def _listen(self, ctx: Any, params: types.SubscriptionsListenRequestParams) -> Any:
        uris = list(params.notifications.resource_subscriptions or [])
        await self._prime(uris)
        for uri in uris:
            self.listen_subs[uri] = self.listen_subs.get(uri, 0) + 1
        try:
            return await self.listen(ctx, params)
        finally:
            for uri in uris:
                self.listen_subs[uri] -= 1
                if self.listen_subs[uri] <= 0:
                    del self.listen_subs[uri]


def build(db: str | None = None, base: str | None = None) -> MonitorMCP:
    """The MCP server on an embedded database (`db`) or against an `mp serve` (`base`)."""
    if base:
        return MonitorMCP(RemoteBackend(base))
    return MonitorMCP(EmbeddedBackend(db or "monitor-protocol.db"))
