"""`mp conform`: run the conformance suite against a server (--base) or, without one, a fresh in-process
memory engine. `--profile published` runs only docs/protocol.md section 11's checklist, fair to any
implementation; `--profile all` (the default) adds this project's own checks. `--schemas DIR` gives the
published JSON Schemas C29 validates against (without it C29 is skipped, never judged by this project's
own schemas). Exit status 1 when any check fails, 2 on a bad argument."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HELP = "run the conformance suite against a server (or in-process without --base)"


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base",
        action="append",
        help="server base URL, e.g. http://127.0.0.1:8130 (default: in-process engine); repeat it for servers "
        "that share one store: each request goes to the next one in turn",
    )
    parser.add_argument(
        "--admin-token", help="the server's admin token (enables C17 and the compaction checks)"
    )
    parser.add_argument("--registration-token", help="the server's registration token, when it requires one")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--only", help="comma-separated check ids, e.g. C05,C12")
    parser.add_argument(
        "--profile",
        choices=("all", "published", "project"),
        default="all",
        help="published: only the section 11 checklist, fair to any implementation; project: only this"
        " project's own choices and limits; all (default): both",
    )
    parser.add_argument(
        "--schemas",
        "--reference-schemas",
        dest="schemas",
        metavar="DIR",
        help="the published JSON Schemas: C29 validates every object received against these, and only"
        " these (without it C29 is skipped; the project profile's X53 uses this project's own schemas)",
    )


async def _run(args: argparse.Namespace) -> Any:
    from monitor_protocol.conformance.runner import run_suite

    if args.base:
        from monitor_protocol.conformance.http import HttpTransport

        async with HttpTransport(
            args.base, admin_token=args.admin_token, registration_token=args.registration_token
        ) as transport:
            return await run_suite(
                transport, only=args.only, reference_schema_dir=args.schemas, profile=args.profile
            )
    from monitor_protocol.conformance.inprocess import InProcessTransport

    transport = InProcessTransport.create(
        admin_token=args.admin_token or "admin-test-token", registration_token=args.registration_token
    )
    return await run_suite(transport, only=args.only, reference_schema_dir=args.schemas, profile=args.profile)


def schemas_problem(directory: str) -> str | None:
    """Why `--schemas DIR` cannot be used, or None. Checked before anything is sent: a directory given that
    cannot serve is a usage error (exit 2), not a quiet skip of C29 nor a failure blamed on the server."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return "--schemas needs jsonschema to validate with (pip install jsonschema); nothing was run"
    from monitor_protocol.core.schemas import load_schemas

    what = "give the directory of the protocol's published JSON Schemas, one *.json file each"
    if not Path(directory).is_dir():
        return f"--schemas {directory}: no such directory ({what})"
    try:
        loaded = load_schemas(directory)
    except FileNotFoundError:
        return f"--schemas {directory}: holds no *.json file ({what})"
    except (OSError, ValueError) as exc:
        return f"--schemas {directory}: {exc}"
    from jsonschema.exceptions import SchemaError

    from monitor_protocol.core.schemas import ecma_validator_class

    for name, schema in loaded.items():
        if not isinstance(schema, dict):
            return f"--schemas {directory}: {name}.json is not a JSON Schema (an object) ({what})"
        try:
            ecma_validator_class().check_schema(schema)
        except SchemaError as exc:
            return f"--schemas {directory}: {name}.json is not a valid JSON Schema: {exc.message}"
    return None


def run(name: str, args: argparse.Namespace) -> int:
    from monitor_protocol.conformance.runner import selected

    try:
        # Only a run that validates against them (C29) needs the schemas: a script that always passes --schemas
        # still runs `--profile project` or `--only C05` without jsonschema.
        validates = "C29" in selected(args.only, args.profile)
    except ValueError:
        validates = False  # the run's own refusal says why (below)
    problem = schemas_problem(args.schemas) if args.schemas and validates else None
    if problem:
        print(f"mp conform: {problem}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_run(args))
    except ValueError as exc:  # an unknown --only id, or one outside the --profile
        print(f"mp conform: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.table())
    return 0 if report.ok else 1
