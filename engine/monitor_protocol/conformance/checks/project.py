"""Project checks beyond the published list: seek, renew, retire, supersedes chains, compaction policies,
lifecycle refusals, JSON-RPC, lag, error bodies, malformed input, redelivery, leases, filters, `from`, state."""

from __future__ import annotations

import secrets
from typing import Any

from monitor_protocol.conformance.checks.base import (
    ERROR_STATUS,
    EXT_PUBLISH_BATCH,
    JSONRPC_CODE,
    PROJECT,
    T_BOOKMARK,
    T_CONFIGURED,
    T_LEASE,
    T_REJECTED,
    T_SUB_RETIRED,
    T_SUBSCRIBED,
    A,
    B,
    CheckFailed,
    Context,
    act_monitor,
    check,
    compacted,
    expect,
    has_extension,
    need,
    need_rejected_seq,
    payload,
    seq_of,
    supersedes_target,
    types_in,
)


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
    seeks = [payload(o) for o in await types_in(ctx, m, T_SUBSCRIBED) if "seek" in payload(o)]
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
    wills = [payload(o) for o in await types_in(ctx, m, T_SUB_RETIRED)]
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
        need(supersedes_target(nxt, m, prev), f"seq {nxt['id']} does not name {prev['id']}")
    log = {o["id"]: o for o in await ctx.log(m)}
    for o in chain:
        got = dict(log[o["id"]])
        got.pop("redelivered", None)
        need(got == o, f"seq {o['id']} changed")


@check("X05", "compaction: reset_policy earliest moves to the floor, latest to head + 1", profile=PROJECT)
async def x05(ctx: Context) -> None:
    m, head, subs = await compacted(ctx, "x05")
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
    b = expect(await ctx.pull(subs["none"]), 410, "CURSOR_EXPIRED", "control: reset_policy none")
    need(b.get("requested") == subs["none"].body["cursor"], f"CURSOR_EXPIRED does not say requested: {b}")


@check("X06", "a replay after a relist ends with a bookmark observation", profile=PROJECT)
async def x06(ctx: Context) -> None:
    m, head, subs = await compacted(ctx, "x06")
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
    r = expect(await ctx.configure(m, "pause"), 200, what="pause")
    need(r["monitor"]["active"] is False and isinstance(r.get("seq"), int), f"pause reply {r}")
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
    m, (j1,) = await act_monitor(ctx, "x08", ["job-1"])
    s = await ctx.sub(m, capabilities=["observe", "act"])
    expect(await ctx.lease(s, "claim", subject=j1), 201, what="claim")
    d1 = expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete")
    d2 = expect(await ctx.lease(s, "complete", subject=j1, outcome="done"), 200, what="complete again")
    same = {k: d2.get(k) for k in ("ok", "seq", "lease") if k in d1} == {
        k: d1[k] for k in ("ok", "seq", "lease") if k in d1
    }
    need(same, f"second complete is not the prior result: {d1} vs {d2}")
    rows = [payload(o).get("action") for o in await types_in(ctx, m, T_LEASE)]
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
        if raw.startswith(b"[") and r.status == 207 and await has_extension(ctx, EXT_PUBLISH_BATCH):
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
        payload(o) for o in await types_in(ctx, m, T_CONFIGURED) if payload(o).get("action") == "create"
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
    m, (j1,) = await act_monitor(ctx, "x15", ["job-1"])
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
    need(m.id not in await ctx.listed(None), "shared listed to all")
    need(m.id in await ctx.listed(m.subscribe_token), "control: the subscribe token lists it")
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
    m, (j1,) = await act_monitor(ctx, "x18", ["job-1"])
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
