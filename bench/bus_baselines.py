#!/usr/bin/python3
"""The message queues DI-engine's distributed mode can run over today, measured side by side
on one machine, through the MQ interface its router drives (listen / publish / subscribe /
recv / stop), each node a process of its own. Nothing here asserts a timing.

Backends (one class each; another MQ is one more class in BACKENDS):

  redis   the shape of DI-engine's RedisMQ (python/standins/ditask/redis_mq.py): one PUBLISH per
          message, self-discard by node id, a PubSub polled with a 1 ms sleep; against a
          redis-server this script starts on a free port (skipped if not installed)
  bare    bare pyzmq PUB/SUB, direct: every node binds a PUB, its SUB connects to the others'
  proxy   pyzmq PUB/SUB through an XSUB/XPUB forwarder (zmq.proxy) in its own process: the
          zmqpubsub MQ the DI-engine tests run over too (python/standins/ditask/zmq_mq.py)
  rlbus   rlbus.Bus (python/rlbus/bus.py) through an rlbus-broker this script starts on free
          loopback ports (rlbus.Broker; $RLBUS_BROKER names the binary): every node a Bus,
          subscribe() a subscription at the broker, publish() with no timeout (held back by
          the broker's credit, never dropped). Skipped if no broker binary is found
  ditask  rlbus.compat.ditask.RlbusMQ, what DI-engine's Parallel would drive (one Bus per
          node, subscribed to every topic, filtered by the subscribe() calls); round trip
          and msgs_1to1 only, against a broker of its own
  cpp     rlbus::bus, the C++ SDK: `rlbus-bench bus-rows` (this build's, or --bench) makes
          the same measurements with every node an rlbus::bus in a thread of its own,
          against a broker of its own, and prints its rows for this script

Measurements, each a row (backend, metric, median, unit):

  rtt_64B           round trip of a 64 B message to an echoing node: median and p99 over N
  msgs_1to1         messages/s, one publisher to one subscriber (64 B), median of trials
  msgs_4to1         the same from four publishers at once
  MBps_1MiB         MB/s of 1 MiB payloads, one publisher (and MBps_64MiB unless --quick)
  lost_slow_sub     messages lost when the subscriber handles them at a tenth of the rate the
                    publisher sends them (16 KiB each), counted by sequence number; the
                    subscriber drains at full speed once the publisher is done
  listen_s          a DI-engine worker's start-up: seconds from spawning a fresh Python process
                    (which imports the framework, then builds the MQ as a worker does: for
                    ditask, patch_dingengine() first) to its listen() returning; beside it the
                    floor (the same process with no MQ), and what the MQ's imports and listen()
                    took. redis and ditask only

A rate counts from the moment the publishers start to the last message received; what is
lost in a rate row is reported beside it. Publishers first send probes until the subscriber
has heard each of them, so subscriptions are in place when timing starts.

After the rows, a summary puts each metric's medians side by side, with the rlbus and ditask
rows' ratios to the redis shape (and to the proxy for MB/s), and the targets rlbus is held to
beside what was measured (printed, never asserted).

Usage: bench/bus_baselines.py [--quick] [--backends redis,bare,proxy,rlbus,ditask,cpp]
                              [--trials N] [--json PATH] [--build DIR]
  (or `rlbus-bench bus [ARGS]`, which runs this script with its build tree)
"""

import argparse
import importlib.util
import json
import logging
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DITASK = os.path.join(ROOT, "python", "standins", "ditask")
# the stand-in DI-engine framework with its MQ shapes, and the rlbus package
PATHS = [DITASK, os.path.join(ROOT, "python")]
sys.path[:0] = PATHS

import zmq  # noqa: E402

import redis_mq  # noqa: E402
import zmq_mq  # noqa: E402
from ding.framework.message_queue import MQ  # noqa: E402
from rlbus import free_port  # noqa: E402

HEADER = struct.Struct("<iq")  # publisher index, sequence number (-1: a probe)
MB = 1e6


# -- backends --------------------------------------------------------------------------------------

