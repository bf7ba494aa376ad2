"""`mp`: one console script; each subcommand lives in monitor_protocol.cli.<module>.

`python -m monitor_protocol` runs the same `main`. Exit statuses are listed in `mp --help`
(`commands.client_cmds.EXIT_STATUS_HELP`).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from monitor_protocol.cli.client_cmds import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
)

# subcommand -> module under monitor_protocol.cli exposing add_arguments(parser) and run(args) -> int
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
    "probe": "probe",
    "mcp": "mcp",
    "conform": "conform",
    "openapi": "openapi",
    "migrate": "migrate",
}


def version() -> str:
    """The installed package's version (the source tree's `__version__` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("monitor-protocol")
    except PackageNotFoundError:
        from monitor_protocol import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mp",
        description="The Monitor Protocol v0: server, client and tools.",
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mp {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"monitor_protocol.cli.{module_name}")
        p = sub.add_parser(
            name, help=module.HELP.get(name, "") if isinstance(module.HELP, dict) else module.HELP
        )
        module.add_arguments(name, p)
        p.set_defaults(_module=module, _name=name)
    return parser


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # refused by the command's own parser where it has one (mp watch's also prints on stdout)
        refuse = getattr(args, "_usage", None) or parser.error
        refuse(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    return int(args._module.run(args._name, args) or 0)


def _stdout_gone() -> int:
    """stdout's reader went away (`mp monitors list | head -1`): point stdout at /dev/null so nothing more
    is written (not even the final flush at exit, which would print a traceback) and exit quietly.

    SIGPIPE stays ignored, as Python sets it: restoring its default would let a closed *socket* kill the
    process too; EPIPE on stdout is handled here instead, with the status a SIGPIPE death gives in a shell."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_PIPE


# A write to stdout that fails for want of room or of a file: one sentence, never a traceback.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF})


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (`mp watch >&-`): what it read would go nowhere
        sys.stderr.write("error: OUTPUT: stdout is closed: give mp somewhere to print (a file, a pipe)\n")
        return EXIT_FAILED
    try:
        try:
            status = _run(argv)
        except SystemExit:
            sys.stdout.flush()  # argparse's --help, --version and usage errors: flush here, not at exit
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return _stdout_gone()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        # `mp watch > /dev/full`: a line that could not be written was not acknowledged (mp watch acks what it
        # has printed), so the next run prints it again; the failed write may be a file's (`mp openapi -o`)
        what = str(exc.filename) if exc.filename else "the output"
        sys.stderr.write(f"error: OUTPUT: {what} cannot be written ({exc.strerror}); stopped\n")
        _stdout_gone()  # and no second failure (a traceback) at exit's final flush
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
