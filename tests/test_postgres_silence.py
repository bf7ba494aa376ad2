"""A database that goes silent without going away: a proxy that stalls, or a frozen server, where something
still acknowledges every packet, so TCP's keepalives notice nothing (a tester's partition behind a proxy).
A call that hears nothing for SILENCE_SECONDS tries a new connection; when none can be made, its connection
is taken as lost and the call answers 503 (outcome unknown for a write), instead of waiting as long as the
silence lasts. A leader session left behind such a proxy ends itself, so another server can lead."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store import postgres_link, postgres_session, postgres_wire
from monitor_protocol.store.postgres import PostgresStore
from tcpproxy import TcpProxy
from waiting import eventually

psycopg = pytest.importorskip("psycopg")

TYPE = "com.example.x"
BODY = {"type": TYPE, "subject": "s", "data": {}}


@pytest.fixture
def proxied(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A store reaching the database through a TcpProxy, with short silences: (store, service, owner, proxy)."""
    monkeypatch.setattr(postgres_wire, "SILENCE_SECONDS", 0.5)
    proxy = TcpProxy.before(pg_url)
    store = PostgresStore(proxy.url(pg_url), connect_timeout=1)  # (the probe's time: a connection's)
    service = MonitorService(store)
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]
    try:
        yield store, service, owner, proxy
    finally:
        proxy.heal()
        store.close()
        proxy.close()


@pytest.fixture
def lane() -> Any:
    """One thread that runs the calls given to it, as an engine lane does: its session stays connected."""
    with ThreadPoolExecutor(1) as pool:
        yield pool


def test_a_call_the_database_never_answers_is_503_once_no_new_connection_can_be_made(proxied, lane, caplog):
    store, service, owner, proxy = proxied
    lane.submit(service.publish, "ci", BODY, owner).result(30)  # the lane's connection, through the proxy
    proxy.silence()
    silent = lane.submit(service.publish, "ci", BODY, owner)
    # the silence (0.5 s) and the probe (1 s), not as long as the proxy stays silent
    error = silent.exception(30)
    assert isinstance(error, ProtocolError) and error.code == "UNAVAILABLE", error
    assert error.extras.get("outcome") == "unknown"  # its write was sent with its commit: it may be done
    assert "no new connection could be made" in caplog.text
    proxy.heal()
    # the lane connects again and goes on; the log stays dense (the lost publish is there or not, once)
    again = eventually(
        lambda: _published(lane, service, owner), what="a publish on the lane after the silence"
    )
    seqs = [int(o["id"]) for o in service.read_log("ci", 1, 50)["observations"]]
    assert seqs == list(range(1, again["seq"] + 1))


def _published(lane: Any, service: MonitorService, owner: str) -> Any:
    try:
        return lane.submit(service.publish, "ci", BODY, owner).result(30)
    except ProtocolError:
        return None


def test_a_call_on_a_database_that_still_accepts_connections_waits_for_its_answer(proxied, lane, monkeypatch):
    store, service, owner, proxy = proxied
    # positive control: a silence with the database reachable (a lock waited for, a long statement) is waited
    # out, however many times the probe asks
    asked: list[bool] = []

    def reachable(*_args: Any) -> bool:
        asked.append(True)
        return True

    monkeypatch.setattr(postgres_session, "can_connect", reachable)
    first = lane.submit(service.publish, "ci", BODY, owner).result(30)
    proxy.silence()
    silent = lane.submit(service.publish, "ci", BODY, owner)
    eventually(lambda: len(asked) >= 3, what="the probe asked three times")
    assert not silent.done()
    proxy.heal()
    assert silent.result(30)["seq"] == first["seq"] + 1


def test_a_leader_session_left_behind_a_silent_proxy_ends_itself_and_another_server_leads(
    pg_url, monkeypatch
):
    monkeypatch.setattr(postgres_link, "LEADER_IDLE_SECONDS", 1.0)
    proxy = TcpProxy.before(pg_url)
    first = PostgresStore(proxy.url(pg_url))
    second = PostgresStore(pg_url)
    try:
        first.start_leader_election(poll_seconds=0.1)
        eventually(first.leading, what="the first server leading")
        second.start_leader_election(poll_seconds=0.1)
        time.sleep(0.5)
        assert not second.leading()  # control: one leader while the first one's session is polled
        proxy.silence()  # the first server's polls no longer reach its session, which the proxy keeps open
        eventually(second.leading, timeout=20, what="the second server leading")
    finally:
        proxy.heal()
        first.close()
        second.close()
        proxy.close()


