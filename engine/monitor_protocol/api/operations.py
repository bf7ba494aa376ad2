"""Every operation of the protocol's API, declared once (docs/protocol.md sections 5 and 9).

Each `Operation` says, in one record: its HTTP method and route (below /mp/v0), its JSON-RPC method and MCP
tool (if any), its parameters (where they travel, their JSON Schema and the limits of vocab.py), the
credential it asks for, the JSON Schema of its success body (or the name of the project schema it is), the
`MonitorService` method it calls and the client methods that perform it. The doors are generated from this
table: the REST router's route list (api/rest.py), the JSON-RPC method map (api/jsonrpc.py), the MCP
tools (mcp_server.py) and the OpenAPI document (openapi.py); tests/test_operations.py proves the client
(client.py) matches it route for route.

Standard library only: the browser playground imports this module under Pyodide.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from monitor_protocol.core.vocab import (
    CAPABILITIES,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIMIT,
    FILTER_KEYS,
    HORIZONS,
    IDEMPOTENCY_KEY_MAX_CHARS,
    MAX_DEFINITION_BYTES,
    MAX_EVIDENCE_BYTES,
    MAX_FILTER_BYTES,
    MAX_FILTER_TEXT_CHARS,
    MAX_INTEGER,
    MAX_LEASE_SECONDS,
    MAX_LIMIT,
    MAX_NAME_CHARS,
    MAX_OUTCOME_CHARS,
    MAX_PUBLISH_BATCH,
    MAX_REASON_BYTES,
    MAX_RPC_BATCH,
    MAX_WAIT_SECONDS,
    MONITOR_ID_PATTERN,
    ORIGINS,
    PROTOCOLS,
    RESET_POLICIES,
    TIERS,
    TYPE_PATTERN,
    VERIFICATIONS,
    VISIBILITIES,
)

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


@dataclass(frozen=True)
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


# ---------------------------------------------------------------------------------------------- schemas


def _s(kind: str | list[str], text: str, **more: Any) -> Schema:
    return {"type": kind, "description": text, **more}


def _enum(values: Iterable[str], text: str) -> Schema:
    return {"type": "string", "enum": list(values), "description": text}


def _int(text: str, minimum: int = 0, maximum: int = MAX_INTEGER) -> Schema:
    """Every integer a parameter takes is bounded in its schema (the MCP door refuses it outside)."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": text}


def _obj(text: str, required: tuple[str, ...] = (), **props: Any) -> Schema:
    return {
        "type": "object",
        "description": text,
        "properties": props,
        "required": list(required),
        "additionalProperties": True,
    }


def _out(required: tuple[str, ...], **props: Any) -> Schema:
    schema = _obj("", required, **props)
    del schema["description"]
    return schema


def _undescribed(schema: Schema) -> Schema:
    return {k: v for k, v in schema.items() if k != "description"}


INT: Schema = {"type": "integer"}
STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
SEQ = _int("a seq (0..2^53)")
TOKEN_TEXT = "bearer token for this call (else taken from the MCP server's environment)"
MONITOR_ID = _s("string", "monitor id")
SUB_ID = _s("string", "subscription id (sub-...)")
SUBJECT = _s("string", "the work item the lease is about")
FILTER = _s(
    "object",
    "filter: types, sources, subjects, actors, tiers, origins, horizons, since, until, limit, text, #tags",
    additionalProperties=True,
)
CAP_LIST: Schema = {"type": "array", "items": {"type": "string", "enum": list(CAPABILITIES)}}
SEQ_OR_ID: Schema = {
    "anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": MAX_INTEGER}],
    "description": "a seq (0..2^53) or an observation id",
}
NAME_LIMIT: Mapping[str, Any] = {"maxLength": MAX_NAME_CHARS}  # ids, subjects, actors, types (section 10)
WHY = _s("string", "why")

# ---- output schemas: the top level of each reply; nested objects are named after the project schemas.

