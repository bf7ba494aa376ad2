"""HttpTransport: the suite against a running server (`mp serve`), over real HTTP with httpx."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from monitor_protocol.conformance.transport import API_PREFIX, Query, Reply, query_pairs

FRESH_CONNECTION_BYTES = 64 * 1024


def _origin(base: str) -> str:
    base = base.rstrip("/")
    return base[: -len(API_PREFIX)] if base.endswith(API_PREFIX) else base


class HttpTransport:
    """Speaks to `base` (e.g. http://127.0.0.1:8130); `sleep` really waits, `race` really overlaps.

    Several bases (servers sharing one store, docs/scale-out.md): each request goes to the next server in
    turn, so every check that takes more than one request crosses servers (a publish on one, the pull that
    must see it on another; a reader parked on one, woken by a publish on the next)."""

    supports_origin = True
    real_http = True  # a real request line and socket (X40 needs one)

    def __init__(
        self,
        base: str | list[str],
        admin_token: str | None = None,
        registration_token: str | None = None,
        timeout: float = 30.0,
        client: Any = None,
    ) -> None:
        import httpx

        bases = [_origin(b) for b in ([base] if isinstance(base, str) else base)]
        if not bases:
            raise ValueError("HttpTransport needs at least one base URL")
        self.bases = bases
        self.base = bases[0]
        self.name = "http " + ", ".join(bases)
        self.admin_token = admin_token
        self.registration_token = registration_token
        self._clients = (
            [client]
            if client is not None and len(bases) == 1
            else [httpx.AsyncClient(base_url=b, timeout=timeout) for b in bases]
        )
        self._client = self._clients[0]
        self._turn = 0

    def _next(self) -> tuple[str, Any]:
        i = self._turn % len(self._clients)
        self._turn += 1
        return self.bases[i], self._clients[i]

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
    ) -> Reply:
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        content = raw_body
        if content is None and body is not None:
            content = json.dumps(body).encode()
        if content is not None:
            hdrs.setdefault("Content-Type", "application/json")
        args = (method.upper(), API_PREFIX + path)
        kwargs = {"params": query_pairs(query), "headers": hdrs, "content": content}
        base, client = self._next()
        if content is not None and len(content) > FRESH_CONNECTION_BYTES:
            # A server may answer a large body early (413) and close; on a kept-alive connection that
            # close can reset the socket before the answer is read. A fresh connection avoids the race.
            import httpx

            async with httpx.AsyncClient(base_url=base, timeout=client.timeout) as one_shot:
                resp = await one_shot.request(*args, **kwargs)
        else:
            resp = await client.request(*args, **kwargs)
        try:
            decoded = resp.json() if resp.content else None
        except ValueError:
            decoded = resp.text
        return Reply(resp.status_code, decoded, {k.lower(): v for k, v in resp.headers.items()})

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def race(self, requests: list[dict[str, Any]]) -> list[Reply]:
        return list(await asyncio.gather(*(self.request(**kw) for kw in requests)))

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def __aenter__(self) -> HttpTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
