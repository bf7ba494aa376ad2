"""`mp serve`: the protocol over HTTP, durable on SQLite (PROTOCOL.md sections 5, 8, 9, 10)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
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

from monitor_protocol.core import wire
from monitor_protocol.core.vocab import DEFAULT_MAX_BODY, MAX_LIMIT, MAX_WAIT_SECONDS

HELP = "run the Monitor Protocol HTTP server on a SQLite database"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8130
DEFAULT_DB = "monitor-protocol.db"
# PROTOCOL.md section 10, time limits: headers within 10 s and a body within 30 s of the request's start;
# an idle keep-alive connection stays open at least 60 s (uvicorn's own default is 5 s).
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE = 65.0
PAUSED_RECHECK_SECONDS = 1.0
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class _Stop(Exception):
    """Raised by our own SIGINT/SIGTERM handlers outside uvicorn's own (before start, after shutdown)."""


class ConfigError(Exception):
    """A setting from the environment or the config file that cannot be used (exit status 2)."""


# -- configuration ---------------------------------------------------------------------------------------
#
# Every setting comes from, in this order: its flag, its environment variable, the --config file (TOML, the
# flag's name as key, `-` or `_`), the default. Tokens can so stay off argv (which `ps` shows to every user).

LIST_SETTINGS = ("allow_origin", "allow_host", "allow_sink")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# setting -> (environment variable, kind)
SETTINGS: dict[str, tuple[str, str]] = {
    "host": ("MP_HOST", "str"),
    "port": ("MP_PORT", "int"),
    "db": ("MP_DB", "str"),
    "registration_token": ("MP_REGISTRATION_TOKEN", "str"),
    "allow_admin": ("MP_ADMIN_TOKEN", "admin"),
    "metrics_token": ("MP_METRICS_TOKEN", "str"),
    "allow_origin": ("MP_ALLOW_ORIGIN", "list"),
    "allow_host": ("MP_ALLOW_HOST", "list"),
    "allow_sink": ("MP_ALLOW_SINK", "list"),
    "max_body": ("MP_MAX_BODY", "int"),
    "header_timeout": ("MP_HEADER_TIMEOUT", "float"),
    "body_timeout": ("MP_BODY_TIMEOUT", "float"),
    "keep_alive": ("MP_KEEP_ALIVE", "float"),
    "retire_after_mute": ("MP_RETIRE_AFTER_MUTE", "int"),
    "log_level": ("MP_LOG_LEVEL", "level"),
    "access_log": ("MP_ACCESS_LOG", "bool"),
}
CONFIG_ENV = "MP_CONFIG"
CONFIG_ALIASES = {"admin_token": "allow_admin"}  # the file may say admin_token, like MP_ADMIN_TOKEN
RESTART_ONLY = (
    "host",
    "port",
    "db",
    "registration_token",
    "allow_admin",
    "allow_sink",
    "max_body",
    "header_timeout",
    "body_timeout",
    "keep_alive",
    "retire_after_mute",
    "log_level",
    "access_log",
)


def _mark_given(namespace: argparse.Namespace, dest: str) -> None:
    given = set(getattr(namespace, "_given", ()) or ())
    given.add(dest)
    namespace._given = given


class _StoreGiven(argparse.Action):
    """argparse's store, remembering that the flag was on the command line (flags win over env and file)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, values)
        _mark_given(namespace, self.dest)


class _TrueGiven(argparse.Action):
    """A flag that switches a setting on, remembering that it was given (flags win over env and file)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, True)
        _mark_given(namespace, self.dest)


