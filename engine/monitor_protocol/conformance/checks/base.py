"""What every check stands on: the Context (helpers that speak the protocol through a transport), the
registry and its `check` decorator, the vocabularies written from docs/protocol.md, and helpers that more
than one part of the suite uses. Standard library only; nothing of the engine's rules is imported."""

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

# Written from docs/protocol.md section 3, not imported from the engine: the suite must judge the engine.
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
# RFC 3339 UTC with milliseconds: `Z`, `z` and `+00:00` all say UTC (`-00:00` says the offset is unknown)
TIME_MS = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}\.\d{3}(?:[Zz]|\+00:00)\Z", re.ASCII)

A = "com.example.conf.a"
B = "com.example.conf.b"
C = "com.example.conf.c"


class CheckFailed(AssertionError):
    """The server did not behave as docs/protocol.md says."""


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


def same_place(a: Any, b: Any) -> bool:
    """Whether two cursors are the same position: section 8 says 0 and 1 both mean from the beginning."""
    if a == b:
        return True
    return all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)) and {a, b} == {0, 1}


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


# A reply's members that hold one protocol object, or a list of them (section 5's replies)
SERVED_AS = {
    "monitor": "monitor",
    "monitors": "monitor",
    "subscription": "subscription",
    "subscriptions": "subscription",
    "lease": "lease",
    "leases": "lease",
    "observation": "observation",
    "observations": "observation",
    "state": "state",
}


def classify(node: Any, seen: Seen, kind: str | None = None, by_name: bool = False) -> None:
    """Record every protocol object of a reply body by where it is served: a member named for its kind
    (`subscription`, `observations`, ...) or a route's whole body (`kind`), so an object missing a
    required key is still judged. Keys guess the kind only of an object found elsewhere. An observation's
    `data` is the publisher's or a protocol row's payload, never a served object, except a configured
    row's `after` (section 7: the Monitor). `by_name` is on only for section 5's routes (`named_route`):
    elsewhere members are named otherwise (discover's `capabilities.leases`, the admin snapshot's
    `monitors`), and a body of an unknown route is judged by keys alone."""
    if isinstance(node, list):
        for item in node:
            classify(item, seen, kind, by_name)
        return
    if not isinstance(node, dict):
        return
    kind = kind or _kind_by_keys(node)
    if kind is not None:
        seen.add(kind, node)
        by_name = False  # inside a served object, a member's name is its own (a monitor's extra `state`)
    if kind == "observation":
        data = node.get("data") if isinstance(node.get("data"), dict) else {}
        p = data.get("payload") if isinstance(data.get("payload"), dict) else {}
        if node.get("type") == T_CONFIGURED and isinstance(p.get("after"), dict):
            classify(p["after"], seen, "monitor")
        return
    for key, value in node.items():
        if key in ("raw", "before", "diff"):
            continue
        named = SERVED_AS.get(key) if by_name else None
        if named is not None and isinstance(value, (dict, list)):
            classify(value, seen, named)
        else:
            classify(value, seen, None, by_name)


def _kind_by_keys(node: dict[str, Any]) -> str | None:
    if "specversion" in node:
        return "observation"
    if "as_of" in node and "confidence" in node:
        return "state"
    if {"id", "horizon", "capabilities", "visibility", "owner"} <= node.keys():
        return "monitor"
    if isinstance(node.get("id"), str) and node["id"].startswith("sub-") and "cursor" in node:
        return "subscription"
    if "lease_duration_seconds" in node and "holder" in node:
        return "lease"
    return None


def named_route(path: str) -> bool:
    """Whether a route's reply names its objects by section 5's members (not discover, not admin)."""
    first = path.split("?", 1)[0].strip("/").split("/")[0]
    return first in ("monitors", "subscriptions")


