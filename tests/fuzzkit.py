"""Kit for tests/test_fuzz.py: strict response checkers, a raw JSON writer, request strategies and a world.

The checkers encode docs/protocol.md sections 3 and 10 from the outside (the closed error list is copied from
the contract, not imported from the engine): no 5xx (a 503 is legal only as a storage failure), every error
body is `{code, error, done}` with a code from the closed list and the status the contract gives it, every
JSON-RPC error carries `data.code` from the list, and every body is RFC 8259 JSON (no bare NaN or
Infinity, no lone surrogates, valid UTF-8).

Requests are generated symbolically (`Ref("owner")` stands for the live owner token) and resolved against
a `World` (a monitor, its owner token, a reader subscription and its token, a shared monitor and its
subscribe token, published subjects) when sent, so most generated requests get past auth. A request the
contract says must be refused (bare NaN, a lone surrogate, nesting past 32, an integer past 2^53, a
subject past 256 characters, an Origin the operator did not allow...) carries `must_refuse`, and a 2xx
answer to it is a failure.

Every protocol object a response carries (monitors, observations, subscriptions, states, leases, error
bodies) must also validate against the project's schemas and, when they are beside the repository, the
protocol's reference schemas, with patterns read as JSON Schema reads them (`SchemaCheck`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st
from monitor_protocol.conformance import checks as conformance_checks
from monitor_protocol.conformance.checks.base import Seen, classify

# --------------------------------------------------------------------------------- the contract (sec. 3)
# The suite's own copy of section 3, written from docs/protocol.md rather than imported from the engine.
CLOSED_CODES: dict[str, int] = dict(conformance_checks.ERROR_STATUS)
RPC_CODE: dict[str, int] = dict(conformance_checks.JSONRPC_CODE)
STANDARD_RPC_CODES = {-32600, -32601, -32602, -32700}
STANDARD_RPC_DATA_CODES = {"INVALID", "NOT_FOUND"}
SUCCESS_STATUSES = {200, 201, 204}
MAX_SAFE_INT = 2**53
PREFIX = "/mp/v0"
RPC_PATH = PREFIX + "/rpc"


# ------------------------------------------------------------------------------------ strict JSON parse
class StrictJSONError(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(f"bare {name} in the body (not RFC 8259 JSON)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(f"number {text[:40]} is not finite in IEEE 754")
    return value


def strict_loads(raw: bytes) -> Any:
    """Parse `raw` as RFC 8259 JSON in UTF-8; raise StrictJSONError on anything else."""
    try:
        text = raw.decode("utf-8")  # strict: refuses invalid UTF-8 and encoded surrogates
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"body is not UTF-8: {exc}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StrictJSONError(f"body is not JSON: {exc}") from None
    find_non_json_values(value, raise_on_first=True)
    return value


def find_non_json_values(value: Any, raise_on_first: bool = False) -> list[str]:
    """Every str (keys too) must encode to UTF-8 (no lone surrogates); every float must be finite."""
    found: list[str] = []
    stack = [(value, "$")]
    while stack:
        item, where = stack.pop()
        problem = None
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                problem = f"lone surrogate in a string at {where}: {item[:40]!r}"
        elif isinstance(item, float) and not math.isfinite(item):
            problem = f"non-finite number {item} at {where}"
        elif isinstance(item, dict):
            for k, v in item.items():
                stack.append((k, f"{where} (key)"))
                stack.append((v, f"{where}.{str(k)[:20]}"))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
        if problem:
            if raise_on_first:
                raise StrictJSONError(problem)
            found.append(problem)
    return found


# ---------------------------------------------------------------------------------------- the checkers
@dataclass
class Sent:
    """A concrete request as it went out (for reports)."""

    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    label: str = ""
    route: str = ""
    must_refuse: str | None = None
    rpc_single: bool = False

    def is_rpc(self) -> bool:
        return self.method.upper() == "POST" and self.path.rstrip("/") == RPC_PATH

    def describe(self, limit: int = 600) -> str:
        body = self.body if len(self.body) <= limit else self.body[:limit] + b"...(%d bytes)" % len(self.body)
        q = "&".join(f"{k}={v}" for k, v in self.query)
        hdrs = {k: (v if len(v) < 120 else v[:120] + "...") for k, v in self.headers.items()}
        path = self.path if len(self.path) < 200 else self.path[:200] + "..."
        return f"{self.method} {path}{'?' + q[:300] if q else ''}\n    headers: {hdrs}\n    body: {body!r}"


def check_error_body(status: int, body: Any, allow_storage_503: bool, where: str = "body") -> list[str]:
    problems: list[str] = []
    if not isinstance(body, dict):
        return [f"error {where} is not a JSON object: {str(body)[:200]}"]
    code = body.get("code")
    if code not in CLOSED_CODES:
        problems.append(f"error {where} code {code!r} is not in the closed list")
    error = body.get("error")
    if not isinstance(error, str) or not error.strip():
        problems.append(f"error {where} has no non-empty `error` sentence: {error!r}")
    if "done" in body and not isinstance(body["done"], list):
        problems.append(f"error {where} `done` is not a list: {body['done']!r}")
    if status >= 500:
        if not (status == 503 and code == "UNAVAILABLE" and body.get("storage") is True):
            problems.append(
                f"HTTP {status} (only a storage failure may be a 503 UNAVAILABLE with storage:true)"
            )
        elif not allow_storage_503:
            problems.append("HTTP 503 storage failure (none should happen in this test)")
    elif code in CLOSED_CODES and CLOSED_CODES[code] != status:
        problems.append(f"code {code} travels with HTTP {CLOSED_CODES[code]}, not {status}")
    return problems


def check_rpc_reply(reply: Any, allow_storage_503: bool) -> list[str]:
    if not isinstance(reply, dict):
        return [f"JSON-RPC reply is not an object: {str(reply)[:200]}"]
    problems: list[str] = []
    if reply.get("jsonrpc") != "2.0":
        problems.append(f"JSON-RPC reply without jsonrpc:'2.0': {str(reply)[:200]}")
    if "id" not in reply:
        problems.append("JSON-RPC reply without an id")
    if ("result" in reply) == ("error" in reply):
        problems.append("JSON-RPC reply must have exactly one of result and error")
    err = reply.get("error")
    if "error" in reply:
        if not isinstance(err, dict):
            return [*problems, f"JSON-RPC error is not an object: {err!r}"]
        num, data = err.get("code"), err.get("data")
        if not isinstance(err.get("message"), str) or not err.get("message"):
            problems.append("JSON-RPC error without a message")
        if not isinstance(data, dict):
            problems.append(f"JSON-RPC error without a data object: {str(err)[:200]}")
            return problems
        data_code = data.get("code")
        if data_code not in CLOSED_CODES:
            problems.append(f"JSON-RPC error data.code {data_code!r} is not in the closed list")
        if not isinstance(data.get("error"), str) or not data.get("error"):
            problems.append("JSON-RPC error data has no non-empty `error` sentence")
        if isinstance(num, bool) or not isinstance(num, int):
            problems.append(f"JSON-RPC error code {num!r} is not an integer")
        elif num in STANDARD_RPC_CODES:
            if data_code not in STANDARD_RPC_DATA_CODES:
                problems.append(f"JSON-RPC {num} with data.code {data_code!r} (want INVALID or NOT_FOUND)")
        elif data_code in RPC_CODE and num != RPC_CODE[data_code]:
            problems.append(
                f"JSON-RPC code {num} for {data_code} (the contract numbers it {RPC_CODE[data_code]})"
            )
        elif data_code in CLOSED_CODES and num not in RPC_CODE.values():
            problems.append(f"JSON-RPC code {num} is neither -32000..-32018 nor a standard code")
        if data_code == "UNAVAILABLE" and data.get("storage") is True and not allow_storage_503:
            problems.append("JSON-RPC storage failure (none should happen in this test)")
    return problems


def check_response(
    sent: Sent, status: int, raw: bytes, *, allow_storage_503: bool = False
) -> tuple[list[str], Any]:
    """All the problems with one response (empty when it meets the contract), and its parsed body."""
    problems: list[str] = []
    body: Any = None
    if raw:
        try:
            body = strict_loads(raw)
        except StrictJSONError as exc:
            problems.append(f"response body is not RFC 8259 JSON: {exc}")
            if status >= 500:
                problems.append(f"HTTP {status}")
            return problems, None
    if status >= 400 and sent.is_rpc() and isinstance(body, dict) and "jsonrpc" in body:
        # A refusal of the whole JSON-RPC request may come as a JSON-RPC error object; its data is then
        # the REST error body, with the status its code travels with.
        problems.extend(check_rpc_reply(body, allow_storage_503))
        if "error" not in body:
            problems.append(f"HTTP {status} with a JSON-RPC result")
        else:
            data = body["error"].get("data") if isinstance(body["error"], dict) else None
            problems.extend(check_error_body(status, data, allow_storage_503, where="error.data"))
    elif status >= 400:
        if not raw:
            problems.append(f"HTTP {status} with an empty body (the protocol's error body is required)")
            if status >= 500:
                problems.append(f"HTTP {status}")
        else:
            problems.extend(check_error_body(status, body, allow_storage_503))
    elif status == 207 and sent.route == "publish" and sent.body.lstrip().startswith(b"["):
        problems.extend(_check_batch_reply(body, allow_storage_503))
    elif status not in SUCCESS_STATUSES:
        problems.append(f"HTTP {status} is neither a success nor a protocol error")
    elif status == 204:
        if raw:
            problems.append("HTTP 204 with a body")
    elif sent.is_rpc():
        if status != 200:
            problems.append(f"JSON-RPC answered with HTTP {status}, not 200/204")
        replies = body if isinstance(body, list) else [body]
        if isinstance(body, list) and not body:
            problems.append("JSON-RPC answered with an empty array (nothing to answer is HTTP 204)")
        for reply in replies:
            problems.extend(check_rpc_reply(reply, allow_storage_503))
    elif not isinstance(body, dict):
        problems.append(f"HTTP {status} body is not a JSON object: {str(body)[:200]}")
    if sent.must_refuse and 200 <= status < 300:
        if not sent.is_rpc():
            problems.append(f"accepted (HTTP {status}) a request the contract refuses: {sent.must_refuse}")
        elif _has_result(body):
            problems.append(f"JSON-RPC executed a call the contract refuses: {sent.must_refuse}")
    return problems, body


def _check_batch_reply(body: Any, allow_storage_503: bool) -> list[str]:
    """A batch publish (a JSON array body, docs/serve.md) answers 207 `{monitor, published, refused,
    results}`: one result per item, each a seq or a refusal with its own status and error body."""
    if not isinstance(body, dict) or not isinstance(body.get("results"), list):
        return [f"HTTP 207 without a results list: {str(body)[:200]}"]
    problems: list[str] = []
    refused = [r for r in body["results"] if isinstance(r, dict) and "error" in r]
    if body.get("refused") != len(refused) or body.get("published") != len(body["results"]) - len(refused):
        problems.append(f"HTTP 207 counts do not match its results: {str(body)[:200]}")
    for r in refused:
        if not isinstance(r.get("status"), int) or isinstance(r.get("status"), bool):
            problems.append(f"HTTP 207 result without an integer status: {str(r)[:200]}")
            continue
        problems.extend(check_error_body(r["status"], r["error"], allow_storage_503, where="results[].error"))
    return problems


def _has_result(body: Any) -> bool:
    replies = body if isinstance(body, list) else [body]
    return any(isinstance(r, dict) and "result" in r for r in replies)


def check_encoded(response_body: Any, encode: Callable[[], bytes]) -> tuple[list[str], bytes]:
    """In-process: encode the router's body the way the door does; an encoder crash is a failure."""
    try:
        raw = encode()
    except Exception as exc:  # noqa: BLE001 - any encoder failure is exactly what we report
        return [f"encoding the response raised {exc.__class__.__name__}: {str(exc)[-120:]}"], b""
    problems = []
    if response_body is not None:
        problems = [f"response object holds a {p}" for p in find_non_json_values(response_body)]
    return problems, raw


