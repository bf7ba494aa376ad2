"""How `mp serve` runs its HTTP door: the listening socket, the event loop (uvloop when it is installed), the
server of doors/http/protocol.py with the app's lifespan around it, a drain on SIGINT/SIGTERM, logging stamped
in UTC, the open-file limit, and the JSON codec switch."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.core.repeats import Repeats

GRACEFUL_SHUTDOWN_SECONDS = 5.0  # what a connection still answering gets to finish when the server stops


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP,
    # and without it every reply sent in two writes waits out a delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
        # Not inheritable (Python's default, kept on purpose): nothing mp serve starts (a source's command)
        # may hold the listening socket, or accept on it, or keep the port open after the server exits.
    except OSError:
        sock.close()
        raise
    return sock


def _utc_time(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


# Control characters a client can put into a logged line (a percent-decoded path, a header it sent): written
# as \xNN, so that no line can clear, colour or overwrite an operator's terminal (ESC, a lone CR) or end
# early (NUL). A tab stays a tab. The Unicode line and paragraph separators end a line for many readers of
# a log (Python's splitlines, editors, JSON-lines tools): written as \u2028 and \u2029.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class UTCFormatter(logging.Formatter):
    """Log lines stamped in UTC, RFC 3339 with milliseconds (2026-12-01T09:30:00.123Z)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _utc_time(record)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        # A message with lines of its own (a driver's error, PostgreSQL's CONTEXT) stays one line of the log,
        # so that every line starts with its time; a traceback still follows its line as it is.
        if "\n" in record.message:
            record.message = " | ".join(part.strip() for part in record.message.splitlines() if part.strip())
        if _CONTROL.search(record.message):
            record.message = _CONTROL.sub(_escaped, record.message)
        return super().formatMessage(record)


LOG_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"


def configure_logging(level: str, access_log: bool) -> None:
    """The server's and the engine's loggers on stderr, and the access log (one line per request, when
    asked for) on stdout, every line stamped in UTC."""
    logger = logging.getLogger("monitor_protocol")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(UTCFormatter(LOG_FORMAT))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    access = logging.getLogger("monitor_protocol.access")
    if access_log and not access.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(UTCFormatter("%(asctime)s %(levelname)-8s %(message)s"))
        access.addHandler(handler)
    access.setLevel(logging.INFO if access_log else logging.CRITICAL)
    access.propagate = False


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (not on Windows), else asyncio's own (see _accept_failures)."""
    try:
        import uvloop
    except ImportError:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_accept_failures())
        return loop
    return uvloop.new_event_loop()


def _accept_failures() -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """asyncio's own loop accepts every connection waiting before the server sees one, so a burst can pass
    the connection bound's reserve, and each `accept` that then fails (EMFILE) is logged with its traceback:
    a reviewer's burst of 150 connects wrote 32,629 of them (13 MB). Those go through Repeats (a line as they
    start, then at most one a minute); everything else to the loop's default handler."""
    failing = Repeats(logging.getLogger("monitor_protocol.http"), "accepting connections failed")

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            failing.failed(f"{context.get('exception')} (the open-files limit; asyncio retries in a second)")
            return
        loop.default_exception_handler(context)

    return handle


def serve(
    app: Any,
    sock: socket.socket,
    *,
    header_timeout: float,
    body_timeout: float,
    keep_alive: float,
    access_log: bool,
    max_connections: int | None = None,
    stop_signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
) -> None:
    """Run the app on `sock` until SIGINT or SIGTERM: its startup, the server, then a drain (idle connections
    closed, long polls answered, streams ended, busy connections given GRACEFUL_SHUTDOWN_SECONDS) and its
    shutdown (background tasks stopped, the store closed)."""
    from monitor_protocol.doors.http.ops import GC_PAUSES, settle_heap
    from monitor_protocol.doors.http.protocol import HttpServer

    log = logging.getLogger("monitor_protocol.http")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in stop_signals:
            loop.add_signal_handler(sig, stop.set)
        await app.startup()
        GC_PAUSES.watch()  # from here on (settle_heap's own full collection is the first it counts)
        try:
            log.debug("%d objects of startup kept out of the collector's walks", settle_heap())
            server = HttpServer(
                app,
                header_timeout=header_timeout,
                body_timeout=body_timeout,
                keep_alive=keep_alive,
                access_log=access_log,
                max_connections=max_connections,
            )
            await server.listen(sock)
            log.info("Application startup complete.")
            try:
                await stop.wait()
            finally:
                log.info("Shutting down")
                await server.shutdown(GRACEFUL_SHUTDOWN_SECONDS)
                await app.shutdown()
        finally:
            GC_PAUSES.unwatch()
            for sig in stop_signals:
                loop.remove_signal_handler(sig)

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


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


FAST_JSON_ENV = "MP_JSON"  # "json" forces the standard library's codec (for comparison)


def install_fast_json() -> str:
    """Encode replies and stored rows with orjson when it is installed (the `server`
    extra): the same bytes as the standard library's compact JSON, 10-20 times
    faster. Requests are parsed by orjson first too (as strict as RFC 8259), under the engine's own rules
    (wire.loads falls back on them for whatever orjson refuses or may judge otherwise). Returns what the log
    says."""
    if os.environ.get(FAST_JSON_ENV, "").strip().lower() == "json":
        wire.use_codec(wire.STDLIB_CODEC)
        return f"standard library ({FAST_JSON_ENV}=json)"
    try:
        import orjson
    except ImportError:
        wire.use_codec(wire.STDLIB_CODEC)
        return "standard library (pip install orjson, the [server] extra, for a faster one)"
    stdlib = wire.STDLIB_CODEC.encode

    def encode(value: Any) -> bytes:
        try:
            return orjson.dumps(value)
        except TypeError:  # a value orjson does not take (an integer beyond 64 bits): never a checked one
            # (nor a reply with raw rows: their events hold no integer beyond 2^53, the engine's limit, and
            # the reply's own numbers are seqs and counts)
            return stdlib(value)

    # orjson.Fragment (orjson 3.9+): a stored row's JSON text written into a reply as is
    raw = getattr(orjson, "Fragment", None)
    wire.use_codec(wire.Codec("orjson", encode, orjson.loads, parse=orjson.loads, raw=raw))
    return f"orjson {getattr(orjson, '__version__', '')}".strip()
