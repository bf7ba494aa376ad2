"""Published checks about leases and trust: capabilities are granted (P7), leases are exclusive and
expire, provenance cannot be inflated (section 6), a subscriber's name is not a credential, dead letters.

Each asserts the refusal or the grant its section 11 line names, with a positive control; the extras this
project adds to those answers (rejected_seq, granted, idempotent, the lease rows) are project checks."""

from __future__ import annotations

import json
import secrets

from monitor_protocol.conformance.checks.base import (
    PUBLISHED,
    Context,
    act_monitor,
    check,
    expect,
    names_value,
    need,
    posint,
)


@check(
    "C04",
    "agent asserting src -> TIER_NOT_ASSERTABLE",
    profile=PUBLISHED,
    rule="P1; docs/protocol.md section 6 (check 3: tier src with an origin other than human is"
    " TIER_NOT_ASSERTABLE)",
)
async def c04(ctx: Context) -> None:
    m = await ctx.create("c04", owner=f"human:{ctx.uid('c04')}")
    expect(await ctx.publish(m, actor="agent:bot", tier="src"), 400, "TIER_NOT_ASSERTABLE", "agent src")
    obs = await ctx.pub(m, tier="src")
    need(obs["tier"] == "src" and obs["origin"] == "human", f"control: the human owner's src: {obs}")


@check(
    "C11",
    "claim without act -> CAPABILITY_MISSING",
    profile=PUBLISHED,
    rule="P7; docs/protocol.md section 5 (leases need a reader with act)",
)
async def c11(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "c11", ["job-1"])
    reader = await ctx.sub(m, capabilities=["observe"])
    need("act" not in reader.body["capabilities"], f"asked observe, granted {reader.body['capabilities']}")
    expect(await ctx.lease(reader, "claim", subject=j1), 403, "CAPABILITY_MISSING", "claim without act")
    actor = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(actor, "claim", subject=j1), 201, what="control: claim with act")


@check(
    "C12",
    "two concurrent claims: exactly one wins, the other LEASE_HELD naming the holder",
    profile=PUBLISHED,
    rule="docs/protocol.md section 1 (Lease: exclusive ownership of one subject by one subscription)",
)
async def c12(ctx: Context) -> str:
    m, (j1, j2) = await act_monitor(ctx, "c12", ["job-1", "job-2"])
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


@check(
    "C13",
    "complete after expiry and a new holder -> LEASE_LOST",
    profile=PUBLISHED,
    rule="docs/protocol.md section 4 (Lease: expired when now > renew_time + lease_duration_seconds)",
)
async def c13(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "c13", ["job-1"])
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


@check(
    "C20b",
    "re-claiming a held lease returns the same lease",
    profile=PUBLISHED,
    rule="docs/protocol.md section 8 (Idempotency: re-sending the same claim returns the prior result)",
)
async def c20b(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "c20b", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    other = await ctx.sub(m, capabilities=["observe", "act"])
    c1 = expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    r2 = await ctx.lease(s, "claim", subject=j1)
    need(r2.status in (200, 201), f"the holder's re-claim was refused: {r2!r}")
    need(
        r2.body["lease"] == c1["lease"],
        f"re-claim returned another lease: {c1['lease']} vs {r2.body['lease']}",
    )
    expect(await ctx.lease(other, "claim", subject=j1), 409, "LEASE_HELD", "control: another reader's claim")


@check(
    "C24",
    "a lease claimed by its holder completes",
    profile=PUBLISHED,
    rule="docs/protocol.md section 5 (leases/claim 201 {lease}; leases/complete by the holder 200 {ok})",
)
async def c24(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "c24", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s, "claim", subject=j1, lease_duration_seconds=30), 201, what="claim")
    lease = c["lease"]
    need(lease["subject"] == j1 and lease["holder"] == f"sub:{s.id}", f"lease {lease}")
    need(lease["lease_duration_seconds"] == 30, f"asked 30 s, the lease says {lease}")
    d = expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete")
    need(d.get("ok") is True, f"complete reply {d}")


@check(
    "C26",
    "every provenance inflation is refused while delegation to the owner is honoured",
    profile=PUBLISHED,
    rule="P1; docs/protocol.md section 6 (checks 2-5 and delegation)",
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
        expect(await ctx.publish(m, **body), status, code, what)
    ok = await ctx.pub(human_owned, actor="agent:claude", on_behalf_of=human, origin="human", tier="src")
    prov = ok["data"]["provenance"]
    need(
        prov.get("actor") == "agent:claude" and prov.get("on_behalf_of") == human, f"delegation record {prov}"
    )
    need(ok["origin"] == "human" and ok["tier"] == "src", f"delegation {ok['origin']} {ok['tier']}")
    expect(await ctx.publish(agent_owned), 201, what="control: a plain publish under the agent owner")


@check(
    "C28",
    "a stranger cannot be granted act by asking",
    profile=PUBLISHED,
    rule="P7; docs/protocol.md section 5 (subscribe rules: asking for more than the grant is"
    " CAPABILITY_MISSING; an unknown capability is UNKNOWN_VOCABULARY)",
)
async def c28(ctx: Context) -> None:
    caps = ["observe", "react", "act"]
    m = await ctx.create("c28", visibility="public", capabilities=caps, default_grant=["observe"])
    subscriber = f"agent:{ctx.uid('stranger')}"
    expect(
        await ctx.subscribe(m, subscriber, token=None, capabilities=["observe", "act"]),
        403,
        "CAPABILITY_MISSING",
        "ask act",
    )
    b = expect(
        await ctx.subscribe(m, subscriber, token=None, capabilities=["observe", "fly"]),
        400,
        "UNKNOWN_VOCABULARY",
        "an unknown capability",
    )
    # the value is named; in which field is not published (this project: `invalid`, X51)
    need(names_value(b, "fly"), f"UNKNOWN_VOCABULARY does not name 'fly' anywhere: {b}")
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


@check(
    "C32",
    "a subscriber's name is not a credential",
    profile=PUBLISHED,
    rule="docs/protocol.md section 5 (subscribe rules: re-keying needs the current token or the owner's,"
    " else 401)",
)
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
    rule="docs/protocol.md section 8 (Leases and attempts: at delivery_count_limit the subject is"
    " dead-lettered)",
)
async def c33(ctx: Context) -> None:
    m, (j1, j2) = await act_monitor(ctx, "c33", ["job-1", "job-2"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    limit = None
    attempt = 0
    while limit is None or attempt < limit:
        attempt += 1
        c = await ctx.lease(s, "claim", subject=j1)
        need(c.status in (200, 201), f"claim {attempt} before the limit: {c!r}")
        if limit is None:
            limit = (c.get("lease") or {}).get("delivery_count_limit")
            need(posint(limit) and limit <= 100, f"the lease's delivery_count_limit: {c.body}")
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
    "C34",
    "a subscription claims only subjects its own monitor published (else NOT_FOUND)",
    profile=PUBLISHED,
    rule="docs/protocol.md section 5 (a lease names a subject its monitor published; else NOT_FOUND)",
)
async def c34(ctx: Context) -> None:
    mine, (in_mine,) = await act_monitor(ctx, "c34", ["in-mine"])
    theirs, (in_theirs,) = await act_monitor(ctx, "c34t", ["in-theirs"])
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