def test_a_call_lost_mid_way_whose_database_side_lives_on_is_ended_when_the_server_connects_again(
    pg_url, monkeypatch, lane, caplog
):
    monkeypatch.setattr(postgres_wire, "SILENCE_SECONDS", 0.5)
    monkeypatch.setattr(postgres_session, "LOCK_TIMEOUT_MS", 1000)
    proxy = TcpProxy.before(pg_url, keep_orphans=True)
    first = PostgresStore(proxy.url(pg_url), connect_timeout=1)
    second = MonitorService(PostgresStore(pg_url))
    owner = second.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]

    def locked_then_silent() -> None:
        with first.transaction():
            first.lock_monitor("ci")
            assert first.get_monitor("ci") is not None  # the lock and the read: the lock is held now
            proxy.silence()  # the call's end (its Sync) never reaches the database

    def next_call() -> None:
        with first.transaction():
            first.get_monitor("ci")

    try:
        lane.submit(locked_then_silent).result(30)
        # the lane's next call hears nothing, finds no new connection can be made, and drops its connection;
        # the database's side of it lives on behind the proxy, in its transaction, holding the monitor's lock
        with pytest.raises(Exception):  # noqa: B017 - StorageError (the store's own call, not the engine's)
            lane.submit(next_call).result(30)
        with pytest.raises(ProtocolError) as held:  # control: another server's publish waits for that lock
            second.publish("ci", BODY, owner)
        assert "LockNotAvailable" in str(held.value)
        proxy.heal()
        lane.submit(next_call).result(30)  # connected again: the lost connection's session is ended
        assert "ended the database's side of a connection" in caplog.text
        assert second.publish("ci", BODY, owner)["seq"] >= 1
    finally:
        proxy.heal()
        first.close()
        second.store.close()
        proxy.close()


def test_only_the_very_session_that_was_lost_is_ended(pg):
    """A reviewer's: a lost session was matched by process id and a window around the server's clock, which
    another server's session could fall in after a failover (process ids start again). Now its process id
    and the moment it began, as the database recorded them."""
    other = psycopg.connect(pg.url, autocommit=True, application_name="mp serve")
    try:
        pid, began = other.execute(
            "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        session = pg._s
        session.lost = [(pid, "2001-01-01 00:00:00+00")]  # its process id, another session's start
        session.close()
        session.wire = None
        session.ready()
        assert other.execute("SELECT 1").fetchone() == (1,)  # not ended
        session.lost = [(pid, began)]  # control: that very session is ended
        session.close()
        session.wire = None
        session.ready()
        with pytest.raises(psycopg.OperationalError):
            other.execute("SELECT 1")
    finally:
        other.close()


def test_a_side_connection_left_in_a_transaction_is_ended_by_the_database(pg):
    """A reviewer's: the readers' counts are folded under a monitor's lock, in a transaction of the side
    connection's; left open behind a silent proxy, it would hold that lock. The database ends it."""
    conn = pg._side_connection()
    try:
        shown = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0]
        assert shown == f"{postgres_session.IDLE_IN_TRANSACTION_MS // 1000}s"
    finally:
        conn.close()


def test_a_leader_whose_session_has_not_answered_lately_does_not_lead():
    """A reviewer's: a leader whose poll is stuck on a silent connection kept saying it led, while the
    database ended its session (10 s unpolled) and another server took the lock: two leaders."""
    peers = postgres_link.Peers("postgresql://mp@db/mp", None, "me", lambda: None)
    peers.leader, peers.held_at = True, time.monotonic()
    assert peers.leading  # control: confirmed just now
    peers.held_at -= postgres_link.LEADER_IDLE_SECONDS / 2
    assert not peers.leading
