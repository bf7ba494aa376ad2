// Plain-JS plumbing that must exist before Python starts: loading stages, the service worker and its
// message listener (answers "not ready" until the Python engine registers), the Web Lock that makes one
// tab the single writer, and a small IndexedDB helper the Python store awaits.
// The engine's namespace: "" for the main playground; a page that needs an engine of its own (a docs page,
// an embed) names one before this script runs (<html data-mp-ns="docs-readme"> or window.MP_NS). The
// IndexedDB database, the Web Lock and the view channel carry it, so two namespaces never mix and two tabs
// of one namespace share one engine.
const NS = String(window.MP_NS || document.documentElement.dataset.mpNs || "");
if (!/^[a-z0-9-]{0,64}$/.test(NS)) throw new Error(`bad engine namespace ${JSON.stringify(NS)}: [a-z0-9-], at most 64`);
const nsName = (base) => (NS ? `${base}--${NS}` : base);
const MP = (window.MP = {
  ns: NS,
  handler: null, // set by Python: async (requestJson) -> responseJson
  isOwner: false,
  t0: performance.now(),
  marks: {},
  errors: [],
  actionsDone: 0, // finished UI actions (tests wait on this instead of sleeping)
  actionsFailed: 0,
});

const STAGES = ["runtime", "engine", "storage", "ready"];
MP.stage = (name, detail) => {
  const boot = document.getElementById("boot");
  if (boot.classList.contains("failed")) {
    if (!MP.softFailure) return; // what failed stays said
    // The watchdog's verdict was a guess (an error, then no progress for a while): progress proves it wrong.
    MP.errors = MP.errors.filter((e) => e !== MP.softFailure);
    MP.softFailure = null;
    MP.bootProblem = null;
    MP.storageRefused = null; // the start went on without it (memory only)
    boot.classList.remove("failed");
    boot.setAttribute("role", "progressbar");
  }
  MP.marks[name] = performance.now() - MP.t0;
  MP.movedAt = performance.now();
  const idx = STAGES.indexOf(name);
  document.querySelectorAll("#boot li").forEach((li) => {
    const i = STAGES.indexOf(li.dataset.stage);
    li.classList.toggle("done", i < idx || name === "ready");
    li.classList.toggle("active", i === idx && name !== "ready");
  });
  const bar = document.querySelector("#boot .bar > span");
  if (bar) bar.style.width = `${Math.round(((idx + 1) / STAGES.length) * 100)}%`;
  const text = document.querySelector("#boot .detail");
  if (text && detail) text.textContent = detail;
  const chip = document.getElementById("status-chip");
  if (chip && name !== "ready") chip.querySelector(".label").textContent = `loading: ${name}`;
  if (name === "ready") {
    document.body.classList.remove("booting");
    document.body.classList.add("ready");
    document.getElementById("boot").setAttribute("hidden", "");
    window.dispatchEvent(new CustomEvent("mp:ready", { detail: MP.marks }));
    // Two seconds later: on a first visit it copies every file the page loaded, which should not compete
    // with the start itself (nor with a reload right after it).
    setTimeout(() => MP.keepLoaded(), 2000);
  }
};
MP.mark = (name) => {
  MP.marks[name] = performance.now() - MP.t0;
};
MP.fatal = (message, ownTab = false, soft = false) => {
  MP.errors.push(message);
  MP.softFailure = soft ? message : null; // soft: the watchdog's, undone if the start goes on after all
  const box = document.querySelector("#boot .detail");
  if (box) {
    box.textContent = "Failed: " + message;
    if (ownTab) {
      // A link, not a script: the page's policy runs no inline script and no event handler attribute.
      const a = document.createElement("a");
      a.href = location.href;
      a.target = "_blank";
      a.rel = "noopener";
      a.textContent = "Open it in a tab of its own";
      box.append(" ", a);
    }
  }
  const boot = document.getElementById("boot");
  boot.classList.add("failed");
  boot.setAttribute("role", "alert");
  const chip = document.getElementById("status-chip");
  if (chip) chip.querySelector(".label").textContent = "failed to start";
};

// ---------------------------------------------------------------- never inside another page
// The playground holds tokens (its own, and a real server's in the Server console): a page that framed it
// could hide it and trick a click on Reset or on a remote action. A meta policy cannot say frame-ancestors,
// so the page refuses to start in a frame; embed.html (made to be framed) and the docs pages do not ask.
MP.framedRefused = document.documentElement.dataset.mpFrame === "refuse" && window.top !== window.self;
if (MP.framedRefused) {
  MP.fatal(
    "the playground runs only in a tab of its own, never inside another page (it holds tokens, and a page " +
      "around it could trick a click). To put a scene in your page, embed embed.html (docs/embedding.md), or:",
    true,
  );
}

