"""The trust and hardening rules of docs/protocol.md sections 3, 6, 7, 8 and 10, one named test per rule, each
refusal beside its positive control, on every store. The attacks are the ones found against the server."""

from __future__ import annotations

import json
import re

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from monitor_protocol.api.messages import Request
from monitor_protocol.core import timefmt, tokens
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import StorageError
from monitor_protocol.core.vocab import SCAN_BUDGET
from monitor_protocol.store.memory import MemoryStore

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

A = "com.example.ci.run"
B = "com.example.ci.deploy"
REJECTED = "ai.mentu.monitor.rejected"
SUBSCRIBED = "ai.mentu.monitor.subscribed"
RETIRED = "ai.mentu.monitor.subscription_retired"


@pytest.fixture(params=STORE_KINDS)
def h(request, tmp_path):
    harness = Harness(make_store(request.param, tmp_path))
    yield harness
    harness.store.close()


def raw_call(h: Harness, method: str, path: str, raw: bytes, token: str | None = None):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    resp = h.router.handle(Request(method, "/mp/v0" + path, [], headers, raw))
    return resp


def of_type(log: list[dict], type_: str) -> list[dict]:
    return [o for o in log if o["type"] == type_]


def rows_size(obs: dict) -> int:
    return len(json.dumps(obs).encode())


# ---- section 3: names -------------------------------------------------------------------------------


def test_subscriber_names_of_any_form_are_accepted_and_treated_as_agents(h):
    h.monitor("ci", visibility="public")
    for name in ("reader-104749", "x", "mailto:a@b", "HuMaN:x", "a" * 256):
        r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": name})
        assert r.status == 201, (name, r.body)
        assert r.body["subscription"]["subscriber"] == name
    for bad in ("human:you\n", "a b", "tab\there", "nul\x00", "line\u2028sep", "", "a" * 257, 7):
        r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": bad})
        assert r.status == 400 and r.body["code"] == "INVALID", (bad, r.body)


def test_actor_prefixes_are_lower_case_so_mixed_case_is_an_agent(h):
    tok = h.monitor("ci")  # owned by human:you
    mixed = h.publish("ci", tok, actor="HuMaN:x")
    assert mixed.status == 201 and mixed.body["observation"]["origin"] == "agent"
    assert mixed.body["observation"]["tier"] == "unverified"
    owner = h.publish("ci", tok, actor="human:you")  # positive control: the real prefix is a person
    assert owner.status == 201 and owner.body["observation"]["origin"] == "human"
    trailing = h.publish("ci", tok, actor="human:you\n")
    assert trailing.status == 400 and trailing.body["code"] == "INVALID"
    for nobody in ("human:", "agent:", "HUMAN:"):  # a prefix with no name after it names nobody
        said = h.publish("ci", tok, actor=nobody)
        assert said.status == 400 and "names nobody" in said.body["error"], said.body
    created = h.call("POST", "/monitors", {"id": "anon", "owner": "human:"})
    assert created.status == 400 and "names nobody" in created.body["error"]
    assert h.publish("ci", tok, actor="agent:a").status == 201  # positive control


# ---- section 6: rules 6 and 7 ------------------------------------------------------------------------


def test_rule6_a_token_cannot_speak_for_another_person(h):
    tok = h.monitor("ci")
    stranger = h.publish(
        "ci", tok, actor="human:stranger", origin="human", tier="src", verification="human_verified"
    )
    assert stranger.status == 403 and stranger.body["code"] == "PROVENANCE_CEILING"
    assert "rejected_seq" in stranger.body
    owner = h.publish("ci", tok, actor="human:you", origin="human", tier="src", verification="human_verified")
    assert owner.status == 201 and owner.body["observation"]["tier"] == "src"
    delegated = h.publish(
        "ci", tok, actor="agent:claude", on_behalf_of="human:you", origin="human", tier="src"
    )
    assert delegated.status == 201
    prov = delegated.body["observation"]["data"]["provenance"]
    assert prov["actor"] == "agent:claude" and prov["on_behalf_of"] == "human:you"


def test_rule7_only_the_server_writes_as_the_system(h):
    tok = h.monitor("ci")
    for fields in ({"actor": "system:guard"}, {"origin": "system"}, {"actor": "agent:x", "origin": "system"}):
        r = h.publish("ci", tok, **fields)
        assert r.status == 403 and r.body["code"] == "PROVENANCE_CEILING", (fields, r.body)
    control = h.publish("ci", tok, actor="probe:ci")
    assert control.status == 201 and control.body["observation"]["origin"] == "probe"


# ---- section 7: protocol rows carry the server's provenance and are bounded --------------------------


def test_no_anonymous_caller_can_put_a_human_origin_into_a_log(h):
    h.call("POST", "/monitors", {"id": "bot", "owner": "agent:bot", "visibility": "public"})
    sub = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "bot", "subscriber": "human:ceo", "filter": {"text": "APPROVED"}},
    )
    assert sub.status == 201
    sid, rtok = sub.body["subscription"]["id"], sub.body["token"]
    seek = h.call("POST", f"/subscriptions/{sid}/seek", {"cursor": 0, "reason": "APPROVED BY CEO"}, rtok)
    assert seek.status == 200
    rows = h.call("GET", f"/subscriptions/{sid}/pull", token=rtok, query=[("cursor", "1"), ("text", "")])
    log = h.service.read_log("bot", 1, 200)["observations"]
    written = of_type(log, SUBSCRIBED)
    assert len(written) == 2 and rows.status == 200
    for row in written:
        assert row["actor"] == "human:ceo"  # the name the caller gave, kept as a claim
        assert (row["origin"], row["tier"], row["verified"]) == ("system", "measured", "machine_verified")
        assert row["data"]["provenance"]["origin"] == "system"
    assert all(o["origin"] != "human" for o in log)


def test_protocol_rows_are_bounded_by_the_input_limits(h):
    h.monitor("ci", visibility="public")
    huge_text = {"monitor": "ci", "subscriber": "human:ceo", "filter": {"text": "APPROVED BY CEO " * 30000}}
    r = h.call("POST", "/subscriptions", huge_text)
    assert r.status == 400 and r.body["code"] == "INVALID" and "4096" in r.body["error"]
    long_text = {"monitor": "ci", "subscriber": "human:ceo", "filter": {"text": "x" * 257}}
    r = h.call("POST", "/subscriptions", long_text)
    assert r.status == 400 and r.body["code"] == "INVALID" and "256" in r.body["error"]
    at_limit = h.call(
        "POST", "/subscriptions", {"monitor": "ci", "subscriber": "a", "filter": {"text": "x" * 256}}
    )
    assert at_limit.status == 201
    big_filter = {
        "monitor": "ci",
        "subscriber": "b",
        "filter": {"subjects": [f"s{i:05d}" * 20 for i in range(40)]},
    }
    r = h.call("POST", "/subscriptions", big_filter)
    assert r.status == 400 and "4096" in r.body["error"]
    sid, rtok = at_limit.body["subscription"]["id"], at_limit.body["token"]
    long_reason = h.call("POST", f"/subscriptions/{sid}/seek", {"cursor": 0, "reason": "é" * 513}, rtok)
    assert long_reason.status == 400 and "1024" in long_reason.body["error"]
    ok_reason = h.call("POST", f"/subscriptions/{sid}/seek", {"cursor": 0, "reason": "x" * 1024}, rtok)
    assert ok_reason.status == 200
    for row in h.service.read_log("ci", 1, 200)["observations"]:
        assert rows_size(row) < 8192, row["type"]


