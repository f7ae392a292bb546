"""The worker role: a collector or learner process taking tasks from the rlbus broker.

A :class:`Worker` keeps one connection with the broker (the client core, :mod:`rlbus._core`,
and its session layer, :mod:`rlbus._session`: HELLO, heartbeats, reconnects, resumption) and
runs the tasks the broker assigns to it, one at a time, with the user's handlers:

- ``run(task)`` does the work: a collector emits data and progress, a learner asks for
  batches and reports what each step did. It returns when done or when the task is told to
  stop (``task.stop_requested``).
- ``close(task)`` gives the final result (a dict) once ``run`` returned and the broker asked
  to close the task (TASK_CLOSE). It is not called when the attempt was aborted.
- ``on_policy(task, policy)`` (optional) hears of each newer version of the task's policy.

Threads. All socket work happens on the core's I/O thread; the task's bookkeeping that the
protocol needs (what was sent, what the broker confirmed, what waits to be sent) lives there
too and is only touched by functions posted to it. ``run`` and ``close`` run on the worker's
handler thread, ``on_policy`` on its policy thread (only started when an ``on_policy`` is
given), never on the I/O thread, so long handlers do not stop heartbeats. The handle the
handlers get is a :class:`~rlbus._task.Task`.

This module holds the role: the public :class:`Worker`, its handler and policy threads, and
what its I/O thread does with the broker's messages (TASK_START, TASK_CLOSE, TASK_ABORT,
DATA_CREDIT, DATA_ACK, replies, policy updates) and with its outbox. Reliable data is kept by
an :class:`~rlbus._unconfirmed.Unconfirmed` buffer per attempt; DATA waiting together leave
as one DATA_BATCH (:mod:`rlbus._batching`).
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import signal
import threading
import time
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Tuple, cast

from . import protocol as P
from ._batching import batchable, encode_batch
from ._core import Core
from ._keys import CurveKeys
from ._session import RECONNECT_MAX, RECONNECT_MIN, heartbeat_seconds
from ._task import Task, as_map
from ._types import Policy, TaskFailure
from ._unconfirmed import Unconfirmed

__all__ = ["Worker", "Task"]

log = logging.getLogger("rlbus.worker")

_MAX_OUTBOX = 100_000       # messages waiting for the session to be ready
_MAX_CREDIT_ENTRIES = 16    # attempts whose DATA_CREDIT is remembered
_MAX_REASON = 1024          # bytes of a TASK_FAILED reason
_RETRY_SEND_S = 0.01        # a full socket queue is tried again after this
_SLOW_HANDLER_WARN_S = 5.0  # close() says so when a handler takes this long to stop

_Out = Tuple[str, Dict[str, Any], Optional[Task]]  # (message, fields, task it is about)


def _cut(text: str, limit: int = _MAX_REASON) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


_MAX_LEAVE_MS = 86_400_000


def _leave_ms(deadline_s: Any) -> int:
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) \
            or not 0 <= deadline_s <= _MAX_LEAVE_MS / 1000:
        raise ValueError(f"deadline_s: expected 0..86400 seconds, got {deadline_s!r}")
    return int(round(deadline_s * 1000))


def _policy_of(msg: P.Message) -> Optional[Policy]:
    """The policy a TASK_START or POLICY_UPDATE carries, if any."""
    pid = msg.get("policy_id")
    version = msg.get("policy_version")
    if pid is None or version is None:
        return None
    params = msg.get("policy_params")
    return Policy(pid, version, msg.get("policy_ref"),
                  bytes(params) if params is not None else None)


class _Attempt:
    """The I/O thread's record of the attempt the handler runs."""

    __slots__ = ("task", "tracking", "unconfirmed")

    def __init__(self, task: Task, max_items: int, max_bytes: int) -> None:
        self.task = task
        self.tracking = True  # False once the attempt ended: nothing is kept or resent
        self.unconfirmed = Unconfirmed(max_items, max_bytes)


