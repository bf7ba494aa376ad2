"""`mp watch` (docs/protocol.md section 9) against real `mp serve` processes: lines, acks, restarts, kills.

Every wait below is a hang guard (a broken implementation fails instead of hanging the suite); no assertion
depends on timing: each test waits for the lines it expects, in order.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from monitor_protocol.client import Client
from serverutil import long_polls_parked, mp_command, mp_env, start_server, stop_server
from waiting import eventually

TYPE = "com.example.ci.run"
LINE_GUARD_SECONDS = 45.0
OBS = re.compile(
    r"^OBS seq=(\d+) type=(\S+) subject=(\S+) tier=\S+ origin=\S+ actor=\S+ redelivered=(true|false) data="
)


class Watcher:
    """An `mp watch` subprocess whose stdout lines are read by a thread into a queue."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            mp_command("watch", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=mp_env(),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next(self) -> str:
        try:
            line = self.lines.get(timeout=LINE_GUARD_SECONDS)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"mp watch printed nothing more; so far: {self.seen}") from None
        if line is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"mp watch ended ({self.proc.wait()}); so far: {self.seen}; stderr: {err}")
        self.seen.append(line)
        return line

    def until(self, prefix: str) -> list[str]:
        """Lines up to and including the first one starting with `prefix`."""
        out = []
        while True:
            line = self.next()
            out.append(line)
            if line.startswith(prefix):
                return out

    def obs(self, n: int) -> list[tuple[int, str, bool]]:
        """The next n OBS lines as (seq, subject, redelivered); any other line in between fails."""
        out = []
        for _ in range(n):
            line = self.next()
            m = OBS.match(line)
            assert m, f"expected an OBS line, got {line!r}"
            out.append((int(m.group(1)), m.group(3), m.group(4) == "true"))
        return out

    def obs_between_nexts(self, n: int) -> list[tuple[int, str, bool]]:
        """The next n OBS lines, allowing `NEXT` lines between batches (batching depends on timing)."""
        out: list[tuple[int, str, bool]] = []
        while len(out) < n:
            line = self.next()
            if line.startswith("NEXT "):
                continue
            m = OBS.match(line)
            assert m, f"expected an OBS or NEXT line, got {line!r}"
            out.append((int(m.group(1)), m.group(3), m.group(4) == "true"))
        return out

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=15)


@pytest.fixture
def watchers() -> Iterator[list[Watcher]]:
    made: list[Watcher] = []
    yield made
    for w in made:
        w.stop(signal.SIGKILL)


def setup_feed(base: str, mid: str = "ci", **sub: Any) -> tuple[str, str, str]:
    """A monitor and a subscription to its own type; returns (owner token, subscription id, reader token)."""
    with Client(base) as c:
        owner = c.create_monitor(mid, types=[TYPE]).owner_token
        s = c.subscribe(mid, "agent:watcher", token=owner, filter={"types": [TYPE]}, **sub)
        return owner, s.subscription.id, s.token


def publish(base: str, owner: str, *subjects: str, mid: str = "ci") -> list[int]:
    with Client(base, owner) as c:
        return [c.publish(mid, TYPE, subject=s, data={"n": s}).seq for s in subjects]


def committed(base: str, sid: str, reader: str) -> int:
    with Client(base, reader) as c:
        return c.pull(sid, limit=1).cursor


def wait_committed(base: str, sid: str, reader: str, expected: int) -> None:
    """Wait until the watch's ack has landed (it follows the printed line); fails after the hang guard."""
    eventually(
        lambda: committed(base, sid, reader) == expected,
        timeout=LINE_GUARD_SECONDS,
        what=f"the committed cursor reaches {expected}",
        detail=lambda: f" (it is {committed(base, sid, reader)})",
    )


