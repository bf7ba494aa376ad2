"""The I/O pieces of sources that watch, on real files and real streams: a file followed across rotation and
truncation with idempotency keys that never repeat for a new line and always repeat for the same one; a
long-lived command's output split into bounded lines; `mp probe`'s disk buffer surviving a kill between
any two writes."""

from __future__ import annotations

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
    path.write_text("")
    tail = FileTail(str(path))
    tail.poll()
    append(path, "l1\nl2\nl3\n")
    lines = tail.poll().lines
    tail.close()
    # The server committed l1 only (its checkpoint), then died: l2 and l3 come again with the same keys,
    # so what had landed is a repeat; nothing new is skipped.
    again = FileTail(str(path), lines[0].checkpoint).poll()
    assert [(x.raw, x.key) for x in again.lines] == [(x.raw, x.key) for x in lines[1:]]
    # a checkpoint of another file (rotated while down) starts the new one from its start
    os.rename(path, tmp_path / "old.log")
    path.write_text("n1\n")
    fresh = FileTail(str(path), lines[-1].checkpoint).poll()
    assert raws(fresh) == ["n1"] and fresh.lines[0].key != lines[0].key


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
