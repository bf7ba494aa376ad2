"""`mp probe`: run one monitor's source on this machine and publish what it sees (docs/sources.md).

    mp probe --base URL --monitor ci --token $OWNER_TOKEN          # the source the monitor defines
    mp probe --monitor ci --every 60 -- gh run list --limit 1 --json status,conclusion
    mp probe --monitor health --http https://example.com/healthz --pick /status --on-change
    mp probe --monitor app --file /var/log/app.log

It runs with your rights (the safe default: a server never runs a command for you), with the environment
you give it minus this project's tokens (`MP_*`). What it sees goes through the client with idempotency keys,
one line at a time through a disk buffer (doors/sources/spool.py), so a probe restarted, or a server down and
back, neither loses nor duplicates what the server confirmed. It prints one line per event, printable ASCII,
for a terminal or an agent's Monitor tool (words percent-encoded as `mp watch` does):

    PROBE monitor=ci kind=shell mode=every ref=gh%20run%20list state=/home/you/.local/state/...
    SOURCE start pid=4242           SOURCE crash exit=1 backoff=2 reason=...   (also restart, throttled)
    PUB seq=17 key=r:1a2b3c:4 answered=true        (repeat=true: the server had it already)
    REFUSED 403 PROVENANCE_CEILING key=...          one observation refused (and logged by the server)
    DOWN <reason>   UP <base>                       the server unreachable, and back; kept on disk meanwhile
    DROPPED 12 max=10000                            the buffer was full: that many were not kept
    PAUSED          RESUMED                         the monitor was paused: the source stops until resumed
    RETIRED         the monitor was retired: exit 0
    KEPT 3 state=<dir>                              at exit: not yet confirmed, sent by the next run
                                                    (dropped=N: that many not kept; said at a later run)
    ERROR 401 UNAUTHORIZED                          a refusal of the probe itself: exit non-zero

`--once` runs the source once (a periodic run or fetch, what a file gained since the last run, or a long-lived
command until it exits), sends what waits and exits: 0 when everything is confirmed, 6 when the server could
not be reached (what is kept goes with the next run): fit for cron.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from monitor_protocol.cli.client_cmds import (
    DEFAULT_BASE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAUTHORIZED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    OWNER,
    resolve_token,
)
from monitor_protocol.cli.lines import LINE_MAX_BYTES, encode_word, free_text

HELP = "run a monitor's source here and publish what it sees (owner token)"

SEND_BATCH = 100
FIRST_BACKOFF_SECONDS = 0.25
MAX_BACKOFF_SECONDS = 10.0
PAUSED_RECHECK_SECONDS = 5.0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="a shell source's command and arguments",
    )
    parser.add_argument("--monitor", required=True, help="the monitor whose source this is")
    parser.add_argument(
        "--base",
        default=os.environ.get("MP_BASE", DEFAULT_BASE),
        help="server URL (env MP_BASE, default %(default)s)",
    )
    parser.add_argument("--token", default=None, help=f"the owner token (else env {' then '.join(OWNER)})")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--http", metavar="URL", help="an http source: fetch URL once per period")
    what.add_argument("--file", metavar="PATH", help="a file source: each line appended to PATH")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--every", type=float, metavar="SECONDS", help="run or fetch once per period")
    how.add_argument("--schedule", metavar="CRON", help='run on a cron schedule in UTC, e.g. "*/5 * * * *"')
    how.add_argument(
        "--follow",
        action="store_true",
        help="the command is long-lived: each line it prints is one observation",
    )
    parser.add_argument(
        "--type", help="the observation type (else the monitor's settings.type or first type)"
    )
    parser.add_argument("--subject", help="a subject, or a JSON pointer (/field) into the output")
    parser.add_argument(
        "--on-change", action="store_true", help="publish a periodic result only when it changed"
    )
    parser.add_argument("--ok-exit", metavar="CODES", help="exit codes that still mean an answer, e.g. 0,1")
    parser.add_argument(
        "--pick", metavar="POINTER", help="http: a value to pick from a JSON body, e.g. /status"
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="a run's or fetch's time limit")
    parser.add_argument("--shell", action="store_true", help="give the command line to /bin/sh -c")
    parser.add_argument("--once", action="store_true", help="run the source once, send what waits, exit")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the disk buffer and checkpoint (default $XDG_STATE_HOME/monitor-protocol/probe/<monitor>-<server>)",
    )
    parser.add_argument(
        "--buffer",
        type=int,
        default=10_000,
        metavar="N",
        help="observations kept on disk at most while the server is unreachable (default %(default)s)",
    )
    parser.set_defaults(_token_env=OWNER)


# ---------------------------------------------------------------------------------------------- output


class Out:
    """One printable ASCII line per event, flushed (an agent's Monitor tool reads them as they come)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stdout

    def line(self, *words: str) -> None:
        text = " ".join(w for w in words if w)
        text = "".join(ch if 0x20 <= ord(ch) <= 0x7E else "?" for ch in text)[: LINE_MAX_BYTES - 1]
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass


def word(name: str, value: Any, limit: int = 200) -> str:
    return f"{name}={encode_word(value, limit)[0]}"


def default_state_dir(base: str, monitor: str) -> Path:
    root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    server = hashlib.sha256(base.rstrip("/").encode()).hexdigest()[:8]
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in monitor)
    return root / "monitor-protocol" / "probe" / f"{safe}-{server}"