# ---------------------------------------------------------------------------------------- raw writer
@dataclass(frozen=True)
class Raw:
    """JSON text written as is (NaN, Infinity, 1e400, a 5000-digit integer)."""

    text: str


@dataclass(frozen=True)
class Ref:
    """A placeholder resolved against the World when the request is sent."""

    name: str


POISON_TEXT = {"NaN", "Infinity", "-Infinity"}


def dumps_raw(value: Any) -> str:
    """A JSON writer that can write what json.dumps refuses to: raw tokens and lone-surrogate escapes."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps_raw(str(k))}:{dumps_raw(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps_raw(v) for v in value) + "]"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return json.dumps(value, ensure_ascii=False)
        except UnicodeEncodeError:
            return json.dumps(value)  # ensure_ascii writes a lone surrogate as a \udXXX escape
    if isinstance(value, float):
        return (
            repr(value)
            if math.isfinite(value)
            else {"nan": "NaN", "inf": "Infinity"}.get(str(value), "-Infinity")
        )
    return json.dumps(value)


def resolve(value: Any, lookup: Callable[[str], Any]) -> Any:
    if isinstance(value, Ref):
        return lookup(value.name)
    if isinstance(value, dict):
        return {resolve(k, lookup): resolve(v, lookup) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, lookup) for v in value]
    return value


# -------------------------------------------------------------------------------- request specs
RUN = "com.example.ci.run"
OTHER = "com.example.ci.other"
SUBJECTS = ["job-1", "job-2", "job-3"]
LIMITED_256 = {"subject", "actor", "type", "subscriber", "owner", "on_behalf_of", "id", "monitor"}
LIMITED_1K_REASON = {"seek", "update", "pause", "resume", "retire-monitor"}
INT_FIELDS = {"cursor", "limit", "upto_seq", "from", "lease_duration_seconds", "retire_after_mute_seconds"}


@dataclass
class Spec:
    """A symbolic request: Refs inside, resolved by World.materialize."""

    method: str
    path: str  # may hold {mon} {sub} {smon} placeholders
    route: str
    query: list[tuple[str, Any]] = field(default_factory=list)
    auth: Any = None  # a Ref, a literal header value, or None
    auth_scheme: str = "Bearer "
    body: Any = None  # a JSON-able value with Refs/Raws, or bytes (raw), or None (empty)
    extra_headers: dict[str, str] = field(default_factory=dict)
    label: str = "valid"
    must_refuse: str | None = None
    rpc_single: bool = False


NAMES = st.sampled_from(["agent:fz", "human:you", "probe:ci", "system:x", "reader-7", "mailto:a@b", "x"])
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
ISO = st.sampled_from(
    [
        "2026-01-01T00:00:00Z",
        "2030-12-31T23:59:59.999Z",
        "2026-01-01T00:00:00Z",
        "yesterday",
        "",
        "2026-13-45T99:99:99Z",
    ]
)
NAME_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**60), 2**60),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=6
)
POISONS = [
    (Raw("NaN"), "bare NaN in the body"),
    (Raw("Infinity"), "bare Infinity in the body"),
    (Raw("-Infinity"), "bare -Infinity in the body"),
    ("\ud800", "a lone surrogate \\ud800 in the body"),
    ("ok\udfffok", "a lone surrogate \\udfff in the body"),
    ("\udc00\ud800", "reversed surrogates in the body"),
    (Raw("1e400"), None),
    (Raw("-1e400"), None),
    (Raw(str(2**64)), None),
    (Raw("9" * 5000), None),
    (Raw("-0"), None),
    (Raw("1E-400"), None),
]
GARBAGE = [
    b"{",
    b'{"a":',
    b"}{",
    b"[1,2",
    b"nul",
    b"\xff\xfe\x00\x00",
    b"\xef\xbb\xbf{}",
    b'{"type": "\xed\xa0\x80"}',
    b'{"subject": "\xc3"}',
    b"[" * 5000,
    b"{" * 3000,
    b'{"a":' * 2000,
    b"[" * 100 + b"]" * 100,
    b"\x00",
    b"   \n\t ",
    b"true",
    b'"just a string"',
    b"12345678901234567890123456789012345678901234567890",
    b"NaN",
    b"[NaN]",
    b'{"x": Infinity}',
    b'{"a": 1, "a": 2}',
    b"'single'",
    b"{'a': 1}",
    b"x" * 5000,
]
TOO_LARGE_BODY = b'{"data":"' + b"x" * ((1 << 20) + 16) + b'"}'
HUGE_LENGTHS = [257, 300, 1025, 2100, 70_000]
HUGE_CHARS = ["x", "é", "\u2028", "😀", "\u0000"]
WEIRD_INTS = [
    "²",
    "١٢",
    "٣",
    "1²",
    "-1",
    "0",
    "1e3",
    " 5",
    "5 ",
    "+5",
    "0x10",
    "1.5",
    "NaN",
    "",
    "9" * 30,
    str(2**53 + 1),
    "٠",
    "𝟓",
    "5\u0000",
    "true",
]
NON_ASCII_DIGIT = re.compile(r"[^\x00-\x7f]")


def weird_int_refusal(value: str) -> str | None:
    if any(ch.isdigit() and not ch.isascii() for ch in value):
        return f"a non-ASCII digit in an integer query parameter ({value!r})"
    if value.strip().isdigit() and value.strip().isascii() and int(value.strip()) > MAX_SAFE_INT:
        return f"an integer past 2^53 in a query parameter ({value})"
    return None


def filters() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "types": st.lists(
                st.sampled_from([RUN, OTHER, "ai.mentu.monitor.lease", "com.example.*", "Foo*", "*"]),
                max_size=2,
            ),
            "subjects": st.lists(st.sampled_from(SUBJECTS), max_size=2),
            "actors": st.lists(NAMES, max_size=2),
            "tiers": st.lists(st.sampled_from(["src", "measured", "derived", "bogus"]), max_size=2),
            "origins": st.lists(st.sampled_from(["human", "agent", "probe", "martian"]), max_size=2),
            "horizons": st.lists(st.sampled_from(["event", "hour", "eon"]), max_size=2),
            "sources": st.lists(st.sampled_from(["monitor:x", "shell"]), max_size=2),
            "since": ISO,
            "until": ISO,
            "text": TEXT,
            "limit": st.one_of(st.integers(1, 200), st.integers(-1, 300)),
        },
    )


# A monitor's rules: the published actions, and what the published schema refuses (served, it would fail it).
RULES = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(["r1", "page-on-fail"]),
            "when": st.sampled_from([{}, {"types": ["com.example.ci.run"]}]),
            "then": st.sampled_from(
                ["bogus", "log", "run:\n", "label", "escalate:human:oncall", "notify:human"]
            ),
        },
        optional={
            "reason": st.one_of(st.text(max_size=20), st.integers()),
            "derived_from": st.just(["x", 1]),
        },
    ),
    max_size=2,
)


def create_body() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"id": st.just(Ref("fresh")), "types": st.just([RUN, OTHER])},
        optional={
            "owner": NAMES,
            "name": NAME_TEXT,
            "description": TEXT,
            "capabilities": st.lists(
                st.sampled_from(["observe", "react", "act", "observe", "react", "act", "fly"]), max_size=3
            ),
            "visibility": st.sampled_from(["public", "shared", "private", "secret"]),
            "subscribe_token": st.booleans(),
            "horizon": st.sampled_from(["event", "hour", "century"]),
            "default_grant": st.lists(st.sampled_from(["observe", "react", "act"]), max_size=2),
            "source": st.fixed_dictionaries({"kind": st.sampled_from(["shell", "log", "http", "nope"])}),
            "filter": filters(),
            "retire_after_mute_seconds": st.integers(1, 10**6),
            "ttl_seconds": st.integers(1, 10**6),
            "budget": st.one_of(
                st.none(), st.fixed_dictionaries({"max_observations_per_minute": st.integers(0, 5)})
            ),
            "rules": RULES,
        },
    )


def publish_body() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                [RUN, OTHER, RUN, OTHER, RUN, OTHER, "Not.A.Type", "ai.mentu.monitor.configured"]
            )
        },
        optional={
            "subject": st.sampled_from(SUBJECTS),
            "data": st.one_of(st.dictionaries(TEXT, JSON_VALUES, max_size=4), JSON_VALUES),
            "tags": st.dictionaries(st.sampled_from(["env", "#x", "k k"]), TEXT, max_size=2),
            "actor": NAMES,
            "origin": st.sampled_from(["human", "agent", "webhook", "probe", "system", "alien"]),
            "tier": st.sampled_from(["src", "measured", "derived", "unverified", "falsified", "gold"]),
            "verification": st.sampled_from(
                ["human_verified", "reported", "unverified", "certified", "sure"]
            ),
            "on_behalf_of": st.sampled_from(["human:fuzz", "human:fuzz", "agent:fz"]),
            "time": ISO,
            "source_ref": TEXT,
            "rule": TEXT,
            "wasDerivedFrom": st.lists(st.sampled_from(["1", "2", "999", "x"]), max_size=2),
            "supersedes": st.sampled_from(["2", "3", "999"]),
        },
    )


def subscribe_body(monitor: Any) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "monitor": monitor,
            "subscriber": st.one_of(st.just(Ref("subscriber")), st.just(Ref("fresh_subscriber")), NAMES),
        },
        optional={
            "capabilities": st.lists(
                st.sampled_from(["observe", "react", "act", "observe", "react", "act", "fly"]), max_size=3
            ),
            "filter": filters(),
            "from": st.one_of(st.sampled_from(["head", "earliest", "now"]), st.integers(-1, 12)),
            "protocol": st.sampled_from(["pull", "http", "mcp", "carrier-pigeon"]),
            "reset_policy": st.sampled_from(["earliest", "latest", "none", "sometimes"]),
            "sink": st.one_of(st.none(), st.just({"url": "http://127.0.0.1:9/hook"}), TEXT),
            "retire_after_mute_seconds": st.integers(1, 10**6),
        },
    )


CURSORS = st.one_of(st.integers(0, 12), st.just(Ref("head")))


def lease_body(action: str) -> st.SearchStrategy[dict[str, Any]]:
    optional: dict[str, st.SearchStrategy[Any]] = {"note": TEXT}
    if action in ("claim", "renew"):
        optional["lease_duration_seconds"] = st.integers(0, 10**5)
    if action == "complete":
        optional["evidence"] = JSON_VALUES
    if action in ("release", "reject"):
        optional["reason"] = TEXT
    required: dict[str, st.SearchStrategy[Any]] = {"subject": st.sampled_from([*SUBJECTS, "never-published"])}
    if action == "complete":
        required["outcome"] = st.sampled_from(["success", "failure", "done", ""])
    return st.fixed_dictionaries(required, optional=optional)


def reason_body(required: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"reason": TEXT} if required else {}, optional={} if required else {"reason": TEXT}
    )


def update_body() -> st.SearchStrategy[dict[str, Any]]:
    patch = st.fixed_dictionaries(
        {"description": TEXT},
        optional={
            "name": NAME_TEXT,
            "horizon": st.sampled_from(["event", "day", "week", "never"]),
            "default_grant": st.lists(st.sampled_from(["observe", "react"]), max_size=2),
            "filter": filters(),
            "cadence": st.one_of(st.just({}), JSON_VALUES),
            "rules": RULES,
        },
    )
    return st.fixed_dictionaries({"patch": patch}, optional={"reason": TEXT, "rule": TEXT})


# (route key, method, path, body strategy or None, default auth, reason class for the 1 KiB limit)
ROUTES: list[tuple[str, str, str, Any, Any, str | None]] = [
    ("discover", "GET", "/discover", None, None, None),
    ("create", "POST", "/monitors", create_body(), None, None),
    ("list", "GET", "/monitors", None, Ref("owner"), None),
    ("get", "GET", "/monitors/{mon}", None, Ref("owner"), None),
    ("state", "GET", "/monitors/{mon}/state", None, Ref("owner"), None),
    ("update", "POST", "/monitors/{mon}/update", update_body(), Ref("owner"), "update"),
    ("pause", "POST", "/monitors/{mon}/pause", reason_body(), Ref("owner"), "pause"),
    ("resume", "POST", "/monitors/{mon}/resume", reason_body(), Ref("owner"), "resume"),
    ("retire-monitor", "POST", "/monitors/{mon}/retire", reason_body(), Ref("owner"), "retire-monitor"),
    ("publish", "POST", "/monitors/{mon}/observations", publish_body(), Ref("owner"), None),
    ("subscribe", "POST", "/subscriptions", subscribe_body(st.just(Ref("mon"))), Ref("owner"), None),
    (
        "subscribe-shared",
        "POST",
        "/subscriptions",
        subscribe_body(st.just(Ref("smon"))),
        Ref("stoken"),
        None,
    ),
    ("subscription", "GET", "/subscriptions/{sub}", None, Ref("reader"), None),
    ("pull", "GET", "/subscriptions/{sub}/pull", None, Ref("reader"), None),
    (
        "ack",
        "POST",
        "/subscriptions/{sub}/ack",
        st.fixed_dictionaries({"cursor": CURSORS}),
        Ref("reader"),
        None,
    ),
    (
        "seek",
        "POST",
        "/subscriptions/{sub}/seek",
        st.fixed_dictionaries({"cursor": CURSORS, "reason": TEXT}),
        Ref("reader"),
        "seek",
    ),
    ("renew", "POST", "/subscriptions/{sub}/renew", st.just({}), Ref("reader"), None),
    ("retire-sub", "POST", "/subscriptions/{sub}/retire", reason_body(False), Ref("reader"), None),
    *[
        (f"lease-{a}", "POST", f"/subscriptions/{{sub}}/leases/{a}", lease_body(a), Ref("reader"), None)
        for a in ("claim", "renew", "complete", "release", "reject")
    ],
    ("stream", "GET", "/subscriptions/{sub}/stream", None, Ref("reader"), None),
    (
        "admin-compact",
        "POST",
        "/admin/compact",
        st.fixed_dictionaries({"upto_seq": st.integers(0, 5)}, optional={"monitor": st.just(Ref("scratch"))}),
        Ref("admin"),
        None,
    ),
    ("admin-snapshot", "GET", "/admin/snapshot", None, Ref("admin"), None),
    ("admin-log", "GET", "/admin/log", None, Ref("admin"), None),
]
ROUTE_BY_KEY = {r[0]: r for r in ROUTES}
# Routes whose success changes what the World relies on: check the world after them.
DESTRUCTIVE = {"update", "pause", "retire-monitor", "renew", "retire-sub", "seek", "subscribe", "rpc"}
BODYLESS = {"renew"}  # the route does not read its body: poison there is not an oracle

RPC_METHODS: dict[str, Callable[[], st.SearchStrategy[dict[str, Any]]]] = {
    "monitors/discover": lambda: st.just({}),
    "monitors/list": lambda: st.just({}),
    "monitors/get": lambda: st.just({"id": Ref("mon")}),
    "monitors/state": lambda: st.just({"monitor": Ref("mon")}),
    "monitors/create": create_body,
    "monitors/update": lambda: update_body().map(lambda b: {"id": Ref("mon"), **b}),
    "monitors/pause": lambda: reason_body().map(lambda b: {"id": Ref("mon"), **b}),
    "monitors/resume": lambda: reason_body().map(lambda b: {"id": Ref("mon"), **b}),
    "monitors/retire": lambda: reason_body().map(lambda b: {"id": Ref("mon"), **b}),
    "monitors/publish": lambda: publish_body().map(lambda b: {"id": Ref("mon"), **b}),
    "feeds/subscribe": lambda: subscribe_body(st.just(Ref("mon"))),
    "feeds/pull": lambda: st.fixed_dictionaries(
        {"subscription": st.just(Ref("sub"))},
        optional={"cursor": CURSORS, "limit": st.integers(0, 201), "filter": filters()},
    ),
    "feeds/ack": lambda: st.fixed_dictionaries({"subscription": st.just(Ref("sub")), "cursor": CURSORS}),
    "feeds/seek": lambda: st.fixed_dictionaries(
        {"subscription": st.just(Ref("sub")), "cursor": CURSORS, "reason": TEXT}
    ),
    "feeds/renew": lambda: st.just({"subscription": Ref("sub")}),
    "feeds/retire": lambda: st.just({"subscription": Ref("sub")}),
    **{
        f"leases/{a}": (lambda a=a: lease_body(a).map(lambda b: {"subscription": Ref("sub"), **b}))
        for a in ("claim", "renew", "complete", "release", "reject")
    },
}
RPC_OWNER_METHODS = {m for m in RPC_METHODS if m.startswith("monitors/")}
RPC_STRATEGIES = {m: f() for m, f in RPC_METHODS.items()}
RPC_REASON_CLASS = {"monitors/update": "update", "monitors/pause": "pause", "feeds/seek": "seek"}
RPC_REASON_CLASS |= {"monitors/resume": "resume", "monitors/retire": "retire-monitor"}


# ------------------------------------------------------------------------------------------ mutation
@dataclass
class Mutated:
    body: Any
    label: str
    must_refuse: str | None = None


def _paths(value: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Paths to every container in `value` (where a poison can be put)."""
    out = [prefix] if isinstance(value, (dict, list)) else []
    if depth < 6:
        if isinstance(value, dict):
            for k, v in value.items():
                out += _paths(v, (*prefix, k), depth + 1)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                out += _paths(v, (*prefix, i), depth + 1)
    return out


