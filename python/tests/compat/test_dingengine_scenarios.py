"""DI-engine's coordinator scenarios through rlbus.compat against the real broker.

The stand-in `ding` package (python/standins/legacy) has DI-engine's Coordinator shape and
its test doubles; patch_dingengine() turns them into rlbus clients, as it would for the
real package. Scenario 1 is DI-engine's test_coordinator (two NaiveCollectors, one
NaiveLearner, configured statically); scenario 2 its fake-operator-server variant.
"""

import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from compat_helpers import STANDIN, collectors_wait_for_the_buffer, wait_until

COLLECTOR_FAIL = "collector_close_task failed"


@pytest.fixture
def ding(monkeypatch, broker):
    """The stand-in ding package, patched, with workers pointed at the test's broker."""
    if STANDIN not in sys.path:
        sys.path.insert(0, STANDIN)
    import rlbus.compat as compat
    monkeypatch.setenv("RLBUS_ENDPOINT", broker.router)  # before the patch: no broker of its own
    monkeypatch.delenv("RLBUS_WORKER_ID", raising=False)
    assert compat.patch_dingengine() is True
    from ding.worker.collector.comm import NaiveCollector
    from ding.worker.coordinator import coordinator
    assert issubclass(NaiveCollector, compat.Slave)
    assert coordinator.CommCoordinator is compat.CommCoordinator
    NaiveCollector.starts = 0
    start = coordinator.Coordinator.start

    def start_once_collectors_wait(self):
        collectors_wait_for_the_buffer(self)
        start(self)
    monkeypatch.setattr(coordinator.Coordinator, "start", start_once_collectors_wait)
    yield coordinator
    compat.unpatch_dingengine()


def comm_cfg(**extra):
    cfg = {"host": "127.0.0.1", "port": 0, "learner": {}, "collector": {},
           "rlbus": {"start_timeout": 20, "close_timeout": 20, "step_timeout": 20,
                     "ready_timeout": 10}}
    cfg.update(extra)
    return cfg


def failed_collector_tasks(caplog):
    return {r.args[0] for r in caplog.records
            if r.name == "ding.coordinator" and r.msg.startswith("task %s failed")
            and COLLECTOR_FAIL in str(r.args[1])}


def learner_finished(coord):
    return [t for t in coord._historical_task if t.startswith("learner_task_")]


def check_learner_task(coord, tmp_path):
    finished = learner_finished(coord)
    assert len(finished) >= 1
    for task_id in finished:
        infos = coord._commander._learner_info.get(task_id, [])
        assert [i["learner_step"] for i in infos] == [1, 2, 3, 4, 5]
        assert not any(i["learner_done"] for i in infos)
    assert (tmp_path / "learner_final_model.pth").exists()


def check_collector_task(coord, tmp_path, task_id):
    data = [c for c in coord.calls if c == ("send_data", task_id)]
    assert len(data) == 19
    for n in range(1, 21):
        assert (tmp_path / "data_{}_{}".format(task_id, n)).exists()
    assert ("collector_finish", task_id) not in coord.calls  # its close failed


def close_and_check(coord, slaves, before):
    t0 = time.monotonic()
    coord.close()
    elapsed = time.monotonic() - t0
    assert elapsed < 20, "close() hung for %.1fs" % elapsed
    assert coord._replay_buffer == {}
    for s in slaves:
        s.shutdown()
    for s in slaves:
        s.join()
    assert coord.late_calls == []
    wait_until(lambda: not (set(threading.enumerate()) - before), 30,
               "every thread of the coordinator and the slaves to end")


