"""Benchmarks of the Monitor Protocol server (not tests): how fast it is, how cost grows, how close it is to
this machine's limits. Run with ``python build.py bench [--quick] [--only NAME ...] [--runs N]``.

Sections (``--only`` takes these names, repeatable or comma-separated):

  limits      the machine's limits in the same run: a trivial app on mp serve's own HTTP server
              (transport, bench/bare_app.py) and raw SQLite commits with mp serve's durability settings (storage)
  publish     durable publishes/s over HTTP: 1 keep-alive client; 16 concurrent clients (3 client kinds)
  pull        pull+ack round trips/s (limit 1) and batch drain (limit 200 + ack) in observations/s
  wake        long-poll wake latency: publish reply -> waiting pull?wait=30 reply, p50/p99
  growth      publish/s and pull/s with 1k, 100k and 1M observations in the monitor; bytes/observation
  playground  bench/playground_bench.py (shell paint, cold start, reload, publishes into IndexedDB, with the
              load average beside every figure), owned by the playground

``--peers`` runs only the peers section (bench/peers.py): the same workloads on mp serve, Redis, PostgreSQL and
NATS JetStream, interleaved round by round -> bench/results/peers.json; ``--peers --markdown`` prints it.

``--stages`` runs only the stage profile (bench/stages.py): where the server's CPU goes per durable publish (1 and 16
clients) and per pull(1)+ack, stage by stage (transport, door, rules, SQL, loop) against issue 23's budgets ->
bench/results/stages.json. ``--fanout`` runs only the wake fan-out (bench/fanout.py): N long polls parked on one
monitor, one publish, p50/p99 beside a bare asyncio floor -> bench/results/fanout.json. ``--client`` runs only the
client's own cost (bench/client_cpu.py): client CPU per keep-alive publish for Client and AsyncClient beside raw
floors (a blocking socket, an asyncio and a uvloop protocol) -> bench/results/client.json. With ``--markdown``, each prints its last result.

``--scale-out`` runs only the scale-out section (bench/scaleout.py): publish and ack+pull against 1, 2 and 3
``mp serve`` on one PostgreSQL database, beside PostgreSQL's own commit limit and mp serve on SQLite, with the
CPU per request of the servers and of PostgreSQL -> bench/results/scaleout.json; ``--scale-out --markdown``
prints it. Its defaults: 3 rounds of 3 s per figure (``--quick``: 1 round of 1 s).

Each section writes bench/results/<name>.json; bench/results/latest.json combines the newest result of
every section with the machine, date, commit, ratios to the limits and the targets met or missed. Every
figure is the median, min and max of repeated runs (``--runs``, default 5).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

import httpx  # noqa: E402
from common import (  # noqa: E402
    MONITOR,
    OBS_BODY,
    PY,
    RESULTS,
    ROOT,
    BenchRun,
    bare_serve,
    create_monitor,
    loadgen,
    machine,
    mp_serve,
    percentile,
    subscribe,
    summary,
)

SECTIONS = ("limits", "publish", "pull", "wake", "growth", "playground")

# Client kinds for "16 concurrent clients" (see docs/bench.md for why there are three).
C16 = {
    "raw16": {
        "client": "raw",
        "tasks": 16,
        "procs": 1,
        "label": "16 clients, raw asyncio HTTP/1.1, 1 process",
    },
    "httpx_async16": {
        "client": "async",
        "tasks": 16,
        "procs": 1,
        "label": "16 clients, httpx.AsyncClient, 1 process",
    },
    "httpx_sync16p": {
        "client": "sync",
        "tasks": 1,
        "procs": 16,
        "label": "16 clients, httpx.Client, 16 processes",
    },
}


class Bench(BenchRun):
    """The sections of the main run (limits, publish, pull, wake, growth, playground)."""

    # ------------------------------------------------------------------------------------------ limits
    def limits(self) -> dict[str, Any]:
        figs: dict[str, Any] = {}
        self.log("transport limit: a trivial app on mp serve's own HTTP server")
        with bare_serve() as s:
            figs["transport_1"] = self.repeat(s, "bare", "bare server, 1 client (httpx.Client)", tokens=["x"])
            figs["transport_1_raw"] = self.repeat(
                s, "bare", "bare server, 1 client (raw asyncio)", tokens=["x"], client="raw"
            )
            for key, c in C16.items():
                runs = min(self.runs, 3) if c["procs"] > 1 else None
                figs[f"transport_{key}"] = self.repeat(
                    s, "bare", "bare server, " + c["label"], runs=runs, tokens=["x"],
                    client=c["client"], tasks=c["tasks"], procs=c["procs"],
                )  # fmt: skip
        self.log(
            "storage limit: raw SQLite commits, WAL + synchronous=FULL, one small row per commit / 16 per commit"
        )
        figs["storage_commit_1"] = self.sqlite_commits(1)
        figs["storage_commit_16"] = self.sqlite_commits(16)
        return {"figures": figs}

    def sqlite_commits(self, group: int) -> dict[str, Any]:
        # The row is a real observation as mp serve stores it (same table shape, same size).
        event = json.dumps(
            {
                "specversion": "1.0", "id": "1", "source": "monitor:bench", "type": OBS_BODY["type"],
                "subject": "s-1", "time": "2026-11-30T00:00:00.000Z", "datacontenttype": "application/json",
                "sequence": "0" * 20, "tier": "measured", "origin": "probe", "verified": "machine_verified",
                "horizon": "event", "actor": "probe:bench",
                "data": {"n": 1, "tags": {}, "provenance": {"origin": "probe", "tier": "measured",
                         "verification": "machine_verified", "actor": "probe:bench", "on_behalf_of": None,
                         "attested": False, "source_ref": None, "rule": None, "wasDerivedFrom": [],
                         "wasAttributedTo": "probe:bench", "supersedes": None}},
            },
            separators=(",", ":"),
        )  # fmt: skip
        rates = []
        for _ in range(self.runs):
            path = self.db(f"raw-{group}")
            db = sqlite3.connect(path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(
                "CREATE TABLE observations (monitor TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, "
                "PRIMARY KEY (monitor, seq)) WITHOUT ROWID"
            )
            n = 0
            t0 = time.perf_counter()
            deadline = t0 + self.duration
            while time.perf_counter() < deadline and n < 10_000_000:
                db.execute("BEGIN IMMEDIATE")
                for _ in range(group):
                    n += 1
                    db.execute("INSERT INTO observations VALUES (?, ?, ?)", ("bench", n, event))
                db.execute("COMMIT")
            rates.append(n / (time.perf_counter() - t0))
            db.close()
        out = summary(rates)
        out.update(what=f"raw SQLite, WAL, synchronous=FULL, {group} row(s) per commit", unit="rows/s")
        self.log(f"  {out['what']}: {out['median']:.0f} rows/s (min {out['min']:.0f}, max {out['max']:.0f})")
        return out

    # ------------------------------------------------------------------------------------------ publish
    def publish(self) -> dict[str, Any]:
        figs: dict[str, Any] = {}
        with mp_serve(self.db("publish")) as s:
            tok = create_monitor(s)
            self.log("durable publish over HTTP")
            figs["publish_1"] = self.repeat(
                s, "publish", "publish, 1 client (httpx.Client, keep-alive)", tokens=[tok]
            )
            figs["publish_1_raw"] = self.repeat(
                s, "publish", "publish, 1 client (raw asyncio, keep-alive)", tokens=[tok], client="raw"
            )
            for key, c in C16.items():
                runs = min(self.runs, 3) if c["procs"] > 1 else None
                figs[f"publish_{key}"] = self.repeat(
                    s, "publish", "publish, " + c["label"], runs=runs, tokens=[tok],
                    client=c["client"], tasks=c["tasks"], procs=c["procs"],
                )  # fmt: skip
            # Paired runs: the machine is shared and its speed drifts, so the ratio to the transport limit
            # is also taken run by run, a bare-server run right before each publish run, same client.
            with bare_serve() as bare:
                paired: dict[str, Any] = {}
                for key, client, tasks in (("1", "sync", 1), ("raw16", "raw", 16)):
                    ratios_, pub, lim = [], [], []
                    self.log(f"paired publish / transport runs, {key}")
                    for _ in range(self.runs):
                        b = loadgen(
                            bare, "bare", duration=self.duration, tokens=["x"], client=client, tasks=tasks
                        )
                        p = loadgen(
                            s, "publish", duration=self.duration, tokens=[tok], client=client, tasks=tasks
                        )
                        lim.append(b["rate"])
                        pub.append(p["rate"])
                        ratios_.append(p["rate"] / b["rate"])
                    paired[key] = {
                        "ratio": summary(ratios_),
                        "publish": summary(pub),
                        "transport": summary(lim),
                        "what": f"publish / bare server, run by run, {key} client(s) ({client})",
                    }
                    self.log(
                        f"  publish/transport {key}: ratio {paired[key]['ratio']['median']:.2f} "
                        f"(min {paired[key]['ratio']['min']:.2f}, max {paired[key]['ratio']['max']:.2f}); "
                        f"publish {paired[key]['publish']['median']:.0f}/s, transport {paired[key]['transport']['median']:.0f}/s"
                    )
        return {"figures": figs, "paired": paired}

    # ------------------------------------------------------------------------------------------ pull
    def fill(self, path: str, upto: int, token: str | None = None) -> tuple[str, float]:
        """Fill the monitor in-process to ``upto`` observations: MonitorService + SQLiteStore, group commit
        of 2,000 publishes and synchronous=OFF, for the fill only. Returns (owner token, seconds)."""
        from monitor_protocol.core.service import MonitorService
        from monitor_protocol.store.sqlite import SQLiteStore

        store = SQLiteStore(path, synchronous="OFF")
        t0 = time.perf_counter()
        try:
            svc = MonitorService(store)
            if token is None:
                made = svc.create_monitor(
                    {"id": MONITOR, "visibility": "public", "types": [OBS_BODY["type"]]}, None
                )
                token = made["owner_token"]
            head = store.get_monitor(MONITOR).head  # a typed record since the seam rewrite
            todo = max(0, upto - head)
            while todo > 0:
                with store.batch():
                    for _ in range(min(2000, todo)):
                        svc.publish(MONITOR, dict(OBS_BODY), token)
                        todo -= 1
            store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            store.close()
        return token, time.perf_counter() - t0

    def pull(self) -> dict[str, Any]:
        figs: dict[str, Any] = {}
        n = 8_000 if self.quick else 60_000
        path = self.db("pull")
        self.log(f"pull: filling {n} observations in-process")
        self.fill(path, n)
        with mp_serve(path) as s:
            self.log("pull + ack round trips (limit 1), one client")
            sub, tok = subscribe(s, "agent:pullack", start="earliest")
            figs["pullack_1"] = self.repeat(
                s,
                "pullack",
                "pull(limit 1)+ack round trips, 1 client (httpx.Client)",
                subs=[sub],
                tokens=[tok],
            )
            sub, tok = subscribe(s, "agent:pullack-raw", start="earliest")
            figs["pullack_1_raw"] = self.repeat(
                s, "pullack", "pull(limit 1)+ack round trips, 1 client (raw asyncio)", subs=[sub], tokens=[tok],
                client="raw",
            )  # fmt: skip
            sub, tok = subscribe(s, "agent:pullack-rpc", start="earliest")
            figs["pullack_1_rpc"] = self.repeat(
                s, "rpcpullack", "ack+pull(limit 1) in one JSON-RPC batch request, 1 client (httpx.Client)",
                subs=[sub], tokens=[tok],
            )  # fmt: skip
            self.log(
                "batch drain (limit 200 + ack), one client, a fresh subscription from the earliest each run"
            )
            rates, scpu = [], []
            for i in range(self.runs):
                sub, tok = subscribe(s, f"agent:drain-{i}", start="earliest")
                r = loadgen(s, "drain", duration=self.duration, subs=[sub], tokens=[tok])
                rates.append(r["rate"])
                scpu.append(r["server_cpu"])
            out = summary(rates)
            out.update(what="batch drain, pull(limit 200)+ack, 1 client (httpx.Client)", unit="observations/s",
                       server_cpu_cores=round(sorted(scpu)[len(scpu) // 2], 2))  # fmt: skip
            self.log(
                f"  {out['what']}: {out['median']:.0f} obs/s (min {out['min']:.0f}, max {out['max']:.0f})"
            )
            figs["drain_1"] = out
        return {"figures": figs, "log_size": n}

    # ------------------------------------------------------------------------------------------ wake
    def wake(self) -> dict[str, Any]:
        samples = 40 if self.quick else 200
        self.log(f"long-poll wake latency, {samples} samples")
        with mp_serve(self.db("wake")) as s:
            owner = create_monitor(s)
            sub, tok = subscribe(s, "agent:waiter", start="head")
            # Catch up first: subscribing appends its own `subscribed` row, which the reader must not count.
            h = {"Authorization": f"Bearer {tok}"}
            caught = httpx.get(
                f"{s.base}/subscriptions/{sub}/pull", params={"limit": "200"}, headers=h
            ).json()
            httpx.post(f"{s.base}/subscriptions/{sub}/ack", json={"cursor": caught["next"]}, headers=h)
            from_reply: list[float] = []
            from_send: list[float] = []
            parked = threading.Event()
            got: list[tuple[float, int]] = []
            errors: list[str] = []
            done = threading.Event()

            def reader() -> None:
                with httpx.Client(timeout=60) as c:
                    h = {"Authorization": f"Bearer {tok}"}
                    for _ in range(samples):
                        if done.is_set():
                            return
                        parked.set()
                        r = c.get(
                            f"{s.base}/subscriptions/{sub}/pull",
                            params={"wait": "30", "limit": "1"},
                            headers=h,
                        )
                        t = time.perf_counter()
                        body = r.json()
                        if r.status_code != 200 or not body["observations"]:
                            errors.append(f"{r.status_code} {str(body)[:200]}")
                            got.append((t, -1))
                            continue
                        got.append((t, int(body["observations"][0]["id"])))
                        c.post(f"{s.base}/subscriptions/{sub}/ack", json={"cursor": body["next"]}, headers=h)

            th = threading.Thread(target=reader, daemon=True)
            th.start()
            with httpx.Client(timeout=60) as c:
                h = {"Authorization": f"Bearer {owner}"}
                for i in range(samples):
                    if not parked.wait(35):
                        errors.append("reader never parked")
                        break
                    parked.clear()
                    time.sleep(0.02)  # let the reader's pull reach the server and park
                    n_before = len(got)
                    t_send = time.perf_counter()
                    r = c.post(f"{s.base}/monitors/{MONITOR}/observations", json=OBS_BODY, headers=h)
                    t_reply = time.perf_counter()
                    seq = r.json()["seq"]
                    deadline = time.monotonic() + 35
                    while len(got) == n_before and time.monotonic() < deadline:
                        time.sleep(0.0002)
                    if len(got) == n_before:
                        errors.append(f"sample {i}: the waiting pull never answered")
                        break
                    t_recv, got_seq = got[-1]
                    if got_seq != seq:
                        errors.append(f"sample {i}: expected seq {seq}, got {got_seq}")
                        continue
                    from_reply.append((t_recv - t_reply) * 1000)
                    from_send.append((t_recv - t_send) * 1000)
            done.set()
            th.join(40)
        figs: dict[str, Any] = {}
        for key, xs in (("wake_from_reply_ms", from_reply), ("wake_from_send_ms", from_send)):
            xs = sorted(xs)
            figs[key] = {
                "p50": percentile(xs, 0.5),
                "p90": percentile(xs, 0.9),
                "p99": percentile(xs, 0.99),
                "p10": percentile(xs, 0.1),
                "min": xs[0] if xs else None,
                "max": xs[-1] if xs else None,
                "samples": len(xs),
                "unit": "ms",
                "what": "waiting pull?wait=30 answered, measured from the publish's "
                + ("reply" if "reply" in key else "request being sent"),
            }
            self.log(
                f"  {key}: p50 {figs[key]['p50']:.2f} ms, p99 {figs[key]['p99']:.2f} ms ({len(xs)} samples)"
            )
        return {"figures": figs, "errors": errors[:10]}

    # ------------------------------------------------------------------------------------------ growth
    def growth(self) -> dict[str, Any]:
        sizes = [1_000, 20_000] if self.quick else [1_000, 100_000, 1_000_000]
        path = self.db("growth")
        token = None
        levels = []
        for size in sizes:
            self.log(f"growth: filling to {size} observations in-process (synchronous=OFF, group commit)")
            token, secs = self.fill(path, size, token)
            files = [Path(path + sfx) for sfx in ("", "-wal")]
            nbytes = sum(f.stat().st_size for f in files if f.exists())
            level: dict[str, Any] = {
                "observations": size,
                "fill_seconds": round(secs, 2),
                "db_bytes": nbytes,
                "bytes_per_observation": round(nbytes / size, 1),
            }
            with mp_serve(path) as s:
                level["publish_1"] = self.repeat(
                    s, "publish", f"publish, 1 client, log of {size}", tokens=[token]
                )
                sub, tok = subscribe(s, f"agent:growth-{size}", start=max(1, size // 2))
                level["pull_1"] = self.repeat(
                    s,
                    "pull",
                    f"pull(limit 1) from the middle, 1 client, log of {size}",
                    subs=[sub],
                    tokens=[tok],
                )
            self.log(f"  {size}: {level['bytes_per_observation']} bytes/observation, fill {secs:.1f}s")
            levels.append(level)
        first, last = levels[0], levels[-1]
        ratios = {
            "sizes": f"{last['observations']}/{first['observations']}",
            # Cost ratio = time per operation at the largest size / at the smallest = rate_small / rate_large.
            "publish_cost_ratio": first["publish_1"]["median"] / last["publish_1"]["median"],
            "pull_cost_ratio": first["pull_1"]["median"] / last["pull_1"]["median"],
        }
        self.log(
            f"  cost ratio {ratios['sizes']}: publish {ratios['publish_cost_ratio']:.2f}, pull {ratios['pull_cost_ratio']:.2f}"
        )
        return {"levels": levels, "ratios": ratios}

    # ------------------------------------------------------------------------------------------ playground
    def playground(self) -> dict[str, Any]:
        script = ROOT / "bench" / "playground_bench.py"
        out = RESULTS / "playground.json"
        if not script.exists():
            return {"status": "not measured", "error": f"{script.relative_to(ROOT)} is missing"}
        args = ["--runs", "1", "--publishes", "100"] if self.quick else ["--runs", "3"]
        before = out.stat().st_mtime if out.exists() else 0.0
        self.log(f"playground: {script.relative_to(ROOT)} {' '.join(args)}")
        try:
            p = subprocess.run(
                [PY, str(script), *args], cwd=ROOT, capture_output=True, text=True, timeout=600
            )
        except subprocess.TimeoutExpired:
            return {"status": "not measured", "error": "bench/playground_bench.py did not finish in 600 s"}
        if p.returncode != 0 or not out.exists() or out.stat().st_mtime <= before:
            tail = (p.stderr or p.stdout).strip()[-1500:]
            return {"status": "not measured", "error": f"exit {p.returncode}: {tail}"}
        data = json.loads(out.read_text())
        self.log("  " + "\n  ".join(p.stdout.strip().splitlines()[-45:]))
        return {"status": "measured", "source": "bench/results/playground.json", "data": data}


# ---------------------------------------------------------------------------------------------- report
TARGETS = [
    # key, label, extractor, comparison, target, unit
    ("publish_1", "durable publish, 1 client", ("publish", "figures", "publish_1", "median"), ">=", 2000, "/s"),
    ("publish_16", "durable publish, 16 clients", ("publish", "figures", "publish_raw16", "median"), ">=", 5000, "/s"),
    ("pullack", "pull+ack round trips, 1 client", ("pull", "figures", "pullack_1", "median"), ">=", 1000, "rt/s"),
    ("drain", "batch drain (limit 200 + ack)", ("pull", "figures", "drain_1", "median"), ">=", 20000, "obs/s"),
    ("wake_p50", "long-poll wake latency p50", ("wake", "figures", "wake_from_reply_ms", "p50"), "<=", 5.0, "ms"),
    ("growth_publish", "publish cost growth 1M/1k", ("growth", "ratios", "publish_cost_ratio"), "<=", 1.5, "x"),
    ("growth_pull", "pull cost growth 1M/1k", ("growth", "ratios", "pull_cost_ratio"), "<=", 1.5, "x"),
    ("transport_share", "publish 16 clients / transport limit (paired runs)", ("publish", "paired", "raw16", "ratio", "median"), ">=", 0.5, "x"),
    ("playground_paint", "playground shell painted (first contentful paint)", ("playground", "data", "shell_paint_s", "median"), "<=", 0.3, "s"),
    ("playground_cold", "playground cold start (quiet 2-core machine)", ("playground", "data", "cold_start_to_interactive_s", "median"), "<=", 3.0, "s"),
    ("playground_idb", "durable publishes into IndexedDB", ("playground", "data", "publish_into_indexeddb_per_s", "1", "median"), ">=", 500, "/s"),
]  # fmt: skip


def dig(d: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def ratios(c: dict[str, Any]) -> dict[str, Any]:
    def med(*path: str) -> float | None:
        return dig(c, (*path, "median"))

    pairs = {
        "publish_1_vs_transport_1": (med("publish", "figures", "publish_1"), med("limits", "figures", "transport_1")),
        "publish_1_raw_vs_transport_1_raw": (med("publish", "figures", "publish_1_raw"), med("limits", "figures", "transport_1_raw")),
        "publish_16_vs_transport_16": (med("publish", "figures", "publish_raw16"), med("limits", "figures", "transport_raw16")),
        "publish_httpx_async16_vs_transport": (med("publish", "figures", "publish_httpx_async16"), med("limits", "figures", "transport_httpx_async16")),
        "publish_httpx_sync16p_vs_transport": (med("publish", "figures", "publish_httpx_sync16p"), med("limits", "figures", "transport_httpx_sync16p")),
        "publish_1_vs_storage_1": (med("publish", "figures", "publish_1"), med("limits", "figures", "storage_commit_1")),
        "publish_16_vs_storage_16": (med("publish", "figures", "publish_raw16"), med("limits", "figures", "storage_commit_16")),
        # A pull+ack round trip is two HTTP requests: compare requests/s with the transport's.
        "pullack_raw_requests_vs_transport_1_raw": (
            (med("pull", "figures", "pullack_1_raw") or 0) * 2 or None, med("limits", "figures", "transport_1_raw")),
        "pullack_requests_vs_transport_1": (
            (med("pull", "figures", "pullack_1") or 0) * 2 or None, med("limits", "figures", "transport_1")),
        # Each pull+ack commits twice (the pull records the delivered high-water mark; the ack the cursor).
        "pullack_commits_vs_storage_1": (
            (med("pull", "figures", "pullack_1") or 0) * 2 or None, med("limits", "figures", "storage_commit_1")),
    }  # fmt: skip
    t1, s1 = med("limits", "figures", "transport_1"), med("limits", "figures", "storage_commit_1")
    if t1 and s1:
        # A sequential client pays one HTTP round trip and one fsync'd commit per publish, one after the other.
        pairs["publish_1_vs_serial_ceiling"] = (med("publish", "figures", "publish_1"), 1 / (1 / t1 + 1 / s1))
    levels = dig(c, ("growth", "levels"))
    if isinstance(levels, list) and levels:
        storage_1 = med("limits", "figures", "storage_commit_1")
        pairs["growth_publish_smallest_vs_storage_1"] = (levels[0]["publish_1"]["median"], storage_1)
        pairs["growth_publish_largest_vs_storage_1"] = (levels[-1]["publish_1"]["median"], storage_1)
    return {k: round(a / b, 3) for k, (a, b) in pairs.items() if a and b}


def verdicts(c: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, label, path, op, target, unit in TARGETS:
        value = dig(c, path)
        if value is None:
            out.append(
                {
                    "key": key,
                    "target": f"{op} {target} {unit}",
                    "label": label,
                    "value": None,
                    "status": "not measured",
                }
            )
            continue
        sizes = dig(c, ("growth", "ratios", "sizes"))
        if key.startswith("growth") and sizes and sizes != "1000000/1000":
            label = label.replace("1M/1k", sizes)
        met = value >= target if op == ">=" else value <= target
        by = value / target if op == ">=" else target / value if value else float("inf")
        out.append({
            "key": key, "label": label, "value": round(value, 3), "target": f"{op} {target} {unit}",
            "status": "met" if met else "missed",
            # value as a share of the target (>=) or target as a share of the value (<=): < 1 = missed by that much
            "share_of_target": round(by, 3),
        })  # fmt: skip
    return out


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v < 100:
        return f"{v:.2f}{unit}"
    return f"{v:,.0f}{unit}"


def table(c: dict[str, Any]) -> str:
    rows: list[tuple[str, str, str, str]] = []

    def add(what: str, s: dict[str, Any] | None, unit: str = "") -> None:
        if not s:
            return
        if "p50" in s:
            rows.append(
                (
                    what,
                    f"p50 {fmt(s['p50'])} / p99 {fmt(s['p99'])} ms",
                    f"p10 {fmt(s['p10'])}",
                    f"p90 {fmt(s['p90'])}",
                )
            )
        else:
            rows.append((what, fmt(s["median"], unit), fmt(s["min"]), fmt(s["max"])))

    for sec in ("limits", "publish", "pull", "wake"):
        for key, s in (dig(c, (sec, "figures")) or {}).items():
            add(s.get("what", key) + f" [{s.get('unit', '')}]", s)
    for level in dig(c, ("growth", "levels")) or []:
        add(level["publish_1"]["what"], level["publish_1"])
        add(level["pull_1"]["what"], level["pull_1"])
        rows.append(
            (
                f"bytes/observation, log of {level['observations']}",
                fmt(level["bytes_per_observation"]),
                "",
                "",
            )
        )
    w = max([len(r[0]) for r in rows] + [10])
    lines = [f"{'figure':<{w}}  {'median':>24}  {'min/p10':>12}  {'max/p90':>12}"]
    lines += [f"{a:<{w}}  {b:>24}  {m:>12}  {x:>12}" for a, b, m, x in rows]
    lines.append("")
    for k, v in (c.get("ratios") or {}).items():
        lines.append(f"ratio {k}: {v}")
    lines.append("")
    for v in c.get("targets") or []:
        val = "-" if v["value"] is None else v["value"]
        extra = f" ({v['share_of_target']:.2f} of target)" if v.get("share_of_target") is not None else ""
        lines.append(f"target {v['label']} {v['target']}: {val} -> {v['status'].upper()}{extra}")
    if dig(c, ("playground", "status")) == "not measured":
        lines.append(f"playground: not measured: {c['playground'].get('error')}")
    elif dig(c, ("playground", "data", "conditions")):
        cond = c["playground"]["data"]["conditions"]
        lines.append(
            f"playground conditions: load average {cond.get('loadavg_before')} before, {cond.get('loadavg_after')} "
            f"after: {'quiet' if cond.get('quiet') else 'NOT quiet'} ({cond.get('quiet_rule')})"
        )
    return "\n".join(lines)


def markdown(c: dict[str, Any]) -> str:
    """The results as Markdown tables (for docs/bench.md): ``python bench/run.py --markdown``."""
    m = c["machine"]
    out = [
        f"Machine: {m['nproc']} x {m['cpu_model']}, Python {m['python']}, SQLite {m['sqlite']}, httptools "
        f"{m.get('httptools', '?')}, httpx {m['httpx']}; {m['platform']}. Date {m['date']}, commit `{(m['commit'] or '?')[:10]}`"
        + (" (engine modified in the working tree)" if m.get("engine_dirty") else "")
        + f"; {c.get('seconds', '?')} s in all.",
        "",
        "| figure | median | min | max | server CPU (cores) | client CPU (cores) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for sec in ("limits", "publish", "pull"):
        for s in (dig(c, (sec, "figures")) or {}).values():
            out.append(
                f"| {s['what']} [{s['unit']}] | {fmt(s['median'])} | {fmt(s['min'])} | {fmt(s['max'])} | "
                f"{s.get('server_cpu_cores', '')} | {s.get('client_cpu_cores', '')} |"
            )
    for level in dig(c, ("growth", "levels")) or []:
        for key in ("publish_1", "pull_1"):
            s = level[key]
            out.append(
                f"| {s['what']} [{s['unit']}] | {fmt(s['median'])} | {fmt(s['min'])} | {fmt(s['max'])} | "
                f"{s.get('server_cpu_cores', '')} | {s.get('client_cpu_cores', '')} |"
            )
    paired = dig(c, ("publish", "paired")) or {}
    if paired:
        out += [
            "",
            "| paired runs (a bare server run, then a publish run) | publish/s | transport/s | ratio median | min | max |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for p in paired.values():
            r = p["ratio"]
            out.append(
                f"| {p['what']} | {fmt(p['publish']['median'])} | {fmt(p['transport']['median'])} | "
                f"{r['median']:.2f} | {r['min']:.2f} | {r['max']:.2f} |"
            )
    out += [
        "",
        "| growth level | observations | fill (s) | database bytes | bytes/observation |",
        "|---|---:|---:|---:|---:|",
    ]
    for level in dig(c, ("growth", "levels")) or []:
        out.append(
            f"| {level['observations']:,} | {level['observations']:,} | {level['fill_seconds']} | "
            f"{level['db_bytes']:,} | {level['bytes_per_observation']} |"
        )
    wake = dig(c, ("wake", "figures")) or {}
    if wake:
        out += [
            "",
            "| wake latency | p10 | p50 | p90 | p99 | max | samples |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for s in wake.values():
            out.append(
                f"| {s['what']} (ms) | {fmt(s['p10'])} | {fmt(s['p50'])} | {fmt(s['p90'])} | {fmt(s['p99'])} | "
                f"{fmt(s['max'])} | {s['samples']} |"
            )
    pg = c.get("playground") or {}
    if pg.get("status") == "measured" or pg.get("data"):
        d = pg["data"]
        cond = d.get("conditions") or {}
        if cond:
            busy = (cond.get("cpu_busy_before") or {}).get("busy_share")
            out += ["", f"Playground conditions: load average (1/5/15 min) {cond.get('loadavg_before')} before, "
                    f"{cond.get('loadavg_after')} after"
                    + ("" if busy is None else f"; CPU busy with other work before the run: {busy:.0%}")
                    + f"; {'quiet' if cond.get('quiet') else 'NOT quiet'} ({cond.get('quiet_rule')})."]  # fmt: skip
        out += ["", "| playground (bench/playground_bench.py) | median | min | max | 1-min load before each run |",
                "|---|---:|---:|---:|---|"]  # fmt: skip
        rows = [("shell painted, first contentful paint (s)", d.get("shell_paint_s")),
                ("cold start to interactive (s)", d.get("cold_start_to_interactive_s")),
                ("cold start, renderer main-thread CPU (s)", d.get("cold_start_cpu_main_thread_s")),
                ("cold start, whole renderer CPU (s)", d.get("cold_start_cpu_renderer_s")),
                ("reload to interactive (s)", d.get("reload_to_interactive_s"))]  # fmt: skip
        for k, v in (d.get("publish_into_indexeddb_per_s") or {}).items():
            rows.append((f"publishes/s into IndexedDB, {k} in flight", v))
        for name, v in rows:
            if v and v.get("median") is not None:
                loads = ", ".join(f"{x:.2f}" for x in v.get("loadavg_1min_per_sample") or [])
                out.append(f"| {name} | {fmt(v['median'])} | {fmt(v['min'])} | {fmt(v['max'])} | {loads} |")
    elif pg:
        out += ["", f"Playground: not measured: {pg.get('error')}"]
    out += ["", "| ratio | value |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in (c.get("ratios") or {}).items()]
    out += ["", "| target | value | verdict | share of target |", "|---|---:|---|---:|"]
    for v in c.get("targets") or []:
        share = "" if v.get("share_of_target") is None else f"{v['share_of_target']:.2f}"
        out.append(f"| {v['label']} {v['target']} | {fmt(v['value'])} | {v['status']} | {share} |")
    return "\n".join(out)


def run_peers(args: argparse.Namespace) -> int:
    """The peers section (bench/peers.py) on its own: it writes bench/results/peers.json, not latest.json."""
    import peers

    bench = Bench(args)
    try:
        result = peers.run(bench)
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    result.update(name="peers", quick=args.quick)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "peers.json").write_text(json.dumps(result, indent=2) + "\n")
        bench.log(f"wrote bench/results/peers.json ({result['seconds']} s in all)")
    print("\n" + peers.markdown(result))
    return 0


def run_scaleout(args: argparse.Namespace) -> int:
    """The scale-out section (bench/scaleout.py) on its own: it writes bench/results/scaleout.json, not
    latest.json. 3 rounds of 3 s per figure by default, 1 round of 1 s with --quick."""
    import scaleout

    bench = Bench(args)
    bench.runs = args.runs or (1 if args.quick else 3)
    bench.duration = args.duration or (1.0 if args.quick else 3.0)
    try:
        result = scaleout.run(bench)
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    result.update(name="scaleout", quick=args.quick)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "scaleout.json").write_text(json.dumps(result, indent=2) + "\n")
        bench.log(f"wrote bench/results/scaleout.json ({result['seconds']} s in all)")
    print("\n" + scaleout.markdown(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Monitor Protocol benchmarks (see docs/bench.md)")
    ap.add_argument(
        "--quick", action="store_true", help="a short smoke run (fewer runs, shorter, smaller logs)"
    )
    ap.add_argument(
        "--only", action="append", default=[], help=f"run only these sections: {', '.join(SECTIONS)}"
    )
    ap.add_argument(
        "--runs",
        type=int,
        default=None,
        help="repetitions per figure (default 5; 2 with --quick; --scale-out: 3, 1 with --quick)",
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per run (default 2; 0.7 with --quick; --scale-out: 3, 1 with --quick)",
    )
    ap.add_argument("--tmpdir", default=None, help="where the benchmark databases go (default: the system's)")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results")
    ap.add_argument(
        "--markdown", action="store_true", help="print bench/results/latest.json as Markdown; run nothing"
    )
    ap.add_argument(
        "--peers", action="store_true",
        help="only the peers section (bench/peers.py: mp serve beside Redis, PostgreSQL, NATS) -> peers.json; "
        "with --markdown, print bench/results/peers.json",
    )  # fmt: skip
    ap.add_argument(
        "--scale-out", action="store_true",
        help="only the scale-out section (bench/scaleout.py: 1, 2, 3 mp serve on one PostgreSQL database, beside "
        "PostgreSQL's commit limit and mp serve on SQLite) -> scaleout.json; with --markdown, print "
        "bench/results/scaleout.json",
    )  # fmt: skip
    ap.add_argument(
        "--stages", action="store_true",
        help="only the stage profile (bench/stages.py: server CPU per publish and pull+ack, stage by stage) -> "
        "stages.json; with --markdown, print it",
    )  # fmt: skip
    ap.add_argument(
        "--fanout", action="store_true",
        help="only the wake fan-out (bench/fanout.py: 1,000 parked long polls, one publish, beside a bare floor) "
        "-> fanout.json; with --markdown, print it",
    )  # fmt: skip
    ap.add_argument(
        "--client", action="store_true",
        help="only the client's own cost (bench/client_cpu.py: client CPU per keep-alive publish, Client and "
        "AsyncClient beside raw floors) -> client.json; with --markdown, print it",
    )  # fmt: skip
    args = ap.parse_args(argv)
    alone = [flag for flag in ("peers", "scale_out", "stages", "fanout", "client") if getattr(args, flag)]
    if len(alone) > 1 or (alone and args.only):
        ap.error(
            "--peers, --scale-out, --stages, --fanout and --client each run on their own, without --only"
        )
    if args.stages or args.fanout or args.client:
        import client_cpu
        import fanout
        import stages

        module = stages if args.stages else fanout if args.fanout else client_cpu
        forward = ["--quick"] if args.quick else []
        forward += ["--runs", str(args.runs)] if args.runs else []
        forward += ["--markdown"] if args.markdown else []
        forward += ["--no-write"] if args.no_write else []
        return int(module.main(forward))
    if args.peers and args.only:
        ap.error("--peers runs on its own; it does not combine with --only")
    if args.scale_out and (args.only or args.peers):
        ap.error("--scale-out runs on its own; it does not combine with --only or --peers")
    if args.markdown:
        if args.peers:
            import peers

            print(peers.markdown(json.loads((RESULTS / "peers.json").read_text())))
            return 0
        if args.scale_out:
            import scaleout

            print(scaleout.markdown(json.loads((RESULTS / "scaleout.json").read_text())))
            return 0
        print(markdown(json.loads((RESULTS / "latest.json").read_text())))
        return 0
    if args.peers:
        return run_peers(args)
    if args.scale_out:
        return run_scaleout(args)
    only = [n.strip() for o in args.only for n in o.split(",") if n.strip()]
    bad = [n for n in only if n not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    chosen = [s for s in SECTIONS if not only or s in only]
    bench = Bench(args)
    info = machine()
    bench.log(
        f"machine: {info['nproc']} x {info['cpu_model']}, Python {info['python']}, commit {info['commit'][:10] if info['commit'] else '?'}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    try:
        for name in chosen:
            t0 = time.perf_counter()
            load = os.getloadavg()
            try:
                result = getattr(bench, name)()
            except Exception as exc:  # one broken section must not lose the others
                bench.log(f"{name} FAILED: {exc!r}")
                result = {"status": "failed", "error": repr(exc)}
            result.update(
                name=name, machine=result.get("machine", info), quick=args.quick, runs=bench.runs, duration_s=bench.duration,
                seconds=round(time.perf_counter() - t0, 1), loadavg_before=[round(x, 2) for x in load],
            )  # fmt: skip
            if not args.no_write and name != "playground":
                (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
            if not args.no_write and name == "playground":
                (RESULTS / "playground_run.json").write_text(
                    json.dumps({k: v for k, v in result.items() if k != "data"}, indent=2) + "\n"
                )
            bench.combined = getattr(bench, "combined", {})
            bench.combined[name] = result
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    # latest.json: this run's sections, plus the newest stored result of every section not run now.
    combined: dict[str, Any] = {
        "machine": info,
        "quick": args.quick,
        "seconds": round(time.perf_counter() - t_all, 1),
    }
    for name in SECTIONS:
        if name in getattr(bench, "combined", {}):
            combined[name] = bench.combined[name]
        elif name == "playground":
            run_info = RESULTS / "playground_run.json"
            if (RESULTS / "playground.json").exists() and run_info.exists():
                combined[name] = {
                    **json.loads(run_info.read_text()),
                    "data": json.loads((RESULTS / "playground.json").read_text()),
                }
        elif (RESULTS / f"{name}.json").exists():
            combined[name] = json.loads((RESULTS / f"{name}.json").read_text())
    combined["ratios"] = ratios(combined)
    combined["targets"] = verdicts(combined)
    text = table(combined)
    print("\n" + text)
    if not args.no_write:
        (RESULTS / "latest.json").write_text(json.dumps(combined, indent=2) + "\n")
        bench.log(f"wrote {', '.join(sorted(p.name for p in RESULTS.glob('*.json')))} in bench/results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
