"""How a Response becomes the bytes of an HTTP/1.1 reply: its status line, the `date` header formatted once a
second, its headers and JSON body, and a woken reader's reply written from the one it is like (the place's
head and body encoded once, its own id and Content-Length)."""

from __future__ import annotations

import email.utils
import time

from monitor_protocol.api.messages import Response
from monitor_protocol.core import wire

REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 204: "No Content", 207: "Multi-Status", 400: "Bad Request",
    401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict", 410: "Gone",
    413: "Content Too Large", 422: "Unprocessable Content", 429: "Too Many Requests",
    500: "Internal Server Error", 503: "Service Unavailable",
}  # fmt: skip
STATUS_LINES = {code: f"HTTP/1.1 {code} {reason}\r\n".encode() for code, reason in REASONS.items()}


def status_line(code: int) -> bytes:
    line = STATUS_LINES.get(code)
    if line is None:
        line = STATUS_LINES[code] = f"HTTP/1.1 {code} Status {code}\r\n".encode()
    return line


class _Clock:
    """The `date` header, formatted once a second."""

    def __init__(self) -> None:
        self.second = -1
        self.header = b""

    def date(self) -> bytes:
        now = time.time()
        if int(now) != self.second:
            self.second = int(now)
            self.header = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return self.header


CLOCK = _Clock()


def _head(response: Response, typed_body: bool) -> list[bytes]:
    """A reply's status line and headers up to its Content-Length (a JSON type named when it has a body)."""
    parts = [status_line(response.status), CLOCK.date()]
    typed = False
    for name, value in response.headers.items():
        lname = name.lower()
        typed = typed or lname == "content-type"
        parts.append(f"{lname}: {value}\r\n".encode("latin-1"))
    if typed_body and not typed:
        parts.append(b"content-type: application/json\r\n")
    return parts


def encode_response(response: Response, *, close: bool) -> bytes:
    """A Response as the bytes of an HTTP/1.1 reply with a Content-Length body."""
    like = response.like
    if like is not None:
        data = _encode_alike(response, like, close)
        if data is not None:
            return data
    body = response.json_bytes()
    parts = _head(response, bool(body))
    parts.append(b"content-length: %d\r\n" % len(body))
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    parts.append(body)
    return b"".join(parts)


_SUBSCRIPTION_OPEN = b'{"subscription":'  # how a pull's reply begins (delivery._pull_reply's first key)


def _encode_alike(response: Response, like: Response, close: bool) -> bytes | None:
    """The reply of a woken reader in the place of one answered before it (`like`: the same body but for its
    "subscription", pull_many's `same`), from that one's bytes: its head is made and its body encoded once
    for every reader in the place, each reply only its own id and length. The bytes are those
    encode_response makes of the reply itself (tests/test_lean_path.py holds it). None: made the usual way
    (the headers differ, as CORS headers may, or the body does not begin with its id)."""
    mine, theirs = response.headers, like.headers
    if response.status != like.status or mine != theirs or list(mine) != list(theirs):
        return None  # (headers are written in their order: equal dicts in another order are other bytes)
    body = response.body
    own = body.get("subscription") if type(body) is dict else None
    if type(own) is not str:
        return None
    date = CLOCK.date()
    kept = like.encoded
    if kept is None or kept[0] is not date or kept[1] != close:  # once per place (and per second)
        whole = like.json_bytes()
        start = _SUBSCRIPTION_OPEN + wire.encode(like.body["subscription"])
        if not whole.startswith(start):
            kept = like.encoded = (date, close, None, b"", b"")
        else:
            head = b"".join(_head(like, True))
            tail = b"connection: close\r\n\r\n" if close else b"\r\n"
            kept = like.encoded = (date, close, head, tail, whole[len(start) :])
    _date, _close, head, tail, rest = kept
    if head is None:
        return None
    opening = _SUBSCRIPTION_OPEN + wire.encode(own)
    return b"".join((head, b"content-length: %d\r\n" % (len(opening) + len(rest)), tail, opening, rest))
