"""The client's `pull(..., ack=n)` and `publish_many` against a real `mp serve` (one request each where the
server advertises the extension) and against a server that does not advertise them (the client falls back
to the protocol's plain calls, found through discover). Also `mp watch`, which acks with its next pull."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from monitor_protocol.client import AsyncClient, Client, CursorBackwards, Unauthorized
from monitor_protocol.core.vocab import (
    EXT_ACK_PULL,
    EXT_MONITOR_PAGES,
    EXT_PUBLISH_BATCH,
    MAX_PUBLISH_BATCH,
    MONITORS_PAGE_MAX,
)
from serverutil import long_polls_parked, running_server
from waiting import eventually

TYPE = "com.example.ci.run"


class PlainServer(ThreadingHTTPServer):
    """A forwarding proxy that makes the real server look like one without this server's extensions: its
    discover lists neither, and it answers their requests as such a server would (404 NOT_FOUND). It
    records every request it forwards, so a test can say how many round trips a call took."""

    daemon_threads = True

    def __init__(self, target: str, *, plain: bool = True) -> None:
        self.target = target
        self.plain = plain  # False: forward everything as is (only record)
        self.seen: list[tuple[str, str]] = []
        self.sizes: list[int] = []  # the length of each POST body that was a JSON array
        self.max_body: int | None = None  # a proxy's own body limit, lower than the server's (nginx's 413)
        super().__init__(("127.0.0.1", 0), _Plain)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Plain(BaseHTTPRequestHandler):
    server: PlainServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        route = self.path.split("?")[0]
        self.server.seen.append((self.command, route))
        if body.lstrip().startswith(b"["):
            self.server.sizes.append(len(json.loads(body)))
        if self.server.max_body is not None and length > self.server.max_body:  # as nginx refuses it
            page = b"<html><head><title>413 Request Entity Too Large</title></head><body></body></html>"
            self.send_response(413)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        plain = self.server.plain
        if plain and self.command == "POST" and (route.endswith("/pull") or body.lstrip().startswith(b"[")):
            self._answer(404, {"code": "NOT_FOUND", "error": "no such route here", "done": []})
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
        r = httpx.request(self.command, self.server.target + self.path, content=body, headers=headers)
        payload = r.json()
        if plain and route.endswith("/discover"):
            extensions = payload["capabilities"]["extensions"]
            extensions.pop(EXT_ACK_PULL)
            extensions.pop(EXT_PUBLISH_BATCH)
            extensions.pop(EXT_MONITOR_PAGES)
        if plain and route.endswith("/monitors") and self.command == "GET":
            payload.pop("next")  # the protocol's listing: one reply, the whole of it
        self._answer(r.status_code, payload)

    do_GET = _forward
    do_POST = _forward


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("ext")) as (url, _proc):
        yield url


@pytest.fixture
def plain(base: str) -> Iterator[PlainServer]:
    proxy = PlainServer(base)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.shutdown()


@pytest.fixture
def recorder(base: str) -> Iterator[PlainServer]:
    """mp serve as it is, behind a proxy that records each request."""
    proxy = PlainServer(base, plain=False)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.shutdown()


def feed(c: Client, mid: str) -> tuple[str, str, str]:
    owner = c.create_monitor(mid, types=[TYPE]).owner_token
    sub = c.subscribe(mid, "agent:reader", filter={"types": [TYPE]}, token=owner)
    return owner, sub.subscription.id, sub.token


def items(n: int, prefix: str = "s") -> list[dict[str, Any]]:
    return [{"type": TYPE, "subject": f"{prefix}{i}"} for i in range(n)]


@pytest.mark.parametrize("through", ["mp serve", "a server without the extensions"])
def test_pull_with_ack_acknowledges_then_pulls(base: str, plain: PlainServer, through: str) -> None:
    url = base if through == "mp serve" else plain.url
    mid = "ap-" + ("x" if through == "mp serve" else "p")
    with Client(base) as setup:
        owner, sid, reader = feed(setup, mid)
        setup.publish_many(mid, items(5), token=owner)
    with Client(url, token=reader) as c:
        first = c.pull(sid, limit=2)
        plain.seen.clear()
        second = c.pull(sid, limit=2, ack=first.next)
        assert second.cursor == first.next and [o["subject"] for o in second.observations] == ["s2", "s3"]
        with pytest.raises(CursorBackwards):
            c.pull(sid, ack=1)
        third = c.pull(sid, ack=second.next, wait=1)
        assert [o["subject"] for o in third.observations] == ["s4"]
    if through != "mp serve":  # the fallback: /ack then the GET pull, and never the POST form again
        assert plain.seen[:3] == [
            ("GET", "/mp/v0/discover"),
            ("POST", f"/mp/v0/subscriptions/{sid}/ack"),
            ("GET", f"/mp/v0/subscriptions/{sid}/pull"),
        ]
        assert ("POST", f"/mp/v0/subscriptions/{sid}/pull") not in plain.seen


def test_pull_with_ack_is_one_request_where_advertised(base: str, recorder: PlainServer) -> None:
    with Client(base) as setup:
        owner, sid, reader = feed(setup, "ap-count")
        setup.publish_many("ap-count", items(3), token=owner)
    with Client(recorder.url, token=reader) as c:
        first = c.pull(sid, limit=1)
        c.pull(sid, limit=1, ack=first.next)
        c.pull(sid, limit=1, ack=first.next + 1)
    path = f"/mp/v0/subscriptions/{sid}/pull"
    # discover once (then remembered), then one request per ack-and-pull
    assert recorder.seen == [("GET", path), ("GET", "/mp/v0/discover"), ("POST", path), ("POST", path)]


def test_pull_with_ack_and_cursor_is_refused_before_sending(base: str) -> None:
    with Client(base) as c, pytest.raises(ValueError, match="read-only replay"):
        c.pull("sub-0123456789", cursor=1, ack=2)


@pytest.mark.parametrize("through", ["mp serve", "a server without the extensions"])
def test_publish_many_lists_each_items_seq_or_error(base: str, plain: PlainServer, through: str) -> None:
    url = base if through == "mp serve" else plain.url
    mid = "pm-" + ("x" if through == "mp serve" else "p")
    with Client(base) as setup:
        owner, sid, reader = feed(setup, mid)
    batch = [*items(2), {"type": "com.example.undeclared"}, {"type": TYPE, "subject": "last"}]
    with Client(url, token=owner) as c:
        plain.seen.clear()
        done = c.publish_many(mid, batch)
        assert done.batched is (through == "mp serve")
        assert done.published == 3 and [i.index for i in done.refused] == [2]
        refused = done.refused[0].error
        assert (
            refused is not None and refused.code == "UNKNOWN_VOCABULARY" and "rejected_seq" in refused.extras
        )
        seqs = [s for s in done.seqs if s is not None]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        with pytest.raises(Unauthorized):
            c.publish_many(mid, items(2), token="wrong")
    with Client(base, token=reader) as r:
        got = r.pull(sid, limit=50).observations
        assert [o["subject"] for o in got] == ["s0", "s1", "last"]
        assert [int(o["sequence"]) for o in got] == seqs
    if through != "mp serve":
        posts = [p for m, p in plain.seen if m == "POST"]
        # one per item, and the refused call's first item (its 401 raises: nothing more is sent)
        assert posts == [f"/mp/v0/monitors/{mid}/observations"] * 5
    else:
        assert plain.seen == []


def test_publish_many_splits_a_long_list_at_the_advertised_maximum(base: str, recorder: PlainServer) -> None:
    with Client(base) as setup:
        owner, sid, reader = feed(setup, "pm-long")
    n = 2 * MAX_PUBLISH_BATCH + 5
    with Client(recorder.url, token=owner) as c:
        done = c.publish_many("pm-long", items(n))
    assert recorder.sizes == [MAX_PUBLISH_BATCH, MAX_PUBLISH_BATCH, 5]
    assert [i.index for i in done.items] == list(range(n)) and done.published == n
    with pytest.raises(ValueError, match="at least one"):
        Client(base).publish_many("pm-long", [])


def test_publish_many_halves_a_request_a_proxy_refuses_as_too_large(base: str, recorder: PlainServer) -> None:
    """A proxy in front of the server with a lower body limit than the server advertises (nginx's default
    client_max_body_size is 1 MiB) answers 413 with a web page: nothing of that request was taken, so the
    client sends it again as two halves, down to one item; an item too large alone is reported, not raised."""
    with Client(base) as setup:
        owner, _sid, _reader = feed(setup, "pm-proxy")
    recorder.max_body = 2_500
    batch = [{"type": TYPE, "subject": f"p{i}", "data": {"pad": "x" * 400}} for i in range(12)]
    batch.insert(5, {"type": TYPE, "subject": "huge", "data": {"pad": "y" * 4_000}})
    with Client(recorder.url, token=owner) as c:
        done = c.publish_many("pm-proxy", batch)
    assert [i.index for i in done.items] == list(range(13))
    assert done.published == 12 and [i.index for i in done.items if i.error is not None] == [5]
    assert done.items[5].error is not None and done.items[5].error.status == 413
    assert "a proxy in front of the server refused the request as too large" in str(done.items[5].error)
    assert recorder.sizes[0] == 13 and max(recorder.sizes[1:]) < 13  # halved after the whole was refused
    with Client(base) as check:
        assert check.get_monitor("pm-proxy", token=owner).head >= 12


def test_the_async_client_does_the_same(base: str, plain: PlainServer) -> None:
    with Client(base) as setup:
        owner, sid, reader = feed(setup, "async-ext")

    async def main() -> None:
        for url, batched in ((base, True), (plain.url, False)):
            async with AsyncClient(url) as c:
                done = await c.publish_many("async-ext", items(3, url[-2:]), token=owner)
                assert done.batched is batched and done.published == 3
                first = await c.pull(sid, limit=2, token=reader)
                both = await c.pull(sid, limit=10, ack=first.next, token=reader)
                assert both.cursor == first.next and both.observations

    anyio.run(main)


def test_mp_watch_acks_with_its_next_pull(base: str, tmp_path: Path) -> None:
    """`mp watch --once` prints the backlog and commits it: the acks ride on the pulls (ack-and-pull), and
    the last batch's ack is sent on its own before it exits."""
    import subprocess

    from serverutil import mp_command, mp_env

    with Client(base) as setup:
        owner, sid, reader = feed(setup, "watch-ext")
        setup.publish_many("watch-ext", items(5, "w"), token=owner)
    ran = subprocess.run(
        mp_command("watch", sid, "--token", reader, "--base", base, "--once", "--limit", "2"),
        env=mp_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert all(f"w{i}" in ran.stdout for i in range(5)), ran.stdout
    with Client(base, token=reader) as c:
        after = c.pull(sid)
        assert after.cursor == after.head + 1 and after.observations == []


def test_mp_serve_parks_an_ack_and_pull_and_rechecks_it_as_a_plain_pull(base: str) -> None:
    """Over HTTP, as in the page: the ack runs once; a seek back while the poll is parked wakes it (its
    subscribed{seek} row is an append) and the reply reads from where the seek put the cursor."""
    with Client(base) as setup:
        owner, sid, reader = feed(setup, "park-ext")
        setup.publish_many("park-ext", items(2, "k"), token=owner)
    with Client(base, token=reader) as c:
        head = c.pull(sid).next
        answer: list[Any] = []
        waiter = threading.Thread(target=lambda: answer.append(c.pull(sid, ack=head, wait=50)))
        waiter.start()
        with Client(base, token=reader) as other:
            eventually(  # the ack is committed before the poll parks
                lambda: other.get_subscription(sid).cursor == head, interval=0.02, what="the ack committed"
            )
            eventually(lambda: long_polls_parked(base) >= 1, what="the poll parks")
            assert waiter.is_alive()  # parked: nothing matches yet
            other.seek(sid, 1, "read it all again")
        waiter.join(70)
        (reply,) = answer
        assert reply.cursor == 1  # re-acked, it would be `head` again
        assert [o["subject"] for o in reply.observations] == ["k0", "k1"]


def test_publish_many_reports_a_chunk_refused_whole_on_each_of_its_items(base: str) -> None:
    """The second request of a batch is refused whole (a value JSON cannot carry: an integer beyond 2^53):
    its items carry that error, and the first request's items stay reported as published."""
    with Client(base) as setup:
        owner, sid, reader = feed(setup, "pm-chunk")
    batch = items(MAX_PUBLISH_BATCH + 3)
    batch[MAX_PUBLISH_BATCH + 1]["data"] = {"x": 2**60}
    with Client(base, token=owner) as c:
        done = c.publish_many("pm-chunk", batch)
    assert done.published == MAX_PUBLISH_BATCH
    assert [i.index for i in done.refused] == [
        MAX_PUBLISH_BATCH,
        MAX_PUBLISH_BATCH + 1,
        MAX_PUBLISH_BATCH + 2,
    ]
    assert {i.error.code for i in done.refused if i.error is not None} == {"INVALID"}
    with Client(base, token=reader) as r:
        assert len(r.pull(sid, limit=200).observations) == MAX_PUBLISH_BATCH  # nothing of the refused one


def test_list_monitors_follows_every_page_where_the_server_lists_in_pages(
    base: str, recorder: PlainServer, plain: PlainServer
) -> None:
    made = [f"lp{i:04d}" for i in range(MONITORS_PAGE_MAX + 5)]
    with Client(base) as setup:
        for mid in made:
            setup.create_monitor(mid, visibility="public")
    with Client(recorder.url) as c:
        listed = [m.id for m in c.list_monitors()]
    assert set(made) <= set(listed) and listed == sorted(set(listed))  # each once, in id order
    pages = -(-len(listed) // MONITORS_PAGE_MAX)
    assert recorder.seen == [("GET", "/mp/v0/monitors")] * pages and pages >= 2

    async def listed_async() -> list[str]:
        async with AsyncClient(base) as ac:
            return [m.id for m in await ac.list_monitors()]

    assert anyio.run(listed_async) == listed
    with Client(plain.url) as c:  # a server whose reply has no `next`: that reply is the listing
        plain.seen.clear()
        assert [m.id for m in c.list_monitors()] == listed[:MONITORS_PAGE_MAX]
        assert plain.seen == [("GET", "/mp/v0/monitors")]