class _AppendGiven(argparse.Action):
    """argparse's append (a fresh list, never the default's), remembering that the flag was given."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None):
        given = self.dest in (getattr(namespace, "_given", ()) or ())
        items = list(getattr(namespace, self.dest) or []) if given else []
        items.append(values)
        setattr(namespace, self.dest, items)
        _mark_given(namespace, self.dest)


def _convert(name: str, kind: str, value: Any, where: str) -> Any:
    """One setting's value from a string (environment) or a TOML value (config file)."""
    text = isinstance(value, str)
    try:
        if kind == "str":
            if not text:
                raise ValueError("expected a string")
            return value
        if kind == "admin":  # a token, or true to mint one, or false for off
            if isinstance(value, bool):
                return "" if value else None
            if not text or not value:
                raise ValueError("expected a token (a non-empty string), or true to mint one")
            return value
        if kind == "list":
            items = value.split(",") if text else value
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError("expected a list of strings (or one comma-separated string)")
            return [i.strip() for i in items if i.strip()]
        if kind == "int":
            if isinstance(value, bool) or not (text or isinstance(value, int)):
                raise ValueError("expected an integer")
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not (text or isinstance(value, int | float)):
                raise ValueError("expected a number")
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            word = value.strip().lower() if text else None
            if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError("expected true or false (1/0, yes/no, on/off)")
            return word in ("1", "true", "yes", "on")
        if kind == "level":
            level = str(value).lower() if text else None
            if level not in LOG_LEVELS:
                raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
            return level
    except ValueError as exc:
        # Never echo what might be a token (a mistyped one is still a secret): name its type only.
        secret = "token" in name.lower() or "admin" in name.lower() or "token" in where.lower()
        shown = f"a value of type {type(value).__name__}" if secret else repr(value)
        raise ConfigError(f"{where}: {exc} (got {shown})") from None
    raise AssertionError(kind)


