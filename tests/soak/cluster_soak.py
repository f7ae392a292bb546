#!/usr/bin/python3
"""A group of three brokers under a steady task load and N faults at random.

Three brokers, each with a journal, beside an etcd; three collector processes of the Python
SDK; a Python coordinator (this process) that keeps tasks open. Faults, one at a time, each
followed by a wait until the group is whole again (a leader serving, every broker in sync,
tasks finishing):

- leader-kill: SIGKILL the leader; it comes back a second later (and stands by, or leads
  again: both are allowed);
- leader-freeze: SIGSTOP the leader past its lease, then SIGCONT: it must step down;
- standby-kill: SIGKILL a standby, back half a second later;
- etcd-restart: SIGKILL etcd, back a second later on the same data;
- worker-kill: SIGKILL a collector; a new one takes its place.

At the end the coordinator stops submitting and waits for every task. The run fails when a
task the broker accepted never finished, or finished twice. The counts are printed.

    /usr/bin/python3 tests/soak/cluster_soak.py --faults 100      (about 10 minutes)

or `meson test -C build --suite soak`. Needs etcd-server and a build (RLBUS_BUILD_DIR, by
default ./build).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RLBUS_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "python"))

import rlbus  # noqa: E402
from rlbus import free_port  # noqa: E402

BROKER = BUILD / "src" / "rlbus-broker"
CTL = BUILD / "src" / "rlbus-ctl"
GROUP = "soak"


def wait_until(what: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if what():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


class Child:
    """A process of the soak, its output in a log file of the run's folder."""

    def __init__(self, name: str, args: List[str], folder: Path) -> None:
        self.name, self.args, self.folder = name, args, folder
        self.generation = 0
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        self.generation += 1
        log = open(self.folder / f"{self.name}.{self.generation}.log", "w")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


WORKER = """
import sys, time, random
sys.path.insert(0, {python!r})
import rlbus
def run(task):
    time.sleep(random.uniform(0.02, 0.2))
    task.emit_info({{"collector_done": True}})
    task.wait_stop(600)
w = rlbus.Worker({endpoint!r}, role="collector", id={id!r}, run=run,
                 close=lambda task: {{"collector_done": True}}, heartbeat=0.2)
while True:
    time.sleep(3600)
"""


