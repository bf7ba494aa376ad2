"""Published checks about delivery (docs/protocol.md section 8): pull never commits, ack is cumulative
and never backwards, filters and the real head, lag, retention, the mute sweep and cursors.

A check reads from where the server put its reader (the subscription's own cursor as served, `next` as a
pull returned it, seqs as publishes returned them) and never sends a number it made up: a cursor of 0 may
be below another server's first seq (this project's reading of 0 is X48), and seqs need not be dense or
start at 1 (X42)."""

from __future__ import annotations

from monitor_protocol.conformance.checks.base import (
    PUBLISHED,
    A,
    B,
    C,
    Context,
    act_monitor,
    check,
    compacted,
    expect,
    names_value,
    need,
    same_place,
    seq_of,
    wait_for_will,
)


@check(
    "C05",
    "pull does not advance the cursor",
    profile=PUBLISHED,
    rule="P4; docs/protocol.md section 8 (pull never commits; ack does)",
)
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
        same_place(p1["cursor"], s.body["cursor"]) and same_place(p2["cursor"], s.body["cursor"]),
        f"cursor moved: {s.body['cursor']} {p1['cursor']} {p2['cursor']}",
    )
    a = expect(await ctx.ack(s, p1["next"]), 200, what="control: ack moves the cursor")
    need(a["cursor"] == p1["next"], f"ack cursor {a['cursor']} != next {p1['next']}")
    p3 = await ctx.pulled(s)
    need(p3["cursor"] == p1["next"], f"after ack the pull cursor is {p3['cursor']}")


@check(
    "C06",
    "ack below is CURSOR_BACKWARDS, equal is idempotent",
    profile=PUBLISHED,
    rule="P4; docs/protocol.md section 8 (Ack: never backwards, 409 CURSOR_BACKWARDS; equal is idempotent)",
)
async def c06(ctx: Context) -> None:
    m = await ctx.create("c06")
    for _ in range(3):
        await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    need(len(p["observations"]) >= 3, f"the pull returned {len(p['observations'])} of the 3 publishes")
    nxt = p["next"]
    below = seq_of(p["observations"][-2])  # a real position below next: the second-last delivered seq
    a1 = expect(await ctx.ack(s, nxt), 200, what="forward ack")
    need(a1["cursor"] == nxt, f"control: the forward ack committed {a1['cursor']}, not next {nxt}")
    expect(await ctx.ack(s, below), 409, "CURSOR_BACKWARDS", f"ack {below}, below the committed {nxt}")
    p2 = await ctx.pulled(s)
    need(p2["cursor"] == nxt, f"the refused backwards ack moved the cursor to {p2['cursor']}")
    a2 = expect(await ctx.ack(s, nxt), 200, what="equal ack")
    need(a2["cursor"] == a1["cursor"] == nxt, f"equal ack changed the cursor: {a1} {a2}")


@check(
    "C07",
    "a narrow filter still reports the real head",
    profile=PUBLISHED,
    rule="P5; docs/protocol.md section 8 (Head and lag: head is the monitor's own)",
)
async def c07(ctx: Context) -> None:
    m = await ctx.create("c07", types=[A, B])  # declares what its filter names
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


@check(
    "C08",
    "an inline pull filter narrows and never widens",
    profile=PUBLISHED,
    rule="P12; docs/protocol.md section 8 (Inline filter: the intersection with the subscription's; one"
    " disjoint by construction is 400 INVALID_FILTER)",
)
async def c08(ctx: Context) -> None:
    m = await ctx.create("c08", types=[A, B, C])  # declares what its filters name
    s = await ctx.sub(m, filter={"types": [A, B]})
    await ctx.pub(m, type=A)
    await ctx.pub(m, type=B)
    await ctx.pub(m, type=C)
    plain = {o["type"] for o in (await ctx.pulled(s))["observations"]}
    need(plain == {A, B}, f"control: the subscription filter alone gives {plain}")
    narrowed = [o["type"] for o in (await ctx.pulled(s, types=A))["observations"]]
    need(narrowed == [A], f"inline types={A} gave {narrowed}")
    # disjoint by construction (types lists with nothing in common): section 8 says 400 INVALID_FILTER
    wide = expect(
        await ctx.pull(s, types=C), 400, "INVALID_FILTER", f"inline types={C}, disjoint from types [{A}, {B}]"
    )
    need(names_value(wide, C), f"the refusal of inline types={C} does not name it: {wide}")
    p = await ctx.pulled(s)
    need(same_place(p["cursor"], s.body["cursor"]), "an inline-filtered pull moved the cursor")


