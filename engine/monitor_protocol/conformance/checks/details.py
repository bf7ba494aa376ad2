"""Project checks of the details the published checks leave out: each published check asserts only the
rule its section 11 line names, and what it used to assert beside that (the extras of an answer, who
writes a protocol row and why, provenance defaults, the state's gaps) is this project's contract, held here
so that `--profile all` still proves all of it (docs/protocol.md sections 4-8)."""

from __future__ import annotations

from monitor_protocol.conformance.checks.base import (
    GAPS_ORDER,
    PROJECT,
    T_CONFIGURED,
    T_LEASE,
    T_REJECTED,
    T_SUB_RETIRED,
    A,
    Context,
    act_monitor,
    check,
    expect,
    need,
    need_rejected_seq,
    payload,
    seq_of,
    types_in,
    wait_for_will,
)


@check(
    "X54",
    "answers carry their extras: CURSOR_BACKWARDS {cursor, requested, head}, CAPABILITY_MISSING {granted,"
    " monitor_capabilities}, a claim's idempotent false then true",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md sections 5 and 8 (the extras of each answer)",
)
async def x54(ctx: Context) -> None:
    caps = ["observe", "react", "act"]
    m, (j1,) = await act_monitor(ctx, "x54", ["job"], visibility="public", capabilities=caps)
    s = await ctx.sub(m, capabilities=["observe", "act"])
    p = await ctx.pulled(s)
    expect(await ctx.ack(s, p["next"]), 200, what="ack")
    below = seq_of(p["observations"][-2])
    b = expect(await ctx.ack(s, below), 409, "CURSOR_BACKWARDS", "ack below")
    need(
        b.get("cursor") == p["next"] and b.get("requested") == below and isinstance(b.get("head"), int),
        f"CURSOR_BACKWARDS extras {b}",
    )
    stranger = f"agent:{ctx.uid('stranger')}"
    b = expect(
        await ctx.subscribe(m, stranger, token=None, capabilities=["observe", "act"]),
        403,
        "CAPABILITY_MISSING",
        "a stranger asking act",
    )
    need(
        b.get("granted") == ["observe"] and sorted(b.get("monitor_capabilities") or []) == sorted(caps),
        f"CAPABILITY_MISSING extras {b}",
    )
    c1 = expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    need(c1.get("idempotent") is False, f"first claim idempotent={c1.get('idempotent')}")
    c2 = expect(await ctx.lease(s, "claim", subject=j1), 200, what="the holder re-claims")
    need(c2.get("idempotent") is True, f"re-claim idempotent={c2.get('idempotent')}")


@check(
    "X55",
    "every refused publish names its rejected row: rejected_seq, a row by system:guard with the code and"
    " the raw body, counted in counters.rejected",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 6 (rejected_seq in the error body) and section 7"
    " (rejected: system:guard, {code, reason, raw, actor})",
)
async def x55(ctx: Context) -> None:
    human = f"human:{ctx.uid('you')}"
    m = await ctx.create("x55", owner=human)
    agent_owned = await ctx.create("x55a", owner=f"agent:{ctx.uid('owner')}")
    before = (await ctx.state(m))["counters"]["rejected"]
    cases = [
        (m, {"actor": "agent:bot", "tier": "src"}, "TIER_NOT_ASSERTABLE"),
        (m, {"tier": "superb"}, "UNKNOWN_VOCABULARY"),
        (m, {"actor": "agent:bot", "verification": "certified"}, "PROVENANCE_CEILING"),
        (
            m,
            {"actor": "agent:bot", "on_behalf_of": "human:stranger", "origin": "human"},
            "PROVENANCE_CEILING",
        ),
        (agent_owned, {"origin": "human", "tier": "src"}, "PROVENANCE_CEILING"),
    ]
    for target, fields, code in cases:
        raw = {"type": A, **fields}
        b = await ctx.publish(target, **fields)
        need(b.code == code, f"{fields}: expected {code}, got {b!r}")
        rs = need_rejected_seq(b.body, code)
        row = await ctx.at(target, rs)
        p = payload(row)
        need(
            row["type"] == T_REJECTED and row.get("actor") == "system:guard",
            f"{fields}: seq {rs} is {row['type']} by {row.get('actor')}, not a rejected row by system:guard",
        )
        need(p.get("code") == code and p.get("raw") == raw, f"{fields}: rejected payload {p}")
    after = (await ctx.state(m))["counters"]["rejected"]
    need(after == before + 4, f"counters.rejected went from {before} to {after} over 4 refusals")
    ok = expect(await ctx.publish(m), 201, what="control: a valid publish")
    need("rejected_seq" not in ok, f"control: an accepted publish names a rejected row: {ok}")


