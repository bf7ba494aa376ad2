"""`mp serve --sources` (docs/protocol.md section 12, docs/sources.md) with real processes: a real server, real
commands, a real local HTTP server and real files. Each refusal beside its positive control."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from serverutil import bearer, running_server, start_server, stop_server
from sourcekit import RUN, Api, Target, alive
from waiting import eventually

PY = sys.executable
ALLOW_PY = f"shell:{PY}"
# Registration is open in these tests (monitors are unattested): the operator says shell and file sources may
# run for them all the same. test_an_unattested_monitors_command_never_runs_* shows the rule without it.
OPEN = "--allow-unattested-sources"


def follow(code: str, **settings) -> dict:
    """A long-lived python command (the argv list form: no quoting, no shell)."""
    return {
        "cadence": {"event_driven": True},
        "source": {"kind": "shell", "settings": {"argv": [PY, "-u", "-c", code], **settings}},
    }


def every(seconds: float, code: str, **settings) -> dict:
    return {
        "cadence": {"heartbeat_seconds": seconds},
        "source": {"kind": "shell", "settings": {"argv": [PY, "-c", code], **settings}},
    }


def status_of(api: Api, monitor: str, owner: str) -> dict:
    return api.state(monitor, owner)["source"]


def test_a_long_lived_sources_lines_arrive_in_order_one_observation_each(tmp_path):
    code = "import time\nfor i in range(5): print(f'line {i}')\ntime.sleep(3600)"
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        owner = api.create("ci", **follow(code))
        rows = eventually(lambda: len(o := api.observations("ci", owner)) >= 5 and o, what="five lines")
        assert [o["data"]["line"] for o in rows] == [f"line {i}" for i in range(5)]
        for o in rows:
            assert (o["actor"], o["origin"], o["tier"], o["verified"]) == (
                "probe:ci",
                "probe",
                "measured",
                "machine_verified",
            )
            assert o["data"]["answered"] is True
            assert o["data"]["provenance"]["source_ref"].startswith(PY)
        start = api.supervision("ci", owner)[0]
        assert start["action"] == "start" and start["pid"] > 0 and start["run_by"] == "server"
        source = status_of(api, "ci", owner)
        assert (source["status"], source["answering"]) == ("running", True)
        assert api.state("ci", owner)["ages"]["since_last_source_contact_s"] is not None
        api.close()
    # A stop is a row too, and a restarted server starts its sources again (a row, a new run).
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        rows = eventually(
            lambda: len(o := api.observations("ci", owner)) >= 10 and o, what="the second run's lines"
        )
        assert [o["data"]["line"] for o in rows] == [f"line {i}" for i in range(5)] * 2
        actions = [(p["action"], p.get("reason")) for p in api.supervision("ci", owner)]
        assert actions[:3] == [("start", None), ("stop", "the server stopped"), ("start", None)]
        api.close()


def test_a_periodic_source_runs_once_per_period_and_on_change_suppresses_repeats(tmp_path):
    runs = {name: tmp_path / f"{name}.runs" for name in ("changing", "steady")}
    code = "import sys\nopen(sys.argv[1], 'a').write('x\\n')\nprint('same output')"
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        plain = every(1, code)
        plain["source"]["settings"]["argv"].append(str(runs["changing"]))
        steady = every(1, code, on_change=True)
        steady["source"]["settings"]["argv"].append(str(runs["steady"]))
        owners = {"changing": api.create("changing", **plain), "steady": api.create("steady", **steady)}
        for name in runs:
            eventually(
                lambda n=name: runs[n].exists() and len(runs[n].read_text().splitlines()) >= 3,
                what=f"3 runs of {name}",
            )
        # positive control: without on_change every run is one observation ...
        published = eventually(lambda: len(o := api.observations("changing", owners["changing"])) >= 3 and o)
        for o in published:
            own = {k: v for k, v in o["data"].items() if k not in ("tags", "provenance")}
            assert own == {"answered": True, "exit": 0, "ms": own["ms"], "output": "same output\n"}
        # ... once per period: never two runs within the same second (the heartbeat is 1 s)
        times = [
            time.mktime(time.strptime(o["time"][:19], "%Y-%m-%dT%H:%M:%S")) + float(o["time"][19:23])
            for o in published
        ]
        assert all(b - a >= 0.9 for a, b in zip(times, times[1:], strict=False)), times
        # ... and with on_change the same output is published once, however often it ran
        assert len(api.observations("steady", owners["steady"])) == 1
        api.close()


def test_a_command_that_cannot_start_and_an_http_500_are_published_as_not_answering(tmp_path):
    target = Target(status=200, body=b'{"checks": {"db": "up"}}')
    try:
        args = ("--sources", OPEN, "--allow-source", "shell:/nonexistent/*", "--allow-sink", "127.0.0.1")
        with running_server(tmp_path, *args) as (base, _proc):
            api = Api(base)
            gone = api.create(
                "gone",
                cadence={"event_driven": True},
                source={"kind": "shell", "ref": "/nonexistent/cmd --x"},
            )
            silent = eventually(lambda: api.observations("gone", gone))[0]
            assert silent["data"]["answered"] is False and "cannot start" in silent["data"]["reason"]
            crash = eventually(lambda: [p for p in api.supervision("gone", gone) if p["action"] == "crash"])[
                0
            ]
            assert crash["backoff_seconds"] == 1
            assert api.state("gone", gone)["ages"]["since_last_source_contact_s"] is None  # never a contact

            owner = api.create(
                "health",
                ttl_seconds=2,
                cadence={"heartbeat_seconds": 1},
                source={"kind": "http", "ref": target.url, "settings": {"pick": "/checks/db"}},
            )
            # positive control: a 200 is an answer, with status, time, size and the picked value
            answer = eventually(lambda: api.observations("health", owner))[0]
            assert answer["data"]["answered"] is True and answer["data"]["status"] == 200
            assert answer["data"]["value"] == "up" and answer["data"]["bytes"] == len(target.body)
            target.status = 500
            down = eventually(
                lambda: [o for o in api.observations("health", owner) if not o["data"]["answered"]]
            )[0]
            assert down["data"]["reason"] == "HTTP 500" and down["data"]["status"] == 500
            # the source is quiet while 500s keep coming: stale_source appears although rows keep arriving
            st = eventually(
                lambda: "stale_source" in (s := api.state("health", owner))["confidence"]["gaps"] and s
            )
            assert st["source"]["answering"] is False and st["ages"]["since_last_observation_s"] <= 2
            target.status = 200
            eventually(
                lambda: "stale_source" not in api.state("health", owner)["confidence"]["gaps"],
                what="fresh again",
            )
            api.close()
    finally:
        target.close()


def test_a_crashed_long_lived_process_is_restarted_with_backoff_and_said_not_to_answer(tmp_path):
    code = "import sys\nprint('up', flush=True)\nsys.exit(3)"
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        owner = api.create("flaky", **follow(code))
        # positive control: an exit status settings.ok_exit lists is an answer, yet the process is restarted
        fine = api.create("fine", **follow(code, ok_exit=[3]))
        actions = eventually(
            lambda: (
                (a := [p for p in api.supervision("flaky", owner) if p["action"] in ("crash", "restart")])[2:]
                and a
            ),
            what="crash, restart, crash",
        )
        assert [p["action"] for p in actions[:3]] == ["crash", "restart", "crash"]
        assert (actions[0]["exit"], actions[0]["backoff_seconds"], actions[0]["lines"]) == (3, 1, 1)
        assert actions[2]["backoff_seconds"] == 2  # doubling while it keeps failing
        assert actions[1]["pid"] > 0
        rows = [o["data"] for o in api.observations("flaky", owner)][:4]
        assert [r.get("line") for r in rows] == ["up", None, "up", None]
        assert rows[1]["answered"] is False and rows[1]["exit"] == 3
        assert rows[1]["reason"] == "the process exited with status 3"
        eventually(lambda: [p for p in api.supervision("fine", fine) if p["action"] == "restart"])
        assert all(o["data"]["answered"] for o in api.observations("fine", fine))
        api.close()


def test_kill_9_of_mp_serve_sources_loses_no_confirmed_line_and_duplicates_none(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "app.log"
    path.write_text("")
    pidfile = tmp_path / "child.pid"
    code = (
        "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nprint('up')\ntime.sleep(3600)"
    )
    db = tmp_path / "kill9.db"
    args = ("--db", str(db), "--sources", OPEN, "--allow-source", f"file:{logs}", "--allow-source", ALLOW_PY)
    base, proc = start_server(tmp_path, *args)
    api = Api(base)
    owner = api.create("app", source={"kind": "file", "ref": str(path)})
    child = follow(code)
    child["source"]["settings"]["argv"].append(str(pidfile))
    child_owner = api.create("child", **child)
    eventually(
        lambda: [p for p in api.supervision("app", owner) if p["action"] == "start"], what="the file followed"
    )
    written = 0
    stop = threading.Event()

    def writer() -> None:
        nonlocal written
        while not stop.is_set() and written < 400:
            with open(path, "a") as f:
                f.write(f"n={written}\n")
            written += 1
            time.sleep(0.005)  # paced: lines keep coming across the crash

    thread = threading.Thread(target=writer)
    thread.start()
    eventually(lambda: len(api.observations("app", owner)) >= 40, what="lines followed before the kill")
    pid = int(eventually(lambda: pidfile.exists() and pidfile.read_text()))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    api.close()
    eventually(lambda: not alive(pid), what="the killed server's child gone with it (no orphan watching)")
    thread.join()
    with open(path, "a") as f:
        f.write("after=1\n")
    base, proc = start_server(tmp_path, *args)
    try:
        api = Api(base)
        total = written + 1
        rows = eventually(
            lambda: len(o := api.observations("app", owner)) >= total and o,
            what="every line after the restart",
        )
        lines = [o["data"]["line"] for o in rows]
        assert lines == [f"n={i}" for i in range(written)] + ["after=1"], "lost, duplicated or out of order"
        eventually(
            lambda: pidfile.read_text() != str(pid) and alive(int(pidfile.read_text())), what="a new child"
        )
        restarted = [p for p in api.supervision("child", child_owner) if p["action"] == "start"]
        assert restarted[-1].get("after", "").startswith("the server stopped without stopping")
        api.close()
    finally:
        stop_server(proc)


def test_a_shell_source_outside_the_allow_list_never_runs_and_the_state_says_so(tmp_path):
    def marker(name: str) -> str:
        return str(tmp_path / name)

    with running_server(tmp_path, "--sources", OPEN, "--allow-source", "shell:touch") as (base, _proc):
        api = Api(base)
        once = {"cadence": {"heartbeat_seconds": 3600}}
        attempts = {
            "wrapped": {"kind": "shell", "ref": f"env touch {marker('wrapped')}"},
            "relative": {"kind": "shell", "ref": f"./touch {marker('relative')}"},
            "shelled": {"kind": "shell", "ref": f"touch {marker('shelled')}", "settings": {"shell": True}},
            "through-sh": {"kind": "shell", "ref": f"sh -c 'touch {marker('through-sh')}'"},
        }
        owners = {name: api.create(name, source=src, **once) for name, src in attempts.items()}
        # positive control: the allowed command runs
        allowed = api.create("allowed", source={"kind": "shell", "ref": f"touch {marker('allowed')}"}, **once)
        eventually(lambda: (tmp_path / "allowed").exists(), what="the allowed command run")
        assert status_of(api, "allowed", allowed)["status"] == "running"
        for name, owner in owners.items():
            source = eventually(
                lambda o=owner, n=name: (s := status_of(api, n, o))["status"] == "refused" and s
            )
            said = "relative path" if name == "relative" else "does not allow"
            # the caller is told why, never what the operator allows (the server's log says that)
            assert said in source["reason"] and "shell:touch" not in source["reason"], source
            assert [p["action"] for p in api.supervision(name, owner)] == ["refused"]
            assert not (tmp_path / name).exists()
        from serverutil import server_log

        assert "this server allows shell:touch" in server_log(_proc)
        api.close()
    # Without --sources nothing runs at all, and the state says it is not run here.
    with running_server(tmp_path, "--db", str(tmp_path / "plain.db")) as (base, _proc):
        api = Api(base)
        owner = api.create(
            "plain",
            source={"kind": "shell", "ref": f"touch {marker('plain')}"},
            cadence={"heartbeat_seconds": 1},
        )
        source = status_of(api, "plain", owner)
        assert source["status"] == "not_run" and "--sources" in source["reason"]
        assert api.supervision("plain", owner) == [] and not (tmp_path / "plain").exists()
        api.close()


def test_an_http_source_to_an_internal_address_is_refused(tmp_path):
    target = Target()
    try:
        with running_server(tmp_path, "--sources", "--allow-sink", "127.0.0.1") as (base, _proc):
            api = Api(base)
            port = target.url.split(":")[2].split("/")[0]
            refused = {
                "by-name": f"http://localhost:{port}/health",  # a loopback name: allowed only by name
                "private": "http://10.1.2.3/health",
                "spelled": f"http://0x7f.1:{port}/health",  # 127.0.0.1 spelled otherwise: allowed as the address
            }
            owners = {
                n: api.create(n, cadence={"heartbeat_seconds": 1}, source={"kind": "http", "ref": u})
                for n, u in refused.items()
            }
            # positive control: the address the operator allowed is fetched
            ok = api.create(
                "allowed", cadence={"heartbeat_seconds": 1}, source={"kind": "http", "ref": target.url}
            )
            eventually(lambda: api.observations("allowed", ok), what="the allowed URL fetched")
            for name in ("by-name", "private"):
                source = eventually(
                    lambda n=name: (s := status_of(api, n, owners[n]))["status"] == "refused" and s
                )
                assert "sink guard" in source["reason"]
                assert api.observations(name, owners[name]) == []
            eventually(
                lambda: api.observations("spelled", owners["spelled"]),
                what="127.1 in another spelling, allowed",
            )
            hits = target.hits
            assert hits >= 2
            api.close()
    finally:
        target.close()


def test_pause_stops_the_process_and_resume_starts_it(tmp_path):
    pids = tmp_path / "pids"
    code = "import os, sys, time\nopen(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\nprint('up')\ntime.sleep(3600)"
    src = follow(code)
    src["source"]["settings"]["argv"].append(str(pids))
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        owner = api.create("ci", **src)
        first = int(eventually(lambda: pids.exists() and pids.read_text().split()[0]))
        assert alive(first)
        api.configure("ci", owner, "pause", {"reason": "maintenance"})
        eventually(lambda: not alive(first), what="the process stopped on pause")
        stop = eventually(lambda: [p for p in api.supervision("ci", owner) if p["action"] == "stop"])[0]
        assert stop["reason"] == "the monitor was paused"
        assert status_of(api, "ci", owner)["status"] == "stopped"
        api.configure("ci", owner, "resume", {"reason": "back"})
        second = int(eventually(lambda: len(p := pids.read_text().split()) == 2 and p[1]))
        eventually(lambda: alive(second), what="a new process on resume")
        assert [p["action"] for p in api.supervision("ci", owner)] == ["start", "stop", "start"]
        assert status_of(api, "ci", owner)["status"] == "running"
        api.configure("ci", owner, "retire", {"reason": "done"})
        eventually(lambda: not alive(second), what="the process stopped on retire")
        api.close()


def test_a_servers_command_sees_a_minimal_environment_and_only_the_names_the_operator_lists(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("MP_ADMIN_TOKEN", "admin-secret-do-not-leak")
    monkeypatch.setenv("SOURCE_TEST_SECRET", "cloud-key-do-not-leak")
    monkeypatch.setenv("SOURCE_TEST_VISIBLE", "yes")
    names = ("MP_ADMIN_TOKEN", "SOURCE_TEST_SECRET", "SOURCE_TEST_VISIBLE")
    code = f"import json, os\nprint(json.dumps({{k: os.environ.get(k) for k in {names!r} + ('PATH',)}}))"
    args = ("--sources", OPEN, "--allow-source", ALLOW_PY, "--source-env", "SOURCE_TEST_VISIBLE")
    with running_server(tmp_path, *args) as (base, _proc):
        api = Api(base)
        owner = api.create("env", **every(3600, code))
        seen = eventually(lambda: api.observations("env", owner))[0]["data"]["value"]
        # the secret the operator did not list is not there; the one listed (the positive control) and PATH are
        assert seen["MP_ADMIN_TOKEN"] is None and seen["SOURCE_TEST_SECRET"] is None
        assert seen["SOURCE_TEST_VISIBLE"] == "yes" and seen["PATH"]
        api.close()


def test_huge_or_non_utf8_output_is_cut_and_says_so_and_the_rate_is_bounded(tmp_path):
    code = (
        "import sys, time\nout = sys.stdout.buffer\nout.write(b'ok \\xff\\xfe bytes\\n')\n"
        "out.write(b'x' * 100000 + b'\\n')\nout.write(b'fine\\n')\nout.flush()\ntime.sleep(3600)"
    )
    chatty = "import time\nfor i in range(10): print(i)\ntime.sleep(3600)"
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        owner = api.create("bytes", **follow(code))
        rows = eventually(lambda: len(o := api.observations("bytes", owner)) >= 3 and o)
        assert rows[0]["data"]["invalid_utf8"] is True and rows[0]["data"]["line"] == "ok \ufffd\ufffd bytes"
        assert rows[1]["data"]["cut"] is True and rows[1]["data"]["bytes"] == 100000
        assert len(rows[1]["data"]["line"]) == 16384
        assert set(rows[2]["data"]) == {"answered", "line", "tags", "provenance"}  # positive control
        limited = api.create("chatty", budget={"observations_per_minute": 3}, **follow(chatty))
        throttled = eventually(
            lambda: [p for p in api.supervision("chatty", limited) if p["action"] == "throttled"]
        )[0]
        assert throttled["per_minute"] == 3 and "waits" in throttled["reason"]
        assert [o["data"]["line"] for o in api.observations("chatty", limited)] == ["0", "1", "2"]
        api.close()


def test_a_feed_republishes_another_monitors_observations_as_derived(tmp_path):
    with running_server(tmp_path, "--sources") as (base, _proc):
        api = Api(base)
        builds = api.create("builds", visibility="public", types=[RUN, "com.example.ci.lint"])
        owner = api.create("failures", source={"kind": "feed", "ref": "builds"}, filter={"types": [RUN]})
        eventually(lambda: [p for p in api.supervision("failures", owner) if p["action"] == "start"])
        for body in (
            {"type": RUN, "subject": "b1", "data": {"status": "failed"}},
            {"type": "com.example.ci.lint", "subject": "l1"},
        ):
            r = api.http.post(
                "/monitors/builds/observations", json=body, headers={"authorization": f"Bearer {builds}"}
            )
            assert r.status_code == 201, r.text
        derived = eventually(lambda: api.observations("failures", owner))
        assert len(derived) == 1 and derived[0]["tier"] == "derived" and derived[0]["subject"] == "b1"
        origin = api.log("builds", builds)
        b1 = next(o for o in origin if o.get("subject") == "b1")
        assert derived[0]["data"]["provenance"]["wasDerivedFrom"] == [
            {"source": "monitor:builds", "id": b1["id"]}
        ]
        # a feed of a private monitor is refused, and says why
        api.create("secret")
        sneaky = api.create("sneaky", source={"kind": "feed", "ref": "secret"})
        source = eventually(lambda: (s := status_of(api, "sneaky", sneaky))["status"] == "refused" and s)
        assert "not public" in source["reason"]
        api.close()


@pytest.mark.parametrize("kind", ["ws", "cir", "formula"])
def test_unsupported_kinds_stay_defined_and_say_why(tmp_path, kind):
    with running_server(tmp_path, "--sources") as (base, _proc):
        api = Api(base)
        owner = api.create("unsupported", source={"kind": kind, "ref": "wss://example.com"})
        source = eventually(lambda: (s := status_of(api, "unsupported", owner))["status"] == "refused" and s)
        assert "not supported" in source["reason"]
        assert (
            api.http.get("/monitors/unsupported", headers={"authorization": f"Bearer {owner}"}).json()[
                "source"
            ]["kind"]
            == kind
        )
        api.close()


def test_mp_serve_refuses_an_unusable_allow_source_entry(tmp_path):
    import subprocess

    from serverutil import mp_command, mp_env

    for args, said in (
        (["--sources", OPEN, "--allow-source", "gh"], "shell:<glob"),
        (["--sources", OPEN, "--allow-source", "file:relative"], "absolute"),
        (["--sources", "--allow-source", "shell:gh"], "registration is open"),
        (["--sources", "--allow-source", f"file:{tmp_path}"], "--allow-unattested-sources"),
        (["--sources", OPEN, "--max-sources", "0"], "--max-sources"),
        (["--allow-source", "shell:gh"], "add --sources"),
        (["--sources", "--source-rate", "0"], "--source-rate"),
    ):
        done = subprocess.run(
            mp_command("serve", "--db", ":memory:", "--port", "0", *args),
            env=mp_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
    # positive control: usable entries start the server, and it says what it runs
    with running_server(
        tmp_path, "--sources", OPEN, "--allow-source", "shell:gh", "--allow-source", f"file:{tmp_path}"
    ) as (
        _base,
        proc,
    ):
        from serverutil import server_log

        assert (
            f"sources: run by this server (allowed: shell:gh, file:{tmp_path}, for any monitor"
            in server_log(proc)
        )
    # and with a registration token the same entries need no --allow-unattested-sources
    with running_server(
        tmp_path, "--sources", "--registration-token", "reg-token", "--allow-source", "shell:gh"
    ) as (_base, proc):
        from serverutil import server_log

        assert "for monitors made with the registration token" in server_log(proc)


def test_sources_run_on_a_shared_postgresql_store(tmp_path, pg_url):
    """On PostgreSQL the engine sits on a thread of its own (EngineThread): the same sources, through the same
    calls, with the configuration heard from that thread; the server holding the leader lock runs them."""
    pids = tmp_path / "pids"
    code = "import os, sys, time\nopen(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\nprint('up')\ntime.sleep(3600)"
    src = follow(code)
    src["source"]["settings"]["argv"].append(str(pids))
    with running_server(tmp_path, "--db", pg_url, "--sources", OPEN, "--allow-source", ALLOW_PY) as (
        base,
        _proc,
    ):
        api = Api(base)
        owner = api.create("ci", **src)
        assert eventually(lambda: api.observations("ci", owner))[0]["data"]["line"] == "up"
        first = int(pids.read_text().split()[0])
        api.configure("ci", owner, "pause", {"reason": "maintenance"})
        eventually(lambda: not alive(first), what="the process stopped on pause")
        assert status_of(api, "ci", owner)["status"] == "stopped"
        api.close()


# ======================================================================================== the security review
def test_an_unattested_monitors_command_never_runs_and_an_attested_ones_does(tmp_path):
    """Shell and file sources run only for monitors made with the registration token: one made while
    registration was open stays refused after the operator sets a token and allows the command."""
    db = str(tmp_path / "mp.db")
    marker = tmp_path / "anon-ran"
    code = "import sys\nopen(sys.argv[1], 'w').write('ran')\nprint('ran')"
    with running_server(tmp_path, "--db", db) as (base, _proc):
        api = Api(base)
        anon = every(3600, code)
        anon["source"]["settings"]["argv"].append(str(marker))
        anon_owner = api.create("anon", **anon)
        api.close()
    args = ("--db", db, "--registration-token", "reg-token", "--sources", "--allow-source", ALLOW_PY)
    with running_server(tmp_path, *args) as (base, _proc):
        api = Api(base)
        signed = every(3600, code)
        signed["source"]["settings"]["argv"].append(str(tmp_path / "signed-ran"))
        r = api.http.post(
            "/monitors", json={"id": "signed", "types": [RUN], **signed}, headers=bearer("reg-token")
        )
        assert r.status_code == 201 and r.json()["monitor"]["attested"] is True, r.text
        # positive control: the attested monitor's command runs
        eventually(lambda: (tmp_path / "signed-ran").exists(), what="the attested monitor's command run")
        source = eventually(lambda: (s := status_of(api, "anon", anon_owner))["status"] == "refused" and s)
        assert "registration token" in source["reason"] and not marker.exists()
        api.close()


def test_one_bad_definition_never_stops_the_others(tmp_path):
    """A file ref with a NUL character (which made realpath raise and ended the supervisor) and one too long
    for a checkpoint (every line vanished) are refused with a sentence; the next monitor's source runs."""
    logs = tmp_path / "logs"
    deep = logs
    while len(str(deep)) < 1200:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True)
    args = ("--sources", OPEN, "--allow-source", f"file:{logs}", "--allow-source", ALLOW_PY)
    with running_server(tmp_path, *args) as (base, _proc):
        api = Api(base)
        bad = {
            "nul": (f"{logs}/a\x00b.log", "NUL"),
            "long": (str(deep / "app.log"), "bytes long"),
        }
        owners = {m: api.create(m, source={"kind": "file", "ref": ref}) for m, (ref, _said) in bad.items()}
        for monitor, (_ref, said) in bad.items():
            source = eventually(
                lambda m=monitor: (s := status_of(api, m, owners[m]))["status"] == "refused" and s,
                what=f"{monitor} refused",
            )
            assert said in source["reason"], source
        # positive control: a source defined after them still runs (the supervisor lives on)
        good = api.create("good", **follow("import time\nprint('up')\ntime.sleep(3600)"))
        assert eventually(lambda: api.observations("good", good))[0]["data"]["line"] == "up"
        api.close()


