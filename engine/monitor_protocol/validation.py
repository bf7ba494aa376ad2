"""Request validation shared by the rules: integers, objects, actors and closed vocabularies (P11)."""

from __future__ import annotations

from typing import Any

from .errors import ProtocolError
from .vocab import ACTOR_PATTERN


def invalid(message: str, **extras: Any) -> ProtocolError:
    return ProtocolError("INVALID", message, **extras)


def as_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Integers only (a JSON number without a fraction, or a decimal string from a query)."""
    if isinstance(value, bool):
        raise invalid(f"{name} must be an integer, not a boolean.")
    if isinstance(value, str):
        text = value.strip()
        if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
            raise invalid(f"{name} must be an integer, not {value!r}.")
        value = int(text)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise invalid(f"{name} must be an integer, not {type(value).__name__}.")
    if minimum is not None and value < minimum:
        raise invalid(f"{name} must be at least {minimum} (got {value}).")
    if maximum is not None and value > maximum:
        raise invalid(f"{name} must be at most {maximum} (got {value}).")
    return value


def require_object(body: Any, what: str) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise invalid(f"The {what} body must be a JSON object.")
    return body


def check_actor(value: Any, name: str) -> str:
    if not isinstance(value, str) or not ACTOR_PATTERN.match(value):
        raise invalid(f"{name} must be an actor such as human:you, agent:claude or probe:ci (got {value!r}).")
    return value


def check_vocab(value: Any, known: tuple[str, ...], name: str) -> str:
    if value not in known:
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"Unknown {name} {value!r}; use one of {', '.join(known)}.",
            field=name,
            invalid=value,
            known=list(known),
        )
    return value


def check_vocab_list(value: Any, known: tuple[str, ...], name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{name} must be an array of strings from {list(known)}.")
    for v in value:
        check_vocab(v, known, name)
    return list(dict.fromkeys(value))
