"""The client core every role builds on: one DEALER connection to the broker, driven by one
I/O thread that the session owns.

The session speaks the session layer of protocol v1 (HELLO/WELCOME, heartbeats, DISCONNECT,
the refusals of HELLO), notices a silent broker, reconnects with capped exponential backoff
and jitter, and resumes its session with the token when the broker still holds it. Everything
above that (task messages, the coordinator's stream) belongs to a *handler*, an object whose
optional methods the I/O thread calls:

- ``on_ready(welcome)`` after each WELCOME that makes the session ready; ``welcome["resumed"]``
  is false when the broker began a new session (state tied to the old one is gone);
- ``on_message(msg)`` for every other message from the broker, except HEARTBEAT and
  DISCONNECT, including ERRORs that are not about HELLO;
- ``on_state(state, detail)`` on every change of :attr:`Session.state`;
- ``on_close()`` once, while closing, before DISCONNECT is sent;
- ``on_idle()`` after each turn of the loop (posted calls, at most a burst of messages,
  timers), before the thread waits again: where a handler hands on, in one go, what that
  turn gave it.

Other threads talk to the I/O thread only through :meth:`Session.post`; handler methods,
posted functions and timers may call :meth:`Session.send` and :meth:`Session.call_later`.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import random
import threading
import time
from typing import Any, Callable, Deque, List, Mapping, Optional, Tuple

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol as P
from ._keys import CurveKeys

log = logging.getLogger("rlbus")

CONNECTING = "connecting"
READY = "ready"
RECONNECTING = "reconnecting"
REFUSED = "refused"
STOPPED = "stopped"
STATES = (CONNECTING, READY, RECONNECTING, REFUSED, STOPPED)

ROLES = ("collector", "learner", "coordinator")

# Error codes of SPEC §6 the session acts on.
_GOODBYE = 200
_NOT_READY = 403
_DUPLICATE_ID = 409
_EXPIRED = 410
_TOO_MANY_FAULTS = 429
_REPLACED = 430
_UNAUTHORIZED = 431
_BUSY = 503

_HELLO_ID = P.type_id("HELLO")
_GOODBYE_LINGER_MS = 500
_SEND_HWM = 10000
_NOBLOCK_MORE = zmq.NOBLOCK | zmq.SNDMORE
_COPY_BELOW = 65536  # bodies this small are copied into the message: cheaper than tracking
_SESSION_MESSAGES = frozenset(("WELCOME", "HEARTBEAT", "ERROR", "DISCONNECT"))
_READ_BURST = 256  # messages read per turn of the loop, so that a busy socket cannot
                   # hold back posted calls, timers and on_idle


class Timer:
    """A pending call on the I/O thread; :meth:`cancel` keeps it from running."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def check_options(endpoint: str, role: str, id: str, resources: Optional[Mapping[str, float]],
                  heartbeat_ms: int, reconnect_min: float, reconnect_max: float) -> None:
    """Raises ValueError naming the first bad option (the codec's rules for HELLO decide)."""
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise ValueError(f"endpoint: expected a ZeroMQ endpoint such as "
                         f"tcp://127.0.0.1:7235, got {endpoint!r}")
    if role not in ROLES:
        raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(heartbeat_ms, bool) or not isinstance(heartbeat_ms, int):
        raise ValueError(f"heartbeat_ms: expected an integer, got {heartbeat_ms!r}")
    for name, v in (("reconnect_min", reconnect_min), ("reconnect_max", reconnect_max)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name}: expected a positive number of seconds, got {v!r}")
    if reconnect_max < reconnect_min:
        raise ValueError(f"reconnect_max ({reconnect_max}) is below reconnect_min "
                         f"({reconnect_min})")
    fields = {"role": role, "id": id, "heartbeat_ms": heartbeat_ms,
              "resources": dict(resources or {})}
    try:
        P.encode("HELLO", fields)
    except P.ProtocolError as e:
        text = str(e.reason if hasattr(e, "reason") else e)
        for name in ("resources", "heartbeat_ms", "id"):
            if name in text:
                raise ValueError(f"{name}: {text}") from None
        raise ValueError(text) from None


