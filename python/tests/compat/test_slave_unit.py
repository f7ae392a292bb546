"""Slave against a stand-in SDK: resources, ids, roles, hooks and the step order that
DI-engine's HTTP master used."""

import logging
import subprocess
import sys
import threading
import time

import pytest

from compat_helpers import wait_until
from compat_fakesdk import FakeTask
from rlbus.compat import ConnectionRefuse, Slave, TaskFail, TaskRefuse, coerce_resources


class OtherTaskFail(Exception):
    """Shaped like DI-engine's own TaskFail (a different class of the same name)."""


OtherTaskFail.__name__ = "TaskFail"


def _init_other(self, result=None, message=None):
    Exception.__init__(self, message)
    self.result, self.message = result, message


OtherTaskFail.__init__ = _init_other


class Collector(Slave):
    def __init__(self, *a, items=3, close_fails=False, **kw):
        super().__init__(*a, **kw)
        self.steps = []
        self.items = items
        self.close_fails = close_fails
        self.n = 0

    def _process_task(self, task):
        self.steps.append(task["name"])
        if task["name"] == "resource":
            return {"cpu": "20", "gpu": 1, "mem": "lots"}
        if task["name"] == "collector_start_task":
            self.info = task["task_info"]
            return {"message": "ok"}
        if task["name"] == "collector_data_task":
            self.n += 1
            if self.n == self.items:
                return {"collector_done": True, "task_id": "t1", "buffer_id": "buf"}
            return {"data_id": "d%d" % self.n, "buffer_id": "buf", "task_id": "t1",
                    "priority": 1.0}
        if task["name"] == "collector_close_task":
            if self.close_fails:
                raise OtherTaskFail(result={"message": "no close here"}, message="close refused")
            return {"reward_mean": 2.0}
        raise TaskFail(result={"message": "task name error"}, message="bad name")


class Learner(Slave):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.steps = []
        self.n = 0

    def _process_task(self, task):
        self.steps.append(task["name"])
        if task["name"] == "resource":
            return {"gpu": "xxx"}
        if task["name"] == "learner_start_task":
            return {}
        if task["name"] == "learner_get_data_task":
            return {"task_id": "l1", "buffer_id": "buf", "batch_size": 2, "cur_learner_iter": 4}
        if task["name"] == "learner_learn_task":
            self.n += 1
            self.batches = getattr(self, "batches", []) + [task["data"]]
            return {"info": {"learner_step": self.n, "learner_done": self.n >= 2},
                    "buffer_id": "buf", "task_id": "l1"}
        if task["name"] == "learner_close_task":
            return {"task_id": "l1"}
        raise TaskFail(message="bad")


def test_coerce_resources_parses_numbers_and_drops_the_rest(caplog):
    with caplog.at_level(logging.WARNING):
        out = coerce_resources({"cpu": "20", "gpu": "1", "mem": 1.5, "x": "xxx", "neg": -1,
                                "inf": float("inf"), "flag": True, "": 3})
    assert out == {"cpu": 20, "gpu": 1, "mem": 1.5, "flag": 1}
    assert "xxx" in caplog.text and "neg" in caplog.text
    assert coerce_resources({"cpu": "xxx", "gpu": "xxx"}) == {}
    assert coerce_resources(None) == {}


def test_start_announces_numeric_resources_and_host_port_id(fake_sdk, monkeypatch):
    monkeypatch.delenv("RLBUS_WORKER_ID", raising=False)
    s = Collector("10.1.2.3", 18000, endpoint="tcp://127.0.0.1:6000")
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        assert (w.endpoint, w.role, w.id) == ("tcp://127.0.0.1:6000", "collector", "10.1.2.3:18000")
        assert w.resources == {"cpu": 20, "gpu": 1}
        assert s.steps == ["resource"]
        assert s.ping()
    finally:
        s.shutdown()
    assert w.closed and not s.ping()
    s.join()


def test_worker_id_and_role_overrides(fake_sdk, monkeypatch):
    monkeypatch.setenv("RLBUS_WORKER_ID", "pod-7")
    s = Learner(None, None, role="learner")
    assert s.worker_id == "pod-7" and s.role == "learner"
    assert Slave(worker_id="w", role="collector").worker_id == "w"
    with pytest.raises(ValueError):
        Slave()  # neither a role nor a name that says one


def test_learner_non_numeric_resources_are_dropped(fake_sdk):
    s = Learner("0.0.0.0", 7)
    s.start()
    try:
        assert fake_sdk.Worker.instances[0].resources == {}
        assert fake_sdk.Worker.instances[0].role == "learner"
    finally:
        s.shutdown()


