"""Running a `shell` source's command (docs/protocol.md section 12): an argv, never a shell unless the plan
says so (and the operator allowed `sh`), with stdin closed, the environment it is given (`mp serve`:
`sources.minimal_env`; `mp probe`: its user's minus tokens, `sources.scrubbed_env`), in a session of its
own so that stopping it stops its children too (its group is killed after it exits as well), and, on
Linux, killed with its parent: a `kill -9` of the server leaves the command itself no orphan watching on
its own; a child it started is in its group, which a killed server can no longer signal, so the group is
kept in the checkpoint and the next start kills what is left (`kill_leftover`).

The child keeps no descriptor of the server's but its stdin, stdout and stderr: every other one is marked
close-on-exec before the command runs (uvloop's subprocess ignores close_fds, so the listening socket and
the database would otherwise live on in a command, and in whatever it leaves behind). The server's
environment is not its own either: `mp serve --sources` passes `sources.minimal_env`.

`spawn` starts a long-lived process; `lines` yields its stdout one line at a time, each at most
`MAX_SOURCE_OUTPUT_BYTES` (a longer one is cut there, its size kept); `run_once` runs a periodic command with
a timeout and keeps a bounded prefix of its stdout and the tail of its stderr; `stop` ends a process group
(SIGTERM, then SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from monitor_protocol.core.sources import scrubbed_env
from monitor_protocol.core.vocab import MAX_SOURCE_OUTPUT_BYTES, MAX_SOURCE_STDERR_BYTES

CHUNK = 65536
STOP_GRACE_SECONDS = 3.0
PR_SET_PDEATHSIG = 1


def _close_on_exec() -> None:  # pragma: no cover - runs in the child, between fork and exec
    """Every descriptor above 2 is closed when the command starts (marked, not closed: the error pipe that
    reports a failed exec must stay open until then, and the pipes about to become 0, 1 and 2 are dup2'd,
    which clears the mark on the copy)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def _child_setup() -> None:  # pragma: no cover - runs in the child, between fork and exec
    """Linux: the child gets SIGKILL when the process that started it dies (a `kill -9` of the server); and
    it inherits no descriptor of the server's."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass
    _close_on_exec()


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    return scrubbed_env(os.environ if environ is None else environ)


async def spawn(argv: tuple[str, ...], env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """Start `argv` (OSError when it cannot start: not found, not executable)."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        close_fds=True,
        preexec_fn=_child_setup if sys.platform.startswith("linux") else _close_on_exec,
    )


