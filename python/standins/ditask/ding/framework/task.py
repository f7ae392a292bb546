"""The Task layer: a pipeline of middleware run step by step, and events that reach the other
nodes through the router under a ``task.`` prefix.

What matters to an MQ: ``task.emit`` publishes from a 3-thread pool (so one node's
consecutive emits may reach ``publish`` out of order); every ``task.on`` subscribes
``task.<event>`` again (no de-duplication); ``task.stop()`` publishes ``finish`` last, waits
for the pool, then unsubscribes ``task.*`` before the router stops the MQ.
"""

import enum
import fnmatch
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

from ..utils import SingletonMetaclass
from .context import Context
from .event_loop import EventLoop
from .parallel import Parallel


class Role(str, enum.Enum):
    LEARNER = "learner"
    COLLECTOR = "collector"
    EVALUATOR = "evaluator"
    FETCHER = "fetcher"


class Task(metaclass=SingletonMetaclass):

    def __init__(self):
        self.router = Parallel()
        self.ctx = Context()
        self.middleware = []
        self.labels = set()
        self._roles = set()
        self._finish = False
        self._event_loop = EventLoop("task")
        self._async_executor = None
        self._lock = threading.Lock()

    # -- life cycle ------------------------------------------------------------------------

    def start(self, ctx=None, n_async_workers=3, labels=None):
        self._finish = False
        self.ctx = ctx if ctx is not None else Context()
        self.middleware = []
        self._roles = set()
        self._async_executor = ThreadPoolExecutor(n_async_workers, thread_name_prefix="task_async")
        self.labels = set(labels or [])
        if self.router.is_active:
            self.labels |= {"distributed", f"node.{self.router.node_id}"} | set(self.router.labels)
            self.on("finish", self._on_finish)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.router.is_active:
            self.emit("finish", True, only_remote=True)
        executor, self._async_executor = self._async_executor, None
        if executor is not None:
            executor.shutdown(wait=True)  # what was queued is published before the MQ stops
        if self.router.is_active:
            self.router.off("task.*")
        self._event_loop.stop()

    def _on_finish(self, finish):
        self._finish = finish

    @property
    def finish(self):
        return self._finish

    @finish.setter
    def finish(self, value):
        self._finish = value

    # -- the pipeline -----------------------------------------------------------------------

    def use(self, fn):
        self.middleware.append(fn)
        return self

    def forward(self, ctx):
        """Runs each middleware; a generator middleware runs to its ``yield`` on the way in
        and on after it, in reverse order, on the way out."""
        pending = []
        for fn in self.middleware:
            r = fn(ctx)
            if isinstance(r, types.GeneratorType):
                try:
                    next(r)
                    pending.append(r)
                except StopIteration:
                    pass
        for g in reversed(pending):
            try:
                next(g)
            except StopIteration:
                pass

    def run(self, max_step=float("inf")):
        """Steps until ``finish`` or ``max_step`` steps; ``ctx.total_step`` ends at the last
        step's index."""
        step = 0
        while not self.finish:
            self.forward(self.ctx)
            step += 1
            if self.finish or step >= max_step:
                break
            self.ctx = self.ctx.renew()

    # -- events ----------------------------------------------------------------------------

    @staticmethod
    def _wrap_event_name(event):
        return "task." + event

    def emit(self, event, *args, only_remote=False, only_local=False):
        if self.router.is_active and not only_local:
            self.async_executor(self.router.emit, self._wrap_event_name(event), event, *args)
        if not only_remote:
            self._event_loop.emit(event, *args)

    def async_executor(self, fn, *args, **kwargs):
        executor = self._async_executor
        if executor is None:
            fn(*args, **kwargs)
        else:
            executor.submit(fn, *args, **kwargs)

    def on(self, event, fn):
        self._event_loop.on(event, fn)
        if self.router.is_active:
            # The remote payload's first argument is the bare event name: the router's
            # listener is this task's own loop's emit.
            self.router.on(self._wrap_event_name(event), self._event_loop.emit)

    def once(self, event, fn):
        self._event_loop.once(event, fn)
        if self.router.is_active:
            self.router.on(self._wrap_event_name(event), self._event_loop.emit)

    def off(self, event, fn=None):
        self._event_loop.off(event, fn)
        if self.router.is_active:
            self.router.off(self._wrap_event_name(event))

    def wait_for(self, event, timeout=float("inf")):
        """Blocks until ``event`` arrives (polling every 10 ms); returns (args, kwargs)."""
        got = []
        self.once(event, lambda *a, **k: got.append((a, k)))
        deadline = time.monotonic() + timeout
        while not got:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout} s")
            time.sleep(0.01)
        return got[0]

    # -- labels and roles --------------------------------------------------------------------

    def match_labels(self, patterns):
        if isinstance(patterns, str):
            patterns = [patterns]
        return any(fnmatch.fnmatchcase(label, p) for p in patterns for label in self.labels)

    def add_role(self, role):
        self._roles.add(role)
        return self

    def has_role(self, role):
        return not self._roles or role in self._roles

    @property
    def roles(self):
        return set(self._roles)


task = Task()
