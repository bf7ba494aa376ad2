"""Playground benchmark (not a test): paint, cold start, reload and IndexedDB publishes in headless Chromium.

Measures the shell painted (first-contentful-paint), cold start to interactive on a fresh profile, a warm
reload to interactive, where the cold start's time goes (PyScript's progress events, boot.js's MP.marks and the
Resource Timing of the runtime's files), the renderer's CPU time (Chromium's own counters, far less sensitive
to other work than the wall clock), and observations published per second through the in-page engine into
IndexedDB (each publish is one router call plus one committed IndexedDB transaction, exactly what the UI and
the service-worker shim do).

    .venv/bin/python bench/playground_bench.py [--runs 5] [--publishes 300] [--site DIR] [--out FILE]

Targets: shell painted <= 300 ms, cold start <= 3 s on a quiet 2-core machine. "Interactive" is the page's
`mp:ready` event (boot.js sends it with MP.marks when the engine is up and the UI is live); every time is
performance.now() in the page, so it counts from the navigation's start. The machine may be shared: the load
average is recorded before and after the run and before every sample, beside every figure, with the share of
the CPUs other work kept busy (/proc/stat, no benchmark browser running), and the printed table says whether
the machine was quiet (1-minute load average < 0.5 at the run's start). Without --site it builds the site
first (build.py) and serves dist/site; with --site it serves that folder as it is (a variant under study), and
--out keeps its result away from bench/results/playground.json. Medians, min and max are over --runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MP_SERVE_QUIET", "1")
from common import cpu_model  # noqa: E402

import build  # noqa: E402

CHROMIUM = build.CHROMIUM
ARGS = build.CHROMIUM_ARGS
TARGET_SHELL_PAINT_S = 0.3  # first-contentful-paint of the page
TARGET_COLD_S = 3.0  # fresh profile to interactive, on a quiet 2-core machine
QUIET_LOAD_1MIN = 0.5  # the machine counts as quiet when the 1-minute load average is below this at the start
IDLE_BUSY_SHARE = (
    0.1  # ... and, measured directly, when other work keeps less than this share of the CPUs busy
)
READY_TIMEOUT_MS = 90_000

# Installed before any of the page's scripts on every navigation: the times the page itself does not keep.
# PyScript reports its steps as `py:progress` events ("Loading interpreter", "Loaded files", ...).
PROBE = """(() => {
  const B = (window.__mpBench = {progress: [], events: {}});
  const once = (name) => (B.events[name] ??= performance.now());
  addEventListener("py:progress", (e) => B.progress.push([String(e.detail), performance.now()]));
  addEventListener("mp:ready", () => once("mp:ready"));
  for (const name of ["py:ready", "py:done", "py:all-done", "DOMContentLoaded", "load"])
    addEventListener(name, () => once(name), true);
})();"""

READY = "() => !!(window.__mpBench && window.__mpBench.events['mp:ready']) || document.body.classList.contains('ready')"

# Everything the page can say about one load, times in ms from the navigation's start.
COLLECT = """() => {
  const B = window.__mpBench || {progress: [], events: {}};
  const MP = window.MP || {};
  const nav = performance.getEntriesByType("navigation")[0] || {};
  const paint = Object.fromEntries(performance.getEntriesByType("paint").map((e) => [e.name, e.startTime]));
  const resources = performance.getEntriesByType("resource").map((r) => ({
    path: new URL(r.name).pathname, start: r.startTime, response_start: r.responseStart, end: r.responseEnd,
    bytes: r.encodedBodySize, transfer: r.transferSize, initiator: r.initiatorType}));
  const t0 = typeof MP.t0 === "number" ? MP.t0 : null;
  const marks = MP.marks || {};
  const ready = B.events["mp:ready"] ?? (t0 !== null && "ready" in marks ? t0 + marks.ready : null);
  return {ready, paint, events: B.events, progress: B.progress, t0, marks, resources,
          nav: {response_end: nav.responseEnd, dom_interactive: nav.domInteractive,
                dom_content_loaded: nav.domContentLoadedEventEnd, load: nav.loadEventEnd}};
}"""

PUBLISH_LOOP = """async ([n, parallel]) => {
  // exactly the service worker's path: MP.serve answers after the IndexedDB commit
  const call = async (method, path, body, token) => MP.serve(JSON.stringify({
      method, path, query: [], body: body ? JSON.stringify(body) : "",
      headers: Object.assign({"content-type": "application/json"}, token ? {authorization: "Bearer " + token} : {})}));
  const id = "bench-" + Math.random().toString(36).slice(2, 8);
  const made = await call("POST", "/mp/v0/monitors", {id, types: ["com.example.bench"]});
  const token = JSON.parse(made.body).owner_token;
  const before = await MP.idb.count();
  const t0 = performance.now();
  let ok = 0;
  for (let i = 0; i < n; i += parallel) {
    const batch = [];
    for (let j = 0; j < parallel && i + j < n; j++)
      batch.push(call("POST", `/mp/v0/monitors/${id}/observations`,
                      {type: "com.example.bench", subject: "s" + (i + j), actor: "probe:bench"}, token));
    for (const r of await Promise.all(batch)) if (r.status === 201) ok++;
  }
  const seconds = (performance.now() - t0) / 1000;
  const after = await MP.idb.count();
  return {ok, seconds, stored: after - before};
}"""

# Where a cold start's time goes: (name, what, start point, end point); a point is ("progress", detail),
# ("mark", MP.marks key), ("event", name), ("paint", name), ("nav", key), ("res", path suffix, "start"|"end").
PHASES = [
    ("html", "navigation start -> index.html received", ("zero",), ("nav", "response_end")),
    ("shell_paint", "navigation start -> first contentful paint", ("zero",), ("paint", "first-contentful-paint")),
    ("to_pyscript", "navigation start -> PyScript starts Pyodide (core.js fetched, parsed, config read)",
     ("zero",), ("progress", "Loading Pyodide")),
    ("pyscript_prelude", "PyScript's own steps before loadPyodide (packages graph, storage)",
     ("progress", "Loading Pyodide"), ("progress", "Loading interpreter")),
    ("interpreter", "loadPyodide with the engine package: fetch + compile the runtime, stdlib, engine wheel",
     ("progress", "Loading interpreter"), ("progress", "Loaded interpreter")),
    ("files", "PyScript fetches config 'files' (app.py, curl.py, story.py)",
     ("progress", "Loading files"), ("progress", "Loaded files")),
    ("to_main", "PyScript done -> main.py runs (MP.marks.engine)", ("progress", "Loaded Pyodide"), ("mark", "engine")),
    ("imports", "main.py imports app (UI modules + engine)", ("mark", "engine"), ("mark", "imports")),
    ("app_main", "app.main(): service worker, IndexedDB, lock, first render", ("mark", "imports"), ("mark", "ready")),
    ("wasm_fetch", "pyodide.asm.wasm request", ("res", "/pyodide.asm.wasm", "start"), ("res", "/pyodide.asm.wasm", "end")),
    ("stdlib_fetch", "python_stdlib.zip request", ("res", "/python_stdlib.zip", "start"), ("res", "/python_stdlib.zip", "end")),
    ("asmjs_fetch", "pyodide.asm.js request", ("res", "/pyodide.asm.js", "start"), ("res", "/pyodide.asm.js", "end")),
    ("engine_wheel_fetch", "engine wheel request", ("res", "ENGINE_WHEEL", "start"), ("res", "ENGINE_WHEEL", "end")),
    ("after_wheel", "engine wheel received -> interpreter loaded (unpack, import checks)",
     ("res", "ENGINE_WHEEL", "end"), ("progress", "Loaded interpreter")),
    ("total", "navigation start -> interactive (mp:ready)", ("zero",), ("ready",)),
]  # fmt: skip


def point(load: dict, p: tuple, engine_wheel: str) -> float | None:
    kind = p[0]
    if kind == "zero":
        return 0.0
    if kind == "ready":
        return load.get("ready")
    if kind == "progress":
        return next((t for d, t in load.get("progress", []) if d == p[1]), None)
    if kind == "mark":
        t0, v = load.get("t0"), (load.get("marks") or {}).get(p[1])
        return None if t0 is None or v is None else t0 + v
    if kind == "event":
        return (load.get("events") or {}).get(p[1])
    if kind == "paint":
        return (load.get("paint") or {}).get(p[1])
    if kind == "nav":
        return (load.get("nav") or {}).get(p[1])
    if kind == "res":
        suffix = "/" + engine_wheel if p[1] == "ENGINE_WHEEL" else p[1]
        hit = [r for r in load.get("resources", []) if r["path"].endswith(suffix)]
        return hit[0][p[2]] if hit else None
    raise ValueError(p)


def phases(load: dict, engine_wheel: str) -> dict[str, float]:
    out = {}
    for name, _what, a, b in PHASES:
        ta, tb = point(load, a, engine_wheel), point(load, b, engine_wheel)
        if ta is not None and tb is not None:
            out[name] = round(tb - ta, 1)
    return out


KEY_REQUESTS = (
    ".wasm",
    ".zip",
    ".whl",
    "pyodide.mjs",
    "pyodide.asm.js",
    "pyodide-lock.json",
    "boot.js",
    "main.py",
)


def timeline(load: dict) -> dict:
    """One load's events and requests, compact (ms from the navigation's start), for the result file."""
    r1 = lambda x: None if x is None else round(x, 1)  # noqa: E731
    return {
        "ready": r1(load.get("ready")),
        "paint": {k: r1(v) for k, v in (load.get("paint") or {}).items()},
        "events": {k: r1(v) for k, v in (load.get("events") or {}).items()},
        "progress": [[d, r1(t)] for d, t in load.get("progress", [])],
        "marks_from_boot_js": {k: r1(v) for k, v in (load.get("marks") or {}).items()},
        "boot_js_t0": r1(load.get("t0")),
        "requests": [  # the ones on the critical path: the runtime, the packages, the entry points
            [r["path"], r1(r["start"]), r1(r["end"]), r["bytes"]]
            for r in load.get("resources", [])
            if r["path"].endswith(KEY_REQUESTS) or "/core-" in r["path"]
        ],
    }


def serve(directory: Path):
    server = build.make_server(0, directory)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def launch(p, profile):
    for attempt in range(2):  # BROWSER.md: a rare "Target crashed" at launch; retry the launch once
        try:
            return p.chromium.launch_persistent_context(
                str(profile),
                executable_path=CHROMIUM,
                args=ARGS,
                headless=True,
                viewport={"width": 1280, "height": 800},
            )
        except Exception:
            if attempt:
                raise
    raise RuntimeError("unreachable")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_busy(seconds: float = 1.0) -> dict | None:
    """How busy the machine's CPUs are right now, from /proc/stat over `seconds` (taken while this benchmark's
    browser is not running, so it is other work): busy share of all cores, and the hypervisor's steal share."""

    def snap():
        f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        return [int(x) for x in f]

    try:
        a = snap()
        time.sleep(seconds)
        b = snap()
    except (OSError, ValueError, IndexError):
        return None
    d = [y - x for x, y in zip(a, b, strict=True)]
    total = sum(d) or 1
    idle = d[3] + (d[4] if len(d) > 4 else 0)  # idle + iowait
    steal = d[7] if len(d) > 7 else 0
    return {"busy_share": round((total - idle - steal) / total, 3), "steal_share": round(steal / total, 3)}


