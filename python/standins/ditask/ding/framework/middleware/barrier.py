"""A barrier across nodes, for peers that expect a known number of each other.

A node expects ``Parallel().get_attch_to_len() + attch_from_nums`` peers (the nodes it dialled
plus the nodes that dial it). First it finds them: it broadcasts ``b_det`` every 0.1 s until
it has heard exactly that many distinct senders (more never match); a ``b_det`` that asks for
an answer is answered once, so a node that subscribed late still hears the others. Then, per
barrier call (an epoch), it broadcasts ``b_req`` and answers each peer's ``b_req`` with a
``b_ack``; it passes when it has every peer's request and every peer's ack. Nothing is resent
after detection: a lost request or ack ends in TimeoutError. Its own messages delivered back
to it count as a peer, so an MQ that echoes breaks the count.

The runtime is made by Parallel._run right after the listener starts, so its subscriptions
exist before main runs: ``b_ack`` and ``b_req`` first, ``b_det`` last, so a node whose
``b_det`` is heard has its other subscriptions in place too (on an MQ that keeps order).
"""

import threading
import time

from ...utils import SingletonMetaclass


class BarrierRuntime(metaclass=SingletonMetaclass):

    def __init__(self, node_id):
        from ..task import task
        self.node_id = node_id
        self._cond = threading.Condition()
        self._peers = set()
        self._detected = False
        self._epoch = 0
        self._reqs = {}  # epoch -> senders of b_req
        self._acks = {}  # epoch -> senders of b_ack addressed to this node
        task.on("b_ack", self._on_ack)
        task.on("b_req", self._on_req)
        task.on("b_det", self._on_det)

    def _on_det(self, sender, wants_answer):
        from ..task import task
        with self._cond:
            self._peers.add(sender)
            self._cond.notify_all()
        if wants_answer:
            task.emit("b_det", self.node_id, False, only_remote=True)

    def _on_req(self, epoch, sender):
        from ..task import task
        with self._cond:
            self._reqs.setdefault(epoch, set()).add(sender)
            self._cond.notify_all()
        task.emit("b_ack", epoch, sender, self.node_id, only_remote=True)

    def _on_ack(self, epoch, to, sender):
        if to != self.node_id:
            return
        with self._cond:
            self._acks.setdefault(epoch, set()).add(sender)
            self._cond.notify_all()

    def __call__(self, attch_from_nums, timeout=60):
        from ..parallel import Parallel
        from ..task import task
        expected = Parallel().get_attch_to_len() + attch_from_nums
        deadline = time.monotonic() + timeout
        next_send = [0.0]

        def wait(cond, resend=None):
            with self._cond:
                while not cond():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(
                            f"barrier on node {self.node_id}: expected {expected} peers, heard "
                            f"{sorted(self._peers)}; requests {self._reqs}, acks {self._acks}")
                    if resend is not None and time.monotonic() >= next_send[0]:
                        next_send[0] = time.monotonic() + 0.1
                        self._cond.release()
                        try:
                            resend()
                        finally:
                            self._cond.acquire()
                    self._cond.wait(min(left, 0.1))

        if not self._detected:
            wait(lambda: len(self._peers) == expected,
                 lambda: task.emit("b_det", self.node_id, True, only_remote=True))
            self._detected = True
        epoch = self._epoch
        self._epoch += 1
        task.emit("b_req", epoch, self.node_id, only_remote=True)
        wait(lambda: len(self._reqs.get(epoch, ())) == expected
             and len(self._acks.get(epoch, ())) == expected)


class Barrier:
    """Middleware: every step waits for the barrier (``attch_from_nums`` peers dial this one)."""

    def __init__(self, attch_from_nums, timeout=60):
        self.attch_from_nums = attch_from_nums
        self.timeout = timeout

    def __call__(self, ctx):
        from ..parallel import Parallel
        Parallel().barrier_runtime(self.attch_from_nums, self.timeout)
