"""`mp openapi`: print the OpenAPI 3.1 document of the REST binding, generated from the operations table
(monitor_protocol.api.operations), or write it to a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "print the OpenAPI 3.1 document of the REST binding (generated from the operations table)"


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", metavar="FILE", help="write it to FILE instead of stdout")
    parser.add_argument("--compact", action="store_true", help="one line of JSON instead of indented JSON")


def run(name: str, args: argparse.Namespace) -> int:
    from monitor_protocol.api.openapi import dumps

    text = dumps(indent=None if args.compact else 2) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