def _at(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def _nest(depth: int, leaf: Any, kind: str) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"n": leaf}
    return leaf


@st.composite
def mutate(draw: st.DrawFn, body: dict[str, Any], reason_class: str | None) -> Mutated:
    """A valid body, or one mutation of it (with the refusal the contract then requires, if any)."""
    kind = draw(
        st.sampled_from(
            ["valid"] * 6
            + ["drop", "wrong-type", "huge-string", "unknown-field", "poison", "poison", "deep", "int-field"]
            + ["garbage", "non-object", "poison-key", "too-large"]
        )
    )
    body = _copy(body)
    keys = list(body)
    if kind == "valid":
        return Mutated(body, "valid")
    if kind == "drop" and keys:
        k = draw(st.sampled_from(keys))
        del body[k]
        return Mutated(body, f"drop {k}")
    if kind == "wrong-type" and keys:
        k = draw(st.sampled_from(keys))
        body[k] = draw(JSON_VALUES)
        return Mutated(body, f"wrong type at {k}")
    if kind == "huge-string":
        k = draw(st.sampled_from(keys or ["x"]))
        n, ch = draw(st.sampled_from(HUGE_LENGTHS)), draw(st.sampled_from(HUGE_CHARS))
        body[k] = ch * n
        refuse = None
        if k in LIMITED_256 and n > 256:
            refuse = f"{k} longer than 256 characters ({n})"
        elif k == "reason" and reason_class in LIMITED_1K_REASON and len((ch * n).encode()) > 1024:
            refuse = f"a {reason_class} reason longer than 1 KiB ({n} x {ch!r})"
        return Mutated(body, f"huge string ({n} x {ch!r}) at {k}", refuse)
    if kind == "unknown-field":
        k = draw(st.sampled_from(["zzz", "__proto__", "constructor", "ID", "", "é", "token"]))
        body[k] = draw(JSON_VALUES)
        return Mutated(body, f"unknown field {k!r}")
    if kind in ("poison", "poison-key"):
        poison, refuse = draw(st.sampled_from(POISONS))
        where = draw(st.sampled_from(_paths(body)))
        target = _at(body, where)
        if kind == "poison-key" and isinstance(poison, str):
            if isinstance(target, dict):
                target[poison] = 1
            else:
                target.append({poison: 1})
            return Mutated(body, f"poison key {poison!r} at {where}", refuse)
        if isinstance(target, dict):
            k = draw(st.sampled_from([*target, "data"] if target else ["data"]))
            target[k] = poison
        else:
            target.append(poison)
        return Mutated(body, f"poison {poison!r} at {where}", refuse)
    if kind == "deep":
        depth = draw(st.sampled_from([33, 40, 64, 100]))
        leaf = draw(st.sampled_from([1, "x", None, {}, []]))
        nested = _nest(depth, leaf, draw(st.sampled_from(["list", "dict"])))
        k = draw(st.sampled_from([*keys, "data"] if keys else ["data"]))
        body[k] = nested
        return Mutated(body, f"nesting {depth} deep at {k}", f"JSON nested more than 32 levels ({depth}+)")
    if kind == "int-field":
        int_keys = [k for k in keys if k in INT_FIELDS] or ["cursor"]
        k = draw(st.sampled_from(int_keys))
        value = draw(
            st.sampled_from(
                [2**53 + 1, 2**63, 2**64, 10**30, -1, -(2**63) - 1, 1.5, 1e20, True, "5", "²", Raw("1e400")]
            )
        )
        body[k] = value
        refuse = None
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SAFE_INT and k in keys:
            refuse = f"integer {k}={value} past 2^53"
        return Mutated(body, f"int field {k}={value!r}", refuse)
    if kind == "too-large":
        if draw(st.sampled_from(range(4))) == 3:
            return Mutated(TOO_LARGE_BODY, "body over 1 MiB", "a body over the 1 MiB cap (413 TOO_LARGE)")
        return Mutated(body, "valid")
    if kind == "garbage":
        raw = draw(st.one_of(st.sampled_from(GARBAGE), st.binary(max_size=40)))
        return Mutated(raw, "garbage body")
    if kind == "non-object":
        return Mutated(
            draw(st.sampled_from([[], [1], "x", 1, None, True, [{"a": 1}], 1.5])), "non-object body"
        )
    return Mutated(body, "valid")


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


