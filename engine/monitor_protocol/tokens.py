"""Tokens: random, URL-safe, shown once, stored only as a hash, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets


def mint(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def matches(token: str | None, stored_hash: str | None) -> bool:
    if not token or not stored_hash:
        return False
    return hmac.compare_digest(digest(token), stored_hash)


def new_id(prefix: str, length: int = 8) -> str:
    return f"{prefix}-{secrets.token_hex(length // 2)}"