// ---------------------------------------------------------------- a start that fails or stalls says so
// Nothing pretends to be ready, and nothing spins forever: an error while starting (the runtime not
// fetched, storage refused) that is not followed by progress within STALL_MS ends the boot card with what
// happened and what to do; a start that is only slow says that it is.
const STALL_MS = 8000;
const SLOW_MS = 25000;
MP.movedAt = performance.now();
MP.bootProblem = null; // the first error seen while starting
MP.storageRefused = null; // why this frame may not keep anything (a cross-site frame, often)
const booting = () => document.body && document.body.classList.contains("booting");
const noteProblem = (what) => {
  if (booting() && !MP.bootProblem) MP.bootProblem = String(what || "an error").slice(0, 300);
};
window.addEventListener("error", (e) => noteProblem(e.message || (e.error && e.error.message)));
window.addEventListener("unhandledrejection", (e) => noteProblem((e.reason && e.reason.message) || e.reason));
(async () => {
  try {
    if (!("indexedDB" in window) || !window.indexedDB) throw new Error("IndexedDB is not available");
    const probe = nsName("monitor-protocol-probe"); // not the engine's database: opening that one here
    const r = indexedDB.open(probe, 1); // would create it without its stores
    await req(r);
    r.result.close();
    indexedDB.deleteDatabase(probe);
  } catch (err) {
    MP.storageRefused = String((err && err.message) || err);
  }
})();
const watchdog = setInterval(() => {
  if (!booting() || (document.getElementById("boot").classList.contains("failed") && !MP.softFailure)) {
    return clearInterval(watchdog); // started, or failed for good
  }
  if (MP.softFailure) return; // said; a later stage takes it back
  const still = performance.now() - MP.movedAt;
  const framed = window.top !== window.self;
  if (MP.storageRefused && framed && still > STALL_MS) {
    MP.fatal(
      "this browser gives this frame no storage (" + MP.storageRefused + "), as it does to a frame from another " +
        "site than the page around it. Serve the playground from the same site as your page (docs/embedding.md), or:",
      true,
      true,
    );
  } else if (MP.bootProblem && still > STALL_MS) {
    MP.fatal(MP.bootProblem + ". Reload to try again; if it fails again, the site's files may be missing or blocked (an offline copy needs the whole site).", framed, true);
  } else if (still > SLOW_MS) {
    const text = document.querySelector("#boot .detail");
    if (text && !text.dataset.slow) {
      text.dataset.slow = "1";
      text.textContent += " (taking longer than usual: the runtime is about 10 MB on the first visit)";
    }
  }
}, 1000);

// ---------------------------------------------------------------- the service worker and its requests
// One forwarded request: the engine answers (Python), then the reply waits until every IndexedDB write
// started so far (this call's included) has committed; only then does it leave. Python starts the write
// and returns, so a call costs one Python crossing and one transaction.
MP.serve = async (reqText) => {
  const text = await MP.handler(reqText);
  await MP.idb.committed();
  const reply = JSON.parse(text); // {status, headers, json}: pretty-printed here (V8's JSON is fast)
  const body = reply.json === null || reply.json === undefined ? "" : JSON.stringify(reply.json, null, 2) + "\n";
  return { status: reply.status, headers: reply.headers, body };
};
function notReady(port, why) {
  port.postMessage({ notReady: true, ns: NS, status: 503, body: JSON.stringify({ code: "UNAVAILABLE", error: why, done: [] }) });
}
if ("serviceWorker" in navigator) {
  navigator.serviceWorker.addEventListener("message", (event) => {
    const msg = event.data || {};
    if (msg.type === "mp-from-copies") {
      // the worker served this page from the copies it kept: the server did not answer (app.py's chip says so)
      MP.fromCopies = true;
      document.dispatchEvent(new Event("mp:from-copies"));
      return;
    }
    if (msg.type !== "mp-request" || !event.ports[0]) return;
    const port = event.ports[0];
    // `ns` null: this page made the request; otherwise only the owner of that namespace answers.
    if (msg.ns !== null && msg.ns !== undefined && msg.ns !== NS) return port.postMessage({ notOwner: true, ns: NS });
    if (!MP.handler) return notReady(port, "The playground engine is still starting; try again in a moment.");
    if (!MP.isOwner) return port.postMessage({ notOwner: true, ns: NS });
    MP.serve(msg.req)
      .then((reply) => port.postMessage(reply))
      .catch((err) =>
        port.postMessage({
          status: 503,
          body: JSON.stringify({ code: "UNAVAILABLE", error: "The playground engine failed: " + err, done: [] }),
        }),
      );
  });
  navigator.serviceWorker.startMessages();
  MP.swReady = (async () => {
    const scope = new URL("./", import.meta.url).pathname; // the site's root (boot.js is there), for pages in folders too
    try {
      await navigator.serviceWorker.register(scope + "sw.js", { scope });
    } catch (err) {
      // Offline (or the server gone), the worker's script cannot be fetched to look for an update: the one
      // that answered this page's files goes on controlling it.
      if (!navigator.serviceWorker.controller) throw err;
      console.warn("service worker not updated (the page goes on with the one it has):", err);
    }
    if (!navigator.serviceWorker.controller) {
      await new Promise((resolve) =>
        navigator.serviceWorker.addEventListener("controllerchange", resolve, { once: true }),
      );
    }
    // Tell the worker (and any worker that replaces it) which engine this page's requests belong to.
    const hello = () => navigator.serviceWorker.controller?.postMessage({ type: "mp-hello", ns: NS });
    hello();
    navigator.serviceWorker.addEventListener("controllerchange", hello);
    return true;
  })().catch((err) => {
    console.warn("service worker unavailable:", err);
    return false;
  });
} else {
  MP.swReady = Promise.resolve(false);
}
// The page is up: the service worker keeps the files it loaded (sw.js keepLoaded), for a reload offline.
MP.keepLoaded = () => {
  const worker = navigator.serviceWorker && navigator.serviceWorker.controller;
  if (!worker) return;
  const here = location.origin + location.pathname;
  const urls = performance.getEntriesByType("resource").map((entry) => entry.name.split("#")[0]);
  worker.postMessage({ type: "mp-keep", urls: [here, ...urls.filter((u) => u.startsWith(location.origin + "/"))] });
};
MP.announceOwner = () => {
  const c = navigator.serviceWorker && navigator.serviceWorker.controller;
  if (c) c.postMessage({ type: "mp-owner", ns: NS });
};

