"""The parts the operations table is assembled from: JSON Schemas of parameters and replies, the parameters
shared by several operations, the credentials, and the MCP tools several operations share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from monitor_protocol.api.operation_types import ALL_DOORS, REST_ONLY, Auth, McpTool, Param, Result, Schema
from monitor_protocol.core.vocab import (
    CAPABILITIES,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIMIT,
    FILTER_KEYS,
    HORIZONS,
    IDEMPOTENCY_KEY_MAX_CHARS,
    MAX_FILTER_BYTES,
    MAX_FILTER_TEXT_CHARS,
    MAX_INTEGER,
    MAX_LEASE_SECONDS,
    MAX_LIMIT,
    MAX_NAME_CHARS,
    MAX_REASON_BYTES,
    MAX_WAIT_SECONDS,
    MONITOR_ID_REGEX,
    ORIGINS,
    PROTOCOLS,
    RESET_POLICIES,
    TIERS,
    TYPE_REGEX,
    VERIFICATIONS,
    VISIBILITIES,
)

# ---------------------------------------------------------------------------------------------- schemas


def typed(kind: str | list[str], text: str, **more: Any) -> Schema:
    return {"type": kind, "description": text, **more}


def enum_of(values: Iterable[str], text: str) -> Schema:
    return {"type": "string", "enum": list(values), "description": text}


def bounded_int(text: str, minimum: int = 0, maximum: int = MAX_INTEGER) -> Schema:
    """Every integer a parameter takes is bounded in its schema (the MCP door refuses it outside)."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": text}


def object_of(text: str, required: tuple[str, ...] = (), **props: Any) -> Schema:
    return {
        "type": "object",
        "description": text,
        "properties": props,
        "required": list(required),
        "additionalProperties": True,
    }


def reply_of(required: tuple[str, ...], **props: Any) -> Schema:
    schema = object_of("", required, **props)
    del schema["description"]
    return schema


def undescribed(schema: Schema) -> Schema:
    return {k: v for k, v in schema.items() if k != "description"}


