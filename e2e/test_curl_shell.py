"""The curl console's shell (web/curl.py) in plain CPython, against the same EngineHost the page runs:
the README's quickstart runs verbatim, the field paths are evaluated without eval, and anything outside
the subset is refused by name. (The browser run of the same blocks is in test_playground.py.)"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "web"))
import curl  # noqa: E402
from monitor_protocol.doors.browser import EngineHost  # noqa: E402

ORIGIN = "http://127.0.0.1:5555"


def quickstart_blocks() -> list[str]:
    """The README's quickstart blocks, found where build.py finds them for the curl tab."""
    sys.path.insert(0, str(ROOT))
    import build

    return [b["code"] for b in build.quickstart_blocks()]


class Console:
    def __init__(self) -> None:
        self.host = EngineHost()
        self.lines: list[tuple[str, str, dict]] = []
        self.shell = curl.Shell(ORIGIN, self.fetch, lambda k, t, x: self.lines.append((k, t, x)))

    async def fetch(self, call: curl.CurlCall) -> tuple[int, str]:
        assert call.url.startswith(ORIGIN + "/mp/v0/"), call.url
        parts = urlsplit(call.url)
        reply = await self.host.call(
            call.method,
            parts.path,
            query=parse_qsl(parts.query),
            headers=call.headers,
            raw_body=(call.body or "").encode(),
        )
        return reply.status, json.dumps(json.loads(reply.to_shim_json())["json"])

    def run(self, text: str) -> list[tuple[str, str, dict]]:
        start = len(self.lines)
        # A thread of its own: Playwright's sync API keeps a loop running in this one once any e2e test ran.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, self.shell.run(text)).result()
        return self.lines[start:]


def kinds(lines, kind):
    return [t for k, t, _ in lines if k == kind]


def test_the_quickstart_runs_verbatim():
    blocks = quickstart_blocks()
    assert len(blocks) == 7
    c = Console()
    out = c.run(blocks[0])
    assert kinds(out, "note") == ["field: built in"]
    assert [x["status"] for k, _, x in out if k == "http"] == [200]
    assert c.shell.env["MP"] == "http://127.0.0.1:8130/mp/v0"

    out = c.run(blocks[1])
    assert [x["status"] for k, _, x in out if k == "http"] == [201]
    assert kinds(out, "out") == [f"owner token: {c.shell.env['OWNER']}\n"] and len(c.shell.env["OWNER"]) >= 24

    out = c.run(blocks[2])
    assert [x["status"] for k, _, x in out if k == "http"] == [201]

    out = c.run(blocks[3])
    sub_id = c.shell.env["SUB_ID"]
    assert re.fullmatch(r"sub-[0-9a-f]{16}", sub_id) and kinds(out, "out") == [f"subscription {sub_id}\n"]

    out = c.run(blocks[4])
    assert "'status': 'failed'" in kinds(out, "out")[0]  # print() of a dict, as python3 -c would
    assert c.shell.env["NEXT"] == "3"

    out = c.run(blocks[5])
    acked = [x["data"] for k, _, x in out if k == "http"][0]
    assert acked["cursor"] == 3
    assert kinds(out, "out")[-1] == "[]\n"  # the acknowledged observation does not come back

    out = c.run(blocks[6])
    assert [x["status"] for k, _, x in out if k == "http"] == [201, 200, 200]
    assert kinds(out, "out")[0] == "build-413\n"
    assert "'value': None" in kinds(out, "out")[1]
    assert c.shell.last_status == 0
    assert not kinds(c.lines, "error")


@pytest.mark.parametrize(
    ("path", "value"),
    [('["a"]', {"b": [1, 2]}), ('["a"]["b"][-1]', 2), ("['a']['b'][0]", 1), ('[ "a" ] ["b"]', [1, 2])],
)
def test_field_paths(path, value):
    assert curl.subscript({"a": {"b": [1, 2]}}, path) == value


@pytest.mark.parametrize(
    "path", [".keys()", '["a"].__class__', '[__import__("os")]', '["a"]; import os', "[1:2]"]
)
def test_field_refuses_anything_but_subscripts(path):
    with pytest.raises(curl.Unsupported):
        curl.subscript({"a": 1}, path)


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("ls -la", "the command 'ls'"),
        ("curl -s $MP/discover && echo ok", "&&"),
        ("echo `date`", "backquotes"),
        ("curl -s $MP/discover > out.json", "redirects other than > /dev/null"),
        ("jq() { cat; }", "defining shell functions (jq)"),
        ("curl -s -o x $MP/discover", "the curl option -o"),
        ("(echo hi)", "outside $(...)"),
        ("echo $((1 + 2))", "arithmetic"),
        ("X=1 echo $X", "VAR=value before a command"),
        ("curl -s $MP/discover | python3 -m json.tool", "python3"),
    ],
)
def test_outside_the_subset_is_refused_by_name(line, what):
    c = Console()
    c.shell.env["MP"] = "http://localhost:8130/mp/v0"
    out = c.run(line)
    errors = kinds(out, "error")
    assert len(errors) == 1 and errors[0].startswith("not supported in this console: ") and what in errors[0]
    assert kinds(out, "http") == []  # nothing was sent


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ('curl -d \'{"a": 1}', "a ' quote is open"),
        ('curl "$MP/discover', 'a " quote is open'),
        ('X=$(curl -s "$MP/discover"', "a $( is open"),
        ("f() {\n  curl -s x", "a function's { is open"),
        ('curl "${MP:-http://127.0.0.1:8130/mp/v0', "a ${ is open"),
        ("curl -s \\", "the line ends with \\"),
        ("curl -s x |", "the line ends with |"),
    ],
)
def test_a_script_that_needs_more_lines_says_why(typed, said):
    assert curl.awaiting(typed).startswith(said)


