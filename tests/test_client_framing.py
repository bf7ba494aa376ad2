"""The client's own reply reader (keepalive.py), sync pool and asyncio protocol alike, against scripted servers:
every framing HTTP/1.1 allows (Content-Length, chunked with extensions and trailers, close-delimited, interim
1xx, HEAD and 204 without a body), bytes arriving one at a time, several replies on one connection, and each way
a reply can go wrong (garbage, a head too large, the connection cut mid-body, no answer in time) as a
SendFailed that says the request may have been sent."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from monitor_protocol.client.httpreply import Reply, SendFailed
from monitor_protocol.client.keepalive import MAX_HEAD_BYTES, AsyncPool, Pool

pytestmark = pytest.mark.quick


class Scripted:
    """A server that answers each request on a connection with the next scripted reply, written in pieces
    (`split` bytes at a time), after that reply's delay in seconds (`delays`); None closes the connection
    instead."""

    def __init__(
        self, replies: list[bytes | None], split: int = 0, delays: list[float] | None = None
    ) -> None:
        self.replies = replies
        self.split = split
        self.delays = delays or []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        replies = iter(self.replies)
        delays = iter(self.delays)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                for reply in replies:
                    if not _read_request(conn):
                        break
                    if reply is None:
                        break
                    time.sleep(next(delays, 0.0))
                    step = self.split or len(reply)
                    try:
                        for i in range(0, len(reply), step):
                            conn.sendall(reply[i : i + step])
                    except OSError:  # the client gave up on this reply and closed the connection
                        break
                    if reply.endswith(b"#close") or b"connection: close" in reply:
                        break

    def close(self) -> None:
        self.listener.close()


def _read_request(conn: socket.socket) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += conn.recv(65536)
    return True


def _sync(
    base: str, requests: list[tuple[str, bytes | None]], timeout: float | list[float] = 5
) -> list[Reply | SendFailed]:
    pool = Pool(base)
    out: list[Reply | SendFailed] = []
    try:
        for (method, body), limit in zip(requests, _timeouts(timeout, requests), strict=True):
            try:
                out.append(pool.request(method, "/mp/v0/x", body, {"accept": "application/json"}, limit))
            except SendFailed as exc:
                out.append(exc)
    finally:
        pool.close()
    return out


def _async(
    base: str, requests: list[tuple[str, bytes | None]], timeout: float | list[float] = 5
) -> list[Reply | SendFailed]:
    async def run() -> list[Reply | SendFailed]:
        pool = AsyncPool(base)
        out: list[Reply | SendFailed] = []
        try:
            for (method, body), limit in zip(requests, _timeouts(timeout, requests), strict=True):
                try:
                    out.append(
                        await pool.request(method, "/mp/v0/x", body, {"accept": "application/json"}, limit)
                    )
                except SendFailed as exc:
                    out.append(exc)
        finally:
            await pool.aclose()
        return out

    return asyncio.run(run())


def _timeouts(timeout: float | list[float], requests: list[Any]) -> list[float]:
    """One timeout for every request, or each request's own."""
    return timeout if isinstance(timeout, list) else [timeout] * len(requests)


@pytest.fixture(params=["sync", "async"])
def exchange(request: pytest.FixtureRequest) -> Any:
    return _sync if request.param == "sync" else _async


@pytest.fixture(params=[0, 1], ids=["whole", "byte-by-byte"])
def split(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def scripted() -> Iterator[Any]:
    made: list[Scripted] = []

    def make(replies: list[bytes | None], split: int = 0, delays: list[float] | None = None) -> Scripted:
        server = Scripted(replies, split, delays)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    b'4;ext=1\r\n{"ok\r\n7\r\n":true}\r\n0\r\nx-trailer: 1\r\n\r\n'
)


def test_replies_in_every_framing_arrive_whole_and_the_connection_is_reused(
    exchange, split, scripted
) -> None:
    server = scripted(
        [
            OK,
            CHUNKED,
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n",  # HEAD: the length, no body
            b"HTTP/1.1 200 OK\r\ncontent-length:  3 \r\nX-Two: a\r\nx-two: b\r\n\r\n[1]",
            b"HTTP/1.1 200 OK\r\n\r\nuntil the end#close",  # close-delimited
        ],
        split,
    )
    methods = [("GET", None), ("GET", None), ("POST", b"{}"), ("POST", b"{}"), ("HEAD", None), ("GET", None)]
    replies = exchange(server.base, [*methods, ("GET", None)])
    assert all(isinstance(r, Reply) for r in replies), replies
    assert [r.status_code for r in replies] == [200, 200, 201, 204, 200, 200, 200]
    assert [r.content for r in replies] == [
        b'{"ok":true}', b'{"ok":true}', b"{}", b"", b"", b"[1]", b"until the end#close",
    ]  # fmt: skip
    assert replies[0].headers["content-type"] == "application/json"
    assert replies[5].headers["x-two"] == "a, b"  # repeated headers joined, names lowercased
    assert server.connections == 1  # every reply kept the connection (the last one ended it)


