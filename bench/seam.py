"""The seam benchmarks (issue 10's targets): figures only, nothing asserted. Not a test.

  filtered   one pull(limit 1) for a subscription whose filter excludes every one of 1,000,000 observations
             (by type, by subject, by text): latency p50/p90/max in-process (MonitorService + SQLiteStore)
             and over HTTP (`mp serve`), the reply's lag, lag_capped and scan_capped, and how long a reader
             that pulls and acks `next` takes to reach the head (in-process, bounded by a deadline)
  longpoll   200 and 1,000 parked long polls (`pull?wait=30`, one subscription each) woken by one publish,
             then the same against the floors of bench/bare_longpoll.py (no protocol work),
             over HTTP: latency from the publish being sent to each reply, and how many carried it
  fsync      fsync + fdatasync syscalls of the `mp serve` process (strace -f -c -p) per empty pull, per
             non-empty pull, per publish, per long-poll re-check, per filtered pull over non-matching rows
  publish    durable publish, 1 client (httpx.Client and the raw asyncio client): publish/s and the server's
             CPU per request (from /proc/<pid>/stat)

Runs unchanged against any engine tree through the public API only (the service's public methods and the
HTTP API):

  python bench/run.py --only seam                    # this tree's engine -> bench/results/seam.json
  python bench/seam.py --engine /tmp/seam-before/engine --before   # -> bench/results/seam-before.json
  python bench/seam.py --quick --out /tmp/seam.json  # a smoke run (100k observations, fewer readers)

The filled 1M database is cached under $TMPDIR/mp-seam-cache/<engine commit>[-dirty-<diff hash>]/ (the
fill takes ~1 minute); every run works on a copy of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from common import (  # noqa: E402
    PY,
    RESULTS,
    ROOT,
    Server,
    _stop,
    cpu_seconds,
    free_port,
    loadgen,
    machine,
    percentile,
    summary,
)

MONITOR = "seam"
TICK = "com.example.bench.tick"
OTHER = "com.example.other"
OBS = {"type": TICK, "subject": "s-1", "actor": "probe:bench", "data": {"n": 1}}
MAX_INT = 2**53 - 1  # an ack is clamped to head + 1: this acks "everything so far"
# Filters that exclude every row of the filled log (every row is TICK, subject s-1, data {"n": 1}).
FILTERS: dict[str, dict[str, Any]] = {
    "type": {"types": [OTHER]},
    "subject": {"subjects": ["no-such-subject"]},
    "text": {"text": "no-such-needle"},
}
SUBS_PER_KIND = 16  # in-process runs + catch-up + HTTP runs + the strace pass, with room to spare
CACHE = Path(tempfile.gettempdir()) / "mp-seam-cache"


def log(msg: str) -> None:
    print(f"[seam] {msg}", flush=True)


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def ms(x: float) -> float:
    return round(x * 1000, 3)


# ------------------------------------------------------------------------------------------------ engine
def engine_dir(explicit: str | None = None) -> Path:
    """The engine tree to measure: --engine, else $SEAM_ENGINE, else the first PYTHONPATH entry holding
    monitor_protocol, else this repository's engine/."""
    candidates = [explicit, os.environ.get("SEAM_ENGINE")]
    candidates += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    for c in candidates:
        if c and (Path(c) / "monitor_protocol" / "__init__.py").exists():
            return Path(c).resolve()
        if c and c == explicit:
            raise SystemExit(f"--engine {c}: no monitor_protocol package there")
    return (ROOT / "engine").resolve()


def use_engine(engine: Path) -> dict[str, str]:
    """Import monitor_protocol from ``engine`` in this process; return the environment for children."""
    loaded = sys.modules.get("monitor_protocol")
    if loaded is not None:
        where = Path(loaded.__file__ or "").resolve().parent.parent
        if where != engine:
            raise RuntimeError(
                f"monitor_protocol is already imported from {where}, not {engine}: run bench/seam.py "
                "on its own (python bench/seam.py --engine ...)"
            )
    if str(engine) in sys.path:
        sys.path.remove(str(engine))
    sys.path.insert(0, str(engine))
    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != engine]
    env["PYTHONPATH"] = os.pathsep.join([str(engine), *rest])
    return env


