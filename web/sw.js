// Service-worker shim: every /mp/v0/* fetch of this origin is answered by the playground tab that owns
// the engine, over a per-request MessageChannel. No engine tab: 503 with a JSON error saying what to do.
const SCOPE_PATH = new URL(self.registration.scope).pathname; // e.g. "/"
const API = SCOPE_PATH + "mp/v0";
let ownerId = null; // the tab that said it owns the engine (a hint: any tab may answer "not owner")

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("message", (event) => {
  const msg = event.data || {};
  if (msg.type === "mp-owner" && event.source) ownerId = event.source.id;
  if (msg.type === "mp-owner-gone" && event.source && event.source.id === ownerId) ownerId = null;
});

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (url.origin !== self.location.origin) return;
  if (url.pathname !== API && !url.pathname.startsWith(API + "/")) return;
  event.respondWith(forward(event.request, url));
});

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

async function forward(request, url) {
  const headers = {};
  // The shim is same-origin: the Origin header is not forwarded into the router.
  for (const [name, value] of request.headers) if (name !== "origin") headers[name] = value;
  const body = ["GET", "HEAD"].includes(request.method) ? "" : await request.text();
  const query = [...url.searchParams.entries()];
  const wait = Number(url.searchParams.get("wait") || 0);
  const message = {
    type: "mp-request",
    req: JSON.stringify({
      method: request.method,
      path: url.pathname.slice(SCOPE_PATH.length - 1),
      query,
      headers,
      body,
    }),
  };
  const windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  windows.sort((a, b) => (b.id === ownerId) - (a.id === ownerId));
  let reason = "no playground tab is open";
  for (const client of windows) {
    const reply = await ask(client, message, 5000 + Math.min(wait, 50) * 1000);
    if (reply.notOwner || reply.noAnswer) {
      if (reply.noAnswer) reason = "the playground tab did not answer";
      continue;
    }
    if (reply.notReady) {
      reason = "the playground is still starting";
      continue;
    }
    if (reply.status) {
      ownerId = client.id;
      return new Response(reply.body || null, {
        status: reply.status,
        headers: { "Content-Type": "application/json", "Cache-Control": "no-store", ...(reply.headers || {}) },
      });
    }
  }
  return json(503, {
    code: "UNAVAILABLE",
    error: `Open the playground (${self.registration.scope}) in a tab to start the engine: ${reason}.`,
    done: [],
  });
}
