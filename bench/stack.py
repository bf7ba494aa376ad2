"""The HTTP stack, measured: the client's HTTP layer, the server (uvicorn vs granian), the JSON codec and the
engine's own share of a request, so that the stack can be chosen by figures. Nothing here is a test.

    .venv/bin/python bench/stack.py                      # every section (A B C D), about 14 minutes on 2 cores
    .venv/bin/python bench/stack.py --granian-tuning     # B also runs bare_app on granian's other settings
    .venv/bin/python bench/stack.py --only A,C --runs 3 --duration 1
    .venv/bin/python bench/stack.py --markdown           # print bench/results/stack.json as tables

Every HTTP figure is the median of ``--runs`` runs of ``--duration`` seconds (min and max beside it) against
a real server child process on a fresh SQLite database in a temporary directory (prefilled in-process so a
pull always finds an observation). The runs go round-robin (round 1 of every figure set, then round 2...),
so that figures compared with each other share the machine's background load; beside each figure are the
1-minute load average when its runs began and, more telling, the cores other processes used during them
(/proc/stat busy time minus the server's and the client's own). A section run alone keeps the others'
last results in bench/results/stack.json.

A  client HTTP layers: one sequential keep-alive client in one process (a child of this one) against
   `mp serve` (publish; pull(limit 1)+ack) and against bench/bare_app.py (the transport limit); the client's
   CPU per request (time.process_time over the run / requests) and the server's (/proc, all threads).
B  servers: the real mp ASGI app under uvicorn as `mp serve` runs it, uvicorn with the access log written,
   and granian (ASGI, 1 worker, uvloop, HTTP/1) serving the same app (built as cli/serve.py builds
   it); bench/bare_app.py under uvicorn and granian. 1 client (A's fastest layer, and httpx) and 16 raw
   asyncio clients (bench/loadgen.py). Then functional checks of what `mp serve` promises at the HTTP
   level, on uvicorn and on granian.
C  JSON codecs in-process: stdlib json vs orjson vs msgspec on real replies (publish; pull of 1 and 100
   observations) and a publish body; µs per op; then the semantics that matter (lone surrogates, NaN, big
   integers, non-string keys, depth, BOM, byte equality with the stdlib's compact encoding).
D  the engine in-process: CPU µs per publish and per pull+ack through RestRouter.handle (no HTTP) on SQLite
   (synchronous=FULL, one commit per call and 64 calls per group commit) and on the memory store, with the
   stdlib codec and with mp serve's; a cProfile of RestRouter.handle; py-spy of `mp serve` under a
   1-client publish load, sampling every non-idle thread (the fsync wait counts) and the GIL holder only.

Internal subcommands, used by the run itself:
    stack.py client SPEC_JSON                              one client child (sections A, B and D)
    stack.py serve-granian --app mp|bare --db PATH --port N [--header-timeout S] [--access-log]
                           [--loop uvloop|asyncio] [--task-impl asyncio|rust] [--runtime-mode st|mt]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import (  # noqa: E402
    BENCH,
    CLK_TCK,
    PY,
    RESULTS,
    ROOT,
    _stop,
    _wait_ready,
    cpu_seconds,
    free_port,
    machine,
)

OUT = RESULTS / "stack.json"
MONITOR = "bench"  # bench/loadgen.py publishes to this monitor, with its own observation type
TYPES = ["com.example.ci.run", "com.example.bench.tick"]
PUB_BODY = {"type": "com.example.ci.run", "subject": "build-1", "data": {"n": 1}}
PREFILL = 40_000  # observations in the log before a server starts: pull(limit 1) never finds it empty
MAX_OPS = 5_000_000  # a hard bound on every loop besides its deadline


def _enc(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _dec(raw: bytes) -> Any:
    return json.loads(raw) if raw else None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (granian serves from a child process of its main one)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    out, todo = [root], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        out += kids
        todo += kids
    return out


def cpu_of(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (user, nice, system, irq, softirq, steal) since boot: with
    the server's and the client's own CPU subtracted, what other processes used during a run."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def summary(values: list[float]) -> dict[str, Any]:
    vs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not vs:
        return {"median": None, "min": None, "max": None, "runs": 0}
    return {"median": statistics.median(vs), "min": vs[0], "max": vs[-1], "runs": len(vs)}


def log(msg: str) -> None:
    print(f"[stack {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ================================================================================= client HTTP layers
# Every layer sends the same request (Host, Accept, Authorization, Content-Type, Content-Length) and
# encodes/decodes JSON with the stdlib (httpx does so itself with the same settings), so that the figures
# differ by the HTTP layer only.


class Layer:
    kind = "sync"

    def __init__(self, base: str) -> None:
        self.base = base  # http://127.0.0.1:PORT/mp/v0
        rest = base.split("://", 1)[1]
        hostport, _, prefix = rest.partition("/")
        host, _, port = hostport.partition(":")
        self.host, self.port, self.hostport, self.prefix = host, int(port or 80), hostport, "/" + prefix

    def headers(self, token: str | None, payload: bytes | None) -> dict[str, str]:
        h = {"Host": self.hostport, "Accept": "application/json"}
        if token:
            h["Authorization"] = f"Bearer {token}"
        if payload is not None:
            h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(payload or b""))
        return h

    def head_bytes(self, method: str, path: str, token: str | None, payload: bytes | None) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in self.headers(token, payload).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # the two operations measured; pullack returns the observations pulled, or -1
    def publish(self, monitor: str, token: str | None) -> int:
        st, _ = self.request("POST", f"/monitors/{monitor}/observations", token, PUB_BODY)
        return 1 if st == 201 else -1

    def pullack(self, sub: str, token: str | None) -> int:
        st, body = self.request("GET", f"/subscriptions/{sub}/pull?limit=1", token)
        if st != 200:
            return -1
        st, _ = self.request("POST", f"/subscriptions/{sub}/ack", token, {"cursor": body["next"]})
        return len(body["observations"]) if st == 200 else -1


class HttpxSync(Layer):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        import httpx

        self.c = httpx.Client(timeout=60.0)

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        h = {"accept": "application/json"}
        if token:
            h["authorization"] = f"Bearer {token}"
        r = self.c.request(method, self.base + path, json=body, headers=h)
        return r.status_code, (r.json() if r.content else None)

    def close(self) -> None:
        self.c.close()


class MpClient(Layer):
    """The project's own client (monitor_protocol.client.Client on httpx), typed results and all."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        from monitor_protocol.client import Client

        self.c = Client(base)

    def publish(self, monitor: str, token: str | None) -> int:
        self.c.publish(
            monitor, PUB_BODY["type"], subject=PUB_BODY["subject"], data=PUB_BODY["data"], token=token
        )
        return 1

    def pullack(self, sub: str, token: str | None) -> int:
        got = self.c.pull(sub, limit=1, token=token)
        self.c.ack(sub, got.next, token=token)
        return len(got.observations)

    def close(self) -> None:
        self.c.close()


class HttpClientLayer(Layer):
    """http.client.HTTPConnection reused, with a tiny wrapper: a reused connection the server dropped is
    reconnected and the request sent once more (never when the connection was fresh)."""

    DROPPED = (
        http.client.RemoteDisconnected,
        http.client.CannotSendRequest,
        ConnectionError,
        BrokenPipeError,
    )

    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        payload = _enc(body) if body is not None else None
        headers = self.headers(token, payload)
        for _attempt in range(2):
            fresh = self.conn is None
            if self.conn is None:
                self.conn = self._connect()
            try:
                self.conn.request(method, self.prefix + path, body=payload, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
            except self.DROPPED:
                self.conn.close()
                self.conn = None
                if fresh:
                    raise
                continue
            if resp.will_close:
                self.conn.close()
                self.conn = None
            return resp.status, _dec(data)
        raise ConnectionError("the server dropped the connection twice")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Urllib3Pool(Layer):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        import urllib3

        self.pool = urllib3.HTTPConnectionPool(self.host, self.port, maxsize=1, timeout=60.0)

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        payload = _enc(body) if body is not None else None
        r = self.pool.request(method, self.prefix + path, body=payload, headers=self.headers(token, payload))
        return r.status, _dec(r.data)

    def close(self) -> None:
        self.pool.close()


class Urllib3PoolManager(Layer):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        import urllib3

        self.pm = urllib3.PoolManager(maxsize=1, timeout=60.0)

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        payload = _enc(body) if body is not None else None
        r = self.pm.request(method, self.base + path, body=payload, headers=self.headers(token, payload))
        return r.status, _dec(r.data)

    def close(self) -> None:
        self.pm.clear()


class _Dropped(Exception):
    pass


class H11Sync(Layer):
    """h11 over one blocking socket (TCP_NODELAY), reconnecting a dropped reused connection once."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        import h11

        self.h11 = h11
        self.sock: socket.socket | None = None
        self.conn: Any = None

    def _connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = self.h11.Connection(our_role=self.h11.CLIENT)

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = self.conn = None

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        payload = _enc(body) if body is not None else None
        for _attempt in range(2):
            fresh = self.sock is None
            if fresh:
                self._connect()
            try:
                return self._exchange(method, path, token, payload)
            except (_Dropped, ConnectionError, self.h11.RemoteProtocolError):
                self._drop()
                if fresh:
                    raise
        raise ConnectionError("the server dropped the connection twice")

    def _exchange(self, method: str, path: str, token: str | None, payload: bytes | None) -> tuple[int, Any]:
        h11, conn, sock = self.h11, self.conn, self.sock
        assert sock is not None
        headers = list(self.headers(token, payload).items())
        out = conn.send(h11.Request(method=method, target=self.prefix + path, headers=headers))
        if payload:
            out += conn.send(h11.Data(data=payload))
        out += conn.send(h11.EndOfMessage())
        sock.sendall(out)
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise _Dropped
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            self._drop()
        else:
            conn.start_next_cycle()
        return status, _dec(b"".join(chunks))

    def close(self) -> None:
        self._drop()


class RawSync(Layer):
    """The floor: a hand-rolled HTTP/1.1 keep-alive client on one blocking socket (Content-Length only)."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.sock: socket.socket | None = None
        self.buf = b""

    def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        payload = _enc(body) if body is not None else None
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=60)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
        sock = self.sock
        sock.sendall(self.head_bytes(method, path, token, payload) + (payload or b""))
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                self.close()
                raise ConnectionError("closed")
            buf += chunk
        head, rest = buf[:end], buf[end + 4 :]
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                self.close()
                raise ConnectionError("closed")
            rest += chunk
        self.buf = rest[length:]
        return status, _dec(rest[:length])

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None


