"""The conformance suite's checks: PROTOCOL.md section 11 as runnable code, over any transport.

Every check declares a profile:

- `published` (C01..C34, C20b): the published checklist of section 11, written so that it judges any
  implementation of the protocol fairly. These checks make no assumption that belongs to this project: each
  uses a fresh monitor and fresh, randomly suffixed subjects and subscriber names (a server whose leases are
  global per subject passes), never relies on a monitor's seqs being dense or starting at 1, reads limits
  and lease defaults from what the server advertises instead of expecting exact values, and assumes no more
  of a subscription id than `sub-` followed by at least 8 hex digits.
- `project` (X01..): this project's own choices and limits (dense per-monitor seqs, exact defaults, the
  input limits of section 10, idempotency keys, revocation, ...). An assertion that once lived in a
  published check but rests on such a choice lives here, so `--profile all` still proves all of it.

Each check is an `async def` taking a Context; it returns a note, raises CheckFailed (fail) or Skip (skip).
Every negative check has a positive control beside it: a refusal only counts when the same request, made
properly, is accepted. Standard library only, and nothing of the engine's rules is imported: the suite
judges the engine.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.conformance.transport import Reply

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

    def __init__(self, transport: Any, reference_schema_dir: str | None = None, profile: str = "all") -> None:
        self.t = transport
        self.reference_schema_dir = reference_schema_dir
        self.profile = profile
        self.seen = Seen()
        self.run_id = secrets.token_hex(3)
        self._discover: dict[str, Any] | None = None

    async def discover(self) -> dict[str, Any]:
        """The server's discover document, fetched once."""
        if self._discover is None:
            self._discover = expect(await self.req("GET", "/discover"), 200, what="GET /discover")
        return self._discover

    async def page(self) -> int:
        """The largest pull `limit` to ask for: the server's advertised max_limit, at most 200."""
        try:
            lim = (await self.discover()).get("limits") or {}
        except Exception:  # a broken discover is C01's to report; a page size is still needed here
            lim = {}
        mx = lim.get("max_limit") if isinstance(lim, dict) else None
        return min(mx, 200) if isinstance(mx, int) and not isinstance(mx, bool) and mx >= 1 else 50

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
        """A fresh name: unique to this run and this call (subjects, subscribers, monitor ids)."""
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

    async def publish_with_headers(self, m: Monitor, headers: dict[str, str], **body: Any) -> Reply:
        body.setdefault("type", A)
        return await self.req(
            "POST", f"/monitors/{m.id}/observations", body=body, token=m.token, headers=headers
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
        name = subscriber if subscriber is not None else f"agent:{self.uid('r')}"
        body = {"monitor": m.id, "subscriber": name, **body}
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
        page = await self.page()
        for _ in range(50):
            p = await self.pulled(s, limit=page)
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
            m.reader = await self.sub(m, f"agent:{self.uid('log-reader')}")
        out: list[dict[str, Any]] = []
        cursor = 0
        page = await self.page()
        for _ in range(1000):
            p = await self.pulled(m.reader, cursor=cursor, limit=page)
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


PUBLISHED = "published"  # PROTOCOL.md section 11's list: behaviour every implementation must show
PROJECT = "project"  # this project's own choices and limits
PROFILES = (PUBLISHED, PROJECT)


@dataclass
class Check:
    id: str
    title: str
    fn: CheckFn
    profile: str
    final: bool = False  # runs after every other check (it judges what the others received)


CHECKS: list[Check] = []


def check(cid: str, title: str, *, profile: str, final: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register a check under `cid` with its `profile` (PUBLISHED or PROJECT)."""
    if profile not in PROFILES:
        raise ValueError(f"check {cid}: profile {profile!r} is not one of {PROFILES}")
    if any(c.id == cid for c in CHECKS):
        raise ValueError(f"check id {cid} is registered twice")

    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(cid, title, fn, profile, final))
        return fn

    return deco


ACTOR = re.compile(r"^[^\s\x00-\x1f\x7f-\x9f]{1,256}$")


def _actor_ok(v: Any) -> bool:
    """Section 3: a non-empty name of at most 256 characters, no whitespace or control characters."""
    return isinstance(v, str) and bool(ACTOR.match(v))


def _posint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def need_rejected_seq(body: dict[str, Any], what: str) -> int:
    rs = body.get("rejected_seq")
    need(
        isinstance(rs, int) and not isinstance(rs, bool) and rs >= 1,
        f"{what}: no integer rejected_seq in {body}",
    )
    return rs


# ---- section 11 ----------------------------------------------------------------------------------------


@check("C01", "discover shape", profile=PUBLISHED)
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
    dcl = (caps.get("leases") or {}).get("delivery_count_limit")
    need(_posint(dcl), f"leases.delivery_count_limit is not a positive integer: {dcl!r}")
    ext = (caps.get("extensions") or {}).get("ai.mentu/monitors")
    need(
        isinstance(ext, dict) and "version" in ext,
        f"extension ai.mentu/monitors missing: {caps.get('extensions')}",
    )
    lim = d.get("limits") or {}
    need(
        all(_posint(lim.get(k)) for k in ("max_limit", "default_limit", "max_wait_seconds"))
        and lim["default_limit"] <= lim["max_limit"],
        f"limits: max_limit, default_limit (at most max_limit) and max_wait_seconds must be positive"
        f" integers: {lim}",
    )
    si = d.get("serverInfo") or {}
    need(all(k in si for k in ("name", "version", "implementation")), f"serverInfo incomplete: {si}")
    need(isinstance(d.get("ttlMs"), int) and "cacheScope" in d, "ttlMs/cacheScope missing")
    return f"server {si.get('name')} {si.get('version')}"


@check("C02", "unknown filter key -> INVALID_FILTER with known_keys", profile=PUBLISHED)
async def c02(ctx: Context) -> None:
    m = await ctx.create("c02")
    b = expect(
        await ctx.subscribe(m, filter={"colour": ["red"]}), 400, "INVALID_FILTER", "unknown filter key"
    )
    need("types" in (b.get("known_keys") or []), f"known_keys does not name 'types': {b}")
    expect(await ctx.subscribe(m, filter={"types": [A]}), 201, what="control: a known filter key")


@check("C03", "undeclared type -> INVALID_FILTER with known_types", profile=PUBLISHED)
async def c03(ctx: Context) -> None:
    m = await ctx.create("c03", types=[A, B])
    b = expect(await ctx.subscribe(m, filter={"types": [C]}), 400, "INVALID_FILTER", "undeclared filter type")
    known = b.get("known_types") or []
    need(A in known and B in known, f"known_types does not list the declared types: {b}")
    expect(await ctx.subscribe(m, filter={"types": [B]}), 201, what="control: a declared type")


@check("C04", "agent asserting src -> TIER_NOT_ASSERTABLE", profile=PUBLISHED)
async def c04(ctx: Context) -> None:
    m = await ctx.create("c04", owner="human:c04")
    b = expect(await ctx.publish(m, actor="agent:bot", tier="src"), 400, "TIER_NOT_ASSERTABLE", "agent src")
    need_rejected_seq(b, "TIER_NOT_ASSERTABLE")
    obs = await ctx.pub(m, tier="src")
    need(obs["tier"] == "src" and obs["origin"] == "human", f"control: the human owner's src: {obs}")


@check("C05", "pull does not advance the cursor", profile=PUBLISHED)
async def c05(ctx: Context) -> None:
    m = await ctx.create("c05")
    for i in range(3):
        await ctx.pub(m, data={"i": i})
    s = await ctx.sub(m)
    page = await ctx.page()
    p1 = await ctx.pulled(s, limit=page)
    p2 = await ctx.pulled(s, limit=page)
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


@check("C06", "ack below is CURSOR_BACKWARDS, equal is idempotent", profile=PUBLISHED)
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


@check("C07", "a narrow filter still reports the real head", profile=PUBLISHED)
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


@check("C08", "an inline pull filter narrows and never widens", profile=PUBLISHED)
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
    wide = await ctx.pull(s, types=C)
    if wide.status == 400:  # disjoint by construction: section 8 lets the server refuse it
        expect(wide, 400, "INVALID_FILTER", f"inline types={C} outside the subscription's types")
    else:
        widened = [o["type"] for o in expect(wide, 200, what=f"inline types={C}")["observations"]]
        need(C not in widened, f"inline types={C} widened the subscription's filter: {widened}")
    p = await ctx.pulled(s)
    need(p["cursor"] == s.body["cursor"], "an inline-filtered pull moved the cursor")


@check("C09", "every observation is a valid CloudEvent with the extensions", profile=PUBLISHED)
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
        need(_actor_ok(o.get("actor")), f"{where}: actor {o.get('actor')!r} is not a section 3 actor")
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


@check("C10", "sequence zero-padded to 20 and strictly increasing", profile=PUBLISHED)
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
    need(seqs and seqs[0] >= 1, f"seqs start below 1: {seqs}")


async def _act_monitor(
    ctx: Context, prefix: str, names: list[str], **fields: Any
) -> tuple[Monitor, list[str]]:
    """A monitor with `act` that has published one observation per subject. Subjects are fresh names
    (`names` with a random suffix), so a server whose leases are global per subject is judged fairly."""
    fields.setdefault("capabilities", ["observe", "react", "act"])
    m = await ctx.create(prefix, **fields)
    subjects = [ctx.uid(n) for n in names]
    for subject in subjects:
        await ctx.pub(m, type=A, subject=subject)
    return m, subjects


@check("C11", "claim without act -> CAPABILITY_MISSING", profile=PUBLISHED)
async def c11(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "c11", ["job-1"])
    reader = await ctx.sub(m, capabilities=["observe"])
    need("act" not in reader.body["capabilities"], f"asked observe, granted {reader.body['capabilities']}")
    expect(await ctx.lease(reader, "claim", subject=j1), 403, "CAPABILITY_MISSING", "claim without act")
    actor = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(actor, "claim", subject=j1), 201, what="control: claim with act")


@check(
    "C12",
    "two concurrent claims: exactly one wins, the other LEASE_HELD naming the holder",
    profile=PUBLISHED,
)
async def c12(ctx: Context) -> str:
    m, (j1, j2) = await _act_monitor(ctx, "c12", ["job-1", "job-2"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    for subject in (j1, j2):
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


@check("C13", "complete after expiry and a new holder -> LEASE_LOST", profile=PUBLISHED)
async def c13(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "c13", ["job-1"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s1, "claim", subject=j1, lease_duration_seconds=1), 201, what="first claim")
    expect(await ctx.lease(s2, "claim", subject=j1), 409, "LEASE_HELD", "control: claim while held")
    await ctx.t.sleep(1.1)
    expect(await ctx.lease(s2, "claim", subject=j1), 201, what="claim after expiry")
    expect(await ctx.lease(s1, "complete", subject=j1, outcome="done"), 409, "LEASE_LOST", "stale complete")
    expect(
        await ctx.lease(s2, "complete", subject=j1, outcome="done"),
        200,
        what="control: new holder completes",
    )


async def _types_in(ctx: Context, m: Monitor, t: str) -> list[dict[str, Any]]:
    return [o for o in await ctx.log(m) if o["type"] == t]


@check(
    "C14",
    "pause, resume, retire and subscription retire emit observations; paused refuses UNAVAILABLE",
    profile=PUBLISHED,
)
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
    retired = [payload(o) for o in await _types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(p.get("subscription") == s.id for p in retired), f"no subscription_retired for {s.id}: {retired}"
    )


@check(
    "C15",
    "state carries as_of, covers_until, live, confidence with missing inputs never defaulted",
    profile=PUBLISHED,
)
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


@check("C16", "a refused input is visible as a rejected observation with its raw payload", profile=PUBLISHED)
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


@check(
    "C17",
    "a cursor below a real retention floor -> 410 CURSOR_EXPIRED with retention_floor and relist",
    profile=PUBLISHED,
)
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
    need(p["observations"] and seq_of(p["observations"][0]) >= floor, f"control: replay from the floor {p}")
    need(p["retention_floor"] == floor, f"pull retention_floor {p['retention_floor']} != {floor}")
    need((await ctx.state(m))["retention_floor"] == floor, "state retention_floor differs")


@check("C18", "a private monitor is listed only with its token", profile=PUBLISHED)
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
    profile=PUBLISHED,
)
async def c19(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "c19", ["job-1"])
    await ctx.log(m)  # the log reader exists before time passes, with the default mute allowance
    subscriber = f"agent:{ctx.uid('mute')}"
    s = await ctx.sub(m, subscriber, capabilities=["observe", "act"], retire_after_mute_seconds=1)
    other = await ctx.sub(m, capabilities=["observe", "act"])
    await ctx.pub(m)
    p = await ctx.pulled(s)
    expect(await ctx.ack(s, p["next"]), 200, what="ack")
    expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    expect(await ctx.lease(other, "claim", subject=j1), 409, "LEASE_HELD", "control: held before the sweep")
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
    expect(await ctx.lease(other, "claim", subject=j1), 201, what="the retired holder's lease was not freed")
    again = await ctx.sub(m, subscriber, token=s.token)
    need(again.id == s.id, f"re-subscribing made a new subscription {again.id} instead of {s.id}")
    need(again.body["cursor"] == p["next"] and again.body["active"] is True, f"re-subscribed {again.body}")
    expect(await ctx.pull(again), 200, what="control: the reactivated subscription pulls")


@check("C20", "an identical ack returns the prior result", profile=PUBLISHED)
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
    need(a4["cursor"] == p["next"] + 1 and a4["head"] > a1["head"], f"control ack {a4}")


@check("C20b", "re-claiming a held lease returns the same lease", profile=PUBLISHED)
async def c20b(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "c20b", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c1 = expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    need(c1.get("idempotent") is False, f"first claim idempotent={c1.get('idempotent')}")
    c2 = expect(await ctx.lease(s, "claim", subject=j1), 200, what="holder re-claims")
    need(c2.get("idempotent") is True, f"re-claim idempotent={c2.get('idempotent')}")
    need(c2["lease"] == c1["lease"], f"re-claim returned another lease: {c1['lease']} vs {c2['lease']}")


def _names(obs: dict[str, Any], m: Monitor, target: dict[str, Any]) -> bool:
    sup = obs["data"]["provenance"].get("supersedes")
    return isinstance(sup, dict) and sup.get("id") == target["id"] and sup.get("source") == f"monitor:{m.id}"


@check("C21", "a correction carries supersedes and the original is unchanged", profile=PUBLISHED)
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


@check(
    "C22",
    "an ack computed from the spec's cursor definition makes the acked observations not come back",
    profile=PUBLISHED,
)
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
    rest = {seq_of(o) for o in (await ctx.pulled(s, cursor=0, limit=await ctx.page()))["observations"]}
    rest = {x for x in rest if x >= p["next"]}
    new = await ctx.pub(m)
    p2 = await ctx.pulled(s, limit=await ctx.page())
    got = {seq_of(o) for o in p2["observations"]}
    need(not (acked & got), f"acked seqs came back: {sorted(acked & got)}")
    need(
        seq_of(new) in got and rest <= got and min(got) >= p["next"],
        f"control: the rest {sorted(rest)} + {seq_of(new)} did not come: {sorted(got)}",
    )
    expect(await ctx.ack(s, p2["next"]), 200, what="ack the rest")
    p3 = await ctx.pulled(s)
    need(p3["observations"] == [] and p3["next"] == p3["head"] + 1, f"after the last ack {p3}")


@check("C23", "wrong and missing bearer are both 401", profile=PUBLISHED)
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


@check("C24", "a lease claimed by its holder completes", profile=PUBLISHED)
async def c24(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "c24", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=30), 201, what="claim")
    lease = c["lease"]
    need(lease["subject"] == j1 and lease["holder"] == f"sub:{s.id}", f"lease {lease}")
    need(
        lease["lease_duration_seconds"] == 30 and _posint(lease.get("delivery_count_limit")), f"lease {lease}"
    )
    d = expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete")
    need(d.get("ok") is True and isinstance(d.get("seq"), int), f"complete reply {d}")
    rows = [payload(o) for o in await _types_in(ctx, m, T_LEASE)]
    need([r.get("action") for r in rows] == ["claim", "complete"], f"lease rows {rows}")
    need(all(r.get("subject") == j1 and r.get("subscription") == s.id for r in rows), f"lease rows {rows}")


@check(
    "C25",
    "a caught-up reader has lag 0 and another monitor's traffic moves neither its lag nor its head",
    profile=PUBLISHED,
)
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
    need(p["lag"] == 1 and p["head"] > head, f"control: own traffic gives lag {p['lag']} head {p['head']}")


@check(
    "C26",
    "every provenance inflation is refused while delegation to the owner is honoured",
    profile=PUBLISHED,
)
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


@check("C27", "a non-integer cursor is refused in ack and in pull", profile=PUBLISHED)
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


@check("C28", "a stranger cannot be granted act by asking", profile=PUBLISHED)
async def c28(ctx: Context) -> None:
    caps = ["observe", "react", "act"]
    m = await ctx.create("c28", visibility="public", capabilities=caps, default_grant=["observe"])
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


@check("C29", "every object received validates against its schema", final=True, profile=PUBLISHED)
async def c29(ctx: Context) -> str:
    await _tour(ctx)
    try:
        from monitor_protocol.core.schemas import schema_dir, validators
    except ImportError as exc:  # pragma: no cover - the engine always ships the module
        raise CheckFailed(f"cannot load the schema helpers: {exc}") from exc
    try:
        import jsonschema  # noqa: F401
    except ImportError as exc:
        ctx.c29_counts = {}  # type: ignore[attr-defined]
        raise Skip(
            f"jsonschema is not importable here, so nothing could be validated ({exc}); install jsonschema"
            " to run this check"
        ) from exc
    dirs: list[tuple[str, Any]] = []
    if ctx.profile != PUBLISHED or not ctx.reference_schema_dir:
        # the published profile judges another implementation by the published schemas when it has them
        dirs.append(("project", schema_dir()))
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
    need(all(sum(c.values()) > 0 for c in counts.values()), f"nothing was validated: {counts}")
    return summary


async def _tour(ctx: Context) -> None:
    """Make sure at least one of every kind was received, whatever subset of checks ran."""
    m = await ctx.create("c29", capabilities=["observe", "act"], types=[A], ttl_seconds=3600)
    job = ctx.uid("job")
    await ctx.pub(m, subject=job, data={"n": 1}, tags={"k": "v"})
    s = await ctx.sub(m, capabilities=["observe", "act"], filter={"types": [A]})
    p = await ctx.pulled(s)
    await ctx.ack(s, p["next"])
    await ctx.lease(s, "claim", subject=job)
    await ctx.state(m)
    await ctx.req("GET", "/monitors", token=m.token)
    await ctx.publish(m, tier="nope")


@check("C30", "a foreign Origin is refused, no Origin is served", profile=PUBLISHED)
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


@check("C32", "a subscriber's name is not a credential", profile=PUBLISHED)
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
    "C33",
    "a reject that reaches delivery_count_limit dead-letters the subject; later claims DEAD_LETTERED",
    profile=PUBLISHED,
)
async def c33(ctx: Context) -> None:
    m, (j1, j2) = await _act_monitor(ctx, "c33", ["job-1", "job-2"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    limit = None
    attempt = 0
    while limit is None or attempt < limit:
        attempt += 1
        c = await ctx.lease(s, "claim", subject=j1)
        need(c.status in (200, 201), f"claim {attempt} before the limit: {c!r}")
        if limit is None:
            limit = (c.get("lease") or {}).get("delivery_count_limit")
            need(_posint(limit) and limit <= 100, f"the lease's delivery_count_limit: {c.body}")
        r = expect(
            await ctx.lease(s, "reject", subject=j1, reason=f"try {attempt}"),
            200,
            what=f"reject {attempt}",
        )
        need(
            r.get("dead_letter") is (attempt == limit),
            f"reject {attempt} of {limit}: dead_letter={r.get('dead_letter')}",
        )
    expect(await ctx.lease(s, "claim", subject=j1), 409, "DEAD_LETTERED", "claim after dead-lettering")
    expect(await ctx.lease(s, "claim", subject=j2), 201, what="control: another subject is still claimable")


@check(
    "C34", "a subscription claims only subjects its own monitor published (else NOT_FOUND)", profile=PUBLISHED
)
async def c34(ctx: Context) -> None:
    mine, (in_mine,) = await _act_monitor(ctx, "c34", ["in-mine"])
    theirs, (in_theirs,) = await _act_monitor(ctx, "c34t", ["in-theirs"])
    s = await ctx.sub(mine, capabilities=["observe", "act"])
    expect(
        await ctx.lease(s, "claim", subject=in_theirs), 404, "NOT_FOUND", "claim another monitor's subject"
    )
    expect(
        await ctx.lease(s, "claim", subject=ctx.uid("never-published")),
        404,
        "NOT_FOUND",
        "claim an unknown subject",
    )
    expect(await ctx.lease(s, "claim", subject=in_mine), 201, what="control: claim its own monitor's subject")
    t = await ctx.sub(theirs, capabilities=["observe", "act"])
    expect(
        await ctx.lease(t, "claim", subject=in_theirs),
        201,
        what="control: the other monitor's reader claims it",
    )


# ---- beyond the published list ----------------------------------------------------------------------


@check("X01", "seek needs a reason, is logged, and moves back", profile=PROJECT)
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


@check("X02", "renew: the old token is dead at once, the new one works, same cursor", profile=PROJECT)
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
    "X03",
    "subscription retire: pull is 404 {retired, cursor}; re-subscribing reactivates with the cursor",
    profile=PROJECT,
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


@check("X04", "a supersedes chain keeps every link and every original", profile=PROJECT)
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


@check("X05", "compaction: reset_policy earliest moves to the floor, latest to head + 1", profile=PROJECT)
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


@check("X06", "a replay after a relist ends with a bookmark observation", profile=PROJECT)
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


@check(
    "X07",
    "a paused or retired monitor refuses writes with UNAVAILABLE, rejected_seq and live",
    profile=PROJECT,
)
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


@check("X08", "complete is idempotent", profile=PROJECT)
async def x08(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "x08", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    d1 = expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete")
    d2 = expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete again")
    same = {k: d2.get(k) for k in ("ok", "seq", "lease") if k in d1} == {
        k: d1[k] for k in ("ok", "seq", "lease") if k in d1
    }
    need(same, f"second complete is not the prior result: {d1} vs {d2}")
    rows = [payload(o).get("action") for o in await _types_in(ctx, m, T_LEASE)]
    need(rows.count("complete") == 1, f"complete logged {rows.count('complete')} times")


@check("X09", "JSON-RPC: single and batch calls, numeric error codes in the section 3 order", profile=PROJECT)
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


@check("X10", "lag counts only what the subscription's own filter lets through", profile=PROJECT)
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


@check(
    "X11",
    "every error body has code, a sentence, done[] and the status of its code",
    final=True,
    profile=PROJECT,
)
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


@check("X12", "malformed input is a 400 (or 404/413) with a code, never a 500", profile=PROJECT)
async def x12(ctx: Context) -> str | None:
    m = await ctx.create("x12", capabilities=["observe", "act"])
    job = ctx.uid("job")
    await ctx.pub(m, subject=job)
    s = await ctx.sub(m, capabilities=["observe", "act"])
    path = f"/monitors/{m.id}/observations"
    for raw in (b"{not json", b"[1,2]", b'"text"', b"\xff\xfe"):
        r = await ctx.req("POST", path, raw_body=raw, token=m.token)
        if raw.startswith(b"[") and r.status == 207 and await _has_extension(ctx, EXT_PUBLISH_BATCH):
            # a batch publish (X47): each item that is not an observation is refused on its own
            codes = [(x.get("error") or {}).get("code") for x in (r.body.get("results") or [])]
            need(codes == ["INVALID", "INVALID"], f"body {raw!r} as a batch: {r!r}"[:300])
            continue
        expect(r, 400, "INVALID", f"body {raw!r}")
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
        r = await ctx.lease(s, "claim", subject=job, lease_duration_seconds=dur)
        need(r.status == 400 and r.get("code") == "INVALID", f"lease_duration_seconds {dur!r}: {r!r}")
    expect(
        await ctx.lease(s, "claim", subject=job, lease_duration_seconds=5),
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


@check(
    "X13",
    "monitor create defaults, DUPLICATE, validation, update as a versioned configured observation",
    profile=PROJECT,
)
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


@check(
    "X14", "an observation at or below the delivered high-water mark is marked redelivered", profile=PROJECT
)
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


@check("X15", "retiring a subscription releases its leases", profile=PROJECT)
async def x15(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "x15", ["job-1"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s1, "claim", subject=j1), 201, what="claim")
    expect(await ctx.lease(s2, "claim", subject=j1), 409, "LEASE_HELD", "control: held")
    expect(
        await ctx.req("POST", f"/subscriptions/{s1.id}/retire", body={"reason": "x"}, token=s1.token),
        200,
        what="retire",
    )
    expect(await ctx.lease(s2, "claim", subject=j1), 201, what="claim after the holder retired")


@check("X16", "a shared monitor is readable only with the subscribe token", profile=PROJECT)
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


@check("X17", "ack is clamped to head + 1", profile=PROJECT)
async def x17(ctx: Context) -> None:
    m = await ctx.create("x17")
    await ctx.pub(m)
    s = await ctx.sub(m)
    a = expect(await ctx.ack(s, 10**9), 200, what="ack far ahead")
    need(a["cursor"] == a["head"] + 1, f"ack cursor {a['cursor']} head {a['head']}")
    await ctx.pub(m)
    p = await ctx.pulled(s)
    need(len(p["observations"]) == 1, f"control: the next observation still arrives: {p['observations']}")


@check("X18", "lease renew by the holder extends it; by anyone else it is refused", profile=PROJECT)
async def x18(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "x18", ["job-1"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s1, "claim", subject=j1, lease_duration_seconds=1), 201, what="claim")
    await ctx.t.sleep(0.6)
    r = expect(await ctx.lease(s1, "renew", subject=j1), 200, what="renew")
    need(r["lease"]["renew_time"] > c["lease"]["renew_time"] and "expires" in r, f"renew {r}")
    await ctx.t.sleep(0.6)  # past the claim's expiry, within the renewal's
    expect(await ctx.lease(s2, "claim", subject=j1), 409, "LEASE_HELD", "renewed lease is still held")
    r2 = await ctx.lease(s2, "renew", subject=j1)
    need(
        r2.status == 409 and r2.get("code") in ("LEASE_HELD", "LEASE_LOST"), f"renew by a non-holder: {r2!r}"
    )
    expect(await ctx.lease(s1, "release", subject=j1), 200, what="release")
    expect(await ctx.lease(s2, "claim", subject=j1), 201, what="control: claim after release")


@check("X19", "only the owner configures a monitor", profile=PROJECT)
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


@check("X20", "pull limit defaults to 50; limit=N returns at most N", profile=PROJECT)
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


@check("X21", "a filter matches by addressing: types prefix, subjects, actors, #tags", profile=PROJECT)
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


@check("X22", "from: head, earliest or an integer sets where a new subscription starts", profile=PROJECT)
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
    "X23",
    "state projection: counters, last, single_actor, stale_source, contradictions_open never below 0",
    profile=PROJECT,
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


# ---- this project's rules beyond the published list (PROTOCOL.md sections 3, 6-10, end of 11) ---------


async def _logged(ctx: Context, m: Monitor, body: dict[str, Any], what: str) -> None:
    """The refusal's body names a rejected_seq and that seq of `m` is a rejected observation."""
    rs = need_rejected_seq(body, what)
    row = await ctx.at(m, rs)
    need(row["type"] == T_REJECTED, f"{what}: seq {rs} is {row['type']}, not a rejected observation")


async def _publish_raw(ctx: Context, m: Monitor, raw: bytes, headers: dict[str, str] | None = None) -> Reply:
    return await ctx.req(
        "POST", f"/monitors/{m.id}/observations", raw_body=raw, token=m.token, headers=headers
    )


def _refused(reply: Reply, what: str, codes: tuple[str, ...] = ("INVALID",)) -> dict[str, Any]:
    """A 400 (or 413 for TOO_LARGE) whose code is one of `codes`."""
    ok = reply.code in codes and reply.status == ERROR_STATUS.get(reply.code or "", 0)
    need(ok, f"{what}: expected a refusal {'/'.join(codes)}, got {reply!r}")
    return reply.body


def _iso(ts: float) -> str:
    import datetime as dt

    d = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def _epoch(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _row_of(rows: list[dict[str, Any]], sub_id: str, key: str | None = None) -> dict[str, Any] | None:
    for o in rows:
        p = payload(o)
        if p.get("subscription") == sub_id and (key is None or key in p):
            return o
    return None


def _system_measured(o: dict[str, Any], what: str) -> None:
    prov = (o.get("data") or {}).get("provenance") or {}
    need(
        o.get("origin") == "system"
        and o.get("tier") == "measured"
        and o.get("verified") == "machine_verified",
        f"{what}: origin/tier/verified {o.get('origin')}/{o.get('tier')}/{o.get('verified')},"
        " expected system/measured/machine_verified",
    )
    need(
        prov.get("origin") == "system"
        and prov.get("tier") == "measured"
        and prov.get("verification") == "machine_verified",
        f"{what}: provenance {prov}",
    )


@check(
    "X24",
    "subscriber names of any form are accepted as agents; whitespace, control characters or > 256 are INVALID",
    profile=PROJECT,
)
async def x24(ctx: Context) -> None:
    m = await ctx.create("x24", visibility="public")
    for name in ("reader-104749", "x", "mailto:a@b", "a" * 256):
        s = await ctx.sub(m, name)
        need(
            s.body.get("subscriber") == name,
            f"subscriber {name[:40]!r} came back as {s.body.get('subscriber')!r}",
        )
        expect(await ctx.pull(s), 200, what=f"control: subscriber {name[:40]!r} pulls")
    for name in ("human:you\n", "human:you x", "agent:\tbot", "agent:bot\x00", "a" * 257, ""):
        _refused(await ctx.subscribe(m, name), f"subscriber {name[:40]!r}")
    for actor in ("reader-104749", "x", "mailto:a@b"):
        obs = await ctx.pub(m, actor=actor)
        need(
            obs["actor"] == actor and obs["origin"] == "agent" and obs["tier"] == "unverified",
            f"actor {actor!r} is not treated as an agent: {obs['actor']} {obs['origin']} {obs['tier']}",
        )
    for actor in ("agent:bot\n", "agent:b ot", "agent:" + "a" * 251):
        b = _refused(await ctx.publish(m, actor=actor), f"publish actor {actor[:40]!r}")
        await _logged(ctx, m, b, f"publish actor {actor[:40]!r}")
    obs = await ctx.pub(m, actor="agent:" + "a" * 250)
    need(len(obs["actor"]) == 256, "control: a 256-character actor is kept")


@check(
    "X25",
    "no anonymous caller writes origin human: subscribed and seek rows are system, measured, machine_verified",
    profile=PROJECT,
)
async def x25(ctx: Context) -> None:
    m = await ctx.create("x25", visibility="public")
    await ctx.pub(m)
    s = await ctx.sub(m, "human:ceo", token=None)
    a = await ctx.catch_up(s)
    r = await ctx.req(
        "POST",
        f"/subscriptions/{s.id}/seek",
        body={"cursor": 1, "reason": "human:ceo says so"},
        token=s.token,
    )
    expect(r, 200, what="seek by the anonymous subscriber")
    rows = await _types_in(ctx, m, T_SUBSCRIBED)
    sub_row = _row_of([o for o in rows if "seek" not in payload(o)], s.id)
    seek_row = _row_of(rows, s.id, "seek")
    need(sub_row is not None, f"no subscribed row for {s.id}")
    need(seek_row is not None, f"no seek row for {s.id} (cursor was {a['cursor']})")
    for row, what in ((sub_row, "subscribed row"), (seek_row, "seek row")):
        _system_measured(row, what)
        need(row["actor"] == "human:ceo", f"{what}: the actor is not kept as given: {row['actor']!r}")
    humans = [o["id"] for o in await ctx.log(m) if o.get("origin") == "human"]
    need(not humans, f"an anonymous caller put origin human into the log at seqs {humans}")


@check(
    "X26",
    "bounded inputs: filter text <= 256, a filter <= 4 KiB, seek and configuration reasons <= 1 KiB",
    profile=PROJECT,
)
async def x26(ctx: Context) -> None:
    m = await ctx.create("x26")
    await ctx.pub(m)
    codes = ("INVALID", "INVALID_FILTER", "TOO_LARGE")
    _refused(await ctx.subscribe(m, filter={"text": "t" * 257}), "filter text of 257 characters", codes)
    await ctx.sub(m, filter={"text": "t" * 256})
    big = {"subjects": [f"{i:03d}-" + "s" * 96 for i in range(45)]}  # ~4.6 KiB serialized
    need(len(json.dumps(big)) > 4096, "test setup: the big filter is not over 4 KiB")
    _refused(await ctx.subscribe(m, filter=big), f"a filter of {len(json.dumps(big))} bytes", codes)
    fits = {"subjects": big["subjects"][:30]}
    need(len(json.dumps(fits)) < 4000, "test setup: the control filter is not under 4 KiB")
    await ctx.sub(m, filter=fits)
    s = await ctx.sub(m)
    await ctx.catch_up(s)
    path = f"/subscriptions/{s.id}/seek"
    r = await ctx.req("POST", path, body={"cursor": 1, "reason": "r" * 1025}, token=s.token)
    _refused(r, "a seek reason of 1025 characters", ("INVALID", "TOO_LARGE"))
    r = await ctx.req("POST", path, body={"cursor": 1, "reason": "r" * 1024}, token=s.token)
    expect(r, 200, what="control: a seek reason of 1024 characters")
    r = await ctx.configure(m, "update", {"patch": {"description": "d"}, "reason": "r" * 1025})
    _refused(r, "a configuration reason of 1025 characters", ("INVALID", "TOO_LARGE"))
    r = await ctx.configure(m, "update", {"patch": {"description": "d"}, "reason": "r" * 1024})
    expect(r, 200, what="control: a configuration reason of 1024 characters")


@check(
    "X27",
    "provenance rules 6 and 7: another human or system actor is PROVENANCE_CEILING; prefixes are lower-case",
    profile=PROJECT,
)
async def x27(ctx: Context) -> None:
    owner = f"human:{ctx.uid('you')}"
    m = await ctx.create("x27", owner=owner)
    for body, what in (
        ({"actor": "human:stranger"}, "actor human:stranger on a monitor of another person"),
        ({"actor": owner + "x"}, "actor a prefix-extension of the owner"),
        ({"actor": "system:guard"}, "actor system:guard"),
        ({"origin": "system"}, "declared origin system"),
        ({"actor": "probe:p", "origin": "system"}, "a probe declaring origin system"),
    ):
        b = expect(await ctx.publish(m, **body), 403, "PROVENANCE_CEILING", what)
        await _logged(ctx, m, b, what)
    odd = await ctx.pub(m, actor="HuMaN:x")
    need(
        odd["actor"] == "HuMaN:x" and odd["origin"] == "agent" and odd["tier"] == "unverified",
        f"actor HuMaN:x is not an agent: {odd['origin']} {odd['tier']}",
    )
    mine = await ctx.pub(m, actor=owner)
    need(mine["origin"] == "human" and mine["actor"] == owner, f"control: the owner itself: {mine['origin']}")
    plain = await ctx.pub(m)
    need(plain["actor"] == owner, f"control: actor defaults to the owner, got {plain['actor']}")


@check(
    "X28",
    "an inline pull filter disjoint from the subscription's is INVALID_FILTER; an overlapping one narrows",
    profile=PROJECT,
)
async def x28(ctx: Context) -> None:
    owner = f"human:{ctx.uid('o')}"
    m = await ctx.create("x28", owner=owner)
    s1, s2, s3 = ctx.uid("s1"), ctx.uid("s2"), ctx.uid("s3")
    await ctx.pub(m, type=A, subject=s1, actor="probe:p1")
    await ctx.pub(m, type=B, subject=s2, actor="probe:p2")
    await ctx.pub(m, type=C, subject=s3, actor="probe:p3")
    flt = {"types": [A, B], "subjects": [s1, s2], "actors": ["probe:p1", "probe:p2"]}
    s = await ctx.sub(m, filter=flt)
    for key, inline, theirs in (("types", C, A), ("subjects", s3, s1), ("actors", "probe:p3", "probe:p1")):
        b = expect(await ctx.pull(s, **{key: inline}), 400, "INVALID_FILTER", f"inline {key}={inline}")
        text = json.dumps(b)
        need(inline in text and theirs in text, f"inline {key}: the refusal does not name both filters: {b}")
    for key, inline, want in (("types", A, [A]), ("subjects", s2, [B]), ("actors", "probe:p1", [A])):
        got = [
            o["type"]
            for o in (await ctx.pulled(s, **{key: [inline, "zz.unrelated.x"] if key == "types" else inline}))[
                "observations"
            ]
        ]
        need(got == want, f"control: inline {key}={inline} delivered {got}, expected {want}")


@check(
    "X29",
    "time: more than 300 s ahead is INVALID and logged; a past time is kept; ages follow the server's clock",
    profile=PROJECT,
)
async def x29(ctx: Context) -> None:
    m = await ctx.create("x29")
    await ctx.pub(m)
    now = _epoch((await ctx.state(m))["as_of"])
    ahead = _iso(now + 400)
    b = _refused(await ctx.publish(m, time=ahead), f"time {ahead} (400 s ahead of the server)")
    await _logged(ctx, m, b, "a time 400 s ahead")
    soon = _iso(now + 120)
    obs = await ctx.pub(m, time=soon)
    need(obs["time"] == soon, f"control: a time 120 s ahead is kept: {obs['time']} (sent {soon})")
    past = _iso(now - 3 * 365 * 86400)
    obs = await ctx.pub(m, time=past)
    need(
        obs["time"] == past, f"a past time is not kept as the publisher's claim: {obs['time']} (sent {past})"
    )
    st = await ctx.state(m)
    age = st["ages"]["since_last_observation_s"]
    need(
        isinstance(age, int) and 0 <= age <= 60, f"ages follow the publisher's time, not the server's: {age}"
    )
    cu = st.get("covers_until")
    need(
        isinstance(cu, str) and abs(_epoch(cu) - _epoch(st["as_of"])) <= 300,
        f"covers_until {cu} is not near the server's clock (as_of {st['as_of']})",
    )


def _nested(depth: int, kind: str = "object") -> Any:
    """A JSON value `depth` levels deep (`{}` and `[]` are one level)."""
    v: Any = {} if kind == "object" else []
    for _ in range(depth - 1):
        v = {"a": v} if kind == "object" else [v]
    return v


@check("X30", "JSON nesting deeper than 32 levels is refused and logged; 32 is accepted", profile=PROJECT)
async def x30(ctx: Context) -> None:
    m = await ctx.create("x30")
    for kind in ("object", "array"):
        # the body itself is level 1, so data may be 31 levels deep
        expect(await ctx.publish(m, data={"v": _nested(30, kind)}), 201, what=f"control: 32 levels ({kind})")
        b = _refused(await ctx.publish(m, data={"v": _nested(31, kind)}), f"33 levels ({kind})")
        await _logged(ctx, m, b, f"33 levels ({kind})")
    deep = b'{"type":"' + A.encode() + b'","data":' + b"[" * 200 + b"]" * 200 + b"}"
    b = _refused(await _publish_raw(ctx, m, deep), "200 levels of arrays")
    await _logged(ctx, m, b, "200 levels")


@check("X31", "NaN, Infinity, 1e400 and lone surrogates in a body are refused and logged", profile=PROJECT)
async def x31(ctx: Context) -> None:
    m = await ctx.create("x31")
    head = b'{"type":"' + A.encode() + b'","data":{"x":'
    for lit in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b'"\\ud800"', b'"a\\udc00b"'):
        b = _refused(await _publish_raw(ctx, m, head + lit + b"}}"), f"data.x = {lit.decode()}")
        await _logged(ctx, m, b, f"data.x = {lit.decode()}")
    r = await ctx.req(
        "POST",
        "/subscriptions",
        raw_body=b'{"monitor":"' + m.id.encode() + b'","subscriber":"\\ud800"}',
        token=m.token,
    )
    _refused(r, "a lone surrogate in a subscribe body")
    for lit, want in ((b"1.5", 1.5), (b"1e300", 1e300), (b'"\\ud83d\\ude00"', "\U0001f600")):
        r = expect(
            await _publish_raw(ctx, m, head + lit + b"}}"), 201, what=f"control: data.x = {lit.decode()}"
        )
        need(
            r["observation"]["data"].get("x") == want,
            f"control: data.x = {lit.decode()} stored as {r['observation']['data']}",
        )


@check(
    "X32",
    "subjects, types, actors and monitor ids over 256 characters are refused (256 accepted where allowed)",
    profile=PROJECT,
)
async def x32(ctx: Context) -> None:
    m = await ctx.create("x32")
    t256 = "com.example." + "a" * 244
    cases = (
        ("subject", {"subject": "s" * 257}, {"subject": "s" * 256}),
        ("type", {"type": t256 + "a"}, {"type": t256}),
        ("actor", {"actor": "agent:" + "a" * 251}, {"actor": "agent:" + "a" * 250}),
    )
    for what, bad, good in cases:
        b = _refused(await ctx.publish(m, **bad), f"a {what} of 257 characters")
        await _logged(ctx, m, b, f"a {what} of 257 characters")
        obs = await ctx.pub(m, **good)
        need(len(obs[what]) == 256, f"control: a {what} of 256 characters is kept")
    r = await ctx.req("POST", "/monitors", body={"id": "m" * 257}, token=ctx.t.registration_token)
    _refused(r, "a monitor id of 257 characters")
    _refused(
        await ctx.req("POST", "/subscriptions", body={"monitor": "m" * 257, "subscriber": "agent:x"}),
        "subscribe to a monitor id of 257 characters",
    )
    expect(await ctx.subscribe(m), 201, what="control: subscribe to the real monitor")


@check("X33", "integers are ASCII digits within 0..2^53 in queries and bodies", profile=PROJECT)
async def x33(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "x33", ["job"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    big = 2**53 + 1
    for q in (
        {"limit": "²"},
        {"limit": "٣"},
        {"limit": "３"},
        {"cursor": "²"},
        {"cursor": str(big)},
        {"wait": "²"},
        {"limit": " 3"},
    ):
        _refused(await ctx.pull(s, **q), f"pull {q}")
    expect(await ctx.pull(s, limit="3", cursor="1", wait="0"), 200, what="control: pull limit=3 cursor=1")
    expect(await ctx.pull(s, cursor=str(2**53)), 200, what="control: pull cursor=2^53")
    _refused(await ctx.ack(s, big), "ack 2^53 + 1")
    _refused(
        await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=big), "lease_duration_seconds 2^53 + 1"
    )
    _refused(await ctx.subscribe(m, **{"from": big}), "subscribe from 2^53 + 1")
    r = await ctx.req(
        "POST", "/monitors", body={"id": ctx.uid("x33t"), "ttl_seconds": big}, token=ctx.t.registration_token
    )
    _refused(r, "ttl_seconds 2^53 + 1")
    expect(await ctx.ack(s, 2**53), 200, what="control: ack 2^53 (clamped to head + 1)")
    expect(
        await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=30), 201, what="control: duration 30"
    )


@check("X34", "a JSON-RPC batch over 100 calls is refused whole; 100 calls are served", profile=PROJECT)
async def x34(ctx: Context) -> None:
    m = await ctx.create("x34")

    def batch(n: int) -> list[dict[str, Any]]:
        return [
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "monitors/publish",
                "params": {"id": m.id, "token": m.token, "type": A},
            }
            for i in range(n)
        ]

    head = (await ctx.get_monitor(m))["head"]
    r = await ctx.req("POST", "/rpc", body=batch(101))
    # over /rpc the refusal may travel as a JSON-RPC error object (its data is the REST body)
    err = r.body.get("error") if isinstance(r.body, dict) and r.body.get("jsonrpc") == "2.0" else None
    code = ((err or {}).get("data") or {}).get("code") if isinstance(err, dict) else r.code
    need(
        code in ("INVALID", "TOO_LARGE") and r.status in (200, ERROR_STATUS[code]),
        f"a batch of 101 calls was not refused with INVALID or TOO_LARGE: {r!r}",
    )
    if err is not None:
        need(err.get("code") == JSONRPC_CODE[code], f"JSON-RPC error code {err.get('code')} for {code}")
    need((await ctx.get_monitor(m))["head"] == head, "a refused batch of 101 calls still published")
    out = expect(await ctx.req("POST", "/rpc", body=batch(100)), 200, what="control: a batch of 100 calls")
    need(isinstance(out, list) and len(out) == 100, f"control: 100 replies expected, got {str(out)[:200]}")
    need(
        all("result" in x for x in out),
        f"control: a call of the 100 failed: {[x for x in out if 'result' not in x][:1]}",
    )
    need((await ctx.get_monitor(m))["head"] >= head + 100, "control: the 100 publishes did not append")


@check(
    "X35",
    "revocation: going private retires anonymous subscriptions (revoked); dropping act revokes claims",
    profile=PROJECT,
)
async def x35(ctx: Context) -> None:
    caps = ["observe", "react", "act"]
    m, (j1, j2) = await _act_monitor(ctx, "x35", ["job-1", "job-2"], visibility="public", capabilities=caps)
    anon = await ctx.sub(m, token=None)
    owned = await ctx.sub(m, capabilities=["observe", "act"])
    a = await ctx.catch_up(anon)
    expect(await ctx.lease(owned, "claim", subject=j1), 201, what="control: claim before the update")
    expect(await ctx.lease(owned, "release", subject=j1), 200, what="control: release")
    r = await ctx.configure(m, "update", {"patch": {"visibility": "private"}, "reason": "close it"})
    expect(r, 200, what="update to private")
    b = expect(await ctx.pull(anon), 404, what="pull of an anonymous subscription after going private")
    need(b.get("retired") is True and b.get("cursor") == a["cursor"], f"revoked pull body {b}")
    wills = [payload(o) for o in await _types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(w.get("subscription") == anon.id and w.get("reason") == "revoked" for w in wills),
        f"no subscription_retired{{reason: revoked}} for {anon.id}: {wills}",
    )
    expect(await ctx.pull(owned), 200, what="control: the owner-token subscription still pulls")
    r = await ctx.configure(
        m,
        "update",
        {"patch": {"capabilities": ["observe", "react"], "default_grant": ["observe"]}, "reason": "no act"},
    )
    expect(r, 200, what="update dropping act")
    expect(
        await ctx.lease(owned, "claim", subject=j2), 403, "CAPABILITY_MISSING", "claim after act was removed"
    )
    expect(await ctx.pull(owned), 200, what="control: it still observes")


@check(
    "X36",
    "an expired lease counts as an attempt, a release does not; at the limit the subject is dead-lettered",
    profile=PROJECT,
)
async def x36(ctx: Context) -> str:
    m, (j1, j2) = await _act_monitor(ctx, "x36", ["job-1", "job-2"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=1), 201, what="claim")
    base = c["lease"].get("attempts")
    limit = c["lease"].get("delivery_count_limit")
    need(isinstance(base, int) and _posint(limit) and limit <= 20, f"lease attempts/limit {c['lease']}")
    for i in range(2):
        expect(await ctx.lease(s, "release", subject=j1), 200, what=f"release {i + 1}")
        c = expect(
            await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=1), 201, what="claim after release"
        )
        need(
            c["lease"]["attempts"] == base,
            f"a release counted as an attempt: {base} -> {c['lease']['attempts']}",
        )
    for n in range(1, limit + 1):
        await ctx.t.sleep(1.1)
        r = await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=1)
        if n < limit - base:
            b = expect(r, 201, what=f"claim after expiry {n}")
            need(
                b["lease"]["attempts"] == base + n, f"after {n} expiries attempts is {b['lease']['attempts']}"
            )
        else:
            expect(r, 409, "DEAD_LETTERED", f"claim after {n} expiries (delivery_count_limit {limit})")
            break
    expect(await ctx.lease(s, "claim", subject=j2), 201, what="control: another subject is claimable")
    return f"dead-lettered after {limit - base} expiries"