def boot_id() -> str:
    """This machine's boot, as a digest (Linux; "" elsewhere): a process group named in a checkpoint is this
    machine's and this boot's only when it matches (a shared store's other server, or a reboot, never)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return hashlib.sha256(f.read().strip()).hexdigest()[:16]
    except OSError:
        return ""


def group_members(group: int) -> list[int]:
    """The processes still in the session and process group `group` (what a command started, left behind when
    the server was killed: the command led a session of its own, so both ids are its pid)."""
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # A zombie (the killed command, not yet reaped by whoever inherited it) watches nothing: not counted.
        if len(fields) > 3 and fields[0] != b"Z" and int(fields[2]) == group and int(fields[3]) == group:
            found.append(int(name))
    return found


def kill_leftover(saved: Mapping[str, object] | None) -> int:
    """Kill the process group a checkpoint names (`{"group": pid, "boot": ...}`, written when a long-lived
    command started) if this boot's processes are still in it: a `kill -9` of the server killed the command
    (PR_SET_PDEATHSIG) but not what it started. Returns how many were left."""
    if not saved or not sys.platform.startswith("linux"):
        return 0
    group, boot = saved.get("group"), saved.get("boot")
    if not isinstance(group, int) or isinstance(group, bool) or group <= 1 or boot != boot_id() or not boot:
        return 0
    left = group_members(group)
    if left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    return len(left)


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL what is left of the process's group (its pid, since it leads a session of its own): the children
    it started, after it exited or when it is stopped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Line:
    raw: bytes  # at most MAX_SOURCE_OUTPUT_BYTES, without its newline
    total: int  # the whole line's size (larger than len(raw) when it was cut)


async def lines(stream: asyncio.StreamReader, limit: int = MAX_SOURCE_OUTPUT_BYTES) -> AsyncIterator[Line]:
    """Every line of `stream` until its end; a line longer than `limit` is cut there (the rest skipped up to
    its newline) and says its whole size; a last line without a newline counts too."""
    buffer = b""
    skipping: Line | None = None  # a line already cut: its rest is being skipped
    while True:
        chunk = await stream.read(CHUNK)
        if not chunk:
            break
        buffer += chunk
        while True:
            cut = buffer.find(b"\n")
            if skipping is not None:
                if cut < 0:
                    skipping.total += len(buffer)
                    buffer = b""
                    break
                skipping.total += cut
                buffer = buffer[cut + 1 :]
                yield skipping
                skipping = None
                continue
            if cut < 0:
                if len(buffer) > limit:
                    skipping = Line(buffer[:limit], len(buffer))
                    buffer = b""
                break
            yield Line(buffer[:cut][:limit], cut)
            buffer = buffer[cut + 1 :]
    if skipping is not None:
        yield skipping
    elif buffer:
        yield Line(buffer[:limit], len(buffer))


class Tail:
    """The last bytes of a stream (a process's stderr), read to its end in the background."""

    def __init__(self, stream: asyncio.StreamReader | None, keep: int = MAX_SOURCE_STDERR_BYTES) -> None:
        self.keep = keep
        self.data = b""
        self.total = 0
        self.task = asyncio.ensure_future(self._read(stream)) if stream is not None else None

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(CHUNK):
            self.total += len(chunk)
            self.data = (self.data + chunk)[-self.keep :]

    async def done(self) -> bytes:
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.task), STOP_GRACE_SECONDS)
        return self.data


class Head:
    """The first `keep` bytes of a stream (a periodic command's stdout), the rest read and counted."""

    def __init__(self, stream: asyncio.StreamReader | None, keep: int = MAX_SOURCE_OUTPUT_BYTES) -> None:
        self.keep = keep
        self.data = b""
        self.total = 0
        self.task = asyncio.ensure_future(self._read(stream)) if stream is not None else None

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(CHUNK):
            self.total += len(chunk)
            if len(self.data) < self.keep:
                self.data += chunk[: self.keep - len(self.data)]


async def stop(proc: asyncio.subprocess.Process, grace: float = STOP_GRACE_SECONDS) -> int | None:
    """End the process and its group: SIGTERM, then SIGKILL after `grace` seconds. Its exit status. A leader
    that already exited may have left children in its group: they are killed all the same."""
    if proc.returncode is not None:
        kill_group(proc)
        return proc.returncode
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            return await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            continue
    return proc.returncode


@dataclass
class Run:
    """One run of a periodic command: its exit status (None: it could not start or timed out, see `failure`)."""

    exit: int | None
    stdout: bytes
    stdout_total: int
    stderr: bytes
    stderr_total: int
    ms: int
    failure: str | None = None


async def run_once(argv: tuple[str, ...], env: Mapping[str, str], timeout: float) -> Run:
    started = time.monotonic()

    def ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        proc = await spawn(argv, env)
    except OSError as exc:
        return Run(None, b"", 0, b"", 0, ms(), f"cannot start {argv[0]!r}: {exc.strerror or exc}")
    out, err = Head(proc.stdout), Tail(proc.stderr)
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        await stop(proc)
        await err.done()
        return Run(None, out.data, out.total, err.data, err.total, ms(), f"timed out after {timeout:g} s")
    except asyncio.CancelledError:
        try:
            await stop(proc)
        finally:
            kill_group(proc)
        raise
    for reader in (out.task, err.task):
        if reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(reader), STOP_GRACE_SECONDS)
    # A child of the command may still hold stdout open; what it writes after the exit is not this run's.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for reader in (out.task, err.task):
        if reader is not None and not reader.done():
            reader.cancel()
    return Run(proc.returncode, out.data, out.total, err.data, err.total, ms())
