"""`mp mcp` over stdio, driven by the official MCP SDK client (docs/protocol.md section 9).

The server runs as a real subprocess on a temporary SQLite database (embedded mode), and against a real
`mp serve` (`--base` / `MP_BASE`). The SDK client negotiates the 2026-07-28 era by default (resource updates
arrive on a `subscriptions/listen` stream); `mode="legacy"` exercises the handshake era (`resources/subscribe`).
The SDK client also checks every successful tool result against the tool's declared output schema.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from monitor_protocol import __version__
from monitor_protocol.core.vocab import EXTENSION_ID, PROTOCOL_VERSION
from serverutil import bearer, mp_command, mp_env, start_server, stop_server
from waiting import eventually_async

HANG_GUARD_SECONDS = 60  # only stops a broken server from hanging the suite; no assertion depends on it

SECTION_9_TOOLS = {
    "monitor_discover",
    "monitor_list",
    "monitor_get",
    "monitor_create",
    "monitor_configure",
    "monitor_publish",
    "monitor_state",
    "monitor_subscribe",
    "monitor_pull",
    "monitor_ack",
    "lease_claim",
    "lease_complete",
    "lease_release",
    "monitor_seek",
    "monitor_renew",
    "monitor_retire_subscription",
    "lease_renew",
    "lease_reject",
}


def server_params(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "monitor_protocol", "mcp", *args], env=env, cwd=cwd
    )


async def call(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content[0].text
    text = result.content[0].text  # what a model reads: the same value, compact (no indentation to pay for)
    assert json.loads(text) == result.structured_content and "\n" not in text
    return result.structured_content


async def refused(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert result.is_error
    body = result.structured_content
    assert result.content[0].text.startswith(f"{body['code']}: ")
    return body


async def exercise(client: Client) -> dict[str, Any]:
    """The whole reader/producer cycle through tools; returns the tokens and ids for further checks."""
    tools = (await client.list_tools()).tools
    names = {t.name for t in tools}
    assert names >= SECTION_9_TOOLS
    publish = next(t for t in tools if t.name == "monitor_publish")
    assert "on_behalf_of" in publish.input_schema["properties"]
    assert EXTENSION_ID in (client.instructions or "")
    # serverInfo.version is the package's; the protocol's version is said in the instructions and in the
    # extension's settings.
    assert client.server_info is not None and client.server_info.version == __version__
    assert f"Monitor Protocol v{PROTOCOL_VERSION}" in (client.instructions or "")
    caps = client.server_capabilities
    # 2026-07-28: SEP-2133 extensions; handshake era: experimental capabilities.
    assert (caps.extensions or caps.experimental or {})[EXTENSION_ID]["version"] == PROTOCOL_VERSION

    disc = await call(client, "monitor_discover", {})
    assert EXTENSION_ID in disc["capabilities"]["extensions"]

    created = await call(
        client,
        "monitor_create",
        {
            "id": "ci",
            "types": ["com.example.ci.run"],
            "capabilities": ["observe", "act"],
            "visibility": "public",
            "owner": "human:you",
        },
    )
    owner = created["owner_token"]
    assert created["monitor"]["id"] == "ci"
    listed = await call(client, "monitor_list", {})
    assert [m["id"] for m in listed["monitors"]] == ["ci"] and listed["next"] is None
    # a page at a time (EXT_MONITOR_PAGES): past the last id there is nothing, and a page has its bound
    assert (await call(client, "monitor_list", {"after": "ci"})) == {**listed, "monitors": []}
    assert (await refused(client, "monitor_list", {"limit": 0}))["code"] == "INVALID"

    sub = await call(
        client,
        "monitor_subscribe",
        {"monitor": "ci", "subscriber": "agent:triage", "capabilities": ["observe", "act"], "token": owner},
    )
    sub_id, reader = sub["subscription"]["id"], sub["token"]
    start = (await call(client, "monitor_pull", {"subscription": sub_id, "token": reader}))["next"]
    await call(client, "monitor_ack", {"subscription": sub_id, "token": reader, "cursor": start})

    one = await call(
        client,
        "monitor_publish",
        {
            "id": "ci",
            "type": "com.example.ci.run",
            "subject": "build-1",
            "data": {"status": "failed"},
            "token": owner,
        },
    )
    # Delegation (P1): an agent records a person's certainty on the owner's behalf.
    two = await call(
        client,
        "monitor_publish",
        {
            "id": "ci",
            "type": "com.example.ci.run",
            "subject": "build-2",
            "actor": "agent:claude",
            "on_behalf_of": "human:you",
            "origin": "human",
            "tier": "src",
            "token": owner,
        },
    )
    assert two["observation"]["data"]["provenance"]["on_behalf_of"] == "human:you"
    # ... and the same claim without on_behalf_of is refused with the code and the body.
    ceiling = await refused(
        client,
        "monitor_publish",
        {
            "id": "ci",
            "type": "com.example.ci.run",
            "actor": "agent:claude",
            "origin": "human",
            "token": owner,
        },
    )
    assert ceiling["code"] == "PROVENANCE_CEILING" and "rejected_seq" in ceiling

    pulled = await call(
        client,
        "monitor_pull",
        {"subscription": sub_id, "token": reader, "filter": {"types": ["com.example.ci.run"]}},
    )
    assert [o["subject"] for o in pulled["observations"]] == ["build-1", "build-2"]
    assert pulled["observations"][0]["id"] == str(one["seq"])
    again = await call(
        client,
        "monitor_pull",
        {"subscription": sub_id, "token": reader, "filter": {"types": ["com.example.ci.run"]}},
    )
    assert [o["id"] for o in again["observations"]] == [o["id"] for o in pulled["observations"]]
    assert again["redelivered"] == 2  # pull never commits
    acked = await call(
        client, "monitor_ack", {"subscription": sub_id, "token": reader, "cursor": pulled["next"]}
    )
    assert acked["cursor"] == pulled["next"]
    backwards = await refused(
        client, "monitor_ack", {"subscription": sub_id, "token": reader, "cursor": start}
    )
    assert backwards["code"] == "CURSOR_BACKWARDS"
    wrong = await refused(client, "monitor_pull", {"subscription": sub_id, "token": "nope"})
    assert wrong["code"] == "UNAUTHORIZED"

    claim = await call(client, "lease_claim", {"subscription": sub_id, "token": reader, "subject": "build-1"})
    assert claim["lease"]["holder"] == f"sub:{sub_id}"
    repeat = await call(
        client, "lease_claim", {"subscription": sub_id, "token": reader, "subject": "build-1"}
    )
    assert repeat["idempotent"] is True
    done = await call(
        client,
        "lease_complete",
        {"subscription": sub_id, "token": reader, "subject": "build-1", "outcome": "fixed"},
    )
    assert done["ok"] is True
    await call(client, "lease_claim", {"subscription": sub_id, "token": reader, "subject": "build-2"})
    released = await call(
        client, "lease_release", {"subscription": sub_id, "token": reader, "subject": "build-2"}
    )
    assert released["ok"] is True
    await call(client, "lease_claim", {"subscription": sub_id, "token": reader, "subject": "build-2"})
    await call(client, "lease_renew", {"subscription": sub_id, "token": reader, "subject": "build-2"})
    rejected = await call(
        client,
        "lease_reject",
        {"subscription": sub_id, "token": reader, "subject": "build-2", "reason": "no"},
    )
    assert rejected["ok"] is True and rejected["dead_letter"] is False

    sought = await call(
        client, "monitor_seek", {"subscription": sub_id, "token": reader, "cursor": start, "reason": "again"}
    )
    assert sought["cursor"] == start
    renewed = await call(client, "monitor_renew", {"subscription": sub_id, "token": reader})
    stale = await refused(client, "monitor_pull", {"subscription": sub_id, "token": reader})
    assert stale["code"] == "UNAUTHORIZED"
    reader = renewed["token"]
    retired = await call(client, "monitor_retire_subscription", {"subscription": sub_id, "token": reader})
    assert retired["ok"] is True and retired["cursor_kept"] == start

    paused = await call(
        client, "monitor_configure", {"id": "ci", "action": "pause", "reason": "maintenance", "token": owner}
    )
    assert paused["monitor"]["active"] is False
    unavailable = await refused(
        client, "monitor_publish", {"id": "ci", "type": "com.example.ci.run", "token": owner}
    )
    assert unavailable["code"] == "UNAVAILABLE"
    await call(
        client, "monitor_configure", {"id": "ci", "action": "resume", "reason": "back", "token": owner}
    )

    templates = (await client.list_resource_templates()).resource_templates
    assert {t.uri_template for t in templates} == {
        "monitor://{id}/definition",
        "monitor://{id}/state",
        "monitor://{id}/source",
    }
    definition = json.loads((await client.read_resource("monitor://ci/definition")).contents[0].text)
    assert definition["id"] == "ci" and definition["version"] >= 1
    state = json.loads((await client.read_resource("monitor://ci/state")).contents[0].text)
    assert state["monitor"] == "ci" and state["head"] == definition["head"]
    # the source's status, read-only: what the state says of it (a `log` source: nothing runs)
    source = json.loads((await client.read_resource("monitor://ci/source")).contents[0].text)
    assert (
        source == {"monitor": "ci", **state["source"]}
        and source["kind"] == "log"
        and source["status"] is None
    )
    return {"owner": owner, "sub": sub_id, "reader": reader, "head": state["head"]}


async def test_mcp_tools_resources_and_listen_updates(tmp_path: Path) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(server_params("--db", str(tmp_path / "mcp.db"))) as client:
            ctx = await exercise(client)
            async with client.listen(resource_subscriptions=["monitor://ci/state"]) as stream:
                await call(
                    client,
                    "monitor_publish",
                    {"id": "ci", "type": "com.example.ci.run", "subject": "build-3", "token": ctx["owner"]},
                )
                async for event in stream:
                    assert event.uri == "monitor://ci/state"
                    break
            state = json.loads((await client.read_resource("monitor://ci/state")).contents[0].text)
            assert state["head"] == ctx["head"] + 1


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_mcp_legacy_resources_subscribe_gets_updated_notification(tmp_path: Path) -> None:
    updated: list[str] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(str(message.params.uri))
            arrived.set()

    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(
            server_params("--db", str(tmp_path / "mcp.db")), mode="legacy", message_handler=on_message
        ) as client:
            ctx = await exercise(client)
            await client.session.subscribe_resource("monitor://ci/state")
            await call(
                client,
                "monitor_publish",
                {"id": "ci", "type": "com.example.ci.run", "subject": "build-3", "token": ctx["owner"]},
            )
            await arrived.wait()
            assert updated[0] == "monitor://ci/state"


async def test_mcp_pull_wait_returns_on_append(tmp_path: Path) -> None:
    """A pull asked to wait is held until an append wakes it (embedded mode)."""
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(server_params("--db", str(tmp_path / "mcp.db"))) as client:
            created = await call(client, "monitor_create", {"id": "q1", "types": ["com.example.q"]})
            owner = created["owner_token"]
            sub = await call(
                client,
                "monitor_subscribe",
                {"monitor": "q1", "subscriber": "agent:w", "from": "head", "token": owner},
            )
            results: list[dict[str, Any]] = []

            async def waiter() -> None:
                results.append(
                    await call(
                        client,
                        "monitor_pull",
                        {
                            "subscription": sub["subscription"]["id"],
                            "token": sub["token"],
                            "wait": 40,
                            "filter": {"types": ["com.example.q"]},
                        },
                    )
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                # Lets the pull start waiting (nothing in embedded mode shows it); no assertion depends on it.
                await anyio.sleep(0.3)
                assert results == []  # held: it does not answer before the append
                await call(
                    client,
                    "monitor_publish",
                    {"id": "q1", "type": "com.example.q", "subject": "x", "token": owner},
                )
            assert [o["subject"] for o in results[0]["observations"]] == ["x"]


async def rest(base: str, method: str, path: str, token: str | None = None, body: Any = None) -> Any:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.request(
            method, f"{base}/mp/v0{path}", json=body, headers=bearer(token) if token else {}
        )
    assert reply.status_code < 400, reply.text
    return reply.json()


async def active_subscriptions(base: str, monitor: str, token: str | None = None) -> int:
    return (await rest(base, "GET", f"/monitors/{monitor}/state", token))["counters"]["subscriptions_active"]


def none_active(base: str, monitor: str, token: str | None = None) -> Callable[[], Awaitable[bool]]:
    """A check for `eventually_async`: the monitor has no active subscription (a retire is asynchronous)."""

    async def check() -> bool:
        return await active_subscriptions(base, monitor, token) == 0

    return check


async def test_mcp_against_a_server(tmp_path: Path) -> None:
    """--base: a resource subscription is served by a watch subscription held in a long poll against the
    server (not by polling its state): it exists while the stream is open and is retired after."""
    base, proc = start_server(tmp_path)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(server_params("--base", base)) as client:
                ctx = await exercise(client)
                assert await active_subscriptions(base, "ci") == 0
                async with client.listen(resource_subscriptions=["monitor://ci/state"]) as stream:
                    assert await active_subscriptions(base, "ci") == 1  # the watch, opened before the ack
                    published = await call(
                        client,
                        "monitor_publish",
                        {
                            "id": "ci",
                            "type": "com.example.ci.run",
                            "subject": "build-3",
                            "token": ctx["owner"],
                        },
                    )
                    async for event in stream:
                        assert event.uri == "monitor://ci/state"
                        break
                    state = json.loads((await client.read_resource("monitor://ci/state")).contents[0].text)
                    assert state["head"] >= published["seq"]
                await eventually_async(
                    none_active(base, "ci"), interval=0.05, what="the watch retired after the stream closed"
                )
    finally:
        stop_server(proc)


def test_mcp_embedded_refuses_a_database_held_by_a_server(tmp_path: Path) -> None:
    import subprocess

    from serverutil import mp_command, mp_env

    _base, proc = start_server(tmp_path)
    try:
        ran = subprocess.run(
            mp_command("mcp", "--db", str(tmp_path / "mp.db")),
            input="",
            capture_output=True,
            text=True,
            env=mp_env(),
            timeout=60,
        )
    finally:
        stop_server(proc)
    assert ran.returncode == 1
    assert ran.stderr.startswith("mp mcp: ") and "--base URL" in ran.stderr
    # which program holds it, and the one way on for that program (found by an agent builder: the sentence
    # hedged between mp serve and mp mcp, and named a Python API)
    assert f"by mp serve (pid {proc.pid})" in ran.stderr and "Go through that server" in ran.stderr
    assert "SQLiteStore" not in ran.stderr and ran.stderr.count("\n") == 1


def test_mcp_embedded_refuses_a_database_held_by_another_session(tmp_path: Path) -> None:
    import subprocess

    from serverutil import mp_command, mp_env

    db = str(tmp_path / "mp.db")
    first = subprocess.Popen(
        mp_command("mcp", "--db", db), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=mp_env()
    )
    try:
        deadline = time.monotonic() + 30  # the first session opens the file at start
        while not os.path.exists(db + ".writer") and time.monotonic() < deadline:
            time.sleep(0.05)
        ran = subprocess.run(
            mp_command("mcp", "--db", db), input="", capture_output=True, text=True, env=mp_env(), timeout=60
        )
    finally:
        first.kill()
        first.wait()
    assert ran.returncode == 1
    assert f"by mp mcp (pid {first.pid})" in ran.stderr, ran.stderr
    assert "go through one `mp serve --db PATH`, each with --base URL" in ran.stderr


class Updates:
    """A message handler that records `notifications/resources/updated` with their arrival times."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []
        self.arrived = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.seen.append((anyio.current_time(), str(message.params.uri)))
            self.arrived.set()

    async def after(self, moment: float) -> None:
        """Wait until a notification has arrived at or after `moment`."""
        while not any(t >= moment for t, _ in self.seen):
            self.arrived = anyio.Event()
            await self.arrived.wait()


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_mcp_against_a_server_legacy_subscribe_is_woken_by_the_long_poll(tmp_path: Path) -> None:
    """MP_BASE picks the server (no --base), MP_TOKEN serves a private monitor's resources, the watch's own
    rows wake nobody, a publish wakes the subscriber, and unsubscribing retires the watch."""
    base, proc = start_server(tmp_path)
    try:
        created = await rest(base, "POST", "/monitors", body={"id": "priv", "types": ["com.example.x"]})
        owner = created["owner_token"]
        updates = Updates()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(
                server_params(env={"MP_BASE": base, "MP_TOKEN": owner}),
                mode="legacy",
                message_handler=updates,
            ) as client:
                assert base in (client.instructions or "")
                state = json.loads((await client.read_resource("monitor://priv/state")).contents[0].text)
                await client.session.subscribe_resource("monitor://priv/state")
                assert await active_subscriptions(base, "priv", owner) == 1
                await anyio.sleep(0.6)  # the point: for this long, nothing may be notified
                assert updates.seen == []  # the watch's own subscribed row is not news
                before = anyio.current_time()
                await rest(base, "POST", "/monitors/priv/observations", owner, {"type": "com.example.x"})
                await updates.after(before)
                assert updates.seen[-1][1] == "monitor://priv/state"
                now = json.loads((await client.read_resource("monitor://priv/state")).contents[0].text)
                assert now["head"] > state["head"]
                await client.session.unsubscribe_resource("monitor://priv/state")
                await eventually_async(
                    none_active(base, "priv", owner), interval=0.05, what="the watch retired on unsubscribe"
                )
    finally:
        stop_server(proc)


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
@pytest.mark.parametrize("door", ["embedded", "base"])
async def test_mcp_resource_subscription_that_cannot_be_served_is_refused(tmp_path: Path, door: str) -> None:
    """No such monitor, or a private one the environment's token cannot see: the subscribe request (either
    era) fails instead of succeeding silently and never notifying."""
    proc = None
    if door == "base":
        base, proc = start_server(tmp_path)
        await rest(base, "POST", "/monitors", body={"id": "priv", "types": ["com.example.x"]})
        args: tuple[str, ...] = ("--base", base)
    else:
        args = ("--db", str(tmp_path / "mcp.db"))
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(server_params(*args)) as client:
                if door == "embedded":
                    await call(client, "monitor_create", {"id": "priv", "types": ["com.example.x"]})
                for uri in ("monitor://priv/state", "monitor://nope/state", "monitor://nope/definition"):
                    with pytest.raises(MCPError) as err:
                        async with client.listen(resource_subscriptions=[uri]):
                            pass
                    assert "NOT_FOUND" in str(err.value)
                with pytest.raises(MCPError):
                    async with client.listen(resource_subscriptions=["https://example.com/x"]):
                        pass
            async with Client(server_params(*args), mode="legacy") as client:
                for uri in ("monitor://priv/state", "monitor://nope/state"):
                    with pytest.raises(MCPError) as err:
                        await client.session.subscribe_resource(uri)
                    assert "NOT_FOUND" in str(err.value)
    finally:
        if proc is not None:
            stop_server(proc)


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_mcp_resource_updates_are_coalesced(tmp_path: Path) -> None:
    """20 quick publishes: at most one notification per resource per 250 ms, and the last change is
    notified after it happened."""
    updates = Updates()
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(
            server_params("--db", str(tmp_path / "mcp.db")), mode="legacy", message_handler=updates
        ) as client:
            owner = (
                await call(
                    client, "monitor_create", {"id": "qq", "types": ["com.example.q"], "visibility": "public"}
                )
            )["owner_token"]
            started = anyio.current_time()  # no notification of the resource can be sent before it
            await client.session.subscribe_resource("monitor://qq/state")
            for i in range(20):
                last = anyio.current_time()
                await call(
                    client,
                    "monitor_publish",
                    {"id": "qq", "type": "com.example.q", "subject": f"s{i}", "token": owner},
                )
            elapsed = anyio.current_time() - started
            await updates.after(last)  # the trailing notification, however the publishes fell
            await anyio.sleep(0.6)  # the point: whatever else arrives now counts against the bounds below
    times = [t for t, uri in updates.seen if uri == "monitor://qq/state"]
    assert len(times) >= 1
    # At most one per 250 ms, as bounds a busy machine cannot break: the server sends the k-th notification
    # no earlier than k windows after the first could go (`started`), and it cannot arrive before it is sent.
    # (The gaps between arrivals are no measure: a reader held up a moment reads two sends back to back.)
    assert all(t - started >= k * 0.25 - 0.01 for k, t in enumerate(times)), [t - started for t in times]
    # So no more than the windows the publishes spanned, plus the trailing one: fewer than the 20 publishes
    # whenever they came faster than one per window.
    assert len(times) <= int((elapsed + 0.5) / 0.25) + 1


