"""Fixtures of the compat tests: a stand-in SDK, the stand-in `ding` package's path, and
the real broker (started on free ports, stopped at the end)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))
ROOT = os.path.dirname(PYTHON_DIR)
STANDIN = os.path.join(HERE, "standin")

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture
def fake_sdk():
    import fakesdk
    from rlbus.compat import _util
    mod = fakesdk.module()
    _util.set_sdk(mod)
    yield mod
    _util.set_sdk(None)


def wait_until(cond, timeout, what="condition"):
    """Polls `cond` until it is true; fails the test when `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail("timed out after %gs waiting for %s" % (timeout, what))
        time.sleep(0.02)


def broker_binary():
    for cand in (os.environ.get("RLBUS_BROKER"),
                 os.path.join(ROOT, "build", "src", "rlbus-broker"),
                 shutil.which("rlbus-broker")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


_LINE = re.compile(r"router[= ](\S+)\s+events[= ](\S+)")


class Broker:
    def __init__(self, proc, router, events):
        self.proc, self.router, self.events = proc, router, events


def sdk_available():
    try:
        import rlbus  # noqa: F401
        return hasattr(rlbus, "Worker") and hasattr(rlbus, "Coordinator")
    except ImportError:
        return False


@pytest.fixture
def broker():
    """The real rlbus-broker on free local ports."""
    if not sdk_available():
        pytest.skip("the rlbus SDK (rlbus.Worker / rlbus.Coordinator) is not available")
    exe = broker_binary()
    if exe is None:
        pytest.skip("rlbus-broker is not built (ninja -C build src/rlbus-broker)")
    proc = subprocess.Popen([exe, "--router", "tcp://127.0.0.1:0", "--events",
                             "tcp://127.0.0.1:0", "--log-level", "info", "--drain-ms", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found = {}
    lines = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            m = _LINE.search(line)
            if m and "router" not in found:
                found["router"], found["events"] = m.group(1), m.group(2)

    reader = threading.Thread(target=pump, name="broker-log", daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while "router" not in found and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    if "router" not in found:
        proc.kill()
        proc.wait()
        pytest.fail("broker did not report its endpoints:\n" + "".join(lines))
    b = Broker(proc, found["router"], found["events"])
    b.lines = lines
    yield b
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(5)
