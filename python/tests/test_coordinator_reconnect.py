"""The Coordinator across connection losses: a broker restart (a new session: the broker
cancelled the old session's tasks), a network partition short enough for the session to
be resumed (the stream goes on, every event handled exactly once), one long enough for the
broker to expire the session (the same process adopts its own tasks back), and a coordinator
process SIGKILLed and started again (the new process adopts the tasks, SPEC §12.5.8)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Iterator

from conftest import PYTHON_DIR, Broker, wait_until
from relay import Relay
from rlbus.coordinator import SESSION_LOST_REASON, Coordinator
from test_coordinator import Recorder, RawWorker, uid


def test_after_a_broker_restart_it_comes_back_and_reports_its_tasks_cancelled(
        broker: Broker, closing: Any) -> None:
    rec = Recorder()
    c = Coordinator(broker.router, id=uid("coord"), callbacks=rec, heartbeat=0.1,
                    reconnect_min=0.05, reconnect_max=0.2)
    closing(c)
    assert c.wait_for("ready", 10)
    assert c.submit("queued-1", "collector").accepted
    assert c.submit("queued-2", "learner").accepted
    assert c.open_tasks == 2
    broker.kill()
    broker.start()  # same ports, a new epoch: the old session and its tasks are gone
    assert wait_until(lambda: c.welcomes >= 2 and c.state == "ready", 20), c.last_error
    assert wait_until(lambda: len(rec.of("cancelled")) == 2)
    assert sorted(rec.of("cancelled")) == [("queued-1", SESSION_LOST_REASON),
                                           ("queued-2", SESSION_LOST_REASON)]
    assert c.open_tasks == 0
    # the new session works: the same id again, and its stream starts over at 1
    w = RawWorker(broker.router, "collector")
    closing(w)
    assert c.submit("queued-1", "collector").accepted
    task, attempt = w.take()
    w.send("DATA", task_id=task, attempt=attempt, data_id="after", buffer_id="b", meta={})
    assert wait_until(lambda: rec.of("data"))
    assert [a[2] for a in rec.of("data")] == ["after"]
    assert c.stream_gaps == 0
    assert c.stream_replays >= 2  # one per connection


def test_a_resumed_session_hands_on_every_event_exactly_once(broker: Broker,
                                                             closing: Any) -> None:
    proxy = Relay(broker.router_port)
    closing(proxy)
    rec = Recorder()
    held = threading.Event()
    release = threading.Event()
    record = rec.deal_with_collector_send_data

    def on_data(task_id: str, buffer_id: str, data_id: str, data: Any) -> None:
        if data_id == "d15":  # the callbacks fall behind what has arrived
            held.set()
            release.wait(20)
        record(task_id, buffer_id, data_id, data)
    rec.deal_with_collector_send_data = on_data  # type: ignore[assignment]
    c = Coordinator(proxy.endpoint, id=uid("coord"), callbacks=rec, heartbeat=1.0,
                    reconnect_min=0.05, reconnect_max=0.1)
    closing(c)
    assert c.wait_for("ready", 10)
    token = c._core.token
    w = RawWorker(broker.router, "collector")
    closing(w)
    assert c.submit("col-r", "collector").accepted
    task, attempt = w.take()
    # stream: 1 assigned, 2 started, 3..22 the DATA d1..d20
    for i in range(1, 21):
        w.send("DATA", task_id=task, attempt=attempt, data_id=f"d{i}", buffer_id="", meta={"i": i})
    assert held.wait(10)
    assert wait_until(lambda: c._stream.next_seq == 23)  # d16..d20 arrived, not handled yet
    proxy.freeze()
    # these go down with the silenced connection
    for i in range(21, 41):
        w.send("DATA", task_id=task, attempt=attempt, data_id=f"d{i}", buffer_id="", meta={"i": i})
    # the coordinator notices the silence and resumes its session on a new connection
    assert wait_until(lambda: c.welcomes == 2 and c.state == "ready", 15), c.last_error
    assert c._core.token == token
    release.set()
    assert wait_until(lambda: len(rec.of("data")) >= 40)
    assert [a[2] for a in rec.of("data")] == [f"d{i}" for i in range(1, 41)]
    # the replay asked from d15 (the first event not handled): d15..d20 came twice
    assert c.stream_duplicates == 6
    assert c.stream_gaps == 0 and c.stream_replays == 2
    assert rec.of("cancelled") == [] and c.open_tasks == 1
    # the task lives on: judged final, closed, finished
    w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    w.expect("TASK_CLOSE")
    w.send("RESULT", task_id=task, attempt=attempt, result={"n": 40})
    assert wait_until(lambda: rec.of("collector_finish") == [("col-r", {"n": 40})])
    assert len([a for a in rec.of("data")]) == 40


def test_a_session_expired_in_a_partition_adopts_its_own_tasks_back(broker: Broker,
                                                                     closing: Any) -> None:
    proxy = Relay(broker.router_port)
    closing(proxy)
    rec = Recorder()
    cid = uid("coord")
    # a 300 ms window: the partition below outlasts it, and the broker expires the session
    c = Coordinator(proxy.endpoint, id=cid, callbacks=rec, heartbeat=0.1,
                    reconnect_min=0.05, reconnect_max=0.1)
    closing(c)
    assert c.wait_for("ready", 10)
    token = c._core.token
    w = RawWorker(broker.router, "collector")
    closing(w)
    assert c.submit("col-x", "collector").accepted
    task, attempt = w.take()
    for i in range(1, 11):
        w.send("DATA", task_id=task, attempt=attempt, data_id=f"d{i}", buffer_id="", meta={"i": i})
    assert wait_until(lambda: len(rec.of("data")) == 10)
    proxy.freeze(new_ones_too=True)
    for i in range(11, 21):  # made while nobody can be told
        w.send("DATA", task_id=task, attempt=attempt, data_id=f"d{i}", buffer_id="", meta={"i": i})
    assert wait_until(lambda: any("vanished" in line and cid in line for line in broker.lines),
                      10), "".join(broker.lines)
    proxy.thaw()
    assert wait_until(lambda: c.state == "ready" and c._core.token not in (0, token), 15), \
        c.last_error
    # a new session, but the stream and the task go on: nothing cancelled, lost or twice
    assert wait_until(lambda: len(rec.of("data")) >= 20)
    assert [a[2] for a in rec.of("data")] == [f"d{i}" for i in range(1, 21)]
    assert rec.of("cancelled") == [] and c.open_tasks == 1 and c.stream_gaps == 0
    w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    w.expect("TASK_CLOSE")  # the FINISH came from the adopting session
    w.send("RESULT", task_id=task, attempt=attempt, result={"n": 20})
    assert wait_until(lambda: rec.of("collector_finish") == [("col-x", {"n": 20})])


OLD_COORDINATOR = """
import sys, rlbus
c = rlbus.Coordinator(sys.argv[1], id=sys.argv[2], callbacks={}, heartbeat=0.1,
                      reconnect_min=0.05, reconnect_max=0.2)
