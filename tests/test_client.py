"""monitor_protocol.client (sync and async) and the `mp` client commands, against a real `mp serve`."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from monitor_protocol.client import (
    AckResult,
    AsyncClient,
    Client,
    ConnectionFailed,
    MonitorProtocolError,
    PullResult,
)
from serverutil import mp_command, mp_env, running_server

ADMIN = "admin-token-for-tests-0123456789"
TYPE = "com.example.ci.run"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The push test subscribes a loopback sink, which the operator must allow (PROTOCOL.md section 9).
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
                await anyio.sleep(0.2)  # lets the poll start; the result does not depend on it
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
    assert back.returncode == 1 and back.stderr.startswith("error: CURSOR_BACKWARDS: ")
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
    assert refused.returncode == 1
    first, body = refused.stderr.splitlines()[:2]
    assert first.startswith("error: UNAVAILABLE: ") and json.loads(body)["code"] == "UNAVAILABLE"


def test_cli_network_failure_and_help() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = mp(f"http://127.0.0.1:{port}", "state", "x")
    assert down.returncode == 1 and down.stderr.startswith("error: DOWN ")
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
    assert bad.returncode == 1 and bad.stderr.startswith("error: INVALID: ")


def test_publish_retried_with_an_idempotency_key_appends_once(base: str) -> None:
    with Client(base) as c:
        owner = new_monitor(c, "idem")
        first = c.publish("idem", TYPE, subject="build-1", idempotency_key="retry-1", token=owner)
        retried = c.publish("idem", TYPE, subject="build-1", idempotency_key="retry-1", token=owner)
        assert not first.idempotent and retried.idempotent and retried.seq == first.seq
        other = c.publish("idem", TYPE, subject="build-2", idempotency_key="retry-2", token=owner)
        assert not other.idempotent and other.seq == first.seq + 1  # positive control: a new key appends
        assert c.get_monitor("idem", token=owner).head == other.seq
