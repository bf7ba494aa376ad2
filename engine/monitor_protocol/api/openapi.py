"""The OpenAPI 3.1 document of the REST binding, generated from the operations table (operations.py).

`mp openapi` (or `python -m monitor_protocol openapi`) prints it. Success bodies that are one of the
project's objects refer to the project's own schemas (schemas/, embedded under components.schemas with their
`$ref`s rewritten), so the document is self-contained. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from monitor_protocol import __version__
from monitor_protocol.api.operations import NAMED_OUTPUTS, OPERATIONS, Operation, Param, Schema
from monitor_protocol.core.schemas import SCHEMA_BASE, load_schemas
from monitor_protocol.core.vocab import ERROR_STATUS, EXTENSION_ID, PROTOCOL_VERSION

PREFIX = "/mp/v0"
COMPONENTS = "#/components/schemas/"
SECURITY_SCHEME = "bearer"
CREDENTIAL_TEXT = {
    "none": "no token",
    "owner_token": "the monitor's owner token",
    "subscribe_token": "the monitor's subscribe token",
    "reader_token": "the subscription's reader token",
    "registration": "the server's registration token (only when the server requires one)",
    "admin": "the admin token (admin routes exist only when the server runs with admin enabled)",
}


# ---------------------------------------------------------------------------------------------- schemas


def _rewrite_refs(node: Any) -> Any:
    """A project schema as a component: its `$id`/`$schema` dropped (a `$id` would rebase `#` refs onto
    itself) and every `$ref` to a sibling schema pointed at that sibling's component."""
    if isinstance(node, list):
        return [_rewrite_refs(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$id", "$schema"):
            continue
        if key == "$ref" and isinstance(value, str) and value.startswith(SCHEMA_BASE):
            name, _, fragment = value[len(SCHEMA_BASE) :].partition("#")
            out[key] = COMPONENTS + name.removesuffix(".json") + fragment
        else:
            out[key] = _rewrite_refs(value)
    return out


def component_schemas() -> dict[str, Schema]:
    return {name: _rewrite_refs(schema) for name, schema in load_schemas().items()}


def _with_refs(schema: Any) -> Any:
    """A result schema whose loose stand-ins for project objects (operations.NAMED_OUTPUTS) become refs to
    the strict project schemas."""
    if isinstance(schema, list):
        return [_with_refs(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    for name, loose in NAMED_OUTPUTS.items():
        if schema == loose:
            return {"$ref": COMPONENTS + name}
    return {key: _with_refs(value) for key, value in schema.items()}


def _param_schema(param: Param) -> Schema:
    """The parameter's schema with the engine's limits (which the doors leave to the engine) written in."""
    schema: Schema = {**param.schema, **param.limits}
    if param.max_bytes is not None:
        text = schema.get("description", "")
        schema["description"] = f"{text} (at most {param.max_bytes} bytes)".strip()
    return schema


# ---------------------------------------------------------------------------------------------- operations


def _parameter(param: Param) -> dict[str, Any]:
    schema = _param_schema(param)
    out: dict[str, Any] = {
        "name": param.name,
        "in": param.where,
        "required": param.required or param.where == "path",
        "description": schema.pop("description", ""),
    }
    if param.where == "query" and schema.get("type") == "object":
        out["content"] = {"application/json": {"schema": schema}}  # a JSON object in one query value
    else:
        out["schema"] = schema
    return out


def _request_body(op: Operation) -> dict[str, Any] | None:
    if op.body_schema is not None:
        return {"required": True, "content": {"application/json": {"schema": op.body_schema}}}
    fields = op.params_in("body", "rest")
    if not fields:
        return None
    schema: Schema = {
        "type": "object",
        "properties": {p.name: _param_schema(p) for p in fields},
    }
    required = [p.name for p in fields if p.required]
    if required:
        schema["required"] = required
    if op.batch_max is not None:  # a batch: an array of such objects
        batch = {"type": "array", "items": schema, "minItems": 1, "maxItems": op.batch_max}
        return {"required": True, "content": {"application/json": {"schema": {"anyOf": [schema, batch]}}}}
    return {"required": bool(required), "content": {"application/json": {"schema": schema}}}


def _result_schema(op: Operation) -> Schema:
    if op.result.ref is not None:
        return {"$ref": COMPONENTS + op.result.ref}
    if op.result.schema is None:
        return {"type": "string", "description": "a stream of server-sent events"}
    schema: Schema = _with_refs(op.result.schema)
    return schema


def _responses(op: Operation) -> dict[str, Any]:
    content = {op.result.media: {"schema": _result_schema(op)}}
    responses: dict[str, Any] = {str(op.result.status): {"description": "success", "content": content}}
    if op.result.repeat_status is not None:
        responses[str(op.result.repeat_status)] = {
            "description": "a repeat: the first reply, `idempotent: true`, nothing changed",
            "content": content,
        }
    for status, text, schema in op.result.others:
        responses[str(status)] = {"description": text}
        if schema is not None:
            responses[str(status)]["content"] = {op.result.media: {"schema": _with_refs(schema)}}
    responses["default"] = {
        "description": "a refusal: {code, error, done, ...extras}, the status from the code "
        "(docs/protocol.md section 3)",
        "content": {"application/json": {"schema": {"$ref": COMPONENTS + "error"}}},
    }
    return responses


def _security(op: Operation) -> list[dict[str, list[str]]]:
    if not op.auth.takes_token:
        return []
    bearer: dict[str, list[str]] = {SECURITY_SCHEME: []}
    return [bearer] if op.auth.required else [{}, bearer]


def _auth_text(op: Operation) -> str:
    auth = op.auth
    words = [CREDENTIAL_TEXT[auth.credential]] + [CREDENTIAL_TEXT[c] for c in auth.also]
    text = "Credential: " + " or ".join(words) + ("" if auth.required else " (optional)")
    if auth.capability:
        text += f"; the grant must hold `{auth.capability}`"
    return text + "."


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary.split(". ")[0].rstrip(".") + ".",
        "description": f"{op.summary}\n\n{_auth_text(op)}",
        "tags": [op.route.strip("/").split("/")[0]],
    }
    extensions = {"x-jsonrpc-method": op.jsonrpc, "x-mcp-tool": op.mcp.name if op.mcp else None}
    out.update({k: v for k, v in extensions.items() if v})
    parameters = [_parameter(p) for p in op.params if p.where != "body" and "rest" in p.doors]
    if parameters:
        out["parameters"] = parameters
    body = _request_body(op)
    if body is not None:
        out["requestBody"] = body
    out["responses"] = _responses(op)
    out["security"] = _security(op)
    return out


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document: one path item per route (with `{action}` filled in), one operation each."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Monitor Protocol",
            "version": __version__,
            "summary": f"The Monitor Protocol v{PROTOCOL_VERSION} REST binding (MCP extension {EXTENSION_ID}).",
            "description": "Generated from monitor_protocol.api.operations, the single table every door is "
            "built from. Error codes and their statuses: "
            + ", ".join(f"{code} {status}" for code, status in ERROR_STATUS.items())
            + ".",
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": PREFIX, "description": "every route lives under /mp/v0"}],
        "paths": paths,
        "components": {
            "schemas": component_schemas(),
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Authorization: Bearer <token>; which token, each operation says.",
                }
            },
        },
    }


def dumps(doc: Mapping[str, Any] | None = None, indent: int | None = 2) -> str:
    return json.dumps(doc if doc is not None else document(), indent=indent, ensure_ascii=False)
