"""Operating `mp serve`: settings from the environment and a TOML file (flags win), tokens kept out of the
log, timestamped logs, /healthz, /readyz and /metrics, SIGHUP reloading the allowed origins without dropping
a connection, a server without uvloop, and the systemd unit and Containerfile in deploy/."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.cli import serve, serve_config
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.http.app import MonitorApp
from monitor_protocol.store.memory import MemoryStore
from serverutil import bearer, mp_command, mp_env, running_server, server_log
from waiting import eventually, eventually_async

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
ADMIN = "ops-admin-token-0123456789abcdef"
REGISTRATION = "ops-registration-token-0123456789"
METRICS = "ops-metrics-token-0123456789abcd"
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
RUN = "com.example.ci.run"


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch):
    for env, _kind in serve_config.SETTINGS.values():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv(serve_config.CONFIG_ENV, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments("serve", parser)
    return parser.parse_args(list(argv))


def create_monitor(mp: httpx.Client, monitor_id: str, token: str | None = None) -> str:
    body = {
        "id": monitor_id,
        "description": "ops",
        "horizon": "minute",
        "visibility": "public",
        "types": [RUN],
    }
    r = mp.post("/monitors", json=body, headers=bearer(token) if token else {})
    assert r.status_code == 201, r.text
    return r.json()["owner_token"]


def start_failure(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        mp_command("serve", *args),
        capture_output=True,
        text=True,
        env={**mp_env(), **(env or {})},
        cwd=str(tmp_path),
        timeout=60,
    )


# -- where settings come from -----------------------------------------------------------------------------


def test_precedence_flag_then_environment_then_file_then_default(tmp_path):
    config = tmp_path / "mp.toml"
    config.write_text(
        'port = 9001\nmax-body = 4096\nallow_origin = ["http://file.example"]\nadmin_token = "from-file"\n'
        'log_level = "debug"\n'
    )
    env = {
        "MP_PORT": "9002",
        "MP_ALLOW_ORIGIN": "http://a.example, http://b.example",
        "MP_CONFIG": str(config),
    }
    cfg, sources = serve_config.resolve_settings(parse("--port", "9003"), env)
    assert cfg.port == 9003 and sources["port"] == "--port"  # the flag wins
    assert (
        cfg.allow_origin == ["http://a.example", "http://b.example"]
        and sources["allow_origin"] == "MP_ALLOW_ORIGIN"
    )
    assert cfg.max_body == 4096 and sources["max_body"] == f"config {config}"
    assert cfg.allow_admin == "from-file" and cfg.log_level == "debug"
    assert cfg.header_timeout == 10.0 and sources["header_timeout"] == "default"
    # A repeated flag replaces the environment's list (it does not extend the default or the env).
    cfg, _ = serve_config.resolve_settings(
        parse("--allow-origin", "http://c.example", "--allow-origin", "http://d"), env
    )
    assert cfg.allow_origin == ["http://c.example", "http://d"]
    # --allow-admin without a value switches admin on with the token MP_ADMIN_TOKEN (or the file) holds:
    # minting another would refuse the operator's own token.
    cfg, sources = serve_config.resolve_settings(parse("--allow-admin"), {"MP_ADMIN_TOKEN": "env-token"})
    assert cfg.allow_admin == "env-token" and sources["allow_admin"] == "MP_ADMIN_TOKEN"
    cfg, sources = serve_config.resolve_settings(parse("--allow-admin", "--config", str(config)), {})
    assert cfg.allow_admin == "from-file" and sources["allow_admin"] == f"config {config}"
    # control: with no token anywhere, a bare --allow-admin still mints one (cfg.allow_admin == "")
    cfg, sources = serve_config.resolve_settings(parse("--allow-admin"), {})
    assert cfg.allow_admin == "" and sources["allow_admin"] == "--allow-admin"
    # and a token given with the flag wins over the environment's
    cfg, sources = serve_config.resolve_settings(
        parse("--allow-admin=flag-token"), {"MP_ADMIN_TOKEN": "env-token"}
    )
    assert cfg.allow_admin == "flag-token" and sources["allow_admin"] == "--allow-admin"
    cfg, sources = serve_config.resolve_settings(parse(), {"MP_ADMIN_TOKEN": "env-token"})
    assert cfg.allow_admin == "env-token" and sources["allow_admin"] == "MP_ADMIN_TOKEN"


def test_every_flag_has_an_environment_variable_and_a_file_key():
    parser = argparse.ArgumentParser()
    serve.add_arguments("serve", parser)
    dests = {a.dest for a in parser._actions if a.dest not in ("help", "config")}
    assert dests == set(serve_config.SETTINGS)
    for name, (env, _kind) in serve_config.SETTINGS.items():
        assert env.startswith("MP_")
        flag = next(a for a in parser._actions if a.dest == name)
        assert env in flag.help, f"--{name}'s help should name {env}"


def test_the_configuration_table_of_serve_md_lists_every_setting():
    """docs/serve.md says every flag has an environment variable and a file key: its table lists each one
    (seven source and logging settings were missing from it)."""
    text = (ROOT / "docs" / "serve.md").read_text()
    table = text.split("| flag | environment | file key |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = (cells[1], cells[2])
    for name, (env, _kind) in serve_config.SETTINGS.items():
        flag = "--" + name.replace("_", "-")
        assert flag in rows, f"docs/serve.md's configuration table has no row for {flag}"
        assert env in rows[flag][0] and f"`{name}`" in rows[flag][1], (flag, rows[flag])


def test_db_connections_comes_from_the_environment_and_is_bounded():
    cfg, sources = serve_config.resolve_settings(parse(), {"MP_DB_CONNECTIONS": "8"})
    assert cfg.db_connections == 8 and sources["db_connections"] == "MP_DB_CONNECTIONS"
    assert serve_config.validate(cfg) is None  # positive control: 8 engine connections are fine
    cfg, sources = serve_config.resolve_settings(parse(), {})
    assert cfg.db_connections == serve.DEFAULT_DB_CONNECTIONS and sources["db_connections"] == "default"
    for bad in ("0", "65"):
        cfg, _ = serve_config.resolve_settings(parse("--db-connections", bad), {})
        assert "--db-connections must be between 1 and 64" in (serve_config.validate(cfg) or "")


def test_db_lanes_comes_from_a_flag_or_the_environment_and_a_wrong_word_is_named():
    cfg, sources = serve_config.resolve_settings(parse(), {"MP_DB_LANES": "threads"})
    assert cfg.db_lanes == "threads" and sources["db_lanes"] == "MP_DB_LANES"
    cfg, _ = serve_config.resolve_settings(parse("--db-lanes", "green"), {})
    assert cfg.db_lanes == "green"
    assert serve._db_lanes("threads") == "threads" and serve._db_lanes(None) == "threads"  # the default
    assert serve._db_lanes("green") == "green"  # greenlet is installed with the test extra
    with pytest.raises(serve_config.ConfigError, match="expected one of green, threads"):
        serve_config.resolve_settings(parse(), {"MP_DB_LANES": "fibers"})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("prot = 1\n", "unknown setting 'prot'"),
        ('port = "eighty"\n', "port: expected a whole number (got 'eighty')"),
        ("allow_origin = [1, 2]\n", "list of strings"),
        ("port = \n", "not valid TOML"),
        ("max_body = true\n", "whole number"),
        ('keep_alive = "soon"\n', "keep_alive: expected a number (seconds"),
        ('registration_token = ""\n', "registration_token: expected a non-empty string"),
        ('metrics_token = "  "\n', "metrics_token: expected a non-empty string"),
        ('db = ""\n', "db: expected a non-empty string"),
    ],
)
def test_a_bad_config_file_is_refused_with_a_sentence(tmp_path, text, needle):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(serve_config.ConfigError, match=re.escape(needle)):
        serve_config.resolve_settings(parse("--config", str(config)), {})


def test_a_bad_value_is_named_where_it_came_from(tmp_path):
    """The sentence names the variable or file key that held the value, not a flag nobody typed, and never
    Python's own words ("invalid literal for int() with base 10")."""
    cfg, sources = serve_config.resolve_settings(parse(), {"MP_DB_CONNECTIONS": "100"})
    said = serve_config.validate(cfg, sources) or ""
    assert said.startswith("MP_DB_CONNECTIONS must be between 1 and 64") and "--db-connections" not in said
    config = tmp_path / "serve.toml"
    config.write_text("db_connections = 0\n")
    cfg, sources = serve_config.resolve_settings(parse("--config", str(config)), {})
    assert (serve_config.validate(cfg, sources) or "").startswith(f"{config}: db_connections must be")
    cfg, sources = serve_config.resolve_settings(parse("--db-connections", "0"), {})
    assert (serve_config.validate(cfg, sources) or "").startswith("--db-connections must be")
    for env in ({"MP_PORT": "abc"}, {"MP_MAX_BODY": "1e3"}):
        with pytest.raises(serve_config.ConfigError) as caught:
            serve_config.resolve_settings(parse(), env)
        assert "expected a whole number" in str(caught.value) and "int()" not in str(caught.value)
    cfg, _ = serve_config.resolve_settings(parse(), {"MP_PORT": " 8131 ", "MP_KEEP_ALIVE": "2.5"})
    assert (cfg.port, cfg.keep_alive) == (8131, 2.5)  # control: numbers as the environment spells them


