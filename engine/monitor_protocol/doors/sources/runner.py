"""One source running (docs/protocol.md section 12), for `mp serve --sources` and `mp probe` alike: the kind's
loop, what each thing seen becomes (core/sources.py), and where it goes (a `Sink`: the engine for the server,
the probe's spool and the client for `mp probe`).

* `shell`, long-lived (`cadence.event_driven`): every stdout line one observation; a process that cannot
  start or exits is a `crash` row (and, unless `settings.ok_exit` lists its status, a "not answering"
  observation), restarted after 1 s doubling to 60 s (back to 1 s once it stayed up 10 s);
* `shell`, periodic, and `http`: one run or fetch per period, one observation each, `settings.on_change`
  applied (`should_publish`);
* `file`: the lines appended, polled every `poll_seconds` (doors/sources/tail.py);
* `feed`: the server's engine reads the other monitor (rules/sources.py `feed_step`), woken by its appends.

Rate: a source publishes at most its monitor's `budget.observations_per_minute` (else the operator's default)
per minute, and on the server never more than the operator's `--source-rate` (a ceiling the owner's budget
cannot raise). Past it the source waits, it is not cut: a process's lines wait in its pipe, a file's in the
file, a feed's in the other log; a `throttled` row says so, once per minute at most. Past the monitor's
`limits.observations_per_day` (a publish refused OVER_BUDGET, logged as for any publisher, its checkpoint not
moved) it waits for the next UTC day the same way, then sends the same observation again.

A long-lived process's group (the leader's pid is its process group) is killed whenever the leader exits or
the source stops, so what the command started does not outlive it; and a leader that exited is seen as
exited even while a child it left keeps the pipe open."""

from __future__ import annotations

import asyncio
import datetime as _dt
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from monitor_protocol.core import sources
from monitor_protocol.core.sources import Plan, SourceRefused
from monitor_protocol.core.vocab import DEFAULT_SOURCE_RATE_PER_MINUTE
from monitor_protocol.doors.sources import processes
from monitor_protocol.doors.sources.fetch import Fetcher
from monitor_protocol.doors.sources.tail import FileTail

PUBLISHED = "published"
REFUSED = "refused"  # this one observation was refused (and logged): the source goes on
OVER_BUDGET = "over_budget"  # the monitor's day is used up: wait for the next
STOPPED = "stopped"  # the monitor no longer takes its source's observations (paused, retired)
STEADY_SECONDS = 10.0  # a process that stayed up this long starts its next crash streak at 1 s again
FEED_RESCAN_SECONDS = 5.0
DRAIN_SECONDS = 2.0  # after a long-lived leader exited: what is still in its pipe is read this long at most


class Sink(Protocol):
    async def publish(self, body: dict[str, Any], checkpoint: dict[str, Any] | None) -> str: ...

    async def checkpoint(self, checkpoint: dict[str, Any]) -> None: ...

    async def event(self, action: str, payload: dict[str, Any]) -> None: ...


@dataclass
class Options:
    rate: int = DEFAULT_SOURCE_RATE_PER_MINUTE  # the operator's default, when the monitor's budget says none
    ceiling: int | None = None  # the operator's most (the server: --source-rate), whatever the budget says
    ttl: int | None = None  # the monitor's ttl_seconds (on_change keeps contact fresh within it)
    env: Mapping[str, str] | None = None  # the command's (server: minimal_env; else the user's minus tokens)
    guarded: bool = False  # http through the push sink guard (the server)
    allowed_sinks: tuple[str, ...] = ()
    file_check: Callable[[str], str | None] | None = None  # the operator's policy at each open (the server)
    feed_step: Callable[[Plan], Awaitable[dict[str, Any]]] | None = None  # the server's engine call
    feed_wake: asyncio.Event | None = None
    poll_seconds: float = 0.5
    once: bool = False  # `mp probe --once`: one run, fetch or read, then return


