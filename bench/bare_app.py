"""The transport limit: a trivial ASGI app on the same uvicorn configuration `mp serve` uses.

It reads the request body and answers a small JSON object (201 for POST, 200 otherwise), with no engine,
no thread hop and no SQLite: whatever `mp serve` does beyond this is the protocol's own cost.
The socket is bound as `mp serve` binds it (IPPROTO_TCP, so TCP_NODELAY is set on accepted sockets), and
uvicorn.Config gets the same arguments (lifespan on, access_log on, the same log level).
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

BODY = b'{"observation":{"id":"1"},"seq":1}'


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
    status = 201 if scope["method"] == "POST" else 200
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": BODY, "more_body": False})


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)
    config = uvicorn.Config(
        app, lifespan="on", log_level=args.log_level, access_log=True, timeout_graceful_shutdown=5
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
