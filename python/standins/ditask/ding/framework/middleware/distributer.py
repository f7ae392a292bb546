"""Middleware that moves step data between nodes of different roles.

ContextExchanger: each node sends, after its step, what its role produced of its context's
fields (a collector its trajectories, episodes and counter increments; a learner its
train_iter) on ``context_exchanger_<role>``; nodes of the other roles merge what arrived
(lists extended, increments added to their own counters) into their context by attribute
before their step, as DI-engine 0.5's does: a context without those fields (a bare
``Context``) sends nothing and cannot take increments, so pipelines use ``OnlineRLContext``. A learner waits for a context
before every step (upstream waits forever; ``learner_timeout`` bounds it here), the others
from step ``skip_n_iter`` on, at most ``timeout`` seconds, then go on without one. Topic names
embed ``format()`` of the Role enum, which on Python >= 3.11 reads ``Role.COLLECTOR``: topics
with dots and capitals.

ModelExchanger: the learner sends ``model.state_dict()`` on ``model_exchanger`` after each
step; the others keep the latest one (latest wins) and load it before each step but the
first, waiting at most ``timeout`` seconds, returning early if the task is finishing.

Both are void (do nothing) outside parallel mode or on a node without a role.
"""

import dataclasses
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
        self._sent = {"env_step": 0, "env_episode": 0}  # a collector's counters, as last sent
        for role in Role:
            if not task.has_role(role):
                task.on(role_topic("context_exchanger", role), self.put)

    def put(self, payload):
        """A context from a node of another role: lists are gathered, a collector's counter
        increments summed (into ``increment_<name>``), anything else replaced."""
        with self._cond:
            for key, value in payload.items():
                if key in ("trajectories", "episodes", "trajectory_end_idx"):
                    if task.has_role(Role.LEARNER):
                        self._state.setdefault(key, []).extend(value)
                elif key in ("env_step", "env_episode"):
                    if not task.has_role(Role.COLLECTOR):
                        name = "increment_" + key
                        self._state[name] = self._state.get(name, 0) + value
                elif key == "train_iter":
                    if not task.has_role(Role.LEARNER):
                        self._state[key] = value
                else:
                    logging.warning("Receive unexpected key (%s) in context exchanger", key)
            self._received += 1
            self._cond.notify_all()

    def merge(self, ctx, timeout):
        """Waits (at most `timeout` s) for what arrived and sets it on `ctx` by attribute; an
        increment is added to the attribute of its name, which the context must have."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._received:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
            state, self._state, self._received = self._state, {}, 0
        for key, value in state.items():
            if key.startswith("increment_") and not task.has_role(Role.COLLECTOR):
                name = key[len("increment_"):]
                setattr(ctx, name, getattr(ctx, name) + value)
            else:
                setattr(ctx, key, value)
        return True

    def fetch(self, ctx):
        """What this node's role sends of `ctx`: its declared fields only (a value set on the
        context that is not one of its fields is not sent)."""
        out = {}
        for field in dataclasses.fields(ctx):
            key, value = field.name, getattr(ctx, field.name)
            if key in ("trajectories", "episodes", "trajectory_end_idx"):
                if task.has_role(Role.COLLECTOR) and value is not None:
                    out[key] = value
            elif key in ("env_step", "env_episode"):
                if task.has_role(Role.COLLECTOR):
                    out[key], self._sent[key] = value - self._sent[key], value
            elif key == "train_iter" and task.has_role(Role.LEARNER):
                out[key] = value
        return out

    def __call__(self, ctx):
        if task.has_role(Role.LEARNER):
            if not self.merge(ctx, self._learner_timeout):
                raise TimeoutError("learner: no context within %s s" % self._learner_timeout)
        elif ctx.total_step >= self._skip_n_iter:
            if not self.merge(ctx, self._timeout):
                logging.warning("Timeout when waiting for new context")
        yield
        payload = self.fetch(ctx)
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
