"""The project's conformance suite (docs/protocol.md section 11 and the project profile), run over real HTTP
against a live `mp serve`, and against three of them sharing one PostgreSQL database."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import httpx
import pytest
from conformance_variant import VariantTransport, WallClock, served_over_http
from serverutil import mp_command, mp_env, running_server, server_log

ADMIN = "conformance-admin-token-0123456789"
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-schemas"
# Without ../shared (a bare clone) C29 has no published schemas to validate against and skips, saying so.
SCHEMA_ARGS = ["--schemas", str(REFERENCE)] if REFERENCE.is_dir() else []
SKIPPED = set() if REFERENCE.is_dir() else {"C29"}


def _conform(*bases: str) -> subprocess.CompletedProcess[str]:
    args = [a for base in bases for a in ("--base", base)]
    return subprocess.run(
        mp_command("conform", *args, "--admin-token", ADMIN, *SCHEMA_ARGS, "--json"),
        capture_output=True,
        text=True,
        env=mp_env(),
        timeout=600,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def db_args(request, tmp_path) -> list[str]:
    if request.param == "postgres":
        return ["--db", request.getfixturevalue("pg_url")]
    return ["--db", str(tmp_path / "mp.db")]


def test_every_check_passes_over_http(tmp_path, db_args):
    with running_server(tmp_path, *db_args, "--allow-admin", ADMIN) as (base, proc):
        done = _conform(base)
        log = server_log(proc)
    _assert_all_pass(done, log)


def test_every_check_passes_against_three_servers_on_one_postgresql(tmp_path, pg_url):
    """Each request of the suite goes to the next of three servers sharing one database."""
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(running_server(tmp_path, "--db", pg_url, "--allow-admin", ADMIN))
            for _ in range(3)
        ]
        done = _conform(*(base for base, _ in servers))
        served = [_requests_served(base) for base, _ in servers]
        logs = [server_log(proc) for _, proc in servers]
    _assert_all_pass(done, "\n".join(logs))
    total = sum(served)
    assert all(n > total / 6 for n in served), served  # each server took its turn (about a third each)


def _requests_served(base: str) -> int:
    text = httpx.get(base + "/metrics", timeout=10).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("mp_http_requests_total{") and 'route="/mp/v0/' in line
    )


def _assert_all_pass(done: subprocess.CompletedProcess[str], log: str) -> None:
    assert done.stdout.strip(), f"no report; stderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    by_status: dict[str, list[str]] = {}
    for result in report["results"]:
        by_status.setdefault(result["status"], []).append(result["id"])
    failures = [
        f"{r['id']}: {r['note']}"
        for r in report["results"]
        if r["status"] != "pass" and not (r["status"] == "skip" and r["id"] in SKIPPED)
    ]
    assert not failures, "\n".join(failures)
    assert report["profile"] == "all"
    assert report["ok"] is True and done.returncode == 0
    ids = set(by_status["pass"])
    assert {"C01", "C12", "C17", "C19", "C30", "X40"} <= ids  # the checks only a real server can show
    assert set(by_status.get("skip", [])) == SKIPPED
    assert "Traceback" not in log, log[-4000:]


def test_the_published_profile_passes_against_the_variant_over_http():
    """The same over real sockets, through `mp conform --base` (real waits, really concurrent claims)."""
    variant = VariantTransport(clock=WallClock())
    with served_over_http(variant) as base:
        schemas = ["--schemas", str(REFERENCE)] if REFERENCE.is_dir() else []
        args = ["--base", base, "--profile", "published", "--admin-token", variant.admin_token, *schemas]
        done = subprocess.run(
            mp_command("conform", *args, "--json"), capture_output=True, text=True, env=mp_env(), timeout=300
        )
    assert done.stdout.strip(), f"no report; stderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    bad = [f"{r['id']} {r['status']}: {r['note']}" for r in report["results"] if r["status"] != "pass"]
    assert bad == [f"C29 skip: {r['note']}" for r in report["results"] if r["id"] in SKIPPED], bad
    assert report["transport"].startswith("http ") and len(report["results"]) == 34
    assert done.returncode == 0
