"""A broker SIGKILLed and started again on its journal (SPEC §14), with the Python SDKs on both
sides: running tasks come back as a new attempt, queued ones stay queued, every task finishes
exactly once, and a coordinator process that never saw a task's end is handed it. Also what a
damaged journal does to the start."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Any, List

from conftest import BROKER, wait_until
from rlbus import Worker
from rlbus.coordinator import Coordinator
from test_coordinator import Recorder, RawWorker, closing, uid  # noqa: F401 (fixture)

FAST = dict(heartbeat_ms=100, reconnect_min=0.05, reconnect_max=0.2)


def journal_path(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "broker.journal")


def vanish(raw: RawWorker) -> None:
    """Closes a raw peer without a word: no DISCONNECT, nothing left to send later."""
    raw.sock.close(linger=0)
    raw.ctx.term()


def test_a_killed_broker_started_on_its_journal_finishes_every_task_exactly_once(
        broker_factory: Any, closing: Any, tmp_path: Any) -> None:
    broker = broker_factory("--journal", journal_path(tmp_path))
    release = threading.Event()
    runs: List[tuple] = []
    lock = threading.Lock()

    def run(task: Any) -> None:
        with lock:
            runs.append((task.id, task.attempt))
        for i in range(3):
            if not task.emit_data(f"{task.id}-{task.attempt}-{i}", "buf", {"i": i}):
                return
        while not release.is_set():
            if task.wait_stop(0.05):
                return  # the attempt ended (the broker went away)
        task.emit_info({"collector_done": True})
        task.wait_stop(20)

    rec = Recorder()
    c = Coordinator(broker.router, id=uid("coord"), callbacks=rec, **FAST)
    closing(c)
    assert c.wait_for("ready", 10)
    workers = [Worker(broker.router, "collector", uid("w"), run=run, **FAST) for _ in range(2)]
    for w in workers:
        closing(w)
    tasks = [f"job-{i}" for i in range(4)]
    for t in tasks:
        assert c.submit(t, "collector").accepted
    assert wait_until(lambda: len(runs) == 2)  # two running, two queued
    running = sorted(t for t, _ in runs)
    broker.kill()
    broker.start()  # the same ports and journal
    release.set()
    assert wait_until(lambda: len(rec.of("collector_finish")) == 4, 30), rec.names()
    # one more task through the same stream: every event before it has been handled
    assert c.submit("after", "collector").accepted
    assert wait_until(lambda: len(rec.of("collector_finish")) == 5, 20)
    assert sorted(a[0] for a in rec.of("collector_finish")) == sorted(tasks + ["after"])
    # the two attempts the crash ended are named, with the reason; nothing else ended
    restarted = [a for a in rec.of("requeued") if a[2] == "broker restarted"]
    assert sorted((a[0], a[1]) for a in restarted) == [(t, 1) for t in running]
    assert rec.of("cancelled") == [] and rec.of("failed") == []
    with lock:
        assert sorted(a for t, a in runs if t in running) == [1, 1, 2, 2]  # ran again, once
        assert all(a == 1 for t, a in runs if t not in running)  # queued ones waited


def test_a_new_coordinator_process_is_handed_the_end_its_predecessor_never_saw(
        broker_factory: Any, closing: Any, tmp_path: Any) -> None:
    broker = broker_factory("--journal", journal_path(tmp_path))
    cid = uid("coord")
    old = RawWorker(broker.router, "coordinator", id=cid)  # a coordinator that never ACKs
    w = RawWorker(broker.router, "collector")
    closing(old)  # (after vanish() a no-op; before it, a failing test leaves no socket open)
    closing(w)
    old.send("REPLAY", from_seq=1)
    old.send("SUBMIT", task_id="the-task", kind="collector", task_info={})
    assert old.expect("SUBMITTED")["accepted"]
    task, attempt = w.take()
    # FINISH once the broker has the STARTED: sent at once, it can overtake it (two
    # connections) and be refused as out of order, and no TASK_CLOSE would ever come.
    old.expect("TASK_EVENT", where=lambda m: m["event"] == "started")
    old.send("FINISH", task_id=task)
    w.expect("TASK_CLOSE")
    w.send("RESULT", task_id=task, attempt=attempt, result={"score": 195})
    old.expect("TASK_EVENT", where=lambda m: m["event"] == "finished")
    broker.kill()  # with the coordinator: neither had acknowledged the end
    vanish(old)
    broker.start()
    rec = Recorder()
    c = Coordinator(broker.router, id=cid, callbacks=rec, **FAST)
    closing(c)
    assert c.wait_for("ready", 10), c.last_error
    assert wait_until(lambda: rec.of("collector_finish") == [("the-task", {"score": 195})])
    # assigned and started were not kept: reported lost, never skipped in silence
    assert c.stream_gaps > 0 and rec.of("stream_lost")
    assert rec.of("requeued") == [] and rec.of("cancelled") == []


def test_a_torn_journal_tail_is_skipped_and_a_damaged_journal_stops_the_start(
        broker_factory: Any, closing: Any, tmp_path: Any) -> None:
    path = journal_path(tmp_path)
    broker = broker_factory("--journal", path)
    raw = RawWorker(broker.router, "coordinator", id=uid("coord"))
    closing(raw)
    for i in range(3):
        raw.send("SUBMIT", task_id=f"q{i}", kind="learner", task_info={})
        assert raw.expect("SUBMITTED")["accepted"]
    broker.kill()
    vanish(raw)
    with open(path, "ab") as f:
        f.write(b"\x30\x00\x00\x00\x01")  # a record the crash cut short
    broker.start()
    assert any("skipped" in line for line in broker.lines), broker.lines
    learner = RawWorker(broker.router, "learner")  # the three tasks are still there
    closing(learner)
    assert [learner.take()[0] for _ in range(1)] == ["q0"]
    learner.close()
    broker.kill()
    with open(path, "r+b") as f:  # damage in the middle: a byte of the first record
        f.seek(20)
        b = f.read(1)
        f.seek(20)
        f.write(bytes([b[0] ^ 0xFF]))
    r = subprocess.run([BROKER, "--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
                        "--journal", path], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "damaged" in r.stdout + r.stderr and "byte 8" in r.stdout + r.stderr
