"""`mp conform`: run the conformance suite against a server (--base) or, without one, a fresh in-process
memory engine. Exit status 1 when any check fails."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

HELP = "run the conformance suite against a server (or in-process without --base)"


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base", help="server base URL, e.g. http://127.0.0.1:8130 (default: in-process engine)"
    )
    parser.add_argument(
        "--admin-token", help="the server's admin token (enables C17 and the compaction checks)"
    )
    parser.add_argument("--registration-token", help="the server's registration token, when it requires one")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--only", help="comma-separated check ids, e.g. C05,C12")
    parser.add_argument(
        "--reference-schemas", metavar="DIR", help="also validate every object against these schemas"
    )


async def _run(args: argparse.Namespace) -> Any:
    from ..conformance.runner import run_suite

    if args.base:
        from ..conformance.http import HttpTransport

        async with HttpTransport(
            args.base, admin_token=args.admin_token, registration_token=args.registration_token
        ) as transport:
            return await run_suite(transport, only=args.only, reference_schema_dir=args.reference_schemas)
    from ..conformance.inprocess import InProcessTransport

    transport = InProcessTransport.create(
        admin_token=args.admin_token or "admin-test-token", registration_token=args.registration_token
    )
    return await run_suite(transport, only=args.only, reference_schema_dir=args.reference_schemas)


def run(name: str, args: argparse.Namespace) -> int:
    try:
        report = asyncio.run(_run(args))
    except ValueError as exc:  # an unknown --only id
        print(f"mp conform: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.table())
    return 0 if report.ok else 1
