"""The LISTEN connection's life (store/postgres_link.py Peers): while it cannot be made, it is tried again every
RECONNECT_SECONDS (no back-off that would leave other servers' appends unheard for seconds after the database
is back), the reason is logged once and again when it changes, never at every attempt, and its return is logged
and counted. No database: the connection is a stand-in, so every attempt and every wait is seen."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import pytest
from monitor_protocol.store import postgres_link
from monitor_protocol.store.postgres_link import RECONNECT_SECONDS, Peers

pytestmark = pytest.mark.quick


class Waits(threading.Event):
    """The listener's stop signal: each wait is recorded and returns at once (the test never sleeps)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


class Listening:
    """A connection that LISTENs: a socket of its own to watch, nothing ever heard."""

    def __init__(self) -> None:
        self.ends = socket.socketpair()
        self.pgconn = type("PG", (), {"socket": self.ends[0].fileno()})()
        self.sent: list[str] = []

    def execute(self, sql: str) -> None:
        self.sent.append(sql)

    def close(self) -> None:
        for end in self.ends:
            end.close()


def test_listen_is_tried_every_half_second_and_says_why_once_per_reason(caplog):
    failures = ["connection refused"] * 3 + ["password authentication failed"] * 2
    made: list[Listening] = []

    def open_connection() -> Any:
        if failures:
            raise OSError(failures.pop(0))
        made.append(Listening())
        return made[-1]

    peers = Peers("postgresql://mp@db/mp", None, "me", open_connection)
    peers.stop = Waits()
    seen: list[tuple[bool, int]] = []

    def reconnected() -> None:
        seen.append((peers.listening, peers.listen_connects))
        peers.stop.set()  # the listener ends once LISTEN is made

    with caplog.at_level(logging.INFO, logger=postgres_link.log.name):
        peers._listen(lambda monitor, head: None, reconnected)

    assert peers.stop.waits[:5] == [RECONNECT_SECONDS] * 5 == [0.5] * 5  # no back-off: every 0.5 s
    assert seen == [(True, 1)] and made[0].sent == [f"LISTEN {postgres_link.CHANNEL}"]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 3, said  # the first reason, the second, and the return
    assert "connection refused" in said[0] and "password authentication failed" in said[1]
    assert "again after" in said[2]
    assert peers.listening is False  # control: stopped, it no longer says it listens


class Locking:
    """The leader lock's connection: `SELECT pg_try_advisory_lock` answers `got`, anything else answers."""

    closed = broken = False
    info = type("Info", (), {"server_version": 150000})()

    def __init__(self, got: bool) -> None:
        self.got = got

    def execute(self, sql: str, params: Any = None) -> Any:
        row = (self.got,)
        return type("Cursor", (), {"fetchone": lambda self: row})()

    def close(self) -> None:
        self.closed = True


def test_a_leader_lock_that_cannot_be_held_is_said_once_and_when_it_is_over(caplog):
    """Found by an operator: with max_connections reached no server was leader (sweeps and push stopped) and
    no log line said so. Now: one line as it begins, none for each retry, one when a connection is held."""
    outcomes: list[Any] = [OSError("FATAL: sorry, too many clients already")] * 50 + [Locking(True)]

    def open_connection() -> Any:
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    peers = Peers("postgresql://mp@db/mp", None, "me", open_connection)
    stop = Waits()
    rounds = iter(range(60))
    stop.wait = lambda timeout=None: next(rounds) >= 55 and stop.set() or stop.is_set()  # type: ignore[method-assign]
    peers.stop = stop
    with caplog.at_level(logging.INFO, logger=postgres_link.log.name):
        peers._lead(0.0)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2, said  # the beginning (with the reason) and the end: not one per retry
    assert "the leader lock's connection cannot be held" in said[0] and "too many clients" in said[0]
    assert "over after" in said[1] and "(50 times)" in said[1]
    assert any("leader lock taken" in r.getMessage() for r in caplog.records)  # control: it did lead then


def test_a_repeated_failure_is_logged_as_it_begins_at_most_once_a_minute_and_as_it_ends(caplog):
    from monitor_protocol.core.repeats import Repeats

    clock = [1000.0]
    log = logging.getLogger("test.repeats")
    repeats = Repeats(log, "readiness probe: the store failed", every=60.0)
    import monitor_protocol.core.repeats as module

    real = module.time.monotonic
    module.time.monotonic = lambda: clock[0]  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.INFO, logger="test.repeats"):
            for _ in range(120):  # two minutes of a probe every second
                repeats.failed("connection refused")
                clock[0] += 1.0
            repeats.ok()
            repeats.ok()  # control: nothing more once over
    finally:
        module.time.monotonic = real  # type: ignore[assignment]
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "readiness probe: the store failed: connection refused"
    assert said[1].startswith("readiness probe: the store failed, still (61 times in 60 s)")
    assert len(said) == 3 and said[-1] == "readiness probe: the store failed: over after 120 s (120 times)"


def test_an_error_the_database_answered_wrote_nothing_and_a_lost_connection_may_have():
    """Found by an operator: a lock timeout during a call's commit was called "outcome unknown ... the
    connection was lost", though the database had rolled the call back."""

    class Failed(Exception):
        def __init__(self, state: str | None) -> None:
            super().__init__(state)
            self.sqlstate = state

    for state in ("55P03", "40P01", "40001", "23505", "57014"):  # lock timeout, deadlock, serialization...
        assert postgres_link.answered(Failed(state)), state
    for state in (None, "08006", "08003", "57P01", "57P02", "57P03"):  # no answer, or the session ended
        assert not postgres_link.answered(Failed(state)), state


def test_a_message_with_lines_of_its_own_is_one_line_of_the_log():
    """Found by an operator: a driver's error (`...\\n\\tThis probably means the server terminated abnormally`)
    and PostgreSQL's CONTEXT blocks made log lines without a timestamp. A traceback still follows its line."""
    from monitor_protocol.doors.http.server import LOG_FORMAT, UTCFormatter

    formatter = UTCFormatter(LOG_FORMAT)
    message = (
        "lost the connection: server closed the connection unexpectedly\n\tThis probably means\nCONTEXT: x"
    )
    record = logging.LogRecord("monitor_protocol.store", logging.WARNING, __file__, 1, message, None, None)
    text = formatter.format(record)
    assert "\n" not in text and text.startswith("20") and text.endswith("Z") is False
    assert "unexpectedly | This probably means | CONTEXT: x" in text
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        import sys

        failed = logging.LogRecord(
            "monitor_protocol", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()
        )
    lines = formatter.format(failed).splitlines()
    assert lines[0].endswith("monitor_protocol: failed") and lines[1].startswith("Traceback")  # control


def test_only_errors_that_roll_back_are_said_to_have_written_nothing():
    """A reviewer's: a PANIC during the commit (XX000 "already committed"), disk full while flushing the WAL
    (53100) or an internal error may come after the COMMIT took effect: those stay "outcome unknown"."""

    class Failed(Exception):
        def __init__(self, state: str) -> None:
            super().__init__(state)
            self.sqlstate = state

    for state in ("XX000", "53100", "58030", "25006"):  # (25006, read-only, has its own rule before this)
        assert not postgres_link.answered(Failed(state)), state
    assert postgres_link.answered(Failed("25P02"))  # a transaction already aborted: nothing of it commits
