"""Published checks about monitors and what they serve: discover, filters refused at subscribe, the
observation envelope and its sequence, lifecycle rows, state, rejected rows, visibility, corrections,
bearer tokens, schemas and Origin (docs/protocol.md sections 2-7, 10 and 11)."""

from __future__ import annotations

import json
import secrets
from typing import Any

from .base import (
    GAPS_ORDER,
    ORIGINS,
    PUBLISHED,
    T_CONFIGURED,
    T_REJECTED,
    T_SUB_RETIRED,
    TIERS,
    TIME_MS,
    VERIFICATIONS,
    A,
    B,
    C,
    CheckFailed,
    Context,
    Skip,
    actor_ok,
    check,
    expect,
    need,
    need_rejected_seq,
    payload,
    posint,
    seq_of,
    supersedes_target,
    types_in,
)


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
    need(posint(dcl), f"leases.delivery_count_limit is not a positive integer: {dcl!r}")
    ext = (caps.get("extensions") or {}).get("ai.mentu/monitors")
    need(
        isinstance(ext, dict) and "version" in ext,
        f"extension ai.mentu/monitors missing: {caps.get('extensions')}",
    )
    lim = d.get("limits") or {}
    need(
        all(posint(lim.get(k)) for k in ("max_limit", "default_limit", "max_wait_seconds"))
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
        need(actor_ok(o.get("actor")), f"{where}: actor {o.get('actor')!r} is not a section 3 actor")
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
    actions = [payload(o).get("action") for o in await types_in(ctx, m, T_CONFIGURED)]
    need(actions == ["create", "pause", "resume", "retire"], f"configured actions in the log: {actions}")
    retired = [payload(o) for o in await types_in(ctx, m, T_SUB_RETIRED)]
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
    need(
        supersedes_target(fix, m, orig),
        f"correction's supersedes {fix['data']['provenance'].get('supersedes')}",
    )
    again = dict(await ctx.at(m, seq_of(orig)))
    again.pop("redelivered", None)
    need(again == orig, f"the original changed: {orig} -> {again}")


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


@check("C29", "every object received validates against its schema", final=True, profile=PUBLISHED)
async def c29(ctx: Context) -> str:
    await _tour(ctx)
    try:
        from ...schemas import schema_dir, validators
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
