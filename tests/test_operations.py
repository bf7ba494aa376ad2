"""The operations table (monitor_protocol.api.operations) is the single source of every door: the REST router's
routes, the JSON-RPC methods, the MCP tools and the client's routes all come from it or are checked against
it, both ways. The OpenAPI document generated from it is valid, lists every route and describes what the
server really serves; and a refusal for a missing credential tells each caller how to send it over its own
transport (a bearer header over HTTP, a tool argument or the environment over MCP)."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from enginekit import Harness
from jsonschema import Draft202012Validator
from monitor_protocol import client
from monitor_protocol.api import jsonrpc, operations, rest
from monitor_protocol.api.messages import bearer_hint, with_bearer_hint
from monitor_protocol.api.openapi import document
from monitor_protocol.client import routes as client_routes
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.doors.mcp.backends import EmbeddedBackend
from monitor_protocol.doors.mcp.server import MonitorMCP
from monitor_protocol.doors.mcp.tools import tool_hint, tool_specs
from monitor_protocol.store.memory import MemoryStore
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from serverutil import mp_command, mp_env
from test_layout import imported_outside_stdlib

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

OPS = operations.OPERATIONS
# docs/protocol.md section 5: the JSON-RPC methods; section 9: the MCP tools.
SECTION_5_METHODS = {
    *(
        f"monitors/{m}"
        for m in (
            "discover",
            "list",
            "get",
            "create",
            "update",
            "pause",
            "resume",
            "retire",
            "state",
            "publish",
        )
    ),
    *(f"feeds/{m}" for m in ("subscribe", "pull", "ack", "seek", "renew", "retire")),
    *(f"leases/{m}" for m in ("claim", "renew", "complete", "release", "reject")),
}
SECTION_9_TOOLS = {
    "monitor_discover",
    "monitor_list",
    "monitor_get",
    "monitor_create",
    "monitor_configure",
    "monitor_publish",
    "monitor_state",
    "monitor_subscribe",
    "monitor_pull",
    "monitor_ack",
    "lease_claim",
    "lease_complete",
    "lease_release",
}


def concrete(path: str) -> re.Pattern[str]:
    """A route template as a regex on concrete paths: /monitors/{id}/state matches /monitors/ci/state."""
    return re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$")


# ---------------------------------------------------------------------------------------------- the table


def test_the_table_names_each_operation_once() -> None:
    names = [op.name for op in OPS]
    assert len(names) == len(set(names))
    keys = [(op.method, op.path) for op in OPS]
    assert len(keys) == len(set(keys)), "two operations on one method and path"
    for op in OPS:
        assert op.route.startswith("/") and not op.route.startswith("/mp/v0"), op.name
        assert all(p.name in op.route for p in op.path_params), op.name
        if op.service is not None:
            assert op.call or op.name in ("discover", "admin_snapshot"), op.name


def test_every_router_route_is_a_table_route_and_back() -> None:
    served = {(method, regex.pattern) for method, regex, _fn in rest._ROUTES}
    table = {
        (method, "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", route) + "$")
        for method, route, _ops in operations.routes()
    }
    assert served == table
    assert len(rest._ROUTES) == len(table)  # no route registered twice


def test_every_jsonrpc_method_is_a_table_operation_and_back() -> None:
    assert set(jsonrpc.METHODS) == set(operations.BY_JSONRPC) == SECTION_5_METHODS


def test_every_mcp_tool_is_generated_from_the_table() -> None:
    specs = {spec.name: spec for spec in tool_specs()}
    table = {op.mcp.name for op in OPS if op.mcp is not None}
    assert set(specs) == table and table >= SECTION_9_TOOLS
    for tool in operations.mcp_tools():
        spec = specs[tool.tool.name]
        assert spec.schema == tool.input_schema and spec.output == tool.output_schema
        assert spec.description == tool.tool.description
        assert (spec.read_only, spec.destructive, spec.idempotent, spec.open_world) == tool.tool.hints
        # every argument the tool takes is a parameter of its operations (or the token, or the selector)
        allowed = {p.argument for op in tool.ops for p in op.params if "mcp" in p.doors}
        assert set(spec.schema["properties"]) <= allowed | {"token", tool.tool.selector}, tool.tool.name


def test_a_tool_describes_only_what_its_arguments_can_say() -> None:
    """A tool's arguments are one object: monitor_publish says nothing of the REST route's array body (a
    batch), which the tool cannot take; the REST summary still does."""
    (tool,) = [t for t in operations.mcp_tools() if t.tool.name == "monitor_publish"]
    assert "array" not in (tool.tool.description or "") and "idempotency_key" in (tool.tool.description or "")
    assert "JSON array body" in operations.find("publish").summary  # positive control: REST has the batch


def test_configure_is_one_tool_over_four_operations() -> None:
    (tool,) = [t for t in operations.mcp_tools() if t.tool.name == "monitor_configure"]
    assert [op.name for op in tool.ops] == [
        "update_monitor",
        "pause_monitor",
        "resume_monitor",
        "retire_monitor",
    ]
    assert tool.input_schema["properties"]["action"]["enum"] == ["update", "pause", "resume", "retire"]
    assert tool.op_for({"action": "pause"}).path == "/monitors/{id}/pause"
    assert tool.op_for({"action": "explode"}) is None


class _FakeClient(client_routes.ClientBase):
    base = "http://example.invalid/mp/v0"
    token = None
    timeout = 10.0


def _sample(param: inspect.Parameter) -> Any:
    """A value of the parameter's annotated type, to build a route with."""
    text = str(param.annotation)
    if text.startswith("list"):
        return []
    if text.startswith("Iterable"):
        return [{"type": "com.example.x"}]
    if "Mapping" in text:
        return {}
    if text.startswith("int"):
        return 3
    return "x-1"


