"""The task handle a worker's handlers get: one attempt of a task (:class:`Task`).

A :class:`Task` is what ``run``, ``close`` and ``on_policy`` see: the task's id, attempt,
kind and info, whether to stop, and the calls that report to the broker (data, progress,
learning steps, policies, keep-alives) or ask it for a batch. It holds what the handler side
waits on (stop, abort, credit, replies) under its own condition variable, which the worker's
I/O thread updates and notifies; everything it sends goes through its worker
(:class:`TaskOwner`), which posts it to the I/O thread.

:func:`as_map` holds a user's map (meta, info, a result) to the limits the broker decodes a
body under, before anything is queued.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Mapping, Optional, Protocol, Set

from . import protocol as P
from ._types import Policy

__all__ = ["Task", "TaskOwner", "as_map"]

_MAX_NO_DATA_WAIT = 2.0  # the longest NO_DATA hint get_data obeys, in seconds
_DATA_USER_FIELDS = ("data_id", "buffer_id", "meta", "payload")


def as_map(value: Any, what: str) -> P.Raw:
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


class TaskOwner(Protocol):
    """What a :class:`Task` needs of its worker (:class:`rlbus.Worker`)."""

    role: str
    _stopping: bool  # the worker is closing: every attempt is over

    def _queue(self, name: str, fields: Dict[str, Any], task: "Task") -> bool:
        """Hands a message about ``task`` to the I/O thread; False once closing."""

    def _outbox_full(self) -> bool:
        """True while the messages waiting to be sent are at their bound."""

    def _check_size(self, name: str, body: bytes) -> None:
        """ValueError when ``body`` is past the broker's max-message."""

    def _count_credit_wait(self) -> None:
        """One emit waited for data credit."""


class Task:
    """One attempt of a task, as the handlers see it.

    Every member may be called from any thread (a handler may hand the task to threads of
    its own). The methods that report to the broker return False, and :meth:`get_data`
    returns None, once the attempt is over (aborted, finished, or the worker closing).
    """

    def __init__(self, worker: "TaskOwner", task_id: str, attempt: int, kind: str, info: Any,
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
        self._open: Set[int] = set()        # request ids get_data waits on
        self._replies: Dict[int, P.Message] = {}
        self._reask: Set[int] = set()       # open requests a lost connection may have lost

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
        checked = as_map(meta, "meta")
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
        fields = {"task_id": self.id, "attempt": self.attempt, "info": as_map(info, "info"),
                  "index": 1}
        P.check_body("INFO", fields, ("info",))
        return self._emit_item("INFO", fields)

    def _emit_item(self, name: str, fields: Dict[str, Any]) -> bool:
        """Sends a DATA or an INFO as the attempt's next indexed item: within its credit (it
        waits for more), numbered, kept by the I/O thread until confirmed."""
        w = self._w
        with self._cond:
            if self._live() and not self._has_credit():
                w._count_credit_wait()
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
            if w._queue(name, item, self):
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
                if not w._queue("GET_DATA", fields, self):
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
                  "info": as_map(info, "info"), "index": 1}
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
        return self._w._queue("POLICY", fields, self)

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
        return w._queue(name, fields, self)

    # ---- what the worker tells it (its I/O thread, its handler thread) -------------------

    def _wake(self) -> None:
        """Wakes whatever waits on the task (the worker is closing)."""
        with self._cond:
            self._cond.notify_all()

    def _request_close(self) -> None:
        """TASK_CLOSE: ``run`` winds down, then ``close`` gives the result."""
        with self._cond:
            self._close_requested = True
            self._cond.notify_all()

    def _abort(self, reason: str) -> None:
        """The broker takes nothing more from this attempt (the first reason stays)."""
        with self._cond:
            if not self._aborted:
                self._aborted = True
                self._abort_reason = reason
            self._cond.notify_all()

    def _end(self) -> None:
        """The handler is done with the attempt: nothing more is sent from it."""
        with self._cond:
            self._over = True
            self._cond.notify_all()

    def _running(self) -> bool:
        """True while the attempt is live (not aborted, not over, the worker not closing)."""
        with self._cond:
            return self._live()

    def _dropped(self) -> bool:
        """True when the broker will take no outcome of this attempt (it was aborted, or the
        worker is closing)."""
        with self._cond:
            return self._aborted or self._w._stopping

    def _wait_close(self) -> bool:
        """Waits until the broker asks to close the attempt or the attempt is dropped; True
        when ``close`` may run."""
        with self._cond:
            self._cond.wait_for(lambda: self._close_requested or self._aborted
                                or self._w._stopping)
            return not (self._aborted or self._w._stopping)

    def _set_credit(self, limit: int) -> None:
        """DATA_CREDIT: the index the attempt's items may go up to."""
        with self._cond:
            self._credit = limit
            self._cond.notify_all()

    def _answer(self, msg: P.Message) -> None:
        """A LEARN or NO_DATA: kept for the get_data waiting on its request, if one does."""
        with self._cond:
            if msg["request_id"] in self._open:
                self._replies[msg["request_id"]] = msg
                self._cond.notify_all()

    def _reask_stale(self, unsent: Set[int]) -> None:
        """After a resumed session: the open requests but ``unsent`` (still in the outbox)
        and those answered may have gone down with the old connection; get_data asks again
        for those."""
        with self._cond:
            stale = self._open - unsent - set(self._replies)
            if stale:
                self._reask |= stale
                self._cond.notify_all()

    def _update_policy(self, p: Policy) -> bool:
        """POLICY_UPDATE for the running attempt: True when ``p`` replaced the policy held
        (a newer version, or another policy)."""
        with self._cond:
            old = self._policy
            newer = old is None or old.id != p.id or old.version < p.version
            if newer:
                self._policy = p
            return newer

    def _start_with(self, p: Policy) -> None:
        """POLICY_UPDATE for an attempt not begun yet: it starts with the newest version."""
        with self._cond:
            if self._policy is None or self._policy.version < p.version:
                self._policy = p
