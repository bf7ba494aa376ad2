"""One registry of the readers waiting for an append (long poll, SSE, MCP), for every door.

A door parks a reader with ``await waiters.wait(monitor_id, mark, timeout)``, where ``mark`` is
``waiters.mark(monitor_id)`` read right after that reader's last pull, on the thread that ran the pull (the
engine thread; in the browser the loop itself). The registry counts the appends it heard per monitor, on the
thread the engine calls its listeners from, so an append that commits between the pull and the parking has
already moved the count: the wait sees ``mark`` is stale and returns at once. No wake-up is ever lost; a
late hop to the loop can only delay one, never drop it, because the count is checked before parking.

``park(monitor_id, mark, timeout, callback)`` is the primitive under ``wait``: the callback runs on the loop
inside the wake-up itself, so a door can submit the re-checks of every reader one append woke from that
one loop turn (the HTTP door sends them to the engine thread as one batch, one group commit).

``hold(...)`` is the one park/wake machine every door's long poll runs on (HTTP, the browser host, MCP):
park, and on each wake-up re-check with the door's own ``recheck``, until the answer has something or the
reader's time is up.

Only the standard library (asyncio, threading): it runs under CPython and Pyodide's webloop alike. The
engine may call the listener on another thread (``mp serve``, MCP) or on the loop itself (the browser).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

AppendHook = Callable[[str], None]
WakeCallback = Callable[[bool], None]
# What a re-check gives back: the reply, the monitor the reader still waits on (None: the reply is the
# answer), and the registry's mark for that monitor read right after the re-check ran.
Outcome = tuple[Any, str | None, int]
Recheck = Callable[[float], Awaitable[Outcome]]
# A mark is the appends heard on a monitor plus the re-check generation times this (no monitor hears 2^40
# appends in one generation), so a mark taken before recheck_all never equals one taken after it.
GENERATION = 1 << 40
# Monitors whose appends are counted (one int each). Past this, the counts of monitors nobody is parked on are
# forgotten and the generation moves on, so a mark taken before that is stale (its reader re-checks once,
# never misses an append): a server that saw a million monitors come and go keeps only its live ones.
HEARD_MAX = 10_000

log = logging.getLogger("monitor_protocol.doors.parking")


class Parked:
    """One parked reader: its callback runs once, with True after an append, False at its timeout or at
    shutdown; ``cancel()`` (the reader left) drops it without calling back."""

    __slots__ = ("_registry", "monitor_id", "_callback", "_timer", "_done", "_listed")

    def __init__(self, registry: Waiters, monitor_id: str, callback: WakeCallback) -> None:
        self._registry = registry
        self.monitor_id = monitor_id
        self._callback = callback
        self._timer: asyncio.TimerHandle | None = None
        self._done = False
        self._listed = False  # in the registry's per-monitor table (and its count)

    @property
    def done(self) -> bool:
        return self._done

    def fire(self, woken: bool) -> None:
        if self._done:
            return
        self.cancel()
        try:
            self._callback(woken)
        except Exception:  # a broken reader must not cost the others their wake-up
            log.exception("a parked reader's wake-up callback failed (monitor %r)", self.monitor_id)

    def cancel(self) -> None:
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._registry._unlist(self)


class Waiters:
    """Readers parked per monitor until an append on it, a timeout, or shutdown.

    ``attach(service)`` subscribes to the engine's committed appends (``service.add_listener``).
    ``on_append``, when set, is called on the loop with the monitor id after its parked readers are woken
    (the MCP door's resource notifications ride on it). ``wake_all()`` drains everyone for shutdown.
    """

    def __init__(self, on_append: AppendHook | None = None) -> None:
        self.on_append = on_append
        # Appends heard per monitor. Written only by the listener (one engine thread, or the loop in the
        # browser); read by the engine thread (mark) and the loop (park). A count, unlike the head, never
        # moves backwards, even when a group commit is rolled back after its listeners ran.
        self._heard: dict[str, int] = {}
        self._generation = 0
        self.appended = 0  # appends heard in all, every monitor (a metrics counter)
        self._parked: dict[str, dict[Parked, None]] = {}
        self._count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        # Monitors heard on another thread and not yet handed to the loop: one hop per burst of appends
        # (a group commit of many publishes), not one per append.
        self._hop_lock = threading.Lock()
        self._hop_ids: dict[str, None] = {}
        self._hop_scheduled = False
        self._services: list[Any] = []
        self.draining = False

    # -- wiring ------------------------------------------------------------------------------------

    def attach(self, service: Any) -> None:
        """Listen to ``service``'s committed appends. Called on the loop, it binds to it; called outside
        one, the first ``park`` binds (until then nobody is parked, and the counts still advance)."""
        try:
            self.bind(asyncio.get_running_loop())
        except RuntimeError:
            pass
        service.add_listener(self._listener)
        self._services.append(service)

    def detach(self) -> None:
        """Stop listening (shutdown); parked readers are not woken by this (see ``wake_all``)."""
        for service in self._services:
            service.remove_listener(self._listener)
        self._services.clear()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop parked readers live on; wake-ups hop to it. Call it on that loop's own thread."""
        if self._loop is loop:
            return
        # Recorded before anyone parks on it: the listener counts and reads the loop under the lock park()
        # compares under, so an append that finds no loop was counted before any reader compared its mark.
        self._loop_thread = threading.get_ident()
        self._loop = loop

    # -- the listener (engine thread, or the loop itself in the browser) -----------------------------

    def _listener(self, monitor_id: str, head: int) -> None:
        with self._hop_lock:
            # Counted and looked at under the lock park() takes to compare and list: either the reader
            # sees this count (and does not park) or it is listed here (and gets the hop).
            if monitor_id not in self._heard and len(self._heard) >= HEARD_MAX:
                self._forget_unparked()
            heard = self._heard
            heard[monitor_id] = heard.get(monitor_id, 0) + 1
            self.appended += 1
            loop = self._loop
            if loop is None:
                return  # nobody can be parked yet, and the count tells any later reader
            on_loop = threading.get_ident() == self._loop_thread
            if not on_loop:
                if self.on_append is None and monitor_id not in self._parked:
                    return  # nobody to wake: no hop to the loop for this append
                self._hop_ids[monitor_id] = None
                if self._hop_scheduled:
                    return
                self._hop_scheduled = True
        if on_loop:
            self._wake([monitor_id])
            return
        try:
            loop.call_soon_threadsafe(self._drain_hops)
        except RuntimeError:  # the loop is closed: nobody is waiting on it any more
            with self._hop_lock:
                self._hop_scheduled = False

    def _forget_unparked(self) -> None:
        """Forget the counts of monitors nobody is parked on (under the hop lock), then move the generation
        on, so every mark taken before is stale: a count that starts again from 0 could otherwise equal an old
        mark and hide an append. `mark` reads the generation before the counts (they may be read on another
        thread, without the lock): a mark with the new generation was read from the new counts."""
        parked = self._parked
        self._heard = {m: n for m, n in self._heard.items() if m in parked}
        self._generation += 1

    def _drain_hops(self) -> None:
        with self._hop_lock:
            ids, self._hop_ids = list(self._hop_ids), {}
            self._hop_scheduled = False
        self._wake(ids)

    def _wake(self, monitor_ids: list[str]) -> None:
        # Every reader of these monitors is called back in this one loop turn, so the re-checks they
        # submit travel to the engine together (one group commit), not one round trip each.
        for monitor_id in monitor_ids:
            for parked in list(self._parked.pop(monitor_id, ())):
                parked._listed = False
                self._count -= 1
                parked.fire(True)
        hook = self.on_append
        if hook is None:
            return
        for monitor_id in monitor_ids:
            try:
                hook(monitor_id)
            except Exception:  # a broken hook must not cost anyone else their wake-up
                log.exception("append hook failed for monitor %r", monitor_id)

    # -- readers (on the loop) --------------------------------------------------------------------------

    def mark(self, monitor_id: str) -> int:
        """The appends heard on ``monitor_id`` so far (and the re-check generation, see ``recheck_all``);
        read it right after the pull, on the pull's thread."""
        generation = self._generation  # first: see _forget_unparked
        return self._heard.get(monitor_id, 0) + generation * GENERATION

    def recheck_all(self) -> None:
        """Appends may have gone unheard (a shared store's notification connection was down): every parked
        reader re-checks now, and a reader whose mark predates this re-checks instead of parking. Any
        thread; call it where the listener is called (the engine thread), so it orders with the pulls."""
        with self._hop_lock:
            self._generation += 1
            loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._fire_all)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting on it any more

    def _fire_all(self) -> None:
        tables, self._parked = self._parked, {}
        for table in tables.values():
            for parked in list(table):
                parked._listed = False
                self._count -= 1
                parked.fire(True)

    @property
    def parked(self) -> int:
        """Readers parked right now (for metrics)."""
        return self._count

    def parked_on(self, monitor_id: str) -> int:
        return len(self._parked.get(monitor_id, ()))

    def monitors(self) -> list[str]:
        """Monitors with a parked reader right now."""
        return list(self._parked)

    def park(self, monitor_id: str, seen_mark: int, timeout: float, callback: WakeCallback) -> Parked:
        """Call ``callback(True)`` on the loop after an append on ``monitor_id`` past ``seen_mark`` (soon, if
        one already happened), or ``callback(False)`` after ``timeout`` seconds or at shutdown. Call it on
        the loop; ``cancel()`` the returned handle when the reader leaves first."""
        loop = asyncio.get_running_loop()
        self.bind(loop)
        parked = Parked(self, monitor_id, callback)
        # Compared and listed under the listener's lock, after binding: an append counted later than this
        # sees us listed and hops to the loop.
        with self._hop_lock:
            heard = self._heard.get(monitor_id, 0) + self._generation * GENERATION
            listed = heard == seen_mark and not self.draining and timeout > 0
            if listed:
                self._parked.setdefault(monitor_id, {})[parked] = None
                parked._listed = True
                self._count += 1
        if listed:
            parked._timer = loop.call_later(timeout, parked.fire, False)
        else:
            loop.call_soon(parked.fire, heard != seen_mark)
        return parked

    def _unlist(self, parked: Parked) -> None:
        if not parked._listed:
            return
        parked._listed = False
        self._count -= 1
        table = self._parked.get(parked.monitor_id)
        if table is not None:
            table.pop(parked, None)
            if not table:
                del self._parked[parked.monitor_id]

    async def wait(
        self,
        monitor_id: str,
        seen_mark: int,
        timeout: float,
        stop: asyncio.Future[Any] | None = None,
    ) -> bool:
        """Park until an append on ``monitor_id`` after ``seen_mark`` (True), or ``timeout`` seconds, ``stop``
        completing, or shutdown (False). Returns True at once when such an append already happened."""
        if self.mark(monitor_id) != seen_mark:
            return True
        if self.draining or timeout <= 0 or (stop is not None and stop.done()):
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        parked = self.park(monitor_id, seen_mark, timeout, lambda woken: _settle(future, woken))

        def stopped(_stop: asyncio.Future[Any]) -> None:
            _settle(future, False)

        if stop is not None:
            stop.add_done_callback(stopped)
        try:
            return await future
        finally:
            parked.cancel()
            if stop is not None:
                stop.remove_done_callback(stopped)  # a stream reuses its stop signal for every wait

    def wake_all(self) -> None:
        """Shutdown: every parked reader is called back now (False), and later parks return at once."""
        self.draining = True
        tables, self._parked = self._parked, {}
        for table in tables.values():
            for parked in list(table):
                parked._listed = False
                self._count -= 1
                parked.fire(False)


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


