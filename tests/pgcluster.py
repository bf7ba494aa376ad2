"""A throwaway PostgreSQL cluster for the tests: ``initdb`` into a fresh temporary directory, a server on a free
loopback port, removed again by ``stop()``. Standard library only (build.py runs it before the venv's psycopg
is involved).

The tests find the cluster through one environment variable, ``MP_TEST_POSTGRES``: a libpq URL of a database
where the test user may CREATE DATABASE (tests/conftest.py's ``pg_admin_url`` and ``pg_url`` fixtures).
``python3 build.py test`` starts one of these clusters and sets it, unless it is already set.

* ``initdb -U mp --auth=trust`` (no password; it listens on 127.0.0.1 only, its unix socket is in the temporary
  directory; only the role ``mp_password``, which a test creates, must give a password), ``--no-sync`` for
  initdb itself only: the server runs with ``fsync=on`` and ``synchronous_commit=on``, since the tests rely
  on durability semantics.
* PostgreSQL refuses to run as root: as root, the cluster belongs to the ``postgres`` system user (else
  ``nobody``), and initdb and pg_ctl run through ``runuser -u USER --`` (or ``su``).

    python3 tests/pgcluster.py start --state FILE   prints the URL, writes FILE (JSON: data dir, port, ...)
    python3 tests/pgcluster.py stop --state FILE    stops that cluster and removes its directory
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

USER = "mp"  # the cluster's superuser (initdb -U), the user in the URL
PASSWORD_ROLE = "mp_password"  # the one role that must give a password (scram-sha-256 over TCP); no such role
# is created here: a test that needs it creates it with a password of its own
CANDIDATE_OWNERS = ("postgres", "nobody")  # who owns the cluster when this runs as root
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "200",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
}
START_ATTEMPTS = 3  # a free port can be taken by someone else between finding it and the server binding it


def ci_is_true(value: str | None = None) -> bool:
    """Whether ``CI`` (or ``value``) is set to a true value: anything but empty, 0, false, no, off."""
    if value is None:
        value = os.environ.get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def find_bin_dir() -> Path | None:
    """The PostgreSQL server binaries: ``pg_config --bindir`` when pg_config is on PATH and that folder has
    initdb, else the highest ``/usr/lib/postgresql/<major>/bin`` with initdb (Debian's layout), else None."""
    if shutil.which("pg_config"):
        try:
            out = subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and (Path(out) / "initdb").is_file() and (Path(out) / "pg_ctl").is_file():
            return Path(out)
    found = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        major = Path(initdb).parents[1].name
        key = tuple(int(x) for x in re.findall(r"\d+", major))
        found.append((key, Path(initdb).parent))
    return max(found)[1] if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _owner() -> str | None:
    """The unprivileged user that runs the cluster when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in CANDIDATE_OWNERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError(
        "running as root and neither a `postgres` nor a `nobody` user exists; PostgreSQL refuses to run as "
        "root (create one: useradd --system postgres)"
    )


class Cluster:
    """One throwaway cluster. ``start()`` returns its URL; ``stop()`` stops it and removes its directory."""

    def __init__(self, bin_dir: Path | str | None = None) -> None:
        found = Path(bin_dir) if bin_dir else find_bin_dir()
        if found is None:
            raise RuntimeError("no PostgreSQL binaries found (pg_config --bindir, /usr/lib/postgresql/*/bin)")
        self.bin_dir: Path = found
        self.user: str | None = None  # the OS user running the server (None: the current user)
        self.dir: Path | None = None  # the temporary directory: data/, postgres.log, the unix socket
        self.port: int | None = None
        self.pid: int | None = None
        self.version: str = ""
        self._server = False  # pg_ctl start was run (before: only initdb, which a Ctrl-C ends by itself)

    # -- paths and URL
    @property
    def data_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "data"

    @property
    def logfile(self) -> Path:
        assert self.dir is not None
        return self.dir / "postgres.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the cluster is not started")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    # -- running its binaries
    def _cmd(self, argv: list[str]) -> list[str]:
        if self.user is None:
            return argv
        if shutil.which("runuser"):
            return ["runuser", "-u", self.user, "--", *argv]
        return ["su", "-s", "/bin/sh", self.user, "-c", "exec " + shlex.join(argv)]

    def _run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        for var in ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"):
            env.pop(var, None)
        return subprocess.run(
            self._cmd(argv),
            capture_output=True,
            text=True,
            env=env,
            cwd=self.dir,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # -- lifecycle
    def start(self) -> str:
        """initdb, configure, ``pg_ctl -w start``; returns the URL. On any failure (also Ctrl-C) whatever was
        created is stopped and removed before the exception propagates."""
        if self.dir is not None:
            raise RuntimeError("the cluster is already started")
        self.user = _owner()
        self.dir = Path(tempfile.mkdtemp(prefix="mp-pgcluster-"))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _start(self) -> None:
        assert self.dir is not None
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.version = self._run([str(self.bin_dir / "postgres"), "--version"]).stdout.strip()
        p = self._run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", USER, "--auth=trust",
             "-E", "UTF8", "--locale=C", "--no-sync"]
        )  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"initdb exited {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
        # One role must give a password over TCP (the others are trusted): what an operator sees when the
        # password is wrong is tested (tests/test_postgres_store.py). The first matching line wins.
        hba = self.data_dir / "pg_hba.conf"
        rules = hba.read_text()
        with hba.open("w") as f:  # rewritten in place: the file keeps its owner
            f.write(f"# tests/pgcluster.py\nhost all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n{rules}")
        conf = self.data_dir / "postgresql.conf"
        base = {**SETTINGS, "unix_socket_directories": f"'{self.dir}'"}
        with conf.open("a") as f:  # appended: later lines win, and the file keeps its owner
            f.write("\n# tests/pgcluster.py\n")
            f.writelines(f"{key} = {value}\n" for key, value in base.items())
        self._server = True
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            with conf.open("a") as f:
                f.write(f"port = {self.port}\n")
            p = self._run(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60", "start",
                 "-l", str(self.logfile)]
            )  # fmt: skip
            if p.returncode == 0:
                break
            log = self._log_tail()
            if attempt < START_ATTEMPTS and "could not bind" in log:
                continue
            raise RuntimeError(
                f"pg_ctl start exited {p.returncode}: {(p.stderr or p.stdout).strip()[-1000:]}\n"
                f"--- {self.logfile}:\n{log}"
            )
        try:
            self.pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            self.pid = None

    def stop(self) -> None:
        """``pg_ctl -m fast stop`` (``-m immediate`` if that fails), then remove the directory. Idempotent."""
        if self.dir is None:
            return
        try:
            if self._server and (self.data_dir / "postmaster.pid").exists():
                pg_ctl = str(self.bin_dir / "pg_ctl")
                p = self._run([pg_ctl, "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"])
                if p.returncode != 0:
                    print(
                        f"[pgcluster] pg_ctl -m fast stop exited {p.returncode}: "
                        f"{(p.stderr or p.stdout).strip()[-500:]}; trying -m immediate",
                        file=sys.stderr,
                    )
                    self._run([pg_ctl, "-D", str(self.data_dir), "-m", "immediate", "-w", "-t", "30", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
            self.port = None
            self.pid = None
            self._server = False

    # -- taking the server away and bringing it back (tests of a database that restarts under load)
    def stop_server(self, mode: str = "fast") -> None:
        """``pg_ctl -m MODE stop`` (``smart``, ``fast`` or ``immediate``: the last is a crash, recovered at the
        next start), keeping the data directory and the port: ``start_server()`` starts the same cluster
        again. ``stop()`` still removes everything afterwards, whether the server is running or not."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"pg_ctl stop mode must be smart, fast or immediate, not {mode!r}")
        if self.dir is None or not self._server:
            raise RuntimeError("the cluster is not started")
        p = self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "-t", "60", "stop"]
        )
        if p.returncode != 0:
            raise RuntimeError(
                f"pg_ctl -m {mode} stop exited {p.returncode}: {(p.stderr or p.stdout).strip()[-1000:]}\n"
                f"--- {self.logfile}:\n{self._log_tail()}"
            )
        self.pid = None

    def start_server(self) -> None:
        """``pg_ctl -w start`` on the same data directory and port again, after ``stop_server()``."""
        if self.dir is None or not self._server:
            raise RuntimeError("the cluster is not started")
        p = self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60", "start",
             "-l", str(self.logfile)]
        )  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(
                f"pg_ctl start exited {p.returncode}: {(p.stderr or p.stdout).strip()[-1000:]}\n"
                f"--- {self.logfile}:\n{self._log_tail()}"
            )
        try:
            self.pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            self.pid = None

    def restart(self, mode: str = "fast", down_seconds: float = 0.0) -> None:
        """``stop_server(mode)``, ``down_seconds`` of absence, ``start_server()``."""
        self.stop_server(mode)
        if down_seconds > 0:
            time.sleep(down_seconds)  # the point: the database is away this long
        self.start_server()

    # -- the state file of the CLI
    def state(self) -> dict:
        return {
            "url": self.url,
            "dir": str(self.dir),
            "data_dir": str(self.data_dir),
            "port": self.port,
            "bin_dir": str(self.bin_dir),
            "user": self.user,
            "pid": self.pid,
            "version": self.version,
            "log": str(self.logfile),
        }

    @classmethod
    def from_state(cls, state: dict) -> Cluster:
        cluster = cls(state["bin_dir"])
        cluster.dir = Path(state["dir"])
        cluster.port = state["port"]
        cluster.user = state["user"]
        cluster.pid = state["pid"]
        cluster.version = state.get("version", "")
        cluster._server = True
        return cluster

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pgcluster.py", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--state", required=True, type=Path, help="the JSON file describing the cluster")
    parser.add_argument("--bin-dir", type=Path, help="PostgreSQL binaries (default: found as find_bin_dir)")
    args = parser.parse_args(argv)
    if args.command == "start":
        try:
            cluster = Cluster(args.bin_dir)
            url = cluster.start()
        except RuntimeError as exc:
            print(f"[pgcluster] ERROR: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("[pgcluster] interrupted: what was started is stopped and removed", file=sys.stderr)
            return 130
        try:
            tmp = args.state.with_name(args.state.name + ".tmp")
            tmp.write_text(json.dumps(cluster.state(), indent=1) + "\n")
            os.replace(tmp, args.state)
        except BaseException:
            cluster.stop()
            raise
        print(url, flush=True)
        return 0
    try:
        state = json.loads(args.state.read_text())
    except FileNotFoundError:
        print(f"[pgcluster] {args.state} does not exist: nothing to stop", file=sys.stderr)
        return 0
    Cluster.from_state(state).stop()
    args.state.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
