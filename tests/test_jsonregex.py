"""The protocol's patterns are read as JSON Schema reads them (ECMA-262), in the engine, in the import
check and in every schema validator the project builds, so a value the server accepts is one any other
language's validator accepts too (core/jsonregex.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_protocol.core import jsonregex, uri
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.records import evolve
from monitor_protocol.core.rules import importing
from monitor_protocol.core.schemas import validators
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import Changes
from monitor_protocol.core.vocab import (
    MONITOR_ID_REGEX,
    RULE_ACTION_REGEX,
    TAG_KEY_REGEX,
    TYPE_REGEX,
)
from monitor_protocol.store.memory import MemoryStore

from tests.pgcluster import ci_is_true

pytestmark = pytest.mark.quick

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-schemas"
PUBLISHED = (MONITOR_ID_REGEX, TYPE_REGEX, TAG_KEY_REGEX, RULE_ACTION_REGEX)
# What each of Python's differences from ECMA-262 turns on: line ends, non-ASCII letters and digits, spaces.
TRICKY = "ab_.-#:\n\r\u2028\u2029\u00e9\u0663\u00a0 \t\x00Z9"


@pytest.mark.parametrize(
    ("pattern", "text", "python_says", "ecma_says"),
    [
        (MONITOR_ID_REGEX, "ci\n", True, False),  # `$` before a final newline
        (MONITOR_ID_REGEX, "\u00e9t\u00e9", True, False),  # \w is ASCII
        (MONITOR_ID_REGEX, "\u0663\u0663", True, False),  # ... and so is \d's part of it
        (TYPE_REGEX, "com.example.run\n", True, False),
        (RULE_ACTION_REGEX, "run:\r", True, False),  # `.` stops at every line terminator
        (RULE_ACTION_REGEX, "run:\u2028", True, False),
        (r"^\s$", "\u00a0", True, True),  # \s stays Unicode, as in ECMA
        (r"^[^\s]$", "\u3000", False, False),
        (r"^a[]$", "a", None, False),  # the empty class (Python: an unterminated set)
        (r"^[^]$", "\n", None, True),  # any character
    ],
)
def test_each_difference_from_python_is_translated(pattern, text, python_says, ecma_says):
    if python_says is None:
        with pytest.raises(re.error):
            re.compile(pattern)
    else:
        assert (re.search(pattern, text) is not None) is python_says  # the difference is real
    assert jsonregex.search(pattern, text) is ecma_says


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (MONITOR_ID_REGEX, "ci"),
        (MONITOR_ID_REGEX, "build_7.prod-eu"),
        (TYPE_REGEX, "com.example.ci.run"),
        (TAG_KEY_REGEX, "#env"),
        (RULE_ACTION_REGEX, "escalate:human:oncall"),
        (RULE_ACTION_REGEX, "notify:human"),
        (r"\d{4}", "in 2026"),  # unanchored: found anywhere, as JSON Schema says
    ],
)
def test_ordinary_values_still_match(pattern, text):
    assert jsonregex.search(pattern, text)


@pytest.mark.parametrize("pattern", [r"[\S]", r"\A", r"\Z", r"\k<a>", r"\cJ", r"a{,2}"])
def test_syntax_the_dialects_read_differently_is_refused_not_guessed(pattern):
    with pytest.raises(ValueError):
        jsonregex.translate(pattern)
    assert jsonregex.translate(r"\x41\u0041\/\.\d{2,}") == r"\x41\u0041\/\.\d{2,}"  # control


def _node_verdicts(cases: list[tuple[str, str]]) -> list[bool]:
    script = (
        "const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "process.stdout.write(JSON.stringify(cases.map(([p, t]) => new RegExp(p).test(t))));"
    )
    out = subprocess.run(
        ["node", "-e", script],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(alphabet=TRICKY, max_size=8), min_size=1, max_size=40))
def test_the_published_patterns_agree_with_a_javascript_engine(texts):
    """A differential test: node's RegExp (an ECMA-262 engine) and jsonregex give the same verdict on every
    published pattern, for strings made of the characters where Python's `re` would differ."""
    if shutil.which("node") is None:
        if ci_is_true():
            pytest.fail("node is required in CI (.ci/run installs it) for the ECMA-262 comparison")
        pytest.skip("node is not installed: the comparison with a JavaScript regex engine is skipped")
    cases = [(p, t) for p in PUBLISHED for t in [*texts, "ab", "com.ab", "#a", "log"]]
    assert [jsonregex.search(p, t) for p, t in cases] == _node_verdicts(cases)


