"""`mp probe`'s disk buffer: what a source saw, kept on disk until the server confirmed it (docs/sources.md).

`spool.jsonl` holds one publish body per line, each with its idempotency key, appended and fsynced before
the probe sends it; `spool.done` holds the byte offset up to which the server confirmed. A probe killed at
any point, or a server that was down, loses nothing: the next run sends what is after `spool.done` again,
and the keys make whatever had landed a repeat (the server answers it with its first seq and appends
nothing). `checkpoint.json` is where the source stands (a file's offset, the last periodic result),
written after the line it covers is in the spool, so a restart never skips a line it did not keep.

The spool is bounded (`max_entries`): past it, new observations are dropped and counted, and the probe
says so (`DROPPED`), then publishes one observation saying how many were lost once there is room again.
The count is kept in `spool.dropped`, so a probe that exits full (`--once` for cron against a server that
stays down) still says it at a later run.

The file does not grow without end: it is emptied when everything was confirmed, and rewritten with only
what is left once more than COMPACT_BYTES of its head was confirmed (a server that always keeps a few
entries in flight). The caller holds the state directory's lock before it opens a Spool (which may rewrite
the file)."""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from pathlib import Path
from typing import Any

DEFAULT_MAX_ENTRIES = 10_000
COMPACT_BYTES = 1 << 20  # confirmed bytes at the head of spool.jsonl past which it is rewritten without them


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Spool:
    def __init__(self, directory: Path, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.dir / "spool.jsonl"
        self.done_path = self.dir / "spool.done"
        self.checkpoint_path = self.dir / "checkpoint.json"
        self.dropped_path = self.dir / "spool.dropped"
        self.max_entries = max_entries
        self.entries: deque[tuple[dict[str, Any], int]] = deque()  # (body, the byte offset after it)
        self.dropped = 0
        with contextlib.suppress(OSError, ValueError):
            self.dropped = max(0, int(self.dropped_path.read_text().strip() or 0))
        done = 0
        with contextlib.suppress(OSError, ValueError):
            done = int(self.done_path.read_text().strip() or 0)
        self.path.touch(exist_ok=True)
        with open(self.path, "rb") as f:
            f.seek(done)
            at = done
            for raw in f:
                at += len(raw)
                if not raw.endswith(b"\n"):
                    break  # a line the last run was killed while writing: never confirmed, never sent
                try:
                    self.entries.append((json.loads(raw), at))
                except ValueError:
                    continue
        self.done = done
        self.file = open(self.path, "ab")  # noqa: SIM115 - kept open for the probe's lifetime
        if self.file.tell() != (self.entries[-1][1] if self.entries else done):
            self._rewrite()  # drop a torn last line, so what follows starts on a line of its own

    def _rewrite(self) -> None:
        self.file.close()
        lines = [json.dumps(body, separators=(",", ":")) + "\n" for body, _ in self.entries]
        # spool.done first: a kill between the two leaves the old file read from its start (confirmed entries
        # sent again are repeats, by their keys), never the new file read from an offset past what it holds.
        _atomic_write(self.done_path, "0")
        _atomic_write(self.path, "".join(lines))
        self.done, at = 0, 0
        kept: deque[tuple[dict[str, Any], int]] = deque()
        for (body, _), line in zip(self.entries, lines, strict=True):
            at += len(line.encode("utf-8"))
            kept.append((body, at))
        self.entries = kept
        self.file = open(self.path, "ab")  # noqa: SIM115

    def __len__(self) -> int:
        return len(self.entries)

    def append(self, bodies: list[dict[str, Any]]) -> int:
        """Keep `bodies` on disk (fsynced) before they are sent; returns how many fit (the rest dropped)."""
        room = max(0, self.max_entries - len(self.entries))
        kept, lost = bodies[:room], len(bodies) - min(room, len(bodies))
        if lost:
            self.dropped += lost
            _atomic_write(self.dropped_path, str(self.dropped))
        if kept:
            lines = [json.dumps(b, separators=(",", ":")).encode("utf-8") + b"\n" for b in kept]
            data = b"".join(lines)
            self.file.write(data)
            self.file.flush()
            os.fsync(self.file.fileno())
            at = self.file.tell() - len(data)
            for body, line in zip(kept, lines, strict=True):
                at += len(line)
                self.entries.append((body, at))
        return len(kept)

    def note_dropped(self, note: Any) -> int:
        """When observations were dropped and there is room again, keep `note(lost)` (the observation that
        says how many) and start counting afresh; returns how many it reported (0: nothing to say or no
        room yet). The note is on disk before the count is cleared: a kill in between says it twice, never
        not at all."""
        lost = self.dropped
        if not lost or len(self.entries) >= self.max_entries - 1:
            return 0
        self.dropped = 0
        if not self.append([note(lost)]):
            self.dropped = lost
            return 0
        _atomic_write(self.dropped_path, "0")
        return lost

    def head(self, n: int) -> list[dict[str, Any]]:
        return [body for body, _ in list(self.entries)[:n]]

    def confirm(self, n: int) -> None:
        """The first `n` entries were answered by the server: they are done."""
        if n <= 0:
            return
        end = 0
        for _ in range(min(n, len(self.entries))):
            _body, end = self.entries.popleft()
        self.done = end
        if not self.entries:
            self.file.truncate(0)
            self.file.seek(0)
            self.done = 0
        elif self.done > COMPACT_BYTES:
            self._rewrite()  # what is left, from offset 0 (spool.done written 0 after the file is replaced)
            return
        _atomic_write(self.done_path, str(self.done))

    def load_checkpoint(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.checkpoint_path.read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        _atomic_write(self.checkpoint_path, json.dumps(checkpoint))

    def close(self) -> None:
        self.file.close()
