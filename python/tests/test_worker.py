"""The Python Worker against the real broker, with the other side played by a raw DEALER
coordinator speaking the codec (SUBMIT, TASK_EVENT, FINISH, CANCEL, ACK, DATA_REPLY)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import zmq

from conftest import PYTHON_DIR, Broker, wait_until
from relay import Relay
from rlbus import protocol as P
from rlbus._types import Policy, TaskFailure
from rlbus.worker import Task, Worker

FAST = {"heartbeat": 0.2, "reconnect_min": 0.02, "reconnect_max": 0.2}


class Coord:
    """A coordinator made of one DEALER socket: submits tasks and collects their events."""

    def __init__(self, broker: Broker, id: str = "coord-1", windowed: bool = False) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(broker.router)
        self.events: List[P.Message] = []
        self.submitted: Dict[str, P.Message] = {}
        self.others: List[P.Message] = []
        self.batches = 0  # data_batch events received
        # a long heartbeat: this coordinator may stay silent for the whole test
        self.send("HELLO", {"role": "coordinator", "id": id, "heartbeat_ms": 60000})
        assert self.wait(lambda: any(m.name == "WELCOME" for m in self.others)), "no WELCOME"
        if windowed:
            self.send("REPLAY", {"from_seq": 1})

    def send(self, name: str, fields: Dict[str, Any]) -> None:
        self.sock.send_multipart(list(P.encode(name, fields)))

    def pump(self, timeout: float = 0.02) -> None:
        if not self.sock.poll(int(timeout * 1000)):
            return
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            m = P.decode(frames)
            if m.name == "TASK_EVENT" and m["event"] == "data_batch":
                # recorded as the `data` events its items stand for (SPEC §12.12.6)
                self.batches += 1
                for item in m["body"].value()["items"]:
                    self.events.append(P.Message(m.name, m.type_id, dict(
                        m.fields, event="data", body=P.Raw.of(item))))
            elif m.name == "TASK_EVENT":
                self.events.append(m)
            elif m.name == "SUBMITTED":
                self.submitted[m["task_id"]] = m
            else:
                self.others.append(m)

    def wait(self, cond: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() >= deadline:
                return False
            self.pump()
        return True

    def submit(self, task_id: str, kind: str, info: Optional[dict] = None, **opts: Any) -> None:
        self.send("SUBMIT", dict({"task_id": task_id, "kind": kind,
                                  "task_info": P.Raw.of(info or {})}, **opts))
        assert self.wait(lambda: task_id in self.submitted)
        assert self.submitted[task_id]["accepted"], self.submitted[task_id].fields

    def of(self, task_id: str, event: Optional[str] = None) -> List[P.Message]:
        return [m for m in self.events if m["task_id"] == task_id
                and (event is None or m["event"] == event)]

    def names(self, task_id: str) -> List[str]:
        return [m["event"] for m in self.of(task_id)]

    def has(self, task_id: str, event: str, n: int = 1) -> Callable[[], bool]:
        return lambda: len(self.of(task_id, event)) >= n

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def body(m: P.Message) -> Any:
    return m["body"].value()


@pytest.fixture
def coord_factory():
    made: List[Coord] = []

    def make(broker: Broker, **kw: Any) -> Coord:
        c = Coord(broker, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


@pytest.fixture
def workers():
    made: List[Worker] = []

    def make(*args: Any, **kw: Any) -> Worker:
        w = Worker(*args, **kw)
        made.append(w)
        return w
    yield make
    for w in made:
        w.close()


def commands_run(cmds: "queue.Queue[Callable[[Task], Any]]", seen: List[Task]) -> Callable:
    """A run handler that executes the test's commands on the handler thread until stopped."""
    def run(task: Task) -> None:
        seen.append(task)
        while not task.stop_requested:
            try:
                fn = cmds.get(timeout=0.02)
            except queue.Empty:
                continue
            fn(task)
    return run


# ---- options and lifecycle ---------------------------------------------------------------

@pytest.mark.parametrize("kw, name", [
    ({"role": "coordinator"}, "role"),
    ({"run": None}, "run"),
    ({"close": 5}, "close"),
    ({"on_policy": "x"}, "on_policy"),
    ({"max_unconfirmed_data": 0}, "max_unconfirmed_data"),
    ({"max_unconfirmed_bytes": -1}, "max_unconfirmed_bytes"),
    ({"endpoint": "nowhere"}, "endpoint"),
    ({"id": "bad id"}, "id"),
    ({"heartbeat": 0.005}, "heartbeat"),
    ({"resources": {"gpu": -1}}, "resources"),
    ({"reconnect_min": 0}, "reconnect_min"),
])
def test_bad_options_raise_value_error_naming_the_option(kw: dict, name: str) -> None:
    before = set(threading.enumerate())
    args = dict({"endpoint": "tcp://127.0.0.1:1", "role": "collector", "id": "w-bad",
                 "run": lambda t: None}, **kw)
    with pytest.raises(ValueError, match=name):
        Worker(**args)
    assert set(threading.enumerate()) <= before


