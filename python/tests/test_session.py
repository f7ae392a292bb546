"""The client core and its session layer against the real broker: it connects and heartbeats,
comes back by itself after a broker restart, waits out an id that is taken, runs posted calls
in order on its I/O thread, and closes promptly leaving no thread."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest

from conftest import Broker, wait_until
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
    s = Core(broker.router, "collector", "sess-1", rec, heartbeat_ms=100,
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
    s = Core(broker.router, "learner", "sess-2", rec, heartbeat_ms=100,
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
    a = Core(broker.router, "collector", "sess-3", Recorder(), heartbeat_ms=100)
    b = Core(broker.router, "collector", "sess-3", Recorder(), heartbeat_ms=100,
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
    (dict(heartbeat_ms=5), "heartbeat_ms"),
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
