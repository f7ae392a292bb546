#!/usr/bin/python3
"""The HTTP baseline of rlbus-bench: DI-engine's coordinator shape, one HTTP exchange per
task step, with Flask + werkzeug's threaded server and `requests` (Debian's python3-flask
and python3-requests). See bench/README.md, "The HTTP baseline".

The shape it models (not the code): the coordinator is an HTTP *client* of each worker
(a "slave" serving Flask) and an HTTP *server* for the workers' answers. One task step:

  1. the coordinator POSTs the task to the worker's /task/new and the worker answers
     "accepted" at once;
  2. a thread of the worker runs the task and PUTs its result back to the coordinator's
     /task/<id>/complete;
  3. the coordinator thread that sent the task was waiting for that result; the step ends
     when it wakes up.

The payload (a string of the asked size) rides in the task for the latency rows (the
learner's learn task carrying its data) and in the result for the throughput rows (a
collector's data task returning its data). Werkzeug's server speaks HTTP/1.0, so every
request is a new TCP connection, as it was for DI-engine's Flask servers.

Modes (the bench starts them itself; each prints one line naming its URL):

  http_baseline.py check        exit 0 when flask and requests import, 3 otherwise
  http_baseline.py worker       the Flask worker ("slave") on 127.0.0.1:<free port>
  http_baseline.py coordinator  the requests client + its result server; reads commands
                                on stdin, one per line, answers one line each on stdout:
      <id> latency <worker-url> <payload-bytes> <steps>
      <id> throughput <worker-url> <payload-bytes> <threads> <steps>
    -> "rlbus-bench http result <id> {json}"
"""

import json
import logging
import sys
import threading
import time

MISSING = None
try:
    import flask
    import requests
    from werkzeug.serving import make_server
except ImportError as e:  # reported by `check`, and by any mode that needs them
    MISSING = str(e)

RESULT_TIMEOUT_S = 10.0  # a step whose result has not come back by then fails


def say(line):
    print(line, flush=True)


def session():
    s = requests.Session()
    s.trust_env = False  # never route 127.0.0.1 through an http_proxy from the environment
    return s


