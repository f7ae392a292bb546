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
    s = Core(broker.router, "collector", "sess-1", rec, heartbeat=0.1,
                resources={"cpu": 2})
    assert s.state == "connecting"
    s.start()
    assert s.wait_for("ready", 10)
    assert s.token > 0 and s.welcomes == 1
    assert rec.threads == {"rlbus-io-sess-1"}
    # heartbeats keep it alive well past the broker's liveness window (3 x 100 ms)
    deadline = time.monotonic() + 1.0
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
