"""The router between processes: a per-process singleton that turns events into MQ messages.

``Parallel.runner(n, mq_type=...)(main)`` starts ``n`` workers (spawned processes when
n > 1, the calling process when n == 1); each constructs its MQ from MQ_REGISTRY with the
keyword arguments the mq_type's args parser made, starts the ``mq_listener`` thread and runs
``main``. An event name is the topic; payloads are pickles of ``{"a": args, "k": kwargs}``.
"""

import logging
import multiprocessing
import os
import pickle
import queue
import random
import string
import tempfile
import threading
import time
import traceback

from ..utils import MQ_REGISTRY, SingletonMetaclass
from .event_loop import EventLoop

# How long the parent waits for all workers before killing them (a stand-in's safety net:
# DI-engine's pool waits forever). Seconds; overridden by DITASK_WORKER_TIMEOUT.
DEFAULT_WORKER_TIMEOUT = 300.0
# How long a worker may take to exit once it has reported its result.
EXIT_GRACE = 10.0


class Parallel(metaclass=SingletonMetaclass):

    def __init__(self):
        self.is_active = False
        self.node_id = None
        self.local_id = None
        self.labels = set()
        self.mq_type = None
        self.auto_recover = False
        self.max_retries = float("inf")
        self._retries = 0
        self._mq = None
        self._listener = None
        self._event_loop = EventLoop("parallel")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- starting workers ----------------------------------------------------------------

    @classmethod
    def runner(cls, n_parallel_workers, mq_type="nng", attach_to=None, protocol="ipc",
               address=None, ports=None, topology="mesh", labels=None, node_ids=None,
               auto_recover=False, max_retries=float("inf"), redis_host=None, redis_port=None,
               startup_interval=1):
        all_args = dict(locals())
        del all_args["cls"]
        # Local on purpose, as upstream: a registered mq_type without an entry here is refused.
        args_parsers = {
            "nng": _nng_args_parser,
            "redis": _redis_args_parser,
            "zmqpubsub": _zmqpubsub_args_parser,
        }

        def _runner(main, *args, **kwargs):
            parser = args_parsers[mq_type]  # KeyError for an unknown mq_type
            params = parser(**all_args)
            for i, p in enumerate(params):
                p["local_id"] = i
            if n_parallel_workers == 1:
                cls._subprocess_runner(main, params[0], *args, **kwargs)
            else:
                _run_pool(cls, main, params, args, kwargs)

        return _runner

    @classmethod
    def _subprocess_runner(cls, main, runner_params, *args, **kwargs):
        with Parallel() as router:
            router.is_active = True
            router._run(**runner_params)
            time.sleep(0.3)  # upstream's wait for "network pairing"
            router._supervised_runner(main, *args, **kwargs)

    def _run(self, node_id, local_id, n_parallel_workers, labels=None, auto_recover=False,
             max_retries=float("inf"), mq_type="nng", startup_interval=1, **kwargs):
        self.node_id = node_id
        self.local_id = local_id
        self.n_parallel_workers = n_parallel_workers
        self.labels = set(labels or [])
        self.auto_recover = auto_recover
        self.max_retries = max_retries
        self._retries = 0
        self._mq = MQ_REGISTRY.get(mq_type)(**kwargs)  # the MQ never learns node_id
        time.sleep(local_id * startup_interval)
        self._listener = threading.Thread(target=self.listen, name="mq_listener", daemon=True)
        self._listener.start()
        self.mq_type = mq_type
        from .middleware.barrier import BarrierRuntime
        self.barrier_runtime = BarrierRuntime(node_id)

    def _supervised_runner(self, main, *args, **kwargs):
        # With auto_recover, main runs again in the same process, same router and same MQ.
        while True:
            try:
                return main(*args, **kwargs)
            except Exception:
                if self.auto_recover and self._retries < self.max_retries:
                    logging.warning("main raised; recovering (retry %d)", self._retries + 1,
                                    exc_info=True)
                    self._retries += 1
                else:
                    raise

    # -- the listener ----------------------------------------------------------------------

    def listen(self):
        self._mq.listen()
        while True:
            mq = self._mq
            if mq is None:
                break
            msg = mq.recv()
            if not msg:
                break
            self._handle_message(*msg)

    def _handle_message(self, topic, payload):
        if not self._event_loop.listened(topic):
            return  # dropped before unpickling: nobody here ever listened to it
        msg = pickle.loads(payload)
        self._event_loop.emit(topic, *msg["a"], **msg["k"])

    # -- events ----------------------------------------------------------------------------

    def on(self, event, fn):
        mq = self._mq
        if self.is_active and mq is not None:
            mq.subscribe(event)
        self._event_loop.on(event, fn)

    def once(self, event, fn):
        mq = self._mq
        if self.is_active and mq is not None:
            mq.subscribe(event)
        self._event_loop.once(event, fn)

    def off(self, event):
        mq = self._mq
        if self.is_active and mq is not None:
            mq.unsubscribe(event)
        self._event_loop.off(event)

    def emit(self, event, *args, **kwargs):
        mq = self._mq
        if not self.is_active or mq is None:
            return
        try:
            payload = pickle.dumps({"a": args, "k": kwargs}, protocol=pickle.HIGHEST_PROTOCOL)
        except AttributeError:
            logging.error("arguments of event %s cannot be pickled", event)
            raise
        mq.publish(event, payload)

    def get_attch_to_len(self):
        """How many peers this node dialled (the MQ's ``attach_to``), 0 if it does not say."""
        mq = self._mq
        return len(mq.attach_to) if mq is not None and hasattr(mq, "attach_to") else 0

    def stop(self):
        self.is_active = False
        time.sleep(0.03)
        mq, self._mq = self._mq, None
        if mq is not None:
            mq.stop()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.join(timeout=1)  # a daemon: a stuck recv cannot hold the process
        self._event_loop.stop()


