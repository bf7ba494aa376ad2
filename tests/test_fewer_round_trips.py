"""This server's two extensions that save round trips (docs/serve.md "Fewer round trips"): ack-and-pull in one
call and one transaction, and batch publish (a JSON array body, each item on its own, one commit). Each rule
has a positive control beside its refusal; every store runs them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from monitor_protocol.core.vocab import (
    EXT_ACK_PULL,
    EXT_PUBLISH_BATCH,
    MAX_PUBLISH_BATCH,
    T_CONTRADICTION,
    T_CONTRADICTION_RESOLVED,
)

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

TYPE = "com.example.ci.run"
REJECTED = "ai.mentu.monitor.rejected"


@pytest.fixture(params=STORE_KINDS)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    return Harness(make_store(request.param, tmp_path))


def feed(h: Harness, n: int) -> tuple[str, str, str, list[int]]:
    owner = h.monitor()
    sub, reader = h.subscribe("ci", owner, filter={"types": [TYPE]})
    seqs = [h.publish("ci", owner, subject=f"b{i}").body["seq"] for i in range(n)]
    return owner, sub, reader, seqs


def ack_pull(h: Harness, sub: str, reader: str, body: Any, query: Any = None) -> Any:
    return h.call("POST", f"/subscriptions/{sub}/pull", body, reader, query=query)


def subjects(reply: Any) -> list[str]:
    return [o["subject"] for o in reply.body["observations"]]


# ---------------------------------------------------------------------------------------------- ack-and-pull


def test_discover_advertises_both_extensions(h: Harness) -> None:
    ext = h.call("GET", "/discover").body["capabilities"]["extensions"]
    assert ext[EXT_ACK_PULL]["rest"] == "POST /subscriptions/{id}/pull"
    assert ext[EXT_PUBLISH_BATCH]["max_items"] == MAX_PUBLISH_BATCH
    assert "ai.mentu/monitors" in ext  # the protocol's own stays


def test_ack_and_pull_commits_the_ack_then_pulls_from_it_in_one_transaction(h: Harness) -> None:
    _, sub, reader, seqs = feed(h, 4)
    first = h.pull(sub, reader, limit=2)
    assert subjects(first) == ["b0", "b1"] and first.body["cursor"] == 0
    before = h.store.stats.commits
    both = ack_pull(h, sub, reader, {"ack": first.body["next"], "limit": 2})
    assert both.status == 200, both.body
    assert h.store.stats.commits == before + 1  # the ack and the pull: one transaction
    assert both.body["cursor"] == first.body["next"] == seqs[2]
    assert subjects(both) == ["b2", "b3"] and both.body["redelivered"] == 0
    assert both.body["lag"] == 2  # from the committed cursor: b2 and b3 are delivered, not acked
    # control: the same work as two calls is two transactions
    before = h.store.stats.commits
    assert h.ack(sub, reader, both.body["next"]).status == 200
    assert h.pull(sub, reader).status == 200
    assert h.store.stats.commits == before + 1  # the empty pull writes nothing: one for the ack


def test_ack_and_pull_without_ack_is_the_plain_pull(h: Harness) -> None:
    _, sub, reader, _ = feed(h, 2)
    plain = h.pull(sub, reader, limit=1).body
    posted = ack_pull(h, sub, reader, {"limit": 1}).body
    assert posted["observations"] == [{**plain["observations"][0], "redelivered": True}]
    assert posted["cursor"] == plain["cursor"] == 0
    assert ack_pull(h, sub, reader, None).status == 200  # no body at all: a pull with the defaults


def test_ack_and_pull_follows_acks_rules_and_pulls_nothing_when_the_ack_is_refused(h: Harness) -> None:
    _, sub, reader, seqs = feed(h, 3)
    page = h.pull(sub, reader, limit=2).body
    assert ack_pull(h, sub, reader, {"ack": page["next"]}).status == 200
    before = h.call("GET", f"/subscriptions/{sub}", token=reader).body
    back = ack_pull(h, sub, reader, {"ack": 1, "limit": 1})
    assert back.status == 409 and back.body["code"] == "CURSOR_BACKWARDS"
    assert back.body["cursor"] == page["next"]
    assert h.call("GET", f"/subscriptions/{sub}", token=reader).body == before  # nothing pulled or marked
    # the same ack again is idempotent, as on /ack (C06)
    again = ack_pull(h, sub, reader, {"ack": page["next"], "limit": 1})
    assert again.status == 200 and again.body["cursor"] == page["next"]
    # an ack past the head is clamped, as on /ack
    far = ack_pull(h, sub, reader, {"ack": 10_000})
    assert far.status == 200 and far.body["cursor"] == seqs[-1] + 1 and far.body["observations"] == []


@pytest.mark.parametrize(
    ("body", "query", "code", "words"),
    [
        ({"ack": "3"}, None, "INVALID", "ack must be"),
        ({"ack": 2.0}, None, "INVALID", "ack must be"),
        ({"ack": True}, None, "INVALID", "ack must be"),
        ({"ack": -1}, None, "INVALID", "ack"),
        ({"limit": "5"}, None, "INVALID", "limit must be"),
        ({"limit": 201}, None, "INVALID", "limit"),
        ({"wait": 51}, None, "INVALID", "wait"),
        ({"cursor": 1}, None, "INVALID", "send ['ack', 'limit', 'wait', 'filter']"),
        ([1, 2], None, "INVALID", "JSON object"),
        ({"filter": "types=x"}, None, "INVALID_FILTER", "JSON object"),
        ({"filter": {"colour": "red"}}, None, "INVALID_FILTER", "colour"),
        ({"ack": 1}, [("limit", "1")], "INVALID", "in the JSON body"),
    ],
)
def test_ack_and_pull_refuses_bad_input_with_a_sentence(
    h: Harness, body: Any, query: Any, code: str, words: str
) -> None:
    _, sub, reader, _ = feed(h, 1)
    refused = ack_pull(h, sub, reader, body, query)
    assert refused.status == 400 and refused.body["code"] == code, refused.body
    assert words in refused.body["error"]
    assert ack_pull(h, sub, reader, {"ack": 0, "limit": 1}).status == 200  # control


def test_a_get_pull_never_takes_an_ack(h: Harness) -> None:
    _, sub, reader, _ = feed(h, 2)
    refused = h.pull(sub, reader, ack=2)
    assert refused.status == 400 and refused.body["code"] == "INVALID"
    assert "POST /pull" in refused.body["error"]
    assert h.call("GET", f"/subscriptions/{sub}", token=reader).body["cursor"] == 0  # nothing committed
    assert h.pull(sub, reader, limit=1).status == 200  # control


def test_ack_and_pull_needs_the_reader_token(h: Harness) -> None:
    owner, sub, reader, _ = feed(h, 1)
    assert ack_pull(h, sub, "wrong-token", {"ack": 1}).status == 401
    assert ack_pull(h, sub, None, {"ack": 1}).status == 401
    assert ack_pull(h, sub, reader, {"ack": 1}).status == 200  # control


def test_ack_and_pull_with_an_inline_filter_narrows(h: Harness) -> None:
    _, sub, reader, _ = feed(h, 3)
    narrow = ack_pull(h, sub, reader, {"ack": 0, "filter": {"subjects": ["b1"]}})
    assert narrow.status == 200 and subjects(narrow) == ["b1"]


def test_jsonrpc_feeds_pull_takes_ack(h: Harness) -> None:
    _, sub, reader, seqs = feed(h, 3)
    call = {"jsonrpc": "2.0", "id": 1, "method": "feeds/pull"}
    first = h.call("POST", "/rpc", {**call, "params": {"subscription": sub, "limit": 1}}, reader).body
    nxt = first["result"]["next"]
    both = h.call("POST", "/rpc", {**call, "params": {"subscription": sub, "ack": nxt, "limit": 1}}, reader)
    result = both.body["result"]
    assert result["cursor"] == nxt == seqs[1] and subjects_of(result) == ["b1"]
    back = h.call("POST", "/rpc", {**call, "params": {"subscription": sub, "ack": 1}}, reader).body
    assert back["error"]["data"]["code"] == "CURSOR_BACKWARDS"


def subjects_of(body: dict[str, Any]) -> list[str]:
    return [o["subject"] for o in body["observations"]]


def test_an_ack_and_pull_asked_to_wait_is_parked_with_a_plain_pull_as_its_recheck(h: Harness) -> None:
    """The door re-checks a parked pull when an append comes: for ack-and-pull that re-check is the GET
    pull (no ack, no body), so the ack runs exactly once however many times the poll is woken."""
    from monitor_protocol.api.messages import Request

    _, sub, reader, seqs = feed(h, 1)
    path = f"/mp/v0/subscriptions/{sub}/pull"
    headers = {"authorization": f"Bearer {reader}", "content-type": "application/json"}
    body = b'{"ack": %d, "limit": 5, "wait": 7, "filter": {"subjects": ["b9"]}}' % (seqs[0] + 1)
    resp = h.router.handle(Request("POST", path, [], headers, body))
    assert resp.status == 200 and resp.body["observations"] == []
    assert resp.body["cursor"] == seqs[0] + 1
    parked = resp.long_poll
    assert parked is not None and parked.monitor == "ci" and parked.wait_seconds == 7
    again = parked.again
    assert again is not None and again.method == "GET" and again.path == path and again.body == b""
    assert again.query == [("limit", "5"), ("filter", '{"subjects":["b9"]}')]
    assert again.headers["authorization"] == f"Bearer {reader}"
    # control: a plain GET pull asked to wait re-checks with itself
    get = Request("GET", path, [("wait", "3")], headers)
    assert h.router.handle(get).long_poll.again is get


# ---------------------------------------------------------------------------------------------- batch publish


def publish_batch(h: Harness, owner: str | None, items: Any, headers: Any = None) -> Any:
    return h.call("POST", "/monitors/ci/observations", items, owner, headers=headers)


def test_a_batch_publishes_each_item_in_order_in_one_commit(h: Harness) -> None:
    owner = h.monitor()
    head = h.call("GET", "/monitors/ci/state", token=owner).body["head"]
    before = h.store.stats.commits
    done = publish_batch(h, owner, [{"type": TYPE, "subject": f"s{i}"} for i in range(MAX_PUBLISH_BATCH)])
    assert done.status == 207, done.body
    assert h.store.stats.commits == before + 1
    body = done.body
    assert body["monitor"] == "ci" and body["published"] == MAX_PUBLISH_BATCH and body["refused"] == 0
    assert [r["index"] for r in body["results"]] == list(range(MAX_PUBLISH_BATCH))
    assert [r["seq"] for r in body["results"]] == list(range(head + 1, head + 1 + MAX_PUBLISH_BATCH))
    log = [o for o in h.log("ci", owner) if o["type"] == TYPE]
    assert [o["subject"] for o in log] == [f"s{i}" for i in range(MAX_PUBLISH_BATCH)]
    assert [o["id"] for o in log] == [r["id"] for r in body["results"]]


def test_each_item_of_a_batch_is_refused_and_logged_on_its_own(h: Harness) -> None:
    owner = h.monitor()
    items = [
        {"type": TYPE, "subject": "ok-1"},
        {"type": "com.example.undeclared"},
        "not an object",
        # a machine cannot give itself a person's certainty
        {"type": TYPE, "subject": "ok-2", "actor": "agent:bot", "tier": "src"},
        {"type": TYPE, "subject": "ok-3", "colour": "red"},
        {"type": TYPE, "subject": "ok-4"},
    ]
    done = publish_batch(h, owner, items)
    assert done.status == 207
    results = done.body["results"]
    assert done.body["published"] == 2 and done.body["refused"] == 4
    codes = [r.get("error", {}).get("code") for r in results]
    assert codes == [None, "UNKNOWN_VOCABULARY", "INVALID", "TIER_NOT_ASSERTABLE", "INVALID", None]
    assert [r["status"] for r in results if "error" in r] == [400, 400, 400, 400]
    log = h.log("ci", owner)
    by_seq = {int(o["sequence"]): o for o in log}
    for r in results:
        if "error" in r:  # P2: every refusal is evidence, in the log, at the seq the error names
            row = by_seq[r["error"]["rejected_seq"]]
            assert row["type"] == REJECTED and row["data"]["payload"]["code"] == r["error"]["code"]
    published = [o["subject"] for o in log if o["type"] == TYPE]
    assert published == ["ok-1", "ok-4"]
    assert [r["seq"] for r in results if "seq" in r] == [int(o["sequence"]) for o in log if o["type"] == TYPE]


def test_a_refused_batch_item_counts_as_the_single_publish_would(h: Harness) -> None:
    """Budget and idempotency keys apply item by item, within the batch too."""
    owner = h.monitor(limits={"observations_per_day": 2})
    done = publish_batch(
        h,
        owner,
        [
            {"type": TYPE, "idempotency_key": "k-1"},
            {"type": TYPE, "idempotency_key": "k-1"},  # a repeat inside the same batch
            {"type": TYPE},
            {"type": TYPE},  # over the day's budget
        ],
    )
    results = done.body["results"]
    assert results[0]["idempotent"] is False and results[1]["idempotent"] is True
    assert results[1]["seq"] == results[0]["seq"]
    assert "seq" in results[2] and results[3]["error"]["code"] == "OVER_BUDGET"
    assert results[3]["status"] == 429


@pytest.mark.parametrize(
    ("items", "words"),
    [
        ([], "1 to 100"),
        ([{"type": TYPE}] * (MAX_PUBLISH_BATCH + 1), "1 to 100"),
    ],
)
def test_a_batch_outside_its_bounds_is_refused_whole_and_logged(h: Harness, items: Any, words: str) -> None:
    owner = h.monitor()
    before = h.call("GET", "/monitors/ci/state", token=owner).body["head"]
    refused = publish_batch(h, owner, items)
    assert refused.status == 400 and refused.body["code"] == "INVALID" and words in refused.body["error"]
    log = h.log("ci", owner)
    after = [
        o["type"] for o in log if int(o["sequence"]) > before and o["type"] != "ai.mentu.monitor.subscribed"
    ]
    assert after == [REJECTED]  # logged, and nothing else appended
    assert publish_batch(h, owner, [{"type": TYPE}]).status == 207  # control


def test_a_batch_takes_no_idempotency_key_header(h: Harness) -> None:
    owner = h.monitor()
    refused = publish_batch(h, owner, [{"type": TYPE}], {"idempotency-key": "k-9"})
    assert refused.status == 400 and "each item its own idempotency_key" in refused.body["error"]
    single = h.call(
        "POST", "/monitors/ci/observations", {"type": TYPE}, owner, headers={"idempotency-key": "k"}
    )
    assert single.status == 201  # control: a single publish takes the header


def test_a_batch_needs_the_owner_token_whole(h: Harness) -> None:
    owner = h.monitor()
    assert publish_batch(h, "wrong", [{"type": TYPE}]).status == 401
    assert publish_batch(h, None, [{"type": TYPE}]).status == 401
    assert h.call("POST", "/monitors/nope/observations", [{"type": TYPE}], owner).status == 404
    assert publish_batch(h, owner, [{"type": TYPE}]).status == 207  # control


def test_a_batch_on_a_paused_monitor_refuses_every_item_and_logs_each(h: Harness) -> None:
    owner = h.monitor()
    assert h.call("POST", "/monitors/ci/pause", {"reason": "m"}, owner).status == 200
    done = publish_batch(h, owner, [{"type": TYPE}, {"type": TYPE}])
    assert done.status == 207 and done.body["published"] == 0
    assert [r["error"]["code"] for r in done.body["results"]] == ["UNAVAILABLE", "UNAVAILABLE"]
    assert [r["status"] for r in done.body["results"]] == [409, 409]


def test_jsonrpc_feeds_pull_refuses_ack_with_a_replay_cursor(h: Harness) -> None:
    _, sub, reader, _ = feed(h, 2)
    call = {"jsonrpc": "2.0", "id": 1, "method": "feeds/pull"}
    both = h.call(
        "POST", "/rpc", {**call, "params": {"subscription": sub, "ack": 2, "cursor": 1}}, reader
    ).body
    assert both["error"]["data"]["code"] == "INVALID" and "two calls" in both["error"]["data"]["error"]
    assert h.call("GET", f"/subscriptions/{sub}", token=reader).body["cursor"] == 0  # nothing committed
    replay = h.call("POST", "/rpc", {**call, "params": {"subscription": sub, "cursor": 1}}, reader).body
    assert "result" in replay  # control


# ---------------------------------------------------------------------------------------------- a batch is its items
# Items as a batch meets them: good ones, and each kind of refusal, with what one accepted publish changes in its
# monitor (its counters, tracked actors, a source's contact, the day's budget) and what reads what the items before
# it did (an idempotency key repeated, a reference to the seq just appended).
_ACTORS = [f"probe:p{i}" for i in range(20)] + ["agent:bot"]
_GOOD = st.fixed_dictionaries(
    {"type": st.sampled_from([TYPE, TYPE, T_CONTRADICTION, T_CONTRADICTION_RESOLVED])},
    optional={
        "subject": st.sampled_from(["a", "b", "c"]),
        "actor": st.sampled_from(_ACTORS),
        "idempotency_key": st.sampled_from(["k1", "k2", "k3"]),
        "supersedes": st.integers(min_value=0, max_value=8),
        "data": st.sampled_from([{"n": 1}, {"answered": False, "reason": "timed out"}]),
        "tier": st.sampled_from(["unverified", "unverified", "src"]),  # a machine asserting src is refused
    },
)
_BAD = st.sampled_from(
    [
        {"type": "com.example.undeclared"},
        "not an object",
        {"type": TYPE, "colour": "red"},
        {"type": TYPE, "idempotency_key": ""},
    ]
)
_ITEM = st.one_of(_GOOD, _GOOD, _GOOD, _BAD)  # mostly accepted: runs of several items between refusals


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.lists(_ITEM, max_size=4),
    items=st.lists(_ITEM, min_size=1, max_size=30),
    per_day=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
    kind=st.sampled_from(STORE_KINDS),
    midnight=st.booleans(),
)
# A reference to the item just before, in the same run (the monitor's head is 1 once created).
@example(
    before=[],
    items=[{"type": TYPE}, {"type": TYPE, "supersedes": 2}],
    per_day=None,
    kind="memory",
    midnight=False,
)
def test_a_batch_is_its_items_published_one_by_one(
    tmp_path_factory: pytest.TempPathFactory,
    before: list[Any],
    items: list[Any],
    per_day: int | None,
    kind: str,
    midnight: bool,
) -> None:
    """A batch folds its accepted items into one new version of their monitor per run (publishing.Run): its
    replies, its log and its monitor are exactly those of the same items published alone, in order, at the
    same time, after the same history (`before`, published a minute earlier: with `midnight`, the day before,
    so the day's budget starts again); and its counters are what its log holds."""
    limits = {} if per_day is None else {"limits": {"observations_per_day": per_day}}
    apart = Harness(make_store(kind, tmp_path_factory.mktemp("apart")))
    together = Harness(make_store(kind, tmp_path_factory.mktemp("together")))
    owner_apart, owner_together = apart.monitor(**limits), together.monitor(**limits)
    for h, owner in ((apart, owner_apart), (together, owner_together)):
        if midnight:
            h.clock.t = (h.clock.t // 86_400 + 1) * 86_400 - 30
        for item in before:
            h.call("POST", "/monitors/ci/observations", item, owner)
        h.clock.advance(60)
    alone = [
        together_item_form(apart.call("POST", "/monitors/ci/observations", item, owner_apart))
        for item in items
    ]
    batch = publish_batch(together, owner_together, items)
    assert batch.status == 207, batch.body
    assert [{k: v for k, v in r.items() if k != "index"} for r in batch.body["results"]] == alone
    assert batch.body["published"] == sum(1 for r in alone if "seq" in r)
    mine, theirs = together.store.get_monitor("ci"), apart.store.get_monitor("ci")
    assert replace(mine, owner_hash="") == replace(theirs, owner_hash="")
    log = [o.event for o in together.store.scan("ci", 1, mine.head)]
    assert log == [o.event for o in apart.store.scan("ci", 1, theirs.head)]
    types = [e["type"] for e in log]
    counters = mine.counters
    assert counters.contradictions == types.count(T_CONTRADICTION)
    assert counters.contradictions_resolved == types.count(T_CONTRADICTION_RESOLVED)
    assert counters.rejected == types.count(REJECTED)
    assert counters.observations == sum(
        1 for t in types if not t.startswith("ai.mentu.monitor.") or "contra" in t
    )


def together_item_form(reply: Any) -> dict[str, Any]:
    """A single publish's reply as a batch states the same item's result (its seq and id, or its error)."""
    if reply.status >= 400:
        return {"status": reply.status, "error": reply.body}
    assert reply.status in (200, 201), reply.body
    out = {"seq": reply.body["seq"], "id": reply.body["observation"]["id"]}
    if "idempotent" in reply.body:
        out["idempotent"] = reply.body["idempotent"]
    return out
