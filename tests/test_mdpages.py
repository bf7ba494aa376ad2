"""tools/mdpages.py, the docs as pages of the site: the Markdown it renders (escaped, tables, anchors, lists),
the one rule that says which block runs (and the build failing on a block that cannot and says no reason),
and every runnable sh block of every page run in order through the page's own shell (web/curl.py) against a
real `mp serve`, its `mp` commands by the real CLI, judged as the page judges them (web/docs_check.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serverutil import ROOT, mp_command, mp_env, running_server

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "web"))
import curl  # noqa: E402
import docs_check  # noqa: E402

import build  # noqa: E402
from tools import mdpages  # noqa: E402

PAGES = {
    "README.md": "readme.html",
    "docs/serve.md": "serve.html",
    "docs/doors.md": "doors.html",
    "docs/protocol.md": "protocol.html",
}


def render(text: str, source: str = "docs/x.md") -> mdpages.Renderer:
    r = mdpages.Renderer(source, PAGES)
    r.out = r.render(text)  # type: ignore[attr-defined]
    return r


def html_of(text: str, source: str = "docs/x.md") -> str:
    return render(text, source).out  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------- rendering
def test_all_text_is_escaped():
    out = html_of(
        '# A <b>title</b>\n\nSay <script>alert(1)</script> & `<i>code</i>` [x<y](https://e.example/?a="b")\n\n'
        '```json\n{"html": "</code></pre><script>x</script>"}\n```\n\n| a<b> | c |\n|---|---|\n| <u>d</u> | e |\n'
    )
    assert "<script>" not in out and "<b>" not in out and "<i>" not in out and "<u>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp;" in out
    assert "<code>&lt;i&gt;code&lt;/i&gt;</code>" in out
    assert 'href="https://e.example/?a=&quot;b&quot;"' in out and ">x&lt;y</a>" in out
    assert "&lt;/code&gt;&lt;/pre&gt;&lt;script&gt;" in out
    assert "<th>a&lt;b&gt;</th>" in out and "<td>&lt;u&gt;d&lt;/u&gt;</td>" in out


def test_tables_with_alignment_inline_markup_and_escaped_pipes():
    out = html_of("| flag | n |\n|---|---:|\n| `--db PATH\\|URL` | **1** |\n| *x* | 2 |\n")
    assert "<table>" in out and out.count("<tr>") == 3
    assert "<td><code>--db PATH|URL</code></td>" in out  # GFM: \| is a pipe, in code spans too
    assert '<td class="right"><strong>1</strong></td>' in out and "<td><em>x</em></td>" in out


def test_headings_get_github_anchors_and_links_between_docs_point_at_pages():
    r = render(
        "# `mp serve`: the protocol\n\n## Fewer round trips: ack-and-pull\n\n## Fewer round trips: ack-and-pull\n\n"
        "See [the README](../README.md#quickstart-with-curl), [here](#mp-serve-the-protocol), "
        "[scale](scale-out.md) and <https://example.com/x>.\n"
    )
    ids = [hid for _, hid, _ in r.headings]
    assert ids == [
        "mp-serve-the-protocol",
        "fewer-round-trips-ack-and-pull",
        "fewer-round-trips-ack-and-pull-1",
    ]
    assert r.title == "mp serve: the protocol"
    out = r.out  # type: ignore[attr-defined]
    assert 'href="readme.html#quickstart-with-curl"' in out and 'href="#mp-serve-the-protocol"' in out
    # A repository file the site does not ship is named, not linked (no broken link).
    assert 'title="in the repository: docs/scale-out.md">scale</span>' in out
    assert '<a href="https://example.com/x" rel="noopener">' in out


def test_mentions_of_rendered_docs_become_links_except_in_headings_and_link_labels():
    """issue 25: a `docs/*.md` named in running text on the docs site is a link to its page, not plain text."""
    r = render(
        "## See docs/serve.md and `docs/protocol.md`\n\n"
        "Read docs/serve.md, `docs/protocol.md`, README.md and docs/doors.md. Not a page: docs/security.md, "
        "`docs/bench.md`, serve.md, mydocs/serve.md and docs/serve.mdx. "
        "[docs/serve.md](serve.md#flags) and **docs/doors.md** and `see docs/serve.md`.\n\n"
        "| where |\n|---|\n| docs/protocol.md |\n",
        "docs/x.md",
    )
    out = r.out  # type: ignore[attr-defined]
    heading, body = out.split("\n", 1)
    assert "<a href=" not in heading.split('<a class="anchor"')[0]  # no link inside a heading
    assert r.headings[0][1] == "see-docsservemd-and-docsprotocolmd"
    assert (
        'Read <a href="serve.html">docs/serve.md</a>, <a href="protocol.html"><code>docs/protocol.md</code></a>'
        in body
    )
    assert '<a href="readme.html">README.md</a> and <a href="doors.html">docs/doors.md</a>.' in body
    # Positive control beside each refusal: what names no rendered page stays text.
    assert "Not a page: docs/security.md, <code>docs/bench.md</code>, serve.md, mydocs/serve.md and" in body
    assert "docs/serve.mdx" in body and 'href="serve.htmlx' not in body
    # A link's own label is not linked again (no link in a link); bold text is; a code span that is more
    # than a path is not.
    assert '<a href="serve.html#flags">docs/serve.md</a>' in body
    assert '<strong><a href="doors.html">docs/doors.md</a></strong>' in body
    assert "<code>see docs/serve.md</code>" in body
    assert '<td><a href="protocol.html">docs/protocol.md</a></td>' in body


def test_nested_lists_quotes_and_paragraphs():
    out = html_of(
        "- one\n  continued\n- two\n  - inner *a*\n  - inner b\n- three\n\n> quoted **bold**\n\n1. first\n2. second\n"
    )
    assert out.count("<ul>") == 2 and "<li>one continued</li>" in out
    assert "<li>two\n<ul><li>inner <em>a</em></li><li>inner b</li></ul></li>" in out
    assert "<blockquote><p>quoted <strong>bold</strong></p></blockquote>" in out
    assert "<ol><li>first</li><li>second</li></ol>" in out


def test_intraword_underscores_stay_and_emphasis_works():
    out = html_of("retire_after_mute_seconds is _quiet_ and *loud* and **strong** and 2 * 3 * 4\n")
    assert "retire_after_mute_seconds" in out and "<em>quiet</em>" in out and "<em>loud</em>" in out
    assert "<strong>strong</strong>" in out and "2 * 3 * 4" in out


# ------------------------------------------------------------------------------------------- the rule
def test_sh_blocks_that_cannot_run_fail_the_build_unless_they_say_why():
    with pytest.raises(mdpages.DocsError, match=r"docs/x\.md:3: this sh block cannot run.*python3.*norun"):
        render("text\n\n```sh\npython3 build.py serve\n```\n")
    with pytest.raises(mdpages.DocsError, match="mp watch follows the feed"):
        render("```sh\nmp watch sub-1 --token t\n```\n")
    r = render("<!-- norun: it builds the site on your machine -->\n```sh\npython3 build.py serve\n```\n")
    (b,) = r.blocks
    assert (b.kind, b.reason) == ("show", "it builds the site on your machine")
    out = r.out  # type: ignore[attr-defined]
    assert "Not run in this page:</strong> it builds the site on your machine" in out and "<button" not in out


def test_runnable_blocks_get_a_run_button_and_their_expectations():
    r = render(
        "<!-- expect: 201, 409 DUPLICATE -->\n<!-- shows: owner token -->\n```sh\n"
        'X=$(curl -sS -X POST "$MP/monitors" -d "{}")\ncurl -s "$MP/discover" | field \'["a"]\'\n```\n\n'
        "```sh\ncurl -sS --fail-with-body $MP/discover\n```\n\n"
        "<!-- shows: hi -->\n```python\nfrom monitor_protocol.client import Client\nprint('hi')\n```\n\n"
        "```json\n{}\n```\n\n```\nmp serve\n```\n"
    )
    kinds = [(b.kind, b.lang) for b in r.blocks]
    assert kinds == [("sh", "sh"), ("sh", "sh"), ("python", "python"), ("show", "json"), ("show", "")]
    assert r.blocks[0].expect == [(201, None), (409, "DUPLICATE")] and r.blocks[0].shows == ["owner token"]
    out = r.out  # type: ignore[attr-defined]
    assert out.count('class="run"') == 3
    assert 'data-fail="1"' in out.split('id="block-2"')[1].split("</figure>")[0]
    assert 'data-fail="1"' not in out.split('id="block-1"')[1].split("</figure>")[0]


def test_a_runnable_python_block_must_say_what_it_prints():
    with pytest.raises(mdpages.DocsError, match="must say what it prints"):
        render("```python\nfrom monitor_protocol.client import Client\n```\n")
    assert (
        render("<!-- shows: x -->\n```python\nimport monitor_protocol.client\n```\n").blocks[0].kind
        == "python"
    )


def test_python_blocks_without_the_client_and_misplaced_notes_fail():
    with pytest.raises(mdpages.DocsError, match="does not use monitor_protocol.client"):
        render("```python\nimport os\n```\n")
    with pytest.raises(mdpages.DocsError, match="right before the code block"):
        render("<!-- norun: why -->\n\nA paragraph.\n\n```sh\necho hi\n```\n")
    with pytest.raises(mdpages.DocsError, match="never runs anyway"):
        render("<!-- norun: why -->\n```json\n{}\n```\n")
    with pytest.raises(mdpages.DocsError, match="STATUS"):
        render("<!-- expect: two hundred -->\n```sh\necho hi\n```\n")


def test_a_doc_the_build_refuses_fails_build_py(tmp_path, monkeypatch):
    """Positive control of the rule inside the real build: a bad block stops site_pages with its reason."""
    root = tmp_path
    (root / "web").mkdir()
    (root / "web" / "docs.html").write_text((ROOT / "web" / "docs.html").read_text())
    (root / "docs").mkdir()
    for src in ("docs/serve.md", "docs/doors.md", "docs/protocol.md", "docs/embedding.md"):
        (root / src).write_text("# ok\n")
    (root / "README.md").write_text("# Readme\n\n```sh\nls -la\n```\n")
    with pytest.raises(mdpages.DocsError, match=r"README\.md:3: .*the command 'ls'"):
        mdpages.site_pages("w.whl", build.page_with_modules, root=root)
    (root / "README.md").write_text("# Readme\n\n<!-- norun: lists your files -->\n```sh\nls -la\n```\n")
    files = mdpages.site_pages("w.whl", build.page_with_modules, root=root)
    assert {"docs/readme.html", "docs/serve.html", "docs/doors.html", "docs/index.html"} <= set(files)
    assert "docs/protocol.html" in files  # required: the build fails without the contract
    assert "docs/tour.html" not in files  # optional, and absent here
    (root / "docs" / "protocol.md").unlink()
    with pytest.raises(FileNotFoundError, match="protocol.md"):
        mdpages.site_pages("w.whl", build.page_with_modules, root=root)


# ------------------------------------------------------------------------------------------- the real docs
@pytest.fixture(scope="module")
def site() -> dict:
    return mdpages.site_pages("monitor_protocol-0-py3-none-any.whl", build.page_with_modules)


def test_every_page_of_the_real_docs_renders_with_its_engine_namespace(site):
    names = [n for n, s, optional in mdpages.PAGES if not optional or (ROOT / s).is_file()]
    static = set()
    for name, source in [(n, s) for n, s, o in mdpages.PAGES if n in names]:
        page = site[f"docs/{name}.html"].decode()
        assert f'data-mp-ns="docs-{name}"' in page and "__" not in re.sub(r"__pycache__", "", page)
        assert (
            'href="../index.html">Playground</a>' in page and f"Rendered from <code>{source}</code>" in page
        )
        if any(b.kind != "show" for b in doc_blocks(source)):
            assert '"../docs_ui.py": "./docs_ui.py"' in page  # PyScript fetches one folder up
            assert 'src="../docs_page.py"' in page and 'id="reset-btn"' in page
        else:  # nothing to run: plain HTML, no engine to boot
            assert "pyscript" not in page and "docs_page.py" not in page and 'id="reset-btn"' not in page
            static.add(name)
    # the contract is a reference, and embedding's blocks are for another page or a terminal; every other
    # page runs its examples
    assert static == {"protocol", "embedding"}
    index = site["docs/index.html"].decode()
    assert "pyscript" not in index and all(f'href="./{n}.html"' in index for n in names)
    readme = site["docs/readme.html"].decode()
    assert 'src="img/screenshot-story.png"' in readme and site["docs/img/screenshot-story.png"].is_file()
    # The two micropip lines with this site's wheel, right before the first Python block.
    assert re.search(
        r'await micropip.install\("<span class="wheel-url" data-wheel="\.\./pyodide/monitor_protocol-0-py3',
        readme,
    )
    assert readme.index('class="micropip"') < readme.index('data-kind="python"')


def test_links_between_the_real_docs_reach_existing_anchors(site):
    ids = {}
    for key, data in site.items():
        if key.endswith(".html"):
            ids[key.split("/")[-1]] = set(re.findall(r'<h\d id="([^"]+)"', data.decode()))
    seen = 0
    for key, data in site.items():
        if not key.endswith(".html"):
            continue
        text = data.decode()
        for href in re.findall(r'<a href="([^"#:]+\.html)#([^"]+)"', text):
            page, anchor = href
            assert anchor in ids[page], f"{key} links to {page}#{anchor}, which has no such heading"
            seen += 1
        for anchor in re.findall(r'<a href="#([^"]+)"', text):  # within the page (the TOC, "section 8")
            assert anchor in ids[key.split("/")[-1]] | {"doc"}, f"{key} links to #{anchor}, not on the page"
    assert seen >= 10  # README -> protocol.html#11-conformance, serve -> protocol.html#10-http-hardening, ...
    readme = site["docs/readme.html"].decode()
    assert '<a href="protocol.html#11-conformance">docs/protocol.md section 11</a>' in readme


def doc_blocks(source: str) -> list[mdpages.Block]:
    r = mdpages.Renderer(source, {s: f"{n}.html" for n, s, _ in mdpages.PAGES})
    r.render((ROOT / source).read_text())
    return r.blocks


def test_every_sh_and_python_block_of_the_real_docs_runs_or_says_why():
    for _name, source, optional in mdpages.PAGES:
        if optional and not (ROOT / source).is_file():
            continue
        for b in doc_blocks(source):
            if b.lang in mdpages.SH_LANGS | mdpages.PY_LANGS:
                assert b.kind != "show" or b.reason, f"{source}:{b.line}"
    readme = doc_blocks("README.md")
    # the two micropip lines are shown (the runner runs them itself), the client example runs
    python = [b for b in readme if b.lang == "python"]
    assert [b.kind for b in python] == ["show", "python"] and "micropip.install" in python[0].code
    assert (
        sum(b.kind == "sh" for b in readme) == 7 and readme[0].reason
    )  # the quickstart; build.py serve/test


# ------------------------------------------------------------------------------------------- the checks
def test_the_verdict_follows_the_docs():
    ok = docs_check.Run(requests=[(201, None), (400, "TIER_NOT_ASSERTABLE")], text="owner token: x")
    assert docs_check.verdict(ok, [(201, None), (400, "TIER_NOT_ASSERTABLE")], ["owner token"])[0]
    assert not docs_check.verdict(ok, [(201, None), (400, "INVALID")], [])[0]
    assert not docs_check.verdict(ok, [(201, None)], [])[0]
    assert not docs_check.verdict(ok, [], [])[0]  # a refusal the docs do not announce
    assert not docs_check.verdict(ok, [(201, None), (400, None)], ["not there"])[0]
    assert not docs_check.verdict(docs_check.Run(requests=[(200, None)], errors=["boom"]), [], [])[0]
    assert not docs_check.verdict(docs_check.Run(exits=[0, 5]), [], [])[0]
    assert docs_check.verdict(docs_check.Run(requests=[(200, None)], exits=[0]), [], [])[1].startswith(
        "ran as"
    )


# ------------------------------------------------------------------------------------------- the blocks, live
class LiveShell:
    """curl.Shell as a docs page makes it, against a real `mp serve`: curl by HTTP, `mp` by the real CLI."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.lines: list[tuple[str, str, dict]] = []
        self.run_: docs_check.Run | None = None
        self.shell = curl.Shell(
            base, self.fetch, self.emit, {"MP": "http://127.0.0.1:8130/mp/v0"}, cli=self.cli
        )

    async def fetch(self, call: curl.CurlCall) -> tuple[int, str]:
        r = httpx.request(call.method, call.url, headers=call.headers, content=call.body, timeout=60)
        return r.status_code, r.text

    async def cli(self, argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str, str]:
        done = subprocess.run(
            mp_command(*argv),
            input=stdin,
            capture_output=True,
            text=True,
            env=mp_env() | {"MP_BASE": self.base} | env,
            timeout=60,
        )
        return done.returncode, done.stdout, done.stderr

    def emit(self, kind: str, text: str, extra: dict) -> None:
        self.lines.append((kind, text, extra))
        run = self.run_
        if kind == "out":
            run.text += text
        elif kind == "error":
            run.errors.append(text)
        elif kind == "exit":
            run.exits.append(int(extra["exit"]))
        elif kind == "http":
            data = extra["data"]
            code = data.get("code") if isinstance(data, dict) and extra["status"] >= 400 else None
            run.requests.append((int(extra["status"]), code))
            run.text += (json.dumps(data, indent=2) if data is not None else text) + "\n"

    def run(self, code: str) -> docs_check.Run:
        self.run_ = docs_check.Run()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright may own this thread's loop
            pool.submit(asyncio.run, self.shell.run(code)).result()
        return self.run_


