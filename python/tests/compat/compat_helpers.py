"""Helpers of the compat tests: paths, waiting for conditions, finding the broker."""

import os
import shutil
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))
ROOT = os.path.dirname(PYTHON_DIR)
STANDIN = os.path.join(PYTHON_DIR, "standins", "legacy")  # the stand-in `ding` of this generation

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


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


def collectors_wait_for_the_buffer(coord, buffer_id="test"):
    """Makes `coord`'s commander hand out collector tasks only while the learner's replay
    buffer `buffer_id` exists. DI-engine's coordinator makes that buffer once the learner
    task has been sent, and drops collector data for a buffer it has not made: on a busy
    machine its learner thread can come that late, after the collectors sent everything, and
    the learner then waits for data for ever. Call it before coord.start()."""
    commander = coord._commander
    get = commander.get_collector_task

    def gated():  # called with coord's lock held, the lock the buffer is made under
        return get() if buffer_id in coord._replay_buffer else None
    commander.get_collector_task = gated


def broker_binary():
    build = os.environ.get("RLBUS_BUILD_DIR", os.path.join(ROOT, "build"))
    for cand in (os.environ.get("RLBUS_BROKER"),
                 os.path.join(build, "src", "rlbus-broker"),
                 shutil.which("rlbus-broker")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def sdk_available():
    try:
        import rlbus  # noqa: F401
        return hasattr(rlbus, "Worker") and hasattr(rlbus, "Coordinator")
    except ImportError:
        return False


