"""The project's docs as pages of the site, every code block runnable in the page or saying why.

Standard library only (build.py imports it). `site_pages()` renders README.md, docs/tour.md (when it
exists), docs/protocol.md, docs/serve.md, docs/doors.md and docs/embedding.md into `docs/<name>.html` with
web/docs.html as the template, plus an index page, and returns them as build.py's `files` entries. A page
with nothing to run (docs/protocol.md, docs/embedding.md) is served without the page's engine, like the
index: nothing to boot, nothing to wait for.

The Markdown is the subset these docs use: ATX headings (with GitHub-style ids for anchors), paragraphs,
nested lists, tables, block quotes, fenced code blocks with a language, inline code, bold, italic, links
and images (a link to another rendered doc points at its page, its #anchor kept; any other relative link
names the file in the repository, since the site does not ship it). A mention of a rendered doc by its
repository path in plain text or in a code span (`docs/serve.md`, README.md) becomes a link to its page too,
except inside headings and link labels. Heading ids are GitHub's, so a link written for GitHub
(`protocol.md#8-delivery`) lands on the same heading here. All text is HTML-escaped; the only HTML let
through is a lone `<img src alt width>` line, rebuilt from its attributes.

Every fenced block is classified by `classify()`, the one rule: an `sh` block runs through the curl
console's shell (web/curl.py `Shell`, with `mp` forwarded to the real CLI in a Pyodide worker), a `python`
block that imports `monitor_protocol.client` runs in that worker, and any other block is shown without Run.
An sh or python block that cannot run in a page must say why in an annotation right before it,
`<!-- norun: the reason -->`, or the build fails naming the file and line. `<!-- expect: 201, 400 CODE -->`
(one status, optionally a code, per HTTP request of the block) and `<!-- shows: text -->` (text the output
contains) declare what a run must give: the page checks them, and so do the tests.
"""

from __future__ import annotations

import html
import json
import posixpath
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (page name, source file): the order of the index. A missing optional source is skipped.
PAGES = [
    ("readme", "README.md", False),
    ("tour", "docs/tour.md", True),
    ("protocol", "docs/protocol.md", False),
    ("serve", "docs/serve.md", False),
    ("doors", "docs/doors.md", False),
    ("embedding", "docs/embedding.md", False),
]
SH_LANGS = {"sh", "bash", "shell", "zsh"}
PY_LANGS = {"python", "py", "python3"}
CLIENT_IMPORT = re.compile(
    r"^\s*(?:from\s+monitor_protocol\.client\s+import|import\s+monitor_protocol\.client)", re.M
)
IMAGE_EXT = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp"}
# A repository path of a Markdown file named in running text ("see docs/serve.md"): linked when it is a page.
MENTION = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w.-]+\.md)(?![\w/-])")


class DocsError(ValueError):
    """A doc the build cannot turn into a page: the message names the file, the line and what to write."""


def _curl():
    """web/curl.py, the page's shell: its static check says whether an sh block can run in the page."""
    web = str(ROOT / "web")
    sys.path.insert(0, web)
    try:
        import curl
    finally:
        sys.path.remove(web)
    return curl


# ------------------------------------------------------------------------------------------------ blocks
@dataclass
class Block:
    n: int  # 1-based, in page order
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    kind: str = "show"  # "sh" | "python" | "show"
    reason: str = ""  # why an sh/python block does not run here
    expect: list[tuple[int, str | None]] = field(default_factory=list)
    shows: list[str] = field(default_factory=list)


