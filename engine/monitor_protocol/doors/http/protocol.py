"""`mp serve`'s HTTP/1.1 server: httptools' parser callbacks feed the door directly, with no ASGI on the hot path.

A request to a protocol route (`/mp/v0/...`) goes from `on_message_complete` straight to the engine (its seat,
doors/engines.py, runs the calls of one loop turn as one group commit) and its reply is written from the
engine's callback once that commit is durable: no coroutine, no task, no ASGI message per request. Everything
that is not hot (the SSE stream, /healthz, /readyz, /metrics, a long poll's wait) runs through the ASGI app
(doors/http/app.py) on a small bridge, so that logic lives once.

What the connection itself enforces (docs/protocol.md section 10, docs/serve.md): a request's headers within
``header_timeout`` and its body within ``body_timeout`` of its start (its connection's opening for the first
request, its first byte for each later one), an idle keep-alive connection closed after ``keep_alive``, the
body cap (413 before the rest is read: a body already on its way is read and dropped, bounded, so that the
reply is not destroyed by a reset), request headers bounded in size, requests the parser refuses answered
with the protocol's JSON error body (400 INVALID), pipelined requests answered in order (all of them when
the client half-closes), the replies no client reads held to a bound for the whole server (unread.py), and a
drain on shutdown (idle connections closed at once, busy ones after their reply).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import httptools

from monitor_protocol.api.messages import Headers, Request, Response, error_response
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.doors.http.admission import Admission
from monitor_protocol.doors.http.app import STREAM_PATH
from monitor_protocol.doors.http.asgi import DISCARD_BYTES, DISCARD_SECONDS
from monitor_protocol.doors.http.ops import OPS_PATHS
from monitor_protocol.doors.http.reply_bytes import CLOCK, encode_response, status_line
from monitor_protocol.doors.http.targets import decoded_path, logged_target, origin_form
from monitor_protocol.doors.http.unread import UnreadReplies

log = logging.getLogger("monitor_protocol.http")
access_log = logging.getLogger("monitor_protocol.access")

API = b"/mp/v0"
MAX_HEADER_BYTES = 64 << 10  # request line and headers together
MAX_PIPELINED = 32  # requests parsed ahead of their turn before the connection stops reading
WRITE_TIMEOUT = 60.0  # a client that takes none of its replies' bytes for this long is cut off
INVALID_METHOD = (
    "The HTTP method is not one this server knows; send GET, POST or OPTIONS to a route under /mp/v0 "
    "(GET /mp/v0/discover lists what the server offers)."
)
INVALID_TARGET = (
    "The request target is not a valid path; send a request to a route under /mp/v0 "
    "(GET /mp/v0/discover lists what the server offers)."
)
UNANSWERABLE = (
    "The server could not write its reply to this request (the fault is in its log); the call may or may "
    "not have taken effect: read the state to see, or send it again with the same Idempotency-Key."
)
SPOKEN_VERSIONS = ("1.1", "1.0")
HEAD_TOO_LARGE = f"the request line and headers are larger than {MAX_HEADER_BYTES >> 10} KiB"
INVALID_REQUEST = (
    "The request is not valid HTTP/1.1 ({detail}); send a well-formed request line, headers and body "
    "to a route under /mp/v0 (GET /mp/v0/discover lists what the server offers)."
)


class _Pending:
    """One parsed request waiting for its turn on its connection, with what only the bridge needs; or, with
    ``refusal`` set, the connection's own 400 for what could not be parsed, written in its turn."""

    __slots__ = ("request", "keep_alive", "too_large", "http_version", "query_string", "refusal", "answered")

    def __init__(
        self,
        request: Request,
        keep_alive: bool,
        too_large: bool,
        http_version: str,
        query_string: bytes,
        refusal: bytes | None = None,
    ) -> None:
        self.request = request
        self.keep_alive = keep_alive
        self.too_large = too_large
        self.http_version = http_version
        self.query_string = query_string
        self.refusal = refusal
        self.answered = False  # its reply was written (HttpConnection.reply)


