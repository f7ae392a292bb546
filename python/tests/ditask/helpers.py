"""What the tests share: waiting for a condition under a deadline, a side channel between the
workers of a test (files in the test's directory: reliable, and beside the MQ under test, so
"done" never depends on the MQ), and starting a runner over the fixture's MQ type."""

import json
import os
import time

from ding.framework import Parallel


def wait_until(cond, timeout, step=0.01):
    """Polls ``cond`` until true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return bool(cond())
        time.sleep(step)


class Side:
    """Named marks in a directory shared by one test's workers and the test itself."""

    def __init__(self, path):
        self.path = str(path)

    def _file(self, name):
        return os.path.join(self.path, name + ".json")

    def mark(self, name, value=None):
        tmp = self._file(name) + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, self._file(name))

    def has(self, *names):
        return all(os.path.exists(self._file(n)) for n in names)

    def read(self, name):
        with open(self._file(name)) as f:
            return json.load(f)

    def wait(self, *names, timeout=20.0, every=None, action=None):
        """Waits until every mark exists, calling ``action`` first and then every ``every``
        seconds meanwhile (e.g. to re-send); TimeoutError with what is missing."""
        deadline = time.monotonic() + timeout
        next_action = 0.0
        while not self.has(*names):
            now = time.monotonic()
            if now >= deadline:
                missing = [n for n in names if not self.has(n)]
                raise TimeoutError(f"marks {missing} not set within {timeout} s")
            if action is not None and now >= next_action:
                action()
                next_action = now + (every or 0.05)
            time.sleep(0.01)


def run(mq, n, main, *args, **runner_kwargs):
    """Runs ``main(*args)`` on ``n`` workers over the fixture's MQ type."""
    kwargs = dict(mq.runner_kwargs)
    kwargs.update(runner_kwargs)
    Parallel.runner(n_parallel_workers=n, **kwargs)(main, *args)


def node_id():
    return Parallel().node_id