def classify(lang: str, code: str, notes: dict[str, list[str]], where: str) -> tuple[str, str]:
    """(kind, reason) of one fenced block: THE rule of what runs in a page. Raises DocsError for an sh or
    python block that cannot run and has no `<!-- norun: ... -->` reason."""
    norun = " ".join(notes.get("norun", [])).strip()
    lang = lang.lower()
    if lang in SH_LANGS:
        if norun:
            return "show", norun
        why = _curl().why_not_runnable(code)
        if why is None:
            return "sh", ""
        raise DocsError(
            f"{where}: this sh block cannot run in a page ({why}); make it runnable, or say why right before "
            "it: <!-- norun: the reason a reader sees -->"
        )
    if lang in PY_LANGS:
        if norun:
            return "show", norun
        if CLIENT_IMPORT.search(code):
            if not notes.get("shows"):  # a Python run is judged on what it prints: say what that is
                raise DocsError(
                    f"{where}: a python block that runs must say what it prints, right before it: "
                    "<!-- shows: a line of its output -->"
                )
            return "python", ""
        raise DocsError(
            f"{where}: this python block does not use monitor_protocol.client, so the page cannot run it; say "
            "why right before it: <!-- norun: the reason a reader sees -->"
        )
    if norun:
        raise DocsError(f"{where}: a norun note before a {lang or 'plain'} block, which never runs anyway")
    return "show", ""


EXPECT_ITEM = re.compile(r"^\s*(\d{3})(?:\s+([A-Z][A-Z_]*))?\s*$")


def parse_expect(text: str, where: str) -> list[tuple[int, str | None]]:
    out = []
    for item in text.split(","):
        m = EXPECT_ITEM.match(item)
        if m is None:
            raise DocsError(
                f"{where}: <!-- expect: {text} --> should list `STATUS [CODE]` per request, e.g. 201, 409 DUPLICATE"
            )
        out.append((int(m.group(1)), m.group(2)))
    return out


# ------------------------------------------------------------------------------------------------ inline
INLINE = re.compile(
    r"""(?P<code>(?P<ticks>`+)(?P<ctext>.+?)(?P=ticks))
    |(?P<img>!\[(?P<ialt>[^\]]*)\]\((?P<isrc>[^)\s]+)\))
    |(?P<link>\[(?P<ltext>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<lhref>[^)\s]+)(?:\s+"[^"]*")?\))
    |(?P<auto><(?P<aurl>https?://[^>\s]+)>)
    |(?P<bold>\*\*(?P<btext>\S(?:.*?\S)?)\*\*)
    |(?P<em>(?<![\w*])\*(?P<etext>[^*\s](?:[^*]*[^*\s])?)\*(?![\w*]))
    |(?P<em2>(?<![\w])_(?P<e2text>[^_\s](?:[^_]*[^_\s])?)_(?!\w))
    |(?P<esc>\\(?P<echar>[\\`*_{}\[\]()#+\-.!|<>]))""",
    re.X | re.S,
)


