"""One named test per principle of docs/protocol.md section 2 (P1-P14), each refusal beside its positive control,
on every store."""

from __future__ import annotations

import pytest
from enginekit import STORE_KINDS, Harness, make_store

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

OWNER_HUMAN = "human:you"


@pytest.fixture(params=STORE_KINDS)
def h(request, tmp_path):
    harness = Harness(make_store(request.param, tmp_path))
    yield harness
    harness.store.close()


def test_p1_machine_cannot_claim_a_persons_certainty(h):
    tok = h.monitor("ci")
    refused = h.publish("ci", tok, actor="agent:claude", tier="src")
    assert refused.status == 400 and refused.body["code"] == "TIER_NOT_ASSERTABLE"
    certify = h.publish("ci", tok, actor="agent:claude", verification="certified")
    assert certify.status == 403 and certify.body["code"] == "PROVENANCE_CEILING"
    human_origin = h.publish("ci", tok, actor="probe:ci", origin="human")
    assert human_origin.status == 403 and human_origin.body["code"] == "PROVENANCE_CEILING"
    stranger = h.publish(
        "ci", tok, actor="agent:claude", on_behalf_of="human:stranger", origin="human", tier="src"
    )
    assert stranger.status == 403 and stranger.body["code"] == "PROVENANCE_CEILING"
    # positive controls: delegation to the owner, and a person's own src
    delegated = h.publish(
        "ci", tok, actor="agent:claude", on_behalf_of=OWNER_HUMAN, origin="human", tier="src"
    )
    assert delegated.status == 201, delegated.body
    prov = delegated.body["observation"]["data"]["provenance"]
    assert (prov["actor"], prov["on_behalf_of"], prov["tier"]) == ("agent:claude", OWNER_HUMAN, "src")
    own = h.publish("ci", tok, actor=OWNER_HUMAN, tier="src")
    assert own.status == 201 and own.body["observation"]["origin"] == "human"
    # defaults never reach the top
    agent = h.publish("ci", tok, actor="agent:claude")
    assert (agent.body["observation"]["tier"], agent.body["observation"]["verified"]) == (
        "unverified",
        "unverified",
    )
    probe = h.publish("ci", tok, actor="probe:ci")
    assert (probe.body["observation"]["tier"], probe.body["observation"]["verified"]) == (
        "measured",
        "machine_verified",
    )


def test_p1_non_human_owner_has_a_ceiling(h):
    r = h.call("POST", "/monitors", {"id": "bot", "owner": "agent:bot"})
    tok = r.body["owner_token"]
    refused = h.publish("bot", tok, actor="agent:bot", origin="human", tier="src")
    assert refused.status == 403 and refused.body["code"] == "PROVENANCE_CEILING"
    # A person's name under a machine's token is another person than the owner (rule 6): refused.
    posing = h.publish("bot", tok, actor="human:someone")
    assert posing.status == 403 and posing.body["code"] == "PROVENANCE_CEILING"
    accepted = h.publish("bot", tok, actor="agent:bot")  # positive control: the owner itself
    assert accepted.status == 201 and accepted.body["observation"]["origin"] == "agent"


def test_p2_a_rejection_is_evidence(h):
    tok = h.monitor("ci")
    raw = {"type": "com.example.ci.run", "actor": "agent:x", "tier": "src", "data": {"claim": "trust me"}}
    refused = h.call("POST", "/monitors/ci/observations", raw, tok)
    assert refused.status == 400
    seq = refused.body["rejected_seq"]
    row = [o for o in h.log("ci", tok) if int(o["id"]) == seq][0]
    assert row["type"] == "ai.mentu.monitor.rejected"
    assert row["data"]["payload"]["raw"] == raw and row["data"]["payload"]["code"] == "TIER_NOT_ASSERTABLE"
    # control: an accepted observation leaves no rejected row
    ok = h.publish("ci", tok, actor="probe:ci")
    assert ok.status == 201 and "rejected_seq" not in ok.body
    assert h.call("GET", "/monitors/ci/state", token=tok).body["counters"]["rejected"] == 1