def tree_info(engine: Path) -> dict[str, Any]:
    """Commit of the engine's git tree, and whether its engine/ differs from that commit."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=engine, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--", ".").strip())
        diff = git("diff", "HEAD", "--", ".") if dirty else ""
        untracked = git("ls-files", "--others", "--exclude-standard", "--", ".") if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        return {"path": str(engine), "commit": None, "dirty": None, "key": "unknown"}
    key = commit[:12]
    if dirty:
        h = hashlib.sha256(diff.encode())
        for rel in sorted(untracked.split()):
            with contextlib.suppress(OSError):
                h.update(rel.encode() + (engine / rel).read_bytes())
        key += "-dirty-" + h.hexdigest()[:10]
    return {"path": str(engine), "commit": commit, "dirty": dirty, "key": key}


# ------------------------------------------------------------------------------------------------ servers
@contextlib.contextmanager
def serve(db: str, env: dict[str, str], engine: Path, logdir: Path) -> Iterator[Server]:
    """`python -m monitor_protocol serve` (that is `mp serve`) of the chosen engine, on ``db``."""
    port = free_port()
    err = open(logdir / f"serve-{port}.log", "w")  # noqa: SIM115 - closed below; a file never fills like a pipe
    cmd = [PY, "-m", "monitor_protocol", "serve", "--db", db, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=engine.parent, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        url = f"http://127.0.0.1:{port}/mp/v0/discover"
        deadline = time.monotonic() + 120  # a 1M-row database is quick_check'ed at start
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"mp serve exited with {proc.returncode}: "
                    f"{(logdir / f'serve-{port}.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(url, timeout=2.0).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mp serve at {url} not ready after 120 s")
            time.sleep(0.05)
        yield Server(proc, port, "/mp/v0", None)
    finally:
        _stop(proc)
        err.close()


FLOORS = {
    "uvicorn": "bench/bare_longpoll.py --server uvicorn (mp serve's HTTP stack, no protocol work)",
    "raw": "bench/bare_longpoll.py --server raw (pre-encoded replies from one loop turn: the client's floor)",
}


@contextlib.contextmanager
def bare_longpoll(kind: str, logdir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A floor server of bench/bare_longpoll.py; yields (process, base URL)."""
    port = free_port()
    err = open(logdir / f"floor-{kind}-{port}.log", "w")  # noqa: SIM115 - closed below
    cmd = [
        PY,
        str(Path(__file__).resolve().parent / "bare_longpoll.py"),
        "--port",
        str(port),
        "--server",
        kind,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
    base = f"http://127.0.0.1:{port}/mp/v0"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"floor server {kind} exited with {proc.returncode}")
            try:
                if httpx.get(f"{base}/discover", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"floor server {kind} not ready after 30 s")
            time.sleep(0.05)
        yield proc, base
    finally:
        _stop(proc)
        err.close()


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Strace:
    """fsync + fdatasync calls of a running process (all its threads) while the block runs."""

    def __init__(self, pid: int, workdir: Path) -> None:
        self.pid = pid
        self.out = workdir / f"strace-{pid}-{time.monotonic_ns()}.txt"
        self.err = Path(str(self.out) + ".err")
        self.counts: dict[str, int] = {}

    def __enter__(self) -> Strace:
        cmd = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(self.out), "-p", str(self.pid)]
        with open(self.err, "w") as e:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e)
        deadline = time.monotonic() + 10
        while "attached" not in self.err.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"strace could not attach: {self.err.read_text()[-500:]}")
            time.sleep(0.02)
        time.sleep(0.3)  # every thread attached (one line each)
        return self

    def __exit__(self, *exc: Any) -> None:
        time.sleep(0.1)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for line in self.out.read_text().splitlines() if self.out.exists() else []:
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync") and len(parts) >= 5:
                self.counts[parts[-1]] = int(parts[3])

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def strace_usable() -> str | None:
    """None when strace can attach to a child of ours, else why not."""
    if not shutil.which("strace"):
        return "strace is not installed (apt-get install -y strace)"
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(5)"])
    try:
        with tempfile.TemporaryDirectory() as d, Strace(p.pid, Path(d)):
            pass
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"strace unusable: {exc}"
    finally:
        p.kill()
        p.wait()
    return None


# ------------------------------------------------------------------------------------------------ the fill
def cached_log(engine: Path, info: dict[str, Any], n: int) -> tuple[Path, dict[str, Any]]:
    """A database with monitor `seam` (types TICK and OTHER), SUBS_PER_KIND subscriptions per filter of
    FILTERS acked to the head, then ``n`` TICK observations; cached per engine commit (and diff)."""
    d = CACHE / info["key"]
    db, meta_path = d / f"seam-{n}.db", d / f"seam-{n}.json"
    if db.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        log(f"filtered: the {n:,}-observation log is cached in {db} (filled in {meta['fill_seconds']} s)")
        return db, {**meta, "cached": True}
    d.mkdir(parents=True, exist_ok=True)
    # Keep the cache small: the two most recent other entries stay (a before and an after).
    others = sorted((p for p in CACHE.iterdir() if p.is_dir() and p != d), key=lambda p: p.stat().st_mtime)
    for old in others[:-2]:
        shutil.rmtree(old, ignore_errors=True)
    tmp = d / f"seam-{n}.filling.db"
    for sfx in ("", "-wal", "-shm", ".lock"):
        Path(str(tmp) + sfx).unlink(missing_ok=True)
    log(f"filtered: filling {n:,} observations in-process (group commit, synchronous=OFF for the fill only)")
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.sqlite import SQLiteStore

    t0 = time.perf_counter()
    try:
        store = SQLiteStore(str(tmp), synchronous="OFF")
    except TypeError:  # a store without the knob: fill with its own durability
        store = SQLiteStore(str(tmp))
    try:
        svc = MonitorService(store)
        made = svc.create_monitor({"id": MONITOR, "visibility": "public", "types": [TICK, OTHER]}, None)
        owner = made["owner_token"]
        subs: dict[str, list[dict[str, str]]] = {}
        for kind, flt in FILTERS.items():
            subs[kind] = []
            for i in range(SUBS_PER_KIND):
                r = svc.subscribe(
                    {
                        "monitor": MONITOR,
                        "subscriber": f"agent:seam-{kind}-{i}",
                        "filter": flt,
                        "from": "earliest",
                    },
                    None,
                )
                subs[kind].append({"id": r["subscription"]["id"], "token": r["token"]})
        # Past every `subscribed` row (a text filter would match its own): only the n rows lie ahead.
        for kind in FILTERS:
            for s in subs[kind]:
                svc.ack(s["id"], s["token"], {"cursor": MAX_INT})
        batch = getattr(store, "batch", None)
        todo = n
        while todo > 0:
            with batch() if batch else contextlib.nullcontext():
                for _ in range(min(2000, todo)):
                    svc.publish(MONITOR, dict(OBS), owner)
                    todo -= 1
    finally:
        store.close()
    fill_seconds = round(time.perf_counter() - t0, 1)
    c = sqlite3.connect(str(tmp))
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    for sfx in ("-wal", "-shm"):
        if Path(str(tmp) + sfx).exists():
            os.replace(str(tmp) + sfx, str(db) + sfx)
    os.replace(tmp, db)
    Path(str(tmp) + ".lock").unlink(missing_ok=True)
    meta = {"observations": n, "owner": owner, "subs": subs, "fill_seconds": fill_seconds,
            "db_bytes": db.stat().st_size}  # fmt: skip
    meta_path.write_text(json.dumps(meta))
    log(f"  filled in {fill_seconds} s, {meta['db_bytes']:,} bytes")
    return db, {**meta, "cached": False}


def work_copy(db: Path, workdir: Path) -> Path:
    dst = workdir / "seam-work.db"
    for sfx in ("", "-wal", "-shm", ".lock"):
        Path(str(dst) + sfx).unlink(missing_ok=True)
    shutil.copyfile(db, dst)
    if Path(str(db) + "-wal").exists():
        shutil.copyfile(str(db) + "-wal", str(dst) + "-wal")
    return dst


