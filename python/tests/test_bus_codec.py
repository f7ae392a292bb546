"""The topic bus in the Python codec and session layer (SPEC §17): PUBLISH and DELIVER in three
frames with their payload, the flags that are written only when set, the topic rule, the role
``bus``; and a session that sends a PUBLISH with its payload frame and hands on a DELIVER with
its payload, checked against a ROUTER socket standing in for the broker."""

from __future__ import annotations

import threading
from typing import Any, List

import msgpack
import pytest
import zmq

from conftest import wait_until
from rlbus import protocol as P
from rlbus._core import Core
from rlbus._session import ROLES, check_options


def _head(name: str) -> bytes:
    return P.header(P.type_id(name))


# ---- the codec --------------------------------------------------------------------------

def test_publish_and_deliver_are_three_frames_with_their_payload() -> None:
    frames = P.encode("PUBLISH", {"seq": 1, "topic": "sensors.lidar"}, b"\x00scan\xff")
    assert len(frames) == 3 and frames[0] == _head("PUBLISH") and frames[2] == b"\x00scan\xff"
    m = P.decode(frames)
    assert m.name == "PUBLISH" and m.payload == b"\x00scan\xff"
    assert m.fields == {"seq": 1, "topic": "sensors.lidar"}
    # no payload given: an empty payload frame, still three frames
    empty = P.encode("DELIVER", {"seq": 2, "topic": "t", "from": "node-1"})
    assert len(empty) == 3 and empty[2] == b""
    assert P.decode(empty).payload == b""
    # any bytes-like payload travels as given
    for data in (bytearray(b"ab"), memoryview(b"ab")):
        frames = P.encode("PUBLISH", {"seq": 1, "topic": "t"}, data)
        assert frames[2] is data and P.decode(frames).payload == b"ab"
    with pytest.raises(TypeError):
        P.encode("PUBLISH", {"seq": 1, "topic": "t"}, "text")
    # every other message: two frames, no payload
    assert P.encode("BUS_ACK", {"seq": 3}) == (_head("BUS_ACK"), msgpack.packb({"seq": 3}))
    assert P.decode(P.encode("BUS_ACK", {"seq": 3})).payload is None


@pytest.mark.parametrize("frames", [
    [_head("PUBLISH"), msgpack.packb({"seq": 1, "topic": "t"})],                 # no payload
    [_head("DELIVER"), msgpack.packb({"seq": 1, "topic": "t", "from": "p"})],
    [_head("BUS_ACK"), msgpack.packb({"seq": 1}), b""],                          # one too many
    [_head("HEARTBEAT"), b"\x80", b"x"],
    [_head("PUBLISH"), msgpack.packb({"seq": 1, "topic": "t"}), b"", b""],       # four
    [_head("PUBLISH")],
])
def test_a_wrong_frame_count_is_refused_with_400(frames: List[bytes]) -> None:
    with pytest.raises(P.ProtocolError) as err:
        P.decode(frames)
    assert err.value.code == 400


def test_a_payload_for_a_message_without_a_payload_frame_is_refused() -> None:
    for name, fields in (("BUS_ACK", {"seq": 1}), ("SUBSCRIBE", {"req": 1, "topic": "t"}),
                         ("HEARTBEAT", {})):
        with pytest.raises(P.ProtocolError) as err:
            P.encode(name, fields, b"data")
        assert err.value.code == 400 and name in err.value.reason


def test_flags_are_written_only_when_set_and_a_present_false_decodes() -> None:
    body = P.encode_body("SUBSCRIBE", {"req": 1, "topic": "t", "prefix": False, "echo": True,
                                       "last": False})
    assert msgpack.unpackb(body) == {"req": 1, "topic": "t", "echo": True}
    body = P.encode_body("PUBLISH", {"seq": 1, "topic": "t", "part": 0, "more": False})
    assert body == msgpack.packb({"seq": 1, "topic": "t"})
    assert msgpack.unpackb(P.encode_body("PUBLISH", {"seq": 1, "topic": "t", "part": 3})) == {
        "seq": 1, "topic": "t", "part": 3}
    # not canonical but valid: explicit defaults decode, and re-encode without them
    explicit = msgpack.packb({"seq": 4, "topic": "t", "part": 0, "more": False, "retain": False})
    m = P.decode([_head("PUBLISH"), explicit, b"p"])
    assert m.get("part") == 0 and m.get("more") is False
    assert P.encode("PUBLISH", m.fields, m.payload)[1] == msgpack.packb({"seq": 4, "topic": "t"})
    # a default is of its field's type: 0 is not false, false is not 0
    for fields in ({"seq": 1, "topic": "t", "more": 0}, {"seq": 1, "topic": "t", "part": False}):
        with pytest.raises(P.ProtocolError) as err:
            P.encode("PUBLISH", fields, b"")
        assert err.value.code == 402