// ---------------------------------------------------------------- one writer: the Web Lock
MP.acquireLock = (wait) =>
  new Promise((resolve) => {
    if (!navigator.locks) return resolve(true); // no Web Locks: behave as the only tab
    navigator.locks
      .request(nsName("monitor-protocol-playground-engine"), wait ? {} : { ifAvailable: true }, (lock) => {
        if (!lock) {
          resolve(false);
          return null;
        }
        MP.isOwner = true;
        resolve(true);
        return new Promise(() => {}); // held until this tab goes away
      })
      .catch(() => resolve(false));
  });

// ---------------------------------------------------------------- one view across tabs
// A follower tab holds no engine: it asks the owner tab for the picture it draws (every monitor, one
// monitor's subscriptions, leases, state and log) over a BroadcastChannel, and the owner tells every tab
// when the engine changed, whichever door changed it. Same origin only, like IndexedDB itself.
const view = "BroadcastChannel" in window ? new BroadcastChannel(nsName("monitor-protocol-playground-view")) : null;
const asked = new Map();
let askSeq = 0;
MP.viewProvider = null; // set by Python in the owner tab: async (requestJson) -> replyJson
MP.onChanged = null; // set by Python: called when another tab says the engine changed
if (view) {
  view.onmessage = (event) => {
    const msg = event.data || {};
    if (msg.type === "ask" && MP.isOwner && MP.viewProvider) {
      Promise.resolve(MP.viewProvider(msg.req))
        .then((reply) => view.postMessage({ type: "answer", id: msg.id, reply: String(reply) }))
        .catch((err) => console.warn("view request failed:", err));
    } else if (msg.type === "answer" && asked.has(msg.id)) {
      asked.get(msg.id)(msg.reply);
      asked.delete(msg.id);
    } else if (msg.type === "changed" && MP.onChanged) {
      MP.onChanged();
    }
  };
}
// Resolves with the owner's JSON reply, or null when no owner answered within `ms`.
MP.askView = (reqJson, ms = 3000) =>
  new Promise((resolve) => {
    if (!view) return resolve(null);
    const id = `${Date.now()}-${++askSeq}`;
    const timer = setTimeout(() => {
      asked.delete(id);
      resolve(null);
    }, ms);
    asked.set(id, (reply) => {
      clearTimeout(timer);
      resolve(reply);
    });
    view.postMessage({ type: "ask", id, req: reqJson });
  });
MP.broadcastChanged = () => {
  if (view) view.postMessage({ type: "changed" });
};

