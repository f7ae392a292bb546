"""The Worker: a collector or learner process taking tasks from the rlbus broker.

A :class:`Worker` keeps one session with the broker (see :mod:`rlbus._session`: HELLO,
heartbeats, reconnects, resumption) and runs the tasks the broker assigns to it, one at a
time, with the user's handlers:

- ``run(task)`` does the work: a collector emits data and progress, a learner asks for
  batches and reports what each step did. It returns when done or when the task is told to
  stop (``task.stop_requested``).
- ``close(task)`` gives the final result (a dict) once ``run`` returned and the broker asked
  to close the task (TASK_CLOSE). It is not called when the attempt was aborted.
- ``on_policy(task, policy)`` (optional) hears of each newer version of the task's policy.

Threads. All socket work happens on the session's I/O thread; the task's bookkeeping that
the protocol needs (what was sent, what the broker confirmed, what waits to be sent) lives
there too and is only touched by functions posted to it. ``run`` and ``close`` run on the
worker's handler thread, ``on_policy`` on its policy thread (only started when an
``on_policy`` is given), never on the I/O thread, so long handlers do not stop heartbeats.
The :class:`Task` object holds what the handler side waits on (stop, abort, credit, replies)
under its own condition variable, which the I/O thread updates and notifies.

Reliable data (SPEC §12.11): every DATA carries its index within the attempt; what was sent
and is not yet confirmed by DATA_ACK is kept (within ``max_unconfirmed_data`` items and
``max_unconfirmed_bytes``) and sent again after the session resumes, or when the broker
asks; the broker drops duplicates. What had to be let go of is declared with DATA_LOST at
the next resend, so a loss is reported to the coordinator and never silent.
"""

from __future__ import annotations

import collections
import logging
import queue
import signal
import threading
import time
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Tuple

from . import protocol as P
from ._core import Core
from ._keys import CurveKeys
from ._types import Policy, TaskFailure

__all__ = ["Worker", "Task"]

log = logging.getLogger("rlbus.worker")

_MAX_NO_DATA_WAIT = 2.0     # the longest NO_DATA hint get_data obeys, in seconds
_MAX_OUTBOX = 100_000       # messages waiting for the session to be ready
_MAX_CREDIT_ENTRIES = 16    # attempts whose DATA_CREDIT is remembered
_MAX_REASON = 1024          # bytes of a TASK_FAILED reason
_RETRY_SEND_S = 0.01        # a full socket queue is tried again after this
_SLOW_HANDLER_WARN_S = 5.0  # close() says so when a handler takes this long to stop

# Batched data (SPEC §12.12.5): DATA that wait together leave as one DATA_BATCH of at most
# this many items and bytes of items (an item's keys counted at _ITEM_OVERHEAD); a meta
# deeper than _BATCH_NESTING goes alone.
_BATCH_ITEMS = 1024
_BATCH_BYTES = 64 * 1024
_ITEM_OVERHEAD = 48
_BATCH_NESTING = 12

_Out = Tuple[str, Dict[str, Any], Optional["Task"]]  # (message, fields, task it is about)


def _uint_len(v: int) -> int:
    """Bytes of a uint in its smallest msgpack form."""
    return 1 if v < 0x80 else 2 if v < 0x100 else 3 if v < 0x10000 else 5 if v < 2 ** 32 else 9


_TASK_KEY = len(P.pack_value("task_id"))
_ATTEMPT_KEY = len(P.pack_value("attempt"))
_INDEX_KEY = len(P.pack_value("index"))


def _item_of(data: P.Encoded, head: int) -> bytes:
    """The DATA_BATCH item a DATA stands for, cut from the DATA's canonical body: its fields
    but task_id, attempt (the first two, ``head`` bytes with the map's header, the same for
    every DATA of an attempt) and index (the last), under a header of 3 fewer."""
    body = data.body
    tail = _INDEX_KEY + _uint_len(data["index"])
    return bytes((body[0] - 3,)) + body[head:len(body) - tail]


