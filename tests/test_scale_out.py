"""Scale-out (engine/monitor_protocol/store/postgres.py): several real `mp serve` processes on one PostgreSQL
database keep every guarantee one server gives. Each test is one guarantee, with a positive control beside it
(the scenario really happened: every server served requests, the requests really raced, the reader really
was parked, the server really died, the database really went away).

1. per-monitor seqs stay dense and unique under concurrent publishes through three servers;
2. two servers racing a lease claim: exactly one winner, the other LEASE_HELD naming the holder;
3. a long poll and an SSE stream on one server are woken by a publish through another (not by their own
   deadline or heartbeat);
4. ack and redelivery marks are the same wherever a reader pulls;
5. sweeps (lease expiry, mute retirement) run on exactly one server (a frozen leader's lock stops them all),
   each logged once, and another server takes over within seconds when the leader is killed;
6. kill -9 of one server under load loses nothing confirmed, and producers retrying elsewhere with their
   idempotency keys finish without duplicates;
7. PostgreSQL restarting under load (a cluster of the test's own, stopped -m fast, then -m immediate):
   503 UNAVAILABLE with Retry-After while it is away (never 500, never a traceback), the servers reconnect by
   themselves (writes, LISTEN wake-ups, HTTP push), and nothing confirmed is lost;
8. (in-process, the root cause of 7's push check) the push supervisor survives a storage failure.

Every wait is bounded (httpx timeouts, tests/waiting.py's `eventually` with a generous deadline), so nothing can
hang without pytest-timeout, and no assertion is a ceiling on how long something took (speed is bench/'s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from monitor_protocol.core.errors import storage_unavailable
from monitor_protocol.doors.push import Pusher
from pgcluster import Cluster, ci_is_true, find_bin_dir
from serverutil import bearer, server_log, start_server, stop_server
from waiting import eventually, eventually_async

TYPE = "com.example.scale.item"
P = "ai.mentu.monitor."  # the protocol's own observation types
TIMEOUT = httpx.Timeout(15.0)
LEADER_LINE = "leader lock taken"
LOCK_MONITOR, LOCK_LEADER = 0x4D50, 0x4D51  # store/postgres.py: the advisory locks (monitor, leader)


# ==================================================================================================== servers
@dataclass
class Node:
    name: str
    base: str
    proc: subprocess.Popen

    @property
    def api(self) -> str:
        return self.base + "/mp/v0"

    def log(self) -> str:
        return server_log(self.proc)

    def leads(self) -> bool:
        return LEADER_LINE in self.log()


def logs(nodes: list[Node], chars: int = 4000) -> str:
    """The servers' logs, for a failure message."""
    return "".join(f"\n--- server {n.name} ({n.base}) log tail:\n{n.log()[-chars:]}" for n in nodes)


@contextlib.contextmanager
def servers(tmp_path: Path, db: str, count: int, *extra: str) -> Iterator[list[Node]]:
    """`count` `mp serve` processes on the database `db`, started in parallel, named A, B, C..."""
    nodes: list[Node | None] = [None] * count
    errors: list[BaseException] = []

    def boot(i: int) -> None:
        try:
            base, proc = start_server(tmp_path, "--db", db, *extra)
            nodes[i] = Node("ABCDEFG"[i], base, proc)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=boot, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        if errors:
            raise errors[0]
        assert all(nodes), "a server did not start within 60 s"
        yield [n for n in nodes if n is not None]
    finally:
        for n in nodes:
            if n is not None:
                stop_server(n.proc)


