"""GET /monitors a page at a time (this server's extension `monitor-protocol-python/monitor-pages`): every
monitor a caller may see, once each, in id order, whatever the page size; each call reads a bounded number
of records however many monitors an open server has been given; bad `limit` and `after` are 400 INVALID."""

from __future__ import annotations

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_protocol.core import listing_seal
from monitor_protocol.core.rules import monitors as monitors_rules
from monitor_protocol.core.vocab import EXT_MONITOR_PAGES, MONITORS_PAGE_MAX, MONITORS_PAGE_SCAN
from monitor_protocol.store.memory import MemoryStore

pytestmark = pytest.mark.quick


def listing(h: Harness, token: str | None, limit: int | None = None) -> tuple[list[str], list[int]]:
    """Every page, following `next`: the ids in the order given, and each page's size."""
    ids: list[str] = []
    sizes: list[int] = []
    after: str | None = None
    while True:
        query = [(k, str(v)) for k, v in (("limit", limit), ("after", after)) if v is not None]
        r = h.call("GET", "/monitors", token=token, query=query)
        assert r.status == 200, r.body
        ids += [m["id"] for m in r.body["monitors"]]
        sizes.append(len(r.body["monitors"]))
        assert r.body["cacheScope"] == ("private" if token else "public")
        if r.body["next"] is None:
            return ids, sizes
        assert after is None or r.body["next"] > after  # always onwards
        after = r.body["next"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(st.sampled_from(["public", "private", "shared"]), min_size=0, max_size=14),
    limit=st.integers(min_value=1, max_value=5),
    who=st.sampled_from(["anonymous", "owner", "subscribe", "reader"]),
)
def test_the_pages_hold_each_visible_monitor_once_in_id_order(kinds, limit, who):
    h = Harness(MemoryStore())
    tokens: dict[str, str | None] = {"anonymous": None}
    for i, kind in reversed(list(enumerate(kinds))):  # made out of order: the listing sorts
        mid = f"m{i:02d}"
        created = h.call("POST", "/monitors", {"id": mid, "owner": "human:you", "visibility": kind})
        assert created.status == 201, created.body
        if i == len(kinds) // 2:  # the tokens of one monitor in the middle
            tokens["owner"] = created.body["owner_token"]
            tokens["subscribe"] = created.body.get("subscribe_token")
            _sub, tokens["reader"] = h.subscribe(mid, created.body["owner_token"])
    token = tokens.get(who)
    middle = f"m{len(kinds) // 2:02d}"
    # Section 4's visibility, said here from first principles: public to all; the middle monitor also to
    # its owner's token, its subscribe token (when shared) and its reader's token.
    sees_middle = who in ("owner", "reader") or (who == "subscribe" and token is not None)
    expected = [
        f"m{i:02d}"
        for i, kind in enumerate(kinds)
        if kind == "public" or (f"m{i:02d}" == middle and sees_middle)
    ]
    ids, sizes = listing(h, token, limit)
    assert ids == expected
    assert all(size <= limit for size in sizes)
    whole, _ = listing(h, token)  # one page: the default holds them all
    assert whole == expected


