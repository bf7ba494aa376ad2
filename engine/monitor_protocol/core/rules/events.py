"""Building observations: CloudEvents 1.0 with the protocol's extension attributes (section 4)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from monitor_protocol.core import timefmt
from monitor_protocol.core.records import Monitor


def source_of(monitor_id: str) -> str:
    return f"monitor:{monitor_id}"


def sequence_of(seq: int) -> str:
    return f"{seq:020d}"


def canonical_digest(obj: Any) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces) of an object."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def build(
    monitor: Monitor,
    seq: int,
    type_: str,
    subject: str | None,
    time: float,
    actor: str,
    origin: str,
    tier: str,
    verification: str,
    data: dict[str, Any],
    tags: dict[str, Any],
    on_behalf_of: str | None = None,
    source_ref: str | None = None,
    rule: str | None = None,
    was_derived_from: list[dict[str, str]] | None = None,
    supersedes: dict[str, str] | None = None,
) -> dict[str, Any]:
    payload = dict(data)
    payload["tags"] = dict(tags)
    payload["provenance"] = {
        "origin": origin,
        "tier": tier,
        "verification": verification,
        "actor": actor,
        "on_behalf_of": on_behalf_of,
        "attested": monitor.attested,
        "source_ref": source_ref,
        "rule": rule,
        "wasDerivedFrom": list(was_derived_from or []),
        "wasAttributedTo": on_behalf_of or actor,
        "supersedes": supersedes,
    }
    return {
        "specversion": "1.0",
        "id": str(seq),
        "source": source_of(monitor.id),
        "type": type_,
        "subject": subject,
        "time": timefmt.iso(time),
        "datacontenttype": "application/json",
        "sequence": sequence_of(seq),
        "tier": tier,
        "origin": origin,
        "verified": verification,
        "horizon": monitor.horizon,
        "actor": actor,
        "data": payload,
    }


def build_protocol(
    *,
    monitor: Monitor,
    seq: int,
    type_: str,
    subject: str | None,
    time: float,
    actor: str,
    payload: dict,
) -> dict[str, Any]:
    """A protocol-written observation (section 7): data.payload, data.tags.monitor, and the provenance of
    the server's own measurement (origin system, tier measured, machine_verified) whoever the actor is: the
    actor keeps the name the caller gave, a claim, never a credential."""
    return build(
        monitor=monitor,
        seq=seq,
        type_=type_,
        subject=subject,
        time=time,
        actor=actor,
        origin="system",
        tier="measured",
        verification="machine_verified",
        data={"payload": payload},
        tags={"monitor": monitor.id},
    )
