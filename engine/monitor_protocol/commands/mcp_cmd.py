"""`mp mcp`: the MCP server over stdio (tools, resources and notifications of PROTOCOL.md section 9)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

HELP = "run the MCP server (extension ai.mentu/monitors) over stdio, embedded or against a server"

DEFAULT_DB = "monitor-protocol.db"


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--db",
        default=None,
        metavar="PATH",
        help=f"embedded SQLite database (default ./{DEFAULT_DB}); the sweep runs in this process",
    )
    where.add_argument(
        "--base",
        default=os.environ.get("MP_MCP_BASE"),
        metavar="URL",
        help="use an `mp serve` at this URL instead of a database (env MP_MCP_BASE)",
    )


def run(name: str, args: argparse.Namespace) -> int:
    try:
        from ..mcp_server import build
    except ImportError as exc:
        print(f"mp mcp needs the MCP SDK: pip install 'monitor-protocol[mcp]' ({exc})", file=sys.stderr)
        return 1
    from ..store.sqlite import StoreLocked

    server = build(db=None if args.base else (args.db or DEFAULT_DB), base=args.base)
    try:
        asyncio.run(server.run_stdio())
    except KeyboardInterrupt:
        return 130
    except StoreLocked as exc:
        print(f"mp mcp: {exc} (use --base URL to go through the server that holds it)", file=sys.stderr)
        return 1
    return 0