@pytest.mark.parametrize("source", ["README.md", "docs/serve.md", "docs/doors.md"])
def test_every_runnable_sh_block_runs_in_order_as_the_docs_say(tmp_path: Path, source: str):
    blocks = [b for b in doc_blocks(source) if b.kind == "sh"]
    assert blocks
    with running_server(tmp_path, "--db", ":memory:") as (base, _proc):
        live = LiveShell(base)
        for b in blocks:
            run = live.run(html.unescape(b.code))
            ok, why = docs_check.verdict(run, b.expect, b.shows)
            assert ok, f"{source}:{b.line}: {why}\n{live.lines[-12:]}"
            if re.search(r"--fail-with-body", b.code):
                assert run.requests and all(200 <= s < 300 for s, _ in run.requests)
        # Positive control: the blocks really changed the server (the monitor they create is there).
        listed = httpx.get(base + "/mp/v0/monitors", timeout=10).json()
        owner = live.shell.env.get("OWNER") or live.shell.env.get("MP_OWNER_TOKEN")
        seen = httpx.get(
            base + "/mp/v0/monitors/ci", headers={"Authorization": f"Bearer {owner}"}, timeout=10
        )
        assert seen.status_code == 200 and seen.json()["id"] == "ci", (listed, seen.text)
    if source == "docs/doors.md":  # the mp commands ran (the real CLI), with the tokens the blocks printed
        assert live.run_ is not None and len(live.run_.exits) == 7 and set(live.run_.exits) == {0}
        assert "complete ok" in live.run_.text


def test_the_playground_console_still_refuses_mp_and_export():
    """Without a `cli` callback (the playground's curl tab) mp and export stay outside the subset, by name."""
    lines: list[tuple[str, str, dict]] = []

    async def no_fetch(call):  # never reached: the refusals come before anything is sent
        raise AssertionError(call)

    shell = curl.Shell("http://127.0.0.1:1", no_fetch, lambda k, t, x: lines.append((k, t, x)))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, shell.run("mp monitors list\nexport A=1")).result()
    errors = [t for k, t, _ in lines if k == "error"]
    assert len(errors) == 2 and "the command 'mp' here" in errors[0] and "the command 'export'" in errors[1]
    assert shell.env == {} and shell.exported == set()
    assert curl.why_not_runnable("mp monitors list", with_cli=False) is not None
    assert curl.why_not_runnable("export A=$(mp monitors list --json)") is None
    assert "mp serve listens" in curl.why_not_runnable("X=$(mp serve --db :memory:)")
