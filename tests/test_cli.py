"""The `mp` command line as a tool: --version, `python -m monitor_protocol`, exit statuses by kind of
failure, errors as JSON under --json, --data from a file or stdin, and a quiet exit on a closed pipe."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_protocol import __version__
from monitor_protocol.cli import client_cmds
from monitor_protocol.client import Client
from serverutil import mp_command, mp_env, running_server

TYPE = "com.example.ci.run"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("cli")) as (url, _proc):
        yield url


def mp(
    base: str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = mp_env()
    full.update(env or {})
    full["MP_BASE"] = base
    return subprocess.run(
        mp_command(*args), input=stdin, capture_output=True, text=True, env=full, timeout=60
    )


def monitor(base: str, mid: str, **fields: object) -> str:
    with Client(base) as c:
        return c.create_monitor(mid, types=[TYPE], **fields).owner_token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- entry points


def test_version_and_python_dash_m() -> None:
    env = mp_env()
    shown = subprocess.run(mp_command("--version"), capture_output=True, text=True, env=env)
    assert shown.returncode == 0 and shown.stdout.strip() == f"mp {__version__}"
    as_module = [sys.executable, "-m", "monitor_protocol"]
    same = subprocess.run([*as_module, "--version"], capture_output=True, text=True, env=env)
    assert same.returncode == 0 and same.stdout == shown.stdout
    helped = subprocess.run([*as_module, "publish", "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: mp publish")
    bare = subprocess.run(as_module, capture_output=True, text=True, env=env)
    assert bare.returncode == 2 and "usage: mp" in bare.stdout


def test_help_documents_every_exit_status() -> None:
    shown = subprocess.run(mp_command("--help"), capture_output=True, text=True, env=mp_env())
    assert shown.returncode == 0
    table = dict(re.findall(r"^  (\d+) +(\S.*)$", shown.stdout, re.M))
    expected = {
        client_cmds.EXIT_OK: "success",
        client_cmds.EXIT_USAGE: "usage",
        client_cmds.EXIT_REFUSED: "refused by the server",
        client_cmds.EXIT_UNAUTHORIZED: "UNAUTHORIZED (401)",
        client_cmds.EXIT_NOT_FOUND: "NOT_FOUND (404)",
        client_cmds.EXIT_UNREACHABLE: "server unreachable",
        client_cmds.EXIT_PIPE: "stdout was closed early",
    }
    assert tuple(sorted(expected)[:6]) == (0, 2, 3, 4, 5, 6)
    for status, words in expected.items():
        assert table[str(status)].startswith(words), (status, table)
    assert '"code": "UNREACHABLE"' in shown.stdout


# ---------------------------------------------------------------------------------------------- exit statuses


def test_exit_status_by_kind_of_failure(base: str) -> None:
    owner = monitor(base, "codes", capabilities=["observe", "act"], visibility="public")
    env = {"MP_OWNER_TOKEN": owner}
    assert mp(base, "publish", "codes", TYPE, "--subject", "job", env=env).returncode == 0

    missing = mp(base, "state", "no-such-monitor")
    assert missing.returncode == 5 and missing.stderr.startswith("error: NOT_FOUND: ")
    unauthorized = mp(base, "publish", "codes", TYPE, "--token", "wrong")
    assert unauthorized.returncode == 4 and unauthorized.stderr.startswith("error: UNAUTHORIZED: ")
    assert "no token was given" not in unauthorized.stderr  # control: a token was given, a wrong one
    # No token at all for a call no server answers without one: refused here, nothing sent (a request
    # sent would have been a 401, exit 4; against no server at all, exit 6)
    for where in (base, "http://127.0.0.1:9"):
        none = mp(where, "publish", "codes", TYPE, env={"MP_OWNER_TOKEN": "", "MP_TOKEN": ""})
        assert none.returncode == 2, (none.returncode, none.stderr)
        assert none.stderr == (
            "error: no token was given: pass it with --token or env MP_OWNER_TOKEN or env MP_TOKEN "
            "(nothing was sent)\n"
        ), none.stderr
    negative = mp(base, "ack", "sub-00000000", "-5", "--token", "t")
    assert negative.returncode == 2 and "a cursor is a whole number 0..2^53, not '-5'" in negative.stderr
    refused = mp(base, "publish", "codes", TYPE, "--tier", "golden", env=env)
    assert refused.returncode == 3 and refused.stderr.startswith("error: UNKNOWN_VOCABULARY: ")

    with Client(base, owner) as c:
        a = c.subscribe("codes", "agent:a", capabilities=["observe", "act"])
        b = c.subscribe("codes", "agent:b", capabilities=["observe", "act"])
    assert mp(base, "lease", "claim", a.subscription.id, "job", "--token", a.token).returncode == 0
    held = mp(base, "lease", "claim", b.subscription.id, "job", "--token", b.token)
    assert held.returncode == 3 and held.stderr.startswith("error: LEASE_HELD: ")
    assert mp(base, "subscribe", "codes", "--subscriber", "agent:a", "--token", "nope").returncode == 4
    retire = ["--token", b.token]
    assert mp(base, "pull", b.subscription.id, *retire).returncode == 0
    with Client(base, b.token) as c:
        c.retire_subscription(b.subscription.id, "done")
    retired = mp(base, "pull", b.subscription.id, *retire)
    assert retired.returncode == 5 and retired.stderr.startswith("error: NOT_FOUND: ")

    down = mp(f"http://127.0.0.1:{free_port()}", "monitors", "list")
    assert down.returncode == 6 and down.stderr.startswith("error: UNREACHABLE: ")
    assert "never sent" in down.stderr and down.stdout == ""

    for usage in (
        ["publish", "codes", TYPE, "--tag", "no-equals-sign"],
        ["publish", "codes", TYPE, "--data", "[1, 2]"],
        ["publish", "codes", TYPE, "--data", "{not json"],
        ["publish", "codes", TYPE, "--data", '{"n": NaN}'],  # JSON's grammar has no NaN nor Infinity,
        ["publish", "codes", TYPE, "--data", '{"n": -Infinity}'],
        ["publish", "codes", TYPE, "--data", '{"n": 1e999}'],  # nor a number that is infinite as a float
        ["publish", "codes", TYPE, "--retries", "-1"],
        ["ack", a.subscription.id, "three"],
        ["pull", a.subscription.id, "--limit", "0"],  # the protocol's bounds, checked before sending
        ["pull", a.subscription.id, "--wait", "51"],
        ["pull", a.subscription.id, "--wait", "-1"],
        ["no-such-command"],
    ):
        bad = mp(base, *usage, env=env)
        assert bad.returncode == 2, (usage, bad.stderr)
        assert "Traceback" not in bad.stderr


def test_json_errors_go_to_stdout_as_json(base: str) -> None:
    missing = mp(base, "state", "nowhere", "--json")
    assert missing.returncode == 5 and missing.stderr.startswith("error: NOT_FOUND: ")
    body = json.loads(missing.stdout)
    assert body["code"] == "NOT_FOUND" and body["error"] and body["done"] == []

    down = mp(f"http://127.0.0.1:{free_port()}", "publish", "x", TYPE, "--json", "--token", "t")
    assert down.returncode == 6 and down.stderr.startswith("error: UNREACHABLE: ")
    net = json.loads(down.stdout)
    assert net["code"] == "UNREACHABLE" and net["sent"] is False
    assert net["url"].endswith("/mp/v0/monitors/x/observations") and "never sent" in net["error"]

    ok = mp(base, "monitors", "list", "--json")
    assert ok.returncode == 0 and isinstance(json.loads(ok.stdout), list) and ok.stderr == ""


def test_a_refusal_that_points_to_a_list_prints_the_list(base: str) -> None:
    """ "use one of known_types" named a field the CLI printed only with --json: the lists a refusal carries
    (known_types, known_keys, ...) are printed under its sentence."""
    owner = monitor(base, "cli-known")
    bad = mp(base, "subscribe", "cli-known", "--subscriber", "agent:r", "--filter", '{"types": ["com.nope.x"]}',
             "--token", owner)  # fmt: skip
    assert bad.returncode != 0 and "INVALID_FILTER" in bad.stderr
    assert f"error: known_types: {TYPE}" in bad.stderr, bad.stderr
    ok = mp(base, "subscribe", "cli-known", "--subscriber", "agent:r", "--filter", json.dumps({"types": [TYPE]}),
            "--token", owner)  # fmt: skip
    assert ok.returncode == 0 and "known_" not in ok.stderr  # positive control


# ---------------------------------------------------------------------------------------------- --data


def test_publish_data_from_a_file_and_from_stdin(base: str, tmp_path: Path) -> None:
    owner = monitor(base, "datafile")
    env = {"MP_OWNER_TOKEN": owner}
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"status": "failed", "note": "from a file ✓"}))
    from_file = mp(base, "publish", "datafile", TYPE, "--data", f"@{path}", "--json", env=env)
    assert from_file.returncode == 0, from_file.stderr
    data = json.loads(from_file.stdout)["observation"]["data"]
    assert data["status"] == "failed" and data["note"] == "from a file ✓"

    piped = mp(
        base, "publish", "datafile", TYPE, "--data", "-", "--json", stdin='{"status": "piped"}', env=env
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["observation"]["data"]["status"] == "piped"

    gone = mp(base, "publish", "datafile", TYPE, "--data", f"@{tmp_path / 'missing.json'}", env=env)
    assert gone.returncode == 2 and "cannot read" in gone.stderr
    not_object = mp(base, "publish", "datafile", TYPE, "--data", "-", stdin="[1]", env=env)
    assert not_object.returncode == 2 and "JSON object" in not_object.stderr


def test_publish_idempotency_key_and_retries(base: str) -> None:
    owner = monitor(base, "idemcli")
    env = {"MP_OWNER_TOKEN": owner}
    first = mp(base, "publish", "idemcli", TYPE, "--idempotency-key", "k-1", "--retries", "2", env=env)
    again = mp(base, "publish", "idemcli", TYPE, "--idempotency-key", "k-1", env=env)
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    assert first.stdout.split()[1] == again.stdout.split()[1]  # the same seq=
    assert "nothing appended" in again.stdout and "nothing appended" not in first.stdout


# ---------------------------------------------------------------------------------------------- closed pipe


def run_into_closed_pipe(base: str, *args: str) -> tuple[int, str]:
    """Run mp with stdout a pipe whose reading end is already closed: every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = mp_env()
    env["MP_BASE"] = base
    try:
        proc = subprocess.Popen(
            mp_command(*args), stdout=write_end, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_a_closed_stdout_exits_quietly(base: str) -> None:
    monitor(base, "piped-1", visibility="public")
    for args in (["monitors", "list"], ["monitors", "list", "--json"], ["state", "piped-1"]):
        status, err = run_into_closed_pipe(base, *args)
        assert err == "", (args, err)  # no traceback, no "Exception ignored in ... BrokenPipeError"
        assert status == client_cmds.EXIT_PIPE, (args, status)
    for args in (["--help"], ["--version"]):  # argparse drops its own failed write: quiet, status 0
        status, err = run_into_closed_pipe(base, *args)
        assert err == "" and status in (0, client_cmds.EXIT_PIPE), (args, status, err)


def test_monitors_list_into_head_with_many_monitors(base: str) -> None:
    with Client(base) as c:
        for i in range(120):
            c.create_monitor(f"many-{i:03d}", types=[TYPE], visibility="public", description="x" * 200)
    env = mp_env()
    env["MP_BASE"] = base
    cmd = " ".join(mp_command("monitors", "list", "--json"))
    # --json: more than a pipe buffer (64 KiB), so mp is still writing when head exits
    ran = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd} | head -1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ran.stdout == "[\n" and ran.stderr == ""
    assert ran.returncode == client_cmds.EXIT_PIPE  # as for any tool stopped by SIGPIPE, with pipefail
    human = " ".join(mp_command("monitors", "list"))
    ran = subprocess.run(
        ["bash", "-c", f"{human} | head -1"], capture_output=True, text=True, env=env, timeout=60
    )
    assert ran.returncode == 0 and ran.stderr == "" and len(ran.stdout.splitlines()) == 1


