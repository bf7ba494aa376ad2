"""The README's Python example runs verbatim against a live `mp serve`; the documented doors exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from serverutil import mp_env, running_server

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "doors.md"
sys.path.insert(0, str(ROOT))
import build  # noqa: E402  (finds README sections)

README_DOORS = build.readme_section("Doors for agents and programs")


def python_example() -> str:
    return re.search(r"```python\n(.*?)```", README_DOORS, re.S).group(1)


def test_readme_mcp_configuration_is_valid_json() -> None:
    block = re.search(r"```json\n(.*?)```", README_DOORS, re.S).group(1)
    server = json.loads(block)["mcpServers"]["monitors"]
    assert server["command"] == "mp" and server["args"][:2] == ["mcp", "--db"]


def test_python_example_runs_verbatim(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_example())
    with running_server(tmp_path) as (base, _proc):
        env = mp_env()
        env["MP_BASE"] = base
        ran = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
        )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["handling build-412 failed", "CURSOR_BACKWARDS 409"]


def test_mcp_configurations_are_valid_json_and_name_the_mcp_command() -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    for block in blocks:
        server = json.loads(block)["mcpServers"]["monitors"]
        assert server["command"] == "mp" and server["args"][0] == "mcp"
        assert server["args"][1] in ("--db", "--base")


def test_watch_command_in_the_doc_parses() -> None:
    from monitor_protocol.cli import build_parser

    line = next(ln for ln in DOC.read_text().splitlines() if ln.startswith("mp watch sub-"))
    args = build_parser().parse_args(line.split()[1:])
    assert args.command == "watch" and args.subscription.startswith("sub-") and args.wait == 30.0
