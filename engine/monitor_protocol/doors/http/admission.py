"""How many connections `mp serve` holds at once, against the process's open-files limit.

Every connection is a file descriptor. With the table full, `accept` fails, and the kernel's queue resets the
clients waiting in it: a tester's 300 keep-alive connections that sent one request each and then sat idle
kept every new client out for the 65 s of their keep-alive, with no line in the log. Now the server keeps
RESERVE descriptors for itself (the database's files, PostgreSQL's connections, a source's pipes) and admits
at most the rest as connections. When a new one would pass that bound, the keep-alive connections idle the
longest make room (closing an idle connection is HTTP's own way, RFC 9112 9.3.1: a client opens another),
then those whose request headers have been coming for more than HEADERS_GRACE (a reviewer held the bound
with connections that sent one byte of a request after each reply, which were never idle); when none can
go (every one is in a request being answered, a long poll or a stream), the newcomer gets a 503 with
`Retry-After` and is closed. A look that found nothing to close is trusted for RESCAN_SECONDS, so a flood of
connects at the bound costs one scan of the connections per interval, not one each. The log says so, at
most once a minute while it lasts.
"""

from __future__ import annotations

import logging
from typing import Any

from monitor_protocol.api.messages import error_response
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.repeats import Repeats
from monitor_protocol.doors.http.reply_bytes import encode_response

log = logging.getLogger("monitor_protocol.http")

# Descriptors kept for the server's own files and connections, never given to clients: a tenth of the limit,
# at least 32 and at most 1,024.
RESERVE_MIN, RESERVE_MAX = 32, 1024
# Idle connections closed in one go when the bound is reached (a fraction of it): one scan of the
# connections makes room for the next many newcomers, not one each.
SHED_FRACTION = 64
# A request whose headers have been coming this long at the bound gives its place up before a newcomer is
# refused (a client sends its request's head at once; the header limit, 10 s, would free it anyway).
HEADERS_GRACE = 1.0
# How long a scan that found nothing to close is trusted: newcomers meanwhile are refused without one.
RESCAN_SECONDS = 0.25
# The condition is over once the server has stayed under the bound this long (not at each dip below it).
QUIET_SECONDS = 60.0


# The 503 a newcomer gets when nothing can make room (encoded at each refusal: its Date moves).
REFUSED = error_response(
    ProtocolError(
        "UNAVAILABLE",
        "This server holds as many connections as its open files allow, and none of them is idle; retry in "
        "a second, or send your requests over a connection you already hold.",
        http_status=503,
        retry_after=1,
    )
)


def connection_bound(open_files: int | None) -> int | None:
    """The most connections to hold with `open_files` descriptors (None: no known limit, no bound)."""
    if open_files is None or open_files <= 0:
        return None
    reserve = min(RESERVE_MAX, max(RESERVE_MIN, open_files // 10))
    return max(1, open_files - reserve)


def _closable(conn: Any) -> bool:
    """Nothing in hand and nothing unsent (a close would wait for a client that may never read)."""
    transport = conn.transport
    return (
        not conn._busy
        and not conn._queue
        and transport is not None
        and not transport.is_closing()
        and not transport.get_write_buffer_size()
    )


def idle(conn: Any) -> bool:
    """A keep-alive connection waiting for its client's next request."""
    return conn._stage == "idle" and _closable(conn)


def dawdling(conn: Any, now: float) -> bool:
    """A connection whose request head has been coming for more than HEADERS_GRACE (a client that connected
    and sent nothing, or part of a request, and stopped)."""
    return conn._stage == "headers" and now - conn._started > HEADERS_GRACE and _closable(conn)


class Admission:
    """Admits a new connection (`admit`) while the server holds fewer than `bound`, making room from the
    longest-idle keep-alive connections, then from the requests whose headers dawdle, when it holds that
    many."""

    def __init__(self, bound: int | None) -> None:
        self.bound = bound
        self.shed = 0  # connections closed to make room (a metrics counter)
        self.refused = 0  # connections refused with 503: nothing could be closed (a metrics counter)
        self._full = Repeats(log, "connections at this server's bound")
        self._full_at = 0.0  # (loop time) when the bound was last met
        self._nothing_until = 0.0  # (loop time) a scan found nothing to close: refuse without another until

    def admit(self, conn: Any, connections: Any, now: float) -> bool:
        """Whether `conn`, just made, may stay; `connections` are the server's (without it), `now` the loop's
        time. False: it was answered 503 and closed."""
        bound = self.bound
        if bound is None:
            return True
        held = len(connections)
        if held < bound:
            if self._full.since is not None and now - self._full_at >= QUIET_SECONDS:
                self._full.ok()
            return True
        self._full_at = now
        closed = self._make_room(connections, bound, now) if now >= self._nothing_until else 0
        if closed:
            self._full.failed(
                f"{held} held, the most its open files allow; closed {closed} of them (idle, or sending a "
                "request's head too slowly) to admit new ones"
            )
            return True
        self._nothing_until = now + RESCAN_SECONDS
        self.refused += 1
        self._full.failed(
            f"{held} held, the most its open files allow, none idle; new connections are answered 503 "
            "(raise the open-files limit, `ulimit -n` or systemd's LimitNOFILE, to hold more)"
        )
        transport = conn.transport
        if transport is not None:
            transport.write(encode_response(REFUSED, close=True))
            transport.close()
        return False

    def _make_room(self, connections: Any, bound: int, now: float) -> int:
        """Close up to a 64th of the bound: the longest idle first, then the longest dawdling; how many."""
        wanted = max(1, bound // SHED_FRACTION)
        # An idle connection's deadline is when its keep-alive ends: the earliest was idle the longest.
        chosen = sorted((c for c in connections if idle(c)), key=lambda c: c._deadline)[:wanted]
        if len(chosen) < wanted:
            slow = sorted((c for c in connections if dawdling(c, now)), key=lambda c: c._started)
            chosen += slow[: wanted - len(chosen)]
        for old in chosen:  # out of the count at once: the next newcomer of this loop turn sees the room
            old._stage = None
            old.transport.close()
            connections.discard(old)
        self.shed += len(chosen)
        return len(chosen)