AUTH_VARIANTS = st.sampled_from(
    ["default"] * 24
    + ["none", "bad", "bad", "other", "admin", "scheme", "mangled", "huge", "empty", "latin1", "unicode"]
)


def auth_for(variant: str, default: Any) -> tuple[Any, str]:
    """(token or Ref, scheme prefix) for an auth variant."""
    if variant == "default":
        return default, "Bearer "
    if variant == "none":
        return None, ""
    if variant == "bad":
        return "mpr_not-a-real-token-0123456789abcdef", "Bearer "
    if variant == "other":
        return Ref("owner" if default != Ref("owner") else "reader"), "Bearer "
    if variant == "admin":
        return Ref("admin"), "Bearer "
    if variant == "scheme":
        return default, "Basic "
    if variant == "mangled":
        return Ref("mangled:" + (default.name if isinstance(default, Ref) else "owner")), "bearer  "
    if variant == "huge":
        return "t" * 8_000, "Bearer "  # under h11's 16 KiB header limit
    if variant == "empty":
        return "", "Bearer "
    if variant == "unicode":
        return "tok\ud800én😀\u0000", "Bearer "  # only in process: HTTP header values are latin-1
    return "tök\xe9n\xff", "Bearer "


PULL_QUERY_KEYS = ["cursor", "limit", "wait", "types", "subjects", "actors", "tiers", "origins", "horizons"]
PULL_QUERY_KEYS += ["sources", "since", "until", "text", "filter", "#env", "#", "bogus", "CURSOR", "cursor[]"]


