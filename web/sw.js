// Service-worker shim: every /mp/v0/* fetch of this origin is answered by the tab that owns the engine of
// the requesting page's namespace (web/boot.js: "" for the playground, "docs-readme", "embed-..."), over a
// per-request MessageChannel. A window is asked first (it answers if it owns its namespace, else says
// which namespace it is in); a dedicated worker's namespace is the `mp-ns` parameter of its script URL.
// No engine tab: 503 with a JSON error saying what to do.
//
// Only the playground's own pages reach the engine, as `mp serve` answers only the origins it was told to
// allow: a request that carries another origin (a form or a frame of another site, a sandboxed frame's
// "null") and any navigation that is not a plain GET (a form post: no page of the playground posts one) is
// refused with 403 ORIGIN_REFUSED, before anything reaches an engine. A cross-origin fetch() never comes
// here at all (it goes to the network: the requesting page's own service worker, not this one, sees it).
const SCOPE_PATH = new URL(self.registration.scope).pathname; // e.g. "/"
const API = SCOPE_PATH + "mp/v0";
const owners = new Map(); // namespace -> the tab that said it owns its engine (a hint: any tab may answer "not owner")
// client id -> the namespace its page said at start (boot.js "mp-hello"): a page busy past the timeout is
// still known, so its request never falls to another namespace's engine. A page that never said hello has
// no engine of its own (a JSON view, a host page): its requests are the playground's.
const clientNs = new Map();

// The site's files as this build made them (build.py puts the build's digest here: a new build is a new worker
// and a new cache, and the old one is dropped), so that a page reloads with the server gone (see page()).
const BUILD = "__SITE_BUILD__";
const SITE_CACHE = `mp-site-${BUILD}`;
// Pages (and the workers they start) that came from the kept copies because the server could not be reached:
// their files come from the copies too. Pages the server answered (and the pages open when this worker took
// over, which the server answered too): their files go to the network untouched, so a normal load pays
// nothing for this. A page in neither (this worker was stopped and started again since it loaded): the
// network first, the copy when the network fails.
const fromCopies = new Set();
const fromServer = new Set();

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) =>
  event.waitUntil(
    caches
      .keys()
      .then((names) => Promise.all(names.filter((n) => n.startsWith("mp-site-") && n !== SITE_CACHE).map((n) => caches.delete(n))))
      .then(() => self.clients.claim())
      .then(() => self.clients.matchAll({ includeUncontrolled: true }))
      .then((open) => open.forEach((client) => fromServer.add(client.id))),
  ),
);

self.addEventListener("message", (event) => {
  const msg = event.data || {};
  const ns = String(msg.ns || "");
  if (msg.type === "mp-hello" && event.source) {
    clientNs.set(event.source.id, ns);
    // a page served from the kept copies is told so (its chip says it: the server did not answer)
    if (fromCopies.has(event.source.id)) event.source.postMessage({ type: "mp-from-copies" });
  }
  if (msg.type === "mp-owner" && event.source) owners.set(ns, event.source.id);
  if (msg.type === "mp-owner-gone" && event.source && owners.get(ns) === event.source.id) owners.delete(ns);
  if (msg.type === "mp-keep" && Array.isArray(msg.urls)) event.waitUntil(keepLoaded(msg.urls.map(String)));
});

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (url.origin !== self.location.origin) return;
  if (url.pathname !== API && !url.pathname.startsWith(API + "/")) {
    const request = event.request;
    if (request.method !== "GET" || request.headers.has("range")) return;
    if (request.mode === "navigate") {
      event.respondWith(page(event, url));
    } else if (fromCopies.has(event.clientId)) {
      if (event.resultingClientId) fromCopies.add(event.resultingClientId); // a worker the page starts
      event.respondWith(keptFirst(request));
    } else if (fromServer.has(event.clientId)) {
      if (event.resultingClientId) fromServer.add(event.resultingClientId);
    } else {
      event.respondWith(networkFirst(request));
    }
    return;
  }
  const refused = foreign(event.request);
  event.respondWith(refused ? json(403, refused) : forward(event.request, url, event.clientId));
});

// A page of the site: from the server, and then its files too (untouched); when the server cannot be reached
// (offline, or stopped), the copy kept of it, and its files from the copies (keptFirst). A page is kept under
// its path alone (a share link's query or fragment does not make another copy); a folder's path and its
// index.html are one page (the docs menu links ../index.html, the playground is visited at /).
async function page(event, url) {
  try {
    const answer = await fetch(event.request);
    if (event.resultingClientId) fromServer.add(event.resultingClientId);
    return answer;
  } catch (err) {
    let kept = null;
    for (const path of samePage(url.pathname)) {
      kept = await caches.match(url.origin + path, { cacheName: SITE_CACHE });
      if (kept) break;
    }
    if (!kept) throw err;
    if (event.resultingClientId) fromCopies.add(event.resultingClientId);
    return kept;
  }
}

function samePage(path) {
  if (path.endsWith("/")) return [path, path + "index.html"];
  if (path.endsWith("/index.html")) return [path, path.slice(0, -"index.html".length)];
  return [path];
}

async function keptFirst(request) {
  const kept = await caches.match(request, { cacheName: SITE_CACHE });
  return kept || fetch(request); // not kept: the network, which may be back
}

async function networkFirst(request) {
  try {
    return await fetch(request);
  } catch (err) {
    const kept = await caches.match(request, { cacheName: SITE_CACHE });
    if (kept) return kept;
    throw err;
  }
}

