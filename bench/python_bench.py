#!/usr/bin/python3
"""rlbus-bench's Python rows: the Python SDK (python/rlbus) measured beside a bare pyzmq loop
on the same path, the C++ SDK and DI-engine's HTTP shape, in one run on one machine, as
medians over interleaved trials and ratios. Nothing here asserts a timing.

Two scenarios, the same two as rlbus-bench's first two:

  latency     one learner data request at a time: a Python learner's get_data() -> broker ->
              the Python coordinator's deal_with_learner_get_data() returns a payload ->
              broker -> LEARN. Timed in the learner process, per request.
              bare: a pyzmq DEALER sends a msgpack request through a zmq_proxy (the
              bench's `rlbus-bench proxy`) to a pyzmq echo that decodes it and answers a
              msgpack reply with the payload: the same two hops each way and the same
              encode/decode work, no SDK.
  throughput  N Python collector processes each stream M data items (64 B payload) to
              one Python coordinator; items/s = items received / (first send -> last
              receipt), and every item is counted (lost = sent - received).
              bare: N pyzmq processes send M msgpack messages of the same shape through
              the proxy to one pyzmq sink that decodes them.

Beside them: the C++ SDK rows (rlbus-bench latency/throughput --no-http, its `sdk` client)
and the HTTP baseline (bench/http_baseline.py: one HTTP exchange per task step), both
started by this script. Ratios: py/bare (target >= 0.30 for throughput), py/http (target
>= 50 for items/s), py/cpp.

Usage: bench/python_bench.py [--quick] [--trials N] [--collectors 1,4] [--json PATH]
       (run from the repository root after `ninja -C build`; `--help` for the rest)
"""

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import msgpack  # noqa: E402
import zmq  # noqa: E402

SELF = os.path.abspath(__file__)
PY = "/usr/bin/python3"


