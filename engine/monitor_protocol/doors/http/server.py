"""How `mp serve` runs its HTTP door on uvicorn: the listening socket, uvicorn's httptools protocol hardened with
the section 10 time limits and protocol-shaped parse errors, a server that drains long polls and streams before
it waits for connections, logging stamped in UTC, the open-file limit, and the JSON codec switch."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from typing import Any

from monitor_protocol.core import wire

PAUSED_RECHECK_SECONDS = 1.0


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP,
    # and without it every reply sent in two writes waits out a delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def draining_server_class() -> type:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn waits for open connections before the lifespan shutdown; tell the app first, so
        long polls answer and SSE streams end at once instead of running into the graceful timeout."""

        def __init__(self, config: Any, app: Any) -> None:
            super().__init__(config)
            self.mp_app = app

        async def shutdown(self, sockets: Any = None) -> None:
            self.mp_app.begin_shutdown()
            await super().shutdown(sockets=sockets)

    return DrainingServer


def _utc_time(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class UTCFormatter(logging.Formatter):
    """Log lines stamped in UTC, RFC 3339 with milliseconds (2026-12-01T09:30:00.123Z)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _utc_time(record)


LOG_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging (dictConfig) with a UTC timestamp on every line, the access log included."""
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    class Default(DefaultFormatter):
        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
            return _utc_time(record)

    class Access(AccessFormatter):
        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
            return _utc_time(record)

    upper = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {"()": Default, "fmt": "%(asctime)s %(levelprefix)s %(message)s", "use_colors": None},
            "access": {
                "()": Access,
                "fmt": '%(asctime)s %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
                "use_colors": None,
            },
            "engine": {"()": UTCFormatter, "fmt": LOG_FORMAT},
        },
        "handlers": {
            "default": {
                "formatter": "default",
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
            },
            "access": {"formatter": "access", "class": "logging.StreamHandler", "stream": "ext://sys.stdout"},
            "engine": {"formatter": "engine", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": upper, "propagate": False},
            "uvicorn.error": {"level": upper},
            "uvicorn.access": {"handlers": ["access"], "level": upper, "propagate": False},
            # The engine's and the doors' own loggers print beside uvicorn's, so a crash is never silent.
            "monitor_protocol": {"handlers": ["engine"], "level": upper, "propagate": False},
        },
    }


def log_engine_errors(level: str) -> None:
    """The engine's loggers on stderr with timestamps, before uvicorn configures logging (and after it
    when an embedding program configured logging its own way)."""
    logger = logging.getLogger("monitor_protocol")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(UTCFormatter(LOG_FORMAT))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def raise_open_file_limit() -> int | None:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit (every connection is a file descriptor)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    candidates = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 1 << 16, 10240]
    for target in candidates:
        if target <= soft and soft != resource.RLIM_INFINITY:
            return soft
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            continue  # e.g. macOS refuses more than kern.maxfilesperproc: try a smaller one
    return soft


INVALID_METHOD = (
    "The HTTP method is not one this server knows; send GET, POST or OPTIONS to a route under /mp/v0 "
    "(GET /mp/v0/discover lists what the server offers)."
)
INVALID_TARGET = (
    "The request target is not a valid path; send a request to a route under /mp/v0 "
    "(GET /mp/v0/discover lists what the server offers)."
)
INVALID_REQUEST = (
    "The request is not valid HTTP/1.1 ({detail}); send a well-formed request line, headers and body "
    "to a route under /mp/v0 (GET /mp/v0/discover lists what the server offers)."
)


