"""A TCP relay in front of the broker's ROUTER, for the tests of network faults: peers
connect to :attr:`Relay.endpoint`, and each of their connections is relayed on one of its own
to the broker, so the broker sees one connection per peer, as without the relay.

Two faults: :meth:`Relay.freeze` silences the connections open at that moment in both
directions (what arrives is read and dropped, counted in ``swallowed``), like a partition
neither side is told about; with ``new_ones_too`` the connections made afterwards are held
silent as well until :meth:`Relay.thaw`. :meth:`Relay.break_one` closes one connection at
random on both sides at once, like a link that broke (the peers see it and reconnect)."""

from __future__ import annotations

import random
import selectors
import socket
import threading
from typing import List, Optional


class Relay:
    def __init__(self, port: int, rng: Optional[random.Random] = None,
                 record: bool = False) -> None:
        self.port = port
        self.captured: Optional[bytearray] = bytearray() if record else None
        self.rng = rng or random.Random(1)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.pairs: List[dict] = []
        self.hold_new = False
        self.swallowed = 0  # bytes read from frozen connections and dropped
        self.breaks = 0
        self.lock = threading.Lock()
        self.sel = selectors.DefaultSelector()
        self.stop_r, self.stop_w = socket.socketpair()
        self.thread = threading.Thread(target=self._run, name="test-relay")
        self.thread.start()

    def freeze(self, new_ones_too: bool = False) -> None:
        with self.lock:
            self.hold_new = new_ones_too
            for p in self.pairs:
                p["frozen"] = True

    def thaw(self) -> None:
        """Connections made from now on are relayed (the frozen ones stay silent)."""
        with self.lock:
            self.hold_new = False

    def break_one(self) -> None:
        with self.lock:
            if not self.pairs:
                return
            pair = self.pairs[self.rng.randrange(len(self.pairs))]
            self.breaks += 1
        for s in pair["socks"]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # the relay's thread sees the end, closes both
            except OSError:
                pass

    def _drop(self, pair: dict) -> None:
        with self.lock:
            if pair in self.pairs:
                self.pairs.remove(pair)
        for s in pair["socks"]:
            try:
                self.sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def _run(self) -> None:
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.stop_r, selectors.EVENT_READ, "stop")
        while True:
            for key, _ in self.sel.select():
                if key.data == "stop":
                    return
                if key.data == "accept":
                    client, _ = self.listener.accept()
                    try:
                        upstream = socket.create_connection(("127.0.0.1", self.port), timeout=1)
                    except OSError:  # the broker is down: the peer tries again
                        client.close()
                        continue
                    upstream.settimeout(None)
                    with self.lock:
                        pair = {"frozen": self.hold_new, "socks": (client, upstream)}
                        self.pairs.append(pair)
                    self.sel.register(client, selectors.EVENT_READ, (pair, upstream))
                    self.sel.register(upstream, selectors.EVENT_READ, (pair, client))
                    continue
                pair, other = key.data
                try:
                    data = key.fileobj.recv(65536)
                    if data and pair["frozen"]:
                        with self.lock:
                            self.swallowed += len(data)
                    elif data:
                        if self.captured is not None:
                            with self.lock:
                                self.captured += data
                        other.sendall(data)
                except OSError:
                    data = b""
                if not data:
                    self._drop(pair)

    def close(self) -> None:
        self.stop_w.send(b"x")
        self.thread.join(5)
        for pair in list(self.pairs):
            for s in pair["socks"]:
                s.close()
        for s in (self.listener, self.stop_r, self.stop_w):
            s.close()
        self.sel.close()