MONITOR_OUT = _obj(
    "a Monitor (schemas/monitor.json)",
    ("id", "version", "owner", "visibility"),
    id=STR,
    version=INT,
    owner=STR,
    visibility=STR,
    active=BOOL,
    head=INT,
)
OBSERVATION_OUT = _obj(
    "an observation, a CloudEvent (schemas/observation.json)", ("id", "type"), id=STR, type=STR
)
SUBSCRIPTION_OUT = _obj(
    "a Subscription (schemas/subscription.json)",
    ("id", "monitor", "subscriber", "cursor"),
    id=STR,
    monitor=STR,
    subscriber=STR,
    cursor=INT,
    capabilities={"type": "array", "items": STR},
)
LEASE_OUT = _obj("a Lease (schemas/lease.json)", ("subject",), subject=STR)
STATE_OUT = _out(
    ("monitor", "head", "live"),
    monitor=STR,
    head=INT,
    live=_obj("whether the monitor is live, and why not", ("value",), value=BOOL),
)
LEASE_DONE_OUT = _out(("ok", "seq"), ok=BOOL, seq=INT, dead_letter=BOOL, lease=LEASE_OUT)
BATCH_PUBLISHED_OUT = _out(
    ("monitor", "published", "refused", "results"),
    monitor=STR,
    published=INT,
    refused=INT,
    results={
        "type": "array",
        "items": {
            "anyOf": [
                _out(("index", "seq", "id"), index=INT, seq=INT, id=STR, idempotent=BOOL),
                _out(
                    ("index", "status", "error"),
                    index=INT,
                    status=INT,
                    error=_obj("the refusal, as a single publish's error body", ("code", "error")),
                ),
            ]
        },
    },
)
MONITOR_CHANGED_OUT = _out(("monitor", "seq"), monitor=MONITOR_OUT, seq=INT)
# The loose objects above stand for these project schemas (the OpenAPI document refers to the strict ones).
NAMED_OUTPUTS: dict[str, Schema] = {
    "monitor": MONITOR_OUT,
    "observation": OBSERVATION_OUT,
    "subscription": SUBSCRIPTION_OUT,
    "lease": LEASE_OUT,
    "state": STATE_OUT,
}
RPC_REPLY = _out(
    ("jsonrpc", "id"),
    jsonrpc={"const": "2.0"},
    id={"type": ["string", "integer", "null"]},
    result={"description": "the REST success body of the method"},
    error=_obj(
        "code -32000..-32018 (docs/protocol.md section 3), message, data: the REST error body",
        ("code", "message"),
        code=INT,
        message=STR,
        data={"type": "object"},
    ),
)
RPC_CALL = _out(
    ("jsonrpc", "method"),
    jsonrpc={"const": "2.0"},
    method=STR,
    params=_obj("the REST body plus the ids (id, subscription) and an optional token"),
    id={"type": ["string", "integer", "null"]},
)

# ---------------------------------------------------------------------------------------------- params


def path_monitor() -> Param:
    return Param("id", "path", MONITOR_ID, True, NAME_LIMIT, aliases=("id", "monitor"))


def path_subscription() -> Param:
    return Param("id", "path", SUB_ID, True, NAME_LIMIT, aliases=("subscription",))


def body(
    name: str,
    schema: Schema,
    required: bool = False,
    *,
    limits: Mapping[str, Any] | None = None,
    max_bytes: int | None = None,
    doors: frozenset[str] = ALL_DOORS,
) -> Param:
    return Param(name, "body", schema, required, dict(limits or {}), max_bytes, doors)


def query(
    name: str,
    schema: Schema,
    required: bool = False,
    *,
    limits: Mapping[str, Any] | None = None,
    doors: frozenset[str] = ALL_DOORS,
) -> Param:
    return Param(name, "query", schema, required, dict(limits or {}), None, doors)


def reason(text: str = "why", required: bool = False) -> Param:
    return body("reason", _s("string", text), required, max_bytes=MAX_REASON_BYTES)