def test_a_whole_script_awaits_nothing():
    for whole in (
        'curl -sS "$MP/discover"',
        "X=$(curl -s x)",
        "echo '|'",
        "f() { curl -s x; }",
        "curl -s | jq .",
    ):
        assert curl.awaiting(whole) is None, whole


def test_quoting_variables_and_hosts():
    c = Console()
    out = c.run(
        'A=one; B="two $A"; echo "${B}" \'$A\' ${UNSET:-fallback} "x\\"y" \\\n  continued\n'
        "curl -sS http://localhost:8130/mp/v0/discover | field '[\"protocol\"]' > /dev/null; echo done"
    )
    assert kinds(out, "out") == ['two one $A fallback x"y continued\n', "done\n"]
    assert [x["url"] for k, _, x in out if k == "http"] == [ORIGIN + "/mp/v0/discover"]
    out = c.run("curl -s https://example.com/mp/v0/discover")
    assert "another host" in kinds(out, "error")[0] and kinds(out, "http") == []


@pytest.mark.parametrize(
    ("url", "instead"),
    [
        ("http://127.0.0.1:8130/discover", "try $MP/discover"),
        ("http://localhost:8130", "try $MP/discover"),
        ("/monitors/ci", "try $MP/monitors/ci"),
        ("http://127.0.0.1:8130/mp/v0x/discover", "try $MP/discover"),
        ("http://127.0.0.1:8130/mp/v1/monitors/ci", "try $MP/monitors/ci"),
        ("http://127.0.0.1:8130/mp/v0/../../sw.js", "has a . or .. segment"),
        ("http://127.0.0.1:8130/mp/v0/%2e%2e/%2E%2e/index.html", "has a . or .. segment"),
        ("/mp/v0/./discover", "has a . or .. segment"),
        (
            '"http://localhost:8130/mp/v0/..\\..\\sw.js"',
            "has a . or .. segment",
        ),  # a reviewer's: \\ reads as /
    ],
)
def test_a_url_outside_the_protocol_is_refused_saying_where_it_is(url, instead):
    """The page's origin serves the site's files too: a missing /mp/v0 got the file server's 404 page in HTML.
    Nothing is sent; the sentence names $MP."""
    console = Console()
    lines = console.run(f"curl -s {url}")
    assert kinds(lines, "http") == []
    (said,) = kinds(lines, "error")
    assert ("is not under /mp/v0" in said or "would leave /mp/v0" in said) and instead in said, said
    assert kinds(console.run("curl -s http://127.0.0.1:8130/mp/v0/discover"), "http")  # control


def test_an_unset_variable_says_why_it_may_be_unset():
    lines = Console().run('curl -s "$MP/monitors/ci/observations" -H "Authorization: Bearer $OWNER"')
    notes = kinds(lines, "note")
    assert any("$OWNER is not set" in n and "from the first one on" in n for n in notes), notes
    # a name close to one that is set is a typo, not a reload
    console = Console()
    console.run("OWNER=tok")
    notes = kinds(console.run('echo "$OWNR"'), "note")
    assert any("$OWNR is not set" in n and "did you mean $OWNER?" in n for n in notes), notes


def test_a_failed_substitution_empties_its_variable():
    """`X=$(...)` whose command fails leaves X empty, as sh does: the old value would send the next block
    with a token from an earlier run, and nothing would say so."""
    console = Console()
    console.run("OWNER=$(echo tok-from-before)")
    assert console.shell.env["OWNER"] == "tok-from-before"  # control: a substitution that works sets it
    lines = console.run("""OWNER=$(echo not-json | field '["owner_token"]')""")
    assert console.shell.env["OWNER"] == ""
    assert "field: the input is not JSON" in kinds(lines, "error")[0]
    assert any("OWNER is now empty" in n for n in kinds(lines, "note")), lines


async def _no_cli(argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str, str]:
    raise AssertionError("no mp command runs here")


def test_a_failed_substitution_empties_an_exported_variable():
    console = Console()
    console.shell.cli = _no_cli  # `export` is the shell's where the page runs `mp`
    console.run("export OWNER=fresh")
    assert console.shell.env["OWNER"] == "fresh" and "OWNER" in console.shell.exported  # control
    console.run("""export OWNER=$(echo not-json | field '["owner_token"]')""")
    assert console.shell.env["OWNER"] == ""


def test_a_continuation_waits_for_its_next_line():
    assert curl.continued("curl -s $MP/discover \\\n") and curl.continued("curl -s \\\n  ")
    assert not curl.continued("curl -s \\\n  -H 'a: b'") and not curl.continued("curl -s $MP/discover\n")
