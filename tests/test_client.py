"""monitor_protocol.client (sync and async) and the `mp` client commands, against a real `mp serve`."""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from monitor_protocol import client as client_module
from monitor_protocol.client import (
    ERROR_CLASSES,
    AckResult,
    AsyncClient,
    Client,
    ConnectionFailed,
    CursorBackwards,
    Duplicate,
    LeaseHeld,
    MonitorProtocolError,
    NotFound,
    PullResult,
    Unauthorized,
    Unavailable,
    UnknownVocabulary,
)
from monitor_protocol.core.vocab import ERROR_STATUS
from serverutil import long_polls_parked, mp_command, mp_env, running_server
from waiting import eventually_async

ADMIN = "admin-token-for-tests-0123456789"
TYPE = "com.example.ci.run"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The push test subscribes a loopback sink, which the operator must allow (docs/protocol.md section 9).
    with running_server(
        tmp_path_factory.mktemp("client"), "--allow-admin", ADMIN, "--allow-sink", "127.0.0.1"
    ) as (url, _proc):
        yield url


def new_monitor(c: Client, mid: str, **fields: Any) -> str:
    fields.setdefault("types", [TYPE])
    return c.create_monitor(mid, **fields).owner_token


def test_discover_and_monitor_lifecycle(base: str) -> None:
    with Client(base) as c:
        disc = c.discover()
        assert "0.1" in disc.supported_versions
        assert "ai.mentu/monitors" in disc.capabilities["extensions"]
        created = c.create_monitor("life", types=[TYPE], visibility="private")
        owner = created.owner_token
        assert created.monitor.id == "life" and created.monitor.version == 1 and owner
        # private: invisible without its token, visible with it
        assert "life" not in [m.id for m in c.list_monitors()]
        assert "life" in [m.id for m in c.list_monitors(token=owner)]
        with pytest.raises(MonitorProtocolError) as hidden:
            c.get_monitor("life")
        assert hidden.value.code == "NOT_FOUND" and hidden.value.status == 404
        assert c.get_monitor("life", token=owner).raw["id"] == "life"
        with pytest.raises(MonitorProtocolError) as dup:
            c.create_monitor("life", types=[TYPE])
        assert dup.value.code == "DUPLICATE" and dup.value.status == 409

        c.token = owner
        updated = c.update_monitor("life", {"name": "Life"}, reason="rename")
        assert updated.monitor.version == 2 and updated.monitor.name == "Life" and updated.seq > 1
        assert c.pause_monitor("life", "maintenance").monitor.active is False
        with pytest.raises(MonitorProtocolError) as paused:
            c.publish("life", TYPE)
        assert paused.value.code == "UNAVAILABLE" and "rejected_seq" in paused.value.extras
        assert c.resume_monitor("life", "back").monitor.active is True
        pub = c.publish("life", TYPE, subject="b1", data={"status": "ok"}, tags={"team": "ci"})
        assert pub.observation["subject"] == "b1" and pub.observation["data"]["status"] == "ok"
        state = c.state("life")
        assert state.head == pub.seq and state.live["value"] is True
        assert c.retire_monitor("life", "done").monitor.active is False