def read_config_file(path: str) -> dict[str, Any]:
    """The TOML config file as settings (keys are the flags' names; `[serve]` may hold them too)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the config file {path} is not valid TOML: {exc}") from None
    if isinstance(data.get("serve"), dict):
        data = {**{k: v for k, v in data.items() if k != "serve"}, **data["serve"]}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        name = CONFIG_ALIASES.get(name, name)
        if name not in SETTINGS:
            known = ", ".join(sorted(SETTINGS))
            raise ConfigError(f"{path}: unknown setting {key!r} (known: {known})")
        out[name] = _convert(name, SETTINGS[name][1], value, f"{path}: {key}")
    return out


def resolve_settings(
    args: argparse.Namespace, environ: Any = None
) -> tuple[argparse.Namespace, dict[str, str]]:
    """The settings in force and where each came from ("--flag", "MP_X", "config FILE" or "default")."""
    environ = os.environ if environ is None else environ
    given = set(getattr(args, "_given", ()) or ())
    config_path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    from_file = read_config_file(config_path) if config_path else {}
    settings = argparse.Namespace(**vars(args))
    settings.config = config_path
    sources: dict[str, str] = {}
    for name, (env, kind) in SETTINGS.items():
        if name in given:
            sources[name] = "--" + name.replace("_", "-")
        elif environ.get(env, "") != "":
            setattr(settings, name, _convert(name, kind, environ[env], env))
            sources[name] = env
        elif name in from_file:
            setattr(settings, name, from_file[name])
            sources[name] = f"config {config_path}"
        else:
            sources[name] = "default"
        if name in LIST_SETTINGS:
            setattr(settings, name, list(getattr(settings, name, None) or []))
    return settings, sources


def fingerprint(token: str) -> str:
    """A short, stable name for a token in logs (never the token): the first 8 hex digits of its SHA-256."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:8]


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    s, a = _StoreGiven, _AppendGiven
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"a TOML file of settings, the flags' names as keys (env {CONFIG_ENV}); flags win over the "
        "environment (MP_HOST, MP_PORT, MP_DB, MP_ADMIN_TOKEN, ...), which wins over the file",
    )
    parser.add_argument(
        "--host",
        action=s,
        default=DEFAULT_HOST,
        help=f"address to listen on (env MP_HOST, default {DEFAULT_HOST})",
    )
    parser.add_argument(
        "--port",
        action=s,
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (env MP_PORT, default {DEFAULT_PORT}; 0 picks a free port)",
    )
    parser.add_argument(
        "--db",
        action=s,
        default=DEFAULT_DB,
        metavar="PATH|URL",
        help=f"SQLite database file (env MP_DB, default ./{DEFAULT_DB}); ':memory:' for a throwaway server; "
        "or postgresql://user@host:port/dbname, which any number of servers may share (docs/scale-out.md; "
        "the password from the URL, PGPASSWORD or ~/.pgpass)",
    )
    parser.add_argument(
        "--registration-token",
        action=s,
        default=None,
        metavar="TOKEN",
        help="require this token to create monitors (creations with it are attested); "
        "env MP_REGISTRATION_TOKEN keeps it off the command line",
    )
    parser.add_argument(
        "--allow-admin",
        action=s,
        nargs="?",
        const="",
        default=None,
        metavar="TOKEN",
        help="enable POST /mp/v0/admin/compact and GET /mp/v0/admin/snapshot behind this "
        "bearer token (env MP_ADMIN_TOKEN keeps it off the command line; without a value a token is "
        "minted and written to a file readable only by you, never printed)",
    )
    parser.add_argument(
        "--metrics-token",
        action=s,
        default=None,
        metavar="TOKEN",
        help="bearer token for GET /metrics (env MP_METRICS_TOKEN); without one, /metrics answers loopback "
        "clients only (and the admin token)",
    )
    parser.add_argument(
        "--allow-origin",
        action=a,
        default=[],
        metavar="ORIGIN",
        help="a browser Origin allowed to call the server (repeatable; env MP_ALLOW_ORIGIN, comma-separated; "
        "re-read on SIGHUP), e.g. http://localhost:5173",
    )
    parser.add_argument(
        "--allow-host",
        action=a,
        default=[],
        metavar="HOST",
        help="an extra Host name accepted (repeatable; env MP_ALLOW_HOST; re-read on SIGHUP); "
        "loopback binds accept only local names",
    )
    parser.add_argument(
        "--max-body",
        action=s,
        type=int,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help=f"largest request body accepted (env MP_MAX_BODY, default {DEFAULT_MAX_BODY})",
    )
    parser.add_argument(
        "--header-timeout",
        action=s,
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="SECONDS",
        help="close a connection whose request line and headers have not all arrived this long after the "
        f"request began (env MP_HEADER_TIMEOUT, default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--body-timeout",
        action=s,
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="SECONDS",
        help="close a connection whose request body has not all arrived this long after the request began "
        f"(env MP_BODY_TIMEOUT, default {DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--keep-alive",
        action=s,
        type=float,
        default=DEFAULT_KEEP_ALIVE,
        metavar="SECONDS",
        help="how long an idle keep-alive connection stays open "
        f"(env MP_KEEP_ALIVE, default {DEFAULT_KEEP_ALIVE:g})",
    )
    parser.add_argument(
        "--access-log",
        action=_TrueGiven,
        nargs=0,
        default=False,
        help="log one line per request (off by default: at a few thousand requests a second the access "
        "log costs about a quarter of the server's time; env MP_ACCESS_LOG=true)",
    )
    parser.add_argument(
        "--allow-sink",
        action=a,
        default=[],
        metavar="HOST",
        help="let HTTP push deliver to this otherwise refused sink (loopback, private, link-local...): "
        "a host name (exactly that name), an IP address or a CIDR network such as 10.0.0.0/8 "
        "(repeatable; env MP_ALLOW_SINK, comma-separated)",
    )
    parser.add_argument(
        "--retire-after-mute",
        action=s,
        type=int,
        default=None,
        metavar="SECONDS",
        help="server-wide override of retire_after_mute_seconds (env MP_RETIRE_AFTER_MUTE; "
        "default 604800 per subscription)",
    )
    parser.add_argument(
        "--log-level",
        action=s,
        default="info",
        choices=LOG_LEVELS,
        help="log level of the server and the engine (env MP_LOG_LEVEL, default info)",
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


def _log_engine_errors(level: str) -> None:
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


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signum)


