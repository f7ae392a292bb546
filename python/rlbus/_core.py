"""The client core every role builds on: the I/O thread, the queue of calls posted to it and
the pipe that wakes it, its timers, and the connection state other threads see (``state``,
:meth:`Core.wait_for`, ``last_error``, the count of WELCOMEs).

The I/O thread drives one :class:`~rlbus._session.Session` (HELLO/WELCOME, heartbeats,
reconnects: the session layer). Everything above that (task messages, the coordinator's
stream) belongs to a *handler*, an object whose optional methods the I/O thread calls:

- ``on_ready(welcome)`` after each WELCOME that makes the session ready; ``welcome["resumed"]``
  is false when the broker began a new session (state tied to the old one is gone);
- ``on_message(msg)`` for every other message from the broker, except HEARTBEAT and
  DISCONNECT, including ERRORs that are not about HELLO; a DELIVER comes with its payload
  frame as ``msg.payload``;
- ``on_state(state, detail)`` on every change of :attr:`Core.state`;
- ``on_close()`` once, while closing, before DISCONNECT is sent;
- ``on_idle()`` after each turn of the loop (posted calls, at most a burst of messages,
  timers), before the thread waits again: where a handler hands on, in one go, what that
  turn gave it.

Other threads talk to the I/O thread only through :meth:`Core.post`; handler methods,
posted functions and timers may call :meth:`Core.send` and :meth:`Core.call_later`.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Any, Callable, Deque, List, Mapping, Optional, Tuple

import zmq

from . import protocol as P
from ._keys import CurveKeys
from ._session import (CONNECTING, HEARTBEAT, READY, RECONNECT_MAX, RECONNECT_MIN, STATES, STOPPED,
                       Session)

log = logging.getLogger("rlbus")


class Timer:
    """A pending call on the I/O thread; :meth:`cancel` keeps it from running."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Core:
    """One connection to the broker and the I/O thread that drives it.

    Construction validates the options (ValueError naming the bad one; ``heartbeat`` and
    the reconnect bounds are seconds) and touches no network; :meth:`start` starts the
    thread, which connects and says HELLO."""

    def __init__(self, endpoint: Optional[str], role: str, id: str, handler: Any, *,
                 resources: Optional[Mapping[str, float]] = None, heartbeat: float = HEARTBEAT,
                 reconnect_min: float = RECONNECT_MIN, reconnect_max: float = RECONNECT_MAX,
                 curve: Optional[CurveKeys] = None,
                 context: Optional["zmq.Context[Any]"] = None) -> None:
        self._session = Session(endpoint, role, id, on_state=self._set_state,
                                on_welcome=self._welcomed,
                                on_message=getattr(handler, "on_message", None),
                                resources=resources, heartbeat=heartbeat,
                                reconnect_min=reconnect_min, reconnect_max=reconnect_max,
                                curve=curve)
        self.role = role
        self.id = id
        self.handler = handler
        self._own_context = context is None
        self._ctx = context if context is not None else zmq.Context()

        self._cond = threading.Condition()
        self._state = CONNECTING
        self.welcomes = 0
        self.last_error = ""

        # posting from other threads: a queue and a pipe that wakes the I/O thread
        self._posted: Deque[Callable[[], None]] = collections.deque()
        self._post_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._closing = False
        self._thread: Optional[threading.Thread] = None

        # I/O thread state
        self._timers: List[Tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._stop = False

    # ---- any thread ------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``connecting`` (before the first WELCOME), ``ready``, ``reconnecting``,
        ``refused`` (the broker will not have us: see :attr:`last_error`) or ``stopped``."""
        return self._state

    @property
    def token(self) -> int:
        """The broker's session token, 0 before the first WELCOME."""
        return self._session.token

    @property
    def epoch(self) -> Optional[int]:
        """The broker's epoch from the last WELCOME (None before it)."""
        return self._session.epoch

    @property
    def max_message(self) -> int:
        """The broker's max-message from the last WELCOME (0 before it: not known)."""
        return self._session.max_message

    def wait_for(self, state: str, timeout: float) -> bool:
        """Waits until :attr:`state` is ``state``; false if ``timeout`` seconds pass."""
        if state not in STATES:
            raise ValueError(f"state: expected one of {', '.join(STATES)}, got {state!r}")
        with self._cond:
            return self._cond.wait_for(lambda: self._state == state, timeout)

    def start(self) -> None:
        """Starts the I/O thread; it connects and sends HELLO."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"rlbus-io-{self.id}",
                                        daemon=True)
        self._thread.start()

    def post(self, fn: Callable[[], None]) -> bool:
        """Runs ``fn()`` on the I/O thread, after everything posted before it. False once
        the core is closing (``fn`` will not run)."""
        with self._post_lock:
            if self._closing:
                return False
            was_empty = not self._posted
            self._posted.append(fn)
            if was_empty:
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:  # pragma: no cover - the pipe is already full
                    pass
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Calls the handler's ``on_close`` on the I/O thread, says DISCONNECT 200 when
        ready, closes the socket and joins the I/O thread. Idempotent. No handler method
        runs after this returns."""
        with self._post_lock:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
                self._posted.append(self._shutdown)
                os.write(self._wake_w, b"x")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout + 1.0)
        if not already:
            if thread is None:  # never started: nothing ran, nothing to say
                self._set_state(STOPPED, "")
            self._release()

    def _release(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return  # still running past the timeout: it releases nothing; leave it be
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._own_context:
            self._ctx.term()

    # ---- I/O thread ------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._session.ready

    def send(self, name: str, fields: Mapping[str, Any], payload: Any = None) -> bool:
        """I/O thread only: sends one message now if the session is ready; False (nothing
        queued) when it is not, or when the socket's queue is full. ``payload``: the third
        frame of a message that has one (PUBLISH), bytes-like."""
        return self._session.send(name, fields, payload)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        """I/O thread only: runs ``fn`` on the I/O thread ``delay_s`` seconds from now."""
        t = Timer(time.monotonic() + max(0.0, delay_s), fn)
        heapq.heappush(self._timers, (t.when, next(self._seq), t))
        return t

    def _call(self, method: str, *args: Any) -> None:
        fn = getattr(self.handler, method, None)
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # a handler bug must not end the connection
            log.exception("%s %s: %s raised", self.role, self.id, method)

    def _set_state(self, state: str, detail: str) -> None:
        with self._cond:
            changed = state != self._state
            self._state = state
            if detail:
                self.last_error = detail
            self._cond.notify_all()
        if changed:
            self._call("on_state", state, detail)

    def _welcomed(self, welcome: P.Message) -> None:
        with self._cond:
            self.welcomes += 1
        self._set_state(READY, "")
        self._call("on_ready", welcome)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        registered: Optional["zmq.Socket[Any]"] = None
        idle = hasattr(self.handler, "on_idle")
        session = self._session
        try:
            session.start(self._ctx)
            while not self._stop:
                if idle:
                    self._call("on_idle")
                if registered is not session.socket:  # the socket was replaced or closed
                    if registered is not None:
                        poller.unregister(registered)
                    registered = session.socket
                    if registered is not None:
                        poller.register(registered, zmq.POLLIN)
                wait = max(0.0, self._next_wake() - time.monotonic())
                events = dict(poller.poll(int(wait * 1000) + 1))
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                self._run_posted()
                if self._stop:
                    break
                if registered is not None and registered is session.socket \
                        and registered in events:
                    session.on_readable()
                self._run_timers()
        except Exception:  # pragma: no cover - a bug here must be visible
            log.exception("%s %s: the I/O thread failed", self.role, self.id)
            session.stop("internal error in the I/O thread", goodbye=False)

    def _run_posted(self) -> None:
        while True:
            with self._post_lock:
                if not self._posted:
                    return
                batch = list(self._posted)
                self._posted.clear()
            for fn in batch:
                try:
                    fn()
                except Exception:
                    log.exception("%s %s: a posted call raised", self.role, self.id)
                if self._stop:
                    return

    def _next_wake(self) -> float:
        t = self._session.next_wake(time.monotonic())
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if self._timers:
            t = min(t, self._timers[0][0])
        return t

    def _run_timers(self) -> None:
        now = time.monotonic()
        self._session.on_timers(now)
        while self._timers and self._timers[0][0] <= now and not self._stop:
            _, _, t = heapq.heappop(self._timers)
            if t.cancelled:
                continue
            t.cancelled = True
            try:
                t.fn()
            except Exception:
                log.exception("%s %s: a timer raised", self.role, self.id)

    def _shutdown(self) -> None:
        self._call("on_close")
        self._timers.clear()
        self._stop = True
        self._session.stop()
