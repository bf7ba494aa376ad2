"""Where engine calls run for the doors that serve an event loop (`mp serve`, `mp mcp`), in one of two seats
with the same interface (``submit``, ``call``, ``post``, ``run_sync``, ``stop``, ``on_commit``):

* ``LoopEngine``: on the event loop's own thread, Redis's shape for a durable log. The calls submitted during
  one loop turn run together at its end inside the store's ``batch()``: one group commit, one fsync for
  every request that arrived together, with no thread hop. Fit for a store whose every call is bounded and
  local (SQLite, memory: the scan budget bounds filtered reads); the commit's fsync holds the loop for its
  duration, while requests keep queueing in the kernel and form the next group.
* ``EngineThread``: on a thread of its own, for a store whose calls wait on the network (PostgreSQL), so the
  loop keeps reading, answering and streaming meanwhile; the calls of one loop turn travel to the thread
  together and share its group commit too.
* ``EngineLanes``: on several threads at once, each with a connection of its own, for a store several
  servers share (PostgreSQL, `mp serve` picks it): a call waiting on the database holds up no other call.

Either way no caller hears its result before the commit of the group it joined, so every success a client is
told about is already durable. LoopEngine and EngineThread run the engine from one thread only; EngineLanes
runs it from several, on a store that keeps each thread's call apart (store/postgres.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from monitor_protocol.core.errors import storage_unavailable
from monitor_protocol.core.store_contract import GroupConflict, StorageError
from monitor_protocol.doors.lane_queue import NO_ITEM, LastIdleFirst
from monitor_protocol.doors.merging import Deliver, Merge, calls_in, merged

log = logging.getLogger("monitor_protocol.http")


Job = tuple[Callable[..., Any], tuple[Any, ...], Any, Deliver]


class Joiner(Protocol):
    """Calls that want to join a LoopEngine group before its commit (see LoopEngine)."""

    def wanted(self) -> bool:
        """Whether there may be any (cheap: asked before every group)."""
        ...

    def take(self) -> list[tuple[Callable[..., Any], tuple[Any, ...], Deliver]]:
        """The calls to run now, in the group, each with its deliver(ok, value) for after the commit."""
        ...


# What a seat tells ``on_commit`` after each batch, on the thread that ran it: its wall seconds, the CPU seconds
# that thread spent on it (the calls and their commit, the fsync's system time included), and its calls.
CommitHook = Callable[[float, float, int], None]


def _thread_cpu_clock() -> Callable[[], float]:
    """This thread's CPU time, where the platform has a clock for it; else one that stays at 0, so that the
    engine's CPU reads 0 rather than wall time passed off as CPU."""
    clock = getattr(time, "thread_time", None)
    try:
        if clock is not None:
            clock()
            return clock
    except OSError:
        pass
    return lambda: 0.0


thread_cpu = _thread_cpu_clock()


def _wait_for(send: Callable[[Deliver], object]) -> Any:
    """Hand a call to an engine with ``send(deliver)`` and block this thread until ``deliver`` has its
    outcome: the result, or its exception raised here (every engine's ``run_sync``)."""
    done = threading.Event()
    box: list[tuple[bool, Any]] = []

    def deliver(ok: bool, value: Any) -> None:
        box.append((ok, value))
        done.set()

    send(deliver)
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