def machine_facts() -> dict:
    model = cpu_model()
    mem = None
    try:
        kb = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
        mem = round(int(kb.split()[1]) / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "cpu_model": model,
        "memory_gib": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "chromium": CHROMIUM,
    }


def summary(xs: list[float], digits: int = 3) -> dict:
    return {
        "median": round(statistics.median(xs), digits),
        "min": round(min(xs), digits),
        "max": round(max(xs), digits),
    }


CPU_METRICS = ("ThreadTime", "ProcessTime", "TaskDuration", "ScriptDuration")


def cpu_metrics(cdp) -> dict[str, float]:
    """Chromium's own counters for the page's renderer (CDP Performance.getMetrics), in seconds: ThreadTime is
    the main thread's CPU time, ProcessTime the whole renderer's (with V8's background compile threads). CPU
    time is far less sensitive to other work on the machine than the wall clock is."""
    if cdp is None:
        return {}
    try:
        got = cdp.send("Performance.getMetrics")["metrics"]
    except Exception:
        return {}
    return {m["name"]: m["value"] for m in got if m["name"] in CPU_METRICS}


def measure_load(page, cdp, go, *args) -> tuple[dict, float]:
    before = cpu_metrics(cdp)
    t0 = time.perf_counter()
    go(*args)
    page.wait_for_function(READY, timeout=READY_TIMEOUT_MS, polling=50)
    wall = time.perf_counter() - t0
    after = cpu_metrics(cdp)
    load = page.evaluate(COLLECT)
    # ThreadTime starts again with each document; ProcessTime runs on with the renderer (kept by a reload).
    load["cpu_s"] = {
        "main_thread": round(after["ThreadTime"], 3) if "ThreadTime" in after else None,
        "renderer": round(after["ProcessTime"] - before.get("ProcessTime", 0.0), 3)
        if "ProcessTime" in after
        else None,
    }
    return load, wall


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--publishes", type=int, default=300, help="0: skip the IndexedDB publish loop")
    ap.add_argument("--site", type=Path, help="serve this folder as it is (no build)")
    ap.add_argument("--out", type=Path, help="result file (default bench/results/playground.json)")
    ap.add_argument("--label", default="", help="a name for this variant, kept in the result")
    args = ap.parse_args()
    site = args.site.resolve() if args.site else build.build()
    info_file = site / "build-info.json"
    site_info = json.loads(info_file.read_text()) if info_file.exists() else {}
    engine_wheel = site_info.get("engine_wheel", "monitor_protocol-")
    server, url = serve(site)
    samples: list[dict] = []
    rates: list[dict] = []
    foreign: list[str] = []
    load_before = loadavg()
    busy_before = cpu_busy(1.0)
    t_run = time.perf_counter()
    with sync_playwright() as p:
        for run in range(args.runs):
            sample = {"run": run, "loadavg_before": loadavg(), "cpu_before": cpu_busy(0.5)}
            profile = Path(tempfile.mkdtemp(prefix="mp-bench-"))
            ctx = launch(p, profile)
            try:
                ctx.add_init_script(PROBE)
                page = ctx.new_page()
                page.on("request", lambda r: None if r.url.startswith(url) else foreign.append(r.url))
                try:
                    cdp = ctx.new_cdp_session(page)
                    cdp.send("Performance.enable")
                except Exception:
                    cdp = None
                cold, cold_wall = measure_load(page, cdp, page.goto, url + "/")
                warm, warm_wall = measure_load(page, cdp, page.reload)
                sample.update(
                    cold_ready_ms=cold["ready"], cold_wall_s=round(cold_wall, 3),
                    shell_paint_ms=cold["paint"].get("first-contentful-paint"),
                    warm_ready_ms=warm["ready"], warm_wall_s=round(warm_wall, 3),
                    warm_shell_paint_ms=warm["paint"].get("first-contentful-paint"),
                    cold_phases_ms=phases(cold, engine_wheel), warm_phases_ms=phases(warm, engine_wheel),
                    cold_cpu_main_s=cold["cpu_s"]["main_thread"], cold_cpu_renderer_s=cold["cpu_s"]["renderer"],
                    warm_cpu_main_s=warm["cpu_s"]["main_thread"], warm_cpu_renderer_s=warm["cpu_s"]["renderer"],
                    marks=cold["marks"], cold_timeline=timeline(cold),
                )  # fmt: skip
                for parallel in (1, 10) if args.publishes > 0 else ():
                    r = page.evaluate(PUBLISH_LOOP, [args.publishes, parallel])
                    rates.append(
                        {"run": run, "parallel": parallel, **r, "per_second": r["ok"] / r["seconds"]}
                    )
                sample["loadavg_after"] = loadavg()
                samples.append(sample)
                print(
                    f"run {run + 1}/{args.runs}: paint {sample['shell_paint_ms'] or float('nan'):.0f} ms, cold "
                    f"{(cold['ready'] or float('nan')) / 1000:.2f} s, reload {(warm['ready'] or float('nan')) / 1000:.2f} s, "
                    f"load before {sample['loadavg_before'][0]:.2f}",
                    flush=True,
                )
            finally:
                ctx.close()
                shutil.rmtree(profile, ignore_errors=True)
    server.shutdown()
    load_after = loadavg()
    quiet = load_before[0] < QUIET_LOAD_1MIN
    busy_shares = [b["busy_share"] for b in [busy_before] + [s["cpu_before"] for s in samples] if b]
    cpu_idle = bool(busy_shares) and max(busy_shares) < IDLE_BUSY_SHARE

    def figure(key: str, scale: float, digits: int = 3) -> dict:
        values = [s[key] * scale for s in samples if s.get(key) is not None]
        if not values:
            return {"median": None, "min": None, "max": None, "samples": []}
        return {
            **summary(values, digits),
            "samples": [round(v, digits) for v in values],
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "loadavg_1min_per_sample": [s["loadavg_before"][0] for s in samples if s.get(key) is not None],
            "cpu_busy_per_sample": [
                (s["cpu_before"] or {}).get("busy_share") for s in samples if s.get(key) is not None
            ],
        }

    def phase_medians(key: str) -> dict:
        names = [n for n, *_ in PHASES]
        out = {}
        for n in names:
            xs = [s[key][n] for s in samples if n in s[key]]
            if xs:
                out[n] = summary(xs, 1)
        return out

    by_par: dict[int, list[float]] = {}
    for r in rates:
        by_par.setdefault(r["parallel"], []).append(r["per_second"])
    cold_fig = figure("cold_ready_ms", 1 / 1000)
    paint_fig = figure("shell_paint_ms", 1 / 1000)
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "label": args.label,
        "site_dir": str(site),
        "machine": {**machine_facts(), "load_average_at_end": load_after},
        "conditions": {
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "cpu_busy_before": busy_before,
            "quiet": quiet,
            "quiet_rule": f"1-minute load average < {QUIET_LOAD_1MIN} at the run's start",
            "cpu_idle": cpu_idle,
            "cpu_idle_rule": f"other work kept < {IDLE_BUSY_SHARE:.0%} of the CPUs busy before the run and before "
            "every sample (/proc/stat, no benchmark browser running)",
            "note": "loadavg_after includes this benchmark's own Chromium (a page load keeps both cores busy, so "
            "back-to-back runs raise the load average by themselves); cpu_busy_before is /proc/stat over 1 s before "
            "the run, with no benchmark browser running: other work on the machine",
            "seconds": round(time.perf_counter() - t_run, 1),
        },
        "site": site_info,
        "runs": args.runs,
        "shell_paint_s": paint_fig,
        "shell_paint_target_s": TARGET_SHELL_PAINT_S,
        "shell_paint_within_target": paint_fig["median"] is not None
        and paint_fig["median"] <= TARGET_SHELL_PAINT_S,
        "cold_start_to_interactive_s": cold_fig,
        "cold_start_target_s": TARGET_COLD_S,
        "cold_start_within_target": cold_fig["median"] is not None and cold_fig["median"] <= TARGET_COLD_S,
        "cold_start_wall_clock_s": figure("cold_wall_s", 1),
        "cold_start_cpu_main_thread_s": figure("cold_cpu_main_s", 1),
        "cold_start_cpu_renderer_s": figure("cold_cpu_renderer_s", 1),
        "reload_to_interactive_s": figure("warm_ready_ms", 1 / 1000),
        "reload_cpu_main_thread_s": figure("warm_cpu_main_s", 1),
        "reload_cpu_renderer_s": figure("warm_cpu_renderer_s", 1),
        "reload_shell_paint_s": figure("warm_shell_paint_ms", 1 / 1000),
        "cold_phases_ms": phase_medians("cold_phases_ms"),
        "warm_phases_ms": phase_medians("warm_phases_ms"),
        "phase_definitions": {n: w for n, w, *_ in PHASES},
        "stage_marks_ms_median": {
            k: round(statistics.median(s["marks"][k] for s in samples if k in s["marks"]))
            for k in ("runtime", "engine", "imports", "storage", "ready")
            if any(k in s["marks"] for s in samples)
        },
        "publish_into_indexeddb_per_s": {
            str(k): {
                **summary(v),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
                "loadavg_1min_per_sample": [s["loadavg_before"][0] for s in samples],
            }
            for k, v in by_par.items()
        },
        "publish_samples": rates,
        "samples": samples,
        "requests_to_other_hosts": foreign,
    }
    out = args.out or ROOT / "bench" / "results" / "playground.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_report(result, out)