def kind_of_route(method: str, path: str) -> str | None:
    """The protocol object a route's whole 2xx body is (section 5: GET /monitors/{id} and .../state)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if method.upper() == "GET" and parts[0] == "monitors" and len(parts) == 2:
        return "monitor"
    if method.upper() == "GET" and parts[0] == "monitors" and len(parts) == 3 and parts[2] == "state":
        return "state"
    return None


class Context:
    """What every check gets: the transport, helpers that speak the protocol, and the record for C29.

    `reference_schema_dir` is the directory of published schemas the run was given (`--schemas`), or None:
    C29 judges by those only. `data` holds what a check reports beside its note (C29's counts)."""

    def __init__(self, transport: Any, reference_schema_dir: str | None = None, profile: str = "all") -> None:
        self.t = transport
        self.reference_schema_dir = reference_schema_dir
        self.profile = profile
        self.seen = Seen()
        self.run_id = secrets.token_hex(3)
        self.data: dict[str, dict[str, Any]] = {}
        self.toured = False
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
    def record(self, reply: Reply, kind: str | None = None, by_name: bool = False) -> Reply:
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
            classify(item, self.seen, kind if item is body else None, by_name)
        return reply

    async def req(self, method: str, path: str, **kw: Any) -> Reply:
        reply = await self.t.request(method, path, **kw)
        need(reply.status < 500, f"{method} {path} answered {reply.status} (never 500): {reply!r}")
        return self.record(reply, kind_of_route(method, path), named_route(path))

    async def race(self, requests: list[dict[str, Any]]) -> list[Reply]:
        replies = await self.t.race(requests)
        for kw, r in zip(requests, replies, strict=False):
            path = kw.get("path", "")
            self.record(r, kind_of_route(kw.get("method", ""), path), named_route(path))
        return replies

    def uid(self, prefix: str) -> str:
        """A fresh name: unique to this run and this call (subjects, subscribers, monitor ids)."""
        return f"{prefix}-{self.run_id}-{secrets.token_hex(3)}"

    # -- monitors --------------------------------------------------------------------------------------
    async def listed(self, token: str | None) -> list[str]:
        """The ids GET /monitors lists for this token: every page, where a server lists in pages (a `next` to
        pass as `after`, this project's extension); the one reply elsewhere."""
        ids: list[str] = []
        after: str | None = None
        for _ in range(10_000):  # a bound, for a server whose `next` never ends
            query = {"after": after} if after is not None else None
            b = expect(await self.req("GET", "/monitors", token=token, query=query), 200, what="list")
            ids += [x["id"] for x in b["monitors"]]
            nxt = b.get("next")
            if not isinstance(nxt, str) or (after is not None and nxt <= after):
                break
            after = nxt
        return ids

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
        if action == "retire" and m.reader is None:
            # ctx.log reads through this reader later: section 5 does not say a retired monitor takes
            # a new subscription (a server may refuse it as UNAVAILABLE), so it is made while it still can
            m.reader = await self.sub(m, f"agent:{self.uid('log-reader')}")
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
        """The whole retained log of `m`, replayed read-only through an owner-token reader.

        The replay starts at the reader's own cursor as the server served it when it subscribed (a new
        subscription starts from the beginning, section 5), never at a number the suite made up: a server
        may answer a cursor below its first seq with CURSOR_EXPIRED (this project reads 0 as "from the
        beginning", X48)."""
        if m.reader is None:
            m.reader = await self.sub(m, f"agent:{self.uid('log-reader')}")
        out: list[dict[str, Any]] = []
        cursor = m.reader.body["cursor"]
        page = await self.page()
        reactivated = False
        for _ in range(1000):
            r = await self.pull(m.reader, cursor=cursor, limit=page)
            if r.status == 404 and isinstance(r.body, dict) and r.body.get("retired") and not reactivated:
                # a server may retire a monitor's readers with it; re-subscribing with the reader's own
                # token reactivates it (section 5), and the read-only replay goes on from the same cursor
                name = m.reader.body.get("subscriber") or f"agent:{self.uid('log-reader')}"
                m.reader, reactivated = await self.sub(m, name, token=m.reader.token), True
                continue
            p = expect(r, 200, what=f"pull {{'cursor': {cursor!r}, 'limit': {page}}}")
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


PUBLISHED = "published"  # docs/protocol.md section 11's list: behaviour every implementation must show
PROJECT = "project"  # this project's own choices and limits
PROFILES = (PUBLISHED, PROJECT)


@dataclass
class Check:
    id: str
    title: str
    fn: CheckFn
    profile: str
    final: bool = False  # runs after every other check (it judges what the others received)
    rule: str = ""  # the clause the check rests on; a failure's note ends with it


CHECKS: list[Check] = []


def check(
    cid: str, title: str, *, profile: str, rule: str = "", final: bool = False
) -> Callable[[CheckFn], CheckFn]:
    """Register a check under `cid` with its `profile` (PUBLISHED or PROJECT) and the `rule` it rests on:
    a principle and a docs/protocol.md section for a published check (required), this project's choice for
    a project check. The runner ends a failing check's note with the rule, so a reader of a report knows
    which clause the server broke (or, for a project check, which choice it does not share)."""
    if profile not in PROFILES:
        raise ValueError(f"check {cid}: profile {profile!r} is not one of {PROFILES}")
    if any(c.id == cid for c in CHECKS):
        raise ValueError(f"check id {cid} is registered twice")
    if profile == PUBLISHED and not rule:
        raise ValueError(f"published check {cid} does not say which published rule it rests on")

    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(cid, title, fn, profile, final, rule))
        return fn

    return deco


