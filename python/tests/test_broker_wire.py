"""The codec against the real broker: a DEALER introduces itself and heartbeats, and the
broker's refusals decode with the codes SPEC §6 names."""

from __future__ import annotations

import zmq

from conftest import Broker
from rlbus import protocol as P


def _exchange(sock: zmq.Socket, name: str, fields: dict) -> P.Message:
    sock.send_multipart(list(P.encode(name, fields)))
    assert sock.poll(5000), f"no answer to {name}"
    return P.decode(sock.recv_multipart())


def test_hello_welcome_heartbeat_and_refusal(broker: Broker) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(broker.router)
        # before HELLO: any other message is refused with 403, naming its type
        err = _exchange(sock, "HEARTBEAT", {})
        assert err.name == "ERROR" and err["code"] == 403
        assert err["ref_type"] == P.type_id("HEARTBEAT")
        w = _exchange(sock, "HELLO", {"role": "collector", "id": "py-wire-1",
                                      "heartbeat_ms": 1000, "resources": {"cpu": 2}})
        assert w.name == "WELCOME" and w["resumed"] is False and w["session"] >= 1
        assert _exchange(sock, "HEARTBEAT", {}).name == "HEARTBEAT"
        # a message with a bad field is refused with 402
        sock.send_multipart([P.header(P.type_id("STARTED")), b"\x81\xa7task_id\xa3a b"])
        assert sock.poll(5000)
        err = P.decode(sock.recv_multipart())
        assert err.name == "ERROR" and err["code"] == 402
        sock.send_multipart(list(P.encode("DISCONNECT", {"code": 200, "reason": "done"})))
    finally:
        sock.close()
        ctx.term()


def test_resume_with_token_on_a_new_connection(broker: Broker) -> None:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for s in (a, b):
        s.linger = 0
        s.connect(broker.router)
    try:
        hello = {"role": "learner", "id": "py-wire-2", "heartbeat_ms": 1000}
        first = _exchange(a, "HELLO", hello)
        assert first.name == "WELCOME"
        # without the token the id is taken (409, about HELLO)
        err = _exchange(b, "HELLO", hello)
        assert err["code"] == 409 and err["ref_type"] == P.type_id("HELLO")
        again = _exchange(b, "HELLO", dict(hello, session=first["session"]))
        assert again.name == "WELCOME" and again["resumed"] is True
        assert again["session"] == first["session"]
        assert a.poll(5000)
        gone = P.decode(a.recv_multipart())
        assert gone.name == "DISCONNECT" and gone["code"] == 430
    finally:
        a.close()
        b.close()
        ctx.term()
