"""InProcessTransport: the suite against the engine itself, with a fake clock, no sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from monitor_protocol.conformance.transport import API_PREFIX, Query, Reply, query_pairs


class Clock:
    """A controllable clock: call it for the time, `advance` to let time pass."""

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self.now += seconds


class InProcessTransport:
    """Calls `RestRouter.handle` directly; `sleep` advances the fake clock and runs the sweep the doors
    would run on their timer. A long poll is answered at once with its empty reply."""

    name = "in-process"
    supports_origin = True
    real_http = False  # a real request line and socket (X40 needs one)

    def __init__(
        self,
        router: Any,
        service: Any,
        clock: Clock,
        admin_token: str | None = None,
        registration_token: str | None = None,
    ) -> None:
        self.router = router
        self.service = service
        self.clock = clock
        self.admin_token = admin_token
        self.registration_token = registration_token

    @classmethod
    def create(
        cls,
        store: Any = None,
        admin_token: str | None = "admin-test-token",
        registration_token: str | None = None,
        service_factory: Callable[[Any, Clock], Any] | None = None,
        clock: Clock | None = None,
    ) -> InProcessTransport:
        from monitor_protocol.api.rest import RestRouter
        from monitor_protocol.core.service import MonitorService

        if store is None:
            from monitor_protocol.store.memory import MemoryStore

            store = MemoryStore()
        clock = clock or Clock()
        if service_factory is not None:
            service = service_factory(store, clock)
        else:
            service = MonitorService(store, clock=clock, registration_token=registration_token)
        if registration_token is not None and getattr(service, "registration_token", None) is None:
            # a service_factory that did not pass it on: the transport's claim would be false
            registration_token = None
        router = RestRouter(service, admin_token=admin_token)
        return cls(router, service, clock, admin_token=admin_token, registration_token=registration_token)

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
        from monitor_protocol.api.messages import Request

        hdrs = {k.lower(): v for k, v in (headers or {}).items()}
        if token is not None:
            hdrs["authorization"] = f"Bearer {token}"
        data = b""
        if raw_body is not None:
            data = raw_body
        elif body is not None:
            data = json.dumps(body).encode()
        if data:
            hdrs.setdefault("content-type", "application/json")
        req = Request(method.upper(), API_PREFIX + path, query=query_pairs(query), headers=hdrs, body=data)
        resp = self.router.handle(req)
        raw = resp.json_bytes()
        decoded = json.loads(raw) if raw else None
        return Reply(resp.status, decoded, {k.lower(): v for k, v in (resp.headers or {}).items()})

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.service.sweep()

    async def race(self, requests: list[dict[str, Any]]) -> list[Reply]:
        # The engine is synchronous: one call at a time is exactly how concurrent calls reach it.
        return [await self.request(**kw) for kw in requests]