def test_a_length_named_elsewhere_repeated_or_closing_is_framed_right(exchange, scripted) -> None:
    """Heads whose framing is easy to misread: a content-length inside another header's value, a repeated
    one, and a connection header (which ends reuse: the positive control of `connections`)."""
    server = scripted(
        [
            b"HTTP/1.1 201 Created\r\ndate: Sun, 06 Dec 2026 18:40:00 GMT\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\nx-note: content-length: 99\r\ncontent-length: 3\r\n\r\n[1]",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
            OK,
        ]
    )
    replies = exchange(server.base, [("GET", None)] * 5)
    assert all(isinstance(r, Reply) for r in replies), replies
    assert [r.content for r in replies] == [b"{}", b"[1]", b"{}", b"{}", b'{"ok":true}']
    assert replies[0].headers == {"date": "Sun, 06 Dec 2026 18:40:00 GMT", "content-length": "2"}
    assert replies[1].headers["x-note"] == "content-length: 99"
    assert replies[3].headers["connection"] == "close"
    assert server.connections == 2  # the fourth reply said close: the fifth came on a new connection


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n folded\r\n\r\n{}",  # obs-fold
        b"HTTP/1.1 200 OK\r\nno colon here\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1_0\r\n\r\n{}",
    ],
    ids=["obs-fold", "no-colon", "negative-length", "underscored-length"],
)
def test_a_malformed_head_may_have_been_sent(exchange, scripted, head) -> None:
    """A folded line and a line without a colon are not header lines; a content-length of -1 or 1_0 is not
    a length (int() read both: found by a reviewer). Each is a reply that is not HTTP: it may have been
    sent. The control: the same head, well formed, is read."""
    server = scripted([head])
    (reply,) = exchange(server.base, [("GET", None)])
    assert isinstance(reply, SendFailed) and reply.sent, reply
    control = scripted([b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"])
    (good,) = exchange(control.base, [("GET", None)])
    assert isinstance(good, Reply) and good.content == b"{}"


def test_a_reply_without_a_body_is_not_read_as_chunked(exchange, split, scripted) -> None:
    """HEAD, 204 and 304 carry no body even when their headers name chunked framing (a HEAD reply names the
    GET's): the reader must not wait for chunks that never come, and the next reply on the connection is read
    whole. The positive control is a GET answered the same way, whose chunks are read."""
    chunked_head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    server = scripted(
        [
            chunked_head,  # HEAD
            b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n",
            CHUNKED,  # the control: the same framing on a GET has a body
        ],
        split,
    )
    replies = exchange(server.base, [("HEAD", None), ("POST", b"{}"), ("GET", None), ("GET", None)])
    assert all(isinstance(r, Reply) for r in replies), replies
    assert [(r.status_code, r.content) for r in replies] == [
        (200, b""), (204, b""), (304, b""), (200, b'{"ok":true}'),
    ]  # fmt: skip
    assert server.connections == 1


def test_a_reply_that_is_not_http_may_have_been_sent(exchange, scripted) -> None:
    server = scripted([b"SSH-2.0-OpenSSH_9.2\r\n\r\n#close"])
    (reply,) = exchange(server.base, [("POST", b"{}")])
    assert isinstance(reply, SendFailed) and reply.sent and "not an HTTP reply" in reply.reason
    control = scripted([OK])
    assert isinstance(exchange(control.base, [("POST", b"{}")])[0], Reply)  # positive control


def test_a_head_too_large_is_refused(exchange, scripted) -> None:
    server = scripted([b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"])
    (reply,) = exchange(server.base, [("GET", None)])
    assert isinstance(reply, SendFailed) and reply.sent and "too large" in reply.reason


@pytest.mark.parametrize(
    "cut",
    [
        b'HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{"half":',
        b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\n{"ha',
        b"HTTP/1.1 200 OK\r\ncontent-le",
    ],
    ids=["length", "chunked", "head"],
)
def test_a_connection_cut_mid_reply_may_have_been_sent(exchange, scripted, cut: bytes) -> None:
    server = scripted([cut + b"#close"])
    (reply,) = exchange(server.base, [("POST", b"{}")])
    assert isinstance(reply, SendFailed) and reply.sent


def test_a_server_that_does_not_answer_in_time_may_have_been_sent(exchange) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does) and never answers
    try:
        (reply,) = exchange(f"http://127.0.0.1:{listener.getsockname()[1]}", [("POST", b"{}")], timeout=0.3)
    finally:
        listener.close()
    assert isinstance(reply, SendFailed) and reply.sent and "in time" in reply.reason


def test_a_connection_closed_after_its_reply_is_not_reused(exchange, scripted) -> None:
    server = scripted([b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}", OK])
    replies = exchange(server.base, [("GET", None), ("GET", None)])
    assert [r.status_code for r in replies] == [200, 200]  # type: ignore[union-attr]
    assert server.connections == 2  # the second request on a new connection


def test_a_shorter_timeout_on_a_reused_connection_still_ends_in_time(exchange, scripted) -> None:
    """A connection's timeout follows each request: the sync pool sets the kernel's per-socket timeouts again,
    the async one moves its connection's timer earlier. The control is the same connection's first request,
    answered within its longer timeout."""
    server = scripted([OK, OK], delays=[0.0, 3.0])
    started = time.monotonic()
    first, second = exchange(server.base, [("GET", None), ("GET", None)], timeout=[5, 0.3])
    assert isinstance(first, Reply) and first.status_code == 200  # the control
    assert isinstance(second, SendFailed) and second.sent and "in time" in second.reason
    assert time.monotonic() - started < 2.5  # the 0.3 s limit ended it, not the 5 s one or the reply
    assert server.connections == 1


def test_a_longer_timeout_is_not_cut_short_by_an_earlier_one(exchange, scripted) -> None:
    """A request whose timeout is longer than the one before it on the same connection gets all of it: the
    async connection's timer, armed for the first request, fires during the second and waits again. The
    control is the first request, answered within its own short timeout."""
    server = scripted([OK, OK], delays=[0.0, 1.0])
    first, second = exchange(server.base, [("GET", None), ("GET", None)], timeout=[0.3, 5])
    assert isinstance(first, Reply) and first.status_code == 200  # the control
    assert isinstance(second, Reply) and second.status_code == 200, second  # answered after 1 s, within 5
    assert server.connections == 1