def _cut(text: str, limit: int = _MAX_REASON) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def _as_map(value: Any, what: str) -> P.Raw:
    """A dict (or a Raw already holding a msgpack map) as opaque user data, held to the
    limits the broker decodes a body under (SPEC §5.1: nesting, sizes of str, bin, arrays
    and maps): ValueError naming ``what`` otherwise, since the broker would refuse the
    message and count it against the session."""
    try:
        if isinstance(value, P.Raw):
            if not value or not (0x80 <= value[0] <= 0x8F or value[0] in (0xDE, 0xDF)):
                raise ValueError(f"{what}: expected a msgpack map")
            P.unpack_value(value, depth=2)  # as one field of a message body
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{what}: expected a dict, got {type(value).__name__}")
        return P.user_map(value)
    except P.ProtocolError as e:
        raise ValueError(f"{what}: {e.reason}") from None
    except (TypeError, ValueError, OverflowError) as e:
        if str(e).startswith(what + ":"):
            raise
        raise ValueError(f"{what}: cannot be encoded as msgpack: {e}") from None
    except Exception as e:  # the decoder's own limits (a value past 1 MiB)
        raise ValueError(f"{what}: cannot be checked: {e!r}") from None


_DATA_USER_FIELDS = ("data_id", "buffer_id", "meta", "payload")
# the messages of an attempt's indexed sequence (SPEC §12.11.10)
_INDEXED = ("DATA", "INFO", "LEARN_INFO")


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