@check(
    "X37",
    "publish idempotency: a repeated idempotency_key or Idempotency-Key appends nothing; bad keys are INVALID",
    profile=PROJECT,
)
async def x37(ctx: Context) -> None:
    m = await ctx.create("x37")
    k1 = ctx.uid("key")
    first = expect(
        await ctx.publish(m, idempotency_key=k1, data={"n": 1}), 201, what="first publish with a key"
    )
    head = (await ctx.get_monitor(m))["head"]
    again = await ctx.publish(m, idempotency_key=k1, data={"n": 1})
    b = expect(again, 200, what="the same key again")
    need(
        b.get("seq") == first["seq"] and b.get("idempotent") is True,
        f"repeat reply {b} (first seq {first['seq']})",
    )
    need(b["observation"]["id"] == first["observation"]["id"], "the repeat is not the first reply")
    need((await ctx.get_monitor(m))["head"] == head, "a repeated key moved the head")
    other = expect(await ctx.publish(m, idempotency_key=ctx.uid("key")), 201, what="control: a different key")
    need(other["seq"] > first["seq"], "control: a different key appends")
    k2 = ctx.uid("hdr")
    h1 = expect(
        await ctx.publish_with_headers(m, {"Idempotency-Key": k2}), 201, what="Idempotency-Key header"
    )
    head = (await ctx.get_monitor(m))["head"]
    h2 = expect(await ctx.publish_with_headers(m, {"Idempotency-Key": k2}), 200, what="the same header again")
    need(h2.get("seq") == h1["seq"] and h2.get("idempotent") is True, f"header repeat {h2}")
    need((await ctx.get_monitor(m))["head"] == head, "a repeated header key moved the head")
    for key, what in (
        ("k" * 129, "129 characters"),
        ("a\x07b", "a control character"),
        ("caf\u00e9", "non-ASCII"),
        ("", "empty"),
        ("a b\n", "a newline"),
    ):
        _refused(await ctx.publish(m, idempotency_key=key), f"idempotency_key {what}")
    _refused(
        await ctx.publish_with_headers(m, {"Idempotency-Key": "k" * 129}), "Idempotency-Key of 129 characters"
    )
    expect(await ctx.publish(m, idempotency_key="k" * 128), 201, what="control: a key of 128 characters")