def test_a_rejected_row_keeps_a_bounded_excerpt_of_a_large_raw_payload(h):
    tok = h.monitor("ci")
    small = {"type": A, "actor": "agent:x", "tier": "src", "data": {"claim": "trust me"}}
    r = h.call("POST", "/monitors/ci/observations", small, tok)
    assert r.status == 400
    big = {"type": A, "tier": "src", "actor": "agent:x", "data": {"blob": "z" * 200_000}}
    r2 = h.call("POST", "/monitors/ci/observations", big, tok)
    assert r2.status == 400
    rows = {int(o["id"]): o for o in h.service.read_log("ci", 1, 200)["observations"]}
    kept = rows[r.body["rejected_seq"]]["data"]["payload"]
    assert kept["raw"] == small  # whole when small (C16)
    excerpt = rows[r2.body["rejected_seq"]]["data"]["payload"]
    assert excerpt["raw_truncated"] is True and excerpt["raw_bytes"] > 200_000
    assert len(excerpt["raw_sha256"]) == 64 and rows_size(rows[r2.body["rejected_seq"]]) < 8192


# ---- section 8 ---------------------------------------------------------------------------------------


def test_an_inline_filter_disjoint_from_the_subscription_is_invalid_filter(h):
    tok = h.monitor("ci", types=[A, B])
    h.publish("ci", tok, subject="build-1")
    sid, rtok = h.subscribe("ci", tok, filter={"types": [A], "subjects": ["build-*"]})
    for query in ([("types", B)], [("subjects", "deploy-1")], [("types", "com.example.ci.d*")]):
        r = h.call("GET", f"/subscriptions/{sid}/pull", token=rtok, query=query)
        assert r.status == 400 and r.body["code"] == "INVALID_FILTER", (query, r.body)
        assert "subscription_filter" in r.body and "inline_filter" in r.body
    for query in ([("types", A)], [("subjects", "build-1")], [("types", "com.example.*")]):
        r = h.call("GET", f"/subscriptions/{sid}/pull", token=rtok, query=query)
        assert r.status == 200 and [o["subject"] for o in r.body["observations"]] == ["build-1"], query


def test_time_ahead_of_the_server_clock_is_refused_and_freshness_is_the_servers(h):
    tok = h.monitor("ci", ttl_seconds=60)
    future = h.publish("ci", tok, time="2999-01-01T00:00:00Z")
    assert future.status == 400 and future.body["code"] == "INVALID" and "rejected_seq" in future.body
    near = h.publish("ci", tok, time=timefmt.iso(h.clock() + 200))  # within the 300 s allowance
    assert near.status == 201
    h.clock.advance(30)
    past = h.publish("ci", tok, time="2020-01-01T00:00:00Z")
    assert past.status == 201 and past.body["observation"]["time"] == "2020-01-01T00:00:00.000Z"
    state = h.call("GET", "/monitors/ci/state", token=tok).body
    assert state["ages"]["since_last_observation_s"] == 0
    assert state["covers_until"] == timefmt.iso(h.clock())
    assert "stale_source" not in state["confidence"]["gaps"]
    h.clock.advance(120)  # the server's clock, not the claimed time, makes the source stale
    assert "stale_source" in h.call("GET", "/monitors/ci/state", token=tok).body["confidence"]["gaps"]


def test_revocation_retires_a_reader_who_could_no_longer_subscribe(h):
    tok = h.monitor("ci", visibility="public", capabilities=["observe", "act"])
    h.publish("ci", tok, subject="job-1")
    anon_id, anon_tok = h.subscribe("ci", None, subscriber="agent:stranger")
    own_id, own_tok = h.subscribe("ci", tok, subscriber="agent:worker", capabilities=["observe", "act"])
    assert h.pull(anon_id, anon_tok).status == 200  # positive control before the change
    r = h.call("POST", "/monitors/ci/update", {"patch": {"visibility": "private"}, "reason": "closing"}, tok)
    assert r.status == 200
    gone = h.pull(anon_id, anon_tok)
    assert gone.status == 404 and gone.body.get("retired") is True
    again = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:stranger"}, anon_tok)
    assert again.status == 404  # its old token opens nothing any more
    assert h.call("GET", "/monitors/ci", token=anon_tok).status == 404
    assert h.pull(own_id, own_tok).status == 200  # the owner's grant survives
    log = h.service.read_log("ci", 1, 200)["observations"]
    retired = [o for o in of_type(log, RETIRED) if o["data"]["payload"]["subscription"] == anon_id]
    assert retired and retired[0]["data"]["payload"]["reason"] == "revoked"


def test_revocation_shrinks_capabilities_so_act_removed_stops_claims(h):
    tok = h.monitor("ci", visibility="public", capabilities=["observe", "act"])
    for s in ("job-1", "job-2"):
        h.publish("ci", tok, subject=s)
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:worker", capabilities=["observe", "act"])
    claim = h.call("POST", f"/subscriptions/{sid}/leases/claim", {"subject": "job-1"}, rtok)
    assert claim.status == 201  # positive control
    r = h.call("POST", "/monitors/ci/update", {"patch": {"capabilities": ["observe"]}}, tok)
    assert r.status == 200
    refused = h.call("POST", f"/subscriptions/{sid}/leases/claim", {"subject": "job-2"}, rtok)
    assert refused.status == 403 and refused.body["code"] == "CAPABILITY_MISSING"
    info = h.call("GET", f"/subscriptions/{sid}", token=rtok).body
    assert info["capabilities"] == ["observe"]
    assert h.store.get_lease("ci", "job-1").holder is None  # the held lease was released


def test_an_expired_lease_counts_as_an_attempt_and_a_release_does_not(h):
    tok = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", tok, subject="job-1")
    sid, rtok = h.subscribe("ci", tok, capabilities=["observe", "act"])
    claim = {"subject": "job-1", "lease_duration_seconds": 1}
    for _ in range(3):  # releases give the work back without counting
        assert h.call("POST", f"/subscriptions/{sid}/leases/claim", claim, rtok).status == 201
        assert (
            h.call("POST", f"/subscriptions/{sid}/leases/release", {"subject": "job-1"}, rtok).status == 200
        )
    assert h.store.get_lease("ci", "job-1").attempts == 0
    for n in range(1, 6):  # a worker that keeps crashing while holding it
        r = h.call("POST", f"/subscriptions/{sid}/leases/claim", claim, rtok)
        assert r.status == 201, (n, r.body)
        h.clock.advance(2)
        h.service.sweep()
        assert h.store.get_lease("ci", "job-1").attempts == n
    dead = h.call("POST", f"/subscriptions/{sid}/leases/claim", claim, rtok)
    assert dead.status == 409 and dead.body["code"] == "DEAD_LETTERED"
    expired = [
        o["data"]["payload"]
        for o in h.service.read_log("ci", 1, 200)["observations"]
        if o["type"] == "ai.mentu.monitor.lease" and o["data"]["payload"]["action"] == "expired"
    ]
    assert [p["attempts"] for p in expired] == [1, 2, 3, 4, 5] and expired[-1]["dead_letter"] is True


