"""The wire is RFC 8259 JSON (docs/protocol.md section 10): parse strictly, and check any value a door hands the
engine. No NaN or Infinity, no number that overflows a double, no integer beyond 2^53, no lone surrogate, at
most 32 levels of nesting, no member name twice in one object (I-JSON, RFC 7493). One place for these
rules; every door and the engine use it (MCP tool arguments arrive parsed by the MCP SDK, which keeps the
last of a repeated name: `check` judges the rest of them)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.vocab import MAX_INTEGER, MAX_JSON_DEPTH, MAX_RAW_BYTES


def compact_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``, the same text and the
    same refusals, without JSONEncoder.encode's Python steps around the standard library's C encoder: each
    thread makes that encoder once (~1 µs less per small value). Its circular-reference guard is a dict the
    encoder keeps, so each thread has its own, emptied after any failure (a value refused part way leaves
    the containers it was in)."""
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        from json.encoder import c_make_encoder, encode_basestring
    except ImportError:  # pragma: no cover - no _json accelerator
        return encoder.encode
    if c_make_encoder is None:  # pragma: no cover - no _json accelerator
        return encoder.encode

    def made() -> tuple[Callable[[Any, int], Any], dict[int, Any]]:
        markers: dict[int, Any] = {}
        # JSONEncoder.iterencode's arguments for these settings (Python 3.11-3.13)
        fast = c_make_encoder(
            markers, encoder.default, encode_basestring, None, ":", ",", False, False, False
        )
        return fast, markers

    try:
        fast, _ = made()
        if "".join(fast({"a": [1, 2.5, None, "é"]}, 0)) != '{"a":[1,2.5,null,"é"]}':
            return encoder.encode  # pragma: no cover - another Python's arguments
    except TypeError:  # pragma: no cover - another Python's arguments
        return encoder.encode
    local = threading.local()

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return encoder.encode(value)
        try:
            fast, markers = local.made
        except AttributeError:
            fast, markers = local.made = made()
        try:
            return "".join(fast(value, 0))
        except BaseException:
            markers.clear()
            raise

    return encode


_dumps = compact_encoder()


# ---------------------------------------------------------------------------------------------- the codec
# Values the engine has already checked (replies, stored rows) are encoded and decoded by one codec: the
# standard library's, unless a door installs a faster one with the same output (mp serve installs orjson
# when it is there: the same compact JSON, 10-20 times faster, byte for byte but for a float's exponent
# form, 1.5e-07 against 1.5e-7: a row stored by one and served as its text shows the other's). Requests are
# parsed by `loads` below, whose rules (no integer beyond 2^53, ...) a faster parser does not all share: it
# may try the codec's strict `parse` first, and falls back on its own rules for anything that parser refuses.
@dataclass(frozen=True)
class Codec:
    name: str
    encode: Callable[[Any], bytes]  # compact UTF-8 JSON of a checked value
    decode: Callable[[bytes | str], Any]  # JSON this engine wrote (a stored row), trusted
    # A strict RFC 8259 parser of UTF-8 bytes that refuses NaN, Infinity, lone surrogates and trailing
    # content (orjson is one): `loads` tries it first and falls back on its own rules for whatever it refuses
    # or may not judge alike (a run of 16 digits: an integer near or beyond 2^53).
    parse: Callable[[bytes], Any] | None = None
    # A value `encode` writes as the JSON text it is given, as is (orjson.Fragment): a stored row served
    # without being decoded and encoded again. None: the codec has no such value (the standard library's).
    raw: Callable[[str], Any] | None = None


STDLIB_CODEC = Codec("json", lambda value: _dumps(value).encode(), json.loads)
_codec = STDLIB_CODEC


def use_codec(codec: Codec) -> None:
    """Install `codec` for every encode and trusted decode from now on (a door does, once, at start)."""
    global _codec
    _codec = codec


def codec() -> Codec:
    return _codec