class Rate:
    """At most `per_minute` observations in any minute window: `wait()` is how long to wait for the next."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = max(1, int(per_minute))
        self.clock = clock
        self.window = clock()
        self.used = 0

    def wait(self) -> float:
        now = self.clock()
        if now - self.window >= 60.0:
            self.window, self.used = now, 0
        if self.used < self.per_minute:
            self.used += 1
            return 0.0
        return self.window + 60.0 - now


def _next_utc_day(now: float) -> float:
    day = _dt.datetime.fromtimestamp(now, _dt.UTC).date() + _dt.timedelta(days=1)
    return _dt.datetime(day.year, day.month, day.day, tzinfo=_dt.UTC).timestamp()


class Runner:
    def __init__(
        self, plan: Plan, sink: Sink, checkpoint: dict[str, Any] | None = None, options: Options | None = None
    ) -> None:
        self.plan = plan
        self.sink = sink
        self.saved = dict(checkpoint or {})
        self.options = options or Options()
        per_minute = plan.rate or self.options.rate
        if self.options.ceiling is not None:
            per_minute = min(per_minute, self.options.ceiling)
        self.rate = Rate(per_minute)
        self.run_id = secrets.token_hex(6)
        self.count = 0
        self.throttled_at = float("-inf")  # when the last throttled row was written (one a minute at most)
        self.env = processes.environment(self.options.env)

    def key(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}:{self.run_id}:{self.count}"

    # -- publishing -------------------------------------------------------------------------------
    async def emit(self, body: dict[str, Any], checkpoint: dict[str, Any] | None) -> str:
        delay = self.rate.wait()
        while delay > 0:
            await self._throttled(
                f"more than {self.rate.per_minute} observations in a minute: the source waits",
                per_minute=self.rate.per_minute,
                wait_seconds=round(delay, 1),
            )
            await asyncio.sleep(delay)
            delay = self.rate.wait()
        outcome = await self.sink.publish(body, checkpoint)
        while outcome == OVER_BUDGET:
            # Nothing moved (the checkpoint was not committed with the refusal): the same observation is sent
            # again on the next UTC day, so waiting never drops it.
            until = _next_utc_day(time.time())
            await self._throttled(
                "limits.observations_per_day is used up: the source waits for the next UTC day",
                until=_dt.datetime.fromtimestamp(until, _dt.UTC).isoformat().replace("+00:00", "Z"),
            )
            await asyncio.sleep(max(0.0, until - time.time()))
            if self.options.once:
                return outcome
            outcome = await self.sink.publish(body, checkpoint)
        return outcome

    async def _throttled(self, reason: str, **extra: Any) -> None:
        now = time.monotonic()
        if now - self.throttled_at >= 60.0:
            self.throttled_at = now
            await self.sink.event(
                "throttled", sources.supervision("throttled", self.plan, reason=reason, **extra)
            )

    # -- the loops --------------------------------------------------------------------------------
    async def run(self) -> None:
        plan = self.plan
        if plan.kind == "shell" and plan.mode == sources.FOLLOW:
            await self.follow()
        elif plan.kind in ("shell", "http"):
            await self.periodic()
        elif plan.kind == "file":
            await self.tail()
        elif plan.kind == "feed":
            await self.feed()
        else:  # plan_of admits no other kind
            raise SourceRefused(f"source.kind {plan.kind} does not run")

    async def follow(self) -> None:
        """A long-lived process: every stdout line one observation; crashes restarted with backoff."""
        plan, failures, first = self.plan, 0, True
        left = processes.kill_leftover(self.saved) or None  # what a killed server's last run left behind
        while True:
            run = secrets.token_hex(6)
            try:
                proc = await processes.spawn(plan.argv, self.env)
            except OSError as exc:
                failures += 1
                delay = sources.backoff(failures)
                reason = f"cannot start {plan.argv[0]!r}: {exc.strerror or exc}"
                await self.emit(sources.silent_body(plan, reason, f"s:{run}:start"), None)
                await self.sink.event(
                    "crash", sources.supervision("crash", plan, reason=reason, backoff_seconds=delay)
                )
                if self.options.once:
                    return
                await asyncio.sleep(delay)
                continue
            # Where a kill -9 of the server would leave this command's children: the next start kills them.
            await self.sink.checkpoint({"group": proc.pid, "boot": processes.boot_id()})
            action = "start" if first else "restart"
            await self.sink.event(
                action,
                sources.supervision(
                    action, plan, pid=proc.pid, attempt=failures or None, killed_left_behind=left
                ),
            )
            left = None
            first = False
            started = time.monotonic()
            err = processes.Tail(proc.stderr)
            seen = [0, 0]  # the lines read so far, and whether one is being published (the pump says)
            assert proc.stdout is not None
            reader = asyncio.ensure_future(self._pump(proc.stdout, run, seen))
            waiter = asyncio.ensure_future(proc.wait())
            try:
                await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if reader.done():
                    reader.result()  # its failure is the runner's
                    status = await waiter
                else:
                    # The leader exited, perhaps while something it started still holds the pipe open: end
                    # the group, then read what is left while it keeps coming (or is being published), and
                    # stop reading once nothing came for DRAIN_SECONDS.
                    processes.kill_group(proc)
                    before = -1
                    while not reader.done() and (seen[0] != before or seen[1]):
                        before = seen[0]
                        await asyncio.wait({reader}, timeout=DRAIN_SECONDS)
                    if reader.done():
                        reader.result()
                    status = waiter.result()
            finally:
                for task in (reader, waiter):
                    if not task.done():
                        task.cancel()
                try:
                    if proc.returncode is None:  # cancelled (stopped): end the process and its children
                        await processes.stop(proc)
                finally:
                    processes.kill_group(proc)  # whatever it started goes with it, whatever way it ended
            n = seen[0]
            tail = await err.done()
            if time.monotonic() - started >= STEADY_SECONDS:
                failures = 0
            failures += 1
            delay = sources.backoff(failures)
            how = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
            if status not in plan.ok_exit:
                silent = sources.silent_body(
                    plan,
                    f"the process {how}",
                    f"s:{run}:exit",
                    exit=status,
                    **sources.stderr_fields(tail, err.total),
                )
                await self.emit(silent, None)
            if self.options.once:
                return
            await self.sink.event(
                "crash",
                sources.supervision(
                    "crash", plan, reason=f"the process {how}", exit=status, backoff_seconds=delay, lines=n
                ),
            )
            await asyncio.sleep(delay)

    async def _pump(self, stdout: asyncio.StreamReader, run: str, seen: list[int]) -> None:
        """A long-lived process's stdout, one observation per line."""
        async for line in processes.lines(stdout):
            seen[0] += 1
            body = sources.line_body(self.plan, line.raw, f"s:{run}:{seen[0]}", total=line.total)
            seen[1] = 1
            await self.emit(body, None)
            seen[1] = 0

    async def periodic(self) -> None:
        """One run or fetch per period, one observation each (on_change applied)."""
        plan = self.plan
        last_key = self.saved.get("last_key") if isinstance(self.saved.get("last_key"), str) else None
        last_at = self.saved.get("last_at") if isinstance(self.saved.get("last_at"), int | float) else None
        fetcher = (
            Fetcher(guarded=self.options.guarded, allowed_sinks=self.options.allowed_sinks)
            if plan.kind == "http"
            else None
        )
        refused: str | None = None
        await self.sink.event(
            "start",
            sources.supervision(
                "start", plan, every=plan.every, schedule=plan.schedule.text if plan.schedule else None
            ),
        )
        try:
            while True:
                started = time.time()
                if fetcher is not None:
                    fetched = await fetcher.fetch(plan.ref, plan.timeout)
                    if fetched.refused is not None:
                        if fetched.refused != refused:  # the guard refused what the host resolves to now
                            refused = fetched.refused
                            reason = f"the sink guard refuses this http source: {refused}"
                            await self.sink.event(
                                "refused", sources.supervision("refused", plan, reason=reason)
                            )
                        body = None
                    else:
                        if refused is not None:
                            refused = None
                            await self.sink.event(
                                "start", sources.supervision("start", plan, every=plan.every)
                            )
                        body = self._fetched(fetched)
                else:
                    body = await self._ran()
                if body is not None:
                    change = sources.change_key(body)
                    now = time.time()
                    if sources.should_publish(plan, last_key, change, last_at, now, self.options.ttl):
                        outcome = await self.emit(body, {"last_key": change, "last_at": now})
                        if outcome == PUBLISHED:
                            last_key, last_at = change, now
                if self.options.once:
                    return
                await asyncio.sleep(max(0.0, plan.next_run(started) - time.time()))
        finally:
            if fetcher is not None:
                await fetcher.close()

    def _fetched(self, fetched: Any) -> dict[str, Any]:
        key = self.key("h")
        if fetched.status is None:
            return sources.silent_body(self.plan, str(fetched.failure), key, ms=fetched.ms)
        return sources.fetch_body(
            self.plan, fetched.status, fetched.ms, fetched.body, fetched.size, key, capped=fetched.capped
        )

    async def _ran(self) -> dict[str, Any]:
        run = await processes.run_once(self.plan.argv, self.env, self.plan.timeout)
        key = self.key("r")
        if run.exit is None:
            extra = sources.stderr_fields(run.stderr, run.stderr_total)
            return sources.silent_body(self.plan, str(run.failure), key, ms=run.ms, **extra)
        return sources.run_body(
            self.plan,
            run.exit,
            run.stdout,
            run.stderr,
            run.ms,
            key,
            stdout_total=run.stdout_total,
            stderr_total=run.stderr_total,
        )

    async def tail(self) -> None:
        """A file's appended lines, polled; rotation and truncation survived (tail.py)."""
        plan = self.plan
        follower = FileTail(plan.ref, self.saved, from_start=plan.from_start, check=self.options.file_check)
        problem: str | None = None
        try:
            # The first poll before the start row: once it is written, the file is open and its position
            # taken, so a line appended after "start" is never mistaken for one that was already there.
            poll = await asyncio.to_thread(follower.poll)
            await self.sink.event("start", sources.supervision("start", plan))
            while True:
                if poll.gap is not None:  # said in the log before the new file's lines
                    await self.sink.event("gap", sources.supervision("gap", plan, reason=poll.gap))
                if poll.opened is not None and not poll.lines:
                    await self.sink.checkpoint(poll.opened)  # a restart resumes here, not at a later end
                for line in poll.lines:
                    await self.emit(
                        sources.line_body(plan, line.raw, line.key, total=line.total), line.checkpoint
                    )
                if poll.problem is not None and poll.problem != problem:
                    problem = poll.problem  # said once, when it starts, not at every poll
                    await self.emit(sources.silent_body(plan, problem, self.key("x")), None)
                elif poll.problem is None:
                    problem = None
                if self.options.once:
                    return
                if not poll.more:  # a full poll: read on at once, else wait for more to be appended
                    await asyncio.sleep(self.options.poll_seconds)
                poll = await asyncio.to_thread(follower.poll)
        finally:
            follower.close()

    async def feed(self) -> None:
        """Another monitor's observations that pass this monitor's filter (the server's engine does the step)."""
        step_of, wake = self.options.feed_step, self.options.feed_wake
        if step_of is None:
            raise SourceRefused("a feed runs on the server that holds both monitors (mp serve --sources)")
        await self.sink.event("start", sources.supervision("start", self.plan))
        while True:
            if wake is not None:
                wake.clear()
            step = await step_of(self.plan)
            published = int(step.get("published", 0))
            for _ in range(published):  # the rate counts what the step published; past it, the feed waits
                delay = self.rate.wait()
                if delay > 0:
                    await self._throttled(
                        "more than the rate in a minute: the feed waits", wait_seconds=round(delay, 1)
                    )
                    await asyncio.sleep(delay)
            if step.get("changed"):
                return  # the definition changed under it: the supervisor starts the new one
            if step.get("over_budget"):  # the row it stands before is read again on the next UTC day
                until = _next_utc_day(time.time())
                await self._throttled(
                    "limits.observations_per_day is used up: the feed waits for the next UTC day",
                    until=_dt.datetime.fromtimestamp(until, _dt.UTC).isoformat().replace("+00:00", "Z"),
                )
                if self.options.once:
                    return
                await asyncio.sleep(max(0.0, until - time.time()))
                continue
            if step.get("more"):
                continue
            if self.options.once:
                return
            if wake is None:
                await asyncio.sleep(FEED_RESCAN_SECONDS)
            else:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives as
                # the wake is set, and a stop would never end this loop.
                try:
                    async with asyncio.timeout(FEED_RESCAN_SECONDS):
                        await wake.wait()
                except TimeoutError:
                    pass