def test_a_repeated_idempotency_key_appends_nothing(h):
    tok = h.monitor("ci")
    first = h.publish("ci", tok, subject="build-1", idempotency_key="k-1")
    assert first.status == 201 and first.body["idempotent"] is False
    again = h.publish("ci", tok, subject="build-1", idempotency_key="k-1")
    assert again.status == 200 and again.body["idempotent"] is True
    assert again.body["seq"] == first.body["seq"] and again.body["observation"]["id"] == str(
        first.body["seq"]
    )
    header = h.call("POST", "/monitors/ci/observations", {"type": A}, tok, headers={"idempotency-key": "k-2"})
    header_again = h.call(
        "POST", "/monitors/ci/observations", {"type": A}, tok, headers={"idempotency-key": "k-2"}
    )
    assert header.status == 201 and header_again.status == 200
    assert header_again.body["seq"] == header.body["seq"]
    other = h.publish("ci", tok, idempotency_key="k-3")  # a different key appends
    assert other.status == 201 and other.body["seq"] == header.body["seq"] + 1
    head = h.call("GET", "/monitors/ci", token=tok).body["head"]
    assert head == other.body["seq"]
    for bad in ("x" * 129, "tab\tkey", "é", ""):
        r = h.publish("ci", tok, idempotency_key=bad)
        assert r.status == 400 and r.body["code"] == "INVALID", bad
    h.clock.advance(86_401)  # after the window the key is forgotten
    h.service.sweep()
    late = h.publish("ci", tok, subject="build-1", idempotency_key="k-1")
    assert late.status == 201 and late.body["seq"] > head


def test_subscription_ids_have_16_hex_digits_and_a_collision_never_replaces(h, monkeypatch):
    h.monitor("ci", visibility="public")
    first_id, first_tok = h.subscribe("ci", None, subscriber="agent:first")
    assert re.fullmatch(r"sub-[0-9a-f]{16}", first_id)
    minted = iter([first_id, "sub-00000000000000ab"])
    monkeypatch.setattr(tokens, "new_id", lambda prefix, length=8: next(minted))
    second_id, _ = h.subscribe("ci", None, subscriber="agent:second")
    assert second_id == "sub-00000000000000ab"
    assert h.pull(first_id, first_tok).status == 200  # the first reader is untouched


def test_a_monitor_serves_a_bounded_number_of_active_subscriptions(h, monkeypatch):
    from monitor_protocol.core.rules import grants

    monkeypatch.setattr(grants, "MAX_ACTIVE_SUBSCRIPTIONS", 3)
    monkeypatch.setattr(grants, "RESERVED_FOR_GRANTED", 0)  # the places kept for tokens: tested below
    h.monitor("ci", visibility="public")
    subs = [h.subscribe("ci", None, subscriber=f"agent:r{i}") for i in range(3)]
    over = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:r3"})
    assert over.status == 429 and over.body["code"] == "OVER_BUDGET"
    resub = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:r0"}, subs[0][1])
    assert resub.status == 201  # an active reader re-keying is not a new one
    sid, tok = subs[1]
    assert h.call("POST", f"/subscriptions/{sid}/retire", {}, tok).status == 200
    assert h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:r3"}).status == 201


# ---- section 10: input limits ------------------------------------------------------------------------


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"k": value}
    return value


def test_json_nesting_is_at_most_32_levels(h):
    tok = h.monitor("ci", visibility="public")
    ok = h.publish("ci", tok, data={"v": nested(30)})  # the body, data and 30 more objects: 32 levels
    assert ok.status == 201
    deep = h.publish("ci", tok, data={"v": nested(31)})
    assert deep.status == 400 and deep.body["code"] == "INVALID" and "32" in deep.body["error"]
    assert "rejected_seq" in deep.body
    very = raw_call(
        h,
        "POST",
        "/monitors/ci/observations",
        b'{"type":"' + A.encode() + b'","data":' + b'{"a":' * 5000 + b"1" + b"}" * 5001,
        tok,
    )
    assert very.status == 400 and very.body["code"] == "INVALID"
    sid, rtok = h.subscribe("ci", None, filter={"text": "k"})  # a text-filtered reader still reads
    r = h.pull(sid, rtok, limit=200)
    assert r.status == 200 and r.body["observations"]


def test_nan_infinity_and_lone_surrogates_are_not_json(h):
    tok = h.monitor("ci")
    for raw in (
        b'{"type": "%s", "data": {"a": NaN}}',
        b'{"type": "%s", "data": {"a": Infinity}}',
        b'{"type": "%s", "data": {"a": -Infinity}}',
        b'{"type": "%s", "data": {"a": 1e400}}',
        b'{"type": "%s", "data": {"a": "\\ud800"}}',
        b'{"type": "%s", "data": {"\\udfff": 1}}',
        b'{"type": "%s", "data": {"a": 123456789012345678901234567890}}',
    ):
        body = raw.replace(b"%s", A.encode())
        r = raw_call(h, "POST", "/monitors/ci/observations", body, tok)
        assert r.status == 400 and r.body["code"] == "INVALID", (body, r.body)
        assert "rejected_seq" in r.body  # logged: the monitor is known
    pair = raw_call(
        h,
        "POST",
        "/monitors/ci/observations",
        b'{"type": "%s", "data": {"a": "\\ud83d\\ude00", "b": 1.5, "c": 9007199254740992}}'.replace(
            b"%s", A.encode()
        ),
        tok,
    )
    assert pair.status == 201 and pair.body["observation"]["data"]["a"] == "\U0001f600"
    with pytest.raises(ProtocolError) as caught:  # a door handing the engine a NaN directly
        h.service.publish("ci", {"type": A, "data": {"a": float("nan")}}, tok)
    assert caught.value.code == "INVALID"
    for obs in h.service.read_log("ci", 1, 200)["observations"]:
        json.dumps(obs, allow_nan=False).encode("utf-8")  # everything served is RFC 8259 JSON


def test_names_are_at_most_256_characters(h):
    tok = h.monitor("ci")
    assert h.publish("ci", tok, subject="s" * 256).status == 201
    long_subject = h.publish("ci", tok, subject="s" * 257)
    assert long_subject.status == 400 and "256" in long_subject.body["error"]
    long_actor = h.publish("ci", tok, actor="agent:" + "a" * 251)
    assert long_actor.status == 400
    long_type = h.publish("ci", tok, type="com." + "a" * 253)
    assert (
        long_type.status == 400 and long_type.body["code"] == "INVALID" and "256" in long_type.body["error"]
    )


