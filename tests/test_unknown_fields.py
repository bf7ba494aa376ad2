"""A member a call does not read is refused, naming it, never dropped: a misspelt `filters` would otherwise
make an unfiltered subscription from the beginning, and a JSON-RPC `wait` would answer at once as if it
had waited. Each refusal changes nothing; each positive control sends the same call with the right name."""

from __future__ import annotations

import pytest
from enginekit import Harness
from monitor_protocol.store.memory import MemoryStore

pytestmark = pytest.mark.quick


@pytest.fixture
def h() -> Harness:
    return Harness(MemoryStore())


def _refused(reply, name: str) -> None:
    assert reply.status == 400, reply.body
    assert reply.body["code"] == "INVALID" and reply.body["invalid"] == [name], reply.body
    assert repr(name) in reply.body["error"], reply.body


def test_a_subscribe_body_with_a_misspelt_field_is_refused_and_subscribes_nobody(h):
    owner = h.monitor("ci")
    typo = {"monitor": "ci", "subscriber": "agent:typo", "filters": {"types": ["com.example.ci.run"]}}
    refused = h.call("POST", "/subscriptions", typo, owner)
    _refused(refused, "filters")
    # no subscription, no subscribed row: the owner's refused call is logged as a rejection (section 10)
    assert h.call("GET", "/monitors/ci/state", token=owner).body["counters"]["subscriptions_active"] == 0
    logged = {int(o["sequence"]): o["type"] for o in h.log("ci", owner)}
    assert logged[refused.body["rejected_seq"]] == "ai.mentu.monitor.rejected"
    assert "ai.mentu.monitor.subscribed" not in set(list(logged.values())[:-1])  # the last: h.log's reader
    # control: the right name subscribes, with its filter
    right = {"monitor": "ci", "subscriber": "agent:typo", "filter": {"types": ["com.example.ci.run"]}}
    r = h.call("POST", "/subscriptions", right, owner)
    assert r.status == 201 and r.body["subscription"]["filter"] == {"types": ["com.example.ci.run"]}


@pytest.mark.parametrize(
    ("route", "body", "name"),
    [
        ("ack", {"cursor": 2, "x": 1}, "x"),
        ("seek", {"cursor": 1, "reason": "again", "curser": 1}, "curser"),
        ("retire", {"reason": "done", "why": "done"}, "why"),
    ],
)
def test_a_subscription_call_with_an_unknown_field_is_refused_and_moves_nothing(h, route, body, name):
    owner = h.monitor("ci")
    h.publish("ci", owner, actor="probe:ci")
    sub, token = h.subscribe("ci", owner)
    _refused(h.call("POST", f"/subscriptions/{sub}/{route}", body, token), name)
    assert h.pull(sub, token).body["cursor"] == 0  # still where it was, and still active
    # control: the same call without the stray member
    clean = {k: v for k, v in body.items() if k != name}
    assert h.call("POST", f"/subscriptions/{sub}/{route}", clean, token).status == 200


@pytest.mark.parametrize("action", ["pause", "retire"])
def test_a_monitor_lifecycle_call_with_an_unknown_field_is_refused_and_changes_nothing(h, action):
    owner = h.monitor("ci")
    _refused(h.call("POST", f"/monitors/ci/{action}", {"reasn": "typo"}, owner), "reasn")
    assert h.call("GET", "/monitors/ci", token=owner).body["active"] is True
    assert h.call("POST", f"/monitors/ci/{action}", {"reason": "typo fixed"}, owner).status == 200


def test_a_lease_call_with_an_unknown_field_is_refused(h):
    owner = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", owner, actor="probe:ci", subject="build-1")
    sub, token = h.subscribe("ci", owner, capabilities=["observe", "act"])
    body = {"subject": "build-1", "duration": 30}
    _refused(h.call("POST", f"/subscriptions/{sub}/leases/claim", body, token), "duration")
    right = {"subject": "build-1", "lease_duration_seconds": 30}
    assert h.call("POST", f"/subscriptions/{sub}/leases/claim", right, token).status == 201


