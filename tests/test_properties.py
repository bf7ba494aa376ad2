"""Property-based invariants of the log and the cursor (hypothesis): seqs strictly increase, pull never
commits, no acknowledged observation comes back, nothing unacknowledged is lost, lag reaches 0."""

from __future__ import annotations

import pytest
from enginekit import Harness
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from monitor_protocol.core.rules import pages
from monitor_protocol.store.memory import MemoryStore

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

OTHER = "com.example.ci.other"  # a type the subscription's filter does not let through

ops = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 4)),
        st.tuples(st.just("pull"), st.integers(1, 5)),
        st.tuples(st.just("ack"), st.just(0)),
        st.tuples(st.just("crash"), st.just(0)),
        st.tuples(st.just("reject"), st.just(0)),
        st.tuples(st.just("noise"), st.integers(1, 6)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_at_least_once_delivery(script):
    run_script(script)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
# A reader that crashes after a capped page that did deliver something gets that page again.
@example([("publish", 1), ("noise", 3), ("pull", 5), ("pull", 5), ("crash", 0), ("pull", 5), ("ack", 0)])
def test_at_least_once_delivery_when_every_filtered_read_is_capped(script):
    """The same invariants with a scan budget of 2 rows: capped pages, remembered misses and all."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pages, "SCAN_BUDGET", 2)
        run_script(script)


def run_script(script):
    h = Harness(MemoryStore())
    tok = h.monitor("ci", types=["com.example.ci.run", OTHER])
    sub, rt = h.subscribe("ci", tok, filter={"types": ["com.example.ci.run"]})
    published: list[int] = []
    processed: dict[int, int] = {}
    acked_upto = 0
    held: dict | None = None
    last_seq = 0
    unacked: set[int] = set()  # delivered to the reader, not acknowledged yet
    owed: set[int] = set()  # delivered to a reader that crashed: must come again before it is acked past
    for op, n in script:
        if op == "publish":
            for _ in range(n):
                r = h.publish("ci", tok, actor="probe:ci")
                assert r.body["seq"] > last_seq  # seqs strictly increase
                last_seq = r.body["seq"]
                published.append(r.body["seq"])
        elif op == "noise":
            for _ in range(n):
                last_seq = h.publish("ci", tok, type=OTHER, actor="probe:ci").body["seq"]
        elif op == "reject":
            r = h.publish("ci", tok, actor="agent:x", tier="src")
            assert r.status == 400 and r.body["rejected_seq"] > last_seq
            last_seq = r.body["rejected_seq"]
        elif op == "pull":
            body = h.pull(sub, rt, limit=n).body
            for o in body["observations"]:
                assert int(o["id"]) >= acked_upto  # nothing acknowledged comes back
                processed[int(o["id"])] = processed.get(int(o["id"]), 0) + 1
                unacked.add(int(o["id"]))
                owed.discard(int(o["id"]))
            assert body["cursor"] == acked_upto  # pull never commits
            held = body
        elif op == "ack" and held is not None:
            skipped = {s for s in owed if s < held["next"]}
            assert not skipped, f"a crashed reader's batch was never redelivered: {sorted(skipped)}"
            r = h.ack(sub, rt, held["next"])
            assert r.status == 200
            acked_upto = r.body["cursor"]
            unacked = {s for s in unacked if s >= acked_upto}
            held = None
        elif op == "crash":
            held = None  # the batch is lost with the reader; the cursor did not move
            owed |= unacked
    # drain: a restarted reader gets everything not yet acknowledged
    for _ in range(100):
        body = h.pull(sub, rt, limit=7).body
        for o in body["observations"]:
            processed[int(o["id"])] = processed.get(int(o["id"]), 0) + 1
            owed.discard(int(o["id"]))
        assert not {s for s in owed if s < body["next"]}, "a crashed reader's batch was never redelivered"
        h.ack(sub, rt, body["next"])
        if not body["observations"] and not body.get("scan_capped"):
            break
    assert set(published) <= set(processed)  # nothing lost
    assert not owed  # and whatever a crashed reader held came back
    final = h.pull(sub, rt).body
    assert final["lag"] == 0 and final["observations"] == []


# timefmt.iso remembers the second and the exact time it formatted last (a batch's items share one `now`):
# whatever order times come in, its text is datetime's own, to the millisecond.
@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 253402300799.0) | st.integers(0, 253402300799), min_size=1, max_size=8))
@example([1.0, 1, 1.0])  # an int equal to the float before it
@example([1.9999999, 1.9999999, 2.0])  # rounds up into the next second
def test_a_time_is_formatted_as_datetime_formats_it(times: list[float]) -> None:
    from datetime import UTC, datetime

    from monitor_protocol.core import timefmt

    for ts in [*times, *reversed(times)]:
        dt = datetime.fromtimestamp(ts, tz=UTC)
        expected = (
            f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}"
            f".{dt.microsecond // 1000:03d}Z"
        )
        assert timefmt.iso(ts) == expected