class _IoHandler:
    """The core's handler: forwards to the worker's I/O-thread methods."""

    def __init__(self, worker: "Worker") -> None:
        self._w = worker

    def on_ready(self, welcome: P.Message) -> None:
        self._w._io_ready(welcome)

    def on_message(self, msg: P.Message) -> None:
        self._w._io_message(msg)

    def on_state(self, state: str, detail: str) -> None:
        self._w._io_state(state, detail)

    def on_close(self) -> None:
        self._w._io_flush()

    def on_idle(self) -> None:
        # after each turn: what the turn queued leaves together, batched (§12.12.5)
        if self._w._outbox:
            self._w._io_flush()


def _is_callable_or_none(v: Any) -> bool:
    return v is None or callable(v)


class Worker:
    """A collector or learner connected to the broker, running its tasks with the handlers.

    ``run(task)`` is required; ``close(task) -> dict | None`` gives the result (default
    ``{}``); ``on_policy(task, policy)`` is optional. An exception from ``run`` or ``close``
    fails the attempt (TASK_FAILED): :class:`rlbus.TaskFailure` with its reason and result
    map, any other exception with ``str(exc)``.

    ``run`` and ``close`` run on the worker's handler thread, one task at a time.
    ``on_policy`` runs on the worker's policy thread, possibly while ``run`` is running,
    with versions in the order they arrived; when it is slower than the updates come, it
    gets the newest and skips those replaced meanwhile (the task's :meth:`Task.policy`
    already returns the newest). None of them runs on the I/O thread.

    ``endpoint`` is the broker's ROUTER endpoint, or a group's brokers separated by commas;
    None means :data:`rlbus.DEFAULT_ENDPOINT` (``tcp://127.0.0.1:7235``, the C++ SDK's
    default too). The constructor validates the options (ValueError naming the bad one),
    starts the threads and returns at once: it never waits for the network. :meth:`close` leaves the
    broker and joins every thread the worker started; the worker is a context manager too.

    ``leave_on_sigterm=S`` (seconds; the constructor must then run on the main thread) makes
    SIGTERM call :meth:`leave` with ``S``: the usual notice of a preempted machine or of a
    cluster scheduler. The process then goes on; wait with :meth:`wait_idle` and close.

    ``heartbeat`` is the interval (seconds, default 1.0) asked of the broker; it notices a
    silent broker after a few missed ones and reconnects, waiting ``reconnect_min`` to
    ``reconnect_max`` seconds between attempts. ``heartbeat_ms`` (milliseconds) is its old
    spelling, still accepted with a DeprecationWarning; giving both is a ValueError.

    ``curve=rlbus.curve_keys_from_files("me.key", "broker.pub")`` connects with CURVE, to a
    broker that has it on; without it the connection is plain.

    ``batch_data`` (on by default, SPEC §12.12): the DATA that one turn of the I/O thread
    finds waiting together leave as one DATA_BATCH of up to 1024 items and 64 KiB; a DATA
    emitted alone leaves alone, at once. The coordinator's callbacks see the same items either
    way. Off, every DATA travels alone (for a broker older than batched data).
    """

    def __init__(self, endpoint: Optional[str], role: str, id: str, run: Callable[[Task], Any],
                 close: Optional[Callable[[Task], Optional[Mapping[str, Any]]]] = None,
                 on_policy: Optional[Callable[[Task, Policy], Any]] = None,
                 resources: Optional[Mapping[str, float]] = None,
                 heartbeat: Optional[float] = None,
                 reconnect_min: float = RECONNECT_MIN, reconnect_max: float = RECONNECT_MAX,
                 max_unconfirmed_data: int = 4096,
                 max_unconfirmed_bytes: int = 16 << 20,
                 leave_on_sigterm: Optional[float] = None,
                 curve: Optional[CurveKeys] = None, batch_data: bool = True,
                 heartbeat_ms: Optional[int] = None) -> None:
        heartbeat = heartbeat_seconds(heartbeat, heartbeat_ms)
        if role not in ("collector", "learner"):
            raise ValueError(f"role: a worker is a collector or a learner, got {role!r}")
        if not callable(run):
            raise ValueError(f"run: expected a callable taking the task, got {run!r}")
        if not _is_callable_or_none(close):
            raise ValueError(f"close: expected a callable or None, got {close!r}")
        if not _is_callable_or_none(on_policy):
            raise ValueError(f"on_policy: expected a callable or None, got {on_policy!r}")
        if isinstance(max_unconfirmed_data, bool) or not isinstance(max_unconfirmed_data, int) \
                or max_unconfirmed_data < 1:
            raise ValueError(f"max_unconfirmed_data: expected an integer of at least 1, got "
                             f"{max_unconfirmed_data!r}")
        if isinstance(max_unconfirmed_bytes, bool) or not isinstance(max_unconfirmed_bytes, int) \
                or max_unconfirmed_bytes < 0:
            raise ValueError(f"max_unconfirmed_bytes: expected a non-negative integer, got "
                             f"{max_unconfirmed_bytes!r}")
        if leave_on_sigterm is not None:
            _leave_ms(leave_on_sigterm)  # ValueError when out of range
            if threading.current_thread() is not threading.main_thread():
                raise ValueError("leave_on_sigterm: signal handlers can only be set from the "
                                 "main thread; call leave() from your own handler instead")
        self.role = role
        self.id = id
        self._run = run
        self._close = close
        self._on_policy = on_policy
        self._max_items = max_unconfirmed_data
        self._max_bytes = max_unconfirmed_bytes
        self._batch_data = bool(batch_data)
        self._data_batches = 0  # DATA_BATCH sent, and the DATA they carried
        self._data_batched = 0
        # validates endpoint, id, resources, heartbeat and reconnect options (ValueError)
        self._core = Core(endpoint, role, id, _IoHandler(self), resources=resources,
                          heartbeat=heartbeat, reconnect_min=reconnect_min,
                          reconnect_max=reconnect_max, curve=curve)

        # shared with user threads; guarded by _lock
        self._lock = threading.Lock()
        self._stopping = False
        self._handler_task: Optional[Task] = None
        self._credit_waits = 0
        self._closed = threading.Event()
        self._leave_by: Optional[float] = None  # monotonic time its task must end by

        # I/O thread only
        self._cur: Optional[_Attempt] = None
        self._next_start: Optional[Task] = None
        self._last_outcome: Optional[_Out] = None  # RESULT / TASK_FAILED of the last attempt
        self._outbox: Deque[_Out] = collections.deque()
        self._credits: "collections.OrderedDict[Tuple[str, int], int]" = \
            collections.OrderedDict()
        self._retry_timer: Any = None
        self._data_dropped = 0
        self._data_resent = 0

        self._starts: "queue.Queue[Optional[Task]]" = queue.Queue()
        # the newest version on_policy has not seen yet (guarded by _lock): a slow on_policy
        # skips versions that a newer one replaced, so nothing piles up
        self._policy_slot: Optional[Tuple[Task, Policy]] = None
        self._policy_wake = threading.Event()
        self._handler_thread = threading.Thread(target=self._handler_loop,
                                                name=f"rlbus-handler-{id}", daemon=True)
        self._policy_thread: Optional[threading.Thread] = None
        if on_policy is not None:
            self._policy_thread = threading.Thread(target=self._policy_loop,
                                                   name=f"rlbus-policy-{id}", daemon=True)
        self._handler_thread.start()
        if self._policy_thread is not None:
            self._policy_thread.start()
        if leave_on_sigterm is not None:
            # the handler only starts a thread: leave() takes locks the interrupted code
            # may hold
            signal.signal(signal.SIGTERM, lambda *_: threading.Thread(
                target=self.leave, args=(leave_on_sigterm,), name=f"rlbus-leave-{id}",
                daemon=True).start())
        try:
            self._core.start()
        except BaseException:
            self.close()
            raise

    # ---- public: any thread ---------------------------------------------------------------

    @property
    def state(self) -> str:
        """``connecting``, ``ready``, ``reconnecting``, ``refused`` or ``stopped``."""
        return "stopped" if self._closed.is_set() else self._core.state

    def wait_for(self, state: str, timeout_s: float) -> bool:
        """Waits until :attr:`state` is ``state``; False if ``timeout_s`` seconds pass."""
        return self._core.wait_for(state, timeout_s)

    @property
    def session(self) -> int:
        """The broker's session token, 0 before the first WELCOME."""
        return self._core.token

    @property
    def welcomes(self) -> int:
        """How many times the broker welcomed this worker (1 + reconnects that succeeded)."""
        return self._core.welcomes

    @property
    def credit_waits(self) -> int:
        """How many emit_data calls had to wait for data credit (the coordinator was behind)."""
        with self._lock:
            return self._credit_waits

    @property
    def data_dropped(self) -> int:
        """Sent DATA let go of before the broker confirmed them (past max_unconfirmed_*);
        those the broker turns out to lack are reported to the coordinator as lost."""
        return self._data_dropped

    @property
    def data_resent(self) -> int:
        """DATA sent again after a resumed session, or because the broker asked."""
        return self._data_resent

    @property
    def data_batches(self) -> int:
        """DATA_BATCH messages sent (``batch_data``): DATA that waited together went as one."""
        return self._data_batches

    @property
    def data_batched(self) -> int:
        """The DATA those DATA_BATCH messages carried."""
        return self._data_batched

    @property
    def last_error(self) -> str:
        """The latest error or refusal the broker sent, "" when none."""
        return self._core.last_error

    def leave(self, deadline_s: float = 0.0) -> bool:
        """Tells the broker this worker will go away soon (LEAVING): it gets no new task for
        the rest of its session, and the task it runs, if any, may go on for at most
        ``deadline_s`` more seconds. Past that the broker aborts it (``task.aborted``,
        reason ``worker <id> leaving``) and gives it to another worker at once, not after the
        liveness window; the coordinator sees it re-queued with that reason. Calling it
        again can only bring the deadline closer; it is said again after a reconnect. False
        once the worker is closing. ValueError for a deadline outside 0..86400 s."""
        ms = _leave_ms(deadline_s)
        by = time.monotonic() + ms / 1000.0
        with self._lock:
            if self._leave_by is None or by < self._leave_by:
                self._leave_by = by
        return self._post(self._io_leave)

    @property
    def leaving(self) -> bool:
        """True once :meth:`leave` was called."""
        with self._lock:
            return self._leave_by is not None

    def wait_idle(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until the worker runs no task (after :meth:`leave`: until it may go);
        False if ``timeout_s`` seconds pass first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                idle = self._handler_task is None and self._starts.empty()
            if idle:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        """Leaves the broker: tells a running handler to stop (``task.stop_requested``),
        waits for it to return, says DISCONNECT and joins every thread the worker started.
        No handler runs after this returns. Idempotent; other callers wait for the first.

        A handler that ignores ``stop_requested`` holds this up (a warning is logged every
        5 s). Called from a handler itself, it does not wait for that handler to return.
        The broker ends the attempt that was running (the coordinator sees it re-queued);
        the task's ``close`` is not called."""
        me = threading.current_thread()
        with self._lock:
            first = not self._stopping
            self._stopping = True
            running = self._handler_task
        ours = me is self._handler_thread or me is self._policy_thread
        if not first:
            if not ours:
                self._closed.wait()
            return
        if running is not None:
            running._wake()
        self._starts.put(None)
        self._policy_wake.set()
        for t in (self._handler_thread, self._policy_thread):
            if t is None or t is me:
                continue
            started = time.monotonic()
            while True:
                t.join(_SLOW_HANDLER_WARN_S)
                if not t.is_alive():
                    break
                log.warning("worker %s: still waiting for %s to return (%.0f s); a handler "
                            "that ignores task.stop_requested holds close() up", self.id,
                            t.name, time.monotonic() - started)
        self._core.close()
        self._closed.set()

    def wait_closed(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until :meth:`close` has finished (called from another thread or a handler);
        False if ``timeout_s`` seconds pass first."""
        return self._closed.wait(timeout_s)

    def run_forever(self) -> None:
        """Serves tasks until :meth:`close` is called elsewhere, the broker refuses the
        worker for good, or KeyboardInterrupt; then closes the worker."""
        try:
            while not self._closed.wait(0.5):
                if self._core.state == "refused":
                    log.error("worker %s: refused by the broker: %s", self.id, self.last_error)
                    break
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Worker(id={self.id!r}, role={self.role!r}, state={self.state!r})"

    # ---- handler side ---------------------------------------------------------------------

    def _post(self, fn: Callable[[], None]) -> bool:
        return self._core.post(fn)

    # what a Task needs of its worker (rlbus._task.TaskOwner)

    def _queue(self, name: str, fields: Dict[str, Any], task: Task) -> bool:
        return self._core.post(lambda: self._io_queue(name, fields, task))

    def _count_credit_wait(self) -> None:
        with self._lock:
            self._credit_waits += 1

    def _check_size(self, name: str, body: bytes) -> None:
        """ValueError when ``body`` is past the broker's max-message (its WELCOME says it):
        the broker's socket would drop the connection that carries it."""
        limit = self._core.max_message
        if limit and len(body) > limit:
            raise ValueError(f"{name}: {len(body)} bytes, more than the broker's max-message "
                             f"of {limit}")

    def _outbox_full(self) -> bool:
        # read from other threads without a lock: an estimate is all the bound needs
        return len(self._outbox) >= _MAX_OUTBOX

    def _handler_loop(self) -> None:
        while True:
            task = self._starts.get()
            if task is None:
                return
            with self._lock:
                if self._stopping:
                    return
                self._handler_task = task
            outcome = self._run_one(task)
            task._end()
            with self._lock:
                self._handler_task = None
                if self._stopping:
                    return  # leaving: the broker ends the attempt with our session
            # bound now: by the time the I/O thread runs it, this loop may hold the next task
            self._post(functools.partial(self._io_done, task, outcome))

    def _run_one(self, task: Task) -> Optional[_Out]:
        """Runs ``run`` then, when asked, ``close``; the message that ends the attempt
        (RESULT or TASK_FAILED), or None when the attempt ended otherwise."""
        failure: Optional[Tuple[str, Any]] = None
        if task.aborted:
            return None  # ended before its handler got to it
        try:
            self._run(task)
        except TaskFailure as e:
            failure = (e.reason, e.result)
        except BaseException as e:  # noqa: BLE001 - any failure of user code fails the attempt
            failure = (str(e) or type(e).__name__, None)
            if not task.aborted:
                log.warning("worker %s: task %s attempt %d: run raised", self.id, task.id,
                            task.attempt, exc_info=True)
        result: Optional[P.Raw] = None
        if failure is None:
            if not task._wait_close():
                return None
            try:
                value = self._close(task) if self._close is not None else None
                result = as_map({} if value is None else value, "close() result")
                self._check_size("RESULT", P.encode_body(
                    "RESULT", {"task_id": task.id, "attempt": task.attempt, "result": result}))
            except TaskFailure as e:
                failure = (e.reason, e.result)
            except BaseException as e:  # noqa: BLE001
                failure = (str(e) or type(e).__name__, None)
                log.warning("worker %s: task %s attempt %d: close raised", self.id, task.id,
                            task.attempt, exc_info=True)
        if task._dropped():
            return None  # the broker takes nothing more from this attempt
        if failure is None:
            return ("RESULT", {"task_id": task.id, "attempt": task.attempt, "result": result},
                    None)
        reason, fresult = failure
        fields: Dict[str, Any] = {"task_id": task.id, "attempt": task.attempt,
                                  "reason": _cut(str(reason))}
        if fresult is not None:
            try:
                fields["result"] = as_map(fresult, "TaskFailure.result")
                self._check_size("TASK_FAILED", P.encode_body("TASK_FAILED", fields))
            except (ValueError, TypeError) as e:
                log.warning("worker %s: task %s: the failure's result is left out: %s",
                            self.id, task.id, e)
                fields.pop("result", None)
        log.info("worker %s: task %s attempt %d failed: %s", self.id, task.id, task.attempt,
                 fields["reason"])
        return ("TASK_FAILED", fields, None)

    def _policy_loop(self) -> None:
        assert self._on_policy is not None
        while True:
            self._policy_wake.wait()
            with self._lock:
                if self._stopping:
                    return
                self._policy_wake.clear()
                item, self._policy_slot = self._policy_slot, None
            if item is None:
                continue
            task, policy = item
            if not task._running():
                continue
            try:
                self._on_policy(task, policy)
            except Exception:  # noqa: BLE001 - a handler bug must not stop the worker
                log.exception("worker %s: on_policy raised", self.id)

    # ---- I/O thread -------------------------------------------------------------------------

    def _current(self, msg: P.Message) -> Optional[_Attempt]:
        """The attempt the message is about when it is the one running (fencing, §12.1.2)."""
        a = self._cur
        if a is not None and a.task.id == msg.get("task_id") \
                and a.task.attempt == msg.get("attempt"):
            return a
        return None

    def _waiting(self, msg: P.Message) -> Optional[Task]:
        """The task waiting for the handler when the message is about it."""
        nxt = self._next_start
        if nxt is not None and nxt.id == msg.get("task_id") and nxt.attempt == msg.get("attempt"):
            return nxt
        return None

    def _io_queue(self, name: str, fields: Dict[str, Any], task: Optional[Task]) -> None:
        a = self._cur
        if task is not None and (a is None or a.task is not task or task._aborted):
            return  # about an attempt that is over: the broker would refuse it
        self._outbox.append((name, fields, task))
        if name != "DATA" or not self._batch_data:
            self._io_flush()
        # a DATA waits for the end of the turn (on_idle), with whatever else the turn brings

    def _io_flush(self) -> None:
        """Sends what waits in the outbox, in order, while the session is ready; consecutive
        DATA go as one DATA_BATCH (§12.12.5)."""
        s = self._core
        while self._outbox:
            name, fields, task = self._outbox[0]
            a = self._cur
            mine = a if a is not None and a.task is task and a.tracking else None
            if mine is not None and mine.unconfirmed.is_confirmed(name, fields):
                self._outbox.popleft()  # confirmed meanwhile: nothing to send
                continue
            if name == "DATA" and mine is not None and self._batch_data:
                n = batchable(self._outbox, s.max_message)
                if n > 1:
                    if not self._send_batch(n, mine):
                        return
                    continue
            try:
                sent = s.send(name, fields)
            except Exception:  # noqa: BLE001 - a message that cannot be encoded is dropped
                log.exception("worker %s: %s could not be sent; dropped", self.id, name)
                self._outbox.popleft()
                continue
            if not sent:
                self._retry_soon()
                return
            self._outbox.popleft()
            if mine is not None:
                self._data_dropped += mine.unconfirmed.sent(name, fields)

    def _send_batch(self, n: int, a: _Attempt) -> bool:
        """Sends the first ``n`` DATA of the outbox as one DATA_BATCH; False when the
        socket's queue is full (they stay)."""
        # the DATA of the outbox are encoded already (Task._emit_item)
        batch = encode_batch([cast(P.Encoded, self._outbox[i][1]) for i in range(n)])
        if not self._core.send("DATA_BATCH", batch):
            self._retry_soon()
            return False
        self._data_batches += 1
        self._data_batched += n
        for _ in range(n):
            name, fields, _task = self._outbox.popleft()
            self._data_dropped += a.unconfirmed.sent(name, fields)
        return True

    def _retry_soon(self) -> None:
        """A send found the socket's queue full (or the session not ready): while ready,
        the outbox is tried again shortly; otherwise the next WELCOME flushes it."""
        s = self._core
        if s.ready and self._retry_timer is None:
            self._retry_timer = s.call_later(_RETRY_SEND_S, self._io_retry)

    def _io_retry(self) -> None:
        self._retry_timer = None
        self._io_flush()

    def _resend(self, a: _Attempt) -> None:
        """The broker may lack what was sent and not confirmed: all of it goes again, ahead
        of what was never sent, after a DATA_LOST for what was let go of (§12.11.8)."""
        again = a.unconfirmed.take_resend(a.task)
        self._data_resent += sum(1 for m in again if m[0] != "DATA_LOST")
        self._outbox.extendleft(reversed(again))

    def _reask_open(self, t: Task) -> None:
        """After a resumed session: a GET_DATA sent on the old connection, or the LEARN /
        NO_DATA answering it, may have gone down with it, and nothing would come; get_data
        asks again for those (the broker's open request is replaced by the new one)."""
        t._reask_stale({f["request_id"] for n, f, task in self._outbox
                        if n == "GET_DATA" and task is t})

    def _end_attempt(self, a: _Attempt, reason: str) -> None:
        """The broker takes nothing more of attempt ``a``: the handler is told (aborted) and
        whatever waits or is kept for it is forgotten."""
        a.tracking = False
        a.unconfirmed.clear()
        t = a.task
        self._outbox = collections.deque(m for m in self._outbox if m[2] is not t)
        t._abort(reason)

    def _io_leave(self) -> None:
        with self._lock:
            by = self._leave_by
        if by is not None:
            left = max(0, min(_MAX_LEAVE_MS, int((by - time.monotonic()) * 1000)))
            self._io_queue("LEAVING", {"deadline_ms": left}, None)

    def _io_ready(self, welcome: P.Message) -> None:
        a = self._cur
        if welcome["resumed"]:
            # whatever the old connection still held is gone: everything not confirmed goes
            # again (the broker drops duplicates)
            if a is not None and a.tracking:
                self._resend(a)
            if a is not None:
                self._reask_open(a.task)
            # what decides an attempt may have gone down with the old connection too: the
            # STARTED of the one held (a repeat is dropped, §12.5.3), first of all, or the
            # outcome of the last one (a late 406/407 if the broker had it)
            if a is not None and not a.task._aborted:
                self._outbox.appendleft(
                    ("STARTED", {"task_id": a.task.id, "attempt": a.task.attempt}, a.task))
            elif self._last_outcome is not None:
                self._outbox.appendleft(self._last_outcome)
        else:
            # a new session: the broker (restarted, or it expired us) no longer holds any
            # attempt of ours nor any credit; what waits for the old session is pointless
            if a is not None and not a.task._aborted:
                log.warning("worker %s: task %s attempt %d ended: the broker began a new "
                            "session", self.id, a.task.id, a.task.attempt)
                self._end_attempt(a, "the broker began a new session; it no longer holds "
                                     "this attempt")
            self._next_start = None
            self._last_outcome = None
            self._credits.clear()
            self._outbox = collections.deque(m for m in self._outbox if m[0] == "POLICY")
        self._io_leave()  # a new session, or a resumed one that may have missed it
        self._io_flush()

    def _io_state(self, state: str, detail: str) -> None:
        log.info("worker %s: %s%s", self.id, state, f" ({detail})" if detail else "")
        a = self._cur
        if state == "refused" and a is not None and not a.task._aborted:
            self._end_attempt(a, "the broker refused this worker: " + detail)

    def _io_message(self, msg: P.Message) -> None:
        name = msg.name
        if name == "TASK_START":
            self._on_start(msg)
        elif name == "TASK_CLOSE":
            a = self._current(msg)
            if a is not None:
                a.task._request_close()
        elif name == "TASK_ABORT":
            a = self._current(msg)
            nxt = self._waiting(msg) if a is None else None
            if nxt is not None:
                # the task waiting for the handler ended before it began (e.g. its start
                # timeout while an aborted handler was slow to return)
                log.warning("worker %s: task %s attempt %d aborted before it started: %s",
                            self.id, nxt.id, nxt.attempt, msg["reason"])
                self._next_start = None
            elif a is not None and not a.task._aborted:
                log.warning("worker %s: task %s attempt %d aborted: %s", self.id, a.task.id,
                            a.task.attempt, msg["reason"])
                self._end_attempt(a, msg["reason"])
        elif name in ("LEARN", "NO_DATA"):
            a = self._current(msg)
            if a is not None:
                a.task._answer(msg)
        elif name == "POLICY_UPDATE":
            a = self._current(msg)
            p = _policy_of(msg)
            nxt = self._waiting(msg) if a is None else None
            if p is not None and nxt is not None:
                nxt._start_with(p)  # not begun yet: it starts with this version
            if a is not None and p is not None and a.task._update_policy(p) \
                    and self._on_policy is not None:
                with self._lock:
                    self._policy_slot = (a.task, p)
                self._policy_wake.set()
        elif name == "DATA_CREDIT":
            key = (msg["task_id"], msg["attempt"])
            limit = max(self._credits.pop(key, 0), msg["limit"])
            self._credits[key] = limit
            a = self._cur
            cur_key = (a.task.id, a.task.attempt) if a is not None else None
            while len(self._credits) > _MAX_CREDIT_ENTRIES:
                victim = next(iter(self._credits))
                if victim == cur_key:
                    self._credits.move_to_end(victim)
                    victim = next(iter(self._credits))
                del self._credits[victim]
            a = self._current(msg)
            if a is not None:
                a.task._set_credit(limit)
        elif name == "DATA_ACK":
            a = self._current(msg)
            if a is not None and a.tracking:
                a.unconfirmed.confirm(msg["relayed"])
                if msg["resend"]:
                    self._resend(a)
                self._io_flush()
        elif name == "ERROR":
            ref = msg.get("ref_type")
            about = P.BY_ID[ref].name if ref in P.BY_ID else "?"
            log.warning("worker %s: the broker refused a %s: %d %s", self.id, about,
                        msg["code"], msg["reason"])
        else:
            log.debug("worker %s: ignored %s", self.id, name)

    def _on_start(self, msg: P.Message) -> None:
        tid, attempt = msg["task_id"], msg["attempt"]
        a = self._cur
        if a is not None and a.task.id == tid and a.task.attempt == attempt:
            return  # the same attempt again: nothing new
        if self._stopping:
            return  # leaving: our DISCONNECT ends the attempt
        info = msg["task_info"]
        task = Task(self, tid, attempt, msg["kind"],
                    info.value() if isinstance(info, P.Raw) else info, _policy_of(msg))
        if a is not None:
            # The broker assigns only to a free worker, and it frees one when the attempt
            # ends; so the next task may come while the handler of the ended attempt still
            # winds down: it waits its turn. If we had not heard of the end (a TASK_ABORT lost
            # with a connection before the session resumed), this TASK_START is the news.
            if not a.task._aborted:
                log.warning("worker %s: task %s attempt %d assigned while task %s attempt %d "
                            "runs: the broker no longer holds the latter; it is aborted",
                            self.id, tid, attempt, a.task.id, a.task.attempt)
                self._end_attempt(a, "the broker assigned this worker another task: it no "
                                     "longer holds this attempt")
            old = self._next_start
            if old is not None:  # its end was missed too: the latest assignment wins
                log.warning("worker %s: task %s attempt %d replaces task %s attempt %d, which "
                            "never started", self.id, tid, attempt, old.id, old.attempt)
            self._next_start = task
            return
        self._begin(task)

    def _begin(self, task: Task) -> None:
        """Makes ``task`` the running attempt: STARTED, then the handler gets it."""
        task._credit = self._credits.get((task.id, task.attempt))
        self._last_outcome = None  # the broker has moved on: it freed this worker
        self._cur = _Attempt(task, self._max_items, self._max_bytes)
        self._outbox.append(("STARTED", {"task_id": task.id, "attempt": task.attempt}, task))
        self._starts.put(task)
        self._io_flush()

    def _io_done(self, task: Task, outcome: Optional[_Out]) -> None:
        """The handler is done with ``task``: the outcome goes out after everything the task
        sent before it, and a task that waited for the handler starts."""
        a = self._cur
        if a is None or a.task is not task:
            return
        self._cur = None
        self._credits.pop((task.id, task.attempt), None)
        if outcome is not None and not task._aborted:
            self._outbox.append(outcome)
            # kept until the next TASK_START: sent again after a resumption (§12.11.8)
            self._last_outcome = outcome
        nxt, self._next_start = self._next_start, None
        if nxt is not None:
            self._begin(nxt)
        self._io_flush()
