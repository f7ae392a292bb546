"""`rlbus-ctl top` against a real broker with real peers: in a terminal (a pty here) it draws
its frames in place on a screen of its own, shows the workers and tasks OPS reports, and
quits on q, giving the terminal back; into a pipe it prints plain frames, one after another,
with no terminal codes."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import threading
import time
from typing import Any, Iterator, List

import pytest

from conftest import BUILD_DIR, Broker, wait_until
import rlbus

CTL = os.path.join(BUILD_DIR, "src", "rlbus-ctl")
WAIT = 30.0


@pytest.fixture
def busy_broker() -> Iterator[Broker]:
    """A broker with two collectors, each running one of three tasks (one queued)."""
    broker = Broker()
    opened: List[Any] = []

    def run(task: Any) -> None:
        while not task.wait_stop(0.05):
            pass

    try:
        for wid in ("top-col-1", "top-col-2"):
            w = rlbus.Worker(broker.router, role="collector", id=wid, run=run, heartbeat=1.0)
            threading.Thread(target=w.run_forever, daemon=True).start()
            opened.append(w)
        coordinator = rlbus.Coordinator(broker.router, id="top-coord")
        opened.append(coordinator)
        assert coordinator.wait_for("ready", WAIT)
        for i in range(3):
            coordinator.submit(f"top-task-{i}", "collector", {})
        yield broker
    finally:
        for x in reversed(opened):
            x.close()
        broker.stop()


def test_top_into_a_pipe_prints_plain_frames(busy_broker: Broker) -> None:
    def frames() -> str:
        return subprocess.run([CTL, "--broker", busy_broker.router, "top", "--count", "2",
                               "--interval", "200"], capture_output=True, text=True,
                              timeout=WAIT, check=True).stdout

    # Both collectors busy and one task queued, as the broker has it once they joined.
    assert wait_until(lambda: "1 queued, 2 running" in frames(), WAIT)
    out = frames()
    assert "\x1b" not in out
    assert out.count("rlbus-ctl top") == 2
    for name in ("top-col-1", "top-col-2", "top-task-0", "top-task-1", "top-task-2"):
        assert name in out
    assert "WORKERS (2 of 2)" in out and "TASKS (3 of 3)" in out
    assert "2 collectors, 0 learners, 1 coordinators" in out


def test_top_in_a_terminal_refreshes_in_place_and_quits_on_q(busy_broker: Broker) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: rlbus-ctl with the pty as its terminal
        os.execv(CTL, [CTL, "--broker", busy_broker.router, "top", "--interval", "100"])
    seen = b""
    deadline = time.monotonic() + WAIT
    try:
        # Frames come until the view shows every worker and task busy.
        while b"1 queued, 2 running" not in seen or seen.count(b"\x1b[H") < 2:
            assert time.monotonic() < deadline, seen[-2000:]
            if select.select([fd], [], [], 0.5)[0]:
                seen += os.read(fd, 65536)
        assert seen.startswith(b"\x1b[?1049h")  # a screen of its own
        assert b"q quits" in seen and b"top-col-1" in seen and b"top-task-2" in seen
        os.write(fd, b"q")
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "top did not quit on q"
            try:
                if select.select([fd], [], [], 0.1)[0]:
                    seen += os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                pass
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        try:
            while select.select([fd], [], [], 0.1)[0]:
                seen += os.read(fd, 65536)
        except OSError:
            pass
        assert seen.rstrip(b"\r\n").endswith(b"\x1b[?1049l")  # the terminal given back
    finally:
        os.close(fd)
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
