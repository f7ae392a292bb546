"""The Worker's task bookkeeping driven message by message, with a stand-in for the client
core: its own I/O thread runs posted calls, and the test plays the broker by delivering
decoded messages there and reading what the worker sent. Covers what a real broker does
not provoke on demand: messages of attempts that are not current, a task assigned while
another runs, confirmation and resend bookkeeping, the bounds."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from conftest import wait_until
from rlbus import protocol as P
from rlbus import worker as worker_mod
from rlbus.worker import Task, Worker


class FakeCore:
    """The client core's contract (rlbus._core.Core: post, send, call_later, ready, close
    ...) without a network."""

    last: Optional["FakeCore"] = None

    def __init__(self, endpoint: str, role: str, id: str, handler: Any, **kw: Any) -> None:
        self.handler = handler
        self.state = "connecting"
        self.token = 0
        self.welcomes = 0
        self.last_error = ""
        self.max_message = 0  # the broker's, from WELCOME (0: not known)
        self.sent: List[Tuple[str, Dict[str, Any]]] = []
        self._q: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=f"rlbus-io-{id}", daemon=True)
        FakeCore.last = self

    # ---- the contract
    def start(self) -> None:
        self._thread.start()

    def post(self, fn: Callable[[], None]) -> bool:
        if self._closing:
            return False
        self._q.put(fn)
        return True

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def send(self, name: str, fields: Dict[str, Any]) -> bool:
        if not self.ready:
            return False
        P.decode(P.encode(name, fields))  # what the wire would carry must decode
        if isinstance(fields, P.Encoded):  # encoded ahead: the canonical bytes of its fields
            assert fields.body == P.encode_body(name, dict(fields))
        self.sent.append((name, dict(fields)))
        return True

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Any:
        t = threading.Timer(delay_s, lambda: self.post(fn))
        t.daemon = True
        t.start()
        return t

    def wait_for(self, state: str, timeout: float) -> bool:
        return wait_until(lambda: self.state == state, timeout)

    def close(self, timeout: float = 5.0) -> None:
        if self._closing:
            return
        self._closing = True
        self._q.put(lambda: self.handler.on_close())
        self._q.put(None)
        self._thread.join(timeout)
        self.state = "stopped"

    def _loop(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            fn()
            if self._q.empty():  # the end of a turn, as the real core has it
                self._idle()

    def _idle(self) -> None:
        idle = getattr(self.handler, "on_idle", None)
        if idle is not None:
            idle()

    # ---- the test plays the broker
    def sync(self) -> None:
        """Waits until everything posted so far has run on the I/O thread."""
        done = threading.Event()

        def last() -> None:  # a turn ends here: what it queued has left
            self._idle()
            done.set()
        assert self.post(last)
        assert done.wait(5)

    def welcome(self, resumed: bool) -> None:
        def go() -> None:
            self.state = "ready"
            self.welcomes += 1
            self.token = self.token or 77
            self.handler.on_ready(P.decode(P.encode("WELCOME", {
                "session": self.token, "epoch": 1, "heartbeat_ms": 1000, "liveness": 3,
                "max_message": 1 << 20, "resumed": resumed})))
        self.post(go)
        self.sync()

    def drop(self) -> None:
        def go() -> None:
            self.state = "reconnecting"
        self.post(go)
        self.sync()

    def deliver(self, name: str, **fields: Any) -> None:
        msg = P.decode(P.encode(name, fields))
        self.post(lambda: self.handler.on_message(msg))
        self.sync()

    def names(self) -> List[str]:
        return [n for n, _ in self.sent]

    def of(self, name: str) -> List[Dict[str, Any]]:
        return [f for n, f in self.sent if n == name]


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(worker_mod, "Core", FakeCore)
    made: List[Worker] = []

    def make(run: Callable[[Task], Any], **kw: Any) -> Tuple[Worker, FakeCore]:
        kw.setdefault("role", "collector")
        # one DATA per message, whatever the threads' timing (batching has its own test)
        kw.setdefault("batch_data", False)
        w = Worker("tcp://127.0.0.1:1", id="w-unit", run=run, **kw)
        made.append(w)
        s = FakeCore.last
        assert s is not None
        s.welcome(False)
        return w, s
    yield make
    for w in made:
        w.close()


def start(s: FakeCore, task_id: str = "t1", attempt: int = 1, kind: str = "collector",
          **extra: Any) -> None:
    s.deliver("TASK_START", task_id=task_id, attempt=attempt, kind=kind,
              task_info=P.Raw.of({"n": 1}), **extra)


def scripted() -> Tuple[Callable[[Task], None], "queue.Queue", List[Task]]:
    """A run handler executing the test's commands; its tasks are listed as they start."""
    cmds: "queue.Queue[Callable[[Task], Any]]" = queue.Queue()
    tasks: List[Task] = []

    def run(task: Task) -> None:
        tasks.append(task)
        while not task.stop_requested:
            try:
                fn = cmds.get(timeout=0.01)
            except queue.Empty:
                continue
            fn(task)
    return run, cmds, tasks


