"""The sync client's HTTP layer (keepalive.py): keep-alive connections reused, a connection the server closed
while idle replaced without failing the request, and the `ConnectionFailed.sent` contract kept (never
sent / may have been sent). httpx stays where a proxy applies or a transport is given."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from monitor_protocol.client import AsyncClient, Client, ConnectionFailed, Invalid, clients, keepalive
from monitor_protocol.client.routes import ClientBase, Routes
from monitor_protocol.core import wire
from serverutil import running_server
from waiting import eventually, eventually_async

TYPE = "com.example.ci.run"


class CountingForwarder:
    """A TCP forwarder in front of the server that counts the connections clients open, and those that ended
    (while a client holds its connection idle, only the server can end it: a test waits for that instead of
    sleeping past the server's keep-alive)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.accepted = 0
        self.ended = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client, self._ended), daemon=True).start()

    def _ended(self) -> None:
        self.ended += 1

    def close(self) -> None:
        self.listener.close()


def _pipe(src: socket.socket, dst: socket.socket, on_eof: Callable[[], None] | None = None) -> None:
    ended = False
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        ended = True
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    if ended and on_eof is not None:  # counted once the client's side is shut too: a test then sees it closed
        on_eof()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # a short keep-alive, so a test can outwait it
    with running_server(tmp_path_factory.mktemp("ka"), "--keep-alive", "1") as (url, _proc):
        yield url


@pytest.fixture
def forwarder(server: str) -> Iterator[CountingForwarder]:
    fwd = CountingForwarder(int(server.rsplit(":", 1)[1]))
    try:
        yield fwd
    finally:
        fwd.close()


def test_the_client_reuses_one_connection(forwarder: CountingForwarder) -> None:
    with Client(f"http://127.0.0.1:{forwarder.port}") as c:
        assert c.http_layer == "keep-alive"
        owner = c.create_monitor("reuse", types=[TYPE]).owner_token
        for i in range(20):
            c.publish("reuse", TYPE, subject=f"b{i}", token=owner)
        assert c.get_monitor("reuse", token=owner).head >= 20
    assert forwarder.accepted == 1


def test_a_connection_the_server_closed_while_idle_is_replaced(forwarder: CountingForwarder) -> None:
    with Client(f"http://127.0.0.1:{forwarder.port}") as c:
        owner = c.create_monitor("idle", types=[TYPE]).owner_token
        c.publish("idle", TYPE, token=owner)
        eventually(  # the server's keep-alive (1 s) closes the idle connection
            lambda: forwarder.ended >= 1, what="the server closes the idle connection"
        )
        published = c.publish("idle", TYPE, token=owner)  # no ConnectionFailed: a fresh connection
        assert published.seq > 0
    assert forwarder.accepted == 2


def test_a_refused_connection_was_never_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once it is closed
    with Client(f"http://127.0.0.1:{port}") as c, pytest.raises(ConnectionFailed) as failed:
        c.discover()
    assert failed.value.sent is False


def _silent_server(reply: bytes | None) -> tuple[int, socket.socket, threading.Event]:
    """A listener that reads a request, then closes without answering (reply None), or holds the connection
    without a word until the test sets the returned event (`reply` given: it never answers in time)."""
    listener = socket.create_server(("127.0.0.1", 0))
    released = threading.Event()

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.recv(65536)
        if reply is not None:
            released.wait(60)  # a hang guard: the test releases it as soon as it is done
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], listener, released


@pytest.mark.parametrize("reply", [None, b"late"])
def test_a_request_that_got_no_reply_may_have_been_sent(reply: bytes | None) -> None:
    port, listener, released = _silent_server(reply)
    try:
        with Client(f"http://127.0.0.1:{port}", timeout=0.5) as c, pytest.raises(ConnectionFailed) as failed:
            c.publish("m", TYPE, token="t")
        assert failed.value.sent is True and failed.value.url.endswith("/mp/v0/monitors/m/observations")
    finally:
        released.set()
        listener.close()


