"""The one interface the checks talk through: requests relative to `/mp/v0`, a clock, and a race."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

API_PREFIX = "/mp/v0"

Query = dict[str, Any] | list[tuple[str, Any]] | None


@dataclass
class Reply:
    """One HTTP-shaped answer: status, decoded JSON body (None when empty or not JSON), headers."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default) if isinstance(self.body, dict) else default

    @property
    def code(self) -> str | None:
        """The protocol error code of an error reply, else None."""
        return self.get("code") if self.status >= 400 else None

    def __repr__(self) -> str:
        text = repr(self.body)
        if len(text) > 300:
            text = text[:300] + "..."
        return f"Reply({self.status}, {text})"


@runtime_checkable
class Transport(Protocol):
    """What a server looks like to the suite.

    `request` paths are relative to `/mp/v0` ("/monitors"); `body` is JSON-encoded unless `raw_body`
    (bytes) is given; `query` is a dict or a list of pairs. `sleep` lets time pass: the in-process
    transport advances its fake clock, the HTTP transport really waits. `race` sends several requests at
    the same moment (as far as the transport can) and returns their replies in the same order.
    """

    name: str
    admin_token: str | None
    registration_token: str | None
    supports_origin: bool

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        token: str | None = None,
        query: Query = None,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
    ) -> Reply: ...

    async def sleep(self, seconds: float) -> None: ...

    async def race(self, requests: list[dict[str, Any]]) -> list[Reply]: ...


def query_pairs(query: Query) -> list[tuple[str, str]]:
    """Normalise a query to string pairs; list values become repeated keys, booleans lower-case."""
    if not query:
        return []
    items = query.items() if isinstance(query, dict) else query
    out: list[tuple[str, str]] = []
    for key, value in items:
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is None:
                continue
            out.append((str(key), str(v).lower() if isinstance(v, bool) else str(v)))
    return out