class Backend:
    """What a measurement needs of an MQ: ``start()`` whatever serves it, ``nodes(n)`` the
    configurations of n nodes (picklable: they travel to spawned processes), ``open(config)``
    an MQ object for one node (called in that node's process), ``stop()``."""

    name = "?"
    metrics = None  # the metrics it is measured on (prefixes of the row names); None: all

    @staticmethod
    def unavailable():
        """None, or why this backend cannot run here."""
        return None

    def describe(self):
        """None, or a line on how it was set up (printed with its rows)."""
        return None

    def wants(self, metric):
        return self.metrics is None or any(metric.startswith(m) for m in self.metrics)

    def start(self):
        pass

    def nodes(self, n):
        raise NotImplementedError

    @staticmethod
    def open(config):
        raise NotImplementedError

    def stop(self):
        pass

    # What a fresh DI-engine worker process imports and runs to build this MQ, as Python
    # statements that end with `mq` (listen_s); None: not measured.
    worker_code = None


class RedisBackend(Backend):
    name = "redis"

    @staticmethod
    def unavailable():
        if shutil.which("redis-server") is None:
            return "redis-server is not installed (apt-get install redis-server)"
        if importlib.util.find_spec("redis") is None:
            return "python3-redis is not installed (apt-get install python3-redis)"
        return None

    def start(self):
        import redis
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer")
                time.sleep(0.02)
        client.close()

    def nodes(self, n):
        return [{"redis_host": "127.0.0.1", "redis_port": self.port}] * n

    @staticmethod
    def open(config):
        return redis_mq.RedisMQ(**config)

    worker_code = "import redis_mq\nmq = redis_mq.RedisMQ(**config)"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class BareMQ(MQ):
    """Direct PUB/SUB: this node's PUB binds, its SUB connects to every other node's PUB.
    The bench subscribes from the listening thread only, so the SUB needs no hand-off."""

    def __init__(self, bind, peers):
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 2000)
        self._pub.bind(bind)
        self._peers = peers
        self._topics = []
        self._lock = threading.Lock()
        self._stopped = False
        self._listener = None
        self._closed = threading.Event()

    def listen(self):
        self._listener = threading.get_ident()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        for t in self._topics:
            self._sub.setsockopt(zmq.SUBSCRIBE, t.encode() + b"\0")
        for p in self._peers:
            self._sub.connect(p)

    def subscribe(self, topic):
        self._topics.append(topic)
        if self._listener is not None:
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode() + b"\0")

    def unsubscribe(self, topic):
        pass

    def publish(self, topic, data):
        with self._lock:
            self._pub.send_multipart([topic.encode() + b"\0", data])

    def recv(self):
        while not self._stopped:
            if self._sub.poll(100):
                topic, data = self._sub.recv_multipart()
                return topic[:-1].decode(), data
        self._sub.close()
        self._closed.set()
        return None

    def stop(self):
        if self._stopped:
            return
        self._stopped = True
        if self._listener not in (None, threading.get_ident()):
            self._closed.wait(1)  # the listener closes its SUB on its way out
        elif self._listener is not None:
            self._sub.close()
        self._pub.close()  # with its linger
        self._ctx.term()


class BareBackend(Backend):
    name = "bare"

    def nodes(self, n):
        addrs = [f"tcp://127.0.0.1:{free_port()}" for _ in range(n)]
        return [{"bind": a, "peers": [b for b in addrs if b != a]} for a in addrs]

    @staticmethod
    def open(config):
        return BareMQ(**config)


def _forwarder_process(out):
    f = zmq_mq.Forwarder().start()
    out.put(f.env_value)
    threading.Event().wait()  # until terminated


class ProxyBackend(Backend):
    name = "proxy"

    def start(self):
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        self.proc = ctx.Process(target=_forwarder_process, args=(out,), daemon=True)
        self.proc.start()
        self.forwarder = out.get(timeout=20)

    def nodes(self, n):
        return [{"forwarder": self.forwarder}] * n

    @staticmethod
    def open(config):
        return zmq_mq.ZmqPubSubMQ(**config)

    def stop(self):
        self.proc.terminate()
        self.proc.join(10)


