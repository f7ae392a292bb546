"""Slave: DI-engine's ding.interaction.Slave surface, run as an rlbus worker.

In DI-engine's HTTP mode a worker is a `Slave` subclass whose `_process_task(task)` answers
one request at a time, named by task['name']: `resource`, `<role>_start_task`, repeated
`collector_data_task` (or `learner_get_data_task` + `learner_learn_task`) and
`<role>_close_task`. The master drove that lock-step from the coordinator. Here the rlbus
Worker receives the task and this class drives the same calls, in the same order, on the
worker's side:

    HELLO            <- _process_task({'name': 'resource'}) (numbers announced)
    TASK_START       -> _process_task({'name': '<role>_start_task', 'task_info': {...}})
    collector        -> _process_task({'name': 'collector_data_task'}) until closed;
                        a result with 'data_id' becomes DATA, anything else INFO
    learner          -> get_data_task, GET_DATA (waits for the batch), learn_task(data),
                        LEARN_INFO with the learn result's 'info'
    TASK_CLOSE       -> _process_task({'name': '<role>_close_task'}) -> RESULT

After an info that says it is done (`collector_done` / `learner_done`) no further step is
pulled until the coordinator's close arrives (or `done_wait_s` passes): that is where the
HTTP master stopped asking. Steps run one at a time on one helper thread, as the HTTP master
sent them: the worker goes on seeing closes and aborts while a step blocks (a data pull with
no data), a long step keeps its attempt alive (TASK_ALIVE) instead of running into the step
timeout, and a close waits for the running step to return (at most close_wait_s) rather than
run beside it. A step that runs past step_limit_s fails its attempt naming the step; so does
any later step that would have to wait behind it, until it returns.

An existing subclass becomes an rlbus worker unchanged: patch_dingengine() installs this
class as DI-engine's Slave before the comm classes are imported.
"""

import collections
import logging
import os
import queue
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Tuple, Type, TypeVar, cast

from .._util import (WORKER_ID_ENV, clean_id, coerce_resources, curve_kwargs, plain,
                    resolve_endpoint, sdk)
from .exceptions import is_named, is_task_fail

_ABANDONED = object()
_MAX_REASON = 1024

_SlaveT = TypeVar("_SlaveT", bound="Slave")


def _reason(text: object) -> str:
    data = str(text).encode("utf-8")[:_MAX_REASON]
    return data.decode("utf-8", "ignore")


class StepFailed(Exception):
    """A step raised TaskFail / TaskRefuse: `reason` and `result` for TASK_FAILED."""

    def __init__(self, reason: str, result: Dict[str, Any]) -> None:
        Exception.__init__(self, reason)
        self.reason = reason
        self.result = result


class _Pending:
    __slots__ = ("step", "task_id", "attempt", "done", "value", "error", "began", "cancelled",
                 "at_stop")

    def __init__(self, step: Dict[str, Any], task_id: Any, attempt: Any = None,
                 at_stop: bool = False) -> None:
        self.step = step
        self.task_id = task_id
        self.attempt = attempt
        self.began = self.cancelled = False
        self.at_stop = at_stop  # runs even once the runner is stopping
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


def _kind(step: Dict[str, Any]) -> str:
    """'start', 'close' or '' for a step dict (by its DI-engine name)."""
    name = str(step.get("name", ""))
    return "start" if name.endswith("_start_task") else "close" if name.endswith(
        "_close_task") else ""


_CLOSED_KEPT = 1024  # task ids whose close step the runner remembers


