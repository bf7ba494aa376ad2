"""The records the operations table is made of: a parameter (where it travels, its JSON Schema, its limits),
the credential an operation asks for, its success reply, its MCP tool, and the operation itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Door = Literal["rest", "jsonrpc", "mcp"]
Where = Literal["path", "query", "body", "header"]
# Which credential an operation asks for. "none": nothing (a token may still widen what is visible).
Credential = Literal["none", "owner_token", "subscribe_token", "reader_token", "registration", "admin"]
Schema = dict[str, Any]

ALL_DOORS: frozenset[str] = frozenset(("rest", "jsonrpc", "mcp"))
REST_ONLY: frozenset[str] = frozenset(("rest",))

# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Param:
    """One parameter. `schema` is what every door declares (the MCP door checks arguments against it before
    anything runs). `limits` are JSON Schema keywords the *engine* enforces (vocab.py): they are published in
    the OpenAPI document but not checked by a door, so a refused value still reaches the engine and is logged
    as a rejection where the monitor is known (P2)."""

    name: str
    where: Where
    schema: Schema
    required: bool = False
    limits: Mapping[str, Any] = field(default_factory=dict)
    max_bytes: int | None = None  # a bound on the UTF-8 / serialized size, which JSON Schema cannot say
    doors: frozenset[str] = ALL_DOORS
    # path parameters only: the names JSON-RPC params may give it, in order of preference; the first is the
    # MCP argument's name (`id` for a monitor, `subscription` for a subscription)
    aliases: tuple[str, ...] = ()

    @property
    def argument(self) -> str:
        """The name of this parameter as an MCP argument (and, for a path parameter, a JSON-RPC param)."""
        return self.aliases[0] if self.aliases else self.name


@dataclass(frozen=True)
class Auth:
    """The credential an operation asks for; `also` lists further tokens it accepts, and `required` is False
    where none is needed (a public monitor, a server without a registration token)."""

    credential: Credential
    required: bool = True
    also: tuple[Credential, ...] = ()
    capability: str | None = None  # the capability the credential's grant must hold ("act" for leases)

    @property
    def takes_token(self) -> bool:
        return self.credential != "none" or bool(self.also)


@dataclass(frozen=True)
class Result:
    """The success reply. `schema` is the JSON Schema of the body's top level (an MCP tool's outputSchema);
    `ref` names the project schema (schemas/<ref>.json) when the body is that object itself."""

    schema: Schema | None
    ref: str | None = None
    status: int = 200
    repeat_status: int | None = None  # the status when the reply says `idempotent: true` (a repeat)
    media: str = "application/json"
    # further success statuses, with what they mean and the JSON Schema of their body (None: no body)
    others: tuple[tuple[int, str, Schema | None], ...] = ()

    def status_for(self, body: Any) -> int:
        repeated = self.repeat_status is not None and isinstance(body, dict) and body.get("idempotent")
        return self.repeat_status if repeated and self.repeat_status is not None else self.status


@dataclass(frozen=True)
class McpTool:
    """An MCP tool. Several operations may share one tool (`monitor_configure`): its `selector` argument
    (an enum of their actions) chooses the operation."""

    name: str
    # (readOnly, destructive, idempotent, openWorld), as the tool truly is
    hints: tuple[bool, bool, bool, bool]
    # None: the operation's summary (said once, in the table); a tool several operations share says its own
    description: str | None = None
    selector: str | None = None
    selector_text: str = ""


@dataclass(frozen=True, kw_only=True)
class Operation:
    name: str  # also the OpenAPI operationId
    method: Literal["GET", "POST"]
    # below /mp/v0; `{action}` stands for `action`, so one route may serve a family (the lease actions)
    route: str
    summary: str
    auth: Auth
    result: Result
    # the MonitorService method, None when the door itself answers (the SSE stream, the JSON-RPC envelope)
    service: str | None
    # the service's arguments, in order: "id" (the path id), "action", "body" (the parsed request body),
    # "token" (the caller's bearer), "arg:<name>" (positional) and "kw:<name>" (keyword), read from the
    # named values a door passes (JSON-RPC params, query values)
    call: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    action: str | None = None
    jsonrpc: str | None = None
    mcp: McpTool | None = None
    client: tuple[str, ...] = ()  # the methods of client.Client / AsyncClient that perform it
    body_schema: Schema | None = None  # a request body that is not an object of `params` (JSON-RPC)
    batch_max: int | None = None  # REST: the body may also be an array of 1..batch_max such objects

    @property
    def path(self) -> str:
        """The route with `{action}` filled in: /subscriptions/{id}/leases/claim."""
        return self.route.replace("{action}", self.action) if self.action else self.route

    def params_in(self, where: Where, door: Door | None = None) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.where == where and (door is None or door in p.doors))

    @property
    def path_params(self) -> tuple[Param, ...]:
        return self.params_in("path")