def test_integers_are_ascii_digits_within_2_to_the_53(h):
    tok = h.monitor("ci")
    h.publish("ci", tok)
    sid, rtok = h.subscribe("ci", tok)
    assert h.pull(sid, rtok, limit="5").status == 200
    for bad in ("²", "٣", "1e3", " 3", "+3", "9" * 5000, str(2**53 + 1)):
        r = h.pull(sid, rtok, limit=bad)
        assert r.status == 400 and r.body["code"] == "INVALID", bad
    assert h.pull(sid, rtok, cursor=str(2**53)).status == 200
    big_ack = h.ack(sid, rtok, 2**60)
    assert big_ack.status == 400 and big_ack.body["code"] == "INVALID"


def test_a_json_rpc_batch_holds_at_most_100_calls(h):
    call = {"jsonrpc": "2.0", "method": "monitors/discover", "params": {}}
    ok = h.call("POST", "/rpc", [dict(call, id=i) for i in range(100)])
    assert ok.status == 200 and len(ok.body) == 100
    over = h.call("POST", "/rpc", [dict(call, id=i) for i in range(101)])
    assert over.status == 413 and over.body["error"]["data"]["code"] == "TOO_LARGE"
    assert over.body["error"]["code"] == -32016


def test_a_filtered_pull_examines_a_bounded_number_of_rows(h):
    tok = h.monitor("ci", types=[A, B])
    for i in range(SCAN_BUDGET * 2 + 10):
        h.publish("ci", tok, type=B, subject=f"noise-{i}", tags={"lane": "noise"})
    target = h.publish("ci", tok, type=A, subject="needle", tags={"lane": "work"}).body["seq"]
    for acking in (True, False):  # a reader that never acks an empty page (push, watch, SSE) goes on too
        # a tag is checked row by row (no index answers it): the bounded scan is what keeps this cheap
        sid, rtok = h.subscribe("ci", tok, subscriber=f"agent:acking-{acking}", filter={"#lane": ["work"]})
        pages = []
        while not pages or not pages[-1]["observations"]:
            r = h.pull(sid, rtok, limit=1)
            assert r.status == 200
            pages.append(r.body)
            if acking:
                assert h.ack(sid, rtok, r.body["next"]).status == 200
            assert len(pages) <= 4, "a bounded pull must still make progress"
        assert [o["subject"] for o in pages[-1]["observations"]] == ["needle"]
        assert len(pages) >= 3  # 2,000 rows of noise at most 1,000 rows a pull
        for page in pages[:-1]:
            assert page["scan_capped"] is True and page["observations"] == []
            assert page["next"] <= target  # acking it skips nothing unexamined
        assert pages[0]["lag_capped"] is True  # the count, too, stops at the budget: an upper bound
        assert "scan_capped" not in pages[-1]
    caught_up = h.pull(sid, rtok, cursor=target + 1)
    assert caught_up.body["observations"] == []
    unfiltered_id, unfiltered_tok = h.subscribe("ci", tok, subscriber="agent:all")
    exact = h.pull(unfiltered_id, unfiltered_tok, limit=1).body
    assert exact["lag"] == exact["head"] and "scan_capped" not in exact  # positive control


def test_a_subscriptions_lag_says_it_is_a_bound_wherever_it_is_shown(h):
    """Found by a tester: a pull said `lag_capped: true` of a text filter's lag (a bound: rows past the scan
    budget count as if they matched), while GET /subscriptions/{id} showed the same number as a count. Every
    reply that shows a subscription's lag says so too (its own GET, the admin snapshot, the overview a page draws, an ack's reply);
    control: an unfiltered reader's lag is a count, and none of them says capped."""
    tok = h.monitor("ci")
    for i in range(SCAN_BUDGET + 10):
        h.publish("ci", tok, subject=f"noise-{i}")
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:needle", filter={"text": "needle"})
    plain, plain_tok = h.subscribe("ci", tok, subscriber="agent:all")
    pulled = h.pull(sid, rtok, cursor=1, limit=1).body
    assert pulled["lag_capped"] is True
    shown = h.call("GET", f"/subscriptions/{sid}", token=rtok)
    assert shown.status == 200 and shown.body["lag"] == pulled["lag"] and shown.body["lag_capped"] is True
    exact = h.call("GET", f"/subscriptions/{plain}", token=plain_tok).body
    assert exact["lag"] > SCAN_BUDGET and "lag_capped" not in exact  # counted, every row being its
    acked = h.ack(sid, rtok, 2)
    assert acked.status == 200 and acked.body["lag_capped"] is True, acked.body
    (snapshot,) = h.service.snapshot()["monitors"]  # the admin door's GET /admin/snapshot
    by_id = {s["id"]: s for s in snapshot["subscriptions"]}
    assert by_id[sid]["lag_capped"] is True and "lag_capped" not in by_id[plain]
    views = h.service.overview("ci")["monitor"]["subscriptions"]  # the playground's picture of it
    by_id = {v["subscription"]["id"]: v["subscription"] for v in views}
    assert by_id[sid]["lag_capped"] is True and "lag_capped" not in by_id[plain]


