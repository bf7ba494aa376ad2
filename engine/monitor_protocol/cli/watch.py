"""`mp watch SUBSCRIPTION_ID`: follow a subscription, one line per observation (docs/protocol.md section 9).

Written for an agent's Monitor tool, which turns every line on stdout into an event:

    OBS seq=17 type=com.example.ci.run subject=build-412 tier=measured origin=probe actor=probe:ci
        redelivered=false data={...}                                  (one line)
    NEXT 18          --manual-ack only: the cursor to commit with `mp ack SUB 18` once handled
    CATCHUP 3 from=15 head=20   --catch-up only: the backlog that waited (cursor 15 to head 20) follows...
    LIVE             ...and is over: what follows arrived while watching
    DOWN <reason>    once, when the server stops answering (retries with backoff up to 10 s)
    UP <base>        when it answers again
    EXPIRED ...      the cursor fell below the retention floor; then the reset policy is followed
    RETIRED cursor=N the subscription was retired: exit 0
    ERROR 401 UNAUTHORIZED This needs...   a protocol failure, the server's sentence after it (also on stderr): exit non-zero
                     (the status `mp --help` lists: 4 UNAUTHORIZED, 5 NOT_FOUND, 3 other refusals)

Every line is one physical line under any line splitter and at most 4 KiB: the output is printable ASCII
(0x20..0x7E) and LF only, written as bytes whatever the locale or PYTHONIOENCODING says.

* Words (seq, type, subject, tier, origin, actor, reset_policy, relist) are percent-encoded UTF-8: every
  character outside 0x21..0x7E, and `%` and `=` themselves, becomes `%XX` per byte (space `%20`, LF `%0A`,
  `é` `%C3%A9`, U+2028 `%E2%80%A8`), so a value holds no space and no `key=`: it can never forge a field or
  a line. A value that is exactly `-` prints `%2D` (`-` alone means "none"). Decode with
  `urllib.parse.unquote`. A word longer than its bound (type 300, subject 1200, actor 700, others 64
  characters, encoded) is cut at a character boundary and ends with `...`.
* `data` is compact JSON with `\\uHHHH` escapes for every non-ASCII and control character (DEL included)
  and for the space, so nothing after `data=` is a word of the line. It is always a JSON object, unless
  its JSON is longer than 400 characters: then it is a JSON string (at most 400 characters, quotes
  included) holding the first characters of that JSON followed by `...`.
  Either way `json.loads` reads it.

`--format jsonl` prints the same events as one JSON object per line (ASCII, `\\uHHHH` escapes, same
bounds): `{"kind":"OBS","seq":17,"type":..,"subject":..,"tier":..,"origin":..,"actor":..,
"redelivered":false,"data":{..}}` (plus `"cut":["subject",..]` naming the fields that were cut; a cut
string ends with `...`), `{"kind":"NEXT","cursor":18}`, `{"kind":"CATCHUP","count":3,"from":15,"head":20}`,
`{"kind":"LIVE"}`, `{"kind":"DOWN","reason":".."}`, `{"kind":"UP","base":".."}`, `{"kind":"EXPIRED",
"requested":..,"retention_floor":..,"reset_policy":..,"relist":..}`, `{"kind":"RETIRED","cursor":..}`,
`{"kind":"ERROR","status":401,"code":"UNAUTHORIZED","message":"..."}`.

Delivery stays a queue (P4): a batch is acknowledged only after its lines are printed and flushed, so a
watch killed in between gets the batch again (marked `redelivered=true`) when it restarts at the committed
cursor. After a DOWN the watch resumes at the committed cursor, its next pull carrying again the ack that
was in flight (acks are idempotent): a batch it printed is not printed again, one it never printed comes back.

`--catch-up` frames the backlog that waited while nobody watched: at start it reads (read-only) the
committed cursor and the head, prints `CATCHUP <n> from=<cursor> head=<head>` (n: the observations for
this subscription in between), prints that backlog, acknowledged as usual (or NEXT with --manual-ack),
then `LIVE`, then follows. It never replays what was already acknowledged. `--once` drains what waits (up
to the head seen by its first pull), acknowledges it and exits 0; a network failure then prints DOWN and
exits non-zero (6, unreachable). `--once` with `--catch-up` is a usage error: a drain that exits has no LIVE part to frame.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from monitor_protocol.cli import client_cmds
from monitor_protocol.cli.client_cmds import (
    DEFAULT_BASE,
    EXIT_PIPE,
    EXIT_UNAUTHORIZED,
    READER,
    resolve_token,
    whole_number,
)
from monitor_protocol.cli.lines import (
    CUT,
    LINE_MAX_BYTES,
    ascii_json,
    encode_word,
    free_text,
    obs_jsonl,
    obs_text,
    one_sentence,
    percent,
    seq_of,
)
from monitor_protocol.core.vocab import MAX_LIMIT, MAX_WAIT_SECONDS

HELP = "follow a subscription: one OBS line per observation, for an agent's Monitor tool"

MAX_BACKOFF_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.25


# ---------------------------------------------------------------------------------------------- arguments


def _wait_seconds(text: str) -> int:
    return whole_number(text, "--wait (seconds)", 1, MAX_WAIT_SECONDS)


def _batch_limit(text: str) -> int:
    return whole_number(text, "--limit", 1, MAX_LIMIT)


def base_url(text: str) -> str:
    """An http(s) URL naming a host (the --base of `mp watch` and `mp mcp`), else a usage error."""
    try:
        parts = urlsplit(text)
    except ValueError:
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"the server URL must start with http:// or https:// and name a host, e.g. {DEFAULT_BASE} "
            f"(got {text!r})"
        )
    return text


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("subscription", nargs="?", default=None, help="subscription id (sub-...)")
    parser.add_argument(
        "--subscription",
        dest="subscription_option",
        default=None,
        metavar="ID",
        help="the subscription id, as an option (the same as the positional one)",
    )
    parser.add_argument("--token", default=None, help=f"the reader token (else env {' then '.join(READER)})")
    parser.add_argument(
        "--base",
        type=base_url,
        default=os.environ.get("MP_BASE", DEFAULT_BASE),
        help="server URL, http:// or https:// (env MP_BASE, default %(default)s)",
    )
    parser.add_argument(
        "--wait",
        type=_wait_seconds,
        default=30,
        help=f"long poll whole seconds per request, 1..{MAX_WAIT_SECONDS} (default 30)",
    )
    parser.add_argument(
        "--limit", type=_batch_limit, default=None, help=f"observations per batch (1..{MAX_LIMIT})"
    )
    parser.add_argument(
        "--manual-ack",
        action="store_true",
        help="print NEXT <cursor> after each batch and leave the commit to `mp ack`",
    )
    parser.add_argument(
        "--catch-up",
        action="store_true",
        help="frame the backlog that waited (CATCHUP <n> from=<cursor> head=<head> ... LIVE), then follow",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="drain what waits now (up to the head), acknowledge it and exit 0",
    )
    parser.add_argument(
        "--format",
        choices=("text", "jsonl"),
        default="text",
        help="text: OBS lines (default); jsonl: one JSON object per line",
    )
    parser.add_argument(
        "--reset-policy",
        choices=("earliest", "latest", "none"),
        default=None,
        help="what to do on EXPIRED when the server does not say; this server always says the "
        "subscription's own (set at subscribe), so this is for other servers (default: none)",
    )
    plain_error = parser.error

    def error(message: str) -> Any:
        # A Monitor tool reads stdout only: the refusal there too, as an ERROR line, then the usage on stderr.
        _Out(_format_asked(sys.argv)).usage(message)
        return plain_error(message)

    parser.error = error  # type: ignore[method-assign]
    parser.set_defaults(_token_env=READER, _usage=parser.error)


def _format_asked(argv: list[str]) -> str:
    """The --format on the command line, read before (or without) argparse: a usage error's line has one."""
    for i, arg in enumerate(argv):
        if arg == "--format=jsonl" or (arg == "--format" and argv[i + 1 : i + 2] == ["jsonl"]):
            return "jsonl"
    return "text"