@st.composite
def pull_query(draw: st.DrawFn, http: bool) -> tuple[list[tuple[str, Any]], str, str | None]:
    query: list[tuple[str, Any]] = []
    refuse = None
    label = "valid pull"
    n = draw(st.integers(0, 4))
    for _ in range(n):
        key = draw(st.sampled_from(PULL_QUERY_KEYS))
        if key in ("cursor", "limit", "wait"):
            choice = draw(st.sampled_from(["ok", "ok", "weird"]))
            if choice == "ok":
                value = str(draw(st.integers(0, 50 if key == "wait" else 12)))
                if key == "wait" and http:
                    value = "0"  # a real long poll would hold the connection: the HTTP fuzz never waits
                if key == "cursor" and draw(st.booleans()):
                    value = Ref("head_str")
            else:
                value = draw(st.sampled_from(WEIRD_INTS))
                label = f"{key}={value!r}"
                if key == "wait" and http and value.strip().isascii() and value.strip().isdigit():
                    value = value.strip() if int(value.strip()) > 50 else "0"
                if key == "wait" and http and weird_int_refusal(value):
                    value = "x"  # a non-ASCII digit accepted as N would hold the connection N seconds
                refuse = refuse or weird_int_refusal(value)
            query.append((key, value))
            continue
        if key == "filter":
            flt = draw(filters())
            text = draw(st.sampled_from(["obj", "obj", "garbage", "nan", "deep", "huge-text"]))
            if text == "garbage":
                query.append((key, draw(st.sampled_from(["{", "[]", "1", "null", "NaN", "{'a':1}"]))))
            elif text == "nan":
                query.append((key, '{"limit": NaN}'))
                refuse = refuse or "bare NaN in the filter query parameter"
            elif text == "deep":
                query.append((key, '{"types":' + "[" * 40 + "]" * 40 + "}"))
                refuse = refuse or "a filter nested more than 32 levels"
            elif text == "huge-text":
                query.append((key, json.dumps({"text": "q" * 300})))
                refuse = refuse or "a filter text longer than 256 characters"
            else:
                query.append((key, json.dumps(flt)))
            continue
        values = [RUN, "job-1", "human:you", "measured", "", ",", "é", "x" * 300]
        value = draw(st.sampled_from(values if http else [*values, "\udc80", "a\ud800"]))
        if key == "text" and len(value) > 256:
            refuse = refuse or "a filter text longer than 256 characters"
        query.append((key, value))
    if refuse and query:
        label = "pull " + ", ".join(f"{k}={str(v)[:20]!r}" for k, v in query)
    return query, label, refuse


