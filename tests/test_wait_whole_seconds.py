"""`wait` is whole seconds on the wire (a fractional one is refused with INVALID), and every door that
forwards a long poll sends it that way: the CLI, the watch and the MCP server in --base mode."""

from __future__ import annotations

import pytest
from monitor_protocol.cli import build_parser
from monitor_protocol.doors.mcp.backends import RemoteBackend
from monitor_protocol.doors.mcp.tools import _pull
from serverutil import running_server

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick


def test_cli_and_watch_take_whole_seconds():
    parser = build_parser()
    assert parser.parse_args(["watch", "sub-1", "--wait", "5"]).wait == 5
    assert parser.parse_args(["pull", "sub-1", "--wait", "5"]).wait == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["watch", "sub-1", "--wait", "2.5"])


async def test_mcp_pull_refuses_a_fractional_wait_before_sending_it():
    class Recorder:
        def __init__(self) -> None:
            self.waits: list[int] = []

        async def pull(self, sub, token, *, cursor=None, limit=None, wait=0, filter=None):  # noqa: A002
            self.waits.append(wait)
            return {"observations": []}

    backend = Recorder()
    await _pull(backend, {"subscription": "sub-1", "wait": 3, "token": "t"})
    assert backend.waits == [3]
    from monitor_protocol.core.errors import ProtocolError

    with pytest.raises(ProtocolError) as err:
        await _pull(backend, {"subscription": "sub-1", "wait": 2.5, "token": "t"})
    assert err.value.code == "INVALID" and backend.waits == [3]


async def test_mcp_remote_long_poll_reaches_a_real_server(tmp_path):
    with running_server(tmp_path) as (base, _proc):
        remote = RemoteBackend(base)
        try:
            created = await remote.client.request(
                "POST", "/monitors", body={"id": "ci", "visibility": "public"}
            )
            sub = await remote.client.request(
                "POST", "/subscriptions", body={"monitor": "ci", "subscriber": "agent:m"}
            )
            token = sub["token"]
            first = await remote.pull(sub["subscription"]["id"], token, wait=0)
            await remote.client.request(
                "POST",
                f"/subscriptions/{sub['subscription']['id']}/ack",
                body={"cursor": first["next"]},
                token=token,
            )
            reply = await remote.pull(sub["subscription"]["id"], token, wait=1)  # sent as "1", not "1.0"
            assert reply["observations"] == [] and created["monitor"]["id"] == "ci"
        finally:
            await remote.close()
