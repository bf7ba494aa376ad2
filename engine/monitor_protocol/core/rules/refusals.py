"""Refused inputs of an owner's calls outside a publish, logged as evidence (P2, section 10): an update, a
pause, a resume, a retire or a batch on a monitor, or a subscribe to it, refused for what its input holds
(400 INVALID, INVALID_FILTER, UNKNOWN_VOCABULARY, 413 TOO_LARGE) appends a rejected row with the raw input, as
a refused publish does, when the caller holds the monitor's owner token (or, for a subscribe, its subscribe
token). Nothing else is logged: an anonymous caller could fill a public monitor's log with refusals at no
cost, and a reader's refused ack, pull, seek or lease call would land in the very feed it reads, so the page
after it would not be the page before (docs/protocol.md section 10). Only the service imports this."""

from __future__ import annotations

from typing import Any, Literal

from monitor_protocol.core import tokens
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules.ledger import reject
from monitor_protocol.core.rules.lookups import monitor_of
from monitor_protocol.core.tx import Tx

# The codes of an input refused for what it holds (the rest say who may do what, or where a thing stands).
REFUSED_INPUT = frozenset({"INVALID", "INVALID_FILTER", "UNKNOWN_VOCABULARY", "TOO_LARGE"})

# What a call names: a monitor by its owner ("monitor"), or a monitor asked for a subscription ("subscribe").
Target = Literal["monitor", "subscribe"]


def loggable(error: ProtocolError) -> bool:
    return error.code in REFUSED_INPUT and "rejected_seq" not in error.extras


def refuse_input(
    tx: Tx, target: Target, monitor_id: Any, token: str | None, error: ProtocolError, raw: Any
) -> None:
    """Append the refusal to monitor `monitor_id` when `token` is a credential for it, and raise it as a
    LoggedRefusal (its `rejected_seq` set); a ProtocolError from the lookup, or UNAUTHORIZED, when not."""
    rec = monitor_of(tx, monitor_id)
    if tokens.matches(token, rec.owner_hash):
        named = raw.get("subscriber") if target == "subscribe" and isinstance(raw, dict) else None
        raise reject(tx, rec.id, error, raw, named or rec.owner)
    if target == "subscribe" and rec.visibility != "private" and tokens.matches(token, rec.subscribe_hash):
        named = raw.get("subscriber") if isinstance(raw, dict) else None
        raise reject(tx, rec.id, error, raw, named, fallback="anonymous")
    raise ProtocolError("UNAUTHORIZED", "No credential for this monitor: the refusal is not logged.")
