"""Every operation of the protocol's API, declared once (docs/protocol.md sections 5 and 9).

Each `Operation` says, in one record: its HTTP method and route (below /mp/v0), its JSON-RPC method and MCP
tool (if any), its parameters (where they travel, their JSON Schema and the limits of vocab.py), the
credential it asks for, the JSON Schema of its success body (or the name of the project schema it is), the
`MonitorService` method it calls and the client methods that perform it. The doors are generated from this
table: the REST router's route list (api/rest.py), the JSON-RPC method map (api/jsonrpc.py), the MCP
tools (doors/mcp/tools.py) and the OpenAPI document (openapi.py); tests/test_operations.py proves the client
(client/routes.py) matches it route for route. The records are in operation_types.py, the schemas, parameters and
credentials they share in operation_parts.py, the table itself in operation_table.py; this module is its face
and what the doors ask of it.

Standard library only: the browser playground imports this module under Pyodide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from monitor_protocol.api.operation_parts import NAMED_OUTPUTS, PUBLIC, TOKEN_TEXT, enum_of, typed
from monitor_protocol.api.operation_table import BY_JSONRPC, BY_NAME, OPERATIONS
from monitor_protocol.api.operation_types import (
    ALL_DOORS,
    REST_ONLY,
    Auth,
    Credential,
    Door,
    McpTool,
    Operation,
    Param,
    Result,
    Schema,
    Where,
)

__all__ = [
    "ALL_DOORS",
    "REST_ONLY",
    "Auth",
    "Credential",
    "Door",
    "McpTool",
    "Operation",
    "Param",
    "Result",
    "Schema",
    "Where",
    "NAMED_OUTPUTS",
    "PUBLIC",
    "OPERATIONS",
    "BY_NAME",
    "BY_JSONRPC",
    "ToolDef",
    "routes",
    "pick",
    "engine_args",
    "invoke",
    "token_text",
    "mcp_tools",
    "find",
]

# ---------------------------------------------------------------------------------------------- dispatch


def routes() -> list[tuple[str, str, tuple[Operation, ...]]]:
    """The distinct (method, route) pairs in table order, each with the operations it serves (one, or a
    family sharing an `{action}` route)."""
    grouped: dict[tuple[str, str], list[Operation]] = {}
    for op in OPERATIONS:
        grouped.setdefault((op.method, op.route), []).append(op)
    return [(method, route, tuple(ops)) for (method, route), ops in grouped.items()]


def pick(ops: tuple[Operation, ...], action: str | None) -> Operation:
    """The member of a route's family named by `action`; an unknown action keeps the first member, whose
    service call then refuses it in the engine's own words (as before the table existed)."""
    return next((op for op in ops if op.action == action), ops[0])


def engine_args(
    op: Operation,
    path: Mapping[str, Any],
    payload: Any,
    token: str | None,
    named: Mapping[str, Any] | None = None,
) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of `op.service`, from the path parameters, the request body,
    the caller's token and (for `kw:` arguments) named values."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for item in op.call:
        if item == "id":
            args.append(path["id"])
        elif item == "action":
            args.append(path.get("action", op.action))
        elif item == "body":
            args.append(payload)
        elif item == "token":
            args.append(token)
        elif item.startswith("arg:"):
            args.append((named or {}).get(item[4:]))
        elif item.startswith("kw:"):
            kwargs[item[3:]] = (named or {}).get(item[3:])
        else:  # a typo in the table must fail loudly at the first call, never silently drop an argument
            raise ValueError(f"operation {op.name}: unknown call item {item!r}")
    return args, kwargs


def invoke(
    service: Any,
    op: Operation,
    path: Mapping[str, Any],
    payload: Any,
    token: str | None,
    named: Mapping[str, Any] | None = None,
) -> Any:
    """Call `op.service` on `service` (a MonitorService, or anything with its signatures)."""
    if op.service is None:
        raise ValueError(f"operation {op.name} is answered by the door itself, not by the service")
    args, kwargs = engine_args(op, path, payload, token, named)
    return getattr(service, op.service)(*args, **kwargs)


# ---------------------------------------------------------------------------------------------- MCP


@dataclass(frozen=True)
class ToolDef:
    """One MCP tool as generated from its operations."""

    tool: McpTool
    ops: tuple[Operation, ...]
    input_schema: Schema
    output_schema: Schema
    required: tuple[str, ...]

    def op_for(self, arguments: Mapping[str, Any]) -> Operation | None:
        """The operation these arguments choose (None: the selector names none of them)."""
        if self.tool.selector is None:
            return self.ops[0]
        chosen = arguments.get(self.tool.selector)
        return next((op for op in self.ops if op.action == chosen), None)


def token_text(auth: Auth) -> str:
    if auth.credential == "registration":
        return "the server's registration token, when it requires one"
    if auth.credential == "subscribe_token":
        return "owner or subscribe token, or this subscription's token to re-key"
    return TOKEN_TEXT


def _tool_def(tool: McpTool, ops: tuple[Operation, ...]) -> ToolDef:
    first = ops[0]
    props: Schema = {}
    required: list[str] = []
    for p in first.path_params:
        props[p.argument] = p.schema
        required.append(p.argument)
    if tool.selector is not None:
        props[tool.selector] = enum_of([op.action or "" for op in ops], tool.selector_text)
        required.append(tool.selector)
    for op in ops:
        for p in op.params:
            if p.where != "path" and "mcp" in p.doors and p.name not in props:
                props[p.name] = p.schema
    for name in props:
        needed = [p.required for op in ops for p in op.params if p.name == name and p.where != "path"]
        if needed and all(needed) and len(needed) == len(ops) and name not in required:
            required.append(name)
    if first.auth.takes_token:
        props["token"] = typed("string", token_text(first.auth))
    # nothing else: a misspelt argument is refused by name (doors/mcp/tools.py), never dropped
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    output = first.result.schema or {"type": "object"}
    return ToolDef(tool, ops, schema, output, tuple(required))


def mcp_tools() -> list[ToolDef]:
    """Every MCP tool, in table order; operations sharing a tool are merged under its selector."""
    grouped: dict[str, list[Operation]] = {}
    tools: dict[str, McpTool] = {}
    for op in OPERATIONS:
        if op.mcp is not None:
            grouped.setdefault(op.mcp.name, []).append(op)
            tools[op.mcp.name] = op.mcp if op.mcp.description else replace(op.mcp, description=op.summary)
    return [_tool_def(tools[name], tuple(ops)) for name, ops in grouped.items()]


def find(service: str, action: str | None = None) -> Operation | None:
    """The operation calling `service` with `action`; an action outside a family route (`{action}`) gets
    the family's first member, so the route still carries it and the engine refuses it in its own words."""
    ops = [op for op in OPERATIONS if op.service == service]
    exact = next((op for op in ops if op.action == action), None)
    if exact is not None or action is None:
        return exact
    return next((op for op in ops if "{action}" in op.route), None)