class BusMQ(MQ):
    """The MQ interface over one :class:`rlbus.bus.Bus` node, as thin as it goes: listen()
    waits for the session, subscribe() is a subscription at the broker (in force when it
    returns), publish() waits for credit as long as it takes, stop() flushes and closes (a
    blocked recv returns None). ``lost`` afterwards: what the broker reported dropped."""

    def __init__(self, endpoint, id):
        from rlbus.bus import Bus
        self._bus = Bus(endpoint, id)
        self.lost = 0

    def listen(self):
        if not self._bus.wait_ready(30):
            raise RuntimeError(f"no session with the broker: {self._bus.last_error}")

    def subscribe(self, topic):
        self._bus.subscribe(topic)

    def unsubscribe(self, topic):
        self._bus.unsubscribe(topic)

    def publish(self, topic, data):
        try:
            self._bus.publish(topic, data, timeout=None)
        except RuntimeError:  # stopped meanwhile
            pass

    def recv(self):
        msg = self._bus.recv()
        return None if msg is None else (msg.topic, msg.payload)

    def stop(self):
        self._bus.close(timeout=30)
        self.lost = self._bus.lost


class RlbusBackend(Backend):
    """A broker of the bench's own on free loopback ports; every node a Bus."""

    name = "rlbus"
    # Broker flags beyond what rlbus.Broker passes (--drain-ms 0), printed with the rows
    # (--rlbus-broker-args to change them): none, so the rows are the broker's defaults.
    broker_args: tuple = ()

    @staticmethod
    def unavailable():
        try:
            from rlbus._broker import find_broker
            find_broker()
        except (ImportError, FileNotFoundError) as exc:
            return f"no rlbus broker: {exc}"
        return None

    def start(self):
        from rlbus._broker import Broker
        self.broker = Broker(list(self.broker_args)).start()

    def describe(self):
        return (f"broker {os.path.basename(self.broker.binary)} "
                f"{' '.join(self.broker_args) or '(bus settings: the defaults)'}")

    def nodes(self, n):
        tag = uuid.uuid4().hex[:8]
        return [{"endpoint": self.broker.router, "id": f"bench-{tag}-{i}"} for i in range(n)]

    @staticmethod
    def open(config):
        return BusMQ(**config)

    def stop(self):
        self.broker.stop()


class DitaskBackend(RlbusBackend):
    name = "ditask"
    metrics = ("rtt_64B", "msgs_1to1", "listen_s")

    def nodes(self, n):
        return [{"rlbus_endpoint": self.broker.router}] * n

    @staticmethod
    def open(config):
        from rlbus.compat.ditask import RlbusMQ
        return RlbusMQ(**config)

    # what a DI-engine user's worker does: the patch, then the queue the runner builds
    worker_code = ("import rlbus.compat\nrlbus.compat.patch_dingengine()\n"
                   "from ding.utils import MQ_REGISTRY\nmq = MQ_REGISTRY.get('rlbus')(**config)")


class CppBackend(RlbusBackend):
    """rlbus::bus, the C++ SDK: ``rlbus-bench bus-rows`` makes the same measurements with every
    node an rlbus::bus in a thread of its own (its own ZeroMQ context and I/O thread), against
    the broker this backend starts, and prints its rows for this script to merge."""

    name = "cpp"
    bench = None  # the rlbus-bench binary: --bench, else $RLBUS_BENCH_BIN, else the build's

    @classmethod
    def unavailable(cls):
        why = RlbusBackend.unavailable()
        if why:
            return why
        if not cls.bench or not os.access(cls.bench, os.X_OK):
            return f"no rlbus-bench binary at {cls.bench} (--bench or $RLBUS_BENCH_BIN)"
        return None

    def measure(self, opts):
        cmd = [self.bench, "bus-rows", "--endpoint", self.broker.router,
               "--trials", str(opts.trials), "--round-trips", str(opts.round_trips),
               "--count", str(opts.count), "--mib-count", str(opts.mib_count),
               "--big", "false" if opts.quick else "true",
               "--slow-rate", str(opts.slow_rate), "--slow-seconds", str(opts.slow_seconds),
               "--slow-size", str(opts.slow_size)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=1800)
        rows = []
        for line in proc.stdout.splitlines():
            if line.startswith("rlbus-bench bus row "):
                row = json.loads(line[len("rlbus-bench bus row "):])
                rows.append((row.pop("metric"), row.pop("median"), row.pop("unit"), row))
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
        return rows