def encode(value: Any) -> bytes:
    """The compact UTF-8 JSON of a value the engine serves or stores (already checked)."""
    return _codec.encode(value)


def encode_text(value: Any) -> str:
    return _codec.encode(value).decode()


def raw_json(text: str, redelivered: bool = False) -> Any:
    """A JSON object this engine stored (a row's event text) as a value `encode` writes as is, with
    `"redelivered": true` added when asked; None when the installed codec has no such value, or when the
    text names "redelivered" already (the decoded object's merge then decides what is served)."""
    raw = _codec.raw
    if raw is None:
        return None
    if redelivered:
        if '"redelivered"' in text or text[-1:] != "}" or text == "{}":  # (the engine writes compact text)
            return None
        text = text[:-1] + ',"redelivered":true}'
    return raw(text)


def decode_trusted(data: bytes | str) -> Any:
    """A JSON text this engine wrote itself (a stored row): no checks, the fastest decoder installed."""
    return _codec.decode(data)


def _refuse(message: str) -> ProtocolError:
    return ProtocolError("INVALID", message, limit="json")


def _constant(name: str) -> Any:
    raise _refuse(f"{name} is not JSON (RFC 8259): send a number, a string or null instead.")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _refuse(f"The number {text[:40]} overflows a double: send it as a string.")
    return value


def _int(text: str) -> int:
    if len(text) > 17 or abs(int(text)) > MAX_INTEGER:
        raise _refuse(
            f"The integer {text[:40]}{'...' if len(text) > 40 else ''} is beyond 2^53, which other JSON "
            "clients cannot represent: a cursor, seq or count is at most 2^53, and a larger number in data is "
            "sent as a string."
        )
    return int(text)


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")
_INNERMOST = re.compile(rb"\[\]|\{\}")


def nests_too_deep(raw: bytes, levels: int | None = None) -> bool:
    """Whether a JSON text nests deeper than `levels` (or its brackets do not match), found without parsing
    it: on Pyodide a parser's recursion overflows the WebAssembly stack long before Python's recursion
    limit says so, and takes the page's event loop down with it (the page's import, and its console for a
    remote server, check with this first; so does `loads`). Regular expressions only: strings out,
    brackets kept, the innermost pairs removed `levels` times."""
    if levels is None:
        levels = MAX_JSON_DEPTH  # read at the call: the limit is one module constant, read where it is used
    if raw.count(b"[") + raw.count(b"{") <= levels:
        return False
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    for _ in range(levels):
        brackets = _INNERMOST.sub(b"", brackets)
        if not brackets:
            return False
    return True


# A run of 16 digits may be an integer beyond 2^53 (or a float orjson would round otherwise than the
# rules): such a body takes the standard library's path, whose hooks judge each number. Found by mapping
# every digit to "0" and looking for sixteen of them, 10-15x faster than a regular expression's scan.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_SIXTEEN_DIGITS = b"0" * 16


def _has_long_number(raw: bytes) -> bool:
    # (find, not `in`: on bytes, `in` costs twice as much as find for a request's short body here)
    return raw.translate(_DIGITS_AS_ZERO).find(_SIXTEEN_DIGITS) >= 0


# The last value `loads` returned, checked whole, and when it is an array (a batch) the ids of its items:
# `check` knows them (see there). One tuple, replaced whole: a door may parse on one thread while the engine
# checks on another, and the ids are only theirs while the tuple holds the value they belong to.
# (value, a batch's item ids, the size of the text it was parsed from)
_vetted: tuple[Any, frozenset[int], int] = (None, frozenset(), 0)
# And the last few small objects it returned, by id: a door parses a group's lone publishes before the engine
# runs them (api/rest.py handle_publishes), so the last value alone would be all but one of them walked again.
# Bounded by count and by text size: 64 bodies of at most 4 KiB (a publish is a few hundred bytes), whose
# objects hold at most ~25 times their text (`[{},{},...]`): a few MB held at worst, by anyone who can send a
# body. Emptied, never trimmed, so a reader on another thread sees a value or nothing (a miss is only a walk).
_vetted_small: dict[int, Any] = {}
_VETTED_SMALL_COUNT = 64
_VETTED_SMALL_BYTES = 4 * 1024


