"""`mp serve` itself runs HTTP push: a real server delivers a signed batch to a local sink and commits it."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from monitor_protocol.doors.push import verify
from serverutil import mp_command, mp_env, running_server, server_log
from waiting import eventually


class Sink:
    def __init__(self) -> None:
        self.batches: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                sink.headers.append({k.lower(): v for k, v in self.headers.items()})
                sink.bodies.append(body)
                sink.batches.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_mp_serve_pushes_signed_batches_and_commits_them(tmp_path):
    sink = Sink()
    try:
        # The sink is on loopback: push refuses it unless the operator allows it (docs/protocol.md section 9).
        with running_server(tmp_path, "--db", str(tmp_path / "push.db"), "--allow-sink", "127.0.0.1") as (
            base,
            _proc,
        ):
            api = base + "/mp/v0"
            owner = httpx.post(f"{api}/monitors", json={"id": "ci", "types": ["com.example.ci.run"]}).json()[
                "owner_token"
            ]
            sub = httpx.post(
                f"{api}/subscriptions",
                json={
                    "monitor": "ci",
                    "subscriber": "webhook:receiver",
                    "protocol": "http",
                    "sink": sink.url,
                    "filter": {"types": ["com.example.ci.run"]},
                },
                headers={"authorization": f"Bearer {owner}"},
            ).json()
            r = httpx.post(
                f"{api}/monitors/ci/observations",
                json={"type": "com.example.ci.run", "subject": "build-1", "actor": "probe:ci"},
                headers={"authorization": f"Bearer {owner}"},
            )
            assert r.status_code == 201
            seq = r.json()["seq"]

            def committed() -> dict | None:
                info = httpx.get(
                    f"{api}/subscriptions/{sub['subscription']['id']}",
                    headers={"authorization": f"Bearer {sub['token']}"},
                ).json()
                return info if info["cursor"] > seq else None

            info = eventually(committed, what="the pushed observation is committed")
            delivered = [o for b in sink.batches for o in b["observations"]]
            assert [o["subject"] for o in delivered] == ["build-1"]
            assert verify(sub["sink_secret"], sink.headers[0], sink.bodies[0])
            assert not verify(sub["sink_secret"], sink.headers[0], sink.bodies[0] + b" ")  # control
            assert info is not None and info["cursor"] == seq + 1 and info["lag"] == 0  # committed on 2xx
    finally:
        sink.server.shutdown()


def test_mp_serve_refuses_non_public_sinks_unless_allowed(tmp_path):
    """Every sink here is on loopback or refused before anything is sent: no test traffic leaves the machine."""
    sink = Sink()
    try:
        with running_server(tmp_path, "--allow-sink", "127.0.0.0/8") as (base, proc):
            api = base + "/mp/v0"
            owner = httpx.post(f"{api}/monitors", json={"id": "ci", "types": ["com.example.ci.run"]}).json()[
                "owner_token"
            ]
            for url in (
                "http://[::1]:9/hook",
                "http://169.254.169.254/latest/meta-data",
                "http://10.0.0.1/h",
            ):
                r = httpx.post(
                    f"{api}/subscriptions",
                    json={"monitor": "ci", "subscriber": "webhook:r", "protocol": "http", "sink": url},
                    headers={"authorization": f"Bearer {owner}"},
                )
                assert r.status_code == 400, r.text
                assert r.json()["code"] == "INVALID" and "--allow-sink" in r.json()["error"]
            # Positive control: a loopback sink inside the allowed network is accepted.
            r = httpx.post(
                f"{api}/subscriptions",
                json={"monitor": "ci", "subscriber": "webhook:ok", "protocol": "http", "sink": sink.url},
                headers={"authorization": f"Bearer {owner}"},
            )
            assert r.status_code == 201, r.text
        assert "push sinks allowed beyond public addresses: 127.0.0.0/8" in server_log(proc)
    finally:
        sink.server.shutdown()


def test_mp_serve_refuses_an_unusable_allow_sink_entry(tmp_path):
    done = subprocess.run(
        mp_command("serve", "--db", str(tmp_path / "x.db"), "--port", "0", "--allow-sink", "10.0.0.0/99"),
        env=mp_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--allow-sink" in done.stderr
