"""Soak: worker processes SIGKILLed at random under a steady flow of tasks from a Python
coordinator. Every submitted task must end exactly once, finished or failed after its
attempts, and the broker's memory must come back to where it was.

The default run is bounded (30 kills in two rounds, well under a minute). A long one:

    RLBUS_SOAK_KILLS=300 /usr/bin/python3 -m pytest -q -s python/tests/test_soak.py

(from the repository root, after the build; tasks keep coming until the last kill, then the
run waits for every one of them to end).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List

from conftest import PYTHON_DIR, wait_until
from rlbus import Coordinator

KILLS = int(os.environ.get("RLBUS_SOAK_KILLS", "30"))
WORKERS = 4
IN_FLIGHT = 6
ATTEMPTS = 8

WORKER_SCRIPT = """
import sys, time, rlbus
def run(task):
    for i in range(10):
        if not task.emit_data("%s-%d" % (task.id, i), "buf", {"i": i}):
            return
        time.sleep(0.03)
    task.emit_info({"collector_done": True})
    task.wait_stop(30)
def close(task):
    return {"worker": sys.argv[2]}
w = rlbus.Worker(sys.argv[1], role="collector", id=sys.argv[2], run=run, close=close,
                 heartbeat_ms=100, reconnect_min=0.05, reconnect_max=0.2)
w.run_forever()
"""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Fleet:
    """Worker processes under fresh ids; kill() SIGKILLs one at random and starts another."""

    def __init__(self, endpoint: str, script: str) -> None:
        self.endpoint, self.script = endpoint, script
        self.procs: List[subprocess.Popen] = []
        self.serial = 0
        self.kills = 0
        self.rng = random.Random(7)
        for _ in range(WORKERS):
            self.spawn()

    def spawn(self) -> None:
        self.serial += 1
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        self.procs.append(subprocess.Popen(
            [sys.executable, self.script, self.endpoint, f"soak-w{self.serial}"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def kill(self) -> None:
        p = self.procs.pop(self.rng.randrange(len(self.procs)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.kills += 1
        self.spawn()

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def soak_round(endpoint: str, fleet: Fleet, kills: int, tag: str) -> None:
    """One round: a coordinator keeps IN_FLIGHT tasks going while `kills` workers are
    SIGKILLed at random, then waits for every task; checks each ended exactly once."""
    lock = threading.Lock()
    ended: Dict[str, List[str]] = {}
    requeued: List[str] = []

    def record(task_id: str, how: str) -> None:
        with lock:
            ended.setdefault(task_id, []).append(how)

    callbacks = {
        "deal_with_collector_finish_task": lambda t, r: record(t, "finished"),
        "on_task_failed": lambda t, reason, result=None: record(t, "failed: " + reason),
        "on_task_cancelled": lambda t, reason: record(t, "cancelled: " + reason),
        "on_task_requeued": lambda t, attempt, reason, result=None: requeued.append(t),
    }
    coord = Coordinator(endpoint, id="soak-coord", callbacks=callbacks)
    try:
        assert coord.wait_for("ready", 10)
        assert wait_until(lambda: coord.collectors >= WORKERS, 30)
        submitted = 0
        goal = fleet.kills + kills
        next_kill = time.monotonic() + 0.5
        deadline = time.monotonic() + 240 + kills
        while True:
            with lock:
                done = len(ended)
            killing = fleet.kills < goal
            if not killing and done >= submitted:
                break
            assert time.monotonic() < deadline, f"only {done} of {submitted} tasks ended"
            if killing and submitted - done < IN_FLIGHT:
                r = coord.submit(f"{tag}-{submitted}", "collector", {}, max_attempts=ATTEMPTS,
                                 step_timeout_ms=5000, start_timeout_ms=5000)
                assert r is not None and r.accepted, r
                submitted += 1
                continue
            if killing and time.monotonic() >= next_kill:
                fleet.kill()
                next_kill = time.monotonic() + 0.3 + fleet.rng.random() * 0.4
            time.sleep(0.01)
        with lock:
            outcomes = {t: list(v) for t, v in ended.items()}
        finished = sum(1 for v in outcomes.values() if v == ["finished"])
        failed = sum(1 for v in outcomes.values() if len(v) == 1 and v[0].startswith("failed"))
        print(f"soak {tag}: {submitted} tasks, {finished} finished, {failed} failed after "
              f"{ATTEMPTS} attempts, {kills} workers SIGKILLed, {len(requeued)} attempts "
              f"re-queued")
        assert sorted(outcomes) == sorted(f"{tag}-{i}" for i in range(submitted))
        twice = {t: v for t, v in outcomes.items() if len(v) != 1}
        assert not twice, f"tasks that ended more than once: {twice}"
        assert finished + failed == submitted, outcomes  # none cancelled, none lost
        assert submitted > kills
        assert requeued  # the kills did land on running tasks
    finally:
        coord.close()


def coordinator_gone(endpoint: str) -> None:
    """Returns once the broker has let the last soak coordinator go: a new one under its
    id is welcomed as a new session (its tasks and stream are dropped by then)."""
    probe = Coordinator(endpoint, id="soak-coord", callbacks={})
    try:
        assert probe.wait_for("ready", 20)
    finally:
        probe.close()


def test_random_sigkills_of_workers_lose_no_task_and_finish_none_twice(broker_factory,
                                                                       tmp_path) -> None:
    # quarantine off: this soak is about loss, and its kills land on fresh ids anyway
    b = broker_factory("--heartbeat-min", "50", "--quarantine-after", "0")
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    fleet = Fleet(b.router, str(script))
    try:
        # two rounds of half the kills: memory after the second is what the first left
        rss = [rss_kib(b.proc.pid)]
        for n, tag in ((KILLS // 2, "soak1"), (KILLS - KILLS // 2, "soak2")):
            soak_round(b.router, fleet, n, tag)
            coordinator_gone(b.router)
            rss.append(rss_kib(b.proc.pid))
    finally:
        fleet.stop()
    print(f"soak: broker RSS {rss[0]} KiB at the start, {rss[1]} after round 1, {rss[2]} "
          f"after round 2")
    # what stays is the allocator's and the broker's bounded tables, not what the load left
    assert rss[2] <= rss[1] + 1024, f"the broker grew by {rss[2] - rss[1]} KiB in round 2"
    assert rss[2] <= rss[0] + 16 * 1024, f"broker RSS {rss[0]} -> {rss[2]} KiB"
