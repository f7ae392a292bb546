"""C++ and Python peers on one broker: a Python Coordinator drives C++ SDK workers, a C++
SDK coordinator drives Python Workers, a C++ and a Python collector share one coordinator's
tasks, and a Python worker SIGKILLed in the middle of a task hands it to another worker.

The C++ side is `rlbus-sdk-peer` (tests/peer/sdk_peer.cpp), which prints what it sees and
does as JSON lines; the tests follow those lines and the Python callbacks, always waiting
for a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from conftest import PEER, PYTHON_DIR, Broker, wait_until

import rlbus

DEADLINE = 20.0


def peer_binary() -> str:
    if os.path.exists(PEER):
        return PEER
    pytest.skip("rlbus-sdk-peer not built (ninja -C build tests/peer/rlbus-sdk-peer)")
    raise AssertionError("unreachable")


class CppPeer:
    """A running rlbus-sdk-peer: its JSON lines as they come."""

    def __init__(self, endpoint: str, role: str, id: str, *args: str) -> None:
        cmd = [peer_binary(), "--endpoint", endpoint, "--role", role, "--id", id,
               "--exit-on-eof", *args]
        self.id = id
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.events: List[Dict[str, Any]] = []
        self.raw: List[str] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.raw.append(line)
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    pass
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def of(self, event: str, **match: Any) -> List[Dict[str, Any]]:
        with self._cv:
            return [e for e in self.events if e.get("event") == event and
                    all(e.get(k) == v for k, v in match.items())]

    def wait(self, event: str, count: int = 1, timeout: float = DEADLINE,
             **match: Any) -> List[Dict[str, Any]]:
        """The first `count` events named `event` (with the given fields); fails the test
        when they do not come in time."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                got = [e for e in self.events if e.get("event") == event and
                       all(e.get(k) == v for k, v in match.items())]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"{self.id}: no {count} x {event} {match} within {timeout}s; "
                        f"output:\n" + "".join(self.raw[-40:]))
                self._cv.wait(min(left, 0.1))

    def stop(self) -> int:
        """Closes its stdin (it exits at end of input); kills it if it lingers."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


@pytest.fixture
def peers() -> Iterator[Callable[..., CppPeer]]:
    made: List[CppPeer] = []

    def start(endpoint: str, role: str, id: str, *args: str) -> CppPeer:
        p = CppPeer(endpoint, role, id, *args)
        made.append(p)
        return p
    yield start
    for p in made:
        p.stop()


class Recorder:
    """Coordinator callbacks that record what arrives, in arrival order."""

    def __init__(self, no_data_first: int = 0) -> None:
        self.lock = threading.Lock()
        self.log: List[tuple] = []
        self.no_data_first = no_data_first
        self.requests: Dict[str, int] = {}

    def _add(self, *item: Any) -> None:
        with self.lock:
            self.log.append(item)

    def of(self, name: str, task_id: Optional[str] = None) -> List[tuple]:
        with self.lock:
            return [e for e in self.log if e[0] == name and (task_id is None or e[1] == task_id)]

    def deal_with_collector_send_data(self, task_id: str, buffer_id: str, data_id: str,
                                      data: Any) -> None:
        self._add("data", task_id, buffer_id, data_id, data)

    def deal_with_collector_judge_finish(self, task_id: str, info: Any) -> bool:
        self._add("info", task_id, info)
        return bool(info.get("collector_done"))

    def deal_with_collector_finish_task(self, task_id: str, result: Any) -> None:
        self._add("finished", task_id, "collector", result)

    def deal_with_learner_get_data(self, task_id: str, buffer_id: str, batch_size: int,
                                   cur_learner_iter: int) -> Any:
        with self.lock:
            n = self.requests.get(task_id, 0)
            self.requests[task_id] = n + 1
        self._add("data_request", task_id, buffer_id, batch_size, cur_learner_iter)
        if n < self.no_data_first:
            return None
        return {"task_id": task_id, "iter": cur_learner_iter, "rows": [1.5, 2, "x"]}

    def deal_with_learner_judge_finish(self, task_id: str, info: Any) -> bool:
        self._add("learn_info", task_id, info)
        return bool(info.get("learner_done"))

    def deal_with_learner_finish_task(self, task_id: str, result: Any) -> None:
        self._add("finished", task_id, "learner", result)

    def on_task_requeued(self, task_id: str, attempt: int, reason: str, result: Any) -> None:
        self._add("requeued", task_id, attempt, reason, result)

    def on_task_failed(self, task_id: str, reason: str, result: Any) -> None:
        self._add("failed", task_id, reason, result)

    def on_task_cancelled(self, task_id: str, reason: str) -> None:
        self._add("cancelled", task_id, reason)


def submit(c: "rlbus.Coordinator", task_id: str, kind: str, info: Dict[str, Any],
           **kw: Any) -> None:
    r = c.submit(task_id, kind, info, **kw)
    assert r is not None and r.accepted, (task_id, r)


def data_ids(rec: Recorder, task_id: str) -> List[str]:
    return [e[3] for e in rec.of("data", task_id)]


# ---- a Python coordinator, C++ workers -------------------------------------------------------

def test_python_coordinator_drives_cpp_collector_and_learner(
        broker: Broker, peers: Callable[..., CppPeer]) -> None:
    col = peers(broker.router, "collector", "cpp-col", "--payload-bytes", "5")
    lrn = peers(broker.router, "learner", "cpp-lrn")
    col.wait("ready")
    lrn.wait("ready")
    rec = Recorder(no_data_first=1)
    with rlbus.Coordinator(broker.router, id="py-coord", callbacks=rec) as c:
        assert c.wait_for("ready", DEADLINE)
        tasks = [f"pc-c{i}" for i in range(3)]
        for t in tasks:
            submit(c, t, "collector", {"data": 5})
        submit(c, "pc-l0", "learner", {"steps": 4})
        assert wait_until(lambda: len(rec.of("finished")) == 4, DEADLINE), rec.log

        for t in tasks:
            # every DATA once, in the order emitted, each with its meta and payload
            assert data_ids(rec, t) == [f"{t}#{i}" for i in range(5)]
            for i, (_, _, buffer_id, data_id, data) in enumerate(rec.of("data", t)):
                assert buffer_id == "replay" and data["data_id"] == data_id
                assert data["meta"] == {"i": i, "worker": "cpp-col", "attempt": 1}
                assert data["payload"] == bytes([ord("a") + i]) * 5
            assert [e[2] for e in rec.of("info", t)] == [
                {"collector_done": True, "count": 5, "worker": "cpp-col"}]
            assert rec.of("finished", t) == [
                ("finished", t, "collector", {"worker": "cpp-col", "task_id": t, "count": 5})]
            # the result comes after everything else of its task
            last = max(i for i, e in enumerate(rec.log) if e[1] == t)
            assert rec.log[last][0] == "finished"

        # the learner: asked 4 batches (the first answered "no data yet" once), each step's
        # info in order, learner_done on the last, the result to the learner callback
        assert [e[4] for e in rec.of("data_request", "pc-l0")] == [0, 0, 1, 2, 3]
        assert [e[2]["learner_step"] for e in rec.of("learn_info", "pc-l0")] == [0, 1, 2, 3]
        assert rec.of("finished", "pc-l0") == [
            ("finished", "pc-l0", "learner", {"worker": "cpp-lrn", "task_id": "pc-l0",
                                              "steps": 4})]
        batches = lrn.wait("batch", 4, task_id="pc-l0")
        assert [b["data"] for b in batches] == [
            {"task_id": "pc-l0", "iter": i, "rows": [1.5, 2, "x"]} for i in range(4)]
        assert not lrn.of("no_batch")
        assert not rec.of("requeued") and not rec.of("failed")
        assert c.open_tasks == 0


# ---- a C++ coordinator, Python workers -------------------------------------------------------

class PyCollector:
    def __init__(self, name: str, delay: float = 0.0) -> None:
        self.name = name
        self.delay = delay
        self.started: List[tuple] = []
        self.sent: Dict[str, int] = {}

    def run(self, task: Any) -> None:
        self.started.append((task.id, task.attempt, task.info))
        n = int(task.info.get("data", 3))
        for i in range(n):
            assert task.emit_data(f"{task.id}#{i}", "replay",
                                  {"i": i, "worker": self.name, "attempt": task.attempt},
                                  payload=bytes([i]) * 3)
            if self.delay:
                task.wait_stop(self.delay)
        self.sent[task.id] = n
        assert task.emit_info({"collector_done": True, "count": n, "worker": self.name})
        task.wait_stop(DEADLINE)

    def close(self, task: Any) -> Dict[str, Any]:
        return {"worker": self.name, "task_id": task.id, "count": self.sent.get(task.id, 0)}


class PyLearner:
    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: List[tuple] = []

    def run(self, task: Any) -> None:
        steps = int(task.info.get("steps", 3))
        for i in range(steps):
            batch = task.get_data("replay", 4, i, timeout=DEADLINE)
            assert batch is not None, f"no batch for step {i}"
            self.batches.append((task.id, i, batch))
            assert task.emit_learn_info("replay", {"learner_step": i,
                                                   "learner_done": i == steps - 1,
                                                   "worker": self.name})
        task.wait_stop(DEADLINE)

    def close(self, task: Any) -> Dict[str, Any]:
        return {"worker": self.name, "task_id": task.id,
                "steps": sum(1 for b in self.batches if b[0] == task.id)}


def test_cpp_coordinator_drives_python_collector_and_learner(
        broker: Broker, peers: Callable[..., CppPeer]) -> None:
    pc, pl = PyCollector("py-col"), PyLearner("py-lrn")
    with rlbus.Worker(broker.router, role="collector", id="py-col", run=pc.run,
                      close=pc.close) as wc, \
            rlbus.Worker(broker.router, role="learner", id="py-lrn", run=pl.run,
                         close=pl.close) as wl:
        assert wc.wait_for("ready", DEADLINE) and wl.wait_for("ready", DEADLINE)
        coord = peers(broker.router, "coordinator", "cpp-coord", "--collector-tasks", "3",
                      "--learner-tasks", "1", "--data", "5", "--steps", "4",
                      "--no-data-first", "2", "--wait-collectors", "1", "--wait-learners", "1",
                      "--task-prefix", "cc")
        done = coord.wait("done")[0]
        assert done["tasks"] == 4 and done["open_tasks"] == 0 and done["stream_gaps"] == 0

        for t in ("cc-c0", "cc-c1", "cc-c2"):
            data = coord.of("data", task_id=t)
            assert [d["data_id"] for d in data] == [f"{t}#{i}" for i in range(5)]
            for i, d in enumerate(data):
                assert d["buffer_id"] == "replay"
                assert d["data"]["meta"] == {"i": i, "worker": "py-col", "attempt": 1}
                # a bin payload reaches JSON as nlohmann's binary value
                assert d["data"]["payload"]["bytes"] == [i] * 3
            assert [e["info"] for e in coord.of("info", task_id=t)] == [
                {"collector_done": True, "count": 5, "worker": "py-col"}]
            assert [e["result"] for e in coord.of("finished", task_id=t)] == [
                {"worker": "py-col", "task_id": t, "count": 5}]
        assert [s[0] for s in pc.started] == ["cc-c0", "cc-c1", "cc-c2"]
        assert all(s[2] == {"data": 5} for s in pc.started)

        # learner: 2 "no data yet" answers, then one batch per step, in order
        assert [r["answered"] for r in coord.of("data_request", task_id="cc-l0")] == \
            [False, False, True, True, True, True]
        assert pl.batches == [("cc-l0", i, {"task_id": "cc-l0", "iter": i, "batch_size": 4})
                              for i in range(4)]
        assert [e["info"]["learner_step"] for e in coord.of("learn_info", task_id="cc-l0")] \
            == [0, 1, 2, 3]
        assert [e["result"] for e in coord.of("finished", task_id="cc-l0")] == [
            {"worker": "py-lrn", "task_id": "cc-l0", "steps": 4}]
        assert not coord.of("requeued") and not coord.of("failed")
        assert coord.stop() == 0


# ---- one coordinator, a C++ and a Python collector -------------------------------------------

def test_mixed_fleet_shares_tasks(broker: Broker, peers: Callable[..., CppPeer]) -> None:
    cpp = peers(broker.router, "collector", "fleet-cpp", "--step-delay-ms", "20")
    pc = PyCollector("fleet-py", delay=0.02)
    rec = Recorder()
    with rlbus.Worker(broker.router, role="collector", id="fleet-py", run=pc.run,
                      close=pc.close) as w, \
            rlbus.Coordinator(broker.router, id="fleet-coord", callbacks=rec) as c:
        cpp.wait("ready")
        assert w.wait_for("ready", DEADLINE) and c.wait_for("ready", DEADLINE)
        assert wait_until(lambda: c.collectors == 2, DEADLINE)
        tasks = [f"fleet-{i}" for i in range(8)]
        for t in tasks:
            submit(c, t, "collector", {"data": 3})
        assert wait_until(lambda: len(rec.of("finished")) == len(tasks), DEADLINE), rec.log

        by_worker: Dict[str, List[str]] = {}
        for t in tasks:
            (_, _, _, result), = rec.of("finished", t)
            worker = result["worker"]
            by_worker.setdefault(worker, []).append(t)
            # each task's data once, in order, all from the worker that finished it
            assert data_ids(rec, t) == [f"{t}#{i}" for i in range(3)]
            assert {e[4]["meta"]["worker"] for e in rec.of("data", t)} == {worker}
            assert result == {"worker": worker, "task_id": t, "count": 3}
        assert set(by_worker) == {"fleet-cpp", "fleet-py"}, by_worker
        # what each worker says it ran is what the coordinator saw it finish
        assert sorted(e["task_id"] for e in cpp.of("close")) == sorted(by_worker["fleet-cpp"])
        assert sorted(s[0] for s in pc.started) == sorted(by_worker["fleet-py"])
        assert not rec.of("requeued") and c.open_tasks == 0


# ---- a Python worker SIGKILLed mid-task ---------------------------------------------------

VICTIM = r"""
import sys