# ---------------------------------------------------------------------------------------------- the definition


def command_line_source(args: argparse.Namespace) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the source the command line gives, or None to use the monitor's; the settings and cadence the flags
    set over either)."""
    argv = list(args.argv or [])
    if argv and argv[0] == "--":
        argv = argv[1:]
    source: dict[str, Any] | None = None
    given = [bool(argv), bool(args.http), bool(args.file)]
    if sum(given) > 1:
        raise Usage("give one source: -- COMMAND, --http URL or --file PATH")
    if argv:
        source = {"kind": "shell", "ref": " ".join(argv) if args.shell else "", "settings": {}}
        if args.shell:
            source["settings"]["shell"] = True
        else:
            source["settings"]["argv"] = argv
    elif args.http:
        source = {"kind": "http", "ref": args.http, "settings": {}}
    elif args.file:
        source = {"kind": "file", "ref": os.path.abspath(args.file), "settings": {}}
    settings: dict[str, Any] = {}
    if args.type:
        settings["type"] = args.type
    if args.subject:
        settings["subject"] = args.subject
    if args.on_change:
        settings["on_change"] = True
    if args.pick:
        settings["pick"] = args.pick
    if args.timeout is not None:
        settings["timeout_seconds"] = args.timeout
    if args.ok_exit:
        try:
            settings["ok_exit"] = [int(c) for c in args.ok_exit.split(",") if c.strip()]
        except ValueError:
            raise Usage(f"--ok-exit takes exit codes such as 0,1, not {args.ok_exit!r}") from None
    cadence: dict[str, Any] = {}
    if args.every is not None:
        cadence = {"heartbeat_seconds": args.every}
    elif args.schedule:
        cadence = {"schedule": args.schedule}
    elif args.follow:
        cadence = {"event_driven": True}
    return source, {"settings": settings, "cadence": cadence}


def merged(monitor: dict[str, Any], source: dict[str, Any] | None, given: dict[str, Any]) -> dict[str, Any]:
    out = dict(monitor)
    src = dict(source if source is not None else out.get("source") or {"kind": "log"})
    settings = dict(src.get("settings") or {})
    if source is not None and source["kind"] == "shell":
        for key in ("argv", "shell"):  # the command line's command, not the definition's
            settings.pop(key, None)
        settings.update(source.get("settings") or {})
    settings.update(given["settings"])
    src["settings"] = settings
    out["source"] = src
    if given["cadence"]:
        out["cadence"] = given["cadence"]
    return out


NO_CADENCE = (
    "say how this command runs: --every SECONDS or --schedule CRON (one run per period, its output and exit "
    "code one observation), --follow (a long-lived process, one observation per line of its output), or "
    "--once for a single run; or set the monitor's cadence"
)


# ---------------------------------------------------------------------------------------------- the probe


class Usage(Exception):
    """A usage error found after parsing (exit 2, nothing sent)."""


class Fatal(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Probe:
    """The source's runner feeding the spool, and a sender emptying it through the client."""

    def __init__(self, client: Any, monitor_id: str, spool: Any, out: Out) -> None:
        self.client = client
        self.monitor_id = monitor_id
        self.spool = spool
        self.out = out
        self.added = asyncio.Event()  # the spool gained entries
        self.down = False
        self.backoff = FIRST_BACKOFF_SECONDS
        self.paused = asyncio.Event()
        self.resumed = asyncio.Event()
        self.retired = False
        self.plan: Any = None
        self.drop_reported = 0
        self.sending = asyncio.Lock()  # one batch in flight: a confirm must pop what that batch sent

    # -- the runner's sink ----------------------------------------------------------------------
    async def publish(self, body: dict[str, Any], checkpoint: dict[str, Any] | None) -> str:
        from monitor_protocol.doors.sources.runner import PUBLISHED, STOPPED

        self.note_dropped()
        before = self.spool.dropped
        self.spool.append([body])
        if self.spool.dropped > before:
            if not self.drop_reported:
                self.out.line("DROPPED", str(self.spool.dropped), f"max={self.spool.max_entries}")
            self.drop_reported = self.spool.dropped
            return STOPPED
        self.drop_reported = 0
        if checkpoint is not None:
            self.spool.save_checkpoint(checkpoint)
        self.added.set()
        return PUBLISHED

    def note_dropped(self) -> None:
        """Once there is room again, one observation says how many the full buffer did not keep (this run's or
        an earlier run's: the count is on disk)."""
        from monitor_protocol.core import sources

        def note(lost: int) -> dict[str, Any]:
            return sources.silent_body(
                self.plan,
                f"mp probe's buffer was full while the server could not be reached: {lost} observations were "
                "not kept",
                f"d:{os.urandom(6).hex()}",
                dropped=lost,
            )

        if self.spool.note_dropped(note):
            self.added.set()

    async def checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.spool.save_checkpoint(checkpoint)

    async def event(self, action: str, payload: dict[str, Any]) -> None:
        words = ["SOURCE", action]
        for name in ("pid", "exit", "backoff_seconds", "lines", "reason", "wait_seconds", "until"):
            if payload.get(name) is not None:
                words.append(
                    word(name.removesuffix("_seconds") if name == "backoff_seconds" else name, payload[name])
                )
        self.out.line(*words)

    # -- sending --------------------------------------------------------------------------------
    def _went_down(self, reason: str) -> None:
        if not self.down:
            self.down = True
            self.out.line(
                "DOWN", free_text(reason), word("kept", len(self.spool)), word("state", str(self.spool.dir))
            )

    def _came_up(self) -> None:
        self.backoff = FIRST_BACKOFF_SECONDS
        if self.down:
            self.down = False
            self.out.line("UP", free_text(self.client.base))

    async def send_once(self) -> bool:
        """Send what waits, once: True when the spool is empty afterwards."""
        async with self.sending:
            return await self._send()

    async def _send(self) -> bool:
        from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

        while len(self.spool):
            if self.paused.is_set():
                return False
            batch = self.spool.head(SEND_BATCH)
            try:
                reply = await self.client.publish_many(self.monitor_id, batch)
            except ConnectionFailed as exc:
                self._went_down(exc.reason)
                return False
            except MonitorProtocolError as err:
                if err.status >= 500 or err.status == 429:
                    self._went_down(f"HTTP {err.status} {err.code}")
                    return False
                self.out.line("ERROR", str(err.status), encode_word(err.code)[0])
                print(f"mp probe: error: {err.code}: {err.message}", file=sys.stderr)
                raise Fatal(EXIT_UNAUTHORIZED if err.code == "UNAUTHORIZED" else EXIT_NOT_FOUND) from None
            self._came_up()
            done = 0
            for body, item in zip(batch, reply.items, strict=False):
                err = item.error
                if err is not None and err.code == "UNAVAILABLE":
                    if err.status >= 500:
                        self._went_down(f"HTTP {err.status} {err.code}")
                        break
                    live = err.extras.get("live") or {}
                    if live.get("reason") == "retired":
                        self.retired = True
                        self.out.line("RETIRED")
                        self.paused.set()  # the source stops, for good
                    elif not self.paused.is_set():
                        self.out.line("PAUSED")
                        self.paused.set()
                    break  # kept: sent again once the monitor takes observations
                done += 1
                key = body.get("idempotency_key")
                answered = (body.get("data") or {}).get("answered")
                if err is None:
                    self.out.line(
                        "PUB",
                        f"seq={item.seq}",
                        word("key", key),
                        f"answered={'true' if answered is not False else 'false'}"
                        if answered is not None
                        else "",
                        "repeat=true" if item.idempotent else "",
                    )
                else:
                    self.out.line("REFUSED", str(err.status), encode_word(err.code)[0], word("key", key))
            self.spool.confirm(done)
            if done < len(batch):
                return False
        return True

    async def sender(self) -> None:
        while True:
            self.added.clear()
            if self.paused.is_set() or self.retired:
                await asyncio.sleep(PAUSED_RECHECK_SECONDS)
                continue
            if await self.send_once():
                self.note_dropped()
                if not len(self.spool):
                    await self.added.wait()
            elif self.down:
                await asyncio.sleep(self.backoff)
                self.backoff = min(MAX_BACKOFF_SECONDS, self.backoff * 2)
            else:
                await asyncio.sleep(0)

    async def wait_resumed(self) -> None:
        """While the monitor is paused the source stops; look every few seconds until it is active again."""
        from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

        while True:
            await asyncio.sleep(PAUSED_RECHECK_SECONDS)
            try:
                live = (await self.client.state(self.monitor_id)).raw.get("live") or {}
            except (ConnectionFailed, MonitorProtocolError):
                continue
            if live.get("value"):
                self.out.line("RESUMED")
                self.paused.clear()
                self.added.set()
                return
            if live.get("reason") == "retired":
                self.retired = True
                self.out.line("RETIRED")
                return


