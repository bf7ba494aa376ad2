"""The replies `mp serve` has written and no client has read yet, every connection together, held to a bound.

Each connection holds at most about one reply (a page of up to 4 MiB) before the server stops answering it
(doors/http/protocol.py pause_writing), but nothing else bounded them together: a tester's 300 connections
that asked for a 4 MiB page and never read held 1.3 GB. Past UNREAD_BYTES_MAX, the connections whose client
has taken none of its bytes for STALLED_SECONDS are cut off, the longest stalled first; a client that is
reading, however slowly, is never among them (a reviewer's slow downloader was cut off when the oldest
paused connection went first, whatever it was doing).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("monitor_protocol.http")

UNREAD_BYTES_MAX = 256 << 20
STALLED_SECONDS = 1.0  # a client that took none of its replies' bytes for this long is not reading


def held_by(conn: Any) -> int:
    """What a paused connection holds: its transport keeps the whole reply it was handed until the last byte
    is sent (uvloop holds the bytes object, not a copy of its unsent tail), so a reply of which only a tail is
    unsent still counts whole (a tester's 300 connections each left 0.32 MB of a 3.1 MB page unsent: 977 MB
    held, none counted past the bound)."""
    transport = conn.transport
    buffered = transport.get_write_buffer_size() if transport is not None else 0
    return max(buffered, conn.reply_size) if buffered else 0


class UnreadReplies:
    """The connections whose writes are paused (their client is not keeping up), with what each had buffered
    when last looked at. A connection is anything with `transport`, `client` and `_progress_at` (the loop time
    its client last took bytes, kept by the server's sweep), `reply_size` and `_stage`."""

    def __init__(self, limit: int = UNREAD_BYTES_MAX) -> None:
        self.limit = limit
        self._held: dict[Any, int] = {}
        self.total = 0

    def __len__(self) -> int:
        return len(self._held)

    def paused(self, conn: Any, now: float) -> None:
        """`conn`'s client stopped taking its replies (called inside its write: it is never cut off here)."""
        size = held_by(conn)
        self.total += size - self._held.pop(conn, 0)
        self._held[conn] = size
        if self.total > self.limit:
            self.shed(now, spare=conn)

    def resumed(self, conn: Any) -> None:
        """`conn`'s client is taking its replies again, or the connection is gone."""
        self.total -= self._held.pop(conn, 0)

    def shed(self, now: float, spare: Any = None) -> None:
        """Measure every paused connection's buffer again (replies written while paused count too), and while
        the total is past the limit cut off the stalled ones, longest stalled first. The server's sweep calls
        it too, so a connection that stalls only later is still counted."""
        if not self._held:
            return
        total = 0
        for conn in self._held:
            size = held_by(conn)
            self._held[conn] = size
            total += size
        self.total = total
        if total <= self.limit:
            return
        stalled = sorted(
            (c for c in self._held if c is not spare and now - c._progress_at >= STALLED_SECONDS),
            key=lambda c: c._progress_at,
        )
        for conn in stalled:
            if self.total <= self.limit:
                return
            held = self._held.pop(conn)
            self.total -= held
            who = f"{conn.client[0]}:{conn.client[1]}" if conn.client else "a client"
            log.warning(
                "closing the connection from %s: it has taken none of %d bytes of replies for %.1f s while "
                "the replies no client has read passed %d MiB, this server's bound",
                who,
                held,
                now - conn._progress_at,
                self.limit >> 20,
            )
            conn._stage = None
            if conn.transport is not None:
                conn.transport.abort()
