"""The conformance suite's checks: docs/protocol.md section 11 as runnable code, over any transport.

Every check declares a profile:

- `published` (C01..C34, C20b): the published checklist of section 11, written so that it judges any
  implementation of the protocol fairly. Each check asserts the rule it is named after (and names that
  rule in its registration: a failure's note ends with it) and sets up what it needs the published way:
  a fresh monitor that declares the types its filters name, randomly suffixed subjects and subscriber
  names, cursors as the server served them (never a made-up 0 or 1), seqs as publishes returned them
  (never dense or starting at 1), limits and lease defaults as the server advertises them.
- `project` (X01..): this project's own choices and limits (dense per-monitor seqs, exact defaults, the
  input limits of section 10, idempotency keys, revocation, cursor 0, ...). An assertion that once lived
  in a published check but rests on such a choice or detail lives here, so `--profile all` still proves
  all of it.

Each check is an `async def` taking a Context; it returns a note, raises CheckFailed (fail) or Skip (skip).
Every negative check has a positive control beside it: a refusal only counts when the same request, made
properly, is accepted. Standard library only, and nothing of the engine's rules is imported: the suite
judges the engine.

The package is cut by part: `base` (the Context, the registry, shared helpers), then one module per part of
the suite: `monitors`, `delivery` and `trust` (the published checklist), `project`, `limits`, `choices` and
`details` (this project's own checks). Importing a part registers its checks; the registry is kept in id
order.
"""

from __future__ import annotations

import re

from monitor_protocol.conformance.checks import choices, delivery, details, limits, monitors, project, trust  # noqa: F401 - importing registers
from monitor_protocol.conformance.checks.base import (
    CHECKS,
    ERROR_STATUS,
    JSONRPC_CODE,
    PROFILES,
    PROJECT,
    PUBLISHED,
    Check,
    CheckFailed,
    Context,
    Skip,
    check,
)


def _report_order(c: Check) -> tuple[str, int, str]:
    """C01..C20, C20b, C21..C34, then X01..: the published order, whatever order the parts load in."""
    m = re.fullmatch(r"([A-Z])(\d+)(\w*)", c.id)
    if m is None:  # pragma: no cover - `check` ids are written in this package
        raise ValueError(f"check id {c.id!r} is not a letter, digits and an optional suffix")
    return m.group(1), int(m.group(2)), m.group(3)


CHECKS.sort(key=_report_order)

__all__ = [
    "CHECKS",
    "ERROR_STATUS",
    "JSONRPC_CODE",
    "PROFILES",
    "PROJECT",
    "PUBLISHED",
    "Check",
    "CheckFailed",
    "Context",
    "Skip",
    "check",
]