def test_pull_and_json_output_are_ascii_lines_under_any_stdout_encoding(base: str) -> None:
    """`mp pull` prints the watch's own OBS lines and `--json` prints ASCII JSON: no crash on an ASCII
    stdout, and one line per observation under Python's splitlines()."""
    owner = monitor(base, "asciipull")
    hostile = ["café", "cr\rOBS seq=999 tier=src origin=human", "tab\tnul\x00", "ls\u2028ps\u2029nel\x85"]
    with Client(base) as c:
        for subject in hostile:
            c.publish(
                "asciipull", TYPE, subject=subject, data={"note": subject, "blob": "é" * 600}, token=owner
            )
        sub = c.subscribe("asciipull", "agent:p", token=owner, filter={"types": [TYPE]})
    ascii_env = {"PYTHONIOENCODING": "ascii", "LANG": "C", "LC_ALL": "C", "MP_READER_TOKEN": sub.token}
    pulled = mp(base, "pull", sub.subscription.id, "--limit", "10", env=ascii_env)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.isascii()
    lines = pulled.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["OBS"] * len(hostile) + ["NEXT"], lines
    assert all(len(line.encode()) <= 4096 for line in lines)
    as_json = mp(base, "monitors", "get", "caf\u00e9", "--json", env=ascii_env)
    assert as_json.returncode == 5 and json.loads(as_json.stdout)["code"] == "NOT_FOUND"