PUBLISH_PARAMS: tuple[Param, ...] = (
    body(
        "type",
        _s("string", "observation type, reverse-DNS, declared in the monitor's types"),
        True,
        limits={**NAME_LIMIT, "pattern": TYPE_PATTERN.pattern},
    ),
    body("subject", _s("string", "what it is about (a work item)"), limits=NAME_LIMIT),
    body("data", _s("object", "the observation's own fields", additionalProperties=True)),
    body("tags", _s("object", "tags (addressing, P12)", additionalProperties=True)),
    body("actor", _s("string", "who caused it, e.g. agent:claude (default: the owner)"), limits=NAME_LIMIT),
    body("origin", _enum(ORIGINS, "declared origin (default: inferred from the actor)")),
    body("tier", _enum(TIERS, "how much it is worth believing (defaults never reach the top)")),
    body("verification", _enum(VERIFICATIONS, "verification level")),
    body(
        "on_behalf_of",
        _s(
            "string",
            "delegation: the monitor owner this actor acts for, e.g. human:you; "
            "lets an agent record a person's origin/tier on their behalf (P1)",
        ),
        limits=NAME_LIMIT,
    ),
    body("time", _s("string", "RFC 3339 time of the observation")),
    body("source_ref", _s("string", "reference in the source")),
    body("rule", _s("string", "the rule that produced it")),
    body(
        "wasDerivedFrom",
        {"type": "array", "items": SEQ_OR_ID, "description": "seqs or ids this was derived from"},
    ),
    body("supersedes", {**SEQ_OR_ID, "description": "the seq this observation corrects (P13)"}),
    body(
        "idempotency_key",
        _s(
            "string",
            "makes a retry safe: a repeat with the same key within 24 h returns the first reply (same seq, "
            "idempotent: true) and appends nothing. 1-128 printable ASCII characters",
            minLength=1,
            maxLength=IDEMPOTENCY_KEY_MAX_CHARS,
        ),
    ),
    Param(
        "Idempotency-Key",
        "header",
        _s("string", "the same as the body's idempotency_key"),
        limits={"minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX_CHARS},
        doors=REST_ONLY,
    ),
)

MONITOR_PARAMS: tuple[Param, ...] = (
    body(
        "id",
        _s("string", "monitor id, ^[\\w.-]{2,64}$"),
        True,
        limits={"pattern": MONITOR_ID_PATTERN.pattern},
    ),
    body("name", _s("string", "display name (default: the id)")),
    body("description", _s("string", "what is watched")),
    body("owner", _s("string", "owner actor, e.g. human:you"), limits=NAME_LIMIT),
    body(
        "types", {"type": "array", "items": {"type": "string"}, "description": "declared observation types"}
    ),
    body("capabilities", {**CAP_LIST, "description": "what readers may be granted"}),
    body("default_grant", {**CAP_LIST, "description": "granted to strangers (subset of capabilities)"}),
    body("visibility", _enum(VISIBILITIES, "who can read it")),
    body("horizon", _enum(HORIZONS, "how often it is expected to change")),
    body("source", _s("object", "{kind, ref, settings}", additionalProperties=True)),
    body("filter", FILTER, max_bytes=MAX_FILTER_BYTES),
    body("rules", _s("array", "mechanical rules")),
    body("ttl_seconds", _int("stale after this many seconds without an observation", 1)),
    body("retire_after_mute_seconds", _int("retire subscriptions that do not pull for this long", 1)),
    body("subscribe_token", _s("boolean", "mint a subscribe token")),
)

SUBSCRIBE_PARAMS: tuple[Param, ...] = (
    body("monitor", MONITOR_ID, True, limits=NAME_LIMIT),
    body("subscriber", _s("string", "your name, e.g. agent:triage"), True, limits=NAME_LIMIT),
    body("capabilities", {**CAP_LIST, "description": "asked capabilities (granted, not requested)"}),
    body("filter", FILTER, max_bytes=MAX_FILTER_BYTES),
    body(
        "from",
        {
            "anyOf": [
                {"type": "string", "enum": ["head", "earliest"]},
                {"type": "integer", "minimum": 0, "maximum": MAX_INTEGER},
            ],
            "description": "head, earliest or a seq (default: the beginning)",
        },
    ),
    body("protocol", _enum(PROTOCOLS, "delivery protocol")),
    body("reset_policy", _enum(RESET_POLICIES, "what happens when the cursor expires")),
    body("sink", _s("string", "push URL for protocol http"), limits=NAME_LIMIT),
    body("retire_after_mute_seconds", _int("retire when not pulled for this long", 1)),
    body(
        "sink_secret",
        _s("string", "protocol http: the webhook signing secret to use (whsec_...; default: one is minted)"),
        doors=frozenset(("rest", "jsonrpc")),
    ),
)

# REST spells an inline pull filter as query keys too (`types=a,b`, `#tag=v`); `limit` is the pull's own.
FILTER_QUERY_PARAMS: tuple[Param, ...] = tuple(
    query(
        key,
        _s("string", f"inline filter key {key} (lists comma-separated)"),
        limits={"maxLength": MAX_FILTER_TEXT_CHARS} if key == "text" else None,
        doors=REST_ONLY,
    )
    for key in FILTER_KEYS
    if key != "limit"
)

PULL_PARAMS: tuple[Param, ...] = (
    path_subscription(),
    query("cursor", _int("read-only replay from this seq (0..2^53)")),
    query("limit", _int(f"1..{MAX_LIMIT} (default {DEFAULT_LIMIT})", 1, MAX_LIMIT)),
    query(
        "wait",
        _int(f"long poll, whole seconds (0..{MAX_WAIT_SECONDS})", 0, MAX_WAIT_SECONDS),
        doors=frozenset(("rest", "mcp")),
    ),
    Param("filter", "query", FILTER, max_bytes=MAX_FILTER_BYTES),
    *FILTER_QUERY_PARAMS,
    # ack-and-pull: a GET never commits, so over REST `ack` travels only in the POST form (ACK_PULL_PARAMS);
    # the MCP tool stays read-only (an agent acks with monitor_ack)
    query(
        "ack",
        _int("acknowledge this cursor first (a previous pull's next), then pull, in one transaction"),
        doors=frozenset(("jsonrpc",)),
    ),
)
# POST /subscriptions/{id}/pull: the same pull with its parameters in the body, and `ack` among them.
ACK_PULL_PARAMS: tuple[Param, ...] = (
    path_subscription(),
    body("ack", _int("acknowledge this cursor first (a previous pull's next), then pull")),
    body("limit", _int(f"1..{MAX_LIMIT} (default {DEFAULT_LIMIT})", 1, MAX_LIMIT)),
    body("wait", _int(f"long poll, whole seconds (0..{MAX_WAIT_SECONDS})", 0, MAX_WAIT_SECONDS)),
    body("filter", FILTER, max_bytes=MAX_FILTER_BYTES),
)

LEASE_DURATION = body(
    "lease_duration_seconds",
    _int(f"lease length in seconds (default {DEFAULT_LEASE_SECONDS})", 1, MAX_LEASE_SECONDS),
)
LEASE_SUBJECT = body("subject", SUBJECT, True, limits=NAME_LIMIT)
NOTE = body("note", _s("string", "note"), max_bytes=MAX_REASON_BYTES)

PULL_RESULT = Result(
    _out(
        ("subscription", "monitor", "cursor", "head", "next", "observations"),
        subscription=STR,
        monitor=STR,
        cursor=INT,
        head=INT,
        lag=INT,
        retention_floor=INT,
        next=INT,
        redelivered=INT,
        observations={"type": "array", "items": OBSERVATION_OUT},
    )
)

# ---------------------------------------------------------------------------------------------- auth

PUBLIC = Auth("none")
VIEWER = Auth("none", required=False, also=("owner_token", "subscribe_token", "reader_token"))
OWNER = Auth("owner_token")
READER = Auth("reader_token")
ACTOR = Auth("reader_token", capability="act")
SUBSCRIBER = Auth("subscribe_token", required=False, also=("owner_token", "reader_token"))
REGISTRATION = Auth("registration", required=False)
ADMIN = Auth("admin")

# ---------------------------------------------------------------------------------------------- tools

READ = (True, False, True, False)
CONFIGURE_TOOL = McpTool(
    "monitor_configure",
    (False, True, False, False),
    (
        "Change a monitor (owner): update (with a patch), pause, resume or "
        "retire (final: retiring releases every lease). Every change is itself an observation."
    ),
    selector="action",
    selector_text="what to do",
)

# ---------------------------------------------------------------------------------------------- the table


def _configure(action: str, summary: str, params: tuple[Param, ...]) -> Operation:
    return Operation(
        f"{action}_monitor",
        "POST",
        f"/monitors/{{id}}/{action}",
        summary,
        OWNER,
        Result(MONITOR_CHANGED_OUT),
        "configure",
        ("id", "action", "body", "token"),
        (path_monitor(), *params),
        action=action,
        jsonrpc=f"monitors/{action}",
        mcp=CONFIGURE_TOOL,
        client=(f"{action}_monitor",),
    )


def _reader_op(
    name: str,
    action: str,
    summary: str,
    result: Schema,
    params: tuple[Param, ...],
    tool: McpTool,
    client: str,
    *,
    takes_body: bool = True,
) -> Operation:
    return Operation(
        name,
        "POST",
        f"/subscriptions/{{id}}/{action}",
        summary,
        READER,
        Result(result),
        name,
        ("id", "token", "body") if takes_body else ("id", "token"),
        (path_subscription(), *params),
        jsonrpc=f"feeds/{action}",
        mcp=tool,
        client=(client,),
    )


def _lease(
    action: str, tool: McpTool, summary: str, result: Schema, params: tuple[Param, ...], client: str
) -> Operation:
    claim = action == "claim"
    return Operation(
        f"lease_{action}",
        "POST",
        "/subscriptions/{id}/leases/{action}",
        summary,
        ACTOR,
        Result(result, status=201 if claim else 200, repeat_status=200 if claim else None),
        "lease",
        ("id", "token", "action", "body"),
        (path_subscription(), *params),
        action=action,
        jsonrpc=f"leases/{action}",
        mcp=tool,
        client=(client,),
    )


LEASE_RELEASE_PARAMS = (LEASE_SUBJECT, reason())

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "discover",
        "GET",
        "/discover",
        "What this server supports: versions, feeds, limits, extensions.",
        PUBLIC,
        Result(
            _out(
                ("supportedVersions", "capabilities", "limits"),
                supportedVersions={"type": "array", "items": STR},
                protocol=STR,
                capabilities=_obj("monitors, feeds, leases, extensions"),
                limits=_obj("max_limit, default_limit, max_wait_seconds, ..."),
                serverInfo=_obj("name, version, implementation"),
            )
        ),
        "discover",
        (),
        jsonrpc="monitors/discover",
        mcp=McpTool("monitor_discover", READ),
        client=("discover",),
    ),
    Operation(
        "create_monitor",
        "POST",
        "/monitors",
        "Create a monitor. The reply carries its owner token, shown once: keep it. An existing id is "
        "refused (DUPLICATE).",
        REGISTRATION,
        Result(
            _out(
                ("monitor", "owner_token"),
                monitor=MONITOR_OUT,
                owner_token=STR,
                subscribe_token={"type": ["string", "null"]},
                notice=STR,
            ),
            status=201,
        ),
        "create_monitor",
        ("body", "token"),
        MONITOR_PARAMS,
        jsonrpc="monitors/create",
        mcp=McpTool("monitor_create", (False, False, False, False)),
        client=("create_monitor",),
    ),
    Operation(
        "list_monitors",
        "GET",
        "/monitors",
        "Monitors this token may see (public ones without a token).",
        VIEWER,
        Result(_out(("monitors",), monitors={"type": "array", "items": MONITOR_OUT})),
        "list_monitors",
        ("token",),
        jsonrpc="monitors/list",
        mcp=McpTool("monitor_list", READ),
        client=("list_monitors",),
    ),
    Operation(
        "get_monitor",
        "GET",
        "/monitors/{id}",
        "One monitor's definition.",
        VIEWER,
        Result(_undescribed(MONITOR_OUT), ref="monitor"),
        "get_monitor",
        ("id", "token"),
        (path_monitor(),),
        jsonrpc="monitors/get",
        mcp=McpTool("monitor_get", READ),
        client=("get_monitor",),
    ),
    Operation(
        "state",
        "GET",
        "/monitors/{id}/state",
        "A monitor's computed state: head, live, counters, ages, confidence (with what it does not know).",
        VIEWER,
        Result(STATE_OUT, ref="state"),
        "state",
        ("id", "token"),
        (path_monitor(),),
        jsonrpc="monitors/state",
        mcp=McpTool("monitor_state", READ),
        client=("state",),
    ),
    _configure(
        "update",
        "Change a monitor's definition (version + 1; logged as configured{update, diff}).",
        (
            body(
                "patch",
                _s("object", "fields to change (update)", additionalProperties=True),
                max_bytes=MAX_DEFINITION_BYTES,
            ),
            reason("why (logged)"),
            body("rule", _s("string", "rule behind the change")),
        ),
    ),
    _configure(
        "pause", "Pause a monitor (publishing is refused until it resumes).", (reason("why (logged)"),)
    ),
    _configure("resume", "Resume a paused monitor.", (reason("why (logged)"),)),
    _configure("retire", "Retire a monitor (final: its leases are released).", (reason("why (logged)"),)),
    Operation(
        "publish",
        "POST",
        "/monitors/{id}/observations",
        "Append an observation (owner token). An agent acting for the owner sets "
        "actor to itself and on_behalf_of to the owner. Not idempotent unless you give an "
        "idempotency_key: then a retry returns the first reply and appends nothing. A JSON array body "
        f"(1..{MAX_PUBLISH_BATCH} observations) is a batch: each item is published in order, or refused "
        "and logged on its own, in one commit (an extension of this server, see discover).",
        OWNER,
        Result(
            _out(("observation", "seq"), observation=OBSERVATION_OUT, seq=INT, idempotent=BOOL),
            status=201,
            repeat_status=200,
            others=(
                (
                    207,
                    "a batch (JSON array body) was processed: one result per item, in order, each its seq "
                    "and id or its refusal (logged as a rejected row)",
                    BATCH_PUBLISHED_OUT,
                ),
            ),
        ),
        "publish",
        ("id", "body", "token"),
        (path_monitor(), *PUBLISH_PARAMS),
        jsonrpc="monitors/publish",
        mcp=McpTool("monitor_publish", (False, False, False, False)),
        client=("publish", "publish_many"),
        batch_max=MAX_PUBLISH_BATCH,
    ),
    Operation(
        "subscribe",
        "POST",
        "/subscriptions",
        "Subscribe to a monitor. The reply carries the reader token, shown once. Re-subscribing the "
        "same subscriber renews its token and keeps its cursor. protocol http makes the server push "
        "to the sink URL.",
        SUBSCRIBER,
        Result(
            _out(("subscription", "token"), subscription=SUBSCRIPTION_OUT, token=STR, notice=STR),
            status=201,
        ),
        "subscribe",
        ("body", "token"),
        SUBSCRIBE_PARAMS,
        jsonrpc="feeds/subscribe",
        mcp=McpTool("monitor_subscribe", (False, False, False, True)),
        client=("subscribe",),
    ),
    Operation(
        "get_subscription",
        "GET",
        "/subscriptions/{id}",
        "One subscription (retired ones too) with its lag.",
        READER,
        Result(_undescribed(SUBSCRIPTION_OUT), ref="subscription"),
        "subscription_info",
        ("id", "token"),
        (path_subscription(),),
        client=("get_subscription",),
    ),
    Operation(
        "pull",
        "GET",
        "/subscriptions/{id}/pull",
        "Read observations at the cursor. Without `ack` it never commits: call monitor_ack with "
        "`next` after handling them, or pass that `next` as `ack` to the next pull (ack-and-pull, one "
        "call). `wait` long-polls up to 50 s.",
        READER,
        PULL_RESULT,
        "pull",
        ("id", "token", "kw:cursor", "kw:limit", "kw:filter", "kw:ack"),
        PULL_PARAMS,
        jsonrpc="feeds/pull",
        mcp=McpTool(
            "monitor_pull",
            READ,
            "Read observations at the cursor. Read-only: it never commits, so call monitor_ack with "
            "`next` after handling them. `wait` long-polls up to 50 s.",
        ),
        client=("pull",),
    ),
    Operation(
        "ack_pull",
        "POST",
        "/subscriptions/{id}/pull",
        "Ack-and-pull in one call and one transaction: acknowledge `ack` (with /ack's rules), then pull "
        "from the new cursor. Without `ack` it is the same pull as the GET. An extension of this server "
        "(discover: capabilities.extensions): a client falls back to /ack then GET /pull elsewhere.",
        READER,
        PULL_RESULT,
        "pull",
        ("id", "token", "kw:limit", "kw:filter", "kw:ack"),
        ACK_PULL_PARAMS,
        client=("pull",),
    ),
    _reader_op(
        "ack",
        "ack",
        "Commit the cursor (the pull's `next`): cumulative, never backwards; the same ack again is "
        "idempotent.",
        _out(("subscription", "cursor"), subscription=STR, cursor=INT, head=INT, lag=INT),
        (body("cursor", {**SEQ, "description": "the next seq to deliver (0..2^53)"}, True),),
        McpTool("monitor_ack", (False, False, True, False)),
        "ack",
    ),
    _reader_op(
        "seek",
        "seek",
        "Move the cursor explicitly (the only way backwards), with a reason.",
        _out(("subscription", "cursor"), subscription=STR, cursor=INT),
        (
            body("cursor", {**SEQ, "description": "the new cursor (0..2^53)"}, True),
            reason("why (logged)", True),
        ),
        McpTool("monitor_seek", (False, False, True, False)),
        "seek",
    ),
    _reader_op(
        "renew",
        "renew",
        "Rotate the subscription's token (same cursor); the old one dies at once.",
        _out(("subscription", "token"), subscription=STR, token=STR, cursor=INT),
        (),
        McpTool("monitor_renew", (False, True, False, False)),
        "renew",
        takes_body=False,
    ),
    _reader_op(
        "retire_subscription",
        "retire",
        "Retire the subscription (its leases are released; subscribing again reactivates it).",
        _out(("ok", "subscription", "cursor_kept"), ok=BOOL, subscription=STR, seq=INT, cursor_kept=INT),
        (reason(),),
        McpTool("monitor_retire_subscription", (False, True, True, False)),
        "retire_subscription",
    ),
    Operation(
        "stream",
        "GET",
        "/subscriptions/{id}/stream",
        "Server-sent events: `id: <seq>`, `event: observation`, `data: <CloudEvent>`; a heartbeat every "
        "5 s; `Last-Event-ID` resumes. Never commits. Only a streaming door (mp serve) holds it open.",
        READER,
        Result(None, media="text/event-stream"),
        None,
        params=(
            path_subscription(),
            Param(
                "Last-Event-ID",
                "header",
                _s("string", "resume after this seq"),
                doors=REST_ONLY,
            ),
        ),
    ),
    _lease(
        "claim",
        McpTool("lease_claim", (False, False, True, False)),
        (
            "Claim exclusive, expiring ownership of a subject (needs act). The holder claiming again gets "
            "the same lease (idempotent: true)."
        ),
        _out(("lease", "expires"), lease=LEASE_OUT, expires=STR, idempotent=BOOL),
        (LEASE_SUBJECT, LEASE_DURATION, NOTE),
        "claim",
    ),
    _lease(
        "renew",
        McpTool("lease_renew", (False, False, False, False)),
        ("Extend a lease you hold."),
        _out(("lease", "expires"), lease=LEASE_OUT, expires=STR),
        (LEASE_SUBJECT, LEASE_DURATION),
        "renew_lease",
    ),
    _lease(
        "complete",
        McpTool("lease_complete", (False, False, True, False)),
        ("Finish a lease you hold with an outcome (the same complete again returns the first reply)."),
        LEASE_DONE_OUT,
        (
            LEASE_SUBJECT,
            body("outcome", _s("string", "e.g. fixed, done"), True, limits={"maxLength": MAX_OUTCOME_CHARS}),
            body("evidence", _s(["object", "array", "string"], "evidence"), max_bytes=MAX_EVIDENCE_BYTES),
            NOTE,
        ),
        "complete",
    ),
    _lease(
        "release",
        McpTool("lease_release", (False, False, True, False)),
        ("Give a held lease back (no attempt counted)."),
        LEASE_DONE_OUT,
        LEASE_RELEASE_PARAMS,
        "release",
    ),
    _lease(
        "reject",
        McpTool("lease_reject", (False, False, True, False)),
        ("Give a subject back as failed; it dead-letters at the delivery count limit."),
        LEASE_DONE_OUT,
        LEASE_RELEASE_PARAMS,
        "reject",
    ),
    Operation(
        "rpc",
        "POST",
        "/rpc",
        f"JSON-RPC 2.0, one call or a batch (at most {MAX_RPC_BATCH}): every operation that names a JSON-RPC method. "
        "The token is params.token, else the HTTP bearer.",
        Auth("none", required=False, also=("owner_token", "subscribe_token", "reader_token", "registration")),
        Result(
            {"anyOf": [RPC_REPLY, {"type": "array", "items": RPC_REPLY}]},
            others=((204, "only notifications were sent: no reply", None),),
        ),
        None,
        client=("rpc", "rpc_batch"),
        body_schema={
            "anyOf": [
                RPC_CALL,
                {"type": "array", "items": RPC_CALL, "minItems": 1, "maxItems": MAX_RPC_BATCH},
            ]
        },
    ),
    Operation(
        "admin_compact",
        "POST",
        "/admin/compact",
        "Compact a monitor's log (every monitor's without `monitor`) up to `upto_seq`. Only when the "
        "server runs with admin enabled.",
        ADMIN,
        Result(
            _out(
                ("ok", "compacted"),
                ok=BOOL,
                compacted={
                    "type": "array",
                    "items": _obj(
                        "one monitor's log after compaction",
                        ("monitor", "retention_floor", "removed"),
                        monitor=STR,
                        retention_floor=INT,
                        removed=INT,
                    ),
                },
            )
        ),
        "compact",
        ("arg:monitor", "arg:upto_seq"),
        (
            body("monitor", MONITOR_ID, limits=NAME_LIMIT),
            body("upto_seq", _int("compact the seqs up to this one", 1), True),
        ),
        client=("admin_compact",),
    ),
    Operation(
        "admin_snapshot",
        "GET",
        "/admin/snapshot",
        "Every monitor with its state, subscriptions and leases. Only when the server runs with admin enabled.",
        ADMIN,
        Result(
            _out(
                ("taken_at", "monitors"),
                taken_at=STR,
                monitors={
                    "type": "array",
                    "items": _obj(
                        "a monitor with its state, subscriptions and leases",
                        ("monitor",),
                        monitor=MONITOR_OUT,
                        state=STATE_OUT,
                        subscriptions={"type": "array", "items": SUBSCRIPTION_OUT},
                        leases={"type": "array", "items": LEASE_OUT},
                    ),
                },
            )
        ),
        "snapshot",
        (),
        client=("admin_snapshot",),
    ),
    Operation(
        "admin_log",
        "GET",
        "/admin/log",
        "The operator's view of a monitor's log: no subscription, no cursor, no commit. Only when the "
        "server runs with admin enabled.",
        ADMIN,
        Result(
            _out(
                ("monitor", "head", "retention_floor", "next", "observations"),
                monitor=STR,
                head=INT,
                retention_floor=INT,
                next=INT,
                observations={"type": "array", "items": OBSERVATION_OUT},
            )
        ),
        "read_log",
        ("arg:monitor", "arg:from", "arg:limit"),
        (
            query("monitor", MONITOR_ID, True, limits=NAME_LIMIT),
            query("from", _int("the first seq to read (default 1)")),
            query("limit", _int(f"1..{MAX_LIMIT} (default {DEFAULT_LIMIT})", 1, MAX_LIMIT)),
        ),
        client=("admin_log",),
    ),
)

BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}
BY_JSONRPC: dict[str, Operation] = {op.jsonrpc: op for op in OPERATIONS if op.jsonrpc}

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
        props[tool.selector] = _enum([op.action or "" for op in ops], tool.selector_text)
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
        props["token"] = _s("string", token_text(first.auth))
    schema = {"type": "object", "properties": props, "required": required}
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