def test_p3_state_says_what_it_does_not_know(h):
    tok = h.monitor("ci")
    st = h.call("GET", "/monitors/ci/state", token=tok).body
    assert st["ages"]["since_last_observation_s"] is None and st["ages"]["since_last_pull_s"] is None
    assert st["last"] is None and st["covers_until"] is None
    assert st["confidence"]["value"] is None
    assert st["confidence"]["inputs"]["missing"] == ["independence", "corroboration", "track_record"]
    assert st["confidence"]["gaps"][:2] == ["independence_unknown", "no_event_provenance"]
    assert "no_subscribers" in st["confidence"]["gaps"] and "unattested_origin" in st["confidence"]["gaps"]
    # control: once something is known, it is a number (0 is a real age here, not a default)
    h.publish("ci", tok, actor="probe:ci")
    h.clock.advance(7)
    st = h.call("GET", "/monitors/ci/state", token=tok).body
    assert st["ages"]["since_last_observation_s"] == 7 and st["last"]["type"] == "com.example.ci.run"
    assert (
        "no_event_provenance" not in st["confidence"]["gaps"] and "single_actor" in st["confidence"]["gaps"]
    )


def test_p4_pull_does_not_commit_ack_does(h):
    tok = h.monitor("ci")
    for _ in range(3):
        h.publish("ci", tok, actor="probe:ci")
    sub, rt = h.subscribe("ci", tok)
    first = h.pull(sub, rt).body
    second = h.pull(sub, rt).body
    assert [o["id"] for o in first["observations"]] == [o["id"] for o in second["observations"]]
    assert second["cursor"] == 0 and second["redelivered"] == len(second["observations"])
    acked = h.ack(sub, rt, first["next"]).body
    assert acked["cursor"] == first["next"] and acked["lag"] == 0
    assert h.pull(sub, rt).body["observations"] == []
    back = h.ack(sub, rt, 1)
    assert back.status == 409 and back.body["code"] == "CURSOR_BACKWARDS"


def test_p5_head_is_real_lag_is_filtered(h):
    tok = h.monitor("ci", types=["com.example.ci.run", "com.example.ci.deploy"])
    sub, rt = h.subscribe("ci", tok, filter={"types": ["com.example.ci.deploy"]})
    h.publish("ci", tok, actor="probe:ci")
    h.publish("ci", tok, type="com.example.ci.deploy", actor="probe:ci")
    p = h.pull(sub, rt).body
    assert len(p["observations"]) == 1 and p["lag"] == 1
    assert p["head"] == h.call("GET", "/monitors/ci", token=tok).body["head"]
    h.ack(sub, rt, p["next"])
    h.publish("ci", tok, actor="probe:ci")  # not for this reader
    p = h.pull(sub, rt).body
    assert p["lag"] == 0 and p["observations"] == [] and p["head"] == p["next"] - 1


def test_p6_registration_is_not_consumption(h):
    tok = h.monitor("ci")
    h.publish("ci", tok, subject="build-1", actor="probe:ci")
    mute, mt = h.subscribe(
        "ci", tok, subscriber="agent:mute", retire_after_mute_seconds=60, capabilities=["observe"]
    )
    busy, bt = h.subscribe("ci", tok, subscriber="agent:busy", retire_after_mute_seconds=60)
    streamer, st = h.subscribe("ci", tok, subscriber="agent:sse", retire_after_mute_seconds=60)
    h.clock.advance(40)
    h.pull(busy, bt)
    h.service.touch(streamer, st)  # what the SSE door does: following a stream is consuming
    h.clock.advance(30)
    assert h.service.sweep() == 1
    assert h.pull(mute, mt).body["retired"] is True
    assert h.pull(busy, bt).status == 200  # control: the reader that pulled is still there
    assert h.pull(streamer, st).status == 200  # and so is the one that followed the stream
    will = [o for o in h.log("ci", tok) if o["type"] == "ai.mentu.monitor.subscription_retired"]
    assert will[0]["data"]["payload"]["reason"] == "mute" and will[0]["actor"] == "system:sweep"