def test_a_page_and_a_filtered_scan_are_bounded_by_bytes_too(tmp_path):
    """Rows count, and so do their bytes: 200 observations of ~1 MiB each would be a 200 MiB reply, and a
    text filter over them seconds of work. A page stops before its rows pass PAGE_BYTES (always one at
    least) and a filtered read once the rows it examined in vain pass SCAN_BYTES; nothing is skipped (the
    next pull goes on from `next`). Sizes are the stored ones (SQLite, PostgreSQL)."""
    from monitor_protocol.core.vocab import PAGE_BYTES, SCAN_BYTES

    h = Harness(make_store("sqlite", tmp_path))
    tok = h.monitor("ci", types=[A, B])
    fat = "x" * (PAGE_BYTES // 5)  # under the 1 MiB body cap; seven fit a page by rows, not by bytes
    seqs = [
        h.publish("ci", tok, type=A, subject=f"fat-{i}", data={"blob": fat}).body["seq"] for i in range(7)
    ]
    sid, rtok = h.subscribe("ci", tok, filter={"types": [A]})
    got: list[int] = []
    sizes = []
    while len(got) < len(seqs):
        page = h.pull(sid, rtok, limit=200).body
        assert page["observations"], page["next"]
        sizes.append(len(json.dumps(page["observations"])))
        got += [int(o["id"]) for o in page["observations"]]
        assert h.ack(sid, rtok, page["next"]).status == 200
    assert got == seqs and len(sizes) >= 2 and max(sizes) <= PAGE_BYTES + 4096  # every one, in pages
    # a text filter over rows that do not match stops by bytes, long before its 1,000 rows
    noise = "y" * (SCAN_BYTES // 40)
    for i in range(60):  # 1.5 x SCAN_BYTES of rows examined in vain
        h.publish("ci", tok, type=B, subject=f"noise-{i}", data={"blob": noise})
    needle = h.publish("ci", tok, type=A, subject="needle", data={"note": "zzzqqq"}).body["seq"]
    fid, ftok = h.subscribe("ci", tok, subscriber="agent:text", filter={"text": "zzzqqq"})
    pages = []
    while not pages or not pages[-1]["observations"]:
        pages.append(h.pull(fid, ftok, limit=1).body)
        assert h.ack(fid, ftok, pages[-1]["next"]).status == 200
        assert len(pages) <= 20
    assert pages[0]["scan_capped"] is True and pages[0]["observations"] == []  # stopped by bytes
    assert [int(o["id"]) for o in pages[-1]["observations"]] == [needle]  # and nothing skipped


def test_the_pulls_of_one_json_rpc_batch_share_one_pages_bytes(tmp_path):
    """A batch of 100 pulls would otherwise be 100 pages' worth of reply from a request of a few hundred
    bytes: its pulls share PAGE_BYTES, and a pull past them is refused (TOO_LARGE, nothing recorded)."""
    from monitor_protocol.core.vocab import PAGE_BYTES

    h = Harness(make_store("sqlite", tmp_path))
    tok = h.monitor("ci", types=[A])
    fat = "x" * (PAGE_BYTES // 5)
    for i in range(3):
        h.publish("ci", tok, type=A, subject=f"fat-{i}", data={"blob": fat})
    sid, rtok = h.subscribe("ci", tok, filter={"types": [A]})
    call = {"jsonrpc": "2.0", "method": "feeds/pull", "params": {"subscription": sid, "limit": 200}}
    one = h.call("POST", "/rpc", [dict(call, id=0)], rtok).body
    assert len(one[0]["result"]["observations"]) == 3  # positive control: one pull alone gets all three
    replies = h.call("POST", "/rpc", [dict(call, id=i) for i in range(10)], rtok).body
    rows = [len(r["result"]["observations"]) for r in replies if "result" in r]
    refused = [r["error"]["data"]["code"] for r in replies if "error" in r]
    assert rows[0] == 3 and sum(rows) <= 3 + 3 and refused and set(refused) == {"TOO_LARGE"}, (rows, refused)
    assert len(json.dumps(replies)) <= 2 * PAGE_BYTES  # not ten pages


def test_a_filter_on_indexed_columns_skips_the_noise_in_one_pull_with_an_exact_lag(h):
    tok = h.monitor("ci", types=[A, B])
    for i in range(SCAN_BUDGET * 2 + 10):
        h.publish("ci", tok, type=B, subject=f"noise-{i}")
    target = h.publish("ci", tok, type=A, subject="needle").body["seq"]
    sid, rtok = h.subscribe("ci", tok, filter={"types": [A], "subjects": ["nee*"]})
    page = h.pull(sid, rtok, limit=1).body
    assert [int(o["id"]) for o in page["observations"]] == [target] and "scan_capped" not in page
    assert page["lag"] == 1 and "lag_capped" not in page  # counted by the store, exactly
    wide_id, wide_tok = h.subscribe("ci", tok, subscriber="agent:wide", filter={"types": [B]})
    wide = h.pull(wide_id, wide_tok, limit=1).body
    assert wide["lag"] == SCAN_BUDGET * 2 + 10 and "lag_capped" not in wide  # positive control: it counts


def test_a_capped_page_that_delivered_something_still_comes_back_until_acked(h):
    tok = h.monitor("ci", types=[A, B])
    first = h.publish("ci", tok, type=A, subject="first", tags={"lane": "work"}).body["seq"]
    for _ in range(SCAN_BUDGET + 100):
        h.publish("ci", tok, type=B)
    sid, rtok = h.subscribe("ci", tok, filter={"#lane": ["work"]})
    page = h.pull(sid, rtok).body
    assert [int(o["id"]) for o in page["observations"]] == [first] and page["scan_capped"] is True
    again = h.pull(sid, rtok).body  # the reader crashed before acking: at-least-once
    assert [int(o["id"]) for o in again["observations"]] == [first]
    assert again["observations"][0]["redelivered"] is True
    assert h.ack(sid, rtok, again["next"]).status == 200
    assert h.pull(sid, rtok).body["observations"] == []  # acked: it does not come back


def test_a_filter_array_costs_one_haystack_per_row_and_holds_at_most_16_objects(h):
    h.monitor("ci", visibility="public")
    many = [{"text": f"zq{i}"} for i in range(17)]
    r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:x", "filter": many})
    assert r.status == 400 and "16" in r.body["error"]
    ok = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:x", "filter": many[:16]})
    assert ok.status == 201


# ---- section 10: internal failures are not bad input -------------------------------------------------


class FailingStore(MemoryStore):
    fail = False

    def apply(self, changes):
        if self.fail:
            raise StorageError("database or disk is full")
        return super().apply(changes)


def test_a_storage_failure_is_503_with_retry_after_and_nothing_half_written():
    store = FailingStore()
    h = Harness(store)
    tok = h.monitor("ci")
    assert h.publish("ci", tok).status == 201  # positive control
    store.fail = True
    resp = h.router.handle(
        Request("POST", "/mp/v0/monitors/ci/observations", [], {"authorization": f"Bearer {tok}"},
                json.dumps({"type": A}).encode())
    )  # fmt: skip
    assert resp.status == 503 and resp.body["code"] == "UNAVAILABLE" and resp.body["storage"] is True
    assert resp.headers["retry-after"] == "1"
    store.fail = False
    monitor = h.call("GET", "/monitors/ci", token=tok).body
    assert monitor["head"] == 2  # the configured row and the first publish: nothing of the failed one
    assert h.publish("ci", tok).body["seq"] == 3


def test_a_full_sqlite_disk_is_503_not_400(tmp_path):
    from monitor_protocol.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "full.db"))
    h = Harness(store)
    tok = h.monitor("ci")
    assert h.publish("ci", tok).status == 201
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count={pages + 2}")
    statuses = {h.publish("ci", tok, data={"blob": "x" * 20_000}).status for _ in range(10)}
    assert 503 in statuses and 400 not in statuses and 500 not in statuses
    head_when_full = h.call("GET", "/monitors/ci", token=tok).body["head"]
    store._db.execute("PRAGMA max_page_count=1073741823")
    after = h.publish("ci", tok)
    assert after.status == 201 and after.body["seq"] == head_when_full + 1
    store.close()


class Buggy(MonitorService):
    def publish(self, *args, **kwargs):
        raise KeyError("a bug, not the caller's fault")


def test_a_bug_is_a_503_naming_an_incident_never_a_400_or_500():
    h = Harness(MemoryStore())
    tok = h.monitor("ci")
    h.service.__class__ = Buggy
    r = h.publish("ci", tok)
    assert (
        r.status == 503
        and r.body["code"] == "UNAVAILABLE"
        and re.fullmatch(r"[0-9a-f]{12}", r.body["incident"])
    )


# ---- section 9: push needs the owner's say and a public sink -----------------------------------------


def test_a_push_subscription_needs_a_token_and_a_public_sink(h):
    tok = h.monitor("ci", visibility="public")
    anonymous = h.call(
        "POST", "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:x", "protocol": "http", "sink": "https://example.com/hook"},
    )  # fmt: skip
    assert anonymous.status == 401 and anonymous.body["code"] == "UNAUTHORIZED"
    for sink in (
        "http://127.0.0.1:18999/internal",
        "http://169.254.169.254/latest",
        "http://[::1]/",
        "http://localhost/",
    ):
        r = h.call(
            "POST",
            "/subscriptions",
            {"monitor": "ci", "subscriber": "agent:x", "protocol": "http", "sink": sink},
            tok,
        )
        assert r.status == 400 and r.body["code"] == "INVALID" and "--allow-sink" in r.body["error"], sink
    public = h.call(
        "POST", "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:x", "protocol": "http", "sink": "https://example.com/hook"}, tok,
    )  # fmt: skip
    assert public.status == 201


