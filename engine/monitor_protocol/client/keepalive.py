"""The client's own HTTP/1.1 layer: keep-alive connections on plain sockets (`Pool`, for `Client`) and as asyncio
protocols (`AsyncPool`, for `AsyncClient`: the reply read in `data_received`, no stream reader, no task), with
one request writer and one reply head parser for both.

Measured (docs/bench-history.md, "The client made leaner"): a request written as one buffer, the reply read
with as few calls as its framing allows, so a keep-alive request costs a few tens of microseconds of client
CPU, where the standard library's http.client took ~200 and h11 on asyncio streams ~300 (httpx: ~800 and
~1,500). `monitor_protocol.client` uses these pools for `http://` and `https://` URLs that no proxy setting
applies to; it keeps httpx for everything else (a proxy from the environment, a caller's own `transport=`).

Failure semantics match the client's contract (`ConnectionFailed.sent`): a failure to connect, or a request
that is not HTTP (a header value with a line break, a target with a space), was certainly never sent; any
failure once bytes may have left may have reached the server. A pooled connection is checked before reuse (a
server that closed it while idle left it readable), so a connection closed by the server's keep-alive timeout
is replaced instead of failing the next request.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import socket
import ssl
import struct
import sys
import threading
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from monitor_protocol.client.httpreply import Reply, SendFailed

MAX_IDLE = 8  # idle connections kept per client (a client used from several threads may hold more)
MAX_ASYNC_IDLE = 64
MAX_HEAD_BYTES = 64 << 10  # a reply's status line and headers
CHUNK = 65536
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") and struct.calcsize("l") == 8  # timeval: two longs
_TIMER_SLACK = 0.001  # a loop may run a timer this early (libuv counts in milliseconds)

# What a request line and headers may not hold (as http.client refuses them): a target with a space or a
# control character, a header name that is not a token, a value with a bare line break.
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_GOOD_NAME = re.compile(r"[^:\s][^:\r\n]*\Z")
_BAD_VALUE = re.compile(r"\n(?![ \t])|\r(?![ \t\n])")


def proxied(url: str) -> bool:
    """Whether the environment's proxy settings (HTTP_PROXY, NO_PROXY, ...) apply to this URL, as httpx
    would honour them: such a client keeps httpx."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not proxies.get(parts.scheme) and not proxies.get("all"):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def _origin(base: str) -> tuple[bool, str, int, str]:
    """(https, host, port, Host header) of an http(s) base URL; a pool talks to this one origin."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base!r}")
    https = parts.scheme == "https"
    return https, parts.hostname, parts.port or (443 if https else 80), parts.netloc.rsplit("@", 1)[-1]


def request_bytes(method: str, target: str, host: str, headers: dict[str, str], body: bytes | None) -> bytes:
    """The whole request as one buffer; SendFailed(sent=False) for what is not HTTP."""
    # A client sends the same few requests again and again (one path, its shared headers): their head is
    # checked and encoded once. `headers` is the caller's shared dict, never changed (clients.py), so the
    # same object means the same lines.
    known = _REQUEST_HEADS.get((method, target, host))
    if known is not None and known[0] is headers:
        head = known[1]
    else:
        head = _request_head(method, target, host, headers)
        if len(target) <= 512:
            if len(_REQUEST_HEADS) >= 256:
                _REQUEST_HEADS.clear()
            _REQUEST_HEADS[(method, target, host)] = (headers, head)
    if body is not None:
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    return head + b"\r\n"


_REQUEST_HEADS: dict[tuple[str, str, str], tuple[dict[str, str], bytes]] = {}


def _request_head(method: str, target: str, host: str, headers: dict[str, str]) -> bytes:
    if _BAD_TARGET.search(target):
        raise SendFailed(
            f"ValueError: the request target {target[:80]!r} holds a space or control character",
            sent=False,
            final=True,
        )
    try:
        head = f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1")
    except UnicodeEncodeError as exc:
        raise SendFailed(
            f"UnicodeEncodeError: the request line is not latin-1 text: {exc}", sent=False, final=True
        ) from exc
    return head + _header_block(tuple(headers.items()))


def _header_block(items: tuple[tuple[str, str], ...]) -> bytes:
    """The header lines of `items`, checked and encoded once per distinct set (a client sends the same few
    again and again: its accept, its token, its content type)."""
    block = _BLOCKS.get(items)
    if block is not None:
        return block
    lines = []
    for name, value in items:
        if not _GOOD_NAME.match(name) or _BAD_VALUE.search(value):
            raise SendFailed(
                f"ValueError: the header {name[:40]!r} is not valid HTTP", sent=False, final=True
            )
        lines.append(f"{name}: {value}\r\n")
    try:
        block = "".join(lines).encode("latin-1")
    except UnicodeEncodeError as exc:
        raise SendFailed(
            f"UnicodeEncodeError: a header is not latin-1 text: {exc}", sent=False, final=True
        ) from exc
    if len(_BLOCKS) >= 256:
        _BLOCKS.clear()
    _BLOCKS[items] = block
    return block


_BLOCKS: dict[tuple[tuple[str, str], ...], bytes] = {}
_HEADS: dict[bytes, _Head] = {}


def _head_of(raw: bytes, method: str) -> _Head:
    """The parsed head of a reply. A server's replies to one kind of request repeat their head byte for byte
    (its Date changes once a second, its length now and then), so a small head is parsed once and shared:
    read it, never change it. A HEAD reply's framing differs from a GET's with the same bytes: not kept."""
    head = _HEADS.get(raw)
    if head is None or method == "HEAD":
        head = _Head(raw, method)
        if len(raw) <= 1024 and method != "HEAD":
            if len(_HEADS) >= 64:
                _HEADS.clear()
            _HEADS[raw] = head
    return head


class _Head:
    """A reply's status line and headers, and how its body is framed."""

    __slots__ = ("status", "headers", "length", "chunked", "keep_alive")

    def __init__(self, raw: bytes, method: str) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP reply: {lines[0][:80]!r}")
        self.status = status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                if not line:
                    continue
                raise ValueError(f"not a header line: {line[:80]!r}")
            key = name.strip().lower()
            if key in headers:
                headers[key] = f"{headers[key]}, {value.strip()}"
            else:
                headers[key] = value.strip()
        self.headers = headers
        connection = headers.get("connection")
        if connection is None:
            self.keep_alive = parts[0] != "HTTP/1.0"
        else:
            connection = connection.lower()
            self.keep_alive = "close" not in connection and (
                parts[0] != "HTTP/1.0" or "keep-alive" in connection
            )
        encoding = headers.get("transfer-encoding")
        self.chunked = encoding is not None and "chunked" in encoding.lower()
        self.length: int | None = None
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            # No body whatever the headers say (RFC 9112 6.3): a HEAD reply names the GET's framing.
            self.length = 0
            self.chunked = False
        elif not self.chunked:
            declared = headers.get("content-length")
            if declared is not None:
                value = declared.split(",")[0].strip()
                if not (value.isdigit() and value.isascii()):  # int() would read -1, +1 and 1_0
                    raise ValueError(f"not a content-length: {declared[:40]!r}")
                self.length = int(value)
            else:
                self.keep_alive = False  # the body ends with the connection


