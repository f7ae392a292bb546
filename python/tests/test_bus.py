"""rlbus.Bus against a real broker: what a node of the topic bus can count on (SPEC §17):
delivery once subscribe() returned, nothing of its own, order per publisher from several
threads, fragments joined, nothing lost under a slow subscriber, close() flushing, recv()
released by close(), resumption after a cut link and a new session after a broker restart."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import List

import pytest
import zmq

from conftest import BUILD_DIR, Broker, wait_until
from relay import Relay
from rlbus import Bus, BusError
from test_bus_wire import Node


def _node(endpoint: str, id: str, **kw) -> Bus:
    b = Bus(endpoint, id, **kw)
    assert b.wait_ready(10), f"{id}: {b.state} {b.last_error}"
    return b


def _recv_n(bus: Bus, n: int, timeout: float = 20.0) -> List:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"{bus.id}: got {len(out)} of {n}"
        m = bus.recv(timeout=left)
        if m is not None:
            out.append(m)
    return out


@pytest.fixture
def nodes(broker: Broker):
    made: List[Bus] = []

    def make(id: str, endpoint: str = "", **kw) -> Bus:
        b = _node(endpoint or broker.router, id, **kw)
        made.append(b)
        return b
    yield make
    for b in reversed(made):
        b.close(2.0)


def test_subscribed_topics_arrive_and_nothing_of_ones_own(nodes) -> None:
    a, b = nodes("a"), nodes("b")
    a.subscribe("", prefix=True)             # a hears everything but itself
    b.subscribe("task.greeting")             # subscribe() returns once it is in force
    a.publish("task.greeting", b"from a")    # at once: no sleep between
    b.publish("task.greeting", b"from b")
    b.publish("other", b"not for b")
    got = b.recv(timeout=5)
    assert got is not None and (got.topic, got.payload, got.sender) == \
        ("task.greeting", b"from a", "a")
    assert [m.payload for m in _recv_n(a, 2)] == [b"from b", b"not for b"]
    assert b.recv(timeout=0.3) is None       # not b's own, not "other"


def test_echo_and_unsubscribe_by_glob(nodes) -> None:
    a, b = nodes("a"), nodes("b")
    a.subscribe("task.x", echo=True)
    a.publish("task.x", b"mine")
    assert a.recv(timeout=5).payload == b"mine"
    b.subscribe("task.one")
    b.subscribe("task.two")
    b.subscribe("keep")
    assert b.unsubscribe_matching("task.*") == 2
    assert b.subscriptions == [("keep", False)]
    for t in ("task.one", "task.two", "keep"):
        a.publish(t, t.encode())
    assert b.recv(timeout=5).payload == b"keep"
    assert b.recv(timeout=0.3) is None


def test_order_per_publisher_from_several_threads(nodes) -> None:
    pub, sub = nodes("pub"), nodes("sub")
    sub.subscribe("t.", prefix=True)
    per_thread = 300

    def emit(k: int) -> None:
        for i in range(per_thread):
            pub.publish(f"t.{k}", f"{k}:{i}".encode())
    threads = [threading.Thread(target=emit, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = {0: -1, 1: -1, 2: -1}
    for m in _recv_n(sub, 3 * per_thread):
        k, i = map(int, m.payload.decode().split(":"))
        assert i == last[k] + 1, f"thread {k}: {i} after {last[k]}"
        last[k] = i
    assert sub.lost == 0


def test_large_payload_in_fragments(nodes) -> None:
    a, b = nodes("a"), nodes("b")
    b.subscribe("model")
    size = int(os.environ.get("RLBUS_BUS_BIG_MB", "6")) * 1024 * 1024
    payload = os.urandom(1024) * (size // 1024)  # past max-message (1 MiB): in fragments
    a.publish("model", payload)
    a.publish("model", b"small after it")
    got = b.recv(timeout=60)
    assert got is not None and len(got.payload) == len(payload) and got.payload == payload
    assert b.recv(timeout=10).payload == b"small after it"


def test_slow_subscriber_loses_nothing_and_holds_the_publisher_back(broker_factory) -> None:
    # A small queue bound, so that holding back shows within a test's time.
    br = broker_factory("--bus-queue-bytes", "262144", "--bus-credit", "8")
    fast, slow = _node(br.router, "fast"), _node(br.router, "slow")
    try:
        slow.subscribe("data")
        n = 1000
        payload = b"x" * 4096
        done = threading.Event()

        def emit() -> None:
            for i in range(n):
                fast.publish("data", i.to_bytes(4, "big") + payload)
            done.set()
        t = threading.Thread(target=emit)
        t.start()
        got = []
        for _ in range(n):
            m = slow.recv(timeout=30)
            assert m is not None
            got.append(int.from_bytes(m.payload[:4], "big"))
            if len(got) == 50:
                # the publisher cannot have run far ahead: the broker holds it back
                assert not done.is_set()
            time.sleep(0.002)  # a tenth of the publisher's pace, or slower
        t.join(30)
        assert got == list(range(n))
        assert slow.lost == 0
    finally:
        fast.close(2)
        slow.close(2)


def test_small_publications_queued_while_held_back_leave_as_batches(broker_factory) -> None:
    """SPEC §17.5.1: what a publisher has queued on one topic while the broker holds it back
    goes as batches: every publication comes, in order, each once, in far fewer PUBLISH."""
    br = broker_factory("--bus-queue-bytes", str(1 << 20))  # held back after ~4 000
    fast, slow = _node(br.router, "fast"), _node(br.router, "slow")
    try:
        slow.subscribe("small")
        n = 0
        with pytest.raises(TimeoutError):  # nobody reads: held back, then its queue is full
            while True:
                fast.publish("small", str(n).encode(), timeout=0.3)
                n += 1
        assert n > 256  # and 256 of them wait in the publisher's queue
        assert [m.payload for m in _recv_n(slow, n)] == [str(i).encode() for i in range(n)]
        fast.publish("small", b"alone")
        assert _recv_n(slow, 1)[0].payload == b"alone"
        # the 256 that waited left as one PUBLISH (and what queued meanwhile in batches too)
        view = _broker_view_of(br.router, "fast")
        assert view["published"] <= n + 1 - 255, view
        assert slow.lost == 0 and fast.errors == 0
    finally:
        fast.close(2)
        slow.close(2)


def _broker_view_of(router: str, node: str) -> dict:
    """The broker's own account of ``node`` (rlbus-ctl topics)."""
    out = subprocess.run([os.path.join(BUILD_DIR, "src", "rlbus-ctl"), "--broker", router,
                          "--timeout", "30000", "--json", "topics"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return next(n for n in json.loads(out.stdout)["nodes"] if n["id"] == node)


def test_what_a_node_read_is_acknowledged_without_more_traffic(broker: Broker, nodes) -> None:
    # Fewer deliveries than an ack is owed for at once: their ack waits for the node's next
    # turn, which a heartbeat brings when nothing else does. The broker then holds nothing.
    pub, sub = nodes("quiet-pub"), nodes("quiet-sub")
    sub.subscribe("few")
    for i in range(5):
        pub.publish("few", bytes([i]))
    assert [m.payload for m in _recv_n(sub, 5)] == [bytes([i]) for i in range(5)]
    # (five publications, one delivery each or fewer as a batch: every one sent is acked)

    def all_acked() -> bool:
        view = _broker_view_of(broker.router, "quiet-sub")
        return view["acked"] > 0 and view["acked"] == view["next_seq"] - 1
    assert wait_until(all_acked, 10)
    assert _broker_view_of(broker.router, "quiet-sub")["queued"] == 0


def test_close_flushes_and_releases_a_blocked_recv(nodes) -> None:
    a, b = nodes("a"), nodes("b")
    b.subscribe("last-words")
    for i in range(200):
        a.publish("last-words", str(i).encode())
    a.close()  # flushes before it says DISCONNECT
    assert [int(m.payload) for m in _recv_n(b, 200)] == list(range(200))
    box = []
    t = threading.Thread(target=lambda: box.append(b.recv()))
    t.start()
    time.sleep(0.05)
    start = time.monotonic()
    b.close()
    t.join(2)
    assert not t.is_alive() and box == [None]
    assert time.monotonic() - start < 1.0


def test_close_says_how_many_publications_were_not_taken(broker_factory) -> None:
    """A publisher held back by a subscriber that reads nothing: close() cannot hand over
    everything, and says how many it could not (returned, counted in ``lost``, logged);
    every other publication reaches the subscriber once it reads."""
    # (a queue of 1 MiB: the least grant, two batches of 64 KiB, stays within a quarter)
    br = broker_factory("--bus-queue-bytes", str(1 << 20), "--bus-stall-timeout", "0")
    slow, pub = _node(br.router, "slow"), _node(br.router, "pub")
    try:
        slow.subscribe("t")
        # The SDK acknowledges what the caller took: not reading holds the publisher back.
        published = 0
        body = b"p" * 4096
        with pytest.raises(TimeoutError):
            while True:
                pub.publish("t", published.to_bytes(4, "big") + body, timeout=0.5)
                published += 1
        assert pub.unsent > 0
        dropped = pub.close(0.5)
        assert dropped > 0 and pub.lost == dropped
        assert pub.close() == 0  # idempotent
        got = []
        while True:
            m = slow.recv(timeout=2)
            if m is None:
                break
            got.append(int.from_bytes(m.payload[:4], "big"))
        assert got == list(range(len(got)))
        assert len(got) + dropped == published
        assert slow.lost == 0
    finally:
        slow.close(1)
        pub.close(0)


def test_fragments_of_topics_a_node_does_not_accept_are_never_held(broker: Broker) -> None:
    """A node that subscribes to everything and filters with ``accept``: fragments of a
    publication on another topic that never ends are dropped as they come (counted in
    ``ignored``), not hoarded; what it accepts arrives whole."""
    sink = _node(broker.router, "sink", accept=lambda t: t.startswith("wanted."),
                 max_partial_bytes=1 << 20)
    ctx = zmq.Context()
    spam = Node(ctx, broker.router, "spam")
    try:
        sink.subscribe("", prefix=True)
        chunk = b"h" * (64 * 1024)
        limit = spam.credit["limit"]
        for part in range(64):  # 4 MiB, four times max_partial_bytes, never completed
            while part + 1 > limit:
                limit = max(limit, spam.recv("PUBLISH_CREDIT")["limit"])
            spam.send("PUBLISH", {"seq": part + 1, "topic": "noise", "part": part,
                                  "more": True}, chunk)
        while spam.recv("PUBLISH_CREDIT")["acked"] < 64:
            pass
        friend = _node(broker.router, "friend")
        friend.publish("wanted.x", b"kept")
        friend.close(2)
        m = sink.recv(timeout=10)
        assert m is not None and (m.topic, m.payload) == ("wanted.x", b"kept")
        assert sink.ignored == 1 and sink.lost == 0  # one publication, none of it held
    finally:
        spam.close()
        ctx.term()
        sink.close(1)


def test_subscribe_refused_past_the_limit(broker_factory) -> None:
    br = broker_factory("--bus-max-subscriptions", "1")
    a = _node(br.router, "a")
    try:
        a.subscribe("one")
        with pytest.raises(BusError) as e:
            a.subscribe("two")
        assert e.value.code == 440
        assert a.subscriptions == [("one", False)]
    finally:
        a.close(2)


def test_retained_value_reaches_a_late_subscriber(nodes) -> None:
    learner, late = nodes("learner"), nodes("late")
    learner.publish("model_exchanger", b"weights v1", retain=True)
    learner.publish("model_exchanger", b"weights v2", retain=True)
    assert learner.flush(5)
    late.subscribe("model_exchanger", last=True)
    got = late.recv(timeout=5)
    assert got is not None and got.payload == b"weights v2" and got.retained


def test_a_cut_link_loses_nothing(broker: Broker) -> None:
    relay = Relay(broker.router_port)
    pub = _node(broker.router, "pub")
    sub = _node(relay.endpoint, "sub", heartbeat=1.0)
    try:
        sub.subscribe("t")
        for i in range(100):
            pub.publish("t", str(i).encode())
        first = [int(m.payload) for m in _recv_n(sub, 10)]
        relay.break_one()  # the subscriber's link breaks; it resumes its session
        for i in range(100, 200):
            pub.publish("t", str(i).encode())
        rest = [int(m.payload) for m in _recv_n(sub, 190)]
        assert first + rest == list(range(200))
        assert sub.lost == 0 and sub.sessions_lost == 0
    finally:
        pub.close(2)
        sub.close(2)
        relay.close()


def test_a_broker_restart_is_a_new_session_with_the_subscriptions_made_again(
        broker: Broker) -> None:
    pub = _node(broker.router, "pub", reconnect_max=0.2)
    sub = _node(broker.router, "sub", reconnect_max=0.2)
    try:
        sub.subscribe("t")
        pub.publish("t", b"before")
        assert sub.recv(timeout=5).payload == b"before"
        broker.kill()
        broker.start()
        assert wait_until(lambda: sub.sessions_lost == 1 and sub.state == "ready", 15)
        assert wait_until(lambda: pub.state == "ready", 15)
        # the subscription comes back by itself; publish until it is in force
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            pub.publish("t", b"after")
            got = sub.recv(timeout=0.2)
        assert got is not None and got.payload == b"after"
    finally:
        pub.close(2)
        sub.close(2)