class Renderer:
    """One Markdown file to HTML; collects its code blocks, headings and the images it needs."""

    def __init__(self, source: str, pages: dict[str, str]) -> None:
        self.source = source  # path in the repository, e.g. docs/serve.md
        self.pages = pages  # repository path -> page file name (serve.html)
        self.blocks: list[Block] = []
        self.ids: dict[str, int] = {}
        self.headings: list[tuple[int, str, str]] = []  # (level, id, text)
        self.assets: dict[str, Path] = {}  # site path under docs/ -> repository file
        self.title = ""

    # ------------------------------------------------------------------ links
    def resolve(self, href: str) -> tuple[str | None, str]:
        """(href for the page or None, the repository path it names)."""
        if href.startswith("#") or re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I):
            return href, href
        path, _, frag = href.partition("#")
        target = posixpath.normpath(posixpath.join(posixpath.dirname(self.source), path))
        if target in self.pages:
            return self.pages[target] + (f"#{frag}" if frag else ""), target
        return None, target

    def mentioned(self, path: str) -> str | None:
        """The page of a rendered doc named by its repository path (`docs/serve.md`), else None."""
        page = self.pages.get(path)
        return page if page is not None and path.endswith(".md") else None

    def text(self, raw: str, autolink: bool) -> str:
        """Plain text, escaped; with `autolink`, each repository path of a rendered doc becomes its link."""
        if not autolink:
            return html.escape(raw, quote=False)
        out = []
        pos = 0
        for m in MENTION.finditer(raw):
            page = self.mentioned(m.group(1))
            if page is None:
                continue
            out.append(html.escape(raw[pos : m.start()], quote=False))
            out.append(f'<a href="{html.escape(page)}">{html.escape(m.group(1), quote=False)}</a>')
            pos = m.end()
        out.append(html.escape(raw[pos:], quote=False))
        return "".join(out)

    def inline(self, text: str, autolink: bool = True) -> str:
        """Inline Markdown to HTML. `autolink` is off inside headings and link labels (no link in a link)."""
        out = []
        pos = 0
        for m in INLINE.finditer(text):
            out.append(self.text(text[pos : m.start()], autolink))
            pos = m.end()
            if m.group("code") is not None:
                c = m.group("ctext")
                if c.startswith(" ") and c.endswith(" ") and c.strip():
                    c = c[1:-1]
                code = f"<code>{html.escape(c, quote=False)}</code>"
                page = self.mentioned(c) if autolink else None
                out.append(f'<a href="{html.escape(page)}">{code}</a>' if page else code)
            elif m.group("img") is not None:
                out.append(self.image(m.group("isrc"), m.group("ialt"), None))
            elif m.group("link") is not None:
                label = self.inline(m.group("ltext"), autolink=False)
                href, target = self.resolve(m.group("lhref"))
                if href is None:
                    out.append(
                        f'<span class="repo-link" title="in the repository: {html.escape(target)}">{label}</span>'
                    )
                else:
                    ext = ' rel="noopener"' if href.startswith("http") else ""
                    out.append(f'<a href="{html.escape(href)}"{ext}>{label}</a>')
            elif m.group("auto") is not None:
                u = html.escape(m.group("aurl"))
                out.append(f'<a href="{u}" rel="noopener">{u}</a>')
            elif m.group("bold") is not None:
                out.append(f"<strong>{self.inline(m.group('btext'), autolink)}</strong>")
            elif m.group("em") is not None:
                out.append(f"<em>{self.inline(m.group('etext'), autolink)}</em>")
            elif m.group("em2") is not None:
                out.append(f"<em>{self.inline(m.group('e2text'), autolink)}</em>")
            else:
                out.append(html.escape(m.group("echar"), quote=False))
        out.append(self.text(text[pos:], autolink))
        return "".join(out)

    def image(self, src: str, alt: str, width: str | None) -> str:
        href, target = self.resolve(src)
        file = ROOT / target
        size = f' width="{int(width)}"' if width and width.isdigit() else ""
        if href is None and file.suffix.lower() in IMAGE_EXT and file.is_file():
            name = "img/" + file.name
            self.assets[name] = file
            return f'<img src="{html.escape(name)}" alt="{html.escape(alt)}"{size} loading="lazy">'
        if href is not None and href.startswith("https://"):
            return f'<img src="{html.escape(href)}" alt="{html.escape(alt)}"{size}>'
        return f'<span class="repo-link" title="in the repository: {html.escape(target)}">[{html.escape(alt)}]</span>'

    # ------------------------------------------------------------------ blocks
    def slug(self, text_html: str) -> str:
        plain = html.unescape(re.sub(r"<[^>]+>", "", text_html)).lower()
        base = re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", plain).strip()) or "section"
        n = self.ids.get(base, 0)
        self.ids[base] = n + 1
        return base if n == 0 else f"{base}-{n}"

    def render(self, text: str) -> str:
        return self.blocks_html(text.replace("\r\n", "\n").split("\n"), 0)

    def blocks_html(self, lines: list[str], offset: int) -> str:
        """`lines` (starting at line `offset` of the file) as HTML blocks."""
        out: list[str] = []
        notes: dict[str, list[str]] = {}
        i = 0
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if not stripped:
                i += 1
                continue
            if stripped.startswith("<!--"):
                j = i
                while "-->" not in lines[j]:
                    j += 1
                    if j >= len(lines):
                        raise DocsError(f"{self.source}:{offset + i + 1}: an HTML comment that never ends")
                body = " ".join(x.strip() for x in lines[i : j + 1])
                inner = body[body.index("<!--") + 4 : body.rindex("-->")].strip()
                m = re.match(r"^(norun|expect|shows):\s*(.*)$", inner, re.S)
                if m:
                    notes.setdefault(m.group(1), []).append(m.group(2).strip())
                i = j + 1
                continue
            fence = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", line)
            if fence:
                i = self.code_block(lines, i, offset, fence, notes, out)
                notes = {}
                continue
            if notes:
                raise DocsError(
                    f"{self.source}:{offset + i + 1}: a <!-- {', '.join(notes)}: ... --> note must sit right "
                    "before the code block it is about"
                )
            h = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if h:
                level, inner = len(h.group(1)), self.inline(h.group(2), autolink=False)
                hid = self.slug(inner)
                if level == 1 and not self.title:
                    self.title = html.unescape(re.sub(r"<[^>]+>", "", inner))
                self.headings.append((level, hid, inner))
                out.append(
                    f'<h{level} id="{hid}">{inner} <a class="anchor" href="#{hid}" aria-label="link to this section">#</a></h{level}>'
                )
                i += 1
                continue
            if stripped.startswith("|") and i + 1 < len(lines) and TABLE_SEP.match(lines[i + 1].strip()):
                i = self.table(lines, i, out)
                continue
            if stripped.startswith(">"):
                j = i
                quoted = []
                while j < len(lines) and lines[j].strip().startswith(">"):
                    quoted.append(re.sub(r"^\s*> ?", "", lines[j]))
                    j += 1
                out.append(f"<blockquote>{self.blocks_html(quoted, offset + i)}</blockquote>")
                i = j
                continue
            if LIST_ITEM.match(line):
                i = self.list_block(lines, i, offset, out)
                continue
            img = re.match(r"^\s*<img\s([^>]*)/?>\s*$", line)
            if img:
                attrs = dict(re.findall(r'(\w+)="([^"]*)"', img.group(1)))
                out.append(
                    f"<p>{self.image(attrs.get('src', ''), attrs.get('alt', ''), attrs.get('width'))}</p>"
                )
                i += 1
                continue
            j = i
            para = []
            while j < len(lines) and lines[j].strip() and not starts_block(lines[j]):
                para.append(lines[j].strip())
                j += 1
            if not para:  # a line that looks like a block start but is not one: keep it as text
                para, j = [stripped], i + 1
            out.append(f"<p>{self.inline(' '.join(para))}</p>")
            i = j
        if notes:
            raise DocsError(
                f"{self.source}: a <!-- {', '.join(notes)}: ... --> note at the end, before no code block"
            )
        return "\n".join(out)

    def code_block(self, lines, i, offset, fence, notes, out) -> int:
        indent, marks, lang = len(fence.group(1)), fence.group(2), fence.group(3)
        j = i + 1
        body = []
        while j < len(lines) and not re.match(rf"^\s*{re.escape(marks[0])}{{{len(marks)},}}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        if j >= len(lines):
            raise DocsError(f"{self.source}:{offset + i + 1}: a code block that is never closed")
        code = "\n".join(body) + "\n"
        where = f"{self.source}:{offset + i + 1}"
        kind, reason = classify(lang, code, notes, where)
        b = Block(len(self.blocks) + 1, lang, code, offset + i + 1, kind, reason)
        for text in notes.get("expect", []):
            b.expect += parse_expect(text, where)
        b.shows = notes.get("shows", [])
        if (b.expect or b.shows) and kind == "show":
            raise DocsError(f"{where}: expect/shows notes on a block that does not run")
        self.blocks.append(b)
        out.append(block_html(b))
        return j + 1

    def table(self, lines, i, out) -> int:
        head = split_row(lines[i])
        aligns = []
        for cell in split_row(lines[i + 1]):
            c = cell.strip()
            aligns.append(
                "right"
                if c.endswith(":") and not c.startswith(":")
                else "center"
                if c.startswith(":") and c.endswith(":")
                else ""
            )
        j = i + 2
        rows = []
        while j < len(lines) and lines[j].strip().startswith("|"):
            rows.append(split_row(lines[j]))
            j += 1

        def cell(tag: str, text: str, k: int) -> str:
            style = f' class="{aligns[k]}"' if k < len(aligns) and aligns[k] else ""
            return f"<{tag}{style}>{self.inline(text.strip())}</{tag}>"

        thead = "<tr>" + "".join(cell("th", c, k) for k, c in enumerate(head)) + "</tr>"
        tbody = "".join("<tr>" + "".join(cell("td", c, k) for k, c in enumerate(r)) + "</tr>" for r in rows)
        out.append(
            '<div class="table-wrap" role="region" tabindex="0" aria-label="table">'
            f"<table><thead>{thead}</thead><tbody>{tbody}</tbody></table></div>"
        )
        return j

    def list_block(self, lines, i, offset, out) -> int:
        first = LIST_ITEM.match(lines[i])
        base_indent = len(first.group(1))
        ordered = first.group(2)[0].isdigit()
        items: list[tuple[int, list[str]]] = []
        loose = False
        j = i
        while j < len(lines):
            m = LIST_ITEM.match(lines[j])
            if m and len(m.group(1)) == base_indent and m.group(2)[0].isdigit() == ordered:
                width = len(m.group(0))
                content = [lines[j][width:]]
                start = j
                j += 1
                while j < len(lines):
                    ln = lines[j]
                    if not ln.strip():
                        nxt = next((k for k in range(j, len(lines)) if lines[k].strip()), None)
                        if nxt is not None and indent_of(lines[nxt]) >= width:
                            content.append("")
                            loose = True
                            j += 1
                            continue
                        break
                    if indent_of(ln) >= width:
                        content.append(ln[width:])
                    elif LIST_ITEM.match(ln) or starts_block(ln):
                        break
                    else:  # a lazy continuation of the item's paragraph
                        content.append(ln.strip())
                    j += 1
                items.append((start, content))
                if j < len(lines) and not lines[j].strip():
                    nxt = next((k for k in range(j, len(lines)) if lines[k].strip()), None)
                    if (
                        nxt is not None
                        and LIST_ITEM.match(lines[nxt])
                        and indent_of(lines[nxt]) == base_indent
                    ):
                        loose = True
                        j = nxt
                        continue
                    break
                continue
            break
        tag = "ol" if ordered else "ul"
        start_attr = ""
        if ordered and (n := int(re.match(r"\d+", first.group(2)).group(0))) != 1:
            start_attr = f' start="{n}"'
        parts = []
        for start, content in items:
            inner = self.blocks_html(content, offset + start)
            if not loose and inner.startswith("<p>"):
                end = inner.find("</p>")
                inner = inner[3:end] + inner[end + 4 :]
            parts.append(f"<li>{inner}</li>")
        out.append(f"<{tag}{start_attr}>{''.join(parts)}</{tag}>")
        return j


TABLE_SEP = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?$")
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d{1,9}[.)])(\s+|$)")


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def starts_block(line: str) -> bool:
    """Whether `line` begins a block that interrupts a paragraph."""
    s = line.strip()
    return bool(
        re.match(r"^(#{1,6}\s|`{3,}|~{3,}|>|<!--)", s)
        or re.match(r"^([-*+]|1[.)])\s+\S", s)
        or (s.startswith("|") and s.endswith("|"))
        or re.match(r"^<img\s", s)
    )


