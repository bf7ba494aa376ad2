"""Start a real `mp serve` process for tests: `with running_server(tmp_path, *args) as (base_url, proc)`.

The server listens on a free port (`--port 0`; the URL is read from its start-up lines) and uses
`tmp_path/mp.db` unless the extra arguments name a `--db`. Its output goes to `tmp_path/serve-<n>.log`
(`server_log(proc)` reads it), so a chatty server can never block on a full pipe. `base_url` is the root,
e.g. `http://127.0.0.1:40123`; routes live under `base_url + "/mp/v0"`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
from waiting import eventually

ROOT = Path(__file__).resolve().parents[1]
START_DEADLINE_SECONDS = 30.0
URL_LINE = re.compile(r"Monitor Protocol server on (http://\S+?)/mp/v0")
_counter = itertools.count(1)


def mp_command(*args: str) -> list[str]:
    """The `mp` console script run with this interpreter (works without an installed entry point)."""
    return [sys.executable, "-m", "monitor_protocol", *args]


def mp_env() -> dict[str, str]:
    env = dict(os.environ)
    engine = str(ROOT / "engine")
    env["PYTHONPATH"] = engine + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def server_log(proc: subprocess.Popen) -> str:
    path = getattr(proc, "log_path", None)
    return Path(path).read_text(errors="replace") if path else ""


def start_server(tmp_path: Path, *extra_args: str, port: int = 0) -> tuple[str, subprocess.Popen]:
    """Start `mp serve` and return once /mp/v0/discover answers (raises with the log if it never does)."""
    args = list(extra_args)
    if "--db" not in args:
        args += ["--db", str(tmp_path / "mp.db")]
    if "--port" not in args:
        args += ["--port", str(port)]
    log_path = tmp_path / f"serve-{next(_counter)}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns it for its lifetime
    proc = subprocess.Popen(
        mp_command("serve", *args), stdout=log, stderr=subprocess.STDOUT, env=mp_env(), cwd=str(tmp_path)
    )
    log.close()
    proc.log_path = str(log_path)  # type: ignore[attr-defined]

    def answering() -> str | None:
        if proc.poll() is not None:
            raise RuntimeError(f"mp serve exited with {proc.returncode}:\n{server_log(proc)}")
        found = URL_LINE.search(server_log(proc))
        if found is None:
            return None
        try:
            answered = httpx.get(found.group(1) + "/mp/v0/discover", timeout=2).status_code == 200
        except httpx.HTTPError:
            answered = False
        return found.group(1) if answered else None

    try:
        return eventually(answering, timeout=START_DEADLINE_SECONDS, what="mp serve answering"), proc
    except AssertionError:
        stop_server(proc)
        raise RuntimeError(
            f"mp serve did not answer within {START_DEADLINE_SECONDS}s:\n{server_log(proc)}"
        ) from None


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def running_server(tmp_path: Path, *extra_args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    base, proc = start_server(tmp_path, *extra_args)
    try:
        yield base, proc
    finally:
        stop_server(proc)


def long_polls_parked(base: str) -> int:
    """How many long polls the server at `base` holds parked right now (its /metrics gauge; loopback needs no
    token): a test waits for it instead of sleeping while a poll "surely" parks."""
    text = httpx.get(base + "/metrics", timeout=10).text
    found = re.search(r"^mp_long_polls_parked (\S+)$", text, re.M)
    assert found, text
    return int(float(found.group(1)))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def with_user(url: str, user: str, password: str | None = None) -> str:
    """``url`` connecting as ``user`` (with ``password``), whatever user it named (a URL or key=value)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(url)
        who = urllib.parse.quote(user, safe="")
        if password is not None:
            who += ":" + urllib.parse.quote(password, safe="")
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{who}@{parts.netloc.rpartition('@')[2]}"))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, user=user, **({} if password is None else {"password": password}))