async def test_coalescer_sends_once_per_window_and_always_the_last_change() -> None:
    from monitor_protocol.doors.mcp.server import Coalescer

    loop = asyncio.get_running_loop()
    sent: list[tuple[float, str]] = []

    def send(key: str) -> Awaitable[None]:
        # Called when the coalescer fires, so the time is the send's own, never a busy loop's later turn.
        sent.append((loop.time(), key))
        return asyncio.sleep(0)

    coalescer = Coalescer(send, interval=0.25)
    coalescer.changed("b")
    assert [k for _, k in sent] == ["b"]  # a quiet key is sent at once (inside changed: no window waited)
    changes = []
    for _ in range(3):  # three changes in one loop turn: the first sent at once, the others folded
        coalescer.changed("a")
        changes.append(loop.time())
    assert [k for _, k in sent] == ["b", "a"]
    for _ in range(17):
        await asyncio.sleep(0.02)  # the point: changes keep coming, faster than the window
        coalescer.changed("a")
        changes.append(loop.time())
    # The last change is always followed by a send.
    await eventually_async(
        lambda: any(t >= changes[-1] for t, k in sent if k == "a"), what="a send after the last change"
    )
    a = [t for t, k in sent if k == "a"]
    assert [k for _, k in sent].count("b") == 1
    assert all(y - x >= 0.249 for x, y in zip(a, a[1:], strict=False))  # never two sends in one window
    assert len(a) <= int((changes[-1] - changes[0]) / 0.25) + 2
    assert len(a) < len(changes)  # folded
    assert a[-1] >= changes[-1]
    coalescer.close()


