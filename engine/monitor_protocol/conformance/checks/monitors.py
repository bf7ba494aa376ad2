"""Published checks about monitors and what they serve: discover, filters refused at subscribe, the
observation envelope and its sequence, lifecycle rows, state, rejected rows, visibility, corrections,
bearer tokens, schemas and Origin (docs/protocol.md sections 1-6, 10 and 11).

Each check asserts the behaviour its section 11 line names, sets up what it needs the published way (a
monitor that declares the types its filters name, fresh ids, the reader's own cursor) and leaves this
project's further choices (exact extras, rows' actors and reasons, defaults) to the project checks."""

from __future__ import annotations

import secrets

from monitor_protocol.conformance.checks.base import (
    ORIGINS,
    PUBLISHED,
    T_CONFIGURED,
    T_SUB_RETIRED,
    TIERS,
    TIME_MS,
    VERIFICATIONS,
    A,
    B,
    C,
    Context,
    Skip,
    actor_ok,
    check,
    expect,
    need,
    need_jsonschema,
    payload,
    posint,
    rejected_rows,
    seq_of,
    supersedes_target,
    tour,
    types_in,
    validate_seen,
)


@check("C01", "discover shape", profile=PUBLISHED, rule="docs/protocol.md section 5 (GET /discover)")
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


@check(
    "C02",
    "unknown filter key -> INVALID_FILTER with known_keys",
    profile=PUBLISHED,
    rule="docs/protocol.md sections 3 and 5 (subscribe: the filter is validated; an unknown key is INVALID_FILTER)",
)
async def c02(ctx: Context) -> None:
    # the monitor declares the type the control's filter names: a server may check filter types (C03)
    m = await ctx.create("c02", types=[A])
    b = expect(
        await ctx.subscribe(m, filter={"colour": ["red"]}), 400, "INVALID_FILTER", "unknown filter key"
    )
    need("types" in (b.get("known_keys") or []), f"known_keys does not name 'types': {b}")
    expect(await ctx.subscribe(m, filter={"types": [A]}), 201, what="control: a known filter key")


@check(
    "C03",
    "undeclared type -> INVALID_FILTER with known_types",
    profile=PUBLISHED,
    rule="P11; docs/protocol.md section 5 (a filter type the monitor does not declare is INVALID_FILTER)",
)
async def c03(ctx: Context) -> None:
    m = await ctx.create("c03", types=[A, B])
    b = expect(await ctx.subscribe(m, filter={"types": [C]}), 400, "INVALID_FILTER", "undeclared filter type")
    known = b.get("known_types") or []
    need(A in known and B in known, f"known_types does not list the declared types: {b}")
    expect(await ctx.subscribe(m, filter={"types": [B]}), 201, what="control: a declared type")


@check(
    "C09",
    "every observation is a valid CloudEvent with the extensions",
    profile=PUBLISHED,
    rule="P8; docs/protocol.md section 4 (Observation: a CloudEvent with tier, origin, verified, horizon, actor)",
)
async def c09(ctx: Context) -> str:
    m = await ctx.create("c09", horizon="minute")
    subject = ctx.uid("build")
    await ctx.pub(
        m,
        type="com.example.ci.run",
        subject=subject,
        actor="probe:ci",
        data={"status": "failed"},
        tags={"env": "ci"},
    )
    log = await ctx.log(m)
    need(len(log) >= 1, f"log too short: {log}")
    for o in log:
        where = f"seq {o.get('id')} ({o.get('type')})"
        need(o.get("specversion") == "1.0", f"{where}: specversion {o.get('specversion')}")
        need(
            isinstance(o.get("id"), str) and o["id"].isdigit() and o["id"] == str(int(o["id"])),
            f"{where}: id is not the decimal seq",
        )
        need(o.get("source") == f"monitor:{m.id}", f"{where}: source {o.get('source')}")
        need(
            TIME_MS.match(o.get("time") or ""), f"{where}: time {o.get('time')!r} is not RFC 3339 UTC with ms"
        )
        need(o.get("datacontenttype") == "application/json", f"{where}: datacontenttype")
        need(
            o.get("tier") in TIERS and o.get("origin") in ORIGINS and o.get("verified") in VERIFICATIONS,
            f"{where}: tier/origin/verified outside the closed vocabularies",
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
    need(o.get("subject") == subject, f"subject {o.get('subject')}")
    need(o["data"].get("status") == "failed", f"publisher's data not at the top of data: {o['data']}")
    need(o["data"]["tags"].get("env") == "ci", f"request tags not in data.tags: {o['data']['tags']}")
    need(o["actor"] == "probe:ci" and o["data"]["provenance"].get("actor") == "probe:ci", "actor")
    return f"{len(log)} observations"


@check(
    "C10",
    "sequence zero-padded to 20 and strictly increasing",
    profile=PUBLISHED,
    rule="docs/protocol.md section 4 (Observation: sequence is the seq zero-padded to 20 digits)",
)
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
    need(len(seqs) >= 4, f"the log holds {len(seqs)} of the 4 publishes")
    need(all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), f"seqs not strictly increasing: {seqs}")
    need(seqs[0] >= 1, f"seqs start below 1: {seqs}")


