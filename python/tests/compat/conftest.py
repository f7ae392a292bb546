"""Fixtures of the compat tests: a stand-in SDK and the real broker (started on free
ports, stopped at the end)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compat_helpers import broker_binary, sdk_available  # noqa: E402

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
    """The real rlbus-broker on free local ports (rlbus.Broker, as users start one)."""
    if not sdk_available():
        pytest.skip("the rlbus SDK (rlbus.Worker / rlbus.Coordinator) is not available")
    exe = broker_binary()
    if exe is None:
        pytest.skip("rlbus-broker is not built (ninja -C build src/rlbus-broker)")
    from rlbus import Broker
    b = Broker(["--log-level", "info"], binary=exe)
    try:
        b.start()
    except RuntimeError as e:
        pytest.fail(str(e))
    yield b
    b.stop()