class _StepRunner:
    """One thread that runs steps one after another, as the HTTP slave's task thread did: a
    step never starts before the one ahead of it returned. A start step never begins once its
    task's close step was submitted (it would build what nothing closes any more), and once
    the runner is stopping no step begins but the close of a start step that was running."""

    def __init__(self, call: Callable[[Dict[str, Any]], Any], name: str) -> None:
        self._call = call
        self._queue: queue.Queue[Optional[_Pending]] = queue.Queue()
        self._lock = threading.Lock()
        # (pending, monotonic start) of the step in user code now
        self._running: Optional[Tuple[_Pending, float]] = None
        # (task id, attempt) whose close was submitted
        self._closed: collections.OrderedDict[Tuple[Any, Any], bool] = collections.OrderedDict()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, step: Dict[str, Any], task_id: Any, attempt: Any = None) -> _Pending:
        pending = _Pending(step, task_id, attempt)
        if _kind(step) == "close":
            with self._lock:
                self._closed[(task_id, attempt)] = True
                while len(self._closed) > _CLOSED_KEPT:
                    self._closed.popitem(last=False)
        self._queue.put(pending)
        return pending

    def running(self) -> Optional[Tuple[_Pending, float]]:
        """The step in user code now and since when (monotonic), or None."""
        with self._lock:
            return self._running

    def cancel(self, pending: _Pending) -> bool:
        """Takes back a step that has not begun (it will not run); False if it has."""
        with self._lock:
            if not pending.began:
                pending.cancelled = True
            return pending.cancelled

    def stop(self, role: Optional[str] = None) -> None:
        """No step begins from now on; with `role`, a start step running now is followed by
        its task's close step, so that what it builds is closed."""
        with self._lock:
            self._stopping = True
            running = self._running
            ahead = running[0] if running is not None else None
            late = ahead is not None and role is not None and _kind(ahead.step) == "start" \
                and (ahead.task_id, ahead.attempt) not in self._closed
        if late:
            assert ahead is not None and role is not None  # what `late` says
            self._queue.put(_Pending({"name": role + "_close_task"}, ahead.task_id,
                                     ahead.attempt, at_stop=True))
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            with self._lock:
                if pending.cancelled or (self._stopping and not pending.at_stop) or (
                        _kind(pending.step) == "start"
                        and (pending.task_id, pending.attempt) in self._closed):
                    pending.cancelled = True
                    pending.done.set()
                    continue
                pending.began = True
                self._running = (pending, time.monotonic())
            try:
                pending.value = self._call(pending.step)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                pending.error = exc
            with self._lock:
                self._running = None
            pending.done.set()