def reply_facts(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "observations": len(r.get("observations") or []),
        "head": r.get("head"),
        "cursor": r.get("cursor"),
        "next": r.get("next"),
        "lag": r.get("lag"),
        "lag_capped": bool(r.get("lag_capped")),
        "scan_capped": bool(r.get("scan_capped")),
    }


def pull_figure(per_run: list[list[float]], firsts: list[dict[str, Any]], what: str) -> dict[str, Any]:
    pooled = sorted(x for run in per_run for x in run)
    run_medians = [statistics.median(run) for run in per_run if run]
    return {
        "what": what,
        "unit": "ms",
        "runs": len(per_run),
        "pulls_per_run": len(per_run[0]) if per_run else 0,
        "median": round(statistics.median(run_medians), 3) if run_medians else None,
        "run_medians": [round(x, 3) for x in run_medians],
        "p90": round(percentile(pooled, 0.9), 3) if pooled else None,
        "max": round(pooled[-1], 3) if pooled else None,
        "first_pull_median": round(statistics.median(run[0] for run in per_run), 3) if per_run else None,
        "reply": firsts[0] if firsts else None,
        "replies_differ": any(f != firsts[0] for f in firsts[1:]),
    }


# ------------------------------------------------------------------------------------------------ sections
class Seam:
    def __init__(self, *, quick: bool, runs: int | None, duration: float | None, engine: Path,
                 workdir: Path) -> None:  # fmt: skip
        self.quick = quick
        self.runs = runs or (2 if quick else 5)
        self.duration = duration or (0.7 if quick else 2.0)
        self.n = 100_000 if quick else 1_000_000
        self.pulls = 10 if quick else 20
        self.readers = [50, 200] if quick else [200, 1000]
        self.engine = engine
        self.env = use_engine(engine)
        self.info = tree_info(engine)
        self.workdir = workdir
        self.strace = strace_usable()

    def serve(self, db: str | Path) -> contextlib.AbstractContextManager[Server]:
        return serve(str(db), self.env, self.engine, self.workdir)

    def fresh_db(self, name: str) -> str:
        p = self.workdir / f"{name}.db"
        for sfx in ("", "-wal", "-shm", ".lock"):
            Path(str(p) + sfx).unlink(missing_ok=True)
        return str(p)

    # -------------------------------------------------------------------------------------- filtered pull
    def filtered(self) -> dict[str, Any]:
        cached, meta = cached_log(self.engine, self.info, self.n)
        subs = meta["subs"]
        runs = min(self.runs, (SUBS_PER_KIND - 2) // 2)  # distinct fresh subscriptions for every run
        work = work_copy(cached, self.workdir)
        out: dict[str, Any] = {
            "observations": self.n, "fill_seconds": meta["fill_seconds"], "cached": meta["cached"],
            "db_bytes": meta["db_bytes"], "filters": FILTERS, "inproc": {}, "http": {}, "catch_up": {},
        }  # fmt: skip
        from monitor_protocol.core.service import MonitorService
        from monitor_protocol.store.sqlite import SQLiteStore

        store = SQLiteStore(str(work))  # mp serve's durability
        try:
            svc = MonitorService(store)
            for kind in FILTERS:
                load = loadavg()
                per_run, firsts = [], []
                for r in range(runs):
                    s = subs[kind][r]
                    lat = []
                    for j in range(self.pulls):
                        t0 = time.perf_counter()
                        rep = svc.pull(s["id"], s["token"], limit=1)
                        lat.append(ms(time.perf_counter() - t0))
                        if j == 0:
                            firsts.append(reply_facts(rep))
                    per_run.append(lat)
                fig = pull_figure(per_run, firsts, f"filtered pull(limit 1) by {kind}, in-process")
                fig["loadavg"] = load
                out["inproc"][kind] = fig
                log(f"  in-process, by {kind}: p50 {fig['median']} ms, p90 {fig['p90']}, max {fig['max']}; "
                    f"first reply {fig['reply']}")  # fmt: skip
            deadline_s = 3.0 if self.quick else 10.0
            for kind in FILTERS:
                s = subs[kind][runs]
                load = loadavg()
                t0 = time.perf_counter()
                pulls = 0
                start = last = None
                reached = False
                while time.perf_counter() - t0 < deadline_s and pulls < 100_000:
                    rep = svc.pull(s["id"], s["token"], limit=1)
                    pulls += 1
                    start = rep["cursor"] if start is None else start
                    last = rep
                    if rep["next"] > rep["cursor"]:
                        svc.ack(s["id"], s["token"], {"cursor": rep["next"]})
                    if not rep.get("scan_capped") and not rep["observations"] and rep["next"] > rep["head"]:
                        reached = True
                        break
                secs = time.perf_counter() - t0
                assert last is not None
                covered = last["next"] - (start or 1)
                out["catch_up"][kind] = {
                    "what": f"pull(limit 1)+ack(next) until the head, by {kind}, in-process",
                    "reached_head": reached, "pulls": pulls, "seconds": round(secs, 3),
                    "rows_passed": covered, "rows_per_s": round(covered / secs) if secs else None,
                    "deadline_s": deadline_s, "last_reply": reply_facts(last), "loadavg": load,
                }  # fmt: skip
                log(f"  catch-up by {kind}: reached head {reached}, {pulls} pulls in {secs:.2f} s, "
                    f"{covered:,} rows passed")  # fmt: skip
        finally:
            store.close()
        with self.serve(work) as srv, httpx.Client(timeout=60) as c:
            for kind in FILTERS:
                load = loadavg()
                per_run, firsts = [], []
                for r in range(runs):
                    s = subs[kind][runs + 1 + r]
                    h = {"Authorization": f"Bearer {s['token']}"}
                    url = f"{srv.base}/subscriptions/{s['id']}/pull"
                    lat = []
                    for j in range(self.pulls):
                        t0 = time.perf_counter()
                        resp = c.get(url, params={"limit": "1"}, headers=h)
                        lat.append(ms(time.perf_counter() - t0))
                        if resp.status_code != 200:
                            raise RuntimeError(f"pull {resp.status_code}: {resp.text[:300]}")
                        if j == 0:
                            firsts.append(reply_facts(resp.json()))
                    per_run.append(lat)
                fig = pull_figure(per_run, firsts, f"filtered pull(limit 1) by {kind}, HTTP (httpx.Client)")
                fig["loadavg"] = load
                out["http"][kind] = fig
                log(f"  HTTP, by {kind}: p50 {fig['median']} ms, p90 {fig['p90']}, max {fig['max']}; "
                    f"first reply {fig['reply']}")  # fmt: skip
            if self.strace is None:
                out["fsync_per_filtered_pull"] = {}
                for kind in FILTERS:
                    s = subs[kind][2 * runs + 1]
                    h = {"Authorization": f"Bearer {s['token']}"}
                    url = f"{srv.base}/subscriptions/{s['id']}/pull"
                    with Strace(srv.proc.pid, self.workdir) as st:
                        for _ in range(self.pulls):
                            c.get(url, params={"limit": "1"}, headers=h).raise_for_status()
                    out["fsync_per_filtered_pull"][kind] = {
                        "pulls": self.pulls, "fsyncs": st.total, "by_call": st.counts,
                        "per_pull": round(st.total / self.pulls, 3),
                    }  # fmt: skip
                    log(f"  fsyncs per filtered pull by {kind} over HTTP: {st.total / self.pulls:.2f}")
        for sfx in ("", "-wal", "-shm", ".lock"):
            Path(str(work) + sfx).unlink(missing_ok=True)
        return out

    # -------------------------------------------------------------------------------------- parked polls
    def longpoll(self) -> dict[str, Any]:
        raise_nofile()
        most = max(self.readers)
        out: dict[str, Any] = {}
        with self.serve(self.fresh_db("longpoll")) as srv, httpx.Client(timeout=60) as c:
            r = c.post(f"{srv.base}/monitors", json={"id": MONITOR, "visibility": "public", "types": [TICK]})
            r.raise_for_status()
            owner = r.json()["owner_token"]
            log(f"longpoll: {most} subscriptions")
            readers = []
            for i in range(most):
                r = c.post(
                    f"{srv.base}/subscriptions", json={"monitor": MONITOR, "subscriber": f"agent:lp-{i}"}
                )
                r.raise_for_status()
                readers.append([r.json()["subscription"]["id"], r.json()["token"]])
            for sub, tok in readers:  # caught up: every later `subscribed` row is behind each cursor
                c.post(f"{srv.base}/subscriptions/{sub}/ack", json={"cursor": MAX_INT},
                       headers={"Authorization": f"Bearer {tok}"}).raise_for_status()  # fmt: skip
            for n in self.readers:
                spec = {"base": srv.base, "url": srv.url, "server_pid": srv.proc.pid, "owner": owner,
                        "readers": readers[:n], "runs": self.runs}  # fmt: skip
                fig = self._lp_figure(
                    spec,
                    f"{n} parked pull?wait=30 woken by one publish, HTTP (raw asyncio client, 1 process)",
                )
                out[str(n)] = fig
                log(f"  {n} readers: p50 {fig['p50']} ms, p90 {fig['p90']}, p99 {fig['p99']}, max {fig['max']}; "
                    f"carried {fig['carried']} of {n}; server CPU {fig['server_cpu_ms']} ms")  # fmt: skip
        # The floor, same client, same readers, right after: servers that do no protocol work at all.
        for kind, what in FLOORS.items():
            for n in self.readers:
                with bare_longpoll(kind, self.workdir) as (proc, base):
                    spec = {"base": base, "url": base.rsplit("/mp/v0", 1)[0], "server_pid": proc.pid,
                            "owner": "floor", "readers": [[f"sub_{i}", "floor"] for i in range(n)],
                            "runs": self.runs}  # fmt: skip
                    fig = self._lp_figure(spec, f"{n} parked pulls, {what}")
                out[f"floor-{kind}-{n}"] = fig
                log(f"  floor ({kind}) {n} readers: p50 {fig['p50']} ms, p90 {fig['p90']}, p99 {fig['p99']}, "
                    f"max {fig['max']}; server CPU {fig['server_cpu_ms']} ms")  # fmt: skip
        return out

    def _lp_figure(self, spec: dict[str, Any], what: str) -> dict[str, Any]:
        """Run the long-poll client (its own process) on ``spec``; the medians of its per-run percentiles."""
        n = len(spec["readers"])
        spec_path = self.workdir / f"lp-{n}-{time.monotonic_ns()}.json"
        spec_path.write_text(json.dumps(spec))
        load = loadavg()
        p = subprocess.run([PY, str(Path(__file__).resolve()), "--lp-client", str(spec_path)],
                           capture_output=True, text=True, timeout=60 + 45 * self.runs)  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"long-poll client failed ({p.returncode}): {p.stderr[-2000:]}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
        lat = sorted(x for run in res["runs"] for x in run["latencies_ms"])
        per = res["runs"]

        def med(key: str) -> float:
            return round(statistics.median(r[key] for r in per), 3)

        return {
            "what": what, "readers": n, "runs": len(per), "unit": "ms",
            # per-run percentiles, the median over the runs
            "p50": med("p50"), "p90": med("p90"), "p99": med("p99"), "max": med("max"),
            "max_all_runs": round(lat[-1], 3) if lat else None,
            "carried": [r["carried"] for r in per], "answered": [r["answered"] for r in per],
            "publish_reply_ms": med("publish_reply_ms"),
            "server_cpu_ms": med("server_cpu_ms"),
            "park_wait": res["park_wait"], "client_loop": res.get("loop"),
            "run_p50s": [r["p50"] for r in per], "loadavg": load,
        }  # fmt: skip

    # -------------------------------------------------------------------------------------- fsync counts
    def fsync(self) -> dict[str, Any]:
        if self.strace is not None:
            return {"status": "not measured", "error": self.strace}
        out: dict[str, Any] = {}
        n_empty, n_nonempty, n_pub, n_parked, n_wakes = (
            (50, 30, 50, 10, 20) if self.quick else (200, 100, 200, 20, 50)
        )
        with self.serve(self.fresh_db("fsync")) as srv, httpx.Client(timeout=60) as c:
            r = c.post(
                f"{srv.base}/monitors", json={"id": MONITOR, "visibility": "public", "types": [TICK, OTHER]}
            )
            r.raise_for_status()
            owner = {"Authorization": f"Bearer {r.json()['owner_token']}"}

            def sub(name: str, **body: Any) -> tuple[str, dict[str, str]]:
                r = c.post(f"{srv.base}/subscriptions", json={"monitor": MONITOR, "subscriber": name, **body})
                r.raise_for_status()
                return r.json()["subscription"]["id"], {"Authorization": f"Bearer {r.json()['token']}"}

            def pull(s: tuple[str, dict[str, str]], **params: str) -> dict[str, Any]:
                r = c.get(f"{srv.base}/subscriptions/{s[0]}/pull", params={"limit": "1", **params}, headers=s[1],
                          timeout=60)  # fmt: skip
                r.raise_for_status()
                return r.json()

            for _ in range(5):
                c.post(
                    f"{srv.base}/monitors/{MONITOR}/observations", json=OBS, headers=owner
                ).raise_for_status()
            backlog = [sub(f"agent:nonempty-{i}", **{"from": "earliest"}) for i in range(n_nonempty)]
            empty = sub("agent:empty")
            parked = [sub(f"agent:parked-{i}", filter={"types": [OTHER]}) for i in range(n_parked)]
            for s in [empty, *parked]:
                c.post(
                    f"{srv.base}/subscriptions/{s[0]}/ack", json={"cursor": MAX_INT}, headers=s[1]
                ).raise_for_status()
            pid = srv.proc.pid

            def record(
                key: str, what: str, ops: int, st: Strace, minus: float = 0.0, per_what: int | None = None
            ) -> None:
                net = st.total - minus
                out[key] = {"what": what, "ops": ops, "fsyncs": st.total, "by_call": st.counts,
                            "per_op": round(net / ops, 4), "loadavg": loadavg()}  # fmt: skip
                if minus:
                    out[key]["minus_publishes"] = round(minus, 2)
                if per_what:
                    out[key]["per_wake"] = round(net / per_what, 4)
                log(f"  {what}: {out[key]['per_op']} fsyncs each ({st.total} in {ops})")

            with Strace(pid, self.workdir) as st:
                time.sleep(1.0)
            record("idle_1s", "idle server, 1 s", 1, st)
            with Strace(pid, self.workdir) as st:
                for _ in range(n_empty):
                    if pull(empty)["observations"]:
                        raise RuntimeError("the empty pull returned observations")
            record("empty_pull", "empty pull(limit 1), caught-up subscription", n_empty, st)
            with Strace(pid, self.workdir) as st:
                for s in backlog:
                    if not pull(s)["observations"]:
                        raise RuntimeError("the non-empty pull returned nothing")
            record(
                "nonempty_pull",
                "non-empty pull(limit 1), first delivery (a new high-water mark)",
                n_nonempty,
                st,
            )
            with Strace(pid, self.workdir) as st:
                for _ in range(n_pub):
                    c.post(
                        f"{srv.base}/monitors/{MONITOR}/observations", json=OBS, headers=owner
                    ).raise_for_status()
            record("publish", "publish, 1 client, sequential", n_pub, st)
            # Long-poll re-check: parked filtered polls (types: OTHER) re-run on every TICK append.
            c.post(f"{srv.base}/subscriptions/{empty[0]}/ack", json={"cursor": MAX_INT}, headers=empty[1])
            for s in parked:
                c.post(
                    f"{srv.base}/subscriptions/{s[0]}/ack", json={"cursor": MAX_INT}, headers=s[1]
                ).raise_for_status()
            got: list[int] = []

            def park(s: tuple[str, dict[str, str]]) -> None:
                with httpx.Client(timeout=60) as cc:
                    r = cc.get(f"{srv.base}/subscriptions/{s[0]}/pull", params={"limit": "1", "wait": "30"},
                               headers=s[1])  # fmt: skip
                    got.append(len(r.json().get("observations") or []))

            def paced_appends() -> Strace:
                with Strace(pid, self.workdir) as st:
                    for _ in range(n_wakes):
                        c.post(
                            f"{srv.base}/monitors/{MONITOR}/observations", json=OBS, headers=owner
                        ).raise_for_status()
                        time.sleep(0.02)  # every parked poll re-checks before the next append
                    time.sleep(0.2)
                return st

            base = paced_appends()  # the same appends with nobody parked: what they cost on their own
            record("paced_publish", "publish, 1 client, 20 ms apart, nobody parked", n_wakes, base)
            threads = [threading.Thread(target=park, args=(s,), daemon=True) for s in parked]
            for t in threads:
                t.start()
            how = wait_parked(srv.url, n_parked, pid)
            st = paced_appends()
            early = len(got)
            record(
                "recheck", f"long-poll re-check ({n_parked} parked filtered polls x {n_wakes} non-matching appends, "
                "minus the same appends' fsyncs with nobody parked)", n_parked * n_wakes, st, minus=base.total,
                per_what=n_wakes,
            )  # fmt: skip
            out["recheck"]["park_wait"] = how
            out["recheck"]["answered_early"] = early
            c.post(f"{srv.base}/monitors/{MONITOR}/observations", json={**OBS, "type": OTHER}, headers=owner)
            for t in threads:
                t.join(35)
        return out

    # -------------------------------------------------------------------------------------- publish CPU
    def publish(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with self.serve(self.fresh_db("publish")) as srv:
            r = httpx.post(
                f"{srv.base}/monitors", json={"id": "bench", "visibility": "public", "types": [TICK]}
            )
            r.raise_for_status()
            tok = r.json()["owner_token"]
            for key, client, label in (("sync", "sync", "httpx.Client"), ("raw", "raw", "raw asyncio")):
                load = loadavg()
                rates, cpu_us, scpu = [], [], []
                for _ in range(self.runs):
                    x = loadgen(srv, "publish", duration=self.duration, tokens=[tok], client=client)
                    if x["errors"]:
                        raise RuntimeError(f"publish errors: {x['first_error']}")
                    rates.append(x["rate"])
                    scpu.append(x["server_cpu"])
                    cpu_us.append(x["server_cpu"] / x["rate"] * 1e6 if x["rate"] else 0.0)
                fig = summary(rates)
                fig.update(
                    what=f"publish, 1 client ({label}, keep-alive)", unit="ops/s",
                    server_cpu_us_per_request=summary(cpu_us),
                    server_cpu_cores=round(statistics.median(scpu), 3), loadavg=load,
                )  # fmt: skip
                out[key] = fig
                log(f"  {fig['what']}: {fig['median']:.0f}/s (min {fig['min']:.0f}, max {fig['max']:.0f}); "
                    f"server CPU {fig['server_cpu_us_per_request']['median']:.0f} us/request")  # fmt: skip
        return out


def wait_parked(url: str, n: int, pid: int, timeout: float = 30.0) -> str:
    """Until the server's mp_long_polls_parked gauge reads ``n`` (GET /metrics, loopback); a server without
    the gauge: until its CPU has been idle for 300 ms. Returns how it knew."""
    deadline = time.monotonic() + timeout
    gauge = re.compile(r"^mp_long_polls_parked\s+(\d+)", re.M)
    while time.monotonic() < deadline:
        try:
            m = gauge.search(httpx.get(url + "/metrics", timeout=5).text)
        except httpx.HTTPError:
            m = None
        if m is None:
            break
        if int(m.group(1)) >= n:
            return "metrics gauge"
        time.sleep(0.02)
    while time.monotonic() < deadline:
        c0 = cpu_seconds(pid)
        time.sleep(0.3)
        if cpu_seconds(pid) - c0 < 0.005:
            return "server idle 300 ms"
    return "timed out"


def calibrate(workdir: Path) -> dict[str, Any]:
    """How fast this machine is right now (it is shared): the best of 3 runs of 2M Python additions, and
    fsync'd 1-row SQLite commits (WAL, synchronous=FULL, mp serve's durability) in 1 s."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        x = 0
        for i in range(2_000_000):
            x += i
        best = min(best, time.perf_counter() - t0)
    path = workdir / "calibrate.db"
    for sfx in ("", "-wal", "-shm"):
        Path(str(path) + sfx).unlink(missing_ok=True)
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0 and n < 1_000_000:
        db.execute("INSERT INTO t (v) VALUES (?)", ("x" * 600,))
        n += 1
    commits = n / (time.perf_counter() - t0)
    db.close()
    return {"python_2M_additions_ms": round(best * 1000, 1), "sqlite_fsync_commits_per_s": round(commits),
            "loadavg": loadavg()}  # fmt: skip


# ------------------------------------------------------------------------------------------------ lp client
async def _metrics_parked(host: str, port: int) -> int | None:
    r, w = await asyncio.open_connection(host, port)
    try:
        w.write(f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        raw = await r.read()
    finally:
        w.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        return None
    m = re.search(rb"^mp_long_polls_parked\s+(\d+)", body, re.M)
    return int(m.group(1)) if m else None


async def lp_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Each reader holds pull?wait=30 on its own keep-alive connection; once all are parked one publish is
    sent; each reply's arrival is timed from that send (one process, perf_counter)."""
    from loadgen import RawClient

    raise_nofile()
    base, pid = spec["base"], spec["server_pid"]
    readers = spec["readers"]
    conns = [RawClient(base) for _ in readers]
    for i in range(0, len(conns), 100):  # connect in steps, well inside the listen backlog
        await asyncio.gather(*(c.request("GET", "/discover", None) for c in conns[i : i + 100]))
    pub = RawClient(base)
    await pub.request("GET", "/discover", None)
    host, port = pub.host, pub.port
    runs, how = [], "?"

    async def hold(c: RawClient, sub: str, tok: str) -> tuple[float, int, Any]:
        st, body = await c.request("GET", f"/subscriptions/{sub}/pull?limit=1&wait=30", tok)
        return time.perf_counter(), st, body

    for _ in range(spec["runs"]):
        # Caught up first (an ack is clamped to head + 1), so every pull parks: nothing waits for it.
        await asyncio.gather(*(
            c.request("POST", f"/subscriptions/{s}/ack", t, {"cursor": MAX_INT})
            for c, (s, t) in zip(conns, readers, strict=True)
        ))  # fmt: skip
        tasks = [asyncio.create_task(hold(c, s, t)) for c, (s, t) in zip(conns, readers, strict=True)]
        deadline = time.monotonic() + 30
        how = "timed out"
        while time.monotonic() < deadline:
            parked = await _metrics_parked(host, port)
            if parked is None:  # no gauge: wait until the server has been idle for 300 ms
                c0 = cpu_seconds(pid)
                await asyncio.sleep(0.3)
                if cpu_seconds(pid) - c0 < 0.005:
                    how = "server idle 300 ms"
                    break
                continue
            if parked >= len(readers):
                how = "metrics gauge"
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        early = sum(t.done() for t in tasks)
        cpu0 = cpu_seconds(pid)
        t_send = time.perf_counter()
        st, body = await pub.request("POST", f"/monitors/{MONITOR}/observations", spec["owner"], OBS)
        t_pub = time.perf_counter()
        seq = body.get("seq") if st == 201 and isinstance(body, dict) else None
        done = await asyncio.wait_for(asyncio.gather(*tasks), 45)
        cpu1 = cpu_seconds(pid)
        lat, carried, answered = [], 0, 0
        for t_recv, rst, rbody in done:
            ok = rst == 200 and isinstance(rbody, dict)
            answered += ok
            obs = rbody.get("observations") or [] if ok else []
            if any(str(o.get("id")) == str(seq) for o in obs):
                carried += 1
            lat.append((t_recv - t_send) * 1000)
        lat.sort()
        runs.append({
            "latencies_ms": [round(x, 3) for x in lat], "p50": percentile(lat, 0.5), "p90": percentile(lat, 0.9),
            "p99": percentile(lat, 0.99), "max": lat[-1], "carried": carried, "answered": answered,
            "answered_before_publish": early, "publish_status": st, "park_wait": how,
            "publish_reply_ms": (t_pub - t_send) * 1000, "server_cpu_ms": (cpu1 - cpu0) * 1000,
        })  # fmt: skip
    for c in [*conns, pub]:
        await c.close()
    return {"runs": runs, "park_wait": how}


def lp_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    loop_name = "asyncio"
    try:
        import uvloop

        runner = uvloop.run
        loop_name = "uvloop"
    except ImportError:
        runner = asyncio.run
    res = runner(lp_client(spec))
    res["loop"] = loop_name
    print(json.dumps(res))
    return 0


# ------------------------------------------------------------------------------------------------ driver
PARTS = ("filtered", "longpoll", "fsync", "publish")


def run(*, quick: bool = False, runs: int | None = None, duration: float | None = None,
        engine: str | None = None, label: str = "after", parts: tuple[str, ...] = PARTS,
        tmpdir: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Every part of the seam section; a failing part is recorded and the others go on."""
    eng = engine_dir(engine)
    workdir = Path(tempfile.mkdtemp(prefix="mp-seam-", dir=tmpdir))
    t_all = time.perf_counter()
    try:
        seam = Seam(quick=quick, runs=runs, duration=duration, engine=eng, workdir=workdir)
        probe = subprocess.run(
            [PY, "-c", "import monitor_protocol; print(monitor_protocol.__file__)"],
            env=seam.env, cwd=eng.parent, capture_output=True, text=True,
        )  # fmt: skip
        info = machine()
        info.update(commit=seam.info["commit"], engine_dirty=seam.info["dirty"])
        out: dict[str, Any] = {
            "label": label, "machine": info, "engine": {**seam.info, "server_imports": probe.stdout.strip()},
            "quick": quick, "runs": seam.runs, "duration_s": seam.duration, "strace": seam.strace or "usable",
            "loadavg_start": loadavg(),
        }  # fmt: skip
        log(f"engine {eng} (commit {(seam.info['commit'] or '?')[:10]}{', dirty' if seam.info['dirty'] else ''}); "
            f"server imports {out['engine']['server_imports']}; load {out['loadavg_start']}")  # fmt: skip
        out["calibration_start"] = calibrate(workdir)
        log(f"calibration: {out['calibration_start']}")
        for part in parts:
            t0 = time.perf_counter()
            load = loadavg()
            log(f"{part} (load {load})")
            try:
                res = getattr(seam, part)()
            except Exception as exc:  # noqa: BLE001 - one broken part must not lose the others
                log(f"{part} FAILED: {exc!r}")
                res = {"status": "failed", "error": repr(exc)}
            res["seconds"] = round(time.perf_counter() - t0, 1)
            res["loadavg_before"] = load
            res["loadavg_after"] = loadavg()
            out[part] = res
        out["calibration_end"] = calibrate(workdir)
        log(f"calibration: {out['calibration_end']}")
        out["loadavg_end"] = loadavg()
        out["seconds"] = round(time.perf_counter() - t_all, 1)
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ markdown
def _get(d: Any, *path: Any) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _n(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _load(s: Any) -> str:
    return " ".join(str(s).split()[:3]) if s else "-"


def _pull_cell(f: Any) -> str:
    if not isinstance(f, dict):
        return "-"
    return f"{_n(f.get('median'))} / {_n(f.get('p90'))} / {_n(f.get('max'))}"


def _reply_cell(f: Any) -> str:
    r = _get(f, "reply")
    if not isinstance(r, dict):
        return "-"
    flags = [k for k in ("lag_capped", "scan_capped") if r.get(k)]
    return f"lag {_n(r.get('lag'))}, next {_n(r.get('next'))} of head {_n(r.get('head'))}" + (
        f" ({', '.join(flags)})" if flags else ""
    )


def _catch_cell(f: Any) -> str:
    if not isinstance(f, dict):
        return "-"
    if f.get("reached_head"):
        return f"{_n(f['pulls'])} pulls, {_n(f['seconds'])} s"
    return f"not in {_n(f.get('deadline_s'), 0)} s: {_n(f.get('rows_passed'))} rows in {_n(f['pulls'])} pulls"


def _lp_cell(f: Any) -> str:
    if not isinstance(f, dict):
        return "-"
    return f"{_n(f['p50'])} / {_n(f['p90'])} / {_n(f['p99'])} / {_n(f['max'])}"


def _carried_cell(f: Any) -> str:
    if not isinstance(f, dict):
        return "-"
    return f"{min(f['carried'])} of {f['readers']}" + (
        "" if min(f["carried"]) == max(f["carried"]) else f" (to {max(f['carried'])})"
    )


def rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(figure, value) rows of one result file, in a fixed order."""
    out: list[tuple[str, str]] = []
    for key, label in (("python_2M_additions_ms", "machine check: 2M Python additions, ms (start / end)"),
                       ("sqlite_fsync_commits_per_s", "machine check: fsync'd SQLite commits/s (start / end)")):  # fmt: skip
        out.append(
            (label, f"{_n(_get(r, 'calibration_start', key), 1)} / {_n(_get(r, 'calibration_end', key), 1)}")
        )
    out.append(
        ("load average at start / end", f"{_load(r.get('loadavg_start'))} / {_load(r.get('loadavg_end'))}")
    )
    out.append(("filtered: observations in the log, none matching", _n(_get(r, "filtered", "observations"))))
    for where, label in (("inproc", "in-process"), ("http", "HTTP")):
        for kind in FILTERS:
            f = _get(r, "filtered", where, kind)
            out.append((f"filtered pull(limit 1) by {kind}, {label}: p50 / p90 / max ms",
                        _pull_cell(f)))  # fmt: skip
            out.append((f"  its first reply ({label}, by {kind})", _reply_cell(f)))
    for kind in FILTERS:
        out.append((f"filtered reader (by {kind}) pulls+acks to the head, in-process",
                    _catch_cell(_get(r, "filtered", "catch_up", kind))))  # fmt: skip
    lp_keys = (_get(r, "longpoll") or {}).keys()
    for n_readers in sorted((k for k in lp_keys if k.isdigit()), key=int):
        f = _get(r, "longpoll", n_readers)
        out.append((f"{n_readers} parked long polls woken by one publish, from the send: p50 / p90 / p99 / max ms",
                    _lp_cell(f)))  # fmt: skip
        out.append((f"  replies carrying the observation ({n_readers})", _carried_cell(f)))
        out.append((f"  server CPU for the wake ({n_readers}), ms", _n(_get(f, "server_cpu_ms"))))
        for kind in FLOORS:  # the floor of this harness, measured in the same run (bench/bare_longpoll.py)
            floor = _get(r, "longpoll", f"floor-{kind}-{n_readers}")
            if floor:
                out.append((f"  floor, {kind} server, no protocol work ({n_readers}): p50 / p90 / p99 / max ms",
                            _lp_cell(floor)))  # fmt: skip
    for key, label in (("empty_pull", "fsyncs per empty pull"), ("nonempty_pull", "fsyncs per non-empty pull"),
                       ("publish", "fsyncs per publish"), ("recheck", "fsyncs per long-poll re-check"),
                       ("idle_1s", "fsyncs of an idle server per second")):  # fmt: skip
        out.append((label, _n(_get(r, "fsync", key, "per_op"), 3)))
        if key == "recheck":
            out.append(("  fsyncs per append that woke the parked re-checks (all of them together)",
                        _n(_get(r, "fsync", key, "per_wake"), 3)))  # fmt: skip
    for kind in FILTERS:
        out.append((f"fsyncs per filtered pull by {kind} (over non-matching rows, HTTP)",
                    _n(_get(r, "filtered", "fsync_per_filtered_pull", kind, "per_pull"), 3)))  # fmt: skip
    for key, label in (("sync", "httpx.Client"), ("raw", "raw asyncio")):
        f = _get(r, "publish", key)
        out.append((f"publish, 1 client ({label}): publish/s median (min-max)",
                    "-" if not f else f"{_n(f['median'], 0)} ({_n(f['min'], 0)}-{_n(f['max'], 0)})"))  # fmt: skip
        out.append(
            (f"  server CPU per publish ({label}), us", _n(_get(f, "server_cpu_us_per_request", "median"), 0))
        )
    return out


def markdown(results: Path = RESULTS) -> str:
    """Before and after side by side (bench/results/seam-before.json, bench/results/seam.json)."""
    files = [
        (p, json.loads(p.read_text()))
        for p in (results / "seam-before.json", results / "seam.json")
        if p.exists()
    ]
    if not files:
        return ""
    heads = [f"{r.get('label') or p.stem} (`{(_get(r, 'machine', 'commit') or '?')[:10]}`"
             + (", engine modified" if _get(r, "machine", "engine_dirty") else "") + ")" for p, r in files]  # fmt: skip
    out = ["### Seam (issue 10): before and after" if len(files) > 1 else "### Seam (issue 10)", ""]
    for (p, r), h in zip(files, heads, strict=True):
        m = r.get("machine") or {}
        loads = ", ".join(
            f"{k} `{_load(_get(r, k, 'loadavg_before'))}`" for k in PARTS if _get(r, k, "loadavg_before")
        )
        failed = [k for k in PARTS if _get(r, k, "status") in ("failed", "not measured")]
        out.append(
            f"* {h}: `{p.relative_to(results.parent.parent)}`, {m.get('date')}, {m.get('nproc')} x {m.get('cpu_model')}, "
            f"Python {m.get('python')}, SQLite {m.get('sqlite')}; {r.get('seconds')} s"
            + (" (quick)" if r.get("quick") else "") + f"; load average before each part: {loads}"
            + ("; not measured: " + ", ".join(f"{k} ({_get(r, k, 'error')})" for k in failed) if failed else "")
        )  # fmt: skip
    out += ["", "| figure | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(files)]
    per_file = [dict(rows(r)) for _, r in files]
    labels = list(dict.fromkeys(label for _, r in files for label, _ in rows(r)))
    for label in labels:
        out.append(f"| {label} | " + " | ".join(d.get(label, "-") for d in per_file) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Seam benchmarks (issue 10), see docs/bench.md")
    ap.add_argument("--engine", help="engine tree to measure (default: $SEAM_ENGINE, PYTHONPATH, ./engine)")
    ap.add_argument(
        "--before", action="store_true", help="label 'before', write bench/results/seam-before.json"
    )
    ap.add_argument("--label", default=None, help="the column name in the Markdown (default after / before)")
    ap.add_argument("--out", default=None, help="result file (default bench/results/seam.json)")
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: 100k observations, 50/200 readers, 2 runs"
    )
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 5; 2 with --quick)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per publish run (default 2)")
    ap.add_argument("--only", action="append", default=[], help=f"parts: {', '.join(PARTS)}")
    ap.add_argument("--tmpdir", default=None, help="where the working databases go")
    ap.add_argument("--markdown", action="store_true", help="print the seam tables; run nothing")
    ap.add_argument("--lp-client", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.lp_client:
        return lp_main(args.lp_client)
    if args.markdown:
        print(markdown())
        return 0
    parts = tuple(p.strip() for o in args.only for p in o.split(",") if p.strip()) or PARTS
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; choose from {', '.join(PARTS)}")
    label = args.label or ("before" if args.before else "after")
    out = Path(args.out) if args.out else RESULTS / ("seam-before.json" if args.before else "seam.json")
    res = run(quick=args.quick, runs=args.runs, duration=args.duration, engine=args.engine, label=label,
              parts=parts, tmpdir=args.tmpdir)  # fmt: skip
    res["name"] = "seam"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
