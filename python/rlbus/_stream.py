"""The coordinator's stream (SPEC §12.8, §12.9): its tasks' TASK_EVENTs, numbered by ``seq``,
handed on in order and exactly once across reconnects of one session.

A :class:`Stream` lives on the coordinator's I/O thread. It asks for the stream with REPLAY as
the first message of every connection (from the event after the last one the callbacks
finished), drops duplicates, holds back an event that comes after a jump in ``seq`` while it
asks REPLAY once for what is missing, turns a STREAM_GAP into a loss handed on in its place,
and acknowledges what the callbacks finished with ACK: every 32 events while more wait, and
shortly after they caught up, so that a steady trickle is not acknowledged one by one.

The role hands it what arrives (:meth:`Stream.event`, :meth:`Stream.gap`) and what its
callbacks finished (:meth:`Stream.done`), and tells it of each WELCOME
(:meth:`Stream.welcome`: is it a new stream?) and connection (:meth:`Stream.connected`); the
stream hands events and losses on through the two callables it was given. :class:`Progress`
is the callback thread's half: it counts what the callbacks finished and reports it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional, Tuple

from . import protocol as P

__all__ = ["Stream", "Progress", "ACK_EVERY"]

log = logging.getLogger("rlbus.coordinator")

ACK_EVERY = 32           # finished events per ACK while more are waiting
_ACK_IDLE_S = 0.002      # once caught up, the ACK of the rest waits this long for more
_MAX_EARLY = 65536       # events kept that came ahead of a jump in seq


class Stream:
    """The ordered stream of one coordinator session, on the I/O thread.

    ``core`` sends (REPLAY, ACK) and runs the ACK timer; ``deliver(msg)`` gets each event in
    order, ``lost(first, last)`` each run of events the broker could no longer keep. The
    counters may be read from any thread."""

    def __init__(self, core: Any, deliver: Callable[[P.Message], None],
                 lost: Callable[[int, int], None], name: str) -> None:
        self._core = core
        self._deliver = deliver
        self._lost = lost
        self._name = name
        self.next_seq = 1        # the next seq to hand on
        self.processed = 0       # the last seq the callbacks finished
        self._since_ack = 0
        self._ack_timer: Any = None
        self._early: Dict[int, P.Message] = {}
        self._replay_asked: Optional[int] = None  # next_seq when the pending REPLAY was asked
        #: events that arrived again (after a replay) and were dropped
        self.duplicates = 0
        #: events that never arrived (handed on as lost)
        self.gaps = 0
        #: REPLAYs sent: one per connection and one per jump in seq
        self.replays = 0

    # ---- the session ----------------------------------------------------------------------

    def welcome(self, resumed: bool, acked: Optional[int]) -> bool:
        """A WELCOME (``acked``: its ``stream_acked``). True when it begins a new stream,
        which goes on after ``acked`` (the tasks of an earlier session of this id adopted)
        or starts at 1; False when the stream goes on: a resumption, or a new session that
        adopted this very stream (it expired while we were cut off, SPEC §12.5.8)."""
        ours_again = acked is not None and self.next_seq > 1 and acked <= self.processed
        if resumed or ours_again:
            log.info("coordinator %s: session resumed; asking the stream again from %d",
                     self._name, self.processed + 1)
            return False
        if acked is not None:
            log.info("coordinator %s: adopted the tasks of an earlier session of this id; "
                     "the stream goes on after %d", self._name, acked)
        self.processed = acked or 0
        self.next_seq = self.processed + 1
        self._since_ack = 0
        self._early.clear()
        return True

    def connected(self) -> None:
        """First on every connection: make the stream windowed and fetch what the callbacks
        have not finished (on a resumption, what went down with the old connection)."""
        self._replay_asked = None
        self._replay(self.processed + 1)

    def finished(self, seq: int) -> None:
        """The callbacks finished up to ``seq`` (news that may be ahead of :meth:`done`)."""
        if seq > self.processed:
            self.processed = seq

    # ---- what arrives ---------------------------------------------------------------------

    def event(self, msg: P.Message) -> None:
        """A TASK_EVENT."""
        seq = msg["seq"]
        if seq < self.next_seq:
            self.duplicates += 1
        elif seq > self.next_seq:
            if len(self._early) < _MAX_EARLY:
                self._early.setdefault(seq, msg)
        else:
            self._hand_on(msg)
        self._settle()

    def gap(self, first: int, last: int) -> None:
        """A STREAM_GAP: events ``first..last`` are gone from the broker."""
        if last < self.next_seq:
            return  # about events we have
        if first > self.next_seq:
            self._replay(self.next_seq)  # more is missing before it: ask from there
            return
        lost_first = self.next_seq
        log.warning("coordinator %s: events %d..%d of the stream are lost", self._name,
                    lost_first, last)
        self.gaps += last - lost_first + 1
        self._lost(lost_first, last)
        self.next_seq = last + 1
        for seq in [s for s in self._early if s < self.next_seq]:
            del self._early[seq]
        self._settle()

    # ---- what the callbacks finished --------------------------------------------------------

    def done(self, seq: int, count: int, caught_up: bool) -> None:
        """The callbacks finished ``count`` more events, up to ``seq``. ACK every 32; once
        they have caught up, the ACK of the rest goes out shortly."""
        if seq <= self.processed:
            return
        self.processed = seq
        self._since_ack += count
        if self._since_ack >= ACK_EVERY:
            self._ack()
        elif caught_up and self._ack_timer is None:
            self._ack_timer = self._core.call_later(_ACK_IDLE_S, self._ack)

    # ---- inside ---------------------------------------------------------------------------

    def _hand_on(self, msg: P.Message) -> None:
        self.next_seq += 1
        self._deliver(msg)

    def _settle(self) -> None:
        """Hands on the early events that are next, and asks once per jump for what is
        missing."""
        while self.next_seq in self._early:  # entries below next_seq never stay (gap)
            self._hand_on(self._early.pop(self.next_seq))
        if self._replay_asked is not None and self.next_seq > self._replay_asked:
            self._replay_asked = None  # that jump is filled
        if self._early and self._replay_asked is None:
            log.info("coordinator %s: events from %d missing; asking again", self._name,
                     self.next_seq)
            self._replay(self.next_seq)

    def _replay(self, from_seq: int) -> None:
        if self._core.send("REPLAY", {"from_seq": from_seq}):
            self._replay_asked = self.next_seq
            self.replays += 1

    def _ack(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self._since_ack > 0:
            self._since_ack = 0
            # lost when not ready: the REPLAY on the next connection says it
            self._core.send("ACK", {"seq": self.processed})


class Progress:
    """The callback thread's half of ACK pacing: counts the events the callbacks finished
    and reports them to the I/O thread (``report(seq, generation, count, caught_up)``, which
    posts :meth:`Stream.done`) every :data:`ACK_EVERY` events, when the stream changes, and
    at the end of each batch taken from the queue."""

    def __init__(self, report: Callable[[int, int, int, bool], None]) -> None:
        self._report = report
        self._pending: Optional[Tuple[int, int, int]] = None  # (seq, generation, count)
        #: (generation, seq) of the last event finished: ahead of what was reported, read
        #: by the I/O thread when the session resumes
        self.last: Tuple[int, int] = (0, 0)

    def begin(self, generation: int) -> None:
        """An item of stream ``generation`` is next: what an older stream's callbacks
        finished is reported first."""
        if self._pending is not None and self._pending[1] != generation:
            self._flush(False)

    def finished(self, generation: int, seq: int) -> None:
        """The callbacks finished event ``seq`` (or a loss up to it)."""
        self.last = (generation, seq)
        count = 1 if self._pending is None else self._pending[2] + 1
        self._pending = (seq, generation, count)
        if count >= ACK_EVERY:
            self._flush(False)

    def end(self, caught_up: Callable[[], bool]) -> None:
        """The batch is done; ``caught_up()`` says whether nothing more waits."""
        if self._pending is not None:
            self._flush(caught_up())

    def _flush(self, caught_up: bool) -> None:
        seq, generation, count = self._pending  # type: ignore[misc]
        self._pending = None
        self._report(seq, generation, count, caught_up)