import rlbus

endpoint = sys.argv[1]

def run(task):
    for i in range(2):
        task.emit_data(f"{task.id}#{i}", "replay", {"i": i, "worker": "victim"})
    print("hanging", task.id, task.attempt, flush=True)
    task.wait_stop(120)

w = rlbus.Worker(endpoint, role="collector", id="victim", run=run, heartbeat=0.1)
assert w.wait_for("ready", 20)
print("ready", flush=True)
sys.stdin.read()
w.close()
"""


def test_sigkilled_python_worker_task_is_requeued_and_finished_once(
        broker: Broker, tmp_path: Any) -> None:
    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    victim = subprocess.Popen(["/usr/bin/python3", str(script), broker.router],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
    lines: List[str] = []
    threading.Thread(target=lambda: lines.extend(victim.stdout), daemon=True).start()
    rec = Recorder()
    rescuer = PyCollector("rescuer")
    try:
        with rlbus.Coordinator(broker.router, id="kill-coord", callbacks=rec) as c:
            assert c.wait_for("ready", DEADLINE)
            assert wait_until(lambda: "ready\n" in lines, DEADLINE), lines
            assert wait_until(lambda: c.collectors == 1, DEADLINE)
            submit(c, "doomed", "collector", {"data": 4}, max_attempts=3)
            assert wait_until(lambda: "hanging doomed 1\n" in lines, DEADLINE), lines
            assert wait_until(lambda: len(rec.of("data", "doomed")) == 2, DEADLINE)

            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            # the broker notices the silence, ends attempt 1 and queues the task again
            assert wait_until(lambda: rec.of("requeued", "doomed"), DEADLINE), rec.log
            (_, _, attempt, reason, result), = rec.of("requeued", "doomed")
            assert attempt == 1 and reason and result is None
            assert not rec.of("finished")

            with rlbus.Worker(broker.router, role="collector", id="rescuer", run=rescuer.run,
                              close=rescuer.close):
                assert wait_until(lambda: rec.of("finished", "doomed"), DEADLINE), rec.log
                # a later task on the same stream: once it has finished, nothing more of
                # the first one can still be on its way
                submit(c, "after", "collector", {"data": 1})
                assert wait_until(lambda: rec.of("finished", "after"), DEADLINE), rec.log

            assert rec.of("finished", "doomed") == [
                ("finished", "doomed", "collector",
                 {"worker": "rescuer", "task_id": "doomed", "count": 4})]
            assert rescuer.started[0] == ("doomed", 2, {"data": 4})
            metas = [(e[3], e[4]["meta"]) for e in rec.of("data", "doomed")]
            # attempt 1's two DATA arrived before the kill; attempt 2 sent all four again
            assert metas == (
                [(f"doomed#{i}", {"i": i, "worker": "victim"}) for i in range(2)] +
                [(f"doomed#{i}", {"i": i, "worker": "rescuer", "attempt": 2})
                 for i in range(4)])
            assert len(rec.of("requeued")) == 1 and not rec.of("failed")
            assert c.open_tasks == 0
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.wait(10)


# ---- a Python worker frozen mid-task comes back as a ghost ----------------------------------

GHOST = r"""
import sys
import threading

