"""The Python Coordinator against the real broker, with workers played by raw DEALER sockets
speaking the codec: what a coordinator's user sees through submit() and the callbacks."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import zmq

from conftest import Broker, wait_until
from rlbus import protocol as P
from rlbus.coordinator import Coordinator

_ids = itertools.count(1)


def uid(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


class RawWorker:
    """A collector or learner driven by hand: one DEALER, the codec, no SDK."""

    def __init__(self, endpoint: str, role: str, id: Optional[str] = None,
                 resources: Optional[Dict[str, float]] = None) -> None:
        self.id = id or uid(role)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.backlog: List[P.Message] = []
        # a long heartbeat: the broker keeps a silent test worker for minutes
        self.send("HELLO", role=role, id=self.id, heartbeat_ms=60000,
                  resources=resources or {})
        assert self.expect("WELCOME").get("resumed") is False

    def send(self, name: str, **fields: Any) -> None:
        self.sock.send_multipart(list(P.encode(name, fields)))

    def expect(self, name: str, timeout: float = 10.0,
               where: Callable[[P.Message], bool] = lambda m: True) -> P.Message:
        """The first message called ``name`` (and matching ``where``), from the backlog or the
        socket; others are kept in the backlog."""
        for i, m in enumerate(self.backlog):
            if m.name == name and where(m):
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{self.id}: no {name} within {timeout} s; got " \
                f"{[(m.name, m.fields) for m in self.backlog]}"
            if self.sock.poll(int(left * 1000) + 1):
                m = P.decode(self.sock.recv_multipart())
                if m.name == name and where(m):
                    return m
                if m.name != "HEARTBEAT":
                    self.backlog.append(m)

    def take(self, kind_check: Optional[str] = None) -> Tuple[str, int]:
        """Waits for TASK_START, answers STARTED; returns (task_id, attempt)."""
        start = self.expect("TASK_START")
        if kind_check:
            assert start["kind"] == kind_check
        self.send("STARTED", task_id=start["task_id"], attempt=start["attempt"])
        return start["task_id"], start["attempt"]

    def close(self) -> None:
        if self.sock.closed:
            return
        try:
            self.send("DISCONNECT", code=200, reason="test worker done")
        finally:
            self.sock.close(linger=200)
            self.ctx.term()


class Recorder:
    """Callbacks as an object: every call is recorded with the thread that made it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: List[Tuple[str, tuple]] = []
        self.threads: set = set()
        self.get_data: Callable[..., Any] = lambda *a: None
        self.judge_collector: Optional[Callable[..., bool]] = None

    def _rec(self, name: str, *args: Any) -> None:
        with self.lock:
            self.calls.append((name, args))
            self.threads.add(threading.current_thread().name)

    def of(self, name: str) -> List[tuple]:
        with self.lock:
            return [a for n, a in self.calls if n == name]

    def names(self) -> List[str]:
        with self.lock:
            return [n for n, _ in self.calls]

    def deal_with_collector_send_data(self, task_id, buffer_id, data_id, data):
        self._rec("data", task_id, buffer_id, data_id, data)

    def deal_with_collector_judge_finish(self, task_id, info):
        self._rec("judge_collector", task_id, info)
        if self.judge_collector is not None:
            return self.judge_collector(task_id, info)
        return bool(info.get("collector_done"))

    def deal_with_collector_finish_task(self, task_id, result):
        self._rec("collector_finish", task_id, result)

    def deal_with_learner_get_data(self, task_id, buffer_id, batch_size, cur_learner_iter):
        self._rec("get_data", task_id, buffer_id, batch_size, cur_learner_iter)
        return self.get_data(task_id, buffer_id, batch_size, cur_learner_iter)

    def deal_with_learner_judge_finish(self, task_id, info):
        self._rec("judge_learner", task_id, info)
        return bool(info.get("learner_done"))

    def deal_with_learner_send_info(self, task_id, buffer_id, info):
        self._rec("learner_info", task_id, buffer_id, info)

    def deal_with_learner_finish_task(self, task_id, result):
        self._rec("learner_finish", task_id, result)

    def deal_with_increase_collector(self):
        self._rec("increase")

    def deal_with_decrease_collector(self):
        self._rec("decrease")

    def on_task_requeued(self, task_id, attempt, reason, result):
        self._rec("requeued", task_id, attempt, reason, result)

    def on_task_failed(self, task_id, reason, result):
        self._rec("failed", task_id, reason, result)

    def on_task_cancelled(self, task_id, reason):
        self._rec("cancelled", task_id, reason)

    def on_capacity(self, kind, change, worker_id, count):
        self._rec("capacity", kind, change, worker_id, count)

    def on_stream_lost(self, first, last):
        self._rec("stream_lost", first, last)

    def on_data_lost(self, task_id, attempt, first, last):
        self._rec("data_lost", task_id, attempt, first, last)


