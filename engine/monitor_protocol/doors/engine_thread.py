"""One engine thread for the doors that run the engine beside an event loop (`mp serve`, `mp mcp`).

Every engine call runs on this class's own thread, never on the event loop (SQLite has one writer; the
engine is not thread-safe). Calls submitted during one event-loop iteration travel to the thread together
and run inside the store's ``batch()`` when it has one: one group commit, one fsync for many requests. No
caller hears its result before that commit, so every success a client is told about is already durable.
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
        if len(jobs) == 1 or self._batch is None:
            return [_outcome(fn, args) for fn, args, _loop, _deliver in jobs]
        try:
            with self._batch():
                return [_outcome(fn, args) for fn, args, _loop, _deliver in jobs]
        except BaseException as exc:  # the group commit failed: nothing in it may be reported as done
            log.exception("group commit of %d engine calls failed", len(jobs))
            return [(False, exc)] * len(jobs)

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
