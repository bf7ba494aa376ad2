"""The client on Pyodide, as far as CPython can check it: the wheel's dependencies are skipped on emscripten
(so `micropip.install(<wheel URL>)` fetches nothing from PyPI), importing the client does not import httpx
until an httpx path is used, on emscripten the client picks the browser layer (webhttp) and never imports
keepalive (which needs `ssl`, absent from Pyodide), and webhttp's pure parts. The browser itself sends in
e2e/test_runner.py (real Chromium, real engine)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from monitor_protocol.client import webhttp
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# The marker environment micropip evaluates on Pyodide 0.29.5 (CPython 3.13.2 compiled to WebAssembly).
PYODIDE_ENV = {
    **default_environment(),
    "sys_platform": "emscripten",
    "platform_system": "Emscripten",
    "os_name": "posix",
    "platform_machine": "wasm32",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
    "python_version": "3.13",
    "python_full_version": "3.13.2",
}
DOORS = {
    "httptools",
    "uvloop",
    "httpx",
}  # mp serve (its own HTTP server on httptools, uvloop) and the client's httpx fallback


def _python(code: str) -> dict:
    """Run `code` in a fresh interpreter (nothing imported yet) and return the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wheel_requires(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("monitor_protocol-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        meta = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]


@pytest.mark.slow
def test_the_wheel_requires_nothing_on_pyodide_and_the_doors_elsewhere(wheel_requires):
    plain = [Requirement(r) for r in wheel_requires if "extra ==" not in r]
    assert {r.name for r in plain} == DOORS
    for req in plain:
        assert req.marker is not None and 'sys_platform != "emscripten"' in str(req.marker), str(req)
    on_pyodide = [r.name for r in plain if r.marker.evaluate(PYODIDE_ENV)]
    assert on_pyodide == []  # what micropip would fetch: nothing
    # positive control: on CPython on Linux every door's dependency is still required
    linux = {**PYODIDE_ENV, **default_environment(), "sys_platform": "linux", "platform_system": "Linux"}
    assert {r.name for r in plain if r.marker.evaluate(linux)} == DOORS


def test_importing_the_client_does_not_import_httpx_until_an_httpx_path_is_used():
    found = _python(
        "import json, os, sys\n"
        "import monitor_protocol.client as c\n"
        "seen = {'import': 'httpx' in sys.modules}\n"
        "pooled = c.Client('http://127.0.0.1:9')\n"
        "seen['pool'] = [pooled.http_layer, 'httpx' in sys.modules]\n"
        "os.environ['HTTP_PROXY'] = 'http://127.0.0.1:9'\n"  # a proxy applies: httpx's path
        "proxied = c.Client('http://example.invalid:9')\n"
        "seen['proxy'] = [proxied.http_layer, 'httpx' in sys.modules]\n"
        "print(json.dumps(seen))\n"
    )
    assert found == {"import": False, "pool": ["keep-alive", False], "proxy": ["httpx", True]}


def test_on_emscripten_the_client_picks_the_browser_layer_and_never_imports_keepalive():
    # sys.platform is what the client reads to choose its layer; set as Pyodide sets it, before the import
    found = _python(
        "import json, sys\n"
        "sys.platform = 'emscripten'\n"
        "import monitor_protocol.client as c\n"
        "import httpx\n"
        "seen = {'sync': c.Client('http://127.0.0.1:9').http_layer,\n"
        "        'async': c.AsyncClient('http://127.0.0.1:9').http_layer,\n"
        "        'transport': c.Client(transport=httpx.HTTPTransport()).http_layer,\n"
        "        'keepalive': 'monitor_protocol.client.keepalive' in sys.modules}\n"
        "print(json.dumps(seen))\n"
    )
    assert found == {"sync": "xhr", "async": "fetch", "transport": "httpx", "keepalive": False}


def test_a_closed_browser_layer_refuses_before_sending():
    layer = webhttp.Client()
    layer.close()
    with pytest.raises(webhttp.SendFailed) as err:  # before `import js`: no browser needed to say so
        layer.request("GET", "http://127.0.0.1:9/mp/v0/discover", None, {}, 1.0)
    assert err.value.sent is False and "closed" in err.value.reason


def test_response_headers_of_xmlhttprequest_are_parsed_lower_case_and_combined():
    raw = (
        "Content-Type: application/json\r\nretry-after: 2\r\nVary: accept\r\nvary: origin\r\n\r\nbad line\r\n"
    )
    assert webhttp.parse_headers(raw) == {
        "content-type": "application/json",
        "retry-after": "2",
        "vary": "accept, origin",
    }
    assert webhttp.parse_headers("") == {}


def test_timeouts_are_whole_milliseconds_and_never_zero():
    assert webhttp.timeout_ms(10.0) == 10_000
    assert webhttp.timeout_ms(2.0001) == 2001  # rounded up: never shorter than asked
    assert webhttp.timeout_ms(0.0001) == 1  # 0 would mean "no timeout" to XMLHttpRequest
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout is seconds > 0"):
            webhttp.timeout_ms(bad)


def test_x_user_defined_text_gives_back_the_bytes():
    data = bytes(range(256))
    as_text = "".join(chr(b) if b < 0x80 else chr(0xF700 + b) for b in data)  # the charset's mapping
    assert webhttp.x_user_defined(as_text) == data
    assert webhttp.Reply(200, "é".encode()).text == "é"
