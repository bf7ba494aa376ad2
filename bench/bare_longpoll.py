"""The floor of the wake fan-out benchmark (bench/fanout.py): a bare asyncio server that does no protocol work.

It answers what bench/fanout.py's client sends and nothing else: a `GET .../pull` parks until a
`POST .../observations` arrives, which answers 201 and then writes every parked request one fixed reply of the
size mp serve sends (one observation), from one loop turn; `/metrics` reports the `mp_long_polls_parked` gauge
the client waits for. No engine, no SQLite, no fsync, on uvloop when it is installed (as mp serve is): what
N replies cost the machine and the client process, the fan-out's floor.
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
        "monitor": "fan",
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
                "source": "mp://127.0.0.1/monitors/fan",
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
    """Who is waiting for the next publish (a transport each)."""

    def __init__(self) -> None:
        self.waiting: list[Any] = []


PARKED = Parked()


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
    args = ap.parse_args()
    sock = _socket(args.port)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # the standard library's loop
        pass
    asyncio.run(_serve_raw(sock))


if __name__ == "__main__":
    main()
