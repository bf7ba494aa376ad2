"""The sync client's HTTP layer: keep-alive HTTP/1.1 connections from the standard library's http.client.

Chosen by measurement (docs/bench.md, "The client"): against the same `mp serve`, one sequential client
spent ~270 µs of CPU per request on a reused `http.client.HTTPConnection` and ~790 µs on `httpx.Client`,
which made httpx the slowest part of a durable publish. `monitor_protocol.client.Client` uses this pool for
`http://` and `https://` URLs that no proxy setting applies to; it keeps httpx for everything else (a proxy
from the environment, a caller's own `transport=`). `AsyncClient` has the same under asyncio (AsyncPool).

Failure semantics match the client's contract (`ConnectionFailed.sent`): a failure to connect means the
request was certainly never sent; any failure once a request has started may have reached the server. A
pooled connection is checked before reuse (a server that closed it while idle left it readable), so a
connection closed by the server's keep-alive timeout is replaced instead of failing the next request.
"""

from __future__ import annotations

import asyncio
import http.client
import select
import socket
import ssl
import threading
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from monitor_protocol.client.httpreply import Reply, SendFailed

MAX_IDLE = 8  # idle connections kept per client (a client used from several threads may hold more)


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


class Pool:
    """Keep-alive connections to one origin (scheme, host, port); thread-safe like httpx.Client."""

    def __init__(self, base: str) -> None:
        self.https, self.host, self.port, self.host_header = _origin(base)
        self._context = ssl.create_default_context() if self.https else None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.closed = False

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _take(self) -> http.client.HTTPConnection | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if _usable(conn):
                    return conn
                conn.close()
        return None

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
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
        conn = self._take()
        if conn is None:
            conn = self._new(timeout)
            try:
                conn.connect()
            except (OSError, ssl.SSLError) as exc:  # refused, unreachable, DNS, connect timeout: never sent
                conn.close()
                raise SendFailed(_reason(exc), sent=False) from exc
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            for name, value in headers.items():
                conn.putheader(name, value)
        except (ValueError, http.client.HTTPException) as exc:  # a header or target that is not HTTP
            conn.close()
            raise SendFailed(_reason(exc), sent=False) from exc
        try:
            if body is not None:
                conn.putheader("content-length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            content = response.read()
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            conn.close()
            raise SendFailed(_reason(exc), sent=True) from exc
        reply = Reply(response.status, content, {k.lower(): v for k, v in response.getheaders()})
        if response.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return reply

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _usable(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive connection is usable when the server has sent nothing on it: a readable socket
    means it was closed (EOF) or carries bytes nobody asked for."""
    sock: Any = conn.sock
    if sock is None:
        return False
    try:  # poll, not select: select cannot watch a descriptor above 1023
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"{type(exc).__name__}: the server did not answer in time"
    detail = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {detail}" if detail != type(exc).__name__ else detail


# ---------------------------------------------------------------------------------------------- async
# AsyncClient's layer under asyncio: keep-alive connections on asyncio streams, HTTP/1.1 by h11 (the parser
# httpx itself uses). Measured against the same server: ~300 µs of client CPU per request, against
# ~1,500 µs with httpx.AsyncClient, which was the limit of 16 concurrent readers or producers in one process.


class _AsyncConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        import h11

        self.h11 = h11
        self.reader = reader
        self.writer = writer
        self.host = host
        self.state = h11.Connection(h11.CLIENT)

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def exchange(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[Reply, bool]:
        h11 = self.h11
        state = self.state
        fields = [("host", self.host), *headers.items()]
        if body is not None:
            fields.append(("content-length", str(len(body))))
        data = state.send(h11.Request(method=method, target=target, headers=fields))
        if body:
            data += state.send(h11.Data(data=body))
        data += state.send(h11.EndOfMessage())
        self.writer.write(data)
        await self.writer.drain()
        status, reply_headers, parts = 0, {}, []
        while True:
            event = state.next_event()
            if event is h11.NEED_DATA:
                state.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                reply_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the server closed the connection before its reply ended")
        reusable = state.our_state is h11.DONE and state.their_state is h11.DONE
        if reusable:
            state.start_next_cycle()
        return Reply(status, b"".join(parts), reply_headers), reusable

    def close(self) -> None:
        self.writer.close()


class AsyncPool:
    """Keep-alive connections to one origin for coroutines of one asyncio loop."""

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
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # connections belong to one loop: a new loop starts afresh
            self._drop_idle()
            self.loop = loop
        conn = self._take()
        if conn is None:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, ssl=self._context), timeout
                )
            except (OSError, ssl.SSLError, TimeoutError) as exc:  # never sent
                raise SendFailed(_reason(exc), sent=False) from exc
            conn = _AsyncConnection(reader, writer, self.host_header)
        try:
            reply, reusable = await asyncio.wait_for(conn.exchange(method, target, body, headers), timeout)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, conn.h11.LocalProtocolError):  # refused by h11 before a byte was written
                raise SendFailed(_reason(exc), sent=False) from exc
            if isinstance(exc, OSError | TimeoutError | ssl.SSLError | conn.h11.ProtocolError):
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


MAX_ASYNC_IDLE = 64


def running_asyncio() -> bool:
    """Whether the caller runs under asyncio (the async pool's loop), not trio or another library."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return asyncio.current_task() is not None
