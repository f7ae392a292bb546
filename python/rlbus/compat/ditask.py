"""DI-engine's current framework (``ding.framework``, "ditask") over the rlbus topic bus.

:class:`RlbusMQ` has the interface ``ding.framework.Parallel`` drives a message queue through
(``listen``, ``publish``, ``subscribe``, ``unsubscribe``, ``recv``, ``stop`` and the optional
``attach_to``), on one :class:`rlbus.Bus` node per process. What it adds to DI-engine's own
queues:

- lossless and in order per publisher, with flow control instead of drops: a node that
  falls behind slows its publishers down;
- a node hears everything published from the moment ``listen()`` has returned, whatever it
  subscribes to later (as DI-engine's nng queue does), and never its own messages; the latest
  model a learner sent (``LATEST_WINS`` topics) reaches a node that listens after it too, and
  one that subscribes to its topic only after it arrived (the framework's ``task.on`` comes
  once the process has built its policy);
- what arrives on a topic the framework has not subscribed to is dropped (as DI-engine's own
  queues do), a fragmented publication as its first fragment arrives (counted in
  :attr:`RlbusMQ.ignored`): another node cannot make this one hold fragments nobody here
  asked for;
- ``publish`` may be called before ``listen()`` (it is sent once connected), from any thread,
  and does not raise when peers are gone;
- ``unsubscribe`` takes glob patterns (``task.*``); ``stop()`` flushes what was published
  and makes a blocked ``recv`` return None at once;
- with a runner's topology (``star``, ``mesh``, ``alone`` with ``attach_to``), a node hears
  only the nodes it is linked to, as over nng, where a node's messages reach the nodes it
  dialled and the ones that dialled it: each node announces its addresses and whom it
  dialled (a retained ``rlbus.ditask.edges.<id>``), and drops what comes from a node it has
  no link with (counted in :attr:`RlbusMQ.off_edges`).

:func:`install` registers it as ``mq_type="rlbus"`` (``patch_dingengine()`` calls it). The
broker is named by ``$RLBUS_ENDPOINT``, else by the runner's ``address`` and ``ports`` (the
``ditask --address --ports`` flags); with neither, the runner starts a broker of its own on
this machine for the run (``rlbus._run``: private to this user, logging to a file, living
until the last process of the run has ended), and its workers find it through the
environment.
"""

from __future__ import annotations

import collections
import fnmatch
import functools
import json
import logging
import os
import socket
import threading
import uuid
from typing import Any, Deque, Dict, FrozenSet, List, Optional, Set, Tuple, cast

from .. import _run
from .._run import DEFAULT_PORT
from ._util import DEFAULT_ENDPOINT, ENDPOINT_ENV, curve_kwargs

log = logging.getLogger("rlbus.compat.ditask")

MQ_TYPE = "rlbus"
_CARRIER = "redis"  # the runner's own mq_type whose argument parser carries ours (see install)
_MARK_ENV = "RLBUS_DITASK_MQ"  # set while a runner of ours runs; children inherit it
_CONNECT_TIMEOUT_S = 30.0
_MAX_EARLY = 100_000  # publications kept before listen() connected
# Topics where only the latest message matters (a learner's weights): the broker keeps the last
# one, and a node whose listen() comes after it still gets it.
LATEST_WINS = ("task.model_exchanger",)

# A node's links (see the module's doc): a retained topic per node.
EDGES = "rlbus.ditask.edges."
_RUN_TAG_ENV = "RLBUS_DITASK_RUN"  # names one runner's workers in their synthetic addresses

# The broker the last runner started for its run (None if it named one): for tests and tools.
last_embedded: Any = None


def _node_id() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:48]
    return f"ditask-{host or 'host'}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def endpoint_from(address: Any = None, ports: Any = None) -> Optional[str]:
    """The broker's endpoint: $RLBUS_ENDPOINT, else ``tcp://<address>:<first port>`` when an
    address is given; None when neither says."""
    explicit = os.environ.get(ENDPOINT_ENV)
    if explicit:
        return explicit
    if address:
        port = ports[0] if isinstance(ports, (list, tuple)) and ports else ports
        return f"tcp://{address}:{int(port) if port else DEFAULT_PORT}"
    return None


