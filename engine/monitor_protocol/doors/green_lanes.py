"""`GreenLanes`: EngineLanes whose lanes are greenlets on the event loop's own thread, not threads.

Why: with lanes on threads, every PostgreSQL call hops from the loop to a lane and its reply hops back (a
thread's wake-up and the interpreter's lock each way: ~90 µs of a publish's ~650, docs/bench-history.md), and
the lanes and the loop take the interpreter's lock from each other under load. A green lane runs its call
where the request was parsed, as LoopEngine does on SQLite, and when the call waits on the database (a round
trip, a lock, a commit) it hands the thread back to the loop: its connection's socket is watched by the loop
(``add_reader``), and the lane goes on when the answer is there. So a call waiting on the database still
holds up no other, which is why a shared store needs lanes at all.

Everything else is EngineLanes' own: one connection per lane (the store's session per lane, core/lanes.py
LaneLocal), a monitor's queued publishes as one group commit, the appends a running call may have missed
told again. What changes is how a lane waits: for work (GreenQueue), for the database (``mp_wait``, read
by store/postgres_wire.py through core/lanes.lane_wait) and for a call that runs alone (closing the store).

What still blocks the loop: connecting to the database (a lane's first call, and a reconnection, bounded by
the connect timeout and tried once per RECONNECT_SECONDS while the database is away).

greenlet is a C extension (the `postgres` extra installs it); without it `mp serve` keeps thread lanes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from monitor_protocol.core.lanes import WAIT_ATTRIBUTE, LaneLocal, per_greenlet
from monitor_protocol.doors.engines import EngineLanes, deliver_all, thread_cpu
from monitor_protocol.doors.lane_queue import LastIdleFirst

log = logging.getLogger("monitor_protocol.http")

AWAY = "mp_away"  # a lane greenlet's attribute: CPU seconds the thread spent elsewhere while it waited


def available() -> bool:
    """Whether greenlet is installed; it is imported here, so call this before the store and the service are
    made (their per-lane state is then per greenlet, core/lanes.py)."""
    try:
        import greenlet  # noqa: F401
    except ImportError:
        return False
    return True


class GreenQueue(LastIdleFirst):
    """LastIdleFirst (doors/lane_queue.py) for lanes that are greenlets: a waiting lane gives the thread back
    to the loop, and the put that chooses it (the lane that went idle last) has the loop switch back to it.
    ``put`` may come from any thread (a LISTEN connection's heard append, run_sync)."""

    def __init__(self, wake: Callable[[Any], None]) -> None:
        super().__init__()
        self._wake_lane = wake

    def _waiter(self) -> Any:
        import greenlet

        return greenlet.getcurrent()

    def _wake(self, waiter: Any) -> None:
        self._wake_lane(waiter)  # scheduled, never a switch: this runs under the queue's lock

    def _sleep(self, waiter: Any) -> None:
        waiter.parent.switch()


class GreenLanes(EngineLanes):
    """EngineLanes on greenlets of the event loop's thread (see the module's docstring). Created anywhere;
    its lanes start on the loop at the first call submitted there."""

    def __init__(self, store: Any, service: Any = None, lanes: int = 4, max_group: int = 32) -> None:
        import greenlet

        for holder in (store, service):  # what each keeps per lane (lane_locals(); nothing when it has none)
            if not per_greenlet(*getattr(holder, "lane_locals", list)()):
                raise RuntimeError(
                    f"{type(holder).__name__} was made before greenlet was imported: its lanes' state is per "
                    "thread, and green lanes share one thread (import greenlet before opening the store)"
                )
        self._greenlet = greenlet
        self._lanes: list[Any] = []
        self._loop_thread: int | None = None
        self._gate_waiting: list[Any] = []
        self._switch_now: list[Any] | None = None  # set while _flush queues: the lanes to run once it has
        super().__init__(store, service, lanes, max_group)
        self._queue = GreenQueue(self._wake)  # type: ignore[assignment]
        self._telling = LaneLocal()  # type: ignore[assignment]

    # -- the lanes, started on the loop -------------------------------------------------------------------
    def _start_lanes(self) -> None:
        pass  # on the loop, at its first call (_bind)

    def _bind(self) -> Any:
        loop = self._loop
        if loop is None:
            loop = super()._bind()
            self._loop_thread = threading.get_ident()
            hub = self._greenlet.getcurrent()
            for _ in range(self.lanes):
                lane = self._greenlet.greenlet(self._run, parent=hub)
                setattr(lane, WAIT_ATTRIBUTE, self._waiter(loop, lane, hub))
                setattr(lane, AWAY, 0.0)
                self._lanes.append(lane)
                lane.switch()  # runs to its first wait for work
        return loop

    def _waiter(self, loop: Any, lane: Any, hub: Any) -> Callable[[int, bool, float | None], bool]:
        def wait(fd: int, writable: bool, timeout: float | None = None) -> bool:
            add, remove = (
                (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
            )
            add(fd, lane.switch, True)
            timer = None if timeout is None else loop.call_later(timeout, lane.switch, False)
            left = thread_cpu()
            try:
                # the loop runs; back when the socket is ready (the caller checks, and may wait again), or at
                # the timeout
                ready = hub.switch()
            finally:
                remove(fd)
                if timer is not None:
                    timer.cancel()
                setattr(lane, AWAY, getattr(lane, AWAY) + thread_cpu() - left)
            return ready is not False

        return wait

    def _flush(self) -> None:
        # The lanes this turn's calls wake run at once, after the queueing (no loop turn between a request
        # and its call), each until it waits on the database or for more work.
        self._switch_now = []
        try:
            super()._flush()
        finally:
            lanes, self._switch_now = self._switch_now, None
        for lane in lanes:
            try:
                lane.switch()
            except Exception:  # a lane that died of a bug: the others still run what they were given
                log.exception("an engine lane ended with an error")

    def _wake(self, lane: Any) -> None:
        loop = self._loop
        if loop is None:
            return  # no lane runs yet: the first ones find the item when they start
        try:
            if threading.get_ident() == self._loop_thread:
                if self._switch_now is not None:  # _flush is queueing: it runs the lane once it has
                    self._switch_now.append(lane)
                else:
                    loop.call_soon(lane.switch)
            else:
                loop.call_soon_threadsafe(lane.switch)
        except RuntimeError:
            pass  # the loop closed: nobody waits for the item any more

    def _cpu(self) -> float:
        """The running lane's CPU: the thread's, less what ran elsewhere while the lane waited."""
        return thread_cpu() - getattr(self._greenlet.getcurrent(), AWAY, 0.0)

    def _send_replies(self) -> None:
        pending = getattr(self._telling, "replies", None)
        if pending is None:
            return
        self._telling.replies = None
        _loop, replies = pending
        deliver_all(replies)  # this is the loop's thread: the replies go out now, the lane already waiting

    # -- a call that runs alone (closing the store) -------------------------------------------------------
    def _enter(self, alone: bool) -> None:
        if alone:
            self._alone += 1
        while self._active if alone else self._alone:
            self._gate_waiting.append(self._greenlet.getcurrent())
            self._greenlet.getcurrent().parent.switch()
        self._active += 1

    def _leave(self, alone: bool) -> None:
        self._active -= 1
        if alone:
            self._alone -= 1
        waiting, self._gate_waiting = self._gate_waiting, []
        for lane in waiting:
            self._wake(lane)

    # -- stopping -----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """No more calls. What is queued is answered "stopped"; the lanes end at their next wait for work (a
        lane cannot be joined from the loop it runs on)."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            self._answer_queued()
            for _ in self._lanes:
                self._queue.put(None)