# -- args parsers: one kwargs dict per worker ---------------------------------------------------

def _node_ids(node_ids, n):
    """An int k gives k..k+n-1; a one-element list counts as an int; None starts at 0."""
    if node_ids is None:
        node_ids = 0
    if isinstance(node_ids, (list, tuple)) and len(node_ids) == 1:
        node_ids = node_ids[0]
    if isinstance(node_ids, int):
        return list(range(node_ids, node_ids + n))
    if len(node_ids) != n:
        raise ValueError(f"{len(node_ids)} node ids for {n} workers")
    return list(node_ids)


def _node_addrs(n, protocol, address, ports):
    if protocol == "ipc":
        tag = "".join(random.choices(string.ascii_lowercase + string.digits, k=4))
        return [f"ipc://{tempfile.gettempdir()}/ditask_{tag}_{i}.ipc" for i in range(n)]
    ports = list(ports) if isinstance(ports, (list, tuple)) else [ports or 50515]
    while len(ports) < n:
        ports.append(ports[-1] + 1)
    return [f"tcp://{address or '127.0.0.1'}:{p}" for p in ports[:n]]


def _attach_plan(nodes, topology, attach_to):
    """Whom each node dials: mesh = every earlier node, star = node 0 (node 0 none),
    alone = nobody; plus the caller's ``attach_to`` for everyone."""
    extra = list(attach_to or [])
    plan = []
    for i in range(len(nodes)):
        if topology == "mesh":
            plan.append(nodes[:i] + extra)
        elif topology == "star":
            plan.append(nodes[:min(i, 1)] + extra)
        elif topology == "alone":
            plan.append(list(extra))
        else:
            raise ValueError(f"unknown topology {topology}")
    return plan


def _common(n_parallel_workers, node_ids, labels, auto_recover, max_retries, mq_type,
            startup_interval):
    return [dict(node_id=nid, n_parallel_workers=n_parallel_workers, labels=labels,
                 auto_recover=auto_recover, max_retries=max_retries, mq_type=mq_type,
                 startup_interval=startup_interval)
            for nid in _node_ids(node_ids, n_parallel_workers)]


