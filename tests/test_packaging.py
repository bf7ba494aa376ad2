"""The distribution as a user gets it: `python -m build` works in the repository root (build.py steps
aside), and a plain `pip install` of the wheel (no extras, dependencies from the index) gives an `mp` whose
serve, publish, subscribe, pull and watch work, and an importable client. Everything lands in tmp."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from waiting import eventually

ROOT = Path(__file__).resolve().parents[1]
URL_LINE = re.compile(r"Monitor Protocol server on (http://\S+?)/mp/v0")
RUN = "com.example.ci.run"

pytestmark = pytest.mark.slow


def clean_env(tmp: Path) -> dict[str, str]:
    """No PYTHONPATH (the installed package, not the checkout), no pip cache outside tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "MP_", "VIRTUAL_ENV"))}
    env.update(
        PIP_CACHE_DIR=str(tmp / "pip-cache"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run(cmd: list[str], tmp: Path, timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=kw.pop("env", clean_env(tmp)), **kw
    )
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """sdist and wheel from `python -m build` run in the repository root, as the README's users would."""
    out = tmp_path_factory.mktemp("dist")
    env = clean_env(out)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_python_m_build_is_pypa_build_and_build_py_is_still_ours(tmp_path):
    version = run([sys.executable, "-m", "build", "--version"], tmp_path, cwd=ROOT)
    assert version.stdout.startswith("build ") and "site-packages" in version.stdout
    ours = run([sys.executable, "build.py", "--help"], tmp_path, cwd=ROOT)
    assert "playground" in ours.stdout and "{build,serve,test,bench}" in ours.stdout


def test_the_wheel_and_sdist_carry_the_license_schemas_and_ranges(dists):
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
        meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "monitor_protocol/schemas/observation.json" in names
    assert "monitor_protocol/cli/serve.py" in names
    requires = [
        line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")
    ]
    plain = [r for r in requires if "extra ==" not in r]
    names_plain = {re.split(r"[<>=!~; ]", r, maxsplit=1)[0].lower() for r in plain}
    assert {"httptools", "httpx", "uvloop"} <= names_plain
    assert "uvicorn" not in names_plain  # mp serve has its own HTTP/1.1 server (doors/http/protocol.py)
    assert not any("==" in r.split(";")[0] for r in plain), plain  # ranges, not pins
    uvloop = next(r for r in plain if r.lower().startswith("uvloop"))
    assert "sys_platform != 'win32'" in uvloop
    assert "License: MIT" in meta and "License :: OSI Approved :: MIT License" in meta
    with tarfile.open(dists["sdist"]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for path in (
        "LICENSE",
        "CHANGELOG.md",
        "README.md",
        "pyproject.toml",
        "schemas/monitor.json",
        "deploy/Containerfile",
    ):
        assert path in members, path
    assert not any(m.startswith(("dist/", ".cache/", ".venv/", "web/", "bench/")) for m in members)


def test_pyproject_pins_test_tools_and_keeps_extras_optional():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["server"] == ["orjson>=3.10,<4"]  # the fast JSON codec mp serve uses when installed
    assert set(extras) == {"server", "mcp", "postgres", "test"}
    pins = {re.split(r"[=;\[ ]", r, maxsplit=1)[0]: r for r in extras["test"] if "==" in r}
    assert "mypy" in pins and "build" in pins and "pytest" in pins
    for requirement in extras["test"]:
        assert "==" in requirement or requirement.startswith("monitor-protocol["), requirement


def wait_for_url(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    def answering() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"mp serve exited with {proc.returncode}:\n{log.read_text()}")
        found = URL_LINE.search(log.read_text(errors="replace"))
        if found is None:
            return None
        try:
            answered = httpx.get(found.group(1) + "/mp/v0/discover", timeout=2).status_code == 200
        except httpx.HTTPError:
            answered = False
        return found.group(1) if answered else None

    return eventually(
        answering, timeout=timeout, what="mp serve answers", detail=lambda: "\n" + log.read_text()
    )


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> Iterator[tuple[Path, Path]]:
    """A fresh venv with the wheel installed plainly: `pip install monitor_protocol-*.whl`, deps from the index."""
    tmp = tmp_path_factory.mktemp("plain-install")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp)
    bindir = venv / "bin"
    run([str(bindir / "python"), "-m", "pip", "install", "--quiet", str(dists["wheel"])], tmp, timeout=300)
    yield bindir, tmp


def test_a_plain_install_serves_publishes_and_reads(installed):
    bindir, tmp = installed
    env = clean_env(tmp)
    mp = str(bindir / "mp")
    helped = run([mp, "--help"], tmp, env=env, cwd=tmp)
    for command in ("serve", "publish", "watch", "conform"):
        assert command in helped.stdout
    run([mp, "watch", "--help"], tmp, env=env, cwd=tmp)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version in run([mp, "--version"], tmp, env=env, cwd=tmp).stdout
    where = run(
        [str(bindir / "python"), "-c", "import monitor_protocol, monitor_protocol.client as c; "
         "print(monitor_protocol.__file__); print(c.Client.__name__)"],
        tmp,
        env=env,
        cwd=tmp,
    )  # fmt: skip
    assert (
        str(bindir.parent) in where.stdout and "Client" in where.stdout
    )  # the installed copy, not the checkout

    log = tmp / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [mp, "serve", "--db", ":memory:", "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,
        )
    try:
        base = wait_for_url(proc, log, 60)
        assert httpx.get(base + "/mp/v0/discover").json()
        assert httpx.get(base + "/healthz").status_code == 200
        body = {
            "id": "pkg",
            "description": "packaging",
            "horizon": "minute",
            "visibility": "public",
            "types": [RUN],
        }
        owner = httpx.post(base + "/mp/v0/monitors", json=body).json()["owner_token"]
        client_env = {**env, "MP_BASE": base}
        published = run(
            [
                mp,
                "publish",
                "pkg",
                RUN,
                "--subject",
                "build-1",
                "--data",
                '{"status": "ok"}',
                "--token",
                owner,
                "--json",
            ],
            tmp,
            env=client_env,
            cwd=tmp,
        )
        assert '"seq"' in published.stdout or '"sequence"' in published.stdout, published.stdout
        sub = run(
            [
                mp,
                "subscribe",
                "pkg",
                "--subscriber",
                "agent:pkg",
                "--filter",
                f'{{"types": ["{RUN}"]}}',
                "--token",
                owner,
                "--json",
            ],
            tmp,
            env=client_env,
            cwd=tmp,
        )
        import json

        reply = json.loads(sub.stdout)
        pulled = run(
            [mp, "pull", reply["subscription"]["id"], "--token", reply["token"], "--json"],
            tmp,
            env=client_env,
            cwd=tmp,
        )
        page = json.loads(pulled.stdout)
        assert [o["data"]["status"] for o in page["observations"]] == ["ok"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "database closed" in text