class AsyncLayer(Layer):
    kind = "async"

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:  # type: ignore[override]
        raise NotImplementedError

    async def close(self) -> None:  # type: ignore[override]
        pass

    async def publish(self, monitor: str, token: str | None) -> int:  # type: ignore[override]
        st, _ = await self.request("POST", f"/monitors/{monitor}/observations", token, PUB_BODY)
        return 1 if st == 201 else -1

    async def pullack(self, sub: str, token: str | None) -> int:  # type: ignore[override]
        st, body = await self.request("GET", f"/subscriptions/{sub}/pull?limit=1", token)
        if st != 200:
            return -1
        st, _ = await self.request("POST", f"/subscriptions/{sub}/ack", token, {"cursor": body["next"]})
        return len(body["observations"]) if st == 200 else -1


class HttpxAsync(AsyncLayer):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        import httpx

        self.c = httpx.AsyncClient(timeout=60.0)

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:  # type: ignore[override]
        h = {"accept": "application/json"}
        if token:
            h["authorization"] = f"Bearer {token}"
        r = await self.c.request(method, self.base + path, json=body, headers=h)
        return r.status_code, (r.json() if r.content else None)

    async def close(self) -> None:  # type: ignore[override]
        await self.c.aclose()


class MpAsyncClient(AsyncLayer):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        from monitor_protocol.client import AsyncClient

        self.c = AsyncClient(base)

    async def publish(self, monitor: str, token: str | None) -> int:  # type: ignore[override]
        await self.c.publish(
            monitor, PUB_BODY["type"], subject=PUB_BODY["subject"], data=PUB_BODY["data"], token=token
        )
        return 1

    async def pullack(self, sub: str, token: str | None) -> int:  # type: ignore[override]
        got = await self.c.pull(sub, limit=1, token=token)
        await self.c.ack(sub, got.next, token=token)
        return len(got.observations)

    async def close(self) -> None:  # type: ignore[override]
        await self.c.aclose()


class H11Asyncio(AsyncLayer):
    """asyncio streams + h11: what a minimal async client on h11 costs."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        import h11

        self.h11 = h11
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None
        self.conn: Any = None

    async def _connect(self) -> None:
        self.r, self.w = await asyncio.open_connection(self.host, self.port)
        self.conn = self.h11.Connection(our_role=self.h11.CLIENT)

    def _drop(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = self.conn = None

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:  # type: ignore[override]
        payload = _enc(body) if body is not None else None
        for _attempt in range(2):
            fresh = self.w is None
            if fresh:
                await self._connect()
            try:
                return await self._exchange(method, path, token, payload)
            except (_Dropped, ConnectionError, self.h11.RemoteProtocolError):
                self._drop()
                if fresh:
                    raise
        raise ConnectionError("the server dropped the connection twice")

    async def _exchange(
        self, method: str, path: str, token: str | None, payload: bytes | None
    ) -> tuple[int, Any]:
        h11, conn = self.h11, self.conn
        assert self.r is not None and self.w is not None
        headers = list(self.headers(token, payload).items())
        out = conn.send(h11.Request(method=method, target=self.prefix + path, headers=headers))
        if payload:
            out += conn.send(h11.Data(data=payload))
        out += conn.send(h11.EndOfMessage())
        self.w.write(out)
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.r.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise _Dropped
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            self._drop()
        else:
            conn.start_next_cycle()
        return status, _dec(b"".join(chunks))

    async def close(self) -> None:  # type: ignore[override]
        self._drop()


class Aiohttp(AsyncLayer):
    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.s: Any = None

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:  # type: ignore[override]
        if self.s is None:
            import aiohttp

            self.s = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=60)
            )
        payload = _enc(body) if body is not None else None
        h = self.headers(token, payload)
        del h["Host"], h["Content-Length"]  # aiohttp writes its own
        async with self.s.request(method, self.base + path, data=payload, headers=h) as r:
            return r.status, _dec(await r.read())

    async def close(self) -> None:  # type: ignore[override]
        if self.s is not None:
            await self.s.close()


class RawAsyncio(AsyncLayer):
    """The floor: bench/loadgen.py's minimal keep-alive HTTP/1.1 client on asyncio streams."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        from loadgen import RawClient

        self.c = RawClient(base)

    async def request(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:  # type: ignore[override]
        return await self.c.request(method, path, token, body)

    async def close(self) -> None:  # type: ignore[override]
        await self.c.close()


# name -> (class, what it is, the package it needs or None)
LAYERS: dict[str, tuple[type[Layer], str, str | None]] = {
    "httpx": (HttpxSync, "httpx.Client (what client.py uses)", "httpx"),
    "mp-client": (MpClient, "monitor_protocol.client.Client as this tree has it, typed results", "httpx"),
    "http.client": (HttpClientLayer, "http.client.HTTPConnection reused, reconnect wrapper", None),
    "urllib3-pool": (Urllib3Pool, "urllib3.HTTPConnectionPool", "urllib3"),
    "urllib3-pm": (Urllib3PoolManager, "urllib3.PoolManager", "urllib3"),
    "h11-socket": (H11Sync, "h11 over a blocking socket", "h11"),
    "raw-socket": (RawSync, "hand-rolled HTTP/1.1 on a blocking socket (floor)", None),
    "httpx-async": (HttpxAsync, "httpx.AsyncClient", "httpx"),
    "mp-async-client": (MpAsyncClient, "monitor_protocol.client.AsyncClient as this tree has it", "httpx"),
    "h11-asyncio": (H11Asyncio, "asyncio streams + h11", "h11"),
    "aiohttp": (Aiohttp, "aiohttp.ClientSession", "aiohttp"),
    "raw-asyncio": (RawAsyncio, "bench/loadgen.py RawClient on asyncio streams (floor)", None),
}


def available(layer: str) -> bool:
    need = LAYERS[layer][2]
    if need is None:
        return True
    try:
        __import__(need)
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- one client child process
def _op_of(c: Layer, spec: dict[str, Any]) -> Callable[[], Any]:
    workload, token, sub = spec["workload"], spec.get("token"), spec.get("sub")
    if workload in ("publish", "bare"):
        return lambda: c.publish(MONITOR, token)
    if workload == "pullack":
        return lambda: c.pullack(sub, token)
    raise SystemExit(f"unknown workload {workload}")


def _run_record(
    count: int, empty: int, errors: int, elapsed: float, cpu: float, scpu: float, busy: float
) -> dict[str, Any]:
    return {
        "count": count,
        "empty": empty,
        "errors": errors,
        "elapsed": elapsed,
        "rate": count / elapsed if elapsed else 0.0,
        "client_cpu": cpu,
        "server_cpu": scpu,
        "other_cpu": max(0.0, busy - cpu - scpu),
    }


def client_sync(spec: dict[str, Any]) -> dict[str, Any]:
    c = LAYERS[spec["layer"]][0](spec["base"])
    op = _op_of(c, spec)
    pids = tree_pids(spec["server_pid"])
    first_error = None
    runs = []
    try:
        deadline = time.perf_counter() + spec["warmup"]
        while time.perf_counter() < deadline:
            op()
        for _ in range(spec["runs"]):
            time.sleep(spec.get("gap", 0.2))
            count = empty = errors = 0
            b0, s0, c0, t0 = busy_seconds(), cpu_of(pids), time.process_time(), time.perf_counter()
            deadline = t0 + spec["duration"]
            for _ in range(MAX_OPS):
                if time.perf_counter() >= deadline:
                    break
                try:
                    n = op()
                except Exception as exc:
                    n = -1
                    first_error = first_error or repr(exc)[:300]
                if n < 0:
                    errors += 1
                else:
                    count += 1
                    empty += n == 0
            t1, c1, s1, b1 = time.perf_counter(), time.process_time(), cpu_of(pids), busy_seconds()
            runs.append(_run_record(count, empty, errors, t1 - t0, c1 - c0, s1 - s0, b1 - b0))
    finally:
        c.close()
    return {"runs": runs, "first_error": first_error}


async def client_async(spec: dict[str, Any]) -> dict[str, Any]:
    c: Any = LAYERS[spec["layer"]][0](spec["base"])
    workload, token, sub = spec["workload"], spec.get("token"), spec.get("sub")

    async def op() -> int:
        if workload in ("publish", "bare"):
            return await c.publish(MONITOR, token)
        return await c.pullack(sub, token)

    pids = tree_pids(spec["server_pid"])
    first_error = None
    runs = []
    try:
        deadline = time.perf_counter() + spec["warmup"]
        while time.perf_counter() < deadline:
            await op()
        for _ in range(spec["runs"]):
            await asyncio.sleep(spec.get("gap", 0.2))
            count = empty = errors = 0
            b0, s0, c0, t0 = busy_seconds(), cpu_of(pids), time.process_time(), time.perf_counter()
            deadline = t0 + spec["duration"]
            for _ in range(MAX_OPS):
                if time.perf_counter() >= deadline:
                    break
                try:
                    n = await op()
                except Exception as exc:
                    n = -1
                    first_error = first_error or repr(exc)[:300]
                if n < 0:
                    errors += 1
                else:
                    count += 1
                    empty += n == 0
            t1, c1, s1, b1 = time.perf_counter(), time.process_time(), cpu_of(pids), busy_seconds()
            runs.append(_run_record(count, empty, errors, t1 - t0, c1 - c0, s1 - s0, b1 - b0))
    finally:
        await c.close()
    return {"runs": runs, "first_error": first_error}


def client_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    if LAYERS[spec["layer"]][0].kind == "sync":
        out = client_sync(spec)
    else:
        out = asyncio.run(client_async(spec))
    print(json.dumps(out))


# ====================================================================================== servers
class Srv:
    def __init__(self, kind: str, proc: subprocess.Popen[str], port: int) -> None:
        self.kind = kind
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.base = self.url + "/mp/v0"
        self.pids = [proc.pid]

    def cpu(self) -> float:  # for common.loadgen: the whole process tree (granian's worker included)
        return cpu_of(self.pids)


SERVER_KINDS = {
    "uvicorn-mp": "mp serve --log-level warning (uvicorn, httptools, uvloop, hardened protocol; no access lines)",
    "uvicorn-mp-access": "mp serve --log-level info [--access-log]: an access line per request, to a file",
    "granian-mp": "granian 1 worker, ASGI, uvloop, HTTP/1, serving the same MonitorApp",
    "uvicorn-bare": "bench/bare_app.py on uvicorn (mp serve's uvicorn.Config)",
    "granian-bare": "bench/bare_app.py on granian (ASGI, 1 worker, uvloop, HTTP/1)",
}


# --granian-tuning: the bare app on granian's other settings, to see whether one changes the verdict
GRANIAN_TUNING = {
    "granian-bare rust-task": ["--task-impl", "rust"],
    "granian-bare asyncio-loop": ["--loop", "asyncio"],
    "granian-bare mt-runtime": ["--runtime-mode", "mt"],
}


@contextlib.contextmanager
def serve(kind: str, db: str | None, tmp: Path, extra: list[str] | None = None) -> Iterator[Srv]:
    port = free_port()
    extra = list(extra or [])
    stdout: Any = subprocess.DEVNULL
    if kind in ("uvicorn-mp", "uvicorn-mp-access"):
        access = kind == "uvicorn-mp-access"
        cmd = [PY, "-m", "monitor_protocol", "serve", "--db", str(db), "--port", str(port)]
        # the access lines are logged at info; newer trees also need --access-log (off by default)
        cmd += ["--log-level", "info" if access else "warning", *extra]
        if access:
            cmd += ["--access-log"] if _has_access_log_flag() else []
            stdout = open(tmp / f"access-{port}.log", "w")  # noqa: SIM115 (closed below)
    elif kind == "granian-mp":
        cmd = [PY, str(HERE / "stack.py"), "serve-granian", "--app", "mp", "--db", str(db)]
        cmd += ["--port", str(port), *extra]
    elif kind == "uvicorn-bare":
        cmd = [PY, str(BENCH / "bare_app.py"), "--port", str(port), "--log-level", "warning"]
    elif kind.startswith("granian-bare"):
        cmd = [PY, str(HERE / "stack.py"), "serve-granian", "--app", "bare", "--port", str(port)]
        cmd += [*GRANIAN_TUNING.get(kind, []), *extra]
    else:
        raise ValueError(kind)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}/mp/v0/discover")
        srv = Srv(kind, proc, port)
        srv.pids = tree_pids(proc.pid)
        yield srv
    finally:
        _stop(proc)
        if stdout is not subprocess.DEVNULL:
            stdout.close()