assert c.wait_for("ready", 10), c.last_error
for task in sys.argv[3:]:  # task_id, or task_id:kind
    task_id, _, kind = task.partition(":")
    r = c.submit(task_id, kind or "collector")
    assert r is not None and r.accepted, r
print("submitted", flush=True)
sys.stdin.read()  # until killed
"""


@contextlib.contextmanager
def coordinator_process(broker: Broker, cid: str, *tasks: str) -> Iterator[None]:
    """A coordinator process of id `cid` that submitted `tasks` (task_id, or task_id:kind);
    SIGKILLed on the way out, so the broker hears no DISCONNECT from it."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    old = subprocess.Popen([sys.executable, "-c", OLD_COORDINATOR, broker.router, cid, *tasks],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert old.stdout is not None
        assert old.stdout.readline().strip() == "submitted"
        yield
    finally:
        old.send_signal(signal.SIGKILL)
        old.wait(10)


def test_a_restarted_coordinator_process_adopts_the_tasks_of_the_killed_one(
        broker: Broker, closing: Any) -> None:
    cid = uid("coord")
    workers = [RawWorker(broker.router, "collector") for _ in range(2)]
    for w in workers:
        closing(w)
    with coordinator_process(broker, cid, "job-1", "job-2"):
        taken = dict(w.take() for w in workers)  # both running, attempt 1
        assert sorted(taken) == ["job-1", "job-2"] and set(taken.values()) == {1}
        for w, (task, attempt) in zip(workers, taken.items()):
            w.send("DATA", task_id=task, attempt=attempt, data_id="before", buffer_id="",
                   meta={})
    rec = Recorder()
    # refused (409) while the killed process's session lives, admitted once it expired
    c = Coordinator(broker.router, id=cid, callbacks=rec, reconnect_min=0.05, reconnect_max=0.2)
    closing(c)
    assert c.wait_for("ready", 15), c.last_error
    for w, (task, attempt) in zip(workers, sorted(taken.items())):
        w.send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    for w, (task, attempt) in zip(workers, sorted(taken.items())):
        w.expect("TASK_CLOSE")  # the new process judged and closed a task it never submitted
        w.send("RESULT", task_id=task, attempt=attempt, result={"by": w.id})
    assert wait_until(lambda: len(rec.of("collector_finish")) == 2)
    # one more task through the same stream: every event before it has been handled
    assert c.submit("job-3", "collector").accepted
    task, attempt = workers[0].take()
    workers[0].send("INFO", task_id=task, attempt=attempt, info={"collector_done": True})
    workers[0].expect("TASK_CLOSE")
    workers[0].send("RESULT", task_id=task, attempt=attempt, result={})
    assert wait_until(lambda: len(rec.of("collector_finish")) == 3)
    assert sorted(a[0] for a in rec.of("collector_finish")) == ["job-1", "job-2", "job-3"]
    assert rec.of("cancelled") == [] and rec.of("requeued") == [] and c.stream_gaps == 0
    for w in workers:  # never aborted, never run again
        assert not [m for m in w.backlog if m.name in ("TASK_ABORT", "TASK_START")]


def test_a_learner_task_adopted_by_a_new_process_finishes_in_the_learner_callback(
        broker: Broker, closing: Any) -> None:
    # The new process never saw the SUBMIT and hears no learner traffic before the task ends:
    # only the finished event's kind (SPEC §12.3.6) says which callback its result belongs to.
    cid = uid("coord")
    learner = RawWorker(broker.router, "learner")
    closing(learner)
    with coordinator_process(broker, cid, "learn-1:learner"):
        task, attempt = learner.take()
    rec = Recorder()
    c = Coordinator(broker.router, id=cid, callbacks=rec, reconnect_min=0.05, reconnect_max=0.2)
    closing(c)
    assert c.wait_for("ready", 15), c.last_error
    c.finish(task)
    learner.expect("TASK_CLOSE")
    learner.send("RESULT", task_id=task, attempt=attempt, result={"learner_step": 7})
    assert wait_until(lambda: rec.of("learner_finish") or rec.of("collector_finish"))
    assert rec.of("learner_finish") == [("learn-1", {"learner_step": 7})]
    assert rec.of("collector_finish") == []
