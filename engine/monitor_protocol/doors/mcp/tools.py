"""The MCP door's tools, generated from the operations table (api/operations.py): name, description,
annotations, input schema (the operation's parameters), output schema and the backend method it calls. Only
monitor_pull has a hand-written runner (`_pull`: its `wait` is a long poll held by the backend)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types

from monitor_protocol.api import operations
from monitor_protocol.api.operations import Auth
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.validation import as_int
from monitor_protocol.core.vocab import DEFAULT_MAX_BODY
from monitor_protocol.doors.mcp.backends import (
    MAX_WAIT_SECONDS,
    OWNER_ENV,
    READER_ENV,
    VIEWER_ENV,
    ToolFailure,
    env_token,
)

log = logging.getLogger("monitor_protocol.mcp")


def env_roles(auth: Auth) -> tuple[str, ...]:
    """Where a tool finds its token when the agent leaves `token` out, by the credential it asks for."""
    if auth.credential in ("owner_token", "subscribe_token"):
        return OWNER_ENV
    if auth.credential == "reader_token":
        return READER_ENV
    return VIEWER_ENV


class ToolSpec:
    def __init__(
        self,
        name: str,
        description: str,
        properties: dict[str, Any],
        required: list[str],
        run: Callable[[Any, dict[str, Any]], Awaitable[Any]],
        *,
        output: dict[str, Any],
        hints: tuple[bool, bool, bool, bool],
        title: str | None = None,
        roles: tuple[str, ...] = VIEWER_ENV,
        credential: str = "none",
    ) -> None:
        from jsonschema import Draft202012Validator

        from monitor_protocol.core.schemas import ecma_validator_class

        self.name = name
        self.title = title or name.replace("_", " ")
        self.description = description
        self.schema = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,  # as operations.py makes every tool's
        }
        self.output = output
        self.run = run
        self.roles = roles  # the environment variables the token falls back to (for the hint, too)
        self.credential = credential
        self.read_only, self.destructive, self.idempotent, self.open_world = hints
        Draft202012Validator.check_schema(self.schema)
        Draft202012Validator.check_schema(self.output)
        self.validator = ecma_validator_class()(self.schema)  # patterns as the schema means them

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=self.schema,
            output_schema=self.output,
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=self.open_world,
            ),
        )

    def check(self, args: dict[str, Any]) -> None:
        """Refuse arguments outside the input schema (an unknown name, a type, a bound, a missing one) as
        400 INVALID, and arguments larger than a server takes as a request body (DEFAULT_MAX_BODY) as 413
        TOO_LARGE: an embedded server has no HTTP door to cap them."""
        from jsonschema.exceptions import best_match

        unknown = sorted(set(args) - set(self.schema["properties"]))
        if unknown:  # a misspelt `wait` would turn a long poll into a busy loop
            raise ProtocolError(
                "INVALID",
                f"{self.name}: unknown argument(s) {unknown}; this tool takes "
                f"{sorted(self.schema['properties'])}.",
                invalid=unknown,
            )
        error = best_match(self.validator.iter_errors(args))
        if error is not None:
            raise self._schema_refusal(error, args)
        properties = self.schema["properties"]
        for name, value in args.items():  # JSON Schema's integer takes 5.0, which some clients send for 5
            if value.__class__ is float and value.is_integer() and properties[name].get("type") == "integer":
                args[name] = int(value)
        wire.check(args)  # NaN, a lone surrogate: refused in the wire's words (the schema lets them by)
        size = len(wire.encode(args))
        if size > DEFAULT_MAX_BODY:
            raise ProtocolError(
                "TOO_LARGE",
                f"{self.name}: the arguments are {size} bytes as JSON, more than a server accepts in one "
                f"request ({DEFAULT_MAX_BODY} bytes); send less: keep a large payload elsewhere and send a "
                "link to it.",
                limit=DEFAULT_MAX_BODY,
            )

    def _schema_refusal(self, error: Any, args: dict[str, Any]) -> ProtocolError:
        field = ".".join(str(p) for p in error.absolute_path) or None
        if error.validator == "required":
            field = next((n for n in self.schema["required"] if n not in args), field)
        where = f"argument {field}" if field else "arguments"
        extras: dict[str, Any] = {"field": field} if field else {}
        bound = error.schema.get(error.validator) if isinstance(error.schema, dict) else None
        if error.validator in ("minimum", "maximum") and isinstance(bound, int):
            extras[error.validator] = bound
        return ProtocolError(
            "INVALID", f"{self.name}: {where}: {error.message}; see the tool's input schema.", **extras
        )


def _tok(args: dict[str, Any], roles: tuple[str, ...]) -> str | None:
    return args.get("token") or env_token(roles)


def _body(args: dict[str, Any], *drop: str) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k not in ("token", *drop) and v is not None}


def _need(args: dict[str, Any], *names: str) -> None:
    missing = [n for n in names if args.get(n) in (None, "")]
    if missing:
        raise ToolFailure(
            ProtocolError(
                "INVALID", f"missing argument(s): {', '.join(missing)}; see the tool's input schema"
            ).body()
        )


async def _pull(b: Any, a: dict[str, Any]) -> Any:
    _need(a, "subscription")
    try:  # (JSON Schema calls 5.0 an integer; the protocol's one integer rule does not)
        wait = as_int(a.get("wait") or 0, "wait", minimum=0, maximum=int(MAX_WAIT_SECONDS))
    except ProtocolError as err:  # named as the schema's refusals name their argument
        raise ProtocolError(err.code, f"monitor_pull: argument wait: {err.message}", field="wait") from None
    return await b.pull(
        a["subscription"],
        _tok(a, READER_ENV),
        cursor=a.get("cursor"),
        limit=a.get("limit"),
        wait=wait,
        filter=a.get("filter"),
    )


# A model reads every character of a tool's result: a page of 500 monitors is some 250 KB. The tool gives 50
# unless asked for more (up to the listing's 500), and `next` to go on.
MCP_LIST_DEFAULT = 50


async def _list(b: Any, a: dict[str, Any]) -> Any:
    limit = a.get("limit", MCP_LIST_DEFAULT)
    return await b.list_monitors(_tok(a, VIEWER_ENV), limit=limit, after=a.get("after"))


RUNNERS: dict[str, Callable[[Any, dict[str, Any]], Awaitable[Any]]] = {
    "monitor_pull": _pull,
    "monitor_list": _list,
}


def _choose(spec: operations.ToolDef, a: dict[str, Any]) -> operations.Operation:
    """The operation the arguments select; a selector naming none of the tool's operations is INVALID."""
    op = spec.op_for(a)
    if op is None:
        selector = spec.tool.selector or ""
        actions = ", ".join(o.action or "" for o in spec.ops)
        raise ToolFailure(
            ProtocolError("INVALID", f"{selector} is one of {actions}", invalid=a.get(selector)).body()
        )
    return op