def _source_note(source: str) -> str:
    if source.startswith("--"):
        return f"from {source} on the command line"
    return f"from {source}" if source != "default" else "default"


def _argv_warning(name: str, source: str, env: str) -> str | None:
    if not source.startswith("--"):
        return None
    return (
        f"warning: the {name} was given on the command line, where every local user can read it (ps); "
        f"put it in {env} or the --config file instead"
    )


def open_postgres(url: str) -> Any:
    from monitor_protocol.store.postgres import PostgresStore

    return PostgresStore(url)


def _share_store(app: Any) -> None:
    """On startup, with a shared store: hear the other servers' appends and wake this server's readers
    (after a reconnection every parked reader re-checks), and take part in electing who sweeps. What is
    heard runs on the engine thread, in order with the pulls: a pull that read the log before another
    server's commit takes its mark before that commit is counted, so it parks and is woken, never missed."""

    def heard(monitor_id: str, head: int) -> None:
        app.engine.post(app.service.heard_append, monitor_id, head)

    def recheck_all() -> None:
        app.engine.post(app.waiters.recheck_all)

    app.store.listen(heard, recheck_all)
    app.store.start_leader_election()


def write_token_file(db: str, token: str) -> str:
    """Write a minted token where only this user can read it and return the path: `<db>.admin-token`
    (created 0600, replacing an old one), or a fresh temporary file for an in-memory database."""
    if db == ":memory:":
        import tempfile

        fd, path = tempfile.mkstemp(prefix="mp-admin-token-")  # 0600, created exclusively
    else:
        path = db + ".admin-token"
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def validate(cfg: argparse.Namespace) -> str | None:
    """The first problem with the settings (an operator's sentence), or None."""
    from monitor_protocol.core import netguard

    if not (0 <= cfg.port <= 65535):
        return "--port must be between 0 and 65535"
    if cfg.max_body < 1:
        return "--max-body must be a positive number of bytes"
    if cfg.retire_after_mute is not None and cfg.retire_after_mute < 1:
        return "--retire-after-mute must be a positive number of seconds"
    for flag in ("header_timeout", "body_timeout", "keep_alive"):
        value = getattr(cfg, flag)
        if not (value > 0 and value < 1e7):
            return f"--{flag.replace('_', '-')} must be a positive number of seconds"
    if cfg.body_timeout < cfg.header_timeout:
        return "--body-timeout must be at least --header-timeout"
    for entry in cfg.allow_sink:
        problem = netguard.check_allow_entry(entry)
        if problem is not None:
            return problem
    return None


class Reloader:
    """SIGHUP: re-read the environment and the --config file and apply what can change while serving
    (allowed origins and hosts, the metrics token) without dropping a connection; the rest is reported
    as needing a restart. A file that does not parse changes nothing."""

    def __init__(self, flags: argparse.Namespace, cfg: argparse.Namespace, router: Any, app: Any) -> None:
        self.flags, self.cfg, self.router, self.app = flags, cfg, router, app
        self.log = logging.getLogger("monitor_protocol.serve")
        self.count = 0

    def __call__(self) -> None:
        try:
            fresh, _sources = resolve_settings(self.flags)
        except ConfigError as exc:
            self.log.error("SIGHUP: configuration not reloaded, the running one stays in force: %s", exc)
            return
        self.count += 1
        origins = {o.rstrip("/") for o in fresh.allow_origin}
        hosts = allowed_hosts_for(self.cfg.host, fresh.allow_host)
        # Whole new sets, swapped in one assignment each: the engine thread sees the old or the new one.
        self.router.allowed_origins = origins
        self.router.allowed_hosts = {h.lower() for h in hosts} if hosts is not None else None
        self.app.metrics_token = fresh.metrics_token
        pending = [
            name for name in RESTART_ONLY if getattr(fresh, name, None) != getattr(self.cfg, name, None)
        ]
        self.cfg.allow_origin, self.cfg.allow_host = fresh.allow_origin, fresh.allow_host
        self.cfg.metrics_token = fresh.metrics_token
        self.log.info(
            "SIGHUP: configuration reloaded; origins allowed: %s; hosts allowed: %s",
            ", ".join(sorted(origins)) or "none",
            ", ".join(sorted(hosts)) if hosts is not None else "any",
        )
        if pending:
            self.log.warning(
                "SIGHUP: changed settings that need a restart were not applied: %s", ", ".join(pending)
            )


