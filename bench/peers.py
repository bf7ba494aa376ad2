"""The "peers" section of the benchmarks: mp serve beside Redis, PostgreSQL and NATS JetStream, on the same
workloads, in the same run, on the same machine. ``python build.py bench --peers [--quick] [--runs N]``.

It installs what it needs and says so: the Debian packages redis-server, nats-server and postgresql when their
binaries are missing (bench/peer_servers.py), and the pinned Python clients (``CLIENT_PINS`` there) into the
venv running the bench. Every peer is a throwaway server in a temporary directory on a free loopback port,
stopped at the end; mp serve is bench/common.py's ``mp_serve`` on a fresh SQLite database.

Every figure comes from a separate load process (bench/peer_load.py) driving the system through its usual Python
client. The rounds are interleaved: for each round, each workload runs once on each system, the order of the
systems rotating from round to round, so that the machine's drift hits them all alike. A figure is the median
of the rounds with the min and max; the server's CPU (with its children: PostgreSQL's backends) and the load
process's CPU are measured over the window. The machine's limits (a trivial app on mp serve's own HTTP
stack, raw SQLite fsync'd commits) are measured in the same run by bench/run.py's own functions.

Results: bench/results/peers.json; ``python bench/run.py --peers --markdown`` prints them as a table.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import BENCH, MONITOR, PY, ROOT, BenchRun, bare_serve, machine, mp_serve, percentile, summary
from peer_servers import CLIENT_PINS, ensure_apt, ensure_clients, peer, tree_cpu

SYSTEMS = ("mp", "redis", "postgres", "nats")
PEERS = SYSTEMS[1:]
NAMES = {"mp": "mp serve", "mp_onecall": "mp serve, pull(ack=n)", "redis": "Redis", "postgres": "PostgreSQL",
         "nats": "NATS"}  # fmt: skip
SHORT = {"redis": "Redis", "postgres": "PG", "nats": "NATS"}
LOAD = BENCH / "peer_load.py"
FEED = {False: 100_000, True: 20_000}  # entries in the pre-filled log, full run / --quick


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    kind: str  # bench/peer_load.py's workload
    unit: str
    tasks: int = 1
    limit: int = 1
    one_call: bool = False  # mp also runs it as pull(ack=n), when its client has that form


C16 = "16 asyncio tasks in 1 load process, each its own connection"
WORKLOADS = (
    Workload("publish_1", "publish, 1 client", "publish", "ops/s"),
    Workload("publish_16", f"publish, 16 clients ({C16})", "publish", "ops/s", tasks=16),
    Workload("pullack_1", "pull(1)+ack round trips, 1 client", "pullack", "round trips/s", one_call=True),
    Workload(
        "pullack_16",
        f"pull(1)+ack round trips, 16 readers ({C16} and its own reader)",
        "pullack",
        "round trips/s",
        tasks=16,
        one_call=True,
    ),  # fmt: skip
    Workload(
        "drain",
        "drain, pull(100)+ack, 1 client, from a pre-filled log",
        "drain",
        "items/s",
        limit=100,
        one_call=True,
    ),  # fmt: skip
    Workload("batch", "batched ingest, 100 observations per request, 1 client", "batch", "items/s"),
    Workload("wake", "wake latency, from the publish sent to the waiting reader's reply", "wake", "ms"),
)

# How each system does each workload: recorded with the results and printed under the table.
HOW = {
    "redis": "redis-py 1 client sync / redis.asyncio for 16. Streams: XADD; a reader is a consumer group, "
    "XREADGROUP COUNT n + XACK of the ids; batch = a MULTI/EXEC pipeline of 100 XADD; wake = XREADGROUP BLOCK.",
    "postgres": "psycopg 3, 1 client sync / AsyncConnection for 16, autocommit. The log is a table with a "
    "bigserial id and a jsonb body; publish = one INSERT per commit; a reader is a row of a cursors table, and "
    "pull+ack is one transaction: SELECT the rows after the cursor (the cursor row locked FOR UPDATE), UPDATE "
    "the cursor, COMMIT; batch = one 100-row INSERT; wake = LISTEN/NOTIFY, the INSERT and pg_notify in one "
    "transaction, the reader then SELECTs the row after its cursor (the figure is the row in hand).",
    "nats": "nats-py (asyncio only: 1 client = 1 task). JetStream streams on file storage; publish = js.publish, "
    "its PubAck awaited; a reader is a durable pull consumer, fetch(n) + ack_sync (explicit acks for pull(1); "
    "AckPolicy.ALL and one ack_sync of the last message for the drain); batch = 100 js.publish_async then all "
    "PubAcks awaited; wake = a pull consumer's fetch(1, timeout=30) waiting.",
    "mp": "monitor_protocol.client: Client for 1 client / AsyncClient for 16, each over the transport this tree's "
    "client uses (keep-alive HTTP/1.1). publish; a reader is a subscription: pull(limit=n) then ack(next) (and, where the client has it, pull(limit=n, ack=previous next) "
    "in one call); batch = publish_many (a JSON array in one request) where the client has it; wake = "
    "pull(wait=30) parked, then a publish.",
}
DURABILITY = {
    "mp": "SQLite WAL, synchronous=FULL: each reply after its commit's fsync (group commit)",
    "redis": "appendonly yes, appendfsync always, save '': the AOF fsync'd before each event loop's replies",
    "postgres": "fsync=on, synchronous_commit=on: each commit's WAL flushed before its reply",
    "nats": "JetStream file storage. nats-server 2.9 has no sync_interval option: a PubAck means written to the "
    "store file, which is fsync'd on its own schedule (not per message), so its publish figures are not fsync'd",
}


def log(msg: str) -> None:
    print(f"[peers] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- one run
@dataclass
class System:
    """A running system: the process whose CPU is the server's, and what a load process needs."""

    key: str
    pid: int
    conn: dict[str, Any]
    ctx: dict[str, Any]


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def _load_error(proc: subprocess.Popen[str], errf: Any, what: str) -> str:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    errf.seek(0)
    tail = errf.read().decode(errors="replace").strip()[-1500:]
    return f"{what} (exit {proc.returncode}): {tail}"


