#!/usr/bin/env python3
"""Build, serve and test the Monitor Protocol playground. Standard library only.

    python build.py build            build the static site into dist/site (incremental)
    python build.py serve [--port N] build, then serve dist/site on http://127.0.0.1:N (default 8000)
    python build.py test [--no-e2e] [pytest args...]
                                     venv, Chromium, build, ruff, pytest tests, pytest e2e (with a throwaway
                                     PostgreSQL cluster as MP_TEST_POSTGRES unless that is already set), then
                                     OTHER_PYTHON_TESTS under a newer CPython when one is found
    python build.py test --quick [pytest args...]
                                     the quick lane: venv, ruff, and the tests marked quick (the engine, its
                                     rules, the stores, the router, the conformance suite in-process), without
                                     a server, a browser, a site build or PostgreSQL
    python build.py bench [args...]  run bench/run.py with the venv's python

Everything the site loads comes from its own origin: Pyodide and PyScript from pinned npm packages,
pure-Python wheels from pinned PyPI releases, and a wheel of this repository's engine. Downloads are
cached in .cache/ keyed by version; the engine wheel is rebuilt when engine/, schemas/ or pyproject.toml
change. axe-core, pinned from npm too, is a test tool: the e2e accessibility checks inject it into the page,
and the site never ships it.
"""

from __future__ import annotations

if __name__ == "__main__" and globals().get("__spec__") is not None and __spec__.name == "build":
    # `python -m build` in the repository root finds this file before pypa/build (the current directory comes
    # first on sys.path). Step aside: drop this folder from the path and run the real package's __main__.
    import importlib.util as _util
    import os as _os
    import runpy as _runpy
    import sys as _sys

    _here = _os.path.dirname(_os.path.abspath(__file__))
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _here]
    _sys.modules.pop("build", None)
    if _util.find_spec("build") is None:
        print(
            "python -m build: pypa/build is not installed for this Python (pip install build); this "
            "repository's own script runs as `python3 build.py build|serve|test|bench`",
            file=_sys.stderr,
        )
        raise SystemExit(1)
    _runpy.run_module("build", run_name="__main__", alter_sys=True)
    raise SystemExit(0)

import argparse
import base64
import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / ".cache"
SITE = ROOT / "dist" / "site"
WEB = ROOT / "web"
VENV = ROOT / ".venv"
VENV_PY = VENV / "bin" / "python"
# A newer CPython than the venv's, held to the tests that touch the interpreter most (the HTTP server on its C
# extensions, the client, SQLite, the engine): the newest of these found on the machine (pythonX.Y on PATH,
# or pyenv's) runs them in a venv of its own, .venv-X.Y. 3.13 is also the playground's (Pyodide's) Python.
OTHER_PYTHONS = ("3.13", "3.12")
OTHER_PYTHON_TESTS = (
    "tests/test_store_contract.py",
    "tests/test_engine_calls.py",
    "tests/test_principles.py",
    "tests/test_scan_span.py",
    "tests/test_http_connection.py",
    "tests/test_http_server.py",
    "tests/test_client_keepalive.py",
)
PRECOMPILE = ROOT / "tools" / "precompile.mjs"  # compiles the start-up Python to .pyc with Pyodide's CPython
PGCLUSTER = ROOT / "tests" / "pgcluster.py"  # a throwaway PostgreSQL cluster for the tests
PG_ENV = "MP_TEST_POSTGRES"

