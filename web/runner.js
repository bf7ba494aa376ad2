// The code runner: a module Web Worker that runs a reader's Python, and the `mp` CLI, with the real
// monitor_protocol.client installed the way a reader's own Pyodide app would install it: Pyodide from this
// site, micropip from this site's lock file, then exactly
//     import micropip
//     await micropip.install("<site>/pyodide/<the engine wheel>")
// (the wheel's dependencies carry `sys_platform != 'emscripten'`, so micropip fetches nothing else).
//
// A page starts it with its engine namespace in the URL, so the service worker routes this worker's
// `/mp/v0/...` requests to that page's engine (web/sw.js):
//     new Worker(new URL("runner.js?mp-ns=" + MP.ns, siteRoot), { type: "module" })
// In a worker the synchronous `Client` works (a synchronous XMLHttpRequest blocks only this thread, while
// the page's engine answers), and so does `AsyncClient` (fetch).
//
// Messages (JSON-able):
//   in:  {id, kind: "python", code, env?, scope?}  code runs with top-level await allowed; env updates
//        os.environ for that run only; runs naming the same `scope` share their globals (else a fresh one)
//   in:  {id, kind: "cli", argv, env?, stdin?}     monitor_protocol.cli.main(argv) (a leading "mp" is
//        dropped), SystemExit caught: `exit` is the status
//   out: {id, ok, stdout, stderr, exit?, error?}   error: the traceback (python) or why nothing ran
//   out: {type: "stage", stage: "runtime"|"micropip"|"client"|"ready", detail, wheel?, install?}
//   out: {type: "error", stage, error}             start-up failed; every request then answers ok: false
// Requests run one at a time, in the order they came.

const SITE = new URL("./", import.meta.url); // this script sits at the site's root
const INDEX = new URL("pyodide/", SITE).href; // absolute: a worker has no document to resolve against
const post = (msg) => self.postMessage(msg);
const stage = (name, detail, extra = {}) => post({ type: "stage", stage: name, detail, ...extra });
let current = "runtime";

// The Python side of a run: stdout/stderr captured per run, the environment restored after it, the
// traceback trimmed to the reader's own code (no frames of this harness or of Pyodide's evaluator).
const HARNESS = `
import contextlib, io, json, os, sys, traceback
from pyodide.code import eval_code_async

_mp_scopes = {}

def _mp_trace(exc, snippet):
    # A snippet's traceback starts at its own code; the CLI's at its first frame below this harness.
    te = traceback.TracebackException.from_exception(exc)
    frames = list(te.stack)
    if snippet:
        first = next((i for i, f in enumerate(frames) if f.filename == "<snippet>"), len(frames))
    else:
        first = next((i for i, f in enumerate(frames) if f.filename != "<mp-runner>"), len(frames))
    te.stack = traceback.StackSummary.from_list(frames[first:])
    return "".join(te.format())

def _mp_exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1, as CPython does
    return 1

async def _mp_run(request_json):
    msg = json.loads(request_json)
    kind = msg.get("kind")
    out, err = io.StringIO(), io.StringIO()
    reply = {"ok": True}
    saved_env, saved_stdin = dict(os.environ), sys.stdin
    try:
        os.environ.update({str(k): str(v) for k, v in (msg.get("env") or {}).items()})
        sys.stdin = io.StringIO(str(msg.get("stdin") or ""))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if kind == "python":
                scope = msg.get("scope")
                env = _mp_scopes.setdefault(scope, {}) if scope else {}
                env.setdefault("__name__", "__main__")
                await eval_code_async(str(msg.get("code", "")), globals=env, filename="<snippet>")
            elif kind == "cli":
                from monitor_protocol.cli import main
                argv = [str(a) for a in (msg.get("argv") or [])]
                if argv[:1] == ["mp"]:
                    argv = argv[1:]
                try:
                    status = main(argv)
                except SystemExit as done:
                    status = _mp_exit_status(done.code)
                reply["exit"] = int(status or 0)
                reply["ok"] = reply["exit"] == 0
            else:
                raise ValueError(f'kind is "python" or "cli", not {kind!r}')
    except BaseException as exc:
        reply["ok"] = False
        reply["error"] = _mp_trace(exc, kind == "python")
        if isinstance(exc, SystemExit):
            reply["exit"] = _mp_exit_status(exc.code)
    finally:
        sys.stdout.flush()
        sys.stdin = saved_stdin
        os.environ.clear()
        os.environ.update(saved_env)
    reply["stdout"], reply["stderr"] = out.getvalue(), err.getvalue()
    return json.dumps(reply)
`;

async function start() {
  stage("runtime", "Loading Python (Pyodide) from this site…");
  const { loadPyodide } = await import(new URL("pyodide.mjs", INDEX).href);
  const pyodide = await loadPyodide({ indexURL: INDEX, lockFileURL: new URL("pyodide-lock.json", INDEX).href });
  current = "micropip";
  stage("micropip", "Loading micropip from this site's lock file…");
  // loadPackage does not throw on a failed download (BROWSER.md): check what it returns.
  const loaded = await pyodide.loadPackage("micropip", { messageCallback: () => {}, errorCallback: () => {} });
  if (!loaded.some((p) => p.name === "micropip")) throw new Error("micropip could not be loaded from this site");
  current = "client";
  const infoReply = await fetch(new URL("build-info.json", SITE), { cache: "no-store" });
  if (!infoReply.ok) throw new Error(`build-info.json: HTTP ${infoReply.status}`);
  const info = await infoReply.json();
  const wheel = new URL(`pyodide/${info.engine_wheel}`, SITE).href;
  const install = ["import micropip", `await micropip.install(${JSON.stringify(wheel)})`];
  stage("client", `Installing monitor_protocol with micropip from ${wheel}…`, { wheel, install });
  await pyodide.runPythonAsync(install.join("\n"), { filename: "<mp>" });
  await pyodide.runPythonAsync("import monitor_protocol.client, monitor_protocol.cli", { filename: "<mp>" });
  pyodide.runPython(HARNESS, { filename: "<mp-runner>" });
  const run = pyodide.globals.get("_mp_run");
  current = "ready";
  stage("ready", "Python and monitor_protocol.client are ready.", { wheel, install });
  return run;
}

const ready = start();
ready.catch((err) => post({ type: "error", stage: current, error: String((err && err.message) || err) }));

let queue = Promise.resolve();
self.onmessage = (event) => {
  const msg = event.data || {};
  queue = queue.then(() => handle(msg));
};

async function handle(msg) {
  const id = msg.id;
  let run;
  try {
    run = await ready;
  } catch (err) {
    const why = String((err && err.message) || err);
    return post({ id, ok: false, stdout: "", stderr: "", error: `The Python runner could not start (${current}): ${why}` });
  }
  try {
    post({ id, ...JSON.parse(await run(JSON.stringify(msg))) });
  } catch (err) {
    post({ id, ok: false, stdout: "", stderr: "", error: String((err && err.message) || err) });
  }
}
