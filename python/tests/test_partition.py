"""A real partition between hosts: the workers run in a network namespace of their own, joined
to the broker's by a veth pair, with netem delay and loss on the link where the kernel has
it. The link is cut twice under a steady flow of tasks: shorter than the liveness window
(the workers resume their sessions and nothing is re-run) and longer (the broker expires
them, re-queues their attempts, and they come back under new sessions; a RESULT of an attempt
that ended so is refused). Every task must end exactly once, finished. Skipped where network
namespaces cannot be made (not root, no ip)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Iterator, List

import pytest

from conftest import BROKER, PYTHON_DIR, Endings, collector_process, wait_until
from rlbus import Coordinator

HEARTBEAT_S = 0.3  # the workers': with liveness 3 the broker expires them after 0.9 s



# A worker made of one DEALER that takes a task and holds it, heartbeating, into the long cut;
# once the link is back it introduces itself again and sends the RESULT of the attempt it
# held: the broker, which ended that attempt when it expired the worker and gave the task to
# another, must refuse it (406 once the task finished elsewhere, 407 while it still runs).
STALE_SCRIPT = """
import sys, threading, time, zmq
from rlbus import protocol as P
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.linger = 0
s.connect(sys.argv[1])
def send(name, **f):
    s.send_multipart(list(P.encode(name, f)))
def expect(name, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.poll(100):
            m = P.decode(s.recv_multipart())
            if m.name == name:
                return m
    raise SystemExit("no " + name)
send("HELLO", role="collector", id="far-stale", heartbeat_ms=300, resources={})
expect("WELCOME", 10)
start = expect("TASK_START", 20)
lock = threading.Lock()
send("STARTED", task_id=start["task_id"], attempt=start["attempt"])
stop = threading.Event()
def beat():
    while not stop.wait(0.1):
        with lock:
            send("HEARTBEAT")
t = threading.Thread(target=beat)
t.start()
print("holding", start["task_id"], start["attempt"], flush=True)
sys.stdin.readline()  # the test says when the long cut has healed
stop.set()
t.join()
s.close()
s = ctx.socket(zmq.DEALER)
s.linger = 0
s.connect(sys.argv[1])
send("HELLO", role="collector", id="far-stale", heartbeat_ms=60000)
expect("WELCOME", 10)
send("RESULT", task_id=start["task_id"], attempt=start["attempt"], result={})
err = expect("ERROR", 10)
print("refused", err["code"], flush=True)
send("DISCONNECT", code=200, reason="done")
time.sleep(0.2)
"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


class Namespace:
    """A network namespace with one veth link to this one: HOST here, PEER in there."""

    def __init__(self) -> None:
        n = os.getpid() % 200 + 20
        self.name = f"rlbus-t{os.getpid()}"
        self.host_if, self.peer_if = f"rlh{os.getpid() % 100000}", f"rlp{os.getpid() % 100000}"
        self.host, self.peer = f"10.213.{n}.1", f"10.213.{n}.2"
        sh("ip", "netns", "add", self.name)
        try:
            sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
            sh("ip", "link", "set", self.peer_if, "netns", self.name)
            sh("ip", "addr", "add", f"{self.host}/30", "dev", self.host_if)
            sh("ip", "link", "set", self.host_if, "up")
            self.run("ip", "addr", "add", f"{self.peer}/30", "dev", self.peer_if)
            self.run("ip", "link", "set", self.peer_if, "up")
            self.run("ip", "link", "set", "lo", "up")
        except Exception:
            self.close()
            raise
        # delay and a little loss both ways, where the kernel has netem
        here = sh("tc", "qdisc", "add", "dev", self.host_if, "root", "netem", "delay", "5ms",
                  "loss", "1%", check=False)
        there = self.run("tc", "qdisc", "add", "dev", self.peer_if, "root", "netem", "delay",
                         "5ms", "loss", "1%", check=False)
        self.netem = here.returncode == 0 and there.returncode == 0

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.name, *args, check=check)

    # From the far side: the broker's own address stays up (the coordinator on this host
    # keeps its connection), the workers' link has no carrier
    def cut(self) -> None:
        self.run("ip", "link", "set", self.peer_if, "down")

    def heal(self) -> None:
        self.run("ip", "link", "set", self.peer_if, "up")

    def close(self) -> None:
        sh("ip", "link", "del", self.host_if, check=False)
        sh("ip", "netns", "del", self.name, check=False)