def test_each_lease_call_takes_only_its_own_fields(h):
    """A claim's body is not a completion's: a field of another lease call is refused by each call that does
    not read it (a claim's `outcome` and a release's `lease_duration_seconds` were dropped without a word),
    and the refusal lists the call's own fields."""
    owner = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", owner, actor="probe:ci", subject="build-1")
    sub, token = h.subscribe("ci", owner, capabilities=["observe", "act"])
    leases = f"/subscriptions/{sub}/leases"
    r = h.call("POST", f"{leases}/claim", {"subject": "build-1", "outcome": "done"}, token)
    _refused(r, "outcome")
    assert "lease_duration_seconds" in r.body["error"] and "evidence" not in r.body["error"]
    assert h.call("POST", f"{leases}/claim", {"subject": "build-1", "note": "mine"}, token).status == 201
    r = h.call("POST", f"{leases}/release", {"subject": "build-1", "lease_duration_seconds": 5}, token)
    _refused(r, "lease_duration_seconds")
    _refused(h.call("POST", f"{leases}/renew", {"subject": "build-1", "reason": "x"}, token), "reason")
    assert h.call("GET", "/monitors/ci/state", token=owner).status == 200
    # controls: each call with its own fields
    assert (
        h.call("POST", f"{leases}/renew", {"subject": "build-1", "lease_duration_seconds": 60}, token).status
        == 200
    )
    assert h.call("POST", f"{leases}/release", {"subject": "build-1", "reason": "later"}, token).status == 200


def test_a_pause_takes_no_patch(h):
    owner = h.monitor("ci")
    r = h.call("POST", "/monitors/ci/pause", {"patch": {"description": "x"}}, owner)
    _refused(r, "patch")
    assert "'reason'" in r.body["error"] and "'patch'" not in r.body["error"].split("send only")[-1]
    assert h.call("GET", "/monitors/ci", token=owner).body["active"] is True
    assert h.call("POST", "/monitors/ci/update", {"patch": {"description": "x"}}, owner).status == 200


def test_a_monitor_creation_with_a_misspelt_field_is_refused_listing_what_it_takes(h):
    """`visiblity` for `visibility` would otherwise make a private monitor; the refusal lists the creation's
    own fields, as every other call's does, and creates nothing."""
    r = h.call("POST", "/monitors", {"id": "zz", "visiblity": "public"})
    _refused(r, "visiblity")
    listed = r.body["error"].split("send only")[-1]
    assert "'visibility'" in listed and "'subscribe_token'" in listed and "'id'" in listed, r.body
    assert h.call("GET", "/monitors/zz").status == 404
    # control: the right name creates the monitor, public
    assert h.call("POST", "/monitors", {"id": "zz", "visibility": "public"}).status == 201
    assert h.call("GET", "/monitors/zz").body["visibility"] == "public"


def _rpc(h: Harness, method: str, **params):
    return h.call("POST", "/rpc", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).body


def test_json_rpc_pull_refuses_wait_saying_where_a_long_poll_is(h):
    owner = h.monitor("ci")
    sub, token = h.subscribe("ci", owner)
    reply = _rpc(h, "feeds/pull", subscription=sub, token=token, wait=3)
    data = reply["error"]["data"]
    assert data["code"] == "INVALID" and data["invalid"] == ["wait"], reply
    assert "does not wait" in data["error"] and '{"wait": <seconds>}' in data["error"]
    stray = _rpc(h, "feeds/pull", subscription=sub, token=token, bogus=1)["error"]["data"]
    assert stray["invalid"] == ["bogus"] and "'limit'" in stray["error"], stray
    # control: the params it reads are read
    h.publish("ci", owner, actor="probe:ci")
    got = _rpc(h, "feeds/pull", subscription=sub, token=token, limit=1, cursor=1)["result"]
    assert len(got["observations"]) == 1 and got["next"] == 2, got


def test_json_rpc_body_methods_refuse_an_unknown_member_in_the_engines_words(h):
    owner = h.monitor("ci")
    sub, token = h.subscribe("ci", owner)
    data = _rpc(h, "feeds/ack", subscription=sub, token=token, cursor=1, x=1)["error"]["data"]
    assert data["code"] == "INVALID" and data["invalid"] == ["x"], data
    assert "result" in _rpc(h, "feeds/ack", subscription=sub, token=token, cursor=1)


@pytest.mark.parametrize(
    ("cursor", "said"),
    [(None, "not null"), (3.0, "not the number 3.0"), ([1], "not an array"), ({}, "not an object")],
)
def test_a_refused_value_is_named_in_jsons_words_not_pythons(h, cursor, said):
    owner = h.monitor("ci")
    sub, token = h.subscribe("ci", owner)
    r = h.call("POST", f"/subscriptions/{sub}/ack", {"cursor": cursor}, token)
    assert r.status == 400 and r.body["error"] == f"cursor must be an integer, {said}.", r.body
    created = h.call("POST", "/monitors", {"id": 5})
    assert created.status == 400 and "not the number 5." in created.body["error"], created.body
    # control: an integer is taken
    assert h.call("POST", f"/subscriptions/{sub}/ack", {"cursor": 1}, token).status == 200
