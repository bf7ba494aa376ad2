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
