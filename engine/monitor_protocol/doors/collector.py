"""The cyclic garbage collector held off while the readers one append woke get their replies.

A full collection walks every object the process holds; with 1,000 long polls parked (each its request, its
reply, its tasks and callbacks) that is 140,000 objects and 50-90 ms here, and when it lands inside a wake,
every woken reader waits (docs/bench-history.md, "Issue 10's targets, measured again"). Held off, it runs
once the replies have left: the same work, after the latency that matters instead of inside it. Holds nest
(two wakes at once); the collector is enabled again only by the last release, and only if the holds turned
it off (an embedding program that turned it off keeps it off).

Holds are bounded in time: one slow re-check (a PostgreSQL round trip that stalls), or holds that follow one
another without a gap (appends back to back, each waking readers), would otherwise keep the collector off,
and the garbage with it, for as long as they last. While holds last, a timer on the event loop turns the
collector on every MAX_HELD_S for MAX_HELD_S, then off again, until the last hold is released. (At the loop's
first turn after MAX_HELD_S: one callback that runs longer is not cut.)
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

# A wake of 1,000 readers writes its replies in about 50 ms here (docs/bench-history.md): four times that.
MAX_HELD_S = 0.2

Timer = Callable[[float, Callable[[], None]], Any]  # call_later(delay, callback) -> a handle with cancel()


def _loop_timer(delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
    return asyncio.get_running_loop().call_later(delay, callback)


class CollectorHold:
    """Counted holds on the process's (global) automatic garbage collection; on the event loop's thread."""

    __slots__ = ("_holds", "_off", "_timer", "max_held", "call_later")

    def __init__(self, max_held: float = MAX_HELD_S, call_later: Timer = _loop_timer) -> None:
        self._holds = 0
        self._off = False  # the holds turned the collector off, and it is off because of them
        self._timer: Any = None
        self.max_held = max_held
        self.call_later = call_later

    @property
    def held(self) -> bool:
        return self._holds > 0

    def acquire(self) -> None:
        if self._holds == 0:
            self._timer = self.call_later(self.max_held, self._take_turns)  # first: it raises off the loop
            self._turn_off()
        self._holds += 1

    def release(self) -> None:
        if self._holds == 0:
            return
        self._holds -= 1
        if self._holds == 0:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._turn_on()

    def _take_turns(self) -> None:
        """Held for max_held more: the collector on if the holds had it off, off again if they had it on."""
        if self._holds == 0:
            return
        if self._off:
            self._turn_on()
        else:
            self._turn_off()
        self._timer = self.call_later(self.max_held, self._take_turns)

    def _turn_off(self) -> None:
        if gc.isenabled():  # a collector the program turned off is left to the program
            gc.disable()
            self._off = True

    def _turn_on(self) -> None:
        if self._off:
            self._off = False
            gc.enable()


HOLD = CollectorHold()