def do(cmds: "queue.Queue", fn: Callable[[Task], Any]) -> Any:
    """Runs ``fn(task)`` on the handler thread and returns its value."""
    out: "queue.Queue[Any]" = queue.Queue()
    cmds.put(lambda t: out.put(fn(t)))
    return out.get(timeout=5)


def test_messages_of_other_attempts_are_ignored(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run)
    start(s, "t1", 2)
    assert wait_until(lambda: bool(tasks))
    t = tasks[0]
    assert s.of("STARTED") == [{"task_id": "t1", "attempt": 2}]
    # the same task at another attempt, or another task: none of it is ours
    s.deliver("TASK_CLOSE", task_id="t1", attempt=1)
    s.deliver("TASK_ABORT", task_id="t1", attempt=3, reason="not ours")
    s.deliver("TASK_CLOSE", task_id="t9", attempt=2)
    s.deliver("POLICY_UPDATE", task_id="t1", attempt=1, policy_id="p", policy_version=5,
              policy_ref="r")
    s.deliver("DATA_CREDIT", task_id="t1", attempt=1, limit=0)
    assert not t.stop_requested and not t.aborted and t.policy() is None
    assert do(cmds, lambda t: t.emit_data("d1", "b", {}))  # no credit applies to attempt 2
    s.sync()
    # a stale DATA_ACK asking for a resend does not resend anything
    s.deliver("DATA_ACK", task_id="t1", attempt=1, relayed=0, resend=True)
    assert w.data_resent == 0 and len(s.of("DATA")) == 1
    s.deliver("TASK_ABORT", task_id="t1", attempt=2, reason="timeout")
    assert t.aborted and t.abort_reason == "timeout" and t.stop_requested


def test_a_task_assigned_while_one_runs_means_the_broker_ended_the_first(fake) -> None:
    # the broker assigns only to a free worker: the end of t1 was lost (e.g. a TASK_ABORT on
    # a connection that went down before the session resumed)
    run, cmds, tasks = scripted()
    w, s = fake(run)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    start(s, "t2")
    assert wait_until(lambda: len(tasks) == 2)
    assert tasks[0].aborted and "another task" in tasks[0].abort_reason
    s.sync()
    assert s.of("STARTED") == [{"task_id": "t1", "attempt": 1}, {"task_id": "t2", "attempt": 1}]
    assert not s.of("TASK_FAILED") and not tasks[1].stop_requested


def test_a_waiting_task_aborted_before_it_began_never_runs(fake) -> None:
    release = threading.Event()
    tasks: List[Task] = []

    def run(task: Task) -> None:
        tasks.append(task)
        task.wait_stop(10)
        release.wait(10)

    w, s = fake(run)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    s.deliver("TASK_ABORT", task_id="t1", attempt=1, reason="cancelled: x")
    start(s, "t2", policy_id="p", policy_version=1, policy_ref="r1")
    s.deliver("POLICY_UPDATE", task_id="t2", attempt=1, policy_id="p", policy_version=2,
              policy_ref="r2")
    s.deliver("TASK_ABORT", task_id="t2", attempt=1, reason="start timeout")
    start(s, "t3", policy_id="p", policy_version=2, policy_ref="r2")
    s.deliver("POLICY_UPDATE", task_id="t3", attempt=1, policy_id="p", policy_version=3,
              policy_ref="r3")
    release.set()
    assert wait_until(lambda: len(tasks) == 2)
    assert tasks[1].id == "t3" and tasks[1].policy() == worker_mod.Policy("p", 3, "r3", None)
    s.sync()
    assert [f["task_id"] for f in s.of("STARTED")] == ["t1", "t3"]


