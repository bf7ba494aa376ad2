"""Property-based invariants of the log and the cursor (hypothesis): seqs strictly increase, pull never
commits, no acknowledged observation comes back, nothing unacknowledged is lost, lag reaches 0."""

from __future__ import annotations

from enginekit import Harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_protocol.store.memory import MemoryStore

ops = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 4)),
        st.tuples(st.just("pull"), st.integers(1, 5)),
        st.tuples(st.just("ack"), st.just(0)),
        st.tuples(st.just("crash"), st.just(0)),
        st.tuples(st.just("reject"), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_at_least_once_delivery(script):
    h = Harness(MemoryStore())
    tok = h.monitor("ci")
    sub, rt = h.subscribe("ci", tok, filter={"types": ["com.example.ci.run"]})
    published: list[int] = []
    processed: dict[int, int] = {}
    acked_upto = 0
    held: dict | None = None
    last_seq = 0
    for op, n in script:
        if op == "publish":
            for _ in range(n):
                r = h.publish("ci", tok, actor="probe:ci")
                assert r.body["seq"] > last_seq  # seqs strictly increase
                last_seq = r.body["seq"]
                published.append(r.body["seq"])
        elif op == "reject":
            r = h.publish("ci", tok, actor="agent:x", tier="src")
            assert r.status == 400 and r.body["rejected_seq"] > last_seq
            last_seq = r.body["rejected_seq"]
        elif op == "pull":
            body = h.pull(sub, rt, limit=n).body
            for o in body["observations"]:
                assert int(o["id"]) >= acked_upto  # nothing acknowledged comes back
                processed[int(o["id"])] = processed.get(int(o["id"]), 0) + 1
            assert body["cursor"] == acked_upto  # pull never commits
            held = body
        elif op == "ack" and held is not None:
            r = h.ack(sub, rt, held["next"])
            assert r.status == 200
            acked_upto = r.body["cursor"]
            held = None
        elif op == "crash":
            held = None  # the batch is lost with the reader; the cursor did not move
    # drain: a restarted reader gets everything not yet acknowledged
    for _ in range(100):
        body = h.pull(sub, rt, limit=7).body
        for o in body["observations"]:
            processed[int(o["id"])] = processed.get(int(o["id"]), 0) + 1
        h.ack(sub, rt, body["next"])
        if not body["observations"]:
            break
    assert set(published) <= set(processed)  # nothing lost
    final = h.pull(sub, rt).body
    assert final["lag"] == 0 and final["observations"] == []
