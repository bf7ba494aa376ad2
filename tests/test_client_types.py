"""The client is typed: `mypy --strict` passes on client.py and on a small typed program using it, and
catches a program that misuses it (so results are real types, not Any). The package ships `py.typed`."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"

GOOD = """\
from __future__ import annotations

from monitor_protocol.client import (
    AsyncClient,
    Client,
    CompactReply,
    ConnectionFailed,
    CursorBackwards,
    LeaseHeld,
    Monitor,
    MonitorProtocolError,
    Published,
    PullResult,
)


def follow(base: str, owner: str) -> list[str]:
    with Client(base, owner) as mp:
        created = mp.create_monitor("ci", types=["com.example.ci.run"])
        token: str = created.owner_token
        pub: Published = mp.publish("ci", "com.example.ci.run", subject="b1", data={"s": 1}, retries=3)
        seq: int = pub.seq
        repeated: bool = pub.idempotent
        monitors: list[Monitor] = mp.list_monitors(token=token)
        head: int = mp.state("ci").head
        sub = mp.subscribe("ci", "agent:t", capabilities=["observe"], from_="head")
        batch: PullResult = mp.pull(sub.subscription.id, wait=5, token=sub.token)
        subjects = [str(o.get("subject")) for o in batch.observations]
        try:
            mp.ack(sub.subscription.id, batch.next, token=sub.token)
        except CursorBackwards as err:
            subjects.append(f"{err.code} {err.status} {err.extras}")
        except LeaseHeld:
            pass
        except MonitorProtocolError as err:
            retry_after: float | None = err.retry_after
            subjects.append(str(retry_after))
        except ConnectionFailed as err:
            sent: bool = err.sent
            subjects.append(err.reason if sent else err.url)
        compacted: CompactReply = mp.admin_compact(seq, "ci")
        floors = [log["retention_floor"] for log in compacted["compacted"]]
        result: dict[str, object] = mp.rpc("monitors/discover")
        return subjects + [m.id for m in monitors] + [str(head), str(repeated), str(floors), str(result)]


async def follow_async(base: str) -> int:
    async with AsyncClient(base) as mp:
        state = await mp.state("ci")
        pub = await mp.publish("ci", "com.example.ci.run", idempotency_key="k", retries=1)
        return state.head + pub.seq
"""

# Each line marked `# error` must be reported by mypy, and nothing else.
BAD = """\
from __future__ import annotations

from monitor_protocol.client import AsyncClient, Client


def misuse(mp: Client) -> None:
    mp.pull("sub-1", wait=2.5)  # error
    seq: str = mp.publish("ci", "com.example.ci.run").seq  # error
    mp.state("ci").head.upper()  # error
    mp.ack("sub-1", "3")  # error
    mp.publish("ci", "com.example.ci.run", retries="3")  # error
    mp.no_such_route()  # error


async def misuse_async(mp: AsyncClient) -> None:
    head: int = mp.state("ci").head  # error
"""


def _mypy_available() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip(
            "mypy is not installed in this environment (it comes with the test extras: "
            "pip install -e '.[test]', or pip install mypy)"
        )


def _mypy(*args: str, cwd: Path, mypypath: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    if mypypath is not None:
        env["MYPYPATH"] = str(mypypath)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(cwd / ".mypy"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=str(cwd),
        env=env,
        timeout=300,
    )


def test_py_typed_marker_ships_with_the_package() -> None:
    assert (ENGINE / "monitor_protocol" / "py.typed").is_file()


def test_client_module_passes_mypy_strict(tmp_path: Path) -> None:
    _mypy_available()
    # --follow-imports=silent: this checks client.py itself, not the modules it imports
    ran = _mypy("--follow-imports=silent", "-m", "monitor_protocol.client", cwd=tmp_path, mypypath=ENGINE)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_typed_usage_passes_and_misuse_is_caught(tmp_path: Path) -> None:
    _mypy_available()
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)
    try:
        installed = importlib.metadata.distribution("monitor-protocol")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    # Installed (as the test extras do, editable): mypy reads the package through its py.typed marker, as
    # a user's type checker would. Otherwise: through MYPYPATH.
    ran = _mypy("good.py", "bad.py", cwd=tmp_path, mypypath=None if installed else ENGINE)
    output = ran.stdout + ran.stderr
    assert "py.typed" not in output and "import-untyped" not in output, output
    reported = {(m.group(1), int(m.group(2))) for m in re.finditer(r"^(\w+)\.py:(\d+): error:", output, re.M)}
    expected = {("bad", n) for n, line in enumerate(BAD.splitlines(), 1) if line.endswith("# error")}
    assert reported == expected, output