class Task:
    """One attempt of a task, as the handlers see it.

    Every member may be called from any thread (a handler may hand the task to threads of
    its own). The methods that report to the broker return False, and :meth:`get_data`
    returns None, once the attempt is over (aborted, finished, or the worker closing).
    """

    def __init__(self, worker: "Worker", task_id: str, attempt: int, kind: str, info: Any,
                 policy: Optional[Policy]) -> None:
        #: The task id the coordinator chose.
        self.id: str = task_id
        #: This attempt's number (1 for the first assignment).
        self.attempt: int = attempt
        #: ``collector`` or ``learner``.
        self.kind: str = kind
        #: The coordinator's task_info, decoded (int keys are kept).
        self.info: Any = info
        self._w = worker
        self._cond = threading.Condition()
        # guarded by _cond; written by the I/O thread (and the handler thread for _over)
        self._policy = policy
        self._close_requested = False
        self._aborted = False
        self._abort_reason = ""
        self._over = False
        self._credit: Optional[int] = None  # DATA_CREDIT limit; None: no credit applies
        self._emitted = 0                   # DATA emitted so far: the last index given
        self._next_request = 0
        self._open: set = set()             # request ids get_data waits on
        self._replies: Dict[int, P.Message] = {}
        self._reask: set = set()            # open requests a lost connection may have lost

    def __repr__(self) -> str:
        return f"Task(id={self.id!r}, attempt={self.attempt}, kind={self.kind!r})"

    # ---- state (caller holds _cond) ---------------------------------------------------

    def _live(self) -> bool:
        return not (self._aborted or self._over or self._w._stopping)

    def _stopped(self) -> bool:
        return self._close_requested or not self._live()

    def _has_credit(self) -> bool:
        return self._credit is None or self._emitted < self._credit

    # ---- what the handler asks ---------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """True once the broker asked to close the task, aborted it, or the worker is
        closing: wind down and return from ``run``."""
        with self._cond:
            return self._stopped()

    @property
    def aborted(self) -> bool:
        """True when the attempt was aborted (timeout, cancel, the broker lost it): nothing
        more from it is accepted, and ``close`` will not be called."""
        with self._cond:
            return self._aborted

    @property
    def abort_reason(self) -> str:
        """Why the attempt was aborted ("" when it was not)."""
        with self._cond:
            return self._abort_reason

    def wait_stop(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until :attr:`stop_requested` (or :attr:`aborted`); False if ``timeout_s``
        seconds pass first."""
        with self._cond:
            return self._cond.wait_for(self._stopped, timeout_s)

    def policy(self) -> Optional[Policy]:
        """The latest version of the task's policy known to this attempt: its TASK_START's,
        then each newer one the broker pushed (POLICY_UPDATE); None when there is none."""
        with self._cond:
            return self._policy

    # ---- collector ----------------------------------------------------------------------

    def emit_data(self, data_id: str, buffer_id: str, meta: Mapping[str, Any],
                  payload: Optional[bytes] = None) -> bool:
        """Reports one data item (DATA): its id, the buffer it goes to, its metadata and,
        optionally, the data itself inline.

        When the broker applies data credit to the attempt (its coordinator acknowledges its
        stream) and the credit is used up, this waits until more comes, the task is closed or
        the attempt ends: a slow coordinator slows its collectors down. Returns False when
        nothing was sent (the attempt is over, or no credit came before TASK_CLOSE).
        Raises ValueError when the fields cannot travel (for example ``meta`` not a dict),
        or on a learner task.
        """
        self._need("collector", "emit_data")
        checked = _as_map(meta, "meta")
        fields: Dict[str, Any] = {
            "task_id": self.id, "attempt": self.attempt, "data_id": data_id,
            "buffer_id": buffer_id,
            # a dict travels as the value it was checked as (one msgpack call writes the
            # whole body); bytes the caller gave as a Raw travel as they are
            "meta": checked if isinstance(meta, P.Raw) else checked.value(),
            "payload": bytes(payload) if payload is not None else None, "index": 1}
        # the caller's fields are checked here, not on the I/O thread (the task's own are
        # the broker's, and the index and version are ours)
        P.check_body("DATA", fields, _DATA_USER_FIELDS)
        return self._emit_item("DATA", fields)

    def emit_info(self, info: Mapping[str, Any]) -> bool:
        """Reports progress (INFO), e.g. ``{"collector_done": True}``. False when nothing was
        sent (the attempt is over, or no credit came before TASK_CLOSE). ValueError on a
        learner task.

        An INFO is an item of the attempt's DATA sequence (SPEC §12.11.10): it waits for
        credit as :meth:`emit_data` does, and is sent again after a resumed session until the
        broker confirms it, so a "done" is not lost with a broken connection."""
        self._need("collector", "emit_info")
        fields = {"task_id": self.id, "attempt": self.attempt, "info": _as_map(info, "info"),
                  "index": 1}
        P.check_body("INFO", fields, ("info",))
        return self._emit_item("INFO", fields)

    def _emit_item(self, name: str, fields: Dict[str, Any]) -> bool:
        """Sends a DATA or an INFO as the attempt's next indexed item: within its credit (it
        waits for more), numbered, kept by the I/O thread until confirmed."""
        w = self._w
        with self._cond:
            if self._live() and not self._has_credit():
                with w._lock:
                    w._credit_waits += 1
                self._cond.wait_for(
                    lambda: not self._live() or self._close_requested or self._has_credit())
            if not self._live() or not self._has_credit() or w._outbox_full():
                return False
            if name == "DATA" and self._policy is not None:
                fields["policy_version"] = self._policy.version
            fields["index"] = self._emitted + 1
            # encoded once, here: the I/O thread and any resend after a resume send this body
            item = P.Encoded(name, fields, check=False)
            w._check_size(name, item.body)
            self._emitted += 1
            # posted under the lock, so that items from several threads leave in index order
            if w._post(lambda: w._io_queue(name, item, self)):
                return True
            self._emitted -= 1
            return False

    # ---- learner ------------------------------------------------------------------------

    def get_data(self, buffer_id: str, batch_size: int, cur_learner_iter: int,
                 timeout: float = 60.0) -> Any:
        """Asks the coordinator for a batch (GET_DATA) and waits for it; returns the decoded
        batch, or None when the task stops or ``timeout`` seconds pass.

        While the coordinator has no batch (NO_DATA), this waits the ``retry_ms`` it names
        (at most 2 s, never past ``timeout``) and asks again. After the session resumed on a
        new connection it asks again at once if the request was sent on the old one (the
        request or its answer may have been lost with it). ValueError on a collector task.
        """
        self._need("learner", "get_data")
        w = self._w
        deadline = time.monotonic() + max(0.0, float(timeout))
        base = {"task_id": self.id, "attempt": self.attempt, "request_id": 0,
                "buffer_id": buffer_id, "batch_size": batch_size,
                "cur_learner_iter": cur_learner_iter}
        P.encode_body("GET_DATA", base)
        while True:
            with self._cond:
                if self._stopped() or w._outbox_full():
                    return None
                self._next_request += 1
                rid = self._next_request
                self._open.add(rid)
            try:
                fields = dict(base, request_id=rid)
                if not w._post(lambda: w._io_queue("GET_DATA", fields, self)):
                    return None
                with self._cond:
                    self._cond.wait_for(
                        lambda: rid in self._replies or rid in self._reask or self._stopped(),
                        max(0.0, deadline - time.monotonic()))
                    reply = self._replies.pop(rid, None)
                    if reply is None:
                        if rid in self._reask and not self._stopped() \
                                and time.monotonic() < deadline:
                            continue  # the request or its answer went down with a connection
                        return None
                    if reply.name == "LEARN":
                        data = reply["data"]
                        break
                    wait = min(_MAX_NO_DATA_WAIT, reply["retry_ms"] / 1000.0,
                               max(0.0, deadline - time.monotonic()))
                    self._cond.wait_for(self._stopped, wait)
                if time.monotonic() >= deadline:
                    return None
            finally:
                with self._cond:
                    self._open.discard(rid)
                    self._replies.pop(rid, None)
                    self._reask.discard(rid)
        return data.value() if isinstance(data, P.Raw) else data

    def emit_learn_info(self, buffer_id: str, info: Mapping[str, Any]) -> bool:
        """Reports what one learning step did (LEARN_INFO), e.g. ``{"learner_done": True}``.
        False when nothing was sent (the attempt is over). ValueError on a collector task.
        Numbered within the attempt, it is sent again after a resumed session until the
        broker confirms it (SPEC §12.11.10)."""
        self._need("learner", "emit_learn_info")
        fields = {"task_id": self.id, "attempt": self.attempt, "buffer_id": buffer_id,
                  "info": _as_map(info, "info"), "index": 1}
        P.check_body("LEARN_INFO", fields, ("buffer_id", "info"))
        # numbered, kept and sent again like a collector's DATA (§12.11.10); no credit
        return self._emit_item("LEARN_INFO", fields)

    def publish_policy(self, policy_id: str, version: int, params: Optional[bytes] = None,
                       ref: Optional[str] = None) -> bool:
        """Publishes version ``version`` of policy ``policy_id`` (POLICY), inline
        (``params``) or as a reference (``ref``): exactly one of them. Versions must grow;
        the broker refuses an older or equal one (see :attr:`Worker.last_error`). Only a
        learner publishes. False when the attempt is over."""
        if (params is None) == (ref is None):
            raise ValueError("publish_policy: give exactly one of params and ref")
        if self._w.role != "learner":
            raise ValueError("publish_policy: only a learner publishes policies")
        fields = {"policy_id": policy_id, "version": version,
                  "params": bytes(params) if params is not None else None, "ref": ref}
        P.encode_body("POLICY", fields)
        with self._cond:
            if not self._live():
                return False
        return self._w._post(lambda: self._w._io_queue("POLICY", fields, self))

    # ---- both ---------------------------------------------------------------------------

    def keep_alive(self) -> bool:
        """Tells the broker the attempt is still being worked on (TASK_ALIVE), for work that
        lasts longer than the step timeout (or the start timeout) without other progress: the
        broker moves the deadline a full timeout on. It never extends the task timeout.
        False when nothing was sent (the attempt is over or closing)."""
        return self._progress("TASK_ALIVE", {"task_id": self.id, "attempt": self.attempt})

    def _need(self, kind: str, what: str) -> None:
        # the broker would refuse the message (408) and count it against the session
        if self.kind != kind:
            raise ValueError(f"{what}: only a {kind} task does that; this is a {self.kind} task")

    def _progress(self, name: str, fields: Dict[str, Any]) -> bool:
        w = self._w
        w._check_size(name, P.encode_body(name, fields))
        with self._cond:
            # after TASK_CLOSE the broker refuses progress (408): nothing is sent
            if self._stopped() or w._outbox_full():
                return False
        return w._post(lambda: w._io_queue(name, fields, self))