def coordinator(broker: Broker, closing: Any, callbacks: Any, **kw: Any) -> Coordinator:
    c = Coordinator(broker.router, id=kw.pop("id", uid("coord")), callbacks=callbacks, **kw)
    closing(c)
    assert c.wait_for("ready", 10), c.last_error
    return c


def worker(broker: Broker, closing: Any, role: str, **kw: Any) -> RawWorker:
    w = RawWorker(broker.router, role, **kw)
    closing(w)
    return w


# ---- options ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    ({"endpoint": "127.0.0.1:7235"}, "endpoint"),
    ({"id": "no spaces"}, "id"),
    ({"heartbeat": 0.001}, "heartbeat"),
    ({"reconnect_min": -1}, "reconnect_min"),
    ({"reconnect_min": 2.0, "reconnect_max": 1.0}, "reconnect_max"),
    ({"callbacks": {"deal_with_colector_send_data": print}}, "callbacks"),
    ({"callbacks": {"on_capacity": 42}}, "callbacks"),
    ({"callbacks": "on_capacity"}, "callbacks"),
])
def test_bad_options_name_the_option_and_start_no_thread(kwargs: dict, name: str) -> None:
    before = set(threading.enumerate())
    args = {"endpoint": "tcp://127.0.0.1:9"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        Coordinator(args.pop("endpoint"), **args)
    assert set(threading.enumerate()) == before


def test_constructor_does_not_wait_for_a_broker() -> None:
    # nobody listens there: the coordinator keeps trying, submit() answers None in time
    c = Coordinator("tcp://127.0.0.1:9", id=uid("coord"), reconnect_max=0.2)
    try:
        assert c.state == "connecting"
        assert c.submit("t1", "collector", {}, timeout=0.2) is None
        assert c.open_tasks == 0
    finally:
        c.close()
    assert c.state == "stopped"


# ---- submit ----------------------------------------------------------------------------

def test_submit_is_accepted_queued_or_refused_with_a_code(broker: Broker, closing: Any) -> None:
    c = coordinator(broker, closing, Recorder())
    info = {"env": "cartpole", "n": 3}
    first = c.submit("task-a", "collector", info)
    assert first is not None and first.task_id == "task-a"
    assert first.accepted and first.code == 0 and first.queued == 0
    info["n"] = 99  # changed after submit: the broker got the dict as it was
    second = c.submit("task-b", "learner", {}, max_attempts=2, queue_timeout_ms=60000)
    assert second is not None and second.accepted and second.queued == 1
    assert c.open_tasks == 2
    dup = c.submit("task-a", "collector", {})
    assert dup is not None and not dup.accepted and dup.code == 411
    # fields that break the protocol are refused here, named, and never sent
    bad = c.submit("has space", "collector", {})
    assert bad is not None and not bad.accepted and bad.code == 402 and "task_id" in bad.reason
    bad = c.submit("task-c", "collector", {}, max_attempts=0)
    assert not bad.accepted and bad.code == 402 and "max_attempts" in bad.reason
    bad = c.submit("task-c", "coordinator", {})
    assert not bad.accepted and bad.code == 402 and "kind" in bad.reason
    bad = c.submit("task-c", "collector", {"x": object()})
    assert not bad.accepted and bad.code == 402 and "task_info" in bad.reason
    with pytest.raises(ValueError, match="timeout"):
        c.submit("task-c", "collector", {}, timeout=-1)
    assert c.open_tasks == 2
    # the worker gets task_info as it was at submit time
    w = worker(broker, closing, "collector")
    start = w.expect("TASK_START")
    assert start["task_id"] == "task-a" and start["task_info"].value() == {"env": "cartpole",
                                                                           "n": 3}


def test_submit_right_after_construction_waits_for_the_connection(broker: Broker,
                                                                  closing: Any) -> None:
    c = Coordinator(broker.router, id=uid("coord"))
    closing(c)
    res = c.submit("early-1", "collector", {"a": 1}, timeout=10)  # sent once WELCOMEd
    assert res is not None and res.accepted
    assert c.state == "ready" and c.open_tasks == 1
    # task_info past the limits of the protocol is refused here, nothing sent
    deep: dict = {}
    x = deep
    for _ in range(40):
        x["a"] = {}
        x = x["a"]
    bad = c.submit("early-2", "collector", deep)
    assert not bad.accepted and bad.code == 401 and "task_info" in bad.reason
    assert c.submit("early-2", "collector", {}).accepted
    assert c.last_error == ""


# ---- collector tasks -------------------------------------------------------------------

def test_collector_data_and_infos_reach_the_callbacks_in_order_and_judge_finishes(
        broker: Broker, closing: Any) -> None:
    rec = Recorder()
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "collector")
    assert c.submit("col-1", "collector", {"k": 1}).accepted
    task, attempt = w.take("collector")
    assert task == "col-1" and attempt == 1
    for i in range(1, 51):
        w.send("DATA", task_id=task, attempt=attempt, data_id=f"d{i}", buffer_id="buf",
               meta={"i": i, 7: "int key"}, payload=bytes([i]))
        if i % 10 == 0:
            w.send("INFO", task_id=task, attempt=attempt, info={"step": i})
    w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    close = w.expect("TASK_CLOSE")  # the judge said True: the coordinator sent FINISH
    assert close["task_id"] == task and close["attempt"] == attempt
    w.send("RESULT", task_id=task, attempt=attempt, result={"episodes": 50})
    assert wait_until(lambda: rec.of("collector_finish"))
    assert rec.of("collector_finish") == [("col-1", {"episodes": 50})]
    assert c.open_tasks == 0

    data = rec.of("data")
    assert [a[2] for a in data] == [f"d{i}" for i in range(1, 51)]  # each once, in order
    assert data[0][:3] == ("col-1", "buf", "d1")
    assert data[0][3] == {"data_id": "d1", "buffer_id": "buf", "meta": {"i": 1, 7: "int key"},
                          "payload": b"\x01"}
    # infos in their place among the data, then the finish
    order = [n for n in rec.names() if n in ("data", "judge_collector", "collector_finish")]
    expected: List[str] = []
    for i in range(1, 51):
        expected.append("data")
        if i % 10 == 0:
            expected.append("judge_collector")
    expected += ["judge_collector", "collector_finish"]
    assert order == expected
    assert [a[1] for a in rec.of("judge_collector")][:2] == [{"step": 10}, {"step": 20}]
    # one callback thread, not the caller's and not the I/O thread
    assert len(rec.threads) == 1
    name = next(iter(rec.threads))
    assert name.startswith("rlbus-cb-") and name != threading.current_thread().name
    assert c.stream_duplicates == 0 and c.stream_gaps == 0 and c.stream_replays == 1