@check(
    "C17",
    "a cursor below a real retention floor -> 410 CURSOR_EXPIRED with retention_floor and relist",
    profile=PUBLISHED,
    rule="docs/protocol.md section 8 (Retention: below a really compacted floor is 410 CURSOR_EXPIRED"
    " {retention_floor, relist})",
)
async def c17(ctx: Context) -> None:
    m, head, subs = await compacted(ctx, "c17")
    none = subs["none"]
    start = none.body["cursor"]  # where the server put this reader: from the beginning, now compacted away
    b = expect(await ctx.pull(none), 410, "CURSOR_EXPIRED", "pull below the floor")
    floor = b.get("retention_floor")
    need(isinstance(floor, int) and start < floor <= head, f"retention_floor {floor} (head {head})")
    need(b.get("relist") == f"monitors/state?id={m.id}", f"relist {b.get('relist')}")
    b2 = expect(await ctx.pull(none, cursor=start), 410, "CURSOR_EXPIRED", f"replay from {start}, below")
    need(b2.get("retention_floor") == floor, f"replay floor {b2.get('retention_floor')} differs from {floor}")
    p = await ctx.pulled(none, cursor=floor)
    need(p["observations"] and seq_of(p["observations"][0]) >= floor, f"control: replay from the floor {p}")
    need(p["retention_floor"] == floor, f"pull retention_floor {p['retention_floor']} != {floor}")
    need((await ctx.state(m))["retention_floor"] == floor, "state retention_floor differs")


