"""Test kit for the engine: a service over any store with a controllable clock, called through the router."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor_protocol.api.messages import Request
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store.memory import MemoryStore
from monitor_protocol.store.sqlite import SQLiteStore

START = 1_790_000_000.0


class Clock:
    def __init__(self, t: float = START) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Reply:
    status: int
    body: Any


def make_store(kind: str, tmp_path: Path):
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(str(tmp_path / "engine.db"))
    raise ValueError(kind)


STORE_KINDS = ["memory", "sqlite"]


class Harness:
    """The engine behind its REST router, as every door sees it."""

    def __init__(
        self, store, *, registration_token: str | None = None, admin_token: str = "admin-token"
    ) -> None:
        self.clock = Clock()
        self.store = store
        self.service = MonitorService(store, clock=self.clock, registration_token=registration_token)
        self.router = RestRouter(self.service, admin_token=admin_token)

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, query=None, headers=None
    ):
        h = dict(headers or {})
        if token:
            h["authorization"] = f"Bearer {token}"
        raw = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else b"")
        resp = self.router.handle(Request(method, "/mp/v0" + path, list(query or []), h, raw))
        return Reply(resp.status, resp.body)

    # conveniences -------------------------------------------------------------------------------
    def monitor(self, mid: str = "ci", **fields: Any) -> str:
        body = {"id": mid, "owner": "human:you", "types": ["com.example.ci.run"], **fields}
        r = self.call("POST", "/monitors", body)
        assert r.status == 201, r.body
        return r.body["owner_token"]

    def publish(self, mid: str, owner_token: str, **fields: Any) -> Reply:
        body = {"type": "com.example.ci.run", **fields}
        return self.call("POST", f"/monitors/{mid}/observations", body, owner_token)

    def subscribe(self, mid: str, token: str | None = None, **fields: Any) -> tuple[str, str]:
        body = {"monitor": mid, "subscriber": fields.pop("subscriber", "agent:reader"), **fields}
        r = self.call("POST", "/subscriptions", body, token)
        assert r.status == 201, r.body
        return r.body["subscription"]["id"], r.body["token"]

    def pull(self, sub: str, token: str, **query: Any) -> Reply:
        return self.call(
            "GET", f"/subscriptions/{sub}/pull", token=token, query=[(k, str(v)) for k, v in query.items()]
        )

    def ack(self, sub: str, token: str, cursor: Any) -> Reply:
        return self.call("POST", f"/subscriptions/{sub}/ack", {"cursor": cursor}, token)

    def log(self, mid: str, owner_token: str) -> list[dict[str, Any]]:
        """The whole log as the owner's own fresh reader sees it (read-only replay)."""
        sub, tok = self.subscribe(mid, owner_token, subscriber="system:auditor")
        out: list[dict[str, Any]] = []
        cursor = 1
        while True:
            r = self.pull(sub, tok, cursor=cursor, limit=200)
            assert r.status == 200, r.body
            out.extend(r.body["observations"])
            if not r.body["observations"]:
                return out
            cursor = r.body["next"]


def as_format_2(path: Path | str) -> None:
    """A format-3 SQLite file made into what format 2 wrote: a subscription's last pull in its JSON rest, no
    column of its own, user_version 2 (what the upgrade tests open)."""
    import sqlite3

    raw = sqlite3.connect(path)
    for sid, last_pull, text in raw.execute("SELECT id, last_pull, rec FROM subscriptions").fetchall():
        rest = json.loads(text)
        rest["last_pull"] = last_pull
        raw.execute("UPDATE subscriptions SET rec=? WHERE id=?", (json.dumps(rest), sid))
    raw.execute("ALTER TABLE subscriptions DROP COLUMN last_pull")
    raw.execute("PRAGMA user_version=2")
    raw.commit()
    raw.close()
