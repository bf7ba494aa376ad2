"""`mp serve`: the protocol over HTTP, durable on SQLite (PROTOCOL.md sections 5, 8, 9, 10)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from typing import Any

from ..vocab import MAX_LIMIT, MAX_WAIT_SECONDS

HELP = "run the Monitor Protocol HTTP server on a SQLite database"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8130
DEFAULT_DB = "monitor-protocol.db"
DEFAULT_MAX_BODY = 1 << 20
# PROTOCOL.md section 10, time limits: headers within 10 s and a body within 30 s of the request's start;
# an idle keep-alive connection stays open at least 60 s (uvicorn's own default is 5 s).
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE = 65.0
PAUSED_RECHECK_SECONDS = 1.0
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class _Stop(Exception):
    """Raised by our own SIGINT/SIGTERM handlers outside uvicorn's own (before start, after shutdown)."""


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free port)",
    )
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        metavar="PATH",
        help=f"SQLite database file (default ./{DEFAULT_DB}); ':memory:' for a throwaway server",
    )
    parser.add_argument(
        "--registration-token",
        default=None,
        metavar="TOKEN",
        help="require this token to create monitors (creations with it are attested)",
    )
    parser.add_argument(
        "--allow-admin",
        nargs="?",
        const="",
        default=None,
        metavar="TOKEN",
        help="enable POST /mp/v0/admin/compact and GET /mp/v0/admin/snapshot behind this "
        "bearer token (a token is minted and printed when none is given)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser Origin allowed to call the server (repeatable), e.g. http://localhost:5173",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="an extra Host name accepted (repeatable); loopback binds accept only local names",
    )
    parser.add_argument(
        "--max-body",
        type=int,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help=f"largest request body accepted (default {DEFAULT_MAX_BODY})",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="SECONDS",
        help="close a connection whose request line and headers have not all arrived this long after the "
        f"request began (default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="SECONDS",
        help="close a connection whose request body has not all arrived this long after the request began "
        f"(default {DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--keep-alive",
        type=float,
        default=DEFAULT_KEEP_ALIVE,
        metavar="SECONDS",
        help=f"how long an idle keep-alive connection stays open (default {DEFAULT_KEEP_ALIVE:g})",
    )
    parser.add_argument(
        "--allow-sink",
        action="append",
        default=[],
        metavar="HOST",
        help="let HTTP push deliver to this otherwise refused sink (loopback, private, link-local...): "
        "a host name (exactly that name), an IP address or a CIDR network such as 10.0.0.0/8 (repeatable)",
    )
    parser.add_argument(
        "--retire-after-mute",
        type=int,
        default=None,
        metavar="SECONDS",
        help="server-wide override of retire_after_mute_seconds (default 604800 per subscription)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn log level (default info)",
    )


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts_for(host: str, extra: list[str]) -> set[str] | None:
    """The Host names accepted: local names on a loopback bind (DNS rebinding), else only what was allowed."""
    hosts = {h.strip().lower() for h in extra if h.strip()}
    if is_loopback(host):
        return hosts | set(LOOPBACK_NAMES) | {host.strip("[]").lower()}
    if hosts:
        if host not in ("0.0.0.0", "::", ""):
            hosts.add(host.strip("[]").lower())
        return hosts
    return None


def _bind(host: str, port: int) -> socket.socket:
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


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def _draining_server_class() -> type:
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


def _log_engine_errors(level: str) -> None:
    """The engine's and the door's own loggers print beside uvicorn's, so a crash is never silent."""
    logger = logging.getLogger("monitor_protocol")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
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


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signum)