// ---------------------------------------------------------------- IndexedDB helper
const DB_NAME = nsName("monitor-protocol-playground");
const STORES = ["records", "ui"];
let db = null;
let tail = Promise.resolve(true); // every write started so far
function req(r) {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}
function done(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve(true);
    tx.onerror = () => reject(tx.error || new Error("IndexedDB transaction failed"));
    tx.onabort = () => reject(tx.error || new Error("IndexedDB transaction aborted"));
  });
}
// JSON text exactly as Python's json.dumps(x, separators=(",", ":")) writes it (ASCII: everything else as \u escapes).
const asciiJson = (x) =>
  JSON.stringify(x).replace(/[\u007f-\uffff]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
MP.idb = {
  async open() {
    if (!("indexedDB" in window) || !window.indexedDB) throw new Error("IndexedDB is not available");
    const r = indexedDB.open(DB_NAME, 1);
    r.onupgradeneeded = () => {
      for (const s of STORES) if (!r.result.objectStoreNames.contains(s)) r.result.createObjectStore(s);
    };
    db = await req(r);
    db.onversionchange = () => db.close();
    return true;
  },
  // Every record as JSON: [[key, valueJson], ...]
  async loadAll() {
    const tx = db.transaction("records", "readonly");
    const store = tx.objectStore("records");
    const [keys, values] = await Promise.all([req(store.getAllKeys()), req(store.getAll())]);
    return JSON.stringify(keys.map((k, i) => [k, values[i]]));
  },
  // One transaction for a whole batch of changes: [[table, key, value|null], ...] (one string from
  // Python, parsed once); resolves when committed. Keys are the JSON text of [table, key], as Python's
  // record_key writes them; values are stored as JSON text.
  apply(changesJson) {
    const changes = JSON.parse(changesJson);
    const tx = db.transaction("records", "readwrite", { durability: "strict" });
    const store = tx.objectStore("records");
    for (const [table, key, value] of changes) {
      const rkey = asciiJson([table, key]);
      if (value === null) store.delete(rkey);
      else store.put(JSON.stringify(value), rkey);
    }
    const commit = done(tx);
    commit.catch(() => {}); // the failure travels through committed() and the awaiting caller
    tail = Promise.all([tail, commit]); // a failed write fails every later shim reply: storage is broken
    tail.catch(() => {});
    return commit;
  },
  // Resolves when every transaction started so far has committed (rejects if one failed).
  committed() {
    return tail;
  },
  async getUi() {
    const tx = db.transaction("ui", "readonly");
    const v = await req(tx.objectStore("ui").get("session"));
    return v === undefined ? null : v;
  },
  async putUi(json) {
    const tx = db.transaction("ui", "readwrite");
    tx.objectStore("ui").put(json, "session");
    return done(tx);
  },
  async clear() {
    const tx = db.transaction(STORES, "readwrite");
    for (const s of STORES) tx.objectStore(s).clear();
    return done(tx);
  },
  async count() {
    const tx = db.transaction("records", "readonly");
    return req(tx.objectStore("records").count());
  },
};

// ---------------------------------------------------------------- the vault: remembered tokens at rest
// The Server console's remembered tokens are kept encrypted (AES-GCM) under a key this browser made and
// will never export (a non-extractable CryptoKey in an IndexedDB database of its own), so what sits in
// localStorage is no token to whoever reads the profile's files, a backup or a synced copy. A script
// running in this page could still ask the key to decrypt: in one origin only keeping script out does
// that (every remote value escaped, replies checked, a Content-Security-Policy with no inline script);
// docs/security.md says so.
const VAULT_DB = nsName("monitor-protocol-vault");
async function vaultKey(create) {
  const r = indexedDB.open(VAULT_DB, 1);
  r.onupgradeneeded = () => r.result.createObjectStore("keys");
  const vdb = await req(r);
  try {
    const found = await req(vdb.transaction("keys").objectStore("keys").get("remote"));
    if (found || !create) return found || null;
    const key = await crypto.subtle.generateKey({ name: "AES-GCM", length: 256 }, false, ["encrypt", "decrypt"]);
    const tx = vdb.transaction("keys", "readwrite");
    tx.objectStore("keys").put(key, "remote");
    await done(tx);
    return key;
  } finally {
    vdb.close();
  }
}
const b64 = (bytes) => btoa(String.fromCharCode(...bytes));
MP.vault = {
  // text -> "v1:<base64 of iv + ciphertext>"
  async seal(text) {
    const key = await vaultKey(true);
    const iv = crypto.getRandomValues(new Uint8Array(12));
    const ct = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-GCM", iv }, key, new TextEncoder().encode(text)));
    const all = new Uint8Array(iv.length + ct.length);
    all.set(iv);
    all.set(ct, iv.length);
    return "v1:" + b64(all);
  },
  // the text, or null when it cannot be opened (no key any more, another browser's, damaged)
  async open(sealed) {
    try {
      if (!String(sealed).startsWith("v1:")) return null;
      const key = await vaultKey(false);
      if (!key) return null;
      const all = Uint8Array.from(atob(String(sealed).slice(3)), (c) => c.charCodeAt(0));
      const pt = await crypto.subtle.decrypt({ name: "AES-GCM", iv: all.slice(0, 12) }, key, all.slice(12));
      return new TextDecoder().decode(pt);
    } catch (err) {
      return null;
    }
  },
};

MP.stage("runtime", "Loading Python (Pyodide) from this site…");