class HttpConnection(asyncio.Protocol):
    """One client connection: parse, hand each request to the door in order, write its reply."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.app = server.app
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        # the request being parsed
        self._url = b""
        self._headers: dict[str, str] = Headers()
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._cut = False  # a refused body read far enough: the rest of this message is ignored
        # A body refused at once (its 413 made before it came): what comes is read (to find its end) and
        # dropped until the close, which waits for it (its end, DISCARD_BYTES, DISCARD_SECONDS) so that the
        # reply is not lost to a reset; a request behind it is never run (on_message_begin).
        self._linger = False
        self._lingered = 0  # bytes read since, counted against DISCARD_BYTES
        self._linger_over = False  # the refused body ended (or DISCARD_BYTES came): close once the 413 is out
        self._head_over = False  # a request line and headers past MAX_HEADER_BYTES stopped the parser
        self._coding_refused: str | None = None  # a transfer coding other than chunked stopped the parser
        self._in_message = False  # between on_message_begin and on_message_complete
        self._begun = 0  # messages begun on this connection
        self._head_seen = 0  # bytes fed while the current message's headers were still coming
        self._continue_owed = False  # a 100 Continue held until the replies before it are written
        self._upgrade: int | None = None  # body bytes still owed by a request that asked to upgrade
        self._upgrade_meta: tuple[bytes, bool, str] = (b"GET", False, "1.1")
        self._broken = False  # a parse error: nothing more is read; its 400 is written in turn
        self._dropping = (
            False  # what comes is a refused body the parser did not frame: dropped while lingering
        )
        # requests parsed and waiting, and whether one is being answered
        self._queue: collections.deque[_Pending] = collections.deque()
        self._busy = False
        self._answered: _Pending | None = None  # the request whose reply was written last
        self._closing = False  # reply to what is in hand, then close (shutdown, Connection: close)
        self._eof = False  # the client sends nothing more: answer what it sent, then close (eof_received)
        self._holds: set[str] = set()  # why reading is paused: "queue", "write", "cut", "broken"
        self._write_paused = False
        self._last_buffered = 0  # the write buffer as the last sweep saw it
        self.reply_size = 0  # the last reply written, in bytes
        self._progress_at = self.loop.time()  # when the client last took bytes of its replies
        self._drained: asyncio.Future[None] | None = None
        self.gone: asyncio.Future[None] = self.loop.create_future()
        # the request clock: "headers" and "body" run against the request's start, "idle" against the last
        # reply; None while a request is being answered (the server is the slow one then)
        self._stage: str | None = "headers"
        self._started = 0.0
        self._deadline = 0.0

    # -- the connection --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
        if not self.server.admission.admit(self, self.server.connections, self.loop.time()):
            self._stage = None  # answered 503 and closed: at the connection bound, none idle
            return
        self.server.connections.add(self)
        self._begin_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.unread.resumed(self)
        self._stage = None
        if not self.gone.done():
            self.gone.set_result(None)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self.transport = None

    def eof_received(self) -> bool:
        """The client will send nothing more (it half-closed its side, or is closing): the requests it sent are
        still answered, in order, and the connection closes after the last (a publish it pipelined is told it
        was committed). A long poll or a stream it was waiting on ends as if it had left, with no reply, and
        the connection closes there: what it queued behind that wait is not run. True keeps the transport
        open for those replies; with nothing to answer, it closes now."""
        self._eof = True
        if not self.gone.done():
            self.gone.set_result(None)
        if self._linger and not self._linger_over:  # no more of the refused body can come
            self._stop_lingering()
        return self._busy or bool(self._queue)

    @property
    def _read_paused(self) -> bool:
        return bool(self._holds)

    def _hold_reading(self, why: str) -> None:
        if not self._holds and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._holds.add(why)

    def _release_reading(self, why: str) -> None:
        if why in self._holds:
            self._holds.discard(why)
            if not self._holds and self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def pause_writing(self) -> None:
        # The client is not taking its replies: no more are made for it (nothing else is dispatched and
        # nothing more is read) until it does, so a client that pipelines and never reads costs a bounded
        # buffer, not the server's memory.
        self._write_paused = True
        self._hold_reading("write")
        self.server.unread.paused(self, self.loop.time())

    def resume_writing(self) -> None:
        self._write_paused = False
        self.server.unread.resumed(self)
        self._progress_at = self.loop.time()
        self._release_reading("write")
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if not self._busy and self._queue:
            self._next()

    async def drain(self) -> None:
        """Wait until the transport takes more (the stream's flow control)."""
        if self._write_paused and self.transport is not None:
            self._drained = self.loop.create_future()
            await self._drained

    def data_received(self, data: bytes) -> None:
        if self._linger:
            self._lingered += len(data)
            if self._lingered > DISCARD_BYTES:
                self._stop_lingering()
                return
        if self._broken or self._dropping:
            return
        if self._upgrade is not None:
            self._upgrade_body(data)
            return
        begun = self._begun
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade_declined(data, int(exc.args[0]) if exc.args else len(data))
            return
        except httptools.HttpParserError as exc:
            self._refuse_parse(exc)
            return
        if self._in_message and self._stage == "headers":
            # httptools holds a header value until it is whole, so a value that never ends would grow
            # without bound: count what was fed while this message's headers are still coming (from the
            # chunk after the one it began in: bounded by the cap plus one read).
            self._head_seen = self._head_seen + len(data) if self._begun == begun else 0
            if self._head_seen > MAX_HEADER_BYTES:
                self._refuse(INVALID_REQUEST.format(detail=HEAD_TOO_LARGE))

    def _upgrade_declined(self, data: bytes, offset: int) -> None:
        """The request asked to switch protocols (h2c, WebSocket). This server speaks HTTP/1.1 only, so it
        answers the request as HTTP/1.1 (a server may ignore Upgrade, RFC 9110 7.8). The parser stopped at
        the headers: the body it did not read is read here, then a fresh parser takes what follows."""
        self.parser = httptools.HttpRequestParser(self)
        if self._broken:
            return
        if (
            self._linger
        ):  # refused on its size (its 413 is made): the body that follows is dropped, never parsed
            self._dropping = True
            return
        if self._upgrade is None:  # no body owed: the request was answered already
            rest = data[offset:]
            if rest:
                self.data_received(rest)
            return
        self._upgrade_body(data[offset:])

    def _upgrade_body(self, data: bytes) -> None:
        assert self._upgrade is not None
        take = data[: self._upgrade]
        self._body.append(take)
        self._size += len(take)
        self._upgrade -= len(take)
        if self._upgrade > 0:
            return
        self._upgrade = None
        self._dispatch_message(self._upgrade_meta)
        rest = data[len(take) :]
        if rest:
            self.data_received(rest)

    # -- the request clock -------------------------------------------------------------------------

    def _begin_request(self) -> None:
        self._stage = "headers"
        self._started = self.loop.time()
        self._deadline = self._started + self.server.header_timeout

    def expired(self, now: float) -> None:
        """The server's sweep found this connection past its deadline (see HttpServer._sweep)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._stage is None:
            return
        if self._stage == "linger":  # the 413 is out: what is left of its body is not waited for any longer
            transport.close()
            return
        if self._queue or self._holds:
            return  # the server stopped reading (pipelined requests wait their turn): not the client's fault
        if self._stage == "idle":
            transport.close()
            return
        if self._stage == "headers":
            reason = f"its request headers did not arrive within {self.server.header_timeout:g} s"
        else:
            reason = f"its request body did not arrive within {self.server.body_timeout:g} s of the request's start"
        who = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("closing the connection from %s: %s", who, reason)
        self._stage = None
        transport.close()

    # -- httptools' callbacks ------------------------------------------------------------------------

    def stalled(self, now: float) -> bool:
        """Whether the client has taken none of its replies' bytes for the server's write timeout: then the
        connection is aborted (a close would wait for the buffer to drain, forever)."""
        transport = self.transport
        if transport is None:
            return False
        buffered = transport.get_write_buffer_size()
        if buffered == 0 or buffered < self._last_buffered:
            self._progress_at = now
        self._last_buffered = buffered
        if not buffered or now - self._progress_at < self.server.write_timeout:
            return False
        who = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info(
            "closing the connection from %s: it took none of %d bytes of replies in %g s",
            who,
            buffered,
            self.server.write_timeout,
        )
        self._stage = None
        transport.abort()
        return True

    def on_message_begin(self) -> None:
        self._in_message = True
        if self._linger:  # behind a refused body, in the same read: parsed only to find the ends, never run
            self._cut = True
            # Its headers go to a table of their own, dropped: the refused request's (which its 413 reads
            # for the Origin and Host policy) must not take them in.
            self._headers = Headers()
            self._header_bytes = 0
            return
        if self._begun:  # a later request on this connection: its clock starts at its first byte
            self._begin_request()
        self._begun += 1
        self._url = b""
        self._headers = Headers()
        self._header_bytes = 0
        self._body = []
        self._size = 0
        self._too_large = False
        self._cut = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise self._head_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > MAX_HEADER_BYTES:
            raise self._head_too_large()
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        known = self._headers.get(key)
        self._headers[key] = text if known is None else f"{known}, {text}"

    def on_headers_complete(self) -> None:
        if self._linger:
            return
        coding = self._headers.get("transfer-encoding")
        if coding is not None and [c.strip().lower() for c in coding.split(",") if c.strip()] != ["chunked"]:
            # The parser frames `gzip, chunked` as chunked and would hand over the still-compressed bytes:
            # stopped here, as a parse error (nothing of this message, or after it, is run).
            self._coding_refused = (
                f"the transfer coding {coding[:100]!r} is not one this server decodes; send the body with "
                "Content-Length, or with Transfer-Encoding: chunked alone"
            )
            raise httptools.HttpParserError(self._coding_refused)
        self._stage = "body"
        self._deadline = self._started + self.server.body_timeout
        declared = self._headers.get("content-length")
        if declared is not None:
            try:
                self._too_large = int(declared.split(",")[0].strip()) > self.server.max_body
            except ValueError:
                pass  # the parser refuses a broken length
        if (
            "100-continue" in self._headers.get("expect", "").lower()
            and self.transport is not None
            and self.parser.get_http_version() == "1.1"  # an HTTP/1.0 client knows no 100 (RFC 9110 10.1.1)
        ):
            if self._too_large:
                self._finish_refused()  # the client waits to be told: no body comes, the 413 does
                return
            if self._busy or self._queue:
                self._continue_owed = True  # an interim reply belongs to the first unanswered request
            else:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self._too_large:
            # Refused on its declared length, at once: the body is dropped while it comes (_finish_refused).
            self._finish_refused(linger=True)

    def on_body(self, body: bytes) -> None:
        if self._cut:
            return
        self._size += len(body)
        if (
            self._size > self.server.max_body
        ):  # no length was declared (chunked), and the bytes passed the cap
            self._too_large = True
            self._body = []
            self._finish_refused(linger=True)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        if self._cut:
            if self._linger:  # the refused body has all come: nothing is left to drain
                self._stop_lingering()
            return
        parser = self.parser
        meta = (parser.get_method(), parser.should_keep_alive(), parser.get_http_version())
        if meta[2] not in SPOKEN_VERSIONS:  # the parser reads HTTP/2.0 (and 0.9) in a request line
            self._refuse(INVALID_REQUEST.format(detail=f"HTTP/{meta[2]} is not spoken here: send HTTP/1.1"))
            return
        if parser.should_upgrade():
            # Its body (if any) was not read by the parser: _upgrade_declined reads it, then dispatches.
            if "chunked" in self._headers.get("transfer-encoding", "").lower():
                self._refuse(
                    INVALID_REQUEST.format(
                        detail="a request that asks to upgrade the connection cannot have a chunked body; "
                        "this server speaks HTTP/1.1 only, send the request without Upgrade"
                    )
                )
                return
            try:
                owed = int(self._headers.get("content-length", "0").split(",")[0].strip() or 0)
            except ValueError:
                owed = 0
            if owed > 0 and not self._too_large:
                self._upgrade = owed
                self._upgrade_meta = meta
                return
        self._dispatch_message(meta)

    def _dispatch_message(self, meta: tuple[bytes, bool, str]) -> None:
        self._stage = None
        url = self._url
        if url[:1] != b"/":
            url = origin_form(url, self._headers)
        cut = url.find(b"?")
        raw_path, query = (url, b"") if cut < 0 else (url[:cut], url[cut + 1 :])
        path = decoded_path(raw_path.decode("latin-1"))
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True) if query else []
        method, keep_alive, http_version = meta
        request = Request(
            method.decode("latin-1").upper(),
            path,
            pairs,
            self._headers,
            b"".join(self._body) if len(self._body) != 1 else self._body[0],
            True,  # door_encodes: this door writes every reply with wire.encode
        )
        pending = _Pending(request, keep_alive, self._too_large, http_version, query)
        self._queue.append(pending)
        if len(self._queue) > MAX_PIPELINED:
            self._hold_reading("queue")
        if not self._busy:
            self._next()

    # -- answering, in order ---------------------------------------------------------------------------

    def _next(self) -> None:
        if self._busy or not self._queue or self.transport is None or self._write_paused:
            return
        pending = self._queue.popleft()
        if len(self._queue) <= MAX_PIPELINED // 2:
            self._release_reading("queue")
        if pending.refusal is not None:
            self.transport.write(pending.refusal)
            self.transport.close()
            return
        self._busy = True
        self.server.dispatch(self, pending)

    def reply(self, pending: _Pending, response: Response, *, close: bool = False) -> None:
        """Write one reply and go on with the next request (or close)."""
        transport = self.transport
        if transport is None:
            return
        close = close or self._closing or not pending.keep_alive
        self.app.metrics.count_request(
            pending.request.method, pending.request.path, response.status, response
        )
        data = encode_response(response, close=close)
        if pending.request.method == "HEAD":
            data = data[: data.index(b"\r\n\r\n") + 4]
        self.reply_size = len(data)  # (held whole by the transport until its last byte is sent: unread.py)
        transport.write(data)
        self._answered = pending
        pending.answered = True
        if self.server.access_log:
            self._log_access(pending, response.status)
        self.done(close=close)

    def done(self, *, close: bool = False) -> None:
        """The request in hand is answered: close, or wait for the next one (keep-alive)."""
        self._busy = False
        transport = self.transport
        if transport is None:
            return
        if close or self._closing:
            if self._linger and not self._closing and not self._linger_over:
                # The refused body may still be coming: read and dropped until it ends, DISCARD_BYTES have
                # come (data_received) or DISCARD_SECONDS from the request's start (expired()). Nothing
                # behind it is answered: the connection is ending.
                self._stage = "linger"
                self._deadline = self._started + DISCARD_SECONDS
                self._queue.clear()
                for why in ("queue", "cut", "broken"):
                    self._release_reading(why)
                return
            transport.close()
            return
        if self._queue:
            self._next()  # (or, while the client is not reading, when it does: resume_writing)
            return
        if self._eof:  # everything the client sent is answered
            transport.close()
            return
        if self._continue_owed:
            self._continue_owed = False
            transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self._in_message and self._upgrade is None:  # a request being read keeps its own clock
            self._stage = "idle"
            self._deadline = self.loop.time() + self.server.keep_alive

    def unanswerable(self, pending: _Pending) -> None:
        """The reply to a call could not be made (a fault, logged): a 503 that says the call's outcome is
        unknown, then the connection closes (what it had written of the reply, if anything, is cut off)."""
        transport = self.transport
        self._busy = False
        if transport is None:
            return
        if self._answered is pending:  # its reply went out; what failed came after: end the connection
            transport.close()
            return
        body = wire.encode({"code": "UNAVAILABLE", "error": UNANSWERABLE, "done": []})
        transport.write(
            status_line(503)
            + CLOCK.date()
            + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            + body
        )
        transport.close()

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the reply in hand."""
        self._closing = True
        if not self._busy and self.transport is not None:
            self.transport.close()

    def _log_access(self, pending: _Pending, status: int) -> None:
        who = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
        req = pending.request
        target = logged_target(req.path, pending.query_string)
        access_log.info('%s - "%s %s HTTP/%s" %d', who, req.method, target, pending.http_version, status)

    # -- refusals the connection makes itself ---------------------------------------------------------

    def _stop_lingering(self) -> None:
        """The refused body ended, or DISCARD_BYTES of it came: close now if its 413 is out, else when it is
        (done()), reading nothing more meanwhile."""
        self._linger_over = True
        if self._stage == "linger" and self.transport is not None:
            self.transport.close()
        else:
            self._hold_reading("cut")

    def _finish_refused(self, *, linger: bool = False) -> None:
        """A body refused on its size: its 413 is made now, then the connection closes. With `linger`, what
        comes of the body meanwhile is read and dropped until that close (see done()); else nothing more is
        read (a client that sent `Expect: 100-continue` sends no body)."""
        self.on_message_complete()
        self._cut = True
        if linger:
            self._linger = True
        else:
            self._hold_reading("cut")

    def _head_too_large(self) -> Exception:
        """What a callback raises to stop the parser at the head's cap. The parser reports it as its own
        callback error (`on_url callback error`): the flag keeps the sentence that names the limit."""
        self._head_over = True
        return httptools.HttpParserError(HEAD_TOO_LARGE)

    def _refuse_parse(self, exc: Exception) -> None:
        if self._head_over:
            sentence = INVALID_REQUEST.format(detail=HEAD_TOO_LARGE)
        elif self._coding_refused is not None:
            sentence = INVALID_REQUEST.format(detail=self._coding_refused)
        elif isinstance(exc, httptools.HttpParserInvalidMethodError):
            sentence = INVALID_METHOD
        elif isinstance(exc, httptools.HttpParserInvalidURLError):
            sentence = INVALID_TARGET
        else:
            detail = str(exc).encode("ascii", "replace").decode("ascii").strip().rstrip(".") or "parse error"
            sentence = INVALID_REQUEST.format(detail=detail)
        self._refuse(sentence)

    def _refuse(self, sentence: str) -> None:
        """What arrived cannot be read as HTTP/1.1: nothing more is read, and a 400 ends the connection once
        the requests before it are answered (their replies are owed first, and in order)."""
        transport = self.transport
        if transport is None or self._broken:
            return
        self._broken = True
        if self._linger:  # after a refused body: no reply for it, the 413's close ends the connection
            self._stop_lingering()
            return
        self._stage = None
        self._upgrade = None
        self._hold_reading("broken")
        body = wire.encode({"code": "INVALID", "error": sentence, "done": []})
        data = (
            status_line(400)
            + CLOCK.date()
            + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            + body
        )
        if self._busy or self._queue:
            self._queue.append(_Pending(Request("", "", [], {}, b""), False, False, "1.1", b"", refusal=data))
            return
        transport.write(data)
        transport.close()


class HttpServer:
    """The listening side: makes connections, routes each request, and drains on shutdown."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout: float,
        body_timeout: float,
        keep_alive: float,
        access_log: bool = False,
        write_timeout: float = WRITE_TIMEOUT,
        max_connections: int | None = None,
    ) -> None:
        self.app = app
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.keep_alive = keep_alive
        self.write_timeout = write_timeout
        self.access_log = access_log
        self.max_body = app.max_body
        self.loop = asyncio.get_running_loop()
        self.connections: set[HttpConnection] = set()
        self.unread = UnreadReplies()  # the replies no client has read, every connection together
        self.admission = Admission(max_connections)  # connections held against the open-files limit
        metrics = getattr(app, "metrics", None)
        if metrics is not None:
            metrics.http_server = self
        self._servers: list[asyncio.AbstractServer] = []
        engine = app.engine
        # The lean door: a callback seat when the engine has one (LoopEngine), else its future.
        self._submit_to: Callable[..., None] | None = getattr(engine, "submit_to", None)
        self._sweeper = self.loop.call_later(self.SWEEP_SECONDS, self._sweep)

    # The request clocks of every connection, looked at four times a second (a deadline moves as a float on
    # the hot path; no timer is made or cancelled per request).
    SWEEP_SECONDS = 0.25

    def _sweep(self) -> None:
        now = self.loop.time()
        try:
            for conn in list(self.connections):
                if conn._stage is not None and now >= conn._deadline:
                    conn.expired(now)
                conn.stalled(now)
            self.unread.shed(now)
        except Exception:  # one connection's fault must not stop the clocks of all the others
            log.exception("checking the connections' time limits failed")
        finally:
            self._sweeper = self.loop.call_later(self.SWEEP_SECONDS, self._sweep)

    async def listen(self, sock: Any) -> None:
        server = await self.loop.create_server(lambda: HttpConnection(self), sock=sock, backlog=2048)
        self._servers.append(server)

    # -- routing ---------------------------------------------------------------------------------

    def dispatch(self, conn: HttpConnection, pending: _Pending) -> None:
        request = pending.request
        path = request.path
        if pending.too_large:
            self._spawn(conn, pending, self._too_large(conn, pending))
        elif path in OPS_PATHS and self.app.ops_routes and request.method not in ("GET", "HEAD", "OPTIONS"):
            refusal = ProtocolError(
                "NOT_FOUND", f"{request.method} is not a method of {path}; use GET or HEAD."
            )
            conn.reply(pending, error_response(refusal))
        elif (path in OPS_PATHS and self.app.ops_routes and request.method in ("GET", "HEAD")) or (
            request.method == "GET" and STREAM_PATH.match(path)
        ):
            self._spawn(conn, pending, self._bridge(conn, pending))
        else:
            self._call(conn, pending)

    def _call(self, conn: HttpConnection, pending: _Pending) -> None:
        """A protocol call: to the engine, and the reply written from its outcome after the commit."""
        app = self.app
        job = app.handle_job

        def deliver(ok: bool, value: Any) -> None:
            try:
                if ok:
                    response, mark = value
                else:
                    response, mark = app.failure(pending.request, value)
                if response.long_poll is not None:
                    self._spawn(conn, pending, self._long_poll(conn, pending, response, mark))
                else:
                    conn.reply(pending, response)
            except Exception:  # the reply could not be made: say so and end the connection, never hang it
                log.exception(
                    "answering a request failed (%s %s)", pending.request.method, pending.request.path
                )
                conn.unanswerable(pending)

        if self._submit_to is not None:
            try:
                self._submit_to(job, (pending.request,), deliver)
            except RuntimeError as exc:  # the engine has stopped (shutting down)
                deliver(False, exc)
            return

        async def through_future() -> None:
            try:
                outcome = await app.engine.submit(job, pending.request)
            except Exception as exc:
                deliver(False, exc)
            else:
                deliver(True, outcome)

        self.loop.create_task(through_future())

    def _spawn(self, conn: HttpConnection, pending: _Pending, work: Any) -> None:
        task = self.loop.create_task(work)

        def finished(done: asyncio.Task[Any]) -> None:
            # A request already answered (a woken long poll's reply is written from the engine's answer, and
            # its task winds down after) leaves its connection alone: it may be serving the next request.
            answered = pending.answered
            if done.cancelled():
                if not answered:
                    conn.done(close=True)
                return
            exc = done.exception()
            if exc is not None:
                log.error(
                    "a request failed unexpectedly (%s %s)",
                    pending.request.method,
                    pending.request.path,
                    exc_info=exc,
                )
                if conn.transport is not None and not answered:
                    conn.transport.close()

        task.add_done_callback(finished)

    async def _long_poll(
        self, conn: HttpConnection, pending: _Pending, response: Response, mark: int
    ) -> None:
        async def receive() -> dict[str, Any]:
            await asyncio.shield(conn.gone)  # a waiter cancelled must not cancel the connection's own
            return {"type": "http.disconnect"}

        replied = False

        def reply_now(answer: Response) -> None:
            # A woken re-check's final reply, written from the engine's answer (MonitorApp._recheck_woken).
            nonlocal replied
            replied = True
            try:
                conn.reply(pending, answer)
            except Exception:  # the reply could not be made: say so and end the connection, never hang it
                log.exception("answering a woken long poll failed (%s)", pending.request.path)
                conn.unanswerable(pending)

        assert response.long_poll is not None
        response.long_poll.reply_now = reply_now
        held = await self.app.hold_long_poll(pending.request, response, mark, receive)
        if replied:
            return
        if held is None:
            conn.done(close=True)  # the client left while waiting
        else:
            conn.reply(pending, held)

    async def _too_large(self, conn: HttpConnection, pending: _Pending) -> None:
        response = await self.app.too_large(pending.request)
        conn.reply(pending, response, close=True)

    async def _bridge(self, conn: HttpConnection, pending: _Pending) -> None:
        """Run the ASGI app for a request that is not hot (the stream, operations routes, other paths)."""
        request = pending.request
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": pending.http_version,
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.path.encode("latin-1", "replace"),
            "query_string": pending.query_string,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
            "client": conn.client,
            "server": None,
        }
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await asyncio.shield(conn.gone)  # a waiter cancelled must not cancel the connection's own
            return {"type": "http.disconnect"}

        state = {"chunked": False, "status": 0, "close": False}

        async def send(message: dict[str, Any]) -> None:
            transport = conn.transport
            if transport is None:
                return
            if message["type"] == "http.response.start":
                headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", ())]
                names = {k for k, _ in headers}
                state["status"] = int(message["status"])
                state["close"] = (
                    conn._closing or not pending.keep_alive or (b"connection", b"close") in headers
                )
                head = [status_line(state["status"]), CLOCK.date()]
                head += [k + b": " + v + b"\r\n" for k, v in headers if k != b"connection"]
                if b"content-length" not in names:
                    state["chunked"] = True
                    head.append(b"transfer-encoding: chunked\r\n")
                if state["close"]:
                    head.append(b"connection: close\r\n")
                head.append(b"\r\n")
                transport.write(b"".join(head))
                return
            body = message.get("body", b"") if request.method != "HEAD" else b""
            more = message.get("more_body", False)
            if state["chunked"]:
                if body:
                    transport.write(b"%x\r\n%s\r\n" % (len(body), body))
                if not more:
                    transport.write(b"0\r\n\r\n")
            elif body:
                transport.write(body)
            await conn.drain()

        await self.app(scope, receive, send)
        if self.access_log:
            conn._log_access(pending, state["status"])
        conn.done(close=bool(state["close"]))

    # -- shutdown ----------------------------------------------------------------------------------

    async def shutdown(self, grace: float) -> None:
        """Stop listening, answer what is in hand, close idle connections, and wait (at most `grace`)."""
        for server in self._servers:
            server.close()
        self.app.begin_shutdown()  # long polls answer now, streams end
        for conn in list(self.connections):
            conn.shutdown()
        deadline = self.loop.time() + grace
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        self._sweeper.cancel()
        for server in self._servers:
            await server.wait_closed()
