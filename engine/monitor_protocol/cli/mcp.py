"""`mp mcp`: the MCP server over stdio (tools, resources and notifications of docs/protocol.md section 9).

Where it works, in order: `--db PATH` (embedded), `--base URL`, env `MP_BASE` (as for every other door),
env `MP_MCP_BASE` (deprecated alias), else the embedded default database in the user's data directory
(`$XDG_DATA_HOME/monitor-protocol/monitor-protocol.db`, by default `~/.local/share/...`), never the client's
working directory. MCP clients start servers without a shell, so `~` and `$VAR` in `--db` are expanded here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

HELP = "run the MCP server (extension ai.mentu/monitors) over stdio, embedded or against a server"

APP_DIR = "monitor-protocol"
DB_NAME = "monitor-protocol.db"
# A variable left after expansion is an unset one (Windows also spells them %NAME%).
UNEXPANDED = re.compile(r"\$\{?(\w+)\}?|%(\w+)%" if os.name == "nt" else r"\$\{?(\w+)\}?")


class BadPath(ValueError):
    """A `--db` that cannot name a database file; the message says what to do."""


def data_home(environ: Mapping[str, str] | None = None) -> Path:
    """The user's data directory: `$XDG_DATA_HOME` when it is an absolute path, else `~/.local/share`
    (on Windows `%LOCALAPPDATA%`)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    if os.name == "nt" and env.get("LOCALAPPDATA"):
        return Path(env["LOCALAPPDATA"])
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".local" / "share"


def default_db_path(environ: Mapping[str, str] | None = None, *, create: bool = False) -> Path:
    """`<data home>/monitor-protocol/monitor-protocol.db`; `create` makes the directory (mode 0700)."""
    path = data_home(environ) / APP_DIR / DB_NAME
    if create:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise BadPath(f"cannot create the data directory {path.parent}: {exc.strerror or exc}") from exc
    return path


def resolve_db(value: str) -> Path:
    """`--db` as a user means it: `~` and `$VAR`/`${VAR}` expanded, made absolute, its directory existing."""
    expanded = os.path.expanduser(os.path.expandvars(value))
    left = UNEXPANDED.search(expanded)
    if left:
        name = next(g for g in left.groups() if g)
        raise BadPath(
            f"--db {value}: the variable {name} is not set in this environment (MCP clients pass only the "
            "variables in the server's env entry)"
        )
    path = Path(os.path.abspath(expanded))
    if path.is_dir():
        raise BadPath(f"--db {value}: {path} is a directory; name the database file, e.g. {path / DB_NAME}")
    if not path.parent.is_dir():
        raise BadPath(
            f"--db {value}: the directory {path.parent} does not exist; create it first "
            f"(or leave --db out to use {default_db_path()})"
        )
    return path


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--db",
        default=None,
        metavar="PATH",
        help=f"embedded SQLite database; ~ and $VARS are expanded (default {default_db_path()}); "
        "the sweep runs in this process",
    )
    where.add_argument(
        "--base",
        default=None,
        metavar="URL",
        help="use an `mp serve` at this URL instead of a database (env MP_BASE)",
    )


def choose_base(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str | None:
    """The server to use, or None for embedded: an explicit --db or --base wins over the environment."""
    env = os.environ if environ is None else environ
    if args.db is not None:
        return None
    if args.base:
        return args.base
    if env.get("MP_BASE"):
        return env["MP_BASE"]
    if env.get("MP_MCP_BASE"):
        print("mp mcp: MP_MCP_BASE is deprecated; set MP_BASE instead", file=sys.stderr)
        return env["MP_MCP_BASE"]
    return None


CLIENT_GONE = (BrokenPipeError, ConnectionResetError)


def run(name: str, args: argparse.Namespace) -> int:
    try:
        from monitor_protocol.doors.mcp.backends import DatabaseUnavailable
        from monitor_protocol.doors.mcp.server import build
    except ImportError as exc:
        print(
            f"mp mcp needs the MCP SDK: pip install 'mcp>=2.3,<3' (the [mcp] extra) ({exc})", file=sys.stderr
        )
        return 1
    from monitor_protocol.store import sqlite_file
    from monitor_protocol.store.sqlite import StoreCorrupt, StoreLocked

    sqlite_file.HOLDER_NAME = "mp mcp"  # named in a refused second opener's message

    base = choose_base(args)
    if base:
        from monitor_protocol.cli.watch import base_url

        try:
            base_url(base)
        except argparse.ArgumentTypeError as exc:
            print(f"mp mcp: {exc}", file=sys.stderr)
            return 2
    try:
        db = (
            None
            if base
            else str(resolve_db(args.db) if args.db is not None else default_db_path(create=True))
        )
    except BadPath as exc:
        print(f"mp mcp: {exc}", file=sys.stderr)
        return 2
    server = build(db=db, base=base)
    try:
        asyncio.run(server.run_stdio())
    except KeyboardInterrupt:
        return 130
    except (*CLIENT_GONE, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.split(CLIENT_GONE)[1] is not None:
            raise  # something else failed too: its traceback is the report
        # The client went away mid-session (killed, crashed): nobody reads stdout any more. One line, and
        # stdout pointed at /dev/null so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("mp mcp: the client closed the connection; stopping", file=sys.stderr)
        return 0
    except StoreLocked as exc:
        if "mp serve (" in exc.held:
            how = "go through that server: mp mcp --base URL (its address)"
        elif "mp mcp (" in exc.held:
            how = (
                "sessions that share a database go through one `mp serve --db PATH`, each with --base URL; "
                "or give this session another --db"
            )
        else:
            how = (
                "stop that process, or give this session another --db (held by `mp serve`: use --base URL to "
                "go through it)"
            )
        print(f"mp mcp: {exc.held} {how[0].upper()}{how[1:]}.", file=sys.stderr)
        return 1
    except (StoreCorrupt, DatabaseUnavailable) as exc:
        print(f"mp mcp: {exc}", file=sys.stderr)
        return 1
    return 0
