"""SPEC §17 clause by clause with bare DEALERs and the Python codec: what the broker does with
each message of the topic bus, good and bad. (The C++ suite checks the same clauses.)"""

from __future__ import annotations

import time
from typing import Any, List, Optional

import pytest
import zmq

import rlbus
from conftest import Broker
from rlbus import protocol as P


class Node:
    """A node of the bus by hand: it joins and reads its first PUBLISH_CREDIT."""

    def __init__(self, ctx: zmq.Context, endpoint: str, id: str, role: str = "bus",
                 curve: Optional[rlbus.CurveKeys] = None) -> None:
        self.id = id
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        if curve is not None:
            curve.apply(self.sock)
        self.sock.connect(endpoint)
        self.send("HELLO", {"role": role, "id": id, "heartbeat_ms": 60000})
        self.welcome = self.recv()
        assert self.welcome.name == "WELCOME", self.welcome.fields
        self.credit = self.recv("PUBLISH_CREDIT") if role == "bus" else None

    def send(self, name: str, fields: dict, payload: Optional[bytes] = None) -> None:
        self.sock.send_multipart(list(P.encode(name, fields, payload)))

    def frames(self, frames: List[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, name: Optional[str] = None, timeout: float = 5.0,
             skip: tuple = ("HEARTBEAT",)) -> P.Message:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.sock.poll(int(left * 1000)), \
                f"{self.id}: no {name or 'message'} within {timeout} s"
            m = P.decode(self.sock.recv_multipart())
            if m.name in skip and m.name != name:
                continue
            if name is not None and m.name != name:
                raise AssertionError(f"{self.id}: expected {name}, got {m.name} {m.fields}")
            return m

    def quiet(self) -> None:
        """Nothing but PUBLISH_CREDIT is on its way (a HEARTBEAT round trip)."""
        self.send("HEARTBEAT", {})
        self.recv("HEARTBEAT", skip=("PUBLISH_CREDIT",))

    def subscribe(self, topic: str, req: int = 1, **opts: Any) -> P.Message:
        self.send("SUBSCRIBE", dict({"req": req, "topic": topic}, **opts))
        a = self.recv("SUBSCRIBED")
        assert a["req"] == req and a["accepted"], a.fields
        return a

    def error(self, code: int, ref: Optional[str]) -> P.Message:
        e = self.recv("ERROR", skip=("HEARTBEAT", "PUBLISH_CREDIT"))
        assert e["code"] == code, e.fields
        assert e.get("ref_type") == (P.type_id(ref) if ref else None)
        return e

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture
def bus(broker: Broker):
    ctx = zmq.Context()
    made: List[Node] = []

    def node(id: str, role: str = "bus", endpoint: str = "") -> Node:
        n = Node(ctx, endpoint or broker.router, id, role)
        made.append(n)
        return n
    yield node
    for n in made:
        n.close()
    ctx.term()


def pub(seq: int, topic: str, **opts: Any) -> dict:
    return dict({"seq": seq, "topic": topic}, **opts)


def test_17_1_bus_messages_need_role_bus(bus) -> None:
    w = bus("w", role="collector")
    w.send("SUBSCRIBE", {"req": 1, "topic": "t"})
    w.error(404, "SUBSCRIBE")
    n = bus("n")
    n.send("SUBMIT", {"task_id": "t1", "kind": "collector", "task_info": {}})
    n.error(404, "SUBMIT")


def test_17_1_1_publish_takes_three_frames_and_others_two(bus) -> None:
    n = bus("n")
    header, body = P.encode("PUBLISH", pub(1, "t"), b"x")[:2]
    n.frames([header, body])
    n.error(400, None)
    n.frames(list(P.encode("SUBSCRIBE", {"req": 1, "topic": "t"})) + [b"extra"])
    n.error(400, None)
    n.send("PUBLISH", pub(1, "t"), b"")
    n.quiet()


def test_17_2_1_topic_rule(bus) -> None:
    n = bus("n")
    n.send("SUBSCRIBE", {"req": 1, "topic": ""})  # empty: only as a prefix
    n.error(402, "SUBSCRIBE")
    header = P.header(P.type_id("PUBLISH"))
    body = P.encode_body("PUBLISH", pub(1, "a b"), check=False)
    n.frames([header, body, b"x"])
    n.error(402, "PUBLISH")
    n.subscribe("task.context_exchanger_Role.COLLECTOR", req=2)


def test_17_2_3_each_subscriber_once_never_the_publisher(bus) -> None:
    a, s = bus("a"), bus("s")
    a.subscribe("", prefix=True)
    s.subscribe("task.", prefix=True)
    assert s.subscribe("task.x", req=2)["subscriptions"] == 2
    a.send("PUBLISH", pub(1, "task.x"), b"one")
    d = s.recv("DELIVER")
    assert (d["seq"], d["topic"], d["from"], d.payload) == (1, "task.x", "a", b"one")
    s.quiet()
    a.quiet()  # not its own


def test_17_4_2_credit_after_welcome_and_seq_rules(bus) -> None:
    p = bus("p")
    assert p.credit["acked"] == 0 and p.credit["limit"] >= 1
    p.send("PUBLISH", pub(2, "t"), b"skips")
    p.error(413, "PUBLISH")
    p.send("PUBLISH", pub(1, "t"), b"1")
    assert p.recv("PUBLISH_CREDIT")["acked"] == 1
    p.send("PUBLISH", pub(1, "t"), b"copy")  # sent again: dropped, no fault
    p.quiet()


def test_17_4_2_the_grant_as_the_spec_computes_it_and_again_after_a_repeated_hello(
        bus) -> None:
    """Default settings: the first grant is what a quarter of bus-queue-bytes holds of
    PUBLISH counted at max-message plus the id, the longest topic and 64 bytes (15); once its
    publications are small, bus-credit (64). A HELLO again on the session's connection is
    WELCOMEd again and credited again."""
    p = bus("p")
    quarter, counted = 64 * 1024 * 1024 // 4, 1024 * 1024 + len("p") + 256 + 64
    assert p.credit["limit"] == quarter // counted == 15, p.credit.fields
    p.send("PUBLISH", pub(1, "t"), b"1")
    credit = p.recv("PUBLISH_CREDIT")
    assert (credit["acked"], credit["limit"]) == (1, 1 + 64), credit.fields
    p.send("HELLO", {"role": "bus", "id": "p", "heartbeat_ms": 60000})
    again = p.recv("WELCOME")
    assert again["resumed"] and again["session"] == p.welcome["session"], again.fields
    credit = p.recv("PUBLISH_CREDIT")
    assert (credit["acked"], credit["limit"]) == (1, 65), credit.fields


def test_17_4_3_window_ack_and_resumption(broker_factory) -> None:
    br = broker_factory("--bus-window", "2")
    ctx = zmq.Context()
    try:
        p, s = Node(ctx, br.router, "p"), Node(ctx, br.router, "s")
        s.subscribe("t")
        for i in range(1, 5):
            p.send("PUBLISH", pub(i, "t"), str(i).encode())
        assert [s.recv("DELIVER").payload for _ in range(2)] == [b"1", b"2"]
        s.quiet()
        s.send("BUS_ACK", {"seq": 3})
        s.error(413, "BUS_ACK")
        s.send("BUS_ACK", {"seq": 1})
        assert s.recv("DELIVER")["seq"] == 3
        again = ctx.socket(zmq.DEALER)
        again.linger = 0
        again.connect(br.router)
        again.send_multipart(list(P.encode("HELLO", {"role": "bus", "id": "s", "heartbeat_ms":
                                                     60000, "session": s.welcome["session"]})))
        seen = []
        while len(seen) < 2:
            assert again.poll(5000)
            m = P.decode(again.recv_multipart())
            if m.name == "DELIVER":
                seen.append((m["seq"], m.payload))
        assert seen == [(2, b"2"), (3, b"3")]  # unacknowledged, sent again as they were
        again.close(0)
        p.close()
        s.close()
    finally:
        ctx.term()


def test_17_5_fragments_and_an_abandoned_publication(bus) -> None:
    p, s = bus("p"), bus("s")
    s.subscribe("t")
    p.send("PUBLISH", pub(1, "t", part=1), b"no start")
    p.error(441, "PUBLISH")
    p.send("PUBLISH", pub(2, "t", more=True), b"A")
    p.send("PUBLISH", pub(3, "t", part=1), b"B")
    assert [(d.payload, d.get("more", False)) for d in (s.recv("DELIVER"), s.recv("DELIVER"))] \
        == [(b"A", True), (b"B", False)]
    p.send("PUBLISH", pub(4, "t", more=True), b"C")
    assert s.recv("DELIVER").payload == b"C"
    p.send("DISCONNECT", {"code": 200, "reason": "gone mid-publication"})
    d = s.recv("DELIVER")
    assert d["abandoned"] and d["part"] == 1 and d.payload == b""


def _batch(*items: bytes) -> bytes:
    return b"".join(len(i).to_bytes(4, "big") + i for i in items)


def test_17_5_1_a_batch_is_one_publication_its_framing_checked(bus) -> None:
    p, s = bus("p"), bus("s")
    s.subscribe("t")
    batch = _batch(b"one", b"", b"three")
    p.send("PUBLISH", pub(1, "t", count=3), batch)
    d = s.recv("DELIVER")
    assert (d["seq"], d["count"], d["from"], d.payload) == (1, 3, "p", batch)
    for seq, opts, payload in ((2, {"count": 4}, batch), (3, {"count": 2}, batch),
                               (4, {"count": 3}, batch[:-1]), (5, {"count": 3}, batch + b"x"),
                               (6, {"count": 3, "more": True}, batch),
                               (7, {"count": 3, "retain": True}, batch)):
        p.send("PUBLISH", pub(seq, "t", **opts), payload)
        p.error(442, "PUBLISH")
    p.send("PUBLISH", pub(8, "t", count=2), _batch(b"a", b"b"))
    d = s.recv("DELIVER")
    assert (d["seq"], d["count"], d.payload) == (2, 2, _batch(b"a", b"b"))
    p.quiet()


def test_17_6_a_bound_drops_with_a_numbered_gap(broker_factory) -> None:
    br = broker_factory("--bus-window", "1", "--bus-queue-bytes", "8192")
    ctx = zmq.Context()
    try:
        s = Node(ctx, br.router, "s")
        s.subscribe("t")
        # credit keeps one publisher within the bound: six at once, in their first credit
        pubs = [Node(ctx, br.router, f"p{k}") for k in range(6)]
        for p in pubs:
            assert p.credit["limit"] >= 2
            for i in (1, 2):
                p.send("PUBLISH", pub(i, "t"), b"x" * 1024)
        for p in pubs:
            p.quiet()
        assert s.recv("DELIVER")["seq"] == 1
        s.send("BUS_ACK", {"seq": 1})
        gap = s.recv("BUS_GAP")
        assert gap["first"] == 2 and 2 <= gap["last"] < 12
        s.send("BUS_ACK", {"seq": gap["last"]})
        d = s.recv("DELIVER")
        assert d["seq"] == gap["last"] + 1 and d.payload == b"x" * 1024
        for n in pubs + [s]:
            n.close()
    finally:
        ctx.term()


def test_17_7_retained_values_for_last(bus) -> None:
    p, s = bus("p"), bus("s")
    p.send("PUBLISH", pub(1, "m.b", retain=True), b"b")
    p.send("PUBLISH", pub(2, "m.a", retain=True), b"a")
    p.send("PUBLISH", pub(3, "m.c", retain=True), b"c")
    p.send("PUBLISH", pub(4, "m.c", retain=True), b"")  # clears m.c
    p.quiet()
    s.subscribe("m.", prefix=True, last=True)
    got = [s.recv("DELIVER") for _ in range(2)]
    assert [(d.payload, d["retained"]) for d in got] == [(b"a", True), (b"b", True)]
    s.quiet()


def test_17_8_too_many_subscriptions(broker_factory) -> None:
    br = broker_factory("--bus-max-subscriptions", "1")
    ctx = zmq.Context()
    try:
        n = Node(ctx, br.router, "n")
        n.subscribe("a")
        n.send("SUBSCRIBE", {"req": 2, "topic": "b"})
        a = n.recv("SUBSCRIBED")
        assert not a["accepted"] and a["code"] == 440 and a["subscriptions"] == 1
        n.close()
    finally:
        ctx.term()