PYODIDE_VERSION = "0.29.5"  # Python 3.13.2; BROWSER.md: starts about 0.4 s faster than 314.0.7
PYODIDE_PYTHON = "3.13.2"  # its CPython: the .pyc tag the precompiled modules carry
PYSCRIPT_VERSION = "0.7.31"
AXE_CORE_VERSION = "4.14.1"  # accessibility checks in e2e (axe_script()); a test tool, never in the site
# Pure-Python wheels the page may load, pinned. jsonschema >= 4.18 wants rpds-py, a compiled extension with
# no WebAssembly wheel: `pyrsistent-as-rpds-py` implements its API on pyrsistent, and a tiny generated
# `rpds` wheel (STANDIN_RPDS) re-exports it under the name jsonschema and referencing import.
# name: (version, lock depends, imports)
WHEELS = {
    "jsonschema": (
        "4.26.0",
        ["attrs", "jsonschema-specifications", "referencing", "rpds-py"],
        ["jsonschema"],
    ),
    "jsonschema-specifications": ("2025.9.1", ["referencing"], ["jsonschema_specifications"]),
    "referencing": ("0.37.0", ["attrs", "rpds-py"], ["referencing"]),
    "attrs": ("25.3.0", [], ["attr", "attrs"]),
    "pyrsistent": ("0.20.0", [], ["_pyrsistent_version", "pyrsistent"]),
    "pyrsistent-as-rpds-py": ("2.1.0", ["pyrsistent"], ["pyrsistent_as_rpds"]),
    # `pyodide.loadPackage("micropip")` offline, then `micropip.install(<this site's engine wheel URL>)` as
    # a reader's own Pyodide app does (web/runner.js). The versions Pyodide 0.29.5's lock names; micropip
    # vendors packaging but its vendored `packaging.licenses` imports the top-level one, hence the depend.
    "micropip": ("0.11.1", ["packaging"], ["micropip"]),
    "packaging": ("26.2", [], ["packaging"]),
}
STANDIN_RPDS = ("rpds-py", "0.0.1", ["pyrsistent-as-rpds-py"], ["rpds"])
ENGINE_PACKAGE = "monitor-protocol"
# Pyodide files the page needs from the npm package (no source maps, no consoles, no typings).
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.js",
    "pyodide.asm.js",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "package.json",
)


def log(msg: str) -> None:
    print(f"[build] {msg}", flush=True)


def fail(msg: str) -> None:
    print(f"[build] ERROR: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def run(cmd: list[str], **kw) -> None:
    log("$ " + " ".join(str(c) for c in cmd))
    result = subprocess.run(cmd, **kw)
    if result.returncode != 0:
        fail(f"command failed with exit code {result.returncode}: {' '.join(str(c) for c in cmd)}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(*paths: Path) -> str:
    """A digest of the names and contents of every file under the given paths (caches ignored)."""
    h = hashlib.sha256()
    for base in paths:
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for p in files:
            if "__pycache__" in p.parts or p.suffix == ".pyc":
                continue
            h.update(str(p.relative_to(ROOT)).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- fetching


def npm_package(name: str, version: str) -> Path:
    """`npm pack` a pinned package once into .cache/npm/<name>-<version>/package and return that folder."""
    dest = CACHE / "npm" / f"{name.replace('/', '__').lstrip('@')}-{version}"
    done = dest / ".complete"
    if done.exists():
        return dest / "package"
    if shutil.which("npm") is None:
        fail("npm is needed to fetch the pinned Pyodide, PyScript and axe-core packages (install Node.js 20 "
             "and npm)")  # fmt: skip
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    run(["npm", "pack", "--silent", f"{name}@{version}", "--pack-destination", str(dest)], cwd=dest)
    tgz = next(dest.glob("*.tgz"))
    with tarfile.open(tgz) as tar:
        tar.extractall(dest, filter="data")
    tgz.unlink()
    done.write_text(f"{name}@{version}\n")
    return dest / "package"


def axe_script() -> Path:
    """axe.min.js of the pinned axe-core, for the e2e tests to inject into a page (fetched once into .cache/;
    it is a test tool: build() never copies it into the site)."""
    script = npm_package("axe-core", AXE_CORE_VERSION) / "axe.min.js"
    if not script.is_file():
        fail(f"axe-core {AXE_CORE_VERSION} has no axe.min.js in {script.parent}")
    return script


def pypi_wheel(name: str, version: str) -> Path:
    """Download one pinned pure-Python wheel (for Python 3.13, any platform) into .cache/wheels."""
    dest = CACHE / "wheels" / f"{name}-{version}"
    wheels = list(dest.glob("*.whl"))
    if len(wheels) == 1:
        return wheels[0]
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--only-binary=:all:", "--no-deps", "--python-version", "3.13", "--platform", "any",
         "--implementation", "py", "--abi", "none", "-d", str(dest), f"{name}=={version}"]
    )  # fmt: skip
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        fail(f"expected one wheel for {name}=={version} in {dest}, found {wheels}")
    return wheels[0]


def engine_wheel() -> Path:
    """Build this repository's wheel (monitor_protocol + schemas) when engine/, schemas/ or pyproject changed."""
    sources = [p for p in (ROOT / "engine", ROOT / "schemas", ROOT / "pyproject.toml", ROOT / "README.md")]
    key = tree_digest(*[p for p in sources if p.exists()])
    dest = CACHE / "engine" / key
    wheels = list(dest.glob("*.whl"))
    if len(wheels) == 1:
        return wheels[0]
    shutil.rmtree(CACHE / "engine", ignore_errors=True)
    dest.mkdir(parents=True)
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "-w", str(dest), str(ROOT)]
    )  # fmt: skip
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        fail(f"expected one engine wheel in {dest}, found {wheels}")
    return wheels[0]


