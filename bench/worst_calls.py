"""The costliest engine calls, measured: what holds `mp serve`'s event loop longest (docs/serve.md, "How a request
is served"). On SQLite the engine runs on the loop, so every call's cost must be bounded; this prints the bound
of each kind of heavy call on a log of N observations (default 300,000; 10% of one type, 500 subjects).

    python bench/worst_calls.py [N]

Each figure is the best and worst of 5 calls, in ms of wall time, with the load average. Nothing is written.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from monitor_protocol.core.service import MonitorService  # noqa: E402
from monitor_protocol.doors.http.server import install_fast_json  # noqa: E402
from monitor_protocol.store.sqlite import SQLiteStore  # noqa: E402

TYPES = ["com.example.a", "com.example.b"]


def timed(label: str, fn: Callable[[], Any], reps: int = 5) -> None:
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    print(
        f"{label}: best {min(xs):.1f} ms, worst {max(xs):.1f} ms (load {os.getloadavg()[0]:.2f})", flush=True
    )


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    install_fast_json()  # as mp serve does
    with tempfile.TemporaryDirectory(prefix="mp-worst-") as tmp:
        store = SQLiteStore(os.path.join(tmp, "worst.db"))
        service = MonitorService(store)
        owner = service.create_monitor({"id": "worst", "visibility": "public", "types": TYPES}, None)[
            "owner_token"
        ]
        started = time.perf_counter()
        for i in range(0, n, 100):
            batch = [
                {"type": TYPES[1] if j % 10 == 0 else TYPES[0], "subject": f"s{j % 500}", "data": {"n": j}}
                for j in range(i, i + 100)
            ]
            service.publish_many("worst", batch, owner)
        print(f"a log of {n:,} observations in {time.perf_counter() - started:.0f} s", flush=True)
        scan = service.subscribe(
            {"monitor": "worst", "subscriber": "agent:scan", "filter": {"text": "nothing"}}, None
        )
        typed = service.subscribe(
            {"monitor": "worst", "subscriber": "agent:typed", "filter": {"types": [TYPES[1]]}}, None
        )
        sid, stok = scan["subscription"]["id"], scan["token"]
        tid, ttok = typed["subscription"]["id"], typed["token"]
        timed(
            "pull with a text filter matching nothing (the scan budget)",
            lambda: service.pull(sid, stok, cursor=1),
        )
        timed("pull(200) with an indexed type filter", lambda: service.pull(tid, ttok, cursor=1, limit=200))
        timed("subscription info (a filtered lag count)", lambda: service.subscription_info(tid, ttok))
        batch = [{"type": TYPES[0], "subject": "s", "data": {"n": 1}} for _ in range(100)]
        timed("publish_many(100)", lambda: service.publish_many("worst", batch, owner))
        for rows in (10_000, 100_000):
            floor = store.get_monitor("worst").floor
            started = time.perf_counter()
            service.compact("worst", floor + rows - 1)
            print(
                f"admin compact of {rows:,} rows: {(time.perf_counter() - started) * 1000:.0f} ms", flush=True
            )
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
