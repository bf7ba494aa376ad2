"""The client's own cost: CPU of the calling process per keep-alive publish against a local `mp serve`, for
`Client` (sync), `AsyncClient` on asyncio's own event loop and on uvloop, beside two floors measured the same
way in the same run: a raw blocking socket sending prebuilt request bytes and reading the reply (what any sync
client pays here: the two syscalls and the wake-up), and a raw asyncio protocol doing the same on each event
loop (what any client on that loop pays). ``python build.py bench --client [--quick] [--runs N]``.

Every figure is the client process's CPU time (user + system, `time.process_time`) over N requests after a
warm-up, the median of ``--runs`` interleaved rounds (min and max beside it), with the load average. The
server's CPU is not in it: it is another process. Issue 23's target: <= 60 µs per request for `Client` and
`AsyncClient`. Results: bench/results/client.json; ``--client --markdown`` prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from common import machine, mp_serve, report  # noqa: E402
from monitor_protocol.client import AsyncClient, Client  # noqa: E402

TARGET_US = 60.0
MONITOR = "client-bench"
TYPE = "com.example.ci.run"
FIELDS: dict[str, Any] = {"subject": "build-412", "actor": "probe:ci", "data": {"status": "failed"}}
BODY = json.dumps({"type": TYPE, **FIELDS}, separators=(",", ":")).encode()
MODES = (
    "raw socket (floor)",
    "Client",
    "raw asyncio (floor)",
    "AsyncClient (asyncio)",
    "raw uvloop (floor)",
    "AsyncClient (uvloop)",
)
# each client beside the floor measured on its own kind of I/O
FLOORS = {
    "Client": "raw socket (floor)",
    "AsyncClient (asyncio)": "raw asyncio (floor)",
    "AsyncClient (uvloop)": "raw uvloop (floor)",
}


def _new_loop(kind: str) -> asyncio.AbstractEventLoop | None:
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            return None
        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    return asyncio.new_event_loop()


def cpu_us(run: Callable[[int], None], n: int, warm: int) -> float:
    run(warm)
    t0 = time.process_time_ns()
    run(n)
    return (time.process_time_ns() - t0) / n / 1000


class _Reply(asyncio.Protocol):
    """The asyncio floor: one reply read as its bytes come, one future per request."""

    def __init__(self) -> None:
        self.buf = b""
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        at = self.buf.find(b"content-length: ", 0, end)
        length = int(self.buf[at + 16 : self.buf.index(b"\r\n", at)]) if at >= 0 else 0
        if len(self.buf) >= end + 4 + length:
            status = self.buf[9:12]
            self.buf = self.buf[end + 4 + length :]
            if status != b"201":  # a refused publish costs less: the floor must be the same work
                self.waiter.set_exception(RuntimeError(f"the floor's publish got HTTP {status!r}"))
            else:
                self.waiter.set_result(None)


def measure(port: int, token: str, n: int, warm: int) -> dict[str, float | None]:
    base = f"http://127.0.0.1:{port}"
    request = (
        f"POST /mp/v0/monitors/{MONITOR}/observations HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"accept: application/json\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    out: dict[str, float | None] = {}

    # the sync floor: prebuilt bytes on a blocking socket, the reply read by its content-length
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def raw(k: int) -> None:
        for _ in range(k):
            sock.sendall(request)
            buf = sock.recv(65536)
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            end = buf.index(b"\r\n\r\n")
            at = buf.find(b"content-length: ", 0, end)
            length = int(buf[at + 16 : buf.index(b"\r\n", at)])
            while len(buf) < end + 4 + length:
                buf += sock.recv(65536)
            if buf[9:12] != b"201":  # a refused publish costs less: the floor must be the same work
                raise RuntimeError(f"the floor's publish got HTTP {buf[9:12]!r}")

    out["raw socket (floor)"] = cpu_us(raw, n, warm)
    sock.close()

    with Client(base, token=token) as client:

        def sync(k: int) -> None:
            for _ in range(k):
                client.publish(MONITOR, TYPE, **FIELDS)

        out["Client"] = cpu_us(sync, n, warm)

    def on_loop(kind: str, make: Callable[[], Any]) -> float | None:
        loop = _new_loop(kind)
        if loop is None:
            return None
        try:
            return loop.run_until_complete(make())
        finally:
            loop.close()

    async def raw_async() -> float:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_connection(_Reply, "127.0.0.1", port)

        async def go(k: int) -> None:
            for _ in range(k):
                proto.waiter = loop.create_future()
                transport.write(request)
                await proto.waiter

        await go(warm)
        t0 = time.process_time_ns()
        await go(n)
        transport.close()
        return (time.process_time_ns() - t0) / n / 1000

    async def client_async() -> float:
        async with AsyncClient(base, token=token) as client:

            async def go(k: int) -> None:
                for _ in range(k):
                    await client.publish(MONITOR, TYPE, **FIELDS)

            await go(warm)
            t0 = time.process_time_ns()
            await go(n)
            return (time.process_time_ns() - t0) / n / 1000

    out["raw asyncio (floor)"] = on_loop("asyncio", raw_async)
    out["AsyncClient (asyncio)"] = on_loop("asyncio", client_async)
    out["raw uvloop (floor)"] = on_loop("uvloop", raw_async)
    out["AsyncClient (uvloop)"] = on_loop("uvloop", client_async)
    return out


def run(n: int, rounds: int) -> dict[str, Any]:
    per_mode: dict[str, list[float]] = {m: [] for m in MODES}
    loads: list[float] = []
    load_before = round(os.getloadavg()[0], 2)
    with (
        tempfile.TemporaryDirectory(prefix="mp-client-") as tmp,
        mp_serve(os.path.join(tmp, "c.db")) as server,
    ):
        with Client(f"http://127.0.0.1:{server.port}") as admin:
            token = admin.create_monitor(MONITOR, types=[TYPE]).owner_token
        for rnd in range(rounds):
            got = measure(server.port, token, n, warm=max(50, n // 20))
            loads.append(round(os.getloadavg()[0], 2))
            for mode, value in got.items():
                if value is not None:
                    per_mode[mode].append(round(value, 1))
            print(
                f"round {rnd}: " + ", ".join(f"{m} {v:.1f}" for m, v in got.items() if v is not None),
                flush=True,
            )
    figures = {
        mode: {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
        for mode, xs in per_mode.items()
        if xs
    }
    return {
        "n": n,
        "rounds": rounds,
        "us_per_request": figures,
        "target_us": TARGET_US,
        "loads": loads,
        "load_before": load_before,
        "load_after": round(os.getloadavg()[0], 2),
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"Machine: {m['nproc']} x {m['cpu_model']}, Python {m['python']}; date {m['date']}, commit {m['commit']}; "
        f"load average {result['load_before']} before, {result['load_after']} after (per round: "
        f"{', '.join(str(x) for x in result['loads'])}).",
        "",
        f"| client CPU per keep-alive publish, {result['n']:,} requests | µs (median) | min-max | vs its floor |",
        "|---|---:|---:|---:|",
    ]
    figs = result["us_per_request"]
    for mode, fig in figs.items():
        floor = FLOORS.get(mode)
        ratio = f"{fig['median'] / figs[floor]['median']:.2f}x" if floor in figs else ""
        lines.append(f"| {mode} | {fig['median']:.1f} | {fig['min']:.1f}-{fig['max']:.1f} | {ratio} |")
    lines.append("")
    lines.append(
        f"Target (issue 23): `Client` and `AsyncClient` <= {result['target_us']:.0f} µs per request."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000, help="requests per figure (default 3,000)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="500 requests, 2 rounds")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results")
    args = ap.parse_args(argv)
    n, rounds = (500, 2) if args.quick else (args.n, args.runs)
    return report(args, "client", lambda: {"machine": machine(), **run(n, rounds)}, markdown)


if __name__ == "__main__":
    sys.exit(main())