def precompiled(pyodide: Path, ewheel: Path) -> Path:
    """The stdlib zip and the engine wheel with .pyc beside what the page imports at start-up, and the UI
    modules' .pyc, compiled by Pyodide's own CPython (tools/precompile.mjs, under Node): the page then does
    not compile that source on every load (about 2 s of a 5 s cold start on this machine, docs/bench.md).
    Unchecked-hash .pyc: they are rebuilt whenever the sources, the wheel, the tool or Pyodide change."""
    key = hashlib.sha256(
        PRECOMPILE.read_bytes() + ewheel.read_bytes() + PYODIDE_VERSION.encode() + tree_digest(WEB).encode()
    ).hexdigest()[:16]
    out = CACHE / "precompiled" / key
    if not (out / ".complete").exists():
        shutil.rmtree(CACHE / "precompiled", ignore_errors=True)
        out.mkdir(parents=True)
        if shutil.which("node") is None:
            fail("node is needed to precompile the playground's Python (it comes with npm)")
        run(["node", str(PRECOMPILE), str(pyodide), str(ewheel), str(WEB), str(out)])
        (out / ".complete").write_text("ok\n")
    return out


def standin_rpds_wheel() -> Path:
    """Generate the `rpds` stand-in wheel: one module re-exporting pyrsistent_as_rpds' pure classes.
    Deterministic bytes (fixed timestamps), so its sha256 only changes when this code does."""
    name, version, _, _ = STANDIN_RPDS
    dist = name.replace("-", "_")
    init = (
        b'"""rpds-py API on pyrsistent (pyrsistent-as-rpds-py), for Pyodide where rpds-py has no wheel."""\n'
        b"from pyrsistent_as_rpds.pure import HashTrieMap, HashTrieSet, List, Queue\n\n"
        b'__all__ = ["HashTrieMap", "HashTrieSet", "List", "Queue"]\n'
    )
    info = f"{dist}-{version}.dist-info"
    files = {
        "rpds/__init__.py": init,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: rpds-py stand-in re-exporting pyrsistent-as-rpds-py\nRequires-Dist: pyrsistent-as-rpds-py\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: build.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": b"rpds\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    dest = CACHE / "wheels" / f"{name}-{version}"
    wheel = dest / f"{dist}-{version.replace('+', '_')}-py3-none-any.whl"
    dest.mkdir(parents=True, exist_ok=True)
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, data)
    if wheel.exists() and wheel.read_bytes() == tmp.read_bytes():
        tmp.unlink()
    else:
        os.replace(tmp, wheel)
    return wheel


# --------------------------------------------------------------------------------------------- assembling


def lock_entry(name: str, version: str, wheel: Path, depends: list[str], imports: list[str]) -> dict:
    return {
        "name": name,
        "version": version,
        "file_name": wheel.name,
        "install_dir": "site",
        "sha256": sha256_file(wheel),
        "package_type": "package",
        "imports": imports,
        "depends": depends,
        "unvendored_tests": False,
    }


