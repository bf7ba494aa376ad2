"""ASGI plumbing of the HTTP door: a scope as a transport-free Request, the body read under the cap (and a
refused one discarded, bounded), a Response sent as JSON, and a disconnect awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from monitor_protocol.api.messages import Request, Response

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

DISCARD_BYTES = 64 << 20  # how much of a refused body is read and dropped so the 413 reaches the client
DISCARD_SECONDS = 5.0


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


def request_of(scope: Scope) -> Request:
    """The scope's method, path, decoded query pairs and headers (names lower-cased, repeats joined)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return Request(scope["method"].upper(), scope["path"], query, headers)


async def read_body(request: Request, receive: Receive, max_body: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as its declared or received size passes `max_body`, or
    ClientGone when the client disconnects first."""
    declared = request.header("content-length")
    if declared is not None:
        try:
            if int(declared.split(",")[0].strip()) > max_body:
                raise BodyTooLarge
        except ValueError:
            pass  # a broken length is the HTTP parser's to refuse; the cap below still applies
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def discard_body(receive: Receive) -> None:
    """Read and drop the rest of a refused body: at most DISCARD_BYTES, for at most DISCARD_SECONDS."""
    dropped = 0

    async def drain() -> None:
        nonlocal dropped
        while dropped < DISCARD_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return
            dropped += len(message.get("body", b""))

    try:
        await asyncio.wait_for(drain(), DISCARD_SECONDS)
    except TimeoutError:
        return


async def send_json(send: Send, response: Response, close: bool = False) -> None:
    body = response.json_bytes()
    headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in response.headers.items()]
    names = {k for k, _ in headers}
    if body and b"content-type" not in names:
        headers.append((b"content-type", b"application/json"))
    headers.append((b"content-length", str(len(body)).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_text(send: Send, body: bytes, content_type: str) -> None:
    headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