def _nng_args_parser(n_parallel_workers, attach_to, protocol, address, ports, topology,
                     redis_host, redis_port, node_ids, labels, auto_recover, max_retries,
                     mq_type, startup_interval):
    nodes = _node_addrs(n_parallel_workers, protocol, address, ports)
    plan = _attach_plan(nodes, topology, attach_to)
    out = _common(n_parallel_workers, node_ids, labels, auto_recover, max_retries, mq_type,
                  startup_interval)
    for i, p in enumerate(out):
        p.update(listen_to=nodes[i], attach_to=plan[i], redis_host=redis_host,
                 redis_port=redis_port)
    return out


def _redis_args_parser(n_parallel_workers, attach_to, protocol, address, ports, topology,
                       redis_host, redis_port, node_ids, labels, auto_recover, max_retries,
                       mq_type, startup_interval):
    out = _common(n_parallel_workers, node_ids, labels, auto_recover, max_retries, mq_type,
                  startup_interval)
    for p in out:
        p.update(attach_to=attach_to, protocol=protocol, address=address, ports=ports,
                 topology=topology, redis_host=redis_host, redis_port=redis_port)
    return out


def _zmqpubsub_args_parser(**all_args):
    """The test suite's pyzmq PUB/SUB type: the nng plan (so ``attach_to`` has nng's
    lengths, which Barrier counts on) plus the forwarder's two endpoints, read here in the
    parent from DITASK_ZMQ_FORWARDER ("publish-side subscribe-side")."""
    out = _nng_args_parser(**all_args)
    forwarder = os.environ.get("DITASK_ZMQ_FORWARDER", "")
    for p in out:
        p["forwarder"] = forwarder
    return out


# -- the worker pool (mpire.WorkerPool upstream: spawn, non-daemon, re-raises) --------------------

def _worker_entry(cls, main, params, args, kwargs, results, index):
    try:
        cls._subprocess_runner(main, params, *args, **kwargs)
        results.put((index, None))
    except BaseException as e:  # everything goes back to the parent
        tb = traceback.format_exc()
        try:
            exc = pickle.dumps(e)
        except Exception:
            exc = None
        results.put((index, (exc, f"{type(e).__name__}: {e}", tb)))


def _raise_worker_error(index, error):
    exc_bytes, text, tb = error
    exc = None
    if exc_bytes is not None:
        try:
            exc = pickle.loads(exc_bytes)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RuntimeError(text)
    exc.add_note(f"raised in worker {index}:\n{tb}")
    raise exc


def _run_pool(cls, main, params, args, kwargs):
    timeout = float(os.environ.get("DITASK_WORKER_TIMEOUT", DEFAULT_WORKER_TIMEOUT))
    mp = multiprocessing.get_context("spawn")
    results = mp.Queue()
    procs = [mp.Process(target=_worker_entry, name=f"ditask_worker_{i}", daemon=False,
                        args=(cls, main, p, args, kwargs, results, i))
             for i, p in enumerate(params)]
    for p in procs:
        p.start()
    done = {}
    deadline = time.monotonic() + timeout
    try:
        while len(done) < len(procs):
            try:
                index, error = results.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers {sorted(set(range(len(procs))) - set(done))} "
                                       f"did not finish within {timeout} s")
                for i, p in enumerate(procs):
                    if i not in done and p.exitcode is not None:
                        try:  # its result may still be in the pipe
                            index, error = results.get(timeout=1)
                        except queue.Empty:
                            index, error = i, (None, f"worker {i} died with exit code "
                                               f"{p.exitcode}", "")
                        break
                else:
                    continue
            done[index] = error
            if error is not None:
                _raise_worker_error(index, error)  # the others are ended below
        exit_by = time.monotonic() + EXIT_GRACE
        for i, p in enumerate(procs):
            p.join(max(0.0, exit_by - time.monotonic()))
            if p.exitcode is None:
                raise RuntimeError(f"worker {i} returned but its process did not exit within "
                                   f"{EXIT_GRACE} s (a non-daemon thread left running?)")
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
            p.join()
        results.close()