def run(name: str, args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("mp serve needs uvicorn: pip install 'monitor-protocol[server]'", file=sys.stderr)
        return 1
    from .. import netguard
    from ..binding.asgi import create_app
    from ..binding.rest import RestRouter
    from ..push import delivery_task
    from ..service import MonitorService
    from ..store.sqlite import SQLiteStore, StoreLocked

    if args.max_body < 1:
        print("mp serve: --max-body must be a positive number of bytes", file=sys.stderr)
        return 2
    if args.retire_after_mute is not None and args.retire_after_mute < 1:
        print("mp serve: --retire-after-mute must be a positive number of seconds", file=sys.stderr)
        return 2
    for flag in ("header_timeout", "body_timeout", "keep_alive"):
        value = getattr(args, flag)
        if not (value > 0 and value < 1e7):
            print(
                f"mp serve: --{flag.replace('_', '-')} must be a positive number of seconds", file=sys.stderr
            )
            return 2
    if args.body_timeout < args.header_timeout:
        print("mp serve: --body-timeout must be at least --header-timeout", file=sys.stderr)
        return 2
    for entry in args.allow_sink:
        problem = netguard.check_allow_entry(entry)
        if problem is not None:
            print(f"mp serve: {problem}", file=sys.stderr)
            return 2
    open_files = raise_open_file_limit()

    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    db = args.db if args.db == ":memory:" else os.path.abspath(args.db)
    store = None
    app = None
    try:
        try:
            store = SQLiteStore(db)
        except StoreLocked as exc:
            print(f"mp serve: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:
            print(f"mp serve: cannot open the database {db}: {exc}", file=sys.stderr)
            return 1
        admin_token = None
        if args.allow_admin is not None:
            admin_token = args.allow_admin or secrets.token_urlsafe(32)
        hosts = allowed_hosts_for(args.host, args.allow_host)
        service = MonitorService(
            store,
            clock=time.time,
            registration_token=args.registration_token,
            retire_after_mute_seconds=args.retire_after_mute,
            allowed_sinks=tuple(args.allow_sink),
        )
        router = RestRouter(
            service,
            admin_token=admin_token,
            allowed_origins=tuple(args.allow_origin),
            allowed_hosts=hosts,
            max_body=args.max_body,
        )
        monitors = len(store.list_monitors())
        try:
            sock = _bind(args.host, args.port)
        except OSError as exc:
            print(
                f"mp serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr
            )
            return 1
        port = sock.getsockname()[1]
        # HTTP push (protocol: http subscriptions) runs beside the server; idle while there are none.
        app = create_app(
            service, router, store=store, max_body=args.max_body, background_tasks=[delivery_task]
        )

        url = _url(args.host, port)
        print(f"Monitor Protocol server on {url}/mp/v0  (discover: {url}/mp/v0/discover)")
        print(f"database: {db}" + ("  (in memory: nothing survives a restart)" if db == ":memory:" else ""))
        print(f"monitors: {monitors}")
        mute = (
            f"{args.retire_after_mute}s"
            if args.retire_after_mute is not None
            else "604800s (per subscription)"
        )
        print(
            f"limits: max_body={args.max_body} bytes, max_limit={MAX_LIMIT}, max_wait={MAX_WAIT_SECONDS}s, "
            f"retire_after_mute={mute}, header_timeout={args.header_timeout:g}s, "
            f"body_timeout={args.body_timeout:g}s, keep_alive={args.keep_alive:g}s"
            + (f", open_files={open_files}" if open_files else "")
        )
        print(
            "registration: " + ("token required" if args.registration_token else "open (monitors unattested)")
        )
        print(f"admin: enabled, token {admin_token}" if admin_token else "admin: disabled")
        print(
            "origins allowed: "
            + (", ".join(args.allow_origin) or "none (requests with an Origin are refused)")
        )
        print("hosts allowed: " + (", ".join(sorted(hosts)) if hosts is not None else "any"))
        print("push sinks allowed beyond public addresses: " + (", ".join(args.allow_sink) or "none"))
        sys.stdout.flush()

        config = uvicorn.Config(
            app,
            http=hardened_protocol_class(args.header_timeout, args.body_timeout),
            lifespan="on",
            log_level=args.log_level,
            access_log=True,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=args.keep_alive,
        )
        server = _draining_server_class()(config, app)
        _log_engine_errors(args.log_level)
        try:
            server.run(sockets=[sock])
        except _Stop:
            pass  # uvicorn re-raises the signal that stopped it once it has shut down cleanly
        finally:
            sock.close()
        return 0
    except _Stop:
        return 0
    finally:
        # The lifespan closed the store already on a clean stop; this covers every other way out.
        try:
            if app is not None:
                app.engine.stop()
                app.close_store()
            elif store is not None:
                store.close()
        except Exception as exc:
            print(f"mp serve: closing the database failed: {exc}", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if store is not None:
            print("mp serve: stopped, database closed", file=sys.stderr)
