"""The client core and its session layer against the real broker: it connects and heartbeats,
comes back by itself after a broker restart, waits out an id that is taken, runs posted calls
in order on its I/O thread, and closes promptly leaving no thread. And the heartbeat option of
the public constructors: seconds, with ``heartbeat_ms`` still accepted (and warned about)."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable, List

import pytest
import zmq

import rlbus
from conftest import Broker, wait_until
from rlbus import protocol as P
from rlbus._core import Core


class Recorder:
    def __init__(self) -> None:
        self.events: List[Any] = []
        self.threads: set = set()

    def on_ready(self, welcome: Any) -> None:
        self.threads.add(threading.current_thread().name)
        self.events.append(("ready", welcome["resumed"]))

    def on_state(self, state: str, detail: str) -> None:
        self.events.append(("state", state))

    def on_close(self) -> None:
        self.events.append(("close",))


def test_connects_heartbeats_and_closes_without_a_thread_left(broker: Broker) -> None:
    before = set(threading.enumerate())
    rec = Recorder()
    s = Core(broker.router, "collector", "sess-1", rec, heartbeat=0.3,
                resources={"cpu": 2})
    assert s.state == "connecting"
    s.start()
    assert s.wait_for("ready", 10)
    assert s.token > 0 and s.welcomes == 1
    assert rec.threads == {"rlbus-io-sess-1"}
    # heartbeats keep it alive well past the broker's liveness window (3 x 300 ms); the
    # interval leaves room for a busy machine's pauses, which a shorter one would mistake for
    # a silent broker
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert s.state == "ready"
        time.sleep(0.05)
    assert s.welcomes == 1
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 2.0
    assert s.state == "stopped" and rec.events[-2:] == [("close",), ("state", "stopped")]
    assert set(threading.enumerate()) - before == set()
    s.close()  # idempotent


def test_comes_back_by_itself_after_a_broker_restart(broker: Broker) -> None:
    rec = Recorder()
    s = Core(broker.router, "learner", "sess-2", rec, heartbeat=0.1,
                reconnect_min=0.05, reconnect_max=0.2)
    s.start()
    try:
        assert s.wait_for("ready", 10)
        first = s.token
        broker.kill()
        assert s.wait_for("reconnecting", 10), s.last_error
        broker.start()
        assert s.wait_for("ready", 15), s.last_error
        assert s.welcomes == 2 and s.token != first
        assert rec.events.count(("ready", False)) == 2  # the new broker began a new session
    finally:
        s.close()


def test_a_taken_id_is_retried_until_it_is_free(broker: Broker) -> None:
    a = Core(broker.router, "collector", "sess-3", Recorder(), heartbeat=0.1)
    b = Core(broker.router, "collector", "sess-3", Recorder(), heartbeat=0.1,
                reconnect_min=0.05, reconnect_max=0.2)
    a.start()
    try:
        assert a.wait_for("ready", 10)
        b.start()
        assert wait_until(lambda: "409" in b.last_error, 10), b.last_error
        assert b.state == "connecting"
        a.close()  # leaving frees the id at once
        assert b.wait_for("ready", 10), b.last_error
    finally:
        a.close()
        b.close()


def test_posted_calls_and_timers_run_in_order_on_the_io_thread(broker: Broker) -> None:
    s = Core(broker.router, "coordinator", "sess-4", Recorder())
    s.start()
    seen: List[Any] = []
    try:
        for i in range(200):
            assert s.post(lambda i=i: seen.append((i, threading.current_thread().name)))
        assert wait_until(lambda: len(seen) == 200, 10)
        assert [i for i, _ in seen] == list(range(200))
        assert {n for _, n in seen} == {"rlbus-io-sess-4"}
        fired: List[str] = []
        # "never" is due well before "late", and cancelled long before it is due: had the
        # cancel no effect, it would come second
        s.post(lambda: s.call_later(0.6, lambda: fired.append("late")))
        s.post(lambda: s.call_later(0.0, lambda: fired.append("soon")))
        cancelled = []
        s.post(lambda: cancelled.append(s.call_later(0.3, lambda: fired.append("never"))))
        assert wait_until(lambda: bool(cancelled), 5)
        s.post(cancelled[0].cancel)
        assert wait_until(lambda: len(fired) == 2, 5)
        assert fired == ["soon", "late"]
    finally:
        s.close()
    assert not s.post(lambda: None)  # closed: nothing more runs


@pytest.mark.parametrize("kwargs,name", [
    (dict(endpoint="localhost:7235"), "endpoint"),
    (dict(role="trainer"), "role"),
    (dict(id="has space"), "id"),
    (dict(heartbeat=0.005), "heartbeat"),
    (dict(resources={"gpu": -1}), "resources"),
    (dict(reconnect_min=0), "reconnect_min"),
    (dict(reconnect_min=2.0, reconnect_max=1.0), "reconnect_max"),
])
def test_bad_options_name_the_option(kwargs: dict, name: str) -> None:
    args = dict(endpoint="tcp://127.0.0.1:1", role="collector", id="ok-1")
    args.update(kwargs)
    endpoint, role, id_ = args.pop("endpoint"), args.pop("role"), args.pop("id")
    with pytest.raises(ValueError, match=name):
        Core(endpoint, role, id_, Recorder(), **args)


# ---- the heartbeat option of Worker and Coordinator ------------------------------------------

def make_peer(kind: str, endpoint: str, **kw: Any) -> Any:
    if kind == "worker":
        return rlbus.Worker(endpoint, role="collector", id="hb-w", run=lambda t: None, **kw)
    return rlbus.Coordinator(endpoint, id="hb-c", callbacks={}, **kw)


def hello_heartbeat(make: Callable[[str], Any]) -> int:
    """The heartbeat_ms of the HELLO that the peer ``make(endpoint)`` builds sends to a
    stand-in broker (a ROUTER that only listens)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    peer = make(f"tcp://127.0.0.1:{port}")
    try:
        assert router.poll(10000), "no HELLO within 10 s"
        frames = router.recv_multipart()
        hello = P.decode(frames[1:])
        assert hello.name == "HELLO"
        return hello["heartbeat_ms"]
    finally:
        peer.close()
        router.close()
        ctx.term()


