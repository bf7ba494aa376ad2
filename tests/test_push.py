"""HTTP push (`protocol: "http"`, docs/protocol.md section 9): Standard Webhooks signatures, commit on 2xx only,
retry with backoff, retire on 410. The receiver is a real local HTTP server (http.server in a thread).

Waits are hang guards only: each test waits for the deliveries it expects, never for an amount of time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from monitor_protocol.core import netguard
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.vocab import T_SUBSCRIPTION_RETIRED
from monitor_protocol.doors.push import Pusher, backoff, sign, verify
from monitor_protocol.store.sqlite import SQLiteStore
from waiting import eventually, eventually_async

TYPE = "com.example.ci.run"
GUARD_SECONDS = 30.0
# The receivers run on loopback, which push refuses unless the operator allows it (docs/protocol.md section 9).
LOOPBACK_SINKS = ("127.0.0.1",)


@dataclass
class Receiver:
    """Answers each POST with the next scripted status (then 200 forever); records what it accepted."""

    secret: str = ""
    script: list[int] = field(default_factory=list)
    accepted: list[dict[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    bad_signatures: int = 0
    attempts: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        with self.changed:
            self.attempts += 1
            self.hosts.append({k.lower(): v for k, v in headers.items()}.get("host", ""))
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
    service = await loop.run_in_executor(
        executor, lambda: MonitorService(store, clock=time.time, allowed_sinks=LOOPBACK_SINKS)
    )
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


async def cursor_is(engine: Engine, cursor: int) -> bool:
    """The (first) push subscription's committed cursor is `cursor`: a check for `eventually_async`."""
    return (await engine.call(engine.service.push_targets))[0]["cursor"] == cursor


async def no_push_targets(engine: Engine) -> bool:
    return not await engine.call(engine.service.push_targets)


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
    at = 1614265330  # the receiver's clock at delivery (the example is from 2021; verify refuses replays)
    assert verify(secret, headers, body, now=at)
    assert not verify(secret, headers, body + b" ", now=at)
    assert not verify("whsec_" + "A" * 32, headers, body, now=at)
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
        await eventually_async(  # the commit follows the 2xx
            lambda: cursor_is(engine, later[-1] + 1),
            timeout=GUARD_SECONDS,
            what="the last delivered batch is committed",
        )
        assert receiver.seqs() == seqs + more + later  # and nothing was sent again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


async def test_push_410_retires_the_subscription(engine: Engine) -> None:
    receiver = Receiver(script=[410])
    server = serve_receiver(receiver)
    sink = f"http://127.0.0.1:{server.server_address[1]}/hook/T00/XOXB-SECRET?sig=abc"
    owner, subscribed = await setup(engine, sink, sink_secret="whsec_" + "QUJD" * 8)
    receiver.secret = "whsec_" + "QUJD" * 8
    sub_id = subscribed["subscription"]["id"]
    await publish(engine, owner, "gone")
    pusher = Pusher(engine.call, engine.service, backoff=lambda attempt: 0.05)
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.attempts == 1))
        await eventually_async(
            lambda: no_push_targets(engine),
            timeout=GUARD_SECONDS,
            what="the 410 retires the subscription (committed)",
        )
        assert receiver.bad_signatures == 0 and receiver.accepted == []
        with pytest.raises(Exception) as retired:
            await engine.call(lambda: engine.service.pull_as_system(sub_id))
        assert getattr(retired.value, "code", None) == "NOT_FOUND"
        # the row says why, where every reader of the monitor reads it: the sink's host, never its path or
        # query (found by a tester: a webhook URL's credential was shown to anonymous readers)
        rows = (await engine.call(lambda: engine.service.read_log("ci", 1, 200)))["observations"]
        (will,) = [o for o in rows if o["type"] == T_SUBSCRIPTION_RETIRED]
        said = json.dumps(will["data"])
        assert "410" in said and "127.0.0.1" in said and "XOXB-SECRET" not in said and "sig=abc" not in said
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


