"""Middleware that moves step data between nodes of different roles.

ContextExchanger: each node sends, after its step, what its role produced (a collector its
trajectories, episodes and counter increments; a learner its train_iter) on
``context_exchanger_<role>``; nodes of the other roles merge what arrived (lists extended,
increments summed) into their context before their step. A learner waits for a context
before every step (upstream waits forever; ``learner_timeout`` bounds it here), the others
from step ``skip_n_iter`` on, at most ``timeout`` seconds, then go on without one. Topic names
embed ``format()`` of the Role enum, which on Python >= 3.11 reads ``Role.COLLECTOR``: topics
with dots and capitals.

ModelExchanger: the learner sends ``model.state_dict()`` on ``model_exchanger`` after each
step; the others keep the latest one (latest wins) and load it before each step but the
first, waiting at most ``timeout`` seconds, returning early if the task is finishing.

Both are void (do nothing) outside parallel mode or on a node without a role.
"""

import logging
import threading
import time

from ..role_fmt import role_topic
from ..task import Role, task


def _void(ctx):
    return None


class ContextExchanger:

    def __new__(cls, *args, **kwargs):
        if not task.router.is_active or not task.roles:
            return _void
        return super().__new__(cls)

    def __init__(self, skip_n_iter=1, timeout=60, learner_timeout=float("inf")):
        self._skip_n_iter = skip_n_iter
        self._timeout = timeout
        self._learner_timeout = learner_timeout
        self._cond = threading.Condition()
        self._state = {}
        self._received = 0
        self._sent_counters = {"env_step": 0, "env_episode": 0}
        for role in Role:
            if not task.has_role(role):
                task.on(role_topic("context_exchanger", role), self.put)

    @staticmethod
    def _merge(into, new):
        for key, value in new.items():
            if isinstance(value, list):
                into.setdefault(key, []).extend(value)
            elif key in ("env_step", "env_episode"):
                into[key] = into.get(key, 0) + value
            else:
                into[key] = value

    def put(self, payload):
        with self._cond:
            self._merge(self._state, payload)
            self._received += 1
            self._cond.notify_all()

    def _take(self, ctx, timeout):
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._received:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
            state, self._state, self._received = self._state, {}, 0
        self._merge(ctx, state)
        return True

    def _fetch(self, ctx):
        out = {}
        if task.has_role(Role.LEARNER) and "train_iter" in ctx:
            out["train_iter"] = ctx.train_iter
        if task.has_role(Role.COLLECTOR):
            for key in ("trajectories", "trajectory_end_idx", "episodes"):
                if ctx.get(key):
                    out[key] = list(ctx[key])
            for key in ("env_step", "env_episode"):
                if key in ctx:
                    out[key] = ctx[key] - self._sent_counters[key]
                    self._sent_counters[key] = ctx[key]
        return out

    def __call__(self, ctx):
        if task.has_role(Role.LEARNER):
            if not self._take(ctx, self._learner_timeout):
                raise TimeoutError("learner: no context within %s s" % self._learner_timeout)
        elif ctx.total_step >= self._skip_n_iter:
            if not self._take(ctx, self._timeout):
                logging.warning("Timeout when waiting for new context")
        yield
        payload = self._fetch(ctx)
        if payload:
            for role in task.roles:
                task.emit(role_topic("context_exchanger", role), payload, only_remote=True)


class ModelExchanger:

    def __new__(cls, *args, **kwargs):
        if not task.router.is_active or not task.roles:
            return _void
        return super().__new__(cls)

    def __init__(self, model, timeout=60):
        self._model = model
        self._timeout = timeout
        self._cond = threading.Condition()
        self._latest = None
        self._fresh = False
        self.loaded = 0  # how many models this node loaded
        if not task.has_role(Role.LEARNER):
            task.on("model_exchanger", self._cache)

    def _cache(self, state_dict):
        with self._cond:
            self._latest, self._fresh = state_dict, True
            self._cond.notify_all()

    def __call__(self, ctx):
        if task.has_role(Role.LEARNER):
            yield
            task.emit("model_exchanger", self._model.state_dict(), only_remote=True)
            return
        if ctx.total_step != 0:
            deadline = time.monotonic() + self._timeout
            with self._cond:
                while not self._fresh and not task.finish and time.monotonic() < deadline:
                    self._cond.wait(0.01)
                latest, fresh = self._latest, self._fresh
                self._fresh = False
            if fresh:
                self._model.load_state_dict(latest)
                self.loaded += 1
            elif not task.finish:
                logging.warning("Timeout when waiting for new model")
        yield