def patched_lock(original: dict, entries: list[dict]) -> dict:
    """Keep only the packages the site really ships, so nothing can ever be fetched from elsewhere."""
    return {"info": original["info"], "packages": {e["name"]: e for e in entries}}


def sync_tree(files: dict[str, bytes | Path], dest: Path) -> int:
    """Make `dest` hold exactly `files` (relative path -> bytes or source file), rewriting only changes."""
    changed = 0
    dest.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        target = dest / rel
        data = src if isinstance(src, bytes) else None
        if target.exists():
            if data is not None and target.read_bytes() == data:
                continue
            if data is None:
                st, tt = src.stat(), target.stat()
                if st.st_size == tt.st_size and (
                    st.st_mtime_ns == tt.st_mtime_ns or src.read_bytes() == target.read_bytes()
                ):
                    continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp-build")
        if data is not None:
            tmp.write_bytes(data)
        else:
            shutil.copy2(src, tmp)
        os.replace(tmp, target)
        changed += 1
    for p in sorted(dest.rglob("*"), reverse=True):
        rel = p.relative_to(dest).as_posix()
        if p.is_file() and rel not in files:
            p.unlink()
            changed += 1
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    return changed


def readme_section(title: str, doc: Path = ROOT / "README.md") -> str:
    """The text of one `## title` section of the README (up to the next `## ` heading)."""
    text = doc.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def quickstart_blocks(doc: Path = ROOT / "README.md") -> list[dict[str, str]]:
    """The README's curl quickstart, verbatim: every ```sh block of its section with the sentence before it
    (the curl tab's examples and the tests' input, so both always try exactly what the README says)."""
    text = readme_section("Quickstart with curl", doc)
    out = []
    for m in re.finditer(r"```sh\n(.*?)```", text, re.S):
        before = text[: m.start()].rstrip().split("\n\n")[-1].strip()
        why = " ".join(before.split()) if not before.startswith("```") else ""
        out.append({"why": why, "code": m.group(1)})
    return out


# A page's PyScript entry: a script file (src="./main.py", "../docs_page.py") or code inline in the tag.
ENTRY_SCRIPT = re.compile(r'<script type="py"([^>]*)>(.*?)</script>', re.S)
ENTRY_SRC = re.compile(r'\bsrc="(?:\.\.?/)?(\w+\.py)"')


