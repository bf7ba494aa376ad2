"""A monitor's cadence, budget and limits are checked when written, so a served monitor always validates against
the published schema (section 4, C29); an owner's refused update, lifecycle call, batch or subscribe is logged
as a rejection like a refused publish (section 10, P2), while an anonymous caller's and a reader's are not
(docs/protocol.md section 10 says why); and the refusals' sentences say what to send instead (section 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from enginekit import Harness
from monitor_protocol.core.schemas import errors_of
from monitor_protocol.store.memory import MemoryStore

pytestmark = pytest.mark.quick

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-schemas"
REJECTED = "ai.mentu.monitor.rejected"


@pytest.fixture
def h() -> Harness:
    return Harness(MemoryStore())


def _schema_problems(monitor: dict) -> list[str]:
    problems = errors_of("monitor", monitor)
    if REFERENCE.is_dir():  # CI always has ../shared/; a bare clone checks the project's schema only
        problems += errors_of("monitor", monitor, REFERENCE)
    return problems


BAD_DEFINITIONS = [
    ({"cadence": {"heartbeat_seconds": "x"}}, "cadence.heartbeat_seconds"),
    ({"cadence": {"heartbeat_seconds": 1.5}}, "cadence.heartbeat_seconds"),
    ({"cadence": {"heartbeat_seconds": 0}}, "cadence.heartbeat_seconds"),
    ({"cadence": {"heartbeat_seconds": 31 * 86400 + 1}}, "cadence.heartbeat_seconds"),
    ({"cadence": {"schedule": 5}}, "cadence.schedule"),
    ({"cadence": {"schedule": "every banana"}}, "cadence.schedule"),
    ({"cadence": {"event_driven": "yes"}}, "cadence.event_driven"),
    ({"cadence": []}, "cadence"),
    ({"budget": {"per_day": "lots"}}, "budget.per_day"),
    ({"budget": {"per_day": -1}}, "budget.per_day"),
    ({"budget": {"per_day": True}}, "budget.per_day"),
    ({"budget": {"currency": 5}}, "budget.currency"),
    ({"budget": {"observations_per_minute": 0}}, "budget.observations_per_minute"),
    ({"budget": "cheap"}, "budget"),
    ({"limits": {"require_evidence": "yes"}}, "limits.require_evidence"),
    ({"limits": {"observations_per_day": 0}}, "limits.observations_per_day"),
]


@pytest.mark.parametrize(
    ("fields", "named"), BAD_DEFINITIONS, ids=[n + "-" + repr(f) for f, n in BAD_DEFINITIONS]
)
def test_a_definition_the_schema_would_refuse_is_refused_on_create_and_on_update(h, fields, named):
    r = h.call("POST", "/monitors", {"id": "bad", **fields})
    assert r.status == 400 and r.body["code"] == "INVALID", r.body
    assert named in r.body["error"], r.body
    assert h.call("GET", "/monitors/bad").status == 404  # nothing made
    owner = h.monitor("ci")
    before = h.call("GET", "/monitors/ci", token=owner).body
    r = h.call("POST", "/monitors/ci/update", {"patch": fields}, owner)
    assert r.status == 400 and named in r.body["error"], r.body
    assert h.call("GET", "/monitors/ci", token=owner).body["version"] == before["version"]


def test_every_checked_member_given_well_is_kept_and_the_monitor_validates(h):
    """The positive control: each member the checks read, well formed, with members they do not read (kept as
    given: the schema leaves cadence, budget and limits open)."""
    fields = {
        "cadence": {"heartbeat_seconds": 60, "schedule": "*/5 * * * *", "event_driven": False, "note": "x"},
        "budget": {"per_day": 2.5, "currency": "USD", "observations_per_minute": 3, "team": "ops"},
        "limits": {"observations_per_day": 100, "require_evidence": True, "other": 1},
    }
    r = h.call("POST", "/monitors", {"id": "good", **fields})
    assert r.status == 201, r.body
    served = h.call("GET", "/monitors/good", token=r.body["owner_token"]).body
    assert {k: served[k] for k in fields} == fields
    assert _schema_problems(served) == []
    r = h.call("POST", "/monitors/good/update", {"patch": {"budget": None}}, r.body["owner_token"])
    assert (
        r.status == 200 and r.body["monitor"]["budget"] is None and _schema_problems(r.body["monitor"]) == []
    )


def _log(h: Harness, owner: str) -> dict[int, dict]:
    return {int(o["sequence"]): o for o in h.log("ci", owner)}


def test_an_owners_refused_update_is_logged_with_its_raw_body(h):
    owner = h.monitor("ci")
    body = {"patch": {"cadence": {"heartbeat_seconds": "x"}}, "reason": "tune"}
    r = h.call("POST", "/monitors/ci/update", body, owner)
    assert r.status == 400 and isinstance(r.body.get("rejected_seq"), int), r.body
    row = _log(h, owner)[r.body["rejected_seq"]]
    assert row["type"] == REJECTED
    payload = row["data"]["payload"]
    assert payload["code"] == "INVALID" and payload["raw"] == body and payload["actor"] == "human:you"
    # a lifecycle call's reason past its limit, and a body that is not JSON, are logged too
    r = h.call("POST", "/monitors/ci/pause", {"reason": "r" * 2000}, owner)
    assert r.status == 400 and _log(h, owner)[r.body["rejected_seq"]]["type"] == REJECTED
    r = h.call("POST", "/monitors/ci/pause", b'{"reason": NaN}', owner)
    assert (
        r.status == 400
        and _log(h, owner)[r.body["rejected_seq"]]["data"]["payload"]["raw"] == '{"reason": NaN}'
    )
    # control: the same update well formed is a configured row, not a rejection
    r = h.call("POST", "/monitors/ci/update", {"patch": {"cadence": {"heartbeat_seconds": 60}}}, owner)
    assert r.status == 200 and _log(h, owner)[r.body["seq"]]["type"] == "ai.mentu.monitor.configured"


def test_a_refusal_without_the_owners_credential_writes_nothing(h):
    owner = h.monitor("ci", visibility="public")
    head = h.call("GET", "/monitors/ci/state", token=owner).body["head"]
    for token in (None, "mpo_wrong"):
        r = h.call("POST", "/monitors/ci/update", {"patch": {"budget": 5}}, token)
        assert r.status in (400, 401) and "rejected_seq" not in r.body, r.body
        r = h.call("POST", "/monitors/ci/pause", b"{not json", token)
        assert r.status in (400, 401) and "rejected_seq" not in r.body, r.body
        # an anonymous subscribe to a public monitor: refused, and not logged (nobody could be held to it)
        r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:" + "x" * 300}, token)
        assert r.status == 400 and "rejected_seq" not in r.body, r.body
    assert h.call("GET", "/monitors/ci/state", token=owner).body["head"] == head
    # control: the owner's own refused subscribe is logged
    r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:" + "x" * 300}, owner)
    assert r.status == 400 and _log(h, owner)[r.body["rejected_seq"]]["type"] == REJECTED


def test_a_subscribe_tokens_refusals_are_not_logged(h):
    """Found by a reviewer: logged, every consumer given a shared monitor's subscribe token could write rows
    into its log without limit (50 refused subscribes, 50 rows). Control: the owner's is logged."""
    r = h.call("POST", "/monitors", {"id": "ci", "owner": "human:you", "visibility": "shared"})
    owner, subscribe = r.body["owner_token"], r.body["subscribe_token"]
    head = h.call("GET", "/monitors/ci/state", token=owner).body["head"]
    for i in range(5):
        r = h.call(
            "POST", "/subscriptions", {"monitor": "ci", "subscriber": f"agent:{i}", "filter": 5}, subscribe
        )
        assert r.status == 400 and "rejected_seq" not in r.body, r.body
    assert h.call("GET", "/monitors/ci/state", token=owner).body["head"] == head
    r = h.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:o", "filter": 5}, owner)
    assert r.status == 400 and isinstance(r.body.get("rejected_seq"), int), r.body