def test_watch_prints_one_line_per_observation_and_acks(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        seqs = publish(base, owner, "build-1", "build-2")
        w = Watcher(sid, "--token", reader, "--base", base, "--wait", "5")
        watchers.append(w)
        assert w.obs(2) == [(seqs[0], "build-1", False), (seqs[1], "build-2", False)]
        long = "x" * 1000
        with Client(base, owner) as c:
            big = c.publish("ci", TYPE, subject="big", data={"blob": long}).seq
        line = w.next()
        assert line.startswith(f"OBS seq={big} type={TYPE} subject=big ")
        data = line.split(" data=", 1)[1]
        # Cut at 400 characters as a JSON string holding the start of the data's JSON, ending with "...".
        assert len(data) <= 400 and json.loads(data).startswith('{"blob":"xxx') and data.endswith('..."')
        # Each batch is acked once printed: the committed cursor reaches past the big one.
        wait_committed(base, sid, reader, big + 1)
    finally:
        stop_server(proc)


def test_watch_manual_ack_prints_next_and_leaves_the_commit(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        seqs = publish(base, owner, "a", "b")
        start = committed(base, sid, reader)
        w = Watcher(sid, "--token", reader, "--base", base, "--wait", "5", "--manual-ack")
        watchers.append(w)
        assert [s for s, _, _ in w.obs(2)] == seqs
        assert w.next() == f"NEXT {seqs[1] + 1}"
        assert committed(base, sid, reader) == start  # nothing committed by the watch
        more = publish(base, owner, "c")
        assert w.obs(1) == [(more[0], "c", False)]  # the watch moves on without committing
        assert w.next() == f"NEXT {more[0] + 1}"
        ack = subprocess.run(
            mp_command("ack", sid, str(more[0] + 1), "--base", base, "--token", reader),
            capture_output=True,
            text=True,
            env=mp_env(),
            timeout=60,
        )
        assert ack.returncode == 0, ack.stderr
        assert committed(base, sid, reader) == more[0] + 1
    finally:
        stop_server(proc)


def test_manual_ack_watch_killed_unacked_gets_everything_it_printed_back_flagged_redelivered(
    tmp_path: Path, watchers: list[Watcher]
) -> None:
    """--manual-ack reads past the first unacknowledged batch with read-only replays; what it printed is
    still marked delivered, so a restart brings each of those back with redelivered=true (B too, not only
    the first batch's A)."""
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        first = publish(base, owner, "a")
        w = Watcher(sid, "--token", reader, "--base", base, "--wait", "5", "--manual-ack")
        watchers.append(w)
        assert w.obs(1) == [(first[0], "a", False)] and w.next() == f"NEXT {first[0] + 1}"
        later = publish(base, owner, "b")
        assert w.obs(1) == [(later[0], "b", False)] and w.next() == f"NEXT {later[0] + 1}"
        w.stop()  # killed before anything was acknowledged
        again = Watcher(sid, "--token", reader, "--base", base, "--wait", "5", "--manual-ack")
        watchers.append(again)
        assert again.obs(2) == [(first[0], "a", True), (later[0], "b", True)]
        fresh = publish(base, owner, "c")  # positive control: a new one is not flagged
        assert again.next() == f"NEXT {later[0] + 1}" and again.obs(1) == [(fresh[0], "c", False)]
    finally:
        stop_server(proc)


def test_server_restart_under_a_running_watch_loses_nothing(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    port = base.rsplit(":", 1)[1]
    try:
        owner, sid, reader = setup_feed(base)
        first = publish(base, owner, "one")
        auto = Watcher(sid, "--token", reader, "--base", base, "--wait", "2")
        watchers.append(auto)
        assert auto.obs(1) == [(first[0], "one", False)]

        # A second subscription followed with --manual-ack: its batch is printed but never committed.
        with Client(base) as c:
            s2 = c.subscribe("ci", "agent:manual", token=owner, filter={"types": [TYPE]})
        manual = Watcher(
            s2.subscription.id, "--token", s2.token, "--base", base, "--wait", "2", "--manual-ack"
        )
        watchers.append(manual)
        assert manual.obs(1) == [(first[0], "one", False)]
        assert manual.next() == f"NEXT {first[0] + 1}"
        wait_committed(base, sid, reader, first[0] + 1)  # the auto watch acked its batch
        # A third follows with the longest wait: its UP is said when the server answers, not when its first
        # long poll after it ends (found by a tester: UP came a whole --wait late, with nothing published).
        with Client(base) as c:
            s3 = c.subscribe("ci", "agent:patient", token=owner, filter={"types": [TYPE]})
        patient = Watcher(s3.subscription.id, "--token", s3.token, "--base", base, "--wait", "50")
        watchers.append(patient)
        assert patient.obs(1) == [(first[0], "one", False)]
        eventually(lambda: long_polls_parked(base) >= 1, what="the patient watch parks its long poll")

        stop_server(proc)
        assert auto.until("DOWN")[-1].startswith("DOWN ")
        assert manual.until("DOWN")[-1].startswith("DOWN ")
        assert patient.until("DOWN")[-1].startswith("DOWN ")
        base2, proc = start_server(tmp_path, "--port", port)
        assert base2 == base
        assert auto.next() == f"UP {base}/mp/v0"
        assert manual.next() == f"UP {base}/mp/v0"
        assert patient.next() == f"UP {base}/mp/v0"  # within the line guard (45 s), less than its wait
        # The unacked batch comes back, marked redelivered; the acked one does not.
        assert manual.obs(1) == [(first[0], "one", True)]
        assert manual.next() == f"NEXT {first[0] + 1}"
        later = publish(base, owner, "two", "three")
        assert auto.obs(2) == [(later[0], "two", False), (later[1], "three", False)]
        assert [s for s, _, _ in manual.obs_between_nexts(2)] == later
    finally:
        stop_server(proc)


class HoldAcks(ThreadingHTTPServer):
    """A forwarding proxy that passes every request to the server except acks, which it holds forever
    (as if the watch had been stopped between printing a batch and acknowledging it)."""

    daemon_threads = True

    def __init__(self, target: str) -> None:
        self.target = target
        self.ack_seen = threading.Event()
        self.release = threading.Event()
        self.bad_gateway = threading.Event()
        self.hold_acks = True
        super().__init__(("127.0.0.1", 0), _Forward)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Forward(BaseHTTPRequestHandler):
    server: HoldAcks

    def log_message(self, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.server.bad_gateway.is_set():
            self.send_response(502)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", "11")
            self.end_headers()
            self.wfile.write(b"bad gateway")
            return
        route = self.path.split("?")[0]
        acking = route.endswith("/ack") or (route.endswith("/pull") and b'"ack"' in body)  # ack-and-pull too
        if self.server.hold_acks and self.command == "POST" and acking:
            self.server.ack_seen.set()
            self.server.release.wait()
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
        r = httpx.request(
            self.command, self.server.target + self.path, headers=headers, content=body, timeout=70
        )
        self.send_response(r.status_code)
        self.send_header("content-type", r.headers.get("content-type", "application/json"))
        self.send_header("content-length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    do_GET = _forward
    do_POST = _forward


def test_killed_between_print_and_ack_the_batch_comes_back(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    proxy = HoldAcks(base)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        owner, sid, reader = setup_feed(base)
        seqs = publish(base, owner, "p", "q")
        start = committed(base, sid, reader)
        w = Watcher(sid, "--token", reader, "--base", proxy.url, "--wait", "2")
        watchers.append(w)
        assert [s for s, _, _ in w.obs(2)] == seqs
        assert proxy.ack_seen.wait(LINE_GUARD_SECONDS)  # the watch is inside its ack, which never arrives
        w.stop(signal.SIGKILL)
        assert committed(base, sid, reader) == start

        again = Watcher(sid, "--token", reader, "--base", base, "--wait", "2")
        watchers.append(again)
        assert again.obs(2) == [(seqs[0], "p", True), (seqs[1], "q", True)]
        more = publish(base, owner, "r")
        assert again.obs(1) == [(more[0], "r", False)]
        wait_committed(base, sid, reader, more[0] + 1)
        again.stop()
        # Its last long poll is gone from the server before the next publish: one the server had not yet seen
        # leave would be woken by it and deliver "s" to a closed connection, and "s" would then come back
        # redelivered (at-least-once, rightly; a CI run on a loaded machine saw it).
        # (Read twice, apart: a pull it sent just before it stopped may still be on its way to parking.)
        for _ in range(2):
            eventually(
                lambda: long_polls_parked(base) == 0, timeout=LINE_GUARD_SECONDS, what="no poll parked"
            )
            time.sleep(0.3)

        # Restarted, the watch resumes exactly at the committed cursor: only what came after is printed.
        after = publish(base, owner, "s")
        third = Watcher(sid, "--token", reader, "--base", base, "--wait", "2")
        watchers.append(third)
        assert third.obs(1) == [(after[0], "s", False)]
    finally:
        proxy.release.set()
        proxy.shutdown()
        stop_server(proc)


def test_catch_up_frames_the_backlog_and_never_replays_what_was_acked(
    tmp_path: Path, watchers: list[Watcher]
) -> None:
    """The seed's invocation, as written: `--catch-up` frames what waited while nobody watched (from the
    committed cursor to the head at start) between CATCHUP and LIVE, acks it, then follows."""
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        old = publish(base, owner, "old-1", "old-2")
        with Client(base, reader) as c:
            c.ack(sid, old[-1] + 1)  # acknowledged: never shown again
        backlog = publish(base, owner, "new-1", "new-2", "new-3")
        with Client(base, owner) as c:
            head = c.state("ci").head
        w = Watcher("--base", base, "--subscription", sid, "--token", reader, "--catch-up", "--wait", "2")
        watchers.append(w)
        assert w.next() == f"CATCHUP 3 from={old[-1] + 1} head={head}"
        assert w.obs(3) == [(s, f"new-{i}", False) for i, s in enumerate(backlog, 1)]
        assert w.next() == "LIVE"
        wait_committed(base, sid, reader, backlog[-1] + 1)  # the backlog is acknowledged as usual
        live = publish(base, owner, "live-1")
        assert w.obs(1) == [(live[0], "live-1", False)]
        wait_committed(base, sid, reader, live[0] + 1)
        w.stop()
        # Restarted with --catch-up on a subscription with nothing waiting: an empty frame, no replay.
        again = Watcher("--base", base, "--subscription", sid, "--token", reader, "--catch-up", "--wait", "2")
        watchers.append(again)
        with Client(base, owner) as c:
            head = c.state("ci").head
        assert again.next() == f"CATCHUP 0 from={live[0] + 1} head={head}"
        assert again.next() == "LIVE"
        later = publish(base, owner, "later")
        assert again.obs(1) == [(later[0], "later", False)]
    finally:
        stop_server(proc)


def test_catch_up_with_manual_ack_prints_next_inside_the_frame(
    tmp_path: Path, watchers: list[Watcher]
) -> None:
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        backlog = publish(base, owner, "a", "b")
        w = Watcher(sid, "--base", base, "--token", reader, "--catch-up", "--manual-ack", "--limit", "1")
        watchers.append(w)
        assert w.next().startswith("CATCHUP 2 from=0 head=")
        assert w.obs(1) == [(backlog[0], "a", False)]
        assert w.next() == f"NEXT {backlog[0] + 1}"
        assert w.obs(1) == [(backlog[1], "b", False)]
        assert w.next() == f"NEXT {backlog[1] + 1}"
        assert w.next() == "LIVE"
        assert committed(base, sid, reader) == 0  # manual: nothing committed by the watch
        live = publish(base, owner, "c")
        assert w.obs(1) == [(live[0], "c", False)]
        assert w.next() == f"NEXT {live[0] + 1}"
    finally:
        stop_server(proc)


def test_catch_up_on_a_subscription_created_at_the_head(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    try:
        with Client(base) as c:
            owner = c.create_monitor("ci", types=[TYPE]).owner_token
        publish(base, owner, "before-1", "before-2")
        with Client(base) as c:
            s = c.subscribe("ci", "agent:late", token=owner, filter={"types": [TYPE]}, from_="head")
            head = c.state("ci", token=owner).head
        w = Watcher(s.subscription.id, "--token", s.token, "--base", base, "--catch-up", "--wait", "2")
        watchers.append(w)
        # The cursor is where the subscription started (past the backlog); the head may hold the row that
        # logged this subscribe, which the subscription's filter does not let through.
        assert s.subscription.cursor > 2
        assert w.next() == f"CATCHUP 0 from={s.subscription.cursor} head={head}"
        assert w.next() == "LIVE"
        after = publish(base, owner, "after")
        assert w.obs(1) == [(after[0], "after", False)]  # nothing published before it was replayed
    finally:
        stop_server(proc)


def test_retired_subscription_prints_retired_and_exits_0(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        publish(base, owner, "x")
        w = Watcher(sid, "--token", reader, "--base", base, "--wait", "2")
        watchers.append(w)
        w.obs(1)
        with Client(base, reader) as c:
            c.retire_subscription(sid, "done")
        assert w.until("RETIRED")[-1].startswith("RETIRED")
        assert w.proc.wait(timeout=LINE_GUARD_SECONDS) == 0
    finally:
        stop_server(proc)


def test_expired_cursor_follows_the_reset_policy(tmp_path: Path, watchers: list[Watcher]) -> None:
    admin = "admin-token-for-watch-tests-0123"
    base, proc = start_server(tmp_path, "--allow-admin", admin)
    try:
        owner, sid, reader = setup_feed(base, reset_policy="none")
        seqs = publish(base, owner, "gone-1", "gone-2", "kept")
        with Client(base) as c:
            c.admin_compact(seqs[1], "ci", token=admin)
        w = Watcher(sid, "--token", reader, "--base", base, "--wait", "2")
        watchers.append(w)
        line = w.next()
        assert line.startswith("EXPIRED ") and "reset_policy=none" in line
        assert w.proc.wait(timeout=LINE_GUARD_SECONDS) == 1
    finally:
        stop_server(proc)


def test_a_cursor_the_server_moved_by_latest_is_said_then_followed(
    tmp_path: Path, watchers: list[Watcher]
) -> None:
    """Found by a tester: with reset_policy latest, a compaction past the cursor skipped to the head and the
    watch printed nothing. It prints the EXPIRED line (reset_policy=latest) and goes on following."""
    admin = "admin-token-for-watch-tests-0123"
    base, proc = start_server(tmp_path, "--allow-admin", admin)
    try:
        owner, sid, reader = setup_feed(base, reset_policy="latest")
        seqs = publish(base, owner, "gone-1", "gone-2", "skipped")
        with Client(base) as c:
            c.admin_compact(seqs[1], "ci", token=admin)
        w = Watcher(sid, "--token", reader, "--base", base, "--wait", "2")
        watchers.append(w)
        line = w.next()
        assert line.startswith("EXPIRED ") and "reset_policy=latest" in line and "relist=-" in line, line
        after = publish(base, owner, "after")
        assert w.obs(1) == [(after[0], "after", False)]
        assert w.proc.poll() is None
    finally:
        stop_server(proc)


def test_a_failing_proxy_is_down_not_fatal(tmp_path: Path, watchers: list[Watcher]) -> None:
    base, proc = start_server(tmp_path)
    proxy = HoldAcks(base)
    proxy.hold_acks = False
    proxy.bad_gateway.set()
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        owner, sid, reader = setup_feed(base)
        seqs = publish(base, owner, "behind-a-proxy")
        w = Watcher(sid, "--token", reader, "--base", proxy.url, "--wait", "2")
        watchers.append(w)
        assert w.next() == "DOWN HTTP 502"
        proxy.bad_gateway.clear()
        assert w.next() == f"UP {proxy.url}/mp/v0"
        assert w.obs(1) == [(seqs[0], "behind-a-proxy", False)]
        assert w.proc.poll() is None
    finally:
        proxy.shutdown()
        stop_server(proc)


def test_watch_goes_on_past_more_non_matching_rows_than_one_pull_examines(
    tmp_path: Path, watchers: list[Watcher]
) -> None:
    """A filtered feed behind more noise than a bounded pull examines (SCAN_BUDGET): the watch still prints
    the observation that follows, though it never acks an empty page."""
    from monitor_protocol.core.vocab import SCAN_BUDGET

    base, proc = start_server(tmp_path)
    try:
        with Client(base) as c:
            owner = c.create_monitor("ci", types=[TYPE, "com.example.noise"]).owner_token
            sub = c.subscribe("ci", "agent:watcher", token=owner, filter={"types": [TYPE]})
        calls = [
            {"jsonrpc": "2.0", "id": i, "method": "monitors/publish",
             "params": {"id": "ci", "type": "com.example.noise", "token": owner}}
            for i in range(100)
        ]  # fmt: skip
        with httpx.Client(base_url=base + "/mp/v0") as raw:
            for _ in range(SCAN_BUDGET // 100 + 3):
                assert raw.post("/rpc", json=calls).status_code == 200
        (needle,) = publish(base, owner, "needle")
        w = Watcher(sub.subscription.id, "--token", sub.token, "--base", base, "--wait", "5")
        watchers.append(w)
        assert w.obs(1) == [(needle, "needle", False)]
        wait_committed(base, sub.subscription.id, sub.token, needle + 1)
    finally:
        stop_server(proc)


def test_manual_ack_watch_reads_on_past_a_bounded_empty_page(tmp_path: Path, watchers: list[Watcher]) -> None:
    """--manual-ack reads ahead by read-only replays: behind more non-matching rows than a bounded pull
    examines, it still prints what follows, and commits nothing itself."""
    from monitor_protocol.core.vocab import SCAN_BUDGET

    base, proc = start_server(tmp_path)
    try:
        with Client(base) as c:
            owner = c.create_monitor("ci", types=[TYPE, "com.example.noise"]).owner_token
            sub = c.subscribe("ci", "agent:watcher", token=owner, filter={"types": [TYPE]})
        (first,) = publish(base, owner, "first")
        calls = [
            {"jsonrpc": "2.0", "id": i, "method": "monitors/publish",
             "params": {"id": "ci", "type": "com.example.noise", "token": owner}}
            for i in range(100)
        ]  # fmt: skip
        w = Watcher(sub.subscription.id, "--token", sub.token, "--base", base, "--wait", "2", "--manual-ack")
        watchers.append(w)
        assert w.obs(1) == [(first, "first", False)]
        assert w.next() == f"NEXT {first + 1}"
        with httpx.Client(base_url=base + "/mp/v0") as raw:
            for _ in range(SCAN_BUDGET // 100 + 3):
                assert raw.post("/rpc", json=calls).status_code == 200
        (needle,) = publish(base, owner, "needle")
        assert w.obs_between_nexts(1) == [(needle, "needle", False)]
        assert committed(base, sub.subscription.id, sub.token) == 0  # manual: the watch acks nothing
    finally:
        stop_server(proc)


def test_catch_up_with_the_server_down_at_start_says_up_before_its_frame(
    tmp_path: Path, watchers: list[Watcher]
) -> None:
    """DOWN, then UP, then CATCHUP: the lines in the order things happened (CATCHUP came before UP)."""
    base, proc = start_server(tmp_path)
    port = base.rsplit(":", 1)[1]
    try:
        owner, sid, reader = setup_feed(base)
        publish(base, owner, "waiting")
        stop_server(proc)
        w = Watcher(sid, "--token", reader, "--base", base, "--catch-up", "--wait", "2")
        watchers.append(w)
        assert w.next().startswith("DOWN ")
        _, proc = start_server(tmp_path, "--port", port)
        assert w.next() == f"UP {base}/mp/v0"
        assert w.next().startswith("CATCHUP 1 ")
    finally:
        stop_server(proc)


def test_manual_ack_marking_after_a_down_reaches_only_what_was_printed() -> None:
    """After a DOWN the watch prints again from the committed cursor; a seq printed twice is counted once,
    so the pull that marks what a replay printed never reaches a row not printed yet (that row would come
    first flagged redelivered). The engine in process behind a client that fails once."""
    import argparse

    from monitor_protocol.cli.watch import Watch, _Out
    from monitor_protocol.client import ConnectionFailed
    from monitor_protocol.client.results import PullResult
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.memory import MemoryStore

    service = MonitorService(MemoryStore())
    owner = service.create_monitor({"id": "mm", "types": ["com.example.x"]}, None)["owner_token"]
    sub = service.subscribe(
        {"monitor": "mm", "subscriber": "agent:r", "filter": {"types": ["com.example.x"]}}, owner
    )
    sid, rtok = sub["subscription"]["id"], sub["token"]

    def publish(subject: str) -> int:
        return service.publish("mm", {"type": "com.example.x", "subject": subject}, owner)["seq"]

    class Stop(Exception):
        pass

    before = {2: lambda: publish("b"), 6: lambda: publish("c"), 7: lambda: (publish("d"), publish("e"))}
    calls = {"n": 0}

    class Flaky:
        base = "in-process"

        def pull(
            self, _sid: str, wait: int = 0, cursor: Any = None, limit: Any = None, ack: Any = None
        ) -> Any:
            calls["n"] += 1
            if calls["n"] in before:
                before[calls["n"]]()
            if calls["n"] == 4:
                raise ConnectionFailed("down", sent=False)
            if calls["n"] == 20:
                raise Stop
            return PullResult.of(service.pull(_sid, rtok, cursor=cursor, limit=limit, ack=ack))

        def ack(self, *args: Any) -> None:
            pass

    printed: list[str] = []

    class Lines(_Out):
        def line(self, text: str) -> None:
            printed.append(text)

    publish("a")
    args = argparse.Namespace(
        subscription=sid, wait=0, limit=1, manual_ack=True, catch_up=False, once=False, reset_policy=None,
        format="text",
    )  # fmt: skip
    with pytest.raises(Stop):
        Watch(Flaky(), args, out=Lines("text"), sleep=lambda _s: None).run()
    seen: set[str] = set()
    for line in printed:
        if line.startswith("OBS "):
            subject = re.search(r" subject=(\S+)", line).group(1)
            flagged = "redelivered=true" in line
            assert flagged == (subject in seen), f"{subject}: {line}"  # flagged exactly when printed before
            seen.add(subject)
    assert {"a", "b", "c"} <= seen, printed


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a file every write to fails)")
def test_stdout_that_cannot_be_written_is_one_sentence_and_acknowledges_nothing(tmp_path: Path) -> None:
    """Found by a tester: `mp watch > /dev/full`, `mp pull > /dev/full` and `mp watch >&-` ended in tracebacks.
    Now one `error: OUTPUT:` line and status 1, and the watch acknowledged nothing it could not print.
    Control: the same watch with somewhere to print prints and acknowledges."""
    base, proc = start_server(tmp_path)
    try:
        owner, sid, reader = setup_feed(base)
        seqs = publish(base, owner, "a", "b")
        start = committed(base, sid, reader)
        watch = mp_command("watch", sid, "--token", reader, "--base", base, "--wait", "1", "--once")
        pull = mp_command("pull", sid, "--token", reader, "--base", base)
        for cmd, stdout in ((watch, "full"), (pull, "full"), (watch, "closed")):
            if stdout == "full":
                with open("/dev/full", "w") as full:
                    done = subprocess.run(
                        cmd, stdout=full, stderr=subprocess.PIPE, text=True, env=mp_env(), timeout=60
                    )
            else:  # started with descriptor 1 closed (`>&-`)
                done = subprocess.run(
                    ["sh", "-c", 'exec "$@" >&-', "sh", *cmd],
                    stderr=subprocess.PIPE,
                    text=True,
                    env=mp_env(),
                    timeout=60,
                )
            assert done.returncode == 1, (cmd, stdout, done.stderr)
            assert "Traceback" not in done.stderr and done.stderr.startswith("error: OUTPUT: "), done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
        assert committed(base, sid, reader) == start  # nothing acknowledged that was not printed
        ok = subprocess.run(watch, capture_output=True, text=True, env=mp_env(), timeout=60)
        assert ok.returncode == 0 and all(f"seq={s}" in ok.stdout or str(s) in ok.stdout for s in seqs), ok
        assert committed(base, sid, reader) == seqs[-1] + 1
    finally:
        stop_server(proc)


class _OtherJsonApi(BaseHTTPRequestHandler):
    """A JSON API that is not this protocol's: every request 200 {"hello": "world"}; counts them."""

    asked = 0

    def _answer(self) -> None:
        type(self).asked += 1
        body = b'{"hello": "world"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def test_a_base_url_answering_other_json_is_an_error_not_an_endless_loop(watchers: list[Watcher]) -> None:
    """Found by a tester: a --base that answered 200 with JSON that is not a pull's reply (another API, a
    gateway) was read as an empty page: mp watch asked again at once, ~1,150 times a second, printing
    nothing, forever (and --once exited 0). It says ERROR 200 UNEXPECTED_RESPONSE and exits 1, after one
    request. Control: the same watch against the real server follows (the other tests)."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), _OtherJsonApi)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{other.server_address[1]}"
        for extra in ((), ("--once",), ("--catch-up",)):
            _OtherJsonApi.asked = 0
            w = Watcher("sub-1234567890abcdef", "--token", "mpr_x", "--base", url, *extra)
            watchers.append(w)
            line = w.next()
            assert line.startswith("ERROR 200 UNEXPECTED_RESPONSE"), (extra, line)
            assert "hello" in line, line  # what the reply had, said
            assert w.proc.wait(timeout=15) == 1, extra
            assert _OtherJsonApi.asked <= 2, (extra, _OtherJsonApi.asked)
    finally:
        other.shutdown()