async def test_mcp_tools_declare_output_schemas_annotations_and_bounds(tmp_path: Path) -> None:
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(server_params("--db", str(tmp_path / "mcp.db"))) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            for tool in tools.values():
                assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
                hints = tool.annotations
                assert None not in (
                    hints.read_only_hint,
                    hints.destructive_hint,
                    hints.idempotent_hint,
                    hints.open_world_hint,
                ), tool.name
                for path, node in integer_nodes(tool.input_schema):
                    assert "minimum" in node and "maximum" in node, f"{tool.name}.{path} is unbounded"
            read_only = {n for n, t in tools.items() if t.annotations.read_only_hint}
            assert read_only == {
                "monitor_discover",
                "monitor_list",
                "monitor_get",
                "monitor_state",
                "monitor_pull",
            }
            destructive = {n for n, t in tools.items() if t.annotations.destructive_hint}
            assert destructive == {"monitor_configure", "monitor_renew", "monitor_retire_subscription"}
            assert tools["monitor_ack"].annotations.idempotent_hint is True
            assert tools["lease_claim"].annotations.idempotent_hint is True
            assert tools["monitor_publish"].annotations.idempotent_hint is False
            assert "idempotency_key" in tools["monitor_publish"].input_schema["properties"]
            assert tools["monitor_subscribe"].annotations.open_world_hint is True  # a push sink
            pull = tools["monitor_pull"].input_schema["properties"]
            assert (pull["limit"]["minimum"], pull["limit"]["maximum"]) == (1, 200)
            assert (pull["wait"]["minimum"], pull["wait"]["maximum"]) == (0, 50)
            assert (pull["cursor"]["minimum"], pull["cursor"]["maximum"]) == (0, 2**53)
            lease = tools["lease_claim"].input_schema["properties"]["lease_duration_seconds"]
            assert (lease["minimum"], lease["maximum"]) == (1, 86400)

            owner = (
                await call(
                    client,
                    "monitor_create",
                    {"id": "b1", "types": ["com.example.b"], "capabilities": ["observe", "act"]},
                )
            )["owner_token"]
            sub = await call(
                client,
                "monitor_subscribe",
                {
                    "monitor": "b1",
                    "subscriber": "agent:b",
                    "capabilities": ["observe", "act"],
                    "token": owner,
                },
            )
            reader = {"subscription": sub["subscription"]["id"], "token": sub["token"]}
            refusals = [
                ("monitor_pull", {"limit": 0}, "limit"),
                ("monitor_pull", {"limit": 201}, "limit"),
                ("monitor_pull", {"limit": "ten"}, "limit"),
                ("monitor_pull", {"wait": 51}, "wait"),
                ("monitor_pull", {"wait": -1}, "wait"),
                ("monitor_pull", {"cursor": -1}, "cursor"),
                ("monitor_pull", {"cursor": 2**53 + 1}, "cursor"),
                ("monitor_ack", {"cursor": 10**30}, "cursor"),
                ("monitor_seek", {"cursor": -5, "reason": "x"}, "cursor"),
                ("lease_claim", {"subject": "s", "lease_duration_seconds": 0}, "lease_duration_seconds"),
                ("lease_claim", {"subject": "s", "lease_duration_seconds": 86401}, "lease_duration_seconds"),
                ("lease_renew", {"subject": "s", "lease_duration_seconds": 10**20}, "lease_duration_seconds"),
            ]
            for name, extra, field in refusals:
                body = await refused(client, name, {**reader, **extra})
                assert body["code"] == "INVALID" and body["field"] == field, (name, extra, body)
            for name, args, field in [
                ("monitor_create", {"id": "b2", "ttl_seconds": 0}, "ttl_seconds"),
                ("monitor_subscribe", {"monitor": "b1", "subscriber": "agent:c", "from": -1}, "from"),
                (
                    "monitor_subscribe",
                    {"monitor": "b1", "subscriber": "agent:c", "retire_after_mute_seconds": 2**54},
                    "retire_after_mute_seconds",
                ),
                (
                    "monitor_publish",
                    {"id": "b1", "type": "com.example.b", "supersedes": -1, "token": owner},
                    "supersedes",
                ),
                (
                    "monitor_publish",
                    {"id": "b1", "type": "com.example.b", "idempotency_key": "", "token": owner},
                    "idempotency_key",
                ),
            ]:
                body = await refused(client, name, args)
                assert body["code"] == "INVALID" and body["field"] == field, (name, args, body)
            missing = await refused(client, "monitor_ack", {"subscription": reader["subscription"]})
            assert missing["code"] == "INVALID" and missing["field"] == "cursor"
            # ... and the server is still there, bounds inclusive.
            ok = await call(client, "monitor_pull", {**reader, "limit": 200, "wait": 0, "cursor": 0})
            assert ok["monitor"] == "b1"

            # Publish is idempotent only with an idempotency_key: the retry returns the first reply.
            args = {
                "id": "b1",
                "type": "com.example.b",
                "subject": "once",
                "token": owner,
                "idempotency_key": "k-1",
            }
            first = await call(client, "monitor_publish", args)
            again = await call(client, "monitor_publish", args)
            assert again["seq"] == first["seq"] and again["idempotent"] is True
            plain = {k: v for k, v in args.items() if k != "idempotency_key"}
            assert (await call(client, "monitor_publish", plain))["seq"] > first["seq"]


