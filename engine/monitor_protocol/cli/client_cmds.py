"""`mp publish | subscribe | pull | ack | seek | state | monitors | lease`: the REST client on the command line.

Every command takes `--base` (env MP_BASE, default http://127.0.0.1:8130), `--token` and `--json`.
Tokens, when `--token` is not given, come from the environment by role:

* owner commands (`publish`, `subscribe`, `monitors update|pause|resume|retire`): MP_OWNER_TOKEN, else MP_TOKEN
  (`subscribe` also accepts the monitor's subscribe token or the subscription's own token this way);
* reader commands (`pull`, `ack`, `seek`, `lease ...`, `watch`): MP_READER_TOKEN, else MP_TOKEN;
* viewing (`state`, `monitors list|get`) and `monitors create` (the registration token): MP_TOKEN, else
  MP_OWNER_TOKEN.

A failure prints one sentence on stderr (`error: CODE: sentence`) and exits with a status that says what kind
of failure it was (`EXIT_STATUS_HELP`, shown in `mp --help`; `exit_status(exc)` maps an exception to it).
With `--json` the error is also printed on stdout as a JSON object: the server's error body
`{code, error, done, ...extras}`, or `{"code": "UNREACHABLE", "error", "sent", "url"}` when the server could
not be reached (`sent`: whether the request may have been applied).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from monitor_protocol.cli.lines import obs_text, one_sentence
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.vocab import MAX_INTEGER, MAX_LIMIT, MAX_WAIT_SECONDS

EXIT_OK = 0
EXIT_FAILED = 1  # anything else: a reply that is not the protocol's (e.g. a proxy's error page)
EXIT_USAGE = 2  # bad arguments (argparse's own status); nothing was sent
EXIT_REFUSED = 3  # a protocol error other than UNAUTHORIZED and NOT_FOUND
EXIT_UNAUTHORIZED = 4  # UNAUTHORIZED (401)
EXIT_NOT_FOUND = 5  # NOT_FOUND (404), including a retired subscription's pull
EXIT_UNREACHABLE = 6  # connection failed or timed out
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_PIPE = 141  # stdout closed early (`| head`), as for a tool killed by SIGPIPE (128 + 13)

UNREACHABLE = "UNREACHABLE"  # the `code` of the JSON printed for a network failure under --json

EXIT_STATUS_HELP = """\
exit status (client commands: publish, subscribe, pull, ack, seek, state, monitors, lease, watch, probe):
  0    success
  1    unexpected failure: a reply that is not the protocol's (e.g. a proxy's error page), or stdout
       cannot be written (closed at start, a full disk: `error: OUTPUT: ...`)
  2    usage: bad arguments or options, or no token for publish, pull, ack, seek or lease; nothing
       was sent
  3    refused by the server: a protocol error other than the two below
       (CURSOR_BACKWARDS, LEASE_HELD, UNAVAILABLE, INVALID, CAPABILITY_MISSING, ...)
  4    UNAUTHORIZED (401): a wrong or missing token
  5    NOT_FOUND (404): no such monitor or subscription, invisible to this token, or retired
  6    server unreachable: the connection failed or timed out (watch and probe retry instead;
       probe --once keeps what it saw on disk for the next run)
  130  interrupted (Ctrl-C); a watch stopped by SIGTERM exits as the signal ends it (143)
  141  stdout was closed early (e.g. `mp monitors list | head -1`): quiet, as for SIGPIPE