// A page that came up says which files it loaded; each not kept yet for this build is fetched again, which
// the browser's own cache answers, and kept. Only while the server serves this worker's build: right after a
// rebuild, the files it serves are the next build's, which the next worker keeps under its own name.
async function keepLoaded(urls) {
  try {
    const info = await (await fetch(SCOPE_PATH + "build-info.json", { cache: "no-store" })).json();
    if (info.site_build !== BUILD) return;
  } catch (err) {
    return; // the network is gone: what is kept stays kept
  }
  const cache = await caches.open(SITE_CACHE);
  for (const href of urls) {
    const url = new URL(href, self.location.href);
    if (url.origin !== self.location.origin || !url.pathname.startsWith(SCOPE_PATH)) continue;
    if (url.pathname.endsWith("/mp/v0") || url.pathname.includes("/mp/v0/")) continue; // an engine's answer
    const key = url.origin + url.pathname + url.search;
    if (await cache.match(key)) continue;
    try {
      const response = await fetch(key);
      if (response.status === 200 && response.type === "basic" && !response.redirected) {
        await cache.put(key, response);
      }
    } catch (err) {
      return;
    }
  }
}

// Why a request is not the playground's own (the error body of a 403 ORIGIN_REFUSED), or null.
function foreign(request) {
  const origin = request.headers.get("origin");
  if (origin !== null && origin !== self.location.origin) {
    return {
      code: "ORIGIN_REFUSED",
      error:
        `Origin ${origin} may not call this page's engine: it answers the playground's own pages ` +
        `(${self.location.origin}) only. Use the playground's curl tab, or run \`mp serve\` for other sites.`,
      origin,
    };
  }
  if (request.mode === "navigate" && !["GET", "HEAD"].includes(request.method)) {
    return {
      code: "ORIGIN_REFUSED",
      error:
        `A ${request.method} navigation (a form) may not call this page's engine: the playground's pages ` +
        "send requests with fetch, never a form. Use the playground's curl tab.",
    };
  }
  return null;
}

function json(status, body) {
  return new Response(JSON.stringify(body, null, 2) + "\n", {
    status,
    headers: { "Content-Type": "application/json", "Cache-Control": "no-store" },
  });
}

function ask(client, message, timeoutMs) {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    const timer = setTimeout(() => resolve({ noAnswer: true }), timeoutMs);
    channel.port1.onmessage = (event) => {
      clearTimeout(timer);
      resolve(event.data || { noAnswer: true });
    };
    client.postMessage(message, [channel.port2]);
  });
}

async function forward(request, url, clientId) {
  const headers = {};
  // The request is the playground's own (foreign() let it through): the Origin header, when there is one,
  // is this origin, and is not forwarded into the router.
  for (const [name, value] of request.headers) if (name !== "origin") headers[name] = value;
  const body = ["GET", "HEAD"].includes(request.method) ? "" : await request.text();
  const query = [...url.searchParams.entries()];
  const wait = Number(url.searchParams.get("wait") || 0);
  const req = JSON.stringify({
    method: request.method,
    path: url.pathname.slice(SCOPE_PATH.length - 1),
    query,
    headers,
    body,
  });
  const timeout = 5000 + Math.min(wait, 50) * 1000;
  const asker = clientId ? await self.clients.get(clientId) : null;
  let ns = asker && asker.type === "worker" ? new URL(asker.url).searchParams.get("mp-ns") || "" : null;
  // A tab showing an answer of /mp/v0 itself (a JSON document) has no engine and no listener: asking it
  // would only wait out the timeout.
  const windows = (await self.clients.matchAll({ type: "window", includeUncontrolled: true })).filter(
    (c) => {
      const path = new URL(c.url).pathname;
      return path !== API && !path.startsWith(API + "/");
    },
  );
  let reason = "no playground tab is open";
  let silent = false; // a tab did not answer in time: it may still apply the request
  const answer = (reply, client) => {
    if (reply.noAnswer) {
      // only a page that said hello at start is known to be a playground (a JSON file's tab never answers)
      if (clientNs.has(client.id)) reason = "the playground tab did not answer";
      silent = true;
    } else if (reply.notReady) reason = "the playground is still starting";
    if (!reply.status || reply.notReady) return null;
    if (ns !== null) owners.set(ns, client.id);
    return new Response(reply.body || null, {
      status: reply.status,
      headers: { "Content-Type": "application/json", "Cache-Control": "no-store", ...(reply.headers || {}) },
    });
  };
  const self_ = ns === null ? windows.find((c) => c.id === clientId) : undefined;
  if (self_) {
    // The asking page first: it answers when it owns its namespace, and otherwise says which one it is in.
    const reply = await ask(self_, { type: "mp-request", ns: null, req }, timeout);
    if (reply.ns !== undefined) ns = String(reply.ns);
    const done = answer(reply, self_);
    if (done) return done;
  }
  // Silent (busy past the timeout): the namespace it said at start, never another engine's guess.
  if (ns === null && asker && clientNs.has(asker.id)) ns = clientNs.get(asker.id);
  ns = ns || ""; // no engine page (or no client at all): the playground's
  const others = windows.filter((c) => c !== self_);
  others.sort((a, b) => (b.id === owners.get(ns)) - (a.id === owners.get(ns)));
  for (const client of others) {
    const done = answer(await ask(client, { type: "mp-request", ns, req }, timeout), client);
    if (done) return done;
  }
  if (silent && !["GET", "HEAD"].includes(request.method)) {
    return json(503, {
      code: "UNAVAILABLE",
      error:
        "The engine's tab did not answer in time and may still apply this request: read the state to see, " +
        "or send it again with the same idempotency key.",
      outcome: "unknown",
      done: [],
    });
  }
  const page = ns ? `a page of the "${ns}" engine` : `the playground (${self.registration.scope})`;
  return json(503, {
    code: "UNAVAILABLE",
    error: `Open ${page} in a tab to start the engine: ${reason}.`,
    done: [],
  });
}