@pytest.mark.parametrize("store_kind", STORE_KINDS)
def test_a_listing_reads_a_bounded_number_of_records_and_says_where_to_go_on(store_kind, tmp_path):
    """2,100 private monitors before 3 public ones: an anonymous listing reads MONITORS_PAGE_SCAN records,
    shows none and says where to go on, without naming the private monitor it stopped at (sealed: a tester
    read private names through `next`); the next page finds the public ones. The owner of a private monitor
    among them finds it on the first page (positive control: the records are read, and filtered)."""
    h = Harness(make_store(store_kind, tmp_path))
    owner = None
    for i in range(MONITORS_PAGE_SCAN + 100):
        r = h.call("POST", "/monitors", {"id": f"p{i:05d}", "visibility": "private"})
        owner = r.body["owner_token"] if i == 7 else owner
    for i in range(3):
        h.call("POST", "/monitors", {"id": f"q{i}", "visibility": "public"})
    reads: list[int] = []
    store = h.store
    real = type(store).list_monitors_page

    def counted(self, after, limit):
        page = real(self, after, limit)
        reads.append(len(page))
        return page

    type(store).list_monitors_page = counted
    try:
        first = h.call("GET", "/monitors")
        assert first.status == 200
        assert first.body["monitors"] == [] and first.body["next"].startswith("!000001"), first.body["next"]
        assert listing_seal.opened(h.service.listing_key, first.body["next"]) == (
            f"p{MONITORS_PAGE_SCAN - 1:05d}",
            "",
            1,
        )  # control: the sealed boundary is where the scan stopped
        assert MONITORS_PAGE_SCAN <= sum(reads) <= MONITORS_PAGE_SCAN + len(reads)  # (+1 a read: any more?)
        second = h.call("GET", "/monitors", query=[("after", first.body["next"])])
        assert [m["id"] for m in second.body["monitors"]] == ["q0", "q1", "q2"] and second.body[
            "next"
        ] is None
        # sealed under another key (a restart, another server without the database's key): from the anchor
        # again, so the listing still ends, reading the skipped records again
        other = Harness(store)
        again = other.call("GET", "/monitors", query=[("after", first.body["next"])])
        assert again.body["monitors"] == [] and again.body["next"].startswith("!000001")
        third = other.call("GET", "/monitors", query=[("after", again.body["next"])])
        assert [m["id"] for m in third.body["monitors"]] == ["q0", "q1", "q2"], third.body
        mine = h.call("GET", "/monitors", token=owner, query=[("limit", "1")])
        assert [m["id"] for m in mine.body["monitors"]] == ["p00007"] and mine.body["next"] == "p00007"
    finally:
        type(store).list_monitors_page = real
    assert [m.id for m in store.list_monitors()][-3:] == ["q0", "q1", "q2"]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ([("limit", "0")], "limit must be at least 1"),
        ([("limit", str(MONITORS_PAGE_MAX + 1))], f"limit must be at most {MONITORS_PAGE_MAX}"),
        ([("limit", "-1")], "limit must be an integer in ASCII decimal digits"),
        ([("limit", "ten")], "limit must be an integer in ASCII decimal digits"),
        ([("after", "")], "after must be a non-empty string"),
        ([("after", "x" * 257)], "at most 256 are allowed"),
    ],
)
def test_a_bad_limit_or_after_is_invalid_and_says_what_to_send(query, says):
    h = Harness(MemoryStore())
    h.call("POST", "/monitors", {"id": "ci", "visibility": "public"})
    r = h.call("GET", "/monitors", query=query)
    assert r.status == 400 and r.body["code"] == "INVALID" and says in r.body["error"], r.body
    assert h.call("GET", "/monitors", query=[("limit", "1")]).status == 200  # positive control


def test_json_rpc_takes_limit_and_after_and_discover_advertises_the_pages():
    h = Harness(MemoryStore())
    for mid in ("b1", "a1", "c1"):
        h.call("POST", "/monitors", {"id": mid, "visibility": "public"})
    body = {"jsonrpc": "2.0", "id": 1, "method": "monitors/list", "params": {"limit": 2, "after": "a1"}}
    r = h.call("POST", "/rpc", body)
    assert [m["id"] for m in r.body["result"]["monitors"]] == ["b1", "c1"] and r.body["result"][
        "next"
    ] is None
    ext = h.call("GET", "/discover").body["capabilities"]["extensions"][EXT_MONITOR_PAGES]
    assert ext["max_items"] == MONITORS_PAGE_MAX and ext["jsonrpc"] == "monitors/list"


def test_the_page_bound_holds_against_a_smaller_setting(monkeypatch):
    """The rule reads its bounds from one place: with a page of 2, a listing of 5 takes 3 pages."""
    monkeypatch.setattr(monitors_rules, "MONITORS_PAGE_MAX", 2)
    h = Harness(MemoryStore())
    for i in range(5):
        h.call("POST", "/monitors", {"id": f"m{i}", "visibility": "public"})
    ids, sizes = listing(h, None)
    assert ids == [f"m{i}" for i in range(5)] and sizes == [2, 2, 1]


async def test_mcp_lists_resources_a_page_at_a_time(tmp_path, monkeypatch):
    """MCP's resources/list pages with the listing: its cursor is the listing's `next`."""
    import mcp_types as types
    from monitor_protocol.doors.mcp.backends import EmbeddedBackend
    from monitor_protocol.doors.mcp.server import MonitorMCP

    monkeypatch.setattr(monitors_rules, "MONITORS_PAGE_MAX", 2)
    mcp = MonitorMCP(EmbeddedBackend(str(tmp_path / "mcp.db"), sweep_interval=0))
    await mcp.backend.start(mcp.monitor_changed)
    try:
        for mid in ("c1", "a1", "b1"):
            args = {"id": mid, "visibility": "public"}
            made = await mcp._call_tool(
                None, types.CallToolRequestParams(name="monitor_create", arguments=args)
            )
            assert not made.is_error, made.content[0].text
        first = await mcp._list_resources(None, None)
        assert [r.uri for r in first.resources][::3] == ["monitor://a1/definition", "monitor://b1/definition"]
        assert first.next_cursor == "b1"
        second = await mcp._list_resources(None, types.PaginatedRequestParams(cursor=first.next_cursor))
        assert [r.uri for r in second.resources][::3] == ["monitor://c1/definition"]
        assert second.next_cursor is None
        from mcp.shared.exceptions import MCPError

        try:  # a later page that cannot be read is an error, not an empty page taken for the end
            await mcp._list_resources(None, types.PaginatedRequestParams(cursor="x" * 300))
        except MCPError as err:
            assert "after" in str(err), err
        else:
            raise AssertionError("a bad cursor was answered as the end of the listing")
    finally:
        await mcp.backend.close()


