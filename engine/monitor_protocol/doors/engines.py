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

Either way no caller hears its result before the commit of the group it joined, so every success a client is
told about is already durable. The engine is not thread-safe: each runs it from one thread only.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("monitor_protocol.http")


Job = tuple[Callable[..., Any], tuple[Any, ...], Any, Callable[[bool, Any], None]]


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
        # Called as on_commit(seconds) on the engine thread after every batch (its calls and their commit).
        self.on_commit: Callable[[float], None] | None = None

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
        done = threading.Event()
        box: list[Any] = []

        def deliver(ok: bool, value: Any) -> None:
            box.append((ok, value))
            done.set()

        if self._stopped:
            raise RuntimeError("the engine thread has stopped")
        self._queue.put([(fn, args, None, deliver)])
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

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
        started = time.perf_counter()
        try:
            return self._commit_batch(jobs)
        finally:
            hook = self.on_commit
            if hook is not None:
                hook(time.perf_counter() - started)

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
                loop.call_soon_threadsafe(_deliver_all, replies)
            except RuntimeError:
                pass  # the loop closed meanwhile


def _ignore(ok: bool, value: Any) -> None:
    if not ok:
        log.error("an engine job posted without a reply failed: %r", value)


def _deliver_all(replies: list[tuple[Callable[[bool, Any], None], tuple[bool, Any]]]) -> None:
    for deliver, outcome in replies:
        deliver(*outcome)


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except BaseException as exc:
        return False, exc


def run_group(
    batch: Callable[[], Any] | None, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> list[tuple[bool, Any]]:
    """Run the calls, inside one ``batch()`` (one group commit) when the store has one and there is more
    than one call; each outcome is (True, result) or (False, exception). When the group commit fails,
    nothing in it may be reported as done: every call gets the failure."""
    if len(calls) == 1 or batch is None:
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
    try:
        with batch():
            return [_outcome(fn, args) for fn, args in calls]
    except BaseException as exc:
        log.exception("group commit of %d engine calls failed", len(calls))
        return [(False, exc)] * len(calls)


Deliver = Callable[[bool, Any], None]


class LoopEngine:
    """The engine on the event loop's own thread: the calls of one loop turn share one group commit at the
    end of the turn, and each caller hears its outcome after that commit (see the module's docstring).

    ``submit_to(fn, args, deliver)`` is the lean form for a door that answers from a callback (no future):
    ``deliver(ok, value)`` runs on the loop once the group has committed."""

    def __init__(self, store: Any = None, max_batch: int = 256) -> None:
        self._batch = getattr(store, "batch", None)
        self.max_batch = max_batch
        self._pending: list[tuple[Callable[..., Any], tuple[Any, ...], Deliver]] = []
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self.on_commit: Callable[[float], None] | None = None

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

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
        done = threading.Event()
        box: list[tuple[bool, Any]] = []

        def deliver(ok: bool, value: Any) -> None:
            box.append((ok, value))
            done.set()

        loop.call_soon_threadsafe(self.submit_to, fn, args, deliver)
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """No more calls: what is queued still runs at the end of this turn."""
        self._stopped = True

    def _flush(self) -> None:
        self._flush_scheduled = False
        jobs, self._pending = self._pending, []
        while jobs:
            group, jobs = jobs[: self.max_batch], jobs[self.max_batch :]
            started = time.perf_counter()
            outcomes = run_group(self._batch, [(fn, args) for fn, args, _deliver in group])
            hook = self.on_commit
            if hook is not None:
                hook(time.perf_counter() - started)
            for (_fn, _args, deliver), (ok, value) in zip(group, outcomes, strict=True):
                try:
                    deliver(ok, value)
                except Exception:  # one caller's broken reply must not cost the others theirs
                    log.exception("delivering an engine call's outcome failed")