# ---------------------------------------------------------------------------------------------- output


def _guard(text: str) -> str:
    """Last line of defence: printable ASCII only, and within the line bound."""
    if not all(0x20 <= ord(ch) <= 0x7E for ch in text):
        text = "".join(ch if 0x20 <= ord(ch) <= 0x7E else percent(ch) for ch in text)
    if len(text) > LINE_MAX_BYTES - 1:
        text = text[: LINE_MAX_BYTES - 1 - len(CUT)] + CUT
    return text


class _Out:
    """Writes lines as ASCII bytes (whatever the locale or PYTHONIOENCODING), flushed one by one."""

    def __init__(self, fmt: str = "text", stream: Any = None) -> None:
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stdout

    def line(self, text: str) -> None:
        data = (_guard(text) + "\n").encode("ascii")
        buffer = getattr(self.stream, "buffer", None)
        if buffer is not None:
            self.stream.flush()
            buffer.write(data)
            buffer.flush()
        else:
            self.stream.write(data.decode("ascii"))
            self.stream.flush()

    def event(self, kind: str, text: str, fields: dict[str, Any]) -> None:
        if self.fmt == "jsonl":
            self.line(ascii_json({"kind": kind, **fields}))
        else:
            self.line(text)

    # -- the events ---------------------------------------------------------------------------------

    def obs(self, obs: dict[str, Any]) -> None:
        self.line(obs_jsonl(obs) if self.fmt == "jsonl" else obs_text(obs))

    def next(self, cursor: int) -> None:
        self.event("NEXT", f"NEXT {int(cursor)}", {"cursor": int(cursor)})

    def catch_up(self, count: int, frm: int, head: int) -> None:
        self.event(
            "CATCHUP",
            f"CATCHUP {count} from={frm} head={head}",
            {"count": count, "from": frm, "head": head},
        )

    def live(self) -> None:
        self.event("LIVE", "LIVE", {})

    def down(self, reason: str) -> None:
        reason = free_text(reason)
        self.event("DOWN", f"DOWN {reason}", {"reason": reason})

    def up(self, base: str) -> None:
        base = free_text(base)
        self.event("UP", f"UP {base}", {"base": base})

    def expired(self, requested: Any, floor: Any, policy: Any, relist: Any) -> None:
        words = [encode_word(v)[0] for v in (requested, floor, policy)]
        relist_word = encode_word(relist, 300)[0]
        self.event(
            "EXPIRED",
            f"EXPIRED requested={words[0]} retention_floor={words[1]} reset_policy={words[2]} "
            f"relist={relist_word}",
            {
                "requested": _json_scalar(requested),
                "retention_floor": _json_scalar(floor),
                "reset_policy": _json_scalar(policy),
                "relist": _json_scalar(relist),
            },
        )

    def retired(self, cursor: Any) -> None:
        self.event("RETIRED", f"RETIRED cursor={encode_word(cursor)[0]}", {"cursor": _json_scalar(cursor)})

    def usage(self, message: str) -> None:
        """A usage error (exit 2): no request was sent, so no status."""
        said = free_text(f"mp watch: {message} (mp watch --help)")
        self.event("ERROR", f"ERROR - USAGE {said}", {"status": None, "code": "USAGE", "message": said})

    def error(self, status: int, code: str, message: str = "") -> None:
        """The refusal, and the server's sentence after it: a Monitor tool reads stdout only."""
        word = encode_word(code)[0]
        said = free_text(message) if message else ""
        extra = {"message": said} if said else {}
        self.event(
            "ERROR",
            f"ERROR {int(status)} {word}" + (f" {said}" if said else ""),
            {"status": int(status), "code": word, **extra},
        )


