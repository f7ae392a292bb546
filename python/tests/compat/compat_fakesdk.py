"""A small stand-in for the rlbus SDK's Worker, Coordinator and task objects, for unit
tests of the compat layer that need no broker. They record what the layer asked for."""

import collections
import threading
import types

SubmitResult = collections.namedtuple("SubmitResult", "task_id accepted code reason queued")


class TaskFailure(Exception):
    def __init__(self, reason, result=None):
        Exception.__init__(self, reason)
        self.reason = reason
        self.result = result


class FakeCoordinator:
    instances = []

    def __init__(self, endpoint, id="coordinator", callbacks=None, **kwargs):
        self.endpoint, self.id, self.callbacks, self.kwargs = endpoint, id, callbacks, kwargs
        self.submits = []
        self.cancels = []
        self.closed = False
        self.state = "ready"
        self.accept = True
        FakeCoordinator.instances.append(self)

    def wait_for(self, state, timeout):
        return self.state == state

    def submit(self, task_id, kind, task_info=None, **kwargs):
        self.submits.append((task_id, kind, task_info, kwargs))
        return SubmitResult(task_id, self.accept, 0 if self.accept else 412,
                            "" if self.accept else "queue full", 0)

    def cancel(self, task_id, reason="cancelled"):
        self.cancels.append((task_id, reason))

    def close(self):
        self.closed = True


class FakeWorker:
    instances = []

    def __init__(self, endpoint, role=None, id=None, run=None, close=None, on_policy=None,
                 resources=None, **kwargs):
        self.endpoint, self.role, self.id = endpoint, role, id
        self.run, self.close_handler, self.resources, self.kwargs = run, close, resources, kwargs
        self.state = "ready"
        self.last_error = ""
        self.closed = False
        FakeWorker.instances.append(self)

    def wait_for(self, state, timeout):
        return self.state == state

    def close(self):
        self.closed = True
        self.state = "stopped"


class FakeTask:
    """The task object a Worker hands to run/close."""

    def __init__(self, task_id="t1", info=None, batches=()):
        self.id = task_id
        self.attempt = 1
        self.kind = None
        self.info = info if info is not None else {"task_id": task_id, "buffer_id": "buf"}
        self._stop = threading.Event()
        self._aborted = False
        self.data, self.infos, self.learn_infos, self.gets = [], [], [], []
        self.alive = 0
        self._batches = list(batches)
        self.on_info = None  # called with each info (a test can request the close there)

    @property
    def stop_requested(self):
        return self._stop.is_set()

    @property
    def aborted(self):
        return self._aborted

    def request_stop(self):
        self._stop.set()

    def abort(self):
        self._aborted = True
        self._stop.set()

    def wait_stop(self, timeout_s):
        return self._stop.wait(timeout_s)

    def emit_data(self, data_id, buffer_id, meta, payload=None):
        self.data.append((data_id, buffer_id, meta))
        return not self._aborted

    def emit_info(self, info):
        self.infos.append(info)
        if self.on_info:
            self.on_info(info)
        return not self._aborted

    def get_data(self, buffer_id, batch_size, cur_learner_iter, timeout=60.0):
        self.gets.append((buffer_id, batch_size, cur_learner_iter))
        if self._batches:
            return self._batches.pop(0)
        self._stop.wait(min(timeout, 0.05))
        return None

    def emit_learn_info(self, buffer_id, info):
        self.learn_infos.append((buffer_id, info))
        if self.on_info:
            self.on_info(info)
        return not self._aborted

    def keep_alive(self):
        self.alive += 1
        return True


def module():
    FakeCoordinator.instances.clear()
    FakeWorker.instances.clear()
    return types.SimpleNamespace(Coordinator=FakeCoordinator, Worker=FakeWorker,
                                 TaskFailure=TaskFailure, SubmitResult=SubmitResult)
