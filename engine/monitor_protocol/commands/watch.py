"""`mp watch SUBSCRIPTION_ID`: follow a subscription, one line per observation (PROTOCOL.md section 9).

Written for an agent's Monitor tool, which turns every line on stdout into an event:

    OBS seq=17 type=com.example.ci.run subject=build-412 tier=measured origin=probe actor=probe:ci
        redelivered=false data={...}                                  (one line; data cut at 400 chars)
    NEXT 18          --manual-ack only: the cursor to commit with `mp ack SUB 18` once handled
    DOWN <reason>    once, when the server stops answering (retries with backoff up to 10 s)
    UP <base>        when it answers again
    EXPIRED ...      the cursor fell below the retention floor; then the reset policy is followed
    RETIRED          the subscription was retired: exit 0

Delivery stays a queue (P4): a batch is acknowledged only after its lines are printed and flushed, so a
watch killed in between gets the batch again (marked `redelivered=true`) when it restarts at the committed
cursor. After a DOWN the watch always resumes at the committed cursor: an ack that did not reach the server
means the batch comes back. `--catch-up` first replays, read-only, what this subscription has already
committed (from the start of the log up to its cursor), ends that replay with `CAUGHT-UP <cursor>`, then
follows.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

from .client_cmds import DEFAULT_BASE, READER, obs_line, resolve_token

HELP = "follow a subscription: one OBS line per observation, for an agent's Monitor tool"

MAX_BACKOFF_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.25


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("subscription", help="subscription id (sub-...)")
    parser.add_argument("--token", default=None, help=f"the reader token (else env {' then '.join(READER)})")
    parser.add_argument(
        "--base",
        default=os.environ.get("MP_BASE", DEFAULT_BASE),
        help="server URL (env MP_BASE, default %(default)s)",
    )
    parser.add_argument(
        "--wait", type=int, default=30, help="long poll whole seconds per request, 0..50 (default 30)"
    )
    parser.add_argument("--limit", type=int, default=None, help="observations per batch (1..200)")
    parser.add_argument(
        "--manual-ack",
        action="store_true",
        help="print NEXT <cursor> after each batch and leave the commit to `mp ack`",
    )
    parser.add_argument(
        "--catch-up",
        action="store_true",
        help="first replay (read-only) what was already committed, then follow",
    )
    parser.add_argument(
        "--reset-policy",
        choices=("earliest", "latest", "none"),
        default=None,
        help="what to do on EXPIRED when the server does not say (default: none)",
    )
    parser.set_defaults(_token_env=READER)


class _Out:
    def __init__(self) -> None:
        self.stream = sys.stdout

    def line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class Watch:
    """The follow loop, separate from argument parsing so it can be driven with any client."""

    def __init__(
        self, client: Any, args: argparse.Namespace, out: _Out | None = None, sleep: Any = time.sleep
    ) -> None:
        self.c = client
        self.sub = args.subscription
        self.wait = max(0, int(args.wait))
        self.limit = args.limit
        self.manual = bool(args.manual_ack)
        self.catch_up = bool(args.catch_up)
        self.reset_policy = args.reset_policy
        self.out = out or _Out()
        self.sleep = sleep
        self.down = False
        self.backoff = FIRST_BACKOFF_SECONDS
        # Where the next pull starts; None means "at the committed cursor" (the server's).
        self.position: int | None = None

    # -- failures ---------------------------------------------------------------------------------

    def _went_down(self, reason: str) -> None:
        if not self.down:
            self.out.line(f"DOWN {reason}")
            self.down = True
        self.position = None  # whatever was not acked comes back
        delay = min(MAX_BACKOFF_SECONDS, self.backoff)
        self.sleep(delay * random.uniform(0.8, 1.0))
        self.backoff = min(MAX_BACKOFF_SECONDS, self.backoff * 2)

    def _came_up(self) -> None:
        self.backoff = FIRST_BACKOFF_SECONDS
        if self.down:
            self.down = False
            self.out.line(f"UP {self.c.base}")

    def _expired(self, err: Any) -> int | None:
        """Follow the reset policy after a 410; returns an exit status, or None to keep following."""
        extras = err.extras
        floor = extras.get("retention_floor")
        policy = extras.get("reset_policy") or self.reset_policy or "none"
        self.out.line(
            f"EXPIRED requested={extras.get('requested')} retention_floor={floor} reset_policy={policy} "
            f"relist={extras.get('relist')}"
        )
        if policy == "none" or floor is None:
            print(f"error: {err.code}: {err.message}", file=sys.stderr)
            return 1
        from ..client import ConnectionFailed

        try:
            if policy == "earliest":
                target = int(floor)
            else:
                target = int(self._pull(cursor=int(floor), wait=0, limit=1).head) + 1
            self.c.seek(self.sub, target, f"watch: cursor expired, reset_policy {policy}")
        except ConnectionFailed as exc:
            self._went_down(exc.reason)
        self.position = None
        return None

    # -- the loop ---------------------------------------------------------------------------------

    def _pull(self, **kw: Any) -> Any:
        kw.setdefault("limit", self.limit)
        return self.c.pull(self.sub, **kw)

    def _replay_committed(self) -> None:
        from ..client import MonitorProtocolError

        # Read-only replays only (the `cursor` parameter): learning the committed cursor must not mark
        # anything delivered, or the backlog would later come back flagged as redelivered.
        try:
            first = self._pull(cursor=0, wait=0, limit=1)
        except MonitorProtocolError as err:
            if err.code != "CURSOR_EXPIRED" or err.extras.get("retention_floor") is None:
                raise
            first = self._pull(cursor=int(err.extras["retention_floor"]), wait=0, limit=1)
        committed = first.cursor
        at = int(first.retention_floor or 0)
        while at < committed:
            page = self._pull(cursor=at, wait=0)
            shown = [o for o in page.observations if _seq(o) < committed]
            for obs in shown:
                self.out.line(obs_line(obs))
            capped = bool(page.raw.get("scan_capped"))  # a bounded empty page: go on from its next
            if (
                (not page.observations and not capped)
                or len(shown) < len(page.observations)
                or page.next <= at
            ):
                break
            at = page.next
        self.out.line(f"CAUGHT-UP {committed}")

    def _ack(self, cursor: int) -> None:
        from ..client import MonitorProtocolError

        try:
            self.c.ack(self.sub, cursor)
        except MonitorProtocolError as err:
            if err.code != "CURSOR_BACKWARDS":
                raise
            # Someone committed further than this batch (another reader of the same subscription): fine.

    def run(self) -> int:
        from ..client import ConnectionFailed, MonitorProtocolError

        pending_catch_up = self.catch_up
        while True:
            try:
                if pending_catch_up:
                    self._replay_committed()
                    self._came_up()
                    pending_catch_up = False
                batch = self._pull(wait=self.wait, cursor=self.position)
                self._came_up()
                if batch.observations:
                    for obs in batch.observations:
                        self.out.line(obs_line(obs))
                    if self.manual:
                        self.out.line(f"NEXT {batch.next}")
                        self.position = batch.next
                    else:
                        self._ack(batch.next)
                elif self.manual and batch.raw.get("scan_capped") and batch.next > (self.position or 0):
                    # A bounded read examined rows none of which is for this feed: read on from there
                    # (read-only; what was examined, nothing of it matching, needs no ack).
                    self.position = batch.next
                elif self.manual and self.position is not None and batch.cursor > self.position:
                    self.position = batch.cursor  # someone acked past what this watch has read
            except ConnectionFailed as exc:
                self._went_down(exc.reason)
            except MonitorProtocolError as err:
                if err.code == "UNEXPECTED_RESPONSE" and err.status >= 500:
                    # Not the protocol speaking (a proxy or a crashing process): treat it as down.
                    self._went_down(f"HTTP {err.status}")
                    continue
                self._came_up()
                if err.retired or (err.code == "NOT_FOUND" and "retired" in err.extras):
                    self.out.line(f"RETIRED cursor={err.extras.get('cursor')}")
                    return 0
                if err.code == "CURSOR_EXPIRED":
                    status = self._expired(err)
                    if status is not None:
                        return status
                    continue
                print(f"error: {err.code}: {err.message}", file=sys.stderr)
                return 1


def _seq(obs: dict[str, Any]) -> int:
    try:
        return int(obs.get("id") or obs.get("sequence") or 0)
    except (TypeError, ValueError):
        return 0


def run(name: str, args: argparse.Namespace) -> int:
    from ..client import Client

    token = resolve_token(args)
    if not token:
        print(
            "error: UNAUTHORIZED: mp watch needs the reader token: --token or env MP_READER_TOKEN",
            file=sys.stderr,
        )
        return 1
    if args.limit is not None and not 1 <= args.limit <= 200:
        print("error: INVALID: --limit is 1..200", file=sys.stderr)
        return 1
    with Client(args.base, token) as client:
        try:
            return Watch(client, args).run()
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            return 0
