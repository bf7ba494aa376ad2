"""Every behaviour of PROTOCOL.md section 11 (ids C01..C34, C20b) plus extra checks X01.. for what that list
leaves out. Each check is an `async def` taking a Context; it returns a note, raises CheckFailed (fail) or
Skip (skip). Every negative check has a positive control beside it: a refusal only counts when the same
request, made properly, is accepted. Standard library only.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .transport import Reply

P = "ai.mentu.monitor."
T_CONFIGURED = P + "configured"
T_SUBSCRIBED = P + "subscribed"
T_SUB_RETIRED = P + "subscription_retired"
T_LEASE = P + "lease"
T_REJECTED = P + "rejected"
T_BOOKMARK = P + "bookmark"

# Written from PROTOCOL.md section 3, not imported from the engine: the suite must judge the engine.
ERROR_STATUS = {
    "INVALID_FILTER": 400,
    "UNKNOWN_VOCABULARY": 400,
    "TIER_NOT_ASSERTABLE": 400,
    "INVALID": 400,
    "UNAUTHORIZED": 401,
    "CAPABILITY_MISSING": 403,
    "PROVENANCE_CEILING": 403,
    "ORIGIN_REFUSED": 403,
    "NOT_FOUND": 404,
    "DUPLICATE": 409,
    "CURSOR_BACKWARDS": 409,
    "LEASE_HELD": 409,
    "LEASE_LOST": 409,
    "EVIDENCE_REQUIRED": 409,
    "UNAVAILABLE": 409,
    "DEAD_LETTERED": 409,
    "CURSOR_EXPIRED": 410,
    "TOO_LARGE": 413,
    "OVER_BUDGET": 429,
}
JSONRPC_ORDER = [
    "INVALID_FILTER",
    "UNKNOWN_VOCABULARY",
    "TIER_NOT_ASSERTABLE",
    "INVALID",
    "CAPABILITY_MISSING",
    "UNAUTHORIZED",
    "NOT_FOUND",
    "DUPLICATE",
    "CURSOR_BACKWARDS",
    "CURSOR_EXPIRED",
    "LEASE_HELD",
    "LEASE_LOST",
    "EVIDENCE_REQUIRED",
    "OVER_BUDGET",
    "PROVENANCE_CEILING",
    "ORIGIN_REFUSED",
    "TOO_LARGE",
    "UNAVAILABLE",
    "DEAD_LETTERED",
]
JSONRPC_CODE = {name: -32000 - i for i, name in enumerate(JSONRPC_ORDER)}
TIERS = ("src", "measured", "derived", "unverified", "falsified")
ORIGINS = ("human", "agent", "webhook", "probe", "system")
VERIFICATIONS = ("human_verified", "machine_verified", "certified", "reported", "unverified")
GAPS_ORDER = (
    "independence_unknown",
    "no_event_provenance",
    "single_actor",
    "stale_source",
    "no_subscribers",
    "unattested_origin",
)
TIME_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")

A = "com.example.conf.a"
B = "com.example.conf.b"
C = "com.example.conf.c"


class CheckFailed(AssertionError):
    """The server did not behave as PROTOCOL.md says."""


class Skip(Exception):
    """The check cannot run against this transport (say why)."""


def need(cond: Any, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def expect(reply: Reply, status: int, code: str | None = None, what: str = "") -> Any:
    """The reply must have `status` (and error `code`); returns its body."""
    ok = reply.status == status and (code is None or reply.get("code") == code)
    if not ok:
        want = f"{status} {code}" if code else str(status)
        raise CheckFailed(f"{what}: expected {want}, got {reply!r}")
    return reply.body


def seq_of(obs: dict[str, Any]) -> int:
    return int(obs["id"])


def payload(obs: dict[str, Any]) -> dict[str, Any]:
    data = obs.get("data") or {}
    p = data.get("payload")
    return p if isinstance(p, dict) else {}


@dataclass
class Monitor:
    id: str
    token: str
    body: dict[str, Any]
    subscribe_token: str | None = None
    reader: Sub | None = None


@dataclass
class Sub:
    id: str
    token: str
    body: dict[str, Any]
    monitor: Monitor


@dataclass
class Seen:
    """Objects received during the run, by kind, for C29 and X11."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # canonical json -> (kind, obj)
    errors: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def add(self, kind: str, obj: dict[str, Any]) -> None:
        key = kind + json.dumps(obj, sort_keys=True)
        if key not in self.objects:
            self.objects[key] = {"kind": kind, "obj": obj}

    def by_kind(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for item in self.objects.values():
            out.setdefault(item["kind"], []).append(item["obj"])
        return out


def classify(node: Any, seen: Seen) -> None:
    """Walk a reply body and record every protocol object in it (never inside a refused raw payload)."""
    if isinstance(node, list):
        for item in node:
            classify(item, seen)
        return
    if not isinstance(node, dict):
        return
    if "specversion" in node:
        seen.add("observation", node)
    elif "as_of" in node and "confidence" in node:
        seen.add("state", node)
    elif {"id", "horizon", "capabilities", "visibility", "owner"} <= node.keys():
        seen.add("monitor", node)
    elif (
        isinstance(node.get("id"), str)
        and node["id"].startswith("sub-")
        and "cursor" in node
        and "subscriber" in node
    ):
        seen.add("subscription", node)
    elif "lease_duration_seconds" in node and "holder" in node:
        seen.add("lease", node)
    for key, value in node.items():
        if key in ("raw", "before", "diff"):
            continue
        classify(value, seen)


class Context:
    """What every check gets: the transport, helpers that speak the protocol, and the record for C29."""

    def __init__(self, transport: Any, reference_schema_dir: str | None = None) -> None:
        self.t = transport
        self.reference_schema_dir = reference_schema_dir
        self.seen = Seen()
        self.run_id = secrets.token_hex(3)

    # -- plumbing ------------------------------------------------------------------------------------
    def record(self, reply: Reply) -> Reply:
        body = reply.body
        if reply.status >= 400 and isinstance(body, dict) and "code" in body:
            self.seen.errors.append((reply.status, body))
            self.seen.add("error", body)
            return reply
        items = body if isinstance(body, list) else [body]
        for item in items:
            if (
                isinstance(item, dict)
                and item.get("jsonrpc") == "2.0"
                and isinstance(item.get("error"), dict)
            ):
                data = item["error"].get("data")
                if isinstance(data, dict) and "code" in data:
                    self.seen.add("error", data)
                continue
            classify(item, self.seen)
        return reply

    async def req(self, method: str, path: str, **kw: Any) -> Reply:
        reply = await self.t.request(method, path, **kw)
        need(reply.status < 500, f"{method} {path} answered {reply.status} (never 500): {reply!r}")
        return self.record(reply)

    async def race(self, requests: list[dict[str, Any]]) -> list[Reply]:
        replies = await self.t.race(requests)
        for r in replies:
            self.record(r)
        return replies

    def uid(self, prefix: str) -> str:
        return f"{prefix}-{self.run_id}-{secrets.token_hex(3)}"

    # -- monitors --------------------------------------------------------------------------------------
    async def create(self, prefix: str = "m", **fields: Any) -> Monitor:
        body = {"id": self.uid(prefix), **fields}
        r = await self.req("POST", "/monitors", body=body, token=self.t.registration_token)
        b = expect(r, 201, what=f"create monitor {body['id']}")
        need(isinstance(b.get("owner_token"), str) and b["owner_token"], "create returns an owner_token")
        return Monitor(body["id"], b["owner_token"], b["monitor"], b.get("subscribe_token"))

    async def publish(self, m: Monitor, token: Any = ..., **body: Any) -> Reply:
        body.setdefault("type", A)
        return await self.req(
            "POST", f"/monitors/{m.id}/observations", body=body, token=m.token if token is ... else token
        )

    async def pub(self, m: Monitor, **body: Any) -> dict[str, Any]:
        b = expect(await self.publish(m, **body), 201, what=f"publish {body}")
        return b["observation"]

    async def get_monitor(self, m: Monitor) -> dict[str, Any]:
        return expect(await self.req("GET", f"/monitors/{m.id}", token=m.token), 200, what="get monitor")

    async def state(self, m: Monitor) -> dict[str, Any]:
        return expect(await self.req("GET", f"/monitors/{m.id}/state", token=m.token), 200, what="state")

    async def configure(self, m: Monitor, action: str, body: dict[str, Any] | None = None) -> Reply:
        return await self.req(
            "POST",
            f"/monitors/{m.id}/{action}",
            body=body or {"reason": f"conformance {action}"},
            token=m.token,
        )

    # -- subscriptions ---------------------------------------------------------------------------------
    async def subscribe(
        self, m: Monitor, subscriber: str | None = None, token: Any = ..., **body: Any
    ) -> Reply:
        body = {"monitor": m.id, "subscriber": subscriber or f"agent:{self.uid('r')}", **body}
        return await self.req("POST", "/subscriptions", body=body, token=m.token if token is ... else token)

    async def sub(self, m: Monitor, subscriber: str | None = None, token: Any = ..., **body: Any) -> Sub:
        r = await self.subscribe(m, subscriber, token, **body)
        b = expect(r, 201, what=f"subscribe to {m.id} {body}")
        need(isinstance(b.get("token"), str) and b["token"], "subscribe returns a reader token")
        return Sub(b["subscription"]["id"], b["token"], b["subscription"], m)

    async def pull(self, s: Sub, token: Any = ..., **query: Any) -> Reply:
        return await self.req(
            "GET", f"/subscriptions/{s.id}/pull", query=query, token=s.token if token is ... else token
        )

    async def pulled(self, s: Sub, **query: Any) -> dict[str, Any]:
        return expect(await self.pull(s, **query), 200, what=f"pull {query}")

    async def ack(self, s: Sub, cursor: Any, token: Any = ...) -> Reply:
        return await self.req(
            "POST",
            f"/subscriptions/{s.id}/ack",
            body={"cursor": cursor},
            token=s.token if token is ... else token,
        )

    async def catch_up(self, s: Sub) -> dict[str, Any]:
        """Pull and ack until nothing is left; returns the last ack body."""
        for _ in range(50):
            p = await self.pulled(s, limit=200)
            a = expect(await self.ack(s, p["next"]), 200, what="ack while catching up")
            if not p["observations"]:
                return a
        raise CheckFailed("could not catch up in 50 pulls")

    async def lease(self, s: Sub, action: str, token: Any = ..., **body: Any) -> Reply:
        return await self.req(
            "POST",
            f"/subscriptions/{s.id}/leases/{action}",
            body=body,
            token=s.token if token is ... else token,
        )

    async def log(self, m: Monitor) -> list[dict[str, Any]]:
        """The whole retained log of `m`, replayed read-only through an owner-token reader."""
        if m.reader is None:
            m.reader = await self.sub(m, f"agent:log-reader-{self.run_id}")
        out: list[dict[str, Any]] = []
        cursor = 0
        for _ in range(100):
            p = await self.pulled(m.reader, cursor=cursor, limit=200)
            if not p["observations"]:
                return out
            out.extend(p["observations"])
            cursor = p["next"]
        raise CheckFailed("log replay did not end")

    async def at(self, m: Monitor, seq: int) -> dict[str, Any]:
        for obs in await self.log(m):
            if seq_of(obs) == seq:
                return obs
        raise CheckFailed(f"seq {seq} is not in the log of {m.id}")


CheckFn = Callable[[Context], Awaitable[str | None]]


@dataclass
class Check:
    id: str
    title: str
    fn: CheckFn
    final: bool = False  # runs after every other check (it judges what the others received)


CHECKS: list[Check] = []


def check(cid: str, title: str, final: bool = False) -> Callable[[CheckFn], CheckFn]:
    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(cid, title, fn, final))
        return fn

    return deco


