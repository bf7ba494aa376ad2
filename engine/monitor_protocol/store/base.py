"""The store contract. Every engine call runs inside one `transaction()`: all its reads and writes commit
together or not at all, and a store reports success only once the change is durable."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

Record = dict[str, Any]


class StorageError(Exception):
    """The storage itself failed (disk full, I/O error, a database that cannot be written). Every store
    raises this, wrapping its driver's error, from any method or from the commit; the transaction is rolled
    back, and the engine answers 503 UNAVAILABLE (never 400: the request was not at fault)."""


def lease_key(monitor: str, subject: str) -> str:
    return json.dumps([monitor, subject])


def observation_key(monitor: str, seq: int) -> str:
    return f"{monitor}/{seq:020d}"


class Store(ABC):
    """Abstract base. Records are JSON-able dicts; the engine owns their shape."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[None]: ...

    def close(self) -> None:  # noqa: B027 - optional hook, a memory store has nothing to release
        """Release the store's resources; the default has none."""

    # monitors
    @abstractmethod
    def get_monitor(self, monitor_id: str) -> Record | None: ...

    @abstractmethod
    def put_monitor(self, rec: Record) -> None: ...

    @abstractmethod
    def list_monitors(self) -> list[Record]: ...

    # the log
    @abstractmethod
    def append(self, monitor_id: str, seq: int, event: Record) -> None: ...

    @abstractmethod
    def get_observation(self, monitor_id: str, seq: int) -> Record | None: ...

    @abstractmethod
    def scan(self, monitor_id: str, from_seq: int, to_seq: int) -> Iterator[Record]:
        """Observations with from_seq <= seq <= to_seq, ascending."""
        ...

    @abstractmethod
    def delete_below(self, monitor_id: str, seq: int) -> int:
        """Remove observations with seq < `seq`; return how many went."""
        ...

    # subjects a monitor has published (leases may only name these)
    @abstractmethod
    def has_subject(self, monitor_id: str, subject: str) -> bool: ...

    @abstractmethod
    def add_subject(self, monitor_id: str, subject: str) -> None: ...

    # subscriptions
    @abstractmethod
    def get_subscription(self, sub_id: str) -> Record | None: ...

    @abstractmethod
    def put_subscription(self, rec: Record) -> None: ...

    @abstractmethod
    def find_subscription(self, monitor_id: str, subscriber: str) -> Record | None: ...

    def count_active_subscriptions(self, monitor_id: str) -> int:
        """How many subscriptions of this monitor are active (the 10,000 cap, PROTOCOL.md section 10)."""
        return sum(1 for s in self.list_subscriptions(monitor_id) if s["active"])

    @abstractmethod
    def find_subscription_by_token(self, token_hash: str) -> Record | None: ...

    @abstractmethod
    def list_subscriptions(self, monitor_id: str | None = None) -> list[Record]: ...

    # leases
    @abstractmethod
    def get_lease(self, monitor_id: str, subject: str) -> Record | None: ...

    @abstractmethod
    def put_lease(self, rec: Record) -> None: ...

    @abstractmethod
    def list_leases(self, monitor_id: str | None = None) -> list[Record]: ...

    # publish idempotency keys (PROTOCOL.md section 8): key -> {"seq": int, "at": float (server time)}
    @abstractmethod
    def get_idempotency(self, monitor_id: str, key: str) -> Record | None: ...

    @abstractmethod
    def put_idempotency(self, monitor_id: str, key: str, rec: Record) -> None: ...

    @abstractmethod
    def purge_idempotency(self, before: float) -> int:
        """Forget keys recorded before `before` (server time); return how many went."""
        ...