INT: Schema = {"type": "integer"}
STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
SEQ = bounded_int("a seq (0..2^53)")
TOKEN_TEXT = "bearer token for this call (else taken from the MCP server's environment)"
MONITOR_ID = typed("string", "monitor id")
SUB_ID = typed("string", "subscription id (sub-...)")
SUBJECT = typed("string", "the work item the lease is about")
FILTER = typed(
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
WHY = typed("string", "why")

# ---- output schemas: the top level of each reply; nested objects are named after the project schemas.

MONITOR_OUT = object_of(
    "a Monitor (schemas/monitor.json)",
    ("id", "version", "owner", "visibility"),
    id=STR,
    version=INT,
    owner=STR,
    visibility=STR,
    active=BOOL,
    head=INT,
)
OBSERVATION_OUT = object_of(
    "an observation, a CloudEvent (schemas/observation.json)", ("id", "type"), id=STR, type=STR
)
SUBSCRIPTION_OUT = object_of(
    "a Subscription (schemas/subscription.json)",
    ("id", "monitor", "subscriber", "cursor"),
    id=STR,
    monitor=STR,
    subscriber=STR,
    cursor=INT,
    capabilities={"type": "array", "items": STR},
)
LEASE_OUT = object_of("a Lease (schemas/lease.json)", ("subject",), subject=STR)
STATE_OUT = reply_of(
    ("monitor", "head", "live"),
    monitor=STR,
    head=INT,
    live=object_of("whether the monitor is live, and why not", ("value",), value=BOOL),
)
LEASE_DONE_OUT = reply_of(("ok", "seq"), ok=BOOL, seq=INT, dead_letter=BOOL, lease=LEASE_OUT)
BATCH_PUBLISHED_OUT = reply_of(
    ("monitor", "published", "refused", "results"),
    monitor=STR,
    published=INT,
    refused=INT,
    results={
        "type": "array",
        "items": {
            "anyOf": [
                reply_of(("index", "seq", "id"), index=INT, seq=INT, id=STR, idempotent=BOOL),
                reply_of(
                    ("index", "status", "error"),
                    index=INT,
                    status=INT,
                    error=object_of("the refusal, as a single publish's error body", ("code", "error")),
                ),
            ]
        },
    },
)
MONITOR_CHANGED_OUT = reply_of(("monitor", "seq"), monitor=MONITOR_OUT, seq=INT)
# The loose objects above stand for these project schemas (the OpenAPI document refers to the strict ones).
NAMED_OUTPUTS: dict[str, Schema] = {
    "monitor": MONITOR_OUT,
    "observation": OBSERVATION_OUT,
    "subscription": SUBSCRIPTION_OUT,
    "lease": LEASE_OUT,
    "state": STATE_OUT,
}
RPC_REPLY = reply_of(
    ("jsonrpc", "id"),
    jsonrpc={"const": "2.0"},
    id={"type": ["string", "integer", "null"]},
    result={"description": "the REST success body of the method"},
    error=object_of(
        "code -32000..-32018 (docs/protocol.md section 3), message, data: the REST error body",
        ("code", "message"),
        code=INT,
        message=STR,
        data={"type": "object"},
    ),
)
RPC_CALL = reply_of(
    ("jsonrpc", "method"),
    jsonrpc={"const": "2.0"},
    method=STR,
    params=object_of("the REST body plus the ids (id, subscription) and an optional token"),
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
    return body("reason", typed("string", text), required, max_bytes=MAX_REASON_BYTES)


PUBLISH_PARAMS: tuple[Param, ...] = (
    body(
        "type",
        typed("string", "observation type, reverse-DNS, declared in the monitor's types"),
        True,
        limits={**NAME_LIMIT, "pattern": TYPE_REGEX},
    ),
    body("subject", typed("string", "what it is about (a work item)"), limits=NAME_LIMIT),
    body("data", typed("object", "the observation's own fields", additionalProperties=True)),
    body("tags", typed("object", "tags (addressing, P12)", additionalProperties=True)),
    body(
        "actor", typed("string", "who caused it, e.g. agent:claude (default: the owner)"), limits=NAME_LIMIT
    ),
    body("origin", enum_of(ORIGINS, "declared origin (default: inferred from the actor)")),
    body("tier", enum_of(TIERS, "how much it is worth believing (defaults never reach the top)")),
    body("verification", enum_of(VERIFICATIONS, "verification level")),
    body(
        "on_behalf_of",
        typed(
            "string",
            "delegation: the monitor owner this actor acts for, e.g. human:you; "
            "lets an agent record a person's origin/tier on their behalf (P1)",
        ),
        limits=NAME_LIMIT,
    ),
    body("time", typed("string", "RFC 3339 time of the observation")),
    body("source_ref", typed("string", "reference in the source")),
    body("rule", typed("string", "the rule that produced it")),
    body(
        "wasDerivedFrom",
        {"type": "array", "items": SEQ_OR_ID, "description": "seqs or ids this was derived from"},
    ),
    body("supersedes", {**SEQ_OR_ID, "description": "the seq this observation corrects (P13)"}),
    body(
        "idempotency_key",
        typed(
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
        typed("string", "the same as the body's idempotency_key"),
        limits={"minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX_CHARS},
        doors=REST_ONLY,
    ),
)

MONITOR_PARAMS: tuple[Param, ...] = (
    body(
        "id",
        typed("string", "monitor id, ^[\\w.-]{2,64}$"),
        True,
        limits={"pattern": MONITOR_ID_REGEX},
    ),
    body("name", typed("string", "display name (default: the id)")),
    body("description", typed("string", "what is watched")),
    body("owner", typed("string", "owner actor, e.g. human:you"), limits=NAME_LIMIT),
    body(
        "types", {"type": "array", "items": {"type": "string"}, "description": "declared observation types"}
    ),
    body("capabilities", {**CAP_LIST, "description": "what readers may be granted"}),
    body("default_grant", {**CAP_LIST, "description": "granted to strangers (subset of capabilities)"}),
    body("visibility", enum_of(VISIBILITIES, "who can read it")),
    body("horizon", enum_of(HORIZONS, "how often it is expected to change")),
    body("source", typed("object", "{kind, ref, settings}", additionalProperties=True)),
    body("filter", FILTER, max_bytes=MAX_FILTER_BYTES),
    body("rules", typed("array", "mechanical rules")),
    body("ttl_seconds", bounded_int("stale after this many seconds without an observation", 1)),
    body("retire_after_mute_seconds", bounded_int("retire subscriptions that do not pull for this long", 1)),
    body("subscribe_token", typed("boolean", "mint a subscribe token")),
)

SUBSCRIBE_PARAMS: tuple[Param, ...] = (
    body("monitor", MONITOR_ID, True, limits=NAME_LIMIT),
    body("subscriber", typed("string", "your name, e.g. agent:triage"), True, limits=NAME_LIMIT),
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
    body("protocol", enum_of(PROTOCOLS, "delivery protocol")),
    body("reset_policy", enum_of(RESET_POLICIES, "what happens when the cursor expires")),
    body("sink", typed("string", "push URL for protocol http"), limits=NAME_LIMIT),
    body("retire_after_mute_seconds", bounded_int("retire when not pulled for this long", 1)),
    body(
        "sink_secret",
        typed(
            "string", "protocol http: the webhook signing secret to use (whsec_...; default: one is minted)"
        ),
        doors=frozenset(("rest", "jsonrpc")),
    ),
)

# REST spells an inline pull filter as query keys too (`types=a,b`, `#tag=v`); `limit` is the pull's own.
FILTER_QUERY_PARAMS: tuple[Param, ...] = tuple(
    query(
        key,
        typed("string", f"inline filter key {key} (lists comma-separated)"),
        limits={"maxLength": MAX_FILTER_TEXT_CHARS} if key == "text" else None,
        doors=REST_ONLY,
    )
    for key in FILTER_KEYS
    if key != "limit"
)

PULL_PARAMS: tuple[Param, ...] = (
    path_subscription(),
    query("cursor", bounded_int("read-only replay from this seq (0..2^53)")),
    query("limit", bounded_int(f"1..{MAX_LIMIT} (default {DEFAULT_LIMIT})", 1, MAX_LIMIT)),
    query(
        "wait",
        bounded_int(f"long poll, whole seconds (0..{MAX_WAIT_SECONDS})", 0, MAX_WAIT_SECONDS),
        doors=frozenset(("rest", "mcp")),
    ),
    Param("filter", "query", FILTER, max_bytes=MAX_FILTER_BYTES),
    *FILTER_QUERY_PARAMS,
    # ack-and-pull: a GET never commits, so over REST `ack` travels only in the POST form (ACK_PULL_PARAMS);
    # the MCP tool stays read-only (an agent acks with monitor_ack)
    query(
        "ack",
        bounded_int("acknowledge this cursor first (a previous pull's next), then pull, in one transaction"),
        doors=frozenset(("jsonrpc",)),
    ),
)
# POST /subscriptions/{id}/pull: the same pull with its parameters in the body, and `ack` among them.
ACK_PULL_PARAMS: tuple[Param, ...] = (
    path_subscription(),
    body("ack", bounded_int("acknowledge this cursor first (a previous pull's next), then pull")),
    body("limit", bounded_int(f"1..{MAX_LIMIT} (default {DEFAULT_LIMIT})", 1, MAX_LIMIT)),
    body("wait", bounded_int(f"long poll, whole seconds (0..{MAX_WAIT_SECONDS})", 0, MAX_WAIT_SECONDS)),
    body("filter", FILTER, max_bytes=MAX_FILTER_BYTES),
)

LEASE_DURATION = body(
    "lease_duration_seconds",
    bounded_int(f"lease length in seconds (default {DEFAULT_LEASE_SECONDS})", 1, MAX_LEASE_SECONDS),
)
LEASE_SUBJECT = body("subject", SUBJECT, True, limits=NAME_LIMIT)
NOTE = body("note", typed("string", "note"), max_bytes=MAX_REASON_BYTES)

PULL_RESULT = Result(
    reply_of(
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
