"""A bare protocol peer for the wire-level tests: one DEALER and the codec, nothing else, so
the tests see exactly what the broker sends."""

from __future__ import annotations

import time
from typing import Any, Optional

import zmq

from rlbus import protocol as P


def plain(v: Any) -> Any:
    """Opaque fields as Python values."""
    return v.value() if isinstance(v, P.Raw) else v


class Peer:
    def __init__(self, ctx: zmq.Context, endpoint: str, role: str, id: str,
                 heartbeat_ms: int = 60000, **hello: Any) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.id = id
        self.send("HELLO", dict({"role": role, "id": id, "heartbeat_ms": heartbeat_ms}, **hello))
        w = self.recv()
        assert w.name == "WELCOME", f"{id}: HELLO answered with {w.name} {w.fields}"
        self.welcome = w

    def send(self, name: str, fields: dict) -> None:
        self.sock.send_multipart(list(P.encode(name, fields)))

    def recv(self, name: Optional[str] = None, timeout: float = 5.0) -> P.Message:
        """The next message (of type ``name`` when given, others skipped), HEARTBEATs
        skipped; fails the test after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.sock.poll(int(left * 1000)), \
                f"{self.id}: no {name or 'message'} within {timeout} s"
            m = P.decode(self.sock.recv_multipart())
            if m.name == "HEARTBEAT" or (name is not None and m.name != name):
                continue
            return m

    def event(self, timeout: float = 5.0) -> P.Message:
        """The next TASK_EVENT (a coordinator's), its body decoded."""
        ev = self.recv("TASK_EVENT", timeout)
        ev.fields["body"] = plain(ev["body"])
        return ev

    def event_named(self, event: str, timeout: float = 5.0) -> P.Message:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.event(max(0.01, deadline - time.monotonic()))
            if ev["event"] == event:
                return ev

    def close(self) -> None:
        self.sock.close(0)
