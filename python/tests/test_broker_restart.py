"""A broker SIGKILLed and started again on its journal (SPEC §14), with the Python SDKs on both
sides: running tasks come back as a new attempt, queued ones stay queued, every task finishes
exactly once, and a coordinator process that never saw a task's end is handed it. Also what a
damaged journal does to the start."""

from __future__ import annotations

import os
import subprocess
import threading

import msgpack
from typing import Any, List

from conftest import BROKER, wait_until
from rlbus import Worker
from rlbus.coordinator import Coordinator
from test_coordinator import Recorder, RawWorker, uid

FAST = dict(heartbeat=0.1, reconnect_min=0.05, reconnect_max=0.2)


def journal_path(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "broker.journal")


def vanish(raw: RawWorker) -> None:
    """Closes a raw peer without a word: no DISCONNECT, nothing left to send later."""
    raw.sock.close(linger=0)
    raw.ctx.term()


def finish_unacknowledged(broker: Any, closing: Any, cid: str) -> RawWorker:
    """Runs one task, "the-task", to its end ({"score": 195}) for coordinator ``cid``, a raw
    coordinator that never ACKs; returns it, its `finished` event received."""
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
    return old


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
    old = finish_unacknowledged(broker, closing, cid)
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


# ---- the journal file, read as SPEC §14 lays it out: a signature, then records ----

def records(path: str) -> List[tuple]:
    """(offset, type, length) of every whole record in the journal at ``path``."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "little")
        if pos + 8 + length > len(data):
            break
        out.append((pos, data[pos + 8], length))
        pos += 8 + length
    return out


def start_fails(path: str, *extra: str) -> subprocess.CompletedProcess:
    """A broker started on ``path`` that must exit at once: its exit status and words."""
    return subprocess.run([BROKER, "--router", "tcp://127.0.0.1:0", "--events",
                           "tcp://127.0.0.1:0", "--journal", path, *extra],
                          capture_output=True, text=True, timeout=30)


def test_a_damaged_length_in_the_middle_stops_the_start_and_keeps_every_record(
        broker_factory: Any, closing: Any, tmp_path: Any) -> None:
    path = journal_path(tmp_path)
    broker = broker_factory("--journal", path)
    raw = RawWorker(broker.router, "coordinator", id=uid("coord"))
    closing(raw)
    for i in range(20):
        raw.send("SUBMIT", task_id=f"q{i}", kind="learner", task_info={"i": i})
        assert raw.expect("SUBMITTED")["accepted"]
    broker.kill()
    vanish(raw)
    submitted = [r for r in records(path) if r[1] == 1]
    assert len(submitted) == 20
    second = submitted[1][0]
    with open(path, "r+b") as f:  # the high byte of the second record's length
        f.seek(second + 3)
        f.write(b"\x01")
    with open(path, "rb") as f:
        damaged = f.read()
    r = start_fails(path)
    words = r.stdout + r.stderr
    assert r.returncode == 1, words
    assert f"byte {second}" in words and "damaged" in words and "truncate -s" in words, words
    with open(path, "rb") as f:
        assert f.read() == damaged  # nothing compacted away
    with open(path, "r+b") as f:  # the operator puts the byte back: every task is there
        f.seek(second + 3)
        f.write(b"\x00")
    broker.start()
    op = RawWorker(broker.router, "coordinator", id=uid("op"))
    closing(op)
    op.send("OPS", request_id=1, verb="tasks", limit=100)
    result = op.expect("OPS_REPLY")["result"]
    if isinstance(result, bytes):
        result = msgpack.unpackb(result)
    assert sorted(t["id"] for t in result["tasks"]) == sorted(f"q{i}" for i in range(20))


def test_a_task_whose_end_was_journaled_is_not_run_again_after_a_kill_before_its_erasure(
        broker_factory: Any, closing: Any, tmp_path: Any) -> None:
    """The window of a kill after the `finished` event was written and before the record
    that ends the task: that record is cut off the journal, as the kill would have left it."""
    path = journal_path(tmp_path)
    broker = broker_factory("--journal", path)
    cid = uid("coord")
    old = finish_unacknowledged(broker, closing, cid)
    # the record that ends the task (type 4) follows the end event (type 5) in the file
    assert wait_until(lambda: any(t == 4 for _, t, _ in records(path)))
    broker.kill()
    vanish(old)
    ended = [off for off, t, _ in records(path) if t == 4]
    assert ended and any(t == 5 for _, t, _ in records(path))
    with open(path, "r+b") as f:
        f.truncate(ended[-1])
    broker.start()
    w2 = RawWorker(broker.router, "collector")  # a worker ready for it, were it queued
    closing(w2)
    rec = Recorder()
    c = Coordinator(broker.router, id=cid, callbacks=rec, **FAST)
    closing(c)
    assert c.wait_for("ready", 10), c.last_error
    assert wait_until(lambda: rec.of("collector_finish") == [("the-task", {"score": 195})])
    # one more task through the same stream: every event before it has arrived, and the
    # waiting worker is handed that one, not the ended task again
    assert c.submit("after", "collector").accepted
    assert w2.take()[0] == "after"
    assert rec.of("requeued") == [] and rec.of("collector_finish") == [
        ("the-task", {"score": 195})]


def test_a_second_broker_on_a_journal_in_use_exits_2_naming_the_holder(
        broker_factory: Any, tmp_path: Any) -> None:
    path = journal_path(tmp_path)
    broker = broker_factory("--journal", path)
    r = start_fails(path)
    words = r.stdout + r.stderr
    assert r.returncode == 2, words
    assert path in words and f"process {broker.proc.pid}" in words, words
    assert broker.proc.poll() is None
    broker.stop()
    broker.start()  # the lock went with the first broker


def test_a_journal_cut_inside_its_signature_is_taken_as_empty(
        broker_factory: Any, tmp_path: Any) -> None:
    path = journal_path(tmp_path)
    with open(path, "wb") as f:
        f.write(b"RLBU")  # a crash while the file was created
    broker = broker_factory("--journal", path, "--log-level", "info")
    assert any("taken as empty" in line for line in broker.lines), broker.lines
    with open(path, "rb") as f:
        assert f.read(8) == b"RLBUSJ1\n"
