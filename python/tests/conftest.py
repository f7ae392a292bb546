"""Shared fixtures: where the repository, its protocol files and the built binaries are, and
a broker process started on free ports for the integration tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYTHON_DIR)
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import rlbus  # noqa: E402  (from this checkout)

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


class Broker(rlbus.Broker):
    """The package's own :class:`rlbus.Broker`, started at once, with its warnings only, from
    this build tree. Restarted with :meth:`start`, it binds the same ports again."""

    def __init__(self, args: Optional[List[str]] = None) -> None:
        if not os.path.exists(BROKER):
            pytest.skip(f"broker binary not built: {BROKER}")
        extra = list(args or [])
        if "--log-level" not in extra:
            extra = ["--log-level", "warn"] + extra
        super().__init__(extra, binary=BROKER)
        try:
            self.start()
        except RuntimeError as e:
            raise AssertionError(str(e)) from None

    @property
    def router_port(self) -> int:
        """The ROUTER's port (for relays and raw sockets that dial it themselves)."""
        return int(self.router.rsplit(":", 1)[1])


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


# ---- a group of brokers over a real etcd ----

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class Process:
    """A child whose output lines are kept, for waiting on one."""

    def __init__(self, args: List[str]) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        assert wait_until(lambda: self.saw(text) or self.proc.poll() is not None, timeout) \
            and self.saw(text), f"no {text!r} in:\n{''.join(self.lines)}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)


@pytest.fixture
def etcd() -> Iterator[str]:
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    with tempfile.TemporaryDirectory() as d:
        url = f"http://127.0.0.1:{rlbus.free_port()}"
        peer = f"http://127.0.0.1:{rlbus.free_port()}"
        p = Process([ETCD, "--name", "t", "--data-dir", os.path.join(d, "data"),
                     "--listen-client-urls", url, "--advertise-client-urls", url,
                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                     "--initial-cluster", f"t={peer}", "--heartbeat-interval", "50",
                     "--election-timeout", "500"])

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    return b'"true"' in r.read()
            except OSError:
                return False
        try:
            assert wait_until(healthy, 60, 0.05), "".join(p.lines)
            yield url
        finally:
            p.stop()


def group_broker(etcd_url: str, journal: str = "", extra: Optional[List[str]] = None) -> tuple:
    """A broker of group "g" on free ports: (its router endpoint, its Process)."""
    router = f"tcp://127.0.0.1:{rlbus.free_port()}"
    events = f"tcp://127.0.0.1:{rlbus.free_port()}"
    return router, Process([BROKER, "--cluster-etcd", etcd_url, "--cluster-name", "g",
                            "--advertise", router, "--router", router, "--events", events]
                           + (["--journal", journal] if journal else []) + (extra or []))