def test_finish_is_sent_once_per_attempt_when_several_infos_judge_final(
        broker: Broker, closing: Any) -> None:
    rec = Recorder()
    gate = threading.Event()

    def judge(task_id, info):
        gate.wait(10)
        return True
    rec.judge_collector = judge
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "collector")
    assert c.submit("col-2", "collector").accepted
    task, attempt = w.take()
    for _ in range(3):
        w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": 1})
    # a GET_DATA about a collector task is refused: once its ERROR is here, the broker took
    # all three infos
    w.send("GET_DATA", task_id=task, attempt=attempt, request_id=1, buffer_id="b",
           batch_size=1, cur_learner_iter=0)
    assert w.expect("ERROR")["code"] == 408
    gate.set()
    w.expect("TASK_CLOSE")
    assert wait_until(lambda: len(rec.of("judge_collector")) == 3)
    w.send("RESULT", task_id=task, attempt=attempt, result={})
    assert wait_until(lambda: rec.of("collector_finish"))
    # three judges said True, one FINISH went: a second would have been refused (408)
    assert c.last_error == ""


def test_finish_and_cancel_from_the_caller(broker: Broker, closing: Any) -> None:
    rec = Recorder()
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "collector")
    assert c.submit("col-3", "collector").accepted
    assert c.submit("col-4", "collector").accepted  # waits in the queue
    task, attempt = w.take()
    assert task == "col-3"
    c.cancel("col-4", "not needed")  # queued: cancelled where it is
    assert wait_until(lambda: rec.of("cancelled"))
    assert rec.of("cancelled") == [("col-4", "not needed")]
    c.finish("col-3")
    w.expect("TASK_CLOSE")
    w.send("RESULT", task_id=task, attempt=attempt, result={"ok": True})
    assert wait_until(lambda: rec.of("collector_finish") == [("col-3", {"ok": True})])
    # a running task: its worker is aborted with the reason
    assert c.submit("col-5", "collector").accepted
    task, attempt = w.take()
    c.cancel(task, "user stop")
    abort = w.expect("TASK_ABORT")
    assert abort["task_id"] == task and abort["reason"] == "cancelled: user stop"
    assert wait_until(lambda: len(rec.of("cancelled")) == 2)
    assert rec.of("cancelled")[1] == ("col-5", "user stop")
    assert c.open_tasks == 0
    with pytest.raises(ValueError):
        c.cancel("bad id!", "x")