class EngineThread:
    """Enters the engine for everyone, on this class's own thread only (SQLite has one writer; the engine
    is not thread-safe), so no engine call ever runs on the event loop.

    Calls that arrive together are run inside the store's ``batch()`` when it has one (group commit: many
    requests, one fsync), and no caller hears its result before that commit, so every success a client is
    told about is already durable.
    """

    def __init__(self, store: Any = None, max_batch: int = 64) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._batch = getattr(store, "batch", None)
        self.max_batch = max_batch
        # Calls made during one event-loop iteration travel to the engine thread together, so requests
        # that arrived together share one group commit (and one thread wake-up).
        self._pending: list[Job] = []
        self._flush_scheduled = False
        self._thread = threading.Thread(target=self._run, name="mp-engine", daemon=True)
        self._thread.start()
        self._stopped = False
        # Called as on_commit(seconds, cpu_seconds, calls) on the engine thread after every batch.
        self.on_commit: CommitHook | None = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue ``fn(*args)`` for the engine thread from the loop, without waiting: the returned future
        gets its outcome once the batch it joined has committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            if future.done():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        if self._stopped:
            raise RuntimeError("the engine thread has stopped")
        self._pending.append((fn, args, loop, deliver))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # Scheduled behind everything already runnable in this loop turn, so what this turn submits
            # (say, the re-checks of every pull one append woke) leaves as one batch.
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        jobs, self._pending = self._pending, []
        if jobs:
            self._queue.put(jobs)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the engine thread, from any thread, without waiting and without a reply: in
        order with the calls around it (a shared store's heard appends, see cli/serve.py)."""
        if not self._stopped:
            self._queue.put([(fn, args, None, _ignore)])

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the engine thread from any other thread, blocking until it is done."""
        if self._stopped:
            raise RuntimeError("the engine thread has stopped")
        return _wait_for(lambda deliver: self._queue.put([(fn, args, None, deliver)]))

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
            if threading.current_thread() is not self._thread:
                self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            jobs = list(item)
            stop = False
            while len(jobs) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.extend(more)
            self._execute(jobs)
            if stop:
                return

    def _commit(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """Run the calls, as one group commit where the store has one (engine thread only)."""
        started, cpu = time.perf_counter(), thread_cpu()
        try:
            return self._commit_batch(jobs)
        finally:
            hook = self.on_commit
            if hook is not None:
                hook(time.perf_counter() - started, thread_cpu() - cpu, len(jobs))

    def _commit_batch(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        return run_group(self._batch, [(fn, args) for fn, args, _loop, _deliver in jobs])

    def _execute(self, jobs: list[Job]) -> None:
        outcomes = self._commit(jobs)
        # Replies go back once the commit is on disk: one wake-up per event loop, not one per request.
        by_loop: dict[Any, list[tuple[Callable[[bool, Any], None], tuple[bool, Any]]]] = {}
        for (_fn, _args, loop, deliver), outcome in zip(jobs, outcomes, strict=True):
            if loop is None:
                deliver(*outcome)
            else:
                by_loop.setdefault(loop, []).append((deliver, outcome))
        for loop, replies in by_loop.items():
            if loop.is_closed():
                continue  # nobody is waiting any more
            try:
                loop.call_soon_threadsafe(deliver_all, replies)
            except RuntimeError:
                pass  # the loop closed meanwhile


class _CallbackSeat(ABC):
    """What the engines with a callback seat (``submit_to``) share: the loop they answer on, bound at the
    first call, and ``submit``/``call`` as a future over ``submit_to``."""

    _loop: asyncio.AbstractEventLoop | None

    @abstractmethod
    def submit_to(self, fn: Callable[..., Any], args: tuple[Any, ...], deliver: Deliver) -> None:
        """Queue ``fn(*args)``; ``deliver(ok, value)`` runs on the loop once its commit is durable."""

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._bind().create_future()

        def deliver(ok: bool, value: Any) -> None:
            if not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

        self.submit_to(fn, args, deliver)
        return future

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.submit(fn, *args)


class EngineLanes(_CallbackSeat):
    """Engine calls on several threads at once ("lanes"), for a store several servers share (PostgreSQL):
    each lane has a connection of its own (the store's session per thread), so a call waiting on the
    database (a round trip, a lock, a commit) does not hold up the others, and the database runs calls on
    different monitors, and readers of one monitor, side by side. Same interface as EngineThread, plus
    ``submit_to`` (the lean door's callback seat). Replies go back after each call's own commit, or after
    its group's (``group_key``: the publishes queued together for one monitor share one transaction; while
    a lane runs a key's group, that key's next jobs go to it, handed over by the loop as it submits them, rather
    than wake another lane to wait on the same lock).

    Calls run side by side, so the rule a door relies on, that a reader's mark (parking.Waiters) is read
    right after its pull and in order with every append heard, is kept another way: each append heard
    (this server's commits and other servers', through the service's listeners) is numbered, and a call
    that locked a monitor which got an append while the call ran has that append told again once it ends
    (``service.heard_append``), before its reply goes out. A reader that parks with a mark taken before
    that append is then woken; at worst a reader re-checks once for nothing. Other posted work
    (``post``, a LISTEN reconnection's re-check of every reader) runs at once and again when every call
    running at that moment has ended.

    The engine's own state is shared by the lanes: what the store keeps per call is per thread, and the
    engine's memory (the lazily stored mute clock, the sweep deadline) is written under its own care
    (core/runtime.py). A call marked ``runs_alone`` (closing the store) runs with no other call running."""

    def __init__(self, store: Any, service: Any = None, lanes: int = 4, max_group: int = 32) -> None:
        self._store = store
        self._service = service
        self._queue = LastIdleFirst()
        self.on_commit: CommitHook | None = None
        # Group commit (a store with `batch`, PostgreSQL): a lane that takes a job whose key is a monitor takes
        # the jobs queued right behind it with the same key too, and runs them in one transaction (their
        # monitor's lock taken once, its row read once, one commit). The door says which jobs may join:
        # group_key(fn, args) -> the monitor, or None (doors/http/app.py: a REST publish).
        self.group_key: Callable[[Callable[..., Any], tuple[Any, ...]], str | None] | None = None
        self.max_group = max_group
        self.merge: Merge | None = None  # a group's neighbours that run as one call (see `merged`)
        # The keys a lane is running a group for, each with the jobs of that key other lanes took meanwhile
        # and handed over: the lane runs them as its next group, so one monitor's publishes gather on one
        # lane (bigger groups) instead of several lanes queueing on its lock.
        self._keyed: dict[str, list[Any]] = {}
        self._keys_lock = threading.Lock()
        self._stop_lock = threading.Lock()  # stop() against a put: nothing is queued behind its drain
        self.grouped = 0  # calls that joined a group after its first (tests, benchmarks)
        self.given_up = 0  # groups rolled back for a lock they did not hold or a refused statement
        self._stopped = False
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...], Any, Deliver]] = []
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # The appends heard, numbered: monitor -> (number of its last append, its head); the running calls,
        # each with the number it started at; posted work waiting for the calls running when it was posted.
        self._lock = threading.Lock()
        self._heard_count = 0
        self._last: dict[
            str, tuple[int, int, int | None]
        ] = {}  # monitor -> (number, head, the call it came in)
        self._running: dict[int, int] = {}
        self._next_call = 0
        self._after: list[tuple[set[int], Callable[..., Any], tuple[Any, ...]]] = []
        self._telling = threading.local()  # the lane's call, and whether it is telling an append again
        self.retold = 0  # appends told again (tests, benchmarks)
        # A call marked runs_alone (MonitorApp.close_store) runs with no other call running: closing the
        # store closes every lane's connection, which must not happen under a call using one. The calls
        # running (_active) end first, and the calls that come after it wait for it.
        self._gate = threading.Condition()
        self._active = 0
        self._alone = 0  # calls that run alone, waiting or running
        if service is not None:
            service.add_listener(self._heard)
        self.lanes = max(1, lanes)
        self._threads: list[threading.Thread] = []
        self._start_lanes()

    def _start_lanes(self) -> None:
        self._threads = [
            threading.Thread(target=self._run, name=f"mp-engine-{i}", daemon=True) for i in range(self.lanes)
        ]
        for thread in self._threads:
            thread.start()

    def _cpu(self) -> float:
        """CPU seconds of the running lane so far (its thread's)."""
        return thread_cpu()

    # -- submitting (from the loop) --------------------------------------------------------------------
    def submit_to(self, fn: Callable[..., Any], args: tuple[Any, ...], deliver: Deliver) -> None:
        """Queue ``fn(*args)`` for a lane; ``deliver(ok, value)`` runs on the loop once it has committed."""
        if self._stopped:
            raise RuntimeError("the engine has stopped")
        self._pending.append((fn, args, self._bind(), deliver))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # What this loop turn submits leaves together, behind everything already runnable in the turn.
            self._bind().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        jobs, self._pending = self._pending, []
        items: list[tuple[str | None, Any]] = []  # (a bundle's key, the bundle) or (None, a lone job)
        bundles: dict[str, list[Any]] = {}
        for job in jobs:
            key = self._key(job)
            if key is None:
                items.append((None, job))
            elif key in bundles and len(bundles[key]) < self.max_group:
                bundles[key].append(job)  # behind the first of its key: one lane takes them together
            else:
                bundles[key] = [job]
                items.append((key, bundles[key]))
        for key, item in items:  # only whole: a lane may take an item the moment it is queued
            if key is not None and self._hand_over(key, item):
                continue
            if not self._put(item):
                answer_failed(item if key is not None else [item], RuntimeError("the engine has stopped"))

    def _hand_over(self, key: str, bundle: list[Any]) -> bool:
        """A bundle whose key a lane is running a group for goes straight to that lane's next group: queued,
        it would wake another lane only for that lane to hand it over (what `_serve` does with a key it
        finds taken), a thread's wake-up and the GIL for nothing. False: no lane runs the key, or something
        submitted before it still waits in the queue (it must not be overtaken: a monitor's stream of
        publishes would starve a lone lane's other calls); queue it."""
        if self._stopped or len(self._queue):  # (stopped: `_put` refuses it, as any call after stop())
            return False
        with self._keys_lock:
            waiting = self._keyed.get(key)
            if waiting is None:
                return False
            waiting.extend(bundle)
            return True

    def _put(self, item: Any) -> bool:
        """Queue an item unless the engine has stopped (checked and queued under stop's own lock, so nothing
        lands behind the drain of stop())."""
        with self._stop_lock:
            if self._stopped:
                return False
            self._queue.put(item)
            return True

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a lane, from any thread, without a reply. An append heard from another
        server (``service.heard_append``) is numbered like this server's own; anything else runs again once
        every call running now has ended, so that it also comes after their marks."""
        if self._stopped:
            return
        service = self._service
        if service is None or fn != getattr(service, "heard_append", None):
            with self._lock:
                running = set(self._running)
                if running:
                    self._after.append((running, fn, args))
        self._put((fn, args, None, _ignore))

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on a lane from any other thread, blocking until it is done."""
        if self._stopped:
            raise RuntimeError("the engine has stopped")

        def send(deliver: Deliver) -> None:
            if not self._put((fn, args, None, deliver)):
                deliver(False, RuntimeError("the engine has stopped"))

        return _wait_for(send)

    def stop(self) -> None:
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            for _ in self._threads:
                self._queue.put(None)
        me = threading.current_thread()
        for thread in self._threads:
            if thread is not me:
                thread.join()
        # A job a lane put back behind the stop sentinels (a key's jobs handed back, see _run) ran on no lane:
        # its caller hears that the engine stopped rather than waiting for ever.
        self._answer_queued()

    def _answer_queued(self) -> None:
        """Tell the caller of every job still queued that the engine stopped (the queue is left empty)."""
        stopped = RuntimeError("the engine has stopped")
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                answer_failed(item if isinstance(item, list) else [item], stopped)

    # -- the lanes --------------------------------------------------------------------------------------
    def _heard(self, monitor_id: str, head: int) -> None:
        """A listener of the service: every committed append, this server's or heard from another."""
        if getattr(self._telling, "on", False):
            return  # told again by a lane: not a new append
        with self._lock:
            self._heard_count += 1
            self._last[monitor_id] = (self._heard_count, head, getattr(self._telling, "call", None))

    def _run(self) -> None:
        touched = getattr(self._store, "job_monitors", None)
        item: Any = _NOTHING
        while True:
            if item is _NOTHING:
                item = self._queue.get(on_idle=self._send_replies)
            else:
                self._send_replies()
            if item is None:
                return
            # A job, or the jobs of one key that one loop turn submitted (a bundle, see _flush).
            jobs = list(item) if isinstance(item, list) else [item]
            try:
                item = self._serve(jobs, touched)
            except BaseException:  # noqa: BLE001 - a lane outlives any failure (the jobs run were answered)
                log.exception("an engine lane failed serving %d jobs", len(jobs))
                item = _NOTHING

    def _serve(self, jobs: list[Any], touched: Callable[[], set[str]] | None) -> Any:
        """Run an item's jobs; for a key, as its owner: its groups until nothing more came for it. Returns the
        item to run next (taken while gathering), or _NOTHING."""
        key = self._key(jobs[0])
        if key is None:
            self._run_jobs(jobs, touched)
            return _NOTHING
        with self._keys_lock:
            waiting = self._keyed.get(key)
            if waiting is not None:  # a lane is running this monitor's group: it takes these next
                waiting.extend(jobs)
                return _NOTHING
            self._keyed[key] = []
        other: Any = _NOTHING
        try:
            while jobs:
                with self._keys_lock:  # what was handed over meanwhile (_hand_over), behind what came first
                    jobs += self._keyed[key]
                    self._keyed[key] = []
                group, jobs = jobs[: self.max_group], jobs[self.max_group :]
                other = self._gather(group, key)
                self._run_jobs(group, touched)
                with self._keys_lock:
                    jobs += self._keyed[key]
                    self._keyed[key] = []
                if other is not _NOTHING:
                    break
        finally:
            # Released on every way out. What is left for the key (more came meanwhile, something else was
            # taken while gathering, or a failure) goes back to the queue behind what waits there, so no key
            # keeps a lane to itself, and nothing stays handed to a lane that no longer runs the key.
            with self._keys_lock:
                jobs += self._keyed.pop(key)
            for start in range(0, len(jobs), self.max_group):
                self._queue.put(jobs[start : start + self.max_group])
        return other

    def _run_jobs(self, jobs: list[Any], touched: Callable[[], set[str]] | None) -> None:
        """One call, or a group commit of several; then their outcomes, in one hop back to the loop. Every job
        is answered once, whatever fails."""
        self._send_replies()  # the last group's (a key's groups run one after another): before this one runs
        jobs = merged(jobs, self.merge)
        fn, args = jobs[0][0], jobs[0][1]
        alone = bool(getattr(fn, "runs_alone", False))
        try:
            self._enter(alone)
            try:
                if len(jobs) == 1:
                    outcomes = [self._job(fn, args, touched, calls_in(jobs))]
                else:
                    outcomes = self._numbered(functools.partial(self._grouped, jobs), calls_in(jobs), touched)
            finally:
                self._leave(alone)
        except BaseException as exc:  # noqa: BLE001 - a bug in the lane's own bookkeeping: the callers hear it
            log.exception("an engine lane failed running %d jobs", len(jobs))
            outcomes = [(False, exc)] * len(jobs)
        replies: list[tuple[Deliver, tuple[bool, Any]]] = []
        for (_fn, _args, loop, deliver), outcome in zip(jobs, outcomes, strict=True):
            if loop is None:
                try:
                    deliver(*outcome)
                except Exception:  # one caller's broken delivery must not cost the others theirs
                    log.exception("delivering an engine call's outcome failed")
            else:
                replies.append((deliver, outcome))
        if replies:  # one hop back to the loop for the whole group, by the lane's next step
            self._telling.replies = (jobs[0][2], replies)

    def _send_replies(self) -> None:
        """Send the outcomes this lane's last jobs left, if any. The lane calls it once it has registered as
        idle (LastIdleFirst.get's `on_idle`) or before its next item: the request a reply prompts (a client's
        next call) then finds this lane idle and warm, not another lane asleep."""
        pending = getattr(self._telling, "replies", None)
        if pending is None:
            return
        self._telling.replies = None
        loop, replies = pending
        try:
            loop.call_soon_threadsafe(deliver_all, replies)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody is waiting any more

    # -- group commit ----------------------------------------------------------------------------------
    def _key(self, job: Any) -> str | None:
        fn, args, loop, _deliver = job
        if loop is None or self.group_key is None or getattr(fn, "runs_alone", False):
            return None
        if getattr(self._store, "batch", None) is None:
            return None
        try:
            return self.group_key(fn, args)
        except Exception:  # a key the door cannot say: the job runs by itself
            log.exception("group_key failed; the job runs by itself")
            return None

    def _gather(self, jobs: list[Any], key: str) -> Any:
        """The jobs queued behind the first with the same key join it, up to max_group. Returns the first item
        taken that does not (run next by this lane, after this group), or _NOTHING."""
        while len(jobs) < self.max_group:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return _NOTHING
            if item is None:  # a lane's stop sentinel: left for after this lane's groups
                self._queue.put(None)
                return _NOTHING
            first = item[0] if isinstance(item, list) else item
            if self._key(first) == key:
                more = item if isinstance(item, list) else [item]
                room = self.max_group - len(jobs)
                jobs.extend(more[:room])
                if len(more) > room:
                    self._queue.put(more[room:])  # the rest: a group of its own
                    return _NOTHING
                continue
            return item
        return _NOTHING

    def _grouped(self, jobs: list[Any]) -> list[tuple[bool, Any]]:
        """Run the jobs as one group commit (PostgresStore.batch): each job's outcome, told only after the
        commit. A job asking for a lock the group does not hold (GroupConflict: nothing of it was sent), or a
        commit the database refuses for one of them (a unique index), rolls the group back and runs every job
        again by itself; a failure of the database fails them all with 503, as it fails a call alone."""
        store = self._store
        told = getattr(self._service, "release_appends", None)  # the listeners hear a group after its commit
        dropped = getattr(self._service, "drop_appends", None)
        outcomes: list[tuple[bool, Any]] = []
        try:
            with store.batch():
                for fn, args, _loop, _deliver in jobs:
                    if outcomes:
                        if len(outcomes) == 1 and not store.groupable():
                            break  # a first call that took no monitor lock whole: the others run alone
                        store.restrict_group()
                    ok, value = _outcome(fn, args)
                    if not ok and isinstance(value, GroupConflict):
                        raise value
                    outcomes.append((ok, value))
        except GroupConflict as conflict:  # rolled back, nothing of it kept: every call once more, alone
            if dropped is not None:
                dropped()
            self.given_up += 1
            log.debug(
                "a group commit of %d calls was given up (%s); running them one by one", len(jobs), conflict
            )
            return [_outcome(fn, args) for fn, args, _loop, _deliver in jobs]
        except StorageError as exc:  # the calls that ran in the group are failed; any left run by themselves
            if dropped is not None:
                dropped()
            failure = storage_unavailable(
                str(exc) or type(exc).__name__, outcome_unknown=getattr(exc, "outcome_unknown", False)
            )
            ran = len(outcomes)
            return [(False, failure)] * ran + [_outcome(fn, args) for fn, args, _loop, _deliver in jobs[ran:]]
        except Exception as exc:  # noqa: BLE001 - after the commit, perhaps: never run again, outcome unknown
            log.exception("a group commit of %d calls failed at its end", len(jobs))
            if told is not None:
                told()
            failure = storage_unavailable(
                f"{type(exc).__name__} at the end of a group commit", outcome_unknown=True
            )
            ran = len(outcomes)
            return [(False, failure)] * ran + [_outcome(fn, args) for fn, args, _loop, _deliver in jobs[ran:]]
        if told is not None:
            told()
        self.grouped += len(outcomes) - 1
        # After a first call that took no monitor lock whole (a reader), the others run by themselves.
        return outcomes + [_outcome(fn, args) for fn, args, _loop, _deliver in jobs[len(outcomes) :]]

    def _enter(self, alone: bool) -> None:
        with self._gate:
            if alone:
                self._alone += 1
                while self._active:
                    self._gate.wait()
            else:
                while self._alone:
                    self._gate.wait()
            self._active += 1

    def _leave(self, alone: bool) -> None:
        with self._gate:
            self._active -= 1
            if alone:
                self._alone -= 1
            self._gate.notify_all()

    def _job(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        touched: Callable[[], set[str]] | None,
        calls: int = 1,
    ) -> tuple[bool, Any]:
        """One call (`calls` callers, when it is a merged one): numbered, run, and the appends it may have
        missed told again."""
        return self._numbered(lambda: [_outcome(fn, args)], calls, touched)[0]

    def _numbered(
        self,
        run: Callable[[], list[tuple[bool, Any]]],
        calls: int,
        touched: Callable[[], set[str]] | None,
    ) -> list[tuple[bool, Any]]:
        """A unit of work (one call, or a group commit's calls) numbered as one call: run, and the appends it
        may have missed told again."""
        with self._lock:
            call = self._next_call
            self._next_call += 1
            self._running[call] = self._heard_count
        if touched is not None:
            touched()  # from now on: the monitors this call locks
        self._telling.call = call
        started, cpu = time.perf_counter(), self._cpu()
        outcomes = run()
        self._telling.call = None
        hook = self.on_commit
        try:
            if hook is not None:
                hook(time.perf_counter() - started, self._cpu() - cpu, calls)
            self._ended(call, touched() if touched is not None else None)
        except (
            Exception
        ):  # the calls have run (and committed): their outcomes stand, whatever the bookkeeping
            log.exception("an engine lane's bookkeeping after %d calls failed", calls)
        return outcomes

    def _ended(self, call: int, monitors: set[str] | None) -> None:
        """Tell again the appends this call may have read before and marked after; run the posted work that
        was waiting for it."""
        again: list[tuple[str, int]] = []
        rerun: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        with self._lock:
            started = self._running.pop(call)
            # The last append of a monitor, if it came in after this call started and not from this call (a
            # call that appended to a monitor read it under the lock its append needed: it missed nothing
            # that came before, and what came after is another call's append, last)
            if monitors is None:  # a store that cannot say: every append heard while it ran
                again = [(m, h) for m, (n, h, by) in self._last.items() if n > started and by != call]
            else:
                for monitor_id in monitors:
                    last = self._last.get(monitor_id)
                    if last is not None and last[0] > started and last[2] != call:
                        again.append((monitor_id, last[1]))
            if self._after:
                left = []
                for waiting, fn, args in self._after:
                    waiting.discard(call)
                    if waiting:
                        left.append((waiting, fn, args))
                    else:
                        rerun.append((fn, args))
                self._after = left
            if len(self._last) > 100_000:  # monitors no call is running on now: nothing to tell again
                oldest = min(self._running.values(), default=self._heard_count)
                self._last = {m: v for m, v in self._last.items() if v[0] > oldest}
        if again and self._service is not None:
            self._telling.on = True
            try:
                for monitor_id, head in again:
                    self.retold += 1
                    self._service.heard_append(monitor_id, head)
            finally:
                self._telling.on = False
        for fn, args in rerun:
            _outcome(fn, args)


def _ignore(ok: bool, value: Any) -> None:
    if not ok:
        log.error("an engine job posted without a reply failed: %r", value)


_NOTHING = NO_ITEM  # no item taken (None is the queue's stop sentinel)


def answer_failed(jobs: list[Any], failure: BaseException) -> None:
    """Tell each job's caller that it failed (posted jobs, which nobody waits for, are only dropped)."""
    for _fn, _args, loop, deliver in jobs:
        if deliver is _ignore:
            continue
        try:
            if loop is None:
                deliver(False, failure)
            else:
                loop.call_soon_threadsafe(deliver, False, failure)
        except Exception:  # noqa: BLE001 - a closed loop: nobody is waiting any more
            pass


def deliver_all(replies: list[tuple[Callable[[bool, Any], None], tuple[bool, Any]]]) -> None:
    for deliver, outcome in replies:
        deliver(*outcome)


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except BaseException as exc:
        return False, exc


Calls = list[tuple[Callable[..., Any], tuple[Any, ...]]]


def run_group(
    batch: Callable[[], Any] | None, calls: Calls, join: Callable[[], Calls] | None = None
) -> list[tuple[bool, Any]]:
    """Run the calls, inside one ``batch()`` (one group commit) when the store has one and there is more
    than one call, or a ``join``; each outcome is (True, result) or (False, exception). When the group
    commit fails, nothing in it may be reported as done: every call gets the failure. ``join`` is asked,
    once the calls have run and before their commit, for more calls to run in the same group (the re-checks
    of readers the calls' appends woke: one fsync for the append and the deliveries); their outcomes follow
    the calls'."""
    if batch is None or (len(calls) == 1 and join is None):
        return [_outcome(fn, args) for fn, args in calls]
    if any(getattr(fn, "runs_alone", False) for fn, _args in calls):
        # A call marked runs_alone (closing the store) must not run inside a group whose commit follows it:
        # the calls before it commit as a group, it runs by itself, the calls after it form the next group.
        outcomes: list[tuple[bool, Any]] = []
        run: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        for call in calls:
            if getattr(call[0], "runs_alone", False):
                outcomes += run_group(batch, run) if run else []
                run = []
                outcomes.append(_outcome(*call))
            else:
                run.append(call)
        return outcomes + (run_group(batch, run) if run else [])
    joined: Calls = []
    try:
        with batch():
            outcomes = [_outcome(fn, args) for fn, args in calls]
            if join is not None:
                joined = join()
                outcomes += [_outcome(fn, args) for fn, args in joined]
            return outcomes
    except GroupConflict:  # rolled back, nothing of it kept (a shared store's row found changed): each alone
        return [_outcome(fn, args) for fn, args in [*calls, *joined]]
    except BaseException as exc:
        log.exception("group commit of %d engine calls failed", len(calls) + len(joined))
        return [(False, exc)] * (len(calls) + len(joined))


class LoopEngine(_CallbackSeat):
    """The engine on the event loop's own thread: the calls of one loop turn share one group commit at the
    end of the turn, and each caller hears its outcome after that commit (see the module's docstring).

    ``submit_to(fn, args, deliver)`` is the lean form for a door that answers from a callback (no future):
    ``deliver(ok, value)`` runs on the loop once the group has committed.

    ``joiner``: what a door has to join a group before its commit (``Joiner``: the HTTP door's re-checks of
    the long polls a group's appends woke), so that they share its fsync instead of taking one of their own
    in the next group; asked only while ``joiner.wanted()`` (someone is parked), since it makes even a lone
    call run inside a batch."""

    def __init__(self, store: Any = None, max_batch: int = 256) -> None:
        self._batch = getattr(store, "batch", None)
        self.max_batch = max_batch
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...], Deliver]] = []
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self.on_commit: CommitHook | None = None
        self.joiner: Joiner | None = None
        self.merge: Merge | None = None  # a group's neighbours that run as one call (see `merged`)

    def submit_to(self, fn: Callable[..., Any], args: tuple[Any, ...], deliver: Deliver) -> None:
        """Queue ``fn(*args)`` for the end of this loop turn; ``deliver(ok, value)`` after its group commit."""
        if self._stopped:
            raise RuntimeError("the engine has stopped")
        self._pending.append((fn, args, deliver))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # Behind everything already runnable in this turn, so what this turn submits (the requests read
            # from every ready socket, the re-checks of every pull one append woke) commits together.
            self._bind().call_soon(self._flush)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in order with the calls around it, from any thread, without a reply (a shared
        store's heard appends)."""
        loop = self._loop
        if loop is None or self._stopped or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._post, fn, args)
        except RuntimeError:
            pass  # the loop closed meanwhile

    def _post(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if not self._stopped:
            self.submit_to(fn, args, _ignore)

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` from another thread, blocking until it is done (never from the loop's own thread)."""
        loop = self._loop
        if loop is None or self._stopped:
            raise RuntimeError("the engine is not running on a loop")
        return _wait_for(lambda deliver: loop.call_soon_threadsafe(self.submit_to, fn, args, deliver))

    def stop(self) -> None:
        """No more calls: what is queued still runs at the end of this turn."""
        self._stopped = True

    def _flush(self) -> None:
        self._flush_scheduled = False
        jobs, self._pending = self._pending, []
        while jobs:
            group, jobs = merged(jobs[: self.max_batch], self.merge), jobs[self.max_batch :]
            started, cpu = time.perf_counter(), thread_cpu()
            joiner, join = self.joiner, None
            if joiner is not None and self._batch is not None and joiner.wanted():

                def join(joiner: Joiner = joiner, group: list[Any] = group) -> Calls:
                    joined = joiner.take()
                    group.extend(joined)  # delivered after the group's own calls, once it has committed
                    return [(fn, args) for fn, args, _deliver in joined]

            outcomes = run_group(self._batch, [(fn, args) for fn, args, _deliver in group], join)
            hook = self.on_commit
            if hook is not None:
                hook(time.perf_counter() - started, thread_cpu() - cpu, calls_in(group))
            for (_fn, _args, deliver), (ok, value) in zip(group, outcomes, strict=True):
                try:
                    deliver(ok, value)
                except Exception:  # one caller's broken reply must not cost the others theirs
                    log.exception("delivering an engine call's outcome failed")
