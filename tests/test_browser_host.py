"""The playground's EngineHost (plain CPython): every call goes through the router, long polls wake on the
append, and the admin door is the page's alone."""

from __future__ import annotations

import asyncio
import json

import pytest
from monitor_protocol.doors.browser import EngineHost
from waiting import eventually_async

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

HANG_GUARD = 30  # only stops a broken host from hanging the suite; no assertion depends on it


async def parked(host: EngineHost) -> None:
    """Until a long poll is parked on the monitor in the host's registry (checked every loop turn)."""
    await eventually_async(
        lambda: host.waiters.parked_on("ci"), timeout=HANG_GUARD, interval=0, what="parked"
    )


async def _feed(host: EngineHost) -> tuple[str, str, str]:
    r = await host.call("POST", "/monitors", {"id": "ci", "types": ["com.example.ci.run"]})
    owner = r.body["owner_token"]
    r = await host.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:r"}, token=owner)
    sub, reader = r.body["subscription"]["id"], r.body["token"]
    first = await host.call("GET", f"/subscriptions/{sub}/pull", token=reader)
    await host.call("POST", f"/subscriptions/{sub}/ack", {"cursor": first.body["next"]}, token=reader)
    return owner, sub, reader


async def test_long_poll_wakes_on_the_append():
    host = EngineHost()
    owner, sub, reader = await _feed(host)
    waiting = asyncio.ensure_future(
        host.call("GET", f"/subscriptions/{sub}/pull", token=reader, query={"wait": 50})
    )
    await parked(host)
    assert not waiting.done()  # held: nothing to deliver yet
    await host.call(
        "POST", "/monitors/ci/observations", {"type": "com.example.ci.run", "subject": "b1"}, token=owner
    )
    reply = await asyncio.wait_for(waiting, HANG_GUARD)
    assert reply.status == 200 and [o["subject"] for o in reply.body["observations"]] == ["b1"]


async def test_long_poll_that_times_out_answers_empty():
    host = EngineHost()
    _owner, sub, reader = await _feed(host)
    reply = await host.call("GET", f"/subscriptions/{sub}/pull", token=reader, query={"wait": 1})
    assert reply.status == 200 and reply.body["observations"] == []


async def test_admin_door_is_the_pages_alone():
    host = EngineHost()
    await _feed(host)
    mine = await host.call("GET", "/admin/log", query={"monitor": "ci"}, admin=True)
    assert mine.status == 200 and mine.body["observations"][0]["type"] == "ai.mentu.monitor.configured"
    theirs = await host.call("GET", "/admin/log", query={"monitor": "ci"}, token="guess")
    assert theirs.status == 404  # the public router has no admin routes at all


async def test_an_ack_and_pull_that_waits_acks_once_and_rechecks_as_a_plain_pull():
    """Woken while parked, the door asks again with the plain pull, never the ack again: a seek that moves
    the cursor back while the poll is parked (its `subscribed{seek}` row wakes the poll) stays moved."""
    host = EngineHost()
    _owner, sub, reader = await _feed(host)
    head = (await host.call("GET", f"/subscriptions/{sub}", token=reader)).body["cursor"]
    waiting = asyncio.ensure_future(
        host.call("POST", f"/subscriptions/{sub}/pull", {"ack": head, "wait": 50}, token=reader)
    )
    await parked(host)
    assert not waiting.done()  # parked, with the ack committed
    assert (await host.call("GET", f"/subscriptions/{sub}", token=reader)).body["cursor"] == head
    seek = {"cursor": 1, "reason": "read it all again"}
    assert (await host.call("POST", f"/subscriptions/{sub}/seek", seek, token=reader)).status == 200
    reply = await asyncio.wait_for(waiting, HANG_GUARD)
    assert reply.status == 200 and reply.body["cursor"] == 1  # re-acked, it would be `head` again
    assert int(reply.body["observations"][0]["sequence"]) == 1


async def test_a_reload_shows_the_last_pull_as_it_was():
    """The page writes every pull's time (a server holds them in memory for a while): a reload, a new engine
    on the same store, shows a reader's last pull as the page showed it (found by a tester: the card went
    back to the first pull's time). Control: a server's engine on the same store keeps the later pulls'
    time in memory only, so a new one reads the first."""
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.memory import MemoryStore

    now = [1_800_000_000.0]
    store = MemoryStore()
    host = EngineHost(store=store, clock=lambda: now[0])
    owner, sub, reader = await _feed(host)
    first = host.service.alive(store.get_subscription(sub)).last_pull
    now[0] += 10
    await host.call("GET", f"/subscriptions/{sub}/pull", token=reader)
    reloaded = EngineHost(store=store, clock=lambda: now[0])
    shown = await reloaded.call("GET", f"/subscriptions/{sub}", token=reader)
    assert shown.status == 200 and shown.body["last_pull"] == "2027-01-15T08:00:10.000Z", shown.body
    assert first is not None and first < now[0]

    server_store = MemoryStore()
    server = MonitorService(server_store, clock=lambda: now[0])
    owner = server.create_monitor({"id": "ci"}, None)["owner_token"]
    made = server.subscribe({"monitor": "ci", "subscriber": "agent:r"}, owner)
    sid, token = made["subscription"]["id"], made["token"]
    server.pull(sid, token)
    stored = server_store.get_subscription(sid).last_pull
    now[0] += 10
    server.pull(sid, token)
    assert server_store.get_subscription(sid).last_pull == stored  # remembered, not written yet
    assert server.alive(server_store.get_subscription(sid)).last_pull == now[0]


async def test_a_service_worker_request_path_is_read_percent_decoded_as_mp_serve_reads_it():
    """The shim hands over the URL's path as the browser has it (percent-encoded): `/monitors/c%69/state` is
    the monitor `ci`, as over HTTP, and a 404 names what was asked for decoded; an encoded slash stays data
    inside its segment (doors/http/targets.py), never a route."""
    from monitor_protocol.doors.browser import parse_shim_request

    host = EngineHost()
    owner, _sub, _reader = await _feed(host)

    def via_shim(path: str):
        method, decoded, query, headers, body = parse_shim_request(
            json.dumps({"method": "GET", "path": path, "headers": {"authorization": f"Bearer {owner}"}})
        )
        return host.call(method, decoded, query=query, headers=headers, raw_body=body)

    assert (await via_shim("/monitors/c%69/state")).status == 200
    missing = await via_shim("/monitors/%3Cb%20x%3E/state")
    assert missing.status == 404 and "'<b x>'" in missing.body["error"], missing.body
    assert (await via_shim("/monitors/ci%2Fstate")).status == 404  # not the route /monitors/ci/state
    assert (await via_shim("/monitors/ci/state")).status == 200  # control