def need_rejected_seq(body: dict[str, Any], what: str) -> int:
    rs = body.get("rejected_seq")
    need(
        isinstance(rs, int) and not isinstance(rs, bool) and rs >= 1,
        f"{what}: no integer rejected_seq in {body}",
    )
    return rs


# ---- section 11 ----------------------------------------------------------------------------------------


@check("C01", "discover shape")
async def c01(ctx: Context) -> str:
    d = expect(await ctx.req("GET", "/discover"), 200, what="GET /discover")
    need(
        "0.1" in (d.get("supportedVersions") or []),
        f"supportedVersions lacks 0.1: {d.get('supportedVersions')}",
    )
    need("protocol" in d, "discover has no protocol")
    caps = d.get("capabilities") or {}
    need("monitors" in caps, "capabilities.monitors missing")
    feeds = caps.get("feeds") or {}
    need(all(k in feeds for k in ("pull", "http", "mcp", "sse")), f"capabilities.feeds lacks a door: {feeds}")
    need((caps.get("leases") or {}).get("delivery_count_limit") == 5, "leases.delivery_count_limit is not 5")
    ext = (caps.get("extensions") or {}).get("ai.mentu/monitors")
    need(
        isinstance(ext, dict) and "version" in ext,
        f"extension ai.mentu/monitors missing: {caps.get('extensions')}",
    )
    lim = d.get("limits") or {}
    need(
        lim.get("max_limit") == 200 and lim.get("default_limit") == 50 and lim.get("max_wait_seconds") == 50,
        f"limits wrong: {lim}",
    )
    si = d.get("serverInfo") or {}
    need(all(k in si for k in ("name", "version", "implementation")), f"serverInfo incomplete: {si}")
    need(isinstance(d.get("ttlMs"), int) and "cacheScope" in d, "ttlMs/cacheScope missing")
    return f"server {si.get('name')} {si.get('version')}"


@check("C02", "unknown filter key -> INVALID_FILTER with known_keys")
async def c02(ctx: Context) -> None:
    m = await ctx.create("c02")
    b = expect(
        await ctx.subscribe(m, filter={"colour": ["red"]}), 400, "INVALID_FILTER", "unknown filter key"
    )
    need("types" in (b.get("known_keys") or []), f"known_keys does not name 'types': {b}")
    expect(await ctx.subscribe(m, filter={"types": [A]}), 201, what="control: a known filter key")


@check("C03", "undeclared type -> INVALID_FILTER with known_types")
async def c03(ctx: Context) -> None:
    m = await ctx.create("c03", types=[A, B])
    b = expect(await ctx.subscribe(m, filter={"types": [C]}), 400, "INVALID_FILTER", "undeclared filter type")
    known = b.get("known_types") or []
    need(A in known and B in known, f"known_types does not list the declared types: {b}")
    expect(await ctx.subscribe(m, filter={"types": [B]}), 201, what="control: a declared type")


@check("C04", "agent asserting src -> TIER_NOT_ASSERTABLE")
async def c04(ctx: Context) -> None:
    m = await ctx.create("c04", owner="human:c04")
    b = expect(await ctx.publish(m, actor="agent:bot", tier="src"), 400, "TIER_NOT_ASSERTABLE", "agent src")
    need_rejected_seq(b, "TIER_NOT_ASSERTABLE")
    obs = await ctx.pub(m, tier="src")
    need(obs["tier"] == "src" and obs["origin"] == "human", f"control: the human owner's src: {obs}")


@check("C05", "pull does not advance the cursor")
async def c05(ctx: Context) -> None:
    m = await ctx.create("c05")
    for i in range(3):
        await ctx.pub(m, data={"i": i})
    s = await ctx.sub(m)
    p1 = await ctx.pulled(s)
    p2 = await ctx.pulled(s)
    seqs1 = [seq_of(o) for o in p1["observations"]]
    seqs2 = [seq_of(o) for o in p2["observations"]]
    need(len(seqs1) >= 3, f"first pull returned {seqs1}")
    need(seqs1 == seqs2, f"second pull differs: {seqs1} then {seqs2}")
    need(
        p1["cursor"] == p2["cursor"] == s.body["cursor"],
        f"cursor moved: {s.body['cursor']} {p1['cursor']} {p2['cursor']}",
    )
    a = expect(await ctx.ack(s, p1["next"]), 200, what="control: ack moves the cursor")
    need(a["cursor"] == p1["next"], f"ack cursor {a['cursor']} != next {p1['next']}")
    p3 = await ctx.pulled(s)
    need(p3["cursor"] == p1["next"], f"after ack the pull cursor is {p3['cursor']}")


@check("C06", "ack below is CURSOR_BACKWARDS, equal is idempotent")
async def c06(ctx: Context) -> None:
    m = await ctx.create("c06")
    for _ in range(3):
        await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    nxt = p["next"]
    a1 = expect(await ctx.ack(s, nxt), 200, what="forward ack")
    b = expect(await ctx.ack(s, nxt - 2), 409, "CURSOR_BACKWARDS", "ack below")
    need(
        b.get("cursor") == nxt and b.get("requested") == nxt - 2 and isinstance(b.get("head"), int),
        f"extras: {b}",
    )
    a2 = expect(await ctx.ack(s, nxt), 200, what="equal ack")
    need(a2["cursor"] == a1["cursor"] == nxt, f"equal ack changed the cursor: {a1} {a2}")
    p2 = await ctx.pulled(s)
    need(p2["cursor"] == nxt, f"the refused backwards ack moved the cursor to {p2['cursor']}")


@check("C07", "a narrow filter still reports the real head")
async def c07(ctx: Context) -> None:
    m = await ctx.create("c07")
    s = await ctx.sub(m, filter={"types": [A]})
    await ctx.pub(m, type=A)
    for _ in range(3):
        await ctx.pub(m, type=B)
    head = (await ctx.get_monitor(m))["head"]
    p = await ctx.pulled(s)
    need(
        [o["type"] for o in p["observations"]] == [A],
        f"filter let through {[o['type'] for o in p['observations']]}",
    )
    need(p["head"] == head, f"pull head {p['head']} != monitor head {head}")
    a = expect(await ctx.ack(s, p["next"]), 200, what="ack")
    need(a["head"] == head, f"ack head {a['head']} != monitor head {head}")
    need(a["lag"] == 0, f"caught-up filtered reader has lag {a['lag']}")


@check("C08", "an inline pull filter narrows and never widens")
async def c08(ctx: Context) -> None:
    m = await ctx.create("c08")
    s = await ctx.sub(m, filter={"types": [A, B]})
    await ctx.pub(m, type=A)
    await ctx.pub(m, type=B)
    await ctx.pub(m, type=C)
    plain = {o["type"] for o in (await ctx.pulled(s))["observations"]}
    need(plain == {A, B}, f"control: the subscription filter alone gives {plain}")
    narrowed = [o["type"] for o in (await ctx.pulled(s, types=A))["observations"]]
    need(narrowed == [A], f"inline types={A} gave {narrowed}")
    widened = [o["type"] for o in (await ctx.pulled(s, types=C))["observations"]]
    need(C not in widened, f"inline types={C} widened the subscription's filter: {widened}")
    p = await ctx.pulled(s)
    need(p["cursor"] == s.body["cursor"], "an inline-filtered pull moved the cursor")


@check("C09", "every observation is a valid CloudEvent with the extensions")
async def c09(ctx: Context) -> None:
    m = await ctx.create("c09", horizon="minute")
    await ctx.pub(
        m,
        type="com.example.ci.run",
        subject="build-412",
        actor="probe:ci",
        data={"status": "failed"},
        tags={"env": "ci"},
    )
    log = await ctx.log(m)
    need(len(log) >= 2, f"log too short: {log}")
    for o in log:
        where = f"seq {o.get('id')} ({o.get('type')})"
        need(o.get("specversion") == "1.0", f"{where}: specversion {o.get('specversion')}")
        need(
            isinstance(o.get("id"), str) and o["id"].isdigit() and o["id"] == str(int(o["id"])),
            f"{where}: id",
        )
        need(o.get("source") == f"monitor:{m.id}", f"{where}: source {o.get('source')}")
        need(
            TIME_MS.match(o.get("time") or ""), f"{where}: time {o.get('time')!r} is not RFC 3339 UTC with ms"
        )
        need(o.get("datacontenttype") == "application/json", f"{where}: datacontenttype")
        need(
            o.get("tier") in TIERS and o.get("origin") in ORIGINS and o.get("verified") in VERIFICATIONS,
            where,
        )
        need(o.get("horizon") == "minute", f"{where}: horizon {o.get('horizon')} is not the monitor's (P8)")
        need(isinstance(o.get("actor"), str) and ":" in o["actor"], f"{where}: actor {o.get('actor')}")
        prov = (o.get("data") or {}).get("provenance") or {}
        need(
            prov.get("origin") == o["origin"]
            and prov.get("tier") == o["tier"]
            and prov.get("verification") == o["verified"],
            f"{where}: provenance disagrees with the envelope: {prov}",
        )
        need(isinstance((o.get("data") or {}).get("tags"), dict), f"{where}: data.tags missing")
    run = [o for o in log if o["type"] == "com.example.ci.run"]
    need(len(run) == 1, "the published observation is not in the log")
    o = run[0]
    need(o.get("subject") == "build-412", f"subject {o.get('subject')}")
    need(o["data"].get("status") == "failed", f"publisher's data not at the top of data: {o['data']}")
    need(o["data"]["tags"].get("env") == "ci", f"request tags not in data.tags: {o['data']['tags']}")
    need(
        o["origin"] == "probe" and o["tier"] == "measured" and o["verified"] == "machine_verified",
        f"probe defaults: {o}",
    )
    need(o["data"]["provenance"].get("actor") == "probe:ci", "provenance.actor")
    return f"{len(log)} observations"