def web_imports(code: str, seen: set[str] | None = None) -> set[str]:
    """The web/ modules (file names) that `code` imports, directly or through each other, wherever the import
    statement is (top level or inside a function)."""
    import ast

    seen = set() if seen is None else seen
    for node in ast.walk(ast.parse(code)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            file = name.split(".")[0] + ".py"
            if file not in seen and (WEB / file).is_file():
                seen.add(file)
                web_imports((WEB / file).read_text(), seen)
    return seen


def page_modules(page: str) -> list[str]:
    """Every web/ module a page's entry script imports (the entry file itself is loaded by its src)."""
    m = ENTRY_SCRIPT.search(page)
    if m is None:
        fail('a page given to page_with_modules has no <script type="py"> entry')
    src = ENTRY_SRC.search(m.group(1))
    code = (WEB / src.group(1)).read_text() if src else m.group(2)
    return sorted(web_imports(code) - ({src.group(1)} if src else set()))


def page_with_modules(page: str, modules: list[str] | None = None) -> str:
    """A page with PyScript's `files` map filled in: the given web/ modules (file names), by default every
    web/ module its entry script imports (found by reading the imports, so a new module is never forgotten
    and another page's are never fetched); each with its precompiled .pyc beside it."""
    if "__PY_FILES__" not in page:
        fail("a page given to page_with_modules has no __PY_FILES__ placeholder in its PyScript config")
    if modules is None:
        modules = page_modules(page)
    missing = [n for n in modules if not (WEB / n).is_file()]
    if missing:
        fail(f"page_with_modules: no such module in web/: {', '.join(missing)}")
    mods = sorted(modules)
    fmap = {f"./{n}": f"./{n}" for n in mods}
    tag = "cpython-" + "".join(PYODIDE_PYTHON.split(".")[:2])  # the precompiled .pyc beside each module
    fmap |= {f"./__pycache__/{n[:-3]}.{tag}.pyc": f"./__pycache__/{n[:-3]}.{tag}.pyc" for n in mods}
    return page.replace("__PY_FILES__", json.dumps(fmap))


def openapi_json() -> bytes:
    """The REST binding's OpenAPI 3.1 document, generated from the engine's operations table (the engine
    imports only the standard library, so this script's own Python can run it)."""
    engine = str(ROOT / "engine")
    sys.path.insert(0, engine)
    try:
        from monitor_protocol.api.openapi import dumps
    finally:
        sys.path.remove(engine)
    return (dumps() + "\n").encode()


def build() -> Path:
    t0 = time.monotonic()
    if not (WEB / "index.html").exists():
        fail("web/index.html is missing")
    pyodide = npm_package("pyodide", PYODIDE_VERSION)
    pyscript = npm_package("@pyscript/core", PYSCRIPT_VERSION)
    files: dict[str, bytes | Path] = {}

    for rel in PYODIDE_FILES:
        src = pyodide / rel
        if src.exists():
            files[f"pyodide/{rel}"] = src
    for src in sorted((pyscript / "dist").rglob("*")):
        if src.is_file() and not src.name.endswith(".map"):
            files[f"pyscript/{src.relative_to(pyscript / 'dist').as_posix()}"] = src

    entries = []
    for name, (version, depends, imports) in WHEELS.items():
        wheel = pypi_wheel(name, version)
        files[f"pyodide/{wheel.name}"] = wheel
        entries.append(lock_entry(name, version, wheel, depends, imports))
    sname, sversion, sdepends, simports = STANDIN_RPDS
    swheel = standin_rpds_wheel()
    files[f"pyodide/{swheel.name}"] = swheel
    entries.append(lock_entry(sname, sversion, swheel, sdepends, simports))
    pre = precompiled(pyodide, engine_wheel())
    files["pyodide/python_stdlib.zip"] = pre / "python_stdlib.zip"
    ewheel = pre / engine_wheel().name  # lock_entry hashes this file, so the integrity check stays right
    for pyc in sorted((pre / "__pycache__").glob("*.pyc")):
        files[f"__pycache__/{pyc.name}"] = pyc
    eversion = ewheel.name.split("-")[1]
    files[f"pyodide/{ewheel.name}"] = ewheel
    entries.append(lock_entry(ENGINE_PACKAGE, eversion, ewheel, [], ["monitor_protocol"]))

    original = json.loads((pyodide / "pyodide-lock.json").read_text())
    lock = patched_lock(original, entries)
    files["pyodide/pyodide-lock.json"] = json.dumps(lock, indent=1, sort_keys=True).encode()

    for src in sorted(WEB.rglob("*")):
        if src.is_file() and "__pycache__" not in src.parts:
            files[src.relative_to(WEB).as_posix()] = src
    files["index.html"] = page_with_modules((WEB / "index.html").read_text()).encode()
    # One scene for an iframe (docs/embedding.md), with only the modules it imports; embedding.html (the
    # demo host page showing every scene) is copied from web/ as it is.
    files["embed.html"] = page_with_modules((WEB / "embed.html").read_text()).encode()
    files["quickstart.json"] = json.dumps(quickstart_blocks(), indent=1).encode()
    files["openapi.json"] = openapi_json()
    info = {
        "pyodide": PYODIDE_VERSION,
        "pyscript": PYSCRIPT_VERSION,
        "engine_wheel": ewheel.name,
        "engine_sha256": lock["packages"][ENGINE_PACKAGE]["sha256"],
        "wheels": {n: v[0] for n, v in WHEELS.items()},
    }
    files["build-info.json"] = json.dumps(info, indent=1, sort_keys=True).encode()
    from tools.mdpages import DocsError, site_pages  # the docs as live pages, docs/*.html (tools/mdpages.py)

    try:
        files |= site_pages(info["engine_wheel"], page_with_modules)
    except DocsError as exc:
        fail(str(exc))
    files.pop("docs.html", None)  # web/docs.html is their template, not a page
    digest = site_digest(files)
    files["build-info.json"] = json.dumps({**info, "site_build": digest}, indent=1, sort_keys=True).encode()
    files["sw.js"] = service_worker(digest)
    changed = sync_tree(files, SITE)
    log(f"site ready in {SITE.relative_to(ROOT)} ({len(files)} files, {changed} changed, "
        f"{time.monotonic() - t0:.1f}s)")  # fmt: skip
    return SITE


def site_digest(files: dict[str, bytes | Path]) -> str:
    """The digest of the site's files but sw.js and build-info.json, which carry it: a new build is a new
    worker, whose copies of the site's files (for a reload with the server gone) are this build's, and the
    worker keeps files only while build-info.json names its build."""
    digest = hashlib.sha256()
    for name in sorted(files):
        if name in ("sw.js", "build-info.json"):
            continue
        content = files[name]
        digest.update(name.encode() + b"\0")
        digest.update(content if isinstance(content, bytes) else content.read_bytes())
    return digest.hexdigest()[:16]


def service_worker(digest: str) -> bytes:
    text = (WEB / "sw.js").read_text()
    if "__SITE_BUILD__" not in text:
        fail("web/sw.js has no __SITE_BUILD__ placeholder for the build's digest")
    return text.replace("__SITE_BUILD__", digest).encode()


# ---------------------------------------------------------------------------------------------- serving


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".js": "text/javascript",
        ".wasm": "application/wasm",
        ".json": "application/json",
        ".whl": "application/zip",
        ".zip": "application/zip",
        ".py": "text/x-python",
        ".css": "text/css",
        ".html": "text/html; charset=utf-8",
        ".png": "image/png",
        ".svg": "image/svg+xml",
    }

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("X-Content-Type-Options", "nosniff")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        if os.environ.get("MP_SERVE_QUIET") != "1":
            super().log_message(format, *args)