BACKENDS = {b.name: b for b in (RedisBackend, BareBackend, ProxyBackend, RlbusBackend,
                                DitaskBackend, CppBackend)}


# -- node processes --------------------------------------------------------------------------------

def _quiet():
    logging.getLogger().setLevel(logging.CRITICAL)  # RedisMQ logs every failed poll


def _echo(backend_cls, config, ready):
    """Answers every ``ping`` with a ``pong`` of the same payload until an empty one."""
    _quiet()
    mq = backend_cls.open(config)
    mq.listen()  # RedisMQ makes its PubSub here: subscriptions come after
    mq.subscribe("ping")
    ready.set()
    while True:
        msg = mq.recv()
        if not msg or not msg[1]:
            break
        mq.publish("pong", msg[1])
    mq.stop()


def _publisher(backend_cls, config, index, count, size, rate, go, done, sent_out):
    """Sends probes until ``go``, then ``count`` messages of ``size`` bytes (paced to ``rate``
    per second if given), then reports how long sending took."""
    _quiet()
    mq = backend_cls.open(config)
    _listen_in_thread(mq)  # as a node's listener thread does; nothing is received
    pad = b"\0" * max(0, size - HEADER.size)
    while not go.wait(0.02):
        mq.publish("data", HEADER.pack(index, -1))  # probes stay small whatever the size
    t0 = time.monotonic()
    for seq in range(count):
        if rate:
            ahead = t0 + seq / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        mq.publish("data", HEADER.pack(index, seq) + pad)
    sent_out.put((index, time.monotonic() - t0))
    done.set()
    mq.stop()  # flushes what is queued (the MQs' stop keeps a linger)


def _listen_in_thread(mq):
    """listen() then recv() until stopped, in a thread of its own; returns once listening."""
    ready = threading.Event()

    def loop():
        mq.listen()
        ready.set()
        while _recv_or_none(mq) is not None:
            pass

    threading.Thread(target=loop, name="mq_listener", daemon=True).start()
    ready.wait(10)


class Watchdog:
    """Stops ``mq`` (ending a blocked recv) once ``idle()`` has held for ``grace`` seconds, or
    at ``deadline`` seconds from now."""

    def __init__(self, mq, idle, grace, deadline):
        self._mq, self._idle, self._grace = mq, idle, grace
        self._end = time.monotonic() + deadline
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        since = None
        while not self._done.wait(0.05):
            now = time.monotonic()
            if self._idle():
                since = since or now
            else:
                since = None
            if now > self._end or (since and now - since > self._grace):
                self._mq.stop()
                return

    def close(self):
        self._done.set()
        self._thread.join()


def _recv_or_none(mq):
    try:
        return mq.recv()
    except RuntimeError:  # RedisMQ once stopped
        return None


# -- measurements ------------------------------------------------------------------------------------

def measure_rtt(backend, n):
    ctx = multiprocessing.get_context("spawn")
    me, peer = backend.nodes(2)
    ready = ctx.Event()
    echo = ctx.Process(target=_echo, args=(type(backend), peer, ready), daemon=True)
    echo.start()
    mq = backend.open(me)
    try:
        ready.wait(30)
        mq.listen()
        mq.subscribe("pong")
        stop_warm = threading.Event()

        def warm():
            while not stop_warm.wait(0.02):
                mq.publish("ping", HEADER.pack(0, -1) + b"\0" * (64 - HEADER.size))

        warmer = threading.Thread(target=warm, daemon=True)
        warmer.start()
        progress = [0, time.monotonic()]
        dog = Watchdog(mq, lambda: time.monotonic() - progress[1] > 2, 0, 60)
        msg = _recv_or_none(mq)  # the first answer to a probe
        stop_warm.set()
        warmer.join()
        times = []
        for seq in range(n if msg else 0):
            payload = HEADER.pack(0, seq) + b"\0" * (64 - HEADER.size)
            t0 = time.perf_counter()
            mq.publish("ping", payload)
            while True:
                msg = _recv_or_none(mq)
                if msg is None or HEADER.unpack_from(msg[1])[1] == seq:
                    break  # (answers to probes are skipped)
            if msg is None:
                break
            times.append(time.perf_counter() - t0)
            progress[1] = time.monotonic()
        dog.close()
        mq.publish("ping", b"")
    finally:
        mq.stop()
        echo.join(5)
        if echo.is_alive():
            echo.kill()
    if not times:
        return [("rtt_64B_median", None, "us", {"lost": n}), ("rtt_64B_p99", None, "us", {})]
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    extra = {"round_trips": len(times), "lost": n - len(times)}
    return [("rtt_64B_median", statistics.median(times) * 1e6, "us", extra),
            ("rtt_64B_p99", p99 * 1e6, "us", extra)]