def test_pull_ack_seek_renew_retire(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "feed")
        sub = c.subscribe("feed", "agent:reader", token=owner, filter={"types": [TYPE]})
        sid, reader = sub.subscription.id, sub.token
        seqs = [c.publish("feed", TYPE, subject=f"s{i}", token=owner).seq for i in range(3)]
        r = Client(base, reader)
        first = r.pull(sid, limit=2)
        assert isinstance(first, PullResult)
        assert [int(o["id"]) for o in first.observations] == seqs[:2]
        assert first.next == seqs[1] + 1
        again = r.pull(sid, limit=2)  # pull never commits
        assert [o["id"] for o in again.observations] == [o["id"] for o in first.observations]
        assert again.redelivered == 2
        replay = r.pull(sid, cursor=seqs[2])  # read-only replay
        assert [int(o["id"]) for o in replay.observations] == [seqs[2]]
        narrowed = r.pull(sid, filter={"subjects": ["s1"]})
        assert [o["subject"] for o in narrowed.observations] == ["s1"]
        acked = r.ack(sid, first.next)
        assert isinstance(acked, AckResult) and acked.cursor == first.next
        assert r.ack(sid, first.next).raw == acked.raw  # identical ack, identical reply
        with pytest.raises(MonitorProtocolError) as back:
            r.ack(sid, seqs[0])
        assert back.value.code == "CURSOR_BACKWARDS"
        assert [int(o["id"]) for o in r.pull(sid).observations] == [seqs[2]]
        assert r.seek(sid, seqs[0], "replay for the test").cursor == seqs[0]
        renewed = r.renew(sid)
        assert renewed.token and renewed.token != reader
        with pytest.raises(MonitorProtocolError) as dead:
            r.pull(sid)  # the old token died at once
        assert dead.value.code == "UNAUTHORIZED" and dead.value.status == 401
        r.token = renewed.token
        retired = r.retire_subscription(sid, "finished")
        assert retired.ok and retired.cursor_kept == seqs[0]
        with pytest.raises(MonitorProtocolError) as gone:
            r.pull(sid)
        assert gone.value.retired and gone.value.status == 404
        r.close()


def test_leases(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "work", capabilities=["observe", "act"], visibility="public")
        c.publish("work", TYPE, subject="job-1", token=owner)
        c.publish("work", TYPE, subject="job-2", token=owner)
        worker = c.subscribe("work", "agent:worker", capabilities=["observe", "act"], token=owner)
        other = c.subscribe("work", "agent:other", capabilities=["observe", "act"], token=owner)
        w = Client(base, worker.token)
        sid = worker.subscription.id
        claim = w.claim(sid, "job-1", lease_duration_seconds=30, note="mine")
        assert claim.lease["holder"] == f"sub:{sid}" and claim.idempotent is False
        assert w.claim(sid, "job-1").idempotent is True
        with pytest.raises(MonitorProtocolError) as held:
            c.claim(other.subscription.id, "job-1", token=other.token)
        assert held.value.code == "LEASE_HELD"
        assert w.renew_lease(sid, "job-1", lease_duration_seconds=60).lease["subject"] == "job-1"
        assert w.complete(sid, "job-1", "fixed", evidence={"log": "ok"}).ok
        w.claim(sid, "job-2")
        assert w.release(sid, "job-2", "not mine").ok
        w.claim(sid, "job-2")
        rejected = w.reject(sid, "job-2", "cannot")
        assert rejected.ok and rejected.dead_letter is False
        # a stranger without act is refused
        reader = c.subscribe("work", "agent:looker", token=None)
        with pytest.raises(MonitorProtocolError) as missing:
            c.claim(reader.subscription.id, "job-2", token=reader.token)
        assert missing.value.code == "CAPABILITY_MISSING"
        w.close()


def test_rpc_admin_and_raw_request(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "rpcm")
        assert c.rpc("monitors/discover")["supportedVersions"]
        published = c.rpc("monitors/publish", {"id": "rpcm", "type": TYPE, "subject": "x"}, token=owner)
        assert published["observation"]["subject"] == "x"
        with pytest.raises(MonitorProtocolError) as err:
            c.rpc("monitors/publish", {"id": "rpcm", "type": "Not A Type"}, token=owner)
        assert err.value.code in ("UNKNOWN_VOCABULARY", "INVALID")
        batch = c.rpc_batch([("monitors/discover", {}), ("monitors/get", {"id": "rpcm", "token": owner})])
        assert [r["id"] for r in batch] == [1, 2] and batch[1]["result"]["id"] == "rpcm"
        assert c.request("GET", "/monitors/rpcm/state", token=owner)["monitor"] == "rpcm"
        with pytest.raises(MonitorProtocolError) as anon:
            c.admin_snapshot()
        assert anon.value.code == "UNAUTHORIZED"
        assert isinstance(c.admin_snapshot(token=ADMIN), dict)
        head = c.state("rpcm", token=owner).head
        assert isinstance(c.admin_compact(head, "rpcm", token=ADMIN), dict)
        assert 1 < c.state("rpcm", token=owner).retention_floor <= head + 1


def test_connection_failed_on_a_closed_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", timeout=2) as c, pytest.raises(ConnectionFailed) as failed:
        c.discover()
    assert failed.value.reason