def test_the_next_task_waits_for_an_aborted_handler_to_return(fake) -> None:
    release = threading.Event()
    tasks: List[Task] = []

    def run(task: Task) -> None:
        tasks.append(task)
        task.wait_stop(10)
        if task.id == "t1":
            release.wait(10)  # winds down slowly after the abort

    w, s = fake(run)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    s.deliver("TASK_ABORT", task_id="t1", attempt=1, reason="cancelled: x")
    start(s, "t2")
    assert s.of("STARTED") == [{"task_id": "t1", "attempt": 1}]
    assert not s.of("TASK_FAILED") and len(tasks) == 1
    release.set()
    assert wait_until(lambda: len(tasks) == 2)
    s.sync()
    assert s.of("STARTED")[1] == {"task_id": "t2", "attempt": 1}
    assert not s.of("TASK_FAILED") and not s.of("RESULT")  # nothing about the aborted one


def test_messages_wait_while_disconnected_and_go_in_order_on_resume(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    for i in range(1, 4):
        assert do(cmds, lambda t, i=i: t.emit_data(f"d{i}", "b", {"i": i}))
    s.sync()
    s.deliver("DATA_ACK", task_id="t1", attempt=1, relayed=2, resend=False)
    s.drop()
    assert do(cmds, lambda t: t.emit_data("d4", "b", {}))
    assert do(cmds, lambda t: t.emit_info({"k": 1}))
    assert do(cmds, lambda t: t.keep_alive())
    s.sync()
    before = len(s.sent)
    s.welcome(True)
    after = s.sent[before:]
    # the attempt's STARTED again (the broker drops a repeat), d3 (sent, not confirmed) again,
    # then what waited, in the order it was emitted; the INFO is item 5 of the sequence
    assert [(n, f.get("index")) for n, f in after] == \
        [("STARTED", None), ("DATA", 3), ("DATA", 4), ("INFO", 5), ("TASK_ALIVE", None)]
    assert w.data_resent == 1
    assert [f["index"] for f in s.of("DATA")] == [1, 2, 3, 3, 4]
    # the broker saw something out of order: everything not confirmed goes again
    s.deliver("DATA_ACK", task_id="t1", attempt=1, relayed=3, resend=True)
    assert [f["index"] for f in s.of("DATA")][-1:] == [4]
    assert [f["index"] for f in s.of("INFO")] == [5, 5]
    assert w.data_resent == 3  # d4 and the INFO


def test_data_that_wait_together_leave_as_one_batch_and_are_kept_item_by_item(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run, batch_data=True)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    s.drop()  # what is emitted now waits in the outbox together
    for i in range(1, 6):
        assert do(cmds, lambda t, i=i: t.emit_data(f"d{i}", "b", {"i": i},
                                                   b"p" * i if i % 2 else None))
    deep = {"x": [[[[[[[[[[[[0]]]]]]]]]]]]}  # meta of 13 levels: too deep for a batch
    assert do(cmds, lambda t: t.emit_data("d6", "b", deep))
    assert do(cmds, lambda t: t.emit_data("d7", "b", {}))
    s.sync()
    before = len(s.sent)
    s.welcome(True)
    after = s.sent[before:]
    assert [n for n, _ in after] == ["STARTED", "DATA_BATCH", "DATA", "DATA"]
    batch = after[1][1]
    assert batch["first_index"] == 1 and batch["attempt"] == 1
    items = batch["items"].value()
    # each item is the DATA it stands for, without task, attempt and index
    assert items == [dict({"data_id": f"d{i}", "buffer_id": "b", "meta": {"i": i}},
                          **({"payload": b"p" * i} if i % 2 else {})) for i in range(1, 6)]
    assert [f["index"] for _, f in after[2:]] == [6, 7]
    assert w.data_batches == 1 and w.data_batched == 5
    # kept item by item: a partial confirmation lets go of 1..3, the rest go again, batched
    s.deliver("DATA_ACK", task_id="t1", attempt=1, relayed=3, resend=True)
    again = s.sent[before + 4:]
    assert [n for n, _ in again] == ["DATA_BATCH", "DATA", "DATA"]
    assert again[0][1]["first_index"] == 4 and len(again[0][1]["items"].value()) == 2
    assert w.data_resent == 4


def test_the_last_outcome_goes_again_after_a_resumption_until_the_next_task(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run, close=lambda t: {"n": 1})
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    s.deliver("TASK_CLOSE", task_id="t1", attempt=1)
    assert wait_until(lambda: len(s.of("RESULT")) == 1)
    s.drop()
    s.welcome(True)  # the RESULT may have gone down with the old connection
    assert wait_until(lambda: len(s.of("RESULT")) == 2)
    assert s.of("RESULT")[1] == s.of("RESULT")[0]
    start(s, "t2")  # the broker moved on: the outcome of t1 is not sent again
    assert wait_until(lambda: len(tasks) == 2)
    s.drop()
    s.welcome(True)
    s.sync()
    assert len(s.of("RESULT")) == 2
    assert [f["task_id"] for f in s.of("STARTED")] == ["t1", "t2", "t2"]


def test_a_new_session_ends_the_attempt_and_drops_what_waited(fake) -> None:
    run, cmds, tasks = scripted()
    closes: List[str] = []
    w, s = fake(run, close=lambda t: closes.append(t.id))
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    assert do(cmds, lambda t: t.emit_data("d1", "b", {}))
    s.drop()
    assert do(cmds, lambda t: t.emit_data("d2", "b", {}))
    s.sync()
    n = len(s.sent)
    s.welcome(False)
    assert s.sent[n:] == []  # nothing of the old attempt reaches the new session
    assert tasks[0].aborted and "new session" in tasks[0].abort_reason
    assert not tasks[0].emit_data("d3", "b", {})
    # the worker is free for the next task; the ended one was never closed
    start(s, "t2")
    assert wait_until(lambda: len(tasks) == 2)
    s.deliver("TASK_CLOSE", task_id="t2", attempt=1)
    assert wait_until(lambda: bool(s.of("RESULT")))
    assert closes == ["t2"]


def test_unconfirmed_bounds_let_the_oldest_go_and_declare_them_lost(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run, max_unconfirmed_data=3, max_unconfirmed_bytes=1 << 20)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    for i in range(1, 7):
        assert do(cmds, lambda t, i=i: t.emit_data(f"d{i}", "b", {}))
    s.sync()
    assert w.data_dropped == 3
    s.deliver("DATA_ACK", task_id="t1", attempt=1, relayed=1, resend=True)
    lost = s.of("DATA_LOST")
    assert lost == [{"task_id": "t1", "attempt": 1, "first": 2, "last": 3}]
    assert [f["index"] for f in s.of("DATA")][-3:] == [4, 5, 6]
    assert s.names()[-4] == "DATA_LOST"


def test_the_byte_bound_keeps_at_least_the_newest(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run, max_unconfirmed_bytes=0)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    for i in range(1, 4):
        assert do(cmds, lambda t, i=i: t.emit_data(f"d{i}", "b", {}, b"x" * 100))
    s.sync()
    assert w.data_dropped == 2
    s.welcome(True)
    assert s.of("DATA_LOST")[-1]["last"] == 2
    assert s.of("DATA")[-1]["index"] == 3


def test_credit_before_the_start_applies_and_close_releases_a_waiting_emit(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run)
    s.deliver("DATA_CREDIT", task_id="t1", attempt=1, limit=1)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    t = tasks[0]
    assert t.emit_data("d1", "b", {})
    results: "queue.Queue[bool]" = queue.Queue()
    th = threading.Thread(target=lambda: results.put(t.emit_data("d2", "b", {})))
    th.start()
    assert wait_until(lambda: w.credit_waits == 1)
    s.deliver("DATA_CREDIT", task_id="t1", attempt=1, limit=2)
    assert results.get(timeout=5) is True
    th2 = threading.Thread(target=lambda: results.put(t.emit_data("d3", "b", {})))
    th2.start()
    assert wait_until(lambda: w.credit_waits == 2)
    s.deliver("TASK_CLOSE", task_id="t1", attempt=1)
    assert results.get(timeout=5) is False  # no credit came before the close
    th.join()
    th2.join()
    s.sync()
    assert [f["index"] for f in s.of("DATA")] == [1, 2]


def test_close_results_that_are_not_maps_fail_the_attempt(fake) -> None:
    w, s = fake(lambda t: None, close=lambda t: [1, 2])
    start(s, "t1")
    s.deliver("TASK_CLOSE", task_id="t1", attempt=1)
    assert wait_until(lambda: bool(s.of("TASK_FAILED")))
    failed = s.of("TASK_FAILED")[0]
    assert "close() result" in failed["reason"] and "result" not in failed
    assert not s.of("RESULT")


def test_a_failure_result_that_cannot_travel_is_left_out(fake) -> None:
    def run(task: Task) -> None:
        raise worker_mod.TaskFailure("x" * 3000, result="not a map")

    w, s = fake(run)
    start(s, "t1")
    assert wait_until(lambda: bool(s.of("TASK_FAILED")))
    failed = s.of("TASK_FAILED")[0]
    assert len(failed["reason"]) == 1024 and "result" not in failed


def test_bad_user_fields_raise_in_the_caller(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    t = tasks[0]
    with pytest.raises(ValueError, match="meta"):
        t.emit_data("d", "b", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        t.emit_data("d" * 300, "b", {})
    with pytest.raises(ValueError, match="params and ref"):
        t.publish_policy("p", 1)
    with pytest.raises(ValueError, match="learner"):
        t.publish_policy("p", 1, ref="r")
    with pytest.raises(ValueError, match="get_data: only a learner task"):
        t.get_data("b", 1, 0, timeout=1)
    with pytest.raises(ValueError, match="emit_learn_info: only a learner task"):
        t.emit_learn_info("b", {})
    s.sync()
    assert not s.of("DATA") and not s.of("POLICY") and not s.of("GET_DATA")
    assert not s.of("LEARN_INFO")
    assert t.emit_data("d", "b", {})  # the failed calls used no index
    # every shape of field: the body written in one go is the canonical one (FakeCore.send)
    assert t.emit_data("d2", "b", {"x": [1.0, {"y": "\u00e9", 3: None}], "z": True},
                       bytearray(b"\x00\xff"))
    raw = P.Raw(P.pack_value({"f32": 1.5}).replace(b"\xcb", b"\xca", 1)[:-4])  # a float32
    assert t.emit_data("d3", "b", raw)
    s.sync()
    sent = s.of("DATA")
    assert [d["index"] for d in sent] == [1, 2, 3]
    assert sent[1]["payload"] == b"\x00\xff" and bytes(sent[2]["meta"]) == bytes(raw)


def test_policy_updates_only_move_forward_and_reach_on_policy_in_order(fake) -> None:
    run, cmds, tasks = scripted()
    seen: List[Tuple[int, str]] = []
    w, s = fake(run, on_policy=lambda t, p: seen.append((p.version, t.id)))
    start(s, "t1", policy_id="p", policy_version=3, policy_ref="r3")
    assert wait_until(lambda: bool(tasks))
    assert tasks[0].policy() == worker_mod.Policy("p", 3, "r3", None)
    for v in (2, 3, 4, 6, 5):
        s.deliver("POLICY_UPDATE", task_id="t1", attempt=1, policy_id="p", policy_version=v,
                  policy_params=bytes([v]))
    assert wait_until(lambda: bool(seen) and seen[-1] == (6, "t1"))
    assert seen in ([(4, "t1"), (6, "t1")], [(6, "t1")])  # 4 may be skipped for 6
    assert tasks[0].policy() == worker_mod.Policy("p", 6, None, b"\x06")
    assert do(cmds, lambda t: t.emit_data("d", "b", {}))
    s.sync()
    assert s.of("DATA")[0]["policy_version"] == 6


def test_close_from_inside_run_does_not_deadlock(fake) -> None:
    box: Dict[str, Worker] = {}
    done = threading.Event()

    def run(task: Task) -> None:
        box["w"].close()
        done.set()

    w, s = fake(run)
    box["w"] = w
    start(s, "t1")
    assert done.wait(5)
    assert w.wait_closed(5)
    assert w.state == "stopped"


def test_get_data_asks_again_after_a_resume_only_what_the_old_connection_carried(fake) -> None:
    run, cmds, tasks = scripted()
    w, s = fake(run, role="learner")
    start(s, "t1", kind="learner")
    assert wait_until(lambda: bool(tasks))
    t = tasks[0]
    out: "queue.Queue[Any]" = queue.Queue()
    th = threading.Thread(target=lambda: out.put(t.get_data("b", 2, 0, timeout=10)))
    th.start()
    assert wait_until(lambda: len(s.of("GET_DATA")) == 1)
    first = s.of("GET_DATA")[0]["request_id"]
    s.drop()
    s.welcome(True)  # nothing came back on the old connection: ask again
    assert wait_until(lambda: len(s.of("GET_DATA")) == 2)
    second = s.of("GET_DATA")[1]["request_id"]
    assert second != first
    # an answer to the replaced request is not taken for the new one
    s.deliver("LEARN", task_id="t1", attempt=1, request_id=first, data=P.Raw.of("old"))
    s.deliver("LEARN", task_id="t1", attempt=1, request_id=second, data=P.Raw.of({1: "new"}))
    assert out.get(timeout=5) == {1: "new"}
    th.join()
    # a request still waiting to be sent when the connection went is sent once, not twice
    s.drop()
    th = threading.Thread(target=lambda: out.put(t.get_data("b", 2, 1, timeout=10)))
    th.start()
    assert wait_until(lambda: bool(t._open))
    s.sync()
    s.welcome(True)
    assert wait_until(lambda: len(s.of("GET_DATA")) == 3)
    s.sync()
    assert len(s.of("GET_DATA")) == 3
    s.deliver("NO_DATA", task_id="t1", attempt=1, request_id=s.of("GET_DATA")[2]["request_id"],
              retry_ms=0)
    assert wait_until(lambda: len(s.of("GET_DATA")) == 4)
    s.deliver("TASK_CLOSE", task_id="t1", attempt=1)
    assert out.get(timeout=5) is None
    th.join()
    with pytest.raises(ValueError, match="emit_data: only a collector task"):
        t.emit_data("d", "b", {})
    with pytest.raises(ValueError, match="emit_info: only a collector task"):
        t.emit_info({})


def test_a_slow_on_policy_gets_the_newest_version_and_nothing_piles_up(fake) -> None:
    run, cmds, tasks = scripted()
    seen: List[int] = []
    gate = threading.Event()

    def on_policy(task: Task, p: worker_mod.Policy) -> None:
        seen.append(p.version)
        gate.wait(5)

    w, s = fake(run, on_policy=on_policy)
    start(s, "t1")
    assert wait_until(lambda: bool(tasks))
    s.deliver("POLICY_UPDATE", task_id="t1", attempt=1, policy_id="p", policy_version=1,
              policy_ref="r")
    assert wait_until(lambda: seen == [1])
    for v in range(2, 50):  # while on_policy is busy with version 1
        s.deliver("POLICY_UPDATE", task_id="t1", attempt=1, policy_id="p", policy_version=v,
                  policy_ref="r")
    gate.set()
    assert wait_until(lambda: seen[-1] == 49)
    assert seen == [1, 49]
    assert tasks[0].policy().version == 49
