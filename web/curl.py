"""The curl console's shell: a small, honest subset of sh, enough to run the README's quickstart verbatim.

Supported (anything else is refused with "not supported in this console: ..."):

- statements separated by newlines or `;`, `\\` line continuations, quotes spanning lines, `#` comments;
- variables: `NAME=word`, `$NAME`, `${NAME}`, `${NAME:-default}`; command substitution `$(...)`;
- quoting: '...' (literal), "..." (with `\\"`, `\\\\`, `\\$` and expansions inside);
- pipelines of `curl`, `echo [-n]` and `field '<subscript path>'`, and a final `> /dev/null`;
- `field() { ...; }` is accepted and ignored: `field` is built in. It reads JSON from its input and prints
  the value at a path of `["key"]` and `[int]` steps (no eval), as Python's print() would;
- `export NAME=word` / `export NAME`, and `mp ...` (the real CLI) when the page gives the shell a `cli`
  callback (the docs pages run it in a Pyodide worker): it gets the exported variables as its environment,
  its stdout is its output (captured by `$(...)` like any command's) and its exit status is the statement's.

curl takes `-X`, `-H`, `-d`/`--data*`, `--json`, `-s`, `-S`, `-f`, `--fail-with-body` (and friends); the
README's server (`http://127.0.0.1:8130`, `http://localhost:8130`) is rewritten to the page's origin, and
the request is sent by the caller's `fetch` (the page uses the browser's fetch, through the service worker).
This module has no browser dependency: the page passes `fetch` and `emit` callbacks.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

LOCAL_HOSTS = ("localhost:8130", "127.0.0.1:8130", "[::1]:8130", "0.0.0.0:8130")
DATA_FLAGS = ("-d", "--data", "--data-raw", "--data-binary", "--data-ascii", "--json")
IGNORED_FLAGS = ("-s", "--silent", "-S", "--show-error", "-i", "--include", "-v", "--verbose", "-L", "--location",
                 "-f", "--fail", "--fail-with-body", "--compressed", "-N", "--no-buffer", "-sS", "-fsS", "-sSf")  # fmt: skip
FUNC_START = re.compile(r"([A-Za-z_]\w*)\s*\(\s*\)\s*\{")
NAME = re.compile(r"[A-Za-z_]\w*")
ASSIGN = re.compile(r"^([A-Za-z_]\w*)=")
STEP = re.compile(r"""\s*\[\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|(-?\d+))\s*\]""")


class CurlError(ValueError):
    """A command this console cannot run; the message says what to do instead."""


class Unsupported(CurlError):
    def __init__(self, what: str) -> None:
        super().__init__(f"not supported in this console: {what}")


@dataclass
class CurlCall:
    method: str
    url: str  # absolute on the page's origin
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None


# ------------------------------------------------------------------------------------------- curl itself
def parse_args(args: list[str], origin: str) -> CurlCall:
    """curl's arguments (already expanded) as one request to the page's own origin."""
    method: str | None = None
    headers: dict[str, str] = {}
    body: str | None = None
    url: str | None = None
    i = 0
    while i < len(args):
        w = args[i]
        if w in ("-X", "--request", "-H", "--header", *DATA_FLAGS):
            if i + 1 >= len(args):
                raise CurlError(f"curl: {w} needs a value")
            v = args[i + 1]
            i += 2
            if w in ("-X", "--request"):
                method = v.upper()
            elif w in ("-H", "--header"):
                if ":" not in v:
                    raise CurlError(f"curl: header {v!r} should look like 'Name: value'")
                name, val = v.split(":", 1)
                headers[name.strip()] = val.strip()
            else:
                body = v
                if w == "--json":
                    headers.setdefault("Content-Type", "application/json")
        elif w in IGNORED_FLAGS:
            i += 1
        elif w.startswith("-X") and len(w) > 2:
            method = w[2:].upper()
            i += 1
        elif w.startswith("-"):
            raise Unsupported(f"the curl option {w} (use -X, -H, -d, -s, -S, --fail-with-body)")
        else:
            if url is not None:
                raise CurlError(f"curl: two URLs given ({url} and {w})")
            url = w
            i += 1
    if url is None:
        raise CurlError("curl: no URL given, e.g. http://localhost:8130/mp/v0/discover")
    if body is not None and body.startswith("@"):
        raise Unsupported("reading a file (-d @file); paste the JSON instead")
    return CurlCall(method or ("POST" if body is not None else "GET"), to_origin(url, origin), headers, body)


def to_origin(url: str, origin: str) -> str:
    """localhost:8130 (the README's server) becomes this page's origin; a path is on this page's origin. Only
    the protocol's own paths are reached: anything else under this origin is the site's files, whose 404 is
    a page of HTML."""
    if url.startswith("/"):
        return origin + _protocol_path(url)
    m = re.match(r"^(https?://)?([^/?#]+)([/?#].*)?$", url)
    if m is None:
        raise CurlError(f"curl: cannot read the URL {url!r}")
    host, path = m.group(2), m.group(3) or "/"
    if host in LOCAL_HOSTS or origin.endswith("//" + host):
        return origin + _protocol_path(path)
    raise CurlError(
        f"curl: {host} is another host: the playground only reaches its own engine (use localhost:8130)"
    )


def _protocol_path(path: str) -> str:
    shown = path if len(path) <= 80 else path[:77] + "..."
    # a . or .. segment (spelt %2e too, or after a backslash, which a browser reads as a slash in an http URL)
    # would step out of /mp/v0 once the browser resolves the URL
    route = re.split(r"[?#]", path, maxsplit=1)[0].replace("\\", "/")
    if any(seg.lower().replace("%2e", ".") in (".", "..") for seg in route.split("/")):
        raise CurlError(
            f"curl: {shown} has a . or .. segment, which would leave /mp/v0, where the protocol is: name the "
            "route itself, such as $MP/discover ($MP is http://localhost:8130/mp/v0)"
        )
    if path == "/mp/v0" or path.startswith(("/mp/v0/", "/mp/v0?")):
        return path
    rest = path.split("/", 3)[3] if path.startswith("/mp/") and path.count("/") >= 3 else None
    if rest is not None:  # /mp/v0x/discover, /mp/v1/discover: the route after the wrong prefix
        instead = f"$MP/{rest}" if rest and len(rest) <= 80 else "$MP/discover"
    else:
        instead = "$MP/discover" if path == "/" or len(path) > 80 else f"$MP{path}"
    raise CurlError(
        f"curl: {shown} is not under /mp/v0, where the protocol is: try {instead} "
        "($MP is http://localhost:8130/mp/v0)"
    )


# ------------------------------------------------------------------------------------------- field
def subscript(value, path: str):
    """Apply a Python subscript path made only of ["key"] and [int] steps (no eval)."""
    pos = 0
    steps = []
    while pos < len(path.rstrip()):
        m = STEP.match(path, pos)
        if m is None:
            raise Unsupported(f'field path {path!r}: only ["key"] and [int] steps')
        if m.group(3) is not None:
            steps.append(int(m.group(3)))
        else:
            raw = m.group(1) if m.group(1) is not None else m.group(2)
            steps.append(re.sub(r"\\(.)", r"\1", raw))
        pos = m.end()
    for step in steps:
        if isinstance(step, int) and not isinstance(value, list):
            raise CurlError(f"TypeError: {type(value).__name__} indices must be keys, not int ({step})")
        if isinstance(step, str) and not isinstance(value, dict):
            raise CurlError(f"TypeError: cannot look up {step!r} in {type(value).__name__}")
        try:
            value = value[step]
        except (KeyError, IndexError):
            raise CurlError(f"{'KeyError' if isinstance(step, str) else 'IndexError'}: {step!r}") from None
    return value


# ------------------------------------------------------------------------------------------- lexing
@dataclass
class Word:
    parts: list  # ("lit", text) | ("var", name, default_parts | None) | ("cmd", script)


class Lexer:
    """Words and operators of one script; expansions are kept as parts and done when the line runs."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def statements(self, closing: str = "") -> list[tuple[str, list]]:
        """[(source text, tokens)]: tokens are Word, "|" or ">"; stops at `closing` (for `$(`)."""
        out: list[tuple[str, list]] = []
        tokens: list = []
        start = self.i
        while True:
            c = self.peek()
            if c == "" or (closing and c == closing):
                if c == "" and closing:
                    raise CurlError("unterminated $( ... ): a ) is missing")
                break
            if c in " \t":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c in "\n;":
                out.append((self.s[start : self.i], tokens))
                tokens = []
                self.i += 1
                start = self.i
            elif c == "#":
                while self.peek() not in ("", "\n"):
                    self.i += 1
            elif c == "|":
                if self.peek(1) == "|":
                    raise Unsupported("|| (use one command per line)")
                tokens.append("|")
                self.i += 1
            elif c == ">":
                tokens.append(">")
                self.i += 1
            elif c == "&":
                raise Unsupported("&& and & (use one command per line)")
            elif c == "`":
                raise Unsupported("backquotes (use $(...))")
            elif c == "<":
                raise Unsupported("< (input redirects)")
            elif c in "()":
                raise Unsupported(f"{c} outside $(...) (subshells, groups)")
            elif not tokens and FUNC_START.match(self.s, self.i):
                out.append(self._function_definition(start))
                tokens = []
                start = self.i
            else:
                tokens.append(self.word())
        out.append((self.s[start : self.i], tokens))
        return [(src.strip(), toks) for src, toks in out if toks]

    def _function_definition(self, start: int) -> tuple[str, list]:
        """`name() { ...; }`: returned whole and untokenised, up to its closing brace."""
        depth = 0
        j = self.i
        while j < len(self.s):
            ch = self.s[j]
            if ch == "'":
                j = self.s.find("'", j + 1)
                if j < 0:
                    break
            elif ch == '"':
                j += 1
                while j < len(self.s) and self.s[j] != '"':
                    j += 2 if self.s[j] == "\\" else 1
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    name = FUNC_START.match(self.s, self.i).group(1)
                    self.i = j + 1
                    return (self.s[start : j + 1], ["func", name])
            j += 1
        raise CurlError("unterminated function definition: a } is missing")

    def word(self) -> Word:
        parts: list = []
        while True:
            c = self.peek()
            if c == "" or c in " \t\n;|&<>`()":
                break
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt != "\n":
                    parts.append(("lit", nxt))
            elif c == "'":
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise CurlError("unterminated ' quote")
                parts.append(("lit", self.s[self.i + 1 : end]))
                self.i = end + 1
            elif c == '"':
                self.i += 1
                parts.append(("lit", ""))  # "" is a word even when empty
                parts.extend(self._double_quoted())
            elif c == "$":
                parts.append(self.dollar())
            else:
                parts.append(("lit", c))
                self.i += 1
        return Word(parts)

    def _double_quoted(self) -> list:
        parts: list = []
        while True:
            c = self.peek()
            if c == "":
                raise CurlError('unterminated " quote')
            if c == '"':
                self.i += 1
                return parts
            if c == "\\":
                nxt = self.peek(1)
                self.i += 2
                if nxt == "\n":
                    continue
                parts.append(("lit", nxt if nxt in '"\\$`' else "\\" + nxt))
            elif c == "$":
                parts.append(self.dollar())
            elif c == "`":
                raise Unsupported("backquotes (use $(...))")
            else:
                parts.append(("lit", c))
                self.i += 1

    def dollar(self) -> tuple:
        self.i += 1
        c = self.peek()
        if c == "(":
            if self.peek(1) == "(":
                raise Unsupported("arithmetic $(( ))")
            self.i += 1
            inner = Lexer(self.s)
            inner.i = self.i
            stmts = inner.statements(closing=")")
            self.i = inner.i + 1
            return ("cmd", stmts)
        if c == "{":
            end = self.i + 1
            m = NAME.match(self.s, end)
            if m is None:
                raise Unsupported("${...} other than ${NAME} and ${NAME:-default}")
            self.i = m.end()
            if self.peek() == "}":
                self.i += 1
                return ("var", m.group(0), None)
            if self.s.startswith(":-", self.i):
                self.i += 2
                default: list = []
                while self.peek() != "}":
                    if self.peek() == "":
                        raise CurlError("unterminated ${...}")
                    if self.peek() == "$":
                        default.append(self.dollar())
                    elif self.peek() in "'\"\\":
                        raise Unsupported("quotes or escapes inside ${NAME:-default}")
                    else:
                        default.append(("lit", self.peek()))
                        self.i += 1
                self.i += 1
                return ("var", m.group(0), default)
            raise Unsupported("${...} other than ${NAME} and ${NAME:-default}")
        m = NAME.match(self.s, self.i)
        if m is None:
            if c in "?#@*!$0123456789-":
                raise Unsupported(f"${c}")
            return ("lit", "$")
        self.i = m.end()
        return ("var", m.group(0), None)


def check_command(name: str | None, with_cli: bool) -> None:
    """Refuse, by name, a command this shell does not run (before anything is sent)."""
    if name is None or name in ("curl", "echo", "field") or (with_cli and name in ("mp", "export")):
        return
    if name in ("python3", "python", "jq"):
        raise Unsupported(f"{name} (field is built in: … | field '[\"key\"]')")
    if name == "mp":
        raise Unsupported(
            "the command 'mp' here (the docs pages run it; this console runs curl, echo and field)"
        )
    more = ", field, export and mp" if with_cli else " and field"
    raise Unsupported(f"the command {name!r} (only curl, echo{more} run here)")


def why_not_runnable(text: str, with_cli: bool = True) -> str | None:
    """Why this script cannot run in this shell, found without running it (None: it can): unsupported
    syntax, a command other than curl, echo, field, export and mp, or an mp command that never ends."""
    try:
        return _why_not(split(text), with_cli)
    except CurlError as exc:
        return str(exc)


def _why_not(stmts: list[tuple[str, list]], with_cli: bool) -> str | None:
    for _src, tokens in stmts:
        if tokens[0] == "func":
            if tokens[1] != "field":
                return f"not supported in this console: defining shell functions ({tokens[1]})"
            continue
        words: list = []
        for tok in tokens:
            if tok == ">":
                break
            words.append(tok)
        stages: list[list[Word]] = [[]]
        for tok in words:
            if tok == "|":
                stages.append([])
            else:
                stages[-1].append(tok)
        if ">" in tokens:
            target = tokens[tokens.index(">") + 1 :]
            if [Shell._literal(t) if isinstance(t, Word) else None for t in target] != ["/dev/null"]:
                return "not supported in this console: redirects other than > /dev/null"
        for stage in stages:
            for w in stage:  # what $(...) runs inside a word is checked too
                for part in w.parts:
                    if part[0] == "cmd" and (why := _why_not(part[1], with_cli)):
                        return why
            lead = [w for w in stage if Shell._assignment(w) is None]  # NAME=... words: no command
            if not lead:
                continue
            name = Shell._literal(lead[0])
            try:
                check_command(name, with_cli)
            except Unsupported as exc:
                return str(exc)
            sub = Shell._literal(lead[1]) if name == "mp" and len(lead) > 1 else None
            if sub in ENDLESS_MP and not (
                sub == "watch" and any(Shell._literal(w) == "--once" for w in lead)
            ):
                return ENDLESS_MP[sub]
    return None


# Why a variable a block uses may be unset: the console's variables live until the page is reloaded.
UNSET_HINT = " (run the block that sets it first: the blocks build on each other, from the first one on)"


# What a script that still needs lines waits for (`awaiting`'s sentences), by the start of the lexer's
# refusal.
_AWAITED = (
    ("unterminated ' quote", "a ' quote is open: the command goes on until a second ' closes it"),
    ('unterminated " quote', 'a " quote is open: the command goes on until a second " closes it'),
    ("unterminated $(", "a $( is open: the command goes on until its ) closes it"),
    ("unterminated function", "a function's { is open: it goes on until its } closes it"),
    ("unterminated ${", "a ${ is open: the command goes on until its } closes it"),
)


def continued(text: str) -> bool:
    """Whether the text ends with a backslash continuation whose next line is still empty (Enter runs it then,
    as sh does)."""
    return text.rstrip(" \t").endswith("\\\n")


def awaiting(text: str) -> str | None:
    """Why a typed script still needs lines (a sentence for the prompt), or None when it can run."""
    if text.rstrip(" \t").endswith("\\"):
        return "the line ends with \\: the command goes on on the next line"
    if text.rstrip().endswith("|"):
        return "the line ends with |: the command it pipes into goes on the next line"
    try:
        split(text)
    except Unsupported:
        return None
    except CurlError as exc:
        said = str(exc)
        for start, sentence in _AWAITED:
            if said.startswith(start):
                return sentence
        return said if "unterminated" in said else None  # a construct the table does not name yet
    return None


def split(text: str) -> list[tuple[str, list]]:
    """[(statement source, tokens)] of a pasted script; a function definition's tokens are ["func", name]."""
    return Lexer(text.replace("\r\n", "\n")).statements()


# ------------------------------------------------------------------------------------------- running
Fetch = Callable[[CurlCall], Awaitable[tuple[int, str]]]
# (argv after `mp`, the exported environment, stdin or None) -> (exit status, stdout, stderr)
Cli = Callable[[list[str], dict[str, str], str | None], Awaitable[tuple[int, str, str]]]
LOCAL_URL = re.compile(r"^(?:https?://)?(?:localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0):8130(?=/|$)")
# mp commands that never end by themselves or serve: no page can run them as a block (they would hang).
ENDLESS_MP = {
    "serve": "mp serve listens on a port, which a page cannot",
    "mcp": "mp mcp is a stdio server for an MCP client",
    "watch": "mp watch follows the feed until it is stopped (mp watch --once drains and exits)",
    "migrate": "mp migrate copies a SQLite file into PostgreSQL, neither of which is in the page",
    "conform": "mp conform runs the conformance suite (the playground's Conformance tab runs it in the page)",
}
Emit = Callable[[str, str, dict], None]  # (kind, text, extra): kinds cmd, out, http, note, error


class Shell:
    """Runs a pasted script statement by statement. `fetch(call) -> (status, body text)` sends a request;
    `emit(kind, text, extra)` shows a line: `cmd` (the statement), `http` (a curl's status and pretty
    JSON, extra: status, data), `out` (what the statement printed), `note`, `error`."""

    def __init__(
        self, origin: str, fetch: Fetch, emit: Emit, env: dict[str, str] | None = None, cli: Cli | None = None
    ) -> None:
        self.origin = origin
        self.fetch = fetch
        self.emit = emit
        self.env: dict[str, str] = env if env is not None else {}
        self.exported: set[str] = set()  # the names `export` marked: the environment `mp` is given
        self.cli = cli
        self.last_status = 0

    async def run(self, text: str) -> int:
        """Every statement in order (an error stops only that statement, as in sh); the last status."""
        try:
            stmts = split(text)
        except CurlError as exc:
            self.emit("cmd", text.strip(), {})
            self.emit("error", str(exc), {})
            self.last_status = 2
            return 2
        for src, tokens in stmts:
            self.emit("cmd", src, {})
            try:
                out, status = await self.statement(tokens, top=True)
            except CurlError as exc:
                self.emit("error", str(exc), {})
                status, out = (2 if isinstance(exc, Unsupported) else 1), ""
            if out:
                self.emit("out", out, {})
            self.last_status = status
        return self.last_status

    async def statement(self, tokens: list, top: bool = False) -> tuple[str, int]:
        if tokens and tokens[0] == "func":
            if tokens[1] != "field":
                raise Unsupported(f"defining shell functions ({tokens[1]}); only field is built in")
            self.emit("note", "field: built in", {})
            return "", 0
        if (
            self.cli is not None
            and tokens
            and isinstance(tokens[0], Word)
            and self._literal(tokens[0]) == "export"
        ):
            return await self.export(tokens[1:])
        assigns: list[tuple[str, Word]] = []
        rest = list(tokens)
        while rest and isinstance(rest[0], Word) and self._assignment(rest[0]) is not None:
            assigns.append(self._assignment(rest.pop(0)))
        if assigns and rest:
            raise Unsupported("VAR=value before a command (set it on its own line)")
        if assigns:
            status = 0
            for name, word in assigns:
                status = await self.assign(name, word)
            return "", status
        return await self.pipeline(rest, top)

    async def assign(self, name: str, word: Word) -> int:
        """NAME=word: the word's value, and its status (a $(...)'s)."""
        try:
            value, status = await self.expand(word)
        except CurlError:
            # As sh: the failed $(...) printed nothing, so the name now holds nothing. Keeping the old value
            # would send the next block with a token or id from an earlier run, and nothing would say so.
            self.env[name] = ""
            self.emit("note", f"# {name} is now empty: what sets it failed (below)", {})
            raise
        self.env[name] = value
        return status

    async def export(self, words: list) -> tuple[str, int]:
        """`export NAME=word` and `export NAME`: set (when given) and mark for the environment of `mp`."""
        if not words or not all(isinstance(w, Word) for w in words):
            raise CurlError("export takes NAME=value or NAME, e.g. export MP_OWNER_TOKEN=$OWNER")
        status = 0
        for w in words:
            assign = self._assignment(w)
            if assign is not None:
                status = await self.assign(*assign)
                self.exported.add(assign[0])
            elif (name := self._literal(w)) is not None and NAME.fullmatch(name):
                self.exported.add(name)
            else:
                raise CurlError("export takes NAME=value or NAME, e.g. export MP_OWNER_TOKEN=$OWNER")
        return "", status

    async def mp(self, args: list[str], stdin: str | None) -> tuple[str, int]:
        """The real CLI, through the page's callback: the README's server address means this page."""
        if args and args[0] in ENDLESS_MP and not (args[0] == "watch" and "--once" in args):
            raise Unsupported(ENDLESS_MP[args[0]])
        argv = [LOCAL_URL.sub(self.origin, a) for a in args]
        env = {name: self.env.get(name, "") for name in sorted(self.exported)}
        try:
            code, out, err = await self.cli(argv, env, stdin)
        except Exception as exc:  # the runner could not start or answer: said, never a hang
            raise CurlError(f"mp: {exc}") from None
        self.emit("exit", err, {"argv": argv, "exit": code})
        if code != 0:
            self.emit(
                "error", (err.strip() + "\n" if err.strip() else "") + f"mp exited with status {code}", {}
            )
        elif err.strip():
            self.emit("note", err.strip(), {})
        return out, code

    @staticmethod
    def _assignment(word: Word) -> tuple[str, Word] | None:
        if not word.parts or word.parts[0][0] != "lit":
            return None
        lit = ""
        k = 0
        while k < len(word.parts) and word.parts[k][0] == "lit" and "=" not in lit:
            lit += word.parts[k][1]
            k += 1
        m = ASSIGN.match(lit)
        if m is None or not lit.startswith(m.group(0)):
            return None
        rest_lit = lit[len(m.group(0)) :]
        value = ([("lit", rest_lit)] if rest_lit else []) + word.parts[k:]
        return m.group(1), Word(value)

    @staticmethod
    def _literal(word: Word) -> str | None:
        return "".join(p[1] for p in word.parts) if all(p[0] == "lit" for p in word.parts) else None

    async def pipeline(self, tokens: list, top: bool) -> tuple[str, int]:
        discard = False
        if ">" in tokens:
            k = tokens.index(">")
            target = tokens[k + 1 :]
            plain = [self._literal(t) for t in target] if all(isinstance(t, Word) for t in target) else []
            if plain != ["/dev/null"]:
                raise Unsupported("redirects other than > /dev/null")
            tokens, discard = tokens[:k], True
        stages: list[list[Word]] = [[]]
        for tok in tokens:
            if tok == "|":
                stages.append([])
            elif isinstance(tok, Word):
                stages[-1].append(tok)
            else:
                raise Unsupported(str(tok))
        if any(not s for s in stages):
            raise CurlError("a | with no command on one side")
        for stage in stages:  # refuse before anything is sent
            self._check_command(self._literal(stage[0]))
        data: str | None = None
        status = 0
        for n, stage in enumerate(stages):
            args = []
            for w in stage:
                value, _ = await self.expand(w)
                args.append(value)
            name = args[0]
            shown = top and n == len(stages) - 1 and not discard  # the statement's own output
            if name == "curl":
                data, status = await self.curl(args[1:], shown=shown, remember=top and len(stages) == 1)
                if shown:
                    data = ""  # already shown, pretty, with its status
            elif name == "echo":
                newline = True
                if len(args) > 1 and args[1] == "-n":
                    newline, args = False, args[1:]
                data, status = " ".join(args[1:]) + ("\n" if newline else ""), 0
            elif name == "field":
                if len(args) != 2:
                    raise CurlError("field takes one path, e.g. field '[\"owner_token\"]'")
                data, status = self.field(data or "", args[1])
            elif name == "mp":
                data, status = await self.mp(args[1:], data if n else None)
            else:
                self._check_command(name)
        return ("" if discard else data or ""), status

    def _check_command(self, name: str | None) -> None:
        check_command(name, self.cli is not None)

    def field(self, text: str, path: str) -> tuple[str, int]:
        try:
            value = json.loads(text)
        except ValueError:
            raise CurlError("field: the input is not JSON (json.decoder.JSONDecodeError)") from None
        try:
            value = subscript(value, path)
        except Unsupported:
            raise
        except CurlError as exc:
            raise CurlError(f"field: {exc}") from None
        return str(value) + "\n", 0  # exactly what print() shows, Python reprs included

    async def curl(self, args: list[str], shown: bool, remember: bool) -> tuple[str, int]:
        call = parse_args(args, self.origin)
        try:
            status, text = await self.fetch(call)
        except Exception as exc:  # the fetch itself failed
            raise CurlError(f"curl: (7) {exc}") from None
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        self.emit(
            "http",
            text,
            {
                "status": status,
                "data": data,
                "method": call.method,
                "url": call.url,
                "body": call.body,
                "remember": remember,
                "shown": shown,
            },
        )
        fail = (
            "-f" in args or "--fail" in args or "--fail-with-body" in args or "-fsS" in args or "-sSf" in args
        )
        return text, (22 if fail and status >= 400 else 0)

    async def expand(self, word: Word) -> tuple[str, int]:
        out = []
        status = 0
        for part in word.parts:
            kind = part[0]
            if kind == "lit":
                out.append(part[1])
            elif kind == "var":
                value = self.env.get(part[1], "")
                if not value and part[2] is not None:
                    value, status = await self.expand(Word(part[2]))
                elif part[1] not in self.env:
                    near = difflib.get_close_matches(part[1], list(self.env), n=1, cutoff=0.75)
                    why = (
                        f" (did you mean ${near[0]}?)" if near else UNSET_HINT
                    )  # a typo, else a block skipped
                    self.emit("note", f"# ${part[1]} is not set: it expands to nothing{why}", {})
                out.append(value)
            else:  # $(...): run it, capture its output, drop trailing newlines
                captured = []
                for _src, tokens in part[1]:
                    text, status = await self.statement(tokens)
                    captured.append(text)
                out.append("".join(captured).rstrip("\n"))
        return "".join(out), status
