// The engine namespace, before boot.js reads it: embed-<scene>-<id>, so this frame's IndexedDB, Web Lock
// and view channel are its own (never the playground's "" nor another embed's). A malformed scene or id
// gets a namespace no engine ever opens; embed.py knows the scenes, and for an unknown one lists them
// without opening an engine either.
(() => {
  const q = new URLSearchParams(location.search);
  const scene = q.get("scene") || "";
  const id = q.get("id") || scene;
  const ok = /^[a-z0-9-]{1,16}$/.test(scene) && /^[a-z0-9-]{1,40}$/.test(id);
  window.MP_NS = ok ? `embed-${scene}-${id}` : "embed-none";
})();
