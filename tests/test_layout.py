"""The layout is the architecture (docs/ARCHITECTURE.md): each folder of engine/monitor_protocol is a layer, and
this module holds the rules a layer keeps. The pure layers import nothing outside the standard library (they run
on Pyodide) and nothing from the layers above them; no module imports another in a circle; no private name
crosses a module; no product module grows past ~900 lines. Every rule is checked on the real tree and, as a
positive control, on a small tree made to break it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

PACKAGE = Path(__file__).resolve().parents[1] / "engine" / "monitor_protocol"
MAX_LINES = 900

# layer -> the layers its modules may import (besides the standard library and, outside PURE, packages)
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "api": {"core", "api"},
    "store": {"core", "store"},
    "conformance": {"core", "api", "store", "conformance"},
    "client": {"core", "client"},
    "doors": {"core", "api", "store", "client", "doors"},
    "cli": {"core", "api", "store", "client", "doors", "conformance", "cli"},
    "": {"cli"},  # the package itself: its version, and `python -m monitor_protocol`
}
# What the browser loads: these import only the standard library (checked by importing them in a fresh
# interpreter); the client's browser layer is checked by tests/test_client_web.py.
PURE = ("core", "api", "store", "conformance")
PURE_DOORS = ("monitor_protocol.doors.browser", "monitor_protocol.doors.parking")


def modules(package: Path) -> dict[str, Path]:
    """Every module below `package`, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer_of(name: str) -> str:
    """The folder a module lives in ("" for the package's own modules: its face and __main__)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""


def imports(package: Path) -> dict[str, list[tuple[str, str, int]]]:
    """module -> [(imported module, imported name or "", line)] for every import of this package, at the top
    or inside a function (a lazy import is still a dependency)."""
    known = modules(package)
    top = package.name
    out: dict[str, list[tuple[str, str, int]]] = {}
    for name, path in known.items():
        found: list[tuple[str, str, int]] = []
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] != top:
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if sub in known:
                        found.append((sub, "", node.lineno))
                    else:
                        found.append((node.module, alias.name, node.lineno))
            elif isinstance(node, ast.ImportFrom) and node.level:
                found.append(("<relative>", "", node.lineno))
            elif isinstance(node, ast.Import):
                found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == top]
        out[name] = found
    return out


def layer_violations(package: Path) -> list[str]:
    bad = []
    for name, found in imports(package).items():
        allowed = MAY_IMPORT.get(layer_of(name))
        for target, _, line in found:
            if target == "<relative>":
                bad.append(f"{name}:{line} imports relatively (write the layer in the import)")
            elif allowed is None or (target != package.name and layer_of(target) not in allowed):
                bad.append(f"{name}:{line} ({layer_of(name) or 'package'}) imports {target}")
    return bad


def cycles(package: Path) -> list[list[str]]:
    """Circles of modules importing each other (a package's face importing its own modules is no circle)."""
    graph = {
        name: {t for t, _, _ in found if t != name and not t.startswith(name + ".") and t != "<relative>"}
        for name, found in imports(package).items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_crossings(package: Path) -> list[str]:
    return [
        f"{name}:{line} imports {name_!r} from {target}"
        for name, found in imports(package).items()
        for target, name_, line in found
        if name_.startswith("_") and not name_.startswith("__")
    ]


def long_modules(package: Path) -> list[str]:
    return [
        f"{name}: {n} lines"
        for name, path in modules(package).items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
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


def imported_outside_stdlib(*names: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *names], capture_output=True, text=True, check=True
    ).stdout.strip()
    return [m for m in out.split(",") if m]


# ---------------------------------------------------------------------------------------------- the tree


def test_each_layer_imports_only_the_layers_below_it():
    assert layer_violations(PACKAGE) == []


def test_the_pure_layers_import_only_the_standard_library():
    pure = [n for n in modules(PACKAGE) if layer_of(n) in PURE]
    assert len(pure) > 30  # the folders are there and were read
    assert imported_outside_stdlib(*pure, *PURE_DOORS) == []


def test_no_module_imports_another_in_a_circle():
    assert cycles(PACKAGE) == []


def test_no_private_name_crosses_a_module():
    assert private_crossings(PACKAGE) == []


def test_no_product_module_is_longer_than_it_can_be_read():
    assert long_modules(PACKAGE) == []


# ---------------------------------------------------------------------------------------------- controls


def write(root: Path, files: dict[str, str]) -> Path:
    package = root / "monitor_protocol"
    for rel, text in {"__init__.py": "", **files}.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_the_rules_catch_what_they_are_about(tmp_path: Path):
    package = write(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/rules.py": "from monitor_protocol.doors.http import serve\n",  # core reaching up
            "core/a.py": "def f():\n    from monitor_protocol.core.b import x\n",  # a circle, lazily
            "core/b.py": "from monitor_protocol.core.a import _hidden\n",  # and a private name
            "core/c.py": "from . import a\n",  # relative: the layer does not show
            "doors/__init__.py": "",
            "doors/http.py": "from monitor_protocol.core import rules\n" + "x = 1\n" * (MAX_LINES + 1),
        },
    )
    assert layer_violations(package) == [
        "monitor_protocol.core.c:1 imports relatively (write the layer in the import)",
        "monitor_protocol.core.rules:1 (core) imports monitor_protocol.doors.http",
    ]
    assert cycles(package) == [
        ["monitor_protocol.core.a", "monitor_protocol.core.b"],
        ["monitor_protocol.core.rules", "monitor_protocol.doors.http"],
    ]
    assert private_crossings(package) == [
        "monitor_protocol.core.b:1 imports '_hidden' from monitor_protocol.core.a"
    ]
    assert long_modules(package) == [f"monitor_protocol.doors.http: {MAX_LINES + 2} lines"]


def test_a_package_face_importing_its_own_modules_is_no_circle(tmp_path: Path):
    package = write(
        tmp_path,
        {
            "client/__init__.py": "from monitor_protocol.client.clients import Client\n",
            "client/clients.py": "from monitor_protocol.client import errors\nClient = 1\n",
            "client/errors.py": "",
        },
    )
    assert cycles(package) == []


def test_the_probe_sees_a_package_import():
    # positive control: HTTP push imports httpx at import time, and the probe notices
    assert "httpx" in imported_outside_stdlib("monitor_protocol.doors.push")


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_every_layer_named_here_is_a_folder_of_the_package(layer: str):
    assert layer == "" or (PACKAGE / layer / "__init__.py").is_file()