class _Attempt:
    """The I/O thread's record of the attempt the handler runs: what reliable data needs."""

    __slots__ = ("task", "tracking", "kept", "kept_bytes", "confirmed", "dropped_upto")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.tracking = True  # False once the attempt ended: nothing is kept or resent
        # (index, message name, fields, body size) of each DATA or INFO sent, not confirmed
        self.kept: Deque[Tuple[int, str, Any, int]] = collections.deque()
        self.kept_bytes = 0
        self.confirmed = 0     # DATA_ACK relayed
        self.dropped_upto = 0  # the last index let go of before it was confirmed


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

    The constructor validates the options (ValueError naming the bad one), starts the
    threads and returns at once: it never waits for the network. :meth:`close` leaves the
    broker and joins every thread the worker started; the worker is a context manager too.

    ``leave_on_sigterm=S`` (seconds; the constructor must then run on the main thread) makes
    SIGTERM call :meth:`leave` with ``S``: the usual notice of a preempted machine or of a
    cluster scheduler. The process then goes on; wait with :meth:`wait_idle` and close.

    ``curve=rlbus.curve_keys_from_files("me.key", "broker.pub")`` connects with CURVE, to a
    broker that has it on; without it the connection is plain.

    ``batch_data`` (on by default, SPEC §12.12): the DATA that one turn of the I/O thread
    finds waiting together leave as one DATA_BATCH of up to 1024 items and 64 KiB; a DATA
    emitted alone leaves alone, at once. The coordinator's callbacks see the same items either
    way. Off, every DATA travels alone (for a broker older than batched data).
    """

    def __init__(self, endpoint: str, role: str, id: str, run: Callable[[Task], Any],
                 close: Optional[Callable[[Task], Optional[Mapping[str, Any]]]] = None,
                 on_policy: Optional[Callable[[Task, Policy], Any]] = None,
                 resources: Optional[Mapping[str, float]] = None, heartbeat_ms: int = 1000,
                 reconnect_min: float = 0.1, reconnect_max: float = 5.0,
                 max_unconfirmed_data: int = 4096,
                 max_unconfirmed_bytes: int = 16 << 20,
                 leave_on_sigterm: Optional[float] = None,
                 curve: Optional[CurveKeys] = None, batch_data: bool = True) -> None:
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
                          heartbeat_ms=heartbeat_ms, reconnect_min=reconnect_min,
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
            with running._cond:
                running._cond.notify_all()
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
            with task._cond:
                task._over = True
                task._cond.notify_all()
            with self._lock:
                self._handler_task = None
                if self._stopping:
                    return  # leaving: the broker ends the attempt with our session
            self._post(lambda: self._io_done(task, outcome))

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
            with task._cond:
                task._cond.wait_for(lambda: task._close_requested or task._aborted
                                    or self._stopping)
                if task._aborted or self._stopping:
                    return None
            try:
                value = self._close(task) if self._close is not None else None
                result = _as_map({} if value is None else value, "close() result")
                self._check_size("RESULT", P.encode_body(
                    "RESULT", {"task_id": task.id, "attempt": task.attempt, "result": result}))
            except TaskFailure as e:
                failure = (e.reason, e.result)
            except BaseException as e:  # noqa: BLE001
                failure = (str(e) or type(e).__name__, None)
                log.warning("worker %s: task %s attempt %d: close raised", self.id, task.id,
                            task.attempt, exc_info=True)
        with task._cond:
            if task._aborted or self._stopping:
                return None  # the broker takes nothing more from this attempt
        if failure is None:
            return ("RESULT", {"task_id": task.id, "attempt": task.attempt, "result": result},
                    None)
        reason, fresult = failure
        fields: Dict[str, Any] = {"task_id": task.id, "attempt": task.attempt,
                                  "reason": _cut(str(reason))}
        if fresult is not None:
            try:
                fields["result"] = _as_map(fresult, "TaskFailure.result")
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
            with task._cond:
                if not task._live():
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
            mine = a is not None and a.task is task and a.tracking
            if mine and ((name in _INDEXED and fields["index"] <= a.confirmed)
                         or (name == "DATA_LOST" and fields["last"] <= a.confirmed)):
                self._outbox.popleft()  # confirmed meanwhile: nothing to send
                continue
            if name == "DATA" and mine and self._batch_data:
                n = self._batchable()
                if n > 1:
                    if not self._send_batch(n, a):
                        return
                    continue
            try:
                sent = s.send(name, fields)
            except Exception:  # noqa: BLE001 - a message that cannot be encoded is dropped
                log.exception("worker %s: %s could not be sent; dropped", self.id, name)
                self._outbox.popleft()
                continue
            if not sent:
                if s.ready and self._retry_timer is None:  # the socket's queue is full
                    self._retry_timer = s.call_later(_RETRY_SEND_S, self._io_retry)
                return
            self._outbox.popleft()
            if mine and name in _INDEXED:
                self._keep(a, name, fields)

    def _batchable(self) -> int:
        """How many DATA at the front of the outbox can share one DATA_BATCH: consecutive
        indexes of one attempt, within the bounds, each meta shallow enough."""
        n = 0
        size = 0
        limit = _BATCH_BYTES
        if self._core.max_message:
            limit = min(limit, self._core.max_message // 2)
        first = self._outbox[0]
        for name, fields, task in self._outbox:
            if name != "DATA" or task is not first[2] or n == _BATCH_ITEMS \
                    or fields["index"] != first[1]["index"] + n:
                break
            size += len(fields.body) + _ITEM_OVERHEAD
            meta = fields["meta"]
            if size > limit or P.nesting(meta.value() if isinstance(meta, P.Raw) else meta) \
                    > _BATCH_NESTING:
                break
            n += 1
        return n

    def _send_batch(self, n: int, a: _Attempt) -> bool:
        """Sends the first ``n`` DATA of the outbox as one DATA_BATCH; False when the
        socket's queue is full (they stay)."""
        first = self._outbox[0][1]
        head = 1 + _TASK_KEY + len(P.pack_value(first["task_id"])) + _ATTEMPT_KEY + \
            _uint_len(first["attempt"])
        items = [_item_of(self._outbox[i][1], head) for i in range(n)]
        header = bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
        batch = P.Encoded("DATA_BATCH", {
            "task_id": first["task_id"], "attempt": first["attempt"],
            "first_index": first["index"], "items": P.Raw(header + b"".join(items))},
            check=False)
        s = self._core
        if not s.send("DATA_BATCH", batch):
            if s.ready and self._retry_timer is None:  # the socket's queue is full
                self._retry_timer = s.call_later(_RETRY_SEND_S, self._io_retry)
            return False
        self._data_batches += 1
        self._data_batched += n
        for _ in range(n):
            name, fields, _task = self._outbox.popleft()
            self._keep(a, name, fields)
        return True

    def _io_retry(self) -> None:
        self._retry_timer = None
        self._io_flush()

    def _keep(self, a: _Attempt, name: str, fields: Any) -> None:
        """A DATA or INFO just sent is kept until confirmed, within the bounds."""
        size = len(P.encode_body(name, fields))  # the body it was sent as
        a.kept.append((fields["index"], name, fields, size))
        a.kept_bytes += size
        while len(a.kept) > self._max_items or (a.kept_bytes > self._max_bytes
                                                and len(a.kept) > 1):
            index, _, _, gone = a.kept.popleft()
            a.kept_bytes -= gone
            a.dropped_upto = index
            self._data_dropped += 1

    def _confirm(self, a: _Attempt, relayed: int) -> None:
        a.confirmed = max(a.confirmed, relayed)
        while a.kept and a.kept[0][0] <= a.confirmed:
            a.kept_bytes -= a.kept.popleft()[3]

    def _resend(self, a: _Attempt) -> None:
        """The broker may lack what was sent and not confirmed: all of it goes again, ahead
        of what was never sent, after a DATA_LOST for what was let go of (§12.11.8)."""
        front: list = []
        if a.dropped_upto > a.confirmed:
            front.append(("DATA_LOST", {"task_id": a.task.id, "attempt": a.task.attempt,
                                        "first": a.confirmed + 1, "last": a.dropped_upto},
                          a.task))
        front.extend((name, fields, a.task) for _, name, fields, _ in a.kept)
        self._data_resent += len(a.kept)
        a.kept.clear()
        a.kept_bytes = 0
        self._outbox.extendleft(reversed(front))

    def _reask_open(self, t: Task) -> None:
        """After a resumed session: a GET_DATA sent on the old connection, or the LEARN /
        NO_DATA answering it, may have gone down with it, and nothing would come; get_data
        asks again for those (the broker's open request is replaced by the new one)."""
        unsent = {f["request_id"] for n, f, task in self._outbox
                  if n == "GET_DATA" and task is t}
        with t._cond:
            stale = t._open - unsent - set(t._replies)
            if stale:
                t._reask |= stale
                t._cond.notify_all()

    def _end_attempt(self, a: _Attempt, reason: str) -> None:
        """The broker takes nothing more of attempt ``a``: the handler is told (aborted) and
        whatever waits or is kept for it is forgotten."""
        a.tracking = False
        a.kept.clear()
        a.kept_bytes = 0
        t = a.task
        self._outbox = collections.deque(m for m in self._outbox if m[2] is not t)
        with t._cond:
            if not t._aborted:
                t._aborted = True
                t._abort_reason = reason
            t._cond.notify_all()

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
                with a.task._cond:
                    a.task._close_requested = True
                    a.task._cond.notify_all()
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
                t = a.task
                with t._cond:
                    if msg["request_id"] in t._open:
                        t._replies[msg["request_id"]] = msg
                        t._cond.notify_all()
        elif name == "POLICY_UPDATE":
            a = self._current(msg)
            p = _policy_of(msg)
            nxt = self._waiting(msg) if a is None else None
            if p is not None and nxt is not None:
                with nxt._cond:  # not begun yet: it starts with this version
                    if nxt._policy is None or nxt._policy.version < p.version:
                        nxt._policy = p
            if a is not None and p is not None:
                t = a.task
                with t._cond:
                    old = t._policy
                    newer = old is None or old.id != p.id or old.version < p.version
                    if newer:
                        t._policy = p
                if newer and self._on_policy is not None:
                    with self._lock:
                        self._policy_slot = (t, p)
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
                with a.task._cond:
                    a.task._credit = limit
                    a.task._cond.notify_all()
        elif name == "DATA_ACK":
            a = self._current(msg)
            if a is not None and a.tracking:
                self._confirm(a, msg["relayed"])
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
        self._cur = _Attempt(task)
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
