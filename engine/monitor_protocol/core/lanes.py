"""What an engine call keeps to itself while other calls run beside it, on other threads or, with green
lanes (doors/green_lanes.py), on other greenlets of the event loop's own thread.

Standard library only: greenlet is looked up in ``sys.modules``. Whoever runs green lanes imports it before
the store and the service are made (``mp serve --db-lanes green`` does): ``lane_local()`` decides once, when
it is called, whether its attributes are per thread or per greenlet, so a lane's key never changes under a
session it holds, and thread lanes keep ``threading.local``'s speed (an access costs a tenth of a
``LaneLocal``'s or less).
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from typing import Any

_names = itertools.count()

# A lane greenlet's attribute: wait(fd, writable) returns once the socket is ready, running the loop meanwhile.
WAIT_ATTRIBUTE = "mp_wait"


class LaneLocal:
    """Like ``threading.local``, per greenlet: each lane of green lanes (a greenlet of the loop's thread) and
    each other thread (its own main greenlet) sees its own attributes (the PostgreSQL store's session, the
    appends a group holds). Made by ``lane_local()`` once greenlet is imported."""

    __slots__ = ("_current", "_name")

    def __init__(self) -> None:
        green = sys.modules.get("greenlet")
        if green is None:
            raise RuntimeError(
                "LaneLocal keeps greenlets apart: import greenlet first (or call lane_local())"
            )
        object.__setattr__(self, "_current", green.getcurrent)
        object.__setattr__(self, "_name", f"_mp_lane_local_{next(_names)}")

    def _space(self) -> dict[str, Any]:
        here = self._current()
        try:
            return here.__dict__[self._name]  # type: ignore[no-any-return]
        except KeyError:
            space: dict[str, Any] = {}
            setattr(here, self._name, space)
            return space

    def __getattr__(self, name: str) -> Any:
        try:
            return self._space()[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._space()[name] = value


def lane_local() -> Any:
    """Attributes of each engine lane's own: a ``threading.local`` when greenlet is not imported (thread lanes),
    a ``LaneLocal`` (per greenlet too) when it is."""
    return threading.local() if sys.modules.get("greenlet") is None else LaneLocal()


def per_greenlet(*locals_: Any) -> bool:
    """Whether every one of these lane locals keeps greenlets apart (green lanes need it of every one)."""
    return all(isinstance(local, LaneLocal) for local in locals_)


def lane_wait() -> Callable[[int, bool, float | None], bool] | None:
    """How the running lane waits for a socket without blocking its thread (a green lane's), or None (a
    thread: block on the socket). Called with (socket, writable, timeout in seconds or None), it says whether
    the socket became ready (False: the time ran out)."""
    green = sys.modules.get("greenlet")
    if green is None:
        return None
    return getattr(green.getcurrent(), WAIT_ATTRIBUTE, None)  # type: ignore[no-any-return]