def stream(backend, publishers, count, size, rate=None, slow_factor=None):
    """``publishers`` processes each send ``count`` messages to this process. Returns
    (messages received, seconds from go to the last one, distinct per publisher, slowest
    publisher's sending time, what the receiving MQ says it lost or None if it cannot)."""
    ctx = multiprocessing.get_context("spawn")
    configs = backend.nodes(publishers + 1)
    go = ctx.Event()
    sent = ctx.Queue()
    dones = [ctx.Event() for _ in range(publishers)]
    procs = [ctx.Process(target=_publisher, daemon=True, args=(
        type(backend), configs[i + 1], i, count, size, rate, go, dones[i], sent))
        for i in range(publishers)]
    mq = backend.open(configs[0])
    for p in procs:
        p.start()
    mq.listen()
    mq.subscribe("data")
    heard = set()
    seen = [set() for _ in range(publishers)]
    received = 0
    state = {"last": time.monotonic(), "t0": None}

    def all_done():
        return all(d.is_set() for d in dones)

    dog = Watchdog(mq, lambda: all_done() and time.monotonic() - state["last"] > 0.5, 0.5, 60)
    delay = None
    try:
        while True:
            msg = _recv_or_none(mq)
            if msg is None:
                break
            index, seq = HEADER.unpack_from(msg[1])
            if seq < 0:
                heard.add(index)
                if len(heard) == publishers and state["t0"] is None:
                    state["t0"] = time.monotonic()
                    go.set()
                continue
            received += 1
            seen[index].add(seq)
            state["last"] = time.monotonic()
            if received >= publishers * count:
                break
            if slow_factor and rate and not all_done():
                delay = delay or slow_factor / rate
                time.sleep(delay)
    finally:
        dog.close()
        mq.stop()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    send_times = []
    while not sent.empty():
        send_times.append(sent.get()[1])
    elapsed = (state["last"] - state["t0"]) if state["t0"] else float("nan")
    return (received, elapsed, [len(s) for s in seen], max(send_times, default=float("nan")),
            getattr(mq, "lost", None))


