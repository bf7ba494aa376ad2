"""The I/O pieces of sources that watch, on real files and real streams: a file followed across rotation and
truncation with idempotency keys that never repeat for a new line and always repeat for the same one; a
long-lived command's output split into bounded lines; `mp probe`'s disk buffer surviving a kill between
any two writes."""

from __future__ import annotations

import ast
import asyncio
import os

import pytest
from monitor_protocol.core.sources import SourceRefused
from monitor_protocol.core.vocab import MAX_SOURCE_OUTPUT_BYTES
from monitor_protocol.doors.sources import processes
from monitor_protocol.doors.sources.spool import Spool
from monitor_protocol.doors.sources.tail import FileTail

pytestmark = pytest.mark.quick


def append(path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def raws(poll) -> list[str]:
    return [line.raw.decode() for line in poll.lines]


def read_then_stop(path, text: str) -> list:
    """A tail of a new empty file at `path` that reads `text` appended to it, then stops: the lines read
    (each with the checkpoint a restart resumes from)."""
    path.write_text("")
    tail = FileTail(str(path))
    tail.poll()
    append(path, text)
    lines = tail.poll().lines
    tail.close()
    return lines


def test_a_file_is_followed_from_its_end_and_only_complete_lines_count(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("old line\n")
    tail = FileTail(str(path))
    first = tail.poll()
    assert first.lines == [] and first.opened is not None and first.opened["offset"] == 9
    append(path, "one\ntw")
    assert raws(tail.poll()) == ["one"]  # "tw" waits for its newline
    append(path, "o\r\nthree\n")
    assert raws(tail.poll()) == ["two", "three"]
    # positive control: from_start reads what was there too
    assert raws(FileTail(str(path), from_start=True).poll()) == ["old line", "one", "two", "three"]


def test_rotation_reads_the_old_file_to_its_end_then_follows_the_new_one(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("")
    tail = FileTail(str(path))
    tail.poll()
    append(path, "a1\na2 without newline")
    os.rename(path, tmp_path / "app.log.1")  # logrotate: the old file moves away ...
    path.write_text("b1\n")  # ... and a new one takes its name
    poll = tail.poll()
    assert raws(poll) == ["a1", "a2 without newline", "b1"]
    keys = [line.key for line in poll.lines]
    assert len(set(keys)) == 3 and keys[2].split(":")[1] != keys[0].split(":")[1]  # a new file, new keys


def test_truncation_is_followed_from_the_start_with_new_keys(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("")
    tail = FileTail(str(path))
    tail.poll()
    append(path, "first\n")
    before = tail.poll().lines[0]
    with open(path, "w") as f:  # copytruncate: the same file, cut short, written again
        f.write("again\n")
    after = tail.poll().lines[0]
    assert after.raw == b"again" and after.key != before.key  # same offset 0, never mistaken for the old


def test_a_restart_resumes_at_the_checkpoint_with_the_same_keys(tmp_path):
    path = tmp_path / "app.log"
    lines = read_then_stop(path, "l1\nl2\nl3\n")
    # The server committed l1 only (its checkpoint), then died: l2 and l3 come again with the same keys,
    # so what had landed is a repeat; nothing new is skipped.
    again = FileTail(str(path), lines[0].checkpoint).poll()
    assert [(x.raw, x.key) for x in again.lines] == [(x.raw, x.key) for x in lines[1:]]
    # a checkpoint of another file (rotated while down) starts the new one from its start
    os.rename(path, tmp_path / "old.log")
    path.write_text("n1\n")
    fresh = FileTail(str(path), lines[-1].checkpoint).poll()
    assert raws(fresh) == ["n1"] and fresh.lines[0].key != lines[0].key
    assert fresh.gap is not None and "may be missing" in fresh.gap  # old.log is not beside it by name


def test_a_rotation_while_nothing_followed_reads_the_old_file_to_its_end_first(tmp_path):
    """logrotate while the probe was stopped (or between two `--once` runs): the lines appended to the old
    file after the checkpoint are read from where it moved, then the new file from its start."""
    path = tmp_path / "app.log"
    read = read_then_stop(path, "y1\ny2\n")  # stopped, its checkpoint after y2
    append(path, "y3\ny4 without newline")
    os.rename(path, tmp_path / "app.log.1")
    path.write_text("z1\n")
    resumed = FileTail(str(path), read[-1].checkpoint)
    poll = resumed.poll()
    assert raws(poll) == ["y3", "y4 without newline", "z1"] and poll.gap is None
    old_token = read[0].key.split(":")[1]
    assert [x.key.split(":")[1] for x in poll.lines] == [
        old_token,
        old_token,
        poll.lines[2].key.split(":")[1],
    ]
    assert poll.lines[2].key.split(":")[1] != old_token  # the new file: keys of its own
    # the same restart again from the same checkpoint sends the same keys (nothing landed twice as new)
    again = FileTail(str(path), read[-1].checkpoint).poll()
    assert [x.key for x in again.lines[:2]] == [x.key for x in poll.lines[:2]]


def test_a_rotated_file_that_is_gone_or_rewritten_is_said_to_be_a_gap(tmp_path):
    def stopped_after_a1(name: str) -> tuple:
        path = tmp_path / name
        checkpoint = read_then_stop(path, "a1\n")[-1].checkpoint
        append(path, "a2\n")  # not read: the tail is stopped
        os.rename(path, tmp_path / f"{name}.1")
        path.write_text("b1\n")
        return path, checkpoint

    path, checkpoint = stopped_after_a1("kept.log")
    assert raws(FileTail(str(path), checkpoint).poll()) == ["a2", "b1"]  # positive control: found, read
    path, checkpoint = stopped_after_a1("gone.log")
    os.unlink(tmp_path / "gone.log.1")  # compressed or deleted
    poll = FileTail(str(path), checkpoint).poll()
    assert raws(poll) == ["b1"] and "after byte 3" in poll.gap and "may be missing" in poll.gap
    path, checkpoint = stopped_after_a1("cut.log")
    with open(tmp_path / "cut.log.1", "r+") as f:  # the same inode, its bytes before the offset rewritten
        f.write("X")
    poll = FileTail(str(path), checkpoint).poll()
    assert raws(poll) == ["b1"] and poll.gap is not None


def test_a_long_line_is_cut_and_says_its_size_and_a_missing_file_is_a_problem(tmp_path):
    path = tmp_path / "app.log"
    tail = FileTail(str(path))
    assert "cannot open" in tail.poll().problem  # not there yet
    path.write_text("x" * (MAX_SOURCE_OUTPUT_BYTES + 100) + "\nshort\n")
    poll = tail.poll()
    assert [len(x.raw) for x in poll.lines] == [MAX_SOURCE_OUTPUT_BYTES, 5]  # appeared later: from its start
    assert poll.lines[0].total == MAX_SOURCE_OUTPUT_BYTES + 100


def test_the_operators_policy_is_judged_at_every_open(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("")
    allowed = {str(path)}
    tail = FileTail(str(path), check=lambda p: None if os.path.realpath(p) in allowed else f"{p} not allowed")
    assert tail.poll().problem is None  # positive control
    os.unlink(path)
    os.symlink("/etc/hostname", path)  # a rotation swaps a link in
    allowed.add(str(path))  # even when the name is allowed, what it opens is judged
    with pytest.raises(SourceRefused, match="not allowed"):
        tail.poll()


async def test_a_commands_output_is_split_into_bounded_lines():
    reader = asyncio.StreamReader()
    reader.feed_data(b"a\nb" + b"y" * (MAX_SOURCE_OUTPUT_BYTES * 2) + b"\nc\nlast")
    reader.feed_eof()
    got = [(line.raw[:3], len(line.raw), line.total) async for line in processes.lines(reader)]
    assert got == [
        (b"a", 1, 1),
        (b"byy", MAX_SOURCE_OUTPUT_BYTES, MAX_SOURCE_OUTPUT_BYTES * 2 + 1),
        (b"c", 1, 1),
        (b"las", 4, 4),
    ]


async def test_a_periodic_run_is_bounded_in_time_and_output():
    env = processes.environment()
    ok = await processes.run_once(("sh", "-c", "echo out; echo err >&2; exit 3"), env, 10)
    assert (ok.exit, ok.stdout, ok.stderr) == (3, b"out\n", b"err\n")
    slow = await processes.run_once(("sleep", "30"), env, 1)
    assert slow.exit is None and "timed out after 1 s" in slow.failure
    missing = await processes.run_once(("/nonexistent/cmd",), env, 5)
    assert missing.exit is None and "cannot start" in missing.failure


def test_the_probes_buffer_keeps_what_was_not_confirmed_across_a_kill(tmp_path):
    spool = Spool(tmp_path, max_entries=5)
    assert spool.append([{"idempotency_key": f"k{i}"} for i in range(7)]) == 5 and spool.dropped == 2
    spool.confirm(2)
    spool.save_checkpoint({"offset": 42})
    spool.file.write(b'{"idempotency_key": "torn"')  # killed in the middle of a write
    spool.file.flush()
    spool.close()
    again = Spool(tmp_path, max_entries=5)
    assert [b["idempotency_key"] for b in again.head(10)] == ["k2", "k3", "k4"]
    assert again.load_checkpoint() == {"offset": 42}
    assert again.dropped == 2  # the count of what was not kept survives the kill too
    assert again.note_dropped(lambda lost: {"idempotency_key": "note", "dropped": lost}) == 2
    assert again.dropped == 0 and again.head(10)[-1] == {"idempotency_key": "note", "dropped": 2}
    assert again.note_dropped(lambda lost: {}) == 0  # said once
    again.confirm(1)
    again.append([{"idempotency_key": "k5"}])
    again.confirm(4)
    assert len(again) == 0 and (tmp_path / "spool.jsonl").stat().st_size == 0  # emptied when all confirmed
    again.close()
    assert Spool(tmp_path).head(10) == []


# ======================================================================================== the security review
CHILD_FDS = (
    "import os\nfound = []\nfor fd in range(3, 4096):\n    try:\n        os.fstat(fd)\n"
    "        found.append(fd)\n    except OSError:\n        pass\nprint(found)"
)  # fstat, not a listing of /proc/self/fd, which would open a descriptor of its own


def test_a_source_child_inherits_no_descriptor_but_its_pipes_even_under_uvloop():
    import socket
    import sys

    import uvloop

    # A listening socket left inheritable, as mp serve's once was: uvloop's subprocess ignores close_fds.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.set_inheritable(True)

    async def fds_seen(spawned: bool) -> list[int]:
        argv = (sys.executable, "-c", CHILD_FDS)
        if spawned:
            proc = await processes.spawn(argv, processes.environment())
        else:  # positive control: the loop's own subprocess, close_fds=True, no preexec of ours
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, close_fds=True)
        out, _ = await proc.communicate()
        return ast.literal_eval(out.decode())  # the list of descriptors the child printed

    async def cannot_start() -> str | None:
        run = await processes.run_once(("/nonexistent/cmd",), processes.environment(), 5)
        return run.failure

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(fds_seen(True)) == []  # only 0, 1 and 2
        assert listener.fileno() in loop.run_until_complete(fds_seen(False))  # the leak the fix closes
        # exec failures are still reported (the error pipe stays open until exec)
        assert "cannot start" in loop.run_until_complete(cannot_start())
    finally:
        loop.close()
        listener.close()
    assert asyncio.run(fds_seen(True)) == []  # and under asyncio's own loop


def test_mp_serves_listening_socket_is_not_inheritable_even_by_uvloops_children():
    import sys

    import uvloop
    from monitor_protocol.doors.http.server import bind

    listener = bind("127.0.0.1", 0)  # as mp serve binds its port

    async def fds_seen() -> list[int]:
        argv = (sys.executable, "-c", CHILD_FDS)
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, close_fds=True)
        out, _ = await proc.communicate()
        return ast.literal_eval(out.decode())

    loop = uvloop.new_event_loop()
    try:
        assert not listener.get_inheritable()
        assert listener.fileno() not in loop.run_until_complete(fds_seen())
        listener.set_inheritable(True)  # positive control: what bind() used to do, and the child holds it
        assert listener.fileno() in loop.run_until_complete(fds_seen())
    finally:
        loop.close()
        listener.close()


def test_a_poll_returns_at_most_100_lines_and_the_next_resumes_after_the_last(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("")
    tail = FileTail(str(path))
    tail.poll()
    append(path, "".join(f"{i}\n" for i in range(250)) + "\n" * 1000)
    first = tail.poll()
    assert raws(first) == [str(i) for i in range(100)] and first.more
    assert first.lines[-1].checkpoint["offset"] == tail.offset  # where the next poll starts
    second = tail.poll()
    assert raws(second) == [str(i) for i in range(100, 200)] and second.more
    seen = raws(second)
    while (poll := tail.poll()).lines:
        assert len(poll.lines) <= 100
        seen += raws(poll)
    assert seen[-1000:] == [""] * 1000 and len(seen) == 1150 and not poll.more
    # positive control: a restart from the last line's checkpoint sends the same keys, nothing skipped
    again = FileTail(str(path), first.lines[-1].checkpoint)
    assert raws(again.poll()) == [str(i) for i in range(100, 200)]


def test_a_rotated_file_with_more_unread_than_one_poll_is_read_to_its_end_first(tmp_path):
    path = tmp_path / "app.log"
    path.write_text("")
    tail = FileTail(str(path), max_lines=10)
    tail.poll()
    append(path, "".join(f"old {i}\n" for i in range(35)))
    os.rename(path, tmp_path / "app.log.1")
    path.write_text("new 0\nnew 1\n")
    seen: list[str] = []
    while (poll := tail.poll()).lines:
        assert len(poll.lines) <= 10
        seen += raws(poll)
    # every line of the old file, then the new one's: none lost to the switch
    assert seen == [f"old {i}" for i in range(35)] + ["new 0", "new 1"]


def test_the_probes_spool_is_compacted_once_its_confirmed_head_passes_a_threshold(tmp_path, monkeypatch):
    from monitor_protocol.doors.sources import spool as spool_module

    monkeypatch.setattr(spool_module, "COMPACT_BYTES", 4096)
    spool = Spool(tmp_path, max_entries=1000)
    body = {"idempotency_key": "k", "data": {"line": "x" * 100}}
    sizes = []
    for i in range(200):  # one entry always in flight: never empty, so never simply truncated
        spool.append([{**body, "idempotency_key": f"k{i}"}])
        if i:
            spool.confirm(1)
        sizes.append((tmp_path / "spool.jsonl").stat().st_size)
    assert max(sizes) < 4096 + 2000 and len(spool) == 1
    spool.close()
    assert [b["idempotency_key"] for b in Spool(tmp_path).head(5)] == ["k199"]  # what is left survives
    # positive control: without compaction the same traffic grows the file past the threshold
    monkeypatch.setattr(spool_module, "COMPACT_BYTES", 1 << 30)
    grown = Spool(tmp_path / "grown", max_entries=1000)
    for i in range(200):
        grown.append([{**body, "idempotency_key": f"k{i}"}])
        if i:
            grown.confirm(1)
    assert (tmp_path / "grown" / "spool.jsonl").stat().st_size > 20000
    grown.close()


def test_a_left_behind_group_is_killed_only_when_it_is_this_boots_session():
    import signal
    import subprocess

    led = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a command's group, left behind
    plain = subprocess.Popen(["sleep", "300"])  # a process in someone else's group and session
    try:
        assert processes.kill_leftover({"group": led.pid, "boot": "another boot"}) == 0
        assert processes.kill_leftover({"group": plain.pid, "boot": processes.boot_id()}) == 0
        assert led.poll() is None and plain.poll() is None  # neither touched
        # positive control: the group of this boot's session is killed
        assert processes.kill_leftover({"group": led.pid, "boot": processes.boot_id()}) == 1
        assert led.wait(timeout=10) == -signal.SIGKILL
    finally:
        for proc in (led, plain):
            proc.kill()
            proc.wait()


class RecordingSink:
    """Where a Runner's output goes, kept in memory: each publish answers the next outcome given."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.sent: list[tuple[dict, dict | None]] = []
        self.rows: list[str] = []

    async def publish(self, body: dict, checkpoint: dict | None) -> str:
        self.sent.append((body, checkpoint))
        return self.outcomes.pop(0)

    async def checkpoint(self, checkpoint: dict) -> None:
        pass

    async def event(self, action: str, payload: dict) -> None:
        self.rows.append(action)


async def test_over_budget_waits_for_the_next_day_and_sends_the_same_observation_again(monkeypatch):
    from monitor_protocol.core import sources
    from monitor_protocol.doors.sources import runner as runner_module

    monkeypatch.setattr(runner_module, "_next_utc_day", lambda now: now)  # the next UTC day comes at once
    plan = sources.plan_of(
        {"id": "ci", "source": {"kind": "file", "ref": "/srv/app.log"}, "types": ["com.example.ci.run"]}
    )
    body = sources.line_body(plan, b"line", "f:t:0")
    refused_once = RecordingSink([runner_module.OVER_BUDGET, runner_module.PUBLISHED])
    outcome = await runner_module.Runner(plan, refused_once).emit(body, {"offset": 5})
    # the same observation with the same checkpoint, sent again after the wait: nothing dropped
    assert outcome == runner_module.PUBLISHED
    assert refused_once.sent == [(body, {"offset": 5})] * 2 and refused_once.rows == ["throttled"]
    # positive control: a publish that is taken is sent once, and nothing waits
    taken = RecordingSink([runner_module.PUBLISHED])
    assert await runner_module.Runner(plan, taken).emit(body, None) == runner_module.PUBLISHED
    assert len(taken.sent) == 1 and taken.rows == []


def test_two_rotations_while_nothing_followed_say_the_middle_file_was_not_read(tmp_path):
    """app.log -> app.log.1 -> app.log.2 while stopped: the file the checkpoint names (now app.log.2) is read
    to its end, then the new file; the middle one (app.log.1) is not known to be read, so a gap says so."""
    path = tmp_path / "app.log"
    checkpoint = read_then_stop(path, "a1\n")[-1].checkpoint
    append(path, "a2\n")
    os.rename(path, tmp_path / "app.log.1")
    os.utime(tmp_path / "app.log.1", ns=(10**18, 10**18))  # last written long ago (mtime: when it stopped)
    path.write_text("b1\n")
    os.rename(tmp_path / "app.log.1", tmp_path / "app.log.2")  # the second rotation
    os.rename(path, tmp_path / "app.log.1")
    path.write_text("c1\n")
    poll = FileTail(str(path), checkpoint).poll()
    assert raws(poll) == ["a2", "c1"]
    assert poll.gap is not None and "app.log.1" in poll.gap and "more than once" in poll.gap