def test_an_operator_may_allow_an_internal_sink():
    service = MonitorService(MemoryStore(), allowed_sinks=("127.0.0.1",))
    h = Harness(MemoryStore())
    h.service, h.router.service = service, service
    tok = h.monitor("ci")
    r = h.call(
        "POST", "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:x", "protocol": "http", "sink": "http://127.0.0.1:18999/hook"}, tok,
    )  # fmt: skip
    assert r.status == 201


# ---- what the review of this change found, each with its control ---------------------------------------


def test_a_monitor_definition_and_its_configured_rows_are_bounded(h):
    for bad in (
        {"id": "m1", "reason": "x" * 2000},
        {"id": "m2", "name": "x" * 257},
        {"id": "m3", "types": ["a." + "b" * 300]},
        {"id": "m4", "cadence": {"note": "x" * 9000}},
        {"id": "m5", "owner": "system:sweep"},
    ):
        r = h.call("POST", "/monitors", bad)
        assert r.status == 400 and r.body["code"] == "INVALID", (bad, r.body)
    tok = h.monitor("ci", cadence={"note": "x" * 3000}, reason="r" * 1024)
    r = h.call("POST", "/monitors/ci/update", {"patch": {"cadence": {"note": "y" * 3000}}}, tok)
    assert r.status == 200
    too_big = h.call(
        "POST",
        "/monitors/ci/update",
        {"patch": {"rules": [{"id": "r", "when": {}, "then": "log", "reason": "r" * 9000}]}},
        tok,
    )
    assert too_big.status == 400 and "8192" in too_big.body["error"]
    for row in h.service.read_log("ci", 1, 200)["observations"]:
        assert rows_size(row) < 24_000, row["type"]


def test_integer_spellings_are_refused_in_filters_and_bodies_too(h):
    tok = h.monitor("ci", visibility="public")
    for bad in ("²", "٣", " 3", "-0", 3.0):
        r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "a", "filter": {"limit": bad}})
        assert r.status == 400 and r.body["code"] == "INVALID_FILTER", (bad, r.body)
    assert (
        h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "a", "filter": {"limit": 3}}).status
        == 201
    )
    h.publish("ci", tok)
    sid, rtok = h.subscribe("ci", tok, subscriber="b")
    for bad in ("-0", "+1"):
        assert h.pull(sid, rtok, cursor=bad).status == 400
    for bad in (1.0, "2", True):
        r = h.ack(sid, rtok, bad)
        assert r.status == 400 and r.body["code"] == "INVALID", bad
    assert h.ack(sid, rtok, 2).status == 200


def test_times_outside_rfc_3339_years_are_refused_and_early_years_are_four_digits(h):
    tok = h.monitor("ci")
    r = h.publish("ci", tok, time="0001-01-01T00:00:00+23:59")  # before year 1 once in UTC
    assert r.status == 400 and r.body["code"] == "INVALID" and "rejected_seq" in r.body
    early = h.publish("ci", tok, time="0001-01-01T00:00:00Z")
    assert early.status == 201 and early.body["observation"]["time"] == "0001-01-01T00:00:00.000Z"
    sid, rtok = h.subscribe("ci", tok, filter={"until": "0002-01-01T00:00:00Z", "types": [A]})
    assert [o["id"] for o in h.pull(sid, rtok).body["observations"]] == [early.body["observation"]["id"]]


def test_a_lease_freed_by_a_retirement_after_its_time_ran_out_counts_as_an_attempt(h):
    tok = h.monitor(
        "ci", visibility="public", capabilities=["observe", "act"], default_grant=["observe", "act"]
    )
    h.publish("ci", tok, subject="job")
    sid, rtok = h.subscribe("ci", None, capabilities=["observe", "act"], retire_after_mute_seconds=120)
    claim = h.call(
        "POST", f"/subscriptions/{sid}/leases/claim", {"subject": "job", "lease_duration_seconds": 60}, rtok
    )
    assert claim.status == 201
    h.clock.advance(200)  # the worker died holding it, and went silent
    h.call("GET", "/monitors")  # any engine call runs the due sweep first
    assert h.store.get_lease("ci", "job").attempts == 1
    actions = [
        o["data"]["payload"]["action"]
        for o in h.service.read_log("ci", 1, 200)["observations"]
        if o["type"].endswith(".lease")
    ]
    assert actions == ["claim", "expired"]
    # control: a retirement while the lease is still alive gives the work back without counting
    sid2, rtok2 = h.subscribe("ci", None, subscriber="agent:second", capabilities=["observe", "act"])
    assert h.call("POST", f"/subscriptions/{sid2}/leases/claim", {"subject": "job"}, rtok2).status == 201
    assert h.call("POST", f"/subscriptions/{sid2}/retire", {}, rtok2).status == 200
    assert h.store.get_lease("ci", "job").attempts == 1


def test_a_capped_scan_never_emits_the_relist_bookmark_early(h):
    tok = h.monitor("ci", types=[A, B])
    for _ in range(10):
        h.publish("ci", tok, type=A)
    for _ in range(SCAN_BUDGET + 500):
        h.publish("ci", tok, type=B)
    needle = h.publish("ci", tok, type=A, subject="needle").body["seq"]
    sid, rtok = h.subscribe("ci", tok, filter={"types": [A]}, reset_policy="earliest")
    assert h.call("POST", "/admin/compact", {"monitor": "ci", "upto_seq": 5}, "admin-token").status == 200
    delivered: list[tuple[int, str, bool]] = []
    for _ in range(6):
        body = h.pull(sid, rtok).body
        delivered += [(int(o["id"]), o["type"], bool(o.get("redelivered"))) for o in body["observations"]]
        h.ack(sid, rtok, body["next"])
        if any(t.endswith(".bookmark") for _, t, _ in delivered):
            break
    seqs = [s for s, _, _ in delivered]
    assert needle in seqs and seqs.index(needle) < len(seqs) - 1  # the bookmark comes last, after the needle
    assert delivered[-1][1] == "ai.mentu.monitor.bookmark"
    assert not any(r for _, _, r in delivered)  # nothing was marked redelivered on its first delivery