def measure_rates(backend, opts):
    rows = []
    cases = [("msgs_1to1", 1, opts.count, 64), ("msgs_4to1", 4, opts.count // 4, 64)]
    for metric, pubs, count, size in cases:
        if not backend.wants(metric):
            continue
        rates, lost, reported = [], [], []
        for _ in range(opts.trials):
            received, elapsed, distinct, _, said = stream(backend, pubs, count, size)
            rates.append(received / elapsed if received and elapsed > 0 else 0.0)
            lost.append(pubs * count - sum(distinct))
            reported.append(said)
        rows.append((metric, statistics.median(rates), "msg/s",
                     _extra({"sent": pubs * count, "lost": lost, "trials": rates}, reported)))
    sizes = [(1 << 20, opts.mib_count)] + ([] if opts.quick else [(64 << 20, 3)])
    for size, count in sizes:
        metric = f"MBps_{size >> 20}MiB"
        if not backend.wants(metric):
            continue
        rates, lost, reported = [], [], []
        for _ in range(opts.trials):
            received, elapsed, distinct, _, said = stream(backend, 1, count, size)
            rates.append(received * size / MB / elapsed if received and elapsed > 0 else 0.0)
            lost.append(count - sum(distinct))
            reported.append(said)
        rows.append((metric, statistics.median(rates), "MB/s",
                     _extra({"sent": count, "lost": lost, "trials": rates}, reported)))
    return rows


def _extra(extra, reported):
    """``reported``: per trial, the receiver's own count of what it lost (None: not known)."""
    if any(r is not None for r in reported):
        extra["reported_lost"] = reported
    return extra


def measure_slow(backend, opts):
    if not backend.wants("lost_slow_sub"):
        return []
    count = int(opts.slow_rate * opts.slow_seconds)
    lost, send_rate, reported, took = [], [], [], []
    for _ in range(opts.trials):
        received, elapsed, distinct, send_time, said = stream(
            backend, 1, count, opts.slow_size, rate=opts.slow_rate, slow_factor=10)
        lost.append(count - sum(distinct))
        send_rate.append(round(count / send_time, 1) if send_time > 0 else float("nan"))
        reported.append(said)
        took.append(round(elapsed, 2))
    return [("lost_slow_sub", statistics.median(lost), "msgs", _extra(
        {"sent": count, "size": opts.slow_size, "publisher_rate": opts.slow_rate,
         "achieved_send_rate": send_rate, "seconds": took, "trials": lost}, reported))]


# A fresh worker process: the framework a DI-engine worker imports (its stand-in here), then
# the backend's code, then listen(); says how long each part took, from its first line.
STARTUP = """
import json, os, sys, time
t0 = time.monotonic()
sys.path[:0] = json.loads(sys.argv[1])
config = json.loads(sys.argv[2])
from ding.framework import Parallel, task  # noqa: F401
t1 = time.monotonic()
exec(sys.argv[3])
t2 = time.monotonic()
mq.listen()
t3 = time.monotonic()
print(json.dumps({"framework": t1 - t0, "mq": t2 - t1, "listen": t3 - t2}), flush=True)
mq.stop()
os._exit(0)
"""


def measure_startup(backend, opts):
    """listen_s: from a worker process's spawn to its MQ's listen() returning, with the
    imports that takes (the median of opts.startup_trials fresh processes), and the floor: the
    same process with no MQ at all."""
    if backend.worker_code is None or not backend.wants("listen_s"):
        return []
    paths = json.dumps(PATHS)
    config = json.dumps(backend.nodes(1)[0])
    # as installed packages are: compiled once (the first process, not counted, writes the
    # bytecode), not from source in every process
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    spans, parts = {"mq": [], "floor": []}, []
    subprocess.run([sys.executable, "-c", STARTUP, paths, config, backend.worker_code],
                   capture_output=True, env=env, timeout=120)
    for _ in range(opts.startup_trials):
        for kind, code in (("floor", "mq = None"), ("mq", backend.worker_code)):
            if kind == "floor":
                code = "class _None:\n    listen = stop = lambda self: None\nmq = _None()"
            t = time.monotonic()
            out = subprocess.run([sys.executable, "-c", STARTUP, paths, config, code],
                                 capture_output=True, text=True, env=env, timeout=120)
            took = time.monotonic() - t
            if out.returncode != 0:
                raise RuntimeError(f"{backend.name} worker did not start: {out.stderr[-2000:]}")
            spans[kind].append(took)
            if kind == "mq":
                parts.append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = statistics.median
    return [("listen_s", med(spans["mq"]), "s", {
        "lost": 0,
        "floor_s": round(med(spans["floor"]), 3),
        "above_floor_s": round(med(spans["mq"]) - med(spans["floor"]), 3),
        "import_s": round(med(p["mq"] for p in parts), 3),
        "listen_call_s": round(med(p["listen"] for p in parts), 3),
        "trials": [round(x, 3) for x in spans["mq"]]})]


def run_backend(backend, opts):
    backend.start()
    try:
        note = backend.describe()
        if note:
            print(f"{backend.name:<8} {note}", flush=True)
        if hasattr(backend, "measure"):  # a backend that measures itself (cpp)
            return backend.measure(opts)
        rows = measure_rtt(backend, opts.round_trips) if backend.wants("rtt_64B") else []
        rows += measure_rates(backend, opts)
        rows += measure_slow(backend, opts)
        rows += measure_startup(backend, opts)
    finally:
        backend.stop()
    return rows


METRICS = ("rtt_64B_median", "rtt_64B_p99", "msgs_1to1", "msgs_4to1", "MBps_1MiB",
           "MBps_64MiB", "lost_slow_sub", "listen_s")
OURS = ("rlbus", "ditask", "cpp")  # the backends whose ratios and targets the summary shows


def _ratio(a, b):
    if a is None or not b:
        return None
    return a / b


def _fmt(v, width, digits=1):
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, float) and abs(v) < 10 and digits == 1:
        return f"{v:{width}.2f}"
    return f"{v:{width}.{digits}f}"


def _lost_total(row):
    lost = row.get("lost")
    if isinstance(lost, list):
        return sum(lost)
    return lost if lost is not None else row.get("median")


def summarize(rows):
    """The medians side by side, the ratios of ours to the redis shape (and to the proxy for
    MB/s), and the targets beside what was measured. Prints it; returns it for the JSON."""
    table = {}
    for r in rows:
        table.setdefault(r["metric"], {})[r["backend"]] = r
    names = [b for b in BACKENDS if any(b in by for by in table.values())]
    ours = [b for b in OURS if b in names]
    ratio_cols = [(b, "redis") for b in ours] + [(b, "proxy") for b in ours]
    head = f"{'metric':<15} {'unit':<6}" + "".join(f"{b:>10}" for b in names) \
        + "".join(f"{b + '/' + base:>13}" for b, base in ratio_cols)
    print()
    print("summary: medians; ratios to the redis shape, and to the proxy for MB/s (for us,")
    print("below 1 is faster; for msg/s and MB/s, above 1 is more)")
    print(head)
    out = {"medians": {}, "ratios": {}, "targets": []}
    for metric in METRICS:
        by = table.get(metric)
        if not by:
            continue
        unit = next(iter(by.values()))["unit"]
        line = f"{metric:<15} {unit:<6}"
        out["medians"][metric] = {b: by[b]["median"] for b in by}
        for b in names:
            line += _fmt(by[b]["median"], 10) if b in by else f"{'':>10}"
        for b, base in ratio_cols:
            want = (base == "redis" and not metric.startswith("lost")) \
                or (base == "proxy" and metric.startswith("MBps"))
            r = _ratio(by.get(b, {}).get("median"), by.get(base, {}).get("median")) \
                if want else None
            if r is not None:
                out["ratios"].setdefault(metric, {})[f"{b}/{base}"] = r
            line += _fmt(r, 13) if want and b in by and base in by else f"{'':>13}"
        print(line)

    def med(b, metric):
        return table.get(metric, {}).get(b, {}).get("median")

    print()
    print("targets (reported, never asserted):")
    checks = []
    for b in ours:
        rtt = med(b, "rtt_64B_median")
        if rtt is not None:
            checks.append((b, "round trip <= 200 us", f"{rtt:.1f} us", rtt <= 200))
        r1, red = med(b, "msgs_1to1"), med("redis", "msgs_1to1")
        if r1 is not None:
            if red:
                checks.append((b, "msgs_1to1 >= 10x redis",
                               f"{r1:.0f} msg/s = {r1 / red:.2f}x redis ({red:.0f})",
                               r1 >= 10 * red))
            else:
                checks.append((b, "msgs_1to1 >= 10x redis", f"{r1:.0f} msg/s (no redis row)",
                               None))
        slow = table.get("lost_slow_sub", {}).get(b)
        if slow is not None:
            red_lost = med("redis", "lost_slow_sub")
            said = f"{slow['median']:.0f} lost" + (
                f" (redis lost {red_lost:.0f})" if red_lost is not None else "")
            checks.append((b, "0 lost with a slow subscriber", said, slow["median"] == 0))
        mib, prox = med(b, "MBps_1MiB"), med("proxy", "MBps_1MiB")
        if mib is not None:
            if prox:
                checks.append((b, "1 MiB MB/s >= 0.7x proxy",
                               f"{mib:.1f} MB/s = {mib / prox:.2f}x proxy ({prox:.1f})",
                               mib >= 0.7 * prox))
            else:
                checks.append((b, "1 MiB MB/s >= 0.7x proxy", f"{mib:.1f} MB/s (no proxy row)",
                               None))
        up, red_up = med(b, "listen_s"), med("redis", "listen_s")
        if up is not None:
            checks.append((b, "worker start-up <= redis's",
                           f"{up:.2f} s" + (f" = {up / red_up:.2f}x redis ({red_up:.2f} s)"
                                            if red_up else " (no redis row)"),
                           up <= red_up if red_up else None))
        mine = [r for r in rows if r["backend"] == b]
        if mine:
            total = sum(_lost_total(r) or 0 for r in mine)
            checks.append((b, "0 lost in every row",
                           f"{total:.0f} lost over {len(mine)} rows", total == 0))
    for b, target, got, met in checks:
        verdict = "-" if met is None else ("met" if met else "MISSED")
        print(f"  {b:<7} {target:<31} {got:<44} {verdict}")
        out["targets"].append({"backend": b, "target": target, "measured": got, "met": met})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts, one trial (< 40 s)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--trials", type=int, default=None, help="trials per rate (3; quick 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--slow-size", type=int, default=16 << 10)
    ap.add_argument("--rlbus-broker-args", metavar="FLAGS", default=None,
                    help="the rlbus and ditask backends' broker flags, one string (default: "
                         "none, the broker's defaults)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny counts, one trial, no 64 MiB row: checks the harness (seconds)")
    ap.add_argument("--build", default=os.environ.get("RLBUS_BUILD_DIR",
                                                      os.path.join(ROOT, "build")),
                    help="the build tree: its broker, unless $RLBUS_BROKER names one, and its "
                         "rlbus-bench for the cpp rows (default: $RLBUS_BUILD_DIR, else build/)")
    ap.add_argument("--bench", default=os.environ.get("RLBUS_BENCH_BIN"),
                    help="the rlbus-bench binary (default: $RLBUS_BENCH_BIN, else the build's)")
    opts = ap.parse_args(argv)
    os.environ["RLBUS_BUILD_DIR"] = os.path.abspath(opts.build)  # what find_broker looks at
    CppBackend.bench = opts.bench or os.path.join(opts.build, "bench", "rlbus-bench")
    if opts.rlbus_broker_args is not None:
        RlbusBackend.broker_args = tuple(opts.rlbus_broker_args.split())
    short = opts.quick or opts.smoke
    opts.quick = short
    opts.trials = opts.trials or (1 if short else 3)
    opts.round_trips = 30 if opts.smoke else 300 if short else 2000
    opts.count = 400 if opts.smoke else 4000 if short else 20000
    opts.mib_count = 4 if opts.smoke else 20 if short else 100
    opts.slow_rate = 4000
    opts.startup_trials = 2 if opts.smoke else 5 if short else 11
    opts.slow_seconds = 0.1 if opts.smoke else 1.0 if short else 3.0
    _quiet()
    report = {"host": socket.gethostname(), "cpus": os.cpu_count(), "quick": opts.quick,
              "rows": [], "skipped": {}}
    print(f"{'backend':<8} {'metric':<16} {'median':>12}  unit    notes")
    for name in opts.backends.split(","):
        cls = BACKENDS[name]
        why = cls.unavailable()
        if why:
            print(f"{name:<8} skipped: {why}")
            report["skipped"][name] = why
            continue
        t0 = time.monotonic()
        for metric, value, unit, extra in run_backend(cls(), opts):
            shown = "-" if value is None else f"{value:12.1f}"
            notes = ", ".join(f"{k}={v}" for k, v in extra.items()
                              if k in ("lost", "sent", "achieved_send_rate", "reported_lost",
                                       "seconds", "floor_s", "above_floor_s", "import_s",
                                       "listen_call_s")
                              and (not isinstance(v, float) or k.endswith("_s")))
            print(f"{name:<8} {metric:<16} {shown:>12}  {unit:<6}  {notes}", flush=True)
            report["rows"].append({"backend": name, "metric": metric, "median": value,
                                   "unit": unit, **extra})
        print(f"{name:<8} ({time.monotonic() - t0:.1f} s)", flush=True)
    if report["rows"]:
        report["summary"] = summarize(report["rows"])
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