@check(
    "X38",
    "subscription ids are sub- and at least 8 hex digits; a new subscription never replaces another",
    profile=PROJECT,
)
async def x38(ctx: Context) -> str:
    m = await ctx.create("x38", visibility="public")
    subs = [await ctx.sub(m, token=None if i % 2 else ...) for i in range(24)]
    ids = [s.id for s in subs]
    bad = [i for i in ids if not re.match(r"^sub-[0-9a-f]{8,}$", i)]
    need(not bad, f"subscription ids not sub- + at least 8 hex digits: {bad[:3]}")
    need(len(set(ids)) == len(ids), f"a subscription id was minted twice: {ids}")
    for s in subs:
        expect(await ctx.pull(s), 200, what=f"the token of {s.id} still pulls after later subscribes")
    return f"ids of {sorted({len(i) - 4 for i in ids})} hex digits"


async def _retire_now(ctx: Context, reply: Reply) -> None:
    """A subscription the check did not want: retire it at once, before any push can go out."""
    sub = reply.get("subscription") or {}
    if isinstance(sub, dict) and sub.get("id") and reply.get("token"):
        await ctx.req(
            "POST",
            f"/subscriptions/{sub['id']}/retire",
            body={"reason": "conformance"},
            token=reply.get("token"),
        )