# =============================================================================================== the protocol
def create_monitor(api: str, monitor_id: str, **fields: Any) -> str:
    """Create a public monitor through `api`; its owner token."""
    body = {"id": monitor_id, "types": [TYPE], "visibility": "public", **fields}
    r = httpx.post(api + "/monitors", json=body, timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    return r.json()["owner_token"]


def subscribe(api: str, monitor_id: str, owner: str, subscriber: str, **fields: Any) -> tuple[str, str]:
    """Subscribe through `api` with the owner token (so `act` can be granted); (subscription id, token)."""
    body = {"monitor": monitor_id, "subscriber": subscriber, **fields}
    r = httpx.post(api + "/subscriptions", json=body, headers=bearer(owner), timeout=TIMEOUT)
    assert r.status_code == 201, r.text
    return r.json()["subscription"]["id"], r.json()["token"]


def publish(api: str, monitor_id: str, owner: str, subject: str, **fields: Any) -> dict[str, Any]:
    body = {"type": TYPE, "subject": subject, "actor": "probe:scale", **fields}
    r = httpx.post(
        f"{api}/monitors/{monitor_id}/observations", json=body, headers=bearer(owner), timeout=TIMEOUT
    )
    assert r.status_code == 201, r.text
    return r.json()


def head_of(api: str, monitor_id: str, owner: str) -> int:
    r = httpx.get(f"{api}/monitors/{monitor_id}", headers=bearer(owner), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return int(r.json()["head"])


def read_log(api: str, sub_id: str, token: str, upto: int) -> list[dict[str, Any]]:
    """Every observation of the subscription's log from seq 1 to `upto`, replayed read-only (`cursor`)."""
    out: list[dict[str, Any]] = []
    cursor = 1
    for _ in range(upto // 200 + 10):
        if cursor > upto:
            return out
        r = httpx.get(
            f"{api}/subscriptions/{sub_id}/pull",
            params={"cursor": cursor, "limit": 200},
            headers=bearer(token),
            timeout=TIMEOUT,
        )
        assert r.status_code == 200, r.text
        page = r.json()
        out.extend(o for o in page["observations"] if int(o["id"]) <= upto)
        if not page["observations"]:
            return out
        cursor = page["next"]
    raise AssertionError(f"replaying the log up to {upto} did not end")


def payload(o: dict[str, Any]) -> dict[str, Any]:
    return (o.get("data") or {}).get("payload") or {}


def lease_rows(log: list[dict[str, Any]], action: str, subject: str) -> list[dict[str, Any]]:
    return [
        o
        for o in log
        if o["type"] == P + "lease"
        and payload(o).get("action") == action
        and payload(o).get("subject") == subject
    ]


def retired_rows(log: list[dict[str, Any]], sub_id: str) -> list[dict[str, Any]]:
    return [
        o for o in log if o["type"] == P + "subscription_retired" and payload(o).get("subscription") == sub_id
    ]


def metric(node: Node, name: str) -> float:
    """A gauge of the server's /metrics (loopback clients need no token)."""
    text = httpx.get(node.base + "/metrics", timeout=TIMEOUT).text
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def link(nodes: list[Node]) -> str:
    """Each server's link to the others as its /metrics says (LISTEN up, LISTENs made, notifications heard,
    leader), for a failure message."""
    lines = []
    for n in nodes:
        try:
            text = httpx.get(n.base + "/metrics", timeout=TIMEOUT).text
        except httpx.HTTPError as exc:
            lines.append(f"{n.name}: /metrics failed: {exc!r}")
            continue
        found = re.findall(
            r"^(mp_store_(?:listening|listen_connects_total|notifications_heard_total|leader)) (\S+)$",
            text,
            re.M,
        )
        lines.append(f"{n.name}: " + ", ".join(f"{k} {v}" for k, v in found))
    return "\n--- the servers' links: " + "; ".join(lines)


def body_of(text: str) -> dict[str, Any]:
    """A reply's JSON object, or {} when it is not one (a plain-text 500 must fail the test readably)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def leader_sessions(db: str) -> list[tuple[int, str]]:
    """The PostgreSQL sessions holding the leader lock in `db`: (backend pid, application name)."""
    import psycopg

    with psycopg.connect(db, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(
            "SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = 0 AND l.objsubid = 2 "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_LEADER,),
        ).fetchall()


@dataclass
class Wake:
    """One long-poll round: a pull parked on one server, a publish through another."""

    reply: httpx.Response | None  # None: the pull never returned
    seq: int  # the seq of the publish
    parked: bool  # the pull was parked (counted by /metrics, still open) before the publish was sent
    wait: int  # the pull's `wait`, seconds
    asked: float  # monotonic times: the pull sent, the publish sent, the pull's reply (inf: none)
    sent: float
    returned: float
    got: list[int]  # the seqs the pull returned

    @property
    def carried(self) -> bool:
        ok = self.reply is not None and self.reply.status_code == 200
        return ok and self.seq in self.got

    @property
    def before_its_deadline(self) -> bool:
        """The pull came back before its wait could have run out. A pull that only its deadline ends cannot
        answer earlier than `wait` seconds after it was sent, however loaded the machine: so this one was
        woken by the publish (a "not before" bound, which load cannot break)."""
        return self.returned < self.asked + self.wait

    @property
    def delay(self) -> float:
        """From the publish sent to the pull's reply (informational; speed is measured in bench/)."""
        return self.returned - self.sent


def long_poll_round(
    parked_on: Node,
    published_on: Node,
    monitor_id: str,
    owner: str,
    sub: tuple[str, str],
    subject: str,
    wait: int,
) -> Wake:
    """Park `GET pull?wait=` on `parked_on`, publish through `published_on`, and ack what the pull returned.
    What an earlier round left unread (a pull that came back without its publish) is read and acked first,
    so the pull has nothing to return at once and waits for this round's publish."""
    pull = f"{parked_on.api}/subscriptions/{sub[0]}/pull"

    def ack(cursor: Any) -> None:
        r = httpx.post(
            f"{parked_on.api}/subscriptions/{sub[0]}/ack",
            json={"cursor": cursor},
            headers=bearer(sub[1]),
            timeout=TIMEOUT,
        )
        assert r.status_code == 200, r.text

    for _ in range(100):
        left = httpx.get(pull, params={"limit": 100}, headers=bearer(sub[1]), timeout=TIMEOUT)
        assert left.status_code == 200, left.text
        if not left.json()["observations"]:
            break
        ack(left.json()["next"])
    out: dict[str, Any] = {}

    def park() -> None:
        with httpx.Client(timeout=httpx.Timeout(wait + 30.0)) as client:
            out["asked"] = time.monotonic()
            out["reply"] = client.get(pull, params={"wait": wait}, headers=bearer(sub[1]))
            out["returned"] = time.monotonic()

    poller = threading.Thread(target=park, daemon=True)
    poller.start()
    eventually(
        lambda: metric(parked_on, "mp_long_polls_parked") >= 1 or not poller.is_alive(),
        what=f"the long poll parks on {parked_on.name}",
        detail=lambda: logs([parked_on]),
    )
    parked = poller.is_alive() and metric(parked_on, "mp_long_polls_parked") >= 1
    sent = time.monotonic()
    seq = int(publish(published_on.api, monitor_id, owner, subject)["seq"])
    poller.join(timeout=wait + 35)
    reply = out.get("reply")
    if reply is not None and reply.status_code == 200:
        ack(reply.json()["next"])
    got = (
        [int(o["id"]) for o in reply.json()["observations"]]
        if reply is not None and reply.status_code == 200
        else []
    )
    return Wake(reply, seq, parked, wait, out["asked"], sent, out.get("returned", float("inf")), got)


def run_threads(targets: list[Callable[[], None]], seconds: float) -> list[str]:
    """Run each target on a thread of its own; the failures (exceptions) they raised, as text."""
    failures: list[str] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the test
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=(fn,), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        failures.append(f"{stuck} thread(s) still running after {seconds} s")
    return failures


# =========================================================================== 1. dense, unique seqs under load
SERVERS_1, THREADS_PER_SERVER, PUBLISHES_PER_THREAD = 3, 4, 50


@pytest.mark.parametrize("lanes", ["threads", "green"])  # --db-lanes: engine calls on threads or greenlets
def test_seqs_stay_dense_and_unique_under_concurrent_publishes_through_three_servers(tmp_path, pg_url, lanes):
    with servers(tmp_path, pg_url, SERVERS_1, "--db-lanes", lanes) as nodes:
        a, b, c = nodes
        owner = create_monitor(a.api, "dense")
        sub_id, reader = subscribe(b.api, "dense", owner, "agent:auditor")
        first_head = head_of(c.api, "dense", owner)  # the protocol rows of the creation and the subscription
        assert first_head >= 2

        lock = threading.Lock()
        confirmed: list[tuple[str, int, str]] = []  # (server, seq, subject) per 201
        start = threading.Barrier(SERVERS_1 * THREADS_PER_SERVER, timeout=30)

        def publisher(node: Node, t: int) -> Callable[[], None]:
            def run() -> None:
                with httpx.Client(base_url=node.api, timeout=TIMEOUT, headers=bearer(owner)) as client:
                    assert client.get("/discover").status_code == 200  # connected before the race starts
                    start.wait()
                    for i in range(PUBLISHES_PER_THREAD):
                        subject = f"{node.name}{t}-{i}"
                        body = {"type": TYPE, "subject": subject, "actor": "probe:scale", "data": {"i": i}}
                        r = client.post("/monitors/dense/observations", json=body)
                        assert r.status_code == 201, f"server {node.name}: {r.status_code} {r.text}"
                        with lock:
                            confirmed.append((node.name, int(r.json()["seq"]), subject))

            return run

        failures = run_threads([publisher(n, t) for n in nodes for t in range(THREADS_PER_SERVER)], 120)
        assert not failures, f"{failures[:5]}{logs(nodes)}"

        total = SERVERS_1 * THREADS_PER_SERVER * PUBLISHES_PER_THREAD
        per_server = Counter(name for name, _, _ in confirmed)
        # Control: the publishes really went through every server, and really interleaved there.
        assert per_server == {n.name: THREADS_PER_SERVER * PUBLISHES_PER_THREAD for n in nodes}, per_server
        by_seq = sorted(confirmed, key=lambda x: x[1])
        switches = sum(1 for x, y in zip(by_seq, by_seq[1:], strict=False) if x[0] != y[0])
        assert switches >= 30, f"the servers' publishes barely interleaved ({switches} switches): no race"

        # Every 201 has a seq of its own, and together they are exactly the seqs after the protocol rows.
        seqs = [seq for _, seq, _ in confirmed]
        duplicates = {s: n for s, n in Counter(seqs).items() if n > 1}
        assert not duplicates, f"one seq confirmed to several publishes: {sorted(duplicates.items())[:10]}"
        expected = set(range(first_head + 1, first_head + total + 1))
        assert set(seqs) == expected, (
            f"confirmed seqs are not dense: missing {sorted(expected - set(seqs))[:10]}"
        )

        # Every server reports the same head, and the log read back is dense from seq 1 to it.
        heads = {n.name: head_of(n.api, "dense", owner) for n in nodes}
        assert set(heads.values()) == {first_head + total}, heads
        log = read_log(c.api, sub_id, reader, first_head + total)
        log_seqs = [int(o["id"]) for o in log]
        assert log_seqs == list(range(1, first_head + total + 1)), (
            f"log not dense: gaps {sorted(set(range(1, first_head + total + 1)) - set(log_seqs))[:10]}, "
            f"duplicates {[s for s, n in Counter(log_seqs).items() if n > 1][:10]}"
        )
        assert all(o["sequence"] == o["id"].zfill(20) for o in log)
        # Each confirmed publish is in the log at its confirmed seq; the other rows are the protocol's own.
        published = {int(o["id"]): o["subject"] for o in log if o["type"] == TYPE}
        assert published == {seq: subject for _, seq, subject in confirmed}
        protocol = [o for o in log if o["type"] != TYPE]
        assert len(protocol) == first_head and all(o["type"].startswith(P) for o in protocol), protocol


# ===================================================================================== 2. a lease claim race
ROUNDS = 8


def test_two_servers_racing_a_lease_claim_have_exactly_one_winner(tmp_path, pg_url):
    with servers(tmp_path, pg_url, 2) as nodes:
        a, b = nodes
        owner = create_monitor(a.api, "race", capabilities=["observe", "react", "act"])
        subs = [
            subscribe(a.api, "race", owner, "agent:worker-1", capabilities=["observe", "act"]),
            subscribe(b.api, "race", owner, "agent:worker-2", capabilities=["observe", "act"]),
        ]
        subjects = [f"job-{i}" for i in range(ROUNDS)]
        for i, subject in enumerate(subjects):
            publish(nodes[i % 2].api, "race", owner, subject)

        clients = [httpx.Client(base_url=n.api, timeout=TIMEOUT) for n in nodes]
        overlapped = 0
        wins: Counter[str] = Counter()
        try:
            for c in clients:
                assert c.get("/discover").status_code == 200  # connected before the races
            for i, subject in enumerate(subjects):
                # Even rounds: worker-1 claims through A, worker-2 through B; odd rounds the other way round.
                pairs = [(clients[0], subs[0]), (clients[1], subs[1])]
                if i % 2:
                    pairs = [(clients[0], subs[1]), (clients[1], subs[0])]
                barrier = threading.Barrier(2, timeout=10)
                replies: list[Any] = [None, None]

                def claim(
                    k: int,
                    client: httpx.Client,
                    sub: tuple[str, str],
                    subject: str = subject,
                    barrier: threading.Barrier = barrier,
                    replies: list[Any] = replies,
                ) -> None:
                    barrier.wait()
                    t0 = time.monotonic()
                    r = client.post(
                        f"/subscriptions/{sub[0]}/leases/claim",
                        json={"subject": subject, "lease_duration_seconds": 60},
                        headers=bearer(sub[1]),
                    )
                    replies[k] = (r, t0, time.monotonic(), sub)

                failures = run_threads(
                    [lambda k=k, c=c, s=s: claim(k, c, s) for k, (c, s) in enumerate(pairs)], 30
                )
                assert not failures, f"{failures}{logs(nodes)}"
                statuses = sorted(r.status_code for r, *_ in replies)
                assert statuses == [201, 409], f"{subject}: {[(r.status_code, r.text) for r, *_ in replies]}"
                k_win = 0 if replies[0][0].status_code == 201 else 1
                (win, w0, w1, win_sub), (lose, l0, l1, lose_sub) = replies[k_win], replies[1 - k_win]
                holder = f"sub:{win_sub[0]}"
                assert win.json()["lease"]["holder"] == holder and win.json()["idempotent"] is False, win.text
                assert lose.json()["code"] == "LEASE_HELD", lose.text
                assert holder in json.dumps(lose.json()), f"LEASE_HELD does not name the holder: {lose.text}"
                wins[nodes[k_win].name] += 1
                overlapped += w0 < l1 and l0 < w1
                # Controls: the loser, through the winner's server, is still refused; the winner, through the
                # loser's server, gets its own lease back (the lease is one record, not one per server).
                again = clients[k_win].post(
                    f"/subscriptions/{lose_sub[0]}/leases/claim",
                    json={"subject": subject},
                    headers=bearer(lose_sub[1]),
                )
                assert again.status_code == 409 and again.json()["code"] == "LEASE_HELD", again.text
                mine = clients[1 - k_win].post(
                    f"/subscriptions/{win_sub[0]}/leases/claim",
                    json={"subject": subject},
                    headers=bearer(win_sub[1]),
                )
                assert mine.status_code == 200 and mine.json()["idempotent"] is True, mine.text
                assert mine.json()["lease"]["holder"] == holder
        finally:
            for c in clients:
                c.close()
        # Control: the claims really raced (their requests were in flight at the same time).
        assert overlapped >= ROUNDS // 2, f"only {overlapped}/{ROUNDS} races overlapped in time"
        # The log holds exactly one claim per subject.
        log_sub = subscribe(a.api, "race", owner, "agent:auditor")
        log = read_log(b.api, *log_sub, upto=head_of(b.api, "race", owner))
        for subject in subjects:
            assert len(lease_rows(log, "claim", subject)) == 1, (subject, lease_rows(log, "claim", subject))
        print(f"lease races won through: {dict(wins)}; overlapped {overlapped}/{ROUNDS}")


# ========================================================================= 3. wake-ups across the servers
# A long poll's wait: only an append can answer it sooner (nothing re-checks a parked poll periodically).
WAKE_WAIT = 30


@pytest.mark.parametrize("lanes", ["threads", "green"])  # --db-lanes: engine calls on threads or greenlets
def test_long_poll_and_sse_on_one_server_are_woken_by_a_publish_through_another(tmp_path, pg_url, lanes):
    with servers(tmp_path, pg_url, 2, "--db-lanes", lanes) as nodes:
        a, b = nodes
        owner = create_monitor(a.api, "wake")
        sub_id, reader = subscribe(a.api, "wake", owner, "agent:waiter", filter={"types": [TYPE]})

        heard_before = (
            metric(a, "mp_store_notifications_heard_total"),
            metric(b, "mp_store_notifications_heard_total"),
        )
        # Long poll parked on A, publish through B.
        for round_no in range(3):
            w = long_poll_round(a, b, "wake", owner, (sub_id, reader), f"wake-{round_no}", wait=WAKE_WAIT)
            assert w.parked, f"round {round_no}: the long poll was not parked on A before the publish: {w}"
            assert w.reply is not None, f"round {round_no}: the long poll did not return{logs(nodes)}"
            assert w.reply.status_code == 200, w.reply.text
            assert [int(o["id"]) for o in w.reply.json()["observations"]] == [w.seq], w.reply.text
            assert w.returned >= w.sent  # control: it returned because of the publish, not before it
            assert w.before_its_deadline, (
                f"round {round_no}: the long poll on A came back {w.returned - w.asked:.1f} s after it was "
                f"sent, its whole wait of {w.wait} s: its deadline answered it, B's publish never woke it"
                f"{logs(nodes)}"
            )
        # The link as /metrics shows it: A heard B's three commits; B did not count its own as heard.
        assert [metric(n, "mp_store_listening") for n in nodes] == [1, 1], link(nodes)
        assert [metric(n, "mp_store_listen_connects_total") for n in nodes] == [1, 1], link(nodes)
        assert metric(a, "mp_store_notifications_heard_total") - heard_before[0] >= 3, link(nodes)
        assert metric(b, "mp_store_notifications_heard_total") == heard_before[1], link(nodes)
        assert sorted(metric(n, "mp_store_leader") for n in nodes) == [0, 1], link(nodes)

        # An SSE stream on A, publishes through B.
        events: queue.Queue[tuple[float, str, dict[str, str]]] = queue.Queue()
        done = threading.Event()

        def stream() -> None:
            with (
                httpx.Client(timeout=TIMEOUT) as client,
                client.stream(
                    "GET", f"{a.api}/subscriptions/{sub_id}/stream", headers=bearer(reader)
                ) as resp,
            ):
                events.put((time.monotonic(), "status", {"status": str(resp.status_code)}))
                fields: dict[str, str] = {}
                for line in resp.iter_lines():
                    if done.is_set():
                        return
                    if line == "":
                        if fields:
                            events.put((time.monotonic(), fields.get("event", "message"), fields))
                        fields = {}
                        continue
                    key, _, value = line.partition(":")
                    fields[key] = value[1:] if value.startswith(" ") else value

        def next_event(kind: str, seconds: float = 30) -> tuple[dict[str, str], list[str]]:
            """The next event of `kind`, and the kinds of the events that came before it."""
            deadline = time.monotonic() + seconds
            skipped: list[str] = []
            while True:
                try:
                    _at, event, fields = events.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    raise AssertionError(f"no SSE {kind} event within {seconds} s{logs(nodes)}") from None
                if event == kind:
                    return fields, skipped
                skipped.append(event)

        def woken_by_the_publish(subject: str) -> bool:
            """Publish through B; the stream on A gets it. A stream that is not woken by the publish finds it
            only when its heartbeat (every 5 s) makes it read again, and sends that heartbeat first: so the
            observation coming with no heartbeat before it is the wake-up (an ordering, not a stopwatch)."""
            with contextlib.suppress(queue.Empty):
                while True:  # what came before this publish says nothing about it
                    events.get_nowait()
            seq = publish(b.api, "wake", owner, subject)["seq"]
            fields, skipped = next_event("observation")
            assert fields.get("id") == str(seq), fields
            assert json.loads(fields["data"])["subject"] == subject
            return "heartbeat" not in skipped

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        try:
            status, _ = next_event("status")
            assert status["status"] == "200"
            eventually(
                lambda: metric(a, "mp_sse_streams_open") >= 1,
                what="the SSE stream opens on A",
                detail=lambda: logs(nodes),
            )
            for round_no in range(2):
                time.sleep(0.3)  # lets the stream park (no gauge shows it); no assertion depends on it
                # A heartbeat falling due in the same instant comes first by chance: that round proves nothing
                # and is repeated. A stream only its heartbeat wakes sends one first every time, and fails.
                eventually(
                    lambda round_no=round_no: woken_by_the_publish(f"sse-{round_no}"),
                    timeout=60,
                    interval=0,
                    what=f"round {round_no}: the SSE stream on A woken by B's publish (not by its heartbeat)",
                    detail=lambda: logs(nodes),
                )
        finally:
            done.set()


# ====================================================================== 4. ack and redelivery across servers
def test_ack_and_redelivery_marks_are_the_same_through_every_server(tmp_path, pg_url):
    with servers(tmp_path, pg_url, 3) as nodes:
        a, b, c = nodes
        owner = create_monitor(a.api, "marks")
        sub_id, reader = subscribe(a.api, "marks", owner, "agent:reader", filter={"types": [TYPE]})
        seqs = [publish(nodes[i % 3].api, "marks", owner, f"item-{i}")["seq"] for i in range(6)]

        def pull(node: Node, limit: int) -> dict[str, Any]:
            r = httpx.get(
                f"{node.api}/subscriptions/{sub_id}/pull",
                params={"limit": limit},
                headers=bearer(reader),
                timeout=TIMEOUT,
            )
            assert r.status_code == 200, f"server {node.name}: {r.text}"
            return r.json()

        def marks(page: dict[str, Any]) -> list[tuple[int, bool]]:
            return [(int(o["id"]), bool(o.get("redelivered", False))) for o in page["observations"]]

        # First delivery through A: nothing marked (control: the marks are not always on).
        first = pull(a, 3)
        assert marks(first) == [(s, False) for s in seqs[:3]] and first["redelivered"] == 0, first
        # The same pull through B: the same observations, now redelivered (A's delivery is known to B).
        second = pull(b, 3)
        assert marks(second) == [(s, True) for s in seqs[:3]] and second["redelivered"] == 3, second
        assert second["cursor"] == first["cursor"] and second["next"] == first["next"]

        # Ack through B; a pull through C starts at the acked cursor and redelivers nothing.
        acked = httpx.post(
            f"{b.api}/subscriptions/{sub_id}/ack",
            json={"cursor": second["next"]},
            headers=bearer(reader),
            timeout=TIMEOUT,
        )
        assert acked.status_code == 200 and acked.json()["cursor"] == second["next"], acked.text
        third = pull(c, 10)
        assert third["cursor"] == second["next"], third
        assert marks(third) == [(s, False) for s in seqs[3:]] and third["redelivered"] == 0, third
        # A sees both B's ack and C's delivery: the cursor as acked, the rest now marked.
        fourth = pull(a, 10)
        assert fourth["cursor"] == second["next"]
        assert marks(fourth) == [(s, True) for s in seqs[3:]] and fourth["redelivered"] == 3, fourth
        # The ack is one record: repeating it through C is idempotent (same body), going back through A refused.
        repeat = httpx.post(
            f"{c.api}/subscriptions/{sub_id}/ack",
            json={"cursor": second["next"]},
            headers=bearer(reader),
            timeout=TIMEOUT,
        )
        assert repeat.status_code == 200 and repeat.json() == acked.json(), (repeat.text, acked.text)
        back = httpx.post(
            f"{a.api}/subscriptions/{sub_id}/ack",
            json={"cursor": seqs[0]},
            headers=bearer(reader),
            timeout=TIMEOUT,
        )
        assert back.status_code == 409 and back.json()["code"] == "CURSOR_BACKWARDS", back.text


def sessions_on(db: str) -> list[str]:
    """The last statement of every other client session on `db` (pg_stat_activity's `query`; not autovacuum's,
    nor a server's probe of whether the database can be reached)."""
    import psycopg

    with psycopg.connect(db, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND application_name <> 'mp serve (probe)'"
        ).fetchall()
    return [row[0] for row in rows]


def test_a_server_holds_the_connections_the_docs_count_and_none_idle_from_its_start(tmp_path, pg_url):
    """docs/scale-out.md: `--db-connections` + 3 per server. The connection the server opened the database
    with (its start's reads) stayed open and idle until the database restarted: one more per server."""
    with servers(tmp_path, pg_url, 1, "--db-connections", "1") as [a]:
        owner = create_monitor(a.api, "conns")
        sub_id, reader = subscribe(a.api, "conns", owner, "agent:reader")
        for i in range(3):
            publish(a.api, "conns", owner, f"item-{i}")
            pulled = httpx.get(
                f"{a.api}/subscriptions/{sub_id}/pull",
                params={"limit": 1},
                headers=bearer(reader),
                timeout=TIMEOUT,
            )
            assert pulled.status_code == 200, pulled.text
            acked = httpx.post(
                f"{a.api}/subscriptions/{sub_id}/ack",
                json={"cursor": pulled.json()["next"]},
                headers=bearer(reader),
                timeout=TIMEOUT,
            )
            assert acked.status_code == 200, acked.text

        def counts_folded() -> list[str] | None:
            queries = sessions_on(pg_url)
            # the fold of the readers' counts (opened at the first acknowledged delivery): every kind is open
            return queries if "COMMIT" in queries else None  # (the fold's last statement)

        queries = eventually(counts_folded, timeout=15, what="the readers' counts folded")
        assert len(queries) == 1 + 3, queries  # the one lane, LISTEN, the leader lock, the counts' fold
        assert not any("FROM monitors ORDER BY id" in q for q in queries), queries


# ============================================================================ 5. sweeps: one leader, failover
def monitor_locks(db: str) -> int:
    """How many per-monitor advisory locks are held in `db` right now (store/postgres.py LOCK_MONITOR)."""
    import psycopg

    with psycopg.connect(db, autocommit=True, connect_timeout=5) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_MONITOR,),
        ).fetchone()[0]


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T in /proc/<pid>/stat), not merely told to stop."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