# Client methods that perform more than one operation, and the keyword arguments that choose each.
CHOSEN_BY: dict[tuple[str, str], dict[str, Any]] = {("ack_pull", "pull"): {"ack": 3}}


def _built_call(name: str, op: str = "") -> client_routes.Call[Any]:
    build = getattr(client_routes.Routes, name)
    params = list(inspect.signature(build).parameters.values())[1:]
    args = [
        _sample(p)
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return build(_FakeClient(), *args, **CHOSEN_BY.get((op, name), {}))


def test_every_table_operation_has_client_methods_on_its_route() -> None:
    for op in OPS:
        if op.result.media == "text/event-stream":
            # an SSE stream is not one JSON reply: the client follows by long poll (pull(wait=...), mp watch)
            assert op.client == (), op.name
            continue
        assert op.client, f"{op.name} has no client method"
        for name in op.client:
            assert callable(getattr(client.Client, name)) and callable(getattr(client.AsyncClient, name))
            call = _built_call(name, op.name)
            assert call.method == op.method, (op.name, name)
            assert concrete(op.path).match(call.path), (op.name, name, call.path)


def test_no_client_route_is_missing_from_the_table() -> None:
    claimed = {name for op in OPS for name in op.client}
    routes = {
        name
        for name, _ in inspect.getmembers(client_routes.Routes, inspect.isfunction)
        if not name.startswith("_") and name != "request"  # request: any route, raw
    }
    assert routes == claimed
    for name in routes:  # ... and both clients expose each
        assert hasattr(client.Client, name) and hasattr(client.AsyncClient, name), name


def test_the_table_and_its_documents_import_only_the_standard_library() -> None:
    # the playground imports the engine under Pyodide
    assert imported_outside_stdlib("monitor_protocol.api.operations", "monitor_protocol.api.openapi") == []


def test_engine_args_refuses_an_unknown_call_item() -> None:
    op = operations.Operation(
        name="x",
        method="GET",
        route="/x",
        summary="x",
        auth=operations.PUBLIC,
        result=operations.Result({}),
        service="x",
        call=("nope",),
    )
    with pytest.raises(ValueError, match="unknown call item"):
        operations.engine_args(op, {}, None, None)


# ---------------------------------------------------------------------------------------------- OpenAPI


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return document()


def test_openapi_document_is_valid(openapi: dict[str, Any]) -> None:
    assert openapi["openapi"] == "3.1.0"
    validate(openapi)  # openapi-spec-validator: the OpenAPI 3.1 meta-schema and its JSON Schema dialect
    for schema in openapi["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def test_openapi_document_lists_every_route(openapi: dict[str, Any]) -> None:
    listed = {(method.upper(), path) for path, item in openapi["paths"].items() for method in item}
    assert listed == {(op.method, op.path) for op in OPS}
    ids = [o["operationId"] for item in openapi["paths"].values() for o in item.values()]
    assert sorted(ids) == sorted(op.name for op in OPS)
    # every route the router serves answers at some documented path (the lease family at each action)
    for method, regex, _fn in rest._ROUTES:
        assert any(m.upper() == method and regex.match(re.sub(r"\{\w+\}", "x-1", p)) for m, p in listed), (
            regex.pattern
        )


def test_openapi_security_follows_the_table(openapi: dict[str, Any]) -> None:
    def security(op: operations.Operation) -> Any:
        return openapi["paths"][op.path][op.method.lower()]["security"]

    assert security(operations.BY_NAME["discover"]) == []
    assert security(operations.BY_NAME["publish"]) == [{"bearer": []}]
    assert security(operations.BY_NAME["get_monitor"]) == [{}, {"bearer": []}]
    assert security(operations.BY_NAME["admin_snapshot"]) == [{"bearer": []}]


def test_mp_openapi_prints_the_document(openapi: dict[str, Any]) -> None:
    ran = subprocess.run(
        mp_command("openapi"), capture_output=True, text=True, env=mp_env(), timeout=60, check=True
    )
    assert json.loads(ran.stdout) == json.loads(json.dumps(openapi))


class Served:
    """Validates each reply of a real engine (through the REST router) against the document's schema for
    its route and status."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.h = Harness(MemoryStore())
        self.doc = doc
        resource = Resource.from_contents(doc, default_specification=DRAFT202012)
        self.registry = Registry().with_resource("urn:openapi", resource)
        self.checked: set[str] = set()

    def __call__(self, op_name: str, status: int, *args: Any, **kwargs: Any) -> Any:
        op = operations.BY_NAME[op_name]
        reply = self.h.call(*args, **kwargs)
        assert reply.status == status, (op_name, reply.body)
        assert op.method == args[0] and concrete(op.path).match(args[1]), op_name
        pointer = "/".join(
            ["#", "paths", op.path.replace("~", "~0").replace("/", "~1"), op.method.lower(), "responses"]
            + [str(status), "content", "application~1json", "schema"]
        )
        validator = Draft202012Validator({"$ref": "urn:openapi" + pointer}, registry=self.registry)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(reply.body)]
        assert not errors, (op_name, errors[:5])
        self.checked.add(op_name)
        return reply.body


def test_openapi_results_describe_what_the_server_serves(openapi: dict[str, Any]) -> None:
    s = Served(openapi)
    s("discover", 200, "GET", "/discover")
    created = s(
        "create_monitor",
        201,
        "POST",
        "/monitors",
        {
            "id": "ci",
            "owner": "human:you",
            "types": ["com.example.ci.run"],
            "capabilities": ["observe", "act"],
        },
    )
    owner = created["owner_token"]
    s("list_monitors", 200, "GET", "/monitors", token=owner)
    s("get_monitor", 200, "GET", "/monitors/ci", token=owner)
    sub = s(
        "subscribe",
        201,
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:w", "capabilities": ["observe", "act"]},
        owner,
    )
    sid, reader = sub["subscription"]["id"], sub["token"]
    first = {"type": "com.example.ci.run", "subject": "b1", "idempotency_key": "k1"}
    s("publish", 201, "POST", "/monitors/ci/observations", first, owner)
    s("publish", 200, "POST", "/monitors/ci/observations", first, owner)
    s(
        "publish",
        201,
        "POST",
        "/monitors/ci/observations",
        {"type": "com.example.ci.run", "subject": "b2"},
        owner,
    )
    s("state", 200, "GET", "/monitors/ci/state", token=owner)
    s("get_subscription", 200, "GET", f"/subscriptions/{sid}", token=reader)
    pulled = s("pull", 200, "GET", f"/subscriptions/{sid}/pull", token=reader)
    s("ack", 200, "POST", f"/subscriptions/{sid}/ack", {"cursor": pulled["next"]}, reader)
    s("seek", 200, "POST", f"/subscriptions/{sid}/seek", {"cursor": 1, "reason": "again"}, reader)
    both = s("ack_pull", 200, "POST", f"/subscriptions/{sid}/pull", {"ack": 2, "limit": 1}, reader)
    assert both["cursor"] == 2 and [o["sequence"] for o in both["observations"]] == [f"{2:020d}"]
    lease = f"/subscriptions/{sid}/leases"
    s("lease_claim", 201, "POST", lease + "/claim", {"subject": "b1"}, reader)
    s("lease_claim", 200, "POST", lease + "/claim", {"subject": "b1"}, reader)
    s("lease_renew", 200, "POST", lease + "/renew", {"subject": "b1"}, reader)
    s("lease_complete", 200, "POST", lease + "/complete", {"subject": "b1", "outcome": "fixed"}, reader)
    s("lease_claim", 201, "POST", lease + "/claim", {"subject": "b2"}, reader)
    s("lease_release", 200, "POST", lease + "/release", {"subject": "b2"}, reader)
    s("lease_claim", 201, "POST", lease + "/claim", {"subject": "b2"}, reader)
    s("lease_reject", 200, "POST", lease + "/reject", {"subject": "b2", "reason": "no"}, reader)
    reader = s("renew", 200, "POST", f"/subscriptions/{sid}/renew", None, reader)["token"]
    s("retire_subscription", 200, "POST", f"/subscriptions/{sid}/retire", {}, reader)
    s("update_monitor", 200, "POST", "/monitors/ci/update", {"patch": {"name": "CI"}}, owner)
    s("pause_monitor", 200, "POST", "/monitors/ci/pause", {"reason": "m"}, owner)
    s("resume_monitor", 200, "POST", "/monitors/ci/resume", {"reason": "m"}, owner)
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "monitors/discover"}
    s("rpc", 200, "POST", "/rpc", rpc)
    s("rpc", 200, "POST", "/rpc", [rpc, {**rpc, "id": 2, "method": "monitors/get", "params": {"id": "ci"}}])
    admin = s.h.router.admin_token
    s("admin_snapshot", 200, "GET", "/admin/snapshot", token=admin)
    s("admin_log", 200, "GET", "/admin/log", token=admin, query=[("monitor", "ci")])
    s("admin_compact", 200, "POST", "/admin/compact", {"monitor": "ci", "upto_seq": 2}, admin)
    batch = [{"type": "com.example.ci.run", "subject": "b9"}, {"type": "com.example.nope"}]
    done = s("publish", 207, "POST", "/monitors/ci/observations", batch, owner)
    assert [sorted(r) for r in done["results"]] == [["id", "index", "seq"], ["error", "index", "status"]]
    s("retire_monitor", 200, "POST", "/monitors/ci/retire", {"reason": "done"}, owner)
    json_ops = {op.name for op in OPS if op.result.media == "application/json"}
    assert s.checked == json_ops


# ---------------------------------------------------------------------------------------------- hints

NEUTRAL = "This needs the monitor's owner token."


def test_the_http_hint_names_the_credential_once() -> None:
    err = ProtocolError("UNAUTHORIZED", NEUTRAL, needs="owner_token")
    hinted = with_bearer_hint(err)
    assert hinted.message == NEUTRAL + " Send Authorization: Bearer <owner token>."
    assert hinted.body()["error"] == hinted.message and hinted.body()["needs"] == "owner_token"
    assert err.message == NEUTRAL  # the engine's own error stays neutral
    assert bearer_hint(NEUTRAL, None) == NEUTRAL  # no credential named: nothing to add
    other = ProtocolError("NOT_FOUND", "No monitor 'x' here.", needs="owner_token")
    assert with_bearer_hint(other) is other


def _spec(name: str) -> Any:
    return next(s for s in tool_specs() if s.name == name)


def test_the_mcp_hint_names_a_tool_argument_and_the_environment() -> None:
    publish, pull = _spec("monitor_publish"), _spec("monitor_pull")
    body = {"code": "UNAUTHORIZED", "error": NEUTRAL, "done": [], "needs": "owner_token"}
    text = tool_hint(body, publish)["error"]
    assert text.startswith(NEUTRAL) and "`token` argument" in text and "MP_OWNER_TOKEN (or MP_TOKEN)" in text
    # the REST door's hint (a --base backend forwards the server's sentence) and an older engine sentence
    for message in (
        NEUTRAL + " Send Authorization: Bearer <owner token>.",
        "This needs the monitor's owner token: send Authorization: Bearer <owner_token>.",
    ):
        hinted = tool_hint({**body, "error": message}, publish)["error"]
        assert "Authorization" not in hinted and hinted.startswith(NEUTRAL), hinted
    older = {"code": "UNAUTHORIZED", "error": "send Authorization: Bearer <token>.", "done": []}
    assert "MP_READER_TOKEN (or MP_TOKEN)" in tool_hint(older, pull)["error"]  # the tool's own credential
    other = {"code": "NOT_FOUND", "error": "No monitor 'x' here.", "done": []}
    assert tool_hint(other, publish) == other


def test_a_rest_and_a_jsonrpc_401_say_authorization_bearer() -> None:
    h = Harness(MemoryStore())
    h.monitor("ci")
    refused = h.publish("ci", "not-the-owner-token")
    assert refused.status == 401 and refused.body["code"] == "UNAUTHORIZED"
    assert refused.body["error"].lower().count("authorization: bearer") == 1, refused.body
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "monitors/publish", "params": {"id": "ci", "type": "a.b"}}
    reply = h.call("POST", "/rpc", rpc, "not-the-owner-token").body
    assert reply["error"]["data"]["code"] == "UNAUTHORIZED"
    assert reply["error"]["message"].lower().count("authorization: bearer") == 1, reply
    assert reply["error"]["data"]["error"] == reply["error"]["message"]


async def _tool(mcp: MonitorMCP, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return await mcp._call_tool(None, types.CallToolRequestParams(name=name, arguments=arguments))


async def test_an_mcp_tool_error_does_not_say_authorization_bearer(tmp_path: Path) -> None:
    mcp = MonitorMCP(EmbeddedBackend(str(tmp_path / "mcp.db"), sweep_interval=0))
    await mcp.backend.start(mcp.monitor_changed)
    try:
        created = await _tool(mcp, "monitor_create", {"id": "ci", "types": ["com.example.ci.run"]})
        assert not created.is_error, created.content[0].text
        owner = created.structured_content["owner_token"]
        published = await _tool(
            mcp, "monitor_publish", {"id": "ci", "type": "com.example.ci.run", "token": "no"}
        )
        assert published.is_error and published.structured_content["code"] == "UNAUTHORIZED"
        text = published.content[0].text
        assert "authorization" not in text.lower(), text
        assert "`token` argument" in text and "MP_OWNER_TOKEN" in text, text
        sub = await _tool(
            mcp, "monitor_subscribe", {"monitor": "ci", "subscriber": "agent:r", "token": owner}
        )
        sid = sub.structured_content["subscription"]["id"]
        pulled = await _tool(mcp, "monitor_pull", {"subscription": sid, "token": "no"})
        assert pulled.is_error and "authorization" not in pulled.content[0].text.lower()
        assert "MP_READER_TOKEN" in pulled.structured_content["error"]
    finally:
        await mcp.backend.close()


async def test_an_mcp_wait_that_is_not_a_json_integer_names_its_argument(tmp_path: Path) -> None:
    """Found by a tester: `wait: 5.0` passed the schema (JSON Schema calls it an integer) and was refused
    by the engine's integer rule without `field`, where every other wrong type names its argument. A later
    tester: `limit: 5.0` and `ttl_seconds: 5.0` too. An integer argument written as a whole float is now
    the integer its schema says it is; a fraction is refused naming its argument."""
    mcp = MonitorMCP(EmbeddedBackend(str(tmp_path / "mcp.db"), sweep_interval=0))
    await mcp.backend.start(mcp.monitor_changed)
    try:
        made = await _tool(mcp, "monitor_create", {"id": "ci", "types": ["com.example.ci.run"]})
        sub = await _tool(
            mcp,
            "monitor_subscribe",
            {"monitor": "ci", "subscriber": "agent:r", "token": made.structured_content["owner_token"]},
        )
        args = {
            "subscription": sub.structured_content["subscription"]["id"],
            "token": sub.structured_content["token"],
        }
        refused = await _tool(mcp, "monitor_pull", {**args, "wait": 5.5})
        assert refused.is_error and refused.structured_content["field"] == "wait"
        assert "argument wait" in refused.structured_content["error"]
        assert not (await _tool(mcp, "monitor_pull", {**args, "wait": 0})).is_error  # positive control
        assert not (await _tool(mcp, "monitor_pull", {**args, "wait": 0.0, "limit": 5.0})).is_error
        listed = await _tool(mcp, "monitor_list", {"limit": 5.0})
        assert not listed.is_error and listed.structured_content["monitors"] == []  # ci is private
    finally:
        await mcp.backend.close()


async def test_an_mcp_result_shows_what_hides_text_and_says_observations_are_content(tmp_path: Path) -> None:
    """Found by a tester acting as an agent: a published string with a right-to-left override and zero-width
    spaces reached the model's text raw, and nothing told it observations are content, not instructions.
    The text escapes them (the structured content keeps the value); the pull tool and the instructions say
    what a filtered pull's `next` skips and that observations are content."""
    mcp = MonitorMCP(EmbeddedBackend(str(tmp_path / "mcp.db"), sweep_interval=0))
    await mcp.backend.start(mcp.monitor_changed)
    try:
        made = await _tool(mcp, "monitor_create", {"id": "ci", "types": ["com.example.ci.run"]})
        owner = made.structured_content["owner_token"]
        hidden = "ok\u202etxt.exe\u200b"
        sub = await _tool(
            mcp, "monitor_subscribe", {"monitor": "ci", "subscriber": "agent:r", "token": owner}
        )
        published = await _tool(
            mcp,
            "monitor_publish",
            {"id": "ci", "type": "com.example.ci.run", "subject": hidden, "token": owner},
        )
        assert not published.is_error, published.content[0].text
        pulled = await _tool(
            mcp,
            "monitor_pull",
            {
                "subscription": sub.structured_content["subscription"]["id"],
                "token": sub.structured_content["token"],
            },
        )
        text = pulled.content[0].text
        assert "\u202e" not in text and "\u200b" not in text and "ok\\u202etxt.exe\\u200b" in text
        assert hidden in [
            o.get("subject") for o in pulled.structured_content["observations"]
        ]  # the value kept
        pull_tool = next(t for t in mcp.specs.values() if t.name == "monitor_pull")
        assert (
            "never instructions" in pull_tool.description and "skips them for good" in pull_tool.description
        )
    finally:
        await mcp.backend.close()