async def hold(
    waiters: Waiters,
    monitor_id: str,
    mark: int,
    deadline: float,
    recheck: Recheck,
    *,
    gone: asyncio.Future[Any] | None = None,
) -> Any:
    """Hold a reader until its monitor gets an append that gives it something, or until ``deadline`` (loop
    time): park past ``mark``; each wake-up calls ``recheck(remaining)`` (the seconds left, 0 when the time
    is up or the door is draining) inside the wake-up itself, so the re-checks of every reader one append
    woke start in one loop turn and can share one engine batch. Parks again while the outcome still waits
    on a monitor and time remains. Returns the last reply, or None when ``gone`` completes first (the reader
    left). ``recheck`` may raise: the exception comes out of ``hold``."""
    loop = asyncio.get_running_loop()
    while True:
        answer: asyncio.Future[tuple[Outcome, float] | None] = loop.create_future()

        def woken(_woken: bool, answer: asyncio.Future[tuple[Outcome, float] | None] = answer) -> None:
            remaining = 0.0 if waiters.draining else deadline - loop.time()
            try:
                step = asyncio.ensure_future(recheck(remaining))
            except BaseException as exc:  # handed to the waiting reader
                if not answer.done():
                    answer.set_exception(exc)
                return

            def finished(step: asyncio.Future[Outcome]) -> None:
                if answer.done():
                    return
                if step.cancelled():
                    answer.set_exception(asyncio.CancelledError())
                elif step.exception() is not None:
                    answer.set_exception(step.exception())  # type: ignore[arg-type]
                else:
                    answer.set_result((step.result(), remaining))

            step.add_done_callback(finished)

        parked = waiters.park(monitor_id, mark, deadline - loop.time(), woken)

        def left(
            _gone: asyncio.Future[Any], answer: asyncio.Future[Any] = answer, parked: Parked = parked
        ) -> None:
            parked.cancel()
            _settle(answer, None)

        if gone is not None:
            gone.add_done_callback(left)
        try:
            got = await answer
        finally:
            if gone is not None:
                gone.remove_done_callback(left)
            parked.cancel()
        if got is None:
            return None  # the reader left while waiting
        (reply, waiting_on, mark), remaining = got
        if waiting_on is None or remaining <= 0:
            return reply
        monitor_id = waiting_on