def test_observe_is_what_reads(h):
    tok = h.monitor(
        "ci", visibility="public", capabilities=["observe", "act"], default_grant=["observe", "act"]
    )
    h.publish("ci", tok)
    blind, blind_tok = h.subscribe("ci", None, subscriber="agent:blind", capabilities=["act"])
    r = h.pull(blind, blind_tok)
    assert r.status == 403 and r.body["code"] == "CAPABILITY_MISSING"
    reader, reader_tok = h.subscribe("ci", None, subscriber="agent:reader")
    assert h.pull(reader, reader_tok).status == 200  # control
    h.call("POST", "/monitors/ci/update", {"patch": {"capabilities": ["act"], "default_grant": []}}, tok)
    assert h.pull(reader, reader_tok).status == 403  # narrowing observe away revokes reading


def test_the_subscribe_token_grants_the_monitors_capabilities_on_a_public_monitor_too(h):
    r = h.call(
        "POST", "/monitors",
        {"id": "ci", "owner": "human:you", "visibility": "public", "subscribe_token": True,
         "capabilities": ["observe", "act"]},
    )  # fmt: skip
    sub_tok = r.body["subscribe_token"]
    ok = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:w", "capabilities": ["observe", "act"]},
        sub_tok,
    )
    assert ok.status == 201
    anon = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:x", "capabilities": ["observe", "act"]},
    )
    assert anon.status == 403 and anon.body["code"] == "CAPABILITY_MISSING"  # control: no token, no act


def test_a_bad_idempotency_key_is_logged_like_every_publish_refusal(h):
    tok = h.monitor("ci")
    r = h.publish("ci", tok, idempotency_key="x" * 200)
    assert r.status == 400 and "rejected_seq" in r.body


def test_the_servers_own_push_reads_only_with_observe(h):
    tok = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", tok)
    body = {"monitor": "ci", "subscriber": "hook:ci", "protocol": "http", "sink": "https://example.com/h"}
    sid = h.call("POST", "/subscriptions", body, tok).body["subscription"]["id"]
    assert h.service.pull_as_system(sid)["observations"]  # control
    h.call("POST", "/monitors/ci/update", {"patch": {"capabilities": ["act"], "default_grant": []}}, tok)
    with pytest.raises(ProtocolError) as refused:
        h.service.pull_as_system(sid)
    assert refused.value.code == "CAPABILITY_MISSING"


def test_malformed_inline_filters_are_400_in_any_order(h):
    tok = h.monitor("ci")
    h.publish("ci", tok)
    sid, rtok = h.subscribe("ci", tok)
    for query in (
        [("filter", json.dumps({"types": A})), ("types", A)],
        [("types", A), ("filter", json.dumps({"types": A}))],
        [("filter", json.dumps({"#k": {"x": 1}})), ("#k", "v")],
    ):
        r = h.call("GET", f"/subscriptions/{sid}/pull", token=rtok, query=query)
        assert r.status in (200, 400) and (r.status == 200 or r.body["code"] == "INVALID_FILTER"), (
            query,
            r.body,
        )
    merged = h.call(
        "GET",
        f"/subscriptions/{sid}/pull",
        token=rtok,
        query=[("filter", json.dumps({"types": [A]})), ("types", A)],
    )
    assert merged.status == 200 and merged.body["observations"]  # control


def test_body_integers_are_json_integers_and_times_are_rfc_3339(h):
    tok = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", tok, subject="job")
    sid, rtok = h.subscribe("ci", tok, capabilities=["observe", "act"])
    assert h.call("POST", f"/subscriptions/{sid}/seek", {"cursor": "2", "reason": "r"}, rtok).status == 400
    assert h.call("POST", f"/subscriptions/{sid}/seek", {"cursor": 2, "reason": "r"}, rtok).status == 200
    claim = {"subject": "job", "lease_duration_seconds": "60"}
    assert h.call("POST", f"/subscriptions/{sid}/leases/claim", claim, rtok).status == 400
    assert (
        h.call(
            "POST", f"/subscriptions/{sid}/leases/claim", {**claim, "lease_duration_seconds": 60}, rtok
        ).status
        == 201
    )
    for bad in (
        "2026-01-01",
        "2026-01-01 00:00:00Z",
        "20260101T000000Z",
        "2026-01-01T00:00:00",
        " 2026-01-01T00:00:00Z",
    ):
        r = h.publish("ci", tok, time=bad)
        assert r.status == 400 and r.body["code"] == "INVALID", bad
    assert h.publish("ci", tok, time="2026-01-01T00:00:00.123456789+02:00").status == 201


def test_limit_inside_a_filter_array_is_refused_not_ignored(h):
    tok = h.monitor("ci")
    r = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "a", "filter": [{"types": [A], "limit": 1}]},
        tok,
    )
    assert r.status == 400 and r.body["code"] == "INVALID_FILTER"
    assert (
        h.call(
            "POST",
            "/subscriptions",
            {"monitor": "ci", "subscriber": "a", "filter": {"types": [A], "limit": 1}},
            tok,
        ).status
        == 201
    )


def test_anonymous_readers_cannot_take_every_place_of_a_public_monitor(h, monkeypatch):
    """10,000 anonymous subscribe calls used to fill a public monitor's places, its owner's own subscribe then
    refused, and each could ask never to be retired: the last places are kept for the owner's and the
    subscribe token, and a subscriber without a token is retired after 7 days without a pull at most."""
    from monitor_protocol.core.rules import grants

    monkeypatch.setattr(grants, "MAX_ACTIVE_SUBSCRIPTIONS", 5)
    monkeypatch.setattr(grants, "RESERVED_FOR_GRANTED", 2)
    tok = h.monitor("pub", visibility="public")
    for i in range(3):
        assert (
            h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": f"agent:spam{i}"}).status == 201
        )
    more = h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": "agent:spam3"})
    assert more.status == 429 and more.body["code"] == "OVER_BUDGET" and "owner" in more.body["error"]
    for name in ("agent:mine", "agent:mine2"):  # the owner still subscribes, up to the protocol's cap
        assert h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": name}, tok).status == 201
    full = h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": "agent:mine3"}, tok)
    assert full.status == 429 and full.body["limit"] == 5
    forever = {"monitor": "pub", "subscriber": "agent:x", "retire_after_mute_seconds": 2**53}
    monkeypatch.setattr(grants, "MAX_ACTIVE_SUBSCRIPTIONS", 100)
    refused = h.call("POST", "/subscriptions", forever)
    assert refused.status == 400 and refused.body["code"] == "INVALID" and "7 days" in refused.body["error"]
    assert h.call("POST", "/subscriptions", forever, tok).status == 201  # the owner's own may ask it
    # a value kept from before the rule is not asked again: re-subscribing without sending it works
    from monitor_protocol.core.rules import delivery as rules

    week = {"monitor": "pub", "subscriber": "agent:old", "retire_after_mute_seconds": 604800}
    old = h.call("POST", "/subscriptions", week).body
    monkeypatch.setattr(rules, "DEFAULT_RETIRE_AFTER_MUTE_SECONDS", 100)  # the cap made lower since
    again = h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": "agent:old"}, old["token"])
    assert again.status == 201, again.body
    asked = h.call("POST", "/subscriptions", week, again.body["token"])
    assert asked.status == 400  # asked anew: the cap of now


