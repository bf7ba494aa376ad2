"""MonitorService: every rule of the Monitor Protocol v0 (docs/protocol.md sections 1-8) over a Store.

No I/O of its own, standard library only, an injectable clock: it runs unchanged in CPython, in Pyodide and
under tests. Each public method is one engine call: one store transaction in which the rule (a function
of monitors, publishing, delivery, leases or upkeep) stages its changes in a Tx and the applier writes
them once. It returns the REST success body of section 5, or raises ProtocolError. A refusal that must be
logged (P2) commits its rejected observation, then raises."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules import (
    delivery,
    importing,
    leases,
    monitors,
    publishing,
    refusals,
    sources,
    upkeep,
)
from monitor_protocol.core.runtime import SERVER_NAME, SERVER_VERSION, Feeds, LoggedRefusal, ServiceCore

__all__ = ["SERVER_NAME", "SERVER_VERSION", "Feeds", "LoggedRefusal", "MonitorService", "ServiceCore"]


class MonitorService(ServiceCore):
    """The protocol's operations, each delegating to its rule module."""

    # ---------------------------------------------------------------------------- monitors
    def create_monitor(self, body: Any, token: str | None) -> dict[str, Any]:
        out = self._call(lambda tx: monitors.create_monitor(self, tx, body, token))
        self._configured(out["monitor"]["id"])
        return out

    def list_monitors(self, token: str | None, *, limit: Any = None, after: Any = None) -> dict[str, Any]:
        return self._call(lambda tx: monitors.list_monitors(self, tx, token, limit, after))

    def get_monitor(self, monitor_id: str, token: str | None) -> dict[str, Any]:
        return self._call(lambda tx: monitors.get_monitor(self, tx, monitor_id, token))

    def state(self, monitor_id: str, token: str | None) -> dict[str, Any]:
        return self._call(lambda tx: monitors.monitor_state(self, tx, monitor_id, token))

    def configure(self, monitor_id: str, action: str, body: Any, token: str | None) -> dict[str, Any]:
        out = self._judged(
            "monitor", monitor_id, token, body,
            lambda tx: monitors.configure(self, tx, monitor_id, action, body, token),
        )  # fmt: skip
        self._configured(monitor_id)
        return out

    # ---------------------------------------------------------------------------- publishing
    def publish(
        self, monitor_id: str, body: Any, token: str | None, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return self._call(lambda tx: publishing.publish(self, tx, monitor_id, body, token, idempotency_key))

    def publish_many(
        self, monitor_id: str, items: Any, token: str | None, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """A batch: each item published in order or refused and logged on its own, in one commit."""
        return self._judged(
            "monitor", monitor_id, token, items,
            lambda tx: publishing.publish_many(self, tx, monitor_id, items, token, idempotency_key),
        )  # fmt: skip

    def publish_each(self, entries: list[publishing.Lone]) -> list[tuple[bool, Any]]:
        """Lone publishes of several requests (monitor id, body, token, Idempotency-Key header each) in one
        engine call: each judged as if it were a call of its own, each its outcome, (True, the reply
        `publish` gives) or (False, its ProtocolError). A door that has several at once (the HTTP door's
        group commit) spends one call's overhead on all of them."""
        return self._call(lambda tx: publishing.publish_each(self, tx, entries))

    def refuse_publish(self, monitor_id: str, token: str | None, error: ProtocolError, raw: str) -> None:
        self._call(lambda tx: publishing.refuse_publish(tx, monitor_id, token, error, raw))

    # ---------------------------------------------------------------------------- delivery
    def subscribe(self, body: Any, token: str | None) -> dict[str, Any]:
        target = body.get("monitor") if isinstance(body, dict) else None
        return self._judged(
            "subscribe", target, token, body, lambda tx: delivery.subscribe(self, tx, body, token)
        )

    # A reader's calls (reader=True, core/tx.py): they write only the subscription they name, so on a store
    # several servers share they hold their monitor's lock shared and readers do not wait for each other.
    def touch(self, sub_id: str, token: str | None) -> dict[str, Any]:
        return self._call(lambda tx: delivery.touch(self, tx, sub_id, token), reader=True)

    def subscription_info(self, sub_id: str, token: str | None) -> dict[str, Any]:
        return self._call(lambda tx: delivery.subscription_info(self, tx, sub_id, token), reader=True)

    def pull(
        self,
        sub_id: str,
        token: str | None,
        *,
        cursor: Any = None,
        limit: Any = None,
        filter: Any = None,  # noqa: A002 - the protocol's word
        ack: Any = None,
        raw: bool = False,
    ) -> dict[str, Any]:
        """`ack`: acknowledge this cursor first (with /ack's rules), then pull, in one transaction. `raw`:
        for a door that only encodes the reply with wire.encode: its observations may then be values that
        codec writes as stored JSON text (wire.raw_json), not dicts; never for a caller that reads them."""
        return self._call(
            lambda tx: delivery.pull(
                self, tx, sub_id, token, cursor, limit, filter, system=False, ack_cursor=ack, raw=raw
            ),
            reader=True,
        )

    def pull_many(
        self, asks: list[delivery.PullAsk], *, same: list[int] | None = None, raw: bool = False
    ) -> list[dict[str, Any] | ProtocolError]:
        """Several readers' pulls in one call, each its reply or its refusal (the readers one append woke:
        what they read alike is read once). Each ask is (subscription, token, cursor, limit, filter).
        `same`, when given, is filled with one index per reply: that of an earlier reply this one equals
        but for its `subscription`, or -1. `raw`: as pull's."""
        return self._call(lambda tx: delivery.pull_many(self, tx, asks, same, raw=raw))

    def pull_as_system(self, sub_id: str, *, limit: int | None = None) -> dict[str, Any]:
        """The server's own push delivery reads as the subscription, without its token."""
        return self._call(
            lambda tx: delivery.pull(self, tx, sub_id, None, None, limit, None, system=True), reader=True
        )

    def ack(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        return self._call(lambda tx: delivery.ack(self, tx, sub_id, token, body, system=False), reader=True)

    def ack_as_system(self, sub_id: str, cursor: int) -> dict[str, Any]:
        return self._call(
            lambda tx: delivery.ack(self, tx, sub_id, None, {"cursor": cursor}, system=True), reader=True
        )

    def seek(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        return self._call(lambda tx: delivery.seek(self, tx, sub_id, token, body))

    def renew(self, sub_id: str, token: str | None) -> dict[str, Any]:
        return self._call(lambda tx: delivery.renew(self, tx, sub_id, token))

    def retire_subscription(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        return self._call(lambda tx: delivery.retire(self, tx, sub_id, token, body))

    def retire_as_system(self, sub_id: str, reason: str) -> dict[str, Any]:
        return self._call(lambda tx: delivery.retire_as_system(self, tx, sub_id, reason))

    def push_targets(self) -> list[dict[str, Any]]:
        """Every active HTTP-push subscription; `push_epoch` then moves only when that set changes."""
        targets = self._call(delivery.push_targets)
        self.push_targets_seen(targets)
        return targets

    # ---------------------------------------------------------------------------- leases
    def lease(self, sub_id: str, token: str | None, action: str, body: Any) -> dict[str, Any]:
        return self._call(lambda tx: leases.lease(self, tx, sub_id, token, action, body))

    # ---------------------------------------------------------------------------- refused inputs
    def _judged(
        self, target: refusals.Target, target_id: Any, token: str | None, raw: Any, fn: Callable[[Any], Any]
    ) -> Any:
        """One engine call whose refused input is logged on the monitor it names (section 10, P2)."""
        try:
            return self._call(fn)
        except ProtocolError as err:
            self.log_refused_input(target, target_id, token, err, raw)
            raise

    def log_refused_input(
        self, target: refusals.Target, target_id: Any, token: str | None, error: ProtocolError, raw: Any
    ) -> None:
        """Append `error` as a rejected row on the monitor `target_id` names, when `token` is its owner's (its
        `rejected_seq` is then set); else, or when the store cannot take it now, nothing: the caller still
        returns the refusal itself, without a `rejected_seq` (the row's seq is set before its commit)."""
        if not refusals.loggable(error, token):
            return
        try:
            self._call(lambda tx: refusals.refuse_input(tx, target, target_id, token, error, raw))
        except ProtocolError as failed:
            if failed is not error:  # not logged (no owner's token, or the store failed): no row to name
                error.extras.pop("rejected_seq", None)

    # ---------------------------------------------------------------------------- upkeep and admin
    def sweep(self, now: float | None = None) -> int:
        return self._call(lambda tx: upkeep.sweep(self, tx, tx.now if now is None else now), lazy_sweep=False)

    def compact(self, monitor_id: str | None, upto_seq: Any) -> dict[str, Any]:
        return self._call(lambda tx: upkeep.compact(self, tx, monitor_id, upto_seq))

    def read_log(self, monitor_id: str, from_seq: Any = 1, limit: Any = None) -> dict[str, Any]:
        return self._call(lambda tx: upkeep.read_log(self, tx, monitor_id, from_seq, limit))

    def snapshot(self) -> dict[str, Any]:
        return self._call(lambda tx: upkeep.snapshot(self, tx))

    def overview(self, monitor_id: str | None = None, from_seq: Any = 1, limit: Any = None) -> dict[str, Any]:
        """Every monitor, and one monitor's state, subscriptions, leases and a page of its log (read-only;
        the operator's door, never routed to a reader)."""
        return self._call(lambda tx: upkeep.overview(self, tx, monitor_id, from_seq, limit))

    # ---------------------------------------------------------------------------- share and restore
    def export_log(self, monitor_id: str) -> list[dict[str, Any]]:
        """Every retained row of a monitor as served, in seq order (importing.to_jsonl makes the file)."""
        return self._call(lambda tx: importing.export_events(self, tx, monitor_id))

    def import_log(self, monitor_id: Any, source: Any, token: str | None = None) -> dict[str, Any]:
        """A JSON Lines log (text, bytes or a list of lines/events) as the NEW monitor `monitor_id`, in one
        transaction, or nothing at all: INVALID with `refused: [{line, reason}]` (importing.py's rules)."""
        out = self._call(lambda tx: importing.import_log(self, tx, monitor_id, source, token))
        self._configured(str(monitor_id))
        return out

    # ---------------------------------------------------------------------------- sources (section 12)
    # mp serve --sources sets this: the state then says how the server's run of each source stands.
    sources_here: bool = False

    def add_config_listener(self, fn: Callable[[str], None]) -> None:
        """`fn(monitor_id)` after a monitor was created, updated, paused, resumed, retired or imported here
        (the server's sources start, stop and restart on it)."""
        if "_config_listeners" not in self.__dict__:
            self._config_listeners: list[Callable[[str], None]] = []
        self._config_listeners.append(fn)

    def remove_config_listener(self, fn: Callable[[str], None]) -> None:
        listeners = self.__dict__.get("_config_listeners", [])
        if fn in listeners:
            listeners.remove(fn)

    def _configured(self, monitor_id: str) -> None:
        for fn in list(self.__dict__.get("_config_listeners", ())):
            try:
                fn(monitor_id)
            except Exception:  # a broken listener must never undo a committed configuration
                pass

    def publish_as_source(
        self, monitor_id: str, body: Any, checkpoint: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Publish as the monitor's own source, run by the server (no token: every publish rule applies)."""
        return self._call(lambda tx: sources.publish_as_source(self, tx, monitor_id, body, checkpoint))

    def keep_checkpoint(self, monitor_id: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
        return self._call(lambda tx: sources.keep_checkpoint(self, tx, monitor_id, checkpoint))

    def source_event(self, monitor_id: str, action: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A start, stop, crash, restart, refusal or throttling of the monitor's source, in its log."""
        return self._call(lambda tx: sources.source_event(self, tx, monitor_id, action, payload))

    def sources_view(self, monitor_id: str) -> list[dict[str, Any]]:
        return self._call(lambda tx: sources.sources_view(self, tx, monitor_id))

    def sources_page(self, after: str = "") -> dict[str, Any]:
        return self._call(lambda tx: sources.sources_page(self, tx, after))

    def feed_step(self, monitor_id: str, plan: Any) -> dict[str, Any]:
        return self._call(lambda tx: sources.feed_step(self, tx, monitor_id, plan))
