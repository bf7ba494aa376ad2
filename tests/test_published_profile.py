"""The published profile judges another implementation only by what is published (issue 24), shown without
another implementation: `conformance_variant.VariantTransport` is this project's engine behind a thin
transport that behaves as another conformant server legitimately may (seqs numbered across monitors,
cursor 0 below its floor, filter types checked against the declared ones, a text cursor read as a number,
the refused value named in the sentence, a re-sent ack answering the current head).

- the published profile passes against that variant, every behaviour at once and each alone, in-process
  (and over real HTTP through `mp conform --base`, in tests/test_conform_http.py);
- each behaviour fails the project check that states this project's choice (positive control: the
  variant's difference is real, and the project profile still holds this server to its choice);
- with every switch off the variant is the engine itself and the whole suite passes (the wrapper adds
  nothing of its own);
- a variant that really breaks a published rule fails the published check named after that rule, and
  the failure's note names the rule (docs/protocol.md section, principle)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conformance_variant import BEHAVIOURS, BREAKS, VariantTransport
from monitor_protocol.conformance import checks_in, run_suite

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-schemas"
# CI has ../shared beside the clone; a bare clone does not, and then only C29 (which validates against the
# published schemas and nothing else) is skipped, saying so.
HAVE_REFERENCE = REFERENCE.is_dir()
SCHEMAS = REFERENCE if HAVE_REFERENCE else None
PUBLISHED_SKIPS = set() if HAVE_REFERENCE else {"C29"}

# the variant's behaviour -> the project check that states this project's choice instead
PROJECT_CHOICE = {
    "global_seqs": "X42",
    "cursor_floor": "X48",
    "declared_types": "X49",
    "text_cursor": "X50",
    "vocab_in_error": "X51",
    "ack_current": "X52",
    "retired_closed": "X60",
    "time_offset": "X53",
    "raw_text": "X55",
    "negative_backwards": "X59",
    "cursor_one": "X48",
}
# a real break of a published rule -> the published check named after it, and words of its rule
BROKEN = {
    "ack_backwards": ("C06", "P4; docs/protocol.md section 8"),
    "dead_text_cursor": ("C27", "docs/protocol.md section 8 (Ack: the cursor is an integer"),
    "pull_commits": ("C05", "P4; docs/protocol.md section 8 (pull never commits"),
    "filtered_head": ("C07", "P5; docs/protocol.md section 8 (Head and lag"),
    "tokenless_writes": ("C23", "docs/protocol.md section 5 (Auth failures"),
    "disjoint_empty": ("C08", "P12; docs/protocol.md section 8 (Inline filter"),
    "no_subscriber": ("C29", "docs/protocol.md, its opening"),
}
# C29 judges only with the published schemas: without them (a bare clone) it is skipped, not failed
NEEDS_REFERENCE = {"no_subscriber"}


def _not_passed(report, allowed: set[str] = frozenset()) -> list[str]:
    return [
        f"{r.id} {r.status}: {r.note}" for r in report.results if r.status != "pass" and r.id not in allowed
    ]


def test_the_tables_cover_every_switch_of_the_variant():
    assert set(PROJECT_CHOICE) == set(BEHAVIOURS)
    assert set(BROKEN) == set(BREAKS)


async def test_the_published_profile_passes_against_the_variant():
    report = await run_suite(VariantTransport(), profile="published", reference_schema_dir=SCHEMAS)
    assert not _not_passed(report, PUBLISHED_SKIPS), "\n".join(_not_passed(report, PUBLISHED_SKIPS))
    assert {r.id for r in report.results if r.status == "skip"} == PUBLISHED_SKIPS
    if HAVE_REFERENCE:  # the variant's objects were judged by the published schemas, and only by them
        assert set(report.result("C29").data["validated"]) == {"published"}


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
async def test_each_variant_behaviour_passes_published_and_fails_the_project_choice(behaviour):
    variant = VariantTransport([behaviour])
    published = await run_suite(variant, profile="published", reference_schema_dir=SCHEMAS)
    assert not _not_passed(published, PUBLISHED_SKIPS), "\n".join(_not_passed(published, PUBLISHED_SKIPS))
    cid = PROJECT_CHOICE[behaviour]
    choice = (await run_suite(VariantTransport([behaviour]), only=cid, profile="project")).result(cid)
    assert choice.status == "fail", f"{behaviour} did not fail {cid}: {choice.note}"
    assert "[rule: this project's choice" in choice.note, choice.note


async def test_the_variant_with_every_switch_off_is_the_engine_itself():
    """Positive control for the fixture: the failures above come from the switch, not from the wrapper."""
    report = await run_suite(VariantTransport(behaviours=()), reference_schema_dir=SCHEMAS)
    allowed = {"X40"} | PUBLISHED_SKIPS  # X40 needs a real request line
    assert not _not_passed(report, allowed), "\n".join(_not_passed(report, allowed))
    assert all(report.result(cid).status == "pass" for cid in PROJECT_CHOICE.values())


@pytest.mark.parametrize("broken", sorted(BREAKS))
async def test_a_variant_that_breaks_a_published_rule_fails_the_check_named_after_it(broken):
    if broken in NEEDS_REFERENCE and not HAVE_REFERENCE:
        pytest.skip(f"C29 judges {broken} by the published reference schemas, not at {REFERENCE}")
    cid, rule = BROKEN[broken]
    report = await run_suite(
        VariantTransport(breaks=[broken]), profile="published", reference_schema_dir=SCHEMAS
    )
    result = report.result(cid)
    assert result.status == "fail", f"{broken} passed {cid}: {result.note}"
    assert f"[rule: {rule}" in result.note, result.note
    assert not report.ok


def test_every_published_check_names_the_rule_it_rests_on():
    for c in checks_in("published"):
        assert re.search(r"docs/protocol\.md|\bP\d+\b", c.rule), f"{c.id} rests on {c.rule!r}"
    choices = [c for c in checks_in("project") if c.id in PROJECT_CHOICE.values()]
    assert len(choices) == len(set(PROJECT_CHOICE.values()))
    assert all(c.rule.startswith("this project's choice") for c in choices)


async def test_c29_never_judges_by_the_project_schemas_and_says_so_without_published_ones():
    report = await run_suite(VariantTransport(), only="C29", profile="published")
    c29 = report.result("C29")
    assert c29.status == "skip" and "--schemas" in c29.note and "own schemas" in c29.note, c29.note
    assert c29.data == {"validated": {}}


@pytest.mark.skipif(not HAVE_REFERENCE, reason=f"the published reference schemas are not at {REFERENCE}")
async def test_c29_uses_the_published_schemas_and_x53_the_stricter_project_ones():
    from monitor_protocol.core.schemas import errors_of, schema_dir

    report = await run_suite(VariantTransport(behaviours=()), only="C29,X53", reference_schema_dir=SCHEMAS)
    assert report.result("C29").status == "pass" and report.result("X53").status == "pass"
    assert set(report.result("C29").data["validated"]) == {"published"}
    assert set(report.result("X53").data["validated"]) == {"project"}
    # why C29 must not use the project's schemas: an observation another server may serve (no
    # data.provenance.on_behalf_of) is valid by the published schema and not by this project's
    variant = VariantTransport()
    created = await variant.request("POST", "/monitors", body={"id": "schema-probe"})
    token = created.body["owner_token"]
    obs = await variant.request(
        "POST", "/monitors/schema-probe/observations", body={"type": "a.b"}, token=token
    )
    served = obs.body["observation"]
    del served["data"]["provenance"]["on_behalf_of"]
    assert errors_of("observation", served, REFERENCE) == []
    assert any("on_behalf_of" in e for e in errors_of("observation", served, schema_dir()))


def test_c29_judges_objects_by_where_they_are_served_not_by_the_keys_they_carry():
    """A lease row's payload that happens to hold `holder` and `lease_duration_seconds` is a payload, not a
    Lease (section 7 leaves payloads open); a `subscription` member missing `subscriber` is still a
    Subscription to judge; discover's `capabilities.leases` is no Lease. Control: a lease member is one."""
    from monitor_protocol.conformance.checks.base import Seen, classify, kind_of_route, named_route

    row = {
        "specversion": "1.0",
        "id": "7",
        "type": "ai.mentu.monitor.lease",
        "data": {"payload": {"action": "claim", "holder": "sub:sub-1", "lease_duration_seconds": 60}},
    }
    seen = Seen()
    classify({"observations": [row]}, seen, None, True)
    assert set(seen.by_kind()) == {"observation"}
    seen = Seen()  # a publisher's own data that looks like a configured row's `after` is data
    classify(
        {"observation": {**row, "type": "com.example.x", "data": {"payload": {"after": {"k": 1}}}}},
        seen,
        None,
        True,
    )
    assert set(seen.by_kind()) == {"observation"}
    seen = Seen()  # control: a configured row's `after` is the Monitor
    configured = {**row, "type": "ai.mentu.monitor.configured", "data": {"payload": {"after": {"id": "m"}}}}
    classify({"observations": [configured]}, seen, None, True)
    assert seen.by_kind()["monitor"] == [{"id": "m"}]
    seen = Seen()  # recognised by where it is served, not by keys it may lack (no cursor, no subscriber)
    classify({"subscription": {"id": "sub-00ff00ff"}, "token": "t"}, seen, None, True)
    assert seen.by_kind() == {"subscription": [{"id": "sub-00ff00ff"}]}
    seen = Seen()  # a served object's own extra member is not a served object
    listed = {"id": "m", "horizon": "event", "capabilities": [], "visibility": "public", "owner": "agent:o"}
    classify({"monitors": [{**listed, "state": {"live": True}}]}, seen, None, True)
    assert set(seen.by_kind()) == {"monitor"}
    seen = Seen()
    assert not named_route("/discover")
    classify({"capabilities": {"leases": {"delivery_count_limit": 5}}}, seen, None, named_route("/discover"))
    assert seen.by_kind() == {}
    seen = Seen()
    lease = {"subject": "job-1", "holder": "sub:sub-1"}
    classify({"lease": lease, "expires": "x"}, seen, None, named_route("/subscriptions/sub-1/leases/claim"))
    assert seen.by_kind() == {"lease": [lease]}
    assert kind_of_route("GET", "/monitors/m1") == "monitor"
    assert kind_of_route("GET", "/monitors/m1/state") == "state"
    assert kind_of_route("POST", "/monitors/m1/pause") is None
