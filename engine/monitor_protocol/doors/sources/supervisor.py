"""`mp serve --sources`: the server runs the sources of the monitors it holds (docs/protocol.md section 12).

The supervisor runs on the server's event loop beside HTTP push. Its engine calls go through the engine's seat
(`await engine.call(fn, *args)`: on the loop for SQLite, on the engine thread for PostgreSQL), so a source's
publish joins the requests' group commits and is durable before the source reads on.

* At start, and whenever a monitor is created, updated, paused, resumed, retired or imported here
  (`MonitorService.add_config_listener`), it reconciles: a runnable source of an active monitor whose
  definition and the operator's policy allow it runs (`Runner`); a paused or retired monitor's source stops;
  a changed definition restarts it. Every 30 s it looks at every monitor again (what another server of a
  shared store changed, or leadership moving), 500 monitors an engine call.
* Each start, stop, crash, restart, refusal and throttling is a row of the monitor's log
  (`python.monitor-protocol.source`, `MonitorService.source_event`), and the last one is the source's
  status in the monitor's state. A source the definition or the policy refuses stays defined: the row and
  the state say why, and nothing runs. The refusal is written again only when its reason changes.
* What a runner publishes goes through `MonitorService.publish_as_source` with where it stands (the
  checkpoint), in one transaction: after a restart, even a `kill -9`, each source resumes from its last
  committed checkpoint (a file's offset, a feed's seq), and its idempotency keys make a re-sent line a
  repeat, never a duplicate.
* On a store several servers share, only the server holding the leader lock runs sources.
* One monitor's definition never stops the others: whatever fails while reconciling one (even an error no
  rule foresaw) is logged and written as that monitor's refused row, and the loop goes on.
* At most `max_sources` sources run on this server and `MAX_SOURCES_PER_OWNER` per declared owner; past
  that a source is refused (and started at a later look, once there is room).
* Stopping is bounded: a source's task is cancelled again until it ends (STOP_SECONDS at most), and at
  shutdown every source is stopped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.core import netguard, sources
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.sources import Plan, Policy, SourceRefused
from monitor_protocol.core.vocab import (
    DEFAULT_MAX_SOURCES,
    DEFAULT_SOURCE_RATE_PER_MINUTE,
    MAX_SOURCES_PER_OWNER,
)
from monitor_protocol.doors.sources.runner import OVER_BUDGET, PUBLISHED, REFUSED, STOPPED, Options, Runner

log = logging.getLogger("monitor_protocol.sources")

Call = Callable[..., Awaitable[Any]]
RESCAN_SECONDS = 30.0
STORAGE_RETRY_SECONDS = 1.0
STORAGE_RETRIES = 30
WAS_RUNNING = "the server stopped without stopping this source (it crashed or was killed)"
STOP_GRACE_SECONDS = 8.0  # a stop's first wait: a process's SIGTERM grace and then its SIGKILL
STOP_SECONDS = 15.0  # how long a stop waits for a source's task in all, cancelling it again each second


@dataclass
class Running:
    version: int
    plan: Plan
    task: asyncio.Task[None]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    owner: Any = None


class EngineSink:
    """Where a server-run source's output goes: the engine, as the monitor's own source."""

    def __init__(self, sup: Supervisor, monitor_id: str, note: str | None = None) -> None:
        self.sup = sup
        self.monitor_id = monitor_id
        self.note = note  # said once, on the first row (why the last run ended without a stop row)

    async def publish(self, body: dict[str, Any], checkpoint: dict[str, Any] | None) -> str:
        service = self.sup.service
        for _ in range(STORAGE_RETRIES):
            try:
                await self.sup.call(service.publish_as_source, self.monitor_id, body, checkpoint)
                return PUBLISHED
            except ProtocolError as err:
                if err.code == "OVER_BUDGET":
                    return OVER_BUDGET
                if err.code == "UNAVAILABLE" and err.extras.get("storage"):
                    await asyncio.sleep(STORAGE_RETRY_SECONDS)  # nothing was written: the same again
                    continue
                if err.code == "UNAVAILABLE":
                    return STOPPED  # paused or retired under it: the supervisor is stopping it
                if not err.extras.get("rejected_seq"):
                    # Refused before anything was logged (a checkpoint too large to keep): every line would
                    # vanish the same way, so the source stops and its refused row says why.
                    raise SourceRefused(f"an observation could not be published: {err.message}") from None
                return REFUSED  # refused and logged (P2), as for any publisher; the source goes on
        log.error(
            "source of %s: the store stayed unavailable; an observation was not published", self.monitor_id
        )
        return REFUSED

    async def checkpoint(self, checkpoint: dict[str, Any]) -> None:
        try:
            await self.sup.call(self.sup.service.keep_checkpoint, self.monitor_id, checkpoint)
        except ProtocolError as err:
            log.warning("source of %s: checkpoint not kept (%s: %s)", self.monitor_id, err.code, err.message)

    async def event(self, action: str, payload: dict[str, Any]) -> None:
        if self.note is not None:
            payload = {**payload, "after": self.note}
            self.note = None
        try:
            await self.sup.call(self.sup.service.source_event, self.monitor_id, action, payload)
        except Exception as err:  # a row not written never stops a source, nor a stop
            if not isinstance(err, ProtocolError):
                log.exception("source of %s: %s row not written", self.monitor_id, action)
                return
            log.warning(
                "source of %s: %s row not written (%s: %s)", self.monitor_id, action, err.code, err.message
            )
        log.info(
            "source of %s: %s%s",
            self.monitor_id,
            action,
            f" ({payload['reason']})" if payload.get("reason") else "",
        )


class Supervisor:
    def __init__(
        self,
        call: Call,
        service: Any,
        policy: Policy,
        *,
        rate: int = DEFAULT_SOURCE_RATE_PER_MINUTE,
        max_sources: int = DEFAULT_MAX_SOURCES,
        rescan_seconds: float = RESCAN_SECONDS,
        which: Callable[[str], str | None] = shutil.which,
        realpath: Callable[[str], str] = os.path.realpath,
    ) -> None:
        self.call = call
        self.service = service
        self.policy = policy
        self.rate = rate
        self.max_sources = max_sources
        self.env = sources.minimal_env(os.environ, policy.env)
        self.rescan_seconds = rescan_seconds
        self.which = which
        self.realpath = realpath
        self.runners: dict[str, Running] = {}
        self.feeds_of: dict[str, set[str]] = {}  # another monitor -> the monitors that feed on it
        self.dirty: set[str] = set()
        self.refused: dict[
            str, tuple[int, str]
        ] = {}  # the refusal last written, by monitor (version, reason)
        self.wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._first = True  # the first look after the server started (a "running" status is stale)

    # -- hearing about changes ---------------------------------------------------------------------
    def _hop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _configured(self, monitor_id: str) -> None:  # on the engine's seat (perhaps another thread)
        self._hop(self._mark, monitor_id)

    def _mark(self, monitor_id: str) -> None:
        self.dirty.add(monitor_id)
        self.wake.set()

    def _appended(self, monitor_id: str, head: int) -> None:  # a feed's other monitor grew: wake the feed
        if monitor_id in self.feeds_of:
            self._hop(self._wake_feeds, monitor_id)

    def _wake_feeds(self, monitor_id: str) -> None:
        for feeder in self.feeds_of.get(monitor_id, ()):
            running = self.runners.get(feeder)
            if running is not None:
                running.wake.set()

    def _here(self) -> bool:
        here = getattr(self.service, "sweeps_here", None)
        return True if here is None else bool(here())

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.service.sources_here = True
        self.service.add_config_listener(self._configured)
        await self.call(self.service.add_listener, self._appended)
        try:
            full = True
            while True:
                # Cleared before looking: a change heard while this look awaits the engine wakes the next one.
                self.wake.clear()
                try:
                    await self.look(full)
                except ProtocolError as err:  # the store is away (503): look again later
                    log.warning("sources: reading the monitors failed (%s): %s", err.code, err.message)
                    full = True
                except Exception:  # never the end of every source: look again later
                    log.exception("sources: looking at the monitors failed")
                    full = True
                else:
                    full = False
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives as
                # the event is set, and the server's stop would wait for ever.
                try:
                    async with asyncio.timeout(self.rescan_seconds):
                        await self.wake.wait()
                except TimeoutError:
                    full = True
        finally:
            await asyncio.gather(
                *(self.stop(m, "the server stopped") for m in list(self.runners)), return_exceptions=True
            )
            self.service.remove_config_listener(self._configured)
            with contextlib.suppress(Exception):
                await self.call(self.service.remove_listener, self._appended)

    async def look(self, full: bool) -> None:
        """Reconcile the monitors heard about since the last look, or every monitor (`full`, and first)."""
        if not self._here():
            for monitor_id in list(self.runners):
                await self.stop(
                    monitor_id, "another server holds the store's leader lock and runs the sources"
                )
            self._first = True
            return
        dirty, self.dirty = self.dirty, set()
        if not full and not self._first:
            for monitor_id in sorted(dirty):
                views = await self.call(self.service.sources_view, monitor_id)
                await self.reconcile_one(monitor_id, views[0] if views else None)
            return
        views: dict[str, dict[str, Any]] = {}
        after: str | None = ""
        while after is not None:  # a page an engine call: requests go on between them
            page = await self.call(self.service.sources_page, after)
            views.update((v["monitor"]["id"], v) for v in page["views"])
            after = page["next"]
        for monitor_id in sorted(set(views) | set(self.runners)):
            await self.reconcile_one(monitor_id, views.get(monitor_id))
        self._first = False

    async def reconcile_one(self, monitor_id: str, view: dict[str, Any] | None) -> None:
        """reconcile, with whatever fails for this one monitor logged and said in its log, never raised."""
        try:
            await self.reconcile(monitor_id, view)
        except ProtocolError:
            raise  # the store is away: the whole look is tried again
        except Exception as exc:
            log.exception("source of %s: could not be started or stopped", monitor_id)
            if view is not None:
                with contextlib.suppress(Exception):
                    await self.refuse(view, f"the server could not run this source ({type(exc).__name__})")

    async def reconcile(self, monitor_id: str, view: dict[str, Any] | None) -> None:
        running = self.runners.get(monitor_id)
        if view is None:
            if running is not None:
                await self.stop(monitor_id, "the source is no longer one this server runs")
            return
        if not view["active"]:
            if running is not None:
                await self.stop(monitor_id, f"the monitor was {view['status']}")
            return
        if running is not None and running.version == view["version"] and not running.task.done():
            return
        if running is not None:
            await self.stop(monitor_id, f"the definition changed (version {view['version']})")
        await self.start(view)

    # -- one source ---------------------------------------------------------------------------------
    def judge(self, plan: Plan, attested: bool = True) -> str | None:
        return sources.policy_refusal(
            plan,
            self.policy,
            attested=attested,
            which=self.which,
            realpath=self.realpath,
            sink_refusal=netguard.sink_refusal,
        )

    def crowded(self, view: dict[str, Any]) -> str | None:
        """Whether another source may start: at most max_sources on this server, MAX_SOURCES_PER_OWNER per
        declared owner."""
        if len(self.runners) >= self.max_sources:
            return f"this server already runs {self.max_sources} sources, as many as its operator allows"
        owner = view["monitor"].get("owner")
        mine = sum(1 for r in self.runners.values() if r.owner == owner)
        if mine >= MAX_SOURCES_PER_OWNER:
            return f"the monitors of owner {str(owner)[:100]} already run {MAX_SOURCES_PER_OWNER} sources"
        return None

    async def refuse(self, view: dict[str, Any], reason: str) -> None:
        monitor_id = view["monitor"]["id"]
        status = view.get("source_status") or {}
        said = (status.get("status") == "refused" and status.get("reason") == reason) or self.refused.get(
            monitor_id
        ) == (view["version"], reason)
        self.refused[monitor_id] = (view["version"], reason)
        if said:
            return  # said already, in the log and in the state
        source = view["monitor"].get("source") or {}
        payload = sources.supervision("refused", source, reason=reason)
        await EngineSink(self, monitor_id).event("refused", payload)

    async def start(self, view: dict[str, Any]) -> None:
        monitor_id = view["monitor"]["id"]
        try:
            plan = sources.plan_of(view["monitor"])
        except SourceRefused as refused:
            await self.refuse(view, refused.reason)
            return
        refusal = self.judge(plan, bool(view["monitor"].get("attested")))
        if refusal is not None:
            log.warning(
                "source of %s refused: %s (this server allows %s; unattested monitors: %s)",
                monitor_id,
                refusal,
                self.policy.describe(),
                "allowed" if self.policy.unattested else "refused",
            )
            await self.refuse(view, refusal)
            return
        crowded = self.crowded(view)
        if crowded is not None:
            await self.refuse(view, crowded)
            return
        self.refused.pop(monitor_id, None)
        previous = (view.get("source_status") or {}).get("status")
        note = WAS_RUNNING if self._first and previous in ("running", "restarting") else None
        sink = EngineSink(self, monitor_id, note)
        wake = asyncio.Event()

        def file_check(path: str) -> str | None:
            return sources.policy_refusal(
                Plan(monitor=plan.monitor, kind="file", ref=path, mode=plan.mode),
                self.policy,
                realpath=self.realpath,
            )

        async def feed_step(p: Plan) -> dict[str, Any]:
            return dict(await self.call(self.service.feed_step, monitor_id, p))

        options = Options(
            rate=self.rate,
            ceiling=self.rate,
            env=self.env,
            ttl=view.get("ttl_seconds"),
            guarded=True,
            allowed_sinks=self.policy.sinks,
            file_check=file_check,
            feed_step=feed_step,
            feed_wake=wake,
        )
        runner = Runner(plan, sink, view.get("checkpoint"), options)
        task = asyncio.create_task(self._guard(monitor_id, runner, view), name=f"mp-source-{monitor_id}")
        self.runners[monitor_id] = Running(view["version"], plan, task, wake, view["monitor"].get("owner"))
        if plan.kind == "feed":
            self.feeds_of.setdefault(plan.ref, set()).add(monitor_id)

    async def _guard(self, monitor_id: str, runner: Runner, view: dict[str, Any]) -> None:
        """Run one source; a refusal found while running (a file link swapped, a feed's monitor made private)
        ends it with a refused row; a failure of the runner itself is a crash row, and it starts again."""
        failures = 0
        while True:
            try:
                await runner.run()
                return
            except asyncio.CancelledError:
                raise
            except SourceRefused as refused:
                await self.refuse(view, refused.reason)
                return
            except Exception as exc:
                log.exception("source of %s failed", monitor_id)
                failures += 1
                delay = sources.backoff(failures)
                await runner.sink.event(
                    "crash",
                    sources.supervision(
                        "crash",
                        runner.plan,
                        reason=f"the runner failed: {exc!r}"[:500],
                        backoff_seconds=delay,
                    ),
                )
                await asyncio.sleep(delay)
                views = await self.call(self.service.sources_view, monitor_id)
                checkpoint = views[0].get("checkpoint") if views else None
                runner = Runner(runner.plan, runner.sink, checkpoint, runner.options)

    async def stop(self, monitor_id: str, reason: str) -> None:
        running = self.runners.pop(monitor_id, None)
        if running is None:
            return
        for feeders in self.feeds_of.values():
            feeders.discard(monitor_id)
        was_running = not running.task.done()
        # Cancelled again each second (after the first wait) until it ends: a cancellation swallowed once (a
        # wait that finished in the same turn) must not leave a stop, or the server's shutdown, waiting for ever.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_SECONDS
        wait = STOP_GRACE_SECONDS  # a process's own stop (SIGTERM, then SIGKILL) first, undisturbed
        while not running.task.done():
            running.task.cancel()
            await asyncio.wait({running.task}, timeout=wait)
            wait = 1.0
            if loop.time() >= deadline:
                log.error("source of %s did not stop within %g s; left behind", monitor_id, STOP_SECONDS)
                break
        if running.task.done() and not running.task.cancelled():
            with contextlib.suppress(BaseException):
                running.task.result()  # retrieved, so that asyncio does not log it as never retrieved
        if was_running:
            payload = sources.supervision("stop", running.plan, reason=reason)
            await EngineSink(self, monitor_id).event("stop", payload)


def sources_task(
    policy: Policy, rate: int = DEFAULT_SOURCE_RATE_PER_MINUTE, max_sources: int = DEFAULT_MAX_SOURCES
) -> Callable[[Any], Awaitable[None]]:
    """A `background_tasks` entry for `MonitorApp`: run the sources `policy` allows."""

    async def run_sources(app: Any) -> None:
        await Supervisor(app.engine.call, app.service, policy, rate=rate, max_sources=max_sources).run()

    return run_sources