def test_before_connection_refusal_keeps_the_slave_off_the_broker(fake_sdk):
    class Refusing(Collector):
        def _before_connection(self, data):
            raise ConnectionRefuse("not today")

    with pytest.raises(ConnectionRefuse):
        Refusing("h", 1).start()
    assert fake_sdk.Worker.instances == []


def test_collector_steps_in_http_order_and_waits_for_close_after_done(fake_sdk):
    s = Collector("h", 1, items=4)
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        task = FakeTask("t1", {"task_id": "t1", "buffer_id": "buf"})
        runner = running(w, task)
        wait_until(lambda: task.infos, 5, "the done info")
        # the driver does not pull past the done info while the close is pending
        assert not task.wait_stop(0.3) and s.steps.count("collector_data_task") == 4
        task.request_stop()
        runner.join(5)
        assert not runner.is_alive()
        result = w.close_handler(task)
        assert s.steps == ["resource", "collector_start_task"] + ["collector_data_task"] * 4 + [
            "collector_close_task"]
        assert [d[0] for d in task.data] == ["d1", "d2", "d3"]
        assert task.data[0][2] == {"data_id": "d1", "buffer_id": "buf", "task_id": "t1",
                                   "priority": 1.0}
        assert task.infos == [{"collector_done": True, "task_id": "t1", "buffer_id": "buf"}]
        assert s.info["collector_id"] == "h:1" and s.info["resource_info"]["cpu"] == "20"
        assert result == {"reward_mean": 2.0, "task_id": "t1", "buffer_id": "buf"}
    finally:
        s.shutdown()


def test_close_taskfail_becomes_task_failure_with_result(fake_sdk):
    s = Collector("h", 1, close_fails=True)
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        with pytest.raises(fake_sdk.TaskFailure) as err:
            w.close_handler(FakeTask())
        assert "close refused" in err.value.reason
        assert err.value.result == {"message": "no close here"}
    finally:
        s.shutdown()


def test_before_task_refusal_fails_the_attempt(fake_sdk):
    class Picky(Collector):
        def _before_task(self, data):
            if data["name"] == "collector_start_task":
                raise TaskRefuse("busy", {"why": "busy"})

    s = Picky("h", 1)
    s.start()
    try:
        with pytest.raises(fake_sdk.TaskFailure) as err:
            fake_sdk.Worker.instances[0].run(FakeTask())
        assert "refused" in err.value.reason and err.value.result == {"why": "busy"}
        assert "collector_start_task" not in s.steps
    finally:
        s.shutdown()


def test_other_exceptions_fail_the_attempt(fake_sdk):
    class Broken(Collector):
        def _process_task(self, task):
            if task["name"] == "collector_start_task":
                raise KeyError("collector_cfg")
            return super()._process_task(task)

    s = Broken("h", 1)
    s.start()
    try:
        with pytest.raises(KeyError):
            fake_sdk.Worker.instances[0].run(FakeTask())
    finally:
        s.shutdown()


def test_learner_steps_get_data_learn_and_infos(fake_sdk):
    batch = [{"data_id": "a"}, {"data_id": "b"}]
    s = Learner("h", 2)
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        task = FakeTask("l1", {"task_id": "l1", "buffer_id": "buf"}, batches=[None, batch, batch])
        task.on_info = lambda info: info.get("learner_done") and task.request_stop()
        w.run(task)
        result = w.close_handler(task)
        assert s.steps == ["resource", "learner_start_task", "learner_get_data_task",
                           "learner_learn_task", "learner_get_data_task", "learner_learn_task",
                           "learner_close_task"]
        assert task.gets[0] == ("buf", 2, 4)
        assert s.batches == [batch, batch]
        assert [i for _, i in task.learn_infos] == [{"learner_step": 1, "learner_done": False},
                                                    {"learner_step": 2, "learner_done": True}]
        assert result == {"task_id": "l1", "buffer_id": "buf"}
    finally:
        s.shutdown()


def running(worker, task):
    """The worker's run handler for `task` on a thread of its own, started."""
    t = threading.Thread(target=worker.run, args=(task,))
    t.start()
    return t


def closed_while_starting(slave, fake_sdk, started):
    """Runs a task on the started `slave` and asks for its close as soon as `started()`
    says its start step began; returns the worker and the task once the run handler
    returned."""
    w = fake_sdk.Worker.instances[0]
    task = FakeTask()
    runner = running(w, task)
    wait_until(started, 5, "the start step")
    task.request_stop()  # the coordinator closes the task while it starts
    runner.join(5)
    assert not runner.is_alive()
    return w, task


