"""docs/protocol.md section 10 against a real `mp serve`: the time limits (headers, body, keep-alive), slow-loris
connections, and requests the HTTP parser refuses (answered with the protocol's JSON error body).

Every connection here goes to the server under test on loopback. The limits are shortened with
`--header-timeout` / `--body-timeout` so the suite stays quick; the defaults (10 s, 30 s, keep-alive 65 s) are
checked on the command's own parser.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from monitor_protocol.cli import serve
from serverutil import running_server, server_log, start_server, stop_server

HEADER_LIMIT = 2.0
BODY_LIMIT = 4.0
SLACK = 3.0  # scheduling slack on a loaded machine; every bound below is "the limit, plus at most this"
LORIS = 300
LOW_NOFILE = 256  # the soft limit the server is started with: fewer descriptors than LORIS connections


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, object]]:
    tmp = tmp_path_factory.mktemp("limits")
    # Start the server with a soft open-file limit below the slow-loris count: it must raise its own.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, LOW_NOFILE) if soft != resource.RLIM_INFINITY else LOW_NOFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        started = start_server(
            tmp,
            "--header-timeout",
            str(HEADER_LIMIT),
            "--body-timeout",
            str(BODY_LIMIT),
            "--log-level",
            "info",
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield started
    finally:
        stop_server(started[1])


def address(base: str) -> tuple[str, int]:
    parts = urlsplit(base)
    return parts.hostname or "127.0.0.1", parts.port or 80


def host_header(base: str) -> str:
    return urlsplit(base).netloc


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"connection closed before a response: {data!r}"
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        got = sock.recv(65536)
        assert got, "connection closed mid-body"
        rest += got
    return status, headers, rest[:length]


def wait_closed(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``sock`` (EOF or reset); fails if it stays open past ``limit``."""
    start = time.monotonic()
    sock.settimeout(limit)
    try:
        while True:
            if not sock.recv(65536):
                break
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for more than {limit:.1f}s")
    return time.monotonic() - start


def connect(base: str) -> socket.socket:
    return socket.create_connection(address(base), timeout=30)


# -- time limits -------------------------------------------------------------------------------------------


def test_defaults_follow_the_protocol():
    import argparse

    parser = argparse.ArgumentParser()
    serve.add_arguments("serve", parser)
    args = parser.parse_args([])
    assert (args.header_timeout, args.body_timeout, args.keep_alive) == (10.0, 30.0, 65.0)
    assert args.allow_sink == []


@pytest.mark.parametrize(
    "partial",
    [b"GET /mp/v0/disc", b"GET /mp/v0/discover HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "],
    ids=["request-line", "headers"],
)
def test_partial_headers_are_closed_after_the_header_limit(server, partial):
    with connect(server[0]) as sock:
        started = time.monotonic()
        sock.sendall(partial)
        wait_closed(sock, HEADER_LIMIT + SLACK)
        assert time.monotonic() - started >= HEADER_LIMIT - 0.3  # not before the limit


def test_drip_fed_headers_are_closed_at_the_limit_not_reset_by_each_byte(server):
    request = (
        f"GET /mp/v0/discover HTTP/1.1\r\nHost: {host_header(server[0])}\r\nX-Drip: {'a' * 200}".encode()
    )
    with connect(server[0]) as sock:
        started = time.monotonic()
        closed = False
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - started > HEADER_LIMIT + SLACK:
                break
        if not closed:
            wait_closed(sock, 0.5)
        elapsed = time.monotonic() - started
        assert HEADER_LIMIT - 0.3 <= elapsed <= HEADER_LIMIT + SLACK


def test_headers_in_time_get_an_answer(server):
    with connect(server[0]) as sock:
        sock.sendall(b"GET /mp/v0/discover HTTP/1.1\r\n")
        time.sleep(HEADER_LIMIT / 2)  # slow, but inside the limit
        sock.sendall(f"Host: {host_header(server[0])}\r\n\r\n".encode())
        status, _headers, body = read_response(sock)
        assert status == 200 and "supportedVersions" in json.loads(body)


