"""`mp serve`: the protocol over HTTP, durable on SQLite (docs/protocol.md sections 5, 8, 9, 10)."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
import time
from typing import Any

from monitor_protocol.cli.serve_config import (
    CONFIG_ENV,
    DB_LANES,
    LOG_LEVELS,
    AppendGiven,
    ConfigError,
    Reloader,
    StoreGiven,
    TrueGiven,
    allowed_hosts_for,
    fingerprint,
    public_hosts,
    resolve_settings,
    source_policy,
    sources_line,
    validate,
)
from monitor_protocol.core.vocab import (
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_SOURCES,
    DEFAULT_SOURCE_RATE_PER_MINUTE,
    MAX_LIMIT,
    MAX_SOURCES_PER_OWNER,
    MAX_WAIT_SECONDS,
)
from monitor_protocol.doors.http.admission import connection_bound
from monitor_protocol.doors.http.server import (
    bind,
    configure_logging,
    install_fast_json,
    raise_open_file_limit,
    serve,
)

HELP = "run the Monitor Protocol HTTP server (SQLite by default, or PostgreSQL: --db postgresql://...)"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8130
DEFAULT_DB = "monitor-protocol.db"
# docs/protocol.md section 10, time limits: headers within 10 s and a body within 30 s of the request's start;
# an idle keep-alive connection stays open at least 60 s.
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE = 65.0
# On PostgreSQL: engine calls running at once, each on a connection of its own (doors/engines.py EngineLanes).
DEFAULT_DB_CONNECTIONS = 4
PAUSED_RECHECK_SECONDS = 1.0


class _Stop(Exception):
    """Raised by our own SIGINT/SIGTERM handlers outside the server's own (before it starts, after it stops)."""


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    s, a = StoreGiven, AppendGiven
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
        help="enable POST /mp/v0/admin/compact, GET /mp/v0/admin/snapshot and GET /mp/v0/admin/log behind this "
        "bearer token (env MP_ADMIN_TOKEN keeps it off the command line; without a value, the token of "
        "MP_ADMIN_TOKEN or the config file, else one minted and written to a file readable only by you, "
        "never printed)",
    )
    parser.add_argument(
        "--metrics-token",
        action=s,
        default=None,
        metavar="TOKEN",
        help="bearer token for GET /metrics (env MP_METRICS_TOKEN); without one, /metrics answers loopback "
        "clients only, none once --allow-host names a public host (and the admin token)",
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
        "--db-connections",
        action=s,
        type=int,
        default=DEFAULT_DB_CONNECTIONS,
        metavar="N",
        help="on a postgresql:// database, engine calls run at once, each on a connection of its own "
        f"(env MP_DB_CONNECTIONS, default {DEFAULT_DB_CONNECTIONS}; SQLite has one writer and ignores it)",
    )
    parser.add_argument(
        "--db-lanes",
        action=s,
        choices=DB_LANES,
        default=None,
        help="on a postgresql:// database, where engine calls run while they wait on it: green (greenlets "
        "on the event loop's thread, no thread hop; needs greenlet, installed by the postgres extra) or "
        "threads (env MP_DB_LANES, default threads)",
    )
    parser.add_argument(
        "--access-log",
        action=TrueGiven,
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
        "--sources",
        action=TrueGiven,
        nargs=0,
        default=False,
        help="run the sources of the monitors this server holds (docs/sources.md): http through the push "
        "sink guard, feeds, and the shell and file sources --allow-source allows (env MP_SOURCES=true)",
    )
    parser.add_argument(
        "--allow-source",
        action=a,
        default=[],
        metavar="KIND:WHAT",
        help="let --sources run a shell source whose command's first word matches a glob and whose next "
        "words are the words given (shell:gh allows gh with any arguments, shell:'gh run list' only that; "
        "shell:/usr/local/bin/*; shell:sh allows settings.shell, so any command) or follow a file inside a "
        "directory (file:/var/log/app), for monitors made with the registration token (repeatable; env "
        "MP_ALLOW_SOURCE, comma-separated)",
    )
    parser.add_argument(
        "--allow-unattested-sources",
        action=TrueGiven,
        nargs=0,
        default=False,
        help="let the shell and file sources --allow-source allows run for any monitor, not only those made "
        "with the registration token (needed to run them while registration is open; anyone who can "
        "create a monitor can then run what --allow-source allows) (env MP_ALLOW_UNATTESTED_SOURCES=true)",
    )
    parser.add_argument(
        "--source-env",
        action=a,
        default=[],
        metavar="NAME",
        help="pass this variable of the server's environment to the commands of shell sources, which see "
        "only PATH, HOME, LANG, LC_*, TZ and TMPDIR otherwise (repeatable; env MP_SOURCE_ENV, "
        "comma-separated)",
    )
    parser.add_argument(
        "--max-sources",
        action=s,
        type=int,
        default=DEFAULT_MAX_SOURCES,
        metavar="N",
        help=f"sources this server runs at once, at most (env MP_MAX_SOURCES, default {DEFAULT_MAX_SOURCES}; "
        f"{MAX_SOURCES_PER_OWNER} per declared owner)",
    )
    parser.add_argument(
        "--source-rate",
        action=s,
        type=int,
        default=DEFAULT_SOURCE_RATE_PER_MINUTE,
        metavar="PER_MINUTE",
        help="observations a source may publish per minute when its monitor's budget.observations_per_minute "
        f"says none; past it the source waits (env MP_SOURCE_RATE, default {DEFAULT_SOURCE_RATE_PER_MINUTE})",
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


def _db_lanes(chosen: str | None) -> str:
    """Threads unless green lanes are asked for and greenlet is installed (said when it is not). Green lanes
    are not the default: a 9-11 % higher rate, against a loop that connecting to the database holds up
    (docs/serve.md, docs/bench-history.md "Green lanes")."""
    from monitor_protocol.doors.green_lanes import available

    if chosen != "green":
        return "threads"
    if available():
        return "green"
    print(
        "mp serve: --db-lanes green needs greenlet (pip install greenlet: the [postgres] extra); "
        "running the engine's calls on threads",
        file=sys.stderr,
    )
    return "threads"


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


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


def run(name: str, args: argparse.Namespace) -> int:
    try:
        import httptools  # noqa: F401 - the server's HTTP parser
    except ImportError:
        print("mp serve needs httptools: pip install httptools", file=sys.stderr)
        return 1
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.doors.engines import EngineLanes, LoopEngine
    from monitor_protocol.doors.http.app import MonitorApp
    from monitor_protocol.doors.push import delivery_task
    from monitor_protocol.doors.sources.supervisor import sources_task
    from monitor_protocol.store import sqlite_file
    from monitor_protocol.store.postgres import is_postgres_url, redacted
    from monitor_protocol.store.sqlite import SCHEMA_VERSION, SQLiteStore, StoreLocked

    sqlite_file.HOLDER_NAME = "mp serve"  # named in a refused second opener's message

    try:
        cfg, sources = resolve_settings(args)
    except ConfigError as exc:
        print(f"mp serve: {exc}", file=sys.stderr)
        return 2
    problem = validate(cfg, sources)
    if problem is not None:
        print(f"mp serve: {problem}", file=sys.stderr)
        return 2
    policy = source_policy(cfg)
    open_files = raise_open_file_limit()
    max_connections = connection_bound(open_files)

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
    listened = False  # whether it ever served: "stopped" after a refused port would suggest it had
    try:
        # Chosen before the store opens: green lanes import greenlet first, so that what the store and the
        # service keep per lane is kept per greenlet (core/lanes.py); thread lanes never import it.
        lanes = _db_lanes(cfg.db_lanes) if shared else None
        try:
            store = open_postgres(db) if shared else SQLiteStore(db)
        except StoreLocked as exc:
            print(f"mp serve: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:
            detail = getattr(exc, "detail", None)  # names the database itself (PostgreSQL): said once
            said = (
                f"cannot open the database: {detail}"
                if detail
                else f"cannot open the database {shown}: {exc}"
            )
            print(f"mp serve: {said}", file=sys.stderr)
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
        if shared:  # the engine's lanes serve every call from here on, each with a connection of its own
            store.close_lane()
        try:
            sock = bind(cfg.host, cfg.port)
        except OSError as exc:
            print(f"mp serve: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        port = sock.getsockname()[1]
        listened = True
        reloader = Reloader(args, cfg, router, None)
        # HTTP push (protocol: http subscriptions) runs beside the server; idle while there are none.
        # The engine's seat: on the loop for a store of its own (SQLite: every call bounded and local), on
        # threads of their own, each with its own connection, for a shared store whose calls wait on the
        # network (PostgreSQL): a call waiting on the database holds up no other.
        if lanes == "green":
            from monitor_protocol.doors.green_lanes import GreenLanes

            engine: Any = GreenLanes(store, service, cfg.db_connections)
        else:
            engine = EngineLanes(store, service, cfg.db_connections) if shared else LoopEngine(store)
        app = MonitorApp(
            service,
            router,
            store=store,
            engine=engine,
            max_body=cfg.max_body,
            background_tasks=[
                delivery_task,
                *([sources_task(policy, cfg.source_rate, cfg.max_sources)] if cfg.sources else []),
            ],
            on_startup=[_install_reload(reloader), *([_share_store] if shared else [])],
            on_shutdown=[_remove_reload],
            metrics_token=cfg.metrics_token,
        )
        reloader.app = app

        url = _url(cfg.host, port)
        print(f"Monitor Protocol server on {url}/mp/v0  (discover: {url}/mp/v0/discover)")
        if cfg.config:
            print(
                f"config: {cfg.config} (SIGHUP re-reads it and the environment: origins, hosts and the metrics token)"
            )
        if shared:
            print(
                f"database: {shown} (PostgreSQL, shared: other servers may use it; "
                "sweeps and push run on the one holding the leader lock; "
                f"{cfg.db_connections} engine connection{'s' if cfg.db_connections != 1 else ''}, "
                f"{'on greenlets of the event loop' if lanes == 'green' else 'on threads'})"
            )
        else:
            print(
                f"database: {db}" + ("  (in memory: nothing survives a restart)" if db == ":memory:" else "")
            )
            if getattr(store, "upgraded_from", None):  # said once, the start it happened
                print(
                    f"database: upgraded from format {store.upgraded_from} to {SCHEMA_VERSION}; a build that "
                    "reads only the older format refuses it now (docs/serve.md, Upgrading in place)"
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
            + (f", open_files={open_files}, connections={max_connections}" if open_files else "")
        )
        warnings = []
        if shared and redacted(db) != db:  # one warning, one advice: the password out of the URL
            where = (
                "on the command line, where every local user can read it (ps)"
                if sources["db"].startswith("--")
                else f"in the database URL ({_source_note(sources['db'])})"
            )
            warnings.append(
                f"warning: the database password is {where}; put it in PGPASSWORD or ~/.pgpass instead "
                "(libpq reads both) and leave it out of the URL"
            )
        if cfg.registration_token:
            print(
                f"registration: token required ({_source_note(sources['registration_token'])}; "
                f"{fingerprint(cfg.registration_token)})"
            )
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
            print(
                "metrics: GET /metrics with the metrics token "
                f"({_source_note(sources['metrics_token'])}; {fingerprint(cfg.metrics_token)})"
            )
            warnings.append(_argv_warning("metrics token", sources["metrics_token"], "MP_METRICS_TOKEN"))
        elif public_hosts(cfg.allow_host):
            # A public name served (a reverse proxy's set-up, or a public bind): a loopback request may be a
            # proxy's, so none is taken for a local one (doors/http/ops.py).
            print(
                "metrics: GET /metrics "
                + ("with the admin token" if admin_token else "for no one")
                + " (--allow-host names a public host: set --metrics-token to scrape it)"
            )
        else:
            print("metrics: GET /metrics for local clients" + (" and the admin token" if admin_token else ""))
        print("health: GET /healthz (process), GET /readyz (database)")
        print("access log: " + ("on" if cfg.access_log else "off (--access-log turns it on)"))
        print(
            "origins allowed: "
            + (", ".join(cfg.allow_origin) or "none (requests with an Origin are refused)")
        )
        print("hosts allowed: " + (", ".join(sorted(hosts)) if hosts is not None else "any"))
        print("push sinks allowed beyond public addresses: " + (", ".join(cfg.allow_sink) or "none"))
        print(sources_line(cfg))
        for warning in warnings:
            if warning:
                print(warning)
        sys.stdout.flush()

        configure_logging(cfg.log_level, cfg.access_log)
        try:
            serve(
                app,
                sock,
                header_timeout=cfg.header_timeout,
                body_timeout=cfg.body_timeout,
                keep_alive=cfg.keep_alive,
                access_log=cfg.access_log,
                max_connections=max_connections,
            )
        except _Stop:
            pass  # a signal before the loop took the stop signals over, or after it gave them back
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
            said = "stopped" if listened else "did not start"
            print(f"mp serve: {said}, database closed", file=sys.stderr)
