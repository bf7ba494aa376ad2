"""The cyclic garbage collector held off while the readers one append woke get their replies.

A full collection walks every object the process holds; with 1,000 long polls parked (each its request, its
reply, its tasks and callbacks) that is 140,000 objects and 50-90 ms here, and when it lands inside a wake,
every woken reader waits for it (docs/bench.md, "Issue 10's targets, measured again"). Held off, it runs
once the replies have left: the same work, after the latency that matters instead of inside it. Holds nest
(two wakes at once); the collector is enabled again only by the last release, and only if it was enabled
when the first hold began (an embedding program that turned it off keeps it off).
"""

from __future__ import annotations

import gc


class CollectorHold:
    """Counted holds on the process's (global) automatic garbage collection; loop thread only."""

    __slots__ = ("_holds", "_was_enabled")

    def __init__(self) -> None:
        self._holds = 0
        self._was_enabled = False

    @property
    def held(self) -> bool:
        return self._holds > 0

    def acquire(self) -> None:
        if self._holds == 0:
            self._was_enabled = gc.isenabled()
            gc.disable()
        self._holds += 1

    def release(self) -> None:
        if self._holds == 0:
            return
        self._holds -= 1
        if self._holds == 0 and self._was_enabled:
            gc.enable()


HOLD = CollectorHold()
