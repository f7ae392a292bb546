"""The baseline MQ: bare pyzmq PUB/SUB through an XSUB/XPUB forwarder (``zmq.proxy``).

Every node has one PUB connected to the forwarder's XSUB side and one SUB connected to its
XPUB side. A message is three frames: topic + NUL (so a SUB prefix is an exact topic), the
sender's random id (a node drops its own messages), the payload. Best effort, as ZeroMQ's
PUB/SUB is: a message goes nowhere while the subscription it needs is still travelling to
the publisher, and queues that reach their high-water mark (1000 messages per hop) drop.

Sockets are not thread-safe, so: the PUB is used under a lock (publish comes from any
thread, and may come before listen(): the PUB is made and connected in __init__); the SUB
belongs to the listener thread, and subscribe/unsubscribe only edit a set under that lock
and wake the listener through an inproc pair, which applies the set to the SUB.
``unsubscribe`` takes fnmatch globs. ``stop()`` wakes ``recv`` (which returns None), then
gives the PUB up to FLUSH_MS to send what is queued.
"""

import fnmatch
import os
import threading
import uuid

import zmq

from ding.framework.message_queue import MQ
from ding.utils import MQ_REGISTRY

FORWARDER_ENV = "DITASK_ZMQ_FORWARDER"
FLUSH_MS = 2000


class Forwarder:
    """An XSUB/XPUB forwarder on free loopback ports, run by a daemon thread. Publishers
    connect to :attr:`publish_endpoint`, subscribers to :attr:`subscribe_endpoint`;
    :attr:`env_value` is both, as the zmqpubsub args parser reads them."""

    def __init__(self, host="127.0.0.1"):
        self._host = host
        self._ctx = zmq.Context()
        self._control = f"inproc://forwarder-control-{uuid.uuid4().hex}"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zmq_forwarder", daemon=True)
        self.publish_endpoint = self.subscribe_endpoint = None

    def start(self):
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the forwarder did not start")
        return self

    def _run(self):
        xsub = self._ctx.socket(zmq.XSUB)
        xpub = self._ctx.socket(zmq.XPUB)
        control = self._ctx.socket(zmq.PAIR)
        try:
            xsub.bind(f"tcp://{self._host}:*")
            xpub.bind(f"tcp://{self._host}:*")
            control.bind(self._control)
            self.publish_endpoint = xsub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.subscribe_endpoint = xpub.getsockopt_string(zmq.LAST_ENDPOINT)
            self._ready.set()
            zmq.proxy_steerable(xsub, xpub, None, control)
        except zmq.ContextTerminated:
            pass
        finally:
            for s in (xsub, xpub, control):
                s.close(linger=0)

    @property
    def env_value(self):
        return f"{self.publish_endpoint} {self.subscribe_endpoint}"

    def stop(self):
        if self._thread.is_alive():
            control = self._ctx.socket(zmq.PAIR)
            control.connect(self._control)
            control.send(b"TERMINATE")
            control.close(linger=1000)
            self._thread.join(5)
        self._ctx.term()


@MQ_REGISTRY.register("zmqpubsub")
class ZmqPubSubMQ(MQ):

    def __init__(self, forwarder="", attach_to=None, **kwargs):
        endpoints = (forwarder or os.environ.get(FORWARDER_ENV, "")).split()
        if len(endpoints) != 2:
            raise ValueError(f"zmqpubsub needs the forwarder's two endpoints (kwarg forwarder or "
                             f"{FORWARDER_ENV}), got {endpoints}")
        self.publish_endpoint, self.subscribe_endpoint = endpoints
        self.attach_to = list(attach_to or [])  # only counted (Barrier); everyone hears everyone
        self._id = uuid.uuid4().hex.encode()
        self._ctx = zmq.Context()
        self._lock = threading.Lock()
        self._topics = set()  # what the node wants, edited under the lock by any thread
        self._applied = set()  # what the SUB has, listener thread only
        # Connected now (connecting does not block), so the forwarder has passed this PUB the
        # current subscriptions by the time main publishes; a PUB drops what no subscription
        # it knows of matches.
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, FLUSH_MS)
        self._pub.connect(self.publish_endpoint)
        self._sub = None
        self._wake_tx = None  # any thread, under the lock
        self._wake_rx = None  # listener thread
        self._stopped = False
        self._listener = None  # the thread that listens (and closes the SUB)
        self._listener_done = threading.Event()

    def listen(self):
        with self._lock:
            if self._stopped:
                return
            wake = f"inproc://wake-{self._id.decode()}"
            self._wake_rx = self._ctx.socket(zmq.PAIR)
            self._wake_rx.bind(wake)
            self._wake_tx = self._ctx.socket(zmq.PAIR)
            self._wake_tx.connect(wake)
            self._listener = threading.get_ident()
            self._sub = self._ctx.socket(zmq.SUB)
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.connect(self.subscribe_endpoint)
            self._apply_subscriptions()

    def _wake(self):
        if self._wake_tx is not None:
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # a wake-up is already queued

    def _apply_subscriptions(self):  # listener thread, lock held
        for t in self._topics - self._applied:
            self._sub.setsockopt(zmq.SUBSCRIBE, t.encode() + b"\0")
        for t in self._applied - self._topics:
            self._sub.setsockopt(zmq.UNSUBSCRIBE, t.encode() + b"\0")
        self._applied = set(self._topics)

    def publish(self, topic, data):
        with self._lock:
            if self._stopped:
                return
            self._pub.send_multipart([topic.encode() + b"\0", self._id, data])

    def subscribe(self, topic):
        with self._lock:
            if topic not in self._topics:
                self._topics.add(topic)
                self._wake()

    def unsubscribe(self, topic):
        with self._lock:
            gone = {t for t in self._topics if t == topic or fnmatch.fnmatchcase(t, topic)}
            if gone:
                self._topics -= gone
                self._wake()

    def recv(self):
        if self._sub is None:
            return None
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        while True:
            with self._lock:
                if self._stopped:
                    break
            events = dict(poller.poll(100))
            if self._wake_rx in events:
                while True:
                    try:
                        self._wake_rx.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                with self._lock:
                    self._apply_subscriptions()
            if self._sub in events:
                frames = self._sub.recv_multipart()
                if len(frames) != 3 or frames[1] == self._id:
                    continue  # malformed, or this node's own
                topic = frames[0][:-1].decode()
                with self._lock:
                    wanted = topic in self._topics
                if wanted:
                    return topic, frames[2]
        self._close_listener_sockets()
        return None

    def _close_listener_sockets(self):
        with self._lock:
            for s in (self._sub, self._wake_rx, self._wake_tx):
                s.close(linger=0)
            self._wake_tx = None
        self._listener_done.set()

    def stop(self):
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            listening = self._sub is not None
            self._wake()
        if listening and threading.get_ident() == self._listener:
            self._close_listener_sockets()  # stopped from the listening thread itself
        elif listening and not self._listener_done.wait(1.0):
            return  # the listener is stuck elsewhere; leave the context to the process exit
        with self._lock:
            if self._pub is not None:
                self._pub.close()  # keeps FLUSH_MS of linger for what is queued
                self._pub = None
        self._ctx.term()
