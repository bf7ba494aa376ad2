"""Transport-free HTTP messages shared by every door (ASGI server, browser shim, tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.core import wire


@dataclass
class Request:
    method: str
    path: str  # e.g. "/mp/v0/monitors/ci/state", without the query string
    query: list[tuple[str, str]] = field(default_factory=list)  # decoded pairs, in order
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class LongPoll:
    """Set on an empty pull asked to wait: the door may wait for an append to `monitor`, then ask again."""

    monitor: str
    wait_seconds: float
    # the request that re-checks (the door sets its `wait` to what is left); None: the original request
    again: Request | None = None


@dataclass
class Response:
    status: int
    body: Any = None  # JSON-able; None means no body
    headers: dict[str, str] = field(default_factory=dict)
    long_poll: LongPoll | None = None

    def json_bytes(self) -> bytes:
        if self.body is None:
            return b""
        return wire.encode(self.body)
