"""A reader's usual write on SQLite (an ack, a pull's delivery): the columns no index holds, by narrow UPDATEs.

Setting the indexed columns too (the upsert) rewrites all four index entries even when their values are the
same. The callers (SQLiteStore._write_subscriptions) fall back on the upsert when a rowcount says a row was not
there: a stale memory of what the file holds costs a statement, never a write.
"""

from __future__ import annotations

import sqlite3
from typing import Any

# A move of the cursor with the record (`rec`, the rest of the subscription as JSON) changed too.
MOVE_SUBSCRIPTION = "UPDATE subscriptions SET cursor=?, hwm=?, mute_since=?, last_pull=?, rec=? WHERE id=?"
# A delivery's write, when the rest of the record is what the row already holds: no JSON at all.
STEP_SUBSCRIPTION = "UPDATE subscriptions SET cursor=?, hwm=?, mute_since=?, last_pull=? WHERE id=?"
# The same write for rows given the same values (the readers one append woke in one place): one statement per
# STEP_CHUNK of them, 2.0 ms instead of 3.25 for 1,000 rows here (docs/bench-history.md, "The wake's replies
# made from one another"). A chunk stays far below SQLite's limit on bound parameters (999 before 3.32).
STEP_CHUNK = 500
_STEP_MANY = "UPDATE subscriptions SET cursor=?, hwm=?, mute_since=?, last_pull=? WHERE id IN ({})"


def narrow_rows(db: sqlite3.Connection, sql: str, params: list[tuple[Any, ...]]) -> bool:
    """Run a narrow UPDATE for each row; False when one of the rows was not there."""
    moved = db.execute(sql, params[0]) if len(params) == 1 else db.executemany(sql, params)
    return moved.rowcount == len(params)


def step_rows(db: sqlite3.Connection, steps: list[tuple[Any, ...]]) -> bool:
    """The deliveries' narrow UPDATEs, each (cursor, hwm, mute_since, last_pull, id); rows given the same four
    values share statements of up to STEP_CHUNK ids. False when one of the rows was not there."""
    if len(steps) < 4:
        return narrow_rows(db, STEP_SUBSCRIPTION, steps)
    same: dict[tuple[Any, ...], list[str]] = {}
    for step in steps:
        ids = same.get(step[:4])
        if ids is None:
            same[step[:4]] = [step[4]]
        else:
            ids.append(step[4])
    moved = 0
    alone: list[tuple[Any, ...]] = []
    for values, ids in same.items():
        if len(ids) == 1:
            alone.append((*values, ids[0]))
            continue
        for at in range(0, len(ids), STEP_CHUNK):
            part = ids[at : at + STEP_CHUNK]
            moved += db.execute(_STEP_MANY.format(", ".join("?" * len(part))), (*values, *part)).rowcount
    if alone:
        moved += db.executemany(STEP_SUBSCRIPTION, alone).rowcount
    return moved == len(steps)