def test_requeued_and_failed_get_the_workers_failure_result(broker: Broker,
                                                             closing: Any) -> None:
    rec = Recorder()
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "collector")
    assert c.submit("col-6", "collector", max_attempts=2).accepted
    task, attempt = w.take()
    w.send("TASK_FAILED", task_id=task, attempt=attempt, reason="env crashed",
           result={"steps": 3, "log": ["a", "b"]})
    task, attempt2 = w.take()  # the only worker: the second attempt comes back to it
    assert attempt2 == 2
    w.send("TASK_FAILED", task_id=task, attempt=attempt2, reason="again")
    assert wait_until(lambda: rec.of("failed"))
    assert rec.of("requeued") == [("col-6", 1, "worker reported: env crashed",
                                   {"steps": 3, "log": ["a", "b"]})]
    assert rec.of("failed") == [("col-6", "worker reported: again", None)]
    assert c.open_tasks == 0
    # a judge that said True in attempt 1 does not keep attempt 2 from being finished
    assert c.submit("col-7", "collector", max_attempts=2).accepted
    task, attempt = w.take()
    w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    w.expect("TASK_CLOSE")
    w.send("TASK_FAILED", task_id=task, attempt=attempt, reason="close failed",
           result={"partial": 1})
    task, attempt = w.take()
    w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    w.expect("TASK_CLOSE")
    w.send("RESULT", task_id=task, attempt=attempt, result={"done": 2})
    assert wait_until(lambda: rec.of("collector_finish") == [("col-7", {"done": 2})])
    assert rec.of("requeued")[1] == ("col-7", 1, "worker reported: close failed",
                                     {"partial": 1})


def test_data_a_collector_lost_is_reported_in_its_place(broker: Broker, closing: Any) -> None:
    rec = Recorder()
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "collector")
    assert c.submit("col-11", "collector").accepted
    task, attempt = w.take()
    w.send("DATA", task_id=task, attempt=attempt, data_id="a", buffer_id="", meta={}, index=1)
    w.send("DATA_LOST", task_id=task, attempt=attempt, first=2, last=3)
    w.send("DATA", task_id=task, attempt=attempt, data_id="b", buffer_id="", meta={}, index=4)
    assert wait_until(lambda: len(rec.of("data")) == 2)
    assert rec.of("data_lost") == [("col-11", 1, 2, 3)]
    assert c.data_lost == 2
    assert [n for n in rec.names() if n in ("data", "data_lost")] == ["data", "data_lost", "data"]


# ---- learner tasks ---------------------------------------------------------------------

def test_learner_get_data_replies_and_no_data_backs_off(broker: Broker, closing: Any) -> None:
    rec = Recorder()
    answers: List[Any] = [None, None, None, {"batch": [1, 2, 3]}, None, RuntimeError("oops"),
                          None, None, None, None, None, None, None, None]

    def get_data(task_id, buffer_id, batch_size, it):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a
    rec.get_data = get_data
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "learner")
    assert c.submit("lrn-1", "learner", {"lr": 0.1}).accepted
    task, attempt = w.take("learner")
    retries = []
    for req in range(1, 15):
        w.send("GET_DATA", task_id=task, attempt=attempt, request_id=req, buffer_id="rb",
               batch_size=64, cur_learner_iter=req * 10)
        m = w.expect("NO_DATA", where=lambda m: True) if req != 4 else w.expect("LEARN")
        assert m["request_id"] == req
        if req == 4:
            assert m["data"].value() == {"batch": [1, 2, 3]}
        else:
            retries.append(m["retry_ms"])
    # 10 ms doubling per "no data" in a row, reset by data, an exception counts as none,
    # capped at 1 s
    assert retries == [10, 20, 40, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]
    assert rec.of("get_data")[0] == ("lrn-1", "rb", 64, 10)
    # learn infos: not final -> send_info; final -> FINISH, and not passed on
    w.send("LEARN_INFO", task_id=task, attempt=attempt, buffer_id="rb", info={"loss": 0.5})
    w.send("LEARN_INFO", task_id=task, attempt=attempt, buffer_id="rb",
           info={"learner_done": True})
    w.expect("TASK_CLOSE")
    w.send("RESULT", task_id=task, attempt=attempt, result={"iters": 140})
    assert wait_until(lambda: rec.of("learner_finish"))
    assert rec.of("learner_info") == [("lrn-1", "rb", {"loss": 0.5})]
    assert rec.of("learner_finish") == [("lrn-1", {"iters": 140})]
    assert rec.of("collector_finish") == []
    assert len(rec.of("judge_learner")) == 2


