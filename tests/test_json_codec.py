"""The JSON codec (wire.Codec): mp serve encodes replies and stored rows with orjson when it is installed,
and must serve exactly the bytes the standard library's codec would (which the engine uses everywhere
else: in-process, in the browser)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from monitor_protocol.core import wire
from monitor_protocol.core.vocab import MAX_INTEGER
from monitor_protocol.doors.http.server import install_fast_json
from serverutil import running_server, server_log

orjson = pytest.importorskip("orjson", reason="orjson is in the test extra (pyproject.toml)")

# What the engine serves and stores: checked JSON (wire.check), so no NaN, no lone surrogate, no integer
# beyond 2^53, string keys.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-MAX_INTEGER, MAX_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)


@pytest.fixture
def fast() -> Iterator[wire.Codec]:
    before = wire.codec()
    install_fast_json()
    try:
        yield wire.codec()
    finally:
        wire.use_codec(before)


def test_the_engine_uses_the_standard_library_unless_a_door_installs_another() -> None:
    assert wire.codec() is wire.STDLIB_CODEC


def test_mp_serve_installs_orjson_when_it_is_there(fast: wire.Codec) -> None:
    assert fast.name == "orjson"


def test_mp_json_env_forces_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MP_JSON", "json")
    before = wire.codec()
    try:
        assert "standard library" in install_fast_json() and wire.codec() is wire.STDLIB_CODEC
    finally:
        wire.use_codec(before)


def _both(value: Any) -> tuple[bytes, bytes, Any]:
    wire.check(value)
    before = wire.codec()
    install_fast_json()
    try:
        fast = wire.encode(value)
        decoded = wire.decode_trusted(wire.STDLIB_CODEC.encode(value))
    finally:
        wire.use_codec(before)
    return fast, wire.STDLIB_CODEC.encode(value), decoded


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_orjson_writes_the_same_json_values_and_reads_them_back(value: Any) -> None:
    fast, std, decoded = _both(value)
    assert wire.STDLIB_CODEC.decode(fast) == wire.STDLIB_CODEC.decode(std) == decoded


NO_FLOATS = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_INTEGER, MAX_INTEGER) | TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(NO_FLOATS)
def test_without_floats_orjson_writes_the_standard_librarys_bytes(value: Any) -> None:
    fast, std, _ = _both(value)
    assert fast == std


def test_floats_differ_only_in_how_an_exponent_is_spelled() -> None:
    fast, std, _ = _both([2.6163379946995694e-06, 1e300, -0.0, 0.1, 1e16])
    assert std == b"[2.6163379946995694e-06,1e+300,-0.0,0.1,1e+16]"
    assert fast == b"[2.6163379946995694e-6,1e+300,-0.0,0.1,1e+16]"


def test_a_value_orjson_refuses_falls_back_to_the_standard_library(fast: wire.Codec) -> None:
    big = {"n": 2**70}  # never a checked value (beyond 2^53), but the encoder must not fail on it
    assert wire.encode(big) == b'{"n":1180591620717411303424}'


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, str]]:
    with running_server(tmp_path_factory.mktemp("fast")) as (fast_url, fast_proc):
        os.environ["MP_JSON"] = "json"
        try:
            with running_server(tmp_path_factory.mktemp("std")) as (std_url, std_proc):
                os.environ.pop("MP_JSON")
                yield fast_url, server_log(fast_proc), std_url, server_log(std_proc)
        finally:
            os.environ.pop("MP_JSON", None)


def test_both_servers_say_which_codec_they_use(servers: tuple[str, str, str, str]) -> None:
    _, fast_log, _, std_log = servers
    assert "json: orjson" in fast_log
    assert "json: standard library (MP_JSON=json)" in std_log


def test_both_servers_serve_what_the_standard_library_would_write(servers: tuple[str, str, str, str]) -> None:
    """What the orjson server sends is, byte for byte, the standard library's compact encoding of it (the
    stored row was written and read by orjson too; floats here have no exponent, see above); the
    standard-library server is the control."""
    fast_url, _, std_url, _ = servers
    data = {"text": 'é \u2028 😀 \\ " /', "n": 2**53, "f": -0.0, "e": 12345.678, "nested": [{"a": None}]}
    for base in (fast_url, std_url):
        with httpx.Client(base_url=base + "/mp/v0", timeout=30) as mp:
            owner = mp.post("/monitors", json={"id": "same", "types": ["com.example.ci.run"]}).json()
            token = {"authorization": f"Bearer {owner['owner_token']}"}
            sub = mp.post("/subscriptions", json={"monitor": "same", "subscriber": "agent:r"}, headers=token)
            reader = {"authorization": f"Bearer {sub.json()['token']}"}
            body = {"type": "com.example.ci.run", "data": data}
            published = mp.post("/monitors/same/observations", json=body, headers=token)
            pulled = mp.get(f"/subscriptions/{sub.json()['subscription']['id']}/pull", headers=reader)
            for reply in (published, pulled, mp.get("/discover")):
                assert reply.status_code in (200, 201), reply.text
                assert reply.content == wire.STDLIB_CODEC.encode(reply.json()), base
            stored = pulled.json()["observations"][-1]["data"]
            assert {k: stored[k] for k in data} == data


# ---------------------------------------------------------------------------------------------- parsing
# wire.loads skips its walk over the parsed value when the raw text cannot hold what the walk refuses
# (wire._needs_walk): whatever the text, it must refuse exactly what the walk would.

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=20)  # lone surrogates included
ANY_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_INTEGER, MAX_INTEGER) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=40,
)


def _spellings(value: Any) -> list[bytes]:
    import json

    out = [json.dumps(value).encode()]  # ASCII with \\u escapes (a lone surrogate as \\udXXX)
    try:
        out.append(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    except UnicodeEncodeError:
        out.append(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return out


@settings(max_examples=400, deadline=None)
@given(ANY_VALUES, st.integers(0, 40))
@example(
    value={"": [[]], "\u0122": [[], {"": None}]}, depth=27
)  # UTF-16: U+0122's code unit holds a quote byte
def test_loads_refuses_exactly_what_the_walk_refuses(value: Any, depth: int) -> None:
    import json

    nested: Any = value
    for _ in range(depth):
        nested = [nested]
    for raw in _spellings(nested):
        parsed = json.loads(raw)
        expected = wire.problem(parsed)
        try:
            got = wire.loads(raw)
        except wire.ProtocolError as err:
            assert expected is not None, (raw, err.message)
        else:
            assert expected is None, (raw, expected)
            assert got == parsed


def test_a_body_in_utf16_or_utf32_is_refused_and_a_utf8_bom_is_ignored() -> None:
    """json.loads reads UTF-16 and UTF-32 bytes; the wire is UTF-8 (RFC 8259 8.1), and a proxy reading the
    bytes as UTF-8 would not see what the server publishes."""
    text = '{"type":"com.example.ci.run","subject":"s"}'
    assert wire.loads(text.encode()) == {"type": "com.example.ci.run", "subject": "s"}  # positive control
    assert wire.loads(b"\xef\xbb\xbf" + text.encode()) == wire.loads(text.encode())  # RFC 8259: MAY ignore
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
        with pytest.raises(wire.ProtocolError) as caught:
            wire.loads(text.encode(encoding))
        assert caught.value.code == "INVALID" and "send UTF-8" in caught.value.message, encoding


# The fast parse's two pre-checks (wire._has_long_number, wire._deeper_than) are judged against the plain
# definitions they replace: a run of sixteen ASCII digits, and a container more than `levels` deep.
def _depth(value: Any) -> int:
    if type(value) is dict:
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if type(value) is list:
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=60) | st.text("0123456789 .,-e\u0660", max_size=60).map(str.encode))
@example(b"1234567890123456")  # exactly sixteen
@example(b"123456789012345 6")  # fifteen, then one more apart
@example("٠١٢٣٤٥٦٧٨٩٠١٢٣٤٥".encode())  # Arabic-Indic digits are not JSON's: never a long number
def test_a_long_number_is_a_run_of_sixteen_ascii_digits(raw: bytes) -> None:
    import re

    assert wire._has_long_number(raw) is (re.search(rb"[0-9]{16}", raw) is not None)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.integers(0, 40), st.integers(0, 40))
def test_deeper_than_is_the_depth_of_the_value(value: Any, wrap: int, levels: int) -> None:
    for _ in range(wrap):
        value = [value] if wrap % 2 else {"k": value}
    assert wire._deeper_than(value, levels) is (_depth(value) > levels)
    assert wire._deeper_than([value, 1], levels) is (_depth(value) + 1 > levels)  # positive control: one more


def test_a_fast_parse_refuses_a_long_integer_and_a_deep_batch(fast: wire.Codec) -> None:
    with pytest.raises(wire.ProtocolError, match="2\\^53"):
        wire.loads(b'[{"n": 1}, {"n": 12345678901234567}]')
    assert wire.loads(b'[{"n": 1}, {"n": 1234567890123456}]')[1]["n"] == 1234567890123456  # below 2^53
    deep = b"[" + b"{}," * 40 + b'{"a":' * 40 + b"1" + b"}" * 40 + b"]"
    with pytest.raises(wire.ProtocolError, match="deeper"):
        wire.loads(deep)
    assert len(wire.loads(b"[" + b"{}," * 40 + b'{"a":' * 30 + b"1" + b"}" * 30 + b"]")) == 41


# ---------------------------------------------------------------------------------------------- repeated names
NAMES = st.sampled_from(["a", "b", "tier", 'x":', "\\u0061", "\u00e9", 'q\\"'])


def _escaped(name: str) -> str:
    """`name` as a JSON string with every character written as a \\uHHHH escape."""
    return '"' + "".join(f"\\u{ord(c):04x}" for c in name) + '"'


def _write(value: Any, repeat: bool, draw: Any) -> tuple[str, bool]:
    """JSON text of `value`, with (when `repeat` allows) an object that names one member twice: the text and
    whether it does. Names are written escaped as JSON writes them, so `"\\u0061"` is a second `a`."""
    if isinstance(value, dict):
        parts, repeated = [], False
        items = list(value.items())
        for name, item in items:
            text, inner = _write(item, repeat, draw)
            repeated |= inner
            parts.append(f"{wire.encode_text(name)}:{text}")
        if repeat and items and draw(st.booleans()):
            name, item = draw(st.sampled_from(items))
            spelled = draw(st.sampled_from([wire.encode_text(name), _escaped(name)]))
            parts.insert(
                draw(st.integers(0, len(parts))),
                f"{spelled}{draw(st.sampled_from([':', ' :']))}{_write(item, False, draw)[0]}",
            )
            repeated = True
        return "{" + ",".join(parts) + "}", repeated
    if isinstance(value, list):
        written = [_write(item, repeat, draw) for item in value]
        return "[" + ",".join(t for t, _ in written) + "]", any(r for _, r in written)
    return wire.encode_text(value), False


OBJECTS = st.recursive(
    st.none() | st.integers(0, 9) | st.sampled_from(['x":', 'say \\":', "plain"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(OBJECTS, st.booleans(), st.data())
def test_loads_refuses_exactly_the_texts_that_repeat_a_name(value: Any, fast_first: bool, data: Any) -> None:
    """Whatever the names hold (an escaped quote and a colon, a `\\u0061` spelling of `a`), a text is refused
    iff one of its objects names a member twice, on both parse paths (orjson first, the standard library)."""
    text, repeated = _write(value, True, data.draw)
    wire.use_codec(
        wire.Codec("orjson", orjson.dumps, orjson.loads, parse=orjson.loads)
        if fast_first
        else wire.STDLIB_CODEC
    )
    try:
        if repeated:
            with pytest.raises(wire.ProtocolError, match="twice; send each member name once"):
                wire.loads(text.encode())
        else:
            assert wire.loads(text.encode()) == value
    finally:
        wire.use_codec(wire.STDLIB_CODEC)


def test_a_repeated_name_is_refused_over_http_and_logged(servers: tuple[str, str, str, str]) -> None:
    """Through mp serve: 400 INVALID with the sentence, and the publish is not applied (control: once)."""
    for base in (servers[0], servers[2]):
        owner = httpx.post(f"{base}/mp/v0/monitors", json={"id": "dup"}).json()["owner_token"]
        headers = {"authorization": f"Bearer {owner}", "content-type": "application/json"}
        once = httpx.post(
            f"{base}/mp/v0/monitors/dup/observations", content=b'{"type":"com.example.a"}', headers=headers
        )
        assert once.status_code == 201, once.text
        twice = b'{"type":"com.example.a","tier":"src","tier":"unverified"}'
        r = httpx.post(f"{base}/mp/v0/monitors/dup/observations", content=twice, headers=headers)
        assert r.status_code == 400 and r.json()["code"] == "INVALID" and "'tier' twice" in r.json()["error"]
        state = httpx.get(f"{base}/mp/v0/monitors/dup/state", headers=headers).json()
        assert state["counters"]["observations"] == 1 and state["counters"]["rejected"] == 1, state


def test_a_filter_query_parameter_says_which_wire_rule_it_broke() -> None:
    from monitor_protocol.api.messages import Request
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.memory import MemoryStore

    service = MonitorService(MemoryStore())
    service.create_monitor({"id": "ci", "visibility": "public"}, None)
    sub = service.subscribe({"monitor": "ci", "subscriber": "agent:q"}, None)
    router = RestRouter(service, allowed_hosts=None)

    def pull(flt: str) -> Any:
        headers = {"host": "127.0.0.1", "authorization": f"Bearer {sub['token']}"}
        path = f"/mp/v0/subscriptions/{sub['subscription']['id']}/pull"
        return router.handle(Request("GET", path, [("filter", flt)], headers, b""))

    assert pull('{"types":["com.example.a"]}').status == 200  # control
    refused = pull('{"types":["com.example.a"],"types":["com.example.b"]}')
    assert refused.status == 400 and refused.body["code"] == "INVALID_FILTER"
    assert "must be a JSON object: An object names 'types' twice" in refused.body["error"]