@check(
    "C14",
    "pause, resume, retire and subscription retire emit observations; paused refuses UNAVAILABLE",
    profile=PUBLISHED,
    rule="P10; docs/protocol.md sections 1 and 5 (configuration is an observation; a paused monitor is"
    " UNAVAILABLE)",
)
async def c14(ctx: Context) -> None:
    m = await ctx.create("c14")
    s = await ctx.sub(m)
    await ctx.pub(m)
    expect(await ctx.configure(m, "pause"), 200, what="pause")
    expect(await ctx.publish(m), 409, "UNAVAILABLE", "publish on a paused monitor")
    expect(await ctx.configure(m, "resume"), 200, what="resume")
    await ctx.pub(m)  # control: a resumed monitor takes writes again
    expect(
        await ctx.req("POST", f"/subscriptions/{s.id}/retire", body={"reason": "done"}, token=s.token),
        200,
        what="subscription retire",
    )
    expect(await ctx.configure(m, "retire"), 200, what="retire")
    actions = [payload(o).get("action") for o in await types_in(ctx, m, T_CONFIGURED)]
    lifecycle = [a for a in actions if a in ("pause", "resume", "retire")]
    need(lifecycle == ["pause", "resume", "retire"], f"configured actions in the log: {actions}")
    retired = [payload(o) for o in await types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(p.get("subscription") == s.id for p in retired), f"no subscription_retired for {s.id}: {retired}"
    )


@check(
    "C15",
    "state carries as_of, covers_until, live, confidence with missing inputs never defaulted",
    profile=PUBLISHED,
    rule="P3; docs/protocol.md section 4 (State: a missing input is listed, a value that cannot be known is"
    " null)",
)
async def c15(ctx: Context) -> None:
    m = await ctx.create("c15")
    await ctx.pub(m)
    st = await ctx.state(m)
    for k in ("as_of", "covers_until", "live", "confidence"):
        need(k in st, f"state lacks {k}")
    need((st["live"] or {}).get("value") is True, f"an active monitor's live {st['live']}")
    conf = st["confidence"]
    need(conf.get("value") is None, f"confidence.value {conf.get('value')} while inputs are missing")
    missing = set((conf.get("inputs") or {}).get("missing") or [])
    need({"independence", "corroboration", "track_record"} <= missing, f"inputs.missing {missing}")
    ages = st.get("ages") or {}
    need(
        ages.get("since_last_pull_s") is None,
        f"never pulled, yet since_last_pull_s is {ages.get('since_last_pull_s')!r} (unknown is null)",
    )
    s = await ctx.sub(m)
    await ctx.pulled(s)
    st2 = await ctx.state(m)
    need(
        isinstance((st2.get("ages") or {}).get("since_last_pull_s"), int),
        f"control: after a pull since_last_pull_s {st2.get('ages')}",
    )
    expect(await ctx.configure(m, "pause"), 200, what="pause")
    st3 = await ctx.state(m)
    need((st3["live"] or {}).get("value") is False, f"paused live {st3['live']}")