def serve(app, role):
    """Serves `app` on a free port with werkzeug's threaded server in a daemon thread."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, name=role, daemon=True).start()
    return "http://127.0.0.1:%d" % server.server_port


def payload_of(size):
    return "x" * size


# --- the worker ("slave") ------------------------------------------------------------------


def run_worker():
    app = flask.Flask("rlbus-bench-worker")
    local = threading.local()

    def put_back(task):
        # The task itself is trivial; what is measured is the exchange around it.
        if not hasattr(local, "session"):
            local.session = session()
        result = {"task_id": task["task_id"], "info": {"done": True}}
        if task.get("result_bytes", 0) > 0:
            result["data"] = payload_of(task["result_bytes"])
        url = "%s/task/%s/complete" % (task["reply_to"], task["task_id"])
        try:
            local.session.put(url, json=result, timeout=RESULT_TIMEOUT_S).raise_for_status()
        except requests.RequestException as e:
            print("rlbus-bench http worker: result of %s not delivered: %s" % (task["task_id"], e),
                  file=sys.stderr, flush=True)

    @app.route("/task/new", methods=["POST"])
    def new_task():
        task = flask.request.get_json(force=True)
        threading.Thread(target=put_back, args=(task,), daemon=True).start()
        return flask.jsonify({"task_id": task["task_id"], "accepted": True})

    say("rlbus-bench http: worker " + serve(app, "worker"))
    threading.Event().wait()  # until SIGTERM


# --- the coordinator -----------------------------------------------------------------------


class Results:
    """Task id -> the result its sender waits for (the PUT may beat the POST's answer)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.waiting = {}

    def expect(self, task_id):
        slot = [threading.Event(), None]
        with self.lock:
            self.waiting[task_id] = slot
        return slot

    def deliver(self, task_id, result):
        with self.lock:
            slot = self.waiting.pop(task_id, None)
        if slot is None:
            return False
        slot[1] = result
        slot[0].set()
        return True


class Coordinator:
    def __init__(self):
        self.results = Results()
        self.next_id = 0
        self.id_lock = threading.Lock()
        app = flask.Flask("rlbus-bench-coordinator")

        @app.route("/task/<task_id>/complete", methods=["PUT"])
        def complete(task_id):
            if not self.results.deliver(task_id, flask.request.get_json(force=True)):
                return flask.jsonify({"known": False}), 404
            return flask.jsonify({"known": True})

        self.url = serve(app, "coordinator")

    def task_id(self):
        with self.id_lock:
            self.next_id += 1
            return "t%d" % self.next_id

    def step(self, s, worker, task_bytes, result_bytes):
        """One task step: POST the task, wait for its result to be PUT back."""
        tid = self.task_id()
        slot = self.results.expect(tid)
        task = {"task_id": tid, "name": "bench_task", "reply_to": self.url,
                "result_bytes": result_bytes}
        if task_bytes > 0:
            task["data"] = payload_of(task_bytes)
        r = s.post(worker + "/task/new", json=task, timeout=RESULT_TIMEOUT_S)
        r.raise_for_status()
        if not r.json().get("accepted"):
            raise RuntimeError("the worker refused task " + tid)
        if not slot[0].wait(RESULT_TIMEOUT_S):
            raise RuntimeError("no result for task %s within %.0f s" % (tid, RESULT_TIMEOUT_S))
        if result_bytes > 0 and len(slot[1].get("data", "")) != result_bytes:
            raise RuntimeError("task %s came back with the wrong payload" % tid)

    def latency(self, worker, payload, steps):
        s = session()
        samples = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step(s, worker, payload, 0)
            samples.append((time.perf_counter() - t0) * 1e6)
        samples.sort()
        n = len(samples)
        med = samples[n // 2] if n % 2 else (samples[n // 2 - 1] + samples[n // 2]) / 2
        p99 = samples[max(1, min(n, -(-99 * n // 100))) - 1]  # nearest rank, like the bench
        return {"median_us": med, "p99_us": p99, "steps": n}

    def throughput(self, worker, payload, threads, steps):
        left = [steps]
        lock = threading.Lock()
        errors = []
        done = [0]

        def run():
            s = session()
            while True:
                with lock:
                    if left[0] == 0 or errors:
                        return
                    left[0] -= 1
                try:
                    self.step(s, worker, 0, payload)
                except Exception as e:  # noqa: BLE001 - reported, not hidden
                    with lock:
                        errors.append(str(e))
                    return
                with lock:
                    done[0] += 1

        pool = [threading.Thread(target=run) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        secs = time.perf_counter() - t0
        if errors:
            raise RuntimeError(errors[0])
        return {"steps_per_s": done[0] / secs if secs > 0 else 0.0, "steps": done[0],
                "threads": threads}


def run_coordinator():
    c = Coordinator()
    say("rlbus-bench http: coordinator " + c.url)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cid = words[0]
        try:
            if len(words) == 5 and words[1] == "latency":
                out = c.latency(words[2], int(words[3]), int(words[4]))
            elif len(words) == 6 and words[1] == "throughput":
                out = c.throughput(words[2], int(words[3]), int(words[4]), int(words[5]))
            else:
                out = {"error": "bad command: " + line.strip()}
        except Exception as e:  # noqa: BLE001 - the bench shows it
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        say("rlbus-bench http result %s %s" % (cid, json.dumps(out)))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("check", "worker", "coordinator"):
        print(__doc__, file=sys.stderr)
        return 2
    if MISSING is not None:
        say("rlbus-bench http: missing python module (%s); "
            "apt-get install python3-flask python3-requests" % MISSING)
        return 3
    if mode == "check":
        from importlib.metadata import version
        say("rlbus-bench http: ok, python %s, flask %s, requests %s"
            % (sys.version.split()[0], version("flask"), version("requests")))
        return 0
    if mode == "worker":
        run_worker()
    else:
        run_coordinator()
    return 0


if __name__ == "__main__":
    sys.exit(main())