def hardened_protocol_class(header_timeout: float, body_timeout: float) -> type:
    """uvicorn's httptools protocol with the section 10 time limits and protocol-shaped parse errors.

    A request begins when its connection is made (the first request) or when its first byte arrives (every
    later one); its headers must be complete within ``header_timeout`` and its body within ``body_timeout``
    of that moment, else the connection is closed. Between requests only uvicorn's keep-alive timer runs.
    A request httptools cannot parse (an unknown method, a malformed request line or header) is answered with
    the protocol's error body, 400 INVALID as JSON, instead of uvicorn's plain-text 400.
    """
    import httptools
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    request_log = logging.getLogger("monitor_protocol.http")

    class HardenedHttpToolsProtocol(HttpToolsProtocol):
        HEADER_TIMEOUT = header_timeout
        BODY_TIMEOUT = body_timeout

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._mp_timer: asyncio.TimerHandle | None = None
            self._mp_started = 0.0
            self._mp_stage: str | None = None  # "headers", "body", or None between requests

        # -- the request clock ------------------------------------------------------------------------

        def _mp_arm(self, stage: str, delay: float) -> None:
            self._mp_cancel()
            self._mp_stage = stage
            self._mp_timer = self.loop.call_later(max(0.0, delay), self._mp_expired)

        def _mp_cancel(self) -> None:
            if self._mp_timer is not None:
                self._mp_timer.cancel()
                self._mp_timer = None

        def _mp_begin(self) -> None:
            self._mp_started = self.loop.time()
            self._mp_arm("headers", self.HEADER_TIMEOUT)

        def _mp_expired(self) -> None:
            self._mp_timer = None
            transport = self.transport
            if transport is None or transport.is_closing() or self._mp_stage is None:
                return
            if self.flow is not None and self.flow.read_paused:
                # The server stopped reading (a pipelined request waits, or the app is behind): the
                # client is not the slow one. Look again shortly.
                self._mp_timer = self.loop.call_later(PAUSED_RECHECK_SECONDS, self._mp_expired)
                return
            if self._mp_stage == "headers":
                reason = f"its request headers did not arrive within {self.HEADER_TIMEOUT:g} s"
            else:
                reason = (
                    f"its request body did not arrive within {self.BODY_TIMEOUT:g} s of the request's start"
                )
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            request_log.info("closing the connection from %s: %s", client, reason)
            self._mp_stage = None
            transport.close()

        # -- uvicorn's hooks ---------------------------------------------------------------------------

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._mp_begin()

        def connection_lost(self, exc: Exception | None) -> None:
            self._mp_cancel()
            self._mp_stage = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._mp_stage is None:  # a later request on this connection: its clock starts now
                self._mp_begin()

        def on_headers_complete(self) -> None:
            self._mp_arm("body", self._mp_started + self.BODY_TIMEOUT - self.loop.time())
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._mp_cancel()
            self._mp_stage = None
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            # Called from uvicorn's `except httptools.HttpParserError` block: the parser's error is current.
            exc = sys.exc_info()[1]
            if isinstance(exc, httptools.HttpParserInvalidMethodError):
                sentence = INVALID_METHOD
            elif isinstance(exc, httptools.HttpParserInvalidURLError):
                sentence = INVALID_TARGET
            else:
                detail = str(exc or msg).encode("ascii", "replace").decode("ascii").strip() or msg
                sentence = INVALID_REQUEST.format(detail=detail.rstrip("."))
            body = json.dumps({"code": "INVALID", "error": sentence, "done": []}).encode()
            content = [STATUS_LINE[400]]
            for name, value in self.server_state.default_headers:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend(
                [
                    b"content-type: application/json\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n",
                    b"\r\n",
                    body,
                ]
            )
            self._mp_cancel()
            self._mp_stage = None
            self.transport.write(b"".join(content))
            self.transport.close()

    return HardenedHttpToolsProtocol


FAST_JSON_ENV = "MP_JSON"  # "json" forces the standard library's codec (for comparison)


def install_fast_json() -> str:
    """Encode replies and stored rows with orjson when it is installed (`pip install
    'monitor-protocol[server]'`): the same bytes as the standard library's compact JSON, 10-20 times
    faster. Requests are still parsed by the engine's strict parser. Returns what the log says."""
    if os.environ.get(FAST_JSON_ENV, "").strip().lower() == "json":
        wire.use_codec(wire.STDLIB_CODEC)
        return f"standard library ({FAST_JSON_ENV}=json)"
    try:
        import orjson
    except ImportError:
        wire.use_codec(wire.STDLIB_CODEC)
        return "standard library (pip install 'monitor-protocol[server]' adds orjson, faster)"
    stdlib = wire.STDLIB_CODEC.encode

    def encode(value: Any) -> bytes:
        try:
            return orjson.dumps(value)
        except TypeError:  # a value orjson does not take (an integer beyond 64 bits): never a checked one
            return stdlib(value)

    wire.use_codec(wire.Codec("orjson", encode, orjson.loads))
    return f"orjson {getattr(orjson, '__version__', '')}".strip()