def test_a_slow_body_is_closed_after_the_body_limit(server):
    head = (
        f"POST /mp/v0/monitors HTTP/1.1\r\nHost: {host_header(server[0])}\r\n"
        "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    ).encode()
    with connect(server[0]) as sock:
        started = time.monotonic()
        sock.sendall(head + b'{"id": ')
        closed = False
        # Trickle a byte every 0.2 s: the connection is never idle, yet the body never completes.
        while time.monotonic() - started < BODY_LIMIT + SLACK:
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(65536) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
                break
        elapsed = time.monotonic() - started
        assert closed, "the server kept reading a body that never ends"
        # The headers came at once, so the header limit did not apply; the body limit did.
        assert BODY_LIMIT - 0.3 <= elapsed <= BODY_LIMIT + SLACK


def test_a_body_within_the_limit_is_handled(server):
    body = json.dumps({"id": "limits-ok", "types": ["com.example.ci.run"]}).encode()
    head = (
        f"POST /mp/v0/monitors HTTP/1.1\r\nHost: {host_header(server[0])}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(server[0]) as sock:
        sock.sendall(head + body[:10])
        time.sleep(HEADER_LIMIT + 0.5)  # past the header limit: it no longer applies once headers are in
        sock.sendall(body[10:])
        status, _headers, reply = read_response(sock)
        assert status == 201, reply


def test_an_idle_keep_alive_connection_outlives_uvicorns_old_default(server):
    """Idle longer than uvicorn's 5 s default (and than the header limit): the same connection still works."""
    request = f"GET /mp/v0/discover HTTP/1.1\r\nHost: {host_header(server[0])}\r\n\r\n".encode()
    with connect(server[0]) as sock:
        sock.sendall(request)
        assert read_response(sock)[0] == 200
        time.sleep(6.0)
        sock.sendall(request)
        status, headers, _body = read_response(sock)
        assert status == 200 and headers.get("connection", "") != "close"


def test_keep_alive_flag_is_honoured(tmp_path):
    with running_server(tmp_path, "--keep-alive", "1") as (base, proc):
        assert "keep_alive=1s" in server_log(proc)
        with connect(base) as sock:
            sock.sendall(f"GET /mp/v0/discover HTTP/1.1\r\nHost: {host_header(base)}\r\n\r\n".encode())
            assert read_response(sock)[0] == 200
            elapsed = wait_closed(sock, 1 + SLACK)
            assert elapsed >= 0.7


def test_slow_loris_connections_are_all_closed_and_the_server_keeps_answering(server):
    base = server[0]
    partial = f"GET /mp/v0/discover HTTP/1.1\r\nHost: {host_header(base)}\r\nX-Loris: ".encode()
    sockets: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    try:
        started = time.monotonic()
        for _ in range(LORIS):
            sock = socket.create_connection(address(base), timeout=10)
            sock.sendall(partial)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            sockets.append(sock)
        # During the attack: the server still answers.
        r = httpx.get(base + "/mp/v0/discover", timeout=10)
        assert r.status_code == 200
        open_count = sum(1 for s in sockets if _still_open(s))
        if time.monotonic() - started < HEADER_LIMIT - 0.5:
            assert open_count == LORIS  # control: they really were held open until the limit
        # After the limit: every one of them is closed by the server.
        closed: set[int] = set()
        deadline = started + HEADER_LIMIT + SLACK + 5
        while len(closed) < LORIS:
            left = deadline - time.monotonic()
            assert left > 0, f"{LORIS - len(closed)} slow connections still open"
            for key, _events in selector.select(timeout=left):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                except BlockingIOError:
                    continue
                if data == b"":
                    closed.add(sock.fileno())
                    selector.unregister(sock)
        assert time.monotonic() - started >= HEADER_LIMIT - 0.3
        r = httpx.get(base + "/mp/v0/discover", timeout=10)
        assert r.status_code == 200
    finally:
        selector.close()
        for sock in sockets:
            sock.close()


def _still_open(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_the_open_file_limit_is_raised_to_the_hard_limit(server):
    """The server was started with a soft limit of LOW_NOFILE; it runs with soft == hard."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    line = next(line for line in server_log(server[1]).splitlines() if line.startswith("limits:"))
    assert "header_timeout=2s" in line and "body_timeout=4s" in line and "keep_alive=65s" in line
    if hard != resource.RLIM_INFINITY:
        assert f"open_files={hard}" in line
    with open(f"/proc/{server[1].pid}/limits") as limits:
        row = next(r for r in limits if r.startswith("Max open files")).split()
    assert row[3] == row[4] and int(row[3]) > LOW_NOFILE  # soft raised to hard


def test_bad_limit_flags_are_refused(tmp_path):
    import subprocess

    from serverutil import mp_command, mp_env

    for flags in (
        ["--header-timeout", "0"],
        ["--body-timeout", "-1"],
        ["--header-timeout", "5", "--body-timeout", "2"],
    ):
        done = subprocess.run(
            mp_command("serve", "--db", str(tmp_path / "x.db"), "--port", "0", *flags),
            env=mp_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "timeout" in done.stderr, (flags, done.stderr)


# -- what the HTTP parser refuses, and methods the router does not serve -----------------------------------


def exchange(base: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(base) as sock:
        sock.sendall(raw)
        return read_response(sock)


@pytest.mark.parametrize("method", ["FOO", "BREW", "PROPFIND2", "GETT"])
def test_unknown_methods_get_the_protocols_error_body(server, method):
    status, headers, body = exchange(
        server[0], f"{method} /mp/v0/discover HTTP/1.1\r\nHost: {host_header(server[0])}\r\n\r\n".encode()
    )
    assert status == 400
    assert headers["content-type"] == "application/json"
    reply = json.loads(body)
    assert reply["code"] == "INVALID" and reply["done"] == []
    assert "method" in reply["error"] and "GET" in reply["error"] and "/mp/v0" in reply["error"]


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x01\x02 garbage\r\n\r\n",
        b"GET /mp/v0/discover HTTP/9.9\r\n\r\n",
        b"GET /mp/v0/discover HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"POST /mp/v0/monitors HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST /mp/v0/monitors HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["garbage", "version", "header-name", "two-lengths", "bad-chunk"],
)
def test_malformed_requests_get_the_protocols_error_body(server, raw):
    status, headers, body = exchange(server[0], raw)
    assert status == 400 and headers["content-type"] == "application/json"
    reply = json.loads(body)
    assert reply["code"] == "INVALID" and reply["done"] == [] and "/mp/v0" in reply["error"]


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_known_methods_the_router_does_not_serve_are_not_found(server, method):
    status, headers, body = exchange(
        server[0],
        f"{method} /mp/v0/discover HTTP/1.1\r\nHost: {host_header(server[0])}\r\nContent-Length: 0\r\n\r\n".encode(),
    )
    assert status == 404 and headers["content-type"] == "application/json"
    reply = json.loads(body)
    assert reply["code"] == "NOT_FOUND" and reply["done"] == [] and "/mp/v0" in reply["error"]
    # Positive control: the same path with GET is served.
    assert (
        exchange(
            server[0], f"GET /mp/v0/discover HTTP/1.1\r\nHost: {host_header(server[0])}\r\n\r\n".encode()
        )[0]
        == 200
    )