@pytest.mark.parametrize("kind", ["worker", "coordinator"])
def test_heartbeat_is_given_in_seconds(kind: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns of nothing
        assert hello_heartbeat(lambda ep: make_peer(kind, ep, heartbeat=0.25)) == 250
        assert hello_heartbeat(lambda ep: make_peer(kind, ep)) == 1000  # 1 s by default


@pytest.mark.parametrize("kind", ["worker", "coordinator"])
def test_heartbeat_ms_still_works_and_warns(kind: str) -> None:
    with pytest.warns(DeprecationWarning, match="heartbeat_ms is deprecated") as seen:
        assert hello_heartbeat(lambda ep: make_peer(kind, ep, heartbeat_ms=250)) == 250
    assert seen[0].filename == __file__  # the warning points at the caller


@pytest.mark.parametrize("kind", ["worker", "coordinator"])
def test_heartbeat_and_heartbeat_ms_together_or_a_bad_heartbeat_ms_are_refused(
        kind: str) -> None:
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match="heartbeat and heartbeat_ms"):
        make_peer(kind, "tcp://127.0.0.1:1", heartbeat=0.5, heartbeat_ms=500)
    for bad in (5, 0.5, "500"):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="heartbeat_ms: expected an integer"):
                make_peer(kind, "tcp://127.0.0.1:1", heartbeat_ms=bad)
        assert [w.category for w in seen] == [DeprecationWarning]
    with pytest.raises(ValueError, match="heartbeat: expected a number of seconds"):
        make_peer(kind, "tcp://127.0.0.1:1", heartbeat=601)
    assert set(threading.enumerate()) <= before


# ---- a group of brokers, played by stand-ins -------------------------------------------------

def test_a_standby_sends_the_client_to_the_leader_and_an_older_leadership_is_refused() -> None:
    """A stand-in standby names a leader; the client goes there and is welcomed. A refusal
    naming an older leadership is not followed, and a WELCOME under an older leadership than
    one seen is not taken (SPEC §4.2.2, §14.9.2)."""
    ctx = zmq.Context()
    made: List[Any] = []

    def router() -> tuple:
        s = ctx.socket(zmq.ROUTER)
        s.linger = 0
        made.append(s)
        return s, f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}"

    def next_message(s: Any, name: str) -> bytes:
        """The routing id of the next message ``name`` on stand-in ``s`` (others skipped)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if s.poll(100):
                frames = s.recv_multipart()
                if P.decode(frames[1:]).name == name:
                    return frames[0]
        raise AssertionError(f"no {name} within 20 s")

    def answer(s: Any, to: bytes, name: str, fields: dict) -> None:
        s.send_multipart([to] + list(P.encode(name, fields)))

    def welcome(epoch: int) -> dict:
        return {"session": 1, "epoch": 99, "heartbeat_ms": 1000, "liveness": 3,
                "max_message": 1 << 20, "resumed": False, "leader_epoch": epoch}

    standby, standby_ep = router()
    leader, leader_ep = router()
    old, old_ep = router()
    # A long heartbeat: a HELLO left unanswered keeps last_error for a long while.
    c = rlbus.Coordinator(standby_ep, id="c", callbacks={}, heartbeat=30.0, reconnect_min=0.05,
                          reconnect_max=0.2)
    try:
        answer(standby, next_message(standby, "HELLO"), "ERROR",
               {"code": 421, "reason": "standby", "ref_type": 1, "leader": leader_ep,
                "leader_epoch": 7})
        answer(leader, next_message(leader, "HELLO"), "WELCOME", welcome(7))
        assert wait_until(lambda: c.state == "ready", 20), c.last_error

        # A deposed leader's refusal names an older leadership: the client goes back to its
        # list instead.
        answer(leader, next_message(leader, "HEARTBEAT"), "ERROR",
               {"code": 421, "reason": "deposed", "ref_type": 3, "leader": old_ep,
                "leader_epoch": 5})
        to = next_message(standby, "HELLO")
        assert wait_until(lambda: "421 NOT_LEADER: deposed" in c.last_error, 20)

        # A later leadership named, but its WELCOME is of an older one: not taken.
        answer(standby, to, "ERROR", {"code": 421, "reason": "standby", "ref_type": 1,
                                      "leader": old_ep, "leader_epoch": 9})
        answer(old, next_message(old, "HELLO"), "WELCOME", welcome(8))
        next_message(standby, "HELLO")  # back to the list
        assert c.state != "ready"
        assert "older than 9" in c.last_error
    finally:
        c.close()
        for s in made:
            s.close()
        ctx.term()