async def test_mcp_monitor_list_gives_50_unless_asked_for_more(tmp_path):
    """A model reads every character of a tool's result: monitor_list gives 50 a page by default."""
    import mcp_types as types
    from monitor_protocol.doors.mcp.backends import EmbeddedBackend
    from monitor_protocol.doors.mcp.server import MonitorMCP
    from monitor_protocol.doors.mcp.tools import MCP_LIST_DEFAULT

    mcp = MonitorMCP(EmbeddedBackend(str(tmp_path / "mcp.db"), sweep_interval=0))
    await mcp.backend.start(mcp.monitor_changed)

    async def tool(args):
        result = await mcp._call_tool(None, types.CallToolRequestParams(name="monitor_list", arguments=args))
        assert not result.is_error, result.content[0].text
        return result.structured_content

    try:
        for i in range(MCP_LIST_DEFAULT + 3):
            await mcp.backend.call("create_monitor", {"id": f"m{i:03d}", "visibility": "public"}, None)
        first = await tool({})
        assert len(first["monitors"]) == MCP_LIST_DEFAULT and first["next"] == f"m{MCP_LIST_DEFAULT - 1:03d}"
        rest = await tool({"after": first["next"]})
        assert [m["id"] for m in rest["monitors"]] == [
            f"m{i:03d}" for i in range(MCP_LIST_DEFAULT, MCP_LIST_DEFAULT + 3)
        ]
        assert len((await tool({"limit": 500}))["monitors"]) == MCP_LIST_DEFAULT + 3
    finally:
        await mcp.backend.close()


async def test_the_conformance_listing_checks_follow_the_pages():
    """Found by a reviewer: C18 (published) and X16 read the first page only, and failed against this
    server once it held more than a page of monitors before theirs."""
    from monitor_protocol.conformance.inprocess import InProcessTransport
    from monitor_protocol.conformance.runner import run_suite

    store = MemoryStore()
    h = Harness(store)
    for i in range(MONITORS_PAGE_MAX + 100):  # ids before any the suite makes ("a..." < "c18-...")
        h.call("POST", "/monitors", {"id": f"a{i:04d}", "visibility": "public"})
    for i in range(MONITORS_PAGE_SCAN + 10):
        h.call("POST", "/monitors", {"id": f"b{i:04d}", "visibility": "private"})
    report = await run_suite(InProcessTransport.create(store=store), only="C18,X16")
    assert report.failed == 0 and report.passed == 2, [(r.id, r.note) for r in report.results]


