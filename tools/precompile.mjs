// Build step: precompile the Python the playground imports at start-up with Pyodide's own CPython (3.13, in
// Node), so the page does not compile that source on every load.
//
//   node tools/precompile.mjs PYODIDE_DIR ENGINE_WHEEL WEB_DIR OUT_DIR [--all]
//
// OUT/python_stdlib.zip: PYODIDE_DIR's, plus `x.pyc` beside `x.py` (zipimport looks there, never in
//   __pycache__) for every stdlib module imported at start-up (all of them with --all); the sources stay, so
//   tracebacks keep their lines.
// OUT/<ENGINE_WHEEL's name>: plus `__pycache__/x.cpython-313.pyc` (and RECORD lines) for the same set.
// OUT/__pycache__/<ui module>.cpython-313.pyc for every WEB_DIR/*.py but main.py.
// Every .pyc is PEP 552 unchecked-hash: valid whatever the files' mtimes are once Pyodide writes them.
// Start-up set: Pyodide's bootstrap (sys.modules after loadPyodide) plus everything the UI modules import
// (their `import` statements, found with ast and run here; the UI modules themselves touch the DOM).
import fs from "node:fs";
import path from "node:path";

const [pyodideDir, wheelPath, webDir, outDir, ...flags] = process.argv.slice(2);
const all = flags.includes("--all");
const t0 = performance.now();
const { loadPyodide } = await import(path.resolve(pyodideDir, "pyodide.mjs"));
const py = await loadPyodide({ indexURL: path.resolve(pyodideDir) + "/" });
py.FS.mkdirTree("/in/web");
py.FS.writeFile("/in/stdlib.zip", fs.readFileSync(path.join(pyodideDir, "python_stdlib.zip")));
py.FS.writeFile("/in/engine.whl", fs.readFileSync(wheelPath));
for (const f of fs.readdirSync(webDir).filter((f) => f.endsWith(".py")))
  py.FS.writeFile("/in/web/" + f, fs.readFileSync(path.join(webDir, f)));
py.globals.set("ALL", all);
const report = py.runPython(`
import ast, importlib, importlib.util, importlib._bootstrap_external as be, os, sys, zipfile

TAG = sys.implementation.cache_tag  # cpython-313

def pyc(source: bytes, name: str) -> bytes:
    code = compile(source, name, "exec", dont_inherit=True)
    return bytes(be._code_to_hash_pyc(code, importlib.util.source_hash(source), checked=False))

# 1. what start-up imports: the engine on sys.path as a zip, then every module the UI modules import
sys.path.insert(0, "/in/engine.whl")
local = {f[:-3] for f in os.listdir("/in/web")}
wanted = set()
for f in os.listdir("/in/web"):
    for node in ast.walk(ast.parse(open("/in/web/" + f, "rb").read())):
        if isinstance(node, ast.Import):
            wanted.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted.add(node.module)
            wanted.update(f"{node.module}.{a.name}" for a in node.names)
failed = []
for name in sorted(wanted):
    if name.split(".")[0] in local | {"js", "pyodide_js"}:
        continue
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # "from x import function": not a module
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
files = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
stdlib_hot = {f.split("python313.zip/", 1)[1] for f in files if "python313.zip/" in f}
engine_hot = {f.split("engine.whl/", 1)[1] for f in files if "engine.whl/" in f}
stdlib_hot = {f[:-1] if f.endswith(".pyc") else f for f in stdlib_hot}

# 2. the stdlib zip: x.pyc beside x.py
src = zipfile.ZipFile("/in/stdlib.zip")
out = zipfile.ZipFile("/out-stdlib.zip", "w", zipfile.ZIP_DEFLATED)
n_std = 0
for info in src.infolist():
    data = src.read(info)
    out.writestr(info, data)
    if info.filename.endswith(".py") and (ALL or info.filename in stdlib_hot):
        out.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time), pyc(data, info.filename), zipfile.ZIP_DEFLATED)
        n_std += 1
out.close()

# 3. the engine wheel: __pycache__/x.cpython-313.pyc, listed in RECORD (hash may be omitted for .pyc)
src = zipfile.ZipFile("/in/engine.whl")
out = zipfile.ZipFile("/out-engine.whl", "w", zipfile.ZIP_DEFLATED)
added = []
record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
for info in src.infolist():
    data = src.read(info)
    if info.filename == record_name:
        continue
    out.writestr(info, data)
    if info.filename.endswith(".py") and (ALL or info.filename in engine_hot):
        d, _, f = info.filename.rpartition("/")
        name = f"{d}/__pycache__/{f[:-3]}.{TAG}.pyc"
        out.writestr(zipfile.ZipInfo(name, info.date_time), pyc(data, info.filename), zipfile.ZIP_DEFLATED)
        added.append(name)
record = src.read(record_name).decode().rstrip("\\n").split("\\n") + [f"{n},," for n in added]
out.writestr(src.getinfo(record_name), ("\\n".join(record) + "\\n").encode())
out.close()

# 4. the UI modules
os.makedirs("/out-web", exist_ok=True)
for f in os.listdir("/in/web"):
    if f != "main.py":  # PyScript runs main.py itself (from its text)
        open(f"/out-web/{f[:-3]}.{TAG}.pyc", "wb").write(pyc(open("/in/web/" + f, "rb").read(), f))
f"stdlib .pyc: {n_std}, engine .pyc: {len(added)}, ui .pyc: {len(os.listdir('/out-web'))}, import failures: {failed}"
`);
fs.mkdirSync(path.join(outDir, "__pycache__"), { recursive: true });
fs.writeFileSync(path.join(outDir, "python_stdlib.zip"), py.FS.readFile("/out-stdlib.zip"));
fs.writeFileSync(path.join(outDir, path.basename(wheelPath)), py.FS.readFile("/out-engine.whl"));
for (const f of py.FS.readdir("/out-web"))
  if (f.endsWith(".pyc")) fs.writeFileSync(path.join(outDir, "__pycache__", f), py.FS.readFile("/out-web/" + f));
console.log(report, `(${Math.round(performance.now() - t0)} ms)`);