class RlbusMQ:
    """One ditask process's message queue: an rlbus bus node (see the module's doc)."""

    def __init__(self, attach_to: Any = None, rlbus_endpoint: Optional[str] = None,
                 address: Any = None, ports: Any = None, edges: Any = None,
                 **kwargs: Any) -> None:
        # DI-engine's parsers pass their own keys (protocol, topology, redis_host, ...):
        # accepted and ignored, as its queues do.
        self.endpoint = rlbus_endpoint or endpoint_from(address, ports) \
            or DEFAULT_ENDPOINT
        self.attach_to = list(attach_to or [])  # what Parallel counts peers by (Barrier)
        self.id = _node_id()
        self._bus: Any = None
        self._lock = threading.Lock()
        self._topics: Set[str] = set()  # replaced, never changed in place (read unlocked)
        self._early: List[Tuple[str, bytes]] = []
        # The latest message of each LATEST_WINS topic not subscribed yet, and what a
        # subscribe() made due (handed out before anything else).
        self._latest: Dict[str, bytes] = {}
        self._due: Deque[Tuple[str, bytes]] = collections.deque()
        self._stopping = threading.Event()
        # This node's links (the runner's topology): {"addresses": [...], "attach_to": [...]};
        # None: it hears every node. The others' as announced: id -> (addresses, dialled).
        self._edges = edges
        self._mine = frozenset(edges["addresses"]) if edges else frozenset()
        self._dialled = frozenset(edges["attach_to"]) if edges else frozenset()
        self._peers: Dict[str, Tuple[FrozenSet[str], FrozenSet[str]]] = {}
        self.off_edges = 0  # messages dropped: from a node this one has no link with

    def _linked(self, sender: str) -> bool:
        """Whether this node hears `sender`: one of them dialled the other (a node that
        announced nothing, or this node without a topology: yes)."""
        peer = self._peers.get(sender)
        if self._edges is None or peer is None:
            return True
        addresses, dialled = peer
        return bool(addresses & self._dialled) or bool(dialled & self._mine)

    def _note_edges(self, topic: str, payload: bytes) -> None:
        try:
            said = json.loads(payload)
            self._peers[topic[len(EDGES):]] = (frozenset(said["addresses"]),
                                               frozenset(said["attach_to"]))
        except (ValueError, KeyError, TypeError):
            log.warning("rlbus MQ %s: a bad announcement on %s: dropped", self.id, topic)

    @property
    def ignored(self) -> int:
        """Fragmented publications dropped on arrival: their topic was not subscribed to."""
        bus = self._bus
        return cast(int, bus.ignored) if bus is not None else 0

    def _accept(self, topic: str) -> bool:
        """What the node keeps of what arrives (on its I/O thread)."""
        return topic in self._topics or topic in LATEST_WINS or topic.startswith(EDGES)

    def listen(self) -> None:
        """Connects, and subscribes to every topic (filtered here) before it returns."""
        from ..bus import Bus
        bus = Bus(self.endpoint, self.id, accept=self._accept, **curve_kwargs())
        if not bus.wait_ready(_CONNECT_TIMEOUT_S):
            log.warning("rlbus MQ %s: no session with the broker at %s after %.0f s (%s); "
                        "still trying", self.id, self.endpoint, _CONNECT_TIMEOUT_S,
                        bus.last_error or bus.state)
        try:
            bus.subscribe("", prefix=True, last=True, timeout=_CONNECT_TIMEOUT_S)
        except TimeoutError as exc:
            log.warning("rlbus MQ %s: %s", self.id, exc)
        if self._edges is not None:  # before anything else it sends, so heard first
            self._publish_retained(bus, EDGES + self.id, json.dumps(self._edges).encode())
        with self._lock:
            self._bus = bus
            early, self._early = self._early, []
        for topic, data in early:
            self._publish(bus, topic, data)
        if self._stopping.is_set():  # stopped while listen() was connecting
            bus.close()

    def publish(self, topic: str, data: bytes) -> None:
        with self._lock:
            bus = self._bus
            if bus is None:
                if self._stopping.is_set():
                    return
                if len(self._early) >= _MAX_EARLY:
                    log.error("rlbus MQ %s: %d publications wait for listen(); dropping one on "
                              "%r", self.id, len(self._early), topic)
                    return
                self._early.append((topic, bytes(data)))
                return
        self._publish(bus, topic, data)

    def _publish(self, bus: Any, topic: str, data: bytes) -> None:
        self._publish_retained(bus, topic, data, topic in LATEST_WINS)

    def _publish_retained(self, bus: Any, topic: str, data: bytes, retain: bool = True) -> None:
        try:
            bus.publish(topic, data, retain=retain, timeout=None)
        except RuntimeError:
            log.debug("rlbus MQ %s: publish on %r after stop", self.id, topic)

    def subscribe(self, topic: str) -> None:
        """From now on ``recv`` returns what arrives on ``topic``; for a LATEST_WINS topic,
        first the latest message that arrived before."""
        with self._lock:
            self._topics = self._topics | {topic}
            latest = self._latest.pop(topic, None)
            if latest is not None:
                self._due.append((topic, latest))

    def unsubscribe(self, topic: str) -> None:
        """Drops ``topic``, or every topic a glob pattern (``task.*``) matches."""
        with self._lock:
            self._topics = {t for t in self._topics
                            if t != topic and not fnmatch.fnmatchcase(t, topic)}

    def recv(self) -> Optional[Tuple[str, bytes]]:
        """The next message on a subscribed topic; None once stopped."""
        while not self._stopping.is_set():
            bus = self._bus
            if bus is None:  # pragma: no cover - Parallel calls listen() first
                self._stopping.wait(0.05)
                continue
            with self._lock:
                if self._due:
                    return self._due.popleft()
            msg = bus.recv(timeout=0.25)
            if msg is None:
                continue
            if msg.topic.startswith(EDGES):
                self._note_edges(msg.topic, msg.payload)
                continue
            if not self._linked(msg.sender):
                self.off_edges += 1
                continue
            with self._lock:
                if msg.topic in self._topics:
                    if self._due:  # a subscribe() meanwhile: what it made due comes first
                        self._due.append((msg.topic, msg.payload))
                        return self._due.popleft()
                    return msg.topic, msg.payload
                if msg.topic in LATEST_WINS:  # kept for a subscribe() to come
                    self._latest[msg.topic] = msg.payload
        return None

    def stop(self) -> None:
        """Flushes what was published, leaves the bus; a blocked recv returns None."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            bus, self._bus = self._bus, None
        if bus is not None:
            bus.close()

    def __del__(self) -> None:  # pragma: no cover - as DI-engine's queues do
        try:
            self.stop()
        except Exception:
            pass


class _Main:
    """The user's ``main`` as the runner hands it to its workers. A spawned worker unpickles
    it before it builds its queue, which imports this module there: with the marker in its
    environment, the worker installs the rlbus MQ even if nothing else in it did. It also
    carries the runner's share of the run (rlbus._run), so the run's broker lives as long as
    the worker, even if the runner is killed before the worker has imported anything."""

    def __init__(self, main: Any, run_hold: Any = None) -> None:
        self.main = main
        functools.update_wrapper(self, main)
        _run.adopt(run_hold)  # a spawned worker shares the run from the moment it exists

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.main(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (_Main, (self.main, _run.for_child()))


def _patched_runner(original: Any) -> Any:
    """Parallel.runner that knows mq_type="rlbus". The runner picks its argument parser from a
    table of its own, so an rlbus run goes through the parser of ``_CARRIER`` (which passes its
    arguments on unchanged) and the marker in the environment makes ``_run`` build RlbusMQ.
    With no broker named, the runner starts one for the run."""

    @functools.wraps(original)
    def runner(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("mq_type") != MQ_TYPE:
            return original(*args, **kwargs)
        kwargs["mq_type"] = _CARRIER
        inner = original(*args, **kwargs)

        @functools.wraps(inner)
        def run(main: Any, *a: Any, **k: Any) -> Any:
            global last_embedded
            marked = os.environ.get(_MARK_ENV)
            os.environ[_MARK_ENV] = MQ_TYPE
            own_run = False
            tagged = os.environ.get(_RUN_TAG_ENV)
            os.environ[_RUN_TAG_ENV] = uuid.uuid4().hex[:12]
            try:
                named = endpoint_from(kwargs.get("address"), kwargs.get("ports"))
                if named is None or named == _run.run_endpoint():
                    own_run = _run.current() is None
                    _run.ensure_broker()
                    last_embedded = _run.last_started
                return inner(_Main(main), *a, **k)
            finally:
                if own_run:  # its broker stops once the workers still running are gone
                    _run.leave()
                for name, was in ((_MARK_ENV, marked), (_RUN_TAG_ENV, tagged)):
                    if was is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = was
        return run
    runner.__rlbus__ = True  # type: ignore[attr-defined]
    return runner


def _synthetic(tag: str, k: int) -> str:
    return f"rlbus:{tag}:worker{k}"


def nng_attach_to(local_id: int, topology: Any, attach_to: Any, tag: str = "") -> List[str]:
    """What DI-engine's nng parser would give a worker as ``attach_to``: the workers before it
    in a mesh, the first one in a star, none when alone, then the caller's own. The runner's
    own workers stand in as ``rlbus:<run>:worker<k>`` (the run a tag of the runner's);
    Parallel counts a Barrier's peers by its length."""
    own = list(attach_to or [])
    if topology == "mesh":
        return [_synthetic(tag, k) for k in range(local_id)] + own
    if topology == "star" and local_id > 0:
        return [_synthetic(tag, 0)] + own
    return own


def _this_host() -> List[str]:
    """The addresses another node on this machine may dial this one at (nng's default is the
    host's outward address)."""
    found = ["127.0.0.1", "localhost"]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: it picks the route
            found.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        found.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return found


def nng_addresses(local_id: int, protocol: Any, address: Any, ports: Any,
                  tag: str) -> List[str]:
    """The addresses a worker would listen at over nng (so that a runner elsewhere may name
    it in ``attach_to``): its synthetic one, and over tcp ``tcp://<address>:<port>``, the
    port the ``ports`` list's or the first port plus the worker's index."""
    out = [_synthetic(tag, local_id)]
    if protocol == "tcp" and ports is not None:
        if isinstance(ports, (list, tuple)):
            port = int(ports[local_id]) if local_id < len(ports) else None
        else:
            port = int(ports) + local_id
        if port is not None:
            hosts = [address] if address else _this_host()
            out += [f"tcp://{h}:{port}" for h in hosts]
    return out


def _patched_run(original: Any) -> Any:
    @functools.wraps(original)
    def _run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("mq_type") == _CARRIER and os.environ.get(_MARK_ENV) == MQ_TYPE:
            kwargs["mq_type"] = MQ_TYPE
            local_id, tag = kwargs.get("local_id", 0), os.environ.get(_RUN_TAG_ENV, "")
            kwargs["attach_to"] = nng_attach_to(local_id, kwargs.get("topology"),
                                                kwargs.get("attach_to"), tag)
            kwargs["edges"] = {
                "addresses": nng_addresses(local_id, kwargs.get("protocol"),
                                           kwargs.get("address"), kwargs.get("ports"), tag),
                "attach_to": kwargs["attach_to"]}
        return original(self, *args, **kwargs)
    _run.__rlbus__ = True  # type: ignore[attr-defined]
    return _run


def install() -> bool:
    """Registers RlbusMQ as mq_type "rlbus" in an importable ``ding.framework`` and teaches
    ``Parallel.runner`` the name. False (nothing changed) without ding.framework. Idempotent."""
    try:
        from ding.framework import message_queue as mq_module  # type: ignore
        from ding.framework.parallel import Parallel  # type: ignore
    except ImportError as exc:
        log.debug("rlbus: no ding.framework to install the rlbus MQ into (%s)", exc)
        return False
    registry: Any = getattr(mq_module, "MQ_REGISTRY", None)
    if registry is None:
        from ding.utils import MQ_REGISTRY as registry  # type: ignore
    registry.register(MQ_TYPE, force_overwrite=True)(RlbusMQ)
    runner = Parallel.__dict__.get("runner")
    if runner is not None and not getattr(runner.__func__, "__rlbus__", False):
        Parallel.runner = classmethod(_patched_runner(runner.__func__))
    run = Parallel.__dict__.get("_run")
    if run is not None and not getattr(run, "__rlbus__", False):
        Parallel._run = _patched_run(run)
    return True


if os.environ.get(_MARK_ENV) == MQ_TYPE:  # a worker an rlbus runner spawned (see _Main)
    install()
