"""MonitorService.overview, the picture the playground draws every panel from: every monitor, and one
monitor's state, subscriptions (lag, unacknowledged seqs), leases (time left) and a page of its log. It is
read-only, so drawing the page never shows up in the counters, the cursors or the log."""

from __future__ import annotations

import asyncio

import pytest
from enginekit import Clock
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.browser import EngineHost
from monitor_protocol.store.memory import MemoryStore

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

CI = "com.example.ci.run"


def feed(svc: MonitorService):
    made = svc.create_monitor({"id": "builds", "types": [CI], "capabilities": ["observe", "act"]}, None)
    owner = made["owner_token"]
    for subject in ("build-1", "build-2", "build-3"):
        svc.publish("builds", {"type": CI, "subject": subject, "actor": "probe:ci"}, owner)
    sub = svc.subscribe(
        {"monitor": "builds", "subscriber": "agent:r", "filter": {"types": [CI]}, "from": "earliest"}, owner
    )
    return owner, sub["subscription"]["id"], sub["token"]


def test_unacked_is_what_a_crash_would_bring_back():
    svc = MonitorService(MemoryStore())
    _owner, sub, token = feed(svc)
    view = svc.overview("builds")["monitor"]["subscriptions"][0]
    assert view["unacked"] == [] and view["subscription"]["lag"] == 3  # control: nothing handed out yet
    pulled = svc.pull(sub, token, limit=2)
    view = svc.overview("builds")["monitor"]["subscriptions"][0]
    assert view["unacked"] == [int(o["id"]) for o in pulled["observations"]] == [2, 3]  # builds only
    again = svc.pull(sub, token, limit=2)
    assert all(o.get("redelivered") for o in again["observations"])  # exactly what came back redelivered
    svc.ack(sub, token, {"cursor": pulled["next"]})
    view = svc.overview("builds")["monitor"]["subscriptions"][0]
    assert view["unacked"] == [] and view["subscription"]["cursor"] == pulled["next"]
    assert view["subscription"]["lag"] == 1  # build-3 is left, through the reader's own filter


def test_overview_is_read_only():
    svc = MonitorService(MemoryStore())
    owner, sub, _token = feed(svc)
    before = svc.state("builds", owner)
    for _ in range(3):
        svc.overview("builds")
    after = svc.state("builds", owner)
    assert after["head"] == before["head"] and after["counters"] == before["counters"]
    assert after["ages"]["since_last_pull_s"] is None  # drawing the page is not a pull
    sub_row = svc.overview("builds")["monitor"]["subscriptions"][0]["subscription"]
    assert sub_row["last_pull"] is None and sub_row["cursor"] == 0


def test_every_monitor_is_listed_whoever_made_it_and_whatever_its_visibility():
    svc = MonitorService(MemoryStore())
    feed(svc)
    svc.create_monitor({"id": "ci", "visibility": "public"}, None)
    svc.create_monitor({"id": "secret", "visibility": "private"}, None)
    listed = {m["id"]: m for m in svc.overview(None)["monitors"]}
    assert set(listed) == {"builds", "ci", "secret"}
    assert listed["secret"]["visibility"] == "private" and listed["builds"]["head"] == 5
    assert svc.overview(None)["monitor"] is None


def test_leases_carry_their_time_left_and_expiry():
    clock = Clock()
    svc = MonitorService(MemoryStore(), clock=clock)
    owner = svc.create_monitor({"id": "jobs", "capabilities": ["observe", "act"]}, None)["owner_token"]
    svc.publish("jobs", {"type": "com.example.job", "subject": "s", "actor": "probe:ci"}, owner)
    w = svc.subscribe({"monitor": "jobs", "subscriber": "agent:w", "capabilities": ["observe", "act"]}, owner)
    svc.lease(w["subscription"]["id"], w["token"], "claim", {"subject": "s", "lease_duration_seconds": 8})
    lease = svc.overview("jobs")["monitor"]["leases"][0]
    assert lease["state"] == "held" and lease["expires_in_s"] == 8 and lease["expired"] is False
    assert lease["lease"]["holder"] == "sub:" + w["subscription"]["id"]
    clock.advance(9)
    lease = next(x for x in svc.overview("jobs")["monitor"]["leases"] if x["lease"]["subject"] == "s")
    assert lease["expired"] is True or lease["state"] == "free"  # the lazy sweep may have freed it already


def test_the_log_page_starts_where_asked():
    svc = MonitorService(MemoryStore())
    feed(svc)
    page = svc.overview("builds", from_seq=3, limit=200)["monitor"]["log"]
    assert [o["id"] for o in page["observations"]] == ["3", "4", "5"] and page["next"] == 6


def test_an_unknown_monitor_is_not_found():
    svc = MonitorService(MemoryStore())
    with pytest.raises(ProtocolError) as err:
        svc.overview("nope")
    assert err.value.code == "NOT_FOUND"


def test_the_host_answers_the_overview_and_a_refusal_as_a_reply():
    host = EngineHost()

    async def go():
        await host.call("POST", "/monitors", {"id": "ci"})
        ok = await host.overview("ci")
        missing = await host.overview("nope")
        return ok, missing

    ok, missing = asyncio.run(go())
    assert ok.status == 200 and ok.body["monitor"]["monitor"]["id"] == "ci"
    assert missing.status == 404 and missing.body["code"] == "NOT_FOUND"


def test_a_long_unacknowledged_range_is_listed_newest_first_and_says_there_is_more():
    svc = MonitorService(MemoryStore())
    made = svc.create_monitor({"id": "wide", "types": [CI, "com.example.other"]}, None)
    owner = made["owner_token"]
    sub = svc.subscribe({"monitor": "wide", "subscriber": "agent:r", "filter": {"types": [CI]}}, owner)
    sid, token = sub["subscription"]["id"], sub["token"]
    for i in range(1200):  # one build in 50 rows: a selective filter over a long range
        kind = CI if i % 50 == 0 else "com.example.other"
        svc.publish("wide", {"type": kind, "subject": f"s{i}", "actor": "probe:ci"}, owner)
    pulled = svc.pull(sid, token, limit=200)
    assert len(pulled["observations"]) == 24
    view = svc.overview("wide")["monitor"]["subscriptions"][0]
    assert view["unacked"] == sorted(view["unacked"]) and view["unacked"][-1] == int(
        pulled["observations"][-1]["id"]
    )
    assert view["unacked_more"] is True and len(view["unacked"]) < 24  # bounded, and it says so
    svc.ack(sid, token, {"cursor": pulled["next"]})
    view = svc.overview("wide")["monitor"]["subscriptions"][0]
    assert view["unacked"] == [] and view["unacked_more"] is False  # control