def loads(raw: bytes | str) -> Any:
    """Parse one JSON text strictly, then check it; every refusal is 400 INVALID with a sentence."""
    if isinstance(raw, bytes) and (b"\x00" in raw or raw[:2] in _UTF16_BOMS):
        # UTF-16 or UTF-32 (json.loads would read them): RFC 8259 puts UTF-8 on the wire, and a proxy judging
        # the bytes as UTF-8 would not see what this server publishes. (A UTF-8 BOM is ignored, as it allows.)
        raise ProtocolError(
            "INVALID",
            "The body is not UTF-8 (it holds NUL bytes: UTF-16 or UTF-32?): send UTF-8 JSON (RFC 8259).",
        )
    parse = _codec.parse
    if parse is not None and isinstance(raw, bytes) and not _has_long_number(raw):
        # A strict parser of bounded recursion (orjson: 1024 levels, refused beyond) has judged NaN,
        # overflowing floats, lone surrogates and trailing content already: only the depth is left.
        try:
            value = parse(raw)
        except Exception:
            pass  # refused: the rules below say why, in their own words
        else:
            if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
                raise _refuse(f"The body nests deeper than {MAX_JSON_DEPTH} levels; flatten it.")
            _refuse_repeated_names(raw, value)
            return _vet(value, len(raw))
    text = _as_utf8(raw)
    if nests_too_deep(text):  # before a recursive parser goes into it
        raise _refuse(f"The body nests deeper than {MAX_JSON_DEPTH} levels; flatten it.")
    try:
        value = json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except ProtocolError:
        raise
    except RecursionError:
        raise _refuse(f"The body nests deeper than {MAX_JSON_DEPTH} levels; flatten it.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(
            "INVALID", f"The body is not valid JSON ({exc.__class__.__name__}): send a JSON object."
        ) from None
    if _needs_walk(raw):
        check(value)
    _refuse_repeated_names(text, value)
    return _vet(value, len(text))


# A member name ends with its closing quote and a colon; so does nothing else in JSON but a string holding
# `\":`. Counted in the text, they are at least the names the parsed value holds, and exactly as many when
# no object repeats a name (a parser keeps one of the two, and which one differs between parsers: a proxy
# judging the first `tier` and this server the last would disagree on what was published).
_NAME_END = re.compile(rb'"[ \t\n\r]*:')
_QUOTE_THEN_SPACE = re.compile(rb'"[ \t\n\r]')


def _refuse_repeated_names(raw: bytes, value: Any) -> None:
    if type(value) is not dict and type(value) is not list:
        return
    if _names_in_text(raw) == _count_names(value):
        return
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if not repeated and len({name for name, _ in items}) != len(items):
            seen: set[str] = set()
            repeated.append(next(name for name, _ in items if name in seen or seen.add(name)))  # type: ignore[func-returns-value]
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)  # the text parsed already: this only finds the name
    if repeated:
        raise _refuse(
            f"An object names {repeated[0][:64]!r} twice; send each member name once (JSON parsers disagree on "
            "which of the two they keep)."
        )


def _names_in_text(raw: bytes) -> int:
    """The name-ending quotes of a text: `":` (a compact writer's), and a regular expression's count only
    when a quote is followed by JSON whitespace somewhere (`"a" : 1`, or pretty-printed text)."""
    # One scan for the four (four `in` tests cost 2 us on a request's short body here, the search 0.5)
    if _QUOTE_THEN_SPACE.search(raw) is not None:
        return len(_NAME_END.findall(raw))
    return raw.count(b'":')


