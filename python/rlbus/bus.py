"""The topic bus: publish payloads on topics and receive what others publish, through the
rlbus broker (protocol section 17), lossless and in order.

A :class:`Bus` is one node (a session of role ``bus``) on the client core
(:mod:`rlbus._core`: the I/O thread, HELLO, heartbeats, reconnects). Any thread may call
:meth:`Bus.publish`, :meth:`Bus.subscribe`, :meth:`Bus.unsubscribe` and :meth:`Bus.recv`.

- A publish waits for the broker's credit, so a slow subscriber slows its publishers down
  instead of losing messages; a payload larger than one message travels in fragments.
  Publications are kept until the broker has taken them and sent again after a resumption.
- A subscribe or unsubscribe returns once the broker says it is in force: whatever is
  published after it returns reaches this node.
- Received publications are handed out by :meth:`Bus.recv` (or iteration) in the broker's
  order, each once, fragments joined. The broker's window is acknowledged only for what the
  caller took, so a node that stops reading holds its publishers back.
- What the broker had to drop is counted in :attr:`Bus.lost`; a new session (the broker
  restarted, or this node was silent past its liveness window) in :attr:`Bus.sessions_lost`,
  since what was in flight then is gone. Subscriptions are made again by themselves.
"""

from __future__ import annotations

import collections
import fnmatch
import itertools
import logging
import struct
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterator, List, NamedTuple, Optional, Tuple

import zmq

from . import protocol as P
from ._core import Core
from ._keys import CurveKeys
from ._session import BUS_RECONNECT_MAX, HEARTBEAT, READY, RECONNECT_MIN, STOPPED

__all__ = ["Bus", "BusMessage", "BusError"]

log = logging.getLogger("rlbus.bus")

_FRAGMENT_ROOM = P.DEFAULTS["bus_fragment_room"]  # left of max-message for a fragment's body (§17.10)
_ACK_EVERY = 32              # deliveries taken between two BUS_ACKs (§17.4.3)
_ACK_BYTES = 1 << 20         # or their payload bytes; fewer go with the I/O thread's next turn
_MAX_QUEUED = 256            # publications waiting for credit before publish() blocks,
_MAX_QUEUED_BYTES = 16 << 20  # or their bytes (one larger publication always fits)
_MAX_TOPIC = 256
# Batches (§17.5.1): publications of at most 8 KiB queued on one topic go as one PUBLISH, at
# most 256 of them and 64 KiB in all; each item a 4-byte big-endian length, then its bytes.
_BATCH_ITEMS = P.DEFAULTS["bus_batch_max_items"]
_BATCH_ITEM_BYTES = P.DEFAULTS["bus_batch_max_item_bytes"]
_BATCH_BYTES = P.DEFAULTS["bus_batch_max_bytes"]
_LENGTH = struct.Struct(">I")
_MAX_PARTIAL_BYTES = 256 << 20  # incomplete publications held, by default (fits a small machine)


class BusMessage(NamedTuple):
    """One publication as a subscriber gets it."""
    topic: str
    payload: bytes
    sender: str          # the publisher's node id
    retained: bool = False  # a topic's last value, delivered for subscribe(last=True)


