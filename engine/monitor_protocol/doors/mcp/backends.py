"""The MCP door's two backends behind the same tools and resources: `EmbeddedBackend` (a MonitorService on a
SQLite file, entered by the doors' one engine thread) and `RemoteBackend` (an `mp serve` through the async
client). Each offers `perform(op, path, payload, token)` for every tool of the operations table, `pull` with a
long poll, and `watch`/`unwatch` for resource updates."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import sqlite3
from collections.abc import Callable
from typing import Any

from monitor_protocol.api import operations
from monitor_protocol.api.messages import pull_has_news
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.repeats import Repeats
from monitor_protocol.core.vocab import MAX_LIMIT
from monitor_protocol.core.vocab import MAX_WAIT_SECONDS as _MAX_WAIT
from monitor_protocol.doors import parking
from monitor_protocol.doors.engines import EngineThread
from monitor_protocol.doors.parking import Waiters

log = logging.getLogger("monitor_protocol.mcp")

SERVER_NAME = "monitor-protocol"
SWEEP_INTERVAL_SECONDS = 1.0
MAX_WAIT_SECONDS = float(_MAX_WAIT)
NOTIFY_INTERVAL_SECONDS = 0.25  # at most one resources/updated per resource in this window
WATCH_WAIT_SECONDS = 30  # --base: the long poll a watch subscription holds against the server
WATCH_MUTE_SECONDS = 3600  # a watch left behind by a killed process is retired by the server's sweep
WATCH_BACKOFF_MAX_SECONDS = 10.0
RESOURCE_URI = re.compile(r"^monitor://([^/]+)/(definition|state|source)$")

OWNER_ENV = ("MP_OWNER_TOKEN", "MP_TOKEN")
READER_ENV = ("MP_READER_TOKEN", "MP_TOKEN")
VIEWER_ENV = ("MP_TOKEN", "MP_OWNER_TOKEN")


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


class EmbeddedBackend:
    """`MonitorService` on SQLite, entered only from the doors' one engine thread (the store is opened
    there too)."""

    def __init__(self, db_path: str, *, sweep_interval: float = SWEEP_INTERVAL_SECONDS) -> None:
        self.db_path = db_path
        self.sweep_interval = sweep_interval
        self.engine = EngineThread()
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
        self.engine.stop()

    async def watch(self, monitor_id: str) -> None:
        """Appends reach `on_change` through the service's listener: nothing to set up."""

    async def unwatch(self, monitor_id: str) -> None:
        pass

    async def _engine(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.engine.call(fn, *args)

    async def _sweeper(self) -> None:
        failing = Repeats(log, "sweep")
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                await self._engine(self.service.sweep)
            except ProtocolError as err:  # the file is locked (503): a few lines an outage, not one a tick
                failing.failed(f"{err.code}: {err.message}")
            except Exception:
                log.exception("sweep failed")
            else:
                failing.ok()

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

    async def list_monitors(self, token: str | None, *, limit: Any = None, after: Any = None) -> Any:
        return await self.call("list_monitors", token, limit=limit, after=after)

    async def get_monitor(self, monitor_id: str, token: str | None) -> Any:
        return await self.call("get_monitor", monitor_id, token)

    async def state(self, monitor_id: str, token: str | None) -> Any:
        return await self.call("state", monitor_id, token)

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

        async def pulled(remaining: float) -> parking.Outcome:
            reply, mark = await self._pull_marked(sub_id, token, cursor, limit, filter)
            answered = pull_has_news(reply) or remaining <= 0
            return reply, None if answered else str(reply.get("monitor", "")), mark

        reply, waiting, mark = await pulled(deadline - loop.time())
        if waiting is None:
            return reply
        # Parked until an append after the one this pull saw (`mark`), so an append that landed between the
        # pull and the parking wakes it at once; then pulled again (parking.hold).
        return await parking.hold(self.waiters, waiting, mark, deadline, pulled)

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
            token = env_token(VIEWER_ENV)
            try:
                reply = await self._subscribe_watch(monitor_id, token)
            except ToolFailure as failure:
                if token and failure.body.get("code") in ("NOT_FOUND", "UNAUTHORIZED"):
                    # The monitor may well be readable with this token (a reader token reads its monitor's
                    # state), but following it means making a subscription, which a reader token cannot.
                    failure.body["error"] = (
                        f"{failure.body.get('error')} Following a monitor over --base makes a subscription "
                        "of this process: that needs the monitor's owner token or subscribe token (or none, on "
                        "a public monitor) in MP_TOKEN or MP_OWNER_TOKEN; a reader token cannot subscribe."
                    )
                raise
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
                # After a failure, a pull that does not wait: the server answering again is told at once,
                # not when a long poll on a quiet monitor ends 30 s later.
                wait = 0 if failed else self.watch_wait
                reply = await self.pull(watch["id"], watch["token"], limit=MAX_LIMIT, wait=wait)
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
                    await self._service("ack", {"id": watch["id"]}, {"cursor": reply["next"]}, watch["token"])
                except ToolFailure as failure:
                    log.info("watch of %s: ack failed: %s", monitor_id, failure)
                if not all(self._own(o) for o in observations):
                    self._changed(monitor_id)
            elif wait and loop.time() - started < 0.05:
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
            # Whether the request may have reached the server: what a model needs to decide on a retry.
            then = (
                "it may have reached the server: send again only what is safe to repeat (a publish with the "
                "same idempotency_key, a pull, an ack); a publish without a key may have landed, so read the "
                "monitor's state (its head) or pull before publishing it again"
                if err.sent
                else "it was never sent: sending it again is safe"
            )
            raise ToolFailure(
                {
                    "code": "CONNECTION_FAILED",
                    "error": f"the server at {self.client.base} did not answer ({err.reason}); {then}.",
                    "sent": err.sent,
                    "done": [],
                }
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

    async def list_monitors(self, token: str | None, *, limit: Any = None, after: Any = None) -> Any:
        params = [(k, str(v)) for k, v in (("limit", limit), ("after", after)) if v is not None]
        return await self._req("GET", "/monitors", token, None, params)

    async def get_monitor(self, monitor_id: str, token: str | None) -> Any:
        return await self._service("get_monitor", {"id": monitor_id}, None, token)

    async def state(self, monitor_id: str, token: str | None) -> Any:
        return await self._service("state", {"id": monitor_id}, None, token)

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
        from monitor_protocol.client.routes import LONG_POLL_MARGIN, filter_params

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


def _expand(op: operations.Operation, path: dict[str, Any]) -> str:
    """The operation's route with its path parameters (and `{action}`) filled in, each one URL-quoted."""
    values = {"action": op.action, **path}
    return re.sub(r"\{(\w+)\}", lambda m: _seg(values[m.group(1)]), op.route)


def _seg(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")
