"""HTTP push (`protocol: "http"`, PROTOCOL.md section 9): Standard Webhooks signatures, commit on 2xx only,
retry with backoff, retire on 410. The receiver is a real local HTTP server (http.server in a thread).

Waits are hang guards only: each test waits for the deliveries it expects, never for an amount of time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from monitor_protocol.push import Pusher, backoff, sign, verify
from monitor_protocol.service import MonitorService
from monitor_protocol.store.sqlite import SQLiteStore

TYPE = "com.example.ci.run"
GUARD_SECONDS = 30.0


@dataclass
class Receiver:
    """Answers each POST with the next scripted status (then 200 forever); records what it accepted."""

    secret: str = ""
    script: list[int] = field(default_factory=list)
    accepted: list[dict[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    bad_signatures: int = 0
    attempts: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        with self.changed:
            self.attempts += 1
            if not verify(self.secret, headers, body):
                self.bad_signatures += 1
                status = 400
            else:
                status = self.script.pop(0) if self.script else 200
                if 200 <= status < 300:
                    self.accepted.append(json.loads(body))
                    self.ids.append(headers["webhook-id"])
            self.changed.notify_all()
            return status

    def seqs(self) -> list[int]:
        return [int(o["id"]) for batch in self.accepted for o in batch["observations"]]

    def wait_for(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + GUARD_SECONDS
        with self.changed:
            while not done():
                left = deadline - time.monotonic()
                assert left > 0, f"receiver state: attempts={self.attempts} seqs={self.seqs()}"
                self.changed.wait(left)


def serve_receiver(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            status = receiver.handle(dict(self.headers.items()), body)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Engine:
    service: MonitorService
    executor: ThreadPoolExecutor

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    executor = ThreadPoolExecutor(max_workers=1)
    loop = asyncio.get_running_loop()
    store = await loop.run_in_executor(executor, SQLiteStore, str(tmp_path / "push.db"))
    service = await loop.run_in_executor(executor, lambda: MonitorService(store, clock=time.time))
    yield Engine(service, executor)
    await loop.run_in_executor(executor, store.close)
    executor.shutdown()


async def setup(engine: Engine, sink: str, **sub: Any) -> tuple[str, dict[str, Any]]:
    owner = (await engine.call(engine.service.create_monitor, {"id": "ci", "types": [TYPE]}, None))[
        "owner_token"
    ]
    body = {
        "monitor": "ci",
        "subscriber": "hook:ci",
        "protocol": "http",
        "sink": sink,
        "filter": {"types": [TYPE]},
    }
    body.update(sub)
    subscribed = await engine.call(engine.service.subscribe, body, owner)
    return owner, subscribed


async def publish(engine: Engine, owner: str, *subjects: str) -> list[int]:
    out = []
    for s in subjects:
        reply = await engine.call(engine.service.publish, "ci", {"type": TYPE, "subject": s}, owner)
        out.append(reply["seq"])
    return out


async def wait_in_thread(fn: Callable[[], None]) -> None:
    await asyncio.get_running_loop().run_in_executor(None, fn)


def test_signature_is_standard_webhooks() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    # The Standard Webhooks specification's published example.
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    assert verify(secret, headers, body)
    assert not verify(secret, headers, body + b" ")
    assert not verify("whsec_" + "A" * 32, headers, body)
    assert all(0.25 <= backoff(1) <= 0.5 for _ in range(20))
    assert backoff(30) <= 60.0


async def test_push_fails_then_recovers_nothing_lost_nothing_committed_early(engine: Engine) -> None:
    receiver = Receiver(script=[500, 503])
    server = serve_receiver(receiver)
    sink = f"http://127.0.0.1:{server.server_address[1]}/hook"
    owner, subscribed = await setup(engine, sink)
    receiver.secret = subscribed["sink_secret"]
    assert receiver.secret.startswith("whsec_")
    sub_id = subscribed["subscription"]["id"]
    seqs = await publish(engine, owner, "b1", "b2")
    pusher = Pusher(engine.call, engine.service, backoff=lambda attempt: 0.05)
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.seqs() == seqs))
        assert receiver.attempts == 3 and receiver.bad_signatures == 0
        # The retried batch is the same batch (same webhook-id) and is marked redelivered.
        assert receiver.ids == [f"{sub_id}:{seqs[0]}-{seqs[1]}"]
        assert all(o.get("redelivered") for o in receiver.accepted[0]["observations"])

        # A sink that is down: nothing is committed that it did not receive.
        receiver.script = [500] * 3
        more = await publish(engine, owner, "b3")
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.attempts >= 5))
        info = (await engine.call(engine.service.push_targets))[0]
        assert info["cursor"] == seqs[-1] + 1
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.seqs() == seqs + more))
        # Appends wake delivery: a later observation arrives without any timer.
        later = await publish(engine, owner, "b4", "b5")
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.seqs()[-2:] == later))
        assert receiver.seqs() == seqs + more + later  # in order, nothing lost, nothing twice
        deadline = time.monotonic() + GUARD_SECONDS
        while (await engine.call(engine.service.push_targets))[0]["cursor"] != later[-1] + 1:
            assert time.monotonic() < deadline, "the last delivered batch was never committed"
            await asyncio.sleep(0.02)  # the commit follows the 2xx
        assert receiver.seqs() == seqs + more + later  # and nothing was sent again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


async def test_push_410_retires_the_subscription(engine: Engine) -> None:
    receiver = Receiver(script=[410])
    server = serve_receiver(receiver)
    sink = f"http://127.0.0.1:{server.server_address[1]}/hook"
    owner, subscribed = await setup(engine, sink, sink_secret="whsec_" + "QUJD" * 8)
    receiver.secret = "whsec_" + "QUJD" * 8
    sub_id = subscribed["subscription"]["id"]
    await publish(engine, owner, "gone")
    pusher = Pusher(engine.call, engine.service, backoff=lambda attempt: 0.05)
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.attempts == 1))
        deadline = time.monotonic() + GUARD_SECONDS
        while await engine.call(engine.service.push_targets):  # until the retirement is committed
            assert time.monotonic() < deadline, "the 410 did not retire the subscription"
            await asyncio.sleep(0.02)
        assert receiver.bad_signatures == 0 and receiver.accepted == []
        with pytest.raises(Exception) as retired:
            await engine.call(lambda: engine.service.pull_as_system(sub_id))
        assert getattr(retired.value, "code", None) == "NOT_FOUND"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


def test_delivery_task_runs_as_a_background_task_of_the_http_door(tmp_path: Path) -> None:
    """`create_app(..., background_tasks=[delivery_task])` under uvicorn, driven over HTTP by the client."""
    import socket

    import uvicorn
    from monitor_protocol.binding.asgi import create_app
    from monitor_protocol.binding.rest import RestRouter
    from monitor_protocol.client import Client
    from monitor_protocol.push import delivery_task

    store = SQLiteStore(str(tmp_path / "door.db"))
    service = MonitorService(store, clock=time.time)
    app = create_app(service, RestRouter(service), store=store, background_tasks=[delivery_task])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    receiver = Receiver(script=[500])
    sink_server = serve_receiver(receiver)
    sink = f"http://127.0.0.1:{sink_server.server_address[1]}/hook"
    try:
        deadline = time.monotonic() + GUARD_SECONDS
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        with Client(base) as c:
            owner = c.create_monitor("ci", types=[TYPE]).owner_token
            sub = c.subscribe(
                "ci", "hook:ci", protocol="http", sink=sink, filter={"types": [TYPE]}, token=owner
            )
            receiver.secret = sub.sink_secret or ""
            seqs = [c.publish("ci", TYPE, subject=s, token=owner).seq for s in ("a", "b")]
        receiver.wait_for(lambda: receiver.seqs() == seqs)
        assert receiver.attempts == 2 and receiver.bad_signatures == 0
        with Client(base, sub.token) as reader:
            while reader.pull(sub.subscription.id, cursor=0, limit=1).cursor != seqs[-1] + 1:
                assert time.monotonic() < deadline + GUARD_SECONDS, "the delivered batch was never committed"
                time.sleep(0.05)
    finally:
        server.should_exit = True
        thread.join(timeout=GUARD_SECONDS)
        sink_server.shutdown()
        sock.close()
