"""Shared fixtures: where the repository, its protocol files and the built binaries are, and
a broker process started on free ports for the integration tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYTHON_DIR)
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

PROTOCOL_DIR = os.path.join(ROOT, "protocol")
BUILD_DIR = os.environ.get("RLBUS_BUILD_DIR", os.path.join(ROOT, "build"))
BROKER = os.path.join(BUILD_DIR, "src", "rlbus-broker")
PEER = os.path.join(BUILD_DIR, "tests", "peer", "rlbus-sdk-peer")
DUMP = os.path.join(BUILD_DIR, "tests", "peer", "rlbus-codec-dump")


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.01) -> bool:
    """Polls ``cond`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return bool(cond())
        time.sleep(step)


_LISTENING = re.compile(r"listening router=tcp://[^:]+:(\d+) events=tcp://[^:]+:(\d+)")


# A collector process for the fault tests: each task sends ITEMS data items PAUSE seconds
# apart, then "done", and waits to be closed. Arguments: endpoint, id, heartbeat (seconds),
# items, pause.
_COLLECTOR = """
import sys, time, rlbus
endpoint, wid, heartbeat, items, pause = sys.argv[1:6]
def run(task):
    for i in range(int(items)):
        if not task.emit_data("%s-%d" % (task.id, i), "buf", {"i": i}):
            return
        time.sleep(float(pause))
    task.emit_info({"collector_done": True})
    task.wait_stop(60)
def close(task):
    return {"worker": wid}
w = rlbus.Worker(endpoint, role="collector", id=wid, run=run, close=close,
                 heartbeat=float(heartbeat), reconnect_min=0.05, reconnect_max=0.2)
w.run_forever()
"""


def collector_process(endpoint: str, worker_id: str, heartbeat_s: float, items: int,
                      pause_s: float, prefix: Optional[List[str]] = None) -> subprocess.Popen:
    """Starts that collector (behind ``prefix``, e.g. ``ip netns exec NS``), silent."""
    return subprocess.Popen(
        list(prefix or []) + [sys.executable, "-c", _COLLECTOR, endpoint, worker_id,
                              str(heartbeat_s), str(items), str(pause_s)],
        env=dict(os.environ, PYTHONPATH=PYTHON_DIR), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


class Endings:
    """How a coordinator's tasks ended, for the fault tests: :attr:`callbacks` records each
    end (``finished``, ``failed: REASON``, ``cancelled: REASON``) under its task id, and the
    reason of each re-queued attempt; every task must end exactly once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: Dict[str, List[str]] = {}
        self.requeued: List[str] = []  # reasons, in order
        self.callbacks = {
            "deal_with_collector_finish_task": lambda t, r: self._record(t, "finished"),
            "on_task_failed": lambda t, reason, result=None: self._record(t, "failed: " + reason),
            "on_task_cancelled": lambda t, reason: self._record(t, "cancelled: " + reason),
            "on_task_requeued": lambda t, attempt, reason, result=None:
                self.requeued.append(reason),
        }

    def _record(self, task_id: str, how: str) -> None:
        with self._lock:
            self._ended.setdefault(task_id, []).append(how)

    def count(self) -> int:
        """Tasks that have ended (once or more)."""
        with self._lock:
            return len(self._ended)

    def outcomes(self) -> Dict[str, List[str]]:
        """A copy: task id -> every end it had."""
        with self._lock:
            return {t: list(v) for t, v in self._ended.items()}


class Broker:
    """A running rlbus-broker on its own ports, its output collected for diagnostics.

    The first start binds port 0 and reads the ports the kernel gave from the broker's
    "listening" line: a port picked here and bound later could be taken in between by any
    other process's connection (the suite runs in parallel with other tests). A restart binds
    the same ports again."""

    def __init__(self, args: Optional[List[str]] = None) -> None:
        if not os.path.exists(BROKER):
            pytest.skip(f"broker binary not built: {BROKER}")
        self.extra = list(args or [])
        self.router_port = 0
        self.events_port = 0
        self.proc: Optional[subprocess.Popen] = None
        self.lines: List[str] = []
        self.start()

    @property
    def router(self) -> str:
        return f"tcp://127.0.0.1:{self.router_port}"

    @property
    def events(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    def start(self) -> None:
        """Starts (or restarts, on the same ports) the broker; waits until it serves."""
        # no drain at the end of a test unless the test asks for one: tasks left running
        # would otherwise hold the broker's exit for the default drain (10 s)
        drain = [] if "--drain-ms" in self.extra else ["--drain-ms", "0"]
        level = [] if "--log-level" in self.extra else ["--log-level", "warn"]
        cmd = [BROKER, "--router", self.router, "--events", self.events] + level + drain \
            + self.extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        reader.start()
        proc = self.proc
        wait_until(lambda: self._serving() or proc.poll() is not None, 10.0)
        if not self._serving():
            reader.join(2.0)  # the broker's last words, if it exited
            raise AssertionError("broker did not start: " + "".join(self.lines))

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)

    def _serving(self) -> bool:
        """True once the broker has printed the endpoints it bound (SPEC §1.4.1)."""
        for line in list(self.lines):
            m = _LISTENING.search(line)
            if m:
                self.router_port, self.events_port = int(m.group(1)), int(m.group(2))
                return True
        return False

    def kill(self) -> None:
        """SIGKILLs the broker (no DISCONNECT to anyone)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker()
    yield b
    b.stop()


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., Broker]]:
    made: List[Broker] = []

    def make(*args: str) -> Broker:
        b = Broker(list(args))
        made.append(b)
        return b
    yield make
    for b in made:
        b.stop()


@pytest.fixture
def closing() -> Any:
    """Closes what a test opened (coordinators, raw workers), even when it fails."""
    opened: List[Any] = []
    yield opened.append
    for x in reversed(opened):
        x.close()
