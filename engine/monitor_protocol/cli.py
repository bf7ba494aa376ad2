"""`mp`: one console script; each subcommand lives in monitor_protocol.commands.<module>."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module under monitor_protocol.commands exposing add_arguments(parser) and run(args) -> int
COMMANDS: dict[str, str] = {
    "serve": "serve",
    "publish": "client_cmds",
    "subscribe": "client_cmds",
    "pull": "client_cmds",
    "ack": "client_cmds",
    "seek": "client_cmds",
    "state": "client_cmds",
    "monitors": "client_cmds",
    "lease": "client_cmds",
    "watch": "watch",
    "mcp": "mcp_cmd",
    "conform": "conform",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mp", description="The Monitor Protocol v0: server, client and tools."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"monitor_protocol.commands.{module_name}")
        p = sub.add_parser(
            name, help=module.HELP.get(name, "") if isinstance(module.HELP, dict) else module.HELP
        )
        module.add_arguments(name, p)
        p.set_defaults(_module=module, _name=name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return int(args._module.run(args._name, args) or 0)


if __name__ == "__main__":
    sys.exit(main())