def _has_access_log_flag() -> bool:
    from monitor_protocol.cli import serve as serve_cmd

    return "access_log" in getattr(serve_cmd, "SETTINGS", {})


def engine_tree() -> dict[str, Any]:
    """Which engine the figures are of: a digest of engine/**/*.py as they are on disk (the tree may have
    uncommitted changes) and the git status of engine/."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted((ROOT / "engine").rglob("*.py")):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", "engine"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    from monitor_protocol.cli import serve as serve_cmd

    return {
        "engine_py_sha256": h.hexdigest()[:16],
        "engine_changed_files": len(status.splitlines()),
        "client_sync_transport": "keepalive (http.client)"
        if (ROOT / "engine/monitor_protocol/client/keepalive.py").exists()
        else "httpx",
        "server_json_codec": "install_fast_json (orjson if installed)"
        if hasattr(serve_cmd, "install_fast_json")
        else "stdlib",
    }


def machine_check(tmp: Path) -> dict[str, Any]:
    """How fast the (shared) machine is right now, as bench/seam.py measures it: the best of 3 runs of 2M
    Python additions, and fsync'd 1-row SQLite commits (WAL, synchronous=FULL) in 1 s."""
    import sqlite3

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        x = 0
        for i in range(2_000_000):
            x += i
        best = min(best, time.perf_counter() - t0)
    path = tmp / f"check-{time.monotonic_ns()}.db"
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0 and n < 1_000_000:
        db.execute("INSERT INTO t (v) VALUES (?)", ("x" * 600,))
        n += 1
    commits = n / (time.perf_counter() - t0)
    db.close()
    return {"python_2M_additions_ms": round(best * 1000, 1), "sqlite_fsync_commits_per_s": round(commits)}


def fill(db: str, n: int) -> str:
    """A fresh database with the bench monitor and ``n`` observations (in-process, group commit of 2,000,
    synchronous=OFF for the fill only, then checkpointed). Returns the owner token."""
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.sqlite import SQLiteStore

    store = SQLiteStore(db, synchronous="OFF")
    try:
        svc = MonitorService(store)
        token = svc.create_monitor({"id": MONITOR, "visibility": "public", "types": TYPES}, None)[
            "owner_token"
        ]
        todo = n
        while todo > 0:
            with store.batch():
                for _ in range(min(2000, todo)):
                    svc.publish(MONITOR, dict(PUB_BODY), token)
                    todo -= 1
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        store.close()
    return token