def split_row(line: str) -> list[str]:
    """A table row's cells: split on unescaped pipes; `\\|` is a literal pipe, in code spans too (GFM)."""
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.replace("\\|", "|") for c in re.split(r"(?<!\\)\|", s)]


def block_html(b: Block) -> str:
    code = html.escape(b.code.rstrip("\n"), quote=False)
    label = f"{b.lang or 'text'} block {b.n}"
    attrs = f'id="block-{b.n}" class="block kind-{b.kind}" data-block="{b.n}" data-kind="{b.kind}" data-lang="{html.escape(b.lang)}"'
    if b.kind != "show":
        attrs += f" data-expect='{html.escape(json.dumps(b.expect))}' data-shows='{html.escape(json.dumps(b.shows))}'"
        if b.kind == "sh" and re.search(r"(?:^|\s)(?:--fail-with-body|--fail|-f|-fsS|-sSf)(?=\s)", b.code):
            attrs += ' data-fail="1"'
    bar = f'<span class="lang">{html.escape(b.lang or "text")}</span>'
    if b.kind in ("sh", "python"):
        what = "in this page's shell" if b.kind == "sh" else "in Pyodide with monitor_protocol.client"
        bar += (
            f'<button type="button" class="run" data-run="{b.n}" disabled aria-label="Run block {b.n}" '
            f'title="Run {what}, against this page\'s engine">Run</button>'
            '<span class="block-state" role="status"></span>'
        )
    elif b.reason:
        bar += f'<span class="norun"><strong>Not run in this page:</strong> {html.escape(b.reason)}</span>'
    out = '<div class="block-out" hidden></div>' if b.kind != "show" else ""
    return (
        f'<figure {attrs}><figcaption class="block-bar">{bar}</figcaption>'
        f'<pre class="code" tabindex="0" aria-label="{label}"><code>{code}</code></pre>{out}</figure>'
    )