@pytest.mark.parametrize("topic,ok", [
    ("sensors.lidar", True), ("".join(chr(c) for c in range(0x21, 0x7F)), True),
    ("t" * 256, True), ("t" * 257, False), ("a b", False), ("a\tb", False), ("a\x7f", False),
    ("caf\u00e9", False), ("", False),
])
def test_topic_rule(topic: str, ok: bool) -> None:
    fields = {"seq": 1, "topic": topic}
    if ok:
        assert P.decode(P.encode("PUBLISH", fields, b"")).fields == fields
    else:
        with pytest.raises(P.ProtocolError) as err:
            P.encode("PUBLISH", fields, b"")
        assert err.value.code == 402 and "topic" in err.value.reason
    # a subscription's topic may also be empty (a prefix of every topic)
    sub = {"req": 1, "topic": topic, "prefix": True}
    if ok or topic == "":
        assert P.decode(P.encode("SUBSCRIBE", sub)).fields == sub
    else:
        with pytest.raises(P.ProtocolError):
            P.encode("SUBSCRIBE", sub)


def test_role_bus_is_a_role_but_never_a_kind() -> None:
    assert "bus" in ROLES and set(ROLES) >= {"collector", "learner", "coordinator"}
    check_options("tcp://127.0.0.1:1", "bus", "node-1", None, 1.0, 0.1, 1.0)
    hello = {"role": "bus", "id": "node-1", "heartbeat_ms": 1000, "resources": {}}
    assert P.decode(P.encode("HELLO", hello)).fields == hello
    with pytest.raises(P.ProtocolError) as err:
        P.encode("SUBMIT", {"task_id": "t", "kind": "bus", "task_info": {}})
    assert err.value.code == 402 and "kind" in err.value.reason
    ev = P.decode_event(P.encode_event("bus.left", {
        "seq": 1, "epoch": 0, "ts_ms": 0, "id": "node-1", "role": "bus", "serial": 2,
        "code": 200, "reason": ""}))
    assert ev["role"] == "bus" and ev["code"] == 200


# ---- the session layer, against a stand-in broker ----------------------------------------

class _Handler:
    def __init__(self) -> None:
        self.messages: List[P.Message] = []
        self.lock = threading.Lock()

    def on_message(self, msg: P.Message) -> None:
        with self.lock:
            self.messages.append(msg)


def test_a_session_sends_publish_with_its_payload_and_hands_on_deliver_with_its() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    handler = _Handler()
    core = Core(f"tcp://127.0.0.1:{port}", "bus", "node-1", handler, heartbeat=1.0)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)

    def recv() -> Any:
        assert poller.poll(5000), "nothing from the session"
        frames = router.recv_multipart()
        return frames[0], P.decode(frames[1:])

    try:
        core.start()
        rid, hello = recv()
        assert hello.name == "HELLO" and hello["role"] == "bus"
        router.send_multipart([rid, *P.encode("WELCOME", {
            "session": 5, "epoch": 1, "heartbeat_ms": 1000, "liveness": 3,
            "max_message": 1 << 20, "resumed": False})])
        assert core.wait_for("ready", 5)

        # out: a PUBLISH with its payload frame, large enough to travel uncopied
        big = bytes(range(256)) * 1024
        assert core.post(lambda: core.send("PUBLISH", {"seq": 1, "topic": "t.x"}, big))
        _, pub = recv()
        assert pub.name == "PUBLISH" and pub.payload == big and pub["topic"] == "t.x"
        assert core.post(lambda: core.send("BUS_ACK", {"seq": 0}))
        _, ack = recv()
        assert ack.name == "BUS_ACK" and ack.payload is None

        # in: a DELIVER of three frames, then a two-frame message, then one that breaks the
        # frame rule (dropped, the session goes on), then another DELIVER
        router.send_multipart([rid, *P.encode("DELIVER", {"seq": 1, "topic": "t.x",
                                                          "from": "node-2"}, b"\x00\x01")])
        router.send_multipart([rid, *P.encode("PUBLISH_CREDIT", {"acked": 1, "limit": 65})])
        router.send_multipart([rid, *P.encode("BUS_GAP", {"first": 2, "last": 3}), b"extra"])
        router.send_multipart([rid, *P.encode("DELIVER", {"seq": 4, "topic": "t.y",
                                                          "from": "node-2", "more": True})])
        assert wait_until(lambda: len(handler.messages) >= 3, 5)
        with handler.lock:
            got = [(m.name, m.payload) for m in handler.messages]
        assert got == [("DELIVER", b"\x00\x01"), ("PUBLISH_CREDIT", None), ("DELIVER", b"")]
        assert handler.messages[2]["more"] is True
        assert core.state == "ready"
    finally:
        core.close()
        router.close()
        ctx.term()