ACTOR = re.compile(r"^[^\s\x00-\x1f\x7f-\x9f]{1,256}\Z")  # \Z: `$` would pass a final newline


def actor_ok(v: Any) -> bool:
    """Section 3: a non-empty name of at most 256 characters, no whitespace or control characters."""
    return isinstance(v, str) and bool(ACTOR.match(v))


def posint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def need_rejected_seq(body: dict[str, Any], what: str) -> int:
    rs = body.get("rejected_seq")
    need(
        isinstance(rs, int) and not isinstance(rs, bool) and rs >= 1,
        f"{what}: no integer rejected_seq in {body}",
    )
    return rs


async def act_monitor(
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


async def types_in(ctx: Context, m: Monitor, t: str) -> list[dict[str, Any]]:
    return [o for o in await ctx.log(m) if o["type"] == t]


async def need_admin(ctx: Context) -> str:
    if not ctx.t.admin_token:
        raise Skip("needs the admin token (--admin-token)")
    return ctx.t.admin_token


async def compacted(ctx: Context, prefix: str, n: int = 6) -> tuple[Monitor, int, dict[str, Sub]]:
    admin = await need_admin(ctx)
    m = await ctx.create(prefix)
    subs = {policy: await ctx.sub(m, reset_policy=policy) for policy in ("none", "earliest", "latest")}
    seqs = [seq_of(await ctx.pub(m, data={"i": i})) for i in range(n)]
    head = (await ctx.get_monitor(m))["head"]
    upto = seqs[-3]  # a seq this monitor really holds, as its publish returned it
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


def supersedes_target(obs: dict[str, Any], m: Monitor, target: dict[str, Any]) -> bool:
    sup = obs["data"]["provenance"].get("supersedes")
    return isinstance(sup, dict) and sup.get("id") == target["id"] and sup.get("source") == f"monitor:{m.id}"


def system_measured(o: dict[str, Any], what: str) -> None:
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


# This project's extensions (docs/serve.md "Fewer round trips"): a server that does not advertise one in
# discover's capabilities.extensions is skipped, never failed. Their names, written here, not imported.
EXT_ACK_PULL = "monitor-protocol-python/ack-pull"
EXT_PUBLISH_BATCH = "monitor-protocol-python/publish-batch"


async def has_extension(ctx: Context, name: str) -> dict[str, Any] | None:
    ext = ((await ctx.discover()).get("capabilities") or {}).get("extensions") or {}
    found = ext.get(name) if isinstance(ext, dict) else None
    return found if isinstance(found, dict) else None


async def tour(ctx: Context) -> None:
    """Make sure at least one of every kind of object was received, whatever subset of checks ran (the
    schema checks C29 and X53 judge what the run received). Once per run."""
    if ctx.toured:
        return
    ctx.toured = True
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


def need_jsonschema(ctx: Context, cid: str) -> None:
    """Skip (never fail) where jsonschema cannot be imported: nothing could be validated."""
    try:
        import jsonschema  # noqa: F401
    except ImportError as exc:
        ctx.data[cid] = {"validated": {}}
        raise Skip(
            f"jsonschema is not importable here, so nothing could be validated ({exc}); install jsonschema"
            " to run this check"
        ) from exc


def validate_seen(ctx: Context, cid: str, label: str, directory: Any) -> str:
    """Validate every object the run received against the schemas of `directory` (one per kind it has);
    the counts go to `ctx.data[cid]["validated"][label]`. Fails with the first violations."""
    from monitor_protocol.core.schemas import validators

    vals = validators(directory)
    problems: list[str] = []
    counts: dict[str, int] = {}
    for kind, objs in ctx.seen.by_kind().items():
        if kind not in vals:
            continue
        for obj in objs:
            counts[kind] = counts.get(kind, 0) + 1
            for e in list(vals[kind].iter_errors(obj))[:2]:
                path = "/".join(str(p) for p in e.absolute_path) or "<root>"
                problems.append(f"[{label}] {kind} {json.dumps(obj)[:160]}: {path}: {e.message[:200]}")
    ctx.data[cid] = {"validated": {label: counts}}
    summary = f"{label}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    if problems:
        shown = "\n  ".join(problems[:8])
        raise CheckFailed(f"{len(problems)} schema violations ({summary}):\n  {shown}")
    need(sum(counts.values()) > 0, f"nothing was validated against {directory}: {counts}")
    return summary


async def rejected_rows(ctx: Context, m: Monitor, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The rejected observations of `m` whose payload keeps `raw` as the refused request body."""
    return [o for o in await types_in(ctx, m, T_REJECTED) if same_body(payload(o).get("raw"), raw)]


def same_body(kept: Any, sent: Any) -> bool:
    """Whether a rejected row's `raw` keeps the body sent: as the parsed JSON, or as its text (section 7
    says `raw: <the request body>`; a server that keeps bodies as text, as it must for one that is not
    JSON, keeps the same body)."""
    if kept == sent:
        return True
    if isinstance(kept, str):
        try:
            return json.loads(kept) == sent
        except ValueError:
            return False
    return False


def names_value(body: Any, value: str) -> bool:
    """Whether an error body names `value` anywhere: in a field such as `invalid`, in a list, or in its
    sentence (`error`). Section 3 asks for a code and a sentence; where the value goes is not published."""
    if isinstance(body, str):
        return value in body
    if isinstance(body, dict):
        return any(names_value(v, value) for v in body.values())
    if isinstance(body, list):
        return any(names_value(v, value) for v in body)
    return False


async def wait_for_will(ctx: Context, m: Monitor, sub_id: str, seconds: float = 15.0) -> dict[str, Any]:
    """The subscription_retired row of `sub_id`, waited for through the log (never by pulling the mute
    subscription: a pull is a sign of life). The mute sweep runs on a timer (section 8), so a server, or
    one of several sharing a store, may retire a little after the deadline; wait up to `seconds`."""
    waited = 0.0
    while True:
        for o in await types_in(ctx, m, T_SUB_RETIRED):
            if payload(o).get("subscription") == sub_id:
                return o
        if waited >= seconds:
            raise CheckFailed(f"no subscription_retired for {sub_id} within {seconds:.0f} s of its deadline")
        await ctx.t.sleep(0.25)
        waited += 0.25