RANDOM_PATHS = [
    "/mp/v0",
    "/mp/v0/",
    "/mp/v1/discover",
    "/discover",
    "/",
    "/mp/v0//monitors",
    "/mp/v0/monitors/",
    "/mp/v0/monitors/{mon}/",
    "/mp/v0/monitors/{mon}/observations/1",
    "/mp/v0/monitors/{mon}/nope",
    "/mp/v0/monitors/%2e%2e",
    "/mp/v0/monitors/..",
    "/mp/v0/monitors/é",
    "/mp/v0/monitors/" + "m" * 5000,
    "/mp/v0/subscriptions",
    "/mp/v0/subscriptions/{sub}/",
    "/mp/v0/subscriptions/{sub}/leases",
    "/mp/v0/subscriptions/{sub}/leases/steal",
    "/mp/v0/subscriptions/nope/pull",
    "/mp/v0/subscriptions/{sub}/pull/extra",
    "/mp/v0/admin",
    "/mp/v0/admin/compact/",
    "/mp/v0/rpc/",
    "/mp/v0/rpc/x",
    "/mp/v0/DISCOVER",
    "/mp/v0/monitors/{mon}/state;x",
    "/mp/v0/monitors/a b",
    "/mp/v0/monitors/\u0000",
    "/mp/v0/monitors/\ud800",
    "/mp/v0/monitors/\ud800/state",
    "/mp/v0/subscriptions/\udfff/pull",
    "/mp/v0/subscriptions/{sub}/leases/\ud800",
    "/mp/v0/\ud800",
]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


@st.composite
def rest_spec(draw: st.DrawFn, http: bool) -> Spec:
    key, method, path, body_strategy, default_auth, reason_class = draw(st.sampled_from(ROUTES))
    spec = Spec(method, PREFIX + path, key)
    variant = draw(AUTH_VARIANTS)
    if http and variant == "unicode":
        variant = "latin1"
    spec.auth, spec.auth_scheme = auth_for(variant, default_auth)
    if variant != "default":
        spec.label = f"auth {variant}"
    if body_strategy is not None:
        mutated = draw(mutate(draw(body_strategy), reason_class))
        spec.body = mutated.body
        if mutated.label != "valid":
            spec.label = mutated.label if spec.label == "valid" else f"{spec.label}; {mutated.label}"
        if key not in BODYLESS:
            spec.must_refuse = mutated.must_refuse
    if key == "pull":
        spec.query, qlabel, refuse = draw(pull_query(http))
        if qlabel != "valid pull":
            spec.label = qlabel
        spec.must_refuse = refuse
    if key == "admin-log":
        spec.query = draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["monitor", "from", "limit", "bogus"]),
                    st.one_of(st.just(Ref("mon")), st.sampled_from(["1", "5", *WEIRD_INTS])),
                ),
                max_size=3,
            )
        )
    # Route/method confusion: any method on any path, and paths that are not routes.
    twist = draw(st.sampled_from(["none"] * 14 + ["method", "path", "both", "query"]))
    if twist in ("method", "both"):
        spec.method = draw(st.sampled_from(METHODS))
        spec.label += f"; method {spec.method}"
        spec.must_refuse = None
    if twist in ("path", "both"):
        spec.path = draw(st.sampled_from(RANDOM_PATHS))
        if http:
            # Over the wire a path is bytes: lone surrogates go as their (invalid) UTF-8 percent-escapes.
            spec.path = quote(spec.path.encode("utf-8", "surrogatepass"), safe="/%{}")
        spec.label += f"; path {spec.path[:40]!r}"
        spec.route = f"path {spec.path[:40]!r}"
        spec.must_refuse = None
    if twist == "query":
        extra_keys = ["zzz", "cursor", "é", "", "a b"] + ([] if http else ["\udc80", "#\ud800"])
        spec.query = [*spec.query, (draw(st.sampled_from(extra_keys)), draw(TEXT))]
        spec.label += "; extra query"
        if key == "pull":
            spec.must_refuse = None  # a repeated or unknown pull key: refused anyway, but not our oracle
    if draw(st.sampled_from(range(40))) == 39:
        origins = ["http://evil.example", "null", "http://127.0.0.1"] + (
            [] if http else ["http://\ud800.example"]
        )
        spec.extra_headers["origin"] = draw(st.sampled_from(origins))
        spec.label += "; foreign Origin"
        spec.must_refuse = "an Origin the operator did not allow (403 ORIGIN_REFUSED)"
    elif draw(st.sampled_from(range(40))) == 39:
        spec.extra_headers["host"] = draw(
            st.sampled_from(["evil.example", "evil.example:80", "127.0.0.2.nip.io"])
        )
        spec.label += "; foreign Host"
        spec.must_refuse = "a Host that does not name this machine (403, DNS rebinding)"
    if draw(st.sampled_from(range(10))) == 9:
        spec.extra_headers["content-type"] = draw(
            st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "é"])
        )
    if http and spec.method == "GET" and "stream" in spec.path:
        spec.auth, spec.auth_scheme = "not-a-reader-token", "Bearer "  # a live stream would never end
    return spec


@st.composite
def rpc_call(draw: st.DrawFn) -> tuple[dict[str, Any], str, str | None]:
    """One JSON-RPC call object (maybe broken), its label, and the refusal it needs when sent alone."""
    method = draw(st.sampled_from([*RPC_METHODS, *RPC_METHODS, "monitors/nope", "", "rpc.discover"]))
    params: Any = draw(RPC_STRATEGIES[method]) if method in RPC_STRATEGIES else {}
    mutated = draw(mutate(params, RPC_REASON_CLASS.get(method)))
    params, label, refuse = mutated.body, f"{method}: {mutated.label}", mutated.must_refuse
    if isinstance(params, bytes):
        params = Raw(params.decode("latin-1"))  # garbage params text: the whole envelope is not JSON
    call: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    token = draw(st.sampled_from(["header", "header", "params", "params-bad", "none"]))
    if token.startswith("params") and isinstance(params, dict):
        params["token"] = (
            (Ref("owner") if method in RPC_OWNER_METHODS else Ref("reader")) if token == "params" else "bad"
        )
    envelope = draw(
        st.sampled_from(["ok"] * 8 + ["no-id", "id-weird", "bad-version", "bad-method", "no-params"])
    )
    if envelope != "no-id":
        call["id"] = draw(st.one_of(st.integers(0, 10**6), TEXT)) if envelope == "ok" else None
    if envelope == "id-weird":
        call["id"] = draw(st.sampled_from([None, 1.5, [1], {"a": 1}, True, "x" * 1000, 2**70]))
    elif envelope == "bad-version":
        call["jsonrpc"] = draw(st.sampled_from(["1.0", 2.0, None, ""]))
    elif envelope == "bad-method":
        call["method"] = draw(st.sampled_from([1, None, ["monitors/list"], {"m": 1}]))
    elif envelope == "no-params":
        del call["params"]
    if envelope != "ok":
        label += f"; envelope {envelope}"
        if envelope in ("no-id",):
            refuse = None  # a notification's refusal is silent: nothing to check
    return call, label, refuse


