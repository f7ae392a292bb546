"""The session layer of protocol v1 over one DEALER connection to the broker.

A :class:`Session` says HELLO and waits for WELCOME, sends heartbeats, notices a silent
broker, reconnects with capped exponential backoff and jitter, resumes its session with the
token when the broker still holds it, and acts on the refusals of HELLO, on DISCONNECT and on
a handshake the broker's door refused (its socket monitor tells why no WELCOME comes).

It owns no thread and never waits: the client core (:mod:`rlbus._core`) drives it from its I/O
thread. The core polls :attr:`Session.socket`, calls :meth:`Session.on_readable` when it has
input and :meth:`Session.on_timers` every turn, and sleeps no longer than
:meth:`Session.next_wake`. The session reports through three callables given to it: every
change of its state (and an ERROR that changes nothing, for ``last_error``), each WELCOME that
makes it ready, and every message that is not part of the session layer.

:func:`check_options` holds the options to the protocol's rules (HELLO's, from
messages.json); :func:`heartbeat_seconds` resolves the deprecated ``heartbeat_ms`` spelling of
the public constructors.
"""

from __future__ import annotations

import logging
import random
import time
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional

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

# What HELLO's role may be, as messages.json says (collector, learner, coordinator, bus).
ROLES = tuple(P.MESSAGES["HELLO"].by_name["role"].rules["enum"])

# Error codes of SPEC §6 the session acts on.
_GOODBYE = 200
_NOT_READY = 403
_DUPLICATE_ID = 409
_EXPIRED = 410
_TOO_MANY_FAULTS = 429
_REPLACED = 430
_UNAUTHORIZED = 431
_NOT_LEADER = 421
_BUSY = 503

_HELLO_ID = P.type_id("HELLO")
_GOODBYE_LINGER_MS = 500
_SEND_HWM = 10000
_NOBLOCK_MORE = zmq.NOBLOCK | zmq.SNDMORE
_COPY_BELOW = 65536  # bodies this small are copied into the message: cheaper than tracking
_SESSION_MESSAGES = frozenset(("WELCOME", "HEARTBEAT", "ERROR", "DISCONNECT"))
_READ_BURST = 256  # messages read per turn of the loop, so that a busy socket cannot
                   # hold back posted calls, timers and on_idle
_HEARTBEAT_RULES = P.MESSAGES["HELLO"].by_name["heartbeat_ms"].rules
_HEARTBEAT_MIN_MS = int(_HEARTBEAT_RULES.get("min", 1))  # what HELLO may ask for
_HEARTBEAT_MAX_MS = int(_HEARTBEAT_RULES.get("max", 600000))
_REFUSED_CHECK = 0.05  # how often a group's peer looks for a refused connection (seconds)
_CONNECT_TIMEOUT_MS = 1000  # a broker whose machine is gone answers nothing, not even a refusal


# A client's timings by default, in seconds (messages.json `defaults`, as the C++ SDK's).
HEARTBEAT: float = P.DEFAULTS["heartbeat_ms"] / 1000.0
RECONNECT_MIN: float = P.DEFAULTS["reconnect_min_ms"] / 1000.0
RECONNECT_MAX: float = P.DEFAULTS["reconnect_max_ms"] / 1000.0
BUS_RECONNECT_MAX: float = P.DEFAULTS["bus_reconnect_max_ms"] / 1000.0


def heartbeat_seconds(heartbeat: Optional[float], heartbeat_ms: Optional[int],
                      default: float = HEARTBEAT) -> float:
    """The heartbeat interval in seconds from a public constructor's ``heartbeat``
    (seconds) or its deprecated ``heartbeat_ms`` (milliseconds; a DeprecationWarning).
    ValueError when both are given, or ``heartbeat_ms`` is not an integer in range (the
    range of ``heartbeat`` is checked with the other options)."""
    if heartbeat_ms is None:
        return default if heartbeat is None else heartbeat
    if heartbeat is not None:
        raise ValueError("heartbeat and heartbeat_ms: give one of them (heartbeat, in "
                         "seconds; heartbeat_ms is its deprecated spelling)")
    warnings.warn("heartbeat_ms is deprecated: give heartbeat, in seconds",
                  DeprecationWarning, stacklevel=3)
    if isinstance(heartbeat_ms, bool) or not isinstance(heartbeat_ms, int) \
            or not _HEARTBEAT_MIN_MS <= heartbeat_ms <= _HEARTBEAT_MAX_MS:
        raise ValueError(f"heartbeat_ms: expected an integer of {_HEARTBEAT_MIN_MS}.."
                         f"{_HEARTBEAT_MAX_MS} milliseconds, got {heartbeat_ms!r}")
    return heartbeat_ms / 1000.0


