"""Soak: faults at random under a steady flow of tasks from a Python coordinator. First
worker processes SIGKILLed; then, with the broker on a journal, workers SIGKILLed, their
links cut and the broker itself SIGKILLed and started again. Every submitted task must end
exactly once, finished or failed after its attempts, and the broker's memory must come back
to where it was.

The default run is bounded (30 worker kills in two rounds, then 30 mixed faults; about a
minute in all). A long one:

    RLBUS_SOAK_KILLS=300 RLBUS_SOAK_FAULTS=300 /usr/bin/python3 -m pytest -q -s \
        python/tests/test_soak.py

(from the repository root, after the build; tasks keep coming until the last fault, then
the run waits for every one of them to end).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from typing import Callable, List

from conftest import Endings, collector_process, wait_until
from relay import Relay
from rlbus import Coordinator

KILLS = int(os.environ.get("RLBUS_SOAK_KILLS", "30"))
FAULTS = int(os.environ.get("RLBUS_SOAK_FAULTS", "30"))
WORKERS = 4
IN_FLIGHT = 6
ATTEMPTS = 8



def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Fleet:
    """Worker processes under fresh ids; kill() SIGKILLs one at random and starts another."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.procs: List[subprocess.Popen] = []
        self.serial = 0
        self.kills = 0
        self.rng = random.Random(7)
        for _ in range(WORKERS):
            self.spawn()

    def spawn(self) -> None:
        self.serial += 1
        # ten items 30 ms apart: a task lasts long enough for a kill to land in it
        self.procs.append(collector_process(self.endpoint, f"soak-w{self.serial}", 0.1, 10,
                                            0.03))

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


def soak_round(endpoint: str, faults: int, fault: Callable[[], None], rng: random.Random,
               tag: str) -> None:
    """One round: a coordinator keeps IN_FLIGHT tasks going while `faults` faults are made
    at random moments (`fault()` makes one), then waits for every task; checks each ended
    exactly once."""
    ends = Endings()
    coord = Coordinator(endpoint, id="soak-coord", callbacks=ends.callbacks, heartbeat=0.2,
                        reconnect_min=0.05, reconnect_max=0.3)
    try:
        assert coord.wait_for("ready", 10)
        assert wait_until(lambda: coord.collectors >= WORKERS, 30)
        submitted = 0
        made = 0
        next_fault = time.monotonic() + 0.5
        deadline = time.monotonic() + 240 + 2 * faults
        while True:
            done = ends.count()
            faulting = made < faults
            if not faulting and done >= submitted:
                break
            assert time.monotonic() < deadline, f"only {done} of {submitted} tasks ended"
            if faulting and submitted - done < IN_FLIGHT:
                task_id = f"{tag}-{submitted}"
                r = None
                while r is None:  # no answer: the broker went away; ask again
                    r = coord.submit(task_id, "collector", {}, max_attempts=ATTEMPTS,
                                     step_timeout_ms=5000, start_timeout_ms=5000)
                # 411: the first SUBMIT was accepted (and journaled) before the answer was lost
                assert r.accepted or r.code == 411, r
                submitted += 1
                continue
            if faulting and time.monotonic() >= next_fault:
                fault()
                made += 1
                next_fault = time.monotonic() + 0.3 + rng.random() * 0.4
            time.sleep(0.01)
        outcomes = ends.outcomes()
        finished = sum(1 for v in outcomes.values() if v == ["finished"])
        failed = sum(1 for v in outcomes.values() if len(v) == 1 and v[0].startswith("failed"))
        print(f"soak {tag}: {submitted} tasks, {finished} finished, {failed} failed after "
              f"{ATTEMPTS} attempts, {faults} faults, {len(ends.requeued)} attempts re-queued")
        assert sorted(outcomes) == sorted(f"{tag}-{i}" for i in range(submitted))
        twice = {t: v for t, v in outcomes.items() if len(v) != 1}
        assert not twice, f"tasks that ended more than once: {twice}"
        assert finished + failed == submitted, outcomes  # none cancelled, none lost
        assert submitted > faults
        assert ends.requeued  # the faults did land on running tasks
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


def test_random_sigkills_of_workers_lose_no_task_and_finish_none_twice(broker_factory) -> None:
    # quarantine off: this soak is about loss, and its kills land on fresh ids anyway
    b = broker_factory("--heartbeat-min", "50", "--quarantine-after", "0")
    fleet = Fleet(b.router)
    try:
        # two rounds of half the kills: memory after the second is what the first left
        rss = [rss_kib(b.proc.pid)]
        for n, tag in ((KILLS // 2, "soak1"), (KILLS - KILLS // 2, "soak2")):
            soak_round(b.router, n, fleet.kill, fleet.rng, tag)
            coordinator_gone(b.router)
            rss.append(rss_kib(b.proc.pid))
    finally:
        fleet.stop()
    print(f"soak: broker RSS {rss[0]} KiB at the start, {rss[1]} after round 1, {rss[2]} "
          f"after round 2")
    # what stays is the allocator's and the broker's bounded tables, not what the load left
    assert rss[2] <= rss[1] + 1024, f"the broker grew by {rss[2] - rss[1]} KiB in round 2"
    assert rss[2] <= rss[0] + 16 * 1024, f"broker RSS {rss[0]} -> {rss[2]} KiB"


def test_worker_kills_link_cuts_and_broker_restarts_lose_no_task(broker_factory,
                                                                 tmp_path) -> None:
    journal = str(tmp_path / "broker.journal")
    b = broker_factory("--heartbeat-min", "50", "--quarantine-after", "0", "--journal", journal)
    rng = random.Random(11)
    links = Relay(b.router_port, rng)
    fleet = Fleet(links.endpoint)  # the workers' links go through the cutter
    made = {"worker killed": 0, "link cut": 0, "broker restarted": 0}

    def fault() -> None:
        kind = rng.choices(list(made), weights=(4, 4, 2))[0]
        if kind == "worker killed":
            fleet.kill()
        elif kind == "link cut":
            links.break_one()
        else:
            b.kill()
            b.start()  # the same ports and journal
        made[kind] += 1

    try:
        soak_round(b.router, FAULTS, fault, rng, "faults")
    finally:
        fleet.stop()
        links.close()
    print("soak faults: " + ", ".join(f"{n} {kind}" for kind, n in made.items()))
