"""Share and restore (importing.py): export a monitor's log as CloudEvents JSON Lines, import it into a NEW
monitor. Round trips over random histories (hypothesis), every refusal rule beside its positive control,
nothing half imported, DUPLICATE, the size bounds, and every line checked against the project's schemas
with jsonschema (the engine's own small validator must agree with it)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_protocol.core import schemas, wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules import importing
from monitor_protocol.doors.browser import EngineHost
from monitor_protocol.store.memory import MemoryStore

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

TYPES = ["com.example.ci.run", "com.example.ci.other"]
OBSERVATION = schemas.validator("observation")
STATE = schemas.validator("state")
MONITOR = schemas.validator("monitor")


# ---------------------------------------------------------------------------------------------- helpers
def lines_of(text: str) -> list[str]:
    return [line for line in text.split("\n") if line]


def export(h: Harness, mid: str) -> str:
    return importing.to_jsonl(h.service.export_log(mid))


def state(h: Harness, mid: str, token: str) -> dict[str, Any]:
    r = h.call("GET", f"/monitors/{mid}/state", token=token)
    assert r.status == 200, r.body
    return r.body


def copied(row: dict[str, Any], new_id: str) -> dict[str, Any]:
    """What importing.py's mapping makes of a row: only the monitor's address changes."""
    out = copy.deepcopy(row)
    out["source"] = f"monitor:{new_id}"
    protocol = out["type"].startswith("ai.mentu.monitor.") and "contradiction" not in out["type"]
    if protocol and "monitor" in out["data"].get("tags", {}):
        out["data"]["tags"]["monitor"] = new_id
    if out["type"] == "ai.mentu.monitor.configured":
        out["data"]["payload"]["after"]["id"] = new_id
    return out


def refusal(h: Harness, new_id: str, source: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        h.service.import_log(new_id, source)
    assert h.store.get_monitor(new_id) is None, "a refused import wrote its monitor"
    assert list(h.store.scan(new_id, 1, 10**6)) == [], "a refused import wrote rows"
    return info.value


def base_history(h: Harness) -> str:
    """A small history with every kind of row: create, publishes (one refused), a reader that pulls and
    acks, a lease claimed and completed, an update and a pause. Returns the owner token."""
    tok = h.monitor("ci", types=TYPES, capabilities=["observe", "act"])
    assert h.publish("ci", tok, subject="build-1", actor="probe:ci").status == 201
    assert h.publish("ci", tok, subject="build-2", actor="agent:bot", tier="src").status == 400
    assert h.publish("ci", tok, subject="build-3", actor="agent:bot", on_behalf_of="human:you").status == 201
    sub, rt = h.subscribe("ci", tok, subscriber="agent:worker", capabilities=["observe", "act"])
    assert h.pull(sub, rt).status == 200
    assert h.ack(sub, rt, 3).status == 200
    r = h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "build-1"}, rt)
    assert r.status == 201, r.body
    r = h.call("POST", f"/subscriptions/{sub}/leases/complete", {"subject": "build-1", "outcome": "done"}, rt)
    assert r.status == 200, r.body
    r = h.call("POST", "/monitors/ci/update", {"patch": {"name": "CI runs"}, "reason": "rename"}, tok)
    assert r.status == 200, r.body
    assert h.call("POST", "/monitors/ci/pause", {"reason": "lunch"}, tok).status == 200
    return tok


# ---------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("kind", STORE_KINDS)
def test_round_trip_copies_the_log_and_the_state(kind, tmp_path):
    h = Harness(make_store(kind, tmp_path))
    tok = base_history(h)
    text = export(h, "ci")
    rows = [json.loads(x) for x in lines_of(text)]
    assert [int(r["id"]) for r in rows] == list(range(1, len(rows) + 1))
    out = h.service.import_log("ci-import", text)
    assert out["imported"] == len(rows) and out["from_monitor"] == "ci"
    assert MONITOR.is_valid(out["monitor"])
    new_tok = out["owner_token"]
    # the log: row for row the same, only the address changed
    again = [json.loads(x) for x in lines_of(export(h, "ci-import"))]
    assert again == [copied(r, "ci-import") for r in rows]
    a, b = state(h, "ci", tok), state(h, "ci-import", new_tok)
    for key in ("observations", "rejected", "acted"):
        assert a["counters"][key] == b["counters"][key], key
    assert a["counters"]["acted"] == 1 and a["counters"]["rejected"] == 1  # the history has both
    for key in ("head", "last", "live", "contradictions_open", "covers_until"):
        assert a[key] == b[key], key
    assert b["live"] == {"value": False, "reason": "paused"}  # the lifecycle came across
    assert b["counters"]["delivered"] == 0 and b["counters"]["subscriptions_active"] == 0  # none copied
    # and served the same way to a reader of the copy
    assert h.log("ci-import", new_tok)[: len(rows)] == again
    got = h.call("GET", "/monitors/ci-import", token=new_tok).body
    assert got["name"] == "CI runs" and got["version"] == 2 and got["owner"] == "human:you"
    assert got["types"] == TYPES and got["capabilities"] == ["observe", "act"]
    assert STATE.is_valid(b) and MONITOR.is_valid(got)
    # the copy is a monitor like any other: its token resumes it and it accepts publishes
    r = h.call("POST", "/monitors/ci-import/resume", {"reason": "back"}, new_tok)
    assert r.status == 200
    resumed = r.body["seq"]
    r = h.publish("ci-import", new_tok, subject="build-9", actor="probe:ci")
    assert r.status == 201 and r.body["seq"] == resumed + 1
    # the original token does not reach the copy
    assert h.call("POST", "/monitors/ci-import/pause", {"reason": "x"}, tok).status == 401


steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from(["probe:ci", "agent:bot", "human:you", "webhook:gh"])),
        st.tuples(st.just("refused"), st.sampled_from(["src", "stranger", "undeclared", "system"])),
        st.tuples(st.just("contradiction"), st.booleans()),
        st.tuples(st.just("config"), st.sampled_from(["update", "pause", "resume"])),
        st.tuples(st.just("reader"), st.integers(0, 2)),
        st.tuples(st.just("lease"), st.sampled_from(["complete", "release", "reject"])),
    ),
    min_size=0,
    max_size=25,
)


def play(h: Harness, tok: str, script: list[tuple[str, Any]]) -> None:
    readers: dict[int, tuple[str, str]] = {}
    for n, (op, arg) in enumerate(script, 1):
        if op == "publish":
            h.publish("ci", tok, subject=f"job-{n % 3}", actor=arg)
        elif op == "refused":
            body = {
                "src": {"actor": "agent:bot", "tier": "src"},
                "stranger": {"actor": "agent:bot", "on_behalf_of": "human:stranger"},
                "undeclared": {"type": "com.example.nope"},
                "system": {"actor": "system:me"},
            }[arg]
            assert h.publish("ci", tok, **body).status >= 400
        elif op == "contradiction":
            kind = "ai.mentu.monitor.contradiction" + ("_resolved" if arg else "")
            h.publish("ci", tok, type=kind, subject="job-0")
        elif op == "config":
            body = {"patch": {"description": f"v{n}"}} if arg == "update" else {"reason": arg}
            h.call("POST", f"/monitors/ci/{arg}", body, tok)
        elif op == "reader":
            if arg not in readers:
                readers[arg] = h.subscribe(
                    "ci", tok, subscriber=f"agent:reader-{arg}", capabilities=["observe", "act"]
                )
            sub, rt = readers[arg]
            r = h.pull(sub, rt, limit=3)
            if r.status == 200 and arg != 1:  # reader 1 never acks: it "crashes" with its batch
                h.ack(sub, rt, r.body["next"])
        elif op == "lease":
            sub, rt = readers.setdefault(
                0, h.subscribe("ci", tok, subscriber="agent:reader-0", capabilities=["observe", "act"])
            )
            r = h.call("POST", f"/subscriptions/{sub}/leases/claim", {"subject": "job-1"}, rt)
            if r.status in (200, 201):
                body = {"subject": "job-1", "outcome": "done"} if arg == "complete" else {"subject": "job-1"}
                h.call("POST", f"/subscriptions/{sub}/leases/{arg}", body, rt)
        h.clock.advance(1.5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_round_trip_over_random_histories(script):
    h = Harness(MemoryStore())
    tok = h.monitor("ci", types=TYPES, capabilities=["observe", "act"])
    h.publish("ci", tok, subject="job-1", actor="probe:ci")  # a subject the lease steps can claim
    play(h, tok, script)
    text = export(h, "ci")
    rows = [json.loads(x) for x in lines_of(text)]
    for row in rows:  # every exported line is a valid observation by the project's schema
        assert OBSERVATION.is_valid(row), list(OBSERVATION.iter_errors(row))[:1]
        assert importing.schema_error(importing.observation_schema(), row) is None
    checked = importing.check_log(text)
    assert checked.refused == [], checked.refused[:3]
    a = state(h, "ci", tok)
    out = h.service.import_log("copy", text)
    b = state(h, "copy", out["owner_token"])
    for key in ("observations", "rejected", "acted"):
        assert a["counters"][key] == b["counters"][key], key
    for key in ("head", "last", "live", "contradictions_open", "covers_until", "retention_floor"):
        assert a[key] == b[key], key
    assert b["counters"]["delivered"] == 0 and b["counters"]["subscriptions_active"] == 0
    gaps_a = [g for g in a["confidence"]["gaps"] if g != "no_subscribers"]
    gaps_b = [g for g in b["confidence"]["gaps"] if g != "no_subscribers"]
    assert gaps_a == gaps_b
    copy_rows = [json.loads(x) for x in lines_of(export(h, "copy"))]
    assert copy_rows == [copied(r, "copy") for r in rows]
    for row in copy_rows:
        assert OBSERVATION.is_valid(row)
    # a copy of the copy is the same log again (the mapping composes)
    out2 = h.service.import_log("copy-2", export(h, "copy"))
    assert [json.loads(x) for x in lines_of(export(h, "copy-2"))] == [copied(r, "copy-2") for r in rows]
    assert state(h, "copy-2", out2["owner_token"])["counters"] == b["counters"]


# ---------------------------------------------------------------------------------------------- refusals
def _bump(row: dict[str, Any], seq: int) -> dict[str, Any]:
    row = copy.deepcopy(row)
    row["id"], row["sequence"] = str(seq), f"{seq:020d}"
    return row


def _published(rows):
    return next(i for i, r in enumerate(rows) if not r["type"].startswith("ai.mentu.monitor."))


def m_not_json(rows, lines):
    lines[2] = '{"specversion": "1.0", '
    return 3, "Not JSON"


def m_not_object(rows, lines):
    lines[2] = "[1, 2, 3]"
    return 3, "one JSON object"


def m_nan(rows, lines):
    lines[2] = lines[2].replace('"data":{', '"data":{"x":NaN,', 1)
    return 3, "Not JSON"


def m_schema_vocab(rows, lines):
    rows[2]["tier"] = "certain"
    return 3, "schemas/observation.json"


def m_schema_missing(rows, lines):
    del rows[2]["data"]["provenance"]
    return 3, "'provenance' is a required property"


def m_sequence(rows, lines):
    rows[2]["sequence"] = f"{99:020d}"
    return 3, "name different seqs"


def m_envelope(rows, lines):
    i = _published(rows)
    rows[i]["tier"] = "src"  # the provenance inside still says otherwise
    return i + 1, "disagrees with data.provenance.tier"


def m_source(rows, lines):
    rows[3]["source"] = "monitor:elsewhere"
    return 4, "a file holds one monitor's log"


def m_out_of_order(rows, lines):
    lines[2], lines[3] = lines[3], lines[2]
    return 3, "the line(s) in between are missing"  # seq 4 after 2; then seq 3 after 4:


def m_backwards(rows, lines):
    rows[3] = _bump(rows[3], 2)
    return 4, "strictly increasing"


def m_gap(rows, lines):
    del lines[3]  # seq 4: the file's line 4 now holds seq 5
    return 4, "missing"


def m_not_from_one(rows, lines):
    del lines[0]
    return 1, "starts at seq 2, not 1"


def m_first_not_create(rows, lines):
    rows[0]["data"]["payload"]["action"] = "update"
    return 1, "action create"


def m_second_create(rows, lines):
    first = _bump(rows[0], len(rows) + 1)
    lines.append(json.dumps(first))
    return len(rows) + 1, "created once"


def m_unknown_protocol_type(rows, lines):
    rows[1]["type"] = "ai.mentu.monitor.teleported"
    return 2, "not a type the protocol writes"


def m_protocol_row_not_server(rows, lines):
    i = next(i for i, r in enumerate(rows) if i and r["type"] == "ai.mentu.monitor.rejected")
    row = rows[i]  # a protocol row claiming an agent's origin, consistently inside and out
    row["origin"] = row["data"]["provenance"]["origin"] = "agent"
    return i + 1, "server's measurement"


def m_lifecycle(rows, lines):
    last = rows[-1]  # the pause; a retire and then a resume: a retired monitor takes no action
    retire = _bump(last, len(rows) + 1)
    retire["data"]["payload"]["action"] = "retire"
    resume = _bump(last, len(rows) + 2)
    resume["data"]["payload"]["action"] = "resume"
    lines.extend([json.dumps(retire), json.dumps(resume)])
    return len(rows) + 2, "retired monitor cannot be 'resume'd"


def m_published_while_paused(rows, lines):
    late = _bump(rows[_published(rows)], len(rows) + 1)  # after the pause
    lines.append(json.dumps(late))
    return len(rows) + 1, "was paused here"


def m_undeclared(rows, lines):
    rows[_published(rows)]["type"] = "com.example.nope"
    return _published(rows) + 1, "not declared"


def m_ceiling(rows, lines):
    i = _published(rows)
    row = rows[i]  # a machine claiming a person's certainty, told consistently: still refused
    prov = row["data"]["provenance"]
    row["actor"] = prov["actor"] = prov["wasAttributedTo"] = "agent:bot"
    row["origin"] = prov["origin"] = "human"
    row["tier"] = prov["tier"] = "src"
    return i + 1, "could not have made this claim (PROVENANCE_CEILING)"


def m_after_owner(rows, lines):
    i = next(i for i, r in enumerate(rows) if i and r["type"] == "ai.mentu.monitor.configured")
    rows[i]["data"]["payload"]["after"]["owner"] = "human:mallory"
    return i + 1, "differs from the creating owner"


def m_bad_definition(rows, lines):
    rows[0]["data"]["payload"]["after"]["horizon"] = "century"
    return 1, "definition in after is not valid"


def _row_of(rows, kind, action=None):
    return next(
        i for i, r in enumerate(rows)
        if r["type"] == kind and (action is None or r["data"]["payload"].get("action") == action)
    )  # fmt: skip


# ---- R10: the publish a published row stands for passes the publish path's own checks (issue 25)
def m_future_time(rows, lines):
    rows[_published(rows)]["time"] = "9999-12-31T00:00:00.000Z"  # the monitor would look fresh forever
    return _published(rows) + 1, "ahead of the server's clock"


def m_long_subject(rows, lines):
    rows[_published(rows)]["subject"] = "s" * 100_000
    return _published(rows) + 1, "subject is 100000 characters long; at most 256"


def m_long_type(rows, lines):
    rows[_published(rows)]["type"] = "com.example." + "t" * 5000
    return _published(rows) + 1, "at most 256"


def m_big_payload(rows, lines):
    rows[_published(rows)]["data"]["blob"] = "z" * (2 << 20)  # 2 MiB, more than any publish body
    return _published(rows) + 1, "at most 1048576 bytes"


def m_reserved_data(rows, lines):
    i = _published(rows)
    rows[i]["data"]["payload"] = {"action": "complete"}  # harmless as data, but check nested shapes too
    rows[i]["data"]["tags"] = ["not", "an", "object"]
    return i + 1, "schemas/observation.json"


# ---- R11: a protocol row claims only what the server writes
def m_laundered_lease(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.lease", "complete")
    row = rows[i]  # origin system and consistent inside and out, yet acting for a person: no request does
    prov = row["data"]["provenance"]
    row["actor"] = prov["actor"] = "human:bob"
    prov["on_behalf_of"] = prov["wasAttributedTo"] = "human:carol"
    return i + 1, "acts for nobody and cites nothing, but this one claims on_behalf_of"


def m_protocol_reference(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.subscribed")
    rows[i]["data"]["provenance"]["wasDerivedFrom"] = [{"source": "monitor:ci", "id": "2"}]
    return i + 1, "claims wasDerivedFrom"


def m_protocol_year_one(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.rejected")
    rows[i]["time"] = "0001-01-01T00:00:00.000Z"
    return i + 1, "before 1970"


def m_protocol_future(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.lease", "claim")
    rows[i]["time"] = "9999-12-31T00:00:00.000Z"
    return i + 1, "in the future"


def m_created_year_one(rows, lines):
    rows[0]["data"]["payload"]["after"]["created"] = "0001-01-01T00:00:00.000Z"
    return 1, "after.created 0001-01-01T00:00:00.000Z is not a time the server's clock could have written"


def m_protocol_long_subject(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.lease", "claim")
    rows[i]["subject"] = "s" * 100_000
    return i + 1, "at most 256"


def m_protocol_huge(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.rejected")
    rows[i]["data"]["payload"]["reason"] = "r" * 20_000
    return i + 1, "the server writes none over 16384"


def m_protocol_tags(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.subscribed")
    rows[i]["data"]["tags"]["approved_by"] = "human:ceo"
    return i + 1, "data.tags is"


def m_configured_actor(rows, lines):
    i = next(i for i, r in enumerate(rows) if i and r["type"] == "ai.mentu.monitor.configured")
    row = rows[i]
    row["actor"] = row["data"]["provenance"]["actor"] = row["data"]["provenance"]["wasAttributedTo"] = (
        "human:eve"
    )
    return i + 1, "written as the monitor's owner"


def m_rejected_actor(rows, lines):
    i = _row_of(rows, "ai.mentu.monitor.rejected")
    row = rows[i]
    row["actor"] = row["data"]["provenance"]["actor"] = row["data"]["provenance"]["wasAttributedTo"] = (
        "human:you"
    )
    return i + 1, "system:guard"


# ---- R12: no attested claim without the registration token
def m_attested(rows, lines):
    rows[_published(rows)]["data"]["provenance"]["attested"] = True
    return _published(rows) + 1, "claims attested: true"


MUTATIONS = [
    m_not_json, m_not_object, m_nan, m_schema_vocab, m_schema_missing, m_sequence, m_envelope, m_source,
    m_out_of_order, m_backwards, m_gap, m_not_from_one, m_first_not_create, m_second_create,
    m_unknown_protocol_type, m_protocol_row_not_server, m_lifecycle, m_published_while_paused,
    m_undeclared, m_ceiling, m_after_owner, m_bad_definition,
    m_future_time, m_long_subject, m_long_type, m_big_payload, m_reserved_data, m_laundered_lease,
    m_protocol_reference, m_protocol_year_one, m_protocol_future, m_created_year_one,
    m_protocol_long_subject, m_protocol_huge, m_protocol_tags, m_configured_actor, m_rejected_actor,
    m_attested,
]  # fmt: skip


@pytest.fixture
def original():
    h = Harness(MemoryStore())
    base_history(h)
    return h, export(h, "ci")


def test_the_unchanged_log_imports(original):
    """The positive control of every refusal below: the same file, unmutated, is accepted."""
    h, text = original
    assert importing.check_log(text).refused == []
    assert h.service.import_log("ci-copy", text)["imported"] == len(lines_of(text))


@pytest.mark.parametrize("mutate", MUTATIONS, ids=lambda f: f.__name__[2:])
def test_each_refusal_rule(original, mutate):
    h, text = original
    rows = [json.loads(x) for x in lines_of(text)]
    lines = lines_of(text)
    before = copy.deepcopy(rows)
    line, reason = mutate(rows, lines)
    for i, (old, new) in enumerate(zip(before, rows, strict=True)):  # a row mutation is re-encoded
        if old != new:
            lines[i] = json.dumps(new)
    err = refusal(h, "ci-copy", "\n".join(lines) + "\n")
    assert err.code == "INVALID" and err.status == 400
    assert "nothing was imported" in err.message
    listed = {x["line"]: x["reason"] for x in err.extras["refused"]}
    assert line in listed, (line, listed)
    assert reason in listed[line], listed[line]
    assert err.extras["refused_count"] == len(err.extras["refused"])
    # the page's preview says the same without writing anything
    assert importing.check_log("\n".join(lines), now=h.clock()).refused == err.extras["refused"]


def test_a_bad_last_line_imports_nothing(original):
    h, text = original
    err = refusal(h, "ci-copy", text + "not json at all\n")
    assert err.extras["refused"] == [
        {"line": len(lines_of(text)) + 1, "reason": err.extras["refused"][0]["reason"]}
    ]
    assert err.extras["accepted"] == len(lines_of(text))
    assert [m.id for m in h.store.list_monitors()] == ["ci"]


def test_a_line_nested_past_the_parser_is_refused_not_a_crash(original):
    h, text = original
    deep = "[" * 5000 + "]" * 5000  # past JSON's 32 levels, and past Python's own recursion limit
    err = refusal(h, "ci-copy", text + deep + "\n")
    assert [x["line"] for x in err.extras["refused"]] == [len(lines_of(text)) + 1]
    assert "deep" in err.extras["refused"][0]["reason"] or "nest" in err.extras["refused"][0]["reason"]
    assert [m.id for m in h.store.list_monitors()] == ["ci"]
    # the page's own check first (EngineHost.check_log): the refused line listed, not an exception
    pre = EngineHost(MemoryStore()).check_log(text + deep)
    assert not pre.body["ok"] and pre.body["refused"][-1]["line"] == len(lines_of(text)) + 1


def test_every_refused_line_is_listed_not_only_the_first(original):
    h, text = original
    lines = lines_of(text)
    lines[1] = "x"
    lines[4] = "[]"
    err = refusal(h, "ci-copy", "\n".join(lines))
    assert [x["line"] for x in err.extras["refused"]] == [2, 5]


def test_blank_lines_are_skipped_and_counted(original):
    h, text = original
    lines = lines_of(text)
    spaced = "\n\n".join(lines)  # line numbers as in the file: 1, 3, 5, ...
    assert h.service.import_log("ci-copy", spaced)["imported"] == len(lines)
    broken = spaced.split("\n")
    broken[4] = "{"
    err = refusal(h, "ci-2", "\n".join(broken))
    assert [x["line"] for x in err.extras["refused"]] == [5]


def test_an_empty_file_is_refused(original):
    h, _ = original
    err = refusal(h, "ci-copy", "\n \n")
    assert err.code == "INVALID" and "no observation" in err.extras["refused"][0]["reason"]


def test_duplicate_id_is_refused_and_the_existing_monitor_untouched(original):
    h, text = original
    before = export(h, "ci")
    with pytest.raises(ProtocolError) as info:
        h.service.import_log("ci", text)
    assert info.value.code == "DUPLICATE" and info.value.status == 409
    assert export(h, "ci") == before
    assert h.service.import_log("ci-2", text)["monitor"]["id"] == "ci-2"  # positive control


def test_bad_new_id_is_refused(original):
    h, text = original
    for bad in ("x", "a b", "", None, "é" * 70):
        with pytest.raises(ProtocolError) as info:
            h.service.import_log(bad, text)
        assert info.value.code == "INVALID"


def test_size_bounds(original, monkeypatch):
    h, text = original
    pad = importing.MAX_IMPORT_BYTES - len(text.encode())
    assert pad > 0
    assert h.service.import_log("just-under", text + "\n" * pad)["imported"] == len(lines_of(text))
    with pytest.raises(ProtocolError) as info:
        h.service.import_log("over", text + "\n" * (pad + 1))
    assert info.value.code == "TOO_LARGE" and info.value.status == 413
    assert h.store.get_monitor("over") is None
    with pytest.raises(ProtocolError) as info:
        h.service.import_log("over", (text + "\n" * (pad + 1)).encode())
    assert info.value.code == "TOO_LARGE"
    n = len(lines_of(text))
    monkeypatch.setattr(importing, "MAX_IMPORT_LINES", n)
    assert h.service.import_log("at-limit", text)["imported"] == n
    with pytest.raises(ProtocolError) as info:
        h.service.import_log("over", text + "{}\n")
    assert info.value.code == "TOO_LARGE" and "at most" in info.value.message


def test_not_utf8_is_refused(original):
    h, text = original
    with pytest.raises(ProtocolError) as info:
        h.service.import_log("ci-copy", text.encode() + b"\xff\xfe\n")
    assert info.value.code == "INVALID" and "UTF-8" in info.value.message
    assert h.service.import_log("ci-copy", text.encode())["imported"] > 0  # bytes are fine otherwise


def test_registration_token_gates_import_and_attests():
    h = Harness(MemoryStore(), registration_token="reg-secret")
    tok = h.call("POST", "/monitors", {"id": "ci", "types": TYPES}, "reg-secret").body["owner_token"]
    h.publish("ci", tok, actor="probe:ci")
    text = export(h, "ci")
    with pytest.raises(ProtocolError) as info:
        h.service.import_log("copy", text)
    assert info.value.code == "UNAUTHORIZED"
    out = h.service.import_log("copy", text, token="reg-secret")
    assert out["monitor"]["attested"] is True


def test_shared_monitor_gets_a_fresh_subscribe_token():
    h = Harness(MemoryStore())
    r = h.call("POST", "/monitors", {"id": "ci", "visibility": "shared", "owner": "human:you"})
    text = export(h, "ci")
    out = h.service.import_log("copy", text)
    assert out["subscribe_token"] and out["subscribe_token"] != r.body["subscribe_token"]
    r = h.call("POST", "/subscriptions", {"monitor": "copy", "subscriber": "agent:x"}, out["subscribe_token"])
    assert r.status == 201, r.body


def test_rows_given_as_events_and_redelivered_marks(original):
    """A list of events (what pulls return) imports too; `redelivered` is a delivery mark and is dropped."""
    h, text = original
    rows = [json.loads(x) for x in lines_of(text)]
    rows[2]["redelivered"] = True
    h.service.import_log("ci-copy", rows)
    assert "redelivered" not in h.service.export_log("ci-copy")[2]


# ---------------------------------------------------------------------------------------------- schema
def test_the_engine_schema_check_agrees_with_jsonschema(original):
    """R3 in the engine (no jsonschema on the engine's path) gives the same verdict as jsonschema over the
    project's schema, for every exported row and for rows broken in each way the schema forbids."""
    _, text = original
    schema = importing.observation_schema()
    rows = [json.loads(x) for x in lines_of(text)]
    broken: list[dict[str, Any]] = []
    for row in rows[:3]:
        for path, value in [
            (("specversion",), "0.3"),
            (("id",), "04"),
            (("id",), 4),
            (("source",), "ci"),
            (("type",), "CI.Run"),
            (("time",), "2026-09-22 17:10:11Z"),
            (("time",), "2026-13-45T17:10:11.188Z"),
            (("sequence",), "4"),
            (("origin",), "robot"),
            (("verified",), None),
            (("actor",), "has space"),
            (("data", "provenance", "wasDerivedFrom"), [{"source": "x"}]),
            (("data", "provenance", "on_behalf_of"), 7),
            (("data", "tags"), []),
            (("data",), "text"),
        ]:
            bad = copy.deepcopy(row)
            target = bad
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            broken.append(bad)
        for key in ("specversion", "time", "data", "horizon"):
            bad = copy.deepcopy(row)
            del bad[key]
            broken.append(bad)
    for row in rows:
        assert OBSERVATION.is_valid(row) and importing.schema_error(schema, row) is None
    for row in broken:
        assert not OBSERVATION.is_valid(row), row
        assert importing.schema_error(schema, row) is not None, row


def test_an_unknown_schema_keyword_is_a_bug_not_a_pass():
    with pytest.raises(ValueError, match="not supported"):
        importing.schema_error({"minLength": 3}, "ab")
    assert importing.schema_error({"type": "string"}, "ab") is None  # control


# ---------------------------------------------------------------------------------------------- the page's door
def test_engine_host_export_check_and_import():
    host = EngineHost(MemoryStore(), clock=lambda: 1_790_000_000.0)

    async def run() -> None:
        r = await host.call("POST", "/monitors", {"id": "ci", "owner": "human:you"})
        tok = r.body["owner_token"]
        await host.call("POST", "/monitors/ci/observations", {"type": "com.example.ci.run"}, tok)
        exp = await host.export_log("ci")
        assert exp.status == 200 and exp.body["name"] == "ci-20260921T141320Z.jsonl"
        assert exp.body["lines"] == 2 and len(lines_of(exp.body["text"])) == 2
        assert (await host.export_log("nope")).status == 404
        pre = host.check_log(exp.body["text"])
        assert pre.status == 200 and pre.body["ok"] and pre.body["accepted"] == 2
        bad = host.check_log(exp.body["text"] + "oops\n")
        assert not bad.body["ok"] and bad.body["refused"][0]["line"] == 3
        assert (await host.import_log("ci-2", exp.body["text"] + "oops\n")).status == 400
        assert (await host.call("GET", "/monitors/ci-2")).status == 404
        done = await host.import_log("ci-2", exp.body["text"])
        assert done.status == 201 and done.body["owner_token"]
        got = await host.call("GET", "/monitors/ci-2", token=done.body["owner_token"])
        assert got.status == 200 and got.body["head"] == 2
        assert (await host.import_log("ci-2", exp.body["text"])).body["code"] == "DUPLICATE"

    asyncio.run(run())


# ---------------------------------------------------------------------------------------------- limits (issue 25)
def test_what_a_publish_accepts_imports_and_freshness_is_the_servers():
    """The positive controls of the time and size refusals: a publish at the edge of each limit (a time
    just under 300 s ahead, a year-0001 time, which a publish takes as its claim, a 256-character subject,
    a payload near 1 MiB) is copied; and the copy's freshness is the server's clock as the log shows it:
    a publisher's old `time` does not make the copy stale (the row came after the server wrote the one
    before it, so that is when, at the earliest, the server received it)."""
    h = Harness(MemoryStore())
    tok = h.monitor("ci", types=TYPES)
    ahead = importing.timefmt.iso(h.clock() + 299)
    assert h.publish("ci", tok, subject="s" * 256, actor="probe:ci", time=ahead).status == 201
    assert h.publish("ci", tok, actor="probe:ci", data={"blob": "z" * 1_000_000}).status == 201
    h.clock.advance(60)
    h.subscribe("ci", tok, subscriber="agent:reader")  # a protocol row: the server's clock, in the log
    assert h.publish("ci", tok, actor="probe:ci", time="0001-01-01T00:00:00Z").status == 201
    text = export(h, "ci")
    out = h.service.import_log("copy", text)
    assert out["imported"] == len(lines_of(text))
    a, b = state(h, "ci", tok), state(h, "copy", out["owner_token"])
    assert b["last"] == a["last"] and b["covers_until"] == a["covers_until"], (a["last"], b["last"])
    assert b["live"] == a["live"]


def test_the_issue_25_file_is_refused_line_by_line(original):
    """The edited export of the issue: every laundered or oversized row listed with its reason; nothing
    imported."""
    h, text = original
    rows = [json.loads(x) for x in lines_of(text)]
    expected = {}
    for mutate in (m_future_time, m_long_subject, m_laundered_lease, m_protocol_year_one):
        line, reason = mutate(rows, [])
        expected[line] = reason
    refused = {
        x["line"]: x["reason"] for x in refusal(h, "ci-copy", [json.dumps(r) for r in rows]).extras["refused"]
    }
    assert set(refused) == set(expected), refused
    for line, reason in expected.items():
        assert reason in refused[line], (line, refused[line])


def test_checking_in_chunks_is_the_same_check(original):
    """LogCheck (what the playground feeds a chunk at a time) decides exactly as check_log."""
    _, text = original
    lines = lines_of(text)
    lines[3] = "not json"
    broken = "\n".join(lines)
    whole = importing.check_log(broken)
    step = importing.LogCheck()
    items = importing.split_lines(broken)
    for start in range(0, len(items), 2):
        step.feed(items[start : start + 2])
    parts = step.result()
    assert parts.refused == whole.refused and [n for n, _ in parts.rows] == [n for n, _ in whole.rows]
    ok = importing.LogCheck()
    ok.feed(importing.split_lines(text))
    assert ok.result().ok and ok.result().after == importing.check_log(text).after  # positive control


def test_an_attested_import_may_copy_attested_rows():
    h = Harness(MemoryStore(), registration_token="reg-secret")
    tok = h.call("POST", "/monitors", {"id": "ci", "types": TYPES}, "reg-secret").body["owner_token"]
    h.publish("ci", tok, actor="probe:ci")
    text = export(h, "ci")
    assert json.loads(lines_of(text)[1])["data"]["provenance"]["attested"] is True
    refused = importing.check_log(text, attested=False).refused
    assert refused and "claims attested: true" in refused[0]["reason"]
    assert importing.check_log(text, attested=True).refused == []


def test_a_log_checked_in_chunks_is_written_as_it_was_checked(original):
    """The playground checks a file with LogCheck (a chunk at a time) and hands the result to the import,
    which writes it without walking it again: the same copy as from the text. A result judged at a later
    clock than the import's, or for an import attested otherwise, is checked again, never trusted."""
    h, text = original
    step = importing.LogCheck(now=h.clock())
    step.feed(importing.split_lines(text))
    out = h.service.import_log("from-chunks", step.result())
    assert out["imported"] == len(lines_of(text))
    again = [json.loads(x) for x in lines_of(export(h, "from-chunks"))]
    assert again == [copied(json.loads(x), "from-chunks") for x in lines_of(text)]
    rows = [json.loads(x) for x in lines_of(text)]
    i = _published(rows)
    rows[i]["time"] = importing.timefmt.iso(h.clock() + 5000)  # ahead of the import's clock
    later = importing.check_log([json.dumps(r) for r in rows], now=h.clock() + 10_000)
    assert later.ok  # at that clock the row was fine
    err = refusal(h, "from-later", later)
    assert [x["line"] for x in err.extras["refused"]] == [i + 1]
    assert "ahead of the server's clock" in err.extras["refused"][0]["reason"]


def test_nesting_is_judged_before_parsing():
    """nests_too_deep (what the import and the page's Server console check before parsing: on Pyodide the
    parser's recursion overflows the WebAssembly stack first) agrees with the 32-level rule."""
    deep = wire.nests_too_deep
    assert not deep(b"[" * 32 + b"]" * 32)  # the limit itself is fine
    assert deep(b"[" * 33 + b"]" * 33)
    assert deep(b"[" * 100_000 + b"]" * 100_000)
    assert deep(b"{" * 40)  # brackets that never close
    assert not deep(b'{"a": "' + b"[" * 100 + b'"}')  # brackets inside a string are text
    assert not deep(b'{"a": "\\"' + b"[" * 100 + b'"}')  # an escaped quote does not end the string
    assert not deep(json.dumps({"rows": [{"x": [1, {"y": [2]}]} for _ in range(500)]}).encode())
    refused = importing.check_log("[" * 100_000 + "]" * 100_000).refused
    assert refused[0]["line"] == 1 and "nests deeper than 32 levels" in refused[0]["reason"]