def test_a_small_limit_reads_the_store_in_whole_chunks(tmp_path):
    """Found by a reviewer: the read bound counted rows, not reads: `limit=1` over 2,100 monitors the caller
    may not see made 2,000 store reads (on PostgreSQL, 2,000 round trips) for one request."""
    h = Harness(make_store("sqlite", tmp_path))
    for i in range(MONITORS_PAGE_SCAN + 100):
        h.call("POST", "/monitors", {"id": f"p{i:05d}", "visibility": "private"})
    reads: list[int] = []
    real = type(h.store).list_monitors_page

    def counted(self, after, limit):
        reads.append(limit)
        return real(self, after, limit)

    type(h.store).list_monitors_page = counted
    try:
        r = h.call("GET", "/monitors", query=[("limit", "1")])
    finally:
        type(h.store).list_monitors_page = real
    assert r.status == 200 and r.body["monitors"] == [] and r.body["next"] is not None
    assert len(reads) <= -(-MONITORS_PAGE_SCAN // MONITORS_PAGE_MAX), reads  # 4 reads of 501, not 2,000


@settings(max_examples=50, deadline=None)
@given(
    anchor=st.from_regex(r"[A-Za-z0-9_.-]{0,64}", fullmatch=True),
    boundary=st.from_regex(r"[A-Za-z0-9_.-]{2,64}", fullmatch=True),
    count=st.integers(min_value=1, max_value=999_998),
)
def test_a_sealed_boundary_opens_only_with_its_key_and_its_anchor(anchor, boundary, count):
    """core/listing_seal.py: the boundary comes back under the same key; under another key, with the anchor
    or the count changed or a bit of the sealed part flipped, the page starts from the anchor (never from a
    forged id); the sealed text never holds the boundary and is one length whatever the boundary's; each
    `next` sorts after the `after` it answers (a client following pages checks that it moves on)."""
    key = listing_seal.new_key()
    token = listing_seal.seal(key, anchor, boundary, count)
    assert listing_seal.opened(key, token) == (boundary, anchor, count)
    head, _, sealed = token.partition("!")
    assert head == anchor and (len(boundary) < 12 or boundary not in sealed[6:])  # shorter: by chance, maybe
    assert listing_seal.seal(key, anchor, boundary, count) != token  # a nonce of its own each time
    assert len(sealed) == len(listing_seal.seal(key, anchor, "ab", count).partition("!")[2])
    assert anchor < token < listing_seal.seal(key, anchor, boundary, count + 1)
    assert all(token < anchor + c for c in "-._0aA")  # before any id that follows the anchor
    assert listing_seal.opened(listing_seal.new_key(), token) == (anchor, anchor, 0)
    forged = ("zz" if anchor != "zz" else "zy") + token[len(anchor) :]
    assert listing_seal.opened(key, forged)[1:] == (forged.partition("!")[0], 0)
    recounted = anchor + "!" + str(count % 999_998 + 1).zfill(6) + token[len(anchor) + 7 :]
    assert listing_seal.opened(key, recounted)[2] == 0
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    assert listing_seal.opened(key, flipped) == (anchor, anchor, 0)
    assert listing_seal.opened(key, anchor + "!000001not base64!") == (anchor, anchor, 0)
    assert listing_seal.opened(key, anchor) is None  # an id


def test_after_must_be_a_page_end_or_a_monitor_the_caller_sees():
    """Found by a reviewer: a page from any point says whether a visible monitor lies within the records one
    call reads, and a binary search over `after` found a private id in 63 anonymous GETs. Now `after` is a
    seal this server made, or an id the caller may see; anything else is 400 INVALID."""
    h = Harness(MemoryStore())
    owner = h.call("POST", "/monitors", {"id": "secret-1", "visibility": "private"}).body["owner_token"]
    h.call("POST", "/monitors", {"id": "zzz", "visibility": "public"})
    for after in ("secret-1", "secret-0", "s", "secret-1!garbage", "secret-1!000000" + "A" * 124):
        r = h.call("GET", "/monitors", query=[("after", after)])
        assert r.status == 400 and r.body["code"] == "INVALID", (after, r.body)
        assert "the `next` of the previous page" in r.body["error"], r.body
    # controls: a visible id, an owner's own private id, and a seal of another key whose anchor is visible
    r = h.call("GET", "/monitors", query=[("after", "zzz")])
    assert r.status == 200 and r.body["monitors"] == []
    r = h.call("GET", "/monitors", token=owner, query=[("after", "secret-1")])
    assert r.status == 200 and [m["id"] for m in r.body["monitors"]] == ["zzz"]
    stale = listing_seal.seal(listing_seal.new_key(), "", "secret-1")
    r = h.call("GET", "/monitors", query=[("after", stale)])
    assert r.status == 200 and [m["id"] for m in r.body["monitors"]] == ["zzz"]


def test_the_client_follows_sealed_pages_to_the_end():
    """Found by a reviewer: the client stops when a `next` does not sort after the `after` it answers, and
    a sealed `next` began with "~" (above every id) and two of them in a row compared at random, so
    `list_monitors()` returned [] in 6 of 20 runs over 4,100 private monitors before 3 public ones."""
    from monitor_protocol.client.routes import Routes

    h = Harness(MemoryStore())
    for i in range(2 * MONITORS_PAGE_SCAN + 100):
        h.call("POST", "/monitors", {"id": f"p{i:05d}", "visibility": "private"})
    for i in range(3):
        h.call("POST", "/monitors", {"id": f"q{i}", "visibility": "public"})

    class Caller:
        def _tok(self, token):
            return token

    for _ in range(5):  # each run its own nonces
        plan = Routes.list_monitors(Caller()).plan()
        calls, call = 0, plan.send(None)
        try:
            while True:
                calls += 1
                reply = h.call(call.method, call.path, query=call.params)
                assert reply.status == 200, reply.body
                call = plan.send(reply.body)
        except StopIteration as done:
            found = done.value
        assert [m.id for m in found] == ["q0", "q1", "q2"] and calls == 3, (found, calls)