def integer_nodes(schema: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every sub-schema that admits an integer or a number, with where it is."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        kind = schema.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if "integer" in kinds or "number" in kinds:
            found.append((path, schema))
        for key, value in schema.items():
            sub = f"{path}.{key}" if key not in ("properties", "anyOf", "items") else path
            if key == "properties":
                for name, prop in value.items():
                    found += integer_nodes(prop, f"{path}.{name}".lstrip("."))
            elif isinstance(value, (dict, list)):
                found += integer_nodes(value, sub)
    elif isinstance(schema, list):
        for item in schema:
            found += integer_nodes(item, path)
    return found


# ---------------------------------------------------------------------------------------------- paths, env


def mcp_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mp mcp ...` with nothing on stdin: for the failures that happen before the MCP session starts."""
    return subprocess.run(
        mp_command("mcp", *args),
        input="",
        capture_output=True,
        text=True,
        env={**mp_env(), **(env or {})},
        timeout=60,
    )


def test_mcp_db_that_cannot_be_used_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "x.db"
    ran = mcp_run("--db", str(missing))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert (
        ran.stderr.startswith("mp mcp: ") and f"the directory {missing.parent} does not exist" in ran.stderr
    )
    ran = mcp_run("--db", "$MP_TEST_SURELY_UNSET/x.db")
    assert (
        ran.returncode == 2
        and "MP_TEST_SURELY_UNSET is not set" in ran.stderr
        and "Traceback" not in ran.stderr
    )
    ran = mcp_run("--db", str(tmp_path))
    assert ran.returncode == 2 and "is a directory" in ran.stderr
    (tmp_path / "junk.db").write_bytes(b"this is not a database, not at all" * 100)
    ran = mcp_run("--db", str(tmp_path / "junk.db"))
    assert ran.returncode == 1 and ran.stderr.startswith("mp mcp: ") and "Traceback" not in ran.stderr


async def test_mcp_db_expands_home_and_variables(tmp_path: Path) -> None:
    """MCP clients start the server without a shell: `~` and `$VAR` in --db are expanded by mp mcp."""
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    env = {"HOME": str(home), "MP_TEST_DATA": str(data)}
    for spelled, where in (("~/a.db", home / "a.db"), ("${MP_TEST_DATA}/b.db", data / "b.db")):
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(server_params("--db", spelled, env=env, cwd=tmp_path)) as client:
                assert str(where) in (client.instructions or "")
                await call(client, "monitor_create", {"id": "here"})
        assert where.is_file(), spelled
    assert not any(p.name.endswith(".db") for p in tmp_path.iterdir())


async def test_mcp_default_db_lives_in_the_user_data_directory(tmp_path: Path) -> None:
    """Without --db: $XDG_DATA_HOME/monitor-protocol/monitor-protocol.db, else ~/.local/share/..., created
    if missing and named in the instructions; never the client's working directory."""
    home, xdg, cwd = tmp_path / "home", tmp_path / "xdg", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    cases = [
        ({"HOME": str(home), "XDG_DATA_HOME": str(xdg)}, xdg / "monitor-protocol" / "monitor-protocol.db"),
        ({"HOME": str(home)}, home / ".local" / "share" / "monitor-protocol" / "monitor-protocol.db"),
    ]
    for env, where in cases:
        assert not where.parent.exists()
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(server_params(env=env, cwd=cwd)) as client:
                assert str(where) in (client.instructions or "")
                listed = await call(client, "monitor_list", {})
                assert listed["monitors"] == []  # a fresh database, not the other case's
                await call(client, "monitor_create", {"id": "mine", "visibility": "public"})
        assert where.is_file()
    assert list(cwd.iterdir()) == []


async def test_mcp_environment_chooses_the_door(tmp_path: Path) -> None:
    """MP_BASE (and the deprecated MP_MCP_BASE) select the server; an explicit --db still wins."""
    base, proc = start_server(tmp_path)
    try:
        await rest(base, "POST", "/monitors", body={"id": "remote", "visibility": "public"})
        for env in ({"MP_BASE": base}, {"MP_MCP_BASE": base}):
            with anyio.fail_after(HANG_GUARD_SECONDS):
                async with Client(server_params(env=env, cwd=tmp_path)) as client:
                    listed = await call(client, "monitor_list", {})
                    assert [m["id"] for m in listed["monitors"]] == ["remote"], env
        local = tmp_path / "local.db"
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(server_params("--db", str(local), env={"MP_BASE": base})) as client:
                assert (await call(client, "monitor_list", {}))["monitors"] == []
        assert local.is_file()
    finally:
        stop_server(proc)


async def test_mcp_reads_a_monitors_source_status_read_only(tmp_path: Path) -> None:
    """monitor://{id}/source over `mp mcp --base` against `mp serve --sources`: a shell source the operator did
    not allow is refused, and the resource says so and why; a resource is read, never written."""
    base, proc = start_server(tmp_path, "--sources")
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            api = base + "/mp/v0"
            body = {
                "id": "ci",
                "types": ["com.example.ci.run"],
                "cadence": {"heartbeat_seconds": 60},
                "source": {"kind": "shell", "ref": "gh run list"},
            }
            owner = httpx.post(api + "/monitors", json=body).json()["owner_token"]
            async with Client(server_params("--base", base, env={**mp_env(), "MP_TOKEN": owner})) as client:

                async def refused_now() -> dict[str, Any] | None:
                    text = (await client.read_resource("monitor://ci/source")).contents[0].text
                    source = json.loads(text)
                    return source if source["status"] == "refused" else None

                source = await eventually_async(refused_now, what="the refusal in the source status")
                assert source["monitor"] == "ci" and source["kind"] == "shell"
                # registration is open, so the monitor is unattested: no shell source runs for it
                assert "registration token" in source["reason"] and "mp probe" in source["reason"]
                # positive control: the same resource of a log monitor says nothing runs
                httpx.post(api + "/monitors", json={"id": "plain", "visibility": "public"})
                plain = json.loads((await client.read_resource("monitor://plain/source")).contents[0].text)
                assert plain["kind"] == "log" and plain["status"] is None
                listed = {str(r.uri) for r in (await client.list_resources()).resources}
                assert {"monitor://ci/source", "monitor://plain/source"} <= listed
    finally:
        stop_server(proc)


async def test_mcp_refuses_unknown_and_oversized_arguments_as_the_server_does(tmp_path: Path) -> None:
    """A misspelt argument is refused, naming it (a pull's `wiat` answered at once: a busy loop for the
    agent), and arguments larger than `mp serve` takes as a body are 413 TOO_LARGE (an embedded server
    stored 2 MB); every tool's schema says it takes nothing else."""
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(server_params("--db", str(tmp_path / "mcp.db"))) as client:
            tools = (await client.list_tools()).tools
            assert all(t.input_schema.get("additionalProperties") is False for t in tools)
            created = await call(client, "monitor_create", {"id": "u1", "types": ["com.example.u"]})
            owner = created["owner_token"]
            sub = await call(
                client, "monitor_subscribe", {"monitor": "u1", "subscriber": "agent:u", "token": owner}
            )
            reader = {"subscription": sub["subscription"]["id"], "token": sub["token"]}
            body = await refused(client, "monitor_pull", {**reader, "wiat": 5})
            assert body["code"] == "INVALID" and body["invalid"] == ["wiat"] and "'wait'" in body["error"]
            body = await refused(client, "monitor_discover", {"bogus_arg": 1})
            assert body["code"] == "INVALID" and body["invalid"] == ["bogus_arg"]
            big = {"id": "u1", "type": "com.example.u", "data": {"x": "a" * (1 << 20)}, "token": owner}
            body = await refused(client, "monitor_publish", big)
            assert body["code"] == "TOO_LARGE" and body["limit"] == 1 << 20
            # controls: a publish under the cap is stored, the right name pulls, and nothing large was kept
            await call(client, "monitor_publish", {**big, "data": {"x": "a" * 1000}})
            pulled = await call(client, "monitor_pull", {**reader, "wait": 0})
            assert any((o.get("data") or {}).get("x") == "a" * 1000 for o in pulled["observations"])
            assert max(len(json.dumps(o)) for o in pulled["observations"]) < 4000


def test_mcp_stdio_answers_lines_the_sdk_cannot_read(tmp_path: Path) -> None:
    """The SDK's stdio reader dropped a line it could not parse without a reply, so the client hung until its
    own timeout: a request holding a lone surrogate (JSON can spell one) is now answered -32602 naming the
    rule, a line that is not JSON -32700, a request the SDK cannot read -32600; a notification gets nothing
    (JSON-RPC), and the server goes on answering the next request."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor_protocol", "mcp", "--db", str(tmp_path / "lines.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(line: str) -> None:
        proc.stdin.write((line + "\n").encode())
        proc.stdin.flush()

    def reply() -> dict[str, Any]:
        ready, _, _ = select.select([proc.stdout], [], [], HANG_GUARD_SECONDS)
        assert ready, "no reply: the line was dropped"
        return json.loads(proc.stdout.readline())

    hello = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    }
    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))
        assert reply()["id"] == 1
        send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        call = '{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"monitor_discover","arguments":%s}}'
        send(call % (2, '{"x":"\\ud800"}'))
        got = reply()
        assert (
            got["id"] == 2 and got["error"]["code"] == -32602 and "lone surrogate" in got["error"]["message"]
        )
        send('{"jsonrpc":"2.0","method":"notifications/progress","params":{"x":"\\udc00"}}')  # no reply
        send("this is not json")
        got = reply()
        assert got["id"] is None and got["error"]["code"] == -32700
        send('{"jsonrpc":"2.0","id":3,"method":7}')
        got = reply()
        assert got["id"] == 3 and got["error"]["code"] == -32600
        # Found by a tester: a line nested 2,000 deep killed the server (RecursionError), a 5,000-digit number
        # got Python's own hint, and JSON that is not a request object, or a batch, was dropped unanswered.
        send("[" * 2000 + "]" * 2000)
        got = reply()
        assert (
            got["id"] is None
            and got["error"]["code"] == -32700
            and "deeper than 32" in got["error"]["message"]
        )
        send('{"jsonrpc":"2.0","id":5,"method":"ping","params":{"n":%s}}' % ("9" * 5000))
        got = reply()
        assert got["error"]["code"] == -32700 and "4,300 digits" in got["error"]["message"]
        for line in ("[]", '"x"', "5", "null", '{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}'):
            send(line)
            got = reply()
            assert got["id"] is None and got["error"]["code"] == -32600, line
        send('[{"jsonrpc":"2.0","id":10,"method":"ping"},{"jsonrpc":"2.0","id":"eleven","method":"ping"}]')
        assert [(g["id"], g["error"]["code"]) for g in (reply(), reply())] == [
            (10, -32600),
            ("eleven", -32600),
        ]
        send(call % (4, "{}"))  # control: a readable request is served, and the replies kept their order
        got = reply()
        assert got["id"] == 4 and got["result"]["structuredContent"]["protocol"] == "monitor-protocol"
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
        proc.stderr.close()


async def test_a_server_that_does_not_answer_says_whether_the_call_was_sent() -> None:
    """--base at a port nobody listens on: the tool error names the server and says the request was never
    sent, so a model knows a retry is safe (the CLI says `sent` too)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(server_params("--base", f"http://127.0.0.1:{port}")) as client:
            body = await refused(
                client, "monitor_publish", {"id": "ci", "type": "com.example.x", "token": "t"}
            )
    assert body["code"] == "CONNECTION_FAILED" and body["sent"] is False, body
    assert f"127.0.0.1:{port}" in body["error"] and "sending it again is safe" in body["error"]


async def test_resources_list_with_the_server_down_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    """Found by a tester: with --base at a server that is down, resources/list answered [] (read as "no
    monitors") while the tools said CONNECTION_FAILED. The control, a server up and its monitors listed, is
    test_mcp_lists_resources_a_page_at_a_time (tests/test_monitor_pages.py)."""
    import socket

    from mcp.shared.exceptions import MCPError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with anyio.fail_after(HANG_GUARD_SECONDS):
        async with Client(server_params("--base", f"http://127.0.0.1:{port}")) as client:
            with pytest.raises(MCPError, match="CONNECTION_FAILED"):
                await client.list_resources()


async def test_mcp_forgets_a_resource_address_once_its_last_subscriber_leaves(tmp_path: Path) -> None:
    """One entry per resource address ever subscribed stayed, empty, for the process's life (a soak of `mp
    mcp` saw it grow by ~250 bytes per address). An address goes with its last subscriber; one with a
    subscriber left stays (control), and so does what the watch of its monitor needs."""
    from types import SimpleNamespace

    from monitor_protocol.doors.mcp.server import build

    server = build(str(tmp_path / "mcp.db"))
    await server.backend.start(server.monitor_changed)
    try:
        for mid in ("aa", "bb"):
            await server.backend.call("create_monitor", {"id": mid, "visibility": "public"}, None)
        one, two = SimpleNamespace(session=object()), SimpleNamespace(session=object())
        for ctx in (one, two):
            await server._subscribe(ctx, types.SubscribeRequestParams(uri="monitor://aa/state"))
        await server._subscribe(one, types.SubscribeRequestParams(uri="monitor://bb/state"))
        await server._unsubscribe(one, types.UnsubscribeRequestParams(uri="monitor://bb/state"))
        await server._unsubscribe(one, types.UnsubscribeRequestParams(uri="monitor://aa/state"))
        assert list(server.legacy_subs) == ["monitor://aa/state"]  # bb's is gone; aa keeps its other one
        assert server.watched_monitors() == {"aa"}
        await server._unsubscribe(two, types.UnsubscribeRequestParams(uri="monitor://aa/state"))
        assert server.legacy_subs == {} and server.watched_monitors() == set()
    finally:
        await server.backend.close()


def test_mcp_whose_client_vanishes_stops_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A client killed mid-session leaves `mp mcp` writing to a pipe nobody reads: it said so with a 50-line
    ExceptionGroup of BrokenPipeError and exit status 1. It stops with one line on stderr and status 0."""
    init = {
        "jsonrpc": "2.0",
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    proc = subprocess.Popen(
        mp_command("mcp", "--db", str(tmp_path / "mcp.db")),
        env=mp_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdout.close()  # the client is gone: nobody reads what the server writes
    for i in range(3):
        try:
            proc.stdin.write((json.dumps({**init, "id": i + 1}) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            break  # the server has stopped reading too
        time.sleep(0.3)
    _out, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    said = err.decode()
    assert proc.returncode == 0 and "Traceback" not in said, said
    assert said.strip().endswith("mp mcp: the client closed the connection; stopping"), said


@pytest.mark.parametrize("base", ["localhost:8130", "ftp://example.com", "http://"])
def test_mcp_with_a_base_that_is_not_an_http_url_is_a_usage_error(base: str) -> None:
    """Found by a tester: a scheme-less --base (or MP_BASE) ended in a ValueError traceback, exit 1."""
    for args, env in ((["--base", base], {}), ([], {"MP_BASE": base})):
        ran = subprocess.run(
            [sys.executable, "-m", "monitor_protocol", "mcp", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env={**mp_env(), **env},
            timeout=HANG_GUARD_SECONDS,
        )
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
        assert ran.stderr.strip().splitlines() == [
            "mp mcp: the server URL must start with http:// or https:// and name a host, e.g. "
            f"http://127.0.0.1:8130 (got {base!r})"
        ]
