"""The filter grammar (Nostr-shaped): validate, match, and narrow by intersection (P11, P12)."""

from __future__ import annotations

import json
from typing import Any

from monitor_protocol.core import timefmt
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.store_contract import Alternative, Clause, LogQuery, Term
from monitor_protocol.core.vocab import (
    FILTER_KEYS,
    HORIZONS,
    MAX_FILTER_ALTERNATIVES,
    MAX_FILTER_BYTES,
    MAX_FILTER_TEXT_CHARS,
    MAX_NAME_CHARS,
    ORIGINS,
    SERVER_TYPES,
    TAG_KEY_PATTERN,
    TIERS,
    TYPE_PATTERN,
    TYPE_PREFIX_PATTERN,
)

LIST_KEYS = ("types", "sources", "subjects", "actors", "tiers", "origins", "horizons")
CLOSED_VALUES = {"tiers": TIERS, "origins": ORIGINS, "horizons": HORIZONS}

Filter = dict[str, Any] | list[dict[str, Any]]


def _known_keys() -> list[str]:
    return [*FILTER_KEYS, "#<tag>"]


def _type_is_known(pattern: str, known: list[str]) -> bool:
    if pattern.endswith("*"):
        prefix = pattern[:-1]
        return any(t.startswith(prefix) for t in known)
    return pattern in known


def validate(raw: Any, declared_types: list[str] | tuple[str, ...] = ()) -> Filter:
    """Return a normalised filter or raise INVALID_FILTER naming what to send instead (INVALID for a filter
    over the size limits of section 10)."""
    if raw is None:
        return {}
    _check_size(raw)
    if isinstance(raw, list):
        if not raw:
            return {}
        if any(isinstance(item, dict) and "limit" in item for item in raw):
            raise ProtocolError(
                "INVALID_FILTER",
                "limit applies to a whole pull, not to one alternative of a filter array: put it in an "
                "object filter or in the pull's limit.",
                known_keys=_known_keys(),
            )
        return [_validate_one(item, declared_types) for item in raw]
    return _validate_one(raw, declared_types)


def _check_size(raw: Any) -> None:
    from monitor_protocol.core.validation import check_json_size  # a filter is also a wire value, and bounded

    check_json_size(raw, "The filter", MAX_FILTER_BYTES)
    if isinstance(raw, list) and len(raw) > MAX_FILTER_ALTERNATIVES:
        raise ProtocolError(
            "INVALID",
            f"A filter array holds at most {MAX_FILTER_ALTERNATIVES} objects (this one {len(raw)}).",
            limit=MAX_FILTER_ALTERNATIVES,
        )


