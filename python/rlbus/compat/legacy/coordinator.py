"""CommCoordinator: DI-engine's coordinator comm layer, run over an rlbus broker.

DI-engine's `Coordinator` builds a `CommCoordinator(cfg, callback_fn, logger)` and uses five
members: the constructor, start(), close(), send_collector_task(task) and
send_learner_task(task). The HTTP original dialled every worker and ran one thread per task
that pulled data step by step; here the broker does that work. A task dict becomes one
SUBMIT, and the broker's task events come back through the rlbus SDK's single callback
thread, where they are turned into the nine `callback_fn` calls with DI-engine's arguments.

Config (the `system.coordinator` section; extra keys pass through DI-engine unchanged):
    broker                 ROUTER endpoint of the broker (else $RLBUS_ENDPOINT, else
                           tcp://127.0.0.1:7235); `rlbus.endpoint` works too
    rlbus.id               this coordinator's peer id, else $RLBUS_COORDINATOR_ID, else one of
                           this run's own ("coordinator-<pid>-<random>-<host>"). A stable id
                           is what lets a restarted coordinator adopt its tasks within the
                           broker's grace period; a run-unique one keeps a new run from
                           adopting the tasks of a run that died
    rlbus.start_timeout    seconds, per task attempt (default 120)
    rlbus.step_timeout     seconds without progress (default: the broker's)
    rlbus.close_timeout    seconds for the worker's close (default 120)
    rlbus.task_timeout     seconds for a whole attempt (default 86400)
    rlbus.queue_timeout    seconds a task may wait for a worker (default: the
                           collector_task_timeout / learner_task_timeout of the config)
    rlbus.max_attempts     attempts per task (default 1: the HTTP mode never retried)
    rlbus.ready_timeout    seconds start() waits for the broker (default 30)
    rlbus.operator_timeout seconds operator mode waits for its workers (default 120)
"""

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from .._util import (COORDINATOR_ID_ENV, cfg_get, clean_id, curve_kwargs, plain,
                    resolve_endpoint, sdk, seconds_to_ms, valid_id)
from .operator import OperatorClient, pod_name


def _run_id() -> str:
    """A coordinator id of this run alone: its process, a random part and the host."""
    return "coordinator-{}-{}-{}".format(os.getpid(), uuid.uuid4().hex[:8], socket.gethostname())


class _Task:
    """What this coordinator remembers of one submitted task."""

    __slots__ = ("task_id", "wire_id", "kind", "buffer_id")

    def __init__(self, task_id: Any, wire_id: str, kind: str, buffer_id: Any) -> None:
        self.task_id = task_id
        self.wire_id = wire_id
        self.kind = kind
        self.buffer_id = buffer_id


