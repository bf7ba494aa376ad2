"""Published checks about delivery (docs/protocol.md section 8): pull never commits, ack is cumulative
and never backwards, filters and the real head, lag, retention, the mute sweep and cursors."""

from __future__ import annotations

from .base import (
    PUBLISHED,
    T_SUB_RETIRED,
    A,
    B,
    C,
    Context,
    act_monitor,
    check,
    compacted,
    expect,
    need,
    payload,
    seq_of,
    types_in,
)


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
    m, head, subs = await compacted(ctx, "c17")
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


@check(
    "C19",
    "a mute subscription is retired, the will emitted, its leases freed, re-subscribing keeps the cursor",
    profile=PUBLISHED,
)
async def c19(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "c19", ["job-1"])
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
    wills = [payload(o) for o in await types_in(ctx, m, T_SUB_RETIRED)]
    need(
        any(w.get("subscription") == s.id and w.get("reason") == "mute" for w in wills),
        f"no mute will: {wills}",
    )
    will_rows = [o for o in await types_in(ctx, m, T_SUB_RETIRED) if payload(o).get("subscription") == s.id]
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