class Soak:
    def __init__(self, folder: Path, seed: int) -> None:
        self.folder = folder
        self.rng = random.Random(seed)
        self.etcd_url = f"http://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        self.etcd = Child("etcd", [
            shutil.which("etcd") or "/usr/bin/etcd", "--name", "soak",
            "--data-dir", str(folder / "etcd"), "--listen-client-urls", self.etcd_url,
            "--advertise-client-urls", self.etcd_url, "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer, "--initial-cluster", f"soak={peer}"], folder)
        assert wait_until(self.etcd_answers, 60), "etcd did not start"
        self.brokers: Dict[str, Child] = {}
        self.routers: Dict[str, str] = {}
        for name in ("a", "b", "c"):
            router = f"tcp://127.0.0.1:{free_port()}"
            self.routers[name] = router
            self.brokers[name] = Child(f"broker-{name}", [
                str(BROKER), "--router", router, "--events", "tcp://127.0.0.1:0",
                "--advertise", router, "--cluster-etcd", self.etcd_url,
                "--cluster-name", GROUP, "--cluster-member", name,
                "--journal", str(folder / f"{name}.journal"), "--log-level", "info"], folder)
        self.endpoint = ",".join(self.routers.values())
        self.workers: List[Child] = []
        self.worker_ids = 0
        for _ in range(3):
            self.add_worker()
        # What the coordinator heard, by task id.
        self.lock = threading.Lock()
        self.finished: Counter = Counter()
        self.failed: Dict[str, str] = {}
        self.cancelled: Dict[str, str] = {}
        self.accepted: Set[str] = set()
        self.unanswered: Set[str] = set()  # SUBMIT with no answer: accepted or not
        self.submitted = 0
        self.coord = rlbus.Coordinator(self.endpoint, id="soak-coordinator", heartbeat=0.2,
                                       callbacks={
                                           "deal_with_collector_finish_task": self.on_finish,
                                           "on_task_failed": self.on_failed,
                                           "on_task_cancelled": self.on_cancelled})
        self.submitting = True
        self.submitter = threading.Thread(target=self.submit_loop, daemon=True)
        self.submitter.start()

    # ---- the coordinator's side ----
    def on_finish(self, task_id: str, result: object) -> None:
        with self.lock:
            self.finished[task_id] += 1

    def on_failed(self, task_id: str, reason: str, result: object) -> None:
        with self.lock:
            self.failed[task_id] = reason

    def on_cancelled(self, task_id: str, reason: str) -> None:
        with self.lock:
            self.cancelled[task_id] = reason

    def open_tasks(self) -> int:
        with self.lock:
            done = set(self.finished) | set(self.failed) | set(self.cancelled)
            return len(self.accepted - done)

    def submit_loop(self) -> None:
        while self.submitting:
            if self.coord.state != "ready" or self.open_tasks() >= 8:
                time.sleep(0.02)
                continue
            self.submitted += 1
            task_id = f"t{self.submitted}"
            r = self.coord.submit(task_id, "collector", max_attempts=1000, timeout=5.0)
            with self.lock:
                if r is None:
                    self.unanswered.add(task_id)
                elif r.accepted:
                    self.accepted.add(task_id)

    # ---- the group ----
    def etcd_answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def cluster(self) -> Optional[dict]:
        run = subprocess.run([str(CTL), "--json", "cluster", "--etcd", self.etcd_url,
                              "--name", GROUP], capture_output=True, text=True, timeout=30)
        if run.returncode != 0:
            return None
        try:
            return json.loads(run.stdout)
        except ValueError:
            return None

    def leader(self) -> Optional[str]:
        view = self.cluster()
        if not view:
            return None
        for m in view.get("members", []):
            if m.get("role") == "leader":
                return str(m.get("member"))
        return None

    def whole(self) -> bool:
        """A leader serves, every broker runs and is in sync."""
        if any(b.proc is None or b.proc.poll() is not None for b in self.brokers.values()):
            return False
        view = self.cluster()
        if not view:
            return False
        members = view.get("members", [])
        return (len(members) == 3 and any(m.get("role") == "leader" for m in members)
                and all(m.get("in_sync") for m in members))

    def add_worker(self) -> None:
        self.worker_ids += 1
        code = WORKER.format(python=str(ROOT / "python"), endpoint=self.endpoint,
                             id=f"collector-{self.worker_ids}")
        self.workers.append(Child(f"worker-{self.worker_ids}", [sys.executable, "-c", code],
                                  self.folder))

    # ---- faults ----
    def fault(self, kind: str) -> str:
        leader = self.leader()
        if kind in ("leader-kill", "leader-freeze") and leader is None:
            kind = "standby-kill"
        if kind == "leader-kill":
            assert leader is not None
            self.brokers[leader].kill()
            time.sleep(1.0)
            self.brokers[leader].start()
            return f"leader-kill {leader}"
        if kind == "leader-freeze":
            assert leader is not None
            self.brokers[leader].signal(signal.SIGSTOP)
            time.sleep(3.0)  # past the 2 s lease
            self.brokers[leader].signal(signal.SIGCONT)
            return f"leader-freeze {leader}"
        if kind == "standby-kill":
            standby = self.rng.choice(sorted(n for n in self.brokers if n != leader))
            self.brokers[standby].kill()
            time.sleep(0.5)
            self.brokers[standby].start()
            return f"standby-kill {standby}"
        if kind == "etcd-restart":
            self.etcd.kill()
            time.sleep(1.0)
            self.etcd.start()
            return "etcd-restart"
        victim = self.workers.pop(self.rng.randrange(len(self.workers)))
        victim.kill()
        self.add_worker()
        return f"worker-kill {victim.name}"

    def dump_stacks(self) -> None:
        """Every broker's threads, into the logs' folder, when gdb is there: what a broker
        that does not heal is doing."""
        gdb = shutil.which("gdb")
        for name, b in self.brokers.items():
            if gdb is None or b.proc is None or b.proc.poll() is not None:
                continue
            out = subprocess.run([gdb, "-p", str(b.proc.pid), "-batch", "-ex",
                                  "thread apply all bt 30"], capture_output=True, text=True,
                                 timeout=120)
            (self.folder / f"stacks-{name}.txt").write_text(out.stdout + out.stderr)

    def progress(self) -> int:
        with self.lock:
            return sum(self.finished.values())

    def stop(self) -> None:
        self.submitting = False
        self.submitter.join(30)
        self.coord.close()
        for w in self.workers:
            w.kill()
        for b in self.brokers.values():
            b.stop()
        self.etcd.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=100, help="faults to inject (default 100)")
    ap.add_argument("--seed", type=int, default=1, help="which faults, in which order")
    ap.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = ap.parse_args()
    if shutil.which("etcd") is None and not os.path.exists("/usr/bin/etcd"):
        print("cluster_soak: etcd is not installed (apt-get install etcd-server)")
        return 77  # skipped
    for binary in (BROKER, CTL):
        if not binary.exists():
            print(f"cluster_soak: no {binary} (build first, or set RLBUS_BUILD_DIR)")
            return 2
    folder = Path(tempfile.mkdtemp(prefix="rlbus-soak-"))
    soak = Soak(folder, args.seed)
    kinds = ["leader-kill", "leader-freeze", "standby-kill", "etcd-restart", "worker-kill"]
    done: Counter = Counter()
    ok = True
    started = time.monotonic()
    try:
        if not wait_until(soak.whole, 60, 0.2):
            print(f"cluster_soak: the group did not form within 60 s (logs in {folder})")
            return 1
        for n in range(1, args.faults + 1):
            before = soak.progress()
            what = soak.fault(soak.rng.choice(kinds))
            done[what.split()[0]] += 1
            healed = wait_until(lambda: soak.whole() and soak.progress() > before, 120, 0.2)
            print(f"[{time.monotonic() - started:7.1f}s] fault {n}/{args.faults}: {what}: "
                  f"{'healed' if healed else 'NOT HEALED within 120 s'}; "
                  f"{soak.progress()} tasks finished", flush=True)
            if not healed:
                soak.dump_stacks()
                ok = False
                break
        soak.submitting = False
        soak.submitter.join(30)

        def settled() -> bool:
            with soak.lock:
                done_ids = set(soak.finished) | set(soak.failed) | set(soak.cancelled)
                return soak.accepted <= done_ids
        all_done = wait_until(settled, 180, 0.2)
        with soak.lock:
            twice = sorted(t for t, k in soak.finished.items() if k > 1)
            lost = sorted(soak.accepted - set(soak.finished) - set(soak.failed)
                          - set(soak.cancelled))
            print(f"faults: {sum(done.values())} ({', '.join(f'{k} {v}' for k, v in sorted(done.items()))})")
            print(f"tasks: {soak.submitted} submitted, {len(soak.accepted)} accepted, "
                  f"{len(soak.unanswered)} unanswered (of which {len(soak.unanswered & set(soak.finished))} "
                  f"finished), {len(soak.finished)} finished, {len(twice)} finished twice, "
                  f"{len(soak.failed)} failed, {len(soak.cancelled)} cancelled, {len(lost)} lost")
            if twice:
                print(f"finished twice: {twice[:20]}")
            if lost:
                print(f"lost: {lost[:20]}")
            if soak.failed:
                print(f"failed: {dict(list(soak.failed.items())[:5])}")
            if soak.cancelled:
                print(f"cancelled: {dict(list(soak.cancelled.items())[:5])}")
            ok = ok and all_done and not twice and not lost and not soak.cancelled
    finally:
        soak.stop()
        print(f"logs: {folder}" if (args.keep or not ok) else "", end="\n" if (args.keep or not ok) else "")
        if ok and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print("soak: passed" if ok else "soak: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