# ------------------------------------------------------------------------------------------------ pages
@dataclass
class Page:
    name: str
    source: str
    title: str
    html: str
    blocks: list[Block]
    headings: list[tuple[int, str, str]]
    assets: dict[str, Path]
    summary: str


def render_doc(name: str, source: str, text: str, pages: dict[str, str], wheel: str) -> Page:
    r = Renderer(source, pages)
    body = r.render(text)
    if any(b.kind == "python" for b in r.blocks):  # the two lines a reader's own Pyodide app needs
        first = next(b for b in r.blocks if b.kind == "python")
        body = body.replace(
            f'<figure id="block-{first.n}"', micropip_box(wheel) + f'<figure id="block-{first.n}"', 1
        )
    m = re.search(r"<p>(.*?)</p>", body, re.S)
    summary = re.sub(r"<[^>]+>", "", m.group(1)) if m else ""
    summary = html.unescape(re.split(r"(?<=\.)\s", summary, maxsplit=1)[0])
    return Page(name, source, r.title or name, body, r.blocks, r.headings, r.assets, summary)


def micropip_box(wheel: str) -> str:
    url = f"../pyodide/{wheel}"
    return (
        '<aside class="micropip" aria-label="the client in your own Pyodide app">'
        "<p><strong>In your own Pyodide app</strong>, these two lines install this client from the wheel this "
        "site serves; the Run buttons below do exactly this in a worker, then run the block against this "
        "page's engine:</p>"
        '<pre class="code" tabindex="0" aria-label="the two micropip lines"><code>import micropip\n'
        f'await micropip.install("<span class="wheel-url" data-wheel="{html.escape(url)}">{html.escape(url)}</span>")</code></pre>'
        '<p class="runner-stages small" id="runner-stages" aria-live="polite"></p></aside>'
    )