import rlbus

endpoint = sys.argv[1]
go = threading.Event()

def run(task):
    if task.id != "haunted":
        task.emit_data(f"{task.id}#0", "replay", {"i": 0, "worker": "ghost"})
        task.emit_info({"collector_done": True, "worker": "ghost"})
        task.wait_stop(60)
        return
    for i in range(2):
        task.emit_data(f"{task.id}#{i}", "replay", {"i": i, "worker": "ghost"})
    print("hanging", task.id, task.attempt, flush=True)
    go.wait(60)  # frozen (SIGSTOP) and thawed (SIGCONT) in here
    late = [task.emit_data(f"{task.id}#{i}", "replay", {"i": i, "worker": "ghost", "late": True})
            for i in range(2, 4)]
    late.append(task.emit_info({"collector_done": True, "worker": "ghost", "late": True}))
    print("late", task.attempt, *late, flush=True)
    task.wait_stop(2)

def close(task):
    return {"worker": "ghost", "task_id": task.id}

w = rlbus.Worker(endpoint, role="collector", id="ghost", run=run, close=close,
                 heartbeat=0.1)
assert w.wait_for("ready", 20)
print("ready", flush=True)
while sys.stdin.readline():
    go.set()
w.close()
"""


def test_frozen_python_worker_comes_back_as_a_ghost_and_is_fenced(
        broker: Broker, tmp_path: Any) -> None:
    """SIGSTOP a Python worker mid-task: its session expires and the task runs again
    elsewhere. SIGCONT it: what it still sends for its old attempt never reaches the
    coordinator, which sees the task finish exactly once."""
    script = tmp_path / "ghost.py"
    script.write_text(GHOST)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    ghost = subprocess.Popen(["/usr/bin/python3", str(script), broker.router],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
    assert ghost.stdin is not None
    lines: List[str] = []
    threading.Thread(target=lambda: lines.extend(ghost.stdout), daemon=True).start()
    rec = Recorder()
    rescuer = PyCollector("rescuer")
    try:
        with rlbus.Coordinator(broker.router, id="ghost-coord", callbacks=rec) as c:
            assert c.wait_for("ready", DEADLINE)
            assert wait_until(lambda: "ready\n" in lines, DEADLINE), lines
            assert wait_until(lambda: c.collectors == 1, DEADLINE)
            submit(c, "haunted", "collector", {"data": 4}, max_attempts=3)
            assert wait_until(lambda: "hanging haunted 1\n" in lines, DEADLINE), lines
            assert wait_until(lambda: len(rec.of("data", "haunted")) == 2, DEADLINE)

            ghost.send_signal(signal.SIGSTOP)
            assert wait_until(lambda: rec.of("requeued", "haunted"), DEADLINE), rec.log
            with rlbus.Worker(broker.router, role="collector", id="rescuer", run=rescuer.run,
                              close=rescuer.close):
                assert wait_until(lambda: rec.of("finished", "haunted"), DEADLINE), rec.log

            # thawed, the ghost goes on with attempt 1 as if nothing happened
            ghost.send_signal(signal.SIGCONT)
            ghost.stdin.write("go\n")
            ghost.stdin.flush()
            assert wait_until(lambda: any(x.startswith("late ") for x in lines), DEADLINE), lines
            # the rescuer is gone, so the next task goes to the ghost: by the time it has
            # finished, the ghost's late messages (sent before it on the same worker) were
            # dealt with by the broker
            submit(c, "exorcism", "collector", {})
            assert wait_until(lambda: rec.of("finished", "exorcism"), DEADLINE), (rec.log, lines)
            assert rec.of("finished", "exorcism") == [
                ("finished", "exorcism", "collector", {"worker": "ghost", "task_id": "exorcism"})]

            assert rec.of("finished", "haunted") == [
                ("finished", "haunted", "collector",
                 {"worker": "rescuer", "task_id": "haunted", "count": 4})]
            metas = [(e[3], e[4]["meta"]) for e in rec.of("data", "haunted")]
            assert metas == (
                [(f"haunted#{i}", {"i": i, "worker": "ghost"}) for i in range(2)] +
                [(f"haunted#{i}", {"i": i, "worker": "rescuer", "attempt": 2})
                 for i in range(4)])
            assert [e[2]["worker"] for e in rec.of("info", "haunted")] == ["rescuer"]
            (_, _, attempt, _, _), = rec.of("requeued", "haunted")
            assert attempt == 1
            assert not rec.of("failed") and c.open_tasks == 0
    finally:
        if ghost.poll() is None:
            ghost.send_signal(signal.SIGCONT)
            ghost.kill()
        ghost.wait(10)


# ---- failures and their result maps across languages -----------------------------------------

def test_failure_results_cross_languages(broker: Broker, peers: Callable[..., CppPeer]) -> None:
    # a C++ worker fails its attempts: the Python coordinator gets its result map
    cpp = peers(broker.router, "collector", "cpp-fails", "--fail", "cpp says no")
    cpp.wait("ready")
    rec = Recorder()
    with rlbus.Coordinator(broker.router, id="fail-coord", callbacks=rec) as c:
        assert c.wait_for("ready", DEADLINE)
        submit(c, "cpp-doomed", "collector", {"data": 2}, max_attempts=2)
        assert wait_until(lambda: rec.of("failed", "cpp-doomed"), DEADLINE), rec.log
        requeued = rec.of("requeued", "cpp-doomed")
        assert [(e[2], e[4]) for e in requeued] == [(1, {"worker": "cpp-fails", "emitted": 2})]
        assert "cpp says no" in requeued[0][3]
        (_, _, reason, result), = rec.of("failed", "cpp-doomed")
        assert "cpp says no" in reason and result == {"worker": "cpp-fails", "emitted": 2}
        assert not rec.of("finished") and c.open_tasks == 0
    cpp.stop()

    # a Python worker raises TaskFailure: the C++ coordinator gets its result map
    def run(task: Any) -> None:
        raise rlbus.TaskFailure("py says no", {"worker": "py-fails", "share": 0.25, "n": [1]})

    with rlbus.Worker(broker.router, role="collector", id="py-fails", run=run) as w:
        assert w.wait_for("ready", DEADLINE)
        coord = peers(broker.router, "coordinator", "cpp-fail-coord", "--collector-tasks", "1",
                      "--max-attempts", "1", "--task-prefix", "pyf", "--wait-collectors", "1")
        failed = coord.wait("failed", task_id="pyf-c0")[0]
        assert "py says no" in failed["reason"]
        assert failed["result"] == {"worker": "py-fails", "share": 0.25, "n": [1]}
        assert coord.wait("done")[0]["open_tasks"] == 0
        assert not coord.of("finished")


# ---- policies across languages -------------------------------------------------------------

class PolicyCollector:
    """Waits until its task's policy reaches task_info["want"], then emits one DATA (tagged
    with that version by the SDK) and finishes."""

    def __init__(self) -> None:
        self.at_start: Dict[str, Any] = {}
        self.updates: List[tuple] = []
        self.started = threading.Event()

    def run(self, task: Any) -> None:
        self.at_start[task.id] = task.policy()
        self.started.set()
        want = int(task.info["want"])
        deadline = time.monotonic() + DEADLINE
        while (task.policy() is None or task.policy().version < want) and \
                time.monotonic() < deadline and not task.wait_stop(0.005):
            pass
        assert task.emit_data(f"{task.id}#0", "replay", {"policy": task.policy().version})
        assert task.emit_info({"collector_done": True})
        task.wait_stop(DEADLINE)

    def on_policy(self, task: Any, policy: Any) -> None:
        self.updates.append((task.id, policy))


def test_policies_cross_languages(broker: Broker, peers: Callable[..., CppPeer]) -> None:
    rec = Recorder()
    with rlbus.Coordinator(broker.router, id="pol-coord", callbacks=rec) as c:
        assert c.wait_for("ready", DEADLINE)

        # a Python learner publishes, a C++ collector's task starts with the latest version
        def learn(task: Any) -> None:
            for step in range(2):
                assert task.get_data("replay", 1, step, timeout=DEADLINE) is not None
                assert task.publish_policy("pol-py", step + 1, params=b"py-v%d" % (step + 1))
                assert task.emit_learn_info("replay", {"learner_done": step == 1})
            task.wait_stop(DEADLINE)

        with rlbus.Worker(broker.router, role="learner", id="py-pub", run=learn) as w:
            assert w.wait_for("ready", DEADLINE)
            submit(c, "py-learns", "learner", {})
            assert wait_until(lambda: rec.of("finished", "py-learns"), DEADLINE), rec.log
        cpp_col = peers(broker.router, "collector", "cpp-pol", "--data", "1")
        cpp_col.wait("ready")
        submit(c, "cpp-collects", "collector", {"data": 1}, policy_id="pol-py")
        assert wait_until(lambda: rec.of("finished", "cpp-collects"), DEADLINE), rec.log
        start = cpp_col.wait("task_start", task_id="cpp-collects")[0]
        assert start["policy"] == {"id": "pol-py", "version": 2, "params_hex": b"py-v2".hex()}
        (_, _, _, _, data), = rec.of("data", "cpp-collects")
        assert data["policy_version"] == 2
        cpp_col.stop()
        assert wait_until(lambda: c.collectors == 0 and c.learners == 0, DEADLINE)

        # a C++ learner publishes, a Python collector's task starts with the latest version
        # and, while it runs, gets each newer one (POLICY_UPDATE)
        cpp_lrn = peers(broker.router, "learner", "cpp-pub", "--publish-policy", "pol-cpp")
        cpp_lrn.wait("ready")
        submit(c, "cpp-learns-1", "learner", {"steps": 3})
        assert wait_until(lambda: rec.of("finished", "cpp-learns-1"), DEADLINE), rec.log
        pc = PolicyCollector()
        with rlbus.Worker(broker.router, role="collector", id="py-pol", run=pc.run,
                          on_policy=pc.on_policy) as w:
            assert w.wait_for("ready", DEADLINE)
            submit(c, "py-collects-1", "collector", {"want": 3}, policy_id="pol-cpp")
            assert wait_until(lambda: rec.of("finished", "py-collects-1"), DEADLINE), rec.log
            assert pc.at_start["py-collects-1"] == rlbus.Policy("pol-cpp", 3, None, b"params-v3")

            pc.started.clear()
            submit(c, "py-collects-2", "collector", {"want": 6}, policy_id="pol-cpp")
            assert pc.started.wait(DEADLINE)
            submit(c, "cpp-learns-2", "learner", {"steps": 3})
            assert wait_until(lambda: rec.of("finished", "py-collects-2"), DEADLINE), rec.log
        assert pc.at_start["py-collects-2"] == rlbus.Policy("pol-cpp", 3, None, b"params-v3")
        # on_policy runs on a thread of its own: wait for the last call
        assert wait_until(lambda: any(t == "py-collects-2" and p.version == 6
                                      for t, p in list(pc.updates)), DEADLINE), pc.updates
        updates = [p for t, p in pc.updates if t == "py-collects-2"]
        assert [p.version for p in updates] == [4, 5, 6]
        assert updates[-1] == rlbus.Policy("pol-cpp", 6, None, b"params-v6")
        assert [e[4]["policy_version"] for e in rec.of("data", "py-collects-1")] == [3]
        assert [e[4]["policy_version"] for e in rec.of("data", "py-collects-2")] == [6]
        assert [e["version"] for e in cpp_lrn.of("published")] == [1, 2, 3, 4, 5, 6]
        assert not rec.of("failed") and not rec.of("requeued")


# ---- a coordinator that falls behind holds its collectors back --------------------------------

def test_slow_python_coordinator_holds_back_cpp_collector(
        broker_factory: Callable[..., Broker], peers: Callable[..., CppPeer]) -> None:
    broker = broker_factory("--stream-window", "16")
    col = peers(broker.router, "collector", "cpp-fast")
    col.wait("ready")
    gate = threading.Event()
    rec = Recorder()

    def first_data_waits(task_id: str, buffer_id: str, data_id: str, data: Any) -> None:
        gate.wait(DEADLINE)
        rec.deal_with_collector_send_data(task_id, buffer_id, data_id, data)

    cbs = {"deal_with_collector_send_data": first_data_waits,
           "deal_with_collector_finish_task": rec.deal_with_collector_finish_task}
    with rlbus.Coordinator(broker.router, id="slow-coord", callbacks=cbs) as c:
        assert c.wait_for("ready", DEADLINE)
        submit(c, "flood", "collector", {"data": 200})
        # the coordinator's callback is stuck, so its stream is not acknowledged: the
        # collector runs out of credit and waits instead of flooding the broker
        col.wait("credit_waits")
        assert len(col.of("emitted", task_id="flood")) < 200
        gate.set()
        assert wait_until(lambda: rec.of("finished", "flood"), DEADLINE), col.raw[-5:]
        assert data_ids(rec, "flood") == [f"flood#{i}" for i in range(200)]
        assert c.stream_gaps == 0 and c.data_lost == 0


def test_slow_cpp_coordinator_holds_back_python_collector(
        broker_factory: Callable[..., Broker], peers: Callable[..., CppPeer]) -> None:
    broker = broker_factory("--stream-window", "16")
    pc = PyCollector("py-fast")
    with rlbus.Worker(broker.router, role="collector", id="py-fast", run=pc.run,
                      close=pc.close) as w:
        assert w.wait_for("ready", DEADLINE)
        coord = peers(broker.router, "coordinator", "cpp-slow", "--hold-data",
                      "--collector-tasks", "1", "--data", "200", "--wait-collectors", "1",
                      "--task-prefix", "flood")
        coord.wait("holding")
        assert wait_until(lambda: w.credit_waits > 0, DEADLINE)
        assert coord.proc.stdin is not None
        coord.proc.stdin.write("release\n")
        coord.proc.stdin.flush()
        done = coord.wait("done")[0]
        assert done["stream_gaps"] == 0 and done["data_lost"] == 0
        assert [d["data_id"] for d in coord.of("data", task_id="flood-c0")] == \
            [f"flood-c0#{i}" for i in range(200)]
        assert [e["result"] for e in coord.of("finished", task_id="flood-c0")] == [
            {"worker": "py-fast", "task_id": "flood-c0", "count": 200}]


def test_sigkilled_cpp_worker_task_goes_to_a_python_worker(
        broker: Broker, peers: Callable[..., CppPeer]) -> None:
    victim = peers(broker.router, "collector", "cpp-victim", "--hang-after", "2",
                   "--heartbeat-ms", "100")
    victim.wait("ready")
    rec = Recorder()
    rescuer = PyCollector("py-rescuer")
    with rlbus.Coordinator(broker.router, id="kill-coord-2", callbacks=rec) as c:
        assert c.wait_for("ready", DEADLINE)
        submit(c, "cpp-doomed", "collector", {"data": 3}, max_attempts=2)
        victim.wait("hanging", task_id="cpp-doomed")
        assert wait_until(lambda: len(rec.of("data", "cpp-doomed")) == 2, DEADLINE)
        victim.proc.kill()
        victim.proc.wait(10)
        assert wait_until(lambda: rec.of("requeued", "cpp-doomed"), DEADLINE), rec.log
        (_, _, attempt, reason, result), = rec.of("requeued", "cpp-doomed")
        assert attempt == 1 and reason and result is None
        with rlbus.Worker(broker.router, role="collector", id="py-rescuer", run=rescuer.run,
                          close=rescuer.close):
            assert wait_until(lambda: rec.of("finished", "cpp-doomed"), DEADLINE), rec.log
        assert rec.of("finished", "cpp-doomed") == [
            ("finished", "cpp-doomed", "collector",
             {"worker": "py-rescuer", "task_id": "cpp-doomed", "count": 3})]
        assert [(e[3], e[4]["meta"]["worker"], e[4]["meta"]["attempt"])
                for e in rec.of("data", "cpp-doomed")] == (
            [(f"cpp-doomed#{i}", "cpp-victim", 1) for i in range(2)] +
            [(f"cpp-doomed#{i}", "py-rescuer", 2) for i in range(3)])
        assert not rec.of("failed") and c.open_tasks == 0
