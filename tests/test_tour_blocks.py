"""docs/tour.md runs as written: every ```sh block, in order, through the playground's own curl shell
(web/curl.py `Shell`) against a real in-process engine, reached the way the page reaches it (the service
worker's JSON request into `EngineHost.handle_shim`).

Each block is declared in the Markdown, right above its fence, by HTML comments the page does not show:

    <!-- expect: 201, 400 TIER_NOT_ASSERTABLE -->   one entry per curl the block runs, in order:
                                                    a status, optionally followed by the error code
    <!-- expect: none -->                           a block that runs no curl
    <!-- shows: text -->                            optional, repeatable: the block's output contains text

So the prose, the expectation and the engine cannot drift apart: a wrong expectation fails this test."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
from monitor_protocol.doors.browser import EngineHost
from serverutil import running_server

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "docs" / "tour.md"
ORIGIN = "http://tour.invalid"  # the page's origin: the shell rewrites 127.0.0.1:8130 to it

FENCE = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
COMMENT = re.compile(r"<!--\s*(expect|shows):\s*(.*?)\s*-->", re.S)
ENTRY = re.compile(r"^(\d{3})(?:\s+([A-Z][A-Z_]*))?$")


def load_curl() -> ModuleType:
    """web/curl.py by path (web/ is the page's folder, not a package)."""
    spec = importlib.util.spec_from_file_location("tour_curl", ROOT / "web" / "curl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tour_curl"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


curl = load_curl()


@dataclass
class Block:
    line: int  # of the ```sh fence, 1-based
    code: str
    expect: list[tuple[int, str | None]]  # (status, error code or None), one per curl
    shows: list[str]
    heading: str  # the nearest heading above


@dataclass
class Outcome:
    calls: list[tuple[int, str | None]] = field(default_factory=list)
    output: list[str] = field(default_factory=list)  # what a reader sees: out lines and answers
    errors: list[str] = field(default_factory=list)  # shell errors, and variables used before being set


def parse_expect(text: str, where: str) -> list[tuple[int, str | None]]:
    if text == "none":
        return []
    out = []
    for entry in text.split(","):
        m = ENTRY.match(entry.strip())
        if m is None:
            raise ValueError(f"{where}: expect entry {entry.strip()!r} is not 'STATUS' or 'STATUS CODE'")
        out.append((int(m.group(1)), m.group(2)))
    return out


def blocks(text: str) -> list[Block]:
    """Every ```sh block with the annotations between it and the previous block or prose paragraph."""
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").split("\n")
        notes: list[str] = []
        while before and (before[-1].strip().startswith("<!--") or not before[-1].strip()):
            notes.insert(0, before.pop())
        heading = next((h.lstrip("#").strip() for h in reversed(before) if h.startswith("#")), "")
        expect: list[tuple[int, str | None]] | None = None
        shows = []
        for kind, value in COMMENT.findall("\n".join(notes)):
            if kind == "expect":
                if expect is not None:
                    raise ValueError(f"tour.md line {line}: two expect comments")
                expect = parse_expect(value, f"tour.md line {line}")
            else:
                shows.append(value)
        if expect is None:
            raise ValueError(f"tour.md line {line}: the block has no <!-- expect: ... --> comment above it")
        found.append(Block(line, m.group(1), expect, shows, heading))
    return found


class Page:
    """One fresh engine and one shell, as the tour's page holds them."""

    def __init__(self) -> None:
        self.host = EngineHost()
        self.shell = curl.Shell(ORIGIN, self.fetch, self.emit, {})
        self.now = Outcome()

    async def fetch(self, call) -> tuple[int, str]:
        # The service worker's message (web/sw.js forward): path, query pairs, headers, body text.
        url = urllib.parse.urlsplit(call.url)
        assert f"{url.scheme}://{url.netloc}" == ORIGIN, call.url  # never another host
        message = {
            "method": call.method,
            "path": url.path,
            "query": urllib.parse.parse_qsl(url.query, keep_blank_values=True),
            "headers": call.headers,
            "body": call.body or "",
        }
        reply = json.loads(await self.host.handle_shim(json.dumps(message)))
        body = reply["json"]
        return reply["status"], "" if body is None else json.dumps(body, indent=2) + "\n"

    def emit(self, kind: str, text: str, extra: dict) -> None:
        if kind == "http":
            data = extra["data"]
            ok = 200 <= extra["status"] < 300
            code = data.get("code") if isinstance(data, dict) and not ok else None
            self.now.calls.append((extra["status"], code))
            if extra["shown"]:
                self.now.output.append(text)
        elif kind == "out":
            self.now.output.append(text)
        elif kind == "error":
            self.now.errors.append(text)
        elif kind == "note" and "is not set" in text:
            self.now.errors.append(text.lstrip("# "))

    async def run(self, block: Block) -> Outcome:
        self.now = Outcome()
        await self.shell.run(block.code)
        return self.now


def problems(block: Block, got: Outcome) -> list[str]:
    """What differs between the block's declaration and what it did (empty: as the tour says)."""
    where = f"tour.md line {block.line} ({block.heading})"
    found = [f"{where}: shell error: {e}" for e in got.errors]
    if got.calls != block.expect:
        found.append(f"{where}: statuses {fmt(got.calls)}, the tour says {fmt(block.expect)}")
    shown = "\n".join(got.output)
    for text in block.shows:
        if text not in shown:
            found.append(f"{where}: the output does not show {text!r}; it is:\n{shown}")
    return found


def fmt(calls: list[tuple[int, str | None]]) -> str:
    return ", ".join(f"{s} {c}" if c else str(s) for s, c in calls) or "none"


async def run_tour(found: list[Block], upto: int | None = None) -> list[str]:
    page = Page()
    out: list[str] = []
    for block in found[:upto]:
        out += problems(block, await page.run(block))
    return out


# ------------------------------------------------------------------------------------------- the tests
def test_every_block_declares_what_it_expects():
    found = blocks(TOUR.read_text())
    assert len(found) >= 20
    assert all(b.code.strip() for b in found)
    curls = sum(len(re.findall(r"(?:^|\$\(|\|)\s*curl\s", b.code, re.M)) for b in found)
    assert curls == sum(len(b.expect) for b in found), "one expect entry per curl"


def test_the_tour_covers_the_five_parts_and_fourteen_principles():
    text = TOUR.read_text()
    found = blocks(text)
    headings = {b.heading for b in found}
    for part in ("Monitor", "Observation", "State", "Subscription", "Lease"):
        assert any(re.match(rf"\d\. {part}\b", h) for h in headings), f"no live block under the {part} part"
    for n in range(1, 15):
        assert any(h.startswith(f"P{n}.") for h in headings), f"no live block under P{n}"
    for doc in ("README.md", "docs/serve.md", "docs/doors.md"):
        assert doc in text.split("## Where to go next", 1)[-1], f"the tour's end does not point to {doc}"


async def test_every_block_runs_as_the_tour_says():
    assert await run_tour(blocks(TOUR.read_text())) == []


async def test_the_mute_block_holds_at_a_readers_pace():
    """A reader who takes more than the quiet reader's one-second mute window between P6's two blocks: the
    sweep has run by then (on the next call), so the reader that waits for the retirement starts where the
    quiet one did, not at the head, and still sees it (found by a tester reading at a normal pace)."""
    found = blocks(TOUR.read_text())
    second = next(i for i, b in enumerate(found) if "'reason': 'mute'" in b.shows)
    page = Page()
    report: list[str] = []
    for block in found[:second]:
        report += problems(block, await page.run(block))
    await asyncio.sleep(2.5)  # reading the paragraph between the blocks
    report += problems(found[second], await page.run(found[second]))
    assert report == []


async def test_a_wrong_expectation_fails():
    """Positive control: the checker does see a status, a code, an output or a shell error that is not the
    one declared."""
    found = blocks(TOUR.read_text())
    refusal = next(i for i, b in enumerate(found) if (400, "TIER_NOT_ASSERTABLE") in b.expect)
    wrong = list(found)
    wrong[refusal] = Block(
        found[refusal].line, found[refusal].code, [(201, None), (201, None)], ["never printed"], "P1"
    )
    report = await run_tour(wrong, upto=refusal + 1)
    assert any("statuses 400 TIER_NOT_ASSERTABLE, 201, the tour says 201, 201" in p for p in report)
    assert any("does not show 'never printed'" in p for p in report)
    code = [(400, "UNKNOWN_VOCABULARY"), (201, None)]
    wrong[refusal] = Block(found[refusal].line, found[refusal].code, code, [], "P1")
    assert any("the tour says 400 UNKNOWN_VOCABULARY" in p for p in await run_tour(wrong, upto=refusal + 1))
    broken = Block(1, 'curl -sS "$MP/discover" | jq .\necho "$NOT_SET_ANYWHERE"\n', [], [], "x")
    report = await run_tour([found[0], broken])
    assert any("shell error: not supported in this console: jq" in p for p in report)
    assert any("$NOT_SET_ANYWHERE is not set" in p for p in report)


@pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("bash") is None, reason="needs curl and bash"
)
def test_the_same_blocks_run_in_bash_against_mp_serve(tmp_path: Path):
    """The tour's promise that its commands work in a real terminal: real bash, real curl, python3 for
    `field`, against `mp serve --db :memory:`. A wrapper writes each curl's status to stderr (stdout is
    untouched), so the statuses are held to the same declarations."""
    found = blocks(TOUR.read_text())
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    wrapper = "curl() { command curl -w '%{stderr}HTTP %{http_code}\\n' \"$@\"; }\n"
    script = wrapper + "".join(
        f"echo; echo '--- block {i}'; echo '--- block {i}' >&2\n{b.code}\n" for i, b in enumerate(found)
    )
    with running_server(tmp_path, "--db", ":memory:") as (base, _proc):
        env["MP"] = base + "/mp/v0"
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outs = re.split(r"^--- block \d+\n", done.stdout, flags=re.M)[1:]
    errs = re.split(r"^--- block \d+\n", done.stderr, flags=re.M)[1:]
    assert len(outs) == len(errs) == len(found)
    for block, out, err in zip(found, outs, errs, strict=True):
        statuses = [int(s) for s in re.findall(r"^HTTP (\d{3})$", err, re.M)]
        assert statuses == [s for s, _ in block.expect], f"line {block.line}: {err}"
        other = [line for line in err.splitlines() if not line.startswith("HTTP ")]
        assert other == [], f"line {block.line}: bash said {other}"
        for text in block.shows:
            assert text in out, f"line {block.line}: {text!r} not in {out}"


def test_annotations_are_read_strictly():
    text = "x\n<!-- expect: 201, 409 LEASE_HELD -->\n<!-- shows: a b -->\n```sh\necho\n```\n"
    (only,) = blocks(text)
    assert only.expect == [(201, None), (409, "LEASE_HELD")] and only.shows == ["a b"]
    for bad in ("x\n```sh\necho\n```\n", "<!-- expect: two hundred -->\n```sh\necho\n```\n"):
        with pytest.raises(ValueError, match="tour.md line"):
            blocks(bad)


if __name__ == "__main__":  # python tests/test_tour_blocks.py: every block's output, for writing the tour

    async def _dump() -> None:
        page = Page()
        for block in blocks(TOUR.read_text()):
            got = await page.run(block)
            print(f"===== line {block.line} ({block.heading}) calls {fmt(got.calls)}")
            print("\n".join(got.output))
            for p in problems(block, got):
                print("!!", p)

    asyncio.run(_dump())
