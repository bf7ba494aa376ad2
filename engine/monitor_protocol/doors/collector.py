"""The cyclic garbage collector held off while the readers one append woke get their replies.

A full collection walks every object the process holds; with 1,000 long polls parked (each its request, its
reply, its tasks and callbacks) that is 140,000 objects and 50-90 ms here, and when it lands inside a wake,
every woken reader waits for it (docs/bench.md, "Issue 10's targets, measured again"). Held off, it runs
once the replies have left: the same work, after the latency that matters instead of inside it. Holds nest
(two wakes at once); the collector is enabled again only by the last release, and only if it was enabled
when the first hold began (an embedding program that turned it off keeps it off).

Holds that follow one another without a gap (appends back to back, each waking readers) would keep the
collector off for as long as the load lasts, and the garbage with it. So a hold is bounded in time: after
MAX_HELD_S of holds without a gap the collector is on again for as long, then off, and so on, until the last
hold is released.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

# A wake of 1,000 readers writes its replies in about 50 ms here (docs/bench.md): four times that.
MAX_HELD_S = 0.2


class CollectorHold:
    """Counted holds on the process's (global) automatic garbage collection; loop thread only."""

    __slots__ = ("_holds", "_was_enabled", "_since", "max_held", "clock")

    def __init__(self, max_held: float = MAX_HELD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._holds = 0
        self._was_enabled = False
        self._since = 0.0  # when the collector was last turned off (or on again) by the holds
        self.max_held = max_held
        self.clock = clock

    @property
    def held(self) -> bool:
        return self._holds > 0

    def acquire(self) -> None:
        if self._holds == 0:
            self._was_enabled = gc.isenabled()
            self._since = self.clock()
            gc.disable()
        else:
            self._take_turns()
        self._holds += 1

    def release(self) -> None:
        if self._holds == 0:
            return
        self._holds -= 1
        if self._holds:
            self._take_turns()
        elif self._was_enabled:
            gc.enable()

    def _take_turns(self) -> None:
        """Holds without a gap for max_held: the collector on for as long, then off again (see above)."""
        if not self._was_enabled:
            return
        now = self.clock()
        if now - self._since < self.max_held:
            return
        self._since = now
        if gc.isenabled():
            gc.disable()
        else:
            gc.enable()


HOLD = CollectorHold()