class OneAtATime:
    """Counts the steps in user code at once, as a DI-engine comm slave would break if two
    ran together (a close beside the start that builds what it closes)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


def test_a_close_waits_for_the_blocked_step_and_never_runs_beside_it(fake_sdk):
    release = threading.Event()
    steps = OneAtATime()
    stuck = []

    class Stuck(Collector):
        def _process_task(self, task):
            with steps:
                if task["name"] == "collector_data_task":
                    self.steps.append(task["name"])
                    release.wait(10)
                    return {"data_id": "late", "buffer_id": "buf"}
                return super()._process_task(task)

        def _step_stuck(self, name, task_id, seconds):
            stuck.append((name, task_id))

    s = Stuck("h", 1)
    s.keep_alive_s = 0.05
    s.close_wait_s = 0.3
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        task = FakeTask()
        runner = running(w, task)
        wait_until(lambda: task.alive >= 2, 5, "keep-alives during the blocked step")
        task.abort()
        runner.join(5)  # the abort waited close_wait_s for the step, then gave it up
        assert not runner.is_alive()
        assert stuck and stuck[0] == ("collector_data_task", "t1")
        assert "collector_close_task" not in s.steps  # not beside the blocked step
        release.set()
        # once the step returns, the close it was waiting for runs: what was built is closed
        wait_until(lambda: "collector_close_task" in s.steps, 5, "the close after the step")
        assert steps.most == 1
        assert task.data == []  # the late result was dropped
    finally:
        release.set()
        s.shutdown()


def test_a_close_that_comes_during_a_slow_start_runs_after_it_with_what_it_built(fake_sdk):
    # DI-engine's comm collector builds its collector in the start step (seconds: env
    # processes, the policy) and the close step reads it: beside each other the close found
    # None ("'NoneType' object has no attribute 'get_finish_info'").
    started = threading.Event()
    steps = OneAtATime()

    class Slow(Collector):
        def _process_task(self, task):
            with steps:
                if task["name"] == "collector_start_task":
                    self.steps.append(task["name"])
                    self.collector = None
                    started.set()
                    time.sleep(0.5)
                    self.collector = {"finish": {"reward_mean": 3.0}}
                    return {"message": "ok"}
                if task["name"] == "collector_close_task":
                    self.steps.append(task["name"])
                    return dict(self.collector["finish"])
                return super()._process_task(task)

    s = Slow("h", 1)
    s.start()
    try:
        w, task = closed_while_starting(s, fake_sdk, started.is_set)
        result = w.close_handler(task)
        assert result["reward_mean"] == 3.0
        assert s.steps == ["resource", "collector_start_task", "collector_close_task"]
        assert steps.most == 1
    finally:
        s.shutdown()


def test_the_helpers_a_slow_start_forks_are_stopped_by_the_close_that_waited_for_it(fake_sdk):
    # DI-engine's comm collector forks its env processes in the start step. A close run
    # beside that start found nothing to stop, and the helpers, forked after it, lived on
    # (holding the pipes of whoever started the worker).
    helpers = []

    class Forking(Collector):
        def _process_task(self, task):
            if task["name"] == "collector_start_task":
                self.steps.append(task["name"])
                time.sleep(0.3)  # building the policy
                helpers.append(subprocess.Popen([sys.executable, "-c",
                                                 "import time; time.sleep(60)"]))
                return {"message": "ok"}
            if task["name"] == "collector_close_task":
                self.steps.append(task["name"])
                for h in helpers:
                    h.terminate()
                    h.wait(5)
                return {"helpers": len(helpers)}
            return super()._process_task(task)

    s = Forking("h", 1)
    s.start()
    try:
        w, task = closed_while_starting(s, fake_sdk, lambda: "collector_start_task" in s.steps)
        assert w.close_handler(task)["helpers"] == 1
        assert helpers and all(h.poll() is not None for h in helpers)  # none left running
    finally:
        for h in helpers:
            if h.poll() is None:
                h.kill()
        s.shutdown()


def test_a_start_step_never_begins_after_its_task_was_closed(fake_sdk):
    # TASK_CLOSE came before the run handler had submitted the start step: the close ran
    # first, then the start built a collector that nothing closed (DI-engine's teardown
    # waited 10 s on it).
    s = Collector("h", 1)
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        task = FakeTask()
        w.close_handler(task)
        task.request_stop()
        w.run(task)
        assert s.steps == ["resource", "collector_close_task"]
        # another attempt of the same task is a new start
        again = FakeTask()
        again.attempt = 2
        again.on_info = lambda info: again.request_stop()
        w.run(again)
        assert s.steps[2] == "collector_start_task"
    finally:
        s.shutdown()


def test_a_start_step_running_at_shutdown_is_followed_by_its_close(fake_sdk):
    release = threading.Event()
    closed = threading.Event()

    class Slow(Collector):
        def _process_task(self, task):
            if task["name"] == "collector_start_task":
                self.steps.append(task["name"])
                release.wait(10)  # building envs and the policy
                self.built = True
                return {"message": "ok"}
            if task["name"] == "collector_close_task":
                self.steps.append(task["name"])
                closed.set()
                return {}
            return super()._process_task(task)

    s = Slow("h", 1)
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        runner = running(w, FakeTask())
        wait_until(lambda: "collector_start_task" in s.steps, 5, "the start step")
        s.shutdown()  # does not wait for the step
        runner.join(5)
        assert not runner.is_alive() and not closed.is_set()
        release.set()
        assert closed.wait(5), "what the start step built was never closed"
        assert s.steps[-2:] == ["collector_start_task", "collector_close_task"]
    finally:
        release.set()
        s.shutdown()


def test_a_step_past_the_step_limit_fails_its_attempt_and_the_next_names_it(fake_sdk):
    release = threading.Event()
    stuck = []

    class Hung(Learner):
        def _process_task(self, task):
            if task["name"] == "learner_learn_task":
                self.steps.append(task["name"])
                release.wait(10)  # DI-engine's learner race: a learn that never returns
                return {"info": {}}
            return super()._process_task(task)

        def _step_stuck(self, name, task_id, seconds):
            stuck.append(name)

    s = Hung("h", 2)
    s.keep_alive_s = 0.05
    s.step_limit_s = 0.4
    s.close_wait_s = 0.2
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        task = FakeTask("l1", batches=[[{"data_id": "a"}]])
        with pytest.raises(fake_sdk.TaskFailure) as err:
            w.run(task)
        assert "learner_learn_task still running after" in err.value.reason
        assert stuck == ["learner_learn_task"]
        alive = task.alive
        time.sleep(0.2)
        assert task.alive == alive  # the failed attempt is no longer kept alive
        # the worker says why it cannot serve the next task while the step is stuck
        nxt = FakeTask("l2")
        with pytest.raises(fake_sdk.TaskFailure) as err:
            w.run(nxt)
        assert "waiting behind learner_learn_task of task l1" in err.value.reason
        # once the step returns, the worker serves again; the start it gave up never ran
        release.set()
        third = FakeTask("l3", batches=[[{"data_id": "b"}]])
        third.on_info = lambda info: third.request_stop()
        s.step_limit_s = 10
        w.run(third)
        assert third.learn_infos
        assert s.steps.count("learner_start_task") == 2  # l1's and l3's, not l2's
    finally:
        release.set()
        s.shutdown()


def test_shutdown_does_not_wait_for_a_blocked_step(fake_sdk):
    release = threading.Event()

    class Stuck(Collector):
        def _process_task(self, task):
            if task["name"] == "collector_data_task":
                self.steps.append(task["name"])
                release.wait(10)
                return {"data_id": "late"}
            return super()._process_task(task)

    s = Stuck("h", 1)
    s.close_wait_s = 30  # what a close would wait; a shutdown does not
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        runner = running(w, FakeTask())
        wait_until(lambda: "collector_data_task" in s.steps, 5, "the blocked step")
        t0 = time.monotonic()
        s.shutdown()
        runner.join(5)
        assert not runner.is_alive() and time.monotonic() - t0 < 5
        assert not any(t.name.startswith("rlbus-compat-slave") and t.is_alive()
                       for t in threading.enumerate())  # nothing holds the process
    finally:
        release.set()
        s.shutdown()


def test_failed_data_steps_are_retried_then_fail_the_attempt(fake_sdk):
    class Flaky(Collector):
        def _process_task(self, task):
            if task["name"] == "collector_data_task":
                raise TaskFail(message="no data today")
            return super()._process_task(task)

    s = Flaky("h", 1)
    s.max_step_failures = 3
    s.start()
    try:
        with pytest.raises(fake_sdk.TaskFailure) as err:
            fake_sdk.Worker.instances[0].run(FakeTask())
        assert "3 collector_data_task steps failed" in err.value.reason
    finally:
        s.shutdown()


def test_lost_connection_hook(fake_sdk):
    lost = []

    class Watching(Collector):
        def _lost_connection(self, master_address, err):
            lost.append((master_address, str(err)))

    s = Watching("h", 1, endpoint="tcp://x:1")
    s.start()
    try:
        w = fake_sdk.Worker.instances[0]
        w.last_error = "broker silent"
        w.state = "reconnecting"
        wait_until(lambda: lost, 5, "_lost_connection")
        assert lost == [("tcp://x:1", "broker silent")]
    finally:
        s.shutdown()


def test_context_manager_starts_and_closes(fake_sdk):
    with Collector("h", 1) as s:
        assert s.ping()
        w = fake_sdk.Worker.instances[0]
    assert w.closed and not s.ping()
    s.close()  # idempotent
