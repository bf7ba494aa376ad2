"""The scale-out section: 1, 2 and 3 `mp serve` on one PostgreSQL database, beside PostgreSQL's own commit
limit and `mp serve` on SQLite, in the same run on the same machine.
``python build.py bench --scale-out [--quick] [--runs N] [--duration S]``.

What runs (every load is one bench/scaleout_load.py process; its clients are bench/loadgen.py's raw asyncio
HTTP/1.1 client on uvloop, each with one keep-alive connection, client i on server i mod k):

* publish/s, 16 and 64 clients, against 1, 2 and 3 `mp serve --db postgresql://...` on one database, with
  every client publishing to one monitor, and again spread over 3 monitors (client i on monitor (i div 3) mod
  3, so that on 3 servers every server serves all three);
* ack+pull round trips/s, 16 and 64 readers, same servers: each client is a reader with its own subscription
  and sends ``POST /subscriptions/{id}/pull`` with ``{"ack": <previous next>, "limit": 1}`` (the ack-and-pull
  extension, docs/serve.md "Fewer round trips"), one monitor and 3 monitors. A producer keeps the log ahead
  of every reader: it fills each monitor before the rounds and tops it up between runs (never inside a
  window), with batch publishes (100 per request) through a server of the configuration, so that no publish
  competes with the readers inside a window;
* the same on one `mp serve` on a SQLite file (the reference), and the machine's limits in the same run:
  PostgreSQL's own commit limit (one INSERT per transaction, psycopg AsyncConnection per client, the same
  cluster and durability: fsync=on, synchronous_commit=on) with 16 and 64 connections, and the bare
  endpoint on mp serve's HTTP server (bench/bare_app.py) with 16 and 64 of the same raw clients.

The PostgreSQL cluster is bench/peer_servers.py's throwaway one (initdb as an unprivileged user, fsync on,
synchronous_commit on), started once for the section; `mp serve` uses a database of its own in it (``mp``),
the commit limit a table in ``postgres``. The servers of a configuration are started for it and stopped after
it, so a server that is not part of a figure does not run (an idle one would still hear every append's
NOTIFY).

A round runs every configuration once (servers: SQLite 1, PostgreSQL 1, 2, 3, the commit limit, the bare
endpoint), the order of the configurations and of the figures inside each rotating from round to round; each
figure is a warm-up then a fixed window (3 rounds of 0.5 + 3 s; --quick: 1 round of 0.3 + 1 s). Over the
window: the rate, the CPU of every mp serve (utime+stime from /proc/<pid>/stat, all threads, summed), of
PostgreSQL (the postmaster and every process of the cluster, bench/peer_servers.py tree_cpu), of the load
process, and of the whole machine (/proc/stat), so that what other processes took is visible; each server's
engine thread busy time (mp_engine_commit_seconds from its /metrics); PostgreSQL's WAL bytes (pg_current_wal_lsn);
the requests' latency; the load average before each figure. Each figure is the median of the rounds with min
and max. After the rounds, not timed: the statements one publish and one ack+pull send PostgreSQL
(log_statement=all for a moment, 100 sequential requests through one server), and the sweep's seen meanwhile.

Client, servers and PostgreSQL share this machine's cores (2 here): the figures say what one machine does,
and the CPU per request is what lets the capacity on separate machines be worked out.

Results: bench/results/scaleout.json; ``python bench/run.py --scale-out --markdown`` prints the tables.
"""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from common import (
    BENCH,
    CLK_TCK,
    OBS_BODY,
    PY,
    ROOT,
    BenchRun,
    _stop,
    cpu_seconds,
    free_port,
    machine,
    summary,
)
from peer_servers import CLIENT_PINS, ensure_apt, ensure_clients, peer, tree_cpu

LOAD = BENCH / "scaleout_load.py"
CLIENTS = (16, 64)
QUEUE_CLIENTS = (
    1,
    16,
    64,
)  # PostgreSQL used directly as a queue: 1 and 16 are issue 27's targets' references
PG_SERVERS = (1, 2, 3)
MONITORS = (1, 3)
READERS = max(CLIENTS)
FILL = {False: 6_000, True: 1_500}  # entries per feed monitor before the rounds (topped up as needed)
WARMUP = {False: 0.5, True: 0.3}
BATCH = 100  # observations per batch publish (the server's max_items)
HEADROOM = 3.0  # a top-up leaves each feed this many times the most any reader took in one run ahead
MIN_AHEAD = 400  # ... and never less than this
TYPE = OBS_BODY["type"]


