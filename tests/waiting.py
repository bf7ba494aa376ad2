"""Waiting in tests: on a condition, with a deadline.

A fixed sleep that hopes something has happened by then is too short on a loaded machine and too long on an
idle one; an upper bound on how long something took fails whenever the machine is busy (speed is measured
in bench/, never asserted in tests). So a test waits for what it needs with `eventually` (or
`eventually_async` inside an event loop), and its deadline is a hang guard, generous on purpose: no test
depends on it being short. The sleeps left in the suite are the point of their test (nothing may happen for
that long; a timeout or a lease must run out; a producer is paced) and say so beside them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_SECONDS = 30.0  # a hang guard: what is awaited normally comes within a fraction of it


def eventually(
    predicate: Callable[[], T],
    *,
    timeout: float = DEADLINE_SECONDS,
    interval: float = 0.05,
    what: str = "the awaited condition",
    detail: Callable[[], str] | None = None,
) -> T:
    """Call `predicate` every `interval` seconds until it returns something truthy, and return that. Past
    `timeout` seconds: AssertionError naming `what`, the last value seen and `detail()` (e.g. a server's log
    as it is then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_failure(what, timeout, value, detail))
        time.sleep(interval)


async def eventually_async(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = DEADLINE_SECONDS,
    interval: float = 0.01,
    what: str = "the awaited condition",
    detail: Callable[[], str] | None = None,
) -> T:
    """`eventually` inside an event loop: the loop keeps running between the checks (interval 0 checks once
    per loop turn), and `predicate` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(_failure(what, timeout, value, detail))
        await asyncio.sleep(interval)


def _failure(what: str, timeout: float, value: object, detail: Callable[[], str] | None) -> str:
    return f"{what}: not within {timeout:g} s (last seen: {value!r}){detail() if detail else ''}"