def subscribe(srv: Srv, name: str, start: Any = "earliest") -> tuple[str, str]:
    body = _enc({"monitor": MONITOR, "subscriber": name, "from": start})
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("POST", "/mp/v0/subscriptions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    j = json.loads(r.read())
    conn.close()
    if r.status != 201:
        raise RuntimeError(f"subscribe: {r.status} {j}")
    return j["subscription"]["id"], j["token"]


def client_run(
    ctx: Ctx, srv: Srv, layer: str, workload: str, token: str | None, sub: str | None = None
) -> dict[str, Any]:
    """One run of one sequential client of ``layer`` in a fresh child process (after a 0.3 s warm-up)."""
    spec = {
        "base": srv.base,
        "layer": layer,
        "workload": workload,
        "token": token,
        "sub": sub,
        "runs": 1,
        "duration": ctx.duration,
        "warmup": 0.3,
        "gap": 0.0,
        "server_pid": srv.proc.pid,
    }
    p = subprocess.run(
        [PY, str(HERE / "stack.py"), "client", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ctx.duration + 60,
    )
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-1500:]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {**out["runs"][0], "first_error": out.get("first_error")}


Job = tuple[str, str, str, Callable[[], dict[str, Any]]]  # (server, client, workload, one run)


def rounds(ctx: Ctx, jobs: list[Job], section: str) -> list[dict[str, Any]]:
    """``ctx.runs`` rounds, each running every job once in turn: the figures compared with each other
    share the same background load, whatever it does meanwhile."""
    runs: list[list[dict[str, Any]]] = [[] for _ in jobs]
    for i in range(ctx.runs):
        log(f"{section}: round {i + 1}/{ctx.runs} of {len(jobs)} figure sets, load {loadavg()}")
        for k, (_server, _client, _workload, job) in enumerate(jobs):
            load = loadavg()
            rec = job()
            rec["load"] = load[0]
            runs[k].append(rec)
    return [
        {"server": server, **figure(client, workload, runs[k])}
        for k, (server, client, workload, _job) in enumerate(jobs)
    ]


def figure(client: str, workload: str, all_runs: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [r for r in all_runs if "error" not in r]
    failed = [r["error"] for r in all_runs if "error" in r]
    per_op = 2 if workload == "pullack" else 1  # HTTP requests per operation
    reqs = [max(1, r["count"] * per_op) for r in runs]
    loads = [r["load"] for r in all_runs if "load" in r]
    return {
        "client": client,
        "workload": workload,
        "requests_per_op": per_op,
        "rate": summary([r["rate"] for r in runs]),
        "client_us_per_request": summary(
            [r["client_cpu"] / q * 1e6 for r, q in zip(runs, reqs, strict=True)]
        ),
        "server_us_per_request": summary(
            [r["server_cpu"] / q * 1e6 for r, q in zip(runs, reqs, strict=True)]
        ),
        "client_cores": summary([r["client_cpu"] / r["elapsed"] for r in runs]),
        "server_cores": summary([r["server_cpu"] / r["elapsed"] for r in runs]),
        "other_cores": summary([r["other_cpu"] / r["elapsed"] for r in runs]),
        "load_1min": summary(loads),
        "errors": sum(r["errors"] for r in runs),
        "empty_pulls": sum(r.get("empty", 0) for r in runs),
        "failed_runs": failed,
        "first_error": next((r["first_error"] for r in runs if r.get("first_error")), None),
        "runs": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in runs],
    }


def raw16_run(srv: Srv, workload: str, token: str | None, duration: float) -> dict[str, Any]:
    """One run of 16 tasks of bench/loadgen.py's raw asyncio client in one process (as common.loadgen
    runs it), plus what the rest of the machine used during the window."""
    start_at = time.time() + 1.0
    spec = {
        "base": srv.base,
        "workload": workload,
        "tasks": 16,
        "duration": duration,
        "client": "raw",
        "start_at": start_at,
        "tokens": [token] * 16,
        "extra": {"monitor": MONITOR},
    }
    child = subprocess.Popen(
        [PY, str(BENCH / "loadgen.py"), json.dumps(spec)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(max(0.0, start_at - time.time()))
    b0, s0 = busy_seconds(), srv.cpu()
    time.sleep(duration)
    s1, b1 = srv.cpu(), busy_seconds()
    out, err = child.communicate(timeout=duration + 60)
    if child.returncode != 0:
        return {"error": f"loadgen failed ({child.returncode}): {err.strip()[-1500:]}"}
    r = json.loads(out.strip().splitlines()[-1])
    # the loadgen's CPU covers its own window (the same one); this process only sleeps meanwhile
    rec = _run_record(r["count"], 0, r["errors"], r["elapsed"], r["cpu"], s1 - s0, b1 - b0)
    rec["first_error"] = r.get("first_error")
    return rec


class Ctx:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.runs = args.runs
        self.duration = args.duration
        self.micro = args.micro
        self.tmp = tmp
        self.b_client = args.b_client
        self.out: Path = args.out
        self.granian_tuning = args.granian_tuning
        self.layers = [x for x in (args.layers.split(",") if args.layers else LAYERS) if x in LAYERS]
        self.dbs = 0
        self.results: dict[str, Any] = {}

    def db(self, name: str) -> str:
        self.dbs += 1
        return str(self.tmp / f"{self.dbs:02d}-{name}.db")


# ======================================================================================= section A
def section_a(ctx: Ctx) -> dict[str, Any]:
    layers = [x for x in ctx.layers if available(x)]
    out: dict[str, Any] = {
        "layers": {k: LAYERS[k][1] for k in ctx.layers},
        "not_installed": [x for x in ctx.layers if x not in layers],
    }
    db = ctx.db("a")
    token = fill(db, PREFILL)
    with serve("uvicorn-mp", db, ctx.tmp) as s, serve("uvicorn-bare", None, ctx.tmp) as b:
        jobs: list[Job] = []
        for layer in layers:
            sub, stok = subscribe(s, f"agent:a-{layer}")
            jobs += [
                ("uvicorn-mp", layer, "publish", partial(client_run, ctx, s, layer, "publish", token)),
                ("uvicorn-mp", layer, "pullack", partial(client_run, ctx, s, layer, "pullack", stok, sub)),
                ("uvicorn-bare", layer, "bare", partial(client_run, ctx, b, layer, "bare", None)),
            ]
        figs = rounds(ctx, jobs, "A")
    for workload in ("publish", "pullack", "bare"):
        out[workload] = [f for f in figs if f["workload"] == workload]
    return out


def fastest_layer(ctx: Ctx) -> str:
    if ctx.b_client != "auto":
        return ctx.b_client
    a = ctx.results.get("A")
    if a is None and ctx.out.exists():
        a = json.loads(ctx.out.read_text()).get("sections", {}).get("A")
    best, rate = "raw-socket", -1.0
    for f in (a or {}).get("publish", []):
        med = (f.get("rate") or {}).get("median")
        if med is not None and med > rate:
            best, rate = f["client"], med
    return best


# ======================================================================================= section B
def section_b(ctx: Ctx) -> dict[str, Any]:
    fast = fastest_layer(ctx)
    tuned = {k: f"bench/bare_app.py on granian, {' '.join(v)}" for k, v in GRANIAN_TUNING.items()}
    servers_doc = {**SERVER_KINDS, **(tuned if ctx.granian_tuning else {})}
    out: dict[str, Any] = {"servers": servers_doc, "client_1": fast, "access_log_lines": {}}
    try:
        import granian

        out["granian"] = granian.__version__
    except ImportError:
        out["granian"] = None
    kinds = list(SERVER_KINDS) + (list(GRANIAN_TUNING) if ctx.granian_tuning else [])
    kinds = [k for k in kinds if out["granian"] is not None or not k.startswith("granian")]
    with contextlib.ExitStack() as es:
        jobs: list[Job] = []
        servers: dict[str, Srv] = {}
        for kind in kinds:
            if "-bare" in kind:
                s = servers[kind] = es.enter_context(serve(kind, None, ctx.tmp))
                jobs.append((kind, fast, "bare", partial(client_run, ctx, s, fast, "bare", None)))
                jobs.append(
                    (kind, "raw-asyncio x16", "bare", partial(raw16_run, s, "bare", None, ctx.duration))
                )
                continue
            db = ctx.db(kind)
            token = fill(db, PREFILL)
            s = servers[kind] = es.enter_context(serve(kind, db, ctx.tmp))
            sub, stok = subscribe(s, f"agent:b-{kind}")
            for layer in dict.fromkeys([fast, "httpx"]):
                jobs.append((kind, layer, "publish", partial(client_run, ctx, s, layer, "publish", token)))
            jobs.append((kind, fast, "pullack", partial(client_run, ctx, s, fast, "pullack", stok, sub)))
            jobs.append(
                (kind, "raw-asyncio x16", "publish", partial(raw16_run, s, "publish", token, ctx.duration))
            )
        out["figures"] = rounds(ctx, jobs, "B")
    for kind, s in servers.items():  # stopped now: their logs are flushed
        access = ctx.tmp / f"access-{s.port}.log"
        if access.exists():
            out["access_log_lines"][kind] = sum(1 for _ in access.open())
    out["checks"] = {}
    for kind in ("uvicorn-mp", "granian-mp"):
        if kind in kinds:
            log(f"B: functional checks on {kind}")
            out["checks"][kind] = run_checks(ctx, kind)
    return out


# -------------------------------------------------------------------------------- functional checks
def _exchange(port: int, data: bytes, wait: float) -> tuple[bytes, float | None]:
    """Send ``data``, read until the server closes or ``wait`` passes: (bytes read, seconds to close)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    t0 = time.monotonic()
    got = b""
    try:
        s.sendall(data)
        while True:
            left = wait - (time.monotonic() - t0)
            if left <= 0:
                return got, None
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return got, None
            except ConnectionResetError:
                return got, time.monotonic() - t0
            if not chunk:
                return got, time.monotonic() - t0
            got += chunk
    finally:
        s.close()


def _status(raw: bytes) -> str:
    if not raw:
        return "no reply"
    head, _, body = raw.partition(b"\r\n\r\n")
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    ctype = next(
        (
            h.split(b":", 1)[1].strip().decode()
            for h in head.split(b"\r\n")[1:]
            if h.lower().startswith(b"content-type:")
        ),
        "-",
    )
    return f"{line} ({ctype}) {body[:90].decode('utf-8', 'replace')!r}"


def _req(
    port: int, method: str, path: str, token: str | None = None, body: Any = None, host: str | None = None
) -> bytes:
    payload = _enc(body) if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nConnection: close\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    head += f"Content-Length: {len(payload)}\r\n\r\n"
    raw, _ = _exchange(port, head.encode() + payload, 10.0)
    return raw


def _parked(port: int) -> str:
    raw = _req(port, "GET", "/metrics")
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("mp_long_polls_parked "):
            return line.split()[1]
    return "?"


def _caught_up(port: int, sub: str, token: str) -> None:
    """Pull and ack what the subscription has (its own 'subscribed' event at least), so the next pull waits."""
    raw = _req(port, "GET", f"/mp/v0/subscriptions/{sub}/pull?limit=200", token)
    body = json.loads(raw.partition(b"\r\n\r\n")[2])
    _req(port, "POST", f"/mp/v0/subscriptions/{sub}/ack", token, {"cursor": body["next"]})


def run_checks(ctx: Ctx, kind: str) -> dict[str, str]:
    """What mp serve promises at the HTTP level, probed on one server (timeouts shortened: headers 1 s,
    body 2 s; granian has no body timeout and takes only the header one)."""
    db = ctx.db(f"checks-{kind}")
    token = fill(db, 10)
    extra = (
        ["--header-timeout", "1", "--body-timeout", "2"]
        if kind == "uvicorn-mp"
        else ["--header-timeout", "1"]
    )
    res: dict[str, str] = {}
    with serve(kind, db, ctx.tmp, extra) as s:
        p = s.port
        res["healthz"] = _status(_req(p, "GET", "/healthz"))
        res["metrics from loopback"] = _status(_req(p, "GET", "/metrics"))[:40]
        res["Host: evil.example refused"] = _status(_req(p, "GET", "/mp/v0/discover", host="evil.example"))
        raw, _ = _exchange(p, b"BREW /mp/v0/discover HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 3.0)
        res["unknown method (BREW)"] = _status(raw)
        raw, _ = _exchange(p, b"GET /mp/v0/discover HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n", 3.0)
        res["malformed header line"] = _status(raw)
        raw, closed = _exchange(p, b"GET /mp/v0/discover HTTP/1.1\r\nHost: 127.0.0.1\r\n", 5.0)
        res["slow headers (header timeout 1 s)"] = (
            f"closed after {closed:.1f} s; {_status(raw)}" if closed is not None else "still open after 5 s"
        )
        head = (
            f"POST /mp/v0/monitors/{MONITOR}/observations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        raw, closed = _exchange(p, head.encode() + b'{"type":"', 6.0)
        res["slow body (body timeout 2 s)"] = (
            f"closed after {closed:.1f} s; {_status(raw)}" if closed is not None else "still open after 6 s"
        )
        big = b'{"type":"com.example.ci.run","data":{"x":"' + b"a" * 1_100_000 + b'"}}'
        head = (
            f"POST /mp/v0/monitors/{MONITOR}/observations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(big)}\r\n\r\n"
        )
        raw, _ = _exchange(p, head.encode() + big, 10.0)
        res["body over --max-body (413)"] = _status(raw)
        sub, stok = subscribe(s, "agent:checks-wait", start="head")
        _caught_up(p, sub, stok)
        t0 = time.monotonic()
        raw = _req(p, "GET", f"/mp/v0/subscriptions/{sub}/pull?wait=2", stok)
        res["empty long poll wait=2"] = f"answered after {time.monotonic() - t0:.2f} s: {_status(raw)[:40]}"
        answered: dict[str, float] = {}

        def waiter() -> None:
            _req(p, "GET", f"/mp/v0/subscriptions/{sub}/pull?wait=10", stok)
            answered["t"] = time.monotonic()

        th = threading.Thread(target=waiter)
        th.start()
        time.sleep(0.3)
        raw = _req(p, "POST", f"/mp/v0/monitors/{MONITOR}/observations", token, PUB_BODY)
        t_pub = time.monotonic()
        th.join(12)
        res["long poll woken by a publish"] = (
            f"{(answered['t'] - t_pub) * 1000:.1f} ms after the publish's reply"
            if "t" in answered
            else "not woken"
        )
        # A client that leaves while parked: the server must see the disconnect and drop the poll.
        _caught_up(p, sub, stok)
        conn = socket.create_connection(("127.0.0.1", p), timeout=5)
        conn.sendall(
            f"GET /mp/v0/subscriptions/{sub}/pull?wait=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {stok}\r\n\r\n".encode()
        )
        time.sleep(0.5)
        before = _parked(p)
        conn.close()
        time.sleep(0.5)
        res["client leaves a parked long poll"] = (
            f"polls parked before the close: {before}, 0.5 s after: {_parked(p)}"
        )
        sub2, stok2 = subscribe(s, "agent:checks-sse", start="earliest")
        head = (
            f"GET /mp/v0/subscriptions/{sub2}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {stok2}\r\nAccept: text/event-stream\r\n\r\n"
        )
        raw, _ = _exchange(p, head.encode(), 1.5)
        events = raw.count(b"event: observation")
        res["SSE stream (1.5 s)"] = f"{_status(raw)[:60]}; {events} observation events"
        # Last: a parked long poll, then SIGTERM (mp serve tells the app before uvicorn's own shutdown).
        sub3, stok3 = subscribe(s, "agent:checks-stop", start="head")
        _caught_up(p, sub3, stok3)
        got: dict[str, Any] = {}

        def parked() -> None:
            try:
                got["raw"] = _req(p, "GET", f"/mp/v0/subscriptions/{sub3}/pull?wait=30", stok3)
            except OSError as exc:
                got["raw"] = repr(exc).encode()
            got["t"] = time.monotonic()

        th = threading.Thread(target=parked)
        th.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(15)
            exited = f"exited after {time.monotonic() - t0:.2f} s"
        except subprocess.TimeoutExpired:
            exited = "still running after 15 s"
        th.join(20)
        reply = (
            f"answered after {got['t'] - t0:.2f} s: {_status(got['raw'])[:30]}" if "t" in got else "no answer"
        )
        res["SIGTERM with a parked long poll"] = f"{exited}; the poll {reply}"
    return res


# ======================================================================================= section C
def _time_op(fn: Callable[[], Any], seconds: float, runs: int) -> dict[str, Any]:
    """µs per call: ``runs`` runs of about ``seconds`` each (the count is calibrated once)."""
    n, t = 1, 0.0
    while t < 0.02:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
    n = max(1, int(n * seconds / t))
    vals = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        vals.append((time.perf_counter() - t0) / n * 1e6)
    return {**summary(vals), "calls_per_run": n}


def _engine(store: Any) -> tuple[Any, Any]:
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.cli.serve import allowed_hosts_for
    from monitor_protocol.core.service import MonitorService

    service = MonitorService(store, clock=time.time)
    router = RestRouter(service, allowed_hosts=allowed_hosts_for("127.0.0.1", []), max_body=1 << 20)
    return service, router


def _call(
    router: Any, method: str, path: str, token: str | None = None, body: Any = None, query: Any = None
) -> Any:
    from monitor_protocol.api.messages import Request

    headers = {"host": "127.0.0.1:8130", "accept": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    raw = b""
    if body is not None:
        headers["content-type"] = "application/json"
        raw = body if isinstance(body, bytes) else _enc(body)
    return router.handle(Request(method, "/mp/v0" + path, list(query or []), headers, raw))


def realistic_replies() -> dict[str, Any]:
    """Real engine replies (memory store): a publish reply and pull replies of 1 and 100 observations."""
    from monitor_protocol.store.memory import MemoryStore

    _, router = _engine(MemoryStore())
    r = _call(router, "POST", "/monitors", body={"id": "ci", "visibility": "public", "types": TYPES})
    token = r.body["owner_token"]
    pub = None
    for i in range(100):
        body = {
            "type": "com.example.ci.run",
            "subject": f"build-{i}",
            "data": {
                "n": i,
                "status": "passed" if i % 7 else "failed",
                "duration_ms": 1234.5 + i,
                "branch": "main",
                "commit": f"{i:040x}",
                "message": "fix: naïve café — ✓ 日本語",
            },
        }
        pub = _call(router, "POST", "/monitors/ci/observations", token, body)
    sub = _call(
        router, "POST", "/subscriptions", body={"monitor": "ci", "subscriber": "agent:c", "from": "earliest"}
    )
    sid, stok = sub.body["subscription"]["id"], sub.body["token"]
    one = _call(router, "GET", f"/subscriptions/{sid}/pull", stok, query=[("limit", "1")])
    hundred = _call(
        router, "GET", f"/subscriptions/{sid}/pull", stok, query=[("cursor", "1"), ("limit", "100")]
    )
    assert len(hundred.body["observations"]) == 100, hundred.body
    return {
        "publish reply": pub.body,
        "pull reply, 1 observation": one.body,
        "pull reply, 100 observations": hundred.body,
    }


def section_c(ctx: Ctx) -> dict[str, Any]:
    from monitor_protocol.core import wire

    out: dict[str, Any] = {"encode": [], "decode": [], "semantics": []}
    codecs_enc: dict[str, Callable[[Any], bytes]] = {
        "json (stdlib, compact, ensure_ascii=False)": _enc,
    }
    codecs_dec: dict[str, Callable[[bytes], Any]] = {
        "json.loads (stdlib)": json.loads,
        "wire.loads (engine: stdlib + hooks + check)": wire.loads,
    }
    versions: dict[str, Any] = {}
    try:
        import orjson

        versions["orjson"] = orjson.__version__
        codecs_enc["orjson.dumps"] = orjson.dumps
        codecs_dec["orjson.loads"] = orjson.loads
        codecs_dec["orjson.loads + wire.check"] = lambda b: wire.check(orjson.loads(b))
    except ImportError:
        orjson = None  # type: ignore[assignment]
    try:
        import msgspec

        versions["msgspec"] = msgspec.__version__
        menc, mdec = msgspec.json.Encoder(), msgspec.json.Decoder()
        codecs_enc["msgspec.json.Encoder().encode"] = menc.encode
        codecs_dec["msgspec.json.Decoder().decode"] = mdec.decode
        codecs_dec["msgspec decode + wire.check"] = lambda b: wire.check(mdec.decode(b))
    except ImportError:
        msgspec = None  # type: ignore[assignment]
    out["versions"] = versions
    replies = realistic_replies()
    for name, value in replies.items():
        ref = _enc(value)
        for codec, fn in codecs_enc.items():
            log(f"C: encode {name} with {codec}")
            b = fn(value)
            out["encode"].append(
                {
                    "payload": name,
                    "codec": codec,
                    "bytes": len(b),
                    "same_bytes_as_stdlib": b == ref,
                    "us": _time_op(lambda fn=fn, value=value: fn(value), ctx.micro, ctx.runs),
                }
            )
    bodies = {
        "publish body (request)": _enc(PUB_BODY),
        "pull reply, 1 observation (client side)": _enc(replies["pull reply, 1 observation"]),
        "pull reply, 100 observations (client side)": _enc(replies["pull reply, 100 observations"]),
    }
    for name, raw in bodies.items():
        for codec, fn in codecs_dec.items():
            if "wire" in codec and "publish" not in name:
                continue  # the engine's strict parse is for what clients send
            log(f"C: decode {name} with {codec}")
            out["decode"].append(
                {
                    "payload": name,
                    "codec": codec,
                    "bytes": len(raw),
                    "us": _time_op(lambda fn=fn, raw=raw: fn(raw), ctx.micro, ctx.runs),
                }
            )
    out["semantics"] = semantics(orjson, msgspec, replies)
    return out


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        v = fn()
    except Exception as exc:
        return f"raises {type(exc).__name__}: {str(exc)[:70]}"
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")[:80]
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def semantics(orjson: Any, msgspec: Any, replies: dict[str, Any]) -> list[dict[str, Any]]:
    from monitor_protocol.core import wire

    strict_str = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

    def strict(value: Any) -> bytes:
        return strict_str(value).encode()

    enc_cases: list[tuple[str, Any]] = [
        ("lone surrogate in a string", {"s": "\ud800"}),
        ("NaN", {"x": float("nan")}),
        ("Infinity", {"x": float("inf")}),
        ("int 2^53+1 (the wire's limit)", {"x": 2**53 + 1}),
        ("int 2^64", {"x": 2**64}),
        ("int -2^63-1", {"x": -(2**63) - 1}),
        ("int key", {1: "a"}),
        ("None key", {None: "a"}),
        ("tuple value", {"t": (1, 2)}),
        ("non-ASCII text", {"s": "é 😀 日本"}),
        ("U+2028 U+2029", {"s": "\u2028\u2029"}),
        ("control chars \\x00 \\x1f \\x7f", {"s": "\x00\x1f\x7f"}),
        ("'</script>' and '/'", {"s": "</script>/"}),
        ("small floats 1e-5 1e-7", [1e-5, 1e-7]),
        ("large floats 1e16 1e22", [1e16, 1e22]),
        ("floats 0.1 -0.0 100.0 5e-324", [0.1, -0.0, 100.0, 5e-324]),
        ("float 1.7976931348623157e308", [1.7976931348623157e308]),
        ("bool subclass of int", {"b": True, "n": None}),
    ]
    for name, value in replies.items():
        enc_cases.append((f"real {name}", value))
    rows = []
    for name, value in enc_cases:
        row: dict[str, Any] = {"kind": "encode", "case": name}
        ref = _outcome(lambda v=value: _enc(v))
        row["json (stdlib compact)"] = ref
        row["engine's strict encoder (allow_nan=False)"] = _outcome(lambda v=value: strict(v))
        for label, fn in (("orjson", orjson and orjson.dumps), ("msgspec", msgspec and msgspec.json.encode)):
            if fn is None:
                continue
            got = _outcome(lambda v=value, fn=fn: fn(v))
            try:
                same = fn(value) == _enc(value)
            except Exception:
                same = None
            row[label] = got
            row[f"{label} bytes == stdlib"] = same
        rows.append(row)
    dec_cases: list[tuple[str, bytes]] = [
        ("escaped lone surrogate \\ud800", b'{"s":"\\ud800"}'),
        ("raw surrogate bytes ED A0 80", b'{"s":"\xed\xa0\x80"}'),
        ("invalid UTF-8 FF", b'{"s":"\xff"}'),
        ("NaN", b'{"x":NaN}'),
        ("Infinity", b'{"x":Infinity}'),
        ("1e400 (overflows a double)", b'{"x":1e400}'),
        ("2^53+1", b'{"x":9007199254740993}'),
        ("2^64", b'{"x":18446744073709551616}'),
        ("-2^63-1", b'{"x":-9223372036854775809}'),
        ("duplicate keys", b'{"a":1,"a":2}'),
        ("-0", b'{"x":-0}'),
        ("nesting 40 (wire limit 32)", b"[" * 40 + b"]" * 40),
        ("nesting 2000", b"[" * 2000 + b"]" * 2000),
        ("trailing garbage", b'{"a":1} x'),
        ("UTF-8 BOM", b'\xef\xbb\xbf{"a":1}'),
        ("escaped \\u0000", b'{"s":"\\u0000"}'),
    ]
    for name, raw in dec_cases:
        row = {"kind": "decode", "case": name}
        row["json.loads (stdlib)"] = _outcome(lambda r=raw: json.loads(r))
        row["wire.loads (engine)"] = _outcome(lambda r=raw: wire.loads(r))
        if orjson is not None:
            row["orjson"] = _outcome(lambda r=raw: orjson.loads(r))
            row["orjson + wire.check"] = _outcome(lambda r=raw: wire.check(orjson.loads(r)))
        if msgspec is not None:
            row["msgspec"] = _outcome(lambda r=raw: msgspec.json.decode(r))
            row["msgspec + wire.check"] = _outcome(lambda r=raw: wire.check(msgspec.json.decode(r)))
        rows.append(row)
    return rows


# ======================================================================================= section D
def _engine_loop(
    op: Callable[[], int], seconds: float, batch: Any = None, group: int = 1
) -> dict[str, float]:
    count = 0
    c0, t0 = time.process_time(), time.perf_counter()
    deadline = t0 + seconds
    done = False
    while not done and time.perf_counter() < deadline and count < MAX_OPS:
        with batch() if batch is not None else contextlib.nullcontext():
            for _ in range(group):
                if op() == 0:
                    done = True  # the subscription is drained
                    break
                count += 1
    c1, t1 = time.process_time(), time.perf_counter()
    return {
        "count": count,
        "cpu_us": (c1 - c0) / max(1, count) * 1e6,
        "wall_us": (t1 - t0) / max(1, count) * 1e6,
    }


def section_d(ctx: Ctx) -> dict[str, Any]:
    from monitor_protocol.cli import serve as serve_cmd
    from monitor_protocol.core import wire

    out: dict[str, Any] = {"figures": []}
    install = getattr(serve_cmd, "install_fast_json", None)
    codecs: list[tuple[str, Callable[[], Any]]] = [("stdlib json", lambda: None)]  # an older tree: no slot
    if hasattr(wire, "STDLIB_CODEC"):
        codecs = [("stdlib json", lambda: wire.use_codec(wire.STDLIB_CODEC))]
        if install is not None:
            codecs.append(("mp serve's codec", install))
    for codec_name, use in codecs:
        label = use() or codec_name
        for store_kind in ("sqlite FULL", "memory"):
            log(f"D: RestRouter.handle on the {store_kind} store, codec {label}")
            for f in engine_figures(ctx, store_kind):
                out["figures"].append({**f, "codec": label})
    log("D: cProfile of RestRouter.handle, publish, SQLite FULL, one commit per call")
    out["cprofile_publish"] = cprofile_publish(ctx)  # with mp serve's codec, the last one installed
    if hasattr(wire, "STDLIB_CODEC"):
        wire.use_codec(wire.STDLIB_CODEC)
    log("D: py-spy of mp serve under a 1-client publish load")
    out["pyspy"] = {
        "non-idle threads (wall: the fsync wait counts)": pyspy_profile(ctx, gil=False),
        "GIL holder only (Python CPU)": pyspy_profile(ctx, gil=True),
    }
    return out


class EngineOps:
    """Publish and pull(limit 1)+ack through RestRouter.handle, as the HTTP door calls it."""

    def __init__(self, router: Any) -> None:
        self.router = router
        made = _call(
            router, "POST", "/monitors", body={"id": MONITOR, "visibility": "public", "types": TYPES}
        )
        self.token = made.body["owner_token"]
        self.body = _enc(PUB_BODY)
        self.path = f"/monitors/{MONITOR}/observations"
        self.sid = self.stok = ""
        self.subs = 0

    def publish(self) -> int:
        return 1 if _call(self.router, "POST", self.path, self.token, self.body).status == 201 else -1

    def fresh_subscription(self) -> None:
        self.subs += 1
        body = {"monitor": MONITOR, "subscriber": f"agent:d-{self.subs}", "from": "earliest"}
        sub = _call(self.router, "POST", "/subscriptions", body=body)
        self.sid, self.stok = sub.body["subscription"]["id"], sub.body["token"]

    def pullack(self) -> int:
        p = _call(self.router, "GET", f"/subscriptions/{self.sid}/pull", self.stok, query=[("limit", "1")])
        if not p.body["observations"]:
            return 0
        a = _call(
            self.router, "POST", f"/subscriptions/{self.sid}/ack", self.stok, {"cursor": p.body["next"]}
        )
        return 1 if a.status == 200 else -1


def engine_figures(ctx: Ctx, store_kind: str) -> list[dict[str, Any]]:
    from monitor_protocol.store.memory import MemoryStore
    from monitor_protocol.store.sqlite import SQLiteStore

    store = SQLiteStore(ctx.db("d"), synchronous="FULL") if store_kind != "memory" else MemoryStore()
    _, router = _engine(store)
    ops = EngineOps(router)
    batch = getattr(store, "batch", None)
    for _ in range(200):  # warm up
        ops.publish()
    modes: list[tuple[str, Any, int]] = [("one commit per call", None, 1)]
    if store_kind != "memory":
        modes.append(("64 calls per group commit", batch, 64))
    figs, most = [], 0
    for label, grouped, group in modes:
        runs = [_engine_loop(ops.publish, ctx.micro, grouped, group) for _ in range(ctx.runs)]
        most = max(most, *(r["count"] for r in runs))
        figs.append(_dfig(store_kind, "publish", label, runs))
    with batch() if batch is not None else contextlib.nullcontext():
        for _ in range(int(most * 1.2) + 500):  # a backlog no pull run can drain
            ops.publish()
    for label, grouped, group in modes:
        runs = []
        for _ in range(ctx.runs):
            ops.fresh_subscription()
            runs.append(_engine_loop(ops.pullack, ctx.micro, grouped, group))
        figs.append(_dfig(store_kind, "pull(limit 1)+ack", label, runs))
    close = getattr(store, "close", None)
    if close is not None:
        close()
    return figs


def _dfig(store: str, op: str, mode: str, runs: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "store": store,
        "op": op,
        "mode": mode,
        "cpu_us": summary([r["cpu_us"] for r in runs]),
        "wall_us": summary([r["wall_us"] for r in runs]),
        "ops": [r["count"] for r in runs],
        "load": loadavg(),
    }


def cprofile_publish(ctx: Ctx, n: int = 3000) -> dict[str, Any]:
    import cProfile
    import pstats

    from monitor_protocol.store.sqlite import SQLiteStore

    store = SQLiteStore(ctx.db("prof"), synchronous="FULL")
    _, router = _engine(store)
    token = _call(
        router, "POST", "/monitors", body={"id": MONITOR, "visibility": "public", "types": TYPES}
    ).body["owner_token"]
    body = _enc(PUB_BODY)
    for _ in range(200):
        _call(router, "POST", f"/monitors/{MONITOR}/observations", token, body)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        _call(router, "POST", f"/monitors/{MONITOR}/observations", token, body)
    prof.disable()
    store.close()
    st = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{fn} ({_short(file)}:{line})",
                "calls_per_op": nc / n,
                "tottime_us": tt / n * 1e6,
                "cumtime_us": ct / n * 1e6,
            }
        )
    total = sum(r["tottime_us"] for r in rows)
    rows.sort(key=lambda r: -r["tottime_us"])
    return {"publishes": n, "total_us_per_publish": total, "top_tottime": rows[:15]}


def _short(file: str) -> str:
    for mark in ("monitor_protocol/", "site-packages/", "lib/python3.11/"):
        if mark in file:
            return file.split(mark, 1)[1] if mark != "monitor_protocol/" else "mp/" + file.split(mark, 1)[1]
    return file


PLUMBING = ("threading.py", "runpy.py", "asyncio/runners.py", "asyncio/base_events.py", "uvicorn/server.py")
PLUMBING += ("uvicorn/main.py", "uvicorn/_compat.py", "mp/cli.py", "mp/cli/serve.py", "mp/__main__.py")
PLUMBING += ("<string>", "<frozen runpy>")


def pyspy_profile(ctx: Ctx, gil: bool, seconds: float = 4.0) -> dict[str, Any]:
    spy = Path(PY).parent / "py-spy"
    if not spy.exists():
        return {"error": "py-spy not installed"}
    fast = fastest_layer(ctx)
    db = ctx.db("pyspy")
    token = fill(db, 1000)
    raw = ctx.tmp / "pyspy.txt"
    with serve("uvicorn-mp", db, ctx.tmp) as s:
        spec = {
            "base": s.base,
            "layer": fast,
            "workload": "publish",
            "token": token,
            "runs": 1,
            "duration": seconds + 1.5,
            "warmup": 0.3,
            "gap": 0.0,
            "server_pid": s.proc.pid,
        }
        load0 = loadavg()
        client = subprocess.Popen(
            [PY, str(HERE / "stack.py"), "client", json.dumps(spec)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.8)
        cmd = [str(spy), "record", "--pid", str(s.proc.pid), "--rate", "250", "--duration", str(int(seconds))]
        cmd += ["--format", "raw", "--function", "--threads", "--nonblocking", "-o", str(raw)]
        cmd += ["--gil"] if gil else []
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
        cout, _ = client.communicate(timeout=seconds + 30)
    if p.returncode != 0 or not raw.exists():
        return {"error": (p.stderr or p.stdout)[-800:]}
    crun = json.loads(cout.strip().splitlines()[-1])["runs"][0]
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        k = int(n)
        frames = stack.split(";")
        thread = frames[0].split(":", 1)[-1].strip() if frames[0].startswith("thread") else "?"
        names = [_frame(f) for f in frames[1:]]
        total += k
        threads[thread] = threads.get(thread, 0) + k
        if names:
            own[names[-1]] = own.get(names[-1], 0) + k
        for name in set(names):
            if not name.rstrip(")").endswith(PLUMBING) and not name.startswith("<module>"):
                incl[name] = incl.get(name, 0) + k

    def top(d: dict[str, int]) -> list[dict[str, Any]]:
        return [
            {"function": f, "samples": c, "share": c / total}
            for f, c in sorted(d.items(), key=lambda x: -x[1])[:15]
        ]

    return {
        "client": fast,
        "publishes_per_s_while_sampled": crun["rate"],
        "server_cores": crun["server_cpu"] / crun["elapsed"],
        "samples": total,
        "rate_hz": 250,
        "load": [load0, loadavg()],
        "threads": {t: c / total for t, c in sorted(threads.items(), key=lambda x: -x[1])},
        "top_own": top(own),
        "top_inclusive": top(incl),
    }


def _frame(f: str) -> str:
    name, _, where = f.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({_short(file)})"


# ======================================================================================= granian launcher
def granian_mp_app() -> Any:
    """The MonitorApp as `mp serve` builds it (cli/serve.py run(): the JSON codec it installs, the
    store, service, router and app with their defaults), minus the SIGHUP reloader."""
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.cli import serve as serve_cmd
    from monitor_protocol.cli.serve import allowed_hosts_for
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.doors.http.app import create_app
    from monitor_protocol.doors.push import delivery_task
    from monitor_protocol.store.sqlite import SQLiteStore

    install = getattr(serve_cmd, "install_fast_json", None)  # newer trees: orjson for replies and rows
    if install is not None:
        install()
    max_body = 1 << 20
    store = SQLiteStore(os.path.abspath(os.environ["MP_STACK_DB"]))
    service = MonitorService(store, clock=time.time)
    router = RestRouter(service, allowed_hosts=allowed_hosts_for("127.0.0.1", []), max_body=max_body)
    return create_app(service, router, store=store, max_body=max_body, background_tasks=[delivery_task])


def granian_bare_app() -> Any:
    from bare_app import app

    return app


def serve_granian(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="stack.py serve-granian")
    ap.add_argument("--app", choices=("mp", "bare"), default="mp")
    ap.add_argument("--db")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--header-timeout", type=float, default=10.0)
    ap.add_argument("--access-log", action="store_true")
    ap.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    ap.add_argument("--task-impl", default="asyncio", choices=("asyncio", "rust"))
    ap.add_argument("--runtime-mode", default="st", choices=("st", "mt"))
    args = ap.parse_args(argv)
    from granian.constants import HTTPModes, Interfaces, Loops, RuntimeModes, TaskImpl
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server import Server

    if args.app == "mp":
        os.environ["MP_STACK_DB"] = args.db
    server = Server(
        f"stack:granian_{args.app}_app",
        address="127.0.0.1",
        port=args.port,
        interface=Interfaces.ASGI,
        workers=1,
        loop=Loops(args.loop),
        task_impl=TaskImpl(args.task_impl),
        runtime_mode=RuntimeModes(args.runtime_mode),
        http=HTTPModes.http1,
        websockets=False,
        backlog=2048,
        http1_settings=HTTP1Settings(header_read_timeout=int(args.header_timeout * 1000)),
        log_level=LogLevels.warning,
        log_access=args.access_log,
        factory=True,
        working_dir=HERE,
    )
    server.serve()


# ======================================================================================= report
def fmt(x: Any, nd: int = 0) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def _rate(f: dict[str, Any]) -> str:
    r = f.get("rate") or {}
    return f"{fmt(r.get('median'))} | {fmt(r.get('min'))} | {fmt(r.get('max'))}"


def _other(f: dict[str, Any]) -> str:
    return fmt((f.get("other_cores") or {}).get("median"), 2)


def _load(f: dict[str, Any]) -> str:
    x = f.get("load_1min") or {}
    if x.get("median") is None:
        return ""
    return f"{x['median']:.2f} ({x['min']:.2f}-{x['max']:.2f})"


def markdown(res: dict[str, Any]) -> str:
    out: list[str] = []
    m = res.get("machine", {})
    out.append(
        f"Machine: {m.get('nproc')} x {m.get('cpu_model')}, Python {m.get('python')}, SQLite {m.get('sqlite')}, "
        f"uvicorn {m.get('uvicorn')}, httpx {m.get('httpx')}; {m.get('date')}, commit {str(m.get('commit'))[:10]}"
        f"{' (engine/ has uncommitted changes)' if m.get('engine_dirty') else ''}. "
        f"Runs: {res.get('runs')} x {res.get('duration')} s. Load average at start: {res.get('load_start')}."
    )
    a0, a1 = res.get("machine_check_start"), res.get("machine_check_end")
    if a0:
        out.append(
            f"Machine check (start / end): 2M Python additions {a0['python_2M_additions_ms']} / "
            f"{(a1 or {}).get('python_2M_additions_ms')} ms; fsync'd SQLite commits/s "
            f"{a0['sqlite_fsync_commits_per_s']:,} / {(a1 or {}).get('sqlite_fsync_commits_per_s', 0):,}."
        )
    s = res.get("sections", {})
    a = s.get("A")
    if a:
        titles = {
            "publish": "A1. publish, 1 sequential client, against mp serve [requests/s]",
            "pullack": "A2. pull(limit 1)+ack, 1 sequential client, against mp serve [round trips/s; 2 requests each]",
            "bare": "A3. the same POST against bench/bare_app.py on mp serve's uvicorn config (transport limit) [requests/s]",
        }
        for key, title in titles.items():
            out += ["", f"**{title}**", ""]
            out.append(
                "| client layer | median | min | max | client µs CPU/request | server µs CPU/request | client cores | server cores | other procs cores | load 1-min |"
            )
            out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            for f in a[key]:
                if "error" in f and "rate" not in f:
                    out.append(
                        f"| {f.get('client', f.get('layer'))} | not measured: {f['error'][:80]} |||||||"
                    )
                    continue
                out.append(
                    f"| {f['client']} | {_rate(f)} | {fmt(f['client_us_per_request']['median'])} | "
                    f"{fmt(f['server_us_per_request']['median'])} | {fmt(f['client_cores']['median'], 2)} | "
                    f"{fmt(f['server_cores']['median'], 2)} | {_other(f)} | {_load(f)} |"
                    + (f" errors {f['errors']}" if f.get("errors") else "")
                )
    b = s.get("B")
    if b:
        out += [
            "",
            f"**B. servers** (granian {b.get('granian')}; 1-client figures with `{b.get('client_1')}` and httpx)",
            "",
        ]
        out.append(
            "| server | workload | client | median | min | max | server µs CPU/request | server cores | client cores | other procs cores | load 1-min |"
        )
        out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for f in b["figures"]:
            if "rate" not in f:
                out.append(
                    f"| {f['server']} | {f.get('workload')} | error: {str(f.get('error'))[:80]} |||||||"
                )
                continue
            unit = "rt/s" if f["workload"] == "pullack" else "req/s"
            out.append(
                f"| {f['server']} | {f['workload']} [{unit}] | {f['client']} | {_rate(f)} | "
                f"{fmt(f['server_us_per_request']['median'])} | {fmt(f['server_cores']['median'], 2)} | "
                f"{fmt(f['client_cores']['median'], 2)} | {_other(f)} | {_load(f)} |"
                + (f" errors {f['errors']}" if f.get("errors") else "")
            )
        if b.get("access_log_lines"):
            out.append("")
            out.append(f"Access log lines written: {b['access_log_lines']}")
        checks = b.get("checks") or {}
        if checks:
            kinds = list(checks)
            out += ["", "**B. functional checks** (header timeout 1 s, body timeout 2 s where settable)", ""]
            out.append("| check | " + " | ".join(kinds) + " |")
            out.append("|---|" + "---|" * len(kinds))
            for name in checks[kinds[0]]:
                cells = [str(checks[k].get(name, "")).replace("|", "/").replace("\n", " ") for k in kinds]
                out.append(f"| {name} | " + " | ".join(cells) + " |")
    c = s.get("C")
    if c:
        out += [
            "",
            f"**C1. JSON encode** ({c.get('versions')}; µs per op, median of {res.get('runs')} runs)",
            "",
        ]
        out.append("| payload | codec | µs median | min | max | bytes | bytes == stdlib |")
        out.append("|---|---|---:|---:|---:|---:|---|")
        for f in c["encode"]:
            u = f["us"]
            out.append(
                f"| {f['payload']} | {f['codec']} | {fmt(u['median'], 2)} | {fmt(u['min'], 2)} | {fmt(u['max'], 2)} | "
                f"{f['bytes']:,} | {f['same_bytes_as_stdlib']} |"
            )
        out += ["", "**C2. JSON decode** (µs per op)", ""]
        out.append("| payload | codec | µs median | min | max | bytes |")
        out.append("|---|---|---:|---:|---:|---:|")
        for f in c["decode"]:
            u = f["us"]
            out.append(
                f"| {f['payload']} | {f['codec']} | {fmt(u['median'], 2)} | {fmt(u['min'], 2)} | {fmt(u['max'], 2)} | {f['bytes']:,} |"
            )
        for kind in ("encode", "decode"):
            rows = [r for r in c["semantics"] if r["kind"] == kind]
            if not rows:
                continue
            cols = [k for k in rows[0] if k not in ("kind", "case")]
            out += ["", f"**C3. semantics, {kind}**", ""]
            out.append("| case | " + " | ".join(cols) + " |")
            out.append("|---|" + "---|" * len(cols))
            for r in rows:
                cells = [str(r.get(k, "")).replace("|", "/").replace("\n", "\\n") for k in cols]
                out.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    d = s.get("D")
    if d:
        out += ["", "**D1. engine in-process, RestRouter.handle without HTTP** (µs per operation)", ""]
        out.append(
            "| codec | store | operation | mode | CPU µs median | min | max | wall µs median | load 1-min |"
        )
        out.append("|---|---|---|---|---:|---:|---:|---:|---|")
        for f in d["figures"]:
            cu, wu = f["cpu_us"], f["wall_us"]
            out.append(
                f"| {f.get('codec', '')} | {f['store']} | {f['op']} | {f['mode']} | {fmt(cu['median'], 1)} | "
                f"{fmt(cu['min'], 1)} | "
                f"{fmt(cu['max'], 1)} | {fmt(wu['median'], 1)} | {f['load'][0]:.2f} |"
            )
        cp = d.get("cprofile_publish")
        if cp:
            out += [
                "",
                f"**D2. cProfile, RestRouter.handle publish on SQLite FULL** (total {cp['total_us_per_publish']:.0f} µs/publish under the profiler)",
                "",
            ]
            out.append("| function | calls/publish | own µs/publish | cumulative µs/publish |")
            out.append("|---|---:|---:|---:|")
            for r in cp["top_tottime"]:
                out.append(
                    f"| {r['function']} | {r['calls_per_op']:.1f} | {r['tottime_us']:.1f} | {r['cumtime_us']:.1f} |"
                )
        for mode, ps in (d.get("pyspy") or {}).items():
            if "error" in ps:
                out.append(f"\npy-spy ({mode}): {ps['error']}")
                continue
            out += [
                "",
                f"**D3. py-spy of mp serve, {mode}: 1 client ({ps['client']}) publishing at "
                f"{ps['publishes_per_s_while_sampled']:,.0f}/s, server {ps['server_cores']:.2f} cores; "
                f"{ps['samples']} samples at {ps['rate_hz']} Hz**",
                "",
                "Threads: " + ", ".join(f"{t} {v:.0%}" for t, v in ps["threads"].items()),
                "",
                "| # | own (leaf) | share | inclusive (plumbing frames left out) | share |",
                "|---:|---|---:|---|---:|",
            ]
            for i, (o, n) in enumerate(zip(ps["top_own"], ps["top_inclusive"], strict=False), 1):
                out.append(
                    f"| {i} | {o['function']} | {o['share']:.1%} | {n['function']} | {n['share']:.1%} |"
                )
    return "\n".join(out)


# ======================================================================================= main
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client_main(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "serve-granian":
        serve_granian(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="A,B,C,D", help="sections, e.g. A,C")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per HTTP run")
    ap.add_argument("--micro", type=float, default=0.3, help="seconds per in-process run (C and D)")
    ap.add_argument("--layers", default="", help="client layers for A (comma-separated; default all)")
    ap.add_argument("--b-client", default="auto", help="1-client layer for B and D (default: A's fastest)")
    ap.add_argument(
        "--granian-tuning", action="store_true", help="B: also the bare app on granian's other settings"
    )
    ap.add_argument("--markdown", action="store_true", help="print stack.json as tables and exit")
    ap.add_argument(
        "--out", type=Path, default=OUT, help=f"the result file (default {OUT.relative_to(ROOT)})"
    )
    args = ap.parse_args()
    out: Path = args.out
    if args.markdown:
        print(markdown(json.loads(out.read_text())))
        return
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    log(f"uptime: {uptime}")
    prev = json.loads(out.read_text()) if out.exists() else {}
    res: dict[str, Any] = {
        "machine": {**machine(), **engine_tree()},
        "runs": args.runs,
        "duration": args.duration,
        "micro": args.micro,
        "uptime_start": uptime,
        "load_start": loadavg(),
        "sections": dict(prev.get("sections", {})),
    }
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mp-stack-") as tmp:
        res["machine_check_start"] = machine_check(Path(tmp))
        ctx = Ctx(args, Path(tmp))
        for name, fn in (("A", section_a), ("B", section_b), ("C", section_c), ("D", section_d)):
            if name in args.only.upper().split(","):
                log(f"section {name}")
                ctx.results[name] = fn(ctx)
                res["sections"][name] = {
                    **ctx.results[name],
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(res, indent=1, ensure_ascii=False))
        res["machine_check_end"] = machine_check(Path(tmp))
    res["seconds"] = round(time.monotonic() - t0, 1)
    res["load_end"] = loadavg()
    res["engine_tree_end"] = engine_tree()  # differs from machine's when engine/ changed during the run
    out.write_text(json.dumps(res, indent=1, ensure_ascii=False))
    print(markdown(res))


if __name__ == "__main__":
    main()