def test_coordinator_with_two_collectors_and_a_learner(ding, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    from ding.worker.collector.comm import NaiveCollector
    from ding.worker.learner.comm import NaiveLearner
    before = set(threading.enumerate())
    collectors = [NaiveCollector("127.0.0.1", port, prefix=str(tmp_path / "data"))
                  for port in (18101, 18102)]
    learner = NaiveLearner("127.0.0.1", 18103, prefix=str(tmp_path / "learner"))
    slaves = collectors + [learner]
    for s in slaves:
        s.start()
    assert [c.resources for c in collectors] == [{"cpu": 20, "gpu": 1}] * 2
    assert learner.resources == {}  # 'xxx' is no number
    assert [s.worker_id for s in slaves] == ["127.0.0.1:18101", "127.0.0.1:18102",
                                             "127.0.0.1:18103"]
    coord = ding.Coordinator({"coordinator": comm_cfg(
        collector={"collector0": ["collector0", "127.0.0.1", 18101],
                   "collector1": ["collector1", "127.0.0.1", 18102]},
        learner={"learner0": ["learner0", "127.0.0.1", 18103]})})
    try:
        coord.start()
        wait_until(lambda: coord._commander._learner_task_finish_count >= 1, 40,
                   "a finished learner task")
        wait_until(lambda: len(failed_collector_tasks(caplog)) == 2, 20,
                   "both collector tasks to fail at their close")
    except BaseException:
        coord.close()
        for s in slaves:
            s.shutdown()
        raise
    collector_tasks = failed_collector_tasks(caplog)
    for task_id in collector_tasks:
        check_collector_task(coord, tmp_path, task_id)
        judged = [c for c in coord.calls if c == ("collector_judge", task_id)]
        assert len(judged) == 1
    # a failed close neither re-ran a collector task nor freed a commander slot
    assert NaiveCollector.starts == 2
    assert coord._commander._collector_task_finish_count == 0
    assert coord._commander.increases == 0  # static mode: the task space stays as set
    # every start step got the task dict plus the worker's own id and raw resources
    infos = [i for c in collectors for i in c.start_infos]
    assert sorted(i["collector_id"] for i in infos) == ["127.0.0.1:18101", "127.0.0.1:18102"]
    assert all(i["resource_info"] == {"cpu": "20", "gpu": "1"} for i in infos)
    assert all(i["collector_cfg"]["collect_setting"] == {"eps": 0.9} for i in infos)
    check_learner_task(coord, tmp_path)
    close_and_check(coord, slaves, before)


class FakeOperator:
    """DI-orchestrator's replica API (v1alpha1), starting workers after the request."""

    def __init__(self, tmp_path, delay_s=0.3):
        from ding.worker.collector.comm import NaiveCollector
        from ding.worker.learner.comm import NaiveLearner
        self.posts, self.failed, self.gets = [], [], 0
        self.replicas = {"collectors": [], "learners": []}
        self.slaves = []
        self.lock = threading.Lock()
        op = self

        def spawn():
            for port in (18201, 18202):
                s = NaiveCollector("127.0.0.1", port, prefix=str(tmp_path / "data"))
                s.start()
                with op.lock:
                    op.slaves.append(s)
                    op.replicas["collectors"].append(s.worker_id)
            s = NaiveLearner("127.0.0.1", 18203, prefix=str(tmp_path / "learner"))
            s.start()
            with op.lock:
                op.slaves.append(s)
                op.replicas["learners"].append(s.worker_id)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, data=None):
                body = json.dumps({"success": True, "code": 0, "message": "",
                                   "data": data or {}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/v1alpha1/replicas":
                    with op.lock:
                        op.posts.append(body)
                        first = len(op.posts) == 1
                    if first:
                        op.timer = threading.Timer(delay_s, spawn)
                        op.timer.start()
                    self._answer()
                elif self.path == "/v1alpha1/replicas/failed":
                    with op.lock:
                        op.failed.append(body)
                    self._answer()
                else:
                    self.send_error(404)

            def do_GET(self):
                if self.path.startswith("/v1alpha1/replicas"):
                    with op.lock:
                        op.gets += 1
                        data = {k: list(v) for k, v in op.replicas.items()}
                    self._answer(data)
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-operator")
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
        timer = getattr(self, "timer", None)
        if timer is not None:
            timer.join()


def test_coordinator_with_a_fake_operator_server(ding, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    before = set(threading.enumerate())
    op = FakeOperator(tmp_path)
    request = {"collectors": {"replicas": 2, "cpus": 2, "gpus": 0, "memory": "2Gi"},
               "learners": {"replicas": 1, "cpus": 2, "gpus": 0, "memory": "2Gi"}}
    coord = ding.Coordinator({"coordinator": comm_cfg(operator_server={
        "system_addr": "https://127.0.0.1:%d" % op.port, "api_version": "v1alpha1",
        "init_replicas_request": request, "collector_target_num": 2, "learner_target_num": 1})})
    try:
        coord.start()
        # start() came back only once both targets were met
        assert coord._interaction._counts == {"collector": 2, "learner": 1}
        assert op.posts[0]["collectors"] == request["collectors"]
        assert {"namespace", "coordinator"} <= set(op.posts[0])
        wait_until(lambda: coord._commander.increases == 2, 10, "one increase per collector")
        wait_until(lambda: coord._commander._learner_task_finish_count >= 1, 40,
                   "a finished learner task")
        wait_until(lambda: op.gets >= 1, 10, "the replica list to be read")
    except BaseException:
        coord.close()
        op.close()
        for s in op.slaves:
            s.shutdown()
        raise
    check_learner_task(coord, tmp_path)
    assert coord._commander.decreases == 0
    op.close()
    close_and_check(coord, op.slaves, before)


def test_operator_mode_gives_up_when_workers_do_not_come(ding, tmp_path):
    class NoWorkers(FakeOperator):
        pass

    op = NoWorkers(tmp_path, delay_s=3600)
    coord = ding.Coordinator({"coordinator": comm_cfg(operator_server={
        "system_addr": "127.0.0.1:%d" % op.port, "init_replicas_request": {},
        "collector_target_num": 1, "learner_target_num": 1},
        rlbus={"operator_timeout": 1.0, "ready_timeout": 10})})
    try:
        with pytest.raises(TimeoutError):
            coord.start()
    finally:
        op.server.shutdown()
        op.server.server_close()
        op.thread.join()
        op.timer.cancel()
        coord.close()


def test_comm_collectors_with_coordinator(ding, tmp_path, caplog):
    """DI-engine's test_collector_with_coordinator: comm collectors whose data step blocks on
    a metadata queue fed by their collector thread, and whose close reports finish info."""
    caplog.set_level(logging.INFO)
    from ding.worker.collector.comm.flask_fs_collector import FlaskFileSystemCollector
    from ding.worker.learner.comm import NaiveLearner
    before = set(threading.enumerate())
    collectors = [FlaskFileSystemCollector({"host": "127.0.0.1", "port": port,
                                            "path_data": str(tmp_path), "n_sample": 6})
                  for port in (18301, 18302)]
    learner = NaiveLearner("127.0.0.1", 18303, prefix=str(tmp_path / "learner"))
    for c in collectors:
        c.start()
    learner.start()
    assert collectors[0]._slave.role == "collector"
    assert collectors[0]._slave.resources == {"cpu": 20, "gpu": 1}
    coord = ding.Coordinator({"coordinator": comm_cfg()})
    try:
        coord.start()
        wait_until(lambda: coord._commander._learner_task_finish_count >= 1
                   and coord._commander._collector_task_finish_count >= 2, 40,
                   "a finished learner task and two finished collector tasks")
    except BaseException:
        coord.close()
        for c in collectors:
            c.close()
        learner.shutdown()
        raise
    finished = [t for t in coord._historical_task if t.startswith("collector_task_")]
    assert len(finished) >= 2
    for task_id in finished[:2]:
        assert len([c for c in coord.calls if c == ("send_data", task_id)]) == 6
        assert ("collector_finish", task_id) in coord.calls
    check_learner_task(coord, tmp_path)
    t0 = time.monotonic()
    coord.close()
    assert time.monotonic() - t0 < 20
    assert coord._replay_buffer == {}
    for c in collectors:
        c.close()
    learner.close()
    assert coord.late_calls == []
    wait_until(lambda: not (set(threading.enumerate()) - before), 30,
               "every thread of the coordinator and the workers to end")


def test_comm_learner_with_coordinator(ding, tmp_path, caplog):
    """DI-engine's test_learner_with_coordinator: a comm learner that prefetches through a
    1-slot demand queue and blocks in its learn step for the next info; every iteration's
    info reaches send_info and the end-of-run info finishes the task."""
    caplog.set_level(logging.INFO)
    from ding.worker.collector.comm import NaiveCollector
    from ding.worker.learner.comm.flask_fs_learner import FlaskFileSystemLearner
    before = set(threading.enumerate())
    collectors = [NaiveCollector("127.0.0.1", port, prefix=str(tmp_path / "data"))
                  for port in (18401, 18402)]
    learner = FlaskFileSystemLearner({"host": "127.0.0.1", "port": 18403,
                                      "train_iterations": 10})
    for c in collectors:
        c.start()
    learner.start()
    assert learner._slave.role == "learner" and learner._slave.resources == {"gpu": 1}
    coord = ding.Coordinator({"coordinator": comm_cfg()})
    try:
        coord.start()
        wait_until(lambda: coord._commander._learner_task_finish_count >= 1, 40,
                   "a finished learner task")
    except BaseException:
        coord.close()
        for c in collectors:
            c.shutdown()
        learner.close()
        raise
    finished = learner_finished(coord)
    for task_id in finished:
        infos = coord._commander._learner_info.get(task_id, [])
        assert [i["learner_step"] for i in infos] == list(range(10))
        assert not any(i["learner_done"] for i in infos)
    t0 = time.monotonic()
    coord.close()
    assert time.monotonic() - t0 < 20
    assert coord._replay_buffer == {}
    for c in collectors:
        c.shutdown()
    learner.close()
    assert coord.late_calls == []
    wait_until(lambda: not (set(threading.enumerate()) - before), 30,
               "every thread of the coordinator and the workers to end")


LEARNER_PROCESS = """
import sys
import rlbus.compat
rlbus.compat.patch_dingengine()
from ding.worker.learner.comm.flask_fs_learner import FlaskFileSystemLearner
learner = FlaskFileSystemLearner({"host": "127.0.0.1", "port": 18503, "train_iterations": 5})
learner.start()
print("started", flush=True)
sys.stdin.readline()  # parallel_pipeline's close event for its workers
learner.close()
print("closed", flush=True)
# and the process ends here: only a thread that is not a daemon could keep it
"""


def test_a_pipeline_worker_process_exits_by_itself_after_its_coordinator_closes(
        ding, broker, tmp_path):
    """parallel_pipeline's shape: the learner runs in a process of its own that starts its
    comm learner, waits for the close event its parent sets once the coordinator has closed,
    closes the comm learner and returns; the parent then waits for the process to end."""
    import subprocess
    from compat_helpers import PYTHON_DIR
    from ding.worker.collector.comm import NaiveCollector
    env = dict(os.environ, RLBUS_ENDPOINT=broker.router,
               PYTHONPATH=os.pathsep.join([STANDIN, PYTHON_DIR]))
    env.pop("RLBUS_WORKER_ID", None)
    child = subprocess.Popen([sys.executable, "-c", LEARNER_PROCESS], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    collectors = [NaiveCollector("127.0.0.1", port, prefix=str(tmp_path / "data"))
                  for port in (18501, 18502)]
    coord = ding.Coordinator({"coordinator": comm_cfg()})
    try:
        assert child.stdout.readline().strip() == "started"
        for c in collectors:
            c.start()
        coord.start()
        wait_until(lambda: coord._commander._learner_task_finish_count >= 1, 40,
                   "a finished learner task")
        coord.close()
        child.stdin.write("\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)  # it ends by itself, or this times out
        assert child.returncode == 0, out
        assert "closed" in out
    finally:
        coord.close()
        for c in collectors:
            c.shutdown()
        if child.poll() is None:
            child.kill()
            child.wait()