LEAVES_A_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], {io})\n"
    "open(sys.argv[1], 'a').write(f'{{child.pid}}\\n')\n"
    "print('up', flush=True)\n"
    "{then}"
)


def child_pids(path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_what_a_source_started_dies_with_it_on_exit_and_on_pause(tmp_path):
    exits, paused = tmp_path / "exits.pids", tmp_path / "paused.pids"
    quiet = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    exiting = follow(LEAVES_A_CHILD.format(io=quiet, then="sys.exit(0)"), ok_exit=[0])
    exiting["source"]["settings"]["argv"].append(str(exits))
    staying = follow(LEAVES_A_CHILD.format(io=quiet, then="time.sleep(3600)"))
    staying["source"]["settings"]["argv"].append(str(paused))
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        owner = api.create("exits", **exiting)
        first = eventually(lambda: child_pids(exits), what="the first child's pid")[0]
        # the leader exited normally: the child it left in its group is killed with it
        eventually(lambda: not alive(first), what="the exited leader's child killed")
        owner2 = api.create("paused", **staying)
        child = eventually(lambda: child_pids(paused), what="the child's pid")[0]
        eventually(lambda: api.observations("paused", owner2), what="the leader's line")
        assert alive(child)  # positive control: while its source runs, the child lives
        api.configure("paused", owner2, "pause", {"reason": "maintenance"})
        eventually(lambda: not alive(child), what="the paused source's child killed")
        api.configure("exits", owner, "pause", {"reason": "done"})
        api.close()


def test_a_leader_that_exited_is_not_running_while_a_child_holds_its_pipe(tmp_path):
    pids = tmp_path / "held.pids"
    holding = follow(LEAVES_A_CHILD.format(io="", then="sys.exit(3)"))  # the child inherits stdout
    holding["source"]["settings"]["argv"].append(str(pids))
    with running_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY) as (base, _proc):
        api = Api(base)
        owner = api.create("held", **holding)
        crash = eventually(
            lambda: next((p for p in api.supervision("held", owner) if p["action"] == "crash"), None),
            what="the leader's exit seen as a crash",
        )
        assert crash["exit"] == 3 and crash["lines"] == 1
        silent = [o for o in api.observations("held", owner) if o["data"]["answered"] is False]
        assert silent and silent[0]["data"]["exit"] == 3
        eventually(lambda: not alive(child_pids(pids)[0]), what="the child holding the pipe killed")
        api.configure("held", owner, "pause", {"reason": "done"})
        api.close()