async def fetch_definition(
    client: Any, monitor_id: str, out: Out, once: bool, needed: bool
) -> dict[str, Any] | None:
    """The monitor as served (the owner sees it whatever its visibility). Unreachable: None when the command
    line says enough to start, else wait for the server (with --once: exit 6)."""
    from monitor_protocol.client import ConnectionFailed, MonitorProtocolError

    delay, down = FIRST_BACKOFF_SECONDS, False
    while True:
        try:
            monitor = await client.get_monitor(monitor_id)
            if down:
                out.line("UP", free_text(client.base))
            return dict(monitor.raw)
        except ConnectionFailed as exc:
            if not down:
                out.line("DOWN", free_text(exc.reason))
                down = True
            if not needed:
                return None
            if once:
                raise Fatal(EXIT_UNREACHABLE) from None
        except MonitorProtocolError as err:
            if err.status >= 500:
                if not needed:
                    return None
            else:
                out.line("ERROR", str(err.status), encode_word(err.code)[0])
                message = err.message
                if err.code == "NOT_FOUND":  # the server never says whether a private monitor exists
                    message = (
                        f"no monitor {monitor_id!r} that this token may read: check --monitor, and that --token "
                        "(or MP_OWNER_TOKEN, else MP_TOKEN) is its owner token (a private monitor is not found with another "
                        "token)"
                    )
                print(f"mp probe: error: {err.code}: {message}", file=sys.stderr)
                raise Fatal(EXIT_UNAUTHORIZED if err.code == "UNAUTHORIZED" else EXIT_NOT_FOUND) from None
        await asyncio.sleep(delay)
        delay = min(MAX_BACKOFF_SECONDS, delay * 2)