def test_an_ack_past_the_head_says_it_was_clamped(base: str) -> None:
    owner = monitor(base, "cli-clamp")
    with Client(base) as c:
        c.publish("cli-clamp", TYPE, token=owner)
        sub = c.subscribe("cli-clamp", "agent:clamp", token=owner)
    sid, reader = sub.subscription.id, sub.token
    exact = mp(base, "ack", sid, "2", "--token", reader)  # control: an ack within the log says nothing more
    assert exact.returncode == 0 and "clamped" not in exact.stdout, exact.stdout
    past = mp(base, "ack", sid, "999", "--token", reader)
    assert past.returncode == 0, past.stderr
    cursor = int(re.search(r"cursor=(\d+)", past.stdout).group(1))  # type: ignore[union-attr]
    head_now = int(re.search(r"head=(\d+)", past.stdout).group(1))  # type: ignore[union-attr]
    assert cursor == head_now + 1 and "(asked 999: past the head, clamped to head + 1)" in past.stdout


def test_an_empty_monitor_list_says_why_on_stderr(tmp_path: Path) -> None:
    with running_server(tmp_path) as (url, _proc):
        empty = mp(url, "monitors", "list")
        assert empty.returncode == 0 and empty.stdout == ""
        assert "no monitors: this server shows public monitors (no token was given)" in empty.stderr
        monitor(url, "cli-public", visibility="public")
        listed = mp(url, "monitors", "list")  # control: something to list, nothing said on stderr
        assert listed.stdout.startswith("cli-public\t") and "no monitors" not in listed.stderr


def test_serve_on_a_taken_port_says_it_did_not_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            mp_command("serve", "--db", str(tmp_path / "t.db"), "--port", port),
            capture_output=True,
            text=True,
            env=mp_env(),
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "did not start, database closed" in done.stderr and "stopped" not in done.stderr