@pytest.fixture
def netns() -> Iterator[Namespace]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    try:
        ns = Namespace()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make a network namespace here: {e.stderr.strip()}")
    try:
        yield ns
    finally:
        ns.close()


def test_a_cut_and_healed_link_between_hosts_loses_no_task(netns: Namespace) -> None:
    broker = subprocess.Popen([BROKER, "--router", f"tcp://{netns.host}:0", "--events",
                               "tcp://127.0.0.1:0", "--heartbeat-min", "50",
                               "--quarantine-after", "0", "--log-level", "warn",
                               "--insecure"],  # plain, on an address other hosts reach
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers: List[subprocess.Popen] = []
    coord = None
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()
        m = re.search(r"router=(\S+)", line)
        assert m, line
        endpoint = m.group(1)
        blog: List[str] = []
        threading.Thread(target=lambda: [blog.append(x) for x in broker.stdout], daemon=True).start()
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        for k in range(2):
            workers.append(collector_process(endpoint, f"far-w{k}", HEARTBEAT_S, 5, 0.05,
                                             prefix=["ip", "netns", "exec", netns.name]))
        ends = Endings()
        coord = Coordinator(endpoint, id="far-coord", callbacks=ends.callbacks)
        assert coord.wait_for("ready", 10)
        assert wait_until(lambda: coord.collectors >= 2, 30)
        submitted = 0

        def keep_going(seconds: float) -> None:
            nonlocal submitted
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                done = ends.count()
                if submitted - done < 4:
                    r = coord.submit(f"far-{submitted}", "collector", {}, max_attempts=8)
                    assert r is not None and r.accepted, r
                    submitted += 1
                else:
                    time.sleep(0.02)

        keep_going(2.0)
        netns.cut()  # shorter than the liveness window: the sessions resume
        time.sleep(0.5)
        netns.heal()
        keep_going(2.0)
        # a worker behind the same link that will come back with the result of an attempt
        # the broker gave away: only it fits this task
        stale = subprocess.Popen(
            ["ip", "netns", "exec", netns.name, sys.executable, "-c", STALE_SCRIPT, endpoint],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        workers.append(stale)
        assert stale.stdout is not None
        keep_going_until = threading.Thread(target=keep_going, args=(1.0,))
        keep_going_until.start()  # it takes one of the tasks that keep coming
        held = stale.stdout.readline().split()
        keep_going_until.join()
        assert held and held[0] == "holding", held
        lost_before = len([r for r in ends.requeued if "lost" in r])
        netns.cut()  # longer: the broker expires the workers and re-queues their attempts
        time.sleep(2.5)
        netns.heal()
        keep_going(2.0)
        assert stale.stdin is not None
        stale.stdin.write("go\n")
        stale.stdin.flush()
        refused = stale.stdout.readline().split()
        assert refused and refused[0] == "refused", refused
        assert int(refused[1]) in (406, 407), "".join(blog)  # fenced: that attempt is over
        assert wait_until(lambda: ends.count() >= submitted, 60), \
            f"{ends.count()} of {submitted} tasks ended"
        outcomes = ends.outcomes()
        print(f"partition: {submitted} tasks over a link with netem={netns.netem}, "
              f"{len(ends.requeued)} attempts re-queued")
        assert sorted(outcomes) == sorted(f"far-{i}" for i in range(submitted))
        assert all(v == ["finished"] for v in outcomes.values()), outcomes
        assert held[1] in outcomes  # the held task was finished by another worker, once
        assert len([r for r in ends.requeued if "lost" in r]) > lost_before  # the long cut did expire
    finally:
        if coord is not None:
            coord.close()
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
        broker.terminate()
        broker.wait(15)