@check(
    "X56",
    "protocol rows say who and why: configured create, pause, resume, retire; a mute will by system:sweep"
    " with the cursor; lease rows name subject and subscription",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 7 (each row's actor and payload) and section 5 (a"
    " retired pull is 404 {retired, cursor})",
)
async def x56(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "x56", ["job"])
    await ctx.log(m)  # the log reader exists before time passes, with the default mute allowance
    s = await ctx.sub(
        m, f"agent:{ctx.uid('mute')}", capabilities=["observe", "act"], retire_after_mute_seconds=1
    )
    p = await ctx.pulled(s)
    expect(await ctx.ack(s, p["next"]), 200, what="ack")
    expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete")
    await ctx.t.sleep(1.1)
    await wait_for_will(ctx, m, s.id)
    b = expect(await ctx.pull(s), 404, what="pull of a mute-retired subscription")
    need(b.get("retired") is True and b.get("cursor") == p["next"], f"retired pull body {b}")
    wills = [o for o in await types_in(ctx, m, T_SUB_RETIRED) if payload(o).get("subscription") == s.id]
    need(len(wills) == 1, f"mute wills for {s.id}: {wills}")
    will = wills[0]
    need(
        will["actor"] == "system:sweep"
        and payload(will).get("reason") == "mute"
        and payload(will).get("cursor") == p["next"],
        f"the mute will {will['actor']} {payload(will)}",
    )
    for action in ("pause", "resume", "retire"):
        expect(await ctx.configure(m, action), 200, what=action)
    actions = [payload(o).get("action") for o in await types_in(ctx, m, T_CONFIGURED)]
    need(actions == ["create", "pause", "resume", "retire"], f"configured actions in the log: {actions}")
    rows = [payload(o) for o in await types_in(ctx, m, T_LEASE)]
    got = [(r.get("action"), r.get("subject"), r.get("subscription")) for r in rows]
    need(got == [("claim", j1, s.id), ("complete", j1, s.id)], f"lease rows {rows}")


@check(
    "X57",
    "provenance defaults: a probe or hook is measured and machine_verified, an agent unverified, the owner"
    " reported; the actor defaults to the owner",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 6 (origin from the actor's prefix; tier and"
    " verification by origin)",
)
async def x57(ctx: Context) -> None:
    human = f"human:{ctx.uid('you')}"
    m = await ctx.create("x57", owner=human)
    want = {
        "probe:ci": ("probe", "measured", "machine_verified"),
        "hook:ci": ("webhook", "measured", "machine_verified"),
        "agent:bot": ("agent", "unverified", "unverified"),
        "reader-7": ("agent", "unverified", "unverified"),
        human: ("human", "measured", "reported"),
    }
    for actor, (origin, tier, verified) in want.items():
        o = await ctx.pub(m, actor=actor)
        need(
            (o["origin"], o["tier"], o["verified"]) == (origin, tier, verified),
            f"actor {actor}: {o['origin']}/{o['tier']}/{o['verified']}, expected {origin}/{tier}/{verified}",
        )
    plain = await ctx.pub(m)
    need(plain["actor"] == human and plain["origin"] == "human", f"the actor defaults to the owner: {plain}")


@check(
    "X58",
    "state details: inputs present, gaps in the closed order, no_subscribers, unattested_origin, head,"
    " ages, live reasons paused and retired",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 4 (State: its fields; the closed list of gaps and"
    " its order)",
)
async def x58(ctx: Context) -> None:
    m = await ctx.create("x58")
    await ctx.pub(m)
    st = await ctx.state(m)
    for k in ("ages", "counters", "head", "retention_floor"):
        need(k in st, f"state lacks {k}")
    need(st["live"] == {"value": True, "reason": None}, f"live {st['live']}")
    present = set(st["confidence"]["inputs"]["present"])
    need({"observations", "ages", "actors", "contradictions_open"} <= present, f"inputs.present {present}")
    gaps = st["confidence"]["gaps"]
    need(gaps and gaps[0] == "independence_unknown", f"gaps {gaps}")
    need(gaps == [g for g in GAPS_ORDER if g in gaps], f"gaps out of order: {gaps}")
    need("no_subscribers" in gaps, f"no subscribers yet, gaps {gaps}")
    if not m.body.get("attested"):
        need("unattested_origin" in gaps, f"unattested monitor lacks unattested_origin: {gaps}")
    need(isinstance(st["ages"]["since_last_observation_s"], int), "since_last_observation_s is not whole")
    need(st["head"] == (await ctx.get_monitor(m))["head"], "state head is not the monitor's head")
    s = await ctx.sub(m)
    await ctx.pulled(s)
    gaps = (await ctx.state(m))["confidence"]["gaps"]
    need("no_subscribers" not in gaps, f"control: with a subscriber, gaps {gaps}")
    for action, reason in (("pause", "paused"), ("resume", None), ("retire", "retired")):
        expect(await ctx.configure(m, action), 200, what=action)
        live = (await ctx.state(m))["live"]
        need(live == {"value": reason is None, "reason": reason}, f"after {action}, live {live}")