def test_a_refused_push_subscribe_is_logged_without_its_secret_or_its_sinks_path(h):
    """Found by a reviewer: the rejected row kept the whole body, and every reader of the monitor could read
    a push subscriber's sink_secret (and sign deliveries to its sink) and the sink's path. Both are withheld;
    the rest of the body is kept (the control)."""
    owner = h.monitor("ci")
    sub, reader = h.subscribe("ci", owner, subscriber="agent:reader")
    body = {
        "monitor": "ci",
        "subscriber": "agent:pusher",
        "protocol": "http",
        "sink": "https://hooks.example.com:0/services/T0/SECRETPATH?key=SECRETQUERY",
        "sink_secret": "whsec_" + "S" * 32,
        "filter": 5,
    }
    r = h.call("POST", "/subscriptions", body, owner)
    assert r.status == 400 and isinstance(r.body.get("rejected_seq"), int), r.body
    seen = json.dumps(h.pull(sub, reader).body)
    assert "SECRETPATH" not in seen and "SECRETQUERY" not in seen and "whsec_" not in seen
    raw = _log(h, owner)[r.body["rejected_seq"]]["data"]["payload"]["raw"]
    assert raw["sink"] == "https://hooks.example.com/(withheld)" and raw["sink_secret"] == "(withheld)"
    assert raw["subscriber"] == "agent:pusher" and raw["filter"] == 5 and raw["protocol"] == "http"


