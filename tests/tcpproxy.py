"""A TCP proxy for the tests, on its own thread: what a stalled network or proxy looks like to mp serve.

``TcpProxy(host, port)`` listens on a free loopback port and forwards every connection to (host, port).
``silence()`` stops forwarding in both directions while keeping every connection open and accepting new
ones that get no answer (the kernel still acknowledges, so TCP's keepalives notice nothing: a stalled proxy,
or a frozen server); ``heal()`` forwards again what was held. ``close()`` ends it all. With
``keep_orphans=True``, a client that closes its connection while the proxy is silent leaves the server's side
open and what it sent unsent (lost in a partition that hid the client's end from the server).
"""

from __future__ import annotations

import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, host: str, port: int, *, keep_orphans: bool = False) -> None:
        self.target = (host, port)
        self.keep_orphans = keep_orphans
        self._orphans: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._silent = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, socket.socket] = {}
        self._held: dict[socket.socket, bytearray] = {}
        self._thread = threading.Thread(target=self._run, name="tcpproxy", daemon=True)
        self._thread.start()

    @classmethod
    def before(cls, url: str, *, keep_orphans: bool = False) -> TcpProxy:
        """A proxy forwarding to the server of `url` (postgresql://user@host:port/db)."""
        host, port = url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
        return cls(host, int(port), keep_orphans=keep_orphans)

    def url(self, url: str) -> str:
        """`url` (postgresql://user@host:port/db) with this proxy's address instead."""
        head, rest = url.split("@", 1)
        db = rest.split("/", 1)[1]
        return f"{head}@127.0.0.1:{self.port}/{db}"

    def silence(self) -> None:
        self._silent.set()

    def heal(self) -> None:
        self._silent.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in [self._listener, *self._peers, *self._orphans]:
            sock.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in sel.select(0.05):
                sock = key.fileobj
                if sock is self._listener:
                    try:
                        client, _ = self._listener.accept()
                    except BlockingIOError:
                        continue
                    server = socket.create_connection(self.target)
                    for a, b in ((client, server), (server, client)):
                        a.setblocking(False)
                        self._peers[a] = b
                        self._held[a] = bytearray()
                        sel.register(a, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    if self.keep_orphans and self._silent.is_set() and sock in self._peers:
                        self._orphan(sel, sock)
                    else:
                        self._drop(sel, sock)
                    continue
                self._held[sock] += data
            if not self._silent.is_set():
                for sock, held in list(self._held.items()):
                    if held and sock in self._peers:
                        try:
                            del held[: self._peers[sock].send(held)]
                        except BlockingIOError:
                            pass  # sent next time round
                        except OSError:
                            self._drop(sel, sock)

    def _orphan(self, sel: selectors.BaseSelector, client: socket.socket) -> None:
        server = self._peers.pop(client)
        for s in (client, server):
            self._peers.pop(s, None)
            self._held.pop(s, None)
            sel.unregister(s)
        client.close()
        self._orphans.append(server)  # open, never read or written again

    def _drop(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        other = self._peers.pop(sock, None)
        self._held.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self._peers.pop(s, None)
            self._held.pop(s, None)
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
