"""The client's own HTTP/1.1 layer: keep-alive connections on plain sockets (`Pool`, for `Client`) and on asyncio
streams (`AsyncPool`, for `AsyncClient`), with one small request writer and response reader for both.

Chosen by measurement (docs/bench.md, "The client"): the request is written as one buffer and the reply read
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
import re
import select
import socket
import ssl
import threading
import urllib.request
from urllib.parse import urlsplit

from monitor_protocol.client.httpreply import Reply, SendFailed

MAX_IDLE = 8  # idle connections kept per client (a client used from several threads may hold more)
MAX_ASYNC_IDLE = 64
MAX_HEAD_BYTES = 64 << 10  # a reply's status line and headers
CHUNK = 65536

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
    if _BAD_TARGET.search(target):
        raise SendFailed(
            f"ValueError: the request target {target[:80]!r} holds a space or control character", sent=False
        )
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n"]
    for name, value in headers.items():
        if not _GOOD_NAME.match(name) or _BAD_VALUE.search(value):
            raise SendFailed(f"ValueError: the header {name[:40]!r} is not valid HTTP", sent=False)
        lines.append(f"{name}: {value}\r\n")
    if body is not None:
        lines.append(f"content-length: {len(body)}\r\n")
    lines.append("\r\n")
    try:
        head = "".join(lines).encode("latin-1")
    except UnicodeEncodeError as exc:
        raise SendFailed(f"UnicodeEncodeError: a header is not latin-1 text: {exc}", sent=False) from exc
    return head + body if body else head


class _Head:
    """A reply's status line and headers, and how its body is framed."""

    __slots__ = ("status", "headers", "length", "chunked", "keep_alive")

    def __init__(self, raw: bytes, method: str) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP reply: {lines[0][:80]!r}")
        self.status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"not a header line: {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (parts[0] != "HTTP/1.0" or "keep-alive" in connection)
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.length: int | None = None
        if method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self.length = 0
        elif not self.chunked:
            declared = headers.get("content-length")
            if declared is not None:
                self.length = int(declared.split(",")[0].strip())
            else:
                self.keep_alive = False  # the body ends with the connection


# ---------------------------------------------------------------------------------------------- sync


class _Conn:
    __slots__ = ("sock", "buf")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(CHUNK)
        if not data:
            raise ConnectionResetError("the server closed the connection before its reply ended")
        self.buf += data

    def _head(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n\r\n")
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
            head = _Head(self._head(), method)
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
        """An idle keep-alive connection is usable when the server has sent nothing on it: a readable
        socket means it was closed (EOF) or carries bytes nobody asked for."""
        try:  # poll, not select: select cannot watch a descriptor above 1023
            poller = select.poll()
            poller.register(self.sock, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

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
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)

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
            raise SendFailed("the client is closed", sent=False)
        data = request_bytes(method, target, self.host_header, headers, body)
        conn = self._take()
        if conn is None:
            try:
                conn = self._new(timeout)
            except (OSError, ssl.SSLError) as exc:  # refused, unreachable, DNS, connect timeout: never sent
                raise SendFailed(_reason(exc), sent=False) from exc
        try:
            conn.sock.settimeout(timeout)
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


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"{type(exc).__name__}: the server did not answer in time"
    detail = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {detail}" if detail != type(exc).__name__ else detail


# ---------------------------------------------------------------------------------------------- async


class _AsyncConnection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def exchange(self, data: bytes, method: str) -> tuple[Reply, bool]:
        reader = self.reader
        self.writer.write(data)
        if self.writer.transport.get_write_buffer_size() > CHUNK:
            await self.writer.drain()
        while True:
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                raise ConnectionResetError("the server closed the connection before its reply ended") from exc
            except asyncio.LimitOverrunError as exc:
                raise ValueError("the reply's headers are too large") from exc
            head = _Head(raw[:-4], method)
            if not 100 <= head.status < 200:
                break
        try:
            if head.chunked:
                parts = []
                while True:
                    line = await reader.readuntil(b"\r\n")
                    size = int(line[:-2].split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the empty line
                            pass
                        break
                    parts.append(await reader.readexactly(size))
                    await reader.readexactly(2)
                content = b"".join(parts)
            elif head.length is None:
                content = await reader.read()
            else:
                content = await reader.readexactly(head.length) if head.length else b""
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("the server closed the connection before its reply ended") from exc
        return Reply(head.status, content, head.headers), head.keep_alive

    def close(self) -> None:
        self.writer.close()


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
            raise SendFailed("the client is closed", sent=False)
        data = request_bytes(method, target, self.host_header, headers, body)
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # connections belong to one loop: a new loop starts afresh
            self._drop_idle()
            self.loop = loop
        conn = self._take()
        if conn is None:
            try:
                async with asyncio.timeout(timeout):
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, ssl=self._context, limit=MAX_HEAD_BYTES
                    )
            except (OSError, ssl.SSLError, TimeoutError) as exc:  # never sent
                raise SendFailed(_reason(exc), sent=False) from exc
            conn = _AsyncConnection(reader, writer)
        try:
            async with asyncio.timeout(timeout):
                reply, reusable = await conn.exchange(data, method)
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
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return asyncio.current_task() is not None
