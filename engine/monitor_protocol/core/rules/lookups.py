"""Finding a record for a caller: by id, checked against the credential it needs. A refusal names the
credential in `needs` and leaves the transport out of the sentence: each door says how to send it."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import tokens
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.records import Monitor, Subscription
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import check_name, invalid


def monitor_of(tx: Tx, monitor_id: Any) -> Monitor:
    if not isinstance(monitor_id, str):
        raise invalid("The monitor id must be a string.")
    check_name(monitor_id, "monitor", '"ci"')
    rec = tx.monitor(monitor_id)
    if rec is None:
        raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
    return rec


class Viewer:
    """Who may see a monitor (section 4's visibility), for one caller: its token hashed once and its reader
    subscription read once, at first need, however many monitors a listing asks about."""

    __slots__ = ("tx", "digest", "_reads")
    _UNREAD = object()

    def __init__(self, tx: Tx, token: str | None) -> None:
        self.tx = tx
        self.digest = tokens.digest(token) if token else None
        self._reads: Any = Viewer._UNREAD

    def sees(self, rec: Monitor) -> bool:
        if rec.visibility == "public":
            return True
        digest = self.digest
        if digest is None:
            return False
        if tokens.digest_matches(digest, rec.owner_hash):
            return True
        if rec.visibility == "shared" and tokens.digest_matches(digest, rec.subscribe_hash):
            return True
        if self._reads is Viewer._UNREAD:
            # Without a lock: this only reads who may see `rec` (whose lock is held), and a reader token of
            # another monitor must not take that monitor's lock too (two locks, in any order, can deadlock).
            sub = self.tx.subscription_by_token(digest, lock=False)
            self._reads = sub.monitor if sub is not None and not sub.revoked else None
        return rec.id == self._reads


def visible(tx: Tx, rec: Monitor, token: str | None) -> bool:
    return Viewer(tx, token).sees(rec)


def visible_monitor(tx: Tx, monitor_id: Any, token: str | None) -> Monitor:
    rec = monitor_of(tx, monitor_id)
    if not visible(tx, rec, token):
        raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
    return rec


def owner_monitor(tx: Tx, monitor_id: Any, token: str | None) -> Monitor:
    rec = monitor_of(tx, monitor_id)
    if not tokens.matches(token, rec.owner_hash):
        raise ProtocolError(
            "UNAUTHORIZED",
            "This needs the monitor's owner token." + _sent(token, "mpo_"),
            needs="owner_token",
        )
    return rec


def subscription_of(tx: Tx, sub_id: Any, token: str | None, *, allow_retired: bool = False) -> Subscription:
    if not isinstance(sub_id, str):
        raise invalid("The subscription id must be a string.")
    check_name(sub_id, "subscription", '"sub-0123456789abcdef"')
    sub = tx.subscription(sub_id)
    if sub is None:
        raise ProtocolError("NOT_FOUND", f"No subscription {sub_id!r} here.", subscription=sub_id)
    if not tokens.matches(token, sub.token_hash):
        raise ProtocolError(
            "UNAUTHORIZED",
            "This needs the subscription's reader token." + _sent(token, "mpr_"),
            needs="reader_token",
        )
    if not sub.active and not allow_retired:
        raise ProtocolError(
            "NOT_FOUND",
            f"Subscription {sub_id} is retired; subscribe again with the same subscriber to reactivate it "
            "(its cursor is kept): send this reader token, or the owner's, as the bearer (the owner's, if the "
            "monitor has turned private since), and keep the new reader token the reply gives.",
            retired=True,
            cursor=sub.cursor,
            subscription=sub_id,
        )
    return sub


# What minted tokens begin with (rules/monitors.py, rules/delivery.py): a refusal can say which kind was sent.
_KINDS = {
    "mpo_": "an owner token",
    "mps_": "a monitor's subscribe token",
    "mpr_": "a reader token (from subscribing)",
}


def _sent(token: object, wanted: str) -> str:
    """A newcomer's common mistake said: a token of another kind than the route's (never a wrong one of the
    right kind, which reveals nothing either way)."""
    kind = _KINDS.get(token[:4]) if isinstance(token, str) else None
    if kind is None or token[:4] == wanted:  # type: ignore[index]
        return ""
    return f" The token sent is {kind}."
