"""Request validation shared by the rules: integers, objects, names, actors, reasons and closed
vocabularies (P11, docs/protocol.md sections 3 and 10)."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.vocab import (
    ACTOR_PREFIXES,
    MAX_INTEGER,
    MAX_NAME_CHARS,
    MAX_REASON_BYTES,
    MONITOR_ID_PATTERN,
)


def invalid(message: str, **extras: Any) -> ProtocolError:
    return ProtocolError("INVALID", message, **extras)


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (a refusal names what was sent, never a Python type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"  # 3.0 too: an integer is written without a fraction (section 10)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def is_digits(text: str) -> bool:
    """ASCII decimal digits and nothing else: no sign, no space, no "²" or "٣" (str.isdigit says yes)."""
    return bool(text) and text.isascii() and text.isdigit()


def as_int(
    value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None, text: bool = True
) -> int:
    """The one integer rule (section 10): a JSON integer, or (`text`, for a query) ASCII decimal digits,
    within 0..2^53 in magnitude. A boolean, a float (even 5.0) or any other spelling is 400 INVALID."""
    if isinstance(value, bool):
        raise invalid(f"{name} must be an integer, not a boolean.")
    if isinstance(value, str) and not text:
        raise invalid(f"{name} must be a JSON integer, not the string {value[:40]!r}.")
    if isinstance(value, str):
        if not is_digits(value):
            raise invalid(f"{name} must be an integer in ASCII decimal digits, not {value[:40]!r}.")
        if len(value) > 17:
            raise invalid(f"{name} must be within 0..2^53 (got a {len(value)}-digit number).")
        value = int(value)
    if not isinstance(value, int):
        raise invalid(f"{name} must be an integer, not {json_kind(value)}.")
    if abs(value) > MAX_INTEGER:
        raise invalid(f"{name} must be within 0..2^53 (got a {len(str(abs(value)))}-digit number).")
    if minimum is not None and value < minimum:
        raise invalid(f"{name} must be at least {minimum} (got {value}).")
    if maximum is not None and value > maximum:
        raise invalid(f"{name} must be at most {maximum} (got {value}).")
    return value


def require_object(body: Any, what: str, known: frozenset[str] | None = None) -> dict[str, Any]:
    """The body as an object (none: empty). With `known`, a member outside it is 400 INVALID naming it: a
    misspelt field (`filters` for `filter`) would otherwise be dropped and the call would mean something else."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise invalid(f"The {what} body must be a JSON object.")
    if known is not None:
        refuse_unknown(body, what, known)
    return wire.check(body)


def refuse_unknown(body: dict[str, Any], what: str, known: frozenset[str]) -> None:
    """400 INVALID naming the members outside `known` (the first 10, each cut to 64 characters) and listing
    what the call takes."""
    if not body.keys() <= known:
        unknown = sorted(name[:64] for name in body if name not in known)[:10]
        raise invalid(f"Unknown {what} field(s) {unknown}; send only {sorted(known)}.", invalid=unknown)


# In ASCII, whitespace and control characters are exactly these (no ASCII character is Cf or Cs).
_ASCII_BAD = re.compile(r"[\x00-\x20\x7f]")


def _bad_char(value: str) -> str | None:
    if value.isascii():
        found = _ASCII_BAD.search(value)
        return None if found is None else f"U+{ord(found.group()):04X}"
    for ch in value:
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
            return f"U+{ord(ch):04X}"
    return None


def check_name(value: Any, name: str, example: str) -> str:
    """An id, subject or type: a non-empty string of at most 256 characters."""
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} must be a non-empty string such as {example}.")
    if len(value) > MAX_NAME_CHARS:
        raise invalid(
            f"{name} is {len(value)} characters long; at most {MAX_NAME_CHARS} are allowed.",
            limit=MAX_NAME_CHARS,
        )
    return value


def check_monitor_id(value: Any, name: str, example: str) -> str:
    """A new monitor's id (section 3): 2-64 ASCII letters, digits, '_', '.' or '-'. A missing id and a
    malformed one are told apart, so the caller knows whether to add it or to change it."""
    if isinstance(value, str) and MONITOR_ID_PATTERN.match(value):
        return value
    rule = f"2-64 letters, digits, '_', '.' or '-' (e.g. {example})"
    if value is None or value == "":
        raise invalid(f"{name} is required: {rule}.")
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string of {rule}, not {json_kind(value)}.")
    bad = next(
        (f"U+{ord(ch):04X}" for ch in value if not (ch.isascii() and (ch.isalnum() or ch in "_.-"))), None
    )
    found = f"it holds {bad}" if bad is not None else f"it is {len(value)} characters long"
    raise invalid(f"{name} {value[:64]!r} is not a monitor id ({found}): use {rule}.", invalid=value[:64])


_GOOD_ACTORS: dict[str, None] = {}  # names already found good: the same few publish again and again
_GOOD_ACTORS_MAX = 4096


def check_actor(value: Any, name: str) -> str:
    """Any non-empty name of at most 256 characters without whitespace or control characters (section 3);
    a lower-case prefix such as human: says what it is, any other form is treated as an agent."""
    if type(value) is str and value in _GOOD_ACTORS:
        return value
    check_name(value, name, "human:you, agent:claude or reader-7")
    bad = _bad_char(value)
    if bad is not None:
        raise invalid(
            f"{name} may not contain whitespace or control characters (found {bad}); send a name such as "
            "agent:claude or reader-7."
        )
    prefix, colon, rest = value.partition(":")
    if colon and not rest and prefix.lower() in ACTOR_PREFIXES:
        raise invalid(f"{name} {value!r} names nobody: put the name after the prefix, e.g. {prefix}:you.")
    if type(value) is str:
        if len(_GOOD_ACTORS) >= _GOOD_ACTORS_MAX:
            _GOOD_ACTORS.clear()
        _GOOD_ACTORS[value] = None
    return value


def check_reason(value: Any, name: str) -> str | None:
    """A reason or note: a string of at most 1 KiB (UTF-8), or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string.")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_REASON_BYTES:
        raise invalid(
            f"{name} is {size} bytes; at most {MAX_REASON_BYTES} bytes are allowed.", limit=MAX_REASON_BYTES
        )
    return wire.check(value)


def check_json_size(value: Any, name: str, limit: int) -> Any:
    """A structured field whose serialized JSON is at most `limit` bytes."""
    wire.check(value)
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > limit:
        raise invalid(f"{name} is {size} bytes as JSON; at most {limit} are allowed.", limit=limit)
    return value


def check_vocab(value: Any, known: tuple[str, ...], name: str) -> str:
    if value not in known:
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"Unknown {name} {str(value)[:80]!r}; use one of {', '.join(known)}.",
            field=name,
            invalid=value if isinstance(value, str) and len(value) <= 256 else str(value)[:80],
            known=list(known),
        )
    return value


def check_vocab_list(value: Any, known: tuple[str, ...], name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{name} must be an array of strings from {list(known)}.")
    for v in value:
        check_vocab(v, known, name)
    return list(dict.fromkeys(value))
