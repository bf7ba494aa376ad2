"""The project's JSON Schemas: valid 2020-12 schemas, wired by $id, and they accept and refuse what the
protocol says (docs/protocol.md sections 3-4)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from monitor_protocol.core.schemas import (
    SCHEMA_BASE,
    SCHEMA_NAMES,
    errors_of,
    load_schemas,
    schema_dir,
    validator,
)

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-schemas"

PROV = {
    "origin": "probe",
    "tier": "measured",
    "verification": "machine_verified",
    "actor": "probe:ci",
    "on_behalf_of": None,
    "attested": False,
    "source_ref": "build-412",
    "rule": None,
    "wasDerivedFrom": [],
    "wasAttributedTo": "probe:ci",
    "supersedes": None,
}
OBSERVATION = {
    "specversion": "1.0",
    "id": "4",
    "source": "monitor:ci",
    "type": "com.example.ci.run",
    "subject": "build-412",
    "time": "2026-09-22T17:10:11.188Z",
    "datacontenttype": "application/json",
    "sequence": "00000000000000000004",
    "tier": "measured",
    "origin": "probe",
    "verified": "machine_verified",
    "horizon": "minute",
    "actor": "probe:ci",
    "data": {"status": "failed", "tags": {}, "provenance": PROV},
}
MONITOR = {
    "id": "ci",
    "name": "ci",
    "description": None,
    "version": 1,
    "owner": "agent:owner",
    "source": {"kind": "log"},
    "filter": {},
    "horizon": "event",
    "capabilities": ["observe"],
    "cadence": {"event_driven": True},
    "ttl_seconds": None,
    "retire_after_mute_seconds": None,
    "budget": None,
    "visibility": "private",
    "rules": [],
    "types": [],
    "attested": False,
    "default_grant": ["observe"],
    "limits": {},
    "created": "2026-09-22T17:10:11.188Z",
    "updated": "2026-09-22T17:10:11.188Z",
    "active": True,
    "head": 0,
}
SUBSCRIPTION = {
    "id": "sub-0a1b2c3d",
    "monitor": "ci",
    "subscriber": "agent:reader",
    "filter": {"types": ["com.example.ci.*"], "#env": ["prod"]},
    "capabilities": ["observe"],
    "cursor": 0,
    "reset_policy": "none",
    "protocol": "pull",
    "sink": None,
    "retire_after_mute_seconds": 604800,
    "created": "2026-09-22T17:10:11.188Z",
    "last_pull": None,
    "active": True,
    "lag": 3,
}
LEASE = {
    "subject": "build-412",
    "holder": "sub:sub-0a1b2c3d",
    "lease_duration_seconds": 60,
    "acquire_time": "2026-09-22T17:10:11.188Z",
    "renew_time": "2026-09-22T17:10:11.188Z",
    "lease_transitions": 0,
    "attempts": 1,
    "delivery_count_limit": 5,
    "dead_letter": False,
}
STATE = {
    "monitor": "ci",
    "as_of": "2026-09-22T17:10:11.188Z",
    "as_of_seq": 4,
    "covers_until": "2026-09-22T17:10:11.188Z",
    "head": 4,
    "retention_floor": 1,
    "live": {"value": True, "reason": None},
    "counters": {"observations": 4, "delivered": 0, "acted": 0, "subscriptions_active": 0, "rejected": 0},
    "last": {"seq": 4, "time": "2026-09-22T17:10:11.188Z", "type": "com.example.ci.run"},
    "ages": {"since_last_observation_s": 3, "since_last_pull_s": None, "since_last_source_contact_s": None},
    "contradictions_open": 0,
    "confidence": {
        "value": None,
        "computed_by": "mp-0.1",
        "inputs": {
            "present": ["observations", "ages", "actors", "contradictions_open"],
            "missing": ["independence", "corroboration", "track_record"],
        },
        "gaps": ["independence_unknown", "single_actor", "no_subscribers", "unattested_origin"],
    },
    "computed_from": {"seq_from": 1, "seq_to": 4},
    "ttl_ms": 0,
    "supersedes": None,
}
ERROR = {
    "code": "LEASE_HELD",
    "error": "Someone else holds build-412.",
    "done": [],
    "holder": "sub:sub-00000000",
}
GOOD = {
    "observation": OBSERVATION,
    "monitor": MONITOR,
    "subscription": SUBSCRIPTION,
    "lease": LEASE,
    "state": STATE,
    "error": ERROR,
    "filter": {"types": ["com.example.a"], "tiers": ["src"], "text": "boom", "limit": 3},
}


def _with(obj: dict, path: str, value: object) -> dict:
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return out


def test_every_schema_is_a_valid_2020_12_schema_with_its_id():
    schemas = load_schemas()
    assert set(schemas) == set(SCHEMA_NAMES)
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == f"{SCHEMA_BASE}{name}.json"


def test_schema_dir_is_the_repository_schemas_in_an_editable_install():
    assert (schema_dir() / "monitor.json").is_file()


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_objects_validate(name):
    assert errors_of(name, GOOD[name]) == []


@pytest.mark.parametrize(
    ("name", "path", "value", "why"),
    [
        ("observation", "tier", "superb", "closed tier vocabulary"),
        ("observation", "sequence", "4", "sequence zero-padded to 20"),
        ("observation", "time", "2026-09-22T17:10:11Z", "time has milliseconds"),
        ("observation", "type", "NotReverseDns", "type is reverse-DNS"),
        ("observation", "data.provenance.verification", "trust-me", "closed verification vocabulary"),
        ("observation", "data.provenance", KeyError, "provenance required"),
        ("observation", "source", "ci", "source is monitor:<id>"),
        ("monitor", "horizon", "fortnight", "closed horizon vocabulary"),
        ("monitor", "id", "x", "monitor id pattern"),
        ("monitor", "capabilities", ["observe", "fly"], "closed capability vocabulary"),
        ("monitor", "filter", {"colour": ["red"]}, "filter keys are closed (via $ref)"),
        ("monitor", "head", KeyError, "head required"),
        ("subscription", "reset_policy", "sometimes", "closed reset_policy vocabulary"),
        ("subscription", "protocol", "carrier-pigeon", "closed protocol vocabulary"),
        ("subscription", "cursor", -1, "cursor is not negative"),
        ("subscription", "id", "s1", "subscription id is sub-<8 hex>"),
        ("lease", "holder", "me", "holder is sub:<subscription id>"),
        ("lease", "attempts", KeyError, "attempts required"),
        ("state", "confidence.value", 0.5, "confidence.value null while inputs are missing"),
        ("state", "live.reason", "sleepy", "closed live reasons"),
        ("state", "confidence.gaps", ["vibes"], "closed gaps"),
        ("state", "ages.since_last_pull_s", 1.5, "ages are whole seconds"),
        ("error", "code", "OOPS", "closed error codes"),
        ("error", "done", KeyError, "done required"),
        ("filter", "tiers", ["gold"], "closed tier vocabulary in filters"),
    ],
)
def test_bad_objects_are_refused(name, path, value, why):
    assert errors_of(name, _with(GOOD[name], path, value)), why


def test_state_confidence_may_have_a_value_once_nothing_is_missing():
    done = _with(STATE, "confidence.inputs.missing", [])
    assert errors_of("state", _with(done, "confidence.value", 0.7)) == []


def test_objects_stay_open_to_extension():
    assert errors_of("observation", {**OBSERVATION, "traceparent": "00-abc", "redelivered": True}) == []
    assert errors_of("monitor", {**MONITOR, "x_vendor": {"any": 1}}) == []


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="reference schemas not beside the repository")
@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_same_helper_validates_against_the_reference_schemas(name):
    v = validator(name, REFERENCE)
    assert list(v.iter_errors(GOOD[name])) == []
    if name == "observation":
        assert list(v.iter_errors(_with(OBSERVATION, "tier", "superb")))