@contextlib.contextmanager
def frozen(node: Node, db: str) -> Iterator[None]:
    """SIGSTOP the server (its sessions, the leader lock's included, stay open) at a moment when it holds no
    monitor's lock, so that the other servers are not blocked behind it; SIGCONT afterwards, whatever happens."""

    def frozen_outside_a_call() -> bool:
        node.proc.send_signal(signal.SIGSTOP)
        eventually(lambda: stopped(node.proc.pid), interval=0.01, what=f"server {node.name} stops")
        if monitor_locks(db) == 0:
            return True
        node.proc.send_signal(signal.SIGCONT)  # it was inside a call: let it finish, and try again
        return False

    try:
        eventually(frozen_outside_a_call, interval=0.02, what=f"server {node.name} frozen outside a call")
        yield
    finally:
        node.proc.send_signal(signal.SIGCONT)


def test_sweeps_run_on_exactly_one_server_and_another_takes_over_when_it_dies(tmp_path, pg_url):
    with servers(tmp_path, pg_url, 3, "--log-level", "info") as nodes:
        holders = eventually(
            lambda: leader_sessions(pg_url), what="a leader is elected", detail=lambda: logs(nodes)
        )
        assert len(holders) == 1 and holders[0][1] == "mp serve", holders
        leaders = eventually(
            lambda: [n for n in nodes if n.leads()], what="the leader logs it", detail=lambda: logs(nodes)
        )
        assert len(leaders) == 1, f"{len(leaders)} servers took the leader lock{logs(nodes)}"
        leader = leaders[0]
        others = [n for n in nodes if n is not leader]
        x, y = others

        owner = create_monitor(x.api, "sweep", capabilities=["observe", "react", "act"])
        worker = subscribe(x.api, "sweep", owner, "agent:worker", capabilities=["observe", "act"])
        auditor = subscribe(y.api, "sweep", owner, "agent:auditor")
        for subject in ("job-1", "job-2", "job-3"):
            publish(x.api, "sweep", owner, subject)

        def claim(node: Node, subject: str, seconds: int) -> httpx.Response:
            return httpx.post(
                f"{node.api}/subscriptions/{worker[0]}/leases/claim",
                json={"subject": subject, "lease_duration_seconds": seconds},
                headers=bearer(worker[1]),
                timeout=TIMEOUT,
            )

        def the_log() -> list[dict[str, Any]]:
            return read_log(y.api, *auditor, upto=head_of(y.api, "sweep", owner))

        # A subscription that pulls through a non-leader every 0.3 s, with the same 2 s mute window: alive on
        # that server, so the leader's sweep must never retire it (the control beside the mute ones).
        lively = subscribe(y.api, "sweep", owner, "agent:lively", retire_after_mute_seconds=2)
        lively_stop = threading.Event()
        lively_pulls: list[int] = []

        def keep_pulling() -> None:
            with httpx.Client(timeout=TIMEOUT, headers=bearer(lively[1])) as client:
                while not lively_stop.wait(0.3):
                    with contextlib.suppress(httpx.HTTPError):
                        lively_pulls.append(client.get(f"{x.api}/subscriptions/{lively[0]}/pull").status_code)

        puller = threading.Thread(target=keep_pulling, daemon=True)
        puller.start()
        try:
            # A mute window of 2 s (+ the shared store's grace of 1 s) and a lease of 1 s, through non-leaders.
            mute_id, mute_token = subscribe(
                y.api, "sweep", owner, "agent:mute-1", retire_after_mute_seconds=2
            )
            r = claim(x, "job-1", 1)
            assert r.status_code == 201, r.text
            samples: list[int] = []

            def swept() -> bool:
                samples.append(len(leader_sessions(pg_url)))
                log = the_log()
                return bool(lease_rows(log, "expired", "job-1") and retired_rows(log, mute_id))

            eventually(
                swept,
                timeout=60,
                interval=0.25,
                what="job-1 expires and mute-1 retires",
                detail=lambda: logs(nodes),
            )

            # Only the leader sweeps: with it frozen (alive to PostgreSQL, its lock held), a lease that runs
            # out is not expired by the two servers that are still running...
            with frozen(leader, pg_url):
                r = claim(y, "job-3", 1)
                assert r.status_code == 201, r.text
                # The point of the test, so a fixed wait: 1.5 s past the expiry (more than one sweep tick of
                # every running server), nothing may have expired it.
                time.sleep(2.5)
                log = the_log()
                assert not lease_rows(log, "expired", "job-3"), (
                    f"a server that does not hold the leader lock expired a lease{logs(nodes)}"
                )
                assert len(leader_sessions(pg_url)) == 1
            # ... and is, within seconds, once the leader runs again.
            eventually(
                lambda: lease_rows(the_log(), "expired", "job-3"),
                interval=0.2,
                what="job-3 expires once the leader runs again",
                detail=lambda: logs(nodes),
            )
            log = the_log()
            expired, retired = lease_rows(log, "expired", "job-1"), retired_rows(log, mute_id)
            assert len(expired) == 1, f"lease expiry logged {len(expired)} times: {expired}{logs(nodes)}"
            assert len(retired) == 1, f"mute retirement logged {len(retired)} times: {retired}{logs(nodes)}"
            assert len(lease_rows(log, "expired", "job-3")) == 1
            assert expired[0]["actor"] == "system:sweep" and retired[0]["actor"] == "system:sweep"
            assert payload(retired[0]).get("reason") == "mute", retired[0]
            assert set(samples) == {1}, f"leader lock holders sampled while sweeping: {samples}"
            assert [n.name for n in nodes if n.leads()] == [leader.name], logs(nodes)
            # Controls: the expiry freed the lease (a new claim wins, counting the expiry as an attempt); the
            # retired subscription's pull says so.
            r = claim(y, "job-1", 60)
            assert r.status_code == 201 and r.json()["lease"]["attempts"] == 1, r.text
            r = httpx.get(
                f"{x.api}/subscriptions/{mute_id}/pull", headers=bearer(mute_token), timeout=TIMEOUT
            )
            assert r.status_code == 404 and r.json().get("retired") is True, r.text

            # kill -9 the leader; one survivor takes the lock within seconds, and sweeps from then on.
            mute2_id, _ = subscribe(x.api, "sweep", owner, "agent:mute-2", retire_after_mute_seconds=2)
            leader.proc.send_signal(signal.SIGKILL)
            assert leader.proc.wait(timeout=10) == -signal.SIGKILL
            killed_at = time.monotonic()
            new = eventually(
                lambda: [n for n in others if n.leads()],
                what="a survivor takes the leader lock",
                detail=lambda: logs(nodes),
            )
            takeover = time.monotonic() - killed_at
            assert len(new) == 1, f"{len(new)} survivors took the leader lock{logs(nodes)}"
            assert len(leader_sessions(pg_url)) == 1
            r = claim(new[0], "job-2", 1)
            assert r.status_code == 201, r.text
            eventually(
                lambda: lease_rows(the_log(), "expired", "job-2") and retired_rows(the_log(), mute2_id),
                interval=0.25,
                what="job-2's expiry is swept after the leader died",
                detail=lambda: logs(nodes),
            )
            time.sleep(1.5)  # the point: more sweep ticks pass, and none may sweep the same thing again
            log = the_log()
            assert len(lease_rows(log, "expired", "job-2")) == 1, lease_rows(log, "expired", "job-2")
            assert len(retired_rows(log, mute2_id)) == 1, retired_rows(log, mute2_id)
            assert len(lease_rows(log, "expired", "job-1")) == 1  # and nothing was swept twice meanwhile
        finally:
            lively_stop.set()
            puller.join(timeout=20)
        # The control: the subscription that kept pulling through a non-leader was never retired.
        assert lively_pulls.count(200) >= 20 and set(lively_pulls) == {200}, Counter(lively_pulls)
        assert not retired_rows(the_log(), lively[0]), "a subscription alive on another server was retired"
        print(f"leader {leader.name} killed; {new[0].name} took over in {takeover:.2f} s")


