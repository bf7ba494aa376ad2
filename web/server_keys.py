"""The Server console's tokens: one keyring per server, and "remember" (web/remote.py draws and drives it).

A token is only ever sent to the server it was given for: the tokens typed before a first successful
Connect belong to that server, and another server starts with a keyring of its own. The tokens live in this
module's memory and go with the tab, unless the person ticks "remember": then every keyring is kept in
localStorage, sealed (AES-GCM under a key this browser will not export, boot.js `MP.vault`): what the storage
holds is no token in clear. Nothing of a server ever goes into the page's IndexedDB log or session."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import js

REMEMBER_KEY = "monitor-protocol-remote" + (f"--{js.MP.ns}" if str(js.MP.ns or "") else "")


@dataclass
class Keyring:
    """The tokens the console was given for ONE server (`base`, bound at its first Connect): owner tokens
    by monitor, reader tokens by subscription, and the admin token."""

    owners: dict[str, str] = field(default_factory=dict)
    readers: dict[str, str] = field(default_factory=dict)
    base: str | None = None
    admin: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"admin": self.admin, "owners": self.owners, "readers": self.readers}

    @classmethod
    def of(cls, base: str | None, raw: Any) -> Keyring:
        """A keyring read back from storage (what this page wrote; anything else is a ValueError)."""
        if not isinstance(raw, dict):
            raise ValueError("a keyring is an object")
        owners, readers = raw.get("owners") or {}, raw.get("readers") or {}
        if not isinstance(owners, dict) or not isinstance(readers, dict):
            raise ValueError("owners and readers are objects")
        admin = raw.get("admin")
        return cls({str(k): str(v) for k, v in owners.items()}, {str(k): str(v) for k, v in readers.items()},
                   base, str(admin) if admin else None)  # fmt: skip


@dataclass
class Keyrings:
    """The keyring in use (the connected server's, or the one being filled before a first Connect) and
    every server's keyring by base URL."""

    current: Keyring = field(default_factory=Keyring)
    rings: dict[str, Keyring] = field(default_factory=dict)
    base_field: str = ""  # the base URL as typed, remembered with the tokens

    def ring_for(self, base: str, admin: str | None) -> tuple[Keyring, str | None]:
        """The keyring to connect to `base` with (bound to it now if it was never bound), and a sentence when
        the admin token in the form was kept back because it was given for another server."""
        current = self.current
        if current.base in (None, base):
            current.base = base
            ring = current
        else:
            self.rings[current.base] = current
            ring = self.rings.get(base) or Keyring(base=base)
        said = None
        others = [b for b, r in self.rings.items() if b != base and admin and r.admin == admin]
        if others:
            admin, said = None, (f"The admin token in the form was given for {others[0]}: it is not sent to {base}. "
                                 "Type this server's own admin token to use one.")  # fmt: skip
        ring.admin = admin
        self.rings[base] = ring
        self.current = ring
        return ring, said

    def unbind(self, base: str) -> None:
        """Tokens typed for a first Connect that failed are not bound to a mistyped address."""
        self.current.base = None
        self.rings.pop(base, None)

    def to_json(self) -> str:
        rings = dict(self.rings)
        if self.current.base is not None:
            rings[self.current.base] = self.current
        return json.dumps({
            "base": self.base_field,
            "rings": {b: r.to_json() for b, r in rings.items()},
            "unbound": None if self.current.base is not None else self.current.to_json(),
        })  # fmt: skip


KEYS = Keyrings()
SAVING = asyncio.Lock()  # one write at a time, in order: the last one wins


async def remember(ticked: bool) -> None:
    """Ticked: every keyring, sealed, in localStorage; unticked: nothing there (removed at once)."""
    async with SAVING:
        if not ticked:
            js.localStorage.removeItem(REMEMBER_KEY)
            return
        sealed = str(await js.MP.vault.seal(KEYS.to_json()))
        js.localStorage.setItem(REMEMBER_KEY, sealed)


async def restore(normalise) -> bool:
    """The remembered keyrings, opened; False when there are none (or they cannot be opened any more:
    another browser's, the vault's key gone, damaged: then they are removed, never half used)."""
    sealed = js.localStorage.getItem(REMEMBER_KEY)
    if not sealed:
        return False
    text = await js.MP.vault.open(sealed)
    try:
        data = json.loads(str(text)) if text else None
        if not isinstance(data, dict) or not isinstance(data.get("rings") or {}, dict):
            raise ValueError("not a keyring store")
        rings = {str(b): Keyring.of(str(b), r) for b, r in (data.get("rings") or {}).items()}
        unbound = Keyring.of(None, data["unbound"]) if data.get("unbound") else None
    except (ValueError, TypeError, KeyError):
        js.localStorage.removeItem(REMEMBER_KEY)
        return False
    KEYS.base_field = str(data.get("base") or "")
    KEYS.rings = rings
    KEYS.current = rings.get(normalise(KEYS.base_field) or "") or unbound or Keyring()
    return True
