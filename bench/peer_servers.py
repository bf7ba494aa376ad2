"""The peers of ``bench/peers.py``: installing them, and each one as a throwaway server on a free loopback port.

Every server lives in its own temporary directory, is a child process of the benchmark, and is stopped when its
``with`` block exits (also on an error or Ctrl-C): SIGTERM, then SIGKILL. Nothing here touches a system
instance: the Debian packages are installed for their binaries only (the container's policy-rc.d keeps their
services from starting, and none of them is used).

* Redis: ``appendonly yes``, ``appendfsync always`` (an fsync of the AOF before the replies of each event-loop
  iteration leave), ``save ""`` (no RDB snapshots).
* PostgreSQL 15: a fresh cluster (``initdb`` as an unprivileged user, since PostgreSQL refuses to run as root),
  ``fsync=on``, ``synchronous_commit=on``, its unix socket in the temporary directory; clients use TCP on
  127.0.0.1 like every other system here.
* NATS: ``-js -sd <tmp>`` (JetStream with file storage).
"""

from __future__ import annotations

import importlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import _stop

# The Python clients, pinned here and installed into the venv running the bench (not in pyproject.toml:
# they are the peers' clients, not the project's dependencies). Import name -> pip requirement.
CLIENT_PINS: dict[str, str] = {
    "redis": "redis==8.1.0",
    "psycopg": "psycopg[binary]==3.3.9",
    "nats": "nats-py==2.16.0",
}
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# System -> (Debian package, the binary it provides).
APT_PACKAGES: dict[str, tuple[str, Path]] = {
    "redis": ("redis-server", Path("/usr/bin/redis-server")),
    "postgres": ("postgresql", PG_BIN / "postgres"),
    "nats": ("nats-server", Path("/usr/sbin/nats-server")),
}
PG_USER = "mpbench"  # the unprivileged OS user that owns the throwaway cluster when we run as root


