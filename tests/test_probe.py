"""`mp probe` (docs/sources.md) with real processes: a real `mp serve`, a real `mp probe`, real commands, files and a
local HTTP server. A probe's lines go through the client with idempotency keys and a disk buffer, so neither a
server restart nor a probe restart loses or duplicates what the server confirmed."""

from __future__ import annotations

import os
import signal
import sys

from serverutil import running_server, start_server, stop_server
from sourcekit import RUN, Api, ProbeProcess, Target, alive, free_port, run_probe
from waiting import eventually

PY = sys.executable


def numbered(count: int, pause: float, pidfile: str | None = None) -> list[str]:
    """A long-lived command printing n=0 .. n=count-1, `pause` seconds apart, then waiting."""
    code = (
        "import os, sys, time\n"
        + (f"open({pidfile!r}, 'a').write(f'{{os.getpid()}}\\n')\n" if pidfile else "")
        + f"for i in range({count}):\n    print(f'n={{i}}', flush=True)\n    time.sleep({pause})\n"
        + "time.sleep(3600)"
    )
    return ["--", PY, "-u", "-c", code]


def test_probe_publishes_a_long_lived_commands_lines_in_order_with_the_probes_provenance(tmp_path):
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        owner = api.create("ci")
        probe = ProbeProcess(
            tmp_path,
            "--base",
            base,
            "--monitor",
            "ci",
            "--token",
            owner,
            "--state-dir",
            str(tmp_path / "st"),
            "--follow",
            *numbered(5, 0.01),
        )
        try:
            probe.wait_line("PUB", 5)
            rows = api.observations("ci", owner)
            assert [o["data"]["line"] for o in rows] == [f"n={i}" for i in range(5)]
            for o in rows:
                assert (o["actor"], o["origin"], o["tier"], o["verified"]) == (
                    "probe:ci",
                    "probe",
                    "measured",
                    "machine_verified",
                )
                assert o["data"]["provenance"]["source_ref"].startswith(PY)
            assert probe.lines()[0].startswith("PROBE monitor=ci kind=shell mode=follow")
            assert any(line.startswith("SOURCE start pid=") for line in probe.lines())
        finally:
            probe.stop()
            api.close()


def test_probe_survives_a_server_restart_without_losing_or_duplicating_lines(tmp_path):
    port = free_port()
    db = str(tmp_path / "probe.db")
    base, server = start_server(tmp_path, "--db", db, port=port)
    api = Api(base)
    owner = api.create("ci")
    api.close()
    total = 300
    probe = ProbeProcess(
        tmp_path,
        "--base",
        base,
        "--monitor",
        "ci",
        "--token",
        owner,
        "--state-dir",
        str(tmp_path / "st"),
        "--follow",
        *numbered(total, 0.02),
    )
    try:
        probe.wait_line("PUB", 40)
        server.send_signal(signal.SIGKILL)  # the server goes away mid-stream, without a word
        server.wait()
        probe.wait_line("DOWN")
        spool = tmp_path / "st" / "spool.jsonl"
        eventually(lambda: len(spool.read_text().splitlines()) >= 20, what="lines kept on disk while down")
        base, server = start_server(tmp_path, "--db", db, port=port)
        probe.wait_line("UP")
        api = Api(base)
        rows = eventually(
            lambda: len(o := api.observations("ci", owner)) >= total and o, timeout=60, what="all lines"
        )
        assert [o["data"]["line"] for o in rows] == [f"n={i}" for i in range(total)], (
            "lost, duplicated or reordered"
        )
        api.close()
    finally:
        probe.stop()
        stop_server(server)


