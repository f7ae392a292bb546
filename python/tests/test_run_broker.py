"""The broker a run starts for itself (rlbus._run): it serves the processes of the run for
exactly as long as one of them lives, however the others ended (SIGKILL included); it logs to
a file in the run's private folder, never to a pipe that a process of the run would have to
read; and it is the run's own, never whatever listens at the default endpoint.

Each test runs a real creator process (a script in the test's folder) that starts the run's
broker and a worker of the run, then ends in the way the test names; the test looks at the
broker from outside (its pid, the run's lock, a node of its own on the broker)."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Dict, Optional

import pytest

import rlbus
from conftest import BUILD_DIR, wait_until

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The creator: starts the run's broker, then a worker of the run (forked with os.fork, or
# spawned by multiprocessing) that holds a bus node, answers "ping.<n>" with "pong.<n>" and
# ends when the file `stop` appears; then the creator ends as argv[2] says: "exit" (returns
# normally while the worker runs) or "wait" (waits to be killed).
CREATOR = """
import logging, multiprocessing, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
import rlbus
from rlbus import _run

def worker(folder, endpoint):
    bus = rlbus.Bus(endpoint, f"worker-{os.getpid()}")
    assert bus.wait_ready(30), bus.last_error
    bus.subscribe("ping", prefix=True, timeout=30)
    with open(os.path.join(folder, "worker.pid"), "w") as f:
        f.write(str(os.getpid()))
    stop = os.path.join(folder, "stop")
    while not os.path.exists(stop):
        msg = bus.recv(timeout=0.05)
        if msg is not None:
            bus.publish("pong" + msg.topic[4:], msg.payload, timeout=30)
    bus.close()

if __name__ == "__main__":
    folder, how, start = sys.argv[1], sys.argv[2], sys.argv[3]
    endpoint = _run.ensure_broker()
    print("broker", endpoint, _run.last_started.proc.pid, _run.current(), flush=True)
    if start == "fork":
        pid = os.fork()
        if pid == 0:
            try:
                worker(folder, endpoint)
            finally:
                os._exit(0)
    else:
        p = multiprocessing.get_context("spawn").Process(target=worker, args=(folder, endpoint))
        p.start()
        pid = p.pid
    while not os.path.exists(os.path.join(folder, "worker.pid")):
        time.sleep(0.02)
    print("worker", pid, flush=True)
    if how == "wait":
        time.sleep(3600)
    os._exit(0) if start == "spawn" else sys.exit(0)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _held(lock_path: str) -> bool:
    """Whether some process holds the run's lock (tried without taking it for long)."""
    fd = os.open(lock_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        assert exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        return True
    finally:
        os.close(fd)  # lets go of the lock if it was taken
    return False


class Creator:
    """A creator process and what it said."""

    def __init__(self, tmp_path, how: str, start: str = "fork",
                 env: Optional[Dict[str, str]] = None) -> None:
        script = tmp_path / "creator.py"
        script.write_text(textwrap.dedent(CREATOR))
        self.folder = str(tmp_path)
        run_env = dict(os.environ, PYTHONPATH=PYTHON_DIR, RLBUS_BUILD_DIR=BUILD_DIR,
                       TMPDIR=str(tmp_path), **(env or {}))
        for name in ("RLBUS_ENDPOINT", "RLBUS_RUN_LOCK", "XDG_RUNTIME_DIR"):
            run_env.pop(name, None)
        self.out_path = tmp_path / "creator.out"
        self.out = open(self.out_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(script), self.folder, how, start],
                                     stdout=self.out, stderr=subprocess.STDOUT, env=run_env)
        self.said: Dict[str, str] = {}
        assert wait_until(lambda: self._read() and "worker" in self.said, 60), self.text()
        self.endpoint, pid, self.run_dir = self.said["broker"].split()
        self.broker_pid = int(pid)
        self.worker_pid = int(self.said["worker"])
        self.lock = os.path.join(self.run_dir, "run.lock")

    def text(self) -> str:
        return self.out_path.read_text()

    def _read(self) -> bool:
        # whole lines only: the creator may be writing the last one as it is read
        for line in self.text().split("\n")[:-1]:
            word, _, rest = line.partition(" ")
            if word in ("broker", "worker"):
                self.said[word] = rest
        return True

    def stop_worker(self) -> None:
        open(os.path.join(self.folder, "stop"), "w").close()

    def close(self) -> None:
        self.stop_worker()
        for pid in (self.worker_pid, self.broker_pid):
            wait_until(lambda: _gone(pid), 10)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.out.close()


