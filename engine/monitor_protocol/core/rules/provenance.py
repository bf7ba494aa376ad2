"""P1: who saw it, for whom, and how much it can carry. Defaults never reach the top; ceilings are checked
in the order docs/protocol.md section 6 gives, and the first failure wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.validation import check_actor
from monitor_protocol.core.vocab import ORIGINS, TIERS, VERIFICATIONS

HUMAN_GRADE_VERIFICATION = ("human_verified", "certified")
_PREFIX_ORIGIN = {
    "human": "human",
    "agent": "agent",
    "system": "system",
    "hook": "webhook",
    "webhook": "webhook",
    "probe": "probe",
}
DEFAULT_TIER = {
    "human": "measured",
    "webhook": "measured",
    "probe": "measured",
    "system": "measured",
    "agent": "unverified",
}
DEFAULT_VERIFICATION = {
    "human": "reported",
    "webhook": "machine_verified",
    "probe": "machine_verified",
    "system": "machine_verified",
    "agent": "unverified",
}


def actor_prefix(actor: str) -> str:
    """The prefix says what an actor is only when it is one of the lower-case ones (section 3): `HuMaN:x`
    is a name like any other, and so an agent."""
    prefix = actor.split(":", 1)[0] if ":" in actor else ""
    return prefix if prefix in _PREFIX_ORIGIN else ""


def is_human(actor: str | None) -> bool:
    return bool(actor) and actor_prefix(actor) == "human"


def is_system(actor: str | None) -> bool:
    return bool(actor) and actor_prefix(actor) == "system"


def origin_of_actor(actor: str) -> str:
    return _PREFIX_ORIGIN.get(actor_prefix(actor), "agent")


@dataclass(frozen=True)
class Provenance:
    actor: str
    origin: str
    tier: str
    verification: str
    on_behalf_of: str | None


_RESOLVED: dict[
    tuple[Any, ...], Provenance
] = {}  # what resolved before: the same claims come again and again
_RESOLVED_MAX = 4096


def resolve(owner: str, actor: str, body: dict[str, Any]) -> Provenance:
    """Apply defaults and ceilings to a publish request; raise the first refusal. A pure function of six
    strings: what it allowed once it allows again, from memory (refusals are always worked out)."""
    get = body.get
    key = (owner, actor, get("origin"), get("tier"), get("verification"), get("on_behalf_of"))
    try:
        known = _RESOLVED.get(key)
    except TypeError:  # a claim that is not a string (a list, an object): worked out, and refused, below
        known = None
    if known is not None:
        return known
    prov = _resolve(owner, actor, body)
    if all(v is None or type(v) is str for v in key):
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[key] = prov
    return prov


def _resolve(owner: str, actor: str, body: dict[str, Any]) -> Provenance:
    origin = body.get("origin")
    tier = body.get("tier")
    verification = body.get("verification")
    on_behalf_of = body.get("on_behalf_of")

    # (1) vocabulary
    for name, value, known in (
        ("origin", origin, ORIGINS),
        ("tier", tier, TIERS),
        ("verification", verification, VERIFICATIONS),
    ):
        if value is not None and value not in known:
            raise ProtocolError(
                "UNKNOWN_VOCABULARY",
                f"Unknown {name} {value!r}; use one of {', '.join(known)}.",
                field=name,
                invalid=value,
                known=list(known),
            )
    if on_behalf_of is not None:
        check_actor(on_behalf_of, "on_behalf_of")

    if origin is None:
        origin = origin_of_actor(actor)
        if origin == "human" and not is_human(owner):
            origin = "agent"
    tier = tier if tier is not None else DEFAULT_TIER[origin]
    verification = verification if verification is not None else DEFAULT_VERIFICATION[origin]

    # (2) delegation may name only the owner
    if on_behalf_of is not None and on_behalf_of != owner:
        raise ProtocolError(
            "PROVENANCE_CEILING",
            f"on_behalf_of may name only this monitor's owner ({owner}), not {on_behalf_of}.",
            on_behalf_of=on_behalf_of,
            owner=owner,
        )
    # (3) src is a person's first-hand record
    if tier == "src" and origin != "human":
        raise ProtocolError(
            "TIER_NOT_ASSERTABLE",
            f"Tier 'src' can only be asserted with origin 'human' (this request has origin {origin!r}); "
            "send tier 'measured' or 'unverified', or publish on behalf of the human owner.",
            tier=tier,
            origin=origin,
        )
    # (4) a non-human owner cannot hold a person's certainty
    if not is_human(owner) and (
        origin == "human" or tier == "src" or verification in HUMAN_GRADE_VERIFICATION
    ):
        raise ProtocolError(
            "PROVENANCE_CEILING",
            f"This monitor's owner {owner} is not a person, so nothing published here can carry origin "
            "'human', tier 'src' or human-grade verification.",
            owner=owner,
            origin=origin,
            tier=tier,
            verification=verification,
        )
    # (5) a machine cannot certify on its own
    if (
        (origin == "human" or verification in HUMAN_GRADE_VERIFICATION)
        and not is_human(actor)
        and on_behalf_of is None
    ):
        raise ProtocolError(
            "PROVENANCE_CEILING",
            f"Actor {actor} is not a person and names nobody in on_behalf_of, so it cannot claim origin "
            f"{origin!r} or verification {verification!r}; name the owner in on_behalf_of or lower the claim.",
            actor=actor,
            origin=origin,
            verification=verification,
        )
    # (6) whoever holds the token cannot speak as another person
    if is_human(actor) and actor != owner:
        raise ProtocolError(
            "PROVENANCE_CEILING",
            f"Actor {actor} is a person other than this monitor's owner ({owner}); a token cannot speak for "
            "another person. Publish as the owner, or let that person publish through their own monitor.",
            actor=actor,
            owner=owner,
        )
    # (7) only the server writes as the system
    if is_system(actor) or origin == "system":
        raise ProtocolError(
            "PROVENANCE_CEILING",
            "Only the server writes as the system (actor system:..., origin 'system'); publish under your "
            "own actor and origin.",
            actor=actor,
            origin=origin,
        )
    return Provenance(
        actor=actor, origin=origin, tier=tier, verification=verification, on_behalf_of=on_behalf_of
    )