def test_the_operators_source_rate_is_a_ceiling_no_budget_raises(tmp_path):
    code = "import time\nfor i in range(20): print(i)\ntime.sleep(3600)"
    args = ("--sources", OPEN, "--allow-source", ALLOW_PY, "--source-rate", "5")
    with running_server(tmp_path, *args) as (base, _proc):
        api = Api(base)
        for monitor, budget, expected in (("high", 600, 5), ("low", 2, 2)):  # low: the positive control
            owner = api.create(monitor, budget={"observations_per_minute": budget}, **follow(code))
            throttled = eventually(
                lambda m=monitor, o=owner: next(
                    (p for p in api.supervision(m, o) if p["action"] == "throttled"), None
                ),
                what=f"{monitor} throttled",
            )
            assert throttled["per_minute"] == expected
            assert len(api.observations(monitor, owner)) == expected
            api.configure(monitor, owner, "pause", {"reason": "done"})
        api.close()


def test_feeds_of_each_other_are_refused_and_sigterm_stops_every_source(tmp_path):
    base, proc = start_server(tmp_path, "--sources", OPEN, "--allow-source", ALLOW_PY)
    try:
        api = Api(base)
        owners = {m: api.create(m, visibility="public") for m in ("fa", "fb")}
        for monitor, other in (
            ("fa", "fb"),
            ("fb", "fa"),
        ):  # both exist, then each becomes a feed of the other
            patch = {"source": {"kind": "feed", "ref": other}}
            api.configure(monitor, owners[monitor], "update", {"patch": patch, "reason": "test"})
        for monitor, owner in owners.items():
            source = eventually(
                lambda m=monitor, o=owner: (s := status_of(api, m, o))["status"] == "refused" and s
            )
            assert "itself a feed" in source["reason"]
        # positive control: a feed of a plain public monitor runs beside a long-lived process
        plain = api.create("plain", visibility="public")
        reader = api.create("reader", source={"kind": "feed", "ref": "plain"})
        runs = api.create("runs", **follow("import time\nprint('up')\ntime.sleep(3600)"))
        eventually(lambda: status_of(api, "reader", reader)["status"] == "running")
        eventually(lambda: api.observations("runs", runs), what="the process's line")
        for n in range(20):
            r = api.http.post("/monitors/plain/observations", json={"type": RUN, "subject": f"b{n}"},
                              headers=bearer(plain))  # fmt: skip
            assert r.status_code == 201, r.text
        api.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        # a bounded wait for the exit (the test's guard, not a timing claim): it used to hang for ever
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("mp serve --sources did not exit on SIGTERM") from None
    assert code == 0
    with running_server(tmp_path) as (base, _proc):
        api = Api(base)
        for monitor, owner in (("reader", reader), ("runs", runs)):
            assert [p["action"] for p in api.supervision(monitor, owner)][-1] == "stop"
        api.close()