def make_server(
    port: int, directory: Path = SITE, host: str = "127.0.0.1"
) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(SiteHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(port: int) -> None:
    build()
    server = make_server(port)
    print(f"\n  Monitor Protocol playground: http://127.0.0.1:{server.server_address[1]}/\n"
          f"  (serving {SITE}; Ctrl-C to stop)\n", flush=True)  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# ---------------------------------------------------------------------------------------------- testing


def ensure_venv(venv: Path = VENV, python: str = sys.executable) -> Path:
    """A venv with this project and its test tools (the `test` extra), remade when pyproject.toml changes;
    its python."""
    venv_py = venv / "bin" / "python"
    pyproject = ROOT / "pyproject.toml"
    key = hashlib.sha256(pyproject.read_bytes()).hexdigest()
    stamp = venv / ".mp-pyproject-sha256"
    if venv_py.exists() and stamp.exists() and stamp.read_text().strip() == key:
        log(f"{venv.name} is up to date")
        return venv_py
    if not venv_py.exists():
        run([python, "-m", "venv", str(venv)])
    run(
        [
            str(venv_py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-e",
            f"{ROOT}[test]",
        ]
    )
    stamp.write_text(key + "\n")
    return venv_py


def other_python() -> tuple[str, Path] | None:
    """The newest CPython of OTHER_PYTHONS on this machine, if any: (its version, its executable)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in OTHER_PYTHONS:
        builds = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), key=lambda p: p.parts[-3])
        on_path = shutil.which(f"python{version}")  # (pyenv's shim answers only for its chosen version)
        for candidate in [*reversed(builds), *([Path(on_path)] if on_path else [])]:
            try:
                said = subprocess.run(
                    [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                continue
            if said == version:
                return version, candidate
    return None


def test_other_python(env: dict[str, str]) -> bool:
    """OTHER_PYTHON_TESTS under the newest other CPython found (see OTHER_PYTHONS); False when it failed."""
    found = other_python()
    if found is None:
        log(f"no CPython {' or '.join(OTHER_PYTHONS)} here (on PATH or pyenv's): its lane is not run")
        return True
    version, python = found
    venv_py = ensure_venv(ROOT / f".venv-{version}", str(python))
    cmd = [
        str(venv_py),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:randomly",
        *pytest_workers("tests"),
        *OTHER_PYTHON_TESTS,
    ]
    log(f"$ {' '.join(cmd)}   (Python {version}: {python})")
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode == 0


# Debian's Chromium and the flags that keep it offline and quiet here (BROWSER.md); e2e and the playground
# benchmark launch it with exactly these.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def ensure_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.geteuid() != 0:
        fail("Chromium is missing and this is not root. Install it with:\n  sudo apt-get update && "
             "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium")  # fmt: skip
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update"], env=env)
    run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env)
    if not Path(CHROMIUM).exists():
        fail(f"apt-get installed chromium but {CHROMIUM} is still missing")


def _pgcluster():
    """tests/pgcluster.py as a module (standard library only): find_bin_dir() and ci_is_true()."""
    sys.path.insert(0, str(PGCLUSTER.parent))
    try:
        import pgcluster
    finally:
        sys.path.remove(str(PGCLUSTER.parent))
    return pgcluster


def _redacted(url: str) -> str:
    """A libpq URL or conninfo string with its password, if any, replaced by ***."""
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        if parts.password is not None:
            host = parts.netloc.rsplit("@", 1)[1]
            return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
        return re.sub(r"(password=)[^&]*", r"\1***", url)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url)


def postgres_bin_dir() -> Path | None:
    """Where `test` finds PostgreSQL's binaries to start a throwaway cluster for the tests, or None: when
    MP_TEST_POSTGRES is already set (that server is used), or when PostgreSQL is not installed (the tests that
    need it are skipped, said here in one line). Missing binaries fail the run in CI, before any other work."""
    given = os.environ.get(PG_ENV, "").strip()
    if given:
        log(f"PostgreSQL tests use {PG_ENV} from the environment: {_redacted(given)}")
        return None
    pgcluster = _pgcluster()
    bin_dir = pgcluster.find_bin_dir()
    if bin_dir is None:
        where = "no initdb from `pg_config --bindir` or in /usr/lib/postgresql/*/bin"
        if pgcluster.ci_is_true():
            fail(f"PostgreSQL is needed in CI: apt-get install postgresql ({where}; CI={os.environ['CI']})")
        log(f"PostgreSQL tests will be skipped: {PG_ENV} is not set and PostgreSQL is not installed ({where}; "
            "apt-get install postgresql)")  # fmt: skip
    return bin_dir


@contextlib.contextmanager
def postgres_for_tests(bin_dir: Path | None) -> Iterator[dict[str, str]]:
    """The environment of the test steps: with `bin_dir`, a throwaway cluster (tests/pgcluster.py start) is
    started, exported as MP_TEST_POSTGRES, and stopped and removed on the way out, also on a failure or
    Ctrl-C."""
    env = dict(os.environ)
    if bin_dir is None:
        yield env
        return
    state = Path(tempfile.gettempdir()) / f"mp-pgcluster-{os.getpid()}.json"
    state.unlink(missing_ok=True)
    cli = [sys.executable, str(PGCLUSTER)]
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen([*cli, "start", "--state", str(state), "--bin-dir", str(bin_dir)],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        try:
            proc.communicate()
        except BaseException:
            proc.wait()  # a Ctrl-C reached it too: it removes what it had created
            raise
        if proc.returncode != 0 or not state.exists():
            fail(f"could not start a throwaway PostgreSQL cluster ({' '.join(cli)} start exited "
                 f"{proc.returncode}; its error is above)")  # fmt: skip
        info = json.loads(state.read_text())
        log(f"PostgreSQL for the tests: {info['version']}, {PG_ENV}={info['url']} (no password; a throwaway "
            f"cluster in {info['dir']}, started in {time.monotonic() - t0:.1f}s; if this run is killed, stop "
            f"it with: python3 {PGCLUSTER.relative_to(ROOT)} stop --state {state})")  # fmt: skip
        env[PG_ENV] = info["url"]
        yield env
    finally:
        if state.exists():
            p = subprocess.run([*cli, "stop", "--state", str(state)], cwd=ROOT)
            if p.returncode != 0:
                log(
                    f"WARNING: stopping the throwaway PostgreSQL cluster exited {p.returncode} (state: {state})"
                )
            else:
                log("stopped the throwaway PostgreSQL cluster")


QUICK_MARKS = "quick and not postgres"


def pytest_workers(suite: str) -> list[str]:
    """pytest-xdist's arguments for a suite: most of a test's time is waiting (servers and subprocesses
    starting, fsyncs, time limits run out on purpose, a browser loading Pyodide), so the tests run in one
    process per core plus one (two for the browser tests, each of which runs a Chromium of its own). Each
    test file stays in one process (`loadfile`: a module's fixtures, a built wheel or a running server, are
    made once). Measured on 2 cores (2026-12-07): the tests 785 s in one process, 372 s in three."""
    cores = os.cpu_count() or 1
    workers = min(cores, 2) if suite == "e2e" else cores + 1
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []


def test_quick(extra: list[str]) -> None:
    """The developer's loop: ruff and the quick lane (tests marked quick, none needing PostgreSQL)."""
    ensure_venv()
    steps = [
        ["ruff", "format", "--check", "."],
        ["ruff", "check", "."],
        ["pytest", "-q", *pytest_workers("tests"), "-m", QUICK_MARKS, "tests", *extra],
    ]
    for step in steps:
        cmd = [str(VENV_PY), "-m", *step]
        log("$ " + " ".join(cmd))
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            fail(f"{' '.join(step)} failed")
    log("the quick lane passed (the whole suite: python3 build.py test)")


def test(no_e2e: bool, extra: list[str]) -> None:
    pg_bin = postgres_bin_dir()
    ensure_venv()
    if not no_e2e:
        ensure_chromium()
        axe_script()  # the e2e accessibility checks inject it (e2e/conftest.py axe_violations)
    build()
    steps = [
        ["ruff", "format", "--check", "."],
        ["ruff", "check", "."],
        ["pytest", "-q", *pytest_workers("tests"), "tests", *extra],
    ]
    if not no_e2e:
        steps.append(["pytest", "-q", *pytest_workers("e2e"), "e2e", *extra])
    collected = 0
    with postgres_for_tests(pg_bin) as env:
        for step in steps:
            cmd = [str(VENV_PY), "-m", *step]
            log("$ " + " ".join(cmd))
            code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
            if code == 5 and extra and step[0] == "pytest":
                suite = "e2e" if "e2e" in step else "tests"
                log(f"no test in {suite} matched {' '.join(extra)}")  # pytest's "nothing collected"
                continue
            if code != 0:
                fail(f"{' '.join(step)} failed with exit code {code}")
            collected += step[0] == "pytest"
        if not extra and not test_other_python(env):  # (a run narrowed by pytest args is the developer's)
            fail("the tests under the other CPython failed")
    if collected == 0:
        fail(f"no test matched {' '.join(extra)}")
    log("all checks passed")


def bench(extra: list[str]) -> None:
    script = ROOT / "bench" / "run.py"
    if not script.exists():
        fail(f"{script.relative_to(ROOT)} is missing: the benchmark runner has not been written yet")
    ensure_venv()
    run([str(VENV_PY), str(script), *extra], cwd=ROOT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the static site into dist/site")
    p_serve = sub.add_parser("serve", help="build, then serve dist/site on 127.0.0.1")
    p_serve.add_argument("--port", type=int, default=8000)
    p_test = sub.add_parser("test", help="ruff, pytest tests, pytest e2e (extra args go to pytest)")
    p_test.add_argument("--no-e2e", action="store_true", help="skip the browser tests")
    p_test.add_argument(
        "--quick", action="store_true", help="ruff and the quick lane only: no server, browser or PostgreSQL"
    )
    sub.add_parser("bench", help="run bench/run.py with the venv's python")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("build", "serve"):
        parser.error(f"unexpected arguments: {' '.join(extra)}")
    if args.command == "build":
        build()
    elif args.command == "serve":
        serve(args.port)
    elif args.command == "test" and args.quick:
        test_quick(extra)
    elif args.command == "test":
        test(args.no_e2e, extra)
    elif args.command == "bench":
        bench(extra)


if __name__ == "__main__":
    main()