@check(
    "C19",
    "a mute subscription is retired, the will emitted, its leases freed, re-subscribing keeps the cursor",
    profile=PUBLISHED,
    rule="P6; docs/protocol.md section 5 (re-subscribing reactivates with the cursor kept)",
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
    await wait_for_will(ctx, m, s.id)  # the will observation, read through the log (not a pull of s)
    expect(await ctx.pull(s), 404, what="pull of a mute-retired subscription")
    expect(await ctx.lease(other, "claim", subject=j1), 201, what="the retired holder's lease was not freed")
    again = await ctx.sub(m, subscriber, token=s.token)
    need(again.id == s.id, f"re-subscribing made a new subscription {again.id} instead of {s.id}")
    need(again.body["cursor"] == p["next"] and again.body["active"] is True, f"re-subscribed {again.body}")
    expect(await ctx.pull(again), 200, what="control: the reactivated subscription pulls")


@check(
    "C20",
    "an identical ack returns the prior result",
    profile=PUBLISHED,
    rule="docs/protocol.md section 8 (Idempotency: re-sending the same ack returns the prior result; its"
    " cursor does not move)",
)
async def c20(ctx: Context) -> None:
    """The rule is about the cursor: head and lag are the monitor's now, and may have moved in between
    (whether a re-sent ack repeats the old head is this project's choice, X52)."""
    m = await ctx.create("c20")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    a1 = expect(await ctx.ack(s, p["next"]), 200, what="ack")
    need(a1["cursor"] == p["next"], f"the ack committed {a1['cursor']}, not next {p['next']}")
    a2 = expect(await ctx.ack(s, p["next"]), 200, what="the same ack again")
    need(a2["cursor"] == a1["cursor"], f"a re-sent ack answered cursor {a2['cursor']}, then {a1['cursor']}")
    await ctx.pub(m)  # the head moves; the same ack still answers the same cursor
    a3 = expect(await ctx.ack(s, p["next"]), 200, what="the same ack after an append")
    need(a3["cursor"] == a1["cursor"], f"a re-sent ack after an append answered cursor {a3['cursor']}")
    p2 = await ctx.pulled(s)
    need(p2["cursor"] == a1["cursor"], f"a re-sent ack moved the cursor to {p2['cursor']}")
    need(p2["observations"], "control: the append after the ack is delivered")
    a4 = expect(await ctx.ack(s, p2["next"]), 200, what="control: a new ack")
    need(a4["cursor"] == p2["next"] > a1["cursor"], f"control: a new ack commits {p2['next']}: {a4}")


@check(
    "C22",
    "an ack computed from the spec's cursor definition makes the acked observations not come back",
    profile=PUBLISHED,
    rule="docs/protocol.md section 8 (Cursor: next = last returned seq + 1, the value a reader acks)",
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
    page = await ctx.page()
    replay = await ctx.pulled(s, cursor=s.body["cursor"], limit=page)  # read-only, from its first cursor
    rest = {seq_of(o) for o in replay["observations"] if seq_of(o) >= p["next"]}
    new = await ctx.pub(m)
    p2 = await ctx.pulled(s, limit=page)
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
    rule="P5; docs/protocol.md section 8 (Head and lag: the monitor's own head; lag under its own filter)",
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
    "C27",
    "a non-integer cursor is refused in ack and in pull",
    profile=PUBLISHED,
    rule="docs/protocol.md section 8 (Ack: the cursor is an integer, else 400 INVALID; a cursor never becomes"
    " NaN or a dead subscription)",
)
async def c27(ctx: Context) -> None:
    """Only cursors that are not integers under any reading: "abc", 1.5, true, null, [1]; -1 is an integer,
    refused as not a cursor or as backwards (this project: 400 INVALID, X59). Whether the text "3" reads as
    3 is not published (this project refuses it, X50)."""
    m = await ctx.create("c27")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    for bad in ("abc", 1.5, True, None, [1]):
        expect(await ctx.ack(s, bad), 400, "INVALID", f"ack cursor {bad!r}")
    for text in ("abc", "1.5", "true"):
        expect(await ctx.pull(s, cursor=text), 400, "INVALID", f"pull cursor={text}")
    # -1 is an integer: an ack of it is refused either as not a cursor (400 INVALID, this project: X59) or
    # as backwards (409 CURSOR_BACKWARDS), and a replay from it is refused or read from the beginning;
    # either way nothing moves (checked below)
    neg = await ctx.ack(s, -1)
    need(
        (neg.status, neg.code) in ((400, "INVALID"), (409, "CURSOR_BACKWARDS")),
        f"ack cursor -1: expected 400 INVALID or 409 CURSOR_BACKWARDS, got {neg!r}",
    )
    neg = await ctx.pull(s, cursor="-1")
    need(
        neg.status in (200, 400, 410),
        f"pull cursor=-1: expected 400, 410 or a page from the start, got {neg!r}",
    )
    after = await ctx.pulled(s)  # the refusals left a live subscription where it was
    need(
        after["cursor"] == p["cursor"]
        and isinstance(after["cursor"], int)
        and not isinstance(after["cursor"], bool),
        f"after the refused cursors the subscription's cursor is {after.get('cursor')!r}, not {p['cursor']!r}",
    )
    need(
        [o["id"] for o in after["observations"]] == [o["id"] for o in p["observations"]],
        "after the refused cursors the pull delivers something else",
    )
    expect(await ctx.pull(s, cursor=p["cursor"]), 200, what=f"control: pull cursor={p['cursor']}")
    a = expect(await ctx.ack(s, p["next"]), 200, what=f"control: ack {p['next']}")
    need(a["cursor"] == p["next"], f"control: the ack committed {a['cursor']}, not {p['next']}")