# ================================================================================ 6. kill -9 under load
PUBLISHERS_6, KEYS_PER_PUBLISHER, KILL_AFTER = 6, 40, 80


@pytest.mark.parametrize("lanes", ["threads", "green"])  # --db-lanes: engine calls on threads or greenlets
def test_kill9_of_one_server_under_load_loses_nothing_and_retries_elsewhere_finish(tmp_path, pg_url, lanes):
    with servers(tmp_path, pg_url, 3, "--db-lanes", lanes) as nodes:
        victim = nodes[2]
        owner = create_monitor(nodes[0].api, "load")
        auditor = subscribe(nodes[1].api, "load", owner, "agent:auditor")
        lock = threading.Lock()
        confirmed: dict[str, tuple[int, str, int]] = {}  # key -> (seq, server, status)
        retries: list[tuple[str, str, str]] = []  # (key, server, why)
        enough = threading.Event()

        def publisher(p: int) -> Callable[[], None]:
            def run() -> None:
                clients = [
                    httpx.Client(base_url=n.api, timeout=TIMEOUT, headers=bearer(owner)) for n in nodes
                ]
                try:
                    turn = p
                    for i in range(KEYS_PER_PUBLISHER):
                        key = f"p{p}-{i}"
                        body = {"type": TYPE, "subject": key, "actor": "probe:load", "idempotency_key": key}
                        for _attempt in range(30):
                            node, client = nodes[turn % 3], clients[turn % 3]
                            turn += 1  # round-robin; a failed request is retried on the next server
                            try:
                                r = client.post("/monitors/load/observations", json=body)
                            except httpx.HTTPError as exc:
                                with lock:
                                    retries.append((key, node.name, type(exc).__name__))
                                continue
                            if r.status_code == 503:
                                with lock:
                                    retries.append((key, node.name, "503"))
                                time.sleep(0.1)  # a producer's pause before its retry
                                continue
                            assert r.status_code in (200, 201), (
                                f"server {node.name}: {r.status_code} {r.text}"
                            )
                            assert r.json()["idempotent"] is (r.status_code == 200), r.text
                            with lock:
                                confirmed[key] = (int(r.json()["seq"]), node.name, r.status_code)
                                if len(confirmed) >= KILL_AFTER:
                                    enough.set()
                            break
                        else:
                            raise AssertionError(f"{key} was never confirmed in 30 attempts")
                finally:
                    for c in clients:
                        c.close()

            return run

        def killer() -> None:
            assert enough.wait(timeout=60), "the load never got going"
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(timeout=10)

        failures = run_threads([*(publisher(p) for p in range(PUBLISHERS_6)), killer], 180)
        assert not failures, f"{failures[:5]}{logs(nodes)}"
        assert victim.proc.returncode == -signal.SIGKILL, "the victim was not killed"
        keys = {f"p{p}-{i}" for p in range(PUBLISHERS_6) for i in range(KEYS_PER_PUBLISHER)}
        assert set(confirmed) == keys, f"never confirmed: {sorted(keys - set(confirmed))[:10]}"

        # Controls: the victim confirmed publishes before it died, the kill landed mid-run (later keys were
        # confirmed by the survivors only), and publishers had to retry on another server because of it.
        by_server = Counter(server for _, server, _ in confirmed.values())
        assert by_server[victim.name] > 0 and all(
            by_server[n.name] > by_server[victim.name] for n in nodes[:2]
        ), by_server
        assert any(server == victim.name for _, server, _ in retries), retries
        # Every confirmed key is in the log exactly once, at its confirmed seq; the log is dense.
        head = head_of(nodes[0].api, "load", owner)
        log = read_log(nodes[1].api, *auditor, upto=head)
        assert [int(o["id"]) for o in log] == list(range(1, head + 1)), "the log is not dense"
        copies = Counter(o["subject"] for o in log if o["type"] == TYPE)
        duplicated = {k: n for k, n in copies.items() if n > 1}
        assert not duplicated, f"retried publishes appended twice: {sorted(duplicated.items())[:10]}"
        at = {o["subject"]: int(o["id"]) for o in log if o["type"] == TYPE}
        moved = {k: (seq, at.get(k)) for k, (seq, _, _) in confirmed.items() if at.get(k) != seq}
        assert not moved, f"confirmed publishes lost or moved: {sorted(moved.items())[:10]}"
        assert set(copies) == keys
        # A producer that lost the reply of a publish which did land retries it on another server: the first
        # reply again (200, same seq), nothing appended. Deterministically, for what the victim confirmed.
        by_victim = {k: seq for k, (seq, server, _) in confirmed.items() if server == victim.name}
        with httpx.Client(timeout=TIMEOUT, headers=bearer(owner)) as client:
            for n, (key, seq) in enumerate(sorted(by_victim.items())):
                body = {"type": TYPE, "subject": key, "actor": "probe:load", "idempotency_key": key}
                r = client.post(f"{nodes[n % 2].api}/monitors/load/observations", json=body)
                assert r.status_code == 200 and r.json()["idempotent"] is True, r.text
                assert int(r.json()["seq"]) == seq, (key, seq, r.text)
        assert head_of(nodes[1].api, "load", owner) == head, "a retried publish appended again"
        idempotent = sum(1 for _, _, status in confirmed.values() if status == 200)
        in_flight = sum(1 for _, server, why in retries if server == victim.name and why != "ConnectError")
        print(
            f"confirmed by server {dict(by_server)}; {len(retries)} retries, {in_flight} of them cut mid-request "
            f"by the kill; {idempotent} retries answered 200 idempotent (landed before the kill)"
        )