class CommCoordinator:
    """Drop-in for ding.worker.coordinator.comm_coordinator.CommCoordinator."""

    def __init__(self, cfg: Any, callback_fn: Optional[Mapping[str, Callable[..., Any]]],
                 logger: Optional[logging.Logger] = None) -> None:
        self._cfg = cfg
        self._callback_fn = dict(callback_fn or {})
        self._logger = logger or logging.getLogger("rlbus.compat")
        rl = cfg_get(cfg, "rlbus") or {}
        self._endpoint = resolve_endpoint(cfg)
        self._id = clean_id(cfg_get(rl, "id") or os.environ.get(COORDINATOR_ID_ENV)
                            or _run_id(), "coordinator")
        self._start_timeout_ms = seconds_to_ms(cfg_get(rl, "start_timeout", default=120))
        self._step_timeout_ms = seconds_to_ms(cfg_get(rl, "step_timeout"))
        self._close_timeout_ms = seconds_to_ms(cfg_get(rl, "close_timeout", default=120))
        self._task_timeout_ms = seconds_to_ms(cfg_get(rl, "task_timeout", default=86400))
        self._max_attempts = int(cfg_get(rl, "max_attempts", default=1))
        queue = cfg_get(rl, "queue_timeout")
        self._queue_timeout_ms = {
            "collector": seconds_to_ms(queue if queue is not None
                                       else cfg_get(cfg, "collector_task_timeout")),
            "learner": seconds_to_ms(queue if queue is not None
                                     else cfg_get(cfg, "learner_task_timeout")),
        }
        self._ready_timeout = float(cfg_get(rl, "ready_timeout", default=30))
        self._operator_timeout = float(cfg_get(rl, "operator_timeout", default=120))
        self._submit_timeout = float(cfg_get(rl, "submit_timeout", default=10))
        operator_cfg = cfg_get(cfg, "operator_server")
        self._operator_cfg = operator_cfg if operator_cfg else None
        # No network I/O here. The operator client only parses its address.
        self._operator = OperatorClient(self._operator_cfg, self._logger) if self._operator_cfg \
            else None

        self._lock = threading.Lock()
        self._capacity = threading.Condition(self._lock)
        self._counts: Dict[str, int] = {"collector": 0, "learner": 0}
        self._tasks: Dict[str, _Task] = {}  # wire id -> _Task
        self._client: Any = None  # the SDK's Coordinator
        self._closed = True  # like DI-engine: close() before start() does nothing
        self._dispatch = False  # callbacks reach callback_fn only while this is set
        self._stop_sync = threading.Event()
        self._sync_thread: Optional[threading.Thread] = None
        self._replicas: Dict[str, List[str]] = {"collectors": [], "learners": []}
        self._lost_replicas: Dict[str, Set[str]] = {"collectors": set(), "learners": set()}

    # ----------------------------------------------------------------- lifecycle

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def start(self) -> None:
        """Connects to the broker (raises ConnectionError if it is not there within
        rlbus.ready_timeout). In operator mode also asks the operator for the replicas and
        waits until both worker targets are met (TimeoutError otherwise)."""
        with self._lock:
            if not self._closed:
                return
            self._closed = False
            self._dispatch = True
        self._stop_sync.clear()
        rlbus = sdk()
        try:
            self._client = rlbus.Coordinator(self._endpoint, id=self._id,
                                             callbacks=self._sdk_callbacks(), **curve_kwargs())
            if not _wait_ready(self._client, self._ready_timeout):
                raise ConnectionError("rlbus broker at {} did not welcome coordinator {!r} "
                                      "within {:g} s (state {}, last error {!r})".format(
                                          self._endpoint, self._id, self._ready_timeout,
                                          getattr(self._client, "state", "?"),
                                          getattr(self._client, "last_error", "")))
            self._logger.info("coordinator %s connected to rlbus broker %s", self._id,
                              self._endpoint)
            if self._operator is not None:
                self._start_operator_mode()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Cancels the tasks still open (their workers get TASK_ABORT and run their own
        close step), disconnects and stops every thread this object started. Idempotent;
        no callback_fn entry runs after it returns."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._dispatch = False
            open_tasks = list(self._tasks.values())
            self._tasks.clear()
            self._capacity.notify_all()
        self._stop_sync.set()
        if self._sync_thread is not None and self._sync_thread is not threading.current_thread():
            self._sync_thread.join()
        self._sync_thread = None
        client, self._client = self._client, None
        if client is None:
            return
        for rec in open_tasks:
            try:
                client.cancel(rec.wire_id, "coordinator closing")
            except Exception as exc:  # noqa: BLE001 - closing goes on whatever
                self._logger.warning("cancel of task %s failed: %r", rec.task_id, exc)
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001
            self._logger.warning("rlbus coordinator close failed: %r", exc)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # ----------------------------------------------------------------- tasks

    def send_collector_task(self, collector_task: Any) -> bool:
        return self._send(collector_task, "collector")

    def send_learner_task(self, learner_task: Any) -> bool:
        return self._send(learner_task, "learner")

    def _send(self, task: Any, kind: str) -> bool:
        """Submits `task` (its task_info is copied before this returns, since DI-engine
        changes the dict right after). True when the broker accepted it; the task then
        waits for a free worker of its kind (at most the queue timeout)."""
        task_id = task.get("task_id") if isinstance(task, dict) else None
        client = self._client
        if self._closed or client is None:
            self._logger.error("%s task %s not sent: the coordinator is not started", kind, task_id)
            return False
        if not task_id:
            self._logger.error("%s task without task_id not sent", kind)
            return False
        info = plain(task)
        wire_id = self._wire_id(str(task_id))
        rec = _Task(task_id, wire_id, kind, task.get("buffer_id"))
        with self._lock:
            if wire_id in self._tasks:
                self._logger.error("%s task %s is already running", kind, task_id)
                return False
            self._tasks[wire_id] = rec
        kwargs = {
            "start_timeout_ms": self._start_timeout_ms,
            "step_timeout_ms": self._step_timeout_ms,
            "close_timeout_ms": self._close_timeout_ms,
            "task_timeout_ms": self._task_timeout_ms,
            "max_attempts": self._max_attempts,
            "queue_timeout_ms": self._queue_timeout_ms[kind],
        }
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        try:
            res = client.submit(wire_id, kind, info, timeout=self._submit_timeout, **kwargs)
        except Exception as exc:  # noqa: BLE001 - DI-engine expects a bool
            res = None
            self._logger.error("%s task %s: submit failed: %r", kind, task_id, exc)
        if res is None or not getattr(res, "accepted", False):
            with self._lock:
                self._tasks.pop(wire_id, None)
            self._logger.error("%s task %s not accepted by the broker: %s", kind, task_id,
                               "no answer" if res is None else "{} {}".format(res.code, res.reason))
            return False
        self._logger.info("%s task %s submitted (%d queued ahead)", kind, task_id,
                          getattr(res, "queued", 0) or 0)
        return True

    def _wire_id(self, task_id: str) -> str:
        if valid_id(task_id):
            return task_id
        # A custom commander's id that breaks the wire's id rule: a stable cleaned form.
        wire = clean_id(task_id)
        if len(wire) > 120:
            wire = wire[:120]
        suffix = "~%06x" % (hash(task_id) & 0xFFFFFF)
        return wire[:128 - len(suffix)] + suffix

    def _record(self, wire_id: str) -> Optional[_Task]:
        with self._lock:
            return self._tasks.get(wire_id)

    def _forget(self, wire_id: str) -> Optional[_Task]:
        with self._lock:
            return self._tasks.pop(wire_id, None)

    # ----------------------------------------------------------------- callbacks

    def _sdk_callbacks(self) -> Dict[str, Callable[..., Any]]:
        cbs: Dict[str, Callable[..., Any]] = {
            "deal_with_collector_send_data": self._on_collector_data,
            "deal_with_collector_judge_finish": self._on_collector_judge,
            "deal_with_collector_finish_task": self._on_collector_finish,
            "deal_with_learner_get_data": self._on_learner_get_data,
            "deal_with_learner_judge_finish": self._on_learner_judge,
            "deal_with_learner_send_info": self._on_learner_info,
            "deal_with_learner_finish_task": self._on_learner_finish,
            "on_task_requeued": self._on_requeued,
            "on_task_failed": self._on_failed,
            "on_task_cancelled": self._on_cancelled,
            "on_capacity": self._on_capacity,
            "on_stream_lost": self._on_stream_lost,
            "on_data_lost": self._on_data_lost,
        }
        if self._operator is not None:
            # DI-engine calls these only in operator mode, once per collector that joins or
            # leaves; a static setup keeps its configured collector_task_space.
            cbs["deal_with_increase_collector"] = self._on_increase
            cbs["deal_with_decrease_collector"] = self._on_decrease
        return cbs

    def _fn(self, key: str) -> Optional[Callable[..., Any]]:
        return self._callback_fn.get(key) if self._dispatch else None

    def _ident(self, wire_id: str) -> Tuple[Any, Optional[_Task]]:
        rec = self._record(wire_id)
        return (rec.task_id if rec else wire_id), rec

    def _on_collector_data(self, task_id: str, buffer_id: Any, data_id: Any, data: Any) -> None:
        fn = self._fn("deal_with_collector_send_data")
        if fn is None:
            return
        orig, rec = self._ident(task_id)
        meta = data.get("meta") if isinstance(data, dict) else None
        meta = dict(meta) if isinstance(meta, dict) else {}
        # DI-engine pushes this dict into its replay buffer as it is; learners get it back.
        meta.setdefault("data_id", data_id)
        meta.setdefault("buffer_id", buffer_id or (rec.buffer_id if rec else None))
        meta.setdefault("task_id", orig)
        fn(orig, meta.get("buffer_id"), data_id, meta)

    def _on_collector_judge(self, task_id: str, info: Any) -> bool:
        if not self._dispatch:
            return False
        orig, rec = self._ident(task_id)
        info = dict(info) if isinstance(info, dict) else {}
        if rec is not None:
            info.setdefault("buffer_id", rec.buffer_id)
        info.setdefault("task_id", orig)
        fn = self._callback_fn.get("deal_with_collector_judge_finish")
        if fn is None:
            return bool(info.get("collector_done", False))
        return bool(fn(orig, info))

    def _on_collector_finish(self, task_id: str, result: Any) -> None:
        orig, rec = self._ident(task_id)
        fn = self._fn("deal_with_collector_finish_task")
        self._forget(task_id)
        if fn is None:
            return
        result = dict(result) if isinstance(result, dict) else {}
        result.setdefault("task_id", orig)
        fn(orig, result)

    def _on_learner_get_data(self, task_id: str, buffer_id: Any, batch_size: Any,
                             cur_learner_iter: Any) -> Any:
        fn = self._fn("deal_with_learner_get_data")
        if fn is None:
            return None
        orig, _ = self._ident(task_id)
        try:
            data = fn(orig, buffer_id, batch_size, cur_learner_iter)
        except Exception as exc:  # noqa: BLE001 - e.g. a task the Coordinator forgot
            self._logger.warning("get_data for learner task %s raised %r: answered no data",
                                 orig, exc)
            return None
        return None if data is None else plain(data)

    def _on_learner_judge(self, task_id: str, info: Any) -> bool:
        if not self._dispatch:
            return False
        orig, _ = self._ident(task_id)
        fn = self._callback_fn.get("deal_with_learner_judge_finish")
        if fn is None:
            return bool(isinstance(info, dict) and info.get("learner_done", False))
        return bool(fn(orig, info))

    def _on_learner_info(self, task_id: str, buffer_id: Any, info: Any) -> None:
        fn = self._fn("deal_with_learner_send_info")
        if fn is None:
            return
        orig, rec = self._ident(task_id)
        fn(orig, buffer_id or (rec.buffer_id if rec else None), info)

    def _on_learner_finish(self, task_id: str, result: Any) -> None:
        orig, rec = self._ident(task_id)
        fn = self._fn("deal_with_learner_finish_task")
        self._forget(task_id)
        if fn is None:
            return
        result = dict(result) if isinstance(result, dict) else {}
        result.setdefault("task_id", orig)
        if rec is not None and rec.buffer_id is not None:
            result.setdefault("buffer_id", rec.buffer_id)  # the commander returns this buffer
        fn(orig, result)

    def _on_requeued(self, task_id: str, *args: Any) -> None:
        orig, _ = self._ident(task_id)
        self._logger.warning("task %s re-queued: %s", orig, " ".join(str(a) for a in args))

    def _on_failed(self, task_id: str, reason: Any = "", result: Any = None, *rest: Any) -> None:
        orig, rec = self._ident(task_id)
        self._forget(task_id)
        self._logger.error("task %s failed: %s%s", orig, reason,
                           "" if not result else " (result %r)" % (result,))
        kind = rec.kind if rec else None
        fn = self._fn("deal_with_%s_fail_task" % kind) if kind else None
        if fn is not None:
            fn(orig, reason, result)

    def _on_cancelled(self, task_id: str, reason: Any = "") -> None:
        orig, _ = self._ident(task_id)
        self._forget(task_id)
        self._logger.warning("task %s cancelled: %s", orig, reason)

    def _on_capacity(self, kind: Any, change: Any, worker_id: Any, count: Any) -> None:
        kind = str(getattr(kind, "value", kind))
        with self._lock:
            if kind in self._counts:
                self._counts[kind] = int(count)
            self._capacity.notify_all()
            if change == "decrease" and worker_id:
                listed = self._replicas.get(kind + "s", [])
                if worker_id in listed:
                    self._lost_replicas[kind + "s"].add(worker_id)

    def _on_stream_lost(self, first: Any, last: Any) -> None:
        self._logger.error("task events %s..%s were lost by the broker", first, last)

    def _on_data_lost(self, task_id: str, attempt: Any, first: Any, last: Any) -> None:
        orig, _ = self._ident(task_id)
        self._logger.error("collector task %s lost data items %s..%s", orig, first, last)

    def _on_increase(self) -> None:
        fn = self._fn("deal_with_increase_collector")
        if fn is not None:
            fn()

    def _on_decrease(self) -> None:
        fn = self._fn("deal_with_decrease_collector")
        if fn is not None:
            fn()

    # ----------------------------------------------------------------- operator mode

    def _start_operator_mode(self) -> None:
        assert self._operator is not None  # only called in operator mode
        request = cfg_get(self._operator_cfg, "init_replicas_request") or {}
        deadline = time.monotonic() + self._operator_timeout
        while True:
            ok, _, message, _ = self._operator.post_replicas(plain(request))
            if ok:
                self._logger.info("replica request posted to the operator server")
                break
            if time.monotonic() >= deadline or self._stop_sync.wait(1.0):
                raise RuntimeError("operator server did not take the replica request: %s"
                                   % (message,))
            self._logger.info("replica request refused (%s), retrying", message)
        self._sync_thread = threading.Thread(target=self._sync_loop,
                                             name="rlbus-compat-operator-sync", daemon=True)
        self._sync_thread.start()
        want_c = int(cfg_get(self._operator_cfg, "collector_target_num", default=0) or 0)
        want_l = int(cfg_get(self._operator_cfg, "learner_target_num", default=0) or 0)
        with self._capacity:
            met = self._capacity.wait_for(
                lambda: self._closed or (self._counts["collector"] >= want_c
                                         and self._counts["learner"] >= want_l),
                timeout=self._operator_timeout)
            counts = dict(self._counts)
        if self._closed:
            raise RuntimeError("coordinator closed while waiting for workers")
        if not met:
            raise TimeoutError("only {} collectors and {} learners joined within {:g} s "
                               "(targets {} and {})".format(counts["collector"], counts["learner"],
                                                            self._operator_timeout, want_c, want_l))
        self._logger.info("%d collectors and %d learners joined: pipeline starts",
                          counts["collector"], counts["learner"])

    def _sync_loop(self) -> None:
        assert self._operator is not None  # only started in operator mode
        while not self._stop_sync.is_set():
            with self._lock:
                lost = {k: sorted(v) for k, v in self._lost_replicas.items()}
            if lost["collectors"] or lost["learners"]:
                ok, _, message, _ = self._operator.post_replicas_failed(
                    collectors=[pod_name(r) for r in lost["collectors"]],
                    learners=[pod_name(r) for r in lost["learners"]])
                if ok:
                    with self._lock:
                        for k, v in lost.items():
                            self._lost_replicas[k].difference_update(v)
                else:
                    self._logger.error("failed replicas not reported: %s", message)
            ok, _, message, data = self._operator.get_replicas()
            if ok and isinstance(data, dict):
                with self._lock:
                    self._replicas = {"collectors": list(data.get("collectors") or []),
                                      "learners": list(data.get("learners") or [])}
            elif not ok:
                self._logger.error("replica list not read: %s", message)
            self._stop_sync.wait(1.0)


def _wait_ready(client: Any, timeout_s: float) -> bool:
    """Waits until the SDK client is ready; gives up early when the broker refused it."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if client.wait_for("ready", min(0.2, left)):
            return True
        if getattr(client, "state", None) in ("refused", "stopped"):
            return False