def test_the_engine_refuses_what_the_schemas_refuse():
    """Positive control first: a plain id and type pass; then the values Python's `re` would let through."""
    service = MonitorService(MemoryStore())
    owner = service.create_monitor({"id": "ci"}, None)["owner_token"]
    assert service.publish("ci", {"type": "com.example.run"}, owner)["seq"] >= 1
    for bad in ("ci2\n", "\u00e9t\u00e9", "\u0663\u0663"):
        with pytest.raises(ProtocolError) as refused:
            service.create_monitor({"id": bad}, None)
        assert refused.value.code == "INVALID" and "is not a monitor id" in refused.value.message
    with pytest.raises(ProtocolError) as refused:
        service.publish("ci", {"type": "com.example.run\n"}, owner)
    assert refused.value.code == "UNKNOWN_VOCABULARY"
    with pytest.raises(ProtocolError) as refused:
        service.create_monitor({"id": "ci3", "types": ["com.example.run\n"]}, None)
    assert refused.value.code == "UNKNOWN_VOCABULARY"


def test_a_missing_id_and_a_malformed_one_say_different_things():
    service = MonitorService(MemoryStore())
    for body, says in (
        ({}, "id is required"),
        ({"id": ""}, "id is required"),
        ({"id": 7}, "must be a string"),
        ({"id": "has space"}, "'has space' is not a monitor id (it holds U+0020)"),
        ({"id": "x" * 65}, "is not a monitor id (it is 65 characters long)"),
    ):
        with pytest.raises(ProtocolError) as refused:
            service.create_monitor(body, None)
        assert refused.value.code == "INVALID" and says in refused.value.message, (
            body,
            refused.value.message,
        )
    with pytest.raises(ProtocolError) as refused:
        service.import_log("has space", [])
    assert "The new monitor id 'has space' is not a monitor id" in refused.value.message


def test_a_rules_when_is_stored_normalised_as_a_filter_is():
    service = MonitorService(MemoryStore())
    rule = {"id": "r", "when": {"types": "com.example.run"}, "then": "log"}
    served = service.create_monitor({"id": "ci", "rules": [rule]}, None)["monitor"]
    assert served["rules"] == [{**rule, "when": {"types": ["com.example.run"]}}]
    assert validators()["monitor"].is_valid(served)


def test_a_rule_is_served_only_in_the_published_form():
    service = MonitorService(MemoryStore())
    good = {
        "id": "page",
        "when": {"types": ["com.example.run"]},
        "then": "escalate:human:oncall",
        "reason": "r",
    }
    created = service.create_monitor({"id": "ci", "rules": [good]}, None)
    assert created["monitor"]["rules"] == [good]  # control
    for rule, says in (
        ({"id": "r", "when": {}, "then": "bogus"}, "then is one of"),
        ({"id": "r", "when": {}, "then": "run:\n"}, "then is one of"),
        ({"id": "r", "when": {}, "then": "log", "reason": 5}, "reason is a string"),
        ({"id": "r", "when": {}, "then": "log", "version": 2}, "version is a string"),
        ({"id": "r", "when": {}, "then": "log", "derived_from": [1]}, "derived_from is an array of strings"),
        ({"id": "", "when": {}, "then": "log"}, "rules[].id must be a non-empty string"),
    ):
        with pytest.raises(ProtocolError) as refused:
            service.create_monitor({"id": "ci2", "rules": [rule]}, None)
        assert refused.value.code == "INVALID" and says in refused.value.message, (
            rule,
            refused.value.message,
        )


def test_the_import_check_reads_patterns_as_ecma():
    assert importing.schema_error({"pattern": TYPE_REGEX}, "com.example.run") is None  # control
    assert importing.schema_error({"pattern": TYPE_REGEX}, "com.example.run\n") is not None


def test_the_schema_validators_read_patterns_as_ecma():
    """The project's validators (and the conformance suite's, which compares with the reference schemas)
    refuse "ci\\n" as an id and "#a\\n" as a tag key, which plain jsonschema would pass."""
    project = validators()
    monitor = project["monitor"]
    served = MonitorService(MemoryStore()).create_monitor({"id": "ci"}, None)["monitor"]
    assert monitor.is_valid(served)  # control
    assert not monitor.is_valid({**served, "id": "ci\n"})
    assert project["filter"].is_valid({"#env": ["prod"]})
    assert not project["filter"].is_valid({"#env\n": ["prod"]})  # additionalProperties false
    # Through a $ref too (filter.json declares its own $schema, which must not bring the stock class back).
    assert monitor.is_valid({**served, "filter": {"#env": ["prod"], "types": ["com.ex"]}})  # control
    assert not monitor.is_valid({**served, "filter": {"#env\n": ["prod"]}})
    assert not monitor.is_valid({**served, "filter": {"types": ["com.ex\n"]}})
    if not REFERENCE.is_dir():
        pytest.skip(f"{REFERENCE} is absent: the comparison with the reference schemas is skipped")
    reference = validators(REFERENCE)
    assert reference["monitor"].is_valid(served)
    assert not reference["monitor"].is_valid({**served, "id": "\u00e9t\u00e9"})
    assert not reference["monitor"].is_valid({**served, "rules": [{"id": "r", "when": {}, "then": "bogus"}]})
    assert not reference["monitor"].is_valid({**served, "filter": {"#env\n": ["prod"]}})
    rule = {"id": "r", "when": {"#env": ["prod"]}, "then": "log"}
    assert reference["monitor"].is_valid({**served, "rules": [rule]})  # control
    assert not reference["monitor"].is_valid({**served, "rules": [{**rule, "when": {"#env\n": ["prod"]}}]})