def _json_scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    return free_text(value)[:300]


def _failure_status(exc: BaseException) -> int:
    """The exit status `mp --help` lists for this failure (client_cmds.exit_status), else 1."""
    status_of = getattr(client_cmds, "exit_status", None)
    return int(status_of(exc)) if status_of is not None else 1


def _stderr(message: str) -> None:
    try:
        sys.stderr.write(message.encode("ascii", "backslashreplace").decode("ascii") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------------------------------------- the loop


class Watch:
    """The follow loop, separate from argument parsing so it can be driven with any client."""

    def __init__(
        self, client: Any, args: argparse.Namespace, out: _Out | None = None, sleep: Any = time.sleep
    ) -> None:
        self.c = client
        self.sub = args.subscription
        self.wait = int(args.wait)
        self.limit = args.limit
        self.manual = bool(args.manual_ack)
        self.catch_up = bool(args.catch_up)
        self.once = bool(getattr(args, "once", False))
        self.reset_policy = args.reset_policy
        self.out = out or _Out(getattr(args, "format", "text"))
        self.sleep = sleep
        self.down = False
        self.backoff = FIRST_BACKOFF_SECONDS
        # Where the next pull starts; None means "at the committed cursor" (the server's).
        self.position: int | None = None
        # While a --catch-up frame is open: the head at start, and how many backlog rows are still to come
        # (None once unknown, after a DOWN brought printed rows back).
        self.boundary: int | None = None
        self.backlog_left: int | None = None
        # The `next` of the last printed batch, not yet acknowledged: the next pull carries it (ack-and-pull,
        # one request), and --once sends it on its own before exiting.
        self.pending_ack: int | None = None
        # --manual-ack: the seqs printed and not known to be acknowledged (what a marking pull must reach).
        self.printed: list[int] = []

    # -- failures ---------------------------------------------------------------------------------

    def _went_down(self, reason: str) -> None:
        if not self.down:
            self.out.down(reason)
            self.down = True
        self.position = None  # whatever was not acked comes back
        self.backlog_left = None  # ... so the count of what is left in a catch-up frame is unknown
        if self.once:
            return
        delay = min(MAX_BACKOFF_SECONDS, self.backoff)
        self.sleep(delay * random.uniform(0.8, 1.0))
        self.backoff = min(MAX_BACKOFF_SECONDS, self.backoff * 2)

    def _came_up(self) -> None:
        self.backoff = FIRST_BACKOFF_SECONDS
        if self.down:
            self.down = False
            self.out.up(self.c.base)

    def _expired(self, err: Any) -> int | None:
        """Follow the reset policy after a 410; returns an exit status, or None to keep following."""
        extras = err.extras
        floor = extras.get("retention_floor")
        policy = extras.get("reset_policy") or self.reset_policy or "none"
        self.out.expired(extras.get("requested"), floor, policy, extras.get("relist"))
        self.pending_ack = None  # the policy decides where reading resumes, not the batch printed before
        if policy == "none" or floor is None:
            _stderr(f"error: {err.code}: {one_sentence(err.message)}")
            return 1
        from monitor_protocol.client import ConnectionFailed

        try:
            if policy == "earliest":
                target = int(floor)
            else:
                target = int(self._pull(cursor=int(floor), wait=0, limit=1).head) + 1
            self.c.seek(self.sub, target, f"watch: cursor expired, reset_policy {policy}")
        except ConnectionFailed as exc:
            self._went_down(f"{exc.reason} ({self.c.base})")  # which server: a typo is not an outage
        self.position = None
        return None

    # -- catch-up ----------------------------------------------------------------------------------

    def _pull(self, **kw: Any) -> Any:
        if kw.get("limit") is None:
            kw["limit"] = self.limit
        if kw.get("ack", 0) is None:
            del kw["ack"]
        return self.c.pull(self.sub, **kw)

    def _open_catch_up(self) -> None:
        """Read (read-only) the committed cursor, the head and the size of the backlog; print CATCHUP."""
        from monitor_protocol.client import MonitorProtocolError

        # Read-only replays only (the `cursor` parameter): learning the committed cursor must not mark
        # anything delivered, or the backlog would come back flagged as redelivered.
        try:
            probe = self._pull(cursor=0, wait=0, limit=1)
        except MonitorProtocolError as err:
            if err.code != "CURSOR_EXPIRED" or err.extras.get("retention_floor") is None:
                raise
            probe = self._pull(cursor=int(err.extras["retention_floor"]), wait=0, limit=1)
        self._came_up()  # UP (after a DOWN at start) before the frame it opens, in the order it happened
        committed, head = int(probe.cursor), int(probe.head)
        floor = int(probe.retention_floor or 0)
        if max(committed, 1) < floor:
            # The backlog starts below the retention floor: the pull says EXPIRED and the policy decides.
            self._pull(cursor=committed, wait=0, limit=1)
        if committed > head:
            count = 0
        elif probe.lag is not None and not probe.raw.get("lag_capped"):
            count = int(probe.lag)  # P5: what this subscription would receive now, its filter included
        else:
            count = self._count_backlog(committed, head)
        self.out.catch_up(count, committed, head)
        self.boundary, self.backlog_left = head, count
        if count == 0:
            self._go_live()

    def _count_backlog(self, start: int, head: int) -> int:
        """Count (read-only) this subscription's observations from `start` to `head` (a capped lag)."""
        count, at = 0, start
        while at <= head:
            page = self._pull(cursor=at, wait=0, limit=MAX_LIMIT)
            count += sum(1 for o in page.observations if seq_of(o) <= head)
            if (not page.observations and not page.raw.get("scan_capped")) or page.next <= at:
                break
            at = page.next
        return count

    def _go_live(self) -> None:
        if self.boundary is not None:
            self.boundary = None
            self.backlog_left = None
            self.out.live()

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> int:
        from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

        pending_catch_up = self.catch_up
        drain_head: int | None = None  # --once: the head seen by the first pull
        while True:
            try:
                if pending_catch_up:
                    self._open_catch_up()
                    self._came_up()
                    pending_catch_up = False
                framing = self.boundary is not None
                limit = self.limit
                if framing and self.backlog_left:
                    limit = min(self.limit or MAX_LIMIT, self.backlog_left)  # the backlog, not past it
                # after a DOWN the first pull does not wait: UP is said when the server answers again
                wait = 0 if (self.once or framing or self.down) else self.wait
                ack = self.pending_ack if self.position is None else None
                replay = self.position is not None
                batch = self._pull(wait=wait, cursor=self.position, limit=limit, ack=ack)
                if self.manual and batch.observations:
                    # The seqs printed and not acknowledged, once each (a DOWN prints some again), lowest
                    # first: a marking pull reaches MAX_LIMIT at most, so no more are kept.
                    committed = int(batch.cursor)
                    seqs = {q for q in self.printed if q >= committed} | {
                        seq_of(o) for o in batch.observations
                    }
                    self.printed = sorted(seqs)[:MAX_LIMIT]
                    if replay:  # before the lines: a line printed is one the server counts as delivered
                        self._mark_delivered()
                self.pending_ack = None
                self._came_up()
                reset = batch.raw.get("reset")
                if isinstance(reset, dict):  # the server moved the cursor by the reset policy: said, then on
                    policy = reset.get("reset_policy")
                    relist = f"monitors/state?id={batch.raw.get('monitor')}" if policy == "earliest" else None
                    self.out.expired(reset.get("requested"), reset.get("retention_floor"), policy, relist)
                if drain_head is None:
                    drain_head = int(batch.head)
                for obs in batch.observations:
                    if self.boundary is not None and seq_of(obs) > self.boundary:
                        self._go_live()  # arrived after the start: the frame closes before it
                    self.out.obs(obs)
                    if self.boundary is not None and self.backlog_left is not None:
                        self.backlog_left -= 1
                capped = bool(batch.raw.get("scan_capped"))
                if batch.observations:
                    if self.manual:
                        self.out.next(batch.next)
                        self.position = batch.next
                    else:
                        self.pending_ack = batch.next  # sent with the next pull
                elif self.manual and capped and batch.next > (self.position or 0):
                    # A bounded read examined rows none of which is for this feed: read on from there
                    # (read-only; what was examined, nothing of it matching, needs no ack).
                    self.position = batch.next
                elif self.manual and self.position is not None and batch.cursor > self.position:
                    self.position = batch.cursor  # someone acked past what this watch has read
                if self.boundary is not None and (
                    batch.next > self.boundary
                    or (self.backlog_left is not None and self.backlog_left <= 0)
                    or (not batch.observations and not capped)
                ):
                    self._go_live()
                if self.once and ((not batch.observations and not capped) or int(batch.next) > drain_head):
                    self._flush_ack()
                    return 0
            except ConnectionFailed as exc:
                self._went_down(f"{exc.reason} ({self.c.base})")  # which server: a typo is not an outage
                if self.once:
                    return _failure_status(exc)
            except MonitorProtocolError as err:
                if err.status >= 500 or err.status == 429:
                    # Not the protocol refusing this request (a proxy, a crashing process, a storage failure
                    # answered 503 UNAVAILABLE, a budget): treat it as down and retry.
                    self._went_down(f"HTTP {err.status}")
                    if self.once:  # DOWN, as for a server that does not answer (mp --help: 6)
                        return int(getattr(client_cmds, "EXIT_UNREACHABLE", 1))
                    continue
                self._came_up()
                if err.code == "CURSOR_BACKWARDS" and self.pending_ack is not None:
                    # Someone committed further than this batch (another reader of the same subscription):
                    # fine; pull on from the committed cursor.
                    self.pending_ack = None
                    continue
                if err.retired or (err.code == "NOT_FOUND" and "retired" in err.extras):
                    self.out.retired(err.extras.get("cursor"))
                    return 0
                if err.code == "CURSOR_EXPIRED":
                    status = self._expired(err)
                    if status is not None:
                        return status
                    continue  # a catch-up not yet opened opens now, from the cursor the policy chose
                self.out.error(err.status, err.code, err.message)
                _stderr(f"error: {err.code}: {one_sentence(err.message)}")
                return _failure_status(err)

    def _mark_delivered(self) -> None:
        """--manual-ack reads past what is acknowledged with read-only replays (the `cursor` parameter), which
        the server does not count as delivered: one pull from the committed cursor (a pull never commits)
        reaches what is about to be printed, so that after a restart it comes back flagged `redelivered=true`
        (a failure here prints nothing: the watch goes DOWN and reads again from the committed cursor). It
        reaches MAX_LIMIT observations past the committed cursor at most, and with a filter that skips rows, the
        rows the server's scan budget examines from there: beyond either, the later ones come back unflagged."""
        self._pull(wait=0, limit=max(1, min(MAX_LIMIT, len(self.printed))))

    def _flush_ack(self) -> None:
        if self.pending_ack is not None:
            self._ack(self.pending_ack)
            self.pending_ack = None

    def _ack(self, cursor: int) -> None:
        from monitor_protocol.client import MonitorProtocolError

        try:
            self.c.ack(self.sub, cursor)
        except MonitorProtocolError as err:
            if err.code != "CURSOR_BACKWARDS":
                raise
            # Someone committed further than this batch (another reader of the same subscription): fine.


def run(name: str, args: argparse.Namespace) -> int:
    from monitor_protocol.client import Client

    usage = getattr(args, "_usage", None)

    def refuse(message: str) -> int:
        if usage is not None:
            usage(message)  # prints the usage and exits 2
        _stderr(f"mp watch: error: {message}")
        return 2

    positional, option = args.subscription, getattr(args, "subscription_option", None)
    if positional and option and positional != option:
        return refuse(
            f"the subscription is given twice with different values ({positional} and --subscription {option})"
        )
    args.subscription = positional or option
    if not args.subscription:
        return refuse("name the subscription: mp watch SUB or mp watch --subscription SUB")
    if getattr(args, "once", False) and args.catch_up:
        return refuse(
            "--once drains what waits and exits; --catch-up frames that backlog before following live: "
            "use one of them"
        )
    token = resolve_token(args)
    if not token:  # nothing sent; said as the server would, where a Monitor tool looks (stdout)
        _stderr(
            "error: UNAUTHORIZED: mp watch needs the reader token: --token, or env MP_READER_TOKEN (else MP_TOKEN)"
        )
        _Out(getattr(args, "format", "text")).error(
            401,
            "UNAUTHORIZED",
            "mp watch needs the reader token: --token, or env MP_READER_TOKEN (else MP_TOKEN)",
        )
        return EXIT_UNAUTHORIZED
    with Client(args.base, token) as client:
        try:
            return Watch(client, args).run()
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            return EXIT_PIPE  # stdout closed early (`| head`): quiet, as mp --help says