def test_a_probe_killed_and_restarted_duplicates_nothing_the_server_confirmed(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("")
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        owner = api.create("app")
        args = (
            "--base",
            base,
            "--monitor",
            "app",
            "--token",
            owner,
            "--state-dir",
            str(tmp_path / "st"),
            "--file",
            str(log),
        )
        probe = ProbeProcess(tmp_path, *args, name="first")
        probe.wait_line("SOURCE start")
        with open(log, "a") as f:
            for i in range(200):
                f.write(f"n={i}\n")
        probe.wait_line("PUB", 50)
        probe.stop(signal.SIGKILL)  # wherever it was: spooled, sent, confirmed or not
        with open(log, "a") as f:
            for i in range(200, 250):
                f.write(f"n={i}\n")
        again = ProbeProcess(tmp_path, *args, name="second")
        try:
            rows = eventually(
                lambda: len(o := api.observations("app", owner)) >= 250 and o, what="every line"
            )
            assert [o["data"]["line"] for o in rows] == [f"n={i}" for i in range(250)]
        finally:
            again.stop()
            api.close()


def test_probe_once_from_cron_reads_a_file_rotated_between_two_runs_to_its_end(tmp_path):
    """`--once` from cron with logrotate between two runs: the lines appended to the old file after the last
    run are read from where it moved (app.log.1), then the new file; when the old file is gone, a SOURCE gap
    line says what may be missing."""
    log = tmp_path / "app.log"
    log.write_text("")
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        owner = api.create("app")
        args = ("--base", base, "--monitor", "app", "--token", owner, "--state-dir", str(tmp_path / "st"))
        once = (*args, "--once", "--file", str(log))
        assert run_probe(*once).returncode == 0  # the first run starts at the end
        append_line(log, "z1")
        assert run_probe(*once).returncode == 0
        append_line(log, "z2")
        os.rename(log, tmp_path / "app.log.1")
        append_line(log, "z3")
        done = run_probe(*once)
        assert done.returncode == 0 and "SOURCE gap" not in done.stdout, done
        lines = [o["data"]["line"] for o in api.observations("app", owner)]
        assert lines == ["z1", "z2", "z3"], lines
        append_line(log, "z4")
        os.rename(log, tmp_path / "elsewhere.log")  # moved where nobody looks: its z4 is not found
        append_line(log, "z5")
        done = run_probe(*once)
        assert (
            done.returncode == 0
            and "SOURCE gap reason=" in done.stdout
            and "may%20be%20missing" in done.stdout
        ), done
        assert [o["data"]["line"] for o in api.observations("app", owner)][-1] == "z5"
        api.close()


def append_line(path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def test_probe_once_keeps_what_an_unreachable_server_did_not_confirm_and_sends_it_next_time(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    state = str(tmp_path / "st")
    cmd = ("--every", "60", "--type", RUN, "--", PY, "-c", "print('build 412 failed')")
    done = run_probe(
        "--base", base, "--monitor", "ci", "--token", "mpo_x", "--state-dir", state, "--once", *cmd
    )
    assert done.returncode == 6, done
    assert any(line.startswith("DOWN ") for line in done.stdout.splitlines())
    assert any(line.startswith("KEPT 1 ") for line in done.stdout.splitlines())
    with running_server(tmp_path, "--port", str(port)) as (base, _proc):
        api = Api(base)
        owner = api.create("ci")
        args = ("--base", base, "--monitor", "ci", "--token", owner, "--state-dir", state, "--once", *cmd)
        done = run_probe(*args)
        assert done.returncode == 0, done
        rows = api.observations("ci", owner)
        assert [o["data"]["output"] for o in rows] == [
            "build 412 failed\n"
        ] * 2  # the kept one, then this run's
        assert "KEPT" not in done.stdout
        # a third run publishes once more: nothing kept twice
        assert run_probe(*args).returncode == 0
        assert len(api.observations("ci", owner)) == 3
        api.close()


def test_probe_once_runs_a_command_without_a_cadence_and_without_once_names_its_own_flags(tmp_path):
    """`mp probe --once -- CMD` from cron: one run, its output one observation, with no period to give (it
    was refused, naming the definition's cadence keys). Without `--once` the refusal names the probe's flags."""
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        owner = api.create("ci")
        args = ("--base", base, "--monitor", "ci", "--token", owner, "--state-dir", str(tmp_path / "st"))
        cmd = ("--type", RUN, "--", PY, "-c", "print('build 413 passed')")
        refused = run_probe(*args, *cmd)
        assert refused.returncode == 3, refused
        said = refused.stderr
        assert "--every SECONDS" in said and "--schedule CRON" in said and "--follow" in said, said
        assert "--once" in said and "cadence.heartbeat_seconds" not in said, said
        assert api.observations("ci", owner) == []
        done = run_probe(*args, "--once", *cmd)
        assert done.returncode == 0 and "kind=shell" in done.stdout, done
        assert [o["data"]["output"] for o in api.observations("ci", owner)] == ["build 413 passed\n"]
        # control: a cadence given still runs as before, once
        assert run_probe(*args, "--once", "--every", "60", *cmd).returncode == 0
        assert len(api.observations("ci", owner)) == 2
        api.close()


def test_probe_publishes_an_http_500_and_a_command_that_cannot_start_as_not_answering(tmp_path):
    target = Target(status=500)
    try:
        with running_server(tmp_path) as (base, _proc):
            api = Api(base)
            # the first run: the source as the monitor defines it, nothing on the command line
            owner = api.create("health", source={"kind": "http", "ref": target.url})
            common = ("--base", base, "--monitor", "health", "--token", owner, "--once")
            common += ("--state-dir", str(tmp_path / "st"))
            done = run_probe(*common)
            assert done.returncode == 0 and "kind=http" in done.stdout, done
            target.status, target.body = 200, b'{"status": "up"}'
            assert (
                run_probe(*common, "--http", target.url, "--pick", "/status").returncode == 0
            )  # positive control
            assert run_probe(*common, "--every", "60", "--", "/nonexistent/cmd").returncode == 0
            rows = [
                {k: v for k, v in o["data"].items() if k in ("answered", "reason", "status", "value")}
                for o in api.observations("health", owner)
            ]
            assert rows[0] == {"answered": False, "reason": "HTTP 500", "status": 500}
            assert rows[1] == {"answered": True, "status": 200, "value": "up"}
            assert rows[2]["answered"] is False and "cannot start" in rows[2]["reason"]
            assert api.state("health", owner)["source"]["answering"] is False
            api.close()
    finally:
        target.close()


def test_probe_refuses_a_source_it_cannot_run_and_a_wrong_token(tmp_path):
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        owner = api.create(
            "bare", types=[], visibility="public"
        )  # seen by anyone: the publish is what refuses
        common = ("--base", base, "--monitor", "bare", "--state-dir", str(tmp_path / "st"), "--once")
        done = run_probe(*common, "--token", owner, "--every", "60", "--", "echo", "hi")
        assert done.returncode == 3 and "ERROR REFUSED" in done.stdout and "what type" in done.stderr
        nothing = run_probe(*common, "--token", owner)  # a log monitor, and no source on the command line
        assert nothing.returncode == 3 and "defines no source" in nothing.stderr
        elsewhere = ("--base", base, "--monitor", "bare", "--state-dir", str(tmp_path / "wrong"), "--once")
        wrong = run_probe(
            *elsewhere, "--token", "mpo_wrong", "--every", "60", "--type", RUN, "--", "echo", "hi"
        )
        assert wrong.returncode == 4 and "ERROR 401 UNAUTHORIZED" in wrong.stdout
        # a private monitor is not found with another token (the server does not say it exists): the probe
        # says that the token may be what is wrong
        api.create("hidden", visibility="private")
        hidden = ("--base", base, "--monitor", "hidden", "--state-dir", str(tmp_path / "hid"), "--once")
        lost = run_probe(*hidden, "--token", "mpo_wrong", "--every", "60", "--", "echo", "hi")
        assert lost.returncode == 5 and "ERROR 404 NOT_FOUND" in lost.stdout, lost
        assert "is its owner token" in lost.stderr, lost.stderr
        # positive control: the same probe with a type and the owner token runs
        ok = run_probe(*common, "--token", owner, "--every", "60", "--type", RUN, "--", "echo", "hi")
        assert ok.returncode == 0, ok
        assert [o["data"]["output"] for o in api.observations("bare", owner, RUN)] == ["hi\n"]
        api.close()


def test_probe_stops_the_source_while_paused_starts_it_on_resume_and_exits_on_retire(tmp_path):
    pids = tmp_path / "pids"
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        owner = api.create("ci")
        probe = ProbeProcess(
            tmp_path,
            "--base",
            base,
            "--monitor",
            "ci",
            "--token",
            owner,
            "--state-dir",
            str(tmp_path / "st"),
            "--follow",
            *numbered(100000, 0.2, str(pids)),
        )
        try:
            probe.wait_line("PUB", 2)
            first = int(pids.read_text().split()[0])
            api.configure("ci", owner, "pause", {"reason": "maintenance"})
            probe.wait_line("PAUSED")
            eventually(lambda: not alive(first), what="the command stopped while paused")
            published = len(api.observations("ci", owner))
            api.configure("ci", owner, "resume", {"reason": "back"})
            probe.wait_line("RESUMED")
            second = int(eventually(lambda: len(p := pids.read_text().split()) == 2 and p[1]))
            eventually(lambda: len(api.observations("ci", owner)) > published, what="lines after the resume")
            assert alive(second)
            # What the paused monitor refused (and logged) was kept and published after the resume: the first
            # run's lines are all there, in order, before the second run's.
            lines = [o["data"]["line"] for o in api.observations("ci", owner)]
            again = lines.index("n=0", 1)
            assert lines[:again] == [f"n={i}" for i in range(again)]
            refused = [o for o in api.log("ci", owner) if o["type"] == "ai.mentu.monitor.rejected"]
            assert refused and refused[0]["data"]["payload"]["code"] == "UNAVAILABLE"
            # retired: the probe says so, stops its source and exits 0
            api.configure("ci", owner, "retire", {"reason": "done"})
            probe.wait_line("RETIRED")
            assert probe.proc.wait(timeout=30) == 0
            eventually(lambda: not alive(second), what="the command stopped on retire")
        finally:
            probe.stop()
            api.close()


def test_a_full_buffer_drops_counts_and_a_later_run_says_how_many_were_lost(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    state = str(tmp_path / "st")
    six = ("--follow", "--type", RUN, "--", PY, "-c", "for i in range(6): print(f'n={i}')")
    done = run_probe(
        "--base",
        base,
        "--monitor",
        "ci",
        "--token",
        "mpo_x",
        "--state-dir",
        state,
        "--once",
        "--buffer",
        "3",
        *six,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 6, done
    assert any(line.startswith("DROPPED ") and "max=3" in line for line in lines), done.stdout
    assert any(line.startswith("KEPT 3 dropped=3 ") for line in lines), done.stdout
    with running_server(tmp_path, "--port", str(port)) as (base, _proc):
        api = Api(base)
        owner = api.create("ci")
        args = ("--base", base, "--monitor", "ci", "--token", owner, "--state-dir", state, "--once")
        one = ("--follow", "--type", RUN, "--", PY, "-c", "print('later')")
        again = run_probe(*args, *one)  # a buffer with room: the kept three, the note, this run's line
        assert again.returncode == 0, again
        rows = [o["data"] for o in api.observations("ci", owner)]
        assert [r.get("line") for r in rows] == ["n=0", "n=1", "n=2", None, "later"], rows
        note = rows[3]
        assert (
            note["answered"] is False
            and note["dropped"] == 3
            and "3 observations were not kept" in note["reason"]
        )
        # positive control: a buffer with room drops nothing, so a third run says nothing of losses
        assert run_probe(*args, *one).returncode == 0
        later = [o["data"] for o in api.observations("ci", owner)][len(rows) :]
        assert [r.get("line") for r in later] == ["later"]
        api.close()


def test_mp_builds_its_parser_without_the_modules_pyodide_lacks():
    """`mp` runs in the docs' worker on Pyodide, which has no fcntl: building the parser (which imports every
    command's module, probe's included) must not need it; probe imports it only when it runs."""
    import subprocess

    blocked = "import sys\nsys.modules['fcntl'] = None\n"
    # positive control: the block works (an import of fcntl fails in that interpreter)
    control = subprocess.run([PY, "-c", blocked + "import fcntl"], capture_output=True, text=True, timeout=60)
    assert control.returncode != 0 and "fcntl" in control.stderr
    code = (
        blocked
        + "from monitor_protocol.cli import build_parser\nbuild_parser().parse_args(['probe', '--help'])"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--monitor" in done.stdout, done.stderr


def test_a_probe_refused_the_state_directory_leaves_the_buffer_there_untouched(tmp_path):
    """mp probe takes the state directory's lock before it opens the buffer (which rewrites a torn last line):
    a second probe on the same directory changes nothing there."""
    import fcntl

    state = tmp_path / "st"
    state.mkdir()
    spool = state / "spool.jsonl"
    spool.write_bytes(b'{"idempotency_key":"k0"}\n{"idempotency_key": "tor')  # a torn last line
    base = f"http://127.0.0.1:{free_port()}"  # nothing listens: the probe keeps what it sees and exits 6
    cmd = ("--base", base, "--monitor", "ci", "--token", "mpo_x", "--state-dir", str(state), "--once")
    cmd += ("--every", "60", "--type", RUN, "--", PY, "-c", "print(1)")
    with open(state / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another probe holds the directory
        done = run_probe(*cmd)
        assert done.returncode == 2 and "another probe uses" in done.stderr, done
        assert spool.read_bytes().endswith(b'"tor')  # untouched
    # positive control: with the lock free, opening the buffer drops the torn line
    done = run_probe(*cmd)
    assert done.returncode == 6, done
    assert b'"tor' not in spool.read_bytes() and b'"k0"' in spool.read_bytes()


def test_probe_without_a_token_names_every_place_it_reads_one(tmp_path, monkeypatch, capsys):
    from monitor_protocol.cli import client_cmds, main

    monkeypatch.delenv("MP_OWNER_TOKEN", raising=False)
    monkeypatch.delenv("MP_TOKEN", raising=False)
    args = [
        "probe",
        "--base",
        "http://127.0.0.1:9",
        "--monitor",
        "ci",
        "--state-dir",
        str(tmp_path),
        "--once",
    ]
    args += ["--every", "60", "--", "echo", "hi"]
    assert main(args) == client_cmds.EXIT_UNAUTHORIZED
    assert "--token, or env MP_OWNER_TOKEN (else MP_TOKEN)" in capsys.readouterr().err
    # control: MP_TOKEN is read; the unreachable server is what stops this run (exit 6, DOWN)
    monkeypatch.setenv("MP_TOKEN", "mpo_from_env")
    assert main(args) == 6
    assert capsys.readouterr().out.startswith("DOWN ")
