"""The floor of the long-poll wake benchmark (bench/seam.py longpoll): servers that do no protocol work.

Both answer what the long-poll client of bench/seam.py sends, and nothing else: `GET .../pull` parks until
a `POST .../observations` arrives, which answers 201 and then wakes every parked pull with one fixed reply
of the size mp serve sends (one observation); an ack or a discover gets `{}`; `/metrics` reports the
`mp_long_polls_parked` gauge the client waits for. No engine, no SQLite, no fsync.

  --server uvicorn   an ASGI app on uvicorn with mp serve's settings (httptools, uvloop when installed):
                     what the HTTP stack alone costs for N replies
  --server raw       an asyncio Protocol that writes pre-encoded replies from one loop turn: what the
                     client process costs to receive N replies (the harness's own floor)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from typing import Any

PULL_REPLY = json.dumps(
    {
        "subscription": "sub_floor",
        "monitor": "seam",
        "cursor": 1_000,
        "head": 1_000,
        "lag": 0,
        "retention_floor": 1,
        "next": 1_001,
        "redelivered": 0,
        "observations": [
            {
                "specversion": "1.0",
                "id": "1000",
                "source": "mp://127.0.0.1/monitors/seam",
                "type": "com.example.bench.tick",
                "subject": "s-1",
                "time": "2026-12-01T00:00:00.000000Z",
                "datacontenttype": "application/json",
                "data": {"n": 1},
                "mpseq": 1000,
                "mpactor": "probe:bench",
                "mptier": "machine",
                "mporigin": "unattested_origin",
                "mpverification": "none",
            }
        ],
    },
    separators=(",", ":"),
).encode()
PUBLISH_REPLY = b'{"seq":1000,"observation":{"id":"1000"}}'


class Parked:
    """Who is waiting for the next publish (a future per ASGI request, or a transport)."""

    def __init__(self) -> None:
        self.waiting: list[Any] = []


PARKED = Parked()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            break
    path: str = scope["path"]
    status, body, kind = 200, b"{}", b"application/json"
    if path == "/metrics":
        body, kind = f"mp_long_polls_parked {len(PARKED.waiting)}\n".encode(), b"text/plain"
    elif path.endswith("/pull"):
        future = asyncio.get_running_loop().create_future()
        PARKED.waiting.append(future)
        await future
        body = PULL_REPLY
    elif path.endswith("/observations"):
        status, body = 201, PUBLISH_REPLY
        woken, PARKED.waiting = PARKED.waiting, []
        for future in woken:
            if not future.done():
                future.set_result(None)
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _reply(status: int, body: bytes, kind: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (status, b"Created" if status == 201 else b"OK", kind, len(body)) + body


class RawProtocol(asyncio.Protocol):
    """HTTP/1.1 just far enough for the bench client: request line, content-length, keep-alive."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            path = head.split(b" ", 2)[1].split(b"?", 1)[0]
            if path == b"/metrics":
                gauge = b"mp_long_polls_parked %d\n" % len(PARKED.waiting)
                self.transport.write(_reply(200, gauge, b"text/plain"))
                self.transport.close()  # the client asks with Connection: close and reads to the end
                return
            elif path.endswith(b"/pull"):
                PARKED.waiting.append(self.transport)
            elif path.endswith(b"/observations"):
                self.transport.write(_reply(201, PUBLISH_REPLY))
                woken, PARKED.waiting = PARKED.waiting, []
                reply = _reply(200, PULL_REPLY)
                for transport in woken:
                    if not transport.is_closing():
                        transport.write(reply)
            else:
                self.transport.write(_reply(200, b"{}"))


def _socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    return sock


async def _serve_raw(sock: socket.socket) -> None:
    server = await asyncio.get_running_loop().create_server(RawProtocol, sock=sock)
    await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--server", choices=("uvicorn", "raw"), default="uvicorn")
    args = ap.parse_args()
    sock = _socket(args.port)
    if args.server == "raw":
        asyncio.run(_serve_raw(sock))
        return
    import uvicorn

    # mp serve's settings (cli/serve.py): httptools, uvloop when installed, no access log by default
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False, http="httptools", loop="auto"
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