class BusError(RuntimeError):
    """The broker refused a subscription (``code``: 431 unauthorized, 440 too many, ...)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code} {P.code_name(code)}: {reason}")
        self.code = code
        self.reason = reason


def _check_topic(topic: Any, empty_ok: bool = False) -> str:
    if not isinstance(topic, str):
        raise TypeError(f"topic: expected str, got {type(topic).__name__}")
    data = topic.encode("ascii", "replace")
    if len(data) > _MAX_TOPIC or (not data and not empty_ok) \
            or any(c < 0x21 or c > 0x7E for c in data):
        raise ValueError(f"topic: expected 1..{_MAX_TOPIC} printable ASCII characters other "
                         f"than space, got {topic!r}")
    return topic


class _Request:
    __slots__ = ("name", "fields", "done", "answer")

    def __init__(self, name: str, fields: Dict[str, Any]) -> None:
        self.name = name
        self.fields = fields
        self.done = threading.Event()
        self.answer: Optional[P.Message] = None


class _Outgoing:
    """A publication waiting to leave, sent fragment by fragment as credit allows."""

    __slots__ = ("topic", "payload", "retain", "offset", "part")

    def __init__(self, topic: str, payload: memoryview, retain: bool) -> None:
        self.topic = topic
        self.payload = payload
        self.retain = retain
        self.offset = 0
        self.part = 0


class Bus:
    """One node of the topic bus. Construction connects in the background (it does not
    block); see the module's doc for what each call guarantees.

    ``endpoint``: the broker's ROUTER endpoint (or a group's, separated by commas); None means
    :data:`rlbus.DEFAULT_ENDPOINT`, the C++ SDK's default too. ``id`` names the node (peer id rule: 1..128 of ``A-Z a-z 0-9 . _ : @ / -``); unique among
    live sessions. ``max_partial_bytes`` (default 256 MiB) bounds the bytes of fragmented
    publications this node holds while they are incomplete; past it the largest is dropped,
    logged and counted lost. ``accept``, when given, says which topics this node wants: a
    fragmented publication on any other topic is dropped as its first fragment arrives
    (counted in :attr:`ignored`) and its fragments are never held; whole ones are handed out
    as ever, for the caller to filter.
    """

    def __init__(self, endpoint: Optional[str], id: str, *, heartbeat: float = HEARTBEAT,
                 reconnect_min: float = RECONNECT_MIN, reconnect_max: float = BUS_RECONNECT_MAX,
                 curve: Optional[CurveKeys] = None, context: Optional["zmq.Context[Any]"] = None,
                 max_partial_bytes: int = _MAX_PARTIAL_BYTES,
                 accept: Optional[Callable[[str], bool]] = None) -> None:
        if not isinstance(max_partial_bytes, int) or max_partial_bytes < 1:
            raise ValueError(f"max_partial_bytes: expected a positive int, got "
                             f"{max_partial_bytes!r}")
        if accept is not None and not callable(accept):
            raise TypeError(f"accept: expected a callable or None, got {accept!r}")
        self._max_partial = max_partial_bytes
        self._accept = accept
        # One lock, two conditions: publish() and flush() wait on _cv (credit, room, taken),
        # recv() on _arrived, so that neither side's events wake the other's waiters.
        lock = threading.Lock()
        self._cv = threading.Condition(lock)
        self._arrived = threading.Condition(lock)
        # publishing (under _cv; the I/O thread sends)
        self._outq: Deque[_Outgoing] = collections.deque()
        self._unacked: Deque[Tuple[int, Dict[str, Any], memoryview]] = collections.deque()
        self._queued_bytes = 0  # payload bytes in _outq
        self._pub_seq = 0       # the last PUBLISH seq used in this session
        self._pub_acked = 0     # the broker has taken up to here
        self._pub_limit = 0     # and we may send up to here
        self._resend = False    # a resumption: send what is not taken again, first
        self._credit_known = False
        self._held_by: Optional[str] = None  # who the broker last said holds this node back
        # subscriptions: (prefix, topic) -> (echo, last); requests waiting for SUBSCRIBED
        self._subs: Dict[Tuple[bool, str], Tuple[bool, bool]] = {}
        self._requests: Dict[int, _Request] = {}
        self._next_req = 0
        # receiving (I/O thread fills, recv() takes)
        self._inbox: Deque[Tuple[int, BusMessage]] = collections.deque()
        self._partial: Dict[str, Tuple[str, int, List[bytes], int]] = {}  # from -> topic, part,
        self._partial_bytes = 0                                           #   chunks, bytes
        self._taken = 0         # deliveries received (or reported lost) up to here
        self._consumed = 0      # all up to here handed to the caller or absorbed
        self._ack_sent = 0
        self._ack_posted = False  # an _io_ack is posted to the I/O thread
        self._ack_lazy = False    # an ack is owed: sent on the I/O thread's next turn
        self._owed_bytes = 0      # payload bytes handed out since the last BUS_ACK
        self.lost = 0           # deliveries and publications reported lost, or not handed over
        self.ignored = 0        # fragmented publications on topics ``accept`` refused
        self.sessions_lost = 0  # new sessions after the first: in-flight messages gone
        self.errors = 0         # ERRORs the broker answered this node with
        self._closed = False
        self._core = Core(endpoint, "bus", id, self, heartbeat=heartbeat,
                          reconnect_min=reconnect_min, reconnect_max=reconnect_max,
                          curve=curve, context=context)
        self.id = id
        self._core.start()

    # ---- any thread ------------------------------------------------------------------

    @property
    def state(self) -> str:
        """The connection's state: ``connecting``, ``ready``, ``reconnecting``, ``refused``
        or ``stopped`` (see :attr:`last_error` for why)."""
        return self._core.state

    @property
    def last_error(self) -> str:
        return self._core.last_error

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Waits until the node has a session; false after ``timeout`` seconds."""
        return self._core.wait_for(READY, timeout)

    @property
    def subscriptions(self) -> List[Tuple[str, bool]]:
        """The subscriptions in force or being made, as (topic, prefix)."""
        with self._cv:
            return [(t, p) for (p, t) in self._subs]

    def subscribe(self, topic: str, *, prefix: bool = False, echo: bool = False,
                  last: bool = False, timeout: float = 30.0) -> None:
        """Subscribes to ``topic`` (with ``prefix``, to every topic that begins with it; the
        empty prefix is every topic) and returns once the broker has it in force. ``echo``:
        this node's own publications match too. ``last``: the topics' retained values come
        first. Raises :class:`BusError` if the broker refuses, TimeoutError if it does not
        answer within ``timeout`` seconds (the subscription is still made when it can be)."""
        _check_topic(topic, empty_ok=prefix)
        with self._cv:
            self._subs[(bool(prefix), topic)] = (bool(echo), bool(last))
        fields: Dict[str, Any] = {"topic": topic}
        if prefix:
            fields["prefix"] = True
        if echo:
            fields["echo"] = True
        if last:
            fields["last"] = True
        answer = self._request("SUBSCRIBE", fields, timeout)
        if not answer["accepted"]:
            with self._cv:
                self._subs.pop((bool(prefix), topic), None)
            raise BusError(answer["code"], answer["reason"])

    def unsubscribe(self, topic: str, *, prefix: bool = False, timeout: float = 30.0) -> None:
        """Drops the subscription of ``topic`` (of that kind); returns once the broker has."""
        _check_topic(topic, empty_ok=prefix)
        with self._cv:
            if self._subs.pop((bool(prefix), topic), None) is None:
                return
        fields: Dict[str, Any] = {"topic": topic}
        if prefix:
            fields["prefix"] = True
        self._request("UNSUBSCRIBE", fields, timeout)

    def unsubscribe_matching(self, pattern: str, timeout: float = 30.0) -> int:
        """Drops every subscription whose topic matches the glob ``pattern`` (``task.*``);
        returns how many."""
        with self._cv:
            hit = [(p, t) for (p, t) in self._subs if fnmatch.fnmatchcase(t, pattern)]
        for p, t in hit:
            self.unsubscribe(t, prefix=p, timeout=timeout)
        return len(hit)

    def publish(self, topic: str, payload: Any, *, retain: bool = False,
                timeout: Optional[float] = 60.0) -> None:
        """Publishes ``payload`` (bytes-like, any size) on ``topic``. Returns once it is
        queued to leave; blocks while the broker holds this node back (a subscriber of what
        it publishes is slow). TimeoutError after ``timeout`` seconds of that (None: wait as
        long as it takes); RuntimeError once closed. ``retain``: the broker keeps it as the
        topic's last value (an empty payload clears it; at most one message)."""
        _check_topic(topic)
        view = memoryview(payload).cast("B")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._outq and (len(self._outq) >= _MAX_QUEUED
                                  or self._queued_bytes >= _MAX_QUEUED_BYTES) \
                    and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    who = (f"node {self._held_by} does not keep up" if self._held_by
                           else "a subscriber does not keep up")
                    raise TimeoutError(f"publish on {topic!r}: the broker held this node back "
                                       f"for {timeout} s ({who})")
                self._cv.wait(left)
            if self._closed:
                raise RuntimeError("publish: the bus is closed")
            self._outq.append(_Outgoing(topic, view, bool(retain)))
            self._queued_bytes += len(view)
            first = len(self._outq) == 1
        if first:
            self._core.post(self._io_pump)

    def recv(self, timeout: Optional[float] = None) -> Optional[BusMessage]:
        """The next publication for this node; None after ``timeout`` seconds (None: wait as
        long as it takes) or once closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not self._inbox:
                if self._closed:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._arrived.wait(left)
            _, msg = self._inbox.popleft()
            # everything before the next one waiting is taken (handed out, or absorbed)
            self._consumed = max(self._inbox[0][0] - 1, 0) if self._inbox else self._taken
            self._owed_bytes += len(msg.payload)
            # The window needs an ack every so often; the rest waits for the I/O thread's
            # next turn (a delivery, a publish, a heartbeat) rather than waking it now.
            post = False
            if self._consumed - self._ack_sent >= _ACK_EVERY or self._owed_bytes >= _ACK_BYTES:
                post = not self._ack_posted
                self._ack_posted = True
            elif self._consumed > self._ack_sent:
                self._ack_lazy = True
        if post:
            self._core.post(self._io_ack)
        return msg

    def __iter__(self) -> Iterator[BusMessage]:
        while True:
            msg = self.recv()
            if msg is None:
                return
            yield msg

    @property
    def unsent(self) -> int:
        """Publications the broker has not taken yet (queued here, or sent and not taken)."""
        with self._cv:
            return self._not_taken()

    def _not_taken(self) -> int:
        """Under _cv: publications not taken. A fragmented one counts once (its last part,
        or its rest still queued); a batch counts its publications."""
        return len(self._outq) + sum(int(fields.get("count", 1))
                                     for _, fields, _ in self._unacked
                                     if not fields.get("more", False))

    def flush(self, timeout: float = 10.0) -> bool:
        """Waits until the broker has taken everything published so far; false after
        ``timeout`` seconds (logged, with how many are not taken: :attr:`unsent`)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._outq or self._unacked:
                left = deadline - time.monotonic()
                if left <= 0 or self._core.state == STOPPED:
                    log.warning("bus %s: flush gave up after %.1f s with %d publications not "
                                "taken by the broker (%s)", self.id, timeout, self._not_taken(),
                                "held back" if self._core.state == READY else
                                self._core.state)
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> int:
        """Flushes what was published (for up to ``timeout`` seconds), says DISCONNECT and
        stops; a blocked :meth:`recv` returns None. Returns how many publications the broker
        had not taken by then: they are dropped, logged and counted in :attr:`lost` (0:
        everything was handed over). Idempotent (a second call returns 0)."""
        if not self._closed and self._core.state == READY:
            self.flush(timeout)
        with self._cv:
            dropped = 0 if self._closed else self._not_taken()
            if dropped:
                self.lost += dropped
                log.error("bus %s: closed with %d publications the broker had not taken: "
                          "they are lost", self.id, dropped)
            self._closed = True
            self._cv.notify_all()
            self._arrived.notify_all()
            for r in self._requests.values():
                r.done.set()
        self._core.close(timeout)
        return dropped

    def __enter__(self) -> "Bus":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _request(self, name: str, fields: Dict[str, Any], timeout: float) -> P.Message:
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{name.lower()}: the bus is closed")
            self._next_req += 1
            fields["req"] = self._next_req
            req = _Request(name, fields)
            self._requests[self._next_req] = req
        self._core.post(lambda: self._io_send_request(req))
        if not req.done.wait(timeout):
            with self._cv:
                self._requests.pop(fields["req"], None)
            raise TimeoutError(f"{name.lower()} {fields['topic']!r}: no answer from the broker "
                               f"within {timeout} s ({self._core.state}: {self.last_error})")
        if req.answer is None:
            raise RuntimeError(f"{name.lower()}: the bus is closed")
        return req.answer

    # ---- I/O thread: the core's handler ----------------------------------------------

    def on_ready(self, welcome: P.Message) -> None:
        resumed = welcome["resumed"]
        with self._cv:
            if not resumed:
                self._new_session()
            else:
                self._resend = True  # what the broker has not taken goes again, first
            self._credit_known = False
            requests = list(self._requests.values())
            subs = dict(self._subs)
        if not resumed:  # the broker holds no subscription of ours: make them again
            pending = {(r.fields.get("prefix", False), r.fields["topic"]) for r in requests
                       if r.name == "SUBSCRIBE"}
            for (prefix, topic), (echo, last) in subs.items():
                if (prefix, topic) in pending:
                    continue
                fields: Dict[str, Any] = {"req": self._take_req(), "topic": topic}
                if prefix:
                    fields["prefix"] = True
                if echo:
                    fields["echo"] = True
                self._core.send("SUBSCRIBE", fields)
        for r in requests:  # their answers may have gone with the old connection
            self._core.send(r.name, r.fields)

    def _new_session(self) -> None:
        """Under _cv: the broker knows nothing of an earlier session of ours."""
        if self._core.welcomes > 1:
            self.sessions_lost += 1
            if self._unacked or self._partial:
                log.warning("bus %s: a new session: %d publications in flight and %d "
                            "incomplete deliveries are lost", self.id, len(self._unacked),
                            len(self._partial))
            self.lost += len(self._partial)
        self._unacked.clear()
        self._pub_seq = self._pub_acked = self._pub_limit = 0
        self._resend = False
        # a publication half sent in the old session cannot be finished: it starts again
        if self._outq and self._outq[0].part > 0:
            self._outq[0].offset = 0
            self._outq[0].part = 0
        self._partial.clear()
        self._partial_bytes = 0
        # delivery seqs start at 1 again; what the caller has not taken stays in the inbox
        self._inbox = collections.deque((0, m) for _, m in self._inbox)
        self._taken = self._consumed = self._ack_sent = 0

    def _take_req(self) -> int:
        with self._cv:
            self._next_req += 1
            return self._next_req

    def on_message(self, msg: P.Message) -> None:
        name = msg.name
        if name == "DELIVER":
            self._io_deliver(msg)
        elif name == "PUBLISH_CREDIT":
            self._io_credit(msg["acked"], msg["limit"], msg.get("held_by"))
        elif name == "SUBSCRIBED":
            with self._cv:
                req = self._requests.pop(msg["req"], None)
            if req is not None:
                req.answer = msg
                req.done.set()
        elif name == "BUS_GAP":
            self._io_gap(msg["first"], msg["last"])
        elif name == "ERROR":
            self.errors += 1
            log.warning("bus %s: the broker refused a message: %s %s: %s", self.id,
                        msg["code"], P.code_name(msg["code"]), msg["reason"])

    def on_state(self, state: str, detail: str) -> None:
        if state == STOPPED:
            with self._cv:
                self._cv.notify_all()
                self._arrived.notify_all()

    def on_idle(self) -> None:
        if self._ack_lazy or self._ack_posted:
            self._io_ack()

    def on_close(self) -> None:
        self._io_ack()

    def _io_send_request(self, req: _Request) -> None:
        if self._core.ready:  # else on_ready sends it
            self._core.send(req.name, req.fields)

    def _io_credit(self, acked: int, limit: int, held_by: Optional[str] = None) -> None:
        with self._cv:
            self._held_by = held_by
            while self._unacked and self._unacked[0][0] <= acked:
                self._unacked.popleft()
            self._pub_acked = max(self._pub_acked, acked)
            self._pub_limit = max(self._pub_limit, limit)
            self._credit_known = True
            resend = list(self._unacked) if self._resend else []
            self._resend = False
            self._cv.notify_all()
        for _, fields, payload in resend:  # the broker took up to `acked`: the rest again
            self._core.send("PUBLISH", fields, payload)
        self._io_pump()

    def _io_pump(self) -> None:
        """Sends what is queued, fragment by fragment, within the credit."""
        if not self._core.ready:
            return
        max_message = self._core.max_message
        room = max_message - min(_FRAGMENT_ROOM, max_message // 2)
        with self._cv:
            if not self._credit_known or self._resend:
                return
            while self._outq and self._pub_seq < self._pub_limit:
                out = self._outq[0]
                size = len(out.payload)
                n = self._batchable()
                if n > 1:  # small ones queued on one topic: one PUBLISH (§17.5.1)
                    items = [self._outq[i].payload for i in range(n)]
                    batch = b"".join(itertools.chain.from_iterable(
                        (_LENGTH.pack(len(p)), p) for p in items))
                    batch_fields = {"seq": self._pub_seq + 1, "topic": out.topic, "count": n}
                    if not self._core.send("PUBLISH", batch_fields, batch):
                        self._core.call_later(0.005, self._io_pump)  # the socket's queue is full
                        return
                    self._pub_seq += 1
                    self._unacked.append((self._pub_seq, batch_fields, memoryview(batch)))
                    for _ in range(n):
                        self._queued_bytes -= len(self._outq.popleft().payload)
                    self._cv.notify_all()
                    continue
                end = min(size, out.offset + room)
                more = end < size
                fields: Dict[str, Any] = {"seq": self._pub_seq + 1, "topic": out.topic}
                if out.part:
                    fields["part"] = out.part
                if more:
                    fields["more"] = True
                if out.retain and not more and out.part == 0:
                    fields["retain"] = True
                chunk = out.payload[out.offset:end]
                if not self._core.send("PUBLISH", fields, chunk):
                    self._core.call_later(0.005, self._io_pump)  # the socket's queue is full
                    return
                self._pub_seq += 1
                self._unacked.append((self._pub_seq, fields, chunk))
                if more:
                    out.offset = end
                    out.part += 1
                else:
                    self._outq.popleft()
                    self._queued_bytes -= size
                    self._cv.notify_all()

    def _batchable(self) -> int:
        """Under _cv: how many publications from the front of the queue go as one batch:
        small ones, none retained, on the front's topic, within the batch bounds (1: the front
        goes alone)."""
        q = self._outq
        front = q[0]
        if front.part or front.retain or len(front.payload) > _BATCH_ITEM_BYTES or len(q) < 2:
            return 1
        n, total = 1, 4 + len(front.payload)
        for nxt in itertools.islice(q, 1, _BATCH_ITEMS):
            size = len(nxt.payload)
            if nxt.topic != front.topic or nxt.retain or size > _BATCH_ITEM_BYTES \
                    or total + 4 + size > _BATCH_BYTES:
                break
            n += 1
            total += 4 + size
        return n

    def _io_deliver(self, msg: P.Message) -> None:
        seq = msg["seq"]
        with self._cv:
            if seq <= self._taken:
                return  # sent again after a resumption: we have it
            if seq > self._taken + 1:  # not announced: count it as a gap all the same
                self.lost += seq - self._taken - 1
            self._taken = seq
            if "count" in msg.fields:  # a batch: its publications in order, under one seq
                items = self._split(msg, msg["count"])  # (§17.5.1)
            else:
                done = self._join(msg, seq)
                items = [done] if done is not None else []
            if items:
                self._inbox.extend((seq, m) for m in items)
                self._arrived.notify(len(items))
            elif not self._inbox:
                self._consumed = seq  # absorbed into a partial, or dropped
                self._ack_lazy = True

    def _split(self, msg: P.Message, count: int) -> List[BusMessage]:
        """Under _cv: the publications of a batch; none (counted lost) when its payload does
        not hold ``count`` items."""
        sender, topic = msg["from"], msg["topic"]
        if self._drop_partial(sender):
            self.lost += 1  # a batch begins no fragment: an open publication ended
        data = bytes(msg.payload or b"")
        out: List[BusMessage] = []
        pos, end, unpack = 0, len(data), _LENGTH.unpack_from
        for _ in range(count):
            if end - pos < 4:
                break
            (size,) = unpack(data, pos)
            pos += 4
            if end - pos < size:
                break
            out.append(BusMessage(topic, data[pos:pos + size], sender))
            pos += size
        if len(out) == count and pos == end:
            return out
        log.warning("bus %s: a batch of %d from %s on %r does not hold its items: %d lost",
                    self.id, count, sender, topic, count)
        self.lost += count
        return []

    def _join(self, msg: P.Message, seq: int) -> Optional[BusMessage]:
        """Under _cv: the publication this delivery completes, if any."""
        sender = msg["from"]
        part = msg.get("part", 0)
        more = msg.get("more", False)
        payload = msg.payload or b""
        if msg.get("abandoned", False):
            if self._drop_partial(sender):
                self.lost += 1
            return None
        if part == 0:
            if self._drop_partial(sender):
                self.lost += 1  # its end never came
            if not more:
                return BusMessage(msg["topic"], bytes(payload), sender,
                                  msg.get("retained", False))
            if self._accept is not None and not self._accept(msg["topic"]):
                self.ignored += 1  # not wanted: never held, nor its rest
                return None
            self._partial[sender] = (msg["topic"], 1, [bytes(payload)], len(payload))
            self._partial_bytes += len(payload)
            self._bound_partials()
            return None
        held = self._partial.get(sender)
        if held is None or held[1] != part or held[0] != msg["topic"]:
            return None  # its start was lost (a gap, a bound): counted then
        topic, _, chunks, size = held
        chunks.append(bytes(payload))
        self._partial_bytes += len(payload)
        if more:
            self._partial[sender] = (topic, part + 1, chunks, size + len(payload))
            self._bound_partials()
            return None
        del self._partial[sender]
        self._partial_bytes -= size + len(payload)
        return BusMessage(topic, b"".join(chunks), sender, False)

    def _drop_partial(self, sender: str) -> bool:
        held = self._partial.pop(sender, None)
        if held is None:
            return False
        self._partial_bytes -= held[3]
        return True

    def _bound_partials(self) -> None:
        while self._partial_bytes > self._max_partial and self._partial:
            largest = max(self._partial, key=lambda s: self._partial[s][3])
            log.warning("bus %s: dropping an incomplete publication of %s (%d bytes held, "
                        "max_partial_bytes %d)", self.id, largest, self._partial_bytes,
                        self._max_partial)
            self._drop_partial(largest)
            self.lost += 1

    def _io_gap(self, first: int, last: int) -> None:
        with self._cv:
            if last <= self._taken:
                return  # heard of it already
            self.lost += last - max(first - 1, self._taken)
            self._taken = last
            self.lost += len(self._partial)  # a fragment of any of them may be among those lost
            self._partial.clear()
            self._partial_bytes = 0
            if not self._inbox:
                self._consumed = last
            self._ack_lazy = True
        log.warning("bus %s: the broker dropped deliveries %d..%d", self.id, first, last)

    def _io_ack(self) -> None:
        with self._cv:
            self._ack_posted = self._ack_lazy = False
            self._owed_bytes = 0
            upto = self._consumed
            if upto <= self._ack_sent:
                return
        if self._core.ready and self._core.send("BUS_ACK", {"seq": upto}):
            with self._cv:
                self._ack_sent = upto