@check(
    "X39",
    "HTTP push needs the owner or subscribe token; loopback and link-local sinks are INVALID (no connection)",
    profile=PROJECT,
)
async def x39(ctx: Context) -> None:
    m = await ctx.create("x39", visibility="public")
    outside = "https://example.invalid/mp-conformance"  # RFC 2606: never resolves, so nothing is sent
    push = {"protocol": "http", "from": "head"}
    r = await ctx.subscribe(m, token=None, sink=outside, **push)
    if r.status == 201:
        await _retire_now(ctx, r)
    expect(r, 401, "UNAUTHORIZED", "an anonymous push subscription")
    expect(
        await ctx.subscribe(m, token=None, **{"from": "head"}),
        201,
        what="control: an anonymous pull subscription",
    )
    for sink in (
        "http://127.0.0.1:9/x",
        "http://169.254.169.254/",
        "http://[::1]:9/x",
        "http://localhost:9/x",
    ):
        r = await ctx.subscribe(m, sink=sink, **push)
        if r.status == 201:
            await _retire_now(ctx, r)
            raise CheckFailed(
                f"the server accepted the internal sink {sink} (retired at once): that is only right when it was"
                " started with --allow-sink"
            )
        body = _refused(r, f"sink {sink}")
        need(
            isinstance(body.get("error"), str) and body["error"], f"sink {sink}: no sentence naming the rule"
        )
    r = await ctx.subscribe(m, sink=outside, **push)
    if r.status == 201:
        await _retire_now(ctx, r)
    expect(r, 201, what=f"control: the owner's push subscription to {outside}")