def test_a_json_rpc_id_is_a_string_a_number_or_null(h):
    call = {"jsonrpc": "2.0", "method": "monitors/discover", "params": {}}
    for good in ("a", 7, 1.5, None):
        assert "result" in h.call("POST", "/rpc", dict(call, id=good)).body  # positive control
    for bad in ({"a": 1}, [1], True):
        r = h.call("POST", "/rpc", dict(call, id=bad)).body
        assert (
            r["error"]["code"] == -32600
            and r["id"] is None
            and "string, a number or null" in r["error"]["message"]
        )


def test_a_tag_filter_key_is_a_name_of_at_most_256_characters(h):
    tok = h.monitor("ci", visibility="public")
    sid, rtok = h.subscribe("ci", tok)
    assert h.pull(sid, rtok, **{"#" + "e" * 256: "x"}).status == 200  # positive control: at the limit
    long = h.pull(sid, rtok, **{"#" + "e" * 257: "x"})
    assert long.status == 400 and long.body["code"] == "INVALID_FILTER" and "256" in long.body["error"]


def test_a_subscriptions_own_rows_are_bounded_per_minute(h):
    """A seek or a re-subscribe writes a row of the server's own (origin system, measured) carrying the
    caller's reason: a caller without a token could write 420 a second into a public monitor's log. At most
    LOGGED_ACTIONS_PER_MINUTE a minute per subscription, then 429 OVER_BUDGET with Retry-After."""
    from monitor_protocol.core.vocab import LOGGED_ACTIONS_PER_MINUTE

    tok = h.monitor("pub", visibility="public")
    sid, rtok = h.subscribe("pub", tok, subscriber="agent:noisy")  # its subscribe is its first row
    seek = {"cursor": 0, "reason": "SECURITY: rotate your credentials at https://evil.example"}
    for _ in range(LOGGED_ACTIONS_PER_MINUTE - 1):
        assert h.call("POST", f"/subscriptions/{sid}/seek", seek, rtok).status == 200
    head = h.call("GET", "/monitors/pub/state", token=tok).body["head"]
    over = h.call("POST", f"/subscriptions/{sid}/seek", seek, rtok)
    assert over.status == 429 and over.body["code"] == "OVER_BUDGET" and over.body["retry_after"] >= 1
    again = h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": "agent:noisy"}, rtok)
    assert again.status == 429  # a re-subscribe is such a row too
    assert h.call("GET", "/monitors/pub/state", token=tok).body["head"] == head  # nothing written
    other, otok = h.subscribe("pub", None, subscriber="agent:calm")  # positive control: another reader
    assert h.call("POST", f"/subscriptions/{other}/seek", seek, otok).status == 200
    h.clock.advance(61)
    assert h.call("POST", f"/subscriptions/{sid}/seek", seek, rtok).status == 200  # a minute later


def test_anonymous_readers_of_a_monitor_share_one_budget_of_rows(h, monkeypatch):
    """New subscriptions at will would each have a budget of their own: subscribe, seek, retire, again. The
    rows of a monitor's subscriptions granted without a token that carry their words (seeks, retires,
    re-subscribes) share ANONYMOUS_ROWS_PER_MINUTE; a new subscribe is bounded by the places instead (a
    thousand readers may join a public monitor at once). The owner's readers are not held by it."""
    from monitor_protocol.core import runtime

    monkeypatch.setattr(runtime, "ANONYMOUS_ROWS_PER_MINUTE", 6)
    tok = h.monitor("pub", visibility="public")
    for i in range(20):  # joining is not held by the shared budget
        assert (
            h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": f"agent:join{i}"}).status == 201
        )
    refused = None
    for i in range(10):
        r = h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": f"agent:x{i}"})
        assert r.status == 201
        sid, rtok = r.body["subscription"]["id"], r.body["token"]
        retired = h.call("POST", f"/subscriptions/{sid}/retire", {"reason": "x" * 1000}, rtok)
        if retired.status != 200:
            refused = retired
            break
    assert refused is not None and refused.status == 429 and "without a token" in refused.body["error"]
    assert i == 6  # six retires with their 1 KiB of words, the seventh refused
    mine = h.call("POST", "/subscriptions", {"monitor": "pub", "subscriber": "agent:mine"}, tok).body
    assert (
        h.call("POST", f"/subscriptions/{mine['subscription']['id']}/retire", {}, mine["token"]).status == 200
    )
    h.clock.advance(61)
    assert h.call("POST", f"/subscriptions/{sid}/retire", {"reason": "later"}, rtok).status == 200


def test_data_carrying_provenance_or_tags_is_refused_with_the_hint_for_each() -> None:
    """Found by a tester: data with `provenance` got the hint meant for `tags`."""
    h = Harness(MemoryStore())
    tok = h.monitor("ci")
    r = h.publish("ci", tok, data={"provenance": {"tier": "src"}})
    assert r.status == 400 and "the server writes provenance" in r.body["error"]
    assert "tags field" not in r.body["error"]
    r = h.publish("ci", tok, data={"tags": {"a": "b"}})
    assert r.status == 400 and "send tags in the request's tags field" in r.body["error"]
    assert h.publish("ci", tok, data={"ok": 1}).status == 201  # positive control


@pytest.mark.parametrize("policy", ["latest", "earliest"])
def test_a_pull_moved_by_the_reset_policy_says_so(policy):
    """Found by a tester: with reset_policy latest a compaction past the cursor skipped everything to the head
    and the pull said nothing of it (mp watch printed nothing). The pull that moves the cursor says where
    from and to; the next pull, not moved, says nothing."""
    h = Harness(MemoryStore())
    tok = h.monitor("ci")
    sid, rtok = h.subscribe("ci", tok, reset_policy=policy)
    for _ in range(5):
        h.publish("ci", tok)
    assert "reset" not in h.pull(sid, rtok).body  # positive control: a pull within the log says nothing
    assert h.call("POST", "/admin/compact", {"monitor": "ci", "upto_seq": 4}, "admin-token").status == 200
    body = h.pull(sid, rtok).body
    floor, head = body["retention_floor"], body["head"]
    moved_to = floor if policy == "earliest" else head + 1
    reset = body["reset"]
    assert (reset["reset_policy"], reset["retention_floor"], reset["cursor"]) == (policy, floor, moved_to)
    assert set(reset) == {"reset_policy", "requested", "retention_floor", "cursor"}
    assert reset["requested"] < floor  # the cursor it had: below what compaction kept
    assert body["cursor"] == moved_to
    h.ack(sid, rtok, body["next"])
    assert "reset" not in h.pull(sid, rtok).body
