"""A filtered read the store cannot answer by seeking one index walks at most SCAN_SPAN seqs per request.

Found by a tester (2026-12-07): a filter on a column with no index of its own (tier, origin, horizon), or an
indexed key beside one, or alternatives, was counted as answered by the store's indexes, so no scan budget
applied: one anonymous pull over a 300,000-row log that matched nothing held SQLite's event loop 0.5-5.5 s,
a JSON-RPC batch of 100 such pulls 34 s, and five such long polls parked made every publish take 1.3 s (each
woken re-check walked the whole log again). The store tests those rows itself, so the engine never counted
them: the read is now bounded by the stretch of the log it walks. Each test has its control: a filter one
index answers alone (a type) still reads to the head in one request.
"""

from __future__ import annotations

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from monitor_protocol.core import filters
from monitor_protocol.core.rules import delivery, page_bytes

SPAN = 64  # SCAN_SPAN for these tests (8,192 in the server): a log a few spans long stays quick to build
A, B = "com.example.a", "com.example.b"


@pytest.fixture(params=STORE_KINDS)
def h(request, tmp_path, monkeypatch):
    monkeypatch.setattr(page_bytes, "SCAN_SPAN", SPAN)
    return Harness(make_store(request.param, tmp_path))


def log_of(h: Harness, head: int) -> str:
    """A log up to seq `head`: the monitor's own first row, then observations of type B its owner published
    (a person's origin, the default tier): none of them from a webhook, none falsified."""
    tok = h.monitor("ci", types=[A, B])
    body = [{"type": B, "subject": f"s{i % 7}"} for i in range(head - 1)]
    for start in range(0, len(body), 100):
        r = h.call("POST", "/monitors/ci/observations", body[start : start + 100], tok)
        assert r.status == 207 and r.body["refused"] == 0, r.body
    assert h.call("GET", "/monitors/ci/state", token=tok).body["head"] == head
    return tok


def test_which_queries_a_store_answers_by_seeking_one_index():
    seeks = [{"types": [A]}, {"types": [A, B]}, {"subjects": ["x"]}, {"actors": ["agent:x"]}]
    walks = [
        {"origins": ["webhook"]},  # no index of its own
        {"tiers": ["falsified"]},
        {"types": [A], "tiers": ["falsified"]},  # an index, and a column tested on every row it finds
        {"types": [A], "subjects": ["x"]},  # two indexes: one is sought, the other tested
        {"types": ["com.example.*"]},  # a prefix walks the index's range, whatever the seqs
        [{"types": [A]}, {"subjects": ["x"]}],  # alternatives
    ]
    assert all(filters.prefilter(f).seeks_alone for f in seeks)
    assert not any(filters.prefilter(f).seeks_alone for f in walks)
    assert not filters.prefilter({"types": [A]}, {"types": [A]}).seeks_alone  # two clauses


@pytest.mark.parametrize("flt", [{"origins": ["webhook"]}, {"types": [B], "tiers": ["falsified"]}])
def test_a_filter_no_single_index_answers_walks_a_bounded_stretch_per_pull(h, flt):
    head = SPAN * 3 + 5
    tok = log_of(h, head)
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:walker", filter=flt)
    first = h.pull(sid, rtok, limit=10).body
    head = first["head"]  # (its subscription added a row)
    assert first["observations"] == [] and first["scan_capped"] is True
    assert first["next"] == SPAN + 1  # one span walked, and every seq below `next` examined
    assert first["lag_capped"] is True and first["lag"] <= head
    shown = h.call("GET", f"/subscriptions/{sid}", token=rtok).body  # the lag alone: bounded too
    assert shown["lag_capped"] is True
    # Without acking (push, watch and SSE readers do not ack an empty page) it still goes on, a span a pull.
    nexts = [first["next"]]
    while len(nexts) < 10:
        page = h.pull(sid, rtok, limit=10).body
        nexts.append(page["next"])
        if "scan_capped" not in page:
            break
    assert nexts == [SPAN + 1, 2 * SPAN + 1, 3 * SPAN + 1, head + 1]
    # The control: a type, one index sought alone, reads to the head in one pull (a prefix would walk).
    seek, seek_tok = h.subscribe("ci", tok, subscriber="agent:seeker", filter={"types": [A]})
    sought = h.pull(seek, seek_tok, limit=10).body
    assert sought["next"] == sought["head"] + 1 and "scan_capped" not in sought and sought["lag"] == 0


def test_the_pulls_of_one_json_rpc_batch_share_one_span(h):
    tok = log_of(h, SPAN * 4)
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:walker", filter={"origins": ["webhook"]})
    calls = [
        {"jsonrpc": "2.0", "id": i, "method": "feeds/pull", "params": {"subscription": sid, "limit": 10 + i}}
        for i in range(3)
    ]
    reply = h.call("POST", "/rpc", calls, rtok)
    assert reply.status == 200
    results = [r["result"] for r in reply.body]
    # The first pull walks the span; the others find nothing left of it for this request and walk nothing
    # (each starts where the last one's walk ended, remembered): the rest waits for another request.
    assert [r["next"] for r in results] == [SPAN + 1] * 3, results
    assert all(r["scan_capped"] for r in results)
    # The control: the next pull, alone in a request of its own, walks a span of its own.
    assert h.pull(sid, rtok, limit=10).body["next"] == 2 * SPAN + 1