@check("C10", "sequence zero-padded to 20 and strictly increasing")
async def c10(ctx: Context) -> None:
    m = await ctx.create("c10")
    for _ in range(4):
        await ctx.pub(m)
    log = await ctx.log(m)
    seqs = [seq_of(o) for o in log]
    for o in log:
        need(
            o.get("sequence") == o["id"].zfill(20) and len(o["sequence"]) == 20,
            f"sequence {o.get('sequence')!r}",
        )
    need(all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), f"seqs not strictly increasing: {seqs}")
    need(seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"seqs not dense: {seqs}")
    need(seqs[0] == 1, f"a monitor's own sequence starts at 1, got {seqs[0]}")


async def _act_monitor(ctx: Context, prefix: str, subjects: list[str], **fields: Any) -> Monitor:
    fields.setdefault("capabilities", ["observe", "react", "act"])
    m = await ctx.create(prefix, **fields)
    for subject in subjects:
        await ctx.pub(m, type=A, subject=subject)
    return m


@check("C11", "claim without act -> CAPABILITY_MISSING")
async def c11(ctx: Context) -> None:
    m = await _act_monitor(ctx, "c11", ["job-1"])
    reader = await ctx.sub(m, capabilities=["observe"])
    need("act" not in reader.body["capabilities"], f"asked observe, granted {reader.body['capabilities']}")
    expect(await ctx.lease(reader, "claim", subject="job-1"), 403, "CAPABILITY_MISSING", "claim without act")
    actor = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(actor, "claim", subject="job-1"), 201, what="control: claim with act")


