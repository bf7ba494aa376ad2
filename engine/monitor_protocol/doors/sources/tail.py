"""A `file` source (docs/protocol.md section 12): each line appended to a file is one observation; rotation and
truncation are survived.

`FileTail.poll()` (blocking file I/O: run it in a thread) reads what was appended since the last poll and
returns its complete lines, each with its idempotency key and the checkpoint to commit with it. Where a line
starts in which file is its identity: the key is `f:<file token>:<offset>`, the file token minted when a
file is first opened (kept in the checkpoint), so a restart that re-reads from its checkpoint sends the same
keys and duplicates nothing, while a new file at the path (rotation) or the same file cut short
(truncation, `copytruncate`) gets a new token, so its lines are never mistaken for old ones.

* rotation: when the path names another file, what the old one still held is read to its end (its last
  line, even without a newline), then the new one is followed from its start. A rotation while nothing
  followed (a stopped probe, `--once` from cron, a server down) is found at the next start: the file the
  checkpoint names is looked for beside the path (`app.log.1`, `app.log-20261206`: the same device and
  inode, the same bytes before the offset) and read from there to its end first. When it is not there
  (compressed, moved elsewhere, deleted), `Poll.gap` says that what was written to it after the last line
  read may be missing, and the new file is followed from its start; rotated more than once meanwhile, the
  files in between (written after it) are named in a gap, not read;
* truncation: a file shorter than the offset reached, or one whose bytes just before it changed (cut short
  and written past it again), is followed again from its start;
* the first start follows from the end (only lines appended from now on), unless `from_start`; a file that
  appears later is read from its start;
* a line longer than MAX_SOURCE_OUTPUT_BYTES is cut there and says its size (`bytes`, at least that much for
  a line over READ_BYTES); the rest of it is skipped;
* a poll returns at most MAX_LINES lines (and reads at most MAX_STEPS * READ_BYTES): the next resumes right
  after the last line returned, and `Poll.more` says there is more to read now. So a file of a million empty
  lines is read 100 at a time, never held at once; and a rotated file with more unread than one poll takes is
  kept open, and read to its end over as many polls as it needs, before the new file is followed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.core.sources import SourceRefused
from monitor_protocol.core.vocab import MAX_SOURCE_OUTPUT_BYTES

READ_BYTES = 1 << 20  # read per step; a poll takes at most MAX_STEPS of them
MAX_STEPS = 8
MAX_LINES = 100  # lines one poll returns at most
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
MAX_SIBLINGS = 10_000  # entries of the path's directory looked at for a file rotated while not followed
MARK_BYTES = 32  # the bytes just before the offset, kept: a file cut short and written past it again
# (copytruncate) no longer holds them there, which its size alone would not show


@dataclass
class FileLine:
    raw: bytes
    total: int
    key: str
    checkpoint: dict[str, Any]


@dataclass
class Poll:
    lines: list[FileLine] = field(default_factory=list)
    problem: str | None = None  # why the file cannot be read now (the source is not answering)
    opened: dict[str, Any] | None = None  # a file was (re)opened: the position to commit before any line
    more: bool = False  # the poll stopped at MAX_LINES (or MAX_STEPS): there is more to read now
    gap: str | None = None  # lines may be missing: the file followed before was replaced and is gone


class FileTail:
    def __init__(
        self,
        path: str,
        checkpoint: dict[str, Any] | None = None,
        *,
        from_start: bool = False,
        limit: int = MAX_SOURCE_OUTPUT_BYTES,
        check: Callable[[str], str | None] | None = None,
        max_lines: int = MAX_LINES,
    ) -> None:
        self.path = path
        self.limit = limit
        self.max_lines = max(1, max_lines)
        self.check = check  # the operator's policy, judged at every open (a rotation may swap a link in)
        self.fd: int | None = None
        self.ino = self.dev = 0
        self.offset = 0
        self.token = ""
        self.skip = False  # inside a line already cut: skip up to its newline
        self.mark = b""  # the bytes just before the offset, as read
        saved = checkpoint if checkpoint and checkpoint.get("file") == path else None
        self.saved = saved
        self.from_start = from_start
        self.missed = False  # the file was missing at some poll: when it appears, it is read from its start
        self.gap: str | None = None  # said by the next poll (Poll.gap)

    # -- the position ---------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "token": self.token,
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "mark": self._mark(self.offset).hex(),
            "skip": self.skip,
        }

    def _mark(self, offset: int) -> bytes:
        return b"" if self.fd is None else _mark_of(self.fd, offset)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _open(self) -> str | None:
        """Open the path (a problem sentence when it cannot be read; SourceRefused when the operator's policy
        refuses what the path names now)."""
        if self.check is not None:
            refusal = self.check(self.path)
            if refusal is not None:
                raise SourceRefused(refusal)
        try:
            fd = os.open(self.path, OPEN_FLAGS)
        except OSError as exc:
            self.missed = True
            return f"cannot open {self.path}: {exc.strerror or exc}"
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return f"{self.path} is not a regular file"
        if self.check is not None and os.path.exists(f"/proc/self/fd/{fd}"):
            # What was opened, not what the name pointed to a moment before (a link swapped in between).
            refusal = self.check(os.path.realpath(f"/proc/self/fd/{fd}"))
            if refusal is not None:
                os.close(fd)
                raise SourceRefused(refusal)
        saved, self.saved = self.saved, None
        if saved and (saved.get("ino"), saved.get("dev")) != (st.st_ino, st.st_dev):
            rotated = self._rotated(saved)
            if rotated is not None:  # read the rest of the old file first (poll sees it moved)
                os.close(fd)
                fd, st = rotated
            else:
                self.gap = (  # short: the probe prints it as one word (the path is the source's ref)
                    "replaced while not followed; the old file is not beside it (compressed, moved or "
                    f"deleted): its lines after byte {int(saved.get('offset', 0))} may be missing"
                )
        self.fd, self.ino, self.dev = fd, st.st_ino, st.st_dev
        if saved and saved.get("ino") == st.st_ino and saved.get("dev") == st.st_dev:
            at = int(saved.get("offset", 0))
            if at <= st.st_size and self._mark(at).hex() == saved.get("mark", ""):
                # the same file, not cut short: resume exactly there
                self.offset, self.token, self.skip = at, str(saved.get("token")), bool(saved.get("skip"))
                self.mark = self._mark(at)
                return None
        self.token = secrets.token_hex(6)
        self.skip = False
        # First start: from the end (only what is appended from now on), unless asked to read it all. A file
        # that appeared after a miss, replaced the one the checkpoint names, or was cut short: from its start.
        first = saved is None and not self.missed
        self.offset = st.st_size if first and not self.from_start else 0
        self.mark = self._mark(self.offset)
        return None

    def _rotated(self, saved: dict[str, Any]) -> tuple[int, os.stat_result] | None:
        """The file the checkpoint names, renamed beside the path (same directory, a name that starts with
        the path's), still holding the bytes read before its offset: (its descriptor, its stat), or None."""
        here = os.path.abspath(self.path)
        directory, base = os.path.split(here)
        want = (saved.get("ino"), saved.get("dev"))
        try:
            with os.scandir(directory) as entries:
                names = [e.path for e in itertools.islice(entries, MAX_SIBLINGS) if e.name.startswith(base)]
        except OSError:
            return None
        stats: list[tuple[str, os.stat_result]] = []
        for name in names:
            with contextlib.suppress(OSError):
                stats.append((name, os.stat(name)))
        for name, st in stats:
            if (st.st_ino, st.st_dev) != want or not stat.S_ISREG(st.st_mode):
                continue
            # Files written after this one stopped, other than the path's own: rotated more than once while
            # nothing followed. Their lines are not known to be read: said as a gap, never silently.
            newer = sorted(
                os.path.basename(n)
                for n, s in stats
                if n != name
                and os.path.abspath(n) != here
                and stat.S_ISREG(s.st_mode)
                and s.st_mtime_ns > st.st_mtime_ns
            )
            if newer:
                self.gap = (
                    f"rotated more than once while not followed: {', '.join(newer[:5])} "
                    "(written after the file followed before) were not read; their lines may be missing"
                )
            if self.check is not None and self.check(name) is not None:
                return None  # the operator does not allow reading it: said as a gap
            try:
                fd = os.open(name, OPEN_FLAGS)
            except OSError:
                return None
            at = int(saved.get("offset", 0))
            if at <= os.fstat(fd).st_size and _mark_of(fd, at).hex() == saved.get("mark", ""):
                return fd, os.fstat(fd)
            os.close(fd)  # cut short or rewritten since: not where the checkpoint stood
            return None
        return None

    # -- one poll --------------------------------------------------------------------------------
    def poll(self) -> Poll:
        out = Poll()
        if self.fd is None:
            problem = self._open()
            if problem is not None:
                out.problem = problem
                return out
            out.opened = self.checkpoint()
            out.gap, self.gap = self.gap, None
        assert self.fd is not None
        try:
            now = os.stat(self.path)
            moved = (now.st_ino, now.st_dev) != (self.ino, self.dev)
        except OSError:
            moved = False  # gone for now (rotation in progress): keep reading the file already open
        if os.fstat(self.fd).st_size < self.offset or self._mark(self.offset) != self.mark:
            self.offset, self.skip, self.token = 0, False, secrets.token_hex(6)  # truncated
            out.opened = self.checkpoint()
        ended = self._read(out, final=moved)
        if moved and ended:  # the old file read to its end (else it is kept open: the next poll reads on)
            self.close()
            self.missed = True  # the new file is read from its start
            problem = self._open()
            if problem is not None:
                out.problem = problem
            else:
                out.opened = self.checkpoint()
                self._read(out, final=False)
        return out

    def _read(self, out: Poll, *, final: bool) -> bool:
        """The complete lines from the offset on (`final`: the file will not grow, its last line counts), at
        most `max_lines` in the poll; True when what the file holds now was read to its end."""
        assert self.fd is not None
        for _ in range(MAX_STEPS):
            if len(out.lines) >= self.max_lines:
                out.more = True
                return False
            data = os.pread(self.fd, READ_BYTES, self.offset)
            if not data:
                return True
            at = 0
            while at < len(data) and len(out.lines) < self.max_lines:
                nl = data.find(b"\n", at)
                if self.skip:
                    if nl < 0:
                        at = len(data)
                        break
                    at, self.skip = nl + 1, False
                    continue
                if nl < 0:
                    rest = len(data) - at
                    if rest > self.limit:
                        self._line(out, data, at, at + self.limit, rest, len(data), skip=True)
                        self.skip = True
                        at = len(data)
                    elif final and len(data) < READ_BYTES:
                        self._line(out, data, at, len(data), rest, len(data))
                        at = len(data)
                    break
                self._line(out, data, at, min(nl, at + self.limit), nl - at, nl + 1)
                at = nl + 1
            self.offset += at
            self.mark = self._mark(self.offset)
            if len(out.lines) >= self.max_lines and (at < len(data) or len(data) == READ_BYTES):
                out.more = True
                return False
            if len(data) < READ_BYTES:
                return True
        out.more = True
        return False

    def _line(
        self, out: Poll, data: bytes, at: int, stop: int, total: int, end: int, *, skip: bool = False
    ) -> None:
        """The line `data[at:stop]` (of `total` bytes in all), read at self.offset; the next starts at `end`
        (relative to the same chunk)."""
        key = f"f:{self.token}:{self.offset + at}"
        if end >= MARK_BYTES or self.offset == 0:
            mark = data[max(0, end - MARK_BYTES) : end]
        else:
            mark = self._mark(self.offset + end)
        checkpoint = {
            "file": self.path,
            "token": self.token,
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset + end,
            "mark": mark.hex(),
            "skip": skip,
        }
        out.lines.append(FileLine(data[at:stop].rstrip(b"\r"), total, key, checkpoint))


def _mark_of(fd: int, offset: int) -> bytes:
    """The bytes just before `offset` in the open file `fd` (at most MARK_BYTES)."""
    if offset <= 0:
        return b""
    start = max(0, offset - MARK_BYTES)
    return os.pread(fd, offset - start, start)