# ---------------------------------------------------------------------------------------------- sync


class _Conn:
    __slots__ = ("sock", "buf", "timeout", "poller", "kernel_timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.timeout: float | None = sock.gettimeout()
        self.poller: select.poll | None = None
        # On 64-bit Linux a plain TCP socket is left blocking and the kernel keeps its timeout (SO_RCVTIMEO,
        # SO_SNDTIMEO): a Python socket timeout costs a poll() before every send and every recv. The kernel's
        # timeout is per call: a signal whose handler returns restarts the wait, and a body's upload may take
        # one timeout per write. Not where the socket stays non-blocking when told to block (gevent's and
        # eventlet's patched sockets wait in their own hub, which would then never time out).
        self.kernel_timeout = False
        if _KERNEL_TIMEOUTS and type(sock) is socket.socket:
            timeout = self.timeout
            sock.settimeout(None)
            if os.get_blocking(sock.fileno()):
                self.kernel_timeout = True
            self.set_timeout(timeout)

    def set_timeout(self, timeout: float | None) -> None:
        if self.kernel_timeout:
            value = _timeval(timeout)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        else:
            self.sock.settimeout(timeout)
        self.timeout = timeout

    def _fill(self) -> None:
        data = self.sock.recv(CHUNK)
        if not data:
            raise ConnectionResetError("the server closed the connection before its reply ended")
        self.buf += data

    def _head(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end > MAX_HEAD_BYTES:
                raise ValueError("the reply's headers are too large")
            if end >= 0:
                head, self.buf = self.buf[:end], self.buf[end + 4 :]
                return head
            if len(self.buf) > MAX_HEAD_BYTES:
                raise ValueError("the reply's headers are too large")
            self._fill()

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line, self.buf = self.buf[:end], self.buf[end + 2 :]
                return line
            if len(self.buf) > MAX_HEAD_BYTES:
                raise ValueError("a chunk size line is too long")
            self._fill()

    def _rest(self) -> bytes:
        parts = [self.buf]
        self.buf = b""
        while True:
            data = self.sock.recv(CHUNK)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def exchange(self, data: bytes, method: str) -> tuple[Reply, bool]:
        self.sock.sendall(data)
        while True:
            head = _head_of(self._head(), method)
            if not 100 <= head.status < 200:
                break
        if head.chunked:
            parts = []
            while True:
                size = int(self._line().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self._line():  # trailers, then the empty line
                        pass
                    break
                parts.append(self._exactly(size))
                self._exactly(2)
            content = b"".join(parts)
        elif head.length is None:
            content = self._rest()
        else:
            content = self._exactly(head.length) if head.length else b""
        return Reply(head.status, content, head.headers), head.keep_alive and not self.buf

    def usable(self) -> bool:
        return _silent(self, self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Pool:
    """Keep-alive connections to one origin (scheme, host, port); thread-safe like httpx.Client."""

    http_layer = "keep-alive"

    def __init__(self, base: str) -> None:
        self.https, self.host, self.port, self.host_header = _origin(base)
        self._context = ssl.create_default_context() if self.https else None
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self.closed = False

    def _new(self, timeout: float) -> _Conn:
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self.host)
            return _Conn(sock)
        except BaseException:
            sock.close()
            raise

    def _take(self) -> _Conn | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.usable():
                    return conn
                conn.close()
        return None

    def _give_back(self, conn: _Conn) -> None:
        with self._lock:
            if not self.closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def request(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Reply:
        """One request on a pooled connection (a new one when none is idle)."""
        if self.closed:
            raise SendFailed("the client is closed", sent=False, final=True)
        data = request_bytes(method, target, self.host_header, headers, body)
        conn = self._take()
        if conn is None:
            try:
                conn = self._new(timeout)
            except (OSError, ssl.SSLError) as exc:  # refused, unreachable, DNS, connect timeout: never sent
                raise SendFailed(_reason(exc), sent=False) from exc
        try:
            if conn.timeout != timeout:
                conn.set_timeout(timeout)
            reply, reusable = conn.exchange(data, method)
        except (OSError, ValueError, ssl.SSLError) as exc:
            conn.close()
            raise SendFailed(_reason(exc), sent=True) from exc
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return reply

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _silent(conn: Any, sock: Any) -> bool:
    """Whether the server has sent nothing on an idle keep-alive connection (``sock``: its socket or
    descriptor): a readable socket means it was closed (EOF) or carries bytes nobody asked for.
    ``conn.poller`` keeps the connection's poll object."""
    try:
        if not hasattr(select, "poll"):  # Windows: select, which takes any socket there
            return not select.select([sock], [], [], 0)[0]
        poller = conn.poller  # poll, not select: select cannot watch a descriptor above 1023 on POSIX
        if poller is None:
            poller = conn.poller = select.poll()
            poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def _timeval(timeout: float | None) -> bytes:
    """A `struct timeval` for SO_RCVTIMEO/SO_SNDTIMEO; zero means no timeout, so a positive timeout is at
    least a microsecond."""
    if timeout is None:
        return struct.pack("ll", 0, 0)
    if not timeout >= 0:  # as socket.settimeout refuses it, before anything is sent
        raise ValueError(f"a timeout must be a number of seconds >= 0, not {timeout!r}")
    micros = max(1, round(timeout * 1_000_000))
    return struct.pack("ll", micros // 1_000_000, micros % 1_000_000)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError | BlockingIOError):
        # BlockingIOError: a kernel-kept timeout ran out (EAGAIN on a blocking socket); named as the timeout it is
        return "TimeoutError: the server did not answer in time"
    detail = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {detail}" if detail != type(exc).__name__ else detail


# ---------------------------------------------------------------------------------------------- async


class _AsyncConnection(asyncio.Protocol):
    """One keep-alive connection as an asyncio protocol: the reply is read in `data_received` as its bytes come
    (no stream reader, no task), and one future per request says when it is whole."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.method = "GET"
        self.head: _Head | None = None
        self.parts: list[bytes] = []  # a chunked body's chunks so far
        self.size: int | None = None  # the chunk being read (None: its size line comes next; -1: trailers)
        self.waiter: asyncio.Future[tuple[Reply, bool]] | None = None
        self.poller: select.poll | None = None  # `_silent`'s
        self.fd: int | None = None  # the socket's descriptor, for `_silent`
        self.deadline = 0.0  # when the request in flight times out (the loop's clock)
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio's callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is not None:
            self._advance()

    def eof_received(self) -> bool:
        self.eof = True
        if self.waiter is not None:
            self._advance()
        return False  # close: a keep-alive connection the server ended is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        if self.waiter is not None:
            self._advance()

    # -- a request
    def usable(self) -> bool:
        transport = self.transport
        if self.eof or self.buf or transport is None or transport.is_closing():
            return False
        # A close the server sent while the connection was idle is read by the loop only when it next polls (a
        # caller that has not yielded since would send into it): the socket itself says.
        return self.fd is None or _silent(self, self.fd)

    def send(
        self, loop: asyncio.AbstractEventLoop, data: bytes, method: str, timeout: float
    ) -> asyncio.Future[tuple[Reply, bool]]:
        """Write a request; the future completes with its reply (and whether the connection can be used
        again). A plain function, not a coroutine: the pool awaits the future itself, one frame less per
        request. The caller sets ``waiter`` back to None once the future is done."""
        transport = self.transport
        assert transport is not None
        self.method, self.head, self.parts, self.size = method, None, [], None
        waiter = self.waiter = loop.create_future()
        # One timer per connection, not one per request (making and cancelling a timer costs more than a
        # small request's parsing): it is moved only when this request must end before it fires, and a
        # timer that fires early finds the request's own deadline and waits again.
        self.deadline = deadline = loop.time() + timeout
        timer = self.timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self.timer = loop.call_at(deadline, self._check_deadline)
        transport.write(data)
        if self.buf or self.eof:
            self._advance()
        return waiter

    def _check_deadline(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # idle: the next request arms it again
        loop = waiter.get_loop()
        if loop.time() + _TIMER_SLACK >= self.deadline:
            waiter.set_exception(TimeoutError())
        else:
            self.timer = loop.call_at(self.deadline, self._check_deadline)

    def _advance(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        try:
            done = self._read()
        except ValueError as exc:
            waiter.set_exception(exc)
            return
        if done is not None:
            waiter.set_result(done)
        elif self.eof:
            waiter.set_exception(
                ConnectionResetError("the server closed the connection before its reply ended")
            )

    def _read(self) -> tuple[Reply, bool] | None:
        """The reply, once its bytes are all here (None until then)."""
        buf = self.buf
        head = self.head
        while head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0 or end > MAX_HEAD_BYTES:
                if end > MAX_HEAD_BYTES or len(buf) > MAX_HEAD_BYTES:
                    raise ValueError("the reply's headers are too large")
                return None
            head = _head_of(bytes(buf[:end]), self.method)
            del buf[: end + 4]
            if 100 <= head.status < 200:
                head = None  # an interim reply: the real one follows
        self.head = head
        if head.chunked:
            content = self._chunks()
            if content is None:
                return None
        elif head.length is None:  # the body ends with the connection
            if not self.eof:
                return None
            content = bytes(buf)
            buf.clear()
        else:
            if len(buf) < head.length:
                return None
            content = bytes(buf[: head.length])
            del buf[: head.length]
        return Reply(head.status, content, head.headers), head.keep_alive and not buf

    def _chunks(self) -> bytes | None:
        buf = self.buf
        while True:
            if self.size is None:  # a size line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ValueError("a chunk size line is too long")
                    return None
                size = int(bytes(buf[:end]).split(b";", 1)[0].strip() or b"0", 16)
                del buf[: end + 2]
                self.size = size if size else -1
            elif self.size == -1:  # the trailers, then the empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ValueError("the reply's trailers are too large")
                    return None
                del buf[: end + 2]
                if end == 0:
                    self.size = None
                    return b"".join(self.parts)
            else:
                if len(buf) < self.size + 2:
                    return None
                self.parts.append(bytes(buf[: self.size]))
                del buf[: self.size + 2]
                self.size = None

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


class AsyncPool:
    """Keep-alive connections to one origin for coroutines of one asyncio loop."""

    http_layer = "asyncio keep-alive"

    def __init__(self, base: str) -> None:
        self.https, self.host, self.port, self.host_header = _origin(base)
        self._context = ssl.create_default_context() if self.https else None
        self._idle: list[_AsyncConnection] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def _take(self) -> _AsyncConnection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def request(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Reply:
        if self.closed:
            raise SendFailed("the client is closed", sent=False, final=True)
        data = request_bytes(method, target, self.host_header, headers, body)
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # connections belong to one loop: a new loop starts afresh
            self._drop_idle()
            self.loop = loop
        conn = self._take()
        if conn is None:
            try:
                async with asyncio.timeout(timeout):
                    _transport, conn = await loop.create_connection(
                        _AsyncConnection,
                        self.host,
                        self.port,
                        ssl=self._context,
                        server_hostname=self.host if self._context is not None else None,
                    )
            except (OSError, ssl.SSLError, TimeoutError) as exc:  # never sent
                raise SendFailed(_reason(exc), sent=False) from exc
        try:
            try:
                reply, reusable = await conn.send(loop, data, method, timeout)
            finally:
                conn.waiter = None
        except BaseException as exc:
            conn.close()
            if isinstance(exc, OSError | TimeoutError | ssl.SSLError | ValueError):
                raise SendFailed(_reason(exc), sent=True) from exc
            raise  # cancelled: the connection is gone with the request
        if reusable and not self.closed and len(self._idle) < MAX_ASYNC_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return reply

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            try:
                conn.close()
            except RuntimeError:  # its loop is closed: the socket went with it
                pass

    async def aclose(self) -> None:
        self.closed = True
        self._drop_idle()


def running_asyncio() -> bool:
    """Whether the caller runs under asyncio (the async pool's loop), not trio or another library."""
    # Not just a running asyncio loop: trio's guest mode runs trio's tasks in that loop's callbacks, outside
    # any asyncio task, where an asyncio future cannot be awaited.
    loop = asyncio._get_running_loop()
    return loop is not None and asyncio.current_task(loop) is not None