def test_a_refusal_the_store_could_not_log_names_no_row(h, monkeypatch):
    """Found by a reviewer: the row's seq was set on the refusal before its commit, so a store that failed
    the commit (a read-only standby, a lost connection) answered a rejected_seq of a row never written."""
    from monitor_protocol.core.store_contract import StorageError
    from monitor_protocol.store.memory import MemoryStore

    owner = h.monitor("ci")

    def failing(self, changes):
        raise StorageError("read-only")

    monkeypatch.setattr(MemoryStore, "apply", failing)
    r = h.call("POST", "/monitors/ci/update", {"patch": {"budget": 5}}, owner)
    assert r.status == 400 and r.body["code"] == "INVALID" and "rejected_seq" not in r.body, r.body
    monkeypatch.undo()  # control: the store takes it, and the refusal names its row
    r = h.call("POST", "/monitors/ci/update", {"patch": {"budget": 5}}, owner)
    assert r.status == 400 and _log(h, owner)[r.body["rejected_seq"]]["type"] == REJECTED


def test_a_readers_refused_calls_leave_its_feed_as_it_was(h):
    """A reader's refused ack, pull, seek or lease call is not logged: it would land in the feed the reader
    reads, and the page after a refused ack would not be the page before it (C27)."""
    owner = h.monitor("ci", capabilities=["observe", "act"])
    h.publish("ci", owner, subject="s1")
    sub, token = h.subscribe("ci", owner, capabilities=["observe", "act"])
    page = h.pull(sub, token).body
    assert h.ack(sub, token, "x").status == 400
    assert h.pull(sub, token, cursor="abc").status == 400
    assert h.pull(sub, token, types="com.example.other").status == 400
    assert (
        h.call("POST", f"/subscriptions/{sub}/seek", {"cursor": 0, "reason": "r" * 2000}, token).status == 400
    )
    assert h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": 5}, token).status == 400
    again = h.pull(sub, token).body
    assert again["head"] == page["head"] and again["lag"] == page["lag"]
    assert [o["id"] for o in again["observations"]] == [o["id"] for o in page["observations"]]


def test_the_sentences_say_what_to_send(h):
    owner = h.monitor("ci")
    h.publish("ci", owner)
    sub, token = h.subscribe("ci", owner)
    r = h.call("POST", f"/subscriptions/{sub}/ack", b'{"cursor": 9007199254740993}', token)
    assert r.status == 400 and "a cursor, seq or count is at most 2^53" in r.body["error"], r.body
    r = h.pull(sub, token, cursor="9" * 40)
    assert r.status == 400 and "within 0..2^53" in r.body["error"] and "ASCII" not in r.body["error"], r.body
    r = h.pull(sub, token, cursor="12a")  # control: not digits at all
    assert r.status == 400 and "ASCII decimal digits" in r.body["error"], r.body
    assert h.call("POST", "/monitors/ci/retire", {"reason": "done"}, owner).status == 200
    r = h.publish("ci", owner)
    assert r.status == 409 and "final" in r.body["error"] and "until resumed" not in r.body["error"], r.body
    assert h.call("POST", "/monitors/ci/resume", {"reason": "again"}, owner).status == 409
    # control: a paused monitor's refusal says resume, and resuming works
    other = h.monitor("cd")
    assert h.call("POST", "/monitors/cd/pause", {"reason": "hold"}, other).status == 200
    r = h.publish("cd", other)
    assert r.status == 409 and "until resumed" in r.body["error"], r.body
    assert h.call("POST", "/monitors/cd/resume", {"reason": "go"}, other).status == 200


@pytest.mark.parametrize("given", [0, "", {}, False])
def test_a_falsy_was_derived_from_is_refused_not_read_as_none(h, given):
    """Found by a tester: 0, "" and {} were stored as [] (201), while "x" was refused (P11: never a silent
    pass). Controls: absent, null and [] are derived from nothing."""
    owner = h.monitor("ci")
    r = h.publish("ci", owner, wasDerivedFrom=given)
    assert r.status == 400 and "wasDerivedFrom must be an array" in r.body["error"], r.body
    for fine in ({}, {"wasDerivedFrom": None}, {"wasDerivedFrom": []}):
        r = h.publish("ci", owner, **fine)
        assert r.status == 201 and r.body["observation"]["data"]["provenance"]["wasDerivedFrom"] == [], r.body


def test_an_imported_log_keeps_a_definition_earlier_releases_accepted(h):
    """Found by a reviewer: a log exported before cadence and budget were typed (heartbeat_seconds 90.5,
    budget.per_day "lots", both accepted then) could no longer be imported. An import checks them as
    earlier releases did (objects); a create still refuses them (the control)."""
    owner = h.monitor("ci")
    lines = h.service.export_log("ci")
    after = lines[0]["data"]["payload"]["after"]
    after["cadence"], after["budget"] = {"heartbeat_seconds": 90.5}, {"per_day": "lots"}
    text = "\n".join(json.dumps(line) for line in lines)
    assert owner and h.service.import_log("ci-copy", text)["monitor"]["cadence"] == {
        "heartbeat_seconds": 90.5
    }
    r = h.call("POST", "/monitors", {"id": "ci-new", "cadence": {"heartbeat_seconds": 90.5}})
    assert r.status == 400 and "cadence.heartbeat_seconds" in r.body["error"], r.body