def log(msg: str) -> None:
    print(f"[scale-out {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ============================================================================================== the grid
@dataclass(frozen=True)
class Setup:
    """A configuration of servers: started together, its figures run, stopped."""

    key: str
    backend: str  # sqlite | pg | pgcommit | bare
    servers: int
    label: str
    connections: int | None = None  # mp serve --db-connections (PostgreSQL), None: the default


@dataclass(frozen=True)
class Cell:
    setup: Setup
    workload: str  # publish | ackpull | commit | bare
    clients: int
    monitors: int = 1

    @property
    def key(self) -> str:
        m = f"-{self.monitors}m" if self.workload in ("publish", "ackpull") else ""
        return f"{self.setup.key}-{self.workload}-{self.clients}c{m}"

    @property
    def unit(self) -> str:
        return {"ackpull": "round trips/s", "commit": "commits/s"}.get(self.workload, "requests/s")


SETUPS = (
    Setup("sqlite1", "sqlite", 1, "mp serve on SQLite, 1 server"),
    *(
        Setup(f"pg{k}", "pg", k, f"mp serve on PostgreSQL, {k} server{'s' if k > 1 else ''}")
        for k in PG_SERVERS
    ),
    # Issue 27 item 3: one server with one engine connection (one call at a time), beside pg1's default
    Setup("pg1one", "pg", 1, "mp serve on PostgreSQL, 1 server, --db-connections 1", connections=1),
    Setup(
        "pgcommit", "pgcommit", 0, "PostgreSQL used directly as a queue (one INSERT per commit per publish)"
    ),
    Setup("bare1", "bare", 1, "bare endpoint on mp serve's HTTP server (bench/bare_app.py), 1 server"),
)


def cells_of(setup: Setup) -> list[Cell]:
    if setup.backend == "pgcommit":
        return [Cell(setup, "commit", n) for n in QUEUE_CLIENTS]
    if setup.backend == "bare":
        return [Cell(setup, "bare", n) for n in CLIENTS]
    if setup.connections is not None:  # the engine-connections comparison: the figures it changes most
        return [Cell(setup, w, n, 3) for w in ("publish", "ackpull") for n in CLIENTS]
    cells = [Cell(setup, w, n, m) for w in ("publish", "ackpull") for m in MONITORS for n in CLIENTS]
    if setup.servers == 1:  # issue 27's first target: one server's publish with 1 client, beside the queue's
        cells.insert(0, Cell(setup, "publish", 1, 1))
    return cells


def rotated(items: list[Any], rnd: int, rounds: int) -> list[Any]:
    """The order of round `rnd`: rotated by rnd x len/rounds places, so that over the rounds each item runs
    early, in the middle and late."""
    if not items:
        return items
    k = (rnd * max(1, len(items) // max(1, rounds))) % len(items)
    return items[k:] + items[:k]


# ============================================================================================== databases
@dataclass
class Reader:
    sid: str
    token: str
    monitor: str
    next: int | None = None  # the last reply's `next`: the first ack of its next run


@dataclass
class Db:
    """A database mp serve runs on (the SQLite file or the PostgreSQL database) and what is in it."""

    backend: str
    url: str
    tokens: dict[str, str] = field(default_factory=dict)  # monitor -> owner token
    heads: dict[str, int] = field(default_factory=dict)  # feed monitor -> its head, as last seen
    readers: dict[int, list[Reader]] = field(default_factory=dict)  # monitors (1 or 3) -> the readers
    taken: int = 0  # the most entries one reader took in one run so far
    topped_up: int = 0  # entries the producer published between runs


def pub_monitor(m: int) -> str:
    return f"pub-{m + 1}"


def feed_monitor(m: int) -> str:
    return f"feed-{m + 1}"


def spread(i: int, monitors: int) -> int:
    """Client i's monitor among `monitors`: (i div 3) mod monitors, so that with 3 servers (client i on server
    i mod 3) every server serves every monitor."""
    return (i // 3) % monitors


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def publish_batches(base: str, db: Db, monitor: str, n: int) -> int:
    """n observations into `monitor`, 100 per request (the batch-publish extension); the new head."""
    head = 0
    with httpx.Client(timeout=120) as c:
        for start in range(0, n, BATCH):
            k = min(BATCH, n - start)
            r = c.post(f"{base}/monitors/{monitor}/observations", json=[OBS_BODY] * k,
                       headers=_headers(db.tokens[monitor]))  # fmt: skip
            if r.status_code != 207 or r.json().get("published") != k:
                raise RuntimeError(f"batch publish into {monitor}: {r.status_code} {r.text[:300]}")
            head = max(head, max(x["seq"] for x in r.json()["results"]))
    return head


def prepare(db: Db, base: str, fill: int) -> None:
    """The monitors, the readers' subscriptions and the filled feeds, through one server."""
    with httpx.Client(timeout=60) as c:
        for m in range(max(MONITORS)):
            for name in (pub_monitor(m), feed_monitor(m)):
                r = c.post(f"{base}/monitors", json={"id": name, "visibility": "public", "types": [TYPE]})
                r.raise_for_status()
                db.tokens[name] = r.json()["owner_token"]
        for monitors in MONITORS:
            readers = []
            for i in range(READERS):
                monitor = feed_monitor(spread(i, monitors))
                body = {"monitor": monitor, "subscriber": f"agent:reader-{monitors}m-{i}", "from": "earliest"}
                r = c.post(f"{base}/subscriptions", json=body)
                r.raise_for_status()
                readers.append(Reader(r.json()["subscription"]["id"], r.json()["token"], monitor))
            db.readers[monitors] = readers
    for m in range(max(MONITORS)):
        db.heads[feed_monitor(m)] = publish_batches(base, db, feed_monitor(m), fill)


def top_up(db: Db, base: str, readers: list[Reader]) -> int:
    """Keep every feed these readers read ahead of the furthest of them by HEADROOM x the most a reader took
    in one run (at least MIN_AHEAD). Returns the entries published."""
    ahead = max(MIN_AHEAD, int(HEADROOM * db.taken))
    published = 0
    for monitor in sorted({r.monitor for r in readers}):
        furthest = max((r.next or 0) for r in readers if r.monitor == monitor)
        head = db.heads.get(monitor, 0)
        if head - furthest < ahead:
            n = furthest + 2 * ahead - head
            n = -(-n // BATCH) * BATCH
            db.heads[monitor] = publish_batches(base, db, monitor, n)
            published += n
    db.topped_up += published
    return published


# ============================================================================================== processes
@dataclass
class Proc:
    proc: subprocess.Popen[str]
    port: int
    base: str  # the URL prefix of the API
    url: str
    errlog: Path


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextmanager
def servers(
    kind: str, db: str | None, k: int, logdir: Path, connections: int | None = None
) -> Iterator[list[Proc]]:
    """k `mp serve --db db` (kind "mp") or bench/bare_app.py (kind "bare"), started together, each on a free
    loopback port with the access log off (--log-level warning), stderr to a file; stopped on the way out.
    `connections`: mp serve's --db-connections."""
    procs: list[Proc] = []
    try:
        for i in range(k):
            port = free_port()
            if kind == "mp":
                cmd = [PY, "-m", "monitor_protocol", "serve", "--db", str(db), "--port", str(port),
                       "--log-level", "warning"]  # fmt: skip
                if connections is not None:
                    cmd += ["--db-connections", str(connections)]
            else:
                cmd = [PY, str(BENCH / "bare_app.py"), "--port", str(port), "--log-level", "warning"]
            errlog = logdir / f"{kind}-{port}-{i}.log"
            with open(errlog, "w") as err:
                p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True)
            url = f"http://127.0.0.1:{port}"
            procs.append(Proc(p, port, url + "/mp/v0", url, errlog))
        deadline = time.monotonic() + 60
        for s in procs:
            while True:
                if s.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {s.proc.returncode}: {_tail(s.errlog)}")
                try:
                    if httpx.get(s.base + "/discover", timeout=2).status_code < 500:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server on port {s.port} not ready after 60 s: {_tail(s.errlog)}")
                time.sleep(0.05)
        yield procs
    finally:
        for s in procs:
            _stop(s.proc)


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def engine_seconds(s: Proc) -> tuple[float, float] | None:
    """(when, the server's mp_engine_commit_seconds_sum): the time its engine thread has spent running calls
    and their commits. The scrape waits behind the calls queued on that thread; `when` is its middle."""
    t0 = time.monotonic()
    try:
        text = httpx.get(s.url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    t1 = time.monotonic()
    for line in text.splitlines():
        if line.startswith("mp_engine_commit_seconds_sum "):
            return (t0 + t1) / 2, float(line.split()[1])
    return None


def wal_lsn(conn: Any) -> int | None:
    """PostgreSQL's current WAL position in bytes (what the commits wrote, on every database of the cluster)."""
    if conn is None:
        return None
    try:
        return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
    except Exception:  # noqa: BLE001 - a missing figure, not a failed run
        return None


def snapshot(procs: list[Proc], pg_pid: int | None, load_pid: int) -> dict[str, Any]:
    busy, steal = machine_cpu()
    me = os.times()
    return {
        "t": time.monotonic(),
        "servers": [cpu_seconds(s.proc.pid) for s in procs],
        "pg": tree_cpu(pg_pid) if pg_pid else None,
        "client": cpu_seconds(load_pid),
        "self": me.user + me.system,
        "busy": busy,
        "steal": steal,
    }


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


# ============================================================================================== one figure
@dataclass
class Context:
    bench: BenchRun
    warmup: float
    pg_pid: int | None = None
    pg_conninfo: str | None = None
    pg_query: Any = None  # the orchestrator's own connection, for the WAL position
    dbs: dict[str, Db] = field(default_factory=dict)
    bare_token: str = "x"


def spec_of(ctx: Context, cell: Cell, procs: list[Proc]) -> tuple[dict[str, Any], list[Reader]]:
    spec: dict[str, Any] = {
        "workload": cell.workload,
        "clients": cell.clients,
        "warmup": ctx.warmup,
        "duration": ctx.bench.duration,
        "bases": [s.base for s in procs],
    }
    readers: list[Reader] = []
    if cell.workload == "commit":
        spec["conninfo"] = ctx.pg_conninfo
    elif cell.workload == "bare":
        spec["targets"] = [{"monitor": "bench", "token": ctx.bare_token}]
    else:
        db = ctx.dbs[cell.setup.backend]
        if cell.workload == "publish":
            spec["targets"] = [
                {"monitor": pub_monitor(spread(i, cell.monitors)), "token": db.tokens[pub_monitor(spread(i, cell.monitors))]}
                for i in range(cell.clients)
            ]  # fmt: skip
        else:
            readers = db.readers[cell.monitors][: cell.clients]
            spec["readers"] = [{"sid": r.sid, "token": r.token, "ack": r.next} for r in readers]
    return spec, readers


def run_cell(ctx: Context, cell: Cell, procs: list[Proc]) -> dict[str, Any]:
    """One figure: the load process's set-up, GO, warm-up, START, the window, its result, END."""
    spec, readers = spec_of(ctx, cell, procs)
    pg_side = cell.setup.backend in ("pg", "pgcommit")
    out: dict[str, Any] = {"loadavg": [round(x, 2) for x in os.getloadavg()]}
    if readers:
        db = ctx.dbs[cell.setup.backend]
        out["topped_up"] = top_up(db, procs[0].base, readers)
        out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(
            [PY, str(LOAD), json.dumps(spec)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=errf, text=True,
        )  # fmt: skip
        assert proc.stdin is not None

        def failed(what: str) -> dict[str, Any]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            errf.seek(0)
            tail = errf.read().decode(errors="replace").strip()[-1500:]
            return {**out, "error": f"{what} (exit {proc.returncode}): {tail}"}

        try:
            if _readline(proc, 120).strip() != "READY":
                return failed("set-up failed")
            proc.stdin.write("GO\n")
            proc.stdin.flush()
            if _readline(proc, ctx.warmup + 60).strip() != "START":
                return failed("no START")
            s0 = snapshot(procs, ctx.pg_pid, proc.pid)
            w0 = wal_lsn(ctx.pg_query) if pg_side else None
            e0 = [engine_seconds(s) for s in procs] if cell.setup.backend in ("sqlite", "pg") else []
            line = _readline(proc, ctx.bench.duration + 60)
            s1 = snapshot(procs, ctx.pg_pid, proc.pid)
            w1 = wal_lsn(ctx.pg_query) if pg_side else None
            e1 = [engine_seconds(s) for s in procs] if e0 else []
            if not line.strip():
                return failed("no result")
            r = json.loads(line)
            proc.stdin.write("END\n")
            proc.stdin.flush()
            last = _readline(proc, 90)
            if proc.wait(timeout=60) != 0 or not last.strip():
                return failed("tear-down failed")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    dt = s1["t"] - s0["t"]
    servers_cores = [(b - a) / dt for a, b in zip(s0["servers"], s1["servers"], strict=True)]
    out.update(r)
    out.update(
        window_s=round(dt, 4),
        server_cores_each=[round(x, 4) for x in servers_cores],
        server_cores=sum(servers_cores),
        pg_cores=None if s0["pg"] is None else (s1["pg"] - s0["pg"]) / dt,
        client_cores=(s1["client"] - s0["client"]) / dt,
        machine_cores=(s1["busy"] - s0["busy"]) / dt,
        steal_cores=(s1["steal"] - s0["steal"]) / dt,
        self_cores=(s1["self"] - s0["self"]) / dt,
    )
    out["other_cores"] = (
        out["machine_cores"]
        - out["server_cores"]
        - (out["pg_cores"] or 0)
        - out["client_cores"]
        - out["self_cores"]
    )
    if not pg_side:  # PostgreSQL idles beside SQLite and the bare endpoint: counted above, not a figure here
        out["pg_idle_cores"], out["pg_cores"] = out["pg_cores"], None
    if w0 is not None and w1 is not None and r["rate"]:
        out["wal_bytes_per_request"] = (w1 - w0) / dt / r["rate"]
    if e0 and all(x is not None for x in e0 + e1):
        # The engine thread is serial: its busy share of the window says how close a server is to its ceiling.
        # (Each batch is added to the sum when it ends; on PostgreSQL a batch is up to 64 calls run one after
        # the other, so over a short window the share can read above 1.)
        out["engine_busy_each"] = [
            round((b[1] - a[1]) / (b[0] - a[0]), 4)  # type: ignore[index]
            for a, b in zip(e0, e1, strict=True)
        ]
    if readers:
        db = ctx.dbs[cell.setup.backend]
        moved = json.loads(last)["readers"]
        for rd in readers:
            got = moved.get(rd.sid) or {}
            if got.get("next") is not None:
                db.taken = max(db.taken, int(got["next"]) - int(rd.next or 0))
                rd.next = int(got["next"])
            if got.get("head") is not None:
                db.heads[rd.monitor] = max(db.heads.get(rd.monitor, 0), int(got["head"]))
    return out


def _fmt_run(cell: Cell, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"FAILED: {r['error'][:400]}"
    pg = f", PostgreSQL {r['pg_cores']:.2f}" if r.get("pg_cores") is not None else ""
    busy = r.get("engine_busy_each")
    eng = f", engine busy {'/'.join(f'{x:.2f}' for x in busy)}" if busy else ""
    extra = f", {r['errors']} errors: {r['first_error']}" if r.get("errors") else ""
    extra += f", {r['empty']} empty pulls" if r.get("empty") else ""
    lat = r.get("latency_ms") or {}
    return (
        f"{r['rate']:,.0f} {cell.unit} (p50 {lat.get('p50')} ms, p99 {lat.get('p99')} ms); cores: servers "
        f"{r['server_cores']:.2f}{pg}, client {r['client_cores']:.2f}, machine {r['machine_cores']:.2f} "
        f"(others {r['other_cores']:.2f}, steal {r['steal_cores']:.2f}){eng}; load {r['loadavg'][0]}{extra}"
    )


# ============================================================================================== rounds
def run_setup(
    ctx: Context, setup: Setup, rnd: int, raw: dict[str, list[dict[str, Any]]], logdir: Path
) -> None:
    cells = rotated(cells_of(setup), rnd, ctx.bench.runs)
    if setup.backend == "pgcommit":
        for cell in cells:
            try:
                r = run_cell(ctx, cell, [])
            except Exception as exc:  # a broken figure is recorded; the round goes on
                r = {"error": repr(exc), "loadavg": [round(x, 2) for x in os.getloadavg()]}
            raw.setdefault(cell.key, []).append(r)
            log(f"  {cell.key}: {_fmt_run(cell, r)}")
        return
    kind = "bare" if setup.backend == "bare" else "mp"
    db = ctx.dbs[setup.backend].url if kind == "mp" else None
    t0 = time.perf_counter()
    try:
        with servers(kind, db, setup.servers, logdir, setup.connections) as procs:
            log(f" {setup.label}: started in {time.perf_counter() - t0:.1f} s")
            for cell in cells:
                try:
                    r = run_cell(ctx, cell, procs)
                except Exception as exc:  # a broken figure is recorded; the round goes on
                    r = {"error": repr(exc), "loadavg": [round(x, 2) for x in os.getloadavg()]}
                dead = [s for s in procs if s.proc.poll() is not None]
                if dead:
                    r.setdefault("error", f"a server died: {_tail(dead[0].errlog)}")
                raw.setdefault(cell.key, []).append(r)
                log(f"  {cell.key}: {_fmt_run(cell, r)}")
                if dead:
                    raise RuntimeError(f"a server of {setup.key} died")
            for s in procs:
                tail = _tail(s.errlog, 800).strip()
                if tail:
                    log(f"  server {s.port} said on stderr: {tail[-400:]}")
    except Exception as exc:
        log(f" {setup.label}: FAILED: {exc!r}")
        for cell in cells:
            if len(raw.get(cell.key, [])) <= rnd:
                raw.setdefault(cell.key, []).append({"error": f"setup failed: {exc!r}"[:1500],
                                                     "loadavg": [round(x, 2) for x in os.getloadavg()]})  # fmt: skip


CENSUS_N = 100  # sequential calls per workload in the statement census


def statement_census(ctx: Context, logdir: Path) -> dict[str, Any]:
    """What one engine call sends PostgreSQL: after the rounds (not timed), in this process, an engine
    (MonitorService) on the rounds' database through PostgresStore, whose connections count the statements
    they send and the round trips they wait for (tests/test_postgres_calls.py holds the same counts). An
    HTTP request of the rounds is one such call: the door adds no statement. CENSUS_N publishes, CENSUS_N
    ack+pulls (pull {ack, limit 1}) and CENSUS_N empty pulls, each on its own."""
    del logdir
    try:
        from monitor_protocol.core.service import MonitorService
        from monitor_protocol.store.postgres import PostgresStore
    except ImportError as exc:
        return {"status": "not measured", "reason": f"the engine is not importable here: {exc}"}
    out: dict[str, Any] = {"calls": CENSUS_N}
    store = None
    try:
        store = PostgresStore(ctx.dbs["pg"].url)
        service = MonitorService(store)
        monitor = "census"
        owner = service.create_monitor({"id": monitor, "visibility": "public", "types": [TYPE]}, None)[
            "owner_token"
        ]
        sub = service.subscribe({"monitor": monitor, "subscriber": "agent:census", "from": "earliest"}, None)
        sid, token = sub["subscription"]["id"], sub["token"]

        def counted(call: Any) -> dict[str, Any]:
            s0, r0, c0 = store.statements, store.round_trips, store.stats.commits
            for _ in range(CENSUS_N):
                call()
            return {
                "statements_per_call": round((store.statements - s0) / CENSUS_N, 2),
                "round_trips_per_call": round((store.round_trips - r0) / CENSUS_N, 2),
                "commits_per_call": round((store.stats.commits - c0) / CENSUS_N, 2),
            }

        subjects = iter(range(10**9))
        out["publish"] = counted(
            lambda: service.publish(monitor, {**OBS_BODY, "subject": f"s{next(subjects) % 10}"}, owner)
        )
        nxt = [service.pull(sid, token, limit=1)["next"]]  # the monitor's first pull writes its last_pull

        def ackpull() -> None:
            nxt[0] = service.pull(sid, token, limit=1, ack=nxt[0])["next"]

        out["ackpull"] = counted(ackpull)
        service.ack(sid, token, {"cursor": service.pull(sid, token, limit=CENSUS_N)["next"]})
        out["empty_pull"] = counted(lambda: service.pull(sid, token, limit=1))
    except Exception as exc:  # noqa: BLE001 - the census is a side figure
        return {"status": "failed", "error": repr(exc)[:1500]}
    finally:
        if store is not None:
            store.close()
    for workload in ("publish", "ackpull", "empty_pull"):
        w = out.get(workload) or {}
        log(f"statements per {workload} (counted by the store, not timed): {w}")
    return out


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # so that every server's `finally` stops it


def _pg_cluster(ctx: Context, stack: ExitStack, parent: Path) -> dict[str, Any]:
    import psycopg
    from peer_load import pg_schema

    os.chmod(parent, os.stat(parent).st_mode | 0o011)  # the cluster's user must traverse into it
    p = stack.enter_context(peer("postgres", parent))
    conninfo = p.conn["conninfo"]
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("CREATE DATABASE mp")
        for stmt in pg_schema(0)[:1]:  # log_pub: the commit limit's table (bench/peer_load.py's)
            c.execute(stmt)
        shown = {k: c.execute(f"SHOW {k}").fetchone()[0] for k in  # type: ignore[index]
                 ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "max_connections",
                  "shared_buffers", "wal_level", "commit_delay")}  # fmt: skip
    ctx.pg_pid = p.proc.pid
    ctx.pg_conninfo = conninfo
    ctx.pg_query = stack.enter_context(psycopg.connect(conninfo, autocommit=True))
    ctx.dbs["pg"] = Db("pg", f"postgresql://bench@127.0.0.1:{p.port}/mp")
    libpq = psycopg.pq.version()
    return {"version": p.version, "settings": p.settings, "shown": shown, "url": ctx.dbs["pg"].url,
            "client": f"psycopg {psycopg.__version__} (libpq {libpq // 10000}.{libpq % 100})"}  # fmt: skip


def run(bench: BenchRun) -> dict[str, Any]:
    """The whole scale-out section; returns what bench/results/scaleout.json holds."""
    t_all, load_before = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    old = signal.signal(signal.SIGTERM, _sigterm)
    ctx = Context(bench, WARMUP[bench.quick])
    raw: dict[str, list[dict[str, Any]]] = {}
    order: list[list[str]] = []
    logdir = bench.tmp / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        missing = ensure_apt(["postgres"])
        missing.update(ensure_clients(["postgres"]))
        if missing:
            raise RuntimeError(f"PostgreSQL is not available: {missing}")
        with ExitStack() as stack:
            pg = _pg_cluster(ctx, stack, bench.tmp)
            log(f"PostgreSQL: {pg['version']}, {pg['shown']}")
            ctx.dbs["sqlite"] = Db("sqlite", bench.db("scaleout"))
            fill = FILL[bench.quick]
            for key in ("sqlite", "pg"):
                t0 = time.perf_counter()
                with servers("mp", ctx.dbs[key].url, 1, logdir) as procs:
                    prepare(ctx.dbs[key], procs[0].base, fill)
                log(f"{key}: monitors, {len(MONITORS) * READERS} subscriptions, {fill:,} entries in each of "
                    f"{max(MONITORS)} feeds ({time.perf_counter() - t0:.1f} s)")  # fmt: skip
            t_rounds = time.perf_counter()
            for rnd in range(bench.runs):
                setups = rotated(list(SETUPS), rnd, bench.runs)
                order.append([s.key for s in setups])
                log(
                    f"round {rnd + 1}/{bench.runs}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
                )
                for setup in setups:
                    run_setup(ctx, setup, rnd, raw, logdir)
            rounds_s = time.perf_counter() - t_rounds
            census = statement_census(ctx, logdir)
            log("stopping PostgreSQL")
    finally:
        signal.signal(signal.SIGTERM, old)
    cells = [c for s in SETUPS for c in cells_of(s)]
    figures = {c.key: aggregate(c, raw[c.key]) for c in cells if c.key in raw}
    loops = sorted({r["loop"] for runs in raw.values() for r in runs if r.get("loop")})
    return {
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - t_all, 1),
        "rounds_seconds": round(rounds_s, 1),
        "rounds": bench.runs,
        "duration_s": bench.duration,
        "warmup_s": ctx.warmup,
        "order": order,
        "fill_per_feed": FILL[bench.quick],
        "topped_up": {k: d.topped_up for k, d in ctx.dbs.items()},
        "postgres": pg,
        "client": f"bench/scaleout_load.py: bench/loadgen.py's raw asyncio HTTP/1.1 client on {'/'.join(loops)}, "
        "one process, one keep-alive connection per client, client i on server i mod k; the commit limit: "
        f"psycopg AsyncConnection per client, autocommit ({CLIENT_PINS['psycopg']})",
        "note": NOTE,
        "statements": census,
        "figures": figures,
        "raw": raw,
    }


NOTE = (
    "Client, servers and PostgreSQL share this machine's {nproc} cores: a figure is what one machine does with "
    "all of them on it, and adding servers on it adds processes competing for the same cores. 'machine' is "
    "the whole machine's busy CPU over the window (/proc/stat), 'others' what was left after the servers, "
    "PostgreSQL, the load process and the orchestrator: other work on the machine."
)


# ============================================================================================== figures
def _median(xs: list[float | None]) -> float | None:
    vs = [x for x in xs if x is not None]
    return round(statistics.median(vs), 4) if vs else None


def aggregate(cell: Cell, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {
        "setup": cell.setup.key,
        "backend": cell.setup.backend,
        "servers": cell.setup.servers,
        "workload": cell.workload,
        "clients": cell.clients,
        "monitors": cell.monitors if cell.workload in ("publish", "ackpull") else None,
        "unit": cell.unit,
        "runs_failed": len(runs) - len(ok),
        "errors": sum(r.get("errors", 0) for r in ok),
        "empty_pulls": sum(r.get("empty", 0) for r in ok),
        "loadavg": [r["loadavg"] for r in runs],
        "rate": summary([r["rate"] for r in ok]),
    }
    first = next(
        (r.get("error") or r.get("first_error") for r in runs if r.get("error") or r.get("first_error")), None
    )
    if first:
        out["first_error"] = first
    for key in ("server_cores", "pg_cores", "client_cores", "machine_cores", "other_cores", "steal_cores"):
        out[key] = _median([r.get(key) for r in ok])
    # CPU per request, run by run (cores / rate), then the median: what a request costs each side.
    for key in ("server", "pg", "client"):
        out[f"{key}_us_per_request"] = _median(
            [
                r[f"{key}_cores"] / r["rate"] * 1e6
                for r in ok
                if r.get(f"{key}_cores") is not None and r["rate"]
            ]
        )
    out["wal_bytes_per_request"] = _median([r.get("wal_bytes_per_request") for r in ok])
    busy = [r["engine_busy_each"] for r in ok if r.get("engine_busy_each")]
    if busy:
        out["engine_busy_each"] = [_median([b[i] for b in busy]) for i in range(len(busy[0]))]
        out["engine_us_per_request"] = _median([sum(r["engine_busy_each"]) / r["rate"] * 1e6 for r in ok
                                                if r.get("engine_busy_each") and r["rate"]])  # fmt: skip
    for p in ("p50", "p99"):
        out[f"latency_{p}_ms"] = _median([(r.get("latency_ms") or {}).get(p) for r in ok])
    out["server_cores_each"] = (
        [_median([r["server_cores_each"][i] for r in ok]) for i in range(cell.setup.servers)] if ok else []
    )
    return out


# ============================================================================================== markdown
def _num(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:,.0f}"


def _cell(f: dict[str, Any] | None) -> str:
    if not f:
        return "not measured"
    r = f["rate"]
    if r.get("median") is None:
        return "failed"
    if r["runs"] == 1:
        return _num(r["median"])
    return f"{_num(r['median'])} ({_num(r['min'])}-{_num(r['max'])})"


def _rows_of(figs: dict[str, Any], workload: str) -> list[str]:
    rows = []
    for setup in SETUPS:
        if setup.backend not in ("sqlite", "pg") or setup.connections is not None:
            continue
        cells = [figs.get(f"{setup.key}-{workload}-{n}c-{m}m") for m in MONITORS for n in CLIENTS]
        rows.append(f"| {setup.label} | " + " | ".join(_cell(f) for f in cells) + " |")
    return rows


def _speedups(figs: dict[str, Any], workload: str) -> list[str]:
    rows = []
    for k in PG_SERVERS[1:]:
        cells = []
        for m in MONITORS:
            for n in CLIENTS:
                a = (figs.get(f"pg{k}-{workload}-{n}c-{m}m") or {}).get("rate", {}).get("median")
                b = (figs.get(f"pg1-{workload}-{n}c-{m}m") or {}).get("rate", {}).get("median")
                cells.append(f"{a / b:.2f}" if a and b else "-")
        rows.append(f"| {k} servers / 1 server (PostgreSQL) | " + " | ".join(cells) + " |")
    return rows


def markdown(c: dict[str, Any]) -> str:
    m = c["machine"]
    figs = c["figures"]
    rounds = c["rounds"]
    head = " | ".join(f"{n} clients, {mm} monitor{'s' if mm > 1 else ''}" for mm in MONITORS for n in CLIENTS)
    sep = "|---|" + "---:|" * (len(MONITORS) * len(CLIENTS))
    pg = c.get("postgres") or {}
    out = [
        f"Machine: {m['nproc']} x {m['cpu_model']}, Python {m['python']}, SQLite {m['sqlite']}; date {m['date']}, "
        f"commit `{(m['commit'] or '?')[:10]}`"
        + (" (engine modified in the working tree)" if m.get("engine_dirty") else "")
        + f". {rounds} round{'s' if rounds > 1 else ''} of {c['warmup_s']} s warm-up + {c['duration_s']} s per figure, "
        f"configurations interleaved (order rotating by round); {c['seconds']} s in all"
        + (" (--quick)" if c.get("quick") else "")
        + f". Load average (1, 5, 15 min) before: {' '.join(map(str, c['loadavg_before']))}, after: "
        f"{' '.join(map(str, c['loadavg_after']))}.",
        "",
        c["note"].format(nproc=m["nproc"]),
        "",
        f"PostgreSQL: {pg.get('version', '?')}; {', '.join(f'{k}={v}' for k, v in (pg.get('shown') or {}).items())}. "
        f"Client: {c['client']}.",
        "",
        "Each cell: median (min-max) of the rounds.",
        "",
        "| publish/s | " + head + " |",
        sep,
        *_rows_of(figs, "publish"),
        *_speedups(figs, "publish"),
        "",
        "| ack+pull round trips/s (POST pull {ack, limit 1}) | " + head + " |",
        sep,
        *_rows_of(figs, "ackpull"),
        *_speedups(figs, "ackpull"),
        "",
        "| machine limit, same run | " + " | ".join(f"{n} clients" for n in CLIENTS) + " |",
        "|---|" + "---:|" * len(CLIENTS),
    ]
    out.append("| PostgreSQL used directly as a queue, publishes/s (one INSERT per commit, 1 connection per client) | "
               + " | ".join(_cell(figs.get(f"pgcommit-commit-{n}c")) for n in CLIENTS) + " |")  # fmt: skip
    out.append("| bare endpoint (mp serve's HTTP server) requests/s, 1 server | "
               + " | ".join(_cell(figs.get(f"bare1-bare-{n}c")) for n in CLIENTS) + " |")  # fmt: skip
    out += [
        "",
        "What a request costs (medians of the rounds). Figure keys: configuration (sqlite1, pg1-3 = that many "
        "servers, pgcommit, bare1), workload, clients, monitors. CPU in cores over the window and in µs per "
        "request (servers summed; PostgreSQL = every process of the cluster); each server's engine busy share "
        "(summed over its engine threads: on PostgreSQL up to --db-connections calls run at once, each on a "
        "thread of its own, so the share can read above 1); WAL bytes per request (pg_current_wal_lsn over the "
        "window); "
        "latency; load average (1 min) before each round's figure.",
        "",
        "| figure | rate | servers (cores) | each server | engine busy | server µs/req | PostgreSQL (cores) "
        "| PG µs/req | WAL B/req | client (cores) | client µs/req | machine (cores) | others | p50 ms | p99 ms "
        "| errors | load |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, f in figs.items():
        each = "/".join(_num(x) for x in f.get("server_cores_each") or [])
        busy = "/".join(_num(x) for x in f.get("engine_busy_each") or [])
        errs = f["errors"] + f["runs_failed"]
        extra = f" ({f['empty_pulls']} empty)" if f.get("empty_pulls") else ""
        out.append(
            f"| {key} | {_num((f['rate'] or {}).get('median'))} | {_num(f['server_cores'])} | {each} | {busy} | "
            f"{_num(f['server_us_per_request'], 0)} | {_num(f['pg_cores'])} | {_num(f['pg_us_per_request'], 0)} | "
            f"{_num(f.get('wal_bytes_per_request'), 0)} | "
            f"{_num(f['client_cores'])} | {_num(f['client_us_per_request'], 0)} | {_num(f['machine_cores'])} | "
            f"{_num(f['other_cores'])} | {_num(f['latency_p50_ms'])} | {_num(f['latency_p99_ms'])} | {errs}{extra} | "
            f"{' '.join(str(la[0]) for la in f['loadavg'])} |"
        )
    out += ["", *capacity(c)]
    census = c.get("statements") or {}
    if census.get("publish"):
        out += ["", f"What one engine call sends PostgreSQL (after the rounds, not timed: counted by PostgresStore's "
                f"connections, {census['calls']} sequential calls of each, in the orchestrator's process on the "
                "rounds' database; an HTTP request of the rounds is one such call):",
                "", "| call | statements | round trips | commits |", "|---|---:|---:|---:|"]  # fmt: skip
        for w, what in (("publish", "publish"), ("ackpull", "ack+pull (pull {ack, limit 1})"),
                        ("empty_pull", "empty pull")):  # fmt: skip
            x = census.get(w) or {}
            out.append(f"| {what} | {x.get('statements_per_call')} | {x.get('round_trips_per_call')} | "
                       f"{x.get('commits_per_call')} |")  # fmt: skip
    elif census:
        out += [
            "",
            f"Statements per call: {census.get('status')}: {census.get('reason') or census.get('error')}",
        ]
    out += ["", *targets(c)]
    firsts = [(k, f["first_error"]) for k, f in figs.items() if f.get("first_error")]
    if firsts:
        out += ["", "First error of each figure that had one:", ""]
        out += [f"* {k}: `{e[:300]}`" for k, e in firsts]
    out += ["", f"Producer: {c['fill_per_feed']:,} entries per feed monitor before the rounds, then topped up "
            f"between runs: {', '.join(f'{k} {v:,}' for k, v in c['topped_up'].items())} entries."]  # fmt: skip
    return "\n".join(out)


def capacity(c: dict[str, Any]) -> list[str]:
    """Arithmetic on the figures above, per workload at 64 clients: the CPU a request costs each side, and the
    rates those costs allow: per server core, per PostgreSQL core, and on this whole machine with its client."""
    figs = c["figures"]
    nproc = c["machine"]["nproc"]
    out = [
        f"The CPU cost model, from the 64-client figures (arithmetic on the medians above, not a measurement): a "
        f"server core's worth of requests = 1e6 / server µs; a PostgreSQL core's = 1e6 / PG µs; all {nproc} "
        "cores of this machine, client included = "
        f"{nproc} x 1e6 / (server + PG + client µs). The engine µs is the engine thread's busy time per request "
        "(one call at a time per server, waits on PostgreSQL and its locks included): one server's engine-bound "
        "rate = 1e6 / engine µs.",
        "",
        "| workload | servers | monitors | measured | server µs | PG µs | client µs | engine µs | per server core "
        f"| per PG core | per server, engine-bound | {nproc} cores, CPU-bound |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in ("publish", "ackpull"):
        for setup in SETUPS:
            if setup.backend not in ("sqlite", "pg") or setup.connections is not None:
                continue
            for m in MONITORS:
                f = figs.get(f"{setup.key}-{workload}-{max(CLIENTS)}c-{m}m")
                if not f or f["rate"].get("median") is None:
                    continue
                s, p, cl = f["server_us_per_request"], f["pg_us_per_request"], f["client_us_per_request"]
                e = f.get("engine_us_per_request")
                total = sum(x for x in (s, p, cl) if x)
                out.append(
                    f"| {workload} | {setup.label} | {m} | {_num(f['rate']['median'])} | {_num(s, 0)} | {_num(p, 0)} | "
                    f"{_num(cl, 0)} | {_num(e, 0)} | {_num(1e6 / s if s else None)} | {_num(1e6 / p if p else None)} | "
                    f"{_num(1e6 / e if e else None)} | {_num(nproc * 1e6 / total if total else None)} |"
                )
    for n in QUEUE_CLIENTS:
        f = figs.get(f"pgcommit-commit-{n}c")
        if f and f["rate"].get("median"):
            out.append(f"| PostgreSQL INSERT+commit, {n} connections | - | - | {_num(f['rate']['median'])} | - | "
                       f"{_num(f['pg_us_per_request'], 0)} | {_num(f['client_us_per_request'], 0)} | - | - | "
                       f"{_num(1e6 / f['pg_us_per_request'] if f['pg_us_per_request'] else None)} | - | - |")  # fmt: skip
    return out


def _rate(figs: dict[str, Any], key: str) -> float | None:
    return ((figs.get(key) or {}).get("rate") or {}).get("median")


def _verdict(value: float | None, target: float, above: bool) -> str:
    if value is None:
        return "not measured"
    met = value >= target if above else value <= target
    return "**met**" if met else f"**missed** by {abs(value - target) / target:.0%}"


def targets(c: dict[str, Any]) -> list[str]:
    """Issue 27's targets, as ratios of figures of this one run."""
    figs = c["figures"]
    out = ["Issue 27's targets, ratios of figures of this run:", "",
           "| target | measured | ratio | verdict |", "|---|---|---:|---|"]  # fmt: skip
    for n in (1, 16):
        a, b = _rate(figs, f"pg1-publish-{n}c-1m"), _rate(figs, f"pgcommit-commit-{n}c")
        r = a / b if a and b else None
        out.append(f"| one mp serve on PostgreSQL, publish, {n} client{'s' if n > 1 else ''}: >= 0.7 x PostgreSQL "
                   f"used directly as a queue | {_num(a)} vs {_num(b)} publishes/s | {_num(r)} | "
                   f"{_verdict(r, 0.7, True)} |")  # fmt: skip
    for n in (1, *CLIENTS):
        a = (figs.get(f"pg1-publish-{n}c-1m") or {}).get("server_us_per_request")
        b = (figs.get(f"sqlite1-publish-{n}c-1m") or {}).get("server_us_per_request")
        r = a / b if a and b else None
        out.append(f"| server CPU per publish, PostgreSQL <= 1.5 x SQLite ({n} client{'s' if n > 1 else ''}) | "
                   f"{_num(a, 0)} vs {_num(b, 0)} µs | {_num(r)} | {_verdict(r, 1.5, False)} |")  # fmt: skip
    for w in ("publish", "ackpull"):
        for n in CLIENTS:
            a, b = _rate(figs, f"pg1-{w}-{n}c-3m"), _rate(figs, f"pg1one-{w}-{n}c-3m")
            r = a / b if a and b else None
            f, g = figs.get(f"pg1-{w}-{n}c-3m") or {}, figs.get(f"pg1one-{w}-{n}c-3m") or {}
            out.append(f"| item 3: one server, 4 engine connections against 1 ({w}, {n} clients, 3 monitors) | "
                       f"{_num(a)} vs {_num(b)}/s; server µs/req {_num(f.get('server_us_per_request'), 0)} vs "
                       f"{_num(g.get('server_us_per_request'), 0)}; machine {_num(f.get('machine_cores'))} vs "
                       f"{_num(g.get('machine_cores'))} cores | {_num(r)} | - |")  # fmt: skip
    for n in CLIENTS:
        a, b = _rate(figs, f"pg2-publish-{n}c-3m"), _rate(figs, f"pg1-publish-{n}c-3m")
        r = a / b if a and b else None
        f = figs.get(f"pg2-publish-{n}c-3m") or {}
        out.append(f"| 2 servers on 3 monitors >= 1.5 x one server (publish, {n} clients) | {_num(a)} vs {_num(b)} "
                   f"publishes/s; machine {_num(f.get('machine_cores'))} of {c['machine']['nproc']} cores busy "
                   f"(servers {_num(f.get('server_cores'))}, PostgreSQL {_num(f.get('pg_cores'))}, client "
                   f"{_num(f.get('client_cores'))}) | {_num(r)} | {_verdict(r, 1.5, True)} |")  # fmt: skip
    return out


def main() -> int:
    """``python bench/scaleout.py`` prints bench/results/scaleout.json as Markdown (the run itself goes through
    bench/run.py --scale-out)."""
    path = Path(__file__).resolve().parent / "results" / "scaleout.json"
    print(markdown(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