def _heartbeat_ms(heartbeat: float) -> int:
    return int(round(heartbeat * 1000))


def split_endpoints(endpoint: str) -> List[str]:
    """The brokers an endpoint names: one, or a group's separated by commas
    (``tcp://a:7235,tcp://b:7235``, SPEC §14.9.2). ValueError when one is not an endpoint."""
    parts = [p.strip() for p in endpoint.split(",")] if isinstance(endpoint, str) else []
    if not parts or not all("://" in p for p in parts):
        raise ValueError(f"endpoint: expected a ZeroMQ endpoint such as tcp://127.0.0.1:7235, "
                         f"or a group's brokers separated by commas "
                         f"(tcp://a:7235,tcp://b:7235), got {endpoint!r}")
    return parts


def check_options(endpoint: str, role: str, id: str, resources: Optional[Mapping[str, float]],
                  heartbeat: float, reconnect_min: float, reconnect_max: float) -> None:
    """Raises ValueError naming the first bad option (the codec's rules for HELLO decide)."""
    split_endpoints(endpoint)
    if role not in ROLES:
        raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(heartbeat, bool) or not isinstance(heartbeat, (int, float)) \
            or not _HEARTBEAT_MIN_MS <= heartbeat * 1000 <= _HEARTBEAT_MAX_MS:
        raise ValueError(f"heartbeat: expected a number of seconds in "
                         f"{_HEARTBEAT_MIN_MS / 1000:g}..{_HEARTBEAT_MAX_MS / 1000:g}, "
                         f"got {heartbeat!r}")
    for name, v in (("reconnect_min", reconnect_min), ("reconnect_max", reconnect_max)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name}: expected a positive number of seconds, got {v!r}")
    if reconnect_max < reconnect_min:
        raise ValueError(f"reconnect_max ({reconnect_max}) is below reconnect_min "
                         f"({reconnect_min})")
    fields = {"role": role, "id": id, "heartbeat_ms": _heartbeat_ms(heartbeat),
              "resources": dict(resources or {})}
    try:
        P.encode("HELLO", fields)
    except P.ProtocolError as e:
        text = str(e.reason if hasattr(e, "reason") else e)
        for name in ("resources", "id"):
            if name in text:
                raise ValueError(f"{name}: {text}") from None
        raise ValueError(text) from None


StateCallback = Callable[[str, str], None]
MessageCallback = Callable[[P.Message], None]