def run_load(system: System, spec: dict[str, Any], duration: float) -> dict[str, Any]:
    """One load process: set-up, READY, GO, the window, its result, END, tear-down. The server's CPU is taken
    over the window only (between GO and the result line), so set-up and tear-down do not count."""
    spec = {**spec, "system": system.key, "conn": system.conn, "ctx": system.ctx, "duration": duration}
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(
            [PY, str(LOAD), json.dumps(spec)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=errf, text=True,
        )  # fmt: skip
        try:
            t_spawn = time.monotonic()
            if _readline(proc, 120).strip() != "READY":
                return {"error": _load_error(proc, errf, "set-up failed")}
            cpu0, t0 = tree_cpu(system.pid), time.monotonic()
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
            line = _readline(proc, duration + 120)
            cpu1, t1 = tree_cpu(system.pid), time.monotonic()
            if not line.strip():
                return {"error": _load_error(proc, errf, "no result")}
            out = json.loads(line)
            out["server_cpu"] = (cpu1 - cpu0) / (t1 - t0)
            proc.stdin.write("END\n")  # now it may tear down
            proc.stdin.flush()
            if proc.wait(timeout=120) != 0:
                out["teardown_error"] = _load_error(proc, errf, "tear-down failed")
            # What a run costs besides its window (process start, imports, connections, readers).
            out["setup_s"], out["teardown_s"] = round(t0 - t_spawn, 3), round(time.monotonic() - t1, 3)
            return out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def prepare(system: System, fill: int) -> dict[str, Any]:
    """bench/peer_load.py's prepare: the streams / tables / monitors and the pre-filled log, once."""
    spec = {"system": system.key, "workload": "prepare", "conn": system.conn, "ctx": system.ctx, "fill": fill}
    p = subprocess.run(
        [PY, str(LOAD), json.dumps(spec)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    if p.returncode != 0:
        raise RuntimeError(f"prepare failed (exit {p.returncode}): {p.stderr.strip()[-1500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- servers
@contextmanager
def start_mp(bench: BenchRun, fill: int) -> Iterator[System]:
    path = bench.db("peers")
    log(f"mp serve: filling {fill:,} observations in-process (bench/run.py's fill), then serving")
    bench.fill(path, fill)
    with mp_serve(path) as s:
        ctx = {"feed_monitor": MONITOR, "feed": fill, "db": "SQLite (fresh, in a temporary directory)"}
        yield System("mp", s.proc.pid, {"url": s.url}, ctx)


@contextmanager
def start_peer(system: str, parent: Path) -> Iterator[System]:
    # PostgreSQL runs as an unprivileged user, which must be able to traverse into its directory.
    os.chmod(parent, os.stat(parent).st_mode | 0o011)
    with peer(system, parent) as p:
        yield System(system, p.proc.pid, p.conn, {"version": p.version, "settings": p.settings})


def start_all(bench: BenchRun, stack: ExitStack, not_measured: dict[str, str]) -> dict[str, System]:
    """Start and prepare every system not already excluded; one that fails is recorded and left out."""
    fill = FEED[bench.quick]
    running: dict[str, System] = {}
    for key in SYSTEMS:
        if key in not_measured:
            continue
        try:
            with ExitStack() as mine:  # stopped at once if its preparation fails
                cm = start_mp(bench, fill) if key == "mp" else start_peer(key, bench.tmp)
                system = mine.enter_context(cm)
                t0 = time.perf_counter()
                system.ctx.update(prepare(system, fill))
                stack.push(mine.pop_all())  # else it runs until the end of the section
            log(
                f"{NAMES[key]}: ready, {system.ctx.get('feed'):,} entries in the log ({time.perf_counter() - t0:.1f} s)"
            )
            running[key] = system
        except Exception as exc:  # one broken peer must not lose the others
            not_measured[key] = f"could not start or prepare: {exc!r}"[:2000]
            log(f"{NAMES[key]}: NOT MEASURED: {not_measured[key]}")
    return running


# ---------------------------------------------------------------------------------------------- rounds
def columns(w: Workload, running: dict[str, System]) -> list[str]:
    cols = [k for k in SYSTEMS if k in running]
    mp = running.get("mp")
    if w.one_call and mp and mp.ctx.get("client_pull_has_ack"):
        cols.append("mp_onecall")
    return cols


def rotated(items: list[str], n: int) -> list[str]:
    k = n % len(items) if items else 0
    return items[k:] + items[:k]


def one(bench: BenchRun, w: Workload, col: str, running: dict[str, System], rnd: int) -> dict[str, Any]:
    system = running["mp" if col == "mp_onecall" else col]
    spec = {"workload": w.kind, "tasks": w.tasks, "limit": w.limit, "one_call": col == "mp_onecall",
            "run": f"r{rnd}-{w.key}-{col}".replace("_", "-")}  # fmt: skip
    try:
        r = run_load(system, spec, bench.duration)
    except Exception as exc:  # a broken run is recorded; the round goes on
        r = {"error": f"{exc!r}"}
    r["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    if "error" in r:
        log(f"  {w.key} {col}: FAILED: {r['error'][:300]}")
    elif w.kind == "wake":
        xs = sorted(r["samples_ms"])
        log(f"  {w.key} {col}: p50 {percentile(xs, 0.5):.2f} ms, p99 {percentile(xs, 0.99):.2f} ms ({len(xs)} samples)"
            + (f", {r['errors']} errors: {r['first_error']}" if r["errors"] else ""))  # fmt: skip
    else:
        log(f"  {w.key} {col}: {r['rate']:,.0f} {w.unit} (server {r['server_cpu']:.2f} cores, client "
            f"{r['client_cpu']:.2f})" + (f", {r['errors']} errors: {r['first_error']}" if r["errors"] else ""))  # fmt: skip
    return r


def rounds(bench: BenchRun, running: dict[str, System]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """for each round: for each workload: each system once, the systems' order rotating by round."""
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {w.key: {} for w in WORKLOADS}
    for rnd in range(bench.runs):
        log(f"round {rnd + 1}/{bench.runs}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for w in WORKLOADS:
            for col in rotated(columns(w, running), rnd):
                raw[w.key].setdefault(col, []).append(one(bench, w, col, running, rnd))
    return raw


# ---------------------------------------------------------------------------------------------- figures
def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def aggregate(w: Workload, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {
        "runs_failed": len(runs) - len(ok),
        "teardown_errors": [r["teardown_error"][:300] for r in ok if r.get("teardown_error")][:3],
        "errors": sum(r.get("errors", 0) for r in ok),
        "server_cpu_cores": _median([r["server_cpu"] for r in ok]),
        "client_cpu_cores": _median([r["client_cpu"] for r in ok]),
        "loadavg": [r["loadavg"] for r in runs],
    }
    first = next(
        (r.get("error") or r.get("first_error") for r in runs if r.get("error") or r.get("first_error")), None
    )
    if first:
        out["first_error"] = first
    if w.kind == "wake":
        per_run = [sorted(r["samples_ms"]) for r in ok if r["samples_ms"]]
        pooled = sorted(x for xs in per_run for x in xs)
        out["p50"] = summary([percentile(xs, 0.5) for xs in per_run])
        out["p99"] = summary([percentile(xs, 0.99) for xs in per_run])
        out["pooled"] = {"p50": percentile(pooled, 0.5), "p90": percentile(pooled, 0.9),
                         "p99": percentile(pooled, 0.99), "max": pooled[-1] if pooled else None}  # fmt: skip
        out["samples"] = len(pooled)
        return out
    out.update(summary([r["rate"] for r in ok]))
    out["items"] = sum(r["units"] for r in ok)
    # The server's CPU per operation (per item for drain and batch): its cost, whatever the client's speed.
    out["server_us_per_unit"] = _median([r["server_cpu"] / r["rate"] * 1e6 for r in ok if r["rate"]])
    batched = {r.get("batched") for r in ok} - {None}
    if batched:
        out["batched"] = sorted(batched)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def figures(raw: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in WORKLOADS:
        systems = {col: aggregate(w, runs) for col, runs in raw[w.key].items()}
        entry: dict[str, Any] = {"label": w.label, "unit": w.unit, "tasks": w.tasks, "systems": systems}
        for mine in ("mp", "mp_onecall"):
            if mine not in systems:
                continue
            if w.kind == "wake":
                # A latency ratio above 1 means mp is slower; a throughput ratio above 1 means mp is faster.
                entry[f"ratios_{mine}"] = {
                    p: {peer: ratio(systems[mine][p]["median"], systems[peer][p]["median"])
                        for peer in PEERS if peer in systems}
                    for p in ("p50", "p99")
                }  # fmt: skip
            else:
                entry[f"ratios_{mine}"] = {
                    peer: ratio(systems[mine]["median"], systems[peer]["median"])
                    for peer in PEERS
                    if peer in systems
                }
        out[w.key] = entry
    return out


def batch_note(mp_ctx: dict[str, Any] | None, fig: dict[str, Any] | None) -> str | None:
    """What mp's batched-ingest figure is: publish_many's batch call, its fallback, or 100 sequential publishes."""
    if not mp_ctx:
        return None
    if not mp_ctx.get("client_has_publish_many"):
        return "mp: 100 sequential publishes (this client has no publish_many)"
    if fig and fig.get("batched") == [True]:
        return "mp: publish_many, 100 items in one request and one commit"
    return "mp: publish_many fell back to one request per item (the server does not advertise publish-batch)"


# ---------------------------------------------------------------------------------------------- limits
def limits(bench: BenchRun) -> dict[str, Any]:
    """The machine's limits, by bench/run.py's own functions: the bare endpoint on mp serve's own HTTP server
    (driven by bench/loadgen.py's httpx.Client, httpx.AsyncClient and raw asyncio clients), and raw SQLite
    commits with mp serve's durability settings."""
    figs: dict[str, Any] = {}
    log("machine limits: a trivial app on mp serve's HTTP server (transport), raw SQLite commits (storage)")
    with bare_serve() as s:
        figs["transport_1"] = bench.repeat(s, "bare", "bare server, 1 client (httpx.Client)", tokens=["x"])
        figs["transport_1_raw"] = bench.repeat(
            s, "bare", "bare server, 1 client (raw asyncio)", tokens=["x"], client="raw"
        )
        figs["transport_httpx_async16"] = bench.repeat(
            s, "bare", "bare server, 16 clients, httpx.AsyncClient, 1 process", tokens=["x"], client="async",
            tasks=16,
        )  # fmt: skip
        figs["transport_raw16"] = bench.repeat(
            s, "bare", "bare server, 16 clients, raw asyncio HTTP/1.1, 1 process", tokens=["x"], client="raw",
            tasks=16,
        )  # fmt: skip
    figs["storage_commit_1"] = bench.sqlite_commits(1)
    figs["storage_commit_16"] = bench.sqlite_commits(16)
    return figs


# ---------------------------------------------------------------------------------------------- fsyncs
CENSUS = (("publish", "publish", False), ("pullack", "pull(1)+ack round trip", False),
          ("pullack", "pull(1)+ack round trip, mp as pull(ack=n)", True))  # fmt: skip


def fsync_census(running: dict[str, System]) -> dict[str, Any]:
    """fsync + fdatasync calls per operation, counted by ``strace -f -c`` attached to each server (and its
    children) for one extra 1 s run of 1 client: what "durable" costs each system. Not timed (strace slows the
    server); it says which figures pay an fsync per operation."""
    if not shutil.which("strace"):
        return {"status": "not measured", "reason": "strace is not installed"}
    out: dict[str, Any] = {}
    for kind, label, one_call in CENSUS:
        row: dict[str, Any] = {}
        for key, system in running.items():
            if one_call and not (key == "mp" and system.ctx.get("client_pull_has_ack")):
                continue
            spec = {
                "workload": kind,
                "tasks": 1,
                "limit": 1,
                "one_call": one_call,
                "run": f"fsync-{kind}-{one_call:d}",
            }
            row[key] = _count_fsyncs(system, spec)
        if row:
            out[label] = row
    log("fsyncs per operation (strace): " + "; ".join(
        f"{label}: " + ", ".join(f"{SHORT.get(k, 'mp')} {v.get('per_op', '?')}" for k, v in row.items())
        for label, row in out.items()))  # fmt: skip
    return out


def _count_fsyncs(system: System, spec: dict[str, Any]) -> dict[str, Any]:
    tracer = subprocess.Popen(
        ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-p", str(system.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(0.5)  # strace attaches to every thread first
        r = run_load(system, spec, 1.0)
    finally:
        tracer.send_signal(signal.SIGINT)
        report = tracer.communicate(timeout=30)[1]
    if "error" in r:
        return {"error": r["error"]}
    if "ptrace" in report:  # strace could not attach (with no such call at all it prints no table: 0)
        return {"error": f"strace: {report.strip()[-300:]}"}
    calls = 0
    for line in report.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync"):
            calls += int(parts[3])
    return {"ops": r["ops"], "fsyncs": calls, "per_op": round(calls / r["ops"], 2) if r["ops"] else None}


# ---------------------------------------------------------------------------------------------- run
def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # so that every server's `finally` stops it


def run(bench: BenchRun) -> dict[str, Any]:
    """The whole peers section; returns what bench/results/peers.json holds."""
    t_all, load_before = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    old = signal.signal(signal.SIGTERM, _sigterm)
    not_measured: dict[str, str] = {}
    try:
        not_measured.update(ensure_apt(list(PEERS)))
        not_measured.update(ensure_clients([p for p in PEERS if p not in not_measured]))
        lim = limits(bench)
        with ExitStack() as stack:
            running = start_all(bench, stack, not_measured)
            t_rounds = time.perf_counter()
            raw = rounds(bench, running)
            rounds_s = time.perf_counter() - t_rounds
            census = fsync_census(running)
            log("stopping the servers")
    finally:
        signal.signal(signal.SIGTERM, old)
    figs = figures(raw)
    mp_ctx = running["mp"].ctx if "mp" in running else None
    if "batch" in figs:
        figs["batch"]["note"] = batch_note(mp_ctx, figs["batch"]["systems"].get("mp"))
    return {
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - t_all, 1),
        "rounds_seconds": round(rounds_s, 1),
        "rounds": bench.runs,
        "duration_s": bench.duration,
        "feed_entries": FEED[bench.quick],
        "client_pins": CLIENT_PINS,
        "systems": {k: _system_facts(k, running.get(k), not_measured.get(k)) for k in SYSTEMS},
        "limits": lim,
        "fsyncs_per_operation": census,
        "workloads": figs,
    }


def _system_facts(key: str, system: System | None, reason: str | None) -> dict[str, Any]:
    facts: dict[str, Any] = {"name": NAMES[key], "how": HOW[key], "durability": DURABILITY[key]}
    if system is None:
        return {**facts, "status": "not measured", "reason": reason or "not started"}
    ctx = {k: v for k, v in system.ctx.items() if k not in ("tokens",)}
    return {**facts, "status": "measured", **ctx}


# ---------------------------------------------------------------------------------------------- markdown
def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def _cell(s: dict[str, Any] | None, part: str | None = None) -> str:
    if not s:
        return "not measured"
    f = s[part] if part else s
    if f.get("median") is None:
        return "failed"
    return f"{_num(f['median'])} ({_num(f['min'])}-{_num(f['max'])})"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _rows(key: str, e: dict[str, Any]) -> list[str]:
    systems, rows = e["systems"], []
    for mine in ["mp"] + (["mp_onecall"] if "mp_onecall" in systems else []):
        label = e["label"] + (", mp as pull(ack=n), one call" if mine == "mp_onecall" else "")
        parts: list[str | None] = ["p50", "p99"] if key == "wake" else [None]
        for part in parts:
            ratios = e.get(f"ratios_{mine}") or {}
            ratios = ratios.get(part, {}) if part else ratios
            name = f"{label} {part} [{e['unit']}]" if part else f"{label} [{e['unit']}]"
            cells = [_cell(systems.get(mine), part)] + [_cell(systems.get(p), part) for p in PEERS]
            rows.append(f"| {name} | " + " | ".join(cells + [_ratio(ratios.get(p)) for p in PEERS]) + " |")
    return rows


def markdown(c: dict[str, Any]) -> str:
    """The peers table (rows: workloads; columns: the systems, then mp/peer ratios) and what it measured."""
    m = c["machine"]
    out = [
        f"Machine: {m['nproc']} x {m['cpu_model']}, Python {m['python']}; date {m['date']}, commit "
        f"`{(m['commit'] or '?')[:10]}`"
        + (" (engine modified in the working tree)" if m.get("engine_dirty") else "")
        + f". {c['rounds']} rounds of {c['duration_s']} s per workload and system, interleaved; {c['seconds']} s in "
        f"all. Load average (1, 5, 15 min) before: {' '.join(map(str, c['loadavg_before']))}, after: "
        f"{' '.join(map(str, c['loadavg_after']))}.",
        "",
        "Each cell: median (min-max) of the rounds. Ratios: mp's median / the peer's; for throughput above 1 means "
        "mp is faster, for latency above 1 means mp is slower.",
        "",
        "| workload | mp serve | Redis | PostgreSQL | NATS | mp/Redis | mp/PG | mp/NATS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, e in c["workloads"].items():
        out += _rows(key, e)
    note = c["workloads"].get("batch", {}).get("note")
    if note:
        out += ["", f"Batched ingest: {note}."]
    out += ["", "| system | version | client | durability | status |", "|---|---|---|---|---|"]
    for s in c["systems"].values():
        status = s["status"] if s["status"] == "measured" else f"not measured: {s.get('reason')}"
        out.append(
            f"| {s['name']} | {s.get('version', '')} | {s.get('client', '')} | {s['durability']} | {status} |"
        )
    census = c.get("fsyncs_per_operation") or {}
    if census and "status" not in census:
        out += ["", "| fsyncs per operation (strace -f -c, one 1 s run, 1 client) | mp serve | Redis | PostgreSQL | NATS |",
                "|---|---:|---:|---:|---:|"]  # fmt: skip
        for label, row in census.items():
            cells = [_num((row.get(k) or {}).get("per_op")) if k in row else "" for k in SYSTEMS]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    elif census:
        out += ["", f"fsyncs per operation: not measured: {census.get('reason')}"]
    out += ["", "| machine limit, same run | median | min | max |", "|---|---:|---:|---:|"]
    for f in c["limits"].values():
        out.append(
            f"| {f['what']} [{f['unit']}] | {_num(f['median'])} | {_num(f['min'])} | {_num(f['max'])} |"
        )
    out += ["", "| workload | system | server CPU (cores) | server CPU per op or item (us) | client CPU (cores) "
            "| errors | load average per run (1 min) |", "|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for key, e in c["workloads"].items():
        for col, s in e["systems"].items():
            loads = " ".join(str(la[0]) for la in s["loadavg"])
            per = s.get("server_us_per_unit")
            out.append(f"| {key} | {NAMES[col]} | {s['server_cpu_cores']} | {'' if per is None else f'{per:,.0f}'} | "
                       f"{s['client_cpu_cores']} | {s['errors']} | {loads} |")  # fmt: skip
    out += ["", "How each system runs each workload:", ""]
    out += [f"* **{NAMES[k]}**: {s['how']}" for k, s in c["systems"].items()]
    return "\n".join(out)


def main() -> int:
    """``python bench/peers.py`` prints bench/results/peers.json as Markdown (the run itself goes through
    bench/run.py --peers, which owns the shared settings and helpers)."""
    path = Path(__file__).resolve().parent / "results" / "peers.json"
    print(markdown(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
