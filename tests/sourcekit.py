"""Helpers for the tests of sources that watch (docs/sources.md): a monitor's whole log read back, a local HTTP
target whose answer a test sets, a real `mp probe` process whose lines a test waits for, and whether a process
is alive."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from serverutil import bearer, mp_command, mp_env
from waiting import eventually

RUN = "com.example.ci.run"
T_SOURCE = "python.monitor-protocol.source"


class Api:
    """A few calls on a real server, each asserting its status."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base + "/mp/v0", timeout=30)
        self.readers: dict[str, tuple[str, str]] = {}

    def close(self) -> None:
        self.http.close()

    def create(self, monitor_id: str, **fields: Any) -> str:
        body = {"id": monitor_id, "types": [RUN], **fields}
        r = self.http.post("/monitors", json=body)
        assert r.status_code == 201, r.text
        return r.json()["owner_token"]

    def state(self, monitor_id: str, owner: str) -> dict[str, Any]:
        r = self.http.get(f"/monitors/{monitor_id}/state", headers=bearer(owner))
        assert r.status_code == 200, r.text
        return r.json()

    def configure(self, monitor_id: str, owner: str, action: str, body: dict[str, Any] | None = None) -> dict:
        r = self.http.post(
            f"/monitors/{monitor_id}/{action}", json=body or {"reason": "test"}, headers=bearer(owner)
        )
        assert r.status_code == 200, r.text
        return r.json()

    def log(self, monitor_id: str, owner: str) -> list[dict[str, Any]]:
        """Every row of the monitor's log, read as a replay (nothing committed)."""
        if monitor_id not in self.readers:
            r = self.http.post(
                "/subscriptions",
                json={"monitor": monitor_id, "subscriber": "agent:test-log"},
                headers=bearer(owner),
            )
            assert r.status_code == 201, r.text
            self.readers[monitor_id] = (r.json()["subscription"]["id"], r.json()["token"])
        sub, token = self.readers[monitor_id]
        rows: list[dict[str, Any]] = []
        cursor = 1
        while True:
            page = self.http.get(
                f"/subscriptions/{sub}/pull", params={"cursor": cursor, "limit": 200}, headers=bearer(token)
            )
            assert page.status_code == 200, page.text
            body = page.json()
            rows += body["observations"]
            if not body["observations"]:
                return rows
            cursor = body["next"]

    def observations(self, monitor_id: str, owner: str, type_: str = RUN) -> list[dict[str, Any]]:
        return [o for o in self.log(monitor_id, owner) if o["type"] == type_]

    def supervision(self, monitor_id: str, owner: str) -> list[dict[str, Any]]:
        return [o["data"]["payload"] for o in self.log(monitor_id, owner) if o["type"] == T_SOURCE]


class Target:
    """A local HTTP server answering GET with the status and body a test sets; it counts the requests."""

    def __init__(self, status: int = 200, body: bytes = b'{"status": "up"}') -> None:
        self.status, self.body, self.hits = status, body, 0
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                target.hits += 1
                self.send_response(target.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(target.body)))
                self.end_headers()
                self.wfile.write(target.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ProbeProcess:
    """A real `mp probe`, its stdout in a file a test reads line by line."""

    def __init__(self, tmp_path: Path, *args: str, name: str = "probe") -> None:
        self.out = tmp_path / f"{name}.out"
        self.err = tmp_path / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(mp_command("probe", *args), stdout=out, stderr=err, env=mp_env())

    def lines(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines()

    def wait_line(self, prefix: str, count: int = 1, timeout: float = 30) -> list[str]:
        return eventually(
            lambda: (
                (found := [x for x in self.lines() if x.startswith(prefix)]) and len(found) >= count and found
            ),
            timeout=timeout,
            what=f"{count} {prefix!r} line(s) from mp probe",
            detail=lambda: f"\nstdout:\n{self.out.read_text()}\nstderr:\n{self.err.read_text()}",
        )

    def stop(self, sig: int = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def run_probe(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mp_command("probe", *args), env=mp_env(), capture_output=True, text=True, timeout=timeout
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (dead, not yet reaped by its parent) is not watching anything.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