class Session:
    """The session layer of one connection, driven by the core's I/O thread.

    Construction validates the options (ValueError naming the bad one) and touches no
    network; :meth:`start` opens the socket and says HELLO. ``on_state(state, detail)`` hears
    of every change of :attr:`state`, ``on_welcome(welcome)`` of each WELCOME that makes the
    session ready (the state is then ``ready``: it is not reported through ``on_state``),
    ``on_message(msg)`` of every message that is not HEARTBEAT, WELCOME, DISCONNECT or an
    ERROR about HELLO."""

    def __init__(self, endpoint: Optional[str], role: str, id: str, *, on_state: StateCallback,
                 on_welcome: MessageCallback, on_message: Optional[MessageCallback],
                 resources: Optional[Mapping[str, float]] = None, heartbeat: float = HEARTBEAT,
                 reconnect_min: float = RECONNECT_MIN, reconnect_max: float = RECONNECT_MAX,
                 curve: Optional[CurveKeys] = None) -> None:
        if endpoint is None:  # as the C++ SDK's options left unset
            endpoint = P.DEFAULT_ENDPOINT
        check_options(endpoint, role, id, resources, heartbeat, reconnect_min, reconnect_max)
        if curve is not None and not isinstance(curve, CurveKeys):
            raise ValueError(f"curve: expected rlbus.CurveKeys (see curve_keys_from_files), "
                             f"got {curve!r}")
        self.curve = curve
        self.endpoint = endpoint
        self._endpoints = split_endpoints(endpoint)
        self._next = 0  # the endpoint of the list the next attempt takes
        self._leader = ""  # a NOT_LEADER's leader, for the next attempt
        self._current = ""  # the endpoint of this socket
        self._followed = False  # this socket goes to a NOT_LEADER's leader
        self._leader_epoch = 0  # the highest leadership epoch seen
        self._handshake_why = ""  # the monitor's latest handshake failure
        self._refused = False  # the monitor saw the TCP connection refused
        self.role = role
        self.id = id
        self.resources = dict(resources or {})
        self.heartbeat_ms = _heartbeat_ms(heartbeat)  # the interval HELLO asks for
        self.reconnect_min = float(reconnect_min)
        self.reconnect_max = float(reconnect_max)
        self._on_state = on_state
        self._on_welcome = on_welcome
        self._on_message = on_message

        self.state = CONNECTING
        self.token = 0
        self.epoch: Optional[int] = None
        self.max_message = 0
        self._welcomed = False  # a WELCOME came once: a later loss is a reconnect
        self._ctx: Optional["zmq.Context[Any]"] = None
        self._sock: Optional["zmq.Socket[Any]"] = None
        self._monitor: Optional["zmq.Socket[Any]"] = None  # the socket's handshake failures
        self._heartbeat = float(heartbeat)  # the broker's interval once it welcomed us
        self._liveness = 3
        self._attempt = 0
        self._revoked_detail = ""  # the DISCONNECT or ERROR 431 since the last WELCOME
        self._hello_deadline = 0.0
        self._next_heartbeat = 0.0
        self._broker_deadline = 0.0
        self._reconnect_at: Optional[float] = None
        self._rng = random.Random()

    # ---- what the core calls -----------------------------------------------------------

    @property
    def socket(self) -> Optional["zmq.Socket[Any]"]:
        """The socket to poll for input; None while waiting to reconnect or stopped."""
        return self._sock

    @property
    def ready(self) -> bool:
        return self.state == READY and self._sock is not None

    def start(self, ctx: "zmq.Context[Any]") -> None:
        """Opens the socket on ``ctx`` and sends HELLO."""
        self._ctx = ctx
        self._open()

    def send(self, name: str, fields: Mapping[str, Any], payload: Any = None) -> bool:
        """Sends one message now if the session is ready; False (nothing queued) when it is
        not, or when the socket's queue is full. ``payload`` is the third frame of PUBLISH
        (bytes-like; b"" when None); any other message takes none (ProtocolError)."""
        if not self.ready:
            return False
        return self._send(name, fields, payload)

    def next_wake(self, now: float) -> float:
        """When :meth:`on_timers` has something to do next (monotonic seconds)."""
        t = now + 3600.0
        if self._reconnect_at is not None:
            t = min(t, self._reconnect_at)
        elif self.state == READY:
            t = min(t, self._next_heartbeat, self._broker_deadline)
        elif self._sock is not None:
            t = min(t, self._hello_deadline)
            if self._rotating():  # a refused connection is looked for in the meantime
                t = min(t, now + _REFUSED_CHECK)
        return t

    def on_timers(self, now: float) -> None:
        """Reconnects after the backoff, gives up on a HELLO not answered in time, notices a
        silent broker, sends a heartbeat when one is due."""
        if self._reconnect_at is not None and now >= self._reconnect_at:
            self._reconnect_at = None
            self._open()
        elif self._sock is not None:
            if self.state != READY and now < self._hello_deadline:
                if self._rotating():
                    self._read_monitor()
                    if self._refused:
                        why = f"{self._current} refused the connection"
                        self._next_endpoint()
                        self._retry_later(why)
            elif self.state != READY:
                why = f"no WELCOME within {self._hello_timeout():.1f} s"
                failure = self._handshake_failure()
                if failure:
                    log.warning("%s %s: %s", self.role, self.id, failure)
                    why += ": " + failure
                if self._rotating():
                    why = f"{self._current}: {why}"
                    self._next_endpoint()
                self._retry_later(why)
            elif self.state == READY:
                if now >= self._broker_deadline:
                    self._next_endpoint()
                    self._retry_later(f"broker silent for {self._silence():.1f} s")
                elif now >= self._next_heartbeat:
                    self._send("HEARTBEAT", {})
                    self._next_heartbeat = now + self._heartbeat

    def on_readable(self) -> None:
        """Reads and handles at most a burst of messages from the socket."""
        for _ in range(_READ_BURST):
            sock = self._sock
            if sock is None:
                return
            try:
                frames = [sock.recv(zmq.NOBLOCK)]
            except zmq.Again:
                return
            while sock.get(zmq.RCVMORE):  # the rest of a message has arrived with its first frame
                frames.append(sock.recv(zmq.NOBLOCK))
            try:
                msg = P.decode(frames)  # a DELIVER's payload frame too, as msg.payload
            except Exception as e:  # nothing the broker sends may stop this thread
                log.warning("%s %s: ignored a broker message that does not decode: %s",
                            self.role, self.id, e)
                continue
            self._handle(msg)

    def stop(self, detail: str = "", goodbye: bool = True) -> None:
        """Says DISCONNECT 200 when ready (``goodbye``), closes the socket; the session is
        then stopped and does nothing more."""
        if goodbye and self._sock is not None and self.state == READY:
            self._send("DISCONNECT", {"code": _GOODBYE, "reason": f"{self.role} closing"})
            self._close_socket(linger=_GOODBYE_LINGER_MS)
        self._close_socket()
        self._reconnect_at = None
        self._set_state(STOPPED, detail)

    # ---- inside ------------------------------------------------------------------------

    def _set_state(self, state: str, detail: str) -> None:
        self.state = state
        self._on_state(state, detail)

    def _send(self, name: str, fields: Mapping[str, Any], payload: Any = None) -> bool:
        assert self._sock is not None
        frames = P.encode(name, fields, payload)
        head, body = frames[0], frames[1]
        sock = self._sock
        try:
            # frame by frame: pyzmq's send_multipart costs more than the send itself for
            # small messages. Once the first frame is queued the others always are (ZeroMQ
            # queues a message's frames together); large frames are handed over uncopied.
            sock.send(head, _NOBLOCK_MORE)
            if len(frames) == 2:
                sock.send(body, zmq.NOBLOCK, copy=len(body) < _COPY_BELOW)
            else:  # a payload frame after the body (PUBLISH, SPEC §17.1.1)
                sock.send(body, _NOBLOCK_MORE, copy=len(body) < _COPY_BELOW)
                data = frames[2]
                sock.send(data, zmq.NOBLOCK, copy=memoryview(data).nbytes < _COPY_BELOW)
            return True
        except zmq.Again:
            log.warning("%s %s: send queue full, %s not sent", self.role, self.id, name)
            return False

    def _hello_timeout(self) -> float:
        return max(1.0, self._liveness * self.heartbeat_ms / 1000.0)

    def _silence(self) -> float:
        return max(1, self._liveness - 1) * self._heartbeat

    def _open(self) -> None:
        self._close_socket()
        assert self._ctx is not None
        s = self._ctx.socket(zmq.DEALER)
        s.linger = 0
        s.sndhwm = _SEND_HWM
        if self.curve is not None:
            self.curve.apply(s)
        # The broker's door refuses in the handshake, before any message: only the socket's
        # monitor hears of it, and it tells the user why no WELCOME comes. Of a group's
        # brokers, it tells a refused TCP connection too: the next one is tried then.
        self._followed = bool(self._leader)
        self._current = self._leader or self._endpoints[self._next]
        self._leader = ""
        self._handshake_why = ""
        self._refused = False
        events = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        if self._rotating():
            events |= zmq.EVENT_CONNECT_RETRIED
            s.setsockopt(zmq.CONNECT_TIMEOUT, _CONNECT_TIMEOUT_MS)
        self._monitor = s.get_monitor_socket(events)
        s.connect(self._current)
        self._sock = s
        fields: Dict[str, Any] = {"role": self.role, "id": self.id, "heartbeat_ms": self.heartbeat_ms,
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

    def _rotating(self) -> bool:
        """Whether a connection that is lost, or that got no WELCOME, sends the next one to
        the next broker: more than one in the list, or one named by a NOT_LEADER."""
        return len(self._endpoints) > 1 or self._followed

    def _next_endpoint(self) -> None:
        """The next attempt goes to the next endpoint of the list. A leader a NOT_LEADER
        named is not the list's: the list goes on where it was, but not with the endpoint that
        just failed while it names another."""
        n = len(self._endpoints)
        if not self._followed:
            self._next = (self._next + 1) % n
        if n > 1 and self._endpoints[self._next] == self._current:
            self._next = (self._next + 1) % n

    def _follow(self, msg: P.Message, detail: str) -> None:
        """ERROR 421 (SPEC §14.9.2): go to the leader it names, else to the next endpoint."""
        leader = msg.get("leader") or ""
        epoch = msg.get("leader_epoch") or 0
        named = bool(leader) and leader != self._current and epoch >= self._leader_epoch
        # A group answers: while it elects, it is asked again soon, not after a long backoff.
        self._attempt = min(self._attempt, 1)
        if not named:
            self._next_endpoint()
            self._retry_later(detail)
            return
        self._leader_epoch = max(self._leader_epoch, epoch)
        if not self._followed:
            self._next = (self._next + 1) % len(self._endpoints)
        again = self._followed
        self._leader = leader
        if again:  # the leader named before named another: the group is electing, back off
            self._retry_later(detail)
            return
        # Straight there: a standby's answer is the quickest way to the leader.
        self._close_socket()
        self._reconnect_at = time.monotonic()
        log.debug("%s %s: %s; going to the leader at %s", self.role, self.id, detail, leader)
        self._set_state(RECONNECTING if self._welcomed else CONNECTING, detail)

    def _read_monitor(self) -> None:
        """Reads the socket's monitor: a failed handshake (why no WELCOME comes) or a refused
        TCP connection."""
        while self._monitor is not None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_CONNECT_RETRIED:
                self._refused = True
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._handshake_why = (f"the broker refused the connection (ZAP status {event['value']}): "
                       + ("this peer's public key is not in its allowlist, or a connection "
                          "limit was reached" if self.curve is not None
                          else "a connection limit was reached"))
            elif self.curve is not None:
                self._handshake_why = ("the CURVE handshake failed: is the broker's public "
                                       "key right, and does the broker speak CURVE?")
            else:
                self._handshake_why = "the handshake failed: does the broker expect CURVE keys?"

    def _handshake_failure(self) -> str:
        """Why the socket's last handshake failed, from its monitor ("" when none did)."""
        self._read_monitor()
        return self._handshake_why

    def _revoked(self, detail: str) -> None:
        """Our key was revoked, or may not make our HELLO: the operator's to undo (an allowlist
        emptied for a moment, a key taken out by mistake), so not final. The session starts
        anew at the longest reconnect interval; ``last_error`` names the revocation until a
        WELCOME."""
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
        self._set_state(RECONNECTING if self._welcomed else CONNECTING, why)

    def _handle(self, msg: P.Message) -> None:
        now = time.monotonic()
        if self.state == READY:
            self._broker_deadline = now + self._silence()
        name = msg.name
        if name not in _SESSION_MESSAGES:  # the common case: straight to the role
            self._deliver(msg)
            return
        if name == "WELCOME":
            if self.state == READY:
                return  # the answer to a repeated HELLO
            epoch = msg.get("leader_epoch")
            if epoch is not None and epoch < self._leader_epoch:
                # A leader whose leadership is over (SPEC §4.2.2): not the group's.
                self._next_endpoint()
                self._retry_later(f"{self._current} welcomed us under leadership epoch "
                                  f"{epoch}, older than {self._leader_epoch}")
                return
            if epoch is not None:
                self._leader_epoch = epoch
            self.token = msg["session"]
            self.epoch = msg["epoch"]
            self.max_message = msg["max_message"]
            self._heartbeat = msg["heartbeat_ms"] / 1000.0
            self._liveness = msg["liveness"]
            self._attempt = 0
            self._revoked_detail = ""
            self._next_heartbeat = now + self._heartbeat
            self._broker_deadline = now + self._silence()
            self._welcomed = True
            self.state = READY
            self._on_welcome(msg)
        elif name == "HEARTBEAT":
            return
        elif name == "ERROR":
            detail = f"{msg['code']} {P.code_name(msg['code'])}: {msg['reason']}"
            about_hello = msg.get("ref_type") == _HELLO_ID
            if msg["code"] == _NOT_LEADER:
                self._follow(msg, detail)  # a standby of a group, whatever we sent it
            elif about_hello and msg["code"] in (_DUPLICATE_ID, _BUSY):
                self._retry_later(detail)  # may clear up: the old session expires, a drain ends
            elif about_hello and msg["code"] == _UNAUTHORIZED:
                self._revoked(detail)  # our key may not make this HELLO: the allowlist may change
            elif about_hello:
                self._close_socket()
                self._set_state(REFUSED, detail)  # our fields are wrong: retrying cannot help
            elif msg["code"] == _NOT_READY and self.state == READY:
                # This connection is not our session's: the socket reconnected by itself (a
                # cut link) or the broker restarted. HELLO again with the token: the session
                # resumes if the broker holds it, else a new one begins (SPEC §8.4).
                self._retry_later("broker does not know this connection: " + detail)
            else:
                self._on_state(self.state, detail)  # nothing changes but last_error
                self._deliver(msg)
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
            if msg["code"] == _BUSY:
                self._next_endpoint()  # it stops: try another
            self._retry_later(detail)

    def _deliver(self, msg: P.Message) -> None:
        on_message = self._on_message
        if on_message is not None:
            try:
                on_message(msg)
            except Exception:  # a role's bug must not end the connection
                log.exception("%s %s: on_message raised", self.role, self.id)
