"""Whether one run of a docs block went as the docs say (pure: the page and the tests share it).

A block declares what a run must give in its Markdown (tools/mdpages.py turns the notes into data
attributes): `<!-- expect: 201, 400 CODE -->` is the status (and code) of each HTTP request in order,
`<!-- shows: text -->` a text its output contains. Without an expect note every request must succeed (2xx):
a docs example that is refused without saying so is a broken example."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Run:
    """What one run of a block gave."""

    requests: list[tuple[int, str | None]] = field(default_factory=list)  # (status, error code) per curl
    exits: list[int] = field(default_factory=list)  # the exit status of each mp command
    errors: list[str] = field(default_factory=list)  # shell or runner errors
    text: str = ""  # everything printed: output lines and the answers' JSON


def verdict(run: Run, expect: list[tuple[int, str | None]], shows: list[str]) -> tuple[bool, str]:
    """(as the docs say?, one sentence saying so or saying what differs)."""
    if run.errors:
        return False, f"error: {run.errors[0].strip().splitlines()[0] if run.errors[0].strip() else 'failed'}"
    got = [str(s) + (f" {c}" if c else "") for s, c in run.requests]
    if expect:
        want = [str(s) + (f" {c}" if c else "") for s, c in expect]
        same = len(expect) == len(run.requests) and all(
            s == gs and (c is None or c == gc) for (s, c), (gs, gc) in zip(expect, run.requests, strict=True)
        )
        if not same:
            return (
                False,
                f"the docs expect HTTP {', '.join(want)}; this run got {', '.join(got) or 'no request'}",
            )
    elif any(not 200 <= s < 300 for s, _ in run.requests):
        return False, f"a request was refused ({', '.join(got)}) and the docs do not say it should be"
    if any(code != 0 for code in run.exits):
        return False, f"mp exited with status {', '.join(str(c) for c in run.exits)}"
    missing = [s for s in shows if s not in run.text]
    if missing:
        return False, f"the output does not show {missing[0]!r}, which the docs say it does"
    parts = []
    if run.requests:
        parts.append("HTTP " + ", ".join(got))
    if run.exits:
        parts.append(f"{len(run.exits)} mp command{'s' * (len(run.exits) != 1)}, exit 0")
    return True, "ran as the docs say" + (f": {'; '.join(parts)}" if parts else "")