def _count_names(value: Any) -> int:
    """The member names of every object in a parsed value (a batch of 100 two-level objects: ~65 µs)."""
    count, stack = 0, [value]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if type(node) is dict:
            count += len(node)
            node = node.values()
        for item in node:
            kind = type(item)
            if kind is dict or kind is list:
                push(item)
    return count


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _as_utf8(raw: bytes | str) -> bytes:
    """The text as UTF-8, for the bracket count: json.loads also reads UTF-16 and UTF-32 bytes (whose code
    units may hold the byte of a quote or a backslash) and str."""
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    if b"\x00" not in raw:
        return raw
    try:
        return raw.decode(json.detect_encoding(raw), "surrogatepass").encode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, LookupError):
        return raw  # not text json.loads reads either: it refuses it as not JSON


def _vet(value: Any, size: int) -> Any:
    """Remember a value `loads` checked whole (and a batch's items; a small object among the last few), so
    `check` does not walk it again."""
    global _vetted
    _vetted = (value, frozenset(map(id, value)) if type(value) is list else frozenset(), size)
    if type(value) is dict and size <= _VETTED_SMALL_BYTES:
        small = _vetted_small
        if len(small) >= _VETTED_SMALL_COUNT:
            small.clear()
        small[id(value)] = value
    return value


def _deeper_than(value: Any, levels: int) -> bool:
    """Whether a parsed value nests deeper than `levels`: only its arrays and objects are visited, one level
    at a time (a batch's items are one level: a comprehension per level, not a loop per node)."""
    if type(value) is not dict and type(value) is not list:
        return False
    level = [value]
    for _ in range(levels):
        level = [
            item
            for node in level
            for item in (node.values() if type(node) is dict else node)
            if type(item) is dict or type(item) is list
        ]
        if not level:
            return False
    return True


def _needs_walk(raw: bytes | str) -> bool:
    """Whether a text json.loads accepted (with the hooks above: no NaN, no overflowing float, no integer
    beyond 2^53) may still hold what `problem` refuses: a lone surrogate needs a `\\uD800`-`\\uDFFF`
    escape or the bytes 0xED 0xA0-0xBF, and more than MAX_JSON_DEPTH levels need that many brackets. Most
    bodies have neither, and skip the walk over the parsed value."""
    if not isinstance(raw, bytes) or b"\x00" in raw or b"\xed" in raw:
        # a str may hold a lone surrogate as is; json.loads reads UTF-16 and UTF-32 bytes too (NULs), and
        # decodes UTF-8 with surrogatepass (0xED leads the bytes of U+D000-U+DFFF): walk those
        return True
    if b"\\u" in raw and (b"\\ud" in raw or b"\\uD" in raw):
        return True
    return raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH


_SURROGATE = "A string holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text: send UTF-8 text."
_BEYOND = (
    "An integer is beyond 2^53, which other JSON clients cannot represent: a cursor, seq or count is at most "
    "2^53, and a larger number in data is sent as a string."
)
_NAN = "NaN and Infinity are not JSON (RFC 8259): send a number, a string or null."


