"""`mp mcp` over stdio, driven by the official MCP SDK client (PROTOCOL.md section 9).

The server runs as a real subprocess on a temporary SQLite database (embedded mode), and once against a real
`mp serve` (`--base`). The SDK client negotiates the 2026-07-28 era by default (resource updates arrive on a
`subscriptions/listen` stream); `mode="legacy"` exercises the handshake era (`resources/subscribe`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from monitor_protocol.vocab import EXTENSION_ID
from serverutil import start_server, stop_server

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


def server_params(*args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "monitor_protocol.cli", "mcp", *args], env=env
    )


async def call(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content[0].text
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
    caps = client.server_capabilities
    # 2026-07-28: SEP-2133 extensions; handshake era: experimental capabilities.
    assert EXTENSION_ID in (caps.extensions or caps.experimental or {})

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
    assert [m["id"] for m in listed["monitors"]] == ["ci"]

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
    assert {t.uri_template for t in templates} == {"monitor://{id}/definition", "monitor://{id}/state"}
    definition = json.loads((await client.read_resource("monitor://ci/definition")).contents[0].text)
    assert definition["id"] == "ci" and definition["version"] >= 1
    state = json.loads((await client.read_resource("monitor://ci/state")).contents[0].text)
    assert state["monitor"] == "ci" and state["head"] == definition["head"]
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
                await anyio.sleep(0.3)  # let the pull start waiting; correctness does not depend on it
                await call(
                    client,
                    "monitor_publish",
                    {"id": "q1", "type": "com.example.q", "subject": "x", "token": owner},
                )
            assert [o["subject"] for o in results[0]["observations"]] == ["x"]


async def test_mcp_against_a_server(tmp_path: Path) -> None:
    base, proc = start_server(tmp_path)
    try:
        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with Client(server_params("--base", base)) as client:
                ctx = await exercise(client)
                async with client.listen(resource_subscriptions=["monitor://ci/state"]) as stream:
                    await call(
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