# ---------------------------------------------------------------------------------------------- the sink's URI
URI_ALPHABET = "ab:/?#[]@!$&'()*+,;=%2fF.-_~ 1v\u00e9"


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("https://example.com/hook", True),
        ("mailto:ops@example.com", True),
        ("urn:example:feed", True),
        ("http://[::1]:8080/x?q=1#f", True),
        ("http://[v1.x]/", True),
        ("ÅO$4+e©", False),
        ("a b", False),
        ("/relative/path", False),
        ("https://exämple.com/", False),
        ("http://host:port/", False),
        ("http://[::1%25eth0]/", False),  # a zone id is RFC 6874, not RFC 3986
        ("http://x/%zz", False),
    ],
)
def test_is_uri_is_rfc_3986(text, ok):
    assert uri.is_uri(text) is ok


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=URI_ALPHABET, max_size=16), st.booleans())
def test_is_uri_never_passes_what_the_schema_format_refuses(text, with_scheme):
    """Differential, against the validator jsonschema uses for the `uri` format: whatever is_uri accepts,
    it accepts too. (is_uri is stricter in one place: an IPv4 part with a leading zero inside an IPv6
    literal, which RFC 3986's dec-octet refuses.)"""
    validate_rfc3986 = pytest.importorskip("rfc3986_validator").validate_rfc3986
    text = "http:" + text if with_scheme else text
    theirs = validate_rfc3986(text, rule="URI") is not None
    assert uri.is_uri(text) <= theirs, text
    if "[" not in text:
        assert uri.is_uri(text) == theirs, text


def test_a_sink_is_a_uri_when_given_and_an_old_one_does_not_stop_a_resubscribe():
    service = MonitorService(MemoryStore())
    owner = service.create_monitor({"id": "ci"}, None)["owner_token"]
    ok = service.subscribe({"monitor": "ci", "subscriber": "agent:a", "sink": "urn:example:feed"}, owner)
    assert ok["subscription"]["sink"] == "urn:example:feed"  # control
    for bad in ("\u00c5O$4+e\u00a9", "not a uri", "https://ex\u00e4mple.com/"):
        with pytest.raises(ProtocolError) as refused:
            service.subscribe({"monitor": "ci", "subscriber": "agent:b", "sink": bad}, owner)
        assert refused.value.code == "INVALID" and "is not a URI" in refused.value.message
    # A sink stored before the rule (written straight to the store) still re-subscribes, unchanged.
    store = service.store
    sub = store.get_subscription(ok["subscription"]["id"])
    with store.transaction():
        store.apply(Changes(subscriptions=[evolve(sub, sink="legacy sink")]))
    again = service.subscribe({"monitor": "ci", "subscriber": "agent:a"}, owner)
    assert again["subscription"]["sink"] == "legacy sink"


# ---------------------------------------------------------------------------------------------- filter types
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab0.-_*A \n\u00e9", max_size=10))
def test_a_filter_type_the_engine_accepts_is_one_the_schemas_accept(text):
    """Whatever `types` entry a subscription's filter is accepted with, the filter it serves validates
    against the project's filter schema: "Foo*", "com..*", "*" alone were accepted and served."""
    service = MonitorService(MemoryStore())
    service.create_monitor({"id": "ci", "visibility": "public"}, None)
    try:
        served = service.subscribe(
            {"monitor": "ci", "subscriber": "agent:f", "filter": {"types": [text]}}, None
        )
    except ProtocolError as refused:
        assert refused.code in ("INVALID_FILTER", "INVALID"), refused
        return
    assert validators()["filter"].is_valid(served["subscription"]["filter"]), text


@pytest.mark.parametrize("prefix", ["Foo*", "a b*", "*", "com..*", "com.Ex*", "com.ex\n*"])
def test_a_type_prefix_no_type_can_start_with_is_refused(prefix):
    service = MonitorService(MemoryStore())
    service.create_monitor({"id": "ci", "visibility": "public"}, None)
    for good in ("com.*", "com*", "com.example.ci.r*"):  # control
        service.subscribe({"monitor": "ci", "subscriber": f"agent:{good}", "filter": {"types": [good]}}, None)
    with pytest.raises(ProtocolError) as refused:
        service.subscribe({"monitor": "ci", "subscriber": "agent:f", "filter": {"types": [prefix]}}, None)
    assert (
        refused.value.code == "INVALID_FILTER"
        and "not the start of a reverse-DNS type" in refused.value.message
    )