@pytest.mark.parametrize("url", ["mysql://x:pw@h/db", "sqlite:///tmp/x.db", "http://example.com/db"])
def test_a_database_url_of_another_kind_is_refused_by_its_scheme(url):
    cfg, sources = serve_config.resolve_settings(parse("--db", url), {})
    said = serve_config.validate(cfg, sources) or ""
    scheme = url.split("://")[0]
    assert said.startswith(f"--db names a {scheme}:// database") and "pw" not in said
    for fine in ("postgresql://mp@h/db", "postgres://mp@h/db", ":memory:", "./mp.db"):
        cfg, sources = serve_config.resolve_settings(parse("--db", fine), {})
        assert serve_config.validate(cfg, sources) is None, fine


def test_bad_settings_stop_the_server_with_exit_status_2(tmp_path):
    done = start_failure(tmp_path, "--db", ":memory:", env={"MP_PORT": "eighty"})
    assert done.returncode == 2 and "MP_PORT" in done.stderr
    config = tmp_path / "typo.toml"
    config.write_text("alow_origin = ['http://x']\n")
    done = start_failure(tmp_path, "--db", ":memory:", "--port", "0", "--config", str(config))
    assert done.returncode == 2 and "alow_origin" in done.stderr
    known = done.stderr.split("known:")[-1]
    assert "admin_token" in known and "allow_admin" in known  # the file's name for it is listed too
    done = start_failure(
        tmp_path, "--db", ":memory:", "--port", "0", "--config", str(tmp_path / "missing.toml")
    )
    assert done.returncode == 2 and "missing.toml" in done.stderr