# ======================================================================== 7. PostgreSQL restarting under load
def own_cluster() -> Cluster:
    """A cluster of this test's own (it is stopped and started again): skipped without PostgreSQL's
    binaries, failed instead in CI (the rule of tests/conftest.py's pg_admin_url)."""
    try:
        import psycopg  # noqa: F401 - the servers need it
    except ImportError as exc:
        why = f"psycopg is not installed ({exc})"
        if ci_is_true():
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    if find_bin_dir() is None:
        why = "PostgreSQL's binaries are not installed (apt-get install postgresql)"
        if ci_is_true():
            pytest.fail(
                f"{why}; CI is set, and PostgreSQL tests are never silently skipped in CI", pytrace=False
            )
        pytest.skip(why)
    return Cluster()


PUBLISHERS_7 = 4
OUTAGES = (("fast", 1.5), ("immediate", 1.5))  # pg_ctl stop mode, seconds away


class Sink:
    """A push receiver on loopback (`mp serve --allow-sink 127.0.0.1`): answers 204, keeps every batch."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                batch = json.loads(self.rfile.read(int(self.headers["content-length"])))
                sink.seqs.extend(int(o["id"]) for o in batch.get("observations", []))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_postgres_restart_under_load_is_503_with_retry_after_then_reconnects_and_loses_nothing(tmp_path):
    sink = Sink()
    with own_cluster() as cluster, contextlib.closing(sink):
        db = cluster.url
        with servers(tmp_path, db, 2, "--allow-sink", "127.0.0.1") as nodes:
            owner = create_monitor(nodes[0].api, "restart")
            auditor = subscribe(nodes[1].api, "restart", owner, "agent:auditor", filter={"types": [TYPE]})
            # HTTP push (run by the leader) to a local sink, delivering before the outage (the control).
            subscribe(
                nodes[0].api,
                "restart",
                owner,
                "webhook:sink",
                protocol="http",
                sink=sink.url,
                filter={"types": [TYPE]},
            )
            pushed = publish(nodes[1].api, "restart", owner, "before-outage")["seq"]
            eventually(
                lambda: pushed in sink.seqs,
                what="push delivers before the outage",
                detail=lambda: logs(nodes),
            )
            lock = threading.Lock()
            confirmed: dict[str, tuple[int, str, float]] = {}  # key -> (seq, server, when)
            confirmed["before-outage"] = (pushed, "B", time.monotonic())
            refusals: list[tuple[str, int, str, str | None]] = []  # (server, status, body, Retry-After)
            transport: list[tuple[str, str]] = []  # (server, exception): requests the server never answered
            stop = threading.Event()
            down: list[tuple[float, float]] = []  # (stopped, started again) per outage
            idempotent: list[tuple[str, list[str]]] = []  # (key, the replies before its 200 idempotent)

            def publisher(p: int) -> Callable[[], None]:
                def run() -> None:
                    clients = [
                        httpx.Client(base_url=n.api, timeout=TIMEOUT, headers=bearer(owner)) for n in nodes
                    ]
                    try:
                        i, turn = 0, p
                        while not stop.is_set():
                            key = f"p{p}-{i}"
                            body = {
                                "type": TYPE,
                                "subject": key,
                                "actor": "probe:load",
                                "idempotency_key": key,
                            }
                            history: list[str] = []
                            for _attempt in range(200):
                                node, client = nodes[turn % 2], clients[turn % 2]
                                turn += 1
                                try:
                                    r = client.post("/monitors/restart/observations", json=body)
                                except httpx.HTTPError as exc:
                                    with lock:
                                        transport.append((node.name, repr(exc)))
                                    time.sleep(0.1)  # a producer's pause before its retry
                                    continue
                                if r.status_code in (200, 201):
                                    assert r.json()["idempotent"] is (r.status_code == 200), r.text
                                    with lock:
                                        if r.status_code == 200:
                                            idempotent.append((key, history))
                                        confirmed[key] = (int(r.json()["seq"]), node.name, time.monotonic())
                                    break
                                with lock:
                                    refusals.append(
                                        (node.name, r.status_code, r.text, r.headers.get("retry-after"))
                                    )
                                history.append(
                                    f"{node.name} {r.status_code} {body_of(r.text).get('error')}"[:300]
                                )
                                time.sleep(0.1)  # a producer's pause before its retry
                            else:
                                raise AssertionError(f"{key} was never confirmed in 200 attempts")
                            i += 1
                    finally:
                        for c in clients:
                            c.close()

                return run

            def reader() -> None:  # pulls through both servers too: reads must be 503, never 500, as well
                turn = 0
                with httpx.Client(timeout=TIMEOUT, headers=bearer(auditor[1])) as client:
                    while not stop.is_set():
                        node = nodes[turn % 2]
                        turn += 1
                        try:
                            r = client.get(f"{node.api}/subscriptions/{auditor[0]}/pull", params={"limit": 5})
                        except httpx.HTTPError as exc:
                            with lock:
                                transport.append((node.name, repr(exc)))
                            time.sleep(0.1)  # a reader's pause before its retry
                            continue
                        if r.status_code != 200:
                            with lock:
                                refusals.append(
                                    (node.name, r.status_code, r.text, r.headers.get("retry-after"))
                                )
                        time.sleep(0.05)  # the reader's pace

            def serving_since(moment: float) -> bool:
                """Both servers have confirmed publishes after `moment`."""
                return {s for _, s, t in list(confirmed.values()) if t > moment} == {"A", "B"}

            def operator() -> None:
                try:
                    for mode, seconds in OUTAGES:
                        # The outage comes under load: both servers confirming publishes (since the last restart).
                        since = down[-1][1] if down else started
                        eventually(
                            lambda since=since: serving_since(since),
                            what="both servers confirm publishes before the outage",
                            detail=lambda: logs(nodes),
                        )
                        before = len(confirmed)
                        listens = [metric(n, "mp_store_listen_connects_total") for n in nodes]
                        cluster.stop_server(mode)
                        stopped = time.monotonic()
                        time.sleep(seconds)  # the point: PostgreSQL stays away this long
                        cluster.start_server()
                        down.append((stopped, time.monotonic()))
                        assert before > 0, "nothing was confirmed before the outage"
                        # Each server LISTENs again by itself (other servers' appends wake its readers again).
                        eventually(
                            lambda listens=listens: all(
                                metric(n, "mp_store_listening") == 1
                                and metric(n, "mp_store_listen_connects_total") > made
                                for n, made in zip(nodes, listens, strict=True)
                            ),
                            timeout=60,
                            what=f"both servers LISTEN again after the {mode} restart",
                            detail=lambda: f"{link(nodes)}{logs(nodes)}",
                        )
                    # Both servers reconnect by themselves: each confirms publishes after the last restart.
                    eventually(
                        lambda: serving_since(down[-1][1]),
                        timeout=60,
                        what="both servers confirm publishes after the restart",
                        detail=lambda: logs(nodes),
                    )
                finally:
                    stop.set()

            started = time.monotonic()
            failures = run_threads([*(publisher(p) for p in range(PUBLISHERS_7)), reader, operator], 180)
            loaded = time.monotonic() - started
            assert not failures, f"{failures[:5]}{logs(nodes)}"
            assert len(down) == len(OUTAGES)

            # While PostgreSQL was away: 503 UNAVAILABLE with a Retry-After, never 500, never a traceback; and
            # the servers kept answering (no dropped connection).
            assert not transport, f"requests left unanswered: {transport[:5]}{logs(nodes)}"
            bad = [
                x
                for x in refusals
                if x[1] != 503
                or "Traceback" in x[2]
                or not (x[3] or "").isdigit()
                or body_of(x[2]).get("code") != "UNAVAILABLE"
            ]
            assert not bad, f"refusals other than 503 UNAVAILABLE with Retry-After: {bad[:5]}{logs(nodes)}"
            incidents = [x for x in refusals if "incident" in body_of(x[2])]
            assert not incidents, (
                f"the outage raised in the server (an internal failure, not storage): {incidents[:3]}"
            )
            # Control: the outage was noticed, by both servers.
            assert {x[0] for x in refusals} == {"A", "B"}, (
                f"503s seen from {sorted({x[0] for x in refusals})}"
            )
            before = [k for k, (_, _, t) in confirmed.items() if t < down[0][0]]
            after = [k for k, (_, _, t) in confirmed.items() if t > down[-1][1]]
            assert before and after, (len(before), len(after))

            # HTTP push came back too: whichever server leads now delivers a publish made after the restart
            # (allowing for the push worker's backoff and its rescan of 5 s), and no server's push task died.
            late = publish(nodes[0].api, "restart", owner, "after-restart")["seq"]
            late_at = time.monotonic()
            confirmed["after-restart"] = (late, "A", time.monotonic())
            leader = [n.name for n in nodes if n.leads()]
            eventually(
                lambda: late in sink.seqs,
                timeout=60,
                interval=0.1,
                what=f"push delivers a publish made after the restart (leaders so far: {leader})",
                detail=lambda: logs(nodes),
            )
            push_delay = time.monotonic() - late_at
            dead = [n.name for n in nodes if "background task" in n.log() and "failed" in n.log()]
            assert not dead, (
                f"a background task (push delivery) died during the outage on {dead}{logs(nodes)}"
            )

            # Nothing confirmed was lost (also across the crash of -m immediate), nothing appended twice.
            head = head_of(nodes[0].api, "restart", owner)
            log = read_log(nodes[1].api, *auditor, upto=head)
            assert [int(o["id"]) for o in log if o["type"] == TYPE] == sorted(
                seq for seq, _, _ in confirmed.values()
            )
            copies = Counter(o["subject"] for o in log)
            assert not {k: n for k, n in copies.items() if n > 1}, "a retried publish was appended twice"
            at = {o["subject"]: int(o["id"]) for o in log}
            lost = {k: seq for k, (seq, _, _) in confirmed.items() if at.get(k) != seq}
            assert not lost, f"confirmed publishes lost: {sorted(lost.items())[:10]}"
            # The wake-ups came back too (LISTEN reconnected): a long poll on A wakes on a publish through B.
            waiter = subscribe(
                nodes[0].api, "restart", owner, "agent:waiter", filter={"types": [TYPE]}, **{"from": "head"}
            )
            rounds: list[Wake] = []

            def woken() -> bool:
                rounds.append(
                    long_poll_round(nodes[0], nodes[1], "restart", owner, waiter, f"w{len(rounds)}", 10)
                )
                return rounds[-1].parked and rounds[-1].carried and rounds[-1].before_its_deadline

            eventually(
                woken,
                timeout=90,
                interval=0,
                what="a long poll on A woken by a publish through B again (before its wait of 10 s ran out)",
                detail=lambda: f"{rounds[:3]} ... {rounds[-2:]}{link(nodes)}{logs(nodes)}",
            )
            print(
                f"{len(confirmed)} publishes confirmed ({len(idempotent)} of them 200 idempotent: a retry after a "
                f"503 whose commit had landed: {[(k, h[:1]) for k, h in idempotent[:3]]}), "
                f"{len(refusals)} 503 refusals, outages "
                f"{[round(b - a, 2) for a, b in down]} s; cross-server wake-up after the restart: "
                f"{rounds[-1].delay:.3f} s after {len(rounds)} round(s); push resumed {push_delay:.1f} s after "
                f"the publish; the load ran {loaded:.1f} s"
            )


def test_push_delivery_survives_a_storage_failure_while_it_rescans():
    """The push part of test 7, deterministically and in-process: the leader's push supervisor re-reads the push
    subscriptions every few seconds (push.Pusher.rescan); a re-read while the database is away is a 503
    (ProtocolError UNAVAILABLE), and it must be retried, not end push delivery on that server for good."""

    class Service:  # what Pusher needs of MonitorService, with a database that is away once
        push_epoch = 0

        def __init__(self) -> None:
            self.calls = 0

        def add_listener(self, fn: Any) -> None:
            pass

        def remove_listener(self, fn: Any) -> None:
            pass

        def sweeps_here(self) -> bool:
            return True

        def push_targets(self) -> list[dict[str, Any]]:
            self.calls += 1
            if self.calls == 1:
                raise storage_unavailable("PostgreSQL: connection failed: Connection refused")
            return []

    service = Service()

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    async def scenario() -> BaseException | None:
        task = asyncio.create_task(Pusher(call, service, rescan_seconds=0.05).run())
        await eventually_async(
            lambda: service.calls >= 2 or task.done(),
            interval=0.02,
            what="the push supervisor re-reads its targets after the failed re-read",
        )
        died = task.exception() if task.done() else None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return died

    died = asyncio.run(scenario())
    assert service.calls >= 1  # control: the failing re-read really happened
    assert died is None and service.calls >= 2, (
        f"the push supervisor ended on a storage failure ({died!r}) instead of re-reading its targets later: "
        "push delivery stops on that server until it restarts"
    )
