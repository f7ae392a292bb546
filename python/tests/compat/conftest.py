"""Fixtures of the compat tests: a stand-in SDK and the real broker (started on free
ports, stopped at the end)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compat_helpers import _LINE, Broker, broker_binary, sdk_available  # noqa: E402

@pytest.fixture
def fake_sdk():
    import compat_fakesdk as fakesdk
    from rlbus.compat import _util
    mod = fakesdk.module()
    _util.set_sdk(mod)
    yield mod
    _util.set_sdk(None)


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