A failure prints `error: CODE: sentence` on stderr. With --json it is also printed on stdout as JSON:
the server's error body {"code", "error", "done", ...}, or for a network failure
{"code": "UNREACHABLE", "error": "...", "sent": false|true, "url": "..."} (sent: true means the request
may have reached the server, so its outcome is unknown).
"""

DEFAULT_BASE = "http://127.0.0.1:8130"

OWNER = ("MP_OWNER_TOKEN", "MP_TOKEN")
READER = ("MP_READER_TOKEN", "MP_TOKEN")
VIEWER = ("MP_TOKEN", "MP_OWNER_TOKEN")

HELP = {
    "publish": "append an observation to a monitor (owner token)",
    "subscribe": "create or re-key a subscription; prints its reader token once",
    "pull": "read observations at a subscription's cursor (never commits)",
    "ack": "commit a subscription's cursor (a pull's `next`)",
    "seek": "move a subscription's cursor explicitly, with a reason",
    "state": "show a monitor's computed state",
    "monitors": "list, get, create, update, pause, resume or retire monitors",
    "lease": "claim, renew, complete, release or reject a lease on a subject",
}

# Commands no server answers without a token (an owner's or a reader's): without one, nothing is sent.
NEEDS_TOKEN = frozenset(("publish", "pull", "ack", "seek", "lease"))

ROLE = {
    "publish": OWNER,
    "subscribe": OWNER,
    "pull": READER,
    "ack": READER,
    "seek": READER,
    "state": VIEWER,
    "lease": READER,
}


# ---------------------------------------------------------------------------------------------- shared


def add_common(parser: argparse.ArgumentParser, role: tuple[str, ...]) -> None:
    """--base, --token and --json, with the environment variables named in the help."""
    parser.add_argument(
        "--base",
        default=os.environ.get("MP_BASE", DEFAULT_BASE),
        help="server URL (env MP_BASE, default %(default)s)",
    )
    parser.add_argument("--token", default=None, help=f"bearer token (else env {' then '.join(role)})")
    parser.add_argument("--json", action="store_true", help="print the server's JSON reply")
    parser.set_defaults(_token_env=role)


def resolve_token(args: argparse.Namespace) -> str | None:
    if args.token:
        return args.token
    for name in getattr(args, "_token_env", ()):
        value = os.environ.get(name)
        if value:
            return value
    return None


def read_arg_text(text: str) -> str:
    """`@FILE` reads FILE, `-` reads stdin, anything else is the value itself."""
    if text == "-":
        return sys.stdin.read()
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc}") from exc
    return text


def whole_number(text: str, option: str, low: int, high: int) -> int:
    """A whole number low..high in ASCII digits, checked before anything is sent (argparse: exit 2)."""
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise argparse.ArgumentTypeError(f"{option} takes whole numbers {low}..{high}, not {text!r}")
    return int(text)


def _pull_limit(text: str) -> int:
    return whole_number(text, "--limit", 1, MAX_LIMIT)


def _pull_wait(text: str) -> int:
    return whole_number(text, "--wait (seconds)", 0, MAX_WAIT_SECONDS)


def json_arg(text: str) -> Any:
    """JSON given inline, as `@FILE` or as `-` (stdin), held to the server's own rules for a body (core/wire:
    no NaN or Infinity, no number that overflows, bounded depth) before anything is sent."""
    source = read_arg_text(text)
    try:
        return wire.loads(source)
    except ProtocolError as refused:
        where = "stdin" if text == "-" else text[1:] if text.startswith("@") else "the argument"
        try:
            json.loads(source)
        except ValueError as exc:  # not JSON at all: the parser's sentence says where
            reason = str(exc)
        else:  # JSON, refused by the protocol's rules
            reason = refused.message
        raise argparse.ArgumentTypeError(f"not JSON ({where}): {reason}") from None


def json_object_arg(text: str) -> dict[str, Any]:
    value = json_arg(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, e.g. \'{"status": "ok"}\'')
    return value


def tag_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a tag is KEY=VALUE, not {text!r}")
    return key, value


def count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"a count is a whole number >= 0, not {text!r}")
    return value


def cursor_arg(text: str) -> int:
    """A cursor or seq as the protocol takes it: ASCII digits, 0..2^53 (a negative one is refused here, with
    nothing sent, as the server would refuse it)."""
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_INTEGER:
        raise argparse.ArgumentTypeError(f"a cursor is a whole number 0..2^53, not {text[:40]!r}")
    return int(text)


def dumps(value: Any) -> str:
    # ASCII with \uHHHH escapes: valid JSON whatever stdout's encoding (PYTHONIOENCODING=ascii, LANG=C).
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=True, indent=2))


def exit_status(exc: BaseException) -> int:
    """The exit status for a failure (EXIT_STATUS_HELP): 3 refused, 4 unauthorized, 5 not found,
    6 unreachable, 2 a bad argument found late, 1 anything else."""
    from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

    if isinstance(exc, ConnectionFailed):
        return EXIT_UNREACHABLE
    if isinstance(exc, MonitorProtocolError):
        if exc.code == "UNAUTHORIZED":
            return EXIT_UNAUTHORIZED
        if exc.code == "NOT_FOUND":
            return EXIT_NOT_FOUND
        if exc.code == "UNEXPECTED_RESPONSE":
            return EXIT_FAILED
        return EXIT_REFUSED
    if isinstance(exc, ValueError | TypeError):
        return EXIT_USAGE
    return EXIT_FAILED


def error_json(exc: BaseException) -> dict[str, Any]:
    """What --json prints on stdout for a failure: the protocol error body, or an UNREACHABLE object."""
    from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

    if isinstance(exc, MonitorProtocolError):
        return exc.body
    if isinstance(exc, ConnectionFailed):
        return {"code": UNREACHABLE, "error": unreachable_sentence(exc), "sent": exc.sent, "url": exc.url}
    return {"code": "USAGE" if exit_status(exc) == EXIT_USAGE else "FAILED", "error": str(exc)}


def unreachable_sentence(exc: Any) -> str:
    outcome = (
        "the request may have reached the server: its outcome is unknown"
        if exc.sent
        else "the request was never sent"
    )
    where = f"{exc.url}: " if exc.url else ""
    return f"{where}{exc.reason} ({outcome})"


KNOWN_SHOWN = 40  # values of a known_* list printed with a refusal


def report_error(exc: Exception, as_json: bool = False, token_from: tuple[str, ...] | None = None) -> int:
    """Print a failure (one sentence on stderr; with `as_json` its JSON on stdout); return its exit status.
    `token_from`: the command was given no token, and these environment variables would have given one."""
    from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

    if isinstance(exc, MonitorProtocolError):
        print(f"error: {exc.code}: {one_sentence(exc.message)}", file=sys.stderr)
        for name in sorted(exc.extras):  # the lists a sentence points to ("use one of known_types")
            values = exc.extras[name]
            if name.startswith("known") and isinstance(values, list) and values:
                shown = ", ".join(str(v) for v in values[:KNOWN_SHOWN])
                more = f" (and {len(values) - KNOWN_SHOWN} more)" if len(values) > KNOWN_SHOWN else ""
                print(f"error: {name}: {shown}{more}", file=sys.stderr)
        if exc.code == "UNAUTHORIZED" and token_from is not None:  # the server's hint is HTTP's: say ours
            where = " or ".join(["--token", *(f"env {name}" for name in token_from)])
            print(f"error: no token was given: pass it with {where}", file=sys.stderr)
    elif isinstance(exc, ConnectionFailed):
        print(f"error: {UNREACHABLE}: {unreachable_sentence(exc)}", file=sys.stderr)
    else:
        print(f"error: {exc}", file=sys.stderr)
    if as_json:
        print_json(error_json(exc))
    return exit_status(exc)


def obs_line(obs: dict[str, Any]) -> str:
    """The watch's OBS line, one place for both (docs/protocol.md section 9): printable ASCII, one physical line
    under any splitter, at most 4 KiB, data cut as valid JSON."""
    return obs_text(obs)


# ---------------------------------------------------------------------------------------------- arguments


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "monitors":
        _add_monitors(parser)
        return
    if name == "lease":
        _add_lease(parser)
        return
    add_common(parser, ROLE[name])
    if name == "publish":
        parser.add_argument("monitor", help="monitor id")
        parser.add_argument("type", help="observation type (reverse-DNS, declared in the monitor's types)")
        parser.add_argument("--subject", help="what the observation is about (a work item)")
        parser.add_argument(
            "--data",
            type=json_object_arg,
            metavar="JSON|@FILE|-",
            help="the observation's data, a JSON object: inline, @FILE to read a file, - to read stdin",
        )
        parser.add_argument(
            "--tag", action="append", default=[], type=tag_arg, metavar="KEY=VALUE", help="a tag (repeatable)"
        )
        parser.add_argument("--actor", help="who caused it, e.g. agent:claude (default: the owner)")
        parser.add_argument("--origin", help="human|agent|webhook|probe|system")
        parser.add_argument("--tier", help="src|measured|derived|unverified|falsified")
        parser.add_argument(
            "--verification", help="human_verified|machine_verified|certified|reported|unverified"
        )
        parser.add_argument("--on-behalf-of", dest="on_behalf_of", help="the owner an agent acts for")
        parser.add_argument("--supersedes", help="seq of the observation this one corrects")
        parser.add_argument("--source-ref", dest="source_ref", help="reference in the source")
        parser.add_argument(
            "--idempotency-key",
            dest="idempotency_key",
            help="repeating a publish with the same key appends nothing and returns the first reply",
        )
        parser.add_argument(
            "--retries",
            type=count_arg,
            default=0,
            metavar="N",
            help="retry up to N times on a network failure or 503 UNAVAILABLE, safely: an idempotency key "
            "is generated unless given (default 0)",
        )
    elif name == "subscribe":
        parser.add_argument("monitor", help="monitor id")
        parser.add_argument("--subscriber", required=True, help="the reader's name, e.g. agent:triage")
        parser.add_argument(
            "--capability",
            action="append",
            dest="capabilities",
            metavar="CAP",
            help="observe|react|act (repeatable; default: what the token grants)",
        )
        parser.add_argument("--filter", type=json_object_arg, help='JSON filter, e.g. \'{"types": ["a.b"]}\'')
        parser.add_argument("--from", dest="from_", help="head, earliest or a seq")
        parser.add_argument("--protocol", help="pull|http|mcp")
        parser.add_argument("--reset-policy", dest="reset_policy", help="earliest|latest|none")
        parser.add_argument("--sink", help="push URL for protocol http")
        parser.add_argument(
            "--sink-secret",
            dest="sink_secret",
            help="webhook signing secret whsec_<base64> for protocol http (default: the server mints one)",
        )
        parser.add_argument("--retire-after-mute-seconds", dest="retire_after_mute_seconds", type=int)
    elif name == "pull":
        parser.add_argument("subscription", help="subscription id (sub-...)")
        parser.add_argument("--cursor", type=cursor_arg, help="read-only replay from this seq")
        parser.add_argument("--limit", type=_pull_limit, help=f"1..{MAX_LIMIT} (server default 50)")
        parser.add_argument(
            "--wait", type=_pull_wait, help=f"long poll up to this many whole seconds (0..{MAX_WAIT_SECONDS})"
        )
        parser.add_argument("--filter", type=json_object_arg, help="inline filter (narrows, never widens)")
    elif name == "ack":
        parser.add_argument("subscription", help="subscription id")
        parser.add_argument("cursor", type=cursor_arg, help="the next seq to deliver (a pull's `next`)")
    elif name == "seek":
        parser.add_argument("subscription", help="subscription id")
        parser.add_argument("cursor", type=cursor_arg, help="the new cursor")
        parser.add_argument("--reason", required=True, help="why (logged)")
    elif name == "state":
        parser.add_argument("monitor", help="monitor id")


def _add_monitors(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="monitors this token may see")
    add_common(p, VIEWER)
    p = sub.add_parser("get", help="one monitor's definition")
    add_common(p, VIEWER)
    p.add_argument("monitor")
    p = sub.add_parser("create", help="create a monitor; prints its owner token once")
    add_common(p, VIEWER)
    p.add_argument("monitor", help="monitor id")
    p.add_argument("--name")
    p.add_argument("--description")
    p.add_argument("--type", action="append", dest="types", metavar="TYPE", help="declared type (repeatable)")
    p.add_argument("--capability", action="append", dest="capabilities", metavar="CAP", help="repeatable")
    p.add_argument("--default-grant", action="append", dest="default_grant", metavar="CAP", help="repeatable")
    p.add_argument("--visibility", help="private|shared|public")
    p.add_argument("--horizon", help="event|minute|hour|day|week|month")
    p.add_argument("--owner", help="owner actor, e.g. human:you")
    p.add_argument("--body", type=json_object_arg, help="any further Monitor fields as a JSON object")
    p = sub.add_parser("update", help="patch a monitor (owner)")
    add_common(p, OWNER)
    p.add_argument("monitor")
    p.add_argument("--patch", type=json_object_arg, required=True, help="JSON object of fields to change")
    p.add_argument("--reason")
    for action in ("pause", "resume", "retire"):
        p = sub.add_parser(action, help=f"{action} a monitor (owner)")
        add_common(p, OWNER)
        p.add_argument("monitor")
        p.add_argument("--reason")


def _add_lease(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (
        ("claim", "take exclusive, expiring ownership of a subject"),
        ("renew", "extend a held lease"),
        ("complete", "finish a held lease with an outcome"),
        ("release", "give a held lease back"),
        ("reject", "give a subject back as failed (dead-letters at the delivery count limit)"),
    ):
        p = sub.add_parser(action, help=text)
        add_common(p, READER)
        p.add_argument("subscription", help="subscription id (holding act)")
        p.add_argument("subject", help="the work item")
        if action in ("claim", "renew"):
            p.add_argument("--duration", type=int, dest="lease_duration_seconds", help="lease seconds")
        if action == "claim":
            p.add_argument("--note")
        if action == "complete":
            p.add_argument("--outcome", required=True, help="e.g. fixed, done, wontfix")
            p.add_argument("--evidence", type=json_arg, help="JSON evidence")
            p.add_argument("--note")
        if action in ("release", "reject"):
            p.add_argument("--reason")


# ---------------------------------------------------------------------------------------------- running


def _tags(pairs: list[tuple[str, str]]) -> dict[str, str] | None:
    return dict(pairs) or None


def _from(value: str | None) -> str | int | None:
    if value is None or value in ("head", "earliest"):
        return value
    try:
        return int(value)
    except ValueError:
        return value  # the server names what to send instead


def _human(name: str, args: argparse.Namespace, result: Any) -> None:
    from monitor_protocol.client import Monitor

    action = getattr(args, "action", None)
    if name == "publish":
        repeat = " (repeated idempotency key: nothing appended)" if result.idempotent else ""
        print(f"published seq={result.seq} type={result.observation.get('type')}{repeat}")
    elif name == "subscribe":
        s = result.subscription
        print(
            f"subscription {s.id} on {s.monitor} for {s.subscriber} cursor={s.cursor} "
            f"capabilities={','.join(s.capabilities)}"
        )
        print(f"token: {result.token}")
        if result.sink_secret:
            print(f"sink_secret: {result.sink_secret}")
    elif name == "pull":
        for obs in result.observations:
            print(obs_line(obs))
        print(f"NEXT {result.next} head={result.head} lag={result.lag} cursor={result.cursor}")
    elif name == "ack":
        # The protocol clamps an ack past the log to head + 1 (section 5): say so, or a typo looks acked.
        asked = args.cursor
        clamped = f" (asked {asked}: past the head, clamped to head + 1)" if asked > result.cursor else ""
        print(f"acked cursor={result.cursor} head={result.head} lag={result.lag}{clamped}")
    elif name == "seek":
        print(f"cursor={result.cursor}")
    elif name == "state":
        live = result.live
        print(
            f"{result.monitor}: head={result.head} live={live.get('value')}"
            f"{' (' + str(live.get('reason')) + ')' if live.get('reason') else ''}"
        )
        print(f"counters {dumps(result.counters)}")
        conf = result.confidence
        print(f"confidence={conf.get('value')} gaps={','.join(conf.get('gaps') or []) or '-'}")
    elif name == "monitors" and action == "list":
        for m in result:
            print(f"{m.id}\thead={m.head}\tactive={str(m.active).lower()}\t{m.visibility}\t{m.name}")
        if not result:  # stdout stays empty for scripts; a person is told why
            seen = (
                "public monitors and the token's own"
                if resolve_token(args)
                else "public monitors (no token was given)"
            )
            print(f"no monitors: this server shows {seen}", file=sys.stderr)
    elif name == "monitors" and action == "get":
        print_json(result.raw)
    elif name == "monitors" and action == "create":
        m = result.monitor
        print(f"created monitor {m.id} (version {m.version}, owner {m.owner})")
        print(f"owner_token: {result.owner_token}")
        if result.subscribe_token:
            print(f"subscribe_token: {result.subscribe_token}")
    elif name == "monitors":
        m: Monitor = result.monitor
        print(f"{action} {m.id}: version={m.version} active={str(m.active).lower()} seq={result.seq}")
    elif name == "lease" and action in ("claim", "renew"):
        lease = result.lease
        extra = " (already held)" if result.idempotent else ""
        print(f"lease {lease.get('subject')} held by {lease.get('holder')} until {result.expires}{extra}")
    elif name == "lease":
        dead = " dead_letter=true" if result.dead_letter else ""
        print(f"{action} ok seq={result.seq}{dead}")


def _call(name: str, args: argparse.Namespace, c: Any) -> Any:
    action = getattr(args, "action", None)
    if name == "publish":
        fields = {
            k: getattr(args, k)
            for k in (
                "actor",
                "origin",
                "tier",
                "verification",
                "on_behalf_of",
                "supersedes",
                "source_ref",
                "idempotency_key",
            )
        }
        fields["tags"] = _tags(args.tag)
        return c.publish(
            args.monitor, args.type, subject=args.subject, data=args.data, retries=args.retries, **fields
        )
    if name == "subscribe":
        return c.subscribe(
            args.monitor,
            args.subscriber,
            capabilities=args.capabilities,
            filter=args.filter,
            from_=_from(args.from_),
            protocol=args.protocol,
            reset_policy=args.reset_policy,
            sink=args.sink,
            retire_after_mute_seconds=args.retire_after_mute_seconds,
            sink_secret=args.sink_secret,
        )
    if name == "pull":
        return c.pull(
            args.subscription, cursor=args.cursor, limit=args.limit, wait=args.wait, filter=args.filter
        )
    if name == "ack":
        return c.ack(args.subscription, args.cursor)
    if name == "seek":
        return c.seek(args.subscription, args.cursor, args.reason)
    if name == "state":
        return c.state(args.monitor)
    if name == "monitors":
        return _monitors(args, c, action)
    if name == "lease":
        return _lease(args, c, action)
    raise ValueError(f"unknown command {name}")


def _monitors(args: argparse.Namespace, c: Any, action: str) -> Any:
    if action == "list":
        return c.list_monitors()
    if action == "get":
        return c.get_monitor(args.monitor)
    if action == "create":
        fields = dict(args.body or {})
        for key in (
            "name",
            "description",
            "types",
            "capabilities",
            "default_grant",
            "visibility",
            "horizon",
            "owner",
        ):
            if getattr(args, key) is not None:
                fields[key] = getattr(args, key)
        return c.create_monitor(args.monitor, **fields)
    if action == "update":
        return c.update_monitor(args.monitor, args.patch, reason=args.reason)
    lifecycle: dict[str, Callable[..., Any]] = {
        "pause": c.pause_monitor,
        "resume": c.resume_monitor,
        "retire": c.retire_monitor,
    }
    return lifecycle[action](args.monitor, args.reason)


def _lease(args: argparse.Namespace, c: Any, action: str) -> Any:
    if action == "claim":
        return c.claim(
            args.subscription,
            args.subject,
            lease_duration_seconds=args.lease_duration_seconds,
            note=args.note,
        )
    if action == "renew":
        return c.renew_lease(
            args.subscription, args.subject, lease_duration_seconds=args.lease_duration_seconds
        )
    if action == "complete":
        return c.complete(
            args.subscription, args.subject, args.outcome, evidence=args.evidence, note=args.note
        )
    if action == "release":
        return c.release(args.subscription, args.subject, args.reason)
    return c.reject(args.subscription, args.subject, args.reason)


def run(name: str, args: argparse.Namespace) -> int:
    from monitor_protocol.client import Client, ConnectionFailed, MonitorProtocolError

    token = resolve_token(args)
    if token is None and name in NEEDS_TOKEN:
        where = " or ".join(["--token", *(f"env {env}" for env in getattr(args, "_token_env", ()))])
        sentence = f"no token was given: pass it with {where} (nothing was sent)"
        print(f"error: {sentence}", file=sys.stderr)
        if args.json:
            print_json({"code": "USAGE", "error": sentence})
        return EXIT_USAGE
    try:
        with Client(args.base, token) as c:
            result = _call(name, args, c)
    except (MonitorProtocolError, ConnectionFailed, ValueError, TypeError) as exc:
        return report_error(exc, args.json, None if token else tuple(getattr(args, "_token_env", ())))
    if args.json:
        print_json([m.raw for m in result] if isinstance(result, list) else result.raw)
    else:
        _human(name, args, result)
    return EXIT_OK
