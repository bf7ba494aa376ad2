"""The transport limit: mp serve's own HTTP/1.1 server (doors/http/protocol.py) with a trivial app behind it.

The request is parsed, handed to the engine's seat on the loop (a LoopEngine with no store: the calls of a
loop turn run at its end, as mp serve's do) and answered with a small prepared JSON object (201 for POST,
200 otherwise): no router, no rules, no SQLite. Whatever `mp serve` does beyond this is the protocol's own
cost. The socket is bound as `mp serve` binds it, and the loop is uvloop when installed, as mp serve's is.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from monitor_protocol.api.messages import Request, Response  # noqa: E402
from monitor_protocol.core.vocab import DEFAULT_MAX_BODY  # noqa: E402
from monitor_protocol.doors.engines import LoopEngine  # noqa: E402
from monitor_protocol.doors.http.ops import Metrics  # noqa: E402
from monitor_protocol.doors.http.protocol import HttpServer  # noqa: E402

BODY = {"observation": {"id": "1"}, "seq": 1}


class BareApp:
    """What HttpServer asks of an app, and nothing more."""

    max_body = DEFAULT_MAX_BODY
    ops_routes = False

    def __init__(self) -> None:
        self.engine = LoopEngine(None)
        self.metrics = Metrics()

    def handle_job(self, request: Request) -> tuple[Response, int]:
        return Response(201 if request.method == "POST" else 200, BODY), -1

    @staticmethod
    def failure(request: Request, exc: BaseException) -> tuple[Response, int]:
        return Response(503, {"code": "UNAVAILABLE", "error": str(exc)}), -1

    def begin_shutdown(self) -> None:
        pass

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:  # the bridge's routes
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})


async def serve(port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    server = HttpServer(BareApp(), header_timeout=30, body_timeout=60, keep_alive=65)
    await server.listen(sock)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log-level", default="warning")  # accepted for bench/common.py's call; nothing logs
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # the standard library's loop
        pass
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