async def test_a_reader_token_renews_a_push_subscription_but_cannot_move_its_sink(engine: Engine) -> None:
    """Found by a tester: the reader token of an owner-made push subscription re-subscribed it with another
    sink, and the next batch went there. Where the server POSTs is the owner's (or subscribe token's)
    choice; the reader's own token renews it as it is (control), and the owner may move it (control)."""
    owner, subscribed = await setup(engine, "http://127.0.0.1:9/hook")
    reader = subscribed["token"]
    base = {"monitor": "ci", "subscriber": "hook:ci", "protocol": "http"}
    for moved in ({"sink": "http://127.0.0.1:9/STOLEN"}, {"sink_secret": "whsec_" + "QUJD" * 8}):
        with pytest.raises(ProtocolError) as refused:
            await engine.call(engine.service.subscribe, {**base, **moved}, reader)
        assert refused.value.code == "UNAUTHORIZED", moved
    renewed = await engine.call(engine.service.subscribe, {**base, "sink": "http://127.0.0.1:9/hook"}, reader)
    assert renewed["subscription"]["sink"] == "http://127.0.0.1:9/hook"
    renewed = await engine.call(engine.service.subscribe, base, renewed["token"])  # the sink as it is
    assert renewed["subscription"]["sink"] == "http://127.0.0.1:9/hook"
    moved = await engine.call(engine.service.subscribe, {**base, "sink": "http://127.0.0.1:9/new"}, owner)
    assert moved["subscription"]["sink"] == "http://127.0.0.1:9/new"


async def test_a_sink_reply_is_read_only_so_far() -> None:
    """Found by a tester: a sink answering 200 with a 400 MB body grew the server by 400 MB (the whole reply
    was read). Only the status is used: at most MAX_REPLY_BYTES are read, then the reply is closed."""
    from monitor_protocol.doors.push import MAX_REPLY_BYTES

    pulled = []

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(100_000):  # 6.4 GB if it were all read
            pulled.append(1)
            yield b"x" * 65536

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in endless():
                yield chunk

    response = httpx.Response(200, stream=Endless())
    await Pusher._drain(response)
    assert response.status_code == 200 and len(pulled) <= MAX_REPLY_BYTES // 65536 + 2


def test_delivery_task_runs_as_a_background_task_of_the_http_door(tmp_path: Path) -> None:
    """`MonitorApp(..., background_tasks=[delivery_task])` under uvicorn, driven over HTTP by the client."""
    import socket

    import uvicorn
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.client import Client
    from monitor_protocol.doors.http.app import MonitorApp
    from monitor_protocol.doors.push import delivery_task

    store = SQLiteStore(str(tmp_path / "door.db"))
    service = MonitorService(store, clock=time.time, allowed_sinks=LOOPBACK_SINKS)
    app = MonitorApp(service, RestRouter(service), store=store, background_tasks=[delivery_task])
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
        eventually(lambda: server.started, timeout=GUARD_SECONDS, interval=0.02, what="uvicorn starts")
        with Client(base) as c:
            owner = c.create_monitor("ci", types=[TYPE]).owner_token
            sub = c.subscribe(
                "ci", "hook:ci", protocol="http", sink=sink, filter={"types": [TYPE]}, token=owner
            )
            receiver.secret = sub.sink_secret or ""
            seqs = [c.publish("ci", TYPE, subject=s, token=owner).seq for s in ("a", "b")]
        receiver.wait_for(lambda: receiver.seqs() == seqs)
        # One failure, then the batch again; "b" rode along only if it was there before the first try
        # (a failed batch is retried unchanged, so a later "b" waits for its own batch).
        assert receiver.attempts in (2, 3) and receiver.bad_signatures == 0
        with Client(base, sub.token) as reader:
            eventually(
                lambda: reader.pull(sub.subscription.id, cursor=0, limit=1).cursor == seqs[-1] + 1,
                timeout=GUARD_SECONDS,
                what="the delivered batch is committed",
            )
    finally:
        server.should_exit = True
        thread.join(timeout=GUARD_SECONDS)
        sink_server.shutdown()
        sock.close()


# -- the sink guard at delivery (docs/protocol.md section 9) ------------------------------------------------------


def _is_loopback(host: Any) -> bool:
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return str(host).lower() == "localhost"