def test_tokens_from_the_environment_work_and_never_reach_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("MP_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("MP_REGISTRATION_TOKEN", REGISTRATION)
    monkeypatch.setenv("MP_METRICS_TOKEN", METRICS)
    monkeypatch.setenv("MP_ALLOW_ORIGIN", "http://a.example,http://b.example")
    with running_server(tmp_path) as (base, proc), httpx.Client(base_url=base + "/mp/v0", timeout=30) as mp:
        assert mp.get("/admin/snapshot", headers=bearer(ADMIN)).status_code == 200
        assert mp.get("/admin/snapshot", headers=bearer("wrong")).status_code == 401
        assert mp.post("/monitors", json={"id": "x"}).status_code == 401  # registration needs the token
        create_monitor(mp, "envmon", REGISTRATION)
        for origin in ("http://a.example", "http://b.example"):
            r = mp.get("/discover", headers={"Origin": origin})
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        assert mp.get("/discover", headers={"Origin": "http://c.example"}).status_code == 403
        log = server_log(proc)
    assert ADMIN not in log and REGISTRATION not in log and METRICS not in log
    # each token in force is named by where it came from and its fingerprint, so an operator can tell which
    assert f"admin: enabled, token from MP_ADMIN_TOKEN ({serve_config.fingerprint(ADMIN)})" in log
    fp = serve_config.fingerprint(REGISTRATION)
    assert f"registration: token required (from MP_REGISTRATION_TOKEN; {fp})" in log
    fp = serve_config.fingerprint(METRICS)
    assert f"metrics: GET /metrics with the metrics token (from MP_METRICS_TOKEN; {fp})" in log
    assert "warning" not in log.lower()


def test_the_banner_says_metrics_behind_a_proxy_need_the_token(tmp_path):
    """An --allow-host naming a public name is a reverse proxy's setup (or a public bind's): the banner says
    /metrics then needs a token, from loopback too."""
    with running_server(tmp_path, "--db", ":memory:", "--allow-host", "monitors.example.org") as (base, proc):
        assert httpx.get(base + "/metrics").status_code == 401
        log = server_log(proc)
    assert "metrics: GET /metrics for no one (--allow-host names a public host: set --metrics-token" in log
    with running_server(tmp_path, "--db", ":memory:") as (base, proc):
        assert httpx.get(base + "/metrics").status_code == 200  # control: local names only
        log = server_log(proc)
    assert "metrics: GET /metrics for local clients" in log and "public host" not in log
    # a name given with the root's dot is the name a request's Host is read as (a tester's: it refused both)
    with running_server(tmp_path, "--db", ":memory:", "--allow-host", "Monitors.Example.org.") as (
        base,
        proc,
    ):
        for host in ("monitors.example.org", "monitors.example.org."):
            assert httpx.get(base + "/mp/v0/discover", headers={"Host": host}).status_code == 200, host
        said = server_log(proc)
    assert "monitors.example.org" in said and "monitors.example.org." not in said.lower(), said


def test_a_reload_says_who_may_read_metrics_once_a_public_host_is_allowed():
    """A tester's: after SIGHUP added a public --allow-host, the reload said "loopback clients only" though
    loopback then got 401."""
    said = serve_config.metrics_said(
        None, None, "default", bool(serve_config.public_hosts(["ci.example.org"]))
    )
    assert "no one but the admin token" in said and "loopback" not in said
    local = serve_config.metrics_said(None, None, "default", bool(serve_config.public_hosts(["localhost"])))
    assert local == "no metrics token (loopback clients only)"  # control


def test_a_token_on_argv_is_not_printed_but_warned_about(tmp_path):
    with running_server(tmp_path, "--allow-admin", ADMIN, "--db", ":memory:") as (base, proc):
        assert httpx.get(base + "/mp/v0/admin/snapshot", headers=bearer(ADMIN)).status_code == 200
        log = server_log(proc)
    assert ADMIN not in log
    assert "admin token was given on the command line" in log and "MP_ADMIN_TOKEN" in log


def test_a_minted_admin_token_goes_to_a_private_file_not_the_log(tmp_path):
    db = tmp_path / "mp.db"
    token_file = Path(str(db) + ".admin-token")
    with running_server(tmp_path, "--allow-admin", "--db", str(db)) as (base, proc):
        assert token_file.exists()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        assert httpx.get(base + "/mp/v0/admin/snapshot", headers=bearer(token)).status_code == 200
        log = server_log(proc)
        assert token not in log and str(token_file) in log and serve_config.fingerprint(token) in log
    assert not token_file.exists()  # the token dies with the server
    # An in-memory server has no database folder: the token goes to a fresh private temporary file.
    with running_server(tmp_path, "--allow-admin", "--db", ":memory:") as (base, proc):
        found = re.search(
            r"admin: enabled, token minted for this run and written to (\S+) ", server_log(proc)
        )
        assert found, server_log(proc)
        memory_file = Path(found.group(1))
        assert stat.S_IMODE(memory_file.stat().st_mode) == 0o600
        token = memory_file.read_text().strip()
        assert httpx.get(base + "/mp/v0/admin/snapshot", headers=bearer(token)).status_code == 200
        assert token not in server_log(proc)
    assert not memory_file.exists()


def test_a_config_file_configures_the_server(tmp_path):
    config = tmp_path / "mp.toml"
    config.write_text(
        f'[serve]\nallow-admin = "{ADMIN}"\nmax_body = 2048\nallow_origin = "http://f.example"\n'
    )
    with running_server(tmp_path, "--config", str(config)) as (base, proc):
        with httpx.Client(base_url=base + "/mp/v0", timeout=30) as mp:
            assert mp.get("/admin/snapshot", headers=bearer(ADMIN)).status_code == 200
            assert mp.post("/monitors", content=b"x" * 4096).status_code == 413
            assert mp.get("/discover", headers={"Origin": "http://f.example"}).status_code == 200
        log = server_log(proc)
    assert ADMIN not in log and f"config: {config}" in log
    assert "limits: max_body=2048 bytes" in log


def test_log_lines_carry_utc_timestamps(tmp_path):
    with running_server(tmp_path, "--db", ":memory:", "--access-log") as (base, proc):
        httpx.get(base + "/mp/v0/discover")
        eventually(lambda: '"GET /mp/v0/discover' in server_log(proc), what="the access log line")
        log = server_log(proc)
    uvicorn_lines = [line for line in log.splitlines() if "INFO" in line]
    assert any("Application startup complete" in line for line in uvicorn_lines)
    access = [line for line in uvicorn_lines if '"GET /mp/v0/discover' in line]
    assert access, log
    for line in uvicorn_lines:
        assert STAMP.match(line), line


@pytest.mark.parametrize(
    ("args", "env", "logged"),
    [((), {}, False), (("--access-log",), {}, True), ((), {"MP_ACCESS_LOG": "true"}, True)],
)
def test_the_access_log_is_off_unless_asked_for(tmp_path, monkeypatch, args, env, logged):
    """One line per request costs about a quarter of a pull+ack (docs/bench-history.md): off by default, and
    the start-up summary says how to turn it on."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with running_server(tmp_path, "--db", ":memory:", *args) as (base, proc):
        httpx.get(base + "/mp/v0/discover")
        httpx.get(base + "/healthz")  # a second request: the first one's line is surely written by now
        if logged:
            eventually(lambda: '"GET /mp/v0/discover' in server_log(proc), what="the access log line")
        else:
            time.sleep(1)  # the point: a line that must not appear gets a second to show anyway
        log = server_log(proc)
    assert ('"GET /mp/v0/discover' in log) is logged, log
    assert ("access log: on" if logged else "access log: off (--access-log turns it on)") in log
    assert "Application startup complete" in log  # control: the server's own log lines are still there


# -- health, readiness ------------------------------------------------------------------------------------


def test_healthz_and_readyz_answer_outside_the_prefix_whatever_the_host(tmp_path):
    with running_server(tmp_path) as (base, _proc):
        assert httpx.get(base + "/healthz").json() == {"status": "ok"}
        r = httpx.get(base + "/readyz")
        assert r.status_code == 200 and r.json() == {"status": "ready"}
        # Probes name the server by address (a container's IP, a load balancer): the health routes
        # answer any Host, while the protocol routes keep the DNS-rebinding guard.
        evil = {"Host": "rebind.example"}
        assert httpx.get(base + "/healthz", headers=evil).status_code == 200
        assert httpx.get(base + "/readyz", headers=evil).status_code == 200
        assert httpx.get(base + "/mp/v0/discover", headers=evil).status_code == 403
        # Only GET and HEAD: anything else is the router's (404 naming /mp/v0).
        assert httpx.head(base + "/healthz").status_code == 200
        assert httpx.post(base + "/healthz").status_code == 404


class Exchange:
    """A raw ASGI exchange in-process (no socket), from a given client address."""

    def __init__(self, path: str, *, client: str = "127.0.0.1", headers: dict[str, str] | None = None):
        hdrs = {"host": "127.0.0.1:8130", **(headers or {})}
        self.scope = {
            "type": "http",
            "method": "GET",
            "path": path,
            "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()],
            "client": (client, 40000),
        }
        self.sent: list[dict[str, Any]] = []

    async def run(self, app: Any) -> Exchange:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            self.sent.append(message)

        await asyncio.wait_for(app(self.scope, receive, send), 30)
        return self

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body").decode()


class BrokenStore(MemoryStore):
    def get_monitor(self, monitor_id):
        raise OSError("disk I/O error")


def make_app(store: Any, **options: Any) -> Any:
    service = MonitorService(store, clock=time.time)
    hosts = {"127.0.0.1", "localhost", *options.pop("allow_hosts", ())}
    router = RestRouter(service, admin_token=options.pop("admin_token", None), allowed_hosts=hosts)
    return MonitorApp(service, router, store=store, sweep_interval=None, **options)


async def test_a_sweep_that_fails_each_tick_is_a_few_lines_an_outage(caplog):
    """An operator's: with the database away the leader logged `sweep: UNAVAILABLE ...` every second. It is
    logged as it begins and as it ends (core/repeats.py), not once a tick; the control: a failure counted."""
    import logging

    from monitor_protocol.core.errors import ProtocolError

    app = make_app(MemoryStore())
    ticks = {"n": 0}

    def sweep() -> None:
        ticks["n"] += 1
        if ticks["n"] <= 20:
            raise ProtocolError("UNAVAILABLE", "the database is unreachable")

    app.service.sweep_due = sweep  # type: ignore[attr-defined]
    app.sweep_interval = 0.005
    try:
        with caplog.at_level(logging.WARNING, logger="monitor_protocol.http"):
            task = asyncio.ensure_future(app._sweeper())
            await eventually_async(lambda: ticks["n"] > 22, timeout=10)
            task.cancel()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sweep")]
        assert ticks["n"] > 20 and len(said) == 2, said  # the first failure, then "over after"
        assert "UNAVAILABLE" in said[0] and "over after" in said[1] and "(20 times)" in said[1]
    finally:
        app.engine.stop()


async def test_metrics_count_each_observation_appended_not_each_commit():
    """A soak's: `mp_observations_appended_total` counted one per monitor a commit appended to, so a batch of
    10 counted 1. The control: an idempotent repeat appends nothing and counts nothing."""
    app = make_app(MemoryStore())
    try:
        owner = app.service.create_monitor({"id": "ci", "visibility": "public", "types": [RUN]}, None)
        before = app.service.observations_appended
        batch = [{"type": RUN, "subject": f"b{i}", "idempotency_key": f"k{i}"} for i in range(10)]
        await app.engine.call(app.service.publish_many, "ci", batch, owner["owner_token"])
        assert app.service.observations_appended == before + 10
        await app.engine.call(app.service.publish_many, "ci", batch, owner["owner_token"])
        assert app.service.observations_appended == before + 10
        scraped = await Exchange("/metrics", client="127.0.0.1").run(app)
        assert metric(scraped.text, "mp_observations_appended_total") == before + 10
    finally:
        app.engine.stop()


async def test_metrics_scraped_through_an_outage_log_it_as_it_begins_and_ends_with_its_reason(
    caplog, monkeypatch
):
    """A tester's: every scrape during a database outage logged `metrics: the store summary failed: ` with no
    reason (a timeout's text is empty). Logged as it begins, with its reason, and as it ends."""
    import logging

    from monitor_protocol.doors.http import ops

    class Away(MemoryStore):
        away = True

        def backlog_summary(self, top):
            if self.away:
                time.sleep(0.3)  # past the scrape's time limit: the summary times out
            return super().backlog_summary(top)

    monkeypatch.setattr(ops, "METRICS_TIMEOUT_SECONDS", 0.05)
    store = Away()
    app = make_app(store)
    try:
        with caplog.at_level(logging.WARNING, logger="monitor_protocol.http"):
            for _ in range(3):
                scraped = await Exchange("/metrics", client="127.0.0.1").run(app)
                assert scraped.status == 200 and "mp_store_up 0" in scraped.text
            store.away = False
            await asyncio.sleep(0.5)  # the timed-out summaries end
            assert "mp_store_up 1" in (await Exchange("/metrics", client="127.0.0.1").run(app)).text
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("metrics:")]
        assert len(said) == 2, said  # control: the failures were 3 scrapes, the lines 2
        assert "no answer within 0.05 s" in said[0] and "over after" in said[1]
    finally:
        app.engine.stop()


async def test_an_sse_stream_the_store_cannot_start_tells_an_eventsource_to_come_back():
    """An operator tester's: during a database outage a new SSE stream was refused with 503, which a
    browser's EventSource takes as final (it never connects again). An EventSource (Accept:
    text/event-stream) gets a stream of one `error` event and `retry:`, so it comes back by itself; the
    control: another client gets the 503 and its JSON, and a refusal that does not pass stays an HTTP error."""
    from monitor_protocol.core.store_contract import StorageError

    class AwayStore(MemoryStore):
        def get_subscription(self, sub_id):
            raise StorageError("the database is unreachable (OperationalError; the server's log says why)")

    app = make_app(AwayStore())
    try:
        path = "/mp/v0/subscriptions/sub-0123456789abcdef/stream"
        browser = await Exchange(path, headers={"accept": "text/event-stream"}).run(app)
        assert browser.status == 200, browser.text
        start = next(m for m in browser.sent if m["type"] == "http.response.start")
        assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
        assert (
            browser.text.startswith("retry: 3000\n\nevent: error\ndata: ") and "UNAVAILABLE" in browser.text
        )
        plain = await Exchange(path).run(app)
        assert plain.status == 503 and json.loads(plain.text)["code"] == "UNAVAILABLE"  # control
    finally:
        app.engine.stop()
    app = make_app(MemoryStore())
    try:
        gone = await Exchange(path, headers={"accept": "text/event-stream"}).run(app)
        assert gone.status == 404  # no such subscription: final, as it should be
    finally:
        app.engine.stop()


async def test_readyz_is_503_when_the_store_fails_a_read_and_while_stopping():
    app = make_app(BrokenStore())
    try:
        r = await Exchange("/readyz").run(app)
        assert r.status == 503 and json.loads(r.text)["status"] == "unavailable"
        assert (await Exchange("/healthz").run(app)).status == 200  # the process is still up
    finally:
        app.engine.stop()
    app = make_app(MemoryStore())
    try:
        assert (await Exchange("/readyz").run(app)).status == 200
        app.begin_shutdown()
        r = await Exchange("/readyz").run(app)
        assert r.status == 503 and json.loads(r.text)["status"] == "stopping"
    finally:
        app.engine.stop()


# -- metrics ----------------------------------------------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)$"
    found = re.search(pattern, text, re.M)
    assert found, f"{name} {labels} not in:\n{text}"
    return float(found.group(1))


def test_metrics_count_what_the_server_does(tmp_path):
    with running_server(tmp_path) as (base, _proc), httpx.Client(base_url=base + "/mp/v0", timeout=60) as mp:
        owner = create_monitor(mp, "metered")
        for i in range(3):
            r = mp.post(
                "/monitors/metered/observations",
                json={"type": RUN, "subject": f"b{i}", "data": {"i": i}},
                headers=bearer(owner),
            )
            assert r.status_code == 201, r.text
        sub = mp.post("/subscriptions", json={"monitor": "metered", "subscriber": "agent:metrics"}).json()
        sub_id, reader = sub["subscription"]["id"], sub["token"]
        page = mp.get(f"/subscriptions/{sub_id}/pull", params={"limit": 2}, headers=bearer(reader)).json()
        before = httpx.get(base + "/metrics")
        assert before.status_code == 200
        assert before.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = before.text
        assert metric(text, "mp_subscription_backlog", monitor="metered", subscription=sub_id) >= 3
        r = mp.post(f"/subscriptions/{sub_id}/ack", json={"cursor": page["next"]}, headers=bearer(reader))
        assert r.status_code == 200, r.text
        # A long poll parked while we scrape shows up in the gauge.
        result: dict[str, Any] = {}

        def park() -> None:
            result["r"] = httpx.get(
                f"{base}/mp/v0/subscriptions/{sub_id}/pull",
                params={"wait": 3, "cursor": 10_000},
                headers=bearer(reader),
                timeout=30,
            )

        waiter = threading.Thread(target=park)
        waiter.start()
        parked = eventually(
            lambda: metric(httpx.get(base + "/metrics").text, "mp_long_polls_parked"),
            what="the parked long poll in the gauge (it parks for 3 s)",
        )
        waiter.join(30)
        text = httpx.get(base + "/metrics").text
        head = mp.get("/monitors/metered/state").json()["head"]
    assert parked == 1
    assert metric(text, "mp_long_polls_parked") == 0
    assert metric(text, "mp_publishes_total") == 3
    assert metric(text, "mp_pulls_total") >= 2
    assert metric(text, "mp_acks_total") == 1
    assert metric(text, "mp_observations_appended_total") == head  # every observation of the log
    assert metric(text, "mp_monitors") == 1 and metric(text, "mp_subscriptions_active") == 1
    route = "/mp/v0/monitors/{id}/observations"
    assert metric(text, "mp_http_requests_total", route=route, method="POST", status="201") == 3
    assert metric(text, "mp_http_requests_total", route="/mp/v0/monitors", method="POST", status="201") == 1
    assert metric(text, "mp_engine_commit_seconds_count") > 0
    assert metric(text, "mp_engine_commit_seconds_bucket", le="+Inf") == metric(
        text, "mp_engine_commit_seconds_count"
    )
    # Every engine call counted once (a group commit's calls each), and the CPU they took (never negative, and
    # not nothing: the server ran publishes, pulls and an ack on the engine's seat).
    assert metric(text, "mp_engine_calls_total") >= max(6, metric(text, "mp_engine_commit_seconds_count"))
    assert 0 < metric(text, "mp_engine_cpu_seconds_total") < 60
    backlog = metric(text, "mp_subscription_backlog", monitor="metered", subscription=sub_id)
    assert backlog < metric(before.text, "mp_subscription_backlog", monitor="metered", subscription=sub_id)
    # A store of its own has no other servers to hear: the link's metrics are PostgreSQL's (tests/test_scale_out.py).
    assert "mp_store_listening" not in text and "mp_store_leader" not in text
    # Ids never become route labels: the label set stays bounded.
    assert "metered" not in "".join(line for line in text.splitlines() if line.startswith("mp_http_requests"))
    # What startup made is kept out of the collector's walks, and the collector's pauses are counted per
    # generation from then on: the full collection made before the freeze is the first.
    assert metric(text, "mp_gc_frozen_objects") > 10_000
    assert metric(text, "mp_gc_pauses_total", generation="2") >= 1
    for g in ("0", "1", "2"):
        assert metric(text, "mp_gc_pauses_total", generation=g) >= 0
        assert (
            0
            <= metric(text, "mp_gc_pause_seconds_max", generation=g)
            <= metric(text, "mp_gc_pause_seconds_total", generation=g)
        )


def test_the_collector_pauses_are_counted_while_watched():
    import gc

    from monitor_protocol.doors.http.ops import CollectorPauses

    pauses = CollectorPauses()
    pauses.watch()
    try:
        gc.collect()
        assert pauses.count[2] == 1 and pauses.seconds[2] == pauses.longest[2] > 0
    finally:
        pauses.unwatch()
    gc.collect()  # control: no longer watched, no longer counted
    assert pauses.count[2] == 1 and pauses._phase not in gc.callbacks


def test_metrics_refuse_browsers_and_rebinding(tmp_path):
    with running_server(tmp_path) as (base, _proc):
        assert httpx.get(base + "/metrics", headers={"Origin": "http://evil.example"}).status_code == 403
        assert httpx.get(base + "/metrics", headers={"Host": "rebind.example"}).status_code == 403
        assert httpx.get(base + "/metrics").status_code == 200  # positive control


def test_metrics_token_once_set_is_required_of_everyone(tmp_path, monkeypatch):
    monkeypatch.setenv("MP_METRICS_TOKEN", "scrape-token-0123456789")
    with running_server(tmp_path, "--db", ":memory:") as (base, proc):
        assert httpx.get(base + "/metrics").status_code == 401  # loopback too
        assert httpx.get(base + "/metrics", headers=bearer("nope")).status_code == 401
        assert httpx.get(base + "/metrics", headers=bearer("scrape-token-0123456789")).status_code == 200
        assert "scrape-token-0123456789" not in server_log(proc)


async def test_metrics_from_a_remote_client_need_a_token():
    app = make_app(MemoryStore(), admin_token=ADMIN)
    try:
        assert (await Exchange("/metrics", client="10.1.2.3").run(app)).status == 401
        assert (await Exchange("/metrics", client="127.0.0.1").run(app)).status == 200
        assert (await Exchange("/metrics", client="::1").run(app)).status == 200
        admin = {"authorization": f"Bearer {ADMIN}"}
        assert (await Exchange("/metrics", client="10.1.2.3", headers=admin).run(app)).status == 200
        app.metrics_token = "m-token"
        assert (await Exchange("/metrics", client="127.0.0.1").run(app)).status == 401
        ok = await Exchange("/metrics", client="10.1.2.3", headers={"authorization": "Bearer m-token"}).run(
            app
        )
        assert ok.status == 200 and "mp_http_requests_total" in ok.text
    finally:
        app.engine.stop()


async def test_metrics_through_a_reverse_proxy_on_this_machine_need_a_token():
    """A tester's: a proxy on the same machine connects from loopback, so every client behind it looked local
    and read /metrics (which names private monitors). A request carrying a proxy's forwarding header is not
    local; and on a server that accepts a public name (--allow-host, as a proxy needs) no loopback request
    is, since the Host it names is the client's to choose (a reviewer's: `Host: localhost` through the
    proxy passed a check on the Host)."""
    app = make_app(MemoryStore(), admin_token=ADMIN)
    try:
        local = await Exchange("/metrics", client="127.0.0.1", headers={"host": "127.0.0.1:8080"}).run(app)
        assert local.status == 200  # control: a local scraper of a server with local names only
        assert (
            await Exchange("/metrics", client="::1", headers={"host": "localhost"}).run(app)
        ).status == 200
        for name in ("x-forwarded-for", "forwarded", "x-real-ip", "x-forwarded-host"):
            headers = {"host": "127.0.0.1", name: "203.0.113.9"}
            assert (await Exchange("/metrics", client="127.0.0.1", headers=headers).run(app)).status == 401, (
                name
            )
    finally:
        app.engine.stop()
    proxied = make_app(MemoryStore(), admin_token=ADMIN, allow_hosts=["monitors.example.org"])
    try:
        for host in ("monitors.example.org", "localhost", "127.0.0.1"):  # whatever the client names
            refused = await Exchange("/metrics", client="127.0.0.1", headers={"host": host}).run(proxied)
            assert refused.status == 401 and "--allow-host" in json.loads(refused.text)["error"], host
        admin = {"authorization": f"Bearer {ADMIN}", "host": "localhost"}
        assert (await Exchange("/metrics", client="127.0.0.1", headers=admin).run(proxied)).status == 200
        # the root's dot is the same name (as DNS reads it)
        dotted = {"host": "monitors.example.org."}
        assert (
            await Exchange("/mp/v0/discover", client="127.0.0.1", headers=dotted).run(proxied)
        ).status == 200
    finally:
        proxied.engine.stop()


# -- SIGHUP -----------------------------------------------------------------------------------------------


def test_sighup_reloads_allowed_origins_without_dropping_connections(tmp_path):
    config = tmp_path / "mp.toml"
    config.write_text('allow_origin = ["http://old.example"]\n')
    with running_server(tmp_path, "--config", str(config)) as (base, proc):
        with httpx.Client(base_url=base + "/mp/v0", timeout=60) as mp:
            create_monitor(mp, "hup")
            sub = mp.post("/subscriptions", json={"monitor": "hup", "subscriber": "agent:hup"}).json()
            sub_id, reader = sub["subscription"]["id"], sub["token"]
            assert mp.get("/discover", headers={"Origin": "http://old.example"}).status_code == 200
            assert mp.get("/discover", headers={"Origin": "http://new.example"}).status_code == 403
            # A long poll is parked on a keep-alive connection while the server reloads.
            result: dict[str, Any] = {}

            def park() -> None:
                result["r"] = mp.get(
                    f"/subscriptions/{sub_id}/pull",
                    params={"wait": 3, "cursor": 10_000},
                    headers=bearer(reader),
                )

            waiter = threading.Thread(target=park)
            waiter.start()
            eventually(
                lambda: metric(httpx.get(base + "/metrics").text, "mp_long_polls_parked") >= 1,
                what="the long poll parks",
            )
            config.write_text('allow_origin = ["http://new.example"]\n')
            proc.send_signal(signal.SIGHUP)
            eventually(lambda: "configuration reloaded" in server_log(proc), what="the reload is logged")
            assert mp.get("/discover", headers={"Origin": "http://new.example"}).status_code == 200
            assert mp.get("/discover", headers={"Origin": "http://old.example"}).status_code == 403
            waiter.join(30)
            assert result["r"].status_code == 200  # the parked request was answered, not dropped
            # A file that no longer parses changes nothing: the running configuration stays.
            config.write_text("allow_origin = [\n")
            proc.send_signal(signal.SIGHUP)
            eventually(lambda: "not reloaded" in server_log(proc), what="the refused reload is logged")
            assert mp.get("/discover", headers={"Origin": "http://new.example"}).status_code == 200
            # A setting that needs a restart is named, not silently ignored.
            config.write_text('allow_origin = ["http://new.example"]\nmax_body = 99\n')
            proc.send_signal(signal.SIGHUP)
            eventually(lambda: "need a restart" in server_log(proc), what="the restart-only setting is named")
        assert proc.poll() is None  # still the same process
        log = server_log(proc)
    reload_lines = [line for line in log.splitlines() if "SIGHUP: " in line]
    assert any("origins allowed: http://new.example" in line for line in reload_lines), log
    assert any("max_body" in line and "need a restart" in line for line in reload_lines), log
    for line in reload_lines:
        assert STAMP.match(line), line  # the engine's loggers are timestamped too


def test_only_tokens_and_the_database_must_be_filled_in(tmp_path):
    """A token or db of spaces is refused from the environment too (an empty variable still counts as
    unset); `host = ""` stays what it was, every interface (control: only what must be filled is)."""
    with pytest.raises(serve_config.ConfigError, match="MP_REGISTRATION_TOKEN: expected a non-empty string"):
        serve_config.resolve_settings(parse(), {"MP_REGISTRATION_TOKEN": "  "})
    cfg, sources = serve_config.resolve_settings(parse(), {"MP_REGISTRATION_TOKEN": ""})
    assert sources["registration_token"] == "default"
    config = tmp_path / "host.toml"
    config.write_text('host = ""\n')
    cfg, sources = serve_config.resolve_settings(parse("--config", str(config)), {})
    assert cfg.host == "" and sources["host"].startswith("config ")


def test_sighup_says_when_the_environment_hides_a_reloadable_file_setting(tmp_path, monkeypatch, caplog):
    """Found by a tester: with MP_ALLOW_ORIGIN set (as the unit's comments once advised), a reload read the
    file's allow_origin, kept the environment's, and said only "origins allowed: <the environment's>"."""
    config = tmp_path / "mp.toml"
    config.write_text('allow_origin = ["https://file.example"]\n')
    monkeypatch.setenv("MP_ALLOW_ORIGIN", "https://env.example")
    flags = parse("--config", str(config))
    cfg, _ = serve_config.resolve_settings(flags)
    router, app = argparse.Namespace(), argparse.Namespace()
    reload = serve_config.Reloader(flags, cfg, router, app)
    with caplog.at_level("INFO", logger="monitor_protocol.serve"):
        reload()
    assert router.allowed_origins == {"https://env.example"}  # the environment still wins, as documented
    said = [r.getMessage() for r in caplog.records if "not in force" in r.getMessage()]
    assert len(said) == 1 and "allow_origin" in said[0] and "MP_ALLOW_ORIGIN" in said[0], said
    # control: without the environment variable the file is in force, and nothing is said
    caplog.clear()
    monkeypatch.delenv("MP_ALLOW_ORIGIN")
    with caplog.at_level("INFO", logger="monitor_protocol.serve"):
        reload()
    assert router.allowed_origins == {"https://file.example"}
    assert not [r for r in caplog.records if "not in force" in r.getMessage()]


def test_sighup_says_what_became_of_the_metrics_token_by_its_fingerprint(tmp_path, caplog):
    """Found by a tester: a reload applied a new metrics token but its log line named only origins and
    hosts. It says now whether a token is in force, where from, its fingerprint and whether it changed,
    never the token (control: the token is in force after the reload, and a removed one is said)."""
    config = tmp_path / "mp.toml"
    config.write_text('metrics_token = "first-metrics-token"\n')
    flags = parse("--config", str(config))
    cfg, _ = serve_config.resolve_settings(flags, {})
    router, app = argparse.Namespace(), argparse.Namespace()
    reload = serve_config.Reloader(flags, cfg, router, app)

    def said() -> str:
        lines = [r.getMessage() for r in caplog.records if "configuration reloaded" in r.getMessage()]
        caplog.clear()
        assert len(lines) == 1, lines
        return lines[0]

    with caplog.at_level("INFO", logger="monitor_protocol.serve"):
        reload()
        line = said()
        assert f"metrics token {serve_config.fingerprint('first-metrics-token')} from config" in line
        assert "(unchanged)" in line and "first-metrics-token" not in line
        config.write_text('metrics_token = "second-metrics-token"\n')
        reload()
        line = said()
        assert app.metrics_token == "second-metrics-token"
        assert serve_config.fingerprint("second-metrics-token") in line and "(changed)" in line
        assert "second-metrics-token" not in line
        config.write_text("")
        reload()
        assert app.metrics_token is None
        assert "no metrics token (loopback clients only), the token removed" in said()


def test_the_documented_online_backup_copies_a_serving_database_whole(tmp_path):
    """docs/serve.md's backup line, run as written while the server takes publishes: the copy is served as
    it is, with every publish acknowledged before the backup began and the reader's acknowledged cursor."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text()
    section = text.split("### Backing up", 1)[1].split("\n## ", 1)[0]
    line = re.search(r"```sh\n(python3 -c .+)\n```", section).group(1)
    db, copy = tmp_path / "live #1?.db", tmp_path / "backup.db"  # a path a bare file: URI would misread
    command = line.replace("/var/lib/monitor-protocol/monitor-protocol.db", shlex.quote(str(db)))
    command = command.replace("/var/backups/monitor-protocol.db", shlex.quote(str(copy)))
    obs = {"type": RUN, "subject": "b-1"}
    with running_server(tmp_path, "--db", str(db)) as (base, _proc):
        mp = httpx.Client(base_url=base + "/mp/v0", timeout=60)
        owner = create_monitor(mp, "kept")
        for _ in range(30):
            assert mp.post("/monitors/kept/observations", json=obs, headers=bearer(owner)).status_code == 201
        sub = mp.post("/subscriptions", json={"monitor": "kept", "subscriber": "agent:b"}).json()
        sub_id, reader = sub["subscription"]["id"], sub["token"]
        page = mp.get(f"/subscriptions/{sub_id}/pull", params={"limit": 10}, headers=bearer(reader)).json()
        acked = mp.post(f"/subscriptions/{sub_id}/ack", json={"cursor": page["next"]}, headers=bearer(reader))
        assert acked.status_code == 200
        head = mp.get("/monitors/kept", headers=bearer(owner)).json()["head"]
        stop = threading.Event()

        def publish_on() -> None:  # the server goes on writing while the copy is taken
            with httpx.Client(base_url=base + "/mp/v0", timeout=60) as other:
                while not stop.is_set():
                    other.post("/monitors/kept/observations", json=obs, headers=bearer(owner))

        writer = threading.Thread(target=publish_on)
        writer.start()
        try:
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
        finally:
            stop.set()
            writer.join(30)
            mp.close()
        assert done.returncode == 0, done.stderr
    with running_server(tmp_path, "--db", str(copy)) as (base, _proc):
        mp = httpx.Client(base_url=base + "/mp/v0", timeout=60)
        assert mp.get("/monitors/kept", headers=bearer(owner)).json()["head"] >= head  # the owner's token
        again = mp.get(f"/subscriptions/{sub_id}/pull", params={"limit": 1}, headers=bearer(reader)).json()
        assert again["cursor"] == page["next"]  # the reader's token and acknowledged cursor came along
        log = mp.get(
            f"/subscriptions/{sub_id}/pull", params={"cursor": 1, "limit": 200}, headers=bearer(reader)
        ).json()
        mp.close()
    seqs = [int(o["id"]) for o in log["observations"]]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= head  # dense, nothing missing


# -- uvloop is optional ----------------------------------------------------------------------------------


def test_serve_runs_without_uvloop(tmp_path, monkeypatch):
    blocker = tmp_path / "no-uvloop"
    (blocker / "uvloop").mkdir(parents=True)
    (blocker / "uvloop" / "__init__.py").write_text("raise ImportError('uvloop is not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocker))
    probe = subprocess.run(
        [sys.executable, "-c", "import uvloop"], env=mp_env(), capture_output=True, text=True, timeout=60
    )
    assert probe.returncode != 0  # the blocker works
    with running_server(tmp_path, "--db", ":memory:") as (base, _proc):
        assert httpx.get(base + "/mp/v0/discover").status_code == 200
        assert httpx.get(base + "/readyz").status_code == 200


# -- deploy/ ---------------------------------------------------------------------------------------------


def systemd_unit() -> dict[str, dict[str, list[str]]]:
    """The unit file as section -> key -> every value (systemd keys repeat: Environment=, SystemCallFilter=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in (DEPLOY / "monitor-protocol.service").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a key before any section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_the_systemd_unit_has_what_a_service_needs():
    unit = systemd_unit()
    assert set(unit) >= {"Unit", "Service", "Install"}
    svc = {k: v[-1] for k, v in unit["Service"].items()}
    assert "mp serve" in svc["ExecStart"]
    assert "--allow-admin" not in svc["ExecStart"] and "token" not in svc["ExecStart"].lower()
    assert svc["EnvironmentFile"].lstrip("-").startswith("/etc/")
    assert svc.get("DynamicUser") == "yes" or svc.get("User") not in (None, "root")
    assert svc["StateDirectory"] == "monitor-protocol"
    env = dict(e.split("=", 1) for e in unit["Service"]["Environment"])
    assert env["MP_DB"].startswith("%S/monitor-protocol/") and env["MP_HOST"] == "127.0.0.1"
    assert not any("TOKEN" in k for k in env)  # tokens come from the EnvironmentFile only
    assert "kill -HUP" in svc["ExecReload"]  # systemctl reload: SIGHUP re-reads the allowed origins
    assert svc["KillSignal"] == "SIGTERM"
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert svc.get(key) in ("yes", "strict", "true"), key
    # The serve command's own setrlimit call must not be killed by the syscall filter.
    assert "~@resources" not in " ".join(unit["Service"].get("SystemCallFilter", []))
    assert "multi-user.target" in svc.get("WantedBy", unit["Install"]["WantedBy"][-1])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    # verify wants ExecStart's binary to exist: point it at this interpreter's mp for the check.
    text = (DEPLOY / "monitor-protocol.service").read_text()
    mp = Path(sys.executable).with_name("mp")
    if not mp.exists():
        pytest.skip("no mp console script next to this interpreter")
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={mp}", text, flags=re.M)
    unit = tmp_path / "monitor-protocol.service"
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    output = done.stdout + done.stderr
    # Without a running systemd (a container) verify still parses every directive: an unknown or invalid
    # one is reported ("Unknown key 'X' in section [Service], ignoring.") and must not appear.
    problems = [
        line
        for line in output.splitlines()
        if re.search(r"Unknown|Invalid|Failed to parse|bad-setting", line)
    ]
    assert done.returncode == 0 and not problems, output


def containerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (DEPLOY / "Containerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continued line never ends"
    return out


def test_the_containerfile_builds_a_non_root_image_with_a_healthcheck():
    steps = containerfile()
    kinds = [k for k, _ in steps]
    assert kinds[0] == "FROM" and re.match(r"python:3\.1[1-4][\w.-]*-slim", steps[0][1])
    users = [v for k, v in steps if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert kinds.index("USER") < kinds.index("CMD")
    runs = " ".join(v for k, v in steps if k == "RUN")
    assert "pip install" in runs and re.search(r"pip install [^&]*\.", runs)
    for k, v in steps:
        if k == "COPY":
            for src in shlex.split(v)[:-1]:
                if not src.startswith("--"):
                    assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    health = next(v for k, v in steps if k == "HEALTHCHECK")
    assert "/healthz" in health
    cmd = json.loads(next(v for k, v in steps if k == "CMD"))
    assert cmd[:2] == ["mp", "serve"] and "--host" in cmd and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    text = (DEPLOY / "Containerfile").read_text()
    assert "MP_ALLOW_HOST" in text  # guidance: a public bind should name its Host


def test_the_containerfile_healthcheck_command_passes_against_a_live_server(tmp_path):
    health = next(v for k, v in containerfile() if k == "HEALTHCHECK")
    command = json.loads(health[health.index("CMD") + 3 :].strip())
    assert command[0] == "python"
    with running_server(tmp_path, "--db", ":memory:") as (base, proc):
        port = base.rsplit(":", 1)[1]
        env = {**os.environ, "MP_PORT": port}
        ok = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
    down = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
    assert down.returncode != 0  # and it fails once the server is gone


def test_mp_serve_starts_as_the_units_install_steps_leave_it(tmp_path):
    """The unit's own install comments, replayed in a temporary root: the files they create are enough for
    `mp serve` to start with the unit's environment (a missing config file or one the service user cannot
    read would make systemd restart it forever)."""
    text = (DEPLOY / "monitor-protocol.service").read_text()
    etc = tmp_path / "etc" / "monitor-protocol"
    made = []
    for line in text.splitlines():  # `#   install ... /etc/monitor-protocol/...` lines, in order
        words = line.lstrip("# ").split()
        if words[:1] == ["install"] and any(w.startswith("/etc/monitor-protocol") for w in words):
            mode = int(words[words.index("-m") + 1], 8)
            target = Path(str(tmp_path) + next(w for w in words if w.startswith("/etc/monitor-protocol")))
            if "-d" in words:
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.touch()
            target.chmod(mode)
            made.append((target, mode))
    unit = systemd_unit()
    env = dict(e.split("=", 1) for e in unit["Service"]["Environment"])
    config = Path(str(tmp_path) + env["MP_CONFIG"])
    assert config.exists(), f"the install steps never create {env['MP_CONFIG']}: {made}"
    assert config.stat().st_mode & 0o004 and etc.stat().st_mode & 0o001, "the service user cannot read it"
    state = tmp_path / "var" / "lib"
    run_env = {**mp_env(), **{k: v.replace("%S", str(state)) for k, v in env.items()}}
    run_env["MP_CONFIG"] = str(config)
    run_env["MP_PORT"] = "0"
    (state / "monitor-protocol").mkdir(parents=True)
    proc = subprocess.Popen(
        mp_command("serve"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=run_env, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "Monitor Protocol server on http://127.0.0.1:" in first, first + proc.stdout.read()
        url = first.split(" on ", 1)[1].split("/mp/v0", 1)[0]

        def healthy() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(healthy, interval=0.1, what="mp serve answers /healthz")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_mistyped_token_in_the_config_file_is_not_echoed(tmp_path):
    config = tmp_path / "mp.toml"
    config.write_text("registration_token = 12345678\n")
    done = subprocess.run(
        mp_command("serve", "--config", str(config), "--db", ":memory:", "--port", "0"),
        capture_output=True, text=True, env=mp_env(), timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "12345678" not in done.stdout + done.stderr
    assert "registration" in done.stderr  # it still says which setting is wrong


def test_an_upgraded_file_is_said_once_at_start(tmp_path: Path) -> None:
    """Found by an operator upgrading in place: a format-2 file was brought to format 3 without a word, and
    the build that wrote it refused the file afterwards. The start that upgrades it says so; the next one
    does not."""
    from enginekit import as_format_2
    from monitor_protocol.store.sqlite import SQLiteStore
    from serverutil import server_log, start_server, stop_server

    db = tmp_path / "old.db"
    SQLiteStore(str(db)).close()
    as_format_2(db)  # an empty database as format 2 wrote it
    said = "database: upgraded from format 2 to 3; a build that reads only the older format refuses it now"
    _base, proc = start_server(tmp_path, "--db", str(db))
    stop_server(proc)
    assert said in server_log(proc)
    _base, proc = start_server(tmp_path, "--db", str(db))
    stop_server(proc)
    assert "upgraded from format" not in server_log(proc)  # control: said the start it happened only


def test_a_logged_line_carries_no_control_character_a_client_sent():
    """Found by a tester: `--access-log` wrote a percent-decoded path as it came, so `%1B[2J` cleared the
    operator's terminal and a lone `%0D` made a forged line overwrite the real one (only `\\n` was handled).
    Control characters are written as \\xNN; the control: a tab and ordinary text stay as they are."""
    import logging

    from monitor_protocol.doors.http.server import UTCFormatter

    formatter = UTCFormatter("%(message)s")

    def line(message: str) -> str:
        return formatter.format(logging.LogRecord("t", logging.INFO, __file__, 1, message, None, None))

    sent = 'GET /mp/v0/monitors/ESC\x1b[2J\x1b[31mRED\x00NUL\x07 and CR\rforged\x9b "\u00e9t\u00e9"'
    assert line(sent) == (
        'GET /mp/v0/monitors/ESC\\x1b[2J\\x1b[31mRED\\x00NUL\\x07 and CR\\x0dforged\\x9b "\u00e9t\u00e9"'
    )
    assert line("a\ttab stays") == "a\ttab stays"
    assert line("two\nlines") == "two | lines"
    # The Unicode line and paragraph separators end a line for many log readers (a re-tester's finding)
    assert line("one\u2028forged\u2029line") == "one\\u2028forged\\u2029line"


def test_an_access_log_line_keeps_its_fields_whatever_the_path():
    """Found by a tester: a decoded `%22` in a path ended the quoted request field early, so a path could
    write a status and a client of its own choosing into the line. A quote, a space and a backslash are
    written percent-encoded; the control: an ordinary path and query, and a non-ASCII id, stay as they are."""
    from monitor_protocol.doors.http.targets import logged_target

    forged = logged_target('/mp/v0/monitors/x" 200 "-', b"")
    assert forged == "/mp/v0/monitors/x%22%20200%20%22-" and '"' not in forged
    assert logged_target("/a\\b c", b'q="1"&a=%20') == "/a%5Cb%20c?q=%221%22&a=%20"
    # a reviewer's: a decoded line feed split the line (and took the separators with it); `%` kept two
    # paths apart that logged alike (`/x%2522` and `/x%22`)
    assert logged_target("/b\n\u2029 \n200", b"") == "/b%0A%E2%80%A9%20%0A200"
    assert logged_target("/x%22", b"") == "/x%2522" != logged_target('/x"', b"")
    assert logged_target("/q", b"a=\x85") == "/q?a=%85"  # the query's own bytes
    assert (
        logged_target("/mp/v0/monitors/\u00e9t\u00e9/state", b"wait=5")
        == "/mp/v0/monitors/\u00e9t\u00e9/state?wait=5"
    )
