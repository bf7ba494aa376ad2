"""Regular expressions read as JSON Schema reads them (ECMA-262, no flags), on Python's `re`.

The protocol's patterns (a monitor id, an observation type, a tag key) are published in JSON Schemas, and a
value this server accepts must match them in every language that validates it. Python's `re` reads the same
text differently in four ways that let values through: `$` also matches before a final newline, `\\w`,
`\\d` and `\\b` take any Unicode letter or digit, `.` matches `\\r`, U+2028 and U+2029, and `[]` / `[^]` are
not the empty / any-character classes. `translate` rewrites those; the rest of the syntax the protocol uses
means the same in both. An escape outside that shared part (`\\A`, `\\Z`, `\\k`, `\\c`: literal letters in
ECMA, anchors or errors in Python) and a `{,n}` quantifier (literal text in ECMA) are refused with ValueError
rather than given Python's meaning.
"""

from __future__ import annotations

import functools
import re

# ECMA-262 WhiteSpace and LineTerminator: what `\s` means there (with re.ASCII it would be ASCII only).
_SPACES = "\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_LINE_TERMINATORS = "\\n\\r\\u2028\\u2029"
# The escapes that mean the same in both dialects (with re.ASCII), besides \s and \S translated below.
_SHARED_ESCAPES = frozenset("\\/.-^$*+?()[]{}|dDwWbBnrtfv0123456789xu")


def translate(pattern: str) -> str:
    """`pattern`'s ECMA-262 meaning as Python `re` syntax, to be compiled with re.ASCII."""
    out: list[str] = []
    i, end, in_class = 0, len(pattern), False
    while i < end:
        ch = pattern[i]
        if ch == "\\" and i + 1 < end:
            escape = pattern[i : i + 2]
            if escape == "\\s":
                out.append(_SPACES if in_class else f"[{_SPACES}]")
            elif escape == "\\S" and not in_class:
                out.append(f"[^{_SPACES}]")
            elif escape == "\\S":
                raise ValueError(f"\\S inside a character class is not supported: {pattern!r}")
            elif escape[1] in _SHARED_ESCAPES:
                out.append(escape)
            else:
                raise ValueError(
                    f"the escape {escape} means different things in ECMA-262 and Python: {pattern!r}"
                )
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
            out.append(ch)
        elif pattern.startswith("[]", i):
            out.append("(?!)")  # the empty class matches nothing
            i += 2
            continue
        elif pattern.startswith("[^]", i):
            out.append("[\\s\\S]")  # any character, line terminators too
            i += 3
            continue
        elif ch == "[":
            in_class = True
            out.append(ch)
            if pattern.startswith("^", i + 1):  # a leading ']' after '[^' would be ECMA's '[^]', above
                out.append("^")
                i += 1
        elif pattern.startswith("{,", i):
            raise ValueError(f"{{,n}} is literal text in ECMA-262 and a quantifier in Python: {pattern!r}")
        elif ch == "$":
            out.append("\\Z")  # the end of the text, never before a final newline
        elif ch == ".":
            out.append(f"[^{_LINE_TERMINATORS}]")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)
def compile(pattern: str) -> re.Pattern[str]:  # noqa: A001 - the module is used as jsonregex.compile
    """`pattern` compiled with its ECMA-262 meaning (cached: schemas repeat theirs for every value)."""
    return re.compile(translate(pattern), re.ASCII)


def search(pattern: str, text: str) -> bool:
    """Whether `text` matches `pattern` as JSON Schema's `pattern` keyword says (anywhere, unless anchored)."""
    return compile(pattern).search(text) is not None