def test_what_a_command_started_is_killed_when_the_server_restarts_after_a_kill_9(tmp_path):
    """A kill -9 of the server kills the command (PR_SET_PDEATHSIG) but cannot signal what the command
    started: the process group is named in the source's checkpoint, and the next start kills what is left."""
    pids = tmp_path / "left.pids"
    quiet = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    staying = follow(LEAVES_A_CHILD.format(io=quiet, then="time.sleep(3600)"))
    staying["source"]["settings"]["argv"].append(str(pids))
    args = ("--db", str(tmp_path / "left.db"), "--sources", OPEN, "--allow-source", ALLOW_PY)
    base, proc = start_server(tmp_path, *args)
    api = Api(base)
    owner = api.create("left", **staying)
    child = eventually(lambda: child_pids(pids), what="the child's pid")[0]
    eventually(lambda: api.observations("left", owner), what="the command's line")
    api.close()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    try:
        assert alive(child)  # positive control: the server's kill -9 alone leaves the child behind
        with running_server(tmp_path, *args) as (base, _proc):
            api = Api(base)
            eventually(lambda: not alive(child), what="the left-behind child killed at the restart")
            starts = eventually(
                lambda: [p for p in api.supervision("left", owner) if p["action"] == "start"][1:],
                what="a new start",
            )
            assert starts[0]["killed_left_behind"] == 1
            api.configure("left", owner, "pause", {"reason": "done"})
            api.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_max_sources_bounds_how_many_run_and_the_rest_say_why(tmp_path):
    target = Target()
    try:
        with running_server(tmp_path, "--sources", "--allow-sink", "127.0.0.1", "--max-sources", "2") as (
            base,
            _proc,
        ):
            api = Api(base)
            http = {"source": {"kind": "http", "ref": target.url}, "cadence": {"heartbeat_seconds": 3600}}
            owners = {m: api.create(m, **http) for m in ("h1", "h2", "h3")}

            def settled() -> dict | None:
                now = {m: status_of(api, m, o) for m, o in owners.items()}
                return None if any(s["status"] == "pending" for s in now.values()) else now

            statuses = eventually(settled, what="every source started or refused")
            # the positive control: two run; the third is refused and says why
            assert sorted(s["status"] for s in statuses.values()) == ["refused", "running", "running"]
            refused = next(s for s in statuses.values() if s["status"] == "refused")
            assert "already runs 2 sources" in refused["reason"]
            api.close()
    finally:
        target.close()
