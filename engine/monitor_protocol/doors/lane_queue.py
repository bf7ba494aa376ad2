"""The queue of `EngineLanes` (doors/engines.py): items in the order they came, each handed to the lane
that went idle last."""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable
from typing import Any

NO_ITEM = object()  # what a lane took when it took nothing (None is the queue's stop sentinel)


class LastIdleFirst:
    """The lanes' queue: items in the order they came, handed to the lane that went idle LAST (a plain queue
    wakes its waiting threads in turn). Under light load one lane then serves call after call with its
    caches warm, instead of each call waking the lane that has been asleep longest: with one client on
    PostgreSQL, four lanes in turn cost ~50 µs more per publish than one (docs/bench-history.md)."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._idle: list[Any] = []  # each waiting lane's waiter (_waiter); the last to wait at the end

    # How a lane waits (a thread here: a lock it holds, released by the put that chooses it; greenlets in
    # doors/green_lanes.py). `_wake` runs under the queue's lock.
    def _waiter(self) -> Any:
        waiter = threading.Lock()
        waiter.acquire()
        return waiter

    def _wake(self, waiter: Any) -> None:
        waiter.release()

    def _sleep(self, waiter: Any) -> None:
        waiter.acquire()

    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            if self._idle:
                self._wake(self._idle.pop())

    def __len__(self) -> int:
        return len(self._items)

    def get_nowait(self) -> Any:
        with self._lock:
            if self._items:
                return self._items.popleft()
        raise queue.Empty

    def get(self, on_idle: Callable[[], None] | None = None) -> Any:
        """The next item, waiting for one. `on_idle` runs once, after this lane is registered as waiting (or
        has its item), and before it sleeps."""
        waiter = self._waiter()
        while True:
            with self._lock:
                item = self._items.popleft() if self._items else NO_ITEM
                if item is NO_ITEM:
                    self._idle.append(waiter)  # checked and registered under one lock: no put is missed
            if on_idle is not None:
                on_idle()
                on_idle = None
            if item is not NO_ITEM:
                return item
            self._sleep(
                waiter
            )  # woken by the put that chose this lane (another lane may take its item first)