async def test_async_client_long_poll_wakes_on_publish(base: str) -> None:
    async with AsyncClient(base) as c:
        created = await c.create_monitor("asyncm", types=[TYPE])
        owner = created.owner_token
        sub = await c.subscribe("asyncm", "agent:async", token=owner, from_="head", filter={"types": [TYPE]})
        got: list[PullResult] = []

        async def waiter() -> None:
            got.append(await c.pull(sub.subscription.id, wait=40, token=sub.token))

        with anyio.fail_after(60):  # a hang guard only
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await eventually_async(
                    lambda: long_polls_parked(base) >= 1, interval=0.05, what="the poll parks"
                )
                assert got == []  # held: it does not answer before the publish
                await c.publish("asyncm", TYPE, subject="woke", token=owner)
        assert [o["subject"] for o in got[0].observations] == ["woke"]
        with pytest.raises(MonitorProtocolError) as err:
            await c.ack(sub.subscription.id, 0, token="wrong")
        assert err.value.code == "UNAUTHORIZED"


# ---------------------------------------------------------------------------------------------- CLI


def mp(base: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = mp_env()
    full.update(env or {})
    full["MP_BASE"] = base
    return subprocess.run(mp_command(*args), capture_output=True, text=True, env=full, timeout=60)


def test_cli_round_trip_with_env_tokens(base: str) -> None:
    created = mp(
        base,
        "monitors",
        "create",
        "clim",
        "--type",
        TYPE,
        "--capability",
        "observe",
        "--capability",
        "act",
        "--json",
    )
    assert created.returncode == 0, created.stderr
    owner = json.loads(created.stdout)["owner_token"]
    env = {"MP_OWNER_TOKEN": owner}
    pub = mp(
        base,
        "publish",
        "clim",
        TYPE,
        "--subject",
        "b1",
        "--data",
        '{"status":"failed"}',
        "--tag",
        "team=ci",
        env=env,
    )
    assert pub.returncode == 0 and pub.stdout.startswith("published seq="), pub.stderr
    sub = mp(
        base, "subscribe", "clim", "--subscriber", "agent:cli", "--capability", "observe", "--capability", "act",
        "--json", env=env,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    sub_body = json.loads(sub.stdout)
    sid = sub_body["subscription"]["id"]
    env = {"MP_READER_TOKEN": sub_body["token"]}
    pulled = mp(base, "pull", sid, "--filter", json.dumps({"types": [TYPE]}), env=env)
    assert pulled.returncode == 0, pulled.stderr
    lines = pulled.stdout.splitlines()
    assert lines[0].startswith("OBS seq=2 type=com.example.ci.run subject=b1 tier=")
    assert lines[-1].startswith("NEXT 3 ")
    assert mp(base, "ack", sid, "3", env=env).returncode == 0
    back = mp(base, "ack", sid, "1", env=env)
    assert back.returncode == 3 and back.stderr.startswith("error: CURSOR_BACKWARDS: ")  # refused
    assert mp(base, "seek", sid, "1", "--reason", "again", env=env).stdout.strip() == "cursor=1"
    claim = mp(base, "lease", "claim", sid, "b1", "--json", env=env)
    assert claim.returncode == 0 and json.loads(claim.stdout)["lease"]["subject"] == "b1"
    done = mp(base, "lease", "complete", sid, "b1", "--outcome", "fixed", env=env)
    assert done.returncode == 0 and done.stdout.startswith("complete ok seq=")
    state = mp(base, "state", "clim", "--json", env={"MP_TOKEN": owner})
    assert json.loads(state.stdout)["monitor"] == "clim"
    listed = mp(base, "monitors", "list", "--token", owner)
    assert any(line.startswith("clim\t") for line in listed.stdout.splitlines())
    paused = mp(base, "monitors", "pause", "clim", "--reason", "x", env={"MP_OWNER_TOKEN": owner})
    assert paused.returncode == 0 and "active=false" in paused.stdout
    refused = mp(base, "publish", "clim", TYPE, "--json", env={"MP_OWNER_TOKEN": owner})
    assert refused.returncode == 3
    assert refused.stderr.startswith("error: UNAVAILABLE: ")  # a sentence on stderr,
    assert json.loads(refused.stdout)["code"] == "UNAVAILABLE"  # the error body as JSON on stdout


def test_cli_network_failure_and_help() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = mp(f"http://127.0.0.1:{port}", "state", "x")
    assert down.returncode == 6 and down.stderr.startswith("error: UNREACHABLE: ")
    for command in (
        "publish",
        "subscribe",
        "pull",
        "ack",
        "seek",
        "state",
        "monitors",
        "lease",
        "watch",
        "mcp",
    ):
        shown = subprocess.run(mp_command(command, "--help"), capture_output=True, text=True, env=mp_env())
        assert shown.returncode == 0 and "usage: mp " + command in shown.stdout


def test_cli_subscribe_http_prints_the_sink_secret(base: str) -> None:
    created = mp(base, "monitors", "create", "hookm", "--type", TYPE, "--json")
    owner = json.loads(created.stdout)["owner_token"]
    secret = "whsec_" + "QUJD" * 8
    sub = mp(
        base,
        "subscribe",
        "hookm",
        "--subscriber",
        "hook:ci",
        "--protocol",
        "http",
        "--sink",
        "http://127.0.0.1:9/hook",
        "--sink-secret",
        secret,
        "--token",
        owner,
    )
    assert sub.returncode == 0, sub.stderr
    assert f"sink_secret: {secret}" in sub.stdout.splitlines()
    bad = mp(base, "subscribe", "hookm", "--subscriber", "hook:x", "--protocol", "http", "--token", owner)
    assert bad.returncode == 3 and bad.stderr.startswith("error: INVALID: ")


def test_publish_retried_with_an_idempotency_key_appends_once(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "idem")
        first = c.publish("idem", TYPE, subject="build-1", idempotency_key="retry-1", token=owner)
        retried = c.publish("idem", TYPE, subject="build-1", idempotency_key="retry-1", token=owner)
        assert not first.idempotent and retried.idempotent and retried.seq == first.seq
        other = c.publish("idem", TYPE, subject="build-2", idempotency_key="retry-2", token=owner)
        assert not other.idempotent and other.seq == first.seq + 1  # positive control: a new key appends
        assert c.get_monitor("idem", token=owner).head == other.seq


# ---------------------------------------------------------------------------------------------- errors


def test_one_exception_class_per_error_code() -> None:
    assert set(ERROR_STATUS) <= set(ERROR_CLASSES)  # every code of docs/protocol.md section 3
    classes = [ERROR_CLASSES[code] for code in ERROR_STATUS]
    assert len(set(classes)) == len(classes)
    for code, cls in ERROR_CLASSES.items():
        assert issubclass(cls, MonitorProtocolError) and cls is not MonitorProtocolError
        assert cls.__name__ == "".join(part.capitalize() for part in code.split("_"))
        assert cls.__name__ in client_module.__all__
    err = client_module.error_for("LEASE_HELD", "held", 409, {"holder": "sub:x"})
    assert type(err) is LeaseHeld and (err.code, err.status, err.extras) == (
        "LEASE_HELD",
        409,
        {"holder": "sub:x"},
    )
    assert type(client_module.error_for("SOMETHING_NEW", "x", 418)) is MonitorProtocolError
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is LeaseHeld and copy.body == err.body


def test_refusals_raise_the_class_of_their_code(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "typed-errors", capabilities=["observe", "act"], visibility="public")
        with pytest.raises(Duplicate) as dup:
            c.create_monitor("typed-errors", types=[TYPE])
        assert dup.value.code == "DUPLICATE" and dup.value.status == 409
        with pytest.raises(NotFound):
            c.state("no-such-monitor")
        with pytest.raises(Unauthorized) as unauth:
            c.publish("typed-errors", TYPE, token="wrong")
        assert isinstance(unauth.value, MonitorProtocolError) and unauth.value.status == 401
        with pytest.raises(UnknownVocabulary):
            c.publish("typed-errors", TYPE, tier="golden", token=owner)
        c.publish("typed-errors", TYPE, subject="job", token=owner)
        a = c.subscribe("typed-errors", "agent:a", capabilities=["observe", "act"], token=owner)
        b = c.subscribe("typed-errors", "agent:b", capabilities=["observe", "act"], token=owner)
        c.claim(a.subscription.id, "job", token=a.token)
        with pytest.raises(LeaseHeld):
            c.claim(b.subscription.id, "job", token=b.token)
        head = c.pull(a.subscription.id, token=a.token).next
        c.ack(a.subscription.id, head, token=a.token)
        with pytest.raises(CursorBackwards) as back:
            c.ack(a.subscription.id, 1, token=a.token)
        assert back.value.code == "CURSOR_BACKWARDS" and back.value.status == 409
        c.pause_monitor("typed-errors", "x", token=owner)
        with pytest.raises(Unavailable) as paused:  # 409: not retried, even with retries
            c.publish("typed-errors", TYPE, token=owner, retries=3, retry_backoff=0.01)
        assert paused.value.status == 409 and "rejected_seq" in paused.value.extras
        with pytest.raises(LeaseHeld):  # JSON-RPC errors too
            c.rpc(
                "leases/claim",
                {"subscription": b.subscription.id, "subject": "job"},
                token=b.token,
            )


# ---------------------------------------------------------------------------------------------- network


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SilentServer:
    """A TCP listener on 127.0.0.1 that reads each request and then hangs up without answering (`close`)
    or keeps the connection open and never answers (`hang`)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            self.received.append(data)
            if self.mode == "close":
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_connection_failed_says_whether_the_request_was_sent() -> None:
    with (
        Client(f"http://127.0.0.1:{_free_port()}", timeout=2) as c,
        pytest.raises(ConnectionFailed) as refused,
    ):
        c.discover()
    assert refused.value.sent is False and refused.value.url.endswith("/mp/v0/discover")
    for mode in ("close", "hang"):
        server = SilentServer(mode)
        try:
            with Client(server.url, timeout=0.5) as c, pytest.raises(ConnectionFailed) as unknown:
                c.publish("m", TYPE)
            assert unknown.value.sent is True, mode  # the server had the request: outcome unknown
            assert unknown.value.outcome_unknown
            assert server.received and server.received[0].startswith(b"POST /mp/v0/monitors/m/observations")
        finally:
            server.close()


class LoseFirstReplies(httpx.BaseTransport):
    """Forwards every request to the real server, but loses the reply of the first `lose` ones (the server
    did the work; the client sees a reset), or answers the first `unavailable` ones itself with a 503."""

    def __init__(self, lose: int = 0, unavailable: int = 0) -> None:
        self.inner = httpx.HTTPTransport()
        self.lose = lose
        self.unavailable = unavailable
        self.bodies: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.read() or b"null"))
        if self.unavailable:
            self.unavailable -= 1
            body = {"code": "UNAVAILABLE", "error": "storage failed; retry", "done": []}
            return httpx.Response(503, json=body, headers={"retry-after": "0"})
        response = self.inner.handle_request(request)
        response.read()
        if self.lose:
            self.lose -= 1
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response


def test_publish_with_retries_survives_a_lost_reply_and_appends_once(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "retried")
        before = c.get_monitor("retried", token=owner).head
    lossy = LoseFirstReplies(lose=1)
    with Client(base, owner, transport=lossy) as c:
        with pytest.raises(ConnectionFailed) as lost:  # without retries the lost reply is an unknown outcome
            c.publish("retried", TYPE, subject="once")
        assert lost.value.sent is True
        lossy.lose = 1
        pub = c.publish("retried", TYPE, subject="twice", retries=2, retry_backoff=0.01)
    assert pub.idempotent is True  # the retry found the first attempt applied and got its reply
    assert len(lossy.bodies) == 3
    key = lossy.bodies[1]["idempotency_key"]
    assert key and lossy.bodies[2]["idempotency_key"] == key  # generated once, sent on every attempt
    assert "idempotency_key" not in lossy.bodies[0]  # no retries: nothing added to the body
    with Client(base, owner) as c:
        # one append for the lost-reply publish, one for the retried one
        assert c.get_monitor("retried").head == before + 2 == pub.seq
        observed = c.request("GET", "/monitors/retried/state")["counters"]["observations"]
        assert observed >= 2


def test_publish_retries_a_503_but_not_other_refusals(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "retry503")
    flaky = LoseFirstReplies(unavailable=2)
    with Client(base, owner, transport=flaky) as c:
        pub = c.publish("retry503", TYPE, idempotency_key="mine-1", retries=2, retry_backoff=0.01)
        assert pub.idempotent is False and [b["idempotency_key"] for b in flaky.bodies] == ["mine-1"] * 3
        flaky.unavailable, flaky.bodies = 3, []
        with pytest.raises(Unavailable) as exhausted:  # retries spent: the last error raises
            c.publish("retry503", TYPE, retries=2, retry_backoff=0.01)
        assert exhausted.value.status == 503 and exhausted.value.retry_after == 0 and len(flaky.bodies) == 3
        flaky.unavailable, flaky.bodies = 0, []
        with pytest.raises(UnknownVocabulary):
            c.publish("retry503", TYPE, tier="golden", retries=3, retry_backoff=0.01)
        assert len(flaky.bodies) == 1  # a refusal is final
        with pytest.raises(ValueError):
            c.publish("retry503", TYPE, retries=-1)


class AsyncLoseFirstReply(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.calls == 1:
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        return response


async def test_async_publish_with_retries(base: str) -> None:
    async with AsyncClient(base) as c:
        owner = (await c.create_monitor("aretried", types=[TYPE])).owner_token
    transport = AsyncLoseFirstReply()
    async with AsyncClient(base, owner, transport=transport) as c:
        pub = await c.publish("aretried", TYPE, retries=1, retry_backoff=0.01)
        assert pub.idempotent is True and transport.calls == 2
        assert (await c.state("aretried")).head == pub.seq


def test_pull_wait_is_whole_seconds(base: str) -> None:
    counting = LoseFirstReplies()
    with Client(base, "no-token", transport=counting) as c:
        for bad in (2.5, 3.0, True, "5"):
            with pytest.raises(TypeError, match="whole seconds"):
                c.pull("sub-0123456789abcdef", wait=bad)  # type: ignore[arg-type]
        assert counting.bodies == []  # refused before anything was sent
        with pytest.raises(NotFound):
            c.pull("sub-0123456789abcdef", wait=0)  # an int goes through
        assert len(counting.bodies) == 1


def test_publish_data_and_rpc_params_must_be_mappings(base: str) -> None:
    """Found by a tester: data=[("status", "failed")] was published as {"status": "failed"} (dict() guessed),
    and data="abc" or 5 failed with a sentence about sequences. A TypeError naming the argument, before
    anything is sent; the control: a dict goes through."""
    counting = LoseFirstReplies()
    with Client(base, "no-token", transport=counting) as c:
        for bad in ([("status", "failed")], "abc", 5, [1, 2]):
            with pytest.raises(TypeError, match="publish: data must be a mapping"):
                c.publish("nowhere", TYPE, data=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="rpc: params must be a mapping"):
            c.rpc("monitors/get", [1])  # type: ignore[arg-type]
        assert counting.bodies == []  # refused before anything was sent
        with pytest.raises(NotFound):  # sent: the server answers (no such monitor)
            c.publish("nowhere", TYPE, data={"status": "failed"})
        assert len(counting.bodies) == 1


def test_an_html_page_is_said_to_be_another_server_not_shown() -> None:
    """Found by an agent builder: `mp mcp --base` pointed at a plain web server showed the model the page's raw
    HTML. A page is named for what it is; any other text is quoted (cut at 200 characters), as before."""
    from monitor_protocol.client.errors import error_from_body

    page = (
        '<!DOCTYPE HTML>\n<html lang="en"><head><title>Error response</title></head><body>404</body></html>'
    )
    err = error_from_body(404, None, page)
    assert err.code == "UNEXPECTED_RESPONSE" and "<html" not in str(err)
    assert "an HTML page ('Error response 404'), not a Monitor Protocol reply" in str(
        err
    ) and "/mp/v0" in str(err)
    plain = error_from_body(502, None, "upstream timed out " + "x" * 300)
    assert "upstream timed out" in str(plain) and "HTML" not in str(plain)  # control