def log(msg):
    print("python-bench: " + msg, file=sys.stderr, flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def percentile(samples, q):
    s = sorted(samples)
    rank = max(1, min(len(s), -(-q * len(s) // 100)))  # nearest rank, like rlbus-bench
    return s[rank - 1]


class Child:
    """A process of the bench's own (broker, proxy, http ends, or this script in a child
    mode) that dies with the bench, read line by line from its stdout."""

    def __init__(self, argv, stdin=False):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  text=True, bufsize=1, start_new_session=True)

    def line_with(self, prefix, timeout=30.0):
        deadline = time.monotonic() + timeout
        out = [None]

        def read():
            for line in self.p.stdout:
                if line.startswith(prefix):
                    out[0] = line.strip()
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if out[0] is None:
            raise RuntimeError("%s: no line starting %r within %.0f s"
                               % (os.path.basename(self.p.args[0]), prefix, timeout))
        return out[0]

    def stop(self):
        if self.p.stdin is not None:  # a worker child: its stdin's end closes it cleanly
            self.p.stdin.close()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def start_broker(binary):
    """The broker on ports the kernel picks, read back from its "listening" line."""
    b = Child([binary, "--router", "tcp://127.0.0.1:0", "--events", "tcp://127.0.0.1:0",
               "--log-level", "warn"])
    words = b.line_with("rlbus-broker listening").split()
    return b, words[2][len("router="):]


def start_proxy(bench_bin):
    p = Child([bench_bin, "proxy"])
    words = p.line_with("rlbus-bench proxy:").split()
    return p, words[3], words[5]  # "rlbus-bench proxy: front EP back EP"


# ---------------------------------------------------------------------------------------
# Child modes: each runs in its own process (its own GIL), prints one result line.

def child_py_learner(endpoint, wid):
    """A learner worker that answers every learner task: `rounds` timed get_data calls."""
    import rlbus

    def run(task):
        rounds = task.info["rounds"]
        samples = []
        for i in range(rounds):
            t0 = time.perf_counter()
            batch = task.get_data("buf", 1, i, timeout=10.0)
            if batch is None:
                raise RuntimeError("no batch for request %d" % i)
            samples.append((time.perf_counter() - t0) * 1e6)
        task.emit_learn_info("buf", {"learner_done": True,
                                     "median_us": statistics.median(samples),
                                     "p99_us": percentile(samples, 99)})
        task.wait_stop(30.0)

    with rlbus.Worker(endpoint, role="learner", id=wid, run=run):
        print("ready", flush=True)
        sys.stdin.read()  # until the bench closes our stdin



def child_py_collector(endpoint, wid):
    """A collector worker that streams task_info["items"] data items per task."""
    import rlbus

    payload = b"x" * 64

    def run(task):
        n = task.info["items"]
        for i in range(n):
            meta = {"env_id": 0, "policy_iter": i, "unroll_len": 1, "priority": 1.0}
            if i == 0:
                meta["t0"] = time.time()
            if not task.emit_data("d%d" % i, "buf", meta, payload):
                return
        task.emit_info({"collector_done": True, "cur_sample": n})
        task.wait_stop(60.0)

    with rlbus.Worker(endpoint, role="collector", id=wid, run=run):
        print("ready", flush=True)
        sys.stdin.read()



def child_bare_requester(front, rounds, payload):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(front)
    samples = []
    for i in range(rounds + 20):
        t0 = time.perf_counter()
        s.send(msgpack.packb({"task_id": "t1", "attempt": 1, "request_id": i,
                              "buffer_id": "buf", "batch_size": 1, "cur_learner_iter": i}))
        reply = msgpack.unpackb(s.recv(), raw=False)
        if reply["request_id"] != i or len(reply["data"]) != payload:
            raise RuntimeError("bare echo answered the wrong request")
        if i >= 20:  # the first ones warm the connection up
            samples.append((time.perf_counter() - t0) * 1e6)
    print("result " + json.dumps({"median_us": statistics.median(samples),
                                  "p99_us": percentile(samples, 99)}), flush=True)
    s.close(0)
    ctx.term()


def child_bare_sender(front, items):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.SNDHWM, 100000)
    s.connect(front)
    payload = b"x" * 64
    time.sleep(0.2)  # let the connection come up, like the SDK's HELLO before a task
    for i in range(items):
        meta = {"env_id": 0, "policy_iter": i, "unroll_len": 1, "priority": 1.0}
        if i == 0:
            meta["t0"] = time.time()
        s.send(msgpack.packb({"task_id": "t", "attempt": 1, "data_id": "d%d" % i,
                              "buffer_id": "buf", "meta": meta, "payload": payload,
                              "index": i + 1}))
    s.close(linger=30000)
    ctx.term()


# ---------------------------------------------------------------------------------------
# The scenarios, driven from the main process.

class PyCoordinator:
    """The Python SDK coordinator for both scenarios, reused across trials."""

    def __init__(self, endpoint, payload):
        import rlbus
        self.lock = threading.Condition()
        self.payload = b"y" * payload
        self.received = 0
        self.first_send = None
        self.last_receipt = None
        self.results = {}
        self.finished = set()
        self.failed = {}
        self.c = rlbus.Coordinator(endpoint, id="bench-coordinator", callbacks=self)
        if not self.c.wait_for("ready", 10.0):
            raise RuntimeError("python coordinator did not connect")

    # callbacks (one thread)
    def deal_with_learner_get_data(self, task_id, buffer_id, batch_size, cur_learner_iter):
        return self.payload

    def deal_with_learner_judge_finish(self, task_id, info):
        with self.lock:
            self.results[task_id] = info
        return True

    def deal_with_collector_send_data(self, task_id, buffer_id, data_id, data):
        now = time.time()
        t0 = data["meta"].get("t0")
        with self.lock:
            self.received += 1
            self.last_receipt = now
            if t0 is not None and (self.first_send is None or t0 < self.first_send):
                self.first_send = t0

    def deal_with_collector_finish_task(self, task_id, result):
        with self.lock:
            self.finished.add(task_id)
            self.lock.notify_all()

    def deal_with_learner_finish_task(self, task_id, result):
        with self.lock:
            self.finished.add(task_id)
            self.lock.notify_all()

    def on_task_failed(self, task_id, reason, result=None):
        with self.lock:
            self.failed[task_id] = reason
            self.finished.add(task_id)
            self.lock.notify_all()

    def wait_workers(self, kind, n, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.c.collectors if kind == "collector" else self.c.learners) >= n:
                return
            time.sleep(0.02)
        raise RuntimeError("only %d of %d %ss joined" % (
            self.c.collectors if kind == "collector" else self.c.learners, n, kind))

    def run_tasks(self, kind, ids, info, timeout=120.0):
        with self.lock:
            self.received = 0
            self.first_send = self.last_receipt = None
        for tid in ids:
            r = self.c.submit(tid, kind, info, max_attempts=1, step_timeout_ms=60000)
            if r is None or not r.accepted:
                raise RuntimeError("submit %s refused: %s" % (tid, r))
        deadline = time.monotonic() + timeout
        with self.lock:
            while not all(t in self.finished for t in ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("tasks did not finish within %.0f s" % timeout)
                self.lock.wait(left)
            bad = [self.failed[t] for t in ids if t in self.failed]
        if bad:
            raise RuntimeError("task failed: " + bad[0])

    def close(self):
        self.c.close()


def spawn_children(mode, args, n, tag):
    """n children of one mode, with worker ids unique to the row (`tag`): a worker of an
    earlier row whose session the broker still holds never shares an id with a new one."""
    kids = [Child([PY, SELF, "--child", mode] + [str(a) for a in args] + ["%s-w%d" % (tag, i)],
                  stdin=True)
            for i in range(n)]
    for k in kids:
        k.line_with("ready")
    return kids


def bench_latency(cfg, broker_ep, front, back, http, report):
    """Rows: latency of one task step, Python SDK / bare pyzmq / http (+ C++ SDK)."""
    payload = 64
    coord = PyCoordinator(broker_ep, payload)
    learner = spawn_children("py-learner", [broker_ep], 1, "lat")[0]
    coord.wait_workers("learner", 1)
    ctx = zmq.Context.instance()
    echo = ctx.socket(zmq.DEALER)
    echo.connect(back)
    stop = threading.Event()

    def echo_loop():
        while not stop.is_set():
            if not echo.poll(100):
                continue
            ident, body = echo.recv_multipart()
            req = msgpack.unpackb(body, raw=False)
            echo.send_multipart([ident, msgpack.packb(
                {"task_id": req["task_id"], "attempt": 1, "request_id": req["request_id"],
                 "data": b"y" * payload})])

    et = threading.Thread(target=echo_loop, daemon=True)
    et.start()
    rows = {"py": [], "bare": [], "http": []}
    p99 = {"py": [], "bare": []}
    try:
        for trial in range(cfg.trials + 1):  # trial 0 warms up
            tid = "lat-%d" % trial
            coord.run_tasks("learner", [tid], {"rounds": cfg.rounds})
            r = coord.results[tid]
            k = Child([PY, SELF, "--child", "bare-requester", front, str(cfg.rounds), str(payload)])
            b = json.loads(k.line_with("result ", 60)[len("result "):])
            k.p.wait()
            h = http.latency(payload, cfg.http_rounds) if http else None
            if trial == 0:
                continue
            rows["py"].append(r["median_us"])
            p99["py"].append(r["p99_us"])
            rows["bare"].append(b["median_us"])
            p99["bare"].append(b["p99_us"])
            if h:
                rows["http"].append(h["median_us"])
            log("latency trial %d: py %.0f us, bare %.0f us%s" % (
                trial, r["median_us"], b["median_us"],
                ", http %.0f us" % h["median_us"] if h else ""))
    finally:
        stop.set()
        et.join()
        echo.close(0)
        learner.stop()
        coord.close()
    py, bare, ht = median(rows["py"]), median(rows["bare"]), median(rows["http"])
    report.append({
        "scenario": "latency", "metric": "median us", "higher_is_better": False,
        "params": {"payload_bytes": payload, "rounds": cfg.rounds},
        "python_sdk": {"median": py, "trials": rows["py"], "p99_median": median(p99["py"])},
        "bare_pyzmq": {"median": bare, "trials": rows["bare"], "p99_median": median(p99["bare"])},
        "http": {"median": ht, "trials": rows["http"]} if ht else None,
        "ratio_bare": py / bare, "ratio_http": py / ht if ht else None})


def bench_throughput(cfg, broker_ep, front, back, http, report, n):
    coord = PyCoordinator(broker_ep, 0)
    kids = spawn_children("py-collector", [broker_ep], n, "thr%d" % n)
    coord.wait_workers("collector", n)
    ctx = zmq.Context.instance()
    sink = ctx.socket(zmq.DEALER)
    sink.setsockopt(zmq.RCVHWM, 100000)
    sink.connect(back)
    rows = {"py": [], "bare": [], "http": []}
    lost = {"py": 0, "bare": 0}
    per = cfg.messages // n
    try:
        for trial in range(cfg.trials + 1):
            ids = ["thr-%d-%d-%d" % (n, trial, i) for i in range(n)]
            coord.run_tasks("collector", ids, {"items": per})
            py_rate = coord.received / max(1e-9, coord.last_receipt - coord.first_send)
            py_lost = n * per - coord.received
            bare_rate, bare_lost = bare_throughput(sink, front, n, per)
            h = http.throughput(64, n, cfg.http_steps) if http else None
            if trial == 0:
                continue
            rows["py"].append(py_rate)
            rows["bare"].append(bare_rate)
            lost["py"] += py_lost
            lost["bare"] += bare_lost
            if h:
                rows["http"].append(h["steps_per_s"])
            log("throughput %d collectors, trial %d: py %.0f/s, bare %.0f/s%s" % (
                n, trial, py_rate, bare_rate, ", http %.0f/s" % h["steps_per_s"] if h else ""))
    finally:
        sink.close(0)
        for k in kids:
            k.p.stdin.close()  # all of them at once, then wait for each
        for k in kids:
            k.stop()
        coord.close()
    py, bare, ht = median(rows["py"]), median(rows["bare"]), median(rows["http"])
    report.append({
        "scenario": "throughput", "metric": "items/s", "higher_is_better": True,
        "params": {"collectors": n, "items_per_trial": per * n, "payload_bytes": 64},
        "python_sdk": {"median": py, "trials": rows["py"], "lost": lost["py"]},
        "bare_pyzmq": {"median": bare, "trials": rows["bare"], "lost": lost["bare"]},
        "http": {"median": ht, "trials": rows["http"]} if ht else None,
        "ratio_bare": py / bare, "ratio_http": py / ht if ht else None})


def bare_throughput(sink, front, n, per):
    kids = [Child([PY, SELF, "--child", "bare-sender", front, str(per)]) for _ in range(n)]
    got = 0
    first = None
    last = None
    idle_limit = 5.0
    while got < n * per:
        if not sink.poll(int(idle_limit * 1000)):
            break  # nothing for that long: the rest is lost
        _, body = sink.recv_multipart()
        m = msgpack.unpackb(body, raw=False)
        t0 = m["meta"].get("t0")
        if t0 is not None and (first is None or t0 < first):
            first = t0
        got += 1
        last = time.time()
    for k in kids:
        k.p.wait()
    return got / max(1e-9, last - first) if got else 0.0, n * per - got


class Http:
    """bench/http_baseline.py's two ends, started once."""

    def __init__(self):
        script = os.path.join(ROOT, "bench", "http_baseline.py")
        if subprocess.run([PY, script, "check"], stdout=subprocess.DEVNULL).returncode != 0:
            raise RuntimeError("http baseline unavailable (python3-flask, python3-requests)")
        self.worker = Child([PY, script, "worker"])
        self.url = self.worker.line_with("rlbus-bench http: worker").split()[-1]
        self.coord = Child([PY, script, "coordinator"], stdin=True)
        self.coord.line_with("rlbus-bench http: coordinator")
        self.n = 0

    def ask(self, words):
        self.n += 1
        self.coord.p.stdin.write("%d %s\n" % (self.n, words))
        self.coord.p.stdin.flush()
        out = json.loads(self.coord.line_with("rlbus-bench http result %d " % self.n, 300)
                         .split(" ", 4)[4])
        if "error" in out:
            raise RuntimeError("http baseline: " + out["error"])
        return out

    def latency(self, payload, steps):
        return self.ask("latency %s %d %d" % (self.url, payload, steps))

    def throughput(self, payload, threads, steps):
        return self.ask("throughput %s %d %d %d" % (self.url, payload, threads, steps))

    def stop(self):
        self.coord.p.stdin.close()
        self.coord.stop()
        self.worker.stop()


def cpp_sdk_rows(bench_bin, cfg):
    """The C++ SDK's rows from rlbus-bench itself (same machine, same run of this script)."""
    out = tempfile.mktemp(suffix=".json", prefix="rlbus-pybench-cpp-")
    argv = [bench_bin, "all", "--no-http", "--payloads", "64", "--collectors",
            ",".join(str(c) for c in cfg.collectors), "--trials", str(cfg.trials),
            "--json", out]
    if cfg.quick:
        argv.append("--quick")
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError("rlbus-bench exited with %d" % r.returncode)
    with open(out) as f:
        rows = json.load(f)["rows"]
    os.unlink(out)
    return [r for r in rows if r.get("params", {}).get("client") == "sdk"]


def attach_cpp(report, cpp_rows):
    for row in report:
        for c in cpp_rows:
            # the C++ rows come in pairs (median us / p99 us, events/s / cpu us/ev)
            if c["scenario"] != row["scenario"] or \
                    c.get("metric") not in ("median us", "events/s"):
                continue
            if row["scenario"] == "throughput" and \
                    c["params"].get("collectors") != row["params"]["collectors"]:
                continue
            if row["scenario"] == "latency" and \
                    c["params"].get("payload_bytes") != row["params"]["payload_bytes"]:
                continue
            row["cpp_sdk"] = {"median": c["rlbus"]["median"]}
            row["ratio_cpp"] = row["python_sdk"]["median"] / c["rlbus"]["median"]


def fmt(v, unit):
    if v is None:
        return "-"
    return "%.0f" % v if unit != "x" else ("%.4f" % v if v < 0.1 else "%.2f" % v)


def print_table(report):
    print("%-11s %-12s %12s %12s %12s %12s %8s %8s %8s" % (
        "scenario", "params", "python sdk", "bare pyzmq", "c++ sdk", "http",
        "py/bare", "py/http", "py/c++"))
    for r in report:
        p = ("%d B" % r["params"]["payload_bytes"] if r["scenario"] == "latency"
             else "%d coll." % r["params"]["collectors"])
        unit = "us" if r["scenario"] == "latency" else "/s"
        print("%-11s %-12s %12s %12s %12s %12s %8s %8s %8s" % (
            r["scenario"], p, fmt(r["python_sdk"]["median"], unit),
            fmt(r["bare_pyzmq"]["median"], unit),
            fmt(r.get("cpp_sdk", {}).get("median"), unit),
            fmt((r.get("http") or {}).get("median"), unit),
            fmt(r["ratio_bare"], "x"), fmt(r.get("ratio_http"), "x"),
            fmt(r.get("ratio_cpp"), "x")))
    for r in report:
        if r["scenario"] == "throughput":
            print("throughput %d collectors: lost python %d, bare %d" % (
                r["params"]["collectors"], r["python_sdk"]["lost"], r["bare_pyzmq"]["lost"]))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        mode, rest = sys.argv[2], sys.argv[3:]
        {"py-learner": lambda: child_py_learner(rest[0], rest[1]),
         "py-collector": lambda: child_py_collector(rest[0], rest[1]),
         "bare-requester": lambda: child_bare_requester(rest[0], int(rest[1]), int(rest[2])),
         "bare-sender": lambda: child_bare_sender(rest[0], int(rest[1]))}[mode]()
        return 0

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="meson build directory holding src/rlbus-broker and bench/rlbus-bench")
    ap.add_argument("--trials", type=int, default=5, help="trials per variant after a warm-up")
    ap.add_argument("--rounds", type=int, default=2000, help="latency: requests per trial")
    ap.add_argument("--messages", type=int, default=100000,
                    help="throughput: data items per trial, split over the collectors")
    ap.add_argument("--collectors", default="1,4", help="throughput: collector counts")
    ap.add_argument("--http-rounds", type=int, default=300)
    ap.add_argument("--http-steps", type=int, default=1000)
    ap.add_argument("--no-http", action="store_true", help="skip the HTTP baseline")
    ap.add_argument("--no-cpp", action="store_true", help="skip the C++ SDK rows")
    ap.add_argument("--quick", action="store_true",
                    help="2 trials, few messages: checks the harness, not the numbers")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every row was measured and nothing was lost")
    ap.add_argument("--json", default=os.path.join("bench", "results", "python.json"))
    cfg = ap.parse_args()
    cfg.collectors = [int(c) for c in cfg.collectors.split(",")]
    if cfg.quick:
        cfg.trials, cfg.rounds, cfg.messages = 2, 50, 2000
        cfg.http_rounds, cfg.http_steps = 10, 32
    broker_bin = os.path.join(cfg.build, "src", "rlbus-broker")
    bench_bin = os.path.join(cfg.build, "bench", "rlbus-bench")
    for b in (broker_bin, bench_bin):
        if not os.access(b, os.X_OK):
            print("python-bench: %s not found: build first (ninja -C build)" % b, file=sys.stderr)
            return 2

    load_before = os.getloadavg()
    broker, ep = start_broker(broker_bin)
    proxy, front, back = start_proxy(bench_bin)
    http = None if cfg.no_http else Http()
    report = []
    try:
        bench_latency(cfg, ep, front, back, http, report)
        for n in cfg.collectors:
            bench_throughput(cfg, ep, front, back, http, report, n)
    finally:
        if http:
            http.stop()
        proxy.stop()
        broker.stop()
    if not cfg.no_cpp:
        log("C++ SDK rows: rlbus-bench all --no-http")
        attach_cpp(report, cpp_sdk_rows(bench_bin, cfg))
    print_table(report)
    facts = {"schema": "rlbus-python-bench/1",
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "command": " ".join(sys.argv),
             "machine": {"nproc": os.cpu_count(), "kernel": platform.platform(),
                         "python": platform.python_version(), "pyzmq": zmq.__version__,
                         "load_before": "%.2f %.2f %.2f" % load_before,
                         "load_after": "%.2f %.2f %.2f" % os.getloadavg()},
             "settings": {k: v for k, v in vars(cfg).items() if k not in ("json",)},
             "rows": report}
    os.makedirs(os.path.dirname(os.path.abspath(cfg.json)), exist_ok=True)
    with open(cfg.json, "w") as f:
        json.dump(facts, f, indent=1)
    log("wrote " + cfg.json)
    if cfg.check:
        ok = all(r["python_sdk"]["median"] and r["bare_pyzmq"]["median"] for r in report)
        ok = ok and all(r["python_sdk"].get("lost", 0) == 0 for r in report)
        ok = ok and (cfg.no_http or all(r.get("http") for r in report))
        ok = ok and len(report) == 1 + len(cfg.collectors)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
