"""Who may subscribe to a monitor, with which capabilities, and whether there is room for one more: the
grant rests on the owner's token, the subscribe token, or the monitor's default grant (anonymous, on a
public monitor), and says which (`basis`), so a narrowed definition can revoke it (section 8)."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import tokens
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.records import Monitor, Subscription
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import check_vocab_list
from monitor_protocol.core.vocab import CAPABILITIES, MAX_ACTIVE_SUBSCRIPTIONS, RESERVED_FOR_GRANTED


def grant_of(
    rec: Monitor, existing: Subscription | None, token: str | None, asked: Any
) -> tuple[list[str], str]:
    """(requested, basis) for this caller once every requested capability is granted, or the refusal
    (P7: granted, never requested)."""
    subscriber_name = existing.subscriber if existing else None
    is_owner = tokens.matches(token, rec.owner_hash)
    # The subscribe token grants the monitor's capabilities wherever it exists (shared or public).
    is_sub_token = rec.visibility != "private" and tokens.matches(token, rec.subscribe_hash)
    holds_existing = existing is not None and tokens.matches(token, existing.token_hash)
    if rec.visibility == "private" and not (is_owner or holds_existing):
        # before anything else: a refusal must not tell a stranger what a private monitor holds
        raise ProtocolError("NOT_FOUND", f"No monitor {rec.id!r} here.", monitor=rec.id)
    requested = None if asked is None else check_vocab_list(asked, CAPABILITIES, "capabilities")
    if existing is not None and not (holds_existing or is_owner):
        raise ProtocolError(
            "UNAUTHORIZED",
            f"{subscriber_name} already subscribes to {rec.id}; a name is not a credential. Re-subscribe "
            "with that subscription's current token or the owner's token.",
            needs="reader_token",
        )
    # On a private monitor only a grant made with the owner's token survives: a revoked reader's old
    # token opens nothing.
    if rec.visibility == "private" and existing is not None and not is_owner and existing.grant != "owner":
        raise ProtocolError("NOT_FOUND", f"No monitor {rec.id!r} here.", monitor=rec.id)
    if is_owner or is_sub_token:
        grant = list(rec.capabilities)
    else:
        grant = list(rec.default_grant)
        if existing is not None:
            grant += [c for c in existing.capabilities if c not in grant]
    if requested is None:
        requested = list(existing.capabilities) if existing else ["observe"]
    excess = [c for c in requested if c not in grant]
    if excess:
        beyond = [c for c in excess if c not in rec.capabilities]
        if beyond:  # no token grants what the monitor does not offer: its owner changes the definition
            how = (
                f"Monitor {rec.id} offers {list(rec.capabilities)}: its owner adds {beyond} to the monitor's "
                "capabilities (an update); then subscribe again with the owner token (or, on a shared or "
                "public monitor, its subscribe token)."
            )
        else:
            how = "Ask the owner for the owner or subscribe token."
        raise ProtocolError(
            "CAPABILITY_MISSING",
            f"Capabilities are granted, not requested: {excess} are not granted to this caller "
            f"(granted: {grant}). {how}",
            granted=grant,
            monitor_capabilities=list(rec.capabilities),
            requested=requested,
        )
    if rec.visibility == "shared" and not (
        is_owner
        or is_sub_token
        or (holds_existing and existing is not None and existing.grant in ("owner", "subscribe"))
    ):
        raise ProtocolError(
            "UNAUTHORIZED",
            f"Monitor {rec.id} is shared: subscribing needs its subscribe token (or the owner's).",
            needs="subscribe_token",
        )
    # What this subscription's grant rests on, so a narrowed definition can revoke it (section 8).
    if is_owner:
        basis = "owner"
    elif is_sub_token:
        basis = "subscribe"
    else:
        basis = existing.grant if holds_existing and existing is not None else "default"
    return requested, basis


def room_for_one_more(tx: Tx, monitor_id: str, basis: str) -> None:
    """At most MAX_ACTIVE_SUBSCRIPTIONS active per monitor, of which the last RESERVED_FOR_GRANTED only by
    the owner's token or the subscribe token: anonymous callers of a public monitor cannot take every place
    and shut its owner out (429 OVER_BUDGET)."""
    active = tx.count_active_subscriptions(monitor_id)
    if active >= MAX_ACTIVE_SUBSCRIPTIONS:
        raise ProtocolError(
            "OVER_BUDGET",
            f"Monitor {monitor_id} has {MAX_ACTIVE_SUBSCRIPTIONS} active subscriptions, the most it "
            "serves; retire one first.",
            limit=MAX_ACTIVE_SUBSCRIPTIONS,
        )
    anonymous_limit = MAX_ACTIVE_SUBSCRIPTIONS - RESERVED_FOR_GRANTED
    if basis == "default" and active >= anonymous_limit:
        raise ProtocolError(
            "OVER_BUDGET",
            f"Monitor {monitor_id} has {active} active subscriptions; the last {RESERVED_FOR_GRANTED} places "
            "are kept for subscribers with the owner's or the subscribe token: ask the owner for one.",
            limit=anonymous_limit,
        )