def test_learner_without_get_data_callback_is_told_no_data(broker: Broker,
                                                           closing: Any) -> None:
    c = coordinator(broker, closing, {})
    w = worker(broker, closing, "learner")
    assert c.submit("lrn-2", "learner").accepted
    task, attempt = w.take()
    w.send("GET_DATA", task_id=task, attempt=attempt, request_id=0, buffer_id="",
           batch_size=1, cur_learner_iter=0)
    assert w.expect("NO_DATA")["retry_ms"] == 10


def test_a_batch_too_large_for_the_broker_is_answered_no_data(broker: Broker,
                                                              closing: Any) -> None:
    rec = Recorder()
    rec.get_data = lambda *a: b"x" * (2 << 20)  # past the broker's max-message (1 MiB)
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "learner")
    assert c.submit("lrn-3", "learner").accepted
    task, attempt = w.take()
    w.send("GET_DATA", task_id=task, attempt=attempt, request_id=5, buffer_id="",
           batch_size=1, cur_learner_iter=0)
    m = w.expect("NO_DATA")
    assert m["request_id"] == 5 and m["retry_ms"] == 10
    assert c.state == "ready" and c.welcomes == 1  # not cut off by the broker


# ---- capacity, dict callbacks ----------------------------------------------------------

def test_capacity_counts_and_a_dict_of_callbacks_with_missing_keys(broker: Broker,
                                                                   closing: Any) -> None:
    calls: List[tuple] = []
    lock = threading.Lock()

    def note(*a: Any) -> None:
        with lock:
            calls.append(a)
    # no judge, no decrease callback: the judges default, the decrease is not called
    cbs = {
        "deal_with_increase_collector": lambda: note("increase"),
        "on_capacity": lambda *a: note("capacity", *a),
        "deal_with_collector_finish_task": lambda t, r: note("finish", t, r),
    }
    early = worker(broker, closing, "collector")
    c = coordinator(broker, closing, cbs)
    assert wait_until(lambda: c.collectors == 1)  # the snapshot at connection
    w2 = worker(broker, closing, "collector")
    learner = worker(broker, closing, "learner")
    assert wait_until(lambda: c.collectors == 2 and c.learners == 1)
    with lock:
        assert [x for x in calls if x[0] == "increase"] == [("increase",)] * 2
        caps = [x[1:] for x in calls if x[0] == "capacity"]
    assert ("collector", "snapshot", "", 1) in caps
    assert ("collector", "increase", w2.id, 2) in caps
    assert ("learner", "increase", learner.id, 1) in caps
    w2.close()
    assert wait_until(lambda: c.collectors == 1)
    assert wait_until(lambda: ("capacity", "collector", "decrease", w2.id, 1) in list(calls))
    # default judge with a dict lacking it
    assert c.submit("col-8", "collector").accepted
    task, attempt = early.take()
    early.send("INFO", task_id=task, attempt=attempt, info={"collector_done": False})
    early.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    early.expect("TASK_CLOSE")
    early.send("RESULT", task_id=task, attempt=attempt, result={"r": 1})
    assert wait_until(lambda: ("finish", "col-8", {"r": 1}) in list(calls))


# ---- stream lost -----------------------------------------------------------------------

