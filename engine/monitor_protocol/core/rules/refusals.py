"""Refused inputs of an owner's calls outside a publish, logged as evidence (P2, section 10): an update, a
pause, a resume, a retire, a batch on a monitor or a subscribe to it, refused for what its input holds (400
INVALID, INVALID_FILTER, UNKNOWN_VOCABULARY, 413 TOO_LARGE), appends a rejected row with the raw input, as a
refused publish does, when the caller holds the monitor's owner token. Nothing else is logged: an anonymous
caller, or every consumer given the subscribe token, could otherwise fill a monitor's log with refusals at
no cost, and a reader's refused ack, pull, seek or lease call would land in the very feed it reads, so the
page after it would not be the page before (docs/protocol.md section 10). A refused subscribe's push secret
and the path of its sink are withheld: every reader of the monitor reads the row. Only the service imports
this."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from monitor_protocol.core import tokens
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules.ledger import reject
from monitor_protocol.core.rules.lookups import monitor_of
from monitor_protocol.core.tx import Tx

# The codes of an input refused for what it holds (the rest say who may do what, or where a thing stands).
REFUSED_INPUT = frozenset({"INVALID", "INVALID_FILTER", "UNKNOWN_VOCABULARY", "TOO_LARGE"})

# What a call names: a monitor by its owner ("monitor"), or a monitor asked for a subscription ("subscribe").
Target = Literal["monitor", "subscribe"]

WITHHELD = "(withheld)"


def loggable(error: ProtocolError, token: str | None) -> bool:
    return token is not None and error.code in REFUSED_INPUT and "rejected_seq" not in error.extras


def refuse_input(
    tx: Tx, target: Target, monitor_id: Any, token: str | None, error: ProtocolError, raw: Any
) -> None:
    """Append the refusal to monitor `monitor_id` when `token` is its owner's, and raise it as a LoggedRefusal
    (its `rejected_seq` set); a ProtocolError from the lookup, or UNAUTHORIZED, when not."""
    rec = monitor_of(tx, monitor_id)
    if not tokens.matches(token, rec.owner_hash):
        raise ProtocolError("UNAUTHORIZED", "Not the owner's token: the refusal is not logged.")
    if target == "subscribe" and isinstance(raw, dict):
        raw = withheld(raw)
        named = raw.get("subscriber")
        raise reject(tx, rec.id, error, raw, named if isinstance(named, str) else None)
    raise reject(tx, rec.id, error, raw, rec.owner)


def withheld(body: dict[str, Any]) -> dict[str, Any]:
    """A subscribe body as a rejected row may show it: no `sink_secret`, and of the `sink` only its scheme and
    host (its path and query may be a credential, as many webhook URLs are)."""
    out = dict(body)
    if "sink_secret" in out:
        out["sink_secret"] = WITHHELD
    if out.get("sink") is not None:
        out["sink"] = shown_sink(out["sink"])
    return out


def shown_sink(sink: Any) -> str:
    """A sink as a row every reader of the monitor reads may show it: its scheme and host, never its path or
    query (many webhook URLs carry their credential there)."""
    try:
        parts = urlsplit(sink) if isinstance(sink, str) else None
        host = parts.hostname if parts is not None else None
    except ValueError:
        host = None
    return f"{parts.scheme}://{host}/{WITHHELD}" if parts is not None and host else WITHHELD
