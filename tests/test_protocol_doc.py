"""docs/protocol.md, the protocol in the repository (issue 24): it exists with the protocol's own numbering
(sections 1-12, P1-P14, C01-C34 and C20b) so every section reference stays valid; its tables say what the
code does (vocabularies, error codes and their JSON-RPC numbers, routes, MCP tools, discover's limits); no
file points to a protocol file that a clone does not have; the links of the Markdown (as GitHub shows it)
and of the built docs site reach a file and a heading that exist.

The protocol file that used to be cited lived beside the repository, not in it; its name is spelled below
as OLD_NAME, in two pieces, so that this file does not cite it itself."""

from __future__ import annotations

import argparse
import html.parser
import posixpath
import re
import sys
from pathlib import Path

import pytest
from serverutil import ROOT

sys.path.insert(0, str(ROOT))
from monitor_protocol.api import operations
from monitor_protocol.cli import COMMANDS, build_parser  # noqa: E402
from monitor_protocol.core import vocab  # noqa: E402
from monitor_protocol.core.service import MonitorService  # noqa: E402
from monitor_protocol.store.memory import MemoryStore  # noqa: E402

import build  # noqa: E402
from tools import mdpages  # noqa: E402

DOC = ROOT / "docs" / "protocol.md"
OLD_NAME = "PROTOCOL" + ".md"


# ------------------------------------------------------------------------------------------- reading the doc
def lines_outside_code(text: str) -> list[str]:
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            fence = None if fence and m.group(1)[0] == fence else (fence or m.group(1)[0])
            continue
        if fence is None:
            out.append(line)
    return out