def test_events_the_broker_could_not_keep_are_reported_lost(broker_factory: Any,
                                                            closing: Any) -> None:
    # a tiny ring and window: while the callbacks are held, infos (not held back by data
    # credit) overflow the ring
    broker = broker_factory("--stream-ring", "16", "--stream-window", "8")
    rec = Recorder()
    gate = threading.Event()

    def judge(task_id, info):
        gate.wait(10)
        return False
    rec.judge_collector = judge
    c = coordinator(broker, closing, rec)
    w = worker(broker, closing, "collector")
    assert c.submit("col-9", "collector").accepted
    task, attempt = w.take()  # events 1 assigned, 2 started
    for i in range(41):  # events 3..43; the last one (i = 40) is never dropped
        w.send("INFO", task_id=task, attempt=attempt, info={"i": i})
    # a GET_DATA about a collector task is refused: once its ERROR is here, the broker made
    # every event
    w.send("GET_DATA", task_id=task, attempt=attempt, request_id=1, buffer_id="b",
           batch_size=1, cur_learner_iter=0)
    assert w.expect("ERROR")["code"] == 408
    gate.set()
    assert wait_until(lambda: any(a[1]["i"] == 40 for a in rec.of("judge_collector")))
    lost = rec.of("stream_lost")
    assert len(lost) == 1
    first, last = lost[0]
    assert c.stream_gaps == last - first + 1 > 0
    infos = [a[1]["i"] for a in rec.of("judge_collector")]
    # what arrived is in order, each once, and the gap is exactly what is missing
    assert infos == sorted(set(infos))
    assert len(infos) + c.stream_gaps == 41
    assert set(range(first - 3, last - 2)).isdisjoint(infos)
    names = [n for n in rec.names() if n in ("judge_collector", "stream_lost")]
    assert names.index("stream_lost") == len([i for i in infos if i < first - 3])


def test_callbacks_may_submit_and_close(broker: Broker, closing: Any) -> None:
    results: List[Any] = []
    holder: List[Coordinator] = []

    def finished(task_id: str, result: Any) -> None:
        c = holder[0]
        if task_id == "chain-1":  # DI-engine style: the next task from the finish callback
            results.append(c.submit("chain-2", "collector", {"after": task_id}))
        else:
            c.close()  # from the callback thread itself: no deadlock
            results.append("closed")
    c = coordinator(broker, closing, {"deal_with_collector_finish_task": finished})
    holder.append(c)
    w = worker(broker, closing, "collector")
    assert c.submit("chain-1", "collector").accepted
    for expected in ("chain-1", "chain-2"):
        task, attempt = w.take()
        assert task == expected
        w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
        w.expect("TASK_CLOSE")
        w.send("RESULT", task_id=task, attempt=attempt, result={})
    assert wait_until(lambda: len(results) == 2)
    assert results[0].accepted and results[1] == "closed"
    assert wait_until(lambda: c.state == "stopped")
    # the callback thread ends as the callback that closed returns
    assert wait_until(lambda: not [t for t in threading.enumerate() if c.id in t.name])


# ---- close -----------------------------------------------------------------------------

def test_close_is_prompt_joins_its_threads_and_no_callback_runs_after(broker: Broker,
                                                                       closing: Any) -> None:
    before = {t.name for t in threading.enumerate()}
    rec = Recorder()
    closed = threading.Event()
    late: List[str] = []
    orig = rec.deal_with_collector_send_data

    def on_data(*a: Any) -> None:
        if closed.is_set():
            late.append(a[2])
        orig(*a)
    rec.deal_with_collector_send_data = on_data  # type: ignore[assignment]
    cid = uid("coord")
    c = Coordinator(broker.router, id=cid, callbacks=rec)
    assert c.wait_for("ready", 10)
    w = worker(broker, closing, "collector")
    assert c.submit("col-10", "collector").accepted
    task, attempt = w.take()
    for i in range(300):
        w.send("DATA", task_id=task, attempt=attempt, data_id=str(i), buffer_id="", meta={})
    assert wait_until(lambda: rec.of("data"))
    done = threading.Thread(target=c.close)
    done.start()
    done.join(10)
    assert not done.is_alive(), "close() hung"
    closed.set()
    assert late == []
    assert c.state == "stopped"
    left = {t.name for t in threading.enumerate()} - before
    assert not [n for n in left if cid in n], left
    c.close()  # idempotent
    with Coordinator(broker.router, id=cid, callbacks=rec) as again:
        assert again.wait_for("ready", 10)  # the id is free again: the session was ended
        assert again.submit("col-10", "collector").accepted  # the old task was cancelled
    assert not [t for t in threading.enumerate() if cid in t.name]
    assert again.submit("x", "collector", timeout=0.1) is None