def serves_the_worker(endpoint: str, n: int) -> bool:
    """A node of the test's own asks the worker `ping.<n>` through the run's broker and gets
    its answer: the broker serves the run."""
    bus = rlbus.Bus(endpoint, f"test-{os.getpid()}-{n}")
    try:
        assert bus.wait_ready(20), bus.last_error
        bus.subscribe(f"pong.{n}", timeout=20)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            bus.publish(f"ping.{n}", b"x", timeout=20)
            msg = bus.recv(timeout=0.5)
            if msg is not None and msg.topic == f"pong.{n}":
                return True
        return False
    finally:
        bus.close()


@pytest.mark.parametrize("how,start", [("kill", "fork"), ("exit", "fork"), ("kill", "spawn")])
def test_the_run_broker_lives_while_a_worker_lives_and_goes_with_the_last(tmp_path, how, start):
    """The creator goes first (SIGKILL, or returning normally): the broker keeps serving the
    worker it started; once the worker has ended too (SIGKILL), the broker stops by itself."""
    creator = Creator(tmp_path, "wait" if how == "kill" else "exit", start)
    try:
        assert creator.endpoint.startswith("ipc://" + str(tmp_path)), creator.endpoint
        if how == "kill":
            creator.proc.kill()
        assert creator.proc.wait(30) in (0, -signal.SIGKILL)
        assert _held(creator.lock), "the worker lives, yet nothing holds the run"
        assert serves_the_worker(creator.endpoint, 1), creator.text()
        assert not _gone(creator.broker_pid), "the broker stopped under a live worker"
        os.kill(creator.worker_pid, signal.SIGKILL)
        assert wait_until(lambda: _gone(creator.broker_pid), 10), \
            "the broker outlived the last process of its run"
        log = open(os.path.join(creator.run_dir, "broker.log")).read()
        assert "no process of the run holds" in log, log
    finally:
        creator.close()


def test_the_run_broker_never_writes_to_a_pipe_nobody_reads(tmp_path):
    """The creator read the broker's output through a pipe, died, and its forked worker never
    read it: past 64 KiB of log the broker blocked, answering no one. Now it logs to a file in
    the run's folder, named in the creator's log: 256 KiB of debug lines later, it serves."""
    creator = Creator(tmp_path, "wait", env={"RLBUS_BROKER_LOG_LEVEL": "debug"})
    try:
        log_path = os.path.join(creator.run_dir, "broker.log")
        assert f"it logs to {log_path}" in creator.text(), creator.text()
        creator.proc.kill()
        creator.proc.wait(30)
        n = 0
        while os.path.getsize(log_path) < 256 * 1024:
            n += 1
            assert serves_the_worker(creator.endpoint, n), creator.text()
            assert n < 2000, "the broker logs too little at debug to fill a pipe"
        assert serves_the_worker(creator.endpoint, n + 1)
    finally:
        creator.close()


def test_a_run_that_names_no_broker_never_takes_what_listens_at_the_default_port(tmp_path):
    """Something that is not the run's broker holds 127.0.0.1:7235 (here a socket that
    accepts and says nothing; the packaged service with CURVE, or another user's broker, are
    the same to a run): the run starts its own, says the default is not used, and works."""
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        squatter.bind(("127.0.0.1", 7235))
        squatter.listen(16)
    except OSError as exc:  # something holds it already: as good for this test
        assert exc.errno == errno.EADDRINUSE
    try:
        creator = Creator(tmp_path, "exit")
        try:
            assert creator.endpoint.startswith("ipc://"), creator.endpoint
            assert "something listens at tcp://127.0.0.1:7235 and is not used" \
                in creator.text(), creator.text()
            assert serves_the_worker(creator.endpoint, 1)
            folder = os.stat(creator.run_dir)
            assert folder.st_mode & 0o077 == 0, "another user could reach the run's broker"
        finally:
            creator.close()
    finally:
        squatter.close()


def test_a_process_started_for_a_run_that_is_over_says_so(tmp_path):
    creator = Creator(tmp_path, "exit")
    creator.close()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, RLBUS_RUN_LOCK=creator.lock,
               RLBUS_ENDPOINT=creator.endpoint)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        from rlbus import _run
        try:
            _run.ensure_broker()
        except RuntimeError as e:
            print("refused:", e)
    """)], env=env, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert re.search(r"the run this process was started for \(.*\) is over: its broker has "
                     r"stopped", text), text
    assert "refused: the run this process was started for" in text, text
