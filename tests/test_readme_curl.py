"""The curl quickstart in docs/serve.md works verbatim against a fresh `mp serve --db :memory:`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serverutil import ROOT, running_server

DOC = ROOT / "docs" / "serve.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def sh_blocks(text: str) -> list[str]:
    return [m.group(1) for m in SH_BLOCK.finditer(text)]


def test_the_doc_has_a_quickstart():
    blocks = sh_blocks(DOC.read_text())
    assert len(blocks) >= 5
    joined = "\n".join(blocks)
    for route in ("/monitors", "/observations", "/subscriptions", "/pull", "/ack"):
        assert route in joined


@pytest.mark.skipif(shutil.which("curl") is None, reason="the quickstart needs curl")
def test_curl_quickstart_runs_verbatim(tmp_path: Path):
    blocks = sh_blocks(DOC.read_text())
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