def _validate_one(raw: Any, declared_types: list[str] | tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(
            "INVALID_FILTER", "A filter is a JSON object (or an array of objects).", known_keys=_known_keys()
        )
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith("#") and len(key) > MAX_NAME_CHARS + 1:  # a tag's name is a name (section 10)
            raise ProtocolError(
                "INVALID_FILTER",
                f"A tag filter key is # and a name of at most {MAX_NAME_CHARS} characters (this one "
                f"{len(key) - 1}).",
                known_keys=_known_keys(),
            )
        if key in LIST_KEYS or TAG_KEY_PATTERN.match(key):
            if isinstance(value, str):
                value = [value]
            is_tag = key.startswith("#")
            if not isinstance(value, list) or not all(
                (isinstance(v, str) and len(v) <= MAX_NAME_CHARS) or (is_tag and v is None) for v in value
            ):
                raise ProtocolError(
                    "INVALID_FILTER",
                    f"Filter key {key!r} takes an array of strings of at most {MAX_NAME_CHARS} characters.",
                    known_keys=_known_keys(),
                )
            if key in CLOSED_VALUES:
                bad = [v for v in value if v not in CLOSED_VALUES[key]]
                if bad:
                    raise ProtocolError(
                        "INVALID_FILTER",
                        f"Filter key {key!r} has unknown value(s) {bad}; use one of {list(CLOSED_VALUES[key])}.",
                        invalid=bad,
                        known=list(CLOSED_VALUES[key]),
                        known_keys=_known_keys(),
                    )
            if key == "types":
                _check_types(value, declared_types)
            out[key] = list(value)
        elif key in ("since", "until"):
            if not isinstance(value, str) or timefmt.parse(value) is None:
                raise ProtocolError(
                    "INVALID_FILTER",
                    f"Filter key {key!r} takes an RFC 3339 time such as 2026-01-01T00:00:00Z.",
                    known_keys=_known_keys(),
                )
            out[key] = value
        elif key == "limit":
            from monitor_protocol.core.validation import as_int

            try:
                out[key] = as_int(value, "limit", minimum=1)
            except ProtocolError:
                raise ProtocolError(
                    "INVALID_FILTER",
                    "Filter key 'limit' takes an integer of at least 1 (ASCII digits).",
                    known_keys=_known_keys(),
                ) from None
        elif key == "text":
            if not isinstance(value, str):
                raise ProtocolError(
                    "INVALID_FILTER", "Filter key 'text' takes a string.", known_keys=_known_keys()
                )
            if len(value) > MAX_FILTER_TEXT_CHARS:
                raise ProtocolError(
                    "INVALID",
                    f"Filter text is {len(value)} characters; at most {MAX_FILTER_TEXT_CHARS} are allowed.",
                    limit=MAX_FILTER_TEXT_CHARS,
                )
            out[key] = value
        else:
            raise ProtocolError(
                "INVALID_FILTER",
                f"Unknown filter key {key[:64]!r}; use one of {', '.join(_known_keys())}.",
                invalid=key[:64],
                known_keys=_known_keys(),
            )
    return out


def _check_types(values: list[str], declared: list[str] | tuple[str, ...]) -> None:
    known = [*declared, *SERVER_TYPES]
    for pattern in values:
        if pattern.endswith("*"):
            bare = pattern[:-2] if pattern.endswith(".*") else pattern[:-1]
            if not TYPE_PREFIX_PATTERN.match(bare):
                # A prefix no reverse-DNS type starts with ("Foo*", "a b*", "com..*", "*" alone) matches nothing.
                raise ProtocolError(
                    "INVALID_FILTER",
                    f"Filter type prefix {pattern!r} is not the start of a reverse-DNS type: send lower-case "
                    "segments and a trailing * (e.g. com.example.* or com.example.ci.r*).",
                    invalid=pattern,
                    known_types=known,
                )
        elif not TYPE_PATTERN.match(pattern):
            raise ProtocolError(
                "INVALID_FILTER",
                f"Filter type {pattern!r} is not reverse-DNS (e.g. com.example.ci.run, or a prefix ending in *).",
                invalid=pattern,
                known_types=known,
            )
        if declared and not _type_is_known(pattern, known):
            raise ProtocolError(
                "INVALID_FILTER",
                f"Filter type {pattern!r} is not a type this monitor declares; use one of known_types.",
                invalid=pattern,
                known_types=known,
            )


def is_empty(flt: Filter) -> bool:
    if isinstance(flt, list):
        return all(not f for f in flt) if flt else True
    return not flt


def _prefix_match(patterns: list[str], value: str | None) -> bool:
    if value is None:
        return False
    for p in patterns:
        if p.endswith("*"):
            if value.startswith(p[:-1]):
                return True
        elif value == p:
            return True
    return False


def _tag_match(values: list[str | None], tag_value: Any) -> bool:
    if tag_value is None:
        return None in values
    if isinstance(tag_value, list):
        return any(v in values for v in tag_value if isinstance(v, str))
    return str(tag_value) in values if not isinstance(tag_value, bool) else json.dumps(tag_value) in values


def _match_one(flt: dict[str, Any], event: dict[str, Any], memo: dict[str, str]) -> bool:
    for key, value in flt.items():
        if key == "types":
            if not _prefix_match(value, event.get("type")):
                return False
        elif key == "sources":
            if event.get("source") not in value:
                return False
        elif key == "subjects":
            if not _prefix_match(value, event.get("subject")):
                return False
        elif key == "actors":
            if event.get("actor") not in value:
                return False
        elif key == "tiers":
            if event.get("tier") not in value:
                return False
        elif key == "origins":
            if event.get("origin") not in value:
                return False
        elif key == "horizons":
            if event.get("horizon") not in value:
                return False
        elif key == "since":
            t, s = timefmt.parse(event.get("time", "")), timefmt.parse(value)
            if t is None or s is None or t < s:
                return False
        elif key == "until":
            t, u = timefmt.parse(event.get("time", "")), timefmt.parse(value)
            if t is None or u is None or t > u:
                return False
        elif key == "text":
            if not _text_match(value, event, memo):
                return False
        elif key.startswith("#"):
            tags = (event.get("data") or {}).get("tags") or {}
            if not _tag_match(value, tags.get(key[1:])):
                return False
    return True


def _text_match(needle: str, event: dict[str, Any], memo: dict[str, str]) -> bool:
    # Addressing, not ownership (P12): the subject, the type and what the publisher wrote in data. The
    # haystack is built once per event however many alternatives ask for text (bounded work per row).
    hay = memo.get("hay")
    if hay is None:
        data = dict(event.get("data") or {})
        data.pop("provenance", None)
        hay = " ".join(
            [
                event.get("type") or "",
                event.get("subject") or "",
                json.dumps(data, ensure_ascii=False, sort_keys=True),
            ]
        ).lower()
        memo["hay"] = hay
    return needle.lower() in hay


def matches(flt: Filter, event: dict[str, Any]) -> bool:
    memo: dict[str, str] = {}
    if isinstance(flt, list):
        return not flt or any(_match_one(f, event, memo) for f in flt)
    return _match_one(flt, event, memo)


def limit_of(flt: Filter) -> int | None:
    if isinstance(flt, dict):
        return flt.get("limit")
    return None


def _patterns_overlap(p: str, q: str) -> bool:
    """Could some value match both patterns (each exact, or a prefix ending in *)?"""
    p_prefix, q_prefix = p.endswith("*"), q.endswith("*")
    if p_prefix and q_prefix:
        a, b = p[:-1], q[:-1]
        return a.startswith(b) or b.startswith(a)
    if p_prefix:
        return q.startswith(p[:-1])
    if q_prefix:
        return p.startswith(q[:-1])
    return p == q


_DISJOINT_KEYS = {"types": True, "subjects": True, "actors": False}  # key -> prefix patterns allowed


def _one_disjoint(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    for key, prefixes in _DISJOINT_KEYS.items():
        if key in a and key in b:
            left, right = a[key], b[key]
            if prefixes:
                overlap = any(_patterns_overlap(p, q) for p in left for q in right)
            else:
                overlap = bool(set(left) & set(right))
            if not overlap:
                return f"{key} {left} and {right} share nothing"
    return None


def disjoint(subscription: Filter, inline: Filter) -> str | None:
    """Why the intersection of two filters is empty by construction (disjoint types, subjects or actors
    lists, docs/protocol.md section 8), or None when it may match something."""
    left = subscription if isinstance(subscription, list) else [subscription]
    right = inline if isinstance(inline, list) else [inline]
    left = [f for f in left if f] or [{}]
    right = [f for f in right if f] or [{}]
    reasons = []
    for a in left:
        for b in right:
            why = _one_disjoint(a, b)
            if why is None:
                return None
            reasons.append(why)
    return "; ".join(dict.fromkeys(reasons))


# ===================================================================================== index terms
# Filter keys a store answers from its indexed columns (core/store_contract.py LOG_COLUMNS): key -> (column,
# whether a value ending in * is a prefix). The other keys are checked on the row by `matches`.
_INDEXED = {
    "types": ("type", True),
    "subjects": ("subject", True),
    "actors": ("actor", False),
    "tiers": ("tier", False),
    "origins": ("origin", False),
    "horizons": ("horizon", False),
}
_ROW_ONLY_KEYS = ("sources", "since", "until", "text")  # and every #tag; "limit" does not select


def _alternative(flt: dict[str, Any]) -> tuple[Alternative, bool]:
    terms: list[Term] = []
    complete = True
    for key, value in flt.items():
        if key in _INDEXED:
            column, prefixes = _INDEXED[key]
            exact = tuple(v for v in value if not (prefixes and v.endswith("*")))
            pre = tuple(v[:-1] for v in value if prefixes and v.endswith("*"))
            terms.append(Term(column, exact, pre))
        elif key in _ROW_ONLY_KEYS or key.startswith("#"):
            complete = False
    return tuple(terms), complete


def prefilter(*flts: Filter) -> LogQuery:
    """What a store can select on its indexed columns for rows matching every one of `flts` (a pull's
    subscription filter and its inline filter): a necessary condition, and `complete` when it is also
    sufficient (then a store's count is the exact lag and no row needs `matches`)."""
    clauses: list[Clause] = []
    complete = True
    for flt in flts:
        if is_empty(flt):
            continue
        alternatives = []
        for one in flt if isinstance(flt, list) else [flt]:
            alt, whole = _alternative(one)
            alternatives.append(alt)
            complete = complete and whole
        clauses.append(tuple(alternatives))
    return LogQuery(tuple(clauses), complete)


_KEYS: dict[
    int, tuple[Any, str]
] = {}  # id(filter) -> (that filter, its key): a reader's filter is one object


def key_of(flt: Filter) -> Any:
    """A hashable key that equal filters share (sets of equal filters read alike): its compact JSON, with
    sorted keys. Worked out once per filter object (a subscription's filter lives as long as its record;
    the entry holds the object, so its id cannot be another's)."""
    if flt is None or (isinstance(flt, dict) and not flt):
        return None
    known = _KEYS.get(id(flt))
    if known is not None and known[0] is flt:
        return known[1]
    key = json.dumps(flt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(_KEYS) >= 4096:
        _KEYS.clear()
    _KEYS[id(flt)] = (flt, key)
    return key