def test_a_lone_surrogate_reaches_the_server_and_is_refused_in_its_words(server: str) -> None:
    with Client(server) as c:
        owner = c.create_monitor("surrogate", types=[TYPE]).owner_token
        with pytest.raises(Invalid) as refused:
            c.publish("surrogate", TYPE, subject="bad \ud800", token=owner)
        assert "surrogate" in refused.value.message
        assert c.publish("surrogate", TYPE, subject="good", token=owner).seq > 0  # control


def test_query_parameters_are_encoded(server: str) -> None:
    with Client(server) as c:
        owner = c.create_monitor("query", types=[TYPE]).owner_token
        sub = c.subscribe("query", "agent:q", token=owner)
        c.publish("query", TYPE, subject="a b&c=d/é", token=owner)
        page = c.pull(sub.subscription.id, filter={"subjects": ["a b&c=d/é"]}, token=sub.token)
        assert [o["subject"] for o in page.observations] == ["a b&c=d/é"]


def test_httpx_is_kept_where_a_proxy_applies_or_a_transport_is_given(
    monkeypatch: pytest.MonkeyPatch, server: str
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with Client("http://mp.example:8130") as proxied:
        assert proxied.http_layer == "httpx"
    monkeypatch.setenv("NO_PROXY", "mp.example")
    with Client("http://mp.example:8130") as bypassed:
        assert bypassed.http_layer == "keep-alive"
    monkeypatch.delenv("HTTP_PROXY")
    with Client(server, transport=httpx.HTTPTransport()) as given:
        assert given.http_layer == "httpx"
        assert given.discover().supported_versions  # and it works


def test_a_closed_client_sends_nothing(server: str, tmp_path: Path) -> None:
    c = Client(server)
    c.discover()
    c.close()
    with pytest.raises(ConnectionFailed) as failed:
        c.discover()
    assert failed.value.sent is False


# ---------------------------------------------------------------------------------------------- async


def test_the_async_client_reuses_connections_and_replaces_a_closed_one(forwarder: CountingForwarder) -> None:
    async def main() -> None:
        async with AsyncClient(f"http://127.0.0.1:{forwarder.port}") as c:
            assert c.http_layer == "asyncio keep-alive"
            owner = (await c.create_monitor("areuse", types=[TYPE])).owner_token
            for i in range(20):
                await c.publish("areuse", TYPE, subject=f"b{i}", token=owner)
            assert forwarder.accepted == 1
            await eventually_async(  # the server's keep-alive (1 s) closes the idle connection
                lambda: forwarder.ended >= 1,
                interval=0.05,
                what="the server closes the connection",
            )
            assert (await c.publish("areuse", TYPE, token=owner)).seq > 0
            assert forwarder.accepted == 2
            # 16 at once: each in flight on its own connection, all answered
            done = await asyncio.gather(*(c.publish("areuse", TYPE, token=owner) for _ in range(16)))
            assert len({d.seq for d in done}) == 16
            assert forwarder.accepted <= 2 + 16

    asyncio.run(main())


@pytest.mark.parametrize("poll", [True, False])  # False: as on Windows, where select has no poll
def test_the_async_client_sees_a_close_its_loop_has_not_read_yet(
    forwarder: CountingForwarder, poll: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that has not yielded to the loop since the server closed an idle connection: the loop has not
    read the close, and the pool must not send the next request into it (the socket itself is asked)."""
    if not poll:
        import select

        monkeypatch.delattr(select, "poll")

    monitor = f"aunread-{'poll' if poll else 'select'}"

    async def main() -> None:
        async with AsyncClient(f"http://127.0.0.1:{forwarder.port}") as c:
            owner = (await c.create_monitor(monitor, types=[TYPE])).owner_token
            assert (await c.publish(monitor, TYPE, token=owner)).seq > 0
            assert forwarder.accepted == 1
            deadline = time.monotonic() + 15
            while forwarder.ended < 1 and time.monotonic() < deadline:
                time.sleep(0.05)  # blocking on purpose: the loop does not run, so it cannot read the close
            assert forwarder.ended == 1, "the server's keep-alive (1 s) did not close the idle connection"
            assert (await c.publish(monitor, TYPE, token=owner)).seq > 0
            assert forwarder.accepted == 2  # control: the request went on a new connection

    asyncio.run(main())


def test_the_async_client_keeps_the_sent_contract() -> None:
    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        async with AsyncClient(f"http://127.0.0.1:{port}") as c:
            with pytest.raises(ConnectionFailed) as refused:
                await c.discover()
            assert refused.value.sent is False
        for reply in (None, b"late"):
            silent, listener, released = _silent_server(reply)
            try:
                async with AsyncClient(f"http://127.0.0.1:{silent}", timeout=0.5) as c:
                    with pytest.raises(ConnectionFailed) as lost:
                        await c.publish("m", TYPE, token="t")
                    assert lost.value.sent is True
            finally:
                released.set()
                listener.close()

    asyncio.run(main())


def test_the_async_client_works_across_event_loops(server: str) -> None:
    c = AsyncClient(server)
    for _ in range(2):  # a second loop: the first loop's idle connections are not reused
        assert asyncio.run(c.discover()).supported_versions
    asyncio.run(c.aclose())


def test_the_async_client_keeps_httpx_for_a_given_transport(server: str) -> None:
    async def main() -> None:
        async with AsyncClient(server, transport=httpx.AsyncHTTPTransport()) as c:
            assert c.http_layer == "httpx" and (await c.discover()).supported_versions

    asyncio.run(main())


def test_a_header_that_is_not_http_is_never_sent(server: str) -> None:
    """A token read from a file with its newline: refused before any byte leaves (sent False), on both
    layers, instead of a traceback."""
    with Client(server, "abc\n") as c, pytest.raises(ConnectionFailed) as sync_failed:
        c.pull("sub-0123456789abcdef")
    assert sync_failed.value.sent is False

    async def main() -> None:
        async with AsyncClient(server, "abc\n") as c:
            with pytest.raises(ConnectionFailed) as async_failed:
                await c.pull("sub-0123456789abcdef")
            assert async_failed.value.sent is False
            assert (await c.discover()).supported_versions  # control: the client still works

    asyncio.run(main())
    with Client(server) as c:
        assert c.discover().supported_versions  # control


def test_connections_are_reused_above_descriptor_1023(forwarder: CountingForwarder) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the client's sockets go above 1023
    try:
        with Client(f"http://127.0.0.1:{forwarder.port}") as c:
            for _ in range(10):
                c.discover()
        assert forwarder.accepted == 1
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_a_request_body_is_what_the_json_module_writes(value: object) -> None:
    """The client writes a body with the C encoder made once (wire.compact_encoder), not through
    JSONEncoder.encode: the bytes must be json.dumps's for the same settings, surrogates and all; the engine's
    standard-library codec (the playground's) writes the same text."""
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        wanted = expected.encode()
    except UnicodeEncodeError:  # a lone surrogate: sent escaped
        wanted = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    assert clients._json_body(value) == wanted
    if wanted == expected.encode():
        assert wire.STDLIB_CODEC.encode(value) == wanted


def test_a_body_json_cannot_write_is_refused_as_json_refuses_it() -> None:
    assert clients._encode.__qualname__.startswith("compact_encoder")  # the fast path is the one under test
    circular: dict[str, object] = {}
    circular["self"] = circular
    for bad, error, words in [
        ({"x": math.nan}, ValueError, "Out of range float"),
        ({"x": object()}, TypeError, "not JSON serializable"),
        (circular, ValueError, "Circular reference"),
    ]:
        with pytest.raises(error, match=words):
            clients._json_body(bad)
    assert clients._json_body({"x": 1.5, "y": [None]}) == b'{"x":1.5,"y":[null]}'  # the control


def test_a_value_refused_part_way_leaves_no_trace_in_the_encoder() -> None:
    """The C encoder's circular-reference guard is a dict it keeps (one per thread): a value refused inside a
    container must not leave that container marked, or the next body holding it would read as circular.
    A circular value is refused at once, whatever the recursion limit (no recursion to the limit)."""
    encode = wire.compact_encoder()
    holder: list[object] = [{"a": [1]}, object()]
    with pytest.raises(TypeError):
        encode(holder)  # refused inside `holder`, which the encoder had marked as being written
    holder.pop()
    assert encode(holder) == '[{"a":[1]}]'
    circular: dict[str, object] = {"data": ["x" * 100] * 2000}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):
        encode(circular)


def test_kernel_timeouts_are_timevals_and_refuse_what_settimeout_refuses() -> None:
    assert keepalive._timeval(None) == struct.pack("ll", 0, 0)  # no timeout
    assert keepalive._timeval(0) == struct.pack("ll", 0, 1)  # zero would mean none: the shortest instead
    assert keepalive._timeval(1.5) == struct.pack("ll", 1, 500_000)
    with pytest.raises(ValueError):
        keepalive._timeval(-1)


def test_a_socket_that_stays_non_blocking_keeps_python_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """gevent's and eventlet's patched sockets stay non-blocking when told to block and wait in their hub,
    where a kernel timeout never applies: such a socket keeps Python's own timeout. The control is a plain
    socket, whose timeout the kernel keeps (on 64-bit Linux)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()
        with socket.create_connection(address, timeout=2) as plain:
            conn = keepalive._Conn(plain)
            assert conn.kernel_timeout is keepalive._KERNEL_TIMEOUTS
            if conn.kernel_timeout:
                assert plain.gettimeout() is None
                assert plain.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == keepalive._timeval(2)
        monkeypatch.setattr(keepalive.os, "get_blocking", lambda fd: False)
        with socket.create_connection(address, timeout=2) as hubbed:
            conn = keepalive._Conn(hubbed)
            assert conn.kernel_timeout is False and hubbed.gettimeout() == 2


def test_a_publish_without_a_type_sends_no_type_field() -> None:
    """A missing type is left out of the body, as every other unset field (the server refuses it in its
    words); the control sends it."""
    client = ClientBase()
    client.token = None
    assert Routes.publish(client, "m", None, subject="s").body == {"subject": "s"}  # type: ignore[arg-type]
    assert Routes.publish(client, "m", "com.example.a", subject="s").body == {
        "type": "com.example.a",
        "subject": "s",
    }


def test_a_remembered_request_head_follows_the_headers_it_was_made_from() -> None:
    """The request's head is encoded once per (method, target, host) and the shared headers dict it came
    from: another client's headers on the same path get their own head (the control: the first client's head
    is reused byte for byte)."""
    a = {"accept": "application/json", "authorization": "Bearer aaa"}
    b = {"accept": "application/json", "authorization": "Bearer bbb"}
    first = keepalive.request_bytes("GET", "/mp/v0/remembered", "h:1", a, None)
    assert keepalive.request_bytes("GET", "/mp/v0/remembered", "h:1", a, None) == first
    assert keepalive._REQUEST_HEADS[("GET", "/mp/v0/remembered", "h:1")][0] is a  # control: remembered
    other = keepalive.request_bytes("GET", "/mp/v0/remembered", "h:1", b, b"{}")
    assert (
        b"Bearer bbb" in other
        and b"Bearer aaa" not in other
        and other.endswith(b"content-length: 2\r\n\r\n{}")
    )
    assert b"Bearer aaa" in keepalive.request_bytes("GET", "/mp/v0/remembered", "h:1", a, None)
    with pytest.raises(keepalive.SendFailed):  # a bad target is refused every time, never remembered
        keepalive.request_bytes("GET", "/mp/v0/a b", "h:1", a, None)
    with pytest.raises(keepalive.SendFailed):
        keepalive.request_bytes("GET", "/mp/v0/a b", "h:1", a, None)


def test_two_clients_with_their_own_tokens_on_one_path_each_send_their_own(server: str) -> None:
    """End to end through the remembered heads: the owner publishes, a client with another token on the
    same path is refused, and the owner's next publish still goes through."""
    with Client(server) as admin:
        owner = admin.create_monitor("heads-two-tokens", types=[TYPE]).owner_token
    with Client(server, owner) as mine, Client(server, "not-the-owner") as theirs:
        first = mine.publish("heads-two-tokens", TYPE, subject="a").seq
        with pytest.raises(Exception) as refused:
            theirs.publish("heads-two-tokens", TYPE, subject="b")
        assert getattr(refused.value, "status", None) in (401, 403)
        assert mine.publish("heads-two-tokens", TYPE, subject="c").seq == first + 1


def test_a_remembered_reply_head_is_not_used_for_a_head_request() -> None:
    """A reply head is parsed once and shared, except for a HEAD request, whose framing differs for the
    same bytes (no body whatever content-length says)."""
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5"
    assert keepalive._head_of(raw, "GET").length == 5
    assert keepalive._head_of(raw, "GET") is keepalive._head_of(raw, "GET")  # control: shared
    assert keepalive._head_of(raw, "HEAD").length == 0
    assert keepalive._head_of(raw, "GET").length == 5


def test_the_async_client_under_trio_uses_httpx(server: str) -> None:
    """The keep-alive pool is asyncio's; under trio (no asyncio loop) the client takes httpx, and in trio's
    guest mode on an asyncio loop too (trio's tasks run in that loop's callbacks, outside any asyncio task,
    where an asyncio future cannot be awaited)."""
    trio = pytest.importorskip("trio")

    async def calls() -> int:
        async with AsyncClient(server) as c:
            assert keepalive.running_asyncio() is False
            return len((await c.discover()).supported_versions)

    assert trio.run(calls) >= 1

    async def host() -> int:
        assert keepalive.running_asyncio() is True  # control: a coroutine of an asyncio task
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        trio.lowlevel.start_guest_run(
            calls,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=lambda outcome: done.set_result(outcome.unwrap()),
            host_uses_signal_set_wakeup_fd=True,
        )
        return await asyncio.wait_for(done, 30)  # an asyncio future awaited from trio would hang, not fail

    assert asyncio.run(host()) >= 1


def test_what_cannot_succeed_again_is_not_retried(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by an embedder: `retries=3` with a token holding a line break, or on a closed client, backed off
    3-6 s before raising what the first attempt knew. Such a failure is `retryable=False` and raises at once;
    the control: nothing listening is retried (`retries` sleeps)."""
    slept: list[float] = []
    monkeypatch.setattr(clients.time, "sleep", slept.append)
    with Client(server, "abc\n") as bad, pytest.raises(ConnectionFailed) as not_http:
        bad.publish("m-retry", TYPE, retries=3)
    closed = Client(server)
    closed.close()
    with pytest.raises(ConnectionFailed) as after_close:
        closed.publish("m-retry", TYPE, retries=3)
    for failed in (not_http.value, after_close.value):
        assert failed.sent is False and failed.retryable is False
    assert slept == []

    async def closed_async() -> ConnectionFailed:
        client = AsyncClient(server)
        await client.aclose()

        async def no_sleep(delay: float) -> None:
            slept.append(delay)

        client._sleep = no_sleep  # type: ignore[method-assign]
        with pytest.raises(ConnectionFailed) as caught:
            await client.publish("m-retry", TYPE, retries=3)
        return caught.value

    assert asyncio.run(closed_async()).retryable is False and slept == []

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{nobody}") as away, pytest.raises(ConnectionFailed) as refused:
        away.publish("m-retry", TYPE, retries=2)
    assert refused.value.retryable is True and len(slept) == 2  # control