@st.composite
def rpc_spec(draw: st.DrawFn, http: bool) -> Spec:
    spec = Spec("POST", RPC_PATH, "rpc")
    header = draw(st.sampled_from(["owner", "reader", "none", "bad"] + ([] if http else ["unicode"])))
    tokens = {
        "owner": Ref("owner"),
        "reader": Ref("reader"),
        "none": None,
        "bad": "bad-token",
        "unicode": "t\ud800",
    }
    spec.auth = tokens[header]
    prefix = "auth unicode; " if header == "unicode" else ""
    shape = draw(st.sampled_from(["single"] * 6 + ["batch"] * 3 + ["big-batch", "garbage", "odd-batch"]))
    if shape == "single":
        call, label, refuse = draw(rpc_call())
        spec.body, spec.label, spec.must_refuse, spec.rpc_single = call, f"{prefix}rpc {label}", refuse, True
    elif shape == "batch":
        calls = draw(st.lists(rpc_call(), min_size=1, max_size=5))
        spec.body = [c for c, _, _ in calls]
        spec.label = prefix + "rpc batch [" + " | ".join(label for _, label, _ in calls) + "]"
    elif shape == "big-batch":
        n = draw(st.sampled_from([101, 150]))
        spec.body = [{"jsonrpc": "2.0", "method": "monitors/discover", "id": i} for i in range(n)]
        spec.label = f"rpc batch of {n} discover calls"
        spec.must_refuse = f"a JSON-RPC batch of {n} calls (at most 100)"
    elif shape == "garbage":
        spec.body = draw(st.sampled_from(GARBAGE))
        spec.label = "rpc garbage body"
    else:
        spec.body = draw(st.sampled_from([[], [1, "x", None], [[]], [{}], [{"jsonrpc": "2.0"}]]))
        spec.label = f"rpc odd batch {spec.body!r}"
    if isinstance(spec.body, bytes):
        spec.must_refuse = None
    return spec


def any_spec(http: bool) -> st.SearchStrategy[Spec]:
    return st.one_of(rest_spec(http), rest_spec(http), rest_spec(http), rpc_spec(http))


# ------------------------------------------------------------------------------------------ the world
class SetupFailed(AssertionError):
    pass


Sender = Callable[[Sent], tuple[int, bytes, list[str]]]


REFERENCE_SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "reference-schemas"


class SchemaCheck:
    """Whether the objects of a response validate against the project's schemas and the reference ones
    (skipped, and said so in the report, when ../shared/ is not beside the repository). A verdict is kept
    per distinct object: a pull serves the same observations again and again."""

    MAX_VERDICTS = 50_000

    def __init__(self) -> None:
        from monitor_protocol.core.schemas import validators

        self.sets: list[tuple[str, dict[str, Any]]] = [("project", validators())]
        if REFERENCE_SCHEMAS.is_dir():
            self.sets.append(("reference", validators(REFERENCE_SCHEMAS)))
        self.verdicts: dict[str, list[str]] = {}
        self.validated = 0

    def note(self) -> str:
        if len(self.sets) == 1:
            return f"\n  served objects checked against the project's schemas only: {REFERENCE_SCHEMAS} is absent"
        return (
            f"\n  served objects validated against the project's and the reference schemas: {self.validated}"
        )

    def problems(self, status: int, body: Any) -> list[str]:
        seen = Seen()
        if 200 <= status < 300:
            classify(body, seen)
        elif isinstance(body, dict) and "code" in body and "jsonrpc" not in body:
            seen.add("error", body)
        out: list[str] = []
        for key, item in seen.objects.items():
            verdict = self.verdicts.get(key)
            if verdict is None:
                verdict = []
                for label, vals in self.sets:
                    v = vals.get(item["kind"])
                    for e in list(v.iter_errors(item["obj"]))[:1] if v is not None else []:
                        path = "/".join(map(str, e.absolute_path)) or "<root>"
                        verdict.append(
                            f"served {item['kind']} fails the {label} schema at {path}: {e.message[:160]}"
                        )
                if len(self.verdicts) >= self.MAX_VERDICTS:
                    self.verdicts.clear()
                self.verdicts[key] = verdict
                self.validated += 1
            out.extend(verdict)
        return out


SCHEMAS: SchemaCheck | None = None


def schema_check() -> SchemaCheck:
    global SCHEMAS
    if SCHEMAS is None:
        SCHEMAS = SchemaCheck()
    return SCHEMAS


def exchange(send: Sender, sent: Sent, record: Callable) -> tuple[int, bytes, Any]:
    """Send one request, check its response and the objects it serves, record the problems; returns
    (status, raw, parsed body)."""
    status, raw, transport = send(sent)
    if transport:  # the connection failed or the encoder crashed: nothing more to check
        record(sent, status, raw, transport)
        return status, raw, None
    problems, parsed = check_response(sent, status, raw)
    if not problems:
        problems = schema_check().problems(status, parsed)
    record(sent, status, raw, problems)
    return status, raw, parsed