def test_constructor_does_not_wait_for_a_broker_and_close_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    w = Worker("tcp://127.0.0.1:1", "learner", "w-nobody", run=lambda t: None)
    assert w.state == "connecting"
    w.close()
    w.close()  # idempotent
    assert w.state == "stopped"
    assert set(threading.enumerate()) <= before


def test_close_stops_a_running_handler_promptly_and_joins_its_threads(
        broker: Broker, coord_factory) -> None:
    before = set(threading.enumerate())
    coord = coord_factory(broker)
    seen: Dict[str, Any] = {}
    closes: List[Task] = []

    def run(task: Task) -> None:
        seen["thread"] = threading.current_thread().name
        seen["stopped"] = task.wait_stop(60)

    w = Worker(broker.router, "collector", "w-close", run=run, close=closes.append,
               on_policy=lambda t, p: None, **FAST)
    with w:
        assert w.wait_for("ready", 10)
        assert w.welcomes == 1 and w.session != 0
        coord.submit("t-close", "collector")
        assert coord.wait(coord.has("t-close", "started"))
        assert wait_until(lambda: "thread" in seen)
        t0 = time.monotonic()
        w.close()
        assert time.monotonic() - t0 < 5.0
    assert seen["stopped"] is True
    assert seen["thread"].startswith("rlbus-handler-")
    assert closes == []
    assert w.state == "stopped"
    assert set(threading.enumerate()) <= before
    # the broker saw the worker leave: the attempt ended and the task went back to the queue
    assert coord.wait(coord.has("t-close", "requeued"))
    assert "lost" in body(coord.of("t-close", "requeued")[0])["reason"]


# ---- collector ---------------------------------------------------------------------------