@check(
    "C16",
    "a refused input is visible as a rejected observation with its raw payload",
    profile=PUBLISHED,
    rule="P2; docs/protocol.md section 1 (a refused input is an ai.mentu.monitor.rejected observation)",
)
async def c16(ctx: Context) -> None:
    m = await ctx.create("c16")
    raw = {"type": A, "subject": ctx.uid("refused"), "tier": "superb", "data": {"k": "v"}}
    b = expect(await ctx.publish(m, **raw), 400, "UNKNOWN_VOCABULARY", "unknown tier")
    rows = await rejected_rows(ctx, m, raw)
    need(rows, f"no rejected observation in the log keeps the refused body {raw}")
    rs = b.get("rejected_seq")
    if rs is not None:  # where the refusal names its row, it must be that row
        need(rs in [seq_of(o) for o in rows], f"rejected_seq {rs} is not the rejected row {rows[0]['id']}")
    ok = await ctx.pub(m, tier="measured")
    need(ok["type"] == A, f"control: a valid publish is stored as itself: {ok['type']}")


@check(
    "C18",
    "a private monitor is listed only with its token",
    profile=PUBLISHED,
    rule="P14; docs/protocol.md section 5 (GET /monitors: private with its owner token)",
)
async def c18(ctx: Context) -> None:
    m = await ctx.create("c18")
    other = await ctx.create("c18o")
    pub = await ctx.create("c18p", visibility="public")

    async def listed(token: str | None) -> set[str]:
        return set(await ctx.listed(token))

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
    "C21",
    "a correction carries supersedes and the original is unchanged",
    profile=PUBLISHED,
    rule="P13 (nothing is edited; a correction names the old in data.provenance.supersedes)",
)
async def c21(ctx: Context) -> None:
    m = await ctx.create("c21")
    subject = ctx.uid("x")
    orig = await ctx.pub(m, subject=subject, data={"value": 1})
    need(
        orig["data"]["provenance"].get("supersedes") is None,
        "control: a plain observation supersedes nothing",
    )
    fix = await ctx.pub(
        m, subject=subject, data={"value": 2}, supersedes={"source": f"monitor:{m.id}", "id": orig["id"]}
    )
    need(
        supersedes_target(fix, m, orig),
        f"correction's supersedes {fix['data']['provenance'].get('supersedes')}",
    )
    again = dict(await ctx.at(m, seq_of(orig)))
    again.pop("redelivered", None)
    need(again == orig, f"the original changed: {orig} -> {again}")


@check(
    "C23",
    "wrong and missing bearer are both 401",
    profile=PUBLISHED,
    rule="docs/protocol.md section 5 (Auth failures: a wrong or missing token is 401 UNAUTHORIZED)",
)
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
    p = await ctx.pulled(s)  # control: the reader token pulls, and gives the cursor the next ack may send
    expect(await ctx.ack(s, p["next"], token=bad), 401, "UNAUTHORIZED", "ack with a wrong token")
    expect(await ctx.ack(s, p["next"], token=None), 401, "UNAUTHORIZED", "ack without a token")
    for action in ("pause", "resume"):
        for token, how in ((bad, "a wrong token"), (None, "no token")):
            r = await ctx.req("POST", f"/monitors/{m.id}/{action}", body={"reason": "x"}, token=token)
            expect(r, 401, "UNAUTHORIZED", f"{action} with {how}")
    expect(await ctx.ack(s, p["next"]), 200, what="control: ack with the reader token")
    expect(await ctx.configure(m, "pause"), 200, what="control: pause with the owner token")


@check(
    "C29",
    "every object received validates against its schema",
    final=True,
    profile=PUBLISHED,
    rule="docs/protocol.md, its opening (every object served validates against the schemas published with"
    " the protocol)",
)
async def c29(ctx: Context) -> str:
    """Only against the published schemas the run was given (`--schemas DIR`): this project's own
    schemas/ are stricter (X53 holds this server to them) and never judge another implementation."""
    if not ctx.reference_schema_dir:
        ctx.data["C29"] = {"validated": {}}
        raise Skip(
            "no published schemas were given (mp conform --schemas DIR, the JSON Schemas published with the"
            " protocol), so nothing was validated; this check never judges a server by this project's own"
            " schemas/ (X53 does, in the project profile)"
        )
    need_jsonschema(ctx, "C29")
    await tour(ctx)
    return validate_seen(ctx, "C29", "published", ctx.reference_schema_dir)


@check(
    "C30",
    "a foreign Origin is refused, no Origin is served",
    profile=PUBLISHED,
    rule="docs/protocol.md section 10 (an Origin the operator did not allow is 403 ORIGIN_REFUSED)",
)
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
