"""Python client for the Monitor Protocol REST binding (docs/protocol.md section 5), sync and async.

`Client` sends over its own keep-alive connections on plain sockets (keepalive.Pool: chosen by measurement),
or httpx where a proxy applies or a transport is given; `AsyncClient` under asyncio over its own keep-alive
connections as asyncio protocols (keepalive.AsyncPool), else on httpx. httpx is imported only where it is
used. On Pyodide (sys.platform "emscripten") the browser sends instead (webhttp.py): `Client` with a
synchronous XMLHttpRequest (in a Web Worker), `AsyncClient` with fetch.

    from monitor_protocol.client import Client

    with Client("http://127.0.0.1:8130") as mp:
        created = mp.create_monitor("ci", types=["com.example.ci.run"])
        mp.publish("ci", "com.example.ci.run", subject="build-1", token=created.owner_token)

Every route returns a small typed dataclass with the fields docs/protocol.md names and the whole JSON reply in
`.raw` (the admin routes return TypedDicts); the package ships a `py.typed` marker, so mypy and pyright check
calls and results.

A refusal the protocol defines raises a subclass of `MonitorProtocolError` named after its code
(`CursorBackwards` for CURSOR_BACKWARDS, `LeaseHeld`, `Unauthorized`, `NotFound`, ... see `ERROR_CLASSES`),
each with `.code`, `.message`, `.status`, `.extras` and `.retry_after`; `except MonitorProtocolError` catches
them all. A network failure raises `ConnectionFailed`, whose `sent` says whether the request may have reached
the server (`False`: it was certainly never sent, e.g. connection refused; `True`: the outcome is unknown,
e.g. a timeout or a reset after sending). Every request has a timeout; a long poll gets its `wait` plus a
margin on top.

`publish(..., retries=N)` retries safely: it sends an `idempotency_key` (a random one unless given) and
retries only on `ConnectionFailed` or a 503 `Unavailable` (storage trouble, with `Retry-After`), with
exponential backoff; a retry that finds the first attempt applied returns the first reply with
`idempotent=True`.

`Client` and `AsyncClient` share one description of the routes (`routes.Routes`): each route builds a typed
`Call[T]`; `clients.py` turns it into a `Client` method returning `T` and an `AsyncClient` coroutine
method returning `T`, with the same parameters and docstring. Every route here is an operation of the
operations table (`monitor_protocol.api.operations`, each operation naming its client methods) and every
operation has its method here: tests/test_operations.py checks both ways, method and route.
"""

from __future__ import annotations

from monitor_protocol.client.clients import AsyncClient, Client
from monitor_protocol.client.errors import (
    ERROR_CLASSES,
    CapabilityMissing,
    ConnectionFailed,
    CursorBackwards,
    CursorExpired,
    DeadLettered,
    Duplicate,
    EvidenceRequired,
    Invalid,
    InvalidFilter,
    LeaseHeld,
    LeaseLost,
    MonitorProtocolError,
    NotFound,
    OriginRefused,
    OverBudget,
    ProvenanceCeiling,
    TierNotAssertable,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnexpectedResponse,
    UnknownVocabulary,
    error_for,
)
from monitor_protocol.client.results import (
    AckResult,
    BatchItem,
    BatchPublished,
    CompactedLog,
    CompactReply,
    Discovery,
    LeaseDone,
    LeaseGranted,
    LogReply,
    Monitor,
    MonitorChanged,
    MonitorCreated,
    Published,
    PullResult,
    Renewed,
    Result,
    RpcError,
    RpcReply,
    SeekResult,
    SnapshotReply,
    State,
    Subscribed,
    Subscription,
    SubscriptionRetired,
)
from monitor_protocol.client.routes import DEFAULT_BASE

__all__ = [
    "DEFAULT_BASE",
    "ERROR_CLASSES",
    "AckResult",
    "BatchItem",
    "BatchPublished",
    "AsyncClient",
    "CapabilityMissing",
    "Client",
    "CompactReply",
    "CompactedLog",
    "ConnectionFailed",
    "CursorBackwards",
    "CursorExpired",
    "DeadLettered",
    "Discovery",
    "Duplicate",
    "EvidenceRequired",
    "Invalid",
    "InvalidFilter",
    "LeaseDone",
    "LeaseGranted",
    "LeaseHeld",
    "LeaseLost",
    "LogReply",
    "Monitor",
    "MonitorChanged",
    "MonitorCreated",
    "MonitorProtocolError",
    "NotFound",
    "OriginRefused",
    "OverBudget",
    "ProvenanceCeiling",
    "Published",
    "PullResult",
    "Renewed",
    "Result",
    "RpcError",
    "RpcReply",
    "SeekResult",
    "SnapshotReply",
    "State",
    "Subscribed",
    "Subscription",
    "SubscriptionRetired",
    "TierNotAssertable",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnexpectedResponse",
    "UnknownVocabulary",
    "error_for",
]
