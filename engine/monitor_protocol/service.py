"""MonitorService: every rule of the Monitor Protocol v0 (PROTOCOL.md sections 1-8) over a Store.

No I/O of its own, standard library only, an injectable clock: it runs unchanged in CPython, in Pyodide and
under tests. Each public method is one store transaction and returns the REST success body of section 5, or
raises ProtocolError. A refusal that must be logged (P2) commits its rejected observation, then raises."""

from __future__ import annotations

from .delivery import DeliveryRules
from .leases import LeaseRules
from .monitors import MonitorRules
from .publishing import PublishRules
from .service_base import SERVER_NAME, SERVER_VERSION, ServiceCore, _LoggedRefusal
from .upkeep import UpkeepRules

__all__ = ["SERVER_NAME", "SERVER_VERSION", "MonitorService", "ServiceCore", "_LoggedRefusal"]


class MonitorService(MonitorRules, PublishRules, DeliveryRules, LeaseRules, UpkeepRules):
    """Every rule of the protocol, one module per part: monitors, publishing, delivery, leases, upkeep."""
