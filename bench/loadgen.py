"""One load-generator process: ``python bench/loadgen.py '<json spec>'`` prints one JSON line.

Spec: base (URL prefix of /mp/v0), workload (publish | bare | pullack | drain | pull), tasks (concurrent
clients in this process), duration (seconds; every loop stops at the deadline), client (sync = one
httpx.Client, sequential; async = httpx.AsyncClient per task; raw = a minimal keep-alive HTTP/1.1 client on
asyncio streams, to see how much of a figure is the client's own cost), start_at (wall clock instant at which
every process starts, so that several processes load the server together), tokens, subs, extra.

Output: count (completed operations), units (observations for drain, else = count), elapsed, errors,
cpu (this process's CPU seconds during the run), first_error.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx

OBS = {"type": "com.example.bench.tick", "subject": "s-1", "actor": "probe:bench", "data": {"n": 1}}
MAX_OPS = 5_000_000  # a hard bound on every loop besides its deadline


class Result:
    def __init__(self) -> None:
        self.count = 0
        self.units = 0
        self.errors = 0
        self.first_error: str | None = None

    def fail(self, what: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = what[:500]


# --------------------------------------------------------------------------------------------- clients
class RawClient:
    """HTTP/1.1 keep-alive over one asyncio connection; just enough for JSON requests to our servers."""

    def __init__(self, base: str) -> None:
        rest = base.split("://", 1)[1]
        hostport, _, prefix = rest.partition("/")
        self.host, _, port = hostport.partition(":")
        self.port = int(port or 80)
        self.prefix = "/" + prefix
        self.hostport = hostport
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port)
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.hostport}\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        head += f"Content-Length: {len(payload)}\r\n\r\n"
        self.w.write(head.encode() + payload)
        assert self.r is not None
        raw = await self.r.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            if line[:15].lower() == "content-length:":
                length = int(line[15:].strip())
        data = await self.r.readexactly(length) if length else b""
        return status, (json.loads(data) if data else None)

    async def close(self) -> None:
        if self.w is not None:
            self.w.close()


class AsyncHttpx:
    def __init__(self, base: str) -> None:
        self.base = base
        self.c = httpx.AsyncClient(timeout=60.0)

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        r = await self.c.request(method, self.base + path, json=body, headers=headers)
        return r.status_code, (r.json() if r.content else None)

    async def close(self) -> None:
        await self.c.aclose()


class SyncHttpx:
    def __init__(self, base: str) -> None:
        self.base = base
        self.c = httpx.Client(timeout=60.0)

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        r = self.c.request(method, self.base + path, json=body, headers=headers)
        return r.status_code, (r.json() if r.content else None)

    def close(self) -> None:
        self.c.close()


# --------------------------------------------------------------------------------------------- workloads
# Each workload is one "operation" written twice (sync and async) around the same request sequence.
def _ops(spec: dict[str, Any], i: int) -> tuple[str, str | None, str | None]:
    tokens = spec.get("tokens") or [None]
    subs = spec.get("subs") or [None]
    return spec["workload"], tokens[i % len(tokens)], subs[i % len(subs)]


def _rpc_batch(sub: str | None, cursor: int | None) -> list[dict[str, Any]]:
    """One HTTP request per round trip: ack what the previous pull returned, then pull the next one."""
    calls = []
    if cursor is not None:
        calls.append(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "feeds/ack",
                "params": {"subscription": sub, "cursor": cursor},
            }
        )
    calls.append(
        {"jsonrpc": "2.0", "id": 2, "method": "feeds/pull", "params": {"subscription": sub, "limit": 1}}
    )
    return calls


def _rpc_result(status: int, body: Any, cursor: int | None) -> tuple[bool, int, int | None]:
    if status != 200 or not isinstance(body, list) or any("error" in r for r in body):
        return False, 0, cursor
    pulled = body[-1]["result"]
    return True, len(pulled["observations"]), pulled["next"]


def run_sync(spec: dict[str, Any], res: Result, deadline: float) -> None:
    workload, token, sub = _ops(spec, 0)
    monitor = spec["extra"].get("monitor", "bench")
    cursor: int | None = None
    c = SyncHttpx(spec["base"])
    try:
        for _ in range(MAX_OPS):
            if time.monotonic() >= deadline:
                break
            if workload in ("publish", "bare"):
                st, _ = c.request("POST", f"/monitors/{monitor}/observations", token, OBS)
                ok = st == 201
                n = 1
            elif workload == "pull":
                st, body = c.request("GET", f"/subscriptions/{sub}/pull?limit=1", token)
                ok = st == 200 and bool(body["observations"])
                n = 1
            elif workload in ("pullack", "drain"):
                limit = 1 if workload == "pullack" else 200
                st, body = c.request("GET", f"/subscriptions/{sub}/pull?limit={limit}", token)
                if st != 200:
                    res.fail(f"pull {st} {body}")
                    continue
                n = len(body["observations"])
                if n == 0:
                    break  # drained: the log is exhausted
                st, body2 = c.request("POST", f"/subscriptions/{sub}/ack", token, {"cursor": body["next"]})
                ok = st == 200
                body = body2
            elif workload == "rpcpullack":
                st, body = c.request("POST", "/rpc", token, _rpc_batch(sub, cursor))
                ok, n, cursor = _rpc_result(st, body, cursor)
                if ok and n == 0:
                    break
            else:
                raise SystemExit(f"unknown workload {workload}")
            if ok:
                res.count += 1
                res.units += n
            else:
                res.fail(f"{workload} {st} {body}")
    finally:
        c.close()


async def run_task(spec: dict[str, Any], i: int, res: Result, deadline: float) -> None:
    workload, token, sub = _ops(spec, i)
    monitor = spec["extra"].get("monitor", "bench")
    cursor: int | None = None
    c: Any = RawClient(spec["base"]) if spec["client"] == "raw" else AsyncHttpx(spec["base"])
    try:
        for _ in range(MAX_OPS):
            if time.monotonic() >= deadline:
                break
            if workload in ("publish", "bare"):
                st, body = await c.request("POST", f"/monitors/{monitor}/observations", token, OBS)
                ok = st == 201
                n = 1
            elif workload == "pull":
                st, body = await c.request("GET", f"/subscriptions/{sub}/pull?limit=1", token)
                ok = st == 200 and bool(body["observations"])
                n = 1
            elif workload in ("pullack", "drain"):
                limit = 1 if workload == "pullack" else 200
                st, body = await c.request("GET", f"/subscriptions/{sub}/pull?limit={limit}", token)
                if st != 200:
                    res.fail(f"pull {st} {body}")
                    continue
                n = len(body["observations"])
                if n == 0:
                    break
                st, body = await c.request(
                    "POST", f"/subscriptions/{sub}/ack", token, {"cursor": body["next"]}
                )
                ok = st == 200
            elif workload == "rpcpullack":
                st, body = await c.request("POST", "/rpc", token, _rpc_batch(sub, cursor))
                ok, n, cursor = _rpc_result(st, body, cursor)
                if ok and n == 0:
                    break
            else:
                raise SystemExit(f"unknown workload {workload}")
            if ok:
                res.count += 1
                res.units += n
            else:
                res.fail(f"{workload} {st} {body}")
    finally:
        await c.close()


async def run_async(spec: dict[str, Any], res: Result, deadline: float) -> None:
    await asyncio.gather(*(run_task(spec, i, res, deadline) for i in range(spec["tasks"])))


def main() -> None:
    spec = json.loads(sys.argv[1])
    res = Result()
    # Start together with the other load-generator processes.
    time.sleep(max(0.0, spec["start_at"] - time.time()))
    cpu0 = time.process_time()
    t0 = time.monotonic()
    deadline = t0 + float(spec["duration"])
    if spec["client"] == "sync":
        run_sync(spec, res, deadline)
    else:
        asyncio.run(run_async(spec, res, deadline))
    elapsed = time.monotonic() - t0
    out = {
        "count": res.count,
        "units": res.units,
        "elapsed": elapsed,
        "errors": res.errors,
        "cpu": time.process_time() - cpu0,
        "first_error": res.first_error,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
