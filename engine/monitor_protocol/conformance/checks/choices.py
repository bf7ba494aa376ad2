"""Project checks of this project's own choices (moved out of the published checks, so that `--profile all`
still proves them): exact defaults, dense per-monitor seqs, lease expiry rows, protocol rows, bounded
reads, this server's two advertised extensions, and where this project and another implementation may
legitimately differ (X48..X53: cursor 0, filters on undeclared types, a cursor sent as text, where an
error names the value, a re-sent ack's head, this project's own schemas; X59..X60: a negative cursor,
subscribing to a retired monitor)."""

from __future__ import annotations

from typing import Any

from monitor_protocol.conformance.checks.base import (
    EXT_ACK_PULL,
    EXT_PUBLISH_BATCH,
    PROJECT,
    T_LEASE,
    T_REJECTED,
    A,
    B,
    CheckFailed,
    Context,
    P,
    Skip,
    act_monitor,
    check,
    expect,
    has_extension,
    need,
    need_jsonschema,
    payload,
    posint,
    same_place,
    seq_of,
    system_measured,
    tour,
    types_in,
    validate_seen,
)


@check(
    "X41",
    "this project's defaults: max_limit 200, default_limit 50, max_wait_seconds 50, delivery_count_limit 5",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 5 (discover's limits) and section 4 (Lease:"
    " delivery_count_limit 5)",
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
    m, (j1,) = await act_monitor(ctx, "x41", ["job"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    c = expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    need(c["lease"].get("delivery_count_limit") == 5, f"a lease's delivery_count_limit: {c['lease']}")
    need(posint(c["lease"].get("lease_duration_seconds")), f"a positive default lease duration: {c['lease']}")


@check(
    "X42",
    "per-monitor dense seqs: a monitor's log starts at 1, has no gaps, and another monitor takes none",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 4 (Seq: each monitor has its own dense sequence)",
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


@check(
    "X43",
    "a lease expiry is logged once as lease{expired} by system:sweep",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 7 (lease rows; expiry by system:sweep)",
)
async def x43(ctx: Context) -> None:
    m, (j1,) = await act_monitor(ctx, "x43", ["job"])
    s1 = await ctx.sub(m, capabilities=["observe", "act"])
    s2 = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s1, "claim", subject=j1, lease_duration_seconds=1), 201, what="claim")
    await ctx.t.sleep(1.1)
    expect(await ctx.lease(s2, "claim", subject=j1), 201, what="claim after expiry")
    rows = [(o["actor"], payload(o)) for o in await types_in(ctx, m, T_LEASE)]
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
    rule="this project's choice, docs/protocol.md section 7 (protocol-written observations)",
)
async def x44(ctx: Context) -> str:
    m, (j1,) = await act_monitor(ctx, "x44", ["job"])
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
        system_measured(o, where)
    return f"{len(rows)} rows: {', '.join(kinds)}"


@check(
    "X45",
    "a reader whose filter is checked row by row (a tag), behind 1,100 non-matching rows, gets what "
    "follows in a few pulls, acking or not, and an unacked page comes back",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 10 (expensive reads are bounded)",
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


async def _advertised(ctx: Context, name: str) -> dict[str, Any]:
    found = await has_extension(ctx, name)
    if found is None:
        raise Skip(f"the server does not advertise the extension {name}")
    return found


@check(
    "X46",
    "ack-and-pull (an advertised extension): POST /pull {ack} commits with /ack's rules, then pulls "
    "from the new cursor; a refused ack pulls nothing; a GET pull never takes an ack",
    profile=PROJECT,
    rule="this project's extension (docs/serve.md, Fewer round trips)",
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
    rule="this project's extension (docs/serve.md, Fewer round trips)",
)
async def x47(ctx: Context) -> None:
    info = await _advertised(ctx, EXT_PUBLISH_BATCH)
    most = info.get("max_items")
    need(posint(most), f"the extension does not say its max_items: {info}")
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


# ---- where this project and another implementation may legitimately differ ------------------------------
# Each published check leaves these open; the check here states this project's choice, so the default
# profile keeps testing it. Against another implementation a failure here means "differs from this
# project", never "non-conformant".


@check(
    "X48",
    "cursors 0 and 1 both mean from the beginning: on a monitor never compacted, a pull at cursor 0 is"
    " served from its first seq",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 8 (Cursor: 0 and 1 both mean from the beginning;"
    " Retention: 410 only when something below the floor was really compacted)",
)
async def x48(ctx: Context) -> None:
    m = await ctx.create("x48")
    for _ in range(3):
        await ctx.pub(m)
    s = await ctx.sub(m, reset_policy="none")
    zero = expect(await ctx.pull(s, cursor=0), 200, what="pull cursor=0 on a monitor never compacted")
    one = await ctx.pulled(s, cursor=1)
    need(
        zero["retention_floor"] == 1, f"a never-compacted monitor's floor is {zero['retention_floor']}, not 1"
    )
    ids = [o["id"] for o in zero["observations"]]
    need(ids[:1] == ["1"], f"cursor 0 did not start at seq 1: {ids[:3]}")
    need(ids == [o["id"] for o in one["observations"]], "cursors 0 and 1 delivered different pages")
    need(s.body["cursor"] == 0, f"control: a new subscription starts at cursor 0, not {s.body['cursor']}")
    plain = await ctx.pulled(s)
    need(plain["cursor"] == 0, f"a new subscription's pull says cursor {plain['cursor']}, not its 0")


@check(
    "X49",
    "a monitor that declares no types takes a filter on any type; one that declares types refuses others",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md sections 4 and 5 (types [] declares no closed list; C03"
    " covers a monitor that declares its types)",
)
async def x49(ctx: Context) -> None:
    m = await ctx.create("x49")
    s = expect(await ctx.subscribe(m, filter={"types": [A]}), 201, what=f"filter types [{A}], none declared")
    sub_id, token = s["subscription"]["id"], s["token"]
    expect(
        await ctx.req("GET", f"/subscriptions/{sub_id}/pull", query={"types": A}, token=token),
        200,
        what=f"inline types={A}, none declared",
    )
    closed = await ctx.create("x49c", types=[A])
    expect(await ctx.subscribe(closed, filter={"types": [B]}), 400, "INVALID_FILTER", "control: undeclared")


@check(
    "X50",
    'a cursor sent as text ("3") is refused in an ack: the wire\'s integers are JSON numbers',
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 8 (Ack: an integer, else 400 INVALID) and section"
    " 10 (integers), read strictly: a JSON string is not an integer",
)
async def x50(ctx: Context) -> None:
    m = await ctx.create("x50")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    text = str(p["next"])
    expect(await ctx.ack(s, text), 400, "INVALID", f"ack cursor {text!r} (text)")
    need((await ctx.pulled(s))["cursor"] == p["cursor"], "a refused text cursor moved the cursor")
    expect(await ctx.pull(s, cursor=text), 200, what=f"control: a query's cursor={text} is text by nature")
    expect(await ctx.ack(s, p["next"]), 200, what=f"control: ack {p['next']} (a number)")


@check(
    "X51",
    "UNKNOWN_VOCABULARY names the offending value in `invalid` and the accepted values in `known`",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 6 (check 1: 400 UNKNOWN_VOCABULARY {invalid, known})",
)
async def x51(ctx: Context) -> None:
    caps = ["observe", "react", "act"]
    m = await ctx.create("x51", visibility="public", capabilities=caps)
    b = expect(
        await ctx.subscribe(m, capabilities=["observe", "fly"]), 400, "UNKNOWN_VOCABULARY", "capability fly"
    )
    need(b.get("invalid") == "fly" and b.get("known") == caps, f"capability fly: invalid/known {b}")
    b = expect(await ctx.publish(m, tier="superb"), 400, "UNKNOWN_VOCABULARY", "tier superb")
    need(
        b.get("invalid") == "superb" and "measured" in (b.get("known") or []),
        f"tier superb: invalid/known {b}",
    )
    expect(await ctx.subscribe(m, capabilities=["observe", "act"]), 201, what="control: known capabilities")


@check(
    "X52",
    "a re-sent ack returns the identical body, head and lag included, even after the head moved",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 8 (Ack: equal = idempotent, returning the identical"
    " body)",
)
async def x52(ctx: Context) -> None:
    m = await ctx.create("x52")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    a1 = expect(await ctx.ack(s, p["next"]), 200, what="ack")
    a2 = expect(await ctx.ack(s, p["next"]), 200, what="the same ack")
    need(a1 == a2, f"identical ack returned a different body: {a1} then {a2}")
    await ctx.pub(m)
    a3 = expect(await ctx.ack(s, p["next"]), 200, what="the same ack after an append")
    need(a3 == a1, f"a re-sent ack is not the prior body: {a1} then {a3}")
    p2 = await ctx.pulled(s)
    a4 = expect(await ctx.ack(s, p2["next"]), 200, what="control: a new ack")
    need(a4["head"] > a1["head"] and a4["cursor"] == p2["next"], f"control: a new ack answers now: {a4}")


@check(
    "X53",
    "every object received validates against this project's own schemas/",
    final=True,
    profile=PROJECT,
    rule="this project's choice: schemas/ (stricter than the published schemas, e.g."
    " data.provenance.on_behalf_of required)",
)
async def x53(ctx: Context) -> str:
    from monitor_protocol.core.schemas import schema_dir

    need_jsonschema(ctx, "X53")
    await tour(ctx)
    return validate_seen(ctx, "X53", "project", schema_dir())


@check(
    "X59",
    "a negative cursor is 400 INVALID in an ack and in a pull: integers are 0..2^53",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 10 (integers in queries and bodies are within"
    " 0..2^53); C27 also lets an ack of -1 be CURSOR_BACKWARDS and a replay from -1 start at the beginning",
)
async def x59(ctx: Context) -> None:
    m = await ctx.create("x59")
    await ctx.pub(m)
    s = await ctx.sub(m)
    p = await ctx.pulled(s)
    expect(await ctx.ack(s, -1), 400, "INVALID", "ack cursor -1")
    expect(await ctx.pull(s, cursor="-1"), 400, "INVALID", "pull cursor=-1")
    need(same_place((await ctx.pulled(s))["cursor"], p["cursor"]), "a refused -1 moved the cursor")
    expect(await ctx.pull(s, cursor="0"), 200, what="control: pull cursor=0")


@check(
    "X60",
    "a retired monitor still takes a subscription, so its log stays readable by a new reader",
    profile=PROJECT,
    rule="this project's choice, docs/protocol.md section 5 (subscribe rules: a retired monitor is not among"
    " the refusals; its writes are UNAVAILABLE, its reads are not)",
)
async def x60(ctx: Context) -> None:
    m = await ctx.create("x60")
    await ctx.pub(m)
    expect(await ctx.configure(m, "retire"), 200, what="retire")
    r = expect(await ctx.subscribe(m), 201, what="subscribe to a retired monitor")
    sub_id, token = r["subscription"]["id"], r["token"]
    page = expect(
        await ctx.req("GET", f"/subscriptions/{sub_id}/pull", token=token), 200, what="pull a retired monitor"
    )
    need(
        any(o["type"] == A for o in page["observations"]),
        f"the retired monitor's log is not served: {[o['type'] for o in page['observations']]}",
    )
    expect(await ctx.publish(m), 409, "UNAVAILABLE", "control: a retired monitor takes no publish")
