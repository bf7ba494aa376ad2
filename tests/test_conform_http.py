"""The project's conformance suite (PROTOCOL.md section 11), run over real HTTP against a live `mp serve`."""

from __future__ import annotations

import json
import subprocess

from serverutil import mp_command, mp_env, running_server, server_log

ADMIN = "conformance-admin-token-0123456789"


def test_every_check_passes_over_http(tmp_path):
    with running_server(tmp_path, "--allow-admin", ADMIN) as (base, proc):
        done = subprocess.run(
            mp_command("conform", "--base", base, "--admin-token", ADMIN, "--json"),
            capture_output=True,
            text=True,
            env=mp_env(),
            timeout=600,
        )
        log = server_log(proc)
    assert done.stdout.strip(), f"no report; stderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    by_status: dict[str, list[str]] = {}
    for result in report["results"]:
        by_status.setdefault(result["status"], []).append(result["id"])
    failures = [f"{r['id']}: {r['note']}" for r in report["results"] if r["status"] != "pass"]
    assert not failures, "\n".join(failures)
    assert report["profile"] == "all"
    assert report["ok"] is True and done.returncode == 0
    ids = set(by_status["pass"])
    assert {"C01", "C12", "C17", "C19", "C30", "X40"} <= ids  # the checks only a real server can show
    assert "Traceback" not in log, log[-4000:]