@check("X40", "an unknown HTTP method gets the protocol's error body with a code", profile=PROJECT)
async def x40(ctx: Context) -> None:
    if not getattr(ctx.t, "real_http", False):
        raise Skip("needs a real HTTP server: the in-process transport has no request line to get wrong")
    for method, path in (("FOO", "/discover"), ("BREW", "/monitors")):
        r = await ctx.t.request(method, path)  # not recorded: section 3 gives no status for this code
        need(400 <= r.status < 500, f"{method} {path}: status {r.status} (a 4xx expected): {r!r}")
        b = r.body
        need(
            isinstance(b, dict) and b.get("code") in ERROR_STATUS and isinstance(b.get("error"), str),
            f"{method} {path}: not the protocol's error body: {r!r}",
        )
    expect(await ctx.req("GET", "/discover"), 200, what="control: GET /discover")


# ---- moved from the published checks: this project's own choices ----------------------------------------


@check(
    "X41",
    "this project's defaults: max_limit 200, default_limit 50, max_wait_seconds 50, delivery_count_limit 5",
    profile=PROJECT,
)
async def x41(ctx: Context) -> None:
    d = await ctx.discover()
    lim = d.get("limits") or {}
    need(
        lim.get("max_limit") == 200 and lim.get("default_limit") == 50 and lim.get("max_wait_seconds") == 50,
        f"limits {lim}",
    )
    dcl = ((d.get("capabilities") or {}).get("leases") or {}).get("delivery_count_limit")
    need(dcl == 5, f"discover's leases.delivery_count_limit is {dcl!r}, not 5")
    m, (j1,) = await _act_monitor(ctx, "x41", ["job"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    need(c["lease"].get("delivery_count_limit") == 5, f"a lease's delivery_count_limit: {c['lease']}")
    need(
        _posint(c["lease"].get("lease_duration_seconds")), f"a positive default lease duration: {c['lease']}"
    )


@check(
    "X42",
    "per-monitor dense seqs: a monitor's log starts at 1, has no gaps, and another monitor takes none",
    profile=PROJECT,
)
async def x42(ctx: Context) -> None:
    m = await ctx.create("x42")
    n = await ctx.create("x42n")
    for _ in range(3):
        await ctx.pub(m)
        await ctx.pub(n)
    seqs = [seq_of(o) for o in await ctx.log(m)]
    need(seqs and seqs[0] == 1, f"a monitor's own sequence starts at 1, got {seqs[:3]}")
    need(seqs == list(range(1, len(seqs) + 1)), f"seqs not dense: {seqs}")
    head = (await ctx.get_monitor(m))["head"]
    need(head == seqs[-1], f"head {head} is not the last seq {seqs[-1]}")
    obs = await ctx.pub(m)
    need(seq_of(obs) == head + 1, f"one publish moved the head from {head} to {seq_of(obs)}")
    need((await ctx.get_monitor(m))["head"] == head + 1, "head after one publish")


@check("X43", "a lease expiry is logged once as lease{expired} by system:sweep", profile=PROJECT)
async def x43(ctx: Context) -> None:
    m, (j1,) = await _act_monitor(ctx, "x43", ["job"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s1, "claim", subject=j1, lease_duration_seconds=1), 201, what="claim")
    await ctx.t.sleep(1.1)
    expect(await ctx.lease(s2, "claim", subject=j1), 201, what="claim after expiry")
    rows = [(o["actor"], payload(o)) for o in await _types_in(ctx, m, T_LEASE)]
    expired = [(a, p) for a, p in rows if p.get("action") == "expired"]
    need(
        len(expired) == 1 and expired[0][0] == "system:sweep" and expired[0][1].get("subscription") == s1.id,
        f"the expiry is not logged once as lease{{expired}} by system:sweep for {s1.id}: {rows}",
    )
    need([p.get("action") for _, p in rows] == ["claim", "expired", "claim"], f"lease rows {rows}")


@check(
    "X44",
    "every protocol row has data.payload, data.tags.monitor and is system, measured, machine_verified",
    profile=PROJECT,
)
async def x44(ctx: Context) -> str:
    m, (j1,) = await _act_monitor(ctx, "x44", ["job"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    await ctx.catch_up(s)
    expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete")
    await ctx.publish(m, tier="nope")
    expect(await ctx.configure(m, "pause"), 200, what="pause")
    expect(
        await ctx.req("POST", f"/subscriptions/{s.id}/retire", body={"reason": "done"}, token=s.token),
        200,
        what="retire",
    )
    rows = [o for o in await ctx.log(m) if o["type"].startswith(P)]
    kinds = sorted({o["type"][len(P) :] for o in rows})
    for o in rows:
        where = f"protocol row {o['id']} ({o['type']})"
        need((o["data"].get("tags") or {}).get("monitor") == m.id, f"{where} lacks data.tags.monitor: {o}")
        need(isinstance(o["data"].get("payload"), dict), f"{where} lacks data.payload")
        _system_measured(o, where)
    return f"{len(rows)} rows: {', '.join(kinds)}"


@check(
    "X45",
    "a reader whose filter is checked row by row (a tag), behind 1,100 non-matching rows, gets what "
    "follows in a few pulls, acking or not, and an unacked page comes back",
    profile=PROJECT,
)
async def x45(ctx: Context) -> str:
    m = await ctx.create("x45", types=[A, B])
    # A tag filter: an index on type or subject cannot skip the noise, so the server must bound the work.
    early = await ctx.pub(m, type=A, subject=ctx.uid("early"), tags={"lane": "work"})
    calls = [
        {"jsonrpc": "2.0", "id": i, "method": "monitors/publish",
         "params": {"id": m.id, "type": B, "tags": {"lane": "noise"}, "token": m.token}}
        for i in range(100)
    ]  # fmt: skip
    for _ in range(11):  # more non-matching rows than this project examines in one pull (1,000)
        r = await ctx.req("POST", "/rpc", body=calls)
        need(r.status == 200 and all("result" in x for x in r.body), f"noise batch failed: {r!r}"[:300])
    needle = await ctx.pub(m, type=A, subject=ctx.uid("needle"), tags={"lane": "work"})
    s = await ctx.sub(m, filter={"#lane": ["work"]}, **{"from": 0})
    first = await ctx.pulled(s, limit=50)
    need([o["id"] for o in first["observations"]][:1] == [early["id"]], f"first page: {first}"[:300])
    again = await ctx.pulled(s, limit=50)  # never acked: the page comes back, marked
    need(
        [o["id"] for o in again["observations"]][:1] == [early["id"]] and again["observations"][0].get("redelivered"),
        f"an unacked page did not come back (redelivered): {again}"[:300],
    )  # fmt: skip
    expect(await ctx.ack(s, int(early["id"]) + 1), 200, what="ack past the early one")
    for pulls in range(1, 6):  # without acking empty pages
        page = await ctx.pulled(s, limit=50)
        got = [o["id"] for o in page["observations"]]
        if got:
            need(got == [needle["id"]], f"expected only the needle, got {got}")
            need(int(page["next"]) == int(needle["id"]) + 1, f"next after the needle: {page['next']}")
            return f"the needle after {pulls} pulls"
        need(int(page["next"]) <= int(needle["id"]), f"an empty page's next {page['next']} skips the needle")
    raise CheckFailed("5 pulls never reached the observation behind the non-matching rows")


# This project's extensions (docs/serve.md "Fewer round trips"): a server that does not advertise one in
# discover's capabilities.extensions is skipped, never failed. Their names, written here, not imported.
EXT_ACK_PULL = "monitor-protocol-python/ack-pull"
EXT_PUBLISH_BATCH = "monitor-protocol-python/publish-batch"


async def _has_extension(ctx: Context, name: str) -> dict[str, Any] | None:
    ext = ((await ctx.discover()).get("capabilities") or {}).get("extensions") or {}
    found = ext.get(name) if isinstance(ext, dict) else None
    return found if isinstance(found, dict) else None


async def _advertised(ctx: Context, name: str) -> dict[str, Any]:
    found = await _has_extension(ctx, name)
    if found is None:
        raise Skip(f"the server does not advertise the extension {name}")
    return found


@check(
    "X46",
    "ack-and-pull (an advertised extension): POST /pull {ack} commits with /ack's rules, then pulls "
    "from the new cursor; a refused ack pulls nothing; a GET pull never takes an ack",
    profile=PROJECT,
)
async def x46(ctx: Context) -> None:
    await _advertised(ctx, EXT_ACK_PULL)
    m = await ctx.create("x46", types=[A])
    s = await ctx.sub(m, filter={"types": [A]})
    ids = [(await ctx.pub(m, subject=ctx.uid(f"s{i}")))["id"] for i in range(3)]
    path = f"/subscriptions/{s.id}/pull"
    first = await ctx.pulled(s, limit=1)
    need([o["id"] for o in first["observations"]] == ids[:1], f"first page: {first}"[:300])
    both = expect(
        await ctx.req("POST", path, body={"ack": first["next"], "limit": 1}, token=s.token),
        200,
        what="ack-and-pull",
    )
    need(both.get("cursor") == first["next"], f"the reply's cursor is not the ack: {both}"[:300])
    need([o["id"] for o in both["observations"]] == ids[1:2], f"ack-and-pull page: {both}"[:300])
    back = await ctx.req("POST", path, body={"ack": 1, "limit": 1}, token=s.token)
    expect(back, 409, "CURSOR_BACKWARDS", "ack-and-pull below the committed cursor")
    info = expect(await ctx.req("GET", f"/subscriptions/{s.id}", token=s.token), 200, what="subscription")
    need(info.get("cursor") == first["next"], f"a refused ack-and-pull moved the cursor: {info}"[:300])
    expect(await ctx.pull(s, ack=both["next"]), 400, "INVALID", "a GET pull with ack")
    expect(await ctx.req("POST", path, body={"ack": "3"}, token=s.token), 400, "INVALID", 'ack "3" (text)')
    expect(await ctx.req("POST", path, body={"ack": 1}, token=None), 401, "UNAUTHORIZED", "no token")
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "feeds/pull"}
    params = {"subscription": s.id, "token": s.token, "ack": both["next"], "limit": 1}
    r = expect(await ctx.req("POST", "/rpc", body={**rpc, "params": params}), 200, what="feeds/pull ack")
    result = r.get("result") or {}
    need(result.get("cursor") == both["next"], f"feeds/pull with ack did not commit it: {r}"[:300])
    need([o["id"] for o in result.get("observations") or []] == ids[2:3], f"feeds/pull page: {r}"[:300])


@check(
    "X47",
    "batch publish (an advertised extension): an array body publishes each item in order, refuses and "
    "logs each bad item on its own, and refuses a batch over its advertised size whole",
    profile=PROJECT,
)
async def x47(ctx: Context) -> None:
    info = await _advertised(ctx, EXT_PUBLISH_BATCH)
    most = info.get("max_items")
    need(_posint(most), f"the extension does not say its max_items: {info}")
    m = await ctx.create("x47", types=[A])
    path = f"/monitors/{m.id}/observations"
    subjects = [ctx.uid("b") for _ in range(3)]
    items: list[Any] = [
        {"type": A, "subject": subjects[0]},
        {"type": "com.example.undeclared.x47"},
        {"type": A, "subject": subjects[1]},
        "not an object",
        {"type": A, "subject": subjects[2]},
    ]
    r = await ctx.req("POST", path, body=items, token=m.token)
    need(r.status == 207, f"a batch answered {r.status}, not 207: {r!r}"[:300])
    results = r.body.get("results") if isinstance(r.body, dict) else None
    need(isinstance(results, list) and len(results) == len(items), f"one result per item: {r.body}"[:300])
    assert isinstance(results, list)
    need([x.get("index") for x in results] == list(range(len(items))), f"results out of order: {results}")
    ok = [x for x in results if "seq" in x]
    bad = [x for x in results if "error" in x]
    need([x["index"] for x in ok] == [0, 2, 4], f"the good items were not published: {results}"[:300])
    need(
        [(x.get("status"), (x.get("error") or {}).get("code")) for x in bad]
        == [(400, "UNKNOWN_VOCABULARY"), (400, "INVALID")],
        f"the bad items were not refused each on its own: {bad}"[:300],
    )
    seqs = [x["seq"] for x in ok]
    need(seqs == sorted(seqs) and len(set(seqs)) == 3, f"seqs not increasing: {seqs}")
    s = await ctx.sub(m, **{"from": 0})
    got = (await ctx.pulled(s, limit=await ctx.page()))["observations"]
    mine = [o.get("subject") for o in got if o.get("type") == A]
    need(mine == subjects, f"the log does not hold the items in order: {mine}")
    rejected = [o for o in got if o.get("type") == T_REJECTED]
    need(len(rejected) == 2, f"each refused item is logged as a rejected row: {len(rejected)} rows")
    for x in bad:
        need(isinstance(x["error"].get("rejected_seq"), int), f"a refusal names its rejected_seq: {x}")
    head = (await ctx.get_monitor(m))["head"]
    over = await ctx.req("POST", path, body=[{"type": A}] * (most + 1), token=m.token)
    expect(over, 400, "INVALID", f"a batch of {most + 1} items")
    after = (await ctx.get_monitor(m))["head"]
    need(after == head + 1, f"a refused batch published, or was not logged (head {head} -> {after})")
    expect(await ctx.req("POST", path, body=[{"type": A}], token=None), 401, "UNAUTHORIZED", "no token")
    control = await ctx.req("POST", path, body=[{"type": A}] * most, token=m.token)
    need(control.status == 207, f"control: a batch of {most} items answered {control.status}")