class Session:
    """One DEALER connection to the broker and the I/O thread that drives it.

    Construction validates the options (ValueError naming the bad one) and touches no
    network; :meth:`start` starts the thread, which connects and says HELLO."""

    def __init__(self, endpoint: str, role: str, id: str, handler: Any, *,
                 resources: Optional[Mapping[str, float]] = None, heartbeat_ms: int = 1000,
                 reconnect_min: float = 0.1, reconnect_max: float = 5.0,
                 curve: Optional[CurveKeys] = None,
                 context: Optional[zmq.Context] = None) -> None:
        check_options(endpoint, role, id, resources, heartbeat_ms, reconnect_min,
                      reconnect_max)
        if curve is not None and not isinstance(curve, CurveKeys):
            raise ValueError(f"curve: expected rlbus.CurveKeys (see curve_keys_from_files), "
                             f"got {curve!r}")
        self.curve = curve
        self.endpoint = endpoint
        self.role = role
        self.id = id
        self.handler = handler
        self._on_message = getattr(handler, "on_message", None)
        self.resources = dict(resources or {})
        self.requested_heartbeat_ms = heartbeat_ms
        self.reconnect_min = float(reconnect_min)
        self.reconnect_max = float(reconnect_max)
        self._own_context = context is None
        self._ctx = context if context is not None else zmq.Context()

        self._cond = threading.Condition()
        self._state = CONNECTING
        self.token = 0
        self.epoch: Optional[int] = None
        self.max_message = 0
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
        self._sock: Optional[zmq.Socket] = None
        self._monitor: Optional[zmq.Socket] = None  # the socket's handshake failures
        self._heartbeat = heartbeat_ms / 1000.0
        self._liveness = 3
        self._attempt = 0
        self._revoked_detail = ""  # the DISCONNECT or ERROR 431 since the last WELCOME
        self._hello_deadline = 0.0
        self._next_heartbeat = 0.0
        self._broker_deadline = 0.0
        self._reconnect_at: Optional[float] = None
        self._timers: List[Tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._rng = random.Random()
        self._stop = False

    # ---- any thread ------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``connecting`` (before the first WELCOME), ``ready``, ``reconnecting``,
        ``refused`` (the broker will not have us: see :attr:`last_error`) or ``stopped``."""
        return self._state

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
        the session is closing (``fn`` will not run)."""
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
        return self._state == READY and self._sock is not None

    def send(self, name: str, fields: Mapping[str, Any]) -> bool:
        """I/O thread only: sends one message now if the session is ready; False (nothing
        queued) when it is not, or when the socket's queue is full."""
        if not self.ready:
            return False
        return self._send(name, fields)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        """I/O thread only: runs ``fn`` on the I/O thread ``delay_s`` seconds from now."""
        t = Timer(time.monotonic() + max(0.0, delay_s), fn)
        heapq.heappush(self._timers, (t.when, next(self._seq), t))
        return t

    def _send(self, name: str, fields: Mapping[str, Any]) -> bool:
        assert self._sock is not None
        head, body = P.encode(name, fields)
        sock = self._sock
        try:
            # frame by frame: pyzmq's send_multipart costs more than the send itself for
            # small messages. Once the first frame is queued the second always is (ZeroMQ
            # queues a message's frames together); large bodies are handed over uncopied.
            sock.send(head, _NOBLOCK_MORE)
            sock.send(body, zmq.NOBLOCK, copy=len(body) < _COPY_BELOW)
            return True
        except zmq.Again:
            log.warning("%s %s: send queue full, %s not sent", self.role, self.id, name)
            return False

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

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        registered: Optional[zmq.Socket] = None
        idle = hasattr(self.handler, "on_idle")
        try:
            self._open()
            while not self._stop:
                if idle:
                    self._call("on_idle")
                if registered is not self._sock:  # the socket was replaced or closed
                    if registered is not None:
                        poller.unregister(registered)
                    registered = self._sock
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
                if registered is not None and registered is self._sock and registered in events:
                    self._read()
                self._run_timers()
        except Exception:  # pragma: no cover - a bug here must be visible
            log.exception("%s %s: the I/O thread failed", self.role, self.id)
            self._close_socket()
            self._set_state(STOPPED, "internal error in the I/O thread")

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
        now = time.monotonic()
        t = now + 3600.0
        if self._reconnect_at is not None:
            t = min(t, self._reconnect_at)
        elif self._state == READY:
            t = min(t, self._next_heartbeat, self._broker_deadline)
        elif self._sock is not None:
            t = min(t, self._hello_deadline)
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if self._timers:
            t = min(t, self._timers[0][0])
        return t

    def _run_timers(self) -> None:
        now = time.monotonic()
        if self._reconnect_at is not None and now >= self._reconnect_at:
            self._reconnect_at = None
            self._open()
        elif self._sock is not None:
            if self._state != READY and now >= self._hello_deadline:
                why = f"no WELCOME within {self._hello_timeout():.1f} s"
                failure = self._handshake_failure()
                if failure:
                    log.warning("%s %s: %s", self.role, self.id, failure)
                    why += ": " + failure
                self._retry_later(why)
            elif self._state == READY:
                if now >= self._broker_deadline:
                    self._retry_later(f"broker silent for {self._silence():.1f} s")
                elif now >= self._next_heartbeat:
                    self._send("HEARTBEAT", {})
                    self._next_heartbeat = now + self._heartbeat
        while self._timers and self._timers[0][0] <= now and not self._stop:
            _, _, t = heapq.heappop(self._timers)
            if t.cancelled:
                continue
            t.cancelled = True
            try:
                t.fn()
            except Exception:
                log.exception("%s %s: a timer raised", self.role, self.id)

    def _hello_timeout(self) -> float:
        return max(1.0, self._liveness * self.requested_heartbeat_ms / 1000.0)

    def _silence(self) -> float:
        return max(1, self._liveness - 1) * self._heartbeat

    def _open(self) -> None:
        self._close_socket()
        s = self._ctx.socket(zmq.DEALER)
        s.linger = 0
        s.sndhwm = _SEND_HWM
        if self.curve is not None:
            self.curve.apply(s)
        # The broker's door refuses in the handshake, before any message: only the socket's
        # monitor hears of it, and it tells the user why no WELCOME comes.
        self._monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                             | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                             | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        s.connect(self.endpoint)
        self._sock = s
        fields: dict = {"role": self.role, "id": self.id,
                        "heartbeat_ms": self.requested_heartbeat_ms,
                        "resources": self.resources}
        if self.token:
            fields["session"] = self.token
        self._hello_deadline = time.monotonic() + self._hello_timeout()
        self._send("HELLO", fields)

    def _close_socket(self, linger: int = 0) -> None:
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(linger=0)
                self._monitor = None
            self._sock.close(linger=linger)
            self._sock = None

    def _handshake_failure(self) -> str:
        why = ""
        while self._monitor is not None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                why = (f"the broker refused the connection (ZAP status {event['value']}): "
                       + ("this peer's public key is not in its allowlist, or a connection "
                          "limit was reached" if self.curve is not None
                          else "a connection limit was reached"))
            elif self.curve is not None:
                why = ("the CURVE handshake failed: is the broker's public key right, and "
                       "does the broker speak CURVE?")
            else:
                why = "the handshake failed: does the broker expect CURVE keys?"
        return why

    def _revoked(self, detail: str) -> None:
        """Our key was revoked, or may not make our HELLO: the operator's to undo (an allowlist
        emptied for a moment, a key taken out by mistake), so not final. The session starts
        anew at the longest reconnect interval; :attr:`last_error` names the revocation until
        a WELCOME."""
        self.token = 0
        self._attempt = max(self._attempt, 30)  # straight to reconnect_max
        self._revoked_detail = detail
        self._retry_later(detail)

    def _retry_later(self, why: str) -> None:
        if self._revoked_detail and why != self._revoked_detail:
            why = f"{self._revoked_detail}; since then: {why}"
        self._close_socket()
        delay = min(self.reconnect_max, self.reconnect_min * (2 ** min(self._attempt, 30)))
        delay += self._rng.uniform(0.0, delay / 4)
        self._attempt += 1
        self._reconnect_at = time.monotonic() + delay
        log.info("%s %s: %s; reconnecting in %d ms", self.role, self.id, why, delay * 1000)
        self._set_state(RECONNECTING if self.welcomes else CONNECTING, why)

    def _read(self) -> None:
        for _ in range(_READ_BURST):
            if self._sock is None or self._stop:
                return
            sock = self._sock
            try:
                frames = [sock.recv(zmq.NOBLOCK)]
            except zmq.Again:
                return
            while sock.get(zmq.RCVMORE):  # the rest of a message has arrived with its first frame
                frames.append(sock.recv(zmq.NOBLOCK))
            try:
                msg = P.decode(frames)
            except Exception as e:  # nothing the broker sends may stop this thread
                log.warning("%s %s: ignored a broker message that does not decode: %s",
                            self.role, self.id, e)
                continue
            self._handle(msg)

    def _handle(self, msg: P.Message) -> None:
        now = time.monotonic()
        if self._state == READY:
            self._broker_deadline = now + self._silence()
        name = msg.name
        if name not in _SESSION_MESSAGES:  # the common case: straight to the handler
            on_message = self._on_message
            if on_message is not None:
                try:
                    on_message(msg)
                except Exception:  # a handler bug must not end the connection
                    log.exception("%s %s: on_message raised", self.role, self.id)
            return
        if name == "WELCOME":
            if self._state == READY:
                return  # the answer to a repeated HELLO
            self.token = msg["session"]
            self.epoch = msg["epoch"]
            self.max_message = msg["max_message"]
            self._heartbeat = msg["heartbeat_ms"] / 1000.0
            self._liveness = msg["liveness"]
            self._attempt = 0
            self._revoked_detail = ""
            self._next_heartbeat = now + self._heartbeat
            self._broker_deadline = now + self._silence()
            with self._cond:
                self.welcomes += 1
            self._set_state(READY, "")
            self._call("on_ready", msg)
        elif name == "HEARTBEAT":
            return
        elif name == "ERROR":
            detail = f"{msg['code']} {P.code_name(msg['code'])}: {msg['reason']}"
            about_hello = msg.get("ref_type") == _HELLO_ID
            if about_hello and msg["code"] in (_DUPLICATE_ID, _BUSY):
                self._retry_later(detail)  # may clear up: the old session expires, a drain ends
            elif about_hello and msg["code"] == _UNAUTHORIZED:
                self._revoked(detail)  # our key may not make this HELLO: the allowlist may change
            elif about_hello:
                self._close_socket()
                self._set_state(REFUSED, detail)  # our fields are wrong: retrying cannot help
            elif msg["code"] == _NOT_READY and self._state == READY:
                self.token = 0  # the broker no longer knows us (it restarted)
                self._retry_later("broker lost our session: " + detail)
            else:
                with self._cond:
                    self.last_error = detail
                self._call("on_message", msg)
        else:  # DISCONNECT
            detail = (f"broker said DISCONNECT {msg['code']} {P.code_name(msg['code'])}: "
                      f"{msg['reason']}")
            if msg["code"] == _REPLACED:
                self._close_socket()
                self._set_state(REFUSED, detail)  # another connection holds our session
                return
            if msg["code"] == _UNAUTHORIZED:
                self._revoked(detail)
                return
            if msg["code"] in (_EXPIRED, _TOO_MANY_FAULTS):
                self.token = 0  # that session is gone for good
            self._retry_later(detail)

    def _shutdown(self) -> None:
        self._call("on_close")
        if self._sock is not None and self._state == READY:
            self._send("DISCONNECT", {"code": _GOODBYE, "reason": f"{self.role} closing"})
            self._close_socket(linger=_GOODBYE_LINGER_MS)
        self._close_socket()
        self._reconnect_at = None
        self._timers.clear()
        self._stop = True
        self._set_state(STOPPED, "")
