"""Run the checks against a transport and report: a readable table and a JSON form."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.conformance.checks import CHECKS, PROFILES, CheckFailed, Context, Skip

ALL = "all"
PROFILE_CHOICES = (ALL, *PROFILES)


@dataclass
class Result:
    id: str
    title: str
    status: str  # pass | fail | skip
    note: str = ""
    profile: str = ""
    rule: str = ""  # the clause the check rests on (docs/protocol.md, or this project's choice)
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    transport: str
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    profile: str = ALL

    def _count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def passed(self) -> int:
        return self._count("pass")

    @property
    def failed(self) -> int:
        return self._count("fail")

    @property
    def skipped(self) -> int:
        return self._count("skip")

    @property
    def ok(self) -> bool:
        return self.failed == 0 and bool(self.results)

    def result(self, cid: str) -> Result | None:
        return next((r for r in self.results if r.id == cid), None)

    def table(self, note_width: int = 70) -> str:
        title_w = max([len(r.title) for r in self.results] + [5])
        title_w = min(title_w, 60)
        lines = [f"{'id':<5} {'status':<6} {'title':<{title_w}} note", "-" * (13 + title_w + note_width)]
        for r in self.results:
            title = r.title if len(r.title) <= title_w else r.title[: title_w - 3] + "..."
            note = " ".join(r.note.split())
            if len(note) > note_width and r.status != "fail":
                note = note[: note_width - 3] + "..."
            lines.append(f"{r.id:<5} {r.status.upper():<6} {title:<{title_w}} {note}".rstrip())
        lines.append(
            f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"
            f" ({self.transport}, profile {self.profile}, {self.seconds:.1f} s)"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "profile": self.profile,
            "ok": self.ok,
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 3),
            "results": [
                {
                    "id": r.id,
                    "title": r.title,
                    "profile": r.profile,
                    "rule": r.rule,
                    "status": r.status,
                    "note": r.note,
                    "seconds": round(r.seconds, 3),
                    **({"data": r.data} if r.data else {}),
                }
                for r in self.results
            ],
        }


def selected(only: Iterable[str] | str | None, profile: str) -> set[str]:
    """The ids of the checks a run of `profile` restricted to `only` runs; ValueError for an unknown id, or one
    outside the profile."""
    if profile not in PROFILE_CHOICES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILE_CHOICES)}")
    in_profile = {c.id for c in CHECKS if profile == ALL or c.profile == profile}
    if only is None:
        return in_profile
    if isinstance(only, str):
        only = only.split(",")
    known = {c.id.lower(): c.id for c in CHECKS}
    asked = [x.strip() for x in only if x.strip()]
    unknown = [x for x in asked if x.lower() not in known]
    if unknown:
        raise ValueError(f"unknown check id(s) {unknown}; known: {', '.join(c.id for c in CHECKS)}")
    chosen = {known[x.lower()] for x in asked}
    outside = sorted(chosen - in_profile)
    if outside:
        raise ValueError(f"check id(s) {outside} are not in the {profile} profile")
    return chosen


def _with_rule(note: str, rule: str) -> str:
    """A failure's note, ending with the clause the check rests on."""
    return f"{note} [rule: {rule}]" if rule else note


def checks_in(profile: str = ALL) -> list[Any]:
    """The registered checks of `profile` ("all", "published" or "project"), in report order."""
    wanted = selected(None, profile)
    return [c for c in CHECKS if c.id in wanted]


async def run_suite(
    transport: Any,
    only: Iterable[str] | str | None = None,
    reference_schema_dir: str | None = None,
    profile: str = ALL,
) -> Report:
    """Run the checks of `profile` (or those of it named in `only`) against `transport`; a check that raises
    is a fail, never a crash, and a failure's note ends with the rule the check rests on. Checks marked final
    (C29, X11, X53) run last, over everything the others received.

    `profile` is "all" (the default: every check), "published" (docs/protocol.md section 11's list, fair to
    any implementation) or "project" (this project's own choices and limits). `reference_schema_dir` is a
    directory of published JSON Schemas (`mp conform --schemas DIR`): C29 validates against those and only
    those, and skips, saying so, when none is given."""
    wanted = selected(only, profile)
    ctx = Context(transport, str(reference_schema_dir) if reference_schema_dir else None, profile=profile)
    report = Report(getattr(transport, "name", type(transport).__name__), profile=profile)
    ordered = [c for c in CHECKS if not c.final] + [c for c in CHECKS if c.final]
    started = time.monotonic()
    for chk in ordered:
        if chk.id not in wanted:
            continue
        t0 = time.monotonic()
        try:
            note = await chk.fn(ctx)
            result = Result(chk.id, chk.title, "pass", note or "")
        except Skip as exc:
            result = Result(chk.id, chk.title, "skip", str(exc))
        except CheckFailed as exc:
            result = Result(chk.id, chk.title, "fail", _with_rule(str(exc), chk.rule))
        except Exception as exc:  # a broken server must not crash the run
            result = Result(chk.id, chk.title, "fail", _with_rule(f"{type(exc).__name__}: {exc}", chk.rule))
        result.seconds = time.monotonic() - t0
        result.profile = chk.profile
        result.rule = chk.rule
        result.data = ctx.data.get(chk.id, {})
        report.results.append(result)
    report.seconds = time.monotonic() - started
    # keep the published order in the report
    order = {c.id: i for i, c in enumerate(CHECKS)}
    report.results.sort(key=lambda r: order[r.id])
    return report