def section(text: str, number: int) -> str:
    """The Markdown of section `number` (its `## N.` heading up to the next `## `)."""
    m = re.search(rf"^## {number}\. .*?(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section {number}"
    return m.group(0)


def table_rows(markdown: str, first_header: str) -> list[list[str]]:
    """The body rows of the first table whose first header cell is `first_header`, as stripped cells."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        cells = mdpages.split_row(line) if line.startswith("|") else []
        if cells and cells[0].strip() == first_header and i + 1 < len(lines):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in mdpages.split_row(row)])
            return rows
    raise AssertionError(f"no table starting with {first_header!r}")


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


# ------------------------------------------------------------------------------------------- (a) the structure
def test_the_protocol_is_in_the_repository_with_sections_1_to_12_in_order(doc):
    h2 = [line for line in lines_outside_code(doc) if line.startswith("## ")]
    numbers = [re.match(r"^## (\d+)\. \S", h) for h in h2]
    assert all(numbers), f"every section heading starts with its number and a full stop: {h2}"
    assert [int(m.group(1)) for m in numbers] == list(range(1, 13)), h2
    assert doc.startswith("# The Monitor Protocol v0")
    # The anchors other docs link to: GitHub's ids, which the site's renderer gives too.
    r = mdpages.Renderer("docs/protocol.md", {})
    r.render(doc)
    ids = [hid for level, hid, _ in r.headings if level == 2]
    assert [i.split("-")[0] for i in ids] == [str(n) for n in range(1, 13)]
    assert "5-rest-binding" in ids and "11-conformance" in ids and "10-http-hardening" in ids
    # Section 12 is this project's extension, and says so.
    s12 = section(doc, 12)
    assert s12.startswith("## 12. Sources that watch (extension)") and "**Extension.**" in s12


def test_sources_that_watch_are_described_as_they_exist(doc):
    """Section 12 names the commands, flags and row type the code has, and claims none it has not."""
    from monitor_protocol.core.sources import SETTINGS_KEYS
    from monitor_protocol.core.vocab import T_SOURCE

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "probe" in COMMANDS and "probe" in sub.choices
    serve_options = set(sub.choices["serve"]._option_string_actions)
    s12 = section(doc, 12)
    for flag in ("--sources", "--allow-source", "--source-rate", "--allow-sink"):
        assert flag in serve_options and flag in s12, flag
    assert f"`{T_SOURCE}`" in s12
    for key in SETTINGS_KEYS:
        assert f"`{key}`" in s12, f"settings.{key} is read by the code but not in section 12"
    for gone in ("not in this release", "being built", "will also run"):
        assert gone not in s12, gone


def test_principles_p1_to_p14_in_order(doc):
    rows = table_rows(section(doc, 2), "id")
    assert [r[0] for r in rows] == [f"P{n}" for n in range(1, 15)]
    assert all(len(r[1]) > 20 for r in rows)


def test_the_published_checklist_keeps_its_ids_and_the_project_checks_exist(doc):
    s11 = section(doc, 11)
    ids = [r[0] for r in table_rows(s11, "id")]
    expected = [f"C{n:02d}" for n in range(1, 35) if n != 31]
    expected.insert(expected.index("C20") + 1, "C20b")
    assert ids == expected
    from monitor_protocol.conformance.checks import CHECKS

    registry = {c.id for c in CHECKS}
    assert set(ids) <= registry
    named = set(re.findall(r"\bX\d{2}\b", s11))
    spans = re.findall(r"\b(X\d{2}) to (X\d{2})\b", s11)
    for a, b in spans:
        named |= {f"X{n:02d}" for n in range(int(a[1:]), int(b[1:]) + 1)}
    assert named and named <= registry, named - registry


def test_the_vocabularies_are_the_codes(doc):
    rows = {r[0]: ticked(r[1]) for r in table_rows(section(doc, 3), "name")}
    assert rows["horizon"] == list(vocab.HORIZONS)
    assert rows["capability"] == list(vocab.CAPABILITIES)
    assert rows["tier"] == list(vocab.TIERS)
    assert rows["origin"] == list(vocab.ORIGINS)
    assert rows["verification (the field `verified`)"] == list(vocab.VERIFICATIONS)
    assert rows["visibility"] == list(vocab.VISIBILITIES)
    assert rows["source.kind"] == list(vocab.SOURCE_KINDS)
    assert rows["reset_policy"] == list(vocab.RESET_POLICIES)
    assert rows["subscription protocol"] == list(vocab.PROTOCOLS)
    assert rows["observation type"] == [vocab.TYPE_REGEX]
    assert rows["monitor id"] == [vocab.MONITOR_ID_REGEX]
    assert [p.rstrip(":") for p in rows["actor"] if p.endswith(":")] == list(vocab.ACTOR_PREFIXES)


def test_the_error_table_is_the_codes_their_statuses_and_jsonrpc_numbers(doc):
    rows = table_rows(section(doc, 3), "code")
    assert [r[0] for r in rows] == list(vocab.JSONRPC_ORDER)  # in the order that numbers them
    assert {r[0]: int(r[1]) for r in rows} == vocab.ERROR_STATUS
    assert {r[0]: int(r[2]) for r in rows} == vocab.JSONRPC_CODE


def test_every_route_and_jsonrpc_method_and_mcp_tool_is_in_the_doc(doc):
    for op in operations.OPERATIONS:
        route = op.route.replace("{action}", op.action or "{action}")
        assert f"`{op.method} {route}" in doc, f"{op.method} {route} ({op.name}) is not in docs/protocol.md"
    s5 = section(doc, 5)
    row = next(r for r in table_rows(s5, "route") if r[0] == "`POST /rpc`")
    methods = set()
    for group, names in re.findall(r"`(\w+)/\{([\w,]+)\}`", row[3]):
        methods |= {f"{group}/{n}" for n in names.split(",")}
    assert methods == set(operations.BY_JSONRPC)
    s9 = section(doc, 9)
    mcp = s9[s9.index("### MCP") : s9.index("### HTTP push")]
    named = set(re.findall(r"\b((?:monitor|lease)_[a-z_]+)\b", mcp))
    assert named == {t.tool.name for t in operations.mcp_tools()}


def test_discover_limits_and_extensions_are_the_servers(doc):
    served = MonitorService(MemoryStore()).discover()
    rows = table_rows(section(doc, 5), "limit")
    seen = set()
    for names_cell, value_cell in rows:
        names = ticked(names_cell)
        values = [value_cell] if len(names) == 1 else value_cell.split(", ")
        assert len(values) == len(names), (names_cell, value_cell)
        for name, value in zip(names, values, strict=True):
            seen.add(name)
            actual = served["limits"][name]
            if isinstance(actual, bool):
                continue
            if isinstance(actual, dict):
                assert value == "`{" + ", ".join(f"{k}: {v}" for k, v in actual.items()) + "}`", name
            else:
                assert int(re.findall(r"\d+", value)[-1]) == actual, (name, value, actual)
    assert seen == set(served["limits"]), set(served["limits"]) ^ seen
    for ext in served["capabilities"]["extensions"]:
        assert f"`{ext}`" in doc, ext
    assert served["supportedVersions"] == ["0.1"] and 'supportedVersions:["0.1"]' in doc
    assert f"`{vocab.PROTOCOL_PREFIX}`" in doc and f"`{vocab.EXTENSION_ID}`" in doc


def test_state_gaps_and_confidence_inputs_are_the_codes(doc):
    s4 = section(doc, 4)
    gaps = re.findall(r"^\s+\d\. `(\w+)`", s4, re.M)
    assert gaps == list(vocab.GAPS_ORDER)
    for name in (*vocab.CONFIDENCE_PRESENT, *vocab.CONFIDENCE_MISSING):
        assert f"`{name}`" in s4


# ------------------------------------------------------------------------------------------- (b) stale citations
SKIP_DIRS = {
    ".git",
    ".venv",
    ".cache",
    "dist",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".hypothesis",
}


def released_part(path: Path, text: str) -> int:
    """Where the history of CHANGELOG.md begins (its first released version): earlier entries describe
    what was true then and are left as written."""
    if path.name != "CHANGELOG.md":
        return len(text)
    m = re.search(r"^## \d", text, re.M)
    return m.start() if m else len(text)


def stale_citations(root: Path, within: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[str]:
    """`file:line` of every mention of the old protocol file under `root` (only `within`, when given;
    never `skip`), as bytes so that any file type is read."""
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(part in SKIP_DIRS for part in path.relative_to(root).parts) or not path.is_file():
            continue
        if within and not any(rel == w or rel.startswith(w + "/") for w in within):
            continue
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        data = path.read_bytes()
        if OLD_NAME.encode() not in data:
            continue
        text = data.decode("utf-8", "replace")
        end = released_part(path, text)
        for m in re.finditer(re.escape(OLD_NAME), text[:end]):
            found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    return found


def test_the_scan_finds_a_stale_citation(tmp_path):
    """Positive control of the scan: a planted citation is found, history in CHANGELOG.md is not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(f"fine\nsee {OLD_NAME} section 5\n")
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.py").write_bytes(b"\x00\x01 " + OLD_NAME.encode())
    (tmp_path / "CHANGELOG.md").write_text(f"## Unreleased\n- {OLD_NAME}\n\n## 0.1.0\n- {OLD_NAME} 1-8\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.md").write_text(OLD_NAME)
    (tmp_path / "docs" / "protocol.md").write_text("docs/protocol.md section 5\n")
    assert stale_citations(tmp_path) == ["CHANGELOG.md:2", "docs/x.md:2", "web/a.py:1"]
    assert stale_citations(tmp_path, skip=("docs/x.md",)) == ["CHANGELOG.md:2", "web/a.py:1"]


def test_nothing_in_the_repository_cites_a_protocol_file_a_clone_lacks():
    """The engine, tests, README.md, docs/, web/, tools/, build.py, schemas/, e2e/, deploy/, bench/,
    CHANGELOG.md's unreleased part: every citation of the protocol names docs/protocol.md."""
    assert DOC.is_file()
    stale = stale_citations(ROOT)
    assert stale == [], f"cite docs/protocol.md instead: {stale}"


# ------------------------------------------------------------------------------------------- (c) links
def heading_ids(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (the site's renderer uses the same rule)."""
    r = mdpages.Renderer(path.relative_to(ROOT).as_posix(), {})
    ids = set()
    for line in lines_outside_code(path.read_text()):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            ids.add(r.slug(r.inline(m.group(2), autolink=False)))
    return ids


MD_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_markdown_links_reach_a_file_and_a_heading_as_github_shows_them():
    """Every relative link of README.md and docs/*.md names a file of the repository and, with an #anchor
    into a Markdown file, one of its headings: so README's links into docs/protocol.md land on the heading
    on GitHub as on the site."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = into_protocol = 0
    for src in sources:
        text = "\n".join(lines_outside_code(src.read_text()))
        text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
        for href in MD_LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I):
                continue
            path, _, frag = href.partition("#")
            target = (src.parent / path).resolve() if path else src
            assert target.exists(), f"{src.relative_to(ROOT)}: {href} names no file"
            if frag and target.suffix == ".md":
                assert frag in heading_ids(target), f"{src.relative_to(ROOT)}: {href}: no such heading"
                into_protocol += target == DOC
            checked += 1
    assert checked > 50 and into_protocol >= 10, (checked, into_protocol)


class Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.refs.append(value)
            elif name == "id" and value:
                self.ids.add(value)


def parse(path: Path) -> Links:
    p = Links()
    p.feed(path.read_text())
    return p


def broken_links(site: Path, pages: list[Path]) -> list[str]:
    """Every relative href/src of `pages` that names no file of `site`, or an #anchor no element has."""
    broken = []
    for page in pages:
        here = page.relative_to(site).as_posix()
        links = parse(page)
        for ref in links.refs:
            if re.match(r"^[a-z][a-z0-9+.-]*:", ref, re.I):  # https:, data:, mailto:
                continue
            path, _, frag = ref.partition("#")
            path = path.split("?")[0]
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(here), path)) if path else here
            target = site / rel
            if not target.is_file():
                broken.append(f"{here}: {ref} (no {rel} in the site)")
            elif frag and target.suffix == ".html" and frag not in parse(target).ids:
                broken.append(f"{here}: {ref} (no id {frag!r} in {rel})")
    return broken


def test_the_link_check_finds_broken_links(tmp_path):
    """Positive control: a missing page and a missing anchor are both reported; good links are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.html").write_text(
        '<h2 id="x">x</h2><a href="b.html#y">ok</a> <a href="#x">ok</a> <a href="https://e.example/">ok</a>'
        '<a href="c.html">no page</a> <a href="b.html#nope">no anchor</a> <img src="../img.png">'
    )
    (tmp_path / "docs" / "b.html").write_text('<h2 id="y">y</h2>')
    assert broken_links(tmp_path, [tmp_path / "docs" / "a.html"]) == [
        "docs/a.html: c.html (no docs/c.html in the site)",
        "docs/a.html: b.html#nope (no id 'nope' in docs/b.html)",
        "docs/a.html: ../img.png (no img.png in the site)",
    ]


@pytest.fixture(scope="module")
def built_site() -> Path:
    return build.build()  # what `python3 build.py build` makes (dist/site), brought up to date


def test_every_link_of_the_built_docs_site_reaches_a_file_and_an_anchor(built_site):
    pages = sorted((built_site / "docs").glob("*.html"))
    names = {p.name for p in pages}
    assert {"index.html", "readme.html", "protocol.html", "serve.html", "doors.html"} <= names
    assert broken_links(built_site, [*pages, built_site / "index.html"]) == []
    # The README's links into the protocol land on its headings, and the playground's point at its page.
    readme = parse(built_site / "docs" / "readme.html").refs
    assert "protocol.html#11-conformance" in readme and "protocol.html" in readme
    playground = parse(built_site / "index.html").refs
    assert "./docs/protocol.html" in playground and "./docs/protocol.html#11-conformance" in playground
    protocol = (built_site / "docs" / "protocol.html").read_text()
    assert "pyscript" not in protocol  # a reference page starts no engine


def test_the_built_site_cites_no_missing_protocol_file(built_site):
    """The site's own pages and modules; openapi.json and the engine's wheel carry the engine's strings
    (the xfail test above)."""
    assert stale_citations(built_site, skip=("openapi.json", "pyodide")) == []