def test_an_empty_pull_that_walked_to_the_head_is_remembered_so_a_re_check_reads_only_what_is_new(
    h, monkeypatch
):
    """A parked long poll is re-checked at every append: without the mark, each re-check walked again from
    the reader's cursor (a span of the log each time, per parked reader, inside the publisher's commit).
    A walk is remembered from SCAN_BUDGET seqs (1,000; 16 here, under this test's span)."""
    monkeypatch.setattr(delivery, "SCAN_BUDGET", 16)
    head = SPAN * 2 + SPAN // 2
    tok = log_of(h, head)
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:walker", filter={"origins": ["webhook"]})
    head += 1  # (its subscription added a row)
    nexts: list[int] = []
    while len(nexts) < 10 and (not nexts or nexts[-1] <= head):
        nexts.append(h.pull(sid, rtok, limit=10).body["next"])
    assert nexts == [SPAN + 1, 2 * SPAN + 1, head + 1]
    stored = h.service.store.get_subscription(sid)
    assert stored.scan_mark is not None and stored.scan_mark[1] == head  # the walk to the head, remembered
    h.publish("ci", tok, type=B, subject="new")
    again = h.pull(sid, rtok, limit=10).body
    assert again["next"] == head + 2 and "scan_capped" not in again  # only the new row was read
    assert h.service.store.get_subscription(sid).scan_mark == stored.scan_mark  # a short walk: not written
    # The control: a type filter (one index sought) writes nothing for an empty pull, as before.
    seek, seek_tok = h.subscribe("ci", tok, subscriber="agent:seeker", filter={"types": [A]})
    assert h.pull(seek, seek_tok, limit=10).body["next"] == head + 3
    assert h.service.store.get_subscription(seek).scan_mark is None


def test_a_page_the_requests_spent_walk_cut_short_is_not_handed_to_another_reader(tmp_path, monkeypatch):
    """Found by a reviewer: readers of one group commit share the pages they read alike (the group's memo),
    and a page a JSON-RPC batch had cut short with its spent walk was handed to another request's reader with
    the same filter and place, which then made no progress. The control: outside a group, that reader walks
    its own span."""
    monkeypatch.setattr(page_bytes, "SCAN_SPAN", SPAN)
    h = Harness(make_store("sqlite", tmp_path))
    tok = log_of(h, SPAN * 4)
    flt = {"origins": ["webhook"]}
    x, xt = h.subscribe("ci", tok, subscriber="agent:x", filter=flt)
    y, yt = h.subscribe("ci", tok, subscriber="agent:y", filter=flt)
    assert h.ack(y, yt, SPAN + 1).status == 200  # y stands where x's batch will stand after its first pull
    calls = [
        {"jsonrpc": "2.0", "id": i, "method": "feeds/pull", "params": {"subscription": x, "limit": 10}}
        for i in range(3)
    ]
    with h.store.batch():  # one group commit, as the HTTP door makes of one loop turn's calls
        assert [r["result"]["next"] for r in h.call("POST", "/rpc", calls, xt).body] == [SPAN + 1] * 3
        assert h.pull(y, yt, limit=10).body["next"] == 2 * SPAN + 1


@pytest.mark.parametrize(
    "flt",
    [
        {"origins": ["human"]},
        {"origins": ["webhook"]},
        {"types": [B], "subjects": ["s3", "s4"]},
        [{"subjects": ["s1"]}, {"subjects": ["s2"], "tiers": ["derived", "src", "measured", "unverified"]}],
        {"subjects": ["s*"], "tiers": ["falsified"]},
    ],
)
def test_a_few_rows_are_read_whole_and_checked_by_the_engine_alike(h, monkeypatch, flt):
    """A re-check after an append reads one row or a few. Found by a tester: 200 parked readers with distinct
    4 KiB filters cost the store 3.7 ms each per re-check (a statement of hundreds of values per reader),
    0.75 s per publish. A read of at most FEW_ROWS seqs that no single index answers reads the rows whole and
    checks the filters in the engine, without the store's filtered scan; the control: the same pulls through
    the store's scan (FEW_ROWS 0) give the same pages and lags."""
    from monitor_protocol.core.rules import ledger, pages

    tok = log_of(h, 40)
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:few", filter=flt)
    head = h.pull(sid, rtok, limit=1, cursor=1).body["head"]
    assert h.ack(sid, rtok, head - 10).status == 200  # its lag, too, is a few rows
    filtered: list[str] = []
    for name in ("scan", "count"):
        original = getattr(h.store, name)

        def spy(monitor_id, from_seq, to_seq, query=None, *args, _original=original, _name=name, **kwargs):
            if query is not None:
                filtered.append(_name)
            return _original(monitor_id, from_seq, to_seq, query, *args, **kwargs)

        monkeypatch.setattr(h.store, name, spy)
    answers = {}
    for few in (32, 0):
        monkeypatch.setattr(pages, "FEW_ROWS", few)
        monkeypatch.setattr(ledger, "FEW_ROWS", few)
        filtered.clear()
        got = []
        for cursor in (head - 20, head - 5, head, head + 1):
            body = h.pull(sid, rtok, cursor=cursor, limit=3).body
            got.append(([o["id"] for o in body["observations"]], body["next"], body["lag"]))
        answers[few] = got
        assert bool(filtered) == (few == 0), filtered  # the few rows never went through a filtered read
    assert answers[32] == answers[0]