def problem(value: Any) -> str | None:
    """What keeps `value` off the wire, or None. Iterative: a hostile depth cannot exhaust the stack. The
    usual values (str, int, None, bool, dicts and lists of them) are judged without leaving the loop."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        kind = type(node)
        if kind is dict:
            if depth > MAX_JSON_DEPTH:
                return f"The value nests deeper than {MAX_JSON_DEPTH} levels; flatten it."
            for key, item in node.items():
                if type(key) is not str:
                    if not isinstance(key, str):
                        return "Object keys must be strings."
                    push((key, depth))
                elif not key.isascii() and _lone_surrogate(key):
                    return _SURROGATE
                item_kind = type(item)
                if item_kind is str:
                    if not item.isascii() and _lone_surrogate(item):
                        return _SURROGATE
                elif item_kind is int:
                    if item > MAX_INTEGER or item < -MAX_INTEGER:
                        return _BEYOND
                elif item is not None and item_kind is not bool:
                    push((item, depth + 1))
        elif kind is list:
            if depth > MAX_JSON_DEPTH:
                return f"The value nests deeper than {MAX_JSON_DEPTH} levels; flatten it."
            for item in node:
                push((item, depth + 1))
        elif kind is str:
            if not node.isascii() and _lone_surrogate(node):
                return _SURROGATE
        elif node is None or kind is bool:
            continue
        elif kind is int:
            if node > MAX_INTEGER or node < -MAX_INTEGER:
                return _BEYOND
        elif kind is float:
            if math.isnan(node) or math.isinf(node):
                return _NAN
        else:
            reason = _subclass_problem(node, depth, push)
            if reason is not None:
                return reason
    return None


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _subclass_problem(node: Any, depth: int, push: Callable[[tuple[Any, int]], None]) -> str | None:
    """A value of a subclass of a JSON type (a str or int subclass, an OrderedDict, a tuple is not one)."""
    if isinstance(node, str):
        return _SURROGATE if not node.isascii() and _lone_surrogate(node) else None
    if isinstance(node, bool):
        return None
    if isinstance(node, int):
        return _BEYOND if abs(node) > MAX_INTEGER else None
    if isinstance(node, float):
        return _NAN if math.isnan(node) or math.isinf(node) else None
    if isinstance(node, dict):
        if depth > MAX_JSON_DEPTH:
            return f"The value nests deeper than {MAX_JSON_DEPTH} levels; flatten it."
        for key, item in node.items():
            if not isinstance(key, str):
                return "Object keys must be strings."
            push((key, depth))
            push((item, depth + 1))
        return None
    if isinstance(node, list):
        if depth > MAX_JSON_DEPTH:
            return f"The value nests deeper than {MAX_JSON_DEPTH} levels; flatten it."
        for item in node:
            push((item, depth + 1))
        return None
    return f"A {type(node).__name__} is not a JSON value."


def parsed_size(value: Any) -> int | None:
    """At most how many bytes of JSON text `value` was parsed from, when it is what `check` skips (the value
    `loads` last returned or an item of it, a small object among the last few); None for any other value."""
    vetted, items, size = _vetted
    if value is None:
        return None
    if value is vetted or id(value) in items:
        return size
    return _VETTED_SMALL_BYTES if _vetted_small.get(id(value)) is value else None


def check(value: Any) -> Any:
    """Raise 400 INVALID when `value` could not travel as RFC 8259 JSON; return it otherwise. The value
    `loads` last returned (and the last few small objects it returned) was checked whole as it was parsed and
    is not walked again: a door hands the engine what it parsed, and the rule is that nothing changes a
    parsed body before the engine checks it (a door that builds on one passes a new object, walked)."""
    vetted, items, _size = _vetted
    if value is not None and (value is vetted or id(value) in items or _vetted_small.get(id(value)) is value):
        return value  # _vetted holds the batch (and _vetted_small each value), so their ids are theirs alone
    reason = problem(value)
    if reason is not None:
        raise _refuse(reason)
    return value


def bounded_raw(value: Any) -> dict[str, Any]:
    """The raw refused payload for a rejected row (P2), bounded so a protocol row stays a few KiB: whole
    when small and well formed, otherwise an excerpt of its JSON with its size and digest."""
    reason = problem(value)
    if reason is not None:
        return {"raw": None, "raw_unrepresentable": reason}
    text = _dumps(value)
    size = len(text.encode("utf-8"))
    if size <= MAX_RAW_BYTES:
        return {"raw": value}
    return {
        "raw": text.encode("utf-8")[: MAX_RAW_BYTES // 2].decode("utf-8", "ignore"),
        "raw_truncated": True,
        "raw_bytes": size,
        "raw_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }


def scrub(value: Any) -> Any:
    """An error body echoes what the caller sent (a path, an id, an Origin); a lone surrogate there, which only
    an in-process door can deliver, becomes U+FFFD so the reply is still UTF-8 JSON."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value
