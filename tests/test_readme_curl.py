"""The README's curl quickstart works verbatim against a fresh `mp serve --db :memory:`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serverutil import ROOT, running_server

sys.path.insert(0, str(ROOT))
import build  # noqa: E402  (the one place that knows where the README's quickstart is)


def sh_blocks() -> list[str]:
    return [b["code"] for b in build.quickstart_blocks()]


def test_the_doc_has_a_quickstart():
    blocks = sh_blocks()
    assert len(blocks) >= 5
    joined = "\n".join(blocks)
    for route in ("/monitors", "/observations", "/subscriptions", "/pull", "/ack"):
        assert route in joined


@pytest.mark.skipif(shutil.which("curl") is None, reason="the quickstart needs curl")
def test_curl_quickstart_runs_verbatim(tmp_path: Path):
    blocks = sh_blocks()
    env = dict(os.environ)
    # `python3` in the blocks is whatever the reader has; here it is this interpreter.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    with running_server(tmp_path, "--db", ":memory:") as (base, _proc):
        env["MP"] = base + "/mp/v0"
        # One shell for all blocks, in order, so variables flow from one to the next as in a terminal.
        script = "set -euo pipefail\n" + "".join(
            f"echo '--- block {i}' >&2\n{block}\n" for i, block in enumerate(blocks, 1)
        )
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    out = done.stdout
    assert '"supportedVersions"' in out  # discover
    assert "owner token: " in out and "subscription sub-" in out
    assert "{'status': 'failed'" in out  # the pulled observation's data
    assert "\n[]\n" in out  # after the ack, the acknowledged observation does not come back
    assert "build-413" in out  # the long poll
    assert "'missing'" in out  # state.confidence lists its missing inputs