def has_runs(p: Page) -> bool:
    """Whether the page has a block to run, and so an engine of its own (else it is served as plain HTML)."""
    return any(b.kind != "show" for b in p.blocks)


def nav_html(pages: list[Page], current: str) -> str:
    links = ['<a href="./index.html"' + (' aria-current="page"' if current == "index" else "") + ">Docs</a>"]
    for p in pages:
        cur = ' aria-current="page"' if p.name == current else ""
        links.append(f'<a href="./{p.name}.html"{cur}>{html.escape(short_title(p))}</a>')
    links.append('<a href="../index.html">Playground</a>')
    return "".join(links)


def short_title(p: Page) -> str:
    return {
        "readme": "README",
        "tour": "Tour",
        "protocol": "Protocol",
        "serve": "mp serve",
        "doors": "Doors",
    }.get(p.name, p.title)


def fill(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace(f"__{key}__", value)
    return template


def index_html(pages: list[Page]) -> str:
    items = []
    for p in pages:
        runs = sum(b.kind != "show" for b in p.blocks)
        told = sum(bool(b.reason) for b in p.blocks)
        about = (
            f"{runs} runnable block{'s' * (runs != 1)}, "
            f"{told} {'that says why it does' if told == 1 else 'that say why they do'} not run"
            if runs or told
            else "a reference: nothing to run"
        )
        items.append(
            f'<li><a href="./{p.name}.html">{html.escape(p.title)}</a> <span class="muted small">'
            f"({html.escape(p.source)}: {about})</span><br>"
            f"<span class='small'>{html.escape(p.summary)}</span></li>"
        )
    return (
        "<h1 id='docs'>The docs, live</h1>"
        "<p>The project's docs, rendered from the repository's Markdown. Each page with examples has an engine of "
        "its own in this browser (its own IndexedDB, never the playground's): every <code>sh</code> block has a Run "
        "button that runs it through the curl console's shell (<code>mp</code> commands run the real CLI in "
        "Pyodide), every Python block that uses the client runs in Pyodide with the real "
        "<code>monitor_protocol.client</code>, and a block that cannot run in a page says why.</p>"
        f"<ul class='doc-list'>{''.join(items)}</ul>"
    )


def site_pages(
    wheel: str,
    fill_modules: Callable[[str], str],
    root: Path = ROOT,
    template: Path | None = None,
) -> dict[str, bytes | Path]:
    """Every docs page of the site: {"docs/readme.html": bytes, ..., "docs/img/x.png": Path}. `wheel` is the
    engine wheel's file name (build-info.json's engine_wheel); `fill_modules(page)` is build.py's
    page_with_modules. Raises DocsError when a doc cannot become a page."""
    template_text = (template or root / "web" / "docs.html").read_text()
    sources = [(n, s) for n, s, optional in PAGES if not optional or (root / s).is_file()]
    page_of = {s: f"{n}.html" for n, s in sources}
    pages = [render_doc(n, s, (root / s).read_text(), page_of, wheel) for n, s in sources]
    files: dict[str, bytes | Path] = {}
    with_engine = fill_modules(template_text)  # what docs_page.py imports, read from it
    # The template sits as if at the site root (./x); the pages live in docs/, one folder down: PyScript's
    # `files` map fetches its keys relative to the page, while its values are paths in Python's file system.
    with_engine = re.sub(r'"\./([^"]*)":', r'"../\1":', with_engine)
    without_engine = re.sub(r"<!--engine-->.*?<!--/engine-->", "", template_text, flags=re.S)
    for p in pages:
        toc = "".join(
            f'<li class="l{lvl}"><a href="#{hid}">{re.sub(r"<a class=.*", "", inner)}</a></li>'
            for lvl, hid, inner in p.headings
            if lvl == 2
        )
        files[f"docs/{p.name}.html"] = fill(
            with_engine if has_runs(p) else without_engine,
            TITLE=html.escape(p.title),
            NS=f"docs-{p.name}",
            NAV=nav_html(pages, p.name),
            TOC=toc,
            SOURCE=html.escape(p.source),
            CONTENT=p.html,
            WHEEL=html.escape(wheel),
        ).encode()
        for rel, src in p.assets.items():
            files[f"docs/{rel}"] = src
    files["docs/index.html"] = fill(
        without_engine,
        TITLE="The docs, live",
        NS="docs-index",
        NAV=nav_html(pages, "index"),
        TOC="",
        SOURCE="README.md and docs/",
        CONTENT=index_html(pages),
        WHEEL=html.escape(wheel),
    ).encode()
    return files