def test_p7_capabilities_are_granted_not_requested(h):
    tok = h.monitor("ci", capabilities=["observe", "act"], visibility="public")
    r = h.call(
        "POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:stranger", "capabilities": ["act"]}
    )
    assert r.status == 403 and r.body["code"] == "CAPABILITY_MISSING" and r.body["granted"] == ["observe"]
    ok = h.call(
        "POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:w", "capabilities": ["act"]}, tok
    )
    assert ok.status == 201 and ok.body["subscription"]["capabilities"] == ["act"]


def test_p8_every_observation_carries_the_monitors_horizon(h):
    tok = h.monitor("ci", horizon="minute")
    assert h.publish("ci", tok, actor="probe:ci").body["observation"]["horizon"] == "minute"
    bad = h.call("POST", "/monitors", {"id": "x1", "horizon": "fortnight"})
    assert bad.status == 400 and bad.body["code"] == "UNKNOWN_VOCABULARY" and "week" in bad.body["known"]


def test_p9_rules_are_mechanical_same_input_same_state(h):
    tok = h.monitor("ci")
    h.publish("ci", tok, actor="probe:ci")
    a = h.call("GET", "/monitors/ci/state", token=tok).body
    b = h.call("GET", "/monitors/ci/state", token=tok).body
    assert a == b and a["confidence"]["computed_by"].startswith("monitor-protocol")


def test_p10_configuration_is_an_observation(h):
    tok = h.monitor("ci")
    h.call("POST", "/monitors/ci/update", {"patch": {"name": "CI builds"}, "reason": "rename"}, tok)
    h.call("POST", "/monitors/ci/pause", {"reason": "maintenance"}, tok)
    rows = [o for o in h.log("ci", tok) if o["type"] == "ai.mentu.monitor.configured"]
    actions = [o["data"]["payload"]["action"] for o in rows]
    assert actions == ["create", "update", "pause"]
    update = rows[1]["data"]["payload"]
    assert update["diff"] == {"name": {"before": "ci", "after": "CI builds"}} and update["reason"] == "rename"
    assert len(update["before_digest"]) == 64 and rows[0]["data"]["payload"]["before_digest"] is None
    assert update["after"]["version"] == 2


def test_p11_vocabulary_is_validated_on_write(h):
    tok = h.monitor("ci")
    bad = h.publish("ci", tok, tier="gospel")
    assert bad.status == 400 and bad.body["code"] == "UNKNOWN_VOCABULARY" and bad.body["invalid"] == "gospel"
    undeclared = h.publish("ci", tok, type="com.example.other")
    assert undeclared.status == 400 and undeclared.body["known"] == ["com.example.ci.run"]
    bad_filter = h.call(
        "POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:a", "filter": {"colour": []}}, tok
    )
    assert (
        bad_filter.status == 400
        and bad_filter.body["code"] == "INVALID_FILTER"
        and "types" in bad_filter.body["known_keys"]
    )
    sub, reader = h.subscribe("ci", tok)
    unknown = h.call("GET", f"/subscriptions/{sub}/pull", token=reader, query=[("colour", "red")])
    keys = unknown.body["known_keys"]
    assert (
        unknown.status == 400
        and unknown.body["code"] == "INVALID_FILTER"
        and unknown.body["invalid"] == "colour"
    )
    assert "limit" in keys and "#<tag>" in keys and len(keys) == len(set(keys)), keys  # each key once
    assert h.publish("ci", tok, tier="measured", actor="probe:ci").status == 201


def test_p12_filters_match_addressing_not_ownership(h):
    tok = h.monitor("ci")
    sub, rt = h.subscribe("ci", tok, filter={"#env": ["prod"]})
    text_sub, tt = h.subscribe(
        "ci", tok, subscriber="agent:t", filter={"text": "flaky", "types": ["com.example.*"]}
    )
    h.publish("ci", tok, actor="probe:ci", tags={"env": "prod"}, data={"note": "ok"})
    h.publish("ci", tok, actor="probe:ci", tags={"env": "dev"}, data={"note": "a flaky test"})
    assert [o["data"]["tags"]["env"] for o in h.pull(sub, rt).body["observations"]] == ["prod"]
    assert [o["data"]["note"] for o in h.pull(text_sub, tt).body["observations"]] == ["a flaky test"]