def log(msg: str) -> None:
    print(f"[peers] {msg}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- install
def ensure_apt(systems: list[str]) -> dict[str, str]:
    """Install the Debian packages whose binaries are missing (one ``apt-get update``, then one install).
    Returns system -> why it cannot run, for those still missing afterwards; an apt failure says so loudly."""
    missing = {s: APT_PACKAGES[s] for s in systems if not APT_PACKAGES[s][1].exists()}
    if not missing:
        return {}
    packages = sorted({pkg for pkg, _ in missing.values()})
    log(f"installing with apt-get: {' '.join(packages)} (missing: {', '.join(sorted(missing))})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    failed: dict[str, str] = {}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = f"`{' '.join(cmd)}` failed: {exc!r}"
            break
        if p.returncode != 0:
            reason = f"`{' '.join(cmd)}` exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}"
            break
    else:
        reason = ""
    if reason:
        log("!" * 100)
        log(f"APT FAILED: {reason}")
        log("!" * 100)
    for system, (pkg, binary) in missing.items():
        if not binary.exists():
            failed[system] = reason or f"apt-get installed {pkg} but {binary} is still missing"
        else:
            log(f"installed {pkg} ({binary})")
    return failed


def ensure_clients(systems: list[str]) -> dict[str, str]:
    """pip-install the pinned clients that are not importable (into sys.executable's environment).
    Returns system -> why its client is unavailable."""
    module_of = {"redis": "redis", "postgres": "psycopg", "nats": "nats"}
    todo = {s: CLIENT_PINS[module_of[s]] for s in systems if not _importable(module_of[s])}
    if not todo:
        return {}
    reqs = sorted(set(todo.values()))
    log(f"installing with pip into {sys.prefix}: {' '.join(reqs)}")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", *reqs], capture_output=True, text=True
    )
    if p.returncode != 0:
        log(f"PIP FAILED (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
    importlib.invalidate_caches()
    reason = f"pip install failed: {(p.stderr or p.stdout).strip()[-400:]}"
    return {s: reason for s in todo if not _importable(module_of[s])}


def _importable(module: str) -> bool:
    # In a child process: this process may have failed an import of it before the install.
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------------------- servers
@dataclass
class Peer:
    """A running throwaway server: its process, where clients connect, and facts for the results."""

    system: str
    proc: subprocess.Popen[bytes]
    port: int
    conn: dict[str, Any]  # what a load process needs to connect (passed in its JSON spec)
    version: str
    settings: dict[str, Any] = field(default_factory=dict)


def _wait_port(proc: subprocess.Popen[bytes], port: int, logfile: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = logfile.read_text(errors="replace")[-1500:] if logfile.exists() else ""
            raise RuntimeError(f"exited with {proc.returncode}: {tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"not listening on 127.0.0.1:{port} after {timeout} s")


def _version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError as exc:
        return f"unknown ({exc})"


@contextmanager
def redis_server(tmp: Path) -> Iterator[Peer]:
    port = free_port()
    logfile = tmp / "redis.log"
    settings = {"appendonly": "yes", "appendfsync": "always", "save": ""}
    cmd = [str(APT_PACKAGES["redis"][1]), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp)]
    for key, value in settings.items():
        cmd += [f"--{key}", value]
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_port(proc, port, logfile)
        version = _version([str(APT_PACKAGES["redis"][1]), "--version"])
        yield Peer("redis", proc, port, {"host": "127.0.0.1", "port": port}, version, settings)
    finally:
        _stop(proc)


@contextmanager
def nats_server(tmp: Path) -> Iterator[Peer]:
    port = free_port()
    logfile = tmp / "nats.log"
    store = tmp / "jetstream"
    cmd = [
        str(APT_PACKAGES["nats"][1]),
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        "-js",
        "-sd",
        str(store),
        "-l",
        str(logfile),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(proc, port, logfile)
        version = _version([str(APT_PACKAGES["nats"][1]), "--version"])
        settings = {"jetstream": True, "store_dir": str(store), "storage": "file"}
        yield Peer("nats", proc, port, {"url": f"nats://127.0.0.1:{port}"}, version, settings)
    finally:
        _stop(proc)


def _pg_owner() -> tuple[int, int] | None:
    """(uid, gid) to own the cluster: our own when not root (None), else an unprivileged system user."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(PG_USER)
    except KeyError:
        log(
            f"creating the system user {PG_USER} to own the throwaway PostgreSQL cluster (initdb refuses root)"
        )
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
            capture_output=True,
        )
        pw = pwd.getpwnam(PG_USER)
    return pw.pw_uid, pw.pw_gid


@contextmanager
def postgres_server(tmp: Path) -> Iterator[Peer]:
    owner = _pg_owner()
    as_owner: dict[str, Any] = {}
    if owner:
        os.chown(tmp, *owner)
        as_owner = {"user": owner[0], "group": owner[1], "extra_groups": []}
    data, sockdir, logfile = tmp / "data", tmp / "sock", tmp / "postgres.log"
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    p = subprocess.run(
        [str(PG_BIN / "initdb"), "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8", "--no-sync"],
        capture_output=True, text=True, env=env, cwd=tmp, **as_owner,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"initdb exited {p.returncode}: {(p.stderr or p.stdout).strip()[-1500:]}")
    (sockdir).mkdir()
    if owner:
        os.chown(sockdir, *owner)
    port = free_port()
    settings = {"fsync": "on", "synchronous_commit": "on", "listen_addresses": "127.0.0.1"}
    cmd = [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sockdir)]
    for key, value in settings.items():
        cmd += ["-c", f"{key}={value}"]
    with open(logfile, "wb") as out:
        if owner:
            os.fchown(out.fileno(), *owner)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, **as_owner)
    try:
        _wait_port(proc, port, logfile)
        version = _version([str(PG_BIN / "postgres"), "--version"])
        conn = {"conninfo": f"host=127.0.0.1 port={port} user=bench dbname=postgres"}
        yield Peer("postgres", proc, port, conn, version, {**settings, "initdb": "--auth=trust"})
    finally:
        # SIGINT is PostgreSQL's "fast" shutdown: it ends the backends instead of waiting for them.
        _stop(proc, signal.SIGINT)


SERVERS = {"redis": redis_server, "postgres": postgres_server, "nats": nats_server}


@contextmanager
def peer(system: str, parent: Path) -> Iterator[Peer]:
    """One throwaway server of ``system`` in a new temporary directory under ``parent``, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=parent))
    try:
        with SERVERS[system](tmp) as p:
            yield p
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- CPU
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu(pid: int) -> float:
    """CPU seconds of a server and its children: utime+stime+cutime+cstime of the process, plus that of every
    live child. PostgreSQL serves each connection in a child of the postmaster; a child that exited is in the
    postmaster's cutime/cstime once reaped."""
    total = 0.0
    for _ in range(5):
        me = _stat(pid)
        if not me:
            return total
        total = sum(int(x) for x in me[11:15]) / CLK_TCK
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                st = _stat(int(entry.name))
                # the fields after the name: state, ppid, ...
                if st and st[1] == str(pid):
                    total += sum(int(x) for x in st[11:15]) / CLK_TCK
        # A child reaped during the scan would be in neither sum: then the parent's cutime moved, so rescan.
        again = _stat(pid)
        if again and again[11:15] == me[11:15]:
            break
    return total
