"""Shared fixtures: where the repository, its protocol files and the built binaries are, and
a broker process started on free ports for the integration tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYTHON_DIR)
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

PROTOCOL_DIR = os.path.join(ROOT, "protocol")
BUILD_DIR = os.environ.get("RLBUS_BUILD_DIR", os.path.join(ROOT, "build"))
BROKER = os.path.join(BUILD_DIR, "src", "rlbus-broker")
PEER = os.path.join(BUILD_DIR, "python", "peer", "rlbus-sdk-peer")
DUMP = os.path.join(BUILD_DIR, "python", "peer", "rlbus-codec-dump")


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.01) -> bool:
    """Polls ``cond`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return bool(cond())
        time.sleep(step)


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """A running rlbus-broker on its own ports, its output collected for diagnostics."""

    def __init__(self, args: Optional[List[str]] = None) -> None:
        if not os.path.exists(BROKER):
            pytest.skip(f"broker binary not built: {BROKER}")
        self.extra = list(args or [])
        self.router_port = free_port()
        self.events_port = free_port()
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
        cmd = [BROKER, "--router", self.router, "--events", self.events,
               "--log-level", "warn"] + drain + self.extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        assert wait_until(self._serving, 10.0), "broker did not start: " + "".join(self.lines)

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)

    def _serving(self) -> bool:
        if any("listening" in line for line in self.lines):
            return True
        try:
            with socket.create_connection(("127.0.0.1", self.router_port), timeout=0.2):
                return True
        except OSError:
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