def print_report(result: dict, out: Path) -> None:
    m, c = result["machine"], result["conditions"]
    print(
        f"\nmachine: {m['cores']} cores ({m['cores_usable']} usable) x {m['cpu_model']}, {m['memory_gib']} GiB"
    )
    print(f"{'conditions':<14} {'1 min':>7} {'5 min':>7} {'15 min':>7}")
    for name, la in (("load before", c["loadavg_before"]), ("load after", c["loadavg_after"])):
        print(f"{name:<14} {la[0]:>7.2f} {la[1]:>7.2f} {la[2]:>7.2f}")
    if c.get("cpu_busy_before"):
        b = c["cpu_busy_before"]
        print(
            f"CPU busy before the run (other work, 1 s): {b['busy_share']:.0%} of all cores, steal {b['steal_share']:.0%}"
        )
    print(f"quiet machine ({c['quiet_rule']}): {'yes' if c['quiet'] else 'NO: figures are pessimistic'}")
    if "cpu_idle" in c:
        print(f"CPUs idle ({c['cpu_idle_rule']}): {'yes' if c['cpu_idle'] else 'NO: other work was running'}")

    def verdict(value, target):
        return "" if target is None or value is None else ("met" if value <= target else "MISSED")

    rows = [
        ("shell painted, FCP (s)", result["shell_paint_s"], TARGET_SHELL_PAINT_S),
        ("cold start to interactive (s)", result["cold_start_to_interactive_s"], TARGET_COLD_S),
        ("  CPU to interactive, main thread (s)", result["cold_start_cpu_main_thread_s"], None),
        ("  CPU to interactive, whole renderer (s)", result["cold_start_cpu_renderer_s"], None),
        ("reload to interactive (s)", result["reload_to_interactive_s"], None),
        ("  CPU, whole renderer (s)", result["reload_cpu_renderer_s"], None),
    ]
    rows += [
        (f"publish/s into IndexedDB, {k} in flight", v, None)
        for k, v in result["publish_into_indexeddb_per_s"].items()
    ]
    print(f"\n{'measure':<42} {'median':>9} {'min':>9} {'max':>9} {'target':>8} {'verdict':>8}")
    for name, s, target in rows:
        if s.get("median") is None:
            print(f"{name:<42} {'-':>9}")
            continue
        tgt = f"<= {target:g}" if target is not None else ""
        print(
            f"{name:<42} {s['median']:>9.2f} {s['min']:>9.2f} {s['max']:>9.2f} {tgt:>8} {verdict(s['median'], target):>8}"
        )
    print(f"\n{'cold start, where the time goes (ms)':<42} {'median':>9} {'min':>9} {'max':>9}")
    for name, s in result["cold_phases_ms"].items():
        print(f"{name:<42} {s['median']:>9.0f} {s['min']:>9.0f} {s['max']:>9.0f}")
    print(f"stage marks (ms from boot.js, median): {result['stage_marks_ms_median']}")
    print("\ncold samples: run, 1-min load before, CPU busy before (other work), paint, cold, reload")
    for s in result["samples"]:
        busy = (s.get("cpu_before") or {}).get("busy_share")
        print(
            f"  {s['run'] + 1:>3} {s['loadavg_before'][0]:>6.2f} {'-' if busy is None else f'{busy:.0%}':>5}"
            f" {(s['shell_paint_ms'] or 0) / 1000:>6.2f} s {(s['cold_ready_ms'] or 0) / 1000:>6.2f} s"
            f" {(s['warm_ready_ms'] or 0) / 1000:>6.2f} s"
        )
    print(f"requests to other hosts: {len(result['requests_to_other_hosts'])}")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
