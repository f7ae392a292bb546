"""What the rlbus MQ adds to DI-engine's distributed mode beyond the shared tests: a runner that
names no broker gets one of its own for the run, and the patch leaves other mq_types alone."""

import os
import re
import signal
import subprocess
import sys

import pytest

from ding.framework import Parallel

from rlbus import Bus
from rlbus.compat import ditask

from . import STANDIN
from .test_parallel import _gone, ping_main
from .helpers import Side, wait_until


def test_a_runner_without_a_broker_starts_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("RLBUS_ENDPOINT", raising=False)
    monkeypatch.setenv("DITASK_WORKER_TIMEOUT", "60")
    Parallel.runner(n_parallel_workers=2, mq_type="rlbus", startup_interval=0.1)(
        ping_main, str(tmp_path))
    side = Side(tmp_path)
    assert side.read("heard_0") == ["ping", 1] and side.read("heard_1") == ["ping", 0]
    broker = ditask.last_embedded
    assert broker is not None and broker.router.startswith("ipc://")
    broker.proc.wait(10)  # it stops by itself once the last process of the run has ended
    assert "RLBUS_ENDPOINT" not in os.environ and ditask._MARK_ENV not in os.environ
    assert "RLBUS_RUN_LOCK" not in os.environ


def test_other_mq_types_are_left_alone():
    # the patched runner hands them to the original, which knows no such type
    with pytest.raises(KeyError):
        Parallel.runner(n_parallel_workers=1, mq_type="no-such-mq")(lambda: None)


def test_a_node_hears_only_the_nodes_it_is_linked_to():
    """Links as nng makes them: a node dialled another, or was dialled by it. A node that
    announced no links (not a runner's) is heard by everyone."""
    hub = ditask.RlbusMQ(edges={"addresses": ["rlbus:r:worker0"], "attach_to": []})
    leaf = ditask.RlbusMQ(edges={"addresses": ["rlbus:r:worker1"],
                                 "attach_to": ["rlbus:r:worker0"]})
    for mq, others in ((hub, ("leaf1", "leaf2")), (leaf, ("hub", "leaf2"))):
        mq._note_edges(ditask.EDGES + "hub", b'{"addresses": ["rlbus:r:worker0"], '
                                              b'"attach_to": []}')
        for k in (1, 2):
            mq._note_edges(ditask.EDGES + f"leaf{k}",
                           ('{"addresses": ["rlbus:r:worker%d"], "attach_to": '
                            '["rlbus:r:worker0"]}' % k).encode())
    assert hub._linked("leaf1") and hub._linked("leaf2")
    assert leaf._linked("hub") and not leaf._linked("leaf2")
    assert leaf._linked("someone-unannounced")
    assert ditask.RlbusMQ()._linked("leaf2")  # no topology: hears everyone


def test_nng_lengths_of_attach_to():
    assert ditask.nng_attach_to(0, "mesh", None) == []
    assert len(ditask.nng_attach_to(3, "mesh", ["tcp://x:1"])) == 4
    assert ditask.nng_attach_to(0, "star", []) == []
    assert len(ditask.nng_attach_to(2, "star", [])) == 1
    assert ditask.nng_attach_to(5, "alone", ["a"]) == ["a"]


# A runner of two workers over a broker it starts for the run. Each worker emits "ping" every
# 50 ms, counts the pings it hears from the other in a file, and ends when `stop` appears.
RUNNER = """
import logging, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
from tests.ditask.helpers import node_id
from ding.framework import Parallel

def main(folder):
    router = Parallel()
    me = node_id()
    heard = []
    router.on("ping", lambda k, sender: heard.append(sender))
    with open(os.path.join(folder, f"pid{me}"), "w") as f:
        f.write(str(os.getpid()))
    k = 0
    while not os.path.exists(os.path.join(folder, "stop")):
        router.emit("ping", k, me)
        k += 1
        with open(os.path.join(folder, f"heard{me}.tmp"), "w") as f:
            f.write(str(len(heard)))
        os.replace(os.path.join(folder, f"heard{me}.tmp"), os.path.join(folder, f"heard{me}"))
        time.sleep(0.05)

if __name__ == "__main__":
    Parallel.runner(n_parallel_workers=2, mq_type="rlbus", startup_interval=0)(main, sys.argv[1])
"""


def test_the_run_broker_outlives_a_killed_runner_and_worker_and_goes_with_the_last(tmp_path):
    """SIGKILL of the runner: its workers go on talking over the run's broker. SIGKILL of one
    worker: the other still has the broker. When the last one ends, the broker stops."""
    python_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = dict(os.environ, TMPDIR=str(tmp_path), DITASK_WORKER_TIMEOUT="300",
               PYTHONPATH=os.pathsep.join([python_dir, STANDIN]))
    for name in ("RLBUS_ENDPOINT", "RLBUS_RUN_LOCK", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    out_path = tmp_path / "runner.out"
    heard = [tmp_path / "heard0", tmp_path / "heard1"]

    def count(i):
        try:
            return int(heard[i].read_text() or 0)
        except (OSError, ValueError):
            return 0

    with open(out_path, "w") as out:
        runner = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=out,
                                  stderr=subprocess.STDOUT, env=env, cwd=python_dir)
    pids = []
    try:
        assert wait_until(lambda: count(0) > 0 and count(1) > 0, 120), out_path.read_text()
        text = out_path.read_text()
        m = re.search(r"started one for this run at (ipc://\S+) \(pid (\d+)\)", text)
        assert m, text
        broker_pid = int(m.group(2))
        pids = [int((tmp_path / f"pid{i}").read_text()) for i in (0, 1)]
        runner.kill()
        runner.wait(30)
        before = [count(0), count(1)]
        assert wait_until(lambda: count(0) > before[0] + 5 and count(1) > before[1] + 5, 60), \
            "the workers stopped hearing each other once the runner was killed"
        os.kill(pids[1], signal.SIGKILL)
        assert wait_until(lambda: _gone(pids[1]), 10)
        bus = Bus(m.group(1), "test-after-the-kills")
        try:
            assert bus.wait_ready(30), "the broker did not serve with worker 0 still running"
        finally:
            bus.close()
        assert not _gone(broker_pid)
        (tmp_path / "stop").write_text("")
        assert wait_until(lambda: _gone(pids[0]), 30)
        assert wait_until(lambda: _gone(broker_pid), 10), \
            "the broker outlived the last process of its run"
    finally:
        (tmp_path / "stop").write_text("")
        if runner.poll() is None:
            runner.kill()
        runner.wait(30)
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
