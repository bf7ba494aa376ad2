"""Neighbouring engine jobs that run as one call: a door's ``merge`` says, for a job, the function that runs jobs
like it together (doors/http/app.py: lone REST publishes, through ``MonitorService.publish_each``), and the
seats (doors/engines.py ``LoopEngine``, ``EngineLanes``) merge a group's neighbours before running it: one
engine call's overhead, one transaction's bookkeeping and one write of their monitor for all of them, each
caller still told its own outcome after the commit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("monitor_protocol.http")

Deliver = Callable[[bool, Any], None]

# A door's ``merge`` (LoopEngine and EngineLanes): for a job, the function that runs jobs like it as one call
# (given each job's args, it returns each job's outcome), or None. Neighbours in a group that it gives the same
# function run as that one call: one engine call's overhead for all of them (doors/http/app.py: lone REST
# publishes, MonitorService.publish_each).
Many = Callable[[list[tuple[Any, ...]]], list[tuple[bool, Any]]]
Merge = Callable[[Callable[..., Any], tuple[Any, ...]], Many | None]


def merged(jobs: list[Any], merge: Merge | None) -> list[Any]:
    """``jobs`` (tuples of fn, args, ..., deliver) with each run of neighbours that ``merge`` gives one
    function replaced by one job calling it with all their args; that job's deliver hands each of them its
    own outcome, or the failure of the whole to each. Order is kept: only neighbours merge."""
    if merge is None or len(jobs) < 2:
        return jobs
    out: list[Any] = []
    run: list[Any] = []
    many: Many | None = None
    for job in jobs:
        try:
            fn = merge(job[0], job[1])
        except Exception:  # a job the door cannot judge runs by itself
            log.exception("merge failed; the job runs by itself")
            fn = None
        if fn is not None and run and fn == many:
            run.append(job)
            continue
        _merge_run(out, run, many)
        run, many = [job], fn
    _merge_run(out, run, many)
    return out


def _merge_run(out: list[Any], run: list[Any], many: Many | None) -> None:
    if many is None or len(run) < 2:
        out.extend(run)
    else:
        out.append((many, ([job[1] for job in run],), *run[0][2:-1], _fanned([job[-1] for job in run])))


def calls_in(jobs: list[Any]) -> int:
    """The callers behind ``jobs`` (a merged job counts each of its own): what the seats report as calls, so
    that the metrics' calls per commit still say how many requests shared it."""
    return sum(getattr(job[-1], "calls", 1) for job in jobs)


def _fanned(delivers: list[Deliver]) -> Deliver:
    def deliver(ok: bool, value: Any) -> None:
        outcomes = value if ok else [(False, value)] * len(delivers)
        for each, outcome in zip(delivers, outcomes, strict=True):
            try:
                each(*outcome)
            except Exception:  # one caller's broken reply must not cost the others theirs
                log.exception("delivering an engine call's outcome failed")

    deliver.calls = len(delivers)  # type: ignore[attr-defined]
    return deliver
