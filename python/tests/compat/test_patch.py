"""patch_dingengine() in fresh interpreters: with the stand-in `ding` package and without
any `ding` at all."""

import os
import re
import subprocess
import sys
import textwrap
import time

from compat_helpers import PYTHON_DIR, STANDIN


def run_python(code, with_ding=True, args=()):
    path = [PYTHON_DIR] + ([STANDIN] if with_ding else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + list(args), env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_without_ding_patch_does_nothing():
    out = run_python("""
        import sys
        from rlbus.compat import patch_dingengine
        assert patch_dingengine() is False
        assert not any(m == 'ding' or m.startswith('ding.') for m in sys.modules)
        print('ok')
    """, with_ding=False)
    assert "ok" in out


def test_patch_swaps_coordinator_and_slave_before_comm_classes_are_built():
    out = run_python("""
        import sys
        import rlbus.compat as compat
        assert compat.patch_dingengine() is True
        assert compat.patch_dingengine() is True  # idempotent
        # nothing of the legacy mode is imported until the process imports it itself (a
        # ditask worker never does), nor rlbus's classes for it
        loaded = [m for m in sys.modules if m.startswith(("ding.worker", "ding.interaction",
                                                           "rlbus.compat.legacy.slave",
                                                           "rlbus.compat.legacy.coordinator"))]
        assert not loaded, loaded
        import ding.interaction, ding.interaction.slave
        from ding.worker.coordinator import coordinator, comm_coordinator
        from ding.worker.collector.comm import NaiveCollector
        from ding.worker.learner.comm import NaiveLearner
        assert ding.interaction.Slave is compat.Slave
        assert ding.interaction.slave.Slave is compat.Slave
        assert coordinator.CommCoordinator is compat.CommCoordinator
        assert comm_coordinator.CommCoordinator is compat.CommCoordinator
        assert issubclass(NaiveCollector, compat.Slave) and issubclass(NaiveLearner, compat.Slave)
        # DI-engine's exception classes stay; the compat Slave recognises them by name
        assert ding.interaction.TaskFail is not compat.TaskFail
        c = coordinator.Coordinator({'coordinator': {'broker': 'tcp://127.0.0.1:1'}})
        assert type(c._interaction) is compat.CommCoordinator
        assert c._interaction.endpoint == 'tcp://127.0.0.1:1'
        compat.unpatch_dingengine()
        assert coordinator.CommCoordinator is comm_coordinator.CommCoordinator
        assert getattr(coordinator.CommCoordinator, 'HTTP', False)
        assert getattr(ding.interaction.Slave, 'HTTP', False)
        print('ok')
    """)
    assert "ok" in out


def test_patch_after_comm_classes_were_imported_warns():
    out = run_python("""
        import logging
        logging.basicConfig(level=logging.WARNING)
        import ding.worker  # builds the comm classes on the HTTP Slave
        import rlbus.compat as compat
        assert compat.patch_dingengine() is True
        from ding.worker.collector.comm import NaiveCollector
        assert not issubclass(NaiveCollector, compat.Slave)
        print('ok')
    """)
    assert "ok" in out and "already imported" in out


PIPELINE_WITHOUT_A_BROKER = """
import logging, multiprocessing, os, socket, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
import rlbus.compat._util as util
# the default endpoint, where nothing listens here (another broker may hold the real one)
s = socket.socket()
s.bind(("127.0.0.1", 0))
util.DEFAULT_ENDPOINT = "tcp://127.0.0.1:%d" % s.getsockname()[1]
s.close()
import rlbus.compat
assert "RLBUS_ENDPOINT" not in os.environ
assert rlbus.compat.patch_dingengine() is True
print("endpoint", os.environ["RLBUS_ENDPOINT"], flush=True)
from ding.worker.collector.comm import NaiveCollector
from ding.worker.coordinator import coordinator


def learner(close_event):  # parallel_pipeline's learner process, forked from this one
    from ding.worker.learner.comm.flask_fs_learner import FlaskFileSystemLearner
    learner = FlaskFileSystemLearner({"host": "127.0.0.1", "port": 18503,
                                      "train_iterations": 5})
    learner.start()
    close_event.wait()
    learner.close()


close = multiprocessing.Event()
child = multiprocessing.Process(target=learner, args=(close,))
child.start()
collectors = [NaiveCollector("127.0.0.1", port, prefix=sys.argv[1]) for port in (18501, 18502)]
for c in collectors:
    c.start()
timeouts = {"start_timeout": 20, "close_timeout": 20, "step_timeout": 20, "ready_timeout": 10}
coord = coordinator.Coordinator({"coordinator": {"host": "127.0.0.1", "port": 0, "learner": {},
                                                 "collector": {}, "rlbus": timeouts}})
# Collector tasks only once the learner's buffer exists (compat_helpers'
# collectors_wait_for_the_buffer): their data would be dropped before it.
get_collector_task = coord._commander.get_collector_task
coord._commander.get_collector_task = (
    lambda: get_collector_task() if "test" in coord._replay_buffer else None)
coord.start()
deadline = time.monotonic() + 40
while coord._commander._learner_task_finish_count < 1:
    assert time.monotonic() < deadline, "no learner task finished"
    time.sleep(0.05)
print("a learner task finished", flush=True)
coord.close()
close.set()
child.join(30)
assert child.exitcode == 0, child.exitcode
for c in collectors:
    c.shutdown()
print("done", flush=True)
"""


def test_a_pipeline_on_one_machine_with_no_broker_named_gets_one_that_its_workers_find(
        tmp_path):
    """patch_dingengine() with no $RLBUS_ENDPOINT names a broker of the run's own in the
    environment; the coordinator starts it when it first needs it and says so in the log,
    and the learner process forked before (parallel_pipeline's shape) finds it: a learner
    task runs end to end. The broker stops once the last process of the run has exited."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PYTHON_DIR, STANDIN]))
    env.pop("RLBUS_ENDPOINT", None)
    env.pop("RLBUS_WORKER_ID", None)
    proc = subprocess.run([sys.executable, "-c", PIPELINE_WITHOUT_A_BROKER,
                           str(tmp_path / "data")], env=env, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "no broker named ($RLBUS_ENDPOINT): started one for this run at" in out, out
    assert "a learner task finished" in out and "done" in out, out
    endpoint = next(line.split()[1] for line in out.splitlines()
                    if line.startswith("endpoint "))
    pid = int(re.search(r"\(pid (\d+)\)", out).group(1))
    # the broker went with the process that started it
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and not _zombie(pid):
        assert time.monotonic() < deadline, f"the broker at {endpoint} (pid {pid}) still runs"
        time.sleep(0.05)


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
