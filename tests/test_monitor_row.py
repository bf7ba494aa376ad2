"""A monitor's stored row (store/sql.py monitor_row): its fixed part (definition, owner, subscribe token) is
encoded once per version of it and reused while a publish or a pull makes new records of the same monitor;
the row is always what row_values(m.to_row()) would store, and a changed definition is never written with
the old text."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from monitor_protocol.core.lifecycles import MonitorStatus
from monitor_protocol.core.records import Counters, LastSeen, Monitor, evolve
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store import sql
from monitor_protocol.store.sql import MONITOR_COLUMNS, monitor_row, row_of, row_values
from monitor_protocol.store.sqlite import SQLiteStore

pytestmark = pytest.mark.quick


def stored(m: Monitor) -> dict:
    return row_of(row_values(m.to_row(), MONITOR_COLUMNS), MONITOR_COLUMNS)


def base(**kw) -> Monitor:
    return Monitor(
        id="rows", owner="agent:o", owner_hash="oh", created=100.0, updated=100.0, name="rows",
        source={"kind": "log"}, types=["com.example.a"], limits={"max": 3}, **kw,
    )  # fmt: skip


def test_a_publishs_new_record_reuses_the_fixed_text_and_writes_its_own_state():
    m = base()
    first = monitor_row(m)
    text = sql._FIXED_TEXT["rows"][1]
    later = evolve(
        m, head=7, counters=Counters(observations=7), last=LastSeen(7, 107.0, "com.example.a"), actors=("a",)
    )
    row = monitor_row(later)
    assert sql._FIXED_TEXT["rows"][1] is text  # encoded once: the publish changed none of it
    assert row_of(row, MONITOR_COLUMNS) == stored(later) != row_of(first, MONITOR_COLUMNS)
    assert Monitor.from_row(row_of(row, MONITOR_COLUMNS)) == later


def test_a_changed_definition_is_encoded_again():
    m = base()
    monitor_row(m)
    # an equal value that is another object, and a new one: both are encoded again, never the old text
    for changed in (
        evolve(m, limits={"max": 3}),
        evolve(m, description="now described", version=2),
        evolve(m, subscribe_hash="sh"),
        replace(m, status=MonitorStatus.PAUSED),
    ):
        row = row_of(monitor_row(changed), MONITOR_COLUMNS)
        assert row == stored(changed) and Monitor.from_row(row) == changed


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["head", "description", "limits", "budget_used", "owner", "status"]),
            st.integers(0, 3),
        ),
        max_size=12,
    )
)
def test_any_sequence_of_changes_stores_the_newest_record(steps):
    m = base()
    for field, n in steps:
        value = {
            "head": m.head + 1,
            "description": f"d{n}",
            "limits": {"max": n},
            "budget_used": n,
            "owner": f"agent:o{n}",
            "status": [MonitorStatus.ACTIVE, MonitorStatus.PAUSED][n % 2],
        }[field]
        m = evolve(m, **{field: value})
        assert row_of(monitor_row(m), MONITOR_COLUMNS) == stored(m)


def test_the_database_holds_the_newest_definition_after_publishes(tmp_path):
    """Through the engine on SQLite: publishes, an update, more publishes; the row read straight from the
    file is the monitor as the engine last wrote it."""
    path = str(tmp_path / "rows.db")
    store = SQLiteStore(path)
    service = MonitorService(store)
    owner = service.create_monitor({"id": "rows", "types": ["com.example.a"]}, None)["owner_token"]
    for _ in range(3):
        service.publish("rows", {"type": "com.example.a"}, owner)
    service.configure("rows", "update", {"patch": {"description": "after the update"}}, owner)
    service.publish("rows", {"type": "com.example.a"}, owner)
    expected = store.get_monitor("rows")
    store.close()
    raw = sqlite3.connect(path).execute("SELECT id, status, head, floor, rec FROM monitors").fetchone()
    found = Monitor.from_row(row_of(raw, MONITOR_COLUMNS))
    assert found == expected and found.description == "after the update" and found.head == expected.head