def test_p13_nothing_is_edited_corrections_supersede(h):
    tok = h.monitor("ci")
    first = h.publish("ci", tok, actor="probe:ci", data={"status": "failed"}).body
    fix = h.publish("ci", tok, actor="probe:ci", data={"status": "passed"}, supersedes=first["seq"])
    assert fix.status == 201
    assert fix.body["observation"]["data"]["provenance"]["supersedes"] == {
        "source": "monitor:ci",
        "id": str(first["seq"]),
    }
    original = [o for o in h.log("ci", tok) if int(o["id"]) == first["seq"]][0]
    assert original["data"]["status"] == "failed"
    missing = h.publish("ci", tok, actor="probe:ci", supersedes=999)
    assert missing.status == 404


def test_p14_private_by_default_shared_needs_its_token(h):
    tok = h.monitor("priv")
    assert h.call("GET", "/monitors/priv").status == 404
    assert [m["id"] for m in h.call("GET", "/monitors").body["monitors"]] == []
    assert [m["id"] for m in h.call("GET", "/monitors", token=tok).body["monitors"]] == ["priv"]
    r = h.call("POST", "/monitors", {"id": "sh", "visibility": "shared"})
    st = r.body["subscribe_token"]
    assert h.call("POST", "/subscriptions", {"monitor": "sh", "subscriber": "agent:a"}).status == 401
    assert h.call("POST", "/subscriptions", {"monitor": "sh", "subscriber": "agent:a"}, st).status == 201
    assert h.call("GET", "/monitors/sh", token=st).status == 200
    pub = h.call("POST", "/monitors", {"id": "pub", "visibility": "public"})
    assert pub.status == 201 and h.call("GET", "/monitors/pub").status == 200


def test_budget_and_evidence_limits(h):
    tok = h.monitor(
        "ci", limits={"observations_per_day": 2, "require_evidence": True}, capabilities=["observe", "act"]
    )
    assert h.publish("ci", tok, actor="probe:ci", subject="job").status == 201
    assert h.publish("ci", tok, actor="probe:ci").status == 201
    over = h.publish("ci", tok, actor="probe:ci")
    assert over.status == 429 and over.body["code"] == "OVER_BUDGET" and over.body["limit"] == 2
    assert "rejected_seq" in over.body
    # a cap lifted for a while and set again the same day: the day's count was kept, not restarted
    assert h.service.configure("ci", "update", {"patch": {"limits": {"require_evidence": True}}}, tok)
    assert h.publish("ci", tok, actor="probe:ci").status == 201  # no cap: accepted, the count untouched
    assert h.service.configure(
        "ci", "update", {"patch": {"limits": {"observations_per_day": 2, "require_evidence": True}}}, tok
    )
    assert h.publish("ci", tok, actor="probe:ci").body["code"] == "OVER_BUDGET"
    h.clock.advance(86400)
    assert h.publish("ci", tok, actor="probe:ci").status == 201  # control: a new day, a new budget
    sub, rt = h.subscribe("ci", tok, capabilities=["act"])
    assert h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "job"}, rt).status == 201
    bare = h.call("POST", f"/subscriptions/{sub}/leases/complete", {"subject": "job", "outcome": "done"}, rt)
    assert bare.status == 409 and bare.body["code"] == "EVIDENCE_REQUIRED"
    done = h.call(
        "POST",
        f"/subscriptions/{sub}/leases/complete",
        {"subject": "job", "outcome": "done", "evidence": "log#1"},
        rt,
    )
    assert done.status == 200 and done.body["ok"] is True


def test_admin_log_reads_without_a_subscription(h):
    tok = h.monitor("ci")
    h.publish("ci", tok, actor="probe:ci")
    assert h.call("GET", "/admin/log", query=[("monitor", "ci")]).status == 401
    r = h.call(
        "GET", "/admin/log", token="admin-token", query=[("monitor", "ci"), ("from", "2"), ("limit", "5")]
    )
    assert r.status == 200 and [o["id"] for o in r.body["observations"]] == ["2"] and r.body["next"] == 3
    st = h.call("GET", "/monitors/ci/state", token=tok).body
    assert st["counters"]["subscriptions_active"] == 0  # reading the log subscribed nobody