def _install_reload(reloader: Reloader) -> Any:
    async def install(app: Any) -> None:
        if hasattr(signal, "SIGHUP"):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader)

    return install


def _remove_reload(app: Any) -> None:
    if hasattr(signal, "SIGHUP"):
        try:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        except (RuntimeError, ValueError):
            pass
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a late SIGHUP must not cut the shutdown short


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


def run(name: str, args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("mp serve needs uvicorn: pip install monitor-protocol", file=sys.stderr)
        return 1
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.doors.http.app import MonitorApp
    from monitor_protocol.doors.push import delivery_task
    from monitor_protocol.store.postgres import is_postgres_url, redacted
    from monitor_protocol.store.sqlite import SQLiteStore, StoreLocked

    try:
        cfg, sources = resolve_settings(args)
    except ConfigError as exc:
        print(f"mp serve: {exc}", file=sys.stderr)
        return 2
    problem = validate(cfg)
    if problem is not None:
        print(f"mp serve: {problem}", file=sys.stderr)
        return 2
    open_files = raise_open_file_limit()

    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    if hasattr(signal, "SIGHUP"):  # until the loop takes SIGHUP over (reload), it must not stop the server
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    codec = install_fast_json()
    shared = is_postgres_url(cfg.db)
    db = cfg.db if cfg.db == ":memory:" or shared else os.path.abspath(cfg.db)
    shown = redacted(db) if shared else db  # a password in the URL is never printed
    store: Any = None
    app = None
    token_file = None
    try:
        try:
            store = open_postgres(db) if shared else SQLiteStore(db)
        except StoreLocked as exc:
            print(f"mp serve: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:
            print(
                f"mp serve: cannot open the database {shown}: {getattr(exc, 'detail', None) or exc}",
                file=sys.stderr,
            )
            return 1
        admin_token: str | None = None
        if cfg.allow_admin is not None:
            admin_token = cfg.allow_admin
            if not admin_token:
                admin_token = secrets.token_urlsafe(32)
                try:
                    token_file = write_token_file(":memory:" if shared else db, admin_token)
                except OSError as exc:
                    where = exc.filename or "a file"
                    print(f"mp serve: cannot write the minted admin token to {where}: {exc}", file=sys.stderr)
                    return 1
        hosts = allowed_hosts_for(cfg.host, cfg.allow_host)
        service = MonitorService(
            store,
            clock=time.time,
            registration_token=cfg.registration_token,
            retire_after_mute_seconds=cfg.retire_after_mute,
            allowed_sinks=tuple(cfg.allow_sink),
        )
        router = RestRouter(
            service,
            admin_token=admin_token,
            allowed_origins=tuple(cfg.allow_origin),
            allowed_hosts=hosts,
            max_body=cfg.max_body,
        )
        try:
            monitors = len(store.list_monitors())
        except Exception as exc:  # a database that went away between opening it and this first read
            print(f"mp serve: cannot read the database {shown}: {exc}", file=sys.stderr)
            return 1
        try:
            sock = _bind(cfg.host, cfg.port)
        except OSError as exc:
            print(f"mp serve: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        port = sock.getsockname()[1]
        reloader = Reloader(args, cfg, router, None)
        # HTTP push (protocol: http subscriptions) runs beside the server; idle while there are none.
        app = MonitorApp(
            service,
            router,
            store=store,
            max_body=cfg.max_body,
            background_tasks=[delivery_task],
            on_startup=[_install_reload(reloader), *([_share_store] if shared else [])],
            on_shutdown=[_remove_reload],
            metrics_token=cfg.metrics_token,
        )
        reloader.app = app

        url = _url(cfg.host, port)
        print(f"Monitor Protocol server on {url}/mp/v0  (discover: {url}/mp/v0/discover)")
        if cfg.config:
            print(f"config: {cfg.config} (SIGHUP re-reads it and the environment: origins and hosts)")
        if shared:
            print(
                f"database: {shown} (PostgreSQL, shared: other servers may use it; "
                "sweeps and push run on the one holding the leader lock)"
            )
        else:
            print(
                f"database: {db}" + ("  (in memory: nothing survives a restart)" if db == ":memory:" else "")
            )
        print(f"monitors: {monitors}")
        print(f"json: {codec}")
        mute = (
            f"{cfg.retire_after_mute}s" if cfg.retire_after_mute is not None else "604800s (per subscription)"
        )
        print(
            f"limits: max_body={cfg.max_body} bytes, max_limit={MAX_LIMIT}, max_wait={MAX_WAIT_SECONDS}s, "
            f"retire_after_mute={mute}, header_timeout={cfg.header_timeout:g}s, "
            f"body_timeout={cfg.body_timeout:g}s, keep_alive={cfg.keep_alive:g}s"
            + (f", open_files={open_files}" if open_files else "")
        )
        warnings = []
        if shared and redacted(db) != db:
            warnings.append(_argv_warning("database password", sources["db"], "MP_DB"))
            warnings.append(
                "warning: the database URL carries a password; prefer PGPASSWORD or ~/.pgpass (libpq reads "
                "both), so that it is in neither the URL nor the process list"
            )
        if cfg.registration_token:
            print(f"registration: token required ({_source_note(sources['registration_token'])})")
            warnings.append(
                _argv_warning("registration token", sources["registration_token"], "MP_REGISTRATION_TOKEN")
            )
        else:
            print("registration: open (monitors unattested)")
        if token_file is not None and admin_token:
            print(
                f"admin: enabled, token minted for this run and written to {token_file} "
                f"(readable by this user only; {fingerprint(admin_token)})"
            )
        elif admin_token:
            print(
                f"admin: enabled, token {_source_note(sources['allow_admin'])} ({fingerprint(admin_token)})"
            )
            warnings.append(_argv_warning("admin token", sources["allow_admin"], "MP_ADMIN_TOKEN"))
        else:
            print("admin: disabled")
        if cfg.metrics_token:
            print(f"metrics: GET /metrics with the metrics token ({_source_note(sources['metrics_token'])})")
            warnings.append(_argv_warning("metrics token", sources["metrics_token"], "MP_METRICS_TOKEN"))
        else:
            print(
                "metrics: GET /metrics for loopback clients" + (" and the admin token" if admin_token else "")
            )
        print("health: GET /healthz (process), GET /readyz (database)")
        print("access log: " + ("on" if cfg.access_log else "off (--access-log turns it on)"))
        print(
            "origins allowed: "
            + (", ".join(cfg.allow_origin) or "none (requests with an Origin are refused)")
        )
        print("hosts allowed: " + (", ".join(sorted(hosts)) if hosts is not None else "any"))
        print("push sinks allowed beyond public addresses: " + (", ".join(cfg.allow_sink) or "none"))
        for warning in warnings:
            if warning:
                print(warning)
        sys.stdout.flush()

        config = uvicorn.Config(
            app,
            http=hardened_protocol_class(cfg.header_timeout, cfg.body_timeout),
            loop="auto",  # uvloop when it is installed (not on Windows), else asyncio's own loop
            lifespan="on",
            log_level=cfg.log_level,
            log_config=log_config(cfg.log_level),
            access_log=cfg.access_log,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=cfg.keep_alive,
        )
        server = _draining_server_class()(config, app)
        _log_engine_errors(cfg.log_level)
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
        if token_file is not None:
            try:
                os.unlink(token_file)
            except OSError:
                pass
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if store is not None:
            print("mp serve: stopped, database closed", file=sys.stderr)