async def probe(args: argparse.Namespace, token: str, out: Out) -> int:
    import fcntl  # here, not at the top: `mp` builds its parser in the docs' worker (Pyodide has no fcntl)

    from monitor_protocol.client import AsyncClient
    from monitor_protocol.core import sources
    from monitor_protocol.doors.sources.runner import Options, Runner
    from monitor_protocol.doors.sources.spool import Spool

    source, given = command_line_source(args)
    needed = source is None or "type" not in given["settings"]
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir(args.base, args.monitor)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = open(state_dir / "lock", "w")  # noqa: SIM115 - held for the probe's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"mp probe: another probe uses {state_dir}; give this one its own --state-dir", file=sys.stderr)
        return EXIT_USAGE
    # Only once the lock is held: opening the spool may rewrite it (a torn last line), under another probe.
    spool = Spool(state_dir, max_entries=max(2, args.buffer))
    async with AsyncClient(args.base, token) as client:
        definition = await fetch_definition(client, args.monitor, out, args.once, needed)
        monitor = merged(definition or {"id": args.monitor}, source, given)
        monitor["id"] = args.monitor
        if source is None and (monitor.get("source") or {}).get("kind", "log") == "log":
            reason = (
                f"monitor {args.monitor} defines no source (source.kind log): give one here "
                "(-- COMMAND, --http URL or --file PATH) or in its definition"
            )
            out.line("ERROR", "REFUSED", word("reason", reason, 900))
            print(f"mp probe: {reason}", file=sys.stderr)
            return EXIT_REFUSED
        try:
            try:
                plan = sources.plan_of(monitor)
            except sources.NoCadence:
                if not args.once:
                    raise sources.SourceRefused(NO_CADENCE) from None
                # --once: one run, its output and exit code one observation (any period: there is no next)
                monitor["cadence"] = {**(monitor.get("cadence") or {}), "heartbeat_seconds": 60}
                plan = sources.plan_of(monitor)
        except sources.SourceRefused as refused:
            out.line("ERROR", "REFUSED", word("reason", refused.reason, 900))
            print(f"mp probe: this source cannot run: {refused.reason}", file=sys.stderr)
            return EXIT_REFUSED
        if plan.kind == "feed":
            out.line("ERROR", "REFUSED", word("reason", "a feed runs on the server (mp serve --sources)"))
            return EXIT_REFUSED
        shown = " ".join(plan.argv) if plan.kind == "shell" else plan.ref
        out.line(
            "PROBE",
            word("monitor", plan.monitor),
            word("kind", plan.kind),
            word("mode", plan.mode),
            word("ref", shown, 600),
            word("state", str(state_dir), 600),
        )
        state = Probe(client, plan.monitor, spool, out)
        state.plan = plan
        ttl = (definition or {}).get("ttl_seconds")
        options = Options(ttl=ttl if isinstance(ttl, int) else None, once=args.once)
        sender = asyncio.create_task(state.sender())
        try:
            while True:
                runner = asyncio.create_task(Runner(plan, state, spool.load_checkpoint(), options).run())
                paused = asyncio.create_task(state.paused.wait())
                done, _ = await asyncio.wait({runner, paused}, return_when=asyncio.FIRST_COMPLETED)
                if runner in done:
                    paused.cancel()
                    runner.result()  # a refusal found while running raises here
                    break
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
                if not state.retired:
                    await state.wait_resumed()
                if state.retired:
                    return EXIT_OK
            # --once: the run is over; send what waits, then exit.
            state.note_dropped()
            while len(spool) and not state.retired:
                if await state.send_once():
                    state.note_dropped()
                    if not len(spool):
                        break
                    continue
                if state.down or state.paused.is_set():
                    break
            return EXIT_OK if not len(spool) else EXIT_UNREACHABLE
        except sources.SourceRefused as refused:
            out.line("ERROR", "REFUSED", word("reason", refused.reason, 900))
            return EXIT_REFUSED
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            if len(spool):
                out.line(
                    "KEPT",
                    str(len(spool)),
                    word("dropped", spool.dropped) if spool.dropped else "",
                    word("state", str(state_dir), 600),
                )
            spool.close()


def run(name: str, args: argparse.Namespace) -> int:
    token = resolve_token(args)
    if not token:
        print(
            "mp probe: error: UNAUTHORIZED: mp probe needs the owner token: --token, or env MP_OWNER_TOKEN "
            "(else MP_TOKEN)",
            file=sys.stderr,
        )
        return EXIT_UNAUTHORIZED
    out = Out()
    try:
        return asyncio.run(_main(args, token, out))
    except Usage as usage:
        print(f"mp probe: error: {usage}", file=sys.stderr)
        return EXIT_USAGE
    except Fatal as fatal:
        return fatal.status
    except KeyboardInterrupt:
        return 130


async def _main(args: argparse.Namespace, token: str, out: Out) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        if task is not None:
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)
    try:
        return await probe(args, token, out)
    except asyncio.CancelledError:
        if stopped:
            return EXIT_OK
        raise
