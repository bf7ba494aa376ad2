"""The engine and its in-browser pieces import nothing outside the standard library (they run on Pyodide),
while the doors that may use packages (server, client, MCP) stay out of the core's import graph."""

from __future__ import annotations

import subprocess
import sys

CORE = [
    "monitor_protocol.core.service",
    "monitor_protocol.store.memory",
    "monitor_protocol.store.sqlite",
    "monitor_protocol.store.indexeddb",
    "monitor_protocol.api.rest",
    "monitor_protocol.api.jsonrpc",
    "monitor_protocol.doors.browser",
    "monitor_protocol.conformance",
    "monitor_protocol.conformance.inprocess",
    "monitor_protocol.core.schemas",
]

PROBE = """
import importlib, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
outside = sorted(
    m for m in set(sys.modules) - before
    if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "monitor_protocol"
)
print(",".join(outside))
"""


def imported_outside_stdlib(*modules: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, check=True
    ).stdout.strip()
    return [m for m in out.split(",") if m]


def test_the_core_imports_only_the_standard_library():
    assert imported_outside_stdlib(*CORE) == []


def test_the_probe_sees_a_package_import():
    # positive control: HTTP push does pull in httpx at import (the client imports it only when its httpx
    # layer is used), and the probe notices
    assert "httpx" in imported_outside_stdlib("monitor_protocol.doors.push")