def _runner(spec: operations.ToolDef) -> Callable[[Any, dict[str, Any]], Awaitable[Any]]:
    """Call the backend method of the chosen operation with the arguments the table says: path ids from
    their arguments, the rest as the body, the token from the argument or the environment."""
    ids = tuple(p.argument for p in spec.ops[0].path_params)
    drop = (*ids, spec.tool.selector) if spec.tool.selector else ids
    roles = env_roles(spec.ops[0].auth)

    async def run(b: Any, a: dict[str, Any]) -> Any:
        _need(a, *spec.required)
        op = _choose(spec, a)
        path = {p.name: a[p.argument] for p in op.path_params}
        return await b.perform(op, path, _body(a, *drop), _tok(a, roles))

    return run


def tool_specs() -> list[ToolSpec]:
    return [
        ToolSpec(
            spec.tool.name,
            spec.tool.description,
            spec.input_schema["properties"],
            list(spec.required),
            RUNNERS.get(spec.tool.name) or _runner(spec),
            output=spec.output_schema,
            hints=spec.tool.hints,
            roles=env_roles(spec.ops[0].auth),
            credential=spec.ops[0].auth.credential,
        )
        for spec in operations.mcp_tools()
    ]


# ---- the MCP door's hint for a missing or wrong credential

# extras["needs"] (the engine's word) -> how the sentence names it
NEEDS_LABELS = {
    "owner_token": "the owner token",
    "subscribe_token": "the owner or subscribe token",
    "reader_token": "the subscription's reader token",
    "registration_token": "the server's registration token",
    "admin_token": "the admin token",
}
# The credential a tool's operation asks for, as `needs` spells it (for sentences that do not say).
CREDENTIAL_NEEDS = {
    "owner_token": "owner_token",
    "subscribe_token": "subscribe_token",
    "reader_token": "reader_token",
    "registration": "registration_token",
    "admin": "admin_token",
}
# An HTTP door's way to send a token, in the engine's older sentences ("...: send Authorization: Bearer
# <owner_token>.") and the REST door's own hint ("... Send Authorization: Bearer <owner token>."): an MCP
# caller has no header to set, so it is taken out before the MCP hint goes in.
_HTTP_HINT_AFTER_STOP = re.compile(r"(?<=\.)\s*send authorization: bearer <[^>]*>\.?", re.IGNORECASE)
_HTTP_HINT = re.compile(r"\s*:?\s*\bsend authorization: bearer <[^>]*>\.?", re.IGNORECASE)


def without_http_hint(message: str) -> str:
    return _HTTP_HINT.sub(".", _HTTP_HINT_AFTER_STOP.sub("", message)).strip()


def tool_hint(body: dict[str, Any], spec: ToolSpec) -> dict[str, Any]:
    """The refusal body with an UNAUTHORIZED sentence telling an MCP caller how to pass the token: the
    tool's `token` argument or the MCP server's environment, never an HTTP header."""
    message = body.get("error")
    if body.get("code") != "UNAUTHORIZED" or not isinstance(message, str):
        return body
    stripped = without_http_hint(message)
    needs = body.get("needs")
    if not isinstance(needs, str) and stripped != message:
        needs = CREDENTIAL_NEEDS.get(spec.credential)  # an older sentence: the tool's own credential
    label = NEEDS_LABELS.get(needs) if isinstance(needs, str) else None
    if label is None:
        return {**body, "error": stripped}
    env = " (or ".join(spec.roles) + ")" * (len(spec.roles) - 1)
    hint = f"Pass {label} as this tool's `token` argument, or set {env} in the MCP server's environment."
    return {**body, "error": f"{stripped} {hint}"}
