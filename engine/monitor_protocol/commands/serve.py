"""`mp serve`: the protocol over HTTP, durable on SQLite (PROTOCOL.md sections 5, 8, 9, 10)."""

from __future__ import annotations

import argparse
import ipaddress
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


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signum)


def run(name: str, args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("mp serve needs uvicorn: pip install 'monitor-protocol[server]'", file=sys.stderr)
        return 1
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
            f"retire_after_mute={mute}"
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
        sys.stdout.flush()

        config = uvicorn.Config(
            app, lifespan="on", log_level=args.log_level, access_log=True, timeout_graceful_shutdown=5
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