@dataclass
class NetworkGuard:
    """Records every connection, name lookup and HTTP request the code under test attempts."""

    connects: list[Any] = field(default_factory=list)
    lookups: list[Any] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def foreign(self) -> list[Any]:
        return [a for a in self.connects if not _is_loopback(a[0])] + [
            h for h in self.lookups if not _is_loopback(h)
        ]


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> NetworkGuard:
    """Only loopback may be reached: anything else is refused here (and recorded, so a test can prove
    the code never even tried)."""
    guard = NetworkGuard()
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )
    real_send = httpx.AsyncClient.send

    def connect(self: socket.socket, address: Any) -> Any:
        guard.connects.append(address)
        if isinstance(address, tuple) and not _is_loopback(address[0]):
            raise ConnectionRefusedError(f"test guard: no connection to {address!r}")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        guard.connects.append(address)
        if isinstance(address, tuple) and not _is_loopback(address[0]):
            raise ConnectionRefusedError(f"test guard: no connection to {address!r}")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        guard.lookups.append(host)
        if not _is_loopback(host if not isinstance(host, bytes) else host.decode()):
            raise socket.gaierror(f"test guard: no DNS lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    async def send(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> Any:
        guard.requests.append(str(request.url))
        return await real_send(self, request, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(httpx.AsyncClient, "send", send)
    return guard


class FakeDNS:
    """A resolver the test controls (no real lookups): `answers` is what the host resolves to now."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []
        self.changed = threading.Condition()

    def __call__(self, host: str) -> list[str]:
        with self.changed:
            self.asked.append(host)
            self.changed.notify_all()
        return list(self.answers)

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + GUARD_SECONDS
        with self.changed:
            while len(self.asked) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"resolver asked {len(self.asked)} times"
                self.changed.wait(left)


async def test_push_refuses_a_sink_resolving_to_a_private_address_without_connecting(
    engine: Engine, network: NetworkGuard
) -> None:
    receiver = Receiver()
    server = serve_receiver(receiver)
    port = server.server_address[1]
    # A public-looking name passes the subscribe-time check; at delivery it resolves to loopback.
    owner, subscribed = await setup(engine, f"http://hook.example:{port}/hook")
    receiver.secret = subscribed["sink_secret"]
    await publish(engine, owner, "never-sent")
    dns = FakeDNS("127.0.0.1")
    pusher = Pusher(engine.call, engine.service, backoff=lambda attempt: 0.01, allowed_sinks=(), resolve=dns)
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: dns.wait_for(3))  # resolved again at every attempt, backing off
        assert set(dns.asked) == {"hook.example"}
        assert network.requests == [] and receiver.attempts == 0  # no POST was even built into a request
        assert network.connects == [] and network.foreign() == []
        info = (await engine.call(engine.service.push_targets))[0]
        assert info["cursor"] == 0  # nothing committed, and the subscription is still a push target
        refusal = await pusher.vet(f"http://hook.example:{port}/hook")
        assert isinstance(refusal, str) and "loopback" in refusal and "--allow-sink" in refusal
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


async def test_push_connects_to_the_vetted_address_and_keeps_the_host(
    engine: Engine, network: NetworkGuard
) -> None:
    """Connect to the address that was checked, not to whatever the name resolves to a moment later."""
    receiver = Receiver()
    server = serve_receiver(receiver)
    port = server.server_address[1]
    owner, subscribed = await setup(engine, f"http://hook.example:{port}/hook")
    receiver.secret = subscribed["sink_secret"]
    first = await publish(engine, owner, "one")
    dns = FakeDNS("127.0.0.1")  # the service allows 127.0.0.1 (LOOPBACK_SINKS): the allow-list comes from it
    pusher = Pusher(engine.call, engine.service, backoff=lambda attempt: 0.01, resolve=dns)
    assert pusher.allowed_sinks == LOOPBACK_SINKS
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.seqs() == first))
        assert receiver.hosts == [f"hook.example:{port}"]  # Host names the sink, the socket the address
        assert network.requests == [f"http://127.0.0.1:{port}/hook"]
        assert network.foreign() == []
        # DNS rebinding: the same name now points at the cloud metadata address. Nothing goes there.
        dns.answers = ["169.254.169.254"]
        asked = len(dns.asked)
        await publish(engine, owner, "two")
        await wait_in_thread(lambda: dns.wait_for(asked + 3))
        assert receiver.seqs() == first and len(network.requests) == 1
        assert network.foreign() == [] and not any("169.254" in str(c) for c in network.connects)
        # Rebound back to an allowed address, the waiting batch goes out (nothing was lost).
        dns.answers = ["127.0.0.1"]
        await wait_in_thread(lambda: receiver.wait_for(lambda: len(receiver.seqs()) == 2))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


async def test_push_refuses_a_literal_sink_the_operator_no_longer_allows(
    engine: Engine, network: NetworkGuard
) -> None:
    receiver = Receiver()
    server = serve_receiver(receiver)
    owner, subscribed = await setup(engine, f"http://127.0.0.1:{server.server_address[1]}/hook")
    await publish(engine, owner, "held")
    dns = FakeDNS()
    pusher = Pusher(
        engine.call, engine.service, backoff=lambda attempt: 0.01, allowed_sinks=("10.0.0.0/8",), resolve=dns
    )
    verdicts: list[Any] = []
    real_vet = pusher.vet

    async def counting_vet(sink: str) -> Any:
        verdicts.append(await real_vet(sink))
        return verdicts[-1]

    pusher.vet = counting_vet  # type: ignore[method-assign]
    task = asyncio.create_task(pusher.run())
    try:
        await eventually_async(  # several refused attempts, backing off between them
            lambda: len(verdicts) >= 3, timeout=GUARD_SECONDS, what="the pusher retries the refused sink"
        )
        assert all(isinstance(v, str) and "loopback address" in v for v in verdicts)
        assert receiver.attempts == 0 and network.requests == [] and network.connects == []
        assert dns.asked == []  # a literal is judged without any lookup
        assert (await engine.call(engine.service.push_targets))[0]["cursor"] == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


def test_netguard_resolve_host_normalises_literals_without_lookups(network: NetworkGuard) -> None:
    assert netguard.resolve_host("127.1") == ["127.0.0.1"]
    assert netguard.resolve_host("[::1]") == ["::1"]
    assert netguard.resolve_host("2130706433") == ["127.0.0.1"]
    assert network.lookups == []


@pytest.mark.quick
def test_netguard_is_loopback_is_one_rule_for_names_and_addresses() -> None:
    """mp serve's bind, its Host names and a connection's address are judged loopback by this one rule."""
    for host in ("localhost", "LOCALHOST.", "127.0.0.1", "127.8.9.10", "::1", "[::1]", "::1%lo"):
        assert netguard.is_loopback(host), host
    for host in (
        "",
        None,
        "example.org",
        "localhost.example.org",
        "10.0.0.1",
        "0.0.0.0",
        "::",
        "[2001:db8::1]",
    ):
        assert not netguard.is_loopback(host), host


# -- netguard: the sink rule, judged without I/O and with a resolver -------------------------------------

REFUSED = [
    ("http://127.0.0.1/hook", "loopback"),
    ("http://127.1/hook", "loopback"),
    ("http://2130706433/hook", "loopback"),
    ("http://0x7f.1/hook", "loopback"),
    ("http://0x7f000001/hook", "loopback"),
    ("http://0177.0.0.1/hook", "loopback"),
    ("http://127.0.0.1./hook", "loopback"),
    ("http://[::1]/hook", "loopback"),
    ("http://[::ffff:127.0.0.1]/hook", "loopback"),
    ("http://[::ffff:7f00:1]/hook", "loopback"),
    ("http://[2002:7f00:1::1]/hook", "loopback"),  # 6to4 around 127.0.0.1
    ("http://[::127.0.0.1]/hook", "loopback"),  # IPv4-compatible
    ("http://１２７.０.０.１/hook", "loopback"),  # fullwidth digits normalise to 127.0.0.1
    ("http://127。0。0。1:9999/hook", "loopback"),  # ideographic full stops are dots to IDNA (UTS #46)
    ("http://127．0．0．1/hook", "loopback"),  # fullwidth full stops
    ("http://127｡0｡0｡1/hook", "loopback"),  # halfwidth ideographic full stops
    ("http://10。0。0。1/hook", "private"),
    ("http://localhost。/hook", "loopback name"),
    ("http://metadata。google。internal/x", "private-use"),
    ("http://10.0.0.1/hook", "private"),
    ("http://172.16.0.1/hook", "private"),
    ("http://192.168.1.1/hook", "private"),
    ("http://[fc00::1]/hook", "private"),
    ("http://[fd12:3456::1]/hook", "private"),
    ("http://[::ffff:10.0.0.1]/hook", "private"),
    ("http://[64:ff9b::a00:1]/hook", "private"),  # NAT64 around 10.0.0.1
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://[fe80::1]/hook", "link-local"),
    ("http://100.64.0.1/hook", "carrier-grade NAT"),
    ("http://0.0.0.0/hook", "unspecified"),
    ("http://0/hook", "unspecified"),
    ("http://[::]/hook", "unspecified"),
    ("http://224.0.0.1/hook", "multicast"),
    ("http://[ff02::1]/hook", "multicast"),
    ("http://[ff0e::1]/hook", "multicast"),
    ("http://255.255.255.255/hook", "reserved"),
    ("http://240.0.0.1/hook", "reserved"),
    ("http://192.0.2.10/hook", "private"),  # documentation range (ipaddress files it as private)
    ("http://[fec0::1]/hook", "site-local"),
    ("http://localhost/hook", "loopback name"),
    ("http://LOCALHOST.:8080/hook", "loopback name"),
    ("http://a.localhost/hook", "loopback name"),
    ("http://printer.local/hook", "link-local"),
    ("http://metadata.google.internal/computeMetadata", "private-use"),
    ("http://example.com@127.0.0.1/hook", "loopback"),  # userinfo is not the host
    ("http://a@b@127.0.0.1/hook", "several '@'"),
    ("http://127.0.0.1\\@example.com/hook", "backslash"),
    ("http://ex%61mple.com/hook", "percent"),
    ("http://[fe80::1%25eth0]/hook", "percent"),
    ("ftp://example.com/hook", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("gopher://127.0.0.1/", "scheme"),
    ("//example.com/hook", "scheme"),
    ("http:///hook", "no host"),
    ("http://[::1/hook", "not a valid URL"),
    ("http://example.com:99999/hook", "not a valid URL"),
    ("http://example.com:0/hook", "port 0"),  # found by a tester: accepted, and failed at every delivery
]
ACCEPTED = [
    "https://example.com/hook",
    "http://example.com/hook",
    "https://93.184.216.34/",
    "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",
    "https://user:secret@example.com/hook",
    "https://example.com:8443/hook?x=1",
    "HTTPS://Example.COM/hook",
    "https://8.8.8.8/",
]


@pytest.mark.parametrize(("url", "rule"), REFUSED)
def test_netguard_refuses_non_public_sinks_naming_the_rule(url: str, rule: str) -> None:
    refusal = netguard.sink_refusal(url)
    assert refusal is not None and rule in refusal, (url, refusal)
    if rule in ("loopback", "private", "link-local", "multicast", "unspecified", "reserved"):
        assert "--allow-sink" in refusal  # the sentence says how an operator would allow it


@pytest.mark.parametrize("url", ACCEPTED)
def test_netguard_accepts_public_sinks(url: str) -> None:
    assert netguard.sink_refusal(url) is None
    assert netguard.sink_refusal(url, resolve=lambda host: ["93.184.216.34"]) is None


def test_netguard_allow_list_takes_addresses_networks_and_names() -> None:
    assert netguard.sink_refusal("http://127.0.0.1:9000/hook", ["127.0.0.1"]) is None
    assert (
        netguard.sink_refusal("http://127.1:9000/hook", ["127.0.0.1"]) is None
    )  # same address, spelled oddly
    assert netguard.sink_refusal("http://[::ffff:127.0.0.1]/hook", ["127.0.0.1"]) is None
    assert netguard.sink_refusal("http://[::1]/hook", ["[::1]"]) is None
    assert netguard.sink_refusal("http://10.2.3.4/hook", ["10.0.0.0/8"]) is None
    assert netguard.sink_refusal("http://[fd00::5]/hook", ["fd00::/8"]) is None
    assert netguard.sink_refusal("http://localhost:9000/hook", ["localhost"]) is None
    assert netguard.sink_refusal("http://hooks.internal/hook", ["HOOKS.internal."]) is None
    # Controls: an allowance covers what it names and nothing else.
    assert "loopback" in (netguard.sink_refusal("http://127.0.0.2/hook", ["127.0.0.1"]) or "")
    assert "private" in (netguard.sink_refusal("http://11.0.0.1/x", ["10.0.0.0/8"]) or "private")
    assert "private" in (netguard.sink_refusal("http://192.168.0.1/hook", ["10.0.0.0/8"]) or "")
    assert "loopback" in (netguard.sink_refusal("http://[::1]/hook", ["127.0.0.1"]) or "")
    assert "loopback" in (netguard.sink_refusal("http://a.localhost/hook", ["localhost"]) or "")
    assert netguard.sink_refusal("http://10.0.0.1/hook", ["example.com"]) is not None
    # An allowed name is trusted whatever it resolves to; an allowed address only for that address.
    assert (
        netguard.sink_refusal("http://hooks.corp/h", ["hooks.corp"], resolve=lambda h: ["10.9.9.9"]) is None
    )
    refusal = netguard.sink_refusal("http://hooks.corp/h", ["10.0.0.1"], resolve=lambda h: ["10.9.9.9"])
    assert refusal is not None and "10.9.9.9" in refusal
    assert netguard.check_allow_entry("10.0.0.0/8") is None and netguard.check_allow_entry("::1") is None
    assert netguard.check_allow_entry("hooks.corp") is None
    assert netguard.check_allow_entry("10.0.0.0/99") is not None


def test_netguard_judges_every_resolved_address() -> None:
    url = "https://hook.example.com/h"
    assert netguard.sink_refusal(url) is None  # without I/O a public-looking name passes (subscribe time)
    ok = netguard.sink_refusal(url, resolve=lambda h: ["93.184.216.34", "2606:2800:220:1::1"])
    assert ok is None
    for bad, rule in [
        (["93.184.216.34", "10.0.0.1"], "private"),  # any disallowed address refuses
        (["169.254.169.254"], "link-local"),
        (["::ffff:127.0.0.1"], "loopback"),
        (["fe80::1%eth0"], "link-local"),
        (["0.0.0.0"], "unspecified"),
    ]:
        refusal = netguard.sink_refusal(url, resolve=lambda h, bad=bad: bad)
        assert refusal is not None and rule in refusal and "hook.example.com" in refusal, (bad, refusal)
    assert "no address" in (netguard.sink_refusal(url, resolve=lambda h: []) or "")

    def failing(host: str) -> list[str]:
        raise socket.gaierror("Name or service not known")

    assert "could not be resolved" in (netguard.sink_refusal(url, resolve=failing) or "")
    # The resolver is asked for the URL's real host, never the userinfo.
    asked: list[str] = []
    netguard.sink_refusal(
        "https://127.0.0.1@hook.example.com/h", resolve=lambda h: asked.append(h) or ["8.8.8.8"]
    )
    assert asked == ["hook.example.com"]


def test_netguard_loose_ipv4_matches_what_resolvers_accept() -> None:
    for text in ["127.1", "2130706433", "0x7f.1", "0x7f000001", "0177.0.0.1", "127.0.1", "127.0.0.1"]:
        assert str(netguard.parse_ipv4_loose(text)) == socket.inet_ntoa(socket.inet_aton(text)), text
    for text in ["256.0.0.1", "1.2.3.4.5", "example.com", "1e3", "08.0.0.1", "", "1..2"]:
        assert netguard.parse_ipv4_loose(text) is None, text


def _self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A throwaway certificate for `name` (openssl CLI), used as its own CA by the test's client."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_push_over_tls_pins_the_address_but_names_the_host_in_sni_and_verification(
    engine: Engine, network: NetworkGuard, tmp_path: Path
) -> None:
    import ssl

    cert, key = _self_signed(tmp_path, "hook.example")
    receiver = Receiver()
    server = serve_receiver(receiver)
    server_names: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    owner, subscribed = await setup(engine, f"https://hook.example:{port}/hook")
    receiver.secret = subscribed["sink_secret"]
    seqs = await publish(engine, owner, "tls")
    client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(cert)), trust_env=False)
    pusher = Pusher(
        engine.call, engine.service, http=client, backoff=lambda a: 0.01, resolve=FakeDNS("127.0.0.1")
    )
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.seqs() == seqs))
        assert server_names and set(server_names) == {"hook.example"}  # SNI names the sink, not 127.0.0.1
        assert receiver.hosts == [f"hook.example:{port}"]
        assert network.requests == [f"https://127.0.0.1:{port}/hook"] and network.foreign() == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
        server.shutdown()


async def test_push_goes_on_past_a_bounded_scan_that_found_nothing_for_it() -> None:
    """A filtered push subscription behind more non-matching rows than one pull examines (SCAN_BUDGET):
    the pusher commits past them and delivers what follows, instead of idling on an empty page forever."""
    from enginekit import Harness
    from monitor_protocol.core.vocab import SCAN_BUDGET
    from monitor_protocol.store.memory import MemoryStore

    h = Harness(MemoryStore())
    owner = h.monitor("ci", types=["com.a.x", "com.b.y"])
    sub = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "hook:ci", "protocol": "http", "sink": "https://example.com/hook",
         "filter": {"types": ["com.a.x"]}},
        owner,
    )  # fmt: skip
    assert sub.status == 201, sub.body
    sid = sub.body["subscription"]["id"]
    for _ in range(SCAN_BUDGET + 200):
        h.publish("ci", owner, type="com.b.y")
    needle = h.publish("ci", owner, type="com.a.x", subject="needle").body["seq"]
    posted: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(200)

    async def call(fn, *args):
        return fn(*args)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))  # no socket is ever opened
    pusher = Pusher(call, h.service, http=client, resolve=lambda host: ["93.184.216.34"])
    pusher.targets = {t["id"]: t for t in h.service.push_targets()}
    outcomes = [await pusher.deliver_once(sid) for _ in range(3)]
    await client.aclose()
    assert [o["subject"] for batch in posted for o in batch["observations"]] == ["needle"], outcomes
    assert h.store.get_subscription(sid).cursor == needle + 1


def test_verify_refuses_a_replayed_timestamp_and_accepts_within_tolerance() -> None:
    """docs/protocol.md section 9: verification refuses a webhook-timestamp more than 5 minutes away from the
    receiver's clock, so a captured delivery cannot be replayed later."""
    secret = "whsec_" + "QUJD" * 8
    body = b'{"observations":[]}'
    sent = 1_700_000_000

    def headers(ts: int | str) -> dict[str, str]:
        return {
            "webhook-id": "sub-1:7-9",
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(secret, "sub-1:7-9", int(ts), body),
        }

    assert verify(secret, headers(sent), body, now=sent)
    assert verify(secret, headers(sent), body, now=sent + 299)  # late, within tolerance
    assert verify(secret, headers(sent), body, now=sent + 300)
    assert verify(secret, headers(sent), body, now=sent - 300)  # the sender's clock runs a little ahead
    assert not verify(
        secret, headers(sent), body, now=sent + 3600
    )  # the same delivery replayed an hour later
    assert not verify(secret, headers(sent), body, now=sent + 301)
    assert not verify(secret, headers(sent), body, now=sent - 301)  # too far in the future
    assert verify(
        secret, headers(sent), body, now=sent + 3600, tolerance_seconds=7200
    )  # the receiver's choice
    assert not verify(secret, headers(sent), body, now=sent + 61, tolerance_seconds=60)
    # Without `now`, the receiver's own clock decides.
    fresh = int(time.time())
    assert verify(secret, headers(fresh), body)
    assert not verify(secret, headers(fresh - 3600), body)
    # Timestamps that are not plain ASCII digits are refused before any arithmetic.
    for ts in ("", "-5", "1.5", "\u0661\u0662", "9" * 40):
        h = headers(sent)
        h["webhook-timestamp"] = ts
        assert not verify(secret, h, body, now=sent)


async def test_push_retries_a_failed_batch_unchanged_while_new_observations_wait(engine: Engine) -> None:
    """A failed batch is retried unchanged (same seqs, same webhook-id) until it is answered; what was
    appended meanwhile waits for the next batch (docs/protocol.md section 9)."""
    attempts: list[tuple[str, list[int]]] = []
    first_failure_seen = threading.Event()
    more_published = threading.Event()

    class Recording(Receiver):
        def handle(self, headers: dict[str, str], body: bytes) -> int:
            lower = {k.lower(): v for k, v in headers.items()}
            with self.changed:
                attempts.append(
                    (lower["webhook-id"], [int(o["id"]) for o in json.loads(body)["observations"]])
                )
            if len(attempts) == 1:
                first_failure_seen.set()
                assert more_published.wait(
                    GUARD_SECONDS
                )  # the new rows exist before this failure is answered
            return super().handle(headers, body)

    receiver = Recording(script=[500, 503])
    server = serve_receiver(receiver)
    sink = f"http://127.0.0.1:{server.server_address[1]}/hook"
    owner, subscribed = await setup(engine, sink)
    receiver.secret = subscribed["sink_secret"]
    sub_id = subscribed["subscription"]["id"]
    first = await publish(engine, owner, "b1", "b2")
    pusher = Pusher(engine.call, engine.service, backoff=lambda attempt: 0.05)
    task = asyncio.create_task(pusher.run())
    try:
        await wait_in_thread(lambda: first_failure_seen.wait(GUARD_SECONDS))
        more = await publish(engine, owner, "b3", "b4")
        more_published.set()
        await wait_in_thread(lambda: receiver.wait_for(lambda: receiver.seqs() == first + more))
        batch_id = f"{sub_id}:{first[0]}-{first[1]}"
        assert attempts[:3] == [(batch_id, first)] * 3  # failed, failed, answered: the same batch each time
        assert attempts[3:] == [(f"{sub_id}:{more[0]}-{more[1]}", more)]  # then the new ones, as a next batch
        assert receiver.ids == [batch_id, f"{sub_id}:{more[0]}-{more[1]}"] and receiver.bad_signatures == 0
        await eventually_async(  # the commit follows the 2xx
            lambda: cursor_is(engine, more[-1] + 1), timeout=GUARD_SECONDS, what="the last batch is committed"
        )
        assert pusher.inflight == {} and len(attempts) == 4  # nothing held once answered, nothing sent again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        server.shutdown()


async def test_push_starts_a_new_batch_when_the_cursor_moved_past_the_failed_one(engine: Engine) -> None:
    """The held batch is forgotten only when the log says so: a reader committed past it meanwhile."""
    posted: list[list[int]] = []
    script = [500, 200, 200]

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append([int(o["id"]) for o in json.loads(request.content)["observations"]])
        return httpx.Response(script.pop(0))

    owner, subscribed = await setup(engine, "https://hook.example/hook")
    sub_id = subscribed["subscription"]["id"]
    first = await publish(engine, owner, "a", "b")
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    pusher = Pusher(
        engine.call, engine.service, http=client, resolve=lambda host: ["93.184.216.34"], allowed_sinks=()
    )
    pusher.targets = {t["id"]: t for t in await engine.call(engine.service.push_targets)}
    try:
        assert await pusher.deliver_once(sub_id) == "retry"
        assert pusher.inflight == {sub_id: (str(first[0]), 2)}
        more = await publish(engine, owner, "c")
        await engine.call(engine.service.ack_as_system, sub_id, first[0] + 1)  # someone committed "a"
        assert await pusher.deliver_once(sub_id) == "delivered"
        assert posted == [first, [first[1], *more]]  # a new batch from the new cursor (a new webhook-id)
        assert pusher.inflight == {}
        assert await pusher.deliver_once(sub_id) == "idle"
    finally:
        await client.aclose()


def test_subscribe_refuses_a_sink_spelled_with_ideographic_full_stops() -> None:
    """docs/security.md: an internal sink is refused at subscribe (400 INVALID), not only skipped at
    delivery. 127。0。0。1 is 127.0.0.1 to every resolver (IDNA maps U+3002 to "."), so it is refused there."""
    from enginekit import Harness
    from monitor_protocol.store.memory import MemoryStore

    h = Harness(MemoryStore())
    tok = h.monitor("ci")
    for sink in ("http://127。0。0。1:9999/", "http://127．0．0．1:9999/", "http://localhost｡:9999/"):
        body = {"monitor": "ci", "subscriber": "agent:x", "protocol": "http", "sink": sink}
        r = h.call("POST", "/subscriptions", body, tok)
        assert r.status == 400 and r.body["code"] == "INVALID", (sink, r.body)
        assert "--allow-sink" in r.body["error"] and "loopback" in r.body["error"], r.body
    public = {
        "monitor": "ci",
        "subscriber": "agent:x",
        "protocol": "http",
        "sink": "https://example.com/hook",
    }
    assert h.call("POST", "/subscriptions", public, tok).status == 201  # positive control: a public name
    # Spelled with U+3002 it is not a URI (RFC 3986, the published schema's `uri`): send the ASCII form.
    r = h.call("POST", "/subscriptions", {**public, "sink": "https://example。com/hook"}, tok)
    assert r.status == 400 and "is not a URI" in r.body["error"], r.body


async def test_a_rescan_reads_the_push_targets_again_only_when_they_may_have_changed(tmp_path: Path) -> None:
    """One server on its own file sees every change of its subscriptions (push_epoch moves with them): a
    rescan with nothing changed reads nothing (no scan of every subscription on the loop every 5 s). A new
    push subscription, a stopped worker and a store several servers share each make it read again."""
    service = MonitorService(SQLiteStore(str(tmp_path / "rescan.db")))
    owner = service.create_monitor({"id": "ci", "types": ["com.a.x"]}, None)["owner_token"]
    for i in range(3):
        service.subscribe({"monitor": "ci", "subscriber": f"agent:r{i}"}, owner)  # not push: never targets
    reads: list[int] = []
    original = service.push_targets

    def counted() -> list[dict[str, Any]]:
        found = original()
        reads.append(len(found))
        return found

    service.push_targets = counted  # type: ignore[method-assign]

    async def call(fn, *args):
        return fn(*args)

    pusher = Pusher(call, service, resolve=lambda host: ["93.184.216.34"])
    try:
        await pusher.rescan()
        await pusher.rescan()
        assert reads == [0]  # read once; the second rescan had nothing to read again
        service.subscribe(
            {"monitor": "ci", "subscriber": "hook:ci", "protocol": "http", "sink": "https://example.com/h"},
            owner,
        )
        await pusher.rescan()
        assert reads == [0, 1] and len(pusher.workers) == 1  # the new target was read, its worker started
        await pusher.rescan()
        assert reads == [0, 1]
        (worker,) = pusher.workers.values()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await pusher.rescan()
        assert reads == [0, 1, 1]  # a worker that stopped: read again
        pusher._sees_every_change = lambda: False  # type: ignore[method-assign]  # a shared store: every time
        await pusher.rescan()
        await pusher.rescan()
        assert reads == [0, 1, 1, 1, 1]
    finally:
        for task in pusher.workers.values():
            task.cancel()
        await asyncio.gather(*pusher.workers.values(), return_exceptions=True)