@check("C12", "two concurrent claims: exactly one wins, the other LEASE_HELD naming the holder")
async def c12(ctx: Context) -> str:
    m = await _act_monitor(ctx, "c12", ["job-1", "job-2"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    for subject in ("job-1", "job-2"):
        replies = await ctx.race(
            [
                {
                    "method": "POST",
                    "path": f"/subscriptions/{s.id}/leases/claim",
                    "body": {"subject": subject},
                    "token": s.token,
                }
                for s in (s1, s2)
            ]
        )
        statuses = sorted(r.status for r in replies)
        need(statuses == [201, 409], f"{subject}: statuses {[(r.status, r.body) for r in replies]}")
        win = replies[0] if replies[0].status == 201 else replies[1]
        lose = replies[1] if win is replies[0] else replies[0]
        winner = s1 if win is replies[0] else s2
        need(lose.get("code") == "LEASE_HELD", f"loser got {lose!r}")
        need(win.body["lease"]["holder"] == f"sub:{winner.id}", f"winner's lease holder {win.body['lease']}")
        need(f"sub:{winner.id}" in json.dumps(lose.body), f"LEASE_HELD does not name the holder: {lose.body}")
    return f"over {ctx.t.name}"


@check("C13", "complete after expiry and a new holder -> LEASE_LOST")
async def c13(ctx: Context) -> None:
    m = await _act_monitor(ctx, "c13", ["job-1"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s1, "claim", subject="job-1", lease_duration_seconds=1), 201, what="first claim")
    expect(await ctx.lease(s2, "claim", subject="job-1"), 409, "LEASE_HELD", "control: claim while held")
    await ctx.t.sleep(1.1)
    expect(await ctx.lease(s2, "claim", subject="job-1"), 201, what="claim after expiry")
    expect(
        await ctx.lease(s1, "complete", subject="job-1", outcome="done"), 409, "LEASE_LOST", "stale complete"
    )
    expect(
        await ctx.lease(s2, "complete", subject="job-1", outcome="done"),
        200,
        what="control: new holder completes",
    )
    rows = [(o["actor"], payload(o)) for o in await _types_in(ctx, m, T_LEASE)]
    expired = [(a, p) for a, p in rows if p.get("action") == "expired"]
    need(
        len(expired) == 1 and expired[0][0] == "system:sweep" and expired[0][1].get("subscription") == s1.id,
        f"the expiry is not logged once as lease{{expired}} by system:sweep for {s1.id}: {rows}",
    )


async def _types_in(ctx: Context, m: Monitor, t: str) -> list[dict[str, Any]]:
    return [o for o in await ctx.log(m) if o["type"] == t]


@check("C14", "pause, resume, retire and subscription retire emit observations; paused refuses UNAVAILABLE")
async def c14(ctx: Context) -> None:
    m = await ctx.create("c14")
    s = await ctx.sub(m)
    await ctx.pub(m)
    r = expect(await ctx.configure(m, "pause"), 200, what="pause")
    need(r["monitor"]["active"] is False and isinstance(r.get("seq"), int), f"pause reply {r}")
    b = expect(await ctx.publish(m), 409, "UNAVAILABLE", "publish on a paused monitor")
    need_rejected_seq(b, "UNAVAILABLE")
    need("live" in b, f"UNAVAILABLE lacks live: {b}")
    expect(await ctx.configure(m, "resume"), 200, what="resume")
    await ctx.pub(m)
    r = expect(
        await ctx.req("POST", f"/subscriptions/{s.id}/retire", body={"reason": "done"}, token=s.token),
        200,
        what="sub retire",
    )
    need(r.get("ok") is True and r.get("subscription") == s.id, f"subscription retire reply {r}")
    expect(await ctx.configure(m, "retire"), 200, what="retire")
    expect(await ctx.publish(m), 409, "UNAVAILABLE", "publish on a retired monitor")
    actions = [payload(o).get("action") for o in await _types_in(ctx, m, T_CONFIGURED)]
    need(actions == ["create", "pause", "resume", "retire"], f"configured actions in the log: {actions}")
    for o in await ctx.log(m):
        if o["type"].startswith(P):
            need(
                (o["data"].get("tags") or {}).get("monitor") == m.id and o["tier"] == "measured",
                f"protocol row {o['type']} lacks data.tags.monitor or tier measured: {o}",
            )
            need(isinstance(o["data"].get("payload"), dict), f"protocol row {o['type']} lacks data.payload")
    retired = [payload(o) for o in await _types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(p.get("subscription") == s.id for p in retired), f"no subscription_retired for {s.id}: {retired}"
    )


@check("C15", "state carries as_of, covers_until, live, confidence with missing inputs never defaulted")
async def c15(ctx: Context) -> None:
    m = await ctx.create("c15")
    await ctx.pub(m)
    st = await ctx.state(m)
    for k in ("as_of", "covers_until", "live", "confidence", "ages", "counters", "head", "retention_floor"):
        need(k in st, f"state lacks {k}")
    need(st["live"] == {"value": True, "reason": None}, f"live {st['live']}")
    conf = st["confidence"]
    need(conf.get("value") is None, f"confidence.value {conf.get('value')} while inputs are missing")
    missing = set(conf["inputs"]["missing"])
    need({"independence", "corroboration", "track_record"} <= missing, f"inputs.missing {missing}")
    need(
        {"observations", "ages", "actors", "contradictions_open"} <= set(conf["inputs"]["present"]),
        f"inputs.present {conf['inputs']['present']}",
    )
    gaps = conf["gaps"]
    need(gaps and gaps[0] == "independence_unknown", f"gaps {gaps}")
    need(gaps == [g for g in GAPS_ORDER if g in gaps], f"gaps out of order: {gaps}")
    need("no_subscribers" in gaps, f"no subscribers yet, gaps {gaps}")
    if not m.body.get("attested"):
        need("unattested_origin" in gaps, f"unattested monitor lacks unattested_origin: {gaps}")
    need(
        st["ages"]["since_last_pull_s"] is None,
        f"never pulled, since_last_pull_s {st['ages']['since_last_pull_s']}",
    )
    need(
        isinstance(st["ages"]["since_last_observation_s"], int),
        "since_last_observation_s is not a whole number",
    )
    need(st["head"] == (await ctx.get_monitor(m))["head"], "state head is not the monitor's head")
    s = await ctx.sub(m)
    await ctx.pulled(s)
    st2 = await ctx.state(m)
    need(isinstance(st2["ages"]["since_last_pull_s"], int), f"after a pull since_last_pull_s {st2['ages']}")
    need(
        "no_subscribers" not in st2["confidence"]["gaps"],
        f"with a subscriber, gaps {st2['confidence']['gaps']}",
    )
    expect(await ctx.configure(m, "pause"), 200, what="pause")
    st3 = await ctx.state(m)
    need(st3["live"] == {"value": False, "reason": "paused"}, f"paused live {st3['live']}")


@check("C16", "a refused input is visible as a rejected observation with its raw payload")
async def c16(ctx: Context) -> None:
    m = await ctx.create("c16")
    before = (await ctx.state(m))["counters"]["rejected"]
    raw = {"type": A, "tier": "superb", "data": {"k": "v"}}
    b = expect(await ctx.publish(m, **raw), 400, "UNKNOWN_VOCABULARY", "unknown tier")
    need(b.get("invalid") == "superb" or "superb" in json.dumps(b.get("invalid")), f"invalid: {b}")
    need("measured" in json.dumps(b.get("known")), f"known does not list the tiers: {b}")
    rs = need_rejected_seq(b, "UNKNOWN_VOCABULARY")
    rej = await ctx.at(m, rs)
    need(rej["type"] == T_REJECTED, f"seq {rs} is {rej['type']}")
    p = payload(rej)
    need(p.get("raw") == raw, f"raw payload {p.get('raw')} != {raw}")
    need(p.get("code") == "UNKNOWN_VOCABULARY", f"rejected payload code {p.get('code')}")
    need(rej.get("actor") == "system:guard", f"rejected actor {rej.get('actor')}")
    need((await ctx.state(m))["counters"]["rejected"] == before + 1, "counters.rejected did not count it")
    ok = await ctx.pub(m, tier="measured")
    need(ok["type"] == A, f"control: a valid publish is stored as itself: {ok['type']}")


async def _need_admin(ctx: Context) -> str:
    if not ctx.t.admin_token:
        raise Skip("needs the admin token (--admin-token)")
    return ctx.t.admin_token


async def _compacted(ctx: Context, prefix: str, n: int = 6) -> tuple[Monitor, int, dict[str, Sub]]:
    admin = await _need_admin(ctx)
    m = await ctx.create(prefix)
    subs = {policy: await ctx.sub(m, reset_policy=policy) for policy in ("none", "earliest", "latest")}
    for i in range(n):
        await ctx.pub(m, data={"i": i})
    head = (await ctx.get_monitor(m))["head"]
    upto = head - 2
    expect(
        await ctx.req("POST", "/admin/compact", body={"monitor": m.id, "upto_seq": upto}),
        401,
        "UNAUTHORIZED",
        "compact without the admin token",
    )
    expect(
        await ctx.req("POST", "/admin/compact", body={"monitor": m.id, "upto_seq": upto}, token=admin),
        200,
        what="compact",
    )
    return m, head, subs


@check("C17", "a cursor below a real retention floor -> 410 CURSOR_EXPIRED with retention_floor and relist")
async def c17(ctx: Context) -> None:
    control = await ctx.create("c17ok")
    for _ in range(3):
        await ctx.pub(control)
    cs = await ctx.sub(control, reset_policy="none")
    expect(await ctx.pull(cs, cursor=0), 200, what="control: cursor 0 with nothing compacted")
    m, head, subs = await _compacted(ctx, "c17")
    b = expect(await ctx.pull(subs["none"]), 410, "CURSOR_EXPIRED", "pull below the floor")
    floor = b.get("retention_floor")
    need(isinstance(floor, int) and 1 < floor <= head, f"retention_floor {floor}")
    need(b.get("relist") == f"monitors/state?id={m.id}", f"relist {b.get('relist')}")
    need("requested" in b, f"requested missing: {b}")
    b2 = expect(await ctx.pull(subs["none"], cursor=1), 410, "CURSOR_EXPIRED", "replay below the floor")
    need(b2.get("retention_floor") == floor, "replay floor differs")
    p = await ctx.pulled(subs["none"], cursor=floor)
    need(p["observations"] and seq_of(p["observations"][0]) == floor, f"control: replay from the floor {p}")
    need(p["retention_floor"] == floor, f"pull retention_floor {p['retention_floor']} != {floor}")
    need((await ctx.state(m))["retention_floor"] == floor, "state retention_floor differs")


@check("C18", "a private monitor is listed only with its token")
async def c18(ctx: Context) -> None:
    m = await ctx.create("c18")
    other = await ctx.create("c18o")
    pub = await ctx.create("c18p", visibility="public")

    async def listed(token: str | None) -> set[str]:
        b = expect(await ctx.req("GET", "/monitors", token=token), 200, what="list")
        return {x["id"] for x in b["monitors"]}

    anon = await listed(None)
    need(m.id not in anon, "a private monitor is listed anonymously")
    need(pub.id in anon, "control: a public monitor is not listed anonymously")
    need(m.id not in await listed(other.token), "a private monitor is listed with another monitor's token")
    need(m.id in await listed(m.token), "control: the owner's token does not list its monitor")
    expect(await ctx.req("GET", f"/monitors/{m.id}"), 404, "NOT_FOUND", "anonymous get of a private monitor")
    expect(
        await ctx.req("GET", f"/monitors/{m.id}/state"),
        404,
        "NOT_FOUND",
        "anonymous state of a private monitor",
    )
    expect(await ctx.req("GET", f"/monitors/{m.id}", token=m.token), 200, what="control: owner get")
    expect(
        await ctx.req("GET", f"/monitors/{pub.id}"), 200, what="control: anonymous get of a public monitor"
    )


@check(
    "C19",
    "a mute subscription is retired, the will emitted, its leases freed, re-subscribing keeps the cursor",
)
async def c19(ctx: Context) -> None:
    m = await _act_monitor(ctx, "c19", ["job-1"])
    await ctx.log(m)  # the log reader exists before time passes, with the default mute allowance
    subscriber = f"agent:{ctx.uid('mute')}"
    s = await ctx.sub(m, subscriber, capabilities=["observe", "act"], retire_after_mute_seconds=1)
    other = await ctx.sub(m, capabilities=["observe", "act"])
    await ctx.pub(m)
    p = await ctx.pulled(s)
    expect(await ctx.ack(s, p["next"]), 200, what="ack")
    expect(await ctx.lease(s, "claim", subject="job-1"), 201, what="claim")
    expect(
        await ctx.lease(other, "claim", subject="job-1"), 409, "LEASE_HELD", "control: held before the sweep"
    )
    await ctx.t.sleep(1.1)
    b = expect(await ctx.pull(s), 404, what="pull of a mute-retired subscription")
    need(b.get("retired") is True and b.get("cursor") == p["next"], f"retired pull body {b}")
    wills = [payload(o) for o in await _types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(w.get("subscription") == s.id and w.get("reason") == "mute" for w in wills),
        f"no mute will: {wills}",
    )
    will_rows = [o for o in await _types_in(ctx, m, T_SUB_RETIRED) if payload(o).get("subscription") == s.id]
    need(will_rows[0]["actor"] == "system:sweep", f"the mute will's actor is {will_rows[0]['actor']}")
    need(
        payload(will_rows[0]).get("cursor") == p["next"], f"the will does not keep the cursor: {will_rows[0]}"
    )
    expect(
        await ctx.lease(other, "claim", subject="job-1"), 201, what="the retired holder's lease was not freed"
    )
    again = await ctx.sub(m, subscriber, token=s.token)
    need(again.id == s.id, f"re-subscribing made a new subscription {again.id} instead of {s.id}")
    need(again.body["cursor"] == p["next"] and again.body["active"] is True, f"re-subscribed {again.body}")
    expect(await ctx.pull(again), 200, what="control: the reactivated subscription pulls")


@check("C20", "an identical ack returns the prior result")
async def c20(ctx: Context) -> None:
    m = await ctx.create("c20")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    a1 = expect(await ctx.ack(s, p["next"]), 200, what="ack")
    a2 = expect(await ctx.ack(s, p["next"]), 200, what="same ack")
    need(a1 == a2, f"identical ack returned a different body: {a1} then {a2}")
    await ctx.pub(m)  # the head moves; a re-sent ack still answers with the prior result (section 8)
    a3 = expect(await ctx.ack(s, p["next"]), 200, what="same ack after an append")
    need(a3 == a1, f"a re-sent ack is not the prior result: {a1} then {a3}")
    a4 = expect(await ctx.ack(s, p["next"] + 1), 200, what="control: a new ack")
    need(a4["cursor"] == p["next"] + 1 and a4["head"] == a1["head"] + 1, f"control ack {a4}")


@check("C20b", "re-claiming a held lease returns the same lease")
async def c20b(ctx: Context) -> None:
    m = await _act_monitor(ctx, "c20b", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c1 = expect(await ctx.lease(s, "claim", subject="job-1"), 201, what="claim")
    need(c1.get("idempotent") is False, f"first claim idempotent={c1.get('idempotent')}")
    c2 = expect(await ctx.lease(s, "claim", subject="job-1"), 200, what="holder re-claims")
    need(c2.get("idempotent") is True, f"re-claim idempotent={c2.get('idempotent')}")
    need(c2["lease"] == c1["lease"], f"re-claim returned another lease: {c1['lease']} vs {c2['lease']}")


def _names(obs: dict[str, Any], m: Monitor, target: dict[str, Any]) -> bool:
    sup = obs["data"]["provenance"].get("supersedes")
    return isinstance(sup, dict) and sup.get("id") == target["id"] and sup.get("source") == f"monitor:{m.id}"


@check("C21", "a correction carries supersedes and the original is unchanged")
async def c21(ctx: Context) -> None:
    m = await ctx.create("c21")
    orig = await ctx.pub(m, subject="x", data={"value": 1})
    need(
        orig["data"]["provenance"].get("supersedes") is None,
        "control: a plain observation supersedes nothing",
    )
    fix = await ctx.pub(
        m, subject="x", data={"value": 2}, supersedes={"source": f"monitor:{m.id}", "id": orig["id"]}
    )
    need(_names(fix, m, orig), f"correction's supersedes {fix['data']['provenance'].get('supersedes')}")
    again = dict(await ctx.at(m, seq_of(orig)))
    again.pop("redelivered", None)
    need(again == orig, f"the original changed: {orig} -> {again}")


@check("C22", "an ack computed from the spec's cursor definition makes the acked observations not come back")
async def c22(ctx: Context) -> None:
    m = await ctx.create("c22")
    for _ in range(3):
        await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s, limit=2)
    need(len(p["observations"]) == 2, "limit=2 did not return 2")
    need(p["next"] == seq_of(p["observations"][-1]) + 1, f"next {p['next']} is not last seq + 1")
    expect(await ctx.ack(s, p["next"]), 200, what="ack next")
    acked = {seq_of(o) for o in p["observations"]}
    new = await ctx.pub(m)
    p2 = await ctx.pulled(s, limit=200)
    got = {seq_of(o) for o in p2["observations"]}
    need(not (acked & got), f"acked seqs came back: {sorted(acked & got)}")
    need(seq_of(new) in got and min(got) == p["next"], f"control: the rest did not come: {sorted(got)}")
    expect(await ctx.ack(s, p2["next"]), 200, what="ack the rest")
    p3 = await ctx.pulled(s)
    need(p3["observations"] == [] and p3["next"] == p3["head"] + 1, f"after the last ack {p3}")


@check("C23", "wrong and missing bearer are both 401")
async def c23(ctx: Context) -> None:
    m = await ctx.create("c23")
    s = await ctx.sub(m)
    bad = "x" + secrets.token_urlsafe(24)
    expect(await ctx.publish(m, token=bad), 401, "UNAUTHORIZED", "publish with a wrong token")
    expect(await ctx.publish(m, token=None), 401, "UNAUTHORIZED", "publish without a token")
    expect(await ctx.publish(m, token=s.token), 401, "UNAUTHORIZED", "publish with a reader's token")
    expect(await ctx.publish(m), 201, what="control: publish with the owner token")
    expect(await ctx.pull(s, token=bad), 401, "UNAUTHORIZED", "pull with a wrong token")
    expect(await ctx.pull(s, token=None), 401, "UNAUTHORIZED", "pull without a token")
    expect(await ctx.ack(s, 1, token=bad), 401, "UNAUTHORIZED", "ack with a wrong token")
    r = await ctx.req("POST", f"/monitors/{m.id}/pause", body={"reason": "x"}, token=bad)
    expect(r, 401, "UNAUTHORIZED", "pause with a wrong token")
    expect(await ctx.pull(s), 200, what="control: pull with the reader token")


@check("C24", "a lease claimed by its holder completes")
async def c24(ctx: Context) -> None:
    m = await _act_monitor(ctx, "c24", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s, "claim", subject="job-1", lease_duration_seconds=30), 201, what="claim")
    lease = c["lease"]
    need(lease["subject"] == "job-1" and lease["holder"] == f"sub:{s.id}", f"lease {lease}")
    need(lease["lease_duration_seconds"] == 30 and lease["delivery_count_limit"] == 5, f"lease {lease}")
    d = expect(await ctx.lease(s, "complete", subject="job-1", outcome="done"), 200, what="complete")
    need(d.get("ok") is True and isinstance(d.get("seq"), int), f"complete reply {d}")
    rows = [payload(o) for o in await _types_in(ctx, m, T_LEASE)]
    need([r.get("action") for r in rows] == ["claim", "complete"], f"lease rows {rows}")
    need(
        all(r.get("subject") == "job-1" and r.get("subscription") == s.id for r in rows), f"lease rows {rows}"
    )


@check("C25", "a caught-up reader has lag 0 and another monitor's traffic moves neither its lag nor its head")
async def c25(ctx: Context) -> None:
    m = await ctx.create("c25")
    n = await ctx.create("c25n")
    await ctx.pub(m)
    s = await ctx.sub(m)
    a = await ctx.catch_up(s)
    need(a["lag"] == 0, f"caught up, lag {a['lag']}")
    head = a["head"]
    for _ in range(3):
        await ctx.pub(n)
    p = await ctx.pulled(s)
    need(
        p["lag"] == 0 and p["head"] == head,
        f"another monitor moved lag/head: {p['lag']} {p['head']} (head {head})",
    )
    await ctx.pub(m)
    p = await ctx.pulled(s)
    need(
        p["lag"] == 1 and p["head"] == head + 1, f"control: own traffic gives lag {p['lag']} head {p['head']}"
    )


@check("C26", "every provenance inflation is refused while delegation to the owner is honoured")
async def c26(ctx: Context) -> None:
    agent = f"agent:{ctx.uid('owner')}"
    agent_owned = await ctx.create("c26a", owner=agent)
    need(agent_owned.body["owner"] == agent, f"declared owner {agent_owned.body['owner']}")
    human = f"human:{ctx.uid('you')}"
    human_owned = await ctx.create("c26h", owner=human)
    cases = [
        ("tier src without a human origin", agent_owned, {"tier": "src"}, 400, "TIER_NOT_ASSERTABLE"),
        (
            "src with a declared human origin under a non-human owner",
            agent_owned,
            {"origin": "human", "tier": "src"},
            403,
            "PROVENANCE_CEILING",
        ),
        (
            "human_verified under a non-human owner",
            agent_owned,
            {"verification": "human_verified"},
            403,
            "PROVENANCE_CEILING",
        ),
        (
            "a human origin from a non-human actor",
            human_owned,
            {"actor": "agent:bot", "origin": "human"},
            403,
            "PROVENANCE_CEILING",
        ),
        (
            "an agent self-certifying",
            human_owned,
            {"actor": "agent:bot", "verification": "certified"},
            403,
            "PROVENANCE_CEILING",
        ),
        (
            "an agent naming a stranger",
            human_owned,
            {"actor": "agent:bot", "on_behalf_of": "human:stranger", "origin": "human"},
            403,
            "PROVENANCE_CEILING",
        ),
    ]
    for what, m, body, status, code in cases:
        b = expect(await ctx.publish(m, **body), status, code, what)
        rs = need_rejected_seq(b, what)
        need((await ctx.at(m, rs))["type"] == T_REJECTED, f"{what}: seq {rs} is not a rejected observation")
    ok = await ctx.pub(human_owned, actor="agent:claude", on_behalf_of=human, origin="human", tier="src")
    prov = ok["data"]["provenance"]
    need(
        prov.get("actor") == "agent:claude" and prov.get("on_behalf_of") == human, f"delegation record {prov}"
    )
    need(ok["origin"] == "human" and ok["tier"] == "src", f"delegation {ok['origin']} {ok['tier']}")
    plain = await ctx.pub(agent_owned)
    need(
        plain["tier"] == "unverified" and plain["verified"] == "unverified" and plain["origin"] == "agent",
        f"agent defaults {plain}",
    )


@check("C27", "a non-integer cursor is refused in ack and in pull")
async def c27(ctx: Context) -> None:
    m = await ctx.create("c27")
    await ctx.pub(m)
    s = await ctx.sub(m)
    for bad in ("abc", 2.5, None, "3", [1]):
        expect(await ctx.ack(s, bad), 400, "INVALID", f"ack cursor {bad!r}")
    expect(await ctx.pull(s, cursor="abc"), 400, "INVALID", "pull cursor=abc")
    expect(await ctx.pull(s, cursor="1.5"), 400, "INVALID", "pull cursor=1.5")
    expect(await ctx.pull(s, cursor=1), 200, what="control: pull cursor=1")
    expect(await ctx.ack(s, 2), 200, what="control: ack 2")


@check("C28", "a stranger cannot be granted act by asking")
async def c28(ctx: Context) -> None:
    caps = ["observe", "react", "act"]
    m = await ctx.create("c28", visibility="public", capabilities=caps)
    subscriber = f"agent:{ctx.uid('stranger')}"
    b = expect(
        await ctx.subscribe(m, subscriber, token=None, capabilities=["observe", "act"]),
        403,
        "CAPABILITY_MISSING",
        "ask act",
    )
    need(
        b.get("granted") == ["observe"] and sorted(b.get("monitor_capabilities") or []) == sorted(caps),
        f"extras {b}",
    )
    b = expect(
        await ctx.subscribe(m, subscriber, token=None, capabilities=["observe", "fly"]),
        400,
        "UNKNOWN_VOCABULARY",
        "an unknown capability",
    )
    need("fly" in json.dumps(b.get("invalid")), f"UNKNOWN_VOCABULARY does not name 'fly': {b}")
    s = await ctx.sub(m, subscriber, token=None)
    need(
        s.body["capabilities"] == ["observe"],
        f"control: a stranger gets the default grant: {s.body['capabilities']}",
    )
    expect(
        await ctx.subscribe(m, subscriber, token=s.token, capabilities=["observe", "act"]),
        403,
        "CAPABILITY_MISSING",
        "re-subscribe asking act with the stranger's own token",
    )
    own = await ctx.sub(m, capabilities=["observe", "act"])
    need(
        "act" in own.body["capabilities"],
        f"control: the owner's token grants act: {own.body['capabilities']}",
    )


@check("C29", "every object received validates against its schema", final=True)
async def c29(ctx: Context) -> str:
    await _tour(ctx)
    try:
        from ..schemas import schema_dir, validators
    except ImportError as exc:  # pragma: no cover - the engine always ships the module
        raise CheckFailed(f"cannot load the schema helpers: {exc}") from exc
    try:
        import jsonschema  # noqa: F401
    except ImportError as exc:
        raise CheckFailed(f"jsonschema is not importable here, nothing was validated ({exc})") from exc
    dirs = [("project", schema_dir())]
    if ctx.reference_schema_dir:
        dirs.append(("reference", ctx.reference_schema_dir))
    by_kind = ctx.seen.by_kind()
    problems: list[str] = []
    counts: dict[str, dict[str, int]] = {}
    for label, d in dirs:
        vals = validators(d)
        counts[label] = {}
        for kind, objs in by_kind.items():
            if kind not in vals:
                continue
            for obj in objs:
                errs = list(vals[kind].iter_errors(obj))
                counts[label][kind] = counts[label].get(kind, 0) + 1
                for e in errs[:2]:
                    path = "/".join(str(p) for p in e.absolute_path) or "<root>"
                    problems.append(f"[{label}] {kind} {json.dumps(obj)[:160]}: {path}: {e.message[:200]}")
    ctx.c29_counts = counts  # type: ignore[attr-defined]
    summary = "; ".join(
        f"{label}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())) for label, c in counts.items()
    )
    if problems:
        shown = "\n  ".join(problems[:8])
        raise CheckFailed(f"{len(problems)} schema violations ({summary}):\n  {shown}")
    need(sum(counts["project"].values()) > 0, "nothing was validated")
    return summary


async def _tour(ctx: Context) -> None:
    """Make sure at least one of every kind was received, whatever subset of checks ran."""
    m = await ctx.create("c29", capabilities=["observe", "act"], types=[A], ttl_seconds=3600)
    await ctx.pub(m, subject="job-1", data={"n": 1}, tags={"k": "v"})
    s = await ctx.sub(m, capabilities=["observe", "act"], filter={"types": [A]})
    p = await ctx.pulled(s)
    await ctx.ack(s, p["next"])
    await ctx.lease(s, "claim", subject="job-1")
    await ctx.state(m)
    await ctx.req("GET", "/monitors", token=m.token)
    await ctx.publish(m, tier="nope")


@check("C30", "a foreign Origin is refused, no Origin is served")
async def c30(ctx: Context) -> None:
    if not ctx.t.supports_origin:
        raise Skip("this transport cannot send an Origin header")
    foreign = {"Origin": "https://evil.example"}
    expect(
        await ctx.req("GET", "/discover", headers=foreign), 403, "ORIGIN_REFUSED", "GET with a foreign Origin"
    )
    expect(
        await ctx.req("OPTIONS", "/monitors", headers={**foreign, "Access-Control-Request-Method": "POST"}),
        403,
        "ORIGIN_REFUSED",
        "preflight with a foreign Origin",
    )
    m = await ctx.create("c30")
    r = await ctx.req(
        "POST", f"/monitors/{m.id}/observations", body={"type": A}, token=m.token, headers=foreign
    )
    expect(r, 403, "ORIGIN_REFUSED", "publish with a foreign Origin")
    expect(await ctx.req("GET", "/discover"), 200, what="control: no Origin is served")


@check("C32", "a subscriber's name is not a credential")
async def c32(ctx: Context) -> None:
    m = await ctx.create("c32", visibility="public")
    name = f"agent:{ctx.uid('alice')}"
    first = await ctx.sub(m, name, token=None)
    expect(await ctx.subscribe(m, name, token=None), 401, "UNAUTHORIZED", "same name, no token")
    expect(
        await ctx.subscribe(m, name, token="y" + secrets.token_urlsafe(24)),
        401,
        "UNAUTHORIZED",
        "same name, wrong token",
    )
    again = await ctx.sub(m, name, token=first.token)
    need(again.id == first.id, "control: re-keying with its own token is the same subscription")
    expect(await ctx.pull(again), 200, what="control: the new token pulls")
    expect(await ctx.pull(first), 401, "UNAUTHORIZED", "the token replaced by re-subscribing")
    by_owner = await ctx.sub(m, name)
    need(by_owner.id == first.id, "control: the owner re-keys the same subscription")


@check(
    "C33", "a reject that reaches delivery_count_limit dead-letters the subject; later claims DEAD_LETTERED"
)
async def c33(ctx: Context) -> None:
    m = await _act_monitor(ctx, "c33", ["job-1", "job-2"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    for attempt in range(1, 6):
        c = await ctx.lease(s, "claim", subject="job-1")
        need(c.status in (200, 201), f"claim {attempt} before the limit: {c!r}")
        r = expect(
            await ctx.lease(s, "reject", subject="job-1", reason=f"try {attempt}"),
            200,
            what=f"reject {attempt}",
        )
        need(r.get("dead_letter") is (attempt == 5), f"reject {attempt}: dead_letter={r.get('dead_letter')}")
    expect(await ctx.lease(s, "claim", subject="job-1"), 409, "DEAD_LETTERED", "claim after dead-lettering")
    expect(
        await ctx.lease(s, "claim", subject="job-2"), 201, what="control: another subject is still claimable"
    )


@check("C34", "a subscription claims only subjects its own monitor published (else NOT_FOUND)")
async def c34(ctx: Context) -> None:
    mine = await _act_monitor(ctx, "c34", ["in-mine"])
    theirs = await _act_monitor(ctx, "c34t", ["in-theirs"])
    s = await ctx.sub(mine, capabilities=["observe", "act"])
    expect(
        await ctx.lease(s, "claim", subject="in-theirs"), 404, "NOT_FOUND", "claim another monitor's subject"
    )
    expect(
        await ctx.lease(s, "claim", subject="never-published"), 404, "NOT_FOUND", "claim an unknown subject"
    )
    expect(
        await ctx.lease(s, "claim", subject="in-mine"), 201, what="control: claim its own monitor's subject"
    )
    t = await ctx.sub(theirs, capabilities=["observe", "act"])
    expect(
        await ctx.lease(t, "claim", subject="in-theirs"),
        201,
        what="control: the other monitor's reader claims it",
    )


# ---- beyond the published list ----------------------------------------------------------------------


@check("X01", "seek needs a reason, is logged, and moves back")
async def x01(ctx: Context) -> None:
    m = await ctx.create("x01")
    for _ in range(3):
        await ctx.pub(m)
    s = await ctx.sub(m)
    a = await ctx.catch_up(s)
    end = a["cursor"]
    expect(
        await ctx.req("POST", f"/subscriptions/{s.id}/seek", body={"cursor": 2}, token=s.token),
        400,
        "INVALID",
        "seek without reason",
    )
    need((await ctx.pulled(s))["cursor"] == end, "a refused seek moved the cursor")
    r = expect(
        await ctx.req(
            "POST", f"/subscriptions/{s.id}/seek", body={"cursor": 2, "reason": "reprocess"}, token=s.token
        ),
        200,
        what="seek with reason",
    )
    need(r.get("cursor") == 2, f"seek reply {r}")
    p = await ctx.pulled(s)
    need(p["cursor"] == 2 and seq_of(p["observations"][0]) == 2, f"after seek {p['cursor']}")
    need(
        all(o.get("redelivered") is True for o in p["observations"] if seq_of(o) < end),
        "replayed not redelivered",
    )
    seeks = [payload(o) for o in await _types_in(ctx, m, T_SUBSCRIBED) if "seek" in payload(o)]
    need(
        any(
            x.get("subscription") == s.id
            and x.get("reason") == "reprocess"
            and x["seek"] == {"from": end, "to": 2}
            for x in seeks
        ),
        f"seek not logged: {seeks}",
    )


@check("X02", "renew: the old token is dead at once, the new one works, same cursor")
async def x02(ctx: Context) -> None:
    m = await ctx.create("x02")
    await ctx.pub(m)
    s = await ctx.sub(m)
    a = await ctx.catch_up(s)
    r = expect(
        await ctx.req("POST", f"/subscriptions/{s.id}/renew", body={}, token=s.token), 200, what="renew"
    )
    new = r.get("token")
    need(isinstance(new, str) and new and new != s.token, f"renew reply {r}")
    expect(await ctx.pull(s), 401, "UNAUTHORIZED", "pull with the old token")
    p = await ctx.pulled(s, token=new)
    need(p["cursor"] == a["cursor"], f"renew moved the cursor {a['cursor']} -> {p['cursor']}")


@check(
    "X03", "subscription retire: pull is 404 {retired, cursor}; re-subscribing reactivates with the cursor"
)
async def x03(ctx: Context) -> None:
    m = await ctx.create("x03")
    for _ in range(2):
        await ctx.pub(m)
    name = f"agent:{ctx.uid('x03')}"
    s = await ctx.sub(m, name)
    a = await ctx.catch_up(s)
    r = expect(
        await ctx.req("POST", f"/subscriptions/{s.id}/retire", body={"reason": "bye"}, token=s.token),
        200,
        what="retire",
    )
    need(
        r.get("ok") is True and isinstance(r.get("seq"), int) and r.get("cursor_kept") == a["cursor"],
        f"retire {r}",
    )
    b = expect(await ctx.pull(s), 404, what="pull after retire")
    need(b.get("retired") is True and b.get("cursor") == a["cursor"], f"retired pull body {b}")
    expect(
        await ctx.subscribe(m, name, token=s.token, **{"from": 1}),
        409,
        "CURSOR_BACKWARDS",
        "re-subscribe from below",
    )
    again = await ctx.sub(m, name, token=s.token)
    need(
        again.id == s.id and again.body["active"] and again.body["cursor"] == a["cursor"],
        f"re-subscribed {again.body}",
    )
    expect(await ctx.pull(again), 200, what="control: pull after reactivation")
    wills = [payload(o) for o in await _types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(w.get("subscription") == s.id and w.get("reason") == "by request" for w in wills),
        f"wills {wills}",
    )


@check("X04", "a supersedes chain keeps every link and every original")
async def x04(ctx: Context) -> None:
    m = await ctx.create("x04")
    chain = [await ctx.pub(m, subject="v", data={"v": 0})]
    for v in (1, 2):
        prev = chain[-1]
        chain.append(
            await ctx.pub(
                m, subject="v", data={"v": v}, supersedes={"source": f"monitor:{m.id}", "id": prev["id"]}
            )
        )
    for prev, nxt in zip(chain, chain[1:], strict=False):
        need(_names(nxt, m, prev), f"seq {nxt['id']} does not name {prev['id']}")
    log = {o["id"]: o for o in await ctx.log(m)}
    for o in chain:
        got = dict(log[o["id"]])
        got.pop("redelivered", None)
        need(got == o, f"seq {o['id']} changed")


@check("X05", "compaction: reset_policy earliest moves to the floor, latest to head + 1")
async def x05(ctx: Context) -> None:
    m, head, subs = await _compacted(ctx, "x05")
    floor = (await ctx.state(m))["retention_floor"]
    e = await ctx.pulled(subs["earliest"])
    need(
        e["observations"] and seq_of(e["observations"][0]) == floor,
        f"earliest starts at {e['observations'][:1]}",
    )
    need(e["cursor"] == floor, f"earliest cursor {e['cursor']} != floor {floor}")
    latest = await ctx.pulled(subs["latest"])
    need(all(seq_of(o) > head for o in latest["observations"]), f"latest replayed {latest['observations']}")
    need(latest["cursor"] >= head + 1, f"latest cursor {latest['cursor']} (head was {head})")
    expect(await ctx.pull(subs["none"]), 410, "CURSOR_EXPIRED", "control: reset_policy none")


@check("X06", "a replay after a relist ends with a bookmark observation")
async def x06(ctx: Context) -> None:
    m, head, subs = await _compacted(ctx, "x06")
    seen: list[dict[str, Any]] = []
    s = subs["earliest"]
    for _ in range(20):
        p = await ctx.pulled(s, limit=200)
        seen.extend(p["observations"])
        expect(await ctx.ack(s, p["next"]), 200, what="ack")
        if not p["observations"]:
            break
    types = [o["type"] for o in seen]
    need(T_BOOKMARK in types, f"no bookmark in the replay: {types}")
    last_bm = max(i for i, t in enumerate(types) if t == T_BOOKMARK)
    need(
        all(seq_of(o) > head for o in seen[last_bm + 1 :]),
        "observations from before the relist follow the bookmark",
    )
    control = await ctx.sub(m, reset_policy="earliest", **{"from": "head"})
    p = await ctx.pulled(control)
    need(
        T_BOOKMARK not in [o["type"] for o in p["observations"] if seq_of(o) > head + 5],
        "control: unexpected bookmark",
    )


@check("X07", "a paused or retired monitor refuses writes with UNAVAILABLE, rejected_seq and live")
async def x07(ctx: Context) -> None:
    m = await ctx.create("x07")
    expect(await ctx.configure(m, "pause"), 200, what="pause")
    body = {"type": A, "data": {"late": True}}
    b = expect(await ctx.publish(m, **body), 409, "UNAVAILABLE", "paused")
    rs = need_rejected_seq(b, "paused")
    need(b.get("live") in (False, {"value": False, "reason": "paused"}), f"live {b.get('live')}")
    rej = await ctx.at(m, rs)
    need(rej["type"] == T_REJECTED and payload(rej).get("raw") == body, f"rejected row {rej}")
    expect(await ctx.configure(m, "resume"), 200, what="resume")
    await ctx.pub(m)
    expect(await ctx.configure(m, "retire"), 200, what="retire")
    b = expect(await ctx.publish(m), 409, "UNAVAILABLE", "retired")
    need_rejected_seq(b, "retired")
    st = await ctx.state(m)
    need(st["live"] == {"value": False, "reason": "retired"}, f"retired live {st['live']}")


@check("X08", "complete is idempotent")
async def x08(ctx: Context) -> None:
    m = await _act_monitor(ctx, "x08", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s, "claim", subject="job-1"), 201, what="claim")
    d1 = expect(await ctx.lease(s, "complete", subject="job-1", outcome="done"), 200, what="complete")
    d2 = expect(await ctx.lease(s, "complete", subject="job-1", outcome="done"), 200, what="complete again")
    same = {k: d2.get(k) for k in ("ok", "seq", "lease") if k in d1} == {
        k: d1[k] for k in ("ok", "seq", "lease") if k in d1
    }
    need(same, f"second complete is not the prior result: {d1} vs {d2}")
    rows = [payload(o).get("action") for o in await _types_in(ctx, m, T_LEASE)]
    need(rows.count("complete") == 1, f"complete logged {rows.count('complete')} times")


@check("X09", "JSON-RPC: single and batch calls, numeric error codes in the section 3 order")
async def x09(ctx: Context) -> None:
    m = await ctx.create("x09")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    expect(await ctx.ack(s, p["next"]), 200, what="ack")

    def call(i: int, method: str, **params: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": i, "method": method, "params": params}

    one = expect(await ctx.req("POST", "/rpc", body=call(1, "monitors/discover")), 200, what="rpc single")
    need(
        one.get("id") == 1 and "0.1" in one.get("result", {}).get("supportedVersions", []),
        f"rpc discover {one}",
    )
    batch = [
        call(1, "monitors/get", id=m.id, token=m.token),
        call(2, "monitors/get", id=m.id + "-missing", token=m.token),
        call(3, "feeds/ack", subscription=s.id, token=s.token, cursor=1),
        call(4, "monitors/publish", id=m.id, token="z" + secrets.token_urlsafe(24), type=A),
        call(5, "feeds/ack", subscription=s.id, token=s.token, cursor="x"),
        call(6, "monitors/publish", id=m.id, token=m.token, type=A, tier="nope"),
        call(7, "feeds/pull", subscription=s.id, token=s.token),
    ]
    out = expect(await ctx.req("POST", "/rpc", body=batch), 200, what="rpc batch")
    need(isinstance(out, list) and len(out) == len(batch), f"batch reply {out}")
    by_id = {x.get("id"): x for x in out}
    need(by_id[1].get("result", {}).get("id") == m.id, f"rpc get {by_id[1]}")
    need(isinstance(by_id[7].get("result", {}).get("observations"), list), f"rpc pull {by_id[7]}")
    for i, code in (
        (2, "NOT_FOUND"),
        (3, "CURSOR_BACKWARDS"),
        (4, "UNAUTHORIZED"),
        (5, "INVALID"),
        (6, "UNKNOWN_VOCABULARY"),
    ):
        err = by_id[i].get("error") or {}
        need(
            err.get("code") == JSONRPC_CODE[code],
            f"call {i}: {code} should be {JSONRPC_CODE[code]}, got {by_id[i]}",
        )
        need(
            (err.get("data") or {}).get("code") == code and isinstance(err.get("message"), str),
            f"call {i}: {err}",
        )
    bad = expect(await ctx.req("POST", "/rpc", body=call(9, "monitors/nope")), 200, what="rpc unknown method")
    need((bad.get("error") or {}).get("code") == -32601, f"unknown method {bad}")


@check("X10", "lag counts only what the subscription's own filter lets through")
async def x10(ctx: Context) -> None:
    m = await ctx.create("x10")
    s = await ctx.sub(m, filter={"types": [A]})
    await ctx.catch_up(s)
    for _ in range(3):
        await ctx.pub(m, type=B)
    p = await ctx.pulled(s)
    need(p["lag"] == 0 and p["observations"] == [], f"filtered-out traffic: lag {p['lag']}")
    a = expect(await ctx.ack(s, p["next"]), 200, what="ack")
    need(a["lag"] == 0, f"ack lag {a['lag']}")
    await ctx.pub(m, type=A)
    await ctx.pub(m, type=B)
    p = await ctx.pulled(s)
    need(p["lag"] == 1, f"control: one matching observation, lag {p['lag']}")


@check("X11", "every error body has code, a sentence, done[] and the status of its code", final=True)
async def x11(ctx: Context) -> str:
    need(ctx.seen.errors, "no error bodies were received")
    for status, body in ctx.seen.errors:
        code = body.get("code")
        need(code in ERROR_STATUS, f"unknown code {code}: {body}")
        need(ERROR_STATUS[code] == status, f"{code} came with status {status}, not {ERROR_STATUS[code]}")
        need(
            isinstance(body.get("error"), str) and body["error"].strip(), f"{code} without a sentence: {body}"
        )
        need(isinstance(body.get("done"), list), f"{code} without done[]: {body}")
    return f"{len(ctx.seen.errors)} error bodies"


@check("X12", "malformed input is a 400 (or 404/413) with a code, never a 500")
async def x12(ctx: Context) -> str | None:
    m = await ctx.create("x12", capabilities=["observe", "act"])
    await ctx.pub(m, subject="job-1")
    s = await ctx.sub(m, capabilities=["observe", "act"])
    path = f"/monitors/{m.id}/observations"
    for raw in (b"{not json", b"[1,2]", b'"text"', b"\xff\xfe"):
        expect(await ctx.req("POST", path, raw_body=raw, token=m.token), 400, "INVALID", f"body {raw!r}")
    expect(
        await ctx.req("POST", "/monitors", raw_body=b"{", token=ctx.t.registration_token),
        400,
        "INVALID",
        "bad JSON create",
    )
    for body, what in (
        ({"monitor": m.id, "subscriber": 42}, "subscriber not a string"),
        ({"monitor": m.id, "subscriber": "agent:x", "capabilities": "observe"}, "capabilities not a list"),
        (
            {"monitor": m.id, "subscriber": "agent:x", "from": "yesterday"},
            "from neither head, earliest nor int",
        ),
    ):
        r = await ctx.req("POST", "/subscriptions", body=body, token=m.token)
        need(r.status == 400 and r.get("code") in ERROR_STATUS, f"{what}: {r!r}")
    expect(await ctx.publish(m, type=42), 400, what="type not a string")
    expect(await ctx.publish(m, type="Not A Type"), 400, what="type not reverse-DNS")
    for q in (
        {"limit": "abc"},
        {"limit": "0"},
        {"limit": "201"},
        {"wait": "soon"},
        {"wait": "-1"},
        {"limit": "2.5"},
    ):
        expect(await ctx.pull(s, **q), 400, "INVALID", f"pull {q}")
    expect(await ctx.pull(s, limit="200", wait="0"), 200, what="control: limit=200 wait=0")
    for dur in ("x", 1.5, 0, -3):
        r = await ctx.lease(s, "claim", subject="job-1", lease_duration_seconds=dur)
        need(r.status == 400 and r.get("code") == "INVALID", f"lease_duration_seconds {dur!r}: {r!r}")
    expect(
        await ctx.lease(s, "claim", subject="job-1", lease_duration_seconds=5),
        201,
        what="control: duration 5",
    )
    for p in ("/nothing-here", "/monitors/x/nonsense/deeper"):
        b = expect(await ctx.req("GET", p), 404, "NOT_FOUND", f"unknown route {p}")
        need("/mp/v0" in b.get("error", ""), f"unknown route sentence does not name /mp/v0: {b}")
    big = b'{"type":"' + A.encode() + b'","data":{"x":"' + b"a" * (1 << 20) + b'"}}'
    resets: list[str] = []
    for _ in range(5):
        try:
            r = await ctx.req("POST", path, raw_body=big, token=m.token)
        except CheckFailed:
            raise
        except Exception as exc:  # the connection was reset before the answer could be read
            resets.append(type(exc).__name__)
            continue
        expect(r, 413, "TOO_LARGE", "a body over 1 MiB")
        break
    else:
        raise CheckFailed(
            f"a body over 1 MiB never got its 413 answer: the connection was reset each time {resets}"
        )
    return f"413 seen after {len(resets)} connection reset(s)" if resets else None


@check("X13", "monitor create defaults, DUPLICATE, validation, update as a versioned configured observation")
async def x13(ctx: Context) -> None:
    m = await ctx.create("x13")
    mb = m.body
    want = {
        "name": m.id,
        "source": {"kind": "log"},
        "filter": {},
        "horizon": "event",
        "capabilities": ["observe"],
        "visibility": "private",
        "default_grant": ["observe"],
        "types": [],
        "rules": [],
        "version": 1,
        "active": True,
    }
    for k, v in want.items():
        got = mb.get(k)
        if k == "source" and isinstance(got, dict):
            got = {kk: vv for kk, vv in got.items() if vv not in (None, {}, "")}
        need(got == v, f"default {k}: {mb.get(k)!r}, expected {v!r}")
    need(
        mb["owner"] == ("human:owner" if mb.get("attested") else "agent:owner"),
        f"default owner {mb['owner']}",
    )
    expect(
        await ctx.req("POST", "/monitors", body={"id": m.id}, token=ctx.t.registration_token),
        409,
        "DUPLICATE",
        "same id",
    )
    for body, code, what in (
        ({"id": "x"}, "INVALID", "one-character id"),
        ({"id": "has space"}, "INVALID", "id with a space"),
        ({"id": ctx.uid("x13h"), "horizon": "fortnight"}, "UNKNOWN_VOCABULARY", "unknown horizon"),
        (
            {"id": ctx.uid("x13c"), "capabilities": ["observe", "fly"]},
            "UNKNOWN_VOCABULARY",
            "unknown capability",
        ),
        ({"id": ctx.uid("x13v"), "visibility": "secret"}, "UNKNOWN_VOCABULARY", "unknown visibility"),
        ({"id": ctx.uid("x13g"), "default_grant": ["act"]}, "INVALID", "default_grant beyond capabilities"),
        ({"id": ctx.uid("x13t"), "types": ["NotDNS"]}, None, "type not reverse-DNS"),
    ):
        r = await ctx.req("POST", "/monitors", body=body, token=ctx.t.registration_token)
        need(r.status == 400 and (code is None or r.get("code") == code), f"{what}: {r!r}")
    u = expect(
        await ctx.configure(m, "update", {"patch": {"description": "now described"}, "reason": "doc"}),
        200,
        what="update",
    )
    need(
        u["monitor"]["version"] == 2 and u["monitor"]["description"] == "now described",
        f"update {u['monitor']}",
    )
    row = await ctx.at(m, u["seq"])
    p = payload(row)
    need(
        row["type"] == T_CONFIGURED and p.get("action") == "update" and p.get("reason") == "doc", f"row {row}"
    )
    need(p.get("diff", {}).get("description", {}).get("after") == "now described", f"diff {p.get('diff')}")
    need(
        isinstance(p.get("before_digest"), str) and len(p["before_digest"]) == 64,
        f"before_digest {p.get('before_digest')}",
    )
    created = [
        payload(o) for o in await _types_in(ctx, m, T_CONFIGURED) if payload(o).get("action") == "create"
    ]
    need(
        created and created[0].get("before_digest") is None and created[0].get("diff") is None,
        f"create row {created}",
    )


@check("X14", "an observation at or below the delivered high-water mark is marked redelivered")
async def x14(ctx: Context) -> None:
    m = await ctx.create("x14")
    for _ in range(2):
        await ctx.pub(m)
    s = await ctx.sub(m)
    p1 = await ctx.pulled(s)
    need(
        p1["redelivered"] == 0 and not any(o.get("redelivered") for o in p1["observations"]),
        "first delivery marked",
    )
    p2 = await ctx.pulled(s)
    need(all(o.get("redelivered") is True for o in p2["observations"]), "second pull not marked redelivered")
    need(p2["redelivered"] == len(p2["observations"]), f"redelivered count {p2['redelivered']}")
    expect(await ctx.ack(s, p2["next"]), 200, what="ack")
    await ctx.pub(m)
    p3 = await ctx.pulled(s)
    need(
        p3["observations"] and not any(o.get("redelivered") for o in p3["observations"]),
        "control: new marked",
    )


@check("X15", "retiring a subscription releases its leases")
async def x15(ctx: Context) -> None:
    m = await _act_monitor(ctx, "x15", ["job-1"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s1, "claim", subject="job-1"), 201, what="claim")
    expect(await ctx.lease(s2, "claim", subject="job-1"), 409, "LEASE_HELD", "control: held")
    expect(
        await ctx.req("POST", f"/subscriptions/{s1.id}/retire", body={"reason": "x"}, token=s1.token),
        200,
        what="retire",
    )
    expect(await ctx.lease(s2, "claim", subject="job-1"), 201, what="claim after the holder retired")


@check("X16", "a shared monitor is readable only with the subscribe token")
async def x16(ctx: Context) -> None:
    m = await ctx.create("x16", visibility="shared", capabilities=["observe", "react"])
    need(isinstance(m.subscribe_token, str) and m.subscribe_token, "no subscribe_token for a shared monitor")
    need(
        m.id not in [x["id"] for x in (await ctx.req("GET", "/monitors")).body["monitors"]],
        "shared listed to all",
    )
    listed = expect(await ctx.req("GET", "/monitors", token=m.subscribe_token), 200, what="list")
    need(m.id in [x["id"] for x in listed["monitors"]], "control: the subscribe token lists it")
    r = await ctx.subscribe(m, token=None)
    need(r.status in (401, 404), f"subscribe without the subscribe token: {r!r}")
    s = await ctx.sub(m, token=m.subscribe_token, capabilities=["observe", "react"])
    need(
        sorted(s.body["capabilities"]) == ["observe", "react"],
        f"subscribe token grant {s.body['capabilities']}",
    )


@check("X17", "ack is clamped to head + 1")
async def x17(ctx: Context) -> None:
    m = await ctx.create("x17")
    await ctx.pub(m)
    s = await ctx.sub(m)
    a = expect(await ctx.ack(s, 10**9), 200, what="ack far ahead")
    need(a["cursor"] == a["head"] + 1, f"ack cursor {a['cursor']} head {a['head']}")
    await ctx.pub(m)
    p = await ctx.pulled(s)
    need(len(p["observations"]) == 1, f"control: the next observation still arrives: {p['observations']}")


@check("X18", "lease renew by the holder extends it; by anyone else it is refused")
async def x18(ctx: Context) -> None:
    m = await _act_monitor(ctx, "x18", ["job-1"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s1, "claim", subject="job-1", lease_duration_seconds=1), 201, what="claim")
    await ctx.t.sleep(0.6)
    r = expect(await ctx.lease(s1, "renew", subject="job-1"), 200, what="renew")
    need(r["lease"]["renew_time"] > c["lease"]["renew_time"] and "expires" in r, f"renew {r}")
    await ctx.t.sleep(0.6)  # past the claim's expiry, within the renewal's
    expect(await ctx.lease(s2, "claim", subject="job-1"), 409, "LEASE_HELD", "renewed lease is still held")
    r2 = await ctx.lease(s2, "renew", subject="job-1")
    need(
        r2.status == 409 and r2.get("code") in ("LEASE_HELD", "LEASE_LOST"), f"renew by a non-holder: {r2!r}"
    )
    expect(await ctx.lease(s1, "release", subject="job-1"), 200, what="release")
    expect(await ctx.lease(s2, "claim", subject="job-1"), 201, what="control: claim after release")


@check("X19", "only the owner configures a monitor")
async def x19(ctx: Context) -> None:
    m = await ctx.create("x19", visibility="public")
    s = await ctx.sub(m)
    for action in ("update", "pause", "retire"):
        body = {"patch": {"description": "hijack"}} if action == "update" else {"reason": "hijack"}
        for tok in (s.token, None):
            r = await ctx.req("POST", f"/monitors/{m.id}/{action}", body=body, token=tok)
            need(r.status == 401, f"{action} with {'a reader' if tok else 'no'} token: {r!r}")
    need((await ctx.get_monitor(m))["version"] == 1, "a refused update changed the monitor")
    expect(
        await ctx.configure(m, "update", {"patch": {"description": "mine"}}),
        200,
        what="control: owner updates",
    )


@check("X20", "pull limit defaults to 50; limit=N returns at most N")
async def x20(ctx: Context) -> None:
    m = await ctx.create("x20")
    for i in range(55):
        await ctx.pub(m, data={"i": i})
    s = await ctx.sub(m, filter={"types": [A]})
    p = await ctx.pulled(s)
    need(len(p["observations"]) == 50, f"default limit gave {len(p['observations'])}")
    need(
        p["next"] == seq_of(p["observations"][-1]) + 1 and p["lag"] == 55, f"next {p['next']} lag {p['lag']}"
    )
    p3 = await ctx.pulled(s, limit=3)
    need(len(p3["observations"]) == 3, f"limit=3 gave {len(p3['observations'])}")
    p200 = await ctx.pulled(s, limit=200)
    need(len(p200["observations"]) == 55, f"control: limit=200 gave {len(p200['observations'])}")


@check("X21", "a filter matches by addressing: types prefix, subjects, actors, #tags")
async def x21(ctx: Context) -> None:
    m = await ctx.create("x21", owner=f"human:{ctx.uid('o')}")
    await ctx.pub(m, type=A, subject="s1", tags={"env": "prod"})
    await ctx.pub(m, type=B, subject="s2", tags={"env": "dev"}, actor="probe:p1")
    await ctx.pub(m, type="com.other.thing", subject="s1", actor="probe:p2")
    cases = [
        ({"types": ["com.example.conf.*"]}, [A, B]),
        ({"subjects": ["s1"]}, [A, "com.other.thing"]),
        ({"actors": ["probe:p2"]}, ["com.other.thing"]),
        ({"#env": ["prod"]}, [A]),
        ({"types": ["com.example.conf.*"], "#env": ["dev"]}, [B]),
        ({"origins": ["probe"], "subjects": ["s1"]}, ["com.other.thing"]),
    ]
    for flt, want in cases:
        s = await ctx.sub(m, filter=flt)
        p = await ctx.pulled(s)
        got = [o["type"] for o in p["observations"]]
        need(got == want, f"filter {flt} delivered {got}, expected {want}")
        need(p["lag"] == len(want), f"filter {flt}: lag {p['lag']} is not {len(want)}")


@check("X22", "from: head, earliest or an integer sets where a new subscription starts")
async def x22(ctx: Context) -> None:
    m = await ctx.create("x22")
    for _ in range(3):
        await ctx.pub(m)
    head = (await ctx.get_monitor(m))["head"]
    flt = {"types": [A]}
    late = await ctx.sub(m, filter=flt, **{"from": "head"})
    early = await ctx.sub(m, filter=flt, **{"from": "earliest"})
    mid = await ctx.sub(m, filter=flt, **{"from": head})
    new = await ctx.pub(m)
    got = {}
    for name, s in (("head", late), ("earliest", early), ("int", mid)):
        got[name] = [seq_of(o) for o in (await ctx.pulled(s))["observations"]]
    need(got["head"] == [seq_of(new)], f"from head delivered {got['head']}")
    need(
        len(got["earliest"]) == 4 and got["earliest"][-1] == seq_of(new), f"from earliest: {got['earliest']}"
    )
    need(got["int"] == [head, seq_of(new)], f"from {head} delivered {got['int']}")
    r = await ctx.subscribe(m, **{"from": "yesterday"})
    need(r.status == 400, f"from 'yesterday': {r!r}")


@check(
    "X23", "state projection: counters, last, single_actor, stale_source, contradictions_open never below 0"
)
async def x23(ctx: Context) -> None:
    m = await ctx.create("x23", owner=f"human:{ctx.uid('o')}", ttl_seconds=1)
    await ctx.pub(m, type=A, actor="probe:one")
    st = await ctx.state(m)
    need("single_actor" in st["confidence"]["gaps"], f"one publisher, gaps {st['confidence']['gaps']}")
    need(st["counters"]["observations"] == 1, f"counters.observations {st['counters']}")
    need(st["last"] and st["last"]["type"] == A and st["last"]["seq"] == st["head"], f"last {st['last']}")
    need("stale_source" not in st["confidence"]["gaps"], "fresh observation reported stale")
    await ctx.pub(m, type="com.example.x.contradiction", actor="probe:two")
    await ctx.pub(m, type="com.example.x.contradiction", actor="probe:two")
    await ctx.pub(m, type="com.example.x.contradiction_resolved", actor="probe:two")
    st = await ctx.state(m)
    need(st["contradictions_open"] == 1, f"2 contradictions - 1 resolved: {st['contradictions_open']}")
    need("single_actor" not in st["confidence"]["gaps"], f"two publishers, gaps {st['confidence']['gaps']}")
    for _ in range(3):
        await ctx.pub(m, type="com.example.x.contradiction_resolved", actor="probe:two")
    st = await ctx.state(m)
    need(st["contradictions_open"] == 0, f"more resolved than opened: {st['contradictions_open']}")
    await ctx.t.sleep(1.1)
    st = await ctx.state(m)
    need(
        "stale_source" in st["confidence"]["gaps"], f"older than ttl_seconds, gaps {st['confidence']['gaps']}"
    )
    need(st["ages"]["since_last_observation_s"] >= 1, f"ages {st['ages']}")