class Slave:
    """Drop-in for ding.interaction.Slave over an rlbus Worker.

    DI-engine's arguments keep their meaning where one exists: host and port name the
    worker (id "host:port" unless `worker_id` or $RLBUS_WORKER_ID says otherwise) and
    heartbeat_span is the heartbeat interval; request_retries, request_retry_waiting and
    channel have no rlbus counterpart and are kept only for the constructor's shape.
    Extra keyword arguments: endpoint (else $RLBUS_ENDPOINT, else tcp://127.0.0.1:7235),
    worker_id, role ('collector' / 'learner'; else the class attribute rlbus_role, else
    guessed from the class names) and ready_timeout (seconds start() waits for the broker).
    """

    rlbus_role: Optional[str] = None
    #: seconds to wait for the coordinator's close after an info that says "done".
    done_wait_s = 10.0
    #: while a step runs longer than this, TASK_ALIVE keeps its attempt from timing out.
    keep_alive_s = 5.0
    #: seconds one GET_DATA waits before the request is made again.
    get_data_timeout_s = 30.0
    #: consecutive failed data steps after which the attempt fails.
    max_step_failures = 10
    #: seconds a step may run (or wait behind one that runs) before its attempt fails with a
    #: reason naming the step; the step itself goes on in user code, where nothing can stop it.
    step_limit_s = 300.0
    #: seconds a close (or an abort) waits for the running step to return before the close
    #: is given up and the step reported stuck; the close then runs once the step returns.
    close_wait_s = 60.0

    def __init__(self, host: Optional[str] = None, port: Optional[int] = None,
                 heartbeat_span: Optional[float] = None, request_retries: Optional[int] = None,
                 request_retry_waiting: Optional[float] = None, channel: Optional[int] = None,
                 *, endpoint: Optional[str] = None, worker_id: Optional[str] = None,
                 role: Optional[str] = None, ready_timeout: float = 10.0) -> None:
        self._rlbus_host = host or "0.0.0.0"
        self._rlbus_port = port if port is not None else 7236
        span = 3.0 if heartbeat_span is None else max(float(heartbeat_span), 0.2)
        self._rlbus_heartbeat = span  # seconds
        self._rlbus_request_retries = request_retries
        self._rlbus_request_retry_waiting = request_retry_waiting
        self._rlbus_channel = channel
        self._rlbus_endpoint = resolve_endpoint(explicit=endpoint)
        wid = worker_id or os.environ.get(WORKER_ID_ENV) or "{}:{}".format(
            self._rlbus_host, self._rlbus_port)
        self._rlbus_id = clean_id(wid)
        # a str once checked just below
        self._rlbus_role = cast(str, role or self.rlbus_role or _guess_role(type(self)))
        if self._rlbus_role not in ("collector", "learner"):
            raise ValueError("Slave role must be 'collector' or 'learner' (got {!r}); pass role= "
                             "or set the class attribute rlbus_role".format(self._rlbus_role))
        self._rlbus_ready_timeout = float(ready_timeout)
        self._rlbus_log = logging.getLogger("rlbus.compat.legacy.slave")
        self._rlbus_worker: Any = None  # the SDK's Worker
        self._rlbus_raw_resources: Dict[str, Any] = {}
        self._rlbus_resources: Dict[str, float] = {}
        self._rlbus_stop = threading.Event()
        self._rlbus_keeper: Optional[threading.Thread] = None
        self._rlbus_was_ready = False
        self._rlbus_runner: Optional[_StepRunner] = None
        self._rlbus_runner_lock = threading.Lock()

    # ----------------------------------------------------------------- public surface

    @property
    def worker_id(self) -> str:
        return self._rlbus_id

    @property
    def role(self) -> str:
        return self._rlbus_role

    @property
    def resources(self) -> Dict[str, float]:
        """The resources announced to the broker (numbers only)."""
        return dict(self._rlbus_resources)

    @property
    def worker(self) -> Any:
        """The rlbus.Worker underneath (None before start())."""
        return self._rlbus_worker

    def start(self) -> None:
        """Asks the subclass for its resources, connects to the broker and returns once
        the broker welcomed this worker (or after ready_timeout, the worker then keeps
        trying on its own). A thread that is not a daemon keeps the process alive until
        shutdown(), as the HTTP server did. Raises ConnectionRefuse from
        _before_connection, and ConnectionError when the broker refuses the worker."""
        if self._rlbus_worker is not None:
            return
        self._rlbus_stop.clear()
        self._before_connection({"endpoint": self._rlbus_endpoint, "worker_id": self._rlbus_id,
                                 "role": self._rlbus_role})
        try:
            raw = self._rlbus_call({"name": "resource"})
        except StepFailed as exc:
            self._rlbus_log.warning("slave %s: resource task failed (%s): no resources announced",
                                    self._rlbus_id, exc.reason)
            raw = {}
        self._rlbus_raw_resources = plain(raw) if isinstance(raw, dict) else {}
        self._rlbus_resources = coerce_resources(raw, self._rlbus_log)
        self._rlbus_worker = sdk().Worker(
            self._rlbus_endpoint, role=self._rlbus_role, id=self._rlbus_id,
            run=self._rlbus_run, close=self._rlbus_close, resources=self._rlbus_resources,
            heartbeat=self._rlbus_heartbeat, **curve_kwargs())
        self._rlbus_keeper = threading.Thread(target=self._rlbus_watch,
                                              name="rlbus-compat-slave-" + self._rlbus_id)
        self._rlbus_keeper.start()
        deadline = time.monotonic() + self._rlbus_ready_timeout
        worker = self._rlbus_worker
        while time.monotonic() < deadline:
            if worker.wait_for("ready", 0.2):
                self._rlbus_was_ready = True
                self._rlbus_log.info("slave %s joined rlbus broker %s as %s", self._rlbus_id,
                                     self._rlbus_endpoint, self._rlbus_role)
                return
            if worker.state == "refused":
                err = worker.last_error
                self.shutdown()
                raise ConnectionError("broker refused worker {}: {}".format(self._rlbus_id, err))
        self._rlbus_log.warning("slave %s: broker %s not reached yet, still trying",
                                self._rlbus_id, self._rlbus_endpoint)

    def shutdown(self) -> None:
        """Leaves the broker (DISCONNECT) and stops this object's threads. Idempotent."""
        if self._rlbus_worker is None and (self._rlbus_keeper is None
                                           or self._rlbus_stop.is_set()):
            return
        try:
            self._before_disconnection({"endpoint": self._rlbus_endpoint,
                                        "worker_id": self._rlbus_id})
        except Exception as exc:  # noqa: BLE001 - a local shutdown is not refusable
            self._rlbus_log.warning("slave %s: _before_disconnection raised %r; shutting down "
                                    "anyway", self._rlbus_id, exc)
        self._rlbus_stop.set()
        worker, self._rlbus_worker = self._rlbus_worker, None
        if worker is not None:
            worker.close()
        with self._rlbus_runner_lock:
            runner, self._rlbus_runner = self._rlbus_runner, None
        if runner is not None:
            # after the step it runs, if any (its thread does not hold the process); a start
            # step running now gets its close after it
            runner.stop(self._rlbus_role)
        keeper = self._rlbus_keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join()

    def join(self) -> None:
        """Waits until shutdown() ran (from any thread)."""
        keeper = self._rlbus_keeper
        if keeper is not None:
            keeper.join()

    def close(self) -> None:
        """shutdown() and join(), as DI-engine's controllable services do."""
        self.shutdown()
        self.join()

    def __enter__(self: _SlaveT) -> _SlaveT:
        self.start()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc_value: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        self.close()

    def ping(self) -> bool:
        worker = self._rlbus_worker
        return worker is not None and worker.state == "ready"

    # ----------------------------------------------------------------- hooks (override)

    def _before_connection(self, data: Dict[str, Any]) -> None:
        """Raise ConnectionRefuse to keep this slave off the broker."""

    def _before_disconnection(self, data: Dict[str, Any]) -> None:
        """Called by shutdown(); a DisconnectionRefuse is logged and ignored."""

    def _before_task(self, data: Dict[str, Any]) -> None:
        """Called before every step; raise TaskRefuse to refuse it (the attempt fails)."""

    def _lost_connection(self, master_address: str, err: BaseException) -> None:
        """Called when the broker connection is lost (the worker reconnects by itself)."""

    def _process_task(self, task: Dict[str, Any]) -> Any:
        raise NotImplementedError

    def _step_stuck(self, name: Any, task_id: Any, seconds: float) -> None:
        """Called when a step has run past close_wait_s after its task was closed or
        aborted, or past step_limit_s: the process may want to restart. Logs an error."""
        self._rlbus_log.error("slave %s: step %s of task %s has been running for %.0f s and "
                              "has not returned", self._rlbus_id, name, task_id, seconds)

    # ----------------------------------------------------------------- driving steps

    def _rlbus_call(self, step: Dict[str, Any]) -> Any:
        """One step through the hooks: the result dict, or StepFailed."""
        try:
            self._before_task(step)
        except Exception as exc:
            if is_named(exc, "TaskRefuse"):
                raise StepFailed(_reason("{} refused: {}".format(step.get("name"),
                                                                 getattr(exc, "message", exc))),
                                 plain(getattr(exc, "data", None) or {})) from exc
            raise
        try:
            return self._process_task(step)
        except Exception as exc:
            if is_task_fail(exc):
                result = plain(getattr(exc, "result", None))
                if result is None:
                    result = {}
                elif not isinstance(result, dict):
                    result = {"result": result}
                message = getattr(exc, "message", None) or str(exc) or "task failed"
                raise StepFailed(_reason("{} failed: {}".format(step.get("name"), message)),
                                 result) from exc
            raise

    def _rlbus_steps(self) -> _StepRunner:
        with self._rlbus_runner_lock:
            if self._rlbus_runner is None:
                self._rlbus_runner = _StepRunner(self._rlbus_call,
                                                 "rlbus-compat-step-" + self._rlbus_id)
            return self._rlbus_runner

    def _rlbus_stuck(self, steps: _StepRunner, pending: _Pending, waited_since: float) -> str:
        """Why `pending` has not returned: it runs for so long, or it waits behind a step
        that does. Tells _step_stuck."""
        now = time.monotonic()
        running = steps.running()
        if running is not None and running[0] is not pending:
            ahead, since = running
            name = ahead.step.get("name")
            self._step_stuck(name, ahead.task_id, now - since)
            return "{} not run: waiting behind {} of task {}, running for {:.0f} s".format(
                pending.step.get("name"), name, ahead.task_id, now - since)
        name = pending.step.get("name")
        since = running[1] if running is not None else waited_since
        self._step_stuck(name, pending.task_id, now - since)
        return "{} still running after {:.0f} s".format(name, now - since)

    def _rlbus_step(self, task: Any, step: Dict[str, Any]) -> Any:
        """Runs `step` on the step thread and waits for it, keeping the attempt alive. When
        the task is closed or aborted meanwhile, waits for the step to return (at most
        close_wait_s) and drops its result (returns _ABANDONED): the close step never runs
        beside it. Past step_limit_s the attempt fails naming the step."""
        steps = self._rlbus_steps()
        pending = steps.submit(step, task.id, getattr(task, "attempt", None))
        submitted = last_alive = time.monotonic()
        stopping_since: Optional[float] = None
        while not pending.done.wait(0.05):
            now = time.monotonic()
            if self._rlbus_stop.is_set():
                # The slave shuts down: no close step follows, nothing waits for this one.
                steps.cancel(pending)
                return _ABANDONED
            if stopping_since is None and (task.stop_requested or task.aborted):
                stopping_since = now
                self._rlbus_log.info("slave %s: task %s stopping: waiting for %s to return",
                                     self._rlbus_id, task.id, step.get("name"))
            if stopping_since is not None:
                if steps.cancel(pending):
                    return _ABANDONED  # still waiting behind another step: it never runs
                if now - stopping_since >= self.close_wait_s:
                    self._rlbus_log.error("slave %s: %s", self._rlbus_id,
                                          self._rlbus_stuck(steps, pending, submitted))
                    return _ABANDONED
                continue
            if now - submitted >= self.step_limit_s:
                reason = self._rlbus_stuck(steps, pending, submitted)
                steps.cancel(pending)  # if it has not begun, it never will
                raise self._rlbus_failure(reason, {})
            if now - last_alive >= self.keep_alive_s:
                last_alive = now
                keep_alive = getattr(task, "keep_alive", None)
                if keep_alive is not None:
                    keep_alive()
        if pending.cancelled:  # its task was closed, or the slave stops, before it began
            return _ABANDONED
        if stopping_since is not None:
            self._rlbus_log.info("slave %s: %s of task %s returned after its stop; its result "
                                 "is dropped", self._rlbus_id, step.get("name"), task.id)
            return _ABANDONED
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _rlbus_failure(self, reason: str, result: Any) -> Exception:
        failure = getattr(sdk(), "TaskFailure", None)
        if failure is None:
            return RuntimeError(reason)
        return cast(Exception, failure(_reason(reason), result))

    def _rlbus_task_info(self, task: Any) -> Dict[str, Any]:
        info = dict(task.info) if isinstance(task.info, dict) else {}
        info.setdefault("%s_id" % self._rlbus_role, self._rlbus_id)
        info.setdefault("resource_info", dict(self._rlbus_raw_resources))
        return info

    def _rlbus_run(self, task: Any) -> None:
        """The Worker's run handler: start step, then the role's loop."""
        info = self._rlbus_task_info(task)
        try:
            try:
                started = self._rlbus_step(task, {"name": self._rlbus_role + "_start_task",
                                                  "task_info": info})
            except StepFailed as exc:
                raise self._rlbus_failure(exc.reason, exc.result) from exc
            if started is _ABANDONED:
                return
            if self._rlbus_role == "collector":
                self._rlbus_collect(task, info)
            else:
                self._rlbus_learn(task, info)
        finally:
            if task.aborted:
                self._rlbus_close_after_abort(task)

    def _rlbus_pull(self, task: Any, step: Dict[str, Any], failures: int) -> Tuple[Any, int]:
        """A data step; failed ones are logged and retried with a growing pause, and only
        a run of max_step_failures fails the attempt. Returns (result, failures)."""
        try:
            result = self._rlbus_step(task, step)
        except StepFailed as exc:
            failures += 1
            self._rlbus_log.error("slave %s: %s", self._rlbus_id, exc.reason)
            if failures >= self.max_step_failures:
                raise self._rlbus_failure("%d %s steps failed in a row; last: %s"
                                          % (failures, step["name"], exc.reason),
                                          exc.result) from exc
            task.wait_stop(min(0.01 * 2 ** failures, 1.0))
            return None, failures
        return result, 0

    def _rlbus_wait_close(self, task: Any, what: str) -> None:
        if not task.wait_stop(self.done_wait_s):
            self._rlbus_log.info("slave %s: task %s said %s but was not closed within %g s; "
                                 "going on", self._rlbus_id, task.id, what, self.done_wait_s)

    def _rlbus_collect(self, task: Any, info: Dict[str, Any]) -> None:
        buffer_id = info.get("buffer_id")
        failures = 0
        while not task.stop_requested:
            result, failures = self._rlbus_pull(task, {"name": "collector_data_task"}, failures)
            if result is _ABANDONED:
                return
            if result is None:
                continue
            result = plain(result) if isinstance(result, dict) else {"value": plain(result)}
            if "data_id" in result:
                ok = task.emit_data(str(result["data_id"]),
                                    str(result.get("buffer_id") or buffer_id or ""), result)
                if not ok:
                    return
            else:
                if not task.emit_info(result):
                    return
                if result.get("collector_done"):
                    self._rlbus_wait_close(task, "collector_done")

    def _rlbus_learn(self, task: Any, info: Dict[str, Any]) -> None:
        failures = 0
        while not task.stop_requested:
            req, failures = self._rlbus_pull(task, {"name": "learner_get_data_task"}, failures)
            if req is _ABANDONED:
                return
            if not isinstance(req, dict):
                continue
            buffer_id = req.get("buffer_id", info.get("buffer_id"))
            batch = None
            while batch is None and not task.stop_requested:
                batch = task.get_data(str(buffer_id or ""), int(req.get("batch_size", 0)),
                                      int(req.get("cur_learner_iter", 0)),
                                      timeout=self.get_data_timeout_s)
            if batch is None:
                return
            res, failures = self._rlbus_pull(task, {"name": "learner_learn_task", "data": batch},
                                             failures)
            if res is _ABANDONED:
                return
            if not isinstance(res, dict):
                continue
            learn_info = plain(res.get("info"))
            if not isinstance(learn_info, dict):
                learn_info = {"info": learn_info}
            if not task.emit_learn_info(str(res.get("buffer_id", buffer_id) or ""), learn_info):
                return
            if learn_info.get("learner_done"):
                self._rlbus_wait_close(task, "learner_done")

    def _rlbus_close_step(self, task: Any) -> Dict[str, Any]:
        """The close step, on the step thread behind any step still running there: if that
        step does not return within close_wait_s the close fails its attempt naming it, and
        runs once it returns (so what the start step built is still closed)."""
        info = task.info if isinstance(task.info, dict) else {}
        started = time.monotonic()
        steps = self._rlbus_steps()
        pending = steps.submit({"name": self._rlbus_role + "_close_task"}, task.id,
                               getattr(task, "attempt", None))
        if not pending.done.wait(self.close_wait_s):
            raise StepFailed(self._rlbus_stuck(steps, pending, started), {})
        if pending.error is not None:
            raise pending.error
        result = pending.value
        result = plain(result) if isinstance(result, dict) else {}
        result.setdefault("task_id", info.get("task_id", task.id))
        if info.get("buffer_id") is not None:
            result.setdefault("buffer_id", info.get("buffer_id"))
        return cast(Dict[str, Any], result)  # plain() of a dict is a dict

    def _rlbus_close(self, task: Any) -> Dict[str, Any]:
        """The Worker's close handler: the close step's result is the task's RESULT; a
        TaskFail there fails the attempt with its result dict."""
        try:
            return self._rlbus_close_step(task)
        except StepFailed as exc:
            raise self._rlbus_failure(exc.reason, exc.result) from exc

    def _rlbus_close_after_abort(self, task: Any) -> None:
        # The coordinator went away or the attempt timed out: the HTTP master sent a close
        # task in that case too, so the subclass can stop what it started. Nobody waits for
        # the result.
        try:
            self._rlbus_close_step(task)
        except Exception as exc:  # noqa: BLE001 - logged, the attempt is over anyway
            self._rlbus_log.info("slave %s: close after abort of %s: %r", self._rlbus_id,
                                 task.id, exc)

    def _rlbus_watch(self) -> None:
        """Keeps the process alive until shutdown() and reports lost connections."""
        while not self._rlbus_stop.wait(0.2):
            worker = self._rlbus_worker
            if worker is None:
                continue
            state = worker.state
            if state == "ready":
                self._rlbus_was_ready = True
            elif self._rlbus_was_ready and state in ("reconnecting", "connecting", "refused"):
                self._rlbus_was_ready = False
                try:
                    self._lost_connection(self._rlbus_endpoint,
                                          ConnectionError(worker.last_error or state))
                except Exception as exc:  # noqa: BLE001
                    self._rlbus_log.warning("slave %s: _lost_connection raised %r",
                                            self._rlbus_id, exc)


def _guess_role(cls: type) -> Optional[str]:
    names = [c.__name__.lower() for c in cls.__mro__]
    collector = any("collector" in n for n in names)
    learner = any("learner" in n for n in names)
    if collector != learner:
        return "collector" if collector else "learner"
    return None