def test_collector_task_reports_data_info_and_result_in_order(
        broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}

    def run(task: Task) -> None:
        got.update(id=task.id, attempt=task.attempt, kind=task.kind, info=task.info,
                   policy=task.policy())
        assert task.emit_data("d0", "buf", {"env_id": 0, 7: "int key"})
        assert task.emit_data("d1", "buf", {"env_id": 1}, b"\x00\xffpayload")
        assert task.emit_data("d2", "other", {"env_id": 2})
        assert task.emit_info({"collector_done": True, "n": 3})
        got["stopped"] = task.wait_stop(10)
        got["aborted"] = task.aborted

    def close(task: Task) -> dict:
        got["close_thread"] = threading.current_thread().name
        return {"total": 3, 1: "x"}

    w = workers(broker.router, "collector", "w-col", run=run, close=close, **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-col", "collector", {"buffer_id": "buf", 42: [1, 2.5]})
    assert coord.wait(coord.has("t-col", "info"))
    coord.send("FINISH", {"task_id": "t-col"})
    assert coord.wait(coord.has("t-col", "finished"))
    assert coord.names("t-col") == ["assigned", "started", "data", "data", "data", "info",
                                    "finished"]
    data = [body(m) for m in coord.of("t-col", "data")]
    assert [d["data_id"] for d in data] == ["d0", "d1", "d2"]
    assert [d["buffer_id"] for d in data] == ["buf", "buf", "other"]
    assert data[0]["meta"] == {"env_id": 0, 7: "int key"}
    assert "payload" not in data[0] and data[1]["payload"] == b"\x00\xffpayload"
    assert body(coord.of("t-col", "info")[0]) == {"collector_done": True, "n": 3}
    assert body(coord.of("t-col", "finished")[0]) == {"total": 3, 1: "x"}
    assert got["id"] == "t-col" and got["attempt"] == 1 and got["kind"] == "collector"
    assert got["info"] == {"buffer_id": "buf", 42: [1, 2.5]}
    assert got["policy"] is None
    assert got["stopped"] is True and got["aborted"] is False
    assert got["close_thread"].startswith("rlbus-handler-")


def nested(levels: int) -> Dict[str, Any]:
    top: Dict[str, Any] = {}
    cur = top
    for _ in range(levels - 1):
        cur["x"] = {}
        cur = cur["x"]
    return top


def test_user_data_past_the_brokers_limits_raises_and_costs_nothing(
        broker_factory, coord_factory, workers) -> None:
    """What the broker would refuse (nesting past SPEC 5.1, a body past max-message) is a
    ValueError in the caller: nothing is sent, no index is used, the session is not
    counted against, and what comes next arrives."""
    broker = broker_factory("--max-message", "8192")
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            got[name] = fn()
        except ValueError as e:
            got[name] = "ValueError: " + str(e)

    def run(task: Task) -> None:
        attempt("ok14", lambda: task.emit_data("d-ok", "buf", nested(14)))
        # one level more than the data event can carry (SPEC 12.2.3.1), then past SPEC 5.1
        attempt("relayed", lambda: task.emit_data("d-15", "buf", nested(15)))
        attempt("deep", lambda: task.emit_data("d-deep", "buf", nested(16)))
        attempt("big", lambda: task.emit_data("d-big", "buf", {}, b"x" * 9000))
        attempt("info", lambda: task.emit_info({"deep": nested(16)}))
        attempt("next", lambda: task.emit_data("d-next", "buf", {"i": 2}))
        task.emit_info({"collector_done": True})
        task.wait_stop(10)

    w = workers(broker.router, "collector", "w-limits", run=run,
                close=lambda t: {"r": nested(16)}, **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-limits", "collector", max_attempts=1)
    assert coord.wait(coord.has("t-limits", "info"))
    assert got["ok14"] is True and got["next"] is True
    assert got["relayed"].startswith("ValueError: 402 BAD_FIELD: DATA: meta nests 15 levels")
    assert got["deep"].startswith("ValueError: meta: msgpack nesting too deep")
    assert got["big"].startswith("ValueError: DATA: ") and "max-message of 8192" in got["big"]
    assert got["info"].startswith("ValueError: info: msgpack nesting too deep")
    data = [body(m) for m in coord.of("t-limits", "data")]
    assert [d["data_id"] for d in data] == ["d-ok", "d-next"]
    # a close() result the broker would refuse fails the attempt, saying why
    coord.send("FINISH", {"task_id": "t-limits"})
    assert coord.wait(coord.has("t-limits", "failed"))
    assert "close() result: msgpack nesting too deep" in body(
        coord.of("t-limits", "failed")[0])["reason"]
    assert not any("refused a message" in line for line in broker.lines)
    assert w.state == "ready" and w.welcomes == 1


def test_emit_data_waits_for_credit_while_the_coordinator_lags(
        broker_factory, coord_factory, workers) -> None:
    broker = broker_factory("--stream-window", "8")
    coord = coord_factory(broker, windowed=True)  # an acknowledging coordinator: credit applies
    n = 30
    results: List[bool] = []

    def run(task: Task) -> None:
        for i in range(n):
            results.append(task.emit_data(f"d{i}", "buf", {"i": i}))
        task.emit_info({"collector_done": True})
        task.wait_stop(20)

    w = workers(broker.router, "collector", "w-credit", run=run, **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-credit", "collector")
    # without ACKs the collector runs out of credit and waits (a first wait can come before
    # the broker's first credit reaches the worker: data must have flowed as well)
    assert coord.wait(lambda: w.credit_waits >= 1 and coord.has("t-credit", "data")())
    coord.pump(0.2)
    held_back = len(coord.of("t-credit", "data"))
    assert 0 < held_back < n
    while not coord.has("t-credit", "info")():
        assert coord.wait(lambda: bool(coord.events)), "stream stalled"
        coord.send("ACK", {"seq": coord.events[-1]["seq"]})
        before = len(coord.events)
        coord.wait(lambda: len(coord.events) > before, 5.0)
    assert results == [True] * n
    assert [body(m)["data_id"] for m in coord.of("t-credit", "data")] == \
        [f"d{i}" for i in range(n)]


def test_resumed_session_resends_unconfirmed_data_without_duplicates(
        broker_factory, coord_factory, workers) -> None:
    # a liveness of 4 x 500 ms: the worker gives the silent link up after 1.5 s and
    # resumes before the broker would expire its session at 2 s
    broker = broker_factory("--liveness", "4")
    proxy = Relay(broker.router_port)
    try:
        coord = coord_factory(broker)
        cmds: "queue.Queue[Callable[[Task], Any]]" = queue.Queue()
        seen: List[Task] = []
        w = workers(proxy.endpoint, "collector", "w-resend", run=commands_run(cmds, seen),
                    heartbeat=0.5, reconnect_min=0.02, reconnect_max=0.1)
        assert w.wait_for("ready", 10)
        token = w.session
        coord.submit("t-resend", "collector")
        assert coord.wait(coord.has("t-resend", "started"))
        sent: "queue.Queue[bool]" = queue.Queue()
        for i in range(1, 4):
            cmds.put(lambda t, i=i: sent.put(t.emit_data(f"d{i}", "buf", {"i": i})))
        assert coord.wait(coord.has("t-resend", "data", 3))
        proxy.freeze()
        for i in range(4, 7):
            cmds.put(lambda t, i=i: sent.put(t.emit_data(f"d{i}", "buf", {"i": i})))
        assert [sent.get(timeout=5) for _ in range(6)] == [True] * 6
        assert wait_until(lambda: proxy.swallowed > 0)  # d4..d6 went into the cut link
        assert wait_until(lambda: w.welcomes >= 2, 10)
        assert w.session == token  # resumed, not a new session
        assert coord.wait(coord.has("t-resend", "data", 6))
        coord.pump(0.3)
        ids = [body(m)["data_id"] for m in coord.of("t-resend", "data")]
        assert ids == [f"d{i}" for i in range(1, 7)]
        assert w.data_resent >= 3
        assert w.data_dropped == 0
        assert not coord.of("t-resend", "data_lost")
        assert not seen[0].aborted
    finally:
        proxy.close()


class CutLink:
    """A broker (liveness 4 x 500 ms), a raw coordinator connected directly, and a relay the
    worker connects through: a worker that gives up a silent link after 1.5 s resumes its
    session before the broker would expire it at 2 s."""

    def __init__(self, coord: Coord, proxy: Relay, workers: Any) -> None:
        self.coord, self.proxy, self._workers = coord, proxy, workers

    def worker(self, role: str, worker_id: str, **handlers: Any) -> Worker:
        w = self._workers(self.proxy.endpoint, role, worker_id, heartbeat=0.5,
                          reconnect_min=0.02, reconnect_max=0.1, **handlers)
        assert w.wait_for("ready", 10)
        return w


@pytest.fixture
def cut_link(broker_factory, coord_factory, workers) -> Iterator[CutLink]:
    broker = broker_factory("--liveness", "4")
    proxy = Relay(broker.router_port)
    try:
        yield CutLink(coord_factory(broker), proxy, workers)
    finally:
        proxy.close()


def test_a_started_or_result_lost_in_a_cut_link_is_sent_again_and_costs_no_attempt(
        cut_link: CutLink) -> None:
    proxy, coord = cut_link.proxy, cut_link.coord
    freezes = []

    def run(task: Task) -> None:
        proxy.freeze()  # swallows the STARTED when the run begins before it left
        freezes.append("run")
        task.wait_stop(30)

    def close(task: Task) -> Dict[str, Any]:
        proxy.freeze()  # swallows the RESULT for sure
        freezes.append("close")
        return {"done": True}

    w = cut_link.worker("collector", "w-decide", run=run, close=close)
    token = w.session
    coord.submit("t-decide", "collector", max_attempts=1)  # a lost attempt fails it
    assert coord.wait(coord.has("t-decide", "started"), 15)
    coord.send("FINISH", {"task_id": "t-decide"})
    assert coord.wait(coord.has("t-decide", "finished"), 15)
    assert freezes == ["run", "close"]
    # back after each freeze, resumed (the resend can beat the count of its WELCOME)
    assert wait_until(lambda: w.welcomes >= 3, 30) and w.session == token
    assert coord.names("t-decide") == ["assigned", "started", "finished"]
    assert body(coord.of("t-decide", "finished")[0]) == {"done": True}


def test_an_info_lost_in_a_cut_link_is_sent_again(cut_link: CutLink) -> None:
    proxy, coord = cut_link.proxy, cut_link.coord

    def run(task: Task) -> None:
        task.emit_data("d0", "buf", {})
        proxy.freeze()  # the INFO goes into a connection that drops it
        task.emit_info({"collector_done": True})
        task.wait_stop(30)

    w = cut_link.worker("collector", "w-info", run=run)
    coord.submit("t-info", "collector", max_attempts=1)
    # without the resend the INFO never comes: nothing would close the task
    assert coord.wait(coord.has("t-info", "info"), 15)
    coord.send("FINISH", {"task_id": "t-info"})
    assert coord.wait(coord.has("t-info", "finished"), 15)
    assert coord.names("t-info") == ["assigned", "started", "data", "info", "finished"]
    assert body(coord.of("t-info", "info")[0]) == {"collector_done": True}
    assert wait_until(lambda: w.welcomes >= 2 and w.data_resent >= 1, 30)


def test_a_learn_info_lost_in_a_cut_link_is_sent_again(cut_link: CutLink) -> None:
    proxy, coord = cut_link.proxy, cut_link.coord

    def run(task: Task) -> None:
        task.emit_learn_info("buf", {"learner_step": 1})
        proxy.freeze()  # the next LEARN_INFO goes into a connection that drops it
        task.emit_learn_info("buf", {"learner_step": 2})
        task.wait_stop(30)

    w = cut_link.worker("learner", "l-info", run=run)
    coord.submit("t-learn", "learner", max_attempts=1)
    assert coord.wait(coord.has("t-learn", "learn_info", 2), 15)
    coord.pump(0.2)
    steps = [body(m)["info"]["learner_step"] for m in coord.of("t-learn", "learn_info")]
    assert steps == [1, 2]  # once each, in order
    assert wait_until(lambda: w.welcomes >= 2, 30)


def test_data_let_go_of_past_the_bound_is_declared_lost_on_resume(
        broker_factory, coord_factory, workers) -> None:
    broker = broker_factory("--liveness", "4")
    proxy = Relay(broker.router_port)
    try:
        coord = coord_factory(broker)
        cmds: "queue.Queue[Callable[[Task], Any]]" = queue.Queue()
        w = workers(proxy.endpoint, "collector", "w-lost", run=commands_run(cmds, []),
                    heartbeat=0.5, reconnect_min=0.02, reconnect_max=0.1,
                    max_unconfirmed_data=2)
        assert w.wait_for("ready", 10)
        coord.submit("t-lost", "collector")
        assert coord.wait(coord.has("t-lost", "started"))
        done: "queue.Queue[bool]" = queue.Queue()
        for i in range(1, 4):
            cmds.put(lambda t, i=i: done.put(t.emit_data(f"d{i}", "buf", {"i": i})))
        assert coord.wait(coord.has("t-lost", "data", 3))
        proxy.freeze()
        for i in range(4, 7):
            cmds.put(lambda t, i=i: done.put(t.emit_data(f"d{i}", "buf", {"i": i})))
        assert [done.get(timeout=5) for _ in range(6)] == [True] * 6
        # only d5 and d6 are still kept; d4 was let go of before the broker confirmed it
        assert wait_until(lambda: w.data_dropped == 4)
        assert wait_until(lambda: w.welcomes >= 2, 10)
        assert coord.wait(coord.has("t-lost", "data", 5))
        coord.pump(0.3)
        steps = [(m["event"], body(m)) for m in coord.of("t-lost")
                 if m["event"] in ("data", "data_lost")]
        assert [s[1].get("data_id") for s in steps if s[0] == "data"] == \
            ["d1", "d2", "d3", "d5", "d6"]
        assert ("data_lost", {"first_index": 4, "last_index": 4}) in steps
        assert [s[0] for s in steps] == ["data"] * 3 + ["data_lost"] + ["data"] * 2
    finally:
        proxy.close()


# ---- learner -----------------------------------------------------------------------------

def test_learner_get_data_gets_the_coordinators_batch_and_none_on_timeout(
        broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}

    def run(task: Task) -> None:
        got["first"] = task.get_data("buf", 4, 7, timeout=10)
        t0 = time.monotonic()
        got["unanswered"] = task.get_data("buf", 4, 8, timeout=0.3)
        got["unanswered_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        got["long_hint"] = task.get_data("buf", 4, 9, timeout=0.5)
        got["long_hint_s"] = time.monotonic() - t0
        assert task.emit_learn_info("buf", {"learner_done": True, "iter": 9})
        task.wait_stop(10)

    w = workers(broker.router, "learner", "w-learn", run=run, close=lambda t: {"ok": True},
                **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-learn", "learner")
    assert coord.wait(coord.has("t-learn", "data_request"))
    req = body(coord.of("t-learn", "data_request")[0])
    assert (req["buffer_id"], req["batch_size"], req["cur_learner_iter"]) == ("buf", 4, 7)
    # no data yet, ask again in 50 ms: the learner asks again by itself
    coord.send("DATA_REPLY", {"task_id": "t-learn", "request_id": req["request_id"],
                              "data": P.NIL, "retry_ms": 50})
    assert coord.wait(coord.has("t-learn", "data_request", 2))
    req2 = body(coord.of("t-learn", "data_request")[1])
    assert req2["cur_learner_iter"] == 7 and req2["request_id"] != req["request_id"]
    batch = {"obs": [1, 2, 3], 5: "int key"}
    coord.send("DATA_REPLY", {"task_id": "t-learn", "request_id": req2["request_id"],
                              "data": P.Raw.of(batch)})
    # the second request is left unanswered: None after its timeout
    assert coord.wait(coord.has("t-learn", "data_request", 3))
    assert body(coord.of("t-learn", "data_request")[2])["cur_learner_iter"] == 8
    # the third gets "no data, ask in a minute": the call still ends at its own timeout
    assert coord.wait(coord.has("t-learn", "data_request", 4))
    req4 = body(coord.of("t-learn", "data_request")[3])
    coord.send("DATA_REPLY", {"task_id": "t-learn", "request_id": req4["request_id"],
                              "data": P.NIL, "retry_ms": 60000})
    assert coord.wait(coord.has("t-learn", "learn_info"))
    assert got["first"] == batch
    assert got["unanswered"] is None and got["unanswered_s"] >= 0.3
    assert got["long_hint"] is None and got["long_hint_s"] < 1.9  # not the 2 s cap, nor 60 s
    assert len(coord.of("t-learn", "data_request")) == 4
    assert body(coord.of("t-learn", "learn_info")[0]) == \
        {"buffer_id": "buf", "info": {"learner_done": True, "iter": 9}}
    coord.send("FINISH", {"task_id": "t-learn"})
    assert coord.wait(coord.has("t-learn", "finished"))
    assert body(coord.of("t-learn", "finished")[0]) == {"ok": True}


# ---- failures and aborts -----------------------------------------------------------------

def test_exceptions_from_run_and_close_fail_the_attempt_with_reason_and_result(
        broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)

    def run(task: Task) -> None:
        if task.id == "t-fail":
            if task.attempt == 1:
                raise TaskFailure("env crashed", {"steps": 3, 9: "int key"})
            raise ValueError("boom")
        task.emit_info({"collector_done": True})
        task.wait_stop(10)

    def close(task: Task) -> dict:
        raise TaskFailure("close went wrong", {"partial": 1})

    w = workers(broker.router, "collector", "w-fail", run=run, close=close, **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-fail", "collector", max_attempts=2)
    assert coord.wait(coord.has("t-fail", "failed"))
    requeued = body(coord.of("t-fail", "requeued")[0])
    assert requeued == {"reason": "worker reported: env crashed", "attempt": 1,
                        "result": {"steps": 3, 9: "int key"}}
    failed = body(coord.of("t-fail", "failed")[0])
    assert failed == {"reason": "worker reported: boom", "attempt": 2}

    coord.submit("t-close-fail", "collector", max_attempts=1)
    assert coord.wait(coord.has("t-close-fail", "info"))
    coord.send("FINISH", {"task_id": "t-close-fail"})
    assert coord.wait(coord.has("t-close-fail", "failed"))
    assert body(coord.of("t-close-fail", "failed")[0]) == {
        "reason": "worker reported: close went wrong", "attempt": 1, "result": {"partial": 1}}


def cancel_once_started(coord: Coord, task_id: str, kind: str,
                        began: Callable[[], bool]) -> None:
    """Submits `task_id`, cancels it ("enough") once its worker has started it and its
    handler has begun (`began`: a task aborted before that never reaches its handler), and
    waits for the cancel to be reported."""
    coord.submit(task_id, kind)
    assert coord.wait(coord.has(task_id, "started"))
    assert wait_until(began, 10), "the handler did not begin"
    coord.send("CANCEL", {"task_id": task_id, "reason": "enough"})
    assert coord.wait(coord.has(task_id, "cancelled"))


def test_abort_stops_run_skips_close_and_frees_the_worker(
        broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}
    closes: List[str] = []

    def run(task: Task) -> None:
        if task.id != "t-abort":
            task.emit_info({"second": True})
            task.wait_stop(10)
            return
        got["began"] = True
        got["stopped"] = task.wait_stop(30)
        got["aborted"], got["reason"] = task.aborted, task.abort_reason
        got["emit"] = task.emit_data("late", "buf", {})
        got["info"] = task.emit_info({"late": True})
        got["alive"] = task.keep_alive()

    w = workers(broker.router, "collector", "w-abort", run=run,
                close=lambda t: closes.append(t.id), **FAST)
    assert w.wait_for("ready", 10)
    cancel_once_started(coord, "t-abort", "collector", lambda: "began" in got)
    assert wait_until(lambda: "alive" in got)
    assert got["stopped"] is True and got["aborted"] is True
    assert got["reason"] == "cancelled: enough"
    assert got["emit"] is False and got["info"] is False and got["alive"] is False
    # the worker takes the next task; the aborted one was never closed
    coord.submit("t-next", "collector")
    assert coord.wait(coord.has("t-next", "info"))
    coord.send("FINISH", {"task_id": "t-next"})
    assert coord.wait(coord.has("t-next", "finished"))
    assert closes == ["t-next"]
    assert coord.names("t-abort") == ["assigned", "started", "cancelled"]


def test_an_aborted_learner_gets_no_batch_at_once(broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}

    def run(task: Task) -> None:
        got["began"] = True
        got["stopped"] = task.wait_stop(30)
        t0 = time.monotonic()
        got["get_data"] = task.get_data("buf", 1, 0, timeout=30)
        got["get_data_s"] = time.monotonic() - t0
        got["learn_info"] = task.emit_learn_info("buf", {"late": True})

    w = workers(broker.router, "learner", "w-abort-l", run=run, **FAST)
    assert w.wait_for("ready", 10)
    cancel_once_started(coord, "t-abort-l", "learner", lambda: "began" in got)
    assert wait_until(lambda: "learn_info" in got)
    assert got["stopped"] is True
    assert got["get_data"] is None and got["get_data_s"] < 5.0
    assert got["learn_info"] is False
    assert coord.names("t-abort-l") == ["assigned", "started", "cancelled"]


def test_keep_alive_holds_off_the_step_timeout(broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}

    def run(task: Task) -> None:
        if task.info["keep"]:
            # a first step that takes 2.5 s against a step timeout of 1 s
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline and not task.stop_requested:
                assert task.keep_alive()
                task.wait_stop(0.1)
            task.emit_info({"collector_done": True})
            task.wait_stop(10)
        else:
            got["stopped"] = task.wait_stop(30)
            got["reason"] = task.abort_reason

    w = workers(broker.router, "collector", "w-alive", run=run, **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-alive", "collector", {"keep": True}, step_timeout_ms=1000, max_attempts=1)
    assert coord.wait(coord.has("t-alive", "info"))
    coord.send("FINISH", {"task_id": "t-alive"})
    assert coord.wait(coord.has("t-alive", "finished"))
    assert coord.names("t-alive") == ["assigned", "started", "info", "finished"]
    # the same silence without keep_alive times out
    coord.submit("t-silent", "collector", {"keep": False}, step_timeout_ms=1000,
                 max_attempts=1)
    assert coord.wait(coord.has("t-silent", "failed"))
    assert body(coord.of("t-silent", "failed")[0])["reason"] == "step timeout"
    assert wait_until(lambda: "reason" in got)
    assert got["stopped"] is True and got["reason"] == "step timeout"


# ---- policies ----------------------------------------------------------------------------

def test_policy_update_reaches_on_policy_and_task_policy(
        broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    updates: List[Any] = []
    cmds: "queue.Queue[Callable[[Task], Any]]" = queue.Queue()
    col_tasks: List[Task] = []

    def on_policy(task: Task, policy: Policy) -> None:
        updates.append((task.id, policy, threading.current_thread().name))

    def learn(task: Task) -> None:
        assert task.publish_policy("pol", 1, ref="ckpt-1")
        assert task.publish_policy("pol", 2, params=b"\x00\x01")
        task.emit_learn_info("buf", {"published": 2})
        task.wait_stop(10)

    col = workers(broker.router, "collector", "w-pol-c", run=commands_run(cmds, col_tasks),
                  on_policy=on_policy, **FAST)
    lrn = workers(broker.router, "learner", "w-pol-l", run=learn, **FAST)
    assert col.wait_for("ready", 10) and lrn.wait_for("ready", 10)
    coord.submit("t-pol-c", "collector", policy_id="pol")
    assert coord.wait(coord.has("t-pol-c", "started"))
    assert wait_until(lambda: bool(col_tasks))
    assert col_tasks[0].policy() is None  # no version held when it started
    coord.submit("t-pol-l", "learner")
    assert coord.wait(coord.has("t-pol-l", "learn_info"))
    assert wait_until(lambda: any(u[1].version == 2 for u in updates))
    assert col_tasks[0].policy() == Policy("pol", 2, None, b"\x00\x01")
    assert all(u[0] == "t-pol-c" for u in updates)
    assert all(not u[2].startswith("rlbus-io-") for u in updates)
    assert [u[1].version for u in updates] in ([1, 2], [2])
    if len(updates) == 2:
        assert updates[0][1] == Policy("pol", 1, "ckpt-1", None)
    # data emitted from now on is tagged with the version
    cmds.put(lambda t: t.emit_data("after", "buf", {}))
    assert coord.wait(coord.has("t-pol-c", "data"))
    assert body(coord.of("t-pol-c", "data")[0])["policy_version"] == 2
    # a later attempt starts with the held version
    coord.send("CANCEL", {"task_id": "t-pol-c", "reason": "again"})
    assert coord.wait(coord.has("t-pol-c", "cancelled"))
    coord.submit("t-pol-c2", "collector", policy_id="pol")
    assert wait_until(lambda: len(col_tasks) == 2)
    assert col_tasks[1].policy() == Policy("pol", 2, None, b"\x00\x01")


# ---- reconnects --------------------------------------------------------------------------

def test_worker_reconnects_to_a_restarted_broker_and_takes_new_tasks(
        broker: Broker, coord_factory, workers) -> None:
    got: Dict[str, Any] = {}

    def run(task: Task) -> None:
        if task.id == "t-before":
            got["stopped"] = task.wait_stop(30)
            got["aborted"] = task.aborted
            return
        task.emit_info({"after_restart": True})
        task.wait_stop(10)

    w = workers(broker.router, "collector", "w-restart", run=run, **FAST)
    assert w.wait_for("ready", 10)
    coord = coord_factory(broker, id="coord-a")
    coord.submit("t-before", "collector")
    assert coord.wait(coord.has("t-before", "started"))
    broker.kill()
    broker.start()
    # the new broker does not know the old session: the worker starts a new one, and the
    # task that ran under the old one is over
    assert wait_until(lambda: w.welcomes >= 2 and w.state == "ready", 15)
    assert wait_until(lambda: "aborted" in got)
    assert got["stopped"] is True and got["aborted"] is True
    coord2 = coord_factory(broker, id="coord-b")
    coord2.submit("t-after", "collector")
    assert coord2.wait(coord2.has("t-after", "info"))
    coord2.send("FINISH", {"task_id": "t-after"})
    assert coord2.wait(coord2.has("t-after", "finished"))


def test_an_abort_lost_with_the_connection_does_not_keep_the_worker_busy(
        broker_factory, coord_factory, workers) -> None:
    broker = broker_factory("--liveness", "4")
    proxy = Relay(broker.router_port)
    try:
        coord = coord_factory(broker)
        cmds: "queue.Queue[Callable[[Task], Any]]" = queue.Queue()
        seen: List[Task] = []
        w = workers(proxy.endpoint, "collector", "w-lost-abort", run=commands_run(cmds, seen),
                    close=lambda t: {"closed": t.id}, heartbeat=0.5, reconnect_min=0.02,
                    reconnect_max=0.1)
        assert w.wait_for("ready", 10)
        coord.submit("t-gone", "collector")
        assert coord.wait(coord.has("t-gone", "started"))
        proxy.freeze()
        # the TASK_ABORT of this cancel goes into the cut link
        coord.send("CANCEL", {"task_id": "t-gone", "reason": "while cut"})
        assert coord.wait(coord.has("t-gone", "cancelled"))
        assert wait_until(lambda: w.welcomes >= 2, 10)
        assert not seen[0].aborted  # resumed: the worker never heard of the cancel
        # the next assignment tells it: the old attempt is over, the new task runs
        coord.submit("t-new", "collector")
        assert wait_until(lambda: len(seen) == 2, 10)
        assert seen[0].aborted and "another task" in seen[0].abort_reason
        assert seen[1].id == "t-new"
        cmds.put(lambda t: t.emit_info({"ok": True}))
        assert coord.wait(coord.has("t-new", "info"))
        coord.send("FINISH", {"task_id": "t-new"})
        assert coord.wait(coord.has("t-new", "finished"))
        assert body(coord.of("t-new", "finished")[0]) == {"closed": "t-new"}
        assert coord.names("t-new") == ["assigned", "started", "info", "finished"]
    finally:
        proxy.close()


def test_a_leaving_worker_hands_its_task_back_by_its_deadline_and_gets_no_other(
        broker: Broker, coord_factory, workers) -> None:
    coord = coord_factory(broker)
    got: Dict[str, Any] = {}

    def run(task: Task) -> None:
        got["stopped"] = task.wait_stop(30)
        got["reason"] = task.abort_reason

    w = workers(broker.router, "collector", "w-leave", run=run, **FAST)
    assert w.wait_for("ready", 10)
    coord.submit("t-leave", "collector", max_attempts=2)
    assert coord.wait(coord.has("t-leave", "started"))
    with pytest.raises(ValueError, match="deadline_s"):
        w.leave(-1)
    assert not w.leaving
    said = time.monotonic()
    assert w.leave(0.3) and w.leaving
    assert coord.wait(coord.has("t-leave", "requeued"))
    assert time.monotonic() - said >= 0.25  # not before the deadline it gave
    assert body(coord.of("t-leave", "requeued")[0])["reason"] == "worker w-leave leaving"
    assert w.wait_idle(10)
    assert got == {"stopped": True, "reason": "worker w-leave leaving"}
    # no new task for it: the re-queued one waits for another worker, which gets it
    other = workers(broker.router, "collector", "w-other", run=lambda t: t.wait_stop(30), **FAST)
    assert other.wait_for("ready", 10)
    assert coord.wait(coord.has("t-leave", "started", 2))
    assert coord.of("t-leave", "assigned")[1]["worker_id"] == "w-other"


def test_sigterm_makes_a_worker_leave_when_asked(broker: Broker, coord_factory,
                                                 tmp_path) -> None:
    """leave_on_sigterm: the process goes on after SIGTERM, its task handed back by then."""
    coord = coord_factory(broker)
    script = tmp_path / "worker.py"
    script.write_text(
        "import sys, rlbus\n"
        "def say(*words):\n"
        "    print('>', *words, flush=True)\n"
        "def run(task):\n"
        "    say('running')\n"
        "    task.wait_stop(60)\n"
        "    say('stopped', task.abort_reason)\n"
        "w = rlbus.Worker(sys.argv[1], role='collector', id='w-term', run=run,\n"
        "                 heartbeat=0.2, leave_on_sigterm=0.0)\n"
        "w.wait_for('ready', 10)\n"
        "say('ready')\n"
        "sys.stdin.readline()\n"
        "say('leaving', w.leaving, w.wait_idle(10))\n"
        "w.close()\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    p = subprocess.Popen([sys.executable, str(script), broker.router], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    log: List[str] = []

    def said() -> str:  # the script's next line, past its log lines (stderr joins stdout)
        for line in p.stdout:
            log.append(line)
            if line.startswith("> "):
                return line[2:].strip()
        raise AssertionError("the worker script ended:\n" + "".join(log))
    try:
        assert said() == "ready"
        coord.submit("t-term", "collector", max_attempts=2)
        assert said() == "running"
        p.send_signal(signal.SIGTERM)
        assert said() == "stopped worker w-term leaving"
        assert coord.wait(coord.has("t-term", "requeued"))
        p.stdin.write("\n")
        p.stdin.flush()
        assert said() == "leaving True True"
        assert p.wait(10) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
