"""The Coordinator: submits collector and learner tasks to an rlbus broker and follows them
through their ordered stream of events, with callbacks named after DI-engine's coordinator
``callback_fn`` keys.

This module holds the role: the public :class:`Coordinator`, :meth:`Coordinator.submit` and
the commands, and the callbacks. Threads. The client core (:mod:`rlbus._core`) owns the socket
and its I/O thread; every message is sent from there, and the state of the stream (a
:class:`~rlbus._stream.Stream`: the next seq expected, events that came early, what to
acknowledge) lives there too. A second thread, the *callback thread*, runs every user
callback, one at a time, in stream order. The two meet in a queue guarded by a lock.

The stream (SPEC §12.8, §12.9). Every step of this coordinator's tasks arrives as a TASK_EVENT
numbered by ``seq``. The coordinator asks for its stream with REPLAY as the first message of
every connection (from 1 in a new session; after a resumption, from the event after the last
one its callbacks finished), acknowledges what its callbacks finished with ACK, drops
duplicates (``stream_duplicates``), holds back an event that comes after a jump in ``seq``
while it asks REPLAY for what is missing, and reports events the broker could no longer keep
with ``on_stream_lost`` (``stream_gaps``). So each callback runs exactly once per event, in
order, across reconnects of the same session.

Adoption (SPEC §12.5.8). A coordinator that vanishes without saying DISCONNECT (a crash, a
SIGKILL, a link cut longer than its liveness) leaves its tasks and stream on the broker for the
broker's coordinator grace (60 s by default). They run on meanwhile. A new session under the
same id adopts them: a new process (the same program restarted) picks the stream up after the
last event its predecessor acknowledged and gets every later event of those tasks through the
callbacks, although it never submitted them. The events its predecessor handled after its
last acknowledgement that reached the broker come again (at most 32 when its
acknowledgements got through). The same process, back after its session expired,
goes on as after a resumption. :meth:`close` says DISCONNECT: the broker cancels the tasks at
once.

A new session that adopts nothing (the grace ran out, or the broker restarted): the broker
cancelled every task of the old session without telling anyone, and the old stream is gone.
The coordinator reconnects by itself, starts the new stream at 1, and reports each task it
still had open with ``on_task_cancelled(task_id, reason)`` (the reason says the session was
lost) once the events of the old stream it had received have been handled; such tasks may be
submitted again. A FINISH, CANCEL or DATA_REPLY that could not be sent before the old session
ended is dropped: its task is gone.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Tuple

from . import protocol as P
from ._core import Core
from ._keys import CurveKeys
from ._session import RECONNECT_MAX, RECONNECT_MIN, heartbeat_seconds
from ._stream import Progress, Stream
from ._types import SubmitResult

__all__ = ["Coordinator", "CALLBACK_NAMES"]

log = logging.getLogger("rlbus.coordinator")

#: The callbacks a Coordinator knows, by name (see :class:`Coordinator`).
CALLBACK_NAMES = (
    "deal_with_collector_send_data",
    "deal_with_collector_judge_finish",
    "deal_with_collector_finish_task",
    "deal_with_learner_get_data",
    "deal_with_learner_judge_finish",
    "deal_with_learner_send_info",
    "deal_with_learner_finish_task",
    "deal_with_increase_collector",
    "deal_with_decrease_collector",
    "on_task_requeued",
    "on_task_failed",
    "on_task_cancelled",
    "on_capacity",
    "on_stream_lost",
    "on_data_lost",
)

_NO_DATA_FIRST_MS = 10   # retry_ms of the first "no data yet" in a row for a task
_NO_DATA_MAX_MS = 1000   # ... doubled for each further one, up to this
_MAX_RECONCILE = 1_000_000  # most capacity callbacks one report may cause
_SEND_RETRY_S = 0.02     # retry of commands the socket's full queue refused
SESSION_LOST_REASON = ("the broker ended this coordinator's session (restart or expiry) "
                       "and cancelled the task with it")

# Items for the callback thread.
_EVENT, _LOST, _CAPACITY, _RESET = range(4)


def _default_judge(key: str) -> Callable[[str, Any], bool]:
    def judge(task_id: str, info: Any) -> bool:
        return isinstance(info, dict) and bool(info.get(key))
    judge.__name__ = f"default_judge_{key}"
    return judge


def _resolve_callbacks(callbacks: Any) -> Dict[str, Callable[..., Any]]:
    """Callbacks from a dict (name -> callable) or an object (methods of those names)."""
    found: Dict[str, Callable[..., Any]] = {}
    if callbacks is None:
        return found
    if isinstance(callbacks, (str, bytes, list, tuple, int, float)):
        raise ValueError(f"callbacks: expected an object with callback methods or a dict "
                         f"name -> callable, got {type(callbacks).__name__}")
    mapping = isinstance(callbacks, Mapping)
    pairs = callbacks.items() if mapping else \
        ((name, getattr(callbacks, name, None)) for name in CALLBACK_NAMES)
    for name, fn in pairs:
        if mapping and name not in CALLBACK_NAMES:
            raise ValueError(f"callbacks: unknown callback name {name!r} (known: "
                             f"{', '.join(CALLBACK_NAMES)})")
        if fn is None:
            continue
        if not callable(fn):
            raise ValueError(f"callbacks: {name} is not callable: {fn!r}")
        found[name] = fn
    return found


class _Task:
    """What the coordinator knows of one open task."""

    __slots__ = ("kind", "generation", "judged_final", "no_data_ms")

    def __init__(self, kind: Optional[str], generation: int) -> None:
        self.kind = kind
        self.generation = generation
        self.judged_final = False   # FINISH sent for the current attempt (callback thread)
        self.no_data_ms = 0         # retry_ms of the last "no data yet" in a row (callback thread)


class _SubmitWait:
    """One submit() waiting for its SUBMITTED."""

    __slots__ = ("task_id", "kind", "done", "result", "abandoned")

    def __init__(self, task_id: str, kind: str) -> None:
        self.task_id = task_id
        self.kind = kind
        self.done = threading.Event()
        self.result: Optional[SubmitResult] = None
        self.abandoned = False


class _Command:
    """A message for the broker that waits in the outbox until the session is ready."""

    __slots__ = ("name", "fields", "generation", "wait")

    def __init__(self, name: str, fields: Dict[str, Any], generation: Optional[int],
                 wait: Optional[_SubmitWait] = None) -> None:
        self.name = name
        self.fields = fields
        self.generation = generation  # None: valid in any session (a SUBMIT)
        self.wait = wait


class _Handler:
    """The core's handler: forwards to the Coordinator's I/O-thread methods."""

    def __init__(self, owner: "Coordinator") -> None:
        self._owner = owner

    def on_ready(self, welcome: P.Message) -> None:
        self._owner._io_ready(welcome)

    def on_message(self, msg: P.Message) -> None:
        self._owner._io_message(msg)

    def on_close(self) -> None:
        self._owner._io_close()

    def on_idle(self) -> None:
        self._owner._io_idle()


class Coordinator:
    """A coordinator of an rlbus broker (SPEC §12): submits tasks and runs callbacks for
    their events, in stream order, exactly once.

    ``callbacks`` is an object with any subset of these methods, or a dict name -> callable
    (names not in the dict are not called; an unknown name is a ValueError):

    - ``deal_with_collector_send_data(task_id, buffer_id, data_id, data)``: a collector's
      DATA; ``data`` is a dict ``{data_id, buffer_id, meta, payload?, policy_version?}``.
    - ``deal_with_collector_judge_finish(task_id, info) -> bool``: an INFO; True closes the
      task (FINISH, once per attempt). Default: ``info.get("collector_done")``.
    - ``deal_with_collector_finish_task(task_id, result)``: the collector's RESULT.
    - ``deal_with_learner_get_data(task_id, buffer_id, batch_size, cur_learner_iter)``:
      the return value is the batch sent to the learner; None (or an exception, logged)
      means "no data yet": the learner is told to wait 10 ms, doubled for each further
      None in a row for that task up to 1000 ms; a batch given starts the count over.
    - ``deal_with_learner_judge_finish(task_id, info) -> bool``: a LEARN_INFO; True closes
      the task. Default: ``info.get("learner_done")``.
    - ``deal_with_learner_send_info(task_id, buffer_id, info)``: a LEARN_INFO not judged
      final (one judged final is not passed on, as in the C++ SDK).
    - ``deal_with_learner_finish_task(task_id, result)``: the learner's RESULT.
    - ``deal_with_increase_collector()`` / ``deal_with_decrease_collector()``: once per
      collector that joined or left the broker, so that +1/-1 per call adds up to
      :attr:`collectors` whatever reports were missed (SPEC §12.10.7).
    - ``on_capacity(kind, change, worker_id, count)``: every capacity report, both kinds;
      ``change`` is ``increase``, ``decrease`` or ``snapshot``.
    - ``on_task_requeued(task_id, attempt, reason, result)``: attempt ``attempt`` ended
      and the task waits for another worker; ``result`` is the dict the failing worker
      sent with TASK_FAILED, or None.
    - ``on_task_failed(task_id, reason, result)``: the task failed for good.
    - ``on_task_cancelled(task_id, reason)``: cancelled by :meth:`cancel`, by a broker
      shutting down, or because the broker lost this coordinator's session (see the module
      docstring).
    - ``on_stream_lost(first, last)``: events ``first..last`` of the stream are lost for
      good; counted in :attr:`stream_gaps`.
    - ``on_data_lost(task_id, attempt, first, last)``: a collector dropped DATA with these
      indexes before the broker got them; counted in :attr:`data_lost`.

    Every callback runs on the coordinator's callback thread; an exception from one is
    logged and the stream goes on. A callback may call :meth:`submit`, :meth:`cancel` and
    :meth:`finish` (submit blocks the stream while it waits for its answer).

    ``endpoint`` defaults to :data:`rlbus.DEFAULT_ENDPOINT` (``tcp://127.0.0.1:7235``), as
    the C++ SDK's does. The constructor validates the options (ValueError naming the bad
    one) and starts connecting without waiting; use :meth:`wait_for` to wait for ``ready``. ``heartbeat``
    is the interval (seconds, default 1.0) asked of the broker; ``reconnect_min`` and
    ``reconnect_max`` bound the wait between reconnects (seconds). ``heartbeat_ms``
    (milliseconds) is the old spelling of ``heartbeat``, still accepted with a
    DeprecationWarning; giving both is a ValueError.
    ``curve=rlbus.curve_keys_from_files("me.key", "broker.pub")`` connects with CURVE.
    """

    def __init__(self, endpoint: Optional[str] = None, id: str = "coordinator",
                 callbacks: Any = None, heartbeat: Optional[float] = None,
                 reconnect_min: float = RECONNECT_MIN, reconnect_max: float = RECONNECT_MAX, curve: Optional[CurveKeys] = None,
                 heartbeat_ms: Optional[int] = None) -> None:
        heartbeat = heartbeat_seconds(heartbeat, heartbeat_ms)
        cbs = _resolve_callbacks(callbacks)
        self._cb = cbs
        self._judge_collector = cbs.get("deal_with_collector_judge_finish",
                                        _default_judge("collector_done"))
        self._judge_learner = cbs.get("deal_with_learner_judge_finish",
                                      _default_judge("learner_done"))
        self._id = id
        self._core = Core(endpoint, "coordinator", id, _Handler(self), heartbeat=heartbeat,
                          reconnect_min=reconnect_min, reconnect_max=reconnect_max,
                          curve=curve)

        # shared between threads, under _cv
        self._cv = threading.Condition()
        self._queue: Deque[Tuple[int, int, Any]] = collections.deque()
        self._closing = False
        self._tasks: Dict[str, _Task] = {}
        self._data_lost = 0
        self._collectors = 0
        self._learners = 0

        # I/O thread only
        self._generation = 0      # +1 per new session (a new stream)
        self._stream = Stream(self._core, self._io_deliver, self._io_lost, id)
        self._handed = False      # queued for the callback thread since the last on_idle
        # the callback thread's count of what it finished (read by the I/O thread too)
        self._progress = Progress(self._tell_processed)
        self._outbox: Deque[_Command] = collections.deque()
        self._waits: Dict[str, Deque[_SubmitWait]] = {}
        self._retry_timer: Any = None

        self._cb_thread = threading.Thread(target=self._callback_loop,
                                           name=f"rlbus-cb-{id}", daemon=True)
        self._cb_thread.start()
        self._core.start()

    # ---- public API ------------------------------------------------------------------

    @property
    def id(self) -> str:
        """This coordinator's peer id."""
        return self._id

    @property
    def state(self) -> str:
        """``connecting``, ``ready``, ``reconnecting``, ``refused`` or ``stopped``."""
        return self._core.state

    @property
    def last_error(self) -> str:
        """The latest refusal, ERROR or disconnect detail from the broker ("" when none)."""
        return self._core.last_error

    @property
    def welcomes(self) -> int:
        """WELCOMEs received (1 after the first connection, +1 per reconnection)."""
        return self._core.welcomes

    def wait_for(self, state: str, timeout: float) -> bool:
        """Waits until :attr:`state` is ``state``; False when ``timeout`` seconds pass."""
        return self._core.wait_for(state, timeout)

    def submit(self, task_id: str, kind: str, task_info: Optional[Mapping[str, Any]] = None,
               *, requirements: Optional[Mapping[str, float]] = None,
               start_timeout_ms: Optional[int] = None, step_timeout_ms: Optional[int] = None,
               close_timeout_ms: Optional[int] = None, task_timeout_ms: Optional[int] = None,
               max_attempts: Optional[int] = None, policy_id: Optional[str] = None,
               queue_timeout_ms: Optional[int] = None,
               timeout: float = 5.0) -> Optional[SubmitResult]:
        """Submits a task and waits up to ``timeout`` seconds for the broker's answer.

        Returns :class:`rlbus.SubmitResult` ``(task_id, accepted, code, reason, queued)``:
        accepted, or refused with the broker's code (411 duplicate id, 412 queue full, 503
        shutting down) or 402 for a field that breaks the protocol's rules (checked here,
        nothing is sent); ``queued`` is the number of tasks ahead of it in the queue. None
        when no answer came in time (not connected, or the connection was lost before the
        answer: the task may then exist; submitting it again tells, with 411).
        ``task_info`` (a dict, default ``{}``) is serialized before this returns. Timeouts
        are milliseconds; absent ones take the broker's settings.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout: expected a number of seconds >= 0, got {timeout!r}")
        fields: Dict[str, Any] = {
            "task_id": task_id, "kind": kind,
            "requirements": dict(requirements) if requirements is not None else None,
            "start_timeout_ms": start_timeout_ms, "step_timeout_ms": step_timeout_ms,
            "close_timeout_ms": close_timeout_ms, "task_timeout_ms": task_timeout_ms,
            "max_attempts": max_attempts, "policy_id": policy_id,
            "queue_timeout_ms": queue_timeout_ms,
        }
        try:
            info = {} if task_info is None else task_info
            raw = info if isinstance(info, P.Raw) else P.Raw(P.pack_value(info))
            P.unpack_value(raw)  # within the limits of SPEC §5.1, as the broker will check
            fields["task_info"] = raw
        except P.ProtocolError as e:
            return SubmitResult(task_id, False, e.code, f"SUBMIT: task_info: {e.reason}", False)
        except (TypeError, ValueError, OverflowError) as e:
            return SubmitResult(task_id, False, 402, f"SUBMIT: task_info cannot be encoded: {e}",
                                False)
        except Exception as e:  # the decoder's own limits (a buffer past 1 MiB)
            return SubmitResult(task_id, False, 401,
                                f"SUBMIT: task_info cannot be checked: {e!r}", False)
        fields = {k: v for k, v in fields.items() if v is not None}
        for name in ("start_timeout_ms", "step_timeout_ms", "close_timeout_ms",
                     "task_timeout_ms", "max_attempts", "queue_timeout_ms"):
            if isinstance(fields.get(name), bool):
                return SubmitResult(task_id, False, 402, f"SUBMIT: {name} must be an integer",
                                    False)
        try:
            size = sum(len(f) for f in P.encode("SUBMIT", fields))
        except P.ProtocolError as e:
            return SubmitResult(task_id, False, e.code, e.reason, False)
        except (TypeError, ValueError, OverflowError) as e:
            return SubmitResult(task_id, False, 402, f"SUBMIT: {e}", False)
        limit = self._core.max_message
        if limit and size > limit:
            return SubmitResult(task_id, False, 402, f"SUBMIT: {size} bytes, more than the "
                                f"broker's max-message of {limit} (task_info too large)",
                                False)

        wait = _SubmitWait(task_id, kind)
        if self._closing or self._core.state in ("refused", "stopped"):
            return None
        if not self._core.post(
                functools.partial(self._io_command, _Command("SUBMIT", fields, None, wait))):
            return None
        if wait.done.wait(timeout):
            return wait.result
        self._core.post(functools.partial(self._io_withdraw, wait))
        return wait.result if wait.done.is_set() else None

    def cancel(self, task_id: str, reason: str = "cancelled") -> None:
        """Drops a task wherever it is (queued or running); ``on_task_cancelled`` follows."""
        self._post_command("CANCEL", {"task_id": task_id, "reason": reason})

    def finish(self, task_id: str) -> None:
        """Closes a running task now, as a judge returning True does: its worker is asked
        for its result, which reaches ``deal_with_*_finish_task``."""
        self._post_command("FINISH", {"task_id": task_id})

    @property
    def open_tasks(self) -> int:
        """Tasks accepted and not yet finished, failed or cancelled (as far as the
        callbacks have got)."""
        with self._cv:
            return len(self._tasks)

    @property
    def stream_gaps(self) -> int:
        """Events of the stream that never arrived (reported with ``on_stream_lost``)."""
        return self._stream.gaps

    @property
    def data_lost(self) -> int:
        """DATA that collectors reported lost (``on_data_lost``), over all tasks."""
        return self._data_lost

    @property
    def collectors(self) -> int:
        """Live collectors on the broker, as of the last capacity report handled."""
        return self._collectors

    @property
    def learners(self) -> int:
        """Live learners on the broker, as of the last capacity report handled."""
        return self._learners

    @property
    def stream_replays(self) -> int:
        """REPLAYs sent: one per connection and one per jump in seq."""
        return self._stream.replays

    @property
    def stream_duplicates(self) -> int:
        """Events that arrived again (after a replay) and were dropped."""
        return self._stream.duplicates

    def close(self) -> None:
        """Says DISCONNECT and stops both threads; idempotent. No callback runs after this
        returns (one running when close() is called is waited for). The broker cancels the
        tasks still open (SPEC §12.5.8). A submit() waiting returns None. Called from a
        callback, it cannot wait for its own thread: that thread ends as the callback
        returns, and no other callback runs."""
        with self._cv:
            first = not self._closing
            self._closing = True
            self._queue.clear()
            self._cv.notify_all()
        if self._cb_thread is not threading.current_thread():
            self._cb_thread.join()
        if first:
            self._core.close()

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<rlbus.Coordinator {self._id} {self.state} open_tasks={self.open_tasks}>"

    # ---- commands (any thread -> I/O thread) -------------------------------------------

    def _post_command(self, name: str, fields: Dict[str, Any],
                      generation: Optional[int] = None, current: bool = True) -> None:
        """Sends ``name`` from the I/O thread. ``current`` (the caller's commands, checked
        here: ValueError): valid in the session current when it reaches the I/O thread;
        otherwise (the callbacks' own, well-formed) only in session ``generation``."""
        if current:
            try:
                P.encode(name, fields)
            except P.ProtocolError as e:
                raise ValueError(str(e)) from None
        if self._closing:
            return

        def run() -> None:
            gen = self._generation if current else generation
            self._io_command(_Command(name, fields, gen))
        self._core.post(run)

    # ---- I/O thread ------------------------------------------------------------------

    def _io_command(self, cmd: _Command) -> None:
        if cmd.generation is not None and cmd.generation != self._generation:
            log.debug("coordinator %s: %s of an ended session dropped", self._id, cmd.name)
            return
        self._outbox.append(cmd)
        self._io_flush()

    def _io_flush(self) -> None:
        s = self._core
        while self._outbox and s.ready:
            cmd = self._outbox[0]
            try:
                sent = s.send(cmd.name, cmd.fields)
            except Exception as e:  # checked before posting: should not happen
                log.error("coordinator %s: %s not sent: %r", self._id, cmd.name, e)
                self._outbox.popleft()
                if cmd.wait is not None:
                    cmd.wait.done.set()
                continue
            if not sent:
                if self._retry_timer is None:
                    self._retry_timer = s.call_later(_SEND_RETRY_S, self._io_retry)
                return
            self._outbox.popleft()
            if cmd.wait is not None:
                self._waits.setdefault(cmd.wait.task_id, collections.deque()).append(cmd.wait)

    def _io_retry(self) -> None:
        self._retry_timer = None
        self._io_flush()

    def _io_withdraw(self, wait: _SubmitWait) -> None:
        """A submit() gave up: a SUBMIT not sent yet is never sent; one sent keeps its place
        so its late answer is matched to it (and an accepted task is still followed)."""
        for cmd in self._outbox:
            if cmd.wait is wait:
                self._outbox.remove(cmd)
                return
        wait.abandoned = True

    def _io_ready(self, welcome: P.Message) -> None:
        self._io_release_waits()  # SUBMITs sent on an earlier connection get no answer
        stream = self._stream
        generation, seq = self._progress.last  # ahead of what the last batch reported
        if generation == self._generation:
            stream.finished(seq)
        acked = welcome.get("stream_acked")
        if stream.welcome(welcome["resumed"], acked):  # a new stream: a new session's
            if acked is None and self._generation > 0:
                log.warning("coordinator %s: the broker began a new session; the tasks of the "
                            "old one were cancelled by the broker, the stream starts at 1",
                            self._id)
            self._generation += 1
            self._outbox = collections.deque(
                c for c in self._outbox if c.generation is None)
            if self._generation > 1:
                self._enqueue(_RESET, self._generation, None)
        stream.connected()  # first on every connection: REPLAY
        self._io_flush()

    def _io_message(self, msg: P.Message) -> None:
        name = msg.name
        if name == "TASK_EVENT":
            self._stream.event(msg)
        elif name == "SUBMITTED":
            self._io_submitted(msg)
        elif name == "CAPACITY":
            self._enqueue(_CAPACITY, self._generation,
                          (msg["kind"], msg["change"], msg["worker_id"], msg["count"]))
        elif name == "STREAM_GAP":
            self._stream.gap(msg["first"], msg["last"])
        elif name == "ERROR":
            ref = msg.get("ref_type")
            what = P.BY_ID[ref].name if ref in P.BY_ID else str(ref)
            log.warning("coordinator %s: broker refused %s: %d %s", self._id, what, msg["code"],
                        msg["reason"])
        else:
            log.debug("coordinator %s: ignored %s", self._id, name)

    def _io_submitted(self, msg: P.Message) -> None:
        task_id = msg["task_id"]
        waits = self._waits.get(task_id)
        wait = waits.popleft() if waits else None
        if waits is not None and not waits:
            del self._waits[task_id]
        if msg["accepted"]:
            with self._cv:  # open before any of its events reaches the callbacks
                self._tasks[task_id] = _Task(wait.kind if wait else None, self._generation)
        if wait is not None:
            wait.result = SubmitResult(task_id, msg["accepted"], msg["code"], msg["reason"],
                                       msg["queued"])
            wait.done.set()
            if wait.abandoned and msg["accepted"]:
                log.warning("coordinator %s: task %s was accepted after its submit() gave up; "
                            "its events are handled as usual", self._id, task_id)

    def _io_deliver(self, msg: P.Message) -> None:
        self._enqueue(_EVENT, self._generation, msg)

    def _io_lost(self, first: int, last: int) -> None:
        self._enqueue(_LOST, self._generation, (first, last))

    def _io_processed(self, seq: int, generation: int, count: int, caught_up: bool) -> None:
        """The callbacks finished ``count`` more events of stream ``generation``, up to
        ``seq``."""
        if generation == self._generation:
            self._stream.done(seq, count, caught_up)

    def _io_close(self) -> None:
        for cmd in self._outbox:
            if cmd.wait is not None:
                cmd.wait.done.set()
        self._outbox.clear()
        self._io_release_waits()

    def _io_release_waits(self) -> None:
        """The submit()s waiting for the answer to a SUBMIT sent return (None)."""
        for task_id in list(self._waits):
            for w in self._waits.pop(task_id):
                w.done.set()

    def _enqueue(self, kind: int, generation: int, item: Any) -> None:
        with self._cv:
            if self._closing:
                return
            self._queue.append((kind, generation, item))
        self._handed = True  # the callback thread is woken once per turn, in on_idle

    def _io_idle(self) -> None:
        """End of a turn of the I/O loop: wakes the callback thread for what it queued."""
        if self._handed:
            self._handed = False
            with self._cv:
                self._cv.notify_all()

    # ---- callback thread ---------------------------------------------------------------

    def _callback_loop(self) -> None:
        """Takes what is queued in one go, runs it in order, and tells the I/O thread once
        per batch (and stream) how far the callbacks got."""
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if self._closing:
                    return
                batch = list(self._queue)
                self._queue.clear()
            progress = self._progress
            for kind, generation, item in batch:
                if self._closing:
                    return  # close() waits for this thread: nothing runs after it returns
                progress.begin(generation)
                if kind == _CAPACITY:
                    self._guard("capacity", self._on_capacity, *item)
                    continue
                if kind == _RESET:
                    self._on_reset(generation)
                    continue
                if kind == _LOST:
                    fn = self._cb.get("on_stream_lost")
                    if fn is not None:
                        self._guard("on_stream_lost", fn, item[0], item[1])
                    seq = item[1]
                else:
                    self._guard(f"{item['event']} of task {item['task_id']}", self._dispatch,
                                item, generation)
                    seq = item["seq"]
                progress.finished(generation, seq)
            progress.end(self._caught_up)

    def _caught_up(self) -> bool:
        with self._cv:
            return not self._queue

    def _tell_processed(self, seq: int, generation: int, count: int, caught_up: bool) -> None:
        self._core.post(functools.partial(self._io_processed, seq, generation, count,
                                          caught_up))

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            log.exception("coordinator %s: callback for %s raised", self._id, what)
            return None

    def _call(self, name: str, *args: Any) -> Any:
        fn = self._cb.get(name)
        if fn is None:
            return None
        return self._guard(name, fn, *args)

    def _task(self, task_id: str) -> Optional[_Task]:
        with self._cv:
            return self._tasks.get(task_id)

    def _close_task(self, task_id: str) -> Optional[_Task]:
        with self._cv:
            return self._tasks.pop(task_id, None)

    def _send_finish(self, task_id: str, generation: int) -> None:
        rec = self._task(task_id)
        if rec is not None:
            if rec.judged_final:
                return  # one FINISH per attempt: a second one would be a fault
            rec.judged_final = True
        self._post_command("FINISH", {"task_id": task_id}, generation, current=False)

    def _dispatch(self, msg: P.Message, generation: int) -> None:
        event = msg["event"]
        task_id = msg["task_id"]
        body = msg["body"].value()
        fields = body if isinstance(body, dict) else {}
        if event == "data":
            self._set_kind(task_id, "collector")
            self._call("deal_with_collector_send_data", task_id, fields.get("buffer_id", ""),
                       fields.get("data_id", ""), body)
        elif event == "data_batch":
            # each item as the `data` it stands for, in order (SPEC §12.12.6)
            self._set_kind(task_id, "collector")
            for item in fields.get("items", ()):
                if isinstance(item, dict):
                    self._call("deal_with_collector_send_data", task_id,
                               item.get("buffer_id", ""), item.get("data_id", ""), item)
        elif event == "info":
            self._set_kind(task_id, "collector")
            if self._guard("deal_with_collector_judge_finish", self._judge_collector,
                           task_id, body):
                self._send_finish(task_id, generation)
        elif event == "learn_info":
            self._set_kind(task_id, "learner")
            info = fields.get("info")
            if self._guard("deal_with_learner_judge_finish", self._judge_learner,
                           task_id, info):
                self._send_finish(task_id, generation)
            else:
                self._call("deal_with_learner_send_info", task_id, fields.get("buffer_id", ""),
                           info)
        elif event == "data_request":
            self._set_kind(task_id, "learner")
            self._answer_data_request(task_id, fields, generation)
        elif event == "finished":
            rec = self._close_task(task_id)
            # the event names the kind (SPEC §12.3.6); a broker that predates it does not
            kind = msg.get("kind") or (rec.kind if rec is not None else None)
            if kind == "learner":
                self._call("deal_with_learner_finish_task", task_id, body)
            else:
                self._call("deal_with_collector_finish_task", task_id, body)
        elif event == "requeued":
            rec = self._task(task_id)
            if rec is not None:
                rec.judged_final = False
                rec.no_data_ms = 0
            self._call("on_task_requeued", task_id, msg["attempt"], fields.get("reason", ""),
                       fields.get("result"))
        elif event == "failed":
            self._close_task(task_id)
            self._call("on_task_failed", task_id, fields.get("reason", ""), fields.get("result"))
        elif event == "cancelled":
            self._close_task(task_id)
            self._call("on_task_cancelled", task_id, fields.get("reason", ""))
        elif event == "data_lost":
            first = int(fields.get("first_index", 0))
            last = int(fields.get("last_index", 0))
            if last >= first > 0:
                with self._cv:
                    self._data_lost += last - first + 1
            self._call("on_data_lost", task_id, msg["attempt"], first, last)
        # assigned, started and events this revision does not know: nothing to do

    def _set_kind(self, task_id: str, kind: str) -> None:
        rec = self._task(task_id)
        if rec is not None and rec.kind is None:
            rec.kind = kind

    def _answer_data_request(self, task_id: str, req: Dict[str, Any], generation: int) -> None:
        data: Any = None
        fn = self._cb.get("deal_with_learner_get_data")
        if fn is not None:
            try:
                data = fn(task_id, req.get("buffer_id", ""), req.get("batch_size", 0),
                          req.get("cur_learner_iter", 0))
                if data is not None and not isinstance(data, P.Raw):
                    data = P.Raw(P.pack_value(data))
                    P.unpack_value(data)  # within the limits of SPEC §5.1, or the broker refuses
            except Exception:
                log.exception("coordinator %s: deal_with_learner_get_data for task %s failed; "
                              "answered no data", self._id, task_id)
                data = None
            limit = self._core.max_message
            if data is not None and limit and len(data) + 256 > limit:
                log.error("coordinator %s: the batch for task %s has %d bytes, more than the "
                          "broker's max-message of %d; answered no data", self._id, task_id,
                          len(data), limit)
                data = None
        rec = self._task(task_id)
        fields: Dict[str, Any] = {"task_id": task_id, "request_id": req.get("request_id", 0)}
        if data is not None and data != P.NIL:
            fields["data"] = data
            if rec is not None:
                rec.no_data_ms = 0
        else:
            fields["data"] = P.NIL
            ms = _NO_DATA_FIRST_MS
            if rec is not None:
                ms = (_NO_DATA_FIRST_MS if rec.no_data_ms == 0
                      else min(_NO_DATA_MAX_MS, rec.no_data_ms * 2))
                rec.no_data_ms = ms
            fields["retry_ms"] = ms
        self._post_command("DATA_REPLY", fields, generation, current=False)

    def _on_capacity(self, kind: str, change: str, worker_id: str, count: int) -> None:
        """Steps the known count to the broker's one at a time, calling the seed's collector
        callbacks at each step (SPEC §12.10.7), then on_capacity."""
        collector = kind == "collector"
        known = self._collectors if collector else self._learners
        target = min(count, known + _MAX_RECONCILE)
        while known != target:
            up = known < target
            known += 1 if up else -1
            with self._cv:
                if collector:
                    self._collectors = known
                else:
                    self._learners = known
            if collector:
                self._call("deal_with_increase_collector" if up
                           else "deal_with_decrease_collector")
        self._call("on_capacity", kind, change, worker_id, count)

    def _on_reset(self, generation: int) -> None:
        """A new session began: the tasks of older sessions were cancelled by the broker."""
        with self._cv:
            gone = [t for t, rec in self._tasks.items() if rec.generation < generation]
            for t in gone:
                del self._tasks[t]
        for task_id in gone:
            self._call("on_task_cancelled", task_id, SESSION_LOST_REASON)