class World:
    """The live state the specs resolve against, built through the same `send` the fuzz uses.

    `send(Sent) -> (status, raw bytes, transport problems)`; each setup call's response is checked like
    any other."""

    def __init__(self, send: Sender, admin_token: str, record: Callable) -> None:
        self._send = send
        self.admin = admin_token
        self.record = record
        self.values: dict[str, Any] = {}
        self.generation = 0
        self._fresh = 0
        self.rebuilds = 0
        self.repairs = 0

    def call(self, method: str, path: str, body: Any = None, token: str | None = None, query=None) -> Any:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        raw = json.dumps(body).encode() if body is not None else b""
        sent = Sent(method, PREFIX + path, list(query or []), headers, raw, label="setup", route="setup")
        status, raw_reply, parsed = exchange(self._send, sent, self.record)
        return status, parsed

    def fresh(self, stem: str) -> str:
        self._fresh += 1
        return f"{stem}{self.generation}-{self._fresh}"

    def build(self) -> None:
        self.generation += 1
        g = self.generation
        v: dict[str, Any] = {"admin": self.admin}
        mon = f"fz-main-{g}"
        status, body = self.call(
            "POST",
            "/monitors",
            {
                "id": mon,
                "owner": "human:fuzz",
                "types": [RUN, OTHER],
                "capabilities": ["observe", "react", "act"],
                "visibility": "public",
            },
        )
        if status != 201:
            raise SetupFailed(f"cannot create the fuzz monitor: {status} {body}")
        v["mon"], v["owner"] = mon, body["owner_token"]
        for i, subject in enumerate(SUBJECTS):
            status, body = self.call(
                "POST",
                f"/monitors/{mon}/observations",
                {
                    "type": RUN,
                    "subject": subject,
                    "actor": "probe:ci",
                    "data": {"n": i},
                    "tags": {"env": "ci"},
                },
                v["owner"],
            )
            if status != 201:
                raise SetupFailed(f"cannot publish: {status} {body}")
        v["subscriber"] = f"agent:fz-reader-{g}"
        status, body = self.call(
            "POST",
            "/subscriptions",
            {"monitor": mon, "subscriber": v["subscriber"], "capabilities": ["observe", "react", "act"]},
            v["owner"],
        )
        if status != 201:
            raise SetupFailed(f"cannot subscribe: {status} {body}")
        v["sub"], v["reader"] = body["subscription"]["id"], body["token"]
        status, body = self.call(
            "POST", f"/subscriptions/{v['sub']}/leases/claim", {"subject": "job-1"}, v["reader"]
        )
        if status not in (200, 201):
            raise SetupFailed(f"cannot claim a lease: {status} {body}")
        smon = f"fz-shared-{g}"
        status, body = self.call(
            "POST",
            "/monitors",
            {
                "id": smon,
                "owner": "human:fuzz",
                "types": [RUN],
                "visibility": "shared",
                "capabilities": ["observe"],
            },
        )
        if status != 201 or not body.get("subscribe_token"):
            raise SetupFailed(f"cannot create the shared monitor: {status} {body}")
        v["smon"], v["sowner"], v["stoken"] = smon, body["owner_token"], body["subscribe_token"]
        # A scratch monitor for admin compaction (compacting the main log would move its floor).
        scratch = f"fz-scratch-{g}"
        status, body = self.call("POST", "/monitors", {"id": scratch, "owner": "human:fuzz", "types": [RUN]})
        if status != 201:
            raise SetupFailed(f"cannot create the scratch monitor: {status} {body}")
        v["scratch"] = scratch
        self.values = v
        self.refresh_head()

    def refresh_head(self) -> None:
        status, body = self.call("GET", f"/monitors/{self.values['mon']}", token=self.values["owner"])
        self.values["head"] = body.get("head", 1) if status == 200 and isinstance(body, dict) else 1

    def ensure(self) -> None:
        """Repair what a fuzzed request may have broken: resume a paused monitor, re-key the reader
        (re-subscribing with the owner's token renews it); rebuild when the monitor is retired or changed."""
        v = self.values
        if not v:
            self.build()
            return
        status, body = self.call("GET", f"/monitors/{v['mon']}", token=v["owner"])
        if status != 200 or not isinstance(body, dict):
            return self._rebuild()
        same = body.get("visibility") == "public" and body.get("types") == [RUN, OTHER]
        if not same or body.get("capabilities") != ["observe", "react", "act"]:
            return self._rebuild()
        if not body.get("active"):
            status, _ = self.call(
                "POST", f"/monitors/{v['mon']}/resume", {"reason": "fuzz repair"}, v["owner"]
            )
            if status != 200:
                return self._rebuild()
        v["head"] = body.get("head", v.get("head", 1))
        query = [("cursor", str(v["head"])), ("limit", "1")]  # a read-only replay: moves nothing
        status, _ = self.call("GET", f"/subscriptions/{v['sub']}/pull", token=v["reader"], query=query)
        if status in (200, 410):  # 410: compaction passed the cursor; the token still works
            return None
        self.repairs += 1
        status, body = self.call(
            "POST",
            "/subscriptions",
            {"monitor": v["mon"], "subscriber": v["subscriber"], "capabilities": ["observe", "react", "act"]},
            v["owner"],
        )
        if status != 201 or not isinstance(body, dict) or body["subscription"]["id"] != v["sub"]:
            return self._rebuild()
        v["reader"] = body["token"]
        return None

    def _rebuild(self) -> None:
        self.rebuilds += 1
        self.build()

    def lookup(self, name: str) -> Any:
        if name == "fresh":
            return self.fresh("fz-new-")
        if name == "fresh_subscriber":
            return self.fresh("agent:fz-new-")
        if name == "head_str":
            return str(self.values.get("head", 1))
        if name.startswith("mangled:"):
            token = str(self.values.get(name.split(":", 1)[1], "x"))
            return token[:-1] + ("A" if token[-1:] != "A" else "B") + "  "
        return self.values[name]

    def materialize(self, spec: Spec) -> Sent:
        path = spec.path.format_map(_Formatter(self.values))
        query = [(str(resolve(k, self.lookup)), str(resolve(v, self.lookup))) for k, v in spec.query]
        headers = dict(spec.extra_headers)
        if spec.auth is not None:
            token = resolve(spec.auth, self.lookup)
            headers["authorization"] = f"{spec.auth_scheme}{token}"
        body = spec.body
        if isinstance(body, bytes):
            raw = body
        elif body is None:
            raw = b""
        else:
            raw = dumps_raw(resolve(body, self.lookup)).encode("utf-8", "surrogatepass")
        return Sent(
            spec.method,
            path,
            query,
            headers,
            raw,
            label=spec.label,
            route=spec.route,
            must_refuse=spec.must_refuse,
            rpc_single=spec.rpc_single,
        )


class _Formatter(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


# ------------------------------------------------------------------------------------ failure collection
@dataclass
class Failure:
    signature: str
    problem: str
    sent: Sent
    status: int
    reply: bytes
    count: int = 1


class Collector:
    """Distinct failures, keyed by (problem, route, mutation class); the smallest request kept for each."""

    def __init__(self) -> None:
        self.failures: dict[str, Failure] = {}
        self.requests = 0
        self.statuses: dict[int, int] = {}

    @staticmethod
    def _problem_class(problem: str) -> str:
        problem = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", problem)
        problem = re.sub(r"\d+", "N", problem)
        return problem[:90]

    @staticmethod
    def _label_class(label: str) -> str:
        label = label.split(";")[0]
        label = re.sub(r"\(.*?\)|'[^']*'|\"[^\"]*\"|\d+", "…", label)
        return label[:40]

    def record(self, sent: Sent, status: int, reply: bytes, problems: list[str]) -> None:
        self.requests += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        for problem in problems:
            cause = self._label_class(sent.label)
            where = sent.route or sent.path
            # One cause (a bad token, a poison) breaking many routes is one failure; a valid-looking
            # request failing is a failure of its route.
            sig = f"{self._problem_class(problem)} | {cause}" + (
                f" | {where}" if cause.startswith(("valid", "rpc")) else ""
            )
            old = self.failures.get(sig)
            if old is None:
                self.failures[sig] = Failure(sig, problem, sent, status, reply)
            else:
                old.count += 1
                if len(sent.body) + len(sent.path) < len(old.sent.body) + len(old.sent.path):
                    old.sent, old.status, old.reply, old.problem = sent, status, reply, problem

    def report(self, title: str) -> str:
        lines = [f"{title}: {len(self.failures)} distinct failures in {self.requests} requests"]
        lines.append(f"  statuses: {dict(sorted(self.statuses.items()))}")
        for i, f in enumerate(sorted(self.failures.values(), key=lambda f: f.signature), 1):
            reply = f.reply if len(f.reply) < 500 else f.reply[:500] + b"..."
            lines.append(f"[{i}] x{f.count} {f.problem}")
            lines.append(f"    route: {f.sent.route}  mutation: {f.sent.label[:160]}")
            lines.append("    request: " + f.sent.describe())
            lines.append(f"    response: HTTP {f.status} {reply!r}")
        return "\n".join(lines).encode("utf-8", "backslashreplace").decode("utf-8")
